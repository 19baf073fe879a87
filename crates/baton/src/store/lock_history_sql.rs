//! Lock history's SQL shared by the SQL backends: the list (newest first,
//! one lock or all) and the prune (by age, given as a condition, and past
//! the newest [`LOCK_HISTORY_PER_LOCK`] of a lock), and the row decoder.

use super::sql_row::{token_of, SqlRow};
use super::{LockRecord, LOCK_HISTORY_PER_LOCK};
use crate::error::StoreError;

/// The list: placeholder 1 the name (`NULL` for every lock, bound twice
/// where `p` numbers by position), placeholder 2 the limit.
pub(crate) fn list_sql(table: &str, p: fn(usize) -> String) -> String {
    format!(
        "SELECT name, holder, token, acquired_at, released_at FROM {table} \
         WHERE ({n} IS NULL OR name = {n}) ORDER BY id DESC LIMIT {}",
        p(2),
        n = p(1),
    )
}

/// The prune: rows matching `too_old` (a condition on `released_at`) and
/// rows beyond the newest [`LOCK_HISTORY_PER_LOCK`] of their lock.
pub(crate) fn prune_sql(table: &str, too_old: &str) -> String {
    format!(
        "DELETE FROM {table} WHERE {too_old} OR id IN (SELECT id FROM ( \
             SELECT id, row_number() OVER (PARTITION BY name ORDER BY id DESC) AS rn \
             FROM {table}) AS ranked WHERE rn > {LOCK_HISTORY_PER_LOCK})"
    )
}

/// One record from `name, holder, token, acquired_at, released_at`.
pub(crate) fn lock_record(row: &impl SqlRow) -> Result<LockRecord, StoreError> {
    Ok(LockRecord {
        name: row.text("name")?,
        holder: row.text("holder")?,
        token: token_of(row.big("token")?, "lock history token")?,
        acquired_at: row.time("acquired_at")?,
        released_at: row.time("released_at")?,
    })
}
