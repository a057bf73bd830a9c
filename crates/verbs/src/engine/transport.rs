//! The one seam between the engine and what carries a queue pair's
//! operations. Two transports implement it:
//!
//! - `iwarp::Conn`: iWARP over a TCP connection (MPA/DDP/RDMAP), or over
//!   the simulated pipe of `pipe.rs`. Its same-host data path (`samehost`:
//!   rings instead of the socket, Writes and Reads copied directly) is a
//!   mode of the same connection, negotiated on it, with the socket kept
//!   for the connection's life; it sits behind this object too.
//! - `local::LocalLink`: no network, the QP's Writes, Reads and Flushes
//!   executed against this device's own regions (a storage endpoint's
//!   partitions), in strict or relaxed order.
//!
//! The engine (`QpInner`'s flush and kick, the progress threads through
//! [`crate::progress::Host`]) calls only this trait and names neither
//! transport; each transport keeps its own per-connection state (the
//! iWARP transmitter and receiver) and uses the engine's queues.
//!
//! Lock order, for every transport: the receiver's state, then the send
//! queue ([`QpInner::sq`]), then the transmitter's state. A transport
//! method documented as called with the send queue locked must not take
//! the receiver's lock.

use super::{QpInner, RecvWqe, Sq};
use crate::error::Result;
use crate::negotiated::Negotiated;
use crate::wr::SendWr;
use softrdma_wire::TermCode;
use std::any::Any;
use std::io;
use std::net::SocketAddr;
use std::sync::Arc;

/// What a queue pair's operations travel over, once it is connected.
pub(crate) trait Transport: Send + Sync + 'static {
    /// Runs the transmitter as far as the send queue allows. Called with
    /// the send queue locked (`sq`). `Err`: the connection failed;
    /// `Ok(Some(reason))`: a local failure found while transmitting (a
    /// work request whose memory went away). Either fails the QP, which the
    /// caller does after unlocking.
    fn kick(&self, q: &QpInner, sq: &mut Sq) -> io::Result<Option<String>>;

    /// The QP is failing: stop moving bytes (the peer sees the connection
    /// close). Called before the queues are flushed, without locks.
    fn close(&self);

    /// The QP is being flushed, with the send queue locked: drop whatever
    /// the transmitter still holds, and stop any copy that could touch the
    /// flushed WRs' memory.
    fn flush_tx(&self, sq: &mut Sq);

    /// The receive the receiver is filling (a message partly arrived), so
    /// that the flush completes it.
    fn take_current_recv(&self) -> Option<RecvWqe>;

    /// Queues a Terminate with `code` (and the offending header) and
    /// pushes it out, best effort; the caller fails the QP next.
    fn send_terminate(&self, q: &QpInner, code: TermCode, hdr: Option<&[u8]>);

    /// A graceful disconnect (`rdma_disconnect`): push out what is queued,
    /// then end the stream. The caller flushes the QP next.
    fn disconnect(&self, q: &QpInner);

    /// The application's QP handle is being dropped (before the graceful
    /// disconnect that follows unless this leaves the QP in ERROR).
    fn on_drop(&self, _q: &QpInner) {}

    /// Input may be waiting: run the receiver for at most `budget`
    /// segments. True if it stopped at its budget (more may be waiting).
    fn on_readable(&self, _q: &Arc<QpInner>, _budget: usize) -> bool {
        false
    }

    /// A receive was posted (to the QP's receive queue or its SRQ): a
    /// receiver waiting for one goes on.
    fn on_recv_posted(&self, _q: &Arc<QpInner>) {}

    /// The connection has room for output again.
    fn on_writable(&self, _q: &Arc<QpInner>) {}

    /// A timer this transport asked for fired.
    fn on_timer(&self, _q: &Arc<QpInner>) {}

    /// A transport that executes send WRs itself (rather than through the
    /// send queue and [`Transport::kick`]) takes them here.
    fn post_send(&self, _q: &Arc<QpInner>, _wrs: &[SendWr]) -> Option<Result<()>> {
        None
    }

    /// Whether a QP in ERROR on this transport may go back to RESET.
    fn allows_reset(&self) -> bool {
        false
    }

    /// What was negotiated with the peer (a network transport).
    fn negotiated(&self) -> Option<Negotiated> {
        None
    }

    /// (local, peer) addresses (a network transport).
    fn addrs(&self) -> Option<(SocketAddr, SocketAddr)> {
        None
    }

    /// The concrete transport, for the API's transport-specific calls
    /// (busy polling, same-host statistics).
    fn as_any(&self) -> &dyn Any;
}
