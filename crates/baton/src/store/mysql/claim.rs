//! Claims on MySQL: uncapped, capped (the queue's row locked and its
//! running tasks counted) and under a rate limit (the limit's row locked
//! first), each one transaction.

use std::sync::Mutex;

use sqlx::{Executor, Row};

use super::{batch_on, hex_lit, marks, text_lit, us, MyBackend, BEGIN};
use crate::error::StoreError;
use crate::store::key_rate;
use crate::store::rate::{self, StartLog};
use crate::store::sql_row::{claimed_task, CLAIM_COLS};
use crate::store::{
    Claim, KeyRate, RatedClaim, Task, TaskClaim, TaskClaimKeyRated, TaskClaimRated,
};

impl MyBackend {
    /// An uncapped claim in two round trips: `BEGIN`, the store's now in
    /// `@baton_t` and the locking select of the candidates' whole rows,
    /// then the update and `COMMIT` (was five: `BEGIN`, select, update,
    /// read, `COMMIT`). The update starts each attempt at `@baton_t`, so
    /// every value it writes (attempt, fencing token, lease) follows from
    /// the locked row and that instant: the tasks are built from the
    /// select's rows, with no read-back (one statement and a primary-key
    /// read a task fewer on the server). Nothing due: the select's batch
    /// and a `ROLLBACK`. With `finish` (successes a worker carries, see
    /// `finish_ok.rs`), their compare-and-set goes first in the same
    /// transaction (and then nothing due ends in `COMMIT`); the answer per
    /// finish item comes first.
    pub(super) async fn claim_in_two_batches(
        &self,
        req: &TaskClaim<'_>,
        walk: i64,
        finish: &[Claim],
    ) -> Result<(Vec<bool>, Vec<Task>), StoreError> {
        let queue = hex_lit(req.queue.as_bytes());
        let begin = if self.backlog.holds(req.queue) {
            BEGIN_IN_BACKLOG
        } else {
            BEGIN
        };
        let mut open = OpenTx {
            conn: self.pool.acquire().await?,
            open: true,
        };
        let conn = &mut open.conn;
        let rows = batch_on(
            conn,
            &format!(
                "{begin}; {}SET @baton_t = {}; {}",
                self.successes_sql(finish),
                self.names.now,
                self.claim_select_rows(walk, &queue)
            ),
        )
        .await?;
        // The finish's answers first, then the claim's candidates.
        let (done, cands): (Vec<_>, Vec<_>) =
            rows.iter().partition(|r| super::finish_ok::is_answer(r));
        self.backlog.set(
            req.queue,
            i64::try_from(cands.len()).is_ok_and(|n| n >= walk),
        );
        let finished = super::finish_ok::answer_rows(finish, &done)?;
        let ids = cands
            .iter()
            .map(|r| Ok((r.try_get::<i64, _>("id")?, r.try_get::<i64, _>("spare")?)))
            .collect::<Result<Vec<_>, sqlx::Error>>()
            .map(|rows| claim_pick(rows, req, req.limit));
        let ids = match ids {
            Ok(ids) => ids,
            Err(e) => {
                if (&mut **conn).execute("ROLLBACK").await.is_ok() {
                    open.open = false;
                }
                return Err(e.into());
            }
        };
        if ids.is_empty() {
            // Nothing to claim: the carried finishes are written alone.
            let end = if finish.is_empty() {
                "ROLLBACK"
            } else {
                "COMMIT"
            };
            match (&mut **conn).execute(end).await {
                Ok(_) => open.open = false,
                // Their commit is not known to have happened.
                Err(e) if !finish.is_empty() => return Err(e.into()),
                Err(_) => {}
            }
            return Ok((finished, Vec::new()));
        }
        // The picked candidates' rows, in claim order (the select's).
        let picked: crate::fast_hash::FastSet<i64> = ids.iter().copied().collect();
        let lease_us = us(req.lease);
        let tasks = cands
            .iter()
            .filter(|r| {
                r.try_get::<i64, _>("id")
                    .is_ok_and(|id| picked.contains(&id))
            })
            .map(|r| started_task(r, lease_us))
            .collect::<Result<Vec<_>, _>>();
        let tasks = match tasks {
            Ok(t) if t.len() == ids.len() => t,
            Ok(_) | Err(_) => {
                if (&mut **conn).execute("ROLLBACK").await.is_ok() {
                    open.open = false;
                }
                return Err(tasks.err().unwrap_or_else(|| {
                    StoreError::Corrupt("claimed candidates: an id read twice".into())
                }));
            }
        };
        let list = ids
            .iter()
            .map(i64::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        batch_on(
            conn,
            &format!(
                "{}; COMMIT",
                self.claim_update_at(
                    &list,
                    &lease_us.to_string(),
                    &text_lit(req.worker),
                    "@baton_t"
                )
            ),
        )
        .await?;
        open.open = false;
        Ok((finished, tasks))
    }

    /// The locking select of a claim: the queue's due tasks in claim order,
    /// `limit` of them, skipping those other claimers hold. A paused queue
    /// claims nothing: its flag is read in the same statement that locks
    /// the rows. `queue` and `queue_again` are the queue's name (a `?` or a
    /// literal) for the tasks and the queues table.
    fn claim_select(&self, limit: i64, queue: &str, queue_again: &str) -> String {
        self.claim_select_of(
            "id, CAST(attempt + 1 < max_attempts AS SIGNED)",
            limit,
            queue,
            queue_again,
        )
    }

    /// [`claim_select`](Self::claim_select) with the candidates' whole
    /// rows ([`CLAIM_COLS`]) and `spare` (whether an attempt is left after
    /// this one), and `@baton_t` as `claimed_at`.
    fn claim_select_rows(&self, limit: i64, queue: &str) -> String {
        let cols = format!(
            "{CLAIM_COLS}, CAST(attempt + 1 < max_attempts AS SIGNED) AS spare, \
             @baton_t AS claimed_at"
        );
        self.claim_select_of(&cols, limit, queue, queue)
    }

    /// A claim's locking select of `cols`.
    fn claim_select_of(&self, cols: &str, limit: i64, queue: &str, queue_again: &str) -> String {
        let now = &self.names.now;
        format!(
            "SELECT {cols} FROM {t} \
             WHERE queue = {queue} AND state = 'pending' \
                 AND run_at <= {now} AND cancel_requested = 0 \
                 AND NOT EXISTS (SELECT 1 FROM {q} WHERE queue = {queue_again} AND paused = 1) \
             ORDER BY priority, run_at, id LIMIT {limit} FOR UPDATE SKIP LOCKED",
            t = self.names.tasks,
            q = self.names.queues
        )
    }

    /// The update that starts the claimed attempts (`ids`: a list for
    /// `IN (…)`; `lease_us` and `worker`: a `?` each or literals).
    pub(super) fn claim_update(&self, ids: &str, lease_us: &str, worker: &str) -> String {
        self.claim_update_at(ids, lease_us, worker, &self.names.now)
    }

    /// [`claim_update`](Self::claim_update) starting the attempts at the
    /// instant `now` (an SQL expression): the fencing token is
    /// `GREATEST(claim_token + 1, now in µs)` ([`started_task`]).
    fn claim_update_at(&self, ids: &str, lease_us: &str, worker: &str, now: &str) -> String {
        format!(
            "UPDATE {} SET state = 'running', attempt = attempt + 1, \
                 started_at = {now}, \
                 lease_until = {now} + INTERVAL {lease_us} MICROSECOND, \
                 worker = {worker}, claim_token = GREATEST(claim_token + 1, {}) \
             WHERE id IN ({ids})",
            self.names.tasks,
            super::micros_of(now)
        )
    }

    /// The claimed tasks read back in claim order, with more columns
    /// (`extra`, each after a comma).
    fn claim_read_with(&self, ids: &str, extra: &str) -> String {
        format!(
            "SELECT {CLAIM_COLS}{extra} FROM {} WHERE id IN ({ids}) \
             ORDER BY priority, run_at, id",
            self.names.tasks
        )
    }
}

/// How a claim into a backlog begins, uncapped or under a cap per key
/// (`keyed::task_claim`, which says why its count holds): at `REPEATABLE
/// READ`, the one exception to baton's `READ COMMITTED` on MySQL.
///
/// InnoDB at `READ COMMITTED` cost MariaDB 10.11 about a fifth more server
/// CPU a task than `REPEATABLE READ` for the same claims and finishes
/// (docs/BENCHMARKS.md session 41: `baton-bench ceiling --shape`, with
/// and without `rc`). What `REPEATABLE READ` adds is gap locks: each row
/// the claim's walk locks is locked with the gap before it in the claim
/// index, and a walk that reaches the end of the due tasks locks the
/// record after them too, until the claim commits. An insert into a
/// locked gap (an enqueue, a rescue, a claimed row's entry in the index's
/// `running` part) waits for that claim, and two claims that each reached
/// the end can deadlock over their own rows' entries. A walk that stops
/// at its limit, in a backlog longer than it, locks no such end: the
/// gaps it holds are between due tasks, where only a task that sorts
/// before the backlog's last (a higher priority, an earlier `run_at`)
/// is inserted. So a claim runs at `REPEATABLE READ` only while the
/// queue's last such claim from this handle walked as far as it asked
/// ([`Backlog`]); one that comes back short makes the next begin at
/// `READ COMMITTED` again, and a deadlock's victim runs again whole
/// (`again_if_deadlocked`).
pub(super) const BEGIN_IN_BACKLOG: &str =
    "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ; START TRANSACTION";

/// The queues whose last claim from this handle (uncapped, or under a cap
/// per key) walked as far as it asked: there is a backlog beyond the
/// walk, so the next claim begins with [`BEGIN_IN_BACKLOG`].
#[derive(Debug, Default)]
pub(super) struct Backlog(Mutex<crate::fast_hash::FastSet<String>>);

impl Backlog {
    /// Whether `queue`'s last claim walked as far as it asked.
    pub(super) fn holds(&self, queue: &str) -> bool {
        self.0.lock().is_ok_and(|s| s.contains(queue))
    }

