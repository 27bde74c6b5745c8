//! Issue 13, metrics (feature `metrics`): every counter, histogram and gauge distlock records, with its
//! labels, through the facade's debugging recorder, on a private redis-server.
//!
//! The recorder is global, so this binary holds this one test.

use std::collections::{BTreeMap, BTreeSet};

use distlock::{LockError, ReleaseOutcome};
use distlock_tests::time::secs;
use distlock_tests::{eventually, within, Fixture};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use metrics_util::MetricKind;

/// A metric: its name and its labels, `name{label=value,..}`.
type Name = String;

/// The recorder's values, accumulated: its snapshots report what changed since the last one (counters and
/// gauges as deltas, histograms as the values recorded since).
struct Metrics {
    snapshotter: Snapshotter,
    counters: BTreeMap<Name, u64>,
    gauges: BTreeMap<Name, f64>,
    histograms: BTreeMap<Name, Vec<f64>>,
    /// Every label seen, as (label, value).
    labels: BTreeSet<(String, String)>,
}

impl Metrics {
    fn new(snapshotter: Snapshotter) -> Self {
        let labels = BTreeSet::new();
        Self { snapshotter, counters: BTreeMap::new(), gauges: BTreeMap::new(), histograms: BTreeMap::new(), labels }
    }

    fn update(&mut self) -> &mut Self {
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let (kind, key) = key.into_parts();
            let labels: Vec<String> = key.labels().map(|l| format!("{}={}", l.key(), l.value())).collect();
            self.labels.extend(key.labels().map(|l| (l.key().to_owned(), l.value().to_owned())));
            let name = if labels.is_empty() {
                key.name().to_owned()
            } else {
                format!("{}{{{}}}", key.name(), labels.join(","))
            };
            match (kind, value) {
                (MetricKind::Counter, DebugValue::Counter(n)) => *self.counters.entry(name).or_default() += n,
                (MetricKind::Gauge, DebugValue::Gauge(delta)) => *self.gauges.entry(name).or_default() += delta.0,
                (MetricKind::Histogram, DebugValue::Histogram(values)) => {
                    self.histograms.entry(name).or_default().extend(values.into_iter().map(|v| v.0));
                }
                (kind, value) => panic!("{name}: a {kind:?} with {value:?}"),
            }
        }
        self
    }

    fn counter(&mut self, name: &str) -> u64 {
        self.update().counters.get(name).copied().unwrap_or(0)
    }

    fn gauge(&mut self, name: &str) -> f64 {
        self.update().gauges.get(name).copied().unwrap_or(0.0)
    }

    fn histogram(&mut self, name: &str) -> Vec<f64> {
        self.update().histograms.get(name).cloned().unwrap_or_default()
    }
}

