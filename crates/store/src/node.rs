//! The replication state machine of one node.
//!
//! [`Node`] is **pure**: it consumes [`Input`]s (a message from a peer or a
//! client, a timer tick, a coordinator reply), each with the current time,
//! and returns [`Output`]s (messages to send, coordinator calls to make). It
//! performs no I/O and reads no clock, so the same code runs under the real
//! thread-based transport and under the deterministic simulation
//! ([`crate::sim`]). The transport must deliver messages between two
//! parties reliably and in order (as a TCP or RDMA RC connection does), and
//! may drop everything in flight when a party fails.
//!
//! # Roles
//!
//! * **Joining**: no valid data. Asks the coordinator who is primary and
//!   sends it `Join`; bootstraps the group by campaigning if there is no
//!   record at all.
//! * **Secondary**: first copies the arena (`SyncStart`, then chunks — the
//!   fallback for RDMA Reads of the primary's arena — while buffering the
//!   writes forwarded meanwhile), then applies the buffered writes, says
//!   `SyncDone`, and from then on applies and acknowledges every forwarded
//!   write, in sequence order, at exactly the forwarded offsets. When the
//!   primary falls silent it campaigns.
//! * **Primary**: applies each client write locally, forwards it (as its
//!   effects plus the client's reply) to the secondary at the same time, and
//!   acknowledges the client once the secondary has acknowledged that
//!   sequence number — or alone ("degraded") once the coordinator records
//!   that no secondary is in sync. Responses are released in sequence order.
//! * **Fenced**: a former primary that met a newer epoch or lost its lease;
//!   keeps its data, stops acknowledging, asks the coordinator, and either
//!   wins again or rejoins (wiping its data) as a secondary.
//!
//! # Epochs
//!
//! Every message carries the sender's epoch. A message from an older epoch is
//! refused (`Stale`, or `StaleEpoch` for a client request) and changes
//! nothing. A primary that sees a newer epoch steps down.

use std::collections::{BTreeMap, VecDeque};

use crate::alloc::{AllocError, Allocator};
use crate::arena::Memory;
use crate::coord::{Campaign, GroupRecord};
use crate::index::{self, Layout, Meta};
use crate::object;
use crate::proto::{
    self, Body, Cond, DedupEntry, Effect, Envelope, Member, NodeId, Op, RepOp, Reply, StatusInfo,
    StoreError,
};
use crate::ptr::{ArenaRef, PtrError, RemotePtr};

/// Time in microseconds (any monotonic origin).
pub type Micros = u64;

/// Static configuration of a node.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// This node (id and incarnation).
    pub member: Member,
    /// The arena (base address, length, STag) shared by the group.
    pub arena: ArenaRef,
    /// Heartbeat and lease-renewal interval.
    pub heartbeat_interval: Micros,
    /// Silence after which a peer counts as failed (a secondary's view of
    /// its primary; the primary's of a joining node's copy).
    pub heartbeat_timeout: Micros,
    /// Silence after which a primary drops its secondary, at least
    /// `heartbeat_timeout` (issue 29, finding 4). Dropping costs the
    /// secondary a whole new copy, and under `min_in_sync` 1 refuses
    /// writes until then, so it waits longer than a secondary waits to
    /// campaign: a secondary starved of CPU for a few heartbeats stays in
    /// sync. A restarted secondary needs no timeout: its Join under a new
    /// incarnation proves the old one gone, and the primary drops it then.
    pub secondary_timeout: Micros,
    /// Lease TTL requested from the coordinator.
    pub lease_ttl: Micros,
    /// Bytes per recovery chunk.
    pub sync_chunk: u32,
    /// Chunk requests kept in flight during recovery.
    pub sync_window: u32,
    /// Secondaries that must hold a write before it is acknowledged: 0
    /// (a primary left alone acknowledges writes alone, like Redis's
    /// default `min-replicas-to-write 0`) or 1 (it refuses new writes with
    /// [`StoreError::NotEnoughReplicas`] until a secondary is in sync
    /// again, like `min-replicas-to-write 1`). See docs/store.md.
    pub min_in_sync: u8,
    /// Bound on how much a node's clock may run slow or fast against the
    /// coordinator's, in parts per thousand: the primary counts its lease
    /// as `lease_ttl` less this share.
    pub clock_drift_permille: u64,
    /// Buckets of the key index a new group's arena gets (0: one per 16
    /// KiB of arena; `index::Layout::for_arena`). A joining node takes the
    /// group's from the arena it copies.
    pub index_buckets: u64,
    /// The port of this node's RESP front door (0: none), for `status`.
    pub resp_port: u16,
}

/// A party: a node of the group or a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Addr {
    /// A node.
    Node(NodeId),
    /// A client.
    Client(u64),
}

/// Calls a node asks its runtime to make on the coordinator.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoordRequest {
    /// [`Coordinator::campaign`](crate::coord::Coordinator::campaign).
    Campaign,
    /// [`Coordinator::keep_alive`](crate::coord::Coordinator::keep_alive).
    KeepAlive {
        /// Epoch the lease was won at.
        epoch: u64,
    },
    /// [`Coordinator::set_in_sync`](crate::coord::Coordinator::set_in_sync).
    SetInSync {
        /// Current epoch.
        epoch: u64,
        /// The secondary, or none.
        in_sync: Option<Member>,
    },
    /// [`Coordinator::get`](crate::coord::Coordinator::get).
    Get,
    /// [`Coordinator::retire`](crate::coord::Coordinator::retire) of this
    /// incarnation in favour of `new`.
    Retire {
        /// The next incarnation.
        new: u64,
    },
}

/// Answers to [`CoordRequest`]s.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CoordReply {
    /// To `Campaign`.
    Campaign(Campaign),
    /// To `KeepAlive`.
    KeepAlive(bool),
    /// To `SetInSync`.
    SetInSync(Option<u64>),
    /// To `Get`.
    Get(Option<GroupRecord>),
    /// To `Retire`.
    Retire(bool),
}

/// What happened.
#[derive(Debug, Clone)]
pub enum Input {
    /// A message arrived.
    Message {
        /// Sender.
        from: Addr,
        /// The message.
        env: Envelope,
    },
    /// Timer tick (call at least every heartbeat interval / 2).
    Tick,
    /// A coordinator call finished (`Err`: it could not be made).
    Coord {
        /// The id from [`Output::Coord`].
        id: u64,
        /// The answer.
        reply: Result<CoordReply, String>,
    },
}

/// What to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Send a message.
    Send {
        /// Recipient.
        to: Addr,
        /// The message.
        env: Envelope,
    },
    /// Call the coordinator and feed the answer back as [`Input::Coord`].
    Coord {
        /// Correlation id.
        id: u64,
        /// The call.
        req: CoordRequest,
    },
}

/// Public view of the role.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// No valid data yet.
    Joining,
    /// Copying or replicating.
    Secondary,
    /// Serving writes.
    Primary,
    /// Superseded former primary.
    Fenced,
}

#[derive(Debug, Clone)]
struct Waiter {
    to: Addr,
    req_id: u64,
    result: Result<Reply, StoreError>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Replica {
    /// No secondary: degraded (the coordinator records none in sync).
    None,
    /// Copying; its acks are not required.
    Syncing {
        m: Member,
        last_heard: Micros,
        /// The copy session.
        session: u64,
    },
    /// Copy done; its acks are required; registering once it holds every
    /// write released so far.
    Registering {
        m: Member,
        last_heard: Micros,
        coord: Option<u64>,
        failed: bool,
    },
    /// In sync: acks required.
    InSync { m: Member, last_heard: Micros },
    /// Failed secondary being removed from the record: acks held.
    Dropping { coord: Option<u64> },
}

impl Replica {
    fn node(&self) -> Option<NodeId> {
        match self {
            Replica::Syncing { m, .. }
            | Replica::Registering { m, .. }
            | Replica::InSync { m, .. } => Some(m.node),
            _ => None,
        }
    }
    fn acks_required(&self) -> bool {
        matches!(
            self,
            Replica::Registering { .. } | Replica::InSync { .. } | Replica::Dropping { .. }
        )
    }
}

#[derive(Debug, Clone)]
struct Primary {
    next_seq: u64,
    pending: BTreeMap<u64, Vec<Waiter>>,
    replica: Replica,
    replicated_through: u64,
    max_released: u64,
    lease_until: Micros,
    /// The renewal in flight: (call id, sent at, epoch it names).
    keepalive: Option<(u64, Micros, u64)>,
    last_beat: Micros,
}

#[derive(Debug, Clone)]
struct Copy {
    /// The session of the SyncStart being followed.
    session: u64,
    next_offset: u64,
    outstanding: u32,
    buffered: Vec<(u64, RepOp)>,
    /// When the last chunk arrived (or the copy began): a copy that stops
    /// making progress while the primary still beats (a chunk Read the
    /// primary refused, a link lost under it) is restarted, see `on_tick`.
    last_progress: Micros,
}

/// Heartbeat timeouts without a chunk after which a copy is restarted.
const COPY_STALL_TIMEOUTS: u64 = 8;

#[derive(Debug, Clone)]
enum State {
    Joining {
        /// `Some(at)`: Join sent to `primary` at `at`.
        join_sent: Option<(NodeId, Micros)>,
        asked: Option<u64>,
        last_try: Micros,
    },
    Secondary {
        primary: NodeId,
        last_heard: Micros,
        last_beat: Micros,
        copy: Option<Copy>,
        campaign: Option<u64>,
        /// The primary says the coordinator records us in sync.
        registered: bool,
    },
    Primary(Primary),
    Fenced {
        asked: Option<u64>,
        last_try: Micros,
    },
    /// About to discard the data and rejoin `to` as incarnation `new`;
    /// waiting for the coordinator to retire the current one.
    Leaving {
        to: Option<NodeId>,
        new: u64,
        asked: Option<u64>,
        last_try: Micros,
    },
}

/// One node's replication state machine over memory `M`.
pub struct Node<M: Memory> {
    cfg: NodeConfig,
    mem: M,
    alloc: Allocator,
    dedup: BTreeMap<u64, DedupEntry>,
    epoch: u64,
    applied_seq: u64,
    state: State,
    now: Micros,
    next_coord_id: u64,
    out: Vec<Output>,
    divergences: u64,
    last_divergence: Option<String>,
    lost_replicates: u64,
    /// Copy sessions started (as primary); numbers them uniquely.
    sessions: u64,
    /// Writes applied to the allocator and the retry table but not yet to
    /// the arena's bytes: a primary makes a write visible to one-sided
    /// readers only once it is committed (held by the in-sync secondary,
    /// or by the primary alone where that is allowed), so no reader sees a
    /// write that a failover could lose. In sequence order, ending at
    /// `applied_seq`.
    unexposed: VecDeque<(u64, RepOp, Vec<u64>)>,
    /// The `Resend` asked last: (first missing seq, when).
    resend_asked: Option<(u64, Micros)>,
    /// When this node (as a secondary) last campaigned.
    last_campaign: Micros,
    /// When the last tick came: a tick that comes much later than the
    /// ticker's period shows that this node did not run (starved of CPU,
    /// stopped), so its peers' silence over that gap is no evidence.
    last_tick: Option<Micros>,
    /// The key index's place in the arena: known once the arena holds a
    /// group's data (formatted by a new group's first primary, or copied).
    layout: Option<Layout>,
    /// The key index as planned with (including unexposed writes); `None`
    /// while the node has no data or is still replaying its copy.
    index: Option<Meta>,
    /// The generation of every object of the pointer API, by arena
    /// offset, as planned with (including unexposed writes): a pointer
    /// whose generation differs is stale (finding 3). Kept by every
    /// replica as it applies writes; rebuilt from the headers after a copy.
    unkeyed_gens: BTreeMap<u64, u64>,
}

#[path = "node_keys.rs"]
mod keys;

fn ptr_error(e: PtrError) -> StoreError {
    match e {
        PtrError::WrongStag { got, expected } => StoreError::WrongStag { got, expected },
        PtrError::OutOfArena { .. } => StoreError::OutOfArena,
        PtrError::Freed { .. } => StoreError::Freed,
        PtrError::NotAllocated { .. } | PtrError::Parse(_) => StoreError::NotAllocated,
    }
}

impl<M: Memory> Node<M> {
    /// A node that starts by joining its group. `mem` is its arena (its
    /// contents are irrelevant: recovery overwrites all of it).
    pub fn new(cfg: NodeConfig, mem: M) -> Node<M> {
        assert_eq!(mem.len(), cfg.arena.len, "memory must be the arena's size");
        // (`Config::validate` refuses larger: index slots could not name
        // the objects past it, and every keyed write would diverge.)
        assert!(
            cfg.arena.len <= index::MAX_ARENA_LEN,
            "an arena is at most {} bytes",
            index::MAX_ARENA_LEN
        );
        assert!(cfg.heartbeat_timeout > cfg.heartbeat_interval);
        assert!(cfg.secondary_timeout >= cfg.heartbeat_timeout);
        assert!(cfg.sync_chunk > 0 && cfg.sync_window > 0);
        Node {
            alloc: Allocator::new(cfg.arena.len),
            cfg,
            mem,
            dedup: BTreeMap::new(),
            epoch: 0,
            applied_seq: 0,
            state: State::Joining {
                join_sent: None,
                asked: None,
                last_try: 0,
            },
            now: 0,
            next_coord_id: 1,
            out: Vec::new(),
            divergences: 0,
            last_divergence: None,
            lost_replicates: 0,
            sessions: 0,
            unexposed: VecDeque::new(),
            resend_asked: None,
            last_campaign: 0,
            last_tick: None,
            layout: None,
            index: None,
            unkeyed_gens: BTreeMap::new(),
        }
    }

