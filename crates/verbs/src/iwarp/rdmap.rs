//! One handler per RDMAP opcode (siw: `siw_proc_send`, `siw_proc_write`,
//! `siw_proc_rreq`, `siw_proc_rresp`, `siw_proc_terminate`): each checks a
//! segment whose header `rx::on_header` decoded, against the queue's MSN and
//! MO, the STag table and the outstanding requests, and says what its
//! payload and its completion will do (an [`Action`]), or ends the
//! connection with the Terminate RFC 5040/5041 prescribe.

use super::backed::{BACKED_ALIGN, BACKED_RUN};
use super::rx_state::{fatal, sub_spans, CurRecv, Rx, RxEnd};
use super::*;

/// A refusal: the Terminate `code` over the offending header `hdr`, and
/// every WR still queued flushed (what every check of these handlers does
/// when it fails).
fn refuse(code: TermCode, hdr: &[u8]) -> RxEnd {
    fatal(code, hdr, WcStatus::WrFlushErr)
}

/// A segment's header as `on_header` decoded it.
pub(super) struct Seg<'a> {
    pub hdr: DdpHeader,
    /// Where the segment starts in the staging buffer.
    pub start: usize,
    /// The DDP/RDMAP header's length.
    pub hl: usize,
    /// Fixed body bytes after it (Read Request, atomics, Immediate Data,
    /// Terminate).
    pub extra: usize,
    pub payload_len: usize,
    /// The DDP/RDMAP header bytes, quoted in a Terminate.
    pub raw: &'a [u8],
}

/// A Write segment: checked against its STag, placed into the region (or
/// staged for a backed one); a zero-length one is the Write RTR when one is
/// expected.
pub(super) fn on_write(
    q: &QpInner,
    rx: &mut Rx,
    t: TaggedHeader,
    g: &Seg,
) -> Result<Action, RxEnd> {
    Ok({
        if g.payload_len == 0 {
            // Zero-length Write: no STag lookup (also the P2P RTR).
            if rx.rtr_expected {
                Action::Rtr
            } else {
                Action::Write
            }
        } else {
            let mr = q
                .core
                .stags
                .lookup(t.stag)
                .ok_or_else(|| refuse(codes::DDP_TAGGED_INVALID_STAG, g.raw))?;
            mr.check(q.pd, Access::REMOTE_WRITE, t.to, g.payload_len as u64)
                .map_err(|e| refuse(e.ddp_code(), g.raw))?;
            if mr.backend.is_some() {
                // Received whole, handed to the backend once the CRC
                // checked out (segment_done), together with the rest of
                // its message.
                let off = t.to - mr.iova;
                let cont = matches!(&rx.backed_run,
                    Some((m, o, l)) if m.stag == mr.stag && o + *l as u64 == off);
                if !cont {
                    flush_backed(rx, usize::MAX).map_err(|e| backed_failed(q, g.raw, e))?;
                } else if rx.backed_run.as_ref().is_some_and(|r| r.2 >= BACKED_RUN) {
                    // Long message: pass on the 4 KiB-aligned part.
                    flush_backed(rx, BACKED_ALIGN).map_err(|e| backed_failed(q, g.raw, e))?;
                }
                let at = rx.backed_run.as_ref().map_or(0, |r| r.2);
                if rx.backed.len() < at + g.payload_len {
                    rx.backed.resize(at + g.payload_len, 0);
                }
                if rx.backed_run.is_none() {
                    rx.backed_run = Some((mr.clone(), off, 0));
                }
                rx.target.push(RawSpan {
                    // SAFETY: at + g.payload_len <= backed.len().
                    ptr: unsafe { rx.backed.as_mut_ptr().add(at) },
                    len: g.payload_len,
                });
                Action::BackedWrite
            } else {
                mr.resolve(t.to, g.payload_len as u64, &mut rx.target);
                if mr.fenced {
                    rx.fence.push(mr.clone());
                }
                rx._target_keep = Some(mr);
                Action::Write
            }
        }
    })
}

