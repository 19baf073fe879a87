//! Schedules on Redis: a job's cursor, its runs and its slot tombstones
//! live with its queue's keys (its "home"), so a slot and its task are one
//! script on one shard. `job_advance.lua` runs the one decision of
//! `store::job_advance::job_advance` (see there).

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use chrono::{DateTime, Utc};

use super::decode::{opt_ts, parse_i64, task_args};
use super::RedisBackend;
use crate::error::StoreError;
use crate::store::{
    ms, Advanced, Enqueued, JobAdvance, JobState, Overlap, SlotRecord, OVERLAP_BUFFER_FULL,
    OVERLAP_REPLACED, OVERLAP_SKIPPED, WAITING_RUN_AT_MS,
};

pub(super) async fn job_register(
    b: &RedisBackend,
    params: &crate::store::JobRegister<'_>,
) -> Result<JobState, StoreError> {
    let job = params.job;
    let home = b.ensure_job_home(job, params.queue).await?;
    let (slot, paused, queue): (String, String, String) = b
        .qs(
            &home,
            &b.scripts.job_register,
            sargs![job, params.queue.unwrap_or_default()],
        )
        .await?;
    Ok(JobState {
        name: job.to_string(),
        last_slot: opt_ts(&slot, "last_slot")?,
        paused: paused == "1",
        queue: (!queue.is_empty()).then_some(queue),
    })
}

pub(super) async fn slot_get(
    b: &RedisBackend,
    key: &str,
) -> Result<Option<crate::store::PrunedSlot>, StoreError> {
    // The key is `job|slot`: the tombstone is in the job's home.
    let Some((job, _)) = key.rsplit_once('|') else {
        return Ok(None);
    };
    let Some(home) = read_retry!(b.job_home(job, false).await)? else {
        return Ok(None);
    };
    let v: Vec<String> = read_retry!(b.qs(&home, &b.scripts.slot_get, sargs![key]).await)?;
    let [job, slot, id, state, error, finished, has_error] = v.as_slice() else {
        if v.is_empty() {
            return Ok(None);
        }
        return Err(StoreError::Corrupt(format!(
            "slot tombstone {key:?}: {} fields",
            v.len()
        )));
    };
    Ok(Some(crate::store::PrunedSlot {
        key: key.to_string(),
        job: job.clone(),
        slot: opt_ts(slot, "slot")?,
        task_id: parse_i64(id, "task_id")?,
        state: std::str::FromStr::from_str(state)?,
        last_error: (has_error == "1").then(|| error.clone()),
        finished_at: opt_ts(finished, "finished_at")?,
    }))
}