    /// Handles one input at time `now`; returns what to do.
    pub fn handle(&mut self, now: Micros, input: Input) -> Vec<Output> {
        assert!(now >= self.now, "time must not go backwards");
        self.now = now;
        match input {
            Input::Message { from, env } => self.on_message(from, env),
            Input::Tick => self.on_tick(),
            Input::Coord { id, reply } => self.on_coord(id, reply),
        }
        self.check_invariants();
        std::mem::take(&mut self.out)
    }

    // ------------------------------------------------------------ accessors

    /// Current role.
    pub fn role(&self) -> Role {
        match self.state {
            State::Joining { .. } => Role::Joining,
            State::Secondary { .. } => Role::Secondary,
            State::Primary(_) => Role::Primary,
            State::Fenced { .. } | State::Leaving { .. } => Role::Fenced,
        }
    }
    /// Current epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
    /// This node.
    pub fn member(&self) -> Member {
        self.cfg.member
    }
    /// The arena memory.
    pub fn memory(&self) -> &M {
        &self.mem
    }
    /// The allocator.
    pub fn allocator(&self) -> &Allocator {
        &self.alloc
    }

    /// The key index's layout, once the node holds a group's data.
    pub fn index_layout(&self) -> Option<Layout> {
        self.layout
    }

    /// The key index's planning state, once the node holds a group's data.
    pub fn index_meta(&self) -> Option<&Meta> {
        self.index.as_ref()
    }
    /// Highest applied write.
    pub fn applied_seq(&self) -> u64 {
        self.applied_seq
    }
    /// The retry table.
    pub fn dedup_table(&self) -> Vec<DedupEntry> {
        self.dedup.values().cloned().collect()
    }
    /// Replicated writes a secondary could not apply (always 0 unless there
    /// is a bug; such a secondary rejoins).
    pub fn divergences(&self) -> u64 {
        self.divergences
    }
    /// Why the last divergence happened.
    pub fn last_divergence(&self) -> Option<&str> {
        self.last_divergence.as_deref()
    }

    fn diverged(&mut self, why: String) {
        self.divergences += 1;
        self.last_divergence = Some(why);
    }

    /// Forwarded writes this node found missing (a link to its primary
    /// broke and dropped them) and had sent again (or, while copying,
    /// repaired by starting the copy over).
    pub fn lost_replicates(&self) -> u64 {
        self.lost_replicates
    }

    /// A forwarded write never arrived (a link broke under it): ask the
    /// primary to send it again, from `expected` on. The primary holds
    /// every write we have not acknowledged, so we keep our copy (and our
    /// place as the in-sync member: throwing it away for a full copy left
    /// a window in which the group had no member able to take over). Not a
    /// divergence: links may drop messages when they break, and the
    /// sequence numbers exist to notice. Asked again after a heartbeat
    /// interval while the gap stays.
    fn lost_replicate(&mut self, primary: NodeId, expected: u64, seen: u64) {
        let now = self.now;
        if self.resend_asked.is_some_and(|(f, at)| {
            f == expected && now.saturating_sub(at) < self.cfg.heartbeat_interval
        }) {
            return;
        }
        if self.resend_asked.is_none_or(|(f, _)| f != expected) {
            tracing::warn!(
                expected,
                seen,
                "a replicated write from the primary was lost; asking for it again"
            );
            self.lost_replicates += 1;
        }
        self.resend_asked = Some((expected, now));
        self.send(Addr::Node(primary), Body::Resend { from: expected });
    }

    /// Whether this node's arena may be read at `now`: it is the primary
    /// and its lease (as it last renewed it, less the clock-drift margin)
    /// has not run out. Only the primary serves one-sided reads, and only
    /// committed writes are in its arena's bytes (`unexposed`), so reads
    /// are linearizable: a secondary's bytes can lag the primary's
    /// acknowledgements, or run ahead of what a failover keeps, and two
    /// copies exposing a write at different moments would let one reader
    /// see it and a later reader not (docs/store.md, "Consistency").
    pub fn serves_reads(&self, now: Micros) -> bool {
        self.reads_until().is_some_and(|u| now < u)
    }

    /// Until when (this node's clock) one-sided reads of the arena may be
    /// served: the network layer gives the arena's STag this deadline, so
    /// the engine refuses reads from then on even if no thread of the node
    /// runs at that moment (a paused or busy node cannot serve stale
    /// bytes). `None`: not at all.
    pub fn reads_until(&self) -> Option<Micros> {
        match &self.state {
            State::Primary(p) => Some(p.lease_until),
            _ => None,
        }
    }

    /// Primary with an in-sync secondary.
    pub fn is_redundant(&self) -> bool {
        matches!(&self.state, State::Primary(p) if matches!(p.replica, Replica::InSync { .. }))
    }
    /// Secondary that finished copying.
    pub fn is_synced_secondary(&self) -> bool {
        matches!(self.state, State::Secondary { copy: None, .. })
    }
    /// Primary with no write awaiting acknowledgement (or exposure).
    pub fn is_idle(&self) -> bool {
        match &self.state {
            State::Primary(p) => p.pending.is_empty() && self.unexposed.is_empty(),
            _ => true,
        }
    }
    /// Status report.
    pub fn status(&self) -> StatusInfo {
        let u = self.alloc.usage();
        StatusInfo {
            node: self.cfg.member.node,
            role: match &self.state {
                State::Joining { .. } => proto::ROLE_JOINING,
                State::Secondary {
                    copy: None,
                    registered: true,
                    ..
                } => proto::ROLE_SECONDARY,
                State::Secondary { .. } => proto::ROLE_SYNCING,
                State::Primary(_) => proto::ROLE_PRIMARY,
                State::Fenced { .. } | State::Leaving { .. } => proto::ROLE_FENCED,
            },
            epoch: self.epoch,
            arena_base: self.cfg.arena.base,
            arena_len: self.cfg.arena.len,
            stag: self.cfg.arena.stag,
            allocated: u.allocated,
            // The index's region is an allocation, no object.
            objects: u.allocations - self.alloc.allocation_at(0).is_some() as u64,
            redundant: self.is_redundant(),
            applied_seq: self.applied_seq,
            keys: self.index.as_ref().map_or(0, |m| m.len() as u64),
            resp_port: self.cfg.resp_port,
            min_in_sync: self.cfg.min_in_sync,
        }
    }

    fn check_invariants(&self) {
        if let State::Primary(p) = &self.state {
            assert_eq!(
                p.next_seq,
                self.applied_seq + 1,
                "primary applies every seq it assigns"
            );
            if let Some((&first, _)) = p.pending.iter().next() {
                assert!(first <= self.applied_seq);
            }
            if let Replica::InSync { .. } = p.replica {
                assert!(p.replicated_through <= self.applied_seq);
            }
        }
        if let (Some(f), Some(b)) = (self.unexposed.front(), self.unexposed.back()) {
            assert!(
                b.0 == self.applied_seq && b.0 - f.0 + 1 == self.unexposed.len() as u64,
                "unexposed writes are the last applied ones, contiguous"
            );
        }
        debug_assert!({
            self.alloc.check_invariants();
            true
        });
    }

    // ------------------------------------------------------------ helpers

    fn send(&mut self, to: Addr, body: Body) {
        self.out.push(Output::Send {
            to,
            env: Envelope {
                epoch: self.epoch,
                body,
            },
        });
    }

    fn coord(&mut self, req: CoordRequest) -> u64 {
        let id = self.next_coord_id;
        self.next_coord_id += 1;
        self.out.push(Output::Coord { id, req });
        id
    }

    fn primary_hint(&self) -> Option<NodeId> {
        match &self.state {
            State::Secondary { primary, .. } => Some(*primary),
            State::Joining {
                join_sent: Some((p, _)),
                ..
            } => Some(*p),
            State::Primary(_) => Some(self.cfg.member.node),
            _ => None,
        }
    }

    /// Discards all data and starts joining under a fresh incarnation (the
    /// coordinator must never mistake this empty node for its former self).
    ///
    /// A node whose incarnation the coordinator may name (a synced
    /// secondary, a former primary) first retires it at the coordinator
    /// (`Leaving`), keeping its data until that is done: if the record
    /// names it (its data may be the only full copy, or a campaign of its
    /// is on its way) it keeps the data, and once retired no late
    /// registration or campaign can name it.
    fn become_joining(&mut self, primary: Option<NodeId>) {
        let named = match &self.state {
            State::Joining { .. } | State::Leaving { .. } => false,
            State::Secondary { copy, .. } => copy.is_none(),
            State::Primary(_) | State::Fenced { .. } => true,
        };
        if named {
            let new = self.cfg.member.incarnation.wrapping_add(1);
            let id = self.coord(CoordRequest::Retire { new });
            self.state = State::Leaving {
                to: primary,
                new,
                asked: Some(id),
                last_try: self.now,
            };
            return;
        }
        self.rejoin_now(primary, self.cfg.member.incarnation.wrapping_add(1));
    }

