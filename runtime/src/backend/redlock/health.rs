//! Which of a Redlock group's servers answer. The group goes on while a quorum answers, so a server that went
//! down would go unnoticed until one more failure stopped every lock: a server whose calls fail
//! [`FAILING`] times in a row is named in a WARN, once, and at INFO once it answers again.

use std::sync::atomic::{AtomicU32, Ordering};

use crate::LockError;

/// Failed calls in a row after which a server is reported: one failure is a blip (a reconnect, a slow reply);
/// three are a server down, hung or refusing the client.
pub(super) const FAILING: u32 = 3;

/// Per server: its name for messages (password redacted) and its failed calls in a row.
#[derive(Debug)]
pub(super) struct Health {
    servers: Vec<(String, AtomicU32)>,
}

impl Health {
    /// The servers named `names`; those at `silent` did not answer while the client was built (already
    /// warned of: the next report is the one that says they answer).
    pub(super) fn new(names: Vec<String>, silent: &[usize]) -> Self {
        let servers = names
            .into_iter()
            .enumerate()
            .map(|(i, name)| (name, AtomicU32::new(if silent.contains(&i) { FAILING } else { 0 })))
            .collect();
        Self { servers }
    }

    /// Server `i` replied `reply` to a call (not a reply made up for it, such as a round's sitting out): a
    /// store error counts as a failure; any other reply, an error of the lock's own included, as an answer.
    pub(super) fn note<T>(&self, i: usize, reply: &Result<T, LockError>) {
        let Some((name, failures)) = self.servers.get(i) else { return };
        match reply {
            Err(LockError::Backend(error)) => {
                if failures.fetch_add(1, Ordering::Relaxed) + 1 == FAILING {
                    tracing::warn!(
                        server = %name,
                        %error,
                        "distlock: a Redlock server failed {FAILING} calls in a row; locks are taken on the others \
                         while a quorum answers, and one more server down stops every lock"
                    );
                }
            }
            _ => {
                if failures.swap(0, Ordering::Relaxed) >= FAILING {
                    tracing::info!(server = %name, "distlock: a Redlock server answers again");
                }
            }
        }
    }

    /// Whether server `i` is reported failing now (tests).
    #[cfg(test)]
    pub(super) fn is_failing(&self, i: usize) -> bool {
        self.servers.get(i).is_some_and(|(_, failures)| failures.load(Ordering::Relaxed) >= FAILING)
    }
}

#[cfg(test)]
mod tests {
    use super::{Health, FAILING};
    use crate::backend::redis::errors::redis_error_with_hint;
    use crate::LockError;

    fn failed() -> Result<(), LockError> {
        let source = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        Err(redis_error_with_hint("redis://127.0.0.1:1/", "down".into(), source).into())
    }

    /// Failing from the third failure in a row, not before; one answer ends it; a server silent at build starts
    /// failing; an error that is not the store's (the lock's own) is an answer.
    #[test]
    fn a_server_is_failing_from_its_third_failure_in_a_row_until_it_answers() {
        let health = Health::new(vec!["a".into(), "b".into(), "c".into()], &[2]);
        for _ in 1..FAILING {
            health.note(0, &failed());
        }
        assert!(!health.is_failing(0), "two failures are a blip");
        health.note(0, &Ok(()));
        health.note(0, &failed());
        health.note(0, &failed());
        assert!(!health.is_failing(0), "an answer starts the count again");
        health.note(0, &failed());
        assert!(health.is_failing(0));
        health.note(0, &Ok(()));
        assert!(!health.is_failing(0));
        assert!(health.is_failing(2), "silent at build");
        health.note(2, &Err::<(), _>(LockError::InvalidConfig("the lock's own".into())));
        assert!(!health.is_failing(2), "it answered");
        assert!(!health.is_failing(1));
        health.note(7, &failed());
    }
}
