//! `[[job]]` tables: the schedule (cron, every, fixed_delay), the mode
//! (durable or lock) and the per-job limits.

use std::time::Duration;

use baton::schedule::spec::{Misfire, Schedule, DEFAULT_MAX_CATCH_UP};
use baton::schedule::Job;
use baton::store::{Overlap, OVERLAP_FORMS};
use baton::InvalidInput;
use serde::{Deserialize, Serialize};

use super::actions::{self, Action, RawHttp};
use super::{
    check_name, duration, positive_duration, ranged, ConfigError, ConfigErrorKind, DEFAULT_GRACE,
    DEFAULT_MAX_ATTEMPTS, DEFAULT_QUEUE, MAX_ATTEMPTS_LIMIT, MAX_CATCH_UP_LIMIT,
};

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
    /// Each slot's run is up to this much after it (an offset derived from
    /// the job and the slot, alike on every instance).
    pub jitter: Duration,
    /// Missed slots older than this are recorded as skipped.
    pub catch_up_window: Option<Duration>,
    /// No slot before this instant runs.
    pub start_at: Option<chrono::DateTime<chrono::Utc>>,
    /// No slot after this instant runs.
    pub end_at: Option<chrono::DateTime<chrono::Utc>>,
    /// Task priority, -100..=100, lower first (durable mode).
    pub priority: i32,
    /// Lock mode only: run, then wait this long (ShedLock's `fixedDelay`)
    /// instead of firing at the schedule's slots.
    pub fixed_delay: Option<Duration>,
    /// The `[[job]]` table as written, without its name, as JSON: the
    /// form a definition kept in the store has (`baton jobs create`), so
    /// a config job and the store's definition of it compare as equal
    /// when they say the same.
    pub doc: serde_json::Value,
}

impl JobConfig {
    /// The library's job for this `[[job]]`: what the scheduler runs, and
    /// what a trigger (CLI or admin API) computes its slot from.
    pub fn job(&self) -> Job {
        let mut job = Job::new(self.name.clone(), self.schedule.clone())
            .misfire(self.misfire)
            .max_catch_up(self.max_catch_up)
            .misfire_grace(self.grace)
            .overlap(self.overlap)
            .jitter(self.jitter)
            .queue(self.queue.clone())
            .priority(self.priority)
            .max_attempts(self.max_attempts);
        job.timeout = self.timeout;
        job.start_at = self.start_at;
        job.catch_up_window = self.catch_up_window;
        job.end_at = self.end_at;
        job.definition = Some(self.doc.clone());
        if let Mode::Lock { at_most, at_least } = self.mode {
            job = job.lock_mode(at_most, at_least);
            job.fixed_delay = self.fixed_delay;
        }
        job
    }
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

#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub(super) enum RawMode {
    Durable,
    Lock,
}

#[derive(Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJob {
    pub(super) name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    cron: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tz: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    every: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    fixed_delay: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    command: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    http: Option<RawHttp>,
    #[serde(skip_serializing_if = "Option::is_none")]
    queue: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    mode: Option<RawMode>,
    #[serde(skip_serializing_if = "Option::is_none")]
    at_most: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    at_least: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    misfire: Option<Misfire>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_catch_up: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    grace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    overlap: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    max_attempts: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timeout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    jitter: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    priority: Option<i64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    start_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    end_at: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    catch_up_window: Option<String>,
}

/// Refuse the Quartz forms that cron would read differently: a 7th (year)
/// field, and numbered weekdays next to `?` (Quartz counts 1-7 from
/// Sunday, cron 0-6, so `2` would be Tuesday here but Monday in Quartz).
fn quartz_hint(owner: &str, expr: &str) -> Result<(), ConfigError> {
    let fields: Vec<&str> = expr.split_whitespace().collect();
    if fields.len() == 7 {
        return Err(ConfigError::invalid(
            owner,
            Some("cron"),
            format!(
                "{expr:?} has 7 fields (Quartz's year field); use 5 fields, or 6 with \
                 seconds first, e.g. {:?}",
                fields[..6].join(" ")
            ),
        ));
    }
    if fields.len() == 6 && expr.contains('?') && fields[5].contains(|c: char| c.is_ascii_digit()) {
        return Err(ConfigError::invalid(
            owner,
            Some("cron"),
            format!(
                "{expr:?} looks like a Quartz expression with numbered weekdays; Quartz \
                 counts 1-7 from Sunday and cron 0-6, so write the days as names (e.g. \
                 MON-FRI) to mean the same in both"
            ),
        ));
    }
    Ok(())
}