    /// Discards all data and joins as incarnation `incarnation`.
    fn rejoin_now(&mut self, primary: Option<NodeId>, incarnation: u64) {
        self.cfg.member.incarnation = incarnation;
        self.alloc = Allocator::new(self.cfg.arena.len);
        self.dedup.clear();
        self.applied_seq = 0;
        self.unexposed.clear();
        self.layout = None;
        self.index = None;
        self.state = State::Joining {
            join_sent: None,
            asked: None,
            last_try: self.now,
        };
        if let Some(p) = primary {
            self.send_join(p);
        }
    }

    fn send_join(&mut self, primary: NodeId) {
        self.state = State::Joining {
            join_sent: Some((primary, self.now)),
            asked: None,
            last_try: self.now,
        };
        let member = self.cfg.member;
        let arena_len = self.cfg.arena.len;
        self.send(Addr::Node(primary), Body::Join { member, arena_len });
    }

    /// Takes over as primary at `epoch`. `in_sync`: the secondary the
    /// coordinator kept in sync (a re-election of this very node after a
    /// lease hiccup): its acknowledgements stay required, and it keeps its
    /// copy instead of copying the whole arena again.
    fn become_primary(&mut self, epoch: u64, in_sync: Option<Member>) {
        if epoch < self.epoch {
            // A late answer: someone won a later epoch since (we heard of
            // it from a peer). We are superseded; find out by whom.
            let id = self.coord(CoordRequest::Get);
            self.state = State::Fenced {
                asked: Some(id),
                last_try: self.now,
            };
            return;
        }
        self.epoch = epoch;
        if self.layout.is_none() {
            // A new group's first primary: its arena holds nothing yet
            // (a node with data always knows its layout). Reserve and
            // format the key index at offset 0.
            assert_eq!(self.applied_seq, 0, "a node with data knows its index");
            let layout = Layout::for_arena(self.cfg.arena.len, self.cfg.index_buckets);
            self.alloc
                .alloc_at(0, layout.reserved_len())
                .expect("the index fits an empty arena");
            layout
                .format(&mut self.mem)
                .expect("the index lies inside the arena");
            self.layout = Some(layout);
            self.index = Some(Meta::new(layout));
        }
        // The lease began at the coordinator some time before this reply:
        // count it as expired until a renewal sent from now on succeeds.
        let id = self.coord(CoordRequest::KeepAlive { epoch: self.epoch });
        let replica = match in_sync {
            Some(m) if m.node != self.cfg.member.node => Replica::InSync {
                m,
                last_heard: self.now,
            },
            _ => Replica::None,
        };
        self.state = State::Primary(Primary {
            next_seq: self.applied_seq + 1,
            pending: BTreeMap::new(),
            replica,
            replicated_through: 0,
            max_released: 0,
            lease_until: self.now,
            keepalive: Some((id, self.now, self.epoch)),
            last_beat: self.now,
        });
    }

    fn step_down(&mut self) {
        if let State::Primary(p) = std::mem::replace(
            &mut self.state,
            State::Fenced {
                asked: None,
                last_try: self.now,
            },
        ) {
            for (_, ws) in p.pending {
                for w in ws {
                    self.send(
                        w.to,
                        Body::Response {
                            req_id: w.req_id,
                            result: Err(StoreError::NotPrimary { primary: None }),
                        },
                    );
                }
            }
        }
        let id = self.coord(CoordRequest::Get);
        self.state = State::Fenced {
            asked: Some(id),
            last_try: self.now,
        };
    }

    // ------------------------------------------------------------ messages

    fn on_message(&mut self, from: Addr, env: Envelope) {
        if env.epoch < self.epoch {
            if let (State::Secondary { primary, .. }, Body::Replicate { seq, .. }) =
                (&self.state, &env.body)
            {
                if from == Addr::Node(*primary) {
                    // Refusing part of the stream would leave a gap.
                    let (primary, seq) = (*primary, *seq);
                    self.diverged(format!("write {seq} from my primary at an older epoch"));
                    return self.become_joining(Some(primary));
                }
            }
            match env.body {
                Body::Request { req_id, .. } => self.send(
                    from,
                    Body::Response {
                        req_id,
                        result: Err(StoreError::StaleEpoch {
                            current: self.epoch,
                        }),
                    },
                ),
                Body::Stale | Body::Response { .. } => {}
                _ => self.send(from, Body::Stale),
            }
            return;
        }
        if env.epoch > self.epoch {
            match &self.state {
                State::Primary(p) => {
                    let cas_in_flight = matches!(
                        p.replica,
                        Replica::Registering { coord: Some(_), .. }
                            | Replica::Dropping { coord: Some(_) }
                    );
                    if cas_in_flight {
                        // Our own epoch bump may be in flight; the sender
                        // (which learned it from the coordinator) retries.
                        return;
                    }
                    self.epoch = env.epoch;
                    self.step_down();
                }
                // A secondary takes its epoch only from its primary's
                // stream: adopting a newer one from elsewhere (a client that
                // already saw the primary's latest epoch bump) would make it
                // refuse writes still in flight from its primary, leaving a
                // gap in the sequence.
                State::Secondary { primary, .. } => {
                    if from == Addr::Node(*primary) {
                        self.epoch = env.epoch;
                    }
                }
                _ => {
                    if let Addr::Node(_) = from {
                        self.epoch = env.epoch;
                    }
                }
            }
        }
        match env.body {
            Body::Request { client, req_id, op } => self.on_request(from, client, req_id, op),
            Body::Heartbeat => self.on_heartbeat(from),
            Body::Replicate { seq, op } => self.on_replicate(from, seq, op),
            Body::ReplicateAck { seq } => self.on_replicate_ack(from, seq),
            Body::ReplicateHead { seq, in_sync } => self.on_replicate_head(from, seq, in_sync),
            Body::Resend { from: first } => self.on_resend(from, first),
            Body::Join { member, arena_len } => self.on_join(from, member, arena_len),
            Body::SyncStart {
                session,
                start_seq,
                alloc,
                dedup,
                stag,
            } => self.on_sync_start(from, session, start_seq, alloc, dedup, stag),
            Body::SyncRequest {
                session,
                offset,
                len,
            } => self.on_sync_request(from, session, offset, len),
            Body::SyncChunk {
                session,
                offset,
                data,
            } => self.on_sync_chunk(from, session, offset, data),
            Body::SyncDone {
                session,
                through_seq,
            } => self.on_sync_done(from, session, through_seq),
            Body::JoinRefused { .. } => {
                if let State::Joining { join_sent, .. } = &mut self.state {
                    if join_sent.is_some_and(|(p, _)| Addr::Node(p) == from) {
                        *join_sent = None;
                    }
                }
            }
            Body::Stale => {
                // The sender is at a newer epoch (adopted above). A synced
                // secondary re-sends its (cumulative) ack at once: the
                // refused message may have been one. A joining node retries
                // at once.
                if let State::Joining {
                    join_sent: Some((p, _)),
                    ..
                } = self.state
                {
                    if Addr::Node(p) == from {
                        self.send_join(p);
                    }
                }
                if let State::Secondary {
                    primary,
                    copy: None,
                    ..
                } = self.state
                {
                    if Addr::Node(primary) == from {
                        let seq = self.applied_seq;
                        self.send(from, Body::ReplicateAck { seq });
                    }
                }
            }
            Body::Response { .. } => {}
        }
    }

    fn on_heartbeat(&mut self, from: Addr) {
        let now = self.now;
        match &mut self.state {
            State::Primary(p) => {
                if let Addr::Node(n) = from {
                    touch(&mut p.replica, n, now);
                }
            }
            State::Secondary {
                primary,
                last_heard,
                ..
            } if from == Addr::Node(*primary) => *last_heard = now,
            _ => {}
        }
        if let Addr::Client(_) = from {
            self.send(from, Body::Heartbeat);
        }
    }

    fn on_request(&mut self, from: Addr, client: u64, req_id: u64, op: Op) {
        if let Op::Status = op {
            let s = self.status();
            self.send(
                from,
                Body::Response {
                    req_id,
                    result: Ok(Reply::Status(s)),
                },
            );
            return;
        }
        if !matches!(self.state, State::Primary(_)) {
            let primary = self.primary_hint();
            self.send(
                from,
                Body::Response {
                    req_id,
                    result: Err(StoreError::NotPrimary { primary }),
                },
            );
            return;
        }
        if matches!(op, Op::Read { .. } | Op::Get { .. } | Op::Scan { .. }) {
            // A primary whose lease may have run out (cut off from the
            // coordinator, possibly replaced) must not answer reads either.
            if !self.serves_reads(self.now) {
                self.send(
                    from,
                    Body::Response {
                        req_id,
                        result: Err(StoreError::NotPrimary { primary: None }),
                    },
                );
                return;
            }
            let result = match op {
                Op::Read { ptr } => self.read(ptr),
                Op::Get { key } => self.get_key(&key),
                Op::Scan {
                    cursor,
                    count,
                    pattern,
                } => self.scan(cursor, count, &pattern),
                _ => unreachable!(),
            };
            self.send(from, Body::Response { req_id, result });
            return;
        }
        // A retry of a write already applied: answer as before, once that
        // write is safe.
        if let Some(e) = self.dedup.get(&client) {
            if e.req_id == req_id {
                let (seq, reply) = (e.seq, e.reply.clone());
                self.add_waiter(seq, from, req_id, Ok(reply));
                self.release();
                return;
            }
            if e.req_id > req_id {
                return; // an old duplicate; the client has moved on
            }
        }
        if !self.may_accept_writes() {
            return self.send(
                from,
                Body::Response {
                    req_id,
                    result: Err(StoreError::NotEnoughReplicas),
                },
            );
        }
        match self.plan(&op) {
            Err(e) => self.send(
                from,
                Body::Response {
                    req_id,
                    result: Err(e),
                },
            ),
            Ok((effects, reply)) => {
                let State::Primary(p) = &mut self.state else {
                    unreachable!()
                };
                let seq = p.next_seq;
                p.next_seq += 1;
                let rep = RepOp {
                    client,
                    req_id,
                    effects,
                    reply: reply.clone(),
                };
                // The bytes reach the arena (and one-sided readers) when
                // the write commits (`release`).
                let caps = self.apply_meta(seq, &rep).expect("a planned write applies");
                let State::Primary(p) = &self.state else {
                    unreachable!()
                };
                if let Some(n) = p.replica.node() {
                    self.send(
                        Addr::Node(n),
                        Body::Replicate {
                            seq,
                            op: rep.clone(),
                        },
                    );
                }
                self.unexposed.push_back((seq, rep, caps));
                self.add_waiter(seq, from, req_id, Ok(reply));
                self.release();
            }
        }
    }

    fn add_waiter(&mut self, seq: u64, to: Addr, req_id: u64, result: Result<Reply, StoreError>) {
        let State::Primary(p) = &mut self.state else {
            unreachable!()
        };
        p.pending
            .entry(seq)
            .or_default()
            .push(Waiter { to, req_id, result });
    }

