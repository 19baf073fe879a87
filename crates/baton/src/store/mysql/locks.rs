//! Locks on MySQL: one row per name, never deleted.

use std::time::Duration;

use chrono::{DateTime, Utc};

use sqlx::mysql::MySqlRow;

use super::{hex_lit, text_lit, us, MyBackend, BEGIN};
use crate::error::StoreError;
use crate::store::sql_row::{lock_info, token_arg, SqlRow};
use crate::store::{Acquire, FencingToken, LockAcquire, LockInfo, LockRelease};

/// The columns [`lock_info`] reads: the record and the store's `now`.
fn lock_cols(now: &str) -> String {
    format!("name, holder, token, locked_at, lock_until, {now} AS now")
}

/// Where a new lock row starts: lapsed long ago.
const EPOCH: &str = "1970-01-01 00:00:00";

/// The one row a grant reads back (its transaction made sure it exists).
fn one_row<'r>(rows: &'r [MySqlRow], name: &str) -> Result<&'r MySqlRow, StoreError> {
    match rows {
        [row] => Ok(row),
        _ => Err(StoreError::Corrupt(format!(
            "lock {name:?}: the grant read back {} rows, expected 1",
            rows.len()
        ))),
    }
}

impl MyBackend {
    /// `SET set` on the lease `token` holds on `name` while it is current,
    /// and the new `lock_until` read back, in one transaction; `None` when
    /// the lease was not current (or the name was never locked).
    async fn lock_until_after(
        &self,
        name: &str,
        token: FencingToken,
        set: &str,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        let now = &self.names.now;
        let l = &self.names.locks;
        let lit = hex_lit(name.as_bytes());
        let rows = self
            .batch(&format!(
                "{BEGIN}; \
                 UPDATE {l} SET {set} \
                 WHERE name = {lit} AND token = {} AND lock_until > {now}; \
                 SELECT lock_until, ROW_COUNT() AS changed FROM {l} WHERE name = {lit}; \
                 COMMIT",
                token_arg(token)
            ))
            .await?;
        // No row: the name was never locked.
        let Some(row) = rows.first() else {
            return Ok(None);
        };
        if row.big("changed")? != 1 {
            return Ok(None);
        }
        Ok(Some(row.time("lock_until")?))
    }
}

/// Grant, in one round trip ([`MyBackend::batch`]): one transaction
/// that makes sure the name's row exists (an upsert that changes
/// nothing on an existing row, so its only effect there is the row's
/// exclusive lock, which serializes grants of the name), takes the row
/// if its lease lapsed, and reads it back with `ROW_COUNT()` of the
/// take: 1 if this call took it, else 0 and the row is the live
/// holder's. A new row starts lapsed at the epoch with token 0, so the
/// take gives it the store's now as its first token. The take always
/// changes the row (the token rises), so the count is the same with
/// or without `CLIENT_FOUND_ROWS`.
pub(super) async fn lock_acquire(
    b: &MyBackend,
    req: &LockAcquire<'_>,
) -> Result<Acquire, StoreError> {
    let (now, now_us) = (&b.names.now, &b.names.now_us);
    let (l, cols) = (&b.names.locks, lock_cols(now));
    let name = hex_lit(req.name.as_bytes());
    let holder = text_lit(req.holder);
    let at_most = us(req.at_most);
    let rows = b
        .batch(&format!(
            "{BEGIN}; \
             INSERT INTO {l} (name, holder, token, locked_at, lock_until) \
             VALUES ({name}, '', 0, '{EPOCH}', '{EPOCH}') \
             ON DUPLICATE KEY UPDATE name = name; \
             UPDATE {l} SET holder = {holder}, token = GREATEST(token + 1, {now_us}), \
             locked_at = {now}, \
             lock_until = {now} + INTERVAL {at_most} MICROSECOND \
             WHERE name = {name} AND lock_until <= {now}; \
             SELECT {cols}, ROW_COUNT() AS taken FROM {l} WHERE name = {name}; \
             COMMIT"
        ))
        .await?;
    let row = one_row(&rows, req.name)?;
    let info = lock_info(row)?;
    if row.big("taken")? != 1 {
        return Ok(Acquire::Busy(info));
    }
    Ok(Acquire::Granted {
        token: info.token,
        locked_at: info.locked_at,
        lock_until: info.lock_until,
    })
}

