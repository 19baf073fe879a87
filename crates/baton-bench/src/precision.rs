//! `baton-bench schedule-precision`: N instances run a durable `every`
//! job; slot → handler start latency and skipped, missed or doubled
//! slots.

use super::*;

#[derive(Args)]
pub(super) struct PrecisionArgs {
    #[command(flatten)]
    pub(super) common: Common,
    /// Instances, each a scheduler and a worker on its own store handle.
    #[arg(long, default_value_t = 3)]
    pub(super) instances: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 60)]
    pub(super) seconds: u64,
    /// The job's interval in ms.
    #[arg(long, default_value_t = 1000)]
    pub(super) every_ms: u64,
    /// Worker poll interval in ms (the default 1 s, as in production).
    #[arg(long, default_value_t = 1000)]
    pub(super) poll_ms: u64,
    /// The job's lead in ms (`Job::lead`: how long before its slot an
    /// on-time slot is taken); default the library's, 0 takes it at the slot.
    #[arg(long)]
    pub(super) lead_ms: Option<u64>,
}

pub(super) async fn precision_bench(a: PrecisionArgs) -> Result<()> {
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
pub(super) struct Phases {
    pub(super) json: Value,
    pub(super) worst: Vec<String>,
    pub(super) missed: Vec<String>,
    pub(super) human: String,
}

/// Per slot that ran: its task enqueued (`created_at - slot`; negative is
/// ahead, the lead), claimed (`started_at - slot`), and the handler started
/// (`start - started_at`, the start in the instance's store-clock
/// estimate); p50 / p99 / max of each, the three latest slots with their
/// phases, and for each missed slot the tasks the store holds for it.
pub(super) fn precision_phases(
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
