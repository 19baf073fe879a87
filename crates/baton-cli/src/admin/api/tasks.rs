//! `/api/v1/tasks`: list, show, enqueue, retry, cancel and delete tasks,
//! and retry failed ones or delete finished ones in bulk.

use super::*;

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
    unique_hold: Option<String>,
    unique_scope: Option<String>,
    #[serde(default)]
    unique_by_args: bool,
    unique_period: Option<String>,
    concurrency_key: Option<String>,
    debounce: Option<String>,
    throttle: Option<String>,
}

impl Form for EnqueueBody {
    const FORM: &'static str = r#"a JSON object {"command": ["echo", "hi"]} with optional "queue" (a name), "priority" (-100 to 100), "delay" (e.g. "30s") or "run_at" (RFC 3339), "max_attempts" (1 to 10000), "timeout" (e.g. "5m"), "key" (a unique key), "unique_scope" ("kind-in-queue", "queue", "kind" or "global"), "unique_hold" ("unfinished", "until-failed" or "forever"), "unique_by_args" and "key_forever" (true or false; key_forever is unique_hold "forever"), "unique_period" (e.g. "1h"), "concurrency_key" (e.g. "customer:42"), "debounce" (e.g. "5s", with a key; not with delay or run_at) or "throttle" (e.g. "1h", with a key)"#;
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
    let scope = match &b.unique_scope {
        Some(s) => s
            .parse()
            .map_err(|e: baton::InvalidInput| ApiError::bad("unique_scope", e.problem))?,
        None => baton::queue::UniqueScope::default(),
    };
    let hold = match (&b.unique_hold, b.key_forever) {
        (Some(_), true) => {
            return Err(ApiError::bad(
                "unique_hold",
                "give unique_hold or key_forever, not both",
            ));
        }
        (Some(h), false) => h
            .parse()
            .map_err(|e: baton::InvalidInput| ApiError::bad("unique_hold", e.problem))?,
        (None, on) => baton::queue::UniqueHold::forever(on),
    };
    let period = match &b.unique_period {
        Some(p) => Some(duration("unique_period", p)?),
        None => None,
    };
    t = crate::queue_cmd::unique_args(
        t,
        b.key.as_deref(),
        &baton::queue::UniqueOpts {
            scope,
            by_args: b.unique_by_args,
            period,
            hold,
        },
    );
    if let Some(k) = &b.concurrency_key {
        t = t.concurrency_key(k);
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
    match (&b.debounce, &b.throttle) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad(
                "debounce",
                "give debounce or throttle, not both",
            ));
        }
        (Some(d), None) => t = t.debounce(duration("debounce", d)?),
        (None, Some(p)) => t = t.throttle(duration("throttle", p)?),
        (None, None) => {}
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
    let code = match e.outcome {
        _ if e.inserted => StatusCode::CREATED,
        // Throttled: nothing written; the body says until when.
        baton::store::EnqueueOutcome::Throttled { .. } => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::OK,
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

/// `DELETE /api/v1/tasks/{id}`: a task that is not running, deleted (a
/// pending one cancelled first; a slot's run leaves its tombstone); 409
/// while it runs.
pub async fn task_delete(Extract(state): S, TaskId(id): TaskId) -> Answer {
    match Queue::new(state.store.clone()).delete(id).await? {
        DeleteOutcome::Deleted => Ok(Json(json!({"id": id, "deleted": true}))),
        DeleteOutcome::Running => Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("task {id} is running; cancel it, then delete it once it has stopped"),
        )),
        DeleteOutcome::NotFound => Err(ApiError::not_found(format!("no task {id}"))),
    }
}

/// The body of a bulk delete: which finished tasks, and whether to delete
/// them (without `confirm`, only count them).
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct BulkDeleteBody {
    queue: Option<String>,
    job: Option<String>,
    state: Option<String>,
    #[serde(default)]
    confirm: bool,
}

impl Form for BulkDeleteBody {
    const FORM: &'static str = r#"{"queue"?: NAME, "job"?: NAME, "state"?: "succeeded" | "failed" | "cancelled", "confirm"?: true} (without confirm: a dry run that counts)"#;
}

/// `POST /api/v1/tasks/delete` with `{"queue"?, "job"?, "state"?,
/// "confirm"?}`: the finished tasks matching (at most 10000) counted, or
/// with `"confirm": true` deleted.
pub async fn delete_finished(Extract(state): S, Body(b): Body<BulkDeleteBody>) -> Answer {
    if let Some(q) = &b.queue {
        check_name("queue", q)?;
    }
    if let Some(j) = &b.job {
        check_name("job", j)?;
    }
    let st = b.state.as_deref().map(state_of).transpose()?;
    if st.is_some_and(|s| !s.is_terminal()) {
        return Err(ApiError::bad(
            "state",
            "only finished tasks are deleted in bulk: use succeeded, failed or cancelled (or no state: all three)",
        ));
    }
    let filter = TaskFilter {
        queue: b.queue,
        state: st,
        job: b.job,
        ..TaskFilter::default()
    };
    let q = Queue::new(state.store.clone());
    let mut matched: Vec<i64> = Vec::new();
    let mut page_filter = TaskFilter {
        limit: MAX_PAGE,
        ..filter
    };
    while matched.len() < MAX_BULK {
        let page = q.tasks(&page_filter).await?;
        let Some(last) = page.last() else { break };
        page_filter.before_id = Some(last.id);
        let full = page.len() == MAX_PAGE as usize;
        matched.extend(
            page.iter()
                .filter(|t| t.state.is_terminal())
                .map(|t| t.id)
                .take(MAX_BULK - matched.len()),
        );
        if !full {
            break;
        }
    }
    if !b.confirm {
        return Ok(Json(
            json!({"dry_run": true, "matched": matched.len(), "deleted": 0}),
        ));
    }
    let deleted = q.delete_finished_ids(&matched).await?.len();
    Ok(Json(
        json!({"dry_run": false, "matched": matched.len(), "deleted": deleted}),
    ))
}
