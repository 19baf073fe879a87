//! The `baton serve --config FILE` file: queues and scheduled jobs, in TOML.
//!
//! ```toml
//! store = "sqlite://baton.db"        # optional; --store / BATON_STORE win
//! prefix = "app1"                    # optional; --prefix / BATON_PREFIX win
//! pool_size = 4                      # optional; PostgreSQL/MySQL connections at most;
//!                                    # --pool-size / BATON_POOL_SIZE win, then this,
//!                                    # then the URL's ?pool_size=, then 16
//!
//! [[queue]]
//! name = "default"
//! concurrency = 2                    # default 1
//! lease = "30s"                      # default 30s
//! # max_running = 5                  # cluster-wide cap, all instances together
//! # per_key_max_running = 2          # cluster-wide cap per concurrency key
//! # rate = "100/1m"                  # at most 100 starts a minute, all instances
//! # per_key_rate = "10/1m"           # at most 10 starts a minute per concurrency key
//! #                                  # (or "partner-api=10/1s": a named limit shared by queues)
//! # fair = true                      # claims interleave concurrency keys (SQLite, PostgreSQL)
//!
//! [[job]]
//! name = "tick"
//! every = "1s"                       # or cron = "0 */6 * * *" (+ tz = "Asia/Seoul")
//! command = ["sh", "-c", "echo $BATON_SLOT >> ledger"]
//! # or http = { method = "POST", url = "https://…", headers = { A = "b" }, body = "…" }
//! queue = "default"                  # durable mode; default "default"
//! mode = "durable"                   # or "lock" with at_most = "15m", at_least = "30s"
//! misfire = "latest"                 # latest | all | none
//! max_catch_up = 100                 # misfire = "all"/"none": at most this many
//! grace = "1m"                       # misfire = "none": how late a slot may still run
//! overlap = "skip"                   # durable mode: skip (alias forbid) | allow | buffer_one | buffer_all | cancel_other | terminate_other
//! max_attempts = 3                   # durable mode
//! timeout = "5m"                     # per attempt; default none
//! jitter = "0s"
//! priority = 0                       # durable mode; -100..=100, lower runs first
//! ```
//!
//! Decisions:
//!
//! - Unknown keys are errors (the TOML parser's message, with line and
//!   column), so a misspelt `max_atempts` does not silently fall back to a
//!   default.
//! - The queue `default` exists even when not declared (concurrency 1, lease
//!   30 s), so a file with jobs only works. Any other queue a job names must
//!   be declared with `[[queue]]`: a misspelt queue name is an error rather
//!   than a new, silently created queue.
//! - `mode = "lock"` runs the action in-process under a lease lock (no queue,
//!   no retries): it needs `at_most`, may have `at_least` (default 0, at most
//!   `at_most`), and rejects the queue-only keys `queue`, `max_attempts`,
//!   `priority` and `overlap` (the lock itself forbids overlap). `at_most`
//!   and `at_least` are rejected in durable mode.
//! - Names (jobs and queues) are 1..=255 bytes without control characters,
//!   and unique among their kind.

mod actions;
mod jobs;
#[cfg(test)]
mod props;
mod queues;
#[cfg(test)]
mod tests;

use std::collections::HashSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use baton::InvalidInput;
use serde::Deserialize;

pub use actions::Action;
pub use jobs::{job_from_doc, JobConfig, Mode};
pub use queues::QueueConfig;

/// The queue a job uses when it names none; it exists even when undeclared.
pub const DEFAULT_QUEUE: &str = "default";
/// A queue's default lease.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);
/// A durable job's default number of attempts.
pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
/// The default `grace` of `misfire = "none"`.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(60);

const MAX_NAME_BYTES: usize = 255;
const MAX_CONCURRENCY: i64 = 10_000;
const MAX_CATCH_UP_LIMIT: i64 = 100_000;
const MAX_ATTEMPTS_LIMIT: i64 = 10_000;

/// A validated config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// The store URL, if the file gives one.
    pub store: Option<String>,
    /// The table or key prefix, if the file gives one.
    pub prefix: Option<String>,
    /// The most connections to a server store, if the file gives it.
    pub pool_size: Option<u32>,
    /// Queues, as declared, plus `default` when a durable job uses it
    /// without declaring it.
    pub queues: Vec<QueueConfig>,
    /// Scheduled jobs, in file order.
    pub jobs: Vec<JobConfig>,
    /// The admin server's tokens (`[admin]`).
    pub admin: AdminConfig,
}

/// The `[admin]` table: the admin server's bearer tokens (the environment's
/// `BATON_ADMIN_TOKEN` / `BATON_ADMIN_READ_TOKEN` win over these).
#[derive(Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdminConfig {
    /// The token for reads and writes.
    pub token: Option<String>,
    /// A token that may only read.
    pub read_token: Option<String>,
    /// A file of named tokens with roles (`NAME ROLE SECRET` a line), read
    /// again when it changes (`BATON_ADMIN_TOKENS_FILE` wins).
    pub tokens_file: Option<PathBuf>,
}

