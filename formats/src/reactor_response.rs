//! The response half of the Go reactor ABI: the bytes a reactor's `wasmless_handle`
//! returns (status, headers, body in the SDK's length-prefixed encoding, documented in
//! sdk/go/reactor/reactor.go), read into an HTTP response. Kept apart from the wasmtime
//! plumbing of the reactor handler because it is a parser of bytes we did not write: the
//! fuzz target `reactor_response` feeds it.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response, StatusCode};

/// Why a reactor's output is not a response; the handler answers 502 with it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct BadResponse(String);

/// Little-endian `u32`s and `u32`-length-prefixed byte strings, front to back: the
/// encoding of a reactor's response, and of the request the runtime hands it.
pub struct Reader<'a>(pub &'a [u8]);

impl<'a> Reader<'a> {
    pub fn u32(&mut self) -> Option<u32> {
        let (head, rest) = self.0.split_first_chunk::<4>()?;
        self.0 = rest;
        Some(u32::from_le_bytes(*head))
    }

    pub fn bytes(&mut self) -> Option<&'a [u8]> {
        let length = self.u32()? as usize;
        if self.0.len() < length {
            return None;
        }
        let (head, rest) = self.0.split_at(length);
        self.0 = rest;
        Some(head)
    }
}

/// Reads a reactor's response, checking status and headers as a CGI response is checked.
pub fn parse(output: &[u8]) -> Result<Response<Bytes>, BadResponse> {
    let bad = |why: &str| BadResponse(why.to_string());
    let truncated = || bad("the response is truncated");
    let mut reader = Reader(output);
    let code = reader.u32().ok_or_else(truncated)?;
    let status = u16::try_from(code)
        .ok()
        .and_then(|code| StatusCode::from_u16(code).ok())
        .ok_or_else(|| bad(&format!("{code} is not an HTTP status")))?;
    let mut response = Response::builder().status(status);
    // Each header takes at least 8 bytes, so a count beyond what the output holds fails
    // on the first missing one, however large it is.
    for _ in 0..reader.u32().ok_or_else(truncated)? {
        let name = reader.bytes().ok_or_else(truncated)?;
        let value = reader.bytes().ok_or_else(truncated)?;
        let name = HeaderName::from_bytes(name)
            .map_err(|_| bad(&format!("{:?} is not a header name", String::from_utf8_lossy(name))))?;
        let value = std::str::from_utf8(value)
            .ok()
            .and_then(|value| HeaderValue::from_str(value).ok())
            .ok_or_else(|| bad(&format!("the value of {name} is not a header value")))?;
        response = response.header(name, value);
    }
    let body = reader.bytes().ok_or_else(truncated)?;
    if !reader.0.is_empty() {
        return Err(bad("bytes follow the body"));
    }
    response
        .body(Bytes::copy_from_slice(body))
        .map_err(|e| bad(&e.to_string()))
}
