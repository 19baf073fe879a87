//! The queue's hot path on MySQL: enqueue, heartbeat, finish (claims:
//! `claim.rs`).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{MySqlConnection, Row};

use super::rows::attempt_of;
use super::{marks, us, MyBackend, Names};
use crate::error::StoreError;
use crate::store::sql_row::{token_arg, SqlRow};
use crate::store::{
    Claim, Enqueued, Finish, Heartbeat, NewTask, RunAt, UniqueHold, Wake, CANCEL_REQUESTED,
};

/// Rows per multi-row `INSERT` (17 placeholders each, well under MySQL's
/// 65,535 per statement).
const INSERT_CHUNK: usize = 1000;

/// Ids per `IN (…)` list.
const ID_CHUNK: usize = 1000;

/// A timestamp cut to the microseconds `DATETIME(6)` keeps.
fn trunc_us(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp_micros(t.timestamp_micros()).unwrap_or(t)
}

/// Enqueue tasks on the caller's connection, typically inside the caller's
/// own transaction (the transactional outbox): the tasks appear at the
/// caller's commit and vanish with a rollback.
///
/// `prefix` must be the table prefix the store was opened with (`None` for
/// the default `baton_`). Unique keys behave as in `Backend::task_insert_many`.
/// MySQL has no notification that waits for a commit, so these tasks wake
/// no worker: workers find them at their next poll (within a second when
/// idle). Run the transaction at `READ COMMITTED` (as baton's own sessions
/// do) so that a unique key's holder committed meanwhile is found.
pub async fn enqueue_in(
    conn: &mut MySqlConnection,
    prefix: Option<&str>,
    tasks: &[NewTask],
) -> Result<Vec<Enqueued>, StoreError> {
    if let Some(p) = prefix {
        super::super::validate_prefix(p)?;
    }
    let names = Names::new(prefix);
    Ok(insert_tasks(conn, &names, tasks, None).await?.0)
}

/// Insert tasks in order on `conn` (the shared code of [`enqueue_in`],
/// `enqueue` and `job_advance`); with `skipped`, directly as `cancelled`
/// with that reason. Returns one [`Enqueued`] per task and the wake-ups to
/// send once the transaction commits.
///
/// Runs of tasks without a unique key go in multi-row `INSERT`s, each row
/// stamped with its own `enqueue_mark` (a random base plus its place in the
/// statement) and its id read back by that mark, so no assumption about
/// how the server numbers a multi-row insert is made; a task with a key goes in its own
/// `INSERT`, and a duplicate key error (which rolls back only that
/// statement) means the key is taken: its holder's id is returned. A task
/// with a debounce or throttle goes through `key_policy::insert_with_policies`.
pub(super) async fn insert_tasks(
    conn: &mut MySqlConnection,
    n: &Names,
    tasks: &[NewTask],
    skipped: Option<&str>,
) -> Result<(Vec<Enqueued>, Vec<Wake>), StoreError> {
    if tasks.iter().all(|t| t.key_policy.is_none()) {
        return insert_plain(conn, n, tasks, skipped).await;
    }
    if skipped.is_some() {
        return Err(StoreError::Config(
            "a skipped slot's task cannot be debounced or throttled".into(),
        ));
    }
    super::key_policy::insert_with_policies(conn, n, tasks).await
}

