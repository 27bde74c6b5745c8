//! The `redis` table scripts call (`script_lua.c`'s `luaRegisterRedisAPI` in redis-server 7.0): `call` and
//! `pcall`, which run a command on the keyspace lent to the script, and the helpers, with Redis's checks and
//! error messages.

use mlua::{Lua, MultiValue, Table, Value};

use super::commands::{self, Kind, Lookup};
use super::convert::{self, raise};
use super::lua::{sha1_hex, Run};
use super::parse::format_g;
use super::reply::Reply;

/// The version the simulated server reports to scripts: the one the differential test runs against.
const VERSION: (&str, i64) = ("7.0.15", 0x0007_000f);

/// A command called by a script: Redis's checks for scripts, then the command on the lent keyspace.
fn call_in_script(run: &mut Run, args: &[Vec<u8>]) -> Reply {
    match commands::lookup(args) {
        Lookup::Found(command) if !command.arity_fits(args.len()) => {
            Reply::error("ERR Wrong number of args calling Redis command from script")
        }
        Lookup::Found(command) if command.noscript => Reply::error("ERR This Redis command is not allowed from script"),
        Lookup::Found(command) => match command.kind {
            Kind::Data(run_command) => run_command(&mut run.keyspace, &mut run.ctx, args),
            _ => Reply::error("ERR This Redis command is not allowed from script"),
        },
        Lookup::UnknownSubcommand | Lookup::Unknown => Reply::error("ERR Unknown Redis command called from script"),
    }
}

/// `redis.call` (`raise`) and `redis.pcall`.
fn redis_call(lua: &Lua, mut args: MultiValue, raise_errors: bool) -> mlua::Result<Value> {
    let argv = match convert::command_args(args.make_contiguous()) {
        Ok(argv) => argv,
        Err(text) if raise_errors => return raise(text),
        Err(text) => return Ok(Value::Table(convert::error_table(lua, &text, false)?)),
    };
    let (reply, resp3) = match lua.app_data_mut::<Run>() {
        Some(mut run) => (call_in_script(&mut run, &argv), run.ctx.resp3),
        None => return raise(b"ERR redis.call/pcall can only be called inside a script invocation".to_vec()),
    };
    match reply {
        Reply::Error(text) if raise_errors => raise(convert::error_text(&[b"-", text.as_slice()].concat())),
        reply => convert::reply_to_lua(lua, reply, resp3),
    }
}

