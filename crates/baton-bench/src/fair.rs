//! `baton-bench fair-latency`: the checked-by scenario of fair claiming
//! (issue 25): a backlog of one key (`A`) being worked, then a few tasks of
//! another key (`B`); how long until `B`'s tasks start, with fair claiming
//! off and on, against `B`'s tasks on an empty queue (same workers). One
//! run does the three side by side, `--reps` times, and reports medians.

use std::sync::Mutex;

use super::*;

#[derive(Args)]
pub(super) struct FairArgs {
    #[command(flatten)]
    pub(super) common: Common,
    /// Tasks of key `A` pending before `B`'s arrive.
    #[arg(long, default_value_t = 100_000)]
    pub(super) backlog: u64,
    /// Tasks of key `B`.
    #[arg(long, default_value_t = 10)]
    pub(super) small: u64,
    /// Worker instances, each with its own store handle.
    #[arg(long, default_value_t = 2)]
    pub(super) workers: usize,
    /// Concurrency per worker.
    #[arg(long, default_value_t = 8)]
    pub(super) concurrency: usize,
    /// How long each handler runs, in ms.
    #[arg(long, default_value_t = 20)]
    pub(super) task_ms: u64,
    /// How long the workers run on the backlog before `B`'s tasks are
    /// enqueued, in ms.
    #[arg(long, default_value_t = 500)]
    pub(super) settle_ms: u64,
    /// Repetitions of the three cases.
    #[arg(long, default_value_t = 3)]
    pub(super) reps: usize,
    /// Give up on `B`'s tasks after this many seconds (reported as not
    /// started).
    #[arg(long, default_value_t = 20)]
    pub(super) timeout: u64,
    /// Cases to leave out (`empty`, `off`, `urgent`, `on`), e.g. `off`,
    /// which waits out `--timeout` every repetition.
    #[arg(long, value_delimiter = ',')]
    pub(super) skip: Vec<String>,
    /// Tasks per `enqueue_many` call while pre-inserting.
    #[arg(long, default_value_t = 10_000)]
    pub(super) insert_batch: u64,
}

