//! The iWARP transport over TCP: the send path (like siw's `siw_qp_tx.c`)
//! and the receive path with direct data placement (like `siw_qp_rx.c`).
//!
//! Send path: work requests become FPDUs composed into a batch of iovecs
//! (small headers and trailers in one buffer, payload straight from the
//! registered memory) and written with one `sendmsg` per batch. The caller
//! that posts transmits inline; if the socket is full, the QP's progress
//! thread continues on EPOLLOUT.
//!
//! Receive path: the progress thread reads FPDU headers through a small
//! staging buffer, checks every access against the STag table before a byte
//! is placed, and reads large payloads from the socket directly into the
//! target memory (direct data placement). Any protocol error sends a
//! Terminate with the code of RFC 5040/5041/5044 and ends the connection.

use crate::cm::Negotiated;
use crate::cq::{WcOpcode, WcStatus, WorkCompletion};
use crate::device::AsyncEvent;
use crate::mr::{self, Access, MrInner};
use crate::qp::{QpInner, QpState, RecvWqe, Sq, Stage};
use crate::sys::{self, Epoll, RawSpan};
use crate::wr::WrOp;
use softrdma_wire::ddp::{
    self, AtomicOp, AtomicRequest, AtomicResponse, DdpHeader, Opcode, ReadRequest, TaggedHeader,
    UntaggedHeader,
};
use softrdma_wire::mpa;
use softrdma_wire::terminate::{codes, Terminate};
use softrdma_wire::TermCode;
use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Smallest segment size FPDUs are sized for, whatever TCP reports.
const MIN_SEG: usize = 536;

/// An established connection under a QP.
pub(crate) struct Conn {
    pub stream: TcpStream,
    pub fd: RawFd,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub params: Negotiated,
    pub epoll: Arc<Epoll>,
    /// Largest TCP segment payload (TCP_MAXSEG): FPDUs are sized to fit
    /// one segment and written so that none straddles two (RFC 5044 FPDU
    /// alignment; also what Wireshark's MPA dissector expects). With a
    /// softrdma peer that agreed to `ext::LARGE_SEGMENTS`, [`LARGE_SEG`]:
    /// FPDUs of the largest size go out back to back, a batch per call.
    pub seg: usize,
    out_armed: AtomicBool,
    closed: AtomicBool,
    /// We sent our FIN (graceful disconnect started here).
    fin_sent: AtomicBool,
    /// Busy-poll mode: the application's thread runs the receiver
    /// ([`crate::QueuePair::progress`]); the progress thread no longer
    /// watches for input (it still handles blocked output and hang-ups).
    polled: AtomicBool,
    /// The receiver is paused (a storage-backed Read larger than the
    /// connection's buffer budget is being streamed: nothing after it is
    /// taken from the socket until its bytes are read, so later Writes
    /// cannot overtake it and memory stays bounded). Not armed for input.
    pub rx_paused: AtomicBool,
    /// The same-host transport, where both ends agreed to it.
    pub link: Option<crate::samehost::Link>,
    /// The transmitter found the peer's ring full (ring mode): the next
    /// doorbell from the peer kicks it.
    tx_blocked: AtomicBool,
}

impl Conn {
    pub fn new(
        stream: TcpStream,
        params: Negotiated,
        epoll: Arc<Epoll>,
        link: Option<crate::samehost::Link>,
    ) -> io::Result<Conn> {
        stream.set_nonblocking(true)?;
        stream.set_nodelay(true)?;
        let fd = stream.as_raw_fd();
        let seg = if params.large_segments {
            LARGE_SEG
        } else {
            sys::tcp_mss(fd).unwrap_or(1460).clamp(MIN_SEG, 65535)
        };
        Ok(Conn {
            fd,
            seg,
            local: stream.local_addr()?,
            peer: stream.peer_addr()?,
            stream,
            params,
            epoll,
            out_armed: AtomicBool::new(false),
            closed: AtomicBool::new(false),
            fin_sent: AtomicBool::new(false),
            polled: AtomicBool::new(false),
            rx_paused: AtomicBool::new(false),
            link,
            tx_blocked: AtomicBool::new(false),
        })
    }

    pub fn register(&self, qpn: u32) -> io::Result<()> {
        self.epoll.add(self.fd, sys::EV_IN, qpn as u64)
    }

    /// The epoll interest for the current modes.
    fn interest(&self, out: bool) -> u32 {
        let inp = if self.polled.load(Ordering::Acquire) || self.rx_paused.load(Ordering::Acquire) {
            0
        } else {
            sys::EV_IN
        };
        inp | if out { sys::EV_OUT } else { 0 }
    }

    fn arm_out(&self, qpn: u32) {
        if !self.out_armed.swap(true, Ordering::AcqRel) && !self.closed.load(Ordering::Acquire) {
            let _ = self.epoll.modify(self.fd, self.interest(true), qpn as u64);
        }
    }

    fn disarm_out(&self, qpn: u32) {
        if self.out_armed.swap(false, Ordering::AcqRel) && !self.closed.load(Ordering::Acquire) {
            let _ = self.epoll.modify(self.fd, self.interest(false), qpn as u64);
        }
    }

