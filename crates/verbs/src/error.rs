//! Errors returned by verbs calls (not completion statuses: see
//! [`crate::WcStatus`]).

use softrdma_wire::TermCode;

/// Why a verbs call failed.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A system call failed (socket, mapping, thread, pinning).
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// An argument is out of range or inconsistent; the text says which.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A device or process limit was reached (QPs, STag indices, memory, pinned bytes); the text
    /// names it.
    #[error("resource exhausted: {0}")]
    Exhausted(&'static str),
    /// The STag (index and key) asked for is already registered.
    #[error("STag {0:#010x} is already in use")]
    StagInUse(u32),
    #[error("queue pair {qpn} is in state {state:?}, which does not allow this")]
    /// The QP's state does not allow the call (posting before connecting, connecting twice, ...).
    BadState {
        /// The QP number.
        qpn: u32,
        /// The state it was in.
        state: crate::QpState,
    },
    /// The send queue already holds `max_send_wr` outstanding requests.
    #[error("send queue full")]
    SendQueueFull,
    /// The receive queue (or SRQ) already holds its most posted requests.
    #[error("receive queue full")]
    RecvQueueFull,
    #[error("connection rejected by peer")]
    /// The peer rejected the connection request.
    Rejected {
        /// The private data of the peer's MPA reject.
        private_data: Vec<u8>,
    },
    /// The peer broke the connection setup protocol (a bad or unexpected MPA frame).
    #[error("connection protocol error: {0}")]
    Protocol(String),
    /// A wait ran out of time; the text says for what.
    #[error("timed out: {0}")]
    Timeout(&'static str),
    /// The connection ended with a Terminate carrying this code.
    #[error("peer terminated the connection: {0}")]
    Terminated(TermCode),
    /// The object was closed (a listener, a device), so the call cannot succeed.
    #[error("device is closed")]
    Closed,
}

/// The result of a verbs call.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn inval(s: impl Into<String>) -> Error {
        Error::InvalidArgument(s.into())
    }
}
