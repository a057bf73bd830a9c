//! The node's batches ([`Op::Batch`], `image_batch.rs`) through the test
//! harness of `tests.rs`.

use super::*;
use crate::proto::{Bytes, Modify};

/// A put of `v` at `k`.
fn put(k: &[u8], v: &[u8], cond: Cond) -> Op {
    Op::Put {
        key: k.to_vec(),
        data: Bytes::copy_from_slice(v),
        cond,
        ttl: crate::proto::Ttl::Clear,
    }
}

/// A put of `v` at `k` with the deadline `ttl` says.
fn put_ttl(k: &[u8], v: &[u8], ttl: crate::proto::Ttl) -> Op {
    Op::Put {
        key: k.to_vec(),
        data: Bytes::copy_from_slice(v),
        cond: Cond::Always,
        ttl,
    }
}

/// Node 1's answer to a get of `key`: its value, or `None` if absent.
fn get(h: &mut H, key: &[u8]) -> Option<Vec<u8>> {
    match h.request(Op::Get { key: key.to_vec() }) {
        Ok(Reply::Value { data, .. }) => Some(data),
        Ok(Reply::NoKey) => None,
        r => panic!("{r:?}"),
    }
}

/// The harness's wall clock (Unix milliseconds), as the nodes read it.
fn now(h: &H) -> u64 {
    CLOCK_ORIGIN_MS + h.t / 1000
}

/// A read-modify-write of `k`.
fn m(k: &[u8], how: Modify) -> Op {
    Op::Modify {
        key: k.to_vec(),
        how,
    }
}

