//! The `wasmless` imports through which a WASI preview1 guest (the Go SDK's transport,
//! sdk/go/outbound) makes outbound calls. Every pointer and length comes from the guest:
//! each is checked against its memory, and a range outside it traps that request.
//!
//! ```text
//! http_start(head, head_len, timeout_ms, out) -> errno
//!     head: wasmless_formats::outbound's encoding (no body). timeout_ms 0: none of its own.
//!     The policy is checked and a call slot taken (waiting for one within the call's
//!     deadline). out: two u32s, a handle and a length: errno 0, the call's handle (the
//!     length 0); errno != 0, the error's message, read with http_read_head (no handle
//!     if 0 long, nor while [`MAX_OPEN`] handles are held: the errno alone).
//! http_write_body(handle, buffer, buffer_len) -> errno
//!     With the head's body flag: the next piece of the request body, all of it, taken
//!     once the upstream has room for it (the guest waits meanwhile: backpressure); the
//!     host copies it [`BODY_PART`] bytes at a time, each when the upstream has room.
//!     errno 12: the call ended first (the upstream answered early, or the call failed):
//!     stop writing, http_finish tells which. errno 2: the deadline passed. errno 13 (in
//!     a pool): the request's share of the pool's memory has no room for the piece; the
//!     call is abandoned, and http_finish gives the message.
//! http_finish(handle, out) -> errno
//!     The body's end (or, without a body, the call's send), then the response head: out
//!     is the length of what http_read_head gives for the handle, the head (errno 0) or
//!     the error's message (errno != 0; also for a call that failed before).
//! http_read_head(handle, buffer, buffer_len) -> errno
//! http_read_body(handle, buffer, buffer_len, out_n) -> errno
//!     out_n: bytes written; 0 at the body's end. On errno != 0 the bytes written are
//!     the error's message.
//! http_close(handle) -> errno
//!     Frees the handle; a call whose body was not finished is abandoned (the upstream
//!     sees it fail, never a body cut short as if it were whole).
//! ```

use crate::request_memory::RequestShare;
use bytes::Bytes;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use wasmless_formats::outbound::{
    self as abi, ERRNO_BAD_HANDLE, ERRNO_CALL_ENDED, HTTP_CLOSE, HTTP_FINISH, HTTP_READ_BODY, HTTP_READ_HEAD,
    HTTP_START, HTTP_WRITE_BODY, IMPORT_MODULE,
};
use wasmless_outbound::{Admitted, CallLog, ClientBody, Deadlines, OpenResponse, Outbound, OutboundError, Piece};
use wasmtime::{Caller, Extern, Linker, Memory};

/// Largest encoded request head a guest may hand over.
const MAX_HEAD: usize = 1 << 20;
/// Calls one request may have open at once.
const MAX_OPEN: usize = 64;
/// Longest error message a call's slot keeps ([`message_of`]).
const MAX_MESSAGE: usize = 1024;
/// Most of a request body the host copies from the guest at once: a longer piece goes in
/// parts, each taken when the upstream has room for it, so that what the host holds of a
/// call's body is a part or two, whatever the length of the piece the guest hands over.
pub const BODY_PART: usize = 64 << 10;

/// One request's outbound calls: the Function's client, the request's deadline, the
/// calls the guest has open and, in a pool, the request's share of the pool's memory that
/// the parts of their bodies the host holds are taken from.
pub struct GuestCalls {
    outbound: Arc<Outbound>,
    log: Arc<CallLog>,
    deadline: Instant,
    share: Option<RequestShare>,
    open: Vec<Option<Slot>>,
}

enum Slot {
    /// Started without a body: sent by `http_finish`.
    Ready(Box<(Admitted, http::Request<ClientBody>, Deadlines)>),
    /// Started with a body: on its way (a task sends it) while the guest writes the body.
    Sending {
        body: mpsc::Sender<Piece>,
        call: Call,
        deadlines: Deadlines,
        /// True once the call has its outcome (the response head, or a failure).
        done: watch::Receiver<bool>,
    },
    /// Between `http_finish` and its answer.
    Finishing,
    Response {
        head: Vec<u8>,
        response: Box<OpenResponse>,
        pending: Bytes,
        finished: bool,
        /// The rest of a body the upstream answered before taking: left open (neither
        /// ended short nor failed, which would cut the response) until the handle goes.
        _unsent: Option<mpsc::Sender<Piece>>,
    },
    /// The call failed: its message, and the errno it was told with.
    Failed(Vec<u8>, u32),
}

