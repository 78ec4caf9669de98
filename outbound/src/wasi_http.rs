//! `wasi:http/outgoing-handler` for components: wasmtime-wasi-http's send-request hook,
//! sending through the same policy, client and limits as the Go SDK's imports. The
//! request body streams as the component writes it (wasmtime-wasi-http runs this hook in a
//! task of its own, and holds the body to its Content-Length).

use super::{CallLog, OpenResponse, Outbound, OutboundError};
use bytes::Bytes;
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};
use std::sync::Arc;
use std::time::Instant;
use wasmtime_wasi_http::{Error, RequestOptions, WasiBody, WasiHttpHooks};

/// The hooks of one request's store.
pub struct OutboundHooks {
    outbound: Arc<Outbound>,
    log: Arc<CallLog>,
    deadline: Instant,
}

impl OutboundHooks {
    pub fn new(outbound: Arc<Outbound>, log: Arc<CallLog>, deadline: Instant) -> Self {
        Self {
            outbound,
            log,
            deadline,
        }
    }
}

type IoFuture = Box<dyn Future<Output = Result<(), Error>> + Send>;

impl WasiHttpHooks for OutboundHooks {
    fn send_request(
        &mut self,
        request: http::Request<WasiBody>,
        options: Option<RequestOptions>,
        _response_done: IoFuture,
    ) -> Box<dyn Future<Output = Result<(http::Response<WasiBody>, IoFuture), Error>> + Send> {
        let outbound = self.outbound.clone();
        let log = self.log.clone();
        let deadline = self.deadline;
        // wasmtime-wasi-http runs the call in a task of its own: the handler's span is the
        // call's parent all the same.
        let parent = tracing::Span::current();
        Box::new(tracing::Instrument::instrument(
            async move {
                let request = request.map(|body| body.map_err(Into::into).boxed_unsync());
                let guest_timeout = options.and_then(|options| options.first_byte_timeout);
                let deadlines = outbound.deadlines(deadline, guest_timeout);
                let failed = |error: OutboundError| {
                    tracing::debug!(%error, "outbound call failed");
                    wasi_error(&error)
                };
                let admitted = outbound.admit(request.uri(), deadlines, &log).await.map_err(failed)?;
                let response = outbound.send(admitted, request, deadlines, log).await.map_err(failed)?;
                let mut head = http::Response::builder().status(response.status);
                if let Some(headers) = head.headers_mut() {
                    *headers = response.headers.clone();
                }
                let body = StreamBody::new(futures::stream::unfold(Some(response), next_frame)).boxed_unsync();
                let head = head.body(body).map_err(|e| Error::InternalError(Some(e.to_string())))?;
                Ok((head, Box::new(async { Ok(()) }) as IoFuture))
            },
            parent,
        ))
    }
}

/// The next frame of a response body; after an error, the end.
async fn next_frame(response: Option<OpenResponse>) -> Option<(Result<Frame<Bytes>, Error>, Option<OpenResponse>)> {
    let mut response = response?;
    match response.next_chunk().await {
        Ok(Some(chunk)) => Some((Ok(Frame::data(chunk)), Some(response))),
        Ok(None) => None,
        Err(error) => Some((Err(wasi_error(&error)), None)),
    }
}

/// The `wasi:http` error code nearest to each failure.
fn wasi_error(error: &OutboundError) -> Error {
    match error {
        OutboundError::Denied(_) => Error::HttpRequestDenied,
        OutboundError::Prohibited { .. } => Error::DestinationIpProhibited,
        OutboundError::Timeout(_) | OutboundError::RequestTimeout => Error::HttpResponseTimeout,
        OutboundError::Dns(_) => Error::DnsError {
            rcode: None,
            info_code: None,
        },
        OutboundError::Connect(_) => Error::ConnectionRefused,
        OutboundError::Tls { .. } => Error::TlsProtocolError,
        OutboundError::TooLarge { limit, .. } => Error::HttpResponseBodySize(Some(*limit)),
        OutboundError::Limit { .. } => Error::ConnectionLimitReached,
        OutboundError::BadRequest(_) => Error::HttpRequestUriInvalid,
        OutboundError::Failed { why, .. } => Error::InternalError(Some(why.clone())),
        OutboundError::PoolMemory => Error::InternalError(Some(error.to_string())),
    }
}
