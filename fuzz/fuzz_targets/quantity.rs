//! Kubernetes-style quantities and durations of flags and `spec.limits`
//! (`wasmless_formats::quantity::{parse_bytes, parse_duration}`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use std::time::Duration;
use wasmless_formats::quantity::{parse_bytes, parse_duration};

fuzz_target!(|text: &str| {
    if let Ok(bytes) = parse_bytes(text) {
        // A size re-formats to the same size.
        assert_eq!(parse_bytes(&bytes.to_string()), Ok(bytes), "{text:?}");
    }
    if let Ok(duration) = parse_duration(text) {
        // A duration re-formats (seconds, exact to the nanosecond) to the same duration;
        // past ~11 days an f64 no longer holds every nanosecond, so a rounding is allowed.
        let written = format!("{}.{:09}s", duration.as_secs(), duration.subsec_nanos());
        let again = parse_duration(&written).unwrap_or_else(|e| panic!("{text:?} -> {written:?}: {e}"));
        let slack = if duration < Duration::from_secs(1_000_000) {
            Duration::ZERO
        } else {
            duration.div_f64(1e12)
        };
        assert!(
            again.abs_diff(duration) <= slack,
            "{text:?}: {duration:?} -> {written:?} -> {again:?}"
        );
    }
});
