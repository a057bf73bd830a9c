//! The look-up's steps against an index and objects in memory, including
//! the races a remote reader meets.

use super::*;
use crate::arena::{HeapMemory, Memory};
use crate::index::{Edit, Meta};
use crate::object::Fields;

/// An arena with an index and keyed objects, changed the way a node
/// changes it (through `Meta` plans and `Layout::apply`).
struct Arena {
    layout: Layout,
    mem: HeapMemory,
    meta: Meta,
    next: u64,
    seq: u64,
    /// The deadline of the objects `put` writes.
    deadline: u64,
}

impl Arena {
    fn new(buckets: u64) -> Arena {
        let layout = Layout::new(index::SUPERBLOCK_LEN, buckets);
        let mut mem = HeapMemory::new(1 << 20);
        layout.format(&mut mem).unwrap();
        Arena {
            layout,
            mem,
            meta: Meta::new(layout),
            next: 64 << 10,
            seq: 0,
            deadline: 0,
        }
    }

    /// Puts `key` in a new object (out of place, as an update that moves
    /// it), freeing the old one, in the order in which a node applies the
    /// write's effects (`plan_put`: `Write`, `Free`, then `Index`): the
    /// new object, the old one scrubbed, then the slot repointed. Returns
    /// the offset.
    fn put(&mut self, key: &[u8], data: &[u8]) -> u64 {
        self.seq += 1;
        let offset = self.next;
        self.next += 256;
        let generation = self.meta.generation(key).unwrap_or(self.seq);
        let f = Fields {
            version: self.seq,
            generation,
            key,
            data,
            deadline: self.deadline,
        };
        object::write_object(&mut self.mem, offset, 256, &f).unwrap();
        let old = self.meta.get(key).map(|f| f.entry.offset);
        let entry = Slot {
            tag: tag_of(key_hash(key)),
            offset,
            units: 4,
            generation: generation as u32,
        };
        let edits = self.meta.plan_put(key, entry).unwrap();
        if let Some(o) = old {
            object::scrub(&mut self.mem, o).unwrap();
        }
        for e in edits {
            self.meta.apply(&e, key, generation).unwrap();
            self.layout.apply(&mut self.mem, &e, self.seq).unwrap();
        }
        offset
    }

    fn delete(&mut self, key: &[u8]) {
        self.seq += 1;
        let off = self.meta.get(key).unwrap().entry.offset;
        let e = self.meta.plan_delete(key).unwrap();
        self.meta.apply(&e, key, 0).unwrap();
        self.layout.apply(&mut self.mem, &e, self.seq).unwrap();
        object::scrub(&mut self.mem, off).unwrap();
    }

    /// Runs a look-up; `between(arena, read_no)` runs before each read
    /// (a write racing the reader).
    fn lookup(
        &mut self,
        key: &[u8],
        cached: Option<(u64, u32)>,
        mut between: impl FnMut(&mut Arena, u32),
    ) -> (Outcome, u32) {
        let (mut l, mut step) = Lookup::start(key, self.layout, cached);
        let mut n = 0;
        loop {
            match step {
                Step::Done(o) => return (o, l.reads()),
                Step::Read { offset, len } => {
                    between(self, n);
                    n += 1;
                    let mut buf = vec![0u8; len as usize];
                    self.mem.read(offset, &mut buf).unwrap();
                    step = l.on_read(&buf);
                }
            }
        }
    }
}

impl Arena {
    /// [`Arena::lookup`] as the client reads large objects: every read
    /// longer than a header and this key is handed over in two parts, the
    /// second a vector of its own that becomes the value when the look-up
    /// finds it there (`Lookup::on_read_parts`), joined where the parts do
    /// not decode that way.
    fn lookup_split(&mut self, key: &[u8], cached: Option<(u64, u32)>) -> (Outcome, u32) {
        let (mut l, mut step) = Lookup::start(key, self.layout, cached);
        let head = object::HEADER_LEN + key.len();
        let mut value = None;
        loop {
            match step {
                Step::Done(o) => {
                    let o = match value {
                        Some(body) => o.take_value(body),
                        None => o,
                    };
                    return (o, l.reads());
                }
                Step::Read { offset, len } => {
                    let mut buf = vec![0u8; len as usize];
                    self.mem.read(offset, &mut buf).unwrap();
                    value = None;
                    if buf.len() > head {
                        let body = buf.split_off(head);
                        if let Some(s) = l.on_read_parts(&buf, &body) {
                            step = s;
                            value = Some(body);
                            continue;
                        }
                        buf.extend_from_slice(&body);
                    }
                    step = l.on_read(&buf);
                }
            }
        }
    }

