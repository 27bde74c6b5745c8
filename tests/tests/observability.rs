//! Issue 13, tracing: the `lock` span of a lock body (name, target, level, fields, its parent) and the events
//! distlock reports (a lock lost, a release that found the lock gone, a forced unlock, a waiter handed the
//! lock), captured with a subscriber of the test's own (`distlock_tests::logs`). No whole token is ever printed.
//!
//! No client is installed in this binary: the attribute's tests scope one with `with_client`, and a call
//! outside that scope is the `error` outcome. Tests run in parallel and share the captured log: each one
//! filters by its own keys.

use std::sync::{Arc, Mutex};

use distlock::{
    current_lock, distributed_lock, with_client, LockError, LossReason, OnLost, ReleaseOutcome, RetryStrategy,
};
use distlock_tests::logs::{self, Logs, SpanLine};
use distlock_tests::sys::Stopped;
use distlock_tests::time::{ms, secs};
use distlock_tests::{both_backends, eventually, within, Fixture};
use tracing::{Instrument, Level};

/// The lock spans of `key`, in creation order.
fn lock_spans(logs: &Logs, key: &str) -> Vec<SpanLine> {
    logs.spans().into_iter().filter(|s| s.name == "lock" && s.field("key") == Some(key)).collect()
}

/// No captured event or span field contains a whole `token`.
fn assert_never_printed(logs: &Logs, token: &str) {
    assert_eq!(token.len(), 32, "a whole token");
    for line in logs.lines() {
        assert!(!line.text.contains(token), "an event printed a whole token: {line}");
    }
    for span in logs.spans() {
        assert!(span.fields.values().all(|v| !v.contains(token)), "a span printed a whole token: {span:?}");
    }
}

/// The waited_ms field, which every granted or refused lock span records.
fn waited_ms(span: &SpanLine) -> u64 {
    let waited = span.field("waited_ms").unwrap_or_else(|| panic!("no waited_ms: {span:?}"));
    waited.parse().unwrap_or_else(|_| panic!("waited_ms {waited:?}"))
}

#[distributed_lock(key = "obs:<run>", ttl = "10s")]
async fn locked(run: &str) -> Result<(u64, String), LockError> {
    tracing::info!(run, "inside the body");
    let lock = current_lock().expect("inside a lock body");
    Ok((lock.fencing_token(), lock.token().expose_secret().to_owned()))
}

/// The attribute's span: `lock`, target `distlock`, DEBUG, with the key, the function's path, the fencing
/// token, the wait and the outcome; a child of the caller's span, and the parent of the body's events.
async fn attribute_span_is_a_child_of_the_callers_span(fx: Fixture) {
    let logs = logs::capture();
    let run = format!("attr-{:?}", fx.backend());
    let caller = tracing::info_span!("request", run = %run);
    let (fence, token) =
        with_client(fx.client().clone(), locked(&run)).instrument(caller.clone()).await.expect("the body ran");
    drop(caller);

    let spans = lock_spans(logs, &format!("obs:{run}"));
    let [span] = spans.as_slice() else { panic!("one lock span: {spans:?}\n{}", logs.dump()) };
    assert_eq!((span.target.as_str(), span.level), ("distlock", Level::DEBUG));
    assert_eq!(span.field("function"), Some(concat!(module_path!(), "::locked")));
    assert_eq!(span.field("fencing_token"), Some(fence.to_string().as_str()));
    assert!(waited_ms(span) < 10_000);
    assert_eq!(span.field("outcome"), Some("held"));
    assert!(span.closed, "the span ends with the call");

    let parent = &logs.spans()[span.parent.expect("the lock span has a parent")];
    assert_eq!((parent.name, parent.field("run")), ("request", Some(run.as_str())), "the caller's span");
    let inside = logs.lines().into_iter().find(|l| l.text.starts_with("inside the body") && l.fields["run"] == run);
    assert_eq!(inside.expect("the body's event").span, Some(span.index), "the body's event is in the lock span");
    assert_never_printed(logs, &token);
}

