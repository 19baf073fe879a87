//! `baton enqueue`, `baton work`, `baton tasks …` and `baton queues …`.

use std::time::Duration;

use anyhow::Context;
use baton::queue::{Queue, Worker};
use baton::store::{CancelOutcome, TaskFilter, TaskInfo, TaskState};
use baton::Error;
use tokio_util::sync::CancellationToken;

pub use crate::enqueue_cmd::{enqueue, unique_args, EnqueueArgs};
use crate::output;
use crate::runtime::shutdown_on_signals;
use crate::values::duration_arg;
use crate::{connect, note, outln, StoreArg, EXIT_NOT_FOUND};

/// A task's unique key as `tasks show` and `tasks list` print it: the
/// caller's key and its scope (`42 [kind-in-queue]`), not the stored
/// composite.
pub fn unique_text(t: &TaskInfo) -> Option<String> {
    t.unique()
        .map(|u| crate::shapes::unique_text(&u, t.unique_hold))
}

/// Arguments of `baton work`.
///
/// Which queues, and with what settings: `--queue` names them (repeatable);
/// without it, every `[[queue]]` of the config file (`--config`), else
/// `default`. Each queue's concurrency, lease and cap come from its flag
/// when given, else from the config's `[[queue]]` of that name, else the
/// defaults below: a flag's default never shadows the config.
#[derive(clap::Args, Debug)]
pub struct WorkArgs {
    #[command(flatten)]
    pub store: StoreArg,
    /// Queues to work on (repeatable) [default: the config's queues, else
    /// `default`].
    #[arg(long = "queue")]
    pub queues: Vec<String>,
    /// Commands run at once, per queue (1 to 10000) [default: the config
    /// queue's `concurrency`, else 2].
    #[arg(long, value_parser = concurrency_arg)]
    pub concurrency: Option<usize>,
    /// Cluster-wide cap per queue: at most N of its tasks run at once
    /// across every `baton work`/`serve` that passes it [default: the
    /// config queue's `max_running`, else no cap].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub max_running: Option<u32>,
    /// Cluster-wide cap per concurrency key, per queue: at most N tasks of
    /// one `--concurrency-key` run at once across every `baton
    /// work`/`serve` that passes it [default: the config queue's
    /// `per_key_max_running`, else no cap].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub per_key_max_running: Option<u32>,
    /// Cluster-wide rate limit per queue: at most N task starts in any
    /// window of PERIOD of the store's clock, across every `baton
    /// work`/`serve` that passes it (`100/1m`); `NAME=N/PERIOD` shares
    /// the named limit with every queue that names it
    /// (`partner-api=10/1s`). Tasks over it wait pending, no attempt
    /// counted [default: the config queue's `rate`, else none].
    #[arg(long, value_name = "[NAME=]N/PERIOD", value_parser = rate_arg)]
    pub rate: Option<(Option<String>, baton::queue::RateLimit)>,
    /// Rate per concurrency key, per queue: at most N starts of one
    /// `--concurrency-key` in any window of PERIOD of the store's clock,
    /// across every `baton work`/`serve` that passes it (`10/1m`); a used-up
    /// key's tasks wait pending, no attempt counted, while other keys'
    /// run [default: the config queue's `per_key_rate`, else none].
    #[arg(long, value_name = "N/PERIOD", value_parser = per_key_rate_arg)]
    pub per_key_rate: Option<baton::queue::RateLimit>,
    /// Claim fairly across concurrency keys: each claim interleaves the
    /// keys with due tasks (the one with the fewest running first, ties
    /// round-robin), so one key's backlog does not hold back another key's
    /// tasks; priority still wins [default: the config queue's `fair`,
    /// else off].
    #[arg(long)]
    pub fair: bool,
    /// Lease per attempt; heartbeats renew it every third of it (at least
    /// 30ms) [default: the config queue's `lease`, else 30s].
    #[arg(long, value_parser = lease_arg)]
    pub lease: Option<Duration>,
    /// On SIGTERM, how long running commands may finish before they are
    /// stopped and their tasks handed back.
    #[arg(long, default_value = "10s", value_parser = duration_arg)]
    pub shutdown_grace: Duration,
    /// After SIGTERM to a command, how long before SIGKILL.
    #[arg(long, default_value = "5s", value_parser = duration_arg)]
    pub grace: Duration,
    /// Idle poll period (at least 10ms) [default: 2s on PostgreSQL with
    /// LISTEN and on Redis, whose wake-ups reach every worker; 1s elsewhere].
    #[arg(long, value_parser = poll_arg)]
    pub poll: Option<Duration>,
    /// Admin HTTP address, e.g. 127.0.0.1:9090: the dashboard at `/`, the
    /// JSON API under `/api/v1` (OpenAPI at `/api/v1/openapi.json`),
    /// `/livez` and `/readyz` probes, `/metrics` for Prometheus.
    #[arg(long, value_parser = crate::values::listen_arg)]
    pub listen: Option<String>,
}

