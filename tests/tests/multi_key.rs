//! Multi-key locks (issue 12, part 2): `Client::lock_all` and the attribute's `keys` take several keys all or
//! nothing, in sorted order, and the guard renews, releases and loses them together. The transfer scenario
//! moves money both ways between two accounts, and around a ring of five, from many tasks at once with short
//! waits, and checks that nobody deadlocks, no account ever has two holders and no money appears or vanishes.
//! Each scenario runs on every backend (on the cluster, the accounts sit in different slots).

use std::sync::atomic::{AtomicI64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use distlock::{current_client, current_lock, distributed_lock, with_client, Client, LockError, ReleaseOutcome};
use distlock_tests::monitor::{is_client_command, monitor_args, Monitor};
use distlock_tests::time::{ms, secs};
use distlock_tests::{eventually, within, Fixture};
use tokio::time::Instant;

distlock_tests::all_backends_and_redlock!(
    transfers_never_deadlock_overlap_or_lose_money,
    a_busy_later_key_gives_back_the_keys_taken_before_it,
    a_wait_bounds_a_request_of_ten_thousand_keys,
    cancelling_while_waiting_for_a_later_key_gives_back_the_earlier_ones,
    losing_one_key_loses_the_whole_lock,
    renewal_and_release_cover_every_key,
    attribute_keys_take_every_rendered_key_and_merge_equal_ones,
);

/// The transfer scenarios load the machine (52 tasks each); the scenarios that check leases of a few hundred
/// milliseconds take this exclusively, so that no transfer run in this binary delays their renewals.
static LOAD: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// How long the transfer scenario runs: `DISTLOCK_TRANSFER_SECS`, default 10 (the issue's).
fn transfer_time() -> Duration {
    let secs = std::env::var("DISTLOCK_TRANSFER_SECS").ok().and_then(|s| s.parse().ok()).unwrap_or(10);
    Duration::from_secs(secs)
}

/// The lock key of an account.
fn account_key(account: &str) -> String {
    format!("account:{account}")
}

const START_BALANCE: i64 = 1_000;

/// Accounts whose balances live in this process and are guarded by nothing but the distributed lock: a
/// transfer reads both balances, pauses, then writes both, so two transfers touching one account at once
/// would lose an update. Every holder of an account is counted on the way in and out.
#[derive(Debug)]
struct Bank {
    names: Vec<String>,
    balances: Vec<AtomicI64>,
    /// Per account: the net of the transfers that reported success, added atomically after each one.
    expected: Vec<AtomicI64>,
    holders: Vec<AtomicUsize>,
    /// Times a transfer entered an account somebody else was inside.
    overlaps: AtomicUsize,
}

impl Bank {
    fn new(names: &[&str]) -> Arc<Self> {
        let atomics = |v: i64| names.iter().map(|_| AtomicI64::new(v)).collect();
        Arc::new(Bank {
            names: names.iter().map(|n| (*n).to_owned()).collect(),
            balances: atomics(START_BALANCE),
            expected: atomics(START_BALANCE),
            holders: names.iter().map(|_| AtomicUsize::new(0)).collect(),
            overlaps: AtomicUsize::new(0),
        })
    }

    fn index(&self, account: &str) -> usize {
        self.names.iter().position(|n| n == account).unwrap_or_else(|| panic!("no account {account}"))
    }

    /// The body of a transfer, run under the lock of both accounts.
    async fn move_money(&self, from: &str, to: &str, amount: i64) {
        let (f, t) = (self.index(from), self.index(to));
        for i in [f, t] {
            if self.holders[i].fetch_add(1, Ordering::SeqCst) != 0 {
                self.overlaps.fetch_add(1, Ordering::SeqCst);
            }
        }
        let (from_balance, to_balance) =
            (self.balances[f].load(Ordering::SeqCst), self.balances[t].load(Ordering::SeqCst));
        // The window in which an unguarded transfer would interleave with another. A lock lost here drops the
        // body before it writes anything.
        tokio::time::sleep(ms(1)).await;
        self.balances[f].store(from_balance - amount, Ordering::SeqCst);
        self.balances[t].store(to_balance + amount, Ordering::SeqCst);
        for i in [f, t] {
            self.holders[i].fetch_sub(1, Ordering::SeqCst);
        }
    }

    /// Records a transfer that reported success.
    fn settled(&self, from: &str, to: &str, amount: i64) {
        self.expected[self.index(from)].fetch_sub(amount, Ordering::SeqCst);
        self.expected[self.index(to)].fetch_add(amount, Ordering::SeqCst);
    }

    fn check(&self, what: &str) {
        assert_eq!(self.overlaps.load(Ordering::SeqCst), 0, "{what}: an account had two holders at once");
        let total: i64 = self.balances.iter().map(|b| b.load(Ordering::SeqCst)).sum();
        assert_eq!(total, START_BALANCE * self.names.len() as i64, "{what}: the total balance changed");
        for (i, name) in self.names.iter().enumerate() {
            let (balance, expected) =
                (self.balances[i].load(Ordering::SeqCst), self.expected[i].load(Ordering::SeqCst));
            assert_eq!(balance, expected, "{what}: account {name} lost an update");
        }
    }
}

/// The attribute's form of a transfer: the keys in the order the money goes, so two transfers in opposite
/// directions name them in opposite orders.
#[distributed_lock(keys = ["account:<from>", "account:<to>"], ttl = "5s", wait = "200ms")]
async fn transfer(bank: &Bank, from: &str, to: &str, amount: i64) -> Result<(), LockError> {
    bank.move_money(from, to, amount).await;
    Ok(())
}

/// One direction between two accounts of a bank, with what the tasks moving money along it saw.
#[derive(Debug)]
struct Route {
    bank: Arc<Bank>,
    from: String,
    to: String,
    done: AtomicUsize,
    busy: AtomicUsize,
}

/// One task: transfers along `route` until `until`, through the attribute or `lock_all`.
async fn transfer_loop(
    client: Client,
    route: Arc<Route>,
    through_attribute: bool,
    until: Instant,
    errors: Arc<AtomicUsize>,
) {
    let Route { bank, from, to, .. } = &*route;
    let mut amount = 1;
    while Instant::now() < until {
        amount = amount % 9 + 1;
        let outcome = if through_attribute {
            with_client(client.clone(), transfer(bank, from, to, amount)).await
        } else {
            client
                .lock_all([account_key(from), account_key(to)])
                .ttl(secs(5))
                .wait(ms(200))
                .run(bank.move_money(from, to, amount))
                .await
        };
        match outcome {
            Ok(()) => {
                bank.settled(from, to, amount);
                route.done.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) if e.is_busy() => {
                route.busy.fetch_add(1, Ordering::Relaxed);
            }
            // A shared two-core machine can make a call time out now and then; counted, bounded below.
            Err(e) if e.is_transient() => {
                eprintln!("transfer {from} -> {to}: {e}");
                errors.fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => panic!("transfer {from} -> {to}: {e}"),
        }
    }
}

/// 32 tasks move money both ways between two accounts, and 20 around a ring of five (each edge both ways),
/// for the transfer time with 200 ms waits: every task finishes in time (no deadlock), every direction of
/// every pair moves money (progress), no account ever has two holders, and no money is created or lost.
async fn transfers_never_deadlock_overlap_or_lose_money(fx: Fixture) {
    let _load = LOAD.read().await;
    let pair = ["pair-a", "pair-b"];
    let ring = ["ring-0", "ring-1", "ring-2", "ring-3", "ring-4"];
    if let Some(cluster) = fx.redis_cluster() {
        let records: Vec<String> = pair.iter().chain(&ring).map(|a| fx.client().record_key(&account_key(a))).collect();
        let (slots, primaries) = tokio::task::spawn_blocking(move || {
            let slots: Vec<u16> = records.iter().map(|r| cluster.slot(r)).collect();
            (slots, [cluster.primary_for(&records[0]), cluster.primary_for(&records[1])])
        })
        .await
        .expect("slots");
        let mut distinct = slots.clone();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), slots.len(), "every account in its own slot: {slots:?}");
        assert_ne!(primaries[0], primaries[1], "the pair's accounts on different primaries");
    }

    let duration = transfer_time();
    let until = Instant::now() + duration;
    let errors = Arc::new(AtomicUsize::new(0));
    let pair_bank = Bank::new(&pair);
    let ring_bank = Bank::new(&ring);
    // Both directions of the pair, then of each edge of the ring.
    let mut routes: Vec<Arc<Route>> = Vec::new();
    for (a, b) in [(pair[0], pair[1])].into_iter().chain((0..5).map(|i| (ring[i], ring[(i + 1) % 5]))) {
        let bank = if a.starts_with("pair") { &pair_bank } else { &ring_bank };
        for (from, to) in [(a, b), (b, a)] {
            let (from, to) = (from.to_owned(), to.to_owned());
            let (done, busy) = (AtomicUsize::new(0), AtomicUsize::new(0));
            routes.push(Arc::new(Route { bank: Arc::clone(bank), from, to, done, busy }));
        }
    }
    let mut tasks = Vec::new();
    // 16 tasks per direction of the pair (32); 2 per direction of each ring edge (20); every other one through
    // the attribute.
    for (index, route) in routes.iter().enumerate() {
        let count = if index < 2 { 16 } else { 2 };
        for n in 0..count {
            tasks.push(tokio::spawn(transfer_loop(
                fx.client().clone(),
                Arc::clone(route),
                n % 2 == 0,
                until,
                Arc::clone(&errors),
            )));
        }
    }

    assert_eq!(tasks.len(), 32 + 20);
    // A task's last transfer starts before `until` and waits at most 200 ms: far less than this bound.
    within(duration + secs(30), "every transfer task finished (a deadlock would hold them)", async {
        for task in tasks {
            task.await.expect("transfer task");
        }
    })
    .await;

    pair_bank.check("two accounts");
    ring_bank.check("ring of five");
    // Progress. Between two accounts every transfer wants the same first key, so whoever holds it finds the
    // second free: both directions move money. Around the ring a holder of one key may wait for its second
    // behind a holder of that one waiting for a third, so with 200 ms waits some edges are served far more
    // than others (nothing promises fairness across keys; Redlock none at all): each account must take part.
    let mut done = 0;
    let mut per_account: Vec<(String, usize)> = pair.iter().chain(&ring).map(|a| ((*a).to_owned(), 0)).collect();
    for route in &routes {
        let Route { from, to, .. } = &**route;
        let (ok, busy) = (route.done.load(Ordering::Relaxed), route.busy.load(Ordering::Relaxed));
        eprintln!("{:?} {from} -> {to}: {ok} transfers, {busy} busy", fx.backend());
        for (_, count) in per_account.iter_mut().filter(|(a, _)| a == from || a == to) {
            *count += ok;
        }
        done += ok;
    }
    for route in routes.iter().take(2) {
        let Route { from, to, .. } = &**route;
        assert!(route.done.load(Ordering::Relaxed) > 0, "no transfer from {from} to {to} in {duration:?}");
    }
    for (account, count) in &per_account {
        assert!(*count > 0, "no transfer touched {account} in {duration:?}");
    }
    let errors = errors.load(Ordering::Relaxed);
    assert!(errors * 20 <= done, "{errors} transient errors for {done} transfers");
    for account in pair.iter().chain(&ring) {
        let key = account_key(account);
        assert!(fx.client().lock_info(&key).await.expect("lock_info").is_none(), "{key} left held");
    }
}

