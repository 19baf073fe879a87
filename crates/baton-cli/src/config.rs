//! The `baton serve --config FILE` file: queues and scheduled jobs, in TOML.
//!
//! ```toml
//! store = "sqlite://baton.db"        # optional; --store / BATON_STORE win
//!
//! [[queue]]
//! name = "default"
//! concurrency = 2                    # default 1
//! lease = "30s"                      # default 30s
//! # max_running = 5                  # cluster-wide cap, all instances together
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
//! overlap = "forbid"                 # durable mode: forbid | allow
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

use std::collections::{BTreeMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use baton::schedule::spec::{Misfire, Schedule, DEFAULT_MAX_CATCH_UP};
use baton::store::Overlap;
use baton::{parse_duration, parse_positive_duration, InvalidInput};
use serde::Deserialize;

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
    /// Queues, as declared, plus `default` when a durable job uses it
    /// without declaring it.
    pub queues: Vec<QueueConfig>,
    /// Scheduled jobs, in file order.
    pub jobs: Vec<JobConfig>,
}

/// One `[[queue]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConfig {
    /// Queue name.
    pub name: String,
    /// Tasks this instance runs at once from this queue (≥ 1).
    pub concurrency: u32,
    /// Lease per claim, renewed by heartbeats.
    pub lease: Duration,
    /// At most this many of the queue's tasks run at once across every
    /// instance (`None`: no cluster-wide cap).
    pub max_running: Option<u32>,
}

/// One `[[job]]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobConfig {
    /// Job name.
    pub name: String,
    /// When it runs.
    pub schedule: Schedule,
    /// What it runs.
    pub action: Action,
    /// How it runs: through the queue, or under a lock.
    pub mode: Mode,
    /// The queue of its tasks (durable mode; `default` otherwise unused).
    pub queue: String,
    /// What to do with slots missed while nothing ran.
    pub misfire: Misfire,
    /// How many missed slots `misfire = "all"` / `"none"` may run (≥ 1).
    pub max_catch_up: usize,
    /// How late a slot may still run with `misfire = "none"`.
    pub grace: Duration,
    /// Whether a slot may start while the previous run is unfinished.
    pub overlap: Overlap,
    /// Attempts per slot (durable mode; 1 in lock mode).
    pub max_attempts: u32,
    /// Time limit per attempt.
    pub timeout: Option<Duration>,
    /// A random delay of up to this much before each run.
    pub jitter: Duration,
    /// Task priority, -100..=100, lower first (durable mode).
    pub priority: i32,
    /// Lock mode only: run, then wait this long (ShedLock's `fixedDelay`)
    /// instead of firing at the schedule's slots.
    pub fixed_delay: Option<Duration>,
}

/// What a job runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// A program and its arguments (no shell unless you name one).
    Command(Vec<String>),
    /// An HTTP request; a 2xx answer is success.
    Http {
        /// Upper-case method, default `POST`.
        method: String,
        /// `http://` or `https://` URL.
        url: String,
        /// Request headers.
        headers: BTreeMap<String, String>,
        /// Request body.
        body: Option<String>,
    },
}

/// How a job's slot runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Enqueue a task per slot on the job's queue: survives crashes, retries.
    Durable,
    /// Run in-process on the instance that takes the lease lock.
    Lock {
        /// The lease lapses by itself this long after the grant.
        at_most: Duration,
        /// The lease is kept at least this long after the grant.
        at_least: Duration,
    },
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
    /// Not TOML, a wrong type or an unknown key (the parser's message, with
    /// line and column).
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
    #[serde(default)]
    queue: Vec<RawQueue>,
    #[serde(default)]
    job: Vec<RawJob>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawQueue {
    name: String,
    concurrency: Option<i64>,
    lease: Option<String>,
    max_running: Option<i64>,
}

