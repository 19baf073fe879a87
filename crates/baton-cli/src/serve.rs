//! `baton serve --config FILE`: the scheduler and the workers for a config
//! file's jobs and queues, plus a small admin endpoint; and `baton trigger`,
//! `baton jobs`.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use baton::queue::Worker;
use baton::schedule::{self, Job, Scheduler, SlotRun};
use baton::{Error, Store};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, Mode};
use crate::output::{self, Align, Table};
use crate::runtime::{self, durable_handler, run_action, slot_text};

/// Arguments of `baton serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// The config file (TOML): store, queues, jobs.
    #[arg(long, env = "BATON_CONFIG")]
    pub config: PathBuf,
    /// Store URL; overrides the file's `store`.
    #[arg(long, env = "BATON_STORE")]
    pub store: Option<String>,
    /// Table or key prefix.
    #[arg(long, env = "BATON_PREFIX")]
    pub prefix: Option<String>,
    /// Admin HTTP address (`/health`, `/jobs`, `/stats`, `/metrics` for
    /// Prometheus), e.g. 127.0.0.1:9090.
    #[arg(long, value_parser = crate::listen_arg)]
    pub listen: Option<String>,
    /// On SIGTERM, how long running tasks may finish before they are handed
    /// back, and lock-mode runs before their command is stopped.
    #[arg(long, default_value = "10s", value_parser = crate::duration_arg)]
    pub shutdown_grace: Duration,
    /// After SIGTERM to a command, how long before SIGKILL.
    #[arg(long, default_value = "5s", value_parser = crate::duration_arg)]
    pub grace: Duration,
}

fn load(path: &PathBuf) -> anyhow::Result<Config> {
    Config::from_file(path)
        .map_err(|e| Error::Invalid(baton::InvalidInput::new("config", e.to_string())).into())
}

async fn open(
    store: Option<String>,
    cfg: &Config,
    prefix: Option<String>,
) -> anyhow::Result<Store> {
    let url = store
        .or_else(|| cfg.store.clone())
        .unwrap_or_else(|| baton::DEFAULT_STORE_URL.into());
    crate::connect(&crate::StoreArg { store: url, prefix })
        .await
        .context("connecting to the store")
}

/// When a lock-mode run's command must stop, and the grace it then gets:
/// `grace` before the lease's stop-by instant (its local deadline less a
/// small margin, moved on by every extension) with the time left to it,
/// so SIGKILL comes before the lease could lapse — work never outlives the
/// lease even when the store stalls; at once (no grace) when the store
/// refused an extension.
async fn stop_before_lapse(lease: &baton::lock::LeaseHandle, grace: Duration) -> Duration {
    loop {
        let (deadline, kill_at) = (lease.deadline(), lease.stop_by());
        let term_at = kill_at.checked_sub(grace).unwrap_or(kill_at);
        tokio::select! {
            _ = lease.lost() => {
                tracing::warn!(lock = lease.name(), token = %lease.token(), "lease lost: killing the command");
                return Duration::ZERO;
            }
            _ = tokio::time::sleep_until(term_at) => {
                if lease.deadline() > deadline {
                    continue; // extended meanwhile
                }
                tracing::warn!(lock = lease.name(), token = %lease.token(), "could not extend the lease: stopping the command before it could lapse");
                return kill_at.saturating_duration_since(tokio::time::Instant::now());
            }
        }
    }
}

