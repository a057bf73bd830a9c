//! The receive path (siw: `siw_qp_rx.c`): FPDU headers are read through a
//! small staging buffer, every access is checked against the STag table
//! before a byte is placed, and large payloads are read from the socket
//! straight into the target memory (direct data placement). A protocol
//! error sends the Terminate of RFC 5040/5041/5044 and ends the connection.

use super::rdmap::{self, Seg};
use super::*;
pub(super) const STAGE_SIZE: usize = 64 * 1024;
/// How far past the bytes it needs one staged read may reach: enough to
/// take many small FPDUs per system call, small enough that the payload of
/// a large FPDU is mostly read straight into its target memory (direct
/// placement) rather than copied out of the stage.
pub(super) const LOOKAHEAD: usize = 4096;
/// Payload still to come that is read straight into target memory.
pub(super) const DIRECT_MIN: usize = 1024;
/// Largest Terminate ULPDU accepted.
pub(super) const MAX_TERM_ULPDU: usize = 128;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Header,
    Payload,
    Trailer,
}

/// What a completed segment still has to do once its CRC checked out.
pub(super) enum Action {
    None,
    Write,
    /// A segment of a Write into a backed region, received into
    /// `Rx::backed` (see `Rx::backed_run`).
    BackedWrite,
    ReadResp,
    Send,
    ReadReq(ReadRequest, Option<Arc<MrInner>>),
    /// RFC 7306 Immediate Data: the receive it consumes and the value.
    Imm(RecvWqe, u32, bool),
    /// RFC 7306 Atomic Request: checked, with its target (held by the
    /// registration).
    AtomicReq(AtomicRequest, Arc<MrInner>, RawSpan),
    AtomicResp(AtomicResponse),
    Terminate(Option<Terminate>),
    Rtr,
}

pub(super) struct CurRecv {
    pub(super) wqe: RecvWqe,
    pub(super) received: u64,
}

/// The receiver of one QP.
pub(crate) struct Rx {
    pub(super) stage: Vec<u8>,
    pub(super) start: usize,
    pub(super) end: usize,
    pub(super) phase: Phase,
    /// The DDP header and the fixed body after it (Read Request, Atomic
    /// Request or Response, Immediate Data, Terminate's first bytes).
    pub(super) hdr_bytes: [u8; ddp::UNTAGGED_LEN + AtomicRequest::LEN],
    pub(super) hdr: Option<DdpHeader>,
    pub(super) ulpdu_len: usize,
    pub(super) payload_len: usize,
    pub(super) placed: usize,
    pub(super) crc: u32,
    pub(super) target: Vec<RawSpan>,
    pub(super) _target_keep: Option<Arc<MrInner>>,
    /// The caller-owned regions behind `target` (`MrInner::fenced`): each
    /// placement enters them, so their deregistration waits for it.
    pub(super) fence: Vec<Arc<MrInner>>,
    /// Staging for Writes into backed regions (`backend.rs`): the
    /// segments of one Write message accumulate here (`backed_run`) and
    /// reach the backend together (fewer, larger, aligned device writes).
    pub(super) backed: Vec<u8>,
    /// The accumulated run: region, its offset, bytes.
    pub(super) backed_run: Option<(Arc<MrInner>, u64, usize)>,
    pub(super) action: Action,
    pub(super) send_msn: u32,
    pub(super) rr_msn: u32,
    pub(super) atomic_resp_msn: u32,
    pub(super) cur_recv: Option<CurRecv>,
    pub(super) read_resp_off: u64,
    /// Responder in peer-to-peer mode expects the RTR frame first.
    pub rtr_expected: bool,
    /// A whole FPDU has arrived.
    pub seen_fpdu: bool,
    pub(super) bytes_in_frame: bool,
}

/// What the receive loop ended with.
pub(crate) enum RxEnd {
    /// The socket has nothing more for now.
    Block,
    /// Budget used up; the level-triggered poller comes back.
    Budget,
    /// End of stream at an FPDU boundary: the peer disconnected.
    Eof,
    /// End of stream inside an FPDU.
    EofMidFrame,
    Io(io::Error),
    /// A protocol error: send this Terminate.
    Fatal(TermCode, Option<Vec<u8>>, WcStatus),
    /// The peer sent a Terminate.
    PeerTerminated(TermCode),
}

