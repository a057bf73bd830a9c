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

mod addr;
mod conn;

use crate::abi::*;
use crate::objects::{self, qp_of, semaphore_fd, take_semaphore};
use addr::{read_sockaddr, write_sockaddr};
use libc::{c_char, c_int, c_void};
use parking_lot::{Condvar, Mutex};
use softrdma_cabi::{export, guard_ptr, guard_rc, set_errno};
use softrdma_verbs::{ConnParams, ConnectRequest, Error, Listener, QueuePair};
use std::collections::{HashSet, VecDeque};
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

/// How long an initiator whose peer is not softrdma (no extensions, no
/// peer-to-peer mode) holds ESTABLISHED back after the MPA reply, so that
/// the application's first FPDU does not follow the reply at once. Linux
/// siw as the responder installs its RDMA-mode receive callback only after
/// sending the MPA reply (`siw_accept`); an FPDU that arrives in between
/// stays unnoticed in its socket until more data comes, and an application
/// whose responder waits for the initiator's first message (rping,
/// perftest's `-R` control exchange) hangs. rdma-core's applications on a
/// kernel initiator are never that quick; ours on the engine are (our
/// Send went 0.3 to 0.6 ms after siw's reply, and 4 of 16 guest servers
/// hung, docs/libibverbs.md). `softrdma rping` waits the same 50 ms
/// (`--first-send-delay-ms`).
const FIRST_SEND_GRACE: Duration = Duration::from_millis(50);

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
    /// The id this event counts against once `rdma_get_cm_event` handed it
    /// out (a connection request: the listening id), 0 before: it stays
    /// live until `rdma_ack_cm_event` (see `rdma_destroy_id`).
    counted: usize,
}

