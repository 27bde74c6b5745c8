//! Redlock on real servers: each server keeps only the record, a lock is held on every server and released
//! everywhere, force_unlock and listings count a quorum, no fencing token is claimed, waiters poll, and 64 tasks
//! never overlap. A dead or hung minority: redlock_faults.rs; servers restarted empty: redlock_restarts.rs.

use distlock::{Client, LockError, ReleaseOutcome};
use distlock_tests::redlock::{client_with_response_timeout, held_on_every_server, on_every_server, servers_with};
use distlock_tests::sys::Stopped;
use distlock_tests::time::{ms, secs};
use distlock_tests::{eventually, within, Fixture, RedisServer};
use redis::AsyncCommands;
use tokio::time::Instant;

/// Each server of a Redlock group keeps the lock's record and nothing else: no fence key (fencing is refused)
/// and no queue (waiters poll), so a grant costs Redis no more than it needs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_server_keeps_only_the_record() {
    let fixture = Fixture::redlock().await;
    let waiter = fixture.client().clone();
    // Acquire and release each return at a quorum, so the last server's grant or delete may still be on its
    // way: the checks wait for it rather than read the servers at once.
    let (guard, record) = held_on_every_server(&fixture, "plain").await;
    // A waiter that polls while it is held: it leaves nothing behind either.
    let busy = waiter.lock("plain").wait(ms(300)).acquire().await.expect_err("held");
    assert!(busy.is_busy(), "{busy:?}");
    for mut conn in fixture.redlock_connections() {
        let keys: Vec<String> = conn.keys(format!("{record}*")).await.expect("KEYS");
        assert_eq!(keys, vec![record.clone()], "keys for one held lock");
    }
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
    eventually(secs(5), "no key of the lock left on any server after the release", || async {
        let mut left = Vec::new();
        for mut conn in fixture.redlock_connections() {
            left.extend(conn.keys::<_, Vec<String>>(format!("{record}*")).await.expect("KEYS"));
        }
        left.is_empty()
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counts_that_are_not_odd_and_at_least_three_are_refused() {
    let url = |port: u16| format!("redis://127.0.0.1:{port}/");
    for urls in [vec![], vec![url(1)], vec![url(1), url(2)], vec![url(1), url(2), url(3), url(4)]] {
        let n = urls.len();
        match Client::builder().redlock(urls).build().await {
            Err(LockError::InvalidConfig(message)) => {
                assert!(message.contains("odd number of at least 3"), "{n} servers: {message}")
            }
            other => panic!("{n} servers accepted: {other:?}"),
        }
    }
    match Client::builder().redlock([url(1), url(2), url(1)]).build().await {
        Err(LockError::InvalidConfig(message)) => assert!(message.contains("twice"), "{message}"),
        other => panic!("a server given twice accepted: {other:?}"),
    }
    let with_replicas = Client::builder().redlock([url(1), url(2), url(3)]).wait_for_replicas(1, ms(50));
    match with_replicas.build().await {
        Err(LockError::InvalidConfig(message)) => assert!(message.contains("wait_for_replicas"), "{message}"),
        other => panic!("wait_for_replicas accepted: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_is_held_on_every_server_excludes_others_and_is_released_everywhere() {
    let fixture = Fixture::redlock().await;
    let (guard, record) = held_on_every_server(&fixture, "job").await;
    let other = fixture.other_client().await;
    assert!(other.lock("job").try_acquire().await.expect("try_acquire").is_none(), "a second holder got in");
    let info = other.lock_info("job").await.expect("lock_info").expect("held");
    assert_eq!(info.fencing_token, 0, "Redlock reports no fencing token");
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
    eventually(secs(5), "the record gone from every server", || async { servers_with(&fixture, &record).await == 0 })
        .await;
    let second = other.lock("job").try_acquire().await.expect("try_acquire").expect("free after the release");
    second.release().await.expect("release");
}

/// `force_unlock` deletes the record on every server and says whether there was one: true for a held lock, whose
/// guard then reads gone, and false for a free one (the mutation report's `force_unlock` → `Ok(true)` and
/// `Ok(false)`, and its decided rule).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_deletes_everywhere_and_says_whether_a_lock_was_held() {
    let fixture = Fixture::redlock().await;
    let (guard, record) = held_on_every_server(&fixture, "job").await;
    let operator = fixture.other_client().await;
    assert!(operator.force_unlock("job").await.expect("force_unlock"), "a held lock force-unlocked read as free");
    eventually(secs(5), "the record gone from every server", || async { servers_with(&fixture, &record).await == 0 })
        .await;
    assert_eq!(guard.remaining_ttl().await.expect("remaining_ttl"), None, "the guard still reads its lease");
    assert!(!operator.force_unlock("job").await.expect("force_unlock"), "a free lock force-unlocked read as held");
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Expired);
}

/// `force_unlock` needs a quorum of answers, and no more: with one of three servers hung it still unlocks (two
/// answered), with two hung it fails rather than say anything (the mutation report's quorum check `<` → `==`,
/// which refused the first and answered the second).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn force_unlock_needs_a_quorum_of_answers_and_no_more() {
    let _serial = distlock_tests::serial().await;
    let fixture = Fixture::redlock().await;
    let (guard, _record) = held_on_every_server(&fixture, "job").await;
    let operator = client_with_response_timeout(&fixture, secs(1)).await;
    let servers: Vec<&RedisServer> = fixture.redlock_servers().collect();
    let hung = servers[2].freeze();
    let unlocked = within(secs(10), "force_unlock with one server hung", operator.force_unlock("job")).await;
    assert!(unlocked.expect("force_unlock with two of three servers answering"), "a held lock read as free");
    hung.resume();
    let _hung = [servers[0].freeze(), servers[1].freeze()];
    let outcome = within(secs(10), "force_unlock with two servers hung", operator.force_unlock("job")).await;
    assert!(outcome.is_err(), "a force_unlock that two of three servers did not answer said {outcome:?}");
    drop(guard);
}

/// A listing reads every server in turn, not only the first: a lock whose record the first server lost is still
/// listed (once per server that has it), and values another program wrote where records would be are left out
/// and counted on every server (the mutation report's `scan` `==` → `!=`, which ended the listing after the
/// first server, and `+=` → `*=`, which counted nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_reads_every_server_and_counts_what_it_skips() {
    let fixture = Fixture::redlock().await;
    let (guard, record) = held_on_every_server(&fixture, "job").await;
    let foreign = fixture.client().record_key("foreign");
    for (i, mut conn) in fixture.redlock_connections().into_iter().enumerate() {
        if i == 0 {
            let deleted: i64 = conn.del(&record).await.expect("DEL");
            assert_eq!(deleted, 1, "setup: the first server without the record");
        } else {
            let () = conn.set(&foreign, "another program's value").await.expect("SET");
        }
    }
    let mut listing = fixture.client().list_locks("*");
    let mut names = Vec::new();
    while let Some(page) = within(secs(10), "a page of the listing", listing.next_page()).await.expect("next_page") {
        names.extend(page);
    }
    // Two, or three if a renewal took the lock again on the first server meanwhile.
    assert!(names.len() >= 2 && names.iter().all(|n| n == "job"), "listed: {names:?}");
    assert_eq!(listing.skipped(), 2, "one value not ours on each of two servers");
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
}

