//! The client's errors, typed: what went wrong says which variant, and
//! the underlying error (the link's, the handshake's, the engine's) is
//! kept as the [`std::error::Error::source`], not flattened into text.
//!
//! * [`ClientError`]: what an operation of [`super::StoreClient`] returns.
//! * [`Unreachable`]: why no node served a request in time (the last
//!   failure seen before the deadline), inside [`ClientError::Unavailable`].
//! * [`OpKind`]: which request got an answer of the wrong kind
//!   ([`ClientError::UnexpectedReply`]).

use std::net::SocketAddr;

use crate::net::handshake::HandshakeError;
use crate::net::link::LinkError;
use crate::proto::{Reply, StoreError};

/// Client errors.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The store refused the operation (bad pointer, arena full, ...).
    #[error(transparent)]
    Store(#[from] StoreError),
    /// No node answered before the deadline; the last failure seen.
    #[error("store unavailable: {0}")]
    Unavailable(Unreachable),
    /// The configuration names no node.
    #[error("no store nodes given")]
    NoNodes,
    /// The value is larger than a message can carry.
    #[error("value of {len} bytes exceeds the client's limit of {max} bytes")]
    ValueTooLarge {
        /// Value length.
        len: usize,
        /// Limit.
        max: usize,
    },
    /// The peer at `addr` broke the connection protocol: it is no store
    /// node (of this version), and waiting will not change that.
    #[error("{addr} is not a store node: {source}")]
    NotAStoreNode {
        /// The peer.
        addr: SocketAddr,
        /// What the handshake saw.
        source: HandshakeError,
    },
    /// A node answered a request with a reply of another kind (a
    /// protocol mismatch; an unconditional put answered `NotStored` is one
    /// too).
    #[error("{op} request answered {reply:?}")]
    UnexpectedReply {
        /// The request.
        op: OpKind,
        /// The answer it got.
        reply: Box<Reply>,
    },
    /// A one-sided Read would reach past the end of the arena (a bucket or
    /// object reference read from the arena that does not fit it).
    #[error("a Read of {len} bytes at arena offset {offset} lies outside the arena")]
    OutsideArena {
        /// Arena offset.
        offset: u64,
        /// Length.
        len: u64,
    },
    /// The client's RDMA endpoint could not be opened.
    #[error("rdma endpoint: {0}")]
    Endpoint(#[source] LinkError),
    /// The read buffer (a registered memory region) could not be had.
    #[error("rdma read buffer of {len} bytes: {source}")]
    ReadBuffer {
        /// Bytes asked for.
        len: usize,
        /// The engine's error.
        source: softrdma_verbs::Error,
    },
    /// The nodes refused this client (credentials, protected mode): the
    /// node's reason says why; retrying will not help.
    #[error("refused: {0}")]
    Auth(String),
}

/// Why no node served a request (the last failure before the deadline).
#[derive(Debug, thiserror::Error)]
pub enum Unreachable {
    /// The deadline passed before any attempt.
    #[error("no attempt made")]
    NoAttempt,
    /// Connecting to the node failed (it is down, or not a store node
    /// while another node may still be one).
    #[error("{addr}: {source}")]
    Connect {
        /// The node.
        addr: SocketAddr,
        /// What the handshake saw.
        source: HandshakeError,
    },
    /// Sending the request failed.
    #[error("send to {addr}: {source}")]
    Send {
        /// The node.
        addr: SocketAddr,
        /// The link's error.
        source: LinkError,
    },
    /// A one-sided Read failed (the link broke, or the node refused it).
    #[error("rdma read from {addr}: {source}")]
    Read {
        /// The node.
        addr: SocketAddr,
        /// The link's error.
        source: LinkError,
    },
    /// The node did not answer within the attempt's time.
    #[error("no answer from {addr} in time")]
    NoAnswer {
        /// The node.
        addr: SocketAddr,
    },
    /// The primary kept refusing writes for want of an in-sync secondary.
    #[error("no secondary in sync")]
    NoSecondaryInSync,
    /// The node answered that the client's epoch was stale.
    #[error("stale epoch, now {current}")]
    StaleEpoch {
        /// The node's epoch.
        current: u64,
    },
    /// The node is not the primary.
    #[error("{addr} is not the primary")]
    NotPrimary {
        /// The node.
        addr: SocketAddr,
    },
    /// No node told the client the arena yet (no connection so far).
    #[error("arena not known yet")]
    ArenaUnknown,
}

impl From<Unreachable> for ClientError {
    fn from(u: Unreachable) -> ClientError {
        ClientError::Unavailable(u)
    }
}

/// The requests of the client, to name one in an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpKind {
    /// `Op::Put` (keyed `set`, `set_if`).
    Put,
    /// `Op::Remove` (keyed `del`).
    Remove,
    /// `Op::Get` (keyed `get_via_node`).
    Get,
    /// `Op::Scan` (keyed `scan`).
    Scan,
    /// `Op::Insert` (pointer `alloc`).
    Insert,
    /// `Op::Update` (pointer `update_ptr`).
    Update,
    /// `Op::Delete` (pointer `free`).
    Delete,
    /// `Op::Read` (pointer `read_ptr_via_node`).
    Read,
    /// `Op::Status`.
    Status,
}

impl std::fmt::Display for OpKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

impl ClientError {
    /// `reply` answered a request `op` that expects another kind.
    pub(super) fn unexpected(op: OpKind, reply: Reply) -> ClientError {
        ClientError::UnexpectedReply {
            op,
            reply: Box::new(reply),
        }
    }
}
