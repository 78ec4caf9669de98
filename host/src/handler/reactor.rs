//! Go reactors (`wasmless.io/wasmless/reactor`): a fresh instance of the snapshotted
//! module per request, from the pooling allocator with copy-on-write memory images, so
//! that Go's start-up (done once, at build time) is never paid again; or, with
//! `--isolation shared`, instances kept and reused one request at a time. The request goes
//! in, and the response comes out, in the SDK's binary encoding (documented in
//! sdk/go/reactor/reactor.go); what the handler sees is what net/http/cgi would give it.

use super::reactor_response;
use super::store::{self, GuestState, Output};
use super::stream::{ClientGone, End, ResponseSink, StreamEnd, StreamHead, Streamed};
use super::{Connection, Failure, MAX_HANDLER_OUTPUT, Permit, Shared};
use crate::abi::{REACTOR_HANDLE, REACTOR_REQUEST_BUFFER};
use crate::clocks::WallMonotonic;
use crate::limits::Isolation;
use crate::request_memory::RequestShare;
use axum::body::Body;
use bytes::Bytes;
use http::{Response, header};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::{mpsc, oneshot};
use tracing::Instrument;
use wasmless_outbound::CallLog;
use wasmtime::{Engine, InstancePre, Memory, Module, Store, TypedFunc};
use wasmtime_wasi::p1::WasiP1Ctx;

pub struct ReactorHandler {
    pre: InstancePre<GuestState>,
    shared: Arc<Shared>,
    /// A reactor that was not snapshotted still exports `_initialize`, and must run it
    /// (Go's whole start-up) in every instance: correct, and as slow as a command.
    initialize: bool,
    /// With `--isolation shared`, the instances waiting for a request, the one used last
    /// at the end: under a light load one instance serves every request, so its state
    /// (a counter, a cache) is seen by each. At most as many as requests ran at once.
    idle: Option<Arc<Mutex<Vec<Reactor>>>>,
}

/// One instance, its store, and the exports a request calls.
struct Reactor {
    store: Store<GuestState>,
    memory: Memory,
    request_buffer: TypedFunc<u32, u32>,
    handle: TypedFunc<(), u64>,
    /// Requests this instance has served.
    served: u32,
}

impl ReactorHandler {
    pub fn new(engine: &Engine, module: &Module, shared: Arc<Shared>) -> wasmtime::Result<Self> {
        let initialize = module.get_export("_initialize").is_some();
        if initialize {
            tracing::warn!(
                "the reactor was not snapshotted: Go starts up in every new instance; build it with wasmless-builder"
            );
        }
        let pre = store::linker(engine)?.instantiate_pre(module)?;
        let idle = (shared.limits.isolation == Isolation::Shared).then(|| Arc::new(Mutex::new(Vec::new())));
        Ok(Self {
            pre,
            shared,
            initialize,
            idle,
        })
    }

    /// Serves one request; the permit is held until its instance is done, which for a
    /// streamed response is after the last byte of its body.
    pub async fn invoke(
        &self,
        request: http::Request<Bytes>,
        connection: Connection,
        permit: Permit,
    ) -> Result<Response<Body>, Failure> {
        let log = super::call_log(&request);
        let share = super::request_share(&request, &self.shared.limits);
        // The head is encoded apart: the body goes from the request into the instance's
        // memory as it is, so the host holds it once, not twice.
        let (parts, body) = request.into_parts();
        let head = encode_head(&parts, body.len(), connection);
        drop(parts);
        let output = Output::new(share.clone());
        let mut wasi = output.wasi(&self.shared);
        wasi.monotonic_clock(WallMonotonic);
        let wasi = wasi.build_p1();
        let kept = self.idle.as_ref().and_then(|idle| idle.lock().unwrap().pop());
        let mut reactor = match kept {
            Some(mut reactor) => {
                store::renew(&mut reactor.store, &self.shared, wasi, log, share.clone());
                reactor
            }
            None => match self.instantiate(wasi, log, share).await {
                Ok(reactor) => reactor,
                Err(failure) => {
                    output.log_stdout();
                    output.log_stderr();
                    return Err(failure);
                }
            },
        };
        let (to_request, streamed) = oneshot::channel();
        reactor.store.data_mut().response = ResponseSink::waiting(to_request, self.shared.limits.request_share());
        let deadline = reactor.store.data().deadline;
        // The handler runs here, on the connection's task, until it answers or starts a
        // stream; only a stream gets a task of its own (as a component's body does).
        let mut run = Box::pin(reactor.serve(head, body).in_current_span());
        // The epoch deadline stops a guest only while it computes: one asleep in a host
        // call (Go's time.Sleep is a poll_oneoff) is stopped here, at its deadline.
        let expired = tokio::time::sleep_until(deadline.into());
        tokio::pin!(expired);
        let head = tokio::select! {
            biased;
            (reactor, outcome) = &mut run => {
                output.log_stdout();
                output.log_stderr();
                let response = outcome
                    .map_err(|error| Failure::classify(error, &reactor.store.data().limiter))
                    .and_then(|packed| reactor.read_response(packed).map_err(Failure::BadResponse))
                    .and_then(|bytes| decode_response(&bytes))?;
                // Only an instance that answered goes back: one that failed may have been
                // stopped anywhere (a timeout mid-way through the GC) and is dropped, as is
                // every instance of a request that was cancelled (its future dropped with it).
                self.keep(reactor);
                drop(permit);
                return Ok(response);
            }
            Ok(head) = streamed => head,
            () = &mut expired => {
                drop(run);
                output.log_stdout();
                output.log_stderr();
                return Err(Failure::Timeout);
            }
        };
        let StreamHead { response, end, closed } = head;
        let stream = Stream {
            run,
            output,
            permit,
            end: end.clone(),
            closed,
            deadline,
            keep: self.keeper(),
            metrics: self.shared.metrics.clone(),
        };
        tokio::spawn(stream.finish().in_current_span());
        let mut response = response.map(Body::new);
        response.extensions_mut().insert(Streamed(end));
        Ok(response)
    }