/// Extend, in one round trip: the conditional update and the new
/// `lock_until` read back in one transaction.
pub(super) async fn lock_extend(
    b: &MyBackend,
    name: &str,
    token: FencingToken,
    at_most: Duration,
) -> Result<Option<DateTime<Utc>>, StoreError> {
    let now = &b.names.now;
    b.lock_until_after(
        name,
        token,
        &format!("lock_until = {now} + INTERVAL {} MICROSECOND", us(at_most)),
    )
    .await
}

/// Revoke (an operator's force-release), in one round trip: the
/// conditional update and the new `lock_until` read back in one
/// transaction.
pub(super) async fn lock_revoke(
    b: &MyBackend,
    name: &str,
    token: FencingToken,
    within: Duration,
) -> Result<Option<DateTime<Utc>>, StoreError> {
    let now = &b.names.now;
    b.lock_until_after(
        name,
        token,
        &format!(
            "token = token + 1, holder = LEFT(CONCAT('revoked:', holder), 1024), \
             lock_until = LEAST(lock_until, {now} + INTERVAL {} MICROSECOND)",
            us(within)
        ),
    )
    .await
}

pub(super) async fn lock_release(b: &MyBackend, p: &LockRelease<'_>) -> Result<bool, StoreError> {
    let now = &b.names.now;
    let release = format!(
        "UPDATE {} SET lock_until = GREATEST({now}, \
             locked_at + INTERVAL ? MICROSECOND) \
         WHERE name = ? AND token = ? AND lock_until > {now}",
        b.names.locks
    );
    let run = |q| {
        sqlx::query(q)
            .bind(us(p.at_least))
            .bind(p.name)
            .bind(token_arg(p.token))
    };
    if !p.record {
        return Ok(run(release.as_str())
            .execute(&b.pool)
            .await?
            .rows_affected()
            == 1);
    }
    // The release and its lock-history record, in one transaction sent
    // as one round trip (text protocol, several statements): the name as
    // a hex literal (whatever it holds, whatever the SQL mode), token and
    // times as numbers. The insert runs only when the update released
    // (`@baton_released`); the affected rows add up to 2 then, 0 when the
    // lease was not current.
    let (name, token, at_least) = (
        format!(
            "CONVERT({} USING utf8mb4) COLLATE utf8mb4_bin",
            super::hex_lit(p.name.as_bytes())
        ),
        token_arg(p.token),
        us(p.at_least),
    );
    let (locks, hist) = (&b.names.locks, &b.names.lock_history);
    let sql = format!(
        "{begin}; \
         UPDATE {locks} SET lock_until = GREATEST({now}, locked_at + INTERVAL {at_least} MICROSECOND) \
             WHERE name = {name} AND token = {token} AND lock_until > {now}; \
         SET @baton_released = ROW_COUNT(); \
         INSERT INTO {hist} (name, holder, token, acquired_at, released_at) \
             SELECT name, holder, token, locked_at, {now} FROM {locks} \
             WHERE name = {name} AND token = {token} AND @baton_released = 1; \
         COMMIT",
        begin = super::BEGIN
    );
    // Until the batch has answered, the connection may be inside its
    // transaction: dropped then (the future cancelled, or the batch stopped
    // by an error part-way) it is closed, not handed back to the pool.
    let mut open = super::claim::OpenTx {
        conn: b.pool.acquire().await?,
        open: true,
    };
    // A query without arguments goes by the text protocol, which takes
    // several statements.
    let done = sqlx::Executor::execute(&mut *open.conn, sql.as_str()).await?;
    open.open = false;
    // The update's row and the record's: 2; a lease not current: 0.
    Ok(done.rows_affected() > 0)
}

/// One lock (`Some(name)`) or all of them, by name.
pub(super) async fn lock_read(
    b: &MyBackend,
    name: Option<&str>,
) -> Result<Vec<LockInfo>, StoreError> {
    let (l, cols) = (&b.names.locks, lock_cols(&b.names.now));
    let rows = match name {
        Some(name) => {
            sqlx::query(&format!("SELECT {cols} FROM {l} WHERE name = ?"))
                .bind(name)
                .fetch_all(&b.pool)
                .await?
        }
        None => {
            sqlx::query(&format!("SELECT {cols} FROM {l} ORDER BY name"))
                .fetch_all(&b.pool)
                .await?
        }
    };
    rows.iter().map(lock_info).collect()
}
