//! Registered memory that same-host peers can map: `alloc_mr` takes its
//! bytes from memfd chunks of the device (`docs/same-host.md`). A peer that
//! reaches a region in a chunk maps the chunk (through `/proc/PID/fd/FD`)
//! and copies with plain memory moves instead of `process_vm_writev`.
//!
//! Chunks of [`CHUNK`] bytes (sparse: untouched pages cost nothing) are
//! carved first-fit, page-granular; an allocation above half a chunk gets a
//! chunk of its own, closed when it is freed. Freed ranges are zeroed (large
//! ones by punching a hole, which also returns their pages to the system),
//! so every allocation starts zeroed. Chunks are kept open while the device
//! lives, so their descriptor numbers stay meaningful to peers.

use crate::sys::{self, SharedMap};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::Arc;

/// Bytes per shared chunk.
pub(crate) const CHUNK: usize = 64 << 20;
const PAGE: usize = 4096;
/// Freed ranges at least this long are zeroed by punching a hole.
const PUNCH_MIN: usize = 64 << 10;

struct Chunk {
    fd: OwnedFd,
    map: SharedMap,
    len: usize,
    ino: u64,
    /// Free ranges: offset -> length.
    free: BTreeMap<usize, usize>,
    /// Holds exactly one allocation (closed when it is freed).
    dedicated: bool,
}

/// The device's shared-memory allocator.
pub(crate) struct Pool {
    chunks: Mutex<Vec<Option<Chunk>>>,
}

/// One allocation: `len` zeroed bytes at `ptr`, in chunk `fd` at `off`.
pub(crate) struct PoolAlloc {
    pool: Arc<Pool>,
    chunk: usize,
    pub off: usize,
    pub len: usize,
    pub ptr: *mut u8,
    pub fd: u32,
    pub ino: u64,
}

// SAFETY: the allocation is uniquely owned memory inside a mapping the pool
// keeps alive; it is only reached through raw-pointer copies (as AlignedBuf).
unsafe impl Send for PoolAlloc {}
// SAFETY: as for Send: shared access only through raw-pointer copies.
unsafe impl Sync for PoolAlloc {}

impl Pool {
    pub fn new() -> Arc<Pool> {
        Arc::new(Pool {
            chunks: Mutex::new(Vec::new()),
        })
    }

    /// `len` zeroed bytes (at least one page).
    pub fn alloc(self: &Arc<Pool>, len: usize) -> io::Result<PoolAlloc> {
        let len = len.max(1).div_ceil(PAGE) * PAGE;
        let mut chunks = self.chunks.lock();
        let dedicated = len > CHUNK / 2;
        if !dedicated {
            for (i, c) in chunks.iter_mut().enumerate() {
                let Some(c) = c.as_mut().filter(|c| !c.dedicated) else {
                    continue;
                };
                if let Some(off) = take_first_fit(&mut c.free, len) {
                    return Ok(self.handout(i, c, off, len));
                }
            }
        }
        let size = if dedicated { len } else { CHUNK };
        let fd = sys::memfd("softrdma-mr", size)?;
        let map = SharedMap::map(fd.as_raw_fd(), size)?;
        let (ino, _) = sys::fd_ino_size(fd.as_raw_fd())?;
        let mut c = Chunk {
            fd,
            map,
            len: size,
            ino,
            free: BTreeMap::from([(0, size)]),
            dedicated,
        };
        let off = take_first_fit(&mut c.free, len).expect("a fresh chunk fits");
        let i = match chunks.iter().position(Option::is_none) {
            Some(i) => i,
            None => {
                chunks.push(None);
                chunks.len() - 1
            }
        };
        let a = self.handout(i, &c, off, len);
        chunks[i] = Some(c);
        Ok(a)
    }

    fn handout(self: &Arc<Pool>, i: usize, c: &Chunk, off: usize, len: usize) -> PoolAlloc {
        PoolAlloc {
            pool: self.clone(),
            chunk: i,
            off,
            len,
            // SAFETY: off + len <= c.len (taken from the free list), so the
            // pointer stays inside the mapping.
            ptr: unsafe { c.map.ptr().add(off) },
            fd: c.fd.as_raw_fd() as u32,
            ino: c.ino,
        }
    }