    /// Gives an instance that answered back to the idle ones (`--isolation shared`).
    fn keep(&self, reactor: Reactor) {
        self.keeper().keep(reactor);
    }

    fn keeper(&self) -> Keeper {
        Keeper {
            idle: self.idle.clone(),
            requests_per_instance: self.shared.limits.requests_per_instance,
        }
    }

    /// A new instance of the snapshot, initialised if it was not snapshotted.
    async fn instantiate(
        &self,
        wasi: WasiP1Ctx,
        log: Arc<CallLog>,
        share: Option<RequestShare>,
    ) -> Result<Reactor, Failure> {
        let mut store = store::new_store(self.pre.module().engine(), &self.shared, wasi, log, share);
        match self.exports(&mut store).await {
            Ok((memory, request_buffer, handle)) => Ok(Reactor {
                store,
                memory,
                request_buffer,
                handle,
                served: 0,
            }),
            Err(error) => Err(Failure::classify(error, &store.data().limiter)),
        }
    }

    async fn exports(
        &self,
        store: &mut Store<GuestState>,
    ) -> wasmtime::Result<(Memory, TypedFunc<u32, u32>, TypedFunc<(), u64>)> {
        let started = Instant::now();
        let instance = super::instantiate_span(self.pre.instantiate_async(&mut *store)).await?;
        self.shared.metrics.observe_instantiate(started.elapsed());
        if self.initialize {
            let initialize = instance.get_typed_func::<(), ()>(&mut *store, "_initialize")?;
            let span = tracing::info_span!(target: wasmless_telemetry::TARGET, "initialize");
            tracing::Instrument::instrument(initialize.call_async(&mut *store, ()), span).await?;
        }
        let memory = instance
            .get_memory(&mut *store, "memory")
            .ok_or_else(|| wasmtime::Error::msg("the reactor exports no memory"))?;
        let request_buffer = instance.get_typed_func::<u32, u32>(&mut *store, REACTOR_REQUEST_BUFFER)?;
        let handle = instance.get_typed_func::<(), u64>(&mut *store, REACTOR_HANDLE)?;
        Ok((memory, request_buffer, handle))
    }
}

impl Reactor {
    /// Runs the handler on the request; its result is the response's address and length
    /// (unread if the handler streamed its response).
    async fn serve(mut self, head: Vec<u8>, body: Bytes) -> (Self, wasmtime::Result<u64>) {
        let outcome = self.handle(&head, body).await;
        (self, outcome)
    }

    async fn handle(&mut self, head: &[u8], body: Bytes) -> wasmtime::Result<u64> {
        let store = &mut self.store;
        let length = u32::try_from(head.len() + body.len()).map_err(|_| wasmtime::Error::msg("request over 4 GiB"))?;
        let address = self.request_buffer.call_async(&mut *store, length).await?;
        self.memory.write(&mut *store, address as usize, head)?;
        self.memory.write(&mut *store, address as usize + head.len(), &body)?;
        drop(body);
        self.handle.call_async(&mut *store, ()).await
    }

    /// The response bytes at the range `handle` returned, or why the range cannot be one
    /// (a 502, as a malformed response is).
    fn read_response(&self, packed: u64) -> Result<Vec<u8>, String> {
        let (address, length) = ((packed >> 32) as usize, (packed & 0xffff_ffff) as usize);
        // The guest names the range: it is checked against its memory, and against what a
        // handler may write, before anything is allocated for it.
        if length > MAX_HANDLER_OUTPUT {
            return Err(format!(
                "the reactor's response is {length} bytes, over the {MAX_HANDLER_OUTPUT} a handler may write whole; stream it (Flush, or write more than 64 KiB)"
            ));
        }
        address
            .checked_add(length)
            .and_then(|end| self.memory.data(&self.store).get(address..end))
            .map(<[u8]>::to_vec)
            .ok_or_else(|| "the reactor's response lies outside its memory".to_string())
    }
}

