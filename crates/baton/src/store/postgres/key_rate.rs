//! The claim under a rate per concurrency key on PostgreSQL
//! (`Backend::task_claim_key_rated`, planned by `store::key_rate`): inside
//! one transaction holding the queue's advisory lock (the one capped and
//! fair claims take, so claimers of the queue take turns), read the walk
//! of due candidates past used-up and capped keys (`FOR UPDATE SKIP
//! LOCKED`, as other claims may run beside), the logs of their keys,
//! claim the picked ones and write their keys' logs.

use std::collections::HashMap;

use sqlx::Row;

use super::{dur, PgBackend};
use crate::error::StoreError;
use crate::store::key_rate::{self, Running};
use crate::store::sql_row::{claimed_task, CLAIM_COLS};
use crate::store::{KeyRate, Task, TaskClaim};

impl PgBackend {
    /// The store's clock in µs, inside `tx` (the transaction's start).
    pub(super) async fn now_us_on(&self, tx: &mut sqlx::PgConnection) -> Result<i64, StoreError> {
        Ok(self
            .q(&format!("SELECT {}", self.names.now_us))
            .fetch_one(&mut *tx)
            .await?
            .try_get(0)?)
    }

    /// A claim under `rate` per key on `tx` at store time `now_us` (the
    /// transaction's `now()`): the tasks, and when the claim came back
    /// short the earliest `free_at` (µs) of a used-up key with pending
    /// tasks.
    pub(super) async fn claim_keys_in(
        &self,
        tx: &mut sqlx::PgConnection,
        req: &TaskClaim<'_>,
        rate: KeyRate,
        now_us: i64,
    ) -> Result<(Vec<Task>, Option<i64>), StoreError> {
        if req.fair {
            return Err(crate::store::key_rate_fair_refused());
        }
        self.lock_queue(tx, req.queue).await?;
        let n = &self.names;
        let (t, q, kr, now, now_sql) = (&n.tasks, &n.queues, &n.key_rates, &n.now, &n.now_us);
        let mut tasks = Vec::new();
        if req.limit > 0 {
            let running = if req.max_running.is_some() || req.per_key_max_running.is_some() {
                Running::from_rows(
                    self.q(&format!(
                        "SELECT concurrency_key, count(*) FROM {t} \
                         WHERE state = 'running' AND queue = $1 GROUP BY concurrency_key"
                    ))
                    .bind(req.queue)
                    .fetch_all(&mut *tx)
                    .await?
                    .iter()
                    .map(|r| Ok((r.try_get(0)?, r.try_get(1)?)))
                    .collect::<Result<Vec<_>, StoreError>>()?,
                )
            } else {
                Running::default()
            };
            let cands = self
                .q(&format!(
                    "SELECT id, concurrency_key, attempt + 1 < max_attempts AS spare FROM {t} \
                     WHERE state = 'pending' AND queue = $1 AND run_at <= {now} \
                         AND NOT cancel_requested \
                         AND NOT EXISTS (SELECT 1 FROM {q} WHERE name = $1 AND paused) \
                         AND (concurrency_key IS NULL OR ( \
                             NOT EXISTS (SELECT 1 FROM {kr} WHERE {kr}.queue = $1 \
                                 AND {kr}.ckey = {t}.concurrency_key AND {kr}.free_at > $2) \
                             AND concurrency_key <> ALL($3::text[]))) \
                     ORDER BY priority, run_at, id LIMIT $4 FOR UPDATE SKIP LOCKED"
                ))
                .bind(req.queue)
                .bind(now_us)
                .bind(key_rate::full_keys(&running, req))
                .bind(key_rate::walk_len(req))
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(key_rate::candidate)
                .collect::<Result<Vec<_>, StoreError>>()?;
            let logs = self
                .q(&format!(
                    "SELECT ckey, starts FROM {kr} WHERE queue = $1 AND ckey = ANY($2::text[])"
                ))
                .bind(req.queue)
                .bind(key_rate::keys_of(&cands))
                .fetch_all(&mut *tx)
                .await?
                .iter()
                .map(key_rate::key_log)
                .collect::<Result<HashMap<_, _>, StoreError>>()?;
            let ids = key_rate::pick(req, rate, &cands, &logs, &running, now_us);
            if !ids.is_empty() {
                // Only the primary key can serve this UPDATE (`|| ''`
                // hides the other columns from the planner): a generic
                // plan on a table without statistics walked the queue's
                // whole backlog on its index instead (36 ms a claim at
                // 100k pending, seen on the fair claim's twin).
                let rows = self
                    .q(&format!(
                        "UPDATE {t} SET state = 'running', attempt = attempt + 1, \
                             started_at = {now}, \
                             lease_until = {now} + $3 * interval '1 millisecond', worker = $2, \
                             claim_token = greatest(claim_token + 1, {now_sql}) \
                         WHERE id = ANY($4::int8[]) AND state || '' = 'pending' \
                             AND queue || '' = $1 \
                         RETURNING {CLAIM_COLS}"
                    ))
                    .bind(req.queue)
                    .bind(req.worker)
                    .bind(dur(req.lease))
                    .bind(&ids)
                    .fetch_all(&mut *tx)
                    .await?;
                let keys = key_rate::key_by_id(&cands);
                let logged = key_rate::logged_starts(req, &ids, now_us);
                tasks = rows
                    .iter()
                    .map(claimed_task)
                    .collect::<Result<Vec<_>, _>>()?;
                tasks.sort_by_key(|t| (t.priority, t.run_at, t.id));
                // Every task of the claim started at `now()`: the
                // transaction's start, the instant `now_us` was read at; a
                // buffered one is logged at its hold's end.
                let started = tasks.iter().filter_map(|t| {
                    let at = logged.get(&t.id).copied().unwrap_or(now_us);
                    keys.get(&t.id).map(|k| (k.clone(), at))
                });
                let writes = key_rate::logs_after(rate, logs, started);
                let cols = |f: fn(&key_rate::LogWrite) -> String| -> Vec<String> {
                    writes.iter().map(f).collect()
                };
                self.q(&format!(
                    "INSERT INTO {kr} (queue, ckey, starts, free_at, idle_at) \
                     SELECT $1, k, s, f, i FROM unnest($2::text[], $3::text[], $4::int8[], \
                         $5::int8[]) AS w(k, s, f, i) \
                     ON CONFLICT (queue, ckey) DO UPDATE SET starts = excluded.starts, \
                         free_at = excluded.free_at, idle_at = excluded.idle_at"
                ))
                .bind(req.queue)
                .bind(cols(|w| w.key.clone()))
                .bind(cols(|w| w.starts.clone()))
                .bind(writes.iter().map(|w| w.free_at).collect::<Vec<_>>())
                .bind(writes.iter().map(|w| w.idle_at).collect::<Vec<_>>())
                .execute(&mut *tx)
                .await?;
            }
        }
        self.q(&format!(
            "DELETE FROM {kr} WHERE (queue, ckey) IN (SELECT queue, ckey FROM {kr} \
             WHERE queue = $1 AND idle_at < $2 LIMIT $3)"
        ))
        .bind(req.queue)
        .bind(now_us)
        .bind(key_rate::PRUNE_BATCH)
        .execute(&mut *tx)
        .await?;
        if tasks.len() >= req.limit as usize {
            return Ok((tasks, None));
        }
        let next: Option<i64> = self
            .q(&format!(
                "SELECT free_at FROM {kr} WHERE queue = $1 AND free_at > $2 \
                     AND EXISTS (SELECT 1 FROM {t} WHERE state = 'pending' AND queue = $1 \
                         AND concurrency_key = {kr}.ckey) \
                 ORDER BY free_at LIMIT 1"
            ))
            .bind(req.queue)
            .bind(now_us)
            .fetch_optional(&mut *tx)
            .await?
            .map(|r| r.try_get(0))
            .transpose()?;
        Ok((tasks, next))
    }
}
