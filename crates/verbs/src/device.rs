//! Devices and protection domains (the engine's counterpart of
//! `siw_verbs.c`'s device-level calls).

use crate::cq::CompletionQueue;
use crate::error::{Error, Result};
use crate::mr::{Access, AlignedBuf, Backing, MrInner, NewMr, StagTable};
use crate::progress::Progress;
use crate::registry::DeviceInfo;
use crate::stag::Stag;
use crate::sys::RawSpan;
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

pub(crate) use crate::engine::Core;
pub use crate::engine::{AsyncEvent, DeviceAttr, DeviceConfig, PostCheck};

mod region;
pub use region::{FastRegMr, MemoryRegion, RegOptions};

/// The device runtime: the core plus the progress threads. Dropped (and the
/// threads stopped) when the last handle of the device goes away.
pub(crate) struct Runtime {
    pub core: Arc<Core>,
    pub progress: Vec<Progress>,
    publisher: Option<crate::registry::Publisher>,
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.publisher.take();
        for p in &self.progress {
            p.stop();
        }
        for p in &mut self.progress {
            p.join();
        }
    }
}

/// A software RDMA device bound to a local IP address. Cheap to clone.
#[derive(Clone)]
pub struct Device {
    pub(crate) rt: Arc<Runtime>,
}

impl std::fmt::Debug for Device {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Device({})", self.rt.core.config.name)
    }
}

impl Device {
    /// Opens a device with default settings on 127.0.0.1.
    pub fn open_default() -> Result<Device> {
        Device::open(DeviceConfig::default())
    }

    /// Opens a device with `config` and starts its progress threads (and,
    /// with `config.same_host`, its same-host segment; without one it
    /// carries on over TCP).
    ///
    /// Fails with [`Error::InvalidArgument`] for zero progress threads or a
    /// `max_ulpdu` outside 128..=65533, and with [`Error::Io`] when a
    /// progress thread or its timer cannot be created.
    pub fn open(config: DeviceConfig) -> Result<Device> {
        if config.progress_threads == 0 {
            return Err(Error::inval("progress_threads must be > 0"));
        }
        // At least room for the largest header (an Atomic Request or a
        // Terminate carrying one: 70 bytes) and some payload.
        if config.max_ulpdu < 128 || config.max_ulpdu > 65533 {
            return Err(Error::inval("max_ulpdu must be 128..=65533"));
        }
        let n = config.progress_threads;
        let shm = if config.same_host {
            match crate::shm::LocalShm::create() {
                Ok(s) => s.map(Arc::new),
                Err(e) => {
                    tracing::warn!(error = %e, "no same-host segment; same-host peers use TCP");
                    None
                }
            }
        } else {
            None
        };
        let core = Arc::new(Core {
            config,
            stags: StagTable::new(shm.clone()),
            pool: shm.as_ref().map(|_| crate::pool::Pool::new()),
            shm,
            peers: Mutex::new(HashMap::new()),
            qps: RwLock::new(HashMap::new()),
            next_qpn: AtomicU32::new(1),
            next_pd: AtomicU32::new(1),
            next_cq: AtomicU32::new(1),
            events: Mutex::new(VecDeque::new()),
            events_cv: Condvar::new(),
            events_woken: Default::default(),
            post_checks: RwLock::new(Vec::new()),
            has_post_checks: std::sync::atomic::AtomicBool::new(false),
            timers: (0..n)
                .map(|_| crate::timers::TimerQueue::new())
                .collect::<std::io::Result<Vec<_>>>()?,
        });
        let mut progress = Vec::with_capacity(n);
        for i in 0..n {
            progress.push(Progress::start(core.clone(), i)?);
        }
        let publisher = if core.config.publish {
            {
                let c = core.clone();
                crate::registry::Publisher::start(&core.config.name, move || c.info(n))
            }
        } else {
            None
        };
        Ok(Device {
            rt: Arc::new(Runtime {
                core,
                progress,
                publisher,
            }),
        })
    }

    /// The device's name (`DeviceConfig::name`), as `softrdma info` lists it.
    pub fn name(&self) -> &str {
        &self.rt.core.config.name
    }

    /// Installs `check` on every SGE posted on this device's QPs and SRQs
    /// (see [`PostCheck`]); returns its id for [`Device::remove_post_check`].
    pub fn add_post_check(&self, check: Arc<dyn PostCheck>) -> u64 {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        let core = &self.rt.core;
        let mut v = core.post_checks.write();
        v.push((id, check));
        core.has_post_checks.store(true, Ordering::Release);
        id
    }

    /// Removes a check installed by [`Device::add_post_check`].
    pub fn remove_post_check(&self, id: u64) {
        let core = &self.rt.core;
        let mut v = core.post_checks.write();
        v.retain(|(i, _)| *i != id);
        core.has_post_checks.store(!v.is_empty(), Ordering::Release);
    }

