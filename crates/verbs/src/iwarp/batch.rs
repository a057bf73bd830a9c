//! A batch of composed FPDUs as iovec references (headers and trailers in
//! one buffer, payload straight from registered memory), written with one
//! `sendmmsg` of up to 16 TCP segment runs (`MSG_EOR` at FPDU boundaries;
//! one `sendmsg` per run where the kernel is too old, see
//! [`sys::sendmmsg_safe`]).

use super::*;

#[derive(Clone, Copy)]
pub(super) enum IoRef {
    Hdr { off: u32, len: u32 },
    Mem(RawSpan),
}

/// Bytes composed and not yet written, as iovec references.
pub(super) struct Batch {
    pub(super) hdrs: Vec<u8>,
    pub(super) refs: Vec<IoRef>,
    pub(super) total: usize,
    pub(super) sent: usize,
    pub(super) ref_idx: usize,
    pub(super) ref_off: usize,
    pub(super) fins: Vec<Fin>,
    /// Byte offsets (into the batch) where a TCP segment must begin: each
    /// run between two cuts holds whole FPDUs and fits one segment, and is
    /// written with MSG_EOR.
    pub(super) cuts: Vec<usize>,
    pub(super) cut_idx: usize,
    pub(super) chunk_start: usize,
    /// The source memory of composed Read Responses, held until the batch
    /// is written (the responder's consumer may deregister it meanwhile,
    /// and a backed region's bytes live only here).
    pub(super) keeps: Vec<Arc<MrInner>>,
    /// Caller-owned regions whose memory the batch refers to: entered
    /// around each write (`MrInner::enter`).
    pub(super) fence: Vec<Arc<MrInner>>,
}

/// The "segment" used with `ext::LARGE_SEGMENTS`: one `sendmsg` per batch.
pub(crate) const LARGE_SEG: usize = BATCH_BYTES;
pub(super) const BATCH_REFS: usize = 60;
pub(super) const BATCH_BYTES: usize = 1 << 20;
pub(super) const COPY_MAX: usize = 512;

impl Batch {
    /// Bytes held by the batch's own buffers.
    pub(super) fn memory(&self) -> usize {
        use std::mem::size_of;
        self.hdrs.capacity()
            + self.refs.capacity() * size_of::<IoRef>()
            + self.cuts.capacity() * size_of::<usize>()
    }

    pub(super) fn new() -> Batch {
        Batch {
            hdrs: Vec::new(),
            refs: Vec::new(),
            total: 0,
            sent: 0,
            ref_idx: 0,
            ref_off: 0,
            fins: Vec::new(),
            cuts: Vec::new(),
            cut_idx: 0,
            chunk_start: 0,
            keeps: Vec::new(),
            fence: Vec::new(),
        }
    }

    /// Called after each FPDU (which began at batch offset `start`): if the
    /// current run no longer fits one segment, the FPDU starts a new run.
    pub(super) fn fpdu_done(&mut self, start: usize, seg: usize) {
        if self.total - self.chunk_start > seg && start > self.chunk_start {
            self.cuts.push(start);
            self.chunk_start = start;
        }
    }

    pub(super) fn full(&self) -> bool {
        self.refs.len() + 4 >= BATCH_REFS
            || self.total >= BATCH_BYTES
            || self.hdrs.len() >= 48 * 1024
    }

    pub(super) fn is_empty(&self) -> bool {
        self.total == 0
    }

    pub(super) fn clear(&mut self) {
        self.hdrs.clear();
        self.refs.clear();
        self.total = 0;
        self.sent = 0;
        self.ref_idx = 0;
        self.ref_off = 0;
        self.cuts.clear();
        self.cut_idx = 0;
        self.chunk_start = 0;
        self.keeps.clear();
        self.fence.clear();
    }

    pub(super) fn push_hdr(&mut self, start: usize) {
        let len = self.hdrs.len() - start;
        if len == 0 {
            return;
        }
        self.total += len;
        if let Some(IoRef::Hdr { off, len: l }) = self.refs.last_mut() {
            if *off as usize + *l as usize == start {
                *l += len as u32;
                return;
            }
        }
        self.refs.push(IoRef::Hdr {
            off: start as u32,
            len: len as u32,
        });
    }

