//! Completion queues: batch polling, blocking waits, and an event fd for
//! epoll / tokio `AsyncFd`, with solicited-only notification.

use crate::error::{Error, Result};
use crate::sys::EventFd;
use parking_lot::{Condvar, Mutex};
use std::collections::VecDeque;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Completion status, named as in libibverbs (`IBV_WC_*`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum WcStatus {
    #[default]
    /// The operation completed.
    Success,
    /// Local length error: a received message was longer than the buffer.
    LocLenErr,
    /// Local QP operation error.
    LocQpOpErr,
    /// Local protection error: a bad lkey or an access outside a region.
    LocProtErr,
    /// The WR was flushed because the QP went to ERROR.
    WrFlushErr,
    /// Bad response from the peer.
    BadRespErr,
    /// Local access error.
    LocAccessErr,
    /// The peer found the request invalid.
    RemInvReqErr,
    /// The peer refused a remote access (bad STag, rights, bounds).
    RemAccessErr,
    /// The peer failed the operation.
    RemOpErr,
    /// The connection broke.
    RetryExcErr,
    /// Fatal error.
    FatalErr,
    /// Any other failure (`IBV_WC_GENERAL_ERR`).
    GeneralErr,
    /// A one-shot advertisement was cancelled
    /// ([`crate::QueuePair::cancel_advertisement`]) before the peer closed
    /// it (opcode [`WcOpcode::AdvertiseEnd`]; no libibverbs equivalent).
    Cancelled,
    /// A one-shot advertisement's deadline passed before the peer closed
    /// it ([`crate::QueuePair::advertise_until`]; opcode
    /// [`WcOpcode::AdvertiseEnd`]).
    Expired,
}

/// What a completion was for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub enum WcOpcode {
    #[default]
    /// A Send (any flavour: with Invalidate, Solicited Event, one-shot advertise or close).
    Send,
    /// An RDMA Write (also a Write with immediate, at the initiator).
    RdmaWrite,
    /// An RDMA Read: the bytes are in the local buffer.
    RdmaRead,
    /// A local invalidate of an STag.
    LocalInv,
    /// A fast-register of a region.
    RegMr,
    /// A receive: a Send arrived into a posted receive buffer.
    Recv,
    /// An RFC 7306 Immediate Data message arrived (alone, or after an RDMA
    /// Write with immediate): see [`WorkCompletion::imm_data`].
    RecvWithImm,
    /// An RFC 7306 compare-and-swap; the original value is in the local SGE.
    CompSwap,
    /// An RFC 7306 fetch-and-add; the original value is in the local SGE.
    FetchAdd,
    /// A [`crate::WrOp::Flush`] completed: the peer's earlier Writes are
    /// durable (or placed, for a region in memory).
    Flush,
    /// A one-shot advertisement ended without the peer's close
    /// (`docs/one-shot.md`): cancelled ([`WcStatus::Cancelled`]), expired
    /// ([`WcStatus::Expired`]) or flushed with the QP
    /// ([`WcStatus::WrFlushErr`]). On the receive CQ; `wr_id` is the
    /// advertise call's, `invalidated_rkey` the STag, `reference` its
    /// reference. The binding is already freed and no access to the memory
    /// is in flight.
    AdvertiseEnd,
}

/// One completion.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WorkCompletion {
    /// The `wr_id` of the work request this completes.
    pub wr_id: u64,
    /// Success, or why the request failed (then only `wr_id`, `opcode` and
    /// `qp_num` are meaningful).
    pub status: WcStatus,
    /// The kind of operation completed.
    pub opcode: WcOpcode,
    /// Bytes received (receive completions) or transferred.
    pub byte_len: u32,
    /// The QP the work request was posted on.
    pub qp_num: crate::Qpn,
    /// The STag the peer invalidated with Send with Invalidate.
    pub invalidated_rkey: Option<crate::Rkey>,
    /// The message was a Send (or Immediate Data) with Solicited Event.
    pub solicited: bool,
    /// The immediate value of a [`WcOpcode::RecvWithImm`] completion.
    pub imm_data: Option<u32>,
    /// One-shot close (`docs/one-shot.md`): the reference number the
    /// initiator gave [`crate::QueuePair::advertise`] for the STag the peer
    /// closed (in `invalidated_rkey`); the binding is already gone. Also
    /// on a [`WcOpcode::AdvertiseEnd`] completion. A close that arrives
    /// after its advertisement was cancelled or expired (a late close)
    /// completes its receive with the STag in `invalidated_rkey` and no
    /// reference: the advertisement's one completion was the cancel's.
    pub reference: Option<u64>,
    /// One-shot advertise received: the STag the peer advertised (in the
    /// RDMAP header, with a peer that negotiated the extension).
    pub advertised_stag: Option<crate::Rkey>,
}

impl WorkCompletion {
    /// Whether the status is [`WcStatus::Success`].
    pub fn is_ok(&self) -> bool {
        self.status == WcStatus::Success
    }
}

