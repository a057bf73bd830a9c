//! The iWARP transport over TCP, split as Linux siw splits it:
//!
//! | file | role | siw |
//! |------|------|-----|
//! | `mod.rs` | [`Conn`] (the socket or simulated pipe, its interest set, same-host ring; the transmitter's and receiver's state) | `siw_qp.c` |
//! | `driver.rs` | the engine's [`crate::engine::Transport`] for a `Conn`, and the entry points the progress threads call (`on_readable`, `on_writable`, `on_timer`) | `siw_qp.c`, `siw_cm.c` (socket callbacks) |
//! | `wqe.rs` | work requests become messages, in RDMA's order | `siw_qp_prepare_tx` |
//! | `tx.rs` | the transmitter: messages cut into FPDUs, CRC, holds and RTR | `siw_qp_tx.c` |
//! | `batch.rs` | composed FPDUs as iovecs, one `sendmsg` per segment run | `siw_tx_hdt` |
//! | `rx.rs` | the receiver as a state machine without I/O: framing, staging, placement, CRC; it says what input it needs | `siw_qp_rx.c` |
//! | `rdmap.rs` | one handler per RDMAP opcode: MSN/MO, STag and ORQ/IRQ checks | `siw_proc_*` |
//! | `complete.rs` | a whole, CRC-checked segment: completions, invalidation, responses queued | `siw_rdmap_complete` |
//! | `backed.rs` | Writes into and Reads of storage-backed regions (runs, holders) | (softrdma's own) |
//!
//! Send path: the caller that posts transmits inline; if the socket is
//! full, the QP's progress thread continues on EPOLLOUT. Receive path: the
//! receiver core (`rx::process`) parses FPDU headers out of a small staging
//! buffer and checks every access against the STag table before a byte is
//! placed; it does no I/O, and stops saying what it needs: bytes staged, a
//! large payload read straight into its target memory (direct data
//! placement), or the transmitter run. The driver (`driver::rx_loop`, on
//! the progress thread or any thread that polls) does that and calls it
//! again. Any protocol error sends a Terminate with the code of RFC
//! 5040/5041/5044 and ends the connection.

mod backed;
mod batch;
mod complete;
mod driver;
mod rdmap;
mod rx;
mod rx_state;
mod tx;
mod wqe;

use backed::*;
use batch::*;
use complete::*;
pub(crate) use driver::conn_memory;
use driver::*;
use rx::*;
use rx_state::*;
pub(crate) use rx_state::{Rx, RxEnd};
pub(crate) use tx::*;
use wqe::*;

use crate::cq::{WcOpcode, WcStatus, WorkCompletion};
use crate::engine::AsyncEvent;
use crate::engine::{QpInner, RecvWqe, Sq, Stage};
use crate::mr::{self, Access, MrInner};
use crate::negotiated::Negotiated;
use crate::pipe::PipeEnd;
use crate::qp_state::QpState;
use crate::sys::{self, Epoll, RawSpan};
use crate::wr::WrOp;
use parking_lot::{Mutex, MutexGuard};
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
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

/// Smallest segment size FPDUs are sized for, whatever TCP reports.
const MIN_SEG: usize = 536;
/// How often a connection reads its socket's MSS again
/// ([`Conn::current_seg`]).
const SEG_REFRESH: std::time::Duration = std::time::Duration::from_millis(50);

/// What a connection's bytes travel over.
enum Io {
    /// A TCP socket, watched by a progress thread's epoll.
    Tcp {
        stream: TcpStream,
        fd: RawFd,
        epoll: Arc<Epoll>,
    },
    /// A simulated connection (`pipe.rs`), driven by its owner: no socket,
    /// no progress thread; interest and timers are recorded in the pipe.
    Pipe(PipeEnd),
}

