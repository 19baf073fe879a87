//! Locks on MySQL: one row per name, never deleted.

use std::time::Duration;

use chrono::{DateTime, Utc};

use super::{us, MyBackend, NOW_US};
use crate::error::StoreError;
use crate::store::sql_row::{lock_info, token_arg};
use crate::store::{Acquire, FencingToken, LockInfo, LockRequest};

/// The columns [`lock_info`] reads: the record and the store's now.
const LOCK_COLS: &str = "name, holder, token, locked_at, lock_until, UTC_TIMESTAMP(6) AS now";

impl MyBackend {
    /// Grant: in one transaction, lock the name's row (or find none), and
    /// take it if its lease lapsed (or insert it). A concurrent insert of a
    /// new name loses on the primary key and tries again; the row lock
    /// makes the grant exclusive.
    pub(super) async fn acquire(&self, req: &LockRequest<'_>) -> Result<Acquire, StoreError> {
        let l = &self.names.locks;
        for _ in 0..8 {
            let mut tx = self.begin().await?;
            let row = sqlx::query(&format!(
                "SELECT {LOCK_COLS} FROM {l} WHERE name = ? FOR UPDATE"
            ))
            .bind(req.name)
            .fetch_optional(&mut *tx)
            .await?;
            match row {
                Some(row) => {
                    let info = lock_info(&row)?;
                    if info.held {
                        tx.rollback().await?;
                        return Ok(Acquire::Busy(info));
                    }
                    sqlx::query(&format!(
                        "UPDATE {l} SET holder = ?, token = GREATEST(token + 1, {NOW_US}), \
                         locked_at = UTC_TIMESTAMP(6), \
                         lock_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE name = ?"
                    ))
                    .bind(req.holder)
                    .bind(us(req.at_most))
                    .bind(req.name)
                    .execute(&mut *tx)
                    .await?;
                }
                None => {
                    let r = sqlx::query(&format!(
                        "INSERT INTO {l} (name, holder, token, locked_at, lock_until) \
                         VALUES (?, ?, {NOW_US}, UTC_TIMESTAMP(6), \
                             UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)"
                    ))
                    .bind(req.name)
                    .bind(req.holder)
                    .bind(us(req.at_most))
                    .execute(&mut *tx)
                    .await;
                    match r.map_err(StoreError::from) {
                        Ok(_) => {}
                        // Another grant of the new name won: look again.
                        Err(StoreError::Conflict(_)) => {
                            tx.rollback().await?;
                            continue;
                        }
                        Err(e) => return Err(e),
                    }
                }
            }
            let row = sqlx::query(&format!("SELECT {LOCK_COLS} FROM {l} WHERE name = ?"))
                .bind(req.name)
                .fetch_one(&mut *tx)
                .await?;
            tx.commit().await?;
            let info = lock_info(&row)?;
            return Ok(Acquire::Granted {
                token: info.token,
                locked_at: info.locked_at,
                lock_until: info.lock_until,
            });
        }
        Err(StoreError::Conflict(format!(
            "lock {:?}: the new name kept changing hands; try again",
            req.name
        )))
    }

    pub(super) async fn extend(
        &self,
        name: &str,
        token: FencingToken,
        at_most: Duration,
    ) -> Result<Option<DateTime<Utc>>, StoreError> {
        let l = &self.names.locks;
        let mut tx = self.begin().await?;
        let r = sqlx::query(&format!(
            "UPDATE {l} SET lock_until = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND \
             WHERE name = ? AND token = ? AND lock_until > UTC_TIMESTAMP(6)"
        ))
        .bind(us(at_most))
        .bind(name)
        .bind(token_arg(token))
        .execute(&mut *tx)
        .await?;
        if r.rows_affected() != 1 {
            tx.rollback().await?;
            return Ok(None);
        }
        let until: DateTime<Utc> =
            sqlx::query_scalar(&format!("SELECT lock_until FROM {l} WHERE name = ?"))
                .bind(name)
                .fetch_one(&mut *tx)
                .await?;
        tx.commit().await?;
        Ok(Some(until))
    }

    pub(super) async fn release(
        &self,
        name: &str,
        token: FencingToken,
        at_least: Duration,
    ) -> Result<bool, StoreError> {
        let r = sqlx::query(&format!(
            "UPDATE {} SET lock_until = GREATEST(UTC_TIMESTAMP(6), \
                 locked_at + INTERVAL ? MICROSECOND) \
             WHERE name = ? AND token = ? AND lock_until > UTC_TIMESTAMP(6)",
            self.names.locks
        ))
        .bind(us(at_least))
        .bind(name)
        .bind(token_arg(token))
        .execute(&self.pool)
        .await?;
        Ok(r.rows_affected() == 1)
    }

    /// One lock (`Some(name)`) or all of them, by name.
    pub(super) async fn lock_read(&self, name: Option<&str>) -> Result<Vec<LockInfo>, StoreError> {
        let l = &self.names.locks;
        let rows = match name {
            Some(name) => {
                sqlx::query(&format!("SELECT {LOCK_COLS} FROM {l} WHERE name = ?"))
                    .bind(name)
                    .fetch_all(&self.pool)
                    .await?
            }
            None => {
                sqlx::query(&format!("SELECT {LOCK_COLS} FROM {l} ORDER BY name"))
                    .fetch_all(&self.pool)
                    .await?
            }
        };
        rows.iter().map(lock_info).collect()
    }
}
