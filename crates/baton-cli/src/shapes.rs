//! The JSON shapes shared by the CLI's `--json` output and the admin API
//! (`/api/v1`): one function per shape, so both always answer alike.

use baton::schedule::JobStatus;
use baton::store::LockInfo;
use chrono::{DateTime, Utc};
use serde_json::{json, Value};

use crate::config::JobConfig;
use crate::output;

/// The timestamp fields of a task's JSON.
const TASK_TIMES: &[&str] = &[
    "created_at",
    "run_at",
    "started_at",
    "finished_at",
    "lease_until",
    "slot",
    "at",
];

/// A task (or a list of tasks) as JSON, with every timestamp in
/// [`output::ts`]'s form, each attempt's error under `errors`, and its
/// unique key decoded under `unique` with its `hold` (`unique_key` is the
/// stored form).
pub fn task(v: &impl serde::Serialize) -> Result<Value, serde_json::Error> {
    let mut v = serde_json::to_value(v)?;
    let fix = |t: &mut Value| {
        if let Some(k) = t.get("unique_key").and_then(Value::as_str) {
            let hold: baton::queue::UniqueHold = t
                .get("unique_hold")
                .and_then(Value::as_str)
                .and_then(|h| h.parse().ok())
                .unwrap_or_default();
            let key = baton::queue::UniqueKey::parse(k);
            let mut u = unique(&key);
            u["hold"] = hold.as_str().into();
            u["text"] = unique_text(&key, hold).into();
            t["unique"] = u;
        }
        output::normalize_times(t, TASK_TIMES);
        if let Some(errors) = t.get_mut("errors") {
            output::normalize_times(errors, TASK_TIMES);
        }
    };
    match &mut v {
        Value::Array(items) => items.iter_mut().for_each(fix),
        other => fix(other),
    }
    Ok(v)
}

/// Audit records as JSON, each `at` in [`output::ts`]'s form (`baton
/// audit --json` and `GET /api/v1/audit`).
pub fn audit(records: &[baton::store::AuditRecord]) -> Result<Value, serde_json::Error> {
    let mut v = serde_json::to_value(records)?;
    if let Value::Array(items) = &mut v {
        for r in items {
            output::normalize_times(r, &["at"]);
        }
    }
    Ok(v)
}

/// One bucket's counts with the averages a chart draws (`wait_avg_ms`,
/// `run_avg_ms`; null without observations) and `finished` (succeeded +
/// dead + cancelled: attempts that ended their task).
fn counts(c: &baton::store::StatsCounts) -> Value {
    let avg = |sum: i64, n: i64| (n > 0).then(|| sum / n);
    json!({
        "succeeded": c.succeeded, "failed": c.failed, "dead": c.dead,
        "cancelled": c.cancelled, "finished": c.succeeded + c.dead + c.cancelled,
        "started": c.wait_n, "wait_avg_ms": avg(c.wait_ms, c.wait_n),
        "wait_max_ms": c.wait_max_ms, "ended": c.run_n,
        "run_avg_ms": avg(c.run_ms, c.run_n), "run_max_ms": c.run_max_ms,
    })
}

/// A rollup series (`GET /api/v1/stats/series`): `{range, step_secs, from,
/// to, points: [{at, …counts}], totals, series: [{queue, kind, job,
/// …counts}]}` (`job` null for tasks of no job), times in [`output::ts`]'s form.
pub fn series(s: &baton::stats::Series) -> Value {
    let with = |mut v: Value, extra: Value| {
        if let (Value::Object(m), Value::Object(e)) = (&mut v, extra) {
            m.extend(e);
        }
        v
    };
    json!({
        "range": s.range.as_str(),
        "step_secs": s.step_secs,
        "from": output::ts(s.from),
        "to": output::ts(s.to),
        "points": s.points.iter().map(|p| with(counts(&p.counts), json!({"at": output::ts(p.at)}))).collect::<Vec<_>>(),
        "totals": counts(&s.totals),
        "series": s.series.iter().map(|t| with(counts(&t.counts), json!({"queue": t.queue, "kind": t.kind, "job": t.job}))).collect::<Vec<_>>(),
    })
}

/// A decoded unique key: the caller's key, scope, args hash, period
/// bucket, and `text` (what `tasks show` prints).
pub fn unique(u: &baton::queue::UniqueKey) -> Value {
    json!({
        "key": u.key, "scope": u.scope.as_str(), "args": u.args,
        "period": u.period.map(|p| baton::format_duration(p.period)),
        "bucket_start": u.period.map(|p| output::ts(p.start)),
        "composed": u.composed, "text": u.to_string(),
    })
}