pub(super) enum Need {
    Have,
    End(RxEnd),
}

impl Rx {
    pub fn new() -> Rx {
        Rx {
            stage: Vec::new(),
            start: 0,
            end: 0,
            phase: Phase::Header,
            hdr_bytes: [0; ddp::UNTAGGED_LEN + AtomicRequest::LEN],
            hdr: None,
            ulpdu_len: 0,
            payload_len: 0,
            placed: 0,
            crc: 0,
            target: Vec::new(),
            _target_keep: None,
            fence: Vec::new(),
            backed: Vec::new(),
            backed_run: None,
            action: Action::None,
            send_msn: 1,
            rr_msn: 1,
            atomic_resp_msn: 1,
            cur_recv: None,
            read_resp_off: 0,
            rtr_expected: false,
            seen_fpdu: false,
            bytes_in_frame: false,
        }
    }

    /// The receive the receiver holds (a Send being placed, or an
    /// Immediate Data message whose trailer has not arrived): taken when
    /// the QP fails, to be flushed with the rest (issue 19's simulation
    /// found the second one lost: never completed).
    pub fn take_current_recv(&mut self) -> Option<RecvWqe> {
        if let Some(c) = self.cur_recv.take() {
            return Some(c.wqe);
        }
        match std::mem::replace(&mut self.action, Action::None) {
            Action::Imm(w, _, _) => Some(w),
            other => {
                self.action = other;
                None
            }
        }
    }

    fn avail(&self) -> usize {
        self.end - self.start
    }

    /// Makes sure `n` bytes are staged.
    fn need(&mut self, c: &Conn, n: usize) -> Need {
        while self.avail() < n {
            if self.stage.is_empty() {
                self.stage = vec![0; STAGE_SIZE];
            }
            if self.stage.len() - self.start < n || self.end == self.stage.len() {
                self.stage.copy_within(self.start..self.end, 0);
                self.end -= self.start;
                self.start = 0;
            }
            let want = (n - self.avail()).max(LOOKAHEAD);
            let lim = (self.end + want).min(self.stage.len());
            match c.recv(&mut self.stage[self.end..lim]) {
                Ok(0) => {
                    return Need::End(if self.avail() == 0 && self.phase == Phase::Header {
                        RxEnd::Eof
                    } else {
                        RxEnd::EofMidFrame
                    })
                }
                Ok(k) => self.end += k,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Need::End(RxEnd::Block),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Need::End(RxEnd::Io(e)),
            }
        }
        Need::Have
    }
}

pub(super) fn fatal(code: TermCode, hdr: &[u8], status: WcStatus) -> RxEnd {
    RxEnd::Fatal(code, Some(hdr.to_vec()), status)
}

/// Sub-spans of `spans` covering `[off, off+len)`.
pub(super) fn sub_spans(spans: &[RawSpan], mut off: usize, mut len: usize, out: &mut Vec<RawSpan>) {
    out.clear();
    for s in spans {
        if len == 0 {
            break;
        }
        if off >= s.len {
            off -= s.len;
            continue;
        }
        let k = (s.len - off).min(len);
        out.push(RawSpan {
            // SAFETY: off < s.len keeps the pointer inside the span.
            ptr: unsafe { s.ptr.add(off) },
            len: k,
        });
        len -= k;
        off = 0;
    }
}