    /// [`Self::lookup_split`] reading objects only as far as their keys
    /// ([`Lookup::on_read_head`], as the RESP door does while nothing is
    /// written), the value then read from where the outcome says it lies.
    fn lookup_heads(&mut self, key: &[u8], cached: Option<(u64, u32)>) -> (Outcome, u32) {
        let (mut l, mut step) = Lookup::start(key, self.layout, cached);
        l.keep_data(false);
        let head = object::HEADER_LEN + key.len();
        let mut by_head = false;
        loop {
            match step {
                Step::Done(mut o) => {
                    if let Outcome::Found {
                        offset,
                        data,
                        data_at,
                        data_len,
                        ..
                    } = &mut o
                    {
                        assert!(by_head, "found by a whole read");
                        *data = vec![0u8; *data_len];
                        self.mem.read(*offset + *data_at as u64, data).unwrap();
                    }
                    return (o, l.reads());
                }
                Step::Read { offset, len } => {
                    let mut buf = vec![0u8; len as usize];
                    self.mem.read(offset, &mut buf).unwrap();
                    by_head = false;
                    if buf.len() > head {
                        if let Some(s) = l.on_read_head(&buf[..head], len as usize) {
                            step = s;
                            by_head = true;
                            continue;
                        }
                    }
                    step = l.on_read(&buf);
                }
            }
        }
    }
}

/// A look-up of [`Arena`]'s: the key and a cached pointer; the outcome
/// and the reads it took.
type LookupBy = fn(&mut Arena, &[u8], Option<(u64, u32)>) -> (Outcome, u32);

/// A look-up `by` a reader that takes objects otherwise than whole answers
/// as whole reads do: every key of a spilled bucket with a tag-collision
/// twin (twins of the key's length and of others), the absent twin,
/// cached pointers, and a stale cached pointer whose space another key's
/// object (of another key length) now holds.
fn answers_as_whole_reads_do(by: LookupBy) {
    let mut a = Arena::new(2);
    let (_, absent, keys) = spilling_keys(&a.layout);
    for k in &keys {
        let v: Vec<u8> = k.iter().cycle().take(150).copied().collect();
        a.put(k, &v);
    }
    let mut found = 0;
    for k in keys.iter().chain([&absent]) {
        let whole = a.lookup(k, None, |_, _| {});
        assert_eq!(
            by(&mut a, k, None),
            whole,
            "{:?}",
            String::from_utf8_lossy(k)
        );
        if let Outcome::Found { offset, len, .. } = whole.0 {
            assert_eq!(by(&mut a, k, Some((offset, len))).0, whole.0);
            found += 1;
        }
    }
    assert_eq!(found, keys.len());
    // A cached pointer to space now holding another key's object.
    let off = a.put(b"alpha", b"one");
    a.delete(b"alpha");
    a.next = off;
    a.put(b"a-much-longer-key", b"other");
    a.put(b"alpha", b"two");
    let got = by(&mut a, b"alpha", Some((off, 256)));
    assert_eq!(value(&got.0), Some(&b"two"[..]));
    assert_eq!(got, a.lookup(b"alpha", Some((off, 256)), |_, _| {}));
    assert!(got.1 >= 3, "the stale object, a bucket, the object");
}

/// Objects read only as far as their keys (the RESP door's large
/// objects) are found, told apart and skipped as objects read whole, and
/// the value lies where the outcome says.
#[test]
fn a_look_up_of_heads_answers_as_whole_reads_do() {
    answers_as_whole_reads_do(Arena::lookup_heads);
}

/// Objects read in two parts (a client's large objects) are found, told
/// apart and skipped exactly as objects read whole.
#[test]
fn a_look_up_of_objects_read_in_two_parts_answers_as_whole_reads_do() {
    answers_as_whole_reads_do(Arena::lookup_split);
}

fn value(o: &Outcome) -> Option<&[u8]> {
    match o {
        Outcome::Found { data, .. } => Some(data),
        _ => None,
    }
}

/// The look-up hands back the header's deadline, and a reader counts the
/// key absent from `CLOCK_BOUND_MS` before it on its own clock.
#[test]
fn the_deadline_comes_with_the_value() {
    let mut a = Arena::new(4);
    a.deadline = 1_800_000_000_000;
    a.put(b"session", b"token");
    a.deadline = 0;
    a.put(b"forever", b"x");
    let deadline_of = |o: &Outcome| match o {
        Outcome::Found { deadline, .. } => *deadline,
        o => panic!("{o:?}"),
    };
    let (o, _) = a.lookup(b"session", None, |_, _| {});
    assert_eq!(deadline_of(&o), 1_800_000_000_000);
    let (o, _) = a.lookup(b"forever", None, |_, _| {});
    assert_eq!(deadline_of(&o), 0);
    let d = 1_800_000_000_000;
    assert!(live(d, d - CLOCK_BOUND_MS - 1));
    assert!(!live(d, d - CLOCK_BOUND_MS));
    assert!(!live(d, d + 5));
    assert!(live(0, u64::MAX), "no deadline: never expires");
}

