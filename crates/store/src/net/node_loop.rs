//! The node loop: the only owner of the [`Node`] state machine and of the
//! arena's contents. It turns every event into [`Node::handle`] and
//! carries out its outputs, one method per kind of event ([`NodeLoop`]).
//!
//! The loop runs the links' input itself ([`Endpoint::poll`]): a message
//! wakes it directly. With a same-host peer (input in a shared-memory
//! ring) it polls briefly before it sleeps, so a reply that follows
//! quickly (the secondary's acknowledgement) costs no wake-up; over TCP it
//! sleeps at once ([`Endpoint::spin`]). The messages one round of events
//! produces for a TCP link are sent together ([`Link::send_batch`]). The
//! other threads post their events on a channel ([`EvTx`]) and ring its
//! waker.
//!
//! The arena's STag is valid exactly while the node serves reads: it
//! carries the node's deadline (`Node::reads_until`), updated after every
//! event and enforced by the engine itself.

use std::collections::{HashMap, VecDeque};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softrdma_verbs::{Access, MemoryRegion};

use super::arena_reg::ArenaReg;
use super::handshake::Principal;
use super::link::{pool, Endpoint, Link, LinkError, LinkEvent, Waker};
use super::outbox::Outbox;
use super::persist_thread::{FromPersist, ToPersist};
use crate::arena::Arena;
use crate::auth::{random_u64, Credentials, Rights};
use crate::node::{Addr, CoordReply, CoordRequest, Input, Node, Output, Role};
use crate::proto::{self, Member, NodeId};
use crate::ptr::ArenaRef;

/// An event for the node loop.
pub(crate) enum Ev {
    Link(LinkEvent),
    Tick,
    /// A request of this process's RESP front door ([`NodeFront`]),
    /// answered on `reply` instead of a link; the requester waits until
    /// `until`.
    Front {
        client: u64,
        req_id: u64,
        op: proto::Op,
        reply: FrontReply,
        until: Instant,
    },
    /// A message produced locally for the node (a recovery chunk read
    /// from the primary), queued behind whatever already waits so that
    /// ticks and heartbeats keep flowing during a long arena copy.
    Local {
        from: Addr,
        env: proto::Envelope,
    },
    Coord {
        id: u64,
        reply: Result<CoordReply, String>,
    },
    Accepted {
        link: Arc<Link>,
        who: Addr,
        principal: Principal,
    },
    /// The configuration's credentials changed (re-read from its file).
    Credentials {
        old: Arc<Credentials>,
        new: Arc<Credentials>,
    },
    Dialed {
        link: Arc<Link>,
        node: NodeId,
    },
    /// The persistence thread's news (`persist_thread.rs`).
    Persist(FromPersist),
}

/// Where the answer to a front-door request goes.
type FrontReply = super::redis_door::Answer;

/// The node loop's channel: a send also wakes the loop if it sleeps.
#[derive(Clone)]
pub(crate) struct EvTx {
    tx: Sender<Ev>,
    waker: Waker,
}

impl EvTx {
    /// A channel to the node loop, and the loop's end of it.
    pub(crate) fn channel(waker: Waker) -> (EvTx, Receiver<Ev>) {
        let (tx, rx) = mpsc::channel();
        (EvTx { tx, waker }, rx)
    }

    /// [`Self::send`] without waking the loop (the sender wakes it once
    /// after several).
    pub(crate) fn send_quiet(&self, ev: Ev) -> bool {
        self.tx.send(ev).is_ok()
    }

    /// Wakes the loop (after [`Self::send_quiet`]s).
    pub(crate) fn wake(&self) {
        self.waker.wake();
    }

    /// False once the node loop is gone.
    pub(crate) fn send(&self, ev: Ev) -> bool {
        let sent = self.tx.send(ev).is_ok();
        if sent {
            self.waker.wake();
        }
        sent
    }
}

/// Value bytes a secondary has acknowledged from which it sends what it
/// queued at once, before it writes them into its arena
/// ([`Node::settle`]); smaller writes settle at the end of the round.
const SETTLE_EARLY: usize = 64 * 1024;

/// How long the node loop polls for more work before it sleeps, when a
/// link is same-host ([`Endpoint::spin`]).
const NODE_SPIN: Duration = Duration::from_micros(100);

