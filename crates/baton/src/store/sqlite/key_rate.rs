//! The claim under a rate per concurrency key on SQLite
//! (`Backend::task_claim_key_rated`, planned by `store::key_rate`): inside
//! one `BEGIN IMMEDIATE` transaction (so no other claim interleaves), two
//! calls to SQLite's thread ([`KeyRatedSql`]): the store's clock, the
//! queue's running tasks per key and the walk of due candidates past
//! used-up and capped keys with their keys' logs, in one row; then, after
//! the pick, the claim, the claimed keys' logs, the prune and the answer
//! with the next free instant, in one query of several statements. Alone
//! (no queue rate on top), the first call also opens the transaction and
//! ends the worker's successes in it, and the second commits.

use std::collections::HashMap;

use sqlx::sqlite::{SqliteConnection, SqliteRow};
use sqlx::Row;

use super::backend::{all_successes, held, success_pairs};
use super::rows::{claim_answer as claim_answer_row, json_text};
use super::sql::{
    claim_answer, claim_update_at, spare_params, succeed_sql, CLAIMED_RESET, SUCCEEDED_PAIRS,
};
use super::{SqliteBackend, Tables, NOW, NOW_US};
use crate::error::StoreError;
use crate::store::key_rate::{self, Running};
use crate::store::rate::StartLog;
use crate::store::{ms, KeyRate, RatedClaim, Task, TaskClaim, TaskClaimKeyRated};

/// The two statements of a claim under a rate per key, formatted once.
#[derive(Debug)]
pub(super) struct KeyRatedSql {
    /// `?1` queue, `?2` whether to count the running tasks (a cap), `?3`
    /// the per-key cap or NULL, `?4` the walk's length, `?5` the store's
    /// clock (µs) already read in the transaction, or NULL to read it →
    /// one row: `now` (µs), `running` (JSON `[[key, count], …]`, the key
    /// NULL for tasks without one), `walked` (JSON `[[id, key, spare],
    /// …]` in claim order) and `logs` (JSON `{key: starts}`, the start log
    /// of each walked key that has one). The walk probes each candidate's
    /// key row (its `free_at` leaves used-up keys out) and leaves keys at
    /// the cap out; each key's log comes once, not with each of its
    /// candidates (10 keys' logs of a few hundred starts each, copied into
    /// every walked row, were most of the answer). One row, since a row
    /// each would be a hand-off from SQLite's thread each, with the write
    /// lock held.
    pub walk: String,
    /// `?1` queue, `?2` worker, `?3` lease ms, `?4` the picked ids (JSON
    /// array), `?5` the walk's `now` (µs: the claim's `started_at`, so the
    /// logs hold the very starts the tasks record), `?6` the keys' logs to
    /// write (JSON `[[key, starts, free_at, idle_at], …]`), `?7` the
    /// claim's limit → one row: [`super::rows::CLAIM_ANSWER_COLS`] and `next`: when
    /// the claim is short of the limit, the earliest
    /// `free_at` after now of a used-up key with pending tasks. Prunes up
    /// to [`key_rate::PRUNE_BATCH`] idle logs on the way.
    pub claim: String,
    /// `BEGIN IMMEDIATE`, then [`KeyRatedSql::walk`].
    pub walk_alone: String,
    /// `BEGIN IMMEDIATE`, the successes of `?6` (JSON `[[id, token], …]`,
    /// [`succeed_sql`]), then [`KeyRatedSql::walk`] with `done`: the
    /// pairs that held ([`SUCCEEDED_PAIRS`]).
    pub walk_after_successes: String,
    /// [`KeyRatedSql::claim`], then `COMMIT`.
    pub claim_alone: String,
}

