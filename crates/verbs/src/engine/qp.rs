//! A queue pair's engine state: [`QpInner`] with its state machine word,
//! queues and connection, in-order completion and the flush on error.

use super::*;
use crate::cq::{CqInner, WcOpcode, WcStatus, WorkCompletion};
use crate::qp_state::QpState;
use softrdma_wire::TermCode;
use std::sync::atomic::AtomicU8;
use std::sync::OnceLock;

/// Queue sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Most outstanding send work requests.
    pub max_send_wr: usize,
    /// Most posted receive work requests (ignored with an SRQ).
    pub max_recv_wr: usize,
    /// Most SGEs per send work request.
    pub max_send_sge: usize,
    /// Most SGEs per receive work request.
    pub max_recv_sge: usize,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 256,
            max_recv_wr: 256,
            max_send_sge: 4,
            max_recv_sge: 4,
        }
    }
}

pub(crate) struct QpInner {
    pub qpn: u32,
    pub pd: u32,
    pub core: Arc<Core>,
    pub send_cq: Arc<CqInner>,
    pub recv_cq: Arc<CqInner>,
    pub srq: Option<Arc<SrqInner>>,
    pub caps: QpCaps,
    pub sig_all: bool,
    pub(crate) state: AtomicU8,
    pub sq: Mutex<Sq>,
    pub rq: Mutex<VecDeque<RecvWqe>>,
    /// What carries the QP's operations once it is connected: iWARP over
    /// TCP (`iwarp`), or the local transport (`local.rs`). Set once.
    pub transport: OnceLock<Arc<dyn Transport>>,
    /// One-shot bindings this QP advertised that are still open, and how
    /// they end (`oneshot.rs`, `docs/one-shot.md`).
    pub one_shot: Mutex<super::OneShot>,
    /// Key byte of the next one-shot binding.
    pub(crate) next_key: std::sync::atomic::AtomicU8,
    pub relaxed: bool,
    /// Set once the QP has been flushed (so it happens once).
    pub(crate) flushed: std::sync::atomic::AtomicBool,
}

impl QpInner {
    #[inline]
    pub fn state(&self) -> QpState {
        QpState::from_u8(self.state.load(Ordering::Acquire))
    }

    pub fn set_state(&self, s: QpState) {
        self.state.store(s as u8, Ordering::Release);
    }

    pub fn info(&self) -> crate::registry::QpInfo {
        let t = self.transport.get();
        let addrs = t.and_then(|t| t.addrs());
        let n = t.and_then(|t| t.negotiated());
        crate::registry::QpInfo {
            qpn: self.qpn,
            pd: self.pd,
            state: self.state(),
            local: addrs.map(|a| a.0),
            peer: addrs.map(|a| a.1),
            sq_outstanding: self.sq.lock().wqes.len(),
            rq_posted: self.rq.lock().len(),
            mpa_revision: n.map_or(0, |n| n.revision),
            crc: n.is_some_and(|n| n.crc),
            ird: n.map_or(0, |n| n.ird),
            ord: n.map_or(0, |n| n.ord),
            same_host: n.is_some_and(|n| n.same_host),
        }
    }

    /// What was negotiated with the peer, on a network transport.
    pub fn negotiated(&self) -> Option<crate::negotiated::Negotiated> {
        self.transport.get().and_then(|t| t.negotiated())
    }

    /// Runs the transport's receiver for at most `budget` segments; true
    /// if it stopped at its budget with input left.
    pub fn on_readable(self: &Arc<Self>, budget: usize) -> bool {
        self.transport
            .get()
            .is_some_and(|t| t.on_readable(self, budget))
    }

    /// Pops finished WRs off the front of the send queue, in order, and
    /// reports their completions.
    pub fn complete_in_order(&self, sq: &mut Sq) {
        while let Some(w) = sq.wqes.front() {
            let Stage::Done(status) = w.stage else { break };
            let w = sq.wqes.pop_front().expect("front exists");
            if w.signaled || self.sig_all || status != WcStatus::Success {
                self.send_cq.push(WorkCompletion {
                    wr_id: w.wr_id,
                    status,
                    opcode: w.opcode(),
                    byte_len: w.len as u32,
                    qp_num: crate::Qpn::from_raw(self.qpn),
                    invalidated_rkey: None,
                    solicited: false,
                    imm_data: None,
                    ..Default::default()
                });
            }
        }
        if sq.sqd_pending && sq.wqes.iter().all(|w| w.seq >= sq.next_tx) && sq.orq.is_empty() {
            sq.sqd_pending = false;
            self.core.post_event(crate::engine::AsyncEvent::SqDrained {
                qpn: crate::Qpn::from_raw(self.qpn),
            });
        }
    }

