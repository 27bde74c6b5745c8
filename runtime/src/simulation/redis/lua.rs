//! The script engine: one Lua 5.1 state (mlua, vendored: the same Lua as Redis's) set up as redis-server 7.0
//! sets up its scripting environment (`eval.c`, `script_lua.c`), its script cache by SHA1, and EVAL, EVALSHA
//! and SCRIPT LOAD / EXISTS / FLUSH.
//!
//! What scripts see: the base, table, string and math libraries (without `dofile`, `loadfile` and `print`,
//! which Redis removes); the `redis` table (`call`, `pcall`, `error_reply`, `status_reply`, `sha1hex`, `log`
//! and its levels, `setresp`, `set_repl` and its flags, `replicate_commands`, `breakpoint`, `debug`,
//! `acl_check_cmd`, the version); KEYS and ARGV; Redis's `pcall`, which hands a script the text of a Redis
//! error instead of its table. Globals are read-only, and reading one that does not exist is an error, with
//! Redis's messages: a script runs with a proxy of the globals as its environment, and the library tables
//! are proxies too (Redis 7.0 marks the real tables read-only inside its patched Lua, which mlua's Lua
//! cannot).
//!
//! Errors: Redis raises `{err = "CODE detail"}` tables from `redis.call`; a Rust function cannot raise a Lua
//! table through mlua, so it raises a Rust error carrying the text, and the two places where Redis's code
//! reads the error — its `pcall` and the script's error handler — turn it back into what Redis has there.

use std::collections::HashMap;
use std::fmt;

use mlua::chunk::ChunkMode;
use mlua::{Function, Lua, LuaOptions, LuaString, MultiValue, StdLib, Table, Value};

use super::commands::{self, Kind, Lookup};
use super::convert::{self, raise};
use super::keyspace::{int_arg, Ctx, Keyspace};
use super::parse::format_g;
use super::reply::{Reply, NOSCRIPT};

/// The version the simulated server reports to scripts: the one the differential test runs against.
const VERSION: (&str, i64) = ("7.0.15", 0x0007_000f);

/// What a script run works on, lent to the Lua state for the run (mlua's app data): `redis.call` reaches the
/// keyspace and the call's context through it.
#[derive(Debug)]
struct Run {
    keyspace: Keyspace,
    ctx: Ctx,
}

/// The Lua state and the script cache.
pub(super) struct Engine {
    lua: Lua,
    /// The real globals: KEYS and ARGV are set here.
    globals: Table,
    /// What scripts see as their globals: a read-only proxy of `globals`.
    env: Table,
    /// `xpcall(script, handler)`, returning the success flag and the first value.
    runner: Function,
    /// The error handler: Redis's `__redis__err__handler`.
    handler: Function,
    /// The scripts by the lower-case hex SHA1 of their text.
    scripts: HashMap<Vec<u8>, Function>,
}

impl fmt::Debug for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Engine").field("scripts", &self.scripts.len()).finish_non_exhaustive()
    }
}

/// The set-up Redis's Lua code does, as a chunk of its own (named `=sim`, which the error handler skips when
/// it looks for the script's line): Redis's `pcall`, and the read-only proxies. Returns the scripts'
/// environment and the runner.
const SETUP: &str = r#"
local G, unwrap = ...
local type, error, tostring, setmetatable, xpcall, lua_pcall = type, error, tostring, setmetatable, xpcall, pcall
-- Redis's pcall: a failed call's error, when it is a table with a text `err`, is that text.
local function caught(ok, ...)
  if ok then return ok, ... end
  local e = ...
  if type(e) == 'table' then
    local m = e.err
    if type(m) == 'string' or type(m) == 'number' then e = m end
  elseif type(e) == 'userdata' then
    e = unwrap(e)
  end
  return false, e
end
G.pcall = function(...) return caught(lua_pcall(...)) end
local function refuse() error('Attempt to modify a readonly table', 2) end
local function readonly(t) return setmetatable({}, {__index = t, __newindex = refuse}) end
for _, name in ipairs({'string', 'math', 'table', 'coroutine', 'redis'}) do G[name] = readonly(G[name]) end
local env = setmetatable({}, {
  __index = function(_, k)
    local v = G[k]
    if v == nil then error("Script attempted to access nonexistent global variable '" .. tostring(k) .. "'", 2) end
    return v
  end,
  __newindex = refuse,
})
G._G = env
return env, function(f, h) local ok, r = xpcall(f, h) return ok, r end
"#;

impl Engine {
    /// A Lua state set up as Redis sets up its scripting environment.
    pub(super) fn new() -> Self {
        Self::build().unwrap_or_else(|e| panic!("the simulated redis-server's Lua state cannot be built: {e}"))
    }