/// `acquire`'s span covers the acquisition alone: closed when it returns, while the guard lives on. A busy
/// lock is `not_obtained` after its wait, with no fencing token, for `acquire` and `run` alike.
async fn acquire_span_covers_the_acquisition(fx: Fixture) {
    let logs = logs::capture();
    let key = format!("obs:busy-{:?}", fx.backend());
    let client = fx.client();
    let holder = client.lock(&key).ttl(secs(10)).acquire().await.expect("free");

    let spans = lock_spans(logs, &key);
    let [granted] = spans.as_slice() else { panic!("one lock span: {spans:?}") };
    assert!(granted.closed, "closed once acquire returned, though the guard lives");
    assert_eq!(granted.field("outcome"), Some("held"));
    assert_eq!(granted.field("fencing_token"), Some(holder.fencing_token().to_string().as_str()));
    assert_eq!(granted.field("function"), None, "the programmatic API names no function");
    assert!(granted.parent.is_none(), "no span was current");

    let busy = client.lock(&key).wait(ms(100)).acquire().await;
    assert!(matches!(busy, Err(LockError::NotObtained { .. })), "{busy:?}");
    let ran = client.lock(&key).run(async { unreachable!("the body never runs without the lock") }).await;
    assert!(matches!(ran, Err(LockError::NotObtained { .. })), "{ran:?}");

    let spans = lock_spans(logs, &key);
    let [_, waited, ran] = spans.as_slice() else { panic!("three lock spans: {spans:?}") };
    for refused in [waited, ran] {
        assert_eq!(refused.field("outcome"), Some("not_obtained"), "{refused:?}");
        assert_eq!(refused.field("fencing_token"), None, "{refused:?}");
        assert!(refused.closed);
    }
    assert!(waited_ms(waited) >= 100, "waited its whole wait: {waited:?}");
    assert!(waited_ms(ran) < 10_000);
    assert_never_printed(logs, holder.token().expose_secret());
    assert_eq!(holder.release().await.expect("release"), ReleaseOutcome::Released);
}

/// A lock lost under its body: the span's outcome is `lost` (also when `OnLost::Continue` lets the body
/// finish), a WARN names the key and why, with the token redacted; the forced unlock is an INFO event inside
/// the body's span.
async fn a_lost_lock_is_a_lost_outcome_and_a_warning(fx: Fixture) {
    let logs = logs::capture();
    let client = fx.client().clone();
    for on_lost in [OnLost::Abort, OnLost::Continue] {
        let key = format!("obs:lost-{on_lost:?}-{:?}", fx.backend());
        let token = Arc::new(Mutex::new(String::new()));
        let (c, k, t) = (client.clone(), key.clone(), Arc::clone(&token));
        let body = async move {
            let lock = current_lock().expect("inside a lock body");
            *t.lock().unwrap() = lock.token().expose_secret().to_owned();
            assert!(c.force_unlock(&k).await.expect("force unlock"));
            // The renewal after this (within a third of the ttl) finds the lock gone.
            lock.lost().await;
        };
        let outcome =
            within(secs(10), "the loss is noticed", client.lock(&key).ttl(ms(900)).on_lost(on_lost).run(body));
        match on_lost {
            OnLost::Abort => {
                let lost = outcome.await.unwrap_err();
                assert!(matches!(lost, LockError::Lost { reason: LossReason::Refused, .. }), "{lost:?}");
                assert!(lost.to_string().contains("a renewal was refused"), "{lost}");
            }
            _ => outcome.await.expect("OnLost::Continue returns the body's output"),
        }

        let spans = lock_spans(logs, &key);
        let [span] = spans.as_slice() else { panic!("one lock span: {spans:?}") };
        assert_eq!(span.field("outcome"), Some("lost"), "{on_lost:?}");
        assert!(span.field("fencing_token").is_some());
        let token = token.lock().unwrap().clone();
        let lines = logs.lines();
        let key_of = |l: &&logs::LogLine| l.fields.get("key").map(String::as_str) == Some(key.as_str());

        let lost: Vec<_> = lines.iter().filter(key_of).filter(|l| l.text.starts_with("distlock: lock lost")).collect();
        let [lost] = lost.as_slice() else { panic!("one loss warning: {lost:?}\n{}", logs.dump()) };
        assert_eq!(lost.level, Level::WARN);
        // The reason once, in its field (issue 34: the message repeated it).
        assert_eq!(lost.fields["why"], LossReason::Refused.to_string());
        assert_eq!(lost.text.matches("refused").count(), 1, "the reason printed once: {lost}");
        assert_eq!(lost.fields["token"], format!("{}…", &token[..8]), "redacted");

        let forced: Vec<_> = lines.iter().filter(key_of).filter(|l| l.text.contains("force unlock")).collect();
        let [forced] = forced.as_slice() else { panic!("one force-unlock event: {forced:?}") };
        assert_eq!((forced.level, forced.fields["deleted"].as_str()), (Level::INFO, "true"));
        assert_eq!(forced.span, Some(span.index), "called inside the body, so inside its span");
        assert_never_printed(logs, &token);
    }
}

