//! librdmacm's semantics on the engine's connection manager.
//!
//! The functions are exported as `softrdma_rdma_*` (node
//! `SOFTRDMA_PRIVATE_1`); `librdmacm.so.1` (`crates/rdmacm`) exports the
//! real names with Debian's versions, each a jump to the function here,
//! so that the process has one engine.
//!
//! - An event channel's fd is a semaphore eventfd counting queued events:
//!   poll/epoll work on it and `rdma_get_cm_event` blocks unless the
//!   application made it non-blocking.
//! - An id made without a channel is synchronous (`rdma_create_ep`): it
//!   gets a private channel and each call waits for its own event, as in
//!   librdmacm.
//! - Address and route resolution need no lookup (an iWARP device speaks
//!   TCP/IP): both complete at once with their event.
//! - `rdma_connect` runs the engine's TCP connect and MPA exchange on a
//!   thread of its own and ends with ESTABLISHED, REJECTED (the peer said
//!   no, or nothing listens: status -ECONNREFUSED), UNREACHABLE
//!   (-ETIMEDOUT) or CONNECT_ERROR. A listening id has a thread that
//!   takes connection requests from the engine's listener.
//! - DISCONNECTED comes once per connection: from `rdma_disconnect`, or
//!   from the engine's asynchronous events when the peer closed or the
//!   connection failed.

use crate::abi::*;
use crate::objects::{self, qp_of, semaphore_fd, take_semaphore};
use libc::{c_char, c_int, c_void};
use parking_lot::Mutex;
use softrdma_cabi::{export, guard_ptr, guard_rc, set_errno};
use softrdma_verbs::{ConnParams, ConnectRequest, Error, Listener, QueuePair};
use std::collections::{HashSet, VecDeque};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

export!("SOFTRDMA_PRIVATE_1": softrdma_rdma_create_event_channel,
    softrdma_rdma_destroy_event_channel, softrdma_rdma_create_id, softrdma_rdma_destroy_id,
    softrdma_rdma_bind_addr, softrdma_rdma_resolve_addr, softrdma_rdma_resolve_route,
    softrdma_rdma_listen, softrdma_rdma_connect, softrdma_rdma_accept, softrdma_rdma_reject,
    softrdma_rdma_disconnect, softrdma_rdma_get_cm_event, softrdma_rdma_ack_cm_event,
    softrdma_rdma_event_str, softrdma_rdma_create_qp, softrdma_rdma_create_qp_ex,
    softrdma_rdma_destroy_qp, softrdma_rdma_set_option, softrdma_rdma_get_src_port,
    softrdma_rdma_get_dst_port, softrdma_rdma_migrate_id, softrdma_rdma_getaddrinfo,
    softrdma_rdma_freeaddrinfo, softrdma_rdma_create_ep, softrdma_rdma_destroy_ep,
    softrdma_rdma_get_request, softrdma_rdma_establish, softrdma_rdma_init_qp_attr,
    softrdma_rdma_get_devices, softrdma_rdma_free_devices, softrdma_rdma_notify, softrdma_rpoll);

/// rdma_cma.h's `RAI_*` flags (macros, so not in the bindings).
const RAI_PASSIVE: u32 = 1;
const RAI_NUMERICHOST: u32 = 2;

// ---------------------------------------------------------------- state

/// An event channel: the C struct, its fd, its queue.
#[repr(C)]
pub struct Channel {
    c: rdma_event_channel,
    fd: OwnedFd,
    q: Mutex<VecDeque<Box<Event>>>,
}

/// An event and the private data its `param.conn` points into.
#[repr(C)]
pub struct Event {
    c: rdma_cm_event,
    private: Vec<u8>,
}

#[derive(Default)]
struct IdState {
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
    listen: Option<(Arc<AtomicBool>, std::thread::JoinHandle<()>)>,
    /// The listener `rdma_bind_addr` opened for a port it picked.
    early: Option<Listener>,
    req: Option<ConnectRequest>,
    /// `rdma_create_ep` on a passive id: what `rdma_get_request` creates
    /// each new id's QP with.
    ep_qp: Option<(usize, ibv_qp_init_attr)>,
    connected: bool,
    disconnected: bool,
    /// CQs and channels this library made for the id's QP.
    own_cqs: Vec<(usize, usize)>,
}