    /// Record whether `queue`'s claim walked as far as it asked.
    pub(super) fn set(&self, queue: &str, full: bool) {
        if let Ok(mut s) = self.0.lock() {
            if full {
                if !s.contains(queue) {
                    s.insert(queue.to_owned());
                }
            } else {
                s.remove(queue);
            }
        }
    }
}

/// How many candidates an uncapped claim's locking select walks
/// ([`TaskClaim::plain_walk`]: its buffer share may step over tasks on
/// their last attempt, see [`claim_pick`]).
pub(super) fn plain_walk(req: &TaskClaim<'_>) -> i64 {
    i64::from(req.plain_walk())
}

/// The claimed ids among the locked candidates `(id, spare)` (in claim
/// order), at most `limit`: the first `req.limit - req.buffered` start at
/// once, the later ones only with an attempt to spare
/// (`TaskClaim::buffered`). The others stay locked, unchanged, until
/// the claim commits.
pub(super) fn claim_pick(rows: Vec<(i64, i64)>, req: &TaskClaim<'_>, limit: u32) -> Vec<i64> {
    let now_share = req.limit.saturating_sub(req.buffered) as usize;
    rows.into_iter()
        .enumerate()
        .filter(|(i, (_, spare))| *i < now_share || *spare != 0)
        .map(|(_, (id, _))| id)
        .take(limit as usize)
        .collect()
}

/// The task a candidate row of [`MyBackend::claim_select_rows`] becomes
/// once the update started its attempt at `claimed_at` with a lease of
/// `lease_us`: what the update writes, computed from the locked row as
/// the server computes it (attempt + 1, fencing token
/// `max(token + 1, claimed_at in µs)`, lease `claimed_at + lease_us`).
fn started_task(row: &sqlx::mysql::MySqlRow, lease_us: i64) -> Result<Task, StoreError> {
    use crate::store::sql_row::SqlRow;
    let at = row.time("claimed_at")?;
    let at_us = at.timestamp_micros();
    let lease_until = at + chrono::Duration::microseconds(lease_us);
    let mut task = crate::store::sql_row::claimed_task_leased(row, lease_until)?;
    task.attempt = task
        .attempt
        .checked_add(1)
        .ok_or_else(|| StoreError::Corrupt("attempt: out of range".into()))?;
    let token = row.big("claim_token")?.saturating_add(1).max(at_us);
    task.token = crate::store::sql_row::token_of(token, "claim token")?;
    Ok(task)
}

/// One transaction: (with a cap, lock the queue's row in `<p>queues`
/// and count its running tasks), lock up to `limit` due pending rows
/// with `FOR UPDATE SKIP LOCKED`, claim them, read them back.
pub(super) async fn task_claim(
    b: &MyBackend,
    req: &TaskClaim<'_>,
) -> Result<Vec<Task>, StoreError> {
    if req.limit == 0 {
        return Ok(Vec::new());
    }
    if req.fair {
        return super::fair::task_claim(b, req).await;
    }
    // Uncapped (the common case): two round trips in all, each a batch
    // of statements sent as text (see `MyBackend::batch`).
    if let Some(per_key) = req.per_key_max_running {
        return super::keyed::task_claim(b, req, per_key).await;
    }
    let Some(max) = req.max_running else {
        let (_, tasks) = b.claim_in_two_batches(req, plain_walk(req), &[]).await?;
        return Ok(tasks);
    };
    let mut tx = b.begin().await?;
    let tasks = capped_in(b, &mut tx, req, Some(max)).await?;
    finish_claim(tx, tasks).await
}

/// Commit a claim's transaction (roll it back when it took nothing).
pub(super) async fn finish_claim(
    tx: sqlx::Transaction<'_, sqlx::MySql>,
    tasks: Vec<Task>,
) -> Result<Vec<Task>, StoreError> {
    if tasks.is_empty() {
        tx.rollback().await?;
    } else {
        tx.commit().await?;
    }
    Ok(tasks)
}

/// A claim inside `tx`, committed by the caller: with a cap (`max`), lock
/// the queue's row and count its running tasks first.
async fn capped_in(
    b: &MyBackend,
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    req: &TaskClaim<'_>,
    max: Option<u32>,
) -> Result<Vec<Task>, StoreError> {
    let t = &b.names.tasks;
    let mut limit = i64::from(req.limit);
    let walk_extra = i64::from(req.buffered.min(req.limit));
    if let Some(max) = max {
        lock_queue_row(b, tx, req.queue).await?;
        let running: i64 = sqlx::query_scalar(&format!(
            "SELECT COUNT(*) FROM {t} WHERE queue = ? AND state = 'running'"
        ))
        .bind(req.queue)
        .fetch_one(&mut **tx)
        .await?;
        limit = limit.min(i64::from(max) - running);
    }
    if limit <= 0 {
        return Ok(Vec::new());
    }
    let cap = u32::try_from(limit).unwrap_or(u32::MAX);
    let select = b.claim_select(limit + walk_extra, "?", "?");
    let rows: Vec<(i64, i64)> = sqlx::query_as(&select)
        .bind(req.queue.as_bytes())
        .bind(req.queue.as_bytes())
        .fetch_all(&mut **tx)
        .await?;
    let ids = claim_pick(rows, req, cap);
    claim_ids(b, tx, req, &ids).await
}

/// A claim under a rate limit, in one transaction: lock the limit's row
/// in `<p>rates` (claimers of the limit take turns on it, then on the
/// queue's row when capped), read its start log with the store's clock,
/// claim within the room left, log the claimed tasks' `started_at`.
pub(super) async fn task_claim_rated(
    b: &MyBackend,
    req: &TaskClaimRated<'_>,
) -> Result<RatedClaim, StoreError> {
    if req.claim.fair {
        // The procedure is made outside the transaction (DDL commits).
        super::fair::ready(b).await?;
    }
    let mut tx = b.begin().await?;
    let answer = rated_in(b, &mut tx, req, None).await?;
    tx.commit().await?;
    Ok(answer)
}

/// A claim under a rate per concurrency key (and the queue's or a named
/// limit when set), in one transaction (`key_rate.rs`).
pub(super) async fn task_claim_key_rated(
    b: &MyBackend,
    req: &TaskClaimKeyRated<'_>,
) -> Result<RatedClaim, StoreError> {
    let mut tx = b.begin().await?;
    let answer = match req.rated() {
        Some(rated) => rated_in(b, &mut tx, &rated, Some(req.key_rate)).await?,
        None => {
            let now_us = super::key_rate::now_us_on(b, &mut tx).await?;
            let (tasks, next) =
                super::key_rate::claim_in(b, &mut tx, &req.claim, req.key_rate, now_us).await?;
            key_rate::answer(tasks, now_us, next)?
        }
    };
    tx.commit().await?;
    Ok(answer)
}

/// [`task_claim_rated`] inside `tx`, committed by the caller; under a
/// rate per key too when `key_rate` is set.
async fn rated_in(
    b: &MyBackend,
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    req: &TaskClaimRated<'_>,
    key_rate: Option<KeyRate>,
) -> Result<RatedClaim, StoreError> {
    let now_us = &b.names.now_us;
    let key = req.key();
    let r = &b.names.rates;
    let lock = format!("SELECT starts, {now_us} FROM {r} WHERE name = ? FOR UPDATE");
    let mut row: Option<(Vec<u8>, i64)> = sqlx::query_as(&lock)
        .bind(key.as_bytes())
        .fetch_optional(&mut **tx)
        .await?;
    if row.is_none() {
        sqlx::query(&format!(
            "INSERT IGNORE INTO {r} (name, starts) VALUES (?, '')"
        ))
        .bind(key.as_bytes())
        .execute(&mut **tx)
        .await?;
        row = sqlx::query_as(&lock)
            .bind(key.as_bytes())
            .fetch_optional(&mut **tx)
            .await?;
    }
    let (starts, now_us) = row.ok_or_else(|| {
        StoreError::Corrupt(format!("rate limit {key:?}: no row after its insert"))
    })?;
    let starts = String::from_utf8(starts).map_err(|_| {
        StoreError::Corrupt(format!("rate limit {key:?}: a start log not in ASCII"))
    })?;
    let log = StartLog::decode(&starts)?;
    let mut key_next = None;
    let tasks = match (rate::plan(req, &log, now_us), key_rate) {
        (None, _) => Vec::new(),
        (Some(claim), Some(kr)) => {
            let (tasks, next) = super::key_rate::claim_in(b, tx, &claim, kr, now_us).await?;
            key_next = next;
            tasks
        }
        (Some(claim), None) if claim.fair => super::fair::claim_in(tx, b, &claim).await?,
        (Some(claim), None) => match claim.per_key_max_running {
            Some(per_key) => super::keyed::claim_in(b, tx, &claim, per_key).await?,
            None => capped_in(b, tx, &claim, claim.max_running).await?,
        },
    };
    let mut started = Vec::with_capacity(tasks.len());
    if !tasks.is_empty() {
        let sql = format!(
            "SELECT TIMESTAMPDIFF(MICROSECOND, '1970-01-01 00:00:00', started_at) \
             FROM {} WHERE id IN ({})",
            b.names.tasks,
            marks(tasks.len())
        );
        let mut q = sqlx::query_scalar(&sql);
        for t in &tasks {
            q = q.bind(t.id);
        }
        started = q.fetch_all(&mut **tx).await?;
    }
    let mut d = rate::finish(req, log, tasks, &started, now_us)?;
    if let Some(text) = d.write {
        sqlx::query(&format!("UPDATE {r} SET starts = ? WHERE name = ?"))
            .bind(text)
            .bind(key.as_bytes())
            .execute(&mut **tx)
            .await?;
    }
    d.answer.key_next = key_rate::key_next_at(key_next, d.answer.now.timestamp_micros())?;
    Ok(d.answer)
}

/// Lock `queue`'s row in `<p>queues` (inserting it if need be) until
/// `tx` ends: claimers of a capped queue take turns on it, so each counts
/// the running tasks after the previous one committed.
pub(super) async fn lock_queue_row(
    b: &MyBackend,
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    queue: &str,
) -> Result<(), StoreError> {
    lock_queue_row_on(tx, &b.names, queue).await
}

/// [`lock_queue_row`] on any connection (inside its transaction); also
/// what serializes debounced and throttled enqueues of a queue
/// (`key_policy.rs`).
pub(super) async fn lock_queue_row_on(
    conn: &mut sqlx::MySqlConnection,
    n: &super::Names,
    queue: &str,
) -> Result<(), StoreError> {
    sqlx::query(&format!(
        "INSERT INTO {} (queue) VALUES (?) ON DUPLICATE KEY UPDATE queue = queue",
        n.queues
    ))
    .bind(queue)
    .execute(&mut *conn)
    .await?;
    Ok(())
}

/// The end of a capped claim: start the attempts of `ids` (rows `tx`
/// holds locked) and read them back; the caller commits.
pub(super) async fn claim_ids(
    b: &MyBackend,
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    req: &TaskClaim<'_>,
    ids: &[i64],
) -> Result<Vec<Task>, StoreError> {
    let rows = claim_ids_with(b, tx, req, ids, "").await?;
    rows.iter().map(claimed_task).collect()
}

/// Claim `ids` for `req` in `tx` (the update, then the tasks read back in
/// claim order), the rows carrying `extra` columns too (each after a
/// comma; the rate per key's claim reads each task's `started_at` so).
pub(super) async fn claim_ids_with(
    b: &MyBackend,
    tx: &mut sqlx::Transaction<'_, sqlx::MySql>,
    req: &TaskClaim<'_>,
    ids: &[i64],
    extra: &str,
) -> Result<Vec<sqlx::mysql::MySqlRow>, StoreError> {
    if ids.is_empty() {
        return Ok(Vec::new());
    }
    let list = marks(ids.len());
    let update = b.claim_update(&list, "?", "?");
    let mut u = sqlx::query(&update).bind(us(req.lease)).bind(req.worker);
    for id in ids {
        u = u.bind(id);
    }
    u.execute(&mut **tx).await?;
    let read = b.claim_read_with(&list, extra);
    let mut s = sqlx::query(&read);
    for id in ids {
        s = s.bind(id);
    }
    Ok(s.fetch_all(&mut **tx).await?)
}

/// A pooled connection inside a transaction that spans round trips
/// (`BEGIN` sent in one, `COMMIT` in a later one). Dropped while still
/// open — the claim's future cancelled between its round trips by a
/// shutdown or the call bound — the connection is closed, which rolls the
/// transaction back, instead of going back to the pool with the
/// transaction open: its row locks would make other claims skip those
/// tasks, and the next caller's statements on it would run inside it,
/// uncommitted (an enqueue reported done, then lost when the connection
/// closes).
pub(super) struct OpenTx {
    /// The connection.
    pub(super) conn: sqlx::pool::PoolConnection<sqlx::MySql>,
    /// Whether its transaction may still be open (then a drop closes it).
    pub(super) open: bool,
}

impl Drop for OpenTx {
    fn drop(&mut self) {
        if self.open {
            self.conn.close_on_drop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Backlog;

    #[test]
    fn a_queue_is_in_backlog_from_a_full_walk_to_a_short_one() {
        let b = Backlog::default();
        assert!(!b.holds("a"), "a queue starts at READ COMMITTED");
        b.set("a", true);
        assert!(b.holds("a"));
        assert!(!b.holds("b"), "per queue");
        b.set("a", true);
        assert!(b.holds("a"));
        b.set("a", false);
        assert!(!b.holds("a"), "a short walk ends the backlog");
    }
}