/// Releasing a guard whose lock is no longer held returns `Expired` and warns.
async fn releasing_a_lock_no_longer_held_warns(fx: Fixture) {
    let logs = logs::capture();
    let key = format!("obs:expired-{:?}", fx.backend());
    let guard = fx.client().lock(&key).ttl(secs(30)).acquire().await.expect("free");
    assert!(fx.client().force_unlock(&key).await.expect("force unlock"));
    assert_eq!(guard.release().await.expect("release"), ReleaseOutcome::Expired);
    let warnings: Vec<_> = logs
        .matching(Level::WARN, &["no longer held"])
        .into_iter()
        .filter(|l| l.fields.get("key") == Some(&key))
        .collect();
    let [warning] = warnings.as_slice() else { panic!("one warning: {warnings:?}\n{}", logs.dump()) };
    assert_eq!(warning.fields["outcome"], "Expired");
}

/// A release hands the lock to the queued waiter: a DEBUG event in the waiter's span, with its fencing token.
/// The waiter refreshes its place only seconds later, so it learns of the hand-over from the release (had a
/// refresh of its own reached the store right after the release, that attempt would be its grant, with no
/// hand-over event: the store's reply does not say whether a grant was handed over).
async fn a_waiter_handed_the_lock_is_a_debug_event(fx: Fixture) {
    let logs = logs::capture();
    let key = format!("obs:handed-{:?}", fx.backend());
    let client = fx.client().clone();
    let holder = client.lock(&key).ttl(secs(10)).acquire().await.expect("free");
    let seldom = RetryStrategy::Linear { step: secs(20) };
    let waiter = tokio::spawn(client.lock(&key).ttl(secs(10)).wait(secs(20)).retry(seldom).acquire());
    eventually(secs(10), "the waiter queues", || async {
        client.lock_info(&key).await.expect("info").is_some_and(|info| info.waiting >= 1)
    })
    .await;
    holder.release().await.expect("release");
    let guard = within(secs(10), "the hand-over", waiter).await.expect("task").expect("handed the lock");

    let spans = lock_spans(logs, &key);
    let [_, waited] = spans.as_slice() else { panic!("two lock spans: {spans:?}") };
    assert_eq!(waited.field("outcome"), Some("held"));
    let handed: Vec<_> = logs
        .matching(Level::DEBUG, &["a waiter was handed the lock"])
        .into_iter()
        .filter(|l| l.fields.get("key") == Some(&key))
        .collect();
    let [handed] = handed.as_slice() else { panic!("one hand-over event: {handed:?}\n{}", logs.dump()) };
    assert_eq!(handed.fields["fencing_token"], guard.fencing_token().to_string());
    assert!(["announced", "claimed"].contains(&handed.fields["how"].as_str()), "{handed:?}");
    assert_eq!(handed.span, Some(waited.index), "in the waiter's span");
    assert_never_printed(logs, guard.token().expose_secret());
}

