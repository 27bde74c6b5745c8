//! Redlock on real servers: a quorum survives a dead or hung minority, a dead majority fails fast and leaves
//! nothing held, grants that arrive after a failed round are given back, no fencing token is claimed, and a
//! server restarted empty lets no second holder in (issue 31).

use std::time::Duration;

use distlock::{Client, LockError, ReleaseOutcome};
use distlock_tests::monitor::Monitor;
use distlock_tests::renewals::{assert_on_schedule, renewed_again, RenewalWatch};
use distlock_tests::sys::Stopped;
use distlock_tests::time::{ms, secs};
use distlock_tests::{busy_for_outsiders, eventually, within, Fixture, RedisServer};
use redis::AsyncCommands;
use tokio::time::Instant;

/// How many of `fixture`'s Redlock servers have `key` (a record or a derived key) right now, asked on fresh
/// connections (a restarted server's old one is gone).
async fn servers_with(fixture: &Fixture, key: &str) -> usize {
    let mut n = 0;
    for server in fixture.redlock_servers() {
        let exists: bool = server.connection().await.exists(key).await.expect("EXISTS");
        n += usize::from(exists);
    }
    n
}

/// `key` taken by `fixture`'s client for 5 s, once its record is on all three servers; and that record's key.
async fn held_on_every_server(fixture: &Fixture, key: &str) -> (distlock::LockGuard, String) {
    let record = fixture.client().record_key(key);
    let guard = fixture.client().lock(key).ttl(secs(5)).acquire().await.expect("acquire");
    on_every_server(fixture, &record).await;
    (guard, record)
}

/// Waits until `record` is on all three servers: an acquire returns at a quorum, so the last server's grant
/// may still be on its way.
async fn on_every_server(fixture: &Fixture, record: &str) {
    eventually(secs(5), "the record on all three servers", || async { servers_with(fixture, record).await == 3 }).await;
}

/// `key` held on `server` alone by a client of its own (the guard keeps it): there, that server answers busy.
async fn held_alone(server: &RedisServer, key: &str, ttl: Duration) -> distlock::LockGuard {
    let client = Client::builder().redis(server.url()).build().await.expect("a client on one server");
    client.lock(key).ttl(ttl).acquire().await.expect("held on one server")
}

/// Waits until the server behind `conn` no longer has `record`, and checks that it was given back: `monitor`
/// (started on that server before the round) saw the record deleted, which a release does only for the
/// token's own grant. So it was a grant given back, not one never made.
async fn given_back(conn: &redis::aio::MultiplexedConnection, monitor: &Monitor, record: &str, what: &str) {
    eventually(secs(8), what, || {
        let (mut conn, record) = (conn.clone(), record.to_owned());
        async move { !conn.exists::<_, bool>(&record).await.expect("EXISTS") }
    })
    .await;
    let deleted = format!("\"del\" \"{record}\"");
    monitor.wait_for(0, &deleted, secs(8)).await;
}

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