/// Issue 32 (`MSET`, `MSETNX`): a batch's writes are planned in order,
/// each seeing the ones before it (a value moved to a larger allocation,
/// a key created then appended to, removed, a counter counted twice), and
/// replicated as **one** write (one sequence number, on both nodes). A
/// batch that fails (a bad key part-way, a replicated write larger than a
/// frame) is an error that leaves the planner's state exactly as it was;
/// under `all_or_none` a failed condition makes it a write without effects.
#[test]
fn a_batch_is_one_write_and_a_failed_one_leaves_nothing() {
    let mut h = H::new();
    h.redundant();
    let get = |h: &mut H, key: &[u8]| match h.request(Op::Get { key: key.to_vec() }) {
        Ok(Reply::Value { data, .. }) => Some(data),
        _ => None,
    };
    h.request(put(b"a", b"1", Cond::Always)).unwrap();
    h.request(put(b"gone", b"x", Cond::Always)).unwrap();
    let seq = h.node(1).status().applied_seq;
    let batch = Op::Batch {
        ops: vec![
            put(b"a", &[7; 300], Cond::Always),
            put(b"b", b"x", Cond::IfAbsent),
            m(b"b", Modify::Append(b"y".to_vec())),
            Op::Remove {
                key: b"gone".to_vec(),
            },
            put(b"gone", b"back", Cond::IfAbsent),
            m(b"n", Modify::IncrBy(5)),
            m(b"n", Modify::IncrBy(1)),
            put(b"a", b"short", Cond::IfPresent),
        ],
        all_or_none: false,
    };
    let Ok(Reply::Batch(replies)) = h.request(batch) else {
        panic!("not a batch reply")
    };
    let kinds: Vec<String> = replies
        .iter()
        .map(|r| match r {
            Reply::Stored { created, .. } => format!("stored {created}"),
            Reply::Modified { value, len } => {
                format!("{:?} {len}", value.as_deref().map(String::from_utf8_lossy))
            }
            Reply::Removed { existed } => format!("removed {existed}"),
            r => format!("{r:?}"),
        })
        .collect();
    assert_eq!(
        kinds,
        [
            "stored false",
            "stored true",
            "None 2",
            "removed true",
            "stored true",
            "Some(\"5\") 1",
            "Some(\"6\") 1",
            "stored false"
        ]
    );
    // One write, on both nodes.
    assert_eq!(h.node(1).status().applied_seq, seq + 1);
    assert_eq!(h.node(2).status().applied_seq, seq + 1);
    assert_eq!(get(&mut h, b"a"), Some(b"short".to_vec()));
    assert_eq!(get(&mut h, b"b"), Some(b"xy".to_vec()));
    assert_eq!(get(&mut h, b"gone"), Some(b"back".to_vec()));
    assert_eq!(get(&mut h, b"n"), Some(b"6".to_vec()));
    assert_eq!(h.node(1).status().keys, 4);
    assert_eq!(h.node(2).status().keys, 4);
    assert_eq!(h.node(1).status().allocated, h.node(2).status().allocated);

    // Failures leave the planner's state exactly as it was.
    let before = h.node(1).image.planner_state();
    let seq = h.node(1).status().applied_seq;
    let bad_key = Op::Batch {
        ops: vec![
            put(b"e", b"1", Cond::Always),
            Op::Remove { key: b"a".to_vec() },
            m(b"n", Modify::IncrBy(1)),
            put(b"", b"1", Cond::Always),
        ],
        all_or_none: false,
    };
    assert!(matches!(
        h.request(bad_key),
        Err(StoreError::BadKey { len: 0, .. })
    ));
    assert!(
        h.node(1).image.planner_state() == before,
        "a failed batch left changes"
    );
    // More writes than a batch holds (its bytes are bounded by what one
    // message carries, 129 MiB, more than this arena).
    let big: Vec<Op> = (0..=crate::proto::MAX_BATCH_OPS as u16)
        .map(|i| put(&i.to_le_bytes(), b"v", Cond::Always))
        .collect();
    assert!(matches!(
        h.request(Op::Batch {
            ops: big,
            all_or_none: false
        }),
        Err(StoreError::BatchTooLarge { ops: 1025, .. })
    ));
    assert!(
        h.node(1).image.planner_state() == before,
        "a batch too large left changes"
    );
    assert_eq!(
        h.node(1).status().applied_seq,
        seq,
        "a failed batch was replicated"
    );
    assert_eq!(get(&mut h, b"e"), None);
    assert_eq!(get(&mut h, b"a"), Some(b"short".to_vec()));

    // all_or_none: the second key exists, so nothing is stored.
    let nx = Op::Batch {
        ops: vec![
            put(b"d", b"1", Cond::IfAbsent),
            put(b"b", b"1", Cond::IfAbsent),
            put(b"f", b"1", Cond::IfAbsent),
        ],
        all_or_none: true,
    };
    let Ok(Reply::Batch(replies)) = h.request(nx) else {
        panic!("not a batch reply")
    };
    assert!(matches!(
        replies[..],
        [Reply::Stored { .. }, Reply::NotStored]
    ));
    assert_eq!(get(&mut h, b"d"), None);
    assert!(
        h.node(1).image.planner_state() == before,
        "an undone batch left changes"
    );
    let nx = Op::Batch {
        ops: vec![
            put(b"d", b"1", Cond::IfAbsent),
            put(b"f", b"2", Cond::IfAbsent),
        ],
        all_or_none: true,
    };
    assert!(matches!(h.request(nx), Ok(Reply::Batch(r)) if r.len() == 2));
    assert_eq!(get(&mut h, b"d"), Some(b"1".to_vec()));
    assert_eq!(get(&mut h, b"f"), Some(b"2".to_vec()));
    assert_eq!(
        h.node(2).status().applied_seq,
        h.node(1).status().applied_seq
    );
}

