//! `baton`: cluster-exclusive commands, a durable task queue and a
//! leaderless scheduler, on SQLite, PostgreSQL or Redis.

mod admin;
mod audit_cmd;
mod chaos;
mod child;
mod command_task;
mod config;
mod enqueue_cmd;
mod http_client;
mod jobs_cmd;
mod lock_cmd;
#[cfg(feature = "otel")]
mod otel;
mod output;
mod pause_args;
mod queue_cmd;
mod queues_cmd;
mod runtime;
mod serve;
mod shapes;
mod stored_jobs;
mod task_search;
mod tasks_delete;
mod tasks_view;
mod values;

/// mimalloc rather than the system allocator: a worker's per-task
/// allocations cost ~6k fewer instructions a task (library users pick
/// their own allocator; `docs/GUIDE.md` says what it is worth).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

use values::pool_size_arg;

/// Exit code when the lock is held by someone else (EX_TEMPFAIL).
pub const EXIT_BUSY: u8 = 75;
/// Exit code for usage errors and bad input.
pub const EXIT_USAGE: u8 = 2;
/// Exit code when the lease was lost while the command ran (EX_SOFTWARE).
pub const EXIT_LEASE_LOST: u8 = 70;
/// Exit code when the task or job named does not exist (EX_NOINPUT).
pub const EXIT_NOT_FOUND: u8 = 66;
/// Exit code when the task's state does not allow the request (cancel of a
/// finished task, retry of a running one or of a lock-mode run's record):
/// the CLI's 409 (EX_DATAERR).
pub const EXIT_CONFLICT: u8 = 65;

/// The shortest lock lease (`baton lock --at-most`, a lock-mode job's
/// `at_most`): a shorter one leaves no time for the keep-alive's round trip
/// and for stopping the command, so every run would end "lease lost".
pub const MIN_LOCK_AT_MOST: Duration = Duration::from_secs(1);

/// The longest `--prefix` (as the stores accept).
const MAX_PREFIX: usize = 32;

#[derive(Parser, Debug)]
#[command(
    name = "baton",
    version,
    about = "Make scheduled and background work safe across many instances."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
    /// Log format on stderr: `text` (colours only on a terminal) or `json`
    /// (one object per line). Levels and targets with env `BATON_LOG`
    /// (e.g. `info`, `baton=debug`; default `info` for serve and work, else
    /// `warn`).
    #[arg(
        long,
        env = "BATON_LOG_FORMAT",
        value_enum,
        default_value = "text",
        global = true
    )]
    log_format: LogFormat,
}

/// How log lines are written (see `--log-format`).
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
enum LogFormat {
    /// Human-readable lines; ANSI colours only when stderr is a terminal.
    Text,
    /// One JSON object per line (timestamp, level, message, fields, span).
    Json,
}

/// Where the store is, resolved one way for every command (see
/// [`StoreArg::resolve`]): `--store`, else env `BATON_STORE`, else the
/// config file's `store` (`--config` / env `BATON_CONFIG`), else
/// `sqlite://baton.db`; the prefix likewise (`--prefix`, `BATON_PREFIX`,
/// the config's `prefix`, the store's default), and the pool size
/// (`--pool-size`, `BATON_POOL_SIZE`, the config's `pool_size`, the URL's
/// `pool_size`, 16).
#[derive(clap::Args, Debug, Clone, Default)]
pub struct StoreArg {
    /// Store URL: sqlite://PATH, postgres://…, mysql://…, redis://…
    /// [default: the config file's `store`, else sqlite://baton.db]
    #[arg(long, env = "BATON_STORE", global = true)]
    pub store: Option<String>,
    /// Table prefix (SQL) or key prefix (Redis): at most 32 ASCII letters,
    /// digits, '_', ':' or '-' [default: the config file's `prefix`, else
    /// the store's own]
    #[arg(long, env = "BATON_PREFIX", global = true)]
    pub prefix: Option<String>,
    /// Most connections to a PostgreSQL or MySQL store (1 to 10000); they
    /// are opened as work needs them and closed again when idle [default:
    /// the config file's `pool_size`, else the URL's `pool_size`, else 16]
    #[arg(long, env = "BATON_POOL_SIZE", global = true, value_parser = pool_size_arg)]
    pub pool_size: Option<u32>,
    /// A `baton serve` config file (TOML): its `store` and `prefix` are used
    /// when `--store` / `--prefix` (and their env vars) are not given, and
    /// `serve`, `work`, `trigger` and `jobs` read its queues and jobs.
    #[arg(long, env = "BATON_CONFIG", global = true, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
}