/// A Redlock client on `fixture`'s servers with the given response timeout.
async fn client_with_response_timeout(fixture: &Fixture, response: Duration) -> Client {
    let urls: Vec<String> = fixture.redlock_servers().map(RedisServer::url).collect();
    Client::builder().redlock(urls).response_timeout(response).build().await.expect("redlock client")
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_minority_costs_nothing_locks_and_renewals_go_on() {
    let mut fixture = Fixture::redlock_of(5).await;
    fixture.redlock_server_mut(0).kill();
    fixture.redlock_server_mut(3).kill();
    let ttl = ms(600);
    let guard = within(secs(5), "acquire with two of five dead", fixture.client().lock("m").ttl(ttl).acquire())
        .await
        .expect("three of five grant");
    // Several leases long: only renewals by the live majority keep it.
    tokio::time::sleep(ttl * 4).await;
    assert!(!guard.is_lost(), "renewals by three of five servers did not keep the lock");
    assert!(busy_for_outsiders(fixture.client(), "m").await, "a second holder got in");
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_majority_fails_fast_leaves_nothing_held_and_holders_learn_they_lost() {
    let mut fixture = Fixture::redlock().await;
    let record = fixture.client().record_key("k");
    let ttl = secs(1);
    let holder = fixture.client().lock("held").ttl(ttl).acquire().await.expect("acquire");
    let on_live = Monitor::start(fixture.redlock_servers().nth(2).expect("server 2"));
    fixture.redlock_server_mut(0).kill();
    fixture.redlock_server_mut(1).kill();
    // The holder: no quorum renews, so it is told by its deadline (at most one lease from now).
    within(ttl + secs(1), "the holder learns it lost the lock", holder.lost()).await;
    let started = Instant::now();
    let error = fixture.client().lock("k").ttl(ttl).acquire().await.expect_err("one of three granted");
    let took = started.elapsed();
    assert!(matches!(error, LockError::Backend(_)), "{error:?}");
    assert!(error.to_string().contains("only 1 of 3 servers"), "{error}");
    // Bounded by the per-server timeout (a twentieth of the ttl), not the 2 s response timeout; generously.
    assert!(took < secs(1), "a failed round took {took:?}");
    // The live server granted, and was given the grant back.
    let live = fixture.redlock_connections().pop().expect("server 2");
    given_back(&live, &on_live, &record, "the live server's grant given back").await;
}

/// A hung server (SIGSTOP: its socket open, no replies) must not cost the rounds that a quorum decides
/// without it; a round that needs its vote waits a twentieth of the ttl for it, not the response timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_server_does_not_slow_acquires_and_a_late_grant_is_given_back() {
    let _serial = distlock_tests::serial().await;
    let fixture = Fixture::redlock().await;
    let client = client_with_response_timeout(&fixture, secs(10)).await;
    let servers: Vec<&RedisServer> = fixture.redlock_servers().collect();
    let on_hung = Monitor::start(servers[0]);
    let hung = servers[0].freeze();
    // ttl 20 s: each server gets min(ttl/20, response timeout) = 1 s. Rounds decided by the two live servers
    // take nothing like it.
    let mut slowest = Duration::ZERO;
    for i in 0..20 {
        let started = Instant::now();
        let guard = client.lock(format!("fast:{i}")).ttl(secs(20)).acquire().await.expect("two of three grant");
        assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
        slowest = slowest.max(started.elapsed());
    }
    eprintln!("redlock, one of three hung: slowest of 20 acquire+release cycles {slowest:?}");
    assert!(slowest < ms(500), "an acquire+release cycle with one hung server took {slowest:?}");

    // Now the hung server's vote is needed: server 1 holds the lock for someone else.
    let other = held_alone(servers[1], "late", secs(30)).await;
    let ttl = secs(2); // each server gets 100 ms
    let started = Instant::now();
    let outcome = client.lock("late").ttl(ttl).try_acquire().await.expect("a lost round is no error");
    let took = started.elapsed();
    eprintln!("redlock, a round needing the hung server's vote (100 ms per server): {took:?}");
    assert!(outcome.is_none(), "granted without a quorum");
    assert!(took < secs(1), "a round waiting for a hung server took {took:?} (response timeout 10 s)");
    // The hung server wakes, runs the acquire it had queued and grants: that late grant is given back.
    let record = client.record_key("late");
    hung.resume();
    given_back(&servers[0].connection().await, &on_hung, &record, "the late grant given back").await;
    other.release().await.expect("release");
}

/// A round ends as soon as its outcome is certain, and not before. Of five servers, two that say no leave a
/// quorum possible (the three others may still grant): the round waits for them. Three that say no make it
/// impossible: the round fails at once, without waiting for the two silent ones. (The rule is `against >
/// n − quorum`; read early, `>=`, `==` or `n / quorum` fail the first round, and read never, `n + quorum`,
/// makes the second wait out the per-server timeout.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_round_ends_once_its_outcome_is_certain_and_not_before() {
    let _serial = distlock_tests::serial().await;
    let fixture = Fixture::redlock_of(5).await;
    let client = client_with_response_timeout(&fixture, secs(10)).await;
    let servers: Vec<&RedisServer> = fixture.redlock_servers().collect();
    // ttl 20 s: each server gets min(ttl / 20, response timeout) = 1 s to answer.
    let ttl = secs(20);
    // Another client holds `key` on each of `on`, alone: those servers answer busy.
    let held_on = |key: &'static str, on: std::ops::Range<usize>| {
        let on = &servers[on];
        async move {
            let mut guards = Vec::new();
            for server in on {
                guards.push(held_alone(server, key, secs(60)).await);
            }
            guards
        }
    };

    // Two say no at once; the three others answer once resumed, after both no's reached the client.
    let held = held_on("two-no", 0..2).await;
    let record = client.record_key("two-no");
    let monitors: Vec<Monitor> = servers[..2].iter().map(|s| Monitor::start(s)).collect();
    let mut marks = Vec::new();
    for (monitor, server) in monitors.iter().zip(&servers) {
        marks.push(monitor.mark(&mut server.connection().await, "before-the-round").await);
    }
    let hung: Vec<Stopped> = servers[2..].iter().map(|s| s.freeze()).collect();
    let round = tokio::spawn({
        let client = client.clone();
        async move { client.lock("two-no").ttl(ttl).try_acquire().await }
    });
    for (monitor, mark) in monitors.iter().zip(marks) {
        monitor.wait_for(mark, &record, secs(5)).await;
    }
    // Time for the two no's to come back (they did not decide the round: it waits up to 1 s for the others).
    tokio::time::sleep(ms(100)).await;
    hung.into_iter().for_each(Stopped::resume);
    let outcome = within(secs(5), "the round with two no's", round).await.expect("join").expect("try_acquire");
    let guard = outcome.expect("two servers said no and three granted, yet the round failed: it ended early");
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
    drop(held);

    // Three say no; two are silent. Nothing the silent ones say can make a quorum.
    let held = held_on("three-no", 0..3).await;
    let _hung: Vec<Stopped> = servers[3..].iter().map(|s| s.freeze()).collect();
    let started = Instant::now();
    let outcome = client.lock("three-no").ttl(ttl).try_acquire().await.expect("a lost round is no error");
    let took = started.elapsed();
    assert!(outcome.is_none(), "granted although three of five servers hold it for another client");
    assert!(took < ms(500), "a round that three no's had decided waited {took:?} for the silent servers (1 s each)");
    drop(held);
}