const ARM_NONE: u8 = 0;
const ARM_ANY: u8 = 1;
const ARM_SOLICITED: u8 = 2;

fn arm_bits(solicited_only: bool) -> u8 {
    if solicited_only {
        ARM_SOLICITED
    } else {
        ARM_ANY
    }
}

pub(crate) struct CqInner {
    pub id: u32,
    q: Mutex<VecDeque<WorkCompletion>>,
    cv: Condvar,
    cap: usize,
    armed: AtomicU8,
    event: EventFd,
    overflowed: std::sync::atomic::AtomicBool,
    dropped: std::sync::atomic::AtomicU64,
}

impl CqInner {
    /// Adds a completion; fires the event fd if armed and the completion
    /// qualifies.
    /// No completion waits to be polled.
    pub fn is_drained(&self) -> bool {
        self.q.lock().is_empty()
    }

    pub fn push(&self, wc: WorkCompletion) {
        let mut q = self.q.lock();
        if q.len() >= self.cap {
            // Logged once per queue (a peer that floods us must not flood
            // the log too); `dropped` counts them all.
            self.dropped.fetch_add(1, Ordering::Relaxed);
            if !self.overflowed.swap(true, Ordering::AcqRel) {
                tracing::error!(
                    cq = self.id,
                    cap = self.cap,
                    "completion queue overflow; completions dropped from now on \
                     (counted by CompletionQueue::dropped, logged once)"
                );
            }
            return;
        }
        q.push_back(wc);
        drop(q);
        self.cv.notify_all();
        let armed = self.armed.load(Ordering::Acquire);
        let fire = match armed {
            ARM_ANY => true,
            ARM_SOLICITED => wc.solicited || wc.status != WcStatus::Success,
            _ => false,
        };
        if fire
            && self
                .armed
                .compare_exchange(armed, ARM_NONE, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            self.event.signal();
        }
    }
}

/// A completion queue. Cheap to clone (a handle).
#[derive(Clone)]
pub struct CompletionQueue {
    pub(crate) inner: Arc<CqInner>,
}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CompletionQueue({})", self.inner.id)
    }
}

impl CompletionQueue {
    pub(crate) fn new(id: u32, cap: usize) -> Result<CompletionQueue> {
        if cap == 0 {
            return Err(Error::inval("CQ depth must be > 0"));
        }
        Ok(CompletionQueue {
            inner: Arc::new(CqInner {
                id,
                q: Mutex::new(VecDeque::with_capacity(cap.min(4096))),
                cv: Condvar::new(),
                cap,
                armed: AtomicU8::new(ARM_NONE),
                event: EventFd::new()?,
                overflowed: Default::default(),
                dropped: Default::default(),
            }),
        })
    }

    /// Takes up to `out.len()` completions; returns how many.
    pub fn poll(&self, out: &mut [WorkCompletion]) -> usize {
        let mut q = self.inner.q.lock();
        let n = out.len().min(q.len());
        for (slot, wc) in out.iter_mut().zip(q.drain(..n)) {
            *slot = wc;
        }
        n
    }

    /// Takes one completion, if any.
    pub fn poll_one(&self) -> Option<WorkCompletion> {
        self.inner.q.lock().pop_front()
    }

    /// Blocks until at least one completion is available (or the timeout
    /// passes), then polls like [`CompletionQueue::poll`].
    pub fn poll_wait(&self, out: &mut [WorkCompletion], timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        let mut q = self.inner.q.lock();
        while q.is_empty() {
            if self.inner.cv.wait_until(&mut q, deadline).timed_out() {
                break;
            }
        }
        let n = out.len().min(q.len());
        for (slot, wc) in out.iter_mut().zip(q.drain(..n)) {
            *slot = wc;
        }
        n
    }

    /// Waits for one completion, up to `timeout`.
    pub fn wait_one(&self, timeout: Duration) -> Option<WorkCompletion> {
        let mut wc = [WorkCompletion::default()];
        (self.poll_wait(&mut wc, timeout) == 1).then_some(wc[0])
    }

    /// Arms the event fd for the next completion (`solicited_only`: only a
    /// solicited receive completion or an error completion fires it), like
    /// `ibv_req_notify_cq`. If completions are already queued and would
    /// qualify, the event fires at once, so a waiter never misses one.
    pub fn req_notify(&self, solicited_only: bool) {
        let arm = arm_bits(solicited_only);
        self.inner.armed.store(arm, Ordering::Release);
        let q = self.inner.q.lock();
        let ready = q
            .iter()
            .any(|wc| !solicited_only || wc.solicited || wc.status != WcStatus::Success);
        drop(q);
        if ready
            && self
                .inner
                .armed
                .compare_exchange(arm, ARM_NONE, Ordering::AcqRel, Ordering::Relaxed)
                .is_ok()
        {
            self.inner.event.signal();
        }
    }

