//! `distlock`: list, inspect, watch and force-release the locks distlock clients hold on Redis.
//!
//! Everything it reads goes through the `distlock` library's own API (`Client::list_locks`, `lock_infos`,
//! `lock_waiters`, `force_unlock`), so it knows nothing of the record format itself.

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

mod commands;
mod connect;
mod render;
mod watch;

/// What each failure exits with (also in `--help` and the README).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Exit {
    /// Not a failure: the reader of the output went away (`distlock ls | head`).
    Quiet = 0,
    /// The lock named is not held (`show`, `release`).
    NotFound = 1,
    /// Bad arguments or a URL that cannot work (clap's own usage errors exit 2 too).
    Usage = 2,
    /// The server could not be reached, refused the password or a command (NOPERM), or failed.
    Server = 3,
    /// `release` was not confirmed: no terminal to ask on and no `--yes`, or the answer was not yes.
    Refused = 4,
}

/// A failure: what to print (one line) and how to exit.
#[derive(Debug)]
struct Failure {
    exit: Exit,
    message: String,
}

impl Failure {
    fn new(exit: Exit, message: impl Into<String>) -> Self {
        Self { exit, message: message.into() }
    }
}

impl From<distlock::LockError> for Failure {
    /// The library's messages already hide passwords and say what to do, in the terms of its API: here they
    /// name the tool's options instead.
    fn from(e: distlock::LockError) -> Self {
        let exit = match e {
            distlock::LockError::InvalidConfig(_) | distlock::LockError::InvalidKey { .. } => Exit::Usage,
            _ => Exit::Server,
        };
        Self::new(exit, in_cli_terms(&e.to_string()))
    }
}

/// What the library's hints call by its builder's names, and what the tool calls it.
const CLI_TERMS: &[(&str, &str)] = &[
    ("ClientBuilder::response_timeout", "--timeout"),
    ("ClientBuilder::connect_timeout", "--timeout"),
    ("ClientBuilder::key_prefix", "--prefix"),
    ("ClientBuilder::sentinel_primary_password", "--password-stdin"),
    ("ClientBuilder::redis_cluster(seeds)", "--cluster"),
    ("ClientBuilder::redis talks to one Redis server", "without --cluster, --url names one Redis server"),
    ("opt in with ClientBuilder::allow_insecure_tls(true)", "use a URL whose certificate can be checked"),
    ("give it in the URL,", "give it with --password-stdin, or in the URL,"),
    ("give it in the socket URL's query,", "give it with --password-stdin, or in the socket URL's query,"),
    (
        "give the sentinels' password in their URLs",
        "give the sentinels' password with --sentinel-password-stdin or in their URLs",
    ),
    ("Client::force_unlock deletes it, as does `distlock release`", "`distlock release` deletes it"),
];

/// `message` with the library's builder and API names replaced by the tool's options.
fn in_cli_terms(message: &str) -> String {
    CLI_TERMS.iter().fold(message.to_owned(), |text, (library, cli)| text.replace(library, cli))
}

impl From<std::io::Error> for Failure {
    fn from(e: std::io::Error) -> Self {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            return Self::new(Exit::Quiet, "");
        }
        Self::new(Exit::Server, format!("cannot write the output: {e}"))
    }
}

const EXIT_CODES: &str = "\
Exit codes:
  0  success (for `watch`, also when stopped with Ctrl-C)
  1  the lock is not held (`show`, `release`)
  2  bad arguments or a URL that cannot work
  3  the server could not be reached, refused the password or a command (NOPERM), or failed
  4  `release` not confirmed: no terminal to ask on and no --yes, or the answer was not yes";

/// Lists, inspects, watches and force-releases the locks distlock clients hold on Redis.
///
/// Reads with SCAN and one INFO script per lock; only `release` changes anything.
#[derive(Debug, Parser)]
#[command(name = "distlock", version, after_help = EXIT_CODES)]
struct Cli {
    #[command(flatten)]
    server: ServerArgs,
    #[command(subcommand)]
    command: Command,
}