impl std::fmt::Debug for AdminConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AdminConfig")
            .field("token", &self.token.as_ref().map(|_| "<hidden>"))
            .field("read_token", &self.read_token.as_ref().map(|_| "<hidden>"))
            .field("tokens_file", &self.tokens_file)
            .finish()
    }
}

/// Why a config file was refused. The message names the job or queue and
/// the field.
#[derive(Debug)]
pub struct ConfigError {
    path: Option<PathBuf>,
    kind: ConfigErrorKind,
}

/// The kinds of [`ConfigError`].
#[derive(Debug)]
pub enum ConfigErrorKind {
    /// The file could not be read.
    Io(std::io::Error),
    /// Not TOML, a wrong type or an unknown key (the parser's message, on
    /// one line after the line and column).
    Syntax(String),
    /// A value is out of range or inconsistent.
    Invalid {
        /// `job "tick"`, `queue "default"`, `job #2`, or `store`.
        owner: String,
        /// The key at fault, when one is.
        field: Option<String>,
        /// What is wrong and what is accepted.
        problem: String,
    },
}

impl ConfigError {
    fn invalid(owner: &str, field: Option<&str>, problem: impl Into<String>) -> Self {
        ConfigError {
            path: None,
            kind: ConfigErrorKind::Invalid {
                owner: owner.to_string(),
                field: field.map(str::to_string),
                problem: problem.into(),
            },
        }
    }

    fn from_input(owner: &str, e: InvalidInput) -> Self {
        ConfigError::invalid(owner, Some(&e.field), e.problem)
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(p) = &self.path {
            write!(f, "{}: ", p.display())?;
        }
        match &self.kind {
            ConfigErrorKind::Io(e) => write!(f, "cannot read: {e}"),
            ConfigErrorKind::Syntax(m) => f.write_str(m.trim_end()),
            ConfigErrorKind::Invalid {
                owner,
                field: Some(field),
                problem,
            } => write!(f, "{owner}: {field}: {problem}"),
            ConfigErrorKind::Invalid {
                owner,
                field: None,
                problem,
            } => write!(f, "{owner}: {problem}"),
        }
    }
}

impl std::error::Error for ConfigError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match &self.kind {
            ConfigErrorKind::Io(e) => Some(e),
            _ => None,
        }
    }
}

// ---- the file as written ------------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    store: Option<String>,
    prefix: Option<String>,
    pool_size: Option<i64>,
    #[serde(default)]
    queue: Vec<queues::RawQueue>,
    #[serde(default)]
    job: Vec<jobs::RawJob>,
    #[serde(default)]
    admin: AdminConfig,
}

// ---- parsing and validation --------------------------------------------------

impl Config {
    /// Read and validate a config file. Errors start with the path.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Config, ConfigError> {
        let path = path.as_ref();
        let with_path = |mut e: ConfigError| {
            e.path = Some(path.to_path_buf());
            e
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            with_path(ConfigError {
                path: None,
                kind: ConfigErrorKind::Io(e),
            })
        })?;
        Config::parse(&text).map_err(with_path)
    }

    /// Parse and validate config text.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let raw: RawConfig = toml::from_str(text).map_err(|e| ConfigError {
            path: None,
            kind: ConfigErrorKind::Syntax(syntax_line(text, &e)),
        })?;
        validate(raw)
    }
}

/// The TOML parser's error on one line: `line L, column C: message`
/// (its own rendering spans several lines, with the source quoted).
fn syntax_line(text: &str, e: &toml::de::Error) -> String {
    let message = e.message().split_whitespace().collect::<Vec<_>>().join(" ");
    let Some(span) = e.span() else {
        return format!("not valid TOML: {message}");
    };
    // Clamp to a char boundary: a span never splits one, but be safe.
    let mut at = span.start.min(text.len());
    while !text.is_char_boundary(at) {
        at -= 1;
    }
    let before = &text[..at];
    let line = before.matches('\n').count() + 1;
    let column = before
        .rsplit_once('\n')
        .map_or(before, |(_, l)| l)
        .chars()
        .count()
        + 1;
    format!("line {line}, column {column}: {message}")
}

/// The longest duration a config key accepts (the same as a flag's).
pub use crate::values::MAX_DURATION;

/// A duration of at most [`MAX_DURATION`] (10 years).
fn duration(field: &str, s: &str) -> Result<Duration, InvalidInput> {
    capped(field, baton::parse_duration(field, s)?)
}

/// A duration greater than zero and at most [`MAX_DURATION`].
fn positive_duration(field: &str, s: &str) -> Result<Duration, InvalidInput> {
    capped(field, baton::parse_positive_duration(field, s)?)
}

fn capped(field: &str, d: Duration) -> Result<Duration, InvalidInput> {
    if d > MAX_DURATION {
        return Err(InvalidInput::new(
            field,
            format!(
                "{} is too long; use at most 10 years (3650d)",
                baton::format_duration(d)
            ),
        ));
    }
    Ok(d)
}