#[derive(Default)]
struct IdState {
    src: Option<SocketAddr>,
    dst: Option<SocketAddr>,
    listen: Option<(Arc<Listener>, std::thread::JoinHandle<()>)>,
    /// The listener `rdma_bind_addr` opened for a port it picked.
    early: Option<Listener>,
    req: Option<ConnectRequest>,
    /// `rdma_create_ep` on a passive id: what `rdma_get_request` creates
    /// each new id's QP with.
    ep_qp: Option<(usize, ibv_qp_init_attr)>,
    connected: bool,
    /// ESTABLISHED was queued for the application.
    established: bool,
    /// The engine said the connection ended (or the application
    /// disconnected), perhaps before ESTABLISHED was queued.
    hung_up: bool,
    /// DISCONNECTED was queued.
    disconnected: bool,
    /// Events handed out for this id and not yet acknowledged.
    unacked: u32,
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
    /// Signalled when `unacked` falls.
    acked: Condvar,
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
        let _ = rt.on_disconnected.set(on_disconnected);
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

/// Destroyed channels kept whole for a while (at most this many).
const RETIRED: usize = 64;

/// `rdma_destroy_event_channel`: the channel is kept, its eventfd open,
/// among the last [`RETIRED`] destroyed ones instead of being freed at
/// once. An application's event thread may be between two
/// `rdma_get_cm_event` calls when its main thread destroys the channel
/// (rping's CM thread acknowledges DISCONNECTED, which lets the main
/// thread's `rdma_destroy_id` return, and loops back to wait while the
/// main thread goes on to destroy the channel). With librdmacm that thread
/// is normally already blocked in the kernel, where a close does not wake
/// it, and the process exits from `main`. Freed here, the late call read
/// freed memory and a closed fd, and failed with EBADF: rping's thread
/// then printed `rdma_get_cm_event: Bad file descriptor` and exited
/// non-zero before `main` did (seen in CI beside a CPU hog). Kept, the
/// late call waits on an eventfd nobody posts to, as it would in the
/// kernel.
pub(crate) fn retire_channel(ch: Box<Channel>) {
    // Addresses: a channel holds raw pointers (its queued events'), so it
    // is not `Send` and cannot sit in a static as a `Box`.
    static LIST: Mutex<VecDeque<usize>> = Mutex::new(VecDeque::new());
    let old = {
        let mut l = LIST.lock();
        l.push_back(Box::into_raw(ch) as usize);
        if l.len() > RETIRED {
            l.pop_front()
        } else {
            None
        }
    };
    if let Some(p) = old {
        // SAFETY: a Box this function leaked, taken off the list once.
        drop(unsafe { Box::from_raw(p as *mut Channel) });
    }
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
            counted: 0,
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
        acked: Condvar::new(),
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

/// The engine says a QP's connection ended (peer closed, Terminate, local
/// failure): DISCONNECTED for its id, once, and never before its
/// ESTABLISHED. A peer can connect, send and close before the accepting
/// thread queues ESTABLISHED (the progress thread reads it all while that
/// thread waits for a core): the hang-up is then kept and [`established`]
/// queues DISCONNECTED after ESTABLISHED. (It was dropped, and an rdma_cm
/// server that got its data waited for DISCONNECTED forever:
/// tests/dropin.rs, about once in 15 runs beside two CPU hogs.)
pub fn on_disconnected(id: usize) {
    let Ok(cm) = cm() else { return };
    let ids = cm.ids.lock();
    if !ids.contains(&id) {
        return;
    }
    // SAFETY: registered, so live (removed under this lock before freed).
    let id = unsafe { &*(id as *const Id) };
    let mut st = id.st.lock();
    st.hung_up = true;
    if st.established && !st.disconnected {
        st.disconnected = true;
        drop(st);
        id.event(RDMA_CM_EVENT_DISCONNECTED, 0, &[], std::ptr::null_mut());
    }
}

/// The connection is up (`rdma_accept`, `rdma_connect`): ESTABLISHED
/// with the peer's private data, then DISCONNECTED if the connection
/// already ended ([`on_disconnected`]; one of the two queues it, under
/// the id's lock).
fn established(id: &Id, private: &[u8]) {
    id.st.lock().connected = true;
    mark_rts(id);
    id.event(RDMA_CM_EVENT_ESTABLISHED, 0, private, std::ptr::null_mut());
    let mut st = id.st.lock();
    st.established = true;
    if st.hung_up && !st.disconnected {
        st.disconnected = true;
        drop(st);
        id.event(RDMA_CM_EVENT_DISCONNECTED, 0, &[], std::ptr::null_mut());
    }
}

fn route_qp_to(id: &Id) {
    let Ok(rt) = objects::runtime() else { return };
    // SAFETY: the id's QP or null.
    if let Some(q) = unsafe { id.c.qp.as_ref() } {
        if let Some(r) = rt.qps.lock().get_mut(&q.qp_num) {
            r.cm_id = id as *const Id as usize;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The kinds of the events queued on channel `ch`, taken off it.
    fn queued(ch: *mut rdma_event_channel) -> Vec<rdma_cm_event_type> {
        // SAFETY: a channel made by `rdma_create_event_channel` below.
        let ch = unsafe { channel_of(ch) }.expect("channel");
        let mut q = ch.q.lock();
        let kinds = q.iter().map(|e| e.c.event).collect();
        for _ in q.drain(..) {
            take_semaphore(ch.fd.as_raw_fd()).expect("one count per event");
        }
        kinds
    }

    /// A peer that connects, sends and closes while the accepting thread
    /// waits for a core: the engine reports the hang-up before
    /// ESTABLISHED is queued. DISCONNECTED still comes, after
    /// ESTABLISHED, once (it was dropped: a server waited for it forever).
    #[test]
    fn a_hang_up_before_established_is_queued_after_it() {
        let ch = conn::softrdma_rdma_create_event_channel();
        assert!(!ch.is_null());
        let mut idp: *mut rdma_cm_id = std::ptr::null_mut();
        let rc = conn::softrdma_rdma_create_id(ch, &mut idp, std::ptr::null_mut(), RDMA_PS_TCP);
        assert_eq!(rc, 0);
        on_disconnected(idp as usize);
        assert_eq!(queued(ch), Vec::<rdma_cm_event_type>::new());
        // SAFETY: the id just made, live until destroyed below.
        established(unsafe { &*(idp as *const Id) }, &[]);
        assert_eq!(
            queued(ch),
            vec![RDMA_CM_EVENT_ESTABLISHED, RDMA_CM_EVENT_DISCONNECTED]
        );
        on_disconnected(idp as usize);
        assert_eq!(queued(ch), Vec::<rdma_cm_event_type>::new());
        assert_eq!(conn::softrdma_rdma_destroy_id(idp), 0);
        conn::softrdma_rdma_destroy_event_channel(ch);
    }

    /// The usual order: ESTABLISHED, then the hang-up's DISCONNECTED.
    #[test]
    fn a_hang_up_after_established_is_queued_once() {
        let ch = conn::softrdma_rdma_create_event_channel();
        let mut idp: *mut rdma_cm_id = std::ptr::null_mut();
        let rc = conn::softrdma_rdma_create_id(ch, &mut idp, std::ptr::null_mut(), RDMA_PS_TCP);
        assert_eq!(rc, 0);
        // SAFETY: the id just made, live until destroyed below.
        established(unsafe { &*(idp as *const Id) }, &[]);
        on_disconnected(idp as usize);
        on_disconnected(idp as usize);
        assert_eq!(
            queued(ch),
            vec![RDMA_CM_EVENT_ESTABLISHED, RDMA_CM_EVENT_DISCONNECTED]
        );
        assert_eq!(conn::softrdma_rdma_destroy_id(idp), 0);
        conn::softrdma_rdma_destroy_event_channel(ch);
    }

    /// An event thread that asks a destroyed channel for its next event
    /// (rping's, racing its main thread) waits as on a closed kernel fd
    /// rather than failing with EBADF; made non-blocking by the
    /// application, the fd says there is nothing (EAGAIN).
    #[test]
    fn a_late_reader_of_a_destroyed_channel_waits_instead_of_failing() {
        let ch = conn::softrdma_rdma_create_event_channel();
        assert!(!ch.is_null());
        // SAFETY: the channel just made.
        let fd = unsafe { (*ch).fd };
        // SAFETY: fcntl on the channel's own fd.
        unsafe {
            let fl = libc::fcntl(fd, libc::F_GETFL);
            assert_eq!(libc::fcntl(fd, libc::F_SETFL, fl | libc::O_NONBLOCK), 0);
        }
        conn::softrdma_rdma_destroy_event_channel(ch);
        let mut ev: *mut rdma_cm_event = std::ptr::null_mut();
        let rc = conn::softrdma_rdma_get_cm_event(ch, &mut ev);
        let errno = std::io::Error::last_os_error().raw_os_error();
        assert_eq!((rc, errno), (-1, Some(libc::EAGAIN)));
        assert!(ev.is_null());
    }
}
