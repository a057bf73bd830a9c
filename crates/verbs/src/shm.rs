//! The same-host transport's shared segment (`docs/same-host.md`).
//!
//! Each device with `DeviceConfig::same_host` owns one segment: a memfd
//! mapped shared, which same-host peers map too (through
//! `/proc/PID/fd/FD`). It holds
//!
//! * a header (magic, version, owner pid, a random nonce the peer checks);
//! * [`SLOTS`] connection slots: one per same-host connection, in which the
//!   peer announces the access it is making ([`Slot::active`]) and the
//!   owner publishes how many of the connection's messages it has processed
//!   ([`Slot::done`]) and whether its QP has stopped ([`Slot::closed`]);
//! * [`ENTRIES`] STag entries (every 24-bit index): the owner's registrations (STag, PD, rights,
//!   range, and where the bytes are in the owner's address space), each
//!   under a seqlock.
//!
//! The access protocol (a peer writing or reading the owner's memory):
//!
//! 1. read the entry under its seqlock (sequence `s`, even), check it;
//! 2. store `active = (index, s)` in its slot (SeqCst);
//! 3. load the entry's sequence again (SeqCst): if it is not `s`, clear
//!    `active` and give up;
//! 4. copy; clear `active`.
//!
//! The owner, to invalidate an entry: bump the sequence (odd), clear the
//! entry, bump it again (SeqCst), then wait while any slot's `active`
//! names `(index, old sequence)`. Both sides use sequentially consistent
//! operations, so either the peer's step 3 sees the new sequence, or the
//! owner's scan sees the peer's `active`: no copy can start after the
//! owner's wait returns, and none is still running then. Only then may
//! the owner free or reuse the memory.
//!
//! Every field is an atomic: the segment is shared with other processes,
//! so plain loads and stores of it would be data races.

use crate::sys::{self, SharedMap};
use std::collections::HashMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering::*};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod ring;
pub(crate) use ring::{RingReader, RingWriter};

const MAGIC: u64 = u64::from_be_bytes(*b"SRDMAshm");
const VERSION: u32 = 3;
/// Connection slots per segment.
pub(crate) const SLOTS: usize = 4096;
/// Published STag indices: all of them (24 bits). The entries take 2 GiB
/// of the segment's address space; only the pages of entries in use are
/// ever touched, and only those cost memory.
pub(crate) const ENTRIES: usize = 1 << 24;
const HDR: usize = 4096;
const SLOT_SIZE: usize = 64;
const ENTRY_SIZE: usize = 128;
const SLOT_OFF: usize = HDR;
const ENTRY_OFF: usize = SLOT_OFF + SLOTS * SLOT_SIZE;
/// Bytes of a connection's ring (a power of two): about what loopback TCP
/// buffers, so a burst of messages waits for a busy consumer without
/// stalling its producer. Only the pages a connection's traffic touches
/// cost memory.
pub(crate) const RING_DATA: usize = 1 << 20;
/// A ring's header (producer and consumer fields on separate lines).
const RING_HDR: usize = 4096;
const RING_STRIDE: usize = RING_HDR + RING_DATA;
const RING_OFF: usize = ENTRY_OFF + ENTRIES * ENTRY_SIZE;
/// The segment's length (sparse: untouched pages cost nothing).
pub(crate) const SEG_LEN: usize = RING_OFF + SLOTS * RING_STRIDE;

#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    pid: AtomicU32,
    nonce: AtomicU64,
}

/// Slot states.
const FREE: u32 = 0;
const IN_USE: u32 = 1;
/// The owner's QP is gone; the slot is free again once the peer released
/// it or died.
const CLOSING: u32 = 2;

/// One same-host connection's shared state, in the segment of the end
/// whose memory the peer reaches.
#[repr(C)]
pub(crate) struct Slot {
    state: AtomicU32,
    peer_pid: AtomicU32,
    /// The peer's access in progress: `index << 40 | sequence`, 0 none.
    active: AtomicU64,
    /// Messages of this connection (RDMAP messages, Terminate aside) the
    /// owner has processed.
    pub done: AtomicU64,
    /// Set by the owner when its QP stops: the peer must not start another
    /// access through this slot.
    closed: AtomicU32,
    /// Set by the peer once it will never touch the slot again.
    released: AtomicU32,
    /// Bumped on every allocation.
    gen: AtomicU32,
}

