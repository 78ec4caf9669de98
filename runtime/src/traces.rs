//! The runtime's traces: the exporter, the span filter and the context helpers are
//! [`wasmless_telemetry`]'s (shared with the operator); what is the runtime's own is here.

pub use wasmless_telemetry::*;

/// Whether to make a request's server span (and so its child spans): tracing is on, and
/// the collector is taking spans. One not made while the collector is failing is counted
/// dropped, as the trace filter counts the others.
pub fn make_request_span() -> bool {
    if !enabled() {
        return false;
    }
    if paused() {
        spans_dropped().inc();
        return false;
    }
    true
}

/// Marks `span` failed by the handler's `failure`, with an event saying what happened (a
/// trap's message and backtrace, cut to a few KiB).
pub fn record_failure(span: &tracing::Span, failure: &crate::handler::Failure) {
    use crate::handler::Failure;
    const MAX_DETAIL: usize = 4 << 10;
    span.record("otel.status_code", "ERROR");
    span.record("otel.status_description", failure.public_message().trim_end());
    span.record("error.type", failure.kind());
    let detail = match failure {
        Failure::Trap(why) | Failure::OutOfMemory(why) | Failure::SharedMemoryFull(why) | Failure::BadResponse(why) => {
            why.clone()
        }
        Failure::Exit(code) => format!("exit status {code}"),
        Failure::Timeout => String::new(),
    };
    let mut end = detail.len().min(MAX_DETAIL);
    while !detail.is_char_boundary(end) {
        end -= 1;
    }
    let detail = &detail[..end];
    match failure {
        Failure::Timeout => tracing::error!(target: TARGET, parent: span, "timeout"),
        Failure::OutOfMemory(_) => tracing::error!(target: TARGET, parent: span, detail, "memory limit"),
        Failure::SharedMemoryFull(_) => tracing::warn!(target: TARGET, parent: span, detail, "pool memory"),
        Failure::Trap(_) => tracing::error!(target: TARGET, parent: span, detail, "trap"),
        Failure::Exit(_) => tracing::error!(target: TARGET, parent: span, detail, "exit"),
        Failure::BadResponse(_) => tracing::error!(target: TARGET, parent: span, detail, "bad response"),
    }
}
