//! The store's messages and their binary codec.
//!
//! One protocol serves clients talking to nodes and nodes talking to each
//! other (replication, heartbeats, recovery). Every message travels in an
//! [`Envelope`] that carries the **sender's epoch**: a receiver refuses
//! anything from an epoch older than its own (see [`crate::node`]).
//!
//! Codec: little-endian, a tag byte per enum, `u32` length prefixes for byte
//! strings and lists. [`decode`] checks every length against the bytes that
//! remain (and against [`MAX_MESSAGE`]) before allocating, rejects unknown
//! tags and trailing bytes, and never panics on garbage. Framing on a stream
//! (a `u32` length before each message) is the transport's business.

use crate::alloc::AllocSnapshot;
use crate::ptr::RemotePtr;

/// Largest encoded message accepted by [`decode`].
pub const MAX_MESSAGE: usize = 64 << 20;

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
}

/// Client operations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// Store bytes; answer with a pointer.
    Insert {
        /// The data.
        data: Vec<u8>,
    },
    /// Replace an object's bytes (in place when they fit).
    Update {
        /// The object.
        ptr: RemotePtr,
        /// The data.
        data: Vec<u8>,
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
    /// Store `data` under `key` (see [`Cond`]); answered
    /// [`Reply::Stored`] or, when the condition fails, [`Reply::NotStored`].
    Put {
        /// The key (1 to [`crate::object::MAX_KEY_LEN`] bytes).
        key: Vec<u8>,
        /// The value.
        data: Vec<u8>,
        /// When to store.
        cond: Cond,
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
    /// The node's RESP front door port (0: none), on the node's host.
    pub resp_port: u16,
    /// The group's `min_in_sync_replicas` as this node is configured
    /// (what an acknowledged write is held by: `config::durability`).
    pub min_in_sync: u8,
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
        data: Vec<u8>,
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
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// Why bytes are not a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Ran out of bytes.
    #[error("message truncated at byte {at} (needed {needed} more)")]
    Truncated {
        /// Position.
        at: usize,
        /// Bytes needed.
        needed: usize,
    },
    /// Unknown tag.
    #[error("unknown {what} tag {tag}")]
    BadTag {
        /// Which enum.
        what: &'static str,
        /// Tag byte.
        tag: u8,
    },
    /// Bytes left over.
    #[error("{0} trailing bytes after the message")]
    Trailing(usize),
    /// Too large.
    #[error("message of {0} bytes exceeds the limit")]
    TooLarge(usize),
    /// Text not UTF-8.
    #[error("invalid UTF-8 in a string field")]
    Utf8,
}

// ---------------------------------------------------------------- encoding

struct W(Vec<u8>);

impl W {
    fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn len(&mut self, n: usize) {
        self.u32(u32::try_from(n).expect("field longer than 4 GiB"));
    }
    fn bytes(&mut self, b: &[u8]) {
        self.len(b.len());
        self.0.extend_from_slice(b);
    }
    fn ptr(&mut self, p: &RemotePtr) {
        self.0.extend_from_slice(&p.encode());
    }
    fn bool(&mut self, b: bool) {
        self.u8(b as u8);
    }
}

/// Encodes a message.
pub fn encode(env: &Envelope) -> Vec<u8> {
    let mut w = W(Vec::with_capacity(64));
    w.u64(env.epoch);
    enc_body(&mut w, &env.body);
    w.0
}

fn enc_body(w: &mut W, b: &Body) {
    match b {
        Body::Request { client, req_id, op } => {
            w.u8(1);
            w.u64(*client);
            w.u64(*req_id);
            enc_op(w, op);
        }
        Body::Response { req_id, result } => {
            w.u8(2);
            w.u64(*req_id);
            match result {
                Ok(r) => {
                    w.u8(0);
                    enc_reply(w, r);
                }
                Err(e) => {
                    w.u8(1);
                    enc_error(w, e);
                }
            }
        }
        Body::Heartbeat => w.u8(3),
        Body::Replicate { seq, op } => {
            w.u8(4);
            w.u64(*seq);
            w.u64(op.client);
            w.u64(op.req_id);
            w.len(op.effects.len());
            for e in &op.effects {
                enc_effect(w, e);
            }
            enc_reply(w, &op.reply);
        }
        Body::ReplicateAck { seq } => {
            w.u8(5);
            w.u64(*seq);
        }
        Body::Stale => w.u8(6),
        Body::Join { member, arena_len } => {
            w.u8(7);
            w.u32(member.node);
            w.u64(member.incarnation);
            w.u64(*arena_len);
        }
        Body::SyncStart {
            session,
            start_seq,
            alloc,
            dedup,
            stag,
        } => {
            w.u8(8);
            w.u64(*session);
            w.u64(*start_seq);
            w.u32(*stag);
            w.u64(alloc.size);
            w.len(alloc.allocations.len());
            for &(o, l) in &alloc.allocations {
                w.u64(o);
                w.u64(l);
            }
            w.len(alloc.freed.len());
            for &f in &alloc.freed {
                w.u64(f);
            }
            w.len(dedup.len());
            for d in dedup {
                w.u64(d.client);
                w.u64(d.req_id);
                w.u64(d.seq);
                enc_reply(w, &d.reply);
            }
        }
        Body::SyncRequest {
            session,
            offset,
            len,
        } => {
            w.u8(9);
            w.u64(*session);
            w.u64(*offset);
            w.u32(*len);
        }
        Body::SyncChunk {
            session,
            offset,
            data,
        } => {
            w.u8(10);
            w.u64(*session);
            w.u64(*offset);
            w.bytes(data);
        }
        Body::SyncDone {
            session,
            through_seq,
        } => {
            w.u8(11);
            w.u64(*session);
            w.u64(*through_seq);
        }
        Body::JoinRefused { reason } => {
            w.u8(12);
            w.bytes(reason.as_bytes());
        }
        Body::ReplicateHead { seq, in_sync } => {
            w.u8(13);
            w.u64(*seq);
            w.u8(*in_sync as u8);
        }
        Body::Resend { from } => {
            w.u8(14);
            w.u64(*from);
        }
    }
}

fn enc_op(w: &mut W, op: &Op) {
    match op {
        Op::Insert { data } => {
            w.u8(1);
            w.bytes(data);
        }
        Op::Update { ptr, data } => {
            w.u8(2);
            w.ptr(ptr);
            w.bytes(data);
        }
        Op::Read { ptr } => {
            w.u8(3);
            w.ptr(ptr);
        }
        Op::Delete { ptr } => {
            w.u8(4);
            w.ptr(ptr);
        }
        Op::Status => w.u8(5),
        Op::Put { key, data, cond } => {
            w.u8(6);
            w.bytes(key);
            w.bytes(data);
            w.u8(match cond {
                Cond::Always => 0,
                Cond::IfAbsent => 1,
                Cond::IfPresent => 2,
            });
        }
        Op::Get { key } => {
            w.u8(7);
            w.bytes(key);
        }
        Op::Remove { key } => {
            w.u8(8);
            w.bytes(key);
        }
        Op::Scan {
            cursor,
            count,
            pattern,
        } => {
            w.u8(9);
            w.u64(*cursor);
            w.u32(*count);
            w.bytes(pattern);
        }
        Op::RotateStag { stag } => {
            w.u8(10);
            w.u32(*stag);
        }
    }
}

fn enc_reply(w: &mut W, r: &Reply) {
    match r {
        Reply::Inserted(p) => {
            w.u8(1);
            w.ptr(p);
        }
        Reply::Updated(p) => {
            w.u8(2);
            w.ptr(p);
        }
        Reply::Data { version, data } => {
            w.u8(3);
            w.u64(*version);
            w.bytes(data);
        }
        Reply::Deleted => w.u8(4),
        Reply::Status(s) => {
            w.u8(5);
            w.u32(s.node);
            w.u8(s.role);
            w.u64(s.epoch);
            w.u64(s.arena_base);
            w.u64(s.arena_len);
            w.u32(s.stag);
            w.u64(s.allocated);
            w.u64(s.objects);
            w.bool(s.redundant);
            w.u64(s.applied_seq);
            w.u64(s.keys);
            w.0.extend_from_slice(&s.resp_port.to_le_bytes());
            w.u8(s.min_in_sync);
        }
        Reply::Stored {
            ptr,
            generation,
            created,
        } => {
            w.u8(6);
            w.ptr(ptr);
            w.u64(*generation);
            w.bool(*created);
        }
        Reply::NotStored => w.u8(7),
        Reply::Value {
            ptr,
            generation,
            version,
            data,
        } => {
            w.u8(8);
            w.ptr(ptr);
            w.u64(*generation);
            w.u64(*version);
            w.bytes(data);
        }
        Reply::NoKey => w.u8(9),
        Reply::Removed { existed } => {
            w.u8(10);
            w.bool(*existed);
        }
        Reply::Keys { keys, next } => {
            w.u8(11);
            w.len(keys.len());
            for k in keys {
                w.bytes(k);
            }
            w.u64(*next);
        }
        Reply::Rotated { stag } => {
            w.u8(12);
            w.u32(*stag);
        }
    }
}

fn enc_effect(w: &mut W, e: &Effect) {
    match e {
        Effect::Alloc { offset, len } => {
            w.u8(1);
            w.u64(*offset);
            w.u64(*len);
        }
        Effect::Write {
            offset,
            version,
            generation,
            key,
            data,
        } => {
            w.u8(2);
            w.u64(*offset);
            w.u64(*version);
            w.u64(*generation);
            w.bytes(key);
            w.bytes(data);
        }
        Effect::Free { offset } => {
            w.u8(3);
            w.u64(*offset);
        }
        Effect::Index {
            key,
            generation,
            edit,
        } => {
            w.u8(4);
            w.bytes(key);
            w.u64(*generation);
            match edit {
                crate::index::Edit::Slot {
                    bucket,
                    slot,
                    entry,
                } => {
                    w.u8(1);
                    w.u64(*bucket);
                    w.u8(*slot);
                    match entry {
                        None => w.u8(0),
                        Some(e) => {
                            w.u8(1);
                            w.u32(e.tag);
                            w.u64(e.offset);
                            w.u32(e.units);
                            w.u32(e.generation);
                        }
                    }
                }
                crate::index::Edit::Spill { bucket } => {
                    w.u8(2);
                    w.u64(*bucket);
                }
            }
        }
        Effect::Stag { stag } => {
            w.u8(5);
            w.u32(*stag);
        }
    }
}

fn enc_error(w: &mut W, e: &StoreError) {
    match e {
        StoreError::StaleEpoch { current } => {
            w.u8(1);
            w.u64(*current);
        }
        StoreError::NotPrimary { primary } => {
            w.u8(2);
            match primary {
                Some(p) => {
                    w.u8(1);
                    w.u32(*p);
                }
                None => w.u8(0),
            }
        }
        StoreError::WrongStag { got, expected } => {
            w.u8(3);
            w.u32(*got);
            w.u32(*expected);
        }
        StoreError::OutOfArena => w.u8(4),
        StoreError::Freed => w.u8(5),
        StoreError::NotAllocated => w.u8(6),
        StoreError::TooLarge { len, max } => {
            w.u8(7);
            w.u64(*len);
            w.u64(*max);
        }
        StoreError::Full { largest_free } => {
            w.u8(8);
            w.u64(*largest_free);
        }
        StoreError::Torn => w.u8(9),
        StoreError::Other(s) => {
            w.u8(10);
            w.bytes(s.as_bytes());
        }
        StoreError::NotEnoughReplicas => w.u8(11),
        StoreError::BadKey { len, max } => {
            w.u8(12);
            w.u64(*len);
            w.u64(*max);
        }
        StoreError::IndexFull { bucket } => {
            w.u8(13);
            w.u64(*bucket);
        }
        StoreError::Keyed => w.u8(14),
        StoreError::BadPattern { len, max } => {
            w.u8(15);
            w.u64(*len);
            w.u64(*max);
        }
        StoreError::NoPermission => w.u8(16),
        StoreError::StalePointer { expected } => {
            w.u8(17);
            w.u64(*expected);
        }
    }
}

// ---------------------------------------------------------------- decoding

struct R<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> R<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8], DecodeError> {
        if self.b.len() - self.at < n {
            return Err(DecodeError::Truncated {
                at: self.at,
                needed: n - (self.b.len() - self.at),
            });
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8, DecodeError> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    fn bool(&mut self) -> Result<bool, DecodeError> {
        match self.u8()? {
            0 => Ok(false),
            1 => Ok(true),
            tag => Err(DecodeError::BadTag { what: "bool", tag }),
        }
    }
    /// A list length, checked against the bytes left given each element's
    /// minimum encoded size, so garbage cannot make us allocate much.
    fn count(&mut self, min_elem: usize) -> Result<usize, DecodeError> {
        let n = self.u32()? as usize;
        let left = self.b.len() - self.at;
        if n.saturating_mul(min_elem.max(1)) > left {
            return Err(DecodeError::Truncated {
                at: self.at,
                needed: n * min_elem.max(1) - left,
            });
        }
        Ok(n)
    }
    fn bytes(&mut self) -> Result<Vec<u8>, DecodeError> {
        let n = self.count(1)?;
        Ok(self.take(n)?.to_vec())
    }
    fn string(&mut self) -> Result<String, DecodeError> {
        String::from_utf8(self.bytes()?).map_err(|_| DecodeError::Utf8)
    }
    fn ptr(&mut self) -> Result<RemotePtr, DecodeError> {
        Ok(RemotePtr::decode(self.take(crate::ptr::ENCODED_LEN)?).expect("exact length"))
    }
}

/// Decodes one whole message.
pub fn decode(b: &[u8]) -> Result<Envelope, DecodeError> {
    if b.len() > MAX_MESSAGE {
        return Err(DecodeError::TooLarge(b.len()));
    }
    let mut r = R { b, at: 0 };
    let epoch = r.u64()?;
    let body = dec_body(&mut r)?;
    if r.at != b.len() {
        return Err(DecodeError::Trailing(b.len() - r.at));
    }
    Ok(Envelope { epoch, body })
}

fn dec_body(r: &mut R<'_>) -> Result<Body, DecodeError> {
    Ok(match r.u8()? {
        1 => Body::Request {
            client: r.u64()?,
            req_id: r.u64()?,
            op: dec_op(r)?,
        },
        2 => {
            let req_id = r.u64()?;
            let result = match r.u8()? {
                0 => Ok(dec_reply(r)?),
                1 => Err(dec_error(r)?),
                tag => {
                    return Err(DecodeError::BadTag {
                        what: "result",
                        tag,
                    })
                }
            };
            Body::Response { req_id, result }
        }
        3 => Body::Heartbeat,
        4 => {
            let seq = r.u64()?;
            let client = r.u64()?;
            let req_id = r.u64()?;
            // (The smallest effect, `Stag`, is a tag and a u32.)
            let n = r.count(5)?;
            let mut effects = Vec::with_capacity(n);
            for _ in 0..n {
                effects.push(dec_effect(r)?);
            }
            let reply = dec_reply(r)?;
            Body::Replicate {
                seq,
                op: RepOp {
                    client,
                    req_id,
                    effects,
                    reply,
                },
            }
        }
        5 => Body::ReplicateAck { seq: r.u64()? },
        6 => Body::Stale,
        7 => Body::Join {
            member: Member {
                node: r.u32()?,
                incarnation: r.u64()?,
            },
            arena_len: r.u64()?,
        },
        8 => {
            let session = r.u64()?;
            let start_seq = r.u64()?;
            let stag = r.u32()?;
            let size = r.u64()?;
            let n = r.count(16)?;
            let mut allocations = Vec::with_capacity(n);
            for _ in 0..n {
                allocations.push((r.u64()?, r.u64()?));
            }
            let n = r.count(8)?;
            let mut freed = Vec::with_capacity(n);
            for _ in 0..n {
                freed.push(r.u64()?);
            }
            let n = r.count(25)?;
            let mut dedup = Vec::with_capacity(n);
            for _ in 0..n {
                dedup.push(DedupEntry {
                    client: r.u64()?,
                    req_id: r.u64()?,
                    seq: r.u64()?,
                    reply: dec_reply(r)?,
                });
            }
            Body::SyncStart {
                session,
                start_seq,
                alloc: AllocSnapshot {
                    size,
                    allocations,
                    freed,
                },
                dedup,
                stag,
            }
        }
        9 => Body::SyncRequest {
            session: r.u64()?,
            offset: r.u64()?,
            len: r.u32()?,
        },
        10 => Body::SyncChunk {
            session: r.u64()?,
            offset: r.u64()?,
            data: r.bytes()?,
        },
        11 => Body::SyncDone {
            session: r.u64()?,
            through_seq: r.u64()?,
        },
        12 => Body::JoinRefused {
            reason: r.string()?,
        },
        13 => Body::ReplicateHead {
            seq: r.u64()?,
            in_sync: r.bool()?,
        },
        14 => Body::Resend { from: r.u64()? },
        tag => return Err(DecodeError::BadTag { what: "body", tag }),
    })
}

fn dec_op(r: &mut R<'_>) -> Result<Op, DecodeError> {
    Ok(match r.u8()? {
        1 => Op::Insert { data: r.bytes()? },
        2 => Op::Update {
            ptr: r.ptr()?,
            data: r.bytes()?,
        },
        3 => Op::Read { ptr: r.ptr()? },
        4 => Op::Delete { ptr: r.ptr()? },
        5 => Op::Status,
        6 => Op::Put {
            key: r.bytes()?,
            data: r.bytes()?,
            cond: match r.u8()? {
                0 => Cond::Always,
                1 => Cond::IfAbsent,
                2 => Cond::IfPresent,
                tag => return Err(DecodeError::BadTag { what: "cond", tag }),
            },
        },
        7 => Op::Get { key: r.bytes()? },
        8 => Op::Remove { key: r.bytes()? },
        9 => Op::Scan {
            cursor: r.u64()?,
            count: r.u32()?,
            pattern: r.bytes()?,
        },
        10 => Op::RotateStag { stag: r.u32()? },
        tag => return Err(DecodeError::BadTag { what: "op", tag }),
    })
}

fn dec_reply(r: &mut R<'_>) -> Result<Reply, DecodeError> {
    Ok(match r.u8()? {
        1 => Reply::Inserted(r.ptr()?),
        2 => Reply::Updated(r.ptr()?),
        3 => Reply::Data {
            version: r.u64()?,
            data: r.bytes()?,
        },
        4 => Reply::Deleted,
        5 => Reply::Status(StatusInfo {
            node: r.u32()?,
            role: r.u8()?,
            epoch: r.u64()?,
            arena_base: r.u64()?,
            arena_len: r.u64()?,
            stag: r.u32()?,
            allocated: r.u64()?,
            objects: r.u64()?,
            redundant: r.bool()?,
            applied_seq: r.u64()?,
            keys: r.u64()?,
            resp_port: u16::from_le_bytes(r.take(2)?.try_into().unwrap()),
            min_in_sync: r.u8()?,
        }),
        6 => Reply::Stored {
            ptr: r.ptr()?,
            generation: r.u64()?,
            created: r.bool()?,
        },
        7 => Reply::NotStored,
        8 => Reply::Value {
            ptr: r.ptr()?,
            generation: r.u64()?,
            version: r.u64()?,
            data: r.bytes()?,
        },
        9 => Reply::NoKey,
        10 => Reply::Removed { existed: r.bool()? },
        11 => {
            let n = r.count(4)?;
            let mut keys = Vec::with_capacity(n);
            for _ in 0..n {
                keys.push(r.bytes()?);
            }
            Reply::Keys {
                keys,
                next: r.u64()?,
            }
        }
        12 => Reply::Rotated { stag: r.u32()? },
        tag => return Err(DecodeError::BadTag { what: "reply", tag }),
    })
}

fn dec_effect(r: &mut R<'_>) -> Result<Effect, DecodeError> {
    Ok(match r.u8()? {
        1 => Effect::Alloc {
            offset: r.u64()?,
            len: r.u64()?,
        },
        2 => Effect::Write {
            offset: r.u64()?,
            version: r.u64()?,
            generation: r.u64()?,
            key: r.bytes()?,
            data: r.bytes()?,
        },
        3 => Effect::Free { offset: r.u64()? },
        4 => {
            let key = r.bytes()?;
            let generation = r.u64()?;
            let edit = match r.u8()? {
                1 => crate::index::Edit::Slot {
                    bucket: r.u64()?,
                    slot: r.u8()?,
                    entry: if r.bool()? {
                        Some(crate::index::Slot {
                            tag: r.u32()?,
                            offset: r.u64()?,
                            units: r.u32()?,
                            generation: r.u32()?,
                        })
                    } else {
                        None
                    },
                },
                2 => crate::index::Edit::Spill { bucket: r.u64()? },
                tag => return Err(DecodeError::BadTag { what: "edit", tag }),
            };
            Effect::Index {
                key,
                generation,
                edit,
            }
        }
        5 => Effect::Stag { stag: r.u32()? },
        tag => {
            return Err(DecodeError::BadTag {
                what: "effect",
                tag,
            })
        }
    })
}

fn dec_error(r: &mut R<'_>) -> Result<StoreError, DecodeError> {
    Ok(match r.u8()? {
        1 => StoreError::StaleEpoch { current: r.u64()? },
        2 => StoreError::NotPrimary {
            primary: if r.bool()? { Some(r.u32()?) } else { None },
        },
        3 => StoreError::WrongStag {
            got: r.u32()?,
            expected: r.u32()?,
        },
        4 => StoreError::OutOfArena,
        5 => StoreError::Freed,
        6 => StoreError::NotAllocated,
        7 => StoreError::TooLarge {
            len: r.u64()?,
            max: r.u64()?,
        },
        8 => StoreError::Full {
            largest_free: r.u64()?,
        },
        9 => StoreError::Torn,
        10 => StoreError::Other(r.string()?),
        11 => StoreError::NotEnoughReplicas,
        12 => StoreError::BadKey {
            len: r.u64()?,
            max: r.u64()?,
        },
        13 => StoreError::IndexFull { bucket: r.u64()? },
        14 => StoreError::Keyed,
        15 => StoreError::BadPattern {
            len: r.u64()?,
            max: r.u64()?,
        },
        16 => StoreError::NoPermission,
        17 => StoreError::StalePointer { expected: r.u64()? },
        tag => return Err(DecodeError::BadTag { what: "error", tag }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ptr() -> impl Strategy<Value = RemotePtr> {
        (any::<u64>(), any::<u32>(), any::<u32>(), any::<u64>()).prop_map(
            |(addr, stag, len, gen)| RemotePtr {
                addr,
                stag,
                len,
                gen,
            },
        )
    }

    fn bytes() -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(any::<u8>(), 0..40)
    }

    fn reply() -> impl Strategy<Value = Reply> {
        prop_oneof![
            ptr().prop_map(Reply::Inserted),
            any::<u32>().prop_map(|stag| Reply::Rotated { stag }),
            ptr().prop_map(Reply::Updated),
            (any::<u64>(), bytes()).prop_map(|(version, data)| Reply::Data { version, data }),
            Just(Reply::Deleted),
            (
                any::<u32>(),
                any::<u8>(),
                any::<u64>(),
                any::<bool>(),
                any::<u64>()
            )
                .prop_map(|(node, role, epoch, redundant, x)| Reply::Status(
                    StatusInfo {
                        node,
                        role,
                        epoch,
                        arena_base: x,
                        arena_len: x / 3,
                        stag: node ^ 7,
                        allocated: x / 5,
                        objects: x / 7,
                        redundant,
                        applied_seq: x / 11,
                        keys: x / 13,
                        resp_port: node as u16,
                        min_in_sync: role & 1,
                    }
                )),
            (ptr(), any::<u64>(), any::<bool>()).prop_map(|(ptr, generation, created)| {
                Reply::Stored {
                    ptr,
                    generation,
                    created,
                }
            }),
            Just(Reply::NotStored),
            (ptr(), any::<u64>(), any::<u64>(), bytes()).prop_map(
                |(ptr, generation, version, data)| Reply::Value {
                    ptr,
                    generation,
                    version,
                    data,
                }
            ),
            Just(Reply::NoKey),
            any::<bool>().prop_map(|existed| Reply::Removed { existed }),
            (prop::collection::vec(bytes(), 0..4), any::<u64>())
                .prop_map(|(keys, next)| Reply::Keys { keys, next }),
        ]
    }

    fn error() -> impl Strategy<Value = StoreError> {
        prop_oneof![
            any::<u64>().prop_map(|current| StoreError::StaleEpoch { current }),
            any::<Option<u32>>().prop_map(|primary| StoreError::NotPrimary { primary }),
            (any::<u32>(), any::<u32>())
                .prop_map(|(got, expected)| StoreError::WrongStag { got, expected }),
            Just(StoreError::OutOfArena),
            Just(StoreError::Freed),
            Just(StoreError::NotAllocated),
            (any::<u64>(), any::<u64>()).prop_map(|(len, max)| StoreError::TooLarge { len, max }),
            any::<u64>().prop_map(|largest_free| StoreError::Full { largest_free }),
            Just(StoreError::Torn),
            Just(StoreError::NotEnoughReplicas),
            (any::<u64>(), any::<u64>()).prop_map(|(len, max)| StoreError::BadKey { len, max }),
            any::<u64>().prop_map(|bucket| StoreError::IndexFull { bucket }),
            Just(StoreError::Keyed),
            (any::<u64>(), any::<u64>()).prop_map(|(len, max)| StoreError::BadPattern { len, max }),
            "[a-z é]{0,12}".prop_map(StoreError::Other),
            Just(StoreError::NoPermission),
            any::<u64>().prop_map(|expected| StoreError::StalePointer { expected }),
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            bytes().prop_map(|data| Op::Insert { data }),
            (ptr(), bytes()).prop_map(|(ptr, data)| Op::Update { ptr, data }),
            ptr().prop_map(|ptr| Op::Read { ptr }),
            ptr().prop_map(|ptr| Op::Delete { ptr }),
            Just(Op::Status),
            (
                bytes(),
                bytes(),
                prop_oneof![
                    Just(Cond::Always),
                    Just(Cond::IfAbsent),
                    Just(Cond::IfPresent)
                ]
            )
                .prop_map(|(key, data, cond)| Op::Put { key, data, cond }),
            bytes().prop_map(|key| Op::Get { key }),
            bytes().prop_map(|key| Op::Remove { key }),
            (any::<u64>(), any::<u32>(), bytes()).prop_map(|(cursor, count, pattern)| Op::Scan {
                cursor,
                count,
                pattern
            }),
            any::<u32>().prop_map(|stag| Op::RotateStag { stag }),
        ]
    }

    fn effect() -> impl Strategy<Value = Effect> {
        prop_oneof![
            (any::<u64>(), any::<u64>()).prop_map(|(offset, len)| Effect::Alloc { offset, len }),
            (any::<u64>(), any::<u64>(), bytes(), bytes()).prop_map(
                |(offset, version, key, data)| Effect::Write {
                    offset,
                    version,
                    generation: version / 3,
                    key,
                    data,
                }
            ),
            any::<u64>().prop_map(|offset| Effect::Free { offset }),
            (
                bytes(),
                any::<u64>(),
                any::<u8>(),
                any::<Option<(u32, u32)>>()
            )
                .prop_map(|(key, generation, slot, e)| Effect::Index {
                    key,
                    generation,
                    edit: crate::index::Edit::Slot {
                        bucket: generation / 7,
                        slot,
                        entry: e.map(|(tag, units)| crate::index::Slot {
                            tag,
                            offset: generation,
                            units,
                            generation: tag ^ units,
                        }),
                    },
                }),
            (bytes(), any::<u64>()).prop_map(|(key, bucket)| Effect::Index {
                key,
                generation: 0,
                edit: crate::index::Edit::Spill { bucket },
            }),
            any::<u32>().prop_map(|stag| Effect::Stag { stag }),
        ]
    }

    fn body() -> impl Strategy<Value = Body> {
        prop_oneof![
            (any::<u64>(), any::<u64>(), op()).prop_map(|(client, req_id, op)| Body::Request {
                client,
                req_id,
                op
            }),
            (any::<u64>(), prop::result::maybe_ok(reply(), error()))
                .prop_map(|(req_id, result)| Body::Response { req_id, result }),
            Just(Body::Heartbeat),
            (
                any::<u64>(),
                any::<u64>(),
                any::<u64>(),
                prop::collection::vec(effect(), 0..4),
                reply()
            )
                .prop_map(|(seq, client, req_id, effects, reply)| Body::Replicate {
                    seq,
                    op: RepOp {
                        client,
                        req_id,
                        effects,
                        reply
                    }
                }),
            any::<u64>().prop_map(|seq| Body::ReplicateAck { seq }),
            Just(Body::Stale),
            (any::<u32>(), any::<u64>(), any::<u64>()).prop_map(
                |(node, incarnation, arena_len)| {
                    Body::Join {
                        member: Member { node, incarnation },
                        arena_len,
                    }
                }
            ),
            (
                any::<u64>(),
                any::<u64>(),
                prop::collection::vec((any::<u64>(), any::<u64>()), 0..4),
                prop::collection::vec(any::<u64>(), 0..4),
                prop::collection::vec((any::<u64>(), any::<u64>(), any::<u64>(), reply()), 0..3)
            )
                .prop_map(|(start_seq, size, allocations, freed, d)| Body::SyncStart {
                    session: start_seq.rotate_left(7) ^ size,
                    start_seq,
                    alloc: AllocSnapshot {
                        size,
                        allocations,
                        freed
                    },
                    dedup: d
                        .into_iter()
                        .map(|(client, req_id, seq, reply)| DedupEntry {
                            client,
                            req_id,
                            seq,
                            reply
                        })
                        .collect(),
                    stag: size as u32,
                }),
            (any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(session, offset, len)| {
                Body::SyncRequest {
                    session,
                    offset,
                    len,
                }
            }),
            (any::<u64>(), any::<u64>(), bytes()).prop_map(|(session, offset, data)| {
                Body::SyncChunk {
                    session,
                    offset,
                    data,
                }
            }),
            (any::<u64>(), any::<u64>()).prop_map(|(session, through_seq)| Body::SyncDone {
                session,
                through_seq
            }),
            "[a-z]{0,10}".prop_map(|reason| Body::JoinRefused { reason }),
            (any::<u64>(), any::<bool>())
                .prop_map(|(seq, in_sync)| Body::ReplicateHead { seq, in_sync }),
            any::<u64>().prop_map(|from| Body::Resend { from }),
        ]
    }

    proptest! {
        #[test]
        fn round_trip(epoch in any::<u64>(), body in body()) {
            let env = Envelope { epoch, body };
            let bytes = encode(&env);
            prop_assert_eq!(decode(&bytes), Ok(env.clone()));
            // Every strict prefix is rejected, as is any extra byte.
            for cut in 0..bytes.len() {
                prop_assert!(decode(&bytes[..cut]).is_err());
            }
            let mut longer = bytes.clone();
            longer.push(0);
            prop_assert_eq!(decode(&longer), Err(DecodeError::Trailing(1)));
        }

        #[test]
        fn garbage_never_panics(b in prop::collection::vec(any::<u8>(), 0..200)) {
            let _ = decode(&b);
        }

        #[test]
        fn mutated_messages_never_panic(epoch in any::<u64>(), body in body(), at in any::<usize>(), v in any::<u8>()) {
            let mut bytes = encode(&Envelope { epoch, body });
            let i = at % bytes.len();
            bytes[i] = v;
            let _ = decode(&bytes);
        }
    }

    #[test]
    fn huge_counts_are_rejected_before_allocating() {
        // A SyncStart claiming 2^32-1 allocations in a few bytes.
        let mut b = vec![0u8; 8];
        b.push(8);
        b.extend_from_slice(&[0; 24]);
        b.extend_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode(&b), Err(DecodeError::Truncated { .. })));
        assert_eq!(
            decode(&vec![0; MAX_MESSAGE + 1]),
            Err(DecodeError::TooLarge(MAX_MESSAGE + 1))
        );
    }
}