/// Another owner holds "b": a request for ["b", "a"] takes "a" first (sorted order), waits for "b", and when
/// the wait runs out gives "a" back before failing with the busy key's error, whose wait is the whole request's.
async fn a_busy_later_key_gives_back_the_keys_taken_before_it(fx: Fixture) {
    let other = fx.client_with(|b| b.owner("other-owner")).await;
    let client = if fx.backend() == distlock_tests::Backend::Memory { other.clone() } else { fx.client().clone() };
    let holder = other.lock("busy:b").ttl(secs(30)).acquire().await.expect("holder");

    let started = Instant::now();
    let failed = client.lock_all(["busy:b", "busy:a"]).wait(ms(300)).acquire().await;
    match failed {
        Err(LockError::NotObtained { ref key, waited, ref holder, .. }) => {
            assert_eq!(key, "busy:b");
            assert!(waited >= ms(300) && waited <= started.elapsed(), "{waited:?}");
            assert_eq!(holder.as_ref().map(|h| h.owner.as_str()), Some("other-owner"));
        }
        ref other => panic!("expected NotObtained for busy:b, got {other:?}"),
    }
    assert!(client.lock_info("busy:a").await.expect("info").is_none(), "busy:a given back before the error");
    assert!(client.lock_all(["busy:a", "busy:b"]).try_acquire().await.expect("try").is_none());
    assert!(client.lock_info("busy:a").await.expect("info").is_none(), "and after a single attempt");

    assert_eq!(holder.release().await.expect("release"), ReleaseOutcome::Released);
    let guard = client.lock_all(["busy:b", "busy:a"]).acquire().await.expect("both free now");
    assert_eq!(guard.keys().collect::<Vec<_>>(), ["busy:a", "busy:b"]);
    guard.release().await.expect("release");
}

