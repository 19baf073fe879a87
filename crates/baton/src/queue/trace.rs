//! A task's W3C trace context (`traceparent`): the enqueuer's span, kept
//! on the task so the worker's attempt span can be linked to it.
//!
//! The stored field is plain text, checked here against the W3C Trace
//! Context form (`00-<32 hex trace id>-<16 hex span id>-<2 hex flags>`).
//! With the `otel` feature, an enqueue made inside a span that has an
//! OpenTelemetry context (through `tracing-opentelemetry`) records that
//! span's context when no traceparent was given, and each attempt's `task`
//! span gets a link to the stored context (a link, not a parent: the
//! attempt may run long after the enqueuer's trace ended, and a retried
//! task has many attempts; Oban's OpenTelemetry integration links by
//! default too).

use crate::error::InvalidInput;

/// The length of a version-00 traceparent.
const LEN: usize = 55;

/// Check `s` is a W3C traceparent: `VV-TTTTTTTTTTTTTTTTTTTTTTTTTTTTTTTT-PPPPPPPPPPPPPPPP-FF`,
/// lowercase hex, version not `ff`, trace id and parent id not all zeros.
/// (A later version may append `-…` fields; those are kept as given.)
pub fn validate_traceparent(s: &str) -> Result<(), InvalidInput> {
    let bad = |why: &str| {
        InvalidInput::new(
            "traceparent",
            format!(
                "{:?} is not a W3C traceparent ({why}); use \
                 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>, e.g. \
                 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
                s.chars().take(80).collect::<String>()
            ),
        )
    };
    let b = s.as_bytes();
    if b.len() < LEN || (b.len() > LEN && b[LEN] != b'-') {
        return Err(bad("wrong length"));
    }
    let hex = |r: std::ops::Range<usize>| {
        b[r].iter()
            .all(|c| c.is_ascii_digit() || (b'a'..=b'f').contains(c))
    };
    if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
        return Err(bad("fields are not separated by '-'"));
    }
    if !hex(0..2) || !hex(3..35) || !hex(36..52) || !hex(53..55) {
        return Err(bad("not lowercase hex"));
    }
    if &b[0..2] == b"ff" {
        return Err(bad("version ff is invalid"));
    }
    if &b[0..2] == b"00" && b.len() != LEN {
        return Err(bad("version 00 has exactly four fields"));
    }
    if b[3..35].iter().all(|&c| c == b'0') || b[36..52].iter().all(|&c| c == b'0') {
        return Err(bad("an all-zero trace id or span id"));
    }
    if s.len() > 512 {
        return Err(bad("longer than 512 bytes"));
    }
    Ok(())
}

/// The current span's OpenTelemetry context as a traceparent, when it has
/// a valid one.
#[cfg(feature = "otel")]
pub(crate) fn current() -> Option<String> {
    use opentelemetry::trace::TraceContextExt as _;
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let cx = tracing::Span::current().context();
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid().then(|| {
        format!(
            "00-{}-{}-{:02x}",
            sc.trace_id(),
            sc.span_id(),
            sc.trace_flags().to_u8()
        )
    })
}

/// Link `span` to the span context a stored traceparent names (nothing
/// when it does not parse: it was checked at enqueue).
#[cfg(feature = "otel")]
pub(crate) fn link(span: &tracing::Span, traceparent: &str) {
    use opentelemetry::trace::{SpanContext, SpanId, TraceFlags, TraceId, TraceState};
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    if validate_traceparent(traceparent).is_err() {
        return;
    }
    let (Ok(trace), Ok(id), Ok(flags)) = (
        TraceId::from_hex(&traceparent[3..35]),
        SpanId::from_hex(&traceparent[36..52]),
        u8::from_str_radix(&traceparent[53..55], 16),
    ) else {
        return;
    };
    let sc = SpanContext::new(
        trace,
        id,
        TraceFlags::new(flags),
        true,
        TraceState::default(),
    );
    span.add_link(sc);
}

#[cfg(test)]
mod tests {
    use super::validate_traceparent as v;

    #[test]
    fn traceparents_are_checked() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert!(v(good).is_ok());
        assert!(v("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra").is_ok());
        for bad in [
            "",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00_4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-x",
            "00-4bf92f3577b34da6a3ce929d0e0e47é-00f067aa0ba902b7-01",
        ] {
            let e = v(bad).expect_err(bad);
            assert_eq!(e.field, "traceparent");
            assert!(e.problem.contains("W3C traceparent"), "{}", e.problem);
        }
    }
}
