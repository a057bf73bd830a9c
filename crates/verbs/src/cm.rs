//! The connection manager (like rdma_cm over iWARP, and siw's `siw_cm.c`):
//! listen, connect with private data and IRD/ORD, accept, reject,
//! disconnect; the MPA request/reply exchange of RFC 5044 / RFC 6581.
//!
//! Calls are blocking: `connect` returns once the connection is established
//! (or rejected), `Listener::get_request` once a valid MPA request arrived.

use crate::device::Device;
use crate::error::{Error, Result};
use crate::iwarp::Conn;
pub use crate::negotiated::Negotiated;
use crate::qp::{QpState, QueuePair};
use crate::samehost::{Link, Offer};
use softrdma_wire::ddp::DdpHeader;
use softrdma_wire::mpa::{self, MpaFrame, MpaHeader, MpaKind, MpaV2};
use softrdma_wire::terminate::codes;
use softrdma_wire::TermCode;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How to connect or accept.
#[derive(Debug, Clone)]
pub struct ConnParams {
    /// Private data for the peer (at most 508 bytes with MPA v2).
    pub private_data: Vec<u8>,
    /// Inbound RDMA Reads we accept at once (responder resources).
    pub ird: u16,
    /// Outbound RDMA Reads we issue at once (initiator depth).
    pub ord: u16,
    /// MPA revision to offer: 1 or 2 (2 carries IRD/ORD).
    pub mpa_revision: u8,
    /// Ask for (initiator) or grant (responder) MPA CRC32c.
    pub crc: bool,
    /// Ask for peer-to-peer mode with a ready-to-receive frame (MPA v2).
    pub p2p: bool,
    /// How long to wait for the peer's MPA frame.
    pub timeout: Duration,
    /// Initiator: offer softrdma's extensions (`wire::mpa::ext`: FPDUs not
    /// aligned to TCP segments, written in large batches; RFC 7306 atomics
    /// and immediate data) at the start of
    /// the private data. Only for peers known to be softrdma: any other
    /// responder's application would see the 8 extra bytes. A softrdma
    /// responder strips them and answers in kind whatever this is.
    pub extensions: bool,
}

impl Default for ConnParams {
    fn default() -> Self {
        ConnParams {
            private_data: Vec::new(),
            ird: 16,
            ord: 16,
            mpa_revision: 2,
            crc: false,
            p2p: false,
            timeout: Duration::from_secs(10),
            extensions: false,
        }
    }
}

/// Private data with softrdma's extension block (and our same-host record
/// where it fits) before the application's bytes; an offer that does not
/// fit is dropped.
fn with_ext(flags: u8, offer: &mut Option<Offer>, app: &[u8], v2: bool) -> Vec<u8> {
    let room = mpa::MAX_PRIVATE_DATA - if v2 { MpaV2::LEN } else { 0 };
    if mpa::ext::LEN + mpa::ext::SAME_HOST_LEN + app.len() > room {
        *offer = None;
    }
    let mut pd = mpa::ext::encode_with(flags, offer.as_ref().map(|o| &o.record));
    pd.extend_from_slice(app);
    pd
}

/// Fills `buf` from `s` by `deadline` (a whole-frame deadline, not one per
/// read: a peer that trickles a byte at a time cannot stretch it).
fn read_exact_by(s: &mut TcpStream, buf: &mut [u8], deadline: Instant) -> Result<()> {
    let mut off = 0;
    while off < buf.len() {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Error::Timeout("MPA frame"));
        }
        s.set_read_timeout(Some(left))?;
        match s.read(&mut buf[off..]) {
            Ok(0) => {
                return Err(Error::Io(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "connection closed inside the MPA frame",
                )))
            }
            Ok(n) => off += n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                return Err(Error::Timeout("MPA frame"))
            }
            Err(e) => return Err(Error::Io(e)),
        }
    }
    Ok(())
}