/// Issue 36, defect 8: `wait` bounds the whole request, whatever the number of keys. 10,000 keys, the last one
/// busy, `wait(200ms)`: each key taken one by one costs a round trip, so the request stops trying keys once
/// its wait has run out, gives back what it took, and fails within the wait plus the give-back (it took 2.35 s
/// on Redis before).
async fn a_wait_bounds_a_request_of_ten_thousand_keys(fx: Fixture) {
    let keys: Vec<String> = (0..10_000).map(|i| format!("many:{i:05}")).collect();
    let other = fx.client_with(|b| b.owner("other-owner")).await;
    let client = if fx.backend() == distlock_tests::Backend::Memory { other.clone() } else { fx.client().clone() };
    let holder = other.lock(keys[9_999].as_str()).ttl(secs(30)).acquire().await.expect("holder");
    let wait = ms(200);
    let started = Instant::now();
    let failed = client.lock_all(keys.iter().map(String::as_str)).wait(wait).acquire().await;
    let took = started.elapsed();
    assert!(matches!(failed, Err(LockError::NotObtained { .. })), "{failed:?}");
    assert!(took < wait + secs(1), "a 200 ms wait for 10,000 keys took {took:?}");
    assert!(client.lock_info(&keys[0]).await.expect("info").is_none(), "the first key was not given back");
    assert_eq!(holder.release().await.expect("release"), ReleaseOutcome::Released);
}

