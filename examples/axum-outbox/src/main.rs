//! An axum service with baton in the same process, on one SQLite pool.
//!
//! `POST /orders {"email": "...", "total_cents": 1200}` inserts an order
//! and enqueues its `send_receipt` task in the same transaction
//! (`Queue::enqueue_in`): the order and its task are
//! committed together or not at all. A worker in the same process runs the
//! receipts. Ctrl-C or SIGTERM stops the HTTP server from taking requests,
//! lets running receipts finish within the worker's shutdown grace, and
//! exits.
//!
//! ```text
//! cargo run -p baton-example-axum        # listens on 127.0.0.1:3000, file orders.db
//! curl -s localhost:3000/orders -H 'content-type: application/json' \
//!      -d '{"email":"ada@example.com","total_cents":1200}'
//! ```
//!
//! `BIND` and `DATABASE` (a file path) override the address and the file.

use std::time::Duration;

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use axum::{Json, Router};
use baton::queue::{Queue, TaskArgs, TaskBuilder, TaskError, Worker, WorkerConfig};
use baton::sqlx;
use baton::Store;
use serde::{Deserialize, Serialize};
use sqlx::sqlite::{SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions};
use tokio_util::sync::CancellationToken;

/// Any error, for `main` and the start-up steps.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The task: send the receipt of one order.
#[derive(Debug, Serialize, Deserialize)]
struct SendReceipt {
    order_id: i64,
    email: String,
}

impl TaskArgs for SendReceipt {
    const KIND: &'static str = "send_receipt";
}

/// The request body of `POST /orders`.
#[derive(Debug, Deserialize)]
struct NewOrder {
    email: String,
    total_cents: i64,
}

/// The answer: the order's id and its receipt task's id.
#[derive(Debug, Serialize, Deserialize)]
struct Created {
    order: i64,
    task: i64,
}

/// The handlers' state: the pool shared with baton, and the queue.
#[derive(Clone)]
struct AppState {
    pool: SqlitePool,
    queue: Queue,
}

/// A handler failure, answered as 400 (bad input) or 500 (anything else).
enum AppError {
    BadRequest(String),
    Internal(String),
}

impl IntoResponse for AppError {
    fn into_response(self) -> Response {
        match self {
            AppError::BadRequest(m) => (StatusCode::BAD_REQUEST, m).into_response(),
            AppError::Internal(m) => {
                eprintln!("error: {m}");
                (StatusCode::INTERNAL_SERVER_ERROR, "internal error").into_response()
            }
        }
    }
}

impl From<sqlx::Error> for AppError {
    fn from(e: sqlx::Error) -> Self {
        AppError::Internal(e.to_string())
    }
}

impl From<baton::StoreError> for AppError {
    fn from(e: baton::StoreError) -> Self {
        AppError::Internal(e.to_string())
    }
}

impl From<baton::InvalidInput> for AppError {
    fn from(e: baton::InvalidInput) -> Self {
        AppError::BadRequest(e.to_string())
    }
}

impl From<baton::Error> for AppError {
    fn from(e: baton::Error) -> Self {
        match e {
            baton::Error::Invalid(e) => e.into(),
            e => AppError::Internal(e.to_string()),
        }
    }
}

/// `POST /orders`: the order row and its receipt task in one transaction.
async fn create_order(
    State(app): State<AppState>,
    Json(req): Json<NewOrder>,
) -> Result<(StatusCode, Json<Created>), AppError> {
    if !req.email.contains('@') || req.total_cents < 0 {
        return Err(AppError::BadRequest(
            "email must be an address and total_cents at least 0".into(),
        ));
    }
    // IMMEDIATE: this transaction writes; take the write lock up front.
    let mut tx = app.pool.begin_with("BEGIN IMMEDIATE").await?;
    let order: i64 =
        sqlx::query_scalar("INSERT INTO orders (email, total_cents) VALUES (?, ?) RETURNING id")
            .bind(&req.email)
            .bind(req.total_cents)
            .fetch_one(&mut *tx)
            .await?;
    let receipt = TaskBuilder::from_args(&SendReceipt {
        order_id: order,
        email: req.email,
    })?
    .unique_key(format!("receipt-{order}"));
    let enqueued = app.queue.enqueue_in(&mut tx, receipt).await?;
    tx.commit().await?;
    Ok((
        StatusCode::CREATED,
        Json(Created {
            order,
            task: enqueued.id,
        }),
    ))
}

/// The HTTP routes.
fn router(pool: SqlitePool, queue: Queue) -> Router {
    Router::new()
        .route("/orders", post(create_order))
        .with_state(AppState { pool, queue })
}

