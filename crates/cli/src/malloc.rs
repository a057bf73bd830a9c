//! The C allocator's settings for large buffers (issue 32).
//!
//! A store node, and a client moving large values, allocate and free
//! buffers of megabytes per operation (a pulled message, a replicated
//! write's encoding). With glibc's defaults such a buffer is often given
//! back to the kernel when freed (mapped anew for allocations over the
//! dynamic mmap threshold, or trimmed off the heap's top), and the next
//! one is faulted in again page by page: at 16 MiB puts that halved the
//! rate (docs/store.md, "Large values"). Here allocations up to 32 MiB
//! (glibc's largest mmap threshold) come from the heap, and up to 256 MiB
//! of free memory at its top is kept for the next one.

/// Sets the allocator's thresholds; called once, first thing in `main`.
pub fn keep_large_buffers() {
    // SAFETY: `mallopt` only changes glibc's allocator parameters (it
    // takes its own lock); it is called before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
    }
}