/// `struct rdma_cm_id` and its state.
#[repr(C)]
pub struct Id {
    c: rdma_cm_id,
    /// A synchronous id's private channel (made without one).
    private: Option<Box<Channel>>,
    st: Mutex<IdState>,
}

// SAFETY: the C struct's pointers are the application's handles; they are
// read and written under `st`'s lock or by the thread that owns the call.
unsafe impl Send for Id {}
// SAFETY: as above.
unsafe impl Sync for Id {}

/// The CM's own verbs context (librdmacm opens one per device) and its
/// default PD, made on first use; live ids by address.
struct Cm {
    ctx: usize,
    pd: Mutex<usize>,
    ids: Mutex<HashSet<usize>>,
}

fn cm() -> Result<&'static Cm, c_int> {
    static CM: OnceLock<Result<Cm, c_int>> = OnceLock::new();
    CM.get_or_init(|| {
        let rt = objects::runtime()?;
        let ctx = crate::verbs_device::ibv_open_device(rt.ibv_device());
        if ctx.is_null() {
            return Err(libc::ENODEV);
        }
        Ok(Cm {
            ctx: ctx as usize,
            pd: Mutex::new(0),
            ids: Mutex::new(HashSet::new()),
        })
    })
    .as_ref()
    .map_err(|e| *e)
}

fn default_pd(cm: &Cm) -> Result<*mut ibv_pd, c_int> {
    let mut pd = cm.pd.lock();
    if *pd == 0 {
        let p = crate::verbs_mr::ibv_alloc_pd(cm.ctx as *mut ibv_context);
        if p.is_null() {
            return Err(libc::ENOMEM);
        }
        *pd = p as usize;
    }
    Ok(*pd as *mut ibv_pd)
}

/// # Safety
/// `id` is null or a live id of this library.
unsafe fn id_of<'a>(id: *mut rdma_cm_id) -> Option<&'a Id> {
    // SAFETY: `rdma_cm_id` is the first field of a repr(C) `Id`.
    unsafe { id.cast::<Id>().as_ref() }
}

/// # Safety
/// `ch` is null or a live channel of this library.
unsafe fn channel_of<'a>(ch: *mut rdma_event_channel) -> Option<&'a Channel> {
    // SAFETY: `rdma_event_channel` is the first field of a repr(C) `Channel`.
    unsafe { ch.cast::<Channel>().as_ref() }
}

fn new_channel() -> Result<Box<Channel>, c_int> {
    let fd = semaphore_fd()?;
    Ok(Box::new(Channel {
        c: rdma_event_channel { fd: fd.as_raw_fd() },
        fd,
        q: Mutex::new(VecDeque::new()),
    }))
}

impl Channel {
    fn push(&self, e: Box<Event>) {
        self.q.lock().push_back(e);
        objects::post_semaphore(self.fd.as_raw_fd());
    }

    fn take(&self) -> Result<Box<Event>, c_int> {
        take_semaphore(self.fd.as_raw_fd())?;
        self.q.lock().pop_front().ok_or(libc::EAGAIN)
    }
}

impl Id {
    fn ptr(&self) -> *mut rdma_cm_id {
        (&self.c as *const rdma_cm_id).cast_mut()
    }

    fn channel(&self) -> Option<&Channel> {
        // SAFETY: an id's channel outlives it (the application destroys
        // ids before their channel; a private one is the id's own).
        unsafe { channel_of(self.c.channel) }
    }