/// The default `--concurrency` of `baton work` for a queue the config does
/// not declare.
const WORK_CONCURRENCY: usize = 2;
/// The shortest `--poll`: a shorter one only loads the store.
const MIN_POLL: Duration = Duration::from_millis(10);

/// Parse `--lease`: a duration of at least [`baton::queue::MIN_LEASE`].
fn lease_arg(s: &str) -> Result<Duration, String> {
    let d = duration_arg(s)?;
    if d < baton::queue::MIN_LEASE {
        return Err(format!(
            "{s:?} is too short for a lease; use at least {} (e.g. 30s)",
            baton::format_duration(baton::queue::MIN_LEASE)
        ));
    }
    Ok(d)
}

/// Parse `--rate`: `N/PERIOD` or `NAME=N/PERIOD`.
fn rate_arg(s: &str) -> Result<(Option<String>, baton::queue::RateLimit), String> {
    baton::queue::RateLimit::parse_named("rate", s).map_err(|e| e.problem)
}

/// `--per-key-rate`: `N/PERIOD` (a rate per concurrency key has no name).
fn per_key_rate_arg(s: &str) -> Result<baton::queue::RateLimit, String> {
    baton::queue::RateLimit::parse("per_key_rate", s).map_err(|e| e.problem)
}

/// Parse `--poll`: a duration of at least 10ms.
fn poll_arg(s: &str) -> Result<Duration, String> {
    let d = duration_arg(s)?;
    if d < MIN_POLL {
        return Err(format!(
            "{s:?} is too short a poll period; use at least {} (e.g. 1s)",
            baton::format_duration(MIN_POLL)
        ));
    }
    Ok(d)
}

/// The queues `work` serves and their settings, from the flags and the
/// config (see [`WorkArgs`]).
fn work_queues(
    a: &WorkArgs,
    cfg: Option<&crate::config::Config>,
) -> Vec<crate::config::QueueConfig> {
    let declared = |name: &str| cfg.and_then(|c| c.queues.iter().find(|q| q.name == name));
    let names: Vec<String> = if !a.queues.is_empty() {
        let mut seen = std::collections::HashSet::new();
        a.queues
            .iter()
            .filter(|q| seen.insert(q.as_str()))
            .cloned()
            .collect()
    } else if let Some(c) = cfg.filter(|c| !c.queues.is_empty()) {
        c.queues.iter().map(|q| q.name.clone()).collect()
    } else {
        vec![baton::queue::DEFAULT_QUEUE.to_string()]
    };
    names
        .into_iter()
        .map(|name| {
            let from = declared(&name);
            crate::config::QueueConfig {
                concurrency: a
                    .concurrency
                    .map(|c| c as u32)
                    .or(from.map(|q| q.concurrency))
                    .unwrap_or(WORK_CONCURRENCY as u32),
                lease: a
                    .lease
                    .or(from.map(|q| q.lease))
                    .unwrap_or(crate::config::DEFAULT_LEASE),
                max_running: a.max_running.or(from.and_then(|q| q.max_running)),
                per_key_max_running: a
                    .per_key_max_running
                    .or(from.and_then(|q| q.per_key_max_running)),
                rate: a.rate.clone().or(from.and_then(|q| q.rate.clone())),
                per_key_rate: a.per_key_rate.or(from.and_then(|q| q.per_key_rate)),
                fair: a.fair || from.is_some_and(|q| q.fair),
                name,
            }
        })
        .collect()
}

/// Parse a task id: a whole number from 1 up (as `enqueue` prints it).
pub(crate) fn task_id_arg(s: &str) -> Result<i64, String> {
    match s.trim().parse::<i64>() {
        Ok(n) if n >= 1 => Ok(n),
        _ => Err(format!(
            "{s:?} is not a task id; use the whole number `baton enqueue` or `baton tasks list` printed, e.g. 42"
        )),
    }
}

fn concurrency_arg(s: &str) -> Result<usize, String> {
    match s.trim().parse::<usize>() {
        Ok(n) if (1..=MAX_CONCURRENCY).contains(&n) => Ok(n),
        _ => Err(format!(
            "{s:?} is not a concurrency; use a whole number from 1 to {MAX_CONCURRENCY}"
        )),
    }
}

