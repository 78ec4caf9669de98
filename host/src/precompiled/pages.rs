//! Memory for the code a new pod reads and decompresses.

use std::ptr::NonNull;

/// Anonymous memory for the megabytes a new pod reads and decompresses, in transparent
/// huge pages where the kernel offers them: in a VM, faulting 12 MiB in 4 KiB pages took
/// ~4 ms here, in 2 MiB pages ~1 ms.
pub(super) struct PageBuffer {
    pub(super) memory: NonNull<u8>,
    pub(super) len: usize,
}

impl PageBuffer {
    pub(super) fn new(len: usize) -> std::io::Result<Self> {
        let len = len.max(1);
        // SAFETY: a fresh private anonymous mapping, owned by the returned buffer.
        let memory = unsafe {
            rustix::mm::mmap_anonymous(
                std::ptr::null_mut(),
                len,
                rustix::mm::ProtFlags::READ | rustix::mm::ProtFlags::WRITE,
                rustix::mm::MapFlags::PRIVATE,
            )
        }?;
        // Advice only: without huge pages the memory is the same, in smaller pages.
        // SAFETY: the range is the mapping just made.
        let _ = unsafe { rustix::mm::madvise(memory, len, rustix::mm::Advice::LinuxHugepage) };
        let memory = NonNull::new(memory.cast::<u8>()).expect("mmap returns a non-null address");
        Ok(Self { memory, len })
    }

    pub(super) fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is `len` bytes, readable, and only ours (zero until written).
        unsafe { std::slice::from_raw_parts(self.memory.as_ptr(), self.len) }
    }

    pub(super) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: as for `bytes`, and `&mut self` makes this the only reference.
        unsafe { std::slice::from_raw_parts_mut(self.memory.as_ptr(), self.len) }
    }
}

impl Drop for PageBuffer {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`; wasmtime copied what it keeps of code.
        let _ = unsafe { rustix::mm::munmap(self.memory.as_ptr().cast(), self.len) };
    }
}

// SAFETY: the buffer is plain memory owned by this value.
unsafe impl Send for PageBuffer {}
