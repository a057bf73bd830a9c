//! The request session: the client's connections to the nodes of its
//! group and the two-sided requests it sends them.
//!
//! A [`Session`] holds one link per configured node (opened lazily, with
//! the connection handshake that tells the node's id and the arena), the
//! node it currently takes for the primary (`target`), the highest epoch
//! seen, the client's id and its request ids.
//!
//! Failover ([`Session::request_as`]): each request carries the client's
//! epoch and a request id; when the primary does not answer within the
//! per-attempt timeout, or answers `NotPrimary`, the session sends the
//! same request (same id) to the other node. The nodes' replicated
//! de-duplication table makes a retried write take effect once. A write
//! refused for want of an in-sync secondary (`NotEnoughReplicas`) is asked
//! again for `wait_for_replicas`; a stale epoch is adopted and retried.
//!
//! The session also lends its links to the one-sided reader
//! ([`super::reader`]), which reads the arena of the node it targets.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use softrdma_verbs::ProtectionDomain;

use super::error::{ClientError, OpKind, Unreachable};
use super::ClientConfig;
use crate::net::handshake::{self, HandshakeError, Hello};
use crate::net::link::{Endpoint, Link, LinkError, LinkEvent};
use crate::net::{random_u64, CONNECT_TIMEOUT};
use crate::proto::{self, Body, Envelope, NodeId, Op, Reply, StatusInfo, StoreError};
use crate::ptr::ArenaRef;

/// How long a client polls for its answer before it sleeps, when a link is
/// same-host ([`Endpoint::spin`]).
const CLIENT_SPIN: Duration = Duration::from_micros(100);

/// One configured node.
struct Slot {
    addr: SocketAddr,
    link: Option<Arc<Link>>,
    node: Option<NodeId>,
}

/// The client's connections to its group and its two-sided requests.
pub(super) struct Session {
    cfg: ClientConfig,
    ep: Arc<Endpoint>,
    /// Messages polled off the links and not yet consumed.
    inbox: VecDeque<(u32, bytes::Bytes)>,
    slots: Vec<Slot>,
    /// The node taken for the primary (index into `slots`).
    target: usize,
    epoch: u64,
    id: u64,
    next_req: u64,
    arena: Option<ArenaRef>,
    /// Requests re-sent to another node or after a timeout.
    retries: u64,
}

impl Session {
    /// A session with the group at `cfg.nodes` (connections open lazily).
    pub(super) fn new(cfg: ClientConfig) -> Result<Session, ClientError> {
        if cfg.nodes.is_empty() {
            return Err(ClientError::NoNodes);
        }
        let ep = Endpoint::open("store-client").map_err(ClientError::Endpoint)?;
        let slots = cfg
            .nodes
            .iter()
            .map(|&addr| Slot {
                addr,
                link: None,
                node: None,
            })
            .collect();
        let id = cfg.id.unwrap_or_else(random_u64);
        Ok(Session {
            cfg,
            ep,
            inbox: VecDeque::new(),
            slots,
            target: 0,
            epoch: 0,
            id,
            next_req: 0,
            arena: None,
            retries: 0,
        })
    }

    pub(super) fn cfg(&self) -> &ClientConfig {
        &self.cfg
    }

    pub(super) fn id(&self) -> u64 {
        self.id
    }

    pub(super) fn epoch(&self) -> u64 {
        self.epoch
    }

    pub(super) fn retries(&self) -> u64 {
        self.retries
    }

    /// The arena, once a node told it.
    pub(super) fn arena(&self) -> Option<ArenaRef> {
        self.arena
    }

    /// The node taken for the primary (its index in the configured list).
    pub(super) fn target(&self) -> usize {
        self.target
    }

    /// The protection domain of the client's endpoint (for its read
    /// buffer).
    pub(super) fn pd(&self) -> &ProtectionDomain {
        self.ep.pd()
    }

    /// Connects to the target node if the arena is not known yet (first
    /// contact); a failure is left for the caller's next step to meet.
    pub(super) fn learn_arena(&mut self) {
        if self.arena.is_none() {
            let _ = self.link(self.target);
        }
    }

    /// The link to the target node, with its index.
    pub(super) fn target_link(&mut self) -> Result<(usize, Arc<Link>), ClientError> {
        let t = self.target;
        Ok((t, self.link(t)?))
    }

    /// A one-sided Read on the link to node `i` failed: the link is
    /// dropped (the next use reconnects); the error to report.
    pub(super) fn read_failed(&mut self, i: usize, e: LinkError) -> ClientError {
        tracing::info!(node = %self.slots[i].addr, error = %e, "a one-sided read failed; reconnecting");
        self.drop_link(i);
        Unreachable::Read {
            addr: self.slots[i].addr,
            source: e,
        }
        .into()
    }

