//! `/api/v1/audit`: the audit log, newest first.

use super::*;

/// `GET /api/v1/audit?before=&limit=`: `{records, next_before}`, newest
/// first (as `baton audit --json`).
pub async fn audit(
    Extract(state): S,
    q: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Answer {
    let q = params(q, &["before", "limit"])?;
    let (before_id, limit) = page_params(&q)?;
    let page = baton::store::AuditPage { before_id, limit };
    let records = baton::audit::list(&state.store, &page).await?;
    let next = (records.len() == limit as usize)
        .then(|| records.last().map(|r| r.id))
        .flatten();
    Ok(Json(
        json!({"records": shapes::audit(&records)?, "next_before": next}),
    ))
}