    fn read(&self, ptr: RemotePtr) -> Result<Reply, StoreError> {
        let off = self.object_offset(&ptr)?;
        // Another object of the pointer API holds the space now (maybe
        // not yet exposed in the bytes).
        let keyed = self.index.as_ref().is_some_and(|m| m.owns(off));
        if !keyed && self.unkeyed_gens.get(&off) != Some(&ptr.gen) {
            return Err(StoreError::StalePointer { expected: ptr.gen });
        }
        match object::read_object(&self.mem, off, ptr.len as u64) {
            // The space holds another object than the pointer's.
            Ok(o) if o.generation != ptr.gen => Err(StoreError::StalePointer { expected: ptr.gen }),
            Ok(o) => Ok(Reply::Data {
                version: o.version,
                data: o.data,
            }),
            // A live allocation whose bytes are not exposed yet (empty, or
            // what an older object left there, which does not decode):
            // another object's, being written. (This loop is the only
            // writer of the arena, so a committed object never reads torn
            // here; and a pointer is handed out only once its object is
            // committed.)
            Err(object::ObjectError::Empty | object::ObjectError::Torn) => {
                Err(StoreError::StalePointer { expected: ptr.gen })
            }
            Err(e) => Err(StoreError::Other(e.to_string())),
        }
    }

    /// The largest value that an object with a key of `key_len` bytes (0:
    /// the pointer API) can hold: the largest allocation there can be (the
    /// arena less the key index's region, and what a pointer's 32-bit
    /// length names) less the header and the key.
    fn max_value(&self, key_len: usize) -> u64 {
        let reserved = self.layout.map_or(0, |l| l.reserved_len());
        let largest = self.alloc.size().saturating_sub(reserved);
        let largest = largest.min(u32::MAX as u64 & !(object::UNIT - 1));
        largest.saturating_sub(object::encoded_len(key_len, 0) as u64)
    }

    fn alloc_error(&self, e: AllocError, key_len: usize, value_len: usize) -> StoreError {
        match e {
            AllocError::TooLarge { .. } => StoreError::TooLarge {
                len: value_len as u64,
                max: self.max_value(key_len),
            },
            AllocError::Full { largest_free, .. } => StoreError::Full { largest_free },
            e => StoreError::Other(e.to_string()),
        }
    }

    /// A new allocation for an object of a `key_len`-byte key and a
    /// `value_len`-byte value: its offset and length. A value that no
    /// allocation could ever hold is `TooLarge` (not `Full`), with the
    /// largest that could be stored.
    fn new_allocation(&self, key_len: usize, value_len: usize) -> Result<(u64, u64), StoreError> {
        if value_len as u64 > self.max_value(key_len) {
            return Err(StoreError::TooLarge {
                len: value_len as u64,
                max: self.max_value(key_len),
            });
        }
        let need = object::encoded_len(key_len, value_len) as u64;
        let off = self
            .alloc
            .find_fit(need)
            .map_err(|e| self.alloc_error(e, key_len, value_len))?;
        Ok((off, crate::alloc::round_up(need).unwrap()))
    }

    fn ptr_at(&self, off: u64, len: u64, gen: u64) -> RemotePtr {
        RemotePtr {
            addr: self.cfg.arena.base + off,
            stag: self.cfg.arena.stag,
            len: len as u32,
            gen,
        }
    }

    /// The arena (its STag as of the last applied rotation).
    pub fn arena(&self) -> ArenaRef {
        self.cfg.arena
    }

    /// The arena offset a pointer of the pointer API names: an allocation
    /// (`RemotePtr::validate`), and not the key index's region, which is
    /// one but holds no object.
    fn object_offset(&self, ptr: &RemotePtr) -> Result<u64, StoreError> {
        let off = ptr
            .validate(&self.cfg.arena, &self.alloc)
            .map_err(ptr_error)?;
        if let Some(l) = self.layout.filter(|l| off < l.reserved_len()) {
            return Err(StoreError::Other(format!(
                "the pointer names the key index (arena bytes 0..{}), not an object",
                l.reserved_len()
            )));
        }
        Ok(off)
    }

    /// The arena offset a pointer names, for a write of the pointer API:
    /// objects that belong to a key change only through the key, and the
    /// object must be the pointer's (its generation), not one that took
    /// its space after a delete.
    fn unkeyed_offset(&self, ptr: &RemotePtr) -> Result<u64, StoreError> {
        let off = self.object_offset(ptr)?;
        if self.index.as_ref().is_some_and(|m| m.owns(off)) {
            return Err(StoreError::Keyed);
        }
        if self.unkeyed_gens.get(&off) != Some(&ptr.gen) {
            return Err(StoreError::StalePointer { expected: ptr.gen });
        }
        Ok(off)
    }

    /// Decides a write's effects without changing anything.
    fn plan(&self, op: &Op) -> Result<(Vec<Effect>, Reply), StoreError> {
        let seq = self.applied_seq + 1;
        let write = |offset: u64, data: &[u8], generation: u64| Effect::Write {
            offset,
            version: seq,
            generation,
            key: Vec::new(),
            data: data.to_vec(),
        };
        match op {
            Op::Insert { data } => {
                let (off, len) = self.new_allocation(0, data.len())?;
                Ok((
                    vec![Effect::Alloc { offset: off, len }, write(off, data, seq)],
                    Reply::Inserted(self.ptr_at(off, len, seq)),
                ))
            }
            Op::Update { ptr, data } => {
                let off = self.unkeyed_offset(ptr)?;
                let need = object::encoded_len(0, data.len());
                if need as u64 <= ptr.len as u64 {
                    // In place: the object keeps its generation (and the
                    // pointer stays valid); its STag is the arena's now.
                    let p = RemotePtr {
                        stag: self.cfg.arena.stag,
                        ..*ptr
                    };
                    return Ok((vec![write(off, data, ptr.gen)], Reply::Updated(p)));
                }
                let (new_off, len) = self.new_allocation(0, data.len())?;
                Ok((
                    vec![
                        Effect::Alloc {
                            offset: new_off,
                            len,
                        },
                        write(new_off, data, seq),
                        Effect::Free { offset: off },
                    ],
                    Reply::Updated(self.ptr_at(new_off, len, seq)),
                ))
            }
            Op::Delete { ptr } => {
                let off = self.unkeyed_offset(ptr)?;
                Ok((vec![Effect::Free { offset: off }], Reply::Deleted))
            }
            Op::Put { key, data, cond } => self.plan_put(seq, key, data, *cond),
            Op::Remove { key } => self.plan_remove(key),
            Op::RotateStag { stag } => {
                if !crate::ptr::same_arena(*stag, self.cfg.arena.stag) || *stag == 0 {
                    return Err(StoreError::Other(format!(
                        "a rotation keeps the arena's STag index ({:#010x} -> {stag:#010x})",
                        self.cfg.arena.stag
                    )));
                }
                Ok((
                    vec![Effect::Stag { stag: *stag }],
                    Reply::Rotated { stag: *stag },
                ))
            }
            Op::Read { .. } | Op::Get { .. } | Op::Scan { .. } | Op::Status => {
                unreachable!("not a write")
            }
        }
    }

    /// Applies a write's effects, allocator and arena bytes; identical on
    /// every replica. `over_copy`: a write replayed over a fuzzy copy of
    /// the arena (its index buckets may be torn; `Layout::apply_over_copy`).
    fn apply(&mut self, seq: u64, op: &RepOp, over_copy: bool) -> Result<(), String> {
        let caps = self.apply_meta(seq, op)?;
        self.apply_bytes(seq, op, &caps, over_copy)
    }

    /// The bytes of write `seq` whose allocator effects [`Self::apply_meta`]
    /// already applied (checked there: they cannot fail on a well-formed
    /// arena); `caps`: the allocation of each `Write` effect, in order, as
    /// `apply_meta` found them.
    fn apply_bytes(
        &mut self,
        seq: u64,
        op: &RepOp,
        caps: &[u64],
        over_copy: bool,
    ) -> Result<(), String> {
        let mut caps = caps.iter();
        for e in &op.effects {
            match e {
                Effect::Alloc { .. } => {}
                Effect::Write {
                    offset,
                    version,
                    generation,
                    key,
                    data,
                } => {
                    let cap = *caps.next().ok_or("allocation of a write unknown")?;
                    let f = object::Fields {
                        version: *version,
                        generation: *generation,
                        key,
                        data,
                    };
                    object::write_object(&mut self.mem, *offset, cap, &f)
                        .map_err(|e| e.to_string())?;
                }
                Effect::Free { offset } => {
                    object::scrub(&mut self.mem, *offset).map_err(|e| e.to_string())?;
                }
                // Applied in `apply_meta`: no bytes.
                Effect::Stag { .. } => {}
                Effect::Index { edit, .. } => {
                    let layout = self.layout.ok_or("an index edit before the index")?;
                    if over_copy {
                        layout.apply_over_copy(&mut self.mem, edit, seq)
                    } else {
                        layout.apply(&mut self.mem, edit, seq)
                    }
                    .map_err(|e| e.to_string())?;
                }
            }
        }
        Ok(())
    }

    /// A write's effects on the allocator, the key index's state and the
    /// retry table, with every check of its bytes' effects (so
    /// [`Self::apply_bytes`] cannot fail); returns the allocation of each
    /// `Write` effect.
    fn apply_meta(&mut self, seq: u64, op: &RepOp) -> Result<Vec<u64>, String> {
        if seq != self.applied_seq + 1 {
            return Err(format!(
                "write {seq} out of order after {}",
                self.applied_seq
            ));
        }
        let mut caps = Vec::new();
        for e in &op.effects {
            match e {
                Effect::Alloc { offset, len } => self
                    .alloc
                    .alloc_at(*offset, *len)
                    .map_err(|e| e.to_string())?,
                Effect::Write {
                    offset,
                    key,
                    data,
                    generation,
                    ..
                } => {
                    if key.is_empty() {
                        self.unkeyed_gens.insert(*offset, *generation);
                    }
                    let cap = self
                        .alloc
                        .allocation_at(*offset)
                        .ok_or_else(|| format!("write to unallocated offset {offset}"))?;
                    if object::encoded_len(key.len(), data.len()) as u64 > cap
                        || key.len() > object::MAX_KEY_LEN
                    {
                        return Err(format!(
                            "write of {} bytes into an allocation of {cap} at {offset}",
                            key.len() + data.len()
                        ));
                    }
                    caps.push(cap);
                }
                Effect::Free { offset } => {
                    self.alloc.free(*offset).map_err(|e| e.to_string())?;
                    self.unkeyed_gens.remove(offset);
                }
                Effect::Stag { stag } => {
                    if !crate::ptr::same_arena(*stag, self.cfg.arena.stag) {
                        return Err(format!(
                            "a rotation to STag {stag:#010x} changes the arena's index ({:#010x})",
                            self.cfg.arena.stag
                        ));
                    }
                    self.cfg.arena.stag = *stag;
                }
                Effect::Index {
                    key,
                    generation,
                    edit,
                } => {
                    let layout = self.layout.ok_or("an index edit before the index")?;
                    // Checked here whether or not the index's state is
                    // kept (it is not while replaying a copy: rebuilt
                    // afterwards), so `apply_bytes` cannot fail on it.
                    edit.validate(&layout, self.cfg.arena.len)
                        .map_err(|e| e.to_string())?;
                    if let Some(m) = &mut self.index {
                        m.apply(edit, key, *generation)?;
                    }
                }
            }
        }
        self.dedup.insert(
            op.client,
            DedupEntry {
                client: op.client,
                req_id: op.req_id,
                seq,
                reply: op.reply.clone(),
            },
        );
        self.applied_seq = seq;
        Ok(caps)
    }

    /// Writes the bytes of every unexposed write through `seq` into the
    /// arena, in order.
    fn expose(&mut self, seq: u64) {
        while self.unexposed.front().is_some_and(|w| w.0 <= seq) {
            let (seq, op, caps) = self.unexposed.pop_front().expect("front");
            self.apply_bytes(seq, &op, &caps, false)
                .expect("apply_meta checked every effect");
        }
    }

