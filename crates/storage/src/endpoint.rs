//! A store opened as an RDMA endpoint (`storage:PATH`): each partition is
//! a memory region with its own STag, registered per connection with the
//! connecting principal's rights, whose RDMA Writes and Reads become
//! `pwrite`/`pread` on the device and whose zero-length Read (the engine's
//! [`WrOp::Flush`](softrdma_verbs::WrOp::Flush)) is `fdatasync`.
//!
//! - **Locally**, [`Endpoint::attach`] registers the partitions in a
//!   protection domain of the caller's device and a QP of that domain
//!   reaches them with [`softrdma_verbs::QueuePair::connect_local`] (no
//!   network).
//! - **Remotely**, [`Target`] (the CLI's `softrdma storage serve`) accepts
//!   iWARP connections whose MPA private data carries a principal's token
//!   (the formats: [`crate::wire`], re-exported here); an unknown token is
//!   rejected in the MPA reply with a reason; the accept lists the
//!   reachable partitions' STags and lengths (the first 15; the rest over
//!   the connection). [`connect`] is the client side.
//!
//! Grants are read from the device, not from a copy taken at open: at
//! each admission, and by the target's watcher, which narrows or ends the
//! rights of live connections when a revoke changed the metadata
//! ([`Session::narrow_to`], `target.rs`).
//!
//! Ordering, remote: strict by default (the result is that of executing
//! the connection's messages one by one: a Read sees every earlier
//! Write). On a buffered endpoint each Write is in the page cache before
//! the next message is processed. On an O_DIRECT endpoint with io_uring
//! ([`Endpoint::attach_connection`]) aligned Writes are queued to the
//! device as they arrive; one that overlaps a queued Write waits for it,
//! and so does a Read. Relaxed (a flag in the connect request): queued
//! Writes wait for nothing, overlapping ones between two Flushes land in
//! either order and a later Read may miss them (on a buffered endpoint they
//! are written as they arrive: relaxing permits reordering, it does not
//! require it). Locally a QP created with `relaxed_ordering` completes out
//! of order (`softrdma_verbs`' `local.rs`). In every mode a Flush waits for
//! every earlier Write and then makes them durable, and a failed earlier
//! Write fails the Flush.

use crate::layout::{Layout, Rights};
pub use crate::target::{Target, GRANT_POLL};
use crate::uring::{Aligned, Ring};
pub use crate::wire::*;
use crate::{MetaStamp, StorageError, Store};
use parking_lot::{Condvar, Mutex, RwLock};
use softrdma_verbs::{
    Access, IoDone, MemSpans, MemoryRegion, ProtectionDomain, RegOptions, RegionBackend,
};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};
use std::sync::Arc;

/// Whether the endpoint bypasses the page cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Direct {
    /// O_DIRECT for a block device, buffered for a regular file.
    #[default]
    Auto,
    /// O_DIRECT (an error if the file system refuses it).
    On,
    /// Buffered.
    Off,
}

/// Alignment of O_DIRECT transfers (a multiple of any logical block size
/// up to 4 KiB).
const DIRECT_ALIGN: usize = crate::uring::ALIGN;

/// Largest single pread/pwrite.
const IO_PIECE: usize = 128 << 10;

/// The device, opened buffered and, where allowed, with O_DIRECT.
///
/// A transfer whose device offset and length are multiples of 4 KiB goes
/// through the O_DIRECT descriptor (via an aligned bounce buffer: RDMA
/// payloads have no alignment); any other goes through the page cache.
/// Linux keeps the two coherent: a direct read first writes back cached
/// dirty pages of its range, a direct write invalidates them.
struct DevFile {
    buffered: File,
    direct: Option<File>,
    /// Asynchronous O_DIRECT I/O (with `direct`, where the kernel allows
    /// io_uring).
    ring: Option<Ring>,
    /// Buffered sequential reads ([`DevFile::read_ahead`]): where the next
    /// read of a sequential reader starts, and how far ahead of it the
    /// kernel was asked to read.
    read_next: AtomicU64,
    read_ahead: AtomicU64,
}

/// How far ahead of a sequential buffered reader the kernel is asked to
/// read, and the least read that counts.
const READ_AHEAD: u64 = 16 << 20;
const READ_AHEAD_MIN: usize = 256 << 10;

/// Bytes to store: slices (a remote connection's Write, staged by the
/// engine) or registered memory (a local QP's, seen only as
/// [`MemSpans`]: it may be written meanwhile, so never as a slice).
#[derive(Clone, Copy)]
enum Src<'a> {
    Slices(&'a [&'a [u8]]),
    Mem(&'a MemSpans<'a>),
}

