//! How many script calls the coalescer keeps outstanding: a window that follows the round trip, in the
//! manner of TCP Vegas.
//!
//! Once per round (a window's worth of calls back), the shortest round trip of the round is compared with the
//! shortest one seen lately (`base`: the network plus Redis's time for a call that waited for nothing); the
//! difference is a standing queue — in Redis, or for the client's CPU — that even the luckiest call of the
//! round waited in (CoDel's test: a burst or a stall of the client delays some calls of a round, a standing
//! queue delays all). While it stays under [`QUEUEING_LOW`] of the base, the round trip is the network's:
//! more calls in flight save queued operations their wait for a slot and cost Redis nothing it cannot
//! absorb, so the window grows (by a quarter while far under, else by one call). Beyond [`QUEUEING_HIGH`],
//! Redis is the bottleneck, and fewer, larger calls cost it less per operation: the window shrinks (by one
//! call, or by a quarter while far over), down to [`MIN`]. (Vegas's own rule, on every call's round trip and
//! counting queued calls, held the window at about 7 calls a 1 ms hop away on a loaded machine: that count
//! grows with jitter alone.)
//!
//! On loopback a call's round trip is mostly Redis's time, so the window stays near [`MIN`]..[`INITIAL`] and
//! operations share calls; a network hop away it opens, so that no operation waits a round trip for a slot
//! (there, the operations issued in one tick of the runtime share a call instead, see the coalescer).

use std::time::Duration;

use tokio::time::Instant;

/// Calls in flight at least: with one, Redis idles while the reply travels back (measured on loopback).
pub(super) const MIN: usize = 2;
/// The window before any call has come back: what measured best on loopback with 64 tasks.
pub(super) const INITIAL: usize = 3;
/// Calls in flight at most, whatever the round trip.
pub(super) const MAX: usize = 256;
/// Below this much queueing, as a fraction of the base round trip, the window grows.
const QUEUEING_LOW: f64 = 0.25;
/// Above this much, it shrinks.
const QUEUEING_HIGH: f64 = 0.5;
/// How often, in shortest round trips, the window drops to [`MIN`] for a few round trips to measure the
/// shortest round trip afresh (as BBR's ProbeRTT does): a queue that never drains would otherwise pass for
/// the network, and a network that became slower would pass for a queue. It costs 1–2% of throughput.
const PROBE_EVERY: u32 = 200;

#[derive(Debug)]
pub(super) struct Window {
    size: f64,
    /// Shortest round trip since the last probe began, and in the period before: `base` is the smaller.
    shortest_now: Option<Duration>,
    shortest_before: Option<Duration>,
    next_probe: Option<Instant>,
    probe: Option<Probe>,
    round: Round,
}

/// The calls of the current round.
#[derive(Debug, Default)]
struct Round {
    /// Calls still to come back before the round ends.
    left: usize,
    shortest: Option<Duration>,
    /// Whether the window held anything back during the round.
    bound: bool,
}

/// A probe in progress: the window is [`MIN`] until calls sent with the queue drained have come back.
#[derive(Debug)]
struct Probe {
    /// The window to go back to.
    resume: f64,
    /// Calls that came back with at most [`MIN`] in flight.
    drained: usize,
}

impl Default for Window {
    fn default() -> Self {
        Self {
            size: INITIAL as f64,
            shortest_now: None,
            shortest_before: None,
            next_probe: None,
            probe: None,
            round: Round::default(),
        }
    }
}

impl Window {
    /// Calls that may be in flight now.
    pub(super) fn limit(&self) -> usize {
        if self.probe.is_some() {
            MIN
        } else {
            (self.size as usize).clamp(MIN, MAX)
        }
    }

