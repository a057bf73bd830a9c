//! Deterministic simulation of a replica group.
//!
//! Two [`Node`]s (over [`HeapMemory`], since both "map" the arena at the same
//! address in one process), a simulated coordinator ([`LeaseTable`]) and a
//! few clients exchange messages through a simulated network driven by one
//! seeded random number generator and a virtual clock, so a failing seed
//! replays exactly.
//!
//! The network does what the real transport may do and nothing else: each
//! connection (ordered pair of parties) is reliable and in order, with random
//! delays (occasionally long stalls, which provoke false failure suspicion);
//! different connections are not ordered with respect to each other; a crash
//! drops everything in flight to or from the crashed node. Every message
//! goes through the binary codec.
//!
//! Faults: nodes crash at random points (never both copies of the data at
//! once: a crash is only injected while the other node is the coordinator's
//! primary or in-sync secondary) and restart empty, with garbage in their
//! arena, under a new incarnation; they rejoin and re-sync. Clients retry a
//! request on the other node when an answer is late.
//!
//! More faults, each behind a [`SimConfig`] switch: a coordinator that
//! answers late (up to three lease TTLs), out of order, and loses requests
//! and replies (the node sees the error its runtime would report); node
//! clocks that run fast or slow (within a bound); and nodes paused (as by
//! SIGSTOP) for longer than their lease, whose messages, ticks and
//! one-sided reads wait until they resume.
//!
//! Clients read with one-sided RDMA Reads: the read reaches the target
//! node's memory after a network delay and is served there only while the
//! node's [`Node::reads_until`] deadline (the arena STag's deadline in the
//! real runtime, checked by the engine without the node's help) has not
//! passed on the node's clock; otherwise the client falls back to a read
//! through the node, as the real client does. Clients also read each
//! other's objects.
//!
//! Checks, once the crash phase is over and the group is quiescent: every
//! acknowledged write reads back exactly, no deleted object is resurrected,
//! no object leaked (retries applied once), both arenas, allocators and
//! retry tables are identical, no secondary ever failed to apply a
//! forwarded write, and the history of every object (inserts, updates,
//! deletes, reads by any client, with their invocation and completion
//! times; operations still in flight count as possibly applied) is
//! linearizable ([`crate::lincheck`]).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::ops::AddAssign;

use crate::arena::HeapMemory;
use crate::coord::LeaseTable;
use crate::lincheck;
use crate::lookup::Lookup;
use crate::node::{CoordReply, CoordRequest, Micros, Node};
use crate::proto::{Member, NodeId, Op};
use crate::ptr::{ArenaRef, RemotePtr};

mod check;
mod clients;
mod expiry;
#[cfg(test)]
mod fault_tests;
mod persist_sim;
#[cfg(test)]
mod persist_tests;
#[cfg(test)]
mod tests;
mod world;

pub use world::run;

/// SplitMix64: tiny, seedable, portable.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..hi` (`hi > lo`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(hi > lo);
        lo + self.next_u64() % (hi - lo)
    }
    /// True with probability `p` percent.
    pub fn percent(&mut self, p: u64) -> bool {
        self.range(0, 100) < p
    }
}

