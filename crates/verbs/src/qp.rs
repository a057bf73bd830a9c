//! RC queue pairs, the verbs API: creation, state transitions, posting
//! (checks, then the WR queued and the transmitter kicked), busy polling,
//! disconnect. The QP's state, in-order completion and the flush on error
//! are the engine's (`engine/qp.rs`); the wire side lives in
//! [`crate::iwarp`].

use crate::cq::{CompletionQueue, WcOpcode, WcStatus, WorkCompletion};
use crate::device::ProtectionDomain;
use crate::error::{Error, Result};
use crate::mr::{Access, MrInner};
pub use crate::qp_state::QpState;

mod oneshot;
mod regcache;
pub use crate::engine::QpCaps;
pub(crate) use crate::engine::QpInner;
pub(crate) use crate::engine::{RecvWqe, Sq, SqWqe, Stage};
use crate::srq::SharedReceiveQueue;
use crate::wr::{RecvWr, SendWr, WrOp};
pub use oneshot::{REG_CACHE_IDLE_BYTES, REG_CACHE_IDLE_MAX};
use parking_lot::Mutex;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// How a QP is created (`ibv_qp_init_attr`).
#[derive(Debug, Clone)]
pub struct QpInitAttr {
    /// The CQ that send work requests complete on.
    pub send_cq: CompletionQueue,
    /// The CQ that receive work requests complete on.
    pub recv_cq: CompletionQueue,
    /// A shared receive queue to take receive buffers from instead of the QP's own.
    pub srq: Option<SharedReceiveQueue>,
    /// Queue sizes.
    pub caps: QpCaps,
    /// Every send WR generates a completion, whatever its flags.
    pub sq_sig_all: bool,
    /// Relaxed ordering: on a QP connected to a local region
    /// ([`QueuePair::connect_local`]), WRs run at once and complete out of
    /// order; fences and flushes still order (`local.rs`). RC QPs on a
    /// connection keep RDMA's order.
    pub relaxed_ordering: bool,
}

impl QpInitAttr {
    /// Attributes for a QP whose sends and receives both complete on `cq`, with default sizes.
    pub fn new(cq: &CompletionQueue) -> QpInitAttr {
        QpInitAttr {
            send_cq: cq.clone(),
            recv_cq: cq.clone(),
            srq: None,
            caps: QpCaps::default(),
            sq_sig_all: false,
            relaxed_ordering: false,
        }
    }
}

/// An RC queue pair. Dropping it closes its connection and flushes it.
pub struct QueuePair {
    pub(crate) inner: Arc<QpInner>,
    pub(crate) pd: ProtectionDomain,
    _srq: Option<SharedReceiveQueue>,
    /// Registrations [`QueuePair::advertise_buffers`] made for caller
    /// memory (`qp/regcache.rs`); the rest are dropped with the QP.
    reg_cache: Arc<regcache::RegCache>,
}

impl std::fmt::Debug for QueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QueuePair({}, {:?})", self.inner.qpn, self.inner.state())
    }
}

impl QueuePair {
    pub(crate) fn create(pd: &ProtectionDomain, attr: QpInitAttr) -> Result<QueuePair> {
        let core = pd.dev.rt.core.clone();
        let dattr = core.config.attr;
        let c = attr.caps;
        if c.max_send_wr == 0 || c.max_send_wr > dattr.max_qp_wr as usize {
            return Err(Error::inval("max_send_wr out of range"));
        }
        if attr.srq.is_none() && (c.max_recv_wr == 0 || c.max_recv_wr > dattr.max_qp_wr as usize) {
            return Err(Error::inval("max_recv_wr out of range"));
        }
        if c.max_send_sge == 0 || c.max_send_sge > dattr.max_sge as usize {
            return Err(Error::inval("max_send_sge out of range"));
        }
        if c.max_recv_sge > dattr.max_sge as usize {
            return Err(Error::inval("max_recv_sge out of range"));
        }
        if let Some(s) = &attr.srq {
            if s.inner.pd != pd.id {
                return Err(Error::inval("SRQ belongs to another protection domain"));
            }
        }
        if core.qps.read().len() >= dattr.max_qp as usize {
            return Err(Error::Exhausted("queue pairs"));
        }
        let qpn = pd.dev.alloc_qpn();
        let inner = Arc::new(QpInner {
            qpn,
            pd: pd.id,
            core: core.clone(),
            send_cq: attr.send_cq.inner.clone(),
            recv_cq: attr.recv_cq.inner.clone(),
            srq: attr.srq.as_ref().map(|s| s.inner.clone()),
            caps: c,
            sig_all: attr.sq_sig_all,
            state: AtomicU8::new(QpState::Reset as u8),
            sq: Mutex::new(Sq {
                wqes: VecDeque::new(),
                next_seq: 1,
                next_tx: 1,
                orq: VecDeque::new(),
                sqd_pending: false,
            }),
            rq: Mutex::new(VecDeque::new()),
            transport: OnceLock::new(),
            one_shot: Mutex::new(Default::default()),
            next_key: Default::default(),
            relaxed: attr.relaxed_ordering,
            flushed: Default::default(),
        });
        core.qps.write().insert(qpn, inner.clone());
        Ok(QueuePair {
            inner,
            pd: pd.clone(),
            _srq: attr.srq,
            reg_cache: Default::default(),
        })
    }

