//! A guest's stdout, read as a CGI response (`wasmless_formats::cgi_response`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use wasmless_formats::cgi_response;

fuzz_target!(|output: &[u8]| {
    let Ok(response) = cgi_response::parse(output) else {
        return;
    };
    // The body is the guest's output after the blank line, untouched, and a header
    // block is there: no blank line, no response.
    assert!(output.ends_with(response.body()), "the body is a suffix of the output");
    let head = &output[..output.len() - response.body().len()];
    let before_blank = head
        .strip_suffix(b"\n")
        .map(|rest| rest.strip_suffix(b"\r").unwrap_or(rest))
        .expect("the head ends with a newline");
    assert!(
        before_blank.is_empty() || before_blank.ends_with(b"\n"),
        "the head ends with a blank line"
    );
    // A parsed response can be sent: its status is one hyper writes.
    let status = response.status().as_u16();
    assert!((100..=999).contains(&status));
});
