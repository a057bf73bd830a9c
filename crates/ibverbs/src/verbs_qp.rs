//! Queue pairs: creation, state changes, posting.
//!
//! Only RC queue pairs exist on iWARP (siw answers others with
//! EOPNOTSUPP too). An RC QP reaches RTS through the connection manager
//! (librdmacm: `rdma_connect` / `rdma_accept`): iWARP has no way to bring
//! up a connection from QP attributes alone, so `ibv_modify_qp` to RTR or
//! RTS on an unconnected QP fails with EINVAL, and perftest wants `-R`.

use crate::abi::*;
use crate::objects::{cq_of, ctx_of, pd_of, qp_of, InlineRing, Qp, QpRoute};
use libc::c_int;
use parking_lot::Mutex;
use softrdma_cabi::{export, guard, guard_errno, guard_ptr, set_errno};
use softrdma_verbs::{Access, QpCaps, QpInitAttr, QpState, RecvWr, Sge};

export!("IBVERBS_1.1": ibv_create_qp, ibv_destroy_qp, ibv_modify_qp, ibv_query_qp);
export!("IBVERBS_1.6": ibv_qp_to_qp_ex);

/// Most bytes one inline work request carries.
pub const MAX_INLINE: u32 = 256;

fn qp_state_of(s: QpState) -> ibv_qp_state {
    match s {
        QpState::Reset => IBV_QPS_RESET,
        QpState::Init => IBV_QPS_INIT,
        QpState::Rtr => IBV_QPS_RTR,
        QpState::Rts => IBV_QPS_RTS,
        QpState::Sqd => IBV_QPS_SQD,
        QpState::Error => IBV_QPS_ERR,
    }
}

/// Creates a QP for `attr` on `pd`; the errno otherwise. `attr.cap` is
/// updated with what the QP got.
pub fn create(pd: *mut ibv_pd, attr: &mut ibv_qp_init_attr) -> Result<*mut ibv_qp, c_int> {
    // SAFETY: the caller's PD.
    let p = unsafe { pd_of(pd) }.ok_or(libc::EINVAL)?;
    if attr.qp_type != IBV_QPT_RC {
        return Err(libc::EOPNOTSUPP);
    }
    if !attr.srq.is_null() {
        // Shared receive queues are not offered through this library yet.
        return Err(libc::EOPNOTSUPP);
    }
    // SAFETY: the caller's CQs.
    let (scq, rcq) = unsafe { (cq_of(attr.send_cq), cq_of(attr.recv_cq)) };
    let (Some(scq), Some(rcq)) = (scq, rcq) else {
        return Err(libc::EINVAL);
    };
    let send_cq_handle = scq.cq.clone();
    let dev = p.pd.device().attr();
    let cap = attr.cap;
    if cap.max_send_wr > dev.max_qp_wr
        || cap.max_recv_wr > dev.max_qp_wr
        || cap.max_send_sge > dev.max_sge
        || cap.max_recv_sge > dev.max_sge
        || cap.max_inline_data > MAX_INLINE
    {
        return Err(libc::EINVAL);
    }
    let caps = QpCaps {
        max_send_wr: cap.max_send_wr.max(1) as usize,
        max_recv_wr: cap.max_recv_wr.max(1) as usize,
        max_send_sge: cap.max_send_sge.max(1) as usize,
        max_recv_sge: cap.max_recv_sge.max(1) as usize,
    };
    let mut init = QpInitAttr::new(&scq.cq);
    init.recv_cq = rcq.cq.clone();
    init.caps = caps;
    init.sq_sig_all = attr.sq_sig_all != 0;
    let qp = p.pd.create_qp(init).map_err(|e| crate::errno::of(&e))?;
    let inline = if cap.max_inline_data > 0 {
        let slot = (cap.max_inline_data as usize).next_multiple_of(64);
        let slots = 2 * caps.max_send_wr;
        let mr =
            p.pd.alloc_mr(slot * slots, Access::LOCAL_WRITE)
                .map_err(|e| crate::errno::of(&e))?;
        Some(InlineRing {
            mr,
            slot,
            slots,
            next: 0,
        })
    } else {
        None
    };
    // SAFETY: plain data (pthread objects zeroed are their initializers
    // on glibc); all zeroes is valid.
    let mut ibv: ibv_qp = unsafe { std::mem::zeroed() };
    // SAFETY: a live PD's context.
    ibv.context = unsafe { (*pd).context };
    ibv.qp_context = attr.qp_context;
    ibv.pd = pd;
    ibv.send_cq = attr.send_cq;
    ibv.recv_cq = attr.recv_cq;
    ibv.qp_num = qp.qp_num().raw();
    ibv.handle = ibv.qp_num;
    ibv.state = IBV_QPS_RESET;
    ibv.qp_type = IBV_QPT_RC;
    attr.cap = ibv_qp_cap {
        max_send_wr: caps.max_send_wr as u32,
        max_recv_wr: caps.max_recv_wr as u32,
        max_send_sge: caps.max_send_sge as u32,
        max_recv_sge: caps.max_recv_sge as u32,
        max_inline_data: cap.max_inline_data,
    };
    let qpn = ibv.qp_num;
    let ctx = ibv.context as usize;
    let qp = std::sync::Arc::new(qp);
    // SAFETY: a live context (the PD's).
    if let Some(c) = unsafe { ctx_of(ctx as *mut ibv_context) } {
        c.rt.spin.add(qpn, &qp);
    }
    let b = Box::into_raw(Box::new(Qp {
        ibv,
        qp,
        cap: attr.cap,
        inline: Mutex::new(inline),
        send_cq: attr.send_cq as usize,
        recv_cq: attr.recv_cq as usize,
        send_cq_handle,
    }));
    // SAFETY: a live context (the PD's).
    if let Some(c) = unsafe { ctx_of(ctx as *mut ibv_context) } {
        c.rt.qps.lock().insert(
            qpn,
            QpRoute {
                ctx,
                qp: b as usize,
                cm_id: 0,
            },
        );
    }
    Ok(b.cast())
}

