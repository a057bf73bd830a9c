//! Decoding: bytes to a message, checking every length and tag first (see
//! [`super`]); garbage is an error, never a panic.

use super::{
    Body, Cond, DedupEntry, Effect, Envelope, ExpireWhen, Member, Modify, Op, RepOp, Reply,
    StatusInfo, StoreError, Ttl, MAX_MESSAGE,
};
use crate::alloc::AllocSnapshot;
use crate::ptr::RemotePtr;
use bytes::Bytes;

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

struct R<'a> {
    b: &'a [u8],
    at: usize,
    /// `b` as shared bytes, when the caller has them: values are then
    /// slices of it rather than copies ([`decode_shared`]).
    shared: Option<&'a Bytes>,
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
    /// A value: a slice of the message when it is shared, else a copy.
    fn value(&mut self) -> Result<Bytes, DecodeError> {
        let n = self.count(1)?;
        let at = self.at;
        let s = self.take(n)?;
        Ok(match self.shared {
            Some(b) => b.slice(at..at + n),
            None => Bytes::copy_from_slice(s),
        })
    }
    fn string(&mut self) -> Result<String, DecodeError> {
        String::from_utf8(self.bytes()?).map_err(|_| DecodeError::Utf8)
    }
    fn ptr(&mut self) -> Result<RemotePtr, DecodeError> {
        Ok(RemotePtr::decode(self.take(crate::ptr::ENCODED_LEN)?).expect("exact length"))
    }
}

/// Decodes one whole message (its values copied out of `b`).
pub fn decode(b: &[u8]) -> Result<Envelope, DecodeError> {
    decode_in(b, None)
}

/// [`decode`] of a message the caller owns: the values it carries
/// ([`Op::Put`]'s data and the like) are slices of `b`, not copies, so a
/// large value is not copied between the link and the arena.
pub fn decode_shared(b: Bytes) -> Result<Envelope, DecodeError> {
    decode_in(&b, Some(&b))
}

fn decode_in(b: &[u8], shared: Option<&Bytes>) -> Result<Envelope, DecodeError> {
    if b.len() > MAX_MESSAGE {
        return Err(DecodeError::TooLarge(b.len()));
    }
    let mut r = R { b, at: 0, shared };
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
        15 => Body::Standing {
            member: Member {
                node: r.u32()?,
                incarnation: r.u64()?,
            },
            epoch: r.u64()?,
            seq: r.u64()?,
            campaigns: r.bool()?,
            loading: r.bool()?,
        },
        tag => return Err(DecodeError::BadTag { what: "body", tag }),
    })
}

