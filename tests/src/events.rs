//! What happened, in order: an in-process [`EventLog`] on the monotonic clock with an overlap checker, and a
//! cross-process [`Witness`] that checks exclusion where it is observed, on a Redis server.

use std::fmt::{self, Write as _};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use tokio::sync::Notify;
use tokio::time::Instant;

/// What an actor reported.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A grant reached its holder.
    Acquired {
        /// Its fencing token.
        fence: u64,
    },
    /// A critical section (lock body) started.
    Entered {
        /// The grant's fencing token.
        fence: u64,
    },
    /// A critical section ended normally.
    Left {
        /// The grant's fencing token.
        fence: u64,
    },
    /// A critical section was dropped (cancelled) before its end: it ends there too.
    Dropped {
        /// The grant's fencing token.
        fence: u64,
    },
    /// The holder learned that its lock was lost.
    Lost,
    /// A write to a store with a fencing token, and whether the store took it.
    Wrote {
        /// The token sent with the write.
        fence: u64,
        /// Whether the store accepted it.
        accepted: bool,
    },
    /// Anything else.
    Note(String),
}

/// One entry of an [`EventLog`].
#[derive(Debug, Clone)]
pub struct Event {
    /// Position in the log: a total order consistent with `at`.
    pub seq: usize,
    /// When it was recorded (monotonic).
    pub at: Instant,
    /// Who reported it.
    pub actor: String,
    /// What happened.
    pub kind: Kind,
}

/// One critical section, from its `Entered` to its `Left` or `Dropped`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Section {
    /// Who ran it.
    pub actor: String,
    /// Under which grant.
    pub fence: u64,
    /// The `seq` of its `Entered`.
    pub start: usize,
    /// The `seq` of its end; `None` while it is still running.
    pub end: Option<usize>,
}

/// An append-only log of events from the actors of one test, each stamped with the monotonic clock when
/// recorded. Recording takes a lock and reads the clock under it, so `seq` order and time order agree.
#[derive(Debug)]
pub struct EventLog {
    origin: Instant,
    events: Mutex<Vec<Event>>,
    changed: Notify,
}

impl EventLog {
    /// An empty log; times are shown relative to now.
    pub fn new() -> Arc<Self> {
        Arc::new(Self { origin: Instant::now(), events: Mutex::new(Vec::new()), changed: Notify::new() })
    }

    /// Appends an event and returns when it was recorded.
    pub fn record(&self, actor: &str, kind: Kind) -> Instant {
        let mut events = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        let at = Instant::now();
        let seq = events.len();
        events.push(Event { seq, at, actor: actor.to_owned(), kind });
        drop(events);
        self.changed.notify_waiters();
        at
    }

    /// Every event so far.
    pub fn events(&self) -> Vec<Event> {
        self.events.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The first event of `actor` that satisfies `pred`.
    pub fn find(&self, actor: &str, pred: impl Fn(&Kind) -> bool) -> Option<Event> {
        self.events().into_iter().find(|e| e.actor == actor && pred(&e.kind))
    }

    /// Waits (up to `limit`) for the first event of `actor` that satisfies `pred`.
    pub async fn wait_for(&self, actor: &str, limit: Duration, pred: impl Fn(&Kind) -> bool) -> Event {
        let deadline = Instant::now() + limit;
        loop {
            let notified = self.changed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if let Some(e) = self.find(actor, &pred) {
                return e;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                panic!("no matching event from {actor} within {limit:?}; log:\n{self}");
            }
        }
    }

    /// The critical sections, in the order they started.
    pub fn sections(&self) -> Vec<Section> {
        let mut sections: Vec<Section> = Vec::new();
        for e in self.events() {
            match e.kind {
                Kind::Entered { fence } => {
                    sections.push(Section { actor: e.actor.clone(), fence, start: e.seq, end: None })
                }
                Kind::Left { fence } | Kind::Dropped { fence } => {
                    if let Some(s) =
                        sections.iter_mut().find(|s| s.actor == e.actor && s.fence == fence && s.end.is_none())
                    {
                        s.end = Some(e.seq);
                    }
                }
                _ => {}
            }
        }
        sections
    }

    /// Checks mutual exclusion: no two critical sections overlap (one ends before the next starts, an
    /// unfinished one overlaps everything after it), and their fencing tokens rise in the order they ran.
    pub fn check_no_overlap(&self) -> Result<(), String> {
        let sections = self.sections();
        for pair in sections.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            match a.end {
                Some(end) if end < b.start => {}
                _ => return Err(format!("critical sections overlap: {a:?} and {b:?}\n{self}")),
            }
            if b.fence <= a.fence {
                return Err(format!("fencing tokens do not rise: {a:?} then {b:?}\n{self}"));
            }
        }
        Ok(())
    }

