//! Ending attempts on SQLite: a batch of successes in one statement (one
//! hand-off to the connection's thread, one write lock, one commit), other
//! outcomes as compare-and-set UPDATEs, mixed batches in one `IMMEDIATE`
//! transaction; then the wake-ups for tasks pending again.

use crate::fast_hash::{set_with_capacity, FastSet};

use sqlx::Row;

use super::rows::json_text;
use super::SqliteBackend;
use crate::error::StoreError;
use crate::store::sql_row::token_arg;
use crate::store::{ms, Claim, Finish, CANCEL_REQUESTED};

impl SqliteBackend {
    /// The compare-and-set UPDATE that ends an attempt, and its `?3`/`?4`
    /// arguments (error text, retry delay in ms); `?1`/`?2` are id and claim
    /// token. The transitions are DESIGN.md's task state table.
    fn finish_sql<'f>(&self, finish: &'f Finish) -> (&str, Option<&'f str>, Option<i64>) {
        let f = &self.sql.finish;
        match finish {
            Finish::Succeeded => (&f.succeeded, None, None),
            Finish::Failed { error, retry_in } => {
                (&f.failed, Some(error.as_str()), retry_in.map(ms))
            }
            Finish::Cancelled { reason } => (&f.cancelled, Some(reason.as_str()), None),
            Finish::HandBack => (&f.hand_back, Some(CANCEL_REQUESTED), None),
            Finish::Snoozed { run_in } => (&f.hand_back, Some(CANCEL_REQUESTED), Some(ms(*run_in))),
        }
    }

    /// One finish that is not a success, as its own statement (a batch of
    /// one needs no transaction).
    async fn finish_one(&self, claim: Claim, finish: &Finish) -> Result<bool, StoreError> {
        let (sql, text, retry_in) = self.finish_sql(finish);
        let q = sqlx::query(sql)
            .bind(claim.id)
            .bind(token_arg(claim.token))
            .bind(text)
            .bind(retry_in);
        let Some(row) = q.fetch_optional(&*self.pool).await? else {
            return Ok(false);
        };
        match finish {
            Finish::HandBack if row.try_get::<String, _>("state")? == "pending" => {
                let queue: String = row.try_get("queue")?;
                self.wake([queue.as_str()]);
            }
            Finish::Failed { .. } | Finish::Snoozed { .. }
                if row.try_get::<String, _>("state")? == "pending" =>
            {
                // A retry: announce when its backoff ends.
                let queue: String = row.try_get("queue")?;
                self.wake_later([(queue.as_str(), row.try_get::<i64, _>("run_at")?)]);
            }
            _ => {}
        }
        Ok(true)
    }
}

/// A batch of successes (`list`, the JSON pairs of `items`) all at once
/// when every compare-and-set holds, without a row per task coming back
/// (each row is a hand-off between SQLite's thread and the caller's):
/// `Some` of all `true`, or `None` when some pair no longer holds and
/// nothing was written, for [`Sql::succeed_many`](super::sql::Sql) to
/// tell which do. Also `None` for a batch naming a task twice, whose
/// count could not tell.
async fn succeed_all(
    b: &SqliteBackend,
    items: &[(Claim, Finish)],
    list: &str,
) -> Result<Option<Vec<bool>>, StoreError> {
    if items.is_empty() {
        return Ok(Some(Vec::new()));
    }
    let mut ids = set_with_capacity(items.len());
    if !items.iter().all(|(c, _)| ids.insert(c.id)) {
        return Ok(None);
    }
    let changed = sqlx::query(&b.sql.succeed_all)
        .bind(list)
        .execute(&*b.pool)
        .await?
        .rows_affected();
    match usize::try_from(changed) {
        Ok(0) => Ok(None),
        Ok(n) if n == items.len() => Ok(Some(vec![true; n])),
        _ => Err(StoreError::Backend(format!(
            "finishing {} tasks all at once changed {changed} rows",
            items.len()
        ))),
    }
}

/// [`Backend::task_finish_many`](crate::store::Backend::task_finish_many)
/// on SQLite.
pub(super) async fn finish_many(
    b: &SqliteBackend,
    items: &[(Claim, Finish)],
) -> Result<Vec<bool>, StoreError> {
    // Successes (the common case) in one statement; the rest one by one.
    // Each statement is a hand-off to the connection's thread, so a
    // batch of successes is one hand-off, one write lock, one commit.
    if let [(claim, finish)] = items {
        if !matches!(finish, Finish::Succeeded) {
            return Ok(vec![b.finish_one(*claim, finish).await?]);
        }
    }
    let mut out = vec![false; items.len()];
    let ok: Vec<serde_json::Value> = items
        .iter()
        .filter(|(_, f)| matches!(f, Finish::Succeeded))
        .map(|(c, _)| serde_json::json!([c.id, token_arg(c.token)]))
        .collect();
    let rest = items.len() - ok.len();
    let succeed = &b.sql.succeed_many;
    let list = json_text(&serde_json::Value::Array(ok))?;
    let mut woken: Vec<String> = Vec::new();
    let mut retried: Vec<(String, i64)> = Vec::new();
    // The (id, claim token) pairs that succeeded: an item is answered by
    // its own pair, so a stale attempt's success sent beside its task's
    // current one is refused, not answered as the other was.
    let done: FastSet<(i64, i64)> = if rest == 0 {
        if let Some(all) = succeed_all(b, items, &list).await? {
            return Ok(all);
        }
        // One statement is atomic on its own.
        sqlx::query_as(succeed)
            .bind(&list)
            .fetch_all(&*b.pool)
            .await?
            .into_iter()
            .collect()
    } else {
        // Mixed outcomes: one IMMEDIATE transaction, one commit.
        let mut tx = b.pool.begin_with("BEGIN IMMEDIATE").await?;
        let done: FastSet<(i64, i64)> = if rest < items.len() {
            sqlx::query_as(succeed)
                .bind(&list)
                .fetch_all(&mut *tx)
                .await?
                .into_iter()
                .collect()
        } else {
            FastSet::default()
        };
        for (i, (claim, finish)) in items.iter().enumerate() {
            if matches!(finish, Finish::Succeeded) {
                continue;
            }
            let (sql, text, retry_in) = b.finish_sql(finish);
            let row = sqlx::query(sql)
                .bind(claim.id)
                .bind(token_arg(claim.token))
                .bind(text)
                .bind(retry_in)
                .fetch_optional(&mut *tx)
                .await?;
            match (&row, finish) {
                (Some(row), Finish::HandBack)
                    if row.try_get::<String, _>("state")? == "pending" =>
                {
                    woken.push(row.try_get("queue")?)
                }
                (Some(row), Finish::Failed { .. } | Finish::Snoozed { .. })
                    if row.try_get::<String, _>("state")? == "pending" =>
                {
                    retried.push((row.try_get("queue")?, row.try_get("run_at")?));
                }
                _ => {}
            }
            out[i] = row.is_some();
        }
        tx.commit().await?;
        done
    };
    for (i, (claim, finish)) in items.iter().enumerate() {
        if matches!(finish, Finish::Succeeded) {
            out[i] = done.contains(&(claim.id, token_arg(claim.token)));
        }
    }
    b.wake(woken.iter().map(String::as_str));
    b.wake_later(retried.iter().map(|(q, at)| (q.as_str(), *at)));
    Ok(out)
}
