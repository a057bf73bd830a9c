//! The store's messages and their binary codec.
//!
//! One protocol serves clients talking to nodes and nodes talking to each
//! other (replication, heartbeats, recovery). Every message travels in an
//! [`Envelope`] that carries the **sender's epoch**: a receiver refuses
//! anything from an epoch older than its own (see `node/`).
//!
//! Codec: little-endian, a tag byte per enum, `u32` length prefixes for byte
//! strings and lists. [`decode`] checks every length against the bytes that
//! remain (and against [`MAX_MESSAGE`]) before allocating, rejects unknown
//! tags and trailing bytes, and never panics on garbage. Framing on a stream
//! (a `u32` length before each message) is the transport's business.

use crate::alloc::AllocSnapshot;
use crate::ptr::RemotePtr;

mod decode;
mod encode;
#[cfg(test)]
pub(crate) mod tests;

pub use bytes::Bytes;
pub use decode::{decode, decode_shared, DecodeError};
pub use encode::{
    encode, encode_gather, encode_into, gather_room, room, Piece, GATHER_MAX, GATHER_MIN,
};

/// The longest value a key or a pointer holds: 64 MiB (Redis: 512 MB). A
/// message carrying one travels by rendezvous (`net/link/rendezvous.rs`)
/// and reaches the arena in two copies on the primary (the replicated
/// write's encoding, the arena) and one on the secondary (docs/store.md,
/// "Large values").
pub const MAX_VALUE: usize = 64 << 20;

/// Largest encoded message accepted by [`decode`]: 132 MiB, more than a
/// replicated write of the longest value that answers with the longest
/// old one (`GETSET`), with their keys and headers.
pub const MAX_MESSAGE: usize = 2 * MAX_VALUE + (4 << 20);

const _: () = assert!(MAX_MESSAGE >= 2 * MAX_VALUE + (1 << 20));

/// Identifies a node of a group.
pub type NodeId = u32;

/// A node together with its incarnation (random per process start), so a
/// restarted node, which has lost its memory, is told apart from its former
/// self.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Member {
    /// Node id.
    pub node: NodeId,
    /// Incarnation.
    pub incarnation: u64,
}

/// A message with the sender's epoch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Envelope {
    /// The sender's current epoch.
    pub epoch: u64,
    /// The message.
    pub body: Body,
}

/// Messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// Client -> node: an operation. `(client, req_id)` identifies it across
    /// retries, so a retried write is applied once.
    Request {
        /// Client id (random per client).
        client: u64,
        /// Request number, increasing per client.
        req_id: u64,
        /// The operation.
        op: Op,
    },
    /// Node -> client: the outcome of a request.
    Response {
        /// Request number.
        req_id: u64,
        /// Outcome.
        result: Result<Reply, StoreError>,
    },
    /// Liveness, both directions, between any two parties.
    Heartbeat,
    /// Primary -> secondary: apply this write, in `seq` order.
    Replicate {
        /// Sequence number (dense, increasing).
        seq: u64,
        /// What to apply.
        op: RepOp,
    },
    /// Secondary -> primary: everything up to `seq` is applied.
    ReplicateAck {
        /// Highest applied sequence number.
        seq: u64,
    },
    /// Anyone -> sender of a message from an older epoch: refused.
    Stale,
    /// Joining node -> primary: please make me your secondary.
    Join {
        /// Who joins.
        member: Member,
        /// Its arena size (must match).
        arena_len: u64,
    },
    /// Primary -> joining node: the copy starts. Writes from `start_seq` on
    /// follow as `Replicate`.
    SyncStart {
        /// Identifies this copy session (unique per primary); echoed in
        /// `SyncRequest`, `SyncChunk` and `SyncDone`.
        session: u64,
        /// First write not reflected in `alloc`/`dedup`.
        start_seq: u64,
        /// Allocator state as of `start_seq`.
        alloc: AllocSnapshot,
        /// Retry table as of `start_seq`.
        dedup: Vec<DedupEntry>,
        /// The arena's STag as of `start_seq` (it rotates: a later rotation
        /// arrives among the writes).
        stag: u32,
    },
    /// Joining node -> primary: send these arena bytes (the fallback for an
    /// RDMA Read of the primary's arena).
    SyncRequest {
        /// The copy session (its `start_seq`), echoed in the chunk.
        session: u64,
        /// Arena offset.
        offset: u64,
        /// Length.
        len: u32,
    },
    /// Primary -> joining node: arena bytes.
    SyncChunk {
        /// The session of the request.
        session: u64,
        /// Arena offset.
        offset: u64,
        /// Bytes.
        data: Vec<u8>,
    },
    /// Joining node -> primary: copy done and writes up to `through_seq`
    /// applied; from now on I acknowledge every write.
    SyncDone {
        /// The copy session.
        session: u64,
        /// Highest applied sequence number.
        through_seq: u64,
    },
    /// Primary -> joining node: not now (e.g. another node is the secondary).
    JoinRefused {
        /// Why.
        reason: String,
    },
    /// Primary -> secondary, with each heartbeat: the highest sequence
    /// number forwarded so far. Links are FIFO, so a secondary that has
    /// applied less lost a `Replicate` (a link broke and was re-dialed) and
    /// resynchronises at once instead of waiting for the next write's gap.
    /// `in_sync` tells the secondary whether the coordinator records it as
    /// the in-sync member (for `status`).
    ReplicateHead {
        /// Highest sequence number sent.
        seq: u64,
        /// The secondary is registered in sync.
        in_sync: bool,
    },
    /// Secondary -> primary: writes from `from` on never arrived (a link
    /// broke under them); send them again. The primary still holds every
    /// write its secondary has not acknowledged.
    Resend {
        /// First missing sequence number.
        from: u64,
    },
    /// Node back from its log -> the other members its group's record
    /// names: the `(epoch, seq)` of the newest write its log held,
    /// whether it may campaign, and whether it is still loading its
    /// snapshot (said by `net/herald.rs` before the node runs); the older
    /// leaves the campaign to the newer (`node/durable.rs`).
    #[allow(missing_docs)]
    Standing {
        member: Member,
        epoch: u64,
        seq: u64,
        campaigns: bool,
        loading: bool,
    },
}