/// How long a send to a link may wait for room.
const SEND_TIMEOUT: Duration = Duration::from_millis(200);

/// The client id under which a node submits its own STag rotations.
pub(crate) const ROTATE_CLIENT: u64 = u64::MAX;

/// The node loop's state: the node, the links by peer, what waits.
pub(crate) struct NodeLoop {
    node: Node<Arena>,
    ep: Arc<Endpoint>,
    rx: Receiver<Ev>,
    /// The loop's own queue (recovery chunks go behind what waits).
    self_tx: EvTx,
    /// To the coordinator thread: (request id, request, as whom).
    coord: Sender<(u64, CoordRequest, Member)>,
    reg: Arc<ArenaReg>,
    creds: Arc<Credentials>,
    /// The node's clock starts here (microseconds since).
    t0: Instant,
    /// Who is at the other end of each announced link.
    owner: HashMap<u32, Addr>,
    /// Frames of links not announced yet (see [`NodeLoop::on_frame`]).
    unowned: HashMap<u32, Vec<bytes::Bytes>>,
    /// The link this node dialed to each peer (it sends on it).
    to_node: HashMap<NodeId, Arc<Link>>,
    /// The link each peer dialed to this node.
    from_node: HashMap<NodeId, Arc<Link>>,
    clients: HashMap<u64, Arc<Link>>,
    /// Who each accepted link authenticated as.
    principals: HashMap<u32, Principal>,
    /// A rotation of the STag is wanted (credentials narrowed) and not yet
    /// applied: asked again on ticks while this node is the primary.
    rotate_wanted: bool,
    rotate_req: u64,
    /// The registration must get the node's validity (made anew).
    revalidate: bool,
    /// The RESP front door's requests in flight, by (client, request id):
    /// where each answer goes, and until when its requester waits. Any
    /// other answer to the same client id (its retry through a link) takes
    /// the link.
    front: HashMap<(u64, u64), (Instant, FrontReply)>,
    /// The landing buffer of recovery's RDMA Reads.
    scratch: Option<MemoryRegion>,
    pending: VecDeque<Ev>,
    link_evs: Vec<LinkEvent>,
    idle_since: Instant,
    /// The deadline the registration carries now.
    served_until: Option<Instant>,
    /// Messages produced while handling one batch of events, per link,
    /// sent together when the batch is done (one doorbell, and usually one
    /// system call, per link instead of one per message).
    outbox: Outbox,
    /// The persistence thread, if the node persists.
    persist: Option<Sender<ToPersist>>,
    /// Log entries made while handling one batch of events, sent together
    /// when it is done (one wake-up of the thread), or before a snapshot's
    /// chunk (the thread must have every write the chunk's bytes hold).
    log_batch: Vec<crate::persist::entry::Entry>,
}

impl NodeLoop {
    /// A loop for `node`, fed by `rx` (whose sending end is `self_tx`).
    pub(crate) fn new(
        node: Node<Arena>,
        ep: Arc<Endpoint>,
        (self_tx, rx): (EvTx, Receiver<Ev>),
        coord: Sender<(u64, CoordRequest, Member)>,
        reg: Arc<ArenaReg>,
        creds: Arc<Credentials>,
        persist: Option<Sender<ToPersist>>,
    ) -> NodeLoop {
        NodeLoop {
            node,
            ep,
            rx,
            self_tx,
            coord,
            reg,
            creds,
            t0: Instant::now(),
            owner: HashMap::new(),
            unowned: HashMap::new(),
            to_node: HashMap::new(),
            from_node: HashMap::new(),
            clients: HashMap::new(),
            principals: HashMap::new(),
            rotate_wanted: false,
            rotate_req: 0,
            revalidate: false,
            front: HashMap::new(),
            scratch: None,
            pending: VecDeque::new(),
            link_evs: Vec::new(),
            idle_since: Instant::now(),
            served_until: None,
            outbox: Outbox::default(),
            persist,
            log_batch: Vec::new(),
        }
    }

