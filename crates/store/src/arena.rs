//! Fixed-address memory arenas.
//!
//! A replica group's nodes all map their arena at the **same virtual
//! address**, so that a [`RemotePtr`](crate::ptr::RemotePtr) (virtual address
//! plus STag plus length) handed out by one node is valid on the other. This
//! module owns that mapping:
//!
//! * [`Arena::map_at`] maps `len` anonymous bytes at exactly `addr` with
//!   `mmap(MAP_FIXED_NOREPLACE)`. If any part of the range is already mapped
//!   it fails with [`ArenaError::AddressTaken`], naming the address; it never
//!   relocates silently and never clobbers an existing mapping.
//! * [`Arena::map_anywhere`] picks a random address in a band of the address
//!   space that processes do not otherwise use ([`QUIET_BAND`]; the kernel
//!   chooses only where that band does not exist) and keeps that mapping:
//!   this is how a primary *proposes* the address that its secondaries, and
//!   restarted nodes, then request with [`Arena::map_at`].
//! * [`Arena::read`] / [`Arena::write`] copy bytes in and out at an offset with
//!   bounds checks. The RDMA engine reads the same memory through raw
//!   pointers (a recovery's Reads land in a scratch region, and the node
//!   writes the bytes), so all access goes through `ptr::copy_nonoverlapping`
//!   and the one Rust reference handed out is a pinned range's
//!   ([`pins`]: bytes no write changes while the pin is held).
//!
//! All of the crate's `unsafe` code lives in this file and [`pins`], beside
//! the arena's registration (`net/arena_reg.rs`).
//!
//! The [`Memory`] trait abstracts "bytes at offsets" so that the replication
//! state machine can run over a real [`Arena`] or, in the deterministic
//! simulation where two nodes live in one process, over a [`HeapMemory`].

use std::fmt;
use std::ptr::NonNull;
use std::sync::atomic::{fence, AtomicU64, Ordering};
use std::sync::Arc;

#[path = "arena_pins.rs"]
pub mod pins;
pub use pins::{Pin, Pins};

/// Size of a page; arena addresses and lengths must be multiples of it.
pub const PAGE_SIZE: u64 = 4096;

/// Where [`Arena::map_anywhere`] places arenas: 16 TiB to 48 TiB, below a
/// position-independent executable and its heap (about 85 TiB on x86-64
/// Linux) and the per-process randomised `mmap` area (from about 112 TiB
/// up to the 128 TiB top of a 47-bit address space), above anything a
/// process maps low.
pub const QUIET_BAND: (u64, u64) = (16 << 40, 48 << 40);

/// A random number (std's per-process random hash keys; no dependency).
fn random_u64() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(std::process::id() as u64);
    h.finish()
}

/// Whether an arena's pages may be shared with a child process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ArenaKind {
    /// `MAP_PRIVATE | MAP_ANONYMOUS`.
    Private,
    /// `MAP_SHARED | MAP_ANONYMOUS`: survives `fork` as shared memory.
    Shared,
}

/// Errors from mapping or accessing an arena.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArenaError {
    /// Part of `[addr, addr + len)` is already mapped in this process.
    #[error(
        "arena address range {addr:#x}..{end:#x} ({len} bytes) is already in use in this process; \
         choose another arena address (or let the primary propose one)",
        end = addr + len
    )]
    AddressTaken {
        /// Requested start address.
        addr: u64,
        /// Requested length.
        len: u64,
    },
    /// The address or length is not page aligned, or the length is zero.
    #[error("arena address {addr:#x} / length {len} must be non-zero multiples of {PAGE_SIZE}")]
    Misaligned {
        /// Requested start address.
        addr: u64,
        /// Requested length.
        len: u64,
    },
    /// The kernel refused the mapping for another reason.
    #[error("mmap of {len} bytes at {addr:#x} failed: {reason}")]
    Map {
        /// Requested start address (0: no hint).
        addr: u64,
        /// Requested length.
        len: u64,
        /// `strerror` text.
        reason: String,
    },
    /// An access fell outside the arena.
    #[error("access of {len} bytes at offset {offset} is outside the arena of {arena_len} bytes")]
    OutOfBounds {
        /// Offset of the access.
        offset: u64,
        /// Length of the access.
        len: u64,
        /// Length of the arena.
        arena_len: u64,
    },
}