/// [`insert_tasks`] for tasks without a policy.
pub(super) async fn insert_plain(
    conn: &mut MySqlConnection,
    n: &Names,
    tasks: &[NewTask],
    skipped: Option<&str>,
) -> Result<(Vec<Enqueued>, Vec<Wake>), StoreError> {
    let mut out = Vec::with_capacity(tasks.len());
    if tasks.is_empty() {
        return Ok((out, Vec::new()));
    }
    // Store time, for delays and to tell due from later work.
    let needs_now = tasks
        .iter()
        .any(|t| !matches!(t.run_at, RunAt::Now | RunAt::Delay(Duration::ZERO)));
    let now: Option<DateTime<Utc>> = if needs_now {
        Some(
            sqlx::query_scalar(&n.now_select)
                .fetch_one(&mut *conn)
                .await?,
        )
    } else {
        None
    };
    // Per task: the run_at to bind (None = the statement's now) and whether
    // it is due at once.
    let mut run_at: Vec<Option<DateTime<Utc>>> = Vec::with_capacity(tasks.len());
    for t in tasks {
        let at = match (t.run_at, now) {
            (RunAt::Now, _) | (RunAt::Delay(Duration::ZERO), _) => None,
            (RunAt::Delay(d), Some(now)) => Some(now + chrono::Duration::microseconds(us(d))),
            (RunAt::At(at), _) => Some(trunc_us(at)),
            (RunAt::Delay(_), None) => None,
        };
        run_at.push(at);
    }
    let cols = "(queue, kind, payload, state, priority, run_at, created_at, max_attempts, \
         timeout_ms, unique_key, unique_forever, unique_until_failed, job, slot, traceparent, \
         concurrency_key, last_error, finished_at, errors)";
    let one = format!(
        "(?, ?, ?, ?, ?, COALESCE(?, {now}), {now}, ?, ?, ?, ?, ?, ?, \
         ?, ?, ?, ?, IF(?, {now}, NULL), '[]')",
        now = n.now
    );
    let state = if skipped.is_some() {
        "cancelled"
    } else {
        "pending"
    };
    let lookup = format!("SELECT id FROM {} WHERE live_key = ?", n.tasks);
    let tombstone = format!("SELECT task_id FROM {} WHERE unique_key = ?", n.slots);
    let cols_marked = format!("{}, enqueue_mark)", cols.trim_end_matches(')'));
    let one_marked = format!("{}, ?)", one.trim_end_matches(')'));
    let one_marked = one_marked.as_str();
    let readback = format!(
        "SELECT id, enqueue_mark FROM {} WHERE id >= ? AND enqueue_mark BETWEEN ? AND ? \
         ORDER BY id LIMIT ?",
        n.tasks
    );
    let mut i = 0;
    while i < tasks.len() {
        if tasks[i].unique_key.is_none() {
            // A run of keyless tasks, in chunks.
            let mut end = i;
            while end < tasks.len() && end - i < INSERT_CHUNK && tasks[end].unique_key.is_none() {
                end += 1;
            }
            let rows = end - i;
            // This statement's marks: mark + 0 … mark + rows - 1, with a
            // random base whose low 10 bits are free (rows ≤ 1000 < 1024).
            let mark = ((fastrand::u64(..) >> 12) << 10) as i64;
            let values = vec![one_marked; rows].join(", ");
            let sql = format!("INSERT INTO {} {cols_marked} VALUES {values}", n.tasks);
            let mut q = sqlx::query(&sql);
            for (k, t) in tasks[i..end].iter().enumerate() {
                q = bind_task(q, t, run_at[i + k], state, skipped).bind(mark + k as i64);
            }
            let r = q.execute(&mut *conn).await?;
            if r.rows_affected() != rows as u64 {
                return Err(StoreError::Corrupt(format!(
                    "enqueue: {} rows inserted for {rows} tasks",
                    r.rows_affected()
                )));
            }
            // LAST_INSERT_ID() is the statement's first (smallest) id; the
            // others follow it but need not be consecutive (MySQL 8's
            // interleaved auto-increment, Galera's offsets), so they are
            // read back by mark along the primary key from there. Other
            // sessions' uncommitted rows in between are invisible here.
            let first = i64::try_from(r.last_insert_id())
                .map_err(|_| StoreError::Corrupt("enqueue: id out of range".into()))?;
            let found = sqlx::query(&readback)
                .bind(first)
                .bind(mark)
                .bind(mark + rows as i64 - 1)
                .bind(rows as i64)
                .fetch_all(&mut *conn)
                .await?;
            let mut ids: Vec<Option<i64>> = vec![None; rows];
            for row in &found {
                let id: i64 = row.try_get("id")?;
                let m: i64 = row.try_get("enqueue_mark")?;
                let slot = usize::try_from(m - mark).ok().and_then(|k| ids.get_mut(k));
                match slot {
                    Some(s @ None) => *s = Some(id),
                    _ => {
                        return Err(StoreError::Corrupt(format!(
                            "enqueue: the read-back of a {rows}-row insert found mark {m} twice or out of range"
                        )))
                    }
                }
            }
            for id in ids {
                let id = id.ok_or_else(|| {
                    StoreError::Corrupt(format!(
                        "enqueue: the read-back of a {rows}-row insert found {} rows",
                        found.len()
                    ))
                })?;
                out.push(Enqueued::new(id));
            }
            i = end;
            continue;
        }
        // A task with a unique key: insert it, or find the key's holder.
        let t = &tasks[i];
        let key = t.unique_key.as_deref().unwrap_or_default();
        let mut done = None;
        for _round in 0..8 {
            let sql = format!("INSERT INTO {} {cols} VALUES {one}", n.tasks);
            let r = bind_task(sqlx::query(&sql), t, run_at[i], state, skipped)
                .execute(&mut *conn)
                .await;
            match r.map_err(StoreError::from) {
                Ok(r) => {
                    let id = i64::try_from(r.last_insert_id())
                        .map_err(|_| StoreError::Corrupt("enqueue: id out of range".into()))?;
                    done = Some(Enqueued::new(id));
                    if crate::store::tombstoned_kind(t) {
                        // A slot whose task was pruned keeps its key in a
                        // tombstone: take the insert back and answer with
                        // the pruned task. Checked after the insert, so a
                        // prune that committed while the insert waited on
                        // its row is seen too (READ COMMITTED); one check.
                        let pruned: Option<i64> = sqlx::query_scalar(&tombstone)
                            .bind(key.as_bytes())
                            .fetch_optional(&mut *conn)
                            .await?;
                        if let Some(old) = pruned {
                            sqlx::query(&format!("DELETE FROM {} WHERE id = ?", n.tasks))
                                .bind(id)
                                .execute(&mut *conn)
                                .await?;
                            done = Some(Enqueued::existing(old));
                        }
                    }
                    break;
                }
                Err(StoreError::Conflict(_)) => {
                    // A new statement sees the holder committed meanwhile
                    // (READ COMMITTED), or our own earlier row.
                    let holder: Option<i64> = sqlx::query_scalar(&lookup)
                        .bind(key)
                        .fetch_optional(&mut *conn)
                        .await?;
                    if let Some(id) = holder {
                        done = Some(Enqueued::existing(id));
                        break;
                    }
                    // The holder finished between the two: insert again.
                }
                Err(e) => return Err(e),
            }
        }
        match done {
            Some(e) => out.push(e),
            None => {
                return Err(StoreError::Conflict(format!(
                    "enqueue: unique key {key:?} kept changing hands; try again"
                )))
            }
        }
        i += 1;
    }
    // Wake-ups: per queue once for due work, once with the earliest later
    // run_at.
    let mut wakes = Vec::new();
    if skipped.is_none() {
        let mut due: Vec<&str> = Vec::new();
        let mut later: HashMap<&str, DateTime<Utc>> = HashMap::new();
        for ((t, e), at) in tasks.iter().zip(&out).zip(&run_at) {
            if !e.inserted {
                continue;
            }
            match (at, now) {
                (Some(at), Some(now)) if *at > now => {
                    let v = later.entry(t.queue.as_str()).or_insert(*at);
                    *v = (*v).min(*at);
                }
                _ => {
                    if !due.contains(&t.queue.as_str()) {
                        due.push(t.queue.as_str());
                    }
                }
            }
        }
        wakes.extend(due.into_iter().map(Wake::now));
        wakes.extend(later.into_iter().map(|(q, at)| Wake {
            queue: q.to_string(),
            due: Some(at),
        }));
    }
    Ok((out, wakes))
}

