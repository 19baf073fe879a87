//! `baton-bench fleet`: N instances of a service on one store, each a
//! scheduler and a worker on a `Store` (and so a pool) of its own, as N
//! `baton serve` processes would be; idle, then under a steady trickle of
//! tasks. Reports what the store sees: server connections,
//! transactions/s (PostgreSQL, `pg_stat_database` of the store's
//! database) or commands/s (Redis, `INFO stats`), per instance and in
//! all, and the job's slot lag (slot -> handler start) and every slot
//! run once.
//!
//! Point it at a database (or Redis server) of its own: the counters are
//! the whole database's (server's). Behind PgBouncer, name the server for
//! the counters with `--direct`.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use baton::clock::StoreClock;
use baton::queue::{Queue, TaskBuilder, TaskError, Worker, WorkerConfig};
use baton::schedule::{spec::Schedule, Job, Scheduler};
use chrono::{DateTime, Utc};
use clap::Args;
use serde_json::json;
use sqlx::Connection;
use tokio_util::sync::CancellationToken;

use super::{emit, Common, Ctx, Samples};

#[derive(Args)]
pub(crate) struct FleetArgs {
    #[command(flatten)]
    pub(crate) common: Common,
    /// Instances, each a scheduler and a worker on a store of its own.
    #[arg(long, default_value_t = 20)]
    instances: usize,
    /// Seconds before the idle window (start-up, pools shrinking back).
    #[arg(long, default_value_t = 25)]
    warmup: u64,
    /// Seconds of each window: idle, then trickle.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// The job's interval in ms (every instance schedules it; the issue's
    /// "1-minute job").
    #[arg(long, default_value_t = 60_000)]
    every_ms: u64,
    /// Tasks a second enqueued in all during the trickle window.
    #[arg(long, default_value_t = 5.0)]
    trickle: f64,
    /// The server the counters are read from, when `--store` goes through
    /// a pooler (PostgreSQL: a direct URL to the same database).
    #[arg(long)]
    direct: Option<String>,
}

/// What the store saw at one moment.
#[derive(Clone, Copy)]
struct Counters {
    /// Server connections (PostgreSQL: sessions on the database; Redis:
    /// connected clients), less the bench's own.
    connections: i64,
    /// Transactions (PostgreSQL: commits + rollbacks) or commands (Redis).
    ops: i64,
}

/// Reads the store's own counters.
enum Probe {
    Pg { url: String, db: String },
    Redis { client: redis::Client },
}

impl Probe {
    fn new(url: &str) -> Result<Probe> {
        if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            let plain = url.split('?').next().unwrap_or(url).to_string();
            let db = plain.rsplit('/').next().unwrap_or("").to_string();
            Ok(Probe::Pg { url: plain, db })
        } else if url.starts_with("redis://") {
            Ok(Probe::Redis {
                client: redis::Client::open(url)?,
            })
        } else {
            bail!(
                "fleet measures PostgreSQL or Redis; got {}",
                baton::store::redact(url)
            )
        }
    }

    fn unit(&self) -> &'static str {
        match self {
            Probe::Pg { .. } => "transactions",
            Probe::Redis { .. } => "commands",
        }
    }

    async fn read(&self) -> Result<Counters> {
        match self {
            Probe::Pg { url, db } => {
                let mut c = sqlx::PgConnection::connect(url).await?;
                let (connections, ops): (i64, i64) = sqlx::query_as(
                    "SELECT (SELECT count(*) FROM pg_stat_activity WHERE datname = $1 \
                       AND backend_type = 'client backend' AND pid <> pg_backend_pid()), \
                       (SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1)",
                )
                .bind(db)
                .fetch_one(&mut c)
                .await?;
                let _ = c.close().await;
                Ok(Counters { connections, ops })
            }
            Probe::Redis { client } => {
                let mut c = client.get_multiplexed_async_connection().await?;
                let info: String = redis::cmd("INFO").query_async(&mut c).await?;
                let field = |name: &str| -> i64 {
                    info.lines()
                        .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                        .and_then(|v| v.trim().parse().ok())
                        .unwrap_or(0)
                };
                Ok(Counters {
                    connections: field("connected_clients") - 1,
                    ops: field("total_commands_processed"),
                })
            }
        }
    }
}