    /// The QP's number on its device.
    pub fn qp_num(&self) -> crate::Qpn {
        crate::Qpn::from_raw(self.inner.qpn)
    }

    /// The QP's current state.
    pub fn state(&self) -> QpState {
        self.inner.state()
    }

    /// The protection domain the QP was created in.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// What the same-host transport did for this QP's Writes and Reads
    /// (`None` without one: another host, or not negotiated).
    pub fn same_host_stats(&self) -> Option<crate::samehost::SameHostStats> {
        let link = self.iwarp()?.link.as_ref()?;
        link.direct().then(|| link.stats())
    }

    /// The iWARP connection, once connected over TCP (or a simulated pipe).
    fn iwarp(&self) -> Option<&crate::iwarp::Conn> {
        self.inner
            .transport
            .get()?
            .as_any()
            .downcast_ref::<crate::iwarp::Conn>()
    }

    /// Negotiated connection parameters, once connected.
    pub fn conn_params(&self) -> Option<crate::negotiated::Negotiated> {
        self.inner.negotiated()
    }

    /// The local TCP address, once connected over TCP.
    pub fn local_addr(&self) -> Option<std::net::SocketAddr> {
        self.inner.transport.get()?.addrs().map(|a| a.0)
    }

    /// The peer's TCP address, once connected over TCP.
    pub fn peer_addr(&self) -> Option<std::net::SocketAddr> {
        self.inner.transport.get()?.addrs().map(|a| a.1)
    }

    /// Connects this QP, without a network, to the regions of its own
    /// device (`local.rs`): its RDMA Writes, Reads and Flushes name an rkey
    /// of this device (a storage endpoint's partition, or any region in
    /// the QP's protection domain) and are executed with the checks a
    /// remote peer gets, in strict or relaxed order
    /// ([`QpInitAttr::relaxed_ordering`]). Sends and atomics are not
    /// supported on such a QP (`LocQpOpErr`). The QP goes to RTS.
    pub fn connect_local(&self) -> Result<()> {
        let q = &self.inner;
        let s = q.state();
        if !matches!(s, QpState::Reset | QpState::Init) || q.transport.get().is_some() {
            return Err(Error::BadState {
                qpn: q.qpn,
                state: s,
            });
        }
        let link = crate::local::LocalLink::start(q, q.relaxed);
        if q.transport
            .set(link as Arc<dyn crate::engine::Transport>)
            .is_err()
        {
            return Err(Error::inval("already connected locally"));
        }
        q.set_state(QpState::Rts);
        Ok(())
    }

    /// `ibv_modify_qp` for the state. RTS is reached through the connection
    /// manager ([`QueuePair::connect`], [`crate::ConnectRequest::accept`]);
    /// here RTS is only allowed back from SQD.
    pub fn modify(&self, to: QpState) -> Result<()> {
        let q = &self.inner;
        let from = q.state();
        let ok = match (from, to) {
            (_, QpState::Error) => {
                q.fail(WcStatus::WrFlushErr, None);
                return Ok(());
            }
            (QpState::Reset, QpState::Init) => true,
            (QpState::Init, QpState::Init) => true,
            (QpState::Init, QpState::Rtr) => true,
            (QpState::Rts, QpState::Sqd) => {
                let mut sq = q.sq.lock();
                q.set_state(QpState::Sqd);
                sq.sqd_pending = true;
                q.complete_in_order(&mut sq);
                return Ok(());
            }
            (QpState::Sqd, QpState::Rts) => {
                let mut sq = q.sq.lock();
                q.set_state(QpState::Rts);
                sq.sqd_pending = false;
                q.kick_with(sq);
                return Ok(());
            }
            (QpState::Error, QpState::Reset) => q.transport.get().is_none_or(|t| t.allows_reset()),
            _ => false,
        };
        if !ok {
            return Err(Error::BadState {
                qpn: q.qpn,
                state: from,
            });
        }
        q.set_state(to);
        Ok(())
    }

