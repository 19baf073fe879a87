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
use baton::store::{CancelOutcome, FencingToken, SchemaStatus, TaskFilter, TaskState};
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

/// 404 for every path no route serves.
pub async fn not_found() -> Response {
    error(
        StatusCode::NOT_FOUND,
        "no such endpoint; see /api/v1/openapi.json",
        None,
    )
}

// ---- probes and the first endpoints ------------------------------------------

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

/// `GET /metrics`: Prometheus metrics (OpenMetrics text).
pub async fn metrics(Extract(state): S) -> Response {
    match crate::metrics::render(&state.store, &state.workers).await {
        Ok(body) => ([(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)], body).into_response(),
        Err(e) => error(
            StatusCode::SERVICE_UNAVAILABLE,
            &baton::error::chain(&e),
            None,
        ),
    }
}

// ---- jobs ---------------------------------------------------------------------

fn check_name(field: &str, name: &str) -> Result<(), ApiError> {
    baton::names::validate_name(field, name).map_err(|e| ApiError::bad(&e.field, e.problem))
}

/// `GET /api/v1/jobs`.
pub async fn jobs(Extract(state): S) -> Answer {
    let now = state.store.now().await?;
    let statuses =
        shapes::with_config_jobs(schedule::job_statuses(&state.store).await?, &state.jobs);
    let rows: Vec<Value> = statuses
        .iter()
        .map(|s| {
            let cfg = state.jobs.iter().find(|j| j.name == s.state.name);
            shapes::job(s, cfg, now)
        })
        .collect();
    Ok(Json(Value::Array(rows)))
}

async fn set_paused(state: &State, name: &str, paused: bool) -> Answer {
    check_name("job", name)?;
    if schedule::set_paused(&state.store, name, paused).await? {
        Ok(Json(json!({"name": name, "paused": paused})))
    } else {
        Err(ApiError::not_found(format!(
            "no job {name:?} in this store (it appears once a scheduler has run it)"
        )))
    }
}

/// `POST /api/v1/jobs/{name}/pause`.
pub async fn job_pause(Extract(state): S, PathText(name): PathText) -> Answer {
    set_paused(&state, &name, true).await
}

/// `POST /api/v1/jobs/{name}/resume`.
pub async fn job_resume(Extract(state): S, PathText(name): PathText) -> Answer {
    set_paused(&state, &name, false).await
}

/// Pause or resume a queue cluster-wide: `{"queue": name, "paused": bool}`.
async fn set_queue_paused(state: &State, name: &str, paused: bool) -> Answer {
    check_name("queue", name)?;
    let q = Queue::new(state.store.clone());
    if paused {
        q.pause(name).await?;
    } else {
        q.resume(name).await?;
    }
    tracing::info!(queue = %name, paused, "admin API: queue paused flag set");
    Ok(Json(json!({"queue": name, "paused": paused})))
}

/// `POST /api/v1/queues/{name}/pause`.
pub async fn queue_pause(Extract(state): S, PathText(name): PathText) -> Answer {
    set_queue_paused(&state, &name, true).await
}

/// `POST /api/v1/queues/{name}/resume`.
pub async fn queue_resume(Extract(state): S, PathText(name): PathText) -> Answer {
    set_queue_paused(&state, &name, false).await
}

/// A request body the API accepts: its JSON shape, for error messages.
pub trait Form: serde::de::DeserializeOwned + Default {
    /// The accepted body, as one line (e.g. `{"token": N}`).
    const FORM: &'static str;
}

/// A JSON body of type `T`; an empty body is `T::default()`. Refused with
/// one line naming the field and the accepted form: 413 over
/// [`super::MAX_BODY_BYTES`], 400 for JSON that is malformed, of the wrong
/// type, or has a field `T` does not know.
pub struct Body<T>(T);

