//! What listing locks shares across stores: the SCAN-style pattern over record keys built from a pattern over
//! lock names, the way back from a record key to its lock's name, Redis's glob matching (for the in-process
//! store, so both stores match alike), and where a scan stands.

use super::escape_into;

/// Where a scan of lock records stands: the store's own `cursor` ([`Store::Cursor`](super::Store::Cursor)),
/// and what every store reports to the listing.
#[derive(Debug, Clone, Default)]
pub(crate) struct Scan<C> {
    pub(crate) cursor: C,
    /// Every record was looked at: the listing is over.
    pub(crate) done: bool,
    /// Keys found under the prefix in a lock's place that distlock did not write (another program's data):
    /// left out, and counted.
    pub(crate) skipped: usize,
}

impl<C> Scan<C> {
    /// The same scan with its cursor turned by `f` (a store's own, or the client's enum of them).
    pub(crate) fn map<D>(self, f: impl FnOnce(C) -> D) -> Scan<D> {
        Scan { cursor: f(self.cursor), done: self.done, skipped: self.skipped }
    }
}

/// A waiter's place, as a store reports it (no token).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Place {
    pub(crate) owner: String,
    pub(crate) metadata: String,
    /// Since the waiter first queued.
    pub(crate) waited: std::time::Duration,
}

/// The SCAN `MATCH` pattern selecting the records of the locks whose names match `names` (Redis glob syntax:
/// `*`, `?`, `[abc]`, `[^a-z]`, `\` escapes), and nothing else: `<prefix>{<pattern>}` with the prefix's glob
/// characters escaped and the pattern's literal `%`, `{` and `}` percent-encoded as the record key encodes
/// them. A derived key (`:queue`, `:waiter:…`) never ends with `}`, so it never matches.
pub(crate) fn record_pattern(prefix: &str, names: &str) -> String {
    let mut out = String::with_capacity(prefix.len() + names.len() + 8);
    for c in prefix.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('{');
    let mut chars = names.chars();
    while let Some(c) = chars.next() {
        match c {
            // An escaped character is literal: encode it as the key does, or keep the escape.
            '\\' => match chars.next() {
                Some(c @ ('%' | '{' | '}')) => escape_into(&mut out, c.encode_utf8(&mut [0; 4])),
                Some(c) => {
                    out.push('\\');
                    out.push(c);
                }
                None => out.push_str("\\\\"),
            },
            '%' | '{' | '}' => escape_into(&mut out, c.encode_utf8(&mut [0; 4])),
            c => out.push(c),
        }
    }
    out.push('}');
    out
}

/// The lock name whose record key is `record`, or `None` when `record` is not one this prefix's clients
/// write (another program's key under the prefix, a derived key, the startup check's: see
/// [`LockKeys::startup_check`](super::LockKeys::startup_check)).
pub(crate) fn name_of_record(prefix: &str, record: &str) -> Option<String> {
    let escaped = record.strip_prefix(prefix)?.strip_prefix('{')?.strip_suffix('}')?;
    if escaped.contains(['{', '}']) {
        return None;
    }
    let mut name = String::with_capacity(escaped.len());
    let mut rest = escaped;
    while let Some(at) = rest.find('%') {
        name.push_str(&rest[..at]);
        let decoded = match rest.get(at..at + 3)? {
            "%25" => '%',
            "%7B" => '{',
            "%7D" => '}',
            _ => return None,
        };
        name.push(decoded);
        rest = &rest[at + 3..];
    }
    name.push_str(rest);
    Some(name)
}

/// Whether `text` matches the glob `pattern` as Redis's `SCAN … MATCH` decides it (`stringmatchlen`, case
/// sensitive): `*`, `?`, `[…]` with `^` and ranges, `\` escaping the next character.
pub(crate) fn glob_matches(pattern: &[u8], text: &[u8]) -> bool {
    let (mut p, mut t) = (0, 0);
    // Where the last `*` was and the text position it is currently made to cover up to (backtracking point).
    let mut star: Option<(usize, usize)> = None;
    while t < text.len() {
        if p < pattern.len() {
            match pattern[p] {
                b'*' => {
                    star = Some((p, t));
                    p += 1;
                    continue;
                }
                b'?' => {
                    p += 1;
                    t += 1;
                    continue;
                }
                b'[' => {
                    if let Some((matched, next)) = class_matches(pattern, p, text[t]) {
                        if matched {
                            p = next;
                            t += 1;
                            continue;
                        }
                    }
                }
                b'\\' if p + 1 < pattern.len() => {
                    if pattern[p + 1] == text[t] {
                        p += 2;
                        t += 1;
                        continue;
                    }
                }
                c => {
                    if c == text[t] {
                        p += 1;
                        t += 1;
                        continue;
                    }
                }
            }
        }
        match star {
            Some((star_p, star_t)) => {
                star = Some((star_p, star_t + 1));
                p = star_p + 1;
                t = star_t + 1;
            }
            None => return false,
        }
    }
    pattern[p..].iter().all(|&c| c == b'*')
}

