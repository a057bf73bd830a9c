//! Registered `malloc` memory moved into a file that same-host peers map
//! (on by default; `SOFTRDMA_SHARE_MR=0` turns it off, and so does
//! `SOFTRDMA_SAME_HOST=0`, where no peer maps anything).
//!
//! The same-host path copies with plain memory moves only into and out of
//! memory a peer can map: the engine's shared chunks (`alloc_mr`) and
//! regions registered with a file behind them (`RegOptions::shared`).
//! Applications register their own `malloc` memory, which a peer reaches
//! only through `process_vm_writev`/`readv`, and the kernel looks up and
//! pins the pages on every call: perftest's same-host bandwidth stayed at
//! 0.3x of `softrdma bench` (BENCHMARKS.md). So a registration of whole
//! pages of private anonymous memory *moves* them into a memfd: the bytes
//! are copied into a new memfd mapped elsewhere, and that mapping is moved
//! over the application's addresses with one `mremap` (the kernel swaps the
//! page tables under its lock: no access ever finds the range unmapped).
//! The application's pointers and bytes are unchanged; the region is
//! registered as shared, and peers open the memfd through `/proc/PID/fd`.
//!
//! What could go wrong, and the rules that keep it from happening:
//! - A store into the range between the copy and the move would be lost.
//!   So a range moves only when the calling thread is the application's
//!   only thread (the engine counts its own: `softrdma_verbs::threads`), and no
//!   live registration overlaps it (the engine's threads write only
//!   registered memory). Otherwise it stays where it is, reached as before.
//! - Moved memory stays moved after deregistration (the application owns
//!   it; `free` unmaps it or reuses it as ordinary memory). A later
//!   registration of it finds the memfd through `/proc/self/maps` (its
//!   inode) and registers that, at the right offset; memory that was
//!   unmapped and mapped again is private again and moves again.
//! - A shared mapping would be shared with a child after `fork`, where the
//!   child of private memory gets a copy: moved ranges are marked
//!   `MADV_DONTFORK`, as rdma-core marks registered memory after
//!   `ibv_fork_init` (a child that touches them faults, there as here).
//! - Partial pages never move: the rest of a page may be another
//!   allocation that another thread uses.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// The memfds that live registrations use, by inode, and the live
/// registrations.
#[derive(Default)]
pub struct Share {
    /// A memfd and how many live registrations use it: closed at none (the
    /// mapping keeps the memory; a later registration moves it again).
    moved: Mutex<HashMap<u64, (OwnedFd, usize)>>,
    /// Live registrations: (start, end, the memfd's inode if in one).
    live: Mutex<Vec<(usize, usize, Option<u64>)>>,
    on: std::sync::OnceLock<bool>,
}

/// A mapping in `/proc/self/maps`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mapping {
    pub start: usize,
    pub end: usize,
    pub perms: String,
    pub offset: u64,
    pub inode: u64,
    pub path: String,
}

/// One line of `/proc/PID/maps`: `start-end perms offset dev inode path`.
pub fn parse_maps_line(l: &str) -> Option<Mapping> {
    let mut it = l.split_ascii_whitespace();
    let (range, perms, offset, _dev, inode) =
        (it.next()?, it.next()?, it.next()?, it.next()?, it.next()?);
    let (s, e) = range.split_once('-')?;
    let path = it.collect::<Vec<_>>().join(" ");
    Some(Mapping {
        start: usize::from_str_radix(s, 16).ok()?,
        end: usize::from_str_radix(e, 16).ok()?,
        perms: perms.to_string(),
        offset: u64::from_str_radix(offset, 16).ok()?,
        inode: inode.parse().ok()?,
        path,
    })
}

/// The mappings that cover `[start, end)`, if together they cover it all
/// without a gap.
pub fn covering(maps: &str, start: usize, end: usize) -> Option<Vec<Mapping>> {
    let mut out = Vec::new();
    let mut at = start;
    for m in maps.lines().filter_map(parse_maps_line) {
        if m.end <= at || m.start >= end {
            continue;
        }
        if m.start > at {
            return None;
        }
        at = m.end;
        out.push(m);
        if at >= end {
            return Some(out);
        }
    }
    None
}