/// Reads one MPA request or reply, whole, within `timeout`.
fn read_frame(s: &mut TcpStream, timeout: Duration) -> Result<MpaFrame> {
    let deadline = Instant::now() + timeout;
    let mut h = [0u8; mpa::HEADER_LEN];
    read_exact_by(s, &mut h, deadline)?;
    let hdr = MpaHeader::decode(&h).map_err(|e| Error::Protocol(e.to_string()))?;
    let mut pd = vec![0u8; hdr.pd_len as usize];
    read_exact_by(s, &mut pd, deadline)?;
    s.set_read_timeout(None)?;
    MpaFrame::decode(&hdr, &pd).map_err(|e| Error::Protocol(e.to_string()))
}

fn prepare(qp: &QueuePair) -> Result<()> {
    match qp.state() {
        QpState::Reset => {
            qp.modify(QpState::Init)?;
            Ok(())
        }
        QpState::Init | QpState::Rtr => Ok(()),
        s => Err(Error::BadState {
            qpn: qp.qp_num().raw(),
            state: s,
        }),
    }
}

/// Attaches an MPA-negotiated stream to a QP and moves it to RTS.
fn establish(
    qp: &QueuePair,
    stream: TcpStream,
    n: Negotiated,
    rtr: Option<bool>,
    link: Option<Link>,
) -> Result<()> {
    let rt = &qp.pd.dev.rt;
    let epoll = rt.progress[(qp.inner.qpn as usize) % rt.progress.len()]
        .epoll
        .clone();
    let conn = Conn::new(stream, n, epoll, link)?;
    attach(qp, conn, rtr)
}

/// Attaches a negotiated connection (`rtr`: the initiator's RTR frame in
/// peer-to-peer mode, a zero-length Read if true, Write if false) and moves
/// the QP to RTS.
pub(crate) fn attach(qp: &QueuePair, conn: Conn, rtr: Option<bool>) -> Result<()> {
    let q = &qp.inner;
    let rt = &qp.pd.dev.rt;
    let n = conn.params;
    // The connection is not yet the QP's: nothing else reaches its state.
    let hold_until = {
        let mut tx = conn.tx.lock();
        if n.p2p {
            if n.initiator {
                tx.queue_rtr(rtr == Some(true));
                conn.rx.lock().rtr_read_pending = rtr == Some(true);
            } else {
                tx.rtr_wait = true;
                conn.rx.lock().rtr_expected = true;
            }
        } else if !n.initiator && !n.softrdma_peer {
            tx.hold_until = Some(std::time::Instant::now() + rt.core.config.responder_hold);
        }
        tx.hold_until
    };
    let c = Arc::new(conn);
    if q.transport.set(c.clone()).is_err() {
        return Err(Error::inval("QP is already connected"));
    }
    q.set_state(QpState::Rtr);
    q.set_state(QpState::Rts);
    c.register(q.qpn)?;
    if let Some(until) = hold_until {
        // Transmission starts at the hold's end if no FPDU came first.
        c.add_timer(q, until);
    }
    // Send the RTR (initiator) and anything posted meanwhile.
    q.kick_with(q.sq.lock());
    tracing::debug!(qpn = q.qpn, local = %c.local, peer = %c.peer, ?n, "connection established");
    Ok(())
}