    /// Queues an event for this id on its channel.
    fn event(
        &self,
        kind: rdma_cm_event_type,
        status: c_int,
        private: &[u8],
        listen: *mut rdma_cm_id,
    ) {
        // SAFETY: plain data; all zeroes is valid.
        let mut c: rdma_cm_event = unsafe { std::mem::zeroed() };
        c.id = self.ptr();
        c.listen_id = listen;
        c.event = kind;
        c.status = status;
        let mut e = Box::new(Event {
            c,
            private: private.to_vec(),
        });
        // `conn` is the union member for connection events; its pointer
        // aims into the event's own vector, freed with it.
        e.c.param.conn.private_data = e.private.as_ptr().cast();
        e.c.param.conn.private_data_len = e.private.len().min(255) as u8;
        if let Some(ch) = self.channel() {
            ch.push(e);
        }
    }

    fn set_addr(&self, src: Option<SocketAddr>, dst: Option<SocketAddr>) {
        // SAFETY: the id's own route storage (written by the call that
        // owns the id at this point, read by the application after).
        unsafe {
            let a = &self.c.route.addr as *const rdma_addr as *mut rdma_addr;
            if let Some(s) = src {
                write_sockaddr(
                    s,
                    (&mut (*a).__bindgen_anon_1.src_storage as *mut sockaddr_storage).cast(),
                );
            }
            if let Some(d) = dst {
                write_sockaddr(
                    d,
                    (&mut (*a).__bindgen_anon_2.dst_storage as *mut sockaddr_storage).cast(),
                );
            }
        }
        let mut st = self.st.lock();
        if src.is_some() {
            st.src = src;
        }
        if dst.is_some() {
            st.dst = dst;
        }
    }

    fn set_verbs(&self, ctx: usize) {
        // SAFETY: the id's own field.
        unsafe {
            let c = &self.c as *const rdma_cm_id as *mut rdma_cm_id;
            (*c).verbs = ctx as *mut ibv_context;
            (*c).port_num = 1;
        }
    }

    fn is_sync(&self) -> bool {
        self.private.is_some()
    }

    /// A synchronous id waits for its call's event: 0 if it is `want`.
    fn wait(&self, want: rdma_cm_event_type) -> Result<(), c_int> {
        let ch = self.private.as_ref().ok_or(libc::EINVAL)?;
        loop {
            let e = ch.take()?;
            let (kind, status) = (e.c.event, e.c.status);
            if kind == want {
                return if status == 0 { Ok(()) } else { Err(-status) };
            }
            match kind {
                RDMA_CM_EVENT_REJECTED => return Err(libc::ECONNREFUSED),
                RDMA_CM_EVENT_UNREACHABLE => return Err(libc::ETIMEDOUT),
                RDMA_CM_EVENT_CONNECT_ERROR
                | RDMA_CM_EVENT_ADDR_ERROR
                | RDMA_CM_EVENT_ROUTE_ERROR => {
                    return Err(if status < 0 { -status } else { libc::EIO })
                }
                // A disconnection seen while waiting for something else is
                // dropped; the call's own outcome follows.
                _ => {}
            }
        }
    }
}