/// A unique key as `tasks show`, `tasks list` and the dashboard print it:
/// the decoded key (`42 [kind-in-queue]`), and its hold when it is not the
/// default (`42 [kind-in-queue] (until-failed)`).
pub fn unique_text(key: &baton::queue::UniqueKey, hold: baton::queue::UniqueHold) -> String {
    match hold {
        baton::queue::UniqueHold::Unfinished => key.to_string(),
        other => format!("{key} ({other})"),
    }
}

/// The answer to an enqueue: the task's id, whether it was inserted
/// (false when its unique key was taken), and `outcome`: `inserted`,
/// `existing` (the key's holder), `debounced` (the pending holder took the
/// new payload and due time) or `throttled` (nothing written; `until`:
/// when the key is accepted again).
pub fn enqueued(e: &baton::store::Enqueued) -> Value {
    use baton::store::EnqueueOutcome as O;
    let (outcome, until) = match e.outcome {
        O::Inserted => ("inserted", None),
        O::Existing => ("existing", None),
        O::Debounced => ("debounced", None),
        O::Throttled { until } => ("throttled", Some(output::ts(until))),
    };
    let mut v = json!({"id": e.id, "inserted": e.inserted, "outcome": outcome});
    if let Some(u) = until {
        v["until"] = json!(u);
    }
    v
}

/// The answer to a trigger: the run's task, whether it was new, the job
/// and the slot, and what became of the slot (`outcome`: pending, running,
/// succeeded, failed, skipped, cancelled; `reason`: why it was skipped or
/// its last error; `pruned`: its task is gone, this is its tombstone;
/// `rerun`: `--run-skipped` ran a skipped slot).
pub fn triggered(r: &baton::schedule::SlotReport, job: &str, slot: DateTime<Utc>) -> Value {
    json!({
        "id": r.id, "inserted": r.inserted, "job": job, "slot": output::ts(slot),
        "outcome": r.outcome.as_str(), "reason": r.reason,
        "finished_at": r.finished_at.map(output::ts), "pruned": r.pruned, "rerun": r.rerun,
    })
}

/// A backfill's answer (`baton jobs backfill --json`, the admin API): the
/// range, the counts, and each slot as a trigger answers it, with
/// `runs_now` (enqueued by this backfill, or would be in a dry run).
pub fn backfilled(
    job: &str,
    b: &baton::schedule::Backfill,
    done: &[baton::schedule::BackfilledSlot],
) -> Value {
    let runs = done.iter().filter(|s| s.runs_now(b)).count();
    let slots: Vec<Value> = done
        .iter()
        .map(|s| {
            let mut v = match &s.run {
                Some(r) => triggered(r, job, s.slot),
                None => json!({"job": job, "slot": output::ts(s.slot), "id": null}),
            };
            v["runs_now"] = Value::Bool(s.runs_now(b));
            v
        })
        .collect();
    json!({
        "job": job, "from": output::ts(b.from), "to": output::ts(b.to),
        "dry_run": b.dry_run, "slots": slots.len(),
        "enqueued": if b.dry_run { 0 } else { runs },
        "would_enqueue": if b.dry_run { runs } else { 0 },
        "left_alone": done.len() - runs, "runs": slots,
    })
}

/// One lock record.
pub fn lock(l: &LockInfo) -> Value {
    json!({
        "name": l.name, "holder": l.holder, "token": l.token.0,
        "locked_at": output::ts(l.locked_at), "lock_until": output::ts(l.lock_until),
        "state": if l.held { "held" } else { "expired" },
    })
}

/// A released lease (`GET /api/v1/locks/history`).
pub fn lock_record(r: &baton::store::LockRecord) -> Value {
    json!({
        "name": r.name, "holder": r.holder, "token": r.token.0,
        "acquired_at": output::ts(r.acquired_at), "released_at": output::ts(r.released_at),
        "held_ms": (r.released_at - r.acquired_at).num_milliseconds(),
    })
}

/// A job's next fire time after `now`, in the job's own time zone (with
/// its offset) for cron jobs, UTC otherwise.
pub fn next_fire(j: &JobConfig, now: DateTime<Utc>) -> Option<String> {
    let t = j.schedule.next_after(now)?;
    Some(match &j.schedule {
        baton::schedule::spec::Schedule::Cron { tz, .. } => t
            .with_timezone(tz)
            .to_rfc3339_opts(chrono::SecondsFormat::Millis, true),
        _ => output::ts(t),
    })
}

/// How many next fire times a job's JSON (and the dashboard) lists.
pub const NEXT_FIRES: usize = 3;

