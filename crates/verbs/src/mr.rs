//! Memory regions and STags (the engine's counterpart of Linux siw's
//! `siw_mem.c`).
//!
//! An STag is `index << 8 | key`: a 24-bit index into the device's STag table
//! (index 0 is never used) and an 8-bit key chosen by the consumer. The
//! local key and the remote key of a region are the same STag.
//!
//! Memory lifetime: a registration is an `Arc<MrInner>`. The STag table holds
//! one reference, every work request in flight and every placement in
//! progress holds another, and the memory is freed only when the last one is
//! dropped. Deregistration removes the STag from the table (so no new access
//! can start), but memory the engine may still touch is never freed under it.
//! Memory registered with [`ProtectionDomain::register_raw`] is the caller's
//! and may be freed as soon as the [`MemoryRegion`] is dropped: such regions
//! are *fenced*. Every engine access to their memory (a placement, a copy
//! out, a send from it, an atomic) runs between [`MrInner::enter`] and
//! [`MrInner::exit`], and deregistration ([`MrInner::release_wait`]) refuses
//! new accesses and waits for those in progress, as a NIC's deregistration
//! does. Work requests that still name the memory then fail instead.
//!
//! All of the engine's reads and writes of registered memory go through the
//! `unsafe` helpers in this file.
//!
//! [`ProtectionDomain::register_raw`]: crate::ProtectionDomain::register_raw

use crate::error::{Error, Result};
use crate::stag::Stag;
use crate::sys::RawSpan;
use parking_lot::{Mutex, RwLock};
use softrdma_wire::terminate::codes;
use softrdma_wire::TermCode;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

mod access;
mod place;
mod stag_table;
pub use access::Access;
pub(crate) use place::{
    atomic_apply, copy_from_spans, copy_into_spans, copy_spans_into_spans, crc_spans,
};
pub(crate) use stag_table::StagTable;

