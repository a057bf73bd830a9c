//! The send path (siw: `siw_qp_tx.c`): work requests become FPDUs composed
//! into a batch of iovecs (small headers and trailers in one buffer,
//! payload straight from the registered memory) written with one `sendmsg`
//! per batch. No I/O here: [`fill_batch`] composes a batch, the driver
//! (`driver::tx_progress`) writes it and reports with [`batch_written`].
//! The caller that posts transmits inline; if the socket is full, the QP's
//! progress thread continues on EPOLLOUT.

use super::*;

/// What to do once a message's bytes are all written.
#[derive(Debug, Clone, Copy)]
pub(super) enum Fin {
    /// A Send or Write WR is complete.
    SqDone(u64),
    None,
    /// The Terminate is out: stop transmitting.
    Terminated,
}

/// One message being turned into FPDUs.
pub(super) struct TxMsg {
    pub(super) hdr: DdpHeader,
    pub(super) base_to: u64,
    pub(super) extra: [u8; 96],
    pub(super) extra_len: usize,
    pub(super) spans: Vec<RawSpan>,
    pub(super) total: u64,
    pub(super) off: u64,
    pub(super) span_idx: usize,
    pub(super) span_off: usize,
    pub(super) started: bool,
    pub(super) fin: Fin,
    /// Keeps the source memory of a Read Response alive.
    pub(super) _keep: Option<Arc<MrInner>>,
    /// The caller-owned regions the message's bytes come from
    /// (`MrInner::fenced`): entered while they are read.
    pub(super) fence: Vec<Arc<MrInner>>,
    /// A Read Response streamed from a storage-backed region, a chunk at a
    /// time (`_keep` holds the chunk being sent).
    pub(super) backed: Option<BackedSrc>,
}

/// Where a streamed Read Response's bytes come from.
pub(super) struct BackedSrc {
    /// The storage-backed region.
    pub(super) mr: Arc<MrInner>,
    /// The region address of the message's byte 0.
    pub(super) src_to: u64,
    /// The message offset where the chunk in `_keep` ends.
    pub(super) chunk_end: u64,
    /// Bytes counted against the connection's budget (`Conn::backed_bytes`).
    pub(super) counted: u64,
    /// The receiver was paused for this response: resume it when done.
    pub(super) paused_rx: bool,
}

/// Bytes of a storage-backed Read read from the device at a time.
pub(crate) const BACKED_CHUNK: u64 = 1 << 20;
/// Bytes of storage-backed Read Responses a connection holds in memory at
/// most (eagerly read small ones, plus one chunk of a streamed one).
pub(crate) const BACKED_BUDGET: u64 = 16 << 20;

impl TxMsg {
    pub(super) fn new(hdr: DdpHeader, spans: Vec<RawSpan>, total: u64, fin: Fin) -> TxMsg {
        let base_to = match hdr {
            DdpHeader::Tagged(t) => t.to,
            DdpHeader::Untagged(_) => 0,
        };
        TxMsg {
            hdr,
            base_to,
            extra: [0; 96],
            extra_len: 0,
            spans,
            total,
            off: 0,
            span_idx: 0,
            span_off: 0,
            started: false,
            fin,
            _keep: None,
            fence: Vec::new(),
            backed: None,
        }
    }
}

/// The transmitter of one QP (lives inside the send-queue lock).
pub(crate) struct Tx {
    pub(super) batch: Batch,
    pub(super) cur: Option<TxMsg>,
    /// Read Responses to send, in request order.
    pub(super) irq: VecDeque<TxMsg>,
    pub(super) term: Option<TxMsg>,
    pub(super) rtr: Option<TxMsg>,
    /// Responder in peer-to-peer mode: wait for the initiator's RTR.
    pub rtr_wait: bool,
    /// Responder (RFC 5044 section 7.1.2 rule 4): nothing is sent before
    /// the first FPDU from the initiator arrives, or until this instant
    /// (a grace period, so that applications whose responder speaks first
    /// without peer-to-peer mode do not deadlock).
    pub hold_until: Option<std::time::Instant>,
    /// Initiator: our Read RTR awaits its zero-length Read Response (it
    /// counts against the peer's IRD like any Read).
    pub rtr_read_pending: bool,
    /// When the transmitter last moved bytes (the stall check of a paused
    /// receiver: a peer that does not read is refused).
    pub last_progress: std::time::Instant,
    pub(super) terminated: bool,
    pub(super) send_msn: u32,
    /// Queue 1: Read Requests and Atomic Requests.
    pub(super) rr_msn: u32,
    pub(super) term_msn: u32,
    /// Queue 3: Atomic Responses.
    pub(super) atomic_resp_msn: u32,
    /// A local failure found while transmitting (fail the QP after unlock).
    pub pending_fail: Option<String>,
    /// A streamed Read Response that paused the receiver is composed: the
    /// driver resumes the receiver.
    pub(super) resume_rx: bool,
    /// RDMAP messages (Terminate aside) composed for the stream so far: a
    /// same-host copy may run only once the peer processed them all.
    pub(super) msgs_sent: u64,
    /// The segment size FPDUs are cut to, as last read from the socket
    /// (0: not yet; see [`Conn::current_seg`]), and when.
    pub(super) seg: usize,
    pub(super) seg_at: Option<std::time::Instant>,
}