fn dec_op(r: &mut R<'_>) -> Result<Op, DecodeError> {
    Ok(match r.u8()? {
        1 => Op::Insert { data: r.value()? },
        2 => Op::Update {
            ptr: r.ptr()?,
            data: r.value()?,
        },
        3 => Op::Read { ptr: r.ptr()? },
        4 => Op::Delete { ptr: r.ptr()? },
        5 => Op::Status,
        6 => Op::Put {
            key: r.bytes()?,
            data: r.value()?,
            cond: dec_cond(r)?,
            ttl: dec_ttl(r)?,
        },
        7 => Op::Get { key: r.bytes()? },
        8 => Op::Remove { key: r.bytes()? },
        9 => Op::Scan {
            cursor: r.u64()?,
            count: r.u32()?,
            pattern: r.bytes()?,
        },
        10 => Op::RotateStag { stag: r.u32()? },
        11 => Op::Modify {
            key: r.bytes()?,
            how: match r.u8()? {
                1 => Modify::IncrBy(r.u64()? as i64),
                2 => Modify::Append(r.bytes()?),
                3 => Modify::SetRange {
                    offset: r.u64()?,
                    data: r.bytes()?,
                },
                4 => Modify::Swap {
                    data: r.value()?,
                    cond: dec_cond(r)?,
                    ttl: dec_ttl(r)?,
                },
                5 => Modify::Take,
                6 => Modify::IncrByFloat(r.bytes()?),
                7 => Modify::Peek,
                8 => Modify::Unchanged {
                    version: match r.bool()? {
                        true => Some(r.u64()?),
                        false => None,
                    },
                },
                9 => Modify::Expire {
                    at: r.u64()?,
                    when: match r.u8()? {
                        0 => ExpireWhen::Always,
                        1 => ExpireWhen::IfNone,
                        2 => ExpireWhen::IfSet,
                        3 => ExpireWhen::IfLater,
                        4 => ExpireWhen::IfEarlier,
                        5 => ExpireWhen::IfSetAndEarlier,
                        tag => {
                            return Err(DecodeError::BadTag {
                                what: "expire condition",
                                tag,
                            })
                        }
                    },
                },
                10 => Modify::Deadline,
                11 => Modify::Reap,
                tag => {
                    return Err(DecodeError::BadTag {
                        what: "modify",
                        tag,
                    })
                }
            },
        },
        12 => {
            let all_or_none = r.bool()?;
            let n = batch_len(r, 2)?;
            let mut ops = Vec::with_capacity(n);
            for _ in 0..n {
                // Keyed writes only: a batch never nests.
                let op = dec_op(r)?;
                if !matches!(op, Op::Put { .. } | Op::Remove { .. } | Op::Modify { .. }) {
                    return Err(DecodeError::BadTag {
                        what: "batched op",
                        tag: 12,
                    });
                }
                ops.push(op);
            }
            Op::Batch { ops, all_or_none }
        }
        tag => return Err(DecodeError::BadTag { what: "op", tag }),
    })
}

/// The count of a batch's writes or replies (at most `MAX_BATCH_OPS`,
/// each at least `min_elem` bytes).
fn batch_len(r: &mut R<'_>, min_elem: usize) -> Result<usize, DecodeError> {
    let n = r.count(min_elem)?;
    if n > super::MAX_BATCH_OPS {
        return Err(DecodeError::BadTag {
            what: "batch length",
            tag: 0,
        });
    }
    Ok(n)
}

fn dec_ttl(r: &mut R<'_>) -> Result<Ttl, DecodeError> {
    Ok(match r.u8()? {
        0 => Ttl::Clear,
        1 => Ttl::Keep,
        2 => Ttl::At(r.u64()?),
        tag => return Err(DecodeError::BadTag { what: "ttl", tag }),
    })
}

fn dec_cond(r: &mut R<'_>) -> Result<Cond, DecodeError> {
    Ok(match r.u8()? {
        0 => Cond::Always,
        1 => Cond::IfAbsent,
        2 => Cond::IfPresent,
        tag => return Err(DecodeError::BadTag { what: "cond", tag }),
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
            expires: (r.u64()?, r.u64()?),
            persist: r.u8()?,
            durable_seq: r.u64()?,
            incarnation: r.u64()?,
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
        13 => Reply::Modified {
            value: match r.bool()? {
                true => Some(r.bytes()?),
                false => None,
            },
            len: r.u64()?,
        },
        14 => Reply::Refused(String::from_utf8_lossy(&r.bytes()?).into_owned()),
        16 => Reply::Changed,
        15 => {
            let n = batch_len(r, 1)?;
            let mut replies = Vec::with_capacity(n);
            for _ in 0..n {
                let reply = dec_reply(r)?;
                if matches!(reply, Reply::Batch(_)) {
                    return Err(DecodeError::BadTag {
                        what: "batched reply",
                        tag: 15,
                    });
                }
                replies.push(reply);
            }
            Reply::Batch(replies)
        }
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
            data: r.value()?,
            deadline: r.u64()?,
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
        6 => Effect::Retime {
            offset: r.u64()?,
            key: r.bytes()?,
            version: r.u64()?,
            deadline: r.u64()?,
        },
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
        18 => StoreError::BatchTooLarge {
            ops: r.u64()?,
            len: r.u64()?,
            max: r.u64()?,
        },
        tag => return Err(DecodeError::BadTag { what: "error", tag }),
    })
}
