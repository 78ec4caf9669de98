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
//!     if 0 long).
//! http_write_body(handle, buffer, buffer_len) -> errno
//!     With the head's body flag: the next piece of the request body, all of it, taken
//!     once the upstream has room for it (the guest waits meanwhile: backpressure).
//!     errno 12: the call ended first (the upstream answered early, or the call failed):
//!     stop writing, http_finish tells which. errno 2: the deadline passed.
//! http_finish(handle, out) -> errno
//!     The body's end (or, without a body, the call's send), then the response head: out
//!     is the length of what http_read_head gives for the handle, the head (errno 0) or
//!     the error's message (errno != 0).
//! http_read_head(handle, buffer, buffer_len) -> errno
//! http_read_body(handle, buffer, buffer_len, out_n) -> errno
//!     out_n: bytes written; 0 at the body's end. On errno != 0 the bytes written are
//!     the error's message.
//! http_close(handle) -> errno
//!     Frees the handle; a call whose body was not finished is abandoned (the upstream
//!     sees it fail, never a body cut short as if it were whole).
//! ```

use super::{Admitted, CallLog, ClientBody, Deadlines, OpenResponse, Outbound, OutboundError, Piece};
use bytes::Bytes;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use wasmless_formats::outbound::{
    self as abi, ERRNO_BAD_HANDLE, ERRNO_CALL_ENDED, HTTP_CLOSE, HTTP_FINISH, HTTP_READ_BODY, HTTP_READ_HEAD,
    HTTP_START, HTTP_WRITE_BODY, IMPORT_MODULE,
};
use wasmtime::{Caller, Extern, Linker, Memory};

/// Largest encoded request head a guest may hand over.
const MAX_HEAD: usize = 1 << 20;
/// Calls one request may have open at once.
const MAX_OPEN: usize = 64;

