//! The arena's registration for remote reads: the one `unsafe` of the node
//! runtime (`lib.rs` allows it in this module alone).
//!
//! The arena is registered under the group's STag at its own virtual
//! address, so a client's one-sided RDMA Read of a
//! [`RemotePtr`](crate::ptr::RemotePtr) works on either node. It is made
//! again under a new STag when the group rotates it (credentials narrowed:
//! issue 29). The arena itself is never unmapped while the process runs:
//! the engine may be reading it.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, RwLock};

use softrdma_verbs::{Access, MemoryRegion, ProtectionDomain, RegOptions};

use crate::arena::{Arena, Exposures, Pins};
use crate::ptr::ArenaRef;

/// The arena's registration for remote reads (see the module's doc).
pub(crate) struct ArenaReg {
    mr: RwLock<Option<MemoryRegion>>,
    /// The arena's first byte in this process.
    ptr: usize,
    len: usize,
    base: u64,
    stag: AtomicU32,
    /// The arena's batches' sequence lock (read by the RESP door).
    pub(crate) exposures: Arc<Exposures>,
    /// The arena's writes' count and pinned ranges (the RESP door sends
    /// large values from the arena: `arena::pins`).
    pub(crate) pins: Arc<Pins>,
}

impl ArenaReg {
    /// The arena's handle, not registered yet ([`ArenaReg::register`]
    /// makes it reachable): a node back from its log registers after its
    /// load, when every page is present, so pinning costs no page
    /// zeroing (1 GiB: 0.5-1.7 s before the load, beside the peer's).
    pub(crate) fn unregistered(arena: &Arena, aref: ArenaRef) -> ArenaReg {
        ArenaReg {
            mr: RwLock::new(None),
            ptr: arena.as_ptr() as usize,
            len: aref.len as usize,
            base: aref.base,
            stag: AtomicU32::new(aref.stag),
            exposures: arena.exposures(),
            pins: arena.pins(),
        }
    }

    /// Registers the arena (again) under `stag`, invalid until the node
    /// loop makes it valid; the old registration grants nothing from then
    /// on.
    pub(crate) fn register(&self, pd: &ProtectionDomain, stag: u32) -> Result<(), String> {
        let mut slot = self.mr.write().unwrap_or_else(|e| e.into_inner());
        // The old registration goes first (its index is the new one's);
        // dropping it waits until the engine no longer reads through it.
        drop(slot.take());
        // SAFETY: `ptr..ptr + len` is the arena, mapped for reads and
        // writes by `Arena` and never unmapped while the process runs (it
        // lives in the Node that `serve` never returns from); the
        // registration only allows remote reads.
        let mr = unsafe {
            pd.register_raw(
                self.ptr as *mut u8,
                self.len,
                Access::LOCAL_WRITE | Access::REMOTE_READ,
                RegOptions {
                    stag: Some(stag),
                    iova: Some(self.base),
                    ..Default::default()
                },
            )
        }
        .map_err(|e| format!("cannot register the arena under {stag:#010x}: {e}"))?;
        // Valid only while the node serves reads (the node loop switches it).
        mr.set_valid(false);
        *slot = Some(mr);
        self.stag.store(stag, Ordering::Release);
        Ok(())
    }

    /// Runs `f` on the registration (`None` while it is being made again).
    pub(crate) fn with<R>(&self, f: impl FnOnce(&MemoryRegion) -> R) -> Option<R> {
        self.mr
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(f)
    }

    /// The arena under its current STag.
    pub(crate) fn arena(&self) -> ArenaRef {
        ArenaRef {
            base: self.base,
            len: self.len as u64,
            stag: self.stag.load(Ordering::Acquire),
        }
    }

    /// Whether the registration serves one-sided reads now (valid, and
    /// its deadline not passed).
    pub(crate) fn accessible(&self) -> bool {
        self.with(|mr| mr.is_accessible()).unwrap_or(false)
    }

    /// Copies arena bytes at `offset` into `out` whatever the
    /// registration's state: what it proves is for [`Self::accessible`],
    /// asked before and after (once for a whole set of copies, as the
    /// door's look-ups do: one clock read each instead of two per copy);
    /// `false` outside the arena or while the registration is being made
    /// again.
    pub(crate) fn copy(&self, offset: u64, out: &mut [u8]) -> bool {
        if offset.saturating_add(out.len() as u64) > self.len as u64 {
            return false;
        }
        self.with(|mr| mr.read_at(offset as usize, out)).is_some()
    }
}
