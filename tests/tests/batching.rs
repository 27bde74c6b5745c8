//! Shared script calls (Redis only): under load the client sends many tasks' acquires and releases in one
//! script call. Each operation must still get exactly its own answer: its own grant and fence, its own busy
//! or hand-over, its own error, and a failure of one must not fail the others sharing its call.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use distlock::{Client, LockError, ReleaseOutcome, RetryStrategy};
use distlock_tests::time::{ms, secs};
use distlock_tests::{eventually, within, Fixture, RedisServer};
use redis::aio::MultiplexedConnection;
use tokio::task::JoinSet;

/// Script calls (EVALSHA and EVAL) the server has run so far.
async fn script_calls(conn: &mut MultiplexedConnection) -> u64 {
    command_calls(conn, "evalsha").await + command_calls(conn, "eval").await
}

/// Calls of `command` the server has run so far, scripts' inner calls included (INFO commandstats).
async fn command_calls(conn: &mut MultiplexedConnection, command: &str) -> u64 {
    let stats: String = redis::cmd("INFO").arg("commandstats").query_async(conn).await.unwrap();
    let prefix = format!("cmdstat_{command}:");
    stats
        .lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.split(['=', ',']).nth(1)?.parse::<u64>().ok())
        .sum()
}

/// 64 tasks cycle on keys of their own while 16 more contend, with queueing and hand-overs, for 4 shared keys,
/// all on one client. Every cycle gets a grant and a Released; each key's fences strictly increase; no two
/// holders of a shared key overlap; nothing is left held; and the server ran fewer script calls than there
/// were operations, so calls were shared, and read its clock (TIME) fewer times than it granted: once per call.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shared_calls_give_every_operation_its_own_answer() {
    const OWN: usize = 64;
    const OWN_CYCLES: usize = 30;
    const SHARED_TASKS: usize = 16;
    const SHARED_KEYS: usize = 4;
    const SHARED_CYCLES: usize = 10;

    let fx = Fixture::redis().await;
    let mut conn = fx.redis_connection().unwrap();
    let calls_before = script_calls(&mut conn).await;
    let clock_reads_before = command_calls(&mut conn, "time").await;
    let inside: Arc<Vec<AtomicUsize>> = Arc::new((0..SHARED_KEYS).map(|_| AtomicUsize::new(0)).collect());
    let mut tasks = JoinSet::new();
    for task in 0..OWN + SHARED_TASKS {
        let client = fx.client().clone();
        let inside = inside.clone();
        tasks.spawn(async move {
            let mut fences: Vec<(String, u64)> = Vec::new();
            let (key, cycles, shared) = if task < OWN {
                (format!("own-{task}"), OWN_CYCLES, None)
            } else {
                let k = task % SHARED_KEYS;
                (format!("shared-{k}"), SHARED_CYCLES, Some(k))
            };
            for _ in 0..cycles {
                let guard = client.lock(key.as_str()).ttl(secs(5)).wait(secs(20)).acquire().await?;
                if let Some(k) = shared {
                    assert_eq!(inside[k].fetch_add(1, Ordering::SeqCst), 0, "two holders of {key}");
                    tokio::task::yield_now().await;
                    inside[k].fetch_sub(1, Ordering::SeqCst);
                }
                fences.push((key.clone(), guard.fencing_token()));
                assert_eq!(guard.release().await?, ReleaseOutcome::Released, "{key}");
            }
            Ok::<_, LockError>(fences)
        });
    }
    let mut by_key: HashMap<String, Vec<u64>> = HashMap::new();
    let results = within(secs(60), "all cycles", async {
        let mut all = Vec::new();
        while let Some(r) = tasks.join_next().await {
            all.push(r.expect("task panicked").expect("every operation succeeds"));
        }
        all
    })
    .await;
    let mut operations = 0u64;
    for fences in results {
        for (key, fence) in fences {
            operations += 2;
            by_key.entry(key).or_default().push(fence);
        }
    }
    assert_eq!(operations as usize, 2 * (OWN * OWN_CYCLES + SHARED_TASKS * SHARED_CYCLES));
    for (key, mut fences) in by_key {
        let n = fences.len();
        fences.sort_unstable();
        fences.dedup();
        assert_eq!(fences.len(), n, "{key}: a fence was handed out twice");
    }
    for task in 0..OWN {
        assert!(fx.client().lock_info(&format!("own-{task}")).await.unwrap().is_none(), "own-{task} still held");
    }
    for k in 0..SHARED_KEYS {
        assert!(fx.client().lock_info(&format!("shared-{k}")).await.unwrap().is_none(), "shared-{k} still held");
    }
    let calls = script_calls(&mut conn).await - calls_before;
    assert!(calls < operations, "{calls} script calls for {operations} operations: none were shared");
    let (clock_reads, grants) = (command_calls(&mut conn, "time").await - clock_reads_before, operations / 2);
    assert!(clock_reads < grants, "TIME ran {clock_reads} times for {grants} grants: once per grant, not per call");
}

