//! Coalescing of acquires and releases: under load, the ones waiting for a call share one script call.
//!
//! Redis spends most of a small script's time on the call itself (parsing, the Lua call, the reply), not on
//! the few commands inside, and so does the client: one call for many locks is what lets a fenced,
//! queue-aware lock keep up with a bare `SET NX`. Nothing waits on a timer to fill a batch:
//! - an operation issued while no call is outstanding is sent at once, alone, by its own task (one task alone
//!   sees no change in latency);
//! - otherwise it queues, and the queue goes out in one call at the end of the runtime's current tick (a
//!   drainer task that yields once, so that it runs after every task that is ready to run): the operations of
//!   the tasks woken by one burst of replies share a call, as ioredis's auto-pipelining shares a write. A
//!   network hop away, where many tasks' operations travel and come back together, that halves what Redis
//!   and the client spend per operation (measured: `--rtt 1`, 64 tasks);
//! - while a window's worth of calls is outstanding, the queue waits for the next call to come back, which
//!   takes it (up to [`MAX_OPS`]) on its next trip.
//!
//! Calls run in tasks of their own, so no caller's cancellation strands another's operation. The window
//! follows the round trip ([`Window`]): small where a call's round trip is mostly Redis's time (loopback), so
//! operations share calls; wide open a network hop away, where a queued operation would wait most of a round
//! trip for a slot while Redis idles.
//!
//! The coalescer talks to Redis through [`Transport`] (one script call for some operations), so its slots,
//! queue and cancellation are unit-tested without a server.

use std::borrow::Cow;
use std::future::Future;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use redis::{Cmd, RedisWrite, Value};
use tokio::sync::oneshot;
use tokio::time::Instant;

use super::scripts::record::write_holder;
use super::scripts::reply::{FAILED, GRANTED};
use super::scripts::{LuaScript, ACQUIRE, ACQUIRE_PLAIN, BATCH, BATCH_SPREAD, RELEASE};
use super::window::Window;
use super::{failed_in_script, millis, unexpected_reply, Sending};
use crate::backend::Queueing;
use crate::LockToken;

/// Operations in one call at most, so one call never holds redis-server for long (about 4 µs each).
const MAX_OPS: usize = 64;

/// An acquire or release, with everything its script needs. Borrowed while its caller sends it; owned
/// only once it has to wait in the queue.
#[derive(Debug, Clone)]
pub(super) enum Op<'a> {
    /// ARGV of [`ACQUIRE`]: token, ttl ms, holder (owner and metadata), then, to queue, register ms,
    /// hand-over lease ms, the attempt's number, the client's id and keep ms.
    Acquire {
        record: Cow<'a, str>,
        token: LockToken,
        ttl_ms: u64,
        /// The client's owner name: shared, so an operation that has to queue copies no more than before.
        owner: Arc<str>,
        metadata: Cow<'a, str>,
        /// The place to take or refresh in the queue if the lock is busy; `None`: do not queue.
        queueing: Option<Queueing>,
        /// For a store without queue or fencing tokens (Redlock's servers): [`ACQUIRE_PLAIN`], which takes
        /// the first three arguments (`queueing` is then `None`) and this, the server's lock-state mark.
        plain: Option<Arc<str>>,
    },
    /// ARGV of [`RELEASE`]: token, the grant's fencing token (empty if unknown), keep ms (0: free it now).
    Release { record: Cow<'a, str>, token: LockToken, fence: Option<u64>, keep_ms: u64 },
}