    /// The local IP address connections are made from and listeners bind to by default.
    pub fn addr(&self) -> IpAddr {
        self.rt.core.config.addr
    }

    /// The device's limits.
    pub fn attr(&self) -> DeviceAttr {
        self.rt.core.config.attr
    }

    /// Allocates a protection domain: the scope of memory registrations and QPs that may use them.
    pub fn alloc_pd(&self) -> Result<ProtectionDomain> {
        let id = self.rt.core.next_pd.fetch_add(1, Ordering::Relaxed);
        Ok(ProtectionDomain {
            dev: self.clone(),
            id,
        })
    }

    /// Creates a completion queue holding up to `depth` completions (further ones are dropped and
    /// counted, see [`CompletionQueue::overflowed`]).
    ///
    /// Fails with [`Error::InvalidArgument`] when `depth` exceeds [`DeviceAttr::max_cqe`].
    pub fn create_cq(&self, depth: usize) -> Result<CompletionQueue> {
        if depth > self.attr().max_cqe as usize {
            return Err(Error::inval("CQ depth above max_cqe"));
        }
        let id = self.rt.core.next_cq.fetch_add(1, Ordering::Relaxed);
        CompletionQueue::new(id, depth)
    }

    /// Waits for the next asynchronous event; `None` at the timeout or
    /// when [`Device::wake_event_waiter`] was called.
    pub fn next_event(&self, timeout: Duration) -> Option<AsyncEvent> {
        let deadline = Instant::now() + timeout;
        let mut q = self.rt.core.events.lock();
        loop {
            if let Some(e) = q.pop_front() {
                return Some(e);
            }
            if self.rt.core.events_woken.swap(false, Ordering::AcqRel) {
                return None;
            }
            if self
                .rt
                .core
                .events_cv
                .wait_until(&mut q, deadline)
                .timed_out()
            {
                return q.pop_front();
            }
        }
    }

    /// Makes the thread waiting in [`Device::next_event`] (or the next one
    /// to wait) return at once, so that it can shorten its timeout. A
    /// wake-up given before the waiter waits is kept for it.
    pub fn wake_event_waiter(&self) {
        let _q = self.rt.core.events.lock();
        self.rt.core.events_woken.store(true, Ordering::Release);
        self.rt.core.events_cv.notify_all();
    }

    /// Benchmark hook (for `benches/engine.rs`, not an API): resolves
    /// `stag` in the STag table exactly as the receive path does for every
    /// tagged segment (read lock, index, key compare, reference taken and
    /// dropped); true if it names a registered region. No access check.
    #[doc(hidden)]
    pub fn bench_stag_lookup(&self, stag: crate::Rkey) -> bool {
        self.rt.core.stags.lookup(stag.raw()).is_some()
    }

    /// A snapshot of the device's resources, like `rdma resource show`.
    pub fn info(&self) -> DeviceInfo {
        self.rt.core.info(self.rt.progress.len())
    }

    pub(crate) fn alloc_qpn(&self) -> u32 {
        self.rt.core.next_qpn.fetch_add(1, Ordering::Relaxed)
    }
}

/// A protection domain.
#[derive(Clone)]
pub struct ProtectionDomain {
    pub(crate) dev: Device,
    pub(crate) id: u32,
}

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ProtectionDomain({})", self.id)
    }
}

impl ProtectionDomain {
    /// The PD's number on its device.
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The device this PD belongs to.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Allocates `len` zeroed, page-aligned bytes and registers them.
    pub fn alloc_mr(&self, len: usize, access: Access) -> Result<MemoryRegion> {
        self.alloc_mr_with(len, access, RegOptions::default())
    }

    /// [`ProtectionDomain::alloc_mr`] with registration options.
    pub fn alloc_mr_with(
        &self,
        len: usize,
        access: Access,
        opts: RegOptions,
    ) -> Result<MemoryRegion> {
        // With a same-host segment, from the shared chunks (peers map them).
        if let Some(pool) = &self.dev.rt.core.pool {
            let a = pool.alloc(len)?;
            let span = RawSpan { ptr: a.ptr, len };
            let chunk = Some((a.fd, a.ino, a.off as u64));
            return self.install(vec![span], Backing::Pool(a), access, opts, false, chunk);
        }
        let buf = AlignedBuf::zeroed(len)?;
        let span = RawSpan {
            ptr: buf.ptr_raw(),
            len,
        };
        self.install(vec![span], Backing::Owned(buf), access, opts, false, None)
    }

    /// Registers a caller-provided buffer, which the region then owns.
    pub fn register(&self, buf: Vec<u8>, access: Access) -> Result<MemoryRegion> {
        self.register_with(buf, access, RegOptions::default())
    }

