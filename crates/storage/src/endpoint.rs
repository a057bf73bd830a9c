//! A store opened as an RDMA endpoint (`storage:PATH`): each partition is
//! a memory region with its own STag, registered per connection with the
//! connecting principal's rights, whose RDMA Writes and Reads become
//! `pwrite`/`pread` on the device and whose zero-length Read (the engine's
//! [`WrOp::Flush`](softrdma_verbs::WrOp::Flush)) is `fdatasync`.
//!
//! - **Locally**, [`Endpoint::attach`] registers the partitions in a
//!   protection domain of the caller's device and a QP of that domain
//!   reaches them with [`QueuePair::connect_local`] (no network).
//! - **Remotely**, [`serve`] (the CLI's `softrdma storage serve`) accepts
//!   iWARP connections whose MPA private data carries a principal's token
//!   ([`ConnectRequest`] below); an unknown token is rejected in the MPA
//!   reply with a reason; the accept lists each reachable partition's STag
//!   and length. [`connect`] is the client side.
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

use crate::layout::Rights;
use crate::uring::{Aligned, Ring};
use crate::{StorageError, Store};
use parking_lot::{Condvar, Mutex};
use softrdma_verbs::{
    Access, ConnParams, Device, IoDone, MemSpans, MemoryRegion, ProtectionDomain, QpState,
    QueuePair, RegOptions, RegionBackend,
};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

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
}

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

    fn sync(&self) -> io::Result<()> {
        // One inode: this writes back the page cache and flushes the
        // device's cache for direct writes too.
        self.buffered.sync_data()
    }
}

/// One partition's bytes on the device.
pub struct PartitionBackend {
    file: Arc<DevFile>,
    base: u64,
    len: u64,
    /// A remote connection's Writes, queued to io_uring (O_DIRECT).
    pipe: Option<Arc<Pipe>>,
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
}

impl PartitionBackend {
    fn store(&self, off: u64, data: Src<'_>) -> io::Result<()> {
        let at = self.check(off, data.len())?;
        match &self.pipe {
            Some(p) => p.write(at, data),
            None => self.file.write(at, data),
        }
    }

    fn load(&self, off: u64, buf: Dst<'_>) -> io::Result<()> {
        let at = self.check(off, buf.len())?;
        if let Some(p) = &self.pipe {
            p.before_read(at, buf.len());
        }
        self.file.read(at, buf)
    }

