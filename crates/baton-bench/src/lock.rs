//! `baton-bench lock`: acquire + release loops on distinct lock names,
//! through the `Locker` or the raw seam.

use super::*;

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
pub(super) enum LockApi {
    /// `Locker::try_lock` (keep-alive off) + `Lease::release`.
    Locker,
    /// `backend().lock_acquire` + `backend().lock_release` directly.
    Raw,
}

#[derive(Args)]
pub(super) struct LockArgs {
    #[command(flatten)]
    pub(super) common: Common,
    /// Concurrent loops, each on its own lock name.
    #[arg(long, default_value_t = 1)]
    pub(super) concurrency: usize,
    /// Seconds to measure (after a short warm-up).
    #[arg(long, default_value_t = 10.0)]
    pub(super) duration: f64,
    /// Which API to drive.
    #[arg(long, value_enum, default_value_t = LockApi::Locker)]
    pub(super) api: LockApi,
}

pub(super) async fn lock_bench(a: LockArgs) -> Result<()> {
    let ctx = Ctx::new(&a.common);
    let store = ctx.connect().await?;
    let kind = store.backend().kind();
    let locker = Locker::new(store.clone());
    let opts = LockOptions::new(Duration::from_secs(30)).keep_alive(false);
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
                                record: false,
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