/// Decodes an FPDU header and decides where its payload goes.
pub(super) fn on_header(q: &QpInner, rx: &mut Rx, c: &Conn) -> Result<(), RxEnd> {
    if let Need::End(e) = rx.need(c, 3) {
        return Err(e);
    }
    let s = rx.start;
    let ulpdu_len = u16::from_be_bytes([rx.stage[s], rx.stage[s + 1]]) as usize;
    let hl = DdpHeader::len_from_ctrl(rx.stage[s + 2]);
    // A ULPDU too short for its DDP header has no code in RFC 5041 or RFC
    // 5044 (MPA's 0x04 is for set-up frames): the stream cannot be parsed,
    // RDMAP's "catastrophic error, localized to RDMAP stream", the code the
    // wire crate gives every truncated header.
    if ulpdu_len < hl {
        tracing::warn!(
            qpn = q.qpn,
            ulpdu_len,
            bytes = ?&rx.stage[s..rx.end.min(s + 16)],
            seen_fpdu = rx.seen_fpdu,
            "ULPDU shorter than its DDP header"
        );
        return Err(RxEnd::Fatal(
            codes::RDMAP_CATASTROPHIC_STREAM,
            None,
            WcStatus::WrFlushErr,
        ));
    }
    if let Need::End(e) = rx.need(c, 2 + hl) {
        return Err(e);
    }
    let s = rx.start;
    let raw = &rx.stage[s + 2..s + 2 + hl];
    let ext = softrdma_wire::Ext {
        rfc7306: c.params.rfc7306,
        one_shot: c.params.one_shot,
    };
    let hdr = match DdpHeader::decode_ext(raw, ext) {
        Ok(h) => h,
        // term_code_in: a bad DDP version in a tagged segment gets the
        // tagged code (RFC 5041 section 7.2).
        Err(e) => return Err(fatal(e.term_code_in(raw), raw, WcStatus::WrFlushErr)),
    };
    let extra = match hdr.opcode() {
        Opcode::ReadRequest => ReadRequest::LEN,
        Opcode::AtomicRequest => AtomicRequest::LEN,
        Opcode::AtomicResponse => AtomicResponse::LEN,
        Opcode::ImmediateData | Opcode::ImmediateDataSe => ddp::IMMEDIATE_LEN,
        Opcode::Terminate => {
            // Longer than any Terminate: too long for the queue 2 buffer
            // (RFC 5041 section 7.2).
            if ulpdu_len - hl > MAX_TERM_ULPDU {
                return Err(fatal(
                    codes::DDP_UNTAGGED_TOO_LONG,
                    raw,
                    WcStatus::WrFlushErr,
                ));
            }
            ulpdu_len - hl
        }
        _ => 0,
    };
    if ulpdu_len < hl + extra {
        tracing::warn!(
            qpn = q.qpn,
            ulpdu_len,
            hl,
            extra,
            "ULPDU shorter than its header"
        );
        return Err(fatal(
            codes::RDMAP_CATASTROPHIC_STREAM,
            raw,
            WcStatus::WrFlushErr,
        ));
    }
    if let Need::End(e) = rx.need(c, 2 + hl + extra) {
        return Err(e);
    }
    let s = rx.start;
    let head_len = 2 + hl + extra;
    if c.params.crc {
        rx.crc = mpa::crc_update(mpa::crc_start(), &rx.stage[s..s + head_len]);
    }
    let hb_len = (hl + extra).min(rx.hdr_bytes.len());
    rx.hdr_bytes[..hb_len].copy_from_slice(&rx.stage[s + 2..s + 2 + hb_len]);
    let raw: Vec<u8> = rx.hdr_bytes[..hl.min(hb_len)].to_vec();
    let payload_len = ulpdu_len - hl - extra;
    rx.target.clear();
    rx._target_keep = None;
    rx.fence.clear();
    // A Write message into a backed region is passed on whole (or in long
    // runs); anything else arriving in the middle of one sees it placed.
    if rx.backed_run.is_some() && !matches!(hdr, DdpHeader::Tagged(t) if t.opcode == Opcode::Write)
    {
        flush_backed(rx, usize::MAX).map_err(|e| backed_failed(q, &raw, e))?;
    }
    let g = Seg {
        hdr,
        start: s,
        hl,
        extra,
        payload_len,
        raw: &raw,
    };
    let action = match hdr {
        DdpHeader::Tagged(t) if t.opcode == Opcode::Write => rdmap::on_write(q, rx, t, &g)?,
        DdpHeader::Tagged(t) => rdmap::on_read_response(q, rx, c, t, &g)?,
        DdpHeader::Untagged(u) => match u.opcode {
            Opcode::Send
            | Opcode::SendSe
            | Opcode::SendInvalidate
            | Opcode::SendSeInvalidate
            | Opcode::SendAdvertise
            | Opcode::SendClose => rdmap::on_send(q, rx, u, &g)?,
            Opcode::ReadRequest => rdmap::on_read_request(q, rx, c, u, &g)?,
            Opcode::ImmediateData | Opcode::ImmediateDataSe => rdmap::on_immediate(q, rx, u, &g)?,
            Opcode::AtomicRequest => rdmap::on_atomic_request(q, rx, c, u, &g)?,
            Opcode::AtomicResponse => rdmap::on_atomic_response(q, rx, u, &g)?,
            Opcode::Terminate => rdmap::on_terminate(rx, c, &g)?,
            _ => {
                return Err(fatal(
                    codes::RDMAP_UNEXPECTED_OPCODE,
                    &raw,
                    WcStatus::WrFlushErr,
                ))
            }
        },
    };
    finish_header(rx, hdr, ulpdu_len, payload_len, head_len, action);
    Ok(())
}

