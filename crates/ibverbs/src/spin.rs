//! A thread that spins on `ibv_poll_cq` does the engine's work.
//!
//! perftest and many RDMA applications poll their CQs in a loop, often in
//! both processes (perftest's `-R` write server spins on its control
//! connection's CQ while the data arrives on another QP). A spinning thread
//! holds a core; left idle there, it starves the progress threads that
//! place the data (on two cores a write_bw pair ran at a third of the
//! bench's speed). So an empty poll takes a lease: every QP of the process
//! goes into the engine's busy-poll mode and the polling thread runs their
//! receivers (`QueuePair::progress`); the progress threads then leave the
//! input alone and only finish blocked transmissions and notice hang-ups.
//!
//! The lease must not outlive the spinning, or input would wait for a
//! `progress` nobody calls. It ends when the application arms a CQ
//! (`ibv_req_notify_cq`: it is about to sleep on a channel) and, failing
//! that, when no thread polled an empty CQ for [`LEASE`]: the event thread
//! looks that often while a lease is held ([`release_if_stale`]). Ending
//! it hands each QP back with `set_busy_poll(false)`, which also reads what
//! arrived meanwhile (tests/dropin.rs and verbs' same_host tests).
//!
//! A thread that has spun without a completion for [`idle_after`] (1 ms;
//! `SOFTRDMA_SPIN_IDLE_US`, 0 for never) waits in the kernel for input on
//! the QPs' sockets, up to [`IDLE_WAIT`] a time, before it drives them:
//! perftest's write server spins for the whole test on a CQ that gets no
//! completion while the data streams in, and its asking the socket
//! hundreds of thousands of times a second made the sender on the other
//! core pay for every packet it queued there (loopback runs the
//! receiver's TCP work in the sender's `sendmsg`): `ib_write_bw` at
//! 64 KiB ran at 3.0 GB/s, with the wait 4.4 GB/s (BENCHMARKS.md). Over
//! the same-host ring the thread keeps spinning. A completion that no
//! input brings (a blocked transmission finished by a progress thread)
//! waits at most [`IDLE_WAIT`] more, and only after [`idle_after`] of none.

use parking_lot::RwLock;
use softrdma_verbs::QueuePair;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

/// The QPs by number, shared by the snapshot's readers.
type Qps = Arc<Vec<(u32, Weak<QueuePair>)>>;

/// How long a lease lasts without an empty poll.
pub const LEASE: Duration = Duration::from_millis(1);

/// The longest an idle spinning thread waits in the kernel for input at a
/// time: under [`LEASE`], so the lease never lapses while it waits.
pub const IDLE_WAIT: Duration = Duration::from_micros(250);

/// How long a thread spins without a completion before it waits for input
/// (`SOFTRDMA_SPIN_IDLE_US`, default 1,000; 0: spin always). `None`: never.
pub fn idle_after() -> Option<Duration> {
    static V: OnceLock<Option<Duration>> = OnceLock::new();
    *V.get_or_init(|| {
        let us = std::env::var("SOFTRDMA_SPIN_IDLE_US")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .unwrap_or(1_000);
        (us > 0).then(|| Duration::from_micros(us))
    })
}

/// The process's QPs as the spinning thread sees them, and its lease.
#[derive(Default)]
pub struct Spin {
    /// A snapshot replaced on create and destroy, so an empty poll takes
    /// no lock but a read lock and allocates nothing.
    qps: RwLock<Qps>,
    held: AtomicBool,
    /// Microseconds since `epoch()` of the last empty poll.
    last: AtomicU64,
    /// Off with `SOFTRDMA_SPIN=0`.
    off: OnceLock<bool>,
}

fn epoch() -> Instant {
    static E: OnceLock<Instant> = OnceLock::new();
    *E.get_or_init(Instant::now)
}

/// Microseconds since the first call in the process (a cheap clock for
/// this module, `cork` and `verbs_cq`).
pub fn now_us() -> u64 {
    epoch().elapsed().as_micros() as u64
}

impl Spin {
    fn off(&self) -> bool {
        *self
            .off
            .get_or_init(|| std::env::var("SOFTRDMA_SPIN").is_ok_and(|v| v == "0"))
    }

    /// A QP the application made.
    pub fn add(&self, qpn: u32, qp: &Arc<QueuePair>) {
        let mut g = self.qps.write();
        let mut v = g.as_ref().clone();
        v.push((qpn, Arc::downgrade(qp)));
        *g = Arc::new(v);
    }

    /// A QP the application destroyed.
    pub fn remove(&self, qpn: u32) {
        let mut g = self.qps.write();
        let mut v = g.as_ref().clone();
        v.retain(|(n, _)| *n != qpn);
        *g = Arc::new(v);
    }

    /// Whether a lease is held (the event thread then looks every
    /// [`LEASE`]).
    pub fn held(&self) -> bool {
        self.held.load(Ordering::Acquire)
    }

    /// An empty poll: take or renew the lease and run every QP's receiver
    /// on this thread; `idle` (no completion for [`idle_after`]): first
    /// wait up to [`IDLE_WAIT`] for input.
    pub fn drive(&self, idle: bool) {
        if self.off() {
            return;
        }
        self.last.store(now_us(), Ordering::Release);
        let qps = self.qps.read().clone();
        if idle && self.held() {
            // Then every receiver runs, input or not: one may hold staged
            // bytes that the socket no longer shows (a receiver that
            // stopped at its budget, one resumed after a pause).
            let live = qps.iter().filter_map(|(_, w)| w.upgrade());
            QueuePair::wait_input_any(live, IDLE_WAIT);
            self.last.store(now_us(), Ordering::Release);
        }
        for q in qps.iter().filter_map(|(_, w)| w.upgrade()) {
            if !q.is_busy_poll() {
                // Fails for a QP not connected yet: nothing to drive.
                let _ = q.set_busy_poll(true);
            }
            q.progress();
        }
        // After the QPs went busy, so that a concurrent `release` (which
        // clears the flag first, then the QPs) never leaves a QP busy with
        // the flag clear: the event thread would not look again.
        self.held.store(true, Ordering::Release);
    }

    /// Ends the lease: every QP's input goes back to the progress threads.
    pub fn release(&self) {
        if self.held.swap(false, Ordering::AcqRel) {
            let qps = self.qps.read().clone();
            for q in qps.iter().filter_map(|(_, w)| w.upgrade()) {
                if q.is_busy_poll() {
                    let _ = q.set_busy_poll(false);
                }
            }
        }
    }

    /// [`Spin::release`] if no thread polled an empty CQ for [`LEASE`].
    pub fn release_if_stale(&self) {
        let idle = now_us().saturating_sub(self.last.load(Ordering::Acquire));
        if self.held() && idle > LEASE.as_micros() as u64 {
            self.release();
        }
    }
}