/// Client operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Store bytes; answer with a pointer.
    Insert {
        /// The data.
        data: Bytes,
    },
    /// Replace an object's bytes (in place when they fit).
    Update {
        /// The object.
        ptr: RemotePtr,
        /// The data.
        data: Bytes,
    },
    /// Server-side read (the fallback for one-sided reads).
    Read {
        /// The object.
        ptr: RemotePtr,
    },
    /// Free an object.
    Delete {
        /// The object.
        ptr: RemotePtr,
    },
    /// Report the node's state.
    Status,
    /// Store `data` under `key` (see [`Cond`]) with the deadline `ttl`
    /// says; answered [`Reply::Stored`] or, when the condition fails,
    /// [`Reply::NotStored`].
    Put {
        /// The key (1 to [`crate::object::MAX_KEY_LEN`] bytes).
        key: Vec<u8>,
        /// The value.
        data: Bytes,
        /// When to store.
        cond: Cond,
        /// The key's deadline after the put.
        ttl: Ttl,
    },
    /// Server-side read of a key (the fallback of the one-sided look-up):
    /// [`Reply::Value`] or [`Reply::NoKey`].
    Get {
        /// The key.
        key: Vec<u8>,
    },
    /// Delete a key: [`Reply::Removed`].
    Remove {
        /// The key.
        key: Vec<u8>,
    },
    /// List keys, index bucket by bucket: [`Reply::Keys`].
    Scan {
        /// Bucket to start at (0 first, then the reply's `next`).
        cursor: u64,
        /// Stop after the bucket in which this many keys were seen.
        count: u32,
        /// Only keys matching this glob pattern (`*`, `?`, `[...]`, `\`);
        /// empty: all. At most [`crate::glob::MAX_PATTERN_LEN`] bytes, else
        /// [`StoreError::BadPattern`].
        pattern: Vec<u8>,
    },
    /// Rotate the arena's STag to `stag` (same index, another key) on
    /// every node, in order with the writes: [`Reply::Rotated`]. Made by a
    /// node itself when its credentials were narrowed (issue 29); a node
    /// refuses it from the network.
    RotateStag {
        /// The new STag.
        stag: u32,
    },
    /// A read-modify-write of `key`'s value ([`Modify`]), decided by the
    /// primary from the value as of this write (earlier writes included,
    /// committed or not) and replicated as one write: answered
    /// [`Reply::Modified`], or [`Reply::Refused`] when the value does not
    /// suit it (a refusal is ordered like a write, and changes nothing).
    Modify {
        /// The key.
        key: Vec<u8>,
        /// What to do with its value.
        how: Modify,
    },
    /// Keyed writes ([`Op::Put`], [`Op::Remove`], [`Op::Modify`]) planned
    /// in order, each seeing the ones before it, and replicated as **one**
    /// write: every node applies all of them or none, and every later
    /// write (a transaction's reads included) is planned after them all
    /// (`MSET`, `MSETNX`, `EXEC`). The RESP door's look-ups see a batch
    /// whole ([`crate::arena::Exposures`]); a remote one-sided reader
    /// looking keys up one by one may see its keys change between two
    /// look-ups, as with any two writes.
    /// Answered [`Reply::Batch`], a reply per write. With `all_or_none`,
    /// a write whose condition fails ([`Reply::NotStored`]) undoes the
    /// batch: no effects, and each reply as planned up to it. A batch
    /// whose replicated write would not fit one frame is refused
    /// ([`StoreError::BatchTooLarge`]), changing nothing.
    Batch {
        /// The writes, in order (at most [`MAX_BATCH_OPS`]).
        ops: Vec<Op>,
        /// A failed condition undoes them all.
        all_or_none: bool,
    },
}