/// The `redis` table scripts call.
pub(super) fn redis_table(lua: &Lua) -> mlua::Result<Table> {
    let redis = lua.create_table()?;
    redis.raw_set("call", lua.create_function(|lua, args| redis_call(lua, args, true))?)?;
    redis.raw_set("pcall", lua.create_function(|lua, args| redis_call(lua, args, false))?)?;
    // Both return a table; a wrong argument makes it an error table (not raised).
    let single = |field: &'static str| {
        lua.create_function(move |lua, args: MultiValue| {
            let table = match args.iter().collect::<Vec<_>>().as_slice() {
                [Value::String(s)] if field == "ok" => {
                    let table = lua.create_table()?;
                    table.raw_set("ok", s.clone())?;
                    table
                }
                [Value::String(s)] => {
                    let text = s.as_bytes();
                    let buffer = if text.starts_with(b"-") { text.to_vec() } else { [b"-", &text[..]].concat() };
                    convert::error_table(lua, &convert::error_text(&buffer), false)?
                }
                _ => convert::error_table(lua, b"ERR wrong number or type of arguments", false)?,
            };
            Ok(table)
        })
    };
    redis.raw_set("error_reply", single("err")?)?;
    redis.raw_set("status_reply", single("ok")?)?;
    redis.raw_set(
        "sha1hex",
        lua.create_function(|lua, args: MultiValue| match args.iter().collect::<Vec<_>>().as_slice() {
            [Value::String(s)] => lua.create_string(sha1_hex(&s.as_bytes())),
            [Value::Integer(n)] => lua.create_string(sha1_hex(format_g(*n as f64, 14).as_bytes())),
            [Value::Number(x)] => lua.create_string(sha1_hex(format_g(*x, 14).as_bytes())),
            [_] => lua.create_string(sha1_hex(b"")),
            _ => raise(b"ERR wrong number of arguments".to_vec()),
        })?,
    )?;
    redis.raw_set(
        "log",
        lua.create_function(|_, args: MultiValue| -> mlua::Result<()> {
            if args.len() < 2 {
                return raise(b"ERR redis.log() requires two arguments or more.".to_vec());
            }
            let Some(level) = args.front().and_then(lua_number) else {
                return raise(b"ERR First argument must be a number (log level).".to_vec());
            };
            // The log itself goes nowhere: the simulated server has no log.
            if !(0.0..4.0).contains(&level.trunc()) {
                return raise(b"ERR Invalid debug level.".to_vec());
            }
            Ok(())
        })?,
    )?;
    for (name, level) in [("LOG_DEBUG", 0), ("LOG_VERBOSE", 1), ("LOG_NOTICE", 2), ("LOG_WARNING", 3)] {
        redis.raw_set(name, level)?;
    }
    redis.raw_set(
        "setresp",
        lua.create_function(|lua, args: MultiValue| -> mlua::Result<()> {
            let version = match args.iter().collect::<Vec<_>>().as_slice() {
                [v] => lua_number(v).unwrap_or(0.0) as i64,
                _ => return raise(b"ERR redis.setresp() requires one argument.".to_vec()),
            };
            if version != 2 && version != 3 {
                return raise(b"ERR RESP version must be 2 or 3.".to_vec());
            }
            if let Some(mut run) = lua.app_data_mut::<Run>() {
                run.ctx.resp3 = version == 3;
            }
            Ok(())
        })?,
    )?;
    // Replication of a script's effects is not selectable here: every write is an effect.
    redis.raw_set(
        "set_repl",
        lua.create_function(|_, args: MultiValue| -> mlua::Result<()> {
            let flags = match args.iter().collect::<Vec<_>>().as_slice() {
                [v] => lua_number(v).unwrap_or(0.0) as i64,
                _ => return raise(b"ERR redis.set_repl() requires two arguments.".to_vec()),
            };
            if flags & !3 != 0 {
                let text = "ERR Invalid replication flags. Use REPL_AOF, REPL_REPLICA, REPL_ALL or REPL_NONE.";
                return raise(text.as_bytes().to_vec());
            }
            Ok(())
        })?,
    )?;
    for (name, flags) in [("REPL_NONE", 0), ("REPL_AOF", 1), ("REPL_SLAVE", 2), ("REPL_REPLICA", 2), ("REPL_ALL", 3)] {
        redis.raw_set(name, flags)?;
    }
    redis.raw_set("replicate_commands", lua.create_function(|_, ()| Ok(true))?)?;
    redis.raw_set("breakpoint", lua.create_function(|_, ()| Ok(false))?)?;
    redis.raw_set("debug", lua.create_function(|_, _: MultiValue| Ok(()))?)?;
    redis.raw_set(
        "acl_check_cmd",
        lua.create_function(|_, args: MultiValue| {
            let args: Vec<Value> = args.into_iter().collect();
            let argv = convert::command_args(&args).or_else(raise)?;
            match commands::lookup(&argv) {
                Lookup::Found(_) => Ok(true),
                _ => raise(b"ERR Invalid command passed to redis.acl_check_cmd()".to_vec()),
            }
        })?,
    )?;
    redis.raw_set("REDIS_VERSION", VERSION.0)?;
    redis.raw_set("REDIS_VERSION_NUM", VERSION.1)?;
    Ok(redis)
}

/// `lua_tonumber`: a number, or a string Lua reads as one (spaces around it allowed); `None` otherwise.
fn lua_number(value: &Value) -> Option<f64> {
    match value {
        Value::Integer(n) => Some(*n as f64),
        Value::Number(x) => Some(*x),
        Value::String(s) => std::str::from_utf8(&s.as_bytes()).ok()?.trim().parse().ok(),
        _ => None,
    }
}
