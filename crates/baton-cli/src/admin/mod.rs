//! The admin HTTP server of `baton serve --listen` and `baton work
//! --listen`: axum on hyper (HTTP/1.1), with limits, bearer-token auth, the
//! `/api/v1` JSON API, its OpenAPI document and the dashboard at `/`.
//!
//! Limits: request head at most [`MAX_HEADER_BYTES`] (a larger one is
//! answered 431 and never buffered), body at most [`MAX_BODY_BYTES`] (413),
//! the head must arrive within [`HEADER_TIMEOUT`], a request is answered
//! within [`REQUEST_TIMEOUT`] (503 otherwise), at most [`MAX_CONNECTIONS`]
//! connections at once (at the limit the oldest connection that has not sent
//! a request yet is closed to make room, else a new one waits in the
//! kernel's backlog), and an accept error (EMFILE, ENFILE, …) is logged and
//! backs off instead of spinning. So `/livez` and `/readyz` answer at once
//! however many idle or half-open sockets a client holds.

mod api;
mod auth;
mod dashboard;
mod openapi;
mod record;
mod tokens;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{bail, Context};
use axum::extract::DefaultBodyLimit;
use axum::Router;
use baton::queue::WorkerCounters;
use baton::Store;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::config::JobConfig;

pub use auth::Tokens;
pub use tokens::{Credential, Role};

/// The largest request head (request line and headers) accepted.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// The largest request body accepted.
pub const MAX_BODY_BYTES: usize = 1024 * 1024;
/// How long a client may take to send a request head.
pub const HEADER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a request may take to be answered.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The most connections served at once.
pub const MAX_CONNECTIONS: usize = 256;
/// How long a connection may stay idle between requests. hyper has no
/// keep-alive idle timeout of its own, so each connection is bounded.
const CONNECTION_MAX_AGE: Duration = Duration::from_secs(300);

/// What the admin server serves.
pub struct Admin {
    /// The store the API reads and steers.
    pub store: Store,
    /// The workers' counters, for `/metrics`.
    pub workers: Vec<WorkerCounters>,
    /// The config's jobs (their schedules give next fire and trigger
    /// slots); empty for `baton work` without `--config`.
    pub jobs: Vec<JobConfig>,
    /// The bearer tokens, if any.
    pub tokens: Tokens,
}

/// Shared by every request.
pub(crate) struct State {
    store: Store,
    workers: Vec<WorkerCounters>,
    /// Renders `/metrics`, keeping the store's last view for an outage.
    metrics: baton::metrics::Scraper,
    jobs: Vec<JobConfig>,
    tokens: Tokens,
    /// Samples of the queues' finished counts, for throughput.
    history: Mutex<api::History>,
}

/// Bind `addr` and serve the admin endpoints in the background; logs the
/// bound address. Without a token only a loopback address is accepted.
pub async fn spawn(addr: &str, admin: Admin) -> anyhow::Result<SocketAddr> {
    if admin.tokens.is_empty() {
        let addrs: Vec<SocketAddr> = tokio::net::lookup_host(addr)
            .await
            .with_context(|| format!("--listen {addr}: not an address like 127.0.0.1:9090"))?
            .collect();
        if addrs.iter().any(|a| !a.ip().is_loopback()) {
            bail!(
                "--listen {addr}: without an admin token the admin server binds loopback only; \
                 set BATON_ADMIN_TOKEN (or [admin] token in the config) or listen on 127.0.0.1"
            );
        }
    }
    let listener = TcpListener::bind(addr)
        .await
        .with_context(|| format!("--listen {addr}"))?;
    let local = listener.local_addr()?;
    crate::note!("baton: admin on http://{local}");
    let state = Arc::new(State {
        metrics: baton::metrics::Scraper::new(admin.store.clone()),
        store: admin.store,
        workers: admin.workers,
        jobs: admin.jobs,
        tokens: admin.tokens,
        history: Mutex::new(api::History::default()),
    });
    tokio::spawn(api::sample_loop(state.clone()));
    let app = router(state);
    tokio::spawn(accept_loop(listener, app));
    Ok(local)
}

