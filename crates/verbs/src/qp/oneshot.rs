//! One-shot advertise on a queue pair (`docs/one-shot.md`): bind a fresh
//! STag over caller memory and send it in one call; the registrations
//! `advertise_buffers` makes for caller memory are cached per QP. A
//! service the verbs API offers, kept apart from the QP's state machine
//! and posting (`qp.rs`).

use super::*;

impl QueuePair {
    /// One-shot advertise (`docs/one-shot.md`), in one call: binds a fresh
    /// STag (new key byte) over exactly `sgl` (registered memory, any
    /// number of pieces; it becomes one virtual range starting at address
    /// 0) with `access` (remote read and/or write), records (`stag`,
    /// `reference`) in the QP's command table, and sends `msg` with the
    /// STag attached: in the RDMAP header to a peer that negotiated the
    /// extension (its receive completion carries it in `advertised_stag`),
    /// else as the first 4 bytes (big-endian) of the payload. Returns the
    /// STag. The Send is unsignaled: only a failure completes it (with
    /// `wr_id`); the command's completion is the peer's close.
    ///
    /// When the peer closes it ([`WrOp::SendClose`], or a Send with
    /// Invalidate from a standard peer), the engine invalidates the STag
    /// and frees the binding before the receive completion, which carries
    /// the STag (`invalidated_rkey`) and `reference`. A close naming an STag
    /// not in the table is a protocol violation: that receive completes with
    /// `RemInvReqErr` and the connection ends with the RDMAP "cannot
    /// invalidate" Terminate.
    pub fn advertise(
        &self,
        wr_id: u64,
        sgl: &[crate::Sge],
        access: Access,
        msg: &[u8],
        reference: u64,
    ) -> Result<crate::Rkey> {
        let q = &self.inner;
        let n = q
            .negotiated()
            .ok_or(Error::inval("advertise needs a connected QP"))?;
        if q.state() != QpState::Rts {
            return Err(Error::BadState {
                qpn: q.qpn,
                state: q.state(),
            });
        }
        let remote = Access::REMOTE_READ | Access::REMOTE_WRITE;
        if access.0 & !remote.0 != 0 || access.0 == 0 {
            return Err(Error::inval(
                "advertise: access must be remote read and/or write",
            ));
        }
        // The memory: checked like a WR's SGEs (local write when the peer
        // may write it), held by the binding until it is freed.
        let need = if access.contains(Access::REMOTE_WRITE) {
            Access::LOCAL_WRITE
        } else {
            Access::LOCAL_READ
        };
        let (mut spans, mut keep) = (Vec::new(), Vec::new());
        for sge in sgl {
            let mr = q
                .core
                .stags
                .lookup(sge.lkey.raw())
                .ok_or(Error::inval("advertise: bad lkey"))?;
            if mr.backend.is_some() {
                return Err(Error::inval("advertise: a backed region has no memory"));
            }
            mr.check(q.pd, need, sge.addr, sge.length as u64)
                .map_err(|e| Error::inval(format!("advertise: SGE refused ({e:?})")))?;
            mr.resolve(sge.addr, sge.length as u64, &mut spans);
            keep.push(mr);
        }
        let mut payload = Vec::with_capacity(4 + msg.len());
        let index = q.core.stags.reserve(None, q.pd)?;
        let key = q.next_key.fetch_add(1, Ordering::Relaxed);
        let stag = crate::stag::Stag::new(index, key).raw();
        crate::engine::fast_reg_build(&q.core, q.pd, index, key, 0, access, keep, spans);
        if !n.one_shot {
            payload.extend_from_slice(&stag.to_be_bytes());
        }
        payload.extend_from_slice(msg);
        q.one_shot.lock().insert(stag, (reference, index));
        // The message leaves from a holder of its own, kept by the WQE.
        let len = payload.len() as u64;
        let holder = Arc::new(MrInner::holding(payload.into_boxed_slice(), 0));
        let mut sq = q.sq.lock();
        if sq.wqes.len() >= q.caps.max_send_wr {
            drop(sq);
            q.one_shot.lock().remove(&stag);
            q.core.stags.release(index);
            return Err(Error::SendQueueFull);
        }
        let seq = sq.next_seq;
        sq.next_seq += 1;
        sq.wqes.push_back(SqWqe {
            seq,
            wr_id,
            op: WrOp::SendAdvertise {
                stag: crate::Rkey::from_raw(stag),
            },
            // Nothing to report on success: the close is the completion
            // that matters (an error still completes, with `wr_id`).
            signaled: false,
            fence: false,
            solicited: false,
            spans: holder.spans.clone(),
            len,
            keep: vec![holder],
            stage: Stage::Queued,
            sink: None,
            imm_next: false,
        });
        q.kick_with(sq);
        Ok(crate::Rkey::from_raw(stag))
    }