impl Slot {
    /// Records the process on the other end of the connection.
    pub fn set_peer(&self, pid: u32) {
        self.peer_pid.store(pid, Relaxed);
    }

    /// The allocation this slot is in (see [`LocalShm::alloc_slot`]).
    pub fn generation(&self) -> u32 {
        self.gen.load(Acquire)
    }
}

/// One published registration.
#[repr(C)]
struct Entry {
    /// Seqlock: odd while the owner rewrites the entry.
    seq: AtomicU64,
    stag: AtomicU32,
    pd: AtomicU32,
    access: AtomicU32,
    /// The owner's descriptor of the memfd chunk holding the region, plus
    /// one (0: not in a chunk; reached with process_vm_readv/writev).
    chunk: AtomicU32,
    iova: AtomicU64,
    len: AtomicU64,
    /// The address of the region's byte 0 in the owner; 0: not reachable
    /// (invalid, or not one contiguous piece of memory).
    addr: AtomicU64,
    /// The offset of the region's byte 0 in its chunk.
    chunk_off: AtomicU64,
    /// The chunk's inode: a peer's cached mapping of descriptor `chunk`
    /// is only used while the inode matches (descriptor numbers are
    /// reused).
    chunk_ino: AtomicU64,
    /// Accesses must start (and, for reads, end) before this
    /// `sys::mono_ns` instant; `u64::MAX`: no deadline. Only ever moved
    /// later in place; moved earlier under the seqlock.
    deadline: AtomicU64,
    /// An access guard (`AccessGuard`): the offset of its word in the
    /// chunk, plus one (0: none), the mask and the expected value. A peer
    /// checks it before each direct copy.
    guard_off: AtomicU64,
    guard_mask: AtomicU64,
    guard_expect: AtomicU64,
}

/// What the owner publishes about a registration.
pub(crate) struct Publication {
    pub stag: u32,
    pub pd: u32,
    pub access: u32,
    pub iova: u64,
    pub len: u64,
    /// Where byte 0 is in the owner (0: unreachable).
    pub addr: u64,
    /// The memfd chunk holding the region: the owner's descriptor, the
    /// chunk's inode, and the offset of byte 0.
    pub chunk: Option<(u32, u64, u64)>,
    /// See [`Entry::deadline`].
    pub deadline: u64,
    /// The access guard: word offset in the chunk, mask, expected value.
    pub guard: Option<(u64, u64, u64)>,
}

const _: () = assert!(std::mem::size_of::<Slot>() <= SLOT_SIZE);
const _: () = assert!(std::mem::size_of::<Entry>() <= ENTRY_SIZE);
const _: () = assert!(std::mem::size_of::<Header>() <= HDR);
const _: () = assert!(std::mem::size_of::<RingHdr>() <= RING_HDR);
const _: () = assert!(RING_DATA.is_power_of_two());

/// The control words of a connection's ring: an SPSC byte stream from the
/// peer (producer) to the slot's owner (consumer), carrying exactly the
/// FPDU bytes the TCP stream would (`docs/same-host.md`).
#[repr(C)]
struct RingHdr {
    /// Bytes ever written (producer).
    tail: AtomicU64,
    _p0: [u64; 7],
    /// Bytes ever read (consumer).
    head: AtomicU64,
    _p1: [u64; 7],
    /// Set by the producer before its first byte: this direction of the
    /// connection uses the ring, not the TCP stream.
    active: AtomicU32,
    /// The consumer is about to sleep: the producer rings the doorbell
    /// (a byte on the TCP stream) after its next write.
    need_wake: AtomicU32,
    /// The producer found the ring full: the consumer rings back once it
    /// made room.
    writer_blocked: AtomicU32,
}

fn pack(index: u32, seq: u64) -> u64 {
    (index as u64) << 40 | (seq & ((1 << 40) - 1))
}

/// A mapped segment (ours or a peer's).
struct Seg {
    map: SharedMap,
}

