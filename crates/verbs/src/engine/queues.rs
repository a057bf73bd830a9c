//! The work queues' entries as the engine keeps them: posted WRs resolved
//! to memory, where each stands, and the send queue (with the
//! ORQ; the transmitter that serves it is the transport's).

use super::*;
use crate::cq::{WcOpcode, WcStatus};
use crate::wr::{RecvWr, SendFlags, SendWr, WrOp};

/// A posted receive, resolved to memory.
pub(crate) struct RecvWqe {
    pub wr_id: u64,
    pub spans: Vec<RawSpan>,
    pub len: u64,
    #[allow(dead_code)]
    pub keep: Vec<Arc<MrInner>>,
}

impl RecvWqe {
    pub(crate) fn resolve(core: &Core, pd: u32, wr: &RecvWr) -> Result<RecvWqe> {
        let mut spans = Vec::with_capacity(wr.sgl.len());
        let mut keep = Vec::with_capacity(wr.sgl.len());
        let mut len = 0u64;
        for sge in &wr.sgl {
            let mr = core
                .stags
                .lookup(sge.lkey.raw())
                .ok_or_else(|| Error::inval(format!("invalid lkey {:#x}", sge.lkey)))?;
            mr.check(pd, Access::LOCAL_WRITE, sge.addr, sge.length as u64)
                .map_err(|e| Error::inval(format!("receive SGE refused: {e:?}")))?;
            mr.resolve(sge.addr, sge.length as u64, &mut spans);
            len += sge.length as u64;
            keep.push(mr);
        }
        Ok(RecvWqe {
            wr_id: wr.wr_id,
            spans,
            len,
            keep,
        })
    }
}

/// Where a send WR stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    Queued,
    /// A Read Request or Atomic Request went out; waiting for the response.
    AwaitResponse,
    Done(WcStatus),
}

/// A posted send-queue WR, resolved to memory.
pub(crate) struct SqWqe {
    pub seq: u64,
    pub wr_id: u64,
    pub op: WrOp,
    pub signaled: bool,
    pub fence: bool,
    pub solicited: bool,
    pub spans: Vec<RawSpan>,
    pub len: u64,
    pub keep: Vec<Arc<MrInner>>,
    pub stage: Stage,
    /// For RDMA Read and atomics: the local sink (`sink.rs`).
    pub sink: Option<super::Sink>,
    /// Write with immediate: the Write went out, the Immediate Data
    /// message is next.
    pub imm_next: bool,
}

impl SqWqe {
    /// WR `wr` as entry `seq`, queued, its memory not yet resolved.
    pub fn new(seq: u64, wr: &SendWr) -> SqWqe {
        SqWqe {
            seq,
            wr_id: wr.wr_id,
            op: wr.op.clone(),
            signaled: wr.flags.contains(SendFlags::SIGNALED),
            fence: wr.flags.contains(SendFlags::FENCE),
            solicited: wr.flags.contains(SendFlags::SOLICITED),
            spans: Vec::new(),
            len: 0,
            keep: Vec::new(),
            stage: Stage::Queued,
            sink: None,
            imm_next: false,
        }
    }

    pub fn opcode(&self) -> WcOpcode {
        match self.op {
            WrOp::Send
            | WrOp::SendWithInv { .. }
            | WrOp::SendImm { .. }
            | WrOp::SendAdvertise { .. }
            | WrOp::SendClose { .. } => WcOpcode::Send,
            WrOp::RdmaWrite { .. } | WrOp::WriteImm { .. } => WcOpcode::RdmaWrite,
            WrOp::AtomicFetchAdd { .. } => WcOpcode::FetchAdd,
            WrOp::AtomicCmpSwap { .. } => WcOpcode::CompSwap,
            WrOp::RdmaRead { .. } => WcOpcode::RdmaRead,
            WrOp::Flush { .. } => WcOpcode::Flush,
            WrOp::LocalInv { .. } => WcOpcode::LocalInv,
            WrOp::FastReg { .. } => WcOpcode::RegMr,
        }
    }
}

/// Send-queue state, under one lock (the transport's transmitter state,
/// where it has one, has its own lock, always taken after this one).
pub(crate) struct Sq {
    pub wqes: VecDeque<SqWqe>,
    pub next_seq: u64,
    /// Sequence number of the next WR to start transmitting.
    pub next_tx: u64,
    /// Outstanding RDMA Reads (sequence numbers), oldest first.
    pub orq: VecDeque<u64>,
    pub sqd_pending: bool,
}

impl Sq {
    pub fn get_mut(&mut self, seq: u64) -> Option<&mut SqWqe> {
        let base = self.wqes.front()?.seq;
        self.wqes.get_mut(seq.checked_sub(base)? as usize)
    }
}
