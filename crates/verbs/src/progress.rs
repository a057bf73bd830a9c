//! Progress threads: a small fixed set per device (like a NIC's engines),
//! each running an epoll loop over the connections of the QPs assigned to
//! it. Receive processing and blocked transmissions happen here.

use crate::device::Core;
use crate::sys::{self, Epoll, EventFd};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

const WAKE: u64 = u64::MAX;

pub(crate) struct Progress {
    pub epoll: Arc<Epoll>,
    wake: Arc<EventFd>,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
}

impl Progress {
    pub fn start(core: Arc<Core>, idx: usize) -> std::io::Result<Progress> {
        let epoll = Arc::new(Epoll::new()?);
        let wake = Arc::new(EventFd::new()?);
        epoll.add(wake.as_raw_fd(), sys::EV_IN, WAKE)?;
        let stop = Arc::new(AtomicBool::new(false));
        let (e, w, s) = (epoll.clone(), wake.clone(), stop.clone());
        let handle = std::thread::Builder::new()
            .name(format!("softrdma-progress-{idx}"))
            .spawn(move || run(core, e, w, s))?;
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

fn run(core: Arc<Core>, epoll: Arc<Epoll>, wake: Arc<EventFd>, stop: Arc<AtomicBool>) {
    let mut evs = Vec::with_capacity(128);
    loop {
        if let Err(e) = epoll.wait(&mut evs, 128, -1) {
            tracing::error!(error = %e, "epoll_wait failed; progress thread stops");
            return;
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
            if ev & (sys::EV_IN | sys::EV_ERR) != 0 {
                crate::iwarp::on_readable(&qp, crate::iwarp::RX_BUDGET);
            }
            if ev & sys::EV_OUT != 0 {
                crate::iwarp::on_writable(&qp);
            }
        }
    }
}