impl QueuePair {
    /// Connects to a listener (active side): TCP connect, MPA request,
    /// MPA reply, then RTS. Returns the peer's private data.
    pub fn connect(&self, addr: impl ToSocketAddrs, params: &ConnParams) -> Result<Vec<u8>> {
        prepare(self)?;
        if !(1..=2).contains(&params.mpa_revision) {
            return Err(Error::inval("MPA revision must be 1 or 2"));
        }
        let addr = addr
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| Error::inval("no address"))?;
        let mut s = crate::tcp::connect(addr, params.timeout)?;
        let v2 = (params.mpa_revision == 2).then_some(MpaV2 {
            ird: params.ird.min(mpa::IRD_ORD_MASK),
            ord: params.ord.min(mpa::IRD_ORD_MASK),
            peer_to_peer: params.p2p,
            rtr_send: false,
            rtr_write: params.p2p,
            rtr_read: params.p2p,
        });
        let core = &self.pd.dev.rt.core;
        let mut offer = params
            .extensions
            .then(|| Offer::new(&core.shm, self.pd.id))
            .flatten();
        let private_data = if params.extensions {
            with_ext(
                mpa::ext::KNOWN,
                &mut offer,
                &params.private_data,
                v2.is_some(),
            )
        } else {
            check_siw_private_data(params.private_data.len(), v2.is_some())?;
            params.private_data.clone()
        };
        let req = MpaFrame {
            kind: MpaKind::Request,
            markers: false,
            crc: params.crc,
            reject: false,
            revision: params.mpa_revision,
            v2,
            private_data,
        };
        s.write_all(&req.encode().map_err(|e| Error::inval(e.to_string()))?)?;
        let mut rep = read_frame(&mut s, params.timeout)?;
        // The responder answers an offer with its own block (a rejecting
        // one may not); without an offer there is nothing to strip.
        let (ext, peer_same_host) = if params.extensions {
            let (flags, same_host, rest) = mpa::ext::parse(&rep.private_data);
            let rest = rest.to_vec();
            rep.private_data = rest;
            (flags, same_host)
        } else {
            (None, None)
        };
        if rep.kind != MpaKind::Reply {
            return Err(Error::Protocol("expected an MPA reply".into()));
        }
        if rep.reject {
            return Err(Error::Rejected {
                private_data: rep.private_data,
            });
        }
        if rep.markers {
            return Err(Error::Protocol("peer wants MPA markers".into()));
        }
        if rep.revision > params.mpa_revision {
            return Err(Error::Protocol(format!(
                "reply revision {} above request revision {}",
                rep.revision, params.mpa_revision
            )));
        }
        // An enhanced (revision 2) request gets an enhanced reply (siw
        // refuses anything else too; issue 20, item 7).
        if v2.is_some() && (rep.revision != 2 || rep.v2.is_none()) {
            return Err(Error::Protocol(format!(
                "a revision-{} {} reply to an enhanced request",
                rep.revision,
                if rep.v2.is_some() {
                    "enhanced"
                } else {
                    "non-enhanced"
                }
            )));
        }
        let (ord, p2p, rtr, ird) = match (v2, rep.v2) {
            (Some(_), Some(r)) => {
                let p2p = params.p2p && r.peer_to_peer;
                let rtr = if p2p {
                    if r.rtr_write {
                        Some(false)
                    } else if r.rtr_read {
                        Some(true)
                    } else {
                        return Err(Error::Protocol("no usable RTR type".into()));
                    }
                } else {
                    None
                };
                let peer_ird = if r.ird == mpa::IRD_ORD_MASK {
                    params.ord
                } else {
                    r.ird
                };
                // The responder's ORD must fit our IRD: raise ours up to the
                // device's maximum, as siw does; past it, refuse with the
                // "insufficient IRD" Terminate (issue 20, item 7).
                let peer_ord = if r.ord == mpa::IRD_ORD_MASK { 0 } else { r.ord };
                if peer_ord > self.pd.dev.attr().max_ird {
                    let _ = send_mpa_terminate(
                        &mut s,
                        codes::MPA_INSUFFICIENT_IRD,
                        rep.crc || params.crc,
                    );
                    return Err(Error::Protocol(format!(
                        "the responder's ORD {peer_ord} exceeds our largest IRD {}",
                        self.pd.dev.attr().max_ird
                    )));
                }
                (params.ord.min(peer_ird), p2p, rtr, params.ird.max(peer_ord))
            }
            _ => (params.ord, false, None, params.ird),
        };
        let link = offer.and_then(|o| Link::establish(&core.peers, o, peer_same_host.as_ref()));
        let n = Negotiated {
            revision: rep.revision,
            // CRC when either side asked (RFC 5044 section 7.1.2).
            crc: rep.crc || params.crc,
            ird,
            // The peer's IRD of 0 means no Reads: they fail locally.
            ord,
            p2p,
            initiator: true,
            large_segments: ext.is_some_and(|f| f & mpa::ext::LARGE_SEGMENTS != 0),
            rfc7306: ext.is_some_and(|f| f & mpa::ext::RFC7306 != 0),
            same_host: link.as_ref().is_some_and(Link::direct),
            one_shot: ext.is_some_and(|f| f & mpa::ext::ONE_SHOT != 0),
            one_shot_se: ext
                .is_some_and(|f| f & mpa::ext::ONE_SHOT != 0 && f & mpa::ext::ONE_SHOT_SE != 0),
            softrdma_peer: ext.is_some(),
        };
        establish(self, s, n, rtr, link)?;
        Ok(rep.private_data)
    }
}