impl Src<'_> {
    fn len(&self) -> usize {
        match self {
            Src::Slices(d) => d.iter().map(|d| d.len()).sum(),
            Src::Mem(m) => m.len(),
        }
    }

    /// Copies bytes `[off, off + dst.len())` into `dst`.
    fn copy_to(&self, mut off: usize, mut dst: &mut [u8]) {
        match self {
            Src::Mem(m) => m.copy_to(off, dst),
            Src::Slices(d) => {
                for s in d.iter() {
                    if dst.is_empty() {
                        break;
                    }
                    if off >= s.len() {
                        off -= s.len();
                        continue;
                    }
                    let n = (s.len() - off).min(dst.len());
                    dst[..n].copy_from_slice(&s[off..off + n]);
                    dst = &mut dst[n..];
                    off = 0;
                }
            }
        }
    }

    /// Writes bytes `[off, off + len)` to `f` at `at`, from where they are.
    fn write_at(&self, off: usize, len: usize, f: &File, at: u64) -> io::Result<()> {
        match self {
            Src::Mem(m) => m.pwrite(off, len, f, at),
            Src::Slices(d) => {
                // Each slice's part of the range, written where it lands
                // (no gathering copy).
                let (mut skip, mut left, mut at) = (off, len, at);
                for s in d.iter() {
                    if left == 0 {
                        break;
                    }
                    if skip >= s.len() {
                        skip -= s.len();
                        continue;
                    }
                    let n = (s.len() - skip).min(left);
                    f.write_all_at(&s[skip..skip + n], at)?;
                    (skip, left, at) = (0, left - n, at + n as u64);
                }
                Ok(())
            }
        }
    }
}

/// Where read bytes go: a slice (a remote peer's Read, answered from a
/// buffer of the engine's) or registered memory (a local QP's Read).
enum Dst<'a> {
    Slice(&'a mut [u8]),
    Mem(&'a MemSpans<'a>),
}

impl Dst<'_> {
    fn len(&self) -> usize {
        match self {
            Dst::Slice(b) => b.len(),
            Dst::Mem(m) => m.len(),
        }
    }
}

impl DevFile {
    fn direct_for(&self, at: u64, len: usize) -> Option<&File> {
        self.direct
            .as_ref()
            .filter(|_| at.is_multiple_of(DIRECT_ALIGN as u64) && len.is_multiple_of(DIRECT_ALIGN))
    }

    /// Writes in pieces of at most [`IO_PIECE`]: a buffered write holds the
    /// file's inode lock for its whole length, and a small request from
    /// another thread (relaxed ordering) should wait for one piece, not for
    /// a whole large one.
    fn write(&self, at: u64, data: Src<'_>) -> io::Result<()> {
        let total = data.len();
        let pieces = (0..total)
            .step_by(IO_PIECE)
            .map(|o| (o, IO_PIECE.min(total - o)));
        match self.direct_for(at, total) {
            Some(f) => {
                let mut bounce = Aligned::new(total.min(IO_PIECE));
                for (o, n) in pieces {
                    let b = &mut bounce.get()[..n];
                    data.copy_to(o, b);
                    f.write_all_at(b, at + o as u64)?;
                }
            }
            None => {
                for (o, n) in pieces {
                    data.write_at(o, n, &self.buffered, at + o as u64)?;
                }
            }
        }
        Ok(())
    }

    fn read(&self, at: u64, mut buf: Dst<'_>) -> io::Result<()> {
        let total = buf.len();
        let pieces = (0..total)
            .step_by(IO_PIECE)
            .map(|o| (o, IO_PIECE.min(total - o)));
        match self.direct_for(at, total) {
            Some(f) => {
                let mut bounce = Aligned::new(total.min(IO_PIECE));
                for (o, n) in pieces {
                    let b = &mut bounce.get()[..n];
                    f.read_exact_at(b, at + o as u64)?;
                    match &mut buf {
                        Dst::Slice(s) => s[o..o + n].copy_from_slice(b),
                        Dst::Mem(m) => m.copy_from(o, b),
                    }
                }
            }
            None => {
                self.read_ahead(at, total);
                for (o, n) in pieces {
                    let pos = at + o as u64;
                    match &mut buf {
                        Dst::Slice(s) => self.buffered.read_exact_at(&mut s[o..o + n], pos)?,
                        Dst::Mem(m) => m.pread(o, n, &self.buffered, pos)?,
                    }
                }
            }
        }
        Ok(())
    }