fn read_sockaddr(p: *const sockaddr) -> Option<SocketAddr> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller's sockaddr; its family says how long it is.
    unsafe {
        match (*p).sa_family as c_int {
            libc::AF_INET => {
                let s = &*p.cast::<libc::sockaddr_in>();
                Some(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
                    u16::from_be(s.sin_port),
                )))
            }
            libc::AF_INET6 => {
                let s = &*p.cast::<libc::sockaddr_in6>();
                Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(s.sin6_addr.s6_addr),
                    u16::from_be(s.sin6_port),
                    s.sin6_flowinfo,
                    s.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

/// # Safety
/// `p` points to writable storage for a `sockaddr_storage`.
unsafe fn write_sockaddr(a: SocketAddr, p: *mut libc::sockaddr_storage) {
    // SAFETY: the caller's storage, large enough for either family.
    unsafe {
        std::ptr::write_bytes(p, 0, 1);
        match a {
            SocketAddr::V4(v) => {
                let s = &mut *p.cast::<libc::sockaddr_in>();
                s.sin_family = libc::AF_INET as libc::sa_family_t;
                s.sin_port = v.port().to_be();
                s.sin_addr.s_addr = u32::from(*v.ip()).to_be();
            }
            SocketAddr::V6(v) => {
                let s = &mut *p.cast::<libc::sockaddr_in6>();
                s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                s.sin6_port = v.port().to_be();
                s.sin6_addr.s6_addr = v.ip().octets();
                s.sin6_flowinfo = v.flowinfo();
                s.sin6_scope_id = v.scope_id();
            }
        }
    }
}

/// The source address the kernel would use towards `dst`.
fn source_for(dst: SocketAddr) -> SocketAddr {
    let any: SocketAddr = match dst {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    std::net::UdpSocket::bind(any)
        .and_then(|s| {
            s.connect(dst)?;
            s.local_addr()
        })
        .map(|a| SocketAddr::new(a.ip(), 0))
        .unwrap_or(any)
}

fn new_id(
    channel: *mut rdma_event_channel,
    context: *mut c_void,
    ps: rdma_port_space,
) -> Result<*mut Id, c_int> {
    let cm = cm()?;
    let private = if channel.is_null() {
        Some(new_channel()?)
    } else {
        None
    };
    // SAFETY: plain data; all zeroes is valid.
    let mut c: rdma_cm_id = unsafe { std::mem::zeroed() };
    c.channel = match &private {
        Some(p) => (&p.c as *const rdma_event_channel).cast_mut(),
        None => channel,
    };
    c.context = context;
    c.ps = ps;
    c.qp_type = if ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB {
        IBV_QPT_UD
    } else {
        IBV_QPT_RC
    };
    let id = Box::into_raw(Box::new(Id {
        c,
        private,
        st: Mutex::new(IdState::default()),
    }));
    cm.ids.lock().insert(id as usize);
    Ok(id)
}

fn conn_params(p: *const rdma_conn_param, crc: bool) -> ConnParams {
    let mut cp = ConnParams {
        crc,
        ..ConnParams::default()
    };
    // SAFETY: the caller's parameters or null.
    if let Some(p) = unsafe { p.as_ref() } {
        if !p.private_data.is_null() && p.private_data_len > 0 {
            // SAFETY: `private_data_len` bytes are readable.
            cp.private_data = unsafe {
                std::slice::from_raw_parts(p.private_data.cast::<u8>(), p.private_data_len as usize)
            }
            .to_vec();
        }
        cp.ird = p.responder_resources as u16;
        cp.ord = p.initiator_depth as u16;
    }
    cp
}

fn engine_qp(id: &Id) -> Option<Arc<QueuePair>> {
    // SAFETY: the id's QP, made by `rdma_create_qp`, or null.
    unsafe { qp_of(id.c.qp) }.map(|q| q.qp.clone())
}

fn mark_rts(id: &Id) {
    // SAFETY: the id's QP or null; `state` is the application's view.
    unsafe {
        if let Some(q) = id.c.qp.as_mut() {
            q.state = IBV_QPS_RTS;
        }
    }
}

fn errno_of(e: &Error) -> c_int {
    crate::errno::of(e)
}

/// The engine says a QP's connection ended (peer closed, Terminate, local
/// failure): DISCONNECTED for its id, once.
pub fn on_disconnected(id: usize) {
    let Ok(cm) = cm() else { return };
    let ids = cm.ids.lock();
    if !ids.contains(&id) {
        return;
    }
    // SAFETY: registered, so live (removed under this lock before freed).
    let id = unsafe { &*(id as *const Id) };
    let mut st = id.st.lock();
    if st.connected && !st.disconnected {
        st.disconnected = true;
        drop(st);
        id.event(RDMA_CM_EVENT_DISCONNECTED, 0, &[], std::ptr::null_mut());
    }
}

/// A QP is being destroyed: nothing here holds it (ids hold the engine's
/// handle only while connecting).
pub fn qp_destroyed(_qp: *mut ibv_qp) {}

fn route_qp_to(id: &Id) {
    let Ok(rt) = objects::runtime() else { return };
    // SAFETY: the id's QP or null.
    if let Some(q) = unsafe { id.c.qp.as_ref() } {
        if let Some(r) = rt.qps.lock().get_mut(&q.qp_num) {
            r.cm_id = id as *const Id as usize;
        }
    }
}

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
        // SAFETY: the Box leaked by `rdma_create_event_channel`.
        drop(unsafe { Box::from_raw(ch.cast::<Channel>()) });
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
        // SAFETY: registered until just now; the Box leaked by `new_id`.
        let b = unsafe { Box::from_raw(id.cast::<Id>()) };
        let mut st = b.st.lock();
        if let Some((stop, t)) = st.listen.take() {
            stop.store(true, Ordering::Release);
            let _ = t.join();
        }
        st.req.take();
        let cqs = std::mem::take(&mut st.own_cqs);
        drop(st);
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
        let l = rt.dev.listen(addr).map_err(|e| errno_of(&e))?;
        addr = l.local_addr().map_err(|e| errno_of(&e))?;
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
            None => rt.dev.listen(src).map_err(|e| errno_of(&e))?,
        };
        let bound = l.local_addr().map_err(|e| errno_of(&e))?;
        tracing::debug!(%bound, "rdma_listen");
        id.set_addr(Some(bound), None);
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let idu = idp as usize;
        let t = std::thread::Builder::new()
            .name("softrdma-listen".into())
            .spawn(move || listen_loop(l, idu, stop2))
            .map_err(|_| libc::EAGAIN)?;
        id.st.lock().listen = Some((stop, t));
        Ok(())
    })
}