/// The events of `key` whose text starts with `message`.
fn events_of(logs: &Logs, key: &str, message: &str) -> Vec<logs::LogLine> {
    logs.lines()
        .into_iter()
        .filter(|l| l.text.starts_with(message) && l.fields.get("key").map(String::as_str) == Some(key))
        .collect()
}

/// Issue 34: a grant and a release are DEBUG events (target `distlock`) in the lock's span, with the key, the
/// owner, the fencing token, the wait and the hold; a release left to `min_hold` says for how long.
async fn grant_and_release_are_debug_events(fx: Fixture) {
    let logs = logs::capture();
    let client = fx.client_with(|b| b.owner("obs-owner")).await;
    let key = format!("obs:cycle-{:?}", fx.backend());
    let fence = client.lock(&key).ttl(secs(10)).run(async { current_lock().expect("held").fencing_token() }).await;
    let fence = fence.expect("the body ran").to_string();
    let spans = lock_spans(logs, &key);
    let [span] = spans.as_slice() else { panic!("one lock span: {spans:?}") };
    for message in ["lock granted", "lock released"] {
        let lines = events_of(logs, &key, message);
        let [line] = lines.as_slice() else { panic!("one {message:?}: {lines:?}\n{}", logs.dump()) };
        assert_eq!((line.level, line.target.as_str()), (Level::DEBUG, "distlock"), "{line}");
        assert_eq!(line.fields["owner"], "obs-owner", "{line}");
        assert_eq!(line.fields["fencing_token"], fence, "{line}");
        assert_eq!(line.span, Some(span.index), "in the lock span: {line}");
    }
    let granted = &events_of(logs, &key, "lock granted")[0];
    assert!(granted.fields["waited_ms"].parse::<u64>().expect("ms") < 10_000, "{granted}");
    let released = &events_of(logs, &key, "lock released")[0];
    assert!(released.fields["held_ms"].parse::<u64>().expect("ms") < 10_000, "{released}");
    assert_eq!(released.fields["outcome"], "Released");
    assert!(!released.fields.contains_key("kept_by_min_hold_ms"), "{released}");

    let kept = format!("obs:kept-{:?}", fx.backend());
    let guard = client.lock(&kept).ttl(secs(10)).min_hold(secs(5)).acquire().await.expect("free");
    let token = guard.token().expose_secret().to_owned();
    guard.release().await.expect("release");
    let lines = events_of(logs, &kept, "lock released");
    let [released] = lines.as_slice() else { panic!("one release: {lines:?}") };
    let kept_ms: u64 = released.fields["kept_by_min_hold_ms"].parse().expect("ms");
    assert!((4_000..=5_000).contains(&kept_ms), "{released}");
    assert_eq!(released.span, None, "acquire's span ended with the acquisition");
    assert_never_printed(logs, &token);
}

/// The WARN of a lost lock, with its reason in `why`, and the `Lost` error's reason.
fn assert_lost_with(logs: &Logs, key: &str, error: &LockError, reason: LossReason) {
    assert!(matches!(error, LockError::Lost { reason: r, .. } if *r == reason), "{error:?}, expected {reason:?}");
    assert!(error.to_string().contains(&reason.to_string()), "{error}");
    let lines = events_of(logs, key, "distlock: lock lost");
    let [warning] = lines.as_slice() else { panic!("one loss warning: {lines:?}\n{}", logs.dump()) };
    assert_eq!((warning.level, warning.fields["why"].as_str()), (Level::WARN, reason.to_string().as_str()));
}