/// A request dropped while it waits for its second key gives the first back (in the background, at once).
async fn cancelling_while_waiting_for_a_later_key_gives_back_the_earlier_ones(fx: Fixture) {
    let other = fx.other_client().await;
    let holder = other.lock("cancel:b").ttl(secs(30)).acquire().await.expect("holder");
    let client = fx.client().clone();
    let waiter = tokio::spawn(async move { client.lock_all(["cancel:a", "cancel:b"]).wait(secs(60)).acquire().await });
    let client = fx.client();
    eventually(secs(10), "cancel:a taken", || async { client.lock_info("cancel:a").await.expect("info").is_some() })
        .await;
    waiter.abort();
    assert!(waiter.await.expect_err("aborted").is_cancelled());
    eventually(secs(10), "cancel:a given back", || async {
        client.lock_info("cancel:a").await.expect("info").is_none()
    })
    .await;
    assert_eq!(holder.release().await.expect("release"), ReleaseOutcome::Released);
}

/// The record of one key vanishes behind the guard's back: the guard notices at that key's next renewal and
/// is lost as a whole; its release frees the other key too. A lock body is dropped with `Lost` naming the key.
async fn losing_one_key_loses_the_whole_lock(fx: Fixture) {
    let _quiet = LOAD.write().await;
    let client = fx.client();
    let guard = client.lock_all(["lose:a", "lose:b"]).ttl(ms(600)).acquire().await.expect("acquire");
    assert!(!guard.is_lost());
    fx.vanish_record("lose:b").await;
    within(secs(10), "the loss of lose:b noticed", guard.lost()).await;
    assert!(guard.is_lost());
    assert!(guard.deadline() <= Instant::now());
    assert!(client.lock_info("lose:a").await.expect("info").is_some(), "lose:a is still this guard's grant");
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Expired, "lose:b was gone");
    assert!(client.lock_info("lose:a").await.expect("info").is_none(), "released with the guard");

    let ran_on = Arc::new(AtomicUsize::new(0));
    let body_ran = Arc::clone(&ran_on);
    let outcome = client
        .lock_all(["lose:d", "lose:c"])
        .ttl(ms(600))
        .run(async {
            body_ran.fetch_add(1, Ordering::SeqCst);
            fx.vanish_record("lose:d").await;
            std::future::pending::<()>().await;
        })
        .await;
    assert!(matches!(outcome, Err(LockError::Lost { ref key, .. }) if key == "lose:d"), "{outcome:?}");
    assert_eq!(ran_on.load(Ordering::SeqCst), 1);
    // `run` returns as soon as the loss is seen; the guard it drops releases in the background, at once.
    eventually(secs(10), "lose:c released after the body", || async {
        client.lock_info("lose:c").await.expect("info").is_none()
    })
    .await;
}