/// Where an instance that answered goes: back to the idle ones with `--isolation shared`
/// (until it has served its last request), or away.
struct Keeper {
    idle: Option<Arc<Mutex<Vec<Reactor>>>>,
    requests_per_instance: u32,
}

impl Keeper {
    fn keep(&self, mut reactor: Reactor) {
        let Some(idle) = &self.idle else {
            return;
        };
        // A kept instance holds no request's sink: its stream's channel closes now.
        reactor.store.data_mut().response = ResponseSink::default();
        reactor.served += 1;
        if reactor.served < self.requests_per_instance {
            idle.lock().unwrap().push(reactor);
        } else {
            tracing::debug!(served = reactor.served, "a shared instance served its last request");
        }
    }
}

/// A streamed response after its head: the handler runs on in a task of its own, which
/// holds the request's permit and instance until the handler returns, fails, runs out of
/// time or loses its client, whichever comes first.
struct Stream<Run> {
    run: Pin<Box<Run>>,
    output: Output,
    permit: Permit,
    end: StreamEnd,
    closed: mpsc::Sender<Bytes>,
    deadline: Instant,
    keep: Keeper,
    metrics: Arc<crate::metrics::Metrics>,
}

/// What came first, of the handler's end, its deadline and its client leaving.
enum Ending {
    Ran((Reactor, wasmtime::Result<u64>)),
    Deadline,
    Closed,
}

impl<Run: Future<Output = (Reactor, wasmtime::Result<u64>)>> Stream<Run> {
    async fn finish(self) {
        let Stream {
            mut run,
            output,
            permit,
            end,
            closed,
            deadline,
            keep,
            metrics,
        } = self;
        // The epoch deadline stops a guest only while it computes; one waiting for a
        // client that does not read, or sleeping, is stopped here.
        let deadline = tokio::time::sleep_until(deadline.into());
        tokio::pin!(deadline);
        let mut ending = tokio::select! {
            biased;
            ran = &mut run => Ending::Ran(ran),
            () = &mut deadline => Ending::Deadline,
            () = closed.closed() => Ending::Closed,
        };
        // hyper lets go of a body whose declared length is all out without waiting for
        // its end: the handler may finish what it does after its last byte.
        if matches!(ending, Ending::Closed) && end.delivered() {
            ending = tokio::select! {
                biased;
                ran = &mut run => Ending::Ran(ran),
                () = &mut deadline => Ending::Deadline,
            };
        }
        let outcome = match ending {
            Ending::Ran((reactor, Ok(_))) => Ok(reactor),
            Ending::Ran((_, Err(error))) if error.is::<ClientGone>() => Err(None),
            Ending::Ran((reactor, Err(error))) => Err(Some(Failure::classify(error, &reactor.store.data().limiter))),
            Ending::Deadline => Err(Some(Failure::Timeout)),
            Ending::Closed => Err(None),
        };
        match outcome {
            Ok(reactor) => {
                end.set(End::Complete);
                keep.keep(reactor);
            }
            Err(None) => {
                end.set(End::ClientGone);
                tracing::debug!("the client left a streamed response: its handler was stopped");
            }
            Err(Some(failure)) => {
                end.set(match failure {
                    Failure::Timeout => End::Timeout,
                    ref failure => End::Failed(failure.kind()),
                });
                // The head is out: the client sees the body end (cleanly at a timeout), the
                // log and metrics see why. The pool's memory taken by others is a refusal,
                // as before the head, not this handler's trap.
                match failure {
                    Failure::SharedMemoryFull(_) => metrics.refuse(crate::metrics::Refusal::PoolMemory),
                    _ => metrics.count_trap(failure.kind()),
                }
                failure.record(&tracing::Span::current());
                tracing::error!(target: wasmless_telemetry::TARGET, kind = failure.kind(), "failed after the response headers");
                tracing::error!(kind = failure.kind(), failure = ?failure, "handler failed after sending its response headers");
            }
        }
        // The store goes first, with its sender; the body's channel closes with the last.
        drop(run);
        output.log_stdout();
        output.log_stderr();
        drop(closed);
        drop(permit);
    }
}

fn put_u32(out: &mut Vec<u8>, value: u32) {
    out.extend_from_slice(&value.to_le_bytes());
}

fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u32(out, bytes.len() as u32);
    out.extend_from_slice(bytes);
}

