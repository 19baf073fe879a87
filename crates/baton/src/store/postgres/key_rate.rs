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

use sqlx::postgres::PgRow;
use sqlx::Row;

use super::finish::{FinishArgs, PgQuery};
use super::finish_sql::FinishParts;
use super::key_rate_fn::{function_name, returns};
use super::{Names, PgBackend, MAX_MS};
use crate::error::StoreError;
use crate::store::key_rate::{self, BUFFER_HOLD, PRUNE_BATCH, PRUNE_GRACE};
use crate::store::sql_row::{claimed_task, CLAIM_COLS};
use crate::store::{Claim, Finish, KeyRate, Task, TaskClaim};

/// How many parameters the key rated claim's call takes (`$1`–`$14`, as
/// [`PgBackend::claim_keys`] binds them); a finish beside it takes the
/// ones after.
pub(super) const KEY_CLAIM_PARAMS: usize = 14;

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

/// The key rated claim's call, its arguments `$1`–`$14` and the store's
/// clock, then `extra` columns.
fn call_sql(n: &Names, from: &str, walk: &str, extra: &str) -> String {
    format!(
        "SELECT {CLAIM_COLS}, key_next, now_us{extra} FROM {from}{}($1, $2, $3, $4, $5, $6, $7, \
             {walk}, $9, $10, $11, $12, $13, $14, {}) AS f({})",
        function_name(n),
        n.now,
        returns()
    )
}

/// The key rated claim and a batch's finishes `fin` (its parameters after
/// [`KEY_CLAIM_PARAMS`]) in one statement: one round trip and one commit
/// for both. The finishes run first: the claim's call takes, as its walk's
/// length, `$8` plus nothing times the number finished, so it runs after
/// them and they are not written while the function holds its keys'
/// locks. A rate counts starts, so a finish changes no count the claim
/// makes; a cap the function also enforces may see the finished tasks as
/// running or not (a volatile function sees its statement's earlier
/// writes), which only claims less. The function's closing row (every
/// task column NULL) carries the finished attempts' ids and tokens
/// (`done_ids`, `done_tokens`).
pub(super) fn finish_claim_keys_sql(n: &Names, fin: &FinishParts) -> String {
    format!(
        "{} {}",
        fin.counted(),
        call_sql(
            n,
            "fd, LATERAL ",
            "$8 + 0 * fd.done_n",
            ", CASE WHEN id IS NULL THEN fd.done_ids END AS done_ids, \
             CASE WHEN id IS NULL THEN fd.done_tokens END AS done_tokens"
        )
    )
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
        let sql = call_sql(&self.names, "", "$8", "");
        let sent = tokio::time::Instant::now();
        let rows = self.bind_key_claim(&sql, req, rate).fetch_all(conn).await?;
        self.claim_took(sent.elapsed());
        Ok(key_claimed(&rows)?.0)
    }

    /// [`claim_keys`](Self::claim_keys) carrying `finish` (each the
    /// compare-and-set `task_finish_many` makes, answered per item), in
    /// one statement ([`finish_claim_keys_sql`]), outside a transaction.
    pub(super) async fn finish_and_claim_keys(
        &self,
        finish: &[(Claim, Finish)],
        req: &TaskClaim<'_>,
        rate: KeyRate,
    ) -> Result<(Vec<bool>, KeyClaimed), StoreError> {
        if req.fair {
            return Err(crate::store::key_rate_fair_refused());
        }
        let args = FinishArgs::new(finish);
        let query = self.bind_key_claim(self.sql.finish_key_claim(args.succeeded), req, rate);
        let rows = self.claim_with_finish(query, &args, finish).await?;
        // The function's closing row carries the finished attempts.
        let (claimed, closing) = key_claimed(&rows)?;
        Ok((args.answered(closing)?, claimed))
    }

    /// `sql` (a call of the key rated claim function) with its arguments
    /// `$1`–`$14` bound.
    fn bind_key_claim<'q>(&self, sql: &'q str, req: &TaskClaim<'q>, rate: KeyRate) -> PgQuery<'q> {
        // `per` clamped as durations are (so the sums stay in range).
        let per = key_rate::us(rate.per).min(MAX_MS.saturating_mul(1000));
        self.claim_call(sql, req)
            .bind(key_rate::walk_len(req))
            .bind(i64::from(rate.max))
            .bind(per)
            .bind(key_rate::us(BUFFER_HOLD))
            .bind(key_rate::us(PRUNE_GRACE))
            .bind(PRUNE_BATCH)
            .bind(self.lock_key(req.queue))
    }
}

/// The key rated claim function's rows: the claimed tasks, in claim
/// order, and its closing row (every task column NULL) with its
/// `key_next` and `now_us`.
fn key_claimed(rows: &[PgRow]) -> Result<(KeyClaimed, &PgRow), StoreError> {
    let mut tasks = Vec::with_capacity(rows.len());
    let mut last = None;
    for row in rows {
        if row.try_get::<Option<i64>, _>("id")?.is_some() {
            tasks.push(claimed_task(row)?);
        } else {
            last = Some(row);
        }
    }
    let closing = last.ok_or_else(|| {
        StoreError::Corrupt("the key rated claim function returned no closing row".into())
    })?;
    tasks.sort_by_key(|t| (t.priority, t.run_at, t.id));
    let claimed = KeyClaimed {
        tasks,
        key_next: closing.try_get::<Option<i64>, _>("key_next")?,
        now_us: closing.try_get::<i64, _>("now_us")?,
    };
    Ok((claimed, closing))
}
