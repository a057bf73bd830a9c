//! Work requests become messages (siw: `siw_qp_prepare_tx`): the next
//! send WR, Read Request, Read Response or Terminate the connection may
//! transmit now, in RDMA's order, as a [`TxMsg`] for `tx::compose` to cut
//! into FPDUs. A same-host peer's Writes and Reads are copied here
//! directly when the fast path may take them.

use super::*;

/// Picks the next message to transmit, if any may start now.
pub(super) fn next_msg(q: &QpInner, sq: &mut Sq, tx: &mut Tx, c: &Conn) -> Option<TxMsg> {
    if let Some(t) = tx.term.take() {
        return Some(t);
    }
    if tx.terminated {
        return None;
    }
    if let Some(r) = tx.rtr.take() {
        return Some(r);
    }
    if tx.rtr_wait {
        return None;
    }
    if let Some(until) = tx.hold_until {
        if std::time::Instant::now() < until {
            return None;
        }
        tx.hold_until = None;
    }
    if let Some(r) = tx.irq.pop_front() {
        return Some(r);
    }
    if q.state() != QpState::Rts {
        return None;
    }
    let ord = c.params.ord as usize;
    loop {
        let seq = sq.next_tx;
        let orq_busy = !sq.orq.is_empty() || tx.rtr_read_pending;
        let orq_len = sq.orq.len() + tx.rtr_read_pending as usize;
        let pd = q.pd;
        let sent = tx.msgs_sent;
        let w = sq.get_mut(seq)?;
        if matches!(w.stage, Stage::Done(_)) {
            sq.next_tx += 1;
            continue;
        }
        if w.fence && orq_busy {
            return None;
        }
        match w.op.clone() {
            WrOp::LocalInv { stag } => {
                let st = match q.core.stags.lookup(stag.raw()) {
                    Some(mr) if mr.pd == pd && mr.invalidatable => {
                        q.core.stags.set_valid(&mr, false);
                        WcStatus::Success
                    }
                    _ => WcStatus::LocProtErr,
                };
                w.stage = Stage::Done(st);
                sq.next_tx += 1;
                if st != WcStatus::Success {
                    tx.pending_fail = Some(format!("local invalidate of {stag:#x} refused"));
                    return None;
                }
                continue;
            }
            WrOp::FastReg {
                index_stag,
                key,
                iova,
                access,
            } => {
                let index = crate::stag::Stag::from_raw(index_stag).index();
                let owned = q.core.stags.reserved_pd(index) == Some(pd);
                let st = if owned && !w.keep.is_empty() {
                    let keep = std::mem::take(&mut w.keep);
                    let spans = std::mem::take(&mut w.spans);
                    crate::engine::fast_reg_build(
                        &q.core, pd, index, key, iova, access, keep, spans,
                    );
                    WcStatus::Success
                } else {
                    WcStatus::LocProtErr
                };
                w.stage = Stage::Done(st);
                sq.next_tx += 1;
                if st != WcStatus::Success {
                    tx.pending_fail = Some("fast-register refused".into());
                    return None;
                }
                continue;
            }
            op @ (WrOp::RdmaRead { .. } | WrOp::Flush { .. }) => {
                let (remote_addr, rkey, flush) = match op {
                    WrOp::RdmaRead { remote_addr, rkey } => (remote_addr, rkey, false),
                    WrOp::Flush { remote_addr, rkey } => (remote_addr, rkey, true),
                    _ => unreachable!("matched above"),
                };
                // Same host: read the peer's memory directly. (A flush
                // always goes on the stream, to the peer's engine.)
                if let Some(link) = c.link.as_ref() {
                    if !flush
                        && link.try_read(sent, &w.spans, &w.keep, w.len, rkey.raw(), remote_addr)
                    {
                        w.stage = Stage::Done(WcStatus::Success);
                        sq.next_tx += 1;
                        continue;
                    }
                }
                if orq_len >= ord {
                    return None;
                }
                if !flush && w.sink.is_none() {
                    // A Read into several SGEs: the request names one sink,
                    // an STag bound over them (`engine/sink.rs`).
                    let key = q.next_key.fetch_add(1, Ordering::Relaxed);
                    let keep = std::mem::take(&mut w.keep);
                    let spans = std::mem::take(&mut w.spans);
                    match crate::engine::Sink::bind(&q.core, pd, key, keep, spans) {
                        Ok(s) => w.sink = Some(s),
                        Err(e) => {
                            w.stage = Stage::Done(WcStatus::GeneralErr);
                            sq.next_tx += 1;
                            tx.pending_fail = Some(format!("no STag for a Read's sink: {e}"));
                            return None;
                        }
                    }
                }
                let (sink_stag, sink_to) = w.sink.as_ref().map_or((0, 0), |s| (s.mr.stag, s.to));
                let size = w.len as u32;
                w.stage = Stage::AwaitResponse;
                let hdr = DdpHeader::Untagged(UntaggedHeader {
                    last: true,
                    opcode: Opcode::ReadRequest,
                    inval_stag: 0,
                    qn: ddp::QN_READ_REQUEST,
                    msn: tx.rr_msn,
                    mo: 0,
                });
                tx.rr_msn += 1;
                let mut m = TxMsg::new(hdr, Vec::new(), 0, Fin::None);
                ReadRequest {
                    sink_stag,
                    sink_to,
                    size,
                    src_stag: rkey.raw(),
                    src_to: remote_addr,
                }
                .encode(&mut m.extra);
                m.extra_len = ReadRequest::LEN;
                sq.orq.push_back(seq);
                assert!(
                    sq.orq.len() + tx.rtr_read_pending as usize <= ord,
                    "ORQ past ORD"
                );
                sq.next_tx += 1;
                return Some(m);
            }
            op @ (WrOp::AtomicFetchAdd { .. } | WrOp::AtomicCmpSwap { .. }) => {
                if orq_len >= ord {
                    return None;
                }
                // Plain operations in RFC 7306's masked form: no field
                // boundaries for the add, every bit compared and swapped.
                let (aop, to, stag, add_swap, mask, compare) = match op {
                    WrOp::AtomicFetchAdd {
                        remote_addr,
                        rkey,
                        add,
                    } => (AtomicOp::FetchAdd, remote_addr, rkey, add, 0, 0),
                    WrOp::AtomicCmpSwap {
                        remote_addr,
                        rkey,
                        compare,
                        swap,
                    } => (
                        AtomicOp::CompareSwap,
                        remote_addr,
                        rkey,
                        swap,
                        u64::MAX,
                        compare,
                    ),
                    _ => unreachable!("matched above"),
                };
                w.stage = Stage::AwaitResponse;
                let hdr = DdpHeader::Untagged(UntaggedHeader {
                    last: true,
                    opcode: Opcode::AtomicRequest,
                    inval_stag: 0,
                    qn: ddp::QN_READ_REQUEST,
                    msn: tx.rr_msn,
                    mo: 0,
                });
                tx.rr_msn += 1;
                let mut m = TxMsg::new(hdr, Vec::new(), 0, Fin::None);
                m.extra_len = AtomicRequest {
                    op: aop,
                    // The response is matched to the oldest outstanding
                    // request; the identifier double-checks it.
                    req_id: seq as u32,
                    stag: stag.raw(),
                    to,
                    add_swap,
                    add_swap_mask: mask,
                    compare,
                    compare_mask: mask,
                }
                .encode(&mut m.extra);
                sq.orq.push_back(seq);
                assert!(
                    sq.orq.len() + tx.rtr_read_pending as usize <= ord,
                    "ORQ past ORD"
                );
                sq.next_tx += 1;
                return Some(m);
            }
            WrOp::WriteImm {
                remote_addr,
                rkey,
                imm,
            } => {
                if w.imm_next {
                    let solicited = w.solicited;
                    sq.next_tx += 1;
                    return Some(tx.immediate(imm, solicited, Fin::SqDone(seq)));
                }
                // The Write first; the Immediate Data message follows it
                // on the next call (the WR completes when both are out).
                w.imm_next = true;
                if let Some(link) = c.link.as_ref() {
                    if link.try_write(sent, &w.spans, &w.keep, w.len, rkey.raw(), remote_addr) {
                        continue;
                    }
                }
                let hdr = DdpHeader::Tagged(TaggedHeader {
                    last: true,
                    opcode: Opcode::Write,
                    stag: rkey.raw(),
                    to: remote_addr,
                });
                let spans = std::mem::take(&mut w.spans);
                let mut m = TxMsg::new(hdr, spans, w.len, Fin::None);
                m.fence = fenced(&w.keep);
                return Some(m);
            }
            WrOp::SendImm { imm } => {
                let solicited = w.solicited;
                sq.next_tx += 1;
                return Some(tx.immediate(imm, solicited, Fin::SqDone(seq)));
            }
            WrOp::RdmaWrite { remote_addr, rkey } => {
                // Same host: place into the peer's memory directly.
                if let Some(link) = c.link.as_ref() {
                    if link.try_write(sent, &w.spans, &w.keep, w.len, rkey.raw(), remote_addr) {
                        w.stage = Stage::Done(WcStatus::Success);
                        sq.next_tx += 1;
                        continue;
                    }
                }
                let hdr = DdpHeader::Tagged(TaggedHeader {
                    last: true,
                    opcode: Opcode::Write,
                    stag: rkey.raw(),
                    to: remote_addr,
                });
                let spans = std::mem::take(&mut w.spans);
                let total = w.len;
                let fence = fenced(&w.keep);
                sq.next_tx += 1;
                let mut m = TxMsg::new(hdr, spans, total, Fin::SqDone(seq));
                m.fence = fence;
                return Some(m);
            }
            op @ (WrOp::Send
            | WrOp::SendWithInv { .. }
            | WrOp::SendAdvertise { .. }
            | WrOp::SendClose { .. }) => {
                // One-shot opcodes only to a peer that negotiated them;
                // otherwise a plain Send (advertise put the STag in the
                // payload) and a Send with Invalidate.
                // A solicited close: opcode 0xE where agreed, else the
                // standard Send with Solicited Event and Invalidate (any
                // softrdma peer takes it for a close too).
                let (one_shot, se) = (c.params.one_shot, c.params.one_shot_se);
                let (opcode, inval) = match (op, w.solicited) {
                    (WrOp::SendAdvertise { stag }, _) if one_shot => {
                        (Opcode::SendAdvertise, stag.raw())
                    }
                    (WrOp::SendClose { stag }, false) if one_shot => {
                        (Opcode::SendClose, stag.raw())
                    }
                    (WrOp::SendClose { stag }, true) if se => (Opcode::SendCloseSe, stag.raw()),
                    (WrOp::SendWithInv { rkey } | WrOp::SendClose { stag: rkey }, false) => {
                        (Opcode::SendInvalidate, rkey.raw())
                    }
                    (WrOp::SendWithInv { rkey } | WrOp::SendClose { stag: rkey }, true) => {
                        (Opcode::SendSeInvalidate, rkey.raw())
                    }
                    (_, false) => (Opcode::Send, 0),
                    (_, true) => (Opcode::SendSe, 0),
                };
                let spans = std::mem::take(&mut w.spans);
                let total = w.len;
                let fence = fenced(&w.keep);
                let hdr = DdpHeader::Untagged(UntaggedHeader {
                    last: true,
                    opcode,
                    inval_stag: inval,
                    qn: ddp::QN_SEND,
                    msn: tx.send_msn,
                    mo: 0,
                });
                tx.send_msn += 1;
                sq.next_tx += 1;
                let mut m = TxMsg::new(hdr, spans, total, Fin::SqDone(seq));
                m.fence = fence;
                return Some(m);
            }
        }
    }
}

/// The caller-owned regions among a WR's (`MrInner::fenced`).
pub(super) fn fenced(keep: &[Arc<MrInner>]) -> Vec<Arc<MrInner>> {
    keep.iter().filter(|m| m.fenced).cloned().collect()
}
