//! File names in a directory of projected chunk ConfigMaps (`Part::parse_chunk_file_name`).
#![no_main]

use libfuzzer_sys::fuzz_target;
use wasmless_artifact::Part;

fuzz_target!(|name: &str| {
    for part in [Part::Module, Part::Code] {
        if let Some(index) = part.parse_chunk_file_name(name) {
            // The index a name gives is the one whose name parses back to it.
            assert_eq!(part.parse_chunk_file_name(&part.chunk_file_name(index)), Some(index));
        }
    }
});
