//! The claim under a rate per concurrency key on MySQL
//! (`Backend::task_claim_key_rated`, planned by `store::key_rate`): inside
//! one transaction holding the queue's row in `<p>queues` (the turn capped
//! claims take), read the walk of due candidates past used-up and capped
//! keys (`FOR UPDATE SKIP LOCKED`), the logs of their keys, claim the
//! picked ones, read their `started_at` back and write their keys' logs.

use std::collections::HashMap;

use sqlx::Row;

use super::claim::{claim_ids_with, lock_queue_row};
use super::{marks, MyBackend};
use crate::error::StoreError;
use crate::store::key_rate::{self, Candidate, Running};
use crate::store::rate::StartLog;
use crate::store::sql_row::claimed_task;
use crate::store::{KeyRate, Task, TaskClaim};

/// Key logs written per `INSERT` (5 parameters each, well under the
/// server's 65,535).
const LOG_ROWS: usize = 1000;

/// A key read as bytes (the column is binary), as text.
fn text(b: Vec<u8>) -> Result<String, StoreError> {
    String::from_utf8(b)
        .map_err(|_| StoreError::Corrupt("a concurrency key that is not UTF-8".into()))
}

/// The store's clock in µs, inside `tx`.
pub(super) async fn now_us_on(
    b: &MyBackend,
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
) -> Result<i64, StoreError> {
    Ok(sqlx::query_scalar(&format!("SELECT {}", b.names.now_us))
        .fetch_one(&mut **tx)
        .await?)
}