    /// Runs until the process ends.
    pub(crate) fn run(mut self) {
        loop {
            if !self.gather() {
                continue;
            }
            while let Some(ev) = self.pending.pop_front() {
                if let Some(input) = self.on_event(ev) {
                    self.step(input);
                }
                // A secondary's acknowledgement of a large write goes out
                // before the write's copy into the arena, which then runs
                // while the primary finishes the write.
                if self.node.unsettled() >= SETTLE_EARLY {
                    self.outbox.flush(&self.ep, SEND_TIMEOUT);
                    self.node.settle();
                }
            }
            self.send_log();
            self.outbox.flush(&self.ep, SEND_TIMEOUT);
            self.node.settle();
        }
    }

    /// Hands the log entries made so far to the persistence thread.
    fn send_log(&mut self) {
        if let (Some(p), false) = (&self.persist, self.log_batch.is_empty()) {
            let _ = p.send(ToPersist::Entries(std::mem::take(&mut self.log_batch)));
        }
    }

    /// The node's clock: microseconds since the loop began.
    fn now(&self) -> u64 {
        self.t0.elapsed().as_micros() as u64
    }

    /// Queues the other threads' events, then the links' input; `false`
    /// (after a short poll or a sleep) when there was none.
    fn gather(&mut self) -> bool {
        while let Ok(ev) = self.rx.try_recv() {
            self.pending.push_back(ev);
        }
        self.link_evs.clear();
        self.ep.poll(&mut self.link_evs);
        self.pending.extend(self.link_evs.drain(..).map(Ev::Link));
        if self.pending.is_empty() {
            // Poll a little more, then sleep until a link has input or
            // another thread rang (ticks come every half heartbeat).
            if self.idle_since.elapsed() < self.ep.spin(NODE_SPIN) {
                std::thread::yield_now();
            } else {
                self.ep.wait(Duration::from_millis(100));
            }
            return false;
        }
        self.idle_since = Instant::now();
        true
    }

    /// One event: the node's input it makes, if any.
    fn on_event(&mut self, ev: Ev) -> Option<Input> {
        match ev {
            Ev::Tick => Some(self.on_tick()),
            Ev::Credentials { old, new } => {
                self.on_credentials(old, new);
                None
            }
            Ev::Local { from, env } => Some(Input::Message { from, env }),
            Ev::Front {
                client,
                req_id,
                op,
                reply,
                until,
            } => Some(self.on_front(client, req_id, op, reply, until)),
            Ev::Coord { id, reply } => Some(Input::Coord { id, reply }),
            Ev::Accepted {
                link,
                who,
                principal,
            } => {
                self.on_accepted(link, who, principal);
                None
            }
            Ev::Dialed { link, node } => {
                self.on_dialed(link, node);
                None
            }
            Ev::Link(LinkEvent::Down { link }) => {
                self.on_link_down(link);
                None
            }
            Ev::Link(LinkEvent::Frame { link, bytes }) => self.on_frame(link, bytes),
            Ev::Persist(FromPersist::Durable { incarnation, seq }) => {
                Some(Input::Durable { incarnation, seq })
            }
            Ev::Persist(FromPersist::SnapshotDue) => Some(Input::SnapshotDue),
            Ev::Persist(FromPersist::Pressure(on)) => Some(Input::LogPressure(on)),
            Ev::Persist(FromPersist::WantChunk { offset, len }) => {
                // A snapshot's chunk: the arena's bytes between two events.
                let mut bytes = vec![0u8; len];
                if self.node.read_arena(offset, &mut bytes) {
                    self.send_log();
                    if let Some(p) = &self.persist {
                        let _ = p.send(ToPersist::Chunk { offset, bytes });
                    }
                }
                None
            }
        }
    }

    /// A tick: front-door requesters that gave up are forgotten, and a
    /// wanted STag rotation is asked for (while primary).
    fn on_tick(&mut self) -> Input {
        let now = Instant::now();
        self.front.retain(|_, (until, _)| *until > now);
        if self.rotate_wanted && self.node.role() == Role::Primary {
            self.rotate_req += 1;
            let stag = rotated(self.node.arena().stag);
            self.pending.push_back(Ev::Local {
                from: Addr::Client(ROTATE_CLIENT),
                env: proto::Envelope {
                    epoch: self.node.epoch(),
                    body: proto::Body::Request {
                        client: ROTATE_CLIENT,
                        req_id: self.rotate_req,
                        op: proto::Op::RotateStag { stag },
                    },
                },
            });
        }
        Input::Tick
    }