/// The class opening at `pattern[open]` (`[`) against `c`: whether it matches, and where the pattern goes on
/// after it. An unclosed class runs to the end of the pattern, as in Redis.
fn class_matches(pattern: &[u8], open: usize, c: u8) -> Option<(bool, usize)> {
    let mut i = open + 1;
    let negate = pattern.get(i) == Some(&b'^');
    if negate {
        i += 1;
    }
    let mut matched = false;
    while i < pattern.len() && pattern[i] != b']' {
        if pattern[i] == b'\\' && i + 1 < pattern.len() {
            matched |= pattern[i + 1] == c;
            i += 2;
        } else if i + 2 < pattern.len() && pattern[i + 1] == b'-' && pattern[i + 2] != b']' {
            let (lo, hi) = (pattern[i].min(pattern[i + 2]), pattern[i].max(pattern[i + 2]));
            matched |= (lo..=hi).contains(&c);
            i += 3;
        } else {
            matched |= pattern[i] == c;
            i += 1;
        }
    }
    Some((matched != negate, (i + 1).min(pattern.len())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::LockKeys;

    /// The pattern built from a name pattern selects exactly the records of the names it matches, whatever
    /// characters the names and the prefix hold, and never a derived key.
    #[test]
    fn record_patterns_select_the_records_of_matching_names_only() {
        let prefix = "app[1]*:";
        let names = ["report:1", "report:2", "rep{x}", "100%", "other", "report:"];
        let record = |name: &str| LockKeys::new(prefix, name.to_owned()).record;
        let selected = |pattern: &str| -> Vec<&str> {
            let glob = record_pattern(prefix, pattern);
            names.iter().copied().filter(|n| glob_matches(glob.as_bytes(), record(n).as_bytes())).collect()
        };
        assert_eq!(selected("*"), names);
        assert_eq!(selected("report:*"), ["report:1", "report:2", "report:"]);
        assert_eq!(selected("report:?"), ["report:1", "report:2"]);
        assert_eq!(selected("rep{*}"), ["rep{x}"]);
        assert_eq!(selected("100\\%"), ["100%"]);
        assert_eq!(selected("report:[^1]"), ["report:2"]);
        assert_eq!(selected("[a-p]*"), ["other"]);
        let glob = record_pattern(prefix, "*");
        let keys = LockKeys::new(prefix, "report:1".into());
        for derived in [keys.channel(), format!("{}:queue", keys.record), format!("{}:waiter:ab", keys.record)] {
            assert!(!glob_matches(glob.as_bytes(), derived.as_bytes()), "{derived}");
        }
        assert!(!glob_matches(glob.as_bytes(), b"app11:{report:1}"), "the prefix's glob characters are literal");
    }

    #[test]
    fn record_keys_decode_to_their_names() {
        for name in ["report:42", "a{b}%c", "%7B", "é}"] {
            let keys = LockKeys::new("distlock:", name.to_owned());
            assert_eq!(name_of_record("distlock:", &keys.record).as_deref(), Some(name));
        }
        for not_a_record in
            ["distlock:{a}:waiter:ab", "distlock:{a}:queue", "other:{a}", "distlock:{a%41}", "distlock:{a}}"]
        {
            assert_eq!(name_of_record("distlock:", not_a_record), None, "{not_a_record}");
        }
        let probe = LockKeys::startup_check("distlock:", "abc");
        assert_eq!(name_of_record("distlock:", &probe.record), None, "the startup check is not listed");
        // A user's lock of any name is, also one that looks like the startup check's.
        let user = LockKeys::new("distlock:", "distlock-startup-probe:abc".to_owned());
        assert_eq!(name_of_record("distlock:", &user.record).as_deref(), Some("distlock-startup-probe:abc"));
    }

    /// Redis's own examples of `stringmatchlen`.
    #[test]
    fn globs_match_as_redis_matches() {
        let cases: [(&str, &str, bool); 14] = [
            ("h?llo", "hello", true),
            ("h?llo", "hllo", false),
            ("h*llo", "hllo", true),
            ("h*llo", "heeeello", true),
            ("h[ae]llo", "hallo", true),
            ("h[ae]llo", "hillo", false),
            ("h[^e]llo", "hallo", true),
            ("h[^e]llo", "hello", false),
            ("h[a-b]llo", "hbllo", true),
            ("h\\*llo", "h*llo", true),
            ("h\\*llo", "hello", false),
            ("*", "", true),
            ("a*b*c", "abxbxc", true),
            ("a*b*c", "abxbx", false),
        ];
        for (pattern, text, expected) in cases {
            assert_eq!(glob_matches(pattern.as_bytes(), text.as_bytes()), expected, "{pattern} on {text}");
        }
    }
}