impl Seg {
    fn header(&self) -> &Header {
        // SAFETY: the mapping is SEG_LEN bytes, page-aligned and lives as
        // long as &self; every byte pattern (it starts zeroed) is a valid
        // Header of atomics.
        unsafe { &*(self.map.ptr() as *const Header) }
    }

    fn slot(&self, i: u32) -> &Slot {
        assert!((i as usize) < SLOTS);
        // SAFETY: as in header(): in bounds (checked), 8-aligned (the
        // offsets are multiples of 64), atomics only.
        unsafe { &*(self.map.ptr().add(SLOT_OFF + i as usize * SLOT_SIZE) as *const Slot) }
    }

    fn ring(&self, i: u32) -> (&RingHdr, *mut u8) {
        assert!((i as usize) < SLOTS);
        let base = RING_OFF + i as usize * RING_STRIDE;
        // SAFETY: as in slot(); the data area [base + RING_HDR, base +
        // RING_STRIDE) lies inside the mapping too.
        unsafe {
            (
                &*(self.map.ptr().add(base) as *const RingHdr),
                self.map.ptr().add(base + RING_HDR),
            )
        }
    }

    fn entry(&self, i: u32) -> &Entry {
        assert!((i as usize) < ENTRIES);
        // SAFETY: as in slot().
        unsafe { &*(self.map.ptr().add(ENTRY_OFF + i as usize * ENTRY_SIZE) as *const Entry) }
    }
}

/// What a peer may do with a published entry.
pub(crate) struct Found {
    pub index: u32,
    pub seq: u64,
    /// The owner's address of the first byte of the access.
    pub addr: u64,
    /// The chunk (owner's descriptor, inode) and the offset of the first
    /// byte of the access in it, if the region lives in one.
    pub chunk: Option<(u32, u64, u64)>,
    /// The entry's deadline as read (`u64::MAX`: none).
    pub deadline: u64,
    /// The access guard (word offset in the chunk, mask, expected value).
    pub guard: Option<(u64, u64, u64)>,
}

impl Found {
    /// Whether the deadline has passed (a read that ends after it must not
    /// be used: the owner may have stopped vouching for the bytes).
    pub fn expired(&self) -> bool {
        self.deadline != u64::MAX && sys::mono_ns() >= self.deadline
    }
}

// --------------------------------------------------------------- owner

/// This device's segment.
pub(crate) struct LocalShm {
    seg: Seg,
    fd: OwnedFd,
    pub nonce: u64,
    pub pid: u32,
    pub boot_id: [u8; 16],
    pub pid_ns: u64,
    pub net_ns: u64,
    /// Free slot indices (CLOSING ones are reclaimed when this runs dry).
    free: parking_lot::Mutex<Vec<u32>>,
    /// Slots not FREE (in use or closing): the ones invalidation scans.
    used: parking_lot::RwLock<Vec<u32>>,
    /// Serialises the owner's entry rewrites (each is a seqlock write).
    writer: parking_lot::Mutex<()>,
}

impl LocalShm {
    /// A fresh segment, or `None` where this host cannot tell its identity.
    pub fn create() -> io::Result<Option<LocalShm>> {
        let (Some(boot_id), Some(pid_ns), Some(net_ns)) =
            (sys::boot_id(), sys::namespace("pid"), sys::namespace("net"))
        else {
            return Ok(None);
        };
        let fd = sys::memfd("softrdma-shm", SEG_LEN)?;
        let seg = Seg {
            map: SharedMap::map(fd.as_raw_fd(), SEG_LEN)?,
        };
        let nonce = random_u64();
        let pid = std::process::id();
        let h = seg.header();
        h.version.store(VERSION, Relaxed);
        h.pid.store(pid, Relaxed);
        h.nonce.store(nonce, Relaxed);
        h.magic.store(MAGIC, Release);
        Ok(Some(LocalShm {
            seg,
            fd,
            nonce,
            pid,
            boot_id,
            pid_ns,
            net_ns,
            free: parking_lot::Mutex::new((0..SLOTS as u32).rev().collect()),
            used: parking_lot::RwLock::new(Vec::new()),
            writer: parking_lot::Mutex::new(()),
        }))
    }

    pub fn fd(&self) -> u32 {
        self.fd.as_raw_fd() as u32
    }

