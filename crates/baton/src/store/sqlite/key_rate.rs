//! The claim under a rate per concurrency key on SQLite
//! (`Backend::task_claim_key_rated`, planned by `store::key_rate`): inside
//! one `BEGIN IMMEDIATE` transaction (so no other claim interleaves), read
//! the walk of due candidates past used-up and capped keys, the logs of
//! their keys, claim the picked ones and write their keys' logs.

use std::collections::HashMap;

use sqlx::sqlite::SqliteConnection;
use sqlx::Row;

use super::rows::json_text;
use super::{SqliteBackend, NOW, NOW_US};
use crate::error::StoreError;
use crate::store::key_rate::{self, Running};
use crate::store::rate::StartLog;
use crate::store::{KeyRate, Task, TaskClaim};

impl SqliteBackend {
    /// The store's clock in µs, inside `tx`.
    pub(super) async fn now_us_on(&self, tx: &mut SqliteConnection) -> Result<i64, StoreError> {
        Ok(sqlx::query_scalar(&format!("SELECT {NOW_US}"))
            .fetch_one(&mut *tx)
            .await?)
    }

    /// A claim under `rate` per key on `tx` (inside `BEGIN IMMEDIATE`) at
    /// store time `now_us`: the tasks, and when the claim came back short
    /// the earliest `free_at` (µs) of a used-up key with pending tasks.
    pub(super) async fn claim_keys_in(
        &self,
        tx: &mut SqliteConnection,
        req: &TaskClaim<'_>,
        rate: KeyRate,
        now_us: i64,
    ) -> Result<(Vec<Task>, Option<i64>), StoreError> {
        if req.fair {
            return Err(crate::store::key_rate_fair_refused());
        }
        let (t, q, kr) = (&self.t.tasks, &self.t.queues, &self.t.key_rates);
        let mut tasks = Vec::new();
        if req.limit > 0 {
            let running = if req.max_running.is_some() || req.per_key_max_running.is_some() {
                Running::from_rows(
                    sqlx::query(&format!(
                        "SELECT concurrency_key, count(*) FROM {t} \
                         WHERE state = 'running' AND queue = ?1 GROUP BY concurrency_key"
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
            let full = json_text(&serde_json::Value::from(key_rate::full_keys(&running, req)))?;
            // The walk reads each candidate's log with it (one probe of
            // the key's row: its `free_at` leaves used-up keys out, its
            // `starts` are the log the pick counts), answered in one row
            // (a row each would be a hand-off from SQLite's thread each,
            // with the write lock held).
            let walked: Option<String> = sqlx::query_scalar(&format!(
                "SELECT json_group_array(json_array(id, concurrency_key, spare, starts) \
                     ORDER BY priority, run_at, id) FROM ( \
                 SELECT {t}.id, {t}.concurrency_key, {t}.priority, {t}.run_at, \
                     {t}.attempt + 1 < {t}.max_attempts AS spare, {kr}.starts FROM {t} \
                 LEFT JOIN {kr} ON {kr}.queue = ?1 AND {kr}.ckey = {t}.concurrency_key \
                 WHERE {t}.state = 'pending' AND {t}.queue = ?1 AND {t}.run_at <= {NOW} \
                     AND NOT {t}.cancel_requested \
                     AND NOT EXISTS (SELECT 1 FROM {q} WHERE name = ?1 AND paused) \
                     AND ({t}.concurrency_key IS NULL OR ( \
                         coalesce({kr}.free_at, 0) <= ?2 \
                         AND {t}.concurrency_key NOT IN (SELECT value FROM json_each(?3)))) \
                 ORDER BY {t}.priority, {t}.run_at, {t}.id LIMIT ?4)"
            ))
            .bind(req.queue)
            .bind(now_us)
            .bind(full)
            .bind(key_rate::walk_len(req))
            .fetch_one(&mut *tx)
            .await?;
            let walked: Vec<(i64, Option<String>, i64, Option<String>)> =
                serde_json::from_str(walked.as_deref().unwrap_or("[]"))
                    .map_err(|e| StoreError::Corrupt(format!("walked tasks: {e}")))?;
            let mut cands = Vec::with_capacity(walked.len());
            let mut logs = HashMap::new();
            for (id, key, spare, starts) in walked {
                if let (Some(k), Some(starts)) = (&key, starts) {
                    if !logs.contains_key(k) {
                        logs.insert(k.clone(), StartLog::decode(&starts)?);
                    }
                }
                cands.push(key_rate::Candidate {
                    id,
                    key,
                    spare: spare != 0,
                });
            }
            let ids = key_rate::pick(req, rate, &cands, &logs, &running, now_us);
            if !ids.is_empty() {
                let to_log = key_rate::StartsToLog::new(req, &cands, &ids);
                let ids = json_text(&serde_json::Value::from(ids))?;
                let (claimed, started_us) = super::fair::claim_ids(tx, t, req, ids).await?;
                let mut started = Vec::with_capacity(claimed.len());
                for task in claimed {
                    if let Some(at) = started_us {
                        started.extend(to_log.of(task.id, at));
                    }
                    tasks.push(task);
                }
                tasks.sort_by_key(|t| (t.priority, t.run_at, t.id));
                // Every claimed key's log in one statement (one per key
                // cost a statement's hand-off to SQLite's thread each).
                let writes: Vec<serde_json::Value> =
                    key_rate::logs_after(rate, logs, started, Some(now_us))
                        .into_iter()
                        .map(|w| serde_json::json!([w.key, w.starts, w.free_at, w.idle_at]))
                        .collect();
                if !writes.is_empty() {
                    sqlx::query(&format!(
                        "INSERT INTO {kr} (queue, ckey, starts, free_at, idle_at) \
                         SELECT ?1, value ->> 0, value ->> 1, value ->> 2, value ->> 3 \
                         FROM json_each(?2) WHERE true \
                         ON CONFLICT (queue, ckey) DO UPDATE SET starts = excluded.starts, \
                             free_at = excluded.free_at, idle_at = excluded.idle_at"
                    ))
                    .bind(req.queue)
                    .bind(json_text(&serde_json::Value::from(writes))?)
                    .execute(&mut *tx)
                    .await?;
                }
            }
        }
        sqlx::query(&format!(
            "DELETE FROM {kr} WHERE rowid IN (SELECT rowid FROM {kr} \
             WHERE queue = ?1 AND idle_at < ?2 LIMIT ?3)"
        ))
        .bind(req.queue)
        .bind(now_us)
        .bind(key_rate::PRUNE_BATCH)
        .execute(&mut *tx)
        .await?;
        if tasks.len() >= req.limit as usize {
            return Ok((tasks, None));
        }
        let next: Option<i64> = sqlx::query_scalar(&format!(
            "SELECT free_at FROM {kr} WHERE queue = ?1 AND free_at > ?2 \
                 AND EXISTS (SELECT 1 FROM {t} WHERE state = 'pending' AND queue = ?1 \
                     AND concurrency_key = {kr}.ckey) \
             ORDER BY free_at LIMIT 1"
        ))
        .bind(req.queue)
        .bind(now_us)
        .fetch_optional(&mut *tx)
        .await?;
        Ok((tasks, next))
    }
}