fn bind_task<'q>(
    q: sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments>,
    t: &'q NewTask,
    run_at: Option<DateTime<Utc>>,
    state: &'q str,
    skipped: Option<&'q str>,
) -> sqlx::query::Query<'q, sqlx::MySql, sqlx::mysql::MySqlArguments> {
    q.bind(t.queue.as_str())
        .bind(t.kind.as_str())
        .bind(t.payload.to_string())
        .bind(state)
        .bind(t.priority)
        .bind(run_at)
        .bind(i32::try_from(t.max_attempts).unwrap_or(i32::MAX).max(1))
        .bind(t.timeout.map(|d| us(d) / 1000))
        .bind(t.unique_key.as_deref())
        .bind(t.unique_hold == UniqueHold::Forever)
        .bind(t.unique_hold == UniqueHold::UntilFailed)
        .bind(t.job.as_deref())
        .bind(t.slot.map(trunc_us))
        .bind(t.traceparent.as_deref())
        .bind(t.concurrency_key.as_deref())
        .bind(skipped)
        .bind(skipped.is_some())
}

pub(super) async fn task_insert_many(
    b: &MyBackend,
    tasks: &[NewTask],
) -> Result<Vec<Enqueued>, StoreError> {
    if tasks.is_empty() {
        return Ok(Vec::new());
    }
    let mut tx = b.begin().await?;
    let (out, wakes) = insert_tasks(&mut tx, &b.names, tasks, None).await?;
    tx.commit().await?;
    b.announce(wakes);
    Ok(out)
}

