//! `libefa.so.1` stand-in. Debian's perftest links libefa directly (and
//! binds every symbol at load), but calls it only for a device whose
//! vendor is Amazon; softrdma's device is not, so these answer as
//! rdma-core's libefa does for a device that is not an EFA.
// `#[no_mangle]` exports and their versions are the only "unsafe" here;
// there are no unsafe blocks.
#![allow(unsafe_code)]

use libc::{c_int, c_void};
use softrdma_cabi::{export, set_errno};

export!("EFA_1.1": efadv_query_device, efadv_create_qp_ex);

#[no_mangle]
pub extern "C" fn efadv_query_device(_ctx: *mut c_void, _attr: *mut c_void, _len: u32) -> c_int {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub extern "C" fn efadv_create_qp_ex(
    _ctx: *mut c_void,
    _a: *mut c_void,
    _e: *mut c_void,
    _len: u32,
) -> *mut c_void {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}