/// What keeps a region's memory alive.
pub(crate) enum Backing {
    /// Allocated by the engine; freed on drop of the last reference.
    Owned(#[allow(dead_code)] AlignedBuf),
    /// A caller-owned vector moved into the registration (never changed
    /// there, so its buffer stays where it is; its spare capacity is kept
    /// for the caller who takes it back).
    Vec(#[allow(dead_code)] Vec<u8>),
    /// Caller-owned memory (unsafe registration).
    Raw,
    /// A fast-registered STag: keeps the regions it maps alive.
    Parents(#[allow(dead_code)] Vec<Arc<MrInner>>),
    /// Allocated by the engine from the device's shared chunks (`pool.rs`).
    Pool(#[allow(dead_code)] crate::pool::PoolAlloc),
    /// Caller-owned memory backed by a file (`RegOptions::shared`): our
    /// duplicate of its descriptor, which same-host peers open.
    Shared(#[allow(dead_code)] std::os::fd::OwnedFd),
    /// Caller-owned memory whose owner the registration keeps alive
    /// (`register_owned`), plus what the inner backing holds.
    Kept(
        #[allow(dead_code)] Box<Backing>,
        #[allow(dead_code)] Arc<dyn std::any::Any + Send + Sync>,
    ),
}

/// A zeroed, page-aligned heap allocation.
pub(crate) struct AlignedBuf {
    ptr: *mut u8,
    layout: std::alloc::Layout,
}

// SAFETY: AlignedBuf is a uniquely owned allocation; moving it between
// threads is fine, and shared access goes through raw-pointer copies.
unsafe impl Send for AlignedBuf {}
// SAFETY: as for Send: shared access only through raw-pointer copies.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    pub(crate) fn zeroed(len: usize) -> Result<AlignedBuf> {
        let layout = std::alloc::Layout::from_size_align(len.max(1), crate::sys::page_size())
            .map_err(|_| Error::inval("region too large"))?;
        // SAFETY: layout has non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        if ptr.is_null() {
            return Err(Error::Exhausted("memory"));
        }
        Ok(AlignedBuf { ptr, layout })
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: ptr was allocated with exactly this layout and is freed once.
        unsafe { std::alloc::dealloc(self.ptr, self.layout) }
    }
}

/// A registration: an immutable mapping from a virtual address range
/// (starting at `iova`) onto one or more pieces of memory.
pub(crate) struct MrInner {
    pub stag: u32,
    pub pd: u32,
    /// The rights it was registered with; see also `withdrawn`.
    pub access: Access,
    /// Rights taken away since (`MemoryRegion::restrict_access`): they
    /// only grow, so a check never sees a right come back.
    withdrawn: AtomicU32,
    pub iova: u64,
    pub len: u64,
    /// The memory, in order; lengths add up to `len`.
    pub spans: Vec<RawSpan>,
    pub valid: AtomicBool,
    /// Accesses are refused from this `sys::mono_ns` instant on
    /// ([`NO_DEADLINE`]: never); see `MemoryRegion::set_valid_until`.
    pub deadline: AtomicU64,
    /// Fast-register STags may be invalidated remotely or locally; plain
    /// registrations only when registered as such.
    pub invalidatable: bool,
    pub fast_reg: bool,
    /// The memory file holding the region, for same-host peers: our
    /// descriptor, its inode, the offset of byte 0.
    pub chunk: Option<(u32, u64, u64)>,
    /// For regions whose bytes are not in memory (`backend.rs`): no spans.
    pub backend: Option<std::sync::Arc<dyn crate::backend::RegionBackend>>,
    /// The pages pinned for this registration (`pin.rs`); dropped, and so
    /// unpinned, before `backing` frees the memory.
    #[allow(dead_code)]
    pins: Vec<crate::pin::PinGuard>,
    /// The memory is the caller's (`register_raw`, or a fast-register
    /// binding over such a region): deregistration must wait until no
    /// engine access to it is in progress (see [`MrInner::enter`]).
    pub fenced: bool,
    /// A binding whose own release waits for the accesses through it (a
    /// one-shot advertisement's: its cancel must not return while the
    /// engine places into the memory, whoever owns that memory). Implies
    /// `fenced`.
    pub gated: bool,
    /// Engine accesses to the memory in progress (fenced regions only).
    accessing: AtomicU32,
    /// Set by deregistration: no new access may start.
    released: AtomicBool,
    /// Words that must vouch for every access (`AccessGuard`; a
    /// fast-register region has its parents').
    pub guards: Vec<AccessGuard>,
    #[allow(dead_code)]
    backing: Backing,
}

impl MrInner {
    /// Whether the memory is a vector moved into the registration
    /// (`ProtectionDomain::register`).
    pub(crate) fn holds_vec(&self) -> bool {
        matches!(self.backing, Backing::Vec(_))
    }
    /// The vector moved into the registration, if it was one.
    pub(crate) fn take_vec(self) -> Option<Vec<u8>> {
        match self.backing {
            Backing::Vec(b) => Some(b),
            _ => None,
        }
    }
}

impl std::fmt::Debug for MrInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Mr")
            .field("stag", &format_args!("{:#010x}", self.stag))
            .field("pd", &self.pd)
            .field("iova", &format_args!("{:#x}", self.iova))
            .field("len", &self.len)
            .finish()
    }
}

/// A word of shared memory that vouches for a registration: every access
/// through the region, local or remote, on the TCP path and on the
/// same-host path, first checks `word & mask == expect` and is refused as
/// an invalid STag (the protection Terminate, RFC 5040 section 7: layer
/// RDMAP or DDP, "invalid STag") when it does not hold.
///
/// The registered-memory heap uses it for its blocks' generation ids: a
/// registration of a block that was released (and maybe reused by another
/// process) grants no access any more, although nobody told the process
/// that made it. The check runs once per DDP segment before it is placed
/// (and before a Read Response is built), as a NIC checks an STag.
#[derive(Debug, Clone, Copy)]
pub struct AccessGuard {
    /// Address, in this process, of an 8-byte aligned `AtomicU64`.
    pub word: usize,
    /// Bits of the word that are compared.
    pub mask: u64,
    /// The value the masked word must hold for access to be granted.
    pub expect: u64,
    /// The word's offset in the region's shared file ([`crate::RegOptions::shared`]),
    /// so that same-host peers check it too. Without it the region is not
    /// offered to same-host peers' direct copies (they go through the
    /// stream, where this end checks).
    pub file_off: Option<u64>,
}

impl AccessGuard {
    /// Whether the word holds the expected value.
    pub(crate) fn holds(&self) -> bool {
        // SAFETY: `register_raw`/`register_owned`'s contract (checked
        // there: non-null, 8-byte aligned): the word is a live AtomicU64
        // for as long as the registration, which holds the owner of the
        // memory, exists; shared access to an atomic is sound.
        let w = unsafe { &*(self.word as *const AtomicU64) };
        w.load(Ordering::Acquire) & self.mask == self.expect
    }
}