impl KeyRatedSql {
    pub(super) fn new(t: &Tables) -> KeyRatedSql {
        let (tasks, q, kr) = (&t.tasks, &t.queues, &t.key_rates);
        let walk = format!(
            "WITH n(now) AS MATERIALIZED (SELECT coalesce(?5, {NOW_US})), \
             run(k, c) AS MATERIALIZED (SELECT concurrency_key, count(*) FROM {tasks} \
                 WHERE ?2 AND state = 'running' AND queue = ?1 GROUP BY concurrency_key), \
             w AS MATERIALIZED ( \
                 SELECT {tasks}.id, {tasks}.concurrency_key AS k, {tasks}.priority, \
                     {tasks}.run_at, {tasks}.attempt + 1 < {tasks}.max_attempts AS spare \
                 FROM {tasks} \
                 LEFT JOIN {kr} ON {kr}.queue = ?1 AND {kr}.ckey = {tasks}.concurrency_key \
                 WHERE {tasks}.state = 'pending' AND {tasks}.queue = ?1 \
                     AND {tasks}.run_at <= {NOW} AND NOT {tasks}.cancel_requested \
                     AND NOT EXISTS (SELECT 1 FROM {q} WHERE name = ?1 AND paused) \
                     AND ({tasks}.concurrency_key IS NULL OR ( \
                         coalesce({kr}.free_at, 0) <= (SELECT now FROM n) \
                         AND {tasks}.concurrency_key NOT IN \
                             (SELECT k FROM run WHERE k IS NOT NULL AND c >= ?3))) \
                 ORDER BY {tasks}.priority, {tasks}.run_at, {tasks}.id LIMIT ?4) \
             SELECT (SELECT now FROM n) AS now, \
                 (SELECT json_group_array(json_array(k, c)) FROM run) AS running, \
                 (SELECT json_group_array(json_array(id, k, spare) \
                     ORDER BY priority, run_at, id) FROM w) AS walked, \
                 (SELECT json_group_object(ckey, starts) FROM {kr} WHERE queue = ?1 \
                     AND ckey IN (SELECT k FROM w WHERE k IS NOT NULL)) AS logs"
        );
        let claim = format!(
            "{CLAIMED_RESET}; {}; {}; \
             INSERT INTO {kr} (queue, ckey, starts, free_at, idle_at) \
                 SELECT ?1, value ->> 0, value ->> 1, value ->> 2, value ->> 3 \
                 FROM json_each(?6) WHERE true \
                 ON CONFLICT (queue, ckey) DO UPDATE SET starts = excluded.starts, \
                     free_at = excluded.free_at, idle_at = excluded.idle_at; \
             DELETE FROM {kr} WHERE rowid IN (SELECT rowid FROM {kr} \
                 WHERE queue = ?1 AND idle_at < ?5 LIMIT {batch}); \
             {}",
            super::fair::pick_sql(tasks),
            claim_update_at(tasks, "?5 / 1000"),
            claim_answer(
                tasks,
                &format!(
                    ", CASE WHEN count(*) >= ?7 THEN NULL ELSE ( \
                         SELECT free_at FROM {kr} WHERE queue = ?1 AND free_at > ?5 \
                             AND EXISTS (SELECT 1 FROM {tasks} WHERE state = 'pending' \
                                 AND queue = ?1 AND concurrency_key = {kr}.ckey) \
                         ORDER BY free_at LIMIT 1) END AS next"
                )
            ),
            batch = key_rate::PRUNE_BATCH
        );
        let walk_done = format!("{walk}, {SUCCEEDED_PAIRS} AS done");
        KeyRatedSql {
            walk_alone: format!("BEGIN IMMEDIATE; {walk}"),
            walk_after_successes: format!(
                "BEGIN IMMEDIATE; {}; {walk_done}",
                succeed_sql(tasks, "?6")
            ),
            claim_alone: format!("{claim}; COMMIT"),
            walk,
            claim,
        }
    }
}

type Query<'q> = sqlx::query::Query<'q, sqlx::Sqlite, sqlx::sqlite::SqliteArguments<'q>>;

/// [`KeyRatedSql::walk`]'s arguments `?1`–`?5` for `req`.
fn bind_walk<'q>(q: Query<'q>, req: &TaskClaim<'_>, now_us: Option<i64>) -> Query<'q> {
    let counted = req.max_running.is_some() || req.per_key_max_running.is_some();
    q.bind(req.queue.to_string())
        .bind(counted)
        .bind(req.per_key_max_running.map(i64::from))
        .bind(if req.limit == 0 {
            0
        } else {
            key_rate::walk_len(req)
        })
        .bind(now_us)
}

/// What a claim under a rate per key takes, from its walk's row.
struct Plan {
    /// The store's clock the walk read (µs).
    now_us: i64,
    /// The ids picked, in claim order.
    ids: Vec<i64>,
    /// The keys' logs to write (JSON `[[key, starts, free_at, idle_at], …]`).
    writes: String,
}