/// An established connection under a QP.
pub(crate) struct Conn {
    io: Io,
    pub local: SocketAddr,
    pub peer: SocketAddr,
    pub params: Negotiated,
    /// Largest TCP segment payload (TCP_MAXSEG) when the connection was
    /// set up: FPDUs are sized to fit one segment and written so that none
    /// straddles two (RFC 5044 FPDU alignment; also what Wireshark's MPA
    /// dissector expects); over TCP the transmitter follows the socket's
    /// MSS as it grows ([`Conn::current_seg`]). With a softrdma peer that
    /// agreed to `ext::LARGE_SEGMENTS`, [`LARGE_SEG`]: FPDUs of the largest
    /// size go out back to back, a batch per call.
    pub seg: usize,
    out_armed: AtomicBool,
    /// Held while the epoll interest is worked out from the modes and
    /// set ([`Conn::rewatch`]), so that the last interest set is the one
    /// the modes give once every caller is done.
    watching: Mutex<()>,
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
    /// The receiver waits for a receive to be posted (a Send found none:
    /// `DeviceConfig::recv_wait`). Not armed for input meanwhile; the post
    /// (`Transport::on_recv_posted`) or the deadline's timer runs it again.
    pub(super) recv_waiting: AtomicBool,
    /// The same-host transport, where both ends agreed to it.
    pub link: Option<crate::samehost::Link>,
    /// The transmitter found the peer's ring full (ring mode): the next
    /// doorbell from the peer kicks it.
    tx_blocked: AtomicBool,
    /// Inbound Read and Atomic Requests accepted and not yet answered:
    /// the receiver adds one when it queues the response, the transmitter
    /// takes it off when the response is composed (checked against our
    /// IRD without either locking the other).
    pub(super) inbound: AtomicUsize,
    /// Bytes of storage-backed Read Responses held in memory (see
    /// [`BACKED_BUDGET`]): added by the receiver, released by the
    /// transmitter.
    pub(super) backed_bytes: AtomicU64,
    /// The receiver's state. Lock order: this, then the QP's send queue,
    /// then `tx`.
    pub(crate) rx: Mutex<Rx>,
    /// The transmitter's state, locked only with the QP's send queue
    /// already held (see [`Conn::lock_tx`]), or alone for a read.
    pub(crate) tx: Mutex<Tx>,
}

impl Conn {
    pub fn new(
        stream: TcpStream,
        params: Negotiated,
        epoll: Arc<Epoll>,
        link: Option<crate::samehost::Link>,
    ) -> io::Result<Conn> {
        stream.set_nonblocking(true)?;
        // Set up by the connection manager already (`crate::tcp::connect`
        // or `tune_accepted`, before the MPA exchange); no-delay again
        // costs nothing and keeps a connection made some other way from
        // waiting for ACKs.
        stream.set_nodelay(true)?;
        let fd = stream.as_raw_fd();
        let seg = if params.large_segments {
            LARGE_SEG
        } else {
            sys::tcp_mss(fd).unwrap_or(1460).clamp(MIN_SEG, 65535)
        };
        let (local, peer) = (stream.local_addr()?, stream.peer_addr()?);
        Ok(Conn::with_io(
            Io::Tcp { stream, fd, epoll },
            local,
            peer,
            seg,
            params,
            link,
        ))
    }

    /// A connection over one end of a simulated [`crate::pipe::Pipe`],
    /// with `seg` as its segment size.
    pub fn over_pipe(
        end: PipeEnd,
        local: SocketAddr,
        peer: SocketAddr,
        seg: usize,
        params: Negotiated,
    ) -> Conn {
        let seg = if params.large_segments {
            LARGE_SEG
        } else {
            seg.clamp(MIN_SEG, 65535)
        };
        Conn::with_io(Io::Pipe(end), local, peer, seg, params, None)
    }

