//! `baton serve --config FILE`: the scheduler and the workers for a config
//! file's jobs and queues, plus a small admin endpoint; and `baton trigger`,
//! `baton jobs`.

use std::time::Duration;

use anyhow::Context;
use baton::queue::Worker;
use baton::schedule::{self, Job, Scheduler, SlotRun};
use baton::{Error, Store};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, Mode};
use crate::output;
use crate::runtime::{self, run_action, slot_text};

/// Arguments of `baton serve`.
#[derive(clap::Args, Debug)]
pub struct ServeArgs {
    /// The store and the config file (`--config FILE` is required here: its
    /// queues and jobs are what serve runs).
    #[command(flatten)]
    pub store: crate::StoreArg,
    /// Admin HTTP address, e.g. 127.0.0.1:9090: the dashboard at `/`, the
    /// JSON API under `/api/v1` (OpenAPI at `/api/v1/openapi.json`),
    /// `/livez` and `/readyz` probes, `/metrics` for Prometheus.
    #[arg(long, value_parser = crate::values::listen_arg)]
    pub listen: Option<String>,
    /// On SIGTERM, how long running tasks may finish before they are handed
    /// back, and lock-mode runs before their command is stopped.
    #[arg(long, default_value = "10s", value_parser = crate::values::duration_arg)]
    pub shutdown_grace: Duration,
    /// After SIGTERM to a command, how long before SIGKILL.
    #[arg(long, default_value = "5s", value_parser = crate::values::duration_arg)]
    pub grace: Duration,
}

