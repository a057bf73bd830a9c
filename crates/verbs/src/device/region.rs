//! Handles of registered memory: the options a registration takes,
//! [`MemoryRegion`] (deregistered on drop) and [`FastRegMr`], and the
//! registration a fast-register work request installs.

use super::*;

/// Options for registering memory.
#[derive(Debug, Clone, Copy, Default)]
pub struct RegOptions {
    /// The key byte of the STag (default 0).
    pub key: Option<u8>,
    /// A full STag chosen by the caller (index and key); fails if the index
    /// is in use. Two nodes can so share one key.
    pub stag: Option<u32>,
    /// The virtual address the region starts at (default: its address in
    /// this process).
    pub iova: Option<u64>,
    /// Allow Local Invalidate and remote invalidation of this region.
    pub invalidatable: bool,
    /// `register_raw` only: the memory is a mapping of this file (a memfd,
    /// say) at this offset. Same-host peers then map the file and copy with
    /// plain memory moves; the engine keeps its own duplicate of the
    /// descriptor while registered.
    pub shared: Option<(std::os::fd::RawFd, u64)>,
    /// `register_raw` / `register_owned` only: a word that must hold a
    /// given value for any access through the region to be allowed (see
    /// [`crate::AccessGuard`]).
    pub guard: Option<crate::mr::AccessGuard>,
    /// Do not pin the pages, whatever the process's pinning policy (a
    /// caller that met `RLIMIT_MEMLOCK` and degrades, as the libibverbs
    /// drop-in does: user-space memory needs no pinning to be read and
    /// written by the engine).
    pub unpinned: bool,
}

impl RegOptions {
    /// Reserves the STag index these options ask for (or a free one) in
    /// `core`'s table for PD `pd`; returns it with the key.
    pub(super) fn reserve(&self, core: &Core, pd: u32) -> Result<(u32, u8)> {
        let (want, key) = match self.stag.map(Stag::from_raw) {
            Some(st) => (Some(st.index()), st.key()),
            None => (None, self.key.unwrap_or(0)),
        };
        Ok((core.stags.reserve(want, pd)?, key))
    }
}

/// A registered memory region. Dropping it deregisters (invalidates) the
/// STag; owned memory is freed once no work request uses it any more.
pub struct MemoryRegion {
    pub(super) dev: Device,
    pub(crate) inner: Arc<MrInner>,
    pub(super) index: u32,
}

impl std::fmt::Debug for MemoryRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.inner.fmt(f)
    }
}

impl MemoryRegion {
    /// The STag (local key).
    pub fn lkey(&self) -> crate::Lkey {
        crate::Lkey::from_raw(self.inner.stag)
    }
    /// The STag (remote key); the same value as the local key.
    pub fn rkey(&self) -> crate::Rkey {
        crate::Rkey::from_raw(self.inner.stag)
    }
    /// The virtual address the region starts at.
    pub fn addr(&self) -> u64 {
        self.inner.iova
    }
    /// Length of the region in bytes.
    pub fn len(&self) -> usize {
        self.inner.len as usize
    }
    /// Whether the region has no bytes.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }
    /// The rights accesses are checked against now (those it was
    /// registered with, less any [`Self::restrict_access`] took away).
    pub fn access(&self) -> Access {
        self.inner.access_now()
    }
    /// Whether the STag is still valid (not invalidated).
    pub fn is_valid(&self) -> bool {
        self.inner.valid.load(Ordering::Acquire)
    }
    /// Whether an access through the STag would pass now: valid and its
    /// deadline ([`Self::set_valid_until`]) not reached. A reader in this
    /// process that must obey the deadline as a remote peer does checks it
    /// before and after its copy, as a same-host peer does.
    pub fn is_accessible(&self) -> bool {
        self.is_valid() && !self.inner.expired()
    }
    /// Invalidates the STag (`false`) or makes it valid again (`true`),
    /// keeping its index reserved: while invalid, no access passes, local
    /// or remote (a peer's Read or Write gets the "invalid STag"
    /// Terminate). Like a Local Invalidate followed by registering again
    /// under the same STag, without giving the index back in between (a
    /// released index may be handed to the next registration). Transfers
    /// already being placed finish.
    pub fn set_valid(&self, valid: bool) {
        self.dev.rt.core.stags.set_valid(&self.inner, valid);
    }
    /// Narrows the region's rights to those in `keep`, in place and for
    /// good, keeping its STag (as `ibv_rereg_mr` with
    /// `IBV_REREG_MR_CHANGE_ACCESS` would, without a new key): every access
    /// checked after this returns needs a right that is left, or is refused
    /// like any access without the right (a peer's Write or Read gets the
    /// protection Terminate: RDMAP "access rights", DDP "invalid STag").
    /// Rights never come back (a later call can only take more away);
    /// transfers already being placed finish. What a storage target does
    /// when a principal's right is revoked while it is connected.
    pub fn restrict_access(&self, keep: Access) {
        self.dev.rt.core.stags.restrict(&self.inner, keep);
    }

    /// Bounds the STag's validity in time: from `deadline` on (and until
    /// another call moves it) every access through the STag is refused as
    /// if it were invalid, local or remote, over TCP or by a same-host
    /// peer, without any thread of this process having to act at that
    /// moment (a process that is stopped, descheduled or busy cannot extend
    /// it). `None` removes the deadline. For a remote Read the check is
    /// made when the Read starts; a same-host peer also re-checks after
    /// its copy. This is what a lease-holder needs: the HA store's primary
    /// lets clients read its arena only while its lease runs.
    pub fn set_valid_until(&self, deadline: Option<std::time::Instant>) {
        let d = deadline.map_or(crate::mr::NO_DEADLINE, crate::sys::instant_ns);
        self.dev.rt.core.stags.set_deadline(&self.inner, d);
    }

