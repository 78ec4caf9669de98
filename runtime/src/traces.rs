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