/// The maximum of per-server counters is not monotonic, so Redlock claims no fencing token: the fallible
/// accessor says so, the infallible one gives the documented 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_are_refused_not_faked() {
    let fixture = Fixture::redlock().await;
    let guard = fixture.client().lock("ledger").acquire().await.expect("acquire");
    assert_eq!(guard.fencing_token(), 0);
    match guard.try_fencing_token() {
        Err(LockError::InvalidConfig(message)) => assert!(message.contains("no fencing tokens"), "{message}"),
        other => panic!("Redlock gave a fencing token: {other:?}"),
    }
}

/// Raises a per-server counter on each of `granting` (indices into `conns`) and returns the largest: the
/// fencing token the naive scheme, "the maximum of the quorum's counters", would hand out for that grant.
async fn naive_token(conns: &[redis::aio::MultiplexedConnection], granting: &[usize]) -> i64 {
    let mut token = 0;
    for &i in granting {
        let value: i64 = conns[i].clone().incr("naive:ledger", 1).await.expect("INCR");
        token = token.max(value);
    }
    token
}

/// The schedule that shows the maximum of per-server counters is no fencing token (issue 12; measured in
/// shared/scale-out.md): rounds that reach only server 3 drive its counter up; A is granted by {2, 3} and
/// releases; B is granted by {1, 2}. Counters raised by each grant's servers give B a lower maximum than A, so
/// a fenced store would refuse the new holder and accept the stale one. On the same schedule distlock's
/// guards claim no token at all, and no server keeps anything one could be read from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_the_schedule_that_breaks_the_maximum_of_counters_no_token_is_claimed() {
    let _serial = distlock_tests::serial().await;
    let fixture = Fixture::redlock().await;
    let client = fixture.client();
    let servers: Vec<&RedisServer> = fixture.redlock_servers().collect();
    let pids: Vec<u32> = servers.iter().map(|s| s.pid().expect("pid")).collect();
    let mut conns = Vec::new();
    for server in &servers {
        conns.push(server.connection().await);
    }
    let record = client.record_key("ledger");
    let ttl = secs(2); // a server whose vote is needed waits at most ttl/20 = 100 ms
    let settled = || async { servers_with(&fixture, &record).await == 0 };

    // 1. Three rounds reach only server 3 (1 and 2 hung): no quorum, so no grant; its counter climbs.
    let hung = [Stopped::stop(pids[0]), Stopped::stop(pids[1])];
    for _ in 0..3 {
        // Not granted: busy, or (as here, the majority silent) an error naming the servers that did not answer.
        let outcome = client.lock("ledger").ttl(ttl).try_acquire().await;
        assert!(!matches!(outcome, Ok(Some(_))), "granted by one server of three");
        naive_token(&conns, &[2]).await;
    }
    hung.into_iter().for_each(Stopped::resume);
    eventually(secs(8), "the failed rounds' grants given back", settled).await;

    // 2. A is granted by {2, 3} (1 hung).
    let hung = Stopped::stop(pids[0]);
    let a = within(secs(5), "A on {2, 3}", client.lock("ledger").ttl(ttl).acquire()).await.expect("2 and 3 grant");
    let naive_a = naive_token(&conns, &[1, 2]).await;
    hung.resume();
    assert_eq!(a.fencing_token(), 0, "A was handed a token");
    assert!(a.try_fencing_token().is_err(), "A was handed a token");
    a.release().await.expect("release");
    eventually(secs(8), "A's record gone from every server", settled).await;

    // 3. B is granted by {1, 2} (3 hung).
    let hung = Stopped::stop(pids[2]);
    let b = within(secs(5), "B on {1, 2}", client.lock("ledger").ttl(ttl).acquire()).await.expect("1 and 2 grant");
    let naive_b = naive_token(&conns, &[0, 1]).await;
    hung.resume();
    assert!(naive_b < naive_a, "the counters' maximum did not go back ({naive_a} then {naive_b}): not the schedule");
    assert_eq!(b.fencing_token(), 0, "B was handed a token");
    assert!(b.try_fencing_token().is_err(), "B was handed a token");
    b.release().await.expect("release");
    // Released, the record goes from every server: none keeps a last token, as a store with tokens does.
    assert_eq!(servers_with(&fixture, &record).await, 0, "a server keeps the record after the release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_poll_and_get_the_lock_once_it_is_free() {
    let fixture = Fixture::redlock().await;
    let holder = fixture.client().lock("q").ttl(secs(5)).acquire().await.expect("acquire");
    let other = fixture.other_client().await;
    let waiter = tokio::spawn(async move { other.lock("q").wait(secs(10)).acquire().await });
    tokio::time::sleep(ms(200)).await;
    assert!(!waiter.is_finished(), "the waiter got a held lock");
    holder.release().await.expect("release");
    let guard = within(secs(10), "the waiter's acquire", waiter).await.expect("join").expect("waiter gets it");
    assert!(!guard.is_lost());
}