/// Linux siw drops, without a word, a connection whose MPA private data
/// (the 4-byte IRD/ORD block of an enhanced frame included) exceeds 256
/// bytes: refuse to send such a frame to a peer that may be siw (one
/// without softrdma's extensions; issue 20, item 7).
pub(crate) const SIW_MAX_PRIVATE_DATA: usize = 256;

/// Sends a Terminate (queue 2, MSN 1) straight on the stream just after the
/// MPA exchange, when the connection cannot be established (an MPA-layer
/// error; `crc`: as negotiated).
fn send_mpa_terminate(s: &mut TcpStream, code: TermCode, crc: bool) -> Result<()> {
    let t = softrdma_wire::terminate::Terminate::new(code);
    let mut body = Vec::with_capacity(t.encoded_len());
    t.encode(&mut body);
    let hdr = DdpHeader::Untagged(softrdma_wire::ddp::UntaggedHeader {
        last: true,
        opcode: softrdma_wire::ddp::Opcode::Terminate,
        inval_stag: 0,
        qn: softrdma_wire::ddp::QN_TERMINATE,
        msn: 1,
        mo: 0,
    });
    let mut ulpdu = vec![0u8; hdr.len()];
    hdr.encode(&mut ulpdu);
    ulpdu.extend_from_slice(&body);
    let mut fpdu = Vec::new();
    mpa::encode_fpdu(&ulpdu, crc, &mut fpdu);
    s.write_all(&fpdu)?;
    let _ = s.shutdown(std::net::Shutdown::Both);
    Ok(())
}

fn check_siw_private_data(app: usize, v2: bool) -> Result<()> {
    let total = app + if v2 { MpaV2::LEN } else { 0 };
    if total > SIW_MAX_PRIVATE_DATA {
        return Err(Error::inval(format!(
            "{app} bytes of private data ({total} with the IRD/ORD block) exceed {SIW_MAX_PRIVATE_DATA}, \
             Linux siw's limit (more needs ConnParams::extensions, between softrdma ends)"
        )));
    }
    Ok(())
}