    /// Asks the kernel to read ahead of a sequential buffered reader (a
    /// read of at least [`READ_AHEAD_MIN`] bytes that starts where the
    /// last one ended): the next [`READ_AHEAD`] bytes, in large requests,
    /// while this one is copied out. The kernel's own read-ahead window
    /// (`read_ahead_kb`, 128 KiB here) read a store file not in the page
    /// cache at 540-610 MiB/s in 1 MiB reads, against fio's O_DIRECT
    /// 1,000 MiB/s; asked 16 MiB ahead, 1,590 MiB/s (a node's snapshot load
    /// at recovery).
    fn read_ahead(&self, at: u64, len: usize) {
        let end = at + len as u64;
        let sequential = self.read_next.swap(end, Ordering::Relaxed) == at;
        if !sequential || len < READ_AHEAD_MIN {
            return;
        }
        let asked = self.read_ahead.load(Ordering::Relaxed);
        let from = if (end..end + READ_AHEAD).contains(&asked) {
            asked
        } else {
            end
        };
        let to = end + READ_AHEAD;
        if let Some(n) = std::num::NonZeroU64::new(to - from) {
            // (Advice: an error changes nothing but the speed.)
            let _ =
                rustix::fs::fadvise(&self.buffered, from, Some(n), rustix::fs::Advice::WillNeed);
            self.read_ahead.store(to, Ordering::Relaxed);
        }
    }

    fn sync(&self) -> io::Result<()> {
        // One inode: this writes back the page cache and flushes the
        // device's cache for direct writes too.
        self.buffered.sync_data()
    }
}

/// One partition's bytes on the device, as one session (a connection, or
/// a local attachment) reaches them.
pub struct PartitionBackend {
    file: Arc<DevFile>,
    base: u64,
    len: u64,
    /// A remote connection's Writes, queued to io_uring (O_DIRECT).
    pipe: Option<Arc<Pipe>>,
    /// What the session may still do here (`Rights` bits): a revoke
    /// narrows it (never widens), and from then on the backend refuses a
    /// transfer its STag check let through before the revoke (a Write
    /// message whose segments were being received, say).
    allowed: AtomicU8,
    /// Held shared by every call that moves bytes, exclusive by a revoke
    /// to wait for the ones in progress ([`PartitionBackend::narrow`]).
    /// Shared holders take it recursively (a completion callback may
    /// start the next request), so a waiting revoke never blocks them: a
    /// remote connection's calls come one at a time from its progress
    /// thread, and the revoke gets the lock between two.
    gate: RwLock<()>,
}

impl PartitionBackend {
    fn check(&self, off: u64, n: usize) -> io::Result<u64> {
        match off.checked_add(n as u64) {
            Some(end) if end <= self.len => Ok(self.base + off),
            _ => Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "outside the partition",
            )),
        }
    }

    /// The right `need` is still the session's (checked under the gate).
    fn may(&self, need: Rights) -> io::Result<()> {
        if Rights::from_bits_lossy(self.allowed.load(Ordering::Acquire)).contains(need) {
            Ok(())
        } else {
            Err(io::Error::new(
                io::ErrorKind::PermissionDenied,
                "the right on this partition was revoked",
            ))
        }
    }

    /// Takes every right outside `keep` away, then waits until no
    /// transfer that started before is still moving bytes (queued
    /// O_DIRECT Writes included): when this returns, nothing of the
    /// session touches the partition without a right it still has.
    fn narrow(&self, keep: Rights) {
        self.allowed.fetch_and(keep.bits(), Ordering::AcqRel);
        drop(self.gate.write());
        if let Some(p) = &self.pipe {
            p.settle();
        }
    }

    fn store(&self, off: u64, data: Src<'_>) -> io::Result<()> {
        let _g = self.gate.read_recursive();
        self.may(Rights::WRITE)?;
        self.store_now(off, data)
    }

    fn store_now(&self, off: u64, data: Src<'_>) -> io::Result<()> {
        let at = self.check(off, data.len())?;
        match &self.pipe {
            Some(p) => p.write(at, data),
            None => self.file.write(at, data),
        }
    }

    fn load(&self, off: u64, buf: Dst<'_>) -> io::Result<()> {
        let _g = self.gate.read_recursive();
        self.may(Rights::READ)?;
        let at = self.check(off, buf.len())?;
        if let Some(p) = &self.pipe {
            p.before_read(at, buf.len());
        }
        self.file.read(at, buf)
    }

    fn submit_store(&self, off: u64, data: Src<'_>, done: IoDone) {
        let g = self.gate.read_recursive();
        if let Err(e) = self.may(Rights::WRITE) {
            drop(g);
            return done(Err(e));
        }
        let total = data.len();
        let at = match self.check(off, total) {
            Ok(at) => at,
            Err(e) => {
                drop(g);
                return done(Err(e));
            }
        };
        match (&self.pipe, self.file.direct_for(at, total)) {
            (Some(p), Some(_)) => {
                // Queued: the pipe counts it until it is on the device.
                p.submit(at, data, done);
            }
            _ => {
                let r = self.store_now(off, data);
                drop(g);
                done(r.map(|()| &[][..]))
            }
        }
    }
}