    /// Posts a receive.
    pub fn post_recv(&self, wr: &RecvWr) -> Result<()> {
        let q = &self.inner;
        if q.srq.is_some() {
            return Err(Error::inval("QP uses a shared receive queue"));
        }
        if wr.sgl.len() > q.caps.max_recv_sge {
            return Err(Error::inval("too many SGEs"));
        }
        q.core.check_post(&wr.sgl)?;
        match q.state() {
            QpState::Reset => {
                return Err(Error::BadState {
                    qpn: q.qpn,
                    state: QpState::Reset,
                })
            }
            QpState::Error => {
                q.recv_cq.push(WorkCompletion {
                    wr_id: wr.wr_id,
                    status: WcStatus::WrFlushErr,
                    opcode: WcOpcode::Recv,
                    qp_num: crate::Qpn::from_raw(q.qpn),
                    ..Default::default()
                });
                return Ok(());
            }
            _ => {}
        }
        let wqe = RecvWqe::resolve(&q.core, q.pd, wr)?;
        let mut rq = q.rq.lock();
        if rq.len() >= q.caps.max_recv_wr {
            return Err(Error::RecvQueueFull);
        }
        rq.push_back(wqe);
        drop(rq);
        // A receiver waiting for a receive goes on now.
        if let Some(t) = q.transport.get() {
            t.on_recv_posted(q);
        }
        if q.state() == QpState::Error {
            // Raced with a flush: flush what we just added.
            q.fail(WcStatus::WrFlushErr, None);
            let rest: Vec<RecvWqe> = q.rq.lock().drain(..).collect();
            for w in rest {
                q.recv_cq.push(WorkCompletion {
                    wr_id: w.wr_id,
                    status: WcStatus::WrFlushErr,
                    opcode: WcOpcode::Recv,
                    qp_num: crate::Qpn::from_raw(q.qpn),
                    ..Default::default()
                });
            }
        }
        Ok(())
    }

    /// Posts one send-queue work request.
    pub fn post_send(&self, wr: &SendWr) -> Result<()> {
        self.post_send_batch(std::slice::from_ref(wr))
    }

    /// Posts several send-queue work requests with one doorbell.
    ///
    /// Local SGEs are resolved here: a WR naming an invalid lkey or memory
    /// outside its region completes with `LocProtErr` and moves the QP to
    /// ERROR (as on hardware); the regions stay alive until the WR completes.
    pub fn post_send_batch(&self, wrs: &[SendWr]) -> Result<()> {
        self.post_sends(wrs, true)
    }

    /// Queues send-queue work requests without transmitting them (a post
    /// without its doorbell): they go out at the next [`QueuePair::push`],
    /// the next post that transmits, or whenever the progress thread or a
    /// busy poller transmits on this QP. Checked and resolved exactly as
    /// [`QueuePair::post_send_batch`] does. A caller that holds posts must
    /// push them: nothing else is sure to come (the C ABI pushes at its
    /// next poll, and every millisecond at most, `ibverbs/src/cork.rs`).
    /// Several held posts then share one `sendmsg`. A connection that
    /// transmits with each post by its nature (the in-process one) posts
    /// as usual.
    pub fn post_send_held(&self, wrs: &[SendWr]) -> Result<()> {
        self.post_sends(wrs, false)
    }

    /// Transmits what [`QueuePair::post_send_held`] queued (a doorbell).
    /// Cheap when nothing is held.
    pub fn push(&self) {
        self.inner.kick_with(self.inner.sq.lock());
    }

