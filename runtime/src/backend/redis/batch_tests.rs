//! The coalescer against stand-ins for Redis: a gated one, to see which operations share which call, and
//! a simulated one a network hop away or busy, in paused time, to see the window follow the round trip.

use std::borrow::Cow;
use std::sync::atomic::{AtomicUsize, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::Value;
use tokio::sync::Semaphore;

use super::super::window::INITIAL as SLOTS;
use super::{Coalescer, Op, Reply, Transport};
use crate::LockToken;

/// A stand-in for Redis: records each call's operations (`<letter>:<record>`), answers once the test lets
/// it through the gate, fails the operations of records named `bad` inside the script (as `pcall` would)
/// and answers code 7, which no script sends, for records named `weird`.
struct FakeRedis {
    calls: Mutex<Vec<Vec<String>>>,
    gate: Semaphore,
}

impl FakeRedis {
    fn new() -> Self {
        Self { calls: Mutex::default(), gate: Semaphore::new(0) }
    }

    fn calls(&self) -> Vec<Vec<String>> {
        self.calls.lock().unwrap().clone()
    }

    /// What BATCH answers for `op` (and a script of its own, for one): a grant's fence as text, a release's
    /// code, an array for any other acquire reply or a failure.
    fn reply_to(op: &Op<'_>) -> Value {
        let code = match op.record() {
            "bad" => return Value::Array(vec![Value::Int(-1), Value::BulkString(b"ERR boom".to_vec()), Value::Int(0)]),
            "weird" => 7,
            _ => 1,
        };
        match op {
            Op::Acquire { .. } if code == 1 => Value::BulkString(b"42".to_vec()),
            Op::Acquire { ttl_ms, .. } => {
                Value::Array(vec![Value::Int(code), Value::Int(42), Value::Int(*ttl_ms as i64)])
            }
            Op::Release { .. } => Value::Int(code),
        }
    }
}

impl Transport for Arc<FakeRedis> {
    async fn call(&self, ops: &[Op<'_>]) -> redis::RedisResult<Value> {
        self.calls.lock().unwrap().push(ops.iter().map(|op| format!("{}:{}", op.letter(false), op.record())).collect());
        self.gate.acquire().await.expect("gate open").forget();
        Ok(match ops {
            [op] => FakeRedis::reply_to(op),
            _ => Value::Array(ops.iter().map(FakeRedis::reply_to).collect()),
        })
    }
}

/// A place in the queue, as the tests send it: register and lease 300 ms, attempt 7, client 0xab, keep 9 s.
const QUEUED: crate::backend::Queueing = crate::backend::Queueing {
    register: Duration::from_millis(300),
    keep: Duration::from_millis(9000),
    client: 0xab,
    lease: Duration::from_millis(300),
    attempt: 7,
};

fn acquire(record: &str) -> Op<'static> {
    Op::Acquire {
        record: Cow::Owned(record.to_owned()),
        token: LockToken::random(),
        ttl_ms: 1000,
        owner: "test-owner".into(),
        metadata: Cow::Borrowed(""),
        queueing: None,
        plain: None,
    }
}

fn release(record: &str) -> Op<'static> {
    Op::Release { record: Cow::Owned(record.to_owned()), token: LockToken::random(), fence: None, keep_ms: 0 }
}

fn start(coalescer: &Arc<Coalescer<Arc<FakeRedis>>>, op: Op<'static>) -> tokio::task::JoinHandle<Reply> {
    let coalescer = Arc::clone(coalescer);
    tokio::spawn(async move { coalescer.run(&op).await })
}

/// Lets every spawned task run until it waits on something.
async fn settle() {
    for _ in 0..50 {
        tokio::task::yield_now().await;
    }
}

fn fake() -> (Arc<FakeRedis>, Arc<Coalescer<Arc<FakeRedis>>>) {
    let redis = Arc::new(FakeRedis::new());
    (Arc::clone(&redis), Coalescer::new(redis))
}

/// Takes every slot of the window with a call of its own (`busy0`, `busy1`, ...), started one tick apart
/// (operations of one tick would share a call); none comes back until the test opens the gate.
async fn fill_the_window(
    redis: &FakeRedis,
    coalescer: &Arc<Coalescer<Arc<FakeRedis>>>,
) -> Vec<tokio::task::JoinHandle<Reply>> {
    let mut busy = Vec::new();
    for i in 0..SLOTS {
        busy.push(start(coalescer, acquire(&format!("busy{i}"))));
        settle().await;
        assert_eq!(redis.calls().len(), i + 1, "busy{i} went out in a call of its own");
    }
    busy
}

