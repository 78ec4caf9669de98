//! Streaming a response: [`stream`] sends the head now, and the [`BodyWriter`] it gives
//! sends the body as it is written, so that a Server-Sent Events client sees each event
//! when it is written, and a long export never lies whole in the handler's memory.

use crate::Response;
use crate::guest::{PENDING_RESPONSE, outgoing_response};
use std::io::{self, Write};
use wasip2::http::types::{OutgoingBody, ResponseOutparam};
use wasip2::io::streams::OutputStream;

/// `blocking-write-and-flush` takes at most 4096 bytes per call.
const WRITE_CHUNK: usize = 4096;

/// Why a response cannot be streamed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamError {
    /// The handler already answered (or streamed) this request.
    AlreadyAnswered,
    /// The runtime refused the response's head or body.
    Refused(String),
}

impl std::fmt::Display for StreamError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::AlreadyAnswered => write!(
                f,
                "the request was answered already: stream is called once, and instead of returning a body"
            ),
            Self::Refused(why) => write!(f, "the runtime refused the streamed response: {why}"),
        }
    }
}

impl std::error::Error for StreamError {}

/// Sends `head` (status and headers) now; the body follows through the writer, and ends
/// with [`BodyWriter::finish`] (or when the writer is dropped). A Content-Length in the
/// head is held to; without one the body is chunked.
///
/// ```ignore
/// use std::io::Write;
/// pub fn handler(_request: Request) -> Response {
///     let head = http::Response::builder().header("content-type", "text/event-stream").body(()).unwrap();
///     let Ok(mut body) = wasmless_sdk::stream(head) else { return Response::default() };
///     for i in 0..3 {
///         let _ = write!(body, "data: {i}\n\n");
///     }
///     body.finish()
/// }
/// ```
pub fn stream(head: http::Response<()>) -> Result<BodyWriter, StreamError> {
    let response_out = PENDING_RESPONSE
        .with(|slot| slot.borrow_mut().take())
        .ok_or(StreamError::AlreadyAnswered)?;
    let (parts, ()) = head.into_parts();
    let outgoing = outgoing_response(&parts);
    let Ok(body) = outgoing.body() else {
        let why = "the response has no body to write".to_string();
        ResponseOutparam::set(
            response_out,
            Err(wasip2::http::types::ErrorCode::InternalError(Some(why.clone()))),
        );
        return Err(StreamError::Refused(why));
    };
    ResponseOutparam::set(response_out, Ok(outgoing));
    let stream = body
        .write()
        .map_err(|()| StreamError::Refused("the body's stream was taken".into()))?;
    Ok(BodyWriter {
        stream: Some(stream),
        body: Some(body),
    })
}

/// The body of a streamed response: each write leaves when it is made (a write is a
/// flush), taken as fast as the client reads.
pub struct BodyWriter {
    stream: Option<OutputStream>,
    body: Option<OutgoingBody>,
}

impl Write for BodyWriter {
    fn write(&mut self, buffer: &[u8]) -> io::Result<usize> {
        let stream = self
            .stream
            .as_ref()
            .ok_or_else(|| io::Error::other("the body was finished"))?;
        let part = &buffer[..buffer.len().min(WRITE_CHUNK)];
        stream
            .blocking_write_and_flush(part)
            .map_err(|error| io::Error::new(io::ErrorKind::BrokenPipe, format!("{error:?}")))?;
        Ok(part.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl BodyWriter {
    /// Ends the body; the handler returns what this gives (the runtime sends nothing more).
    pub fn finish(mut self) -> Response {
        self.end();
        Response::default()
    }

    fn end(&mut self) {
        drop(self.stream.take());
        if let Some(body) = self.body.take()
            && let Err(error) = OutgoingBody::finish(body, None)
        {
            eprintln!("finishing the response body failed: {error:?}");
        }
    }
}

impl Drop for BodyWriter {
    fn drop(&mut self) {
        self.end();
    }
}