/// `baton serve`.
pub async fn serve(a: ServeArgs) -> anyhow::Result<u8> {
    let cfg = load(&a.config)?;
    let store = open(a.store.clone(), &cfg, a.prefix.clone()).await?;
    for w in store.backend().warnings().await.unwrap_or_default() {
        crate::note!("baton: warning: {w}");
    }
    let stop = CancellationToken::new();
    let signals = runtime::shutdown_on_signals(stop.clone())?;

    let mut scheduler = Scheduler::new(store.clone());
    for j in &cfg.jobs {
        let job = j.job();
        match j.mode {
            Mode::Durable => {
                scheduler.add(job).map_err(Error::from)?;
            }
            Mode::Lock { at_most, .. } => {
                // As under `baton lock`: the command is stopped before its
                // lease could lapse, so `grace` is at most a third of the
                // lease (the keep-alive extends it every third).
                // A lease longer than the force-release bound is bounded by
                // its last confirmation + that bound: a third of it then.
                let grace = if at_most > baton::lock::RELEASE_BOUND {
                    a.grace.min(baton::lock::RELEASE_BOUND / 3)
                } else {
                    a.grace.min(at_most / 3)
                };
                let (action, timeout) = (j.action.clone(), j.timeout);
                let (shutdown, shutdown_grace) = (stop.clone(), a.shutdown_grace);
                scheduler
                    .add_locked(job, move |run: SlotRun| {
                        let action = action.clone();
                        let shutdown = shutdown.clone();
                        async move {
                            let env = vec![
                                ("BATON_JOB", run.job.clone()),
                                ("BATON_SLOT", slot_text(run.slot)),
                                ("BATON_FENCING_TOKEN", run.lease.token().to_string()),
                            ];
                            let lease = run.lease.clone();
                            let stop = async move {
                                // On shutdown the run may finish within
                                // --shutdown-grace, then it is stopped (never
                                // past its lease either).
                                let stopping = async {
                                    shutdown.cancelled().await;
                                    tokio::time::sleep(shutdown_grace).await;
                                    let left = lease
                                        .stop_by()
                                        .saturating_duration_since(tokio::time::Instant::now());
                                    grace.min(left)
                                };
                                let lapse = async {
                                    tokio::select! {
                                        g = stop_before_lapse(&lease, grace) => g,
                                        g = stopping => g,
                                    }
                                };
                                match timeout {
                                    Some(t) => {
                                        tokio::time::timeout(t, lapse).await.unwrap_or(grace)
                                    }
                                    None => lapse.await,
                                }
                            };
                            let stop_by = Some(run.lease.watch_stop_by());
                            run_action(&action, env, stop, grace, timeout, stop_by)
                                .await
                                .map_err(|e| e.message)
                        }
                    })
                    .map_err(Error::from)?;
            }
        }
    }

    let mut tasks = tokio::task::JoinSet::new();
    let mut counters = Vec::new();
    for q in &cfg.queues {
        let mut cfg_w = runtime::worker_config(
            &[(q.name.clone(), q.concurrency as usize)],
            q.lease,
            Duration::from_secs(1),
            a.shutdown_grace,
            a.grace,
        );
        if let Some(m) = q.max_running {
            cfg_w = cfg_w.max_running(q.name.clone(), m);
        }
        let mut w = Worker::new(store.clone(), cfg_w);
        runtime::handle_commands(&mut w, a.grace);
        for j in cfg
            .jobs
            .iter()
            .filter(|j| j.mode == Mode::Durable && j.queue == q.name)
        {
            w.handle(j.name.clone(), durable_handler(j.clone(), a.grace));
        }
        counters.push(w.counters());
        let (s, u) = (stop.clone(), signals.urgent.clone());
        tasks.spawn(async move { w.run_with(s, u).await.map_err(anyhow::Error::from) });
    }
    {
        let s = stop.clone();
        tasks.spawn(async move { scheduler.run(s).await.map_err(anyhow::Error::from) });
    }
    if let Some(addr) = &a.listen {
        runtime::spawn_admin(addr, &store, counters, Some(&cfg)).await?;
    }
    crate::note!(
        "baton: serving {} job(s) and {} queue(s) on {}",
        cfg.jobs.len(),
        cfg.queues.len(),
        store.url()
    );
    let mut code = 0;
    while let Some(r) = tasks.join_next().await {
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                crate::note!("baton: {e:#}");
                code = 1;
                stop.cancel();
            }
            Err(e) => {
                crate::note!("baton: internal error: {e}");
                code = 1;
                stop.cancel();
            }
        }
    }
    // A signal-initiated shutdown exits 128 + the signal.
    if code == 0 {
        code = signals.exit_code().unwrap_or(0);
    }
    Ok(code)
}

