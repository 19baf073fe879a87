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

/// A list's `before` cursor (a positive id) and `limit` (1 to
/// [`MAX_PAGE`], default 50), checked.
pub(super) fn page_params(q: &HashMap<String, String>) -> Result<(Option<i64>, u32), ApiError> {
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
    Ok((before, limit))
}

/// The search terms a list or a bulk delete may carry (`kind`, `key`,
/// `text`, `since`, `until`), laid onto `f`; `get` reads one by name
/// (empty counts as absent). Times are RFC 3339 or a duration ago.
fn apply_search(f: &mut TaskFilter, get: impl Fn(&str) -> Option<String>) -> Result<(), ApiError> {
    let time = |k: &str| -> Result<Option<chrono::DateTime<chrono::Utc>>, ApiError> {
        get(k)
            .map(|v| crate::values::since_arg(&v).map_err(|e| ApiError::bad(k, e)))
            .transpose()
    };
    f.kind = get("kind");
    f.key = get("key");
    f.text = get("text");
    f.created_from = time("since")?;
    f.created_to = time("until")?;
    f.validate().map_err(|e| {
        // The library names its fields; the API calls the range since/until.
        let field = match e.field.as_str() {
            "created_from" => "since",
            "created_to" => "until",
            other => other,
        };
        ApiError::bad(field, e.problem)
    })
}

/// `GET /api/v1/tasks?state=&queue=&job=&kind=&key=&text=&since=&until=&before=&limit=`: newest first;
/// `next_before` is the cursor for the next page (null on the last).
pub async fn tasks(
    Extract(state): S,
    q: Result<Query<HashMap<String, String>>, QueryRejection>,
) -> Answer {
    let Query(q) = q.map_err(|e| {
        ApiError::bad(
            "query",
            format!(
                "{}; use ?state=&queue=&job=&kind=&key=&text=&since=&until=&before=&limit= with percent-encoded UTF-8 values",
                e.body_text()
            ),
        )
    })?;
    for k in q.keys() {
        if !matches!(
            k.as_str(),
            "state"
                | "queue"
                | "job"
                | "kind"
                | "key"
                | "text"
                | "since"
                | "until"
                | "before"
                | "limit"
        ) {
            return Err(ApiError::bad(
                k,
                "unknown parameter; use state, queue, job, kind, key, text, since, until, before or limit",
            ));
        }
    }
    let st = match q.get("state").filter(|v| !v.is_empty()) {
        Some(s) => Some(state_of(s)?),
        None => None,
    };
    let (before, limit) = page_params(&q)?;
    let mut filter = TaskFilter {
        queue: name_param(&q, "queue")?,
        state: st,
        job: name_param(&q, "job")?,
        before_id: before,
        limit,
        ..TaskFilter::default()
    };
    apply_search(&mut filter, |k| q.get(k).filter(|v| !v.is_empty()).cloned())?;
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

/// The body of a bulk action: which tasks, by the list's filters and
/// search terms, and for a delete whether to delete them.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct BulkBody {
    queue: Option<String>,
    job: Option<String>,
    state: Option<String>,
    kind: Option<String>,
    key: Option<String>,
    text: Option<String>,
    since: Option<String>,
    until: Option<String>,
    #[serde(default)]
    confirm: bool,
}

impl Form for BulkBody {
    const FORM: &'static str = r#"no body, {} (every task the action applies to) or {"queue"?: NAME, "job"?: NAME, "state"?: STATE, "kind"?: KIND, "key"?: KEY, "text"?: TEXT, "since"?: TIME, "until"?: TIME, "confirm"?: true} (times RFC 3339 or a duration ago like "7d"; state and confirm only for a delete, which without confirm is a dry run that counts)"#;
}

impl BulkBody {
    /// The filter the body names: names checked, state parsed, search
    /// terms applied and checked.
    fn filter(&self) -> Result<TaskFilter, ApiError> {
        if let Some(q) = &self.queue {
            check_name("queue", q)?;
        }
        if let Some(j) = &self.job {
            check_name("job", j)?;
        }
        let mut f = TaskFilter {
            queue: self.queue.clone(),
            job: self.job.clone(),
            state: self.state.as_deref().map(state_of).transpose()?,
            ..TaskFilter::default()
        };
        let terms = [
            ("kind", &self.kind),
            ("key", &self.key),
            ("text", &self.text),
            ("since", &self.since),
            ("until", &self.until),
        ];
        apply_search(&mut f, |k| {
            terms
                .iter()
                .find(|(n, _)| *n == k)
                .and_then(|(_, v)| v.as_ref())
                .filter(|v| !v.is_empty())
                .cloned()
        })?;
        Ok(f)
    }
}

/// The ids of the tasks `filter` matches that `keep` keeps, newest first,
/// at most [`MAX_BULK`].
async fn matching(
    q: &Queue,
    filter: TaskFilter,
    keep: impl Fn(&baton::store::TaskInfo) -> bool,
) -> Result<Vec<i64>, ApiError> {
    let mut page_filter = TaskFilter {
        limit: MAX_PAGE,
        ..filter
    };
    let mut ids = Vec::new();
    while ids.len() < MAX_BULK {
        let page = q.tasks(&page_filter).await?;
        let Some(last) = page.last() else { break };
        page_filter.before_id = Some(last.id);
        let full = page.len() == MAX_PAGE as usize;
        ids.extend(
            page.iter()
                .filter(|t| keep(t))
                .map(|t| t.id)
                .take(MAX_BULK - ids.len()),
        );
        if !full {
            break;
        }
    }
    Ok(ids)
}

/// `POST /api/v1/tasks/retry-failed` with the list's filters and search
/// terms (`{"queue"?, "job"?, "kind"?, …}`): every failed task matching
/// (at most 10000) back to pending.
pub async fn retry_failed(Extract(state): S, Body(b): Body<BulkBody>) -> Answer {
    if b.state.as_deref().is_some_and(|s| s != "failed") || b.confirm {
        let field = if b.confirm { "confirm" } else { "state" };
        return Err(ApiError::bad(
            field,
            "a retry takes failed tasks and needs no confirmation; leave it out",
        ));
    }
    let mut filter = b.filter()?;
    filter.state = Some(TaskState::Failed);
    let q = Queue::new(state.store.clone());
    let candidates = matching(&q, filter, |t| crate::runtime::not_retryable(t).is_none()).await?;
    let mut ids = Vec::new();
    for id in candidates {
        if q.retry(id).await? {
            ids.push(id);
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

/// `POST /api/v1/tasks/delete` with the list's filters and search terms
/// and `"confirm"?`: the finished tasks matching (at most 10000) counted,
/// or with `"confirm": true` deleted.
pub async fn delete_finished(Extract(state): S, Body(b): Body<BulkBody>) -> Answer {
    let filter = b.filter()?;
    if filter.state.is_some_and(|s| !s.is_terminal()) {
        return Err(ApiError::bad(
            "state",
            "only finished tasks are deleted in bulk: use succeeded, failed or cancelled (or no state: all three)",
        ));
    }
    let q = Queue::new(state.store.clone());
    let matched = matching(&q, filter, |t| t.state.is_terminal()).await?;
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