impl RegionBackend for PartitionBackend {
    fn write_at(&self, off: u64, data: &[u8]) -> io::Result<()> {
        self.store(off, Src::Slices(&[data]))
    }
    fn read_at(&self, off: u64, buf: &mut [u8]) -> io::Result<()> {
        self.load(off, Dst::Slice(buf))
    }
    fn write_spans(&self, off: u64, src: &MemSpans<'_>) -> io::Result<()> {
        self.store(off, Src::Mem(src))
    }
    fn read_spans(&self, off: u64, dst: &MemSpans<'_>) -> io::Result<()> {
        self.load(off, Dst::Mem(dst))
    }
    fn flush(&self) -> io::Result<()> {
        // (A local QP's own asynchronous requests: its Flush is fenced,
        // they have all completed before this runs.)
        if let Some(p) = &self.pipe {
            p.drain()?;
        }
        self.file.sync()
    }
    fn queue_depth(&self) -> usize {
        // Device-bound under O_DIRECT: keep requests in flight.
        if self.file.direct.is_some() {
            32
        } else {
            1
        }
    }
    fn is_async(&self) -> bool {
        self.file.ring.is_some()
    }
    fn hold_doorbell(&self) {
        if let Some(r) = &self.file.ring {
            r.hold();
        }
    }
    fn release_doorbell(&self) {
        if let Some(r) = &self.file.ring {
            r.release();
        }
    }
    fn submit_write(&self, off: u64, data: &[&[u8]], done: IoDone) {
        self.submit_store(off, Src::Slices(data), done)
    }
    fn submit_write_spans(&self, off: u64, src: &MemSpans<'_>, done: IoDone) {
        self.submit_store(off, Src::Mem(src), done)
    }
    fn submit_read(&self, off: u64, len: usize, done: IoDone) {
        let g = self.gate.read_recursive();
        let at = match self.may(Rights::READ).and_then(|()| self.check(off, len)) {
            Ok(at) => at,
            Err(e) => {
                drop(g);
                return done(Err(e));
            }
        };
        if let Some(p) = &self.pipe {
            p.before_read(at, len);
        }
        match (&self.file.ring, self.file.direct_for(at, len)) {
            (Some(ring), Some(f)) => ring.read(f.as_raw_fd(), at, len, done),
            _ => {
                let mut v = vec![0u8; len];
                let r = self.file.read(at, Dst::Slice(&mut v));
                drop(g);
                done(r.map(|()| &v[..]))
            }
        }
    }
}

/// The O_DIRECT Writes of one session (a remote connection, or a local
/// attachment) queued to io_uring, and the rules that keep them safe.
///
/// A remote connection's aligned Writes are queued as they arrive
/// (`queue`): the engine's progress thread goes on with the next message,
/// so a stream of Writes keeps the device busy instead of waiting for each.
/// A local QP queues its own through [`Pipe::submit`].
///
/// - Strict ordering (remote; a local QP orders its own WRs) keeps the
///   result of one-at-a-time execution: a Write overlapping one in flight
///   waits for it. Relaxed: overlapping Writes between two Flushes land in
///   either order.
/// - In both modes, a Write that goes through the page cache (unaligned)
///   waits for the queued Writes it overlaps, and so does any Read. Linux
///   cannot keep a page cached while an O_DIRECT write of it is in flight:
///   a mutation that let a buffered write through here made reads fail
///   with EIO (the kernel's "page cache invalidation failure" on direct
///   I/O).
/// - A Flush waits for every queued Write and reports the first failure.
struct Pipe {
    file: Arc<DevFile>,
    strict: bool,
    queue: bool,
    st: Mutex<PipeState>,
    cv: Condvar,
}

#[derive(Default)]
struct PipeState {
    /// (id, device range, through the page cache) of the Writes in flight.
    inflight: Vec<(u64, u64, u64, bool)>,
    next: u64,
    error: Option<io::Error>,
}

