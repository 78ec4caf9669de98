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

/// What mapped code of `image` bytes is counted to hold privately: `image / 32 + 128 KiB`.
const MAPPED_PRIVATE_SHARE: u64 = 32;
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
            // functions' metadata, type registrations, the instance template) is its own.
            // wasmtime does not say how much that is: measured, a loaded Goless sample
            // (14 MiB of code) grew the pool's anonymous memory by 0.35 MiB and a Rust
            // hello (0.5 MiB) by 0.13 MiB (bench/run.sh --only pool), which this
            // estimate covers.
            Residence::Mapped => Self {
                private: image / MAPPED_PRIVATE_SHARE + MAPPED_PRIVATE_BASE,
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
