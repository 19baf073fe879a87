//! The admin server's handlers: the probes (`/livez`, `/readyz`), the
//! first endpoints (`/health`, `/jobs`, `/stats`, `/metrics`) and the
//! `/api/v1` JSON API over the library's high-level calls. Every answer's
//! JSON shape comes from [`crate::shapes`], as the CLI's `--json` does.
//! Errors are `{"error": "...", "field"?: "..."}`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::QueryRejection;
use axum::extract::{FromRequest, FromRequestParts, Path, Query, Request, State as Extract};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use baton::lock::Locker;
use baton::queue::{Queue, TaskBuilder};
use baton::schedule;
use baton::store::{
    CancelOutcome, DeleteOutcome, FencingToken, SchemaStatus, TaskFilter, TaskState,
};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::{json, Value};

use super::State;
use crate::{command_task, output, shapes};

type S = Extract<Arc<State>>;

/// How often the queues are sampled for throughput.
pub const SAMPLE_EVERY: Duration = Duration::from_secs(30);
/// How many samples are kept: an hour's worth.
const SAMPLES: usize = 121;
/// The most tasks one list page holds.
const MAX_PAGE: u32 = 1000;
/// The most tasks one bulk retry touches.
const MAX_BULK: usize = 10_000;
/// How long a readiness check may take.
const READY_TIMEOUT: Duration = Duration::from_secs(5);

/// An error answer: `{"error": message, "field": field}`.
pub fn error(status: StatusCode, message: &str, field: Option<&str>) -> Response {
    let mut body = json!({ "error": message });
    if let Some(f) = field {
        body["field"] = json!(f);
    }
    (status, Json(body)).into_response()
}

/// A handler's failure.
pub struct ApiError {
    status: StatusCode,
    message: String,
    field: Option<String>,
}

impl ApiError {
    fn new(status: StatusCode, message: impl Into<String>) -> ApiError {
        ApiError {
            status,
            message: message.into(),
            field: None,
        }
    }

    /// Bad input in `field`.
    fn bad(field: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            field: Some(field.into()),
        }
    }

    fn not_found(message: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, message)
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        error(self.status, &self.message, self.field.as_deref())
    }
}

impl From<baton::Error> for ApiError {
    fn from(e: baton::Error) -> ApiError {
        match e {
            baton::Error::Invalid(i) => ApiError::bad(&i.field, i.problem),
            baton::Error::Store(baton::StoreError::Conflict(m)) => {
                ApiError::new(StatusCode::CONFLICT, m)
            }
            baton::Error::Store(e) => {
                tracing::warn!(error = %e, "admin API: store error");
                ApiError::new(StatusCode::SERVICE_UNAVAILABLE, format!("store: {e}"))
            }
            e @ baton::Error::Busy { .. } => ApiError::new(StatusCode::CONFLICT, e.to_string()),
            e => ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()),
        }
    }
}

impl From<baton::StoreError> for ApiError {
    fn from(e: baton::StoreError) -> ApiError {
        baton::Error::from(e).into()
    }
}

impl From<serde_json::Error> for ApiError {
    fn from(e: serde_json::Error) -> ApiError {
        ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string())
    }
}

type Answer = Result<Json<Value>, ApiError>;

/// A GET's query parameters, each one of `allowed`: a query that does not
/// parse, or a parameter not allowed, is a 400 naming it with the form.
fn params(
    q: Result<Query<HashMap<String, String>>, QueryRejection>,
    allowed: &[&str],
) -> Result<HashMap<String, String>, ApiError> {
    let form: Vec<String> = allowed.iter().map(|a| format!("{a}=")).collect();
    let Query(q) = q.map_err(|e| {
        ApiError::bad(
            "query",
            format!("{}; use ?{}", e.body_text(), form.join("&")),
        )
    })?;
    if let Some(k) = q.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(ApiError::bad(
            k,
            format!("unknown parameter; use {}", allowed.join(", ")),
        ));
    }
    Ok(q)
}

/// 404 for every path no route serves.
pub async fn not_found() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "no such endpoint; see /api/v1/openapi.json",
        None,
    )
}

mod audit;
mod definitions;
mod extract;
mod jobs;
mod keys;
mod locks;
mod probes;
mod queues;
mod stats;
mod tasks;

pub use audit::*;
pub use definitions::*;
pub use extract::*;
pub use jobs::*;
pub use keys::*;
pub use locks::*;
pub use probes::*;
pub use queues::*;
pub use stats::*;
pub use tasks::*;