/// Bytes addressed by offset: an [`Arena`] or a [`HeapMemory`].
pub trait Memory {
    /// Length in bytes.
    fn len(&self) -> u64;
    /// Whether the memory has no bytes (never true for a valid arena).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Copies `buf.len()` bytes at `offset` into `buf`.
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ArenaError>;
    /// Copies `data` to `offset`.
    fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), ArenaError>;
    /// The writes until [`Self::end_group`] make one change (a write's
    /// objects, each written in pieces and its header last): a reader
    /// that checks [`Pins`] sees the arena before or after them, never
    /// between. Nests. Nothing by default (the simulation's memory).
    fn begin_group(&mut self) {}
    /// Ends what [`Self::begin_group`] began.
    fn end_group(&mut self) {}
    /// The writes until [`Self::end_together`] belong together (a batch's
    /// objects): a reader that checks [`Exposures`] sees all or none of
    /// them. Nothing by default (the simulation's memory).
    fn begin_together(&mut self) {}
    /// Ends what [`Self::begin_together`] began.
    fn end_together(&mut self) {}
}

/// A sequence lock over the writes that belong together: odd while a
/// batch's objects are being written into the arena, two more after each.
/// A reader in this process (the RESP door's look-ups) takes
/// [`Exposures::read_begin`] before its reads and [`Exposures::read_valid`]
/// after them: when that holds, no batch was written meanwhile, so the
/// reads saw every batch whole or not at all. Writers never wait.
#[derive(Debug, Default)]
pub struct Exposures(AtomicU64);

impl Exposures {
    /// Where a set of reads starts: an even count (no batch being
    /// written), or `None` while one is.
    pub fn read_begin(&self) -> Option<u64> {
        let c = self.0.load(Ordering::Acquire);
        c.is_multiple_of(2).then_some(c)
    }

    /// Whether no batch was written since [`Self::read_begin`] gave
    /// `since` (the reads in between are then consistent).
    pub fn read_valid(&self, since: u64) -> bool {
        fence(Ordering::Acquire);
        self.0.load(Ordering::Relaxed) == since
    }

    fn begin(&self) {
        let c = self.0.load(Ordering::Relaxed);
        assert!(c.is_multiple_of(2), "batches written one at a time");
        self.0.store(c + 1, Ordering::Relaxed);
        fence(Ordering::Release);
    }

    fn end(&self) {
        let c = self.0.load(Ordering::Relaxed);
        self.0.store(c + 1, Ordering::Release);
    }
}

fn check_range(offset: u64, len: usize, arena_len: u64) -> Result<(), ArenaError> {
    let len = len as u64;
    match offset.checked_add(len) {
        Some(end) if end <= arena_len => Ok(()),
        _ => Err(ArenaError::OutOfBounds {
            offset,
            len,
            arena_len,
        }),
    }
}

/// An anonymous mapping at a fixed virtual address, unmapped on drop.
pub struct Arena {
    base: NonNull<u8>,
    len: u64,
    kind: ArenaKind,
    exposures: Arc<Exposures>,
    /// Every write counted, and the ranges pinned for sending.
    pins: Arc<Pins>,
    /// [`Memory::begin_group`]s open.
    groups: u32,
}

// SAFETY: `Arena` owns its mapping exclusively (like a `Box<[u8]>`); the raw
// pointer is only dereferenced inside `read` (shared access, `&self`) and
// `write` (exclusive access, `&mut self`), so the usual borrow rules make it
// safe to move and share across threads.
unsafe impl Send for Arena {}
// SAFETY: see `Send`; `&Arena` only permits reads.
unsafe impl Sync for Arena {}

impl fmt::Debug for Arena {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Arena")
            .field("base", &format_args!("{:#x}", self.base_addr()))
            .field("len", &self.len)
            .field("kind", &self.kind)
            .finish()
    }
}

fn flags(kind: ArenaKind) -> libc::c_int {
    libc::MAP_ANONYMOUS
        | match kind {
            ArenaKind::Private => libc::MAP_PRIVATE,
            ArenaKind::Shared => libc::MAP_SHARED,
        }
}

/// Asks for transparent huge pages over a private arena (where the host's
/// THP setting is `madvise`, Debian's default): a key's look-up touches an
/// index bucket and an object anywhere in the arena, and with 4 KiB pages
/// each is a TLB miss and a page walk. Advice only: an error changes
/// nothing. A shared arena is shmem, whose huge pages are a host setting.
fn advise_huge_pages(base: NonNull<u8>, len: u64, kind: ArenaKind) {
    if kind == ArenaKind::Private {
        // SAFETY: `base..base + len` is the mapping just made; MADV_HUGEPAGE
        // only changes how the kernel backs it, never its contents.
        unsafe { libc::madvise(base.as_ptr().cast(), len as usize, libc::MADV_HUGEPAGE) };
    }
}