#[test]
fn found_absent_and_cached() {
    let mut a = Arena::new(4);
    let off = a.put(b"alpha", b"one");
    a.put(b"beta", b"two");
    let (o, reads) = a.lookup(b"alpha", None, |_, _| {});
    assert_eq!(value(&o), Some(&b"one"[..]));
    assert_eq!(reads, 2, "the bucket, then the object");
    let Outcome::Found {
        offset,
        len,
        generation,
        ..
    } = o
    else {
        unreachable!()
    };
    assert_eq!((offset, len), (off, 256));
    assert_eq!(generation, 1);
    // A cache hit is one read.
    let (o, reads) = a.lookup(b"alpha", Some((off, 256)), |_, _| {});
    assert_eq!((value(&o), reads), (Some(&b"one"[..]), 1));
    let (o, reads) = a.lookup(b"gamma", None, |_, _| {});
    assert_eq!((o, reads), (Outcome::Absent, 1));
}

/// Issue 18: a cached pointer whose object was deleted and whose space
/// now holds another key's object is recognised (by the key in the
/// header) and the index is asked; the other key's value never comes back.
#[test]
fn a_stale_cached_pointer_to_reused_space_is_detected() {
    let mut a = Arena::new(4);
    let off = a.put(b"alpha", b"one");
    a.delete(b"alpha");
    // Reuse the very space for another key.
    a.next = off;
    assert_eq!(a.put(b"beta", b"two"), off);
    let (o, reads) = a.lookup(b"alpha", Some((off, 256)), |_, _| {});
    assert_eq!((o, reads), (Outcome::Absent, 2));
    // Deleted and put again at the same place: the new object is the
    // key's value, whatever generation the cache remembered.
    a.delete(b"beta");
    a.next = off;
    a.put(b"alpha", b"three");
    let (o, _) = a.lookup(b"alpha", Some((off, 256)), |_, _| {});
    assert_eq!(value(&o), Some(&b"three"[..]));
    let Outcome::Found { generation, .. } = o else {
        unreachable!()
    };
    assert_eq!(generation, a.seq, "a new key object has a new generation");
}

/// An update that moves the object between the reader's bucket read and
/// its object read: the slot's object is gone, the look-up starts over
/// and finds the new one (never "absent": the key existed throughout).
#[test]
fn a_slot_that_changes_under_the_reader_restarts_the_look_up() {
    let mut a = Arena::new(4);
    a.put(b"alpha", b"one");
    let (o, reads) = a.lookup(b"alpha", None, |a, n| {
        if n == 1 {
            a.put(b"alpha", b"moved");
        }
    });
    assert_eq!(value(&o), Some(&b"moved"[..]));
    assert_eq!(reads, 4, "bucket, the old object, bucket, the new object");
}

/// A bucket that is torn at every read: the look-up gives up after
/// `MAX_RESTARTS` and the caller asks the node.
#[test]
fn endless_tearing_gives_up() {
    let mut a = Arena::new(4);
    a.put(b"alpha", b"one");
    let home = a.layout.home(key_hash(b"alpha"));
    let at = a.layout.bucket_offset(home) + 100;
    let mut orig = [0u8; 1];
    a.mem.read(at, &mut orig).unwrap();
    let (o, _) = a.lookup(b"alpha", None, |a, n| {
        // A different wrong byte before every read.
        a.mem.write(at, &[orig[0] ^ (n as u8 + 1)]).unwrap();
    });
    assert_eq!(o, Outcome::GaveUp);
}

/// Two keys with the same tag and the same home bucket (a birthday
/// search over 2^32 tag and home pairs: some 10^5 keys).
fn same_tag_pair(layout: &Layout) -> (Vec<u8>, Vec<u8>) {
    let mut seen = std::collections::HashMap::new();
    for i in 0u32.. {
        let k = format!("t{i}").into_bytes();
        let h = key_hash(&k);
        if let Some(twin) = seen.insert((tag_of(h), layout.home(h)), k.clone()) {
            return (twin, k);
        }
    }
    unreachable!("a pair within 2^32 keys")
}