    /// The credentials changed: connections whose credential no longer
    /// grants what it did end now (their clients reconnect under the new
    /// credentials or not at all), and if they narrowed, one-sided reads
    /// with the STag clients knew stop (the primary rotates it on both
    /// nodes).
    fn on_credentials(&mut self, old: Arc<Credentials>, new: Arc<Credentials>) {
        let revoked: Vec<u32> = self
            .principals
            .iter()
            .filter(|(_, p)| match &p.user {
                Some(u) => !p.proven && new.configured() || !new.still_grants(&old, u),
                None => false,
            })
            .map(|(&l, _)| l)
            .collect();
        for l in &revoked {
            tracing::info!(link = l, "credential revoked: connection closed");
            self.ep.remove(*l);
        }
        if new.narrows(&old) || (!old.configured() && new.configured()) {
            self.rotate_wanted = true;
        }
        self.creds = new;
    }

    /// A front-door request: its answer goes to `reply` (see
    /// [`NodeLoop::send`]).
    fn on_front(
        &mut self,
        client: u64,
        req_id: u64,
        op: proto::Op,
        reply: FrontReply,
        until: Instant,
    ) -> Input {
        self.front.insert((client, req_id), (until, reply));
        Input::Message {
            from: Addr::Client(client),
            env: proto::Envelope {
                epoch: self.node.epoch(),
                body: proto::Body::Request { client, req_id, op },
            },
        }
    }

    /// A connection the listener accepted.
    fn on_accepted(&mut self, link: Arc<Link>, who: Addr, principal: Principal) {
        // Admitted under credentials that changed since: refused as if it
        // came now.
        let stale = match &principal.user {
            Some(u) => principal.proven && self.creds.user(u).is_none(),
            None => false,
        };
        if stale {
            self.ep.remove(link.id());
            return;
        }
        self.principals.insert(link.id(), principal);
        self.owner.insert(link.id(), who);
        self.take_early_frames(link.id());
        match who {
            Addr::Client(c) => {
                if let Some(old) = self.clients.insert(c, link) {
                    old.close();
                }
            }
            Addr::Node(n) => {
                self.from_node.insert(n, link);
            }
        }
    }

    /// A link a dialer made to peer `n`.
    fn on_dialed(&mut self, link: Arc<Link>, n: NodeId) {
        self.owner.insert(link.id(), Addr::Node(n));
        self.take_early_frames(link.id());
        if let Some(old) = self.to_node.insert(n, link) {
            old.close();
        }
    }

    /// Frames a link sent before it was announced come first.
    fn take_early_frames(&mut self, link: u32) {
        if let Some(early) = self.unowned.remove(&link) {
            for (k, bytes) in early.into_iter().enumerate() {
                self.pending
                    .insert(k, Ev::Link(LinkEvent::Frame { link, bytes }));
            }
        }
    }

    fn on_link_down(&mut self, link: u32) {
        self.owner.remove(&link);
        self.principals.remove(&link);
        self.unowned.remove(&link);
        self.to_node.retain(|_, l| l.id() != link);
        self.from_node.retain(|_, l| l.id() != link);
        self.clients.retain(|_, l| l.id() != link);
        self.ep.remove(link);
    }

    /// A message from a link: the node's input, unless the runtime answers
    /// it itself ([`refusal`]) or it is not a message.
    fn on_frame(&mut self, link: u32, bytes: bytes::Bytes) -> Option<Input> {
        let Some(&from) = self.owner.get(&link) else {
            // The thread that made the link live announces it through the
            // event queue, which this frame beat: keep it until the
            // announcement (issue 16, finding 7: such first requests were
            // dropped).
            self.unowned.entry(link).or_default().push(bytes);
            return None;
        };
        // Shared, so a value it carries reaches the arena without a copy.
        match proto::decode_shared(bytes) {
            Ok(env) => {
                log_msg("received", from, &env);
                if let Addr::Client(_) = from {
                    if let Some(answer) = refusal(&env, self.principals.get(&link)) {
                        if let Some(l) = self.clients.values().find(|l| l.id() == link) {
                            self.outbox.send(
                                l,
                                pool::encode(&answer),
                                None,
                                &self.ep,
                                SEND_TIMEOUT,
                            );
                        }
                        return None;
                    }
                }
                Some(Input::Message { from, env })
            }
            Err(e) => {
                tracing::warn!(?from, error = %e, "undecodable message; closing link");
                self.ep.remove(link);
                None
            }
        }
    }

