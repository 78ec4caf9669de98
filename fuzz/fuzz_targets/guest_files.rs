//! A module's `wasmless.files` section (`wasmless_artifact::guest_files::read`), which a
//! runtime reads from every verified module it loads: the module may be a user's own
//! (`language: wasm`), so the section is the user's bytes. The input is a whole module.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wasmless_artifact::guest_files::{self, MAX_BYTES, MAX_FILES};

fuzz_target!(|bytes: &[u8]| {
    let Ok(files) = guest_files::read(bytes) else {
        return;
    };
    // What a runtime then writes to its disk: within a Function's caps, every name below
    // the guest's root, none twice.
    assert!(files.len() <= MAX_FILES);
    assert!(files.iter().map(|f| f.bytes.len()).sum::<usize>() <= MAX_BYTES);
    for file in &files {
        assert!(guest_files::path_problem(&file.name).is_none(), "{:?}", file.name);
    }
    // Written again, the files read back the same (sorted by name).
    let mut sorted = files.clone();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let rewritten = guest_files::append(b"\0asm\x01\0\0\0", &files);
    assert_eq!(guest_files::read(&rewritten).unwrap(), sorted);
});