/// Every route, with the limits and auth around them.
fn router(state: Arc<State>) -> Router {
    let (api, _) = openapi::routes();
    // Writes are recorded in the audit log (a route layer: inside auth,
    // with the matched route).
    let api = api.route_layer(axum::middleware::from_fn_with_state(
        state.clone(),
        record::record,
    ));
    Router::new()
        .merge(api)
        .merge(dashboard::routes())
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require,
        ))
        .layer(axum::middleware::from_fn(timeout))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .fallback(api::not_found)
        .with_state(state)
}

/// Answer 503 when a handler takes longer than [`REQUEST_TIMEOUT`].
async fn timeout(
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> axum::response::Response {
    match tokio::time::timeout(REQUEST_TIMEOUT, next.run(req)).await {
        Ok(r) => r,
        Err(_) => api::error(
            axum::http::StatusCode::SERVICE_UNAVAILABLE,
            "the request took too long; try again",
            None,
        ),
    }
}

/// The connections open now, so a new one can make room by closing one
/// that never sent a complete request head (a half-open or slowloris
/// connection) instead of waiting in the kernel's backlog behind it.
#[derive(Default)]
struct Open {
    next: u64,
    conns: std::collections::BTreeMap<u64, OpenConn>,
}

struct OpenConn {
    /// Set once the connection's first request head arrived.
    served: Arc<std::sync::atomic::AtomicBool>,
    abort: tokio::task::AbortHandle,
}

impl Open {
    /// Close the oldest connection that has not sent a request yet; false
    /// when every open connection has.
    fn evict_idle(&mut self) -> bool {
        let victim = self
            .conns
            .iter()
            .find(|(_, c)| !c.served.load(std::sync::atomic::Ordering::Relaxed))
            .map(|(id, _)| *id);
        match victim.and_then(|id| self.conns.remove(&id)) {
            Some(c) => {
                c.abort.abort();
                true
            }
            None => false,
        }
    }
}

/// Accept connections, at most [`MAX_CONNECTIONS`] at once; at the limit,
/// the oldest connection that has not sent a request yet is closed to make
/// room (so probes are answered at once whatever idle sockets are held
/// open), else the new one waits for a slot. On an accept error log it and
/// back off (up to a second) instead of spinning.
async fn accept_loop(listener: TcpListener, app: Router) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let open = Arc::new(Mutex::new(Open::default()));
    let mut backoff = Duration::from_millis(10);
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(s) => {
                backoff = Duration::from_millis(10);
                s
            }
            Err(e) => {
                tracing::warn!(error = %e, retry_in = ?backoff, "admin server: accept failed");
                crate::note!("baton: admin server: accept failed: {e}; retrying in {backoff:?}");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
                continue;
            }
        };
        let permit = match slots.clone().try_acquire_owned() {
            Ok(p) => p,
            Err(_) => {
                let evicted = open.lock().map(|mut o| o.evict_idle()).unwrap_or(false);
                if evicted {
                    tracing::debug!(%peer, "admin server: at the connection limit; closed the oldest connection without a request");
                }
                let Ok(p) = slots.clone().acquire_owned().await else {
                    return;
                };
                p
            }
        };
        let served = Arc::new(AtomicBool::new(false));
        let inner = TowerToHyperService::new(app.clone());
        let seen = served.clone();
        let service = hyper::service::service_fn(move |req| {
            seen.store(true, Ordering::Relaxed);
            hyper::service::Service::call(&inner, req)
        });
        let registry = open.clone();
        // Held while the task is spawned and registered, so its own removal
        // (when it ends at once) comes after the insert.
        let Ok(mut o) = open.lock() else {
            return;
        };
        o.next += 1;
        let id = o.next;
        let task = tokio::spawn(async move {
            let _permit = permit;
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_TIMEOUT)
                .max_buf_size(MAX_HEADER_BYTES)
                .serve_connection(TokioIo::new(stream), service);
            if let Ok(Err(e)) = tokio::time::timeout(CONNECTION_MAX_AGE, conn).await {
                tracing::debug!(%peer, error = %e, "admin connection ended");
            }
            if let Ok(mut o) = registry.lock() {
                o.conns.remove(&id);
            }
        });
        o.conns.insert(
            id,
            OpenConn {
                served,
                abort: task.abort_handle(),
            },
        );
    }
}