/// The request in the SDK's encoding up to its body (which follows, `body_len` bytes),
/// carrying what the CGI environment carries (see `cgi::cgi_environment`), so that a
/// handler sees the same request either way: the
/// values of a repeated header joined with ", ", `_` in a name read as `-`, and neither
/// Content-Length (the body's length says it), Host (its own field) nor Proxy (httpoxy,
/// which CGI leaves out) among the headers.
fn encode_head(request: &http::request::Parts, body_len: usize, connection: Connection) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    put_bytes(&mut out, request.method.as_str().as_bytes());
    let uri = request.uri.path_and_query().map_or("/", |pq| pq.as_str());
    put_bytes(&mut out, uri.as_bytes());
    put_bytes(&mut out, format!("{:?}", request.version).as_bytes());
    let host = request
        .headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("");
    put_bytes(&mut out, host.as_bytes());
    put_bytes(&mut out, connection.remote.ip().to_string().as_bytes());
    put_u32(&mut out, u32::from(connection.remote.port()));
    let headers: Vec<(String, String)> = request
        .headers
        .keys()
        .filter(|name| **name != header::CONTENT_LENGTH && **name != header::HOST && name.as_str() != "proxy")
        .map(|name| {
            let values: Vec<&str> = request
                .headers
                .get_all(name)
                .iter()
                .filter_map(|v| v.to_str().ok())
                .collect();
            (name.as_str().replace('_', "-"), values.join(", "))
        })
        .collect();
    put_u32(&mut out, headers.len() as u32);
    for (name, value) in &headers {
        put_bytes(&mut out, name.as_bytes());
        put_bytes(&mut out, value.as_bytes());
    }
    put_u32(&mut out, body_len as u32);
    out
}

/// Reads a reactor's response ([`reactor_response::parse`]) into what axum sends.
fn decode_response(output: &[u8]) -> Result<Response<Body>, Failure> {
    reactor_response::parse(output)
        .map(|response| response.map(Body::from))
        .map_err(|e| Failure::BadResponse(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handler::reactor_response::Reader;
    use http::StatusCode;

    fn response_bytes(status: u32, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        put_u32(&mut out, status);
        put_u32(&mut out, headers.len() as u32);
        for (name, value) in headers {
            put_bytes(&mut out, name.as_bytes());
            put_bytes(&mut out, value.as_bytes());
        }
        put_bytes(&mut out, body);
        out
    }

    #[test]
    fn response_decodes_and_malformed_ones_are_bad_gateway() {
        let response = decode_response(&response_bytes(201, &[("X-A", "1"), ("X-A", "2")], b"hi")).unwrap();
        assert_eq!(response.status(), 201);
        assert_eq!(response.headers().get_all("x-a").iter().count(), 2);
        for output in [
            response_bytes(42, &[], b""),
            response_bytes(200, &[("Bad Name", "x")], b""),
            response_bytes(200, &[("X", "a\u{1}b")], b""),
            response_bytes(200, &[], b"body")[..10].to_vec(),
            [response_bytes(200, &[], b"body"), b"more".to_vec()].concat(),
            Vec::new(),
        ] {
            assert_eq!(decode_response(&output).unwrap_err().status(), StatusCode::BAD_GATEWAY);
        }
    }

    #[test]
    fn request_carries_what_cgi_carries() {
        let request = http::Request::post("/p?q=1")
            .header("host", "example.com")
            .header("x-multi", "one")
            .header("x-multi", "two")
            .header("x_under", "u")
            .header("proxy", "http://evil")
            .header("content-length", "4")
            .body(Bytes::from_static(b"body"))
            .unwrap();
        let connection = Connection {
            remote: "10.1.2.3:5555".parse().unwrap(),
            local_port: 8080,
        };
        let (parts, body) = request.into_parts();
        let encoded = [encode_head(&parts, body.len(), connection), body.to_vec()].concat();
        let mut reader = Reader(&encoded);
        let mut text = || String::from_utf8(reader.bytes().unwrap().to_vec()).unwrap();
        assert_eq!(
            [text(), text(), text(), text(), text()],
            ["POST", "/p?q=1", "HTTP/1.1", "example.com", "10.1.2.3"]
        );
        assert_eq!(reader.u32(), Some(5555));
        let count = reader.u32().unwrap();
        let headers: Vec<(String, String)> = (0..count)
            .map(|_| {
                let name = String::from_utf8(reader.bytes().unwrap().to_vec()).unwrap();
                (name, String::from_utf8(reader.bytes().unwrap().to_vec()).unwrap())
            })
            .collect();
        assert_eq!(
            headers,
            [("x-multi".into(), "one, two".into()), ("x-under".into(), "u".into())]
        );
        assert_eq!(reader.bytes(), Some(&b"body"[..]));
    }
}
