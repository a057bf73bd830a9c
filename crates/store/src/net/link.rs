//! Message links over RDMA: one RC queue pair per link, one store message
//! per Send.
//!
//! An [`Endpoint`] owns a softrdma-verbs device, a protection domain and one
//! receive completion queue shared by all its links. Its owner drives it
//! from its own thread (the node loop, a client's thread): [`Endpoint::poll`]
//! runs the links' receivers (they are in the engine's busy-poll mode),
//! takes the messages off the receive queue and re-posts the buffers;
//! [`Endpoint::wait`] sleeps until a link may have input or the owner's
//! [`Waker`] rang. So a message wakes exactly the thread that handles it,
//! with no progress thread or receiver thread in between.
//!
//! Flow control: iWARP has no receiver-not-ready retry, so a Send that finds
//! no posted receive breaks the connection. Each link keeps [`RECV_SLOTS`]
//! receives posted and re-posts each one as soon as its message is copied
//! out, so a peer may have up to that many messages in flight. The store's
//! protocol bounds what is in flight: a client has one request outstanding,
//! replication traffic is bounded by the clients' requests, recovery by its
//! chunk window, and heartbeats are periodic.
//!
//! A message larger than one receive buffer ([`MAX_FRAME`] bytes) travels
//! as several Sends: each carries a one-byte flag (1: more fragments follow,
//! 0: last) before its piece, and the receiver reassembles per link (up to
//! [`EAGER_MAX`] bytes). Fragments of one message are posted back to
//! back under the link's send lock. A larger message (up to
//! [`MAX_MESSAGE`](crate::proto::MAX_MESSAGE), 132 MiB)
//! is not copied through Sends at all: the sender lends it to the peer
//! with a one-shot advertisement and the peer pulls it with RDMA Reads
//! (`rendezvous.rs`).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use softrdma_verbs::{
    Access, CompletionQueue, ConnParams, Device, DeviceConfig, MemoryRegion, Poller,
    ProtectionDomain, QpInitAttr, QpState, QueuePair, RecvWr, SendWr, WcOpcode, WcStatus,
    WorkCompletion,
};

pub use softrdma_verbs::Waker;

pub(crate) mod pool;
mod read;
mod rendezvous;
pub(crate) use rendezvous::transient;
pub use rendezvous::{Outbound, EAGER_MAX};
use rendezvous::{Outgoing, Pull, Raw};

/// Largest message on a link.
pub const MAX_FRAME: usize = 32 * 1024;
/// Largest value a client may store (`proto::MAX_VALUE`).
pub const MAX_VALUE: usize = crate::proto::MAX_VALUE;
/// Payload bytes per Send (after the fragment flag).
const PIECE: usize = MAX_FRAME - 1;
/// Receives kept posted per link.
pub const RECV_SLOTS: usize = 128;
/// Send buffers per link.
const SEND_SLOTS: usize = 32;
/// Send queue entries beyond the send buffers (for Reads, and the
/// advertisements of lent messages).
const SQ_SPARE: usize = READ_BATCH + 8;
/// Most RDMA Reads a link has in flight ([`Link::read_batch`]): the
/// initiator depth (ORD) a link asks for at connection time.
pub const READ_BATCH: usize = 16;
/// How long a thread waiting for one answer (a Read, send slots) polls
/// before it sleeps.
const SPIN: Duration = Duration::from_micros(50);
/// The receive CQ's token in the endpoint's poller (link ids are u32).
const RECV_CQ_TOKEN: u64 = 1 << 32;
/// Segments a link's receiver handles before the receive queue is drained
/// (and its buffers re-posted) again: well under [`RECV_SLOTS`], so a
/// streaming peer never finds the receives used up.
const RX_STEP: usize = RECV_SLOTS / 4;

