//! The compiled-code container (`wasmless_artifact::decode_code`): LZ4, a text header, the
//! `.cwasm` bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wasmless_artifact::{decode_code, encode_code};

fuzz_target!(|compressed: &[u8]| {
    let Ok((header, cwasm)) = decode_code(compressed) else {
        return;
    };
    // What decodes, encodes back to the same header and code.
    let (again, cwasm_again) = decode_code(&encode_code(&header, &cwasm)).expect("re-encoded code decodes");
    assert_eq!(again, header);
    assert_eq!(cwasm_again, cwasm);
});