    pub(super) fn push_mem(&mut self, s: RawSpan) {
        self.total += s.len;
        self.refs.push(IoRef::Mem(s));
    }

    /// Writes as much as the socket takes. Ok(true): all written.
    ///
    /// Each call gathers up to [`sys::MAX_RUNS`] segment runs (the bytes
    /// between two cuts, each ending with `MSG_EOR`) and writes them
    /// together ([`Conn::send_runs`]: one `sendmmsg`), so the siw framing
    /// costs no more system calls than a batch without cuts.
    pub(super) fn write(&mut self, c: &Conn) -> io::Result<bool> {
        let mut spans = [RawSpan {
            ptr: std::ptr::null_mut(),
            len: 0,
        }; 64];
        let mut runs = [(0usize, 0usize, false); sys::MAX_RUNS];
        while self.sent < self.total {
            // Gather runs from the cursor on.
            let (mut ri, mut ro) = (self.ref_idx, self.ref_off);
            let (mut pos, mut n, mut m) = (self.sent, 0usize, 0usize);
            let mut cut_idx = self.cut_idx;
            while m < runs.len() && n < spans.len() && pos < self.total {
                while cut_idx < self.cuts.len() && self.cuts[cut_idx] <= pos {
                    cut_idx += 1;
                }
                let limit = self.cuts.get(cut_idx).copied().unwrap_or(self.total);
                let mut want = limit - pos;
                let start = n;
                while want > 0 && n < spans.len() {
                    let (ptr, len) = match self.refs[ri] {
                        IoRef::Hdr { off, len } => {
                            // SAFETY: off+len lies within hdrs (built by push_hdr).
                            (
                                unsafe { self.hdrs.as_ptr().add(off as usize) } as *mut u8,
                                len as usize,
                            )
                        }
                        IoRef::Mem(s) => (s.ptr, s.len),
                    };
                    let k = (len - ro).min(want);
                    spans[n] = RawSpan {
                        // SAFETY: ro < len (cursor invariant), so ptr+ro is
                        // inside the ref's bytes.
                        ptr: unsafe { ptr.add(ro) },
                        len: k,
                    };
                    n += 1;
                    want -= k;
                    pos += k;
                    if ro + k == len {
                        ri += 1;
                        ro = 0;
                    } else {
                        ro += k;
                    }
                }
                // A run that ends at a cut (or the batch's end) closes its
                // segment; a run cut short by the iovec limit does not, and
                // ends the gathering.
                runs[m] = (start, n, want == 0);
                m += 1;
                if want > 0 {
                    break;
                }
            }
            if !mr::enter_all(&self.fence) {
                return Err(io::Error::other(
                    "memory of a work request was deregistered while it was being sent",
                ));
            }
            // SAFETY: header spans point into self.hdrs, which is not touched
            // during the call; memory spans belong to registrations held by
            // the WRs (or read responses) that own these bytes, and the
            // caller-owned ones among them are entered (self.fence).
            let res = unsafe {
                if m == 1 {
                    c.send_spans(&spans[..n], runs[0].2)
                } else {
                    c.send_runs(&spans[..n], &runs[..m])
                }
            };
            mr::exit_all(&self.fence);
            match res {
                Ok(mut w) => {
                    assert!(w <= pos - self.sent, "wrote more than was given");
                    self.sent += w;
                    // Advance the cursor.
                    while w > 0 {
                        let len = match self.refs[self.ref_idx] {
                            IoRef::Hdr { len, .. } => len as usize,
                            IoRef::Mem(s) => s.len,
                        };
                        let left = len - self.ref_off;
                        if w >= left {
                            w -= left;
                            self.ref_idx += 1;
                            self.ref_off = 0;
                        } else {
                            self.ref_off += w;
                            w = 0;
                        }
                    }
                    while self.cut_idx < self.cuts.len() && self.cuts[self.cut_idx] <= self.sent {
                        self.cut_idx += 1;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(false),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(true)
    }
}