/// Two of three servers restart empty (no persistence): until their lock state is a ttl old they do not vote
/// for a new holder, so no quorum can grant. That is a passing state, not a configuration error: a request
/// with a wait retries through it and is served once they count. (Found by the simulation's liveness check,
/// and missed by it at 300 schedules once undone: with `Vote::Young` not told apart, every request failed
/// at once as "invalid configuration".)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn after_two_of_three_restart_empty_a_request_with_a_wait_is_served_once_they_count() {
    let _serial = distlock_tests::serial().await;
    let mut fixture = Fixture::redlock().await;
    fixture.redlock_server_mut(0).restart();
    fixture.redlock_server_mut(1).restart();
    let ttl = secs(1);
    let started = Instant::now();
    let request = fixture.client().lock("young").ttl(ttl).wait(secs(15)).acquire();
    let guard = within(secs(20), "a request while two servers are young", request)
        .await
        .unwrap_or_else(|e| panic!("two servers restarted empty failed a request with a wait at once: {e}"));
    let took = started.elapsed();
    eprintln!("redlock, two of three servers restarted empty: served after {took:?} (ttl {ttl:?})");
    assert!(!guard.is_lost(), "served a lost guard");
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
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

/// A round that a hung majority leaves without a quorum fails, and its error names the first silent server and
/// what happened there: like every Redis error, it says which server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_majority_s_error_names_a_silent_server() {
    let _serial = distlock_tests::serial().await;
    let fixture = Fixture::redlock().await;
    let servers: Vec<&RedisServer> = fixture.redlock_servers().collect();
    // Resumed (SIGCONT) when dropped, also when an assertion fails.
    let _hung = [servers[0].freeze(), servers[1].freeze()];
    // ttl 2 s: each server gets a twentieth of it, 100 ms, to answer.
    let acquire = fixture.client().lock("hung-majority").ttl(secs(2)).acquire();
    let error = within(secs(10), "a round without a quorum", acquire).await.expect_err("one of three granted");
    let message = error.to_string();
    assert!(message.contains("only 1 of 3 servers"), "{message}");
    assert!(message.contains("no answer within redlock's per-server timeout"), "{message}");
    assert!(message.contains(&format!(" at {} ", servers[0].url())), "the silent server is not named: {message}");
    // What to do: the round's own wait decided, not the response timeout.
    assert!(message.contains("redlock waits 100ms for each server's reply"), "a wrong hint: {message}");
}

