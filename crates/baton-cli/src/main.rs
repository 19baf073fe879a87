//! `baton`: cluster-exclusive commands, a durable task queue and a
//! leaderless scheduler, on SQLite, PostgreSQL or Redis.

mod child;
mod command_task;
mod config;
mod http;
mod lock_cmd;
mod metrics;
mod queue_cmd;
mod runtime;
mod serve;

use std::process::ExitCode;
use std::time::Duration;

use anyhow::Context;
use clap::{Parser, Subcommand};

/// Exit code when the lock is held by someone else (EX_TEMPFAIL).
pub const EXIT_BUSY: u8 = 75;
/// Exit code for usage errors and bad input.
pub const EXIT_USAGE: u8 = 2;
/// Exit code when the lease was lost while the command ran (EX_SOFTWARE).
pub const EXIT_LEASE_LOST: u8 = 70;

#[derive(Parser, Debug)]
#[command(
    name = "baton",
    version,
    about = "Make scheduled and background work safe across many instances."
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where the store is: `--store`, else env `BATON_STORE`, else `sqlite://baton.db`.
#[derive(clap::Args, Debug, Clone)]
pub struct StoreArg {
    /// Store URL: sqlite://PATH, postgres://…, redis://…
    #[arg(long, env = "BATON_STORE", default_value = baton::DEFAULT_STORE_URL, global = true)]
    pub store: String,
    /// Table prefix (SQL) or key prefix (Redis).
    #[arg(long, env = "BATON_PREFIX", global = true)]
    pub prefix: Option<String>,
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
    /// Run the scheduler and workers for a config file's jobs and queues.
    Serve(serve::ServeArgs),
    /// Run a durable job now for a slot (idempotent per job and slot).
    Trigger(serve::TriggerArgs),
    /// List jobs (last slot, next fire, last run); pause or resume one.
    Jobs(serve::JobsArgs),
    /// Create or upgrade the store's schema.
    Migrate {
        #[command(flatten)]
        store: StoreArg,
    },
}

/// Parse a duration flag (`500ms`, `30s`, `15m`, `1h30m`, `PT15M`).
pub fn duration_arg(s: &str) -> Result<Duration, String> {
    baton::parse_duration("duration", s).map_err(|e| e.problem)
}

/// Parse an RFC 3339 time flag (`2026-01-31T06:00:00Z`).
pub fn rfc3339_arg(s: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    chrono::DateTime::parse_from_rfc3339(s)
        .map(|t| t.with_timezone(&chrono::Utc))
        .map_err(|e| format!("{s:?} is not an RFC 3339 time like 2026-01-31T06:00:00Z ({e})"))
}

/// Connect to the store named by the flags.
pub async fn connect(arg: &StoreArg) -> Result<baton::Store, baton::Error> {
    let opts = baton::StoreOptions {
        prefix: arg.prefix.clone(),
        ..Default::default()
    };
    Ok(baton::Store::connect_with(&arg.store, opts).await?)
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

fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_env("BATON_LOG").unwrap_or_else(|_| EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .init();
}

fn main() -> ExitCode {
    // A command's supervisor: before clap and tokio (see `child`).
    if let Some(code) = child::supervise_if_asked() {
        return ExitCode::from(code);
    }
    let cli = Cli::parse();
    init_tracing();
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("baton: cannot start the runtime: {e}");
            return ExitCode::from(1);
        }
    };
    let result = rt.block_on(async move {
        match cli.command {
            Command::Lock(a) => lock_cmd::lock(a).await,
            Command::Locks(a) => lock_cmd::locks(a).await,
            Command::Enqueue(a) => queue_cmd::enqueue(a).await,
            Command::Work(a) => queue_cmd::work(a).await,
            Command::Tasks(c) => queue_cmd::tasks(c).await,
            Command::Serve(a) => serve::serve(a).await,
            Command::Trigger(a) => serve::trigger(a).await,
            Command::Jobs(a) => serve::jobs(a).await,
            Command::Migrate { store } => {
                let s = connect(&store).await.context("migrate")?;
                println!("schema is up to date on {}", s.url());
                Ok(0)
            }
        }
    });
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            eprintln!("baton: {e:#}");
            ExitCode::from(exit_for(&e))
        }
    }
}
