//! Thin, audited wrappers around the Linux system calls the engine uses:
//! epoll, eventfd, and socket I/O to and from raw memory (the placement
//! path). Every `unsafe` block here carries a `// SAFETY:` comment.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

fn cvt(r: libc::c_int) -> io::Result<libc::c_int> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r)
    }
}

fn cvt_size(r: libc::ssize_t) -> io::Result<usize> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(r as usize)
    }
}

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

/// One piece of memory to send from or receive into.
#[derive(Clone, Copy, Debug)]
pub struct RawSpan {
    pub ptr: *mut u8,
    pub len: usize,
}

// SAFETY: a RawSpan is only an address range; whoever dereferences it must
// hold the registration that keeps the memory alive (see mr.rs).
unsafe impl Send for RawSpan {}
unsafe impl Sync for RawSpan {}

/// `sendmsg` of a list of spans, non-blocking, without SIGPIPE. With `eor`
/// the call passes `MSG_EOR`: TCP appends nothing further to the segment
/// buffer that ends with these bytes, so the next write starts a new
/// segment (MPA's FPDU alignment).
///
/// # Safety
/// Every span must be readable memory that stays valid during the call.
pub unsafe fn send_spans(fd: RawFd, spans: &[RawSpan], eor: bool) -> io::Result<usize> {
    let mut iov: [libc::iovec; 64] = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 64];
    let n = spans.len().min(iov.len());
    for (i, s) in spans[..n].iter().enumerate() {
        iov[i] = libc::iovec {
            iov_base: s.ptr as *mut libc::c_void,
            iov_len: s.len,
        };
    }
    // SAFETY: msghdr is zero-initialised (a valid empty header), then given a
    // pointer to `n` initialised iovecs that live across the call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = n as _;
    // SAFETY: the caller guarantees every span is valid readable memory.
    let flags = libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT | if eor { libc::MSG_EOR } else { 0 };
    cvt_size(unsafe { libc::sendmsg(fd, &msg, flags) })
}

/// The connection's maximum segment size (`TCP_MAXSEG`), or `None`.
pub fn tcp_mss(fd: RawFd) -> Option<usize> {
    let mut v: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    // SAFETY: v and len are valid for writes of the sizes given.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_TCP,
            libc::TCP_MAXSEG,
            &mut v as *mut libc::c_int as *mut libc::c_void,
            &mut len,
        )
    };
    (r == 0 && v > 0).then_some(v as usize)
}

/// `recvmsg` into a list of spans (direct data placement), non-blocking.
/// Returns Ok(0) at end of stream.
///
/// # Safety
/// Every span must be writable memory that stays valid during the call and
/// that no one else reads or writes as a Rust reference meanwhile.
pub unsafe fn recv_spans(fd: RawFd, spans: &[RawSpan]) -> io::Result<usize> {
    let mut iov: [libc::iovec; 16] = [libc::iovec {
        iov_base: std::ptr::null_mut(),
        iov_len: 0,
    }; 16];
    let n = spans.len().min(iov.len());
    for (i, s) in spans[..n].iter().enumerate() {
        iov[i] = libc::iovec {
            iov_base: s.ptr as *mut libc::c_void,
            iov_len: s.len,
        };
    }
    // SAFETY: as in send_spans.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = iov.as_mut_ptr();
    msg.msg_iovlen = n as _;
    // SAFETY: the caller guarantees every span is valid writable memory.
    cvt_size(unsafe { libc::recvmsg(fd, &mut msg, libc::MSG_DONTWAIT) })
}

/// Plain non-blocking recv into a byte slice.
pub fn recv_into(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is a valid writable slice for its whole length.
    cvt_size(unsafe {
        libc::recv(
            fd,
            buf.as_mut_ptr() as *mut libc::c_void,
            buf.len(),
            libc::MSG_DONTWAIT,
        )
    })
}

/// Shuts down a socket in both directions (wakes up any poller).
pub fn shutdown(fd: RawFd) {
    // SAFETY: no pointer arguments.
    unsafe {
        libc::shutdown(fd, libc::SHUT_RDWR);
    }
}

pub fn page_size() -> usize {
    // SAFETY: sysconf has no pointer arguments.
    let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if p > 0 {
        p as usize
    } else {
        4096
    }
}