/// The most writes in one [`Op::Batch`].
pub const MAX_BATCH_OPS: usize = 1024;

/// The largest replicated write of an [`Op::Batch`], encoded: as much as
/// the largest single write (a [`MAX_VALUE`] value answering with an old
/// one), so no write keeps a node loop busier than a large value does.
pub const MAX_BATCH_BYTES: usize = 2 * MAX_VALUE + (1 << 20);

/// The longest value an [`Op::Modify`] makes (`APPEND`, `SETRANGE`):
/// [`MAX_VALUE`]. Its replicated write then carries at most that and the
/// old value it may answer with.
pub const MAX_MODIFY_BYTES: usize = MAX_VALUE;

/// The read-modify-writes of [`Op::Modify`] (Redis's string commands).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Modify {
    /// `INCRBY`: the value, a 64-bit decimal (absent: 0), plus `by`;
    /// answers the new value.
    IncrBy(i64),
    /// `INCRBYFLOAT`: the value and the increment (its text) read and
    /// added as Redis does ([`crate::redis_float`]); answers the new
    /// value's text.
    IncrByFloat(Vec<u8>),
    /// `APPEND`: the value (absent: empty) with the bytes after it;
    /// answers the new length.
    Append(Vec<u8>),
    /// `SETRANGE`: the bytes written at `offset` of the value, which is
    /// zero-padded to reach it; answers the new length. Nothing is
    /// written for empty bytes (a missing key stays missing).
    SetRange {
        /// Where the bytes go.
        offset: u64,
        /// The bytes.
        data: Vec<u8>,
    },
    /// `GETSET`, `SET ... GET`: store the bytes (under `cond`, with the
    /// deadline `ttl` says); answers the old value.
    Swap {
        /// The new value.
        data: Bytes,
        /// When to store.
        cond: Cond,
        /// The key's deadline after the put.
        ttl: Ttl,
    },
    /// `GETDEL`: remove the key; answers the old value.
    Take,
    /// A read in a transaction (`GET` between `MULTI` and `EXEC`): no
    /// effects; answers the value as of this write.
    Peek,
    /// `WATCH`'s check at `EXEC`: the key's version (the sequence number
    /// of its latest write; `None`: absent) is still `version`. No
    /// effects; if it changed, [`Reply::Changed`], which undoes the
    /// [`Op::Batch`] holding it.
    Unchanged {
        /// The version seen by `WATCH`.
        version: Option<u64>,
    },
    /// `EXPIRE`, `PEXPIREAT`, ... and `PERSIST`: the key's deadline
    /// becomes `at` (milliseconds since the Unix epoch; 0: none) if the
    /// key exists and `when` allows; a deadline the primary's clock has
    /// passed removes the key, as Redis does. Answers `len` 1 if it
    /// changed the key, else 0, without effects. `PERSIST` is `at` 0 with
    /// [`ExpireWhen::IfSet`].
    Expire {
        /// The new deadline (0: none).
        at: u64,
        /// When to change it.
        when: ExpireWhen,
    },
    /// The primary's reclaiming of an expired key ([`crate::node`]'s own
    /// writes): removes the key if its deadline has passed by the
    /// primary's clock, else nothing. Answers `len` 1 if it removed it.
    Reap,
    /// `TTL`, `PTTL`, `EXPIRETIME`, `PEXPIRETIME` (in a transaction, or
    /// where the door cannot look the key up itself): no effects; answers
    /// the key's deadline as `len` (0: none), or [`Reply::NoKey`] if the
    /// key is absent or expired.
    Deadline,
}