impl Op<'_> {
    fn into_owned(self) -> Op<'static> {
        match self {
            Op::Acquire { record, token, ttl_ms, owner, metadata, queueing, plain } => Op::Acquire {
                record: Cow::Owned(record.into_owned()),
                token,
                ttl_ms,
                owner,
                metadata: Cow::Owned(metadata.into_owned()),
                queueing,
                plain,
            },
            Op::Release { record, token, fence, keep_ms } => {
                Op::Release { record: Cow::Owned(record.into_owned()), token, fence, keep_ms }
            }
        }
    }

    pub(super) fn record(&self) -> &str {
        match self {
            Op::Acquire { record, .. } | Op::Release { record, .. } => record,
        }
    }

    fn script(&self) -> &'static LuaScript {
        match self {
            Op::Acquire { plain: Some(_), .. } => &ACQUIRE_PLAIN,
            Op::Acquire { .. } => &ACQUIRE,
            Op::Release { .. } => &RELEASE,
        }
    }

    /// The operation's letter in a [`BATCH`] call: which arguments follow. A release sent `again` (its first
    /// send's outcome unknown) is 's'.
    fn letter(&self, again: bool) -> char {
        match self {
            Op::Acquire { plain: Some(_), .. } => 'p',
            Op::Acquire { queueing: None, .. } => 'a',
            Op::Acquire { .. } => 'q',
            Op::Release { .. } if again => 's',
            Op::Release { keep_ms: 0, .. } => 'r',
            Op::Release { .. } => 'k',
        }
    }

    /// Whether this operation is an acquire ([`BATCH`]'s 'a') with the same ttl and holder as `earlier`, an
    /// earlier one in the same call: it is then sent as 'b', its token alone (two arguments fewer, about 1.9k
    /// Redis instructions a lock cycle when many tasks of one call site share a call).
    fn repeats(&self, earlier: &Op<'_>) -> bool {
        match (self, earlier) {
            (
                Op::Acquire { ttl_ms, owner, metadata, queueing: None, plain: None, .. },
                Op::Acquire { ttl_ms: ttl, owner: o, metadata: m, queueing: None, plain: None, .. },
            ) => ttl_ms == ttl && owner == o && metadata == m,
            _ => false,
        }
    }

    /// The arguments the scripts need, trailing zeroes left out (the scripts default them); a release sent
    /// `again` says so after its keep.
    fn write_args(&self, cmd: &mut Cmd, again: bool) {
        match self {
            Op::Acquire { token, ttl_ms, owner, metadata, queueing, plain, .. } => {
                cmd.arg(token.as_str()).arg(ttl_ms);
                write_holder(&mut cmd.writer_for_next_arg(), owner, metadata);
                if let Some(mark) = plain {
                    cmd.arg(&**mark);
                } else if let Some(q) = queueing {
                    cmd.arg(millis(q.register)).arg(millis(q.lease)).arg(q.attempt);
                    cmd.arg(client_id(q.client)).arg(millis(q.keep));
                }
            }
            Op::Release { token, fence, keep_ms, .. } => {
                cmd.arg(token.as_str());
                match fence {
                    Some(fence) => cmd.arg(fence),
                    None => cmd.arg(""),
                };
                if again {
                    cmd.arg(keep_ms).arg(1);
                } else if *keep_ms > 0 {
                    cmd.arg(keep_ms);
                }
            }
        }
    }
}

/// What the script answered for one operation: `(code, fence, ms)` (a release's last two are 0).
pub(super) type Reply = redis::RedisResult<(i64, i64, i64)>;

struct Queued {
    op: Op<'static>,
    reply: oneshot::Sender<Reply>,
}

#[derive(Default)]
struct Slots {
    queue: Vec<Queued>,
    in_flight: usize,
    /// Drainers holding a slot that will take the queue at the end of the current tick: while there is one,
    /// a queued operation needs no other.
    drainers_due: usize,
    window: Window,
}

impl Slots {
    /// Whether a call may go out now.
    fn free(&self) -> bool {
        self.in_flight < self.window.limit()
    }

    /// A call came back (`came_back` is `None` if it failed: a failure says nothing about the round trip).
    /// Returns whether its slot carries on with the queue; if not, the slot is given back.
    fn call_done(&mut self, came_back: Option<CameBack>) -> bool {
        if let Some(CameBack { at, round_trip }) = came_back {
            let window_bound = !self.queue.is_empty() || !self.free();
            self.window.observe(at, round_trip, self.in_flight, window_bound);
        }
        // The window may have shrunk below the calls in flight: then this slot closes even with operations
        // queued (the calls still in flight take them).
        if self.queue.is_empty() || self.in_flight > self.window.limit() {
            self.in_flight -= 1;
            false
        } else {
            true
        }
    }
}

/// Where the coalescer's calls go: one script call carrying `ops` (the single-operation script for one,
/// [`BATCH`] for several), answered with the script's raw reply.
pub(super) trait Transport: Send + Sync + 'static {
    fn call<'a>(&'a self, ops: &'a [Op<'_>]) -> impl Future<Output = redis::RedisResult<Value>> + Send + 'a;
}

