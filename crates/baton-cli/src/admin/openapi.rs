//! The API's route table: each route is added once, with its method, path
//! and description, to both the router and the OpenAPI 3.1 document served
//! at `/api/v1/openapi.json` — so the document lists exactly the routes
//! served.

use std::sync::Arc;

use axum::routing::{delete, get, post, put, MethodRouter};
use axum::{Json, Router};
use serde_json::{json, Map, Value};

use super::{api, State};

/// One route as the OpenAPI document describes it.
pub struct RouteDoc {
    /// `get` or `post`.
    pub method: &'static str,
    /// The path, with `{param}` placeholders.
    pub path: &'static str,
    /// One line on what it does.
    pub summary: &'static str,
    /// Query parameters (name, description).
    pub query: &'static [(&'static str, &'static str)],
    /// The JSON body's fields (name, type, description), for POSTs.
    pub body: &'static [(&'static str, &'static str, &'static str)],
    /// Whether the route is open without a token.
    pub public: bool,
}

struct Table {
    router: Router<Arc<State>>,
    docs: Vec<RouteDoc>,
}

impl Table {
    fn add(mut self, doc: RouteDoc, handler: MethodRouter<Arc<State>>) -> Table {
        self.router = self.router.route(doc.path, handler);
        self.docs.push(doc);
        self
    }
}

/// The body of every pause and resume.
const PAUSE_BODY: &[(&str, &str, &str)] = &[
    (
        "note",
        "string",
        "why (at most 1000 bytes); kept until the next pause or resume",
    ),
    (
        "by",
        "string",
        "who, as the caller says; recorded as `BY (CALLER via SOURCE)`",
    ),
];

const fn r(method: &'static str, path: &'static str, summary: &'static str) -> RouteDoc {
    RouteDoc {
        method,
        path,
        summary,
        query: &[],
        body: &[],
        public: false,
    }
}

