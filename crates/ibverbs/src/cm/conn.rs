//! The calls: channels, ids, binding and resolution, listening and
//! connecting, QPs, events, options, endpoints.

use super::addr::source_for;
use super::*;

export!("SOFTRDMA_PRIVATE_1": softrdma_rdma_create_event_channel, softrdma_rdma_destroy_event_channel, softrdma_rdma_create_id, softrdma_rdma_destroy_id, softrdma_rdma_bind_addr, softrdma_rdma_resolve_addr, softrdma_rdma_resolve_route, softrdma_rdma_listen, softrdma_rdma_create_qp, softrdma_rdma_create_qp_ex, softrdma_rdma_destroy_qp, softrdma_rdma_connect, softrdma_rdma_accept, softrdma_rdma_reject, softrdma_rdma_disconnect, softrdma_rdma_get_cm_event, softrdma_rdma_ack_cm_event, softrdma_rdma_event_str, softrdma_rdma_set_option, softrdma_rdma_get_src_port, softrdma_rdma_get_dst_port, softrdma_rdma_migrate_id, softrdma_rdma_create_ep, softrdma_rdma_destroy_ep, softrdma_rdma_get_request, softrdma_rdma_establish, softrdma_rdma_init_qp_attr, softrdma_rdma_get_devices, softrdma_rdma_free_devices, softrdma_rdma_notify);

// ---------------------------------------------------------------- calls

