//! Redlock with servers dead or hung: a quorum survives a dead or hung minority, a dead majority fails fast and
//! leaves nothing held, a round ends once its outcome is certain, and grants that arrive after a failed round
//! are given back, never one a later round counted.

use std::time::Duration;

use distlock::{Client, LockError, ReleaseOutcome};
use distlock_tests::logs;
use distlock_tests::monitor::Monitor;
use distlock_tests::redlock::{client_with_response_timeout, given_back, held_alone, servers_with};
use distlock_tests::renewals::{assert_on_schedule, renewed_again, RenewalWatch};
use distlock_tests::sys::Stopped;
use distlock_tests::time::{ms, secs};
use distlock_tests::{busy_for_outsiders, eventually, within, Fixture, RedisServer};
use redis::AsyncCommands;
use tokio::time::Instant;
use tracing::Level;

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

/// A round that a hung majority leaves without a quorum fails, and its error names the first silent server and
/// what happened there: like every Redis error, it says which server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_majority_s_error_names_a_silent_server() {
    distlock_tests::wall_clock::again_if_the_wall_clock_stepped(|| async {
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
    })
    .await
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

/// One lock cycle on `health:<i>`, granted by two of three servers at least and released.
async fn health_cycle(client: Client, i: usize) {
    let guard = client.lock(format!("health:{i}")).ttl(secs(5)).acquire().await.expect("two of three grant");
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
}

/// Lock cycles from `health:<from>` on until `logged()` holds (within 10 s, else the test fails saying `what`).
async fn cycles_until(client: &Client, from: usize, what: &str, logged: impl Fn() -> bool) {
    let mut i = from;
    eventually(secs(10), what, || {
        i += 1;
        let cycle = health_cycle(client.clone(), i);
        async {
            cycle.await;
            logged()
        }
    })
    .await;
}

/// A server that goes down while the client runs is named in one WARN once three of its calls in a row failed
/// (the locks go on, on the other two), and at INFO once it answers again. Before, nothing said so: the group
/// ran on two of three servers unnoticed until one more failure would stop every lock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_down_is_warned_of_once_and_its_return_is_told() {
    let captured = logs::capture();
    let mut fixture = Fixture::redlock().await;
    let client = fixture.client().clone();
    let down = fixture.redlock_servers().nth(1).expect("server 1").url();
    for i in 0..3 {
        health_cycle(client.clone(), i).await;
    }
    assert!(captured.matching(Level::WARN, &["calls in a row", &down]).is_empty(), "{}", captured.dump());

    fixture.redlock_server_mut(1).kill();
    cycles_until(&client, 3, "a warning naming the server down", || {
        !captured.matching(Level::WARN, &["failed 3 calls in a row", &down]).is_empty()
    })
    .await;
    for i in 100..110 {
        health_cycle(client.clone(), i).await;
    }
    let warned = captured.matching(Level::WARN, &["calls in a row", &down]);
    assert_eq!(warned.len(), 1, "warned of more than once:\n{}", captured.dump());

    fixture.redlock_server_mut(1).restart();
    cycles_until(&client, 200, "the server's return told", || {
        !captured.matching(Level::INFO, &["answers again", &down]).is_empty()
    })
    .await;
}