/// Acquires, renews, waits, is handed the lock, loses it, fails to obtain one and fails on a bad key; checks
/// each metric and its labels.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_is_recorded_with_bounded_labels() {
    distlock_tests::wall_clock::again_if_the_wall_clock_stepped(|| async {
        let recorder = DebuggingRecorder::new();
        let mut m = Metrics::new(recorder.snapshotter());
        recorder.install().expect("the only recorder of this binary");
        let fx = Fixture::redis().await;
        let client = fx.client().clone();
        m.update(); // whatever connecting recorded is not part of the scenario

        // Acquired, then renewed by the watchdog (every third of the 2 s ttl).
        let first = client.lock("m:job").ttl(secs(2)).acquire().await.expect("free");
        assert_eq!(m.counter("distlock_acquire_total{outcome=acquired}"), 1);
        assert_eq!(m.gauge("distlock_held"), 1.0);
        eventually(secs(10), "a renewal", || {
            let renewed = m.counter("distlock_renewals_total{result=renewed}");
            async move { renewed >= 1 }
        })
        .await;

        // A waiter: counted as waiting until the release hands it the lock.
        let waiter = tokio::spawn(client.lock("m:job").ttl(secs(2)).wait(secs(20)).acquire());
        eventually(secs(10), "the waiter waits", || {
            let waiting = m.gauge("distlock_waiting");
            async move { waiting == 1.0 }
        })
        .await;
        assert_eq!(first.release().await.expect("release"), ReleaseOutcome::Released);
        let second = within(secs(10), "the hand-over", waiter).await.expect("task").expect("handed the lock");
        assert_eq!(m.gauge("distlock_waiting"), 0.0);
        assert_eq!(m.gauge("distlock_held"), 1.0, "one released, one handed over");
        assert_eq!(m.counter("distlock_acquire_total{outcome=acquired}"), 2);

        // Lost: a forced unlock, found by the next renewal; counted once.
        assert!(client.force_unlock("m:job").await.expect("force unlock"));
        within(secs(10), "the loss is noticed", second.lost()).await;
        assert_eq!(m.counter("distlock_lost_total"), 1);
        // The renewal is counted just after it marks the guard lost, so this task may look in between (CI, once).
        eventually(secs(5), "the renewal counted lost", || {
            let lost = m.counter("distlock_renewals_total{result=lost}");
            async move { lost == 1 }
        })
        .await;
        assert_eq!(second.release().await.expect("release"), ReleaseOutcome::Expired);
        assert_eq!(m.counter("distlock_lost_total"), 1, "the release does not count the loss again");
        assert_eq!(m.gauge("distlock_held"), 0.0);

        // Not obtained, and an error (a key that cannot be a lock's).
        let third = client.lock("m:busy").acquire().await.expect("free");
        assert!(client.lock("m:busy").try_acquire().await.expect("one attempt").is_none());
        assert!(matches!(client.lock("").acquire().await, Err(LockError::InvalidKey { .. })));
        third.release().await.expect("release");
        assert_eq!(m.counter("distlock_acquire_total{outcome=acquired}"), 3);
        assert_eq!(m.counter("distlock_acquire_total{outcome=not_obtained}"), 1);
        assert_eq!(m.counter("distlock_acquire_total{outcome=error}"), 1);
        assert_eq!(m.counter("distlock_renewals_total{result=failed}"), 0);
        assert_eq!(m.gauge("distlock_held"), 0.0);

        // One wait per answered acquisition (3 granted, 1 refused); the handed-over one waited for the release.
        let waits = m.histogram("distlock_wait_seconds");
        assert_eq!(waits.len(), 4, "{waits:?}");
        assert!(waits.iter().all(|w| w.is_finite() && *w >= 0.0), "{waits:?}");
        // One hold per grant ended: the first, the handed-over one, the third.
        let holds = m.histogram("distlock_hold_seconds");
        assert_eq!(holds.len(), 3, "{holds:?}");
        let renewed_for = secs(2).as_secs_f64() / 3.0;
        assert!(holds.iter().any(|h| *h >= renewed_for * 0.9), "the first was held past a renewal: {holds:?}");

        // Store calls, by operation; every label value from a small fixed set, never a key.
        let ops: BTreeSet<&str> = m
            .histograms
            .iter()
            .filter_map(|(name, values)| {
                let op = name.strip_prefix("distlock_backend_call_seconds{op=")?.strip_suffix('}')?;
                assert!(values.iter().all(|v| v.is_finite() && *v >= 0.0), "{name}: {values:?}");
                Some(op)
            })
            .collect();
        for op in ["acquire", "renew_many", "release", "force_unlock", "watch_releases"] {
            assert!(ops.contains(op), "no {op} call timed: {ops:?}");
        }
        for (label, value) in &m.labels {
            let allowed: &[&str] = match label.as_str() {
                "outcome" => &["acquired", "not_obtained", "error"],
                "result" => &["renewed", "lost", "failed"],
                "op" => &[
                    "acquire",
                    "withdraw",
                    "renew",
                    "renew_many",
                    "release",
                    "remaining",
                    "info",
                    "force_unlock",
                    "watch_releases",
                ],
                other => panic!("an unexpected label {other}={value}"),
            };
            assert!(allowed.contains(&value.as_str()), "{label}={value}");
        }
        let names: BTreeSet<&str> = m
            .counters
            .keys()
            .chain(m.gauges.keys())
            .chain(m.histograms.keys())
            .map(|n| n.split('{').next().unwrap_or(n))
            .collect();
        let expected = [
            "distlock_acquire_total",
            "distlock_backend_call_seconds",
            "distlock_held",
            "distlock_hold_seconds",
            "distlock_lost_total",
            "distlock_renewals_total",
            "distlock_wait_seconds",
            "distlock_waiting",
        ];
        assert_eq!(names, expected.into_iter().collect(), "exactly the documented metrics");
    })
    .await
}
