//! `/api/v1/queues`: the queues' counts, their throughput history
//! (sampled every [`SAMPLE_EVERY`]), and pause and resume.

use super::*;

/// One sample of every queue: pending, running and finished (succeeded +
/// failed + cancelled) counts.
#[derive(Clone)]
struct Sample {
    at: DateTime<Utc>,
    queues: BTreeMap<String, [u64; 3]>,
}

/// The last hour of samples, for throughput and the dashboard's chart.
#[derive(Default)]
pub struct History {
    samples: VecDeque<Sample>,
}

impl History {
    fn push(&mut self, s: Sample) {
        if self.samples.len() == SAMPLES {
            self.samples.pop_front();
        }
        self.samples.push_back(s);
    }
}

async fn sample(state: &State) -> Result<(), baton::Error> {
    let stats = Queue::new(state.store.clone()).stats().await?;
    let at = state.store.now().await?;
    let queues = stats
        .into_iter()
        .map(|s| {
            (
                s.queue,
                [s.pending, s.running, s.succeeded + s.failed + s.cancelled],
            )
        })
        .collect();
    if let Ok(mut h) = state.history.lock() {
        h.push(Sample { at, queues });
    }
    Ok(())
}

/// Sample the queues every [`SAMPLE_EVERY`] for as long as the process runs.
pub async fn sample_loop(state: Arc<State>) {
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if let Err(e) = sample(&state).await {
            tracing::debug!(error = %e, "admin: sampling the queues failed");
        }
    }
}

/// `GET /api/v1/queues`: per queue, the counts by state, the oldest due
/// pending task's age, the paused flag and the tasks finished over the
/// last hour (succeeded, failed for good or cancelled by a worker: the
/// store's rollup, the same on every instance).
pub async fn queues(Extract(state): S) -> Answer {
    let stats = Queue::new(state.store.clone()).stats().await?;
    let hour = baton::stats::series(
        &state.store,
        baton::stats::Range::Hour,
        &baton::stats::SeriesFilter::default(),
    )
    .await?;
    let mut finished: BTreeMap<&str, i64> = BTreeMap::new();
    for t in &hour.series {
        *finished.entry(t.queue.as_str()).or_default() +=
            t.counts.succeeded + t.counts.dead + t.counts.cancelled;
    }
    let rows: Vec<Value> = stats
        .iter()
        .map(|s| {
            let mut v = shapes::queue(s);
            v["finished_last_hour"] = json!(finished.get(s.queue.as_str()).copied().unwrap_or(0));
            v
        })
        .collect();
    Ok(Json(Value::Array(rows)))
}

/// `GET /api/v1/queues/history`: the samples behind the dashboard's chart.
pub async fn queue_history(Extract(state): S) -> Answer {
    let h = state
        .history
        .lock()
        .map_err(|_| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "history poisoned"))?;
    let samples: Vec<Value> = h
        .samples
        .iter()
        .map(|s| {
            let queues: serde_json::Map<String, Value> = s
                .queues
                .iter()
                .map(|(q, c)| {
                    (
                        q.clone(),
                        json!({"pending": c[0], "running": c[1], "finished": c[2]}),
                    )
                })
                .collect();
            json!({"at": output::ts(s.at), "queues": queues})
        })
        .collect();
    Ok(Json(
        json!({"interval_secs": SAMPLE_EVERY.as_secs(), "samples": samples}),
    ))
}

/// Pause or resume a queue cluster-wide: `{"queue": name, "paused":
/// bool, "note", "by"}`.
async fn set_queue_paused(
    state: &State,
    name: &str,
    paused: bool,
    who: Who,
    b: PauseBody,
) -> Answer {
    check_name("queue", name)?;
    let by = who.recorded(b.by());
    let note = b.note(&by)?;
    let q = Queue::new(state.store.clone());
    if paused {
        q.pause_with(name, note).await?;
    } else {
        q.resume_with(name, note).await?;
    }
    tracing::info!(queue = %name, paused, by = %by, "admin API: queue paused flag set");
    Ok(Json(
        json!({"queue": name, "paused": paused, "note": b.note_text(), "by": by}),
    ))
}

/// `POST /api/v1/queues/{name}/pause` with `{"note"?, "by"?}`.
pub async fn queue_pause(
    Extract(state): S,
    PathText(name): PathText,
    who: Who,
    Body(b): Body<PauseBody>,
) -> Answer {
    set_queue_paused(&state, &name, true, who, b).await
}

/// `POST /api/v1/queues/{name}/resume` with `{"note"?, "by"?}`.
pub async fn queue_resume(
    Extract(state): S,
    PathText(name): PathText,
    who: Who,
    Body(b): Body<PauseBody>,
) -> Answer {
    set_queue_paused(&state, &name, false, who, b).await
}