    fn post_sends(&self, wrs: &[SendWr], kick: bool) -> Result<()> {
        let q = &self.inner;
        let state = q.state();
        match state {
            QpState::Rts | QpState::Sqd | QpState::Error => {}
            s => {
                return Err(Error::BadState {
                    qpn: q.qpn,
                    state: s,
                })
            }
        }
        // Refuse the whole batch before queueing any of it.
        let n = q.negotiated();
        let rfc7306 = n.is_some_and(|n| n.rfc7306);
        let no_reads = n.is_some_and(|n| n.ord == 0);
        for wr in wrs {
            if wr.sgl.len() > q.caps.max_send_sge {
                return Err(Error::inval("too many SGEs"));
            }
            if matches!(wr.op, WrOp::RdmaRead { .. })
                && wr.sgl.len() > q.core.config.attr.max_sge_rd as usize
            {
                return Err(Error::inval("too many SGEs for an RDMA Read (max_sge_rd)"));
            }
            q.core.check_post(&wr.sgl)?;
            let reads = matches!(
                wr.op,
                WrOp::RdmaRead { .. }
                    | WrOp::Flush { .. }
                    | WrOp::AtomicFetchAdd { .. }
                    | WrOp::AtomicCmpSwap { .. }
            );
            if reads && no_reads {
                return Err(Error::inval(
                    "the peer accepts no RDMA Reads or atomics on this connection (its IRD is 0, so our ORD is 0)",
                ));
            }
            if wr.needs_rfc7306() && !rfc7306 {
                return Err(Error::inval(
                    "atomics and immediate data need a connection that negotiated RFC 7306 \
                     (ConnParams::extensions with a softrdma peer)",
                ));
            }
        }
        if let Some(posted) = q.transport.get().and_then(|t| t.post_send(q, wrs)) {
            return posted;
        }
        let mut sq = q.sq.lock();
        if sq.wqes.len() + wrs.len() > q.caps.max_send_wr {
            return Err(Error::SendQueueFull);
        }
        let mut bad = false;
        for wr in wrs {
            let seq = sq.next_seq;
            sq.next_seq += 1;
            let mut w = SqWqe::new(seq, wr);
            if q.state() == QpState::Error {
                w.stage = Stage::Done(WcStatus::WrFlushErr);
            } else if let Err(st) = crate::local::resolve_local(q, wr, &mut w) {
                w.stage = Stage::Done(st);
                bad = true;
            }
            sq.wqes.push_back(w);
            if bad {
                break;
            }
        }
        if bad {
            // The failing WR (at the tail) already carries its status; the
            // QP goes to ERROR and every other outstanding WR is flushed.
            drop(sq);
            q.fail(
                WcStatus::WrFlushErr,
                Some(crate::engine::AsyncEvent::QpFatal {
                    qpn: crate::Qpn::from_raw(q.qpn),
                    reason: "local protection error in a posted WR".into(),
                }),
            );
            return Ok(());
        }
        if q.state() == QpState::Error {
            q.complete_in_order(&mut sq);
            return Ok(());
        }
        if kick {
            q.kick_with(sq);
        }
        Ok(())
    }

    /// Busy-poll mode (like a NIC driver's poll mode): with `on`, this
    /// QP's incoming bytes are processed only when the application calls
    /// [`QueuePair::progress`], on its own thread, so a spinning consumer
    /// sees data without a hand-off from the progress thread (and without
    /// its wake-up). The progress thread still finishes transmissions that
    /// found the socket full and notices hang-ups. Call `progress` often
    /// while this is on; turning it off hands input back to the progress
    /// thread (anything pending is picked up at once).
    pub fn set_busy_poll(&self, on: bool) -> Result<()> {
        let c = self
            .iwarp()
            .ok_or(Error::inval("busy-poll needs a connected QP"))?;
        c.set_polled(on, self.inner.qpn)?;
        // Handed back: over TCP the socket's readiness wakes the progress
        // thread (re-armed above), but the same-host ring rings no doorbell
        // for bytes written while the receiver was busy-polled. Ask for one,
        // and read what is there already on this thread (that read parks
        // the ring again when it is empty).
        if !on && !c.arm_input() {
            // Until the ring is empty: a receiver that stops at its budget
            // leaves the ring unparked. (The ring holds at most its size
            // beyond what the peer writes meanwhile.)
            while self.progress() {}
        }
        Ok(())
    }

    /// Whether the QP is in busy-poll mode ([`QueuePair::set_busy_poll`]):
    /// only the application's threads run its receiver.
    pub fn is_busy_poll(&self) -> bool {
        self.iwarp().is_some_and(|c| c.is_polled())
    }

    /// Runs this QP's receiver on the calling thread until its input has
    /// nothing more (never blocks on the network; may wait briefly for the
    /// progress thread if it is inside the receiver). Needed in busy-poll
    /// mode, harmless otherwise. Returns true if it stopped at its budget
    /// with input left (call it again before sleeping).
    pub fn progress(&self) -> bool {
        self.inner.on_readable(crate::engine::RX_BUDGET)
    }