/// The task sending a call with a body, aborted when its handle goes (closed, or the
/// request's store dropped): nothing outlives the request.
struct Call(JoinHandle<Result<OpenResponse, OutboundError>>);

impl Drop for Call {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Call {
    async fn outcome(&mut self) -> Result<OpenResponse, OutboundError> {
        (&mut self.0).await.unwrap_or_else(|error| {
            Err(OutboundError::BadRequest(format!(
                "the outbound call's task ended: {error}"
            )))
        })
    }
}

impl GuestCalls {
    pub fn new(outbound: Arc<Outbound>, log: Arc<CallLog>, deadline: Instant, share: Option<RequestShare>) -> Self {
        Self {
            outbound,
            log,
            deadline,
            share,
            open: Vec::new(),
        }
    }

    fn insert(&mut self, slot: Slot) -> u32 {
        match self.open.iter().position(Option::is_none) {
            Some(index) => {
                self.open[index] = Some(slot);
                index as u32 + 1
            }
            None => {
                self.open.push(Some(slot));
                self.open.len() as u32
            }
        }
    }

    /// A handle holding a refused call's message, and the message's length; `(0, 0)`, the
    /// errno alone, when [`MAX_OPEN`] handles are held already: a guest that loops on
    /// refused calls without closing them must not make the host hold a message each.
    fn insert_failure(&mut self, error: &OutboundError) -> (u32, u32) {
        if self.open_count() >= MAX_OPEN {
            return (0, 0);
        }
        let message = message_of(error);
        let length = message.len() as u32;
        (self.insert(Slot::Failed(message, error.errno())), length)
    }

    fn slot(&mut self, handle: u32) -> Option<&mut Slot> {
        self.open.get_mut((handle as usize).checked_sub(1)?)?.as_mut()
    }

    fn open_count(&self) -> usize {
        self.open.iter().filter(|slot| slot.is_some()).count()
    }
}

/// The message a call's slot keeps for `error`, cut to [`MAX_MESSAGE`] bytes: a message may
/// quote the guest's own head (each control byte escaped into six), and a request may hold
/// [`MAX_OPEN`] of them.
fn message_of(error: &OutboundError) -> Vec<u8> {
    let mut message = error.to_string();
    if message.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE - '…'.len_utf8();
        while !message.is_char_boundary(end) {
            end -= 1;
        }
        message.truncate(end);
        message.push('…');
    }
    message.into_bytes()
}

pub(crate) fn memory<T>(caller: &mut Caller<'_, T>) -> wasmtime::Result<Memory> {
    caller
        .get_export("memory")
        .and_then(Extern::into_memory)
        .ok_or_else(|| wasmtime::Error::msg("the guest exports no memory"))
}

pub(crate) fn read_guest<T>(caller: &mut Caller<'_, T>, address: u32, length: u32) -> wasmtime::Result<Vec<u8>> {
    let memory = memory(caller)?;
    let start = address as usize;
    start
        .checked_add(length as usize)
        .and_then(|end| memory.data(&*caller).get(start..end))
        .map(<[u8]>::to_vec)
        .ok_or_else(|| wasmtime::Error::msg("an outbound call named memory outside the guest's"))
}

fn write_guest<T>(caller: &mut Caller<'_, T>, address: u32, bytes: &[u8]) -> wasmtime::Result<()> {
    memory(caller)?
        .write(&mut *caller, address as usize, bytes)
        .map_err(|_| wasmtime::Error::msg("an outbound call named memory outside the guest's"))
}

fn write_pair<T>(caller: &mut Caller<'_, T>, address: u32, first: u32, second: u32) -> wasmtime::Result<()> {
    let mut bytes = [0; 8];
    bytes[..4].copy_from_slice(&first.to_le_bytes());
    bytes[4..].copy_from_slice(&second.to_le_bytes());
    write_guest(caller, address, &bytes)
}

/// The request's deadline passed: the request ends with a 504, as it would computing.
fn request_timeout() -> wasmtime::Error {
    wasmtime::Error::new(wasmtime::Trap::Interrupt)
}

/// The request a started call sends: the guest's head, and the body it will write.
fn request_of(head: abi::OutboundRequest, body: ClientBody) -> wasmtime::Result<http::Request<ClientBody>> {
    let mut request = http::Request::builder()
        .method(head.method)
        .uri(head.uri)
        .body(body)
        .map_err(|e| wasmtime::Error::msg(e.to_string()))?;
    *request.headers_mut() = head.headers;
    Ok(request)
}