    /// How long after the log was created `at` is.
    pub fn offset(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.origin)
    }
}

impl fmt::Display for EventLog {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut out = String::new();
        for e in self.events() {
            let _ = writeln!(out, "  #{:<3} +{:>9.3?} {:<10} {:?}", e.seq, self.offset(e.at), e.actor, e.kind);
        }
        f.write_str(&out)
    }
}

/// What [`Witness::enter`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Entry {
    /// How many critical sections are open, this one included: 1 unless two overlap.
    pub occupancy: i64,
    /// Whether this section's fencing token was not above every one seen before.
    pub regressed: bool,
}

/// A cross-process exclusion checker kept on a Redis server (keys `test:witness:<name>:*`, outside any lock
/// prefix). Every critical section calls [`enter`](Witness::enter) first and [`leave`](Witness::leave) last;
/// Redis executes those one at a time, so two sections that overlap in time see an occupancy of 2, whichever
/// processes they run in, with no clock involved.
#[derive(Clone)]
pub struct Witness {
    conn: MultiplexedConnection,
    keys: [String; 4],
}

const WITNESS_ENTER: &str = r"local occ = redis.call('incr', KEYS[1])
if occ > 1 then redis.call('incr', KEYS[3]) end
local f = tonumber(ARGV[1])
local regressed = 0
if f > 0 then
  local last = tonumber(redis.call('get', KEYS[2]) or '0')
  if f <= last then regressed = 1; redis.call('incr', KEYS[4]) else redis.call('set', KEYS[2], f) end
end
return {occ, regressed}";

impl Witness {
    /// The witness called `name` on the server behind `conn`.
    pub fn new(conn: MultiplexedConnection, name: &str) -> Self {
        let base = format!("test:witness:{name}");
        let keys = [
            format!("{base}:occupancy"),
            format!("{base}:last-fence"),
            format!("{base}:overlaps"),
            format!("{base}:regressions"),
        ];
        Self { conn, keys }
    }

    /// A critical section starts, under the grant with fencing token `fence` (0: not known to the caller).
    pub async fn enter(&self, fence: u64) -> Entry {
        let (occupancy, regressed): (i64, i64) = redis::Script::new(WITNESS_ENTER)
            .key(&self.keys[0])
            .key(&self.keys[1])
            .key(&self.keys[2])
            .key(&self.keys[3])
            .arg(fence)
            .invoke_async(&mut self.conn.clone())
            .await
            .expect("witness enter");
        Entry { occupancy, regressed: regressed == 1 }
    }

    /// The critical section ends.
    pub async fn leave(&self) {
        let _: i64 = redis::cmd("DECR").arg(&self.keys[0]).query_async(&mut self.conn.clone()).await.expect("leave");
    }

    /// How many times a section started while another was open.
    pub async fn overlaps(&self) -> i64 {
        self.counter(2).await
    }

    /// How many sections carried a fencing token not above the ones before.
    pub async fn regressions(&self) -> i64 {
        self.counter(3).await
    }

    /// The keys the witness uses.
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    async fn counter(&self, i: usize) -> i64 {
        let v: Option<i64> =
            redis::cmd("GET").arg(&self.keys[i]).query_async(&mut self.conn.clone()).await.expect("witness GET");
        v.unwrap_or(0)
    }
}

impl fmt::Debug for Witness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Witness").field("keys", &self.keys).finish_non_exhaustive()
    }
}