/// Keys that overfill one home bucket (so it spills), the first of them
/// the twin of a key with the same tag and home that is not among them:
/// `(twin, absent twin, keys)`.
fn spilling_keys(layout: &Layout) -> (Vec<u8>, Vec<u8>, Vec<Vec<u8>>) {
    let (twin, absent) = same_tag_pair(layout);
    let home = layout.home(key_hash(&twin));
    let keys = std::iter::once(twin.clone())
        .chain(
            (0..10_000u32)
                .map(|i| format!("k{i}").into_bytes())
                .filter(|k| layout.home(key_hash(k)) == home)
                .take(index::SLOTS + 3),
        )
        .collect();
    (twin, absent, keys)
}

/// A full home bucket spills into the next; same-tag keys are told apart
/// by the key in the object.
#[test]
fn spilled_keys_and_tag_collisions() {
    let mut a = Arena::new(2);
    let (twin, absent, keys) = spilling_keys(&a.layout);
    for k in &keys {
        a.put(k, k);
    }
    assert!(
        a.layout
            .bucket(&a.mem, a.layout.home(key_hash(&twin)))
            .unwrap()
            .spill
    );
    for k in &keys {
        let (o, _) = a.lookup(k, None, |_, _| {});
        assert_eq!(value(&o), Some(&k[..]));
    }
    // A key of the same tag and home that is not there: both buckets
    // read, and the twin's object read as a candidate and skipped.
    let (o, reads) = a.lookup(&absent, None, |_, _| {});
    assert_eq!(o, Outcome::Absent);
    assert_eq!(reads, 3, "home bucket, the twin's object, next bucket");
    // Once it is there, each finds its own.
    a.put(&absent, b"other");
    let (o, _) = a.lookup(&absent, None, |_, _| {});
    assert_eq!(value(&o), Some(&b"other"[..]));
    let (o, _) = a.lookup(&twin, None, |_, _| {});
    assert_eq!(value(&o), Some(&twin[..]));
}

/// A slot whose object holds another key in the slot's generation, but a
/// key of another tag, was not written for that object: the slot changed
/// (here it is forged, and stays), so the look-up starts over instead of
/// skipping it as a collision and answering "absent"; it gives up.
#[test]
fn a_candidate_of_another_tag_is_not_a_collision() {
    let mut a = Arena::new(2);
    a.put(b"victim", b"v");
    let victim = a.meta.get(b"victim").unwrap().entry;
    let probe = b"probe";
    assert_ne!(tag_of(key_hash(probe)), victim.tag);
    let forged = Edit::Slot {
        bucket: a.layout.home(key_hash(probe)),
        slot: 30,
        entry: Some(Slot {
            tag: tag_of(key_hash(probe)),
            ..victim
        }),
    };
    a.layout.apply(&mut a.mem, &forged, 99).unwrap();
    let (o, reads) = a.lookup(probe, None, |_, _| {});
    assert_eq!(o, Outcome::GaveUp);
    assert_eq!(
        reads,
        2 * (MAX_RESTARTS + 1),
        "bucket and object, each time"
    );
}

/// `run_in` reads into the caller's buffer and points at the value there
/// instead of copying it; the buffer is grown only as far as a read needs
/// and is reused (a smaller read leaves it as long as it was).
#[test]
fn run_in_points_at_the_value_in_the_callers_buffer() {
    let mut a = Arena::new(4);
    let big: Vec<u8> = (0..180u32).map(|i| (i % 251) as u8).collect();
    a.put(b"big", &big);
    a.put(b"small", b"tiny");
    let mut buf = Vec::new();
    let mut grown = Vec::new();
    for (key, want) in [(&b"big"[..], &big[..]), (b"small", b"tiny")] {
        let (o, _) = super::run_in(key, a.layout, None, &mut buf, |offset, len, buf| {
            if buf.len() < len as usize {
                buf.resize(len as usize, 0);
            }
            a.mem.read(offset, &mut buf[..len as usize])
        })
        .unwrap();
        grown.push(buf.len());
        let Outcome::Found {
            data,
            data_at,
            data_len,
            ..
        } = o
        else {
            panic!("{o:?}")
        };
        assert!(data.is_empty(), "run_in copies no value");
        assert_eq!(&buf[data_at..data_at + data_len], want);
    }
    assert_eq!(grown[0], grown[1], "the small read reused the big buffer");
    // And the copying driver finds the same bytes where run_in points.
    let (o, _) = a.lookup(b"big", None, |_, _| {});
    assert_eq!(value(&o), Some(&big[..]));
}
