//! The C structures applications see, each the first field of a Rust
//! object that holds the engine's handle, and the process's one engine
//! device. A pointer an application passes back is turned into the Rust
//! object here (`*_of`), nowhere else.
//!
//! Ownership: every object is a `Box` leaked to the application at
//! creation and taken back by its destroy call (`ibv_dealloc_pd`,
//! `ibv_destroy_qp`, ...). The engine's handles inside are reference
//! counted, so memory the engine may still touch (a registration a work
//! request holds) outlives the application's handle.

use crate::abi::*;
use crate::config::{self, Config};
use parking_lot::Mutex;
use softrdma_verbs::{
    CompletionQueue, Device, DeviceConfig, MemoryRegion, ProtectionDomain, QueuePair,
};
use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::OnceLock;

/// The process's engine device and its C face.
pub struct Runtime {
    pub dev: Device,
    pub cfg: Config,
    ibdev: DevPtr,
    /// Live QPs by number: where their asynchronous events go.
    pub qps: Mutex<HashMap<u32, QpRoute>>,
    /// The QPs a spinning poller drives, and its lease (`spin`).
    pub spin: crate::spin::Spin,
    /// Posts held for the next poll (`cork`).
    pub cork: crate::cork::Cork,
    /// Registered `malloc` memory moved into memfds (`share`).
    pub share: crate::share::Share,
    /// What the connection manager does when a QP of one of its ids
    /// disconnects (set by `cm`, called by the event thread, `events.rs`).
    pub on_disconnected: OnceLock<fn(usize)>,
}

struct DevPtr(*mut ibv_device);
// SAFETY: the `ibv_device` is written once at start-up and only read after
// (applications read its name and types); it is never freed.
unsafe impl Send for DevPtr {}
// SAFETY: as above.
unsafe impl Sync for DevPtr {}

/// Where a QP's events go: the context of its asynchronous events and,
/// for a QP made by librdmacm, the CM id whose channel hears its
/// disconnection. Addresses (the objects are the application's).
#[derive(Clone, Copy, Debug)]
pub struct QpRoute {
    pub ctx: usize,
    pub qp: usize,
    pub cm_id: usize,
}

fn fill_name(dst: &mut [libc::c_char], s: &str) {
    for (d, b) in dst.iter_mut().zip(s.bytes().chain(std::iter::once(0))) {
        *d = b as libc::c_char;
    }
}

static RT: OnceLock<Result<Runtime, String>> = OnceLock::new();

/// The runtime, opened on first use; `Err(ENODEV)` if the engine could
/// not start (said once on stderr).
pub fn runtime() -> Result<&'static Runtime, i32> {
    let r = RT.get_or_init(|| {
        config::init_logging();
        let cfg = Config::from_env();
        let dc = DeviceConfig {
            addr: cfg.addr,
            ..DeviceConfig::default()
        };
        match Device::open(dc) {
            Ok(dev) => {
                // SAFETY: `ibv_device` is plain data; all zeroes is valid.
                let mut d: ibv_device = unsafe { std::mem::zeroed() };
                d.node_type = IBV_NODE_RNIC;
                d.transport_type = IBV_TRANSPORT_IWARP;
                fill_name(&mut d.name, dev.name());
                fill_name(&mut d.dev_name, "uverbs0");
                fill_name(&mut d.dev_path, "/sys/class/infiniband_verbs/uverbs0");
                fill_name(
                    &mut d.ibdev_path,
                    &format!("/sys/class/infiniband/{}", dev.name()),
                );
                tracing::info!(device = dev.name(), addr = %cfg.addr, "softrdma libibverbs ready");
                let rt = Runtime {
                    dev,
                    cfg,
                    ibdev: DevPtr(Box::into_raw(Box::new(d))),
                    qps: Mutex::new(HashMap::new()),
                    spin: Default::default(),
                    cork: Default::default(),
                    share: Default::default(),
                    on_disconnected: OnceLock::new(),
                };
                Ok(rt)
            }
            Err(e) => Err(e.to_string()),
        }
    });
    match r {
        Ok(rt) => Ok(rt),
        Err(e) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| eprintln!("softrdma: the device did not start: {e}"));
            Err(libc::ENODEV)
        }
    }
}

