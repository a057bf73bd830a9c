//! The engine's state below the verbs API: per device the [`Core`] (STag
//! table, QPs, timers, async events, consumer post checks), per QP the
//! [`QpInner`] (state, send queue with the ORQ, receive queue, the flush on
//! error), the work-queue entries, and what a shared receive queue holds.
//! The API handles (`device.rs`, `qp.rs`, `srq.rs`, `cm.rs`) sit above it
//! and nothing here names them. The transports (`iwarp`, `local`) sit
//! below it in the sense that matters: they use its queues, and it reaches
//! them only through the [`Transport`] trait (`transport.rs`), so nothing
//! here names them either.

use crate::error::{Error, Result};
use crate::mr::{Access, Backing, MrInner, NewMr, StagTable};
use crate::registry::{DeviceInfo, MrInfo, QpInfo};
use crate::stag::Stag;
use crate::sys::RawSpan;
use parking_lot::{Condvar, Mutex, RwLock};
use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

mod oneshot;
mod qp;
mod queues;
mod sink;
mod transport;
pub(crate) use oneshot::{Advert, AdvertHold, Close, OneShot};
pub use qp::QpCaps;
pub(crate) use qp::QpInner;
pub(crate) use queues::{RecvWqe, Sq, SqWqe, Stage};
pub(crate) use sink::Sink;
pub(crate) use transport::Transport;

/// Limits of a device (`ibv_query_device`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceAttr {
    /// Most QPs per device.
    pub max_qp: u32,
    /// Most work requests per send or receive queue.
    pub max_qp_wr: u32,
    /// Most SGEs per send or receive work request.
    pub max_sge: u32,
    /// Most local SGEs of an RDMA Read (`ibv_device_attr.max_sge_rd`): a
    /// Read into several is given one sink STag bound over them
    /// (`engine/sink.rs`), so any peer can answer it.
    pub max_sge_rd: u32,
    /// Most completions per CQ.
    pub max_cqe: u32,
    /// Most memory regions (STag indices) per device.
    pub max_mr: u32,
    /// Largest message (Send, Write or Read) in bytes.
    pub max_msg_size: u64,
    /// Inbound RDMA Reads per QP.
    pub max_ird: u16,
    /// Outbound RDMA Reads per QP.
    pub max_ord: u16,
}

impl Default for DeviceAttr {
    fn default() -> Self {
        DeviceAttr {
            max_qp: 16384,
            max_qp_wr: 16384,
            max_sge: 32,
            max_sge_rd: 32,
            max_cqe: 1 << 20,
            max_mr: (1 << 24) - 1,
            max_msg_size: 1 << 31,
            max_ird: 128,
            max_ord: 128,
        }
    }
}

/// How a device is opened.
#[derive(Debug, Clone)]
pub struct DeviceConfig {
    /// The device's name (in `softrdma info` and logs).
    pub name: String,
    /// The local address the device is bound to (connections are made from
    /// it; listeners default to it).
    pub addr: IpAddr,
    /// Progress threads (like a NIC's engines); QPs are spread over them.
    pub progress_threads: usize,
    /// Largest ULPDU this side sends in one FPDU (at most 65535 - 2).
    pub max_ulpdu: usize,
    /// The device's limits, as [`crate::Device::attr`] reports them.
    pub attr: DeviceAttr,
    /// Publish the device's resources for `softrdma info`.
    pub publish: bool,
    /// Offer the same-host transport to softrdma peers on this host that
    /// connect with extensions (`docs/same-host.md`): they then reach this
    /// device's registered memory directly, with every access checked
    /// against its STag table. Default: on, unless the environment sets
    /// `SOFTRDMA_SAME_HOST=0` (like `UCX_TLS`: lets an operator, or a
    /// benchmark measuring the network path, turn it off for every
    /// softrdma process without a flag in each application).
    pub same_host: bool,
    /// How long a responder (a passive side not in peer-to-peer mode,
    /// with a peer that is not softrdma) waits for the initiator's first
    /// FPDU before it transmits anyway. RFC 5044 section 7.1.2 rule 4 says
    /// a responder must not send before it has received an FPDU; Linux siw
    /// as initiator fails the connection (EPROTO) when an FPDU arrives
    /// with the MPA reply. Waiting forever would deadlock applications in
    /// which the passive side speaks first (perftest's `ib_write_lat`
    /// server writes first), hence the grace period. Default 200 ms.
    pub responder_hold: std::time::Duration,
    /// A listener's whole-frame deadline for a connection's MPA request
    /// (each connection on its own: see [`crate::Listener`]). Default 5 s.
    pub handshake_timeout: std::time::Duration,
    /// How long a connection may keep a storage-backed Read Response
    /// waiting for the peer to read it (its receiver paused meanwhile: a
    /// Read larger than the connection's buffer budget is streamed) before
    /// the peer counts as not reading and the QP fails. Default 30 s.
    pub tx_stall_timeout: std::time::Duration,
    /// How long a Send (or Immediate Data) that finds no posted receive
    /// waits for one before the Terminate of RFC 5041 ("invalid MSN, no
    /// buffer available"). InfiniBand's requester retries after a
    /// receiver-not-ready NAK, and applications written for it (qperf's
    /// `rc_bw`) let their sender run ahead of the receives they repost;
    /// iWARP has no such retry, and Linux siw terminates at once. Here the
    /// receiver leaves the Send unread meanwhile (TCP's flow control holds
    /// the sender back), and it lands in the first receive posted. Zero:
    /// terminate at once, as siw does. Default 1 s.
    pub recv_wait: std::time::Duration,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            name: "softrdma0".into(),
            addr: IpAddr::from([127, 0, 0, 1]),
            progress_threads: 2,
            max_ulpdu: softrdma_wire::mpa::max_ulpdu_for(65535),
            attr: DeviceAttr::default(),
            publish: true,
            same_host: crate::samehost::same_host_default(),
            responder_hold: std::time::Duration::from_millis(200),
            handshake_timeout: std::time::Duration::from_secs(5),
            tx_stall_timeout: std::time::Duration::from_secs(30),
            recv_wait: std::time::Duration::from_secs(1),
        }
    }
}