/// One window's numbers: connections (mean and most of the samples) and
/// the rate of transactions or commands.
struct Window {
    mean_conns: f64,
    max_conns: i64,
    rate: f64,
}

/// Sample the counters every 500 ms for `secs`.
async fn window(probe: &Probe, secs: u64) -> Result<Window> {
    // A session's statistics reach pg_stat_database up to a second late.
    let first = probe.read().await?;
    let t0 = Instant::now();
    let (mut sum, mut n, mut most) = (0i64, 0i64, 0i64);
    while t0.elapsed() < Duration::from_secs(secs) {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let c = probe.read().await?;
        sum += c.connections;
        n += 1;
        most = most.max(c.connections);
    }
    let last = probe.read().await?;
    let elapsed = t0.elapsed().as_secs_f64();
    Ok(Window {
        mean_conns: sum as f64 / n.max(1) as f64,
        max_conns: most,
        // The probe's own reads: one transaction (PostgreSQL) or command
        // (INFO) each.
        rate: (last.ops - first.ops - n - 1) as f64 / elapsed,
    })
}

pub(crate) async fn fleet_bench(a: FleetArgs) -> Result<()> {
    if a.instances == 0 || a.seconds < 5 || a.every_ms < 100 || a.trickle < 0.0 {
        bail!("--instances at least 1, --seconds at least 5, --every-ms at least 100, --trickle not negative");
    }
    let mut ctx = Ctx::new(&a.common);
    let probe = Probe::new(a.direct.as_deref().unwrap_or(&ctx.url))?;
    let main = ctx.connect().await?;
    let kind = main.backend().kind();
    // Window edges in store time, read without a call.
    let edges = StoreClock::new(main.clone()).await?;
    let queue = "fleet";
    let every = Duration::from_millis(a.every_ms);
    let job = Job::new("tick", Schedule::every(every)?).queue(queue);
    // Slot -> the instances' handler starts (store time), and the trickle's
    // enqueue -> start lags.
    type Starts = Arc<Mutex<BTreeMap<DateTime<Utc>, Vec<(usize, DateTime<Utc>)>>>>;
    let starts: Starts = Arc::default();
    let trickle_lag: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let stop = CancellationToken::new();
    let mut runs = Vec::new();
    for i in 0..a.instances {
        let store = ctx.connect().await?;
        let clock = StoreClock::new(store.clone()).await?;
        let mut w = Worker::new(store.clone(), WorkerConfig::default().queue(queue, 2))?;
        let (s, c) = (starts.clone(), clock.clone());
        w.handle("tick", move |t| {
            if let Some(slot) = t.task().slot {
                if let Ok(mut m) = s.lock() {
                    m.entry(slot).or_default().push((i, c.now()));
                }
            }
            async { Ok::<(), TaskError>(()) }
        });
        let (lags, c) = (trickle_lag.clone(), clock);
        w.handle("trickle", move |t| {
            let sent = t.task().payload["at_us"].as_i64().unwrap_or(0);
            let lag = (c.now().timestamp_micros() - sent).max(0) as u64;
            if let Ok(mut v) = lags.lock() {
                v.push(Duration::from_micros(lag));
            }
            async { Ok::<(), TaskError>(()) }
        });
        let mut sched = Scheduler::new(store);
        sched.add(job.clone())?;
        runs.push(tokio::spawn(w.run(stop.clone())));
        runs.push(tokio::spawn(sched.run(stop.clone())));
    }
    drop(main);
    tokio::time::sleep(Duration::from_secs(a.warmup)).await;
    let idle_from = edges.now();
    let idle = window(&probe, a.seconds).await?;
    // The trickle: one enqueuer of its own, tasks spread evenly.
    let enq_store = ctx.connect().await?;
    let clock = StoreClock::new(enq_store.clone()).await?;
    let q = Queue::new(enq_store);
    let trickle_stop = CancellationToken::new();
    let enqueuer = {
        let (stop, rate) = (trickle_stop.clone(), a.trickle);
        tokio::spawn(async move {
            if rate <= 0.0 {
                return Ok::<u64, anyhow::Error>(0);
            }
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
            let mut n = 0u64;
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return Ok(n),
                    _ = tick.tick() => {
                        let t = TaskBuilder::new("trickle", json!({"at_us": clock.now().timestamp_micros()}))
                            .queue(queue);
                        q.enqueue(t).await?;
                        n += 1;
                    }
                }
            }
        })
    };
    let busy = window(&probe, a.seconds).await?;
    trickle_stop.cancel();
    let enqueued = enqueuer.await.context("enqueuer panicked")??;
    let ended = edges.now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.cancel();
    for r in runs {
        r.await.context("instance panicked")??;
    }
    // Slots due in both windows: each once, and how late.
    let starts = starts.lock().map(|m| m.clone()).unwrap_or_default();
    let step = chrono::Duration::from_std(every)?;
    let (mut slots, mut missed, mut doubled) = (0usize, 0usize, 0usize);
    let mut lag = Samples::new();
    let mut per_instance: BTreeMap<usize, usize> = BTreeMap::new();
    if let Some(first) = starts.keys().find(|s| **s >= idle_from).copied() {
        let mut slot = first;
        while slot + step <= ended {
            slots += 1;
            match starts.get(&slot) {
                None => missed += 1,
                Some(v) => {
                    doubled += usize::from(v.len() > 1);
                    *per_instance.entry(v[0].0).or_default() += 1;
                    lag.push((v[0].1 - slot).to_std().unwrap_or_default());
                }
            }
            slot += step;
        }
    }
    let lag = lag.finish();
    let mut tl = Samples::new();
    for d in trickle_lag.lock().map(|v| v.clone()).unwrap_or_default() {
        tl.push(d);
    }
    let tl = tl.finish();
    let n = a.instances as f64;
    let unit = probe.unit();
    let w = |w: &Window| {
        json!({
            "connections_mean": w.mean_conns, "connections_max": w.max_conns,
            "connections_per_instance": w.mean_conns / n,
            "per_s": w.rate, "per_s_per_instance": w.rate / n,
        })
    };
    emit(
        json!({
            "bench": "fleet", "store": kind, "instances": a.instances,
            "seconds": a.seconds, "every_ms": a.every_ms, "trickle_per_s": a.trickle,
            "unit": unit, "idle": w(&idle), "trickle": w(&busy),
            "slots": slots, "missed": missed, "doubled": doubled,
            "instances_that_ran_a_slot": per_instance.len(),
            "slot_to_start": lag.json(), "trickle_enqueued": enqueued,
            "trickle_enqueue_to_start": tl.json(), "prefix": ctx.prefix,
        }),
        format!(
            "fleet {kind}: {} instances; idle: {:.1} connections ({:.2}/instance, max {}), {:.1} {unit}/s ({:.3}/instance); trickle {}/s: {:.1} connections ({:.2}/instance, max {}), {:.1} {unit}/s ({:.3}/instance); {slots} slots of {} ms: missed {missed}, doubled {doubled}, slot->start p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms (run by {} instances); enqueue->start p50 {:.1} ms, p99 {:.1} ms",
            a.instances,
            idle.mean_conns, idle.mean_conns / n, idle.max_conns, idle.rate, idle.rate / n,
            a.trickle,
            busy.mean_conns, busy.mean_conns / n, busy.max_conns, busy.rate, busy.rate / n,
            a.every_ms,
            lag.ms(50.0), lag.ms(99.0), lag.ms(100.0),
            per_instance.len(),
            tl.ms(50.0), tl.ms(99.0),
        ),
    );
    // The tables are dropped over the direct connection, when one is named
    // (a transaction pooler takes no diagnostic session).
    if let Some(d) = &a.direct {
        ctx.url = d.clone();
    }
    ctx.cleanup().await
}
