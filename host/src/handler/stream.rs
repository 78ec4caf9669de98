//! Streamed responses of Go reactors: the two `wasmless` imports through which a handler
//! that flushes (or writes more than a buffer's worth) sends its head at once and its body
//! as it comes, instead of all of it when `wasmless_handle` returns. Every pointer and
//! length comes from the guest: each is checked against its memory, and a range outside it
//! traps that request.
//!
//! ```text
//! response_start(head, head_len) -> errno
//!     head: the response's encoding (sdk/go/reactor/reactor.go) without its body. The head
//!     leaves now; the body follows through response_write and ends when wasmless_handle
//!     returns (whose result is then not read). A head that does not parse, or whose
//!     Content-Length is not a number, traps: nothing has left, so the request gets a 502.
//!     errno 11: a stream was started already. errno 8: no stream can start here (a CGI
//!     command, the snapshot taken at build time).
//! response_write(buffer, len) -> errno
//!     The next len bytes of the body, copied [`BODY_PART`] bytes at a time, each once the
//!     one before has gone towards the client: the guest waits meanwhile (backpressure),
//!     so what the host holds of a stream is a part, whatever the response's length. In a
//!     pool each part is taken from the request's share of the pool's memory until it is
//!     sent; one that does not fit traps, as any refused host buffer does.
//!     errno 11: response_start was not called. errno 14: the bytes would pass the
//!     Content-Length the head declared; none of them is sent.
//! ```

use crate::outbound_abi::{BODY_PART, memory, read_guest};
use crate::request_memory::{Refused, RequestShare};
use bytes::Bytes;
use http::HeaderValue;
use http::header::{CONTENT_LENGTH, TRANSFER_ENCODING};
use http_body::{Frame, SizeHint};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll, ready};
use tokio::sync::{mpsc, oneshot};
use wasmless_formats::outbound::{ERRNO_BAD_HANDLE, ERRNO_UNAVAILABLE, IMPORT_MODULE};
use wasmless_formats::reactor_response::{self, ERRNO_CONTENT_LENGTH, RESPONSE_START, RESPONSE_WRITE};
use wasmtime::{Caller, Linker};

/// Largest encoded response head a guest may hand over.
const MAX_HEAD: usize = 1 << 20;

/// The guest's end of its response: where `response_start` sends the head, and
/// `response_write` the body's parts.
#[derive(Default)]
pub struct ResponseSink {
    state: Sink,
    share: Option<RequestShare>,
}

#[derive(Default)]
enum Sink {
    /// No stream can start: a CGI command's store, or a kept instance between requests.
    #[default]
    Unavailable,
    /// Nothing has left yet: the response may still come whole, as `wasmless_handle`'s
    /// result.
    Waiting(oneshot::Sender<StreamHead>),
    /// The head has left; the body goes through `parts`, `remaining` bytes of it still
    /// owed when the head declared a length.
    Open {
        parts: mpsc::Sender<Bytes>,
        remaining: Option<u64>,
    },
}

impl ResponseSink {
    /// A sink for one request, which sends the head of a stream to `head`; the body's parts
    /// are taken from `share` (in a pool) until they are sent. It is a share of its own,
    /// not the request's: parts a client has not read yet then hold only themselves, not
    /// the instance's whole grant, once the handler is gone.
    pub fn waiting(head: oneshot::Sender<StreamHead>, share: Option<RequestShare>) -> Self {
        Self {
            state: Sink::Waiting(head),
            share,
        }
    }
}

/// What the request is answered with once its handler starts a stream.
pub struct StreamHead {
    pub response: http::Response<StreamBody>,
    pub end: StreamEnd,
    /// Another sender of the body's channel: closed once the client's side (the
    /// [`StreamBody`]) is dropped, which is how the host learns the client left.
    pub closed: mpsc::Sender<Bytes>,
}

/// How a stream ended, set once by whoever ends it, before the body's channel closes;
/// and whether its declared length has all been handed to the client (hyper then drops
/// the body without waiting for its end, which is no client leaving).
#[derive(Clone, Default)]
pub struct StreamEnd(Arc<EndState>);