/// The pick among the walk's row ([`KeyRatedSql::walk`]).
fn plan(row: &SqliteRow, req: &TaskClaim<'_>, rate: KeyRate) -> Result<Plan, StoreError> {
    let now_us: i64 = row.try_get("now")?;
    let running: Option<&str> = row.try_get("running")?;
    let running: Vec<(Option<String>, i64)> = serde_json::from_str(running.unwrap_or("[]"))
        .map_err(|e| StoreError::Corrupt(format!("running tasks per key: {e}")))?;
    let running = Running::from_rows(running);
    let walked: Option<&str> = row.try_get("walked")?;
    let walked: Vec<(i64, Option<String>, i64)> = serde_json::from_str(walked.unwrap_or("[]"))
        .map_err(|e| StoreError::Corrupt(format!("walked tasks: {e}")))?;
    let cands: Vec<key_rate::Candidate> = walked
        .into_iter()
        .map(|(id, key, spare)| key_rate::Candidate {
            id,
            key,
            spare: spare != 0,
        })
        .collect();
    let texts: Option<&str> = row.try_get("logs")?;
    let texts: HashMap<String, Option<String>> = serde_json::from_str(texts.unwrap_or("{}"))
        .map_err(|e| StoreError::Corrupt(format!("start logs per key: {e}")))?;
    let mut logs = HashMap::with_capacity(texts.len());
    for (key, text) in texts {
        if let Some(text) = text {
            logs.insert(key, StartLog::decode(&text)?);
        }
    }
    let ids = if req.limit == 0 {
        Vec::new()
    } else {
        key_rate::pick(req, rate, &cands, &logs, &running, now_us)
    };
    // Inside the write transaction nothing else changes the walked rows:
    // every picked task is claimed, at `now_us`, so the logs are written
    // from the pick, in the same call as the claim.
    let to_log = key_rate::StartsToLog::new(req, &cands, &ids);
    let started: Vec<(String, i64)> = ids.iter().filter_map(|&id| to_log.of(id, now_us)).collect();
    let writes: Vec<serde_json::Value> = if ids.is_empty() {
        Vec::new()
    } else {
        key_rate::logs_after(rate, logs, started, Some(now_us))
            .into_iter()
            .map(|w| serde_json::json!([w.key, w.starts, w.free_at, w.idle_at]))
            .collect()
    };
    Ok(Plan {
        now_us,
        ids,
        writes: json_text(&serde_json::Value::from(writes))?,
    })
}

/// [`KeyRatedSql::claim`]'s arguments for `plan`.
fn bind_claim<'q>(q: Query<'q>, req: &TaskClaim<'_>, plan: &Plan) -> Result<Query<'q>, StoreError> {
    let q = q
        .bind(req.queue.to_string())
        .bind(req.worker.to_string())
        .bind(ms(req.lease))
        .bind(json_text(&serde_json::Value::from(plan.ids.clone()))?)
        .bind(plan.now_us)
        .bind(plan.writes.clone())
        .bind(i64::from(req.limit));
    Ok(spare_params(q))
}

/// The claim's answer ([`KeyRatedSql::claim`]'s row) for `plan`.
fn claimed(rows: &[SqliteRow], req: &TaskClaim<'_>, plan: &Plan) -> Result<KeyRated, StoreError> {
    let [row] = rows else {
        return Err(StoreError::Backend(format!(
            "a claim under a rate per key answered {} rows, not one",
            rows.len()
        )));
    };
    let mut tasks = claim_answer_row(row, req.queue)?;
    if tasks.len() != plan.ids.len() {
        // Its logs were written for the pick: let the transaction go.
        return Err(StoreError::Backend(format!(
            "a claim under a rate per key claimed {} of the {} tasks it picked",
            tasks.len(),
            plan.ids.len()
        )));
    }
    tasks.sort_by_key(|t| (t.priority, t.run_at, t.id));
    Ok(KeyRated {
        tasks,
        now_us: plan.now_us,
        next: row.try_get("next")?,
    })
}

/// A claim's fields, owned (the claim runs on a task of its own).
struct OwnedClaim {
    queue: String,
    worker: String,
    claim: TaskClaim<'static>,
}

