//! The worker's telemetry, seen by a user's own `tracing` subscriber and
//! its counters: each attempt runs inside a `task` span (id, queue, kind,
//! attempt; outcome, duration and exit code recorded at its end), the
//! handler's own events are inside it, and one `task started` and one
//! `task ended` line per attempt carry the ids. The counters' histograms
//! (claim latency, run duration, slot → start lag) fill as tasks run.
//! On SQLite, in a temporary file.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use baton::queue::{Queue, TaskBuilder, TaskError, Worker, WorkerConfig};
use baton::Store;
use tokio_util::sync::CancellationToken;
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Subscriber};
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};
use tracing_subscriber::registry::LookupSpan;

type Fields = BTreeMap<String, String>;

/// Every span (name, fields as recorded so far) and every event (its
/// message and fields, and the index of the span it was inside).
#[derive(Default)]
struct Seen {
    spans: Vec<(String, Fields)>,
    /// The registry reuses ids of closed spans: id → latest index.
    by_id: BTreeMap<u64, usize>,
    events: Vec<(Fields, Option<usize>)>,
}

#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Seen>>);

struct V<'a>(&'a mut Fields);

impl Visit for V<'_> {
    fn record_debug(&mut self, f: &Field, v: &dyn std::fmt::Debug) {
        self.0.insert(f.name().into(), format!("{v:?}"));
    }
    fn record_str(&mut self, f: &Field, v: &str) {
        self.0.insert(f.name().into(), v.into());
    }
}

