//! One JSON object per log line, on stdout, filtered by `RUST_LOG` (default `info`); and,
//! when tracing is on, the layer that exports the runtime's spans ([`crate::traces`]).

use crate::traces::{TARGET, Traces};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

/// Keeps the log writer's thread alive; dropping it flushes what is queued.
#[must_use = "logs written after the guard is dropped are lost"]
pub struct LogGuard(#[allow(dead_code)] Option<tracing_appender::non_blocking::WorkerGuard>);

/// Lines are written by a thread of their own, so a request does not wait on a
/// `write` to stdout (measured: a fifth of the throughput of a hello handler). The
/// queue never drops lines: when it is full, requests wait, as they would without it.
///
/// The queue is allocated and touched whole at start; tracing-appender's default of
/// 128,000 lines is 4 MiB, a thousand page faults, about 3 ms of every cold start.
/// 8,192 lines is still seconds of logs at full load.
const QUEUED_LOG_LINES: usize = 8192;

pub fn init(traces: Option<&Traces>) -> LogGuard {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    // Trace spans and their events are the exporter's, not log lines.
    let filter = filter.add_directive(format!("{TARGET}=off").parse().expect("a valid directive"));
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(false)
        .buffered_lines_limit(QUEUED_LOG_LINES)
        .thread_name("wasmless-log")
        .finish(std::io::stdout());
    let log = tracing_subscriber::fmt::layer()
        .json()
        .flatten_event(true)
        .with_current_span(true)
        .with_span_list(false)
        .with_writer(writer)
        .with_filter(filter);
    let installed = tracing_subscriber::registry()
        .with(log)
        .with(traces.map(Traces::layer))
        .try_init();
    LogGuard(installed.is_ok().then_some(guard))
}