#[no_mangle]
pub extern "C" fn ibv_create_qp(pd: *mut ibv_pd, attr: *mut ibv_qp_init_attr) -> *mut ibv_qp {
    guard_ptr(|| {
        if attr.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's attributes, read and updated (cap).
        match create(pd, unsafe { &mut *attr }) {
            Ok(q) => q,
            Err(e) => {
                set_errno(e);
                std::ptr::null_mut()
            }
        }
    })
}

/// The plain attributes of `ibv_qp_init_attr_ex`; EOPNOTSUPP for what it
/// asks beyond them (anything but a PD in `comp_mask`, creation flags).
pub fn plain_attr(a: &ibv_qp_init_attr_ex) -> Result<ibv_qp_init_attr, c_int> {
    if a.comp_mask & !IBV_QP_INIT_ATTR_PD != 0 || a.create_flags != 0 {
        return Err(libc::EOPNOTSUPP);
    }
    Ok(ibv_qp_init_attr {
        qp_context: a.qp_context,
        send_cq: a.send_cq,
        recv_cq: a.recv_cq,
        srq: a.srq,
        cap: a.cap,
        qp_type: a.qp_type,
        sq_sig_all: a.sq_sig_all,
    })
}

/// `verbs_context.create_qp_ex`: the plain attributes only (no send ops
/// flags: the `ibv_wr_*` API is not offered; no XRC, no RSS, no TSO).
pub unsafe extern "C" fn create_qp_ex(
    _c: *mut ibv_context,
    attr: *mut ibv_qp_init_attr_ex,
) -> *mut ibv_qp {
    guard_ptr(|| {
        if attr.is_null() {
            set_errno(libc::EINVAL);
            return std::ptr::null_mut();
        }
        // SAFETY: the caller's attributes.
        let a = unsafe { &mut *attr };
        let mut basic = match plain_attr(a) {
            Ok(b) if a.comp_mask & IBV_QP_INIT_ATTR_PD != 0 => b,
            Ok(_) => {
                set_errno(libc::EINVAL);
                return std::ptr::null_mut();
            }
            Err(e) => {
                set_errno(e);
                return std::ptr::null_mut();
            }
        };
        match create(a.pd, &mut basic) {
            Ok(q) => {
                a.cap = basic.cap;
                q
            }
            Err(e) => {
                set_errno(e);
                std::ptr::null_mut()
            }
        }
    })
}

/// The extended QP (the `ibv_wr_*` API) exists only for QPs created with
/// send ops flags, which this library does not offer: NULL, as rdma-core
/// answers for such a QP.
#[no_mangle]
pub extern "C" fn ibv_qp_to_qp_ex(_qp: *mut ibv_qp) -> *mut ibv_qp_ex {
    std::ptr::null_mut()
}

