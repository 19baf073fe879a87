//! Schedules on MySQL: one cursor row per job.

use super::MyBackend;
use crate::error::StoreError;
use crate::store::sql_row::{job_state, JOB_COLS};
use crate::store::JobState;

pub(super) async fn job_register(
    b: &MyBackend,
    params: &crate::store::JobRegister<'_>,
) -> Result<JobState, StoreError> {
    let now = &b.names.now;
    let j = &b.names.jobs;
    let job = params.job;
    sqlx::query(&format!(
        "INSERT INTO {j} (name, last_slot, paused, queue, overlap, fingerprint) \
         VALUES (?, {now}, 0, ?, ?, ?) \
         ON DUPLICATE KEY UPDATE queue = COALESCE(VALUES(queue), queue), \
             overlap = COALESCE(VALUES(overlap), overlap), \
             fingerprint = COALESCE(VALUES(fingerprint), fingerprint)"
    ))
    .bind(job)
    .bind(params.queue.map(str::as_bytes))
    .bind(params.overlap.map(|o| o.as_str()))
    .bind(params.fingerprint)
    .execute(&b.pool)
    .await?;
    let row = sqlx::query(&format!("SELECT {JOB_COLS} FROM {j} WHERE name = ?"))
        .bind(job)
        .fetch_one(&b.pool)
        .await?;
    job_state(&row)
}

pub(super) async fn job_list(b: &MyBackend) -> Result<Vec<JobState>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT {JOB_COLS} FROM {} ORDER BY name",
        b.names.jobs
    ))
    .fetch_all(&b.pool)
    .await?;
    rows.iter().map(job_state).collect()
}

pub(super) async fn job_get(b: &MyBackend, job: &str) -> Result<Option<JobState>, StoreError> {
    sqlx::query(&format!(
        "SELECT {JOB_COLS} FROM {} WHERE name = ?",
        b.names.jobs
    ))
    .bind(job.as_bytes())
    .fetch_optional(&b.pool)
    .await?
    .as_ref()
    .map(job_state)
    .transpose()
}

pub(super) async fn job_set_paused(
    b: &MyBackend,
    params: &crate::store::JobSetPaused<'_>,
) -> Result<bool, StoreError> {
    let crate::store::JobSetPaused { job, paused, note } = *params;
    // `pause_at` moves on every call, so a row found is a row changed.
    let r = sqlx::query(&format!(
        "UPDATE {} SET paused = ?, pause_note = ?, pause_by = ?, pause_at = {} WHERE name = ?",
        b.names.jobs, b.names.now
    ))
    .bind(paused)
    .bind(note.note)
    .bind(note.by)
    .bind(job.as_bytes())
    .execute(&b.pool)
    .await?;
    Ok(r.rows_affected() == 1)
}

pub(super) async fn queue_set_paused(
    b: &MyBackend,
    params: &crate::store::QueueSetPaused<'_>,
) -> Result<(), StoreError> {
    let (queue, paused, note) = (params.queue, params.paused, params.note);
    sqlx::query(&format!(
        "INSERT INTO {} (queue, paused, pause_note, pause_by, pause_at) VALUES (?, ?, ?, ?, {}) \
         ON DUPLICATE KEY UPDATE paused = VALUES(paused), pause_note = VALUES(pause_note), \
             pause_by = VALUES(pause_by), pause_at = VALUES(pause_at)",
        b.names.queues, b.names.now
    ))
    .bind(queue.as_bytes())
    .bind(paused)
    .bind(note.note)
    .bind(note.by)
    .execute(&b.pool)
    .await?;
    if !paused {
        b.announce(vec![crate::store::Wake::now(queue)]);
    }
    Ok(())
}