/// When a [`Modify::Expire`] changes a key's deadline (Redis's `NX`,
/// `XX`, `GT`, `LT`; no deadline counts as an infinite one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExpireWhen {
    /// Always.
    Always,
    /// Only if the key has no deadline (`NX`).
    IfNone,
    /// Only if the key has a deadline (`XX`).
    IfSet,
    /// Only if the new deadline is later (`GT`).
    IfLater,
    /// Only if the new deadline is earlier (`LT`).
    IfEarlier,
    /// Only if the key has a deadline and the new one is earlier (`XX LT`;
    /// `XX GT` is `GT`, which no deadline never passes).
    IfSetAndEarlier,
}

/// A put's deadline for its key (Redis's `SET` options): a plain put
/// clears it, `KEEPTTL` keeps the key's (none for a new key), `EX`, `PX`,
/// `EXAT`, `PXAT` set it. A deadline the primary's clock has passed
/// stores a key no reader sees (Redis 7.0's `SET ... PXAT 1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ttl {
    /// No deadline (a plain `SET`).
    Clear,
    /// The key's deadline as it is (`KEEPTTL`).
    Keep,
    /// Milliseconds since the Unix epoch, 1 to
    /// [`crate::object::MAX_DEADLINE`] (a later one is refused).
    At(u64),
}

/// When a [`Op::Put`] stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cond {
    /// Always (Redis `SET`).
    Always,
    /// Only if the key does not exist (`SET NX`, insert).
    IfAbsent,
    /// Only if the key exists (`SET XX`, update).
    IfPresent,
}

/// Successful outcomes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// Insert: where the object is.
    Inserted(RemotePtr),
    /// Update: where the object is now (the same pointer if in place).
    Updated(RemotePtr),
    /// Read: the object.
    Data {
        /// Version.
        version: u64,
        /// Bytes.
        data: Vec<u8>,
    },
    /// Delete done.
    Deleted,
    /// Status.
    Status(StatusInfo),
    /// Put: stored; where the key's object is now.
    Stored {
        /// The object.
        ptr: RemotePtr,
        /// Its generation.
        generation: u64,
        /// Whether the key was created (it did not exist).
        created: bool,
    },
    /// Put: the condition failed, nothing changed.
    NotStored,
    /// Batch: the reply of each write, in order.
    Batch(Vec<Reply>),
    /// [`Modify::Unchanged`]: the key was written since (a batch holding
    /// it has no effects).
    Changed,
    /// Get: the key's value.
    Value {
        /// The object.
        ptr: RemotePtr,
        /// Its generation.
        generation: u64,
        /// Its version.
        version: u64,
        /// The value.
        data: Vec<u8>,
    },
    /// Get: no such key.
    NoKey,
    /// Remove: done; whether the key existed.
    Removed {
        /// The key existed.
        existed: bool,
    },
    /// Scan: keys, and the cursor to continue at (0: done).
    Keys {
        /// Keys found.
        keys: Vec<Vec<u8>>,
        /// Next cursor; 0 when the scan is complete.
        next: u64,
    },
    /// Modify: the old value (`Swap`, `Take`), or the new number
    /// (`IncrBy`, `IncrByFloat`, as text), and the value's length now.
    Modified {
        /// The old value (`Swap`, `Take`); for `IncrBy` and
        /// `IncrByFloat`, the new value's text; else `None`.
        value: Option<Vec<u8>>,
        /// The length of the key's value after the write (0: absent).
        len: u64,
    },
    /// Modify: the value did not suit the operation; nothing changed.
    /// The text is Redis's error (`ERR value is not an integer or out of
    /// range`, ...).
    Refused(String),
    /// RotateStag: the arena's STag now.
    Rotated {
        /// The new STag.
        stag: u32,
    },
}

/// [`StatusInfo::role`]: no data yet.
pub const ROLE_JOINING: u8 = 0;
/// [`StatusInfo::role`]: a secondary recorded in sync (holds every
/// acknowledged write).
pub const ROLE_SECONDARY: u8 = 1;
/// [`StatusInfo::role`]: the primary.
pub const ROLE_PRIMARY: u8 = 2;
/// [`StatusInfo::role`]: a former primary that stopped serving.
pub const ROLE_FENCED: u8 = 3;
/// [`StatusInfo::role`]: a secondary still copying or catching up, not yet
/// recorded in sync (it would not survive the primary's loss).
pub const ROLE_SYNCING: u8 = 4;