/// Simulation parameters.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Concurrent clients.
    pub clients: usize,
    /// Operations per client.
    pub ops_per_client: usize,
    /// Inject crashes and long network stalls.
    pub faults: bool,
    /// Arena size.
    pub arena_len: u64,
    /// Largest value.
    pub max_value: usize,
    /// Live objects per client at most (keeps the arena from filling).
    pub max_objects: usize,
    /// Give up (failure) after this much virtual time.
    pub time_limit: Micros,
    /// Per mille of primary -> secondary `Replicate` messages dropped, as a
    /// link that breaks and is re-dialed drops what was in flight on it.
    pub drop_replicate_permille: u64,
    /// Per mille of recovery chunks (`SyncChunk`) lost, as when the
    /// primary refuses the joiner's RDMA Read of its arena (its STag is
    /// disabled until a new primary's first lease renewal) and the link
    /// breaks.
    pub drop_sync_chunk_permille: u64,
    /// The coordinator answers late (up to three lease TTLs), out of order,
    /// and loses 2% of requests and 2% of replies.
    pub coord_faults: bool,
    /// Each node's clock runs at a rate within this many per mille of real
    /// time (the coordinator's clock is real time).
    pub clock_drift_permille: u64,
    /// Nodes are paused (as by SIGSTOP) for one to four lease TTLs.
    pub pauses: bool,
    /// Percent of operations that read another client's object.
    pub shared_reads_percent: u64,
    /// Reads are one-sided where the node's deadline allows.
    pub one_sided_reads: bool,
    /// The nodes' `min_in_sync` policy.
    pub min_in_sync: u8,
    /// Percent of operations on named keys (shared by all clients).
    pub keyed_percent: u64,
    /// Keys the keyed operations choose from.
    pub keys: u64,
    /// Index buckets of the group (1: every key's home is bucket 0, which
    /// spills into bucket 1; each keyed write rewrites one of the two
    /// buckets every keyed reader reads).
    pub index_buckets: u64,
    /// Crash only the in-sync secondary (the coordinator's primary stays
    /// up; its incarnation, not one before a restart), so that every
    /// restart is one whose copy had finished: a secondary crashed again
    /// before its copy began would make two restarts cost one copy (seed
    /// 21 with batches did: the record still named the incarnation before
    /// the restart as in sync).
    pub crash_secondary_only: bool,
    /// Pause only the secondary (the coordinator's in-sync member).
    pub pause_secondary_only: bool,
    /// Once, early on, pause the in-sync secondary this long (0: never):
    /// longer than the secondary timeout, it is dropped and rejoins in
    /// process, retiring its incarnation.
    pub long_secondary_pause: Micros,
    /// With `faults`: some messages stall for up to 40 ms (longer than a
    /// lease), provoking false suspicion and lapsed leases.
    pub stalls: bool,
    /// Some keyed writes are two keys' puts as one batch (`MSET`; issue
    /// 32). Off by default, so the other runs' schedules stay as they were.
    pub batches: bool,
    /// Percent of operations on keys with deadlines (issue 32's expiry,
    /// `expiry.rs`); 0 by default, which also leaves the schedules as
    /// they were.
    pub ttl_percent: u64,
    /// With `ttl_percent`: each node's wall clock is off true time by up
    /// to this many milliseconds (NTP's bound; keep the drift small too).
    pub wall_skew_ms: u64,
    /// The nodes' persistence policy (issue 33): with one other than
    /// `off`, each node logs to a simulated partition (`persist_sim.rs`)
    /// that loses its unflushed writes on a power loss.
    pub persist: crate::persist::Policy,
    /// With `persist`: whole-group crashes (both nodes at once, both
    /// partitions losing power), each followed by recovery from the
    /// partitions.
    pub group_crashes: u32,
    /// With `persist`: a snapshot's steps come 20-60 ms apart instead of
    /// 0.1-1 ms, so that writes fill the log's ring while one runs (the
    /// log is pressed: writes wait in memory for room).
    pub slow_snapshots: bool,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            clients: 3,
            ops_per_client: 150,
            faults: true,
            arena_len: 256 << 10,
            max_value: 300,
            max_objects: 40,
            time_limit: 60_000_000,
            drop_replicate_permille: 0,
            drop_sync_chunk_permille: 0,
            coord_faults: false,
            clock_drift_permille: 0,
            pauses: false,
            shared_reads_percent: 20,
            one_sided_reads: true,
            min_in_sync: 0,
            keyed_percent: 40,
            keys: 40,
            index_buckets: 1,
            crash_secondary_only: false,
            pause_secondary_only: false,
            long_secondary_pause: 0,
            stalls: true,
            batches: false,
            ttl_percent: 0,
            wall_skew_ms: 30,
            persist: crate::persist::Policy::Off,
            group_crashes: 0,
            slow_snapshots: false,
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct SimReport {
    /// Acknowledged client operations.
    pub acked_ops: u64,
    /// Node crashes injected.
    pub crashes: u64,
    /// Distinct primaries elected (epochs won by campaign).
    pub elections: u64,
    /// Client retries (timeouts and redirects).
    pub retries: u64,
    /// Messages delivered.
    pub messages: u64,
    /// Virtual time at the end.
    pub end_time: Micros,
    /// `Replicate` messages the network dropped.
    pub dropped_replicates: u64,
    /// Times a secondary noticed a lost `Replicate` and re-synchronised.
    pub repaired_losses: u64,
    /// `SyncChunk` messages the network dropped.
    pub dropped_chunks: u64,
    /// Reads served one-sided (by a node's memory, no node code involved).
    pub one_sided_reads: u64,
    /// One-sided reads refused (deadline passed, node gone) and retried
    /// through a node.
    pub refused_reads: u64,
    /// Coordinator requests or replies lost.
    pub coord_losses: u64,
    /// Node pauses injected.
    pub pauses: u64,
    /// Operations recorded in the checked history.
    pub history_ops: u64,
    /// Writes refused for want of an in-sync secondary (`min_in_sync` 1).
    pub refused_writes: u64,
    /// Keyed gets answered by one-sided look-ups.
    pub keyed_one_sided: u64,
    /// Keyed gets whose look-up gave up (kept racing writes) and asked the
    /// node.
    pub lookup_fallbacks: u64,
    /// Look-up restarts (a slot changed under the reader, a torn read).
    pub lookup_restarts: u64,
    /// Keyed gets that used a cached pointer and found the key there.
    pub cache_hits: u64,
    /// Times a primary stopped being one while it ran (not by a crash).
    pub step_downs: u64,
    /// Copies of the arena a primary started (`SyncStart`s sent).
    pub copies: u64,
    /// Batches acknowledged.
    pub batches: u64,
    /// Puts with a deadline acknowledged.
    pub ttl_puts: u64,
    /// `EXPIRE`s acknowledged that moved a key's deadline.
    pub ttl_retimes: u64,
    /// Reads of keys with deadlines that found a value.
    pub ttl_reads_found: u64,
    /// Reads of keys with deadlines that found none (expired, or not yet
    /// written).
    pub ttl_reads_absent: u64,
    /// Snapshots begun (bases logged; `persist_sim.rs`).
    pub snapshots: u64,
    /// Whole-group crashes injected.
    pub group_crashes: u64,
    /// Nodes recovered from their partitions.
    pub recoveries: u64,
    /// Crashes that came while the node's snapshot was being written.
    pub crashes_in_snapshot: u64,
    /// Crashes that dropped unflushed sectors of a partition (a torn or
    /// lost tail of the log, of a snapshot or of a checkpoint).
    pub torn_power_losses: u64,
    /// Times a node's log was pressed (writes waited for room).
    pub log_pressures: u64,
    /// Operations acknowledged within `everysec`'s bound before a
    /// whole-group crash, whose effect the check counts as unknown
    /// (`check.rs`, `loosen_for_everysec`).
    pub in_lossy_window: u64,
}

