//! Completion queues and completion channels.
//!
//! A completion channel's fd is an epoll instance over the event fds of
//! the CQs bound to it (each with the CQ's address as its data): the
//! application can poll or epoll it like the kernel's, and
//! `ibv_get_cq_event` learns from `epoll_wait` which CQ fired, then
//! consumes that CQ's event fd. Blocking or not follows the fd's own
//! `O_NONBLOCK`, which the application may set with `fcntl`.

use crate::abi::*;
use crate::objects::{channel_of, cq_of, ctx_of, AsyncEv, Channel, Cq};
use libc::{c_int, c_uint, c_void};
use softrdma_cabi::{export, guard, guard_errno, guard_ptr, set_errno};
use softrdma_verbs::WorkCompletion;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::Ordering;

export!("IBVERBS_1.0": ibv_create_comp_channel, ibv_destroy_comp_channel);
export!("IBVERBS_1.1": ibv_create_cq, ibv_destroy_cq, ibv_get_cq_event, ibv_ack_cq_events,
    ibv_resize_cq);

fn last_errno() -> c_int {
    std::io::Error::last_os_error()
        .raw_os_error()
        .unwrap_or(libc::EIO)
}

#[no_mangle]
pub extern "C" fn ibv_create_comp_channel(c: *mut ibv_context) -> *mut ibv_comp_channel {
    guard_ptr(|| {
        // SAFETY: the caller's context.
        if unsafe { ctx_of(c) }.is_none() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: no memory arguments.
        let fd = unsafe { libc::epoll_create1(libc::EPOLL_CLOEXEC) };
        if fd < 0 {
            set_errno(last_errno());
            return std::ptr::null_mut();
        }
        // SAFETY: just created, owned by nobody else.
        let ep = unsafe { OwnedFd::from_raw_fd(fd) };
        let ch = Box::new(Channel {
            ibv: ibv_comp_channel {
                context: c,
                fd,
                refcnt: 0,
            },
            ep,
        });
        Box::into_raw(ch).cast()
    })
}

#[no_mangle]
pub extern "C" fn ibv_destroy_comp_channel(ch: *mut ibv_comp_channel) -> c_int {
    guard_errno(|| {
        // SAFETY: the caller's channel.
        let Some(c) = (unsafe { channel_of(ch) }) else {
            return libc::EINVAL;
        };
        if c.ibv.refcnt > 0 {
            // CQs still use it: the kernel's answer.
            return libc::EBUSY;
        }
        // SAFETY: the Box leaked by `ibv_create_comp_channel`, given back.
        drop(unsafe { Box::from_raw(ch.cast::<Channel>()) });
        0
    })
}