    /// Like [`QueuePair::progress`], handling at most `segments` DDP
    /// segments (so at most that many messages consume receive WRs)
    /// before it returns: an application that re-posts receives between
    /// calls never runs out of them while its peer streams messages.
    pub fn progress_budget(&self, segments: usize) -> bool {
        self.inner.on_readable(segments.max(1))
    }

    /// Busy-poll mode: whether input is known to be waiting without asking
    /// the kernel (bytes in the same-host ring). A cheap check for a
    /// polling loop; input over TCP shows on [`QueuePair::input_fd`].
    pub fn input_waiting(&self) -> bool {
        self.iwarp().is_some_and(|c| c.input_waiting())
    }

    /// Busy-poll mode, for a thread that drives `qps` and has found nothing
    /// for a while: waits in the kernel up to `timeout` until one of them
    /// has input on its socket (or failed, or hung up); whether one has.
    /// Returns false at once when one reads the same-host ring (where a
    /// spin is what pays) or none is connected. `qps` is walked twice (a
    /// slice of QPs, or an iterator that upgrades weak references); up to
    /// 32 QPs nothing is allocated.
    pub fn wait_input_any<I>(qps: I, timeout: Duration) -> bool
    where
        I: IntoIterator,
        I::Item: AsRef<QueuePair>,
        I::IntoIter: Clone,
    {
        let qps = qps.into_iter();
        for q in qps.clone() {
            if q.as_ref().input_in_ring() {
                return false;
            }
        }
        crate::sys::wait_any_readable(qps.filter_map(|q| q.as_ref().input_fd()), timeout)
    }

    /// Busy-poll mode: whether this QP's input comes through the same-host
    /// ring, where [`QueuePair::input_waiting`] sees it with a memory read,
    /// so a short spin before sleeping pays off. Over TCP only the socket's
    /// readiness ([`QueuePair::input_fd`]) tells, and a spin sees nothing.
    pub fn input_in_ring(&self) -> bool {
        self.iwarp().is_some_and(|c| c.input_in_ring())
    }

    /// Busy-poll mode: the descriptor that becomes readable when input is
    /// waiting, for the application's own epoll (or tokio's `AsyncFd`).
    /// Sleep on it only after [`QueuePair::arm_input`] returned true.
    pub fn input_fd(&self) -> Option<std::os::fd::RawFd> {
        self.iwarp().and_then(|c| c.fd())
    }

    /// Busy-poll mode, before sleeping on [`QueuePair::input_fd`]: asks to
    /// be woken by the next input (over the same-host transport's ring,
    /// the peer rings a doorbell only when asked). Returns false when input
    /// is already waiting: call [`QueuePair::progress`] instead of
    /// sleeping.
    pub fn arm_input(&self) -> bool {
        self.iwarp().is_none_or(|c| c.arm_input())
    }

    /// Waits until the QP reaches `state` or the timeout passes.
    pub fn wait_state(&self, state: QpState, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            if self.state() == state {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::park_timeout(Duration::from_millis(2));
        }
    }

    /// Closes the connection (like `rdma_disconnect`): the peer sees a
    /// disconnect, this QP goes to ERROR and flushes.
    pub fn disconnect(&self) {
        let q = &self.inner;
        if let Some(t) = q.transport.get() {
            t.disconnect(q);
        }
        q.fail(
            WcStatus::WrFlushErr,
            Some(crate::engine::AsyncEvent::Disconnected {
                qpn: crate::Qpn::from_raw(q.qpn),
            }),
        );
    }
}

impl Drop for QueuePair {
    fn drop(&mut self) {
        let q = &self.inner;
        if let Some(t) = q.transport.get() {
            t.on_drop(q);
        }
        if q.state() != QpState::Error && q.transport.get().is_some() {
            self.disconnect();
        }
        q.fail(WcStatus::WrFlushErr, None);
        // One-shot bindings still open die with the QP (`fail` ended them
        // unless it had run before one was added).
        q.flush_adverts();
        q.core.qps.write().remove(&q.qpn);
    }
}

impl ProtectionDomain {
    /// Creates an RC queue pair in state RESET.
    pub fn create_qp(&self, attr: QpInitAttr) -> Result<QueuePair> {
        QueuePair::create(self, attr)
    }
}