#[tokio::test(flavor = "current_thread")]
async fn a_lone_operation_goes_out_at_once_in_a_call_of_its_own() {
    let (redis, coalescer) = fake();
    redis.gate.add_permits(2);
    assert_eq!(coalescer.run(&acquire("k")).await.unwrap(), (1, 42, 1000));
    assert_eq!(coalescer.run(&release("k")).await.unwrap(), (1, 0, 0));
    assert_eq!(redis.calls(), [vec!["a:k"], vec!["r:k"]]);
}

#[tokio::test(flavor = "current_thread")]
async fn operations_issued_in_one_tick_share_one_call_while_another_is_out() {
    let (redis, coalescer) = fake();
    let first = start(&coalescer, acquire("first"));
    settle().await;
    // Ten tasks woken together (as one burst of replies wakes them), with a call outstanding and slots free.
    let together: Vec<_> = (0..10).map(|i| start(&coalescer, release(&format!("t{i}")))).collect();
    settle().await;
    let calls = redis.calls();
    assert_eq!(calls.len(), 2, "{calls:?}");
    assert_eq!(calls[0], ["a:first"], "a lone operation goes out at once, alone");
    assert_eq!(calls[1], (0..10).map(|i| format!("r:t{i}")).collect::<Vec<_>>(), "the tick's operations share one");
    redis.gate.add_permits(2);
    for task in std::iter::once(first).chain(together) {
        assert!(matches!(task.await.unwrap(), Ok((1, _, _))));
    }
    assert_eq!(redis.calls().len(), 2, "no call without operations");
}

#[tokio::test(flavor = "current_thread")]
async fn operations_that_find_every_slot_busy_share_the_next_call() {
    let (redis, coalescer) = fake();
    let busy = fill_the_window(&redis, &coalescer).await;
    let queued: Vec<_> = (0..10).map(|i| start(&coalescer, release(&format!("q{i}")))).collect();
    settle().await;
    assert_eq!(redis.calls().len(), SLOTS, "queued operations were sent while every slot was busy");
    // One call comes back: its slot takes the whole queue in one call.
    redis.gate.add_permits(1);
    settle().await;
    let calls = redis.calls();
    assert_eq!(calls.len(), SLOTS + 1);
    assert_eq!(calls[SLOTS], (0..10).map(|i| format!("r:q{i}")).collect::<Vec<_>>());
    redis.gate.add_permits(SLOTS);
    for task in busy.into_iter().chain(queued) {
        assert!(matches!(task.await.unwrap(), Ok((1, _, _))));
    }
    assert_eq!(redis.calls().len(), SLOTS + 1, "no call without operations");
}

#[tokio::test(flavor = "current_thread")]
async fn a_cancelled_queued_operation_is_not_sent() {
    let (redis, coalescer) = fake();
    let busy = fill_the_window(&redis, &coalescer).await;
    let cancelled = start(&coalescer, acquire("cancelled"));
    let kept = start(&coalescer, acquire("kept"));
    settle().await;
    cancelled.abort();
    settle().await;
    redis.gate.add_permits(SLOTS + 1);
    assert!(kept.await.unwrap().is_ok());
    for task in busy {
        task.await.unwrap().unwrap();
    }
    assert_eq!(redis.calls()[SLOTS], ["a:kept"], "the cancelled operation went out");
}

#[tokio::test(flavor = "current_thread")]
async fn a_failure_or_unknown_reply_inside_a_shared_call_is_that_operation_s_alone() {
    let (redis, coalescer) = fake();
    let busy = fill_the_window(&redis, &coalescer).await;
    let ops = ["ok1", "bad", "weird", "ok2"].map(|record| start(&coalescer, acquire(record)));
    settle().await;
    redis.gate.add_permits(SLOTS + 1);
    let [ok1, bad, weird, ok2] = ops;
    assert_eq!(ok1.await.unwrap().unwrap(), (1, 42, 1000));
    assert!(bad.await.unwrap().unwrap_err().to_string().contains("boom"));
    // The coalescer passes codes through; the store maps unknown ones to errors. Code 7 arrives intact.
    assert_eq!(weird.await.unwrap().unwrap(), (7, 42, 1000));
    assert_eq!(ok2.await.unwrap().unwrap(), (1, 42, 1000));
    for task in busy {
        task.await.unwrap().unwrap();
    }
    assert_eq!(redis.calls()[SLOTS].len(), 4, "the four shared one call");
}