/// The API's router and its route table.
pub fn routes() -> (Router<Arc<State>>, Vec<RouteDoc>) {
    let t = Table {
        router: Router::new(),
        docs: Vec::new(),
    };
    let t = t
        .add(
            RouteDoc {
                public: true,
                ..r("get", "/livez", "The process is up (no auth).")
            },
            get(api::livez),
        )
        .add(
            RouteDoc {
                public: true,
                ..r(
                    "get",
                    "/readyz",
                    "The store answers, holds this build's schema version and is the store this process connected to (its identity unchanged: it did not lose its data or go back to an older backup): 200, else 503 with the reason (no auth).",
                )
            },
            get(api::readyz),
        )
        .add(
            r("get", "/health", "As /readyz, answering {\"status\":\"ok\"}."),
            get(api::health),
        )
        .add(
            r("get", "/jobs", "The store's jobs, as the library reports them."),
            get(api::jobs_raw),
        )
        .add(
            r("get", "/stats", "Task counts per queue and state."),
            get(api::stats_raw),
        )
        .add(
            r("get", "/metrics", "Prometheus metrics (OpenMetrics or text format, as Accept asks)."),
            get(api::metrics),
        )
        .add(
            r(
                "get",
                "/api/v1/jobs",
                "Jobs: schedule, overlap and misfire policies, pause flag with the last pause or resume (pause_change: note, by, at), last slot, next fire and the next 3 fire times in the job's zone, last run and outcome (as `baton jobs --json`).",
            ),
            get(api::jobs),
        )
        .add(
            RouteDoc {
                body: &[
                    ("name", "string", "the job's name"),
                    ("definition", "object", "a [[job]] table's fields (every or cron, tz, command, queue, overlap, misfire, max_attempts, timeout, jitter, priority, start_at, end_at, catch_up_window, grace, max_catch_up), without name; durable mode, command only"),
                    ("by", "string", "who, as the caller says; recorded with the credential"),
                ],
                ..r(
                    "post",
                    "/api/v1/jobs",
                    "Define a job in the store (version 1): every baton serve on the store runs it within seconds, in place of a config job of the same name. 409 when the name is defined already; 400 naming the field of a bad definition.",
                )
            },
            post(api::job_create),
        )
        .add(
            RouteDoc {
                body: &[
                    ("version", "integer", "the version replaced (GET /api/v1/jobs shows it)"),
                    ("definition", "object", "the whole new definition, as for POST /api/v1/jobs"),
                    ("by", "string", "who, as the caller says"),
                ],
                ..r(
                    "put",
                    "/api/v1/jobs/{name}",
                    "Replace a job's definition in the store, from its next slot on (its cursor kept). 409 with the live version when version is not it; 404 when the store defines no such job.",
                )
            },
            put(api::job_update),
        )
        .add(
            RouteDoc {
                query: &[("version", "only if this is the live version (409 otherwise)")],
                ..r(
                    "delete",
                    "/api/v1/jobs/{name}",
                    "Delete a job's definition from the store (admin): it stops everywhere within seconds, a run in progress finishes. 404 when the store defines no such job.",
                )
            },
            delete(api::job_delete),
        )
        .add(
            RouteDoc {
                body: PAUSE_BODY,
                ..r(
                    "post",
                    "/api/v1/jobs/{name}/pause",
                    "Pause a job, cluster-wide, recording the change: the note, who (the body's by, with the credential, api:admin or api:open, and the source, api or dashboard) and the store's time; shown by GET /api/v1/jobs as pause_change.",
                )
            },
            post(api::job_pause),
        )
        .add(
            RouteDoc {
                body: PAUSE_BODY,
                ..r(
                    "post",
                    "/api/v1/jobs/{name}/resume",
                    "Resume a paused job, recording the change as pause does.",
                )
            },
            post(api::job_resume),
        )
        .add(
            RouteDoc {
                body: &[
                    ("slot", "string", "RFC 3339 slot; default: the latest due slot"),
                    ("run_skipped", "boolean", "run the slot even if the scheduler skipped it, once (default false)"),
                ],
                ..r(
                    "post",
                    "/api/v1/jobs/{name}/trigger",
                    "Run a configured job now for a slot (idempotent per job and slot, forever; as `baton trigger --json`): the answer says what became of the slot (outcome pending, running, succeeded, failed, skipped with its reason, cancelled; pruned when only its tombstone is left).",
                )
            },
            post(api::job_trigger),
        )
        .add(
            RouteDoc {
                body: &[
                    ("from", "string", "RFC 3339: the range's first instant (inclusive)"),
                    ("to", "string", "RFC 3339: the range's last instant (inclusive, not after now)"),
                    ("max", "integer", "the most slots the range may hold (default 1000, at most 100000); more is refused whole"),
                    ("dry_run", "boolean", "report what would run, enqueue nothing (default false)"),
                    ("run_skipped", "boolean", "also run slots the scheduler skipped, once each (default false)"),
                ],
                ..r(
                    "post",
                    "/api/v1/jobs/{name}/backfill",
                    "Run each past slot of a configured job in a range once (as `baton jobs backfill --json`): slots with no run are enqueued, those that ran or were skipped are left alone and reported.",
                )
            },
            post(api::job_backfill),
        )
        .add(
            RouteDoc {
                query: &[
                    ("state", "pending, running, succeeded, failed or cancelled"),
                    ("queue", "only this queue"),
                    ("job", "only this job's runs"),
                    ("kind", "only this kind (a command task's is command)"),
                    ("key", "only tasks with this unique key (as given at enqueue) or concurrency key"),
                    ("text", "only tasks whose payload contains this text, literally (1 to 256 bytes)"),
                    ("since", "enqueued at or after this: RFC 3339 or a duration ago, e.g. 7d"),
                    ("until", "enqueued before this: RFC 3339 or a duration ago"),
                    ("before", "cursor: only ids below this (the previous page's next_before)"),
                    ("limit", "page size, 1 to 1000 (default 50)"),
                ],
                ..r(
                    "get",
                    "/api/v1/tasks",
                    "Tasks, newest first, as {tasks, next_before} (tasks as `baton tasks list --json`).",
                )
            },
            get(api::tasks),
        )
        .add(
            RouteDoc {
                body: &[
                    ("command", "array", "argv, e.g. [\"echo\", \"hi\"] (required)"),
                    ("queue", "string", "queue (default \"default\")"),
                    ("priority", "integer", "-100 to 100, lower first"),
                    ("delay", "string", "run no sooner than this from now, e.g. 30s"),
                    ("run_at", "string", "run no sooner than this RFC 3339 instant"),
                    ("max_attempts", "integer", "attempts in total"),
                    ("timeout", "string", "timeout per attempt, e.g. 5m"),
                    ("key", "string", "idempotency (unique) key"),
                    (
                        "unique_scope",
                        "string",
                        "kind-in-queue (default), queue, kind or global (kind and global not on Redis)",
                    ),
                    ("unique_by_args", "boolean", "the command is part of the unique key"),
                    ("unique_period", "string", "the time bucket is part of the unique key, e.g. 1h"),
                    ("key_forever", "boolean", "keep the key after the task finished (unique_hold forever)"),
                    (
                        "unique_hold",
                        "string",
                        "unfinished (default: while pending or running), until-failed (also once succeeded) or forever (until pruned)",
                    ),
                    (
                        "concurrency_key",
                        "string",
                        "concurrency key, e.g. customer:42 (a queue's per_key_max_running caps it)",
                    ),
                    (
                        "debounce",
                        "string",
                        "with a key: run once, this long after the last enqueue, e.g. 5s (a pending task of the key takes the command: 200 outcome debounced)",
                    ),
                    (
                        "throttle",
                        "string",
                        "with a key: at most one start per period, e.g. 1h (within it: 429 outcome throttled, until)",
                    ),
                ],
                ..r(
                    "post",
                    "/api/v1/tasks",
                    "Enqueue a command task: 201 {id, inserted, outcome} (200 when the key was \
                     taken or a pending task debounced, 429 when throttled, with until). \
                     A W3C `traceparent` request header is kept on the task; its attempts' \
                     spans link to it.",
                )
            },
            post(api::enqueue),
        )
        .add(
            RouteDoc {
                body: &[
                    ("queue", "string", "only this queue"),
                    ("job", "string", "only this job's runs"),
                    ("kind", "string", "only this kind"),
                    ("key", "string", "only tasks with this unique or concurrency key"),
                    ("text", "string", "only tasks whose payload contains this text"),
                    ("since", "string", "enqueued at or after this: RFC 3339 or a duration ago"),
                    ("until", "string", "enqueued before this: RFC 3339 or a duration ago"),
                ],
                ..r(
                    "post",
                    "/api/v1/tasks/retry-failed",
                    "Put every failed task matching the filter (at most 10000) back to pending.",
                )
            },
            post(api::retry_failed),
        )
        .add(
            r(
                "get",
                "/api/v1/tasks/{id}",
                "One task with every attempt's error (as `baton tasks show --json`).",
            ),
            get(api::task),
        )
        .add(
            r(
                "post",
                "/api/v1/tasks/{id}/retry",
                "Put a failed or cancelled task back to pending (409 otherwise).",
            ),
            post(api::task_retry),
        )
        .add(
            r(
                "post",
                "/api/v1/tasks/{id}/cancel",
                "Cancel a task (202 when running: it stops at its next heartbeat; 409 when finished).",
            ),
            post(api::task_cancel),
        )
        .add(
            r(
                "delete",
                "/api/v1/tasks/{id}",
                "Delete a task that is not running (a pending one is cancelled first; a schedule slot's run leaves its tombstone, so the slot does not run again); 409 while it runs.",
            ),
            delete(api::task_delete),
        )
        .add(
            RouteDoc {
                body: &[
                    ("queue", "string", "only this queue"),
                    ("job", "string", "only this job's runs"),
                    ("state", "string", "succeeded, failed or cancelled (default: all three)"),
                    ("kind", "string", "only this kind"),
                    ("key", "string", "only tasks with this unique or concurrency key"),
                    ("text", "string", "only tasks whose payload contains this text"),
                    ("since", "string", "enqueued at or after this: RFC 3339 or a duration ago"),
                    ("until", "string", "enqueued before this: RFC 3339 or a duration ago"),
                    ("confirm", "boolean", "delete them; without it, only count them (a dry run)"),
                ],
                ..r(
                    "post",
                    "/api/v1/tasks/delete",
                    "Delete the finished tasks matching the filter (at most 10000): {dry_run, matched, deleted}. Without \"confirm\": true, a dry run that only counts.",
                )
            },
            post(api::delete_finished),
        )
        .add(
            r(
                "get",
                "/api/v1/queues",
                "Per queue: counts by state, oldest due pending age, paused flag with the last pause or resume (pause_change: note, by, at), the limits its workers declared (limits: max_running, per_key_max_running, rate, rate_name, per_key_rate, fair, summary, declared_by, declared_at; or null), tasks finished over the last hour.",
            ),
            get(api::queues),
        )
        .add(
            RouteDoc {
                body: PAUSE_BODY,
                ..r(
                    "post",
                    "/api/v1/queues/{name}/pause",
                    "Pause a queue cluster-wide: no worker claims its tasks; running tasks finish, enqueue is accepted. Records the note, who and when, as a job's pause does.",
                )
            },
            post(api::queue_pause),
        )
        .add(
            RouteDoc {
                body: PAUSE_BODY,
                ..r(
                    "post",
                    "/api/v1/queues/{name}/resume",
                "Resume a paused queue and wake its workers, recording the change as pause does.",
                )
            },
            post(api::queue_resume),
        )
        .add(
            RouteDoc {
                query: &[("limit", "how many keys, 1 to 1000 (default 50)")],
                ..r(
                    "get",
                    "/api/v1/queues/{name}/keys",
                    "The load of the queue's concurrency keys: {queue, keys: [{key, running, pending, recent_starts?, rate?: {started_in_window, max, per_ms, next_start_at}}] busiest first, keys_running, keys_pending, truncated?, per_key_max_running, per_key_rate, keys_rate_held}. Under a rate per key (per_key_rate, e.g. 10/1m) each listed key's rate says its starts in the current window against max and when its next start is allowed (null: now); keys_rate_held counts the listed keys held back; start logs are read for the listed keys only.",
                )
            },
            get(api::queue_keys),
        )
        .add(
            r(
                "get",
                "/api/v1/queues/history",
                "The last hour of queue samples (pending, running, finished), every 30 s.",
            ),
            get(api::queue_history),
        )
        .add(
            RouteDoc {
                query: &[
                    ("range", "1h (by minute, the default), 1d (by 15 minutes) or 1w (by hour)"),
                    ("queue", "only this queue"),
                    ("kind", "only this task kind"),
                    ("job", "only this schedule job's tasks, whichever way it was defined (config, library or `baton jobs create`; a stored job's tasks have kind command)"),
                ],
                ..r(
                    "get",
                    "/api/v1/stats/series",
                    "Throughput, failures and latency over the range from the store's rollup (the same on every instance, across restarts; workers add their counts every 10 s): {range, step_secs, from, to, points: [{at, succeeded, failed, dead, cancelled, finished, started, wait_avg_ms, wait_max_ms, ended, run_avg_ms, run_max_ms}], totals, series: [{queue, kind, job, …}]} (job null for tasks of no job). failed counts failed attempts, dead those that left their task failed; wait is due time to start, run is start to end.",
                )
            },
            get(api::stats_series),
        )
        .add(
            RouteDoc {
                query: &[
                    ("before", "cursor: only ids below this (the previous page's next_before)"),
                    ("limit", "page size, 1 to 1000 (default 50)"),
                ],
                ..r(
                    "get",
                    "/api/v1/audit",
                    "The audit log, newest first, as {records, next_before} (records as `baton audit --json`): who (actor), what (action), on what (target), from where (source) and how it ended (outcome), at.",
                )
            },
            get(api::audit),
        )
        .add(
            r("get", "/api/v1/locks", "Locks: holder, token, expiry (as `baton locks --json`)."),
            get(api::locks),
        )
        .add(
            RouteDoc {
                query: &[
                    ("name", "only this lock"),
                    ("limit", "at most this many, 1 to 1000 (default 50)"),
                ],
                ..r(
                    "get",
                    "/api/v1/locks/history",
                    "Released leases, newest first, as {records: [{name, holder, token, acquired_at, released_at, held_ms}]}: who held which lock with which token, from the grant to the release (store time). Kept a day and at most 100 a lock; a lease that lapsed or was revoked has no release and no record.",
                )
            },
            get(api::lock_history),
        )
        .add(
            RouteDoc {
                body: &[("token", "integer", "the current grant's fencing token (required)")],
                ..r(
                    "post",
                    "/api/v1/locks/{name}/release",
                    "Force-release a lock; only if the token is the current grant's (409 otherwise). The lease is revoked: its holder's extensions are refused, it stops its work (it confirms its lease at least every 5 s), and the lock is free at min(lock_until, now + 30 s), the answer's free_at.",
                )
            },
            post(api::lock_release),
        )
        .add(
            r("get", "/api/v1/openapi.json", "This document."),
            get(openapi_json),
        );
    (t.router, t.docs)
}