/// One request's outbound calls: the Function's client, the request's deadline, and the
/// calls the guest has open.
pub struct GuestCalls {
    outbound: Arc<Outbound>,
    log: Arc<CallLog>,
    deadline: Instant,
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
    Failed(Vec<u8>),
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
    pub fn new(outbound: Arc<Outbound>, log: Arc<CallLog>, deadline: Instant) -> Self {
        Self {
            outbound,
            log,
            deadline,
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

    fn slot(&mut self, handle: u32) -> Option<&mut Slot> {
        self.open.get_mut((handle as usize).checked_sub(1)?)?.as_mut()
    }

    fn open_count(&self) -> usize {
        self.open.iter().filter(|slot| slot.is_some()).count()
    }
}

fn memory<T>(caller: &mut Caller<'_, T>) -> wasmtime::Result<Memory> {
    caller
        .get_export("memory")
        .and_then(Extern::into_memory)
        .ok_or_else(|| wasmtime::Error::msg("the guest exports no memory"))
}

fn read_guest<T>(caller: &mut Caller<'_, T>, address: u32, length: u32) -> wasmtime::Result<Vec<u8>> {
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

/// Hands `piece` to the body's channel once it has room; false if the call got its outcome
/// first (or the channel closed), as a call may be answered before its body is taken.
async fn put(body: &mpsc::Sender<Piece>, piece: Piece, mut done: watch::Receiver<bool>) -> bool {
    tokio::select! {
        sent = body.send(piece) => sent.is_ok(),
        _ = done.wait_for(|done| *done) => false,
    }
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
            Box::new(async move {
                let failed = |caller: &mut Caller<'_, T>, error: OutboundError| -> wasmtime::Result<u32> {
                    let message = error.to_string().into_bytes();
                    let length = message.len() as u32;
                    let handle = calls(caller.data_mut()).insert(Slot::Failed(message));
                    write_pair(caller, out, handle, length)?;
                    Ok(error.errno())
                };
                if length as usize > MAX_HEAD {
                    let why = format!("the request head is {length} bytes, over the {MAX_HEAD} a call may send");
                    return failed(&mut caller, OutboundError::BadRequest(why));
                }
                let encoded = read_guest(&mut caller, head, length)?;
                let state = calls(caller.data_mut());
                if state.open_count() >= MAX_OPEN {
                    let why = format!("{MAX_OPEN} calls are open: close (or read to the end) the ones done with");
                    return failed(&mut caller, OutboundError::BadRequest(why));
                }
                let head = match abi::parse_request(&encoded) {
                    Ok(head) => head,
                    Err(error) => return failed(&mut caller, OutboundError::BadRequest(error.to_string())),
                };
                let guest_timeout = (timeout_ms > 0).then(|| Duration::from_millis(u64::from(timeout_ms)));
                let deadlines = state.outbound.deadlines(state.deadline, guest_timeout);
                let (outbound, log) = (state.outbound.clone(), state.log.clone());
                let admitted = match outbound.admit(&head.uri, deadlines, &log).await {
                    Ok(admitted) => admitted,
                    Err(OutboundError::RequestTimeout) => return Err(request_timeout()),
                    Err(error) => return failed(&mut caller, error),
                };
                let slot = if head.has_body {
                    // Sent by a task of its own from now on, so the connection is made and
                    // the body flows while the guest writes it.
                    let (sender, body) = super::body_channel(head.content_length);
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
                    Slot::Ready(Box::new((admitted, request_of(head, super::empty_body())?, deadlines)))
                };
                let handle = calls(caller.data_mut()).insert(slot);
                write_pair(&mut caller, out, handle, 0)?;
                Ok(0)
            })
        },
    )?;
    linker.func_wrap_async(
        IMPORT_MODULE,
        HTTP_WRITE_BODY,
        move |mut caller: Caller<'_, T>, (handle, buffer, length): (u32, u32, u32)| {
            Box::new(async move {
                let (sender, deadlines, done) = match calls(caller.data_mut()).slot(handle) {
                    Some(Slot::Sending {
                        body, deadlines, done, ..
                    }) => (body.clone(), *deadlines, done.clone()),
                    _ => return Ok(ERRNO_BAD_HANDLE),
                };
                if length == 0 {
                    return Ok(0);
                }
                let piece = Bytes::from(read_guest(&mut caller, buffer, length)?);
                let sent =
                    tokio::time::timeout_at(deadlines.earliest().into(), put(&sender, Piece::Data(piece), done)).await;
                match sent {
                    Ok(true) => Ok(0),
                    // The call has its outcome (an early answer, or a failure): http_finish
                    // says which.
                    Ok(false) => Ok(ERRNO_CALL_ENDED),
                    Err(_) => match deadlines.passed("") {
                        OutboundError::RequestTimeout => Err(request_timeout()),
                        error => Ok(error.errno()),
                    },
                }
            })
        },
    )?;
    linker.func_wrap_async(
        IMPORT_MODULE,
        HTTP_FINISH,
        move |mut caller: Caller<'_, T>, (handle, out): (u32, u32)| {
            Box::new(async move {
                let state = calls(caller.data_mut());
                let (outbound, log) = (state.outbound.clone(), state.log.clone());
                let mut unsent = None;
                let slot = match state.slot(handle) {
                    Some(slot @ (Slot::Ready(_) | Slot::Sending { .. })) => std::mem::replace(slot, Slot::Finishing),
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
                        let message = error.to_string().into_bytes();
                        let length = message.len() as u32;
                        (Slot::Failed(message), length, error.errno())
                    }
                };
                if let Some(finishing) = calls(caller.data_mut()).slot(handle) {
                    *finishing = slot;
                }
                write_guest(&mut caller, out, &length.to_le_bytes())?;
                Ok(errno)
            })
        },
    )?;
    linker.func_wrap(
        IMPORT_MODULE,
        HTTP_READ_HEAD,
        move |mut caller: Caller<'_, T>, handle: u32, buffer: u32, length: u32| -> wasmtime::Result<u32> {
            let head = match calls(caller.data_mut()).slot(handle) {
                Some(Slot::Response { head, .. } | Slot::Failed(head)) => {
                    head[..head.len().min(length as usize)].to_vec()
                }
                _ => return Ok(ERRNO_BAD_HANDLE),
            };
            write_guest(&mut caller, buffer, &head)?;
            Ok(0)
        },
    )?;
    linker.func_wrap_async(
        IMPORT_MODULE,
        HTTP_READ_BODY,
        move |mut caller: Caller<'_, T>, (handle, buffer, length, out): (u32, u32, u32, u32)| {
            Box::new(async move {
                let result = match calls(caller.data_mut()).slot(handle) {
                    Some(Slot::Failed(_)) => Ok(Bytes::new()),
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
                        let message = error.to_string().into_bytes();
                        let shown = message.len().min(length as usize);
                        (Bytes::copy_from_slice(&message[..shown]), error.errno())
                    }
                };
                write_guest(&mut caller, buffer, &bytes)?;
                write_guest(&mut caller, out, &(bytes.len() as u32).to_le_bytes())?;
                Ok(errno)
            })
        },
    )?;
    linker.func_wrap(
        IMPORT_MODULE,
        HTTP_CLOSE,
        move |mut caller: Caller<'_, T>, handle: u32| -> u32 {
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
        },
    )?;
    Ok(())
}
