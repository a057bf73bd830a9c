//! What softrdma's C ABI libraries (`libibverbs.so.1`, `librdmacm.so.1` and
//! the provider stubs) share, so that each exported function stays a thin
//! shell around safe Rust:
//!
//! - [`export!`]: gives an exported function the symbol version that
//!   Debian's library gives it (`ibv_reg_mr@@IBVERBS_1.1`). The library's
//!   `build.rs` defines the version nodes (a version script); a `.symver`
//!   directive binds each symbol to its node. A node lost at build time
//!   shows in `readelf -V`, which the static check in the test suite reads.
//! - [`guard`] / [`guard_ptr`]: no panic unwinds across the C ABI; one
//!   that happens becomes the error return with `errno = EIO`.
//! - [`set_errno`].
#![deny(unsafe_code)]

use std::panic::{catch_unwind, AssertUnwindSafe};

/// Binds exported functions to their version node:
/// `export!("IBVERBS_1.1": ibv_reg_mr, ibv_dereg_mr);`. The function must be
/// `#[no_mangle] pub extern "C"`. Test builds (an executable, with no
/// version script) leave the directives out.
#[macro_export]
macro_rules! export {
    ($node:literal : $($name:ident),+ $(,)?) => {
        $(
            #[cfg(not(test))]
            ::core::arch::global_asm!(concat!(
                ".symver ", stringify!($name), ", ", stringify!($name), "@@", $node
            ));
        )+
    };
}

/// Sets the calling thread's `errno`.
#[allow(unsafe_code)]
pub fn set_errno(e: i32) {
    // SAFETY: `__errno_location` returns the calling thread's errno slot,
    // valid for the life of the thread.
    unsafe { *libc::__errno_location() = e }
}

/// Runs `f`; a panic becomes `fail` with `errno = EIO` (and a line on
/// stderr), so that no panic unwinds into C.
pub fn guard<R>(fail: R, f: impl FnOnce() -> R) -> R {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            eprintln!("softrdma: internal error (panic) in a verbs call: {what}");
            set_errno(libc::EIO);
            fail
        }
    }
}

/// [`guard`] for calls that return an errno value (0 on success), as most
/// of libibverbs does: a panic returns `EIO`.
pub fn guard_errno(f: impl FnOnce() -> i32) -> i32 {
    guard(libc::EIO, f)
}

/// [`guard`] for calls that return a pointer: a panic returns null.
pub fn guard_ptr<T>(f: impl FnOnce() -> *mut T) -> *mut T {
    guard(std::ptr::null_mut(), f)
}

/// [`guard`] for calls that return 0 or -1 with `errno` (as
/// `rdma_connect` does): an `Err(errno)` sets `errno` and returns -1.
pub fn guard_rc(f: impl FnOnce() -> Result<(), i32>) -> i32 {
    guard(-1, || match f() {
        Ok(()) => 0,
        Err(e) => {
            set_errno(e);
            -1
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_the_error_return_and_eio() {
        set_errno(0);
        let r = guard_errno(|| panic!("boom"));
        assert_eq!(r, libc::EIO);
        // SAFETY: reading this thread's errno slot.
        #[allow(unsafe_code)]
        let e = unsafe { *libc::__errno_location() };
        assert_eq!(e, libc::EIO);
        assert_eq!(guard_rc(|| Err(libc::EINVAL)), -1);
        #[allow(unsafe_code)]
        // SAFETY: as above.
        let e = unsafe { *libc::__errno_location() };
        assert_eq!(e, libc::EINVAL);
        assert!(guard_ptr::<u8>(|| panic!("x")).is_null());
    }
}
