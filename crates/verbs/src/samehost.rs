//! The same-host transport (`docs/same-host.md`): two softrdma ends on one
//! host that agreed to `ext::SAME_HOST` reach each other's registered
//! memory directly for RDMA Write and Read, checked against the owner's
//! published STag table ([`crate::shm`]); everything else (Sends,
//! atomics, Terminate, and any access the fast path does not take) stays
//! on the connection's TCP stream, whose engine refuses bad accesses with
//! the RFC's Terminate as before.
//!
//! Ordering: RDMA executes a QP's operations in order at the responder. A
//! direct copy runs at once, so it is taken only when the responder has
//! processed every message this end sent before ([`crate::shm::Slot::done`]
//! equals the messages sent); otherwise the Write or Read goes on the TCP
//! stream behind them.

use crate::mr::{Access, MrInner};
use crate::shm::{LocalShm, PeerShm, RingReader, RingWriter};
use crate::sys::{self, RawSpan};
use softrdma_wire::mpa::ext::SameHost;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

/// `SOFTRDMA_SAME_HOST=0` in the environment turns the same-host transport
/// off by default (see [`crate::DeviceConfig::same_host`]).
pub fn same_host_default() -> bool {
    std::env::var("SOFTRDMA_SAME_HOST").map_or(true, |v| v.trim() != "0")
}

/// A device's peer segments mapped here, by (pid, nonce), each mapped
/// once while some connection uses it.
pub(crate) type PeerMap =
    parking_lot::Mutex<std::collections::HashMap<(u32, u64), std::sync::Weak<PeerShm>>>;

/// Our side of a same-host connection.
pub(crate) struct Link {
    /// The slot of our segment through which the peer reaches our memory.
    local: Option<(Arc<LocalShm>, u32)>,
    /// Our fast path into the peer's memory.
    remote: Option<Remote>,
    /// The peer's FPDU stream to us, when it writes into our ring.
    pub ring_rx: Option<RingReader>,
    /// Our FPDU stream to the peer, through its ring (active from the
    /// start: nothing of ours goes on the TCP stream but doorbells).
    pub ring_tx: Option<RingWriter>,
    /// Bytes we wrote into the peer's ring.
    ring_bytes: AtomicU64,
    /// Times we found the peer's ring full and waited for room.
    ring_waits: AtomicU64,
}

struct Remote {
    peer: Arc<PeerShm>,
    slot: u32,
    gen: u32,
    /// The protection domain of the peer's QP.
    pd: u32,
    /// The peer is this process: copy with plain memory moves.
    same_process: bool,
    /// Set when the kernel refuses cross-process copies (EPERM).
    disabled: AtomicBool,
    ops: AtomicU64,
    mapped: AtomicU64,
    fallbacks: AtomicU64,
}

/// What a QP's same-host path did, for `softrdma info` and tests.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SameHostStats {
    /// Writes and Reads copied directly.
    pub direct_ops: u64,
    /// Of those, the ones copied through a mapping of the peer's memory
    /// (its `alloc_mr` chunks or `RegOptions::shared` files), the rest
    /// with `process_vm_readv`/`writev` (or plain moves within a process).
    pub mapped_ops: u64,
    /// Bytes of this end's FPDU stream written into the peer's ring
    /// (Sends, atomics, anything not copied directly) instead of TCP.
    pub ring_bytes: u64,
    /// Times the peer's ring was full and the transmitter waited for the
    /// peer to make room.
    pub ring_waits: u64,
    /// Writes and Reads that went on the TCP stream instead.
    pub tcp_fallbacks: u64,
}

/// The slot and record this end offers to a peer. Dropped without
/// [`Link::establish`] taking it (a rejected or failed connection), the slot
/// goes back.
pub(crate) struct Offer {
    shm: Arc<LocalShm>,
    pub slot: u32,
    pub record: SameHost,
    kept: bool,
}

impl Drop for Offer {
    fn drop(&mut self) {
        if !self.kept {
            self.shm.free_slot(self.slot);
        }
    }
}

impl Offer {
    /// An offer from our device's segment `shm` (none: no same-host path).
    pub fn new(shm: &Option<Arc<LocalShm>>, pd: u32) -> Option<Offer> {
        let shm = shm.clone()?;
        let (slot, _gen) = shm.alloc_slot(0)?;
        let record = SameHost {
            boot_id: shm.boot_id,
            pid_ns: shm.pid_ns,
            net_ns: shm.net_ns,
            pid: shm.pid,
            seg_fd: shm.fd(),
            nonce: shm.nonce,
            pd,
            slot,
        };
        Some(Offer {
            shm,
            slot,
            record,
            kept: false,
        })
    }
}