/// `WATCH`'s check (`Modify::Unchanged`) in a batch: the version of the
/// key's latest write (or absent) as seen before passes and changes
/// nothing; a write since makes the whole batch a write without effects,
/// answered `Changed`; `Peek` reads the value as of its place in the batch.
#[test]
fn an_unchanged_check_undoes_the_batch_when_the_key_was_written() {
    let mut h = H::new();
    h.redundant();
    let version = |h: &mut H, key: &[u8]| match h.request(Op::Get { key: key.to_vec() }) {
        Ok(Reply::Value { version, .. }) => Some(version),
        _ => None,
    };
    let put = |v: &[u8]| Op::Put {
        key: b"w".to_vec(),
        data: Bytes::copy_from_slice(v),
        cond: Cond::Always,
        ttl: crate::proto::Ttl::Clear,
    };
    let check = |version| Op::Modify {
        key: b"w".to_vec(),
        how: Modify::Unchanged { version },
    };
    let peek = Op::Modify {
        key: b"w".to_vec(),
        how: Modify::Peek,
    };
    // Absent, and still absent: the batch runs; the peek sees its put.
    let ok = h.request(Op::Batch {
        ops: vec![check(None), put(b"1"), peek.clone()],
        all_or_none: false,
    });
    let Ok(Reply::Batch(r)) = ok else {
        panic!("{ok:?}")
    };
    assert_eq!(
        r[2],
        Reply::Modified {
            value: Some(b"1".to_vec()),
            len: 1
        }
    );
    let v1 = version(&mut h, b"w");
    assert!(v1.is_some());
    // Written since (even with the same value): undone.
    h.request(put(b"1")).unwrap();
    let seq = h.node(1).status().applied_seq;
    let undone = h.request(Op::Batch {
        ops: vec![check(v1), put(b"2")],
        all_or_none: false,
    });
    assert_eq!(undone, Ok(Reply::Batch(vec![Reply::Changed])));
    assert_eq!(
        h.node(1).status().applied_seq,
        seq + 1,
        "replicated, without effects"
    );
    let Ok(Reply::Value { data, .. }) = h.request(Op::Get { key: b"w".to_vec() }) else {
        panic!("gone")
    };
    assert_eq!(data, b"1");
    // The current version passes.
    let v2 = version(&mut h, b"w");
    assert_ne!(v1, v2);
    let ok = h.request(Op::Batch {
        ops: vec![check(v2), put(b"3")],
        all_or_none: false,
    });
    assert!(matches!(&ok, Ok(Reply::Batch(r)) if r.len() == 2), "{ok:?}");
}

/// Issue 32, expiry's first layer: a key's deadline lives in its object
/// (header bytes 42..48) and in the replicated `Effect::Write`. A
/// read-modify-write keeps it (Redis's `INCR`, `APPEND` and `SETRANGE`
/// keep a TTL), also inside a batch; a put or a swap (`SET`, `GETSET`)
/// clears it. The deadline is set here through a replicated write's
/// effect, as a secondary applies the primary's.
#[test]
fn a_read_modify_write_keeps_the_deadline_and_a_put_clears_it() {
    use crate::proto::RepOp;
    const D: u64 = 1_800_000_000_000;
    let arena = crate::ptr::ArenaRef {
        base: 0x7e00_0000_0000,
        len: 1 << 20,
        stag: 1,
    };
    let mut img = Image::new(arena, HeapMemory::new(1 << 20));
    img.format(16);
    let mut seq = 0;
    let mut run = |img: &mut Image<HeapMemory>, op: Op, set: Option<u64>| {
        let (mut effects, reply) = img.plan_write(&op).unwrap();
        let mut deadlines = Vec::new();
        for e in &mut effects {
            if let Effect::Write { deadline, .. } = e {
                if let Some(d) = set {
                    *deadline = d;
                }
                deadlines.push(*deadline);
            }
        }
        seq += 1;
        let rep = RepOp {
            client: 1,
            req_id: seq,
            effects,
            reply,
        };
        img.apply(seq, &rep, false).unwrap();
        deadlines
    };
    let put = |v: &[u8]| Op::Put {
        key: b"k".to_vec(),
        data: Bytes::copy_from_slice(v),
        cond: Cond::Always,
        ttl: crate::proto::Ttl::Clear,
    };
    let m = |how| Op::Modify {
        key: b"k".to_vec(),
        how,
    };
    let deadline = |img: &Image<HeapMemory>| match img.get_key(b"k").unwrap() {
        Reply::Value { ptr, .. } => {
            let off = ptr.addr - arena.base;
            object::read_object(img.memory(), off, ptr.len as u64)
                .unwrap()
                .deadline
        }
        r => panic!("{r:?}"),
    };
    assert_eq!(run(&mut img, put(b"1"), Some(D)), [D]);
    assert_eq!(deadline(&img), D, "in the header");
    assert_eq!(run(&mut img, m(Modify::IncrBy(2)), None), [D]);
    assert_eq!(run(&mut img, m(Modify::Append(vec![b'0'; 300])), None), [D]);
    assert_eq!(deadline(&img), D, "kept when the value moved");
    let batch = Op::Batch {
        ops: vec![
            m(Modify::SetRange {
                offset: 0,
                data: b"9".to_vec(),
            }),
            m(Modify::Append(b"1".to_vec())),
        ],
        all_or_none: false,
    };
    assert_eq!(run(&mut img, batch, None), [D, D]);
    assert_eq!(
        run(
            &mut img,
            m(Modify::Swap {
                data: Bytes::from_static(b"s"),
                cond: Cond::Always,
                ttl: crate::proto::Ttl::Clear,
            }),
            None
        ),
        [0]
    );
    assert_eq!(deadline(&img), 0, "a swap clears it");
    assert_eq!(run(&mut img, put(b"2"), Some(D)), [D]);
    assert_eq!(run(&mut img, put(b"3"), None), [0]);
    assert_eq!(deadline(&img), 0, "a put clears it");
}

