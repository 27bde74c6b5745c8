//! The command table: each simulated command's name, arity and flags as redis-server 7.0 declares them
//! (`commands.def`), and how a call finds its command, for clients and for scripts alike.

use super::keyspace::{Ctx, Keyspace};
use super::reply::Reply;
use super::{generic as ks, strings, zrange, zset};

/// A command that reads or writes the keyspace.
pub(super) type DataFn = fn(&mut Keyspace, &mut Ctx, &[Vec<u8>]) -> Reply;

/// What running a command means.
#[derive(Debug, Clone, Copy)]
pub(super) enum Kind {
    /// A keyspace command, which scripts may call too.
    Data(DataFn),
    /// EVAL.
    Eval,
    /// EVALSHA.
    EvalSha,
    /// SCRIPT LOAD.
    ScriptLoad,
    /// SCRIPT EXISTS.
    ScriptExists,
    /// SCRIPT FLUSH.
    ScriptFlush,
    /// SCRIPT KILL.
    ScriptKill,
}

/// One command.
#[derive(Debug)]
pub(super) struct Command {
    /// Its name in errors: `get`, or `script|load` for a subcommand.
    pub(super) full_name: &'static str,
    /// Redis's arity: exactly n arguments (the name counted), or at least -n when negative.
    pub(super) arity: i32,
    /// Whether scripts may not call it (Redis's `noscript` flag).
    pub(super) noscript: bool,
    /// What it does.
    pub(super) kind: Kind,
}

impl Command {
    /// Whether `argc` arguments (the name included) fit its arity.
    pub(super) fn arity_fits(&self, argc: usize) -> bool {
        let argc = i64::try_from(argc).unwrap_or(i64::MAX);
        let arity = i64::from(self.arity);
        if arity >= 0 {
            argc == arity
        } else {
            argc >= -arity
        }
    }
}

/// A plain command.
const fn data(full_name: &'static str, arity: i32, run: DataFn) -> Command {
    Command { full_name, arity, noscript: false, kind: Kind::Data(run) }
}

/// A command scripts may not call.
const fn server(full_name: &'static str, arity: i32, kind: Kind) -> Command {
    Command { full_name, arity, noscript: true, kind }
}

/// Every command the simulated server knows, but SCRIPT's subcommands.
static COMMANDS: [Command; 24] = [
    data("get", 2, strings::get),
    data("set", -3, strings::set),
    data("setrange", 4, strings::setrange),
    data("getrange", 4, strings::getrange),
    data("getdel", 2, strings::getdel),
    data("pexpire", -3, ks::pexpire),
    data("pttl", 2, ks::pttl),
    data("del", -2, ks::del),
    data("exists", -2, ks::exists),
    data("type", 2, ks::type_of),
    data("time", 1, ks::time),
    data("zadd", -4, zset::zadd),
    data("zscore", 3, zset::zscore),
    data("zrem", -3, zset::zrem),
    data("zrange", -4, zrange::zrange),
    data("zpopmin", -2, zset::zpopmin),
    data("zcard", 2, zset::zcard),
    data("publish", 3, ks::publish),
    data("spublish", 3, ks::spublish),
    data("scan", -2, ks::scan),
    data("ping", -1, ks::ping),
    data("echo", 2, ks::echo),
    server("eval", -3, Kind::Eval),
    server("evalsha", -3, Kind::EvalSha),
];

/// SCRIPT itself: a container, whose arity applies when no subcommand is named.
static SCRIPT: Command = server("script", -2, Kind::ScriptKill);

/// SCRIPT's subcommands the simulated server knows.
static SCRIPT_SUBCOMMANDS: [(&str, Command); 4] = [
    ("load", server("script|load", 3, Kind::ScriptLoad)),
    ("exists", server("script|exists", -3, Kind::ScriptExists)),
    ("flush", server("script|flush", -2, Kind::ScriptFlush)),
    ("kill", server("script|kill", 2, Kind::ScriptKill)),
];

/// What looking a call's command up found.
#[derive(Debug)]
pub(super) enum Lookup {
    /// The command, its arity still to check.
    Found(&'static Command),
    /// A container command with a subcommand it does not have.
    UnknownSubcommand,
    /// No such command.
    Unknown,
}

/// `lookupCommand`: the command named by `args[0]` (any case), or SCRIPT's subcommand named by `args[1]`.
pub(super) fn lookup(args: &[Vec<u8>]) -> Lookup {
    let Some(name) = args.first() else { return Lookup::Unknown };
    if name.eq_ignore_ascii_case(b"script") {
        return match args.get(1) {
            None => Lookup::Found(&SCRIPT),
            Some(sub) => SCRIPT_SUBCOMMANDS
                .iter()
                .find(|(n, _)| sub.eq_ignore_ascii_case(n.as_bytes()))
                .map_or(Lookup::UnknownSubcommand, |(_, c)| Lookup::Found(c)),
        };
    }
    COMMANDS.iter().find(|c| name.eq_ignore_ascii_case(c.full_name.as_bytes())).map_or(Lookup::Unknown, Lookup::Found)
}

/// What a client gets for a command it may not run as sent: unknown, an unknown subcommand, or the wrong
/// number of arguments; `None` when `lookup` found it and its arity fits.
pub(super) fn refusal(args: &[Vec<u8>], found: &Lookup) -> Option<Reply> {
    // `%.128s` and `%.*s` of C strings: each up to its first NUL.
    let c_str = |s: &[u8]| s.split(|&c| c == 0).next().unwrap_or_default().to_vec();
    match found {
        Lookup::Found(command) if command.arity_fits(args.len()) => None,
        Lookup::Found(command) => {
            Some(Reply::error(format!("ERR wrong number of arguments for '{}' command", command.full_name)))
        }
        Lookup::UnknownSubcommand => {
            let mut sub = c_str(args.get(1).map_or(&[][..], Vec::as_slice));
            sub.truncate(128);
            let container = String::from_utf8_lossy(&c_str(&args[0])).to_uppercase();
            let tail = format!("'. Try {container} HELP.");
            Some(Reply::formatted_error([b"ERR unknown subcommand '".as_slice(), &sub, tail.as_bytes()].concat()))
        }
        Lookup::Unknown => {
            let mut name = c_str(args.first().map_or(&[][..], Vec::as_slice));
            name.truncate(128);
            let mut shown = Vec::new();
            for arg in args.iter().skip(1) {
                if shown.len() >= 128 {
                    break;
                }
                let mut arg = c_str(arg);
                arg.truncate(128 - shown.len());
                shown.push(b'\'');
                shown.extend_from_slice(&arg);
                shown.extend_from_slice(b"' ");
            }
            let text = [b"ERR unknown command '".as_slice(), &name, b"', with args beginning with: ", &shown];
            Some(Reply::formatted_error(text.concat()))
        }
    }
}