/// 64 tasks on two clients contend for 4 keys for 2 s, polling (Redlock has no queue): never two bodies
/// of one key at once, and no update of a per-key counter lost. Prints how evenly the grants spread, as
/// Redlock promises no fairness.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_tasks_on_four_keys_never_overlap() {
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
}

/// The engine retries a failed round with the same token, and a failed round gives its grants back by that
/// token. A give-back that reached a server after the next round's acquire there would delete a grant that
/// round counted: here server 0 hangs with the first round's acquire queued, and once it wakes the next rounds
/// need its vote (server 2 stays held by someone else). The lock must then really be held by a majority.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_give_back_never_deletes_a_grant_a_later_round_counted() {
    let _serial = distlock_tests::serial().await;
    let fixture = Fixture::redlock().await;
    let client = client_with_response_timeout(&fixture, secs(10)).await;
    let servers: Vec<&RedisServer> = fixture.redlock_servers().collect();
    let alone = |i: usize| Client::builder().redis(servers[i].url()).build();
    let (on1, on2) = (alone(1).await.expect("client on 1"), alone(2).await.expect("client on 2"));
    let held1 = on1.lock("k").ttl(secs(30)).acquire().await.expect("held on server 1");
    let _held2 = on2.lock("k").ttl(secs(30)).acquire().await.expect("held on server 2");
    let record = client.record_key("k");
    let mut conns = fixture.redlock_connections();
    let hung = servers[0].freeze();
    let acquiring = {
        let client = client.clone();
        tokio::spawn(async move {
            let request = client.lock("k").ttl(secs(10)).wait(secs(30));
            request.retry(distlock::RetryStrategy::Linear { step: ms(200) }).acquire().await
        })
    };
    held1.release().await.expect("release on server 1");
    // A round after that release reached server 1 (it granted there: the record, deleted by the release, is
    // back), with the first round's acquire still queued on server 0.
    eventually(secs(10), "a round granted on server 1", || {
        let (mut conn, record) = (conns[1].clone(), record.clone());
        async move { conn.exists::<_, bool>(&record).await.expect("EXISTS") }
    })
    .await;
    hung.resume();
    let guard = within(secs(30), "the acquire", acquiring).await.expect("join").expect("granted by servers 0 and 1");
    // Servers 0 and 1 are the only majority: both must still hold it, so a renewal round succeeds.
    guard.extend(secs(10)).await.expect("the majority still holds the lock");
    for i in [0, 1] {
        let held: bool = conns[i].exists(&record).await.expect("EXISTS");
        assert!(held, "server {i} lost the grant the acquire counted");
    }
}

