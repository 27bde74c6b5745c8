//! The script engine: one Lua 5.1 state (mlua, vendored: the same Lua as Redis's) set up as redis-server 7.0
//! sets up its scripting environment (`eval.c`, `script_lua.c`), its script cache by SHA1, and EVAL, EVALSHA
//! and SCRIPT LOAD / EXISTS / FLUSH.
//!
//! What scripts see: the base, table, string and math libraries as redis-server 7.0.15 has them (without
//! `dofile`, `loadfile`, `print`, `getfenv`, `setfenv` and `newproxy`; its `cjson`, `cmsgpack`, `struct` and
//! `bit` are missing here, and `math.random` is Lua's own, not Redis's rand48: distlock's scripts use none of
//! them); the `redis` table (`api.rs`); KEYS and ARGV; Redis's `pcall`, which hands a script the text of a
//! Redis error instead of its table. A new global and a field of a library table cannot be set, and reading a
//! global that does not exist is an error, with Redis's messages: a script runs with a copy of the globals as
//! its environment, and the library tables are proxies (Redis 7.0 marks the real tables read-only inside its
//! patched Lua, which mlua's Lua cannot; so `pairs(string)` finds nothing here). One difference: assigning to
//! a global that exists (`tostring = nil`) succeeds here, and stays for the server's later scripts, where
//! Redis refuses it; no distlock script assigns a global, which the differential check against a real
//! redis-server would show.
//!
//! Errors: Redis raises `{err = "CODE detail"}` tables from `redis.call`; a Rust function cannot raise a Lua
//! table through mlua, so it raises a Rust error carrying the text, and the two places where Redis's code
//! reads the error — its `pcall` and the script's error handler — turn it back into what Redis has there.

use std::collections::{HashMap, HashSet};
use std::fmt;

use mlua::chunk::ChunkMode;
use mlua::{Function, HookTriggers, Lua, LuaOptions, LuaString, StdLib, Table, Value, VmState};

use super::api;
use super::convert::{self, raise};
use super::keyspace::{int_arg, Ctx, Keyspace};
use super::parse::format_g;
use super::reply::{Reply, NOSCRIPT};

/// What a script run works on, lent to the Lua state for the run (mlua's app data): `redis.call` reaches the
/// keyspace and the call's context through it.
#[derive(Debug)]
pub(super) struct Run {
    /// The server's keyspace, for the run.
    pub(super) keyspace: Keyspace,
    /// The call's context: its clock, the script's protocol, what it publishes and writes.
    pub(super) ctx: Ctx,
    /// Thousands of Lua instructions the script has run (counted by the engine's hook).
    instructions: u64,
}

/// The most Lua instructions one script may run, in thousands. Redis lets a script run for ever (others get
/// BUSY until SCRIPT KILL); a simulation cannot wait for ever, so a script that runs away fails instead. The
/// production scripts run a few thousand: a million is far past any of them. Past the budget the hook raises
/// every thousand instructions, so a script that catches the error (BATCH runs each operation under pcall)
/// still cannot loop on: a mutant whose loop runs away (the `lua_mutants` report) fails in milliseconds.
const INSTRUCTION_BUDGET: u64 = 1_000;

