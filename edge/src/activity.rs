//! A connection's activity, as the edge's watchdog reads it: waiting for a head, idle
//! between requests, or serving one, and since when; the socket and the response body that
//! tell it.

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::Notify;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum State {
    /// Waiting for a request's head: since connecting, or since its first byte.
    Head = 0,
    /// Between requests on a keep-alive connection.
    Idle = 1,
    /// A request is being served.
    Busy = 2,
}

/// A connection's state and since when, shared by the socket (reads), the service
/// (requests start and end) and the watchdog.
pub(super) struct Activity {
    state: AtomicU8,
    /// Nanoseconds from `epoch` to the last change of state.
    since: AtomicU64,
    epoch: Instant,
    pub(super) changed: Notify,
}

impl Activity {
    pub(super) fn new() -> Self {
        Self {
            state: AtomicU8::new(State::Head as u8),
            since: AtomicU64::new(0),
            epoch: Instant::now(),
            changed: Notify::new(),
        }
    }

    pub(super) fn state(&self) -> State {
        match self.state.load(Ordering::Acquire) {
            0 => State::Head,
            1 => State::Idle,
            _ => State::Busy,
        }
    }

    fn set(&self, state: State) {
        self.since.store(self.now(), Ordering::Release);
        self.state.store(state as u8, Ordering::Release);
    }

    fn now(&self) -> u64 {
        u64::try_from(self.epoch.elapsed().as_nanos()).unwrap_or(u64::MAX)
    }

    /// Bytes came in. After an idle gap they start the next request's head, and its clock.
    fn read(&self) {
        if self.state.load(Ordering::Relaxed) == State::Idle as u8 {
            self.since.store(self.now(), Ordering::Release);
            if self
                .state
                .compare_exchange(
                    State::Idle as u8,
                    State::Head as u8,
                    Ordering::AcqRel,
                    Ordering::Relaxed,
                )
                .is_ok()
            {
                self.changed.notify_one();
            }
        }
    }

    /// A request's head is in; the returned guard marks the connection idle once the
    /// response (or the request, if it was dropped) is finished with.
    pub(super) fn request_started(self: &Arc<Self>) -> RequestDone {
        self.set(State::Busy);
        RequestDone(self.clone())
    }

    /// When the connection's current wait ends: a head's read, or an idle gap; none while
    /// a request is served.
    pub(super) fn deadline(&self, header_read_timeout: Duration, idle_timeout: Duration) -> Option<Instant> {
        let since = self.epoch + Duration::from_nanos(self.since.load(Ordering::Acquire));
        match self.state() {
            State::Head => Some(since + header_read_timeout),
            State::Idle => Some(since + idle_timeout),
            State::Busy => None,
        }
    }

    pub(super) fn expired(&self, header_read_timeout: Duration, idle_timeout: Duration) -> bool {
        self.deadline(header_read_timeout, idle_timeout)
            .is_some_and(|deadline| Instant::now() >= deadline)
    }
}

pub(super) struct RequestDone(Arc<Activity>);

impl Drop for RequestDone {
    fn drop(&mut self) {
        self.0.set(State::Idle);
        self.0.changed.notify_one();
    }
}

/// The socket, telling the connection's [`Activity`] when bytes arrive.
pub(super) struct WatchedIo {
    pub(super) inner: TcpStream,
    pub(super) activity: Arc<Activity>,
}

impl AsyncRead for WatchedIo {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if buf.filled().len() > before {
            this.activity.read();
        }
        polled
    }
}

impl AsyncWrite for WatchedIo {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// A response body that marks its request done when hyper drops it (after the last byte).
pub(super) struct Tracked {
    body: Body,
    _done: RequestDone,
}

impl Tracked {
    pub(super) fn new(body: Body, done: RequestDone) -> Self {
        Self { body, _done: done }
    }
}

impl http_body::Body for Tracked {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        Pin::new(&mut self.get_mut().body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}