/// An asynchronous event (`ibv_get_async_event` / rdma_cm events after
/// establishment).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AsyncEvent {
    /// The peer closed the connection (graceful or not) or we disconnected.
    Disconnected {
        /// The QP.
        qpn: crate::Qpn,
    },
    /// The QP went to ERROR because of a Terminate (sent or received).
    Terminated {
        /// The QP.
        qpn: crate::Qpn,
        /// The Terminate's layer, type and code.
        code: softrdma_wire::TermCode,
        /// The peer sent it (else this end did).
        by_peer: bool,
    },
    /// The QP went to ERROR for a local reason.
    QpFatal {
        /// The QP.
        qpn: crate::Qpn,
        /// What went wrong.
        reason: String,
    },
    /// An SQD transition finished draining.
    SqDrained {
        /// The QP.
        qpn: crate::Qpn,
    },
}

/// State shared by every handle of a device and its progress threads.
pub(crate) struct Core {
    pub config: DeviceConfig,
    pub stags: StagTable,
    /// This device's same-host segment (`shm.rs`), if offered.
    pub shm: Option<Arc<crate::shm::LocalShm>>,
    /// Peer segments mapped here, by (pid, nonce).
    pub peers: crate::samehost::PeerMap,
    /// Shared chunks `alloc_mr` takes memory from (with a segment only).
    pub pool: Option<Arc<crate::pool::Pool>>,
    pub qps: RwLock<HashMap<u32, Arc<QpInner>>>,
    pub(crate) next_qpn: AtomicU32,
    pub(crate) next_pd: AtomicU32,
    pub(crate) next_cq: AtomicU32,
    pub(crate) events: Mutex<VecDeque<AsyncEvent>>,
    pub(crate) events_cv: Condvar,
    /// [`crate::Device::wake_event_waiter`] asked the waiter in
    /// [`crate::Device::next_event`] to return (set and read under
    /// `events`, so no wake-up is lost).
    pub(crate) events_woken: std::sync::atomic::AtomicBool,
    /// Consumer checks run on every posted SGE ([`Device::add_post_check`]).
    pub(crate) post_checks: RwLock<Vec<(u64, Arc<dyn PostCheck>)>>,
    pub(crate) has_post_checks: std::sync::atomic::AtomicBool,
    /// One per progress thread (`progress::add_timer`).
    pub timers: Vec<crate::timers::TimerQueue>,
}

/// A consumer's check of every local SGE posted on a device (a send or a
/// receive work request), run before the request is queued; an error
/// refuses the whole post with [`Error::InvalidArgument`]. The
/// registered-memory heap uses it to prove, in debug builds, that no work
/// request names a registration whose block was released
/// (`softrdma-heap`).
pub trait PostCheck: Send + Sync {
    /// Checks one SGE; an `Err` explains the refusal and fails the post.
    fn check(&self, sge: &crate::Sge) -> std::result::Result<(), String>;
}

impl Core {
    /// Runs the consumers' post checks on `sgl` (nothing when none).
    #[inline]
    pub fn check_post(&self, sgl: &[crate::Sge]) -> Result<()> {
        if !self.has_post_checks.load(Ordering::Acquire) {
            return Ok(());
        }
        for (_, c) in self.post_checks.read().iter() {
            for sge in sgl {
                c.check(sge).map_err(Error::inval)?;
            }
        }
        Ok(())
    }

