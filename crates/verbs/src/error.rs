//! Errors returned by verbs calls (not completion statuses: see
//! [`crate::WcStatus`]).

use softrdma_wire::TermCode;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("resource exhausted: {0}")]
    Exhausted(&'static str),
    #[error("STag {0:#010x} is already in use")]
    StagInUse(u32),
    #[error("queue pair {qpn} is in state {state:?}, which does not allow this")]
    BadState { qpn: u32, state: crate::QpState },
    #[error("send queue full")]
    SendQueueFull,
    #[error("receive queue full")]
    RecvQueueFull,
    #[error("connection rejected by peer")]
    Rejected { private_data: Vec<u8> },
    #[error("connection protocol error: {0}")]
    Protocol(String),
    #[error("timed out: {0}")]
    Timeout(&'static str),
    #[error("peer terminated the connection: {0}")]
    Terminated(TermCode),
    #[error("device is closed")]
    Closed,
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

impl Error {
    pub(crate) fn inval(s: impl Into<String>) -> Error {
        Error::InvalidArgument(s.into())
    }
}