/// A release answers what the servers say: of records gone everywhere, `Expired`; when a majority cannot
/// answer (two of three stopped), an error, since the silent ones may still hold the lock — never `Expired`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_says_expired_only_when_the_servers_say_so() {
    let _serial = distlock_tests::serial().await;
    let fixture = Fixture::redlock().await;
    let client = client_with_response_timeout(&fixture, secs(1)).await;
    let record = client.record_key("gone");
    let guard = client.lock("gone").ttl(secs(30)).acquire().await.expect("acquire");
    on_every_server(&fixture, &record).await;
    for mut conn in fixture.redlock_connections() {
        let deleted: i64 = conn.del(&record).await.expect("DEL");
        assert_eq!(deleted, 1, "setup: a server without the record");
    }
    assert_eq!(guard.release().await.expect("release of records gone"), ReleaseOutcome::Expired);

    let guard = client.lock("silent").ttl(secs(30)).acquire().await.expect("acquire");
    let servers: Vec<&RedisServer> = fixture.redlock_servers().collect();
    let _hung = [servers[0].freeze(), servers[1].freeze()];
    let outcome = within(secs(10), "a release two servers do not answer", guard.release()).await;
    assert!(outcome.is_err(), "a release that two of three servers did not answer said {outcome:?}");
}