    /// Whether a new write may be accepted now (the `min_in_sync` policy):
    /// with 1, only while a secondary's acknowledgements are required and
    /// it is not being dropped.
    fn may_accept_writes(&self) -> bool {
        match &self.state {
            State::Primary(p) => {
                self.cfg.min_in_sync == 0
                    || matches!(
                        p.replica,
                        Replica::Registering { failed: false, .. } | Replica::InSync { .. }
                    )
            }
            _ => false,
        }
    }

    /// Sends the responses that may go now, in sequence order.
    fn release(&mut self) {
        let now = self.now;
        let State::Primary(p) = &mut self.state else {
            return;
        };
        if now >= p.lease_until {
            return; // lease possibly lost: acknowledge nothing
        }
        // Committed: held by the in-sync secondary, or by us alone where
        // the policy allows it (with min_in_sync 1 a write waits for a
        // secondary to be in sync again).
        let committed = if p.replica.acks_required() {
            p.replicated_through
        } else if self.cfg.min_in_sync == 0 {
            self.applied_seq
        } else {
            0
        };
        let committed = committed.max(p.max_released);
        self.expose(committed);
        let State::Primary(p) = &mut self.state else {
            unreachable!()
        };
        let mut sends = Vec::new();
        while let Some(entry) = p.pending.first_entry() {
            let seq = *entry.key();
            if seq > committed {
                break;
            }
            for w in entry.remove() {
                sends.push((w.to, w.req_id, w.result));
            }
            p.max_released = p.max_released.max(seq);
        }
        for (to, req_id, result) in sends {
            self.send(to, Body::Response { req_id, result });
        }
        self.maybe_register();
    }

    /// Registers a caught-up secondary once it holds every released write.
    fn maybe_register(&mut self) {
        let State::Primary(p) = &mut self.state else {
            return;
        };
        if let Replica::Registering {
            m,
            coord: None,
            failed: false,
            ..
        } = p.replica
        {
            if p.replicated_through >= p.max_released {
                let epoch = self.epoch;
                let id = self.coord(CoordRequest::SetInSync {
                    epoch,
                    in_sync: Some(m),
                });
                if let State::Primary(p) = &mut self.state {
                    if let Replica::Registering { coord, .. } = &mut p.replica {
                        *coord = Some(id);
                    }
                }
            }
        }
    }

    fn on_replicate(&mut self, from: Addr, seq: u64, op: RepOp) {
        let State::Secondary {
            primary,
            last_heard,
            copy,
            ..
        } = &mut self.state
        else {
            return;
        };
        if from != Addr::Node(*primary) {
            return;
        }
        *last_heard = self.now;
        if let Some(c) = copy {
            c.buffered.push((seq, op));
            return;
        }
        let primary = *primary;
        if seq > self.applied_seq + 1 {
            return self.lost_replicate(primary, self.applied_seq + 1, seq);
        }
        if seq <= self.applied_seq {
            // Sent again after a `Resend` while the original was still on
            // its way: applied already.
            let seq = self.applied_seq;
            return self.send(Addr::Node(primary), Body::ReplicateAck { seq });
        }
        match self.apply(seq, &op, false) {
            Ok(()) => self.send(Addr::Node(primary), Body::ReplicateAck { seq }),
            Err(e) => {
                self.diverged(e);
                self.become_joining(Some(primary));
            }
        }
    }

    /// The primary's heartbeat says it has forwarded writes through `seq`.
    /// Its messages reach us in order, so having applied less means a
    /// `Replicate` was lost with a broken link: resynchronise now rather
    /// than when the next write shows the gap (there may be none, and the
    /// lost write's client would wait for an ack that never comes).
    fn on_replicate_head(&mut self, from: Addr, seq: u64, in_sync: bool) {
        let State::Secondary {
            primary,
            copy: None,
            ref mut registered,
            ..
        } = self.state
        else {
            return;
        };
        if from != Addr::Node(primary) {
            return;
        }
        *registered = in_sync;
        if seq <= self.applied_seq {
            return;
        }
        self.lost_replicate(primary, self.applied_seq + 1, seq);
    }

    /// Our secondary lost forwarded writes from `first` on: send them again
    /// from the writes it has not acknowledged (kept unexposed while its
    /// acknowledgements are required). A secondary whose acknowledgements
    /// are not required is copying: it starts over by itself.
    fn on_resend(&mut self, from: Addr, first: u64) {
        let State::Primary(p) = &self.state else {
            return;
        };
        let Addr::Node(n) = from else { return };
        if p.replica.node() != Some(n) || !p.replica.acks_required() {
            return;
        }
        let covered =
            first > self.applied_seq || self.unexposed.front().is_some_and(|w| w.0 <= first);
        if !covered {
            // It lacks writes it acknowledged: not a replica we can trust.
            tracing::warn!(first, "secondary asks for committed writes; dropping it");
            if let State::Primary(p) = &self.state {
                if matches!(p.replica, Replica::InSync { .. }) {
                    return self.drop_replica();
                }
            }
            return;
        }
        let again: Vec<(u64, RepOp)> = self
            .unexposed
            .iter()
            .filter(|w| w.0 >= first)
            .map(|w| (w.0, w.1.clone()))
            .collect();
        for (seq, op) in again {
            self.send(from, Body::Replicate { seq, op });
        }
    }

    fn on_replicate_ack(&mut self, from: Addr, seq: u64) {
        let now = self.now;
        let State::Primary(p) = &mut self.state else {
            return;
        };
        let Addr::Node(n) = from else { return };
        if p.replica.node() != Some(n) || seq > self.applied_seq {
            return;
        }
        touch(&mut p.replica, n, now);
        p.replicated_through = p.replicated_through.max(seq);
        self.release();
    }

    fn on_join(&mut self, from: Addr, member: Member, arena_len: u64) {
        let Addr::Node(n) = from else { return };
        let refuse = |s: &mut Self, reason: &str| {
            s.send(
                from,
                Body::JoinRefused {
                    reason: reason.to_string(),
                },
            )
        };
        if member.node != n || member.node == self.cfg.member.node {
            return refuse(self, "bad member");
        }
        if arena_len != self.cfg.arena.len {
            return refuse(self, "arena size differs");
        }
        let now = self.now;
        let State::Primary(p) = &mut self.state else {
            return refuse(self, "not the primary");
        };
        match p.replica {
            Replica::None => {}
            Replica::Syncing { m, .. } if m.node == n => {}
            Replica::Registering { m, coord: None, .. } if m.node == n && m != member => {
                // It restarted before it was registered: forget it (as
                // when it falls silent) and copy to the new incarnation.
                p.replica = Replica::None;
            }
            Replica::Registering {
                m, ref mut failed, ..
            } if m.node == n && m != member => {
                // Being registered: dropped once the registration is
                // answered; the new incarnation retries its Join.
                *failed = true;
                return refuse(self, "previous incarnation being removed; retry");
            }
            Replica::InSync { m, .. } if m.node == n => {
                // It restarted: drop it from the record first.
                let epoch = self.epoch;
                let id = self.coord(CoordRequest::SetInSync {
                    epoch,
                    in_sync: None,
                });
                if let State::Primary(p) = &mut self.state {
                    p.replica = Replica::Dropping { coord: Some(id) };
                }
                return refuse(self, "previous incarnation being removed; retry");
            }
            _ => return refuse(self, "another secondary is active"),
        }
        // The copy reads our arena's bytes: put every write in them first.
        // No secondary's acknowledgements are required here (we are alone
        // or copying to this very node), so no other node can take over
        // and lose these writes after a reader saw them.
        let State::Primary(p) = &self.state else {
            unreachable!()
        };
        assert!(!p.replica.acks_required());
        self.expose(self.applied_seq);
        let start_seq = self.applied_seq + 1;
        self.sessions += 1;
        let session = self.sessions;
        let State::Primary(p) = &mut self.state else {
            unreachable!()
        };
        p.replica = Replica::Syncing {
            m: member,
            last_heard: now,
            session,
        };
        p.replicated_through = 0;
        let alloc = self.alloc.snapshot();
        let dedup = self.dedup_table();
        let stag = self.cfg.arena.stag;
        self.send(
            from,
            Body::SyncStart {
                session,
                start_seq,
                alloc,
                dedup,
                stag,
            },
        );
    }

    fn on_sync_start(
        &mut self,
        from: Addr,
        session: u64,
        start_seq: u64,
        alloc: crate::alloc::AllocSnapshot,
        dedup: Vec<DedupEntry>,
        stag: u32,
    ) {
        // Accepted from the primary we joined, also while copying or after:
        // the primary restarts a session when it sees a (possibly late,
        // duplicate) Join, and only the newest session's stream is
        // contiguous, so always follow the newest SyncStart.
        let p = match self.state {
            State::Joining {
                join_sent: Some((p, _)),
                ..
            } => p,
            State::Secondary { primary, .. } => primary,
            _ => return,
        };
        if from != Addr::Node(p) || start_seq == 0 {
            return;
        }
        let Ok(a) = Allocator::from_snapshot(&alloc) else {
            self.diverged("bad allocator snapshot".into());
            return self.become_joining(None);
        };
        if a.size() != self.alloc.size() || !crate::ptr::same_arena(stag, self.cfg.arena.stag) {
            return self.become_joining(None);
        }
        self.alloc = a;
        self.cfg.arena.stag = stag;
        self.unkeyed_gens.clear();
        self.layout = None;
        self.index = None;
        self.dedup = dedup.into_iter().map(|d| (d.client, d)).collect();
        self.applied_seq = start_seq - 1;
        self.state = State::Secondary {
            primary: p,
            last_heard: self.now,
            last_beat: self.now,
            registered: false,
            copy: Some(Copy {
                session,
                next_offset: 0,
                outstanding: 0,
                buffered: Vec::new(),
                last_progress: self.now,
            }),
            campaign: None,
        };
        self.request_chunks();
    }

    fn request_chunks(&mut self) {
        let (chunk, window, len) = (
            self.cfg.sync_chunk,
            self.cfg.sync_window,
            self.cfg.arena.len,
        );
        let State::Secondary {
            primary,
            copy: Some(c),
            ..
        } = &mut self.state
        else {
            return;
        };
        let primary = *primary;
        let session = c.session;
        let mut reqs = Vec::new();
        while c.outstanding < window && c.next_offset < len {
            let n = (chunk as u64).min(len - c.next_offset) as u32;
            reqs.push((c.next_offset, n));
            c.next_offset += n as u64;
            c.outstanding += 1;
        }
        let done = c.outstanding == 0 && c.next_offset == len;
        for (offset, len) in reqs {
            self.send(
                Addr::Node(primary),
                Body::SyncRequest {
                    session,
                    offset,
                    len,
                },
            );
        }
        if done {
            self.finish_copy();
        }
    }