/// The per-connection coalescer of acquires and releases.
pub(super) struct Coalescer<T: Transport> {
    conn: T,
    slots: Mutex<Slots>,
    /// Where queue-draining calls run when the code giving a slot back is outside any runtime.
    runtime: tokio::runtime::Handle,
}

impl<T: Transport> Coalescer<T> {
    /// Must be called inside a tokio runtime, whose handle it keeps.
    pub(super) fn new(conn: T) -> Arc<Self> {
        Arc::new(Self { conn, slots: Mutex::default(), runtime: tokio::runtime::Handle::current() })
    }

    fn slots(&self) -> MutexGuard<'_, Slots> {
        // Nothing panics while holding the lock; a poisoned one still holds consistent data.
        self.slots.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Runs `op`: at once in its own call if no call is outstanding, else in a call shared with the
    /// operations issued in the same tick, or in the next call that comes back if the window is full.
    /// Borrowed: a lone call's future holds a reference, not copies of the operation, so it and every future
    /// around it (the whole acquire, moved at each level) stay smaller; only a queued operation is copied.
    pub(super) async fn run(self: &Arc<Self>, op: &Op<'_>) -> Reply {
        let queued = {
            let mut slots = self.slots();
            if slots.in_flight == 0 && slots.queue.is_empty() {
                slots.in_flight += 1;
                None
            } else {
                let (reply, receiver) = oneshot::channel();
                slots.queue.push(Queued { op: op.clone().into_owned(), reply });
                Some(receiver)
            }
        };
        match queued {
            None => {
                // Gives the slot back however this future ends, cancellation included.
                let mut slot = Slot { coalescer: self, came_back: None };
                let sent = Instant::now();
                let reply = call_one(&self.conn, op).await;
                if reply.is_ok() {
                    slot.came_back = Some(CameBack::since(sent));
                }
                reply
            }
            Some(receiver) => {
                self.start_draining_if_idle();
                receiver.await.unwrap_or_else(|_| no_reply())
            }
        }
    }

    /// If the queued operations wait for a slot that is free, and no drainer is due to take them, starts one.
    fn start_draining_if_idle(self: &Arc<Self>) {
        let mut slots = self.slots();
        if slots.free() && !slots.queue.is_empty() && slots.drainers_due == 0 {
            slots.in_flight += 1;
            slots.drainers_due += 1;
            drop(slots);
            self.spawn_drainer();
        }
    }

    /// Hands a slot already counted in `in_flight`, and a drainer already counted in `drainers_due`, to a task
    /// that drains the queue. The task runs on the caller's runtime when there is one (the client may outlive
    /// the runtime it was built on), else on the one the client was built on.
    fn spawn_drainer(self: &Arc<Self>) {
        let drainer = Drainer { coalescer: Arc::clone(self), done: false, due: true };
        let runtime = tokio::runtime::Handle::try_current().unwrap_or_else(|_| self.runtime.clone());
        crate::hooks::spawn_on(&runtime, drainer.run());
    }
}

/// Holds one slot and sends the queue in calls of up to [`MAX_OPS`] until it is empty, each taken at the end
/// of a tick. If its task is dropped first (its runtime shut down), it gives the slot back and fails what is
/// queued, so nothing waits forever.
struct Drainer<T: Transport> {
    coalescer: Arc<Coalescer<T>>,
    done: bool,
    /// Counted in `drainers_due`: it will take the queue when its yield ends.
    due: bool,
}

