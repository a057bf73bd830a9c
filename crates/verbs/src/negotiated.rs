//! What the two ends of a connection agreed on (MPA negotiation and
//! softrdma's extensions): set by the connection manager, read by the
//! transports. A leaf: it names nothing else in the crate.

/// What both ends agreed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    /// The MPA revision in use (1 or 2).
    pub revision: u8,
    /// Whether every FPDU carries an MPA CRC32c.
    pub crc: bool,
    /// Inbound Reads we accept.
    pub ird: u16,
    /// Outbound Reads we may have in flight.
    pub ord: u16,
    /// Peer-to-peer mode: a ready-to-receive frame was exchanged (MPA v2).
    pub p2p: bool,
    /// This end initiated the connection (the active side).
    pub initiator: bool,
    /// Both ends run softrdma's extensions with `ext::LARGE_SEGMENTS`:
    /// FPDUs go out back to back in batches, not one per TCP segment.
    pub large_segments: bool,
    /// Both ends agreed to `ext::RFC7306`: atomics and immediate data may
    /// be posted (and are accepted from the peer).
    pub rfc7306: bool,
    /// This end reaches the peer's memory directly for RDMA Write and Read
    /// (same-host transport, `docs/same-host.md`).
    pub same_host: bool,
    /// Both ends agreed to `ext::ONE_SHOT` (`docs/one-shot.md`): advertise
    /// and close travel in RDMAP headers, not in payloads.
    pub one_shot: bool,
    /// Both ends also agreed to `ext::ONE_SHOT_SE`: a close with Solicited
    /// Event travels as opcode 0xE (else as a standard Send with Solicited
    /// Event and Invalidate).
    pub one_shot_se: bool,
    /// The peer is softrdma (it offered or accepted the extension block):
    /// no responder hold is needed with it.
    pub softrdma_peer: bool,
}
