//! A Go reactor's answer, read as a response (`wasmless_formats::reactor_response`), and
//! a streamed response's head, read alone.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wasmless_formats::reactor_response;

fuzz_target!(|output: &[u8]| {
    let head = reactor_response::parse_head(output);
    let Ok(response) = reactor_response::parse(output) else {
        return;
    };
    // The body is the output's last bytes, untouched, and its length prefix says so.
    let body = response.body();
    assert!(output.ends_with(body), "the body is a suffix of the output");
    let prefix = &output[output.len() - body.len() - 4..output.len() - body.len()];
    assert_eq!(u32::from_le_bytes(prefix.try_into().unwrap()) as usize, body.len());
    let status = response.status().as_u16();
    assert!((100..=999).contains(&status));
    // A whole response is never a head alone (its body follows), and its head, read
    // alone, says what the whole says.
    assert!(head.is_err(), "a whole response read as a head");
    let alone = reactor_response::parse_head(&output[..output.len() - body.len() - 4]).expect("its head reads");
    assert_eq!(alone.status(), response.status());
    assert_eq!(alone.headers(), response.headers());
});