pub(super) async fn job_advance(
    b: &RedisBackend,
    adv: &JobAdvance<'_>,
) -> Result<Advanced, StoreError> {
    let opt_ms = |t: Option<DateTime<Utc>>| {
        t.map(|t| t.timestamp_millis().to_string())
            .unwrap_or_default()
    };
    let (record, lease, worker, reason) = match adv.record {
        SlotRecord::Enqueue => ("e", 0, "", OVERLAP_SKIPPED),
        SlotRecord::Run { worker, lease } => ("r", ms(lease), worker, OVERLAP_SKIPPED),
        SlotRecord::Skip { reason } => ("s", 0, "", reason),
    };
    // The job's keys live in its queue's tag, so the slot and its
    // task are one script; a task of another queue moves the job.
    let home = match adv.task {
        Some(t) => b.ensure_job_home(adv.job, Some(&t.queue)).await?,
        None => match b.job_home(adv.job, false).await? {
            Some(h) => h,
            None => return Ok(Advanced::UnknownJob),
        },
    };
    let reserved = match adv.task {
        Some(_) => Some(b.reserve_ids(&[home.as_str()]).await?),
        None => None,
    };
    let base = b.qbase(&home);
    let mut inv = b.scripts.job_advance.key(format!("{base}counts"));
    inv.arg(&base)
        .arg(adv.job)
        .arg(opt_ms(adv.expected))
        .arg(adv.slot.timestamp_millis())
        .arg(match adv.overlap {
            Overlap::Skip => "f",
            Overlap::Allow => "a",
            Overlap::BufferOne => "b1",
            Overlap::BufferAll => "ba",
            // The store's decision is the same; the stop differs (the
            // worker's, see `Overlap::TerminateOther`).
            Overlap::CancelOther | Overlap::TerminateOther => "c",
        })
        .arg(reason)
        .arg(record)
        .arg(lease)
        .arg(worker)
        .arg(opt_ms(adv.batch_after))
        .arg(if adv.due_only { "1" } else { "0" })
        .arg(opt_ms(adv.until))
        .arg(if adv.task.is_some() { "1" } else { "0" })
        .arg(opt_ms(adv.not_before))
        .arg(reserved.map(|id| id.to_string()).unwrap_or_default());
    if let Some(task) = adv.task {
        for a in task_args(task)? {
            inv.arg(a);
        }
        inv.arg(OVERLAP_BUFFER_FULL)
            .arg(OVERLAP_REPLACED)
            .arg(WAITING_RUN_AT_MS);
    }
    let reply: Result<(String, String, i64), redis::RedisError> = b.invoke(&mut inv).await;
    let (what, val, ins) = match reply {
        Ok(r) => r,
        Err(e) => {
            let e = StoreError::from(e);
            if !e.is_retryable() {
                b.unreserve(&reserved.into_iter().collect::<Vec<_>>()).await;
            }
            return Err(e);
        }
    };
    let id = matches!(what.as_str(), "enqueued" | "skipped" | "waiting")
        .then(|| parse_i64(&val, "id"))
        .transpose()?;
    if let Some(r) = reserved {
        if id != Some(r) {
            b.unreserve(&[r]).await;
        } else if record == "r" {
            b.remember_task(r, &home);
        }
    }
    match what.as_str() {
        "unknown" => {
            // A stale memory of the job's home reads afresh next time.
            if let Ok(mut m) = b.job_homes.lock() {
                m.remove(adv.job);
            }
            Ok(Advanced::UnknownJob)
        }
        "paused" => Ok(Advanced::Paused),
        "moved" => Ok(Advanced::Moved(opt_ts(&val, "last_slot")?)),
        "notdue" => Ok(Advanced::NotDue {
            now: opt_ts(&val, "now")?
                .ok_or_else(|| StoreError::Corrupt("job advance: no store time".into()))?,
        }),
        "skipped" => Ok(Advanced::Skipped(Enqueued {
            id: parse_i64(&val, "id")?,
            inserted: true,
        })),
        "waiting" => Ok(Advanced::Waiting(Enqueued {
            id: parse_i64(&val, "id")?,
            inserted: true,
        })),
        "enqueued" => Ok(Advanced::Enqueued(Enqueued {
            id: parse_i64(&val, "id")?,
            inserted: ins == 1,
        })),
        other => Err(StoreError::Corrupt(format!(
            "job advance: unexpected reply {other:?}"
        ))),
    }
}

pub(super) async fn job_release(b: &RedisBackend, job: &str) -> Result<Option<i64>, StoreError> {
    let Some(home) = b.job_home(job, false).await? else {
        return Ok(None);
    };
    let id: String = b
        .qs(
            &home,
            &b.scripts.job_release,
            sargs![job, WAITING_RUN_AT_MS],
        )
        .await?;
    if id.is_empty() {
        return Ok(None);
    }
    Ok(Some(parse_i64(&id, "id")?))
}

pub(super) async fn job_set_paused(
    b: &RedisBackend,
    params: &crate::store::JobSetPaused<'_>,
) -> Result<bool, StoreError> {
    let crate::store::JobSetPaused { job, paused } = *params;
    let Some(home) = b.job_home(job, false).await? else {
        return Ok(false);
    };
    let v: i64 = b
        .qs(
            &home,
            &b.scripts.job_set_paused,
            sargs![job, if paused { "1" } else { "0" }],
        )
        .await?;
    Ok(v == 1)
}

pub(super) async fn job_list(b: &RedisBackend) -> Result<Vec<JobState>, StoreError> {
    let homes: HashMap<String, String> = read_retry!({
        let mut conn = b.conn.clone();
        redis::cmd("HGETALL")
            .arg(b.key("jobq"))
            .query_async::<HashMap<String, String>>(&mut conn)
            .await
            .map_err(StoreError::from)
    })?;
    let mut by_home: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for (job, home) in &homes {
        by_home.entry(home).or_default().push(job.clone());
    }
    let mut out = Vec::new();
    for (home, jobs) in by_home {
        let rows: Vec<(String, String, String, String)> =
            read_retry!(b.qs(home, &b.scripts.job_list, jobs.clone()).await)?;
        for (name, slot, paused, queue) in rows {
            out.push(JobState {
                last_slot: opt_ts(&slot, "last_slot")?,
                paused: paused == "1",
                queue: (!queue.is_empty()).then_some(queue),
                name,
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}