/// The store a command uses, and where its URL came from.
#[derive(Debug, Clone)]
pub struct Resolved {
    /// The store URL.
    pub url: String,
    /// The table or key prefix, when one is set.
    pub prefix: Option<String>,
    /// The pool size given by `--pool-size`, `BATON_POOL_SIZE` or the
    /// config file (the URL's `pool_size` is read by the store itself),
    /// with where it came from.
    pub pool_size: Option<(u32, &'static str)>,
}

impl StoreArg {
    /// The config file named by `--config` / `BATON_CONFIG`, read and
    /// validated; `None` when none is named. A bad file is a usage error
    /// (exit 2) naming the file, the line or the job/queue, and the field.
    pub fn config(&self) -> anyhow::Result<Option<config::Config>> {
        match &self.config {
            None => Ok(None),
            Some(path) => config::Config::from_file(path).map(Some).map_err(|e| {
                baton::Error::Invalid(baton::InvalidInput::new("--config", e.to_string())).into()
            }),
        }
    }

    /// The store URL and prefix: `--store` (or env `BATON_STORE`), else the
    /// config file's `store`, else [`baton::DEFAULT_STORE_URL`]; the prefix
    /// from `--prefix` (`BATON_PREFIX`), else the config's `prefix`.
    pub fn resolve(&self, cfg: Option<&config::Config>) -> Resolved {
        let url = self
            .store
            .clone()
            .or_else(|| cfg.and_then(|c| c.store.clone()))
            .unwrap_or_else(|| baton::DEFAULT_STORE_URL.to_string());
        let prefix = self
            .prefix
            .clone()
            .or_else(|| cfg.and_then(|c| c.prefix.clone()));
        let pool_size = self
            .pool_size
            .map(|n| (n, "--pool-size (or BATON_POOL_SIZE)"))
            .or_else(|| {
                cfg.and_then(|c| c.pool_size)
                    .map(|n| (n, "the config's pool_size"))
            });
        Resolved {
            url,
            prefix,
            pool_size,
        }
    }

