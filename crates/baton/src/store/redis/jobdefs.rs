//! Job definitions on Redis: one JSON record a name in the hash
//! `P{baton}:jobdefs`, and a change counter (`lua/jobdefs.lua`). One home
//! on a cluster: definitions are few and rarely written.

use serde::Deserialize;

use super::RedisBackend;
use crate::error::StoreError;
use crate::store::jobdefs::spec_of;
use crate::store::{from_ms, JobDef, JobDefDelete, JobDefPut, JobDefWrite};

/// The script's answer to a write.
fn written((ok, version): (i64, i64)) -> JobDefWrite {
    if ok == 1 {
        JobDefWrite::Written { version }
    } else {
        JobDefWrite::Conflict {
            current: (version >= 0).then_some(version),
        }
    }
}

/// After a write that landed, tell the schedulers subscribed to the
/// store's wake-up channel (a hint: a failure is only logged, they read
/// the change counter on a timer as well).
async fn announce(b: &RedisBackend, (ok, _): (i64, i64)) {
    if ok != 1 {
        return;
    }
    let mut conn = b.conn.clone();
    if let Err(e) = redis::cmd("PUBLISH")
        .arg(b.wake_channel())
        .arg(crate::store::jobdefs::DEFINITIONS_WAKE)
        .query_async::<()>(&mut conn)
        .await
    {
        tracing::warn!(error = %e, "cannot announce the job definitions' change; schedulers see it on their next read");
    }
}

/// An expected version as the script takes it (`''`: none).
fn expected(v: Option<i64>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

pub(super) async fn put(b: &RedisBackend, p: &JobDefPut<'_>) -> Result<JobDefWrite, StoreError> {
    let spec = serde_json::to_string(p.spec)
        .map_err(|e| StoreError::Corrupt(format!("job definition: {e}")))?;
    let out: (i64, i64) = b
        .q(
            &b.scripts.jobdefs,
            sargs!["put", p.name, expected(p.expected), spec, p.by],
        )
        .await?;
    announce(b, out).await;
    Ok(written(out))
}

pub(super) async fn delete(
    b: &RedisBackend,
    d: &JobDefDelete<'_>,
) -> Result<JobDefWrite, StoreError> {
    let out: (i64, i64) = b
        .q(
            &b.scripts.jobdefs,
            sargs!["delete", d.name, expected(d.expected), d.by],
        )
        .await?;
    announce(b, out).await;
    Ok(written(out))
}

#[derive(Deserialize)]
struct Stored {
    name: String,
    version: i64,
    spec: String,
    deleted: bool,
    created_at: i64,
    updated_at: i64,
    by: String,
}

/// The name's definition as an advance checks it (`None`: no record).
pub(super) async fn mark(
    b: &RedisBackend,
    name: &str,
) -> Result<Option<crate::store::jobdefs::DefinitionMark>, StoreError> {
    #[derive(Deserialize)]
    struct Mark {
        version: i64,
        deleted: bool,
        updated_at: i64,
    }
    let rec: Option<String> = b.q(&b.scripts.jobdefs, sargs!["get", name]).await?;
    rec.map(|r| {
        let m: Mark = serde_json::from_str(&r)
            .map_err(|e| StoreError::Corrupt(format!("job definition record: {e}")))?;
        Ok(crate::store::jobdefs::DefinitionMark {
            version: m.version,
            deleted: m.deleted,
            updated_at: from_ms(m.updated_at)?,
        })
    })
    .transpose()
}

pub(super) async fn list(b: &RedisBackend) -> Result<Vec<JobDef>, StoreError> {
    let recs: Vec<String> = b.q(&b.scripts.jobdefs, sargs!["list"]).await?;
    let mut out = recs
        .iter()
        .map(|r| {
            let s: Stored = serde_json::from_str(r)
                .map_err(|e| StoreError::Corrupt(format!("job definition record: {e}")))?;
            Ok(JobDef {
                spec: spec_of(&s.name, &s.spec)?,
                version: s.version,
                deleted: s.deleted,
                created_at: from_ms(s.created_at)?,
                updated_at: from_ms(s.updated_at)?,
                updated_by: s.by,
                name: s.name,
            })
        })
        .collect::<Result<Vec<_>, StoreError>>()?;
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

pub(super) async fn revision(b: &RedisBackend) -> Result<i64, StoreError> {
    b.q(&b.scripts.jobdefs, sargs!["rev"]).await
}

/// Delete the tombstones older than `older_than` (one script; the change
/// counter only rises).
pub(super) async fn prune(
    b: &RedisBackend,
    older_than: std::time::Duration,
) -> Result<u64, StoreError> {
    b.q(
        &b.scripts.jobdefs,
        sargs!["prune", crate::store::ms(older_than)],
    )
    .await
}