/// A lock whose record key holds a list or a string another program wrote fails with a backend error naming it
/// (Redis's WRONGTYPE; the scripts' own FOREIGN error, raised as a table, whose text the shared call must pass
/// on), also when its acquire shares a call with others — and those others are granted as usual.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_failing_operation_does_not_fail_the_others_in_its_call() {
    const GOOD: usize = 120;
    const BAD: usize = 12;

    let fx = Fixture::redis().await;
    let mut conn = fx.redis_connection().unwrap();
    let bad_record = fx.client().record_key("not-a-lock");
    let _: () = redis::cmd("RPUSH").arg(&bad_record).arg("x").query_async(&mut conn).await.unwrap();
    let foreign_record = fx.client().record_key("foreign");
    let () = redis::cmd("SET").arg(&foreign_record).arg("hello").query_async(&mut conn).await.unwrap();

    let mut tasks = JoinSet::new();
    let mut expected_good = 0;
    for i in 0..GOOD + BAD {
        let client = fx.client().clone();
        // The bad ones go in among the good ones, so they queue behind the first calls and share later ones.
        let bad = i % (GOOD / BAD + 1) == GOOD / BAD;
        expected_good += usize::from(!bad);
        let key = match (bad, i % 2) {
            (true, 0) => "not-a-lock".to_owned(),
            (true, _) => "foreign".to_owned(),
            (false, _) => format!("good-{i}"),
        };
        tasks.spawn(async move {
            let result = client.lock(key.as_str()).ttl(secs(5)).retry(RetryStrategy::None).wait(ms(0)).acquire().await;
            (bad, key, result)
        });
    }
    let (mut granted, mut failed_in_shared_call) = (0, std::collections::BTreeSet::new());
    let mut guards = Vec::new();
    while let Some(joined) = within(secs(30), "acquires", tasks.join_next()).await {
        let (bad, key, result) = joined.expect("task panicked");
        match (bad, result) {
            (false, Ok(guard)) => {
                granted += 1;
                guards.push(guard);
            }
            (false, Err(e)) => panic!("{key} failed beside a failing lock: {e}"),
            (true, Err(LockError::Backend(e))) => {
                assert_eq!(e.key(), Some(key.as_str()));
                let text = e.to_string();
                let says = if key == "foreign" { "distlock did not write" } else { "WRONGTYPE" };
                assert!(text.contains(says), "{text}");
                if text.contains("the lock script failed") {
                    failed_in_shared_call.insert(key);
                }
            }
            (true, other) => panic!("the lock on a list key gave {other:?}"),
        }
    }
    assert_eq!(granted, expected_good);
    assert_eq!(
        failed_in_shared_call.len(),
        2,
        "not both kinds of failing acquire shared a call: {failed_in_shared_call:?}"
    );
    for guard in guards {
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    }
    let kind: String = redis::cmd("TYPE").arg(&bad_record).query_async(&mut conn).await.unwrap();
    assert_eq!(kind, "list", "the other program's key was changed");
}