/// A Read Response segment: it must answer the oldest outstanding Read (or our
/// Read RTR, or a flush), in order, within the sink, and end exactly at the
/// length asked for.
pub(super) fn on_read_response(
    q: &QpInner,
    rx: &mut Rx,
    t: TaggedHeader,
    g: &Seg,
) -> Result<Action, RxEnd> {
    Ok({
        // Read Response: must answer the oldest outstanding Read.
        if rx.rtr_read_pending {
            // The answer to our Read RTR (issue 20, item 1): one empty,
            // last segment naming the RTR STag at offset 0.
            if t.stag != RTR_STAG {
                return Err(refuse(codes::DDP_TAGGED_INVALID_STAG, g.raw));
            }
            if t.to != 0 || g.payload_len != 0 || !g.hdr.last() {
                return Err(refuse(codes::DDP_TAGGED_BASE_BOUNDS, g.raw));
            }
            rx.rtr_read_pending = false;
            rx.to_tx.rtr_answered = true;
            rx.kick = true;
            return Ok(Action::None);
        }
        let sq = q.sq.lock();
        // Nobody asked: DDP catastrophic, 1/0/0, as siw
        // (`siw_proc_rresp`, "ORQ empty").
        let Some(&seq) = sq.orq.front() else {
            return Err(refuse(codes::DDP_LOCAL_CATASTROPHIC, g.raw));
        };
        let w = sq
            .wqes
            .iter()
            .find(|w| w.seq == seq)
            .expect("ORQ entry is queued");
        // The oldest outstanding request may be an atomic, whose answer
        // is an Atomic Response.
        if !matches!(w.op, WrOp::RdmaRead { .. } | WrOp::Flush { .. }) {
            return Err(refuse(codes::RDMAP_UNEXPECTED_OPCODE, g.raw));
        }
        // A flush's answer: one empty, last segment naming STag 0.
        if matches!(w.op, WrOp::Flush { .. }) {
            if t.stag != 0 || t.to != 0 || g.payload_len != 0 || !g.hdr.last() {
                return Err(refuse(codes::DDP_TAGGED_BASE_BOUNDS, g.raw));
            }
            drop(sq);
            return Ok(Action::ReadResp);
        }
        let s = w.sink.as_ref().expect("a Read on the wire has a sink");
        let (sink, sink_to) = (s.mr.clone(), s.to);
        let want_to = sink_to + rx.read_resp_off;
        if t.stag != sink.stag {
            return Err(refuse(codes::DDP_TAGGED_INVALID_STAG, g.raw));
        }
        // In order, within the sink, and (the last segment) exactly
        // the length asked for: a short response would complete the
        // Read with bytes that never came (siw: `siw_rresp_check_ntoh`).
        let end = rx.read_resp_off + g.payload_len as u64;
        if t.to != want_to || end > w.len || (g.hdr.last() && end != w.len) {
            return Err(refuse(codes::DDP_TAGGED_BASE_BOUNDS, g.raw));
        }
        drop(sq);
        if g.payload_len > 0 {
            sink.resolve(t.to, g.payload_len as u64, &mut rx.target);
        }
        if sink.fenced {
            rx.fence.push(sink.clone());
        }
        rx._target_keep = Some(sink);
        Action::ReadResp
    })
}

/// A message for queue 0 found no posted receive. Up to
/// `DeviceConfig::recv_wait` after it first found none, it stays unread (the
/// header is handled again when a receive is posted: nothing was changed),
/// as an InfiniBand requester retries after a receiver-not-ready NAK; then
/// the Terminate of RFC 5041 section 7.2, as siw sends at once.
fn no_receive(q: &QpInner, rx: &mut Rx, raw: &[u8]) -> RxEnd {
    let now = std::time::Instant::now();
    let since = *rx.no_recv_since.get_or_insert(now);
    let deadline = since + q.core.config.recv_wait;
    if now < deadline {
        return RxEnd::NoRecv(deadline);
    }
    rx.no_recv_since = None;
    tracing::warn!(
        qpn = q.qpn,
        waited = ?now.saturating_duration_since(since),
        "a Send found no receive posted, and none came in time"
    );
    refuse(codes::DDP_UNTAGGED_NO_BUFFER, raw)
}

/// A Send-type segment (Send, with Solicited Event, with Invalidate, the one-
/// shot ones): queue 0's MSN and MO, placed into the receive it starts or
/// continues.
pub(super) fn on_send(
    q: &QpInner,
    rx: &mut Rx,
    u: UntaggedHeader,
    g: &Seg,
) -> Result<Action, RxEnd> {
    Ok({
        if u.msn != rx.send_msn {
            return Err(refuse(codes::DDP_UNTAGGED_MSN_RANGE, g.raw));
        }
        if rx.cur_recv.is_none() {
            if u.mo != 0 {
                return Err(refuse(codes::DDP_UNTAGGED_INVALID_MO, g.raw));
            }
            let wqe = match &q.srq {
                Some(srq) => srq.q.lock().pop_front(),
                None => q.rq.lock().pop_front(),
            };
            let Some(wqe) = wqe else {
                if g.payload_len == 0 && rx.rtr_expected {
                    return Ok(Action::Rtr);
                }
                return Err(no_receive(q, rx, g.raw));
            };
            rx.no_recv_since = None;
            rx.cur_recv = Some(CurRecv { wqe, received: 0 });
        }
        let cur = rx.cur_recv.as_ref().expect("receive in progress");
        if u.mo as u64 != cur.received {
            return Err(refuse(codes::DDP_UNTAGGED_INVALID_MO, g.raw));
        }
        if cur.received + g.payload_len as u64 > cur.wqe.len {
            // The receive the message was for completes with a
            // length error (as in siw); the flush completes the
            // others. (The status handed to the QP's failure goes
            // to a send WR, which is not at fault.)
            let cur = rx.cur_recv.take().expect("receive in progress");
            q.recv_cq.push(WorkCompletion {
                wr_id: cur.wqe.wr_id,
                status: WcStatus::LocLenErr,
                opcode: WcOpcode::Recv,
                byte_len: cur.received as u32,
                qp_num: crate::Qpn::from_raw(q.qpn),
                ..Default::default()
            });
            // siw's code for "receive space short"
            // (`siw_send_check_ntoh`): no buffer, 1/2/0x02.
            return Err(refuse(codes::DDP_UNTAGGED_NO_BUFFER, g.raw));
        }
        let mut t = std::mem::take(&mut rx.target);
        sub_spans(&cur.wqe.spans, u.mo as usize, g.payload_len, &mut t);
        rx.target = t;
        rx.fence
            .extend(cur.wqe.keep.iter().filter(|m| m.fenced).cloned());
        Action::Send
    })
}

