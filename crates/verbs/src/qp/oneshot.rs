//! One-shot advertise on a queue pair (`docs/one-shot.md`): bind a fresh
//! STag over caller memory and send it in one call, optionally with a
//! deadline; cancel it; the registrations `advertise_buffers` makes for
//! caller memory are cached per QP (`regcache.rs`). A service the verbs
//! API offers, kept apart from the QP's state machine and posting
//! (`qp.rs`); how an advertisement ends is the engine's
//! (`engine/oneshot.rs`).

use super::*;
pub use regcache::{IDLE_BYTES as REG_CACHE_IDLE_BYTES, IDLE_MAX as REG_CACHE_IDLE_MAX};

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
    ///
    /// An advertisement the peer does not close ends by
    /// [`QueuePair::cancel_advertisement`], by its deadline
    /// ([`QueuePair::advertise_until`]) or with the QP (a flush
    /// completion when the QP fails): each gives one
    /// [`WcOpcode::AdvertiseEnd`] completion instead of the close's.
    pub fn advertise(
        &self,
        wr_id: u64,
        sgl: &[crate::Sge],
        access: Access,
        msg: &[u8],
        reference: u64,
    ) -> Result<crate::Rkey> {
        self.advertise_inner(wr_id, sgl, access, msg, reference, None, None)
    }

    /// [`QueuePair::advertise`] with a deadline: if the peer has not closed
    /// the advertisement by `deadline` (`None`: never), the engine ends it
    /// as a cancel does, with [`WcStatus::Expired`]. From `deadline` on
    /// the STag grants no access even before the engine acts (a peer
    /// access gets the invalid-STag Terminate); the engine acts on the
    /// progress thread's timer for the QP, within a few milliseconds. A
    /// close that arrives after the deadline is a late close.
    pub fn advertise_until(
        &self,
        wr_id: u64,
        sgl: &[crate::Sge],
        access: Access,
        msg: &[u8],
        reference: u64,
        deadline: Option<Instant>,
    ) -> Result<crate::Rkey> {
        self.advertise_inner(wr_id, sgl, access, msg, reference, deadline, None)
    }

    #[allow(clippy::too_many_arguments)]
    fn advertise_inner(
        &self,
        wr_id: u64,
        sgl: &[crate::Sge],
        access: Access,
        msg: &[u8],
        reference: u64,
        deadline: Option<Instant>,
        hold: Option<Box<dyn crate::engine::AdvertHold>>,
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
        let until = deadline.map_or(crate::mr::NO_DEADLINE, crate::sys::instant_ns);
        crate::engine::one_shot_build(&q.core, q.pd, index, key, access, keep, spans, until);
        if !n.one_shot {
            payload.extend_from_slice(&stag.to_be_bytes());
        }
        payload.extend_from_slice(msg);
        q.add_advert(
            stag,
            crate::engine::Advert {
                reference,
                index,
                wr_id,
                deadline,
                hold,
            },
        );
        // The message leaves from a holder of its own, kept by the WQE.
        let len = payload.len() as u64;
        let holder = Arc::new(MrInner::holding(payload.into_boxed_slice(), 0));
        let mut sq = q.sq.lock();
        if sq.wqes.len() >= q.caps.max_send_wr {
            drop(sq);
            q.take_back_advert(stag);
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
        if q.state() == QpState::Error {
            // The QP failed meanwhile, maybe before the advertisement was
            // in its table: it ends with the others.
            q.flush_adverts();
        }
        Ok(crate::Rkey::from_raw(stag))
    }

    /// Cancels one-shot advertisement `stag` before the peer closes it:
    /// invalidates the STag (a peer access from now on gets the
    /// invalid-STag Terminate, which ends the connection), waits until no
    /// access to the memory through it is in flight (a placement, a Read
    /// Response being sent: as deregistration waits), frees the binding
    /// and lets go of the registrations `advertise_buffers` made for it
    /// that no other open advertisement uses (`regcache.rs`). Its one
    /// completion, queued before this returns, is a
    /// [`WcOpcode::AdvertiseEnd`] with [`WcStatus::Cancelled`] on the
    /// receive CQ, with the advertise call's `wr_id`, the STag in
    /// `invalidated_rkey` and the reference. When this returns, the engine
    /// no longer touches the memory.
    ///
    /// Returns false, doing nothing, when the advertisement is not open:
    /// the peer closed it (a close that wins a race with this call is done
    /// with the memory, and its completion queued, before this returns),
    /// it expired or was cancelled before, or `stag` was never advertised
    /// here. A close that arrives after the cancel is a late close: its
    /// receive completes without a reference (`docs/one-shot.md`).
    pub fn cancel_advertisement(&self, stag: crate::Rkey) -> bool {
        self.inner.cancel_advert(stag.raw())
    }

    /// [`QueuePair::advertise`] for memory that need not be registered:
    /// each buffer is covered by a registration of its pages, made here on
    /// first use and reused by later advertisements of memory it covers
    /// (a registration cache, like an RDMA storage initiator keeps). Its
    /// policy (`docs/one-shot.md`): a registration is released at once
    /// when its last advertisement is cancelled, expires or is flushed;
    /// after a close it stays cached, up to [`REG_CACHE_IDLE_MAX`] idle
    /// registrations of [`REG_CACHE_IDLE_BYTES`] in all (least recently
    /// used released first); [`QueuePair::trim_registration_cache`]
    /// releases the idle ones now. The cached registrations allow local
    /// access only: the peer reaches the memory through the one-shot
    /// binding alone.
    ///
    /// # Safety
    /// Every buffer must be valid for reads (and for writes if `access`
    /// has `REMOTE_WRITE`) until the advertisement ends (its close or
    /// `AdvertiseEnd` completion arrives, or `cancel_advertisement`
    /// returns true) or the QP is destroyed; the peer may access it at any
    /// time until then.
    pub unsafe fn advertise_buffers(
        &self,
        wr_id: u64,
        bufs: &[(*mut u8, usize)],
        access: Access,
        msg: &[u8],
        reference: u64,
    ) -> Result<crate::Rkey> {
        // SAFETY: the caller's contract is ours.
        unsafe { self.advertise_buffers_until(wr_id, bufs, access, msg, reference, None) }
    }

    /// [`QueuePair::advertise_buffers`] with a deadline, as
    /// [`QueuePair::advertise_until`].
    ///
    /// # Safety
    /// As [`QueuePair::advertise_buffers`].
    pub unsafe fn advertise_buffers_until(
        &self,
        wr_id: u64,
        bufs: &[(*mut u8, usize)],
        access: Access,
        msg: &[u8],
        reference: u64,
        deadline: Option<Instant>,
    ) -> Result<crate::Rkey> {
        // SAFETY: the caller's contract is the cache's.
        let (sgl, uses) = unsafe { self.reg_cache.cover(&self.pd, bufs)? };
        self.advertise_inner(
            wr_id,
            &sgl,
            access,
            msg,
            reference,
            deadline,
            Some(Box::new(uses)),
        )
    }

    /// Registrations cached by [`QueuePair::advertise_buffers`].
    pub fn cached_registrations(&self) -> usize {
        self.reg_cache.len()
    }

    /// Releases the registrations cached by
    /// [`QueuePair::advertise_buffers`] that no open advertisement uses;
    /// returns how many.
    pub fn trim_registration_cache(&self) -> usize {
        self.reg_cache.trim()
    }

    /// One-shot bindings advertised and not yet ended.
    pub fn open_advertisements(&self) -> usize {
        self.inner.one_shot.lock().len()
    }
}
