//! The pages of a loaded module's code that are mapped from a file, and letting go of
//! them while the module is idle.
//!
//! Code mapped from a file (the node's store's copy, or one this process wrote) is page
//! cache, and the pages a module's requests touched stay in the process's page tables, in
//! its RSS, until the module is dropped. A Go request touches code in most of its 6–7 MiB
//! of text, and the kernel maps the 64 KiB around each page it faults in
//! (`fault_around_bytes`, which nothing but userfaultfd turns off for one mapping), so a
//! pool that has served each of many Go Functions once holds ~5.4 MiB of RSS for each
//! (`bench/cluster.sh defaults`, 2026-12-07). `MADV_DONTNEED` on the text drops those
//! entries and nothing else: the pages stay in the node's page cache, shared with every
//! other process mapping the file; the next request faults back in what it touches, as
//! minor faults; and the kernel can reclaim an idle Function's pages under pressure
//! without first unmapping them from this process.

use crate::compile::Compiled;

/// The whole pages of a module's text, mapped from a file and never written.
pub struct MappedText {
    start: usize,
    len: usize,
    /// Keeps the mapping: the module's image is unmapped with its last clone.
    _code: Compiled,
}

impl MappedText {
    /// The text of `code`, in whole pages.
    ///
    /// # Safety
    ///
    /// `code` was mapped from a file (`deserialize_open_file`/`deserialize_file`), not
    /// copied into the process's memory: there `MADV_DONTNEED` would zero the code.
    /// Mapped, wasmtime never writes the text (it refuses code with relocations outside
    /// `.debug_*`, and makes the whole image read-only as it publishes it), so there is no
    /// private copy of a page for the advice to drop: what reads back is the file's bytes.
    pub unsafe fn of(code: &Compiled) -> Option<Self> {
        let text = match code {
            Compiled::Component(component) => component.text(),
            Compiled::Module(module) => module.text(),
        };
        let page = rustix::param::page_size();
        let first = text.as_ptr().addr();
        let start = first.next_multiple_of(page);
        let end = (first + text.len()) / page * page;
        (end > start).then(|| Self {
            start,
            len: end - start,
            _code: code.clone(),
        })
    }

    /// Bytes of text this covers.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Drops this process's page-table entries for the text. The code runs on as before:
    /// a request running meanwhile, or the next one, faults back in the pages it touches.
    pub fn release(&self) -> std::io::Result<()> {
        // SAFETY: the range is whole pages of a live mapping (held by `_code`) of a file
        // whose pages were never written (`of`'s contract), so the advice changes which
        // pages are mapped, never what they hold.
        unsafe {
            rustix::mm::madvise(
                self.start as *mut std::ffi::c_void,
                self.len,
                rustix::mm::Advice::LinuxDontNeed,
            )?;
        }
        Ok(())
    }
}
