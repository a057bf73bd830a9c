//! The codec's properties: every message survives a round trip, and garbage,
//! truncated or mutated bytes are errors, never panics.

use super::*;
use proptest::prelude::*;

fn ptr() -> impl Strategy<Value = RemotePtr> {
    (any::<u64>(), any::<u32>(), any::<u32>(), any::<u64>()).prop_map(|(addr, stag, len, gen)| {
        RemotePtr {
            addr,
            stag,
            len,
            gen,
        }
    })
}

fn bytes() -> impl Strategy<Value = Vec<u8>> {
    prop::collection::vec(any::<u8>(), 0..40)
}

pub(crate) fn reply() -> impl Strategy<Value = Reply> {
    prop_oneof![
        4 => plain_reply(),
        1 => prop::collection::vec(plain_reply(), 0..4).prop_map(Reply::Batch),
    ]
}

fn plain_reply() -> impl Strategy<Value = Reply> {
    prop_oneof![
        (any::<Option<Vec<u8>>>(), any::<u64>())
            .prop_map(|(value, len)| Reply::Modified { value, len }),
        "[a-z é]{0,12}".prop_map(Reply::Refused),
        Just(Reply::Changed),
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
            .prop_map(
                |(node, role, epoch, redundant, x)| Reply::Status(StatusInfo {
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
                    expires: (x / 17, x / 3),
                    persist: role % 3,
                    durable_seq: x / 19,
                    incarnation: x / 23,
                })
            ),
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
        (any::<u64>(), any::<u64>(), any::<u64>())
            .prop_map(|(ops, len, max)| StoreError::BatchTooLarge { ops, len, max }),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => plain_op(),
        1 => (
            prop::collection::vec(plain_op(), 0..4),
            any::<bool>()
        )
            .prop_map(|(ops, all_or_none)| Op::Batch {
                // Keyed writes only (others are refused by the decoder).
                ops: ops
                    .into_iter()
                    .map(|op| match op {
                        Op::Put { .. } | Op::Remove { .. } | Op::Modify { .. } => op,
                        _ => Op::Remove { key: vec![1] },
                    })
                    .collect(),
                all_or_none,
            }),
    ]
}

fn plain_op() -> impl Strategy<Value = Op> {
    prop_oneof![
        bytes().prop_map(|data| Op::Insert { data: data.into() }),
        (ptr(), bytes()).prop_map(|(ptr, data)| Op::Update {
            ptr,
            data: data.into()
        }),
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
            ],
            ttl()
        )
            .prop_map(|(key, data, cond, ttl)| Op::Put {
                key,
                data: data.into(),
                cond,
                ttl
            }),
        bytes().prop_map(|key| Op::Get { key }),
        bytes().prop_map(|key| Op::Remove { key }),
        (any::<u64>(), any::<u32>(), bytes()).prop_map(|(cursor, count, pattern)| Op::Scan {
            cursor,
            count,
            pattern
        }),
        any::<u32>().prop_map(|stag| Op::RotateStag { stag }),
        (
            bytes(),
            prop_oneof![
                any::<i64>().prop_map(Modify::IncrBy),
                bytes().prop_map(Modify::Append),
                (any::<u64>(), bytes())
                    .prop_map(|(offset, data)| Modify::SetRange { offset, data }),
                (bytes(), any::<bool>(), ttl()).prop_map(|(data, nx, ttl)| Modify::Swap {
                    data: data.into(),
                    cond: if nx { Cond::IfAbsent } else { Cond::Always },
                    ttl
                }),
                Just(Modify::Take),
                bytes().prop_map(Modify::IncrByFloat),
                Just(Modify::Peek),
                any::<Option<u64>>().prop_map(|version| Modify::Unchanged { version }),
                (any::<u64>(), 0u8..6).prop_map(|(at, w)| Modify::Expire {
                    at,
                    when: [
                        ExpireWhen::Always,
                        ExpireWhen::IfNone,
                        ExpireWhen::IfSet,
                        ExpireWhen::IfLater,
                        ExpireWhen::IfEarlier,
                        ExpireWhen::IfSetAndEarlier,
                    ][w as usize],
                }),
                Just(Modify::Deadline),
                Just(Modify::Reap),
            ]
        )
            .prop_map(|(key, how)| Op::Modify { key, how }),
    ]
}

fn ttl() -> impl Strategy<Value = Ttl> {
    prop_oneof![
        Just(Ttl::Clear),
        Just(Ttl::Keep),
        any::<u64>().prop_map(Ttl::At)
    ]
}

