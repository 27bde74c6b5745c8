//! Ownership and the end of a lock's life, on both backends: reentrancy is scoped to the lock body, a lost
//! lock cancels the body (or not, with `OnLost::Continue`), and panic or cancellation release promptly.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use distlock::{LockError, OnLost, ReleaseOutcome};
use distlock_tests::time::{ms, secs};
use distlock_tests::{busy_for_outsiders, within, Fixture};
use tokio::sync::oneshot;

distlock_tests::all_backends_and_redlock!(
    reentrant_request_inside_body_shares_the_hold,
    spawned_tasks_and_siblings_are_not_owners,
    lost_lock_cancels_body,
    lost_lock_with_on_lost_continue_lets_body_finish,
    guard_reports_loss,
    panic_in_body_releases_promptly,
    cancelled_run_releases_promptly,
);

/// Sets its flag when dropped: tells whether a lock body was dropped (cancelled) or ran to the end.
struct SetOnDrop(Arc<AtomicBool>);

impl Drop for SetOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

/// Inside `run`'s body, a request for the same key succeeds at once with the same fencing token, and
/// giving it back does not release the outer hold.
async fn reentrant_request_inside_body_shares_the_hold(fx: Fixture) {
    const KEY: &str = "reentrant";
    let client = fx.client().clone();
    let observer = fx.other_client().await;

    let outer_token = client
        .lock(KEY)
        .ttl(secs(10))
        .run(async {
            let outer = client.lock_info(KEY).await.unwrap().expect("held").fencing_token;

            // Nested run (wait 0: it must not need to wait at all).
            let start = Instant::now();
            let inner = within(
                secs(5),
                "nested run",
                client.lock(KEY).run(async {
                    // Two levels deep.
                    let deeper = client
                        .lock(KEY)
                        .run(async { client.lock_info(KEY).await.unwrap().expect("held").fencing_token })
                        .await
                        .expect("doubly nested run");
                    (client.lock_info(KEY).await.unwrap().expect("held").fencing_token, deeper)
                }),
            )
            .await
            .expect("nested run on the key the body holds");
            assert!(start.elapsed() < secs(1), "nested run took {:?}", start.elapsed());
            assert_eq!(inner, (outer, outer), "nested runs see the outer grant");
            assert_eq!(observer.lock_info(KEY).await.unwrap().expect("held").fencing_token, outer);
            assert!(busy_for_outsiders(&observer, KEY).await, "the nested run released the outer hold");

            // Nested acquire: a guard with the outer grant's fencing token and deadline; its own ttl and
            // metadata do not apply, and releasing it sends nothing and says so.
            let before = observer.lock_info(KEY).await.unwrap().expect("held");
            let guard = client.lock(KEY).ttl(secs(100)).metadata("nested").acquire().await.expect("nested acquire");
            assert_eq!(guard.fencing_token(), outer);
            assert_eq!(guard.key(), KEY);
            assert_eq!(guard.deadline(), distlock::current_lock().expect("outer").deadline());
            assert!(guard.deadline() <= tokio::time::Instant::now() + secs(10), "the nested ttl applied");
            assert_eq!(guard.release().await.expect("nested release"), ReleaseOutcome::Nested);
            let info = observer.lock_info(KEY).await.unwrap().expect("still held after the nested release");
            assert_eq!(info.fencing_token, outer);
            assert_eq!(info.metadata, before.metadata, "the nested metadata applied");
            assert!(info.remaining_ttl <= secs(10), "the nested ttl applied: {:?}", info.remaining_ttl);
            assert!(busy_for_outsiders(&observer, KEY).await, "the nested release freed the outer hold");
            outer
        })
        .await
        .expect("outer run");

    let after = observer.lock(KEY).try_acquire().await.expect("try_acquire").expect("free once the outer run returned");
    if fx.gives_fencing_tokens() {
        assert!(after.fencing_token() > outer_token);
    }
}

