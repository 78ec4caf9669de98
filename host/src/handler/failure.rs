//! Why a request failed inside the handler: its status, its `kind` label, what the client
//! is told, and what the request's span records.

use wasmless_telemetry::TARGET;

/// Why a request failed inside the handler.
#[derive(Debug)]
pub enum Failure {
    /// Ran past the timeout (504).
    Timeout,
    /// Asked for more memory than the limit, and failed for it (500).
    OutOfMemory(String),
    /// Asked for memory within its limit that the pool's requests had taken already, and
    /// failed for it (503: retry).
    SharedMemoryFull(String),
    /// Trapped or panicked (500).
    Trap(String),
    /// A command exited with a non-zero status (500).
    Exit(i32),
    /// The handler's response could not be read (502).
    BadResponse(String),
}

impl Failure {
    pub fn status(&self) -> ::http::StatusCode {
        use ::http::StatusCode;
        match self {
            Self::Timeout => StatusCode::GATEWAY_TIMEOUT,
            Self::BadResponse(_) => StatusCode::BAD_GATEWAY,
            Self::OutOfMemory(_) | Self::Trap(_) | Self::Exit(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::SharedMemoryFull(_) => StatusCode::SERVICE_UNAVAILABLE,
        }
    }

    /// The `kind` label of `wasmless_traps_total`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Timeout => "timeout",
            Self::OutOfMemory(_) => "memory",
            Self::SharedMemoryFull(_) => "pool_memory",
            Self::Trap(_) => "trap",
            Self::Exit(_) => "exit",
            Self::BadResponse(_) => "bad_response",
        }
    }

    /// What the client is told; details go to the log.
    pub fn public_message(&self) -> String {
        match self {
            Self::Timeout => "the handler did not finish within its timeout\n".into(),
            Self::OutOfMemory(_) => "the handler ran out of memory\n".into(),
            Self::SharedMemoryFull(_) => {
                "too busy: the pool serving this function has no memory left for this request now; retry\n".into()
            }
            Self::Trap(_) => "the handler failed\n".into(),
            Self::Exit(code) => format!("the handler exited with status {code}\n"),
            Self::BadResponse(why) => format!("the handler's response is malformed: {why}\n"),
        }
    }

    pub(super) fn classify(error: wasmtime::Error, limiter: &crate::limits::RequestLimiter) -> Self {
        if matches!(error.downcast_ref::<wasmtime::Trap>(), Some(wasmtime::Trap::Interrupt)) {
            return Self::Timeout;
        }
        if let Some(bad) = error.downcast_ref::<super::stream::BadHead>() {
            return Self::BadResponse(bad.0.clone());
        }
        // Refused output (or another host buffer) traps with the refusal itself.
        if error.is::<crate::request_memory::Refused>() {
            return Self::SharedMemoryFull(format!("{error:?}"));
        }
        if limiter.memory_exceeded {
            return Self::OutOfMemory(format!("{error:?}"));
        }
        if limiter.shared_memory_full() {
            return Self::SharedMemoryFull(format!("{error:?}"));
        }
        if let Some(exit) = error.downcast_ref::<wasmtime_wasi::I32Exit>() {
            return Self::Exit(exit.0);
        }
        Self::Trap(format!("{error:?}"))
    }

    /// Marks `span` failed by this failure, with an event saying what happened (a trap's
    /// message and backtrace, cut to a few KiB).
    pub fn record(&self, span: &tracing::Span) {
        const MAX_DETAIL: usize = 4 << 10;
        span.record("otel.status_code", "ERROR");
        span.record("otel.status_description", self.public_message().trim_end());
        span.record("error.type", self.kind());
        let detail = match self {
            Self::Trap(why) | Self::OutOfMemory(why) | Self::SharedMemoryFull(why) | Self::BadResponse(why) => {
                why.clone()
            }
            Self::Exit(code) => format!("exit status {code}"),
            Self::Timeout => String::new(),
        };
        let mut end = detail.len().min(MAX_DETAIL);
        while !detail.is_char_boundary(end) {
            end -= 1;
        }
        let detail = &detail[..end];
        match self {
            Self::Timeout => tracing::error!(target: TARGET, parent: span, "timeout"),
            Self::OutOfMemory(_) => tracing::error!(target: TARGET, parent: span, detail, "memory limit"),
            Self::SharedMemoryFull(_) => tracing::warn!(target: TARGET, parent: span, detail, "pool memory"),
            Self::Trap(_) => tracing::error!(target: TARGET, parent: span, detail, "trap"),
            Self::Exit(_) => tracing::error!(target: TARGET, parent: span, detail, "exit"),
            Self::BadResponse(_) => tracing::error!(target: TARGET, parent: span, detail, "bad response"),
        }
    }
}