/// A human name of [`StatusInfo::role`].
pub fn role_name(role: u8) -> &'static str {
    match role {
        ROLE_JOINING => "joining",
        ROLE_SECONDARY => "secondary",
        ROLE_PRIMARY => "primary",
        ROLE_FENCED => "fenced",
        ROLE_SYNCING => "syncing",
        _ => "unknown",
    }
}

/// A node's view of itself and its group.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StatusInfo {
    /// Node id.
    pub node: NodeId,
    /// Role: [`ROLE_JOINING`], [`ROLE_SECONDARY`] (recorded in sync by
    /// the coordinator), [`ROLE_PRIMARY`], [`ROLE_FENCED`] or
    /// [`ROLE_SYNCING`] (a secondary copying the arena or catching up, not
    /// yet recorded in sync).
    pub role: u8,
    /// Current epoch.
    pub epoch: u64,
    /// Arena base address.
    pub arena_base: u64,
    /// Arena length.
    pub arena_len: u64,
    /// Arena STag.
    pub stag: u32,
    /// Bytes allocated.
    pub allocated: u64,
    /// Number of objects.
    pub objects: u64,
    /// Primary only: whether an in-sync secondary holds every write.
    pub redundant: bool,
    /// Highest applied write.
    pub applied_seq: u64,
    /// Keys in the index.
    pub keys: u64,
    /// Keys with a deadline, and the mean of their deadlines (ms since
    /// the Unix epoch; 0 without any): `INFO keyspace`'s `expires`, `avg_ttl`.
    pub expires: (u64, u64),
    /// The node's RESP front door port (0: none), on the node's host.
    pub resp_port: u16,
    /// The group's `min_in_sync_replicas` as this node is configured
    /// (what an acknowledged write is held by: `config::durability`).
    pub min_in_sync: u8,
    /// The persistence policy (issue 33): 0 off, 1 everysec, 2 always
    /// ([`crate::persist::Policy`]).
    pub persist: u8,
    /// The last write this node's log holds durably (0 without one).
    pub durable_seq: u64,
    /// The node's incarnation (the coordinator's records name members as
    /// node and incarnation; `softrdma store promote` names this one).
    pub incarnation: u64,
}

/// One effect of a write, applied identically on every replica.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Allocate exactly `[offset, offset + len)`.
    Alloc {
        /// Arena offset.
        offset: u64,
        /// Rounded length.
        len: u64,
    },
    /// Write an object (header, key, data) at `offset`.
    Write {
        /// Arena offset.
        offset: u64,
        /// Object version.
        version: u64,
        /// Object generation.
        generation: u64,
        /// Key (empty for the pointer API).
        key: Vec<u8>,
        /// Data.
        data: Bytes,
        /// When the key expires (milliseconds since the Unix epoch, at
        /// most `object::MAX_DEADLINE`); 0: never (always, without a key).
        deadline: u64,
    },
    /// A key's new deadline (`EXPIRE`, `PERSIST`): the object at
    /// `offset`, which holds `key`, gets `version` and `deadline` in its
    /// header (its checksum recomputed), its key and value untouched, so
    /// a change of deadline carries no value bytes.
    Retime {
        /// Arena offset of the key's object.
        offset: u64,
        /// The key (checked against the object's).
        key: Vec<u8>,
        /// The write's sequence number, the object's version from now on.
        version: u64,
        /// The new deadline (0: none; at most `object::MAX_DEADLINE`).
        deadline: u64,
    },
    /// Zero the header at `offset` and free the allocation.
    Free {
        /// Arena offset.
        offset: u64,
    },
    /// Change the key index (`crate::index`).
    Index {
        /// The key the edit is about.
        key: Vec<u8>,
        /// The generation of the key's object (of a set slot).
        generation: u64,
        /// The edit.
        edit: crate::index::Edit,
    },
    /// The arena's STag from now on (a rotation; same index).
    Stag {
        /// The new STag.
        stag: u32,
    },
}

/// A replicated write: its effects and the reply the client gets, which the
/// secondary records so that a retry after failover gets the same answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepOp {
    /// Client id.
    pub client: u64,
    /// Request number.
    pub req_id: u64,
    /// Effects, in order.
    pub effects: Vec<Effect>,
    /// The reply.
    pub reply: Reply,
}