/// Issue 32, expiry's second layer: the primary decides expiry by its
/// clock (`NodeConfig::clock_origin_ms` plus its time). `Modify::Expire`
/// sets, keeps or clears a deadline as Redis's `EXPIRE ... NX|XX|GT|LT`
/// and `PERSIST` do; a `SET` with a TTL is a batch of a put and an expire
/// (one write); once the deadline passes the key is absent to a get, a
/// condition (`SETNX` succeeds), a counter (`INCR` starts from 0, without
/// the old deadline) and `DEL` (0); a deadline already past removes it.
#[test]
fn keys_expire_by_the_primarys_clock() {
    use crate::proto::ExpireWhen;
    let mut h = H::new();
    h.redundant();
    let expire = |k: &[u8], at, when| m(k, Modify::Expire { at, when });
    let changed = |r: Result<Reply, StoreError>| match r {
        Ok(Reply::Modified { len, .. }) => len,
        r => panic!("{r:?}"),
    };
    // SET k v PX 5000 as one write.
    let at = now(&h) + 5_000;
    let r = h.request(Op::Batch {
        ops: vec![
            put(b"k", b"v", Cond::Always),
            expire(b"k", at, ExpireWhen::Always),
        ],
        all_or_none: false,
    });
    assert!(matches!(r, Ok(Reply::Batch(_))), "{r:?}");
    // NX refuses (it has one), GT with an earlier one refuses, LT with a
    // later one refuses, XX to the same is a change.
    assert_eq!(
        changed(h.request(expire(b"k", at + 5, ExpireWhen::IfNone))),
        0
    );
    assert_eq!(
        changed(h.request(expire(b"k", at - 5, ExpireWhen::IfLater))),
        0
    );
    assert_eq!(
        changed(h.request(expire(b"k", at + 5, ExpireWhen::IfEarlier))),
        0
    );
    assert_eq!(changed(h.request(expire(b"k", at, ExpireWhen::IfSet))), 1);
    // A missing key cannot get one.
    assert_eq!(
        changed(h.request(expire(b"none", at, ExpireWhen::Always))),
        0
    );
    h.request(put(b"n", b"1", Cond::Always)).unwrap();
    // No deadline is an infinite one: GT refuses, LT sets it.
    assert_eq!(changed(h.request(expire(b"n", at, ExpireWhen::IfLater))), 0);
    assert_eq!(
        changed(h.request(expire(b"n", at, ExpireWhen::IfEarlier))),
        1
    );
    assert_eq!(get(&mut h, b"k"), Some(b"v".to_vec()));
    // PERSIST on a key with a deadline; then on one without.
    h.request(put(b"p", b"x", Cond::Always)).unwrap();
    assert_eq!(changed(h.request(expire(b"p", at, ExpireWhen::Always))), 1);
    assert_eq!(changed(h.request(expire(b"p", 0, ExpireWhen::IfSet))), 1);
    assert_eq!(changed(h.request(expire(b"p", 0, ExpireWhen::IfSet))), 0);
    // Past the deadline: absent to everything, kept for nothing.
    h.run(5_000_000, &never);
    assert!(now(&h) > at);
    assert_eq!(get(&mut h, b"k"), None);
    assert_eq!(get(&mut h, b"p"), Some(b"x".to_vec()), "persisted");
    assert!(matches!(
        h.request(put(b"k", b"again", Cond::IfAbsent)),
        Ok(Reply::Stored { .. })
    ));
    assert_eq!(
        get(&mut h, b"k"),
        Some(b"again".to_vec()),
        "no deadline now"
    );
    let r = h.request(m(b"n", Modify::IncrBy(5)));
    assert!(
        matches!(&r, Ok(Reply::Modified { value: Some(v), .. }) if v == b"5"),
        "INCR of an expired key starts from 0: {r:?}"
    );
    // A deadline already past removes the key; DEL of an expired key is 0.
    assert_eq!(
        changed(h.request(expire(b"p", now(&h) - 1, ExpireWhen::Always))),
        1
    );
    assert_eq!(get(&mut h, b"p"), None);
    h.request(put(b"d", b"x", Cond::Always)).unwrap();
    assert_eq!(
        changed(h.request(expire(b"d", now(&h) + 10, ExpireWhen::Always))),
        1
    );
    h.run(50_000, &never);
    assert!(matches!(
        h.request(Op::Remove { key: b"d".to_vec() }),
        Ok(Reply::Removed { existed: false })
    ));
    // Both nodes hold the same.
    assert_eq!(
        h.node(1).status().applied_seq,
        h.node(2).status().applied_seq
    );
}