impl Tx {
    pub fn new() -> Tx {
        Tx {
            batch: Batch::new(),
            cur: None,
            irq: VecDeque::new(),
            term: None,
            rtr: None,
            rtr_wait: false,
            hold_until: None,
            rtr_read_pending: false,
            last_progress: std::time::Instant::now(),
            terminated: false,
            send_msn: 1,
            rr_msn: 1,
            term_msn: 1,
            atomic_resp_msn: 1,
            pending_fail: None,
            resume_rx: false,
            msgs_sent: 0,
            seg: 0,
            seg_at: None,
        }
    }

    pub fn clear(&mut self) {
        self.batch.clear();
        self.batch.fins.clear();
        self.cur = None;
        self.irq.clear();
        self.rtr = None;
    }

    /// Queues a Terminate; it goes out before anything else not yet started.
    pub fn queue_terminate(&mut self, code: TermCode, hdr: Option<&[u8]>) {
        if self.terminated || self.term.is_some() {
            return;
        }
        let mut t = Terminate::new(code);
        if let Some(h) = hdr {
            let n = DdpHeader::len_from_ctrl(h[0]).min(h.len());
            t.ddp_header = Some(h[..n].to_vec());
            t.ddp_seg_len = None;
            if h.len() >= n + ReadRequest::LEN
                && h.len() > 1
                && h[1] & 0x0F == Opcode::ReadRequest as u8
            {
                t.rdmap_header = Some(h[n..n + ReadRequest::LEN].to_vec());
            }
        }
        let mut body = Vec::with_capacity(64);
        t.encode(&mut body);
        let hdr = DdpHeader::Untagged(UntaggedHeader {
            last: true,
            opcode: Opcode::Terminate,
            inval_stag: 0,
            qn: ddp::QN_TERMINATE,
            msn: self.term_msn,
            mo: 0,
        });
        self.term_msn += 1;
        let mut m = TxMsg::new(hdr, Vec::new(), 0, Fin::Terminated);
        m.extra[..body.len()].copy_from_slice(&body);
        m.extra_len = body.len();
        // A Terminate must not cut into a message already on the wire; if
        // one is half-sent it is finished first (the batch drains).
        self.term = Some(m);
    }

    /// Queues the peer-to-peer RTR frame (a zero-length RDMA Write, or a
    /// zero-length Read Request).
    pub fn queue_rtr(&mut self, read: bool) {
        let m = if read {
            let hdr = DdpHeader::Untagged(UntaggedHeader {
                last: true,
                opcode: Opcode::ReadRequest,
                inval_stag: 0,
                qn: ddp::QN_READ_REQUEST,
                msn: self.rr_msn,
                mo: 0,
            });
            self.rr_msn += 1;
            self.rtr_read_pending = true;
            let mut m = TxMsg::new(hdr, Vec::new(), 0, Fin::None);
            // STag 1, not 0, as siw (some hardware treats STag 0 as the
            // privileged local STag).
            ReadRequest {
                sink_stag: RTR_STAG,
                sink_to: 0,
                size: 0,
                src_stag: RTR_STAG,
                src_to: 0,
            }
            .encode(&mut m.extra);
            m.extra_len = ReadRequest::LEN;
            m
        } else {
            let hdr = DdpHeader::Tagged(TaggedHeader {
                last: true,
                opcode: Opcode::Write,
                stag: RTR_STAG,
                to: 0,
            });
            TxMsg::new(hdr, Vec::new(), 0, Fin::None)
        };
        self.rtr = Some(m);
    }

