//! Tests of the key index: the bucket codec and its torn-read detection,
//! and a model check of inserts, updates, deletes and failovers.

use super::*;
use crate::arena::HeapMemory;
use proptest::prelude::*;
use std::collections::BTreeMap;

fn slot(tag: u32, offset: u64) -> Slot {
    Slot {
        tag,
        offset,
        units: 3,
        generation: (offset / 64) as u32,
    }
}

#[test]
fn buckets_round_trip_and_detect_tearing() {
    let mut b = Bucket::empty();
    b.version = 77;
    b.spill = true;
    b.slots[0] = Some(slot(5, 64));
    b.slots[30] = Some(slot(u32::MAX, 64 << 20));
    let bytes = encode_bucket(9, &b);
    assert_eq!(decode_bucket(9, &bytes).unwrap(), b);
    // The checksum covers the bucket number: bytes read at another
    // bucket's place do not pass.
    assert_eq!(
        decode_bucket(10, &bytes),
        Err(IndexError::Torn { bucket: 10 })
    );
    // Any changed byte is caught (a read that raced an edit).
    for i in 0..BUCKET_LEN {
        let mut t = bytes;
        t[i] ^= 0x40;
        assert!(decode_bucket(9, &t).is_err(), "byte {i}");
    }
    // A fresh (zeroed) arena is not an index.
    assert!(decode_bucket(0, &[0u8; BUCKET_LEN]).is_err());
    assert!(decode_bucket(0, &bytes[..100]).is_err());
}

#[test]
fn tags_are_never_zero_and_keys_hash_stably() {
    assert_eq!(tag_of(0), 1);
    assert_ne!(tag_of(u64::MAX), 0);
    // xxh3 of the empty input: the same on every node and client.
    assert_eq!(key_hash(b""), 0x2d06_8005_38d3_94c2);
    assert_ne!(key_hash(b"a"), key_hash(b"b"));
}

#[derive(Debug, Clone)]
enum Step {
    /// Insert or update key `k`.
    Put(u8),
    Delete(u8),
    /// The secondary takes over: from now on the other memory is read
    /// and planned from.
    Failover,
}

fn steps(keys: u8) -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        prop_oneof![
            6 => (0..keys).prop_map(Step::Put),
            3 => (0..keys).prop_map(Step::Delete),
            1 => Just(Step::Failover),
        ],
        1..300,
    )
}

/// Two replicas' index regions and metas, and the objects of the test's
/// "arena" (offset -> key: what an object's header says).
struct World {
    layout: Layout,
    mem: [HeapMemory; 2],
    meta: [Meta; 2],
    primary: usize,
    objects: BTreeMap<u64, Vec<u8>>,
    next_offset: u64,
    seq: u64,
}

impl World {
    fn new(buckets: u64) -> World {
        let layout = Layout::new(0, buckets);
        let mut m = HeapMemory::new(layout.region_len());
        layout.format(&mut m).unwrap();
        World {
            layout,
            mem: [m.clone(), m],
            meta: [Meta::new(layout), Meta::new(layout)],
            primary: 0,
            objects: BTreeMap::new(),
            next_offset: 1 << 20,
            seq: 0,
        }
    }

    /// A one-sided look-up: the bucket bytes, then each candidate's key.
    fn find(&self, key: &[u8]) -> Option<Found> {
        let objects = &self.objects;
        self.layout
            .find(&self.mem[self.primary], key_hash(key), |s| {
                objects.get(&s.offset).is_some_and(|k| k == key)
            })
            .unwrap()
    }

    /// Replication: the primary planned `edits`; both nodes apply them in
    /// sequence order, to their metas and to their arena bytes.
    fn commit(&mut self, key: &[u8], edits: &[Edit], generation: u64) {
        self.seq += 1;
        for n in 0..2 {
            for e in edits {
                self.meta[n].apply(e, key, generation).unwrap();
                self.layout.apply(&mut self.mem[n], e, self.seq).unwrap();
            }
        }
    }

    /// Put: a new object for the key (an update repoints the entry, as an
    /// out-of-place update does).
    fn put(&mut self, key: &[u8]) -> Result<(), IndexError> {
        let offset = self.next_offset;
        self.next_offset += 64 * 3;
        let entry = Slot {
            tag: tag_of(key_hash(key)),
            offset,
            units: 3,
            generation: (offset / 64) as u32,
        };
        let edits = self.meta[self.primary].plan_put(key, entry)?;
        if let Some(f) = self.meta[self.primary].get(key) {
            self.objects.remove(&f.entry.offset);
        }
        self.objects.insert(offset, key.to_vec());
        self.commit(key, &edits, entry.generation as u64);
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) -> bool {
        let Some(e) = self.meta[self.primary].plan_delete(key) else {
            return false;
        };
        let off = self.meta[self.primary].get(key).unwrap().entry.offset;
        self.commit(key, &[e], 0);
        self.objects.remove(&off);
        true
    }
}

