//! Calling other services: [`send`] a request over `wasi:http/outgoing-handler`. The
//! runtime sends it if the Function's `spec.outbound.allow` names the destination, adds
//! the headers the Function's `spec.outbound.headers` give (whose values the handler
//! never sees), and bounds it by `spec.outbound.timeout` and the request's own timeout.

use crate::{Request, Response};
use wasip2::http::outgoing_handler;
use wasip2::http::types::{ErrorCode, Fields, IncomingBody, Method, OutgoingBody, OutgoingRequest, Scheme};

/// `blocking-write-and-flush` takes at most 4096 bytes per call.
const WRITE_CHUNK: usize = 4096;
const READ_CHUNK: u64 = 64 * 1024;

/// Why a call failed, as the runtime said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutboundError {
    /// The `wasi:http` error code, e.g. `HttpRequestDenied`, `ConnectionRefused`.
    pub code: String,
    message: String,
    denied: bool,
}

impl OutboundError {
    fn new(code: &ErrorCode, destination: &str) -> Self {
        let debug = format!("{code:?}");
        let code_name = debug.strip_prefix("ErrorCode::").unwrap_or(&debug).to_string();
        let denied = matches!(code, ErrorCode::HttpRequestDenied | ErrorCode::DestinationIpProhibited);
        let message = match code {
            ErrorCode::HttpRequestDenied => {
                format!("the call to {destination} was denied: it is not in this Function's spec.outbound.allow")
            }
            ErrorCode::DestinationIpProhibited => format!(
                "the call to {destination} was refused: it resolves to an address handlers may not call (loopback, link-local, the runtime's admin port)"
            ),
            ErrorCode::HttpResponseTimeout | ErrorCode::ConnectionTimeout | ErrorCode::ConnectionReadTimeout => {
                format!("the call to {destination} timed out (spec.outbound.timeout, or the request's own)")
            }
            ErrorCode::HttpResponseBodySize(limit) => format!(
                "the response from {destination} is over spec.outbound.maxResponseBody ({} bytes)",
                limit.map_or("?".into(), |l| l.to_string())
            ),
            other => format!("the call to {destination} failed: {other:?}"),
        };
        Self {
            code: code_name,
            message,
            denied,
        }
    }

    fn other(destination: &str, why: impl std::fmt::Display) -> Self {
        Self {
            code: "InternalError".into(),
            message: format!("the call to {destination} failed: {why}"),
            denied: false,
        }
    }

    /// Whether the allow-list refused the destination.
    pub fn is_denied(&self) -> bool {
        self.denied
    }
}

impl std::fmt::Display for OutboundError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for OutboundError {}

/// Sends `request` (an absolute `http://` or `https://` URI) and returns the response
/// with its whole body.
///
/// ```ignore
/// let request = wasmless_sdk::http::Request::get("http://orders:8080/today").body(Vec::new())?;
/// let response = wasmless_sdk::send(request)?;
/// ```
pub fn send(request: Request) -> Result<Response, OutboundError> {
    let (parts, body) = request.into_parts();
    let destination = parts
        .uri
        .authority()
        .map_or_else(|| parts.uri.to_string(), ToString::to_string);
    let fail = |why: &dyn std::fmt::Display| OutboundError::other(&destination, why);
    let headers = Fields::new();
    for (name, value) in &parts.headers {
        headers
            .append(name.as_str(), value.as_bytes())
            .map_err(|e| fail(&format!("header {name}: {e:?}")))?;
    }
    let outgoing = OutgoingRequest::new(headers);
    outgoing
        .set_method(&method(&parts.method))
        .map_err(|()| fail(&"the method is not valid"))?;
    let scheme = match parts.uri.scheme_str() {
        Some("http") => Scheme::Http,
        Some("https") => Scheme::Https,
        _ => return Err(fail(&"the URI must be absolute, http:// or https://")),
    };
    outgoing
        .set_scheme(Some(&scheme))
        .map_err(|()| fail(&"the scheme is not valid"))?;
    outgoing
        .set_authority(parts.uri.authority().map(|a| a.as_str()))
        .map_err(|()| fail(&"the authority is not valid"))?;
    outgoing
        .set_path_with_query(parts.uri.path_and_query().map(|pq| pq.as_str()))
        .map_err(|()| fail(&"the path is not valid"))?;
    let outgoing_body = outgoing.body().map_err(|()| fail(&"no request body"))?;
    // The call starts first, so that the runtime takes the body as it is written.
    let pending = outgoing_handler::handle(outgoing, None).map_err(|code| OutboundError::new(&code, &destination))?;
    {
        let stream = outgoing_body.write().map_err(|()| fail(&"no request body stream"))?;
        for chunk in body.chunks(WRITE_CHUNK) {
            stream
                .blocking_write_and_flush(chunk)
                .map_err(|e| fail(&format!("writing the body: {e:?}")))?;
        }
    }
    OutgoingBody::finish(outgoing_body, None).map_err(|code| OutboundError::new(&code, &destination))?;
    pending.subscribe().block();
    let incoming = match pending.get() {
        Some(Ok(Ok(incoming))) => incoming,
        Some(Ok(Err(code))) => return Err(OutboundError::new(&code, &destination)),
        Some(Err(())) | None => return Err(fail(&"the response was already taken")),
    };
    let mut response = http::Response::builder().status(incoming.status());
    for (name, value) in incoming.headers().entries() {
        response = response.header(name, value);
    }
    let body = incoming.consume().map_err(|()| fail(&"the body was already taken"))?;
    let mut bytes = Vec::new();
    {
        let stream = body.stream().map_err(|()| fail(&"no response body stream"))?;
        loop {
            match stream.blocking_read(READ_CHUNK) {
                Ok(chunk) => bytes.extend_from_slice(&chunk),
                Err(wasip2::io::streams::StreamError::Closed) => break,
                Err(wasip2::io::streams::StreamError::LastOperationFailed(error)) => {
                    // The runtime says why the body stopped (a cap, a timeout) on the trailers' future.
                    let trailers = IncomingBody::finish(body);
                    trailers.subscribe().block();
                    return Err(match trailers.get() {
                        Some(Ok(Err(code))) => OutboundError::new(&code, &destination),
                        _ => fail(&error.to_debug_string()),
                    });
                }
            }
        }
    }
    drop(IncomingBody::finish(body));
    response.body(bytes).map_err(|e| fail(&e))
}

fn method(method: &http::Method) -> Method {
    match *method {
        http::Method::GET => Method::Get,
        http::Method::HEAD => Method::Head,
        http::Method::POST => Method::Post,
        http::Method::PUT => Method::Put,
        http::Method::DELETE => Method::Delete,
        http::Method::CONNECT => Method::Connect,
        http::Method::OPTIONS => Method::Options,
        http::Method::TRACE => Method::Trace,
        http::Method::PATCH => Method::Patch,
        ref other => Method::Other(other.to_string()),
    }
}
