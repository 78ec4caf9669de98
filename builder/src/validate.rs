//! Every output is checked before it is published: it parses, validates, and speaks
//! the ABI the runtime detects for its language.

use crate::Language;
use wasmless_host::abi::{self, Abi, AbiError};

#[derive(Debug, thiserror::Error)]
pub enum ValidateError {
    #[error("the module is not one the runtime can serve: {0}")]
    Abi(#[from] AbiError),
    #[error("the module does not validate: {0}")]
    Invalid(String),
    #[error("the module's files cannot be served: {0}")]
    Files(#[from] wasmless_artifact::guest_files::GuestFilesError),
    #[error("a {language} handler must build to a {expected} module, but this one is a {found} module")]
    WrongAbi {
        language: &'static str,
        expected: &'static str,
        found: &'static str,
    },
}

pub fn validate(language: Language, wasm: &[u8]) -> Result<Abi, ValidateError> {
    let found = abi::detect(wasm)?;
    let mut validator = wasmparser::Validator::new_with_features(wasmparser::WasmFeatures::all());
    validator
        .validate_all(wasm)
        .map_err(|e| ValidateError::Invalid(e.to_string()))?;
    // As the runtime will read them: a section it would refuse fails here, with the reason.
    wasmless_artifact::guest_files::read(wasm)?;
    let expected = match language {
        Language::Go => Some(Abi::GoReactor),
        Language::Rust => Some(Abi::HttpComponent),
        Language::Wat | Language::Wasm => None,
    };
    match expected {
        Some(expected) if expected != found => Err(ValidateError::WrongAbi {
            language: language.name(),
            expected: expected.name(),
            found: found.name(),
        }),
        _ => Ok(found),
    }
}