/// A listening endpoint (`rdma_listen`).
///
/// An acceptor thread takes TCP connections and reads each one's MPA
/// request on a thread of its own, under a whole-frame deadline
/// ([`DeviceConfig::handshake_timeout`](crate::DeviceConfig)), as siw keeps
/// one timer per endpoint: a peer that is slow or silent delays nobody
/// else's connection (issue 20, item 4: one that trickled a byte every 3 s
/// held off a valid client for 47 s). Valid requests queue for
/// [`Listener::get_request`].
pub struct Listener {
    dev: Device,
    addr: SocketAddr,
    /// Requests, and `None` from [`Listener::close`] to wake a waiter.
    requests: std::sync::Mutex<std::sync::mpsc::Receiver<Option<ConnectRequest>>>,
    wake: std::sync::mpsc::Sender<Option<ConnectRequest>>,
    stop: Arc<AtomicBool>,
    /// The listening socket (a second descriptor of it) and the acceptor
    /// that owns the first, so that `drop` can close both before it
    /// returns: the port is free again at once, as after the kernel's
    /// `rdma_destroy_id` (perftest listens again on it straight away).
    socket: TcpListener,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

/// Handshakes read at once per listener; connections beyond are closed.
const MAX_HANDSHAKES: usize = 256;

impl Drop for Listener {
    fn drop(&mut self) {
        self.close();
        if let Some(t) = self.acceptor.take() {
            let _ = t.join();
        }
    }
}

impl Device {
    /// Listens for connections on `addr` (e.g. "127.0.0.1:7174"; port 0
    /// picks one).
    pub fn listen(&self, addr: impl ToSocketAddrs) -> Result<Listener> {
        let listener = crate::tcp::listen(addr)?;
        let local = listener.local_addr()?;
        let (tx, rx) = std::sync::mpsc::channel();
        let stop = Arc::new(AtomicBool::new(false));
        let deadline = self.rt.core.config.handshake_timeout;
        let st = stop.clone();
        let socket = listener.try_clone()?;
        let wake = tx.clone();
        let acceptor = crate::threads::spawn("softrdma-accept".into(), move || {
            accept_loop(listener, tx, st, deadline)
        })?;
        Ok(Listener {
            dev: self.clone(),
            addr: local,
            requests: std::sync::Mutex::new(rx),
            wake,
            stop,
            socket,
            acceptor: Some(acceptor),
        })
    }
}

/// The acceptor: one handshake thread per connection.
fn accept_loop(
    listener: TcpListener,
    tx: std::sync::mpsc::Sender<Option<ConnectRequest>>,
    stop: Arc<AtomicBool>,
    deadline: Duration,
) {
    let active = Arc::new(AtomicUsize::new(0));
    loop {
        let accepted = listener.accept();
        if stop.load(Ordering::Acquire) {
            return;
        }
        let (s, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(10));
                continue;
            }
        };
        if active.load(Ordering::Acquire) >= MAX_HANDSHAKES {
            tracing::warn!(%peer, "{MAX_HANDSHAKES} handshakes in progress; connection dropped");
            continue;
        }
        active.fetch_add(1, Ordering::AcqRel);
        let (tx, active) = (tx.clone(), active.clone());
        let spawned = crate::threads::spawn("softrdma-mpa".into(), move || {
            if let Some(req) = handshake(s, peer, deadline) {
                let _ = tx.send(Some(req));
            }
            active.fetch_sub(1, Ordering::AcqRel);
        });
        if spawned.is_err() {
            tracing::warn!(%peer, "no thread for the handshake; connection dropped");
        }
    }
}

/// Reads a connection's MPA request by `deadline`; `None` if it is not a
/// valid one (refused or dropped, and logged).
fn handshake(mut s: TcpStream, peer: SocketAddr, deadline: Duration) -> Option<ConnectRequest> {
    crate::tcp::tune_accepted(&s).ok()?;
    match read_frame(&mut s, deadline) {
        Ok(mut f) if f.kind == MpaKind::Request && !f.markers => {
            let (ext, same_host, rest) = mpa::ext::parse(&f.private_data);
            let rest = rest.to_vec();
            f.private_data = rest;
            Some(ConnectRequest {
                stream: s,
                frame: f,
                ext,
                same_host,
                peer,
            })
        }
        Ok(f) => {
            tracing::warn!(%peer, "refusing MPA request (markers or wrong frame)");
            let _ = reply_reject(&mut s, f.revision.clamp(1, 2), &[]);
            None
        }
        Err(e) => {
            tracing::warn!(%peer, error = %e, "bad MPA request; connection dropped");
            None
        }
    }
}

impl Listener {
    /// The address the listener is bound to (its port, when it was asked for port 0).
    pub fn local_addr(&self) -> Result<SocketAddr> {
        Ok(self.addr)
    }

    /// The device whose QPs accept this listener's connections.
    pub fn device(&self) -> &Device {
        &self.dev
    }