/// Arguments of `baton trigger`.
#[derive(clap::Args, Debug)]
pub struct TriggerArgs {
    /// The job to run now.
    pub job: String,
    #[command(flatten)]
    pub store: crate::StoreArg,
    /// The slot this run stands for (RFC 3339); the same slot always gives
    /// the same run. Default: the job's latest due slot (needs --config).
    #[arg(long, value_parser = crate::rfc3339_arg)]
    pub slot: Option<chrono::DateTime<chrono::Utc>>,
    /// The config file defining the job (its queue and schedule).
    #[arg(long, env = "BATON_CONFIG")]
    pub config: Option<PathBuf>,
    /// Queue for the run when no config is given.
    #[arg(long, default_value = baton::queue::DEFAULT_QUEUE)]
    pub queue: String,
    /// Accept a --slot that is not one of the job's slots (it is still
    /// truncated to the schedule's precision). Needed without --config,
    /// where the job's schedule is unknown.
    #[arg(long)]
    pub any_slot: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `baton trigger`.
pub async fn trigger(a: TriggerArgs) -> anyhow::Result<u8> {
    baton::lock::validate_name("job name", &a.job).map_err(Error::from)?;
    let job = match &a.config {
        Some(path) => {
            let cfg = load(path)?;
            let j = cfg.jobs.iter().find(|j| j.name == a.job).ok_or_else(|| {
                Error::from(baton::InvalidInput::new(
                    "JOB",
                    format!("{:?} is not a job in {}", a.job, path.display()),
                ))
            })?;
            j.job()
        }
        None => {
            let placeholder = baton::schedule::spec::Schedule::every(Duration::from_secs(60))
                .map_err(Error::from)?;
            Job::new(a.job.clone(), placeholder).queue(a.queue.clone())
        }
    };
    if a.config.is_none() && a.slot.is_none() {
        return Err(Error::from(baton::InvalidInput::new(
            "--slot",
            "give --slot RFC3339 (or --config FILE to default to the job's latest due slot)",
        ))
        .into());
    }
    if a.config.is_none() && !a.any_slot {
        return Err(Error::from(baton::InvalidInput::new(
            "--slot",
            "without --config the job's schedule is unknown, so the slot cannot be checked; \
             give --config FILE, or --any-slot to accept the slot as given",
        ))
        .into());
    }
    let store = crate::connect(&a.store)
        .await
        .context("connecting to the store")?;
    if a.config.is_none() {
        // The store knows every job a scheduler registered.
        let known = store.backend().job_list().await.map_err(Error::from)?;
        if !known.iter().any(|j| j.name == a.job) {
            return Err(Error::from(baton::InvalidInput::new(
                "JOB",
                format!(
                    "{:?} is not a job in this store (a job appears once `baton serve` has \
                     scheduled it); check the name, or give --config FILE",
                    a.job
                ),
            ))
            .into());
        }
    }
    let slot = match a.slot {
        Some(s) => schedule::trigger_slot(&job, s, a.any_slot).map_err(Error::from)?,
        None => {
            let now = store.now().await.map_err(Error::from)?;
            schedule::latest_slot(&job.schedule, now).ok_or_else(|| {
                Error::from(baton::InvalidInput::new(
                    "--slot",
                    "the job has no slot in the past year; give --slot",
                ))
            })?
        }
    };
    let e = schedule::trigger_with(&store, &job, slot, a.any_slot).await?;
    if a.json {
        crate::outln!("{}", crate::shapes::triggered(&e, &a.job, slot));
    } else {
        crate::outln!("{}", e.id);
        if !e.inserted {
            crate::note!(
                "baton: {} @ {} was already triggered or scheduled: task {}",
                a.job,
                output::ts(slot),
                e.id
            );
        }
    }
    Ok(0)
}

/// Arguments of `baton jobs`.
#[derive(clap::Args, Debug)]
pub struct JobsArgs {
    #[command(subcommand)]
    pub cmd: Option<JobsCmd>,
    #[command(flatten)]
    pub store: crate::StoreArg,
    /// The config file, to show each job's next fire time.
    #[arg(long, env = "BATON_CONFIG")]
    pub config: Option<PathBuf>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `baton jobs pause|resume`.
#[derive(clap::Subcommand, Debug)]
pub enum JobsCmd {
    /// Stop enqueueing a job's slots, cluster-wide.
    Pause {
        /// The job's name (as in the config file and `baton jobs`).
        job: String,
    },
    /// Resume a paused job (missed slots follow its misfire policy).
    Resume {
        /// The job's name.
        job: String,
    },
}

/// `baton jobs`.
pub async fn jobs(a: JobsArgs) -> anyhow::Result<u8> {
    let cfg = match &a.config {
        Some(p) => Some(load(p)?),
        None => None,
    };
    if let Some(JobsCmd::Pause { job } | JobsCmd::Resume { job }) = &a.cmd {
        baton::lock::validate_name("JOB", job).map_err(Error::from)?;
    }
    let store = crate::connect(&a.store)
        .await
        .context("connecting to the store")?;
    if let Some(cmd) = a.cmd {
        let (job, paused) = match cmd {
            JobsCmd::Pause { job } => (job, true),
            JobsCmd::Resume { job } => (job, false),
        };
        if schedule::set_paused(&store, &job, paused).await? {
            crate::outln!("job {job} {}", if paused { "paused" } else { "resumed" });
            return Ok(0);
        }
        crate::note!(
            "baton: no job {job:?} in this store (it appears once a scheduler has run it)"
        );
        return Ok(crate::EXIT_NOT_FOUND);
    }
    let now = store.now().await.map_err(Error::from)?;
    let cfg_jobs = cfg.as_ref().map_or(&[][..], |c| &c.jobs[..]);
    let statuses = crate::shapes::with_config_jobs(schedule::job_statuses(&store).await?, cfg_jobs);
    // Next fire in the job's own zone (with its offset) for cron jobs.
    let next_of = |name: &str| {
        cfg_jobs
            .iter()
            .find(|j| j.name == name)
            .and_then(|j| crate::shapes::next_fire(j, now))
    };
    if a.json {
        let rows: Vec<_> = statuses
            .iter()
            .map(|s| {
                let j = cfg_jobs.iter().find(|j| j.name == s.state.name);
                crate::shapes::job(s, j, now)
            })
            .collect();
        output::json(&serde_json::Value::Array(rows))?;
        return Ok(0);
    }
    let mut table = Table::new(&[
        ("JOB", Align::Left),
        ("PAUSED", Align::Left),
        ("LAST SLOT", Align::Left),
        ("NEXT FIRE", Align::Left),
        ("LAST RUN", Align::Left),
    ]);
    for s in statuses {
        let last = s
            .last_run
            .map(|t| {
                let why = match (&t.state, &t.last_error) {
                    (
                        baton::store::TaskState::Failed | baton::store::TaskState::Cancelled,
                        Some(e),
                    ) => format!(": {e}"),
                    _ => String::new(),
                };
                format!(
                    "task {} {} {} (attempt {}){why}",
                    t.id,
                    output::ts_or_dash(t.slot),
                    t.state,
                    t.attempt
                )
            })
            .unwrap_or_else(|| "-".into());
        let next = next_of(&s.state.name).unwrap_or_else(|| {
            if cfg.is_some() {
                "-".into()
            } else {
                "(give --config)".into()
            }
        });
        table.row(vec![
            s.state.name,
            s.state.paused.to_string(),
            output::ts_or_dash(s.state.last_slot),
            next,
            last,
        ]);
    }
    table.print()?;
    Ok(0)
}
