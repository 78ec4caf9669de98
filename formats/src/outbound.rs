//! The outbound half of the guest ABI (the `wasmless` import module, documented in
//! host/src/outbound_abi/mod.rs and used by sdk/go/outbound/outbound.go): the head of the
//! request a guest asks the host to send, in the same little-endian, length-prefixed
//! encoding as the reactor's request and response, and the response head the host hands
//! back. The body is not in the head: it streams through `http_write_body` in pieces.
//! The head is bytes a guest wrote, so it is parsed here, apart from the runtime, where
//! the fuzz target `outbound_request` feeds it.

use crate::reactor_response::Reader;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Uri, header};

/// The import module of the host functions.
pub const IMPORT_MODULE: &str = "wasmless";
/// Starts a call from its head: the policy is checked and a slot taken.
pub const HTTP_START: &str = "http_start";
/// The next piece of the request body, taken when the upstream takes it (backpressure).
pub const HTTP_WRITE_BODY: &str = "http_write_body";
/// The end of the request body (or of a call without one): waits for the response head.
pub const HTTP_FINISH: &str = "http_finish";
pub const HTTP_READ_HEAD: &str = "http_read_head";
pub const HTTP_READ_BODY: &str = "http_read_body";
pub const HTTP_CLOSE: &str = "http_close";
/// The errno of an import that cannot work here (while a snapshot is taken).
pub const ERRNO_UNAVAILABLE: u32 = 8;
/// The errno of a handle that names no open call (or none in the state the import needs).
pub const ERRNO_BAD_HANDLE: u32 = 11;
/// `http_write_body`: the call ended before its body did (the upstream answered early, or
/// the call failed); stop writing, `http_finish` tells which.
pub const ERRNO_CALL_ENDED: u32 = 12;

/// Headers one outgoing request may carry; more is a malformed request, not a slow one.
pub const MAX_HEADERS: u32 = 256;

/// The head's flag that a body follows, through `http_write_body`, until `http_finish`.
pub const FLAG_BODY: u32 = 1;

/// Why a guest's outgoing request cannot be sent as it is.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct BadRequest(String);

/// The head of an outgoing request as a guest encoded it: an absolute `http` or `https`
/// URL, and whether a body follows.
#[derive(Debug)]
pub struct OutboundRequest {
    pub method: Method,
    pub uri: Uri,
    pub headers: HeaderMap,
    /// A body follows (`FLAG_BODY`).
    pub has_body: bool,
    /// The `Content-Length` the guest declared, which the body is held to; none: a body
    /// of unknown length (sent chunked on HTTP/1.1), or no body.
    pub content_length: Option<u64>,
}

/// Reads `method, url, u32 count, count × (name, value), u32 flags`.
pub fn parse_request(encoded: &[u8]) -> Result<OutboundRequest, BadRequest> {
    let bad = |why: String| BadRequest(why);
    let truncated = || BadRequest("the request head is truncated".into());
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
    let flags = reader.u32().ok_or_else(truncated)?;
    if flags & !FLAG_BODY != 0 {
        return Err(bad(format!("unknown flags {flags:#x} in the request head")));
    }
    if !reader.0.is_empty() {
        return Err(bad("bytes follow the request head".into()));
    }
    let has_body = flags & FLAG_BODY != 0;
    let content_length = content_length(&headers).map_err(bad)?;
    if !has_body && content_length.is_some_and(|length| length > 0) {
        return Err(bad(format!(
            "Content-Length {} with no body",
            content_length.unwrap_or_default()
        )));
    }
    Ok(OutboundRequest {
        method,
        uri,
        headers,
        has_body,
        content_length,
    })
}

/// The one `Content-Length` of `headers` (repeats must agree), if any.
pub fn content_length(headers: &HeaderMap) -> Result<Option<u64>, String> {
    let mut length = None;
    for value in headers.get_all(header::CONTENT_LENGTH) {
        let parsed = value
            .to_str()
            .ok()
            .filter(|text| !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|text| text.parse::<u64>().ok())
            .ok_or_else(|| format!("Content-Length {value:?} is not a length"))?;
        if length.is_some_and(|seen| seen != parsed) {
            return Err("Content-Length is given twice, differently".into());
        }
        length = Some(parsed);
    }
    Ok(length)
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

/// Writes a request head as a guest does (the SDK's side, for tests and the fuzz corpus).
pub fn encode_request(method: &str, url: &str, headers: &[(&str, &str)], has_body: bool) -> Vec<u8> {
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
    let flags = if has_body { FLAG_BODY } else { 0 };
    out.extend_from_slice(&flags.to_le_bytes());
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_head_reads_back() {
        let encoded = encode_request(
            "POST",
            "https://api.example.com:8443/v1?x=1",
            &[("x-a", "1"), ("x-a", "2"), ("content-length", "2")],
            true,
        );
        let request = parse_request(&encoded).unwrap();
        assert_eq!(request.method, Method::POST);
        assert_eq!(request.uri.host(), Some("api.example.com"));
        assert_eq!(request.uri.port_u16(), Some(8443));
        assert_eq!(request.headers.get_all("x-a").iter().count(), 2);
        assert!(request.has_body);
        assert_eq!(request.content_length, Some(2));
        let streamed = parse_request(&encode_request("PUT", "http://h/", &[], true)).unwrap();
        assert_eq!((streamed.has_body, streamed.content_length), (true, None));
        let empty = parse_request(&encode_request("POST", "http://h/", &[("content-length", "0")], false)).unwrap();
        assert_eq!((empty.has_body, empty.content_length), (false, Some(0)));
    }

    #[test]
    fn malformed_requests_say_why() {
        let cases: [(Vec<u8>, &str); 10] = [
            (encode_request("GET", "/relative", &[], false), "absolute"),
            (encode_request("GET", "ftp://h/", &[], false), "absolute"),
            (encode_request("G ET", "http://h/", &[], false), "method"),
            (
                encode_request("GET", "http://h/", &[("bad name", "x")], false),
                "header name",
            ),
            (
                encode_request("GET", "http://h/", &[], true)[..20].to_vec(),
                "truncated",
            ),
            (
                [encode_request("GET", "http://h/", &[], false), b"x".to_vec()].concat(),
                "follow",
            ),
            (
                encode_request("POST", "http://h/", &[("content-length", "5")], false),
                "no body",
            ),
            (
                encode_request("POST", "http://h/", &[("content-length", "-1")], true),
                "not a length",
            ),
            (
                encode_request(
                    "POST",
                    "http://h/",
                    &[("content-length", "1"), ("content-length", "2")],
                    true,
                ),
                "twice",
            ),
            (
                {
                    let mut head = encode_request("GET", "http://h/", &[], false);
                    let at = head.len() - 4;
                    head[at..].copy_from_slice(&2u32.to_le_bytes());
                    head
                },
                "flags",
            ),
        ];
        for (encoded, why) in cases {
            let error = parse_request(&encoded).unwrap_err().to_string();
            assert!(error.contains(why), "{error:?} should say {why:?}");
        }
        let mut many = encode_request("GET", "http://h/", &[], false);
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