impl MrInner {
    /// Starts an engine access (a placement, a copy out, a send) to the
    /// region's memory; false if the region was deregistered, and then the
    /// access must not happen. Every `true` is paired with [`MrInner::exit`].
    /// Only fenced regions (caller-owned memory) count; for the others the
    /// registration reference keeps the memory alive anyway.
    ///
    /// With [`MrInner::release_wait`] this is the protocol that makes
    /// deregistering caller-owned memory safe, as a NIC's deregistration
    /// is: the access counts itself before it checks `released`, the
    /// deregistration sets `released` before it waits for the count to
    /// reach zero (both sequentially consistent), so either the access sees
    /// the region released, or the deregistration sees the access and
    /// waits for it. Accesses are single bounded copies or non-blocking
    /// socket calls, so the wait is short.
    #[inline]
    pub fn enter(&self) -> bool {
        if !self.fenced {
            return true;
        }
        let parents = match &self.backing {
            Backing::Parents(ps) => Some(ps),
            _ => None,
        };
        if parents.is_none() || self.gated {
            self.accessing.fetch_add(1, Ordering::SeqCst);
            if self.released.load(Ordering::SeqCst) {
                self.accessing.fetch_sub(1, Ordering::Release);
                return false;
            }
        }
        if let Some(ps) = parents {
            for (i, p) in ps.iter().enumerate() {
                if !p.enter() {
                    ps[..i].iter().for_each(|p| p.exit());
                    if self.gated {
                        self.accessing.fetch_sub(1, Ordering::Release);
                    }
                    return false;
                }
            }
        }
        true
    }

    /// Ends an access started by a successful [`MrInner::enter`].
    #[inline]
    pub fn exit(&self) {
        if !self.fenced {
            return;
        }
        if let Backing::Parents(ps) = &self.backing {
            ps.iter().for_each(|p| p.exit());
            if !self.gated {
                return;
            }
        }
        let before = self.accessing.fetch_sub(1, Ordering::Release);
        debug_assert!(before > 0, "exit without enter");
    }

    /// Deregistration of caller-owned memory (or the release of a gated
    /// binding): refuses new accesses and waits until none is in progress;
    /// afterwards the caller may free or reuse it.
    pub fn release_wait(&self) {
        if !self.fenced || (matches!(self.backing, Backing::Parents(_)) && !self.gated) {
            return;
        }
        self.released.store(true, Ordering::SeqCst);
        let mut spins = 0u32;
        while self.accessing.load(Ordering::SeqCst) != 0 {
            spins += 1;
            if spins < 100 {
                std::hint::spin_loop();
            } else {
                std::thread::yield_now();
            }
        }
    }
}

impl MrInner {
    /// Copies `out.len()` bytes at region offset `offset` out of the
    /// memory (the consumer's own `MemoryRegion::read_at`). Panics outside
    /// the region.
    pub fn copy_out(&self, offset: usize, out: &mut [u8]) {
        assert!(
            offset as u64 + out.len() as u64 <= self.len,
            "read outside the region"
        );
        let mut spans = Vec::new();
        self.resolve(self.iova + offset as u64, out.len() as u64, &mut spans);
        // SAFETY: the range is inside the region (asserted) and the caller
        // holds the registration, which keeps the memory alive.
        unsafe { copy_from_spans(&spans, 0, out) }
    }

    /// Copies `data` into the memory at region offset `offset` (the
    /// consumer's own `MemoryRegion::write_at`). Panics outside the region.
    pub fn copy_in(&self, offset: usize, data: &[u8]) {
        assert!(
            offset as u64 + data.len() as u64 <= self.len,
            "write outside the region"
        );
        let mut spans = Vec::new();
        self.resolve(self.iova + offset as u64, data.len() as u64, &mut spans);
        // SAFETY: as in copy_out.
        unsafe { copy_into_spans(&spans, 0, data) }
    }
}

/// Enters every region of `mrs` (see [`MrInner::enter`]); on failure none
/// stays entered.
pub(crate) fn enter_all(mrs: &[Arc<MrInner>]) -> bool {
    for (i, m) in mrs.iter().enumerate() {
        if !m.enter() {
            mrs[..i].iter().for_each(|m| m.exit());
            return false;
        }
    }
    true
}