    /// Stops listening: the port is free once the last descriptor closes
    /// (at once when no other thread is in the acceptor; `drop` waits for
    /// it), new connections are refused, and a thread waiting in
    /// [`Listener::get_request`] or [`Listener::get_request_timeout`] returns
    /// [`Error::Closed`] at once, as they do from then on. Requests already
    /// taken in but not yet handed out are dropped (their connections close).
    pub fn close(&self) {
        if self.stop.swap(true, Ordering::AcqRel) {
            return;
        }
        // Shutting a listening socket down wakes a thread in accept()
        // (EINVAL on Linux); the acceptor sees `stop` and returns, closing
        // its descriptor, and ours closes when the fields drop.
        let _ = socket2::SockRef::from(&self.socket).shutdown(std::net::Shutdown::Both);
        let _ = self.wake.send(None);
    }

    /// Waits for the next valid connection request. Connections whose MPA
    /// request is malformed (or asks for markers) are refused and skipped.
    pub fn get_request(&self) -> Result<ConnectRequest> {
        if self.stop.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        match self
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .recv()
        {
            Ok(Some(r)) if !self.stop.load(Ordering::Acquire) => Ok(r),
            _ => Err(Error::Closed),
        }
    }

    /// Like [`Listener::get_request`], giving up after `timeout` when no
    /// valid request arrives.
    pub fn get_request_timeout(&self, timeout: Duration) -> Result<Option<ConnectRequest>> {
        if self.stop.load(Ordering::Acquire) {
            return Err(Error::Closed);
        }
        match self
            .requests
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .recv_timeout(timeout)
        {
            Ok(Some(r)) if !self.stop.load(Ordering::Acquire) => Ok(Some(r)),
            Ok(_) => Err(Error::Closed),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Ok(None),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(Error::Closed),
        }
    }
}

fn reply_reject(s: &mut TcpStream, revision: u8, pd: &[u8]) -> Result<()> {
    let rep = MpaFrame {
        kind: MpaKind::Reply,
        markers: false,
        crc: false,
        reject: true,
        revision,
        v2: None,
        private_data: pd.to_vec(),
    };
    s.write_all(&rep.encode().map_err(|e| Error::inval(e.to_string()))?)?;
    let _ = s.shutdown(std::net::Shutdown::Both);
    Ok(())
}

/// A connection request waiting for accept or reject.
pub struct ConnectRequest {
    stream: TcpStream,
    /// The request, its private data without the extension block.
    frame: MpaFrame,
    /// Extension flags the initiator offered (`wire::mpa::ext`).
    ext: Option<u8>,
    /// The initiator's same-host record, if it offered one.
    same_host: Option<mpa::ext::SameHost>,
    peer: SocketAddr,
}

impl std::fmt::Debug for ConnectRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectRequest")
            .field("peer", &self.peer)
            .field("frame", &self.frame)
            .finish()
    }
}

impl ConnectRequest {
    /// The initiator's MPA private data (without softrdma's extension block).
    pub fn private_data(&self) -> &[u8] {
        &self.frame.private_data
    }
    /// The initiator's TCP address.
    pub fn peer_addr(&self) -> SocketAddr {
        self.peer
    }
    /// The MPA revision the initiator offered (1 or 2).
    pub fn mpa_revision(&self) -> u8 {
        self.frame.revision
    }
    /// Whether the initiator asked for MPA CRC32c on every FPDU.
    pub fn crc_requested(&self) -> bool {
        self.frame.crc
    }
    /// The extension flags the initiator offered (`wire::mpa::ext`), if it
    /// is softrdma and offered any; already removed from the private data.
    pub fn extensions(&self) -> Option<u8> {
        self.ext
    }
    /// The initiator's IRD and ORD (MPA v2), if given.
    pub fn ird_ord(&self) -> Option<(u16, u16)> {
        self.frame.v2.map(|v| (v.ird, v.ord))
    }

