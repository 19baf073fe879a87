//! The audit log on Redis: a sorted set of JSON records by id under the
//! index base (`lua/audit.lua`).

use std::time::Duration;

use serde::Deserialize;

use super::RedisBackend;
use crate::error::StoreError;
use crate::store::{from_ms, ms, AuditAppend, AuditPage, AuditRecord};

pub(super) async fn append(b: &RedisBackend, e: &AuditAppend<'_>) -> Result<(), StoreError> {
    let _: i64 = b
        .q(
            &b.scripts.audit,
            sargs!["append", e.actor, e.action, e.target, e.source, e.outcome],
        )
        .await?;
    Ok(())
}

#[derive(Deserialize)]
struct Stored {
    id: i64,
    at: i64,
    actor: String,
    action: String,
    target: String,
    source: String,
    outcome: String,
}

pub(super) async fn list(
    b: &RedisBackend,
    page: &AuditPage,
) -> Result<Vec<AuditRecord>, StoreError> {
    let before = page.before_id.map(|i| i.to_string()).unwrap_or_default();
    let recs: Vec<String> = b
        .q(&b.scripts.audit, sargs!["list", before, page.size()])
        .await?;
    recs.iter()
        .map(|r| {
            let s: Stored = serde_json::from_str(r)
                .map_err(|e| StoreError::Corrupt(format!("audit record: {e}")))?;
            Ok(AuditRecord {
                id: s.id,
                at: from_ms(s.at)?,
                actor: s.actor,
                action: s.action,
                target: s.target,
                source: s.source,
                outcome: s.outcome,
            })
        })
        .collect()
}

pub(super) async fn prune(b: &RedisBackend, older_than: Duration) -> Result<u64, StoreError> {
    let mut total = 0u64;
    loop {
        let gone: u64 = b
            .q(&b.scripts.audit, sargs!["prune", ms(older_than)])
            .await?;
        total += gone;
        if gone < 1000 {
            return Ok(total);
        }
    }
}