impl Pipe {
    /// Waits until no Write in flight overlapping `[at, at + len)` that
    /// `blocks` matches (given whether it goes through the page cache).
    fn wait_clear(
        &self,
        st: &mut parking_lot::MutexGuard<'_, PipeState>,
        at: u64,
        len: usize,
        blocks: impl Fn(bool) -> bool,
    ) {
        let end = at + len as u64;
        while st
            .inflight
            .iter()
            .any(|&(_, a, b, buffered)| a < end && at < b && blocks(buffered))
        {
            // What we wait for may sit in the submission queue behind a
            // doorbell this thread holds (a posted batch): ring it.
            if let Some(r) = &self.file.ring {
                r.kick();
            }
            self.cv.wait(st);
        }
    }

    /// Records a Write about to start, once nothing it must not overlap is
    /// in flight: a buffered one waits for every overlapping Write, a
    /// direct one for overlapping buffered ones (and, strict, for all).
    fn claim(&self, at: u64, len: usize, buffered: bool) -> u64 {
        let mut st = self.st.lock();
        let strict = self.strict;
        self.wait_clear(&mut st, at, len, |other_buffered| {
            buffered || strict || other_buffered
        });
        let id = st.next;
        st.next += 1;
        st.inflight.push((id, at, at + len as u64, buffered));
        id
    }

    /// A claimed Write has ended.
    fn release(&self, id: u64, r: &io::Result<()>) {
        let mut st = self.st.lock();
        st.inflight.retain(|&(i, ..)| i != id);
        if let Err(e) = r {
            st.error
                .get_or_insert_with(|| io::Error::new(e.kind(), e.to_string()));
        }
        drop(st);
        self.cv.notify_all();
    }

    /// `write_at`: queued (remote, aligned) or done now.
    fn write(self: &Arc<Self>, at: u64, data: Src<'_>) -> io::Result<()> {
        let direct = self.file.ring.is_some() && self.file.direct_for(at, data.len()).is_some();
        if direct && self.queue {
            // A failure is kept for the next Flush (in `submit`).
            self.submit(at, data, Box::new(|_| {}));
            return Ok(());
        }
        let id = self.claim(at, data.len(), !direct);
        let r = self.file.write(at, data);
        // (A failure here is reported to the caller, not kept.)
        self.release(id, &Ok(()));
        r
    }

    /// Queues an aligned Write of the concatenation of `data` at `at`;
    /// `done` runs when it is on the device (or failed; the failure is
    /// also kept for the next Flush).
    fn submit(self: &Arc<Self>, at: u64, data: Src<'_>, done: IoDone) {
        let total = data.len();
        let (Some(ring), Some(f)) = (&self.file.ring, self.file.direct_for(at, total)) else {
            unreachable!("only aligned writes on a ring are queued");
        };
        let id = self.claim(at, total, false);
        let mut b = ring.buffer(total);
        data.copy_to(0, &mut b.get()[..total]);
        let me = self.clone();
        ring.write(
            f.as_raw_fd(),
            at,
            b,
            Box::new(move |r| {
                let kept = r.as_ref().map(|_| ()).map_err(|e| {
                    tracing::error!("queued storage write at {at} failed: {e}");
                    io::Error::new(e.kind(), e.to_string())
                });
                me.release(id, &kept);
                done(r);
            }),
        );
    }

    /// A Read waits for the Writes in flight it overlaps.
    fn before_read(&self, at: u64, len: usize) {
        let mut st = self.st.lock();
        self.wait_clear(&mut st, at, len, |_| true);
    }

    /// Waits for every queued Write, leaving a failure for the next
    /// Flush to report.
    fn settle(&self) {
        let mut st = self.st.lock();
        while !st.inflight.is_empty() {
            if let Some(r) = &self.file.ring {
                r.kick();
            }
            self.cv.wait(&mut st);
        }
    }

    /// Waits for every queued Write; returns (and clears) the first error.
    fn drain(&self) -> io::Result<()> {
        let mut st = self.st.lock();
        while !st.inflight.is_empty() {
            if let Some(r) = &self.file.ring {
                r.kick();
            }
            self.cv.wait(&mut st);
        }
        st.error.take().map_or(Ok(()), Err)
    }
}

/// A partition as seen by one principal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionRegion {
    /// Partition index.
    pub index: u32,
    /// The STag of its region.
    pub rkey: u32,
    /// Its length (addresses run from 0).
    pub len: u64,
    /// What the principal may do.
    pub rights: Rights,
}

/// One partition registered in a session.
struct Part {
    index: u32,
    /// Where the partition was when registered: a later layout that moves
    /// or resizes it (a re-initialised store) leaves the session nothing.
    offset: u64,
    size: u64,
    mr: MemoryRegion,
    backend: Arc<PartitionBackend>,
}