    fn finish_copy(&mut self) {
        let State::Secondary { primary, copy, .. } = &mut self.state else {
            return;
        };
        let primary = *primary;
        let c = copy.take().expect("copying");
        let session = c.session;
        // The arena describes its index (the superblock never changes after
        // the group's first primary wrote it, so the copy holds it whole).
        let mut sb = [0u8; index::SUPERBLOCK_LEN as usize];
        let layout = self
            .mem
            .read(0, &mut sb)
            .map_err(|e| e.to_string())
            .and_then(|()| Layout::from_superblock(&sb, self.cfg.arena.len));
        match layout {
            Ok(l) => self.layout = Some(l),
            Err(e) => {
                self.diverged(format!("copied arena: {e}"));
                return self.become_joining(Some(primary));
            }
        }
        self.index = None;
        for (seq, op) in c.buffered {
            if seq > self.applied_seq + 1 {
                // A write forwarded during the copy was lost: the primary
                // does not keep those (it does not wait for a copying
                // secondary), so start the copy over.
                tracing::warn!(
                    expected = self.applied_seq + 1,
                    seen = seq,
                    "a replicated write was lost during the copy; starting over"
                );
                self.lost_replicates += 1;
                return self.become_joining(Some(primary));
            }
            if let Err(e) = self.apply(seq, &op, true) {
                self.diverged(e);
                return self.become_joining(Some(primary));
            }
        }
        // The bytes are now exactly the primary's at `applied_seq`: the
        // index's state is rebuilt from them.
        let layout = self.layout.expect("set above");
        let mem = &self.mem;
        match Meta::from_memory(layout, mem, |s| object::read_key(mem, s.offset).ok()) {
            Ok(m) => self.index = Some(m),
            Err(e) => {
                self.diverged(format!("copied index: {e}"));
                return self.become_joining(Some(primary));
            }
        }
        // So are the pointer API's generations: every allocation past the
        // index's region that no key owns holds an object of it.
        if let Err(e) = self.rebuild_unkeyed_gens() {
            self.diverged(format!("copied objects: {e}"));
            return self.become_joining(Some(primary));
        }
        let through_seq = self.applied_seq;
        self.send(
            Addr::Node(primary),
            Body::SyncDone {
                session,
                through_seq,
            },
        );
    }

    /// Rebuilds [`Self::unkeyed_gens`] from the objects' headers (after a
    /// copy: the bytes are then exactly the primary's).
    fn rebuild_unkeyed_gens(&mut self) -> Result<(), String> {
        let reserved = self.layout.map_or(0, |l| l.reserved_len());
        let mut gens = BTreeMap::new();
        for (off, _) in self.alloc.allocations() {
            if off < reserved || self.index.as_ref().is_some_and(|m| m.owns(off)) {
                continue;
            }
            let (key, generation) = object::read_key(&self.mem, off)
                .map_err(|e| format!("the object at {off}: {e}"))?;
            if !key.is_empty() {
                return Err(format!("the object at {off} has a key no slot names"));
            }
            gens.insert(off, generation);
        }
        self.unkeyed_gens = gens;
        Ok(())
    }

    fn on_sync_request(&mut self, from: Addr, session: u64, offset: u64, len: u32) {
        let now = self.now;
        let State::Primary(p) = &mut self.state else {
            return;
        };
        let Replica::Syncing { m, session: s, .. } = p.replica else {
            return;
        };
        if Addr::Node(m.node) != from || s != session {
            return;
        }
        touch(&mut p.replica, m.node, now);
        let mut data = vec![0u8; len as usize];
        if self.mem.read(offset, &mut data).is_ok() {
            self.send(
                from,
                Body::SyncChunk {
                    session,
                    offset,
                    data,
                },
            );
        }
    }

    fn on_sync_chunk(&mut self, from: Addr, session: u64, offset: u64, data: Vec<u8>) {
        let State::Secondary {
            primary,
            last_heard,
            copy: Some(c),
            ..
        } = &mut self.state
        else {
            return;
        };
        if from != Addr::Node(*primary) || session != c.session {
            return; // a chunk of an abandoned session
        }
        *last_heard = self.now;
        c.last_progress = self.now;
        c.outstanding -= 1;
        if self.mem.write(offset, &data).is_err() {
            self.diverged(format!("chunk at {offset} outside the arena"));
            return self.become_joining(None);
        }
        self.request_chunks();
    }

    fn on_sync_done(&mut self, from: Addr, session: u64, through_seq: u64) {
        let now = self.now;
        let State::Primary(p) = &mut self.state else {
            return;
        };
        let Replica::Syncing { m, session: s, .. } = p.replica else {
            return;
        };
        if Addr::Node(m.node) != from || s != session || through_seq > self.applied_seq {
            return;
        }
        p.replica = Replica::Registering {
            m,
            last_heard: now,
            coord: None,
            failed: false,
        };
        p.replicated_through = through_seq;
        self.release();
    }

    // ------------------------------------------------------------ timers

    fn on_tick(&mut self) {
        let now = self.now;
        let cfg = self.cfg.clone();
        // A tick after a gap of half a heartbeat timeout or more (the
        // ticker runs every half heartbeat interval) means this node did
        // not run for that long: its peers' messages may be waiting unread
        // behind it, so nobody is judged dead on this tick (finding 4: a
        // loaded host descheduled both processes, and the primary dropped
        // a healthy secondary on waking, before reading its heartbeats).
        let starved = self
            .last_tick
            .is_some_and(|t| now.saturating_sub(t) >= cfg.heartbeat_timeout / 2);
        self.last_tick = Some(now);
        let due = |last: Micros| now.saturating_sub(last) >= cfg.heartbeat_interval;
        let dead = |last: Micros| !starved && now.saturating_sub(last) > cfg.heartbeat_timeout;
        let replica_dead =
            |last: Micros| !starved && now.saturating_sub(last) > cfg.secondary_timeout;
        match &mut self.state {
            State::Joining {
                join_sent,
                asked,
                last_try,
            } => {
                if let Some((_, at)) = join_sent {
                    if dead(*at) {
                        *join_sent = None;
                    }
                }
                if join_sent.is_none() && asked.is_none() && due(*last_try) {
                    *last_try = now;
                    let id = self.coord(CoordRequest::Get);
                    if let State::Joining { asked, .. } = &mut self.state {
                        *asked = Some(id);
                    }
                }
            }
            State::Leaving {
                to,
                new,
                asked,
                last_try,
            } => {
                if asked.is_none() && due(*last_try) {
                    let (to, new) = (*to, *new);
                    let id = self.coord(CoordRequest::Retire { new });
                    self.state = State::Leaving {
                        to,
                        new,
                        asked: Some(id),
                        last_try: now,
                    };
                }
            }
            State::Fenced { asked, last_try } => {
                if asked.is_none() && due(*last_try) {
                    *last_try = now;
                    let id = self.coord(CoordRequest::Get);
                    self.state = State::Fenced {
                        asked: Some(id),
                        last_try: now,
                    };
                }
            }
            State::Secondary {
                primary,
                last_heard,
                last_beat,
                copy,
                campaign,
                ..
            } => {
                let primary = *primary;
                let beat = due(*last_beat);
                if beat {
                    *last_beat = now;
                }
                let silent = dead(*last_heard);
                let copying = copy.is_some();
                let stalled = copy.as_ref().is_some_and(|c| {
                    now.saturating_sub(c.last_progress)
                        > COPY_STALL_TIMEOUTS * cfg.heartbeat_timeout
                });
                // One campaign in flight at a time, one per interval.
                // (`last_heard` stays what it is: `after_lost` asks whether
                // the primary still talks to us.)
                let can_campaign = campaign.is_none() && due(self.last_campaign);
                if beat {
                    self.send(Addr::Node(primary), Body::Heartbeat);
                    if !copying {
                        // Acks are cumulative: repeating the latest one
                        // repairs an ack the primary refused (sent just
                        // before an epoch bump) or a link lost.
                        let seq = self.applied_seq;
                        self.send(Addr::Node(primary), Body::ReplicateAck { seq });
                    }
                }
                if silent && copying {
                    self.become_joining(None);
                } else if stalled {
                    // Ask the same primary for a new session.
                    self.become_joining(Some(primary));
                } else if silent && can_campaign {
                    self.last_campaign = now;
                    let id = self.coord(CoordRequest::Campaign);
                    if let State::Secondary { campaign, .. } = &mut self.state {
                        *campaign = Some(id);
                    }
                }
            }
            State::Primary(p) => {
                if due(p.last_beat) {
                    p.last_beat = now;
                    if let Some(n) = p.replica.node() {
                        let in_sync = matches!(p.replica, Replica::InSync { .. });
                        self.send(Addr::Node(n), Body::Heartbeat);
                        let seq = self.applied_seq;
                        self.send(Addr::Node(n), Body::ReplicateHead { seq, in_sync });
                    }
                    let State::Primary(p) = &mut self.state else {
                        unreachable!()
                    };
                    if p.keepalive.is_none() {
                        let epoch = self.epoch;
                        let id = self.coord(CoordRequest::KeepAlive { epoch });
                        if let State::Primary(p) = &mut self.state {
                            p.keepalive = Some((id, now, epoch));
                        }
                    }
                }
                let State::Primary(p) = &mut self.state else {
                    unreachable!()
                };
                match p.replica {
                    Replica::Syncing { last_heard, .. } if replica_dead(last_heard) => {
                        p.replica = Replica::None;
                    }
                    Replica::Registering {
                        last_heard,
                        coord: None,
                        ..
                    } if replica_dead(last_heard) => {
                        p.replica = Replica::None;
                    }
                    Replica::Registering {
                        last_heard,
                        ref mut failed,
                        ..
                    } if replica_dead(last_heard) => {
                        *failed = true;
                    }
                    Replica::InSync { last_heard, .. } if replica_dead(last_heard) => {
                        self.drop_replica();
                    }
                    _ => {}
                }
                self.release();
            }
        }
    }

    fn drop_replica(&mut self) {
        let epoch = self.epoch;
        let id = self.coord(CoordRequest::SetInSync {
            epoch,
            in_sync: None,
        });
        if let State::Primary(p) = &mut self.state {
            p.replica = Replica::Dropping { coord: Some(id) };
        }
    }

    // ------------------------------------------------------------ coordinator