#[no_mangle]
pub extern "C" fn softrdma_rdma_create_event_channel() -> *mut rdma_event_channel {
    guard_ptr(|| match cm().and_then(|_| new_channel()) {
        Ok(ch) => Box::into_raw(ch).cast(),
        Err(e) => {
            set_errno(e);
            std::ptr::null_mut()
        }
    })
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_destroy_event_channel(ch: *mut rdma_event_channel) {
    // SAFETY: the caller's channel or null.
    if unsafe { channel_of(ch) }.is_some() {
        // SAFETY: the Box leaked by `rdma_create_event_channel`; kept
        // whole for a while (`retire_channel` says why).
        super::retire_channel(unsafe { Box::from_raw(ch.cast::<Channel>()) });
    }
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_create_id(
    ch: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_id,
    context: *mut c_void,
    ps: rdma_port_space,
) -> c_int {
    guard_rc(|| {
        if out.is_null() {
            return Err(libc::EINVAL);
        }
        let id = new_id(ch, context, ps)?;
        // SAFETY: the caller's out pointer.
        unsafe { *out = id.cast() };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_destroy_id(id: *mut rdma_cm_id) -> c_int {
    guard_rc(|| {
        let cm = cm()?;
        if !cm.ids.lock().remove(&(id as usize)) {
            return Err(libc::EINVAL);
        }
        // As librdmacm: no new events for the id now, and the call waits
        // until the application has acknowledged every event it was handed
        // for the id. Another thread may be reading one (its `id` points
        // here): rping's CM thread takes DISCONNECTED and reads the id's
        // context while its main thread destroys the id.
        {
            // SAFETY: registered until just now; freed below, by us.
            let live = unsafe { &*id.cast::<Id>() };
            let mut st = live.st.lock();
            while st.unacked > 0 {
                live.acked.wait(&mut st);
            }
        }
        // SAFETY: the Box leaked by `new_id`; no event refers to it now.
        let b = unsafe { Box::from_raw(id.cast::<Id>()) };
        let (listen, cqs) = {
            let mut st = b.st.lock();
            st.req.take();
            (st.listen.take(), std::mem::take(&mut st.own_cqs))
        };
        // Outside the id's lock: the listening thread takes it for each
        // request it hands over.
        if let Some((l, t)) = listen {
            l.close();
            let _ = t.join();
        }
        for (cq, ch) in cqs {
            crate::verbs_cq::ibv_destroy_cq(cq as *mut ibv_cq);
            crate::verbs_cq::ibv_destroy_comp_channel(ch as *mut ibv_comp_channel);
        }
        drop(b);
        Ok(())
    })
}

fn bind(id: &Id, mut addr: SocketAddr) -> Result<(), c_int> {
    let cm = cm()?;
    if addr.port() == 0 {
        // rdma_bind_addr picks the port at once, and some applications
        // hand it to their peer before `rdma_listen` returns (Debian's
        // qperf 0.4.11 does): listen on it now, so that a connection that
        // comes first waits in the listener's queue for `rdma_listen`
        // instead of being refused. An id that connects instead drops it.
        let rt = objects::runtime()?;
        let l = rt.dev.listen(addr).map_err(|e| crate::errno::of(&e))?;
        addr = l.local_addr().map_err(|e| crate::errno::of(&e))?;
        id.st.lock().early = Some(l);
    }
    id.set_addr(Some(addr), None);
    id.set_verbs(cm.ctx);
    Ok(())
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_bind_addr(id: *mut rdma_cm_id, addr: *mut sockaddr) -> c_int {
    guard_rc(|| {
        // SAFETY: the caller's id.
        let id = unsafe { id_of(id) }.ok_or(libc::EINVAL)?;
        let a = read_sockaddr(addr).ok_or(libc::EAFNOSUPPORT)?;
        bind(id, a)
    })
}

fn resolve_addr(id: &Id, src: Option<SocketAddr>, dst: SocketAddr) -> Result<(), c_int> {
    let cm = cm()?;
    let src = src.unwrap_or_else(|| source_for(dst));
    id.st.lock().early.take();
    id.set_addr(Some(src), Some(dst));
    id.set_verbs(cm.ctx);
    id.event(RDMA_CM_EVENT_ADDR_RESOLVED, 0, &[], std::ptr::null_mut());
    if id.is_sync() {
        id.wait(RDMA_CM_EVENT_ADDR_RESOLVED)?;
    }
    Ok(())
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_resolve_addr(
    id: *mut rdma_cm_id,
    src: *mut sockaddr,
    dst: *mut sockaddr,
    _timeout_ms: c_int,
) -> c_int {
    guard_rc(|| {
        // SAFETY: the caller's id.
        let id = unsafe { id_of(id) }.ok_or(libc::EINVAL)?;
        let d = read_sockaddr(dst).ok_or(libc::EINVAL)?;
        resolve_addr(id, read_sockaddr(src), d)
    })
}

fn resolve_route(id: &Id) -> Result<(), c_int> {
    if id.st.lock().dst.is_none() {
        return Err(libc::EINVAL);
    }
    id.event(RDMA_CM_EVENT_ROUTE_RESOLVED, 0, &[], std::ptr::null_mut());
    if id.is_sync() {
        id.wait(RDMA_CM_EVENT_ROUTE_RESOLVED)?;
    }
    Ok(())
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_resolve_route(id: *mut rdma_cm_id, _timeout_ms: c_int) -> c_int {
    guard_rc(|| {
        // SAFETY: the caller's id.
        let id = unsafe { id_of(id) }.ok_or(libc::EINVAL)?;
        resolve_route(id)
    })
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_listen(idp: *mut rdma_cm_id, _backlog: c_int) -> c_int {
    guard_rc(|| {
        // SAFETY: the caller's id.
        let id = unsafe { id_of(idp) }.ok_or(libc::EINVAL)?;
        let rt = objects::runtime()?;
        let (src, early) = {
            let mut st = id.st.lock();
            (st.src.ok_or(libc::EINVAL)?, st.early.take())
        };
        let l = match early {
            Some(l) => l,
            None => rt.dev.listen(src).map_err(|e| crate::errno::of(&e))?,
        };
        let bound = l.local_addr().map_err(|e| crate::errno::of(&e))?;
        tracing::debug!(%bound, "rdma_listen");
        id.set_addr(Some(bound), None);
        let l = Arc::new(l);
        let l2 = l.clone();
        let idu = idp as usize;
        let t =
            softrdma_verbs::threads::spawn("softrdma-listen".into(), move || listen_loop(&l2, idu))
                .map_err(|_| libc::EAGAIN)?;
        id.st.lock().listen = Some((l, t));
        Ok(())
    })
}

/// Hands each connection request to the application until
/// `rdma_destroy_id` closes the listener (which wakes it at once).
fn listen_loop(l: &Listener, listen_id: usize) {
    while let Ok(req) = l.get_request() {
        let Ok(cm) = cm() else { return };
        let ids = cm.ids.lock();
        if !ids.contains(&listen_id) {
            return;
        }
        // SAFETY: registered, so live while we hold the lock.
        let lid = unsafe { &*(listen_id as *const Id) };
        drop(ids);
        let ch = if lid.is_sync() {
            std::ptr::null_mut()
        } else {
            lid.c.channel
        };
        let Ok(child) = new_id(ch, lid.c.context, lid.c.ps) else {
            let _ = req.reject(&[]);
            continue;
        };
        // SAFETY: just made, not yet handed out.
        let c = unsafe { &*child };
        c.set_verbs(cm.ctx);
        c.set_addr(lid.st.lock().src, Some(req.peer_addr()));
        let private = req.private_data().to_vec();
        let (ird, ord) = req.ird_ord().unwrap_or((1, 1));
        c.st.lock().req = Some(req);
        // The request goes on the listening id's channel (a synchronous
        // listener's private one, for `rdma_get_request`).
        // SAFETY: plain data; all zeroes is valid.
        let mut ev: rdma_cm_event = unsafe { std::mem::zeroed() };
        ev.id = child.cast();
        ev.listen_id = listen_id as *mut rdma_cm_id;
        ev.event = RDMA_CM_EVENT_CONNECT_REQUEST;
        let mut e = Box::new(Event {
            c: ev,
            private,
            counted: 0,
        });
        // The union's connection member; its pointer aims into the event.
        e.c.param.conn.private_data = e.private.as_ptr().cast();
        e.c.param.conn.private_data_len = e.private.len().min(255) as u8;
        // The initiator's resources, as the passive side sees them.
        e.c.param.conn.responder_resources = ird.min(255) as u8;
        e.c.param.conn.initiator_depth = ord.min(255) as u8;
        if let Some(chan) = lid.channel() {
            chan.push(e);
        }
    }
}

fn create_qp(id: &Id, pd: *mut ibv_pd, attr: &mut ibv_qp_init_attr) -> Result<(), c_int> {
    let cm = cm()?;
    let pd = if pd.is_null() { default_pd(cm)? } else { pd };
    let ctx = cm.ctx as *mut ibv_context;
    if attr.qp_type == 0 {
        // As librdmacm: the id's port space says (rdma_client leaves it 0).
        attr.qp_type = id.c.qp_type;
    }
    // librdmacm makes the CQs (each with its own channel) when the
    // application gives none: `rdma_get_send_comp` waits on them.
    let mut own = Vec::new();
    let mut make = |n: u32| -> Result<(*mut ibv_comp_channel, *mut ibv_cq), c_int> {
        let ch = crate::verbs_cq::ibv_create_comp_channel(ctx);
        if ch.is_null() {
            return Err(libc::ENOMEM);
        }
        let cq =
            crate::verbs_cq::ibv_create_cq(ctx, n.max(1) as c_int, std::ptr::null_mut(), ch, 0);
        if cq.is_null() {
            crate::verbs_cq::ibv_destroy_comp_channel(ch);
            return Err(libc::ENOMEM);
        }
        own.push((cq as usize, ch as usize));
        Ok((ch, cq))
    };
    let c = &id.c as *const rdma_cm_id as *mut rdma_cm_id;
    if attr.send_cq.is_null() {
        let (ch, cq) = make(attr.cap.max_send_wr)?;
        attr.send_cq = cq;
        // SAFETY: the id's own fields.
        unsafe {
            (*c).send_cq_channel = ch;
            (*c).send_cq = cq;
        }
    }
    if attr.recv_cq.is_null() {
        let (ch, cq) = make(attr.cap.max_recv_wr)?;
        attr.recv_cq = cq;
        // SAFETY: the id's own fields.
        unsafe {
            (*c).recv_cq_channel = ch;
            (*c).recv_cq = cq;
        }
    }
    id.st.lock().own_cqs.extend(own);
    let qp = crate::verbs_qp::create(pd, attr)?;
    // SAFETY: the id's own fields; the QP was just made.
    unsafe {
        (*c).qp = qp;
        (*c).pd = pd;
        if let Some(q) = qp_of(qp) {
            let _ = q.qp.modify(softrdma_verbs::QpState::Init);
            (*qp).state = IBV_QPS_INIT;
        }
    }
    route_qp_to(id);
    Ok(())
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_create_qp(
    id: *mut rdma_cm_id,
    pd: *mut ibv_pd,
    attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard_rc(|| {
        // SAFETY: the caller's id and attributes.
        let (id, attr) = unsafe {
            (
                id_of(id).ok_or(libc::EINVAL)?,
                attr.as_mut().ok_or(libc::EINVAL)?,
            )
        };
        create_qp(id, pd, attr)
    })
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_create_qp_ex(
    id: *mut rdma_cm_id,
    attr: *mut ibv_qp_init_attr_ex,
) -> c_int {
    guard_rc(|| {
        // SAFETY: the caller's id and attributes.
        let (id, a) = unsafe {
            (
                id_of(id).ok_or(libc::EINVAL)?,
                attr.as_mut().ok_or(libc::EINVAL)?,
            )
        };
        let mut basic = crate::verbs_qp::plain_attr(a)?;
        let pd = if a.comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
            a.pd
        } else {
            std::ptr::null_mut()
        };
        create_qp(id, pd, &mut basic)?;
        a.cap = basic.cap;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_destroy_qp(idp: *mut rdma_cm_id) {
    // SAFETY: the caller's id.
    if let Some(id) = unsafe { id_of(idp) } {
        let qp = id.c.qp;
        if !qp.is_null() {
            crate::verbs_qp::ibv_destroy_qp(qp);
            // SAFETY: the id's own field.
            unsafe { (*idp).qp = std::ptr::null_mut() };
        }
    }
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_connect(
    idp: *mut rdma_cm_id,
    param: *mut rdma_conn_param,
) -> c_int {
    guard_rc(|| {
        // SAFETY: the caller's id.
        let id = unsafe { id_of(idp) }.ok_or(libc::EINVAL)?;
        let rt = objects::runtime()?;
        let qp = engine_qp(id).ok_or(libc::EINVAL)?;
        let dst = id.st.lock().dst.ok_or(libc::EINVAL)?;
        let mut params = conn_params(param, rt.cfg.crc);
        params.extensions = rt.cfg.offer_extensions(&dst);
        let idu = idp as usize;
        tracing::debug!(%dst, "rdma_connect");
        let run = move || {
            let r = qp.connect(dst, &params);
            if r.is_ok() && !qp.conn_params().is_some_and(|n| n.softrdma_peer || n.p2p) {
                std::thread::sleep(FIRST_SEND_GRACE);
            }
            let Ok(cm) = cm() else { return };
            let ids = cm.ids.lock();
            if !ids.contains(&idu) {
                return;
            }
            // SAFETY: registered, so live while we hold the lock.
            let id = unsafe { &*(idu as *const Id) };
            match r {
                Ok(pd) => established(id, &pd),
                Err(Error::Rejected { private_data }) => id.event(
                    RDMA_CM_EVENT_REJECTED,
                    -libc::ECONNREFUSED,
                    &private_data,
                    std::ptr::null_mut(),
                ),
                Err(e) => {
                    let errno = crate::errno::of(&e);
                    let kind = match errno {
                        libc::ECONNREFUSED | libc::ECONNRESET => RDMA_CM_EVENT_REJECTED,
                        libc::ETIMEDOUT | libc::EHOSTUNREACH | libc::ENETUNREACH => {
                            RDMA_CM_EVENT_UNREACHABLE
                        }
                        _ => RDMA_CM_EVENT_CONNECT_ERROR,
                    };
                    tracing::debug!(error = %e, "connect failed");
                    id.event(kind, -errno, &[], std::ptr::null_mut());
                }
            }
        };
        softrdma_verbs::threads::spawn("softrdma-connect".into(), run).map_err(|_| libc::EAGAIN)?;
        if id.is_sync() {
            id.wait(RDMA_CM_EVENT_ESTABLISHED)?;
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_accept(idp: *mut rdma_cm_id, param: *mut rdma_conn_param) -> c_int {
    guard_rc(|| {
        // SAFETY: the caller's id.
        let id = unsafe { id_of(idp) }.ok_or(libc::EINVAL)?;
        let rt = objects::runtime()?;
        let qp = engine_qp(id).ok_or(libc::EINVAL)?;
        let req = id.st.lock().req.take().ok_or(libc::EINVAL)?;
        let params = conn_params(param, rt.cfg.crc);
        req.accept(&qp, &params).map_err(|e| crate::errno::of(&e))?;
        established(id, &[]);
        if id.is_sync() {
            id.wait(RDMA_CM_EVENT_ESTABLISHED)?;
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_reject(idp: *mut rdma_cm_id, pd: *const c_void, len: u8) -> c_int {
    guard_rc(|| {
        // SAFETY: the caller's id.
        let id = unsafe { id_of(idp) }.ok_or(libc::EINVAL)?;
        let req = id.st.lock().req.take().ok_or(libc::EINVAL)?;
        let data = if pd.is_null() {
            &[][..]
        } else {
            // SAFETY: `len` readable bytes.
            unsafe { std::slice::from_raw_parts(pd.cast::<u8>(), len as usize) }
        };
        req.reject(data).map_err(|e| crate::errno::of(&e))
    })
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_disconnect(idp: *mut rdma_cm_id) -> c_int {
    guard_rc(|| {
        // SAFETY: the caller's id.
        let id = unsafe { id_of(idp) }.ok_or(libc::EINVAL)?;
        let qp = engine_qp(id).ok_or(libc::EINVAL)?;
        qp.disconnect();
        // SAFETY: the id's QP's application view.
        unsafe {
            if let Some(q) = id.c.qp.as_mut() {
                q.state = IBV_QPS_ERR;
            }
        }
        on_disconnected(idp as usize);
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_get_cm_event(
    ch: *mut rdma_event_channel,
    out: *mut *mut rdma_cm_event,
) -> c_int {
    guard_rc(|| {
        // SAFETY: the caller's channel.
        let ch = unsafe { channel_of(ch) }.ok_or(libc::EINVAL)?;
        if out.is_null() {
            return Err(libc::EINVAL);
        }
        let mut e = ch.take()?;
        let who = if e.c.event == RDMA_CM_EVENT_CONNECT_REQUEST && !e.c.listen_id.is_null() {
            e.c.listen_id
        } else {
            e.c.id
        } as usize;
        if let Ok(cm) = cm() {
            let ids = cm.ids.lock();
            if ids.contains(&who) {
                // SAFETY: registered, so live while we hold the lock.
                let id = unsafe { &*(who as *const Id) };
                id.st.lock().unacked += 1;
                e.counted = who;
            }
        }
        // SAFETY: the caller's out pointer; the event is freed by
        // `rdma_ack_cm_event`.
        unsafe { *out = Box::into_raw(e).cast() };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_ack_cm_event(e: *mut rdma_cm_event) -> c_int {
    guard_rc(|| {
        if e.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: an event from `rdma_get_cm_event`, given back.
        let e = unsafe { Box::from_raw(e.cast::<Event>()) };
        if e.counted != 0 {
            // SAFETY: an id with an event not yet acknowledged is not
            // freed (`rdma_destroy_id` waits for this).
            let id = unsafe { &*(e.counted as *const Id) };
            let mut st = id.st.lock();
            st.unacked = st.unacked.saturating_sub(1);
            id.acked.notify_all();
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_event_str(e: rdma_cm_event_type) -> *const c_char {
    let s: &'static [u8] = match e {
        RDMA_CM_EVENT_ADDR_RESOLVED => b"RDMA_CM_EVENT_ADDR_RESOLVED\0",
        RDMA_CM_EVENT_ADDR_ERROR => b"RDMA_CM_EVENT_ADDR_ERROR\0",
        RDMA_CM_EVENT_ROUTE_RESOLVED => b"RDMA_CM_EVENT_ROUTE_RESOLVED\0",
        RDMA_CM_EVENT_ROUTE_ERROR => b"RDMA_CM_EVENT_ROUTE_ERROR\0",
        RDMA_CM_EVENT_CONNECT_REQUEST => b"RDMA_CM_EVENT_CONNECT_REQUEST\0",
        RDMA_CM_EVENT_CONNECT_RESPONSE => b"RDMA_CM_EVENT_CONNECT_RESPONSE\0",
        RDMA_CM_EVENT_CONNECT_ERROR => b"RDMA_CM_EVENT_CONNECT_ERROR\0",
        RDMA_CM_EVENT_UNREACHABLE => b"RDMA_CM_EVENT_UNREACHABLE\0",
        RDMA_CM_EVENT_REJECTED => b"RDMA_CM_EVENT_REJECTED\0",
        RDMA_CM_EVENT_ESTABLISHED => b"RDMA_CM_EVENT_ESTABLISHED\0",
        RDMA_CM_EVENT_DISCONNECTED => b"RDMA_CM_EVENT_DISCONNECTED\0",
        RDMA_CM_EVENT_DEVICE_REMOVAL => b"RDMA_CM_EVENT_DEVICE_REMOVAL\0",
        RDMA_CM_EVENT_MULTICAST_JOIN => b"RDMA_CM_EVENT_MULTICAST_JOIN\0",
        RDMA_CM_EVENT_MULTICAST_ERROR => b"RDMA_CM_EVENT_MULTICAST_ERROR\0",
        RDMA_CM_EVENT_ADDR_CHANGE => b"RDMA_CM_EVENT_ADDR_CHANGE\0",
        RDMA_CM_EVENT_TIMEWAIT_EXIT => b"RDMA_CM_EVENT_TIMEWAIT_EXIT\0",
        _ => b"UNKNOWN EVENT\0",
    };
    s.as_ptr().cast()
}

/// Options change nothing for a TCP-based device (type of service, reuse
/// of the address, IPv6-only, timeouts): accepted and ignored; unknown
/// levels are ENOSYS, as in librdmacm.
#[no_mangle]
pub extern "C" fn softrdma_rdma_set_option(
    id: *mut rdma_cm_id,
    level: c_int,
    _name: c_int,
    _val: *mut c_void,
    _len: usize,
) -> c_int {
    guard_rc(|| {
        // SAFETY: the caller's id.
        unsafe { id_of(id) }.ok_or(libc::EINVAL)?;
        if level == RDMA_OPTION_ID as c_int || level == RDMA_OPTION_IB as c_int {
            Ok(())
        } else {
            Err(libc::ENOSYS)
        }
    })
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_get_src_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: the caller's id.
    unsafe { id_of(id) }
        .and_then(|i| i.st.lock().src)
        .map_or(0, |a| a.port().to_be())
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_get_dst_port(id: *mut rdma_cm_id) -> u16 {
    // SAFETY: the caller's id.
    unsafe { id_of(id) }
        .and_then(|i| i.st.lock().dst)
        .map_or(0, |a| a.port().to_be())
}

/// Moves an id to another channel (events already queued stay where they
/// are). Moving a synchronous id, or to no channel, is not offered.
#[no_mangle]
pub extern "C" fn softrdma_rdma_migrate_id(
    idp: *mut rdma_cm_id,
    ch: *mut rdma_event_channel,
) -> c_int {
    guard_rc(|| {
        // SAFETY: the caller's id.
        let id = unsafe { id_of(idp) }.ok_or(libc::EINVAL)?;
        if id.is_sync() || ch.is_null() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the id's own field.
        unsafe { (*idp).channel = ch };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_create_ep(
    out: *mut *mut rdma_cm_id,
    res: *mut rdma_addrinfo,
    pd: *mut ibv_pd,
    qp_attr: *mut ibv_qp_init_attr,
) -> c_int {
    guard_rc(|| {
        // SAFETY: the caller's address info.
        let r = unsafe { res.as_ref() }.ok_or(libc::EINVAL)?;
        if out.is_null() {
            return Err(libc::EINVAL);
        }
        let ps = if r.ai_port_space == 0 {
            RDMA_PS_TCP
        } else {
            r.ai_port_space as rdma_port_space
        };
        let idp = new_id(std::ptr::null_mut(), std::ptr::null_mut(), ps)?;
        // SAFETY: just made.
        let id = unsafe { &*idp };
        let done = (|| {
            if r.ai_flags & RAI_PASSIVE as c_int != 0 {
                let src = read_sockaddr(r.ai_src_addr.cast()).ok_or(libc::EINVAL)?;
                bind(id, src)?;
                // SAFETY: the caller's attributes or null.
                if let Some(a) = unsafe { qp_attr.as_ref() } {
                    id.st.lock().ep_qp = Some((pd as usize, *a));
                }
                return Ok(());
            }
            let dst = read_sockaddr(r.ai_dst_addr.cast()).ok_or(libc::EINVAL)?;
            resolve_addr(id, read_sockaddr(r.ai_src_addr.cast()), dst)?;
            resolve_route(id)?;
            // SAFETY: the caller's attributes or null.
            if let Some(a) = unsafe { qp_attr.as_mut() } {
                create_qp(id, pd, a)?;
            }
            Ok(())
        })();
        if let Err(e) = done {
            softrdma_rdma_destroy_id(idp.cast());
            return Err(e);
        }
        // SAFETY: the caller's out pointer.
        unsafe { *out = idp.cast() };
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_destroy_ep(id: *mut rdma_cm_id) {
    softrdma_rdma_destroy_qp(id);
    softrdma_rdma_destroy_id(id);
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_get_request(
    listen: *mut rdma_cm_id,
    out: *mut *mut rdma_cm_id,
) -> c_int {
    guard_rc(|| {
        // SAFETY: the caller's id.
        let l = unsafe { id_of(listen) }.ok_or(libc::EINVAL)?;
        let ch = l.private.as_ref().ok_or(libc::EINVAL)?;
        if out.is_null() {
            return Err(libc::EINVAL);
        }
        let e = loop {
            let e = ch.take()?;
            if e.c.event == RDMA_CM_EVENT_CONNECT_REQUEST {
                break e;
            }
        };
        let childp = e.c.id;
        // SAFETY: the child made by the listener thread, registered.
        let child = unsafe { id_of(childp) }.ok_or(libc::EINVAL)?;
        let ep = l.st.lock().ep_qp;
        if let Some((pd, mut a)) = ep {
            create_qp(child, pd as *mut ibv_pd, &mut a)?;
        }
        // SAFETY: the caller's out pointer.
        unsafe { *out = childp };
        Ok(())
    })
}

/// For applications that move their own QP through its states: on iWARP
/// the CM owns the connection, so this only says whether it is up.
#[no_mangle]
pub extern "C" fn softrdma_rdma_establish(idp: *mut rdma_cm_id) -> c_int {
    guard_rc(|| {
        // SAFETY: the caller's id.
        let id = unsafe { id_of(idp) }.ok_or(libc::EINVAL)?;
        if id.st.lock().connected {
            Ok(())
        } else {
            Err(libc::EINVAL)
        }
    })
}

/// QP attributes for applications that create and move their own QPs
/// (rping `-q`): not offered on this iWARP device, whose QPs only reach
/// RTS through `rdma_connect` / `rdma_accept`.
#[no_mangle]
pub extern "C" fn softrdma_rdma_init_qp_attr(
    _id: *mut rdma_cm_id,
    _attr: *mut ibv_qp_attr,
    _mask: *mut c_int,
) -> c_int {
    set_errno(libc::ENOSYS);
    -1
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_get_devices(num: *mut c_int) -> *mut *mut ibv_context {
    guard_ptr(|| {
        let Ok(cm) = cm() else {
            set_errno(libc::ENODEV);
            return std::ptr::null_mut();
        };
        // SAFETY: two pointers, checked; freed by `rdma_free_devices`.
        let list = unsafe { libc::calloc(2, std::mem::size_of::<*mut ibv_context>()) }
            .cast::<*mut ibv_context>();
        if list.is_null() {
            set_errno(libc::ENOMEM);
            return list;
        }
        // SAFETY: `list` has two slots; `num` is the caller's or null.
        unsafe {
            *list = cm.ctx as *mut ibv_context;
            if !num.is_null() {
                *num = 1;
            }
        }
        list
    })
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_free_devices(list: *mut *mut ibv_context) {
    // SAFETY: from `rdma_get_devices` (calloc) or null.
    unsafe { libc::free(list.cast()) }
}

/// Nothing to notify on iWARP (the connection is up when RTS is).
#[no_mangle]
pub extern "C" fn softrdma_rdma_notify(id: *mut rdma_cm_id, _event: ibv_event_type) -> c_int {
    // SAFETY: the caller's id.
    if unsafe { id_of(id) }.is_none() {
        set_errno(libc::EINVAL);
        return -1;
    }
    0
}