    /// The link to node `i`, connecting when it has none or a dead one.
    fn link(&mut self, i: usize) -> Result<Arc<Link>, ClientError> {
        if let Some(l) = &self.slots[i].link {
            if !l.is_dead() {
                return Ok(l.clone());
            }
            let id = l.id();
            self.ep.remove(id);
            self.slots[i].link = None;
        }
        let hello = Hello::Client {
            id: self.id,
            user: self
                .cfg
                .auth
                .as_ref()
                .map_or(crate::auth::DEFAULT_USER, |a| a.user.as_str())
                .to_string(),
        };
        let addr = self.slots[i].addr;
        let (link, acc) = handshake::connect(
            &self.ep,
            addr,
            &hello,
            self.cfg.auth.as_ref(),
            CONNECT_TIMEOUT,
        )
        .map_err(|e| match e {
            HandshakeError::Link(LinkError::Protocol(_))
            | HandshakeError::Link(LinkError::Rejected(_))
            | HandshakeError::Protocol(_) => ClientError::NotAStoreNode { addr, source: e },
            HandshakeError::Refused(r) => ClientError::Auth(r),
            e @ HandshakeError::Link(_) => Unreachable::Connect { addr, source: e }.into(),
        })?;
        self.slots[i].node = Some(acc.node);
        if let Some(a) = acc.arena {
            if self.arena.is_some_and(|old| old.stag != a.stag) {
                // The arena's STag rotated (credentials narrowed): what
                // the reader cached was read under the old one, still valid.
                tracing::debug!(old = ?self.arena, new = ?a, "arena STag changed");
            }
            self.arena = Some(a);
        }
        self.slots[i].link = Some(link.clone());
        Ok(link)
    }

    fn drop_link(&mut self, i: usize) {
        if let Some(l) = self.slots[i].link.take() {
            self.ep.remove(l.id());
        }
    }

    fn switch(&mut self) {
        self.target = (self.target + 1) % self.slots.len();
        self.retries += 1;
    }

    /// Sends `op` to the primary, failing over as needed, until it is
    /// answered or the deadline passes.
    pub(super) fn request(&mut self, op: Op) -> Result<Reply, ClientError> {
        let req_id = self.next_req_id();
        self.request_as(req_id, op)
    }

    /// Request ids from now on are above `used`.
    pub(super) fn skip_req_ids(&mut self, used: u64) {
        self.next_req = self.next_req.max(used);
    }

    /// A new request id of this client.
    pub(super) fn next_req_id(&mut self) -> u64 {
        self.next_req += 1;
        self.next_req
    }