/// Totals over runs: every count is added (`end_time` becomes the virtual
/// time of all the runs together).
impl AddAssign<&SimReport> for SimReport {
    fn add_assign(&mut self, r: &SimReport) {
        let SimReport {
            acked_ops,
            crashes,
            elections,
            retries,
            messages,
            end_time,
            dropped_replicates,
            repaired_losses,
            dropped_chunks,
            one_sided_reads,
            refused_reads,
            coord_losses,
            pauses,
            history_ops,
            refused_writes,
            keyed_one_sided,
            lookup_fallbacks,
            lookup_restarts,
            cache_hits,
            step_downs,
            copies,
            batches,
            ttl_puts,
            ttl_retimes,
            ttl_reads_found,
            ttl_reads_absent,
            snapshots,
            group_crashes,
            recoveries,
            crashes_in_snapshot,
            torn_power_losses,
            log_pressures,
            in_lossy_window,
        } = r;
        self.acked_ops += acked_ops;
        self.crashes += crashes;
        self.elections += elections;
        self.retries += retries;
        self.messages += messages;
        self.end_time += end_time;
        self.dropped_replicates += dropped_replicates;
        self.repaired_losses += repaired_losses;
        self.dropped_chunks += dropped_chunks;
        self.one_sided_reads += one_sided_reads;
        self.refused_reads += refused_reads;
        self.coord_losses += coord_losses;
        self.pauses += pauses;
        self.history_ops += history_ops;
        self.refused_writes += refused_writes;
        self.keyed_one_sided += keyed_one_sided;
        self.lookup_fallbacks += lookup_fallbacks;
        self.lookup_restarts += lookup_restarts;
        self.cache_hits += cache_hits;
        self.step_downs += step_downs;
        self.copies += copies;
        self.batches += batches;
        self.ttl_puts += ttl_puts;
        self.ttl_retimes += ttl_retimes;
        self.ttl_reads_found += ttl_reads_found;
        self.ttl_reads_absent += ttl_reads_absent;
        self.snapshots += snapshots;
        self.group_crashes += group_crashes;
        self.recoveries += recoveries;
        self.crashes_in_snapshot += crashes_in_snapshot;
        self.torn_power_losses += torn_power_losses;
        self.log_pressures += log_pressures;
        self.in_lossy_window += in_lossy_window;
    }
}

