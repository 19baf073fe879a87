//! What `baton serve` and `baton work` share: the worker config and
//! handlers for command tasks and durable jobs, the signal-driven shutdown,
//! and the admin HTTP server. Command modules import this; it imports no
//! command module.

use std::sync::atomic::{AtomicI32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use baton::queue::{TaskContext, TaskError, Worker, WorkerConfig, WorkerCounters};
use baton::Store;
use tokio_util::sync::CancellationToken;

use crate::child::Signals;
use crate::command_task;
use crate::config::{Action, JobConfig, Mode, QueueConfig};
use crate::http_client;

/// The worker config for command tasks.
pub fn worker_config(
    queues: &[(String, usize)],
    lease: Duration,
    poll: Option<Duration>,
    shutdown_grace: Duration,
    grace: Duration,
) -> WorkerConfig {
    let cfg = queues
        .iter()
        .fold(WorkerConfig::default(), |cfg, (q, n)| cfg.queue(q, *n))
        .lease(lease)
        .shutdown_grace(shutdown_grace)
        .stop_grace(grace + Duration::from_secs(1));
    match poll {
        Some(p) => cfg.poll_interval(p),
        None => cfg,
    }
}

/// One worker per queue, as `serve` and `work` run them: each with its
/// queue's concurrency, lease and cluster-wide cap, the command handler,
/// and the handlers of the durable jobs on that queue. Refuses a bad
/// setting (naming the queue and field) before anything runs.
pub fn queue_workers(
    store: &Store,
    queues: &[QueueConfig],
    jobs: &[JobConfig],
    poll: Option<Duration>,
    shutdown_grace: Duration,
    grace: Duration,
) -> Result<Vec<Worker>, baton::Error> {
    let mut out = Vec::with_capacity(queues.len());
    for q in queues {
        let mut cfg = worker_config(
            &[(q.name.clone(), q.concurrency as usize)],
            q.lease,
            poll,
            shutdown_grace,
            grace,
        );
        if let Some(m) = q.max_running {
            cfg = cfg.max_running(q.name.clone(), m);
        }
        if let Some(m) = q.per_key_max_running {
            cfg = cfg.per_key_max_running(q.name.clone(), m);
        }
        if q.fair {
            cfg = cfg.fair(q.name.clone());
        }
        if let Some(limit) = q.per_key_rate {
            cfg = cfg.per_key_rate_limit(q.name.clone(), limit);
        }
        match &q.rate {
            Some((None, limit)) => cfg = cfg.rate_limit(q.name.clone(), *limit),
            Some((Some(name), limit)) => {
                cfg = cfg.shared_rate_limit(q.name.clone(), name.clone(), *limit)
            }
            None => {}
        }
        cfg.validate().map_err(|mut e| {
            e.problem = format!("queue {:?}: {}", q.name, e.problem);
            baton::Error::Invalid(e)
        })?;
        let mut w = Worker::new(store.clone(), cfg)?;
        handle_commands(&mut w, grace);
        for j in jobs
            .iter()
            .filter(|j| j.mode == Mode::Durable && j.queue == q.name)
        {
            w.handle(j.name.clone(), durable_handler(j.clone(), grace));
        }
        out.push(w);
    }
    Ok(out)
}

/// Register the command handler on a worker.
pub fn handle_commands(w: &mut Worker, grace: Duration) {
    w.handle(command_task::KIND, move |ctx| command_task::run(ctx, grace));
}

/// A shutdown driven by signals (see [`shutdown_on_signals`]).
pub struct SignalShutdown {
    /// Cancelled on the second signal: stop handlers now and hand their
    /// tasks back (`Worker::run_with`'s urgent token).
    pub urgent: CancellationToken,
    first: Arc<AtomicI32>,
}

impl SignalShutdown {
    /// 128 + the first signal received (143 for SIGTERM, 130 for SIGINT),
    /// when a signal started the shutdown.
    pub fn exit_code(&self) -> Option<u8> {
        match self.first.load(Ordering::SeqCst) {
            0 => None,
            sig => Some((128 + sig).clamp(0, 255) as u8),
        }
    }
}

/// Cancel `graceful` on the first SIGINT/SIGTERM/SIGHUP (finish running
/// tasks within the shutdown grace), and the returned urgent token on the
/// second (stop them now and hand their tasks back). The process never
/// exits from here: tasks are always handed back or left to rescue by the
/// worker, within its bounds.
pub fn shutdown_on_signals(graceful: CancellationToken) -> anyhow::Result<SignalShutdown> {
    let mut signals = Signals::new()?;
    let out = SignalShutdown {
        urgent: CancellationToken::new(),
        first: Arc::new(AtomicI32::new(0)),
    };
    let (urgent, first) = (out.urgent.clone(), out.first.clone());
    tokio::spawn(async move {
        let sig = signals.recv().await;
        first.store(sig, Ordering::SeqCst);
        crate::note!(
            "baton: signal {sig}: shutting down (again to stop tasks now and hand them back)"
        );
        graceful.cancel();
        let sig = signals.recv().await;
        crate::note!("baton: signal {sig}: stopping tasks now and handing them back");
        urgent.cancel();
        loop {
            let sig = signals.recv().await;
            crate::note!("baton: signal {sig}: already stopping");
        }
    });
    Ok(out)
}

/// Why a task cannot be retried through the queue whatever its state (the
/// record of a lock-mode run: no worker has a handler for it), if so.
pub fn not_retryable(t: &baton::store::TaskInfo) -> Option<String> {
    baton::schedule::is_lock_run_record(t).then(|| {
        format!(
            "task {} is the record of a lock-mode run of job {:?}, run in-process by `baton serve` under the job's lock; it cannot be retried through the queue (the job's next slot runs by its schedule)",
            t.id,
            t.job.as_deref().unwrap_or_default()
        )
    })
}

/// A slot as the jobs' environment (`BATON_SLOT`) and the `Baton-Slot`
/// header show it: the one form of every time baton writes
/// ([`baton::format_time`], `2026-01-31T06:00:00.000Z`), so a slot greps
/// the same in the environment, the logs, the CLI and the API.
pub fn slot_text(t: chrono::DateTime<chrono::Utc>) -> String {
    baton::format_time(t)
}

/// Run a job's action once. `env` carries BATON_JOB, BATON_SLOT and the
/// rest; `stop` asks a command to end (SIGTERM, then SIGKILL after the
/// grace it resolves with). A command's supervisor follows `stop_by`, the
/// lease's (see `child::spawn`).
pub async fn run_action(
    action: &Action,
    env: Vec<(&'static str, String)>,
    stop: impl std::future::Future<Output = Duration>,
    grace: Duration,
    timeout: Option<Duration>,
    stop_by: Option<baton::lock::StopBy>,
    ran_for: command_task::RanFor<'_>,
) -> Result<(), TaskError> {
    match action {
        Action::Command(argv) => {
            command_task::run_command(argv, &env, stop, grace, ran_for, stop_by).await
        }
        Action::Http {
            method,
            url,
            headers,
            body,
        } => {
            let extra: Vec<(&str, String)> = env
                .iter()
                .map(|(k, v)| (header_name(k), v.clone()))
                .collect();
            let t = timeout.unwrap_or(Duration::from_secs(60));
            tokio::select! {
                r = http_client::request(method, url, headers, body.as_deref(), &extra, t) => r.map(|_| ()).map_err(|e| TaskError::retry(format!("{e:#}"))),
                _ = stop => Err(TaskError::retry("stopped")),
            }
        }
    }
}

fn header_name(env: &str) -> &'static str {
    match env {
        "BATON_JOB" => "Baton-Job",
        "BATON_SLOT" => "Baton-Slot",
        "BATON_TASK_ID" => "Baton-Task-Id",
        "BATON_ATTEMPT" => "Baton-Attempt",
        "BATON_FENCING_TOKEN" => "Baton-Fencing-Token",
        "BATON_QUEUE" => "Baton-Queue",
        _ => "Baton-Other",
    }
}

/// The handler that runs a durable job's action for its tasks.
pub fn durable_handler(
    j: JobConfig,
    grace: Duration,
) -> impl Fn(
    TaskContext,
) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), TaskError>> + Send>>
       + Send
       + Sync
       + 'static {
    move |ctx: TaskContext| {
        let j = j.clone();
        Box::pin(async move {
            let t = ctx.task();
            // terminate_other: a cancelled run (replaced by a later slot)
            // is killed at once, without the grace.
            let cancel_grace = if j.overlap == baton::store::Overlap::TerminateOther {
                Duration::ZERO
            } else {
                grace
            };
            if let Action::Command(argv) = &j.action {
                return command_task::run_argv_stopping(
                    ctx.clone(),
                    argv.clone(),
                    grace,
                    cancel_grace,
                )
                .await;
            }
            let mut env = vec![
                ("BATON_JOB", j.name.clone()),
                ("BATON_TASK_ID", t.id.to_string()),
                ("BATON_ATTEMPT", t.attempt.to_string()),
                ("BATON_FENCING_TOKEN", t.token.to_string()),
            ];
            if let Some(s) = t.slot {
                env.push(("BATON_SLOT", slot_text(s)));
            }
            let c2 = ctx.clone();
            run_action(
                &j.action,
                env,
                async move {
                    c2.stopped().await;
                    match c2.stop_reason() {
                        Some(baton::queue::StopReason::Cancelled) => cancel_grace,
                        _ => grace,
                    }
                },
                grace,
                j.timeout,
                None,
                command_task::RanFor::Nothing,
            )
            .await
        })
    }
}

