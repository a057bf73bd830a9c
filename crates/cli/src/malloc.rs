//! The process's allocator: mimalloc, for every `softrdma` process (store
//! nodes and clients, the engine, the benchmarks).
//!
//! Two patterns of the store cost glibc's allocator dearly (issue 32):
//!
//! * Small objects made on one thread and freed on another: the RESP
//!   door's thread builds a write (its key, its value, the answer's
//!   closure) and the node loop's thread frees it once the write commits.
//!   glibc returns such a chunk to the arena it came from, under that
//!   arena's lock, and its per-thread caches fill on one side and run dry
//!   on the other: `perf` under `redis-benchmark -t set -c 16` put
//!   glibc's malloc and free at 10-13% of the door's, the primary's and
//!   the secondary's threads; with mimalloc (a free list per page, a
//!   remote free queued to the page's owner) 2-6%.
//! * Buffers of megabytes per operation (a pulled message, a replicated
//!   write's encoding, a one-sided get's landing buffer). glibc maps those
//!   over its mmap threshold anew per use and faults them in page by page
//!   (its threshold tops out at 32 MiB); mimalloc keeps freed segments for
//!   reuse: 64 MiB one-sided gets went from 10.0/s (p99 118 ms) to
//!   22.4/s (p99 54 ms), the client at one core either way
//!   (`SOFTRDMA_SAME_HOST=0 softrdma store bench-large --sizes 67108864`,
//!   one run each).
//!
//! Before this, `mallopt` raised glibc's mmap and trim thresholds for the
//! second pattern only (docs/store.md, "Large values").

/// The global allocator of the `softrdma` binary.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