const HEARTBEAT: Micros = 5_000;
const TIMEOUT: Micros = 25_000;
/// As the runtime's default: 8 heartbeat timeouts.
const SECONDARY_TIMEOUT: Micros = 8 * TIMEOUT;
/// The simulated nodes' wall clock at their time 0 (Unix milliseconds):
/// each node's wall time is this plus its own (drifting) clock.
pub(crate) const CLOCK_ORIGIN_MS: u64 = 1_700_000_000_000;

/// When [`SimConfig::long_secondary_pause`] begins (if any node is in sync).
const LONG_PAUSE_AT: Micros = 100_000;
const LEASE: Micros = 20_000;
const TICK: Micros = 1_000;
const CLIENT_TIMEOUT: Micros = 40_000;
/// How long a node's runtime waits for the coordinator before it reports
/// the call failed.
const COORD_TIMEOUT: Micros = 10_000;
const NODE_IDS: [NodeId; 2] = [1, 2];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Ent {
    Node(NodeId),
    Client(u64),
    Coord,
}

#[derive(Debug)]
enum Payload {
    Msg(Vec<u8>),
    CoordReq {
        id: u64,
        member: Member,
        req: CoordRequest,
    },
    CoordRep {
        id: u64,
        reply: Result<CoordReply, String>,
    },
}

/// What a one-sided read found.
#[derive(Debug)]
enum OneSided {
    /// The bytes read.
    Bytes(Vec<u8>),
    /// The STag refused it (deadline passed) or the connection was gone.
    Refused,
}

#[derive(Debug)]
enum Event {
    Deliver {
        from: Ent,
        to: Ent,
        gens: (u64, u64),
        payload: Payload,
    },
    Tick(NodeId, u64),
    ClientWake(usize, u64),
    Crash,
    Restart(NodeId),
    Pause,
    /// [`SimConfig::long_secondary_pause`].
    LongPause,
    /// A one-sided read reaches node `n`.
    ReadArrive {
        c: usize,
        n: NodeId,
        gens: (u64, u64),
        token: u64,
        /// Arena offset and length.
        at: (u64, u32),
    },
    /// Its outcome reaches the client.
    ReadDone {
        c: usize,
        token: u64,
        outcome: OneSided,
    },
    /// A commit of node n's log (`persist_sim.rs`).
    Commit(NodeId, u64),
    /// A step of node n's snapshot.
    SnapStep(NodeId, u64),
    /// Both nodes crash at once.
    GroupCrash,
}

#[derive(Debug, Clone)]
struct Obj {
    ptr: RemotePtr,
    data: Vec<u8>,
    /// The object's key in the checked history.
    oid: u64,
}

#[derive(Debug, Clone)]
struct Inflight {
    req_id: u64,
    op: Op,
    obj: Option<usize>,
    switch_on_wake: bool,
    /// First invocation.
    call: Micros,
    /// A read: the object's key (its owner may be another client).
    read_oid: Option<u64>,
    /// A read still trying the one-sided way.
    one_sided: bool,
    /// Torn one-sided reads so far.
    torn: u32,
    /// A keyed get: its key's number.
    key_no: Option<u64>,
    /// A keyed get's one-sided look-up in progress, and its next read.
    lookup: Option<(Lookup, (u64, u32))>,
    /// A keyed get that started from a cached pointer.
    cached: bool,
}

/// The history's register of key number `k` (apart from objects' ids).
const KEY_OID: u64 = 1 << 40;