impl Link {
    /// Our offer `offer` and the peer's record `peer` (if it sent one).
    /// Without a record there is no link; if the peer's segment cannot be
    /// reached, the peer may still reach ours.
    /// `peers`: the device's mapped peer segments.
    pub fn establish(peers: &PeerMap, mut offer: Offer, peer: Option<&SameHost>) -> Option<Link> {
        let r = peer?;
        // One kernel, one pid namespace (pids are meaningful), and one
        // network namespace (a host, as far as networking goes).
        if r.boot_id != offer.record.boot_id
            || r.pid_ns != offer.record.pid_ns
            || r.net_ns != offer.record.net_ns
        {
            return None;
        }
        offer.shm.slot(offer.slot).set_peer(r.pid);
        let remote = match peer_segment(peers, r) {
            Ok(p) => {
                let gen = p.slot(r.slot).generation();
                Some(Remote {
                    same_process: r.pid == offer.record.pid,
                    peer: p,
                    slot: r.slot,
                    gen,
                    pd: r.pd,
                    disabled: AtomicBool::new(false),
                    ops: AtomicU64::new(0),
                    mapped: AtomicU64::new(0),
                    fallbacks: AtomicU64::new(0),
                })
            }
            Err(e) => {
                tracing::info!(pid = r.pid, error = %e, "peer's same-host segment unreachable; Writes and Reads use TCP");
                None
            }
        };
        offer.kept = true;
        // Our messages travel in the peer's ring for this connection;
        // activated before anything is sent, so the peer never looks for
        // them on the TCP stream.
        let ring_tx = remote.as_ref().map(|rm| {
            let w = RingWriter::new(rm.peer.clone(), rm.slot);
            w.activate();
            w
        });
        Some(Link {
            ring_rx: Some(RingReader::new(offer.shm.clone(), offer.slot)),
            local: Some((offer.shm.clone(), offer.slot)),
            remote,
            ring_tx,
            ring_bytes: AtomicU64::new(0),
            ring_waits: AtomicU64::new(0),
        })
    }

    /// Whether this end copies directly into the peer.
    pub fn direct(&self) -> bool {
        self.remote.is_some()
    }

    /// Counts `n` bytes written into the peer's ring.
    pub fn note_ring(&self, n: usize) {
        self.ring_bytes.fetch_add(n as u64, Ordering::Relaxed);
    }

    /// Counts a wait for room in the peer's ring.
    pub fn note_ring_wait(&self) {
        self.ring_waits.fetch_add(1, Ordering::Relaxed);
    }

    pub fn stats(&self) -> SameHostStats {
        let ring_bytes = self.ring_bytes.load(Ordering::Relaxed);
        let ring_waits = self.ring_waits.load(Ordering::Relaxed);
        self.remote
            .as_ref()
            .map_or_else(SameHostStats::default, |r| SameHostStats {
                ring_bytes,
                ring_waits,
                direct_ops: r.ops.load(Ordering::Relaxed),
                mapped_ops: r.mapped.load(Ordering::Relaxed),
                tcp_fallbacks: r.fallbacks.load(Ordering::Relaxed),
            })
    }

    /// One more of the peer's messages processed (call after its effects).
    pub fn message_done(&self) {
        if let Some((shm, slot)) = &self.local {
            shm.slot(*slot).done.fetch_add(1, Ordering::Release);
        }
    }

    /// RDMA Write of `len` bytes from `src` to the peer's `rkey`/`to`, if
    /// the fast path may take it now (`sent`: messages this end has put on
    /// the TCP stream). False: send it on the stream.
    pub fn try_write(
        &self,
        sent: u64,
        src: &[RawSpan],
        keep: &[Arc<MrInner>],
        len: u64,
        rkey: u32,
        to: u64,
    ) -> bool {
        self.copy(sent, src, keep, len, rkey, to, true)
    }

    /// RDMA Read of `len` bytes at the peer's `rkey`/`to` into `dst`.
    pub fn try_read(
        &self,
        sent: u64,
        dst: &[RawSpan],
        keep: &[Arc<MrInner>],
        len: u64,
        rkey: u32,
        to: u64,
    ) -> bool {
        self.copy(sent, dst, keep, len, rkey, to, false)
    }

    /// `keep`: the registrations of the local spans; caller-owned ones are
    /// entered for the copy (`MrInner::enter`), and if one was deregistered
    /// the access takes the stream (where it fails).
    #[allow(clippy::too_many_arguments)]
    fn copy(
        &self,
        sent: u64,
        local: &[RawSpan],
        keep: &[Arc<MrInner>],
        len: u64,
        rkey: u32,
        to: u64,
        write: bool,
    ) -> bool {
        let Some(r) = &self.remote else { return false };
        let fence: Vec<Arc<MrInner>> = keep.iter().filter(|m| m.fenced).cloned().collect();
        if !crate::mr::enter_all(&fence) {
            return false;
        }
        let done = r.try_copy(sent, local, len, rkey, to, write);
        crate::mr::exit_all(&fence);
        if done { &r.ops } else { &r.fallbacks }.fetch_add(1, Ordering::Relaxed);
        done
    }

    /// The QP stopped (call with its send queue locked, so no copy is in
    /// progress): the peer starts no more accesses to us, and we release
    /// our slot in its segment.
    pub fn shutdown(&self) {
        if let Some((shm, slot)) = &self.local {
            shm.close_slot(*slot);
        }
        if let Some(r) = &self.remote {
            r.peer.release(r.slot, r.gen);
        }
    }
}