    pub fn slot(&self, i: u32) -> &Slot {
        self.seg.slot(i)
    }

    /// Publishes (or republishes) entry `index`; `p.addr` 0 leaves it
    /// unreachable. Waits for accesses to the previous contents to end.
    pub fn publish(&self, index: u32, p: &Publication) {
        if index as usize >= ENTRIES {
            return;
        }
        let e = self.seg.entry(index);
        let w = self.writer.lock();
        let old = e.seq.load(Relaxed);
        let was_reachable = e.addr.load(Relaxed) != 0;
        e.seq.store(old + 1, SeqCst);
        e.stag.store(p.stag, Relaxed);
        e.pd.store(p.pd, Relaxed);
        e.access.store(p.access, Relaxed);
        e.iova.store(p.iova, Relaxed);
        e.len.store(p.len, Relaxed);
        e.addr.store(p.addr, Relaxed);
        let (fd, ino, off) = p
            .chunk
            .map_or((0, 0, 0), |(fd, ino, off)| (fd + 1, ino, off));
        e.chunk.store(fd, Relaxed);
        e.chunk_ino.store(ino, Relaxed);
        e.chunk_off.store(off, Relaxed);
        e.deadline.store(p.deadline, Relaxed);
        let (goff, gmask, gexp) = p.guard.map_or((0, 0, 0), |(o, m, x)| (o + 1, m, x));
        e.guard_off.store(goff, Relaxed);
        e.guard_mask.store(gmask, Relaxed);
        e.guard_expect.store(gexp, Relaxed);
        e.seq.store(old + 2, SeqCst);
        drop(w);
        // Accesses need a reachable entry: if the old one was not, none
        // can be running.
        if was_reachable {
            self.wait_quiet(index, old);
        }
    }

    /// Moves entry `index`'s deadline later (one store: an access that read
    /// the earlier deadline only stops sooner).
    pub fn extend_deadline(&self, index: u32, deadline: u64) {
        if (index as usize) < ENTRIES {
            let _w = self.writer.lock();
            self.seg.entry(index).deadline.store(deadline, Release);
        }
    }

    /// Makes entry `index` unreachable and waits until no peer copies to
    /// or from it any more: afterwards its memory may be freed.
    pub fn unpublish(&self, index: u32) {
        if index as usize >= ENTRIES {
            return;
        }
        let e = self.seg.entry(index);
        let w = self.writer.lock();
        if e.addr.load(Relaxed) == 0 {
            return;
        }
        let old = e.seq.load(Relaxed);
        e.seq.store(old + 1, SeqCst);
        e.addr.store(0, Relaxed);
        e.seq.store(old + 2, SeqCst);
        drop(w);
        self.wait_quiet(index, old);
    }

    /// Waits while a slot's peer is inside an access to `(index, seq)`.
    /// A peer that died mid-access is not waited for.
    fn wait_quiet(&self, index: u32, seq: u64) {
        let want = pack(index, seq);
        for &i in self.used.read().iter() {
            let s = self.seg.slot(i);
            let start = Instant::now();
            let mut spins = 0u32;
            while s.active.load(SeqCst) == want {
                spins += 1;
                if spins.is_multiple_of(64) {
                    if start.elapsed() > Duration::from_millis(5)
                        && !sys::pid_alive(s.peer_pid.load(Relaxed))
                    {
                        break;
                    }
                    std::thread::yield_now();
                } else {
                    std::hint::spin_loop();
                }
            }
        }
    }

