//! `/api/v1/jobs`: list the jobs, pause and resume one cluster-wide,
//! trigger one of its slots, backfill a range of them.

use super::*;
use crate::stored_jobs;

/// The job `name` as this server runs it: the store's definition, else
/// its config's job.
async fn job_named(
    state: &State,
    name: &str,
) -> Result<Option<crate::config::JobConfig>, ApiError> {
    let defs = schedule::definitions::list(&state.store).await?;
    Ok(stored_jobs::effective_jobs(&defs, &state.jobs)
        .into_iter()
        .find(|j| j.name == name))
}

/// `GET /api/v1/jobs`.
pub async fn jobs(Extract(state): S) -> Answer {
    let now = state.store.now().await?;
    // The store's definitions stand in for config jobs of the same name.
    let defs = schedule::definitions::list(&state.store).await?;
    let jobs = stored_jobs::effective_jobs(&defs, &state.jobs);
    let statuses = shapes::with_config_jobs(schedule::job_statuses(&state.store).await?, &jobs);
    let rows: Vec<Value> = statuses
        .iter()
        .map(|s| {
            let cfg = jobs.iter().find(|j| j.name == s.state.name);
            let registered = s.state.fingerprint.as_deref();
            let source = stored_jobs::source_text(&s.state.name, &defs, &state.jobs, registered);
            stored_jobs::with_source(shapes::job(s, cfg, now), &defs, &source)
        })
        .collect();
    Ok(Json(Value::Array(rows)))
}

async fn set_paused(state: &State, name: &str, paused: bool, who: Who, b: PauseBody) -> Answer {
    check_name("job", name)?;
    let by = who.recorded(b.by());
    if schedule::set_paused_with(&state.store, name, paused, b.note(&by)?).await? {
        tracing::info!(job = %name, paused, by = %by, "admin API: job paused flag set");
        Ok(Json(
            json!({"name": name, "paused": paused, "note": b.note_text(), "by": by}),
        ))
    } else {
        Err(ApiError::not_found(format!(
            "no job {name:?} in this store (it appears once a scheduler has run it)"
        )))
    }
}

/// `POST /api/v1/jobs/{name}/pause` with `{"note"?, "by"?}`.
pub async fn job_pause(
    Extract(state): S,
    PathText(name): PathText,
    who: Who,
    Body(b): Body<PauseBody>,
) -> Answer {
    set_paused(&state, &name, true, who, b).await
}

/// `POST /api/v1/jobs/{name}/resume` with `{"note"?, "by"?}`.
pub async fn job_resume(
    Extract(state): S,
    PathText(name): PathText,
    who: Who,
    Body(b): Body<PauseBody>,
) -> Answer {
    set_paused(&state, &name, false, who, b).await
}

/// The body of a trigger.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct TriggerBody {
    /// The slot (RFC 3339); default: the latest due slot.
    slot: Option<String>,
    /// Run the slot even if the scheduler skipped it (once).
    #[serde(default)]
    run_skipped: bool,
}

impl Form for TriggerBody {
    const FORM: &'static str = r#"no body, {} (the latest due slot) or {"slot": "2026-01-31T06:00:00Z"} (a slot of the job's schedule, RFC 3339), optionally with "run_skipped": true"#;
}

/// `POST /api/v1/jobs/{name}/trigger` with `{"slot"?: RFC 3339}`.
pub async fn job_trigger(
    Extract(state): S,
    PathText(name): PathText,
    Body(b): Body<TriggerBody>,
) -> Answer {
    check_name("job", &name)?;
    let Some(cfg) = job_named(&state, &name).await? else {
        return Err(ApiError::not_found(format!(
            "no job {name:?} in this server's config or the store's definitions"
        )));
    };
    let job = cfg.job();
    let slot = match &b.slot {
        // The library's hint names the CLI's --any-slot, which this API
        // does not have.
        Some(s) => schedule::trigger_slot(&job, rfc3339("slot", s)?, false).map_err(|e| {
            ApiError::bad("slot", e.problem.replace(", or --any-slot", " (RFC 3339)"))
        })?,
        None => {
            let now = state.store.now().await?;
            schedule::latest_slot(&job.schedule, now).ok_or_else(|| {
                ApiError::bad("slot", "the job has no slot in the past year; give a slot")
            })?
        }
    };
    let report = if b.run_skipped {
        schedule::run_skipped(&state.store, &job, slot, false).await?
    } else {
        let e = schedule::trigger_with(&state.store, &job, slot, false).await?;
        schedule::slot_report(&state.store, &job, slot, e).await?
    };
    Ok(Json(shapes::triggered(&report, &name, slot)))
}

/// The body of a backfill.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct BackfillBody {
    /// The range's first instant (RFC 3339, inclusive).
    from: String,
    /// The range's last instant (RFC 3339, inclusive; not after now).
    to: String,
    /// The most slots the range may hold.
    max: Option<usize>,
    /// Report only.
    #[serde(default)]
    dry_run: bool,
    /// Also run skipped slots, once each.
    #[serde(default)]
    run_skipped: bool,
}

impl Form for BackfillBody {
    const FORM: &'static str = r#"{"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z"} (RFC 3339, both inclusive), optionally with "max": 1000, "dry_run": true, "run_skipped": true"#;
}

/// `POST /api/v1/jobs/{name}/backfill` with `{"from", "to", "max"?,
/// "dry_run"?, "run_skipped"?}`: as `baton jobs backfill --json`.
pub async fn job_backfill(
    Extract(state): S,
    PathText(name): PathText,
    Body(b): Body<BackfillBody>,
) -> Answer {
    check_name("job", &name)?;
    let Some(cfg) = job_named(&state, &name).await? else {
        return Err(ApiError::not_found(format!(
            "no job {name:?} in this server's config or the store's definitions"
        )));
    };
    let range = schedule::Backfill::new(rfc3339("from", &b.from)?, rfc3339("to", &b.to)?)
        .max(b.max.unwrap_or(schedule::BACKFILL_DEFAULT_MAX))
        .dry_run(b.dry_run)
        .run_skipped(b.run_skipped);
    let done = schedule::backfill(&state.store, &cfg.job(), &range).await?;
    Ok(Json(shapes::backfilled(&name, &range, &done)))
}
