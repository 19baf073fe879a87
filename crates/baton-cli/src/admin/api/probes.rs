//! The probes (`/livez`, `/readyz`) and the first endpoints (`/health`,
//! `/jobs`, `/stats`, `/metrics`): what a load balancer, an orchestrator
//! or a scraper asks.

use super::*;

/// `GET /livez`: the process is up.
pub async fn livez() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// Why the server is not ready: the reason, and the schema versions when
/// the store answered with a schema other than this build's.
struct Unready {
    error: String,
    schema: Option<SchemaStatus>,
}

/// Whether the store answers and holds this build's schema version.
async fn ready(state: &State) -> Result<(), Unready> {
    let unready = |error: String| Unready {
        error,
        schema: None,
    };
    // A store that is not the one this process connected to (it lost its
    // data, or went back in time) fails readiness until a restart; the
    // check logs the change once and counts it.
    if let Ok(Err(e)) = tokio::time::timeout(READY_TIMEOUT, state.store.check_identity()).await {
        tracing::debug!(error = %baton::error::chain(&e), "readyz: reading the store's identity failed");
    }
    if let Some(why) = state.store.identity_lost() {
        return Err(unready(why));
    }
    // A store that refuses writes (a standby or demoted primary behind
    // the URL) cannot serve claims or schedules: probe it (a write of no
    // row), which also clears the mark once writes work again.
    match tokio::time::timeout(READY_TIMEOUT, state.store.check_writable()).await {
        Ok(Ok(Some(why))) => return Err(unready(format!("store refuses writes: {why}"))),
        Ok(Ok(None)) => {}
        Ok(Err(e)) => {
            tracing::debug!(error = %baton::error::chain(&e), "readyz: the write probe failed")
        }
        Err(_) => {}
    }
    match tokio::time::timeout(READY_TIMEOUT, state.store.schema_status()).await {
        Ok(Ok(st)) => match st.problem() {
            None => Ok(()),
            Some(why) => Err(Unready {
                error: why,
                schema: Some(st),
            }),
        },
        Ok(Err(e)) => Err(unready(format!("store: {}", baton::error::chain(&e)))),
        Err(_) => Err(unready(format!(
            "store: no answer within {READY_TIMEOUT:?}"
        ))),
    }
}

/// `GET /readyz`: 200 when the store answers with this build's schema
/// version, takes writes (see `baton::store::WriteWatch`) and is the
/// store this process connected to (its identity unchanged, see
/// `baton::store::IdentityWatch`); 503 with the reason otherwise (and, for a schema of another
/// version, `schema: {found, expected}`).
pub async fn readyz(Extract(state): S) -> Response {
    match ready(&state).await {
        Ok(()) => Json(json!({"status": "ready"})).into_response(),
        Err(u) => {
            let mut body = json!({"status": "unavailable", "error": u.error});
            if let Some(st) = u.schema {
                body["schema"] = json!({"found": st.found, "expected": st.expected});
            }
            (StatusCode::SERVICE_UNAVAILABLE, Json(body)).into_response()
        }
    }
}

/// `GET /health`: as `/readyz`, with `{"status": "ok"}` when ready.
pub async fn health(Extract(state): S) -> Response {
    match ready(&state).await {
        Ok(()) => Json(json!({"status": "ok"})).into_response(),
        Err(u) => error(StatusCode::SERVICE_UNAVAILABLE, &u.error, None),
    }
}

/// `GET /jobs`: the store's jobs as the library reports them.
pub async fn jobs_raw(Extract(state): S) -> Answer {
    Ok(Json(serde_json::to_value(
        schedule::job_statuses(&state.store).await?,
    )?))
}

/// `GET /stats`: counts per queue and state.
pub async fn stats_raw(Extract(state): S) -> Answer {
    Ok(Json(serde_json::to_value(
        Queue::new(state.store.clone()).stats().await?,
    )?))
}

/// `GET /metrics`: Prometheus metrics, in OpenMetrics text or the classic
/// text format as `Accept` asks. It answers while the store is down: this
/// process's own metrics, and the store's last view with `baton_store_up 0`
/// (see `baton::metrics::Scraper`).
pub async fn metrics(Extract(state): S, headers: axum::http::HeaderMap) -> Response {
    let accept = headers.get(header::ACCEPT).and_then(|v| v.to_str().ok());
    let format = baton::metrics::Format::from_accept(accept);
    match state.metrics.render(&state.workers, format).await {
        Ok(body) => ([(header::CONTENT_TYPE, format.content_type())], body).into_response(),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            &baton::error::chain(&e),
            None,
        ),
    }
}
