//! A Redlock group while servers are down. Building a client: a minority down is what Redlock is for, so the
//! client is built, warns, takes locks on the others and counts the silent server once it answers; a majority
//! down fails the build; and a client built with a server down never takes the group for a new one. Listing:
//! a minority down is passed over, and every lock a quorum holds is still listed.

use distlock::{BackendError, BackendErrorKind, Client, LockError, ReleaseOutcome};
use distlock_tests::logs;
use distlock_tests::redlock::servers_with;
use distlock_tests::time::{ms, secs};
use distlock_tests::{eventually, within, Fixture, RedisServer};
use tokio::time::Instant;
use tracing::Level;

/// A fresh connection to each of `fixture`'s Redlock servers that is running (a restarted server's old one is
/// gone; a killed one has none).
async fn live_connections(fixture: &Fixture) -> Vec<redis::aio::MultiplexedConnection> {
    let mut conns = Vec::new();
    for server in fixture.redlock_servers() {
        let client = redis::Client::open(server.url()).expect("URL");
        if let Ok(Ok(conn)) = tokio::time::timeout(secs(1), client.get_multiplexed_async_connection()).await {
            conns.push(conn);
        }
    }
    conns
}

/// A group in use (its servers marked), one server down: the client is built at once, warns naming that
/// server, and takes locks on the other two without delay; once the server is back (empty), the holder's
/// renewals stand on it too, and the release frees the lock there as well.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_minority_down_at_build_is_warned_of_and_counted_once_it_answers() {
    let captured = logs::capture();
    let mut fixture = Fixture::redlock().await;
    fixture.redlock_server_mut(0).kill();
    let silent = fixture.redlock_servers().next().expect("server 0").url();

    let client = within(secs(10), "build with one of three down", fixture.other_client()).await;
    let warned = captured.matching(Level::WARN, &["did not answer while the client was built", &silent]);
    assert_eq!(warned.len(), 1, "no warning names {silent}:\n{}", captured.dump());

    // Without a wait: the two answering servers count at once (young ones would refuse it, a ttl long).
    let ttl = secs(2);
    let started = Instant::now();
    let guard = client.lock("minority").ttl(ttl).acquire().await.expect("two of three grant");
    assert!(started.elapsed() < ttl, "the answering servers did not count at once: {:?}", started.elapsed());
    let record = client.record_key("minority");
    assert_eq!(servers_with(&fixture, &record).await, 2);

    fixture.redlock_server_mut(0).restart();
    eventually(secs(10), "the holder's record on the server that came back", || async {
        servers_with(&fixture, &record).await == 3
    })
    .await;
    assert!(!guard.is_lost(), "the lock was lost while a server came back");
    // Warned of at build, so not again by its failed calls since; its return is told.
    assert!(captured.matching(Level::WARN, &["calls in a row", &silent]).is_empty(), "{}", captured.dump());
    assert!(!captured.matching(Level::INFO, &["answers again", &silent]).is_empty(), "{}", captured.dump());
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
    eventually(secs(5), "the record freed on every server", || async {
        let mut freed = 0;
        for mut conn in live_connections(&fixture).await {
            freed += usize::from(distlock_tests::record_is_free(&mut conn, &record).await);
        }
        freed == 3
    })
    .await;
}

/// The schedule a client built with a server down must not open: the holder stands on A, B and C; A and B
/// restart empty and C goes down before the holder's next renewal. A client built now finds no mark on A and B;
/// were it to take the group for a new one and mark them settled, their grants would count and it would hold
/// the lock beside the holder. Left unmarked, their grants mark them young and do not count.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_built_with_a_server_down_does_not_take_emptied_servers_for_a_new_group() {
    let mut fixture = Fixture::redlock().await;
    // Renewed every 10 s: not before the end of the test.
    let holder = fixture.client().lock("held").ttl(secs(30)).acquire().await.expect("acquire");
    let record = fixture.client().record_key("held");
    eventually(secs(5), "the record on all three servers", || async { servers_with(&fixture, &record).await == 3 })
        .await;
    fixture.redlock_server_mut(0).restart();
    fixture.redlock_server_mut(1).restart();
    fixture.redlock_server_mut(2).kill();
    assert_eq!(servers_with(&fixture, &record).await, 0, "the holder's record survived");

    let late = within(secs(10), "build with one of three down", fixture.other_client()).await;
    // Busy, or an error naming the young servers: either way not granted.
    let attempt = late.lock("held").try_acquire().await;
    assert!(
        !matches!(attempt, Ok(Some(_))),
        "a client built with a server down took the lock beside a valid holder: {attempt:?}"
    );
    assert!(!holder.is_lost());
}