fn run(buckets: u64, keys: u8, steps: &[Step]) -> Result<(), TestCaseError> {
    let mut w = World::new(buckets);
    let mut model: BTreeMap<Vec<u8>, ()> = BTreeMap::new();
    for s in steps {
        match s {
            Step::Put(k) => {
                let key = format!("key-{k}").into_bytes();
                let existed = model.contains_key(&key);
                match w.put(&key) {
                    Ok(()) => {
                        model.insert(key, ());
                    }
                    Err(IndexError::Full { .. }) => {
                        prop_assert!(!existed, "an update never needs a new slot");
                    }
                    Err(e) => return Err(TestCaseError::fail(e.to_string())),
                }
            }
            Step::Delete(k) => {
                let key = format!("key-{k}").into_bytes();
                prop_assert_eq!(w.delete(&key), model.remove(&key).is_some());
            }
            Step::Failover => {
                // The new primary's state, rebuilt from its arena alone (a
                // node that copied the arena), is the one kept in step.
                w.primary = 1 - w.primary;
                let objects = &w.objects;
                let rebuilt = Meta::from_memory(w.layout, &w.mem[w.primary], |s| {
                    objects
                        .get(&s.offset)
                        .map(|k| (k.clone(), s.generation as u64))
                })
                .unwrap();
                prop_assert!(rebuilt == w.meta[w.primary], "rebuilt index differs");
            }
        }
        // Both nodes hold the same bytes; every key of the model is found
        // at its object, no other key is.
        prop_assert!(w.mem[0] == w.mem[1], "the replicas' indexes differ");
        prop_assert!(w.meta[0] == w.meta[1], "the replicas' metas differ");
        for k in 0..keys {
            let key = format!("key-{k}").into_bytes();
            let f = w.find(&key);
            prop_assert_eq!(f.is_some(), model.contains_key(&key), "key {}", k);
            prop_assert_eq!(f.as_ref(), w.meta[w.primary].get(&key));
            if let Some(f) = f {
                prop_assert_eq!(w.objects.get(&f.entry.offset), Some(&key));
            }
        }
        // Every entry names a live object, and no object has two entries.
        let entries = w.layout.entries(&w.mem[w.primary]).unwrap();
        prop_assert_eq!(entries.len(), model.len());
        prop_assert_eq!(entries.len(), w.objects.len());
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    /// Roomy: keys mostly in their home buckets.
    #[test]
    fn index_matches_a_model_map(s in steps(60)) {
        run(8, 60, &s)?;
    }

    /// Crowded: 2 buckets of 31 slots (and the spill bucket) for 100
    /// keys, so homes spill and inserts are refused as full.
    #[test]
    fn spills_and_full_buckets_match_a_model_map(s in steps(100)) {
        run(2, 100, &s)?;
    }
}

/// Spill and full, step by step: 31 keys fill a home, the 32nd goes to
/// the next bucket and marks the home; once both are full the insert is
/// refused with the home named, and a delete makes room again.
#[test]
fn spill_then_full_then_room_again() {
    let mut w = World::new(2);
    // Keys whose home is bucket 0 of 2.
    let keys: Vec<Vec<u8>> = (0..10_000u32)
        .map(|i| format!("k{i}").into_bytes())
        .filter(|k| w.layout.home(key_hash(k)) == 0)
        .take(2 * SLOTS + 1)
        .collect();
    for k in &keys[..SLOTS] {
        w.put(k).unwrap();
    }
    assert!(!w.layout.bucket(&w.mem[0], 0).unwrap().spill);
    w.put(&keys[SLOTS]).unwrap();
    assert!(w.layout.bucket(&w.mem[0], 0).unwrap().spill);
    assert_eq!(w.find(&keys[SLOTS]).unwrap().bucket, 1);
    for k in &keys[SLOTS + 1..2 * SLOTS] {
        w.put(k).unwrap();
    }
    assert_eq!(w.put(&keys[2 * SLOTS]), Err(IndexError::Full { bucket: 0 }));
    // An update of a key in the index needs no new slot.
    w.put(&keys[5]).unwrap();
    assert!(w.delete(&keys[3]));
    w.put(&keys[2 * SLOTS]).unwrap();
    assert_eq!(w.find(&keys[2 * SLOTS]).unwrap().bucket, 0);
    for k in &keys {
        assert_eq!(w.find(k).is_some(), k != &keys[3]);
    }
}

/// A one-sided reader that finds a tag match whose object holds another
/// key moves on: two keys with the same tag in one bucket are told apart
/// by the key in the object's header.
#[test]
fn same_tag_keys_are_told_apart_by_the_object() {
    let layout = Layout::new(0, 1);
    let mut mem = HeapMemory::new(layout.region_len());
    layout.format(&mut mem).unwrap();
    let a = Slot {
        tag: 7,
        offset: 64,
        units: 1,
        generation: 1,
    };
    let b = Slot {
        tag: 7,
        offset: 128,
        units: 1,
        generation: 2,
    };
    for (i, s) in [a, b].into_iter().enumerate() {
        let e = Edit::Slot {
            bucket: 0,
            slot: i as u8,
            entry: Some(s),
        };
        layout.apply(&mut mem, &e, i as u64 + 1).unwrap();
    }
    let hash = 7u64 << 32; // tag 7, home 0
    let key_at = |s: &Slot| if s.offset == 64 { "a" } else { "b" };
    let f = layout
        .find(&mem, hash, |s| key_at(s) == "b")
        .unwrap()
        .unwrap();
    assert_eq!(f.entry, b);
    assert!(layout
        .find(&mem, hash, |s| key_at(s) == "c")
        .unwrap()
        .is_none());
    assert_eq!(layout.bucket(&mem, 0).unwrap().version, 2);
}

proptest! {
    /// A joining secondary's fuzzy copy: the bucket it copied mixes the
    /// bytes of the versions the primary wrote while it was read (any
    /// version from the copy's start on, cut anywhere). Replaying every
    /// edit since the start with `apply_over_copy` leaves exactly the
    /// primary's bytes; the checked `apply` refuses the torn bucket.
    #[test]
    fn replay_over_a_torn_copy_is_exact(
        before in prop::collection::vec((0u8..SLOTS as u8, any::<bool>()), 0..20),
        after in prop::collection::vec((0u8..SLOTS as u8, any::<bool>()), 1..20),
        which in any::<prop::sample::Index>(),
        cut in 0usize..BUCKET_LEN,
        cut2 in 0usize..BUCKET_LEN,
    ) {
        let layout = Layout::new(0, 1);
        let mut primary = HeapMemory::new(layout.region_len());
        layout.format(&mut primary).unwrap();
        let edit = |(slot, set): (u8, bool), i: usize| Edit::Slot {
            bucket: 0,
            slot,
            entry: set.then(|| Slot {
                tag: 3 + 2 * i as u32,
                offset: 64 * (i as u64 + 1),
                units: 1,
                generation: i as u32,
            }),
        };
        let mut seq = 0;
        for (i, &e) in before.iter().enumerate() {
            seq += 1;
            layout.apply(&mut primary, &edit(e, i), seq).unwrap();
        }
        let start_seq = seq;
        let mut versions = vec![primary.clone()];
        for (i, &e) in after.iter().enumerate() {
            seq += 1;
            layout.apply(&mut primary, &edit(e, 100 + i), seq).unwrap();
            versions.push(primary.clone());
        }
        // The copy: bytes [lo, hi) of one version, the rest of the start.
        let (lo, hi) = (cut.min(cut2), cut.max(cut2));
        let mut copy = versions[0].clone();
        let mut mid = [0u8; BUCKET_LEN];
        versions[which.index(versions.len())].read(0, &mut mid).unwrap();
        copy.write(lo as u64, &mid[lo..hi]).unwrap();
        let mut seq = start_seq;
        for (i, &e) in after.iter().enumerate() {
            seq += 1;
            layout.apply_over_copy(&mut copy, &edit(e, 100 + i), seq).unwrap();
        }
        prop_assert!(copy == primary, "the replayed copy differs from the primary");
    }
}

#[test]
fn the_superblock_describes_the_layout_and_is_checked() {
    let l = Layout::for_arena(64 << 20, 0);
    assert_eq!(l.offset, SUPERBLOCK_LEN);
    assert_eq!(l.buckets, 4096);
    assert_eq!(Layout::for_arena(4096, 0).buckets, 1);
    assert_eq!(Layout::for_arena(64 << 20, 10).buckets, 10);
    let sb = l.superblock();
    assert_eq!(Layout::from_superblock(&sb, 64 << 20), Ok(l));
    // Too small an arena for the index it names, a flipped bit, no index.
    assert!(Layout::from_superblock(&sb, 1 << 20).is_err());
    for i in 0..SUPERBLOCK_LEN as usize {
        let mut t = sb;
        t[i] ^= 1;
        assert!(Layout::from_superblock(&t, 64 << 20).is_err(), "byte {i}");
    }
    assert!(Layout::from_superblock(&[0u8; 64], 64 << 20).is_err());
    // Well-formed superblocks (their checksums hold) naming an index that
    // is unaligned, or whose end overflows a u64 and so wrapped to a small
    // number, are refused.
    for (offset, buckets) in [
        (SUPERBLOCK_LEN + 8, 10),
        (u64::MAX - 511, 1),
        (!63, 1),
        (SUPERBLOCK_LEN, u64::MAX / 512),
        (SUPERBLOCK_LEN, u64::MAX),
    ] {
        let sb = Layout { offset, buckets }.superblock();
        assert!(
            Layout::from_superblock(&sb, u64::MAX).is_err(),
            "{offset} {buckets}"
        );
        assert!(Layout::from_superblock(&sb, 64 << 20).is_err());
    }
    // format writes it at offset 0.
    let mut mem = HeapMemory::new(1 << 20);
    let l = Layout::for_arena(1 << 20, 0);
    l.format(&mut mem).unwrap();
    let mut b = [0u8; SUPERBLOCK_LEN as usize];
    mem.read(0, &mut b).unwrap();
    assert_eq!(Layout::from_superblock(&b, 1 << 20), Ok(l));
    assert!(l.bucket(&mem, l.buckets).is_ok());
}

/// Edits that cannot be written are refused, not a panic: `Layout::apply`
/// and `apply_over_copy` (a replay has no `Meta` to check them against)
/// leave the bytes as they were, and `Edit::validate` also refuses entries
/// outside the arena's objects.
#[test]
fn a_bad_edit_is_refused_not_a_panic() {
    let layout = Layout::new(SUPERBLOCK_LEN, 2);
    let arena_len = 1 << 20;
    let mut mem = HeapMemory::new(arena_len);
    layout.format(&mut mem).unwrap();
    let objects = layout.reserved_len();
    let good = Slot {
        tag: 5,
        offset: objects,
        units: 2,
        generation: 1,
    };
    let set = |slot: u8, entry: Slot| Edit::Slot {
        bucket: 0,
        slot,
        entry: Some(entry),
    };
    let unwritable = [
        set(SLOTS as u8, good),
        set(255, good),
        Edit::Slot {
            bucket: 3,
            slot: 0,
            entry: None,
        },
        Edit::Spill { bucket: 2 },
        set(0, Slot { tag: 0, ..good }),
        set(
            0,
            Slot {
                offset: objects + 8,
                ..good
            },
        ),
        set(
            0,
            Slot {
                offset: MAX_ARENA_LEN,
                ..good
            },
        ),
        set(0, Slot { units: 0, ..good }),
    ];
    let before = mem.clone();
    for e in &unwritable {
        for over_copy in [false, true] {
            let r = if over_copy {
                layout.apply_over_copy(&mut mem, e, 9)
            } else {
                layout.apply(&mut mem, e, 9)
            };
            assert!(matches!(r, Err(IndexError::BadEdit(_))), "{e:?}: {r:?}");
        }
        assert!(e.validate(&layout, arena_len).is_err(), "{e:?}");
        let mut m = Meta::new(layout);
        assert!(m.apply(e, b"k", 1).is_err(), "{e:?}");
        assert_eq!(m, Meta::new(layout));
    }
    assert!(mem == before, "a refused edit wrote");
    // Writable, but not inside the arena's objects.
    for offset in [0, SUPERBLOCK_LEN, objects - 64, arena_len - 64, arena_len] {
        let e = set(0, Slot { offset, ..good });
        assert!(e.validate(&layout, arena_len).is_err(), "{offset}");
    }
    assert!(set(30, good).validate(&layout, arena_len).is_ok());
    let last = Slot {
        offset: arena_len - 128,
        ..good
    };
    assert!(set(0, last).validate(&layout, arena_len).is_ok());
    layout.apply(&mut mem, &set(30, good), 9).unwrap();
}

/// `Meta::apply` refuses an edit that does not fit its state before it
/// changes anything (it used to forget the key's old object first).
#[test]
fn a_refused_meta_edit_changes_nothing() {
    let layout = Layout::new(0, 2);
    let mut m = Meta::new(layout);
    let entry = |key: &[u8], offset| Slot {
        tag: tag_of(key_hash(key)),
        offset,
        units: 1,
        generation: 1,
    };
    for (k, off) in [(&b"a"[..], 4096), (b"b", 8192)] {
        for e in m.plan_put(k, entry(k, off)).unwrap() {
            m.apply(&e, k, 1).unwrap();
        }
    }
    let before = m.clone();
    // "a" moved onto the object of "b".
    let e = m.plan_put(b"a", entry(b"a", 8192)).unwrap();
    assert!(m.apply(&e[0], b"a", 1).is_err());
    assert_eq!(m, before);
    assert!(m.owns(4096) && m.owns(8192));
}
