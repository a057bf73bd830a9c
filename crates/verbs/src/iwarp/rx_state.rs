//! The receiver's state (siw keeps it in `struct siw_rx_stream`): the
//! staging buffer, the FPDU in progress, the receive being filled, what it
//! hands the transmitter (`ToTx`), and how a receive step ends (`Stop`,
//! `RxEnd`), with the helpers that the receive path (`rx.rs`) and the
//! RDMAP handlers (`rdmap.rs`) share. Apart from `rx.rs` so that the
//! handlers need not import the parser that calls them (the module-graph
//! test sees `iwarp/`'s files).

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

/// What the receiver hands the transmitter. The receiver never locks the
/// transmitter: it queues responses here, and the driver passes them on
/// (under the send-queue and transmitter locks) when the receiver stops
/// with [`Stop::Kick`], before it runs the transmitter.
#[derive(Default)]
pub(super) struct ToTx {
    /// The peer's first FPDU (or its RTR) arrived: transmission may start
    /// (ends `Tx::rtr_wait` and `Tx::hold_until`).
    pub(super) release: bool,
    /// The zero-length Read Response to our Read RTR arrived (ends
    /// `Tx::rtr_read_pending`: its ORQ slot is free).
    pub(super) rtr_answered: bool,
    /// Responses to send, in the order the requests arrived.
    pub(super) replies: Vec<Reply>,
}

/// A response to an inbound request, counted in `Conn::inbound` from the
/// moment it is queued until the transmitter composes it.
pub(super) enum Reply {
    /// A Read Response from `src` (checked); none: zero-length. `eager`:
    /// `src` holds bytes read from a storage-backed region, counted in
    /// `Conn::backed_bytes` until sent.
    Read {
        rr: ReadRequest,
        src: Option<Arc<MrInner>>,
        eager: bool,
    },
    /// A Read Response streamed from the storage-backed region a chunk at
    /// a time (the receiver is paused until it is composed).
    Streamed { rr: ReadRequest, mr: Arc<MrInner> },
    /// An Atomic Response carrying the original value.
    Atomic { req_id: u32, orig: u64 },
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
    /// Something was queued for the transmitter (see [`Stop::Kick`]).
    pub(super) kick: bool,
    /// What the transmitter is to take over at the next [`Stop::Kick`].
    pub(super) to_tx: ToTx,
    /// Initiator in peer-to-peer mode: our Read RTR awaits its
    /// zero-length Read Response.
    pub rtr_read_pending: bool,
    /// Since when the Send at the head of the stream has waited for a
    /// receive (see [`RxEnd::NoRecv`]).
    pub(super) no_recv_since: Option<std::time::Instant>,
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
    /// A Send found no posted receive: it stays unread until one is
    /// posted or until this deadline (`DeviceConfig::recv_wait`).
    NoRecv(std::time::Instant),
}

/// Why [`process`] stopped.
pub(super) enum Stop {
    /// It needs input: at least this many bytes staged
    /// ([`Rx::stage_room`], then [`Rx::staged`]).
    Stage(usize),
    /// It needs the next bytes of a payload placed straight into target
    /// memory ([`Rx::direct_target`], then [`Rx::direct_done`]).
    Direct,
    /// A response or a completion was queued that may let the
    /// transmitter move: run it, then call again. (When more input is
    /// staged, the receiver handles that first and leaves [`Rx::kick`] set;
    /// the driver then runs the transmitter before it acts on whatever
    /// else `process` stopped for.)
    Kick,
    /// The receiver is done for now, or for good.
    End(RxEnd),
}

impl From<RxEnd> for Stop {
    fn from(e: RxEnd) -> Stop {
        Stop::End(e)
    }
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
            kick: false,
            to_tx: ToTx::default(),
            rtr_read_pending: false,
            no_recv_since: None,
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

    /// Queues a response for the transmitter (see [`ToTx`]). It counts
    /// against our IRD (`Conn::inbound`) until it is composed.
    pub(super) fn reply(&mut self, c: &Conn, r: Reply) {
        let prev = c.inbound.fetch_add(1, Ordering::AcqRel);
        // Every request was checked against the IRD before it was
        // accepted (the RTR, unchecked, is the first message of all).
        assert!(
            prev < c.params.ird.max(1) as usize,
            "more inbound requests than our IRD"
        );
        self.to_tx.replies.push(r);
        self.kick = true;
    }

    pub(super) fn avail(&self) -> usize {
        self.end - self.start
    }

    /// `n` bytes staged, or [`Stop::Stage`].
    pub(super) fn need(&self, n: usize) -> Result<(), Stop> {
        if self.avail() >= n {
            Ok(())
        } else {
            Err(Stop::Stage(n))
        }
    }

    /// Where the next input goes for [`Stop::Stage`]`(n)`: free stage
    /// space after the staged bytes, at least `n` minus what is staged,
    /// and up to [`LOOKAHEAD`] (so many small FPDUs come in one read, and a
    /// large payload mostly goes straight to its target instead).
    pub(super) fn stage_room(&mut self, n: usize) -> &mut [u8] {
        debug_assert!(n <= STAGE_SIZE, "a stage request fits the stage");
        if self.stage.is_empty() {
            self.stage = vec![0; STAGE_SIZE];
        }
        if self.stage.len() - self.start < n || self.end == self.stage.len() {
            self.stage.copy_within(self.start..self.end, 0);
            self.end -= self.start;
            self.start = 0;
        }
        let want = n.saturating_sub(self.avail()).max(LOOKAHEAD);
        let lim = (self.end + want).min(self.stage.len());
        &mut self.stage[self.end..lim]
    }

    /// `k` bytes arrived in the room [`Rx::stage_room`] gave.
    pub(super) fn staged(&mut self, k: usize) {
        assert!(self.end + k <= self.stage.len(), "staged within the stage");
        self.end += k;
    }

    /// The end of the stream, for [`Stop::Stage`]: between FPDUs a
    /// disconnect, inside one a broken stream.
    pub(super) fn eof(&self) -> RxEnd {
        if self.avail() == 0 && self.phase == Phase::Header {
            RxEnd::Eof
        } else {
            RxEnd::EofMidFrame
        }
    }

    /// For [`Stop::Direct`]: the target spans of the payload's remaining
    /// bytes into `out`, with the caller-owned regions behind them entered
    /// (so none is deregistered while the bytes land). False: one was
    /// deregistered; the segment cannot be placed ([`deregistered`]).
    /// Every true is followed by [`Rx::direct_done`].
    pub(super) fn direct_target(&self, out: &mut Vec<RawSpan>) -> bool {
        let rem = self.payload_len - self.placed;
        sub_spans(&self.target, self.placed, rem, out);
        mr::enter_all(&self.fence)
    }

    /// `k` bytes landed in the spans [`Rx::direct_target`] gave (their
    /// first `k`); `crc`: the connection checks CRCs.
    pub(super) fn direct_done(&mut self, k: usize, crc: bool, scratch: &mut Vec<RawSpan>) {
        assert!(
            k <= self.payload_len - self.placed,
            "placed within the payload"
        );
        if k > 0 && crc {
            sub_spans(&self.target, self.placed, k, scratch);
            // SAFETY: the spans are the target's, checked when the header
            // was handled and held by its registration (`_target_keep` or
            // the receive WQE); caller-owned memory among them is still
            // entered (`direct_target`).
            self.crc = unsafe { mr::crc_spans(self.crc, scratch) };
        }
        mr::exit_all(&self.fence);
        self.placed += k;
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
