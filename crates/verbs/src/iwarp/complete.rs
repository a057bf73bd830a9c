//! What a whole segment does once its CRC checked out (siw:
//! `siw_rdmap_complete`): receive and Read completions, one-shot and
//! Send-with-Invalidate invalidation, atomics applied, Read and Atomic
//! Responses queued for the transmitter (the receiver then stops with
//! `Stop::Kick`, and the driver runs it).

use super::rx_state::{fatal, Action};
use super::*;

/// A whole, CRC-checked segment arrived: finish what it started; a
/// message's last segment counts as processed for a same-host peer.
pub(super) fn on_segment_done(q: &QpInner, rx: &mut Rx, c: &Conn) -> Option<RxEnd> {
    let counted = rx
        .hdr
        .is_some_and(|h| h.last() && h.opcode() != Opcode::Terminate);
    // The first FPDU from the peer ends a responder's hold (RFC 5044
    // section 7.1.2 rule 4) and, in peer-to-peer mode, the wait for the
    // RTR whatever the first message is (a peer that sends something else
    // first no longer stalls our transmitter forever: issue 20, item 9).
    let first = !rx.seen_fpdu;
    if first {
        rx.seen_fpdu = true;
        rx.rtr_expected = false;
        rx.to_tx.release = true;
    }
    let end = segment_done(q, rx, c);
    if first && end.is_none() {
        // Transmission may start now.
        rx.kick = true;
    }
    if counted {
        if let Some(link) = &c.link {
            link.message_done();
        }
    }
    end
}

