//! The claim under a rate per concurrency key on PostgreSQL
//! (`Backend::task_claim_key_rated`, the rules of `store::key_rate`): one
//! call of the function `<prefix>key_rated_claim` ([`key_rate_fn`]), which
//! takes the queue's advisory lock (the one capped and fair claims take,
//! so claimers of the queue take turns), walks the due candidates past
//! used-up and capped keys (`FOR UPDATE SKIP LOCKED`, as other claims may
//! run beside), reads the logs of their keys, claims the picked ones and
//! writes their keys' logs. The lock is held for the server's time only:
//! the claim was 9–10 round trips, 7–8 of them under the lock.
//!
//! [`key_rate_fn`]: super::key_rate_fn

use sqlx::Row;

use super::key_rate_fn::{function_name, returns};
use super::{PgBackend, MAX_MS};
use crate::error::StoreError;
use crate::store::key_rate::{self, BUFFER_HOLD, PRUNE_BATCH, PRUNE_GRACE};
use crate::store::sql_row::{claimed_task, CLAIM_COLS};
use crate::store::{KeyRate, Task, TaskClaim};

/// What a claim under a rate per key answers.
pub(super) struct KeyClaimed {
    /// The claimed tasks, in claim order.
    pub(super) tasks: Vec<Task>,
    /// When the claim came back short, the earliest `free_at` (µs) of a
    /// used-up key with pending tasks.
    pub(super) key_next: Option<i64>,
    /// The claim's instant (µs of the store's clock), read once the
    /// function held its keys' locks: its tasks' `started_at`.
    pub(super) now_us: i64,
}

impl PgBackend {
    /// A claim under `rate` per key on `conn` (in a transaction, whose
    /// `now()` is the claim's, or not): one call of the key rated claim
    /// function.
    pub(super) async fn claim_keys<'c, E>(
        &self,
        conn: E,
        req: &TaskClaim<'_>,
        rate: KeyRate,
    ) -> Result<KeyClaimed, StoreError>
    where
        E: sqlx::Executor<'c, Database = sqlx::Postgres>,
    {
        if req.fair {
            return Err(crate::store::key_rate_fair_refused());
        }
        let sql = format!(
            "SELECT {CLAIM_COLS}, key_next, now_us FROM {}($1, $2, $3, $4, $5, $6, $7, $8, $9, \
                 $10, $11, $12, $13, $14, {}) AS f({})",
            function_name(&self.names),
            self.names.now,
            returns()
        );
        // `per` clamped as durations are (so the sums stay in range).
        let per = key_rate::us(rate.per).min(MAX_MS.saturating_mul(1000));
        let sent = tokio::time::Instant::now();
        let rows = self
            .claim_call(&sql, req)
            .bind(key_rate::walk_len(req))
            .bind(i64::from(rate.max))
            .bind(per)
            .bind(key_rate::us(BUFFER_HOLD))
            .bind(key_rate::us(PRUNE_GRACE))
            .bind(PRUNE_BATCH)
            .bind(self.lock_key(req.queue))
            .fetch_all(conn)
            .await?;
        self.claim_took(sent.elapsed());
        let mut tasks = Vec::with_capacity(rows.len());
        let mut last = None;
        for row in &rows {
            if row.try_get::<Option<i64>, _>("id")?.is_some() {
                tasks.push(claimed_task(row)?);
            } else {
                last = Some((
                    row.try_get::<Option<i64>, _>("key_next")?,
                    row.try_get::<i64, _>("now_us")?,
                ));
            }
        }
        let (key_next, now_us) = last.ok_or_else(|| {
            StoreError::Corrupt("the key rated claim function returned no closing row".into())
        })?;
        tasks.sort_by_key(|t| (t.priority, t.run_at, t.id));
        Ok(KeyClaimed {
            tasks,
            key_next,
            now_us,
        })
    }
}