/// With a 300 ms ttl, three keys stay held for over a second (the watchdog renews each), every key's record
/// carries that key's fencing token, and one release frees them all for anyone.
async fn renewal_and_release_cover_every_key(fx: Fixture) {
    let _quiet = LOAD.write().await;
    let client = fx.client();
    let keys = ["renew:c", "renew:a", "renew:b"];
    let guard = client.lock_all(keys).ttl(ms(300)).acquire().await.expect("acquire");
    assert_eq!(guard.keys().collect::<Vec<_>>(), ["renew:a", "renew:b", "renew:c"]);
    assert_eq!(guard.key(), "renew:a");
    assert_eq!(Some(guard.fencing_token()), guard.fencing_token_of("renew:a"));
    for key in keys {
        let info = client.lock_info(key).await.expect("info").expect("held");
        assert_eq!(Some(info.fencing_token), guard.fencing_token_of(key), "{key}");
        assert_eq!(info.fencing_token > 0, fx.gives_fencing_tokens(), "{key}");
    }
    eventually(secs(20), "held for a second", || async {
        client.lock_info("renew:a").await.expect("info").is_some_and(|i| i.held_for >= secs(1))
    })
    .await;
    for key in keys {
        let info = client.lock_info(key).await.expect("info").unwrap_or_else(|| panic!("{key} renewed"));
        assert!(info.remaining_ttl <= ms(300), "{key}: {info:?}");
    }
    assert!(!guard.is_lost());
    let left = guard.remaining_ttl().await.expect("remaining").expect("held");
    assert!(left <= ms(300), "{left:?}");

    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Released);
    let other = fx.other_client().await;
    for key in keys {
        assert!(client.lock_info(key).await.expect("info").is_none(), "{key} released");
        let taken = other.lock(key).try_acquire().await.expect("try");
        taken.unwrap_or_else(|| panic!("{key} free for anyone")).release().await.expect("release");
    }
}

/// What the body of an attribute with `keys` sees: every rendered key held, each record with that key's
/// fencing token.
#[distributed_lock(keys = ["acct:<from>", "acct:<to>"], wait = "300ms")]
async fn attribute_transfer(from: &str, to: &str) -> Result<Vec<String>, LockError> {
    let lock = current_lock().expect("inside the lock body");
    let client = current_client()?;
    for key in lock.keys() {
        let info = client.lock_info(key).await?.unwrap_or_else(|| panic!("{key} held in the body"));
        assert_eq!(Some(info.fencing_token), lock.fencing_token_of(key), "{key}");
    }
    let _ = (from, to);
    Ok(lock.keys().map(str::to_owned).collect())
}