impl<S: Send + Sync, T: Form> FromRequest<S> for Body<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            let status = e.status();
            if status == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError {
                    status,
                    message: format!(
                        "the body is larger than {} bytes (1 MiB); send at most that: {}",
                        super::MAX_BODY_BYTES,
                        T::FORM
                    ),
                    field: Some("body".into()),
                }
            } else {
                ApiError {
                    status,
                    message: format!(
                        "the body could not be read ({}); send {}",
                        e.body_text(),
                        T::FORM
                    ),
                    field: Some("body".into()),
                }
            }
        })?;
        parse_body(&bytes).map(Body)
    }
}

/// Parse a JSON body into `T` (see [`Body`]).
fn parse_body<T: Form>(bytes: &Bytes) -> Result<T, ApiError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    // serde would also take a struct from an array (`["true"]` as its
    // first field): every body is an object.
    if bytes.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return Err(ApiError::bad(
            "body",
            format!("the body is not a JSON object; send {}", T::FORM),
        ));
    }
    let de = &mut serde_json::Deserializer::from_slice(bytes);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let e = e.into_inner();
        // The problem without serde's " at line L column C" (the field
        // says where).
        let msg = e.to_string();
        let msg = msg
            .rsplit_once(" at line ")
            .map_or(msg.as_str(), |(m, _)| m);
        let named = msg
            .split('`')
            .nth(1)
            .filter(|_| msg.starts_with("unknown field") || msg.starts_with("missing field"));
        let field = match named {
            Some(f) => f.to_string(),
            None if e.is_syntax() || e.is_eof() || path == "." => "body".to_string(),
            None => path,
        };
        let what = if e.is_syntax() || e.is_eof() {
            "is not JSON"
        } else {
            "is not accepted"
        };
        ApiError::bad(
            &field,
            format!("the body {what} ({}); send {}", clip(msg), T::FORM),
        )
    })
}

/// At most 100 characters of `s`, for echoing input back.
fn clip(s: &str) -> String {
    match s.char_indices().nth(100) {
        Some((i, _)) => format!("{}…", &s[..i]),
        None => s.to_string(),
    }
}

/// The one path parameter (a job, queue or lock name, or a task id) as
/// text; 400 when it is not UTF-8.
pub struct PathText(String);

impl<S: Send + Sync> FromRequestParts<S> for PathText {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        Path::<String>::from_request_parts(parts, state)
            .await
            .map(|Path(s)| PathText(s))
            .map_err(|e| {
                ApiError::bad(
                    "path",
                    format!(
                        "{}; use a name of printable UTF-8 text, percent-encoded",
                        e.body_text()
                    ),
                )
            })
    }
}

/// A task id from the path (`/api/v1/tasks/{id}`); 400 naming `id` when
/// it is not a positive whole number.
pub struct TaskId(i64);

impl<S: Send + Sync> FromRequestParts<S> for TaskId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        let PathText(raw) = PathText::from_request_parts(parts, state).await?;
        raw.parse::<i64>()
            .ok()
            .filter(|&id| id > 0)
            .map(TaskId)
            .ok_or_else(|| {
                ApiError::bad(
                    "id",
                    format!(
                        "{:?} is not a task id; use a positive whole number, as GET /api/v1/tasks shows",
                        clip(&raw)
                    ),
                )
            })
    }
}

/// The body of a trigger.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct TriggerBody {
    /// The slot (RFC 3339); default: the latest due slot.
    slot: Option<String>,
    /// Run the slot even if the scheduler skipped it (once).
    #[serde(default)]
    run_skipped: bool,
}

impl Form for TriggerBody {
    const FORM: &'static str = r#"no body, {} (the latest due slot) or {"slot": "2026-01-31T06:00:00Z"} (a slot of the job's schedule, RFC 3339), optionally with "run_skipped": true"#;
}

fn rfc3339(field: &str, s: &str) -> Result<DateTime<Utc>, ApiError> {
    crate::values::rfc3339_arg(s).map_err(|e| ApiError::bad(field, e))
}