/// The partitions registered for one principal in one protection domain.
/// Dropping it deregisters them.
///
/// Its rights only narrow: [`Session::narrow_to`] (what a storage target
/// does for each live connection when the grants on the device change)
/// takes rights a newer layout no longer grants away from the
/// registrations in place. A right granted later reaches new sessions only.
pub struct Session {
    /// Who.
    pub principal: String,
    token: [u8; 32],
    parts: Vec<Part>,
    /// The reachable partitions with their rights now, by index.
    regions: Mutex<Vec<PartitionRegion>>,
    /// The layout the rights were last reconciled with.
    seen: Mutex<Arc<Layout>>,
}

impl Session {
    /// Makes every Write placed so far on any of the session's partitions
    /// durable (what the `FLUSH_ALL` control message does).
    pub fn flush_all(&self) -> io::Result<()> {
        for p in &self.parts {
            p.backend.flush()?;
        }
        Ok(())
    }

    /// The region of partition `index`, if reachable now.
    pub fn region(&self, index: u32) -> Option<PartitionRegion> {
        self.regions
            .lock()
            .iter()
            .find(|r| r.index == index)
            .cloned()
    }

    /// The reachable partitions with their rights now, by index.
    pub fn regions(&self) -> Vec<PartitionRegion> {
        self.regions.lock().clone()
    }

    /// Reconciles the session with `layout` (newer than the one it was
    /// registered with): each partition keeps the rights it has *and*
    /// `layout` grants the session's principal (found by its token), and
    /// none if the principal or the partition is gone or moved. A
    /// partition that loses a right is narrowed in place, keeping its STag
    /// (the STag check refuses the lost right: RFC 5040's protection
    /// Terminate for a peer); one that loses every right is invalidated
    /// (its STag stays reserved for the session, so it is never reused for
    /// another region while the peer may still name it). Each narrowing
    /// also closes the partition's backend to the lost rights and waits
    /// for transfers already moving bytes: when this returns, no byte is
    /// read or written without a right the session still has. Returns the
    /// changes, (partition, before, after). Cheap when `layout` is the one
    /// seen last.
    pub fn narrow_to(&self, layout: &Arc<Layout>) -> Vec<(u32, Rights, Rights)> {
        let mut seen = self.seen.lock();
        if Arc::ptr_eq(&seen, layout) {
            return Vec::new();
        }
        let who = layout
            .authenticate(&self.token)
            .filter(|&q| layout.principals[q as usize].name == self.principal);
        let mut changes = Vec::new();
        for p in &self.parts {
            let Some(now) = self.region(p.index).map(|r| r.rights) else {
                continue;
            };
            let same_place = layout
                .partitions
                .get(p.index as usize)
                .is_some_and(|l| l.offset == p.offset && l.size == p.size);
            let granted = match who {
                Some(q) if same_place => layout.rights(p.index, q),
                _ => Rights::NONE,
            };
            let keep = now.intersect(granted);
            if keep == now {
                continue;
            }
            if keep.is_empty() {
                p.mr.set_valid(false);
            } else {
                p.mr.restrict_access(access_for(keep));
            }
            p.backend.narrow(keep);
            let mut rs = self.regions.lock();
            if keep.is_empty() {
                rs.retain(|r| r.index != p.index);
            } else if let Some(r) = rs.iter_mut().find(|r| r.index == p.index) {
                r.rights = keep;
            }
            changes.push((p.index, now, keep));
        }
        *seen = layout.clone();
        changes
    }
}

/// The STag rights of a partition's region for `rights`.
fn access_for(rights: Rights) -> Access {
    let mut access = Access::LOCAL_READ;
    if rights.contains(Rights::READ) {
        access = access | Access::REMOTE_READ;
    }
    if rights.contains(Rights::WRITE) {
        access = access | Access::REMOTE_WRITE;
    }
    access
}

/// An opened store, ready to serve its partitions.
pub struct Endpoint {
    store: Store,
    file: Arc<DevFile>,
    /// The metadata as last read from the device, and its stamp.
    meta: Mutex<Option<(MetaStamp, Arc<Layout>)>>,
}

impl Endpoint {
    /// Opens `storage:PATH` (or a plain PATH), O_DIRECT for a block device.
    pub fn open(name: &str) -> Result<Endpoint, StorageError> {
        Endpoint::open_with(name, Direct::Auto)
    }

