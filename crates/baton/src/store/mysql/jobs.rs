//! Schedules on MySQL: one cursor row per job.

use super::MyBackend;
use crate::error::StoreError;
use crate::store::sql_row::job_state;
use crate::store::JobState;

pub(super) async fn job_register(
    b: &MyBackend,
    params: &crate::store::JobRegister<'_>,
) -> Result<JobState, StoreError> {
    let now = &b.names.now;
    let j = &b.names.jobs;
    let job = params.job;
    sqlx::query(&format!(
        "INSERT INTO {j} (name, last_slot, paused, queue) VALUES (?, {now}, 0, ?) \
         ON DUPLICATE KEY UPDATE queue = COALESCE(VALUES(queue), queue)"
    ))
    .bind(job)
    .bind(params.queue.map(str::as_bytes))
    .execute(&b.pool)
    .await?;
    let row = sqlx::query(&format!(
        "SELECT name, last_slot, paused, queue FROM {j} WHERE name = ?"
    ))
    .bind(job)
    .fetch_one(&b.pool)
    .await?;
    job_state(&row)
}

pub(super) async fn job_list(b: &MyBackend) -> Result<Vec<JobState>, StoreError> {
    let rows = sqlx::query(&format!(
        "SELECT name, last_slot, paused, queue FROM {} ORDER BY name",
        b.names.jobs
    ))
    .fetch_all(&b.pool)
    .await?;
    rows.iter().map(job_state).collect()
}