fn check_name(owner: &str, name: &str) -> Result<(), ConfigError> {
    let problem = if name.is_empty() {
        "is empty".to_string()
    } else if name.len() > MAX_NAME_BYTES {
        format!("is {} bytes; use at most {MAX_NAME_BYTES}", name.len())
    } else if name.chars().any(char::is_control) {
        format!("{name:?} contains a control character")
    } else {
        return Ok(());
    };
    Err(ConfigError::invalid(owner, Some("name"), problem))
}

/// `job "tick"` for a valid name, `job #2` otherwise.
fn owner_of(kind: &str, index: usize, name: &str) -> String {
    if name.is_empty() || name.len() > MAX_NAME_BYTES || name.chars().any(char::is_control) {
        format!("{kind} #{}", index + 1)
    } else {
        format!("{kind} {name:?}")
    }
}

fn ranged(owner: &str, field: &str, v: i64, lo: i64, hi: i64) -> Result<i64, ConfigError> {
    if (lo..=hi).contains(&v) {
        Ok(v)
    } else {
        Err(ConfigError::invalid(
            owner,
            Some(field),
            format!("{v} is out of range; use {lo}..={hi}"),
        ))
    }
}

fn validate(raw: RawConfig) -> Result<Config, ConfigError> {
    if let Some(s) = &raw.store {
        if s.trim().is_empty() {
            return Err(ConfigError::invalid(
                "store",
                None,
                "is empty; use sqlite://PATH, postgres://… or redis://…, or leave it out",
            ));
        }
    }

    if let Some(p) = &raw.prefix {
        baton::store::validate_prefix(p).map_err(|e| {
            let why = e.to_string();
            let why = why.split_once("prefix ").map_or(why.as_str(), |(_, w)| w);
            ConfigError::invalid("prefix", None, format!("{why}, or leave it out"))
        })?;
    }

    let pool_size = match raw.pool_size {
        None => None,
        Some(n) => Some(ranged(
            "pool_size",
            "pool_size",
            n,
            1,
            i64::from(baton::store::MAX_POOL_SIZE),
        )? as u32),
    };

    for (field, t) in [
        ("token", &raw.admin.token),
        ("read_token", &raw.admin.read_token),
    ] {
        match t {
            Some(t) if t.trim().is_empty() => {
                return Err(ConfigError::invalid(
                    "[admin]",
                    Some(field),
                    "is empty, which would let anyone with an empty bearer token in; \
                     give a secret (e.g. from `openssl rand -hex 32`) or leave the key out",
                ))
            }
            Some(t) if t.chars().any(|c| c.is_control() || c == ' ') => {
                return Err(ConfigError::invalid(
                    "[admin]",
                    Some(field),
                    "contains a space or control character, which no Authorization header can carry; \
                     use printable characters only (e.g. `openssl rand -hex 32`)",
                ))
            }
            _ => {}
        }
    }

    let mut queues = queues::validate_queues(raw.queue)?;

    let mut jobs = Vec::with_capacity(raw.job.len());
    let mut seen = HashSet::new();
    for (i, j) in raw.job.into_iter().enumerate() {
        let owner = owner_of("job", i, &j.name);
        check_name(&owner, &j.name)?;
        if !seen.insert(j.name.clone()) {
            return Err(ConfigError::invalid(
                &owner,
                Some("name"),
                "is declared twice; job names must be unique",
            ));
        }
        jobs.push(jobs::validate_job(&owner, j)?);
    }

    // Queues the durable jobs use: `default` may be implicit, others not.
    for job in &jobs {
        if job.mode != Mode::Durable || queues.iter().any(|q| q.name == job.queue) {
            continue;
        }
        if job.queue == DEFAULT_QUEUE {
            queues.push(QueueConfig {
                name: DEFAULT_QUEUE.to_string(),
                concurrency: 1,
                lease: DEFAULT_LEASE,
                max_running: None,
                per_key_max_running: None,
                rate: None,
                per_key_rate: None,
                fair: false,
            });
        } else {
            return Err(ConfigError::invalid(
                &format!("job {:?}", job.name),
                Some("queue"),
                format!(
                    "{:?} is not declared; add a [[queue]] with name = {:?}, or leave queue \
                     out to use {DEFAULT_QUEUE:?}",
                    job.queue, job.queue
                ),
            ));
        }
    }

    if queues.is_empty() && jobs.is_empty() {
        return Err(ConfigError::invalid(
            "config",
            None,
            "has no [[job]] and no [[queue]], so there is nothing to run; add one \
             (see examples/baton.toml)",
        ));
    }

    Ok(Config {
        store: raw.store.map(|s| s.trim().to_string()),
        prefix: raw.prefix,
        pool_size,
        queues,
        jobs,
        admin: raw.admin,
    })
}