impl<T: Transport> Drainer<T> {
    async fn run(mut self) {
        // The round trip of this slot's last call, if one came back.
        let mut came_back = None;
        loop {
            if !self.due {
                // Back from a pass that found only cancelled operations.
                self.coalescer.slots().drainers_due += 1;
                self.due = true;
            }
            // Deferred until the runtime has run every task that is ready (tokio wakes yielded tasks once its
            // run queue is empty, and on a worker that never runs dry, at its maintenance pass every 61 polls):
            // the tasks this call's replies just woke, or that were woken with the caller that queued first,
            // add their operations to this call.
            tokio::task::yield_now().await;
            let batch: Vec<Queued> = {
                let mut slots = self.coalescer.slots();
                slots.drainers_due -= 1;
                self.due = false;
                // Given back under the same lock that saw the queue empty: a new operation either was taken
                // here or finds the slot free.
                if !slots.call_done(came_back.take()) {
                    self.done = true;
                    return;
                }
                let take = slots.queue.len().min(MAX_OPS);
                slots.queue.drain(..take).collect()
            };
            // An operation whose caller is gone (a cancelled acquire) is not sent: its cleanup finds nothing.
            let (ops, replies): (Vec<Op<'static>>, Vec<oneshot::Sender<Reply>>) =
                batch.into_iter().filter(|q| !q.reply.is_closed()).map(|q| (q.op, q.reply)).unzip();
            if ops.is_empty() {
                continue;
            }
            let sent = Instant::now();
            let results = call_many(&self.coalescer.conn, &ops).await;
            if results.iter().any(Result::is_ok) {
                came_back = Some(CameBack::since(sent));
            }
            // Due again before the replies wake their tasks, so that the operations those issue wait for it.
            self.coalescer.slots().drainers_due += 1;
            self.due = true;
            for (reply, result) in replies.into_iter().zip(results) {
                let _ = reply.send(result);
            }
        }
    }
}

impl<T: Transport> Drop for Drainer<T> {
    fn drop(&mut self) {
        if !self.done {
            let mut slots = self.coalescer.slots();
            slots.in_flight -= 1;
            if self.due {
                slots.drainers_due -= 1;
            }
            // Their senders dropped, the callers get an error instead of waiting for a call that never comes.
            slots.queue.clear();
        }
    }
}

/// Gives a call slot back: to the queue, if operations wait (and the window still has room for it), else free.
struct Slot<'a, T: Transport> {
    coalescer: &'a Arc<Coalescer<T>>,
    /// When the call came back well, if it did.
    came_back: Option<CameBack>,
}

/// A call that came back well: when, and its round trip. One clock read serves both (two a call cost about
/// 100 client instructions a lock cycle).
#[derive(Debug, Clone, Copy)]
struct CameBack {
    at: Instant,
    round_trip: Duration,
}

impl CameBack {
    fn since(sent: Instant) -> Self {
        let at = Instant::now();
        Self { at, round_trip: at.saturating_duration_since(sent) }
    }
}

impl<T: Transport> Drop for Slot<'_, T> {
    fn drop(&mut self) {
        let carries_on = {
            let mut slots = self.coalescer.slots();
            let carries_on = slots.call_done(self.came_back);
            slots.drainers_due += usize::from(carries_on);
            carries_on
        };
        if carries_on {
            self.coalescer.spawn_drainer();
        }
    }
}

fn no_reply() -> Reply {
    Err(redis::RedisError::from((
        redis::ErrorKind::Io,
        "the call for this lock operation was dropped (the runtime running it shut down)",
    )))
}