/// The attribute's `keys`: rendered, sorted, merged when two render alike, released on return; a busy key
/// fails the call before the body, leaving nothing held.
async fn attribute_keys_take_every_rendered_key_and_merge_equal_ones(fx: Fixture) {
    let client = fx.client().clone();
    let keys = with_client(client.clone(), attribute_transfer("y", "x")).await.expect("transfer");
    assert_eq!(keys, ["acct:x", "acct:y"]);
    let keys = with_client(client.clone(), attribute_transfer("y", "y")).await.expect("same account");
    assert_eq!(keys, ["acct:y"]);
    for key in ["acct:x", "acct:y"] {
        assert!(client.lock_info(key).await.expect("info").is_none(), "{key} released on return");
    }

    let other = fx.other_client().await;
    let holder = other.lock("acct:y").ttl(secs(30)).acquire().await.expect("holder");
    let busy = with_client(client.clone(), attribute_transfer("x", "y")).await;
    assert!(matches!(busy, Err(LockError::NotObtained { ref key, .. }) if key == "acct:y"), "{busy:?}");
    assert!(client.lock_info("acct:x").await.expect("info").is_none(), "acct:x given back");
    holder.release().await.expect("release");
}

/// The script calls (EVAL or EVALSHA) clients sent between two of the monitor's markers, as argument lists.
fn scripts_between(monitor: &Monitor, from: usize, to: usize) -> Vec<Vec<String>> {
    monitor.lines()[from + 1..to]
        .iter()
        .filter(|line| is_client_command(line))
        .map(|line| monitor_args(line))
        .filter(|args| {
            args.first().is_some_and(|c| c.eq_ignore_ascii_case("evalsha") || c.eq_ignore_ascii_case("eval"))
        })
        .collect()
}

/// On a cluster, free keys whose records hash to one slot are taken by one script call on that slot's primary,
/// as on one server (keys in different slots, the transfer test's, are taken one by one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_free_keys_of_one_slot_are_taken_in_one_call() {
    use redis::cluster_routing::Slot;
    let fx = Fixture::cluster().await;
    let cluster = fx.redis_cluster().expect("a cluster");
    let client = fx.client();
    let first = "slot:0".to_owned();
    let slot = Slot::for_key(client.record_key(&first));
    let second = (1..1_000_000)
        .map(|i| format!("slot:{i}"))
        .find(|key| Slot::for_key(client.record_key(key)) == slot)
        .expect("two keys of one slot");
    let records = [client.record_key(&first), client.record_key(&second)];
    let checked = records.clone();
    let (slots, port) = tokio::task::spawn_blocking(move || {
        (checked.iter().map(|r| cluster.slot(r)).collect::<Vec<_>>(), cluster.primary_for(&checked[0]))
    })
    .await
    .expect("slots");
    assert_eq!(slots[0], slots[1], "{records:?} share a slot");
    let node = cluster.node(port).expect("the slot's primary");
    let monitor = Monitor::start(node);
    let mut conn = node.connection().await;

    // Once first, so the node has cached the script (a first EVALSHA is answered NOSCRIPT, then sent as EVAL).
    client.lock_all([&first, &second]).acquire().await.expect("free keys").release().await.expect("release");
    let from = monitor.mark(&mut conn, "free").await;
    let guard = client.lock_all([&second, &first]).acquire().await.expect("free keys");
    let to = monitor.mark(&mut conn, "taken").await;
    // The cluster is shared by this binary's tests: only this test's calls count.
    let calls: Vec<_> = scripts_between(&monitor, from, to)
        .into_iter()
        .filter(|args| args.iter().any(|a| records.contains(a)))
        .collect();
    assert_eq!(calls.len(), 1, "one script call for two free keys of one slot: {calls:?}");
    assert_eq!(calls[0][2..5], ["2".to_owned(), records[0].clone(), records[1].clone()]);
    for key in [&first, &second] {
        let info = client.lock_info(key).await.expect("info").expect("held");
        assert_eq!(Some(info.fencing_token), guard.fencing_token_of(key), "{key}");
    }
    guard.release().await.expect("release");
    assert!(client.lock_info(&first).await.expect("info").is_none());
}

