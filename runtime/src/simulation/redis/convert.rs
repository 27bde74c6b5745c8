//! Between Redis replies and Lua values, as redis-server 7.0's `script_lua.c` converts them: a command's reply
//! into what `redis.call` returns (`redisProtocolToLuaType`), a script's return value into its reply
//! (`luaReplyToRedisReply`), a call's Lua arguments into a command (`luaArgsToRedisArgv`), and Redis errors
//! into the `{err = …}` tables scripts see.

use std::fmt;

use mlua::{Lua, LuaString, Table, Value};

use super::parse::format_double;
use super::reply::{to_resp2, Reply};

/// An error a `redis.*` function raises: its text, `CODE detail`. Redis raises the table `{err = text}`;
/// a Rust function raises this instead, and the engine turns it back into the table (a script's failure) or
/// its text (a script's `pcall`), where Redis's own code would have them.
#[derive(Debug, Clone)]
pub(super) struct Raised(pub(super) Vec<u8>);

impl fmt::Display for Raised {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&String::from_utf8_lossy(&self.0))
    }
}

impl std::error::Error for Raised {}

/// Raises `text` (`luaPushErrorBuff`'s result) as a Lua error.
pub(super) fn raise<T>(text: Vec<u8>) -> mlua::Result<T> {
    Err(mlua::Error::external(Raised(text)))
}

/// The text of the [`Raised`] error inside an mlua error, if it carries one.
pub(super) fn raised_text(error: &mlua::Error) -> Option<Vec<u8>> {
    error.downcast_ref::<Raised>().map(|r| r.0.clone())
}

/// `luaPushErrorBuff`: the `err` text of an error, from `-CODE detail` (a reply) or a bare message (which gets
/// the code ERR); CR and LF trimmed from the detail's ends.
pub(super) fn error_text(buffer: &[u8]) -> Vec<u8> {
    let (code, detail): (&[u8], &[u8]) = match buffer.strip_prefix(b"-") {
        Some(rest) => match rest.iter().position(|&c| c == b' ') {
            Some(space) => (&rest[..space], &rest[space + 1..]),
            None => (b"ERR", rest),
        },
        None => (b"ERR", buffer),
    };
    let newline = |c: &u8| *c == b'\r' || *c == b'\n';
    let start = detail.iter().position(|c| !newline(c)).unwrap_or(detail.len());
    let end = detail.iter().rposition(|c| !newline(c)).map_or(start, |e| e + 1);
    [code, b" ", &detail[start..end]].concat()
}

/// An `{err = text}` table, with the mark Redis puts on errors of commands (`ignore_error_stats_update`).
pub(super) fn error_table(lua: &Lua, text: &[u8], from_command: bool) -> mlua::Result<Table> {
    let table = lua.create_table()?;
    table.raw_set("err", lua.create_string(text)?)?;
    if from_command {
        table.raw_set("ignore_error_stats_update", true)?;
    }
    Ok(table)
}

/// `luaArgsToRedisArgv`: a call's arguments as a command; a number is printed with `%.17g`, and anything but
/// strings and numbers is refused with Redis's message.
pub(super) fn command_args(args: &[Value]) -> Result<Vec<Vec<u8>>, Vec<u8>> {
    if args.is_empty() {
        return Err(b"ERR Please specify at least one argument for this redis lib call".to_vec());
    }
    args.iter()
        .map(|arg| match arg {
            Value::String(s) => Ok(s.as_bytes().to_vec()),
            Value::Integer(n) => Ok(format_double(*n as f64).into_bytes()),
            Value::Number(n) => Ok(format_double(*n).into_bytes()),
            _ => Err(b"ERR Lua redis lib command arguments must be strings or integers".to_vec()),
        })
        .collect()
}

