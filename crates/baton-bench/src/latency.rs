//! `baton-bench latency`: enqueue one task at a time and measure
//! enqueue → handler start.

use super::*;

#[derive(Args)]
pub(super) struct LatencyArgs {
    #[command(flatten)]
    pub(super) common: Common,
    #[arg(long, default_value_t = 1000)]
    pub(super) jobs: usize,
    /// Unmeasured jobs first (connections, prepared statements).
    #[arg(long, default_value_t = 20)]
    pub(super) warmup: usize,
    /// Worker poll interval in ms (wake-ups normally arrive sooner).
    #[arg(long, default_value_t = 1000)]
    pub(super) poll_ms: u64,
}

pub(super) async fn latency_bench(a: LatencyArgs) -> Result<()> {
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