/// Errors of the link layer.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// The verbs engine refused or failed.
    #[error("rdma: {0}")]
    Verbs(String),
    /// The link is down.
    #[error("link to {0} is down")]
    Down(String),
    /// A send did not complete in time.
    #[error("timed out on link to {0}")]
    Timeout(String),
    /// Message too large.
    #[error("message of {0} bytes exceeds the largest message")]
    TooLarge(usize),
    /// The peer broke the connection protocol (not an iWARP peer, or not
    /// a store node): retrying will not help.
    #[error("not a store node (connection protocol error: {0})")]
    Protocol(String),
    /// The peer rejected the connection with this private data (a
    /// challenge or a reason: `handshake::Refusal`).
    #[error("connection rejected")]
    Rejected(Vec<u8>),
}

fn verr(e: impl std::fmt::Display) -> LinkError {
    LinkError::Verbs(e.to_string())
}

/// What [`Endpoint::poll`] reports.
pub enum LinkEvent {
    /// A message arrived on link `link`.
    Frame {
        /// Link id.
        link: u32,
        /// The message bytes (a large one's buffer is kept for the next
        /// when the last of them is dropped: `pool.rs`).
        bytes: bytes::Bytes,
    },
    /// Link `link` failed or was closed by the peer.
    Down {
        /// Link id.
        link: u32,
    },
}

/// A device, a PD and the links over them, driven by one owner thread.
pub struct Endpoint {
    dev: Device,
    pd: ProtectionDomain,
    recv_cq: CompletionQueue,
    links: Mutex<HashMap<u32, Arc<Link>>>,
    /// The links whose input the owner runs (connected ones).
    active: RwLock<Vec<Arc<Link>>>,
    next_id: AtomicU32,
    poller: Poller,
    /// Links that may have input: reported by the last wait, or whose
    /// receiver stopped at its budget.
    ready: Mutex<Vec<u32>>,
    /// Messages being reassembled, per link.
    partial: Mutex<HashMap<u32, Vec<u8>>>,
    /// Events drained while a link's thread waited (a Read, send slots),
    /// for the next [`Endpoint::poll`].
    backlog: Mutex<Vec<Raw>>,
}

impl Endpoint {
    /// Opens a device named `name` for an owner that drives it with
    /// [`Endpoint::poll`] and [`Endpoint::wait`].
    pub fn open(name: &str) -> Result<Arc<Endpoint>, LinkError> {
        let dev = Device::open(DeviceConfig {
            name: name.to_string(),
            progress_threads: 1,
            ..Default::default()
        })
        .map_err(verr)?;
        let pd = dev.alloc_pd().map_err(verr)?;
        let recv_cq = dev.create_cq(1 << 16).map_err(verr)?;
        let poller = Poller::new().map_err(verr)?;
        poller.add_cq(&recv_cq, RECV_CQ_TOKEN).map_err(verr)?;
        Ok(Arc::new(Endpoint {
            dev,
            pd,
            recv_cq,
            links: Mutex::new(HashMap::new()),
            active: RwLock::new(Vec::new()),
            next_id: AtomicU32::new(1),
            poller,
            ready: Mutex::new(Vec::new()),
            partial: Mutex::new(HashMap::new()),
            backlog: Mutex::new(Vec::new()),
        }))
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// Rings the owner's [`Endpoint::wait`] (from its other event sources).
    pub fn waker(&self) -> Waker {
        self.poller.waker()
    }

    /// A new link with its receives posted, not yet connected.
    pub fn new_link(self: &Arc<Self>) -> Result<Arc<Link>, LinkError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let send_cq = self.dev.create_cq(SEND_SLOTS * 2 + 8).map_err(verr)?;
        let mut attr = QpInitAttr::new(&send_cq);
        attr.recv_cq = self.recv_cq.clone();
        attr.caps.max_send_wr = SEND_SLOTS + SQ_SPARE;
        attr.caps.max_recv_wr = RECV_SLOTS;
        let qp = self.pd.create_qp(attr).map_err(verr)?;
        qp.modify(QpState::Init).map_err(verr)?;
        let send_mr = self
            .pd
            .alloc_mr(SEND_SLOTS * MAX_FRAME, Access::LOCAL_WRITE)
            .map_err(verr)?;
        let recv_mr = self
            .pd
            .alloc_mr(RECV_SLOTS * MAX_FRAME, Access::LOCAL_WRITE)
            .map_err(verr)?;
        for slot in 0..RECV_SLOTS {
            qp.post_recv(&RecvWr::new(
                (id as u64) << 32 | slot as u64,
                &[recv_mr.sge(slot * MAX_FRAME, MAX_FRAME)],
            ))
            .map_err(verr)?;
        }
        let link = Arc::new(Link {
            id,
            qp,
            send_cq,
            send_mr,
            recv_mr,
            tx: Mutex::new(Tx {
                next: 0,
                outstanding: 0,
            }),
            dead: AtomicBool::new(false),
            peer: Mutex::new(String::new()),
            ep: Arc::downgrade(self),
            lent: Mutex::new(HashMap::new()),
            sends: Default::default(),
        });
        self.links.lock().unwrap().insert(id, link.clone());
        Ok(link)
    }

