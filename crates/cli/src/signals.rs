//! Running in the foreground until SIGINT or SIGTERM
//! (`softrdma store coordinator`).
//!
//! The two signals are blocked before any thread starts (threads inherit
//! the mask), so none of them is killed by one: the main thread takes the
//! signal with `sigwait` and shuts down in order.

use std::io;

/// SIGINT and SIGTERM, blocked in the thread that made this and in every
/// thread it starts afterwards.
pub struct StopSignals {
    set: libc::sigset_t,
}

/// Blocks SIGINT and SIGTERM in the calling thread; call it before
/// starting the threads that should not take them.
pub fn block() -> io::Result<StopSignals> {
    // SAFETY: `set` is a local `sigset_t`, initialised by `sigemptyset`
    // before `sigaddset` and `pthread_sigmask` read it; the old mask is not
    // asked for (null). None of these calls keeps a pointer.
    let set = unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGINT);
        libc::sigaddset(&mut set, libc::SIGTERM);
        let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        set
    };
    Ok(StopSignals { set })
}

impl StopSignals {
    /// Waits for SIGINT or SIGTERM; returns its name.
    pub fn wait(&self) -> io::Result<&'static str> {
        let mut sig: libc::c_int = 0;
        // SAFETY: `self.set` was initialised by `block`; `sig` is a local
        // the call writes once.
        let rc = unsafe { libc::sigwait(&self.set, &mut sig) };
        if rc != 0 {
            return Err(io::Error::from_raw_os_error(rc));
        }
        Ok(if sig == libc::SIGINT {
            "SIGINT"
        } else {
            "SIGTERM"
        })
    }
}
