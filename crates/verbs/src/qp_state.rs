//! The states of a queue pair (the verbs state machine's vocabulary; the
//! transitions live in `qp.rs`).

/// Queue pair states (`IBV_QPS_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum QpState {
    /// Created; nothing may be posted.
    Reset = 0,
    /// Receives may be posted; not connected yet.
    Init = 1,
    /// Ready to receive: connected for the receive side.
    Rtr = 2,
    /// Ready to send: connected; sends run.
    Rts = 3,
    /// Send queue drain: WRs already started finish, new ones wait.
    Sqd = 4,
    /// Failed or disconnected: outstanding work requests are flushed and new ones refused.
    Error = 5,
}

impl QpState {
    pub(crate) fn from_u8(v: u8) -> QpState {
        match v {
            0 => QpState::Reset,
            1 => QpState::Init,
            2 => QpState::Rtr,
            3 => QpState::Rts,
            4 => QpState::Sqd,
            _ => QpState::Error,
        }
    }
}