/// Room in the body's channel for one piece, once it has some; `None` if the call got its
/// outcome first (or the channel closed).
async fn room(body: &mpsc::Sender<Piece>, mut done: watch::Receiver<bool>) -> Option<mpsc::Permit<'_, Piece>> {
    tokio::select! {
        permit = body.reserve() => permit.ok(),
        _ = done.wait_for(|done| *done) => None,
    }
}

/// Hands `piece` to the body's channel once it has room; false if the call got its outcome
/// first (or the channel closed), as a call may be answered before its body is taken.
async fn put(body: &mpsc::Sender<Piece>, piece: Piece, mut done: watch::Receiver<bool>) -> bool {
    tokio::select! {
        sent = body.send(piece) => sent.is_ok(),
        _ = done.wait_for(|done| *done) => false,
    }
}

/// `http_write_body`: the piece of a call's body at `buffer`, handed to the call
/// [`BODY_PART`] bytes at a time, each once the upstream has room for it and, in a pool,
/// taken from the request's share of the pool's memory until it is sent.
async fn write_body<T>(
    caller: &mut Caller<'_, T>,
    calls: fn(&mut T) -> &mut GuestCalls,
    handle: u32,
    buffer: u32,
    length: u32,
) -> wasmtime::Result<u32> {
    let (sender, deadlines, done) = match calls(caller.data_mut()).slot(handle) {
        Some(Slot::Sending {
            body, deadlines, done, ..
        }) => (body.clone(), *deadlines, done.clone()),
        _ => return Ok(ERRNO_BAD_HANDLE),
    };
    // The whole piece is checked first: one outside the guest's memory traps
    // before any of it is sent.
    let size = memory(caller)?.data_size(&*caller);
    if (buffer as usize)
        .checked_add(length as usize)
        .is_none_or(|end| end > size)
    {
        return Err(wasmtime::Error::msg(
            "an outbound call named memory outside the guest's",
        ));
    }
    let share = calls(caller.data_mut()).share.clone();
    let mut written = 0;
    while written < length {
        let part = (length - written).min(BODY_PART as u32);
        let until = deadlines.earliest().into();
        let permit = match tokio::time::timeout_at(until, room(&sender, done.clone())).await {
            Ok(Some(permit)) => permit,
            // The call has its outcome (an early answer, or a failure):
            // http_finish says which.
            Ok(None) => return Ok(ERRNO_CALL_ENDED),
            Err(_) => match deadlines.passed("") {
                OutboundError::RequestTimeout => return Err(request_timeout()),
                error => return Ok(error.errno()),
            },
        };
        let bytes = read_guest(caller, buffer + written, part)?;
        let Some(piece) = crate::request_memory::charged(share.as_ref(), bytes) else {
            drop(permit);
            // Abandoned, with its sender and its task: the upstream sees the
            // call fail, never a body cut short as if it were whole.
            let error = OutboundError::PoolMemory;
            tracing::warn!(%error, bytes = part, "an outbound request body did not fit the request's share of the pool's memory");
            if let Some(slot) = calls(caller.data_mut()).slot(handle) {
                *slot = Slot::Failed(error.to_string().into_bytes(), error.errno());
            }
            return Ok(error.errno());
        };
        permit.send(Piece::Data(piece));
        written += part;
    }
    Ok(0)
}

/// Adds the `wasmless` imports to a linker whose store data holds a [`GuestCalls`].
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    calls: fn(&mut T) -> &mut GuestCalls,
) -> wasmtime::Result<()> {
    linker.func_wrap_async(
        IMPORT_MODULE,
        HTTP_START,
        move |mut caller: Caller<'_, T>, (head, length, timeout_ms, out): (u32, u32, u32, u32)| {
            Box::new(async move { start(&mut caller, calls, head, length, timeout_ms, out).await })
        },
    )?;
    linker.func_wrap_async(
        IMPORT_MODULE,
        HTTP_WRITE_BODY,
        move |mut caller: Caller<'_, T>, (handle, buffer, length): (u32, u32, u32)| {
            Box::new(async move { write_body(&mut caller, calls, handle, buffer, length).await })
        },
    )?;
    linker.func_wrap_async(
        IMPORT_MODULE,
        HTTP_FINISH,
        move |mut caller: Caller<'_, T>, (handle, out): (u32, u32)| {
            Box::new(async move { finish(&mut caller, calls, handle, out).await })
        },
    )?;
    linker.func_wrap(
        IMPORT_MODULE,
        HTTP_READ_HEAD,
        move |mut caller: Caller<'_, T>, handle: u32, buffer: u32, length: u32| {
            read_head(&mut caller, calls, handle, buffer, length)
        },
    )?;
    linker.func_wrap_async(
        IMPORT_MODULE,
        HTTP_READ_BODY,
        move |mut caller: Caller<'_, T>, (handle, buffer, length, out): (u32, u32, u32, u32)| {
            Box::new(async move { read_body(&mut caller, calls, handle, buffer, length, out).await })
        },
    )?;
    linker.func_wrap(
        IMPORT_MODULE,
        HTTP_CLOSE,
        move |mut caller: Caller<'_, T>, handle: u32| close(&mut caller, calls, handle),
    )?;
    Ok(())
}