/// A round that succeeded keeps every grant, also one still on its way: a server hung at the acquire, whose
/// grant lands after the round, counts for the next renewal. Here server 2 hangs at the acquire and server 0
/// loses the record (a take there does not count: its lock state is old), so an `extend` sent before server 2
/// wakes needs server 2's renewal to count. It once did not: any acquire call of the token still under way on
/// a server made its renewal count for nothing, as if that call were a failed round's, about to give back;
/// the `extend` found the lock lost and gave it back (CI saw it once on the test above, an `extend` sent
/// before the successful round's own calls had ended).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_grant_still_on_its_way_from_a_round_that_succeeded_counts_for_renewals() {
    let _serial = distlock_tests::serial().await;
    let fixture = Fixture::redlock().await;
    let client = client_with_response_timeout(&fixture, secs(10)).await;
    let servers: Vec<&RedisServer> = fixture.redlock_servers().collect();
    let record = client.record_key("k");
    let mut conns = fixture.redlock_connections();
    let hung = servers[2].freeze();
    let guard = client.lock("k").ttl(secs(30)).acquire().await.expect("granted by servers 0 and 1");
    let guard = std::sync::Arc::new(guard);
    let deleted: i64 = conns[0].del(&record).await.expect("DEL");
    assert_eq!(deleted, 1, "server 0 had the record");
    // A long lease, so that the round waits long for server 2 (a twentieth of it, twice: 12 s) on a slow machine.
    let extend = {
        let guard = guard.clone();
        tokio::spawn(async move { guard.extend(secs(120)).await })
    };
    // The renewal round is under way (it took the lock again on server 0) before server 2 wakes.
    eventually(secs(10), "the renewal's take on server 0", || {
        let (mut conn, record) = (conns[0].clone(), record.clone());
        async move { conn.exists::<_, bool>(&record).await.expect("EXISTS") }
    })
    .await;
    hung.resume();
    within(secs(20), "the extend", extend).await.expect("join").expect("renewed by servers 1 and 2");
    assert!(!guard.is_lost(), "the lock was lost");
    assert_eq!(servers_with(&fixture, &record).await, 3, "the lock stands on every server");
    let guard = std::sync::Arc::into_inner(guard).expect("the extend is done");
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
}

/// A server restarted empty (no persistence) while a lock is held there: the lock is still held by the
/// other two, so nobody else gets a quorum, and the holder's renewals take the lock again on the restarted
/// server, so that it stands on all three again. An outsider's round meanwhile gets a grant from the emptied
/// server that does not count (its lock state is younger than the ttl), and gives it back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_restarted_empty_during_a_hold_lets_no_second_holder_in() {
    let mut fixture = Fixture::redlock().await;
    let record = fixture.client().record_key("r");
    let ttl = ms(900);
    let guard = fixture.client().lock("r").ttl(ttl).acquire().await.expect("acquire");
    assert_eq!(servers_with(&fixture, &record).await, 3);
    fixture.redlock_server_mut(0).restart();
    assert_eq!(servers_with(&fixture, &record).await, 2, "the restarted server kept the record");
    assert!(busy_for_outsiders(fixture.client(), "r").await, "a second holder got in with one server emptied");
    // Several leases: renewals keep it, and take it again on the emptied server.
    tokio::time::sleep(ttl * 3).await;
    assert!(!guard.is_lost(), "renewals did not keep the lock");
    eventually(secs(5), "the record back on all three servers", || async {
        servers_with(&fixture, &record).await == 3
    })
    .await;
    assert!(busy_for_outsiders(fixture.client(), "r").await, "a second holder got in");
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
}

