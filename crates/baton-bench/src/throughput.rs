//! `baton-bench queue-throughput`: pre-insert tasks, then drain them
//! with several workers (graphile-worker's perfTest shape).

use super::*;

#[derive(Args)]
pub(super) struct ThroughputArgs {
    #[command(flatten)]
    pub(super) common: Common,
    #[arg(long, default_value_t = 200_000)]
    pub(super) jobs: u64,
    /// Worker instances, each with its own store handle (own pool).
    #[arg(long, default_value_t = 4)]
    pub(super) workers: usize,
    /// Concurrency per worker.
    #[arg(long, default_value_t = 24)]
    pub(super) concurrency: usize,
    /// Keep each slot until its result is acknowledged
    /// (`WorkerConfig::free_slot_on_return(false)`); same as
    /// `--free-slots off`.
    #[arg(long, conflicts_with = "free_slots")]
    pub(super) hold_slots: bool,
    /// Force `WorkerConfig::free_slot_on_return` on or off (default: the
    /// library's default for the store).
    #[arg(long, value_enum)]
    pub(super) free_slots: Option<OnOff>,
    /// Force `WorkerConfig::result_batches_in_flight` (default: the
    /// library's default for the store).
    #[arg(long)]
    pub(super) result_batches: Option<usize>,
    /// Force `WorkerConfig::prefetch`, tasks held per worker beyond its
    /// running ones (0: off; default: the library's default for the store).
    #[arg(long, conflicts_with = "prefetch_up_to")]
    pub(super) prefetch: Option<usize>,
    /// Force `WorkerConfig::prefetch_up_to`: an adaptive buffer of at most
    /// this many tasks per worker.
    #[arg(long)]
    pub(super) prefetch_up_to: Option<usize>,
    /// Queues the jobs are spread over (`bench` for 1, else `bench0`…),
    /// each worker serving all of them at `--concurrency` each: on a Redis
    /// Cluster each queue is a hash tag of its own, so they spread over
    /// the shards.
    #[arg(long, default_value_t = 1)]
    pub(super) queues: usize,
    /// The queues by name, comma-separated (instead of `--queues`): e.g.
    /// `a,b,c`, whose tags hash to the three shards of a 3-master cluster
    /// (`bench1` and `bench2` share one).
    #[arg(long, value_delimiter = ',', conflicts_with = "queues")]
    pub(super) queue_names: Vec<String>,
    /// Tasks per `enqueue_many` call while pre-inserting.
    #[arg(long, default_value_t = 10_000)]
    pub(super) insert_batch: u64,
    /// Give each task a concurrency key, `k0`…`k{N-1}` round-robin
    /// (0: none).
    #[arg(long, default_value_t = 0)]
    pub(super) keys: u64,
    /// Cap each key at this many running tasks per queue, cluster-wide
    /// (`WorkerConfig::per_key_max_running`; needs `--keys`).
    #[arg(long, requires = "keys")]
    pub(super) per_key_cap: Option<u32>,
    /// Hold each key to this rate of starts, e.g. `1000/1s`
    /// (`WorkerConfig::per_key_rate_limit`; needs `--keys`).
    #[arg(long, requires = "keys")]
    pub(super) per_key_rate: Option<baton::queue::RateLimit>,
    /// Claim fairly across the keys (`WorkerConfig::fair`).
    #[arg(long)]
    pub(super) fair: bool,
    /// Give up after this many seconds.
    #[arg(long, default_value_t = 900)]
    pub(super) timeout: u64,
}