    /// Arms the event fd for the next completion added from now on, as
    /// `ibv_req_notify_cq` does on Linux siw and rxe: completions already
    /// queued fire nothing (a consumer arms, polls the CQ empty, then
    /// sleeps). The C ABI uses this; [`CompletionQueue::req_notify`]
    /// fires at once for queued completions, for Rust callers that arm
    /// after polling. (perftest's `-e` server re-arms its send CQ without
    /// polling it: with the fire-at-once kind it spun in
    /// `ibv_get_cq_event` at 100% CPU.)
    pub fn req_notify_next(&self, solicited_only: bool) {
        self.inner
            .armed
            .store(arm_bits(solicited_only), Ordering::Release);
    }

    /// Withdraws an armed notification that has not fired (a thread that
    /// armed the CQ before sleeping, woke for another reason and will now
    /// poll the CQ itself does not want its own completions to ring the
    /// event fd). Returns false if it was still armed (withdrawn now:
    /// nothing fired); true if it was not armed any more, that is it fired
    /// (or is firing: the event fd is, or is about to be, readable and
    /// wants [`CompletionQueue::ack_events`]) or was never armed.
    pub fn cancel_notify(&self) -> bool {
        self.inner.armed.swap(ARM_NONE, Ordering::AcqRel) == ARM_NONE
    }

    /// The event fd: readable after an armed notification fired. Register it
    /// with epoll or wrap it in tokio's `AsyncFd`; call
    /// [`CompletionQueue::ack_events`] after it becomes readable.
    pub fn event_fd(&self) -> RawFd {
        self.inner.event.as_raw_fd()
    }

    /// Consumes pending notifications; returns how many fired.
    pub fn ack_events(&self) -> u64 {
        self.inner.event.drain()
    }

    /// Blocks until an armed notification fires (like
    /// `ibv_get_cq_event`); returns false on timeout.
    pub fn wait_event(&self, timeout: Option<Duration>) -> bool {
        self.inner.event.wait(timeout)
    }

    /// Completions waiting to be polled.
    pub fn len(&self) -> usize {
        self.inner.q.lock().len()
    }

    /// Whether no completion waits to be polled.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// True once a completion was dropped because the queue was full.
    pub fn overflowed(&self) -> bool {
        self.inner.overflowed.load(Ordering::Acquire)
    }
    /// Completions dropped because the queue was full (see
    /// [`CompletionQueue::overflowed`]).
    pub fn dropped(&self) -> u64 {
        self.inner.dropped.load(Ordering::Relaxed)
    }

    /// The CQ's number on its device (as `softrdma info` shows it).
    pub fn id(&self) -> u32 {
        self.inner.id
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wc(id: u64) -> WorkCompletion {
        WorkCompletion {
            wr_id: id,
            ..Default::default()
        }
    }

    #[test]
    fn a_cancelled_notification_does_not_fire_and_a_fired_one_reports_it() {
        let cq = CompletionQueue::new(1, 8).unwrap();
        // Armed, then withdrawn: a completion after that rings nothing.
        cq.req_notify(false);
        assert!(!cq.cancel_notify(), "nothing had fired yet");
        cq.inner.push(wc(1));
        assert_eq!(cq.ack_events(), 0, "a withdrawn notification fired");
        assert_eq!(cq.poll_one().map(|w| w.wr_id), Some(1));
        // Armed, then a completion: cancel says it fired, the fd holds it.
        cq.req_notify(false);
        cq.inner.push(wc(2));
        assert!(cq.cancel_notify(), "the notification fired");
        assert_eq!(cq.ack_events(), 1);
        // Not armed at all: cancel reports "fired or not armed" as true,
        // and there is nothing to acknowledge.
        assert!(cq.cancel_notify(), "not armed reads as fired");
        cq.inner.push(wc(3));
        assert_eq!(cq.ack_events(), 0);
    }

    #[test]
    fn req_notify_fires_for_queued_completions_and_req_notify_next_does_not() {
        let cq = CompletionQueue::new(1, 8).unwrap();
        cq.inner.push(wc(1));
        cq.req_notify_next(false);
        assert_eq!(cq.ack_events(), 0, "fired for a completion already queued");
        cq.inner.push(wc(2));
        assert_eq!(cq.ack_events(), 1, "the next completion did not fire");
        cq.inner.push(wc(3));
        assert_eq!(cq.ack_events(), 0, "fired twice for one arming");
        cq.req_notify(false);
        assert_eq!(cq.ack_events(), 1, "req_notify fires for queued ones");
        // Solicited-only: an unsolicited success does not fire it.
        cq.req_notify_next(true);
        cq.inner.push(wc(4));
        assert_eq!(cq.ack_events(), 0);
        cq.inner.push(WorkCompletion {
            solicited: true,
            ..wc(5)
        });
        assert_eq!(cq.ack_events(), 1);
    }
}