/// `redisProtocolToLuaType`: a reply as `redis.call` returns it to a script whose protocol is RESP2 (the
/// default: nulls are `false`, doubles strings) or RESP3 (`redis.setresp(3)`).
pub(super) fn reply_to_lua(lua: &Lua, reply: Reply, resp3: bool) -> mlua::Result<Value> {
    let reply = if resp3 { reply } else { to_resp2(reply) };
    let single = |lua: &Lua, field: &str, value: Value| -> mlua::Result<Value> {
        let table = lua.create_table()?;
        table.raw_set(field, value)?;
        Ok(Value::Table(table))
    };
    Ok(match reply {
        Reply::Status(text) => single(lua, "ok", Value::String(lua.create_string(&text)?))?,
        Reply::Error(text) => Value::Table(error_table(lua, &error_text(&[b"-", text.as_slice()].concat()), true)?),
        Reply::Int(n) => Value::Number(n as f64),
        Reply::Bulk(bytes) => Value::String(lua.create_string(&bytes)?),
        Reply::Nil if resp3 => Value::Nil,
        Reply::Nil => Value::Boolean(false),
        Reply::Bool(b) => Value::Boolean(b),
        Reply::Double(x) => single(lua, "double", Value::Number(x))?,
        Reply::BigNumber(digits) => single(lua, "big_number", Value::String(lua.create_string(&digits)?))?,
        Reply::Verbatim(format, text) => {
            let inner = lua.create_table()?;
            inner.raw_set("string", lua.create_string(&text)?)?;
            inner.raw_set("format", lua.create_string(&format)?)?;
            single(lua, "verbatim_string", Value::Table(inner))?
        }
        Reply::Array(items) => {
            let table = lua.create_table()?;
            for (i, item) in items.into_iter().enumerate() {
                table.raw_set(i + 1, reply_to_lua(lua, item, resp3)?)?;
            }
            Value::Table(table)
        }
        Reply::Map(pairs) => {
            let inner = lua.create_table()?;
            for (k, v) in pairs {
                inner.set(reply_to_lua(lua, k, resp3)?, reply_to_lua(lua, v, resp3)?)?;
            }
            single(lua, "map", Value::Table(inner))?
        }
        Reply::Set(items) => {
            let inner = lua.create_table()?;
            for item in items {
                inner.set(reply_to_lua(lua, item, resp3)?, true)?;
            }
            single(lua, "set", Value::Table(inner))?
        }
    })
}

/// How deep a script's reply may nest before it is cut with an error, as Redis cuts it when the Lua stack
/// runs out.
const MAX_DEPTH: usize = 1000;

/// The longest array reply a script may make here.
const MAX_ITEMS: usize = 1 << 24;

/// `(long long)` of a double as x86-64 converts it: truncated; NaN and what does not fit become i64::MIN.
fn c_long_long(x: f64) -> i64 {
    // 2^63, exactly.
    const LIMIT: f64 = 9_223_372_036_854_775_808.0;
    if x.is_nan() || !(-LIMIT..LIMIT).contains(&x) {
        i64::MIN
    } else {
        x as i64
    }
}

/// `luaReplyToRedisReply`: a script's return value as its reply. `resp3` is the script's protocol
/// (`redis.setresp`), which decides what booleans become.
pub(super) fn lua_to_reply(value: &Value, resp3: bool) -> Reply {
    to_reply(value, resp3, 0)
}

/// [`lua_to_reply`] at nesting `depth`.
fn to_reply(value: &Value, resp3: bool, depth: usize) -> Reply {
    if depth > MAX_DEPTH {
        return Reply::error("ERR reached lua stack limit");
    }
    match value {
        Value::String(s) => Reply::Bulk(s.as_bytes().to_vec()),
        Value::Boolean(b) if resp3 => Reply::Bool(*b),
        Value::Boolean(true) => Reply::Int(1),
        Value::Boolean(false) => Reply::Nil,
        Value::Integer(n) => Reply::Int(*n),
        Value::Number(x) => Reply::Int(c_long_long(*x)),
        Value::Table(table) => table_to_reply(table, resp3, depth).unwrap_or_else(|e| {
            // Reading raw cannot run a script's code; what fails here (memory) is an error reply, not a crash.
            Reply::formatted_error(format!("ERR {e}").into_bytes())
        }),
        _ => Reply::Nil,
    }
}

/// The fields a table's reply is read by, in the order Redis looks for them.
const REPLY_FIELDS: [&[u8]; 7] = [b"err", b"ok", b"double", b"big_number", b"verbatim_string", b"map", b"set"];