    /// Runs the node on `input` and carries out its outputs; then the
    /// registration follows the node's STag and read deadline.
    fn step(&mut self, input: Input) {
        let node = &self.node;
        let before = (node.role(), node.epoch(), node.is_redundant());
        let outs = self.node.handle(self.now(), input);
        let node = &self.node;
        let after = (node.role(), node.epoch(), node.is_redundant());
        if before != after {
            tracing::info!(
                role = ?after.0,
                epoch = after.1,
                redundant = after.2,
                "node state changed"
            );
        }
        for out in outs {
            match out {
                Output::Send { to, env } => self.send(to, env),
                Output::Coord { id, req } => {
                    let _ = self.coord.send((id, req, self.node.member()));
                }
                Output::Log(e) => {
                    if self.persist.is_some() {
                        self.log_batch.push(e);
                    }
                }
            }
        }
        self.follow_stag();
        self.follow_deadline();
    }

    /// A message of the node for `to`: a front-door requester's answer
    /// goes back to it, a recovery chunk request becomes an RDMA Read,
    /// anything else goes on `to`'s link.
    fn send(&mut self, to: Addr, env: proto::Envelope) {
        if let (Addr::Client(c), proto::Body::Response { req_id, .. }) = (to, &env.body) {
            if let Some((_, f)) = self.front.remove(&(c, *req_id)) {
                if let proto::Body::Response { result, .. } = env.body {
                    // A requester that timed out is gone; its retry learns
                    // the outcome.
                    f(result);
                }
                return;
            }
        }
        let link = match to {
            Addr::Node(n) => self.to_node.get(&n).or_else(|| self.from_node.get(&n)),
            Addr::Client(c) => self.clients.get(&c),
        };
        log_msg("sending", to, &env);
        let Some(link) = link else {
            tracing::debug!(?to, "no link; message dropped");
            return;
        };
        if let proto::Body::SyncRequest {
            session,
            offset,
            len,
        } = env.body
        {
            let link = link.clone();
            self.sync_chunk(&link, to, env.epoch, session, offset, len);
            return;
        }
        // (Acknowledgements are cumulative: a later one queued right
        // behind replaces it.)
        let ack = matches!(env.body, proto::Body::ReplicateAck { .. }).then_some(env.epoch);
        self.outbox
            .send(link, pool::encode(&env), ack, &self.ep, SEND_TIMEOUT);
    }