/// The pool (WAL, busy timeout), the application's table and baton's.
async fn open(path: &str) -> Result<(SqlitePool, Store), BoxError> {
    let options = SqliteConnectOptions::new()
        .filename(path)
        .create_if_missing(true)
        .journal_mode(SqliteJournalMode::Wal)
        .busy_timeout(Duration::from_secs(5));
    let pool = SqlitePoolOptions::new()
        .max_connections(4)
        .connect_with(options)
        .await
        .map_err(|e| format!("opening {path}: {e}"))?;
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS orders ( \
         id INTEGER PRIMARY KEY, email TEXT NOT NULL, total_cents INTEGER NOT NULL)",
    )
    .execute(&pool)
    .await?;
    // baton's tables in the same file, created or upgraded here.
    let store = Store::from_sqlite_pool(pool.clone(), baton::StoreOptions::default()).await?;
    Ok((pool, store))
}

/// The worker that sends receipts.
fn worker(store: Store) -> Result<Worker, baton::Error> {
    let config = WorkerConfig::new()
        .queue("default", 4)
        .poll_interval(Duration::from_millis(200))
        .shutdown_grace(Duration::from_secs(10));
    let mut worker = Worker::new(store, config)?;
    worker.register(|ctx, r: SendReceipt| async move {
        // A real service would call its mailer here (and stop early when
        // `ctx.stopped()` fires).
        println!(
            "receipt for order {} to {} (task {}, attempt {})",
            r.order_id,
            r.email,
            ctx.task().id,
            ctx.task().attempt
        );
        Ok::<_, TaskError>(())
    });
    Ok(worker)
}

/// Serve on `listener` and run the worker until `shutdown` fires; then stop
/// taking requests, let the worker finish or hand back its tasks, return.
async fn run(
    listener: tokio::net::TcpListener,
    pool: SqlitePool,
    store: Store,
    shutdown: CancellationToken,
) -> Result<(), BoxError> {
    let queue = Queue::new(store.clone());
    let worker = tokio::spawn(worker(store)?.run(shutdown.clone()));
    let served = axum::serve(listener, router(pool, queue))
        .with_graceful_shutdown(shutdown.clone().cancelled_owned())
        .await;
    // The server ended (signal or error): stop the worker either way.
    shutdown.cancel();
    let worked = worker.await?;
    served?;
    worked?;
    Ok(())
}

/// Cancel `token` on Ctrl-C or SIGTERM.
async fn on_signal(token: CancellationToken) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(e) => {
                eprintln!("no SIGTERM handler ({e}); Ctrl-C only");
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    eprintln!("shutting down: finishing running receipts");
    token.cancel();
}

#[tokio::main]
async fn main() -> Result<(), BoxError> {
    let bind = std::env::var("BIND").unwrap_or_else(|_| "127.0.0.1:3000".into());
    let path = std::env::var("DATABASE").unwrap_or_else(|_| "orders.db".into());
    let (pool, store) = open(&path).await?;
    let listener = tokio::net::TcpListener::bind(&bind)
        .await
        .map_err(|e| format!("binding {bind}: {e}"))?;
    eprintln!("listening on http://{bind} (orders in {path}); Ctrl-C to stop");
    let shutdown = CancellationToken::new();
    tokio::spawn(on_signal(shutdown.clone()));
    run(listener, pool, store, shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use baton::queue::Queue;
    use baton::store::TaskState;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// One HTTP/1.1 request on a fresh connection; the status and body.
    async fn post(addr: std::net::SocketAddr, body: &str) -> (u16, String) {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let req = format!(
            "POST /orders HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        let status = out[9..12].parse().unwrap();
        let body = out.split("\r\n\r\n").nth(1).unwrap_or("").to_string();
        (status, body)
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn an_order_and_its_receipt_commit_together_and_the_worker_runs_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("orders.db");
        let (pool, store) = open(path.to_str().unwrap()).await.unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let server = tokio::spawn(run(listener, pool.clone(), store.clone(), shutdown.clone()));

        let (status, body) = post(addr, r#"{"email":"ada@example.com","total_cents":1200}"#).await;
        assert_eq!(status, 201, "{body}");
        let created: Created = serde_json::from_str(&body).unwrap();
        // Refused input writes neither an order nor a task.
        let (status, _) = post(addr, r#"{"email":"nobody","total_cents":5}"#).await;
        assert_eq!(status, 400);
        let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(orders, 1);

        let q = Queue::new(store);
        let t0 = std::time::Instant::now();
        let info = loop {
            let info = q
                .task(created.task)
                .await
                .unwrap()
                .expect("the task exists");
            if info.state == TaskState::Succeeded {
                break info;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "not run: {info:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        assert_eq!(info.kind, "send_receipt");
        assert_eq!(info.payload["order_id"], created.order);

        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(15), server)
            .await
            .expect("server and worker stop on shutdown")
            .unwrap()
            .unwrap();
    }
}