/// `POST /api/v1/jobs/{name}/trigger` with `{"slot"?: RFC 3339}`.
pub async fn job_trigger(
    Extract(state): S,
    PathText(name): PathText,
    Body(b): Body<TriggerBody>,
) -> Answer {
    check_name("job", &name)?;
    let Some(cfg) = state.jobs.iter().find(|j| j.name == name) else {
        return Err(ApiError::not_found(format!(
            "no job {name:?} in this server's config (only configured jobs can be triggered here)"
        )));
    };
    let job = cfg.job();
    let slot = match &b.slot {
        // The library's hint names the CLI's --any-slot, which this API
        // does not have.
        Some(s) => schedule::trigger_slot(&job, rfc3339("slot", s)?, false).map_err(|e| {
            ApiError::bad("slot", e.problem.replace(", or --any-slot", " (RFC 3339)"))
        })?,
        None => {
            let now = state.store.now().await?;
            schedule::latest_slot(&job.schedule, now).ok_or_else(|| {
                ApiError::bad("slot", "the job has no slot in the past year; give a slot")
            })?
        }
    };
    let report = if b.run_skipped {
        schedule::run_skipped(&state.store, &job, slot, false).await?
    } else {
        let e = schedule::trigger_with(&state.store, &job, slot, false).await?;
        schedule::slot_report(&state.store, &job, slot, e).await?
    };
    Ok(Json(shapes::triggered(&report, &name, slot)))
}

// ---- tasks --------------------------------------------------------------------

fn state_of(s: &str) -> Result<TaskState, ApiError> {
    s.parse().map_err(|_| {
        ApiError::bad(
            "state",
            format!("{s:?}: use pending, running, succeeded, failed or cancelled"),
        )
    })
}

fn name_param(q: &HashMap<String, String>, key: &str) -> Result<Option<String>, ApiError> {
    match q.get(key).filter(|v| !v.is_empty()) {
        Some(v) => {
            check_name(key, v)?;
            Ok(Some(v.clone()))
        }
        None => Ok(None),
    }
}

/// `GET /api/v1/tasks?state=&queue=&job=&before=&limit=`: newest first;
/// `next_before` is the cursor for the next page (null on the last).
pub async fn tasks(
    Extract(state): S,
    q: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Answer {
    let Query(q) = q.map_err(|e| {
        ApiError::bad(
            "query",
            format!(
                "{}; use ?state=&queue=&job=&before=&limit= with percent-encoded UTF-8 values",
                e.body_text()
            ),
        )
    })?;
    for k in q.keys() {
        if !matches!(k.as_str(), "state" | "queue" | "job" | "before" | "limit") {
            return Err(ApiError::bad(
                k,
                "unknown parameter; use state, queue, job, before or limit",
            ));
        }
    }
    let st = match q.get("state").filter(|v| !v.is_empty()) {
        Some(s) => Some(state_of(s)?),
        None => None,
    };
    let before = match q.get("before").filter(|v| !v.is_empty()) {
        Some(b) => Some(b.parse::<i64>().ok().filter(|&id| id > 0).ok_or_else(|| {
            ApiError::bad(
                "before",
                format!(
                    "{:?} is not a cursor; use the next_before of the previous page (a positive task id)",
                    clip(b)
                ),
            )
        })?),
        None => None,
    };
    let limit = match q.get("limit").filter(|v| !v.is_empty()) {
        Some(l) => l
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_PAGE).contains(n))
            .ok_or_else(|| {
                ApiError::bad(
                    "limit",
                    format!("{:?}: use a whole number from 1 to {MAX_PAGE}", clip(l)),
                )
            })?,
        None => 50,
    };
    let filter = TaskFilter {
        queue: name_param(&q, "queue")?,
        state: st,
        job: name_param(&q, "job")?,
        before_id: before,
        limit,
    };
    let list = Queue::new(state.store.clone()).tasks(&filter).await?;
    let next = (list.len() == limit as usize)
        .then(|| list.last().map(|t| t.id))
        .flatten();
    Ok(Json(
        json!({"tasks": shapes::task(&list)?, "next_before": next}),
    ))
}