/// Schedule 4 with a client built after the restart: a new client marks a group's servers as long settled
/// only when none has a mark (a group set up fresh), never a server that lost its keys beside marked ones. The
/// holder's record is gone from one server (deleted, as a lost write would leave it) and another restarts
/// empty: the new client gets grants from both, and the emptied server's must not count, or it would hold the
/// lock beside a valid holder.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_built_after_a_restart_does_not_count_the_emptied_server() {
    let mut fixture = Fixture::redlock().await;
    let record = fixture.client().record_key("r");
    // Renewed every 10 s: not before the end of the test.
    let guard = fixture.client().lock("r").ttl(secs(30)).acquire().await.expect("acquire");
    eventually(secs(5), "on all three servers", || async { servers_with(&fixture, &record).await == 3 }).await;
    let mut second = fixture.redlock_servers().nth(1).expect("a second server").connection().await;
    let deleted: usize = second.del(&record).await.expect("DEL");
    assert_eq!(deleted, 1);
    fixture.redlock_server_mut(0).restart();
    assert_eq!(servers_with(&fixture, &record).await, 1, "the holder stands on one server");

    let late = fixture.other_client().await;
    assert!(
        busy_for_outsiders(&late, "r").await,
        "a client built after the restart took the lock beside a valid holder"
    );
    assert!(!guard.is_lost());
    // Standing on one server of three, the release cannot be confirmed by a majority.
    guard.release().await.expect("release");
}

/// A renewal takes the lock again where its record is gone, but counts such a server only if it lost every
/// key meanwhile (its lock state is younger than the ttl): a record deleted from every server (as by an
/// operator) leaves the holder lost at its next renewal, however many servers it took again, and the records
/// those takes made are given back (a script deletes each; mutation showed that expiring within the lease
/// had passed for given back).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_deleted_from_every_server_is_lost_and_the_renewal_s_takes_are_given_back() {
    let fixture = Fixture::redlock().await;
    let record = fixture.client().record_key("gone");
    let guard = fixture.client().lock("gone").ttl(ms(900)).acquire().await.expect("acquire");
    eventually(secs(5), "on all three servers", || async { servers_with(&fixture, &record).await == 3 }).await;
    // Given back, not expired (they would be, within the 900 ms lease): wherever a script took the record
    // again, a script deletes it afterwards (the test's own DEL is not a script's).
    let monitors: Vec<Monitor> = fixture.redlock_servers().map(Monitor::start).collect();
    let mut marks = Vec::new();
    for (monitor, mut conn) in monitors.iter().zip(fixture.redlock_connections()) {
        marks.push(monitor.mark(&mut conn, "before the record vanishes").await);
    }
    fixture.vanish_record("gone").await;
    within(secs(5), "the holder learns it lost the lock", guard.lost()).await;
    eventually(secs(5), "the takes gone", || async { servers_with(&fixture, &record).await == 0 }).await;
    let (take, give_back) = (format!("lua] \"set\" \"{record}\""), format!("lua] \"del\" \"{record}\""));
    let mut taken = 0;
    for (i, ((monitor, from), mut conn)) in monitors.iter().zip(marks).zip(fixture.redlock_connections()).enumerate() {
        let until = monitor.mark(&mut conn, "after").await;
        let lines = &monitor.lines()[from..until];
        if let Some(at) = lines.iter().rposition(|line| line.contains(&take)) {
            taken += 1;
            let given_back = lines[at..].iter().any(|line| line.contains(&give_back));
            assert!(given_back, "server {i}: the take expired, never given back:\n{}", monitor.tail(20));
        }
    }
    // The loss was decided on two servers that did not count, each taken again.
    assert!(taken >= 2, "the renewal took the lock again on {taken} servers");
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Expired);
}