/// `http_start`: the call's policy checked and a slot taken; a call with a body is sent by
/// a task of its own from now on.
async fn start<T>(
    caller: &mut Caller<'_, T>,
    calls: fn(&mut T) -> &mut GuestCalls,
    head: u32,
    length: u32,
    timeout_ms: u32,
    out: u32,
) -> wasmtime::Result<u32> {
    let failed = |caller: &mut Caller<'_, T>, error: OutboundError| -> wasmtime::Result<u32> {
        let (handle, length) = calls(caller.data_mut()).insert_failure(&error);
        write_pair(caller, out, handle, length)?;
        Ok(error.errno())
    };
    if length as usize > MAX_HEAD {
        let why = format!("the request head is {length} bytes, over the {MAX_HEAD} a call may send");
        return failed(caller, OutboundError::BadRequest(why));
    }
    let encoded = read_guest(caller, head, length)?;
    let state = calls(caller.data_mut());
    if state.open_count() >= MAX_OPEN {
        let why = format!("{MAX_OPEN} calls are open: close (or read to the end) the ones done with");
        return failed(caller, OutboundError::BadRequest(why));
    }
    let head = match abi::parse_request(&encoded) {
        Ok(head) => head,
        Err(error) => return failed(caller, OutboundError::BadRequest(error.to_string())),
    };
    let guest_timeout = (timeout_ms > 0).then(|| Duration::from_millis(u64::from(timeout_ms)));
    let deadlines = state.outbound.deadlines(state.deadline, guest_timeout);
    let (outbound, log) = (state.outbound.clone(), state.log.clone());
    let admitted = match outbound.admit(&head.uri, deadlines, &log).await {
        Ok(admitted) => admitted,
        Err(OutboundError::RequestTimeout) => return Err(request_timeout()),
        Err(error) => return failed(caller, error),
    };
    let slot = if head.has_body {
        // Sent by a task of its own from now on, so the connection is made and
        // the body flows while the guest writes it.
        let (sender, body) = wasmless_outbound::body_channel(head.content_length);
        let request = request_of(head, body)?;
        let (done, done_seen) = watch::channel(false);
        let task = tokio::spawn(async move {
            let outcome = outbound.send(admitted, request, deadlines, log).await;
            let _ = done.send(true);
            outcome
        });
        Slot::Sending {
            body: sender,
            call: Call(task),
            deadlines,
            done: done_seen,
        }
    } else {
        Slot::Ready(Box::new((
            admitted,
            request_of(head, wasmless_outbound::empty_body())?,
            deadlines,
        )))
    };
    let handle = calls(caller.data_mut()).insert(slot);
    write_pair(caller, out, handle, 0)?;
    Ok(0)
}

