//! The `wasmless` imports through which a WASI preview1 guest (the Go SDK's transport,
//! sdk/go/outbound) makes outbound calls. Every pointer and length comes from the guest:
//! each is checked against its memory, and a range outside it traps that request.
//!
//! ```text
//! http_send(request, request_len, timeout_ms, out) -> errno
//!     request: wasmless_formats::outbound's encoding. timeout_ms 0: none of its own.
//!     out: two u32s, a handle and the length of what http_read_head gives for it: the
//!     response head (errno 0), or the error's message (errno != 0; no handle if 0 long).
//! http_read_head(handle, buffer, buffer_len) -> errno
//! http_read_body(handle, buffer, buffer_len, out_n) -> errno
//!     out_n: bytes written; 0 at the body's end. On errno != 0 the bytes written are
//!     the error's message.
//! http_close(handle) -> errno
//! ```

use super::{CallLog, OpenResponse, Outbound, OutboundError};
use bytes::Bytes;
use std::sync::Arc;
use std::time::{Duration, Instant};
use wasmless_formats::outbound::{
    self as abi, ERRNO_BAD_HANDLE, HTTP_CLOSE, HTTP_READ_BODY, HTTP_READ_HEAD, HTTP_SEND, IMPORT_MODULE,
};
use wasmtime::{Caller, Extern, Linker, Memory};

/// Largest encoded request a guest may hand over (body included).
const MAX_REQUEST: usize = 16 << 20;
/// Calls one request may have open at once.
const MAX_OPEN: usize = 64;

/// One request's outbound calls: the Function's client, the request's deadline, and the
/// responses the guest has open.
pub struct GuestCalls {
    outbound: Arc<Outbound>,
    log: Arc<CallLog>,
    deadline: Instant,
    open: Vec<Option<Slot>>,
}

enum Slot {
    Response {
        head: Vec<u8>,
        response: Box<OpenResponse>,
        pending: Bytes,
        finished: bool,
    },
    Failed(Vec<u8>),
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

/// Adds the `wasmless` imports to a linker whose store data holds a [`GuestCalls`].
pub fn add_to_linker<T: Send + 'static>(
    linker: &mut Linker<T>,
    calls: fn(&mut T) -> &mut GuestCalls,
) -> wasmtime::Result<()> {
    linker.func_wrap_async(
        IMPORT_MODULE,
        HTTP_SEND,
        move |mut caller: Caller<'_, T>, (request, length, timeout_ms, out): (u32, u32, u32, u32)| {
            Box::new(async move {
                let failed = |caller: &mut Caller<'_, T>, error: OutboundError| -> wasmtime::Result<u32> {
                    let message = error.to_string().into_bytes();
                    let length = message.len() as u32;
                    let handle = calls(caller.data_mut()).insert(Slot::Failed(message));
                    write_pair(caller, out, handle, length)?;
                    Ok(error.errno())
                };
                if length as usize > MAX_REQUEST {
                    let why = format!("the request is {length} bytes, over the {MAX_REQUEST} a call may send");
                    return failed(&mut caller, OutboundError::BadRequest(why));
                }
                let encoded = read_guest(&mut caller, request, length)?;
                let state = calls(caller.data_mut());
                if state.open_count() >= MAX_OPEN {
                    let why = format!("{MAX_OPEN} responses are open: close (or read to the end) the ones done with");
                    return failed(&mut caller, OutboundError::BadRequest(why));
                }
                let request = match abi::parse_request(&encoded) {
                    Ok(request) => request,
                    Err(error) => return failed(&mut caller, OutboundError::BadRequest(error.to_string())),
                };
                let guest_timeout = (timeout_ms > 0).then(|| Duration::from_millis(u64::from(timeout_ms)));
                let deadlines = state.outbound.deadlines(state.deadline, guest_timeout);
                let (outbound, log) = (state.outbound.clone(), state.log.clone());
                match outbound.send(request, deadlines, log).await {
                    Ok(response) => {
                        let head = abi::encode_response_head(response.status, &response.headers);
                        let length = head.len() as u32;
                        let handle = calls(caller.data_mut()).insert(Slot::Response {
                            head,
                            response: Box::new(response),
                            pending: Bytes::new(),
                            finished: false,
                        });
                        write_pair(&mut caller, out, handle, length)?;
                        Ok(0)
                    }
                    Err(OutboundError::RequestTimeout) => Err(request_timeout()),
                    Err(error) => failed(&mut caller, error),
                }
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
                None => return Ok(ERRNO_BAD_HANDLE),
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
                    None => return Ok(ERRNO_BAD_HANDLE),
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