/// `GET /api/v1/tasks/{id}`: the task with every attempt's error.
pub async fn task(Extract(state): S, TaskId(id): TaskId) -> Answer {
    match Queue::new(state.store.clone()).task(id).await? {
        Some(t) => Ok(Json(shapes::task(&t)?)),
        None => Err(ApiError::not_found(format!("no task {id}"))),
    }
}

/// The body of an enqueue: a command task, as `baton enqueue`.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct EnqueueBody {
    command: Vec<String>,
    queue: Option<String>,
    priority: Option<i32>,
    delay: Option<String>,
    run_at: Option<String>,
    max_attempts: Option<u32>,
    timeout: Option<String>,
    key: Option<String>,
    #[serde(default)]
    key_forever: bool,
}

impl Form for EnqueueBody {
    const FORM: &'static str = r#"a JSON object {"command": ["echo", "hi"]} with optional "queue" (a name), "priority" (-100 to 100), "delay" (e.g. "30s") or "run_at" (RFC 3339), "max_attempts" (1 to 10000), "timeout" (e.g. "5m"), "key" and "key_forever" (true or false)"#;
}

fn duration(field: &str, s: &str) -> Result<Duration, ApiError> {
    crate::values::duration_arg(s).map_err(|e| ApiError::bad(field, e))
}

/// `POST /api/v1/tasks`: enqueue a command task. A `traceparent` request
/// header (W3C Trace Context) is kept on the task, and the attempt's span
/// is linked to it.
pub async fn enqueue(
    Extract(state): S,
    headers: HeaderMap,
    Body(b): Body<EnqueueBody>,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    if let Err(problem) = command_task::check_argv(&b.command) {
        return Err(ApiError::bad("command", problem));
    }
    let mut t = TaskBuilder::new(command_task::KIND, command_task::payload(&b.command))
        .queue(b.queue.as_deref().unwrap_or(baton::queue::DEFAULT_QUEUE))
        .priority(b.priority.unwrap_or(0))
        .max_attempts(b.max_attempts.unwrap_or(baton::queue::DEFAULT_MAX_ATTEMPTS));
    if let Some(k) = &b.key {
        t = t.unique_key(k).unique_forever(b.key_forever);
    }
    match (&b.delay, &b.run_at) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad("delay", "give delay or run_at, not both"));
        }
        (Some(d), None) => t = t.delay(duration("delay", d)?),
        (None, Some(at)) => t = t.run_at(rfc3339("run_at", at)?),
        (None, None) => {}
    }
    if let Some(d) = &b.timeout {
        t = t.timeout(duration("timeout", d)?);
    }
    if let Some(tp) = headers.get("traceparent") {
        let tp = tp.to_str().map_err(|_| {
            ApiError::bad(
                "traceparent",
                "the header is not ASCII; use 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>",
            )
        })?;
        t = t.traceparent(tp);
    }
    let e = Queue::new(state.store.clone()).enqueue(t).await?;
    let code = if e.inserted {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((code, Json(shapes::enqueued(&e))))
}

/// `POST /api/v1/tasks/{id}/retry`: a failed or cancelled task back to
/// pending (409 for any other state).
pub async fn task_retry(Extract(state): S, TaskId(id): TaskId) -> Answer {
    let q = Queue::new(state.store.clone());
    if let Some(why) = q
        .task(id)
        .await?
        .as_ref()
        .and_then(crate::runtime::not_retryable)
    {
        return Err(ApiError::new(StatusCode::CONFLICT, why));
    }
    if q.retry(id).await? {
        return Ok(Json(json!({"id": id, "state": "pending"})));
    }
    match q.task(id).await? {
        None => Err(ApiError::not_found(format!("no task {id}"))),
        Some(t) => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!(
                "task {id} is {}; only a failed or cancelled task can be retried",
                t.state
            ),
        )),
    }
}