    /// Takes a freshly connected link's input into the owner's hands (call
    /// after accepting on it; [`Endpoint::connect`] does it itself).
    pub fn activate(&self, link: &Arc<Link>) -> Result<(), LinkError> {
        link.qp.set_busy_poll(true).map_err(verr)?;
        self.poller.add(&link.qp, link.id as u64).map_err(verr)?;
        self.active.write().unwrap().push(link.clone());
        // Whatever arrived before is processed at the next poll.
        self.ready.lock().unwrap().push(link.id);
        Ok(())
    }

    /// Forgets a link (after it went down).
    pub fn remove(&self, id: u32) {
        let removed = self.links.lock().unwrap().remove(&id);
        if let Some(l) = removed {
            self.poller.remove(&l.qp);
            self.active.write().unwrap().retain(|a| a.id != id);
            l.close();
            // Closing flushed its posted receives into the shared receive
            // queue: take them out now (what other links received meanwhile
            // waits in the backlog). A client retrying a peer that fails
            // every handshake otherwise filled the queue within seconds
            // (issue 16, finding 6).
            self.service();
        }
    }

    /// Connects a new link to `addr` with `private_data`; returns the link
    /// and the peer's reply private data.
    pub fn connect(
        self: &Arc<Self>,
        addr: SocketAddr,
        private_data: &[u8],
        timeout: Duration,
    ) -> Result<(Arc<Link>, Vec<u8>), LinkError> {
        let link = self.new_link()?;
        let params = ConnParams {
            private_data: private_data.to_vec(),
            timeout,
            // Store nodes and clients talk only to each other.
            extensions: true,
            ..Default::default()
        };
        match link.qp.connect(addr, &params) {
            Ok(reply) => {
                *link.peer.lock().unwrap() = addr.to_string();
                if let Err(e) = self.activate(&link) {
                    self.remove(link.id);
                    return Err(e);
                }
                Ok((link, reply))
            }
            Err(e) => {
                self.remove(link.id);
                Err(match e {
                    // The peer does not speak MPA (or not as a store node):
                    // retrying will not change that.
                    softrdma_verbs::Error::Protocol(p) => LinkError::Protocol(p),
                    softrdma_verbs::Error::Rejected { private_data } => {
                        LinkError::Rejected(private_data)
                    }
                    e => verr(e),
                })
            }
        }
    }

    /// Closes every link.
    pub fn shutdown(&self) {
        let links: Vec<_> = self.links.lock().unwrap().drain().map(|(_, l)| l).collect();
        self.active.write().unwrap().clear();
        for l in links {
            self.poller.remove(&l.qp);
            l.close();
        }
    }

    fn link(&self, id: u32) -> Option<Arc<Link>> {
        self.links.lock().unwrap().get(&id).cloned()
    }

    /// Runs the receivers of the links that may have input and collects
    /// what arrived; returns whether anything did. Blocks only to pull a
    /// lent message (`rendezvous.rs`), within [`rendezvous::pull_timeout`].
    pub fn poll(&self, out: &mut Vec<LinkEvent>) -> bool {
        let before = out.len();
        let mut raw = std::mem::take(&mut *self.backlog.lock().unwrap());
        self.pump(&mut raw);
        for ev in raw {
            match ev {
                Raw::Event(e) => out.push(e),
                Raw::Pull(p) => out.extend(self.pull(p)),
            }
        }
        out.len() > before
    }

