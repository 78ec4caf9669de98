//! `Digest`, the `sha256:<hex>` that pins modules, code and sources everywhere.

use sha2::{Digest as _, Sha256};
use std::fmt;
use std::str::FromStr;

/// The sha256 of a module's `.wasm` bytes, written `sha256:<64 hex>`.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Digest([u8; 32]);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DigestError {
    #[error("digest {0:?} must start with \"sha256:\"")]
    Algorithm(String),
    #[error("digest {0:?} must be \"sha256:\" followed by 64 hex digits")]
    Hex(String),
}

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Self {
        Self(Sha256::digest(bytes).into())
    }

    /// A digest of bytes that arrive in parts.
    pub fn hasher() -> DigestHasher {
        DigestHasher(Sha256::new())
    }

    /// The `sourceDigest` (docs/architecture.md): what a build depends on (the language, the
    /// builder's version and the source), so equal digests mean equal modules and a
    /// build can be skipped. For a directory of sources, `source` is the files joined by
    /// the builder in a canonical order.
    pub fn of_source(language: &str, builder_version: &str, source: &[u8]) -> Self {
        let mut hasher = Sha256::new();
        for part in [language.as_bytes(), builder_version.as_bytes(), source] {
            hasher.update((part.len() as u64).to_le_bytes());
            hasher.update(part);
        }
        Self(hasher.finalize().into())
    }

    /// The 64 hex digits, without the algorithm.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The first 10 hex digits: enough to name objects after a digest.
    pub fn short(&self) -> String {
        self.hex()[..10].to_string()
    }
}

/// [`Digest::of`] the parts given to [`DigestHasher::update`], in order.
pub struct DigestHasher(Sha256);

impl DigestHasher {
    pub fn update(&mut self, part: &[u8]) {
        self.0.update(part);
    }

    pub fn finish(self) -> Digest {
        Digest(self.0.finalize().into())
    }
}

impl FromStr for Digest {
    type Err = DigestError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let hex_part = s
            .strip_prefix("sha256:")
            .ok_or_else(|| DigestError::Algorithm(s.to_string()))?;
        let mut bytes = [0u8; 32];
        hex::decode_to_slice(hex_part, &mut bytes).map_err(|_| DigestError::Hex(s.to_string()))?;
        Ok(Self(bytes))
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "sha256:{}", self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_text() {
        let digest = Digest::of(b"hello");
        let text = digest.to_string();
        assert_eq!(
            text,
            "sha256:2cf24dba5fb0a30e26e83b2ac5b9e29e1b161e5c1fa7425e73043362938b9824"
        );
        assert_eq!(text.parse::<Digest>().unwrap(), digest);
        assert_eq!(digest.short(), "2cf24dba5f");
    }

    #[test]
    fn source_digest_depends_on_every_input() {
        let base = Digest::of_source("go", "0.1.0", b"package handlers");
        assert_eq!(base, Digest::of_source("go", "0.1.0", b"package handlers"));
        assert_ne!(base, Digest::of_source("rust", "0.1.0", b"package handlers"));
        assert_ne!(base, Digest::of_source("go", "0.2.0", b"package handlers"));
        assert_ne!(base, Digest::of_source("go", "0.1.0", b"package handlers "));
        // Length prefixes keep the boundaries: moving bytes between parts changes it.
        assert_ne!(
            Digest::of_source("go", "0.1.0x", b""),
            Digest::of_source("go", "0.1.0", b"x")
        );
    }

    #[test]
    fn rejects_other_algorithms_and_bad_hex() {
        assert!(matches!("md5:abcd".parse::<Digest>(), Err(DigestError::Algorithm(_))));
        assert!(matches!("sha256:xyz".parse::<Digest>(), Err(DigestError::Hex(_))));
        assert!(matches!("sha256:abcd".parse::<Digest>(), Err(DigestError::Hex(_))));
    }
}