    /// [`Self::request`] under request id `req_id`: a retry of a request
    /// that may have been applied already takes effect once (the nodes'
    /// replicated de-duplication table answers it as before).
    pub(super) fn request_as(&mut self, req_id: u64, op: Op) -> Result<Reply, ClientError> {
        let deadline = Instant::now() + self.cfg.deadline;
        let replicas_until = Some(Instant::now() + self.cfg.wait_for_replicas)
            .filter(|_| !self.cfg.wait_for_replicas.is_zero())
            .map(|u| u.min(deadline));
        let mut last = Unreachable::NoAttempt;
        // Nodes that answered with something other than a store node's
        // handshake: when every one did, waiting will not help.
        let mut not_store = vec![false; self.slots.len()];
        let mut refused = false;
        loop {
            if Instant::now() > deadline {
                // Still refused for want of a secondary: say so (nothing
                // changed), not "unavailable".
                if refused {
                    return Err(StoreError::NotEnoughReplicas.into());
                }
                return Err(ClientError::Unavailable(last));
            }
            let t = self.target;
            let link = match self.link(t) {
                Ok(l) => l,
                Err(e) => {
                    last = match e {
                        ClientError::Unavailable(u) => u,
                        ClientError::NotAStoreNode { addr, source } => {
                            not_store[t] = true;
                            if not_store.iter().all(|&x| x) {
                                return Err(ClientError::NotAStoreNode { addr, source });
                            }
                            Unreachable::Connect { addr, source }
                        }
                        // Refused: retrying will not help.
                        e => return Err(e),
                    };
                    self.switch();
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            let env = Envelope {
                epoch: self.epoch,
                body: Body::Request {
                    client: self.id,
                    req_id,
                    op: op.clone(),
                },
            };
            let msg = crate::net::link::pool::encode(&env);
            let attempt = self.cfg.attempt_for(msg.len());
            if let Err(e) = link.send_owned(msg, attempt) {
                last = Unreachable::Send {
                    addr: self.slots[t].addr,
                    source: e,
                };
                self.drop_link(t);
                self.switch();
                continue;
            }
            let until = Instant::now() + attempt;
            // Wait for the answer on this link.
            let outcome = self.await_response(link.id(), req_id, until);
            match outcome {
                None => {
                    last = Unreachable::NoAnswer {
                        addr: self.slots[t].addr,
                    };
                    if link.is_dead() {
                        self.drop_link(t);
                    }
                    self.switch();
                }
                Some(Ok(reply)) => return Ok(reply),
                Some(Err(StoreError::NotEnoughReplicas))
                    if replicas_until.is_some_and(|u| Instant::now() < u) =>
                {
                    // Nothing changed: ask again once the secondary may
                    // be back in sync (a copy takes a fraction of a
                    // second for small arenas).
                    last = Unreachable::NoSecondaryInSync;
                    refused = true;
                    std::thread::sleep(Duration::from_millis(20));
                }
                Some(Err(StoreError::StaleEpoch { current })) => {
                    self.epoch = self.epoch.max(current);
                    last = Unreachable::StaleEpoch { current };
                }
                Some(Err(StoreError::NotPrimary { primary })) => {
                    last = Unreachable::NotPrimary {
                        addr: self.slots[t].addr,
                    };
                    let idx = primary.and_then(|p| {
                        self.slots
                            .iter()
                            .position(|s| s.node == Some(p))
                            .filter(|&i| i != t)
                    });
                    match idx {
                        Some(i) => self.target = i,
                        None => self.switch(),
                    }
                    std::thread::sleep(Duration::from_millis(5));
                }
                Some(Err(e)) => return Err(e.into()),
            }
        }
    }

    /// Waits for the response to `req_id` on link `lid` until `until`,
    /// running this client's links itself: polls for [`CLIENT_SPIN`], then
    /// sleeps on their input. Every message seen raises the known epoch;
    /// `None` when the time ran out or the link went down.
    fn await_response(
        &mut self,
        lid: u32,
        req_id: u64,
        until: Instant,
    ) -> Option<Result<Reply, StoreError>> {
        let spin_until = Instant::now() + self.ep.spin(CLIENT_SPIN);
        let mut evs = Vec::new();
        loop {
            evs.clear();
            self.ep.poll(&mut evs);
            for e in evs.drain(..) {
                match e {
                    LinkEvent::Frame { link, bytes } => self.inbox.push_back((link, bytes)),
                    LinkEvent::Down { link } if link == lid => return None,
                    LinkEvent::Down { .. } => {}
                }
            }
            while let Some((l, bytes)) = self.inbox.pop_front() {
                let Ok(env) = proto::decode(&bytes) else {
                    continue;
                };
                self.epoch = self.epoch.max(env.epoch);
                if l != lid {
                    continue;
                }
                if let Body::Response { req_id: r, result } = env.body {
                    if r == req_id {
                        return Some(result);
                    }
                }
            }
            let now = Instant::now();
            if now >= until {
                return None;
            }
            if now < spin_until {
                std::thread::yield_now();
            } else {
                self.ep.wait(
                    until
                        .saturating_duration_since(now)
                        .min(Duration::from_millis(50)),
                );
            }
        }
    }

    /// The configured nodes' addresses.
    pub(super) fn addrs(&self) -> Vec<SocketAddr> {
        self.slots.iter().map(|s| s.addr).collect()
    }

    /// Status of node `i` of the configured list, asked directly (no
    /// failover).
    pub(super) fn status_of(&mut self, i: usize) -> Result<StatusInfo, ClientError> {
        match self.request_at(i, Op::Status)? {
            Reply::Status(s) => Ok(s),
            r => Err(ClientError::unexpected(OpKind::Status, r)),
        }
    }

    /// Node `i` only (no failover); a stale epoch is adopted and retried.
    fn request_at(&mut self, i: usize, op: Op) -> Result<Reply, ClientError> {
        let mut tries = 0;
        loop {
            match self.request_at_once(i, op.clone()) {
                Err(ClientError::Store(StoreError::StaleEpoch { current })) if tries < 3 => {
                    self.epoch = self.epoch.max(current);
                    tries += 1;
                }
                r => return r,
            }
        }
    }

    fn request_at_once(&mut self, i: usize, op: Op) -> Result<Reply, ClientError> {
        let req_id = self.next_req_id();
        let link = self.link(i)?;
        let env = Envelope {
            epoch: self.epoch,
            body: Body::Request {
                client: self.id,
                req_id,
                op,
            },
        };
        let addr = self.slots[i].addr;
        let msg = crate::net::link::pool::encode(&env);
        let attempt = self.cfg.attempt_for(msg.len());
        link.send_owned(msg, attempt)
            .map_err(|source| Unreachable::Send { addr, source })?;
        let until = Instant::now() + attempt * 3;
        match self.await_response(link.id(), req_id, until) {
            Some(result) => result.map_err(ClientError::from),
            None => Err(Unreachable::NoAnswer { addr }.into()),
        }
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.ep.shutdown();
    }
}