pub(super) async fn task_heartbeat_many(
    b: &MyBackend,
    claims: &[Claim],
    lease: Duration,
) -> Result<Vec<Heartbeat>, StoreError> {
    let now = &b.names.now;
    if claims.is_empty() {
        return Ok(Vec::new());
    }
    let t = &b.names.tasks;
    let mut found: HashMap<(i64, i64), bool> = HashMap::new();
    let mut tx = b.begin().await?;
    for chunk in claims.chunks(ID_CHUNK) {
        let ids = marks(chunk.len());
        let pairs = vec!["(?, ?)"; chunk.len()].join(", ");
        let cond =
            format!("id IN ({ids}) AND (id, claim_token) IN ({pairs}) AND state = 'running'");
        let sql = format!(
            "UPDATE {t} FORCE INDEX (PRIMARY) SET lease_until = {now} + INTERVAL ? MICROSECOND \
             WHERE {cond}"
        );
        let mut u = sqlx::query(&sql).bind(us(lease));
        for c in chunk {
            u = u.bind(c.id);
        }
        for c in chunk {
            u = u.bind(c.id).bind(token_arg(c.token));
        }
        u.execute(&mut *tx).await?;
        let sql = format!(
            "SELECT id, claim_token, cancel_requested FROM {t} FORCE INDEX (PRIMARY) WHERE {cond}"
        );
        let mut s = sqlx::query(&sql);
        for c in chunk {
            s = s.bind(c.id);
        }
        for c in chunk {
            s = s.bind(c.id).bind(token_arg(c.token));
        }
        for row in s.fetch_all(&mut *tx).await? {
            found.insert(
                (row.try_get("id")?, row.try_get("claim_token")?),
                row.try_get("cancel_requested")?,
            );
        }
    }
    tx.commit().await?;
    Ok(claims
        .iter()
        .map(|c| match found.get(&(c.id, token_arg(c.token))) {
            Some(true) => Heartbeat::CancelRequested,
            Some(false) => Heartbeat::Extended,
            None => Heartbeat::Lost,
        })
        .collect())
}

