//! Protection domains and memory registration.

use crate::abi::*;
use crate::objects::{ctx_of, mr_of, pd_of, Mr, Pd};
use libc::{c_int, c_void};
use softrdma_cabi::{export, guard_errno, guard_ptr, set_errno};
use softrdma_verbs::{Access, RegOptions};

/// verbs.h's `IBV_ACCESS_OPTIONAL_RANGE` (a macro, so not in the
/// bindings): bits 20 to 29, which a provider may ignore.
const IBV_ACCESS_OPTIONAL_RANGE: u32 =
    ((IBV_ACCESS_OPTIONAL_FIRST << 10) - 1) & !(IBV_ACCESS_OPTIONAL_FIRST - 1);

export!("IBVERBS_1.1": ibv_alloc_pd, ibv_dealloc_pd, ibv_reg_mr, ibv_dereg_mr, ibv_rereg_mr);
export!("IBVERBS_1.7": ibv_reg_mr_iova);
export!("IBVERBS_1.8": ibv_reg_mr_iova2);

#[no_mangle]
pub extern "C" fn ibv_alloc_pd(c: *mut ibv_context) -> *mut ibv_pd {
    guard_ptr(|| {
        // SAFETY: the caller's context.
        let Some(ctx) = (unsafe { ctx_of(c) }) else {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        };
        match ctx.rt.dev.alloc_pd() {
            Ok(pd) => {
                let b = Box::new(Pd {
                    ibv: ibv_pd {
                        context: c,
                        handle: pd.id(),
                    },
                    pd,
                });
                Box::into_raw(b).cast()
            }
            Err(e) => {
                set_errno(crate::errno::of(&e));
                std::ptr::null_mut()
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn ibv_dealloc_pd(p: *mut ibv_pd) -> c_int {
    guard_errno(|| {
        if p.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: the Box leaked by `ibv_alloc_pd`, given back. The
        // engine's PD lives on in the regions and QPs made from it.
        drop(unsafe { Box::from_raw(p.cast::<Pd>()) });
        0
    })
}

/// The access bits the engine knows; the rest either changes nothing here
/// (relaxed ordering and the optional range: the engine orders its own
/// placement; huge pages) or is not offered (ODP, memory windows).
fn access_of(flags: u32) -> Result<(Access, bool), c_int> {
    if flags & IBV_ACCESS_ON_DEMAND != 0 || flags & IBV_ACCESS_MW_BIND != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    let remote_w = flags & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC) != 0;
    if remote_w && flags & IBV_ACCESS_LOCAL_WRITE == 0 {
        // The verbs rule every provider enforces.
        return Err(libc::EINVAL);
    }
    let a = Access(flags & 0xf);
    Ok((a, flags & IBV_ACCESS_ZERO_BASED != 0))
}

fn register(pd: *mut ibv_pd, addr: *mut c_void, len: usize, iova: u64, flags: u32) -> *mut ibv_mr {
    // SAFETY: the caller's PD.
    let Some(p) = (unsafe { pd_of(pd) }) else {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    };
    let (access, zero_based) = match access_of(flags) {
        Ok(a) => a,
        Err(e) => {
            set_errno(e);
            return std::ptr::null_mut();
        }
    };
    if addr.is_null() || len == 0 {
        set_errno(libc::EINVAL);
        return std::ptr::null_mut();
    }
    // SAFETY: `p` is a live PD whose context is the caller's.
    let ctx = unsafe { ctx_of((*pd).context) };
    // Whole pages of `malloc` memory may move into a file same-host peers
    // map (`share`; SOFTRDMA_SHARE_MR=0 turns it off).
    let shared = ctx.and_then(|c| c.rt.share.begin(addr as usize, len));
    let opts = |unpinned| RegOptions {
        iova: Some(if zero_based { 0 } else { iova }),
        invalidatable: true,
        unpinned,
        shared,
        ..RegOptions::default()
    };
    // SAFETY: the application promises, as with any provider, that the
    // range stays mapped until `ibv_dereg_mr`; deregistration waits for
    // the engine to stop touching it (MemoryRegion's drop).
    let mut r = unsafe { p.pd.register_raw(addr.cast(), len, access, opts(false)) };
    if r.is_err() && softrdma_verbs::pinning_enabled() {
        // Pinning is optional in user space (the engine reads and writes
        // the application's pages itself): past RLIMIT_MEMLOCK, go on
        // without it and say so once.
        // SAFETY: as above.
        let again = unsafe { p.pd.register_raw(addr.cast(), len, access, opts(true)) };
        if again.is_ok() {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| {
                let e = r.as_ref().err().map(|e| e.to_string()).unwrap_or_default();
                eprintln!(
                    "softrdma: registered memory is not pinned from here on ({e}); \
                     raise RLIMIT_MEMLOCK (ulimit -l) to pin it"
                );
            });
        }
        r = again;
    }
    match r {
        Ok(mr) => {
            let ibv = ibv_mr {
                // SAFETY: `p` is a live PD whose context is the caller's.
                context: unsafe { (*pd).context },
                pd,
                addr,
                length: len as size_t,
                handle: mr.lkey().raw() >> 8,
                lkey: mr.lkey().raw(),
                rkey: mr.rkey().raw(),
            };
            Box::into_raw(Box::new(Mr { ibv, mr })).cast()
        }
        Err(e) => {
            if let Some(c) = ctx {
                c.rt.share.end(addr as usize, len);
            }
            set_errno(crate::errno::of(&e));
            std::ptr::null_mut()
        }
    }
}

#[no_mangle]
pub extern "C" fn ibv_reg_mr(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    access: c_int,
) -> *mut ibv_mr {
    guard_ptr(|| register(pd, addr, len, addr as u64, access as u32))
}

#[no_mangle]
pub extern "C" fn ibv_reg_mr_iova(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: c_int,
) -> *mut ibv_mr {
    guard_ptr(|| register(pd, addr, len, iova, access as u32))
}

/// What `ibv_reg_mr` becomes when the access flags are not a constant or
/// hold optional bits (perftest's relaxed ordering): those bits are
/// dropped if not understood, as the optional range promises.
#[no_mangle]
pub extern "C" fn ibv_reg_mr_iova2(
    pd: *mut ibv_pd,
    addr: *mut c_void,
    len: usize,
    iova: u64,
    access: u32,
) -> *mut ibv_mr {
    guard_ptr(|| register(pd, addr, len, iova, access & !IBV_ACCESS_OPTIONAL_RANGE))
}

#[no_mangle]
pub extern "C" fn ibv_dereg_mr(m: *mut ibv_mr) -> c_int {
    guard_errno(|| {
        // SAFETY: the caller's MR.
        let Some(mr) = (unsafe { mr_of(m) }) else {
            return libc::EINVAL;
        };
        let (addr, len) = (mr.ibv.addr as usize, mr.ibv.length as usize);
        // SAFETY: the MR's context outlives it.
        let ctx = unsafe { ctx_of(mr.ibv.context) };
        // SAFETY: the Box leaked by the registration, given back. The
        // region's drop invalidates the STag at once and returns when the
        // engine no longer touches the memory.
        drop(unsafe { Box::from_raw(m.cast::<Mr>()) });
        if let Some(c) = ctx {
            c.rt.share.end(addr, len);
        }
        0
    })
}

/// Re-registration is not offered: deregister and register again.
#[no_mangle]
pub extern "C" fn ibv_rereg_mr(
    _m: *mut ibv_mr,
    _flags: c_int,
    _pd: *mut ibv_pd,
    _addr: *mut c_void,
    _len: usize,
    _access: c_int,
) -> c_int {
    libc::EOPNOTSUPP
}
