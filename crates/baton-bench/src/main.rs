//! `baton-bench`: the benchmark harness for baton.
//!
//! Every subcommand takes `--store URL` and `--prefix` (default: a fresh
//! random one, so runs never collide), runs one measurement and prints one
//! JSON line (starting with `{`) followed by one human line (starting with
//! `#`). Repetition, medians and side-by-side comparisons with the stores'
//! own ceilings live in `scripts/bench.sh`; results are in
//! `docs/BENCHMARKS.md`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use baton::lock::{LockOptions, Locker};
use baton::queue::{Queue, TaskBuilder, TaskError, Worker, WorkerConfig};
use baton::store::{Acquire, Finish, LockAcquire, TaskClaim};
use baton::{Store, StoreOptions};
use clap::{Args, Parser, Subcommand, ValueEnum};
use serde_json::{json, Value};
use sqlx::Connection;
use tokio_util::sync::CancellationToken;

mod fleet;

#[derive(Parser)]
#[command(name = "baton-bench", about = "Benchmarks for baton's locks and queue")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Acquire + release loops on distinct (uncontended) lock names.
    Lock(LockArgs),
    /// Pre-insert jobs, then drain them with several workers (graphile-worker's perfTest shape).
    QueueThroughput(ThroughputArgs),
    /// Enqueue one job at a time; measure enqueue -> handler start.
    Latency(LatencyArgs),
    /// Claim rate (batches of --batch, --claimers at once) over a pending backlog.
    ClaimScale(ClaimArgs),
    /// Scheduling precision: N instances (scheduler + worker, each on its own
    /// store handle) run a durable `every` job; slot -> handler start latency
    /// and skipped / missed / doubled slots.
    SchedulePrecision(PrecisionArgs),
    /// A fleet: N instances (scheduler + worker, each on a store of its
    /// own) on one store, idle then under a trickle: server connections,
    /// transactions or commands a second, slot lag.
    Fleet(fleet::FleetArgs),
}

#[derive(Args)]
struct PrecisionArgs {
    #[command(flatten)]
    common: Common,
    /// Instances, each a scheduler and a worker on its own store handle.
    #[arg(long, default_value_t = 3)]
    instances: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 60)]
    seconds: u64,
    /// The job's interval in ms.
    #[arg(long, default_value_t = 1000)]
    every_ms: u64,
    /// Worker poll interval in ms (the default 1 s, as in production).
    #[arg(long, default_value_t = 1000)]
    poll_ms: u64,
    /// The job's lead in ms (`Job::lead`: how long before its slot an
    /// on-time slot is taken); default the library's, 0 takes it at the slot.
    #[arg(long)]
    lead_ms: Option<u64>,
}

#[derive(Args, Clone)]
struct Common {
    /// Store URL: sqlite://PATH, postgres://…, mysql://…, redis://…
    #[arg(long)]
    store: String,
    /// Table / key prefix (default: `bench_<random>_`).
    #[arg(long)]
    prefix: Option<String>,
    /// Connections per store handle (SQL pools).
    #[arg(long, default_value_t = 16)]
    pool: u32,
    /// Keep the PostgreSQL or MySQL tables afterwards (default: drop them).
    #[arg(long)]
    keep: bool,
    /// PostgreSQL: delete succeeded tasks in their finish
    /// (`StoreOptions::keep_succeeded = false`) instead of keeping them.
    #[arg(long)]
    delete_succeeded: bool,
    /// The tokio runtime the bench runs on: `multi` (one worker thread per
    /// core, what `#[tokio::main]` gives) or `current` (one thread).
    #[arg(long, value_enum, default_value_t = Flavor::Multi)]
    runtime: Flavor,
}

/// A tokio runtime flavor.
#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
enum Flavor {
    /// `new_multi_thread`: a worker thread per core.
    Multi,
    /// `new_current_thread`: everything on the calling thread.
    Current,
}

/// A knob forced on or off.
#[derive(Clone, Copy, ValueEnum, PartialEq, Eq, Debug)]
enum OnOff {
    /// On.
    On,
    /// Off.
    Off,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum LockApi {
    /// `Locker::try_lock` (keep-alive off) + `Lease::release`.
    Locker,
    /// `backend().lock_acquire` + `backend().lock_release` directly.
    Raw,
}

#[derive(Args)]
struct LockArgs {
    #[command(flatten)]
    common: Common,
    /// Concurrent loops, each on its own lock name.
    #[arg(long, default_value_t = 1)]
    concurrency: usize,
    /// Seconds to measure (after a short warm-up).
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Which API to drive.
    #[arg(long, value_enum, default_value_t = LockApi::Locker)]
    api: LockApi,
}

#[derive(Args)]
struct ThroughputArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long, default_value_t = 200_000)]
    jobs: u64,
    /// Worker instances, each with its own store handle (own pool).
    #[arg(long, default_value_t = 4)]
    workers: usize,
    /// Concurrency per worker.
    #[arg(long, default_value_t = 24)]
    concurrency: usize,
    /// Keep each slot until its result is acknowledged
    /// (`WorkerConfig::free_slot_on_return(false)`); same as
    /// `--free-slots off`.
    #[arg(long, conflicts_with = "free_slots")]
    hold_slots: bool,
    /// Force `WorkerConfig::free_slot_on_return` on or off (default: the
    /// library's default for the store).
    #[arg(long, value_enum)]
    free_slots: Option<OnOff>,
    /// Force `WorkerConfig::result_batches_in_flight` (default: the
    /// library's default for the store).
    #[arg(long)]
    result_batches: Option<usize>,
    /// Force `WorkerConfig::prefetch`, tasks held per worker beyond its
    /// running ones (0: off; default: the library's default for the store).
    #[arg(long, conflicts_with = "prefetch_up_to")]
    prefetch: Option<usize>,
    /// Force `WorkerConfig::prefetch_up_to`: an adaptive buffer of at most
    /// this many tasks per worker.
    #[arg(long)]
    prefetch_up_to: Option<usize>,
    /// Queues the jobs are spread over (`bench` for 1, else `bench0`…),
    /// each worker serving all of them at `--concurrency` each: on a Redis
    /// Cluster each queue is a hash tag of its own, so they spread over
    /// the shards.
    #[arg(long, default_value_t = 1)]
    queues: usize,
    /// The queues by name, comma-separated (instead of `--queues`): e.g.
    /// `a,b,c`, whose tags hash to the three shards of a 3-master cluster
    /// (`bench1` and `bench2` share one).
    #[arg(long, value_delimiter = ',', conflicts_with = "queues")]
    queue_names: Vec<String>,
    /// Tasks per `enqueue_many` call while pre-inserting.
    #[arg(long, default_value_t = 10_000)]
    insert_batch: u64,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 900)]
    timeout: u64,
}