fn errno_text() -> String {
    std::io::Error::last_os_error().to_string()
}

fn check_aligned(addr: u64, len: u64) -> Result<(), ArenaError> {
    if len == 0 || !len.is_multiple_of(PAGE_SIZE) || !addr.is_multiple_of(PAGE_SIZE) {
        return Err(ArenaError::Misaligned { addr, len });
    }
    Ok(())
}

impl Arena {
    /// Maps `len` bytes at exactly `addr`, refusing if any part is taken.
    pub fn map_at(addr: u64, len: u64, kind: ArenaKind) -> Result<Arena, ArenaError> {
        check_aligned(addr, len)?;
        if addr == 0 || addr.checked_add(len).is_none() {
            return Err(ArenaError::Misaligned { addr, len });
        }
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping, so
        // this cannot invalidate memory that other code relies on; the result
        // is checked before use.
        let got = unsafe {
            libc::mmap(
                addr as *mut libc::c_void,
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                flags(kind) | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        if got == libc::MAP_FAILED {
            let err = std::io::Error::last_os_error();
            if err.raw_os_error() == Some(libc::EEXIST) {
                return Err(ArenaError::AddressTaken { addr, len });
            }
            return Err(ArenaError::Map {
                addr,
                len,
                reason: err.to_string(),
            });
        }
        if got as u64 != addr {
            // A kernel older than 4.17 treats the flag as a mere hint and
            // may place the mapping elsewhere: undo it and report.
            // SAFETY: `got` is the mapping just created, of `len` bytes, and
            // nothing else refers to it.
            unsafe { libc::munmap(got, len as usize) };
            return Err(ArenaError::AddressTaken { addr, len });
        }
        let base = NonNull::new(got as *mut u8).expect("mmap returned a null mapping");
        advise_huge_pages(base, len, kind);
        Ok(Arena {
            base,
            len,
            kind,
            exposures: Arc::default(),
            pins: Arc::new(Pins::new(base.as_ptr(), len)),
            groups: 0,
        })
    }

    /// Maps `len` bytes at an address of its choosing and keeps the
    /// mapping; [`base_addr`](Arena::base_addr) is then the address to
    /// propose to the other nodes of the group.
    ///
    /// The address is drawn at random (1 GiB aligned) from [`QUIET_BAND`],
    /// a part of the address space that a process's own mappings do not
    /// reach, and only if that fails (a smaller address space) does the
    /// kernel choose. A kernel-chosen address lies where every process's
    /// libraries, thread stacks and `malloc` arenas go (the top of the
    /// address space, shifted at random per process), so a restarted node,
    /// a new process, could find it taken and never rejoin (seen once in
    /// the crash test: "already in use in this process").
    pub fn map_anywhere(len: u64, kind: ArenaKind) -> Result<Arena, ArenaError> {
        check_aligned(0, len)?;
        const GIB: u64 = 1 << 30;
        let (lo, hi) = QUIET_BAND;
        if len < hi - lo {
            let slots = (hi - lo - len) / GIB;
            let mut r = random_u64();
            for _ in 0..16 {
                let addr = lo + (r % slots.max(1)) * GIB;
                match Arena::map_at(addr, len, kind) {
                    Ok(a) => return Ok(a),
                    Err(ArenaError::AddressTaken { .. }) => {
                        r = r.rotate_left(17).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ addr;
                    }
                    // Outside this machine's address space: let the kernel
                    // choose.
                    Err(_) => break,
                }
            }
        }
        // SAFETY: a null hint without MAP_FIXED lets the kernel pick an unused
        // range; the result is checked before use.
        let got = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len as usize,
                libc::PROT_READ | libc::PROT_WRITE,
                flags(kind),
                -1,
                0,
            )
        };
        if got == libc::MAP_FAILED {
            return Err(ArenaError::Map {
                addr: 0,
                len,
                reason: errno_text(),
            });
        }
        let base = NonNull::new(got as *mut u8).expect("mmap returned a null mapping");
        advise_huge_pages(base, len, kind);
        Ok(Arena {
            base,
            len,
            kind,
            exposures: Arc::default(),
            pins: Arc::new(Pins::new(base.as_ptr(), len)),
            groups: 0,
        })
    }