    fn submit_store(&self, off: u64, data: Src<'_>, done: IoDone) {
        let total = data.len();
        let at = match self.check(off, total) {
            Ok(at) => at,
            Err(e) => return done(Err(e)),
        };
        match (&self.pipe, self.file.direct_for(at, total)) {
            (Some(p), Some(_)) => p.submit(at, data, done),
            _ => done(self.store(off, data).map(|()| &[][..])),
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
        let at = match self.check(off, len) {
            Ok(at) => at,
            Err(e) => return done(Err(e)),
        };
        if let Some(p) = &self.pipe {
            p.before_read(at, len);
        }
        match (&self.file.ring, self.file.direct_for(at, len)) {
            (Some(ring), Some(f)) => ring.read(f.as_raw_fd(), at, len, done),
            _ => {
                let mut v = vec![0u8; len];
                let r = self.file.read(at, Dst::Slice(&mut v));
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

/// The partitions registered for one principal in one protection domain.
/// Dropping it deregisters them.
pub struct Session {
    /// Who.
    pub principal: String,
    /// The reachable partitions (rights not empty), by index.
    pub regions: Vec<PartitionRegion>,
    _mrs: Vec<MemoryRegion>,
    backends: Vec<Arc<PartitionBackend>>,
}

impl Session {
    /// Makes every Write placed so far on any of the session's partitions
    /// durable (what the `FLUSH_ALL` control message does).
    pub fn flush_all(&self) -> io::Result<()> {
        for b in &self.backends {
            b.flush()?;
        }
        Ok(())
    }

    /// The region of partition `index`, if reachable.
    pub fn region(&self, index: u32) -> Option<&PartitionRegion> {
        self.regions.iter().find(|r| r.index == index)
    }
}

/// An opened store, ready to serve its partitions.
pub struct Endpoint {
    store: Store,
    file: Arc<DevFile>,
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
            file: Arc::new(DevFile {
                buffered,
                direct: direct_file,
                ring,
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

    /// The store behind it.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// The principal a token belongs to (constant-time comparison).
    pub fn authenticate(&self, token: &[u8]) -> Option<String> {
        let l = self.store.layout();
        l.authenticate(token)
            .map(|i| l.principals[i as usize].name.clone())
    }

    /// Registers every partition `principal` has rights on, as a region of
    /// `pd` with exactly those rights (`REMOTE_READ`, `REMOTE_WRITE`), for
    /// use in this process through local QPs ([`QueuePair::connect_local`]):
    /// every access is done when its WR completes.
    pub fn attach(&self, pd: &ProtectionDomain, principal: &str) -> Result<Session, StorageError> {
        // The local QP orders its own WRs (strict or relaxed); the pipe
        // only keeps buffered and direct I/O of one page apart.
        self.register(pd, principal, self.pipe(false, false))
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
    /// does): on an O_DIRECT endpoint with io_uring, the connection's
    /// Writes are queued to the device as they arrive (see the module's
    /// notes on ordering; `relaxed` as the peer asked).
    pub fn attach_connection(
        &self,
        pd: &ProtectionDomain,
        principal: &str,
        relaxed: bool,
    ) -> Result<Session, StorageError> {
        self.register(pd, principal, self.pipe(!relaxed, true))
    }

    fn register(
        &self,
        pd: &ProtectionDomain,
        principal: &str,
        pipe: Option<Arc<Pipe>>,
    ) -> Result<Session, StorageError> {
        let l = self.store.layout();
        let who = l
            .principals
            .iter()
            .position(|p| p.name == principal)
            .ok_or_else(|| StorageError::NoSuchPrincipal(principal.into()))?;
        let mut regions = Vec::new();
        let mut mrs = Vec::new();
        let mut backends = Vec::new();
        for (i, p) in l.partitions.iter().enumerate() {
            let rights = l.rights(i as u32, who as u32);
            if rights.is_empty() {
                continue;
            }
            let mut access = Access::LOCAL_READ;
            if rights.contains(Rights::READ) {
                access = access | Access::REMOTE_READ;
            }
            if rights.contains(Rights::WRITE) {
                access = access | Access::REMOTE_WRITE;
            }
            let b = Arc::new(PartitionBackend {
                file: self.file.clone(),
                base: p.offset,
                len: p.size,
                pipe: pipe.clone(),
            });
            backends.push(b.clone());
            let mr = pd
                .register_backend(
                    b,
                    p.size,
                    access,
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
            mrs.push(mr);
        }
        Ok(Session {
            principal: principal.into(),
            regions,
            _mrs: mrs,
            backends,
        })
    }
}

// ------------------------------------------------------------ wire format

/// Connect request private data: magic, version, flags, token.
const REQ_MAGIC: &[u8; 4] = b"SRSQ";
/// Accept private data: magic, version, count, then the partitions.
const ACC_MAGIC: &[u8; 4] = b"SRSA";
/// Reject private data: magic, then a UTF-8 reason.
const REJ_MAGIC: &[u8; 4] = b"SRSJ";
const VERSION: u8 = 1;
/// Flag: relaxed ordering.
const FLAG_RELAXED: u8 = 1;
const REQ_LEN: usize = 8 + 32;
const ENTRY_LEN: usize = 16;
/// Partitions an accept can list (MPA private data is at most 512 bytes).
pub const MAX_LISTED: usize = 24;

/// What a client sends in its MPA request.
pub fn encode_request(token: &[u8; 32], relaxed: bool) -> Vec<u8> {
    let mut v = Vec::with_capacity(REQ_LEN);
    v.extend_from_slice(REQ_MAGIC);
    v.push(VERSION);
    v.push(if relaxed { FLAG_RELAXED } else { 0 });
    v.extend_from_slice(&[0, 0]);
    v.extend_from_slice(token);
    v
}

/// Parses a connect request: (token, relaxed).
pub fn decode_request(b: &[u8]) -> Result<([u8; 32], bool), String> {
    if b.len() != REQ_LEN || &b[..4] != REQ_MAGIC {
        return Err("not a softrdma storage connect request".into());
    }
    if b[4] != VERSION {
        return Err(format!("unsupported request version {}", b[4]));
    }
    if b[5] & !FLAG_RELAXED != 0 {
        return Err(format!("unknown flags {:#x}", b[5]));
    }
    let mut t = [0; 32];
    t.copy_from_slice(&b[8..]);
    Ok((t, b[5] & FLAG_RELAXED != 0))
}

/// The accept's list of partitions.
pub fn encode_accept(regions: &[PartitionRegion]) -> Result<Vec<u8>, String> {
    if regions.len() > MAX_LISTED {
        return Err(format!(
            "{} partitions reachable; a connection lists at most {MAX_LISTED}",
            regions.len()
        ));
    }
    let mut v = Vec::with_capacity(8 + regions.len() * ENTRY_LEN);
    v.extend_from_slice(ACC_MAGIC);
    v.push(VERSION);
    v.push(regions.len() as u8);
    v.extend_from_slice(&[0, 0]);
    for r in regions {
        v.extend_from_slice(&(r.index as u16).to_be_bytes());
        v.push(rights_bits(r.rights));
        v.push(0);
        v.extend_from_slice(&r.rkey.to_be_bytes());
        v.extend_from_slice(&r.len.to_be_bytes());
    }
    Ok(v)
}

fn rights_bits(r: Rights) -> u8 {
    (r.contains(Rights::READ) as u8) | (r.contains(Rights::WRITE) as u8) << 1
}

/// Parses an accept.
pub fn decode_accept(b: &[u8]) -> Result<Vec<PartitionRegion>, String> {
    if b.len() < 8 || &b[..4] != ACC_MAGIC || b[4] != VERSION {
        return Err("not a softrdma storage accept".into());
    }
    let n = b[5] as usize;
    if n > MAX_LISTED || b.len() != 8 + n * ENTRY_LEN {
        return Err("malformed storage accept".into());
    }
    b[8..]
        .chunks_exact(ENTRY_LEN)
        .map(|e| {
            let rights = match e[2] {
                1 => Rights::READ,
                2 => Rights::WRITE,
                3 => Rights::READ_WRITE,
                x => return Err(format!("bad rights {x:#x}")),
            };
            Ok(PartitionRegion {
                index: u16::from_be_bytes([e[0], e[1]]) as u32,
                rights,
                rkey: u32::from_be_bytes(e[4..8].try_into().expect("4 bytes")),
                len: u64::from_be_bytes(e[8..16].try_into().expect("8 bytes")),
            })
        })
        .collect()
}

/// Why a connection to a storage target failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The target refused: unknown token, or a malformed request.
    #[error("the storage target refused the connection: {0}")]
    Refused(String),
    /// Anything else (network, MPA, a malformed accept).
    #[error("{0}")]
    Other(String),
}

/// Connects `qp` to a storage target at `addr` as the principal whose
/// token is `token`; returns the partitions it may reach.
pub fn connect(
    qp: &QueuePair,
    addr: std::net::SocketAddr,
    token: &[u8; 32],
    relaxed: bool,
) -> Result<Vec<PartitionRegion>, ConnectError> {
    let params = ConnParams {
        private_data: encode_request(token, relaxed),
        ..Default::default()
    };
    match qp.connect(addr, &params) {
        Ok(pd) => decode_accept(&pd).map_err(ConnectError::Other),
        Err(softrdma_verbs::Error::Rejected { private_data }) => {
            let why = match private_data.strip_prefix(REJ_MAGIC) {
                Some(r) => String::from_utf8_lossy(r).into_owned(),
                None => "rejected (no reason given)".into(),
            };
            Err(ConnectError::Refused(why))
        }
        Err(e) => Err(ConnectError::Other(e.to_string())),
    }
}

/// A storage target: accepts connections until `stop` is set.
pub struct Target {
    ep: Arc<Endpoint>,
    dev: Device,
    listener: softrdma_verbs::Listener,
}

struct Conn {
    qp: Arc<QueuePair>,
    principal: String,
    control: Option<std::thread::JoinHandle<()>>,
}

impl Target {
    /// Listens on `addr` on a device of its own.
    pub fn bind(ep: Arc<Endpoint>, addr: std::net::SocketAddr) -> Result<Target, String> {
        let dev = Device::open(softrdma_verbs::DeviceConfig {
            // Backed regions never take the same-host path; nothing to
            // offer.
            same_host: false,
            ..Default::default()
        })
        .map_err(|e| e.to_string())?;
        let listener = dev.listen(addr).map_err(|e| e.to_string())?;
        Ok(Target { ep, dev, listener })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.listener.local_addr().expect("bound listener")
    }

    /// Serves until `stop` is set (checked every 100 ms).
    pub fn run(&self, stop: &AtomicBool) {
        let mut conns: Vec<Conn> = Vec::new();
        while !stop.load(Ordering::Relaxed) {
            conns.retain(|c| c.qp.state() != QpState::Error);
            let req = match self
                .listener
                .get_request_timeout(Duration::from_millis(100))
            {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!("storage target: connection request failed: {e}");
                    continue;
                }
            };
            let peer = req.peer_addr();
            match self.admit(req) {
                Ok(c) => {
                    tracing::info!(%peer, principal = %c.principal, "storage connection");
                    conns.push(c)
                }
                Err(e) => tracing::warn!(%peer, "storage connection refused: {e}"),
            }
        }
    }

    fn admit(&self, req: softrdma_verbs::ConnectRequest) -> Result<Conn, String> {
        let refuse = |req: softrdma_verbs::ConnectRequest, why: String| {
            let mut pd = REJ_MAGIC.to_vec();
            pd.extend_from_slice(why.as_bytes());
            let _ = req.reject(&pd);
            Err(why)
        };
        let (token, relaxed) = match decode_request(req.private_data()) {
            Ok(x) => x,
            Err(e) => return refuse(req, e),
        };
        let Some(principal) = self.ep.authenticate(&token) else {
            return refuse(req, "unknown token".into());
        };
        let pd = self.dev.alloc_pd().map_err(|e| e.to_string())?;
        let session = self
            .ep
            .attach_connection(&pd, &principal, relaxed)
            .map_err(|e| e.to_string())?;
        let accept = match encode_accept(&session.regions) {
            Ok(a) => a,
            Err(e) => return refuse(req, e),
        };
        let cq = self.dev.create_cq(64).map_err(|e| e.to_string())?;
        let qp = pd
            .create_qp(softrdma_verbs::QpInitAttr::new(&cq))
            .map_err(|e| e.to_string())?;
        // Control messages: receives posted (in INIT) before the peer can
        // send.
        qp.modify(QpState::Init).map_err(|e| e.to_string())?;
        let bufs = pd
            .alloc_mr(CTRL_SLOTS * CTRL_MAX, Access::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        for i in 0..CTRL_SLOTS {
            qp.post_recv(&softrdma_verbs::RecvWr::new(
                i as u64,
                &[bufs.sge(i * CTRL_MAX, CTRL_MAX)],
            ))
            .map_err(|e| e.to_string())?;
        }
        let listing = accept.clone();
        req.accept(
            &qp,
            &ConnParams {
                private_data: accept,
                ..Default::default()
            },
        )
        .map_err(|e| e.to_string())?;
        let qp = Arc::new(qp);
        let principal = session.principal.clone();
        let q = qp.clone();
        let control = std::thread::Builder::new()
            .name("storage-ctl".into())
            .spawn(move || {
                control_loop(&q, &cq, &pd, &bufs, &session, &listing);
            })
            .map_err(|e| e.to_string())?;
        Ok(Conn {
            qp,
            principal,
            control: Some(control),
        })
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.qp.disconnect();
        if let Some(t) = self.control.take() {
            let _ = t.join();
        }
    }
}

// ------------------------------------------------------- control messages

/// Receives posted for control messages per connection.
const CTRL_SLOTS: usize = 8;
/// Largest control message (request or reply).
pub const CTRL_MAX: usize = 512;
const CTRL_REQ: &[u8; 4] = b"SRSC";
const CTRL_REP: &[u8; 4] = b"SRSR";

/// A control request's operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ControlOp {
    /// Answered at once (liveness, round trip).
    Ping = 1,
    /// Every Write the target received before this message is durable
    /// when the reply is sent (all partitions of the connection).
    FlushAll = 2,
    /// The reply carries the accept's partition list again.
    Info = 3,
}

/// A control reply's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ControlStatus {
    /// Done.
    Ok = 0,
    /// The operation failed (the payload says why).
    Failed = 1,
    /// Not a control request this target knows.
    Unknown = 2,
}

/// A control request: `SRSC`, version 1, operation, two zero bytes, the
/// caller's 64-bit id (echoed in the reply).
pub fn encode_control(op: ControlOp, id: u64) -> Vec<u8> {
    let mut v = CTRL_REQ.to_vec();
    v.extend_from_slice(&[VERSION, op as u8, 0, 0]);
    v.extend_from_slice(&id.to_be_bytes());
    v
}

/// Parses a control request: (operation byte, id).
pub fn decode_control(b: &[u8]) -> Option<(u8, u64)> {
    if b.len() != 16 || &b[..4] != CTRL_REQ || b[4] != VERSION {
        return None;
    }
    Some((b[5], u64::from_be_bytes(b[8..16].try_into().ok()?)))
}

/// A control reply: `SRSR`, version 1, operation, status, zero, the id,
/// then the payload (Info: the partition list; Failed: a reason).
pub fn encode_control_reply(op: u8, status: ControlStatus, id: u64, payload: &[u8]) -> Vec<u8> {
    let mut v = CTRL_REP.to_vec();
    v.extend_from_slice(&[VERSION, op, status as u8, 0]);
    v.extend_from_slice(&id.to_be_bytes());
    let room = CTRL_MAX - v.len();
    v.extend_from_slice(&payload[..payload.len().min(room)]);
    v
}

/// Parses a control reply: (operation byte, status byte, id, payload).
pub fn decode_control_reply(b: &[u8]) -> Option<(u8, u8, u64, &[u8])> {
    if b.len() < 16 || b.len() > CTRL_MAX || &b[..4] != CTRL_REP || b[4] != VERSION {
        return None;
    }
    Some((
        b[5],
        b[6],
        u64::from_be_bytes(b[8..16].try_into().ok()?),
        &b[16..],
    ))
}

/// Answers a connection's control messages until it ends.
fn control_loop(
    qp: &QueuePair,
    cq: &softrdma_verbs::CompletionQueue,
    pd: &ProtectionDomain,
    bufs: &MemoryRegion,
    session: &Session,
    listing: &[u8],
) {
    use softrdma_verbs::{RecvWr, SendWr, WcOpcode, WcStatus};
    // Replies in flight, each in a registration of its own until its send
    // completes (a peer may send requests faster than replies drain).
    let mut sending = std::collections::HashMap::new();
    let mut next_id = 0u64;
    loop {
        let Some(wc) = cq.wait_one(Duration::from_millis(200)) else {
            if qp.state() == QpState::Error {
                return;
            }
            continue;
        };
        if wc.opcode != WcOpcode::Recv {
            sending.remove(&wc.wr_id);
            continue;
        }
        if wc.status != WcStatus::Success {
            return;
        }
        let slot = wc.wr_id as usize;
        let mut msg = vec![0u8; wc.byte_len as usize];
        bufs.read_at(slot * CTRL_MAX, &mut msg);
        let reply = match decode_control(&msg) {
            Some((op, id)) if op == ControlOp::Ping as u8 => {
                encode_control_reply(op, ControlStatus::Ok, id, &[])
            }
            Some((op, id)) if op == ControlOp::FlushAll as u8 => match session.flush_all() {
                Ok(()) => encode_control_reply(op, ControlStatus::Ok, id, &[]),
                Err(e) => {
                    encode_control_reply(op, ControlStatus::Failed, id, e.to_string().as_bytes())
                }
            },
            Some((op, id)) if op == ControlOp::Info as u8 => {
                encode_control_reply(op, ControlStatus::Ok, id, listing)
            }
            Some((op, id)) => encode_control_reply(op, ControlStatus::Unknown, id, &[]),
            None => encode_control_reply(0, ControlStatus::Unknown, 0, b"not a control request"),
        };
        // The receive goes back first, so the peer may send again at once.
        let len = reply.len();
        let ok = qp
            .post_recv(&RecvWr::new(
                slot as u64,
                &[bufs.sge(slot * CTRL_MAX, CTRL_MAX)],
            ))
            .and_then(|_| pd.register(reply, Access::LOCAL_READ))
            .and_then(|mr| {
                next_id += 1;
                qp.post_send(&SendWr::send(next_id, &[mr.sge(0, len)]))?;
                sending.insert(next_id, mr);
                Ok(())
            });
        if let Err(e) = ok {
            // The connection is ending (the QP left RTS); nothing to answer.
            tracing::debug!(qpn = %qp.qp_num(), "control message loop ends: {e}");
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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

    fn rights() -> impl Strategy<Value = Rights> {
        prop_oneof![
            Just(Rights::READ),
            Just(Rights::WRITE),
            Just(Rights::READ_WRITE)
        ]
    }

    fn region() -> impl Strategy<Value = PartitionRegion> {
        (0u32..=u16::MAX as u32, any::<u32>(), any::<u64>(), rights()).prop_map(
            |(index, rkey, len, rights)| PartitionRegion {
                index,
                rkey,
                len,
                rights,
            },
        )
    }

    proptest! {
        #[test]
        fn request_round_trips(token in any::<[u8; 32]>(), relaxed in any::<bool>()) {
            let b = encode_request(&token, relaxed);
            prop_assert_eq!(decode_request(&b), Ok((token, relaxed)));
        }

        #[test]
        fn accept_round_trips(rs in prop::collection::vec(region(), 0..=MAX_LISTED)) {
            let b = encode_accept(&rs).unwrap();
            prop_assert!(b.len() <= 8 + MAX_LISTED * ENTRY_LEN);
            prop_assert_eq!(decode_accept(&b), Ok(rs));
        }

                #[test]
        fn control_round_trips(op in any::<u8>(), st in 0u8..3, id in any::<u64>(),
                               payload in prop::collection::vec(any::<u8>(), 0..600)) {
            let mut req = encode_control(ControlOp::Ping, id);
            req[5] = op;
            prop_assert_eq!(decode_control(&req), Some((op, id)));
            let status = [ControlStatus::Ok, ControlStatus::Failed, ControlStatus::Unknown][st as usize];
            let rep = encode_control_reply(op, status, id, &payload);
            prop_assert!(rep.len() <= CTRL_MAX);
            let (o, s, i, p) = decode_control_reply(&rep).unwrap();
            prop_assert_eq!((o, s, i), (op, st, id));
            prop_assert_eq!(p, &payload[..payload.len().min(CTRL_MAX - 16)]);
        }

        /// Arbitrary bytes: no panic; whatever decodes re-encodes to the
        /// same bytes (nothing is silently ignored).
        #[test]
        fn arbitrary_bytes_decode_safely(b in prop::collection::vec(any::<u8>(), 0..600)) {
            let _ = decode_control(&b);
            let _ = decode_control_reply(&b);
            if let Ok((t, r)) = decode_request(&b) {
                let mut again = encode_request(&t, r);
                // The two reserved bytes are not checked.
                again[6..8].copy_from_slice(&b[6..8]);
                prop_assert_eq!(again, b.clone());
            }
            if let Ok(rs) = decode_accept(&b) {
                let mut again = encode_accept(&rs).unwrap();
                again[6..8].copy_from_slice(&b[6..8]);
                for (i, e) in again[8..].chunks_exact_mut(ENTRY_LEN).enumerate() {
                    e[3] = b[8 + i * ENTRY_LEN + 3];
                }
                prop_assert_eq!(again, b);
            }
        }
    }

    #[test]
    fn bad_requests_are_refused_with_a_reason() {
        let good = encode_request(&[1; 32], false);
        let mut v = good.clone();
        v[4] = 9;
        assert!(decode_request(&v).unwrap_err().contains("version"));
        let mut v = good.clone();
        v[5] = 0x80;
        assert!(decode_request(&v).unwrap_err().contains("flags"));
        assert!(decode_request(&good[..39]).is_err());
        assert!(decode_request(b"").is_err());
        let too_many = vec![
            PartitionRegion {
                index: 0,
                rkey: 1,
                len: 1,
                rights: Rights::READ
            };
            MAX_LISTED + 1
        ];
        assert!(encode_accept(&too_many).is_err());
    }
}