#[derive(Args)]
struct LatencyArgs {
    #[command(flatten)]
    common: Common,
    #[arg(long, default_value_t = 1000)]
    jobs: usize,
    /// Unmeasured jobs first (connections, prepared statements).
    #[arg(long, default_value_t = 20)]
    warmup: usize,
    /// Worker poll interval in ms (wake-ups normally arrive sooner).
    #[arg(long, default_value_t = 1000)]
    poll_ms: u64,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum FinishMode {
    /// Finish each claimed task with HandBack: it returns to pending, so the
    /// backlog stays at exactly --pending for the whole run.
    Handback,
    /// Finish each claimed task as succeeded (the backlog shrinks).
    Succeed,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum AnalyzeMode {
    None,
    Fresh,
    Both,
}

#[derive(Args)]
struct ClaimArgs {
    #[command(flatten)]
    common: Common,
    /// Pending tasks to insert before measuring.
    #[arg(long, default_value_t = 10_000)]
    pending: u64,
    #[arg(long, default_value_t = 4)]
    claimers: usize,
    /// Tasks per claim.
    #[arg(long, default_value_t = 10)]
    batch: u32,
    /// Seconds per measurement round.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// How each claimed task is finished.
    #[arg(long, value_enum, default_value_t = FinishMode::Handback)]
    finish: FinishMode,
    /// PostgreSQL: measure with no statistics (`none`), right after an
    /// ANALYZE (`fresh`), or first without and then with (`both`).
    #[arg(long, value_enum, default_value_t = AnalyzeMode::Both)]
    analyze: AnalyzeMode,
    /// Measurement rounds per phase (after one bulk insert).
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// PostgreSQL: print EXPLAIN (ANALYZE, BUFFERS) of one claim (rolled back) to stderr.
    #[arg(long)]
    explain: bool,
    #[arg(long, default_value_t = 10_000)]
    insert_batch: u64,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    let common = match &cli.cmd {
        Cmd::Lock(a) => &a.common,
        Cmd::QueueThroughput(a) => &a.common,
        Cmd::Latency(a) => &a.common,
        Cmd::ClaimScale(a) => &a.common,
        Cmd::SchedulePrecision(a) => &a.common,
        Cmd::Fleet(a) => &a.common,
    };
    let rt = match common.runtime {
        Flavor::Multi => tokio::runtime::Builder::new_multi_thread(),
        Flavor::Current => tokio::runtime::Builder::new_current_thread(),
    }
    .enable_all()
    .build()
    .context("building the tokio runtime")?;
    rt.block_on(async move {
        match cli.cmd {
            Cmd::Lock(a) => lock_bench(a).await,
            Cmd::QueueThroughput(a) => throughput_bench(a).await,
            Cmd::Latency(a) => latency_bench(a).await,
            Cmd::ClaimScale(a) => claim_bench(a).await,
            Cmd::SchedulePrecision(a) => precision_bench(a).await,
            Cmd::Fleet(a) => fleet::fleet_bench(a).await,
        }
    })
}

// ---- helpers -----------------------------------------------------------------

fn random_prefix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos())
        .unwrap_or(0);
    let mixed = (nanos as u64) ^ (u64::from(std::process::id()) << 40);
    // splitmix64 finaliser, so close timestamps give unrelated prefixes
    let mut z = mixed.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^= z >> 31;
    format!("bench_{:08x}_", z as u32)
}

struct Ctx {
    url: String,
    prefix: String,
    pool: u32,
    keep: bool,
    delete_succeeded: bool,
}

impl Ctx {
    fn new(c: &Common) -> Ctx {
        Ctx {
            url: c.store.clone(),
            prefix: c.prefix.clone().unwrap_or_else(random_prefix),
            pool: c.pool,
            keep: c.keep,
            delete_succeeded: c.delete_succeeded,
        }
    }

    async fn connect(&self) -> Result<Store> {
        Store::connect_with(
            &self.url,
            StoreOptions {
                prefix: Some(self.prefix.clone()),
                max_connections: self.pool,
                migrate: true,
                keep_succeeded: !self.delete_succeeded,
                ..Default::default()
            },
        )
        .await
        .with_context(|| format!("connecting to {}", baton::store::redact(&self.url)))
    }

    fn is_postgres(&self) -> bool {
        self.url.starts_with("postgres://") || self.url.starts_with("postgresql://")
    }

    fn tasks_table(&self) -> String {
        format!("{}tasks", self.prefix)
    }

    async fn pg(&self) -> Result<sqlx::PgConnection> {
        sqlx::PgConnection::connect(&self.url)
            .await
            .context("opening a diagnostic PostgreSQL connection")
    }

    fn is_mysql(&self) -> bool {
        self.url.starts_with("mysql://") || self.url.starts_with("mariadb://")
    }

