//! The head of a request a guest asks the host to send (`wasmless_formats::outbound`):
//! bytes from the guest's memory, parsed before any policy check.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wasmless_formats::outbound;

fuzz_target!(|encoded: &[u8]| {
    let Ok(request) = outbound::parse_request(encoded) else {
        return;
    };
    // Only absolute http(s) URLs with a host get through; a declared length is one the
    // body can be held to, and no length but 0 goes with no body.
    assert!(matches!(request.uri.scheme_str(), Some("http" | "https")));
    assert!(request.uri.host().is_some_and(|host| !host.is_empty()));
    assert!(request.headers.len() <= outbound::MAX_HEADERS as usize);
    assert_eq!(
        outbound::content_length(&request.headers).ok(),
        Some(request.content_length)
    );
    assert!(request.has_body || request.content_length.unwrap_or(0) == 0);
    // What was read encodes back to the same request.
    let headers: Vec<(&str, &str)> = request
        .headers
        .iter()
        .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?)))
        .collect();
    if headers.len() == request.headers.len() {
        let again = outbound::encode_request(
            request.method.as_str(),
            &request.uri.to_string(),
            &headers,
            request.has_body,
        );
        let reread = outbound::parse_request(&again).expect("a request read once reads again");
        assert_eq!(reread.method, request.method);
        assert_eq!(reread.uri, request.uri);
        assert_eq!(reread.has_body, request.has_body);
        assert_eq!(reread.content_length, request.content_length);
    }
});