#[derive(Default)]
struct EndState {
    end: OnceLock<End>,
    delivered: AtomicBool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The handler returned.
    Complete,
    /// The request's timeout stopped the handler: the body ends cleanly, as an SSE client
    /// expects; a declared length not reached makes it an error all the same.
    Timeout,
    /// The handler failed after its head (the kind label of `wasmless_traps_total`).
    Failed(&'static str),
    /// The client went away; the handler was stopped.
    ClientGone,
}

impl End {
    /// The `end` field of the request's log line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Complete => "complete",
            Self::Timeout => "timeout",
            Self::Failed(kind) => kind,
            Self::ClientGone => "client_gone",
        }
    }
}

impl StreamEnd {
    pub fn set(&self, end: End) {
        let _ = self.0.end.set(end);
    }

    pub fn get(&self) -> Option<End> {
        self.0.end.get().copied()
    }

    /// True once every byte of a declared length has gone towards the client.
    pub fn delivered(&self) -> bool {
        self.0.delivered.load(Ordering::SeqCst)
    }

    fn deliver(&self) {
        self.0.delivered.store(true, Ordering::SeqCst);
    }
}

/// A response extension marking a streamed response, for the server's layers: the
/// request is counted and logged when the body ends, not at its head.
#[derive(Clone)]
pub struct Streamed(pub StreamEnd);

/// A head the guest handed over that cannot be sent (the request gets a 502).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct BadHead(pub String);

/// The client went away while the guest was writing to it.
#[derive(Debug, thiserror::Error)]
#[error("the client went away during the response")]
pub struct ClientGone;

/// The body of a streamed response: the parts the guest writes, then an end that is clean
/// only if the handler returned (or its timeout came) with nothing owed.
pub struct StreamBody {
    parts: mpsc::Receiver<Bytes>,
    remaining: Option<u64>,
    end: StreamEnd,
    done: bool,
}

impl http_body::Body for StreamBody {
    type Data = Bytes;
    type Error = std::io::Error;

    fn poll_frame(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        match ready!(this.parts.poll_recv(context)) {
            Some(bytes) => {
                if let Some(remaining) = &mut this.remaining {
                    *remaining = remaining.saturating_sub(bytes.len() as u64);
                    if *remaining == 0 {
                        this.end.deliver();
                    }
                }
                Poll::Ready(Some(Ok(Frame::data(bytes))))
            }
            None => {
                this.done = true;
                let owed = this.remaining.unwrap_or(0);
                Poll::Ready(match this.end.get() {
                    Some(End::Complete | End::Timeout) if owed == 0 => None,
                    Some(End::Complete) => Some(Err(std::io::Error::other(format!(
                        "the handler returned {owed} bytes short of its Content-Length"
                    )))),
                    Some(End::Timeout) => Some(Err(std::io::Error::other(format!(
                        "the timeout stopped the handler {owed} bytes short of its Content-Length"
                    )))),
                    Some(End::Failed(kind)) => Some(Err(std::io::Error::other(format!(
                        "the handler failed after its response headers ({kind})"
                    )))),
                    Some(End::ClientGone) | None => Some(Err(std::io::Error::other("the stream was abandoned"))),
                })
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // All of a declared length is out: nothing more can come (response_write refuses
        // it), and hyper needs no last poll.
        self.done || self.remaining == Some(0)
    }

    fn size_hint(&self) -> SizeHint {
        match self.remaining {
            Some(remaining) => SizeHint::with_exact(remaining),
            None => SizeHint::default(),
        }
    }
}

/// Adds `response_start` and `response_write` to a linker whose store data holds a
/// [`ResponseSink`].
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    sink: fn(&mut T) -> &mut ResponseSink,
) -> wasmtime::Result<()> {
    linker.func_wrap_async(
        IMPORT_MODULE,
        RESPONSE_START,
        move |mut caller: Caller<'_, T>, (head, length): (u32, u32)| {
            Box::new(async move { start(&mut caller, sink, head, length).await })
        },
    )?;
    linker.func_wrap_async(
        IMPORT_MODULE,
        RESPONSE_WRITE,
        move |mut caller: Caller<'_, T>, (buffer, length): (u32, u32)| {
            Box::new(async move { write(&mut caller, sink, buffer, length).await })
        },
    )?;
    Ok(())
}