impl Runtime {
    pub fn ibv_device(&self) -> *mut ibv_device {
        self.ibdev.0
    }
}

/// An eventfd counting queued events (semaphore mode: each read takes
/// one), blocking unless the application set `O_NONBLOCK` on it: the fd of
/// an asynchronous-event queue or of a CM event channel.
pub fn semaphore_fd() -> Result<OwnedFd, i32> {
    // SAFETY: eventfd has no memory arguments.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_SEMAPHORE) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EMFILE));
    }
    // SAFETY: `fd` was just created and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Adds one to a semaphore fd.
pub fn post_semaphore(fd: RawFd) {
    let one: u64 = 1;
    // SAFETY: writes 8 bytes from a live u64 to an eventfd.
    unsafe { libc::write(fd, (&one as *const u64).cast(), 8) };
}

/// Takes one from a semaphore fd: blocks unless the fd is non-blocking;
/// `Err(errno)` (EAGAIN, EINTR) otherwise.
pub fn take_semaphore(fd: RawFd) -> Result<(), i32> {
    let mut v: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64.
    let n = unsafe { libc::read(fd, (&mut v as *mut u64).cast(), 8) };
    if n == 8 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO))
    }
}

/// An asynchronous event waiting in a context's queue.
#[derive(Clone, Copy, Debug)]
pub struct AsyncEv {
    pub kind: ibv_event_type,
    /// The QP or CQ address (by kind), 0 for a port event.
    pub object: usize,
}

/// `struct ibv_context` (inside `struct verbs_context`) and its state.
#[repr(C)]
pub struct Ctx {
    pub v: verbs_context,
    pub rt: &'static Runtime,
    pub events: Mutex<VecDeque<AsyncEv>>,
    pub async_fd: OwnedFd,
}

impl Ctx {
    /// A context without its operations (`verbs_device` fills them).
    pub fn new(rt: &'static Runtime) -> Result<Box<Ctx>, i32> {
        let async_fd = semaphore_fd()?;
        // SAFETY: `verbs_context` is plain data (pointers, integers,
        // optional function pointers, a pthread mutex whose all-zero value
        // is PTHREAD_MUTEX_INITIALIZER on glibc); all zeroes is valid.
        let mut v: verbs_context = unsafe { std::mem::zeroed() };
        v.sz = std::mem::size_of::<verbs_context>() as size_t;
        v.context.device = rt.ibv_device();
        v.context.cmd_fd = -1;
        v.context.async_fd = async_fd.as_raw_fd();
        v.context.num_comp_vectors = 1;
        // `verbs_get_ctx` in verbs.h: the extended ops are there.
        v.context.abi_compat = usize::MAX as *mut libc::c_void;
        Ok(Box::new(Ctx {
            v,
            rt,
            events: Mutex::new(VecDeque::new()),
            async_fd,
        }))
    }

    pub fn push_event(&self, ev: AsyncEv) {
        self.events.lock().push_back(ev);
        post_semaphore(self.async_fd.as_raw_fd());
    }

    pub fn ibv(&mut self) -> *mut ibv_context {
        &mut self.v.context
    }
}

/// The Rust object behind an application's `ibv_context`.
///
/// # Safety
/// `c` is null or was returned by `ibv_open_device` and not closed.
pub unsafe fn ctx_of<'a>(c: *mut ibv_context) -> Option<&'a Ctx> {
    if c.is_null() {
        return None;
    }
    let off = std::mem::offset_of!(verbs_context, context);
    // SAFETY: the context is the `context` field of the `verbs_context`
    // that starts a `Ctx` (repr(C)), per the caller's contract.
    Some(unsafe { &*(c.cast::<u8>().sub(off).cast::<Ctx>()) })
}

/// `struct ibv_pd` and the engine's protection domain.
#[repr(C)]
pub struct Pd {
    pub ibv: ibv_pd,
    pub pd: ProtectionDomain,
}