pub(super) async fn throughput_bench(a: ThroughputArgs) -> Result<()> {
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
        insert_keyed_jobs(&q, queue, n, a.insert_batch, a.keys).await?;
    }
    let insert_s = t_insert.elapsed().as_secs_f64();

    let started = Arc::new(AtomicU64::new(0));
    let mut workers = Vec::new();
    let mut cfg = WorkerConfig::default();
    for queue in &queues {
        cfg = cfg.queue(queue.as_str(), a.concurrency);
        if let Some(cap) = a.per_key_cap {
            cfg = cfg.per_key_max_running(queue.as_str(), cap);
        }
        if let Some(rate) = a.per_key_rate {
            cfg = cfg.per_key_rate_limit(queue.as_str(), rate);
        }
        if a.fair {
            cfg = cfg.fair(queue.as_str());
        }
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
    // Each worker's counters: an attempt counts as ended once the store
    // answered its result's write.
    let counters: Vec<_> = workers.iter().map(Worker::counters).collect();
    let succeeded_answered = || -> u64 {
        counters
            .iter()
            .flat_map(|c| c.snapshot().into_values())
            .map(|q| {
                q.ended
                    .get(&baton::queue::Outcome::Succeeded)
                    .copied()
                    .unwrap_or(0)
            })
            .sum()
    };
    let shutdown = CancellationToken::new();
    let (t0, cpu0) = (Instant::now(), cpu_s());
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
    // The drain ends when the store has answered every success's write
    // (the ceiling's end: its last finish's changed rows), counted by the
    // workers in memory; polling `Queue::stats()` here instead, a scan of
    // the whole tasks table each time (55 ms for 100,000 rows on SQLite),
    // cost the drain's tail 60-190 ms (docs/BENCHMARKS.md session 41).
    // The store's own counts are checked after the clock stops.
    let mut next_check = Instant::now() + Duration::from_millis(500);
    while succeeded_answered() < a.jobs {
        // A task that failed or was cancelled never counts: look at the
        // store now and then, as the loop below does.
        if Instant::now() > next_check {
            next_check = Instant::now() + Duration::from_millis(500);
            let (_, _, bad) = store_counts(&q, &queues).await?;
            if bad > 0 {
                shutdown.cancel();
                bail!("{bad} tasks failed or were cancelled");
            }
        }
        if Instant::now() > deadline {
            shutdown.cancel();
            bail!(
                "timed out: {} of {} successes answered",
                succeeded_answered(),
                a.jobs
            );
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let drain_s = t0.elapsed().as_secs_f64();
    let cpu = cpu_us_per_task(cpu0, a.jobs);
    // How long after that the store's own counts agreed (0 but for the
    // stats call itself: an answer comes after the commit).
    loop {
        let (succeeded, left, bad) = store_counts(&q, &queues).await?;
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
    let store_agreed_s = t0.elapsed().as_secs_f64() - drain_s;
    shutdown.cancel();
    for h in handles {
        h.await.context("worker panicked")??;
    }
    let jobs_per_s = a.jobs as f64 / drain_s;
    let insert_per_s = a.jobs as f64 / insert_s;
    // The first queue's bound (a plain queue's is larger on PostgreSQL and
    // MySQL: `WorkerConfig::prefetch_tasks_of`).
    let prefetch = queues
        .first()
        .map_or(used.prefetch_tasks(), |q| used.prefetch_tasks_of(q));
    emit(
        json!({
            "bench": "queue-throughput", "store": kind, "jobs": a.jobs, "workers": a.workers,
            "queues": queues.len(), "queue_names": queues, "cluster": ctx.url.contains("+cluster://"),
            "concurrency": a.concurrency, "pool": ctx.pool,
            "keys": a.keys, "per_key_cap": a.per_key_cap, "fair": a.fair,
            "per_key_rate": a.per_key_rate.map(|r| r.to_string()),
            "insert_s": round3(insert_s), "insert_per_s": round1(insert_per_s),
            "drain_s": round3(drain_s), "handlers_done_s": round3(handlers_done),
            "store_agreed_after_s": round3(store_agreed_s),
            "jobs_per_s": round1(jobs_per_s), "prefix": ctx.prefix,
            "client_cpu_us_per_task": cpu,
            "delete_succeeded": ctx.delete_succeeded,
            "hold_slots": !used.free_slot_on_return_on(),
            "result_batches": used.result_batches(),
            "prefetch": prefetch,
            "prefetch_adaptive": used.prefetch_adaptive(),
        }),
        format!(
            "queue-throughput {kind}{}{}{}: {} queue(s), insert {:.0}/s ({insert_s:.2} s), drain {:.0} jobs/s ({drain_s:.2} s) with {}x{} (free slots on return {}, {} result batches, prefetch {}{})",
            if ctx.url.contains("+cluster://") { " (cluster)" } else { "" },
            match (a.keys, a.per_key_cap) {
                (0, _) => String::new(),
                (k, None) => format!(" ({k} keys, no cap)"),
                (k, Some(c)) => format!(" ({k} keys, cap {c} per key)"),
            },
            match (a.fair, a.per_key_rate) {
                (true, _) => " fair".to_string(),
                (false, Some(r)) => format!(" rate {r} per key"),
                (false, None) => String::new(),
            },
            queues.len(),
            insert_per_s, jobs_per_s, a.workers, a.concurrency,
            used.free_slot_on_return_on(), used.result_batches(),
            if used.prefetch_adaptive() { "up to " } else { "" }, prefetch
        ),
    );
    ctx.cleanup().await
}

/// The store's counts over `queues` (one `Queue::stats()` call): tasks
/// succeeded, left to run (pending or running), failed or cancelled.
async fn store_counts(q: &Queue, queues: &[String]) -> Result<(u64, u64, u64)> {
    Ok(q.stats()
        .await?
        .iter()
        .filter(|s| queues.contains(&s.queue))
        .fold((0, 0, 0), |(d, l, b), s| {
            (
                d + s.succeeded,
                l + s.pending + s.running,
                b + s.failed + s.cancelled,
            )
        }))
}
