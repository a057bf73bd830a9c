//! Encoding: every message to bytes (the layout [`super`] describes).

use super::{Body, Bytes, Cond, Effect, Envelope, ExpireWhen, Modify, Op, Reply, StoreError, Ttl};
use crate::ptr::RemotePtr;

/// The encoder's output: the bytes so far, and, when it gathers
/// ([`encode_gather`]), the message's earlier pieces.
struct W(Vec<u8>, Option<Vec<Piece>>);

/// A piece of an encoded message ([`encode_gather`]).
#[derive(Debug, Clone)]
pub enum Piece {
    /// Bytes the encoder wrote.
    Own(Vec<u8>),
    /// A value's bytes where they lie (a large value's, not copied).
    Shared(Bytes),
}

impl Piece {
    /// The piece's bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Piece::Own(v) => v,
            Piece::Shared(b) => b,
        }
    }
}

/// Values longer than this are gathered, not copied ([`encode_gather`]).
pub const GATHER_MIN: usize = 64 << 10;
/// Values gathered per message at most; later ones are copied.
pub const GATHER_MAX: usize = 16;

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
    /// A value: its bytes, or, when gathering a large one, the bytes
    /// written so far as a piece and the value as the next.
    fn value(&mut self, b: &Bytes) {
        let gather =
            b.len() > GATHER_MIN && self.1.as_ref().is_some_and(|p| p.len() < 2 * GATHER_MAX);
        if !gather {
            return self.bytes(b);
        }
        self.len(b.len());
        let own = std::mem::take(&mut self.0);
        if let Some(pieces) = self.1.as_mut() {
            pieces.push(Piece::Own(own));
            pieces.push(Piece::Shared(b.clone()));
        }
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
    encode_into(env, Vec::new())
}

/// Encodes a message into `buf` (emptied first; a buffer kept from an
/// earlier large message, say), grown to [`room`] if it has less.
pub fn encode_into(env: &Envelope, mut buf: Vec<u8>) -> Vec<u8> {
    buf.clear();
    // Room for the values it carries: a large one is copied once, not
    // again at every doubling.
    buf.reserve(room(env));
    let mut w = W(buf, None);
    w.u64(env.epoch);
    enc_body(&mut w, &env.body);
    w.0
}

/// Encodes a message as pieces whose concatenation is [`encode`]'s bytes:
/// values of more than [`GATHER_MIN`] bytes (up to [`GATHER_MAX`] of
/// them) are referenced where they lie, not copied, and the bytes between
/// them are written into `buf` and new vectors. What a link lends a large
/// message as (a gather list), so a value crosses it without a copy.
pub fn encode_gather(env: &Envelope, mut buf: Vec<u8>) -> Vec<Piece> {
    buf.clear();
    buf.reserve(gather_room(env));
    let mut w = W(buf, Some(Vec::new()));
    w.u64(env.epoch);
    enc_body(&mut w, &env.body);
    let W(last, pieces) = w;
    let mut pieces = pieces.unwrap_or_default();
    if !last.is_empty() {
        pieces.push(Piece::Own(last));
    }
    pieces
}

/// At least the bytes `env` takes encoded where it carries values (a
/// little more for the other fields).
pub fn room(env: &Envelope) -> usize {
    256 + carried(&env.body, |n| n)
}

/// [`room`] for [`encode_gather`]: at least the bytes it copies (the
/// first piece of a message with a large value has more room than it
/// needs; the next ones grow).
pub fn gather_room(env: &Envelope) -> usize {
    256 + carried(&env.body, |n| if n > GATHER_MIN { 0 } else { n })
}

/// About the bytes `b` takes encoded, at least for what carries values
/// (a large message must not outgrow its buffer by a few bytes: the
/// doubling copies it, and past glibc's mmap threshold maps it anew).
/// `value` says what a value of `n` bytes takes.
fn carried(b: &Body, value: fn(usize) -> usize) -> usize {
    match b {
        Body::Request { op, .. } => op_carries(op, value),
        Body::Replicate { op, .. } => op
            .effects
            .iter()
            .map(|e| match e {
                Effect::Write { key, data, .. } => EACH + key.len() + value(data.len()),
                _ => EACH,
            })
            .sum(),
        _ => 0,
    }
}

/// More than an operation's or effect's fixed fields take encoded.
const EACH: usize = 64;