    /// Takes over what the receiver queued (see [`ToTx`]), in its order.
    pub(super) fn take_from_rx(&mut self, to: &mut ToTx) {
        if std::mem::take(&mut to.release) {
            self.rtr_wait = false;
            self.hold_until = None;
        }
        if std::mem::take(&mut to.rtr_answered) {
            self.rtr_read_pending = false;
        }
        for r in to.replies.drain(..) {
            match r {
                Reply::Read {
                    rr,
                    src: Some(mr),
                    eager: true,
                } => self.queue_eager_backed_read_response(&rr, mr),
                Reply::Read {
                    rr, src: Some(mr), ..
                } => self.queue_read_response(&rr, mr),
                Reply::Read { rr, src: None, .. } => self.queue_empty_read_response(&rr),
                Reply::Streamed { rr, mr } => self.queue_streamed_read_response(&rr, mr),
                Reply::Atomic { req_id, orig } => self.queue_atomic_response(req_id, orig),
            }
        }
    }

    /// Queues an Atomic Response (RFC 7306) behind earlier responses.
    pub fn queue_atomic_response(&mut self, req_id: u32, orig: u64) {
        let hdr = DdpHeader::Untagged(UntaggedHeader {
            last: true,
            opcode: Opcode::AtomicResponse,
            inval_stag: 0,
            qn: ddp::QN_ATOMIC_RESPONSE,
            msn: self.atomic_resp_msn,
            mo: 0,
        });
        self.atomic_resp_msn += 1;
        let mut m = TxMsg::new(hdr, Vec::new(), 0, Fin::None);
        m.extra_len = AtomicResponse { req_id, orig }.encode(&mut m.extra);
        self.irq.push_back(m);
    }

    /// An Immediate Data message (RFC 7306) carrying `imm` in the first
    /// four of its eight bytes (big-endian, as ibverbs' imm_data is).
    pub(super) fn immediate(&mut self, imm: u32, solicited: bool, fin: Fin) -> TxMsg {
        let hdr = DdpHeader::Untagged(UntaggedHeader {
            last: true,
            opcode: if solicited {
                Opcode::ImmediateDataSe
            } else {
                Opcode::ImmediateData
            },
            inval_stag: 0,
            qn: ddp::QN_SEND,
            msn: self.send_msn,
            mo: 0,
        });
        self.send_msn += 1;
        let mut m = TxMsg::new(hdr, Vec::new(), 0, fin);
        m.extra[..4].copy_from_slice(&imm.to_be_bytes());
        m.extra_len = ddp::IMMEDIATE_LEN;
        m
    }

    /// Queues a Read Response (source memory already checked).
    pub fn queue_read_response(&mut self, rr: &ReadRequest, src: Arc<MrInner>) {
        let mut spans = Vec::new();
        if rr.size > 0 {
            src.resolve(rr.src_to, rr.size as u64, &mut spans);
        }
        let hdr = DdpHeader::Tagged(TaggedHeader {
            last: true,
            opcode: Opcode::ReadResponse,
            stag: rr.sink_stag,
            to: rr.sink_to,
        });
        let mut m = TxMsg::new(hdr, spans, rr.size as u64, Fin::None);
        if src.fenced {
            m.fence.push(src.clone());
        }
        m._keep = Some(src);
        self.irq.push_back(m);
    }

    /// Queues the Read Response of a Read of a storage-backed region read
    /// eagerly into the holder `mr`: its bytes count against the
    /// connection's budget until they are sent.
    pub fn queue_eager_backed_read_response(&mut self, rr: &ReadRequest, mr: Arc<MrInner>) {
        self.queue_read_response(rr, mr);
        if let Some(m) = self.irq.back_mut() {
            m.backed = Some(BackedSrc {
                mr: Arc::clone(m._keep.as_ref().expect("holder")),
                src_to: rr.src_to,
                chunk_end: rr.size as u64,
                counted: rr.size as u64,
                paused_rx: false,
            });
        }
    }

