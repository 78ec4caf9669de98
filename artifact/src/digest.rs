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

    /// The 64 hex digits, without the algorithm.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    /// The first 10 hex digits: enough to name objects after a digest.
    pub fn short(&self) -> String {
        self.hex()[..10].to_string()
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
    fn rejects_other_algorithms_and_bad_hex() {
        assert!(matches!("md5:abcd".parse::<Digest>(), Err(DigestError::Algorithm(_))));
        assert!(matches!("sha256:xyz".parse::<Digest>(), Err(DigestError::Hex(_))));
        assert!(matches!("sha256:abcd".parse::<Digest>(), Err(DigestError::Hex(_))));
    }
}
