//! Script arguments and replies: a new task as script arguments, and task
//! hashes (every field a string, times in ms since the epoch) read back.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Deserialize;

use super::TASK_ARGS;
use crate::error::StoreError;
use crate::store::{
    from_ms, ms, AttemptError, EnqueueOutcome, Enqueued, FencingToken, KeyPolicy, NewTask, RunAt,
    Task, TaskInfo, UniqueHold,
};

pub(super) fn opt_arg(s: Option<&str>) -> String {
    s.map(|s| format!("={s}")).unwrap_or_default()
}

/// The `TASK_ARGS` script arguments describing one new task.
pub(super) fn task_args(t: &NewTask) -> Result<[String; TASK_ARGS], StoreError> {
    let payload = serde_json::to_string(&t.payload)
        .map_err(|e| StoreError::Backend(format!("payload to JSON: {e}")))?;
    let (mode, val) = match t.run_at {
        RunAt::Now => ("n", 0),
        RunAt::Delay(d) => ("d", ms(d)),
        RunAt::At(at) => ("a", at.timestamp_millis()),
    };
    Ok([
        t.queue.clone(),
        t.kind.clone(),
        payload,
        t.priority.to_string(),
        mode.to_string(),
        val.to_string(),
        t.max_attempts.to_string(),
        t.timeout.map(|d| ms(d).to_string()).unwrap_or_default(),
        opt_arg(t.unique_key.as_deref()),
        match t.unique_hold {
            UniqueHold::Unfinished => "0",
            UniqueHold::Forever => "1",
            UniqueHold::UntilFailed => "2",
        }
        .to_string(),
        opt_arg(t.job.as_deref()),
        t.slot
            .map(|s| s.timestamp_millis().to_string())
            .unwrap_or_default(),
        opt_arg(t.traceparent.as_deref()),
        opt_arg(t.concurrency_key.as_deref()),
        match t.key_policy {
            None => String::new(),
            Some(KeyPolicy::Debounce(d)) => format!("d{}", ms(d)),
            Some(KeyPolicy::Throttle(p)) => format!("t{}", ms(p)),
        },
    ])
}

/// One task's answer of `enqueue.lua`: id, what happened (`1` inserted,
/// `0` existing, `2` debounced, `3` throttled), due now, and the
/// throttle's `until` (ms).
pub(super) fn decode_enqueued(r: &[i64]) -> Result<Enqueued, StoreError> {
    let id = r[0];
    Ok(match r[1] {
        1 => Enqueued::new(id),
        0 => Enqueued::existing(id),
        2 => Enqueued {
            id,
            inserted: false,
            outcome: EnqueueOutcome::Debounced,
        },
        3 => Enqueued {
            id,
            inserted: false,
            outcome: EnqueueOutcome::Throttled {
                until: from_ms(r[3])?,
            },
        },
        n => return Err(StoreError::Corrupt(format!("enqueue: outcome {n}"))),
    })
}

pub(super) fn push_task_args(pipe: &mut redis::Pipeline, t: &NewTask) -> Result<(), StoreError> {
    for a in task_args(t)? {
        pipe.arg(a);
    }
    Ok(())
}

pub(super) fn parse_i64(s: &str, what: &str) -> Result<i64, StoreError> {
    s.parse()
        .map_err(|_| StoreError::Corrupt(format!("{what}: not an integer: {s:?}")))
}

pub(super) fn parse_u64(s: &str, what: &str) -> Result<u64, StoreError> {
    s.parse()
        .map_err(|_| StoreError::Corrupt(format!("{what}: not an unsigned integer: {s:?}")))
}

pub(super) fn opt_ts(s: &str, what: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
    if s.is_empty() {
        Ok(None)
    } else {
        Ok(Some(from_ms(parse_i64(s, what)?)?))
    }
}

struct Fields<'a>(&'a HashMap<String, String>);

