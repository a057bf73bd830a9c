//! What iWARP or this library does not offer, answered with the errno a
//! kernel provider gives (siw: no address handles, no multicast, no memory
//! windows; SRQs not through this library yet).

use crate::abi::*;
use libc::c_int;
use softrdma_cabi::{export, set_errno};

export!("IBVERBS_1.1": ibv_create_srq, ibv_destroy_srq, ibv_modify_srq, ibv_query_srq,
    ibv_create_ah, ibv_destroy_ah, ibv_create_ah_from_wc, ibv_init_ah_from_wc,
    ibv_attach_mcast, ibv_detach_mcast);

#[no_mangle]
pub extern "C" fn ibv_create_srq(_pd: *mut ibv_pd, _a: *mut ibv_srq_init_attr) -> *mut ibv_srq {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

#[no_mangle]
pub extern "C" fn ibv_destroy_srq(_s: *mut ibv_srq) -> c_int {
    libc::EINVAL
}

#[no_mangle]
pub extern "C" fn ibv_modify_srq(_s: *mut ibv_srq, _a: *mut ibv_srq_attr, _m: c_int) -> c_int {
    libc::EINVAL
}

#[no_mangle]
pub extern "C" fn ibv_query_srq(_s: *mut ibv_srq, _a: *mut ibv_srq_attr) -> c_int {
    libc::EINVAL
}

/// `ops.post_srq_recv`: there is no SRQ to post to.
pub unsafe extern "C" fn post_srq_recv(
    _s: *mut ibv_srq,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    if !bad.is_null() {
        // SAFETY: the caller's out pointer.
        unsafe { *bad = wr };
    }
    libc::EINVAL
}

#[no_mangle]
pub extern "C" fn ibv_create_ah(_pd: *mut ibv_pd, _a: *mut ibv_ah_attr) -> *mut ibv_ah {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

#[no_mangle]
pub extern "C" fn ibv_destroy_ah(_ah: *mut ibv_ah) -> c_int {
    libc::EINVAL
}

#[no_mangle]
pub extern "C" fn ibv_create_ah_from_wc(
    _pd: *mut ibv_pd,
    _wc: *mut ibv_wc,
    _grh: *mut ibv_grh,
    _port: u8,
) -> *mut ibv_ah {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

#[no_mangle]
pub extern "C" fn ibv_init_ah_from_wc(
    _c: *mut ibv_context,
    _port: u8,
    _wc: *mut ibv_wc,
    _grh: *mut ibv_grh,
    _a: *mut ibv_ah_attr,
) -> c_int {
    set_errno(libc::EOPNOTSUPP);
    -1
}

#[no_mangle]
pub extern "C" fn ibv_attach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub extern "C" fn ibv_detach_mcast(_qp: *mut ibv_qp, _gid: *const ibv_gid, _lid: u16) -> c_int {
    libc::EOPNOTSUPP
}