    /// [`ProtectionDomain::register`] with registration options; an access guard is refused with
    /// [`Error::InvalidArgument`] (it needs [`ProtectionDomain::register_raw`] or
    /// [`ProtectionDomain::register_owned`]).
    pub fn register_with(
        &self,
        buf: Vec<u8>,
        access: Access,
        opts: RegOptions,
    ) -> Result<MemoryRegion> {
        if opts.guard.is_some() {
            return Err(Error::inval(
                "an access guard needs register_raw or register_owned",
            ));
        }
        let mut b = buf;
        let span = RawSpan {
            ptr: b.as_mut_ptr(),
            len: b.len(),
        };
        self.install(vec![span], Backing::Vec(b), access, opts, false, None)
    }

    /// Registers `bytes` for reading only, without a copy: a message's
    /// value that other holders share, lent to a peer where it lies. The
    /// registration keeps `bytes` until its last use, as
    /// [`ProtectionDomain::register_owned`] keeps its owner. `access` may
    /// allow reads alone ([`Access::LOCAL_READ`], [`Access::REMOTE_READ`]):
    /// every path by which the engine writes a region checks a write right
    /// first (a Receive's or a Read's sink and an atomic `LOCAL_WRITE`, a
    /// peer's Write or atomic `REMOTE_WRITE`, an advertisement with remote
    /// write `LOCAL_WRITE`), so the bytes stay as [`bytes::Bytes`] promises
    /// its other holders. Refused ([`Error::InvalidArgument`]): any other
    /// access, no bytes, a shared file or an access guard.
    pub fn register_bytes(
        &self,
        bytes: bytes::Bytes,
        access: Access,
        opts: RegOptions,
    ) -> Result<MemoryRegion> {
        let reads = Access::LOCAL_READ.0 | Access::REMOTE_READ.0;
        if access.0 & !reads != 0 {
            return Err(Error::inval("register_bytes: the bytes may only be read"));
        }
        if bytes.is_empty() {
            return Err(Error::inval("register_bytes: no bytes"));
        }
        if opts.shared.is_some() || opts.guard.is_some() {
            return Err(Error::inval(
                "register_bytes: no shared file or access guard for shared bytes",
            ));
        }
        let (ptr, len) = (bytes.as_ptr().cast_mut(), bytes.len());
        // SAFETY: `bytes` is kept by the registration (the `Arc` below)
        // until its last use, and `Bytes` neither moves nor frees its
        // memory while a handle lives, so `[ptr, ptr + len)` stays valid
        // for reads. It is never written through `ptr`: the region's
        // access allows no write (checked above), and the engine checks a
        // write right before every write into a region.
        unsafe { self.register_raw_inner(ptr, len, access, opts, Some(Arc::new(bytes))) }
    }

    /// Registers memory the caller owns.
    ///
    /// Dropping the region is a NIC's deregistration: the STag stops
    /// working at once, and the drop returns only when the engine no
    /// longer reads or writes the memory (a placement or a send from it in
    /// progress is waited for; it is a bounded copy or a non-blocking
    /// socket call). Work requests still naming it afterwards fail (a
    /// local protection error, or the Terminate their connection ends
    /// with) instead of touching it.
    ///
    /// # Safety
    /// `[ptr, ptr+len)` must be valid for reads and writes and stay so until
    /// the returned region is dropped (remote peers may read or write it at
    /// any time while registered).
    pub unsafe fn register_raw(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
        opts: RegOptions,
    ) -> Result<MemoryRegion> {
        // SAFETY: the caller's contract is ours.
        unsafe { self.register_raw_inner(ptr, len, access, opts, None) }
    }

    /// Registers memory owned by `owner` (a shared-memory mapping, say):
    /// the registration holds `owner` until its last use, so the memory
    /// outlives every work request naming it even if the caller drops its
    /// own handles first.
    ///
    /// # Safety
    /// `[ptr, ptr+len)` must be valid for reads and writes for as long as
    /// `owner` is alive, and nothing else may free or unmap it meanwhile.
    pub unsafe fn register_owned(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
        opts: RegOptions,
        owner: Arc<dyn std::any::Any + Send + Sync>,
    ) -> Result<MemoryRegion> {
        // SAFETY: the caller's contract covers the memory while `owner`
        // lives, and the registration keeps `owner` alive.
        unsafe { self.register_raw_inner(ptr, len, access, opts, Some(owner)) }
    }