/// A client built on a runtime that has since shut down, used from another under load: the calls that carry
/// queued operations run on the caller's runtime, so every operation gets its answer and none waits forever.
#[test]
fn a_client_outliving_its_runtime_still_answers_every_operation() {
    const TASKS: usize = 64;
    const CYCLES: usize = 5;

    let server = RedisServer::new();
    let building = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let client = building.block_on(Client::builder().redis(server.url()).build()).unwrap();
    drop(building);

    let using = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap();
    let results = using.block_on(within(secs(30), "every cycle answered", async {
        let mut tasks = JoinSet::new();
        for task in 0..TASKS {
            let client = client.clone();
            tasks.spawn(async move {
                let mut granted = 0;
                for _ in 0..CYCLES {
                    let guard = client.lock(format!("outlived-{task}")).ttl(secs(5)).acquire().await?;
                    assert_eq!(guard.release().await?, ReleaseOutcome::Released);
                    granted += 1;
                }
                Ok::<_, LockError>(granted)
            });
        }
        let mut results = Vec::new();
        while let Some(r) = tasks.join_next().await {
            results.push(r.expect("task panicked"));
        }
        results
    }));
    let granted: usize = results.into_iter().map(|r| r.expect("every cycle succeeds")).sum();
    assert_eq!(granted, TASKS * CYCLES);
}

/// 50 locks taken together come due for renewal together and are renewed in shared calls. One of them, whose
/// record another program replaced with a list, fails its renewals and is reported lost; the 49 others,
/// renewed in the same calls, keep their locks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_share_calls_and_a_failing_one_fails_alone() {
    const LOCKS: usize = 50;
    let ttl = ms(900);

    let fx = Fixture::redis().await;
    let mut conn = fx.redis_connection().unwrap();
    let mut taking = JoinSet::new();
    for i in 0..LOCKS {
        let client = fx.client().clone();
        taking.spawn(async move { (i, client.lock(format!("renewed-{i}")).ttl(ttl).acquire().await.unwrap()) });
    }
    let mut guards = Vec::new();
    while let Some(joined) = taking.join_next().await {
        guards.push(joined.unwrap());
    }
    guards.sort_by_key(|(i, _)| *i);
    let guards: Vec<_> = guards.into_iter().map(|(_, g)| g).collect();
    let broken = fx.client().record_key("renewed-0");
    let _: () = redis::cmd("DEL").arg(&broken).query_async(&mut conn).await.unwrap();
    let _: () = redis::cmd("RPUSH").arg(&broken).arg("not a lock").query_async(&mut conn).await.unwrap();

    let (calls_before, renewals_before) = (script_calls(&mut conn).await, command_calls(&mut conn, "pexpire").await);
    within(secs(10), "the broken lock is reported lost", guards[0].lost()).await;
    // Two more rounds of renewals for the others (each renews every ttl/3).
    eventually(secs(10), "the other locks renewed twice more", || {
        let mut conn = conn.clone();
        async move { command_calls(&mut conn, "pexpire").await - renewals_before >= 2 * (LOCKS as u64 - 1) }
    })
    .await;
    for (i, guard) in guards.iter().enumerate().skip(1) {
        assert!(!guard.is_lost(), "renewed-{i} was lost beside the broken lock");
        assert_eq!(guard.remaining_ttl().await.unwrap().map(|r| r > ttl / 3), Some(true), "renewed-{i}");
    }
    let renewals = command_calls(&mut conn, "pexpire").await - renewals_before;
    let calls = script_calls(&mut conn).await - calls_before;
    assert!(calls < renewals, "{calls} script calls for {renewals} renewals: none were shared");
    for guard in guards.into_iter().skip(1) {
        assert_eq!(guard.release().await.unwrap(), ReleaseOutcome::Released);
    }
}