pub(super) fn finish_header(
    rx: &mut Rx,
    hdr: DdpHeader,
    ulpdu_len: usize,
    payload_len: usize,
    head_len: usize,
    action: Action,
) {
    rx.start += head_len;
    rx.hdr = Some(hdr);
    rx.ulpdu_len = ulpdu_len;
    rx.payload_len = payload_len;
    rx.placed = 0;
    rx.action = action;
    rx.phase = Phase::Payload;
    rx.bytes_in_frame = true;
}

/// Places payload bytes: from the staging buffer, or straight from the
/// socket into the target memory.
pub(super) fn on_payload(qpn: u32, rx: &mut Rx, c: &Conn) -> Result<(), RxEnd> {
    let mut scratch: Vec<RawSpan> = Vec::new();
    while rx.placed < rx.payload_len {
        let rem = rx.payload_len - rx.placed;
        if rx.avail() > 0 {
            let n = rx.avail().min(rem);
            let src = &rx.stage[rx.start..rx.start + n];
            if c.params.crc {
                rx.crc = mpa::crc_update(rx.crc, src);
            }
            if !mr::enter_all(&rx.fence) {
                return Err(deregistered(rx));
            }
            crate::test_hooks::placement_point(qpn);
            // SAFETY: target spans come from a registration held in
            // rx._target_keep or the current receive WQE, and were
            // bounds-checked in on_header; caller-owned memory among them
            // is entered (rx.fence), so it is not deregistered meanwhile.
            unsafe { mr::copy_into_spans(&rx.target, rx.placed, src) };
            mr::exit_all(&rx.fence);
            rx.placed += n;
            rx.start += n;
            continue;
        }
        if rem >= DIRECT_MIN {
            sub_spans(&rx.target, rx.placed, rem, &mut scratch);
            if !mr::enter_all(&rx.fence) {
                return Err(deregistered(rx));
            }
            crate::test_hooks::placement_point(qpn);
            // SAFETY: as above; the socket writes only inside the spans.
            let got = unsafe { c.recv_spans(&scratch) };
            if let Ok(k) = got {
                if k > 0 && c.params.crc {
                    sub_spans(&rx.target, rx.placed, k, &mut scratch);
                    // SAFETY: as above.
                    rx.crc = unsafe { mr::crc_spans(rx.crc, &scratch) };
                }
            }
            mr::exit_all(&rx.fence);
            match got {
                Ok(0) => return Err(RxEnd::EofMidFrame),
                Ok(k) => {
                    rx.placed += k;
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Err(RxEnd::Block),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(RxEnd::Io(e)),
            }
        } else if let Need::End(e) = rx.need(c, 1) {
            return Err(e);
        }
    }
    rx.phase = Phase::Trailer;
    Ok(())
}

/// The memory a segment was being placed into was deregistered by its
/// owner in the middle (caller-owned memory, `MrInner::enter`): the rest
/// of the segment cannot be placed. For a tagged Write the peer sees what
/// it would have seen a moment later, an invalid STag; for a receive
/// buffer or a Read's sink the fault is local.
pub(super) fn deregistered(rx: &Rx) -> RxEnd {
    let raw = rx.hdr_bytes[..rx.hdr.map_or(0, |h| h.len())].to_vec();
    let code = match (&rx.hdr, &rx.action) {
        (Some(DdpHeader::Tagged(_)), Action::Write) => codes::DDP_TAGGED_INVALID_STAG,
        _ => codes::DDP_LOCAL_CATASTROPHIC,
    };
    RxEnd::Fatal(code, Some(raw), WcStatus::LocProtErr)
}

/// Runs the receiver until the socket is drained, the budget is spent, or
/// the connection ends.
pub(super) fn rx_loop(q: &QpInner, rx: &mut Rx, c: &Conn, mut budget: usize) -> RxEnd {
    // Busy-poll mode: once a segment was handled and nothing is left in
    // the stage, return to the polling application (it is waiting for what
    // was just placed) instead of asking the socket once more: that recv
    // would almost always say EAGAIN, a system call and the socket lock on
    // the latency path. The application polls again anyway.
    let polled = c.polled.load(Ordering::Relaxed);
    let start_budget = budget;
    loop {
        match rx.phase {
            Phase::Header => {
                if budget == 0 {
                    return RxEnd::Budget;
                }
                if polled && budget < start_budget && rx.avail() == 0 {
                    return RxEnd::Block;
                }
                budget -= 1;
                rx.bytes_in_frame = false;
                if let Err(e) = on_header(q, rx, c) {
                    return e;
                }
            }
            Phase::Payload => {
                if let Err(e) = on_payload(q.qpn, rx, c) {
                    return e;
                }
            }
            Phase::Trailer => {
                let tl = mpa::pad_len(rx.ulpdu_len) + 4;
                if let Need::End(e) = rx.need(c, tl) {
                    return e;
                }
                let s = rx.start;
                let pad = tl - 4;
                if c.params.crc {
                    let want = mpa::crc_update(rx.crc, &rx.stage[s..s + pad]);
                    let got = u32::from_le_bytes(rx.stage[s + pad..s + tl].try_into().unwrap());
                    if want != got {
                        let raw = rx.hdr_bytes[..rx.hdr.map_or(0, |h| h.len())].to_vec();
                        return fatal(codes::MPA_CRC, &raw, WcStatus::WrFlushErr);
                    }
                }
                rx.start += tl;
                rx.phase = Phase::Header;
                if let Some(end) = on_segment_done(q, rx, c) {
                    return end;
                }
                // Paused for a streamed Read Response: the rest waits.
                if c.rx_paused.load(Ordering::Acquire) {
                    return RxEnd::Block;
                }
            }
        }
    }
}

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
        let (_sq, mut tx) = c.lock_tx(q);
        tx.rtr_wait = false;
        tx.hold_until = None;
    }
    let end = segment_done(q, rx, c);
    if first && end.is_none() {
        let (mut sq, mut tx) = c.lock_tx(q);
        if let Some(e) = tx_or_fail(q, &mut sq, &mut tx, c) {
            return Some(e);
        }
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
            let (mut sq, mut tx) = c.lock_tx(q);
            tx.rtr_wait = false;
            tx_or_fail(q, &mut sq, &mut tx, c)
        }
        Action::ReadResp => {
            rx.read_resp_off += n;
            if !last {
                return None;
            }
            rx.read_resp_off = 0;
            let (mut sq, mut tx) = c.lock_tx(q);
            if let Some(seq) = sq.orq.pop_front() {
                if let Some(w) = sq.get_mut(seq) {
                    w.stage = Stage::Done(WcStatus::Success);
                }
            }
            q.complete_in_order(&mut sq);
            tx_or_fail(q, &mut sq, &mut tx, c)
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
            let mut invalidated = None;
            let mut reference = None;
            if opcode.invalidates() {
                match q.core.stags.lookup(inval) {
                    // A one-shot binding this QP advertised: invalidate it,
                    // free it, report its reference (docs/one-shot.md).
                    Some(mr) if mr.pd == q.pd && q.one_shot.lock().contains_key(&inval) => {
                        let (r, index) = q.one_shot.lock().remove(&inval).expect("present");
                        q.core.stags.set_valid(&mr, false);
                        q.core.stags.release(index);
                        invalidated = Some(inval);
                        reference = Some(r);
                    }
                    // A close must name one of ours: a protocol violation.
                    Some(mr)
                        if opcode != Opcode::SendClose && mr.pd == q.pd && mr.invalidatable =>
                    {
                        q.core.stags.set_valid(&mr, false);
                        invalidated = Some(inval);
                    }
                    found => {
                        // Give the buffer back as flushed; the QP fails.
                        q.recv_cq.push(WorkCompletion {
                            wr_id: cur.wqe.wr_id,
                            status: WcStatus::RemInvReqErr,
                            opcode: WcOpcode::Recv,
                            qp_num: q.qpn,
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
            q.recv_cq.push(WorkCompletion {
                wr_id: cur.wqe.wr_id,
                status: WcStatus::Success,
                opcode: WcOpcode::Recv,
                byte_len: cur.received as u32,
                qp_num: q.qpn,
                invalidated_rkey: invalidated,
                solicited: opcode.solicited(),
                imm_data: None,
                reference,
                advertised_stag: (opcode == Opcode::SendAdvertise).then_some(inval),
            });
            None
        }
        Action::Imm(wqe, imm, solicited) => {
            rx.send_msn = rx.send_msn.wrapping_add(1);
            q.recv_cq.push(WorkCompletion {
                wr_id: wqe.wr_id,
                status: WcStatus::Success,
                opcode: WcOpcode::RecvWithImm,
                byte_len: 0,
                qp_num: q.qpn,
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
            let (mut sq, mut tx) = c.lock_tx(q);
            tx.queue_atomic_response(ar.req_id, orig);
            tx_or_fail(q, &mut sq, &mut tx, c)
        }
        Action::AtomicResp(resp) => {
            rx.atomic_resp_msn = rx.atomic_resp_msn.wrapping_add(1);
            let (mut sq, mut tx) = c.lock_tx(q);
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
            tx_or_fail(q, &mut sq, &mut tx, c)
        }
        Action::ReadReq(rr, src) => {
            rx.rr_msn = rx.rr_msn.wrapping_add(1);
            // A backed source larger than what the connection may still
            // hold in memory: streamed a chunk at a time, the receiver
            // paused meanwhile (issue 20, item 5: the whole length, up to
            // 4 GiB, was allocated at once, IRD times over).
            if let Some(mr) = src.as_ref().filter(|m| m.backend.is_some() && rr.size > 0) {
                let size = rr.size as u64;
                let (sq, mut tx) = c.lock_tx(q);
                if size > BACKED_CHUNK || tx.backed_bytes + size > BACKED_BUDGET {
                    tx.queue_streamed_read_response(&rr, mr.clone());
                    drop((sq, tx));
                    c.set_rx_paused(true, q.qpn);
                    arm_stall_timer(q, c);
                    let (mut sq, mut tx) = c.lock_tx(q);
                    return tx_or_fail(q, &mut sq, &mut tx, c);
                }
                tx.backed_bytes += size;
            }
            let eager_backed = src
                .as_ref()
                .is_some_and(|m| m.backend.is_some() && rr.size > 0);
            // A backed source: flush (zero length) or read it now, before
            // the send queue is locked (this may wait for the device).
            let src = match src {
                Some(mr) if mr.backend.is_some() => match backed_read(&mr, &rr) {
                    Ok(m) => Some(m),
                    Err(e) => {
                        tracing::error!(qpn = q.qpn, stag = mr.stag, "backed read failed: {e}");
                        let raw = rx.hdr_bytes[..ddp::UNTAGGED_LEN + ReadRequest::LEN].to_vec();
                        return Some(fatal(
                            codes::RDMAP_CATASTROPHIC_STREAM,
                            &raw,
                            WcStatus::WrFlushErr,
                        ));
                    }
                },
                other => other,
            };
            let (mut sq, mut tx) = c.lock_tx(q);
            match src {
                Some(mr) if eager_backed => {
                    // Read eagerly from a backed region (`mr` holds the
                    // bytes): counted against the budget until sent.
                    tx.queue_eager_backed_read_response(&rr, mr);
                }
                Some(mr) => tx.queue_read_response(&rr, mr),
                None => tx.queue_empty_read_response(&rr),
            }
            tx_or_fail(q, &mut sq, &mut tx, c)
        }
        Action::Terminate(t) => {
            let code = t.map_or(codes::RDMAP_OPERATION_UNSPECIFIED, |t| t.code);
            Some(RxEnd::PeerTerminated(code))
        }
    }
}

pub(super) fn tx_or_fail(q: &QpInner, sq: &mut Sq, tx: &mut Tx, c: &Conn) -> Option<RxEnd> {
    match tx_progress(q, sq, tx, c) {
        Ok(()) => tx
            .pending_fail
            .take()
            .map(|r| RxEnd::Io(io::Error::other(r))),
        Err(e) => Some(RxEnd::Io(e)),
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