/// One row of the retry table: the last write of a client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DedupEntry {
    /// Client id.
    pub client: u64,
    /// Request number.
    pub req_id: u64,
    /// Sequence number of the write.
    pub seq: u64,
    /// The reply.
    pub reply: Reply,
}

/// Checks a key: 1 to [`MAX_KEY_LEN`](crate::object::MAX_KEY_LEN) bytes,
/// else [`StoreError::BadKey`]. The one rule for the node and its clients.
pub fn check_key(key: &[u8]) -> Result<(), StoreError> {
    let max = crate::object::MAX_KEY_LEN;
    if key.is_empty() || key.len() > max {
        return Err(StoreError::BadKey {
            len: key.len() as u64,
            max: max as u64,
        });
    }
    Ok(())
}

/// Errors returned to clients.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StoreError {
    /// The request's epoch is older than the node's; retry with the
    /// envelope's epoch.
    #[error("stale epoch (node is at epoch {current})")]
    StaleEpoch {
        /// The node's epoch.
        current: u64,
    },
    /// This node does not serve writes now; try `primary` if known.
    #[error("not the primary (primary: {primary:?}); retry there")]
    NotPrimary {
        /// Known primary.
        primary: Option<NodeId>,
    },
    /// Wrong STag.
    #[error("wrong STag {got:#010x} (arena STag {expected:#010x})")]
    WrongStag {
        /// In the pointer.
        got: u32,
        /// The arena's.
        expected: u32,
    },
    /// Pointer outside the arena.
    #[error("pointer outside the arena")]
    OutOfArena,
    /// Pointer to freed space.
    #[error("pointer refers to freed space")]
    Freed,
    /// Pointer not at an allocation.
    #[error("pointer does not match an allocation")]
    NotAllocated,
    /// Value larger than the largest possible allocation.
    #[error("value of {len} bytes exceeds the largest that can be stored ({max} bytes)")]
    TooLarge {
        /// Value length.
        len: u64,
        /// The largest value that can be stored (under this key): the
        /// largest possible allocation (the arena less the key index)
        /// less the header and the key.
        max: u64,
    },
    /// No free range large enough.
    #[error("arena full (largest free range {largest_free} bytes)")]
    Full {
        /// Largest free range.
        largest_free: u64,
    },
    /// The object was being changed; retry.
    #[error("torn read; retry")]
    Torn,
    /// The primary has no secondary in sync and the group's policy
    /// (`min_in_sync_replicas = 1`) forbids acknowledging a write held by
    /// one node only: nothing was changed; retry once the group is
    /// redundant again.
    #[error("write refused: no secondary in sync (min_in_sync_replicas = 1); nothing was changed")]
    NotEnoughReplicas,
    /// A key that is empty or too long.
    #[error("key of {len} bytes: keys are 1 to {max} bytes")]
    BadKey {
        /// Key length.
        len: u64,
        /// Longest key.
        max: u64,
    },
    /// The key index has no free slot for a new key near its home.
    #[error(
        "the key index is full around bucket {bucket}: configure more index buckets \
         (index_buckets) for a new group"
    )]
    IndexFull {
        /// The key's home bucket.
        bucket: u64,
    },
    /// A pointer-API write to an object that belongs to a key.
    #[error("the object belongs to a key; change it through the key")]
    Keyed,
    /// A scan pattern longer than the node takes.
    #[error("scan pattern of {len} bytes: patterns are at most {max} bytes")]
    BadPattern {
        /// Pattern length.
        len: u64,
        /// Longest pattern.
        max: u64,
    },
    /// The connection's user may not do this (a read-only user's write).
    #[error("this user has no permission to write")]
    NoPermission,
    /// A pointer of the pointer API whose object was deleted and whose
    /// space now holds another object (its generation differs): nothing
    /// was read or changed.
    #[error("stale pointer: its object (generation {expected}) was deleted; the space now holds another object")]
    StalePointer {
        /// The pointer's generation.
        expected: u64,
    },
    /// An [`Op::Batch`] whose replicated write is larger than one frame,
    /// or holds more than [`MAX_BATCH_OPS`] writes or a write that is not
    /// keyed: nothing was changed.
    #[error("a batch of {ops} writes, {len} bytes replicated: at most {max} bytes and {MAX_BATCH_OPS} keyed writes")]
    BatchTooLarge {
        /// Writes in it.
        ops: u64,
        /// Bytes of its replicated write (0: not measured).
        len: u64,
        /// The most one replicated write may hold.
        max: u64,
    },
    /// Anything else.
    #[error("{0}")]
    Other(String),
}