/// Issue 32 (`SET ... EX|PXAT|KEEPTTL`, `SETEX`, `TTL`): a put sets, keeps
/// or clears the key's deadline in the same write; `Modify::Deadline`
/// answers it (absent once expired); a deadline out of the header's range
/// is refused without effects; `XX LT` needs a deadline and an earlier one.
#[test]
fn a_put_sets_keeps_or_clears_the_deadline_in_one_write() {
    use crate::proto::{ExpireWhen, Ttl};
    let mut h = H::new();
    h.redundant();
    let deadline = |h: &mut H, k: &[u8]| match h.request(m(k, Modify::Deadline)) {
        Ok(Reply::Modified { len, value: None }) => Some(len),
        Ok(Reply::NoKey) => None,
        r => panic!("{r:?}"),
    };
    let at = now(&h) + 10_000;
    let seq = h.node(1).status().applied_seq;
    h.request(put_ttl(b"k", b"v1", Ttl::At(at))).unwrap();
    assert_eq!(h.node(1).status().applied_seq, seq + 1, "one write");
    assert_eq!(deadline(&mut h, b"k"), Some(at));
    // KEEPTTL keeps it (also when the value moves to a larger allocation).
    h.request(put_ttl(b"k", &[7u8; 500], Ttl::Keep)).unwrap();
    assert_eq!(deadline(&mut h, b"k"), Some(at));
    // A plain put clears it; KEEPTTL of a key without one keeps none.
    h.request(put(b"k", b"v3", Cond::Always)).unwrap();
    assert_eq!(deadline(&mut h, b"k"), Some(0));
    h.request(put_ttl(b"k", b"v4", Ttl::Keep)).unwrap();
    assert_eq!(deadline(&mut h, b"k"), Some(0));
    assert_eq!(deadline(&mut h, b"none"), None);
    // SET ... GET with a deadline: the old value, and the new deadline.
    let r = h.request(m(
        b"k",
        Modify::Swap {
            data: Bytes::from_static(b"v5"),
            cond: Cond::Always,
            ttl: Ttl::At(at + 1),
        },
    ));
    assert!(
        matches!(&r, Ok(Reply::Modified { value: Some(v), .. }) if v == b"v4"),
        "{r:?}"
    );
    assert_eq!(deadline(&mut h, b"k"), Some(at + 1));
    // Out of range: refused, nothing changed.
    for bad in [0, crate::object::MAX_DEADLINE + 1] {
        let seq = h.node(1).status().applied_seq;
        let r = h.request(put_ttl(b"k", b"bad", Ttl::At(bad)));
        assert!(matches!(&r, Ok(Reply::Refused(_))), "{r:?}");
        assert_eq!(deadline(&mut h, b"k"), Some(at + 1));
        assert!(h.node(1).status().applied_seq > seq, "ordered like a write");
    }
    // XX LT: only with a deadline, and only an earlier one.
    h.request(put(b"n", b"1", Cond::Always)).unwrap();
    let xx_lt = |k: &[u8], at| {
        m(
            k,
            Modify::Expire {
                at,
                when: ExpireWhen::IfSetAndEarlier,
            },
        )
    };
    assert!(matches!(
        h.request(xx_lt(b"n", at)),
        Ok(Reply::Modified { len: 0, .. })
    ));
    assert_eq!(deadline(&mut h, b"n"), Some(0));
    assert!(matches!(
        h.request(xx_lt(b"k", at + 2)),
        Ok(Reply::Modified { len: 0, .. })
    ));
    assert!(matches!(
        h.request(xx_lt(b"k", at)),
        Ok(Reply::Modified { len: 1, .. })
    ));
    assert_eq!(deadline(&mut h, b"k"), Some(at));
    // A put whose deadline has passed stores a key nobody sees.
    let past = now(&h) - 1;
    h.request(put_ttl(b"gone", b"x", Ttl::At(past))).unwrap();
    assert_eq!(deadline(&mut h, b"gone"), None);
    // Expired: absent to Deadline, and KEEPTTL does not revive its deadline.
    h.run(11_000_000, &never);
    assert_eq!(deadline(&mut h, b"k"), None);
    h.request(put_ttl(b"k", b"v6", Ttl::Keep)).unwrap();
    assert_eq!(deadline(&mut h, b"k"), Some(0));
    assert_eq!(
        h.node(1).status().applied_seq,
        h.node(2).status().applied_seq
    );
}