    /// [`QueuePair::advertise`] for memory that need not be registered:
    /// each buffer is covered by a registration of its pages, made here on
    /// first use and reused by later advertisements of memory it covers
    /// (a registration cache, like an RDMA storage initiator keeps; it
    /// lives as long as the QP). The cached registrations allow local
    /// access only: the peer reaches the memory through the one-shot
    /// binding alone.
    ///
    /// # Safety
    /// Every buffer must be valid for reads (and for writes if `access`
    /// has `REMOTE_WRITE`) until the close completion for the returned STag
    /// arrives or the QP is destroyed; the peer may access it at any time
    /// until then.
    pub unsafe fn advertise_buffers(
        &self,
        wr_id: u64,
        bufs: &[(*mut u8, usize)],
        access: Access,
        msg: &[u8],
        reference: u64,
    ) -> Result<crate::Rkey> {
        let page = crate::sys::page_size() as u64;
        let covered = |cache: &std::collections::BTreeMap<u64, (u64, crate::MemoryRegion)>,
                       a: u64,
                       b: u64| {
            // Any registration starting at or before `a` may cover it (they
            // can overlap), not only the nearest.
            cache
                .range(..=a)
                .rev()
                .find(|(_, (end, _))| *end >= b)
                .map(|(_, (_, mr))| mr.lkey())
        };
        let mut cache = self.reg_cache.lock();
        // The pages of buffers no registration covers, merged where they
        // touch, are registered once each.
        let mut need: Vec<(u64, u64)> = Vec::new();
        for &(ptr, len) in bufs {
            if ptr.is_null() || len == 0 || len > u32::MAX as usize {
                return Err(Error::inval(
                    "advertise_buffers: empty, null or oversized buffer",
                ));
            }
            let (a, b) = (ptr as u64, ptr as u64 + len as u64);
            if covered(&cache, a, b).is_none() {
                need.push((a / page * page, b.div_ceil(page) * page));
            }
        }
        need.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (s0, e0) in need {
            match merged.last_mut() {
                Some(last) if s0 <= last.1 => last.1 = last.1.max(e0),
                _ => merged.push((s0, e0)),
            }
        }
        for (start, end) in merged {
            // SAFETY: the pages hold the caller's buffers, valid for as long
            // as any binding over them exists (this function's contract);
            // outside such a binding nothing reaches them through this
            // registration (local access only, and only advertise_buffers
            // names it).
            let mr = unsafe {
                self.pd.register_raw(
                    start as *mut u8,
                    (end - start) as usize,
                    Access::LOCAL_WRITE,
                    crate::RegOptions::default(),
                )?
            };
            cache.insert(start, (end, mr));
        }
        let sgl: Vec<crate::Sge> = bufs
            .iter()
            .map(|&(ptr, len)| {
                let (a, b) = (ptr as u64, ptr as u64 + len as u64);
                crate::Sge {
                    addr: a,
                    length: len as u32,
                    lkey: covered(&cache, a, b).expect("registered above"),
                }
            })
            .collect();
        drop(cache);
        self.advertise(wr_id, &sgl, access, msg, reference)
    }

    /// Registrations cached by [`QueuePair::advertise_buffers`].
    pub fn cached_registrations(&self) -> usize {
        self.reg_cache.lock().len()
    }

    /// One-shot bindings advertised and not yet closed.
    pub fn open_advertisements(&self) -> usize {
        self.inner.one_shot.lock().len()
    }
}
