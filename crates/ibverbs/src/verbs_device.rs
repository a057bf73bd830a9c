//! The device as applications probe it: the device list, contexts, the
//! device's and port's attributes, GIDs, P_Keys, asynchronous events.

use crate::abi::*;
use crate::objects::{self, ctx_of, Ctx};
use libc::{c_char, c_int};
use softrdma_cabi::{export, guard, guard_errno, guard_ptr, set_errno};
use std::net::IpAddr;
use std::os::fd::AsRawFd;

export!("IBVERBS_1.1": ibv_get_device_list, ibv_free_device_list, ibv_get_device_name,
    ibv_get_device_guid, ibv_open_device, ibv_close_device, ibv_query_device, ibv_query_port,
    ibv_query_gid, ibv_query_pkey, ibv_get_async_event, ibv_ack_async_event, ibv_fork_init,
    ibv_node_type_str, ibv_port_state_str, ibv_event_type_str, ibv_wc_status_str);
export!("IBVERBS_1.0": ibv_read_sysfs_file);
export!("IBVERBS_1.11": _ibv_query_gid_ex);
export!("IBVERBS_PRIVATE_34": ibv_query_gid_type);

/// The one device, in a null-terminated array the caller frees with
/// `ibv_free_device_list`. No device (errno ENODEV, `*num = 0`) if the
/// engine cannot start.
#[no_mangle]
pub extern "C" fn ibv_get_device_list(num: *mut c_int) -> *mut *mut ibv_device {
    guard_ptr(|| {
        let rt = objects::runtime();
        let n = rt.is_ok() as usize;
        // SAFETY: calloc of n + 1 pointers, checked for null below.
        let list = unsafe { libc::calloc(n + 1, std::mem::size_of::<*mut ibv_device>()) }
            .cast::<*mut ibv_device>();
        if list.is_null() {
            set_errno(libc::ENOMEM);
            return std::ptr::null_mut();
        }
        if let Ok(rt) = rt {
            // SAFETY: `list` has n + 1 = 2 slots.
            unsafe { *list = rt.ibv_device() };
        }
        if !num.is_null() {
            // SAFETY: the caller passes a writable int or null.
            unsafe { *num = n as c_int };
        }
        list
    })
}

#[no_mangle]
pub extern "C" fn ibv_free_device_list(list: *mut *mut ibv_device) {
    // SAFETY: `list` came from `ibv_get_device_list` (calloc) or is null.
    unsafe { libc::free(list.cast()) }
}

#[no_mangle]
pub extern "C" fn ibv_get_device_name(dev: *mut ibv_device) -> *const c_char {
    if dev.is_null() {
        set_errno(libc::EINVAL);
        return std::ptr::null();
    }
    // SAFETY: `dev` is the device of `ibv_get_device_list`, never freed.
    unsafe { (*dev).name.as_ptr() }
}

/// A GUID from the device's address, as siw derives one from its MAC.
fn guid(addr: IpAddr) -> u64 {
    let b = match addr {
        IpAddr::V4(a) => {
            let o = a.octets();
            [0x02, 0x50, 0x52, 0xff, o[0], o[1], o[2], o[3]]
        }
        IpAddr::V6(a) => {
            let o = a.octets();
            [o[8], o[9], o[10], o[11], o[12], o[13], o[14], o[15]]
        }
    };
    u64::from_be_bytes(b)
}

/// The GID: the device's address as an IPv6 address (IPv4-mapped).
fn gid(addr: IpAddr) -> ibv_gid {
    let raw = match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    };
    ibv_gid { raw }
}

#[no_mangle]
pub extern "C" fn ibv_get_device_guid(_dev: *mut ibv_device) -> __be64 {
    guard(0, || match objects::runtime() {
        // In network byte order, as the field is.
        Ok(rt) => guid(rt.cfg.addr).to_be(),
        Err(_) => 0,
    })
}

