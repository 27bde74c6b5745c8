//! What the soak workers share besides their log: the fenced register they write to and a seeded random
//! generator (the nemesis draws from one too).

/// The fenced register: KEYS highest-token, accepted-list; ARGV token. Takes the write only if the token is
/// above every one seen for the key, and appends it to the list of accepted tokens. Returns {accepted 1/0,
/// highest before}.
pub const REGISTER_WRITE: &str = r"local highest = tonumber(redis.call('get', KEYS[1]) or '0')
local token = tonumber(ARGV[1])
if token > highest then
  redis.call('set', KEYS[1], ARGV[1])
  redis.call('rpush', KEYS[2], ARGV[1])
  return {1, highest}
end
return {0, highest}";

/// The register's keys for lock key `key`: (highest token, list of accepted tokens).
pub fn register_keys(key: &str) -> (String, String) {
    (format!("soak:register:{key}:highest"), format!("soak:register:{key}:accepted"))
}

/// A small seeded generator (SplitMix64): the same seed gives the same numbers on every machine.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator seeded with `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..=hi`.
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo + 1)
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.next_u64() % 100 < percent
    }

    /// An index below `n` (n > 0).
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n as u64) as usize
    }
}