/// Where the locks are.
#[derive(Debug, Args)]
struct ServerArgs {
    /// The Redis server: redis://[[USER]:PASSWORD@]HOST[:PORT][/DB], rediss://… or redis+unix:///PATH.
    /// Repeat it for a cluster's seeds, the sentinels or the Redlock servers. Default: $REDIS_URL, then
    /// redis://127.0.0.1:6379/
    #[arg(long, global = true, value_name = "URL")]
    url: Vec<String>,
    /// The key prefix the clients use (ClientBuilder::key_prefix).
    #[arg(long, global = true, default_value = "distlock:", value_name = "PREFIX")]
    prefix: String,
    /// Reads the password from the first line of standard input (instead of putting it in the URL, where
    /// the process list shows it). With --sentinel it is the data nodes' (the primary's).
    #[arg(long, global = true)]
    password_stdin: bool,
    /// With --sentinel and --password-stdin: the data nodes' ACL user (elsewhere, give it in the URL).
    #[arg(long, global = true, requires_all = ["sentinel", "password_stdin"], value_name = "USER")]
    user: Option<String>,
    /// With --sentinel: reads the sentinels' password from standard input, the line after the data nodes'
    /// when --password-stdin is given too (or give it in the sentinels' URLs).
    #[arg(long, global = true, requires = "sentinel")]
    sentinel_password_stdin: bool,
    /// The URLs are seeds of a Redis Cluster: every primary is scanned.
    #[arg(long, global = true, conflicts_with_all = ["sentinel", "redlock"])]
    cluster: bool,
    /// The URLs are sentinels; the locks are on the primary they name for this service.
    #[arg(long, global = true, value_name = "SERVICE", conflicts_with = "redlock")]
    sentinel: Option<String>,
    /// The URLs are the independent servers of a Redlock group.
    #[arg(long, global = true)]
    redlock: bool,
    /// The locks are in PostgreSQL, not Redis: postgres://USER[:PASSWORD]@HOST[:PORT]/DBNAME (or
    /// `host=… user=… dbname=…`). With --password-stdin, the password goes into this URL.
    #[arg(
        long,
        global = true,
        value_name = "URL",
        conflicts_with_all = ["url", "cluster", "sentinel", "redlock"]
    )]
    postgres: Option<String>,
    /// With --postgres: the schema distlock's tables are in (ClientBuilder::postgres_schema).
    #[arg(long, global = true, requires = "postgres", default_value = "distlock", value_name = "SCHEMA")]
    schema: String,
    /// How long connecting and each call may take.
    #[arg(long, global = true, default_value = "2s", value_parser = parse_duration, value_name = "DURATION")]
    timeout: Duration,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Lists the held locks whose names match PATTERN, sorted by name: name, how long held, lease left,
    /// fencing token, waiters, owner, metadata.
    Ls {
        /// Redis glob over lock names: `*`, `?`, `[abc]`, `\` to match the next character literally.
        #[arg(default_value = "*")]
        pattern: String,
        /// One JSON array of objects, for scripts.
        #[arg(long)]
        json: bool,
        /// Prints locks as they are found, in no order: starts at once and keeps no list of names (a lock
        /// may then appear twice if Redis resizes its table meanwhile).
        #[arg(long)]
        unsorted: bool,
    },
    /// Shows one lock in detail, with its wait queue.
    Show {
        /// The lock's name, as the program named it.
        key: String,
        /// One JSON object, for scripts.
        #[arg(long)]
        json: bool,
    },
    /// Frees a lock now, whoever holds it (Client::force_unlock), after asking for confirmation. Its holder
    /// is told at its next renewal; live waiters are woken to compete for it.
    Release {
        /// The lock's name, as the program named it.
        key: String,
        /// Do not ask; needed when standard input is not a terminal.
        #[arg(long, short)]
        yes: bool,
    },
    /// With --postgres: creates distlock's schema, tables and functions (or brings them to this version),
    /// as the role that should own them. Clients do it on first use too, if their role may.
    Migrate,
    /// A live view of the held locks, redrawn every interval, with hand-overs, releases and expiries as they
    /// are seen. Ctrl-C ends it.
    Watch {
        /// Redis glob over lock names, as for `ls`.
        #[arg(default_value = "*")]
        pattern: String,
        /// Time between refreshes.
        #[arg(long, default_value = "1s", value_parser = parse_duration, value_name = "DURATION")]
        interval: Duration,
        /// Stop after this many refreshes.
        #[arg(long, value_name = "N")]
        count: Option<u64>,
        /// The changes as JSON lines, one object a line: `event` (held at the first look, acquired,
        /// new_holder, finished, released, min_hold_over, expired), `time_ms` and the lock's fields as
        /// `ls --json` gives them (as last seen, once gone).
        #[arg(long)]
        json: bool,
    },
}

