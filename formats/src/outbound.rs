//! The outbound half of the guest ABI (the `wasmless` import module, documented in
//! sdk/go/outbound/outbound.go): the request a guest asks the host to send, in the same
//! little-endian, length-prefixed encoding as the reactor's request and response, and
//! the response head the host hands back. The request is bytes a guest wrote, so it is
//! parsed here, apart from the runtime, where the fuzz target `outbound_request` feeds it.

use crate::reactor_response::Reader;
use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri};

/// The import module of the host functions (`http_send`, `http_read_head`,
/// `http_read_body`, `http_close`).
pub const IMPORT_MODULE: &str = "wasmless";
pub const HTTP_SEND: &str = "http_send";
pub const HTTP_READ_HEAD: &str = "http_read_head";
pub const HTTP_READ_BODY: &str = "http_read_body";
pub const HTTP_CLOSE: &str = "http_close";
/// The errno of an import that cannot work here (while a snapshot is taken).
pub const ERRNO_UNAVAILABLE: u32 = 8;
/// The errno of a handle that names no open call.
pub const ERRNO_BAD_HANDLE: u32 = 11;

/// Headers one outgoing request may carry; more is a malformed request, not a slow one.
pub const MAX_HEADERS: u32 = 256;

/// Why a guest's outgoing request cannot be sent as it is.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct BadRequest(String);

/// An outgoing request as a guest encoded it: an absolute `http` or `https` URL.
#[derive(Debug)]
pub struct OutboundRequest {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Reads `method, url, u32 count, count × (name, value), body`.
pub fn parse_request(encoded: &[u8]) -> Result<OutboundRequest, BadRequest> {
    let bad = |why: String| BadRequest(why);
    let truncated = || BadRequest("the request is truncated".into());
    let mut reader = Reader(encoded);
    let method = reader.bytes().ok_or_else(truncated)?;
    let method = Method::from_bytes(method)
        .map_err(|_| bad(format!("{:?} is not an HTTP method", String::from_utf8_lossy(method))))?;
    let url = reader.bytes().ok_or_else(truncated)?;
    let uri = Uri::try_from(url).map_err(|_| bad(format!("{:?} is not a URL", String::from_utf8_lossy(url))))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(bad(format!("{uri} is not an absolute http:// or https:// URL"))),
    }
    if uri.host().is_none_or(str::is_empty) {
        return Err(bad(format!("{uri} names no host")));
    }
    let count = reader.u32().ok_or_else(truncated)?;
    if count > MAX_HEADERS {
        return Err(bad(format!("{count} headers: at most {MAX_HEADERS} may be sent")));
    }
    let mut headers = HeaderMap::new();
    for _ in 0..count {
        let name = reader.bytes().ok_or_else(truncated)?;
        let value = reader.bytes().ok_or_else(truncated)?;
        let name = HeaderName::from_bytes(name)
            .map_err(|_| bad(format!("{:?} is not a header name", String::from_utf8_lossy(name))))?;
        let value =
            HeaderValue::from_bytes(value).map_err(|_| bad(format!("the value of {name} is not a header value")))?;
        headers.append(name, value);
    }
    let body = reader.bytes().ok_or_else(truncated)?;
    if !reader.0.is_empty() {
        return Err(bad("bytes follow the body".into()));
    }
    Ok(OutboundRequest {
        method,
        uri,
        headers,
        body: Bytes::copy_from_slice(body),
    })
}

/// Writes a response head for the guest: `u32 status, u32 count, count × (name, value)`,
/// a repeated header once per value.
pub fn encode_response_head(status: u16, headers: &HeaderMap) -> Vec<u8> {
    let mut out = Vec::with_capacity(64 + headers.len() * 32);
    out.extend_from_slice(&u32::from(status).to_le_bytes());
    out.extend_from_slice(&(headers.len() as u32).to_le_bytes());
    for (name, value) in headers {
        for bytes in [name.as_str().as_bytes(), value.as_bytes()] {
            out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            out.extend_from_slice(bytes);
        }
    }
    out
}

/// Writes a request as a guest does (the SDK's side, for tests and the fuzz corpus).
pub fn encode_request(method: &str, url: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut put = |bytes: &[u8]| {
        out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
        out.extend_from_slice(bytes);
    };
    put(method.as_bytes());
    put(url.as_bytes());
    out.extend_from_slice(&(headers.len() as u32).to_le_bytes());
    for (name, value) in headers {
        for bytes in [name.as_bytes(), value.as_bytes()] {
            out.extend_from_slice(&(bytes.len() as u32).to_le_bytes());
            out.extend_from_slice(bytes);
        }
    }
    out.extend_from_slice(&(body.len() as u32).to_le_bytes());
    out.extend_from_slice(body);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_reads_back() {
        let encoded = encode_request(
            "POST",
            "https://api.example.com:8443/v1?x=1",
            &[("x-a", "1"), ("x-a", "2")],
            b"{}",
        );
        let request = parse_request(&encoded).unwrap();
        assert_eq!(request.method, Method::POST);
        assert_eq!(request.uri.host(), Some("api.example.com"));
        assert_eq!(request.uri.port_u16(), Some(8443));
        assert_eq!(request.headers.get_all("x-a").iter().count(), 2);
        assert_eq!(&request.body[..], b"{}");
    }

    #[test]
    fn malformed_requests_say_why() {
        let cases: [(Vec<u8>, &str); 6] = [
            (encode_request("GET", "/relative", &[], b""), "absolute"),
            (encode_request("GET", "ftp://h/", &[], b""), "absolute"),
            (encode_request("G ET", "http://h/", &[], b""), "method"),
            (
                encode_request("GET", "http://h/", &[("bad name", "x")], b""),
                "header name",
            ),
            (
                encode_request("GET", "http://h/", &[], b"body")[..20].to_vec(),
                "truncated",
            ),
            (
                [encode_request("GET", "http://h/", &[], b""), b"x".to_vec()].concat(),
                "follow",
            ),
        ];
        for (encoded, why) in cases {
            let error = parse_request(&encoded).unwrap_err().to_string();
            assert!(error.contains(why), "{error:?} should say {why:?}");
        }
        let mut many = encode_request("GET", "http://h/", &[], b"");
        let count_at = 4 + 3 + 4 + 9;
        many[count_at..count_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(parse_request(&many).unwrap_err().to_string().contains("at most"));
    }

    #[test]
    fn a_response_head_repeats_headers() {
        let mut headers = HeaderMap::new();
        headers.append("set-cookie", HeaderValue::from_static("a=1"));
        headers.append("set-cookie", HeaderValue::from_static("b=2"));
        let head = encode_response_head(201, &headers);
        let mut reader = Reader(&head);
        assert_eq!(reader.u32(), Some(201));
        assert_eq!(reader.u32(), Some(2));
        assert_eq!(reader.bytes(), Some(&b"set-cookie"[..]));
        assert_eq!(reader.bytes(), Some(&b"a=1"[..]));
    }
}