fn op_carries(op: &Op, value: fn(usize) -> usize) -> usize {
    match op {
        Op::Insert { data } => EACH + value(data.len()),
        Op::Update { data, .. } => EACH + value(data.len()),
        Op::Put { key, data, .. } => EACH + key.len() + value(data.len()),
        Op::Modify {
            key,
            how: Modify::Swap { data, .. },
        } => EACH + key.len() + value(data.len()),
        Op::Batch { ops, .. } => ops.iter().map(|o| op_carries(o, value)).sum(),
        _ => EACH,
    }
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
        Body::Standing {
            member,
            epoch,
            seq,
            campaigns,
            loading,
        } => {
            w.u8(15);
            w.u32(member.node);
            w.u64(member.incarnation);
            w.u64(*epoch);
            w.u64(*seq);
            w.u8(*campaigns as u8);
            w.u8(*loading as u8);
        }
    }
}

fn enc_op(w: &mut W, op: &Op) {
    match op {
        Op::Insert { data } => {
            w.u8(1);
            w.value(data);
        }
        Op::Update { ptr, data } => {
            w.u8(2);
            w.ptr(ptr);
            w.value(data);
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
        Op::Put {
            key,
            data,
            cond,
            ttl,
        } => {
            w.u8(6);
            w.bytes(key);
            w.value(data);
            w.u8(cond_tag(*cond));
            enc_ttl(w, *ttl);
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
        Op::Modify { key, how } => {
            w.u8(11);
            w.bytes(key);
            match how {
                Modify::IncrBy(by) => {
                    w.u8(1);
                    w.u64(*by as u64);
                }
                Modify::Append(data) => {
                    w.u8(2);
                    w.bytes(data);
                }
                Modify::SetRange { offset, data } => {
                    w.u8(3);
                    w.u64(*offset);
                    w.bytes(data);
                }
                Modify::Swap { data, cond, ttl } => {
                    w.u8(4);
                    w.value(data);
                    w.u8(cond_tag(*cond));
                    enc_ttl(w, *ttl);
                }
                Modify::Take => w.u8(5),
                Modify::IncrByFloat(by) => {
                    w.u8(6);
                    w.bytes(by);
                }
                Modify::Peek => w.u8(7),
                Modify::Unchanged { version } => {
                    w.u8(8);
                    match version {
                        Some(v) => {
                            w.bool(true);
                            w.u64(*v);
                        }
                        None => w.bool(false),
                    }
                }
                Modify::Expire { at, when } => {
                    w.u8(9);
                    w.u64(*at);
                    w.u8(match when {
                        ExpireWhen::Always => 0,
                        ExpireWhen::IfNone => 1,
                        ExpireWhen::IfSet => 2,
                        ExpireWhen::IfLater => 3,
                        ExpireWhen::IfEarlier => 4,
                        ExpireWhen::IfSetAndEarlier => 5,
                    });
                }
                Modify::Deadline => w.u8(10),
                Modify::Reap => w.u8(11),
            }
        }
        Op::Batch { ops, all_or_none } => {
            w.u8(12);
            w.bool(*all_or_none);
            w.u32(ops.len() as u32);
            for op in ops {
                enc_op(w, op);
            }
        }
    }
}

fn enc_ttl(w: &mut W, t: Ttl) {
    match t {
        Ttl::Clear => w.u8(0),
        Ttl::Keep => w.u8(1),
        Ttl::At(at) => {
            w.u8(2);
            w.u64(at);
        }
    }
}

fn cond_tag(c: Cond) -> u8 {
    match c {
        Cond::Always => 0,
        Cond::IfAbsent => 1,
        Cond::IfPresent => 2,
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
            w.u64(s.expires.0);
            w.u64(s.expires.1);
            w.u8(s.persist);
            w.u64(s.durable_seq);
            w.u64(s.incarnation);
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
        Reply::Modified { value, len } => {
            w.u8(13);
            match value {
                Some(v) => {
                    w.bool(true);
                    w.bytes(v);
                }
                None => w.bool(false),
            }
            w.u64(*len);
        }
        Reply::Refused(text) => {
            w.u8(14);
            w.bytes(text.as_bytes());
        }
        Reply::Changed => w.u8(16),
        Reply::Batch(replies) => {
            w.u8(15);
            w.u32(replies.len() as u32);
            for r in replies {
                enc_reply(w, r);
            }
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
            deadline,
        } => {
            w.u8(2);
            w.u64(*offset);
            w.u64(*version);
            w.u64(*generation);
            w.bytes(key);
            w.value(data);
            w.u64(*deadline);
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
        Effect::Retime {
            offset,
            key,
            version,
            deadline,
        } => {
            w.u8(6);
            w.u64(*offset);
            w.bytes(key);
            w.u64(*version);
            w.u64(*deadline);
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
        StoreError::BatchTooLarge { ops, len, max } => {
            w.u8(18);
            w.u64(*ops);
            w.u64(*len);
            w.u64(*max);
        }
    }
}
