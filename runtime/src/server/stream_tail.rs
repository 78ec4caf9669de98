//! A streamed response's body as the server sees it: the request stays in flight until
//! its body ends, and its one log line is written then, with how it ended.

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};
use std::time::{Duration, Instant};
use tracing::Span;
use wasmless_host::handler::{End, Streamed};
use wasmless_host::metrics::InFlight;
use wasmless_outbound::CallLog;

/// `response` with a body that counts the request in flight, and logs it, to its end.
pub(super) fn follow(response: Response, streamed: Streamed, started: Instant, in_flight: InFlight) -> Response {
    let status = response.status().as_u16();
    let calls = response.extensions().get::<Arc<CallLog>>().cloned();
    response.map(|body| {
        Body::new(StreamTail {
            body,
            streamed,
            status,
            started,
            first_byte: None,
            bytes: 0,
            ended: None,
            calls,
            span: Span::current(),
            _in_flight: in_flight,
        })
    })
}

struct StreamTail {
    body: Body,
    streamed: Streamed,
    status: u16,
    started: Instant,
    first_byte: Option<Duration>,
    bytes: u64,
    /// How the body ended, if it did: cleanly, or in an error (a handler that failed, or
    /// came up short).
    ended: Option<Result<(), ()>>,
    calls: Option<Arc<CallLog>>,
    span: Span,
    _in_flight: InFlight,
}

impl http_body::Body for StreamTail {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        let frame = ready!(Pin::new(&mut this.body).poll_frame(context));
        match &frame {
            Some(Ok(frame)) => {
                if let Some(data) = frame.data_ref() {
                    let started = this.started;
                    this.first_byte.get_or_insert_with(|| started.elapsed());
                    this.bytes += data.len() as u64;
                }
            }
            Some(Err(_)) => this.ended = Some(Err(())),
            None => this.ended = Some(Ok(())),
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

impl StreamTail {
    /// How the stream ended, for the log: the handler's end, `short_body` for one that
    /// returned short of its declared length, or `client_gone` for a body dropped before
    /// its end. (A component's body may end a moment before its handler returns.)
    fn end(&self) -> &'static str {
        match (self.streamed.0.get(), self.ended) {
            (Some(End::Complete), Some(Err(()))) => "short_body",
            (None, Some(Err(()))) => "failed",
            (None, Some(Ok(()))) => "complete",
            (Some(End::Complete) | None, None) => "client_gone",
            (Some(end), _) => end.name(),
        }
    }
}

impl Drop for StreamTail {
    fn drop(&mut self) {
        // hyper drops a body whose declared length is all out without polling its end.
        if self.ended.is_none() && http_body::Body::is_end_stream(&self.body) {
            self.ended = Some(Ok(()));
        }
        let _entered = self.span.enter();
        let latency_ms = self.started.elapsed().as_secs_f64() * 1000.0;
        let first_byte_ms = self.first_byte.map(|first| first.as_secs_f64() * 1000.0);
        let outbound_calls = self.calls.as_ref().map_or(0, |log| log.calls());
        let outbound_ms = self.calls.as_ref().map_or(0.0, |log| log.millis());
        tracing::info!(
            status = self.status,
            latency_ms,
            first_byte_ms,
            body_bytes = self.bytes,
            end = self.end(),
            outbound_calls,
            outbound_ms,
            "request"
        );
    }
}