/// On one server, keys that are all free are taken by one script call (one round trip); when one is held
/// the call changes nothing and the request takes the keys one by one (here: the first, then the busy one,
/// then gives the first back), so a waiter is never jumped and nothing is left half-taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_one_server_free_keys_are_taken_in_one_call() {
    let fx = Fixture::redis().await;
    let monitor = Monitor::start(fx.server().expect("a server"));
    let mut conn = fx.redis_connection().expect("a connection");
    let records: Vec<String> = ["one:a", "one:b", "one:c"].iter().map(|k| fx.client().record_key(k)).collect();

    // Once first, so the server has cached the script: a first EVALSHA is answered NOSCRIPT and sent again as
    // EVAL, once per server.
    fx.client().lock_all(["warm:a", "warm:b"]).acquire().await.expect("free keys").release().await.expect("release");
    let from = monitor.mark(&mut conn, "free").await;
    let guard = fx.client().lock_all(["one:c", "one:a", "one:b"]).acquire().await.expect("free keys");
    let to = monitor.mark(&mut conn, "taken").await;
    let calls = scripts_between(&monitor, from, to);
    assert_eq!(calls.len(), 1, "one script call for three free keys: {calls:?}");
    assert_eq!(calls[0][2..6], ["3".to_owned(), records[0].clone(), records[1].clone(), records[2].clone()]);
    for key in ["one:a", "one:b", "one:c"] {
        let info = fx.client().lock_info(key).await.expect("info").expect("held");
        assert_eq!(Some(info.fencing_token), guard.fencing_token_of(key), "{key}");
    }
    guard.release().await.expect("release");

    let holder = fx.other_client().await.lock("one:b").acquire().await.expect("holder");
    let from = monitor.mark(&mut conn, "busy").await;
    let busy = fx.client().lock_all(["one:a", "one:b"]).try_acquire().await.expect("try");
    let to = monitor.mark(&mut conn, "given up").await;
    assert!(busy.is_none());
    let calls = scripts_between(&monitor, from, to);
    // The one-step call, ACQUIRE of one:a and of one:b (busy), and RELEASE of one:a: alone or in batches.
    assert!(calls.len() >= 2, "the one-step call, then one key at a time: {calls:?}");
    assert_eq!(calls[0][2], "2", "the first call tried both keys: {calls:?}");
    assert!(fx.client().lock_info("one:a").await.expect("info").is_none(), "nothing left half-taken");
    holder.release().await.expect("release");
}

/// The one call that takes several free keys at once hands out no guard when its reply comes after the leases
/// it granted ran out (the replies here come 300 ms after each send, past a 200 ms lease): the request gives
/// those grants back and fails within its wait; it never returns a guard that is lost from birth, and leaves no
/// key held. (Mutation report: `acquire_free`'s too-late test with `||` turned into `&&` handed one out.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reply_of_the_all_free_call_that_comes_too_late_hands_out_no_guard() {
    let server = distlock_tests::RedisServer::new();
    let proxy = distlock_tests::proxy::FaultProxy::to_port(server.port()).await;
    let client = Client::builder().redis(proxy.url()).response_timeout(secs(2)).build().await.expect("client");
    // Once at full speed, so the server has the scripts and the delayed call below is the one-step call itself.
    client.lock_all(["late:warm:a", "late:warm:b"]).acquire().await.expect("free").release().await.expect("release");
    proxy.set_fault(distlock_tests::proxy::Fault::Delay(ms(150)));
    let request = client.lock_all(["late:a", "late:b"]).ttl(ms(200)).wait(ms(800));
    let started = Instant::now();
    let outcome = request.acquire().await;
    match &outcome {
        Ok(guard) => panic!("a guard from late replies (lost: {}); every reply came past its lease", guard.is_lost()),
        Err(LockError::NotObtained { .. }) => {}
        Err(other) => panic!("expected NotObtained once the wait ran out, got {other:?}"),
    }
    assert!(started.elapsed() < secs(4), "the request took {:?} with a wait of 800 ms", started.elapsed());
    proxy.set_fault(distlock_tests::proxy::Fault::Pass);
    for key in ["late:a", "late:b"] {
        eventually(secs(2), &format!("`{key}` is free"), || async {
            client.lock_info(key).await.expect("info").is_none()
        })
        .await;
    }
}