/// The Lua state and the script cache.
pub(super) struct Engine {
    lua: Lua,
    /// What scripts see as their globals: a copy of the real ones, read-only for new names (KEYS and ARGV
    /// are set here).
    env: Table,
    /// `xpcall(script, handler)`, returning the success flag and the first value.
    runner: Function,
    /// The error handler: Redis's `__redis__err__handler`.
    handler: Function,
    /// The scripts the server has cached (EVAL, SCRIPT LOAD), by the lower-case hex SHA1 of their text.
    scripts: HashSet<Vec<u8>>,
    /// Every script ever compiled, by SHA1: what a SCRIPT FLUSH or a restart drops is compiled again only in
    /// name (a compiled script holds no state; compiling the large ones again cost the simulation more than
    /// anything else it did per restart).
    compiled: HashMap<Vec<u8>, Function>,
    /// A mutant of the production scripts to run in their place (the simulation's Lua mutation testing).
    pub(super) mutant: Option<crate::simulation::LuaMutant>,
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
-- The globals copied, so that reading one is a table read as in Redis (through an __index function, every
-- global a script read was a Lua call: a sixth of the simulated scripts' time).
local env = {}
for k, v in pairs(G) do env[k] = v end
env._G = env
setmetatable(env, {
  __index = function(_, k)
    error("Script attempted to access nonexistent global variable '" .. tostring(k) .. "'", 2)
  end,
  __newindex = refuse,
})
return env, function(f, h) local ok, r = xpcall(f, h) return ok, r end
"#;

impl Engine {
    /// A Lua state set up as Redis sets up its scripting environment.
    pub(super) fn new() -> Self {
        Self::build().unwrap_or_else(|e| panic!("the simulated redis-server's Lua state cannot be built: {e}"))
    }

    /// [`Engine::new`]'s work, its failures returned.
    fn build() -> mlua::Result<Self> {
        let lua = Lua::new_with(StdLib::TABLE | StdLib::STRING | StdLib::MATH, LuaOptions::default())?;
        let globals = lua.globals();
        // What redis-server 7.0.15's scripts do not see of the base library.
        for removed in ["dofile", "loadfile", "print", "getfenv", "setfenv", "newproxy"] {
            globals.raw_set(removed, Value::Nil)?;
        }
        globals.raw_set("redis", api::redis_table(&lua)?)?;
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
        lua.set_hook(HookTriggers::new().every_nth_instruction(1_000), |lua, _| {
            let spent = lua.app_data_mut::<Run>().map(|mut run| {
                run.instructions += 1;
                run.instructions
            });
            match spent {
                Some(spent) if spent > INSTRUCTION_BUDGET => {
                    raise(b"ERR the script ran past the simulated server's instruction budget".to_vec())
                }
                _ => Ok(VmState::Continue),
            }
        })?;
        Ok(Self { lua, env, runner, handler, scripts: HashSet::new(), compiled: HashMap::new(), mutant: None })
    }

    /// Caches the script `body` (SHA1 `sha`), compiled as Redis compiles it (`luaCreateFunction`: chunk
    /// `@user_script`, text only), or the compiler's error reply.
    fn cache(&mut self, sha: &[u8], body: &[u8]) -> Result<Function, Reply> {
        self.scripts.insert(sha.to_vec());
        let function = self.compiled_for(sha, body);
        if function.is_err() {
            self.scripts.remove(sha);
        }
        function
    }

    /// The function the script `body` (SHA1 `sha`) runs as, compiled once: with a mutant, the mutant's text.
    fn compiled_for(&mut self, sha: &[u8], body: &[u8]) -> Result<Function, Reply> {
        if let Some(function) = self.compiled.get(sha) {
            return Ok(function.clone());
        }
        let mutated = self.mutant.as_ref().and_then(|m| Some(m.apply(std::str::from_utf8(body).ok()?).into_bytes()));
        let function = self.compile(mutated.as_deref().unwrap_or(body))?;
        self.compiled.insert(sha.to_vec(), function.clone());
        Ok(function)
    }

    /// A server's engine started afresh: no script cached (what it compiled stays, in name only gone).
    pub(super) fn reset(&mut self, mutant: Option<crate::simulation::LuaMutant>) {
        self.scripts.clear();
        if self.mutant != mutant {
            self.compiled.clear();
            self.mutant = mutant;
        }
    }

    /// `body` compiled as a chunk `@user_script`, refusing bytecode, with the scripts' environment; Redis's
    /// error reply when it does not compile.
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
        match self.cache(&sha, body) {
            Ok(_) => Reply::Bulk(sha),
            Err(reply) => reply,
        }
    }

    /// SCRIPT EXISTS sha [sha ...] (any case).
    pub(super) fn exists(&self, shas: &[Vec<u8>]) -> Reply {
        Reply::Array(shas.iter().map(|s| Reply::Int(i64::from(self.scripts.contains(&lower(s))))).collect())
    }

    /// Whether the script cache holds `sha` (any case).
    pub(super) fn knows(&self, sha: &[u8]) -> bool {
        self.scripts.contains(&lower(sha))
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
        let sha = if by_sha { lower(&args[1]) } else { sha1_of_script(&args[1]) };
        let cached = self.scripts.contains(&sha).then(|| self.compiled.get(&sha).cloned()).flatten();
        let function = match cached {
            Some(function) => function,
            None if by_sha => return Reply::error(NOSCRIPT),
            None => match self.cache(&sha, &args[1]) {
                Ok(function) => function,
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
        self.env.raw_set("KEYS", array(keys)?)?;
        self.env.raw_set("ARGV", array(argv)?)?;
        // A script calls commands in RESP2 until it asks for RESP3.
        let mut lent = Ctx::new(ctx.now_us);
        std::mem::swap(&mut lent, ctx);
        lent.resp3 = false;
        self.lua.set_app_data(Run { keyspace: std::mem::take(keyspace), ctx: lent, instructions: 0 });
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

/// The lower-case hex SHA1 of `bytes`, as Redis names scripts.
pub(super) fn sha1_hex(bytes: &[u8]) -> Vec<u8> {
    sha1_smol::Sha1::from(bytes).digest().to_string().into_bytes()
}

/// [`sha1_hex`] of a script body EVAL sent, remembered per thread: a client sends EVAL after each NOSCRIPT (a
/// restart, a flush), the same few production scripts each time, and hashing them again was a tenth of a
/// Redlock schedule's instructions. Looked up by length, then compared in full; a pure function, so the cache
/// cannot change a schedule.
fn sha1_of_script(body: &[u8]) -> Vec<u8> {
    use std::cell::RefCell;
    /// Script bodies and their SHA1s, by the body's length.
    type Known = HashMap<usize, Vec<(Vec<u8>, Vec<u8>)>>;
    thread_local! {
        static KNOWN: RefCell<Known> = RefCell::new(HashMap::new());
    }
    // Enough for every production script and its variants; past it, EVALs of arbitrary text are hashed anew.
    const MAX_BODIES: usize = 256;
    KNOWN.with_borrow_mut(|known| {
        if let Some((_, sha)) = known.get(&body.len()).and_then(|same| same.iter().find(|(b, _)| b == body)) {
            return sha.clone();
        }
        let sha = sha1_hex(body);
        if known.values().map(Vec::len).sum::<usize>() < MAX_BODIES {
            known.entry(body.len()).or_default().push((body.to_vec(), sha.clone()));
        }
        sha
    })
}

/// ASCII lower case, as Redis compares SHA1s.
fn lower(s: &[u8]) -> Vec<u8> {
    s.to_ascii_lowercase()
}