    /// Shared bytes in use (for `softrdma info` and tests).
    pub fn in_use(&self) -> usize {
        self.chunks
            .lock()
            .iter()
            .flatten()
            .map(|c| c.len - c.free.values().sum::<usize>())
            .sum()
    }

    fn free(&self, chunk: usize, off: usize, len: usize) {
        let mut chunks = self.chunks.lock();
        let Some(c) = chunks[chunk].as_mut() else {
            return;
        };
        if c.dedicated {
            chunks[chunk] = None;
            return;
        }
        // Zero it for the next allocation.
        let punched =
            len >= PUNCH_MIN && sys::punch_hole(c.fd.as_raw_fd(), off as u64, len as u64).is_ok();
        if !punched {
            // SAFETY: [off, off + len) was this allocation's, inside the
            // mapping, and no one uses it any more (its owner dropped it).
            unsafe { std::ptr::write_bytes(c.map.ptr().add(off), 0, len) };
        }
        give_back(&mut c.free, off, len);
    }
}

impl Drop for PoolAlloc {
    fn drop(&mut self) {
        self.pool.free(self.chunk, self.off, self.len);
    }
}

/// Takes `len` bytes from the first free range that holds them.
fn take_first_fit(free: &mut BTreeMap<usize, usize>, len: usize) -> Option<usize> {
    let (&off, &flen) = free.iter().find(|(_, &l)| l >= len)?;
    free.remove(&off);
    if flen > len {
        free.insert(off + len, flen - len);
    }
    Some(off)
}

/// Returns `[off, off + len)` to the free ranges, merging neighbours.
fn give_back(free: &mut BTreeMap<usize, usize>, mut off: usize, mut len: usize) {
    if let Some((&poff, &plen)) = free.range(..off).next_back() {
        if poff + plen == off {
            free.remove(&poff);
            off = poff;
            len += plen;
        }
    }
    if let Some(&nlen) = free.get(&(off + len)) {
        free.remove(&(off + len));
        len += nlen;
    }
    free.insert(off, len);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_fit_and_coalescing() {
        let mut f = BTreeMap::from([(0, 100)]);
        assert_eq!(take_first_fit(&mut f, 30), Some(0));
        assert_eq!(take_first_fit(&mut f, 30), Some(30));
        assert_eq!(take_first_fit(&mut f, 50), None);
        give_back(&mut f, 0, 30);
        assert_eq!(take_first_fit(&mut f, 40), Some(60));
        give_back(&mut f, 30, 30);
        assert_eq!(f, BTreeMap::from([(0, 60)]), "merged with the left range");
        give_back(&mut f, 60, 40);
        assert_eq!(f, BTreeMap::from([(0, 100)]), "merged on both sides");
    }

    #[test]
    fn allocations_are_zeroed_and_reused() {
        let p = Pool::new();
        let a = p.alloc(100_000).unwrap();
        assert_eq!(a.len, 102_400);
        // SAFETY: a's bytes are ours.
        unsafe { std::ptr::write_bytes(a.ptr, 0xAB, a.len) };
        let (off, fd) = (a.off, a.fd);
        drop(a);
        let b = p.alloc(100_000).unwrap();
        assert_eq!((b.off, b.fd), (off, fd), "the freed range is reused");
        // SAFETY: b's bytes are ours.
        let s = unsafe { std::slice::from_raw_parts(b.ptr, b.len) };
        assert!(s.iter().all(|&x| x == 0), "and zeroed");
        let c = p.alloc(1).unwrap();
        assert_eq!(c.len, PAGE);
        assert_eq!(p.in_use(), b.len + c.len);
        let big = p.alloc(CHUNK).unwrap();
        assert_ne!(big.fd, b.fd, "a large allocation gets its own chunk");
        drop(big);
        assert_eq!(p.in_use(), b.len + c.len);
    }
}