    fn on_coord(&mut self, id: u64, reply: Result<CoordReply, String>) {
        let now = self.now;
        match (&mut self.state, reply) {
            (State::Primary(p), reply) if p.keepalive.is_some_and(|(k, ..)| k == id) => {
                let (_, sent, asked_epoch) = p.keepalive.take().unwrap();
                match reply {
                    Ok(CoordReply::KeepAlive(true)) => {
                        // Counted from when we asked, less the share by
                        // which our clock may run slow against the
                        // coordinator's: we stop before it can think the
                        // lease lapsed.
                        let ttl = self.cfg.lease_ttl;
                        let margin = ttl * self.cfg.clock_drift_permille / 1000;
                        p.lease_until = p.lease_until.max(sent + ttl - margin);
                        self.release();
                    }
                    Ok(CoordReply::KeepAlive(false)) if asked_epoch < self.epoch => {
                        // A renewal that named the epoch before our own
                        // bump (registering or dropping the secondary): the
                        // coordinator refused it for the epoch, not because
                        // someone else leads. Ask again at the current one
                        // (issue 16: stepping down here threw the in-sync
                        // secondary away and served stale reads).
                        let epoch = self.epoch;
                        let id = self.coord(CoordRequest::KeepAlive { epoch });
                        if let State::Primary(p) = &mut self.state {
                            p.keepalive = Some((id, now, epoch));
                        }
                    }
                    Ok(CoordReply::KeepAlive(false)) => self.step_down(),
                    _ => {} // retried on the next beat
                }
            }
            (State::Primary(p), reply) => {
                let (cas_for, was_registering) = match &p.replica {
                    Replica::Registering { coord: Some(c), .. } => (*c, true),
                    Replica::Dropping { coord: Some(c) } => (*c, false),
                    _ => return,
                };
                if cas_for != id {
                    return;
                }
                match reply {
                    Ok(CoordReply::SetInSync(Some(epoch))) => {
                        assert!(epoch > self.epoch, "the coordinator's epochs only grow");
                        self.epoch = epoch;
                        let State::Primary(p) = &mut self.state else {
                            unreachable!()
                        };
                        if was_registering {
                            let Replica::Registering {
                                m,
                                last_heard,
                                failed,
                                ..
                            } = p.replica
                            else {
                                unreachable!()
                            };
                            p.replica = Replica::InSync { m, last_heard };
                            if failed {
                                self.drop_replica();
                            }
                        } else {
                            p.replica = Replica::None;
                        }
                        self.release();
                    }
                    Ok(CoordReply::SetInSync(None)) => self.step_down(),
                    _ => {
                        // Could not reach the coordinator: ask again.
                        let epoch = self.epoch;
                        let in_sync = match &p.replica {
                            Replica::Registering { m, .. } => Some(*m),
                            _ => None,
                        };
                        let nid = self.coord(CoordRequest::SetInSync { epoch, in_sync });
                        if let State::Primary(p) = &mut self.state {
                            match &mut p.replica {
                                Replica::Registering { coord, .. }
                                | Replica::Dropping { coord } => *coord = Some(nid),
                                _ => unreachable!(),
                            }
                        }
                    }
                }
            }
            (State::Secondary { campaign, .. }, reply) if *campaign == Some(id) => {
                *campaign = None;
                match reply {
                    Ok(CoordReply::Campaign(Campaign::Won { epoch, in_sync })) => {
                        self.become_primary(epoch, in_sync)
                    }
                    Ok(CoordReply::Campaign(Campaign::Lost { record }))
                        if record.is_none_or(|r| r.epoch >= self.epoch) =>
                    {
                        self.after_lost(record)
                    }
                    _ => {
                        // (A refusal that shows a record older than our
                        // epoch is a late answer: it says nothing of now.)
                        // Unknown outcome (it may have won): ask again; a
                        // campaign by the record's primary wins again, so
                        // the answer settles it.
                        let id = self.coord(CoordRequest::Campaign);
                        if let State::Secondary { campaign, .. } = &mut self.state {
                            *campaign = Some(id);
                        }
                    }
                }
            }
            (State::Joining { asked, .. }, reply) if *asked == Some(id) => {
                *asked = None;
                match reply {
                    Ok(CoordReply::Get(None)) => {
                        let id = self.coord(CoordRequest::Campaign);
                        if let State::Joining { asked, .. } = &mut self.state {
                            *asked = Some(id);
                        }
                    }
                    Ok(CoordReply::Get(Some(r))) => {
                        self.epoch = self.epoch.max(r.epoch);
                        if r.lease_held && r.primary.node != self.cfg.member.node {
                            self.send_join(r.primary.node);
                        } else if r.primary == self.cfg.member && !r.lease_held {
                            // We won the bootstrap campaign but its answer
                            // was lost (a joining incarnation is named
                            // nowhere else: `become_joining` takes a new
                            // one). Nothing was written yet: campaign again.
                            let id = self.coord(CoordRequest::Campaign);
                            if let State::Joining { asked, .. } = &mut self.state {
                                *asked = Some(id);
                            }
                        }
                    }
                    Ok(CoordReply::Campaign(Campaign::Won { epoch, in_sync })) => {
                        // Bootstrap: an empty group starts with this node.
                        self.become_primary(epoch, in_sync);
                    }
                    _ => {}
                }
            }
            (State::Leaving { to, new, asked, .. }, reply) if *asked == Some(id) => {
                *asked = None;
                let (to, new) = (*to, *new);
                match reply {
                    Ok(CoordReply::Retire(true)) => self.rejoin_now(to, new),
                    Ok(CoordReply::Retire(false)) => {
                        // The record names us: keep the data (we may hold
                        // the only full copy) and ask again later, as a
                        // fenced node, which campaigns when it may.
                        self.state = State::Fenced {
                            asked: None,
                            last_try: now,
                        };
                    }
                    _ => {} // retried on a tick
                }
            }
            (State::Fenced { asked, .. }, reply) if *asked == Some(id) => {
                *asked = None;
                match reply {
                    // A late answer (older than what we know): ask again.
                    Ok(CoordReply::Get(Some(r))) if r.epoch < self.epoch => {}
                    Ok(CoordReply::Get(r)) => {
                        let r = r.filter(|r| r.lease_held && r.primary != self.cfg.member);
                        match r {
                            Some(r) => {
                                self.epoch = self.epoch.max(r.epoch);
                                self.become_joining(Some(r.primary.node));
                            }
                            None => {
                                let id = self.coord(CoordRequest::Campaign);
                                self.state = State::Fenced {
                                    asked: Some(id),
                                    last_try: now,
                                };
                            }
                        }
                    }
                    Ok(CoordReply::Campaign(Campaign::Won { epoch, in_sync })) => {
                        self.become_primary(epoch, in_sync)
                    }
                    Ok(CoordReply::Campaign(Campaign::Lost { record })) => self.after_lost(record),
                    _ => {}
                }
            }
            _ => {}
        }
    }