/// `response_start`: the head checked, handed to the request, and the body's channel open.
async fn start<T>(
    caller: &mut Caller<'_, T>,
    sink: fn(&mut T) -> &mut ResponseSink,
    head: u32,
    length: u32,
) -> wasmtime::Result<u32> {
    match sink(caller.data_mut()).state {
        Sink::Unavailable => return Ok(ERRNO_UNAVAILABLE),
        Sink::Open { .. } => return Ok(ERRNO_BAD_HANDLE),
        Sink::Waiting(_) => {}
    }
    if length as usize > MAX_HEAD {
        return Err(BadHead(format!(
            "the response head is {length} bytes, over the {MAX_HEAD} a handler may send"
        ))
        .into());
    }
    let bytes = read_guest(caller, head, length)?;
    let (mut parts, ()) = reactor_response::parse_head(&bytes)
        .map_err(|bad| BadHead(bad.to_string()))?
        .into_parts();
    // hyper frames the body: by the declared length, or in chunks.
    parts.headers.remove(TRANSFER_ENCODING);
    let remaining = declared_length(&parts.headers)?;
    if let Some(length) = remaining {
        // Sent as it frames the body: one value, digits alone.
        parts.headers.insert(CONTENT_LENGTH, HeaderValue::from(length));
    }
    let (sender, receiver) = mpsc::channel(1);
    let end = StreamEnd::default();
    if remaining == Some(0) {
        end.deliver();
    }
    let body = StreamBody {
        parts: receiver,
        remaining,
        end: end.clone(),
        done: false,
    };
    let open = Sink::Open {
        parts: sender.clone(),
        remaining,
    };
    let Sink::Waiting(to_request) = std::mem::replace(&mut sink(caller.data_mut()).state, open) else {
        unreachable!("checked above, and nothing ran since");
    };
    // Gone only if the request was cancelled, and with it this instance.
    let _ = to_request.send(StreamHead {
        response: http::Response::from_parts(parts, body),
        end,
        closed: sender,
    });
    // Once, so that the request sees the head and answers with it before the guest goes on.
    tokio::task::yield_now().await;
    Ok(0)
}

/// The Content-Length a head declares: one value (repeated alike at most), ASCII digits.
fn declared_length(headers: &http::HeaderMap) -> Result<Option<u64>, BadHead> {
    let mut declared = None;
    for value in headers.get_all(CONTENT_LENGTH) {
        let length = std::str::from_utf8(value.as_bytes())
            .ok()
            .filter(|text| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|text| text.parse::<u64>().ok())
            .ok_or_else(|| BadHead(format!("the Content-Length {value:?} is not a number of bytes")))?;
        if declared.is_some_and(|earlier| earlier != length) {
            return Err(BadHead("the response declares two different Content-Lengths".into()));
        }
        declared = Some(length);
    }
    Ok(declared)
}

/// `response_write`: the bytes at `buffer`, handed to the client [`BODY_PART`] at a time.
async fn write<T>(
    caller: &mut Caller<'_, T>,
    sink: fn(&mut T) -> &mut ResponseSink,
    buffer: u32,
    length: u32,
) -> wasmtime::Result<u32> {
    let ResponseSink { state, share } = sink(caller.data_mut());
    let (parts, remaining, share) = match state {
        Sink::Open { parts, remaining } => (parts.clone(), *remaining, share.clone()),
        Sink::Waiting(_) => return Ok(ERRNO_BAD_HANDLE),
        Sink::Unavailable => return Ok(ERRNO_UNAVAILABLE),
    };
    // The whole range is checked first: one outside the guest's memory traps before any
    // of it is sent.
    let size = memory(caller)?.data_size(&*caller);
    if buffer.checked_add(length).is_none_or(|end| end as usize > size) {
        return Err(wasmtime::Error::msg("a response body named memory outside the guest's"));
    }
    if remaining.is_some_and(|remaining| u64::from(length) > remaining) {
        return Ok(ERRNO_CONTENT_LENGTH);
    }
    let mut written = 0;
    while written < length {
        let part = (length - written).min(BODY_PART as u32);
        let Ok(room) = parts.reserve().await else {
            return Err(ClientGone.into());
        };
        let bytes = read_guest(caller, buffer + written, part)?;
        let Some(bytes) = crate::request_memory::charged(share.as_ref(), bytes) else {
            return Err(Refused {
                what: "response body",
                bytes: part as usize,
            }
            .into());
        };
        room.send(bytes);
        if let Sink::Open {
            remaining: Some(remaining),
            ..
        } = &mut sink(caller.data_mut()).state
        {
            *remaining -= u64::from(part);
        }
        written += part;
    }
    Ok(0)
}