#[no_mangle]
pub extern "C" fn ibv_create_cq(
    c: *mut ibv_context,
    cqe: c_int,
    cq_context: *mut c_void,
    ch: *mut ibv_comp_channel,
    _vector: c_int,
) -> *mut ibv_cq {
    guard_ptr(|| {
        // SAFETY: the caller's context.
        let Some(ctx) = (unsafe { ctx_of(c) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        let max = ctx.rt.dev.attr().max_cqe;
        if cqe <= 0 || cqe as u32 > max {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        let cq = match ctx.rt.dev.create_cq(cqe as usize) {
            Ok(cq) => cq,
            Err(e) => {
                set_errno(crate::errno::of(&e));
                return std::ptr::null_mut();
            }
        };
        // SAFETY: plain data (pthread objects zeroed are their
        // initializers on glibc); all zeroes is valid.
        let mut ibv: ibv_cq = unsafe { std::mem::zeroed() };
        ibv.context = c;
        ibv.channel = ch;
        ibv.cq_context = cq_context;
        ibv.handle = cq.id();
        ibv.cqe = cqe;
        let b = Box::into_raw(Box::new(Cq {
            ibv,
            cq,
            overrun_said: Default::default(),
        }));
        // SAFETY: the caller's channel, if any.
        if let Some(chan) = unsafe { channel_of(ch) } {
            let mut ev = libc::epoll_event {
                events: libc::EPOLLIN as u32,
                u64: b as u64,
            };
            // SAFETY: `b` was just made.
            let efd = unsafe { (*b).cq.event_fd() };
            // SAFETY: a valid epoll fd, event fd and event.
            let r =
                unsafe { libc::epoll_ctl(chan.ep.as_raw_fd(), libc::EPOLL_CTL_ADD, efd, &mut ev) };
            if r != 0 {
                let e = last_errno();
                // SAFETY: not yet handed out.
                drop(unsafe { Box::from_raw(b) });
                set_errno(e);
                return std::ptr::null_mut();
            }
            // SAFETY: the channel is live; refcnt is the application's
            // view, changed only here and in destroy (under the app's own
            // serialization of create/destroy on one channel, as in
            // rdma-core).
            unsafe { (*ch).refcnt += 1 };
        }
        b.cast()
    })
}

#[no_mangle]
pub extern "C" fn ibv_destroy_cq(c: *mut ibv_cq) -> c_int {
    guard_errno(|| {
        // SAFETY: the caller's CQ.
        let Some(cq) = (unsafe { cq_of(c) }) else {
            return libc::EINVAL;
        };
        let ch = cq.ibv.channel;
        // SAFETY: the CQ's channel, if any, outlives it (EBUSY above).
        if let Some(chan) = unsafe { channel_of(ch) } {
            // SAFETY: valid fds; a null event is allowed for DEL.
            unsafe {
                libc::epoll_ctl(
                    chan.ep.as_raw_fd(),
                    libc::EPOLL_CTL_DEL,
                    cq.cq.event_fd(),
                    std::ptr::null_mut(),
                )
            };
            // SAFETY: as in create.
            unsafe { (*ch).refcnt -= 1 };
        }
        // SAFETY: the Box leaked by `ibv_create_cq`, given back. QPs that
        // still complete into it hold the engine's CQ handle, not this.
        drop(unsafe { Box::from_raw(c.cast::<Cq>()) });
        0
    })
}

#[no_mangle]
pub extern "C" fn ibv_get_cq_event(
    ch: *mut ibv_comp_channel,
    cq_out: *mut *mut ibv_cq,
    ctx_out: *mut *mut c_void,
) -> c_int {
    guard(-1, || {
        // SAFETY: the caller's channel.
        let Some(chan) = (unsafe { channel_of(ch) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        let ep = chan.ep.as_raw_fd();
        // SAFETY: fcntl on a valid fd.
        let nonblock = unsafe { libc::fcntl(ep, libc::F_GETFL) } & libc::O_NONBLOCK != 0;
        let mut ev = libc::epoll_event { events: 0, u64: 0 };
        // SAFETY: the channel's context is live while it is.
        if let Some(ctx) = unsafe { ctx_of(chan.ibv.context) } {
            ctx.rt.cork.push_all();
            if !nonblock {
                ctx.rt.spin.release();
            }
        }
        let n = loop {
            // SAFETY: one event slot.
            let n = unsafe { libc::epoll_wait(ep, &mut ev, 1, if nonblock { 0 } else { -1 }) };
            if n >= 0 {
                break n;
            }
            let e = last_errno();
            // epoll_wait fails with EINTR after SIGSTOP/SIGCONT (signal(7))
            // and after any handler; the kernel's read() of a channel
            // restarts after a stop and after an SA_RESTART handler, and
            // fails with EINTR after a handler without it (qperf ends its
            // timed tests so). Which signal it was is not known here: wait
            // on unless the process has such a handler.
            if e != libc::EINTR || a_handler_interrupts() {
                set_errno(e);
                return -1;
            }
        };
        if n == 0 {
            set_errno(libc::EAGAIN);
            return -1;
        }
        let c = ev.u64 as *mut ibv_cq;
        // SAFETY: epoll data is the address of a CQ bound to this channel;
        // destroying it removes it from the set first.
        let Some(cq) = (unsafe { cq_of(c) }) else {
            set_errno(libc::EIO);
            return -1;
        };
        cq.cq.ack_events();
        // SAFETY: the caller's out pointers (verbs.h requires both).
        unsafe {
            if !cq_out.is_null() {
                *cq_out = c;
            }
            if !ctx_out.is_null() {
                *ctx_out = cq.ibv.cq_context;
            }
        }
        0
    })
}

/// Whether the process has a signal handler installed without
/// `SA_RESTART`: a blocking `read` would fail with EINTR after it ran.
fn a_handler_interrupts() -> bool {
    (1..=libc::SIGRTMAX()).any(|sig| {
        // SAFETY: an all-zero sigaction is a valid out value.
        let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
        // SAFETY: reads the disposition only (no new action).
        let r = unsafe { libc::sigaction(sig, std::ptr::null(), &mut old) };
        r == 0
            && old.sa_sigaction != libc::SIG_DFL
            && old.sa_sigaction != libc::SIG_IGN
            && old.sa_flags & libc::SA_RESTART == 0
    })
}

#[no_mangle]
pub extern "C" fn ibv_ack_cq_events(c: *mut ibv_cq, n: c_uint) {
    // SAFETY: the caller's CQ.
    if unsafe { cq_of(c) }.is_some() {
        // SAFETY: the counter is the application's view (rdma-core keeps
        // it under the CQ's mutex; `ibv_destroy_cq` here does not wait on it).
        unsafe { (*c).comp_events_completed = (*c).comp_events_completed.wrapping_add(n) };
    }
}

#[no_mangle]
pub extern "C" fn ibv_resize_cq(_c: *mut ibv_cq, _cqe: c_int) -> c_int {
    libc::EOPNOTSUPP
}

/// `ops.poll_cq`. A CQ that overflowed (completions lost because the
/// application polled too slowly) is an error, as on hardware: its
/// context hears `IBV_EVENT_CQ_ERR` once, and once the completions still
/// queued are taken, polling returns -1.
pub unsafe extern "C" fn poll_cq(c: *mut ibv_cq, n: c_int, out: *mut ibv_wc) -> c_int {
    guard(-1, || {
        // SAFETY: the caller's CQ.
        let Some(cq) = (unsafe { cq_of(c) }) else {
            return -1;
        };
        if n < 0 || (n > 0 && out.is_null()) {
            return -1;
        }
        // SAFETY: the context outlives its CQs.
        let ctx = unsafe { ctx_of(cq.ibv.context) };
        if let Some(ctx) = ctx {
            // The posts held for this poll go out (`cork`).
            ctx.rt.cork.push_all();
        }
        let mut done = take(cq, n as usize, out);
        if done == 0 && n > 0 {
            let spins = spinning();
            if let Some(ctx) = ctx {
                if spins.is_some() || ctx.rt.spin.held() {
                    ctx.rt.spin.drive(spins == Some(true));
                    done = take(cq, n as usize, out);
                }
            }
        }
        if done > 0 {
            EMPTY_POLLS.with(|e| e.set(0));
        }
        if cq.cq.overflowed() {
            if !cq.overrun_said.swap(true, Ordering::AcqRel) {
                // SAFETY: the context outlives its CQs (the application's
                // contract: close the device last).
                if let Some(ctx) = unsafe { ctx_of(cq.ibv.context) } {
                    ctx.push_event(AsyncEv {
                        kind: IBV_EVENT_CQ_ERR,
                        object: c as usize,
                    });
                }
            }
            if done == 0 {
                return -1;
            }
        }
        done as c_int
    })
}

thread_local! {
    /// Empty polls in a row on this thread.
    static EMPTY_POLLS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// When (`spin::now_us`) this thread's empty polls made it a spinner.
    static SPIN_SINCE: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Empty polls in a row after which a thread counts as spinning: an
/// application that sleeps on its channel polls until empty once per
/// wake-up and never gets here; perftest and qperf do at once.
const SPIN_AFTER: u32 = 16;

/// Counts an empty poll. `None`: this thread is not spinning; `Some(idle)`:
/// it is (it then drives the QPs, `spin`), and `idle` when it has spun
/// without a completion for `spin::idle_after()` (it may then wait for
/// input in the kernel).
fn spinning() -> Option<bool> {
    let n = EMPTY_POLLS.with(|e| {
        let n = e.get().saturating_add(1);
        e.set(n);
        n
    });
    if n < SPIN_AFTER {
        return None;
    }
    if n == SPIN_AFTER {
        SPIN_SINCE.with(|s| s.set(crate::spin::now_us()));
        return Some(false);
    }
    let Some(after) = crate::spin::idle_after() else {
        return Some(false);
    };
    let since = SPIN_SINCE.with(|s| s.get());
    Some(crate::spin::now_us().saturating_sub(since) >= after.as_micros() as u64)
}

/// Takes up to `n` completions into the caller's array.
fn take(cq: &Cq, n: usize, out: *mut ibv_wc) -> usize {
    let mut buf = [WorkCompletion::default(); 32];
    let mut done = 0usize;
    while done < n {
        let want = (n - done).min(buf.len());
        let got = cq.cq.poll(&mut buf[..want]);
        for (i, w) in buf[..got].iter().enumerate() {
            // SAFETY: the caller's array holds `n` entries.
            unsafe { out.add(done + i).write(crate::convert::wc(w)) };
        }
        done += got;
        if got < want {
            break;
        }
    }
    done
}

/// `ops.req_notify_cq`.
pub unsafe extern "C" fn req_notify_cq(c: *mut ibv_cq, solicited_only: c_int) -> c_int {
    guard_errno(|| {
        // SAFETY: the caller's CQ.
        let Some(cq) = (unsafe { cq_of(c) }) else {
            return libc::EINVAL;
        };
        // About to sleep on the channel: the progress threads take the
        // input again.
        // SAFETY: the context outlives its CQs.
        if let Some(ctx) = unsafe { ctx_of(cq.ibv.context) } {
            ctx.rt.spin.release();
            ctx.rt.cork.push_all();
        }
        // The next completion only, as siw and rxe arm it.
        cq.cq.req_notify_next(solicited_only != 0);
        0
    })
}
