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

/// Starts a streamed response from its head (`response_start`): the body follows through
/// [`RESPONSE_WRITE`], and ends when `wasmless_handle` returns.
pub const RESPONSE_START: &str = "response_start";
/// The next bytes of a streamed response's body, taken when the client has room for them.
pub const RESPONSE_WRITE: &str = "response_write";
/// `response_write`: the bytes would pass the Content-Length the head declared; none of
/// them is sent.
pub const ERRNO_CONTENT_LENGTH: u32 = 14;

/// Reads a reactor's response, checking status and headers as a CGI response is checked.
pub fn parse(output: &[u8]) -> Result<Response<Bytes>, BadResponse> {
    let mut reader = Reader(output);
    let head = head(&mut reader)?;
    let body = reader.bytes().ok_or_else(truncated)?;
    if !reader.0.is_empty() {
        return Err(bad("bytes follow the body"));
    }
    head.body(Bytes::copy_from_slice(body)).map_err(|e| bad(&e.to_string()))
}

/// Reads the head of a streamed response (`response_start`): the response's encoding
/// without its body, and nothing after it.
pub fn parse_head(output: &[u8]) -> Result<Response<()>, BadResponse> {
    let mut reader = Reader(output);
    let head = head(&mut reader)?;
    if !reader.0.is_empty() {
        return Err(bad("bytes follow the head"));
    }
    head.body(()).map_err(|e| bad(&e.to_string()))
}

fn bad(why: &str) -> BadResponse {
    BadResponse(why.to_string())
}

fn truncated() -> BadResponse {
    bad("the response is truncated")
}

/// The status and headers, checked as a CGI response's are.
fn head(reader: &mut Reader<'_>) -> Result<http::response::Builder, BadResponse> {
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
    Ok(response)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encoded(status: u32, headers: &[(&str, &str)]) -> Vec<u8> {
        let mut out = status.to_le_bytes().to_vec();
        out.extend((headers.len() as u32).to_le_bytes());
        for text in headers.iter().flat_map(|(name, value)| [name, value]) {
            out.extend((text.len() as u32).to_le_bytes());
            out.extend(text.as_bytes());
        }
        out
    }

    #[test]
    fn a_streamed_head_reads_as_the_whole_response_does() {
        let head = encoded(201, &[("Content-Type", "text/event-stream"), ("X-A", "1")]);
        let whole = [head.clone(), 2u32.to_le_bytes().to_vec(), b"hi".to_vec()].concat();
        let (streamed, full) = (parse_head(&head).unwrap(), parse(&whole).unwrap());
        assert_eq!(streamed.status(), full.status());
        assert_eq!(streamed.headers(), full.headers());
        assert_eq!(
            parse_head(&[head.clone(), b"x".to_vec()].concat()).unwrap_err(),
            bad("bytes follow the head")
        );
        assert!(parse_head(&head[..head.len() - 1]).is_err());
        assert!(parse_head(&encoded(42, &[])).is_err());
    }
}
