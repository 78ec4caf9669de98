//! ConfigMap contents: chunks joined and zstd-decoded back to a module
//! (`wasmless_artifact::reassemble`), and a module split and joined back.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wasmless_artifact::{MAX_CHUNK_BYTES, compress_and_split, join_chunks, reassemble, split_chunks};

fuzz_target!(|data: &[u8]| {
    // The first byte says where to cut the rest into chunks, as a ConfigMap set may be
    // cut anywhere (a chunk missing, reordered or truncated is the reader's problem).
    let Some((&cut, bytes)) = data.split_first() else {
        assert!(reassemble::<&[u8]>(&[]).is_err());
        return;
    };
    let step = usize::from(cut).max(1);
    let chunks: Vec<&[u8]> = bytes.chunks(step).collect();
    if let Ok(module) = reassemble(&chunks)
        && bytes.len() <= MAX_CHUNK_BYTES
    {
        // Cutting is invisible: the same bytes in one chunk decode the same.
        assert_eq!(reassemble(&[bytes]).expect("one chunk decodes like many"), module);
    }
    // Splitting round-trips, and no chunk is over a ConfigMap's budget.
    let split = split_chunks(bytes);
    assert!(split.iter().all(|chunk| chunk.len() <= MAX_CHUNK_BYTES));
    assert_eq!(join_chunks(&split).unwrap_or_default(), bytes);
    // What the builder stores, the runtime reads back. Compressing is the slow part: small inputs only.
    if bytes.len() <= 4096 {
        assert_eq!(
            reassemble(&compress_and_split(bytes)).expect("a stored module reassembles"),
            bytes
        );
    }
});