/// Every finish, in one transaction: lock the named running rows, decide
/// each item against its locked row (compare-and-set on the claim
/// token; a claim already used earlier in the batch is refused), write
/// the successes in one statement and the rest one by one.
pub(super) async fn task_finish_many(
    b: &MyBackend,
    items: &[(Claim, Finish)],
) -> Result<Vec<bool>, StoreError> {
    let (append_error, now) = (&b.names.append_error, &b.names.now);
    if items.is_empty() {
        return Ok(Vec::new());
    }
    if let Some(claims) = super::finish_ok::successes(items) {
        return b.finish_successes(&claims).await;
    }
    let t = &b.names.tasks;
    let mut out = vec![false; items.len()];
    let mut wakes = Vec::new();
    let mut tx = b.begin().await?;
    // id → (token, cancel_requested, attempt, max_attempts, queue)
    let mut rows: HashMap<i64, (i64, bool, u32, u32, String)> = HashMap::new();
    let mut ids: Vec<i64> = items.iter().map(|(c, _)| c.id).collect();
    ids.sort_unstable();
    ids.dedup();
    for chunk in ids.chunks(ID_CHUNK) {
        let sql = format!(
            "SELECT id, claim_token, cancel_requested, attempt, max_attempts, queue \
             FROM {t} FORCE INDEX (PRIMARY) WHERE id IN ({}) AND state = 'running' \
             ORDER BY id FOR UPDATE",
            marks(chunk.len())
        );
        let mut s = sqlx::query(&sql);
        for id in chunk {
            s = s.bind(id);
        }
        for row in s.fetch_all(&mut *tx).await? {
            rows.insert(
                row.try_get("id")?,
                (
                    row.try_get("claim_token")?,
                    row.try_get("cancel_requested")?,
                    attempt_of(&row, "attempt")?,
                    attempt_of(&row, "max_attempts")?,
                    row.text("queue")?,
                ),
            );
        }
    }
    let mut used: HashSet<i64> = HashSet::new();
    let mut succeeded: Vec<i64> = Vec::new();
    let mut retried: Vec<i64> = Vec::new();
    for (k, (claim, finish)) in items.iter().enumerate() {
        let Some((token, cancel, attempt, max, queue)) = rows.get(&claim.id) else {
            continue;
        };
        if *token != token_arg(claim.token) || !used.insert(claim.id) {
            continue;
        }
        out[k] = true;
        match finish {
            Finish::Succeeded => succeeded.push(claim.id),
            Finish::Failed { error, retry_in } => {
                let allowed = retry_in.is_some() && attempt < max;
                let (state, last_error) = if allowed && !cancel {
                    ("pending", error.clone())
                } else if allowed {
                    ("cancelled", format!("{CANCEL_REQUESTED}: {error}"))
                } else {
                    ("failed", error.clone())
                };
                let again = state == "pending";
                // `errors` first: it reads `attempt`, which stays.
                sqlx::query(&format!(
                    "UPDATE {t} SET errors = {append_error}, last_error = ?, state = ?, \
                         run_at = IF(?, {now} + INTERVAL ? MICROSECOND, run_at), \
                         finished_at = IF(?, NULL, {now}), lease_until = NULL \
                     WHERE id = ?"
                ))
                .bind(error)
                .bind(last_error)
                .bind(state)
                .bind(again)
                .bind(retry_in.map(us).unwrap_or(0))
                .bind(again)
                .bind(claim.id)
                .execute(&mut *tx)
                .await?;
                if again {
                    retried.push(claim.id);
                }
            }
            Finish::Cancelled { reason } => {
                sqlx::query(&format!(
                    "UPDATE {t} SET state = 'cancelled', last_error = ?, \
                     finished_at = {now}, lease_until = NULL WHERE id = ?"
                ))
                .bind(reason)
                .bind(claim.id)
                .execute(&mut *tx)
                .await?;
            }
            Finish::HandBack | Finish::Snoozed { .. } => {
                // The attempt is not counted; a requested cancel ends it.
                // A snooze is due `run_in` after now; a hand-back keeps
                // its run_at (its place in line).
                if *cancel {
                    sqlx::query(&format!(
                        "UPDATE {t} SET state = 'cancelled', attempt = attempt - 1, \
                         lease_until = NULL, last_error = ?, \
                         finished_at = {now} WHERE id = ?"
                    ))
                    .bind(CANCEL_REQUESTED)
                    .bind(claim.id)
                    .execute(&mut *tx)
                    .await?;
                } else if let Finish::Snoozed { run_in } = finish {
                    sqlx::query(&format!(
                        "UPDATE {t} SET state = 'pending', attempt = attempt - 1, \
                         run_at = {now} + INTERVAL ? MICROSECOND, \
                         lease_until = NULL WHERE id = ?"
                    ))
                    .bind(us(*run_in))
                    .bind(claim.id)
                    .execute(&mut *tx)
                    .await?;
                    retried.push(claim.id);
                } else {
                    sqlx::query(&format!(
                        "UPDATE {t} SET state = 'pending', attempt = attempt - 1, \
                         lease_until = NULL WHERE id = ?"
                    ))
                    .bind(claim.id)
                    .execute(&mut *tx)
                    .await?;
                    if !wakes
                        .iter()
                        .any(|w: &Wake| w.queue == *queue && w.due.is_none())
                    {
                        wakes.push(Wake::now(queue.clone()));
                    }
                }
            }
        }
    }
    for chunk in succeeded.chunks(ID_CHUNK) {
        let sql = format!(
            "UPDATE {t} SET state = 'succeeded', finished_at = {now}, \
             lease_until = NULL WHERE id IN ({})",
            marks(chunk.len())
        );
        let mut u = sqlx::query(&sql);
        for id in chunk {
            u = u.bind(id);
        }
        u.execute(&mut *tx).await?;
    }
    // A retry (or a snooze) is announced with its due time, so a worker
    // starts it when the backoff ends rather than at a later poll.
    for chunk in retried.chunks(ID_CHUNK) {
        let sql = format!(
            "SELECT queue, run_at FROM {t} WHERE id IN ({})",
            marks(chunk.len())
        );
        let mut s = sqlx::query(&sql);
        for id in chunk {
            s = s.bind(id);
        }
        for row in s.fetch_all(&mut *tx).await? {
            wakes.push(Wake {
                queue: row.text("queue")?,
                due: Some(row.try_get("run_at")?),
            });
        }
    }
    tx.commit().await?;
    b.announce(wakes);
    Ok(out)
}

/// A finished task (the tasks prune and delete may take).
pub(super) const FINISHED: &str = "state IN ('succeeded', 'failed', 'cancelled')";

/// The tombstones of the finished slot tasks matching `pred` (over the
/// tasks table), written before they are deleted, in the same transaction.
pub(super) fn tombstones(n: &super::Names, pred: &str) -> String {
    format!(
        "INSERT IGNORE INTO {} \
             (unique_key, job, slot, task_id, state, last_error, finished_at) \
         SELECT unique_key, job, slot, id, state, LEFT(last_error, 1000), finished_at \
         FROM {} WHERE {FINISHED} AND {pred} \
             AND unique_forever = 1 AND unique_key IS NOT NULL AND job IS NOT NULL",
        n.slots, n.tasks
    )
}