impl Fields<'_> {
    fn opt(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str).filter(|s| !s.is_empty())
    }
    fn str(&self, k: &str) -> Result<&str, StoreError> {
        self.0
            .get(k)
            .map(String::as_str)
            .ok_or_else(|| StoreError::Corrupt(format!("task field {k} missing")))
    }
    fn i64(&self, k: &str) -> Result<i64, StoreError> {
        parse_i64(self.str(k)?, k)
    }
    fn u32(&self, k: &str) -> Result<u32, StoreError> {
        let v = self.i64(k)?;
        u32::try_from(v)
            .map_err(|_| StoreError::Corrupt(format!("task field {k}: {v} out of range")))
    }
    fn i32(&self, k: &str) -> Result<i32, StoreError> {
        let v = self.i64(k)?;
        i32::try_from(v)
            .map_err(|_| StoreError::Corrupt(format!("task field {k}: {v} out of range")))
    }
    fn ts(&self, k: &str) -> Result<DateTime<Utc>, StoreError> {
        from_ms(self.i64(k)?)
    }
    fn opt_ts(&self, k: &str) -> Result<Option<DateTime<Utc>>, StoreError> {
        self.opt(k).map(|s| from_ms(parse_i64(s, k)?)).transpose()
    }
    fn opt_duration(&self, k: &str) -> Result<Option<Duration>, StoreError> {
        self.opt(k)
            .map(|s| parse_u64(s, k).map(Duration::from_millis))
            .transpose()
    }
    fn json(&self, k: &str) -> Result<serde_json::Value, StoreError> {
        serde_json::from_str(self.str(k)?)
            .map_err(|e| StoreError::Corrupt(format!("task field {k}: bad JSON: {e}")))
    }
    fn opt_string(&self, k: &str) -> Option<String> {
        self.0.get(k).cloned()
    }
}

/// A claimed task from its hash.
pub(super) fn task(m: &HashMap<String, String>) -> Result<Task, StoreError> {
    let f = Fields(m);
    Ok(Task {
        id: f.i64("id")?,
        queue: f.str("queue")?.to_string(),
        kind: f.str("kind")?.to_string(),
        payload: f.json("payload")?,
        priority: f.i32("priority")?,
        attempt: f.u32("attempt")?,
        token: FencingToken(parse_u64(f.str("claim_token")?, "claim_token")?),
        max_attempts: f.u32("max_attempts")?,
        timeout: f.opt_duration("timeout_ms")?,
        run_at: f.ts("run_at")?,
        lease_until: f.ts("lease_until")?,
        job: f.opt_string("job"),
        slot: f.opt_ts("slot")?,
        traceparent: f.opt_string("traceparent"),
    })
}

#[derive(Deserialize)]
struct RawAttemptError {
    attempt: u32,
    at: i64,
    error: String,
    #[serde(default)]
    worker: Option<String>,
    #[serde(default)]
    started_at: Option<i64>,
}

/// Everything about a task from its hash.
pub(super) fn task_info(m: &HashMap<String, String>) -> Result<TaskInfo, StoreError> {
    let f = Fields(m);
    let errors = match f.opt("errors") {
        None => Vec::new(),
        Some(s) => serde_json::from_str::<Vec<RawAttemptError>>(s)
            .map_err(|e| StoreError::Corrupt(format!("task errors: bad JSON: {e}")))?
            .into_iter()
            .map(|r| {
                Ok(AttemptError {
                    attempt: r.attempt,
                    at: from_ms(r.at)?,
                    error: r.error,
                    worker: r.worker,
                    started_at: r.started_at.map(from_ms).transpose()?,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?,
    };
    let progress = match f.opt("progress") {
        None => None,
        Some(_) => Some(f.json("progress")?),
    };
    Ok(TaskInfo {
        id: f.i64("id")?,
        queue: f.str("queue")?.to_string(),
        kind: f.str("kind")?.to_string(),
        payload: f.json("payload")?,
        state: f.str("state")?.parse()?,
        priority: f.i32("priority")?,
        attempt: f.u32("attempt")?,
        max_attempts: f.u32("max_attempts")?,
        timeout: f.opt_duration("timeout_ms")?,
        run_at: f.ts("run_at")?,
        created_at: f.ts("created_at")?,
        started_at: f.opt_ts("started_at")?,
        finished_at: f.opt_ts("finished_at")?,
        lease_until: f.opt_ts("lease_until")?,
        worker: f.opt_string("worker"),
        unique_key: f.opt_string("unique_key"),
        unique_hold: UniqueHold::from_flags(
            f.opt("unique_forever") == Some("1"),
            f.opt("unique_until_failed") == Some("1"),
        ),
        cancel_requested: f.opt("cancel_requested") == Some("1"),
        last_error: f.opt_string("last_error"),
        errors,
        progress,
        job: f.opt_string("job"),
        slot: f.opt_ts("slot")?,
        traceparent: f.opt_string("traceparent"),
        concurrency_key: f.opt_string("concurrency_key"),
    })
}

/// A fencing token from a script's integer reply.
pub(super) fn token_u64(n: i64) -> Result<u64, StoreError> {
    u64::try_from(n).map_err(|_| StoreError::Corrupt(format!("lock token: negative: {n}")))
}
