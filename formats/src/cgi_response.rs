//! The response half of CGI (RFC 3875 §6): what a guest writes to stdout, read into an
//! HTTP response. Kept apart from the wasmtime plumbing of the runtime's CGI handler
//! because it is a parser of bytes we did not write: the fuzz target `cgi_response` feeds it.

use bytes::Bytes;
use http::{HeaderName, HeaderValue, Response, StatusCode, header};

/// Why a guest's output is not a CGI response; the handler answers 502 with it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("{0}")]
pub struct BadResponse(String);

/// Reads a CGI response: header lines, a blank line, the body. `Status:` sets the status
/// (else 302 with a `Location:`, else 200); every other line is a response header.
pub fn parse(output: &[u8]) -> Result<Response<Bytes>, BadResponse> {
    let bad = |why: &str| BadResponse(why.to_string());
    if output.is_empty() {
        return Err(bad("the handler wrote nothing"));
    }
    let (head, body) = split_head(output).ok_or_else(|| bad("no blank line ends the header block"))?;
    let head = std::str::from_utf8(head).map_err(|_| bad("the header block is not UTF-8"))?;
    let mut response = Response::builder();
    let mut status = None;
    let mut has_location = false;
    for line in head.lines().map(|line| line.trim_end_matches('\r')) {
        let (name, value) = line
            .split_once(':')
            .ok_or_else(|| bad(&format!("header line {line:?} has no colon")))?;
        let value = value.trim();
        if name.eq_ignore_ascii_case("status") {
            let code = value.split_whitespace().next().unwrap_or("");
            let parsed = code
                .parse::<u16>()
                .ok()
                .and_then(|code| StatusCode::from_u16(code).ok());
            status = Some(parsed.ok_or_else(|| bad(&format!("Status {value:?} is not an HTTP status")))?);
            continue;
        }
        let name =
            HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad(&format!("{name:?} is not a header name")))?;
        let value =
            HeaderValue::from_str(value).map_err(|_| bad(&format!("the value of {name} is not a header value")))?;
        has_location |= name == header::LOCATION;
        response = response.header(name, value);
    }
    let status = status.unwrap_or(if has_location {
        StatusCode::FOUND
    } else {
        StatusCode::OK
    });
    response
        .status(status)
        .body(Bytes::copy_from_slice(body))
        .map_err(|e| bad(&e.to_string()))
}

/// Splits at the first empty line (`\n\n` or `\r\n\r\n`).
fn split_head(output: &[u8]) -> Option<(&[u8], &[u8])> {
    let mut line_start = 0;
    for (index, &byte) in output.iter().enumerate() {
        if byte != b'\n' {
            continue;
        }
        let line = &output[line_start..index];
        if line.is_empty() || line == b"\r" {
            return Some((&output[..line_start], &output[index + 1..]));
        }
        line_start = index + 1;
    }
    None
}