    /// Queues the zero-length Read Response of a zero-length Read.
    pub fn queue_empty_read_response(&mut self, rr: &ReadRequest) {
        let hdr = DdpHeader::Tagged(TaggedHeader {
            last: true,
            opcode: Opcode::ReadResponse,
            stag: rr.sink_stag,
            to: rr.sink_to,
        });
        self.irq
            .push_back(TxMsg::new(hdr, Vec::new(), 0, Fin::None));
    }

    /// Queues a Read Response streamed from the storage-backed region `mr`
    /// a chunk at a time (the receiver is paused until it is composed).
    pub fn queue_streamed_read_response(&mut self, rr: &ReadRequest, mr: Arc<MrInner>) {
        let hdr = DdpHeader::Tagged(TaggedHeader {
            last: true,
            opcode: Opcode::ReadResponse,
            stag: rr.sink_stag,
            to: rr.sink_to,
        });
        let mut m = TxMsg::new(hdr, Vec::new(), rr.size as u64, Fin::None);
        m.backed = Some(BackedSrc {
            mr,
            src_to: rr.src_to,
            chunk_end: 0,
            counted: 0,
            paused_rx: true,
        });
        self.irq.push_back(m);
    }
}

impl TxMsg {
    /// A streamed message whose chunk is used up (and more is to come).
    pub(super) fn needs_chunk(&self) -> bool {
        self.backed
            .as_ref()
            .is_some_and(|b| self.off >= b.chunk_end && self.off < self.total)
    }

    /// Reads the next chunk of a streamed Read Response from its device
    /// (the batch holds nothing of the previous one).
    pub(super) fn next_chunk(&mut self, budget: &AtomicU64) -> io::Result<()> {
        let b = self.backed.as_mut().expect("a streamed message");
        let n = BACKED_CHUNK.min(self.total - self.off);
        let mut buf = vec![0u8; n as usize].into_boxed_slice();
        let dev = b.mr.backend.as_ref().expect("backed region");
        dev.read_at(b.src_to + self.off - b.mr.iova, &mut buf)?;
        let holder = Arc::new(MrInner::holding(buf, b.src_to + self.off));
        release(budget, b.counted);
        budget.fetch_add(n, Ordering::AcqRel);
        b.counted = n;
        b.chunk_end = self.off + n;
        self.spans.clear();
        holder.resolve(b.src_to + self.off, n, &mut self.spans);
        self.span_idx = 0;
        self.span_off = 0;
        self._keep = Some(holder);
        Ok(())
    }
}

/// Takes `n` bytes off a budget counter (never below zero).
fn release(budget: &AtomicU64, n: u64) {
    let _ = budget.fetch_update(Ordering::AcqRel, Ordering::Acquire, |b| {
        Some(b.saturating_sub(n))
    });
}

/// The STag a ready-to-receive (RTR) message names: 1, as siw.
pub(crate) const RTR_STAG: u32 = 1;

/// The least payload worth an FPDU packed into a segment's tail.
const PACK_MIN: usize = 256;