/// A Read Request: queue 1's MSN, the inbound Read limit (our IRD), the source
/// checked; a zero-length one is the Read RTR when one is expected, or a flush
/// of a backed region.
pub(super) fn on_read_request(
    q: &QpInner,
    rx: &mut Rx,
    c: &Conn,
    u: UntaggedHeader,
    g: &Seg,
) -> Result<Action, RxEnd> {
    Ok({
        // Bytes after the 28-byte body: the message is too long for
        // the queue 1 buffer of one Read Request (RFC 5041 section
        // 7.2, RFC 5040 section 4.4).
        if g.payload_len != 0 {
            return Err(refuse(codes::DDP_UNTAGGED_TOO_LONG, g.raw));
        }
        if u.msn != rx.rr_msn {
            return Err(refuse(codes::DDP_UNTAGGED_MSN_RANGE, g.raw));
        }
        let rr = ReadRequest::decode(&rx.hdr_bytes[g.hl..g.hl + ReadRequest::LEN])
            .map_err(|e| refuse(e.term_code(), g.raw))?;
        let full = rx.hdr_bytes[..g.hl + ReadRequest::LEN].to_vec();
        // The Read Response's tagged offsets run from the sink TO: one
        // that wraps past 2^64 names no buffer (found by the engine_sim
        // fuzz target: composing the response overflowed).
        if rr.sink_to.checked_add(rr.size as u64).is_none() {
            return Err(refuse(codes::RDMAP_TO_WRAP, &full));
        }
        if rx.rtr_expected && rr.size == 0 {
            // The Read RTR: answered like any zero-length Read (a
            // zero-length Read Response, the MSN counted), or the
            // peer's first real Read is refused (issue 20, item 1).
            rx.rtr_expected = false;
            Action::ReadReq(rr, None)
        } else {
            let used = c.inbound.load(Ordering::Acquire);
            if used >= c.params.ird.max(1) as usize {
                return Err(refuse(codes::RDMAP_CATASTROPHIC_STREAM, &full));
            }
            if rr.size == 0 {
                // Naming a backed region, a zero-length Read is a
                // flush (backend.rs); otherwise its STag is not
                // looked at.
                let flush = q.core.stags.lookup(rr.src_stag).filter(|m| {
                    m.backend.is_some() && m.check(q.pd, Access::LOCAL_READ, rr.src_to, 0).is_ok()
                });
                Action::ReadReq(rr, flush)
            } else {
                let mr = q
                    .core
                    .stags
                    .lookup(rr.src_stag)
                    .ok_or_else(|| refuse(codes::RDMAP_INVALID_STAG, &full))?;
                mr.check(q.pd, Access::REMOTE_READ, rr.src_to, rr.size as u64)
                    .map_err(|e| refuse(e.rdmap_code(), &full))?;
                Action::ReadReq(rr, Some(mr))
            }
        }
    })
}

/// RFC 7306 Immediate Data: eight bytes, one segment, on queue 0's sequence,
/// consuming a receive.
pub(super) fn on_immediate(
    q: &QpInner,
    rx: &mut Rx,
    u: UntaggedHeader,
    g: &Seg,
) -> Result<Action, RxEnd> {
    Ok({
        // Exactly eight bytes, one segment, on queue 0's sequence.
        if g.payload_len != 0 {
            return Err(refuse(codes::DDP_UNTAGGED_TOO_LONG, g.raw));
        }
        if u.msn != rx.send_msn {
            return Err(refuse(codes::DDP_UNTAGGED_MSN_RANGE, g.raw));
        }
        if !u.last || u.mo != 0 || rx.cur_recv.is_some() {
            return Err(refuse(codes::DDP_UNTAGGED_INVALID_MO, g.raw));
        }
        let wqe = match &q.srq {
            Some(srq) => srq.q.lock().pop_front(),
            None => q.rq.lock().pop_front(),
        };
        let Some(wqe) = wqe else {
            return Err(no_receive(q, rx, g.raw));
        };
        rx.no_recv_since = None;
        let imm = u32::from_be_bytes(rx.hdr_bytes[g.hl..g.hl + 4].try_into().unwrap());
        Action::Imm(wqe, imm, u.opcode.solicited())
    })
}