pub(crate) fn effect() -> impl Strategy<Value = Effect> {
    prop_oneof![
        (any::<u64>(), any::<u64>()).prop_map(|(offset, len)| Effect::Alloc { offset, len }),
        (any::<u64>(), any::<u64>(), bytes(), bytes()).prop_map(|(offset, version, key, data)| {
            Effect::Write {
                offset,
                version,
                generation: version / 3,
                key,
                data: data.into(),
                deadline: version / 5,
            }
        }),
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
        (any::<u64>(), bytes(), any::<u64>(), any::<u64>()).prop_map(
            |(offset, key, version, deadline)| Effect::Retime {
                offset,
                key,
                version,
                deadline
            }
        ),
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
        (any::<u32>(), any::<u64>(), any::<u64>()).prop_map(|(node, incarnation, arena_len)| {
            Body::Join {
                member: Member { node, incarnation },
                arena_len,
            }
        }),
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
        (
            any::<u32>(),
            any::<u64>(),
            any::<u64>(),
            any::<u64>(),
            any::<bool>(),
            any::<bool>()
        )
            .prop_map(|(node, incarnation, epoch, seq, campaigns, loading)| {
                Body::Standing {
                    member: Member { node, incarnation },
                    epoch,
                    seq,
                    campaigns,
                    loading,
                }
            }),
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

    /// A shared decode gives the same message, every value in it a slice
    /// of the buffer it came in (no copy), and the encoding has room for
    /// its values from the start.
    #[test]
    fn shared_decode_borrows_values(epoch in any::<u64>(), body in body()) {
        let env = Envelope { epoch, body };
        let bytes = Bytes::from(encode(&env));
        let (lo, hi) = (bytes.as_ptr() as usize, bytes.as_ptr() as usize + bytes.len());
        let got = decode_shared(bytes.clone()).unwrap();
        prop_assert_eq!(&got, &env);
        let inside = |d: &Bytes| d.is_empty() || (d.as_ptr() as usize >= lo && d.as_ptr() as usize + d.len() <= hi);
        let mut values = Vec::new();
        let mut ops = Vec::new();
        match &got.body {
            Body::Request { op, .. } => ops.push(op),
            Body::Replicate { op, .. } => {
                for e in &op.effects {
                    if let Effect::Write { data, .. } = e {
                        values.push(data);
                    }
                }
            }
            _ => {}
        }
        while let Some(op) = ops.pop() {
            match op {
                Op::Insert { data } | Op::Update { data, .. } | Op::Put { data, .. } => values.push(data),
                Op::Modify { how: Modify::Swap { data, .. }, .. } => values.push(data),
                Op::Batch { ops: inner, .. } => ops.extend(inner),
                _ => {}
            }
        }
        for d in values {
            prop_assert!(inside(d), "a value copied out of the message");
        }
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

/// A large message is encoded into one buffer of about its size: it is
/// not copied again (nor mapped anew by the allocator) because it
/// outgrew the room reserved for it by a few bytes of keys and fields.
#[test]
fn a_large_message_is_encoded_without_growing_its_buffer() {
    let value = Bytes::from(vec![7u8; 1 << 20]);
    let key = vec![b'k'; 1024];
    let write = |offset| Effect::Write {
        offset,
        version: 9,
        generation: 3,
        key: key.clone(),
        data: value.clone(),
        deadline: 5,
    };
    let bodies = [
        Body::Replicate {
            seq: 1,
            op: RepOp {
                client: 1,
                req_id: 2,
                effects: vec![
                    Effect::Alloc {
                        offset: 64,
                        len: 2 << 20,
                    },
                    write(64),
                    write(4 << 20),
                ],
                reply: Reply::NotStored,
            },
        },
        Body::Request {
            client: 1,
            req_id: 2,
            op: Op::Put {
                key: key.clone(),
                data: value.clone(),
                cond: Cond::Always,
                ttl: Ttl::Clear,
            },
        },
    ];
    for body in bodies {
        let v = encode(&Envelope { epoch: 4, body });
        assert!(
            v.capacity() - v.len() <= 4096,
            "{} bytes in a buffer of {}",
            v.len(),
            v.capacity()
        );
    }
}

/// `encode_gather`'s pieces make `encode`'s bytes, at every value length
/// around the threshold, with fields between and after the values, into a
/// reused buffer; the values over [`GATHER_MIN`] (at most [`GATHER_MAX`]
/// of them) are the values' own bytes, not copies.
#[test]
fn a_gathered_message_is_the_encoded_message_with_its_large_values_in_place() {
    let mut buf = vec![0xa5u8; 3 << 20];
    for n in [0, 1, GATHER_MIN - 1, GATHER_MIN, GATHER_MIN + 1, 1 << 20] {
        for values in [1, 2, GATHER_MAX + 2] {
            let value = Bytes::from((0..n).map(|i| (i * 31 + n) as u8).collect::<Vec<u8>>());
            let write = |i: usize| Effect::Write {
                offset: 64 + (i as u64) * (4 << 20),
                version: 9,
                generation: 3,
                key: format!("key {i}").into_bytes(),
                data: value.clone(),
                deadline: 5,
            };
            let env = Envelope {
                epoch: 4,
                body: Body::Replicate {
                    seq: 1,
                    op: RepOp {
                        client: 1,
                        req_id: 2,
                        effects: (0..values).map(write).collect(),
                        reply: Reply::NotStored,
                    },
                },
            };
            let pieces = encode_gather(&env, std::mem::take(&mut buf));
            let joined: Vec<u8> = pieces.iter().flat_map(|p| p.bytes()).copied().collect();
            assert!(
                joined == encode(&env),
                "{values} values of {n} bytes: the pieces differ"
            );
            let shared: Vec<&Bytes> = pieces
                .iter()
                .filter_map(|p| match p {
                    Piece::Shared(b) => Some(b),
                    Piece::Own(_) => None,
                })
                .collect();
            let want = if n > GATHER_MIN {
                values.min(GATHER_MAX)
            } else {
                0
            };
            assert_eq!(shared.len(), want, "{values} values of {n} bytes");
            assert!(shared
                .iter()
                .all(|b| b.as_ptr() == value.as_ptr() && b.len() == n));
            if let Some(Piece::Own(v)) = pieces.into_iter().next() {
                buf = v;
            }
        }
    }
}