    /// Virtual address of the first byte.
    pub fn base_addr(&self) -> u64 {
        self.base.as_ptr() as u64
    }

    /// The mapping kind.
    pub fn kind(&self) -> ArenaKind {
        self.kind
    }

    /// Raw pointer to the first byte, for memory registration with the RDMA
    /// engine. The engine may read and write through it concurrently with
    /// this arena's own copies (that is what the object checksums are for).
    pub fn as_ptr(&self) -> *mut u8 {
        self.base.as_ptr()
    }

    /// The sequence lock this arena's batches are written under
    /// ([`Memory::begin_together`]), for readers in this process.
    pub fn exposures(&self) -> Arc<Exposures> {
        self.exposures.clone()
    }

    /// Its writes' count and the ranges pinned for sending
    /// ([`pins`](self::pins)), for readers in this process.
    pub fn pins(&self) -> Arc<Pins> {
        self.pins.clone()
    }

    /// Whether `[addr, addr + len)` lies inside the arena.
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        addr >= self.base_addr()
            && addr
                .checked_add(len)
                .is_some_and(|end| end <= self.base_addr() + self.len)
    }
}

impl Memory for Arena {
    fn len(&self) -> u64 {
        self.len
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ArenaError> {
        check_range(offset, buf.len(), self.len)?;
        // SAFETY: the range was checked to lie inside the live mapping, and
        // `buf` is a distinct Rust allocation, so the regions don't overlap.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.base.as_ptr().add(offset as usize),
                buf.as_mut_ptr(),
                buf.len(),
            )
        };
        Ok(())
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), ArenaError> {
        check_range(offset, data.len(), self.len)?;
        // Counted (on its own, or in its group), and not over a range
        // being sent (`pins`).
        self.begin_group();
        self.pins.wait_unpinned(offset, data.len() as u64);
        // SAFETY: as in `read`, with the direction reversed; `&mut self`
        // excludes concurrent access from safe code, and no pin overlaps
        // the range (a `Pin`'s bytes are not written while it is held).
        unsafe {
            std::ptr::copy_nonoverlapping(
                data.as_ptr(),
                self.base.as_ptr().add(offset as usize),
                data.len(),
            )
        };
        self.end_group();
        Ok(())
    }

    fn begin_group(&mut self) {
        if self.groups == 0 {
            self.pins.begin_write();
        }
        self.groups += 1;
    }

    fn end_group(&mut self) {
        self.groups -= 1;
        if self.groups == 0 {
            self.pins.end_write();
        }
    }

    fn begin_together(&mut self) {
        self.exposures.begin();
    }

    fn end_together(&mut self) {
        self.exposures.end();
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // No pin is held from here on (each is held for one socket write).
        self.pins.close();
        // SAFETY: `base`/`len` describe exactly the mapping created in the
        // constructor, and no reference into it can outlive `self`.
        let rc =
            unsafe { libc::munmap(self.base.as_ptr() as *mut libc::c_void, self.len as usize) };
        debug_assert_eq!(rc, 0, "munmap failed: {}", errno_text());
    }
}

/// Heap-backed [`Memory`], used where several nodes share one process
/// (the simulation) and so cannot all map the same virtual address.
#[derive(Clone, PartialEq, Eq)]
pub struct HeapMemory {
    bytes: Vec<u8>,
}

impl fmt::Debug for HeapMemory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "HeapMemory({} bytes)", self.bytes.len())
    }
}

impl HeapMemory {
    /// `len` zero bytes.
    pub fn new(len: u64) -> HeapMemory {
        HeapMemory {
            bytes: vec![0; len as usize],
        }
    }

    /// Wraps existing bytes.
    pub fn from_bytes(bytes: Vec<u8>) -> HeapMemory {
        HeapMemory { bytes }
    }

    /// All bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }
}