/// A job's next [`NEXT_FIRES`] fire times after `now`, each `{at (UTC),
/// local (the job's zone, with its offset), zone, dst}`.
pub fn next_fires(j: &JobConfig, now: DateTime<Utc>) -> Vec<Value> {
    j.job()
        .next_fires(now, NEXT_FIRES)
        .into_iter()
        .map(|f| json!({"at": output::ts(f.at), "local": f.local, "zone": f.zone, "dst": f.dst}))
        .collect()
}

/// The last pause or resume of a job or queue: `{note, by, at}`, or null.
pub fn pause_change(c: Option<&baton::store::PauseChange>) -> Value {
    c.map_or(
        Value::Null,
        |c| json!({"note": c.note, "by": c.by, "at": output::ts(c.at)}),
    )
}

/// A pause change as one line of text: `"note" — by, at` (`-` when none).
pub fn pause_text(c: Option<&baton::store::PauseChange>) -> String {
    let Some(c) = c else { return "-".into() };
    let mut parts = Vec::new();
    if let Some(n) = &c.note {
        parts.push(format!("{:?}", n));
    }
    if let Some(b) = &c.by {
        parts.push(format!("by {b}"));
    }
    parts.push(format!("at {}", output::ts(c.at)));
    parts.join(" ")
}

/// One job: its schedule, overlap policy (the config's, else the one the
/// store recorded), misfire policy and next fire times (when its config is
/// known), pause flag with the last pause or resume (`pause_change`:
/// note, by, at), last slot and last run with its outcome.
pub fn job(s: &JobStatus, cfg: Option<&JobConfig>, now: DateTime<Utc>) -> Value {
    let overlap = cfg.map(|j| j.overlap).or(s.state.overlap);
    json!({
        "name": s.state.name,
        "queue": cfg.map(|j| j.queue.clone()).or_else(|| s.state.queue.clone()),
        "schedule": cfg.map(|j| j.schedule.to_string()),
        "overlap": overlap.map(|o| o.as_str()),
        "misfire": cfg.map(|j| j.misfire.to_string()),
        "paused": s.state.paused,
        "pause_change": pause_change(s.state.pause_change.as_ref()),
        "last_slot": s.state.last_slot.map(output::ts),
        "next_fire": cfg.and_then(|j| next_fire(j, now)),
        "next_fires": cfg.map(|j| next_fires(j, now)).unwrap_or_default(),
        "last_run": s.last_run.as_ref().map(|t| json!({
            "task": t.id, "slot": t.slot.map(output::ts), "state": t.state, "attempt": t.attempt, "last_error": t.last_error,
            "started_at": t.started_at.map(output::ts), "finished_at": t.finished_at.map(output::ts),
        })),
    })
}

/// A queue's counts (as [`baton::store::QueueStats`] serializes them) with
/// its last pause or resume (`pause_change`) in this module's time format.
pub fn queue(s: &baton::store::QueueStats) -> Value {
    let mut v = serde_json::to_value(s).unwrap_or_default();
    v["pause_change"] = pause_change(s.pause_change.as_ref());
    v["limits"] = limits(s.limits.as_ref());
    v
}

/// A queue's declared limits: its fields, `summary` (as `baton queues`
/// prints it), who declared them and when, or null.
pub fn limits(d: Option<&baton::store::DeclaredLimits>) -> Value {
    let Some(d) = d else { return Value::Null };
    let mut v = serde_json::to_value(&d.limits).unwrap_or_default();
    v["summary"] = d.limits.describe().into();
    v["declared_by"] = d.by.clone().into();
    v["declared_at"] = output::ts(d.at).into();
    v
}

/// The job list: the store's jobs plus the config's jobs the store has not
/// seen yet (they appear once a scheduler registered them).
pub fn with_config_jobs(mut statuses: Vec<JobStatus>, jobs: &[JobConfig]) -> Vec<JobStatus> {
    for j in jobs {
        if !statuses.iter().any(|s| s.state.name == j.name) {
            statuses.push(JobStatus {
                state: baton::store::JobState {
                    name: j.name.clone(),
                    last_slot: None,
                    paused: false,
                    queue: Some(j.queue.clone()),
                    overlap: Some(j.overlap),
                    pause_change: None,
                    fingerprint: None,
                },
                last_run: None,
            });
        }
    }
    statuses
}

/// A key's rate state as `baton queues keys` prints it: `used/max` starts
/// in the window, and the next allowed start (`now` when it may start).
pub fn key_rate_text(r: Option<&baton::store::KeyRateState>) -> (String, String) {
    match r {
        Some(r) => (
            format!("{}/{}", r.started_in_window, r.max),
            r.next_start_at
                .map_or_else(|| "now".to_string(), output::ts),
        ),
        None => ("-".into(), "-".into()),
    }
}