    /// Runs the receivers of the links that may have input (in steps,
    /// re-posting receives between them) and drains the receive queue.
    fn pump(&self, out: &mut Vec<Raw>) {
        let ready = std::mem::take(&mut *self.ready.lock().unwrap());
        let mut again = Vec::new();
        for l in self.active.read().unwrap().iter() {
            if !(ready.contains(&l.id) || l.qp.input_waiting()) {
                continue;
            }
            // In steps, re-posting the receives between them.
            let mut steps = 0;
            while l.qp.progress_budget(RX_STEP) {
                self.drain(out);
                steps += 1;
                if steps == 16 {
                    again.push(l.id);
                    break;
                }
            }
        }
        if !again.is_empty() {
            self.ready.lock().unwrap().extend(again);
        }
        self.drain(out);
    }

    /// For a thread of the owner blocked on one link (send slots, a Read):
    /// keeps every link served meanwhile (a peer may be waiting for an
    /// answer only we can give, such as a Read Response over a busy-polled
    /// QP), keeping what arrives for the next [`Endpoint::poll`].
    fn service(&self) {
        let mut evs = Vec::new();
        self.pump(&mut evs);
        if !evs.is_empty() {
            self.backlog.lock().unwrap().append(&mut evs);
        }
    }

    /// Takes what the receive queue holds (re-posting the buffers).
    fn drain(&self, out: &mut Vec<Raw>) {
        let mut wcs = [WorkCompletion::default(); 64];
        loop {
            let n = self.recv_cq.poll(&mut wcs);
            for wc in &wcs[..n] {
                self.on_recv(wc, out);
            }
            if n < wcs.len() {
                break;
            }
        }
    }

    /// How long a thread of the owner polls before it sleeps: `d` when a
    /// link's input comes through a same-host ring (a poll sees it with a
    /// memory read), zero otherwise: over TCP only a wait learns of input
    /// (the socket's readiness), so a spin would see nothing and only take
    /// the CPU from the threads that send it (on a small machine, the
    /// peer). `SOFTRDMA_STORE_SPIN_US` overrides it (experiments).
    pub fn spin(&self, d: Duration) -> Duration {
        static FORCED: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
        let forced = FORCED.get_or_init(|| {
            std::env::var("SOFTRDMA_STORE_SPIN_US")
                .ok()
                .and_then(|v| v.parse().ok())
        });
        if let Some(us) = forced {
            return Duration::from_micros(*us);
        }
        if self
            .active
            .read()
            .unwrap()
            .iter()
            .any(|l| l.qp.input_in_ring())
        {
            d
        } else {
            Duration::ZERO
        }
    }

    /// Whether input is known to be waiting without sleeping.
    pub fn input_waiting(&self) -> bool {
        !self.ready.lock().unwrap().is_empty()
            || !self.recv_cq.is_empty()
            || self
                .active
                .read()
                .unwrap()
                .iter()
                .any(|l| l.qp.input_waiting())
    }

    /// Sleeps until a link may have input, the waker rang or `timeout`
    /// passed (at once if input is already waiting); returns whether the
    /// waker rang.
    pub fn wait(&self, timeout: Duration) -> bool {
        // Completions the engine produced on its own (a flush after a
        // failure) ring the CQ's descriptor, which the poller watches too.
        self.recv_cq.req_notify(false);
        let mut armed = !self.input_waiting();
        for l in self.active.read().unwrap().iter() {
            if armed && !l.qp.arm_input() {
                armed = false;
            }
        }
        if !armed {
            if self.recv_cq.cancel_notify() {
                self.recv_cq.ack_events();
            }
            return false;
        }
        let mut ready = Vec::new();
        let woken = match self.poller.wait(timeout, &mut ready) {
            Ok(w) => w,
            Err(e) => {
                tracing::warn!(error = %e, "waiting for link input failed");
                false
            }
        };
        // Withdraw the notification unless it fired: this thread polls the
        // queue next, and the completions it produces itself would
        // otherwise ring the descriptor (a write and a read of it per
        // message, for nothing).
        if self.recv_cq.cancel_notify() {
            self.recv_cq.ack_events();
        }
        self.ready.lock().unwrap().extend(
            ready
                .into_iter()
                .filter(|&t| t != RECV_CQ_TOKEN)
                .map(|t| t as u32),
        );
        woken
    }