/// Appends FPDUs of `m` to the batch until it is full or the message is
/// done. Returns true when the whole message is composed.
pub(super) fn compose(
    m: &mut TxMsg,
    b: &mut Batch,
    max_ulpdu: usize,
    seg: usize,
    crc_on: bool,
) -> bool {
    while !b.full() {
        let fpdu_start = b.total;
        let hl = m.hdr.len() + m.extra_len;
        // max_ulpdu >= 128 > the largest header (70).
        debug_assert!(max_ulpdu > hl);
        let rem = m.total - m.off;
        let room = max_ulpdu.saturating_sub(hl).max(1) as u64;
        // Packing: a message that needs more than one FPDU anyway starts
        // in the room its predecessor left in the current segment, so
        // every segment leaves full (a 64 KiB message at a 64 KiB MSS is
        // otherwise a full segment and a tiny one, each its own `MSG_EOR`
        // message). A message that fits one FPDU is not split for it.
        let used = b.total - b.chunk_start;
        let room = if rem > room && used > 0 && used < seg {
            let fit = mpa::max_ulpdu_for(seg - used).min(max_ulpdu);
            if fit >= hl + PACK_MIN {
                (fit - hl) as u64
            } else {
                room
            }
        } else {
            room
        };
        // A streamed message: no further than its chunk.
        let chunk_left = m
            .backed
            .as_ref()
            .map_or(rem, |b| b.chunk_end.saturating_sub(m.off));
        if chunk_left == 0 && rem > 0 {
            return false;
        }
        let n = room.min(rem).min(chunk_left) as usize;
        let last = n as u64 == rem;
        match &mut m.hdr {
            DdpHeader::Tagged(t) => {
                t.to = m.base_to + m.off;
                t.last = last;
            }
            DdpHeader::Untagged(u) => {
                u.mo = m.off as u32;
                u.last = last;
            }
        }
        let ulpdu_len = hl + n;
        let start = b.hdrs.len();
        b.hdrs.extend_from_slice(&(ulpdu_len as u16).to_be_bytes());
        let mut h = [0u8; ddp::UNTAGGED_LEN];
        let hn = m.hdr.encode(&mut h);
        b.hdrs.extend_from_slice(&h[..hn]);
        b.hdrs.extend_from_slice(&m.extra[..m.extra_len]);
        // Payload pieces for [off, off+n).
        let mut pieces: [RawSpan; 16] = [RawSpan {
            ptr: std::ptr::null_mut(),
            len: 0,
        }; 16];
        let mut np = 0;
        let mut left = n;
        while left > 0 && np < pieces.len() {
            let s = m.spans[m.span_idx];
            let avail = s.len - m.span_off;
            let k = avail.min(left);
            pieces[np] = RawSpan {
                // SAFETY: span_off < s.len, inside the registered span.
                ptr: unsafe { s.ptr.add(m.span_off) },
                len: k,
            };
            np += 1;
            left -= k;
            m.span_off += k;
            if m.span_off == s.len {
                m.span_idx += 1;
                m.span_off = 0;
            }
        }
        if left > 0 {
            // More than 16 pieces in one FPDU: shorten this FPDU (rewrite
            // the length and the last flag) and carry on in the next one.
            let n2 = n - left;
            let ulpdu2 = hl + n2;
            b.hdrs[start..start + 2].copy_from_slice(&(ulpdu2 as u16).to_be_bytes());
            if last {
                // The last flag was set for the full length: clear it.
                let ctrl = &mut b.hdrs[start + 2];
                *ctrl &= !ddp::DDP_LAST;
            }
            let done = finish_fpdu(m, b, start, &pieces[..np], n2, ulpdu2, crc_on, false);
            b.fpdu_done(fpdu_start, seg);
            return done;
        }
        let done = finish_fpdu(m, b, start, &pieces[..np], n, ulpdu_len, crc_on, last);
        b.fpdu_done(fpdu_start, seg);
        if done {
            return true;
        }
    }
    false
}

#[allow(clippy::too_many_arguments)]
pub(super) fn finish_fpdu(
    m: &mut TxMsg,
    b: &mut Batch,
    start: usize,
    pieces: &[RawSpan],
    n: usize,
    ulpdu_len: usize,
    crc_on: bool,
    last: bool,
) -> bool {
    let mut crc = crc_on.then(|| mpa::crc_update(mpa::crc_start(), &b.hdrs[start..]));
    if n <= COPY_MAX {
        let at = b.hdrs.len();
        b.hdrs.resize(at + n, 0);
        // SAFETY: the pieces lie in memory held by the WR / read response.
        unsafe { mr::copy_from_spans(pieces, 0, &mut b.hdrs[at..at + n]) };
        if let Some(c) = crc.as_mut() {
            *c = mpa::crc_update(*c, &b.hdrs[at..at + n]);
        }
        let (t, tl) = mpa::trailer(ulpdu_len, crc);
        b.hdrs.extend_from_slice(&t[..tl]);
        b.push_hdr(start);
    } else {
        b.push_hdr(start);
        if let Some(c) = crc.as_mut() {
            // SAFETY: as above.
            *c = unsafe { mr::crc_spans(*c, pieces) };
        }
        for p in pieces {
            b.push_mem(*p);
        }
        let ts = b.hdrs.len();
        let (t, tl) = mpa::trailer(ulpdu_len, crc);
        b.hdrs.extend_from_slice(&t[..tl]);
        b.push_hdr(ts);
    }
    // The next FPDU's MO / TO continues exactly where this one ended.
    m.off += n as u64;
    assert!(m.off <= m.total, "an FPDU past the end of its message");
    m.started = true;
    last
}