#[no_mangle]
pub extern "C" fn ibv_destroy_qp(q: *mut ibv_qp) -> c_int {
    guard_errno(|| {
        // SAFETY: the caller's QP.
        let Some(qp) = (unsafe { qp_of(q) }) else {
            return libc::EINVAL;
        };
        // SAFETY: the QP's context is live.
        if let Some(c) = unsafe { ctx_of(qp.ibv.context) } {
            // Under the routes' lock: the event thread delivers no event
            // naming this QP after this.
            c.rt.qps.lock().remove(&qp.ibv.qp_num);
            c.rt.spin.remove(qp.ibv.qp_num);
        }
        // SAFETY: the Box leaked by creation, given back. Work in flight
        // completes with WR_FLUSH_ERR (the engine's QP outlives this
        // handle while a connection thread holds it; every registration a
        // queued WR names is held by the WR).
        let b = unsafe { Box::from_raw(q.cast::<Qp>()) };
        b.qp.disconnect();
        drop(b);
        0
    })
}

#[no_mangle]
pub extern "C" fn ibv_modify_qp(q: *mut ibv_qp, attr: *mut ibv_qp_attr, mask: c_int) -> c_int {
    guard_errno(|| {
        // SAFETY: the caller's QP and attributes.
        let (Some(qp), false) = ((unsafe { qp_of(q) }), attr.is_null()) else {
            return libc::EINVAL;
        };
        if mask as u32 & IBV_QP_STATE == 0 {
            // Other attributes (timeouts, access flags, path) change
            // nothing for iWARP.
            return 0;
        }
        // SAFETY: checked non-null.
        let want = unsafe { (*attr).qp_state };
        let now = qp.qp.state();
        let r = match want {
            IBV_QPS_RESET => qp.qp.modify(QpState::Reset),
            IBV_QPS_INIT if now == QpState::Reset => qp.qp.modify(QpState::Init),
            IBV_QPS_INIT if now == QpState::Init => Ok(()),
            IBV_QPS_RTR if now == QpState::Init => qp.qp.modify(QpState::Rtr),
            IBV_QPS_RTR | IBV_QPS_RTS if now == QpState::Rts => Ok(()),
            IBV_QPS_SQD => qp.qp.modify(QpState::Sqd),
            IBV_QPS_ERR => qp.qp.modify(QpState::Error),
            _ => return libc::EINVAL,
        };
        match r {
            Ok(()) => {
                // SAFETY: the application's view of the state.
                unsafe { (*q).state = qp_state_of(qp.qp.state()) };
                0
            }
            Err(e) => crate::errno::of(&e),
        }
    })
}

#[no_mangle]
pub extern "C" fn ibv_query_qp(
    q: *mut ibv_qp,
    attr: *mut ibv_qp_attr,
    _mask: c_int,
    init: *mut ibv_qp_init_attr,
) -> c_int {
    guard_errno(|| {
        // SAFETY: the caller's QP.
        let Some(qp) = (unsafe { qp_of(q) }) else {
            return libc::EINVAL;
        };
        if attr.is_null() {
            return libc::EINVAL;
        }
        // SAFETY: plain data.
        let mut a: ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = qp_state_of(qp.qp.state());
        a.cur_qp_state = a.qp_state;
        a.path_mtu = IBV_MTU_4096;
        a.qp_access_flags =
            IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        a.port_num = 1;
        if let Some(n) = qp.qp.conn_params() {
            a.max_rd_atomic = n.ord.min(255) as u8;
            a.max_dest_rd_atomic = n.ird.min(255) as u8;
        }
        let cap = qp.cap;
        a.cap = cap;
        // SAFETY: the caller's buffers.
        unsafe {
            attr.write(a);
            if !init.is_null() {
                let i = &mut *init;
                i.qp_context = qp.ibv.qp_context;
                i.send_cq = qp.send_cq as *mut ibv_cq;
                i.recv_cq = qp.recv_cq as *mut ibv_cq;
                i.srq = std::ptr::null_mut();
                i.qp_type = IBV_QPT_RC;
                i.cap = cap;
            }
        }
        0
    })
}