/// Issue 34: `Lost` says why, and so does the WARN: `max_hold` reached, and a shutdown's grace ended.
async fn a_lost_lock_says_why(fx: Fixture) {
    let logs = logs::capture();
    let key = format!("obs:max-hold-{:?}", fx.backend());
    let capped = fx.client().lock(&key).ttl(ms(300)).max_hold(ms(100)).run(tokio::time::sleep(secs(30)));
    let error = within(secs(10), "max_hold ends it", capped).await.unwrap_err();
    assert_lost_with(logs, &key, &error, LossReason::MaxHold);

    let key = format!("obs:shutdown-{:?}", fx.backend());
    let client = fx.client_with(|b| b).await;
    // Shut down once the body runs (the record shows a moment before the acquisition returns, and a grant
    // that returns into a shutdown is given back as `ShuttingDown`).
    let (running, started) = tokio::sync::oneshot::channel();
    let body = async move {
        let _ = running.send(());
        std::future::pending::<()>().await
    };
    let body = tokio::spawn(client.lock(&key).ttl(secs(10)).run(body));
    within(secs(10), "the body runs", started).await.expect("the body started");
    client.shutdown(ms(100)).await;
    let error = within(secs(10), "the body ends", body).await.expect("task").unwrap_err();
    assert_lost_with(logs, &key, &error, LossReason::ShutDown);
}

both_backends!(
    grant_and_release_are_debug_events,
    a_lost_lock_says_why,
    attribute_span_is_a_child_of_the_callers_span,
    acquire_span_covers_the_acquisition,
    a_lost_lock_is_a_lost_outcome_and_a_warning,
    releasing_a_lock_no_longer_held_warns,
    a_waiter_handed_the_lock_is_a_debug_event,
);

/// `force_unlock` warns when the lock's key held a value distlock did not write (another program's, deleted),
/// and only then: not when it frees a lock. Redis only (the in-process store has no foreign values).
#[tokio::test]
async fn force_unlock_warns_of_a_foreign_value_not_of_a_lock() {
    let logs = logs::capture();
    let fx = Fixture::redis().await;
    let client = fx.client();
    let (foreign, held) = ("obs:foreign-value", "obs:forced-lock");
    let mut conn = fx.redis_connection().expect("a Redis fixture");
    let _: () = redis::cmd("SET")
        .arg(client.record_key(foreign))
        .arg("written by another program")
        .query_async(&mut conn)
        .await
        .expect("SET");
    assert!(client.force_unlock(foreign).await.expect("force_unlock of the foreign value"));
    let _guard = client.lock(held).ttl(secs(30)).acquire().await.expect("free");
    assert!(client.force_unlock(held).await.expect("force_unlock of the lock"));
    let warned = |key: &str| {
        let lines = logs.matching(Level::WARN, &["did not write"]);
        lines.into_iter().filter(|l| l.fields.get("key").map(String::as_str) == Some(key)).count()
    };
    assert_eq!((warned(foreign), warned(held)), (1, 0), "{}", logs.dump());
}

/// Without a client the attribute's span still says what happened: `error`, with the function's path.
#[tokio::test]
async fn an_unconfigured_attribute_is_an_error_outcome() {
    let logs = logs::capture();
    let outcome = locked("unconfigured").await;
    assert!(matches!(outcome, Err(LockError::NotConfigured)), "{outcome:?}");
    let spans = lock_spans(logs, "obs:unconfigured");
    let [span] = spans.as_slice() else { panic!("one lock span: {spans:?}") };
    assert_eq!(span.field("outcome"), Some("error"));
    assert_eq!(span.field("function"), Some(concat!(module_path!(), "::locked")));
    assert_eq!((span.field("fencing_token"), span.field("waited_ms")), (None, None));
}

/// Issue 34: a lock whose server stopped answering (SIGSTOP) is lost for want of a renewal answered in time,
/// and says so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lock_nobody_renews_in_time_says_so() {
    let logs = logs::capture();
    let fx = Fixture::redis().await;
    let client = fx.client_with(|b| b.response_timeout(ms(200))).await;
    let key = "obs:unanswered";
    let body = async {
        let stopped = Stopped::stop(fx.server().and_then(|s| s.pid()).expect("running"));
        current_lock().expect("held").lost().await;
        stopped
    };
    let error = within(secs(10), "the loss", client.lock(key).ttl(ms(600)).run(body)).await.unwrap_err();
    assert_lost_with(logs, key, &error, LossReason::NotRenewedInTime);
}