    fn on_recv(&self, wc: &WorkCompletion, out: &mut Vec<Raw>) {
        let id = (wc.wr_id >> 32) as u32;
        let slot = (wc.wr_id & 0xffff_ffff) as usize;
        let Some(link) = self.link(id) else { return };
        if wc.opcode == WcOpcode::AdvertiseEnd {
            // A lent message's advertisement ended without the peer's
            // close (the connection failed): it consumed no receive.
            link.returned(wc.invalidated_rkey);
            return;
        }
        let len = (wc.byte_len as usize).min(MAX_FRAME);
        let mut partial = self.partial.lock().unwrap();
        if wc.status != WcStatus::Success || wc.opcode != WcOpcode::Recv || len == 0 {
            partial.remove(&id);
            if !link.dead.swap(true, Ordering::AcqRel) {
                out.push(Raw::Event(LinkEvent::Down { link: id }));
            }
            return;
        }
        let mut flag = [0u8; 1];
        link.recv_mr.read_at(slot * MAX_FRAME, &mut flag);
        let mut broken = false;
        match flag[0] {
            rendezvous::FLAG_LAST | rendezvous::FLAG_MORE => {
                let buf = partial.entry(id).or_default();
                let at = buf.len();
                buf.resize(at + len - 1, 0);
                link.recv_mr.read_at(slot * MAX_FRAME + 1, &mut buf[at..]);
                broken = buf.len() > EAGER_MAX;
                if flag[0] == rendezvous::FLAG_LAST {
                    let bytes = partial.remove(&id).unwrap_or_default().into();
                    out.push(Raw::Event(LinkEvent::Frame { link: id, bytes }));
                }
            }
            // A lent message, never in the middle of a fragmented one.
            rendezvous::FLAG_PULL if !partial.contains_key(&id) => {
                let mut head = [0u8; rendezvous::PULL_HEAD];
                let n = (len - 1).min(head.len());
                link.recv_mr.read_at(slot * MAX_FRAME + 1, &mut head[..n]);
                match Pull::parse(id, wc, &head[..len - 1]) {
                    Some(p) => out.push(Raw::Pull(p)),
                    None => broken = true,
                }
            }
            rendezvous::FLAG_CLOSE if len == 1 && wc.invalidated_rkey.is_some() => {
                link.returned(wc.invalidated_rkey)
            }
            _ => broken = true,
        }
        // Re-post before handing the message on: the peer may send again
        // at once.
        let repost = link.qp.post_recv(&RecvWr::new(
            wc.wr_id,
            &[link.recv_mr.sge(slot * MAX_FRAME, MAX_FRAME)],
        ));
        if (repost.is_err() || broken) && !link.dead.swap(true, Ordering::AcqRel) {
            if broken {
                tracing::warn!(link = id, flag = flag[0], "malformed message; closing link");
            }
            partial.remove(&id);
            link.close();
            out.push(Raw::Event(LinkEvent::Down { link: id }));
        }
    }
}

struct Tx {
    /// Next send slot (ring index).
    next: usize,
    /// Send WRs posted and not yet completed.
    outstanding: usize,
}

/// One connection.
pub struct Link {
    id: u32,
    qp: QueuePair,
    send_cq: CompletionQueue,
    send_mr: MemoryRegion,
    recv_mr: MemoryRegion,
    tx: Mutex<Tx>,
    dead: AtomicBool,
    peer: Mutex<String>,
    /// The endpoint (whose receive queue this link's thread drains while
    /// it waits).
    ep: std::sync::Weak<Endpoint>,
    /// The messages lent to the peer (`rendezvous.rs`), by STag, until
    /// its close (or the advertisement's end) gives each back.
    lent: Mutex<HashMap<u32, Vec<MemoryRegion>>>,
    /// Sends posted (fragments, closes; not advertisements).
    sends: std::sync::atomic::AtomicU64,
}