/// Ends accesses started by a successful [`enter_all`].
pub(crate) fn exit_all(mrs: &[Arc<MrInner>]) {
    mrs.iter().for_each(|m| m.exit());
}

/// Why an access to a region was refused, as a Terminate code pair:
/// the code for tagged (DDP-level) and for RDMAP-level reporting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccessError {
    InvalidStag,
    WrongPd,
    Rights,
    Bounds,
    /// The tagged offset plus the length passes 2^64.
    ToWrap,
}

impl AccessError {
    /// The RDMAP Terminate code (RFC 5040 section 7) for this refusal.
    pub fn rdmap_code(self) -> TermCode {
        match self {
            AccessError::InvalidStag => codes::RDMAP_INVALID_STAG,
            AccessError::WrongPd => codes::RDMAP_STAG_NOT_ASSOC,
            AccessError::Rights => codes::RDMAP_ACCESS_RIGHTS,
            AccessError::Bounds => codes::RDMAP_BASE_BOUNDS,
            AccessError::ToWrap => codes::RDMAP_TO_WRAP,
        }
    }

    /// The DDP tagged-buffer Terminate code (RFC 5041 section 7).
    pub fn ddp_code(self) -> TermCode {
        match self {
            AccessError::InvalidStag => codes::DDP_TAGGED_INVALID_STAG,
            AccessError::WrongPd => codes::DDP_TAGGED_STAG_NOT_ASSOC,
            // RFC 5041 has no tagged-buffer code for missing rights; siw
            // answers with "invalid STag" (`siw_tagged_error`), and so do
            // we (issue 20, item 8).
            AccessError::Rights => codes::DDP_TAGGED_INVALID_STAG,
            AccessError::Bounds => codes::DDP_TAGGED_BASE_BOUNDS,
            AccessError::ToWrap => codes::DDP_TAGGED_TO_WRAP,
        }
    }
}

/// `MrInner::deadline` of a region without one.
pub(crate) const NO_DEADLINE: u64 = u64::MAX;

impl MrInner {
    /// The rights an access is checked against now.
    pub fn access_now(&self) -> Access {
        Access(self.access.0 & !self.withdrawn.load(Ordering::Acquire))
    }

    /// Whether the region's deadline has passed.
    pub fn expired(&self) -> bool {
        let d = self.deadline.load(Ordering::Acquire);
        d != NO_DEADLINE && crate::sys::mono_ns() >= d
    }

    /// Checks an access of `len` bytes at virtual address `to`, in the order
    /// siw uses: valid, protection domain, rights, bounds (a range whose
    /// end passes 2^64 is the "TO wrap" error of RFC 5040 Figure 9 and RFC
    /// 5041 section 7.2).
    pub fn check(&self, pd: u32, need: Access, to: u64, len: u64) -> Result<(), AccessError> {
        if !self.valid.load(Ordering::Acquire) || self.expired() {
            return Err(AccessError::InvalidStag);
        }
        if self.guards.iter().any(|g| !g.holds()) {
            return Err(AccessError::InvalidStag);
        }
        if self.pd != pd {
            return Err(AccessError::WrongPd);
        }
        if !self.access_now().contains(need) {
            return Err(AccessError::Rights);
        }
        let end = to.checked_add(len).ok_or(AccessError::ToWrap)?;
        // (Registration refuses regions whose end passes 2^64; checked
        // anyway, never wrapping.)
        if to < self.iova || self.iova.checked_add(self.len).is_none_or(|e| end > e) {
            return Err(AccessError::Bounds);
        }
        Ok(())
    }

    /// The pieces of memory behind `[to, to+len)`, appended to `out`. The
    /// range must have been checked.
    /// Reads one byte at `offset` with a volatile load after an acquire
    /// fence, for consumers that poll memory a peer writes with RDMA Write
    /// (perftest-style latency tests). Panics outside the region.
    pub fn peek_u8(&self, mut offset: usize) -> u8 {
        assert!((offset as u64) < self.len, "peek outside the region");
        assert!(self.backend.is_none(), "peek into a backed region");
        for s in &self.spans {
            if offset < s.len {
                std::sync::atomic::fence(Ordering::Acquire);
                // SAFETY: offset < s.len, so the byte lies inside a span of
                // this live registration (we hold a reference to it); a
                // concurrent placement may write it, which a byte-sized
                // volatile load tolerates (it sees the old or the new value).
                return unsafe { std::ptr::read_volatile(s.ptr.add(offset)) };
            }
            offset -= s.len;
        }
        unreachable!("spans add up to len")
    }