    fn with_io(
        io: Io,
        local: SocketAddr,
        peer: SocketAddr,
        seg: usize,
        params: Negotiated,
        link: Option<crate::samehost::Link>,
    ) -> Conn {
        Conn {
            io,
            seg,
            local,
            peer,
            params,
            out_armed: AtomicBool::new(false),
            watching: Mutex::new(()),
            closed: AtomicBool::new(false),
            fin_sent: AtomicBool::new(false),
            polled: AtomicBool::new(false),
            rx_paused: AtomicBool::new(false),
            recv_waiting: AtomicBool::new(false),
            link,
            tx_blocked: AtomicBool::new(false),
            inbound: AtomicUsize::new(0),
            backed_bytes: AtomicU64::new(0),
            rx: Mutex::new(Rx::new()),
            tx: Mutex::new(Tx::new()),
        }
    }

    /// The QP's send queue and this connection's transmitter, locked in
    /// that order (the order every path takes them in).
    pub(crate) fn lock_tx<'a>(
        &'a self,
        q: &'a QpInner,
    ) -> (MutexGuard<'a, Sq>, MutexGuard<'a, Tx>) {
        let sq = q.sq.lock();
        (sq, self.tx.lock())
    }

    /// The socket, where there is one.
    pub fn fd(&self) -> Option<RawFd> {
        match &self.io {
            Io::Tcp { fd, .. } => Some(*fd),
            Io::Pipe(_) => None,
        }
    }

    /// Tells the poller what to watch for.
    fn watch(&self, interest: u32, qpn: u32, add: bool) -> io::Result<()> {
        match &self.io {
            Io::Tcp { fd, epoll, .. } if add => epoll.add(*fd, interest, qpn as u64),
            Io::Tcp { fd, epoll, .. } => epoll.modify(*fd, interest, qpn as u64),
            Io::Pipe(p) => {
                p.set_interest(interest);
                Ok(())
            }
        }
    }

    /// Calls `on_timer` for the QP at `at` (on its progress thread; a
    /// simulated connection's driver fires it when it chooses).
    pub fn add_timer(&self, q: &QpInner, at: std::time::Instant) {
        match &self.io {
            Io::Tcp { .. } => crate::timers::add(&q.core.timers, q.qpn, at),
            Io::Pipe(p) => p.add_timer(),
        }
    }

    pub fn register(&self, qpn: u32) -> io::Result<()> {
        self.watch(sys::EV_IN, qpn, true)
    }

    /// The epoll interest for the current modes.
    fn interest(&self, out: bool) -> u32 {
        let inp = if self.polled.load(Ordering::Acquire)
            || self.rx_paused.load(Ordering::Acquire)
            || self.recv_waiting.load(Ordering::SeqCst)
        {
            0
        } else {
            sys::EV_IN
        };
        inp | if out { sys::EV_OUT } else { 0 }
    }

    /// Sets the epoll interest the modes give now (after a mode changed).
    /// Two threads that change modes at once (an application's busy poll
    /// and the event thread ending its lease, a post of a receive and the
    /// receiver) each set the interest after their change; worked out
    /// and set under `watching`, the last one set reads every change
    /// made before it. Unserialised, a thread could set the interest it
    /// worked out before the other's change after the other had set
    /// its own: a QP left with input disarmed and busy-poll off, whose
    /// peer's hang-up nobody read (an rdma_cm server waited for
    /// DISCONNECTED forever, tests/dropin.rs, about once in 15 runs
    /// beside two CPU hogs).
    fn rewatch(&self, qpn: u32) -> io::Result<()> {
        let _g = self.watching.lock();
        if self.closed.load(Ordering::Acquire) {
            return Ok(());
        }
        let out = self.out_armed.load(Ordering::Acquire);
        self.watch(self.interest(out), qpn, false)
    }

    fn arm_out(&self, qpn: u32) {
        if !self.out_armed.swap(true, Ordering::AcqRel) {
            let _ = self.rewatch(qpn);
        }
    }

    fn disarm_out(&self, qpn: u32) {
        if self.out_armed.swap(false, Ordering::AcqRel) {
            let _ = self.rewatch(qpn);
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
        let fd = match &self.io {
            Io::Tcp { fd, .. } => *fd,
            Io::Pipe(p) => {
                let want = spans.iter().map(|s| s.len).sum();
                let mut bytes = p.scratch();
                let n = p.read_into(want, &mut bytes)?;
                // SAFETY: the caller's contract; `bytes` is no longer than
                // the spans together.
                unsafe { mr::copy_into_spans(spans, 0, &bytes) };
                return Ok(n);
            }
        };
        let ring = self.link.as_ref().and_then(|l| l.ring_rx.as_ref());
        let Some(r) = ring.filter(|r| r.active()) else {
            // SAFETY: the caller's contract.
            let n = unsafe { sys::recv_spans(fd, spans) }?;
            // A peer with a ring activates it before it sends anything,
            // doorbells included. If it did so between our look at the
            // ring and this read, what we read are doorbell bytes, not
            // stream bytes (read as an FPDU they were a ULPDU of length 0:
            // a Terminate on the first message, about once in a thousand
            // connections under CPU load). Only at the start of the stream,
            // so only into the staging buffer: drop them and read the ring.
            if n > 0 && ring.is_some_and(|r| r.active()) {
                // SAFETY: the caller's contract.
                return unsafe { self.recv_spans(spans) };
            }
            return Ok(n);
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
            match sys::recv_into(fd, &mut bells) {
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

    /// Sends several segment runs (`spans[a..b]`, with `MSG_EOR` at its end
    /// when the run's flag is set) in order, non-blocking; returns the
    /// bytes written, which end inside a run only where the socket (or
    /// ring) took no more. On a socket one `sendmmsg` where the kernel
    /// allows it ([`sys::sendmmsg_safe`]), else one write per run.
    ///
    /// # Safety
    /// Every span must be readable memory valid for the call.
    pub unsafe fn send_runs(
        &self,
        spans: &[RawSpan],
        runs: &[(usize, usize, bool)],
    ) -> io::Result<usize> {
        if let (Io::Tcp { fd, .. }, None) = (&self.io, self.ring_tx()) {
            if runs.len() > 1 && sys::sendmmsg_safe() {
                // SAFETY: the caller's contract.
                return unsafe { sys::send_runs(*fd, spans, runs) };
            }
        }
        let mut sent = 0;
        for &(a, b, eor) in runs {
            let want: usize = spans[a..b].iter().map(|s| s.len).sum();
            // SAFETY: the caller's contract.
            match unsafe { self.send_spans(&spans[a..b], eor) } {
                Ok(n) => {
                    sent += n;
                    if n < want {
                        break;
                    }
                }
                // What was written stands; the next call meets the error.
                Err(_) if sent > 0 => break,
                Err(e) => return Err(e),
            }
        }
        Ok(sent)
    }

    /// Sends `spans` (non-blocking): into the peer's ring in ring mode,
    /// else on the socket (`eor`: end of a TCP segment, see sys).
    ///
    /// # Safety
    /// Every span must be readable memory valid for the call.
    pub unsafe fn send_spans(&self, spans: &[RawSpan], eor: bool) -> io::Result<usize> {
        let fd = match &self.io {
            Io::Tcp { fd, .. } => *fd,
            Io::Pipe(p) => {
                let want = spans.iter().map(|s| s.len).sum();
                let n = p.room(want)?;
                let mut bytes = p.scratch();
                bytes.clear();
                bytes.resize(n, 0);
                // SAFETY: the caller's contract.
                unsafe { mr::copy_from_spans(spans, 0, &mut bytes) };
                p.push(&bytes);
                return Ok(n);
            }
        };
        let Some(w) = self.ring_tx() else {
            // SAFETY: the caller's contract.
            return unsafe { sys::send_spans(fd, spans, eor) };
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
        let Some(fd) = self.fd() else { return };
        let b = [0u8; 1];
        let s = [RawSpan {
            ptr: b.as_ptr() as *mut u8,
            len: 1,
        }];
        // SAFETY: one span over a live local byte.
        let _ = unsafe { sys::send_spans(fd, &s, false) };
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

    /// Whether input comes through the peer's ring (ring mode).
    pub fn input_in_ring(&self) -> bool {
        self.link
            .as_ref()
            .and_then(|l| l.ring_rx.as_ref())
            .is_some_and(|r| r.active())
    }

    /// Whether the peer's ring holds bytes not yet read (ring mode only;
    /// over TCP the socket's readiness tells).
    pub fn input_waiting(&self) -> bool {
        self.link
            .as_ref()
            .and_then(|l| l.ring_rx.as_ref())
            .is_some_and(|r| r.active() && r.available() > 0)
    }

    /// Starts or ends a wait for a receive (see `recv_waiting`); true if
    /// this call changed it.
    pub(super) fn set_recv_waiting(&self, on: bool, qpn: u32) -> bool {
        if self.recv_waiting.swap(on, Ordering::SeqCst) == on {
            return false;
        }
        let _ = self.rewatch(qpn);
        true
    }

    /// Pauses or resumes the receiver (see `rx_paused`).
    pub fn set_rx_paused(&self, on: bool, qpn: u32) {
        self.rx_paused.store(on, Ordering::Release);
        let _ = self.rewatch(qpn);
    }

    /// The segment size to cut FPDUs to now: with `ext::LARGE_SEGMENTS`
    /// or over a simulated pipe, `seg`; over TCP, the socket's current MSS
    /// (`TCP_MAXSEG`), read again at most every [`SEG_REFRESH`]. The MSS
    /// grows after the handshake: the kernel bounds it to half the largest
    /// window the peer advertised, which is small at first (on loopback
    /// 32 KiB when the connection is set up, 64 KiB once the window
    /// opened), and FPDUs cut to the first value would stay half the size
    /// a segment can carry, for twice the system calls. A receiver takes
    /// FPDUs of any size, so the size may change between messages.
    pub(crate) fn current_seg(&self, tx: &mut Tx) -> usize {
        let Io::Tcp { fd, .. } = &self.io else {
            return self.seg;
        };
        if self.params.large_segments {
            return self.seg;
        }
        let now = std::time::Instant::now();
        if tx.seg == 0
            || tx
                .seg_at
                .is_none_or(|t| now.duration_since(t) >= SEG_REFRESH)
        {
            tx.seg = sys::tcp_mss(*fd).unwrap_or(self.seg).clamp(MIN_SEG, 65535);
            tx.seg_at = Some(now);
        }
        tx.seg
    }

    /// Whether busy-poll mode is on (see `polled`).
    pub fn is_polled(&self) -> bool {
        self.polled.load(Ordering::Acquire)
    }

    /// Switches busy-poll mode (see `polled`).
    pub fn set_polled(&self, on: bool, qpn: u32) -> io::Result<()> {
        self.polled.store(on, Ordering::Release);
        self.rewatch(qpn)
    }

    /// Stops all I/O on the connection (idempotent).
    pub fn close(&self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            match &self.io {
                Io::Tcp { fd, epoll, .. } => {
                    // After any `rewatch` under way: none modifies the
                    // deleted registration.
                    drop(self.watching.lock());
                    let _ = epoll.delete(*fd);
                    sys::shutdown(*fd);
                }
                Io::Pipe(p) => p.close(),
            }
        }
    }

    /// Half-closes (graceful disconnect: the peer reads end of stream).
    pub fn shutdown_write(&self) {
        self.fin_sent.store(true, Ordering::Release);
        match &self.io {
            Io::Tcp { stream, .. } => {
                let _ = stream.shutdown(std::net::Shutdown::Write);
            }
            Io::Pipe(p) => p.shutdown_write(),
        }
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
            match &self.io {
                Io::Tcp { fd, .. } => sys::reset(*fd),
                Io::Pipe(p) => p.reset(),
            }
        }
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }
}