/// A runtime shut down while the coalescer's calls are out and operations queued (a client outliving the runtime
/// it was used on), with a drainer's call out, or with a drainer due to start (spawned by a call dropped at the
/// shutdown, never run): each dropped drainer gives its slot back and fails what is queued, as do the dropped
/// calls, so no slot is lost for good (a window's worth would leave every later operation queued forever) and
/// a later operation, on another runtime, goes out at once in a call of its own.
#[test]
fn a_runtime_shut_down_under_calls_and_drainers_gives_every_slot_back() {
    let runtime = || tokio::runtime::Builder::new_current_thread().enable_all().build().expect("a runtime");
    for drainer_in_call in [true, false] {
        let home = runtime();
        let (redis, coalescer) = home.block_on(async { fake() });
        let doomed = runtime();
        doomed.block_on(async {
            let busy = fill_the_window(&redis, &coalescer).await;
            let queued = start(&coalescer, acquire("queued"));
            settle().await;
            let mut behind = Vec::new();
            // One call comes back.
            redis.gate.add_permits(1);
            if drainer_in_call {
                // Its slot's drainer takes the queue out in a call that never comes back.
                settle().await;
                assert_eq!(redis.calls()[SLOTS], ["a:queued"], "the drainer took the queue");
                // More, one tick apart, until the window (grown by the call that came back) is full again.
                while coalescer.slots().queue.is_empty() {
                    assert!(behind.len() < 64, "the window never filled");
                    behind.push(start(&coalescer, acquire(&format!("behind{}", behind.len()))));
                    settle().await;
                }
            } else {
                // The drainer its slot spawns is due, and dropped before it runs.
                let mut yields = 0;
                while coalescer.slots().drainers_due == 0 {
                    assert!(yields < 50, "no drainer became due");
                    yields += 1;
                    tokio::task::yield_now().await;
                }
                assert_eq!(redis.calls().len(), SLOTS, "the due drainer ran");
            }
            drop((busy, queued, behind));
        });
        drop(doomed);
        {
            let slots = coalescer.slots();
            assert_eq!(slots.in_flight, 0, "slots were not given back (drainer in call: {drainer_in_call})");
            assert_eq!(slots.drainers_due, 0, "drainers that never run are due (in call: {drainer_in_call})");
            assert!(slots.queue.is_empty(), "operations stayed queued with nobody to send them");
        }
        let calls = redis.calls().len();
        redis.gate.add_permits(1);
        let after = runtime().block_on(coalescer.run(&acquire("after")));
        assert_eq!(after.expect("after"), (1, 42, 1000));
        assert_eq!(redis.calls()[calls..], [vec!["a:after"]], "a later operation did not go out alone");
    }
}

/// A stand-in for Redis a network hop away, in (paused) tokio time: each call travels `one_way`, waits its
/// turn (Redis runs one call at a time), takes `per_call` plus `per_op` for each operation in it, and travels
/// back. Counts calls, operations, and the most calls in flight at once.
struct SimRedis {
    one_way: Duration,
    per_call: Duration,
    per_op: Duration,
    server: tokio::sync::Mutex<()>,
    calls: AtomicUsize,
    ops: AtomicUsize,
    in_flight: AtomicUsize,
    most_in_flight: AtomicUsize,
}

