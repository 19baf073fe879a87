//! Job definitions kept in the store (issue 26, "jobs defined at run
//! time"): one versioned document per job name, written with a
//! compare-and-set on the version, deleted as a tombstone, and a change
//! counter the schedulers poll so a reload costs one small read
//! (DESIGN.md "Jobs defined at run time", invariant D1).
//!
//! The SQL backends share the decisions here (`put`, `delete`) over
//! three statements each implements (`JobDefRows`); Redis decides in
//! `lua/jobdefs.lua`, the same way.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
use crate::error::StoreError;

/// How long a deleted definition's tombstone is kept: 7 days, long
/// enough that every instance has reloaded past the delete (they poll the
/// revision every few seconds) before the name may start again at
/// version 1.
pub const TOMBSTONE_RETENTION: std::time::Duration = std::time::Duration::from_secs(7 * 24 * 3600);

/// The name of the SQL stores' row that keeps the pruned tombstones'
/// versions (so the revision, the sum of the versions, never falls back);
/// never a job's name (names are not empty), never listed.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) const PRUNED_ROW: &str = "";

/// The largest definition document a store keeps, in bytes of its JSON
/// text.
pub const MAX_JOBDEF_BYTES: usize = 64 * 1024;

/// One job's definition as the store keeps it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobDef {
    /// The job's name.
    pub name: String,
    /// Its version: 1 when first created, one more on every change,
    /// delete and re-create; never repeats for a name.
    pub version: i64,
    /// The definition document (a JSON object; its meaning is the
    /// caller's: `baton` keeps a `[[job]]` table there).
    pub spec: serde_json::Value,
    /// Deleted: a tombstone kept so the version never repeats (the spec
    /// is the last one before the delete).
    pub deleted: bool,
    /// When this name was (last re-)created, by the store's clock.
    pub created_at: DateTime<Utc>,
    /// When this version was written, by the store's clock.
    pub updated_at: DateTime<Utc>,
    /// Who wrote this version (an operator, a token's name, `cli:user`).
    pub updated_by: String,
}

/// Which definition of a job a scheduler's loop runs, given with each
/// [`JobAdvance`](super::JobAdvance) (`source`) so that a loop that has
/// not yet reloaded a change cannot take a slot the newer definition
/// governs: a definition governs the slots at and after the moment it was
/// written (its `updated_at`), a delete hands them back to the
/// instances' own jobs (DESIGN.md D2).
///
/// ```
/// use baton::store::DefinitionSource;
/// // The loop of version 3 of a definition the store keeps.
/// let stored = DefinitionSource::Stored(3);
/// // The loop of a job from the instance's code or config file.
/// let own = DefinitionSource::Own;
/// assert_ne!(stored, own);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DefinitionSource {
    /// The store's definition of the job, at this version.
    Stored(i64),
    /// The instance's own job (from code or a config file), which gives
    /// way to a live definition of the same name in the store.
    Own,
}

/// A job definition's row as an advance checks it against its
/// [`DefinitionSource`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DefinitionMark {
    /// The row's version.
    pub version: i64,
    /// A tombstone.
    pub deleted: bool,
    /// When this version was written, by the store's clock.
    pub updated_at: DateTime<Utc>,
}

impl DefinitionSource {
    /// Whether a definition other than this loop's governs `slot`, the
    /// name's row being `row` (`None`: the store has none): the advance
    /// is then refused ([`Advanced::Superseded`](super::Advanced::Superseded)).
    pub(crate) fn superseded(self, row: Option<DefinitionMark>, slot: DateTime<Utc>) -> bool {
        match (self, row) {
            // Pruned, or never written: nothing governs by this version.
            (Self::Stored(_), None) => true,
            (Self::Stored(v), Some(r)) => r.version != v && r.updated_at <= slot,
            (Self::Own, None) => false,
            (Self::Own, Some(r)) => !r.deleted && r.updated_at <= slot,
        }
    }
}

/// The [`Wake`](super::Wake) "queue" that announces a definitions change
/// on a store's wake-up channel: a control character leads it, so no
/// queue can have this name (names are printable text), and workers pass
/// it by as a queue they do not serve.
pub(crate) const DEFINITIONS_WAKE: &str = "\u{1}definitions";

/// The wake-up a definitions write sends ([`DEFINITIONS_WAKE`]) on the
/// stores whose channel is this process's.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) fn definitions_wake() -> super::Wake {
    super::Wake::now(DEFINITIONS_WAKE)
}

/// Params of [`Backend::jobdef_put`](super::Backend::jobdef_put): create
/// a definition (`expected: None`: the name has none, or only a
/// tombstone) or replace version `expected` of it.
#[derive(Debug, Clone, Copy)]
pub struct JobDefPut<'a> {
    /// The job's name, already validated.
    pub name: &'a str,
    /// The document, already validated by its caller.
    pub spec: &'a serde_json::Value,
    /// `None`: create; `Some(v)`: replace version `v`, only if it is the
    /// live version.
    pub expected: Option<i64>,
    /// Who writes it.
    pub by: &'a str,
}

/// Params of [`Backend::jobdef_delete`](super::Backend::jobdef_delete):
/// turn the live definition into a tombstone (version + 1).
#[derive(Debug, Clone, Copy)]
pub struct JobDefDelete<'a> {
    /// The job's name.
    pub name: &'a str,
    /// `Some(v)`: only if `v` is the live version; `None`: whichever is.
    pub expected: Option<i64>,
    /// Who deletes it.
    pub by: &'a str,
}