/// Issue 32 ("expired keys are reclaimed without a full scan"): both
/// nodes keep the keys with a deadline in order as they apply writes; once
/// the primary's clock passes a deadline it removes the key as its own
/// replicated write (`Modify::Reap`), so expired keys leave the index and
/// free their space on both nodes, while keys rewritten without a deadline
/// (or with a later one) and keys without one stay.
#[test]
fn expired_keys_are_reclaimed_by_the_primary_without_a_scan() {
    use crate::proto::Ttl;
    let mut h = H::new();
    h.redundant();
    // (Each request below runs the harness for 20 ms.)
    let at = now(&h) + 10_000;
    for i in 0..40u32 {
        h.request(put_ttl(
            format!("t{i}").as_bytes(),
            &[1u8; 200],
            Ttl::At(at),
        ))
        .unwrap();
    }
    for i in 0..10u32 {
        h.request(put(format!("p{i}").as_bytes(), b"v", Cond::Always))
            .unwrap();
    }
    // One rewritten without a deadline, one given a later one.
    h.request(put(b"t0", b"kept", Cond::Always)).unwrap();
    h.request(put_ttl(b"t1", &[1u8; 200], Ttl::At(at + 1_000_000)))
        .unwrap();
    for n in [1, 2] {
        assert_eq!(h.node(n).keys_with_deadlines(), 39, "node {n}");
        assert_eq!(h.node(n).status().keys, 50, "node {n}");
    }
    let allocated = h.node(1).status().allocated;
    assert!(now(&h) < at, "the writes took too long for the test");
    // Past the deadline: reclaimed.
    h.run((at + 100 - now(&h)) * 1000, &never);
    for n in [1, 2] {
        let s = h.node(n).status();
        assert_eq!(s.keys, 12, "node {n}: {s:?}");
        assert_eq!(h.node(n).keys_with_deadlines(), 1, "node {n}");
        assert!(s.allocated < allocated, "node {n}: space freed");
    }
    assert_eq!(
        h.node(1).status().applied_seq,
        h.node(2).status().applied_seq
    );
    assert_eq!(get(&mut h, b"t0"), Some(b"kept".to_vec()));
    assert!(get(&mut h, b"t1").is_some());
    assert_eq!(get(&mut h, b"t2"), None);
    assert_eq!(get(&mut h, b"p3"), Some(b"v".to_vec()));
}