    /// Receives into `spans` (non-blocking): from the peer's ring when it
    /// writes there, else from the socket. `Ok(0)`: the end of the stream.
    /// In ring mode the socket carries only doorbell bytes and the end of
    /// the stream; an empty ring asks for a doorbell before reporting
    /// `WouldBlock` (unless busy-polled: the application polls again).
    ///
    /// # Safety
    /// Every span must be writable memory valid for the call.
    pub unsafe fn recv_spans(&self, spans: &[RawSpan]) -> io::Result<usize> {
        let Some(r) = self
            .link
            .as_ref()
            .and_then(|l| l.ring_rx.as_ref())
            .filter(|r| r.active())
        else {
            // SAFETY: the caller's contract.
            return unsafe { sys::recv_spans(self.fd, spans) };
        };
        loop {
            // SAFETY: the caller's contract.
            let (n, wake) = unsafe { r.read_spans(spans) };
            if wake {
                self.ring_doorbell();
            }
            if n > 0 {
                return Ok(n);
            }
            // Doorbells, and the end of the stream, arrive on the socket.
            let mut bells = [0u8; 64];
            match sys::recv_into(self.fd, &mut bells) {
                Ok(0) if r.available() == 0 => return Ok(0),
                Ok(_) => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
            if self.polled.load(Ordering::Acquire) || r.park() {
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
    }

    /// Receives into `buf` (see [`Conn::recv_spans`]).
    pub fn recv(&self, buf: &mut [u8]) -> io::Result<usize> {
        let s = [RawSpan {
            ptr: buf.as_mut_ptr(),
            len: buf.len(),
        }];
        // SAFETY: one span over the caller's mutable slice.
        unsafe { self.recv_spans(&s) }
    }

    /// Sends `spans` (non-blocking): into the peer's ring in ring mode,
    /// else on the socket (`eor`: end of a TCP segment, see sys).
    ///
    /// # Safety
    /// Every span must be readable memory valid for the call.
    pub unsafe fn send_spans(&self, spans: &[RawSpan], eor: bool) -> io::Result<usize> {
        let Some(w) = self.ring_tx() else {
            // SAFETY: the caller's contract.
            return unsafe { sys::send_spans(self.fd, spans, eor) };
        };
        loop {
            // SAFETY: the caller's contract.
            let (n, wake) = unsafe { w.write_spans(spans) };
            if wake {
                self.ring_doorbell();
            }
            if n > 0 {
                if let Some(l) = &self.link {
                    l.note_ring(n);
                }
                return Ok(n);
            }
            // Full: the consumer rings back once it made room, and the
            // doorbell's on_readable kicks the transmitter (flagged before
            // asking, so a doorbell racing this finds the flag set).
            self.tx_blocked.store(true, Ordering::Release);
            if w.block() {
                if let Some(l) = &self.link {
                    l.note_ring_wait();
                }
                return Err(io::ErrorKind::WouldBlock.into());
            }
        }
    }

    fn ring_tx(&self) -> Option<&crate::shm::RingWriter> {
        self.link.as_ref().and_then(|l| l.ring_tx.as_ref())
    }

    /// Wakes the peer: one byte on the TCP stream. A full socket already
    /// holds unread doorbells, so a refused byte is no loss.
    fn ring_doorbell(&self) {
        let b = [0u8; 1];
        let s = [RawSpan {
            ptr: b.as_ptr() as *mut u8,
            len: 1,
        }];
        // SAFETY: one span over a live local byte.
        let _ = unsafe { sys::send_spans(self.fd, &s, false) };
    }

    /// Busy-poll mode, before the application sleeps on the socket: asks
    /// to be woken by the next input (in ring mode the peer then rings the
    /// doorbell). False: input is already waiting.
    pub fn arm_input(&self) -> bool {
        match self
            .link
            .as_ref()
            .and_then(|l| l.ring_rx.as_ref())
            .filter(|r| r.active())
        {
            Some(r) => r.park(),
            // The socket itself becomes readable.
            None => true,
        }
    }

    /// Whether the peer's ring holds bytes not yet read (ring mode only;
    /// over TCP the socket's readiness tells).
    pub fn input_waiting(&self) -> bool {
        self.link
            .as_ref()
            .and_then(|l| l.ring_rx.as_ref())
            .is_some_and(|r| r.active() && r.available() > 0)
    }

    /// Pauses or resumes the receiver (see `rx_paused`).
    pub fn set_rx_paused(&self, on: bool, qpn: u32) {
        self.rx_paused.store(on, Ordering::Release);
        if !self.closed.load(Ordering::Acquire) {
            let out = self.out_armed.load(Ordering::Acquire);
            let _ = self.epoll.modify(self.fd, self.interest(out), qpn as u64);
        }
    }

    /// Switches busy-poll mode (see `polled`).
    pub fn set_polled(&self, on: bool, qpn: u32) -> io::Result<()> {
        self.polled.store(on, Ordering::Release);
        if self.closed.load(Ordering::Acquire) {
            return Ok(());
        }
        let out = self.out_armed.load(Ordering::Acquire);
        self.epoll.modify(self.fd, self.interest(out), qpn as u64)
    }

    /// Stops all I/O on the connection (idempotent).
    pub fn close(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            let _ = self.epoll.delete(self.fd);
            sys::shutdown(self.fd);
        }
    }

    /// Half-closes (graceful disconnect: the peer reads end of stream).
    pub fn shutdown_write(&self) {
        self.fin_sent.store(true, Ordering::Release);
        let _ = self.stream.shutdown(std::net::Shutdown::Write);
    }

    /// The peer closed first (end of stream): answer with a reset instead
    /// of our FIN when the peer is not softrdma and we had not started to
    /// close. Linux rdma_cm picks an initiator's local port without regard
    /// to TCP's TIME_WAIT sockets and siw binds it, so every TIME_WAIT a
    /// passive close leaves on a siw client is a port whose next connection
    /// to us fails with EADDRNOTAVAIL (issue 20: perftest clients failed
    /// about once in 70 runs, nearly always with a narrow port range). A
    /// reset leaves no TIME_WAIT on either side. Nothing is lost: the
    /// peer has stopped sending, and its QP is flushed on disconnect (siw
    /// releases the socket, so anything we sent later would be reset by
    /// its kernel anyway). softrdma peers, which may half-close and read
    /// on, get the graceful FIN.
    pub fn on_peer_fin(&self) {
        if !self.params.softrdma_peer && !self.fin_sent.load(Ordering::Acquire) {
            sys::reset(self.fd);
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}

// ---------------------------------------------------------------- send path

/// What to do once a message's bytes are all written.
#[derive(Debug, Clone, Copy)]
enum Fin {
    /// A Send or Write WR is complete.
    SqDone(u64),
    None,
    /// The Terminate is out: stop transmitting.
    Terminated,
}

/// One message being turned into FPDUs.
struct TxMsg {
    hdr: DdpHeader,
    base_to: u64,
    extra: [u8; 96],
    extra_len: usize,
    spans: Vec<RawSpan>,
    total: u64,
    off: u64,
    span_idx: usize,
    span_off: usize,
    started: bool,
    fin: Fin,
    /// Keeps the source memory of a Read Response alive.
    _keep: Option<Arc<MrInner>>,
    /// The caller-owned regions the message's bytes come from
    /// (`MrInner::fenced`): entered while they are read.
    fence: Vec<Arc<MrInner>>,
    /// A Read Response streamed from a storage-backed region, a chunk at a
    /// time (`_keep` holds the chunk being sent).
    backed: Option<BackedSrc>,
}

/// Where a streamed Read Response's bytes come from.
struct BackedSrc {
    /// The storage-backed region.
    mr: Arc<MrInner>,
    /// The region address of the message's byte 0.
    src_to: u64,
    /// The message offset where the chunk in `_keep` ends.
    chunk_end: u64,
    /// Bytes counted against the connection's budget (`Tx::backed_bytes`).
    counted: u64,
    /// The receiver was paused for this response: resume it when done.
    paused_rx: bool,
}

/// Bytes of a storage-backed Read read from the device at a time.
pub(crate) const BACKED_CHUNK: u64 = 1 << 20;
/// Bytes of storage-backed Read Responses a connection holds in memory at
/// most (eagerly read small ones, plus one chunk of a streamed one).
pub(crate) const BACKED_BUDGET: u64 = 16 << 20;

impl TxMsg {
    fn new(hdr: DdpHeader, spans: Vec<RawSpan>, total: u64, fin: Fin) -> TxMsg {
        let base_to = match hdr {
            DdpHeader::Tagged(t) => t.to,
            DdpHeader::Untagged(_) => 0,
        };
        TxMsg {
            hdr,
            base_to,
            extra: [0; 96],
            extra_len: 0,
            spans,
            total,
            off: 0,
            span_idx: 0,
            span_off: 0,
            started: false,
            fin,
            _keep: None,
            fence: Vec::new(),
            backed: None,
        }
    }
}

#[derive(Clone, Copy)]
enum IoRef {
    Hdr { off: u32, len: u32 },
    Mem(RawSpan),
}

/// Bytes composed and not yet written, as iovec references.
struct Batch {
    hdrs: Vec<u8>,
    refs: Vec<IoRef>,
    total: usize,
    sent: usize,
    ref_idx: usize,
    ref_off: usize,
    fins: Vec<Fin>,
    /// Byte offsets (into the batch) where a TCP segment must begin: each
    /// run between two cuts holds whole FPDUs and fits one segment, and is
    /// written with MSG_EOR.
    cuts: Vec<usize>,
    cut_idx: usize,
    chunk_start: usize,
    /// The source memory of composed Read Responses, held until the batch
    /// is written (the responder's consumer may deregister it meanwhile,
    /// and a backed region's bytes live only here).
    keeps: Vec<Arc<MrInner>>,
    /// Caller-owned regions whose memory the batch refers to: entered
    /// around each write (`MrInner::enter`).
    fence: Vec<Arc<MrInner>>,
}

/// The "segment" used with `ext::LARGE_SEGMENTS`: one `sendmsg` per batch.
pub(crate) const LARGE_SEG: usize = BATCH_BYTES;
const BATCH_REFS: usize = 60;
const BATCH_BYTES: usize = 1 << 20;
const COPY_MAX: usize = 512;

impl Batch {
    fn new() -> Batch {
        Batch {
            hdrs: Vec::new(),
            refs: Vec::new(),
            total: 0,
            sent: 0,
            ref_idx: 0,
            ref_off: 0,
            fins: Vec::new(),
            cuts: Vec::new(),
            cut_idx: 0,
            chunk_start: 0,
            keeps: Vec::new(),
            fence: Vec::new(),
        }
    }

    /// Called after each FPDU (which began at batch offset `start`): if the
    /// current run no longer fits one segment, the FPDU starts a new run.
    fn fpdu_done(&mut self, start: usize, seg: usize) {
        if self.total - self.chunk_start > seg && start > self.chunk_start {
            self.cuts.push(start);
            self.chunk_start = start;
        }
    }

    fn full(&self) -> bool {
        self.refs.len() + 4 >= BATCH_REFS
            || self.total >= BATCH_BYTES
            || self.hdrs.len() >= 48 * 1024
    }

    fn is_empty(&self) -> bool {
        self.total == 0
    }

    fn clear(&mut self) {
        self.hdrs.clear();
        self.refs.clear();
        self.total = 0;
        self.sent = 0;
        self.ref_idx = 0;
        self.ref_off = 0;
        self.cuts.clear();
        self.cut_idx = 0;
        self.chunk_start = 0;
        self.keeps.clear();
        self.fence.clear();
    }

    fn push_hdr(&mut self, start: usize) {
        let len = self.hdrs.len() - start;
        if len == 0 {
            return;
        }
        self.total += len;
        if let Some(IoRef::Hdr { off, len: l }) = self.refs.last_mut() {
            if *off as usize + *l as usize == start {
                *l += len as u32;
                return;
            }
        }
        self.refs.push(IoRef::Hdr {
            off: start as u32,
            len: len as u32,
        });
    }

    fn push_mem(&mut self, s: RawSpan) {
        self.total += s.len;
        self.refs.push(IoRef::Mem(s));
    }

    /// Writes as much as the socket takes. Ok(true): all written.
    fn write(&mut self, c: &Conn) -> io::Result<bool> {
        let mut spans = [RawSpan {
            ptr: std::ptr::null_mut(),
            len: 0,
        }; 64];
        while self.sent < self.total {
            while self.cut_idx < self.cuts.len() && self.cuts[self.cut_idx] <= self.sent {
                self.cut_idx += 1;
            }
            let limit = self.cuts.get(self.cut_idx).copied().unwrap_or(self.total);
            let mut want = limit - self.sent;
            let mut n = 0;
            let mut off = self.ref_off;
            for r in &self.refs[self.ref_idx..] {
                if n == spans.len() || want == 0 {
                    break;
                }
                let (ptr, len) = match *r {
                    IoRef::Hdr { off, len } => {
                        // SAFETY: off+len lies within hdrs (built by push_hdr).
                        (
                            unsafe { self.hdrs.as_ptr().add(off as usize) } as *mut u8,
                            len as usize,
                        )
                    }
                    IoRef::Mem(s) => (s.ptr, s.len),
                };
                let k = (len - off).min(want);
                spans[n] = RawSpan {
                    // SAFETY: off < len for the first ref (cursor invariant), 0 after.
                    ptr: unsafe { ptr.add(off) },
                    len: k,
                };
                want -= k;
                off = 0;
                n += 1;
            }
            if !mr::enter_all(&self.fence) {
                return Err(io::Error::other(
                    "memory of a work request was deregistered while it was being sent",
                ));
            }
            // A run that ends at a cut (or the batch's end) closes its
            // segment; a run cut short by the iovec limit does not.
            // SAFETY: header spans point into self.hdrs, which is not touched
            // during the call; memory spans belong to registrations held by
            // the WRs (or read responses) that own these bytes, and the
            // caller-owned ones among them are entered (self.fence).
            let res = unsafe { c.send_spans(&spans[..n], want == 0) };
            mr::exit_all(&self.fence);
            match res {
                Ok(mut w) => {
                    self.sent += w;
                    // Advance the cursor.
                    while w > 0 {
                        let len = match self.refs[self.ref_idx] {
                            IoRef::Hdr { len, .. } => len as usize,
                            IoRef::Mem(s) => s.len,
                        };
                        let left = len - self.ref_off;
                        if w >= left {
                            w -= left;
                            self.ref_idx += 1;
                            self.ref_off = 0;
                        } else {
                            self.ref_off += w;
                            w = 0;
                        }
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}

/// The transmitter of one QP (lives inside the send-queue lock).
pub(crate) struct Tx {
    batch: Batch,
    cur: Option<TxMsg>,
    /// Read Responses to send, in request order.
    irq: VecDeque<TxMsg>,
    /// Inbound Read Requests accepted and not yet fully answered.
    pub irq_used: usize,
    term: Option<TxMsg>,
    rtr: Option<TxMsg>,
    /// Responder in peer-to-peer mode: wait for the initiator's RTR.
    pub rtr_wait: bool,
    /// Responder (RFC 5044 section 7.1.2 rule 4): nothing is sent before
    /// the first FPDU from the initiator arrives, or until this instant
    /// (a grace period, so that applications whose responder speaks first
    /// without peer-to-peer mode do not deadlock).
    pub hold_until: Option<std::time::Instant>,
    /// Initiator: our Read RTR awaits its zero-length Read Response (it
    /// counts against the peer's IRD like any Read).
    pub rtr_read_pending: bool,
    /// Bytes of storage-backed Read Responses held in memory (see
    /// [`BACKED_BUDGET`]).
    pub backed_bytes: u64,
    /// When the transmitter last moved bytes (the stall check of a paused
    /// receiver: a peer that does not read is refused).
    pub last_progress: std::time::Instant,
    terminated: bool,
    send_msn: u32,
    /// Queue 1: Read Requests and Atomic Requests.
    rr_msn: u32,
    term_msn: u32,
    /// Queue 3: Atomic Responses.
    atomic_resp_msn: u32,
    /// A local failure found while transmitting (fail the QP after unlock).
    pub pending_fail: Option<String>,
    /// RDMAP messages (Terminate aside) composed for the stream so far: a
    /// same-host copy may run only once the peer processed them all.
    msgs_sent: u64,
}

impl Tx {
    pub fn new() -> Tx {
        Tx {
            batch: Batch::new(),
            cur: None,
            irq: VecDeque::new(),
            irq_used: 0,
            term: None,
            rtr: None,
            rtr_wait: false,
            hold_until: None,
            rtr_read_pending: false,
            backed_bytes: 0,
            last_progress: std::time::Instant::now(),
            terminated: false,
            send_msn: 1,
            rr_msn: 1,
            term_msn: 1,
            atomic_resp_msn: 1,
            pending_fail: None,
            msgs_sent: 0,
        }
    }

    pub fn clear(&mut self) {
        self.batch.clear();
        self.batch.fins.clear();
        self.cur = None;
        self.irq.clear();
        self.rtr = None;
    }

    /// Queues a Terminate; it goes out before anything else not yet started.
    pub fn queue_terminate(&mut self, code: TermCode, hdr: Option<&[u8]>) {
        if self.terminated || self.term.is_some() {
            return;
        }
        let mut t = Terminate::new(code);
        if let Some(h) = hdr {
            let n = DdpHeader::len_from_ctrl(h[0]).min(h.len());
            t.ddp_header = Some(h[..n].to_vec());
            t.ddp_seg_len = None;
            if h.len() >= n + ReadRequest::LEN
                && h.len() > 1
                && h[1] & 0x0F == Opcode::ReadRequest as u8
            {
                t.rdmap_header = Some(h[n..n + ReadRequest::LEN].to_vec());
            }
        }
        let mut body = Vec::with_capacity(64);
        t.encode(&mut body);
        let hdr = DdpHeader::Untagged(UntaggedHeader {
            last: true,
            opcode: Opcode::Terminate,
            inval_stag: 0,
            qn: ddp::QN_TERMINATE,
            msn: self.term_msn,
            mo: 0,
        });
        self.term_msn += 1;
        let mut m = TxMsg::new(hdr, Vec::new(), 0, Fin::Terminated);
        m.extra[..body.len()].copy_from_slice(&body);
        m.extra_len = body.len();
        // A Terminate must not cut into a message already on the wire; if
        // one is half-sent it is finished first (the batch drains).
        self.term = Some(m);
    }

    /// Queues the peer-to-peer RTR frame (a zero-length RDMA Write, or a
    /// zero-length Read Request).
    pub fn queue_rtr(&mut self, read: bool) {
        let m = if read {
            let hdr = DdpHeader::Untagged(UntaggedHeader {
                last: true,
                opcode: Opcode::ReadRequest,
                inval_stag: 0,
                qn: ddp::QN_READ_REQUEST,
                msn: self.rr_msn,
                mo: 0,
            });
            self.rr_msn += 1;
            self.rtr_read_pending = true;
            let mut m = TxMsg::new(hdr, Vec::new(), 0, Fin::None);
            // STag 1, not 0, as siw (some hardware treats STag 0 as the
            // privileged local STag).
            ReadRequest {
                sink_stag: RTR_STAG,
                sink_to: 0,
                size: 0,
                src_stag: RTR_STAG,
                src_to: 0,
            }
            .encode(&mut m.extra);
            m.extra_len = ReadRequest::LEN;
            m
        } else {
            let hdr = DdpHeader::Tagged(TaggedHeader {
                last: true,
                opcode: Opcode::Write,
                stag: RTR_STAG,
                to: 0,
            });
            TxMsg::new(hdr, Vec::new(), 0, Fin::None)
        };
        self.rtr = Some(m);
    }

    /// Queues an Atomic Response (RFC 7306) behind earlier responses.
    pub fn queue_atomic_response(&mut self, req_id: u32, orig: u64) {
        let hdr = DdpHeader::Untagged(UntaggedHeader {
            last: true,
            opcode: Opcode::AtomicResponse,
            inval_stag: 0,
            qn: ddp::QN_ATOMIC_RESPONSE,
            msn: self.atomic_resp_msn,
            mo: 0,
        });
        self.atomic_resp_msn += 1;
        let mut m = TxMsg::new(hdr, Vec::new(), 0, Fin::None);
        m.extra_len = AtomicResponse { req_id, orig }.encode(&mut m.extra);
        self.irq.push_back(m);
        self.irq_used += 1;
    }

    /// An Immediate Data message (RFC 7306) carrying `imm` in the first
    /// four of its eight bytes (big-endian, as ibverbs' imm_data is).
    fn immediate(&mut self, imm: u32, solicited: bool, fin: Fin) -> TxMsg {
        let hdr = DdpHeader::Untagged(UntaggedHeader {
            last: true,
            opcode: if solicited {
                Opcode::ImmediateDataSe
            } else {
                Opcode::ImmediateData
            },
            inval_stag: 0,
            qn: ddp::QN_SEND,
            msn: self.send_msn,
            mo: 0,
        });
        self.send_msn += 1;
        let mut m = TxMsg::new(hdr, Vec::new(), 0, fin);
        m.extra[..4].copy_from_slice(&imm.to_be_bytes());
        m.extra_len = ddp::IMMEDIATE_LEN;
        m
    }

    /// Queues a Read Response (source memory already checked).
    pub fn queue_read_response(&mut self, rr: &ReadRequest, src: Arc<MrInner>) {
        let mut spans = Vec::new();
        if rr.size > 0 {
            src.resolve(rr.src_to, rr.size as u64, &mut spans);
        }
        let hdr = DdpHeader::Tagged(TaggedHeader {
            last: true,
            opcode: Opcode::ReadResponse,
            stag: rr.sink_stag,
            to: rr.sink_to,
        });
        let mut m = TxMsg::new(hdr, spans, rr.size as u64, Fin::None);
        if src.fenced {
            m.fence.push(src.clone());
        }
        m._keep = Some(src);
        self.irq.push_back(m);
        self.irq_used += 1;
    }

    /// Queues a Read Response streamed from the storage-backed region `mr`
    /// a chunk at a time (the receiver is paused until it is composed).
    pub fn queue_streamed_read_response(&mut self, rr: &ReadRequest, mr: Arc<MrInner>) {
        let hdr = DdpHeader::Tagged(TaggedHeader {
            last: true,
            opcode: Opcode::ReadResponse,
            stag: rr.sink_stag,
            to: rr.sink_to,
        });
        let mut m = TxMsg::new(hdr, Vec::new(), rr.size as u64, Fin::None);
        m.backed = Some(BackedSrc {
            mr,
            src_to: rr.src_to,
            chunk_end: 0,
            counted: 0,
            paused_rx: true,
        });
        self.irq.push_back(m);
        self.irq_used += 1;
    }
}

impl TxMsg {
    /// A streamed message whose chunk is used up (and more is to come).
    fn needs_chunk(&self) -> bool {
        self.backed
            .as_ref()
            .is_some_and(|b| self.off >= b.chunk_end && self.off < self.total)
    }

    /// Reads the next chunk of a streamed Read Response from its device
    /// (the batch holds nothing of the previous one).
    fn next_chunk(&mut self, budget: &mut u64) -> io::Result<()> {
        let b = self.backed.as_mut().expect("a streamed message");
        let n = BACKED_CHUNK.min(self.total - self.off);
        let mut buf = vec![0u8; n as usize].into_boxed_slice();
        let dev = b.mr.backend.as_ref().expect("backed region");
        dev.read_at(b.src_to + self.off - b.mr.iova, &mut buf)?;
        let holder = Arc::new(MrInner::holding(buf, b.src_to + self.off));
        *budget = budget.saturating_sub(b.counted) + n;
        b.counted = n;
        b.chunk_end = self.off + n;
        self.spans.clear();
        holder.resolve(b.src_to + self.off, n, &mut self.spans);
        self.span_idx = 0;
        self.span_off = 0;
        self._keep = Some(holder);
        Ok(())
    }
}

/// Picks the next message to transmit, if any may start now.
fn next_msg(q: &QpInner, sq: &mut Sq) -> Option<TxMsg> {
    if let Some(t) = sq.tx.term.take() {
        return Some(t);
    }
    if sq.tx.terminated {
        return None;
    }
    if let Some(r) = sq.tx.rtr.take() {
        return Some(r);
    }
    if sq.tx.rtr_wait {
        return None;
    }
    if let Some(until) = sq.tx.hold_until {
        if std::time::Instant::now() < until {
            return None;
        }
        sq.tx.hold_until = None;
    }
    if let Some(r) = sq.tx.irq.pop_front() {
        return Some(r);
    }
    if q.state() != QpState::Rts {
        return None;
    }
    let ord = q.conn.get().map_or(1, |c| c.params.ord) as usize;
    loop {
        let seq = sq.next_tx;
        let orq_busy = !sq.orq.is_empty() || sq.tx.rtr_read_pending;
        let orq_len = sq.orq.len() + sq.tx.rtr_read_pending as usize;
        let pd = q.pd;
        let sent = sq.tx.msgs_sent;
        let w = sq.get_mut(seq)?;
        if matches!(w.stage, Stage::Done(_)) {
            sq.next_tx += 1;
            continue;
        }
        if w.fence && orq_busy {
            return None;
        }
        match w.op.clone() {
            WrOp::LocalInv { stag } => {
                let st = match q.core.stags.lookup(stag) {
                    Some(mr) if mr.pd == pd && mr.invalidatable => {
                        q.core.stags.set_valid(&mr, false);
                        WcStatus::Success
                    }
                    _ => WcStatus::LocProtErr,
                };
                w.stage = Stage::Done(st);
                sq.next_tx += 1;
                if st != WcStatus::Success {
                    sq.tx.pending_fail = Some(format!("local invalidate of {stag:#x} refused"));
                    return None;
                }
                continue;
            }
            WrOp::FastReg {
                index_stag,
                key,
                iova,
                access,
            } => {
                let index = index_stag >> 8;
                let owned = q.core.stags.reserved_pd(index) == Some(pd);
                let st = if owned && !w.keep.is_empty() {
                    let keep = std::mem::take(&mut w.keep);
                    let spans = std::mem::take(&mut w.spans);
                    crate::device::fast_reg_build(
                        &q.core, pd, index, key, iova, access, keep, spans,
                    );
                    WcStatus::Success
                } else {
                    WcStatus::LocProtErr
                };
                w.stage = Stage::Done(st);
                sq.next_tx += 1;
                if st != WcStatus::Success {
                    sq.tx.pending_fail = Some("fast-register refused".into());
                    return None;
                }
                continue;
            }
            op @ (WrOp::RdmaRead { .. } | WrOp::Flush { .. }) => {
                let (remote_addr, rkey, flush) = match op {
                    WrOp::RdmaRead { remote_addr, rkey } => (remote_addr, rkey, false),
                    WrOp::Flush { remote_addr, rkey } => (remote_addr, rkey, true),
                    _ => unreachable!("matched above"),
                };
                // Same host: read the peer's memory directly. (A flush
                // always goes on the stream, to the peer's engine.)
                if let Some(link) = q.conn.get().and_then(|c| c.link.as_ref()) {
                    if !flush && link.try_read(sent, &w.spans, &w.keep, w.len, rkey, remote_addr) {
                        w.stage = Stage::Done(WcStatus::Success);
                        sq.next_tx += 1;
                        continue;
                    }
                }
                if orq_len >= ord {
                    return None;
                }
                let (sink_stag, sink_to) = w.sink.as_ref().map_or((0, 0), |(m, to)| (m.stag, *to));
                let size = w.len as u32;
                w.stage = Stage::AwaitResponse;
                let hdr = DdpHeader::Untagged(UntaggedHeader {
                    last: true,
                    opcode: Opcode::ReadRequest,
                    inval_stag: 0,
                    qn: ddp::QN_READ_REQUEST,
                    msn: sq.tx.rr_msn,
                    mo: 0,
                });
                sq.tx.rr_msn += 1;
                let mut m = TxMsg::new(hdr, Vec::new(), 0, Fin::None);
                ReadRequest {
                    sink_stag,
                    sink_to,
                    size,
                    src_stag: rkey,
                    src_to: remote_addr,
                }
                .encode(&mut m.extra);
                m.extra_len = ReadRequest::LEN;
                sq.orq.push_back(seq);
                sq.next_tx += 1;
                return Some(m);
            }
            op @ (WrOp::AtomicFetchAdd { .. } | WrOp::AtomicCmpSwap { .. }) => {
                if orq_len >= ord {
                    return None;
                }
                // Plain operations in RFC 7306's masked form: no field
                // boundaries for the add, every bit compared and swapped.
                let (aop, to, stag, add_swap, mask, compare) = match op {
                    WrOp::AtomicFetchAdd {
                        remote_addr,
                        rkey,
                        add,
                    } => (AtomicOp::FetchAdd, remote_addr, rkey, add, 0, 0),
                    WrOp::AtomicCmpSwap {
                        remote_addr,
                        rkey,
                        compare,
                        swap,
                    } => (
                        AtomicOp::CompareSwap,
                        remote_addr,
                        rkey,
                        swap,
                        u64::MAX,
                        compare,
                    ),
                    _ => unreachable!("matched above"),
                };
                w.stage = Stage::AwaitResponse;
                let hdr = DdpHeader::Untagged(UntaggedHeader {
                    last: true,
                    opcode: Opcode::AtomicRequest,
                    inval_stag: 0,
                    qn: ddp::QN_READ_REQUEST,
                    msn: sq.tx.rr_msn,
                    mo: 0,
                });
                sq.tx.rr_msn += 1;
                let mut m = TxMsg::new(hdr, Vec::new(), 0, Fin::None);
                m.extra_len = AtomicRequest {
                    op: aop,
                    // The response is matched to the oldest outstanding
                    // request; the identifier double-checks it.
                    req_id: seq as u32,
                    stag,
                    to,
                    add_swap,
                    add_swap_mask: mask,
                    compare,
                    compare_mask: mask,
                }
                .encode(&mut m.extra);
                sq.orq.push_back(seq);
                sq.next_tx += 1;
                return Some(m);
            }
            WrOp::WriteImm {
                remote_addr,
                rkey,
                imm,
            } => {
                if w.imm_next {
                    let solicited = w.solicited;
                    sq.next_tx += 1;
                    return Some(sq.tx.immediate(imm, solicited, Fin::SqDone(seq)));
                }
                // The Write first; the Immediate Data message follows it
                // on the next call (the WR completes when both are out).
                w.imm_next = true;
                if let Some(link) = q.conn.get().and_then(|c| c.link.as_ref()) {
                    if link.try_write(sent, &w.spans, &w.keep, w.len, rkey, remote_addr) {
                        continue;
                    }
                }
                let hdr = DdpHeader::Tagged(TaggedHeader {
                    last: true,
                    opcode: Opcode::Write,
                    stag: rkey,
                    to: remote_addr,
                });
                let spans = std::mem::take(&mut w.spans);
                let mut m = TxMsg::new(hdr, spans, w.len, Fin::None);
                m.fence = fenced(&w.keep);
                return Some(m);
            }
            WrOp::SendImm { imm } => {
                let solicited = w.solicited;
                sq.next_tx += 1;
                return Some(sq.tx.immediate(imm, solicited, Fin::SqDone(seq)));
            }
            WrOp::RdmaWrite { remote_addr, rkey } => {
                // Same host: place into the peer's memory directly.
                if let Some(link) = q.conn.get().and_then(|c| c.link.as_ref()) {
                    if link.try_write(sent, &w.spans, &w.keep, w.len, rkey, remote_addr) {
                        w.stage = Stage::Done(WcStatus::Success);
                        sq.next_tx += 1;
                        continue;
                    }
                }
                let hdr = DdpHeader::Tagged(TaggedHeader {
                    last: true,
                    opcode: Opcode::Write,
                    stag: rkey,
                    to: remote_addr,
                });
                let spans = std::mem::take(&mut w.spans);
                let total = w.len;
                let fence = fenced(&w.keep);
                sq.next_tx += 1;
                let mut m = TxMsg::new(hdr, spans, total, Fin::SqDone(seq));
                m.fence = fence;
                return Some(m);
            }
            op @ (WrOp::Send
            | WrOp::SendWithInv { .. }
            | WrOp::SendAdvertise { .. }
            | WrOp::SendClose { .. }) => {
                // One-shot opcodes only to a peer that negotiated them;
                // otherwise a plain Send (advertise put the STag in the
                // payload) and a Send with Invalidate.
                let one_shot = q.conn.get().is_some_and(|c| c.params.one_shot);
                let (opcode, inval) = match (op, w.solicited) {
                    (WrOp::SendAdvertise { stag }, _) if one_shot => (Opcode::SendAdvertise, stag),
                    (WrOp::SendClose { stag }, _) if one_shot => (Opcode::SendClose, stag),
                    (WrOp::SendWithInv { rkey } | WrOp::SendClose { stag: rkey }, false) => {
                        (Opcode::SendInvalidate, rkey)
                    }
                    (WrOp::SendWithInv { rkey } | WrOp::SendClose { stag: rkey }, true) => {
                        (Opcode::SendSeInvalidate, rkey)
                    }
                    (_, false) => (Opcode::Send, 0),
                    (_, true) => (Opcode::SendSe, 0),
                };
                let spans = std::mem::take(&mut w.spans);
                let total = w.len;
                let fence = fenced(&w.keep);
                let hdr = DdpHeader::Untagged(UntaggedHeader {
                    last: true,
                    opcode,
                    inval_stag: inval,
                    qn: ddp::QN_SEND,
                    msn: sq.tx.send_msn,
                    mo: 0,
                });
                sq.tx.send_msn += 1;
                sq.next_tx += 1;
                let mut m = TxMsg::new(hdr, spans, total, Fin::SqDone(seq));
                m.fence = fence;
                return Some(m);
            }
        }
    }
}

/// The caller-owned regions among a WR's (`MrInner::fenced`).
fn fenced(keep: &[Arc<MrInner>]) -> Vec<Arc<MrInner>> {
    keep.iter().filter(|m| m.fenced).cloned().collect()
}

/// The STag a ready-to-receive (RTR) message names: 1, as siw.
pub(crate) const RTR_STAG: u32 = 1;

/// Appends FPDUs of `m` to the batch until it is full or the message is
/// done. Returns true when the whole message is composed.
fn compose(m: &mut TxMsg, b: &mut Batch, max_ulpdu: usize, seg: usize, crc_on: bool) -> bool {
    while !b.full() {
        let fpdu_start = b.total;
        let hl = m.hdr.len() + m.extra_len;
        // max_ulpdu >= 128 > the largest header (70).
        debug_assert!(max_ulpdu > hl);
        let room = max_ulpdu.saturating_sub(hl).max(1) as u64;
        let rem = m.total - m.off;
        // A streamed message: no further than its chunk.
        let chunk_left = m
            .backed
            .as_ref()
            .map_or(rem, |b| b.chunk_end.saturating_sub(m.off));
        if chunk_left == 0 && rem > 0 {
            return false;
        }
        let n = room.min(rem).min(chunk_left) as usize;
        let last = n as u64 == rem;
        match &mut m.hdr {
            DdpHeader::Tagged(t) => {
                t.to = m.base_to + m.off;
                t.last = last;
            }
            DdpHeader::Untagged(u) => {
                u.mo = m.off as u32;
                u.last = last;
            }
        }
        let ulpdu_len = hl + n;
        let start = b.hdrs.len();
        b.hdrs.extend_from_slice(&(ulpdu_len as u16).to_be_bytes());
        let mut h = [0u8; ddp::UNTAGGED_LEN];
        let hn = m.hdr.encode(&mut h);
        b.hdrs.extend_from_slice(&h[..hn]);
        b.hdrs.extend_from_slice(&m.extra[..m.extra_len]);
        // Payload pieces for [off, off+n).
        let mut pieces: [RawSpan; 16] = [RawSpan {
            ptr: std::ptr::null_mut(),
            len: 0,
        }; 16];
        let mut np = 0;
        let mut left = n;
        while left > 0 && np < pieces.len() {
            let s = m.spans[m.span_idx];
            let avail = s.len - m.span_off;
            let k = avail.min(left);
            pieces[np] = RawSpan {
                // SAFETY: span_off < s.len, inside the registered span.
                ptr: unsafe { s.ptr.add(m.span_off) },
                len: k,
            };
            np += 1;
            left -= k;
            m.span_off += k;
            if m.span_off == s.len {
                m.span_idx += 1;
                m.span_off = 0;
            }
        }
        if left > 0 {
            // More than 16 pieces in one FPDU: shorten this FPDU (rewrite
            // the length and the last flag) and carry on in the next one.
            let n2 = n - left;
            let ulpdu2 = hl + n2;
            b.hdrs[start..start + 2].copy_from_slice(&(ulpdu2 as u16).to_be_bytes());
            if last {
                // The last flag was set for the full length: clear it.
                let ctrl = &mut b.hdrs[start + 2];
                *ctrl &= !ddp::DDP_LAST;
            }
            let done = finish_fpdu(m, b, start, &pieces[..np], n2, ulpdu2, crc_on, false);
            b.fpdu_done(fpdu_start, seg);
            return done;
        }
        let done = finish_fpdu(m, b, start, &pieces[..np], n, ulpdu_len, crc_on, last);
        b.fpdu_done(fpdu_start, seg);
        if done {
            return true;
        }
    }
    false
}

#[allow(clippy::too_many_arguments)]
fn finish_fpdu(
    m: &mut TxMsg,
    b: &mut Batch,
    start: usize,
    pieces: &[RawSpan],
    n: usize,
    ulpdu_len: usize,
    crc_on: bool,
    last: bool,
) -> bool {
    let mut crc = crc_on.then(|| mpa::crc_update(mpa::crc_start(), &b.hdrs[start..]));
    if n <= COPY_MAX {
        let at = b.hdrs.len();
        b.hdrs.resize(at + n, 0);
        // SAFETY: the pieces lie in memory held by the WR / read response.
        unsafe { mr::copy_from_spans(pieces, 0, &mut b.hdrs[at..at + n]) };
        if let Some(c) = crc.as_mut() {
            *c = mpa::crc_update(*c, &b.hdrs[at..at + n]);
        }
        let (t, tl) = mpa::trailer(ulpdu_len, crc);
        b.hdrs.extend_from_slice(&t[..tl]);
        b.push_hdr(start);
    } else {
        b.push_hdr(start);
        if let Some(c) = crc.as_mut() {
            // SAFETY: as above.
            *c = unsafe { mr::crc_spans(*c, pieces) };
        }
        for p in pieces {
            b.push_mem(*p);
        }
        let ts = b.hdrs.len();
        let (t, tl) = mpa::trailer(ulpdu_len, crc);
        b.hdrs.extend_from_slice(&t[..tl]);
        b.push_hdr(ts);
    }
    m.off += n as u64;
    m.started = true;
    last
}

/// Runs the transmitter: writes what is composed, composes more, until
/// nothing may be sent or the socket is full (then EPOLLOUT takes over).
pub(crate) fn tx_progress(q: &QpInner, sq: &mut Sq, c: &Conn) -> io::Result<()> {
    if c.is_closed() {
        return Ok(());
    }
    // Never below 128 (a tiny MSS just means FPDUs span segments).
    let max_ulpdu = q
        .core
        .config
        .max_ulpdu
        .min(mpa::max_ulpdu_for(c.seg))
        .max(128);
    loop {
        if !sq.tx.batch.is_empty() {
            if !sq.tx.batch.write(c)? {
                // The socket wakes us when it has room; a full ring, with
                // the consumer's doorbell (on_readable kicks us then).
                if c.ring_tx().is_none() {
                    c.arm_out(q.qpn);
                }
                return Ok(());
            }
            sq.tx.batch.clear();
            sq.tx.last_progress = std::time::Instant::now();
            let fins = std::mem::take(&mut sq.tx.batch.fins);
            let mut done_any = false;
            for f in &fins {
                match *f {
                    Fin::SqDone(seq) => {
                        if let Some(w) = sq.get_mut(seq) {
                            if w.stage == Stage::Queued {
                                w.stage = Stage::Done(WcStatus::Success);
                                done_any = true;
                            }
                        }
                    }
                    Fin::Terminated => {
                        sq.tx.terminated = true;
                    }
                    Fin::None => {}
                }
            }
            let mut fins = fins;
            fins.clear();
            sq.tx.batch.fins = fins;
            if done_any {
                q.complete_in_order(sq);
            }
        }
        // Compose a new batch.
        loop {
            if sq.tx.batch.full() {
                break;
            }
            if sq.tx.cur.is_none() {
                match next_msg(q, sq) {
                    Some(m) => sq.tx.cur = Some(m),
                    None => break,
                }
            }
            let tx = &mut sq.tx;
            let m = tx.cur.as_mut().expect("current message");
            if m.needs_chunk() {
                // The batch refers to the previous chunk: send it first.
                if !tx.batch.is_empty() {
                    break;
                }
                if let Err(e) = m.next_chunk(&mut tx.backed_bytes) {
                    tracing::error!(qpn = q.qpn, "backed read failed: {e}");
                    tx.pending_fail = Some(format!("storage read for a Read Response failed: {e}"));
                    return Ok(());
                }
            }
            if !m.fence.is_empty() {
                if !mr::enter_all(&m.fence) {
                    tx.pending_fail =
                        Some("memory of a work request was deregistered before it was sent".into());
                    return Ok(());
                }
                for f in &m.fence {
                    if !tx.batch.fence.iter().any(|b| Arc::ptr_eq(b, f)) {
                        tx.batch.fence.push(f.clone());
                    }
                }
            }
            let done = compose(m, &mut tx.batch, max_ulpdu, c.seg, c.params.crc);
            mr::exit_all(&m.fence);
            if done {
                let mut m = tx.cur.take().expect("current message");
                if let Some(k) = m._keep.take() {
                    tx.batch.keeps.push(k);
                }
                if let Some(b) = m.backed.take() {
                    tx.backed_bytes = tx.backed_bytes.saturating_sub(b.counted);
                    if b.paused_rx {
                        // Composed to its end: what came after it may be
                        // received now.
                        c.set_rx_paused(false, q.qpn);
                        // (The receiver runs on its thread: bytes it staged
                        // wait for no new input.)
                        crate::progress::add_timer(&q.core, q.qpn, std::time::Instant::now());
                    }
                }
                if matches!(
                    m.hdr.opcode(),
                    Opcode::ReadResponse | Opcode::AtomicResponse
                ) {
                    tx.irq_used = tx.irq_used.saturating_sub(1);
                }
                if m.hdr.opcode() != Opcode::Terminate {
                    tx.msgs_sent += 1;
                }
                tx.batch.fins.push(m.fin);
                if matches!(m.fin, Fin::Terminated) {
                    break;
                }
            }
        }
        if sq.tx.batch.is_empty() {
            c.disarm_out(q.qpn);
            // Local operations (invalidate, fast-register) finished while
            // picking messages.
            if matches!(sq.wqes.front(), Some(w) if matches!(w.stage, Stage::Done(_))) {
                q.complete_in_order(sq);
            }
            return Ok(());
        }
    }
}

/// EPOLLOUT: the socket has room again.
pub(crate) fn on_writable(q: &Arc<QpInner>) {
    let sq = q.sq.lock();
    q.kick_with(sq);
}

// ------------------------------------------------------------- receive path

const STAGE_SIZE: usize = 64 * 1024;
/// How far past the bytes it needs one staged read may reach: enough to
/// take many small FPDUs per system call, small enough that the payload of
/// a large FPDU is mostly read straight into its target memory (direct
/// placement) rather than copied out of the stage.
const LOOKAHEAD: usize = 4096;
/// Payload still to come that is read straight into target memory.
const DIRECT_MIN: usize = 1024;
/// Largest Terminate ULPDU accepted.
const MAX_TERM_ULPDU: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Header,
    Payload,
    Trailer,
}

/// What a completed segment still has to do once its CRC checked out.
enum Action {
    None,
    Write,
    /// A segment of a Write into a backed region, received into
    /// `Rx::backed` (see `Rx::backed_run`).
    BackedWrite,
    ReadResp,
    Send,
    ReadReq(ReadRequest, Option<Arc<MrInner>>),
    /// RFC 7306 Immediate Data: the receive it consumes and the value.
    Imm(RecvWqe, u32, bool),
    /// RFC 7306 Atomic Request: checked, with its target (held by the
    /// registration).
    AtomicReq(AtomicRequest, Arc<MrInner>, RawSpan),
    AtomicResp(AtomicResponse),
    Terminate(Option<Terminate>),
    Rtr,
}

struct CurRecv {
    wqe: RecvWqe,
    received: u64,
}

/// The receiver of one QP.
pub(crate) struct Rx {
    stage: Vec<u8>,
    start: usize,
    end: usize,
    phase: Phase,
    /// The DDP header and the fixed body after it (Read Request, Atomic
    /// Request or Response, Immediate Data, Terminate's first bytes).
    hdr_bytes: [u8; ddp::UNTAGGED_LEN + AtomicRequest::LEN],
    hdr: Option<DdpHeader>,
    ulpdu_len: usize,
    payload_len: usize,
    placed: usize,
    crc: u32,
    target: Vec<RawSpan>,
    _target_keep: Option<Arc<MrInner>>,
    /// The caller-owned regions behind `target` (`MrInner::fenced`): each
    /// placement enters them, so their deregistration waits for it.
    fence: Vec<Arc<MrInner>>,
    /// Staging for Writes into backed regions (`backend.rs`): the
    /// segments of one Write message accumulate here (`backed_run`) and
    /// reach the backend together (fewer, larger, aligned device writes).
    backed: Vec<u8>,
    /// The accumulated run: region, its offset, bytes.
    backed_run: Option<(Arc<MrInner>, u64, usize)>,
    action: Action,
    send_msn: u32,
    rr_msn: u32,
    atomic_resp_msn: u32,
    cur_recv: Option<CurRecv>,
    read_resp_off: u64,
    /// Responder in peer-to-peer mode expects the RTR frame first.
    pub rtr_expected: bool,
    /// A whole FPDU has arrived.
    pub seen_fpdu: bool,
    bytes_in_frame: bool,
}

/// What the receive loop ended with.
pub(crate) enum RxEnd {
    /// The socket has nothing more for now.
    Block,
    /// Budget used up; the level-triggered poller comes back.
    Budget,
    /// End of stream at an FPDU boundary: the peer disconnected.
    Eof,
    /// End of stream inside an FPDU.
    EofMidFrame,
    Io(io::Error),
    /// A protocol error: send this Terminate.
    Fatal(TermCode, Option<Vec<u8>>, WcStatus),
    /// The peer sent a Terminate.
    PeerTerminated(TermCode),
}

enum Need {
    Have,
    End(RxEnd),
}

impl Rx {
    pub fn new() -> Rx {
        Rx {
            stage: Vec::new(),
            start: 0,
            end: 0,
            phase: Phase::Header,
            hdr_bytes: [0; ddp::UNTAGGED_LEN + AtomicRequest::LEN],
            hdr: None,
            ulpdu_len: 0,
            payload_len: 0,
            placed: 0,
            crc: 0,
            target: Vec::new(),
            _target_keep: None,
            fence: Vec::new(),
            backed: Vec::new(),
            backed_run: None,
            action: Action::None,
            send_msn: 1,
            rr_msn: 1,
            atomic_resp_msn: 1,
            cur_recv: None,
            read_resp_off: 0,
            rtr_expected: false,
            seen_fpdu: false,
            bytes_in_frame: false,
        }
    }

    pub fn take_current_recv(&mut self) -> Option<RecvWqe> {
        self.cur_recv.take().map(|c| c.wqe)
    }

    fn avail(&self) -> usize {
        self.end - self.start
    }

    /// Makes sure `n` bytes are staged.
    fn need(&mut self, c: &Conn, n: usize) -> Need {
        while self.avail() < n {
            if self.stage.is_empty() {
                self.stage = vec![0; STAGE_SIZE];
            }
            if self.stage.len() - self.start < n || self.end == self.stage.len() {
                self.stage.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            let want = (n - self.avail()).max(LOOKAHEAD);
            let lim = (self.end + want).min(self.stage.len());
            match c.recv(&mut self.stage[self.end..lim]) {
                Ok(0) => {
                    return Need::End(if self.avail() == 0 && self.phase == Phase::Header {
                        RxEnd::Eof
                    } else {
                        RxEnd::EofMidFrame
                    })
                }
                Ok(k) => self.end += k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Need::End(RxEnd::Block),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Need::End(RxEnd::Io(e)),
            }
        }
        Need::Have
    }
}

fn fatal(code: TermCode, hdr: &[u8], status: WcStatus) -> RxEnd {
    RxEnd::Fatal(code, Some(hdr.to_vec()), status)
}

/// Sub-spans of `spans` covering `[off, off+len)`.
fn sub_spans(spans: &[RawSpan], mut off: usize, mut len: usize, out: &mut Vec<RawSpan>) {
    out.clear();
    for s in spans {
        if len == 0 {
            break;
        }
        if off >= s.len {
            off -= s.len;
            continue;
        }
        let k = (s.len - off).min(len);
        out.push(RawSpan {
            // SAFETY: off < s.len keeps the pointer inside the span.
            ptr: unsafe { s.ptr.add(off) },
            len: k,
        });
        len -= k;
        off = 0;
    }
}

/// Decodes an FPDU header and decides where its payload goes.
fn on_header(q: &QpInner, rx: &mut Rx, c: &Conn) -> Result<(), RxEnd> {
    if let Need::End(e) = rx.need(c, 3) {
        return Err(e);
    }
    let s = rx.start;
    let ulpdu_len = u16::from_be_bytes([rx.stage[s], rx.stage[s + 1]]) as usize;
    let hl = DdpHeader::len_from_ctrl(rx.stage[s + 2]);
    // A ULPDU too short for its DDP header has no code in RFC 5041 or RFC
    // 5044 (MPA's 0x04 is for set-up frames): the stream cannot be parsed,
    // RDMAP's "catastrophic error, localized to RDMAP stream", the code the
    // wire crate gives every truncated header.
    if ulpdu_len < hl {
        return Err(RxEnd::Fatal(
            codes::RDMAP_CATASTROPHIC_STREAM,
            None,
            WcStatus::WrFlushErr,
        ));
    }
    if let Need::End(e) = rx.need(c, 2 + hl) {
        return Err(e);
    }
    let s = rx.start;
    let raw = &rx.stage[s + 2..s + 2 + hl];
    let ext = softrdma_wire::Ext {
        rfc7306: c.params.rfc7306,
        one_shot: c.params.one_shot,
    };
    let hdr = match DdpHeader::decode_ext(raw, ext) {
        Ok(h) => h,
        // term_code_in: a bad DDP version in a tagged segment gets the
        // tagged code (RFC 5041 section 7.2).
        Err(e) => return Err(fatal(e.term_code_in(raw), raw, WcStatus::WrFlushErr)),
    };
    let extra = match hdr.opcode() {
        Opcode::ReadRequest => ReadRequest::LEN,
        Opcode::AtomicRequest => AtomicRequest::LEN,
        Opcode::AtomicResponse => AtomicResponse::LEN,
        Opcode::ImmediateData | Opcode::ImmediateDataSe => ddp::IMMEDIATE_LEN,
        Opcode::Terminate => {
            // Longer than any Terminate: too long for the queue 2 buffer
            // (RFC 5041 section 7.2).
            if ulpdu_len - hl > MAX_TERM_ULPDU {
                return Err(fatal(
                    codes::DDP_UNTAGGED_TOO_LONG,
                    raw,
                    WcStatus::WrFlushErr,
                ));
            }
            ulpdu_len - hl
        }
        _ => 0,
    };
    if ulpdu_len < hl + extra {
        return Err(fatal(
            codes::RDMAP_CATASTROPHIC_STREAM,
            raw,
            WcStatus::WrFlushErr,
        ));
    }
    if let Need::End(e) = rx.need(c, 2 + hl + extra) {
        return Err(e);
    }
    let s = rx.start;
    let head_len = 2 + hl + extra;
    if c.params.crc {
        rx.crc = mpa::crc_update(mpa::crc_start(), &rx.stage[s..s + head_len]);
    }
    let hb_len = (hl + extra).min(rx.hdr_bytes.len());
    rx.hdr_bytes[..hb_len].copy_from_slice(&rx.stage[s + 2..s + 2 + hb_len]);
    let raw: Vec<u8> = rx.hdr_bytes[..hl.min(hb_len)].to_vec();
    let payload_len = ulpdu_len - hl - extra;
    rx.target.clear();
    rx._target_keep = None;
    rx.fence.clear();
    let pd = q.pd;
    // A Write message into a backed region is passed on whole (or in long
    // runs); anything else arriving in the middle of one sees it placed.
    if rx.backed_run.is_some() && !matches!(hdr, DdpHeader::Tagged(t) if t.opcode == Opcode::Write)
    {
        flush_backed(rx, usize::MAX).map_err(|e| backed_failed(q, &raw, e))?;
    }
    let action = match hdr {
        DdpHeader::Tagged(t) if t.opcode == Opcode::Write => {
            if payload_len == 0 {
                // Zero-length Write: no STag lookup (also the P2P RTR).
                if rx.rtr_expected {
                    Action::Rtr
                } else {
                    Action::Write
                }
            } else {
                let mr = q.core.stags.lookup(t.stag).ok_or_else(|| {
                    fatal(codes::DDP_TAGGED_INVALID_STAG, &raw, WcStatus::WrFlushErr)
                })?;
                mr.check(pd, Access::REMOTE_WRITE, t.to, payload_len as u64)
                    .map_err(|e| fatal(e.ddp_code(), &raw, WcStatus::WrFlushErr))?;
                if mr.backend.is_some() {
                    // Received whole, handed to the backend once the CRC
                    // checked out (segment_done), together with the rest of
                    // its message.
                    let off = t.to - mr.iova;
                    let cont = matches!(&rx.backed_run,
                        Some((m, o, l)) if m.stag == mr.stag && o + *l as u64 == off);
                    if !cont {
                        flush_backed(rx, usize::MAX).map_err(|e| backed_failed(q, &raw, e))?;
                    } else if rx.backed_run.as_ref().is_some_and(|r| r.2 >= BACKED_RUN) {
                        // Long message: pass on the 4 KiB-aligned part.
                        flush_backed(rx, BACKED_ALIGN).map_err(|e| backed_failed(q, &raw, e))?;
                    }
                    let at = rx.backed_run.as_ref().map_or(0, |r| r.2);
                    if rx.backed.len() < at + payload_len {
                        rx.backed.resize(at + payload_len, 0);
                    }
                    if rx.backed_run.is_none() {
                        rx.backed_run = Some((mr.clone(), off, 0));
                    }
                    rx.target.push(RawSpan {
                        // SAFETY: at + payload_len <= backed.len().
                        ptr: unsafe { rx.backed.as_mut_ptr().add(at) },
                        len: payload_len,
                    });
                    Action::BackedWrite
                } else {
                    mr.resolve(t.to, payload_len as u64, &mut rx.target);
                    if mr.fenced {
                        rx.fence.push(mr.clone());
                    }
                    rx._target_keep = Some(mr);
                    Action::Write
                }
            }
        }
        DdpHeader::Tagged(t) => {
            // Read Response: must answer the oldest outstanding Read.
            let mut sq = q.sq.lock();
            if sq.tx.rtr_read_pending {
                // The answer to our Read RTR (issue 20, item 1): one empty,
                // last segment naming the RTR STag at offset 0.
                if t.stag != RTR_STAG {
                    return Err(fatal(
                        codes::DDP_TAGGED_INVALID_STAG,
                        &raw,
                        WcStatus::WrFlushErr,
                    ));
                }
                if t.to != 0 || payload_len != 0 || !hdr.last() {
                    return Err(fatal(
                        codes::DDP_TAGGED_BASE_BOUNDS,
                        &raw,
                        WcStatus::WrFlushErr,
                    ));
                }
                sq.tx.rtr_read_pending = false;
                drop(sq);
                finish_header(rx, hdr, ulpdu_len, payload_len, head_len, Action::None);
                return Ok(());
            }
            // Nobody asked: DDP catastrophic, 1/0/0, as siw
            // (`siw_proc_rresp`, "ORQ empty").
            let Some(&seq) = sq.orq.front() else {
                return Err(fatal(
                    codes::DDP_LOCAL_CATASTROPHIC,
                    &raw,
                    WcStatus::WrFlushErr,
                ));
            };
            let w = sq
                .wqes
                .iter()
                .find(|w| w.seq == seq)
                .expect("ORQ entry is queued");
            // The oldest outstanding request may be an atomic, whose answer
            // is an Atomic Response.
            if !matches!(w.op, WrOp::RdmaRead { .. } | WrOp::Flush { .. }) {
                return Err(fatal(
                    codes::RDMAP_UNEXPECTED_OPCODE,
                    &raw,
                    WcStatus::WrFlushErr,
                ));
            }
            // A flush's answer: one empty, last segment naming STag 0.
            if matches!(w.op, WrOp::Flush { .. }) {
                if t.stag != 0 || t.to != 0 || payload_len != 0 || !hdr.last() {
                    return Err(fatal(
                        codes::DDP_TAGGED_BASE_BOUNDS,
                        &raw,
                        WcStatus::WrFlushErr,
                    ));
                }
                drop(sq);
                finish_header(rx, hdr, ulpdu_len, payload_len, head_len, Action::ReadResp);
                return Ok(());
            }
            let (sink, sink_to) = w.sink.clone().expect("read has a sink");
            let want_to = sink_to + rx.read_resp_off;
            if t.stag != sink.stag {
                return Err(fatal(
                    codes::DDP_TAGGED_INVALID_STAG,
                    &raw,
                    WcStatus::WrFlushErr,
                ));
            }
            // In order, within the sink, and (the last segment) exactly
            // the length asked for: a short response would complete the
            // Read with bytes that never came (siw: `siw_rresp_check_ntoh`).
            let end = rx.read_resp_off + payload_len as u64;
            if t.to != want_to || end > w.len || (hdr.last() && end != w.len) {
                return Err(fatal(
                    codes::DDP_TAGGED_BASE_BOUNDS,
                    &raw,
                    WcStatus::WrFlushErr,
                ));
            }
            drop(sq);
            if payload_len > 0 {
                sink.resolve(t.to, payload_len as u64, &mut rx.target);
            }
            if sink.fenced {
                rx.fence.push(sink.clone());
            }
            rx._target_keep = Some(sink);
            Action::ReadResp
        }
        DdpHeader::Untagged(u) => match u.opcode {
            Opcode::Send
            | Opcode::SendSe
            | Opcode::SendInvalidate
            | Opcode::SendSeInvalidate
            | Opcode::SendAdvertise
            | Opcode::SendClose => {
                if u.msn != rx.send_msn {
                    return Err(fatal(
                        codes::DDP_UNTAGGED_MSN_RANGE,
                        &raw,
                        WcStatus::WrFlushErr,
                    ));
                }
                if rx.cur_recv.is_none() {
                    if u.mo != 0 {
                        return Err(fatal(
                            codes::DDP_UNTAGGED_INVALID_MO,
                            &raw,
                            WcStatus::WrFlushErr,
                        ));
                    }
                    let wqe = match &q.srq {
                        Some(srq) => srq.q.lock().pop_front(),
                        None => q.rq.lock().pop_front(),
                    };
                    let Some(wqe) = wqe else {
                        if payload_len == 0 && rx.rtr_expected {
                            {
                                finish_header(
                                    rx,
                                    hdr,
                                    ulpdu_len,
                                    payload_len,
                                    head_len,
                                    Action::Rtr,
                                );
                                return Ok(());
                            }
                        }
                        return Err(fatal(
                            codes::DDP_UNTAGGED_NO_BUFFER,
                            &raw,
                            WcStatus::WrFlushErr,
                        ));
                    };
                    rx.cur_recv = Some(CurRecv { wqe, received: 0 });
                }
                let cur = rx.cur_recv.as_ref().expect("receive in progress");
                if u.mo as u64 != cur.received {
                    return Err(fatal(
                        codes::DDP_UNTAGGED_INVALID_MO,
                        &raw,
                        WcStatus::WrFlushErr,
                    ));
                }
                if cur.received + payload_len as u64 > cur.wqe.len {
                    // The receive the message was for completes with a
                    // length error (as in siw); the flush completes the
                    // others. (The status handed to the QP's failure goes
                    // to a send WR, which is not at fault.)
                    let cur = rx.cur_recv.take().expect("receive in progress");
                    q.recv_cq.push(WorkCompletion {
                        wr_id: cur.wqe.wr_id,
                        status: WcStatus::LocLenErr,
                        opcode: WcOpcode::Recv,
                        byte_len: cur.received as u32,
                        qp_num: q.qpn,
                        ..Default::default()
                    });
                    // siw's code for "receive space short"
                    // (`siw_send_check_ntoh`): no buffer, 1/2/0x02.
                    return Err(fatal(
                        codes::DDP_UNTAGGED_NO_BUFFER,
                        &raw,
                        WcStatus::WrFlushErr,
                    ));
                }
                let mut t = std::mem::take(&mut rx.target);
                sub_spans(&cur.wqe.spans, u.mo as usize, payload_len, &mut t);
                rx.target = t;
                rx.fence
                    .extend(cur.wqe.keep.iter().filter(|m| m.fenced).cloned());
                Action::Send
            }
            Opcode::ReadRequest => {
                // Bytes after the 28-byte body: the message is too long for
                // the queue 1 buffer of one Read Request (RFC 5041 section
                // 7.2, RFC 5040 section 4.4).
                if payload_len != 0 {
                    return Err(fatal(
                        codes::DDP_UNTAGGED_TOO_LONG,
                        &raw,
                        WcStatus::WrFlushErr,
                    ));
                }
                if u.msn != rx.rr_msn {
                    return Err(fatal(
                        codes::DDP_UNTAGGED_MSN_RANGE,
                        &raw,
                        WcStatus::WrFlushErr,
                    ));
                }
                let rr = ReadRequest::decode(&rx.hdr_bytes[hl..hl + ReadRequest::LEN])
                    .map_err(|e| fatal(e.term_code(), &raw, WcStatus::WrFlushErr))?;
                let full = rx.hdr_bytes[..hl + ReadRequest::LEN].to_vec();
                if rx.rtr_expected && rr.size == 0 {
                    // The Read RTR: answered like any zero-length Read (a
                    // zero-length Read Response, the MSN counted), or the
                    // peer's first real Read is refused (issue 20, item 1).
                    rx.rtr_expected = false;
                    Action::ReadReq(rr, None)
                } else {
                    let used = q.sq.lock().tx.irq_used;
                    if used >= c.params.ird.max(1) as usize {
                        return Err(fatal(
                            codes::RDMAP_CATASTROPHIC_STREAM,
                            &full,
                            WcStatus::WrFlushErr,
                        ));
                    }
                    if rr.size == 0 {
                        // Naming a backed region, a zero-length Read is a
                        // flush (backend.rs); otherwise its STag is not
                        // looked at.
                        let flush = q.core.stags.lookup(rr.src_stag).filter(|m| {
                            m.backend.is_some()
                                && m.check(pd, Access::LOCAL_READ, rr.src_to, 0).is_ok()
                        });
                        Action::ReadReq(rr, flush)
                    } else {
                        let mr = q.core.stags.lookup(rr.src_stag).ok_or_else(|| {
                            fatal(codes::RDMAP_INVALID_STAG, &full, WcStatus::WrFlushErr)
                        })?;
                        mr.check(pd, Access::REMOTE_READ, rr.src_to, rr.size as u64)
                            .map_err(|e| fatal(e.rdmap_code(), &full, WcStatus::WrFlushErr))?;
                        Action::ReadReq(rr, Some(mr))
                    }
                }
            }
            Opcode::ImmediateData | Opcode::ImmediateDataSe => {
                // Exactly eight bytes, one segment, on queue 0's sequence.
                if payload_len != 0 {
                    return Err(fatal(
                        codes::DDP_UNTAGGED_TOO_LONG,
                        &raw,
                        WcStatus::WrFlushErr,
                    ));
                }
                if u.msn != rx.send_msn {
                    return Err(fatal(
                        codes::DDP_UNTAGGED_MSN_RANGE,
                        &raw,
                        WcStatus::WrFlushErr,
                    ));
                }
                if !u.last || u.mo != 0 || rx.cur_recv.is_some() {
                    return Err(fatal(
                        codes::DDP_UNTAGGED_INVALID_MO,
                        &raw,
                        WcStatus::WrFlushErr,
                    ));
                }
                let wqe = match &q.srq {
                    Some(srq) => srq.q.lock().pop_front(),
                    None => q.rq.lock().pop_front(),
                };
                let Some(wqe) = wqe else {
                    return Err(fatal(
                        codes::DDP_UNTAGGED_NO_BUFFER,
                        &raw,
                        WcStatus::WrFlushErr,
                    ));
                };
                let imm = u32::from_be_bytes(rx.hdr_bytes[hl..hl + 4].try_into().unwrap());
                Action::Imm(wqe, imm, u.opcode.solicited())
            }
            Opcode::AtomicRequest => {
                if payload_len != 0 {
                    return Err(fatal(
                        codes::DDP_UNTAGGED_TOO_LONG,
                        &raw,
                        WcStatus::WrFlushErr,
                    ));
                }
                if u.msn != rx.rr_msn {
                    return Err(fatal(
                        codes::DDP_UNTAGGED_MSN_RANGE,
                        &raw,
                        WcStatus::WrFlushErr,
                    ));
                }
                let ar = AtomicRequest::decode(&rx.hdr_bytes[hl..hl + AtomicRequest::LEN])
                    .map_err(|e| fatal(e.term_code(), &raw, WcStatus::WrFlushErr))?;
                // Atomics count against the same inbound limit as Reads.
                let used = q.sq.lock().tx.irq_used;
                if used >= c.params.ird.max(1) as usize {
                    return Err(fatal(
                        codes::RDMAP_CATASTROPHIC_STREAM,
                        &raw,
                        WcStatus::WrFlushErr,
                    ));
                }
                let mr =
                    q.core.stags.lookup(ar.stag).ok_or_else(|| {
                        fatal(codes::RDMAP_INVALID_STAG, &raw, WcStatus::WrFlushErr)
                    })?;
                mr.check(pd, Access::REMOTE_ATOMIC, ar.to, 8)
                    .map_err(|e| fatal(e.rdmap_code(), &raw, WcStatus::WrFlushErr))?;
                // A target that is not a naturally aligned 64-bit word has
                // no code of its own in RFC 7306: remote operation error.
                let target = mr.atomic_target(ar.to).ok_or_else(|| {
                    fatal(
                        codes::RDMAP_OPERATION_UNSPECIFIED,
                        &raw,
                        WcStatus::WrFlushErr,
                    )
                })?;
                Action::AtomicReq(ar, mr, target)
            }
            Opcode::AtomicResponse => {
                if payload_len != 0 {
                    return Err(fatal(
                        codes::DDP_UNTAGGED_TOO_LONG,
                        &raw,
                        WcStatus::WrFlushErr,
                    ));
                }
                if u.msn != rx.atomic_resp_msn {
                    return Err(fatal(
                        codes::DDP_UNTAGGED_MSN_RANGE,
                        &raw,
                        WcStatus::WrFlushErr,
                    ));
                }
                let resp = AtomicResponse::decode(&rx.hdr_bytes[hl..hl + AtomicResponse::LEN])
                    .map_err(|e| fatal(e.term_code(), &raw, WcStatus::WrFlushErr))?;
                // It must answer the oldest outstanding request, an atomic
                // with this identifier.
                let sq = q.sq.lock();
                let expected = sq.orq.front().and_then(|&seq| {
                    sq.wqes.iter().find(|w| w.seq == seq).filter(|w| {
                        matches!(
                            w.op,
                            WrOp::AtomicFetchAdd { .. } | WrOp::AtomicCmpSwap { .. }
                        ) && w.seq as u32 == resp.req_id
                    })
                });
                if expected.is_none() {
                    return Err(fatal(
                        codes::RDMAP_UNEXPECTED_OPCODE,
                        &raw,
                        WcStatus::WrFlushErr,
                    ));
                }
                drop(sq);
                Action::AtomicResp(resp)
            }
            Opcode::Terminate => {
                let body = &rx.stage[s + 2 + hl..s + 2 + hl + extra];
                // softrdma peers write the RFC's layout; Linux siw its own
                // (issue 20, item 8): guessed from the word for the others.
                let t = if c.params.softrdma_peer {
                    Terminate::decode(body)
                } else {
                    Terminate::decode_guess_layout(body)
                };
                Action::Terminate(t.ok())
            }
            _ => {
                return Err(fatal(
                    codes::RDMAP_UNEXPECTED_OPCODE,
                    &raw,
                    WcStatus::WrFlushErr,
                ))
            }
        },
    };
    finish_header(rx, hdr, ulpdu_len, payload_len, head_len, action);
    Ok(())
}

fn finish_header(
    rx: &mut Rx,
    hdr: DdpHeader,
    ulpdu_len: usize,
    payload_len: usize,
    head_len: usize,
    action: Action,
) {
    rx.start += head_len;
    rx.hdr = Some(hdr);
    rx.ulpdu_len = ulpdu_len;
    rx.payload_len = payload_len;
    rx.placed = 0;
    rx.action = action;
    rx.phase = Phase::Payload;
    rx.bytes_in_frame = true;
}

/// Places payload bytes: from the staging buffer, or straight from the
/// socket into the target memory.
fn on_payload(qpn: u32, rx: &mut Rx, c: &Conn) -> Result<(), RxEnd> {
    let mut scratch: Vec<RawSpan> = Vec::new();
    while rx.placed < rx.payload_len {
        let rem = rx.payload_len - rx.placed;
        if rx.avail() > 0 {
            let n = rx.avail().min(rem);
            let src = &rx.stage[rx.start..rx.start + n];
            if c.params.crc {
                rx.crc = mpa::crc_update(rx.crc, src);
            }
            if !mr::enter_all(&rx.fence) {
                return Err(deregistered(rx));
            }
            crate::test_hooks::placement_point(qpn);
            // SAFETY: target spans come from a registration held in
            // rx._target_keep or the current receive WQE, and were
            // bounds-checked in on_header; caller-owned memory among them
            // is entered (rx.fence), so it is not deregistered meanwhile.
            unsafe { mr::copy_into_spans(&rx.target, rx.placed, src) };
            mr::exit_all(&rx.fence);
            rx.placed += n;
            rx.start += n;
            continue;
        }
        if rem >= DIRECT_MIN {
            sub_spans(&rx.target, rx.placed, rem, &mut scratch);
            if !mr::enter_all(&rx.fence) {
                return Err(deregistered(rx));
            }
            crate::test_hooks::placement_point(qpn);
            // SAFETY: as above; the socket writes only inside the spans.
            let got = unsafe { c.recv_spans(&scratch) };
            if let Ok(k) = got {
                if k > 0 && c.params.crc {
                    sub_spans(&rx.target, rx.placed, k, &mut scratch);
                    // SAFETY: as above.
                    rx.crc = unsafe { mr::crc_spans(rx.crc, &scratch) };
                }
            }
            mr::exit_all(&rx.fence);
            match got {
                Ok(0) => return Err(RxEnd::EofMidFrame),
                Ok(k) => {
                    rx.placed += k;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(RxEnd::Block),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(RxEnd::Io(e)),
            }
        } else if let Need::End(e) = rx.need(c, 1) {
            return Err(e);
        }
    }
    rx.phase = Phase::Trailer;
    Ok(())
}

/// The memory a segment was being placed into was deregistered by its
/// owner in the middle (caller-owned memory, `MrInner::enter`): the rest
/// of the segment cannot be placed. For a tagged Write the peer sees what
/// it would have seen a moment later, an invalid STag; for a receive
/// buffer or a Read's sink the fault is local.
fn deregistered(rx: &Rx) -> RxEnd {
    let raw = rx.hdr_bytes[..rx.hdr.map_or(0, |h| h.len())].to_vec();
    let code = match (&rx.hdr, &rx.action) {
        (Some(DdpHeader::Tagged(_)), Action::Write) => codes::DDP_TAGGED_INVALID_STAG,
        _ => codes::DDP_LOCAL_CATASTROPHIC,
    };
    RxEnd::Fatal(code, Some(raw), WcStatus::LocProtErr)
}

/// Runs the receiver until the socket is drained, the budget is spent, or
/// the connection ends.
/// Segments the receiver handles per call before it yields.
pub(crate) const RX_BUDGET: usize = 512;

fn rx_loop(q: &QpInner, rx: &mut Rx, c: &Conn, mut budget: usize) -> RxEnd {
    // Busy-poll mode: once a segment was handled and nothing is left in
    // the stage, return to the polling application (it is waiting for what
    // was just placed) instead of asking the socket once more: that recv
    // would almost always say EAGAIN, a system call and the socket lock on
    // the latency path. The application polls again anyway.
    let polled = c.polled.load(Ordering::Relaxed);
    let start_budget = budget;
    loop {
        match rx.phase {
            Phase::Header => {
                if budget == 0 {
                    return RxEnd::Budget;
                }
                if polled && budget < start_budget && rx.avail() == 0 {
                    return RxEnd::Block;
                }
                budget -= 1;
                rx.bytes_in_frame = false;
                if let Err(e) = on_header(q, rx, c) {
                    return e;
                }
            }
            Phase::Payload => {
                if let Err(e) = on_payload(q.qpn, rx, c) {
                    return e;
                }
            }
            Phase::Trailer => {
                let tl = mpa::pad_len(rx.ulpdu_len) + 4;
                if let Need::End(e) = rx.need(c, tl) {
                    return e;
                }
                let s = rx.start;
                let pad = tl - 4;
                if c.params.crc {
                    let want = mpa::crc_update(rx.crc, &rx.stage[s..s + pad]);
                    let got = u32::from_le_bytes(rx.stage[s + pad..s + tl].try_into().unwrap());
                    if want != got {
                        let raw = rx.hdr_bytes[..rx.hdr.map_or(0, |h| h.len())].to_vec();
                        return fatal(codes::MPA_CRC, &raw, WcStatus::WrFlushErr);
                    }
                }
                rx.start += tl;
                rx.phase = Phase::Header;
                if let Some(end) = on_segment_done(q, rx, c) {
                    return end;
                }
                // Paused for a streamed Read Response: the rest waits.
                if c.rx_paused.load(Ordering::Acquire) {
                    return RxEnd::Block;
                }
            }
        }
    }
}

/// A whole, CRC-checked segment arrived: finish what it started; a
/// message's last segment counts as processed for a same-host peer.
fn on_segment_done(q: &QpInner, rx: &mut Rx, c: &Conn) -> Option<RxEnd> {
    let counted = rx
        .hdr
        .is_some_and(|h| h.last() && h.opcode() != Opcode::Terminate);
    // The first FPDU from the peer ends a responder's hold (RFC 5044
    // section 7.1.2 rule 4) and, in peer-to-peer mode, the wait for the
    // RTR whatever the first message is (a peer that sends something else
    // first no longer stalls our transmitter forever: issue 20, item 9).
    let first = !rx.seen_fpdu;
    if first {
        rx.seen_fpdu = true;
        rx.rtr_expected = false;
        let mut sq = q.sq.lock();
        sq.tx.rtr_wait = false;
        sq.tx.hold_until = None;
    }
    let end = segment_done(q, rx, c);
    if first && end.is_none() {
        let mut sq = q.sq.lock();
        if let Some(e) = tx_or_fail(q, &mut sq, c) {
            return Some(e);
        }
    }
    if counted {
        if let Some(link) = &c.link {
            link.message_done();
        }
    }
    end
}

fn segment_done(q: &QpInner, rx: &mut Rx, c: &Conn) -> Option<RxEnd> {
    let hdr = rx.hdr.take().expect("segment header");
    let last = hdr.last();
    let n = rx.payload_len as u64;
    match std::mem::replace(&mut rx.action, Action::None) {
        Action::None | Action::Write => None,
        Action::BackedWrite => {
            if let Some(r) = rx.backed_run.as_mut() {
                r.2 += n as usize;
            }
            if !last {
                return None;
            }
            let raw = rx.hdr_bytes[..ddp::TAGGED_LEN].to_vec();
            flush_backed(rx, usize::MAX)
                .err()
                .map(|e| backed_failed(q, &raw, e))
        }
        Action::Rtr => {
            rx.rtr_expected = false;
            let mut sq = q.sq.lock();
            sq.tx.rtr_wait = false;
            tx_or_fail(q, &mut sq, c)
        }
        Action::ReadResp => {
            rx.read_resp_off += n;
            if !last {
                return None;
            }
            rx.read_resp_off = 0;
            let mut sq = q.sq.lock();
            if let Some(seq) = sq.orq.pop_front() {
                if let Some(w) = sq.get_mut(seq) {
                    w.stage = Stage::Done(WcStatus::Success);
                }
            }
            q.complete_in_order(&mut sq);
            tx_or_fail(q, &mut sq, c)
        }
        Action::Send => {
            // (A flush that took the receive closed the connection first,
            // and the receiver stops before placing anything then; never
            // panic on it regardless.)
            let cur = rx.cur_recv.as_mut()?;
            cur.received += n;
            if !last {
                return None;
            }
            rx.send_msn = rx.send_msn.wrapping_add(1);
            let cur = rx.cur_recv.take()?;
            let (opcode, inval) = match hdr {
                DdpHeader::Untagged(u) => (u.opcode, u.inval_stag),
                _ => unreachable!("Sends are untagged"),
            };
            let mut invalidated = None;
            let mut reference = None;
            if opcode.invalidates() {
                match q.core.stags.lookup(inval) {
                    // A one-shot binding this QP advertised: invalidate it,
                    // free it, report its reference (docs/one-shot.md).
                    Some(mr) if mr.pd == q.pd && q.one_shot.lock().contains_key(&inval) => {
                        let (r, index) = q.one_shot.lock().remove(&inval).expect("present");
                        q.core.stags.set_valid(&mr, false);
                        q.core.stags.release(index);
                        invalidated = Some(inval);
                        reference = Some(r);
                    }
                    // A close must name one of ours: a protocol violation.
                    Some(mr)
                        if opcode != Opcode::SendClose && mr.pd == q.pd && mr.invalidatable =>
                    {
                        q.core.stags.set_valid(&mr, false);
                        invalidated = Some(inval);
                    }
                    found => {
                        // Give the buffer back as flushed; the QP fails.
                        q.recv_cq.push(WorkCompletion {
                            wr_id: cur.wqe.wr_id,
                            status: WcStatus::RemInvReqErr,
                            opcode: WcOpcode::Recv,
                            qp_num: q.qpn,
                            ..Default::default()
                        });
                        // As siw: an STag we hold but may not invalidate
                        // for this peer (another PD, or not invalidatable)
                        // is a remote protection error; one we do not know
                        // a remote operation error (RFC 5040 section 7,
                        // code 0x09 under both types).
                        let code = if found.is_some() {
                            codes::RDMAP_CANNOT_INVALIDATE
                        } else {
                            codes::RDMAP_OP_CANNOT_INVALIDATE
                        };
                        let raw = rx.hdr_bytes[..ddp::UNTAGGED_LEN].to_vec();
                        return Some(fatal(code, &raw, WcStatus::WrFlushErr));
                    }
                }
            }
            q.recv_cq.push(WorkCompletion {
                wr_id: cur.wqe.wr_id,
                status: WcStatus::Success,
                opcode: WcOpcode::Recv,
                byte_len: cur.received as u32,
                qp_num: q.qpn,
                invalidated_rkey: invalidated,
                solicited: opcode.solicited(),
                imm_data: None,
                reference,
                advertised_stag: (opcode == Opcode::SendAdvertise).then_some(inval),
            });
            None
        }
        Action::Imm(wqe, imm, solicited) => {
            rx.send_msn = rx.send_msn.wrapping_add(1);
            q.recv_cq.push(WorkCompletion {
                wr_id: wqe.wr_id,
                status: WcStatus::Success,
                opcode: WcOpcode::RecvWithImm,
                byte_len: 0,
                qp_num: q.qpn,
                invalidated_rkey: None,
                solicited,
                imm_data: Some(imm),
                ..Default::default()
            });
            None
        }
        Action::AtomicReq(ar, mr, target) => {
            rx.rr_msn = rx.rr_msn.wrapping_add(1);
            if !mr.enter() {
                let raw = rx.hdr_bytes[..hdr.len()].to_vec();
                return Some(fatal(codes::RDMAP_INVALID_STAG, &raw, WcStatus::LocProtErr));
            }
            // SAFETY: `target` came from `mr.atomic_target` and `mr` (the
            // registration) is held here and entered until the operation
            // is done.
            let orig = unsafe { mr::atomic_apply(target, &ar) };
            mr.exit();
            drop(mr);
            let mut sq = q.sq.lock();
            sq.tx.queue_atomic_response(ar.req_id, orig);
            tx_or_fail(q, &mut sq, c)
        }
        Action::AtomicResp(resp) => {
            rx.atomic_resp_msn = rx.atomic_resp_msn.wrapping_add(1);
            let mut sq = q.sq.lock();
            if let Some(seq) = sq.orq.pop_front() {
                if let Some(w) = sq.get_mut(seq) {
                    let fence = fenced(&w.keep);
                    if mr::enter_all(&fence) {
                        // SAFETY: the spans are the WR's 8-byte result
                        // buffer, checked for local write when it was posted,
                        // kept alive by the WR's registration references
                        // and entered if caller-owned.
                        unsafe { mr::copy_into_spans(&w.spans, 0, &resp.orig.to_ne_bytes()) };
                        mr::exit_all(&fence);
                        w.stage = Stage::Done(WcStatus::Success);
                    } else {
                        w.stage = Stage::Done(WcStatus::LocProtErr);
                    }
                }
            }
            q.complete_in_order(&mut sq);
            tx_or_fail(q, &mut sq, c)
        }
        Action::ReadReq(rr, src) => {
            rx.rr_msn = rx.rr_msn.wrapping_add(1);
            // A backed source larger than what the connection may still
            // hold in memory: streamed a chunk at a time, the receiver
            // paused meanwhile (issue 20, item 5: the whole length, up to
            // 4 GiB, was allocated at once, IRD times over).
            if let Some(mr) = src.as_ref().filter(|m| m.backend.is_some() && rr.size > 0) {
                let size = rr.size as u64;
                let mut sq = q.sq.lock();
                if size > BACKED_CHUNK || sq.tx.backed_bytes + size > BACKED_BUDGET {
                    sq.tx.queue_streamed_read_response(&rr, mr.clone());
                    drop(sq);
                    c.set_rx_paused(true, q.qpn);
                    arm_stall_timer(q);
                    let mut sq = q.sq.lock();
                    return tx_or_fail(q, &mut sq, c);
                }
                sq.tx.backed_bytes += size;
            }
            let eager_backed = src
                .as_ref()
                .is_some_and(|m| m.backend.is_some() && rr.size > 0);
            // A backed source: flush (zero length) or read it now, before
            // the send queue is locked (this may wait for the device).
            let src = match src {
                Some(mr) if mr.backend.is_some() => match backed_read(&mr, &rr) {
                    Ok(m) => Some(m),
                    Err(e) => {
                        tracing::error!(qpn = q.qpn, stag = mr.stag, "backed read failed: {e}");
                        let raw = rx.hdr_bytes[..ddp::UNTAGGED_LEN + ReadRequest::LEN].to_vec();
                        return Some(fatal(
                            codes::RDMAP_CATASTROPHIC_STREAM,
                            &raw,
                            WcStatus::WrFlushErr,
                        ));
                    }
                },
                other => other,
            };
            let mut sq = q.sq.lock();
            match src {
                Some(mr) if eager_backed => {
                    // Read eagerly from a backed region (`mr` holds the
                    // bytes): counted against the budget until sent.
                    sq.tx.queue_read_response(&rr, mr);
                    if let Some(m) = sq.tx.irq.back_mut() {
                        m.backed = Some(BackedSrc {
                            mr: Arc::clone(m._keep.as_ref().expect("holder")),
                            src_to: rr.src_to,
                            chunk_end: rr.size as u64,
                            counted: rr.size as u64,
                            paused_rx: false,
                        });
                    }
                }
                Some(mr) => sq.tx.queue_read_response(&rr, mr),
                None => {
                    let hdr = DdpHeader::Tagged(TaggedHeader {
                        last: true,
                        opcode: Opcode::ReadResponse,
                        stag: rr.sink_stag,
                        to: rr.sink_to,
                    });
                    sq.tx
                        .irq
                        .push_back(TxMsg::new(hdr, Vec::new(), 0, Fin::None));
                    sq.tx.irq_used += 1;
                }
            }
            tx_or_fail(q, &mut sq, c)
        }
        Action::Terminate(t) => {
            let code = t.map_or(codes::RDMAP_OPERATION_UNSPECIFIED, |t| t.code);
            Some(RxEnd::PeerTerminated(code))
        }
    }
}

/// Bytes of one Write message accumulated before part of them goes to the
/// backend.
const BACKED_RUN: usize = 1 << 20;
/// A long message is passed on in multiples of this (O_DIRECT's alignment).
const BACKED_ALIGN: usize = 4096;

/// Hands the accumulated run of Write segments to its backend: all of it
/// (`unit` = usize::MAX), or its longest prefix that is a multiple of
/// `unit`, keeping the rest for the next segments.
fn flush_backed(rx: &mut Rx, unit: usize) -> io::Result<()> {
    let Some((mr, off, len)) = rx.backed_run.take() else {
        return Ok(());
    };
    let n = if unit == usize::MAX {
        len
    } else {
        len / unit * unit
    };
    if n > 0 {
        let b = mr.backend.as_ref().expect("backed region");
        b.write_at(off, &rx.backed[..n])?;
    }
    if n < len {
        rx.backed.copy_within(n..len, 0);
        rx.backed_run = Some((mr, off + n as u64, len - n));
    }
    Ok(())
}

fn backed_failed(q: &QpInner, raw: &[u8], e: io::Error) -> RxEnd {
    tracing::error!(qpn = q.qpn, "backed write failed: {e}");
    fatal(codes::RDMAP_CATASTROPHIC_STREAM, raw, WcStatus::WrFlushErr)
}

/// Answers a Read Request from a backed region: a flush when it is empty,
/// else the bytes, read into a holder the Read Response keeps alive.
fn backed_read(mr: &MrInner, rr: &ReadRequest) -> io::Result<Arc<MrInner>> {
    let b = mr.backend.as_ref().expect("backed region");
    if rr.size == 0 {
        b.flush()?;
        return Ok(Arc::new(MrInner::holding(Box::new([]), rr.src_to)));
    }
    let mut buf = vec![0u8; rr.size as usize].into_boxed_slice();
    b.read_at(rr.src_to - mr.iova, &mut buf)?;
    Ok(Arc::new(MrInner::holding(buf, rr.src_to)))
}

fn tx_or_fail(q: &QpInner, sq: &mut Sq, c: &Conn) -> Option<RxEnd> {
    match tx_progress(q, sq, c) {
        Ok(()) => sq
            .tx
            .pending_fail
            .take()
            .map(|r| RxEnd::Io(io::Error::other(r))),
        Err(e) => Some(RxEnd::Io(e)),
    }
}

/// The completion status a received Terminate gives our WR in flight.
fn status_for_peer_term(code: TermCode) -> WcStatus {
    use softrdma_wire::Layer;
    match (code.layer, code.etype) {
        (Layer::Rdmap, 1) | (Layer::Ddp, 1) => WcStatus::RemAccessErr,
        (Layer::Ddp, 2) => WcStatus::RemInvReqErr,
        (Layer::Rdmap, 2) => WcStatus::RemOpErr,
        _ => WcStatus::RemOpErr,
    }
}

/// A timer of the progress thread fired for this QP: a responder's hold
/// (see `Tx::hold_until`) that ran out starts transmission; a paused
/// receiver is checked for a peer that stopped reading (see
/// [`arm_stall_timer`]); a resumed one runs.
pub(crate) fn on_timer(q: &Arc<QpInner>) {
    let now = std::time::Instant::now();
    let sq = q.sq.lock();
    if sq.tx.hold_until.is_some_and(|u| now >= u) {
        q.kick_with(sq);
        return;
    }
    let Some(c) = q.conn.get() else { return };
    if c.is_closed() {
        return;
    }
    if c.rx_paused.load(Ordering::Acquire) {
        let stalled = now.saturating_duration_since(sq.tx.last_progress);
        drop(sq);
        if stalled >= q.core.config.tx_stall_timeout {
            tracing::warn!(
                qpn = q.qpn,
                ?stalled,
                "the peer does not read our Read Response"
            );
            q.fail(
                WcStatus::RetryExcErr,
                Some(AsyncEvent::QpFatal {
                    qpn: q.qpn,
                    reason: format!("the peer read nothing for {stalled:?}"),
                }),
            );
        } else {
            arm_stall_timer(q);
        }
        return;
    }
    drop(sq);
    if on_readable(q, RX_BUDGET) {
        crate::progress::add_timer(&q.core, q.qpn, now);
    }
}

/// Checks a paused receiver again in a while (see `on_timer`).
fn arm_stall_timer(q: &QpInner) {
    let every = (q.core.config.tx_stall_timeout / 4).max(std::time::Duration::from_millis(10));
    crate::progress::add_timer(&q.core, q.qpn, std::time::Instant::now() + every);
}

/// EPOLLIN: runs the receiver, then acts on how it ended.
/// Runs the receiver for at most `budget` segments; returns true if it
/// stopped at its budget (more input may be waiting).
pub(crate) fn on_readable(q: &Arc<QpInner>, budget: usize) -> bool {
    let Some(c) = q.conn.get() else {
        return false;
    };
    if c.is_closed() {
        return false;
    }
    crate::test_hooks::receiver_point(q.qpn);
    let end = {
        let mut rx = q.rx.lock();
        // Again under the lock: `QpInner::fail` closes the connection and
        // then takes the receive in progress under this lock (flushing it
        // back to the application). Once closed, nothing more may be placed
        // into that receive's buffer (issue 20, item 6: a receiver past the
        // first check placed staged bytes into the flushed buffer and then
        // panicked on the missing receive).
        if c.is_closed() || c.rx_paused.load(Ordering::Acquire) {
            return false;
        }
        rx_loop(q, &mut rx, c, budget)
    };
    // Ring mode: a doorbell may mean the peer made room in its ring.
    if c.tx_blocked.swap(false, Ordering::AcqRel) {
        q.kick_with(q.sq.lock());
    }
    let more = matches!(end, RxEnd::Budget);
    match end {
        RxEnd::Block | RxEnd::Budget => {}
        RxEnd::Eof => {
            tracing::debug!(qpn = q.qpn, "peer disconnected");
            c.on_peer_fin();
            q.fail(
                WcStatus::WrFlushErr,
                Some(AsyncEvent::Disconnected { qpn: q.qpn }),
            );
        }
        RxEnd::EofMidFrame => {
            tracing::warn!(qpn = q.qpn, "peer closed the connection inside an FPDU");
            q.fail(
                WcStatus::RetryExcErr,
                Some(AsyncEvent::Disconnected { qpn: q.qpn }),
            );
        }
        RxEnd::Io(e) => {
            tracing::warn!(qpn = q.qpn, error = %e, "connection error");
            q.fail(
                WcStatus::RetryExcErr,
                Some(AsyncEvent::QpFatal {
                    qpn: q.qpn,
                    reason: e.to_string(),
                }),
            );
        }
        RxEnd::Fatal(code, hdr, status) => {
            q.terminate(code, hdr.as_deref(), status);
        }
        RxEnd::PeerTerminated(code) => {
            tracing::warn!(qpn = q.qpn, %code, "peer sent Terminate");
            q.fail(
                status_for_peer_term(code),
                Some(AsyncEvent::Terminated {
                    qpn: q.qpn,
                    code,
                    by_peer: true,
                }),
            );
        }
    }
    more
}