impl Link {
    /// The link's id (as in [`LinkEvent`]s).
    pub fn id(&self) -> u32 {
        self.id
    }

    /// The queue pair (to accept a connection request on).
    pub fn qp(&self) -> &QueuePair {
        &self.qp
    }

    /// Names the peer in errors.
    pub fn set_peer(&self, p: String) {
        *self.peer.lock().unwrap() = p;
    }

    fn peer(&self) -> String {
        self.peer.lock().unwrap().clone()
    }

    /// Whether the link failed or was closed.
    pub fn is_dead(&self) -> bool {
        self.dead.load(Ordering::Acquire) || self.qp.state() == QpState::Error
    }

    /// Closes the connection (idempotent).
    pub fn close(&self) {
        self.dead.store(true, Ordering::Release);
        self.qp.disconnect();
    }

    /// Reaps send completions; waits up to `timeout` for at least one when
    /// `block`.
    fn reap(&self, tx: &mut Tx, block: bool, timeout: Duration) -> Result<(), LinkError> {
        let mut wcs = [softrdma_verbs::WorkCompletion::default(); 16];
        let mut n = self.send_cq.poll(&mut wcs);
        if n == 0 && block {
            if let Some(wc) = self.next_send_wc(Instant::now() + timeout) {
                wcs[0] = wc;
                n = 1;
            }
        }
        for wc in &wcs[..n] {
            tx.outstanding = tx.outstanding.saturating_sub(1);
            if wc.status != WcStatus::Success {
                self.dead.store(true, Ordering::Release);
                return Err(LinkError::Down(self.peer()));
            }
        }
        if block && n == 0 {
            return Err(LinkError::Timeout(self.peer()));
        }
        Ok(())
    }

    /// Waits for the next completion of this link's sends, running its
    /// receiver meanwhile (in busy-poll mode nobody else does: a Read's
    /// response, or the peer's doorbell making room in its ring, needs
    /// it): polls for [`SPIN`], then sleeps on the link's input and the
    /// send CQ's event descriptor. `None` at the deadline.
    fn next_send_wc(&self, deadline: Instant) -> Option<WorkCompletion> {
        let ep = self.ep.upgrade();
        let spin = ep.as_ref().map_or(SPIN, |e| e.spin(SPIN));
        let spin_until = Instant::now() + spin;
        loop {
            // Every link of the endpoint, ours included: what arrives waits
            // in the backlog (with its receive re-posted) for the owner.
            match &ep {
                Some(ep) => ep.service(),
                None => {
                    self.qp.progress_budget(RX_STEP);
                }
            }
            if let Some(wc) = self.send_cq.poll_one() {
                return Some(wc);
            }
            let now = Instant::now();
            if now >= deadline {
                return None;
            }
            if now < spin_until {
                std::thread::yield_now();
                continue;
            }
            // Sleep until a link has input (ours: a Read Response, a
            // doorbell making room in the peer's ring); completions the
            // progress thread produces over TCP come within a millisecond.
            let nap = deadline
                .saturating_duration_since(now)
                .min(Duration::from_millis(1));
            match &ep {
                Some(ep) => {
                    ep.wait(nap);
                }
                None => std::thread::sleep(nap),
            }
        }
    }

    /// Sends one message: in fragments if it exceeds one Send, lent to
    /// the peer if it exceeds [`EAGER_MAX`] (copied for that: see
    /// [`Link::send_owned`]). Blocks while all send buffers are in
    /// flight, up to `timeout`.
    pub fn send(&self, msg: &[u8], timeout: Duration) -> Result<(), LinkError> {
        self.send_msgs(&mut [msg], timeout)
    }