/// Issue 32: a change of deadline (`EXPIRE`, `PERSIST`) replicates no
/// value bytes: one `Effect::Retime` that rewrites the object's header in
/// place (its version too, so `WATCH` sees it), the value untouched. The
/// planner sees a retime over the write before it, whether that write is
/// still unexposed, earlier in the same batch, or in the arena.
#[test]
fn a_change_of_deadline_rewrites_only_the_header() {
    use crate::proto::{ExpireWhen, RepOp};
    const D: u64 = 1_800_000_000_000;
    let arena = crate::ptr::ArenaRef {
        base: 0x7e00_0000_0000,
        len: 1 << 20,
        stag: 1,
    };
    let mut img = Image::new(arena, HeapMemory::new(1 << 20));
    img.format(16);
    img.set_wall_ms(CLOCK_ORIGIN_MS);
    let big = vec![9u8; 20_000];
    let mut seq = 0;
    // Plans `op` and stages it (unexposed, as a primary's write before it
    // commits); its effects and reply.
    let mut stage = |img: &mut Image<HeapMemory>, op: Op| {
        let (effects, reply) = img.plan_write(&op).unwrap();
        seq += 1;
        let rep = RepOp {
            client: 1,
            req_id: seq,
            effects: effects.clone(),
            reply: reply.clone(),
        };
        img.stage(seq, rep).unwrap();
        (effects, reply, seq)
    };
    let expire = |at, when| m(b"k", Modify::Expire { at, when });
    let deadline_of = |img: &mut Image<HeapMemory>| -> Option<u64> {
        match img.plan_write(&m(b"k", Modify::Deadline)).unwrap().1 {
            Reply::Modified { len, .. } => Some(len),
            _ => None,
        }
    };
    stage(&mut img, put(b"k", &big, Cond::Always));
    // Over an unexposed write.
    let (effects, reply, s2) = stage(&mut img, expire(D, ExpireWhen::Always));
    assert!(matches!(reply, Reply::Modified { len: 1, .. }), "{reply:?}");
    assert!(
        matches!(&effects[..], [Effect::Retime { deadline: D, version, key, .. }]
            if *version == s2 && key == b"k"),
        "{effects:?}"
    );
    assert_eq!(deadline_of(&mut img), Some(D));
    let peek = img.plan_write(&m(b"k", Modify::Peek)).unwrap().1;
    assert!(matches!(&peek, Reply::Modified { value: Some(v), .. } if *v == big));
    // In the arena: the value as it was, the header retimed.
    img.expose(s2);
    let Reply::Value {
        ptr, data, version, ..
    } = img.get_key(b"k").unwrap()
    else {
        panic!("k is gone")
    };
    assert_eq!((data, version), (big.clone(), s2));
    let o = object::read_object(img.memory(), ptr.addr - arena.base, ptr.len as u64).unwrap();
    assert_eq!(o.deadline, D);
    // PERSIST over the arena's object; then a batch: a put, an expire of
    // what it wrote, a read of both.
    let (effects, _, _) = stage(&mut img, expire(0, ExpireWhen::IfSet));
    assert!(matches!(&effects[..], [Effect::Retime { deadline: 0, .. }]));
    assert_eq!(deadline_of(&mut img), Some(0));
    let (_, reply, last) = stage(
        &mut img,
        Op::Batch {
            ops: vec![
                put(b"k", b"small", Cond::Always),
                expire(D + 1, ExpireWhen::Always),
                m(b"k", Modify::Peek),
                m(b"k", Modify::Deadline),
            ],
            all_or_none: false,
        },
    );
    let Reply::Batch(r) = reply else {
        panic!("{reply:?}")
    };
    assert!(matches!(&r[2], Reply::Modified { value: Some(v), .. } if v == b"small"));
    assert!(matches!(&r[3], Reply::Modified { len, .. } if *len == D + 1));
    img.expose(last);
    assert_eq!(deadline_of(&mut img), Some(D + 1));
}
