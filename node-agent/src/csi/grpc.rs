//! Unary gRPC over HTTP/2 on a unix socket: all the kubelet asks of a CSI node plugin and
//! of a registering plugin. A call is one length-prefixed message in, one out, and a status
//! in the trailers (grpc's `PROTOCOL-HTTP2.md`); the agent needs no streaming, compression
//! or deadlines of its own, so it speaks this much with hyper rather than add a gRPC stack.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, Request, Response};
use http_body::Frame;
use http_body_util::BodyExt;
use std::collections::VecDeque;
use std::convert::Infallible;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

/// Largest request message the agent reads: the kubelet's are a few hundred bytes.
const MAX_REQUEST_BYTES: usize = 64 << 10;

/// A call's failure, as gRPC codes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Status {
    pub code: Code,
    pub message: String,
}

/// The gRPC status codes the agent answers with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    InvalidArgument = 3,
    NotFound = 5,
    Unimplemented = 12,
    Internal = 13,
}

impl Status {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
        }
    }
}

/// What answers the calls: a method's full name (`/package.Service/Method`) and its request
/// message's bytes in, the reply message's bytes out.
pub trait Methods: Send + Sync + 'static {
    fn call(&self, method: &str, request: &[u8]) -> Result<Vec<u8>, Status>;
}

/// Decodes a request as `M`, or fails the call as an invalid argument.
pub fn decode<M: prost::Message + Default>(request: &[u8]) -> Result<M, Status> {
    M::decode(request).map_err(|error| Status::new(Code::InvalidArgument, format!("cannot read the request: {error}")))
}

/// Serves `methods` on every connection `listener` accepts, until the runtime ends.
pub async fn serve(listener: tokio::net::UnixListener, methods: Arc<dyn Methods>) {
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(error) => {
                tracing::warn!(%error, "cannot accept a CSI connection");
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                continue;
            }
        };
        let methods = methods.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request| answer(methods.clone(), request));
            let served = hyper::server::conn::http2::Builder::new(hyper_util::rt::TokioExecutor::new())
                .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                .await;
            if let Err(error) = served {
                tracing::debug!(%error, "a CSI connection ended with an error");
            }
        });
    }
}

/// One call: the request's message, the method's answer, the reply.
async fn answer(
    methods: Arc<dyn Methods>,
    request: Request<hyper::body::Incoming>,
) -> Result<Response<Reply>, Infallible> {
    let method = request.uri().path().to_string();
    let body = http_body_util::Limited::new(request.into_body(), MAX_REQUEST_BYTES + 5);
    let outcome = match body.collect().await {
        Ok(collected) => unframe(collected.to_bytes()).and_then(|message| {
            let answered = methods.call(&method, &message);
            if let Err(status) = &answered {
                tracing::warn!(method, code = ?status.code, message = status.message, "a CSI call failed");
            }
            answered
        }),
        Err(error) => Err(Status::new(
            Code::InvalidArgument,
            format!("cannot read the request: {error}"),
        )),
    };
    Ok(reply(outcome))
}

/// The one message of a request's body: a flag byte (0, not compressed), a big-endian
/// length, the message.
fn unframe(mut body: Bytes) -> Result<Bytes, Status> {
    let malformed = |what: &str| Status::new(Code::InvalidArgument, format!("malformed gRPC message: {what}"));
    if body.len() < 5 {
        return Err(malformed("shorter than its prefix"));
    }
    if body.get_u8() != 0 {
        return Err(Status::new(
            Code::Unimplemented,
            "compressed messages are not supported",
        ));
    }
    let length = body.get_u32() as usize;
    if length != body.len() {
        return Err(malformed("its length is not the body's"));
    }
    Ok(body)
}

fn framed(message: &[u8]) -> Bytes {
    let mut body = BytesMut::with_capacity(5 + message.len());
    body.put_u8(0);
    body.put_u32(message.len() as u32);
    body.put_slice(message);
    body.freeze()
}

fn reply(outcome: Result<Vec<u8>, Status>) -> Response<Reply> {
    let mut frames = VecDeque::new();
    let mut trailers = HeaderMap::new();
    match outcome {
        Ok(message) => {
            frames.push_back(Frame::data(framed(&message)));
            trailers.insert("grpc-status", HeaderValue::from_static("0"));
        }
        Err(status) => {
            trailers.insert("grpc-status", HeaderValue::from(status.code as u16));
            if let Ok(message) = HeaderValue::from_str(&percent_encoded(&status.message)) {
                trailers.insert("grpc-message", message);
            }
        }
    }
    frames.push_back(Frame::trailers(trailers));
    let mut response = Response::new(Reply { frames });
    response
        .headers_mut()
        .insert(http::header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    response
}

/// `grpc-message`'s encoding: printable ASCII but `%` as is, any other byte as `%XX`.
fn percent_encoded(message: &str) -> String {
    let mut encoded = String::with_capacity(message.len());
    for byte in message.bytes() {
        match byte {
            b' '..=b'~' if byte != b'%' => encoded.push(byte as char),
            _ => encoded.push_str(&format!("%{byte:02X}")),
        }
    }
    encoded
}

/// A reply's body: its message (if any), then the trailers with the status.
pub struct Reply {
    frames: VecDeque<Frame<Bytes>>,
}

impl http_body::Body for Reply {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        Poll::Ready(self.get_mut().frames.pop_front().map(Ok))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_message_framed_is_unframed_whole() {
        let framed = framed(b"hello");
        assert_eq!(&framed[..5], &[0, 0, 0, 0, 5]);
        assert_eq!(unframe(framed).unwrap(), Bytes::from_static(b"hello"));
    }

    #[test]
    fn a_body_that_is_not_one_plain_message_is_refused() {
        assert_eq!(
            unframe(Bytes::from_static(b"\0\0\0")).unwrap_err().code,
            Code::InvalidArgument
        );
        assert_eq!(
            unframe(Bytes::from_static(b"\x01\0\0\0\0")).unwrap_err().code,
            Code::Unimplemented
        );
        assert_eq!(
            unframe(Bytes::from_static(b"\0\0\0\0\x09abc")).unwrap_err().code,
            Code::InvalidArgument
        );
    }

    #[test]
    fn a_status_message_is_percent_encoded_as_grpc_reads_it() {
        assert_eq!(
            percent_encoded("mount it readOnly: 100% é"),
            "mount it readOnly: 100%25 %C3%A9"
        );
    }
}
