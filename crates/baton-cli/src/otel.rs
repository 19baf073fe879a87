//! OpenTelemetry traces (cargo feature `otel`): when
//! `OTEL_EXPORTER_OTLP_ENDPOINT` (or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`)
//! is set, baton's spans — the `task` span of every attempt among them —
//! are exported over OTLP/HTTP (protobuf) in batches, as service `baton`
//! (`OTEL_SERVICE_NAME` overrides). A task enqueued with a trace context
//! (`baton enqueue --traceparent` or `TRACEPARENT`, the admin API's
//! `traceparent` header, or a library enqueue inside a span) keeps it, and
//! each attempt's `task` span carries a link to it.

use std::sync::OnceLock;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing_subscriber::registry::LookupSpan;

/// The provider, kept to flush the last spans at exit.
static PROVIDER: OnceLock<SdkTracerProvider> = OnceLock::new();

/// The exporting layer, or `None` when no endpoint is configured (or the
/// exporter cannot be built: said on stderr).
pub fn layer<S>() -> Option<impl tracing_subscriber::Layer<S>>
where
    S: tracing::Subscriber + for<'a> LookupSpan<'a>,
{
    let set = |k: &str| std::env::var_os(k).is_some_and(|v| !v.is_empty());
    if !set("OTEL_EXPORTER_OTLP_ENDPOINT") && !set("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") {
        return None;
    }
    let exporter = match opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
    {
        Ok(e) => e,
        Err(e) => {
            crate::note!("baton: OpenTelemetry export off: {e}");
            return None;
        }
    };
    let name = std::env::var("OTEL_SERVICE_NAME").unwrap_or_else(|_| "baton".into());
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(name)
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("baton");
    let _ = PROVIDER.set(provider);
    Some(tracing_opentelemetry::layer().with_tracer(tracer))
}

/// Export the spans still buffered (at exit).
pub fn shutdown() {
    if let Some(p) = PROVIDER.get() {
        if let Err(e) = p.shutdown() {
            crate::note!("baton: OpenTelemetry export: {e}");
        }
    }
}