impl Remote {
    fn try_copy(
        &self,
        sent: u64,
        local: &[RawSpan],
        len: u64,
        rkey: u32,
        to: u64,
        write: bool,
    ) -> bool {
        if self.disabled.load(Ordering::Relaxed) || local.len() > 1024 {
            return false;
        }
        if !self.peer.caught_up(self.slot, sent) {
            return false;
        }
        let need = if write {
            Access::REMOTE_WRITE
        } else {
            Access::REMOTE_READ
        };
        let Some(f) = self.peer.lookup(rkey, self.pd, need.0, to, len) else {
            return false;
        };
        if !self.peer.begin(self.slot, self.gen, &f) {
            return false;
        }
        let mapped = f
            .chunk
            .and_then(|(fd, ino, off)| Some((self.peer.chunk(fd, ino).ok()?, off)))
            .filter(|(m, off)| {
                off.checked_add(len)
                    .is_some_and(|end| end <= m.len() as u64)
            });
        // An access guard (a heap block's generation, say) is checked in
        // the chunk after begin(); a guard that does not hold (or cannot be
        // read) sends the access to the stream, where the owner refuses it
        // with the protection Terminate.
        if let Some((goff, mask, expect)) = f.guard {
            let holds = f
                .chunk
                .and_then(|(fd, ino, _)| self.peer.chunk(fd, ino).ok())
                .is_some_and(|m| crate::shm::guard_holds(&m, goff, mask, expect));
            if !holds {
                self.peer.end(self.slot);
                return false;
            }
        }
        let ok = if len == 0 {
            true
        } else if let Some((map, off)) = mapped {
            // SAFETY: the chunk is mapped here (`map` keeps the mapping
            // alive) and [off, off + len) lies inside it (checked above);
            // between begin() and end() the owner does not free or reuse
            // that range (shm.rs protocol). The local spans belong to the
            // WR's registrations, held by the caller, and add up to `len`.
            // They never overlap the peer's range (different registrations,
            // or the peer's own placement into its buffer, which RDMA
            // leaves undefined).
            unsafe { copy_local(local, map.ptr().add(off as usize) as u64, write) };
            self.mapped.fetch_add(1, Ordering::Relaxed);
            true
        } else if self.same_process {
            // SAFETY: between begin() and end() the owner (a device of
            // this process) does not free or reuse the checked range
            // [f.addr, f.addr + len) (shm.rs protocol); the local spans
            // belong to the WR's registrations, held by the caller, and
            // add up to `len` bytes. The two never overlap: they are
            // different registrations' memory, or the peer's placement
            // into its own buffer, which RDMA leaves undefined.
            unsafe { copy_local(local, f.addr, write) };
            true
        } else {
            // SAFETY: the local spans are live registered memory of the
            // WR (caller's contract); the remote range is checked by the
            // kernel and kept alive by the protocol.
            let res = unsafe {
                if write {
                    sys::vm_write(self.peer.pid, local, f.addr, len as usize)
                } else {
                    sys::vm_read(self.peer.pid, local, f.addr, len as usize)
                }
            };
            match res {
                Ok(n) => n as u64 == len,
                Err(e) => {
                    if e.raw_os_error() == Some(libc::EPERM) {
                        tracing::info!(
                            pid = self.peer.pid,
                            "process_vm refused (EPERM): same-host copies off"
                        );
                        self.disabled.store(true, Ordering::Relaxed);
                    }
                    false
                }
            }
        };
        self.peer.end(self.slot);
        // A read that ended after the region's deadline may have copied
        // bytes the owner no longer vouches for (a lease-bound region: see
        // `MemoryRegion::set_valid_until`): the TCP path decides instead.
        ok && (write || !f.expired())
    }
}

/// Copies between local spans and `remote` in this process's memory.
///
/// # Safety
/// The spans and `[remote, remote + their total length)` must be live,
/// non-overlapping memory that nothing frees during the call.
unsafe fn copy_local(local: &[RawSpan], remote: u64, write: bool) {
    let mut at = remote as *mut u8;
    for s in local {
        // SAFETY: caller's contract; `at` advances within the remote range.
        unsafe {
            if write {
                std::ptr::copy_nonoverlapping(s.ptr, at, s.len);
            } else {
                std::ptr::copy_nonoverlapping(at, s.ptr, s.len);
            }
            at = at.add(s.len);
        }
    }
}

/// The peer's segment, mapped once per peer device.
fn peer_segment(peers: &PeerMap, r: &SameHost) -> std::io::Result<Arc<PeerShm>> {
    let key = (r.pid, r.nonce);
    let mut peers = peers.lock();
    if let Some(p) = peers.get(&key).and_then(|w| w.upgrade()) {
        return Ok(p);
    }
    peers.retain(|_, w| w.strong_count() > 0);
    let p = Arc::new(PeerShm::open(r.pid, r.seg_fd, r.nonce)?);
    peers.insert(key, Arc::downgrade(&p));
    Ok(p)
}
