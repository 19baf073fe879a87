//! `/api/v1/queues/{name}/keys`: the load of a queue's concurrency keys.

use super::*;

/// `GET /api/v1/queues/{name}/keys?limit=`: the busiest keys (most
/// running, then most pending) with their running and pending tasks, how
/// many keys have tasks running and pending, the declared per-key cap and
/// rate, and under a rate each key's starts in the window and next allowed
/// start (as `baton queues keys QUEUE --json`).
pub async fn queue_keys(
    Extract(state): S,
    PathText(name): PathText,
    q: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Answer {
    let Query(q) =
        q.map_err(|e| ApiError::bad("query", format!("{}; use ?limit=", e.body_text())))?;
    if let Some(k) = q.keys().find(|k| k.as_str() != "limit") {
        return Err(ApiError::bad(k, "unknown parameter; use limit"));
    }
    let (_, limit) = page_params(&q)?;
    let load = Queue::new(state.store.clone()).keys(&name, limit).await?;
    Ok(Json(serde_json::to_value(&load).map_err(|e| {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
    })?))
}