impl Transport for Arc<SimRedis> {
    async fn call(&self, ops: &[Op<'_>]) -> redis::RedisResult<Value> {
        self.calls.fetch_add(1, SeqCst);
        self.ops.fetch_add(ops.len(), SeqCst);
        let now = self.in_flight.fetch_add(1, SeqCst) + 1;
        self.most_in_flight.fetch_max(now, SeqCst);
        tokio::time::sleep(self.one_way).await;
        {
            let _turn = self.server.lock().await;
            tokio::time::sleep(self.per_call + self.per_op * ops.len() as u32).await;
        }
        tokio::time::sleep(self.one_way).await;
        self.in_flight.fetch_sub(1, SeqCst);
        Ok(match ops {
            [op] => FakeRedis::reply_to(op),
            _ => Value::Array(ops.iter().map(FakeRedis::reply_to).collect()),
        })
    }
}

/// What `tasks` tasks, each doing `cycles` acquire + release on a record of its own, saw of `redis`: the
/// time they took, operations per call, and the most calls in flight.
async fn cycle(redis: SimRedis, tasks: usize, cycles: usize) -> (Duration, f64, usize) {
    let redis = Arc::new(redis);
    let coalescer = Coalescer::new(Arc::clone(&redis));
    let started = tokio::time::Instant::now();
    let handles: Vec<_> = (0..tasks)
        .map(|task| {
            let coalescer = Arc::clone(&coalescer);
            tokio::spawn(async move {
                let record = format!("own{task}");
                for _ in 0..cycles {
                    assert_eq!(coalescer.run(&acquire(&record)).await.unwrap().0, 1);
                    assert_eq!(coalescer.run(&release(&record)).await.unwrap().0, 1);
                }
            })
        })
        .collect();
    for handle in handles {
        handle.await.unwrap();
    }
    let per_call = redis.ops.load(SeqCst) as f64 / redis.calls.load(SeqCst) as f64;
    (started.elapsed(), per_call, redis.most_in_flight.load(SeqCst))
}

fn sim(one_way_us: u64, per_call_us: u64, per_op_us: u64) -> SimRedis {
    SimRedis {
        one_way: Duration::from_micros(one_way_us),
        per_call: Duration::from_micros(per_call_us),
        per_op: Duration::from_micros(per_op_us),
        server: tokio::sync::Mutex::new(()),
        calls: AtomicUsize::new(0),
        ops: AtomicUsize::new(0),
        in_flight: AtomicUsize::new(0),
        most_in_flight: AtomicUsize::new(0),
    }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_network_hop_away_no_operation_waits_for_a_slot_and_a_burst_shares_calls() {
    // tokio's timer counts whole milliseconds: the simulation runs 1000x slower than the real thing (the
    // window's rule depends on ratios of round trips only). A 1 ms round trip; Redis spends 4 µs on a call
    // and 1 µs on each operation in it.
    let (took, per_call, most) = cycle(sim(500_000, 4_000, 1_000), 64, 100).await;
    // Every cycle is two round trips: 200 ms (here 200 s) if no operation ever waited for a slot. A window
    // fixed at the loopback setting takes over a third longer.
    let ideal = Duration::from_secs(200);
    assert!(took < ideal.mul_f64(1.1), "took {took:?} (ideal {ideal:?}); {per_call:.1} ops per call, {most} in flight");
    // The tasks travel in step: the operations of one burst of replies go back in one call, not 64.
    assert!(per_call >= 32.0, "{per_call:.1} operations per call, {most} in flight, took {took:?}");
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn where_redis_is_the_bottleneck_operations_share_calls() {
    // Loopback (1000x slower, as above): 30 µs round trip; a call costs Redis 20 µs, plus 2 µs per
    // operation. Sent alone, 64 tasks' operations would need 22 µs of Redis each; shared, a few.
    let (took, per_call, most) = cycle(sim(15_000, 20_000, 2_000), 64, 50).await;
    assert!(per_call >= 8.0, "{per_call:.1} operations per call, {most} in flight, took {took:?}");
    assert!(most <= 2 * SLOTS, "{most} calls in flight");
    let alone = Duration::from_millis(22 * 64 * 100);
    assert!(took < alone / 2, "took {took:?}; one call per operation would take {alone:?}");
}

/// A stand-in for Redis that answers every call with one value.
struct Answers(Value);

impl Transport for Answers {
    async fn call(&self, _: &[Op<'_>]) -> redis::RedisResult<Value> {
        Ok(self.0.clone())
    }
}

/// A shared call answered with more or fewer values than it carried operations: the values cannot be matched
/// to the operations, so every one of them fails as an unexpected reply; none takes another's value, and none
/// is left without an answer.
#[tokio::test]
async fn a_shared_call_answered_with_the_wrong_number_of_values_fails_each_operation() {
    use super::call_many;

    let ops = [acquire("a"), acquire("b")];
    for count in [1, 3] {
        let answers = Answers(Value::Array(vec![Value::BulkString(b"42".to_vec()); count]));
        let replies = call_many(&answers, &ops).await;
        assert_eq!(replies.len(), ops.len(), "{count} values: an operation without an answer");
        for reply in replies {
            let error = reply.expect_err("a value taken from a reply out of step");
            assert!(error.to_string().contains("unexpected reply"), "{count} values: {error}");
        }
    }
}

/// ACQUIRE's fast path answers a grant with its fence alone (the lease is the ttl asked for), as text as BATCH
/// does, or an integer; the slow path's three values still parse; anything else for an acquire is an error,
/// never a grant.
#[tokio::test]
async fn a_grant_may_come_as_its_fence_alone() {
    use super::super::scripts::reply::{attempt_of, BUSY, GRANTED};
    use super::call_one;
    use crate::backend::{Attempt, Hold};

    let fence_alone = call_one(&Answers(Value::Int(42)), &acquire("a")).await.expect("a grant");
    assert_eq!(fence_alone, (GRANTED, 42, 1000));
    let hold = Hold { fence: 42, lease: Duration::from_millis(1000) };
    assert_eq!(attempt_of(fence_alone).expect("parsed"), Attempt::Granted(hold));
    let negative = call_one(&Answers(Value::Int(-3)), &acquire("a")).await.expect("an integer");
    assert!(attempt_of(negative).is_err(), "a negative fence is no grant");

    let busy = Value::Array(vec![Value::Int(BUSY), Value::BulkString(b"7".to_vec()), Value::Int(250)]);
    assert_eq!(call_one(&Answers(busy), &acquire("a")).await.expect("busy"), (BUSY, 7, 250));
    let text = call_one(&Answers(Value::BulkString(b"1795634117634643".to_vec())), &acquire("a")).await;
    assert_eq!(text.expect("a grant"), (GRANTED, 1_795_634_117_634_643, 1000));
    for other in [Value::BulkString(b"x42".to_vec()), Value::Okay, Value::Array(vec![Value::Int(GRANTED)])] {
        assert!(call_one(&Answers(other.clone()), &acquire("a")).await.is_err(), "{other:?} taken for a reply");
    }
    // A release never answers with a fence: an array for one is an error.
    let array = Value::Array(vec![Value::Int(1), Value::Int(0), Value::Int(0)]);
    assert!(call_one(&Answers(array), &release("a")).await.is_err());
}

/// In a BATCH call an acquire with the ttl and holder of the last one sent in full goes as 'b', its token alone
/// (by KEYS on one server, by ARGV on a cluster node); one with another ttl or holder, or a queueing one, goes in
/// full and sets what the next 'b' repeats.
#[test]
fn an_acquire_repeating_the_last_one_s_ttl_and_holder_sends_its_token_alone() {
    use super::{command, command_spread};
    let (mut a3, mut queueing) = (acquire("a3"), acquire("q"));
    if let Op::Acquire { ttl_ms, .. } = &mut a3 {
        *ttl_ms = 2000;
    }
    if let Op::Acquire { queueing: place, .. } = &mut queueing {
        *place = Some(QUEUED);
    }
    let ops = [acquire("a1"), acquire("a2"), a3, queueing, acquire("a4"), release("r"), acquire("a5")];
    let token = |i: usize| match &ops[i] {
        Op::Acquire { token, .. } | Op::Release { token, .. } => token.as_str().as_bytes().to_vec(),
    };
    let holder = b"10:test-owner".to_vec();
    let expected: Vec<Vec<u8>> = vec![
        b"abaqarb".to_vec(),
        token(0),
        b"1000".to_vec(),
        holder.clone(),
        token(1),
        token(2),
        b"2000".to_vec(),
        holder.clone(),
        token(3),
        b"1000".to_vec(),
        holder.clone(),
        b"300".to_vec(),
        b"300".to_vec(),
        b"7".to_vec(),
        b"00000000000000ab".to_vec(),
        b"9000".to_vec(),
        token(4),
        b"1000".to_vec(),
        holder.clone(),
        token(5),
        b"".to_vec(),
        token(6),
    ];
    let args = |cmd: redis::Cmd| -> Vec<Vec<u8>> {
        cmd.args_iter()
            .map(|arg| match arg {
                redis::Arg::Simple(bytes) => bytes.to_vec(),
                _ => Vec::new(),
            })
            .collect()
    };
    let batch = args(command(&ops, super::super::Sending::default()));
    assert_eq!(batch[2], b"7", "seven KEYS");
    assert_eq!(&batch[3 + ops.len()..], &expected[..]);
    let spread = args(command_spread(&ops, super::super::Sending::default()));
    assert_eq!(spread[4], expected[0], "the letters, after KEYS[1]");
    assert_eq!(&spread[5 + ops.len()..], &expected[1..]);
}

/// Every operation letter writes exactly the arguments `batch_arity` says it takes (the table the scripts step
/// over them by, and the simulated server reads calls by).
#[test]
fn each_operation_writes_as_many_arguments_as_its_letter_takes() {
    use super::{batch_arity, batch_letters, write_batch_args};
    let mut queueing = acquire("q");
    if let Op::Acquire { queueing: place, .. } = &mut queueing {
        *place = Some(QUEUED);
    }
    let mut plain = acquire("p");
    if let Op::Acquire { plain: mark, .. } = &mut plain {
        *mark = Some("mark".into());
    }
    let mut keep = release("k");
    if let Op::Release { keep_ms, fence, .. } = &mut keep {
        (*keep_ms, *fence) = (50, Some(7));
    }
    let calls: [(Vec<Op<'static>>, bool, &str); 6] = [
        (vec![acquire("a1"), acquire("a2")], false, "ab"),
        (vec![queueing], false, "q"),
        (vec![plain], false, "p"),
        (vec![release("r")], false, "r"),
        (vec![keep], false, "k"),
        (vec![release("s")], true, "s"),
    ];
    for (ops, again, letters) in calls {
        assert_eq!(batch_letters(&ops, again), letters);
        let mut cmd = redis::Cmd::new();
        write_batch_args(&ops, letters, &mut cmd);
        let expected: usize = letters.bytes().map(|l| batch_arity(l).expect("a letter")).sum();
        assert_eq!(cmd.args_iter().count(), expected, "arguments written for {letters}");
    }
    assert_eq!(batch_arity(b'x'), None);
    // And the script steps over as many: each letter's branch of batch_fn.lua sets `a = t + n`.
    let source = include_str!("lua/batch_fn.lua");
    for letter in [b'q', b'p', b'r', b'k', b's'] {
        let branch = format!("op == {letter} then");
        let at = source.find(&branch).unwrap_or_else(|| panic!("no branch for {}", letter as char));
        let step = &source[at..];
        let step = &step[step.find("a = t + ").expect("a step") + "a = t + ".len()..];
        let n: usize = step[..step.find(|c: char| !c.is_ascii_digit()).unwrap_or(step.len())].parse().expect("n");
        assert_eq!(Some(n), batch_arity(letter), "batch_fn.lua's step for '{}'", letter as char);
    }
}

/// A call built in a frame is the call the link would have numbered: the same script's variant (numbered; on a
/// cluster, sharded), by SHA or by source, with the same keys and arguments, one call or several, on one node
/// or spread over a cluster's. Only the number, which the sender appends, is left to add.
#[test]
fn a_call_built_in_its_frame_is_the_numbered_call() {
    use super::super::numbered::numbered;
    use super::super::scripts::Frame;
    use super::super::Sending;
    use super::{command, command_spread};
    let args = |cmd: &redis::Cmd| -> Vec<Vec<u8>> {
        cmd.args_iter().map(|a| if let redis::Arg::Simple(a) = a { a.to_vec() } else { Vec::new() }).collect()
    };
    let one = [acquire("a")];
    let several = [acquire("a"), release("b"), acquire("c")];
    let builders: [fn(&[Op<'_>], Sending) -> redis::Cmd; 2] = [command, command_spread];
    for frame in [Frame::Numbered, Frame::Sharded] {
        for by_source in [false, true] {
            for ops in [&one[..], &several[..]] {
                for build in builders {
                    let plain = Sending { by_source, ..Sending::default() };
                    let (rebuilt, call) = numbered(&build(ops, plain), frame).expect("a call of ours");
                    let framed = build(ops, Sending { frame: Some(frame), ..plain });
                    let (rebuilt, framed) = (args(&rebuilt), args(&framed));
                    assert_eq!(rebuilt.last().map(Vec::as_slice), Some(call.as_bytes()));
                    assert_eq!(framed[..], rebuilt[..rebuilt.len() - 1], "{frame:?}, by source: {by_source}");
                }
            }
        }
    }
}