/// 64 tasks on two clients contend for 4 keys for 2 s, polling (Redlock has no queue): never two bodies
/// of one key at once, and no update of a per-key counter lost. Prints how evenly the grants spread, as
/// Redlock promises no fairness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_on_four_keys_never_overlap() {
    distlock_tests::wall_clock::again_if_the_wall_clock_stepped(|| async {
        use std::sync::atomic::{AtomicUsize, Ordering};
        use std::sync::Arc;
        let _serial = distlock_tests::serial().await;
        let fixture = Fixture::redlock().await;
        let clients = [fixture.client().clone(), fixture.other_client().await];
        let inside: Arc<[AtomicUsize; 4]> = Arc::new(Default::default());
        let overlaps = Arc::new(AtomicUsize::new(0));
        let counters: Vec<_> = (0..4).map(|k| fixture.counter(&format!("c{k}"))).collect();
        let until = Instant::now() + secs(2);
        let mut tasks = tokio::task::JoinSet::new();
        for t in 0..64 {
            let (client, inside, overlaps) = (clients[t % 2].clone(), inside.clone(), overlaps.clone());
            let counter = counters[t % 4].clone();
            tasks.spawn(async move {
                let mut grants = 0usize;
                while Instant::now() < until {
                    let body = async {
                        if inside[t % 4].fetch_add(1, Ordering::SeqCst) != 0 {
                            overlaps.fetch_add(1, Ordering::SeqCst);
                        }
                        counter.racy_increment(ms(1)).await;
                        inside[t % 4].fetch_sub(1, Ordering::SeqCst);
                    };
                    match client.lock(format!("hot:{}", t % 4)).ttl(secs(2)).wait(ms(500)).run(body).await {
                        Ok(()) => grants += 1,
                        Err(e) if e.is_busy() => {}
                        Err(e) => panic!("task {t}: {e}"),
                    }
                }
                (t % 4, grants)
            });
        }
        let mut per_key = [0i64; 4];
        let mut per_task = Vec::new();
        while let Some(joined) = tasks.join_next().await {
            let (key, grants) = joined.expect("task");
            per_key[key] += grants as i64;
            per_task.push(grants);
        }
        assert_eq!(overlaps.load(Ordering::SeqCst), 0, "two bodies of one key ran at once");
        for (k, counter) in counters.iter().enumerate() {
            assert_eq!(counter.get().await, per_key[k], "key {k}: lost updates");
        }
        let total: usize = per_task.iter().sum();
        assert!(total > 0, "no task got any lock");
        let (min, max) = (per_task.iter().min().copied(), per_task.iter().max().copied());
        eprintln!("redlock fairness, 64 tasks on 4 keys for 2 s: {total} grants, per task min {min:?} max {max:?}");
    })
    .await
}

/// A Redlock client's `Debug` names each of its servers and none of their passwords (what `bad_input` checks
/// for a one-server client).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn debug_names_every_server_and_no_password() {
    const PASSWORD: &str = "r3dlock-Pa55word";
    let servers = [RedisServer::new(), RedisServer::new(), RedisServer::new()];
    for server in &servers {
        let mut admin = server.connection().await;
        let _: () =
            redis::cmd("CONFIG").arg("SET").arg("requirepass").arg(PASSWORD).query_async(&mut admin).await.unwrap();
    }
    let urls: Vec<String> = servers.iter().map(|s| format!("redis://:{PASSWORD}@127.0.0.1:{}/", s.port())).collect();
    let client = Client::builder().redlock(urls).build().await.expect("redlock client with passwords");
    let shown = format!("{client:?}");
    assert!(!shown.contains(PASSWORD), "Debug shows a password: {shown}");
    for server in &servers {
        assert!(
            shown.contains(&format!("127.0.0.1:{}", server.port())),
            "Debug does not name {}: {shown}",
            server.port()
        );
    }
    let guard = client.lock("debug").acquire().await.expect("acquire with passwords");
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
}
