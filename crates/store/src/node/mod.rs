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
//!
//! # Files
//!
//! The replicated image is apart from the protocol that replicates it, as
//! TigerBeetle keeps its state machine apart from its replica:
//!
//! * `image.rs` (and `image_keys.rs`): the [`Node`]'s data, the only code
//!   that changes it, and its planning and reads; nothing of roles,
//!   epochs, peers or leases.
//! * `replicate.rs`: client requests, and the stream of writes from the
//!   primary to its secondary (forward, acknowledge, resend, release).
//! * `copy.rs`: a joining node's copy of the primary's image.
//! * `roles.rs`: roles, epochs and leases: taking over, stepping down,
//!   rejoining, the timers and the coordinator's answers.
//! * here: the types, the [`Node`] with its one entry point
//!   ([`Node::handle`]), the dispatch of messages.
//! * `view.rs`: the accessors, what a node shows of itself.
//!
//! The protocol's files use this one's types and the image; the image
//! uses none of theirs.

use std::collections::BTreeMap;

#[cfg(any(test, feature = "testing"))]
use crate::alloc::Allocator;
use crate::arena::Memory;
use crate::coord::{Campaign, GroupRecord};
use crate::index;
#[cfg(any(test, feature = "testing"))]
use crate::index::Meta;
use crate::persist::entry::Entry;
use crate::persist::Policy;
use crate::proto::{
    self, Body, DedupEntry, Envelope, Member, NodeId, RepOp, Reply, StatusInfo, StoreError,
};
use crate::ptr::ArenaRef;

mod copy;
mod durable;
mod image;
mod replicate;
mod roles;
#[cfg(test)]
mod tests;
mod view;

use durable::Durability;
pub use durable::Recovering;
use image::Image;

/// Time in microseconds (any monotonic origin).
pub type Micros = u64;

/// The client id of a primary's own writes that reclaim expired keys
/// ([`proto::Modify::Reap`]): no client may take it (their answers go
/// nowhere, and a client under it could be answered from the retry table).
pub const REAP_CLIENT: u64 = u64::MAX - 1;

/// Keys reclaimed per tick at most, and their bytes: one batch, well
/// inside a replicated write ([`proto::MAX_BATCH_BYTES`]).
const REAP_KEYS: usize = 64;
const REAP_BYTES: usize = 8 * 1024;

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
    /// Unix time, in milliseconds, at this node's time 0: its wall clock
    /// is this plus its monotonic time, by which the primary decides
    /// which keys have expired (a deadline is Unix milliseconds). Steps of
    /// the system clock after the start do not move it.
    pub clock_origin_ms: u64,
    /// When writes are durable (`durable.rs`); `Off` logs nothing.
    pub persist: Policy,
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
    /// The log of incarnation `incarnation` is durable through write `seq`
    /// (with the snapshot it continues).
    Durable {
        /// Whose log (a report about a life before a rejoin is ignored).
        incarnation: u64,
        /// The last durable write.
        seq: u64,
    },
    /// The log wants a snapshot (so it can be released): start one
    /// ([`Output::Log`] of a [`Entry::Base`]) at the next quiet moment.
    SnapshotDue,
    /// Whether writes wait in memory for room in the log's ring (until
    /// a snapshot releases it): while they do, a primary holds new write
    /// requests and a secondary acknowledges only durable writes, so that
    /// what waits, and the next base that must hold it, stay bounded.
    LogPressure(bool),
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
    /// Append to this node's log (`durable.rs`): a write as it is staged,
    /// or a base, after which a snapshot of the arena is taken.
    Log(Entry),
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

/// A client's answer, sent once its write is committed.
#[derive(Debug, Clone)]
struct Waiter {
    to: Addr,
    req_id: u64,
    result: Result<Reply, StoreError>,
}