/// `baton work`.
pub async fn work(a: WorkArgs) -> anyhow::Result<u8> {
    let config = a.store.config()?;
    let queues = work_queues(&a, config.as_ref());
    for q in &queues {
        baton::names::validate_name("--queue", &q.name).map_err(Error::from)?;
    }
    let jobs = config.as_ref().map_or(&[][..], |c| &c.jobs[..]);
    let store = crate::connect_resolved(&a.store.resolve(config.as_ref()), true)
        .await
        .context("connecting to the store")?;
    crate::note_store_warnings(&store).await;
    let workers =
        crate::runtime::queue_workers(&store, &queues, jobs, a.poll, a.shutdown_grace, a.grace)?;
    if let Some(addr) = &a.listen {
        let counters = workers.iter().map(Worker::counters).collect();
        crate::runtime::spawn_admin(addr, &store, counters, config.as_ref()).await?;
    }
    let token = CancellationToken::new();
    let signals = shutdown_on_signals(token.clone())?;
    let names: Vec<String> = queues
        .iter()
        .map(|q| {
            format!(
                "{} (concurrency {}, lease {})",
                q.name,
                q.concurrency,
                baton::format_duration(q.lease)
            )
        })
        .collect();
    let ids: Vec<String> = workers.iter().map(|w| w.id().to_string()).collect();
    note!(
        "baton: worker {} on {} serving {}",
        ids.join(","),
        store.url(),
        names.join(", ")
    );
    let mut runs = tokio::task::JoinSet::new();
    for w in workers {
        let (t, u) = (token.clone(), signals.urgent.clone());
        runs.spawn(async move { w.run_with(t, u).await });
    }
    let mut failed: Option<anyhow::Error> = None;
    while let Some(r) = runs.join_next().await {
        let e = match r {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => anyhow::Error::from(e),
            Err(e) => anyhow::anyhow!("internal error: {e}"),
        };
        // One queue's worker failing stops the others (as under serve).
        token.cancel();
        failed.get_or_insert(e);
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(signals.exit_code().unwrap_or(0)),
    }
}

/// The most tasks one `tasks list` page may hold.
pub const MAX_LIMIT: u32 = 10_000;
/// The most commands `work` runs at once per queue (as the config's
/// `concurrency`).
pub const MAX_CONCURRENCY: usize = 10_000;

