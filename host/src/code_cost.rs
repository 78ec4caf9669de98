//! What holding a module's code costs a process, apart by who pays for it.

use crate::precompiled::Residence;

/// Bytes a loaded module holds: `private` only this process pays for (a copy of the code
/// in its memory, and what wasmtime builds from it), `mapped` the code file's pages it
/// maps (page cache: shared with every process mapping the same file, paged in where
/// touched, on disk).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CodeCost {
    pub private: u64,
    pub mapped: u64,
}

/// What mapped code is counted to hold privately: 16 bytes per byte of its metadata, and
/// 128 KiB.
const MAPPED_PRIVATE_PER_METADATA_BYTE: u64 = 16;
const MAPPED_PRIVATE_BASE: u64 = 128 << 10;

impl CodeCost {
    /// The cost of code whose image (code, data and metadata, as wasmtime maps it) is
    /// `image` bytes.
    pub fn of(image: usize, residence: Residence) -> Self {
        let image = image as u64;
        match residence {
            Residence::Copied => Self {
                private: image,
                mapped: 0,
            },
            // Mapped, the code's pages are the file's; what the process builds from it (the
            // functions' metadata, type registrations, the instance template) is its own,
            // and grows with the metadata wasmtime decodes (`.wasmtime.info`), not with the
            // code: a module of a million tiny functions has little code and much of it.
            // wasmtime does not say how much that is. Measured, a loaded Goless sample
            // (14 MiB of code, 93 KiB of metadata) grew the pool's anonymous memory by
            // 0.35 MiB (bench/run.sh --only pool); a value type of one byte there is ~32 in
            // memory, counted twice. Sixteen times the metadata covers either.
            Residence::Mapped { metadata } => Self {
                private: metadata.saturating_mul(MAPPED_PRIVATE_PER_METADATA_BYTE) + MAPPED_PRIVATE_BASE,
                mapped: image,
            },
        }
    }
}

impl std::ops::Add for CodeCost {
    type Output = Self;
    fn add(self, other: Self) -> Self {
        Self {
            private: self.private + other.private,
            mapped: self.mapped + other.mapped,
        }
    }
}

impl std::ops::Sub for CodeCost {
    type Output = Self;
    fn sub(self, other: Self) -> Self {
        Self {
            private: self.private.saturating_sub(other.private),
            mapped: self.mapped.saturating_sub(other.mapped),
        }
    }
}

impl std::iter::Sum for CodeCost {
    fn sum<I: Iterator<Item = Self>>(costs: I) -> Self {
        costs.fold(Self::default(), |total, cost| total + cost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn copied_code_is_all_private_and_mapped_code_is_charged_by_its_metadata() {
        assert_eq!(
            CodeCost::of(14 << 20, Residence::Copied),
            CodeCost {
                private: 14 << 20,
                mapped: 0
            }
        );
        let mapped = CodeCost::of(14 << 20, Residence::Mapped { metadata: 93 << 10 });
        assert_eq!(mapped.mapped, 14 << 20);
        assert_eq!(mapped.private, (93 << 10) * 16 + (128 << 10));
        // A module that is mostly metadata is charged for it, whatever its code's size.
        let metadata_heavy = CodeCost::of(80 << 20, Residence::Mapped { metadata: 40 << 20 });
        assert!(metadata_heavy.private > 600 << 20, "{metadata_heavy:?}");
    }
}