#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
enum RawMode {
    Durable,
    Lock,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJob {
    name: String,
    cron: Option<String>,
    tz: Option<String>,
    every: Option<String>,
    fixed_delay: Option<String>,
    command: Option<Vec<String>>,
    http: Option<RawHttp>,
    queue: Option<String>,
    mode: Option<RawMode>,
    at_most: Option<String>,
    at_least: Option<String>,
    misfire: Option<Misfire>,
    max_catch_up: Option<i64>,
    grace: Option<String>,
    overlap: Option<Overlap>,
    max_attempts: Option<i64>,
    timeout: Option<String>,
    jitter: Option<String>,
    priority: Option<i64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    method: Option<String>,
    url: String,
    #[serde(default)]
    headers: BTreeMap<String, String>,
    body: Option<String>,
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
            kind: ConfigErrorKind::Syntax(e.to_string()),
        })?;
        validate(raw)
    }
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

    let mut queues = Vec::with_capacity(raw.queue.len() + 1);
    let mut seen = HashSet::new();
    for (i, q) in raw.queue.into_iter().enumerate() {
        let owner = owner_of("queue", i, &q.name);
        check_name(&owner, &q.name)?;
        if !seen.insert(q.name.clone()) {
            return Err(ConfigError::invalid(
                &owner,
                Some("name"),
                "is declared twice; queue names must be unique",
            ));
        }
        let concurrency = ranged(
            &owner,
            "concurrency",
            q.concurrency.unwrap_or(1),
            1,
            MAX_CONCURRENCY,
        )? as u32;
        let lease = match &q.lease {
            Some(s) => parse_positive_duration("lease", s)
                .map_err(|e| ConfigError::from_input(&owner, e))?,
            None => DEFAULT_LEASE,
        };
        let max_running = q
            .max_running
            .map(|m| ranged(&owner, "max_running", m, 1, MAX_CONCURRENCY).map(|m| m as u32))
            .transpose()?;
        queues.push(QueueConfig {
            name: q.name,
            concurrency,
            lease,
            max_running,
        });
    }

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
        jobs.push(validate_job(&owner, j)?);
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

    Ok(Config {
        store: raw.store.map(|s| s.trim().to_string()),
        queues,
        jobs,
    })
}

