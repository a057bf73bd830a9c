//! `librdmacm.so.1`: every `rdma_*` function an application imports is a
//! jump to `softrdma_rdma_*` in softrdma's `libibverbs.so.1`, where the
//! connection manager and the engine live (`crates/ibverbs/src/cm/`).
//! One engine per process: two libraries each with their own would give
//! an application's `rdma_cm_id` a context that its `ibv_*` calls do not
//! know.
//!
//! A jump keeps every argument register as the caller set it, so each
//! symbol is one instruction with no signature to keep in step; the
//! symbols carry Debian's versions (`RDMACM_1.0` ... `1.3`).
// The assembly below is the whole library; there is no other code.
#![allow(unsafe_code)]

#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
compile_error!("librdmacm's jumps are written for x86_64 and aarch64");

/// A global function `$name@@$node` that jumps to `softrdma_$name`.
macro_rules! forward {
    ($node:literal : $($name:ident),+ $(,)?) => {
        $(
            #[cfg(target_arch = "x86_64")]
            core::arch::global_asm!(concat!(
                ".text\n.globl ", stringify!($name), "\n.type ", stringify!($name), ",@function\n",
                stringify!($name), ":\n    jmp softrdma_", stringify!($name), "@PLT\n",
                ".size ", stringify!($name), ", .-", stringify!($name), "\n",
                ".symver ", stringify!($name), ", ", stringify!($name), "@@", $node
            ));
            #[cfg(target_arch = "aarch64")]
            core::arch::global_asm!(concat!(
                ".text\n.globl ", stringify!($name), "\n.type ", stringify!($name), ",%function\n",
                stringify!($name), ":\n    b softrdma_", stringify!($name), "\n",
                ".size ", stringify!($name), ", .-", stringify!($name), "\n",
                ".symver ", stringify!($name), ", ", stringify!($name), "@@", $node
            ));
        )+
    };
}

forward!("RDMACM_1.0": rdma_create_event_channel, rdma_destroy_event_channel, rdma_create_id,
    rdma_destroy_id, rdma_bind_addr, rdma_resolve_addr, rdma_resolve_route, rdma_listen,
    rdma_connect, rdma_accept, rdma_reject, rdma_disconnect, rdma_get_cm_event,
    rdma_ack_cm_event, rdma_event_str, rdma_create_qp, rdma_create_qp_ex, rdma_destroy_qp,
    rdma_set_option, rdma_get_src_port, rdma_get_dst_port, rdma_migrate_id, rdma_getaddrinfo,
    rdma_freeaddrinfo, rdma_create_ep, rdma_destroy_ep, rdma_get_request, rdma_get_devices,
    rdma_free_devices, rdma_notify, rpoll);
forward!("RDMACM_1.2": rdma_establish, rdma_init_qp_attr);
