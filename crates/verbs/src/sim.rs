//! Running the real engine over a simulated connection (`pipe.rs`), one
//! step at a time, on the caller's thread: no socket, no progress thread,
//! nothing that depends on the scheduler. Two queue pairs connected by
//! [`connect`] behave exactly as over TCP (the same transmitter, receiver
//! and RDMAP handlers run), but the caller decides when bytes arrive, how
//! they are cut, when a full pipe drains and when timers fire. Given the
//! same choices, a run repeats exactly: a failing seed replays.
//!
//! Used by the seeded two-engine simulation (`tests/sim.rs`) and by the
//! engine fuzz targets (`fuzz/fuzz_targets/engine_*.rs`), where one end of
//! the pipe is the fuzzer.
//!
//! The driver's loop, what a progress thread would do:
//! ```text
//! let r = pipe.ready(side);
//! if r.input  { sim::on_readable(qp, budget); }
//! if r.output { sim::on_writable(qp); }
//! if r.timer && pipe.take_timer(side) { sim::on_timer(qp); }
//! pipe.deliver(side, n);   // bytes in flight reach the other end
//! ```
//! The connection is already established: MPA negotiation is the
//! connection manager's (tested over TCP); what it agrees on is given here
//! as [`SimParams`].

use crate::cm;
use crate::error::Result;
use crate::iwarp::{self, Conn};
use crate::negotiated::Negotiated;
use crate::pipe::Pipe;
use crate::qp::{QpState, QueuePair};
use std::net::SocketAddr;
use std::sync::Arc;

/// The ready-to-receive frame of peer-to-peer mode (MPA v2, RFC 6581).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rtr {
    /// A zero-length RDMA Write.
    Write,
    /// A zero-length RDMA Read (answered by a zero-length Read Response).
    Read,
}

/// What the two ends agreed on, and the shape of the simulated TCP
/// connection.
#[derive(Debug, Clone)]
pub struct SimParams {
    /// MPA revision, 1 or 2.
    pub revision: u8,
    /// MPA CRC32c on every FPDU.
    pub crc: bool,
    /// Peer-to-peer mode and its RTR frame (revision 2 only).
    pub rtr: Option<Rtr>,
    /// Inbound Reads and atomics the initiator accepts (its IRD).
    pub initiator_ird: u16,
    /// Inbound Reads and atomics the responder accepts (its IRD; the
    /// initiator's ORD).
    pub responder_ird: u16,
    /// RFC 7306 atomics and immediate data.
    pub rfc7306: bool,
    /// softrdma's large segments (FPDUs not aligned to TCP segments).
    pub large_segments: bool,
    /// The TCP segment size FPDUs are cut for (without large segments).
    pub seg: usize,
    /// Bytes each direction holds (send plus receive buffer).
    pub cap: usize,
    /// Most bytes one read returns.
    pub max_read: usize,
    /// Seeds the pipe's read sizes.
    pub seed: u64,
}

impl Default for SimParams {
    fn default() -> Self {
        SimParams {
            revision: 2,
            crc: true,
            rtr: None,
            initiator_ird: 16,
            responder_ird: 16,
            rfc7306: true,
            large_segments: false,
            seg: 1460,
            cap: 256 * 1024,
            max_read: 64 * 1024,
            seed: 1,
        }
    }
}

fn addr(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// What one end agreed on.
fn negotiated(p: &SimParams, initiator: bool) -> Negotiated {
    let (ird, ord) = if initiator {
        (p.initiator_ird, p.responder_ird)
    } else {
        (p.responder_ird, p.initiator_ird)
    };
    Negotiated {
        revision: p.revision,
        crc: p.crc,
        ird,
        ord,
        p2p: p.revision == 2 && p.rtr.is_some(),
        initiator,
        large_segments: p.large_segments,
        rfc7306: p.rfc7306,
        same_host: false,
        one_shot: false,
        one_shot_se: false,
        softrdma_peer: true,
    }
}

fn ready_to_connect(qp: &QueuePair) -> Result<()> {
    if qp.state() == QpState::Reset {
        qp.modify(QpState::Init)?;
    }
    Ok(())
}

/// Connects `initiator` (pipe end 0) and `responder` (end 1) over a new
/// simulated connection and moves both to RTS.
pub fn connect(initiator: &QueuePair, responder: &QueuePair, p: &SimParams) -> Result<Arc<Pipe>> {
    ready_to_connect(initiator)?;
    ready_to_connect(responder)?;
    let pipe = Pipe::new(p.cap, p.max_read, p.seed);
    let (ni, nr) = (negotiated(p, true), negotiated(p, false));
    let (pi, pr) = (addr(1), addr(2));
    cm::attach(
        responder,
        Conn::over_pipe(pipe.end(1), pr, pi, p.seg, nr),
        None,
    )?;
    let rtr = p.rtr.filter(|_| ni.p2p).map(|r| r == Rtr::Read);
    cm::attach(
        initiator,
        Conn::over_pipe(pipe.end(0), pi, pr, p.seg, ni),
        rtr,
    )?;
    Ok(pipe)
}

/// Connects `qp` alone, at pipe end 0, as the initiator or the
/// responder; end 1 is left to the caller, who plays the peer byte by byte
/// ([`Pipe::inject`], [`Pipe::take_sent`]): the engine fuzz targets.
pub fn attach(qp: &QueuePair, initiator: bool, p: &SimParams) -> Result<Arc<Pipe>> {
    ready_to_connect(qp)?;
    let pipe = Pipe::new(p.cap, p.max_read, p.seed);
    let n = negotiated(p, initiator);
    let rtr = p.rtr.filter(|_| n.p2p && initiator).map(|r| r == Rtr::Read);
    cm::attach(
        qp,
        Conn::over_pipe(pipe.end(0), addr(1), addr(2), p.seg, n),
        rtr,
    )?;
    Ok(pipe)
}

/// Input is waiting: runs the receiver for at most `budget` segments (as
/// the progress thread on EPOLLIN). True: it stopped at its budget.
pub fn on_readable(qp: &QueuePair, budget: usize) -> bool {
    qp.inner.on_readable(budget.max(1))
}

/// The connection has room again: runs the transmitter (EPOLLOUT).
pub fn on_writable(qp: &QueuePair) {
    if let Some(t) = qp.inner.transport.get() {
        t.on_writable(&qp.inner)
    }
}

/// A timer the QP asked for fires.
pub fn on_timer(qp: &QueuePair) {
    if let Some(t) = qp.inner.transport.get() {
        t.on_timer(&qp.inner)
    }
}

/// Bytes the QP's connection holds in its own buffers (receive staging,
/// composed output, queued responses): what a peer can make it hold.
pub fn conn_memory(qp: &QueuePair) -> usize {
    qp.inner
        .transport
        .get()
        .and_then(|t| t.as_any().downcast_ref::<Conn>())
        .map_or(0, iwarp::conn_memory)
}