    /// Opens `storage:PATH` choosing whether to bypass the page cache.
    pub fn open_with(name: &str, direct: Direct) -> Result<Endpoint, StorageError> {
        let path = Path::new(name.strip_prefix("storage:").unwrap_or(name));
        let store = Store::open(path)?;
        let io = |err| StorageError::Io {
            path: path.to_path_buf(),
            err,
        };
        let buffered = store.file().try_clone().map_err(io)?;
        let want = match direct {
            Direct::On => true,
            Direct::Off => false,
            Direct::Auto => store.is_block_device(),
        };
        let direct_file = if want {
            use std::os::unix::fs::OpenOptionsExt;
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(path)
            {
                Ok(f) => Some(f),
                Err(e) if direct == Direct::On => return Err(io(e)),
                Err(e) => {
                    tracing::warn!(path = %path.display(), "no O_DIRECT ({e}); buffered I/O");
                    None
                }
            }
        } else {
            None
        };
        let ring = match &direct_file {
            Some(_) => match Ring::new() {
                Ok(r) => Some(r),
                Err(e) => {
                    tracing::warn!("no io_uring ({e}): O_DIRECT requests run one per thread");
                    None
                }
            },
            None => None,
        };
        Ok(Endpoint {
            store,
            meta: Mutex::new(None),
            file: Arc::new(DevFile {
                buffered,
                direct: direct_file,
                ring,
                read_next: AtomicU64::new(u64::MAX),
                read_ahead: AtomicU64::new(0),
            }),
        })
    }

