//! The receive path (siw: `siw_qp_rx.c`) as a state machine without I/O:
//! [`process`] parses FPDU headers out of a small staging buffer, checks
//! every access against the STag table before a byte is placed, places
//! staged payload, checks CRCs and completes messages, and stops with what
//! it needs next ([`Stop`]): more bytes in the stage, a large payload's
//! next bytes read straight into target memory (direct data placement:
//! [`Rx::direct_target`]), the transmitter run (a response was queued), or
//! the end. It never reads or writes the connection; the driver
//! (`driver.rs`, `rx_loop`) does, and any thread may drive it. A protocol
//! error ends with the Terminate of RFC 5040/5041/5044.

use super::rdmap::{self, Seg};
use super::*;

/// Decodes an FPDU header and decides where its payload goes.
pub(super) fn on_header(q: &QpInner, rx: &mut Rx, c: &Conn) -> Result<(), Stop> {
    rx.need(3)?;
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
        return Err(
            RxEnd::Fatal(codes::RDMAP_CATASTROPHIC_STREAM, None, WcStatus::WrFlushErr).into(),
        );
    }
    rx.need(2 + hl)?;
    let s = rx.start;
    let raw = &rx.stage[s + 2..s + 2 + hl];
    let ext = softrdma_wire::Ext {
        rfc7306: c.params.rfc7306,
        one_shot: c.params.one_shot,
        one_shot_se: c.params.one_shot_se,
    };
    let hdr = match DdpHeader::decode_ext(raw, ext) {
        Ok(h) => h,
        // term_code_in: a bad DDP version in a tagged segment gets the
        // tagged code (RFC 5041 section 7.2).
        Err(e) => return Err(fatal(e.term_code_in(raw), raw, WcStatus::WrFlushErr).into()),
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
                return Err(fatal(codes::DDP_UNTAGGED_TOO_LONG, raw, WcStatus::WrFlushErr).into());
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
        return Err(fatal(codes::RDMAP_CATASTROPHIC_STREAM, raw, WcStatus::WrFlushErr).into());
    }
    rx.need(2 + hl + extra)?;
    let s = rx.start;
    let head_len = 2 + hl + extra;
    if c.params.crc {
        rx.crc = mpa::crc_update(mpa::crc_start(), &rx.stage[s..s + head_len]);
    }
    let hb_len = (hl + extra).min(rx.hdr_bytes.len());
    rx.hdr_bytes[..hb_len].copy_from_slice(&rx.stage[s + 2..s + 2 + hb_len]);
    // The header a Terminate would quote, copied to the stack (the handlers
    // borrow `rx` mutably): nothing is allocated per FPDU, and the
    // Terminate's own copy is made only if one is sent (`fatal`, `refuse`).
    let raw_buf = rx.hdr_bytes;
    let raw = &raw_buf[..hl.min(hb_len)];
    let payload_len = ulpdu_len - hl - extra;
    rx.target.clear();
    rx._target_keep = None;
    rx.fence.clear();
    // A Write message into a backed region is passed on whole (or in long
    // runs); anything else arriving in the middle of one sees it placed.
    if rx.backed_run.is_some() && !matches!(hdr, DdpHeader::Tagged(t) if t.opcode == Opcode::Write)
    {
        flush_backed(rx, usize::MAX).map_err(|e| backed_failed(q, raw, e))?;
    }
    let g = Seg {
        hdr,
        start: s,
        hl,
        extra,
        payload_len,
        raw,
    };
    let action = match hdr {
        DdpHeader::Tagged(t) if t.opcode == Opcode::Write => rdmap::on_write(q, rx, t, &g)?,
        DdpHeader::Tagged(t) => rdmap::on_read_response(q, rx, t, &g)?,
        DdpHeader::Untagged(u) => match u.opcode {
            Opcode::Send
            | Opcode::SendSe
            | Opcode::SendInvalidate
            | Opcode::SendSeInvalidate
            | Opcode::SendAdvertise
            | Opcode::SendClose
            | Opcode::SendCloseSe => rdmap::on_send(q, rx, u, &g)?,
            Opcode::ReadRequest => rdmap::on_read_request(q, rx, c, u, &g)?,
            Opcode::ImmediateData | Opcode::ImmediateDataSe => rdmap::on_immediate(q, rx, u, &g)?,
            Opcode::AtomicRequest => rdmap::on_atomic_request(q, rx, c, u, &g)?,
            Opcode::AtomicResponse => rdmap::on_atomic_response(q, rx, u, &g)?,
            Opcode::Terminate => rdmap::on_terminate(rx, c, &g)?,
            _ => {
                return Err(fatal(codes::RDMAP_UNEXPECTED_OPCODE, raw, WcStatus::WrFlushErr).into())
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

/// Places staged payload bytes; stops for the rest ([`Stop::Direct`]
/// when enough is still to come to read it straight into the target).
pub(super) fn on_payload(q: &QpInner, rx: &mut Rx, crc: bool) -> Result<(), Stop> {
    while rx.placed < rx.payload_len {
        let rem = rx.payload_len - rx.placed;
        if rx.avail() > 0 {
            let n = rx.avail().min(rem);
            let src = &rx.stage[rx.start..rx.start + n];
            if crc {
                rx.crc = mpa::crc_update(rx.crc, src);
            }
            if !mr::enter_all(&rx.fence) {
                return Err(deregistered(rx).into());
            }
            crate::test_hooks::placement_point(q);
            // SAFETY: target spans come from a registration held in
            // rx._target_keep or the current receive WQE, and were
            // bounds-checked in on_header; caller-owned memory among them
            // is entered (rx.fence), so it is not deregistered meanwhile.
            unsafe { mr::copy_into_spans(&rx.target, rx.placed, src) };
            mr::exit_all(&rx.fence);
            rx.placed += n;
            rx.start += n;
            assert!(rx.placed <= rx.payload_len, "placed past the segment");
            continue;
        }
        if rem >= DIRECT_MIN {
            return Err(Stop::Direct);
        }
        rx.need(1)?;
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

/// Runs the receiver over what is staged until it needs something
/// ([`Stop`]). `budget`: headers it may still start (a header started and
/// completed counts once, however many calls it took to stage); `polled`:
/// busy-poll mode, where it returns to the polling application once a
/// segment was handled and nothing is staged (the application polls again
/// anyway, and a read here would almost always find nothing: a system
/// call and the socket lock on the latency path).
pub(super) fn process(
    q: &QpInner,
    rx: &mut Rx,
    c: &Conn,
    budget: &mut usize,
    handled_any: &mut bool,
    polled: bool,
) -> Stop {
    loop {
        match rx.phase {
            Phase::Header => {
                // Paused for a streamed Read Response: the rest waits.
                if c.rx_paused.load(Ordering::Acquire) {
                    return RxEnd::Block.into();
                }
                if *budget == 0 {
                    return RxEnd::Budget.into();
                }
                if polled && *handled_any && rx.avail() == 0 {
                    return RxEnd::Block.into();
                }
                rx.bytes_in_frame = false;
                if let Err(e) = on_header(q, rx, c) {
                    return e;
                }
                *budget -= 1;
                *handled_any = true;
            }
            Phase::Payload => {
                if let Err(e) = on_payload(q, rx, c.params.crc) {
                    return e;
                }
            }
            Phase::Trailer => {
                let tl = mpa::pad_len(rx.ulpdu_len) + 4;
                if let Err(e) = rx.need(tl) {
                    return e;
                }
                let s = rx.start;
                let pad = tl - 4;
                if c.params.crc {
                    let want = mpa::crc_update(rx.crc, &rx.stage[s..s + pad]);
                    let got = u32::from_le_bytes(rx.stage[s + pad..s + tl].try_into().unwrap());
                    if want != got {
                        let raw = rx.hdr_bytes[..rx.hdr.map_or(0, |h| h.len())].to_vec();
                        return fatal(codes::MPA_CRC, &raw, WcStatus::WrFlushErr).into();
                    }
                }
                rx.start += tl;
                rx.phase = Phase::Header;
                if let Some(end) = on_segment_done(q, rx, c) {
                    return end.into();
                }
                // Responses to requests that arrived together leave
                // together: the transmitter runs once the staged input is
                // used up (here, or by the driver before it reads more
                // or returns), so a batch of Read Requests read in one
                // system call is answered with one.
                if rx.avail() == 0 && std::mem::take(&mut rx.kick) {
                    return Stop::Kick;
                }
            }
        }
    }
}
