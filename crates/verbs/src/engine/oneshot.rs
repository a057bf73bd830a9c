//! The life cycle of a QP's one-shot advertisements (`docs/one-shot.md`):
//! the table of the bindings it advertised that are still open, and how
//! each ends exactly once. Four things can end one: the peer's close
//! (`iwarp/complete.rs`), a cancel (`QueuePair::cancel_advertisement`),
//! its deadline (the progress thread's timer for the QP, `Core::on_timer`)
//! and the QP's failure or destruction. Whichever takes it out of the
//! table first ends it; the others find it gone.
//!
//! Ending one, with the table locked: the binding is released from the
//! STag table, which invalidates it (a peer access from then on gets the
//! invalid-STag Terminate) and waits until no access through it is in
//! flight (the binding is *gated*, `MrInner::gated`: placements, Read
//! Responses and atomics enter it); what the advertisement holds besides
//! (the registration cache's use of its memory, [`AdvertHold`]) is let go
//! of; then its one completion is queued. So once the table is unlocked,
//! whoever ended it, the engine no longer touches the memory, and a
//! cancel that lost a race with the close returns only after the close is
//! done with the memory and its completion is queued. (Lock order: the
//! table, then the registration cache's lock; nothing that holds an
//! access to memory entered waits for the table.)
//!
//! An advertisement that ended without a close is remembered (the last
//! [`ENDED_MAX`] of them): a close that names it later (the peer closed
//! while the cancel or the deadline ended it) is a late close, whose
//! receive completes normally without a reference, not a protocol
//! violation that would end the connection.

use super::*;
use crate::cq::{WcOpcode, WcStatus, WorkCompletion};
use std::collections::{HashMap, HashSet};
use std::time::Instant;

/// What an advertisement holds besides its binding: the use of the
/// registrations [`crate::QueuePair::advertise_buffers`] keeps in its cache.
pub(crate) trait AdvertHold: Send + Sync {
    /// The advertisement ended; `closed`: by the peer's close (the memory
    /// is likely to be advertised again: keep it registered), else by a
    /// cancel, its deadline or the QP's end.
    fn end(self: Box<Self>, closed: bool);
}

/// An open advertisement.
pub(crate) struct Advert {
    pub reference: u64,
    /// Its binding's STag index.
    pub index: u32,
    /// The advertise call's, for an [`WcOpcode::AdvertiseEnd`] completion.
    pub wr_id: u64,
    pub deadline: Option<Instant>,
    pub hold: Option<Box<dyn AdvertHold>>,
}

/// How many advertisements that ended without a close are remembered.
pub(crate) const ENDED_MAX: usize = 1024;

/// A QP's one-shot table.
#[derive(Default)]
pub(crate) struct OneShot {
    open: HashMap<u32, Advert>,
    /// STags of advertisements that ended without a close, oldest first.
    ended: VecDeque<u32>,
    ended_set: HashSet<u32>,
    /// The deadline a timer is set for: the earliest of the open ones.
    timer: Option<Instant>,
}

impl OneShot {
    pub fn len(&self) -> usize {
        self.open.len()
    }

    fn remember_ended(&mut self, stag: u32) {
        if self.ended_set.insert(stag) {
            self.ended.push_back(stag);
        }
        while self.ended.len() > ENDED_MAX {
            if let Some(old) = self.ended.pop_front() {
                self.ended_set.remove(&old);
            }
        }
    }

    fn forget_ended(&mut self, stag: u32) -> bool {
        if !self.ended_set.remove(&stag) {
            return false;
        }
        self.ended.retain(|&s| s != stag);
        true
    }
}

/// What a close named.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Close {
    /// An open advertisement, now ended by the close.
    Closed,
    /// One that ended without a close (cancelled, expired): a late close.
    Late,
    /// Nothing this QP advertised (or one already closed).
    Unknown,
}

impl QpInner {
    /// Enters a new advertisement (its binding installed) in the table and
    /// sets a timer for its deadline.
    pub(crate) fn add_advert(&self, stag: u32, a: Advert) {
        let mut t = self.one_shot.lock();
        // The STag names a new binding now: a close of it is no longer late.
        t.forget_ended(stag);
        if let Some(d) = a.deadline {
            if t.timer.is_none_or(|x| d < x) {
                t.timer = Some(d);
                crate::timers::add(&self.core.timers, self.qpn, d);
            }
        }
        t.open.insert(stag, a);
    }