fn page() -> usize {
    // SAFETY: sysconf has no preconditions.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}

/// Whether the calling thread is the application's only one (the engine's
/// own threads are counted apart: `softrdma_verbs::threads`).
fn only_thread() -> bool {
    let n = softrdma_verbs::threads::app_threads();
    if n != Some(1) {
        tracing::debug!(app_threads = ?n, "registered memory stays private: other threads");
    }
    n == Some(1)
}

const NAME: &std::ffi::CStr = c"softrdma-mr";

impl Share {
    fn on(&self) -> bool {
        *self.on.get_or_init(|| {
            std::env::var("SOFTRDMA_SHARE_MR").map_or(true, |v| v != "0")
                && std::env::var("SOFTRDMA_SAME_HOST").map_or(true, |v| v != "0")
        })
    }

    /// A registration of `[addr, addr + len)` begins: the file and offset
    /// to register it with, if the range is (or now moved) in a memfd of
    /// ours. Call [`Share::end`] with the same range when it ends.
    pub fn begin(&self, addr: usize, len: usize) -> Option<(RawFd, u64)> {
        let end = addr.checked_add(len)?;
        let found = if self.on() {
            self.find_or_move(addr, end)
        } else {
            None
        };
        let ino = found.map(|(_, _, ino)| ino);
        self.live.lock().push((addr, end, ino));
        found.map(|(fd, off, _)| (fd, off))
    }

    /// The registration of `[addr, addr + len)` ended (after the engine
    /// let go of its memory).
    pub fn end(&self, addr: usize, len: usize) {
        let mut g = self.live.lock();
        let Some(i) = g.iter().position(|r| (r.0, r.1) == (addr, addr + len)) else {
            return;
        };
        let (_, _, ino) = g.swap_remove(i);
        drop(g);
        if let Some(ino) = ino {
            let mut m = self.moved.lock();
            if let Some(e) = m.get_mut(&ino) {
                e.1 -= 1;
                if e.1 == 0 {
                    m.remove(&ino);
                }
            }
        }
    }

    fn find_or_move(&self, addr: usize, end: usize) -> Option<(RawFd, u64, u64)> {
        let pg = page();
        if addr % pg != 0 || end % pg != 0 {
            return None;
        }
        let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
        let cover = covering(&maps, addr, end)?;
        let ours = |m: &Mapping| m.path.starts_with("/memfd:softrdma-mr");
        if let [m] = cover.as_slice() {
            if let Some(e) = self.moved.lock().get_mut(&m.inode).filter(|_| ours(m)) {
                e.1 += 1;
                return Some((e.0.as_raw_fd(), m.offset + (addr - m.start) as u64, m.inode));
            }
        }
        // Private anonymous memory, or a memfd of ours no registration
        // uses any more (its descriptor is closed): move it (again).
        let movable = cover.iter().all(|m| {
            (m.perms == "rw-p" && m.inode == 0 && (m.path.is_empty() || m.path == "[heap]"))
                || (m.perms == "rw-s" && ours(m))
        });
        if !movable {
            return None;
        }
        if self
            .live
            .lock()
            .iter()
            .any(|&(s, e, _)| s < end && addr < e)
            || !only_thread()
        {
            return None;
        }
        let (fd, ino) = match move_to_memfd(addr, end - addr) {
            Ok(x) => x,
            Err(e) => {
                tracing::debug!(error = %e, "registered memory stays private");
                return None;
            }
        };
        let raw = fd.as_raw_fd();
        self.moved.lock().insert(ino, (fd, 1));
        Some((raw, 0, ino))
    }
}

/// Moves the whole pages `[addr, addr + len)` into a new memfd; returns it
/// and its inode. On failure the range is as it was.
fn move_to_memfd(addr: usize, len: usize) -> std::io::Result<(OwnedFd, u64)> {
    let err = std::io::Error::last_os_error;
    // SAFETY: a name and flags; the result is checked.
    let raw = unsafe { libc::memfd_create(NAME.as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(err());
    }
    // SAFETY: a descriptor we just got and own alone.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: a valid descriptor.
    if unsafe { libc::ftruncate(raw, len as libc::off_t) } != 0 {
        return Err(err());
    }
    // SAFETY: a new shared mapping of the file, placed by the kernel.
    let tmp = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            raw,
            0,
        )
    };
    if tmp == libc::MAP_FAILED {
        return Err(err());
    }
    // SAFETY: the caller's range is mapped readable (checked in
    // /proc/self/maps: rw-p) and `tmp` is our new mapping of `len` bytes;
    // no other application thread exists to store into the range meanwhile.
    unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, tmp.cast::<u8>(), len) };
    // SAFETY: moves our mapping over the caller's pages, which the kernel
    // unmaps in the same step; both ranges are `len` bytes.
    let moved = unsafe {
        libc::mremap(
            tmp,
            len,
            len,
            libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED,
            addr as *mut libc::c_void,
        )
    };
    if moved == libc::MAP_FAILED {
        let e = err();
        // SAFETY: our own mapping, still at `tmp`.
        unsafe { libc::munmap(tmp, len) };
        return Err(e);
    }
    // SAFETY: the range is now our shared mapping.
    unsafe { libc::madvise(addr as *mut libc::c_void, len, libc::MADV_DONTFORK) };
    // SAFETY: `stat` is plain data; all zeroes is valid.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and a stat buffer.
    if unsafe { libc::fstat(raw, &mut st) } != 0 {
        return Err(err());
    }
    Ok((fd, st.st_ino))
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAPS: &str = "\
55d0c000-55d0e000 r--p 00000000 fe:01 1234 /usr/bin/ib_write_bw
55d10000-55d31000 rw-p 00000000 00:00 0 [heap]
7f0000000000-7f0000020000 rw-p 00000000 00:00 0
7f0000020000-7f0000040000 rw-s 00001000 00:01 99 /memfd:softrdma-mr (deleted)
7f0000050000-7f0000060000 rw-p 00000000 00:00 0
";

    #[test]
    fn a_maps_line_is_read_with_its_path() {
        let m = parse_maps_line(
            "7f0000020000-7f0000040000 rw-s 00001000 00:01 99 /memfd:softrdma-mr (deleted)",
        )
        .unwrap();
        assert_eq!(
            (m.start, m.end, m.perms.as_str(), m.offset, m.inode),
            (0x7f0000020000, 0x7f0000040000, "rw-s", 0x1000, 99)
        );
        assert_eq!(m.path, "/memfd:softrdma-mr (deleted)");
        assert!(parse_maps_line("garbage").is_none());
    }

    #[test]
    fn a_range_is_covered_only_without_gaps() {
        let c = covering(MAPS, 0x7f0000010000, 0x7f0000030000).unwrap();
        assert_eq!(c.len(), 2);
        assert_eq!(c[1].inode, 99);
        // 0x7f0000040000..0x7f0000050000 is a hole.
        assert!(covering(MAPS, 0x7f0000030000, 0x7f0000058000).is_none());
        assert!(covering(MAPS, 0x10, 0x20).is_none());
        let h = covering(MAPS, 0x55d11000, 0x55d12000).unwrap();
        assert_eq!(h[0].path, "[heap]");
    }
}