/// `baton tasks …`.
#[derive(clap::Subcommand, Debug)]
pub enum TasksCmd {
    /// List tasks, newest first.
    List {
        #[command(flatten)]
        store: StoreArg,
        /// Only tasks of this queue.
        #[arg(long)]
        queue: Option<String>,
        /// Only tasks in this state: pending, running, succeeded, failed or
        /// cancelled.
        #[arg(long, value_parser = state_arg)]
        state: Option<TaskState>,
        /// Only the runs of this scheduled job.
        #[arg(long)]
        job: Option<String>,
        #[command(flatten)]
        search: crate::task_search::SearchArgs,
        /// Only tasks with ids below this (the previous page's last id).
        #[arg(long, value_name = "ID")]
        before: Option<i64>,
        /// At most this many tasks (1 to 10000).
        #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u32).range(1..=MAX_LIMIT as i64))]
        limit: u32,
        /// Print a JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Show one task with its attempt history.
    Show {
        #[command(flatten)]
        store: StoreArg,
        /// The task id (as `enqueue` and `tasks list` print it).
        #[arg(value_parser = task_id_arg)]
        id: i64,
        /// Print a JSON object instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Put a failed or cancelled task back to pending.
    Retry {
        #[command(flatten)]
        store: StoreArg,
        /// The task id.
        #[arg(value_parser = task_id_arg)]
        id: i64,
    },
    /// Cancel a task (a running one stops at its next heartbeat).
    Cancel {
        #[command(flatten)]
        store: StoreArg,
        /// The task id.
        #[arg(value_parser = task_id_arg)]
        id: i64,
    },
    /// Delete tasks by id (any not running), or the finished tasks a
    /// filter matches (`--yes` to delete; without it, a count).
    Delete(crate::tasks_delete::DeleteArgs),
    /// Counts per queue and state, and whether the queue is paused.
    Stats {
        #[command(flatten)]
        store: StoreArg,
        /// Print a JSON array (one object per queue, as the admin `/stats`).
        #[arg(long)]
        json: bool,
    },
    /// Delete finished tasks older than the retention.
    Prune {
        #[command(flatten)]
        store: StoreArg,
        /// Delete tasks that finished more than this long ago (e.g. 7d, 12h).
        #[arg(long, default_value = "7d", value_parser = duration_arg)]
        older_than: Duration,
    },
}

fn state_arg(s: &str) -> Result<TaskState, String> {
    s.parse()
        .map_err(|_| format!("{s:?}: use pending, running, succeeded, failed or cancelled"))
}

/// Refuse a filter name the store could never hold (too long, control
/// characters), before connecting.
fn check_filter(what: &str, name: &Option<String>) -> Result<(), Error> {
    match name {
        Some(n) => baton::names::validate_name(what, n).map_err(Error::from),
        None => Ok(()),
    }
}

/// Run a `baton tasks` subcommand.
pub async fn tasks(cmd: TasksCmd) -> anyhow::Result<u8> {
    match cmd {
        TasksCmd::List {
            store,
            queue,
            state,
            job,
            search,
            before,
            limit,
            json,
        } => {
            check_filter("--queue", &queue)?;
            check_filter("--job", &job)?;
            let q = Queue::new(connect(&store).await.context("connecting to the store")?);
            let mut filter = TaskFilter {
                queue,
                state,
                job,
                before_id: before,
                limit,
                ..TaskFilter::default()
            };
            search.apply(&mut filter)?;
            let list = q.tasks(&filter).await?;
            if json {
                output::json(&crate::shapes::task(&list)?)?;
                return Ok(0);
            }
            crate::tasks_view::print_list(&list)?;
            Ok(0)
        }
        TasksCmd::Show { store, id, json } => {
            let q = Queue::new(connect(&store).await.context("connecting to the store")?);
            let Some(t) = q.task(id).await? else {
                note!("baton: no task {id}");
                return Ok(EXIT_NOT_FOUND);
            };
            if json {
                output::json(&crate::shapes::task(&t)?)?;
            } else {
                crate::tasks_view::print_task(&t)?;
            }
            Ok(0)
        }
        TasksCmd::Retry { store, id } => {
            let q = Queue::new(connect(&store).await.context("connecting to the store")?);
            if let Some(why) = q
                .task(id)
                .await?
                .as_ref()
                .and_then(crate::runtime::not_retryable)
            {
                note!("baton: {why}");
                return Ok(crate::EXIT_CONFLICT);
            }
            if q.retry(id).await? {
                let target = format!("id={id}");
                crate::audit_cmd::record_cli(q.store(), None, "tasks retry", &target, "done").await;
                outln!("task {id} is pending again");
                return Ok(0);
            }
            match q.task(id).await? {
                None => {
                    note!("baton: no task {id}");
                    Ok(EXIT_NOT_FOUND)
                }
                Some(t) => {
                    note!(
                        "baton: task {id} is {}; only a failed or cancelled task can be retried",
                        t.state
                    );
                    Ok(crate::EXIT_CONFLICT)
                }
            }
        }
        TasksCmd::Cancel { store, id } => {
            let q = Queue::new(connect(&store).await.context("connecting to the store")?);
            let outcome = q.cancel(id).await?;
            if matches!(outcome, CancelOutcome::Cancelled | CancelOutcome::Requested) {
                let done = if outcome == CancelOutcome::Cancelled {
                    "cancelled"
                } else {
                    "requested"
                };
                let target = format!("id={id}");
                crate::audit_cmd::record_cli(q.store(), None, "tasks cancel", &target, done).await;
            }
            match outcome {
                CancelOutcome::Cancelled => outln!("task {id} cancelled"),
                CancelOutcome::Requested => {
                    outln!("task {id} is running; its worker stops it at the next heartbeat")
                }
                CancelOutcome::AlreadyFinished(s) => {
                    note!("baton: task {id} already finished ({s}); nothing to cancel");
                    return Ok(crate::EXIT_CONFLICT);
                }
                CancelOutcome::NotFound => {
                    note!("baton: no task {id}");
                    return Ok(EXIT_NOT_FOUND);
                }
            }
            Ok(0)
        }
        TasksCmd::Delete(a) => crate::tasks_delete::run(a).await,
        TasksCmd::Stats { store, json } => {
            let q = Queue::new(connect(&store).await.context("connecting to the store")?);
            crate::queues_cmd::print(&q.stats().await?, json)?;
            Ok(0)
        }
        TasksCmd::Prune { store, older_than } => {
            let q = Queue::new(connect(&store).await.context("connecting to the store")?);
            let n = crate::output::progress(
                format!(
                    "baton: pruning finished tasks older than {}",
                    baton::format_duration(older_than)
                ),
                q.prune(older_than),
            )
            .await?;
            let target = format!("older_than={}", baton::format_duration(older_than));
            let done = format!("pruned {n}");
            crate::audit_cmd::record_cli(q.store(), None, "tasks prune", &target, &done).await;
            outln!(
                "pruned {n} finished tasks older than {}",
                baton::format_duration(older_than)
            );
            Ok(0)
        }
    }
}
