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
    ms, Advanced, Enqueued, JobAdvance, JobState, Overlap, PauseChange, SlotRecord,
    OVERLAP_BUFFER_FULL, OVERLAP_REPLACED, OVERLAP_SKIPPED, WAITING_RUN_AT_MS,
};

pub(super) async fn job_register(
    b: &RedisBackend,
    params: &crate::store::JobRegister<'_>,
) -> Result<JobState, StoreError> {
    let job = params.job;
    let home = b.ensure_job_home(job, params.queue).await?;
    let fields: Vec<Option<String>> = b
        .qs(
            &home,
            &b.scripts.job_register,
            sargs![
                job,
                params.queue.unwrap_or_default(),
                params.overlap.map(|o| o.as_str()).unwrap_or_default(),
                params.fingerprint.unwrap_or_default()
            ],
        )
        .await?;
    job_state(job.to_string(), &fields)
}

/// A job's state from its hash fields as `job_list.lua` answers them
/// (after the name): `last_slot, paused, queue, overlap, pause_note,
/// pause_by, pause_at, fingerprint`, each `None` when absent.
fn job_state(name: String, f: &[Option<String>]) -> Result<JobState, StoreError> {
    let [slot, paused, queue, overlap, note, by, at, fingerprint] = f else {
        return Err(StoreError::Corrupt(format!(
            "job {name:?}: {} fields",
            f.len()
        )));
    };
    let text = |v: &Option<String>| v.clone().filter(|s| !s.is_empty());
    let ts = |v: &Option<String>, what| opt_ts(v.as_deref().unwrap_or_default(), what);
    let overlap = text(overlap)
        .map(|o| {
            o.parse::<Overlap>()
                .map_err(|_| StoreError::Corrupt(format!("job {name:?}: overlap {o:?}")))
        })
        .transpose()?;
    Ok(JobState {
        last_slot: ts(slot, "last_slot")?,
        paused: paused.as_deref() == Some("1"),
        queue: text(queue),
        overlap,
        pause_change: PauseChange::from_parts(text(note), text(by), ts(at, "pause_at")?),
        fingerprint: text(fingerprint),
        name,
    })
}

/// The arguments of a pause or resume script after the name: the flag,
/// then the note and the author, each a presence flag and its text.
pub(super) fn pause_args(paused: bool, note: &crate::store::PauseNote<'_>) -> [String; 5] {
    let flag = |b: bool| if b { "1" } else { "0" }.to_string();
    [
        flag(paused),
        flag(note.note.is_some()),
        note.note.unwrap_or_default().to_string(),
        flag(note.by.is_some()),
        note.by.unwrap_or_default().to_string(),
    ]
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
    // The definition lives in the index's tag, the job in its queue's: it
    // is read just before the script (a definition written in between is
    // written after this call began, so it governs only slots after this
    // one's lead: DESIGN.md D2).
    if let Some(source) = adv.source {
        if source.superseded(super::jobdefs::mark(b, adv.job).await?, adv.slot) {
            return Ok(Advanced::Superseded);
        }
    }
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
    // A failed call keeps its reserved id's entry in `B where`, whatever
    // the error: the script may have run (its reply lost, or a script
    // error after its writes, which Redis does not undo), and an entry no
    // task took is harmless where a slot's task without one is not found
    // by its id (as a failed enqueue keeps its ids, `task_insert_many`).
    let (what, val, ins) = reply.map_err(StoreError::from)?;
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
        "skipped" => Ok(Advanced::Skipped(Enqueued::new(parse_i64(&val, "id")?))),
        "waiting" => Ok(Advanced::Waiting(Enqueued::new(parse_i64(&val, "id")?))),
        "enqueued" => {
            let id = parse_i64(&val, "id")?;
            Ok(Advanced::Enqueued(if ins == 1 {
                Enqueued::new(id)
            } else {
                Enqueued::existing(id)
            }))
        }
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
    let crate::store::JobSetPaused { job, paused, note } = *params;
    let Some(home) = b.job_home(job, false).await? else {
        return Ok(false);
    };
    let mut args = vec![job.to_string()];
    args.extend(pause_args(paused, &note));
    let v: i64 = b.qs(&home, &b.scripts.job_set_paused, args).await?;
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
        out.extend(jobs_at(b, home, jobs).await?);
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// One job's state: `job_list.lua` on the job's home alone.
pub(super) async fn job_get(b: &RedisBackend, job: &str) -> Result<Option<JobState>, StoreError> {
    let Some(home) = read_retry!(b.job_home(job, false).await)? else {
        return Ok(None);
    };
    Ok(jobs_at(b, &home, vec![job.to_string()]).await?.pop())
}

/// The states of `jobs`, all living at `home`.
async fn jobs_at(
    b: &RedisBackend,
    home: &str,
    jobs: Vec<String>,
) -> Result<Vec<JobState>, StoreError> {
    let rows: Vec<Vec<Option<String>>> =
        read_retry!(b.qs(home, &b.scripts.job_list, jobs.clone()).await)?;
    rows.into_iter()
        .map(|mut row| {
            let name = row.first_mut().and_then(Option::take).unwrap_or_default();
            job_state(name, row.get(1..).unwrap_or_default())
        })
        .collect()
}

/// Pause or resume a queue: its flag (what its claims read), then the
/// index of paused queues (what the stats list); a resume in the other
/// order.
pub(super) async fn queue_set_paused(
    b: &RedisBackend,
    params: &crate::store::QueueSetPaused<'_>,
) -> Result<(), StoreError> {
    let (queue, paused, note) = (params.queue, params.paused, params.note);
    let index = || {
        let mut cmd = redis::cmd(if paused { "SADD" } else { "SREM" });
        cmd.arg(b.key("paused")).arg(queue);
        cmd
    };
    let mut conn = b.conn.clone();
    if !paused {
        index().query_async::<()>(&mut conn).await?;
    }
    let mut args = vec![queue.to_string()];
    args.extend(pause_args(paused, &note));
    b.qs::<i64>(queue, &b.scripts.queue_set_paused, args)
        .await?;
    if paused {
        index().query_async::<()>(&mut conn).await?;
    }
    Ok(())
}