/// The script call for `ops`: the single-operation script for one, [`BATCH`] for several.
pub(super) fn command(ops: &[Op<'_>], sending: Sending) -> Cmd {
    let (script, batched) = match ops {
        [op] => (op.script(), false),
        _ => (&*BATCH, true),
    };
    let mut cmd = Cmd::with_capacity(5 + ops.len() * 5, 80 + 96 * ops.len());
    sending.call(&mut cmd, script);
    cmd.arg(ops.len());
    for op in ops {
        cmd.arg(op.record());
    }
    if batched {
        let letters = batch_letters(ops, sending.again);
        cmd.arg(&letters);
        write_batch_args(ops, &letters, &mut cmd);
    } else {
        for op in ops {
            op.write_args(&mut cmd, sending.again);
        }
    }
    cmd
}

/// [`BATCH`]'s operation letters. An acquire that repeats the ttl and holder of the last one sent in full ('a')
/// goes as 'b', its token alone.
fn batch_letters(ops: &[Op<'_>], again: bool) -> String {
    let mut last_in_full: Option<&Op<'_>> = None;
    ops.iter()
        .map(|op| match op.letter(again) {
            'a' if last_in_full.is_some_and(|earlier| op.repeats(earlier)) => 'b',
            'a' => {
                last_in_full = Some(op);
                'a'
            }
            letter => letter,
        })
        .collect()
}

/// How many arguments follow in ARGV for each operation letter of a [`BATCH`] call, as `batch_fn.lua` steps over
/// them (`a = t + n`): the one table the client's writer (tested against it) and the simulated server's reader
/// share. `None`: not a letter.
#[cfg(any(test, feature = "simulation"))]
pub(crate) fn batch_arity(letter: u8) -> Option<usize> {
    Some(match letter {
        b'a' => 3, // token, ttl, holder
        b'b' => 1, // token: ttl and holder as the last 'a'
        b'q' => 8, // token, ttl, holder, register, lease, attempt, client, keep
        b'p' => 4, // token, ttl, holder, the group's lock-state mark
        b'r' => 2, // token, fence
        b'k' => 3, // token, fence, keep
        b's' => 4, // token, fence, keep, 1 (sent again)
        _ => return None,
    })
}

/// The operations' arguments in a [`BATCH`] call, each as its letter says ('b': the token alone).
fn write_batch_args(ops: &[Op<'_>], letters: &str, cmd: &mut Cmd) {
    for (op, letter) in ops.iter().zip(letters.bytes()) {
        match op {
            Op::Acquire { token, .. } if letter == b'b' => {
                cmd.arg(token.as_str());
            }
            _ => op.write_args(cmd, letter == b's'),
        }
    }
}

/// The script call for `ops`, all served by one cluster node whatever their slots: as [`command`] for one,
/// [`BATCH_SPREAD`] for several (the records in ARGV; the first also as KEYS[1], which routes the call).
pub(super) fn command_spread(ops: &[Op<'_>], sending: Sending) -> Cmd {
    let [first, _, ..] = ops else { return command(ops, sending) };
    let mut cmd = Cmd::with_capacity(6 + ops.len() * 6, 112 + 128 * ops.len());
    sending.call(&mut cmd, &BATCH_SPREAD);
    let letters = batch_letters(ops, sending.again);
    cmd.arg(1).arg(first.record()).arg(&letters);
    for op in ops {
        cmd.arg(op.record());
    }
    write_batch_args(ops, &letters, &mut cmd);
    cmd
}

/// One operation in a call of its own.
pub(super) async fn call_one(conn: &impl Transport, op: &Op<'_>) -> Reply {
    reply_of(op, conn.call(std::slice::from_ref(op)).await?)
}

/// What the script answered for `op`, one call's reply or one operation's value in a [`BATCH`] reply.
fn reply_of(op: &Op<'_>, value: Value) -> Reply {
    match (op, value) {
        // A grant for the ttl asked, as its fence alone: decimal text (the text ACQUIRE's fast path and BATCH
        // have), or an integer.
        (Op::Acquire { ttl_ms, .. }, fence @ (Value::Int(_) | Value::BulkString(_))) => {
            Ok((GRANTED, number(&fence)?, i64::try_from(*ttl_ms).unwrap_or(i64::MAX)))
        }
        (_, Value::Array(reply)) => match reply.as_slice() {
            [Value::Int(FAILED), Value::BulkString(message), _] => Err(failed_in_script(message)),
            [Value::Int(code), fence, ms] if matches!(op, Op::Acquire { .. }) => {
                Ok((*code, number(fence)?, number(ms)?))
            }
            _ => Err(unexpected_reply()),
        },
        (Op::Release { .. }, Value::Int(code)) => Ok((code, 0, 0)),
        _ => Err(unexpected_reply()),
    }
}

/// A number in a reply: an integer, or decimal text (the scripts hand fencing tokens and leases back as the
/// text they already have, which costs Redis less than a Lua number).
fn number(value: &Value) -> redis::RedisResult<i64> {
    match value {
        Value::Int(n) => Ok(*n),
        Value::BulkString(text) => {
            std::str::from_utf8(text).ok().and_then(|t| t.parse().ok()).ok_or_else(unexpected_reply)
        }
        _ => Err(unexpected_reply()),
    }
}

/// Several operations in one call; one reply per operation, in order.
async fn call_many(conn: &impl Transport, ops: &[Op<'_>]) -> Vec<Reply> {
    if let [op] = ops {
        return vec![call_one(conn, op).await];
    }
    match conn.call(ops).await {
        Ok(Value::Array(items)) if items.len() == ops.len() => {
            ops.iter().zip(items).map(|(op, reply)| reply_of(op, reply)).collect()
        }
        Ok(_) => ops.iter().map(|_| Err(unexpected_reply())).collect(),
        Err(e) => ops.iter().map(|_| Err(e.clone())).collect(),
    }
}

#[cfg(test)]
#[path = "batch_tests.rs"]
mod tests;

/// A client's id as the scripts name its mark (`R:client:<id>`): 16 hex digits.
pub(super) fn client_id(client: u64) -> String {
    format!("{client:016x}")
}
