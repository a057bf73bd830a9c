//! Application-driven input: one thread waits for input on several
//! busy-polled queue pairs (and for a [`Waker`] that its other event
//! sources ring), then runs their receivers itself. This takes the
//! progress thread off the path of every message: the sender's bytes (or,
//! over the same-host transport, its doorbell) wake the application's
//! thread directly.
//!
//! The loop an application runs:
//!
//! 1. `qp.progress()` on every QP that may have input (the tokens the last
//!    [`Poller::wait`] returned, plus any whose `progress` returned true),
//!    then poll the CQs;
//! 2. if nothing was there, [`QueuePair::arm_input`] on every QP (if one
//!    returns false, input is already waiting: go back to 1);
//! 3. [`Poller::wait`].

use crate::cq::CompletionQueue;
use crate::cq::WorkCompletion;
use crate::error::Result;
use crate::qp::QueuePair;
use crate::sys::{self, Epoll, EventFd};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Duration;

const WAKE: u64 = u64::MAX;

/// Waits for input on busy-polled queue pairs.
pub struct Poller {
    epoll: Epoll,
    wake: Arc<EventFd>,
    evs: parking_lot::Mutex<Vec<(u32, u64)>>,
}

/// Wakes a [`Poller::wait`] from any thread.
#[derive(Clone)]
pub struct Waker(Arc<EventFd>);

impl Waker {
    /// Makes the current or next [`Poller::wait`] return.
    pub fn wake(&self) {
        self.0.signal();
    }
}

impl Poller {
    /// Creates a poller with no QP in it.
    ///
    /// Fails with [`Error::Io`](crate::Error::Io) when the epoll or event descriptor cannot be created.
    pub fn new() -> Result<Poller> {
        let epoll = Epoll::new()?;
        let wake = Arc::new(EventFd::new()?);
        epoll.add(wake.as_raw_fd(), sys::EV_IN, WAKE)?;
        Ok(Poller {
            epoll,
            wake,
            evs: parking_lot::Mutex::new(Vec::new()),
        })
    }

    /// A handle that wakes this poller from another thread.
    pub fn waker(&self) -> Waker {
        Waker(self.wake.clone())
    }

    /// Watches `qp`'s input (it must be connected and in busy-poll mode);
    /// [`Poller::wait`] reports `token` when it may have some.
    pub fn add(&self, qp: &QueuePair, token: u64) -> Result<()> {
        assert_ne!(token, WAKE, "token u64::MAX is the waker's");
        let fd = qp
            .input_fd()
            .ok_or_else(|| crate::Error::inval("the QP is not connected"))?;
        self.epoll.add(fd, sys::EV_IN | sys::EV_ERR, token)?;
        Ok(())
    }

    /// Watches `cq`'s event descriptor: [`Poller::wait`] reports `token`
    /// once an armed notification fires ([`CompletionQueue::req_notify`];
    /// call [`CompletionQueue::ack_events`] after the wait).
    pub fn add_cq(&self, cq: &CompletionQueue, token: u64) -> Result<()> {
        assert_ne!(token, WAKE, "token u64::MAX is the waker's");
        self.epoll.add(cq.event_fd(), sys::EV_IN, token)?;
        Ok(())
    }

    /// Stops watching `qp`.
    pub fn remove(&self, qp: &QueuePair) {
        if let Some(fd) = qp.input_fd() {
            let _ = self.epoll.delete(fd);
        }
    }

    /// Sleeps until a watched QP may have input, the waker rang, or the
    /// timeout passed. Fills `ready` with the tokens of QPs that may have
    /// input; returns whether the waker rang. Arm the QPs first
    /// ([`QueuePair::arm_input`]).
    pub fn wait(&self, timeout: Duration, ready: &mut Vec<u64>) -> Result<bool> {
        ready.clear();
        let mut evs = self.evs.lock();
        let ms = timeout.as_millis().min(i32::MAX as u128) as i32;
        self.epoll.wait(&mut evs, 64, ms)?;
        let mut woken = false;
        for &(_, data) in evs.iter() {
            if data == WAKE {
                self.wake.drain();
                woken = true;
            } else {
                ready.push(data);
            }
        }
        Ok(woken)
    }
}

/// A blocking wait for completions in which the waiting thread runs its
/// queue pairs' receivers itself: the QPs are in busy-poll mode, and
/// [`DrivenCq::poll_wait`] sleeps in `epoll` on their input and on the
/// CQ's event descriptor, then handles what arrived. A Read Response or an
/// incoming Send thus wakes the thread that waits for its completion
/// directly, with no progress thread handing it over (one wake-up per
/// round trip instead of two), and nothing spins. The progress thread
/// still finishes transmissions that found the socket full; their
/// completions ring the CQ's descriptor.
pub struct DrivenCq {
    poller: Poller,
    cq: CompletionQueue,
    /// The QPs' engine state (a handle that does not keep the connection
    /// open: dropping a `QueuePair` still closes it).
    qps: Vec<Arc<crate::engine::QpInner>>,
    /// Serialises waiters (one thread at a time runs the receivers) and
    /// holds the poller's scratch list of woken tokens, which is not read:
    /// every QP's receiver runs after a wake-up anyway.
    wait_lock: parking_lot::Mutex<Vec<u64>>,
}

/// The CQ's token in a [`DrivenCq`]'s poller (QPs are numbered from 0).
const CQ_TOKEN: u64 = u64::MAX - 1;

impl DrivenCq {
    /// Puts `qps` (connected, with their completions on `cq`) in busy-poll
    /// mode and watches them. Only the thread calling
    /// [`DrivenCq::poll_wait`] runs their input from now on.
    pub fn new(cq: &CompletionQueue, qps: &[QueuePair]) -> Result<DrivenCq> {
        let poller = Poller::new()?;
        poller.add_cq(cq, CQ_TOKEN)?;
        for (i, qp) in qps.iter().enumerate() {
            qp.set_busy_poll(true)?;
            poller.add(qp, i as u64)?;
        }
        Ok(DrivenCq {
            poller,
            cq: cq.clone(),
            qps: qps.iter().map(|q| q.inner.clone()).collect(),
            wait_lock: parking_lot::Mutex::new(Vec::new()),
        })
    }

    /// Runs the QPs' receivers, then takes up to `out.len()` completions;
    /// sleeps until input or a completion comes if there are none, up to
    /// `timeout`. Returns how many completions it took (0: timed out).
    pub fn poll_wait(&self, out: &mut [WorkCompletion], timeout: Duration) -> usize {
        let deadline = std::time::Instant::now() + timeout;
        let mut woken = self.wait_lock.lock();
        loop {
            let mut more = false;
            for qp in &self.qps {
                more |= qp.on_readable(crate::engine::RX_BUDGET);
            }
            let n = self.cq.poll(out);
            if n > 0 {
                return n;
            }
            if more {
                continue;
            }
            let now = std::time::Instant::now();
            if now >= deadline {
                return 0;
            }
            // Arm everything, then look once more: what came meanwhile
            // must not be slept through.
            self.cq.req_notify(false);
            let mut armed = self.cq.is_empty();
            for qp in &self.qps {
                armed &= qp
                    .transport
                    .get()
                    .and_then(|t| t.as_any().downcast_ref::<crate::iwarp::Conn>())
                    .is_none_or(|c| c.arm_input());
            }
            if armed {
                if let Err(e) = self.poller.wait(deadline - now, &mut woken) {
                    tracing::warn!(error = %e, "waiting for input failed");
                }
            }
            // Our own completions must not ring the descriptor from here.
            if self.cq.cancel_notify() {
                self.cq.ack_events();
            }
        }
    }
}