pub(super) fn validate_job(owner: &str, j: RawJob) -> Result<JobConfig, ConfigError> {
    let doc = doc_of(&j);
    let input = |e: InvalidInput| ConfigError::from_input(owner, e);

    let mut fixed_delay = None;
    let schedule = match (&j.cron, &j.every, &j.fixed_delay) {
        (Some(expr), None, None) => {
            quartz_hint(owner, expr)?;
            Schedule::cron(expr, j.tz.as_deref()).map_err(input)?
        }
        (None, None, Some(delay)) => {
            if j.mode != Some(RawMode::Lock) {
                return Err(ConfigError::invalid(
                    owner,
                    Some("fixed_delay"),
                    "only with mode = \"lock\" (each instance waits this long after a run, \
                     like ShedLock's fixedDelay); durable jobs use every or cron",
                ));
            }
            let d = positive_duration("fixed_delay", delay).map_err(input)?;
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
            Schedule::every(duration("every", every).map_err(input)?).map_err(input)?
        }
        _ => return Err(ConfigError::invalid(
            owner,
            None,
            "give exactly one of cron or every (e.g. cron = \"0 */6 * * *\" or every = \"30s\"; \
             lock-mode jobs may give fixed_delay instead)",
        )),
    };

    let action = actions::validate_action(owner, j.command, j.http)?;

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
                Some(s) => {
                    let d = positive_duration("at_most", s).map_err(input)?;
                    if d < crate::MIN_LOCK_AT_MOST {
                        return Err(ConfigError::invalid(
                            owner,
                            Some("at_most"),
                            format!(
                                "{s:?} is too short for a lease; use at least {} (e.g. \"15m\"): the keep-alive and stopping the command need time",
                                baton::format_duration(crate::MIN_LOCK_AT_MOST)
                            ),
                        ));
                    }
                    d
                }
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
                Some(s) => duration("at_least", s).map_err(input)?,
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
        Some(s) => duration("grace", s).map_err(input)?,
        None => DEFAULT_GRACE,
    };
    let timeout = match &j.timeout {
        Some(s) => Some(positive_duration("timeout", s).map_err(input)?),
        None => None,
    };
    let jitter = match &j.jitter {
        Some(s) => duration("jitter", s).map_err(input)?,
        None => Duration::ZERO,
    };
    let instant = |field: &str, v: &Option<String>| {
        match v {
        None => Ok(None),
        Some(s) => chrono::DateTime::parse_from_rfc3339(s.trim())
            .map(|t| Some(t.to_utc()))
            .map_err(|e| {
                input(InvalidInput::new(
                    field,
                    format!("{s:?} is not an RFC 3339 instant ({e}); use e.g. \"2027-01-01T09:00:00+09:00\""),
                ))
            }),
    }
    };
    let catch_up_window = match &j.catch_up_window {
        Some(s) => Some(positive_duration("catch_up_window", s).map_err(input)?),
        None => None,
    };
    let overlap = match &j.overlap {
        Some(o) => o.parse::<Overlap>().map_err(|_| {
            ConfigError::invalid(
                owner,
                Some("overlap"),
                format!("{o:?} is not a policy; expected one of {OVERLAP_FORMS}"),
            )
        })?,
        None => Overlap::default(),
    };
    let start_at = instant("start_at", &j.start_at)?;
    let end_at = instant("end_at", &j.end_at)?;
    if let (Some(s), Some(e)) = (start_at, end_at) {
        if e <= s {
            return Err(input(InvalidInput::new(
                "end_at",
                format!(
                    "{} is not after start_at {}; the job would never run",
                    baton::format_time(e),
                    baton::format_time(s)
                ),
            )));
        }
    }

    Ok(JobConfig {
        name: j.name,
        schedule,
        action,
        mode,
        queue,
        misfire: j.misfire.unwrap_or_default(),
        max_catch_up,
        grace,
        overlap,
        max_attempts,
        timeout,
        jitter,
        catch_up_window,
        start_at,
        end_at,
        priority,
        fixed_delay,
        doc,
    })
}

/// A `[[job]]` table as JSON, without its name (the store keys it).
fn doc_of(j: &RawJob) -> serde_json::Value {
    let mut doc = serde_json::to_value(j).unwrap_or_default();
    if let Some(o) = doc.as_object_mut() {
        o.remove("name");
    }
    doc
}

/// A job definition kept in the store (the `[[job]]` table's fields, as
/// JSON, without `name`), validated as the config file's `[[job]]` is:
/// one form for both, so they cannot drift. An error names the field.
pub fn job_from_doc(name: &str, doc: &serde_json::Value) -> Result<JobConfig, InvalidInput> {
    parse_doc(name, doc).map_err(|e| match e.kind {
        ConfigErrorKind::Invalid { field, problem, .. } => {
            InvalidInput::new(field.unwrap_or_else(|| "definition".into()), problem)
        }
        ConfigErrorKind::Syntax(m) => InvalidInput::new("definition", m),
        ConfigErrorKind::Io(e) => InvalidInput::new("definition", e.to_string()),
    })
}

fn parse_doc(name: &str, doc: &serde_json::Value) -> Result<JobConfig, ConfigError> {
    let owner = format!("job {name:?}");
    let Some(fields) = doc.as_object() else {
        return Err(ConfigError::invalid(
            &owner,
            None,
            "is not a table of fields; give the [[job]] table's fields (e.g. every = \"5m\", \
             command = [\"true\"])",
        ));
    };
    if fields.contains_key("name") {
        return Err(ConfigError::invalid(
            &owner,
            Some("name"),
            "is given by the job's name, not in its definition; leave it out",
        ));
    }
    let mut fields = fields.clone();
    fields.insert("name".into(), name.into());
    let raw: RawJob = serde_json::from_value(serde_json::Value::Object(fields))
        .map_err(|e| ConfigError::invalid(&owner, None, e.to_string()))?;
    super::check_name(&owner, name)?;
    validate_job(&owner, raw)
}