/// What [`fill_batch`] left for the driver.
pub(super) enum Filled {
    /// The batch holds bytes: write them, then [`batch_written`].
    Ready,
    /// Nothing may be sent now.
    Idle,
    /// A local failure (`Tx::pending_fail`): the QP fails.
    Failed,
}

/// The whole batch reached the socket: completes the work requests whose
/// last bytes were in it, in order, and ends transmission after a
/// Terminate.
pub(super) fn batch_written(q: &QpInner, sq: &mut Sq, tx: &mut Tx) {
    tx.batch.clear();
    tx.last_progress = std::time::Instant::now();
    let mut fins = std::mem::take(&mut tx.batch.fins);
    let mut done_any = false;
    for f in &fins {
        match *f {
            Fin::SqDone(seq) => {
                if let Some(w) = sq.get_mut(seq) {
                    if w.stage == Stage::Queued {
                        w.stage = Stage::Done(WcStatus::Success);
                        done_any = true;
                    }
                }
            }
            Fin::Terminated => {
                tx.terminated = true;
            }
            Fin::None => {}
        }
    }
    fins.clear();
    tx.batch.fins = fins;
    if done_any {
        q.complete_in_order(sq);
    }
}

/// Composes messages into the (empty) batch until it is full or nothing
/// more may be sent. No I/O: the driver writes what this leaves
/// ([`Filled::Ready`]).
pub(super) fn fill_batch(q: &QpInner, sq: &mut Sq, tx: &mut Tx, c: &Conn) -> Filled {
    debug_assert!(tx.batch.is_empty());
    // Never below 128 (a tiny MSS just means FPDUs span segments).
    let seg = c.current_seg(tx);
    let max_ulpdu = q
        .core
        .config
        .max_ulpdu
        .min(mpa::max_ulpdu_for(seg))
        .max(128);
    while !tx.batch.full() {
        if tx.cur.is_none() {
            match next_msg(q, sq, tx, c) {
                Some(m) => tx.cur = Some(m),
                None => break,
            }
        }
        let m = tx.cur.as_mut().expect("current message");
        if m.needs_chunk() {
            // The batch refers to the previous chunk: send it first.
            if !tx.batch.is_empty() {
                break;
            }
            if let Err(e) = m.next_chunk(&c.backed_bytes) {
                tracing::error!(qpn = q.qpn, "backed read failed: {e}");
                tx.pending_fail = Some(format!("storage read for a Read Response failed: {e}"));
                return Filled::Failed;
            }
        }
        if !m.fence.is_empty() {
            if !mr::enter_all(&m.fence) {
                tx.pending_fail =
                    Some("memory of a work request was deregistered before it was sent".into());
                return Filled::Failed;
            }
            for f in &m.fence {
                if !tx.batch.fence.iter().any(|b| Arc::ptr_eq(b, f)) {
                    tx.batch.fence.push(f.clone());
                }
            }
        }
        let done = compose(m, &mut tx.batch, max_ulpdu, seg, c.params.crc);
        mr::exit_all(&m.fence);
        if done {
            let mut m = tx.cur.take().expect("current message");
            // Composed to its end: exactly its length went out.
            assert_eq!(
                m.off, m.total,
                "a message composed past or short of its length"
            );
            if let Some(k) = m._keep.take() {
                tx.batch.keeps.push(k);
            }
            if let Some(b) = m.backed.take() {
                release(&c.backed_bytes, b.counted);
                // What came after a streamed response may be received now.
                tx.resume_rx |= b.paused_rx;
            }
            if matches!(
                m.hdr.opcode(),
                Opcode::ReadResponse | Opcode::AtomicResponse
            ) {
                let prev = c.inbound.fetch_sub(1, Ordering::AcqRel);
                assert!(prev > 0, "a response nobody asked for");
            }
            if m.hdr.opcode() != Opcode::Terminate {
                tx.msgs_sent += 1;
            }
            tx.batch.fins.push(m.fin);
            if matches!(m.fin, Fin::Terminated) {
                break;
            }
        }
    }
    if !tx.batch.is_empty() {
        return Filled::Ready;
    }
    // Local operations (invalidate, fast-register) finished while picking
    // messages.
    if matches!(sq.wqes.front(), Some(w) if matches!(w.stage, Stage::Done(_))) {
        q.complete_in_order(sq);
    }
    Filled::Idle
}

#[cfg(test)]
#[path = "tx_tests.rs"]
mod tests;
