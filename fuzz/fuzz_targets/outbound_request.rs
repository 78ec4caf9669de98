//! The request a guest asks the host to send (`wasmless_formats::outbound`): bytes from
//! the guest's memory, parsed before any policy check.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wasmless_formats::outbound;

fuzz_target!(|encoded: &[u8]| {
    let Ok(request) = outbound::parse_request(encoded) else {
        return;
    };
    // Only absolute http(s) URLs with a host get through, and the body is the input's last
    // bytes, untouched.
    assert!(matches!(request.uri.scheme_str(), Some("http" | "https")));
    assert!(request.uri.host().is_some_and(|host| !host.is_empty()));
    assert!(encoded.ends_with(&request.body));
    assert!(request.headers.len() <= outbound::MAX_HEADERS as usize);
    // What was read encodes back to the same request.
    let headers: Vec<(&str, &str)> = request
        .headers
        .iter()
        .filter_map(|(name, value)| Some((name.as_str(), value.to_str().ok()?)))
        .collect();
    if headers.len() == request.headers.len() {
        let again = outbound::encode_request(request.method.as_str(), &request.uri.to_string(), &headers, &request.body);
        let reread = outbound::parse_request(&again).expect("a request read once reads again");
        assert_eq!(reread.method, request.method);
        assert_eq!(reread.uri, request.uri);
        assert_eq!(reread.body, request.body);
    }
});
