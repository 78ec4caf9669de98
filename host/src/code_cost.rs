//! What holding a module's code costs a process, apart by who pays for it.

use crate::precompiled::Residence;

/// Bytes a loaded module holds: `private` only this process pays for (a copy of the code
/// in its memory, and what wasmtime builds from it), `mapped` the pages of a code file it
/// wrote on its own disk and maps (page cache, paged in where touched), `shared` the pages
/// of the node's store's file it maps: the node's one copy, which every process on the
/// node mapping it shares, and which no budget of this process pays for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CodeCost {
    pub private: u64,
    pub mapped: u64,
    pub shared: u64,
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
                ..Self::default()
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
                private: private_of_mapped(metadata),
                mapped: image,
                shared: 0,
            },
            Residence::Stored { metadata } => Self {
                private: private_of_mapped(metadata),
                mapped: 0,
                shared: image,
            },
        }
    }
}

fn private_of_mapped(metadata: u64) -> u64 {
    metadata.saturating_mul(MAPPED_PRIVATE_PER_METADATA_BYTE) + MAPPED_PRIVATE_BASE
}

impl std::ops::Add for CodeCost {
    type Output = Self;
    fn add(self, other: Self) -> Self {
        Self {
            private: self.private + other.private,
            mapped: self.mapped + other.mapped,
            shared: self.shared + other.shared,
        }
    }
}

impl std::ops::Sub for CodeCost {
    type Output = Self;
    fn sub(self, other: Self) -> Self {
        Self {
            private: self.private.saturating_sub(other.private),
            mapped: self.mapped.saturating_sub(other.mapped),
            shared: self.shared.saturating_sub(other.shared),
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
                ..CodeCost::default()
            }
        );
        let mapped = CodeCost::of(14 << 20, Residence::Mapped { metadata: 93 << 10 });
        assert_eq!(mapped.mapped, 14 << 20);
        assert_eq!(mapped.private, (93 << 10) * 16 + (128 << 10));
        // A module that is mostly metadata is charged for it, whatever its code's size.
        let metadata_heavy = CodeCost::of(80 << 20, Residence::Mapped { metadata: 40 << 20 });
        assert!(metadata_heavy.private > 600 << 20, "{metadata_heavy:?}");
    }

    #[test]
    fn code_from_the_nodes_store_is_shared_and_only_its_metadata_private() {
        let stored = CodeCost::of(14 << 20, Residence::Stored { metadata: 93 << 10 });
        let mapped = CodeCost::of(14 << 20, Residence::Mapped { metadata: 93 << 10 });
        assert_eq!(stored.shared, 14 << 20);
        assert_eq!(stored.mapped, 0, "the store's file is not on the pool's disk");
        assert_eq!(stored.private, mapped.private);
        let both = stored + mapped;
        assert_eq!((both - stored), mapped);
    }
}