    /// The config file's path as messages name it.
    pub fn config_name(&self) -> String {
        self.config
            .as_ref()
            .map_or_else(|| "the config".to_string(), |p| p.display().to_string())
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run CMD only while holding the lock NAME (cluster-exclusive).
    Lock(lock_cmd::LockArgs),
    /// List locks: name, holder, token, locked_at, lock_until, held/expired.
    Locks(lock_cmd::LocksArgs),
    /// Enqueue a command as a durable task; prints its id.
    Enqueue(queue_cmd::EnqueueArgs),
    /// Run command tasks from the queue(s) as child processes.
    Work(queue_cmd::WorkArgs),
    /// Inspect and manage tasks.
    #[command(subcommand)]
    Tasks(queue_cmd::TasksCmd),
    /// List the queues (counts, paused, the last pause's note); pause or
    /// resume one, cluster-wide.
    Queues(queues_cmd::QueuesArgs),
    /// Run the scheduler and workers for a config file's jobs and queues.
    Serve(serve::ServeArgs),
    /// Run a durable job now for a slot (idempotent per job and slot).
    Trigger(serve::TriggerArgs),
    /// List jobs (policies, last slot, next fire, last run, pause note);
    /// show one; pause or resume one with a note.
    Jobs(jobs_cmd::JobsArgs),
    /// Check a store Jepsen-style: a workload, a nemesis, a history, a checker.
    Chaos(chaos::ChaosArgs),
    /// The audit log, newest first: who did what to which target, from
    /// where, and how it ended.
    Audit(audit_cmd::AuditArgs),
    /// Create or upgrade the store's schema (or, with --remove --yes,
    /// remove it with all its data).
    Migrate {
        #[command(flatten)]
        store: StoreArg,
        /// Remove baton's schema at the prefix instead: every task, lock,
        /// job cursor and queue flag (the tables and sequence, or the
        /// Redis keys, baton made; nothing else). Stop every baton process
        /// on the prefix first. Needs --yes.
        #[arg(long)]
        remove: bool,
        /// Confirm --remove.
        #[arg(long, requires = "remove")]
        yes: bool,
    },
    /// Print a shell completion script (e.g. `baton completions bash >
    /// /etc/bash_completion.d/baton`).
    Completions {
        /// The shell: bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff; e.g. `baton man | man -l -`).
    Man,
}

/// Connect to the store named by the flags (resolved as
/// [`StoreArg::resolve`] says, reading the config file when one is named).
/// A failure says what went wrong (refused, timed out, wrong protocol, TLS,
/// authentication, a bad SQLite path) and names the URL, with any password
/// hidden.
pub async fn connect(arg: &StoreArg) -> anyhow::Result<baton::Store> {
    let cfg = arg.config()?;
    connect_resolved(&arg.resolve(cfg.as_ref()), true).await
}

/// Connect to a resolved store (see [`connect`]).
pub async fn connect_resolved(r: &Resolved, migrate: bool) -> anyhow::Result<baton::Store> {
    if let Some(p) = &r.prefix {
        if p.len() > MAX_PREFIX {
            return Err(baton::Error::from(baton::InvalidInput::new(
                "--prefix",
                format!(
                    "is {} bytes long; use at most {MAX_PREFIX} ASCII letters, digits, '_', ':' or '-'",
                    p.len()
                ),
            ))
            .into());
        }
    }
    let mut opts = baton::StoreOptions {
        prefix: r.prefix.clone(),
        migrate,
        ..Default::default()
    };
    if let Some((n, from)) = r.pool_size {
        // The URL's own pool_size would win in the library: one given two
        // ways must agree, so no setting is silently ignored.
        match baton::store::url_pool_size(&r.url) {
            Ok(Some(u)) if u != n => {
                return Err(baton::Error::from(baton::InvalidInput::new(
                    "--pool-size",
                    format!(
                        "{from} says {n} but the store URL's pool_size says {u}; give the pool size one way"
                    ),
                ))
                .into())
            }
            // A bad URL value is reported by the store as it connects.
            _ => opts.max_connections = n,
        }
    }
    match baton::Store::connect_with(&r.url, opts).await {
        Ok(s) => Ok(s),
        // A bad URL or option already says what and where.
        Err(e @ baton::StoreError::Config(_)) => Err(baton::Error::from(e).into()),
        Err(e) => {
            let mut why = connect_failure(&r.url, &e);
            if why.is_none() {
                why = probe_tcp(&r.url).await;
            }
            let why = why.unwrap_or_else(|| "cannot connect".into());
            Err(anyhow::Error::from(baton::Error::from(e))
                .context(format!("store {}: {why}", baton::store::redact(&r.url))))
        }
    }
}

/// `host:port` of a network store URL (default ports for postgres, redis
/// and mysql).
fn host_port(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    let default = match scheme {
        "postgres" | "postgresql" => 5432,
        "redis" | "rediss" => 6379,
        "mysql" | "mariadb" => 3306,
        _ => return None,
    };
    let authority = rest.split(['/', '?']).next()?;
    let hostport = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if hostport.is_empty() {
        return None;
    }
    let has_port = match hostport.rfind(']') {
        Some(close) => hostport[close..].contains(':'),
        None => hostport.contains(':'),
    };
    Some(if has_port {
        hostport.to_string()
    } else {
        format!("{hostport}:{default}")
    })
}

/// When the store's own error does not say why (PostgreSQL's pool turns a
/// refused connection into a pool timeout), try a plain TCP connection.
async fn probe_tcp(url: &str) -> Option<String> {
    let addr = host_port(url)?;
    let attempt = tokio::net::TcpStream::connect(addr.as_str());
    Some(
        match tokio::time::timeout(Duration::from_secs(3), attempt).await {
            Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionRefused => format!(
                "connection refused at {addr}: nothing accepts connections there (is the server running, on that host and port?)"
            ),
            Ok(Err(e)) => format!("cannot reach {addr}: {e}"),
            Err(_) => format!(
                "timed out: {addr} does not answer (check the host, port and firewall)"
            ),
            Ok(Ok(_)) => format!(
                "wrong protocol: {addr} accepts connections but did not answer as this store does (check the port, the URL scheme and TLS)"
            ),
        },
    )
}

/// Print the store's configuration warnings (e.g. Redis without AOF) on
/// stderr, once at the start of a command that runs work under the store's
/// guarantees (`lock`, `work`, `serve`).
pub async fn note_store_warnings(store: &baton::Store) {
    for w in store.warnings().await.unwrap_or_default() {
        note!("baton: warning: {w}");
    }
}

/// What a connection failure means, from its error chain (the drivers
/// carry their cause as text); `None` when the chain does not tell.
fn connect_failure(url: &str, e: &baton::StoreError) -> Option<String> {
    // A read-only server answered: its own words say it.
    if e.is_read_only() {
        return None;
    }
    let msg = baton::error::chain(e).to_ascii_lowercase();
    let has = |needles: &[&str]| needles.iter().any(|n| msg.contains(n));
    // A cluster node reached as one server: the library's words say what
    // to write instead (and name TLS, which the sorting below would take
    // for a TLS failure).
    if has(&["is a cluster node"]) {
        return None;
    }
    if url.starts_with("sqlite:") && has(&["unable to open", "code: 14", "(code 14)"]) {
        let path = url
            .trim_start_matches("sqlite://")
            .trim_start_matches("sqlite:");
        let path = std::path::Path::new(path.split('?').next().unwrap_or(path));
        if path.is_dir() {
            return Some(format!(
                "{} is a directory; give a file path",
                path.display()
            ));
        }
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            if !parent.is_dir() {
                return Some(format!(
                    "the directory {} does not exist; create it first",
                    parent.display()
                ));
            }
        }
        return Some(format!(
            "cannot open {} (check permissions)",
            path.display()
        ));
    }
    let what = if has(&["connection refused", "os error 111"]) {
        "connection refused: nothing accepts connections there (is the server running, on that host and port?)"
    } else if has(&[
        "password authentication failed",
        "authentication",
        "wrongpass",
        "noauth",
        "invalid password",
        "invalid username-password",
    ]) {
        "authentication failed: check the user name and password"
    } else if has(&["certificate", "tls", "ssl", "handshake"]) {
        "TLS failed: check the certificate, the server's TLS setup and the URL scheme"
    } else if has(&[
        "failed to lookup address",
        "name or service not known",
        "no address associated",
        "temporary failure in name resolution",
    ]) {
        "host name not found"
    } else if has(&[
        "protocol",
        "unexpected response",
        "invalid response",
        "unexpected message",
        "response was",
        "parse error",
        "unexpected end of file",
        "connection reset",
        "early eof",
        "expected to read",
    ]) {
        "wrong protocol: the server there does not speak this store's protocol (check the port and the URL scheme)"
    } else if has(&["does not exist"]) {
        "the database does not exist; create it first"
    } else {
        return None;
    };
    Some(what.into())
}

/// The exit code for a library error: 2 for bad input or configuration.
pub fn exit_for(e: &anyhow::Error) -> u8 {
    match e.downcast_ref::<baton::Error>() {
        Some(baton::Error::Invalid(_))
        | Some(baton::Error::Store(baton::StoreError::Config(_))) => EXIT_USAGE,
        Some(baton::Error::Busy { .. }) => EXIT_BUSY,
        Some(baton::Error::LeaseLost(_)) => EXIT_LEASE_LOST,
        _ => 1,
    }
}

/// Logs on stderr in `format`. The daemons (`serve`, `work`) log at info
/// by default: a line per task start and end, hand-backs, rescues, skipped
/// slots; one-shot commands at warn. `BATON_LOG` overrides either.
fn init_tracing(format: LogFormat, daemon: bool) {
    use std::io::IsTerminal;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    use tracing_subscriber::{EnvFilter, Layer};
    // sqlx's own warnings (slow statements) are noise here: errors only.
    let default = if daemon {
        "info,sqlx=error"
    } else {
        "warn,sqlx=error"
    };
    let filter = EnvFilter::try_from_env("BATON_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match format {
        LogFormat::Text => fmt
            .with_ansi(std::io::stderr().is_terminal())
            .with_target(false)
            .boxed(),
        LogFormat::Json => {
            output::log_json(true);
            fmt.json()
                .flatten_event(true)
                .with_current_span(true)
                .with_span_list(false)
                .boxed()
        }
    };
    let registry = tracing_subscriber::registry().with(filter).with(fmt);
    #[cfg(feature = "otel")]
    let registry = registry.with(otel::layer());
    registry.init();
}

/// `baton migrate`: create the schema, upgrade it, or say it was already
/// up to date — decided by the schema version recorded before (none: a
/// fresh store).
async fn migrate(store: StoreArg) -> anyhow::Result<u8> {
    // Read the recorded version before migrating (a read only; a SQL store
    // without baton's tables, or a Redis prefix without data, has none).
    let r = store.resolve(store.config()?.as_ref());
    let probe = connect_resolved(&r, false).await.context("migrate")?;
    let before = probe
        .schema_status()
        .await
        .map_err(baton::Error::from)
        .context("migrate")?;
    drop(probe);
    let s = output::progress(
        format!(
            "baton: migrating the schema on {}",
            baton::store::redact(&r.url)
        ),
        connect_resolved(&r, true),
    )
    .await
    .context("migrate")?;
    let prefix = r.prefix.as_deref().unwrap_or("(default)");
    let to = before.expected;
    let redis_layout = s.kind() == "redis"
        && before
            .found
            .is_some_and(|v| v < baton::store::redis::CLUSTER_LAYOUT_VERSION);
    match before.found {
        None => outln!(
            "created the baton schema (version {to}) on {} (prefix {prefix})",
            s.url()
        ),
        Some(from) if from < to => outln!(
            "upgraded the baton schema from v{from} to v{to} on {} (prefix {prefix})",
            s.url()
        ),
        Some(_) => outln!(
            "schema already up to date (version {to}) on {} (prefix {prefix})",
            s.url()
        ),
    }
    if redis_layout {
        outln!(
            "note: schema v{} moved every key to one hash tag per queue and per lock \
             (Redis Cluster ready); baton processes of an older version must not run on \
             this store any more: stop them (they would keep writing the old keys) and \
             start this version",
            baton::store::redis::CLUSTER_LAYOUT_VERSION
        );
    }
    Ok(0)
}

/// `baton migrate --remove`: remove the schema at the prefix, once
/// confirmed with `--yes` (without it, say what would go and change
/// nothing).
async fn remove_schema(store: StoreArg, yes: bool) -> anyhow::Result<u8> {
    let r = store.resolve(store.config()?.as_ref());
    let s = connect_resolved(&r, false)
        .await
        .context("migrate --remove")?;
    let found = s
        .schema_status()
        .await
        .map_err(baton::Error::from)
        .context("migrate --remove")?
        .found;
    let prefix = r.prefix.as_deref().unwrap_or("(default)");
    let what = match found {
        Some(v) => format!("the baton schema (version {v})"),
        None => "what is left of a baton schema (no version is recorded)".into(),
    };
    if !yes {
        return Err(baton::Error::from(baton::InvalidInput::new(
            "--yes",
            format!(
                "--remove would delete {what} on {} (prefix {prefix}), with every task, \
                 lock, job cursor and queue flag in it; add --yes to do it",
                s.url()
            ),
        ))
        .into());
    }
    s.remove_schema()
        .await
        .map_err(baton::Error::from)
        .context("migrate --remove")?;
    outln!("removed {what} on {} (prefix {prefix})", s.url());
    Ok(0)
}

fn completions(shell: clap_complete::Shell) -> anyhow::Result<u8> {
    use clap::CommandFactory;
    let mut buf = Vec::new();
    clap_complete::generate(shell, &mut Cli::command(), "baton", &mut buf);
    write_all_stdout(&buf)
}

fn man() -> anyhow::Result<u8> {
    use clap::CommandFactory;
    let mut buf = Vec::new();
    clap_mangen::Man::new(Cli::command()).render(&mut buf)?;
    write_all_stdout(&buf)
}

fn write_all_stdout(buf: &[u8]) -> anyhow::Result<u8> {
    use std::io::Write;
    match std::io::stdout().lock().write_all(buf) {
        Ok(()) => Ok(0),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(output::Closed.into()),
        Err(e) => Err(e.into()),
    }
}

fn main() -> ExitCode {
    // A command's supervisor: before clap and tokio (see `child`).
    if let Some(code) = child::supervise_if_asked(chaos::history::date_deadline_kill) {
        return ExitCode::from(code);
    }
    let mut cli = Cli::parse();
    // A `baton chaos` run's instance: its own command, with the verifier's
    // stop hook installed (nothing else installs it).
    if let Command::Chaos(a) = &cli.command {
        if let Some(args) = a.become_instance() {
            cli = Cli::parse_from(std::iter::once("baton".to_string()).chain(args));
        }
    }
    let daemon = matches!(cli.command, Command::Serve(_) | Command::Work(_));
    init_tracing(cli.log_format, daemon);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            note!("baton: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = rt.block_on(async move {
        match cli.command {
            Command::Lock(a) => lock_cmd::lock(a).await,
            Command::Locks(a) => lock_cmd::locks(a).await,
            Command::Audit(a) => audit_cmd::run(a).await,
            Command::Enqueue(a) => queue_cmd::enqueue(a).await,
            Command::Work(a) => queue_cmd::work(a).await,
            Command::Tasks(c) => queue_cmd::tasks(c).await,
            Command::Queues(a) => queues_cmd::queues(a).await,
            Command::Serve(a) => serve::serve(a).await,
            Command::Trigger(a) => serve::trigger(a).await,
            Command::Jobs(a) => jobs_cmd::jobs(a).await,
            Command::Chaos(a) => chaos::chaos(a).await,
            Command::Migrate {
                store,
                remove: true,
                yes,
            } => remove_schema(store, yes).await,
            Command::Migrate { store, .. } => migrate(store).await,
            Command::Completions { shell } => completions(shell),
            Command::Man => man(),
        }
    });
    #[cfg(feature = "otel")]
    otel::shutdown();
    match result {
        Ok(code) => ExitCode::from(code),
        // The reader of stdout went away (`| head`): it took what it wanted.
        Err(e) if e.downcast_ref::<output::Closed>().is_some() => ExitCode::SUCCESS,
        Err(e) => {
            note!("baton: {}", error_chain(&e));
            ExitCode::from(exit_for(&e))
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    /// `--help` explains every flag and positional of every command.
    #[test]
    fn every_argument_has_help() {
        fn walk(cmd: &clap::Command, path: &str, missing: &mut Vec<String>) {
            for arg in cmd.get_arguments() {
                if arg.get_help().is_none() && arg.get_long_help().is_none() {
                    missing.push(format!("{path} {}", arg.get_id()));
                }
            }
            for sub in cmd.get_subcommands() {
                if sub.get_about().is_none() {
                    missing.push(format!("{path} {} (no about)", sub.get_name()));
                }
                walk(sub, &format!("{path} {}", sub.get_name()), missing);
            }
        }
        let mut missing = Vec::new();
        walk(&super::Cli::command(), "baton", &mut missing);
        assert!(missing.is_empty(), "no help text: {missing:?}");
    }
}

/// An error and its causes on one line, `: `-separated, leaving out a
/// cause whose text the line already holds (a store error carries its
/// driver's error as its source and repeats its words).
fn error_chain(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod error_chain_tests {
    use super::error_chain;

    #[derive(Debug)]
    struct Driver;
    impl std::fmt::Display for Driver {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("connection refused")
        }
    }
    impl std::error::Error for Driver {}

    #[derive(Debug)]
    struct Wrapped(Driver);
    impl std::fmt::Display for Wrapped {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "store unavailable: {}", self.0)
        }
    }
    impl std::error::Error for Wrapped {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_cause_already_in_the_line_is_not_repeated() {
        let e = anyhow::Error::from(Wrapped(Driver)).context("migrate");
        assert_eq!(
            error_chain(&e),
            "migrate: store unavailable: connection refused"
        );
    }
}