    /// A slot for a new connection with process `peer_pid`.
    pub fn alloc_slot(&self, peer_pid: u32) -> Option<(u32, u32)> {
        let mut free = self.free.lock();
        if free.is_empty() {
            // Slots whose peer released them or died.
            let mut used = self.used.write();
            used.retain(|&i| {
                let s = self.seg.slot(i);
                let reclaim = s.state.load(Acquire) == CLOSING
                    && (s.released.load(Acquire) == 1 || !sys::pid_alive(s.peer_pid.load(Relaxed)));
                if reclaim {
                    s.state.store(FREE, Release);
                    free.push(i);
                }
                !reclaim
            });
        }
        let i = free.pop()?;
        let s = self.seg.slot(i);
        s.peer_pid.store(peer_pid, Relaxed);
        s.active.store(0, Relaxed);
        s.done.store(0, Relaxed);
        s.closed.store(0, Relaxed);
        s.released.store(0, Relaxed);
        let (r, _) = self.seg.ring(i);
        r.tail.store(0, Relaxed);
        r.head.store(0, Relaxed);
        r.active.store(0, Relaxed);
        // Parked from the start: the producer's first write rings the
        // doorbell, whenever the consumer first looks.
        r.need_wake.store(1, Relaxed);
        r.writer_blocked.store(0, Relaxed);
        let gen = s.gen.load(Relaxed).wrapping_add(1);
        s.gen.store(gen, Relaxed);
        s.state.store(IN_USE, Release);
        self.used.write().push(i);
        Some((i, gen))
    }

    /// The local QP of slot `i` stopped: its peer starts no more accesses.
    pub fn close_slot(&self, i: u32) {
        let s = self.seg.slot(i);
        s.closed.store(1, SeqCst);
        s.state.store(CLOSING, Release);
    }

    /// A slot allocated for a connection that did not happen.
    pub fn free_slot(&self, i: u32) {
        let s = self.seg.slot(i);
        s.closed.store(1, SeqCst);
        s.state.store(FREE, Release);
        // Lock order: `free`, then `used` (as in alloc_slot).
        let mut free = self.free.lock();
        self.used.write().retain(|&u| u != i);
        free.push(i);
    }
}

// ---------------------------------------------------------------- peer

/// A peer device's segment, mapped here.
pub(crate) struct PeerShm {
    seg: Seg,
    pub pid: u32,
    /// The peer's memory chunks mapped here, by (descriptor, inode).
    chunks: parking_lot::Mutex<HashMap<(u32, u64), Arc<SharedMap>>>,
}

/// Mapped chunks a peer keeps before starting afresh (a chunk the owner
/// closed stays mapped until then).
const MAX_CHUNK_MAPS: usize = 256;

impl PeerShm {
    /// Maps the segment `fd` of process `pid` and checks that it is the one
    /// with `nonce`.
    pub fn open(pid: u32, fd: u32, nonce: u64) -> io::Result<PeerShm> {
        let f = sys::open_peer_fd(pid, fd)?;
        let seg = Seg {
            map: SharedMap::map(f.as_raw_fd(), SEG_LEN)?,
        };
        let h = seg.header();
        if h.magic.load(Acquire) != MAGIC
            || h.version.load(Relaxed) != VERSION
            || h.pid.load(Relaxed) != pid
            || h.nonce.load(Relaxed) != nonce
        {
            return Err(io::Error::other("not the peer's softrdma segment"));
        }
        Ok(PeerShm {
            seg,
            pid,
            chunks: Default::default(),
        })
    }

    /// The peer's chunk `fd` (which must be inode `ino`), mapped here.
    pub fn chunk(&self, fd: u32, ino: u64) -> io::Result<Arc<SharedMap>> {
        let mut maps = self.chunks.lock();
        if let Some(m) = maps.get(&(fd, ino)) {
            return Ok(m.clone());
        }
        let f = sys::open_peer_fd(self.pid, fd)?;
        let (got, size) = sys::fd_ino_size(f.as_raw_fd())?;
        if got != ino {
            return Err(io::Error::other("the peer's chunk descriptor was reused"));
        }
        let m = Arc::new(SharedMap::map(f.as_raw_fd(), size as usize)?);
        if maps.len() >= MAX_CHUNK_MAPS {
            maps.clear();
        }
        maps.insert((fd, ino), m.clone());
        Ok(m)
    }

    pub fn slot(&self, i: u32) -> &Slot {
        self.seg.slot(i)
    }