/// Serve the admin server on `addr` in the background (for `serve` and
/// `work`); logs the bound address. The tokens come from the environment
/// (`BATON_ADMIN_TOKEN`, `BATON_ADMIN_READ_TOKEN`,
/// `BATON_ADMIN_TOKENS_FILE`), else the config's `[admin]`.
pub async fn spawn_admin(
    addr: &str,
    store: &Store,
    workers: Vec<WorkerCounters>,
    config: Option<&crate::config::Config>,
) -> anyhow::Result<()> {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
    let from_config = config.map(|c| c.admin.clone()).unwrap_or_default();
    use crate::admin::{Credential, Role};
    let mut fixed = Vec::new();
    if let Some(t) = env("BATON_ADMIN_TOKEN").or(from_config.token) {
        fixed.push(Credential::new("admin", Role::Admin, &t));
    }
    if let Some(t) = env("BATON_ADMIN_READ_TOKEN").or(from_config.read_token) {
        fixed.push(Credential::new("read", Role::Read, &t));
    }
    let file = env("BATON_ADMIN_TOKENS_FILE")
        .map(std::path::PathBuf::from)
        .or(from_config.tokens_file);
    let tokens = crate::admin::Tokens::new(fixed, file.as_deref())
        .map_err(|e| anyhow::anyhow!("the admin tokens file: {e}"))?;
    crate::admin::spawn(
        addr,
        crate::admin::Admin {
            store: store.clone(),
            workers,
            jobs: config.map(|c| c.jobs.clone()).unwrap_or_default(),
            tokens,
        },
    )
    .await?;
    Ok(())
}