    fn build() -> mlua::Result<Self> {
        let lua = Lua::new_with(StdLib::TABLE | StdLib::STRING | StdLib::MATH, LuaOptions::default())?;
        let globals = lua.globals();
        for removed in ["dofile", "loadfile", "print"] {
            globals.raw_set(removed, Value::Nil)?;
        }
        globals.raw_set("redis", redis_table(&lua)?)?;
        let unwrap = lua.create_function(|lua, e: Value| {
            Ok(match &e {
                Value::Error(error) => match convert::raised_text(error) {
                    Some(text) => Value::String(lua.create_string(text)?),
                    None => Value::String(lua.create_string(error.to_string())?),
                },
                _ => e,
            })
        })?;
        let (env, runner): (Table, Function) = lua.load(SETUP).set_name("=sim").call((globals.clone(), unwrap))?;
        let tostring: Function = globals.raw_get("tostring")?;
        let handler = lua.create_function(move |lua, error: Value| error_handler(lua, &tostring, error))?;
        Ok(Self { lua, globals, env, runner, handler, scripts: HashMap::new() })
    }

    /// Compiles a script as Redis does (`luaCreateFunction`: chunk `@user_script`, text only).
    fn compile(&self, body: &[u8]) -> Result<Function, Reply> {
        let chunk = self.lua.load(body).set_name("@user_script").set_mode(ChunkMode::Text);
        chunk.set_environment(self.env.clone()).into_function().map_err(|e| {
            let message = match e {
                mlua::Error::SyntaxError { message, .. } => message,
                other => other.to_string(),
            };
            Reply::formatted_error(format!("ERR Error compiling script (new function): {message}").into_bytes())
        })
    }

    /// SCRIPT LOAD script: its SHA1, the script compiled and cached.
    pub(super) fn load(&mut self, body: &[u8]) -> Reply {
        let sha = sha1_hex(body);
        if !self.scripts.contains_key(&sha) {
            match self.compile(body) {
                Ok(function) => self.scripts.insert(sha.clone(), function),
                Err(reply) => return reply,
            };
        }
        Reply::Bulk(sha)
    }

    /// SCRIPT EXISTS sha [sha ...] (any case).
    pub(super) fn exists(&self, shas: &[Vec<u8>]) -> Reply {
        Reply::Array(shas.iter().map(|s| Reply::Int(i64::from(self.scripts.contains_key(&lower(s))))).collect())
    }

    /// SCRIPT FLUSH.
    pub(super) fn flush(&mut self) -> Reply {
        self.scripts.clear();
        Reply::ok()
    }

    /// EVAL script numkeys [key ...] [arg ...], or EVALSHA sha1 numkeys …, as `evalGenericCommand`.
    pub(super) fn eval(&mut self, keyspace: &mut Keyspace, ctx: &mut Ctx, args: &[Vec<u8>], by_sha: bool) -> Reply {
        // EVALSHA refuses a SHA1 of the wrong length before anything else.
        if by_sha && args[1].len() != 40 {
            return Reply::error(NOSCRIPT);
        }
        let numkeys = match int_arg(&args[2]) {
            Ok(n) if n > args.len() as i64 - 3 => {
                return Reply::error("ERR Number of keys can't be greater than number of args");
            }
            Ok(n) if n < 0 => return Reply::error("ERR Number of keys can't be negative"),
            Ok(n) => n as usize,
            Err(e) => return e,
        };
        let sha = if by_sha { lower(&args[1]) } else { sha1_hex(&args[1]) };
        let function = match self.scripts.get(&sha) {
            Some(function) => function.clone(),
            None if by_sha => return Reply::error(NOSCRIPT),
            None => match self.compile(&args[1]) {
                Ok(function) => self.scripts.entry(sha.clone()).or_insert(function).clone(),
                Err(reply) => return reply,
            },
        };
        let (keys, argv) = args[3..].split_at(numkeys);
        match self.run(function, keyspace, ctx, keys, argv) {
            Ok(reply) => reply,
            Err(Failure::Script(text, line)) => {
                let sha = String::from_utf8_lossy(&sha);
                let mut text = text;
                if let Some((source, line)) = line {
                    text.extend_from_slice(format!(" script: {sha}, on {source}:{line}.").as_bytes());
                }
                Reply::formatted_error(text)
            }
            Err(Failure::Engine(e)) => Reply::formatted_error(format!("ERR Error running script: {e}").into_bytes()),
        }
    }

    /// Runs a compiled script with its KEYS and ARGV on the keyspace, the call's context lent to it.
    fn run(
        &self,
        function: Function,
        keyspace: &mut Keyspace,
        ctx: &mut Ctx,
        keys: &[Vec<u8>],
        argv: &[Vec<u8>],
    ) -> Result<Reply, Failure> {
        let array = |items: &[Vec<u8>]| -> mlua::Result<Table> {
            let table = self.lua.create_table_with_capacity(items.len(), 0)?;
            for (i, item) in items.iter().enumerate() {
                table.raw_set(i + 1, self.lua.create_string(item)?)?;
            }
            Ok(table)
        };
        self.globals.raw_set("KEYS", array(keys)?)?;
        self.globals.raw_set("ARGV", array(argv)?)?;
        // A script calls commands in RESP2 until it asks for RESP3.
        let mut lent = Ctx::new(ctx.now_us);
        std::mem::swap(&mut lent, ctx);
        lent.resp3 = false;
        self.lua.set_app_data(Run { keyspace: std::mem::take(keyspace), ctx: lent });
        let outcome = self.runner.call::<(bool, Value)>((function, self.handler.clone()));
        if let Some(run) = self.lua.remove_app_data::<Run>() {
            *keyspace = run.keyspace;
            *ctx = run.ctx;
        }
        let script_resp3 = std::mem::replace(&mut ctx.resp3, true);
        match outcome? {
            (true, value) => Ok(convert::lua_to_reply(&value, script_resp3)),
            (false, Value::Table(error)) => Err(Failure::script(&error)?),
            (false, other) => Err(Failure::Engine(mlua::Error::runtime(format!("{other:?}")))),
        }
    }
}