    /// Takes back an advertisement whose command could not be queued
    /// (nothing was sent): released, no completion.
    pub(crate) fn take_back_advert(&self, stag: u32) {
        let a = self.one_shot.lock().open.remove(&stag);
        if let Some(a) = a {
            self.core.stags.release(a.index);
            if let Some(h) = a.hold {
                h.end(true);
            }
        }
    }

    /// The peer closed `stag` (a one-shot close, or a Send with Invalidate
    /// naming it). An open advertisement ends: released, then `report`
    /// gets its reference and queues the receive completion. A late close
    /// (its advertisement was cancelled or expired, or its deadline has
    /// just passed) calls `report(None)`. [`Close::Unknown`]: nothing was
    /// done and `report` was not called.
    pub(crate) fn close_advert(&self, stag: u32, report: impl FnOnce(Option<u64>)) -> Close {
        let mut t = self.one_shot.lock();
        let Some(a) = t.open.get(&stag) else {
            if t.forget_ended(stag) {
                report(None);
                return Close::Late;
            }
            return Close::Unknown;
        };
        if a.deadline.is_some_and(|d| Instant::now() >= d) {
            // Its deadline passed before the close arrived (the timer had
            // not run yet): it ends as expired and the close is late, as
            // it would be a moment later.
            let a = t.open.remove(&stag).expect("looked up under the lock");
            self.end_advert(stag, a, WcStatus::Expired);
            report(None);
            return Close::Late;
        }
        let a = t.open.remove(&stag).expect("looked up under the lock");
        self.core.stags.release(a.index);
        if let Some(h) = a.hold {
            h.end(true);
        }
        report(Some(a.reference));
        Close::Closed
    }

    /// Cancels `stag`: true if it was open (it is released and its
    /// `Cancelled` completion queued); false if it was not (closed, ended
    /// before, or never advertised here).
    pub(crate) fn cancel_advert(&self, stag: u32) -> bool {
        let mut t = self.one_shot.lock();
        let Some(a) = t.open.remove(&stag) else {
            return false;
        };
        t.remember_ended(stag);
        self.end_advert(stag, a, WcStatus::Cancelled);
        true
    }

    /// The QP's timer ran: ends the advertisements whose deadline has
    /// passed (`Expired`) and sets the timer for the next deadline.
    pub(crate) fn expire_adverts(&self) {
        let now = Instant::now();
        let mut t = self.one_shot.lock();
        if t.timer.is_none_or(|x| x > now) {
            return;
        }
        // In deadline order (the completions too).
        let mut due: Vec<(Instant, u32)> = t
            .open
            .iter()
            .filter_map(|(&s, a)| a.deadline.filter(|&d| d <= now).map(|d| (d, s)))
            .collect();
        due.sort_unstable();
        for (_, stag) in due {
            let a = t.open.remove(&stag).expect("listed under the lock");
            t.remember_ended(stag);
            self.end_advert(stag, a, WcStatus::Expired);
        }
        t.timer = t.open.values().filter_map(|a| a.deadline).min();
        if let Some(d) = t.timer {
            crate::timers::add(&self.core.timers, self.qpn, d);
        }
    }

    /// The QP failed or goes away: every open advertisement ends with a
    /// flush completion.
    pub(crate) fn flush_adverts(&self) {
        let mut t = self.one_shot.lock();
        let open: Vec<(u32, Advert)> = t.open.drain().collect();
        t.timer = None;
        for (stag, a) in open {
            self.end_advert(stag, a, WcStatus::WrFlushErr);
        }
    }

    /// Ends advertisement `a` (out of the table, which the caller holds
    /// locked) without a close: released (waiting for accesses in flight),
    /// what it held let go of, then its one completion.
    fn end_advert(&self, stag: u32, a: Advert, status: WcStatus) {
        self.core.stags.release(a.index);
        if let Some(h) = a.hold {
            h.end(false);
        }
        self.recv_cq.push(WorkCompletion {
            wr_id: a.wr_id,
            status,
            opcode: WcOpcode::AdvertiseEnd,
            qp_num: crate::Qpn::from_raw(self.qpn),
            invalidated_rkey: Some(crate::Rkey::from_raw(stag)),
            reference: Some(a.reference),
            ..Default::default()
        });
    }
}
