//! Every write through the admin API (and so the dashboard) goes into the
//! audit log: who (the [`Caller`]), what (the method and route), on what
//! (the route's parameters), from where (`dashboard` when the page says
//! so in [`SOURCE_HEADER`], else `api`) and how it ended (the status).
//! Reads are not recorded; requests auth refused never reach here.

use std::sync::Arc;

use axum::extract::{MatchedPath, Request, State as Extract};
use axum::http::Method;
use axum::middleware::Next;
use axum::response::Response;
use baton::store::AuditAppend;

use super::api::SOURCE_HEADER;
use super::auth::Caller;
use super::State;

/// The route's parameters in `path`, by its `template`:
/// `/api/v1/queues/{name}/pause` and `/api/v1/queues/emails/pause` give
/// `name=emails`; a route without parameters gives `-`.
pub fn target(template: &str, path: &str) -> String {
    let params: Vec<String> = template
        .split('/')
        .zip(path.split('/'))
        .filter_map(|(t, p)| {
            let name = t.strip_prefix('{')?.strip_suffix('}')?;
            Some(format!("{name}={p}"))
        })
        .collect();
    if params.is_empty() {
        "-".into()
    } else {
        params.join(" ")
    }
}

/// The middleware (a route layer, inside auth).
pub async fn record(Extract(state): Extract<Arc<State>>, req: Request, next: Next) -> Response {
    if matches!(*req.method(), Method::GET | Method::HEAD) {
        return next.run(req).await;
    }
    let actor = req
        .extensions()
        .get::<Caller>()
        .map_or_else(|| "api:unknown".to_string(), |c| c.0.clone());
    let template = req
        .extensions()
        .get::<MatchedPath>()
        .map_or_else(|| req.uri().path().to_string(), |m| m.as_str().to_string());
    let action = format!("{} {template}", req.method());
    let target = target(&template, req.uri().path());
    let dashboard = req
        .headers()
        .get(SOURCE_HEADER)
        .is_some_and(|v| v.as_bytes() == b"dashboard");
    let source = if dashboard { "dashboard" } else { "api" };
    let resp = next.run(req).await;
    let outcome = resp.status().as_u16().to_string();
    let entry = AuditAppend {
        actor: &actor,
        action: &action,
        target: &target,
        source,
        outcome: &outcome,
    };
    if let Err(e) = baton::audit::record(&state.store, &entry).await {
        tracing::warn!(error = %baton::error::chain(&e), %actor, %action, %target, "could not record an admin action in the audit log");
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn targets_name_the_route_parameters() {
        assert_eq!(
            target("/api/v1/queues/{name}/pause", "/api/v1/queues/emails/pause"),
            "name=emails"
        );
        assert_eq!(target("/api/v1/tasks/{id}", "/api/v1/tasks/42"), "id=42");
        assert_eq!(target("/api/v1/tasks/delete", "/api/v1/tasks/delete"), "-");
    }
}