/// How a script run failed.
enum Failure {
    /// The script's error: its text and, when known, where it happened (source and line).
    Script(Vec<u8>, Option<(String, String)>),
    /// The engine itself failed (not expected).
    Engine(mlua::Error),
}

impl From<mlua::Error> for Failure {
    fn from(e: mlua::Error) -> Self {
        Failure::Engine(e)
    }
}

impl Failure {
    /// `luaExtractErrorInformation` of the handler's table: `err`, `source`, `line`. A table without a text
    /// `err` crashes redis-server 7.0; here it is an error reply saying so.
    fn script(error: &Table) -> mlua::Result<Self> {
        let text = |v: Value| match v {
            Value::String(s) => Some(s.as_bytes().to_vec()),
            Value::Integer(n) => Some(format_g(n as f64, 14).into_bytes()),
            Value::Number(x) => Some(format_g(x, 14).into_bytes()),
            _ => None,
        };
        let message = text(error.get("err")?).unwrap_or_else(|| b"ERR script error without a message".to_vec());
        let source = text(error.get("source")?).map(|s| String::from_utf8_lossy(&s).into_owned());
        let line = text(error.get("line")?).map(|s| String::from_utf8_lossy(&s).into_owned());
        Ok(Failure::Script(message, source.zip(line)))
    }
}

/// Redis's `__redis__err__handler`: the error as a table `{err = …}` (a plain value becomes
/// `ERR <tostring(value)>`), with the source and line of the script function that raised it.
fn error_handler(lua: &Lua, tostring: &Function, error: Value) -> mlua::Result<Table> {
    let table = match error {
        Value::Table(table) => table,
        Value::Error(e) => match convert::raised_text(&e) {
            Some(text) => convert::error_table(lua, &text, false)?,
            None => convert::error_table(lua, format!("ERR {e}").as_bytes(), false)?,
        },
        other => {
            let shown: LuaString = tostring.call(other)?;
            convert::error_table(lua, &[b"ERR ", &shown.as_bytes()[..]].concat(), false)?
        }
    };
    // Redis takes the function that raised the error, or its caller when that was a C function: the first
    // frame that is neither C nor this engine's own set-up code.
    for level in 1..64 {
        let frame = lua.inspect_stack(level, |d| {
            let source = d.source();
            (source.what, source.source.map(|s| s.into_owned()), d.current_line())
        });
        match frame {
            None => break,
            Some(("C", ..)) => continue,
            Some((_, Some(source), _)) if source == "=sim" => continue,
            Some((_, source, line)) => {
                table.raw_set("source", source.unwrap_or_default())?;
                table.raw_set("line", line.map_or(-1, |l| l as i64))?;
                break;
            }
        }
    }
    Ok(table)
}

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
fn redis_call(lua: &Lua, args: MultiValue, raise_errors: bool) -> mlua::Result<Value> {
    let args: Vec<Value> = args.into_iter().collect();
    let argv = match convert::command_args(&args) {
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
fn redis_table(lua: &Lua) -> mlua::Result<Table> {
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
            let level = match args.front() {
                _ if args.len() < 2 => return raise(b"ERR redis.log() requires two arguments or more.".to_vec()),
                Some(Value::Integer(n)) => *n as f64,
                Some(Value::Number(x)) => *x,
                Some(Value::String(s)) => {
                    match std::str::from_utf8(&s.as_bytes()).ok().and_then(|t| t.trim().parse().ok()) {
                        Some(x) => x,
                        None => return raise(b"ERR First argument must be a number (log level).".to_vec()),
                    }
                }
                _ => return raise(b"ERR First argument must be a number (log level).".to_vec()),
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
                [Value::Integer(n)] => *n,
                [Value::Number(x)] => *x as i64,
                [_] => 0,
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
                [Value::Integer(n)] => *n,
                [Value::Number(x)] => *x as i64,
                [_] => 0,
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

/// The lower-case hex SHA1 of `bytes`, as Redis names scripts.
fn sha1_hex(bytes: &[u8]) -> Vec<u8> {
    sha1_smol::Sha1::from(bytes).digest().to_string().into_bytes()
}

/// ASCII lower case, as Redis compares SHA1s.
fn lower(s: &[u8]) -> Vec<u8> {
    s.to_ascii_lowercase()
}