    /// Looks up `stag` for an access of `len` bytes at `to` needing the
    /// rights `need`, by a QP of the owner's protection domain `pd`. `None`
    /// when anything is off (the caller then takes the TCP path, where the
    /// owner's engine refuses properly).
    pub fn lookup(&self, stag: u32, pd: u32, need: u32, to: u64, len: u64) -> Option<Found> {
        let index = crate::stag::Stag::from_raw(stag).index();
        if index == 0 || index as usize >= ENTRIES {
            return None;
        }
        let e = self.seg.entry(index);
        let seq = e.seq.load(Acquire);
        if seq & 1 == 1 {
            return None;
        }
        let (st, p, acc) = (
            e.stag.load(Relaxed),
            e.pd.load(Relaxed),
            e.access.load(Relaxed),
        );
        let (iova, l, addr) = (
            e.iova.load(Relaxed),
            e.len.load(Relaxed),
            e.addr.load(Relaxed),
        );
        let (chunk, ino, coff) = (
            e.chunk.load(Relaxed),
            e.chunk_ino.load(Relaxed),
            e.chunk_off.load(Relaxed),
        );
        let deadline = e.deadline.load(Acquire);
        let guard = (
            e.guard_off.load(Relaxed),
            e.guard_mask.load(Relaxed),
            e.guard_expect.load(Relaxed),
        );
        std::sync::atomic::fence(Acquire);
        if e.seq.load(Relaxed) != seq {
            return None;
        }
        if deadline != u64::MAX && sys::mono_ns() >= deadline {
            return None;
        }
        let end = to.checked_add(len)?;
        let ok = addr != 0
            && st == stag
            && p == pd
            && acc & need == need
            && to >= iova
            && end <= iova.checked_add(l)?;
        ok.then(|| Found {
            index,
            seq,
            deadline,
            addr: addr + (to - iova),
            chunk: (chunk != 0).then(|| (chunk - 1, ino, coff + (to - iova))),
            guard: (guard.0 != 0).then(|| (guard.0 - 1, guard.1, guard.2)),
        })
    }

    /// Steps 2-3 of the protocol on slot `slot` (generation `gen`): true if
    /// the access may proceed; then [`PeerShm::end`] must follow.
    pub fn begin(&self, slot: u32, gen: u32, f: &Found) -> bool {
        let s = self.seg.slot(slot);
        s.active.store(pack(f.index, f.seq), SeqCst);
        if self.seg.entry(f.index).seq.load(SeqCst) == f.seq
            && s.closed.load(SeqCst) == 0
            && s.gen.load(Relaxed) == gen
        {
            return true;
        }
        s.active.store(0, Release);
        false
    }

    pub fn end(&self, slot: u32) {
        self.seg.slot(slot).active.store(0, Release);
    }

    /// Whether the owner has processed `sent` messages of the connection
    /// and its QP is still running.
    pub fn caught_up(&self, slot: u32, sent: u64) -> bool {
        let s = self.seg.slot(slot);
        s.closed.load(Acquire) == 0 && s.done.load(Acquire) == sent
    }

    /// This side will never touch slot `slot` again.
    pub fn release(&self, slot: u32, gen: u32) {
        let s = self.seg.slot(slot);
        if s.gen.load(Relaxed) == gen {
            s.active.store(0, Release);
            s.released.store(1, Release);
        }
    }
}

/// 64 random bits from the kernel (getrandom), or from the clock.
fn random_u64() -> u64 {
    let mut b = [0u8; 8];
    // SAFETY: b is valid for 8 bytes of writes.
    let n = unsafe { libc::getrandom(b.as_mut_ptr() as *mut libc::c_void, 8, 0) };
    if n == 8 {
        u64::from_ne_bytes(b)
    } else {
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        t.as_nanos() as u64 ^ (std::process::id() as u64) << 32
    }
}

/// Whether the 8-byte word at offset `off` of a peer's mapped chunk holds
/// `expect` under `mask` (an access guard published with the entry).
pub(crate) fn guard_holds(map: &sys::SharedMap, off: u64, mask: u64, expect: u64) -> bool {
    if !off.is_multiple_of(8) || off.checked_add(8).is_none_or(|end| end > map.len() as u64) {
        return false;
    }
    // SAFETY: the word lies inside the mapping (checked above), which `map`
    // keeps alive; it is 8-byte aligned (mappings are page-aligned and the
    // offset is a multiple of 8), and it is only accessed atomically.
    let w = unsafe { &*(map.ptr().add(off as usize) as *const AtomicU64) };
    w.load(Acquire) & mask == expect
}