/// `ops.post_send`: each WR in turn; the first one refused is `*bad_wr`
/// and its errno the result (those before it are posted). The list is
/// queued first and transmitted with one doorbell at the end, or held for
/// the application's next poll (`cork`).
pub unsafe extern "C" fn post_send(
    q: *mut ibv_qp,
    wr: *mut ibv_send_wr,
    bad: *mut *mut ibv_send_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the caller's QP.
        let Some(qp) = (unsafe { qp_of(q) }) else {
            return libc::EINVAL;
        };
        let mut cur = wr;
        let mut res = 0;
        let mut bytes = 0u64;
        while !cur.is_null() {
            // SAFETY: the caller's list of WRs.
            let w = unsafe { &*cur };
            let r = post_one(qp, w);
            if let Err(e) = r {
                if !bad.is_null() {
                    // SAFETY: the caller's out pointer.
                    unsafe { *bad = cur };
                }
                res = e;
                break;
            }
            // SAFETY: the WR's SGE array as the application gave it.
            bytes += unsafe { crate::convert::sgl_bytes(w.sg_list, w.num_sge) };
            cur = w.next;
        }
        doorbell(qp, bytes);
        res
    })
}

/// Transmits what `post_one` queued, or holds it for the next poll when
/// completions wait to be reaped on the send CQ (`cork`).
fn doorbell(qp: &Qp, bytes: u64) {
    // SAFETY: the QP's context outlives it (the application's contract:
    // close the device last).
    if let Some(ctx) = unsafe { ctx_of(qp.ibv.context) } {
        if ctx.rt.cork.wants(qp.send_cq_handle.len(), bytes) {
            if ctx.rt.cork.hold(&qp.qp, bytes) {
                ctx.rt.dev.wake_event_waiter();
            }
            return;
        }
    }
    qp.qp.push();
}

fn post_one(qp: &Qp, w: &ibv_send_wr) -> Result<(), c_int> {
    let mut swr = crate::convert::send_wr(w)?;
    // SAFETY: the WR's SGE array as the application gave it.
    let sgl = unsafe { crate::convert::sgl(w.sg_list, w.num_sge) };
    let inline = w.send_flags & IBV_SEND_INLINE != 0
        && matches!(
            w.opcode,
            IBV_WR_SEND
                | IBV_WR_SEND_WITH_IMM
                | IBV_WR_SEND_WITH_INV
                | IBV_WR_RDMA_WRITE
                | IBV_WR_RDMA_WRITE_WITH_IMM
        );
    if !inline {
        swr.sgl = sgl;
        return qp
            .qp
            .post_send_held(std::slice::from_ref(&swr))
            .map_err(|e| crate::errno::of(&e));
    }
    let total: u64 = sgl.iter().map(|s| s.length as u64).sum();
    if total > qp.cap.max_inline_data as u64 {
        return Err(libc::EINVAL);
    }
    let mut guard = qp.inline.lock();
    let Some(ring) = guard.as_mut() else {
        return Err(libc::EINVAL);
    };
    let off = ring.next * ring.slot;
    let base = ring.mr.as_ptr();
    let mut at = 0usize;
    for s in &sgl {
        // SAFETY: inline data is the application's memory, readable for
        // the SGE's length (no key: the verbs contract for inline); the
        // slot is inside the ring's region and no queued WR reads it
        // (InlineRing's rule).
        unsafe {
            std::ptr::copy_nonoverlapping(
                s.addr as *const u8,
                base.add(off + at),
                s.length as usize,
            )
        };
        at += s.length as usize;
    }
    swr.sgl = vec![Sge {
        addr: ring.mr.addr() + off as u64,
        length: total as u32,
        lkey: ring.mr.lkey(),
    }];
    qp.qp
        .post_send_held(std::slice::from_ref(&swr))
        .map_err(|e| crate::errno::of(&e))?;
    ring.next = (ring.next + 1) % ring.slots;
    Ok(())
}

/// `ops.post_recv`.
pub unsafe extern "C" fn post_recv(
    q: *mut ibv_qp,
    wr: *mut ibv_recv_wr,
    bad: *mut *mut ibv_recv_wr,
) -> c_int {
    guard(libc::EIO, || {
        // SAFETY: the caller's QP.
        let Some(qp) = (unsafe { qp_of(q) }) else {
            return libc::EINVAL;
        };
        let mut cur = wr;
        while !cur.is_null() {
            // SAFETY: the caller's list of WRs.
            let w = unsafe { &*cur };
            // SAFETY: the WR's SGE array.
            let sgl = unsafe { crate::convert::sgl(w.sg_list, w.num_sge) };
            if let Err(e) = qp.qp.post_recv(&RecvWr {
                wr_id: w.wr_id,
                sgl,
            }) {
                if !bad.is_null() {
                    // SAFETY: the caller's out pointer.
                    unsafe { *bad = cur };
                }
                return crate::errno::of(&e);
            }
            cur = w.next;
        }
        0
    })
}