    /// Drop this run's PostgreSQL or MySQL tables (SQLite files and Redis
    /// keys are removed by scripts/bench.sh).
    async fn cleanup(&self) -> Result<()> {
        if self.keep {
            return Ok(());
        }
        if self.is_mysql() {
            let url = self.url.replacen("mariadb://", "mysql://", 1);
            let mut c = sqlx::MySqlConnection::connect(&url)
                .await
                .context("opening a MySQL connection to drop the bench tables")?;
            for t in ["meta", "locks", "tasks", "jobs", "queues"] {
                sqlx::query(&format!("DROP TABLE IF EXISTS `{}{t}`", self.prefix))
                    .execute(&mut c)
                    .await?;
            }
            return Ok(());
        }
        if self.url.starts_with("redis://") || self.url.starts_with("rediss://") {
            return self.cleanup_redis().await;
        }
        if let Some(rest) = self.url.strip_prefix("redis+cluster://") {
            return self.cleanup_redis_cluster(rest).await;
        }
        if !self.is_postgres() {
            return Ok(());
        }
        let mut c = self.pg().await?;
        let p = &self.prefix;
        for t in ["meta", "locks", "tasks", "jobs", "queues"] {
            sqlx::query(&format!("DROP TABLE IF EXISTS \"{p}{t}\""))
                .execute(&mut c)
                .await?;
        }
        sqlx::query(&format!("DROP SEQUENCE IF EXISTS \"{p}tasks_id_seq\""))
            .execute(&mut c)
            .await?;
        Ok(())
    }

    /// [`Ctx::cleanup_redis`] on a Redis Cluster (`hosts` the URL after
    /// its scheme): the prefix's keys of every master, deleted one by one.
    async fn cleanup_redis_cluster(&self, hosts: &str) -> Result<()> {
        use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
        let hosts = hosts.split(['/', '?']).next().unwrap_or_default();
        let nodes: Vec<String> = hosts.split(',').map(|h| format!("redis://{h}")).collect();
        let mut c = redis::cluster::ClusterClient::new(nodes)
            .context("opening the Redis Cluster to clean up")?
            .get_async_connection()
            .await
            .context("connecting to the Redis Cluster to clean up")?;
        let mut keys_cmd = redis::cmd("KEYS");
        keys_cmd.arg(format!("{}*", self.prefix));
        let v = c
            .route_command(
                &keys_cmd,
                RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::CombineArrays),
                )),
            )
            .await?;
        let keys: Vec<String> = redis::from_redis_value(&v)?;
        for k in keys {
            let _: () = redis::cmd("UNLINK").arg(&k).query_async(&mut c).await?;
        }
        Ok(())
    }

    /// Delete every key of this run's prefix (a shared Redis otherwise
    /// keeps a throughput run's tens of thousands of keys, and listing
    /// locks there scans them all).
    async fn cleanup_redis(&self) -> Result<()> {
        let client = redis::Client::open(self.url.as_str()).context("opening Redis to clean up")?;
        let mut c = client
            .get_multiplexed_async_connection()
            .await
            .context("connecting to Redis to clean up")?;
        let pattern = format!("{}*", self.prefix);
        let mut cursor: u64 = 0;
        loop {
            let (next, keys): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(&pattern)
                .arg("COUNT")
                .arg(10_000)
                .query_async(&mut c)
                .await?;
            if !keys.is_empty() {
                let _: () = redis::cmd("UNLINK").arg(&keys).query_async(&mut c).await?;
            }
            if next == 0 {
                return Ok(());
            }
            cursor = next;
        }
    }
}

/// Latency samples in nanoseconds.
struct Samples(Vec<u64>);

impl Samples {
    fn new() -> Samples {
        Samples(Vec::new())
    }
    fn push(&mut self, d: Duration) {
        self.0.push(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX));
    }
    fn merge(&mut self, other: Samples) {
        self.0.extend(other.0);
    }
    fn finish(mut self) -> Sorted {
        self.0.sort_unstable();
        Sorted(self.0)
    }
}

struct Sorted(Vec<u64>);