/// Acquires that share a call keep their own metadata and ttl: an acquire is sent short ('b': its token alone,
/// the ttl and holder of the call's last full one) only when both match. 64 tasks acquire at once, in runs of 8
/// with the same ttl and metadata (so short sends happen), the runs differing in metadata alone or in both;
/// every record has its own. (The mutation report's batch.rs
/// `Op::repeats`: a metadata compared with `!=` made later acquires take an earlier one's.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_sharing_a_call_keep_their_own_metadata_and_ttl() {
    const TASKS: usize = 64;
    let fx = Fixture::redis().await;
    let mut conn = fx.redis_connection().unwrap();
    let calls_before = script_calls(&mut conn).await;
    let ttl = |i: usize| secs(20 + (i / 16 % 2) as u64 * 10);
    let metadata = |i: usize| format!("m{}", i / 8 % 2);
    let mut tasks = JoinSet::new();
    for i in 0..TASKS {
        let client = fx.client().clone();
        tasks.spawn(async move {
            let request = client.lock(format!("meta-{i}")).ttl(ttl(i)).metadata(metadata(i));
            (i, request.acquire().await.expect("acquire"))
        });
    }
    let mut guards = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        guards.push(joined.expect("no panic"));
    }
    let calls = script_calls(&mut conn).await - calls_before;
    assert!(calls < TASKS as u64, "{calls} script calls for {TASKS} acquires: no call was shared");
    for (i, _) in &guards {
        let info = fx.client().lock_info(&format!("meta-{i}")).await.expect("lock_info").expect("held");
        assert_eq!(info.metadata, metadata(*i), "lock meta-{i}");
        let (asked, left) = (ttl(*i), info.remaining_ttl);
        assert!(left <= asked && left + secs(5) > asked, "lock meta-{i}: {left:?} left of a {asked:?} ttl");
    }
    for (_, guard) in guards {
        assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
    }
}

/// Releases that share a call answer as lone ones do: of a lock whose record is gone (expired, or deleted
/// here), each says `Expired`, not `Unconfirmed`, which only a release sent again after a lost reply may say
/// ('s' in the shared call; the mutation report's batch.rs `Op::letter`: every shared release marked as sent
/// again). 64 locks, their records deleted, released at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_sharing_a_call_of_records_gone_say_expired() {
    const LOCKS: usize = 64;
    let fx = Fixture::redis().await;
    let mut conn = fx.redis_connection().unwrap();
    let mut guards = Vec::new();
    for i in 0..LOCKS {
        let name = format!("gone-{i}");
        guards.push(fx.client().lock(&name).ttl(secs(30)).acquire().await.expect("acquire"));
        let () = redis::cmd("DEL").arg(fx.client().record_key(&name)).query_async(&mut conn).await.unwrap();
    }
    let calls_before = script_calls(&mut conn).await;
    let mut tasks = JoinSet::new();
    for guard in guards {
        tasks.spawn(async move { (guard.key().to_owned(), guard.release().await.expect("release")) });
    }
    while let Some(joined) = tasks.join_next().await {
        let (key, outcome) = joined.expect("no panic");
        assert_eq!(outcome, ReleaseOutcome::Expired, "lock {key}, its record gone");
    }
    let calls = script_calls(&mut conn).await - calls_before;
    assert!(calls < LOCKS as u64, "{calls} script calls for {LOCKS} releases: no call was shared");
}

/// Every script a started client calls is already in the server's script cache: the start loads each one as
/// the connection sends it (SCRIPT LOAD), so no call pays a NOSCRIPT and then an EVAL of the whole source:
/// not a burst of first renewals after this process restarts, nor a Redlock server's first grant (connect.rs).
/// (The mutation report's `Link::script_source` → `""` or `"xyzzy"`: the loads cached another script or
/// failed, and no test saw it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_started_client_finds_its_scripts_cached() {
    distlock_tests::wall_clock::again_if_the_wall_clock_stepped(|| async {
        let fx = Fixture::redis().await;
        let mut conn = fx.redis_connection().unwrap();
        let evals_before = command_calls(&mut conn, "eval").await;
        let client = fx.client();
        let guard = client.lock("cached").ttl(ms(600)).acquire().await.expect("acquire");
        let first = guard.deadline();
        eventually(secs(5), "a renewal by the watchdog", || async { guard.deadline() > first }).await;
        guard.extend(secs(2)).await.expect("extend");
        assert!(client.lock_info("cached").await.expect("lock_info").is_some(), "held");
        assert!(!client.force_unlock("never-held").await.expect("force_unlock"), "nothing to unlock");
        assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
        assert_eq!(command_calls(&mut conn, "eval").await, evals_before, "a script call fell back to EVAL");
        assert!(
            command_calls(&mut conn, "evalsha").await > 0,
            "no script call counted: the count reads the wrong stat"
        );
    })
    .await
}