    /// Recovery copies the primary's arena with one-sided RDMA Reads: a
    /// chunk request becomes a Read of that range of the primary's arena
    /// (over `link`, to `from`), whose bytes go back to the node as the
    /// chunk, through the event queue (behind pending ticks and messages:
    /// a copy of a large arena must not starve the heartbeats).
    fn sync_chunk(
        &mut self,
        link: &Link,
        from: Addr,
        epoch: u64,
        session: u64,
        offset: u64,
        len: u32,
    ) {
        // What is queued for this link goes first.
        self.outbox.flush(&self.ep, SEND_TIMEOUT);
        let aref = self.node.arena();
        match sync_read(link, &mut self.scratch, &self.ep, aref, offset, len) {
            Ok(data) => {
                let _ = self.self_tx.send(Ev::Local {
                    from,
                    env: proto::Envelope {
                        epoch,
                        body: proto::Body::SyncChunk {
                            session,
                            offset,
                            data,
                        },
                    },
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "RDMA Read of the primary's arena failed");
                self.ep.remove(link.id());
            }
        }
    }

    /// A rotation applied (here, or replicated from the primary, or taken
    /// from a copy): the arena is registered under the new STag, the old
    /// one grants nothing from now on.
    fn follow_stag(&mut self) {
        let stag = self.node.arena().stag;
        if stag != self.reg.arena().stag {
            match self.reg.register(self.ep.pd(), stag) {
                Ok(()) => {
                    tracing::info!(stag = format_args!("{stag:#010x}"), "arena STag rotated")
                }
                Err(e) => tracing::error!("{e}"),
            }
            self.rotate_wanted = false;
            self.revalidate = true;
        }
    }

    /// The STag's deadline is the node's: the engine refuses reads from
    /// then on by itself, even if this thread is stopped or busy (a paused
    /// primary that lost its lease must not serve stale bytes when it
    /// resumes, before it gets here).
    fn follow_deadline(&mut self) {
        let now = self.now();
        let until = self
            .node
            .reads_until()
            .filter(|&u| u > now)
            .map(|u| self.t0 + Duration::from_micros(u));
        if until != self.served_until || self.revalidate {
            self.revalidate = false;
            self.reg.with(|mr| match until {
                Some(d) => {
                    mr.set_valid_until(Some(d));
                    if !mr.is_valid() {
                        mr.set_valid(true);
                        tracing::info!("one-sided reads of the arena enabled");
                    }
                }
                None => {
                    if mr.is_valid() {
                        mr.set_valid(false);
                        tracing::info!("one-sided reads of the arena disabled");
                    }
                }
            });
            self.served_until = until;
        }
    }
}

/// Logs the recovery and membership messages (not the steady traffic).
fn log_msg(what: &str, peer: Addr, env: &proto::Envelope) {
    use proto::Body::*;
    let name = match &env.body {
        Join { .. } => "Join",
        SyncStart { .. } => "SyncStart",
        SyncDone { .. } => "SyncDone",
        JoinRefused { reason } => {
            tracing::info!(?peer, %reason, "{what} JoinRefused");
            return;
        }
        Stale => "Stale",
        _ => return,
    };
    tracing::info!(?peer, epoch = env.epoch, "{what} {name}");
}

/// Reads `len` bytes at `offset` of the primary's arena over `link`.
fn sync_read(
    link: &Link,
    scratch: &mut Option<MemoryRegion>,
    ep: &Endpoint,
    aref: ArenaRef,
    offset: u64,
    len: u32,
) -> Result<Vec<u8>, LinkError> {
    let len = len as usize;
    if scratch.as_ref().is_none_or(|m| m.len() < len) {
        *scratch = Some(
            ep.pd()
                .alloc_mr(len.next_power_of_two(), Access::LOCAL_WRITE)
                .map_err(|e| LinkError::Verbs(e.to_string()))?,
        );
    }
    let mr = scratch.as_ref().expect("scratch buffer");
    link.read(
        mr,
        len,
        aref.base + offset,
        aref.stag,
        Duration::from_secs(5),
    )?;
    let mut data = vec![0u8; len];
    mr.read_at(0, &mut data);
    Ok(data)
}

/// Whether `op` changes the store (refused for read-only users).
fn is_write(op: &proto::Op) -> bool {
    use proto::Op::*;
    match op {
        Insert { .. }
        | Update { .. }
        | Delete { .. }
        | Put { .. }
        | Remove { .. }
        | RotateStag { .. }
        | Modify { .. }
        | Batch { .. } => true,
        Read { .. } | Get { .. } | Scan { .. } | Status => false,
    }
}

/// An answer the runtime gives itself, without the node, to a request it
/// does not let through: a read-only user's write, a rotation from the
/// network.
fn refusal(env: &proto::Envelope, principal: Option<&Principal>) -> Option<proto::Envelope> {
    let proto::Body::Request { req_id, op, .. } = &env.body else {
        return None;
    };
    let err = match op {
        proto::Op::RotateStag { .. } => proto::StoreError::Other(
            "an STag rotation is made by the nodes themselves, not requested".into(),
        ),
        op if is_write(op) && principal.is_none_or(|p| p.rights < Rights::ReadWrite) => {
            proto::StoreError::NoPermission
        }
        _ => return None,
    };
    Some(proto::Envelope {
        epoch: env.epoch,
        body: proto::Body::Response {
            req_id: *req_id,
            result: Err(err),
        },
    })
}

/// A new STag for the arena: the same index, another key byte.
fn rotated(stag: u32) -> u32 {
    let key = (stag & 0xff) as u8;
    let mut k = (random_u64() & 0xff) as u8;
    if k == key {
        k = key.wrapping_add(1);
    }
    (stag & !0xff) | k as u32
}