fn validate_job(owner: &str, j: RawJob) -> Result<JobConfig, ConfigError> {
    let input = |e: InvalidInput| ConfigError::from_input(owner, e);

    let mut fixed_delay = None;
    let schedule = match (&j.cron, &j.every, &j.fixed_delay) {
        (Some(expr), None, None) => Schedule::cron(expr, j.tz.as_deref()).map_err(input)?,
        (None, None, Some(delay)) => {
            if j.mode != Some(RawMode::Lock) {
                return Err(ConfigError::invalid(
                    owner,
                    Some("fixed_delay"),
                    "only with mode = \"lock\" (each instance waits this long after a run, \
                     like ShedLock's fixedDelay); durable jobs use every or cron",
                ));
            }
            let d = parse_positive_duration("fixed_delay", delay).map_err(input)?;
            fixed_delay = Some(d);
            Schedule::every(d.max(baton::schedule::spec::MIN_INTERVAL)).map_err(input)?
        }
        (None, Some(every), None) => {
            if j.tz.is_some() {
                return Err(ConfigError::invalid(
                    owner,
                    Some("tz"),
                    "only with cron; every is anchored at the Unix epoch, in no zone",
                ));
            }
            Schedule::every(parse_duration("every", every).map_err(input)?).map_err(input)?
        }
        _ => return Err(ConfigError::invalid(
            owner,
            None,
            "give exactly one of cron or every (e.g. cron = \"0 */6 * * *\" or every = \"30s\"; \
             lock-mode jobs may give fixed_delay instead)",
        )),
    };

    let action = match (j.command, j.http) {
        (Some(command), None) => {
            if command.first().is_none_or(|p| p.trim().is_empty()) {
                return Err(ConfigError::invalid(
                    owner,
                    Some("command"),
                    "is empty; give the program and its arguments, e.g. [\"sh\", \"-c\", \"…\"]",
                ));
            }
            Action::Command(command)
        }
        (None, Some(http)) => validate_http(owner, http)?,
        _ => {
            return Err(ConfigError::invalid(
                owner,
                None,
                "give exactly one of command or http",
            ))
        }
    };

    let mode = match j.mode.unwrap_or(RawMode::Durable) {
        RawMode::Durable => {
            for (field, given) in [
                ("at_most", j.at_most.is_some()),
                ("at_least", j.at_least.is_some()),
            ] {
                if given {
                    return Err(ConfigError::invalid(
                        owner,
                        Some(field),
                        "only with mode = \"lock\"",
                    ));
                }
            }
            Mode::Durable
        }
        RawMode::Lock => {
            for (field, given) in [
                ("queue", j.queue.is_some()),
                ("max_attempts", j.max_attempts.is_some()),
                ("priority", j.priority.is_some()),
                ("overlap", j.overlap.is_some()),
            ] {
                if given {
                    return Err(ConfigError::invalid(
                        owner,
                        Some(field),
                        "only with mode = \"durable\"; a lock-mode job runs in-process, once, \
                         and its lock forbids overlap",
                    ));
                }
            }
            let at_most = match &j.at_most {
                Some(s) => parse_positive_duration("at_most", s).map_err(input)?,
                None => {
                    return Err(ConfigError::invalid(
                        owner,
                        Some("at_most"),
                        "is required with mode = \"lock\": how long the lease lasts if the \
                         holder dies (e.g. at_most = \"15m\")",
                    ))
                }
            };
            let at_least = match &j.at_least {
                Some(s) => parse_duration("at_least", s).map_err(input)?,
                None => Duration::ZERO,
            };
            if at_least > at_most {
                return Err(ConfigError::invalid(
                    owner,
                    Some("at_least"),
                    format!(
                        "{} is longer than at_most ({}); use at most at_most",
                        baton::format_duration(at_least),
                        baton::format_duration(at_most)
                    ),
                ));
            }
            Mode::Lock { at_most, at_least }
        }
    };

    let queue = match j.queue {
        Some(q) => {
            check_name(owner, &q).map_err(|e| match e.kind {
                ConfigErrorKind::Invalid { problem, .. } => {
                    ConfigError::invalid(owner, Some("queue"), problem)
                }
                _ => e,
            })?;
            q
        }
        None => DEFAULT_QUEUE.to_string(),
    };

    let max_catch_up = ranged(
        owner,
        "max_catch_up",
        j.max_catch_up.unwrap_or(DEFAULT_MAX_CATCH_UP as i64),
        1,
        MAX_CATCH_UP_LIMIT,
    )? as usize;
    let max_attempts = match mode {
        Mode::Durable => ranged(
            owner,
            "max_attempts",
            j.max_attempts.unwrap_or(i64::from(DEFAULT_MAX_ATTEMPTS)),
            1,
            MAX_ATTEMPTS_LIMIT,
        )? as u32,
        Mode::Lock { .. } => 1,
    };
    let priority = ranged(owner, "priority", j.priority.unwrap_or(0), -100, 100)? as i32;
    let grace = match &j.grace {
        Some(s) => parse_duration("grace", s).map_err(input)?,
        None => DEFAULT_GRACE,
    };
    let timeout = match &j.timeout {
        Some(s) => Some(parse_positive_duration("timeout", s).map_err(input)?),
        None => None,
    };
    let jitter = match &j.jitter {
        Some(s) => parse_duration("jitter", s).map_err(input)?,
        None => Duration::ZERO,
    };

    Ok(JobConfig {
        name: j.name,
        schedule,
        action,
        mode,
        queue,
        misfire: j.misfire.unwrap_or_default(),
        max_catch_up,
        grace,
        overlap: j.overlap.unwrap_or_default(),
        max_attempts,
        timeout,
        jitter,
        priority,
        fixed_delay,
    })
}