    /// An SGE covering `len` bytes at `offset`.
    pub fn sge(&self, offset: usize, len: usize) -> crate::Sge {
        assert!(offset + len <= self.len(), "SGE outside the region");
        crate::Sge {
            addr: self.inner.iova + offset as u64,
            length: len as u32,
            lkey: crate::Lkey::from_raw(self.inner.stag),
        }
    }
    /// An SGE covering the whole region.
    pub fn sge_all(&self) -> crate::Sge {
        self.sge(0, self.len())
    }
    /// Copies bytes out of the region.
    /// Panics outside the region, or if a backed region's backend fails.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) {
        assert!(offset + out.len() <= self.len(), "read outside the region");
        if let Some(b) = &self.inner.backend {
            return b
                .read_at(offset as u64, out)
                .expect("backed region read failed");
        }
        self.inner.copy_out(offset, out)
    }
    /// Reads the byte at `offset` with a volatile load (for polling memory
    /// that a peer's RDMA Write fills, as perftest's latency tests do).
    pub fn peek_u8(&self, offset: usize) -> u8 {
        self.inner.peek_u8(offset)
    }
    /// Copies bytes into the region.
    pub fn write_at(&self, offset: usize, data: &[u8]) {
        assert!(
            offset + data.len() <= self.len(),
            "write outside the region"
        );
        if let Some(b) = &self.inner.backend {
            return b
                .write_at(offset as u64, data)
                .expect("backed region write failed");
        }
        self.inner.copy_in(offset, data)
    }
    /// Copies the whole region into a vector.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0; self.len()];
        self.read_at(0, &mut v);
        v
    }
    /// Deregisters the region (as a drop does) and returns its bytes: the
    /// vector it was registered with ([`ProtectionDomain::register`]),
    /// without a copy, when the engine holds no other reference to it (no
    /// transfer through it is still being placed); otherwise a copy, taken
    /// before the deregistration for memory the region does not own.
    /// A receiver that pulled a large message into a fresh buffer keeps
    /// it this way instead of copying it out.
    ///
    /// [`ProtectionDomain::register`]: crate::ProtectionDomain::register
    pub fn into_vec(self) -> Vec<u8> {
        if !self.inner.holds_vec() {
            return self.to_vec();
        }
        let mut inner = self.inner.clone();
        drop(self);
        // The engine's own holds on a region whose transfers completed
        // (a retired work request's, a receiver's between segments) end
        // within moments of the completion; wait that long for them on a
        // busy machine before copying instead.
        let deadline = std::time::Instant::now() + std::time::Duration::from_millis(20);
        loop {
            match Arc::try_unwrap(inner) {
                Ok(mr) => return mr.take_vec().expect("a vector registration"),
                Err(held) if std::time::Instant::now() < deadline => {
                    inner = held;
                    std::thread::yield_now();
                }
                Err(held) => {
                    let mut v = vec![0; held.len as usize];
                    held.copy_out(0, &mut v);
                    return v;
                }
            }
        }
    }
    /// Deregisters the region (as a drop does) and returns the vector it
    /// was registered with if nothing else holds it now: `None` (the
    /// memory freed when the engine's last hold ends) for memory the
    /// region does not own, or while a transfer through it is still being
    /// placed or sent. Unlike [`MemoryRegion::into_vec`] it never waits or
    /// copies: for a sender that would keep the buffer for reuse.
    pub fn try_into_vec(self) -> Option<Vec<u8>> {
        if !self.inner.holds_vec() {
            return None;
        }
        let inner = self.inner.clone();
        drop(self);
        let mr = Arc::try_unwrap(inner).ok()?;
        Some(mr.take_vec().expect("a vector registration"))
    }
    /// The address of the first byte in this process (for single-span
    /// regions; null for a backed one).
    pub fn as_ptr(&self) -> *mut u8 {
        self.inner
            .spans
            .first()
            .map_or(std::ptr::null_mut(), |s| s.ptr)
    }
}

impl Drop for MemoryRegion {
    fn drop(&mut self) {
        self.dev.rt.core.stags.release(self.index);
    }
}

/// A fast-register region (see [`ProtectionDomain::alloc_fast_reg_mr`]).
pub struct FastRegMr {
    pub(super) dev: Device,
    pub(super) pd: u32,
    pub(super) index: u32,
}

impl FastRegMr {
    /// The STag with key `key`, as it becomes valid after a fast-register.
    pub fn stag_with_key(&self, key: u8) -> Stag {
        Stag::new(self.index, key)
    }
    /// The region's STag index (24 bits); the key byte is chosen at each fast-register.
    pub fn index(&self) -> u32 {
        self.index
    }
    /// The number of the protection domain the region belongs to.
    pub fn pd(&self) -> u32 {
        self.pd
    }
    /// The STag currently bound, if valid.
    pub fn current_stag(&self) -> Option<Stag> {
        let core = &self.dev.rt.core;
        core.stags
            .all()
            .into_iter()
            .find(|m| {
                Stag::from_raw(m.stag).index() == self.index && m.valid.load(Ordering::Acquire)
            })
            .map(|m| Stag::from_raw(m.stag))
    }
}

impl Drop for FastRegMr {
    fn drop(&mut self) {
        self.dev.rt.core.stags.release(self.index);
    }
}