/// `500ms`, `2s`, `1m`.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = text.split_at(text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len()));
    let n: u64 = number.parse().map_err(|_| format!("`{text}` is not a duration like 500ms, 2s or 1m"))?;
    let d = match unit {
        "ms" => Duration::from_millis(n),
        "s" | "" => Duration::from_secs(n),
        "m" => Duration::from_secs(n * 60),
        _ => return Err(format!("`{text}` is not a duration like 500ms, 2s or 1m")),
    };
    if d.is_zero() {
        return Err("the duration must be above zero".into());
    }
    Ok(d)
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    show_warnings();
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => return fail(&Failure::new(Exit::Server, format!("cannot start the async runtime: {e}"))),
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure { exit: Exit::Quiet, .. }) => ExitCode::SUCCESS,
        Err(failure) => fail(&failure),
    }
}

/// Prints the library's warnings on standard error, one line each, never on standard output (which scripts
/// read): what a service's log would show, such as a Redlock server that did not answer while the others did
/// (the command goes on without it), or a server whose eviction policy may drop lock records.
fn show_warnings() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_max_level(tracing_subscriber::filter::LevelFilter::WARN)
        .without_time()
        .with_target(false)
        .init();
}

fn fail(failure: &Failure) -> ExitCode {
    // One line, whatever the message holds.
    let line: String = failure.message.chars().map(|c| if c.is_control() { ' ' } else { c }).collect();
    eprintln!("distlock: {line}");
    ExitCode::from(failure.exit as u8)
}

async fn run(cli: Cli) -> Result<(), Failure> {
    if cli.server.redlock && matches!(cli.command, Command::Ls { unsorted: true, .. }) {
        return Err(Failure::new(
            Exit::Usage,
            "--unsorted on Redlock would list each lock once per server holding it: leave --unsorted out",
        ));
    }
    if matches!(cli.command, Command::Migrate) && cli.server.postgres.is_none() {
        return Err(Failure::new(Exit::Usage, "migrate is for PostgreSQL: give --postgres URL"));
    }
    let client = connect::client(&cli.server).await?;
    match cli.command {
        Command::Migrate => {
            drop(client);
            println!("schema `{}` is ready", cli.server.schema);
            Ok(())
        }
        Command::Ls { pattern, json, unsorted } => commands::ls(&client, &pattern, json, unsorted).await,
        Command::Show { key, json } => commands::show(&client, &key, json).await,
        Command::Release { key, yes } => commands::release(&client, &key, yes).await,
        Command::Watch { pattern, interval, count, json } => {
            watch::watch(&client, &pattern, interval, count, json).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::in_cli_terms;

    /// The hints the library gives for a slow server, a missing password, another program's key and a
    /// sentinel's password come out naming the tool's options.
    #[test]
    fn hints_name_the_tool_s_options() {
        let cases = [
            ("check that it is up and not overloaded, or raise ClientBuilder::response_timeout", "raise --timeout"),
            ("give distlock a key prefix of its own (ClientBuilder::key_prefix)", "(--prefix)"),
            ("the primary's with ClientBuilder::sentinel_primary_password", "the primary's with --password-stdin"),
            ("give the sentinels' password in their URLs (redis://", "with --sentinel-password-stdin or in their URLs"),
            ("the server requires a password: give it in the URL, redis://:PASSWORD@HOST:PORT/", "--password-stdin"),
        ];
        for (library, cli) in cases {
            let text = in_cli_terms(library);
            assert!(text.contains(cli) && !text.contains("ClientBuilder"), "{library:?} became {text:?}");
        }
    }
}