    /// # Safety
    /// See [`ProtectionDomain::register_raw`] (`keep`: see `register_owned`).
    unsafe fn register_raw_inner(
        &self,
        ptr: *mut u8,
        len: usize,
        access: Access,
        opts: RegOptions,
        keep: Option<Arc<dyn std::any::Any + Send + Sync>>,
    ) -> Result<MemoryRegion> {
        if ptr.is_null() {
            return Err(Error::inval("null pointer"));
        }
        if let Some(g) = &opts.guard {
            if g.word == 0 || !g.word.is_multiple_of(8) {
                return Err(Error::inval(
                    "an access guard's word must be 8-byte aligned",
                ));
            }
            if g.file_off.is_some() && opts.shared.is_none() {
                return Err(Error::inval(
                    "an access guard's file offset needs a shared file",
                ));
            }
        }
        let (backing, chunk) = match opts.shared {
            Some((fd, off)) => {
                let dup = crate::sys::dup(fd)?;
                let (ino, size) = crate::sys::fd_ino_size(std::os::fd::AsRawFd::as_raw_fd(&dup))?;
                if off.checked_add(len as u64).is_none_or(|end| end > size) {
                    return Err(Error::inval("shared memory range past the end of its file"));
                }
                let fd = std::os::fd::AsRawFd::as_raw_fd(&dup) as u32;
                (Backing::Shared(dup), Some((fd, ino, off)))
            }
            None => (Backing::Raw, None),
        };
        let backing = match keep {
            Some(k) => Backing::Kept(Box::new(backing), k),
            None => backing,
        };
        self.install(
            vec![RawSpan { ptr, len }],
            backing,
            access,
            opts,
            false,
            chunk,
        )
    }

    fn install(
        &self,
        spans: Vec<RawSpan>,
        backing: Backing,
        access: Access,
        opts: RegOptions,
        fast_reg: bool,
        chunk: Option<(u32, u64, u64)>,
    ) -> Result<MemoryRegion> {
        let core = &self.dev.rt.core;
        let (index, key) = opts.reserve(core, self.id)?;
        let iova = opts.iova.unwrap_or(spans[0].ptr as u64);
        // Pin before the STag becomes valid; a failure releases the index.
        let mut pins = Vec::new();
        if !fast_reg && !opts.unpinned {
            for s in &spans {
                match crate::pin::pin(s.ptr, s.len) {
                    Ok(p) => pins.extend(p),
                    Err(e) => {
                        core.stags.release(index);
                        return Err(e);
                    }
                }
            }
        }
        let mr = Arc::new(
            NewMr {
                pd: self.id,
                access,
                iova,
                spans,
                backing,
                invalidatable: opts.invalidatable || fast_reg,
                fast_reg,
                chunk,
                backend: None,
                pins,
                guards: opts.guard.into_iter().collect(),
            }
            .build(Stag::new(index, key).raw()),
        );
        core.stags.install(mr.clone());
        Ok(MemoryRegion {
            dev: self.dev.clone(),
            inner: mr,
            index,
        })
    }

    /// Registers a region of `len` bytes whose contents live in `backend`
    /// (a storage partition, say; see [`crate::RegionBackend`]). It starts
    /// at virtual address `opts.iova` (default 0) and can only be reached
    /// by remote peers: `access` may hold `REMOTE_READ` and `REMOTE_WRITE`,
    /// nothing else. [`MemoryRegion::read_at`] and `write_at` go to the
    /// backend.
    pub fn register_backend(
        &self,
        backend: Arc<dyn crate::RegionBackend>,
        len: u64,
        access: Access,
        opts: RegOptions,
    ) -> Result<MemoryRegion> {
        let remote = Access::REMOTE_READ | Access::REMOTE_WRITE;
        if access.0 & !remote.0 != 0 {
            return Err(Error::inval(
                "a backed region allows only remote read and remote write",
            ));
        }
        if opts.guard.is_some() {
            return Err(Error::inval(
                "an access guard needs register_raw or register_owned",
            ));
        }
        let iova = opts.iova.unwrap_or(0);
        if iova.checked_add(len).is_none() {
            return Err(Error::inval("region end passes 2^64"));
        }
        let core = &self.dev.rt.core;
        let (index, key) = opts.reserve(core, self.id)?;
        let mr = Arc::new(
            NewMr {
                pd: self.id,
                access,
                iova,
                spans: Vec::new(),
                backing: Backing::Raw,
                invalidatable: opts.invalidatable,
                fast_reg: false,
                chunk: None,
                backend: Some((backend, len)),
                pins: Vec::new(),
                guards: Vec::new(),
            }
            .build(Stag::new(index, key).raw()),
        );
        core.stags.install(mr.clone());
        Ok(MemoryRegion {
            dev: self.dev.clone(),
            inner: mr,
            index,
        })
    }

    /// Allocates a fast-register region: an STag index reserved in this PD
    /// and invalid until a [`crate::WrOp::FastReg`] work request binds it
    /// to memory under a new key.
    pub fn alloc_fast_reg_mr(&self) -> Result<FastRegMr> {
        let index = self.dev.rt.core.stags.reserve(None, self.id)?;
        Ok(FastRegMr {
            dev: self.dev.clone(),
            pd: self.id,
            index,
        })
    }
}