/// A case: its name, whether `A`'s backlog is there, whether the queue is
/// fair, and `B`'s priority.
type Case = (&'static str, bool, bool, i32);

/// The cases: `B` alone; behind the backlog in order; behind it with `B`
/// urgent (priority -1, plain claims without prefetch, as a fair queue
/// claims: each slot that frees goes to `B`, the floor of any scheduler
/// while every slot is busy); behind it fair.
const CASES: [Case; 4] = [
    ("empty", false, false, 0),
    ("off", true, false, 0),
    ("urgent", true, false, -1),
    ("on", true, true, 0),
];

/// One case once: `B`'s start latencies (ms from its enqueue), sorted;
/// fewer than `--small` when some did not start in time.
async fn one(a: &FairArgs, ctx: &Ctx, queue: &str, case: Case) -> Result<Vec<f64>> {
    let (_, backlog, fair, priority) = case;
    let q = Queue::new(ctx.connect().await?);
    if backlog {
        let mut done = 0;
        while done < a.backlog {
            let k = a.insert_batch.min(a.backlog - done);
            let tasks: Vec<TaskBuilder> = (done..done + k)
                .map(|i| {
                    TaskBuilder::new("big", json!({ "i": i }))
                        .queue(queue)
                        .concurrency_key("A")
                })
                .collect();
            q.enqueue_many(tasks).await.context("enqueue_many")?;
            done += k;
        }
    }
    let starts: Arc<Mutex<Vec<Instant>>> = Arc::default();
    let shutdown = CancellationToken::new();
    let mut handles = Vec::new();
    for _ in 0..a.workers {
        let mut cfg = WorkerConfig::default()
            .queue(queue, a.concurrency)
            .poll_interval(Duration::from_millis(200))
            .shutdown_grace(Duration::from_secs(2));
        if fair {
            cfg = cfg.fair(queue);
        } else if priority < 0 {
            cfg = cfg.prefetch(0);
        }
        let mut w = Worker::new(ctx.connect().await?, cfg)?;
        let pause = Duration::from_millis(a.task_ms);
        w.handle("big", move |_| async move {
            tokio::time::sleep(pause).await;
            Ok::<(), TaskError>(())
        });
        let s = starts.clone();
        w.handle("small", move |_| {
            if let Ok(mut s) = s.lock() {
                s.push(Instant::now());
            }
            async move {
                tokio::time::sleep(pause).await;
                Ok::<(), TaskError>(())
            }
        });
        handles.push(tokio::spawn(w.run(shutdown.clone())));
    }
    tokio::time::sleep(Duration::from_millis(a.settle_ms)).await;
    let t0 = Instant::now();
    let small: Vec<TaskBuilder> = (0..a.small)
        .map(|i| {
            TaskBuilder::new("small", json!({ "i": i }))
                .queue(queue)
                .concurrency_key("B")
                .priority(priority)
        })
        .collect();
    q.enqueue_many(small).await.context("enqueue_many")?;
    let deadline = t0 + Duration::from_secs(a.timeout);
    loop {
        let n = starts.lock().map(|s| s.len()).unwrap_or(0) as u64;
        if n >= a.small || Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    shutdown.cancel();
    for h in handles {
        h.await.context("worker panicked")??;
    }
    let mut ms: Vec<f64> = starts
        .lock()
        .map_err(|_| anyhow!("a handler panicked"))?
        .iter()
        .map(|s| s.saturating_duration_since(t0).as_secs_f64() * 1e3)
        .collect();
    ms.sort_by(f64::total_cmp);
    Ok(ms)
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

pub(super) async fn fair_bench(a: FairArgs) -> Result<()> {
    let ctx = Ctx::new(&a.common);
    let kind = ctx.connect().await?.backend().kind();
    // Per case: the median over the reps of B's median and last start.
    let mut out = Vec::new();
    let mut human = Vec::new();
    // The cases alternate within each repetition (side by side on a
    // shared machine); per case, each rep's median and last start.
    let mut runs: Vec<(Vec<f64>, Vec<f64>, u64)> = vec![Default::default(); CASES.len()];
    let skip: Vec<&str> = a.skip.iter().map(String::as_str).collect();
    for rep in 0..a.reps {
        for (case, run) in CASES.iter().zip(runs.iter_mut()) {
            if skip.contains(&case.0) {
                continue;
            }
            let ms = one(&a, &ctx, &format!("fair-{}-{rep}", case.0), *case).await?;
            run.2 += a.small - ms.len() as u64;
            if ms.len() as u64 == a.small {
                run.1.push(ms[ms.len() - 1]);
            } else {
                run.1.push(f64::INFINITY);
            }
            run.0
                .push(ms.get(ms.len() / 2).copied().unwrap_or(f64::INFINITY));
        }
    }
    for (case, (mids, lasts, missing)) in CASES.iter().zip(runs) {
        let name = case.0;
        if skip.contains(&name) {
            continue;
        }
        let (mid, last) = (median(mids.clone()), median(lasts.clone()));
        out.push(json!({
            "case": name, "median_start_ms": round1(mid), "last_start_ms": round1(last),
            "not_started": missing, "rep_medians_ms": mids.iter().map(|x| round1(*x)).collect::<Vec<_>>(),
            "rep_lasts_ms": lasts.iter().map(|x| round1(*x)).collect::<Vec<_>>(),
        }));
        let show = |x: f64| {
            if x.is_finite() {
                format!("{x:.0} ms")
            } else {
                format!("> {} s", a.timeout)
            }
        };
        human.push(format!("{name}: median {}, last {}", show(mid), show(last)));
    }
    emit(
        json!({
            "bench": "fair-latency", "store": kind, "backlog": a.backlog, "small": a.small,
            "workers": a.workers, "concurrency": a.concurrency, "task_ms": a.task_ms,
            "reps": a.reps, "cases": out, "prefix": ctx.prefix,
        }),
        format!(
            "fair-latency {kind}: {} tasks of B behind {} of A, {}x{} slots, {} ms tasks; B's starts (median of {} reps): {}",
            a.small, a.backlog, a.workers, a.concurrency, a.task_ms, a.reps, human.join("; ")
        ),
    );
    ctx.cleanup().await
}
