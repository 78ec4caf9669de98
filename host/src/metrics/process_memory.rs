//! `wasmless_process_memory_bytes{kind}`: the process's memory as the kernel counts it,
//! read from `/proc/self/smaps_rollup` at each scrape. RSS counts a page of code every
//! process on the node maps as if each held it alone; PSS divides each page by the
//! processes that map it, and `private` is what this process alone holds (what freeing it
//! would give back), `shared` what it maps with others. Today each process maps code
//! files of its own, so they differ by little more than the binary and libc; once pods
//! and the pool of a node map the same code files (issue 39), PSS, not RSS, is the figure
//! to compare them by.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::gauge::ConstGauge;

const SMAPS_ROLLUP: &str = "/proc/self/smaps_rollup";

/// Bytes of the process's memory, by how the kernel shares them.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct ProcessMemory {
    pub rss: u64,
    pub pss: u64,
    pub private: u64,
    pub shared: u64,
}

impl ProcessMemory {
    /// This process's, or `None` where the kernel has no `smaps_rollup` (not Linux, or
    /// before 4.14).
    pub fn of_this_process() -> Option<Self> {
        Self::parse(&std::fs::read_to_string(SMAPS_ROLLUP).ok()?)
    }

    /// The `Rss:`, `Pss:`, `Private_*:` and `Shared_*:` lines of an `smaps_rollup`, in kB.
    pub fn parse(text: &str) -> Option<Self> {
        let field = |name: &str| -> Option<u64> {
            text.lines().find_map(|line| {
                let rest = line.strip_prefix(name)?.strip_prefix(':')?;
                let kb = rest.trim().strip_suffix("kB")?.trim().parse::<u64>().ok()?;
                Some(kb * 1024)
            })
        };
        Some(Self {
            rss: field("Rss")?,
            pss: field("Pss")?,
            private: field("Private_Clean")? + field("Private_Dirty")?,
            shared: field("Shared_Clean")? + field("Shared_Dirty")?,
        })
    }
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

/// Reads the process's memory on each scrape, so that the figure is the one of the moment
/// it is asked. The kernel walks the process's page tables for it: ~20 ms per GiB resident
/// in 4 KiB pages (measured on the project's machine), under the mmap lock for reading
/// (which Linux ≥ 5.10 gives up to a waiting writer). So `/metrics` is encoded on a
/// blocking thread, not an async worker that serves requests. The admin port is not one a
/// handler can call.
#[derive(Debug)]
pub(super) struct ProcessMemoryCollector;

impl Collector for ProcessMemoryCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(memory) = ProcessMemory::of_this_process() else {
            return Ok(());
        };
        let mut family = encoder.encode_descriptor(
            "wasmless_process_memory_bytes",
            "The process's memory from /proc/self/smaps_rollup: rss, pss (shared pages divided among the processes mapping them), private (this process's alone), shared (mapped with others)",
            None,
            MetricType::Gauge,
        )?;
        for (kind, bytes) in [
            ("rss", memory.rss),
            ("pss", memory.pss),
            ("private", memory.private),
            ("shared", memory.shared),
        ] {
            let gauge = ConstGauge::new(i64::try_from(bytes).unwrap_or(i64::MAX));
            gauge.encode(family.encode_family(&KindLabels { kind })?)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_kernels_rollup_in_bytes() {
        let text = "55744bb40000-7fff38a66000 ---p 00000000 00:00 0                          [rollup]\n\
            Rss:                1660 kB\nPss:                 358 kB\nPss_Dirty:           112 kB\n\
            Pss_Anon:            112 kB\nPss_File:            246 kB\nShared_Clean:       1504 kB\n\
            Shared_Dirty:          0 kB\nPrivate_Clean:        44 kB\nPrivate_Dirty:       112 kB\n";
        assert_eq!(
            ProcessMemory::parse(text),
            Some(ProcessMemory {
                rss: 1660 * 1024,
                pss: 358 * 1024,
                private: 156 * 1024,
                shared: 1504 * 1024,
            })
        );
        assert_eq!(ProcessMemory::parse("Rss: 12 kB\n"), None, "a rollup without Pss");
    }

    #[test]
    fn this_process_maps_its_own_binary_shared_or_private_and_pss_is_at_most_rss() {
        let Some(memory) = ProcessMemory::of_this_process() else {
            return; // no smaps_rollup on this kernel: nothing is exported either
        };
        assert!(memory.rss > 0);
        assert!(memory.pss <= memory.rss);
        assert_eq!(memory.private + memory.shared, memory.rss);
    }
}