    /// The round trip of a call that waited for nothing, lately.
    fn base(&self) -> Option<Duration> {
        match (self.shortest_now, self.shortest_before) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// A call came back at `now` after `round_trip`, with `in_flight` calls outstanding (itself included);
    /// `window_bound` says whether the window held anything back (operations queued, or every slot taken):
    /// a window that limits nothing has not shown it is too small.
    pub(super) fn observe(&mut self, now: Instant, round_trip: Duration, in_flight: usize, window_bound: bool) {
        let round_trip = round_trip.max(Duration::from_nanos(1));
        self.shortest_now = Some(self.shortest_now.map_or(round_trip, |s| s.min(round_trip)));
        let base = self.base().unwrap_or(round_trip);
        if let Some(probe) = &mut self.probe {
            // The first call back with the queue drained was sent before; the next ones measure it.
            if in_flight <= MIN {
                probe.drained += 1;
            }
            if probe.drained > MIN {
                self.size = probe.resume;
                self.probe = None;
                self.next_probe = Some(now + base * PROBE_EVERY);
                self.round = Round::default();
            }
            return;
        }
        match self.next_probe {
            None => self.next_probe = Some(now + base * PROBE_EVERY),
            Some(at) if now >= at => {
                // TRACE: it comes every few hundred calls, and says nothing about any lock.
                tracing::trace!(
                    window = self.size,
                    ?base,
                    ?round_trip,
                    in_flight,
                    "distlock: call window probes its base"
                );
                self.shortest_before = self.shortest_now.take();
                self.probe = Some(Probe { resume: self.size, drained: 0 });
                return;
            }
            Some(_) => {}
        }
        let round = &mut self.round;
        round.shortest = Some(round.shortest.map_or(round_trip, |s| s.min(round_trip)));
        round.bound |= window_bound;
        round.left = round.left.saturating_sub(1);
        if round.left > 0 {
            return;
        }
        let shortest = round.shortest.take().unwrap_or(round_trip);
        let bound = std::mem::take(&mut round.bound);
        let queueing = shortest.saturating_sub(base).as_secs_f64() / base.as_secs_f64();
        if queueing < QUEUEING_LOW / 2.0 && bound {
            self.size = (self.size + (self.size / 4.0).max(1.0)).min(MAX as f64);
        } else if queueing < QUEUEING_LOW && bound {
            self.size = (self.size + 1.0).min(MAX as f64);
        } else if queueing > 2.0 * QUEUEING_HIGH {
            self.size = (self.size - (self.size / 4.0).max(1.0)).max(MIN as f64);
        } else if queueing > QUEUEING_HIGH {
            self.size = (self.size - 1.0).max(MIN as f64);
        }
        self.round.left = self.limit();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::{Window, INITIAL, MAX, MIN};

    fn us(n: u64) -> Duration {
        Duration::from_micros(n)
    }

    /// A window and a clock: `calls` completions, the window always full, each round trip what
    /// `round_trip(in_flight)` gives, the completions spread evenly over it.
    struct Sim {
        window: Window,
        now: Instant,
    }

    impl Sim {
        fn new() -> Self {
            Self { window: Window::default(), now: Instant::now() }
        }

        fn run(&mut self, calls: usize, round_trip: impl Fn(usize) -> Duration) -> usize {
            for _ in 0..calls {
                let in_flight = self.window.limit();
                let rtt = round_trip(in_flight);
                self.now += rtt / in_flight as u32;
                self.window.observe(self.now, rtt, in_flight, true);
            }
            self.window.limit()
        }

        /// The window, probing or not.
        fn size(&self) -> usize {
            self.window.size as usize
        }
    }

    #[test]
    fn starts_at_the_loopback_setting() {
        assert_eq!(Window::default().limit(), INITIAL);
    }

    #[test]
    fn opens_while_the_round_trip_is_the_network_s() {
        // 1 ms of network; each call costs Redis 5 µs, and calls in flight do not wait for each other.
        let mut sim = Sim::new();
        sim.run(3_000, |_| us(1_005));
        assert!(sim.size() >= 60, "window {} after 3000 calls at a flat 1 ms", sim.size());
        sim.run(100_000, |_| us(1_005));
        assert_eq!(sim.size(), MAX, "bounded");
    }

    #[test]
    fn stays_small_when_calls_queue_in_redis() {
        // Loopback: 30 µs of network, and Redis serves one call at a time, 20 µs each, so calls in flight
        // beyond two wait for the ones ahead of them.
        let small = INITIAL + 2;
        let queueing = |in_flight: usize| us(30 + 20 * in_flight as u64);
        let mut sim = Sim::new();
        sim.run(1_000, queueing);
        assert!((MIN..=small).contains(&sim.size()), "window {}", sim.size());
        // Started wide open (the network was slow), it closes as far: the probes find the shorter round trip
        // that the queue it keeps hides.
        let mut sim = Sim::new();
        sim.run(3_000, |_| us(1_000));
        assert!(sim.size() > 32);
        sim.run(50_000, queueing);
        assert!((MIN..=small).contains(&sim.size()), "window {}", sim.size());
    }

    #[test]
    fn settles_where_redis_is_just_busy() {
        // 250 µs of network; Redis serves one call at a time, 25 µs each: about 10 calls keep it busy, and
        // more only queue. The window settles near there, neither at its minimum nor wide open, however long
        // the queue it keeps has lasted.
        let served = |in_flight: usize| us(250 + 25 * in_flight.saturating_sub(10) as u64 + 25);
        let mut sim = Sim::new();
        for _ in 0..10 {
            sim.run(10_000, served);
            assert!((8..=20).contains(&sim.size()), "window {}", sim.size());
        }
    }

    #[test]
    fn does_not_grow_while_it_limits_nothing() {
        let mut window = Window::default();
        let now = Instant::now();
        for i in 0..1_000 {
            window.observe(now + us(1_000) * i, us(1_000), 1, false);
        }
        assert_eq!(window.limit(), INITIAL);
    }

    #[test]
    fn probes_now_and_then_for_a_short_while() {
        let mut sim = Sim::new();
        let mut probing = 0;
        let calls = 200_000;
        for _ in 0..calls {
            sim.run(1, |_| us(1_000));
            probing += usize::from(sim.window.probe.is_some());
        }
        assert!(probing > 0, "never probed");
        assert!(probing < calls / 100, "probing {probing} of {calls} calls");
        assert!(sim.size() > 200);
    }

    #[test]
    fn believes_a_slower_network_after_a_probe_or_two() {
        let mut sim = Sim::new();
        let open = sim.run(500, |_| us(100));
        // The network became 10x slower: at first every call looks queued, and the window closes...
        let closed = sim.run(1_000, |_| us(1_000));
        assert!(closed < open, "window {closed} (was {open})");
        // ...but once the old minimum is two probes old, 1 ms is the new base and the window opens again.
        sim.run(20_000, |_| us(1_000));
        assert!(sim.size() >= open, "window {} (was {open})", sim.size());
    }
}