impl<S: Subscriber + for<'a> LookupSpan<'a>> Layer<S> for Capture {
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, _: Context<'_, S>) {
        let mut fields = Fields::new();
        attrs.record(&mut V(&mut fields));
        let mut seen = self.0.lock().unwrap();
        seen.spans.push((attrs.metadata().name().into(), fields));
        let i = seen.spans.len() - 1;
        seen.by_id.insert(id.into_u64(), i);
    }
    fn on_record(&self, id: &Id, values: &Record<'_>, _: Context<'_, S>) {
        let mut seen = self.0.lock().unwrap();
        if let Some(&i) = seen.by_id.get(&id.into_u64()) {
            values.record(&mut V(&mut seen.spans[i].1));
        }
    }
    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        let mut fields = Fields::new();
        event.record(&mut V(&mut fields));
        let span = ctx.event_span(event).map(|s| s.id().into_u64());
        let mut seen = self.0.lock().unwrap();
        let inside = span.and_then(|id| seen.by_id.get(&id).copied());
        seen.events.push((fields, inside));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_attempt_runs_in_a_task_span_with_its_fields() {
    let capture = Capture::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(capture.clone()))
        .expect("the only subscriber in this test binary");

    let dir = tempfile::tempdir().expect("tempdir");
    let url = format!("sqlite://{}", dir.path().join("t.db").display());
    let store = Store::connect(&url).await.expect("connect");
    let q = Queue::new(store.clone());
    let slot = chrono::Utc::now() - chrono::Duration::seconds(2);
    let ok = q
        .enqueue(TaskBuilder::new("greet", serde_json::json!({})).queue("q"))
        .await
        .expect("enqueue")
        .id;
    let bad = q
        .enqueue(
            TaskBuilder::new("fail", serde_json::json!({}))
                .queue("q")
                .max_attempts(1)
                .slot("nightly", slot)
                .run_at(slot),
        )
        .await
        .expect("enqueue")
        .id;

    // A trigger of a slot three hours old: due when enqueued, so its lag
    // is its own wait, kept apart from the on-time runs' slot lag.
    let old_slot = chrono::Utc::now() - chrono::Duration::hours(3);
    q.enqueue(
        TaskBuilder::new("greet", serde_json::json!({}))
            .queue("q")
            .slot("nightly", old_slot),
    )
    .await
    .expect("enqueue");

    let cfg = WorkerConfig::default()
        .queue("q", 2)
        .poll_interval(Duration::from_millis(50));
    let mut w = Worker::new(store.clone(), cfg).unwrap();
    w.handle("greet", |_ctx| async move {
        tracing::info!(marker = "inside", "handler says hi");
        Ok::<_, TaskError>(())
    });
    w.handle("fail", |ctx| async move {
        ctx.set_exit_code(3);
        Err::<(), _>(TaskError::permanent("exit 3"))
    });
    let counters = w.counters();
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    let t0 = Instant::now();
    loop {
        let c = counters.snapshot();
        let ended: u64 = c.get("q").map_or(0, |c| c.ended.values().sum());
        if ended == 3 {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "tasks did not end");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.cancel();
    run.await.expect("join").expect("worker");

    // The worker's last flush (at shutdown) put every attempt in the
    // store's rollup: per kind and job, the hour's totals (the slot task
    // of job `nightly` apart from the plain `greet` task).
    let hour = baton::stats::series(&store, baton::stats::Range::Hour, &Default::default())
        .await
        .expect("series");
    type Row<'a> = (&'a str, Option<&'a str>, i64, i64, i64, i64);
    let by_kind: Vec<Row<'_>> = hour
        .series
        .iter()
        .map(|t| {
            (
                t.kind.as_str(),
                t.job.as_deref(),
                t.counts.succeeded,
                t.counts.failed,
                t.counts.dead,
                t.counts.wait_n,
            )
        })
        .collect();
    assert_eq!(
        by_kind,
        [
            ("fail", Some("nightly"), 0, 1, 1, 1),
            ("greet", None, 1, 0, 0, 1),
            ("greet", Some("nightly"), 1, 0, 0, 1)
        ]
    );
    assert!(hour.totals.wait_max_ms >= 1900, "{:?}", hour.totals);

    let seen = capture.0.lock().unwrap();
    let span_of = |id: i64| -> &(String, Fields) {
        seen.spans
            .iter()
            .find(|(name, f)| name == "task" && f.get("id") == Some(&id.to_string()))
            .unwrap_or_else(|| panic!("no task span for {id}: {:?}", seen.spans))
    };
    let (_, f) = span_of(ok);
    assert_eq!(f.get("queue").map(String::as_str), Some("q"), "{f:?}");
    assert_eq!(f.get("kind").map(String::as_str), Some("greet"), "{f:?}");
    assert_eq!(f.get("attempt").map(String::as_str), Some("1"), "{f:?}");
    assert_eq!(
        f.get("outcome").map(String::as_str),
        Some("succeeded"),
        "{f:?}"
    );
    assert!(f.contains_key("duration_ms"), "{f:?}");
    assert!(!f.contains_key("exit_code"), "{f:?}");

    // The handler's own events are inside their attempts' spans: both
    // `greet` tasks (the plain one and the old slot's, in either order)
    // said hi, each inside a `task` span, one of them `ok`'s.
    let inside_ids: Vec<String> = seen
        .events
        .iter()
        .filter(|(e, _)| e.get("marker").map(String::as_str) == Some("inside"))
        .map(|(_, inside)| {
            let (name, f) = &seen.spans[inside.expect("the handler's event has a span")];
            assert_eq!(name, "task");
            f.get("id").cloned().unwrap_or_default()
        })
        .collect();
    assert_eq!(inside_ids.len(), 2, "{inside_ids:?}");
    assert!(inside_ids.contains(&ok.to_string()), "{inside_ids:?}");
    assert_ne!(inside_ids[0], inside_ids[1], "{inside_ids:?}");

    let (_, f) = span_of(bad);
    assert_eq!(f.get("kind").map(String::as_str), Some("fail"), "{f:?}");
    assert_eq!(
        f.get("outcome").map(String::as_str),
        Some("failed"),
        "{f:?}"
    );
    assert_eq!(f.get("exit_code").map(String::as_str), Some("3"), "{f:?}");
    assert_eq!(f.get("job").map(String::as_str), Some("nightly"), "{f:?}");

    // One start and one end line per attempt, with the ids.
    for (id, outcome) in [(ok, "succeeded"), (bad, "failed")] {
        let lines = |msg: &str| -> Vec<&Fields> {
            seen.events
                .iter()
                .map(|(e, _)| e)
                .filter(|e| {
                    e.get("message").map(String::as_str) == Some(msg)
                        && e.get("task") == Some(&id.to_string())
                })
                .collect()
        };
        assert_eq!(lines("task started").len(), 1, "task {id}");
        let end = lines("task ended");
        assert_eq!(end.len(), 1, "task {id}");
        assert_eq!(end[0].get("outcome").map(String::as_str), Some(outcome));
        assert_eq!(end[0].get("queue").map(String::as_str), Some("q"));
        assert!(end[0].contains_key("duration_ms"), "{:?}", end[0]);
    }
    let end_bad = seen
        .events
        .iter()
        .find(|(e, _)| {
            e.get("message").map(String::as_str) == Some("task ended")
                && e.get("task") == Some(&bad.to_string())
        })
        .map(|(e, _)| e)
        .expect("end line");
    assert_eq!(end_bad.get("exit_code").map(String::as_str), Some("3"));
    drop(seen);

    // Histograms: every claim answered, both attempts' durations, the
    // scheduled task's lag (≥ 2 s: it was due at its slot, 2 s before the
    // enqueue; the lag counts from the due time, not the slot).
    let c = counters.snapshot()["q"].clone();
    assert!(c.claim_latency.count >= 1, "{:?}", c.claim_latency);
    assert_eq!(c.run_duration.count, 3, "{:?}", c.run_duration);
    assert_eq!(c.slot_lag.count, 1, "{:?}", c.slot_lag);
    assert!(c.slot_lag.sum >= 1.9, "{:?}", c.slot_lag);
    assert_eq!(c.trigger_lag.count, 1, "{:?}", c.trigger_lag);
    assert!(c.trigger_lag.sum < 60.0, "{:?}", c.trigger_lag);
    assert_eq!(c.lease_losses, 0);
    let cum = c.run_duration.cumulative();
    assert_eq!(cum.last().map(|x| x.1), Some(3));
}
