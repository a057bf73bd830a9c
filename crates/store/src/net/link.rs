//! Message links over RDMA: one RC queue pair per link, one store message
//! per Send.
//!
//! An [`Endpoint`] owns a softrdma-verbs device, a protection domain and one
//! receive completion queue shared by all its links; a receiver thread polls
//! it, hands every message to the endpoint's handler and re-posts the
//! receive buffer at once.
//!
//! Flow control: iWARP has no receiver-not-ready retry, so a Send that finds
//! no posted receive breaks the connection. Each link keeps [`RECV_SLOTS`]
//! receives posted and the receiver thread re-posts each one as soon as its
//! message is copied out, so a peer may have up to that many messages in
//! flight. The store's protocol bounds what is in flight: a client has one
//! request outstanding, replication traffic is bounded by the clients'
//! requests, recovery by its chunk window, and heartbeats are periodic.
//!
//! A message larger than one receive buffer ([`MAX_FRAME`] bytes) travels
//! as several Sends: each carries a one-byte flag (1: more fragments follow,
//! 0: last) before its piece, and the receiver reassembles per link (up to
//! [`MAX_MESSAGE`](crate::proto::MAX_MESSAGE) bytes). Fragments of one
//! message are posted back to back under the link's send lock. Client
//! values are limited to [`MAX_VALUE`] so a request fits one Send.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use softrdma_verbs::{
    Access, CompletionQueue, ConnParams, Device, DeviceConfig, MemoryRegion, ProtectionDomain,
    QpInitAttr, QpState, QueuePair, RecvWr, SendWr, WcOpcode, WcStatus,
};

/// Largest message on a link.
pub const MAX_FRAME: usize = 32 * 1024;
/// Largest value a client may store (a request then fits one Send).
pub const MAX_VALUE: usize = MAX_FRAME - 256;
/// Payload bytes per Send (after the fragment flag).
const PIECE: usize = MAX_FRAME - 1;
/// Receives kept posted per link.
pub const RECV_SLOTS: usize = 128;
/// Send buffers per link.
/// How long a one-sided Read polls before it sleeps on its CQ.
const READ_SPIN: Duration = Duration::from_micros(60);
/// Set while one thread of this process polls for its Read.
static SPINNER: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Releases [`SPINNER`] when the Read that took it ends.
struct SpinGuard(bool);

impl SpinGuard {
    fn release(&mut self) {
        if std::mem::take(&mut self.0) {
            SPINNER.store(false, Ordering::Release);
        }
    }
}

impl Drop for SpinGuard {
    fn drop(&mut self) {
        self.release();
    }
}

const SEND_SLOTS: usize = 32;

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
}

fn verr(e: impl std::fmt::Display) -> LinkError {
    LinkError::Verbs(e.to_string())
}

/// What the receiver thread reports.
pub enum LinkEvent {
    /// A message arrived on link `link`.
    Frame {
        /// Link id.
        link: u32,
        /// The message bytes.
        bytes: Vec<u8>,
    },
    /// Link `link` failed or was closed by the peer.
    Down {
        /// Link id.
        link: u32,
    },
}

type Handler = Box<dyn Fn(LinkEvent) + Send + Sync>;

/// A device, a PD and the links over them.
pub struct Endpoint {
    dev: Device,
    pd: ProtectionDomain,
    recv_cq: CompletionQueue,
    links: Mutex<HashMap<u32, Arc<Link>>>,
    next_id: AtomicU32,
    stop: Arc<AtomicBool>,
    rx_thread: Mutex<Option<JoinHandle<()>>>,
}

impl Endpoint {
    /// Opens a device named `name` and starts the receiver thread, which
    /// calls `handler` for every event.
    pub fn open(
        name: &str,
        handler: impl Fn(LinkEvent) + Send + Sync + 'static,
    ) -> Result<Arc<Endpoint>, LinkError> {
        let dev = Device::open(DeviceConfig {
            name: name.to_string(),
            progress_threads: 1,
            ..Default::default()
        })
        .map_err(verr)?;
        let pd = dev.alloc_pd().map_err(verr)?;
        let recv_cq = dev.create_cq(1 << 16).map_err(verr)?;
        let ep = Arc::new(Endpoint {
            dev,
            pd,
            recv_cq,
            links: Mutex::new(HashMap::new()),
            next_id: AtomicU32::new(1),
            stop: Arc::new(AtomicBool::new(false)),
            rx_thread: Mutex::new(None),
        });
        let weak = Arc::downgrade(&ep);
        let cq = ep.recv_cq.clone();
        let stop = ep.stop.clone();
        let handler: Handler = Box::new(handler);
        let h = std::thread::Builder::new()
            .name(format!("{name}-rx"))
            .spawn(move || receiver(weak, cq, stop, handler))
            .map_err(verr)?;
        *ep.rx_thread.lock().unwrap() = Some(h);
        Ok(ep)
    }