fn key_name(k: u64) -> Vec<u8> {
    match expiry::is_ttl_key(k) {
        true => format!("ttl-{}", k - expiry::TTL_KEY_BASE).into_bytes(),
        false => format!("key-{k}").into_bytes(),
    }
}

/// The number of the key named `name` ([`key_name`]).
fn key_no(name: &[u8]) -> u64 {
    let n = std::str::from_utf8(name).expect("a key of the workload");
    match n.strip_prefix("ttl-") {
        Some(t) => expiry::TTL_KEY_BASE + t.parse::<u64>().expect("a TTL key"),
        None => n
            .strip_prefix("key-")
            .and_then(|n| n.parse().ok())
            .expect("a key of the workload"),
    }
}

/// A value's tag in the history: the writer's id and request number,
/// which every value carries in its first 16 bytes.
fn tag_of(data: &[u8]) -> Option<u64> {
    let c = u64::from_le_bytes(data.get(..8)?.try_into().ok()?);
    let r = u64::from_le_bytes(data.get(8..16)?.try_into().ok()?);
    Some(c << 32 | (r & 0xffff_ffff))
}

#[derive(Debug)]
struct Client {
    id: u64,
    epoch: u64,
    target: NodeId,
    next_req: u64,
    inflight: Option<Inflight>,
    done: usize,
    objects: Vec<Obj>,
    deleted: Vec<(RemotePtr, Vec<u8>)>,
    token: u64,
    /// Key number -> (arena offset, allocation length) of its object, as
    /// last seen.
    cache: BTreeMap<u64, (u64, u32)>,
}

struct Sim {
    cfg: SimConfig,
    rng: Rng,
    now: Micros,
    seq: u64,
    queue: BinaryHeap<Reverse<(Micros, u64, usize)>>,
    events: BTreeMap<usize, Event>,
    next_event: usize,
    channel_last: BTreeMap<(Ent, Ent), Micros>,
    nodes: BTreeMap<NodeId, Node<HeapMemory>>,
    gen: BTreeMap<NodeId, u64>,
    coord: LeaseTable,
    clients: Vec<Client>,
    arena: ArenaRef,
    crash_phase_over: bool,
    divergences: u64,
    violations: Vec<String>,
    report: SimReport,
    trace: bool,
    /// Per node: clock rate offset (parts per million) and origin.
    clocks: BTreeMap<NodeId, (i64, u64)>,
    /// Per node: paused until (real time).
    paused: BTreeMap<NodeId, Micros>,
    /// Per node: its reads deadline after its last input (node clock).
    reads_until: BTreeMap<NodeId, Option<Micros>>,
    /// When [`SimConfig::long_secondary_pause`]'s pause ends, once begun.
    long_pause_end: Option<Micros>,
    /// The checked history.
    history: Vec<lincheck::Op>,
    /// Per object key: the earliest invocation of an update that moves it
    /// or of its delete (from then on a read through an older pointer may
    /// find other bytes or none: pointer semantics, not a register's).
    unstable: BTreeMap<u64, Micros>,
    next_oid: u64,
    /// Which object each written value (tag) was written to.
    tag_key: BTreeMap<u64, u64>,
    /// The history of the keys with deadlines (`expiry.rs`).
    ttl: expiry::TtlLog,
    /// Each node's partition (`persist_sim.rs`).
    disks: BTreeMap<NodeId, persist_sim::Disk>,
    /// When each node last died.
    killed_at: BTreeMap<NodeId, Micros>,
    /// Nodes told their log is pressed (writes wait for room).
    pressed: std::collections::BTreeSet<NodeId>,
    /// Nodes with a commit scheduled.
    commit_due: std::collections::BTreeSet<NodeId>,
    /// Whole-group crashes still to inject.
    group_crashes_left: u32,
    /// A whole-group crash waits for the next commit.
    group_crash_armed: bool,
    /// The node whose commit the crash interrupts.
    crash_commits: Option<NodeId>,
    /// Under `everysec`, per whole-group crash at `T`: `(T - 2 commit
    /// periods, T)`, where an acknowledged write may be lost
    /// (`persist_sim::EVERYSEC_BOUND`; `check.rs` loosens the history).
    lossy: Vec<(Micros, Micros)>,
}

fn other(n: NodeId) -> NodeId {
    if n == 1 {
        2
    } else {
        1
    }
}
