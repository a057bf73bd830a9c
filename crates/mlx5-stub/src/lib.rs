//! `libmlx5.so.1` stand-in. Debian's perftest links libmlx5 directly (and
//! binds every symbol at load), but calls it only for a device whose
//! vendor is Mellanox; softrdma's device is not, so these answer as
//! rdma-core's libmlx5 does for a device that is not an mlx5: no such
//! object (`NULL`, errno EOPNOTSUPP) or EOPNOTSUPP.
// `#[no_mangle]` exports and their versions are the only "unsafe" here;
// there are no unsafe blocks.
#![allow(unsafe_code)]

use libc::{c_int, c_void};
use softrdma_cabi::{export, set_errno};

export!("MLX5_1.0": mlx5dv_query_device, mlx5dv_init_obj);
export!("MLX5_1.3": mlx5dv_create_qp);
export!("MLX5_1.7": mlx5dv_open_device, mlx5dv_devx_general_cmd);
export!("MLX5_1.8": mlx5dv_is_supported);
export!("MLX5_1.10": mlx5dv_create_mkey, mlx5dv_destroy_mkey, mlx5dv_qp_ex_from_ibv_qp_ex);
export!("MLX5_1.21": mlx5dv_crypto_login, mlx5dv_dek_create, mlx5dv_dek_destroy);

fn none() -> *mut c_void {
    set_errno(libc::EOPNOTSUPP);
    std::ptr::null_mut()
}

#[no_mangle]
pub extern "C" fn mlx5dv_is_supported(_device: *mut c_void) -> bool {
    false
}

#[no_mangle]
pub extern "C" fn mlx5dv_query_device(_ctx: *mut c_void, _attrs: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub extern "C" fn mlx5dv_init_obj(_obj: *mut c_void, _types: u64) -> c_int {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub extern "C" fn mlx5dv_create_qp(
    _ctx: *mut c_void,
    _a: *mut c_void,
    _m: *mut c_void,
) -> *mut c_void {
    none()
}

#[no_mangle]
pub extern "C" fn mlx5dv_open_device(_dev: *mut c_void, _a: *mut c_void) -> *mut c_void {
    none()
}

#[no_mangle]
pub extern "C" fn mlx5dv_devx_general_cmd(
    _ctx: *mut c_void,
    _in: *const c_void,
    _inlen: usize,
    _out: *mut c_void,
    _outlen: usize,
) -> c_int {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub extern "C" fn mlx5dv_create_mkey(_a: *mut c_void) -> *mut c_void {
    none()
}

#[no_mangle]
pub extern "C" fn mlx5dv_destroy_mkey(_m: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub extern "C" fn mlx5dv_qp_ex_from_ibv_qp_ex(_qp: *mut c_void) -> *mut c_void {
    none()
}

#[no_mangle]
pub extern "C" fn mlx5dv_crypto_login(_ctx: *mut c_void, _a: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}

#[no_mangle]
pub extern "C" fn mlx5dv_dek_create(_ctx: *mut c_void, _a: *mut c_void) -> *mut c_void {
    none()
}

#[no_mangle]
pub extern "C" fn mlx5dv_dek_destroy(_d: *mut c_void) -> c_int {
    libc::EOPNOTSUPP
}