    /// Accepts onto `qp`: sends the MPA reply and moves the QP to RTS.
    pub fn accept(mut self, qp: &QueuePair, params: &ConnParams) -> Result<()> {
        prepare(qp)?;
        let req = &self.frame;
        let crc = req.crc || params.crc;
        let (v2, n) = match req.v2 {
            Some(r) => {
                let peer_ird = if r.ird == mpa::IRD_ORD_MASK {
                    params.ord
                } else {
                    r.ird
                };
                // The peer's IRD of 0 means no Reads from us: they fail at
                // posting (not forced to 1; issue 20, item 7).
                let ord = params.ord.min(peer_ird);
                let ird = params
                    .ird
                    .max(if r.ord == mpa::IRD_ORD_MASK { 0 } else { r.ord });
                let ird = ird.min(qp.pd.dev.attr().max_ird).max(1);
                let p2p = r.peer_to_peer;
                // Choose one RTR type: a zero-length Write, else a Read.
                let (rtr_write, rtr_read) = if p2p {
                    if r.rtr_write {
                        (true, false)
                    } else if r.rtr_read {
                        (false, true)
                    } else {
                        let _ = reply_reject(&mut self.stream, 2, &[]);
                        return Err(Error::Protocol("peer offers only a Send RTR".into()));
                    }
                } else {
                    (false, false)
                };
                (
                    Some(MpaV2 {
                        ird,
                        ord,
                        peer_to_peer: p2p,
                        rtr_send: false,
                        rtr_write,
                        rtr_read,
                    }),
                    Negotiated {
                        revision: req.revision,
                        crc,
                        ird,
                        ord,
                        p2p,
                        initiator: false,
                        large_segments: false,
                        rfc7306: false,
                        same_host: false,
                        one_shot: false,
                        one_shot_se: false,
                        softrdma_peer: false,
                    },
                )
            }
            None => (
                None,
                Negotiated {
                    revision: req.revision,
                    crc,
                    ird: params.ird.max(1),
                    ord: params.ord.max(1),
                    p2p: false,
                    initiator: false,
                    large_segments: false,
                    rfc7306: false,
                    same_host: false,
                    one_shot: false,
                    one_shot_se: false,
                    softrdma_peer: false,
                },
            ),
        };
        let mut n = n;
        let core = &qp.pd.dev.rt.core;
        let mut link = None;
        let private_data = match self.ext {
            Some(offered) => {
                let agreed = offered & mpa::ext::KNOWN;
                n.softrdma_peer = true;
                n.large_segments = agreed & mpa::ext::LARGE_SEGMENTS != 0;
                n.rfc7306 = agreed & mpa::ext::RFC7306 != 0;
                n.one_shot = agreed & mpa::ext::ONE_SHOT != 0;
                n.one_shot_se = n.one_shot && agreed & mpa::ext::ONE_SHOT_SE != 0;
                // Same host: offer our segment if the initiator offered its
                // own and the two are on one kernel and pid namespace.
                let mut offer = match self.same_host {
                    Some(_) if agreed & mpa::ext::SAME_HOST != 0 => Offer::new(&core.shm, qp.pd.id),
                    _ => None,
                };
                let pd = with_ext(agreed, &mut offer, &params.private_data, v2.is_some());
                link = offer.and_then(|o| Link::establish(&core.peers, o, self.same_host.as_ref()));
                if link.is_some() {
                    n.same_host = link.as_ref().is_some_and(Link::direct);
                    pd
                } else {
                    // No link (another host, or no room): no record.
                    with_ext(agreed, &mut None, &params.private_data, v2.is_some())
                }
            }
            None => {
                check_siw_private_data(params.private_data.len(), v2.is_some())?;
                params.private_data.clone()
            }
        };
        let rep = MpaFrame {
            kind: MpaKind::Reply,
            markers: false,
            crc,
            reject: false,
            revision: req.revision,
            v2,
            private_data,
        };
        self.stream
            .write_all(&rep.encode().map_err(|e| Error::inval(e.to_string()))?)?;
        establish(qp, self.stream, n, None, link)
    }

    /// Rejects with optional private data (sent in the MPA reply).
    pub fn reject(mut self, private_data: &[u8]) -> Result<()> {
        if self.ext.is_none() {
            check_siw_private_data(private_data.len(), false)?;
        }
        let rev = self.frame.revision;
        reply_reject(&mut self.stream, rev, private_data)
    }
}