/// Ownership belongs to the body future: a task spawned from the body, and a sibling future joined with
/// the `run` future in the same task, must wait like anyone else.
async fn spawned_tasks_and_siblings_are_not_owners(fx: Fixture) {
    const KEY: &str = "owners";
    let client = fx.client().clone();

    client
        .lock(KEY)
        .ttl(secs(10))
        .run(async {
            let c = client.clone();
            let spawned = tokio::spawn(async move { c.lock(KEY).acquire().await.map(|g| g.fencing_token()) })
                .await
                .expect("spawned task");
            assert!(
                matches!(spawned, Err(LockError::NotObtained { .. })),
                "a task spawned from the body got the lock: {spawned:?}"
            );
        })
        .await
        .expect("run");

    // join!: the sibling runs in the same task as the run future, but is not inside its body.
    let (started_tx, started_rx) = oneshot::channel::<()>();
    let (done_tx, done_rx) = oneshot::channel::<()>();
    let holder = client.lock(KEY).ttl(secs(10)).run(async move {
        let _ = started_tx.send(());
        let _ = done_rx.await;
    });
    let sibling = async {
        started_rx.await.expect("the holder's body started");
        let attempt = client.lock(KEY).acquire().await.map(|g| g.fencing_token());
        let _ = done_tx.send(());
        attempt
    };
    let (held, attempt) = within(secs(10), "join!", async { tokio::join!(holder, sibling) }).await;
    held.expect("holder run");
    assert!(
        matches!(attempt, Err(LockError::NotObtained { .. })),
        "a sibling future in join! got the lock: {attempt:?}"
    );

    // select!: same, and the losing run future is then dropped (and releases).
    let (started_tx, started_rx) = oneshot::channel::<()>();
    let attempt = tokio::select! {
        biased;
        _ = client.lock(KEY).ttl(secs(10)).run(async move {
            let _ = started_tx.send(());
            std::future::pending::<()>().await;
        }) => panic!("the holder's body never ends"),
        attempt = async {
            started_rx.await.expect("the holder's body started");
            client.lock(KEY).acquire().await.map(|g| g.fencing_token())
        } => attempt,
    };
    assert!(
        matches!(attempt, Err(LockError::NotObtained { .. })),
        "a sibling future in select! got the lock: {attempt:?}"
    );
}

/// The record disappears while `run`'s body works under a 1 s lease: the watchdog notices, the body is
/// dropped, and `run` returns `Err(Lost)`.
async fn lost_lock_cancels_body(fx: Fixture) {
    const KEY: &str = "lost";
    let dropped = Arc::new(AtomicBool::new(false));
    let finished = Arc::new(AtomicBool::new(false));
    let (started_tx, started_rx) = oneshot::channel();
    let run = fx.client().lock(KEY).ttl(secs(1)).run({
        let (dropped, finished) = (dropped.clone(), finished.clone());
        async move {
            let _flag = SetOnDrop(dropped);
            let _ = started_tx.send(());
            tokio::time::sleep(secs(30)).await;
            finished.store(true, Ordering::SeqCst);
        }
    });
    let handle = tokio::spawn(run);
    within(secs(5), "the body starts", started_rx).await.expect("started");

    fx.vanish_record(KEY).await;
    let vanished_at = Instant::now();
    let result = within(secs(10), "run notices the loss", handle).await.expect("run task");
    let noticed = vanished_at.elapsed();

    match result {
        Err(LockError::Lost { key, .. }) => assert_eq!(key, KEY),
        other => panic!("expected Err(Lost), got {other:?}"),
    }
    assert!(dropped.load(Ordering::SeqCst), "the body was not dropped");
    assert!(!finished.load(Ordering::SeqCst), "the body ran on without the lock");
    assert!(noticed < secs(3), "loss noticed only after {noticed:?} (ttl 1 s)");
}