impl Sorted {
    /// Nearest-rank percentile, in milliseconds.
    fn ms(&self, p: f64) -> f64 {
        if self.0.is_empty() {
            return f64::NAN;
        }
        let rank = ((p / 100.0) * self.0.len() as f64).ceil() as usize;
        let i = rank.clamp(1, self.0.len()) - 1;
        self.0[i] as f64 / 1e6
    }
    fn json(&self) -> Value {
        json!({
            "n": self.0.len(),
            "p50_ms": round3(self.ms(50.0)),
            "p90_ms": round3(self.ms(90.0)),
            "p99_ms": round3(self.ms(99.0)),
            "max_ms": round3(self.ms(100.0)),
        })
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn emit(v: Value, human: String) {
    println!("{v}");
    println!("# {human}");
}

async fn insert_jobs(q: &Queue, queue: &str, n: u64, batch: u64) -> Result<f64> {
    let t0 = Instant::now();
    let mut done = 0;
    while done < n {
        let k = batch.min(n - done);
        let tasks: Vec<TaskBuilder> = (done..done + k)
            .map(|i| TaskBuilder::new("noop", json!({ "id": i })).queue(queue))
            .collect();
        let out = q.enqueue_many(tasks).await.context("enqueue_many")?;
        if out.len() as u64 != k {
            bail!("enqueue_many returned {} results for {k} tasks", out.len());
        }
        done += k;
    }
    Ok(t0.elapsed().as_secs_f64())
}

// ---- lock ------------------------------------------------------------------------

async fn lock_bench(a: LockArgs) -> Result<()> {
    let ctx = Ctx::new(&a.common);
    let store = ctx.connect().await?;
    let kind = store.backend().kind();
    let locker = Locker::new(store.clone());
    let opts = LockOptions::new(Duration::from_secs(30))?.keep_alive(false);
    let measure = Duration::from_secs_f64(a.duration);
    let warmup = Duration::from_millis(500);
    let start = Instant::now() + warmup;
    let end = start + measure;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..a.concurrency {
        let locker = locker.clone();
        let store = store.clone();
        let api = a.api;
        set.spawn(async move {
            let name = format!("bench-lock-{i}");
            let holder = format!("bench:{i}");
            let (mut cycle, mut acq, mut rel) = (Samples::new(), Samples::new(), Samples::new());
            loop {
                let t0 = Instant::now();
                if t0 >= end {
                    break;
                }
                let t1 = match api {
                    LockApi::Locker => {
                        let lease = locker
                            .try_lock(&name, &opts)
                            .await?
                            .ok_or_else(|| anyhow!("lock {name} unexpectedly busy"))?;
                        let t1 = Instant::now();
                        lease.release().await?;
                        t1
                    }
                    LockApi::Raw => {
                        let b = store.backend();
                        let req = LockAcquire {
                            name: &name,
                            holder: &holder,
                            at_most: Duration::from_secs(30),
                        };
                        let token = match b.lock_acquire(&req).await? {
                            Acquire::Granted { token, .. } => token,
                            Acquire::Busy(_) => bail!("lock {name} unexpectedly busy"),
                        };
                        let t1 = Instant::now();
                        if !b
                            .lock_release(&baton::store::LockRelease {
                                name: &name,
                                token,
                                at_least: Duration::ZERO,
                            })
                            .await?
                        {
                            bail!("release of {name} refused");
                        }
                        t1
                    }
                };
                if t0 >= start {
                    let t2 = Instant::now();
                    cycle.push(t2 - t0);
                    acq.push(t1 - t0);
                    rel.push(t2 - t1);
                }
            }
            Ok::<_, anyhow::Error>((cycle, acq, rel))
        });
    }
    let (mut all, mut acq, mut rel) = (Samples::new(), Samples::new(), Samples::new());
    while let Some(r) = set.join_next().await {
        let (c, a, r) = r.context("lock loop panicked")??;
        all.merge(c);
        acq.merge(a);
        rel.merge(r);
    }
    let (lat, acq, rel) = (all.finish(), acq.finish(), rel.finish());
    let ops = lat.0.len() as f64 / measure.as_secs_f64();
    emit(
        json!({
            "bench": "lock", "store": kind, "api": match a.api { LockApi::Locker => "locker", LockApi::Raw => "raw" },
            "concurrency": a.concurrency, "duration_s": a.duration,
            "ops_per_s": round1(ops), "latency": lat.json(),
            "acquire_latency": acq.json(), "release_latency": rel.json(), "prefix": ctx.prefix,
        }),
        format!(
            "lock {kind} c={} : {:.0} acquire+release/s, cycle p50 {:.3} ms p99 {:.3} ms; acquire p50 {:.3} ms, release p50 {:.3} ms",
            a.concurrency,
            ops,
            lat.ms(50.0),
            lat.ms(99.0),
            acq.ms(50.0),
            rel.ms(50.0),
        ),
    );
    ctx.cleanup().await
}

// ---- queue throughput ----------------------------------------------------------

async fn throughput_bench(a: ThroughputArgs) -> Result<()> {
    let ctx = Ctx::new(&a.common);
    let store = ctx.connect().await?;
    let kind = store.backend().kind();
    let queues: Vec<String> = match a.queues {
        _ if !a.queue_names.is_empty() => a.queue_names.clone(),
        0 => bail!("--queues: at least 1"),
        1 => vec!["bench".to_string()],
        n => (0..n).map(|i| format!("bench{i}")).collect(),
    };
    let q = Queue::new(store.clone());
    let t_insert = Instant::now();
    for (i, queue) in queues.iter().enumerate() {
        // The jobs split evenly, the first queues taking the remainder.
        let n = a.jobs / queues.len() as u64 + u64::from((i as u64) < a.jobs % queues.len() as u64);
        insert_jobs(&q, queue, n, a.insert_batch).await?;
    }
    let insert_s = t_insert.elapsed().as_secs_f64();

    let started = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    let mut cfg = WorkerConfig::default();
    for queue in &queues {
        cfg = cfg.queue(queue.as_str(), a.concurrency);
    }
    if a.hold_slots {
        cfg = cfg.free_slot_on_return(false);
    }
    if let Some(on) = a.free_slots {
        cfg = cfg.free_slot_on_return(on == OnOff::On);
    }
    if let Some(n) = a.result_batches {
        cfg = cfg.result_batches_in_flight(n);
    }
    if let Some(n) = a.prefetch {
        cfg = cfg.prefetch(n);
    }
    if let Some(n) = a.prefetch_up_to {
        cfg = cfg.prefetch_up_to(n);
    }
    // What the workers run with: the knobs forced above, the store's
    // defaults for the rest.
    let used = cfg.clone().with_store_defaults(kind);
    for _ in 0..a.workers {
        let s = ctx.connect().await?;
        let mut w = Worker::new(s, cfg.clone())?;
        let c = started.clone();
        w.handle("noop", move |_ctx| {
            c.fetch_add(1, Ordering::Relaxed);
            async { Ok::<(), TaskError>(()) }
        });
        workers.push(w);
    }
    let shutdown = CancellationToken::new();
    let t0 = Instant::now();
    let handles: Vec<_> = workers
        .into_iter()
        .map(|w| tokio::spawn(w.run(shutdown.clone())))
        .collect();
    let deadline = t0 + Duration::from_secs(a.timeout);
    while started.load(Ordering::Relaxed) < a.jobs {
        if Instant::now() > deadline {
            shutdown.cancel();
            bail!(
                "timed out: {} of {} handlers started",
                started.load(Ordering::Relaxed),
                a.jobs
            );
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let handlers_done = t0.elapsed().as_secs_f64();
    loop {
        let st = q.stats().await?;
        let (succeeded, left, bad) =
            st.iter()
                .filter(|s| queues.contains(&s.queue))
                .fold((0, 0, 0), |(d, l, b), s| {
                    (
                        d + s.succeeded,
                        l + s.pending + s.running,
                        b + s.failed + s.cancelled,
                    )
                });
        if bad > 0 {
            shutdown.cancel();
            bail!("{bad} tasks failed or were cancelled");
        }
        // Deleted on success: done when none is left to run.
        if succeeded >= a.jobs || (ctx.delete_succeeded && left == 0) {
            break;
        }
        if Instant::now() > deadline {
            shutdown.cancel();
            bail!("timed out: {succeeded} of {} succeeded", a.jobs);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let drain_s = t0.elapsed().as_secs_f64();
    shutdown.cancel();
    for h in handles {
        h.await.context("worker panicked")??;
    }
    let jobs_per_s = a.jobs as f64 / drain_s;
    let insert_per_s = a.jobs as f64 / insert_s;
    emit(
        json!({
            "bench": "queue-throughput", "store": kind, "jobs": a.jobs, "workers": a.workers,
            "queues": queues.len(), "queue_names": queues, "cluster": ctx.url.contains("+cluster://"),
            "concurrency": a.concurrency, "pool": ctx.pool,
            "insert_s": round3(insert_s), "insert_per_s": round1(insert_per_s),
            "drain_s": round3(drain_s), "handlers_done_s": round3(handlers_done),
            "jobs_per_s": round1(jobs_per_s), "prefix": ctx.prefix,
            "delete_succeeded": ctx.delete_succeeded,
            "hold_slots": !used.free_slot_on_return_on(),
            "result_batches": used.result_batches(),
            "prefetch": used.prefetch_tasks(),
            "prefetch_adaptive": used.prefetch_adaptive(),
        }),
        format!(
            "queue-throughput {kind}{}: {} queue(s), insert {:.0}/s ({insert_s:.2} s), drain {:.0} jobs/s ({drain_s:.2} s) with {}x{} (free slots on return {}, {} result batches, prefetch {}{})",
            if ctx.url.contains("+cluster://") { " (cluster)" } else { "" }, queues.len(),
            insert_per_s, jobs_per_s, a.workers, a.concurrency,
            used.free_slot_on_return_on(), used.result_batches(),
            if used.prefetch_adaptive() { "up to " } else { "" }, used.prefetch_tasks()
        ),
    );
    ctx.cleanup().await
}

// ---- latency -------------------------------------------------------------------

async fn latency_bench(a: LatencyArgs) -> Result<()> {
    let ctx = Ctx::new(&a.common);
    let store = ctx.connect().await?;
    let kind = store.backend().kind();
    let queue = "latency";
    let q = Queue::new(store.clone());
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(u64, Instant)>();
    let cfg = WorkerConfig::default()
        .queue(queue, 4)
        .poll_interval(Duration::from_millis(a.poll_ms));
    let mut w = Worker::new(ctx.connect().await?, cfg)?;
    w.handle("ping", move |tctx| {
        let at = Instant::now();
        let seq = tctx.task().payload["seq"].as_u64().unwrap_or(u64::MAX);
        let _ = tx.send((seq, at));
        async { Ok::<(), TaskError>(()) }
    });
    let shutdown = CancellationToken::new();
    let handle = tokio::spawn(w.run(shutdown.clone()));
    // Let the worker subscribe and go idle.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut lat = Samples::new();
    let mut enq = Samples::new();
    for i in 0..(a.warmup + a.jobs) as u64 {
        let t0 = Instant::now();
        q.enqueue(TaskBuilder::new("ping", json!({ "seq": i })).queue(queue))
            .await?;
        let t1 = Instant::now();
        let at = loop {
            let got = tokio::time::timeout(Duration::from_secs(30), rx.recv())
                .await
                .map_err(|_| anyhow!("job {i}: handler did not start within 30 s"))?
                .ok_or_else(|| anyhow!("worker stopped"))?;
            if got.0 == i {
                break got.1;
            }
        };
        if i >= a.warmup as u64 {
            lat.push(at.saturating_duration_since(t0));
            enq.push(t1 - t0);
        }
        // Let the handler's finish land so the worker is idle again.
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    shutdown.cancel();
    handle.await.context("worker panicked")??;
    let lat = lat.finish();
    let enq = enq.finish();
    emit(
        json!({
            "bench": "latency", "store": kind, "jobs": a.jobs, "poll_ms": a.poll_ms,
            "enqueue_to_start": lat.json(), "enqueue_call": enq.json(), "prefix": ctx.prefix,
        }),
        format!(
            "latency {kind}: enqueue->start p50 {:.3} ms, p99 {:.3} ms (enqueue call p50 {:.3} ms)",
            lat.ms(50.0),
            lat.ms(99.0),
            enq.ms(50.0)
        ),
    );
    ctx.cleanup().await
}

// ---- claim scale ---------------------------------------------------------------

async fn pg_stats_state(ctx: &Ctx) -> Result<Value> {
    let mut c = ctx.pg().await?;
    let row: Option<(i64, i64, i64)> = sqlx::query_as(
        "SELECT n_live_tup, analyze_count, autoanalyze_count FROM pg_stat_user_tables \
         WHERE relname = $1",
    )
    .bind(ctx.tasks_table())
    .fetch_optional(&mut c)
    .await?;
    let stats_rows: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stats WHERE schemaname = current_schema() AND tablename = $1",
    )
    .bind(ctx.tasks_table())
    .fetch_one(&mut c)
    .await?;
    let reltuples: Option<f32> =
        sqlx::query_scalar("SELECT reltuples FROM pg_class WHERE oid = to_regclass($1)")
            .bind(format!("\"{}\"", ctx.tasks_table()))
            .fetch_optional(&mut c)
            .await?;
    Ok(match row {
        Some((live, an, auto)) => json!({
            "n_live_tup": live, "analyze_count": an, "autoanalyze_count": auto,
            "pg_stats_columns": stats_rows, "reltuples": reltuples,
        }),
        None => json!(null),
    })
}

/// EXPLAIN (ANALYZE, BUFFERS) of one claim (custom plan) and the generic
/// plan, each in a transaction that is rolled back: the library's own
/// claim statement.
async fn pg_explain_claim(ctx: &Ctx, queue: &str, limit: u32) -> Result<String> {
    let mut c = ctx.pg().await?;
    let p = Some(ctx.prefix.as_str());
    let custom =
        baton::store::postgres::explain_claim(&mut c, p, queue, limit, false, true).await?;
    let generic =
        baton::store::postgres::explain_claim(&mut c, p, queue, limit, true, false).await?;
    Ok(format!(
        "EXPLAIN ANALYZE (custom):\n{custom}\nEXPLAIN (generic plan):\n{generic}"
    ))
}

struct Round {
    rate: f64,
    claims_per_s: f64,
    empty: u64,
    claim_lat: Sorted,
    finish_lat: Sorted,
}

async fn claim_round(store: &Store, queue: &'static str, a: &ClaimArgs) -> Result<Round> {
    let measure = Duration::from_secs_f64(a.duration);
    let claimed = Arc::new(AtomicU64::new(0));
    let t0 = Instant::now();
    let end = t0 + measure;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..a.claimers {
        let store = store.clone();
        let claimed = claimed.clone();
        let (batch, mode) = (a.batch, a.finish);
        set.spawn(async move {
            let worker = format!("bench-claimer-{i}");
            let b = store.backend();
            let mut claim_lat = Samples::new();
            let mut finish_lat = Samples::new();
            let mut empty = 0u64;
            let finish = match mode {
                FinishMode::Handback => Finish::HandBack,
                FinishMode::Succeed => Finish::Succeeded,
            };
            while Instant::now() < end {
                let c0 = Instant::now();
                let got = b
                    .task_claim(&TaskClaim {
                        queue,
                        worker: &worker,
                        limit: batch,
                        lease: Duration::from_secs(60),
                        max_running: None,
                        buffered: 0,
                    })
                    .await?;
                claim_lat.push(c0.elapsed());
                if got.is_empty() {
                    empty += 1;
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                claimed.fetch_add(got.len() as u64, Ordering::Relaxed);
                for t in got {
                    let f0 = Instant::now();
                    let ok = b
                        .task_finish_many(&[(t.claim(), finish.clone())])
                        .await
                        .map(|r| r == [true])?;
                    finish_lat.push(f0.elapsed());
                    if !ok {
                        bail!("finish of task {} refused", t.id);
                    }
                }
            }
            Ok::<_, anyhow::Error>((claim_lat, finish_lat, empty))
        });
    }
    let mut claim_lat = Samples::new();
    let mut finish_lat = Samples::new();
    let mut empty = 0;
    while let Some(r) = set.join_next().await {
        let (c, f, e) = r.context("claimer panicked")??;
        claim_lat.merge(c);
        finish_lat.merge(f);
        empty += e;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let n = claimed.load(Ordering::Relaxed);
    let claim_lat = claim_lat.finish();
    Ok(Round {
        rate: n as f64 / elapsed,
        claims_per_s: claim_lat.0.len() as f64 / elapsed,
        empty,
        claim_lat,
        finish_lat: finish_lat.finish(),
    })
}

fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(|a, b| a.total_cmp(b));
    if s.is_empty() {
        f64::NAN
    } else {
        s[s.len() / 2]
    }
}

async fn claim_bench(a: ClaimArgs) -> Result<()> {
    let ctx = Ctx::new(&a.common);
    let store = ctx.connect().await?;
    let kind = store.backend().kind();
    let queue = "claims";
    let q = Queue::new(store.clone());
    let insert_s = insert_jobs(&q, queue, a.pending, a.insert_batch).await?;
    let pg = ctx.is_postgres();
    // Phases: PostgreSQL runs with no statistics (fresh table; the shared
    // server has autovacuum off, and we record whether anything analyzed it)
    // and/or right after an ANALYZE.
    let phases: Vec<&str> = match (pg, a.analyze) {
        (false, _) => vec!["-"],
        (true, AnalyzeMode::None) => vec!["no-stats"],
        (true, AnalyzeMode::Fresh) => vec!["analyzed"],
        (true, AnalyzeMode::Both) => vec!["no-stats", "analyzed"],
    };
    for phase in phases {
        let mut stats_before = Value::Null;
        if pg {
            if phase == "analyzed" {
                let mut c = ctx.pg().await?;
                sqlx::query(&format!("ANALYZE \"{}\"", ctx.tasks_table()))
                    .execute(&mut c)
                    .await?;
            }
            stats_before = pg_stats_state(&ctx).await?;
            if a.explain {
                eprintln!(
                    "== {kind} pending={} {phase}\n{}",
                    a.pending,
                    pg_explain_claim(&ctx, queue, a.batch).await?
                );
            }
        }
        let mut rounds = Vec::new();
        for _ in 0..a.rounds {
            rounds.push(claim_round(&store, queue, &a).await?);
        }
        let stats_after = if pg {
            pg_stats_state(&ctx).await?
        } else {
            Value::Null
        };
        let rates: Vec<f64> = rounds.iter().map(|r| r.rate).collect();
        let med = median(&rates);
        let p50s: Vec<f64> = rounds.iter().map(|r| r.claim_lat.ms(50.0)).collect();
        let pending_after = q
            .stats()
            .await?
            .iter()
            .find(|s| s.queue == queue)
            .map(|s| s.pending)
            .unwrap_or(0);
        emit(
            json!({
                "bench": "claim-scale", "store": kind, "pending": a.pending, "claimers": a.claimers,
                "batch": a.batch, "phase": phase,
                "finish": match a.finish { FinishMode::Handback => "handback", FinishMode::Succeed => "succeed" },
                "insert_s": round3(insert_s), "insert_per_s": round1(a.pending as f64 / insert_s),
                "round_s": a.duration,
                "claimed_per_s_median": round1(med),
                "rounds": rounds.iter().map(|r| json!({
                    "claimed_per_s": round1(r.rate), "claims_per_s": round1(r.claims_per_s),
                    "empty_claims": r.empty, "claim_latency": r.claim_lat.json(),
                    "finish_latency": r.finish_lat.json(),
                })).collect::<Vec<_>>(),
                "pending_after": pending_after, "pg_stats_before": stats_before,
                "pg_stats_after": stats_after, "prefix": ctx.prefix,
            }),
            format!(
                "claim-scale {kind} pending={} {phase}: median {:.0} tasks claimed+finished/s over {} rounds {:?}, claim p50 {:?} ms (insert {:.0}/s)",
                a.pending,
                med,
                rounds.len(),
                rates.iter().map(|r| r.round() as i64).collect::<Vec<_>>(),
                p50s.iter().map(|x| round3(*x)).collect::<Vec<_>>(),
                a.pending as f64 / insert_s
            ),
        );
    }
    ctx.cleanup().await
}

// ---- schedule precision ----------------------------------------------------------

async fn precision_bench(a: PrecisionArgs) -> Result<()> {
    use baton::clock::StoreClock;
    use baton::schedule::{spec::Schedule, Job, Scheduler};
    use baton::store::{TaskFilter, TaskState, OVERLAP_SKIPPED};
    use std::collections::BTreeMap;

    if a.instances == 0 || a.seconds < 5 || a.every_ms == 0 {
        bail!("--instances must be at least 1, --seconds at least 5, --every-ms at least 1");
    }
    let ctx = Ctx::new(&a.common);
    let store = ctx.connect().await?;
    let kind = store.backend().kind();
    let queue = "precision";
    let every = Duration::from_millis(a.every_ms);
    let mut job = Job::new("tick", Schedule::every(every)?).queue(queue);
    if let Some(ms) = a.lead_ms {
        job.lead = Duration::from_millis(ms);
    }
    // (slot, start in the instance's estimate of store time) per handler start.
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(
        chrono::DateTime<chrono::Utc>,
        chrono::DateTime<chrono::Utc>,
    )>();
    let stop = CancellationToken::new();
    let mut runs = Vec::new();
    for _ in 0..a.instances {
        let handle = ctx.connect().await?;
        let clock = StoreClock::new(handle.clone()).await?;
        clock.recalibrate_best_of(5).await;
        let cfg = WorkerConfig::default()
            .queue(queue, 4)
            .poll_interval(Duration::from_millis(a.poll_ms));
        let mut w = Worker::new(handle.clone(), cfg)?;
        let tx = tx.clone();
        w.handle("tick", move |tctx| {
            let at = clock.now();
            if let Some(slot) = tctx.task().slot {
                let _ = tx.send((slot, at));
            }
            async { Ok::<(), TaskError>(()) }
        });
        let mut sched = Scheduler::new(handle);
        sched.add(job.clone())?;
        runs.push(tokio::spawn(w.run(stop.clone())));
        runs.push(tokio::spawn(sched.run(stop.clone())));
    }
    drop(tx);
    let started = store.now().await?;
    tokio::time::sleep(Duration::from_secs(a.seconds)).await;
    let ended = store.now().await?;
    // Let the last slot's run finish, then stop everyone.
    tokio::time::sleep(every.min(Duration::from_secs(2))).await;
    stop.cancel();
    for r in runs {
        r.await.context("instance panicked")??;
    }
    let mut starts: BTreeMap<chrono::DateTime<chrono::Utc>, Vec<chrono::DateTime<chrono::Utc>>> =
        BTreeMap::new();
    while let Some((slot, at)) = rx.recv().await {
        starts.entry(slot).or_default().push(at);
    }
    // Every task the job made (skipped slots are cancelled tasks).
    let mut tasks = Vec::new();
    let mut before = None;
    loop {
        let page = store
            .backend()
            .task_list(&TaskFilter {
                job: Some("tick".into()),
                before_id: before,
                limit: 1000,
                ..Default::default()
            })
            .await?;
        let Some(last) = page.last() else { break };
        before = Some(last.id);
        tasks.extend(page);
    }
    let skipped = tasks
        .iter()
        .filter(|t| {
            t.state == TaskState::Cancelled && t.last_error.as_deref() == Some(OVERLAP_SKIPPED)
        })
        .count();
    // The slots the run covered: after the first second (registration) up
    // to the end; each should have run exactly once.
    let step = chrono::Duration::from_std(every)?;
    let first = starts
        .keys()
        .next()
        .copied()
        .ok_or_else(|| anyhow!("no slot ran at all"))?;
    let mut expected = 0usize;
    let mut missed = 0usize;
    let mut doubled = 0usize;
    let mut lat = Samples::new();
    let mut early = 0usize;
    let mut slot = first;
    while slot <= ended {
        expected += 1;
        match starts.get(&slot) {
            None => missed += 1,
            Some(v) => {
                if v.len() > 1 {
                    doubled += 1;
                }
                let d = v[0] - slot;
                match d.to_std() {
                    Ok(d) => lat.push(d),
                    Err(_) => {
                        early += 1;
                        lat.push(Duration::ZERO);
                    }
                }
            }
        }
        slot += step;
    }
    let lat = lat.finish();
    let phases = precision_phases(&starts, &tasks, first, ended, step);
    emit(
        json!({
            "bench": "schedule_precision", "store": kind, "instances": a.instances,
            "seconds": a.seconds, "every_ms": a.every_ms, "poll_ms": a.poll_ms,
            "lead_ms": job.lead.as_millis() as u64,
            "slots": expected, "slot_to_start": lat.json(), "skipped": skipped,
            "missed": missed, "doubled": doubled, "early": early,
            "first_slot_after_start_ms": (first - started).num_milliseconds(),
            "phases": phases.json, "worst": phases.worst, "missed_detail": phases.missed,
            "prefix": ctx.prefix,
        }),
        format!(
            "schedule precision {kind}: {} instances, {expected} slots of {} ms, lead {} ms: slot->start p50 {:.3} ms, p99 {:.3} ms, max {:.3} ms; skipped {skipped}, missed {missed}, doubled {doubled}",
            a.instances,
            a.every_ms,
            job.lead.as_millis(),
            lat.ms(50.0),
            lat.ms(99.0),
            lat.ms(100.0)
        ) + &phases.human,
    );
    ctx.cleanup().await
}

/// Where a slot's lateness comes from, by the store's records of its task.
struct Phases {
    json: Value,
    worst: Vec<String>,
    missed: Vec<String>,
    human: String,
}

/// Per slot that ran: its task enqueued (`created_at - slot`; negative is
/// ahead, the lead), claimed (`started_at - slot`), and the handler started
/// (`start - started_at`, the start in the instance's store-clock
/// estimate); p50 / p99 / max of each, the three latest slots with their
/// phases, and for each missed slot the tasks the store holds for it.
fn precision_phases(
    starts: &std::collections::BTreeMap<
        chrono::DateTime<chrono::Utc>,
        Vec<chrono::DateTime<chrono::Utc>>,
    >,
    tasks: &[baton::store::TaskInfo],
    first: chrono::DateTime<chrono::Utc>,
    ended: chrono::DateTime<chrono::Utc>,
    step: chrono::Duration,
) -> Phases {
    use std::collections::BTreeMap;
    let ms = |d: chrono::Duration| d.num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0;
    let mut by_slot: BTreeMap<_, Vec<&baton::store::TaskInfo>> = BTreeMap::new();
    for t in tasks {
        if let Some(slot) = t.slot {
            by_slot.entry(slot).or_default().push(t);
        }
    }
    let (mut enq, mut claim, mut handler) = (Vec::new(), Vec::new(), Vec::new());
    let mut worst: Vec<(f64, String)> = Vec::new();
    let mut missed = Vec::new();
    let mut slot = first;
    while slot <= ended {
        let ts = by_slot.get(&slot).map(Vec::as_slice).unwrap_or_default();
        let describe = |t: &baton::store::TaskInfo| {
            format!(
                "task {} {:?} attempt {} created {:+.1} ms started {} finished {} error {:?}",
                t.id,
                t.state,
                t.attempt,
                ms(t.created_at - slot),
                t.started_at
                    .map_or("-".into(), |s| format!("{:+.1} ms", ms(s - slot))),
                t.finished_at
                    .map_or("-".into(), |s| format!("{:+.1} ms", ms(s - slot))),
                t.last_error
            )
        };
        match starts.get(&slot).and_then(|v| v.first()) {
            None => {
                let text: Vec<String> = ts.iter().map(|t| describe(t)).collect();
                missed.push(format!(
                    "{slot}: {}",
                    if text.is_empty() {
                        "no task".to_string()
                    } else {
                        text.join("; ")
                    }
                ));
            }
            Some(&at) => {
                if let Some(t) = ts.iter().find(|t| t.started_at.is_some()) {
                    let e = ms(t.created_at - slot);
                    let c = t.started_at.map_or(f64::NAN, |s| ms(s - slot));
                    let h = t.started_at.map_or(f64::NAN, |s| ms(at - s));
                    enq.push(e);
                    claim.push(c);
                    handler.push(h);
                    worst.push((
                        ms(at - slot),
                        format!(
                            "{slot}: start {:+.1} ms = enqueued {e:+.1} ms, claimed {c:+.1} ms, handler {h:+.1} ms after the claim",
                            ms(at - slot)
                        ),
                    ));
                }
            }
        }
        slot += step;
    }
    worst.sort_by(|a, b| b.0.total_cmp(&a.0));
    let worst: Vec<String> = worst.into_iter().take(3).map(|w| w.1).collect();
    let stats = |v: &mut Vec<f64>| {
        v.sort_by(f64::total_cmp);
        let at = |p: f64| {
            v.get(((v.len() as f64 - 1.0) * p / 100.0).round() as usize)
                .copied()
                .map_or(Value::Null, |x| json!(round3(x)))
        };
        json!({"p50_ms": at(50.0), "p99_ms": at(99.0), "max_ms": at(100.0)})
    };
    let json = json!({
        "enqueued": stats(&mut enq), "claimed": stats(&mut claim), "handler": stats(&mut handler),
    });
    let mut human = format!(
        "\n  phases (ms from the slot; p50 / p99 / max): enqueued {} / {} / {}, claimed {} / {} / {}; handler after claim {} / {} / {}",
        json["enqueued"]["p50_ms"], json["enqueued"]["p99_ms"], json["enqueued"]["max_ms"],
        json["claimed"]["p50_ms"], json["claimed"]["p99_ms"], json["claimed"]["max_ms"],
        json["handler"]["p50_ms"], json["handler"]["p99_ms"], json["handler"]["max_ms"],
    );
    for w in &worst {
        human += &format!("\n  late: {w}");
    }
    for m in &missed {
        human += &format!("\n  missed: {m}");
    }
    Phases {
        json,
        worst,
        missed,
        human,
    }
}
