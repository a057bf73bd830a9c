//! Timers of the progress threads (`progress.rs`): per thread, a list of
//! deadlines `(when, qpn)` and the event that wakes the thread. A leaf, so
//! any code holding a QP can set one without knowing the threads.

use crate::sys::EventFd;
use std::sync::Arc;
use std::time::Instant;

/// A progress thread's timers: deadlines of its QPs `(when, qpn)` (a
/// responder's hold, a paused receiver's stall check, a receiver to run
/// again) and the event that wakes the thread to look at them. Kept in the
/// device's `Core` (one per thread), so any code holding a QP can set one.
pub(crate) struct TimerQueue {
    pub(crate) list: parking_lot::Mutex<Vec<(Instant, u32)>>,
    pub(crate) wake: Arc<EventFd>,
}

impl TimerQueue {
    pub fn new() -> std::io::Result<TimerQueue> {
        Ok(TimerQueue {
            list: parking_lot::Mutex::new(Vec::new()),
            wake: Arc::new(EventFd::new()?),
        })
    }
}

/// Has the progress thread that owns `qpn` (of the device whose timer
/// queues are `timers`) call `iwarp::on_timer` for it once `at` has passed.
pub(crate) fn add(timers: &[TimerQueue], qpn: u32, at: Instant) {
    let t = &timers[qpn as usize % timers.len()];
    t.list.lock().push((at, qpn));
    t.wake.signal();
}