impl Memory for HeapMemory {
    fn len(&self) -> u64 {
        self.bytes.len() as u64
    }

    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), ArenaError> {
        check_range(offset, buf.len(), self.len())?;
        let o = offset as usize;
        buf.copy_from_slice(&self.bytes[o..o + buf.len()]);
        Ok(())
    }

    fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), ArenaError> {
        check_range(offset, data.len(), self.len())?;
        let o = offset as usize;
        self.bytes[o..o + data.len()].copy_from_slice(data);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    #[test]
    fn map_at_chosen_address_and_refuse_second_mapping() {
        // Reserve a free range, release it, then map exactly there.
        let probe = Arena::map_anywhere(4 * MIB, ArenaKind::Private).unwrap();
        let addr = probe.base_addr();
        drop(probe);
        let mut a = match Arena::map_at(addr, 4 * MIB, ArenaKind::Private) {
            Ok(a) => a,
            // Another test thread may have taken the hole meanwhile; a
            // fixed high address is then used instead.
            Err(ArenaError::AddressTaken { .. }) => {
                Arena::map_at(0x3a00_0000_0000, 4 * MIB, ArenaKind::Private).unwrap()
            }
            Err(e) => panic!("{e}"),
        };
        let addr = a.base_addr();
        assert_eq!(a.len(), 4 * MIB);
        a.write(100, b"hello").unwrap();
        let mut buf = [0u8; 5];
        a.read(100, &mut buf).unwrap();
        assert_eq!(&buf, b"hello");

        let err = Arena::map_at(addr, 4 * MIB, ArenaKind::Private).unwrap_err();
        assert_eq!(err, ArenaError::AddressTaken { addr, len: 4 * MIB });
        let text = err.to_string();
        assert!(text.contains(&format!("{addr:#x}")), "{text}");
        assert!(text.contains("already in use"), "{text}");

        // A partial overlap is refused too, and the first mapping survives.
        let err = Arena::map_at(addr + 2 * MIB, 4 * MIB, ArenaKind::Shared).unwrap_err();
        assert!(matches!(err, ArenaError::AddressTaken { .. }));
        a.read(100, &mut buf).unwrap();
        assert_eq!(&buf, b"hello");
    }

    /// A proposed address lies in the quiet band (on a 47-bit or larger
    /// address space, which every x86-64 Linux has), and two proposals in
    /// one process do not collide.
    #[test]
    fn proposed_addresses_lie_in_the_quiet_band() {
        let a = Arena::map_anywhere(64 * MIB, ArenaKind::Private).unwrap();
        let b = Arena::map_anywhere(64 * MIB, ArenaKind::Private).unwrap();
        for x in [&a, &b] {
            let at = x.base_addr();
            if cfg!(target_arch = "x86_64") {
                assert!(
                    at >= QUIET_BAND.0 && at + x.len() <= QUIET_BAND.1,
                    "{at:#x} outside the quiet band"
                );
                assert_eq!(at % (1 << 30), 0, "{at:#x} not 1 GiB aligned");
            }
        }
        assert_ne!(a.base_addr(), b.base_addr());
    }

    #[test]
    fn fixed_address_is_honoured_and_released_on_drop() {
        let addr = 0x3b00_0000_0000;
        let a = Arena::map_at(addr, MIB, ArenaKind::Shared).unwrap();
        assert_eq!(a.base_addr(), addr);
        assert!(a.contains(addr, MIB));
        assert!(!a.contains(addr, MIB + 1));
        assert!(!a.contains(addr - 1, 1));
        drop(a);
        // After drop the range is free again.
        let b = Arena::map_at(addr, MIB, ArenaKind::Private).unwrap();
        assert_eq!(b.base_addr(), addr);
    }

    #[test]
    fn bounds_and_alignment_are_checked() {
        assert!(matches!(
            Arena::map_at(0x3c00_0000_0001, MIB, ArenaKind::Private),
            Err(ArenaError::Misaligned { .. })
        ));
        assert!(matches!(
            Arena::map_anywhere(100, ArenaKind::Private),
            Err(ArenaError::Misaligned { .. })
        ));
        let mut a = Arena::map_anywhere(PAGE_SIZE, ArenaKind::Private).unwrap();
        let mut buf = [0u8; 8];
        assert!(a.read(PAGE_SIZE - 8, &mut buf).is_ok());
        assert_eq!(
            a.read(PAGE_SIZE - 7, &mut buf),
            Err(ArenaError::OutOfBounds {
                offset: PAGE_SIZE - 7,
                len: 8,
                arena_len: PAGE_SIZE
            })
        );
        assert!(a.write(u64::MAX, b"x").is_err());
        let mut h = HeapMemory::new(16);
        assert!(h.write(15, b"ab").is_err());
        h.write(14, b"ab").unwrap();
        assert_eq!(&h.bytes()[14..], b"ab");
    }
}
