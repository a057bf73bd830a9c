//! Progress threads: a small fixed set per device (like a NIC's engines),
//! each running an epoll loop over the connections of the QPs assigned to
//! it. Receive processing and blocked transmissions happen here.

use crate::sys::{self, Epoll, EventFd};
use crate::timers::TimerQueue;
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Instant;

const WAKE: u64 = u64::MAX;

/// What a progress thread serves: its timer queue and the QPs its epoll
/// reports (by number). The device implements it over its QPs and the
/// iWARP driver entry points; the loop itself knows neither.
pub(crate) trait Host: Send + Sync + 'static {
    fn timers(&self, idx: usize) -> &TimerQueue;
    /// A timer of `qpn` ran out.
    fn on_timer(&self, qpn: u32);
    /// Input (or an error) on `qpn`'s connection; true: the receiver
    /// stopped at its budget and must run again before the thread sleeps.
    fn on_readable(&self, qpn: u32) -> bool;
    /// Room to send on `qpn`'s connection.
    fn on_writable(&self, qpn: u32);
}

pub(crate) struct Progress {
    pub epoll: Arc<Epoll>,
    wake: Arc<EventFd>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Progress {
    pub fn start<H: Host>(core: Arc<H>, idx: usize) -> std::io::Result<Progress> {
        let epoll = Arc::new(Epoll::new()?);
        let wake = core.timers(idx).wake.clone();
        epoll.add(wake.as_raw_fd(), sys::EV_IN, WAKE)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (e, w, s) = (epoll.clone(), wake.clone(), stop.clone());
        let handle = crate::threads::spawn(format!("softrdma-progress-{idx}"), move || {
            run(core, idx, e, w, s)
        })?;
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

fn run<H: Host>(
    core: Arc<H>,
    idx: usize,
    epoll: Arc<Epoll>,
    wake: Arc<EventFd>,
    stop: Arc<AtomicBool>,
) {
    let timers = &core.timers(idx).list;
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
                core.on_timer(qpn);
            }
        }
        for qpn in std::mem::take(&mut more) {
            if core.on_readable(qpn) {
                more.push(qpn);
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
            let qpn = data as u32;
            if ev & (sys::EV_IN | sys::EV_ERR) != 0 && core.on_readable(qpn) && !more.contains(&qpn)
            {
                more.push(qpn);
            }
            if ev & sys::EV_OUT != 0 {
                core.on_writable(qpn);
            }
        }
    }
}
