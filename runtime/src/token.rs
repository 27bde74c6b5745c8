//! Owner tokens: 128 bits of OS randomness, shown redacted.

use std::fmt;

/// The secret that proves ownership of one grant of a lock.
///
/// It is 128 bits from the operating system's random source, hex-encoded. `Display` and `Debug` show only
/// its first 8 characters, so logs never carry a whole token; [`as_str`](LockToken::as_str) gives all of it.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() -> Result<(), distlock::LockError> {
/// let client = distlock::Client::builder().memory().build().await?;
/// let guard = client.lock("job").acquire().await?;
/// assert_eq!(guard.token().as_str().len(), 32);
/// assert!(format!("{}", guard.token()).ends_with('…'));
/// # Ok(()) }
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct LockToken(String);

impl LockToken {
    pub(crate) fn random() -> Self {
        let mut bytes = [0u8; 16];
        // No OS randomness means no unguessable tokens; a lock library cannot go on safely without it.
        getrandom::fill(&mut bytes).expect("the operating system's random source failed");
        let mut hex = String::with_capacity(32);
        for byte in bytes {
            hex.push(char::from(HEX[usize::from(byte >> 4)]));
            hex.push(char::from(HEX[usize::from(byte & 0xf)]));
        }
        Self(hex)
    }

    /// The whole token, as stored in Redis.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

const HEX: &[u8; 16] = b"0123456789abcdef";

impl fmt::Display for LockToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}…", &self.0[..8])
    }
}

impl fmt::Debug for LockToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "LockToken({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::LockToken;

    #[test]
    fn tokens_are_distinct_and_redacted() {
        let a = LockToken::random();
        let b = LockToken::random();
        assert_ne!(a, b);
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().bytes().all(|c| c.is_ascii_hexdigit()));
        assert!(!format!("{a:?}").contains(a.as_str()));
    }
}