/// A claim under `rate` per key inside `tx` at store time `now_us`: the
/// tasks, and when the claim came back short the earliest `free_at` (µs)
/// of a used-up key with pending tasks.
pub(super) async fn claim_in(
    b: &MyBackend,
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    req: &TaskClaim<'_>,
    rate: KeyRate,
    now_us: i64,
) -> Result<(Vec<Task>, Option<i64>), StoreError> {
    if req.fair {
        return Err(crate::store::key_rate_fair_refused());
    }
    let n = &b.names;
    let (t, q, kr, now) = (&n.tasks, &n.queues, &n.key_rates, &n.now);
    lock_queue_row(b, tx, req.queue).await?;
    let mut tasks = Vec::new();
    if req.limit > 0 {
        let running = if req.max_running.is_some() || req.per_key_max_running.is_some() {
            let rows: Vec<(Option<Vec<u8>>, i64)> = sqlx::query_as(&format!(
                "SELECT concurrency_key, COUNT(*) FROM {t} \
                 WHERE queue = ? AND state = 'running' GROUP BY concurrency_key"
            ))
            .bind(req.queue)
            .fetch_all(&mut **tx)
            .await?;
            Running::from_rows(
                rows.into_iter()
                    .map(|(k, n)| Ok((k.map(text).transpose()?, n)))
                    .collect::<Result<Vec<_>, StoreError>>()?,
            )
        } else {
            Running::default()
        };
        let full = key_rate::full_keys(&running, req);
        let skip = if full.is_empty() {
            String::new()
        } else {
            format!("AND concurrency_key NOT IN ({})", marks(full.len()))
        };
        let select = format!(
            "SELECT id, CAST(attempt + 1 < max_attempts AS SIGNED), concurrency_key FROM {t} \
             WHERE queue = ? AND state = 'pending' AND run_at <= {now} \
                 AND cancel_requested = 0 \
                 AND NOT EXISTS (SELECT 1 FROM {q} WHERE queue = ? AND paused = 1) \
                 AND (concurrency_key IS NULL OR (NOT EXISTS (SELECT 1 FROM {kr} \
                     WHERE {kr}.queue = ? AND {kr}.ckey = {t}.concurrency_key \
                         AND {kr}.free_at > ?) {skip})) \
             ORDER BY priority, run_at, id LIMIT {walk} FOR UPDATE SKIP LOCKED",
            walk = key_rate::walk_len(req),
        );
        let mut s = sqlx::query_as(&select)
            .bind(req.queue.as_bytes())
            .bind(req.queue.as_bytes())
            .bind(req.queue.as_bytes())
            .bind(now_us);
        for k in &full {
            s = s.bind(k.as_bytes());
        }
        let rows: Vec<(i64, i64, Option<Vec<u8>>)> = s.fetch_all(&mut **tx).await?;
        let cands = rows
            .into_iter()
            .map(|(id, spare, key)| {
                Ok(Candidate {
                    id,
                    key: key.map(text).transpose()?,
                    spare: spare != 0,
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let keys = key_rate::keys_of(&cands);
        let mut logs = HashMap::new();
        // The store's clock in a statement after the queue row's lock
        // (`now_us` was read before it): `logs_after`'s turn, read with
        // the logs it prunes (no log read, nothing to prune).
        let mut turn_us = None;
        if !keys.is_empty() {
            let sql = format!(
                "SELECT ckey, starts, {} FROM {kr} WHERE queue = ? AND ckey IN ({})",
                n.now_us,
                marks(keys.len())
            );
            let mut s = sqlx::query_as(&sql).bind(req.queue.as_bytes());
            for k in &keys {
                s = s.bind(k.as_bytes());
            }
            let rows: Vec<(Vec<u8>, Vec<u8>, i64)> = s.fetch_all(&mut **tx).await?;
            for (k, starts, turn) in rows {
                logs.insert(text(k)?, StartLog::decode(&text(starts)?)?);
                turn_us = Some(turn);
            }
        }
        let ids = key_rate::pick(req, rate, &cands, &logs, &running, now_us);
        let to_log = key_rate::StartsToLog::new(req, &cands, &ids);
        let rows = claim_ids_with(
            b,
            tx,
            req,
            &ids,
            ", TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', started_at) AS started_us",
        )
        .await?;
        if !rows.is_empty() {
            let mut started = Vec::with_capacity(rows.len());
            for r in &rows {
                let task = claimed_task(r)?;
                started.extend(to_log.of(task.id, r.try_get("started_us")?));
                tasks.push(task);
            }
            // Every key's log in one statement (was one per key).
            for chunk in key_rate::logs_after(rate, logs, started, turn_us).chunks(LOG_ROWS) {
                let rows = vec!["(?, ?, ?, ?, ?)"; chunk.len()].join(", ");
                let sql = format!(
                    "INSERT INTO {kr} (queue, ckey, starts, free_at, idle_at) VALUES {rows} \
                     ON DUPLICATE KEY UPDATE starts = VALUES(starts), \
                         free_at = VALUES(free_at), idle_at = VALUES(idle_at)"
                );
                let mut q = sqlx::query(&sql);
                for w in chunk {
                    q = q
                        .bind(req.queue.as_bytes())
                        .bind(w.key.as_bytes())
                        .bind(&w.starts)
                        .bind(w.free_at)
                        .bind(w.idle_at);
                }
                q.execute(&mut **tx).await?;
            }
        }
    }
    sqlx::query(&format!(
        "DELETE FROM {kr} WHERE queue = ? AND idle_at < ? ORDER BY idle_at LIMIT {}",
        key_rate::PRUNE_BATCH
    ))
    .bind(req.queue.as_bytes())
    .bind(now_us)
    .execute(&mut **tx)
    .await?;
    if tasks.len() >= req.limit as usize {
        return Ok((tasks, None));
    }
    let next: Option<i64> = sqlx::query_scalar(&format!(
        "SELECT free_at FROM {kr} WHERE queue = ? AND free_at > ? \
             AND EXISTS (SELECT 1 FROM {t} WHERE queue = ? AND state = 'pending' \
                 AND concurrency_key = {kr}.ckey) \
         ORDER BY free_at LIMIT 1"
    ))
    .bind(req.queue.as_bytes())
    .bind(now_us)
    .bind(req.queue.as_bytes())
    .fetch_optional(&mut **tx)
    .await?;
    Ok((tasks, next))
}