/// Issue 31, schedule 4: a release that missed a server, then one restart, must not give two holders.
///
/// P holds on A, B, C and releases, but its connection to C is cut (a blackholing proxy), so the release
/// reaches A and B only (`Released`) and P's record stays on C until its lease ends. X acquires: A and B
/// grant, C is busy, a bare majority. A restarts empty (no persistence). Once P's record on C lapses, Y asks
/// for the lock again and again: counting every grant, it gets A (empty) and C while X's guard reads valid,
/// X's next renewal still a third of a lease away (seen before the fix: 54 grants of Y in 1.3 s). A server
/// that lost its state must not vote for a new holder for a lease (the lock's ttl; X and Y use the same), and
/// X's renewals take the lock again where its record is gone, so X stays valid, stands on all three servers
/// again, and releases `Released`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn s31_4_a_release_that_missed_a_server_then_one_restart_gives_no_second_holder() {
    use distlock_tests::proxy::{Fault, FaultProxy};
    let _serial = distlock_tests::serial().await;
    let mut fixture = Fixture::redlock().await;
    let record = fixture.client().record_key("s31");
    let servers: Vec<&RedisServer> = fixture.redlock_servers().collect();
    let proxy_c = FaultProxy::to_port(servers[2].port()).await;
    let urls = [servers[0].url(), servers[1].url(), proxy_c.url()];
    let p = Client::builder().redlock(urls).owner("p").build().await.expect("P's client, C through the proxy");
    let x = fixture.client_with(|b| b.owner("x")).await;
    let y = fixture.client_with(|b| b.owner("y")).await;
    let mut conns = fixture.redlock_connections();
    let holder_on = |conn: &redis::aio::MultiplexedConnection| {
        let (mut conn, record) = (conn.clone(), record.clone());
        async move { conn.get::<_, Option<String>>(&record).await.expect("GET").unwrap_or_default() }
    };
    // X's and Y's ttl: X's first renewal comes 3 s after its grant, long after P's record on C lapsed.
    let ttl = secs(9);

    // P holds on A, B, C; its release reaches A and B only.
    let p_guard = p.lock("s31").ttl(ms(1500)).acquire().await.expect("P acquires");
    eventually(secs(5), "P on all three servers", || async { servers_with(&fixture, &record).await == 3 }).await;
    proxy_c.set_fault(Fault::Blackhole);
    assert_eq!(p_guard.release().await.expect("P's release"), ReleaseOutcome::Released, "A and B released");
    assert!(holder_on(&conns[2]).await.ends_with(":1:p"), "P's record is not left on C");

    // X: A and B grant, C is busy with P's record.
    let x_guard = x.lock("s31").ttl(ttl).acquire().await.expect("X acquires on A and B");
    let granted = Instant::now();
    for i in [0, 1] {
        assert!(holder_on(&conns[i]).await.ends_with(":1:x"), "X's record not on server {i}");
    }
    assert!(holder_on(&conns[2]).await.ends_with(":1:p"), "P's record left C before X's grant: not the schedule");

    // A crashes and comes back empty.
    fixture.redlock_server_mut(0).restart();
    conns[0] = fixture.redlock_servers().next().expect("A").connection().await;
    assert_eq!(holder_on(&conns[0]).await, "", "A kept the record across its restart");

    // Y tries until P's record on C has lapsed and a while after; X's first renewal is 3 s after its grant.
    let mut lapsed = None;
    let mut y_grants = Vec::new();
    while granted.elapsed() < ms(2800) {
        if lapsed.is_none() && !holder_on(&conns[2]).await.ends_with(":1:p") {
            lapsed = Some(granted.elapsed());
        }
        if let Some(y_guard) = y.lock("s31").ttl(ttl).try_acquire().await.expect("Y's try_acquire") {
            y_grants.push((granted.elapsed(), x_guard.is_lost(), y_guard.is_lost()));
            y_guard.release().await.expect("Y's release");
        }
        tokio::time::sleep(ms(20)).await;
    }
    let lapsed = lapsed.expect("P's record on C did not lapse within 2.8 s of X's grant");
    eprintln!("s31_4: P's record on C lapsed {lapsed:?} after X's grant; Y was granted {} times", y_grants.len());
    let both: Vec<_> = y_grants.iter().filter(|(_, x_lost, y_lost)| !x_lost && !y_lost).collect();
    let first = both.first();
    assert!(both.is_empty(), "two holders: Y granted {} times while X's guard read valid, first {first:?}", both.len());
    assert!(y_grants.is_empty(), "Y was granted while X held the lock: {y_grants:?}");

    // X's renewals keep it and take it again on A and C: it stands on every server, and releases.
    let on_all = || async {
        let mut holders = Vec::new();
        for conn in &conns {
            holders.push(holder_on(conn).await);
        }
        holders
    };
    let deadline = Instant::now() + secs(8);
    loop {
        let holders = on_all().await;
        if holders.iter().all(|h| h.ends_with(":1:x")) {
            break;
        }
        assert!(Instant::now() < deadline, "X not on all three servers 8 s on: {holders:?}");
        tokio::time::sleep(ms(10)).await;
    }
    assert!(!x_guard.is_lost(), "X lost the lock");
    assert_eq!(x_guard.release().await.expect("X's release"), ReleaseOutcome::Released);
    drop(proxy_c);
}