    pub fn post_event(&self, ev: AsyncEvent) {
        tracing::debug!(?ev, "async event");
        let mut q = self.events.lock();
        if q.len() > 65536 {
            q.pop_front();
        }
        q.push_back(ev);
        self.events_cv.notify_all();
    }

    pub fn qp(&self, qpn: u32) -> Option<Arc<QpInner>> {
        self.qps.read().get(&qpn).cloned()
    }
}

/// Segments a receiver handles per call before it yields (the progress
/// thread then turns to its other QPs).
pub(crate) const RX_BUDGET: usize = 512;

/// The progress threads serve the device's QPs through their transports.
impl crate::progress::Host for Core {
    fn timers(&self, idx: usize) -> &crate::timers::TimerQueue {
        &self.timers[idx]
    }
    fn on_timer(&self, qpn: u32) {
        if let Some(q) = self.qp(qpn) {
            // One-shot deadlines (`oneshot.rs`) share the QP's timers.
            q.expire_adverts();
            if let Some(t) = q.transport.get() {
                t.on_timer(&q);
            }
        }
    }
    fn on_readable(&self, qpn: u32) -> bool {
        self.qp(qpn).is_some_and(|q| q.on_readable(RX_BUDGET))
    }
    fn on_writable(&self, qpn: u32) {
        if let Some(q) = self.qp(qpn) {
            if let Some(t) = q.transport.get() {
                t.on_writable(&q);
            }
        }
    }
}

impl Core {
    pub(crate) fn info(&self, progress_threads: usize) -> DeviceInfo {
        let core = self;
        let mut qps: Vec<QpInfo> = core.qps.read().values().map(|q| q.info()).collect();
        qps.sort_by_key(|q| q.qpn);
        let mut mrs: Vec<MrInfo> = core
            .stags
            .all()
            .iter()
            .map(|m| MrInfo {
                stag: m.stag,
                pd: m.pd,
                iova: m.iova,
                len: m.len,
                access: m.access_now(),
                valid: m.valid.load(Ordering::Acquire),
                fast_reg: m.fast_reg,
            })
            .collect();
        mrs.sort_by_key(|m| m.stag);
        DeviceInfo {
            name: core.config.name.clone(),
            addr: core.config.addr,
            progress_threads,
            qps,
            mrs,
            shared_bytes: core.pool.as_ref().map_or(0, |p| p.in_use()),
        }
    }
}

/// Builds and installs the registration a fast-register work request
/// binds: `spans` (memory of the `keep` regions) at `iova` under a new key.
#[allow(clippy::too_many_arguments)]
pub(crate) fn fast_reg_build(
    core: &Core,
    pd: u32,
    index: u32,
    key: u8,
    iova: u64,
    access: Access,
    keep: Vec<Arc<MrInner>>,
    spans: Vec<RawSpan>,
) {
    core.stags
        .install(Arc::new(binding(pd, index, key, iova, access, keep, spans)));
}

/// Builds and installs a one-shot advertisement's binding
/// (`docs/one-shot.md`): like [`fast_reg_build`] at address 0, but gated
/// (`MrInner::gated`: its release waits until no access through it is in
/// flight, whoever owns the memory, so a cancel returns only once the
/// engine is done with the memory) and refusing every access from
/// `deadline` on (a `sys::mono_ns` instant, `mr::NO_DEADLINE`: none), as
/// a region's `set_valid_until` does, before any thread acts on it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn one_shot_build(
    core: &Core,
    pd: u32,
    index: u32,
    key: u8,
    access: Access,
    keep: Vec<Arc<MrInner>>,
    spans: Vec<RawSpan>,
    deadline: u64,
) {
    let mut mr = binding(pd, index, key, 0, access, keep, spans);
    mr.gated = true;
    mr.fenced = true;
    mr.deadline = std::sync::atomic::AtomicU64::new(deadline);
    core.stags.install(Arc::new(mr));
}

fn binding(
    pd: u32,
    index: u32,
    key: u8,
    iova: u64,
    access: Access,
    keep: Vec<Arc<MrInner>>,
    spans: Vec<RawSpan>,
) -> MrInner {
    let guards = keep.iter().flat_map(|p| p.guards.iter().copied()).collect();
    NewMr {
        pd,
        access,
        iova,
        spans,
        backing: Backing::Parents(keep),
        invalidatable: true,
        fast_reg: true,
        chunk: None,
        backend: None,
        pins: Vec::new(), // the parents are pinned
        guards,
    }
    .build(Stag::new(index, key).raw())
}

pub(crate) struct SrqInner {
    pub pd: u32,
    pub max_wr: usize,
    pub max_sge: usize,
    pub q: Mutex<VecDeque<RecvWqe>>,
    /// QPs whose receiver waits for a receive (see
    /// [`DeviceConfig::recv_wait`]): told at the next post.
    pub waiters: Mutex<Vec<std::sync::Weak<QpInner>>>,
}