/// With `OnLost::Continue`, losing the lock does not cancel the body: it runs to its end.
async fn lost_lock_with_on_lost_continue_lets_body_finish(fx: Fixture) {
    const KEY: &str = "lost-continue";
    let finished = Arc::new(AtomicBool::new(false));
    let (started_tx, started_rx) = oneshot::channel();
    let run = fx.client().lock(KEY).ttl(secs(1)).on_lost(OnLost::Continue).run({
        let finished = finished.clone();
        async move {
            let _ = started_tx.send(());
            // Work for two leases: the watchdog notices the loss (at ~ttl/3) long before this ends.
            tokio::time::sleep(secs(2)).await;
            finished.store(true, Ordering::SeqCst);
            7
        }
    });
    let handle = tokio::spawn(run);
    within(secs(5), "the body starts", started_rx).await.expect("started");
    fx.vanish_record(KEY).await;

    let result = within(secs(10), "run ends", handle).await.expect("run task");
    assert!(finished.load(Ordering::SeqCst), "OnLost::Continue cancelled the body");
    match result {
        Ok(7) => {}
        other => panic!("OnLost::Continue returns the body's output; got {other:?}"),
    }
}

/// A held guard whose record vanishes reports the loss: `lost()` resolves and `is_lost()` turns true.
async fn guard_reports_loss(fx: Fixture) {
    const KEY: &str = "guard-lost";
    let guard = fx.client().lock(KEY).ttl(secs(1)).acquire().await.expect("acquire");
    assert!(!guard.is_lost());
    fx.vanish_record(KEY).await;
    within(secs(5), "guard.lost()", guard.lost()).await;
    assert!(guard.is_lost());
    let outcome = guard.release().await.expect("release");
    assert!(!matches!(outcome, ReleaseOutcome::Released), "released a lost lock: {outcome:?}");
}

/// A panic inside `run`'s body releases the lock promptly, not at the end of its 30 s lease.
async fn panic_in_body_releases_promptly(fx: Fixture) {
    const KEY: &str = "panics";
    let client = fx.client().clone();
    let task = tokio::spawn(async move {
        client
            .lock(KEY)
            .ttl(secs(30))
            .run(async {
                if KEY.len() < 100 {
                    panic!("deliberate panic inside the lock body");
                }
            })
            .await
    });
    let err = within(secs(10), "the panicking task", task).await.expect_err("the body panicked");
    assert!(err.is_panic());

    let start = Instant::now();
    let other = fx.other_client().await;
    let _guard = other.lock(KEY).wait(secs(15)).acquire().await.expect("free after the panic");
    assert!(start.elapsed() < secs(2), "freed only after {:?}", start.elapsed());
}

/// Cancelling `run` (a timeout around it, or aborting its task) releases promptly.
async fn cancelled_run_releases_promptly(fx: Fixture) {
    const KEY: &str = "cancelled";
    let client = fx.client().clone();
    let other = fx.other_client().await;

    // A timeout drops the run future.
    let timed_out =
        tokio::time::timeout(ms(300), client.lock(KEY).ttl(secs(30)).run(tokio::time::sleep(secs(60)))).await;
    assert!(timed_out.is_err(), "the body cannot finish in 300 ms");
    let start = Instant::now();
    let guard = other.lock(KEY).wait(secs(15)).acquire().await.expect("free after the timeout");
    assert!(start.elapsed() < secs(2), "freed only after {:?}", start.elapsed());
    guard.release().await.expect("release");

    // Aborting the task that runs it, once the body is running.
    let (started_tx, started_rx) = oneshot::channel();
    let task = tokio::spawn({
        let client = client.clone();
        async move {
            client
                .lock(KEY)
                .ttl(secs(30))
                .run(async move {
                    let _ = started_tx.send(());
                    std::future::pending::<()>().await;
                })
                .await
        }
    });
    within(secs(5), "the body starts", started_rx).await.expect("started");
    task.abort();
    assert!(task.await.expect_err("aborted").is_cancelled());
    let start = Instant::now();
    let _guard = other.lock(KEY).wait(secs(15)).acquire().await.expect("free after the abort");
    assert!(start.elapsed() < secs(2), "freed only after {:?}", start.elapsed());
}