    /// [`Link::send`] of a message the link may keep: a large one is lent
    /// to the peer as it is, without a copy.
    pub fn send_owned(&self, msg: impl Into<Outbound>, timeout: Duration) -> Result<(), LinkError> {
        self.send_msgs(&mut [msg.into()], timeout)
    }

    /// Sends several messages in order, posted together so that the
    /// engine writes them to the socket in as few system calls as it can
    /// (one when they fit the send buffers); large ones are lent as they
    /// are. Blocks while all send buffers are in flight, up to `timeout`;
    /// on an error the link is closed, since a message cut short cannot be
    /// resumed.
    pub fn send_batch(&self, mut msgs: Vec<Outbound>, timeout: Duration) -> Result<(), LinkError> {
        self.send_msgs(&mut msgs, timeout)
    }

    fn send_msgs<M: Outgoing>(&self, msgs: &mut [M], timeout: Duration) -> Result<(), LinkError> {
        if let Some(m) = msgs
            .iter()
            .map(|m| m.len())
            .find(|&n| n == 0 || n > crate::proto::MAX_MESSAGE)
        {
            return Err(LinkError::TooLarge(m));
        }
        if self.is_dead() {
            return Err(LinkError::Down(self.peer()));
        }
        let mut tx = self.tx.lock().unwrap();
        self.reap(&mut tx, false, timeout)?;
        let deadline = Instant::now() + timeout;
        let mut wrs: Vec<SendWr> = Vec::new();
        for msg in msgs {
            if msg.len() > EAGER_MAX {
                // In order: what is composed goes first.
                self.post(&mut tx, &mut wrs)?;
                if let Err(e) = self.lend(&mut tx, msg.take(), deadline) {
                    self.close();
                    return Err(e);
                }
                continue;
            }
            let bytes = msg.eager();
            let mut pieces = bytes.chunks(PIECE).peekable();
            while let Some(piece) = pieces.next() {
                let slot = self.slot(&mut tx, &mut wrs, deadline)?;
                let more = pieces.peek().is_some();
                let flag = if more {
                    rendezvous::FLAG_MORE
                } else {
                    rendezvous::FLAG_LAST
                };
                self.send_mr.write_at(slot * MAX_FRAME, &[flag]);
                self.send_mr.write_at(slot * MAX_FRAME + 1, piece);
                wrs.push(SendWr::send(
                    slot as u64,
                    &[self.send_mr.sge(slot * MAX_FRAME, piece.len() + 1)],
                ));
            }
        }
        self.post(&mut tx, &mut wrs)
    }

    /// The next free send buffer, waiting (until `deadline`) while all are
    /// in flight; posts `wrs` first when they would fill the ring. On an
    /// error the link is closed.
    fn slot(
        &self,
        tx: &mut Tx,
        wrs: &mut Vec<SendWr>,
        deadline: Instant,
    ) -> Result<usize, LinkError> {
        if tx.outstanding + wrs.len() >= SEND_SLOTS {
            self.post(tx, wrs)?;
        }
        while tx.outstanding >= SEND_SLOTS {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                self.close();
                return Err(LinkError::Timeout(self.peer()));
            }
            if let Err(e) = self.reap(tx, true, left) {
                self.close();
                return Err(e);
            }
        }
        // Completions come in order, so the slot `outstanding` WRs back is
        // free again.
        let slot = tx.next;
        tx.next = (tx.next + 1) % SEND_SLOTS;
        Ok(slot)
    }

    /// Posts the composed Sends with one doorbell.
    fn post(&self, tx: &mut Tx, wrs: &mut Vec<SendWr>) -> Result<(), LinkError> {
        if wrs.is_empty() {
            return Ok(());
        }
        self.qp.post_send_batch(wrs).map_err(|e| {
            self.dead.store(true, Ordering::Release);
            verr(e)
        })?;
        tx.outstanding += wrs.len();
        self.sends.fetch_add(wrs.len() as u64, Ordering::Relaxed);
        wrs.clear();
        Ok(())
    }

    /// Sends posted so far (message fragments and closes of lent
    /// messages).
    pub fn sends_posted(&self) -> u64 {
        self.sends.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests;