/// The answer to a definition write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobDefWrite {
    /// Written: the definition's version now (a tombstone's, for a
    /// delete).
    Written {
        /// The new version.
        version: i64,
    },
    /// Refused, nothing changed: the name's live version is not the one
    /// expected (`current`: the live version, `None` when the name has no
    /// live definition).
    Conflict {
        /// The live version, if any.
        current: Option<i64>,
    },
}

/// The three statements a SQL backend gives [`put`] and [`delete`], each
/// atomic on its own; the decisions are compare-and-sets on `version`, so
/// two writers racing on one name cannot both win.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
#[async_trait::async_trait]
pub(crate) trait JobDefRows {
    /// The name's `(version, deleted)`, if it has a row.
    async fn row(&self, name: &str) -> Result<Option<(i64, bool)>, StoreError>;
    /// Insert version 1 unless the name has a row; whether it inserted.
    async fn insert(&self, name: &str, spec: &str, by: &str) -> Result<bool, StoreError>;
    /// When the row's version is `from`, and it is a tombstone exactly
    /// when `from_deleted`: set version `from + 1`, the spec (`None`: keep
    /// it and make the row a tombstone; `Some`: live), `updated_at` now,
    /// `updated_by`, and `created_at` now when a tombstone comes back to
    /// life. Whether it wrote.
    async fn write(
        &self,
        name: &str,
        from: i64,
        from_deleted: bool,
        spec: Option<&str>,
        by: &str,
    ) -> Result<bool, StoreError>;
    /// Tell the schedulers listening on this store that the definitions
    /// changed ([`definitions_wake`]); a hint, so a failure is only
    /// logged (they read the change counter on a timer as well).
    async fn announce_change(&self);
}

/// [`Backend::jobdef_put`](super::Backend::jobdef_put) over a SQL
/// backend's rows.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) async fn put(
    rows: &impl JobDefRows,
    p: &JobDefPut<'_>,
) -> Result<JobDefWrite, StoreError> {
    let spec = serde_json::to_string(p.spec)
        .map_err(|e| StoreError::Corrupt(format!("job definition: {e}")))?;
    let row = rows.row(p.name).await?;
    let live = row.filter(|(_, deleted)| !deleted).map(|(v, _)| v);
    let written = match (p.expected, row) {
        (None, None) => rows.insert(p.name, &spec, p.by).await?.then_some(1),
        (None, Some((v, true))) => rows
            .write(p.name, v, true, Some(&spec), p.by)
            .await?
            .then_some(v + 1),
        (Some(e), Some((v, false))) if e == v => rows
            .write(p.name, v, false, Some(&spec), p.by)
            .await?
            .then_some(v + 1),
        _ => None,
    };
    if written.is_some() {
        rows.announce_change().await;
    }
    answer(rows, p.name, written, live).await
}

/// [`Backend::jobdef_delete`](super::Backend::jobdef_delete) over a SQL
/// backend's rows.
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) async fn delete(
    rows: &impl JobDefRows,
    d: &JobDefDelete<'_>,
) -> Result<JobDefWrite, StoreError> {
    let row = rows.row(d.name).await?;
    let live = row.filter(|(_, deleted)| !deleted).map(|(v, _)| v);
    let written = match live {
        Some(v) if d.expected.is_none_or(|e| e == v) => rows
            .write(d.name, v, false, None, d.by)
            .await?
            .then_some(v + 1),
        _ => None,
    };
    if written.is_some() {
        rows.announce_change().await;
    }
    answer(rows, d.name, written, live).await
}

/// The write's answer: its version, or the conflict with the live version
/// as it is now (read again when the compare-and-set lost a race).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
async fn answer(
    rows: &impl JobDefRows,
    name: &str,
    written: Option<i64>,
    live: Option<i64>,
) -> Result<JobDefWrite, StoreError> {
    Ok(match written {
        Some(version) => JobDefWrite::Written { version },
        None => {
            let current = match rows.row(name).await {
                Ok(r) => r.filter(|(_, d)| !d).map(|(v, _)| v),
                Err(_) => live,
            };
            JobDefWrite::Conflict { current }
        }
    })
}

/// A stored document back to JSON.
pub(crate) fn spec_of(
    name: &str,
    text: &str,
) -> Result<serde_json::Value, crate::error::StoreError> {
    serde_json::from_str(text)
        .map_err(|e| crate::error::StoreError::Corrupt(format!("job definition {name:?}: {e}")))
}

/// A SQL row of the definitions' table to a [`JobDef`].
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) fn jobdef_row(row: &impl super::sql_row::SqlRow) -> Result<JobDef, StoreError> {
    let name = row.text("name")?;
    Ok(JobDef {
        spec: spec_of(&name, &row.text("spec")?)?,
        version: row.big("version")?,
        deleted: row.flag("deleted")?,
        created_at: row.time("created_at")?,
        updated_at: row.time("updated_at")?,
        updated_by: row.text("updated_by")?,
        name,
    })
}

/// The statement that reads a name's [`DefinitionMark`] from a SQL
/// backend's definitions table (`param`: its placeholder for the name).
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) fn mark_sql(table: &str, param: &str) -> String {
    format!("SELECT version, deleted, updated_at FROM {table} WHERE name = {param}")
}

/// A row of [`mark_sql`] to a [`DefinitionMark`].
#[cfg(any(feature = "sqlite", feature = "postgres", feature = "mysql"))]
pub(crate) fn mark_row(row: &impl super::sql_row::SqlRow) -> Result<DefinitionMark, StoreError> {
    Ok(DefinitionMark {
        version: row.big("version")?,
        deleted: row.flag("deleted")?,
        updated_at: row.time("updated_at")?,
    })
}