/// A new group with one server down: nothing tells whether the silent server holds a mark, so the answering
/// ones are not marked settled; their first grants mark them young, and the first lock is granted a ttl later
/// (a wait longer than the ttl gets it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_group_with_a_server_down_grants_its_first_lock_a_ttl_late() {
    let mut servers = [RedisServer::new(), RedisServer::new(), RedisServer::new()];
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    servers[2].kill();
    let client = within(secs(10), "build", Client::builder().redlock(urls).build()).await.expect("build");
    let ttl = secs(1);
    let started = Instant::now();
    // Without a wait: refused, and the error says why.
    let error = client.lock("first").ttl(ttl).acquire().await.expect_err("young servers granted at once");
    let message = error.to_string();
    assert!(message.contains("a group first used by a client built while one of its servers was down"), "{message}");
    let guard = client.lock("first").ttl(ttl).wait(secs(10)).acquire().await.expect("granted within the wait");
    let took = started.elapsed();
    // The marks are dated by the servers' clock, from the first grant (after `started`).
    assert!(took >= ttl - ms(100), "granted after {took:?}, before the young servers' ttl ({ttl:?})");
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
}

/// The backend error with which a Redlock client on `urls` fails to build, with `what` wrong.
async fn build_error(urls: &[String], what: &str) -> BackendError {
    match within(secs(10), "build", Client::builder().redlock(urls.to_vec()).build()).await {
        Err(LockError::Backend(e)) => e,
        Err(other) => panic!("{what}: expected a backend error, got {other:?}"),
        Ok(_) => panic!("built with {what}"),
    }
}

/// A majority down fails the build, naming a silent server and saying how many answered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_down_at_build_fails_naming_a_silent_server() {
    let mut servers = [RedisServer::new(), RedisServer::new(), RedisServer::new()];
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    servers[0].kill();
    servers[1].kill();
    let error = build_error(&urls, "two of three servers down").await;
    assert_eq!(error.kind(), BackendErrorKind::Unreachable, "{error}");
    assert_eq!(error.server(), urls[0], "{error}");
    assert!(error.to_string().contains("1 of 3 Redlock servers answered"), "{error}");
}

/// A server that answers with an error is a configuration to fix, not a server down: one server of three
/// requires a password its URL does not give, and the build fails naming it, though a majority would answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_refuses_the_client_fails_the_build() {
    let servers = [RedisServer::new(), RedisServer::new(), RedisServer::with_password("s3cret-pass")];
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let error = build_error(&urls, "a server refusing the client").await;
    assert_eq!(error.kind(), BackendErrorKind::Refused, "{error}");
    assert_eq!(error.server(), urls[2], "{error}");
}

/// The names `client` lists, sorted and each once.
async fn listed(client: &Client) -> Result<Vec<String>, LockError> {
    let mut listing = client.list_locks("*");
    let mut names = Vec::new();
    while let Some(page) = listing.next_page().await? {
        names.extend(page);
    }
    names.sort();
    names.dedup();
    Ok(names)
}

/// With a server down, a listing passes over it, warning with its URL, and lists every lock a quorum holds from
/// the other two; `lock_infos` reads them from the same two. With two of three down, it fails naming a silent
/// server: a lock held by a quorum could then sit on the silent servers alone. (Before, one silent server failed
/// every listing, so `distlock ls` could show none of the group's locks while a server was down.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_listing_passes_over_a_minority_down_and_lists_every_held_lock() {
    let captured = logs::capture();
    let mut fixture = Fixture::redlock().await;
    let client = fixture.client().clone();
    // Renewed every second: a server restarted empty has the records back within a few.
    let _a = client.lock("listed:a").ttl(secs(3)).acquire().await.expect("lock a");
    let _b = client.lock("listed:b").ttl(secs(3)).acquire().await.expect("lock b");
    assert_eq!(listed(&client).await.expect("all three answer"), ["listed:a", "listed:b"]);

    for down in [0, 2] {
        fixture.redlock_server_mut(down).kill();
        let silent = fixture.redlock_servers().nth(down).expect("server").url();
        let names = within(secs(10), "a listing with one of three down", listed(&client)).await;
        assert_eq!(names.expect("two of three answer"), ["listed:a", "listed:b"], "server {down} down");
        let warned = captured.matching(Level::WARN, &["did not answer the listing", &silent]);
        assert!(!warned.is_empty(), "no warning names {silent}:\n{}", captured.dump());
        let infos = client.lock_infos(&["listed:a", "listed:b"]).await.expect("lock_infos from two of three");
        assert!(infos.iter().all(Option::is_some), "{infos:?}");
        fixture.redlock_server_mut(down).restart();
        eventually(secs(10), "the holders' records back on the restarted server", || async {
            let (a, b) = (client.record_key("listed:a"), client.record_key("listed:b"));
            servers_with(&fixture, &a).await == 3 && servers_with(&fixture, &b).await == 3
        })
        .await;
    }

    fixture.redlock_server_mut(0).kill();
    fixture.redlock_server_mut(1).kill();
    let failed = within(secs(10), "a listing with two of three down", listed(&client)).await;
    match failed {
        Err(LockError::Backend(e)) => assert!(e.server().contains("127.0.0.1"), "{e}"),
        other => panic!("a listing with two of three servers down gave {other:?}"),
    }
}
