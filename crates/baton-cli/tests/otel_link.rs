//! With the `otel` feature (`cargo test -p baton-cli --features otel
//! --test otel_link`): the worker's attempt span is linked to the span that
//! enqueued the task. Spans go through `tracing-opentelemetry` to an SDK
//! tracer whose exporter keeps them in memory; the test reads each
//! attempt's `task` span and checks its link names the enqueuer's trace
//! and span. Without the feature this file is empty.
#![cfg(feature = "otel")]

use std::sync::{Arc, Mutex};
use std::time::Duration;

use baton::queue::{Queue, TaskBuilder, Worker, WorkerConfig};
use baton::store::TaskState;
use opentelemetry::trace::{SpanId, TraceContextExt as _, TraceId, TracerProvider as _};
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{SdkTracerProvider, SpanData, SpanExporter};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;
use tracing_subscriber::layer::SubscriberExt as _;

/// Keeps every exported span.
#[derive(Debug, Clone, Default)]
struct Memory(Arc<Mutex<Vec<SpanData>>>);

impl SpanExporter for Memory {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        self.0.lock().unwrap().extend(batch);
        std::future::ready(Ok(()))
    }
}

/// The trace and span id a `tracing` span has in OpenTelemetry.
fn ids(span: &tracing::Span) -> (TraceId, SpanId) {
    let cx = span.context();
    let s = cx.span();
    let sc = s.span_context();
    (sc.trace_id(), sc.span_id())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_attempt_span_links_to_the_enqueuers_span() {
    let memory = Memory::default();
    let provider = SdkTracerProvider::builder()
        .with_simple_exporter(memory.clone())
        .build();
    let subscriber = tracing_subscriber::registry()
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    // Global: the worker's tasks run on the runtime's other threads.
    tracing::subscriber::set_global_default(subscriber).unwrap();

    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite://{}", dir.path().join("baton.db").display());
    let store = baton::Store::connect(&url).await.unwrap();
    let q = Queue::new(store.clone());

    // 1. A library enqueue inside a span: the span's context is recorded.
    let enqueuer = tracing::info_span!("enqueuer");
    let inside = q
        .enqueue(TaskBuilder::new("k", serde_json::json!({})).queue("otel"))
        .instrument(enqueuer.clone())
        .await
        .unwrap()
        .id;
    let (trace, span) = ids(&enqueuer);
    assert_ne!(trace, TraceId::INVALID);
    let stored = q.task(inside).await.unwrap().unwrap().traceparent;
    assert_eq!(
        stored,
        Some(format!("00-{trace}-{span}-01")),
        "the enqueuer's context is stored"
    );
    // 2. An explicit traceparent (as `baton enqueue --traceparent` or the
    //    API's header give), enqueued outside any span.
    let given = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
    let explicit = q
        .enqueue(
            TaskBuilder::new("k", serde_json::json!({}))
                .queue("otel")
                .traceparent(given),
        )
        .await
        .unwrap()
        .id;
    // 3. No span, no traceparent: nothing stored, no link.
    let plain = q
        .enqueue(TaskBuilder::new("k", serde_json::json!({})).queue("otel"))
        .await
        .unwrap()
        .id;
    assert_eq!(q.task(plain).await.unwrap().unwrap().traceparent, None);

    let mut w = Worker::new(
        store.clone(),
        WorkerConfig::default()
            .queue("otel", 3)
            .poll_interval(Duration::from_millis(100)),
    )
    .unwrap();
    w.handle("k", |_| async { Ok(()) });
    let stop = CancellationToken::new();
    let run = tokio::spawn(w.run(stop.clone()));
    for id in [inside, explicit, plain] {
        let t0 = std::time::Instant::now();
        loop {
            let st = q.task(id).await.unwrap().unwrap().state;
            if st == TaskState::Succeeded {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(20), "task {id}: {st}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    stop.cancel();
    run.await.unwrap().unwrap();
    provider.force_flush().unwrap();

    let spans = memory.0.lock().unwrap().clone();
    let attempt = |id: i64| {
        spans
            .iter()
            .find(|s| {
                s.name == "task"
                    && s.attributes
                        .iter()
                        .any(|kv| kv.key.as_str() == "id" && kv.value.as_str() == id.to_string())
            })
            .unwrap_or_else(|| panic!("no task span for {id} in {spans:#?}"))
            .clone()
    };
    let linked = |s: &SpanData| {
        s.links
            .links
            .iter()
            .map(|l| (l.span_context.trace_id(), l.span_context.span_id()))
            .collect::<Vec<_>>()
    };
    let a = attempt(inside);
    assert_eq!(linked(&a), [(trace, span)], "linked to the enqueuer");
    assert!(a.links.links[0].span_context.is_remote());
    let b = attempt(explicit);
    assert_eq!(
        linked(&b),
        [(
            TraceId::from_hex("4bf92f3577b34da6a3ce929d0e0e4736").unwrap(),
            SpanId::from_hex("00f067aa0ba902b7").unwrap()
        )],
        "linked to the given traceparent"
    );
    assert!(linked(&attempt(plain)).is_empty(), "no link without one");
}