/// # Safety
/// `p` is null or was returned by `ibv_alloc_pd` and not freed.
pub unsafe fn pd_of<'a>(p: *mut ibv_pd) -> Option<&'a Pd> {
    // SAFETY: `ibv_pd` is the first field of a repr(C) `Pd`.
    unsafe { p.cast::<Pd>().as_ref() }
}

/// `struct ibv_mr` and the engine's registration.
#[repr(C)]
pub struct Mr {
    pub ibv: ibv_mr,
    pub mr: MemoryRegion,
}

/// # Safety
/// `m` is null or was returned by a registration call and not deregistered.
pub unsafe fn mr_of<'a>(m: *mut ibv_mr) -> Option<&'a Mr> {
    // SAFETY: `ibv_mr` is the first field of a repr(C) `Mr`.
    unsafe { m.cast::<Mr>().as_ref() }
}

/// `struct ibv_comp_channel`: its fd is an epoll instance over the event
/// fds of the CQs bound to it, so the application can poll it and
/// `ibv_get_cq_event` learns which CQ fired.
#[repr(C)]
pub struct Channel {
    pub ibv: ibv_comp_channel,
    pub ep: OwnedFd,
}

/// # Safety
/// `c` is null or was returned by `ibv_create_comp_channel` and not destroyed.
pub unsafe fn channel_of<'a>(c: *mut ibv_comp_channel) -> Option<&'a Channel> {
    // SAFETY: `ibv_comp_channel` is the first field of a repr(C) `Channel`.
    unsafe { c.cast::<Channel>().as_ref() }
}

/// `struct ibv_cq` and the engine's completion queue.
#[repr(C)]
pub struct Cq {
    pub ibv: ibv_cq,
    pub cq: CompletionQueue,
    pub overrun_said: std::sync::atomic::AtomicBool,
}

/// # Safety
/// `c` is null or was returned by `ibv_create_cq` and not destroyed.
pub unsafe fn cq_of<'a>(c: *mut ibv_cq) -> Option<&'a Cq> {
    // SAFETY: `ibv_cq` is the first field of a repr(C) `Cq`.
    unsafe { c.cast::<Cq>().as_ref() }
}

/// Buffers for `IBV_SEND_INLINE` data: the engine sends from registered
/// memory, so inline data is copied at post time into a slot of a region
/// the QP owns. There are `2 * max_send_wr` slots taken in turn and a slot
/// moves on only when its post succeeded: the send queue holds at most
/// `max_send_wr` WRs, all among the last `max_send_wr` successful posts,
/// so the slot a post writes is never one a queued WR still reads.
pub struct InlineRing {
    pub mr: MemoryRegion,
    pub slot: usize,
    pub slots: usize,
    pub next: usize,
}

/// `struct ibv_qp` and the engine's queue pair.
#[repr(C)]
pub struct Qp {
    pub ibv: ibv_qp,
    /// Shared with a connection in progress (`rdma_connect` runs on its
    /// own thread), so destroying the QP meanwhile frees nothing it uses.
    pub qp: std::sync::Arc<QueuePair>,
    /// What the QP got (`ibv_create_qp` wrote it back; `ibv_query_qp`
    /// reports it).
    pub cap: ibv_qp_cap,
    pub inline: Mutex<Option<InlineRing>>,
    pub send_cq: usize,
    pub recv_cq: usize,
    /// The engine's handle of the send CQ: how many completions wait
    /// there decides whether a post is held (`cork`). A handle, not the
    /// `Cq` at `send_cq`: an application may destroy that first.
    pub send_cq_handle: softrdma_verbs::CompletionQueue,
}

/// # Safety
/// `q` is null or was returned by `ibv_create_qp` and not destroyed.
pub unsafe fn qp_of<'a>(q: *mut ibv_qp) -> Option<&'a Qp> {
    // SAFETY: `ibv_qp` is the first field of a repr(C) `Qp`.
    unsafe { q.cast::<Qp>().as_ref() }
}