async fn openapi_json() -> Json<Value> {
    Json(document(&routes().1))
}

/// The OpenAPI 3.1 document for `docs`.
pub fn document(docs: &[RouteDoc]) -> Value {
    let mut paths = Map::new();
    for d in docs {
        let mut params: Vec<Value> = d
            .path
            .split('/')
            .filter_map(|seg| seg.strip_prefix('{')?.strip_suffix('}'))
            .map(|p| {
                let ty = if p == "id" { "integer" } else { "string" };
                json!({"name": p, "in": "path", "required": true, "schema": {"type": ty}})
            })
            .collect();
        params.extend(d.query.iter().map(|(n, desc)| {
            json!({"name": n, "in": "query", "required": false, "description": desc, "schema": {"type": if *n == "before" || *n == "limit" || *n == "version" {"integer"} else {"string"}}})
        }));
        let mut op = json!({
            "summary": d.summary,
            "operationId": format!("{} {}", d.method, d.path),
            "parameters": params,
            "responses": {
                "200": {"description": "OK", "content": {"application/json": {}}},
                "400": {"description": "Bad input: {error, field}", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
                "401": {"description": "Missing or wrong token", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
                "403": {"description": "Read-only token on a write", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
                "404": {"description": "Not found", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
                "409": {"description": "Conflict (wrong state or token)", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
                "503": {"description": "The store is unavailable", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}},
            },
        });
        if d.public {
            op["security"] = json!([]);
        }
        if !d.body.is_empty() {
            let props: Map<String, Value> = d
                .body
                .iter()
                .map(|(n, ty, desc)| (n.to_string(), json!({"type": ty, "description": desc})))
                .collect();
            op["requestBody"] = json!({"required": false, "content": {"application/json": {"schema": {"type": "object", "properties": props, "additionalProperties": false}}}});
        }
        let entry = paths.entry(d.path.to_string()).or_insert_with(|| json!({}));
        entry[d.method] = op;
    }
    json!({
        "openapi": "3.1.0",
        "info": {"title": "baton admin API", "version": env!("CARGO_PKG_VERSION")},
        "paths": paths,
        "security": [{"bearer": []}],
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {"Error": {"type": "object", "required": ["error"], "properties": {"error": {"type": "string"}, "field": {"type": "string"}}}},
        },
    })
}