#[no_mangle]
pub extern "C" fn ibv_open_device(dev: *mut ibv_device) -> *mut ibv_context {
    guard_ptr(|| {
        let rt = match objects::runtime() {
            Ok(rt) => rt,
            Err(e) => {
                set_errno(e);
                return std::ptr::null_mut();
            }
        };
        if dev != rt.ibv_device() {
            set_errno(libc::ENODEV);
            return std::ptr::null_mut();
        }
        match Ctx::new(rt) {
            Ok(mut ctx) => {
                fill_ops(&mut ctx.v);
                crate::events::start(rt);
                let ctx = Box::into_raw(ctx);
                // SAFETY: just made; the application owns it until close.
                unsafe { (*ctx).ibv() }
            }
            Err(e) => {
                set_errno(e);
                std::ptr::null_mut()
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn ibv_close_device(c: *mut ibv_context) -> c_int {
    guard(-1, || {
        // SAFETY: the caller's context, from `ibv_open_device`.
        let Some(ctx) = (unsafe { ctx_of(c) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        // SAFETY: the Box leaked by `ibv_open_device`; the application
        // gives it back here and uses it no more.
        drop(unsafe { Box::from_raw((ctx as *const Ctx).cast_mut()) });
        0
    })
}

pub fn device_attr(rt: &objects::Runtime) -> ibv_device_attr {
    let a = rt.dev.attr();
    // SAFETY: plain data; all zeroes is valid.
    let mut d: ibv_device_attr = unsafe { std::mem::zeroed() };
    let fw = format!("softrdma {}", env!("CARGO_PKG_VERSION"));
    for (dst, b) in d.fw_ver.iter_mut().zip(fw.bytes()) {
        *dst = b as c_char;
    }
    d.node_guid = guid(rt.cfg.addr).to_be();
    d.sys_image_guid = d.node_guid;
    d.max_mr_size = a.max_msg_size;
    d.page_size_cap = 4096;
    d.vendor_id = 0x5352; // "SR": not a vendor perftest special-cases
    d.vendor_part_id = 1;
    d.hw_ver = 0;
    let cap = |v: u32| v.min(i32::MAX as u32) as c_int;
    d.max_qp = cap(a.max_qp);
    d.max_qp_wr = cap(a.max_qp_wr);
    d.device_cap_flags =
        IBV_DEVICE_MEM_MGT_EXTENSIONS | IBV_DEVICE_RC_RNR_NAK_GEN | IBV_DEVICE_PORT_ACTIVE_EVENT;
    d.max_sge = cap(a.max_sge);
    d.max_sge_rd = cap(a.max_sge_rd);
    d.max_cq = cap(a.max_qp);
    d.max_cqe = cap(a.max_cqe);
    d.max_mr = cap(a.max_mr);
    d.max_pd = cap(a.max_qp);
    d.max_qp_rd_atom = a.max_ird as c_int;
    d.max_res_rd_atom = a.max_ird as c_int * cap(a.max_qp).min(1 << 16);
    d.max_qp_init_rd_atom = a.max_ord as c_int;
    // The engine's atomics are RFC 7306 and need softrdma's extensions on
    // both sides; a kernel peer has none, so none is promised.
    d.atomic_cap = IBV_ATOMIC_NONE;
    d.max_pkeys = 1;
    d.phys_port_cnt = 1;
    d
}

#[no_mangle]
pub extern "C" fn ibv_query_device(c: *mut ibv_context, attr: *mut ibv_device_attr) -> c_int {
    guard_errno(|| {
        // SAFETY: the caller's context.
        let Some(ctx) = (unsafe { ctx_of(c) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: the caller passes a writable `ibv_device_attr`.
        unsafe { attr.write(device_attr(ctx.rt)) };
        0
    })
}

/// `verbs_context.query_device_ex`: the basic attributes, the extended
/// ones zero (no ODP, no timestamps, no TSO, no RSS).
unsafe extern "C" fn query_device_ex(
    c: *mut ibv_context,
    input: *const ibv_query_device_ex_input,
    attr: *mut ibv_device_attr_ex,
    attr_size: size_t,
) -> c_int {
    let attr_size = attr_size as usize;
    guard_errno(|| {
        // SAFETY: the caller's context.
        let Some(ctx) = (unsafe { ctx_of(c) }) else {
            return libc::EINVAL;
        };
        // SAFETY: `input` is null or readable.
        if !input.is_null() && unsafe { (*input).comp_mask } != 0 {
            return libc::EINVAL;
        }
        let base = std::mem::size_of::<ibv_device_attr>();
        if attr.is_null() || attr_size < base {
            return libc::EINVAL;
        }
        let n = attr_size.min(std::mem::size_of::<ibv_device_attr_ex>());
        // SAFETY: the caller's buffer holds `attr_size` bytes; we write at
        // most that many, and `orig_attr` is its first field.
        unsafe {
            std::ptr::write_bytes(attr.cast::<u8>(), 0, n);
            (*attr).orig_attr = device_attr(ctx.rt);
        }
        0
    })
}

fn port_attr(rt: &objects::Runtime) -> ibv_port_attr {
    // SAFETY: plain data; all zeroes is valid.
    let mut p: ibv_port_attr = unsafe { std::mem::zeroed() };
    p.state = IBV_PORT_ACTIVE;
    p.max_mtu = IBV_MTU_4096;
    p.active_mtu = IBV_MTU_4096;
    p.gid_tbl_len = 1;
    p.port_cap_flags = IBV_PORT_CM_SUP | IBV_PORT_DEVICE_MGMT_SUP;
    p.max_msg_sz = rt.dev.attr().max_msg_size.min(u32::MAX as u64) as u32;
    p.pkey_tbl_len = 1;
    p.max_vl_num = 1;
    p.active_width = 2; // 4X
    p.active_speed = 4; // QDR: 40 Gbit/s, what one TCP stream on this host carries
    p.phys_state = 5; // LinkUp
    p.link_layer = IBV_LINK_LAYER_ETHERNET as u8;
    p
}

unsafe extern "C" fn query_port(
    c: *mut ibv_context,
    port: u8,
    attr: *mut ibv_port_attr,
    attr_size: size_t,
) -> c_int {
    let attr_size = attr_size as usize;
    guard_errno(|| {
        // SAFETY: the caller's context.
        let Some(ctx) = (unsafe { ctx_of(c) }) else {
            return libc::EINVAL;
        };
        if port != 1 || attr.is_null() {
            return libc::EINVAL;
        }
        let p = port_attr(ctx.rt);
        let n = attr_size.min(std::mem::size_of::<ibv_port_attr>());
        // SAFETY: the caller's buffer holds `attr_size` bytes.
        unsafe {
            std::ptr::copy_nonoverlapping((&p as *const ibv_port_attr).cast::<u8>(), attr.cast(), n)
        };
        0
    })
}

/// The exported `ibv_query_port` (verbs.h reaches it only when the context
/// has no `query_port` op): the layout of rdma-core 1.1, which ends
/// before `flags`.
#[no_mangle]
pub extern "C" fn ibv_query_port(c: *mut ibv_context, port: u8, attr: *mut ibv_port_attr) -> c_int {
    let compat = std::mem::offset_of!(ibv_port_attr, flags);
    // SAFETY: forwards the caller's arguments.
    unsafe { query_port(c, port, attr, compat as size_t) }
}

#[no_mangle]
pub extern "C" fn ibv_query_gid(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    g: *mut ibv_gid,
) -> c_int {
    guard(-1, || {
        // SAFETY: the caller's context.
        let Some(ctx) = (unsafe { ctx_of(c) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if port != 1 || index != 0 || g.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        // SAFETY: the caller's writable gid.
        unsafe { g.write(gid(ctx.rt.cfg.addr)) };
        0
    })
}

#[no_mangle]
pub extern "C" fn _ibv_query_gid_ex(
    c: *mut ibv_context,
    port: u32,
    index: u32,
    entry: *mut ibv_gid_entry,
    flags: u32,
    entry_size: usize,
) -> c_int {
    guard_errno(|| {
        // SAFETY: the caller's context.
        let Some(ctx) = (unsafe { ctx_of(c) }) else {
            return libc::EINVAL;
        };
        if flags != 0 || entry.is_null() || entry_size < std::mem::size_of::<ibv_gid_entry>() {
            return libc::EINVAL;
        }
        if port != 1 {
            return libc::EINVAL;
        }
        if index != 0 {
            return libc::ENODATA;
        }
        let e = ibv_gid_entry {
            gid: gid(ctx.rt.cfg.addr),
            gid_index: 0,
            port_num: 1,
            gid_type: IBV_GID_TYPE_IB,
            ndev_ifindex: 0,
        };
        // SAFETY: the caller's entry, at least this large.
        unsafe { entry.write(e) };
        0
    })
}

/// rdma-core's private `ibv_query_gid_type` (perftest imports it): IB for
/// an iWARP device.
#[no_mangle]
pub extern "C" fn ibv_query_gid_type(
    c: *mut ibv_context,
    port: u8,
    index: u32,
    kind: *mut u32,
) -> c_int {
    // SAFETY: the caller's context, checked for null.
    if unsafe { ctx_of(c) }.is_none() || port != 1 || index != 0 || kind.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller's writable int.
    unsafe { *kind = 0 };
    0
}

#[no_mangle]
pub extern "C" fn ibv_query_pkey(
    c: *mut ibv_context,
    port: u8,
    index: c_int,
    pkey: *mut __be16,
) -> c_int {
    // SAFETY: the caller's context, checked for null.
    if unsafe { ctx_of(c) }.is_none() || port != 1 || index != 0 || pkey.is_null() {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: the caller's writable u16.
    unsafe { *pkey = 0xffffu16.to_be() };
    0
}

#[no_mangle]
pub extern "C" fn ibv_get_async_event(c: *mut ibv_context, ev: *mut ibv_async_event) -> c_int {
    guard(-1, || {
        // SAFETY: the caller's context.
        let Some(ctx) = (unsafe { ctx_of(c) }) else {
            set_errno(libc::EINVAL);
            return -1;
        };
        if ev.is_null() {
            set_errno(libc::EINVAL);
            return -1;
        }
        if let Err(e) = objects::take_semaphore(ctx.async_fd.as_raw_fd()) {
            set_errno(e);
            return -1;
        }
        let Some(a) = ctx.events.lock().pop_front() else {
            set_errno(libc::EAGAIN);
            return -1;
        };
        // SAFETY: plain data; all zeroes is valid.
        let mut out: ibv_async_event = unsafe { std::mem::zeroed() };
        out.event_type = a.kind;
        match a.kind {
            IBV_EVENT_CQ_ERR => out.element.cq = a.object as *mut ibv_cq,
            IBV_EVENT_PORT_ACTIVE | IBV_EVENT_PORT_ERR | IBV_EVENT_DEVICE_FATAL => {
                out.element.port_num = 1
            }
            _ => out.element.qp = a.object as *mut ibv_qp,
        }
        // SAFETY: the caller's writable event.
        unsafe { ev.write(out) };
        0
    })
}

#[no_mangle]
pub extern "C" fn ibv_ack_async_event(_ev: *mut ibv_async_event) {}

/// Fork safety comes from not pinning through the kernel: nothing to do.
#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// There is no sysfs device: every read fails, as for a missing file.
#[no_mangle]
pub extern "C" fn ibv_read_sysfs_file(
    _dir: *const c_char,
    _file: *const c_char,
    _buf: *mut c_char,
    _size: usize,
) -> c_int {
    set_errno(libc::ENOENT);
    -1
}

fn cstr(s: &'static [u8]) -> *const c_char {
    s.as_ptr().cast()
}

#[no_mangle]
pub extern "C" fn ibv_node_type_str(t: ibv_node_type) -> *const c_char {
    match t {
        IBV_NODE_CA => cstr(b"InfiniBand channel adapter\0"),
        IBV_NODE_SWITCH => cstr(b"InfiniBand switch\0"),
        IBV_NODE_ROUTER => cstr(b"InfiniBand router\0"),
        IBV_NODE_RNIC => cstr(b"iWARP NIC\0"),
        _ => cstr(b"unknown\0"),
    }
}

#[no_mangle]
pub extern "C" fn ibv_port_state_str(s: ibv_port_state) -> *const c_char {
    match s {
        IBV_PORT_NOP => cstr(b"PORT_NOP\0"),
        IBV_PORT_DOWN => cstr(b"PORT_DOWN\0"),
        IBV_PORT_INIT => cstr(b"PORT_INIT\0"),
        IBV_PORT_ARMED => cstr(b"PORT_ARMED\0"),
        IBV_PORT_ACTIVE => cstr(b"PORT_ACTIVE\0"),
        IBV_PORT_ACTIVE_DEFER => cstr(b"PORT_ACTIVE_DEFER\0"),
        _ => cstr(b"invalid state\0"),
    }
}

#[no_mangle]
pub extern "C" fn ibv_event_type_str(e: ibv_event_type) -> *const c_char {
    match e {
        IBV_EVENT_CQ_ERR => cstr(b"CQ error\0"),
        IBV_EVENT_QP_FATAL => cstr(b"local work queue catastrophic error\0"),
        IBV_EVENT_QP_REQ_ERR => cstr(b"invalid request local work queue error\0"),
        IBV_EVENT_QP_ACCESS_ERR => cstr(b"local access violation work queue error\0"),
        IBV_EVENT_COMM_EST => cstr(b"communication established\0"),
        IBV_EVENT_SQ_DRAINED => cstr(b"send queue drained\0"),
        IBV_EVENT_DEVICE_FATAL => cstr(b"local catastrophic error\0"),
        IBV_EVENT_PORT_ACTIVE => cstr(b"port active\0"),
        IBV_EVENT_PORT_ERR => cstr(b"port error\0"),
        _ => cstr(b"unknown\0"),
    }
}

#[no_mangle]
pub extern "C" fn ibv_wc_status_str(s: ibv_wc_status) -> *const c_char {
    const NAMES: [&[u8]; 23] = [
        b"success\0",
        b"local length error\0",
        b"local QP operation error\0",
        b"local EE context operation error\0",
        b"local protection error\0",
        b"Work Request Flushed Error\0",
        b"memory management operation error\0",
        b"bad response error\0",
        b"local access error\0",
        b"remote invalid request error\0",
        b"remote access error\0",
        b"remote operation error\0",
        b"transport retry counter exceeded\0",
        b"RNR retry counter exceeded\0",
        b"local RDD violation error\0",
        b"remote invalid RD request\0",
        b"aborted error\0",
        b"invalid EE context number\0",
        b"invalid EE context state\0",
        b"fatal error\0",
        b"response timeout error\0",
        b"general error\0",
        b"TM error\0",
    ];
    NAMES
        .get(s as usize)
        .map_or(cstr(b"unknown\0"), |n| cstr(n))
}

/// The context's operations: those verbs.h's inline functions call.
pub fn fill_ops(v: &mut verbs_context) {
    let ops = &mut v.context.ops;
    ops.poll_cq = Some(crate::verbs_cq::poll_cq);
    ops.req_notify_cq = Some(crate::verbs_cq::req_notify_cq);
    ops.post_send = Some(crate::verbs_qp::post_send);
    ops.post_recv = Some(crate::verbs_qp::post_recv);
    ops.post_srq_recv = Some(crate::verbs_other::post_srq_recv);
    v.query_port = Some(query_port);
    v.query_device_ex = Some(query_device_ex);
    v.create_qp_ex = Some(crate::verbs_qp::create_qp_ex);
}
