//! Progress threads: a small fixed set per device (like a NIC's engines),
//! each running an epoll loop over the connections of the QPs assigned to
//! it. Receive processing and blocked transmissions happen here.

use crate::device::Core;
use crate::sys::{self, Epoll, EventFd};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

const WAKE: u64 = u64::MAX;

/// A progress thread's timers: deadlines of its QPs `(when, qpn)` (a
/// responder's hold, a paused receiver's stall check, a receiver to run
/// again) and the event that wakes the thread to look at them. Kept in the
/// device's `Core` (one per thread), so any code holding a QP can set one.
pub(crate) struct TimerQueue {
    list: parking_lot::Mutex<Vec<(Instant, u32)>>,
    wake: Arc<EventFd>,
}

impl TimerQueue {
    pub fn new() -> std::io::Result<TimerQueue> {
        Ok(TimerQueue {
            list: parking_lot::Mutex::new(Vec::new()),
            wake: Arc::new(EventFd::new()?),
        })
    }
}

/// Calls `iwarp::on_timer` for `qpn` (on its progress thread) once `at`
/// has passed.
pub(crate) fn add_timer(core: &Core, qpn: u32, at: Instant) {
    let t = &core.timers[qpn as usize % core.timers.len()];
    t.list.lock().push((at, qpn));
    t.wake.signal();
}

pub(crate) struct Progress {
    pub epoll: Arc<Epoll>,
    wake: Arc<EventFd>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Progress {
    pub fn start(core: Arc<Core>, idx: usize) -> std::io::Result<Progress> {
        let epoll = Arc::new(Epoll::new()?);
        let wake = core.timers[idx].wake.clone();
        epoll.add(wake.as_raw_fd(), sys::EV_IN, WAKE)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (e, w, s) = (epoll.clone(), wake.clone(), stop.clone());
        let handle = std::thread::Builder::new()
            .name(format!("softrdma-progress-{idx}"))
            .spawn(move || run(core, idx, e, w, s))?;
        Ok(Progress {
            epoll,
            wake,
            stop,
            handle: Some(handle),
        })
    }

    pub fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake.signal();
    }

    pub fn join(&mut self) {
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn run(core: Arc<Core>, idx: usize, epoll: Arc<Epoll>, wake: Arc<EventFd>, stop: Arc<AtomicBool>) {
    let timers = &core.timers[idx].list;
    let mut evs = Vec::with_capacity(128);
    // QPs whose receiver stopped at its budget. It may have read bytes
    // ahead from the socket into its stage, which epoll cannot see, so
    // they run again before this thread sleeps (a lost wake-up otherwise:
    // the socket empty, a whole FPDU waiting in the stage).
    let mut more: Vec<u32> = Vec::new();
    loop {
        let next_timer = timers.lock().iter().map(|t| t.0).min();
        let timeout = if !more.is_empty() {
            0
        } else {
            match next_timer {
                // Rounded up: never wake before the deadline.
                Some(at) => at
                    .saturating_duration_since(Instant::now())
                    .as_micros()
                    .div_ceil(1000)
                    .min(60_000) as i32,
                None => -1,
            }
        };
        if let Err(e) = epoll.wait(&mut evs, 128, timeout) {
            tracing::error!(error = %e, "epoll_wait failed; progress thread stops");
            return;
        }
        if next_timer.is_some() {
            let now = Instant::now();
            let due: Vec<u32> = {
                let mut t = timers.lock();
                let due = t.iter().filter(|x| x.0 <= now).map(|x| x.1).collect();
                t.retain(|x| x.0 > now);
                due
            };
            for qpn in due {
                if let Some(qp) = core.qp(qpn) {
                    crate::iwarp::on_timer(&qp);
                }
            }
        }
        for qpn in std::mem::take(&mut more) {
            if let Some(qp) = core.qp(qpn) {
                if crate::iwarp::on_readable(&qp, crate::iwarp::RX_BUDGET) {
                    more.push(qpn);
                }
            }
        }
        for &(ev, data) in &evs {
            if data == WAKE {
                wake.drain();
                if stop.load(Ordering::Acquire) {
                    return;
                }
                continue;
            }
            let Some(qp) = core.qp(data as u32) else {
                continue;
            };
            if ev & (sys::EV_IN | sys::EV_ERR) != 0
                && crate::iwarp::on_readable(&qp, crate::iwarp::RX_BUDGET)
                && !more.contains(&(data as u32))
            {
                more.push(data as u32);
            }
            if ev & sys::EV_OUT != 0 {
                crate::iwarp::on_writable(&qp);
            }
        }
    }
}
