//! Posts held for the application's next poll (a doorbell rung late).
//!
//! A post transmits on the caller's thread: one `sendmsg` per post. perftest
//! above 8 KiB asks for a completion per WR and posts one WR per completion
//! it reaps, so each 64 KiB Write went out in its own `sendmsg`, and on
//! loopback a `sendmsg` costs the sender the receiver's TCP work too: the
//! drop-in ran at half the rate of `softrdma bench`, whose batches share a
//! call (BENCHMARKS.md). Like TCP's autocork, a post that is sure to be
//! followed by more waits for them: when the QP's send CQ already holds
//! [`CORK_AFTER`] completions the application has not reaped, the
//! application is streaming (a latency-bound one reaps each completion
//! before it posts again), and it will poll for those completions soon. So
//! the post is queued without its doorbell (`QueuePair::post_send_held`)
//! and every held QP of the process is pushed ([`Cork::push_all`]) when any
//! thread polls a CQ, arms one, or waits on a channel. The posts made
//! between two polls then share one `sendmsg`.
//!
//! Nothing guarantees the poll, so the event thread pushes posts held
//! longer than [`CORK_MAX`] ([`Cork::tick`]); it looks that often while
//! holds happen, and is woken when they start. A post that transmits
//! (the CQ was nearly reaped) pushes what its QP held before it, so order
//! is kept. `SOFTRDMA_CORK=0` turns holding off.

use crate::spin::now_us;
use parking_lot::Mutex;
use softrdma_verbs::QueuePair;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// Unreaped completions on the send CQ above which a post is held.
pub const CORK_AFTER: usize = 16;

/// How long a post is held at most when the application does not poll.
pub const CORK_MAX: Duration = Duration::from_millis(1);

/// Bytes held at most (all QPs together): what one `sendmsg` is worth
/// batching. A larger post goes out at once (and pushes what was held
/// before it): holding megabytes gains nothing per call and overfills the
/// socket, leaving the rest to the progress thread.
pub const CORK_BYTES: u64 = 1 << 20;

/// The process's held QPs.
#[derive(Default)]
pub struct Cork {
    held: Mutex<Vec<Arc<QueuePair>>>,
    /// Whether `held` may be non-empty (the polls' fast path reads only
    /// this).
    any: AtomicBool,
    /// Payload bytes held (approximate: counted under `held`'s lock, cleared
    /// when pushed).
    bytes: AtomicU64,
    /// Microseconds (`spin::now_us`) when the oldest held post was held.
    since: AtomicU64,
    /// A post was held since the event thread last looked.
    recent: AtomicBool,
    /// The event thread looks every [`CORK_MAX`].
    ticking: AtomicBool,
    /// Off with `SOFTRDMA_CORK=0`.
    off: OnceLock<bool>,
}

impl Cork {
    /// Whether a post of `bytes` to a QP whose send CQ holds `unreaped`
    /// completions should be held.
    pub fn wants(&self, unreaped: usize, bytes: u64) -> bool {
        unreaped >= CORK_AFTER
            && self.bytes.load(Ordering::Relaxed).saturating_add(bytes) < CORK_BYTES
            && !*self
                .off
                .get_or_init(|| std::env::var("SOFTRDMA_CORK").is_ok_and(|v| v == "0"))
    }

    /// `qp` holds posts of `bytes` (`QueuePair::post_send_held`
    /// succeeded). Returns true when the event thread must be woken to
    /// start looking.
    #[must_use]
    pub fn hold(&self, qp: &Arc<QueuePair>, bytes: u64) -> bool {
        let mut g = self.held.lock();
        if !g.iter().any(|q| Arc::ptr_eq(q, qp)) {
            g.push(qp.clone());
        }
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
        if !self.any.swap(true, Ordering::SeqCst) {
            self.since.store(now_us(), Ordering::Release);
        }
        drop(g);
        self.recent.store(true, Ordering::Release);
        !self.ticking.swap(true, Ordering::SeqCst)
    }

    /// Whether the event thread should look every [`CORK_MAX`].
    pub fn ticking(&self) -> bool {
        self.ticking.load(Ordering::Acquire)
    }

    /// Transmits every held post of the process.
    pub fn push_all(&self) {
        if !self.any.load(Ordering::Acquire) {
            return;
        }
        let qps = {
            let mut g = self.held.lock();
            self.any.store(false, Ordering::SeqCst);
            self.bytes.store(0, Ordering::Relaxed);
            std::mem::take(&mut *g)
        };
        for q in qps {
            q.push();
        }
    }

    /// The event thread's look: pushes posts held longer than
    /// [`CORK_MAX`]; stops ticking after a period without holds.
    pub fn tick(&self) {
        if self.any.load(Ordering::SeqCst) {
            let age = now_us().saturating_sub(self.since.load(Ordering::Acquire));
            if age >= CORK_MAX.as_micros() as u64 {
                self.push_all();
            }
            return;
        }
        if self.recent.swap(false, Ordering::AcqRel) || !self.ticking() {
            return;
        }
        self.ticking.store(false, Ordering::SeqCst);
        // A hold that saw `ticking` still set did not wake us: look again.
        if self.any.load(Ordering::SeqCst) {
            self.ticking.store(true, Ordering::SeqCst);
        }
    }
}