/// Issue 37 on Redlock: one server of three hung (SIGSTOP) for 3 s, a whole lease, while locks with a 3 s
/// lease are held: the other two keep their majority, so every guard stays valid, each is renewed on schedule
/// (no step between renewals over ttl/3 + 200 ms), and each releases `Released` once the server is back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_server_costs_the_held_locks_nothing() {
    let ttl = secs(3);
    let _serial = distlock_tests::serial().await;
    let fixture = Fixture::redlock().await;
    let client = client_with_response_timeout(&fixture, secs(1)).await;
    let servers: Vec<&RedisServer> = fixture.redlock_servers().collect();
    // Taken together, so that their renewals go out in the same rounds.
    let mut acquires = tokio::task::JoinSet::new();
    for i in 0..6 {
        let client = client.clone();
        acquires.spawn(async move {
            let key = format!("hung-server:{i}");
            let guard = client.lock(&key).ttl(ttl).acquire().await.expect("acquire");
            (key, guard)
        });
    }
    let mut held = Vec::new();
    while let Some(acquired) = acquires.join_next().await {
        held.push(acquired.expect("acquire task"));
    }
    let held = std::sync::Arc::new(held);
    let watch = RenewalWatch::start(held.clone(), ttl);
    let hung = servers[0].freeze();
    // A whole lease: the locks outlive it only through renewals by the other two servers.
    tokio::time::sleep(ttl).await;
    hung.resume();
    renewed_again(&held, ttl, 2).await;
    let steps = watch.finish().await;
    eprintln!("redlock, one of three hung for {ttl:?}: largest renewal steps {steps:?}");
    assert_on_schedule(&held, &steps, ttl);
    let held = std::sync::Arc::into_inner(held).expect("the watch is done");
    for (key, guard) in held {
        assert!(!guard.is_lost(), "the lock {key} was lost");
        assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released, "{key}");
    }
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

/// "Gone" and "free" need a quorum too: with three of five servers silent and the two that answer without the
/// record, neither `remaining_ttl` nor `lock_info` may say the lock is gone or free (two can be a minority's
/// view: the silent three may all still hold it). Both must fail, and say why. (Mutants that read `Ok(None)` from
/// `n - quorum` "not held" answers, or from `n / quorum`, were missed by every other test.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gone_or_free_is_said_only_by_a_quorum() {
    let _serial = distlock_tests::serial().await;
    let fixture = Fixture::redlock_of(5).await;
    let client = client_with_response_timeout(&fixture, secs(2)).await;
    let servers: Vec<&RedisServer> = fixture.redlock_servers().collect();
    let guard = client.lock("minority-view").ttl(secs(30)).acquire().await.expect("acquire");
    let record = client.record_key("minority-view");
    for server in &servers[..2] {
        let _: () = server.connection().await.del(&record).await.expect("DEL");
    }
    let hung: Vec<Stopped> = servers[2..].iter().map(|s| s.freeze()).collect();
    let remaining = within(secs(10), "remaining_ttl", guard.remaining_ttl()).await;
    assert!(remaining.is_err(), "two of five servers without the record made remaining_ttl say {remaining:?}");
    let info = within(secs(10), "lock_info", client.lock_info("minority-view")).await;
    assert!(info.is_err(), "two of five servers without the record made lock_info say {info:?}");
    let text = info.unwrap_err().to_string();
    assert!(text.contains("2 of 5") || text.contains("0 of 5"), "the error does not count the servers: {text}");
    hung.into_iter().for_each(Stopped::resume);
    drop(guard);
}