fn validate_http(owner: &str, http: RawHttp) -> Result<Action, ConfigError> {
    let method = http
        .method
        .as_deref()
        .unwrap_or("POST")
        .to_ascii_uppercase();
    if method.is_empty() || !method.chars().all(|c| c.is_ascii_alphabetic()) {
        return Err(ConfigError::invalid(
            owner,
            Some("http.method"),
            format!("{method:?} is not an HTTP method; use GET, POST, PUT, PATCH or DELETE"),
        ));
    }
    let url = http.url.trim().to_string();
    let rest = url
        .strip_prefix("http://")
        .or_else(|| url.strip_prefix("https://"));
    if rest.is_none_or(|r| r.is_empty()) || url.chars().any(|c| c.is_control() || c == ' ') {
        return Err(ConfigError::invalid(
            owner,
            Some("http.url"),
            format!("{:?} is not an http:// or https:// URL", http.url),
        ));
    }
    for (k, v) in &http.headers {
        let bad_name = k.is_empty()
            || !k
                .chars()
                .all(|c| c.is_ascii_graphic() && !"()<>@,;:\\\"/[]?={}".contains(c));
        if bad_name {
            return Err(ConfigError::invalid(
                owner,
                Some("http.headers"),
                format!("{k:?} is not a header name; use letters, digits and '-'"),
            ));
        }
        if v.chars().any(|c| c == '\r' || c == '\n' || c == '\0') {
            return Err(ConfigError::invalid(
                owner,
                Some("http.headers"),
                format!("the value of {k:?} contains a line break"),
            ));
        }
    }
    Ok(Action::Http {
        method,
        url,
        headers: http.headers,
        body: http.body,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = r#"
store = "sqlite://baton.db"

[[queue]]
name = "default"
concurrency = 2
lease = "30s"

[[queue]]
name = "slow"
max_running = 3

[[job]]
name = "tick"
every = "1s"
command = ["sh", "-c", "echo $BATON_SLOT >> ledger"]
queue = "default"
mode = "durable"
misfire = "all"
max_catch_up = 50
overlap = "allow"
max_attempts = 5
timeout = "5m"
jitter = "2s"
priority = -10

[[job]]
name = "nightly"
cron = "0 */6 * * *"
tz = "Asia/Seoul"
queue = "slow"
http = { method = "post", url = "https://example.com/hook", headers = { Authorization = "Bearer x" }, body = "{}" }

[[job]]
name = "runner"
every = "PT30S"
mode = "lock"
at_most = "PT15M"
at_least = "PT30S"
misfire = "none"
grace = "10s"
command = ["true"]
"#;

    fn err(text: &str) -> String {
        Config::parse(text).unwrap_err().to_string()
    }

    /// One job around `body`, with a default schedule/action unless given.
    fn job(body: &str) -> String {
        let mut s = String::from("[[job]]\nname = \"j\"\n");
        if !body.contains("cron") && !body.contains("every") {
            s.push_str("every = \"1m\"\n");
        }
        if !body.contains("command") && !body.contains("http") {
            s.push_str("command = [\"true\"]\n");
        }
        s.push_str(body);
        s
    }

    #[test]
    fn parses_a_full_file() {
        let c = Config::parse(GOOD).unwrap();
        assert_eq!(c.store.as_deref(), Some("sqlite://baton.db"));
        assert_eq!(
            c.queues,
            [
                QueueConfig {
                    name: "default".into(),
                    concurrency: 2,
                    lease: Duration::from_secs(30),
                    max_running: None,
                },
                QueueConfig {
                    name: "slow".into(),
                    concurrency: 1,
                    lease: DEFAULT_LEASE,
                    max_running: Some(3),
                },
            ]
        );
        assert_eq!(c.jobs.len(), 3);

        let tick = &c.jobs[0];
        assert_eq!(tick.name, "tick");
        assert_eq!(
            tick.schedule,
            Schedule::every(Duration::from_secs(1)).unwrap()
        );
        assert_eq!(
            tick.action,
            Action::Command(vec![
                "sh".into(),
                "-c".into(),
                "echo $BATON_SLOT >> ledger".into()
            ])
        );
        assert_eq!(tick.mode, Mode::Durable);
        assert_eq!(tick.queue, "default");
        assert_eq!(tick.misfire, Misfire::All);
        assert_eq!(tick.max_catch_up, 50);
        assert_eq!(tick.overlap, Overlap::Allow);
        assert_eq!(tick.max_attempts, 5);
        assert_eq!(tick.timeout, Some(Duration::from_secs(300)));
        assert_eq!(tick.jitter, Duration::from_secs(2));
        assert_eq!(tick.priority, -10);

        let nightly = &c.jobs[1];
        assert_eq!(
            nightly.schedule,
            Schedule::cron("0 */6 * * *", "Asia/Seoul").unwrap()
        );
        assert_eq!(nightly.queue, "slow");
        assert_eq!(
            nightly.action,
            Action::Http {
                method: "POST".into(),
                url: "https://example.com/hook".into(),
                headers: [("Authorization".to_string(), "Bearer x".to_string())].into(),
                body: Some("{}".into()),
            }
        );
        // Defaults.
        assert_eq!(nightly.mode, Mode::Durable);
        assert_eq!(nightly.misfire, Misfire::Latest);
        assert_eq!(nightly.max_catch_up, DEFAULT_MAX_CATCH_UP);
        assert_eq!(nightly.overlap, Overlap::Forbid);
        assert_eq!(nightly.max_attempts, DEFAULT_MAX_ATTEMPTS);
        assert_eq!(nightly.timeout, None);
        assert_eq!(nightly.jitter, Duration::ZERO);
        assert_eq!(nightly.priority, 0);
        assert_eq!(nightly.grace, DEFAULT_GRACE);

        let runner = &c.jobs[2];
        assert_eq!(
            runner.mode,
            Mode::Lock {
                at_most: Duration::from_secs(900),
                at_least: Duration::from_secs(30)
            }
        );
        assert_eq!(runner.misfire, Misfire::None);
        assert_eq!(runner.grace, Duration::from_secs(10));
        assert_eq!(runner.max_attempts, 1);
        assert_eq!(
            runner.schedule,
            Schedule::every(Duration::from_secs(30)).unwrap()
        );
    }

    #[test]
    fn the_example_file_parses() {
        let c = Config::parse(include_str!("../../../examples/baton.toml")).unwrap();
        assert_eq!(c.store.as_deref(), Some("sqlite://baton.db"));
        let runner = c.jobs.iter().find(|j| j.name == "daemon-runner").unwrap();
        assert_eq!(
            runner.schedule,
            Schedule::every(Duration::from_secs(30)).unwrap()
        );
        assert_eq!(
            runner.mode,
            Mode::Lock {
                at_most: Duration::from_secs(15 * 60),
                at_least: Duration::from_secs(30)
            }
        );
        assert!(matches!(runner.action, Action::Command(_)));
        let batch = c.jobs.iter().find(|j| j.name == "batch-6h").unwrap();
        assert_eq!(
            batch.schedule,
            Schedule::cron("0 */6 * * *", "Asia/Seoul").unwrap()
        );
        assert_eq!(batch.mode, Mode::Durable);
        assert_eq!(batch.max_attempts, 3);
        assert!(c.queues.iter().any(|q| q.name == batch.queue));
        // From a file, errors and all.
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../examples/baton.toml");
        assert_eq!(Config::from_file(path).unwrap(), c);
    }

    #[test]
    fn fixed_delay_is_a_lock_mode_schedule() {
        let c = Config::parse(
            "[[job]]\nname = \"d\"\nfixed_delay = \"PT30S\"\nmode = \"lock\"\nat_most = \"PT15M\"\ncommand = [\"true\"]\n",
        )
        .unwrap();
        assert_eq!(c.jobs[0].fixed_delay, Some(Duration::from_secs(30)));
        let e = err("[[job]]\nname = \"d\"\nfixed_delay = \"30s\"\ncommand = [\"true\"]\n");
        assert!(
            e.starts_with("job \"d\": fixed_delay: only with mode = \"lock\""),
            "{e}"
        );
        let e = err("[[job]]\nname = \"d\"\nfixed_delay = \"30s\"\nevery = \"1s\"\nmode = \"lock\"\nat_most = \"1m\"\ncommand = [\"true\"]\n");
        assert!(e.contains("exactly one of cron or every"), "{e}");
    }

    #[test]
    fn from_file_errors_name_the_path() {
        let e = Config::from_file("/nonexistent/baton.toml").unwrap_err();
        assert!(matches!(e.kind, ConfigErrorKind::Io(_)));
        assert!(
            e.to_string()
                .starts_with("/nonexistent/baton.toml: cannot read"),
            "{e}"
        );

        let dir = std::env::temp_dir().join(format!("baton-config-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("bad.toml");
        std::fs::write(&p, job("every = \"1x\"")).unwrap();
        let e = Config::from_file(&p).unwrap_err().to_string();
        assert!(
            e.starts_with(&format!("{}: job \"j\": every:", p.display())),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn empty_file_and_jobs_only() {
        let c = Config::parse("").unwrap();
        assert_eq!(
            c,
            Config {
                store: None,
                queues: vec![],
                jobs: vec![]
            }
        );
        // The default queue is implicit for durable jobs...
        let c = Config::parse(&job("")).unwrap();
        assert_eq!(
            c.queues,
            [QueueConfig {
                name: "default".into(),
                concurrency: 1,
                lease: DEFAULT_LEASE,
                max_running: None,
            }]
        );
        // ...and not added for lock-mode jobs.
        let c = Config::parse(&job("mode = \"lock\"\nat_most = \"1m\"")).unwrap();
        assert!(c.queues.is_empty());
    }

    #[test]
    fn schedule_errors() {
        assert_eq!(
            err(&job("every = \"1x\"")),
            "job \"j\": every: \"1x\" is not a duration; use a number with a unit (500ms, 30s, \
             15m, 1h30m, 2d) or ISO-8601 (PT15M, PT30S, P1DT2H)"
        );
        let e = err(&job("every = \"50ms\""));
        assert!(e.starts_with("job \"j\": every: 50ms is too short"), "{e}");
        let e = err(&job("every = \"0s\""));
        assert!(e.starts_with("job \"j\": every:"), "{e}");
        let e = err("[[job]]\nname = \"nightly\"\ncommand = [\"true\"]\n");
        assert!(
            e.starts_with("job \"nightly\": give exactly one of cron or every"),
            "{e}"
        );
        let e = err(&job("cron = \"@daily\"\nevery = \"1m\""));
        assert!(
            e.starts_with("job \"j\": give exactly one of cron or every"),
            "{e}"
        );
        let e = err(&job("cron = \"0 0 * *\""));
        assert!(
            e.starts_with("job \"j\": cron: \"0 0 * *\" is not a cron expression"),
            "{e}"
        );
        assert!(e.contains("5 fields"), "{e}");
        let e = err(&job("cron = \"@daily\"\ntz = \"Mars/Olympus\""));
        assert!(
            e.starts_with("job \"j\": tz: \"Mars/Olympus\" is not an IANA time zone"),
            "{e}"
        );
        let e = err(&job("every = \"1m\"\ntz = \"UTC\""));
        assert!(e.starts_with("job \"j\": tz: only with cron"), "{e}");
    }

    #[test]
    fn action_errors() {
        let e = err("[[job]]\nname = \"j\"\nevery = \"1m\"\n");
        assert_eq!(e, "job \"j\": give exactly one of command or http");
        let e = err(&job(
            "command = [\"true\"]\nhttp = { url = \"https://example.com\" }",
        ));
        assert_eq!(e, "job \"j\": give exactly one of command or http");
        for cmd in ["[]", "[\"\"]", "[\"  \", \"x\"]"] {
            let e = err(&job(&format!("command = {cmd}")));
            assert!(e.starts_with("job \"j\": command: is empty"), "{cmd}: {e}");
        }
        let e = err(&job("http = { url = \"ftp://example.com\" }"));
        assert!(e.starts_with("job \"j\": http.url:"), "{e}");
        let e = err(&job("http = { url = \"https://\" }"));
        assert!(e.starts_with("job \"j\": http.url:"), "{e}");
        let e = err(&job("http = { url = \"https://x\", method = \"PO ST\" }"));
        assert!(e.starts_with("job \"j\": http.method:"), "{e}");
        let e = err(&job(
            "http = { url = \"https://x\", headers = { \"A B\" = \"c\" } }",
        ));
        assert!(e.starts_with("job \"j\": http.headers:"), "{e}");
        let e = err(&job(
            "http = { url = \"https://x\", headers = { A = \"b\\nc\" } }",
        ));
        assert!(e.starts_with("job \"j\": http.headers:"), "{e}");
        // GET with no body and no headers is fine.
        let c = Config::parse(&job(
            "http = { method = \"GET\", url = \"http://127.0.0.1:8080/x\" }",
        ))
        .unwrap();
        assert!(
            matches!(&c.jobs[0].action, Action::Http { method, body: None, .. } if method == "GET")
        );
    }

    #[test]
    fn mode_errors() {
        let e = err(&job("mode = \"lock\""));
        assert!(
            e.starts_with("job \"j\": at_most: is required with mode = \"lock\""),
            "{e}"
        );
        let e = err(&job(
            "mode = \"lock\"\nat_most = \"30s\"\nat_least = \"1m\"",
        ));
        assert_eq!(
            e,
            "job \"j\": at_least: 1m is longer than at_most (30s); use at most at_most"
        );
        let e = err(&job("mode = \"lock\"\nat_most = \"0s\""));
        assert!(e.starts_with("job \"j\": at_most: \"0s\" is zero"), "{e}");
        let e = err(&job("mode = \"lock\"\nat_most = \"15 minutes\""));
        assert!(
            e.starts_with("job \"j\": at_most: \"15 minutes\" is not a duration"),
            "{e}"
        );
        for key in [
            "queue = \"default\"",
            "max_attempts = 2",
            "priority = 1",
            "overlap = \"allow\"",
        ] {
            let e = err(&job(&format!("mode = \"lock\"\nat_most = \"1m\"\n{key}")));
            let field = key.split(' ').next().unwrap();
            assert!(
                e.starts_with(&format!("job \"j\": {field}: only with mode = \"durable\"")),
                "{e}"
            );
        }
        for key in ["at_most = \"1m\"", "at_least = \"1s\""] {
            let e = err(&job(key));
            let field = key.split(' ').next().unwrap();
            assert_eq!(e, format!("job \"j\": {field}: only with mode = \"lock\""));
        }
        // at_least equal to at_most is allowed.
        Config::parse(&job(
            "mode = \"lock\"\nat_most = \"1m\"\nat_least = \"60s\"",
        ))
        .unwrap();
        let e = err(&job("mode = \"exclusive\""));
        assert!(e.contains("unknown variant `exclusive`"), "{e}");
        assert!(e.contains("line 5"), "{e}");
    }

    #[test]
    fn range_errors() {
        for (body, want) in [
            (
                "max_attempts = 0",
                "job \"j\": max_attempts: 0 is out of range; use 1..=10000",
            ),
            (
                "priority = 101",
                "job \"j\": priority: 101 is out of range; use -100..=100",
            ),
            (
                "priority = -101",
                "job \"j\": priority: -101 is out of range; use -100..=100",
            ),
            (
                "max_catch_up = 0",
                "job \"j\": max_catch_up: 0 is out of range; use 1..=100000",
            ),
        ] {
            assert_eq!(err(&job(body)), want);
        }
        Config::parse(&job("priority = -100")).unwrap();
        Config::parse(&job("priority = 100")).unwrap();
        let e = err("[[queue]]\nname = \"q\"\nmax_running = 0\n");
        assert_eq!(
            e.to_string(),
            "queue \"q\": max_running: 0 is out of range; use 1..=10000"
        );
        let e = err("[[queue]]\nname = \"q\"\nconcurrency = 0\n");
        assert_eq!(
            e,
            "queue \"q\": concurrency: 0 is out of range; use 1..=10000"
        );
        let e = err("[[queue]]\nname = \"q\"\nlease = \"0s\"\n");
        assert!(e.starts_with("queue \"q\": lease: \"0s\" is zero"), "{e}");
        let e = err(&job("timeout = \"soon\""));
        assert!(
            e.starts_with("job \"j\": timeout: \"soon\" is not a duration"),
            "{e}"
        );
        let e = err(&job("jitter = \"-1s\""));
        assert!(e.starts_with("job \"j\": jitter:"), "{e}");
        let e = err(&job("grace = \"x\""));
        assert!(e.starts_with("job \"j\": grace:"), "{e}");
        let e = err(&job("misfire = \"sometimes\""));
        assert!(e.contains("unknown variant `sometimes`"), "{e}");
    }

    #[test]
    fn name_errors() {
        let e = err("[[job]]\nname = \"\"\nevery = \"1m\"\ncommand = [\"true\"]\n");
        assert_eq!(e, "job #1: name: is empty");
        let long = "x".repeat(256);
        let e = err(&format!("[[queue]]\nname = \"{long}\"\n"));
        assert_eq!(e, "queue #1: name: is 256 bytes; use at most 255");
        Config::parse(&format!("[[queue]]\nname = \"{}\"\n", "x".repeat(255))).unwrap();
        let e = err("[[queue]]\nname = \"a\\tb\"\n");
        assert_eq!(e, "queue #1: name: \"a\\tb\" contains a control character");
        let e = err(&format!("{}\n{}", job(""), job("")));
        assert_eq!(
            e,
            "job \"j\": name: is declared twice; job names must be unique"
        );
        let e = err("[[queue]]\nname = \"q\"\n[[queue]]\nname = \"q\"\n");
        assert_eq!(
            e,
            "queue \"q\": name: is declared twice; queue names must be unique"
        );
        // A job and a queue may share a name.
        Config::parse(&format!(
            "[[queue]]\nname = \"j\"\n{}",
            job("queue = \"j\"")
        ))
        .unwrap();
        let e = err("[[job]]\nevery = \"1m\"\ncommand = [\"true\"]\n");
        assert!(e.contains("missing field `name`"), "{e}");
    }

    #[test]
    fn undeclared_queue_is_refused() {
        let e = err(&job("queue = \"fast\""));
        assert!(
            e.starts_with("job \"j\": queue: \"fast\" is not declared"),
            "{e}"
        );
        let e = err(&job("queue = \"\""));
        assert_eq!(e, "job \"j\": queue: is empty");
    }

    #[test]
    fn unknown_keys_are_refused_with_line_and_column() {
        let e = err(&job("max_atempts = 3"));
        assert!(e.contains("unknown field `max_atempts`"), "{e}");
        assert!(e.contains("line 5, column 1"), "{e}");
        let e = err("stor = \"sqlite://x\"\n");
        assert!(e.contains("unknown field `stor`"), "{e}");
        let e = err("[[queue]]\nname = \"q\"\nconcurency = 2\n");
        assert!(e.contains("unknown field `concurency`"), "{e}");
        let e = err(&job("http = { url = \"https://x\", data = \"y\" }"));
        assert!(e.contains("unknown field `data`"), "{e}");
        let e = err("[[jobs]]\nname = \"x\"\n");
        assert!(e.contains("unknown field `jobs`"), "{e}");
        let e = err("this is not toml");
        assert!(e.contains("line 1"), "{e}");
        let e = err(&job("max_attempts = \"3\""));
        assert!(e.contains("invalid type"), "{e}");
        let e = err("store = \"  \"\n");
        assert!(e.starts_with("store: is empty"), "{e}");
    }
}