    /// Moves the QP to ERROR: the WR at fault (the oldest unfinished one)
    /// completes with `status`, every other outstanding WR with a flush
    /// status, the connection is closed. Idempotent.
    pub fn fail(&self, status: WcStatus, event: Option<crate::engine::AsyncEvent>) {
        self.set_state(QpState::Error);
        if self.flushed.swap(true, Ordering::AcqRel) {
            return;
        }
        let t = self.transport.get();
        if let Some(t) = t {
            t.close();
        }
        {
            let mut sq = self.sq.lock();
            if let Some(t) = t {
                t.flush_tx(&mut sq);
            }
            // Completions are reported in posting order: the first WR not
            // done gets `status` (if it had started) and every WR after it
            // is flushed, also one whose bytes had already gone out (as on
            // any RC queue pair: nothing succeeds after a failure, issue
            // 19's simulation found a Send reported done after an earlier
            // Read was flushed).
            let mut first = true;
            let next_tx = sq.next_tx;
            for w in sq.wqes.iter_mut() {
                if first && matches!(w.stage, Stage::Done(_)) {
                    continue;
                }
                let started = w.seq < next_tx;
                w.stage = Stage::Done(if first && started {
                    status
                } else {
                    WcStatus::WrFlushErr
                });
                first = false;
            }
            sq.next_tx = sq.next_seq;
            sq.orq.clear();
            self.complete_in_order(&mut sq);
        }
        let rq: Vec<RecvWqe> = self.rq.lock().drain(..).collect();
        let cur = t.and_then(|t| t.take_current_recv());
        for w in cur.into_iter().chain(rq) {
            self.recv_cq.push(WorkCompletion {
                wr_id: w.wr_id,
                status: WcStatus::WrFlushErr,
                opcode: WcOpcode::Recv,
                byte_len: 0,
                qp_num: crate::Qpn::from_raw(self.qpn),
                invalidated_rkey: None,
                solicited: false,
                imm_data: None,
                ..Default::default()
            });
        }
        // The advertisements end too, each with a flush completion.
        self.flush_adverts();
        if let Some(ev) = event {
            self.core.post_event(ev);
        }
    }

    /// Runs the transmitter with the send queue locked, then handles any
    /// failure after unlocking (failing takes other locks).
    pub fn kick_with(&self, mut sq: parking_lot::MutexGuard<'_, Sq>) {
        let res = match self.transport.get() {
            Some(t) => t.kick(self, &mut sq),
            None => Ok(None),
        };
        drop(sq);
        match res {
            Ok(None) => {}
            Err(e) => self.fail(
                WcStatus::RetryExcErr,
                Some(crate::engine::AsyncEvent::QpFatal {
                    qpn: crate::Qpn::from_raw(self.qpn),
                    reason: format!("send failed: {e}"),
                }),
            ),
            Ok(Some(reason)) => self.fail(
                WcStatus::WrFlushErr,
                Some(crate::engine::AsyncEvent::QpFatal {
                    qpn: crate::Qpn::from_raw(self.qpn),
                    reason,
                }),
            ),
        }
    }

    /// Fails the QP because of a Terminate we send: queues the Terminate,
    /// pushes it out (best effort), then closes.
    pub fn terminate(&self, code: TermCode, hdr: Option<&[u8]>, status: WcStatus) {
        tracing::warn!(qpn = self.qpn, %code, hdr = ?hdr, "sending Terminate");
        if self.state() != QpState::Error {
            if let Some(t) = self.transport.get() {
                t.send_terminate(self, code, hdr);
            }
        }
        self.fail(
            status,
            Some(crate::engine::AsyncEvent::Terminated {
                qpn: crate::Qpn::from_raw(self.qpn),
                code,
                by_peer: false,
            }),
        );
    }
}