/// `POST /api/v1/tasks/{id}/cancel`: cancelled at once when pending; a
/// running task stops at its next heartbeat (202).
pub async fn task_cancel(
    Extract(state): S,
    TaskId(id): TaskId,
) -> Result<(StatusCode, Json<Value>), ApiError> {
    match Queue::new(state.store.clone()).cancel(id).await? {
        CancelOutcome::Cancelled => Ok((
            StatusCode::OK,
            Json(json!({"id": id, "outcome": "cancelled"})),
        )),
        CancelOutcome::Requested => Ok((
            StatusCode::ACCEPTED,
            Json(json!({"id": id, "outcome": "requested"})),
        )),
        CancelOutcome::AlreadyFinished(s) => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("task {id} already finished ({s})"),
        )),
        CancelOutcome::NotFound => Err(ApiError::not_found(format!("no task {id}"))),
    }
}

/// The body of a bulk retry: which failed tasks.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct BulkRetryBody {
    queue: Option<String>,
    job: Option<String>,
}

impl Form for BulkRetryBody {
    const FORM: &'static str =
        r#"no body, {} (every failed task) or {"queue": NAME, "job": NAME} (either or both)"#;
}

/// `POST /api/v1/tasks/retry-failed` with `{"queue"?, "job"?}`: every
/// failed task matching (at most 10000) back to pending.
pub async fn retry_failed(Extract(state): S, Body(b): Body<BulkRetryBody>) -> Answer {
    if let Some(q) = &b.queue {
        check_name("queue", q)?;
    }
    if let Some(j) = &b.job {
        check_name("job", j)?;
    }
    let q = Queue::new(state.store.clone());
    let mut before = None;
    let mut ids = Vec::new();
    while ids.len() < MAX_BULK {
        let page = q
            .tasks(&TaskFilter {
                queue: b.queue.clone(),
                state: Some(TaskState::Failed),
                job: b.job.clone(),
                before_id: before,
                limit: MAX_PAGE,
            })
            .await?;
        let Some(last) = page.last() else { break };
        before = Some(last.id);
        let full = page.len() == MAX_PAGE as usize;
        for t in page {
            if ids.len() < MAX_BULK
                && crate::runtime::not_retryable(&t).is_none()
                && q.retry(t.id).await?
            {
                ids.push(t.id);
            }
        }
        if !full {
            break;
        }
    }
    Ok(Json(json!({"retried": ids.len(), "ids": ids})))
}

// ---- queues -------------------------------------------------------------------

/// One sample of every queue: pending, running and finished (succeeded +
/// failed + cancelled) counts.
#[derive(Clone)]
struct Sample {
    at: DateTime<Utc>,
    queues: BTreeMap<String, [u64; 3]>,
}

/// The last hour of samples, for throughput and the dashboard's chart.
#[derive(Default)]
pub struct History {
    samples: VecDeque<Sample>,
}

impl History {
    fn push(&mut self, s: Sample) {
        if self.samples.len() == SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back(s);
    }

    /// Tasks finished per queue over the samples kept (pruning can lower a
    /// count; such a step counts as zero).
    fn finished(&self, queue: &str) -> u64 {
        let counts: Vec<u64> = self
            .samples
            .iter()
            .filter_map(|s| s.queues.get(queue).map(|c| c[2]))
            .collect();
        counts.windows(2).map(|w| w[1].saturating_sub(w[0])).sum()
    }
}

async fn sample(state: &State) -> Result<(), baton::Error> {
    let stats = Queue::new(state.store.clone()).stats().await?;
    let at = state.store.now().await?;
    let queues = stats
        .into_iter()
        .map(|s| {
            (
                s.queue,
                [s.pending, s.running, s.succeeded + s.failed + s.cancelled],
            )
        })
        .collect();
    if let Ok(mut h) = state.history.lock() {
        h.push(Sample { at, queues });
    }
    Ok(())
}

/// Sample the queues every [`SAMPLE_EVERY`] for as long as the process runs.
pub async fn sample_loop(state: Arc<State>) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = sample(&state).await {
            tracing::debug!(error = %e, "admin: sampling the queues failed");
        }
    }
}