    pub fn resolve(&self, to: u64, len: u64, out: &mut Vec<RawSpan>) {
        debug_assert!(to >= self.iova && to + len <= self.iova + self.len);
        let mut off = (to - self.iova) as usize;
        let mut left = len as usize;
        for s in &self.spans {
            if left == 0 {
                break;
            }
            if off >= s.len {
                off -= s.len;
                continue;
            }
            let n = (s.len - off).min(left);
            out.push(RawSpan {
                // SAFETY: off < s.len, so the pointer stays inside the span.
                ptr: unsafe { s.ptr.add(off) },
                len: n,
            });
            left -= n;
            off = 0;
        }
        debug_assert_eq!(left, 0);
    }
}

impl MrInner {
    /// The target of an atomic operation at `to` (already checked for
    /// rights and bounds): the 8 bytes must be naturally aligned, both as a
    /// tagged offset and in memory, and lie in one span. `None` otherwise.
    pub fn atomic_target(&self, to: u64) -> Option<RawSpan> {
        if !to.is_multiple_of(8) || self.backend.is_some() {
            return None;
        }
        let mut v = Vec::with_capacity(2);
        self.resolve(to, 8, &mut v);
        match v.as_slice() {
            [s] if s.len == 8 && (s.ptr as usize).is_multiple_of(8) => Some(*s),
            _ => None,
        }
    }
}

pub(crate) struct NewMr {
    pub pd: u32,
    pub access: Access,
    pub iova: u64,
    pub spans: Vec<RawSpan>,
    pub backing: Backing,
    pub invalidatable: bool,
    pub fast_reg: bool,
    pub chunk: Option<(u32, u64, u64)>,
    /// A backed region (`backend.rs`) and its length.
    pub backend: Option<(Arc<dyn crate::backend::RegionBackend>, u64)>,
    /// Pins taken for the spans (see `pin.rs`).
    pub pins: Vec<crate::pin::PinGuard>,
    pub guards: Vec<AccessGuard>,
}

impl NewMr {
    pub fn build(self, stag: u32) -> MrInner {
        let (backend, len) = match self.backend {
            Some((b, len)) => (Some(b), len),
            None => (None, self.spans.iter().map(|s| s.len as u64).sum()),
        };
        MrInner {
            stag,
            pd: self.pd,
            access: self.access,
            iova: self.iova,
            len,
            spans: self.spans,
            fenced: match &self.backing {
                Backing::Raw | Backing::Shared(_) => true,
                Backing::Parents(ps) => ps.iter().any(|p| p.fenced),
                _ => false,
            },
            gated: false,
            withdrawn: AtomicU32::new(0),
            accessing: AtomicU32::new(0),
            released: AtomicBool::new(false),
            valid: AtomicBool::new(true),
            deadline: AtomicU64::new(NO_DEADLINE),
            invalidatable: self.invalidatable,
            fast_reg: self.fast_reg,
            chunk: self.chunk,
            backend,
            pins: self.pins,
            guards: self.guards,
            backing: self.backing,
        }
    }
}

impl MrInner {
    /// An unregistered holder of `bytes` at virtual address `iova` (the
    /// source of a Read Response from a backed region): it keeps the bytes
    /// alive while the transmitter sends them.
    pub fn holding(mut bytes: Box<[u8]>, iova: u64) -> MrInner {
        let spans = vec![RawSpan {
            ptr: bytes.as_mut_ptr(),
            len: bytes.len(),
        }];
        NewMr {
            pd: 0,
            access: Access::LOCAL_READ,
            iova,
            spans,
            backing: Backing::Vec(bytes.into_vec()),
            invalidatable: false,
            fast_reg: false,
            chunk: None,
            backend: None,
            pins: Vec::new(),
            guards: Vec::new(),
        }
        .build(0)
    }
}

impl AlignedBuf {
    pub(crate) fn ptr_raw(&self) -> *mut u8 {
        self.ptr
    }
}