/// The primary's view of its secondary.
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
    /// Notes that the secondary `n` was heard from at `now`.
    fn touch(&mut self, n: NodeId, now: Micros) {
        match self {
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
}

/// A primary's state.
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

/// A secondary's copy of its primary's image, while it lasts (`copy.rs`).
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

/// The role, with what each role keeps.
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
    /// The configuration. Its `arena` is the arena as configured: the
    /// current one (its STag rotated) is the image's.
    cfg: NodeConfig,
    /// The replicated data.
    image: Image<M>,
    epoch: u64,
    state: State,
    now: Micros,
    next_coord_id: u64,
    out: Vec<Output>,
    divergences: u64,
    last_divergence: Option<String>,
    lost_replicates: u64,
    /// Copy sessions started (as primary); numbers them uniquely.
    sessions: u64,
    /// The `Resend` asked last: (first missing seq, when).
    resend_asked: Option<(u64, Micros)>,
    /// When this node (as a secondary) last campaigned.
    last_campaign: Micros,
    /// When the last tick came: a tick that comes much later than the
    /// ticker's period shows that this node did not run (starved of CPU,
    /// stopped), so its peers' silence over that gap is no evidence.
    last_tick: Option<Micros>,
    /// A secondary's writes acknowledged but not yet in its arena: through
    /// this seq, and their values' bytes ([`Node::settle`] writes them).
    unsettled: Option<(u64, usize)>,
    /// The log's state as the node sees it (`durable.rs`).
    dur: Durability,
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
            image: Image::new(cfg.arena, mem),
            cfg,
            epoch: 0,
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
            resend_asked: None,
            last_campaign: 0,
            last_tick: None,
            unsettled: None,
            dur: Durability::default(),
        }
    }

    /// Handles one input at time `now`; returns what to do.
    pub fn handle(&mut self, now: Micros, input: Input) -> Vec<Output> {
        assert!(now >= self.now, "time must not go backwards");
        self.now = now;
        if self.dur.recovered == Some(0) {
            self.dur.recovered = Some(now);
        }
        self.image
            .set_wall_ms(self.cfg.clock_origin_ms + now / 1000);
        self.settle();
        match input {
            Input::Message { from, env } => self.on_message(from, env),
            Input::Tick => {
                self.on_tick();
                self.reap();
            }
            Input::Coord { id, reply } => self.on_coord(id, reply),
            Input::Durable { incarnation, seq } => self.on_durable(incarnation, seq),
            Input::SnapshotDue => self.dur.snapshot_due = self.cfg.persist.logs(),
            Input::LogPressure(on) => self.on_log_pressure(on),
        }
        self.barrier();
        self.check_invariants();
        std::mem::take(&mut self.out)
    }

    /// Writes into the arena the bytes of the writes this node, as a
    /// secondary, acknowledged before writing them (`on_replicate`: its
    /// acknowledgement, a promise to hold the write, need not wait for a
    /// copy of a large value into the arena). Every input settles first;
    /// the node's owner settles as soon as the acknowledgement is on its
    /// way ([`Node::unsettled`]), and before anything reads the arena.
    /// Returns whether there was anything to write.
    pub fn settle(&mut self) -> bool {
        let Some((seq, _)) = self.unsettled.take() else {
            return false;
        };
        self.image.expose(seq);
        true
    }

    /// The value bytes acknowledged but not yet written into the arena
    /// ([`Node::settle`]); 0 if none.
    pub fn unsettled(&self) -> usize {
        self.unsettled.map_or(0, |(_, b)| b)
    }

    /// A primary reclaims the keys its clock has expired, without a scan
    /// (the image keeps them by deadline): a batch of their removals
    /// ([`proto::Modify::Reap`], each checked again when planned) as its
    /// own write, at most [`REAP_KEYS`] per tick. Its request id is the
    /// write's sequence number, which grows across failovers, so the
    /// retry table never takes it for an old request.
    fn reap(&mut self) {
        if !self.may_accept_writes() {
            return;
        }
        let State::Primary(p) = &self.state else {
            return;
        };
        let req_id = p.next_seq;
        let keys = self.image.due_keys(REAP_KEYS, REAP_BYTES);
        if keys.is_empty() {
            return;
        }
        let ops = keys
            .into_iter()
            .map(|key| proto::Op::Modify {
                key,
                how: proto::Modify::Reap,
            })
            .collect();
        let op = proto::Op::Batch {
            ops,
            all_or_none: false,
        };
        self.on_request(Addr::Client(REAP_CLIENT), REAP_CLIENT, req_id, op);
    }

    /// Keys with a deadline in this node's image (reclaimed by a primary
    /// once it passes).
    #[cfg(any(test, feature = "testing"))]
    pub fn keys_with_deadlines(&self) -> usize {
        self.image.keys_with_deadlines()
    }

    /// Panics unless the state is consistent (after every input).
    fn check_invariants(&self) {
        if let Some((seq, _)) = self.unsettled {
            assert!(
                matches!(self.state, State::Secondary { copy: None, .. }),
                "only an in-sync secondary acknowledges before writing"
            );
            assert_eq!(self.image.applied_seq(), seq, "unsettled: the last applied");
            assert_eq!(
                self.image.first_unexposed(),
                Some(seq),
                "one unsettled write"
            );
        }
        if let State::Primary(p) = &self.state {
            assert_eq!(
                p.next_seq,
                self.image.applied_seq() + 1,
                "primary applies every seq it assigns"
            );
            if let Some((&first, _)) = p.pending.iter().next() {
                assert!(first <= self.image.applied_seq());
            }
            if let Replica::InSync { .. } = p.replica {
                assert!(p.replicated_through <= self.image.applied_seq());
            }
        }
        self.image.check_invariants();
    }

    // ------------------------------------------------------------ helpers

    fn send(&mut self, to: Addr, body: Body) {
        if to == Addr::Client(REAP_CLIENT) {
            return; // the primary's own reclaiming: nobody to answer
        }
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

    // ------------------------------------------------------------ messages

    fn on_message(&mut self, from: Addr, env: Envelope) {
        if !self.admit(from, &env) {
            return;
        }
        match env.body {
            Body::Request { client, req_id, op } => self.on_request(from, client, req_id, op),
            Body::Heartbeat => self.on_heartbeat(from),
            Body::Replicate { seq, op } => self.on_replicate(from, seq, op),
            Body::ReplicateAck { seq } => self.on_replicate_ack(from, seq),
            Body::ReplicateHead { seq, in_sync } => self.on_replicate_head(from, seq, in_sync),
            Body::Resend { from: first } => self.on_resend(from, first),
            Body::Standing {
                member,
                epoch,
                seq,
                campaigns,
                loading,
            } => self.on_standing(member, (epoch, seq), campaigns, loading),
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
                        let seq = self.acked_through();
                        self.send(from, Body::ReplicateAck { seq });
                    }
                }
            }
            Body::Response { .. } => {}
        }
    }
}
