//! Arbitrary bytes as a message on the node code store's socket: a request a tenant's
//! runtime sends the agent, or a reply the agent sends back
//! (`wasmless_artifact::code_store`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use wasmless_artifact::code_store::{MAX_MESSAGE_BYTES, Reply, Request};

fuzz_target!(|bytes: &[u8]| {
    let Ok(text) = std::str::from_utf8(bytes) else { return };
    // What parses is written back the same, and what is written fits one message.
    if let Ok(request) = Request::parse(text) {
        let encoded = request.encode();
        assert!(encoded.len() <= MAX_MESSAGE_BYTES);
        assert_eq!(Request::parse(&encoded).unwrap(), request);
    }
    if let Ok(reply) = Reply::parse(text) {
        let encoded = reply.encode();
        assert!(encoded.len() <= MAX_MESSAGE_BYTES);
        if !matches!(reply, Reply::Refused(_)) {
            assert_eq!(Reply::parse(&encoded).unwrap(), reply);
        }
    }
});