/// A table's reply: `err`, `ok`, `double`, `big_number`, `verbatim_string`, `map`, `set`, else an array up to
/// the first nil. Redis 7.0 reads them raw (`lua_rawget`: a metatable's `__index` is not asked, which the
/// differential test shows), so one pass over the table's entries reads it whole: a script's every reply is a
/// table, and looking up each field and then each index was a twentieth of a Redlock schedule's instructions.
fn table_to_reply(table: &Table, resp3: bool, depth: usize) -> mlua::Result<Reply> {
    let (mut items, mut later, mut has_field) = (Vec::new(), Vec::new(), false);
    for pair in table.pairs::<Value, Value>() {
        let (key, value) = pair?;
        let index = match key {
            Value::String(name) => {
                has_field |= REPLY_FIELDS.contains(&&name.as_bytes()[..]);
                continue;
            }
            Value::Integer(i) => i,
            Value::Number(x) if x.fract() == 0.0 && x >= 1.0 && x <= i64::MAX as f64 => x as i64,
            _ => continue,
        };
        // Lua walks an array's part in order: most entries land in place.
        if index == items.len() as i64 + 1 {
            items.push(to_reply(&value, resp3, depth + 1));
        } else if index > items.len() as i64 {
            later.push((index, value));
        }
    }
    // What lay past a hole, or came out of order: the array goes on up to its first missing index.
    later.sort_by_key(|(index, _)| *index);
    for (index, value) in later {
        if index != items.len() as i64 + 1 {
            break;
        }
        items.push(to_reply(&value, resp3, depth + 1));
    }
    if has_field {
        if let Some(reply) = fields_to_reply(table, resp3, depth)? {
            return Ok(reply);
        }
    }
    if items.len() > MAX_ITEMS {
        return Ok(Reply::error("ERR the script's reply is too long for the simulated server"));
    }
    Ok(Reply::Array(items))
}

/// The reply a table's [`REPLY_FIELDS`] make: the first of them, in their order, whose value has the type
/// Redis looks for; `None` when none has (the table is then read as an array).
fn fields_to_reply(table: &Table, resp3: bool, depth: usize) -> mlua::Result<Option<Reply>> {
    let sanitized = |s: &LuaString| -> Vec<u8> {
        s.as_bytes().iter().map(|&c| if c == b'\r' || c == b'\n' { b' ' } else { c }).collect()
    };
    if let Value::String(text) = table.raw_get::<Value>("err")? {
        return Ok(Some(Reply::Error(sanitized(&text))));
    }
    if let Value::String(text) = table.raw_get::<Value>("ok")? {
        return Ok(Some(Reply::Status(sanitized(&text))));
    }
    match table.raw_get::<Value>("double")? {
        Value::Number(x) => return Ok(Some(Reply::Double(x))),
        Value::Integer(n) => return Ok(Some(Reply::Double(n as f64))),
        _ => {}
    }
    if let Value::String(digits) = table.raw_get::<Value>("big_number")? {
        return Ok(Some(Reply::BigNumber(sanitized(&digits))));
    }
    if let Value::Table(verbatim) = table.raw_get::<Value>("verbatim_string")? {
        if let (Value::String(format), Value::String(text)) =
            (verbatim.raw_get::<Value>("format")?, verbatim.raw_get::<Value>("string")?)
        {
            let format = format.as_bytes().iter().copied().chain(std::iter::repeat(b' ')).take(3).collect();
            return Ok(Some(Reply::Verbatim(format, text.as_bytes().to_vec())));
        }
    }
    if let Value::Table(map) = table.raw_get::<Value>("map")? {
        let mut pairs = Vec::new();
        for pair in map.pairs::<Value, Value>() {
            let (k, v) = pair?;
            pairs.push((to_reply(&k, resp3, depth + 1), to_reply(&v, resp3, depth + 1)));
        }
        return Ok(Some(Reply::Map(pairs)));
    }
    if let Value::Table(set) = table.raw_get::<Value>("set")? {
        let mut items = Vec::new();
        for pair in set.pairs::<Value, Value>() {
            items.push(to_reply(&pair?.0, resp3, depth + 1));
        }
        return Ok(Some(Reply::Set(items)));
    }
    Ok(None)
}