/// `http_finish`: the body's end (or the call's send), then the response head or the
/// error's message, under the handle.
async fn finish<T>(
    caller: &mut Caller<'_, T>,
    calls: fn(&mut T) -> &mut GuestCalls,
    handle: u32,
    out: u32,
) -> wasmtime::Result<u32> {
    let state = calls(caller.data_mut());
    let (outbound, log) = (state.outbound.clone(), state.log.clone());
    let mut unsent = None;
    let slot = match state.slot(handle) {
        Some(slot @ (Slot::Ready(_) | Slot::Sending { .. })) => std::mem::replace(slot, Slot::Finishing),
        // Failed while its body was written: its message, as a call that fails here.
        Some(Slot::Failed(message, errno)) => {
            let (length, errno) = (message.len() as u32, *errno);
            write_guest(caller, out, &length.to_le_bytes())?;
            return Ok(errno);
        }
        _ => return Ok(ERRNO_BAD_HANDLE),
    };
    let result = match slot {
        Slot::Ready(ready) => {
            let (admitted, request, deadlines) = *ready;
            outbound.send(admitted, request, deadlines, log).await
        }
        Slot::Sending {
            body,
            mut call,
            deadlines,
            done,
        } => {
            let until = deadlines.earliest().into();
            match tokio::time::timeout_at(until, put(&body, Piece::End, done)).await {
                Ok(true) => {}
                // Answered before the body was taken whole: the rest stays unsent.
                Ok(false) => unsent = Some(body),
                Err(_) if deadlines.request <= deadlines.call => return Err(request_timeout()),
                Err(_) => {}
            }
            call.outcome().await
        }
        _ => unreachable!("matched above"),
    };
    let (slot, length, errno) = match result {
        Ok(response) => {
            let head = abi::encode_response_head(response.status, &response.headers);
            let length = head.len() as u32;
            let slot = Slot::Response {
                head,
                response: Box::new(response),
                pending: Bytes::new(),
                finished: false,
                _unsent: unsent,
            };
            (slot, length, 0)
        }
        Err(OutboundError::RequestTimeout) => return Err(request_timeout()),
        Err(error) => {
            let message = message_of(&error);
            let length = message.len() as u32;
            let errno = error.errno();
            (Slot::Failed(message, errno), length, errno)
        }
    };
    if let Some(finishing) = calls(caller.data_mut()).slot(handle) {
        *finishing = slot;
    }
    write_guest(caller, out, &length.to_le_bytes())?;
    Ok(errno)
}

/// `http_read_head`: the response head, or a failed call's message.
fn read_head<T>(
    caller: &mut Caller<'_, T>,
    calls: fn(&mut T) -> &mut GuestCalls,
    handle: u32,
    buffer: u32,
    length: u32,
) -> wasmtime::Result<u32> {
    let head = match calls(caller.data_mut()).slot(handle) {
        Some(Slot::Response { head, .. } | Slot::Failed(head, _)) => head[..head.len().min(length as usize)].to_vec(),
        _ => return Ok(ERRNO_BAD_HANDLE),
    };
    write_guest(caller, buffer, &head)?;
    Ok(0)
}

/// `http_read_body`: the next part of the response body; 0 bytes at its end.
async fn read_body<T>(
    caller: &mut Caller<'_, T>,
    calls: fn(&mut T) -> &mut GuestCalls,
    handle: u32,
    buffer: u32,
    length: u32,
    out: u32,
) -> wasmtime::Result<u32> {
    let result = match calls(caller.data_mut()).slot(handle) {
        Some(Slot::Failed(..)) => Ok(Bytes::new()),
        Some(Slot::Response {
            response,
            pending,
            finished,
            ..
        }) => {
            let mut outcome = Ok(());
            if pending.is_empty() && !*finished {
                match response.next_chunk().await {
                    Ok(Some(chunk)) => *pending = chunk,
                    Ok(None) => *finished = true,
                    Err(error) => {
                        *finished = true;
                        outcome = Err(error);
                    }
                }
            }
            outcome.map(|()| pending.split_to(pending.len().min(length as usize)))
        }
        _ => return Ok(ERRNO_BAD_HANDLE),
    };
    let (bytes, errno) = match result {
        Ok(bytes) => (bytes, 0),
        Err(OutboundError::RequestTimeout) => return Err(request_timeout()),
        Err(error) => {
            let message = message_of(&error);
            let shown = message.len().min(length as usize);
            (Bytes::copy_from_slice(&message[..shown]), error.errno())
        }
    };
    write_guest(caller, buffer, &bytes)?;
    write_guest(caller, out, &(bytes.len() as u32).to_le_bytes())?;
    Ok(errno)
}

/// `http_close`: the handle freed; a call whose body was not finished is abandoned.
fn close<T>(caller: &mut Caller<'_, T>, calls: fn(&mut T) -> &mut GuestCalls, handle: u32) -> u32 {
    let state = calls(caller.data_mut());
    match (handle as usize)
        .checked_sub(1)
        .and_then(|index| state.open.get_mut(index))
    {
        Some(slot @ Some(_)) => {
            *slot = None;
            0
        }
        _ => ERRNO_BAD_HANDLE,
    }
}

#[cfg(test)]
mod tests;
