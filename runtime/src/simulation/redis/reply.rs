//! A command's reply before it meets a protocol: the simulated commands build a [`Reply`], and the caller turns
//! it into what its connection reads — a RESP3 client's `redis::Value` here, a script's Lua value in `lua.rs` —
//! the way redis-server 7.0 writes the same reply for each (`networking.c`).

use super::parse::format_double;

/// One reply, as the server's `addReply*` calls build it.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Reply {
    /// `+…`: a status.
    Status(Vec<u8>),
    /// `-…`: an error, its text without the dash: `CODE detail`.
    Error(Vec<u8>),
    /// `:…`.
    Int(i64),
    /// `$…`.
    Bulk(Vec<u8>),
    /// The null reply (RESP2's null bulk, RESP3's `_`).
    Nil,
    /// `*…`.
    Array(Vec<Reply>),
    /// `,…` in RESP3; a bulk string of `%.17g` in RESP2.
    Double(f64),
    /// `%…` in RESP3; a flat array in RESP2.
    Map(Vec<(Reply, Reply)>),
    /// `~…` in RESP3; an array in RESP2.
    Set(Vec<Reply>),
    /// `#t`/`#f` in RESP3 (only scripts in RESP3 mode make them).
    Bool(bool),
    /// `(…` in RESP3; a bulk string in RESP2.
    BigNumber(Vec<u8>),
    /// `=…` in RESP3 (format, text); a bulk string in RESP2.
    Verbatim(Vec<u8>, Vec<u8>),
}

/// Redis's shared error replies, by the wording `server.c` gives them: a syntax error...
pub(super) const SYNTAX: &str = "ERR syntax error";
/// ...an argument that is not an integer...
pub(super) const NOT_INTEGER: &str = "ERR value is not an integer or out of range";
/// ...not a float...
pub(super) const NOT_FLOAT: &str = "ERR value is not a valid float";
/// ...a key of another type...
pub(super) const WRONGTYPE: &str = "WRONGTYPE Operation against a key holding the wrong kind of value";
/// ...and a script the server has not cached.
pub(super) const NOSCRIPT: &str = "NOSCRIPT No matching script. Please use EVAL.";

impl Reply {
    /// The error reply `CODE detail`.
    pub(super) fn error(text: impl AsRef<[u8]>) -> Self {
        Reply::Error(text.as_ref().to_vec())
    }

    /// An error reply that Redis formats (`addReplyErrorFormat`), which turns CR and LF into spaces: also a
    /// script sees it so.
    pub(super) fn formatted_error(text: Vec<u8>) -> Self {
        Reply::Error(text.into_iter().map(|c| if c == b'\r' || c == b'\n' { b' ' } else { c }).collect())
    }

    /// `+OK`.
    pub(super) fn ok() -> Self {
        Reply::Status(b"OK".to_vec())
    }

    /// A bulk string, or the null reply for `None`.
    pub(super) fn bulk_or_nil(value: Option<Vec<u8>>) -> Self {
        value.map_or(Reply::Nil, Reply::Bulk)
    }

    /// The reply as the redis crate parses it from a RESP3 connection.
    pub(super) fn into_value(self) -> redis::Value {
        match self {
            Reply::Status(text) => line_value(b'+', &text),
            Reply::Error(text) => line_value(b'-', &text),
            Reply::Int(n) => redis::Value::Int(n),
            Reply::Bulk(bytes) => redis::Value::BulkString(bytes),
            Reply::Nil => redis::Value::Nil,
            Reply::Array(items) => redis::Value::Array(items.into_iter().map(Reply::into_value).collect()),
            // The crate reads the `%.17g` text back into the same double: 17 digits round-trip exactly.
            Reply::Double(x) => redis::Value::Double(x),
            Reply::Map(pairs) => {
                redis::Value::Map(pairs.into_iter().map(|(k, v)| (k.into_value(), v.into_value())).collect())
            }
            Reply::Set(items) => redis::Value::Set(items.into_iter().map(Reply::into_value).collect()),
            Reply::Bool(b) => redis::Value::Boolean(b),
            Reply::BigNumber(digits) => redis::Value::BigNumber(digits),
            Reply::Verbatim(format, text) => {
                let mut line = format;
                line.push(b':');
                line.extend_from_slice(&text);
                let mut resp = format!("={}\r\n", line.len()).into_bytes();
                resp.extend_from_slice(&line);
                resp.extend_from_slice(b"\r\n");
                parsed(&resp)
            }
        }
    }
}

/// A one-line reply (status or error) parsed by the redis crate itself: `ServerError` has no public
/// constructor, and the crate decides which codes it knows. Redis turns CR and LF into spaces in these
/// lines; the crate refuses a line that is not UTF-8, which the lossy conversion avoids (only a script's own
/// status or error text could be that).
fn line_value(kind: u8, text: &[u8]) -> redis::Value {
    let text: Vec<u8> = text.iter().map(|&c| if c == b'\r' || c == b'\n' { b' ' } else { c }).collect();
    let mut resp = vec![kind];
    resp.extend_from_slice(String::from_utf8_lossy(&text).as_bytes());
    resp.extend_from_slice(b"\r\n");
    parsed(&resp)
}

/// `resp` parsed by the redis crate; what it cannot parse becomes a simple string saying so (the simulated
/// server writes only what it can parse, so this is not expected to happen).
fn parsed(resp: &[u8]) -> redis::Value {
    redis::parse_redis_value(resp)
        .unwrap_or_else(|e| redis::Value::SimpleString(format!("unparsable simulated reply: {e}")))
}

/// The RESP2 form of a reply, as a script's `redis.call` reads it by default: doubles, big numbers and
/// verbatim strings as bulk strings, maps and sets as arrays.
pub(super) fn to_resp2(reply: Reply) -> Reply {
    match reply {
        Reply::Double(x) => Reply::Bulk(format_double(x).into_bytes()),
        Reply::BigNumber(digits) => Reply::Bulk(digits),
        Reply::Verbatim(_, text) => Reply::Bulk(text),
        Reply::Map(pairs) => Reply::Array(pairs.into_iter().flat_map(|(k, v)| [to_resp2(k), to_resp2(v)]).collect()),
        Reply::Set(items) | Reply::Array(items) => Reply::Array(items.into_iter().map(to_resp2).collect()),
        Reply::Bool(b) => Reply::Int(i64::from(b)),
        other => other,
    }
}
