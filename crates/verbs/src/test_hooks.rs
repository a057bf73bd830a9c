//! Pause points for tests of races between the engine's threads (not part
//! of the API: hidden, and inert unless a test arms one).
//!
//! [`pause_receiver`] makes the next receiver run on a QP stop right after
//! its first closed-check and before it takes the receive lock, until the
//! test calls [`Paused::release`]. That is the window of issue 20, item 6:
//! `QpInner::fail` could close the connection and flush the receive in
//! progress there, and the receiver then placed bytes into the flushed
//! buffer. A disarmed hook costs one relaxed atomic load per receiver run.
//!
//! [`pause_placement`] stops the next placement of payload bytes on a QP
//! after it entered its caller-owned target regions and before it copies:
//! the window in which deregistering such memory must wait (issue 19).
//!
//! A hook names its QP by identity, not by number (QP numbers restart at 1
//! on every device, and tests run devices side by side in one process),
//! and one hook is armed at a time in a process: arming waits until the
//! previous [`Paused`] is dropped.

use crate::engine::QpInner;
use parking_lot::{Condvar, Mutex, MutexGuard};
use std::sync::atomic::{AtomicU32, AtomicUsize, Ordering};
use std::time::Duration;

/// The QP (its engine state's address) whose receiver pauses (0: none).
static ARMED: AtomicUsize = AtomicUsize::new(0);
/// Held by the armed hook: one at a time in a process.
static ONE: Mutex<()> = Mutex::new(());
/// Which point is armed: 1 the receiver's entry, 2 a placement.
static POINT: AtomicU32 = AtomicU32::new(0);

#[derive(Default)]
struct Gate {
    reached: bool,
    released: bool,
}

static GATE: Mutex<Gate> = Mutex::new(Gate {
    reached: false,
    released: false,
});
static CHANGED: Condvar = Condvar::new();

/// An armed pause point (one at a time in a process).
pub struct Paused {
    _one: MutexGuard<'static, ()>,
}

/// The identity a hook knows a QP by.
fn id(q: &QpInner) -> usize {
    q as *const QpInner as usize
}

/// Arms the pause point for `qp`'s receiver.
pub fn pause_receiver(qp: &crate::QueuePair) -> Paused {
    arm(id(&qp.inner), 1)
}

/// Arms the pause point inside the next payload placement on `qp`.
pub fn pause_placement(qp: &crate::QueuePair) -> Paused {
    arm(id(&qp.inner), 2)
}

fn arm(qp: usize, point: u32) -> Paused {
    let one = ONE.lock();
    *GATE.lock() = Gate::default();
    POINT.store(point, Ordering::SeqCst);
    ARMED.store(qp, Ordering::SeqCst);
    Paused { _one: one }
}

impl Paused {
    /// Waits until the receiver has reached the pause point.
    pub fn wait_reached(&self, timeout: Duration) -> bool {
        let mut g = GATE.lock();
        let deadline = std::time::Instant::now() + timeout;
        while !g.reached {
            if CHANGED.wait_until(&mut g, deadline).timed_out() {
                return g.reached;
            }
        }
        true
    }

    /// Lets the receiver go on.
    pub fn release(self) {}
}

impl Drop for Paused {
    fn drop(&mut self) {
        ARMED.store(0, Ordering::SeqCst);
        GATE.lock().released = true;
        CHANGED.notify_all();
    }
}

/// Called by the receiver at its entry.
pub(crate) fn receiver_point(q: &QpInner) {
    point(id(q), 1)
}

/// Called by a placement, its regions entered, before it copies.
pub(crate) fn placement_point(q: &QpInner) {
    point(id(q), 2)
}

fn point(qp: usize, which: u32) {
    if ARMED.load(Ordering::Relaxed) != qp || POINT.load(Ordering::SeqCst) != which {
        return;
    }
    if ARMED
        .compare_exchange(qp, 0, Ordering::SeqCst, Ordering::SeqCst)
        .is_err()
    {
        return;
    }
    let mut g = GATE.lock();
    g.reached = true;
    CHANGED.notify_all();
    while !g.released {
        CHANGED.wait(&mut g);
    }
}