fn listen_loop(l: Listener, listen_id: usize, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::Acquire) {
        let req = match l.get_request_timeout(Duration::from_millis(100)) {
            Ok(Some(r)) => r,
            Ok(None) => continue,
            Err(e) => {
                tracing::debug!(error = %e, "a connection request failed");
                continue;
            }
        };
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
        let mut e = Box::new(Event { c: ev, private });
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
        if a.comp_mask & !IBV_QP_INIT_ATTR_PD != 0 || a.create_flags != 0 {
            return Err(libc::EOPNOTSUPP);
        }
        let pd = if a.comp_mask & IBV_QP_INIT_ATTR_PD != 0 {
            a.pd
        } else {
            std::ptr::null_mut()
        };
        let mut basic = ibv_qp_init_attr {
            qp_context: a.qp_context,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            cap: a.cap,
            qp_type: a.qp_type,
            sq_sig_all: a.sq_sig_all,
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
            let Ok(cm) = cm() else { return };
            let ids = cm.ids.lock();
            if !ids.contains(&idu) {
                return;
            }
            // SAFETY: registered, so live while we hold the lock.
            let id = unsafe { &*(idu as *const Id) };
            match r {
                Ok(pd) => {
                    id.st.lock().connected = true;
                    mark_rts(id);
                    id.event(RDMA_CM_EVENT_ESTABLISHED, 0, &pd, std::ptr::null_mut());
                }
                Err(Error::Rejected { private_data }) => id.event(
                    RDMA_CM_EVENT_REJECTED,
                    -libc::ECONNREFUSED,
                    &private_data,
                    std::ptr::null_mut(),
                ),
                Err(e) => {
                    let errno = errno_of(&e);
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
        std::thread::Builder::new()
            .name("softrdma-connect".into())
            .spawn(run)
            .map_err(|_| libc::EAGAIN)?;
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
        req.accept(&qp, &params).map_err(|e| errno_of(&e))?;
        id.st.lock().connected = true;
        mark_rts(id);
        id.event(RDMA_CM_EVENT_ESTABLISHED, 0, &[], std::ptr::null_mut());
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
        req.reject(data).map_err(|e| errno_of(&e))
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
        let e = ch.take()?;
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
        drop(unsafe { Box::from_raw(e.cast::<Event>()) });
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
pub extern "C" fn softrdma_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard_rc(|| {
        if res.is_null() || (node.is_null() && service.is_null()) {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's hints or null.
        let h = unsafe { hints.as_ref() };
        let passive = h.is_some_and(|h| h.ai_flags & RAI_PASSIVE as c_int != 0);
        // SAFETY: plain data; all zeroes is valid.
        let mut lh: libc::addrinfo = unsafe { std::mem::zeroed() };
        lh.ai_family = h.map_or(libc::AF_UNSPEC, |h| h.ai_family);
        lh.ai_socktype = libc::SOCK_STREAM;
        if passive {
            lh.ai_flags |= libc::AI_PASSIVE;
        }
        if h.is_some_and(|h| h.ai_flags & RAI_NUMERICHOST as c_int != 0) {
            lh.ai_flags |= libc::AI_NUMERICHOST;
        }
        let mut found: *mut libc::addrinfo = std::ptr::null_mut();
        // SAFETY: C strings or null from the caller; our hints; out pointer.
        let r = unsafe { libc::getaddrinfo(node, service, &lh, &mut found) };
        if r != 0 || found.is_null() {
            return Err(libc::EADDRNOTAVAIL);
        }
        // SAFETY: a result of getaddrinfo, freed below.
        let addr = read_sockaddr(unsafe { (*found).ai_addr }.cast());
        // SAFETY: from getaddrinfo.
        unsafe { libc::freeaddrinfo(found) };
        let addr = addr.ok_or(libc::EAFNOSUPPORT)?;
        let sa_len = std::mem::size_of::<libc::sockaddr_storage>();
        // SAFETY: calloc'd, checked; freed by `rdma_freeaddrinfo`.
        unsafe {
            let ai = libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()).cast::<rdma_addrinfo>();
            let sa = libc::calloc(1, sa_len).cast::<libc::sockaddr_storage>();
            if ai.is_null() || sa.is_null() {
                libc::free(ai.cast());
                libc::free(sa.cast());
                return Err(libc::ENOMEM);
            }
            write_sockaddr(addr, sa);
            let a = &mut *ai;
            a.ai_flags = h.map_or(0, |h| h.ai_flags);
            a.ai_family = if addr.is_ipv4() {
                libc::AF_INET
            } else {
                libc::AF_INET6
            };
            a.ai_qp_type = h.map_or(IBV_QPT_RC as c_int, |h| {
                if h.ai_qp_type == 0 {
                    IBV_QPT_RC as c_int
                } else {
                    h.ai_qp_type
                }
            });
            a.ai_port_space = h.map_or(RDMA_PS_TCP as c_int, |h| {
                if h.ai_port_space == 0 {
                    RDMA_PS_TCP as c_int
                } else {
                    h.ai_port_space
                }
            });
            let len = if addr.is_ipv4() {
                std::mem::size_of::<libc::sockaddr_in>()
            } else {
                std::mem::size_of::<libc::sockaddr_in6>()
            } as socklen_t;
            if passive {
                a.ai_src_addr = sa.cast();
                a.ai_src_len = len;
            } else {
                a.ai_dst_addr = sa.cast();
                a.ai_dst_len = len;
                if let Some(src) = h.and_then(|h| read_sockaddr(h.ai_src_addr)) {
                    let s2 = libc::calloc(1, sa_len).cast::<libc::sockaddr_storage>();
                    if !s2.is_null() {
                        write_sockaddr(src, s2);
                        a.ai_src_addr = s2.cast();
                        a.ai_src_len = h.map_or(0, |h| h.ai_src_len);
                    }
                }
            }
            *res = ai;
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut cur = res;
    while !cur.is_null() {
        // SAFETY: a list from `rdma_getaddrinfo` (calloc'd pieces).
        unsafe {
            let next = (*cur).ai_next;
            libc::free((*cur).ai_src_addr.cast());
            libc::free((*cur).ai_dst_addr.cast());
            libc::free(cur.cast());
            cur = next;
        }
    }
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

/// rsockets' `rpoll` (rping imports it): there are no rsockets here, and
/// for ordinary descriptors `rpoll` is `poll`.
#[no_mangle]
pub extern "C" fn softrdma_rpoll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int {
    // SAFETY: the caller's array of `n` pollfds, as for poll(2).
    unsafe { libc::poll(fds, n, timeout) }
}