/// An RFC 7306 Atomic Request: queue 1's MSN, the inbound limit, an aligned
/// 64-bit target with atomic rights.
pub(super) fn on_atomic_request(
    q: &QpInner,
    rx: &mut Rx,
    c: &Conn,
    u: UntaggedHeader,
    g: &Seg,
) -> Result<Action, RxEnd> {
    Ok({
        if g.payload_len != 0 {
            return Err(refuse(codes::DDP_UNTAGGED_TOO_LONG, g.raw));
        }
        if u.msn != rx.rr_msn {
            return Err(refuse(codes::DDP_UNTAGGED_MSN_RANGE, g.raw));
        }
        let ar = AtomicRequest::decode(&rx.hdr_bytes[g.hl..g.hl + AtomicRequest::LEN])
            .map_err(|e| refuse(e.term_code(), g.raw))?;
        // Atomics count against the same inbound limit as Reads.
        let used = c.inbound.load(Ordering::Acquire);
        if used >= c.params.ird.max(1) as usize {
            tracing::warn!(
                qpn = q.qpn,
                used,
                ird = c.params.ird,
                "atomic request over our IRD"
            );
            return Err(refuse(codes::RDMAP_CATASTROPHIC_STREAM, g.raw));
        }
        let mr = q
            .core
            .stags
            .lookup(ar.stag)
            .ok_or_else(|| refuse(codes::RDMAP_INVALID_STAG, g.raw))?;
        mr.check(q.pd, Access::REMOTE_ATOMIC, ar.to, 8)
            .map_err(|e| refuse(e.rdmap_code(), g.raw))?;
        // A target that is not a naturally aligned 64-bit word has
        // no code of its own in RFC 7306: remote operation error.
        let target = mr
            .atomic_target(ar.to)
            .ok_or_else(|| refuse(codes::RDMAP_OPERATION_UNSPECIFIED, g.raw))?;
        Action::AtomicReq(ar, mr, target)
    })
}

/// An RFC 7306 Atomic Response: it must answer the oldest outstanding request,
/// an atomic with this identifier.
pub(super) fn on_atomic_response(
    q: &QpInner,
    rx: &mut Rx,
    u: UntaggedHeader,
    g: &Seg,
) -> Result<Action, RxEnd> {
    Ok({
        if g.payload_len != 0 {
            return Err(refuse(codes::DDP_UNTAGGED_TOO_LONG, g.raw));
        }
        if u.msn != rx.atomic_resp_msn {
            return Err(refuse(codes::DDP_UNTAGGED_MSN_RANGE, g.raw));
        }
        let resp = AtomicResponse::decode(&rx.hdr_bytes[g.hl..g.hl + AtomicResponse::LEN])
            .map_err(|e| refuse(e.term_code(), g.raw))?;
        // It must answer the oldest outstanding request, an atomic
        // with this identifier.
        let sq = q.sq.lock();
        let expected = sq.orq.front().and_then(|&seq| {
            sq.wqes.iter().find(|w| w.seq == seq).filter(|w| {
                matches!(
                    w.op,
                    WrOp::AtomicFetchAdd { .. } | WrOp::AtomicCmpSwap { .. }
                ) && w.seq as u32 == resp.req_id
            })
        });
        if expected.is_none() {
            return Err(refuse(codes::RDMAP_UNEXPECTED_OPCODE, g.raw));
        }
        drop(sq);
        Action::AtomicResp(resp)
    })
}

/// A Terminate from the peer: decoded in the RFC's layout (softrdma peers) or
/// Linux siw's.
pub(super) fn on_terminate(rx: &mut Rx, c: &Conn, g: &Seg) -> Result<Action, RxEnd> {
    Ok({
        let body = &rx.stage[g.start + 2 + g.hl..g.start + 2 + g.hl + g.extra];
        // softrdma peers write the RFC's layout; Linux siw its own
        // (issue 20, item 8): guessed from the word for the others.
        let t = if c.params.softrdma_peer {
            Terminate::decode(body)
        } else {
            Terminate::decode_guess_layout(body)
        };
        Action::Terminate(t.ok())
    })
}