    /// The device.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// The protection domain.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.pd
    }

    /// A new link with its receives posted, not yet connected.
    pub fn new_link(&self) -> Result<Arc<Link>, LinkError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let send_cq = self.dev.create_cq(SEND_SLOTS * 2 + 8).map_err(verr)?;
        let mut attr = QpInitAttr::new(&send_cq);
        attr.recv_cq = self.recv_cq.clone();
        attr.caps.max_send_wr = SEND_SLOTS + 4;
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
        });
        self.links.lock().unwrap().insert(id, link.clone());
        Ok(link)
    }

    /// Forgets a link (after it went down).
    pub fn remove(&self, id: u32) {
        if let Some(l) = self.links.lock().unwrap().remove(&id) {
            l.close();
        }
    }

    /// Connects a new link to `addr` with `private_data`; returns the link
    /// and the peer's reply private data.
    pub fn connect(
        &self,
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
                Ok((link, reply))
            }
            Err(e) => {
                self.remove(link.id);
                Err(verr(e))
            }
        }
    }

    /// Stops the receiver thread and closes every link.
    pub fn shutdown(&self) {
        self.stop.store(true, Ordering::Release);
        let links: Vec<_> = self.links.lock().unwrap().drain().map(|(_, l)| l).collect();
        for l in links {
            l.close();
        }
        if let Some(h) = self.rx_thread.lock().unwrap().take() {
            let _ = h.join();
        }
    }

    fn link(&self, id: u32) -> Option<Arc<Link>> {
        self.links.lock().unwrap().get(&id).cloned()
    }
}

