//! The storage target (`softrdma storage serve`): admits iWARP connections
//! with a principal's token, registers the principal's partitions for each
//! one, answers control messages, and keeps every live connection's rights
//! within the grants on the device.
//!
//! **Grants are live.** Admission reads the metadata from the device
//! ([`Endpoint::layout`]), so a `storage grant` made by another process
//! reaches the next connection. A watcher thread polls the metadata's
//! stamp every [`GRANT_POLL`] and, when it changed, narrows each live
//! connection to the new grants ([`Session::narrow_to`]): a revoked right
//! is withdrawn from the connection's registration in place (the STag
//! stays; the next access needing the right gets the protection
//! Terminate), a partition with no right left is invalidated, and the
//! partition's backend waits for transfers already moving bytes. A live
//! connection is never widened: new rights need a new connection.
//!
//! Why polling, not inotify: a poll costs two small reads per copy under a
//! shared lock (microseconds), whatever the load; inotify would wake the
//! watcher on every data write the target itself makes (an `IN_MODIFY`
//! per `pwrite` to the device), and it misses writes through another node
//! of the same block device or from another mount namespace. The bound
//! it gives, one poll interval, is what the docs promise.

use crate::endpoint::{Endpoint, Session};
use crate::layout::Layout;
use crate::wire::*;
use parking_lot::Mutex;
use softrdma_verbs::{
    Access, ConnParams, Device, MemoryRegion, ProtectionDomain, QpState, QueuePair,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How often the target looks for changed grants: the longest a revoke
/// waits, after `storage revoke` returned, before the target starts
/// applying it to live connections.
pub const GRANT_POLL: Duration = Duration::from_millis(20);

/// A storage target: accepts connections until `stop` is set.
pub struct Target {
    ep: Arc<Endpoint>,
    dev: Device,
    listener: softrdma_verbs::Listener,
    conns: Mutex<Vec<Conn>>,
}

struct Conn {
    qp: Arc<QueuePair>,
    session: Arc<Session>,
    control: Option<std::thread::JoinHandle<()>>,
}

impl Target {
    /// Listens on `addr` on a device of its own.
    pub fn bind(ep: Arc<Endpoint>, addr: std::net::SocketAddr) -> Result<Target, String> {
        let dev = Device::open(softrdma_verbs::DeviceConfig {
            // Backed regions never take the same-host path; nothing to
            // offer.
            same_host: false,
            ..Default::default()
        })
        .map_err(|e| e.to_string())?;
        let listener = dev.listen(addr).map_err(|e| e.to_string())?;
        Ok(Target {
            ep,
            dev,
            listener,
            conns: Mutex::new(Vec::new()),
        })
    }

    /// Where it listens.
    pub fn local_addr(&self) -> std::net::SocketAddr {
        self.listener.local_addr().expect("bound listener")
    }

    /// Serves until `stop` is set (checked every 100 ms), with the grants
    /// watcher on a thread of its own (a slow handshake never delays a
    /// revoke). Should the watcher ever end by itself (a bug: it panicked),
    /// the target stops serving rather than go on with rights nobody
    /// narrows; the panic then propagates.
    pub fn run(&self, stop: &AtomicBool) {
        std::thread::scope(|s| {
            let watcher = std::thread::Builder::new()
                .name("storage-grants".into())
                .spawn_scoped(s, || self.watch(stop))
                .expect("spawning the grants watcher");
            self.accept_loop(stop, &|| watcher.is_finished());
        });
    }

    fn accept_loop(&self, stop: &AtomicBool, watcher_gone: &dyn Fn() -> bool) {
        while !stop.load(Ordering::Relaxed) {
            if watcher_gone() {
                tracing::error!("storage target: the grants watcher ended; no longer serving");
                self.conns.lock().clear();
                return;
            }
            // Ended connections go; joining their control threads happens
            // outside the lock the watcher takes.
            let dead: Vec<Conn> = {
                let mut conns = self.conns.lock();
                let (dead, live) = std::mem::take(&mut *conns)
                    .into_iter()
                    .partition(|c| c.qp.state() == QpState::Error);
                *conns = live;
                dead
            };
            drop(dead);
            let req = match self
                .listener
                .get_request_timeout(Duration::from_millis(100))
            {
                Ok(Some(r)) => r,
                Ok(None) => continue,
                Err(e) => {
                    tracing::warn!("storage target: connection request failed: {e}");
                    continue;
                }
            };
            let peer = req.peer_addr();
            match self.admit(req) {
                Ok(c) => {
                    tracing::info!(%peer, principal = %c.session.principal, "storage connection");
                    self.conns.lock().push(c)
                }
                Err(e) => tracing::warn!(%peer, "storage connection refused: {e}"),
            }
        }
    }

    /// Every [`GRANT_POLL`]: the metadata on the device, and each live
    /// connection narrowed to it. (A connection admitted with an older
    /// layout than the watcher applied last is caught on the next poll:
    /// each session remembers the layout it was reconciled with.)
    fn watch(&self, stop: &AtomicBool) {
        let mut failing: Option<String> = None;
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(GRANT_POLL);
            let layout = match self.ep.layout() {
                Ok(l) => {
                    if failing.take().is_some() {
                        tracing::info!("storage metadata readable again");
                    }
                    l
                }
                Err(e) => {
                    // Live connections keep their (last narrowed) rights;
                    // admission refuses until the metadata reads again.
                    let msg = e.to_string();
                    if failing.as_deref() != Some(&msg) {
                        tracing::error!("storage metadata unreadable: {msg}");
                        failing = Some(msg);
                    }
                    continue;
                }
            };
            let sessions: Vec<(Arc<Session>, Arc<QueuePair>)> = self
                .conns
                .lock()
                .iter()
                .map(|c| (c.session.clone(), c.qp.clone()))
                .collect();
            for (s, qp) in sessions {
                apply(&s, &qp, &layout);
            }
        }
    }

    fn admit(&self, req: softrdma_verbs::ConnectRequest) -> Result<Conn, String> {
        let refuse = |req: softrdma_verbs::ConnectRequest, why: String| {
            let mut pd = REJ_MAGIC.to_vec();
            pd.extend_from_slice(why.as_bytes());
            let _ = req.reject(&pd);
            Err(why)
        };
        let (token, relaxed) = match decode_request(req.private_data()) {
            Ok(x) => x,
            Err(e) => return refuse(req, e),
        };
        // The grants as they are on the device now.
        let layout = match self.ep.layout() {
            Ok(l) => l,
            Err(e) => {
                tracing::error!("storage metadata unreadable at admission: {e}");
                return refuse(req, "the store's metadata cannot be read".into());
            }
        };
        let Some(principal) = layout.authenticate(&token) else {
            return refuse(req, "unknown token".into());
        };
        let pd = self.dev.alloc_pd().map_err(|e| e.to_string())?;
        let session = Arc::new(
            self.ep
                .attach_connection(&layout, principal, &pd, relaxed)
                .map_err(|e| e.to_string())?,
        );
        let accept = encode_accept(&session.regions());
        let cq = self.dev.create_cq(64).map_err(|e| e.to_string())?;
        let qp = pd
            .create_qp(softrdma_verbs::QpInitAttr::new(&cq))
            .map_err(|e| e.to_string())?;
        // Control messages: receives posted (in INIT) before the peer can
        // send.
        qp.modify(QpState::Init).map_err(|e| e.to_string())?;
        let bufs = pd
            .alloc_mr(CTRL_SLOTS * CTRL_MAX, Access::LOCAL_WRITE)
            .map_err(|e| e.to_string())?;
        for i in 0..CTRL_SLOTS {
            qp.post_recv(&softrdma_verbs::RecvWr::new(
                i as u64,
                &[bufs.sge(i * CTRL_MAX, CTRL_MAX)],
            ))
            .map_err(|e| e.to_string())?;
        }
        req.accept(
            &qp,
            &ConnParams {
                private_data: accept,
                ..Default::default()
            },
        )
        .map_err(|e| e.to_string())?;
        let qp = Arc::new(qp);
        let (q, s) = (qp.clone(), session.clone());
        let control = std::thread::Builder::new()
            .name("storage-ctl".into())
            .spawn(move || control_loop(&q, &cq, &pd, &bufs, &s))
            .map_err(|e| e.to_string())?;
        Ok(Conn {
            qp,
            session,
            control: Some(control),
        })
    }
}