    /// After a lost campaign: stay secondary if still the in-sync one of a
    /// live primary, otherwise rejoin that primary; wait if nobody leads.
    fn after_lost(&mut self, record: Option<GroupRecord>) {
        let Some(r) = record else { return };
        if !r.lease_held || r.epoch < self.epoch {
            return; // retry later (nobody leads, or a late answer)
        }
        let me = self.cfg.member;
        let heard = |last: Micros| self.now.saturating_sub(last) <= self.cfg.heartbeat_timeout;
        match self.state {
            // Still the in-sync secondary of a live primary: keep the epoch
            // of its stream (see `on_message`). Also when that primary still
            // talks to us: it is the authority on whether we are its
            // secondary (the answer may be older than its latest
            // registration of us; if it dropped us it stops talking and we
            // come back here once silent).
            State::Secondary {
                primary,
                last_heard,
                ..
            } if primary == r.primary.node && (r.in_sync == Some(me) || heard(last_heard)) => {}
            _ => {
                self.epoch = self.epoch.max(r.epoch);
                self.become_joining(Some(r.primary.node));
            }
        }
    }
}

fn touch(r: &mut Replica, n: NodeId, now: Micros) {
    match r {
        Replica::Syncing { m, last_heard, .. }
        | Replica::Registering { m, last_heard, .. }
        | Replica::InSync { m, last_heard }
            if m.node == n =>
        {
            *last_heard = now
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    //! Scripted scenarios: two nodes and a coordinator driven by hand, so a
    //! test decides which message or coordinator answer comes when.
    use super::*;
    use crate::arena::HeapMemory;
    use crate::coord::LeaseTable;

    const ARENA: ArenaRef = ArenaRef {
        base: 0x7e00_0000_0000,
        len: 64 << 10,
        stag: 0x0012_3401,
    };
    const HB: Micros = 5_000;

    struct Call {
        node: NodeId,
        id: u64,
        member: Member,
        req: CoordRequest,
    }

    /// Two nodes, a lease table, and the messages and calls in flight.
    struct H {
        t: Micros,
        nodes: BTreeMap<NodeId, Node<HeapMemory>>,
        coord: LeaseTable,
        msgs: VecDeque<(NodeId, NodeId, Envelope)>,
        calls: Vec<Call>,
        sync_starts: usize,
        /// Answers to clients: (request id, result).
        answers: Vec<(u64, Result<Reply, StoreError>)>,
        req_id: u64,
    }

    impl H {
        fn new() -> H {
            let mut nodes = BTreeMap::new();
            for n in [1, 2] {
                let cfg = NodeConfig {
                    member: Member {
                        node: n,
                        incarnation: 100 * n as u64,
                    },
                    arena: ARENA,
                    heartbeat_interval: HB,
                    heartbeat_timeout: 5 * HB,
                    secondary_timeout: 5 * HB,
                    lease_ttl: 4 * HB,
                    sync_chunk: 16 << 10,
                    sync_window: 4,
                    min_in_sync: 0,
                    clock_drift_permille: 50,
                    index_buckets: 0,
                    resp_port: 0,
                };
                nodes.insert(n, Node::new(cfg, HeapMemory::new(ARENA.len)));
            }
            H {
                t: 1,
                nodes,
                coord: LeaseTable::new(),
                msgs: VecDeque::new(),
                calls: Vec::new(),
                sync_starts: 0,
                answers: Vec::new(),
                req_id: 0,
            }
        }

        fn feed(&mut self, n: NodeId, input: Input) {
            let node = self.nodes.get_mut(&n).unwrap();
            let member = node.member();
            for o in node.handle(self.t, input) {
                match o {
                    Output::Send {
                        to: Addr::Node(to),
                        env,
                    } => {
                        if matches!(env.body, Body::SyncStart { .. }) {
                            self.sync_starts += 1;
                        }
                        self.msgs.push_back((n, to, env));
                    }
                    Output::Send {
                        to: Addr::Client(_),
                        env:
                            Envelope {
                                body: Body::Response { req_id, result },
                                ..
                            },
                    } => self.answers.push((req_id, result)),
                    Output::Send { .. } => {}
                    Output::Coord { id, req } => self.calls.push(Call {
                        node: n,
                        id,
                        member,
                        req,
                    }),
                }
            }
        }

        /// Answers call `i` now.
        fn answer(&mut self, i: usize) {
            let c = self.calls.remove(i);
            let t = &mut self.coord;
            let now = self.t;
            let reply = match c.req {
                CoordRequest::Campaign => {
                    CoordReply::Campaign(t.campaign("g", c.member, 4 * HB, now))
                }
                CoordRequest::KeepAlive { epoch } => {
                    CoordReply::KeepAlive(t.keep_alive("g", c.member, epoch, now))
                }
                CoordRequest::SetInSync { epoch, in_sync } => {
                    CoordReply::SetInSync(t.set_in_sync("g", c.member, epoch, in_sync, now))
                }
                CoordRequest::Get => CoordReply::Get(t.get("g", now)),
                CoordRequest::Retire { new } => CoordReply::Retire(t.retire("g", c.member, new)),
            };
            self.feed(
                c.node,
                Input::Coord {
                    id: c.id,
                    reply: Ok(reply),
                },
            );
        }

        /// Runs for `dt`: ticks every millisecond, every message delivered
        /// at once, every call answered at once unless `hold` says so.
        fn run(&mut self, dt: Micros, hold: &dyn Fn(&Call, &H) -> bool) {
            let end = self.t + dt;
            while self.t < end {
                self.t += 1_000;
                for n in [1, 2] {
                    self.feed(n, Input::Tick);
                }
                loop {
                    if let Some((from, to, env)) = self.msgs.pop_front() {
                        self.feed(
                            to,
                            Input::Message {
                                from: Addr::Node(from),
                                env,
                            },
                        );
                        continue;
                    }
                    match (0..self.calls.len()).find(|&i| !hold(&self.calls[i], self)) {
                        Some(i) => self.answer(i),
                        None => break,
                    }
                }
            }
        }

        fn node(&self, n: NodeId) -> &Node<HeapMemory> {
            &self.nodes[&n]
        }

        /// Runs until node 1 is primary with node 2 in sync.
        fn redundant(&mut self) {
            self.run(200_000, &|_, _| false);
            assert!(self.node(1).is_redundant(), "{:?}", self.node(1).status());
        }

        /// A client's request to node 1, answered (replicated first if a
        /// write) within a few heartbeats.
        fn request(&mut self, op: Op) -> Result<Reply, StoreError> {
            self.req_id += 1;
            let req_id = self.req_id;
            let env = Envelope {
                epoch: self.node(1).epoch(),
                body: Body::Request {
                    client: 77,
                    req_id,
                    op,
                },
            };
            self.feed(
                1,
                Input::Message {
                    from: Addr::Client(77),
                    env,
                },
            );
            self.run(4 * HB, &never);
            let i = self.answers.iter().position(|a| a.0 == req_id);
            self.answers.remove(i.expect("answered")).1
        }
    }

    fn never(_: &Call, _: &H) -> bool {
        false
    }

    /// Issue 16, finding 1's trigger: a renewal sent at epoch E comes back
    /// false because the primary itself moved the epoch to E+1 (registering
    /// its secondary) meanwhile. The primary must not step down (it did,
    /// then won E+2 with nobody in sync and acknowledged writes alone while
    /// the secondary still served reads).
    #[test]
    fn a_renewal_refused_for_our_own_epoch_bump_is_not_a_step_down() {
        let mut h = H::new();
        let is_reg = |c: &Call| {
            matches!(
                c.req,
                CoordRequest::SetInSync {
                    in_sync: Some(_),
                    ..
                }
            )
        };
        let is_ka = |c: &Call| c.node == 1 && matches!(c.req, CoordRequest::KeepAlive { .. });
        // Until node 1 asks to register node 2 (held)...
        h.run(200_000, &|c, _| is_reg(c));
        let reg = h.calls.iter().position(is_reg).expect("registration asked");
        assert!(h.node(1).role() == Role::Primary && !h.node(1).is_redundant());
        // ... and a renewal goes out while it is pending (held too).
        h.run(2 * HB, &|c, _| is_reg(c) || is_ka(c));
        assert!(h.calls.iter().any(is_ka), "a renewal in flight");
        let e = h.node(1).epoch();
        // The registration is answered first: the epoch moves to e + 1.
        let reg = h.calls.iter().position(is_reg).unwrap_or(reg);
        h.answer(reg);
        assert_eq!(h.node(1).epoch(), e + 1);
        assert!(h.node(1).is_redundant());
        // Then the renewal named e: refused for the epoch.
        let ka = h.calls.iter().position(is_ka).unwrap();
        let CoordRequest::KeepAlive { epoch } = h.calls[ka].req else {
            unreachable!()
        };
        assert_eq!(epoch, e);
        h.answer(ka);
        assert_eq!(h.node(1).role(), Role::Primary, "stepped down");
        assert!(h.node(1).is_redundant());
        h.run(100_000, &never);
        assert!(h.node(1).is_redundant());
        assert_eq!(h.node(1).epoch(), e + 1, "no new election");
        assert_eq!(h.sync_starts, 1, "the secondary copied once");
    }

    /// Issue 16, finding 2: a lease hiccup (renewals late past the TTL)
    /// makes the primary step down and win again; the in-sync secondary
    /// stays in sync (no second copy of the arena) and the group is
    /// redundant again at a higher epoch.
    #[test]
    fn a_lease_hiccup_keeps_the_secondary_in_sync() {
        let mut h = H::new();
        h.redundant();
        let (e0, s0) = (h.node(1).epoch(), h.node(2).member());
        assert_eq!(h.sync_starts, 1);
        // No renewal of node 1 answered for 6 heartbeats (> the 4-beat TTL,
        // < node 2's 5-beat timeout: node 2 keeps hearing node 1).
        h.run(6 * HB, &|c, _| {
            c.node == 1 && matches!(c.req, CoordRequest::KeepAlive { .. })
        });
        h.run(100_000, &never);
        assert_eq!(h.node(1).role(), Role::Primary);
        assert!(h.node(1).epoch() > e0, "re-elected");
        assert!(h.node(1).is_redundant(), "{:?}", h.node(1).status());
        assert_eq!(h.node(2).member(), s0, "same incarnation, same copy");
        assert_eq!(h.sync_starts, 1, "no second copy of the arena");
    }

    /// Issue 16, finding 4: a secondary that finished copying reports
    /// "syncing" until its primary says the coordinator records it in sync.
    #[test]
    fn status_says_secondary_only_once_registered() {
        let mut h = H::new();
        // Hold the registration.
        let hold = |c: &Call, _: &H| {
            matches!(
                c.req,
                CoordRequest::SetInSync {
                    in_sync: Some(_),
                    ..
                }
            )
        };
        h.run(200_000, &hold);
        assert!(h.node(2).is_synced_secondary(), "copy done");
        assert_eq!(h.node(2).status().role, proto::ROLE_SYNCING);
        h.run(50_000, &never);
        assert!(h.node(1).is_redundant());
        assert_eq!(h.node(2).status().role, proto::ROLE_SECONDARY);
    }

    /// A scan pattern longer than `glob::MAX_PATTERN_LEN` is refused (the
    /// matcher's cost grows with it, and the scan runs on the node loop);
    /// one at the limit is taken.
    #[test]
    fn a_scan_pattern_too_long_is_refused() {
        let mut h = H::new();
        h.redundant();
        let put = Op::Put {
            key: b"k1".to_vec(),
            data: b"v".to_vec(),
            cond: Cond::Always,
        };
        assert!(matches!(h.request(put), Ok(Reply::Stored { .. })));
        let scan = |pattern: Vec<u8>| Op::Scan {
            cursor: 0,
            count: 100,
            pattern,
        };
        let max = crate::glob::MAX_PATTERN_LEN;
        assert_eq!(
            h.request(scan(vec![b'*'; max + 1])),
            Err(StoreError::BadPattern {
                len: max as u64 + 1,
                max: max as u64
            })
        );
        assert_eq!(
            h.request(scan(vec![b'*'; max])),
            Ok(Reply::Keys {
                keys: vec![b"k1".to_vec()],
                next: 0
            })
        );
    }

    /// A replicated index edit that cannot be applied (here an entry
    /// without a tag, which the bucket encoder refuses) is a divergence:
    /// the secondary starts over with a copy of the arena. It used to pass
    /// `apply_meta` and panic in `apply_bytes`.
    #[test]
    fn a_bad_replicated_index_edit_is_a_divergence() {
        let mut h = H::new();
        h.redundant();
        let put = Op::Put {
            key: b"k1".to_vec(),
            data: b"v".to_vec(),
            cond: Cond::Always,
        };
        assert!(matches!(h.request(put), Ok(Reply::Stored { .. })));
        let layout = h.node(2).index_layout().unwrap();
        let seq = h.node(2).applied_seq() + 1;
        let bad = |tag, slot, offset| RepOp {
            client: 78,
            req_id: 1,
            effects: vec![Effect::Index {
                key: b"k2".to_vec(),
                generation: seq,
                edit: index::Edit::Slot {
                    bucket: 0,
                    slot,
                    entry: Some(index::Slot {
                        tag,
                        offset,
                        units: 1,
                        generation: seq as u32,
                    }),
                },
            }],
            reply: Reply::Removed { existed: false },
        };
        let objects = layout.reserved_len();
        for (i, op) in [
            bad(0, 30, objects),
            bad(3, 30, objects + 1),
            bad(3, 30, ARENA.len),
            bad(3, 30, 0),
        ]
        .into_iter()
        .enumerate()
        {
            let env = Envelope {
                epoch: h.node(1).epoch(),
                body: Body::Replicate { seq, op },
            };
            h.feed(
                2,
                Input::Message {
                    from: Addr::Node(1),
                    env,
                },
            );
            assert_eq!(h.node(2).divergences(), i as u64 + 1);
            assert!(h.node(2).last_divergence().unwrap().contains("index edit"));
            h.redundant();
        }
    }

    /// `TooLarge` names the largest value that can be stored under the
    /// key: the arena less the index region, the header and the key (it
    /// named the arena less the header, and a value between the two was
    /// answered `Full`).
    #[test]
    fn too_large_names_the_largest_value_that_fits() {
        let mut h = H::new();
        h.redundant();
        let reserved = h.node(1).index_layout().unwrap().reserved_len();
        let most = ARENA.len - reserved - object::HEADER_LEN as u64;
        let put = |len: u64| Op::Put {
            key: b"k1".to_vec(),
            data: vec![7; len as usize],
            cond: Cond::Always,
        };
        assert_eq!(
            h.request(put(most - 1)),
            Err(StoreError::TooLarge {
                len: most - 1,
                max: most - 2
            })
        );
        let insert = |len: u64| Op::Insert {
            data: vec![7; len as usize],
        };
        assert_eq!(
            h.request(insert(most + 1)),
            Err(StoreError::TooLarge {
                len: most + 1,
                max: most
            })
        );
        // The largest is stored: the arena holds nothing else.
        assert!(matches!(h.request(put(most - 2)), Ok(Reply::Stored { .. })));
    }

    /// The pointer API aimed at the key index's region (an allocation, but
    /// no object) is refused with an error that says so, not `Torn` or
    /// `Keyed`.
    #[test]
    fn a_pointer_to_the_index_region_is_refused() {
        let mut h = H::new();
        h.redundant();
        let reserved = h.node(1).index_layout().unwrap().reserved_len();
        let ptr = RemotePtr {
            addr: ARENA.base,
            stag: ARENA.stag,
            len: reserved as u32,
            gen: 0,
        };
        for op in [
            Op::Read { ptr },
            Op::Update {
                ptr,
                data: b"x".to_vec(),
            },
            Op::Delete { ptr },
        ] {
            let r = h.request(op.clone());
            assert!(
                matches!(&r, Err(StoreError::Other(m)) if m.contains("key index")),
                "{op:?}: {r:?}"
            );
        }
    }

    /// The node's `Op::Get` is the one-sided look-up on its own memory:
    /// found (also after an update moved the object), absent, removed.
    #[test]
    fn the_server_side_get_is_the_look_up() {
        let mut h = H::new();
        h.redundant();
        let put = |data: &[u8]| Op::Put {
            key: b"k1".to_vec(),
            data: data.to_vec(),
            cond: Cond::Always,
        };
        let get = |key: &[u8]| Op::Get { key: key.to_vec() };
        let Ok(Reply::Stored { ptr, .. }) = h.request(put(b"one")) else {
            panic!("not stored")
        };
        let Ok(Reply::Value { ptr: p, data, .. }) = h.request(get(b"k1")) else {
            panic!("not found")
        };
        assert_eq!((p, data), (ptr, b"one".to_vec()));
        // Moved to a larger allocation.
        let Ok(Reply::Stored { ptr: moved, .. }) = h.request(put(&[5; 300])) else {
            panic!("not stored")
        };
        assert_ne!(moved, ptr);
        let Ok(Reply::Value { ptr: p, data, .. }) = h.request(get(b"k1")) else {
            panic!("not found")
        };
        assert_eq!((p, data), (moved, vec![5; 300]));
        assert_eq!(h.request(get(b"k2")), Ok(Reply::NoKey));
        let remove = Op::Remove {
            key: b"k1".to_vec(),
        };
        assert_eq!(h.request(remove), Ok(Reply::Removed { existed: true }));
        assert_eq!(h.request(get(b"k1")), Ok(Reply::NoKey));
        assert!(matches!(
            h.request(get(b"")),
            Err(StoreError::BadKey { len: 0, .. })
        ));
    }
}