impl OwnedClaim {
    fn of(req: &TaskClaim<'_>) -> OwnedClaim {
        OwnedClaim {
            queue: req.queue.to_string(),
            worker: req.worker.to_string(),
            claim: TaskClaim {
                queue: "",
                worker: "",
                limit: req.limit,
                lease: req.lease,
                max_running: req.max_running,
                per_key_max_running: req.per_key_max_running,
                buffered: req.buffered,
                fair: req.fair,
            },
        }
    }

    fn get(&self) -> TaskClaim<'_> {
        TaskClaim {
            queue: &self.queue,
            worker: &self.worker,
            ..self.claim.clone()
        }
    }
}

impl SqliteBackend {
    /// A claim under `rate` per key on `tx` (inside `BEGIN IMMEDIATE`) at
    /// store time `now_us` (read by the walk when `None`): the tasks, the
    /// store time the claim ran at, and when the claim came back short the
    /// earliest `free_at` (µs) of a used-up key with pending tasks.
    pub(super) async fn claim_keys_in(
        &self,
        tx: &mut SqliteConnection,
        req: &TaskClaim<'_>,
        rate: KeyRate,
        now_us: Option<i64>,
    ) -> Result<KeyRated, StoreError> {
        if req.fair {
            return Err(crate::store::key_rate_fair_refused());
        }
        let sql = &self.sql.key_rated;
        let row = bind_walk(sqlx::query(&sql.walk), req, now_us)
            .fetch_one(&mut *tx)
            .await?;
        let plan = plan(&row, req, rate)?;
        let rows = bind_claim(sqlx::query(&sql.claim), req, &plan)?
            .fetch_all(&mut *tx)
            .await?;
        claimed(&rows, req, &plan)
    }

    /// A claim under a rate per key alone (no queue rate on top) in a
    /// write transaction of its own, two calls: the first opens it, ends
    /// the worker's successes (when `req.finish` holds only those; other
    /// finishes go first, in calls of their own) and walks; the second
    /// claims and commits.
    pub(super) async fn key_rated_alone(
        &self,
        req: &TaskClaimKeyRated<'_>,
    ) -> Result<RatedClaim, StoreError> {
        if req.claim.fair {
            return Err(crate::store::key_rate_fair_refused());
        }
        let (ahead, successes) = if all_successes(req.finish) {
            (None, Some(success_pairs(req.finish)?))
        } else {
            (
                Some(crate::store::finish_ahead(self, req.finish).await?),
                None,
            )
        };
        let sql = self.sql.clone();
        let owned = OwnedClaim::of(&req.claim);
        let rate = req.key_rate;
        let list = successes.as_ref().map(|(_, list)| list.clone());
        let (claimed_now, done) = self
            .in_own_write(move |conn| {
                Box::pin(async move {
                    let req = owned.get();
                    let k = &sql.key_rated;
                    // The walk's row, and with successes the pairs that held.
                    let (row, done) = match list {
                        Some(list) => {
                            let q = bind_walk(sqlx::query(&k.walk_after_successes), &req, None);
                            let row = spare_params(q.bind(list)).fetch_one(&mut *conn).await?;
                            let done: String = row.try_get("done")?;
                            (row, Some(done))
                        }
                        None => {
                            let q = bind_walk(sqlx::query(&k.walk_alone), &req, None);
                            (q.fetch_one(&mut *conn).await?, None)
                        }
                    };
                    let plan = plan(&row, &req, rate)?;
                    let rows = bind_claim(sqlx::query(&k.claim_alone), &req, &plan)?
                        .fetch_all(&mut *conn)
                        .await?;
                    Ok((claimed(&rows, &req, &plan)?, done))
                })
            })
            .await?;
        let finished = match (ahead, successes, done) {
            (Some(finished), _, _) => finished,
            (None, Some((pairs, _)), Some(done)) => held(&pairs, &done)?,
            // No finishes at all (`done` is read exactly when there are
            // successes).
            _ => Vec::new(),
        };
        Ok(RatedClaim {
            finished,
            ..key_rate::answer(claimed_now.tasks, claimed_now.now_us, claimed_now.next)?
        })
    }
}

/// What [`SqliteBackend::claim_keys_in`] answers.
pub(super) struct KeyRated {
    /// The tasks claimed, in claim order.
    pub tasks: Vec<Task>,
    /// The store's clock (µs) the claim ran at: every task's `started_at`.
    pub now_us: i64,
    /// When the claim came back short, the earliest `free_at` (µs) of a
    /// used-up key with pending tasks.
    pub next: Option<i64>,
}
