//! The thread that turns the engine's asynchronous events into verbs and
//! CM events: a QP's fatal error goes to its context's queue
//! (`ibv_get_async_event`), a disconnection to the connection manager
//! (through `Runtime::on_disconnected`, so that this module, below `cm`,
//! does not call up into it).

use crate::abi::*;
use crate::objects::{ctx_of, AsyncEv, Runtime};
use softrdma_verbs::AsyncEvent;
use std::time::Duration;

/// Starts the thread once per process (at the first `ibv_open_device`:
/// nothing can have a QP before a context).
pub fn start(rt: &'static Runtime) {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| spawn(rt));
}

/// Starts the thread that delivers the engine's asynchronous events: a
/// QP's fatal error to its context's queue (`ibv_get_async_event`), a
/// disconnection to the CM id that owns the QP.
fn spawn(rt: &'static Runtime) {
    let r = softrdma_verbs::threads::spawn("softrdma-events".into(), move || loop {
        // While a spinning poller holds the lease, look as often as it
        // lasts whether the poller stopped (`spin`); otherwise sleep long.
        // So too while posts are held for a poll (`cork`).
        let tick = if rt.spin.held() || rt.cork.ticking() {
            crate::spin::LEASE.min(crate::cork::CORK_MAX)
        } else {
            Duration::from_millis(200)
        };
        let ev = rt.dev.next_event(tick);
        rt.spin.release_if_stale();
        rt.cork.tick();
        let Some(ev) = ev else {
            continue;
        };
        let (qpn, kind) = match &ev {
            AsyncEvent::Disconnected { qpn } => (*qpn, None),
            AsyncEvent::Terminated { qpn, .. } | AsyncEvent::QpFatal { qpn, .. } => {
                (*qpn, Some(IBV_EVENT_QP_FATAL))
            }
            AsyncEvent::SqDrained { qpn } => (*qpn, Some(IBV_EVENT_SQ_DRAINED)),
        };
        tracing::debug!(?ev, "asynchronous event");
        let routes = rt.qps.lock();
        let Some(route) = routes.get(&qpn.raw()).cloned() else {
            continue;
        };
        if let Some(kind) = kind {
            // SAFETY: a route names a live QP of a live context (the
            // QP is removed under this lock before it is destroyed).
            if let Some(c) = unsafe { ctx_of(route.ctx as *mut ibv_context) } {
                c.push_event(AsyncEv {
                    kind,
                    object: route.qp,
                });
            }
        }
        if kind != Some(IBV_EVENT_SQ_DRAINED) && route.cm_id != 0 {
            if let Some(f) = rt.on_disconnected.get() {
                f(route.cm_id);
            }
        }
        drop(routes);
    });
    if let Err(e) = r {
        eprintln!("softrdma: cannot start the event thread: {e}");
    }
}
