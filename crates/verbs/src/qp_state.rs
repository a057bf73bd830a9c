//! The states of a queue pair (the verbs state machine's vocabulary; the
//! transitions live in `qp.rs`).

/// Queue pair states (`IBV_QPS_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum QpState {
    Reset = 0,
    Init = 1,
    Rtr = 2,
    Rts = 3,
    /// Send queue drain: WRs already started finish, new ones wait.
    Sqd = 4,
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