pub(super) fn segment_done(q: &QpInner, rx: &mut Rx, c: &Conn) -> Option<RxEnd> {
    let hdr = rx.hdr.take().expect("segment header");
    let last = hdr.last();
    let n = rx.payload_len as u64;
    // The payload is placed: the segment's hold on its target region ends
    // here, before any completion below reports it (an owner that takes
    // its buffer back, `MemoryRegion::into_vec`, finds no other holder).
    rx.target.clear();
    rx._target_keep = None;
    rx.fence.clear();
    match std::mem::replace(&mut rx.action, Action::None) {
        Action::None | Action::Write => None,
        Action::BackedWrite => {
            if let Some(r) = rx.backed_run.as_mut() {
                r.2 += n as usize;
            }
            if !last {
                return None;
            }
            let raw = rx.hdr_bytes[..ddp::TAGGED_LEN].to_vec();
            flush_backed(rx, usize::MAX)
                .err()
                .map(|e| backed_failed(q, &raw, e))
        }
        Action::Rtr => {
            rx.rtr_expected = false;
            rx.to_tx.release = true;
            rx.kick = true;
            None
        }
        Action::ReadResp => {
            rx.read_resp_off += n;
            if !last {
                return None;
            }
            rx.read_resp_off = 0;
            let mut sq = q.sq.lock();
            if let Some(seq) = sq.orq.pop_front() {
                if let Some(w) = sq.get_mut(seq) {
                    w.stage = Stage::Done(WcStatus::Success);
                }
            }
            q.complete_in_order(&mut sq);
            rx.kick = true;
            None
        }
        Action::Send => {
            // (A flush that took the receive closed the connection first,
            // and the receiver stops before placing anything then; never
            // panic on it regardless.)
            let cur = rx.cur_recv.as_mut()?;
            cur.received += n;
            if !last {
                return None;
            }
            rx.send_msn = rx.send_msn.wrapping_add(1);
            let cur = rx.cur_recv.take()?;
            let (opcode, inval) = match hdr {
                DdpHeader::Untagged(u) => (u.opcode, u.inval_stag),
                _ => unreachable!("Sends are untagged"),
            };
            let wc = |invalidated: Option<u32>, reference| WorkCompletion {
                wr_id: cur.wqe.wr_id,
                status: WcStatus::Success,
                opcode: WcOpcode::Recv,
                byte_len: cur.received as u32,
                qp_num: crate::Qpn::from_raw(q.qpn),
                invalidated_rkey: invalidated.map(crate::Rkey::from_raw),
                solicited: opcode.solicited(),
                imm_data: None,
                reference,
                advertised_stag: (opcode == Opcode::SendAdvertise)
                    .then_some(crate::Rkey::from_raw(inval)),
            };
            // A one-shot binding this QP advertised: it ends (invalidated,
            // freed) and the completion carries its reference; or a late
            // close of one that was cancelled or expired
            // (docs/one-shot.md, `engine/oneshot.rs`).
            if opcode.invalidates()
                && q.close_advert(inval, |r| q.recv_cq.push(wc(Some(inval), r)))
                    != crate::engine::Close::Unknown
            {
                return None;
            }
            let mut invalidated = None;
            if opcode.invalidates() {
                match q.core.stags.lookup(inval) {
                    // A close must name one of ours: a protocol violation.
                    Some(mr) if !opcode.is_close() && mr.pd == q.pd && mr.invalidatable => {
                        q.core.stags.set_valid(&mr, false);
                        invalidated = Some(inval);
                    }
                    found => {
                        // Give the buffer back as flushed; the QP fails.
                        q.recv_cq.push(WorkCompletion {
                            wr_id: cur.wqe.wr_id,
                            status: WcStatus::RemInvReqErr,
                            opcode: WcOpcode::Recv,
                            qp_num: crate::Qpn::from_raw(q.qpn),
                            ..Default::default()
                        });
                        // As siw: an STag we hold but may not invalidate
                        // for this peer (another PD, or not invalidatable)
                        // is a remote protection error; one we do not know
                        // a remote operation error (RFC 5040 section 7,
                        // code 0x09 under both types).
                        let code = if found.is_some() {
                            codes::RDMAP_CANNOT_INVALIDATE
                        } else {
                            codes::RDMAP_OP_CANNOT_INVALIDATE
                        };
                        let raw = rx.hdr_bytes[..ddp::UNTAGGED_LEN].to_vec();
                        return Some(fatal(code, &raw, WcStatus::WrFlushErr));
                    }
                }
            }
            q.recv_cq.push(wc(invalidated, None));
            None
        }
        Action::Imm(wqe, imm, solicited) => {
            rx.send_msn = rx.send_msn.wrapping_add(1);
            q.recv_cq.push(WorkCompletion {
                wr_id: wqe.wr_id,
                status: WcStatus::Success,
                opcode: WcOpcode::RecvWithImm,
                byte_len: 0,
                qp_num: crate::Qpn::from_raw(q.qpn),
                invalidated_rkey: None,
                solicited,
                imm_data: Some(imm),
                ..Default::default()
            });
            None
        }
        Action::AtomicReq(ar, mr, target) => {
            rx.rr_msn = rx.rr_msn.wrapping_add(1);
            if !mr.enter() {
                let raw = rx.hdr_bytes[..hdr.len()].to_vec();
                return Some(fatal(codes::RDMAP_INVALID_STAG, &raw, WcStatus::LocProtErr));
            }
            // SAFETY: `target` came from `mr.atomic_target` and `mr` (the
            // registration) is held here and entered until the operation
            // is done.
            let orig = unsafe { mr::atomic_apply(target, &ar) };
            mr.exit();
            drop(mr);
            rx.reply(
                c,
                Reply::Atomic {
                    req_id: ar.req_id,
                    orig,
                },
            );
            None
        }
        Action::AtomicResp(resp) => {
            rx.atomic_resp_msn = rx.atomic_resp_msn.wrapping_add(1);
            let mut sq = q.sq.lock();
            if let Some(seq) = sq.orq.pop_front() {
                if let Some(w) = sq.get_mut(seq) {
                    let fence = fenced(&w.keep);
                    if mr::enter_all(&fence) {
                        // SAFETY: the spans are the WR's 8-byte result
                        // buffer, checked for local write when it was posted,
                        // kept alive by the WR's registration references
                        // and entered if caller-owned.
                        unsafe { mr::copy_into_spans(&w.spans, 0, &resp.orig.to_ne_bytes()) };
                        mr::exit_all(&fence);
                        w.stage = Stage::Done(WcStatus::Success);
                    } else {
                        w.stage = Stage::Done(WcStatus::LocProtErr);
                    }
                }
            }
            q.complete_in_order(&mut sq);
            rx.kick = true;
            None
        }
        Action::ReadReq(rr, src) => {
            rx.rr_msn = rx.rr_msn.wrapping_add(1);
            // A backed source larger than what the connection may still
            // hold in memory: streamed a chunk at a time, the receiver
            // paused meanwhile (issue 20, item 5: the whole length, up to
            // 4 GiB, was allocated at once, IRD times over).
            if let Some(mr) = src.as_ref().filter(|m| m.backend.is_some() && rr.size > 0) {
                let size = rr.size as u64;
                let held = c.backed_bytes.load(Ordering::Acquire);
                if size > BACKED_CHUNK || held + size > BACKED_BUDGET {
                    rx.reply(c, Reply::Streamed { rr, mr: mr.clone() });
                    c.set_rx_paused(true, q.qpn);
                    arm_stall_timer(q, c);
                    return None;
                }
                // Only the receiver adds to it: the check above holds.
                c.backed_bytes.fetch_add(size, Ordering::AcqRel);
            }
            let eager_backed = src
                .as_ref()
                .is_some_and(|m| m.backend.is_some() && rr.size > 0);
            // A backed source: flush (zero length) or read it now (this
            // may wait for the device).
            let src = match src {
                Some(mr) if mr.backend.is_some() => match backed_read(&mr, &rr) {
                    Ok(m) => Some(m),
                    Err(e) => {
                        let raw = rx.hdr_bytes[..ddp::UNTAGGED_LEN + ReadRequest::LEN].to_vec();
                        return Some(backed_read_failed(q, mr.stag, &raw, e));
                    }
                },
                other => other,
            };
            // Read eagerly from a backed region, `src` holds the bytes:
            // counted against the budget until sent.
            rx.reply(
                c,
                Reply::Read {
                    rr,
                    src,
                    eager: eager_backed,
                },
            );
            None
        }
        Action::Terminate(t) => {
            let code = t.map_or(codes::RDMAP_OPERATION_UNSPECIFIED, |t| t.code);
            Some(RxEnd::PeerTerminated(code))
        }
    }
}

/// The completion status a received Terminate gives our WR in flight.
pub(super) fn status_for_peer_term(code: TermCode) -> WcStatus {
    use softrdma_wire::Layer;
    match (code.layer, code.etype) {
        (Layer::Rdmap, 1) | (Layer::Ddp, 1) => WcStatus::RemAccessErr,
        (Layer::Ddp, 2) => WcStatus::RemInvReqErr,
        (Layer::Rdmap, 2) => WcStatus::RemOpErr,
        _ => WcStatus::RemOpErr,
    }
}
