//! Work requests and completions between verbs.h's structures and the
//! engine's.

use crate::abi::*;
use softrdma_verbs::{
    Lkey, Rkey, SendFlags, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion, WrOp,
};

pub fn wc_status(s: WcStatus) -> ibv_wc_status {
    match s {
        WcStatus::Success => IBV_WC_SUCCESS,
        WcStatus::LocLenErr => IBV_WC_LOC_LEN_ERR,
        WcStatus::LocQpOpErr => IBV_WC_LOC_QP_OP_ERR,
        WcStatus::LocProtErr => IBV_WC_LOC_PROT_ERR,
        WcStatus::WrFlushErr => IBV_WC_WR_FLUSH_ERR,
        WcStatus::BadRespErr => IBV_WC_BAD_RESP_ERR,
        WcStatus::LocAccessErr => IBV_WC_LOC_ACCESS_ERR,
        WcStatus::RemInvReqErr => IBV_WC_REM_INV_REQ_ERR,
        WcStatus::RemAccessErr => IBV_WC_REM_ACCESS_ERR,
        WcStatus::RemOpErr => IBV_WC_REM_OP_ERR,
        WcStatus::RetryExcErr => IBV_WC_RETRY_EXC_ERR,
        WcStatus::FatalErr => IBV_WC_FATAL_ERR,
        // One-shot ends (not reachable through verbs.h) and the rest.
        WcStatus::GeneralErr | WcStatus::Cancelled | WcStatus::Expired => IBV_WC_GENERAL_ERR,
    }
}

pub fn wc_opcode(o: WcOpcode) -> ibv_wc_opcode {
    match o {
        WcOpcode::Send | WcOpcode::AdvertiseEnd => IBV_WC_SEND,
        WcOpcode::RdmaWrite | WcOpcode::Flush => IBV_WC_RDMA_WRITE,
        WcOpcode::RdmaRead => IBV_WC_RDMA_READ,
        WcOpcode::CompSwap => IBV_WC_COMP_SWAP,
        WcOpcode::FetchAdd => IBV_WC_FETCH_ADD,
        WcOpcode::LocalInv => IBV_WC_LOCAL_INV,
        WcOpcode::RegMr => IBV_WC_BIND_MW,
        WcOpcode::Recv => IBV_WC_RECV,
        WcOpcode::RecvWithImm => IBV_WC_RECV_RDMA_WITH_IMM,
    }
}

pub fn wc(w: &WorkCompletion) -> ibv_wc {
    // SAFETY: plain data; all zeroes is valid.
    #[allow(unsafe_code)]
    let mut out: ibv_wc = unsafe { std::mem::zeroed() };
    out.wr_id = w.wr_id;
    out.status = wc_status(w.status);
    out.opcode = wc_opcode(w.opcode);
    out.byte_len = w.byte_len;
    out.qp_num = w.qp_num.raw();
    out.src_qp = w.qp_num.raw();
    if let Some(imm) = w.imm_data {
        out.wc_flags |= IBV_WC_WITH_IMM;
        out.__bindgen_anon_1.imm_data = imm.to_be();
    } else if let Some(k) = w.invalidated_rkey {
        out.wc_flags |= IBV_WC_WITH_INV;
        out.__bindgen_anon_1.invalidated_rkey = k.raw();
    }
    out
}

/// The bytes a work request's SGEs name.
///
/// # Safety
/// `sg` points to `n` readable `ibv_sge` when `n > 0`.
pub unsafe fn sgl_bytes(sg: *const ibv_sge, n: i32) -> u64 {
    if n <= 0 || sg.is_null() {
        return 0;
    }
    // SAFETY: the caller's contract.
    let s = unsafe { std::slice::from_raw_parts(sg, n as usize) };
    s.iter().map(|e| e.length as u64).sum()
}

/// The SGEs of a work request.
///
/// # Safety
/// `sg` points to `n` readable `ibv_sge` when `n > 0`.
pub unsafe fn sgl(sg: *const ibv_sge, n: i32) -> Vec<Sge> {
    if n <= 0 || sg.is_null() {
        return Vec::new();
    }
    // SAFETY: the caller's contract.
    let s = unsafe { std::slice::from_raw_parts(sg, n as usize) };
    s.iter()
        .map(|e| Sge {
            addr: e.addr,
            length: e.length,
            lkey: Lkey::from_raw(e.lkey),
        })
        .collect()
}

/// A send work request, without its SGEs (`sgl` adds them), or the errno
/// for one the engine does not take.
pub fn send_wr(w: &ibv_send_wr) -> Result<SendWr, i32> {
    let mut flags = SendFlags::NONE;
    if w.send_flags & IBV_SEND_SIGNALED != 0 {
        flags = flags | SendFlags::SIGNALED;
    }
    if w.send_flags & IBV_SEND_FENCE != 0 {
        flags = flags | SendFlags::FENCE;
    }
    if w.send_flags & IBV_SEND_SOLICITED != 0 {
        flags = flags | SendFlags::SOLICITED;
    }
    // SAFETY: reading a union of plain integers; the opcode says which.
    #[allow(unsafe_code)]
    let (rdma, atomic, imm_or_inv) =
        unsafe { (w.wr.rdma, w.wr.atomic, w.__bindgen_anon_1.imm_data) };
    let op = match w.opcode {
        IBV_WR_RDMA_WRITE => WrOp::RdmaWrite {
            remote_addr: rdma.remote_addr,
            rkey: Rkey::from_raw(rdma.rkey),
        },
        IBV_WR_RDMA_WRITE_WITH_IMM => WrOp::WriteImm {
            remote_addr: rdma.remote_addr,
            rkey: Rkey::from_raw(rdma.rkey),
            imm: u32::from_be(imm_or_inv),
        },
        IBV_WR_SEND => WrOp::Send,
        IBV_WR_SEND_WITH_IMM => WrOp::SendImm {
            imm: u32::from_be(imm_or_inv),
        },
        IBV_WR_SEND_WITH_INV => WrOp::SendWithInv {
            rkey: Rkey::from_raw(imm_or_inv),
        },
        IBV_WR_RDMA_READ => WrOp::RdmaRead {
            remote_addr: rdma.remote_addr,
            rkey: Rkey::from_raw(rdma.rkey),
        },
        IBV_WR_ATOMIC_CMP_AND_SWP => WrOp::AtomicCmpSwap {
            remote_addr: atomic.remote_addr,
            rkey: Rkey::from_raw(atomic.rkey),
            compare: atomic.compare_add,
            swap: atomic.swap,
        },
        IBV_WR_ATOMIC_FETCH_AND_ADD => WrOp::AtomicFetchAdd {
            remote_addr: atomic.remote_addr,
            rkey: Rkey::from_raw(atomic.rkey),
            add: atomic.compare_add,
        },
        IBV_WR_LOCAL_INV => WrOp::LocalInv {
            stag: Rkey::from_raw(imm_or_inv),
        },
        // Memory windows, TSO, driver opcodes: siw refuses them too.
        _ => return Err(libc::EINVAL),
    };
    Ok(SendWr {
        wr_id: w.wr_id,
        op,
        sgl: Vec::new(),
        flags,
    })
}