/// `GET /api/v1/queues`: per queue, the counts by state, the oldest due
/// pending task's age, the paused flag and the tasks finished over the last hour (as
/// sampled by this server since it started).
pub async fn queues(Extract(state): S) -> Answer {
    let stats = Queue::new(state.store.clone()).stats().await?;
    let h = state
        .history
        .lock()
        .map_err(|_| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "history poisoned"))?;
    let since = h.samples.front().map(|s| output::ts(s.at));
    let rows: Vec<Value> = stats
        .iter()
        .map(|s| {
            let mut v = serde_json::to_value(s).unwrap_or_default();
            v["finished_last_hour"] = json!(h.finished(&s.queue));
            v["sampled_since"] = json!(since);
            v
        })
        .collect();
    Ok(Json(Value::Array(rows)))
}

/// `GET /api/v1/queues/history`: the samples behind the dashboard's chart.
pub async fn queue_history(Extract(state): S) -> Answer {
    let h = state
        .history
        .lock()
        .map_err(|_| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "history poisoned"))?;
    let samples: Vec<Value> = h
        .samples
        .iter()
        .map(|s| {
            let queues: serde_json::Map<String, Value> = s
                .queues
                .iter()
                .map(|(q, c)| {
                    (
                        q.clone(),
                        json!({"pending": c[0], "running": c[1], "finished": c[2]}),
                    )
                })
                .collect();
            json!({"at": output::ts(s.at), "queues": queues})
        })
        .collect();
    Ok(Json(
        json!({"interval_secs": SAMPLE_EVERY.as_secs(), "samples": samples}),
    ))
}

// ---- locks --------------------------------------------------------------------

/// `GET /api/v1/locks`.
pub async fn locks(Extract(state): S) -> Answer {
    let list = Locker::new(state.store.clone()).list().await?;
    Ok(Json(Value::Array(list.iter().map(shapes::lock).collect())))
}

/// The body of a force-release: the token the caller saw.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ReleaseBody {
    token: Option<u64>,
}

impl Form for ReleaseBody {
    const FORM: &'static str =
        r#"{"token": N} with N the current holder's fencing token, as GET /api/v1/locks shows it"#;
}

/// `POST /api/v1/locks/{name}/release` with `{"token": N}`: revoke the
/// lease, only if N is still the current grant's token (409 otherwise, so a
/// newer holder is never released by mistake). The holder's extensions are
/// refused from then on and the lock is free at `min(lock_until, now +
/// RELEASE_BOUND)` (30 s), the answer's `free_at`: not at once, so the
/// holder (which confirms its lease at least every 5 s) stops its work
/// before anyone else can be granted the lock.
pub async fn lock_release(
    Extract(state): S,
    PathText(name): PathText,
    Body(b): Body<ReleaseBody>,
) -> Answer {
    check_name("name", &name)?;
    let Some(token) = b.token else {
        return Err(ApiError::bad(
            "token",
            format!("is missing; send {}", ReleaseBody::FORM),
        ));
    };
    let locker = Locker::new(state.store.clone());
    let Some(info) = locker.get(&name).await? else {
        return Err(ApiError::not_found(format!("no lock {name:?}")));
    };
    if let Some(free_at) = locker.revoke(&name, FencingToken(token)).await? {
        tracing::info!(lock = %name, token, free_at = %free_at, "admin: lock force-released (revoked; its holder stops, then the lock is free)");
        return Ok(Json(json!({
            "name": name,
            "token": token,
            "released": true,
            "free_at": crate::output::ts(free_at),
            "note": format!(
                "the lease is revoked: its holder stops its work within {} and the lock is free at free_at",
                baton::format_duration(baton::lock::RELEASE_BOUND)
            ),
        })));
    }
    let why = if info.token.0 != token {
        format!(
            "token {token} is not the current one: lock {name:?} was granted token {} to {}",
            info.token.0, info.holder
        )
    } else {
        format!("lock {name:?} (token {token}) is no longer held: its lease lapsed")
    };
    Err(ApiError::new(StatusCode::CONFLICT, why))
}