/// Narrows one live connection to `layout`, and says so.
fn apply(s: &Session, qp: &QueuePair, layout: &Arc<Layout>) {
    for (part, before, after) in s.narrow_to(layout) {
        tracing::info!(
            qpn = %qp.qp_num(),
            principal = %s.principal,
            partition = part,
            %before,
            %after,
            generation = layout.generation,
            "revoke applied to a live connection"
        );
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.qp.disconnect();
        if let Some(t) = self.control.take() {
            let _ = t.join();
        }
    }
}

/// Answers a connection's control messages until it ends.
fn control_loop(
    qp: &QueuePair,
    cq: &softrdma_verbs::CompletionQueue,
    pd: &ProtectionDomain,
    bufs: &MemoryRegion,
    session: &Session,
) {
    use softrdma_verbs::{RecvWr, SendWr, WcOpcode, WcStatus};
    // Replies in flight, each in a registration of its own until its send
    // completes (a peer may send requests faster than replies drain).
    let mut sending = std::collections::HashMap::new();
    let mut next_id = 0u64;
    loop {
        let Some(wc) = cq.wait_one(Duration::from_millis(200)) else {
            if qp.state() == QpState::Error {
                return;
            }
            continue;
        };
        if wc.opcode != WcOpcode::Recv {
            sending.remove(&wc.wr_id);
            continue;
        }
        if wc.status != WcStatus::Success {
            return;
        }
        let slot = wc.wr_id as usize;
        let mut msg = vec![0u8; wc.byte_len as usize];
        bufs.read_at(slot * CTRL_MAX, &mut msg);
        let reply = match decode_control(&msg) {
            Some((op, _, id)) if op == ControlOp::Ping as u8 => {
                encode_control_reply(op, ControlStatus::Ok, id, &[])
            }
            Some((op, _, id)) if op == ControlOp::FlushAll as u8 => match session.flush_all() {
                Ok(()) => encode_control_reply(op, ControlStatus::Ok, id, &[]),
                Err(e) => {
                    encode_control_reply(op, ControlStatus::Failed, id, e.to_string().as_bytes())
                }
            },
            Some((op, start, id)) if op == ControlOp::Info as u8 => {
                let page = encode_page(&session.regions(), start);
                encode_control_reply(op, ControlStatus::Ok, id, &page)
            }
            Some((op, _, id)) => encode_control_reply(op, ControlStatus::Unknown, id, &[]),
            None => encode_control_reply(0, ControlStatus::Unknown, 0, b"not a control request"),
        };
        // The receive goes back first, so the peer may send again at once.
        let len = reply.len();
        let ok = qp
            .post_recv(&RecvWr::new(
                slot as u64,
                &[bufs.sge(slot * CTRL_MAX, CTRL_MAX)],
            ))
            .and_then(|_| pd.register(reply, Access::LOCAL_READ))
            .and_then(|mr| {
                next_id += 1;
                qp.post_send(&SendWr::send(next_id, &[mr.sge(0, len)]))?;
                sending.insert(next_id, mr);
                Ok(())
            });
        if let Err(e) = ok {
            // The connection is ending (the QP left RTS); nothing to answer.
            tracing::debug!(qpn = %qp.qp_num(), "control message loop ends: {e}");
            return;
        }
    }
}