/// The config file `serve` needs, and the store it names (resolved as
/// every command resolves it).
async fn open(arg: &crate::StoreArg) -> anyhow::Result<(Config, Store)> {
    let Some(cfg) = arg.config()? else {
        return Err(Error::from(baton::InvalidInput::new(
            "--config",
            "baton serve needs a config file: give --config FILE (or env BATON_CONFIG); see examples/baton.toml",
        ))
        .into());
    };
    let store = crate::connect_resolved(&arg.resolve(Some(&cfg)), true)
        .await
        .context("connecting to the store")?;
    Ok((cfg, store))
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
    let (cfg, store) = open(&a.store).await?;
    crate::note_store_warnings(&store).await;
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
                            let ran_for = crate::command_task::RanFor::Slot(&run);
                            run_action(&action, env, stop, grace, timeout, stop_by, ran_for).await
                        }
                    })
                    .map_err(Error::from)?;
            }
        }
    }

    // Jobs defined in the store run too, in place of a config job of the
    // same name (DESIGN.md D2).
    scheduler.definitions(crate::stored_jobs::decoder(cfg.jobs.clone()));

    let mut tasks = tokio::task::JoinSet::new();
    let workers = runtime::queue_workers(
        &store,
        &cfg.queues,
        &cfg.jobs,
        None,
        a.shutdown_grace,
        a.grace,
    )?;
    let counters = workers.iter().map(Worker::counters).collect();
    for w in workers {
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
    #[arg(long, value_parser = crate::values::rfc3339_arg)]
    pub slot: Option<chrono::DateTime<chrono::Utc>>,
    /// The job's queue. Default: the job's queue in --config, else as the
    /// store recorded it when the job registered (else `default`, for a
    /// store that has not recorded it). A --queue other than the job's is
    /// refused.
    #[arg(long)]
    pub queue: Option<String>,
    /// Accept a --slot that is not one of the job's slots (it is still
    /// truncated to the schedule's precision). Needed without --config,
    /// where the job's schedule is unknown.
    #[arg(long)]
    pub any_slot: bool,
    /// Run the slot even if the scheduler skipped it (overlap, misfire):
    /// its skipped task goes back to pending, once; a second use answers
    /// with the run the first one made.
    #[arg(long)]
    pub run_skipped: bool,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

/// `baton trigger`.
pub async fn trigger(a: TriggerArgs) -> anyhow::Result<u8> {
    baton::names::validate_name("job name", &a.job).map_err(Error::from)?;
    let cfg = a.store.config()?;
    let job = match &cfg {
        Some(cfg) => {
            let j = cfg.jobs.iter().find(|j| j.name == a.job).ok_or_else(|| {
                Error::from(baton::InvalidInput::new(
                    "JOB",
                    format!("{:?} is not a job in {}", a.job, a.store.config_name()),
                ))
            })?;
            j.job()
        }
        None => {
            let placeholder = baton::schedule::spec::Schedule::every(Duration::from_secs(60))
                .map_err(Error::from)?;
            // The queue is settled below, from the store's record of the job.
            Job::new(a.job.clone(), placeholder)
        }
    };
    let mut job = job;
    if let (Some(_), Some(q)) = (&cfg, &a.queue) {
        if *q != job.queue {
            return Err(Error::from(baton::InvalidInput::new(
                "--queue",
                format!(
                    "job {:?} runs on queue {:?} (in {}), not {q:?}; drop --queue",
                    a.job,
                    job.queue,
                    a.store.config_name()
                ),
            ))
            .into());
        }
    }
    if cfg.is_none() && a.slot.is_none() {
        return Err(Error::from(baton::InvalidInput::new(
            "--slot",
            "give --slot RFC3339 (or --config FILE to default to the job's latest due slot)",
        ))
        .into());
    }
    if cfg.is_none() && !a.any_slot {
        return Err(Error::from(baton::InvalidInput::new(
            "--slot",
            "without --config the job's schedule is unknown, so the slot cannot be checked; \
             give --config FILE, or --any-slot to accept the slot as given",
        ))
        .into());
    }
    let store = crate::connect_resolved(&a.store.resolve(cfg.as_ref()), true)
        .await
        .context("connecting to the store")?;
    if cfg.is_none() {
        // The store knows every job a scheduler registered.
        let Some(state) = schedule::job_state(&store, &a.job).await? else {
            return Err(Error::from(baton::InvalidInput::new(
                "JOB",
                format!(
                    "{:?} is not a job in this store (a job appears once `baton serve` has \
                     scheduled it); check the name, or give --config FILE",
                    a.job
                ),
            ))
            .into());
        };
        // The run goes to the job's queue, as the store recorded it when
        // the job registered; a --queue that differs would strand the slot.
        job.queue = match (state.queue, &a.queue) {
            (Some(known), Some(q)) if *q != known => {
                return Err(Error::from(baton::InvalidInput::new(
                    "--queue",
                    format!(
                        "job {:?} runs on queue {known:?} (as the store recorded it), not \
                         {q:?}; drop --queue",
                        a.job
                    ),
                ))
                .into());
            }
            (Some(known), _) => known,
            (None, q) => q
                .clone()
                .unwrap_or_else(|| baton::queue::DEFAULT_QUEUE.to_string()),
        };
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
    let report = if a.run_skipped {
        schedule::run_skipped(&store, &job, slot, a.any_slot).await?
    } else {
        let e = schedule::trigger_with(&store, &job, slot, a.any_slot).await?;
        schedule::slot_report(&store, &job, slot, e).await?
    };
    let target = format!("name={} slot={}", a.job, baton::format_time(slot));
    let outcome = format!("task {}", report.id);
    let action = if a.run_skipped {
        "trigger --run-skipped"
    } else {
        "trigger"
    };
    crate::audit_cmd::record_cli(&store, None, action, &target, &outcome).await;
    if a.json {
        crate::outln!("{}", crate::shapes::triggered(&report, &a.job, slot));
    } else {
        crate::outln!("{}", report.id);
        if let Some(line) = trigger_note(&report, &a.job, slot) {
            crate::note!("{line}");
        }
    }
    Ok(0)
}

/// The line a trigger prints (stderr) about a slot it did not just
/// enqueue: what became of the slot's run.
fn trigger_note(
    r: &schedule::SlotReport,
    job: &str,
    slot: chrono::DateTime<chrono::Utc>,
) -> Option<String> {
    use schedule::SlotOutcome as O;
    if r.inserted {
        return None;
    }
    let at = |t: Option<chrono::DateTime<chrono::Utc>>| {
        t.map(|t| format!(" at {}", output::ts(t)))
            .unwrap_or_default()
    };
    let why = r.reason.as_deref().unwrap_or("no reason kept");
    let what = match r.outcome {
        O::Pending if r.rerun => "skipped, now run at your request (--run-skipped): pending".into(),
        O::Pending => "already triggered or scheduled: pending".into(),
        O::Running => "already running".into(),
        O::Succeeded => format!("already ran: succeeded{}", at(r.finished_at)),
        O::Failed if r.pruned => format!("already ran: failed{}: {why}", at(r.finished_at)),
        O::Failed => format!(
            "already ran: failed{}: {why} (`baton tasks retry {}` runs it again)",
            at(r.finished_at),
            r.id
        ),
        O::Cancelled => format!("already cancelled{}: {why}", at(r.finished_at)),
        O::Skipped => format!(
            "was skipped, not run ({why}); nothing was enqueued{}",
            if r.pruned {
                ""
            } else {
                "; give --run-skipped to run it now"
            }
        ),
    };
    let pruned = if r.pruned {
        "; its record was pruned, and a slot runs once, forever"
    } else {
        ""
    };
    Some(format!(
        "baton: {job} @ {} {what}: task {}{pruned}",
        output::ts(slot),
        r.id
    ))
}
