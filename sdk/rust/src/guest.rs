//! The bridge between `wasi:http` resources and the `http` crate's types.

use crate::{Request, Response};
use std::cell::RefCell;
use wasip2::http::types::{
    ErrorCode, Fields, IncomingBody, IncomingRequest, Method, OutgoingBody, OutgoingResponse, ResponseOutparam,
};

/// `blocking-write-and-flush` takes at most 4096 bytes per call.
const WRITE_CHUNK: usize = 4096;
const READ_CHUNK: u64 = 64 * 1024;

thread_local! {
    /// Held while the handler runs, so a panic can still answer (and [`crate::stream`]
    /// can answer first).
    pub(crate) static PENDING_RESPONSE: RefCell<Option<ResponseOutparam>> = const { RefCell::new(None) };
}

pub fn serve(request: IncomingRequest, response_out: ResponseOutparam, handler: fn(Request) -> Response) {
    install_panic_hook();
    let request = match read_request(request) {
        Ok(request) => request,
        Err(why) => return send(response_out, plain(400, format!("cannot read the request: {why}\n"))),
    };
    PENDING_RESPONSE.with(|slot| *slot.borrow_mut() = Some(response_out));
    let response = handler(request);
    if let Some(response_out) = PENDING_RESPONSE.with(|slot| slot.borrow_mut().take()) {
        send(response_out, response);
    }
}

/// WebAssembly aborts on panic, so nothing unwinds back to `serve`: the hook answers
/// 500 before the instance traps.
fn install_panic_hook() {
    static INSTALLED: std::sync::Once = std::sync::Once::new();
    INSTALLED.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            eprintln!("handler panicked: {info}");
            if let Some(response_out) = PENDING_RESPONSE.with(|slot| slot.try_borrow_mut().ok()?.take()) {
                send(response_out, plain(500, "the handler panicked\n".into()));
            }
        }));
    });
}

fn plain(status: u16, body: String) -> Response {
    let mut response = Response::new(body.into_bytes());
    *response.status_mut() = http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
    response.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    response
}

fn read_request(incoming: IncomingRequest) -> Result<Request, String> {
    let method = match incoming.method() {
        Method::Get => http::Method::GET,
        Method::Head => http::Method::HEAD,
        Method::Post => http::Method::POST,
        Method::Put => http::Method::PUT,
        Method::Delete => http::Method::DELETE,
        Method::Connect => http::Method::CONNECT,
        Method::Options => http::Method::OPTIONS,
        Method::Trace => http::Method::TRACE,
        Method::Patch => http::Method::PATCH,
        Method::Other(other) => http::Method::from_bytes(other.as_bytes()).map_err(|e| e.to_string())?,
    };
    let mut builder = http::Request::builder()
        .method(method)
        .uri(incoming.path_with_query().unwrap_or_else(|| "/".into()));
    for (name, value) in incoming.headers().entries() {
        builder = builder.header(name, value);
    }
    let body = read_body(&incoming)?;
    builder.body(body).map_err(|e| e.to_string())
}

fn read_body(incoming: &IncomingRequest) -> Result<Vec<u8>, String> {
    let body = incoming
        .consume()
        .map_err(|()| "the body was already taken".to_string())?;
    let mut bytes = Vec::new();
    {
        let stream = body
            .stream()
            .map_err(|()| "the body stream was already taken".to_string())?;
        loop {
            match stream.blocking_read(READ_CHUNK) {
                Ok(chunk) => bytes.extend_from_slice(&chunk),
                Err(wasip2::io::streams::StreamError::Closed) => break,
                Err(wasip2::io::streams::StreamError::LastOperationFailed(error)) => {
                    return Err(error.to_debug_string());
                }
            }
        }
    }
    drop(IncomingBody::finish(body));
    Ok(bytes)
}

/// The head of `parts` as `wasi:http` sends it.
pub(crate) fn outgoing_response(parts: &http::response::Parts) -> OutgoingResponse {
    let headers = Fields::new();
    for (name, value) in &parts.headers {
        // Hop-by-hop headers are the runtime's business; the rest pass through.
        if let Err(error) = headers.append(name.as_str(), value.as_bytes()) {
            eprintln!("response header {name} dropped: {error:?}");
        }
    }
    let outgoing = OutgoingResponse::new(headers);
    let _ = outgoing.set_status_code(parts.status.as_u16());
    outgoing
}

fn send(response_out: ResponseOutparam, response: Response) {
    let (parts, body) = response.into_parts();
    let outgoing = outgoing_response(&parts);
    let Ok(outgoing_body) = outgoing.body() else {
        return ResponseOutparam::set(
            response_out,
            Err(ErrorCode::InternalError(Some("no response body".into()))),
        );
    };
    ResponseOutparam::set(response_out, Ok(outgoing));
    if let Ok(stream) = outgoing_body.write() {
        for chunk in body.chunks(WRITE_CHUNK) {
            if let Err(error) = stream.blocking_write_and_flush(chunk) {
                eprintln!("writing the response body failed: {error:?}");
                break;
            }
        }
    }
    if let Err(error) = OutgoingBody::finish(outgoing_body, None) {
        eprintln!("finishing the response body failed: {error:?}");
    }
}