fn receiver(
    ep: std::sync::Weak<Endpoint>,
    cq: CompletionQueue,
    stop: Arc<AtomicBool>,
    handler: Handler,
) {
    let mut wcs = vec![softrdma_verbs::WorkCompletion::default(); 64];
    let mut partial: HashMap<u32, Vec<u8>> = HashMap::new();
    while !stop.load(Ordering::Acquire) {
        let n = cq.poll_wait(&mut wcs, Duration::from_millis(100));
        let Some(ep) = ep.upgrade() else { return };
        for wc in &wcs[..n] {
            let id = (wc.wr_id >> 32) as u32;
            let slot = (wc.wr_id & 0xffff_ffff) as usize;
            let Some(link) = ep.link(id) else { continue };
            let len = (wc.byte_len as usize).min(MAX_FRAME);
            if wc.status != WcStatus::Success || wc.opcode != WcOpcode::Recv || len == 0 {
                partial.remove(&id);
                if !link.dead.swap(true, Ordering::AcqRel) {
                    handler(LinkEvent::Down { link: id });
                }
                continue;
            }
            let mut flag = [0u8; 1];
            link.recv_mr.read_at(slot * MAX_FRAME, &mut flag);
            let buf = partial.entry(id).or_default();
            let at = buf.len();
            buf.resize(at + len - 1, 0);
            link.recv_mr.read_at(slot * MAX_FRAME + 1, &mut buf[at..]);
            // Re-post before handing the message on: the peer may send
            // again at once.
            let repost = link.qp.post_recv(&RecvWr::new(
                wc.wr_id,
                &[link.recv_mr.sge(slot * MAX_FRAME, MAX_FRAME)],
            ));
            let too_big = buf.len() > crate::proto::MAX_MESSAGE;
            if flag[0] == 0 {
                let bytes = partial.remove(&id).unwrap_or_default();
                handler(LinkEvent::Frame { link: id, bytes });
            }
            if (repost.is_err() || too_big) && !link.dead.swap(true, Ordering::AcqRel) {
                partial.remove(&id);
                link.close();
                handler(LinkEvent::Down { link: id });
            }
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
        let n = if block {
            self.send_cq.poll_wait(&mut wcs, timeout)
        } else {
            self.send_cq.poll(&mut wcs)
        };
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

    /// Sends one message, in fragments if it exceeds one Send (blocks
    /// while all send buffers are in flight, up to `timeout`).
    pub fn send(&self, msg: &[u8], timeout: Duration) -> Result<(), LinkError> {
        if msg.len() > crate::proto::MAX_MESSAGE {
            return Err(LinkError::TooLarge(msg.len()));
        }
        if self.is_dead() {
            return Err(LinkError::Down(self.peer()));
        }
        let mut tx = self.tx.lock().unwrap();
        self.reap(&mut tx, false, timeout)?;
        let deadline = Instant::now() + timeout;
        let mut pieces = msg.chunks(PIECE).peekable();
        if msg.is_empty() {
            return Err(LinkError::TooLarge(0));
        }
        while let Some(piece) = pieces.next() {
            while tx.outstanding >= SEND_SLOTS {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    // A partly sent message cannot be resumed: end the link.
                    self.close();
                    return Err(LinkError::Timeout(self.peer()));
                }
                if let Err(e) = self.reap(&mut tx, true, left) {
                    self.close();
                    return Err(e);
                }
            }
            // Completions come in order, so the slot `outstanding` WRs back
            // is free again.
            let slot = tx.next;
            tx.next = (tx.next + 1) % SEND_SLOTS;
            let more = pieces.peek().is_some();
            self.send_mr.write_at(slot * MAX_FRAME, &[more as u8]);
            self.send_mr.write_at(slot * MAX_FRAME + 1, piece);
            self.qp
                .post_send(&SendWr::send(
                    slot as u64,
                    &[self.send_mr.sge(slot * MAX_FRAME, piece.len() + 1)],
                ))
                .map_err(|e| {
                    self.dead.store(true, Ordering::Release);
                    verr(e)
                })?;
            tx.outstanding += 1;
        }
        Ok(())
    }

    /// One-sided RDMA Read of `len` bytes at `remote_addr` under `rkey`
    /// into `local` at offset 0; waits for it.
    pub fn read(
        &self,
        local: &MemoryRegion,
        len: usize,
        remote_addr: u64,
        rkey: u32,
        timeout: Duration,
    ) -> Result<(), LinkError> {
        if self.is_dead() {
            return Err(LinkError::Down(self.peer()));
        }
        let mut tx = self.tx.lock().unwrap();
        const READ_ID: u64 = u64::MAX;
        self.qp
            .post_send(&SendWr::read(READ_ID, local.sge(0, len), remote_addr, rkey))
            .map_err(|e| {
                self.dead.store(true, Ordering::Release);
                verr(e)
            })?;
        tx.outstanding += 1;
        let deadline = Instant::now() + timeout;
        // A one-sided Read's response comes back in tens of microseconds:
        // run the receiver on this thread and poll for that long before
        // sleeping on the CQ (a sleep and a wake-up through the progress
        // thread cost about as much as the Read itself).
        // Only one thread of the process spins at a time: with many client
        // threads on few cores, spinning readers would starve the threads
        // that do the work (the others sleep as before).
        let spinning = SPINNER
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
        let mut spin_guard = SpinGuard(spinning);
        let spin_until = if spinning {
            Instant::now() + READ_SPIN
        } else {
            Instant::now()
        };
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(LinkError::Timeout(self.peer()));
            }
            let wc = if Instant::now() < spin_until {
                self.qp.progress();
                match self.send_cq.poll_one() {
                    Some(wc) => wc,
                    None => {
                        std::hint::spin_loop();
                        continue;
                    }
                }
            } else {
                spin_guard.release();
                match self.send_cq.wait_one(left) {
                    Some(wc) => wc,
                    None => return Err(LinkError::Timeout(self.peer())),
                }
            };
            tx.outstanding = tx.outstanding.saturating_sub(1);
            if wc.status != WcStatus::Success {
                // A remote access error (bad pointer) ends the connection
                // (RDMA semantics); the caller reconnects.
                self.dead.store(true, Ordering::Release);
                return Err(LinkError::Verbs(format!(
                    "RDMA Read failed: {:?}",
                    wc.status
                )));
            }
            if wc.wr_id == READ_ID {
                return Ok(());
            }
        }
    }
}
