//! Waiting on descriptors: the eventfd doorbell, epoll, and `poll` for
//! one socket or a few. Every `unsafe` block carries a `// SAFETY:` comment.

use super::cvt;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

/// An eventfd used as a doorbell / notification channel.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    pub fn new() -> io::Result<EventFd> {
        // SAFETY: eventfd has no pointer arguments; the returned descriptor is
        // owned by the OwnedFd from here on.
        let fd = cvt(unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) })?;
        // SAFETY: fd is a fresh, valid descriptor nobody else owns.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live local to a valid eventfd.
        unsafe {
            libc::write(
                self.0.as_raw_fd(),
                &one as *const u64 as *const libc::c_void,
                8,
            );
        }
    }

    /// Drains the counter; returns its value (0 if it was not signalled).
    pub fn drain(&self) -> u64 {
        let mut v: u64 = 0;
        // SAFETY: reads 8 bytes into a live local from a valid eventfd.
        let r = unsafe {
            libc::read(
                self.0.as_raw_fd(),
                &mut v as *mut u64 as *mut libc::c_void,
                8,
            )
        };
        if r == 8 {
            v
        } else {
            0
        }
    }

    /// Blocks until signalled or the timeout passes; drains the counter.
    pub fn wait(&self, timeout: Option<std::time::Duration>) -> bool {
        let mut p = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.map_or(-1, |d| d.as_millis().min(i32::MAX as u128) as i32);
        // SAFETY: p is a valid pollfd array of length 1.
        let r = unsafe { libc::poll(&mut p, 1, ms) };
        r > 0 && self.drain() > 0
    }
}

impl AsRawFd for EventFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// An epoll instance.
#[derive(Debug)]
pub struct Epoll(OwnedFd);

pub const EV_IN: u32 = libc::EPOLLIN as u32;
pub const EV_OUT: u32 = libc::EPOLLOUT as u32;
pub const EV_ERR: u32 = (libc::EPOLLERR | libc::EPOLLHUP | libc::EPOLLRDHUP) as u32;

impl Epoll {
    pub fn new() -> io::Result<Epoll> {
        // SAFETY: no pointer arguments; the descriptor is owned from here on.
        let fd = cvt(unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) })?;
        // SAFETY: fd is a fresh, valid descriptor nobody else owns.
        Ok(Epoll(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    fn ctl(&self, op: libc::c_int, fd: RawFd, events: u32, data: u64) -> io::Result<()> {
        let mut ev = libc::epoll_event { events, u64: data };
        // SAFETY: ev is a valid epoll_event for the duration of the call.
        cvt(unsafe { libc::epoll_ctl(self.0.as_raw_fd(), op, fd, &mut ev) })?;
        Ok(())
    }

    pub fn add(&self, fd: RawFd, events: u32, data: u64) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_ADD, fd, events, data)
    }

    pub fn modify(&self, fd: RawFd, events: u32, data: u64) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_MOD, fd, events, data)
    }

    pub fn delete(&self, fd: RawFd) -> io::Result<()> {
        self.ctl(libc::EPOLL_CTL_DEL, fd, 0, 0)
    }

    /// Waits for events; returns (events, data) pairs in `out`.
    pub fn wait(&self, out: &mut Vec<(u32, u64)>, max: usize, timeout_ms: i32) -> io::Result<()> {
        let mut evs: [libc::epoll_event; 128] = [libc::epoll_event { events: 0, u64: 0 }; 128];
        let max = max.min(evs.len());
        // SAFETY: evs has room for `max` events.
        let n = unsafe {
            libc::epoll_wait(self.0.as_raw_fd(), evs.as_mut_ptr(), max as i32, timeout_ms)
        };
        out.clear();
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(());
            }
            return Err(e);
        }
        for ev in &evs[..n as usize] {
            let (e, d) = (ev.events, ev.u64);
            out.push((e, d));
        }
        Ok(())
    }
}

/// Descriptors [`poll_any`] takes in a stack array; more (a thread
/// driving that many QPs) go in a `Vec`.
const POLL_STACK: usize = 32;

/// Waits up to `timeout` (`None`: no limit) until one of `fds` has one of
/// `events`, an error or a hang-up; whether one has (false also when a
/// signal interrupted the wait, and at once for no descriptor). `poll`
/// does not take a socket's lock. Up to [`POLL_STACK`] descriptors it
/// allocates nothing.
fn poll_any(
    fds: impl IntoIterator<Item = RawFd>,
    events: i16,
    timeout: Option<std::time::Duration>,
) -> bool {
    let entry = |fd| libc::pollfd {
        fd,
        events,
        revents: 0,
    };
    let mut stack = [entry(-1); POLL_STACK];
    let mut heap: Vec<libc::pollfd> = Vec::new();
    let mut n = 0;
    for fd in fds {
        if n < POLL_STACK {
            stack[n] = entry(fd);
        } else {
            if heap.is_empty() {
                heap.extend_from_slice(&stack);
            }
            heap.push(entry(fd));
        }
        n += 1;
    }
    let p: &mut [libc::pollfd] = if n <= POLL_STACK {
        &mut stack[..n]
    } else {
        &mut heap
    };
    if p.is_empty() {
        return false;
    }
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs() as libc::time_t,
        tv_nsec: t.subsec_nanos() as _,
    });
    let tsp = ts
        .as_ref()
        .map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: p is a valid pollfd array of its length, tsp null or a valid
    // timespec, and a null signal mask leaves the thread's as it is.
    unsafe { libc::ppoll(p.as_mut_ptr(), p.len() as _, tsp, std::ptr::null()) > 0 }
}

/// Blocks until `fd` can be written to (or has failed: the next write
/// says how).
pub fn wait_writable(fd: RawFd) {
    poll_any([fd], libc::POLLOUT, None);
}

/// Waits up to `timeout` until one of `fds` has input, an error or a
/// hang-up; whether one has (false at once for no descriptor).
pub fn wait_any_readable(
    fds: impl IntoIterator<Item = RawFd>,
    timeout: std::time::Duration,
) -> bool {
    poll_any(fds, libc::POLLIN, Some(timeout))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn poll_any_sees_the_readable_one_among_many() {
        // More than POLL_STACK descriptors (the Vec path) and a few (the
        // stack path); only the last one is signalled.
        for count in [3, POLL_STACK + 5] {
            let fds: Vec<EventFd> = (0..count).map(|_| EventFd::new().unwrap()).collect();
            let raw = || fds.iter().map(|f| f.as_raw_fd());
            assert!(
                !wait_any_readable(raw(), Duration::ZERO),
                "{count}: none yet"
            );
            fds[count - 1].signal();
            assert!(wait_any_readable(raw(), Duration::from_secs(5)), "{count}");
        }
        assert!(
            !wait_any_readable([], Duration::from_secs(5)),
            "no descriptor"
        );
    }
}