    /// Whether aligned transfers bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.file.direct.is_some()
    }

    /// Whether O_DIRECT requests of a relaxed local QP go through io_uring
    /// (several in flight from one thread) rather than one thread each.
    pub fn uses_io_uring(&self) -> bool {
        self.file.ring.is_some()
    }

    /// The endpoint's name, `storage:PATH`.
    pub fn name(&self) -> String {
        format!("storage:{}", self.store.path().display())
    }

    /// The store behind it (its [`Store::layout`] is the metadata as it
    /// was at open; [`Endpoint::layout`] reads it as it is now).
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The metadata as it is on the device now: `storage grant` and
    /// `revoke` in other processes update it while the endpoint is open.
    /// Each call checks the device ([`Store::reload`]: under a shared lock,
    /// two small reads per copy while nothing changed); the same `Arc`
    /// comes back until something did. An unreadable device is an error
    /// (the caller refuses what it was about to allow).
    pub fn layout(&self) -> Result<Arc<Layout>, StorageError> {
        let mut m = self.meta.lock();
        if let Some((stamp, layout)) = self.store.reload(m.as_ref().map(|x| &x.0))? {
            *m = Some((stamp, Arc::new(layout)));
        }
        Ok(m.as_ref().expect("read above").1.clone())
    }

    /// The principal a token belongs to now (constant-time comparison).
    pub fn authenticate(&self, token: &[u8]) -> Result<Option<String>, StorageError> {
        let l = self.layout()?;
        Ok(l.authenticate(token)
            .map(|i| l.principals[i as usize].name.clone()))
    }

    /// Registers every partition `principal` has rights on now, as a
    /// region of `pd` with exactly those rights (`REMOTE_READ`,
    /// `REMOTE_WRITE`), for use in this process through local QPs
    /// ([`softrdma_verbs::QueuePair::connect_local`]): every access is
    /// done when its WR completes. Nothing watches the grants for a local
    /// session; call [`Endpoint::refresh`] to apply revokes to it.
    pub fn attach(&self, pd: &ProtectionDomain, principal: &str) -> Result<Session, StorageError> {
        // The local QP orders its own WRs (strict or relaxed); the pipe
        // only keeps buffered and direct I/O of one page apart.
        let l = self.layout()?;
        let q = l
            .principal(principal)
            .ok_or_else(|| StorageError::NoSuchPrincipal(principal.into()))?;
        self.register(&l, q, pd, self.pipe(false, false))
    }

    /// Narrows `session` to the grants on the device now
    /// ([`Session::narrow_to`]); the changes made.
    pub fn refresh(&self, session: &Session) -> Result<Vec<(u32, Rights, Rights)>, StorageError> {
        Ok(session.narrow_to(&self.layout()?))
    }

    fn pipe(&self, strict: bool, queue: bool) -> Option<Arc<Pipe>> {
        self.file.ring.is_some().then(|| {
            Arc::new(Pipe {
                file: self.file.clone(),
                strict,
                queue,
                st: Mutex::new(PipeState::default()),
                cv: Condvar::new(),
            })
        })
    }

    /// [`Endpoint::attach`] for a remote connection (what [`Target`]
    /// does), as the principal `principal` (an index) of `layout` (one
    /// [`Endpoint::layout`] returned): on an O_DIRECT endpoint with
    /// io_uring, the connection's Writes are queued to the device as they
    /// arrive (see the module's notes on ordering; `relaxed` as the peer
    /// asked).
    pub fn attach_connection(
        &self,
        layout: &Arc<Layout>,
        principal: u32,
        pd: &ProtectionDomain,
        relaxed: bool,
    ) -> Result<Session, StorageError> {
        self.register(layout, principal, pd, self.pipe(!relaxed, true))
    }

    fn register(
        &self,
        l: &Arc<Layout>,
        who: u32,
        pd: &ProtectionDomain,
        pipe: Option<Arc<Pipe>>,
    ) -> Result<Session, StorageError> {
        let principal = l
            .principals
            .get(who as usize)
            .ok_or_else(|| StorageError::NoSuchPrincipal(format!("#{who}")))?;
        let mut regions = Vec::new();
        let mut parts = Vec::new();
        for (i, p) in l.partitions.iter().enumerate() {
            let rights = l.rights(i as u32, who);
            if rights.is_empty() {
                continue;
            }
            let b = Arc::new(PartitionBackend {
                file: self.file.clone(),
                base: p.offset,
                len: p.size,
                pipe: pipe.clone(),
                allowed: AtomicU8::new(rights.bits()),
                gate: RwLock::new(()),
            });
            let mr = pd
                .register_backend(
                    b.clone(),
                    p.size,
                    access_for(rights),
                    RegOptions {
                        iova: Some(0),
                        ..Default::default()
                    },
                )
                .map_err(|e| StorageError::BadSpec(format!("registering partition {i}: {e}")))?;
            regions.push(PartitionRegion {
                index: i as u32,
                rkey: mr.rkey().raw(),
                len: p.size,
                rights,
            });
            parts.push(Part {
                index: i as u32,
                offset: p.offset,
                size: p.size,
                mr,
                backend: b,
            });
        }
        Ok(Session {
            principal: principal.name.clone(),
            token: principal.token,
            parts,
            regions: Mutex::new(regions),
            seen: Mutex::new(l.clone()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A range of several slices is written slice by slice where each
    /// part lands, and copied out the same way.
    #[test]
    fn a_range_of_slices_writes_and_copies_each_part() {
        let p = std::env::temp_dir().join(format!("softrdma-src-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        let _ = std::fs::remove_file(&p);
        let (a, b, c) = ([1u8, 2, 3], [4u8, 5], [6u8, 7, 8, 9]);
        let src = Src::Slices(&[&a[..], &b[..], &c[..]]);
        assert_eq!(src.len(), 9);
        src.write_at(2, 5, &f, 10).unwrap();
        let mut got = [0u8; 5];
        f.read_exact_at(&mut got, 10).unwrap();
        assert_eq!(got, [3, 4, 5, 6, 7]);
        let mut out = [0u8; 4];
        src.copy_to(4, &mut out);
        assert_eq!(out, [5, 6, 7, 8]);
    }

    /// A narrowed backend refuses what its STag check may have let
    /// through before the revoke (a Write staged by the engine), keeps
    /// what is left, and never widens again.
    #[test]
    fn a_narrowed_backend_refuses_lost_rights() {
        let p = std::env::temp_dir().join(format!("softrdma-narrow-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        let _ = std::fs::remove_file(&p);
        f.set_len(1 << 20).unwrap();
        let b = PartitionBackend {
            file: Arc::new(DevFile {
                buffered: f,
                direct: None,
                ring: None,
                read_next: AtomicU64::new(u64::MAX),
                read_ahead: AtomicU64::new(0),
            }),
            base: 4096,
            len: 65536,
            pipe: None,
            allowed: AtomicU8::new(Rights::READ_WRITE.bits()),
            gate: RwLock::new(()),
        };
        b.write_at(0, &[7; 100]).unwrap();
        b.narrow(Rights::READ);
        let e = b.write_at(0, &[9; 100]).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::PermissionDenied);
        let mut got = [0u8; 100];
        b.read_at(0, &mut got).unwrap();
        assert_eq!(got, [7; 100], "the refused write changed nothing");
        b.narrow(Rights::READ_WRITE);
        assert!(b.write_at(0, &[9; 100]).is_err(), "a right came back");
        b.narrow(Rights::NONE);
        assert!(b.read_at(0, &mut got).is_err());
        let (tx, rx) = std::sync::mpsc::channel();
        b.submit_read(0, 10, Box::new(move |r| tx.send(r.is_err()).unwrap()));
        assert!(rx.recv().unwrap(), "an asynchronous read after the revoke");
    }
}
