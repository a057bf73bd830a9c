//! The key index: a hash table inside the arena that a client reads with
//! one-sided RDMA Reads, no server CPU on the path (Pilaf, FaRM).
//!
//! The index is a region of the arena, so it lives at the same address
//! under the same STag on both nodes, is copied to a joining secondary with
//! the rest of the arena, and changes only through replicated edits
//! ([`Edit`]), applied in sequence order on both nodes, which leaves the
//! two regions byte for byte the same. A failover therefore finds the same
//! index on the new primary.
//!
//! ```text
//! region:  bucket 0 | bucket 1 | ... | bucket n-1 | bucket n (spill only)
//! bucket (512 bytes, little-endian):
//!   offset  size  field
//!        0     4  checksum  CRC32c over bytes 4..512 and the bucket number
//!        4     1  spill     1: an entry whose home is this bucket went on to
//!                           the next one (it was full)
//!        5     3  zero
//!        8     8  version   sequence number of the write that last changed it
//!       16   496  31 slots of 16 bytes:
//!                   tag u32 (high hash bits | 1; 0 = empty slot)
//!                   offset u32 (the object's arena offset / 64)
//!                   units u32 (its allocation length / 64)
//!                   generation u32 (low bits of the object's generation)
//! ```
//!
//! A look-up hashes the key ([`key_hash`]), reads the home bucket with one
//! RDMA Read, checks its checksum (a read that raced an edit is torn:
//! retry), and reads the object of each slot whose tag matches; the
//! object's header carries the key, so a tag collision or a slot that
//! changed meanwhile is recognised by comparing keys. Only when the home
//! bucket's spill flag is set does the look-up read the next bucket too.
//! The region has one bucket more than the hash range, so "the next" never
//! wraps.
//!
//! Sizing: with 31 slots a bucket holds on average 15.5 entries at half
//! load; a home bucket overflows (and costs a second Read) with
//! probability about 10^-4 there. An insert that finds its home and the
//! next bucket full fails with [`IndexError::Full`].

use crate::arena::{ArenaError, Memory};

/// Bytes per bucket.
pub const BUCKET_LEN: usize = 512;
/// Slots per bucket.
pub const SLOTS: usize = 31;
/// Bytes per slot.
pub const SLOT_LEN: usize = 16;
const SLOTS_AT: usize = 16;
/// Allocation unit of the arena (object offsets and lengths are multiples).
const UNIT: u64 = crate::object::UNIT;
/// The largest arena (256 GiB): a slot holds an object's offset in units
/// of 64 bytes in 32 bits (as its header holds its allocation's length).
pub const MAX_ARENA_LEN: u64 = UNIT << 32;

pub use crate::object::key_hash;

/// A slot's tag for a hash: its high 32 bits, never 0 (0 = empty).
pub fn tag_of(hash: u64) -> u32 {
    ((hash >> 32) as u32) | 1
}

/// Index errors.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum IndexError {
    /// The bytes do not check (a read raced an edit, or not an index).
    #[error("torn index bucket {bucket}: it changed while it was read; retry")]
    Torn {
        /// The bucket.
        bucket: u64,
    },
    /// The key's home bucket and the next are full.
    #[error(
        "the key index is full around bucket {bucket} ({SLOTS} slots in each of two buckets); \
         configure more index buckets"
    )]
    Full {
        /// The home bucket.
        bucket: u64,
    },
    /// An edit that cannot be applied to this index (a replicated edit
    /// that does not fit: a divergence).
    #[error("invalid index edit: {0}")]
    BadEdit(String),
    /// The arena refused the access.
    #[error(transparent)]
    Arena(#[from] ArenaError),
}

/// One index entry: where the object of a key is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Slot {
    /// [`tag_of`] the key's hash.
    pub tag: u32,
    /// The object's arena offset (a multiple of 64).
    pub offset: u64,
    /// Its allocation length in 64-byte units.
    pub units: u32,
    /// The low 32 bits of the object's generation.
    pub generation: u32,
}

impl Slot {
    /// Its bytes; callers check it first ([`Edit::check_fields`]).
    fn encode(&self) -> [u8; SLOT_LEN] {
        assert!(self.tag != 0, "a slot's tag is never 0");
        assert!(
            self.offset.is_multiple_of(UNIT),
            "object offsets are unit aligned"
        );
        let off = u32::try_from(self.offset / UNIT).expect("arena offsets below 256 GiB");
        let mut b = [0u8; SLOT_LEN];
        b[0..4].copy_from_slice(&self.tag.to_le_bytes());
        b[4..8].copy_from_slice(&off.to_le_bytes());
        b[8..12].copy_from_slice(&self.units.to_le_bytes());
        b[12..16].copy_from_slice(&self.generation.to_le_bytes());
        b
    }

    fn decode(b: &[u8]) -> Option<Slot> {
        let u = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        (u(0) != 0).then(|| Slot {
            tag: u(0),
            offset: u(4) as u64 * UNIT,
            units: u(8),
            generation: u(12),
        })
    }
}

/// A bucket, decoded and checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bucket {
    /// Sequence number of the write that last changed it.
    pub version: u64,
    /// An entry whose home is this bucket lives in the next one.
    pub spill: bool,
    /// The slots.
    pub slots: [Option<Slot>; SLOTS],
}

impl Bucket {
    /// An empty bucket.
    pub fn empty() -> Bucket {
        Bucket {
            version: 0,
            spill: false,
            slots: [None; SLOTS],
        }
    }

    /// The slots whose tag is `tag`: (slot number, slot).
    pub fn matching(&self, tag: u32) -> impl Iterator<Item = (usize, Slot)> + '_ {
        self.slots
            .iter()
            .enumerate()
            .filter_map(move |(i, s)| s.filter(|s| s.tag == tag).map(|s| (i, s)))
    }
}

fn checksum(bucket_no: u64, bytes: &[u8]) -> u32 {
    let c = crc32c::crc32c(&bytes[4..BUCKET_LEN]);
    crc32c::crc32c_append(c, &bucket_no.to_le_bytes())
}

/// Encodes bucket number `no`. An all-zero bucket (a fresh arena) is not
/// valid: [`Layout::format`] writes every bucket first.
pub fn encode_bucket(no: u64, b: &Bucket) -> [u8; BUCKET_LEN] {
    let mut out = [0u8; BUCKET_LEN];
    out[4] = b.spill as u8;
    out[8..16].copy_from_slice(&b.version.to_le_bytes());
    for (i, s) in b.slots.iter().enumerate() {
        if let Some(s) = s {
            let at = SLOTS_AT + i * SLOT_LEN;
            out[at..at + SLOT_LEN].copy_from_slice(&s.encode());
        }
    }
    let c = checksum(no, &out);
    out[0..4].copy_from_slice(&c.to_le_bytes());
    out
}

/// Decodes bucket number `no` from the bytes a Read returned.
pub fn decode_bucket(no: u64, bytes: &[u8]) -> Result<Bucket, IndexError> {
    let torn = IndexError::Torn { bucket: no };
    if bytes.len() < BUCKET_LEN {
        return Err(torn);
    }
    let want = u32::from_le_bytes(bytes[0..4].try_into().expect("4 bytes"));
    if checksum(no, bytes) != want || bytes[4] > 1 || bytes[5..8] != [0, 0, 0] {
        return Err(torn);
    }
    Ok(decode_fields(bytes))
}

/// The fields of a bucket's bytes, unchecked.
fn decode_fields(bytes: &[u8]) -> Bucket {
    let mut b = Bucket::empty();
    b.spill = bytes[4] == 1;
    b.version = u64::from_le_bytes(bytes[8..16].try_into().expect("8 bytes"));
    for (i, s) in b.slots.iter_mut().enumerate() {
        let at = SLOTS_AT + i * SLOT_LEN;
        *s = Slot::decode(&bytes[at..at + SLOT_LEN]);
    }
    b
}

/// Bytes of the superblock at arena offset 0, which describes the index.
pub const SUPERBLOCK_LEN: u64 = 64;
/// The superblock's magic, "SRIX" read as a little-endian u32.
pub const SUPERBLOCK_MAGIC: u32 = u32::from_le_bytes(*b"SRIX");

/// Where the index lies in the arena and how many buckets it hashes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Arena offset of bucket 0.
    pub offset: u64,
    /// Buckets keys hash to (the region holds one more).
    pub buckets: u64,
}

/// One change to the index, replicated with the write that makes it and
/// applied on both nodes by [`Layout::apply`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Edit {
    /// Set (or with `None` clear) slot `slot` of bucket `bucket`.
    Slot {
        /// Bucket number.
        bucket: u64,
        /// Slot number.
        slot: u8,
        /// The new entry.
        entry: Option<Slot>,
    },
    /// Mark bucket `bucket` as spilled into the next one.
    Spill {
        /// Bucket number.
        bucket: u64,
    },
}

impl Edit {
    /// The bucket it changes.
    pub fn bucket(&self) -> u64 {
        match *self {
            Edit::Slot { bucket, .. } | Edit::Spill { bucket } => bucket,
        }
    }

    /// Whether this edit fits an index of `layout` in an arena of
    /// `arena_len` bytes: a bucket and slot of the index, an entry with a
    /// tag, naming a whole unit-aligned range of the arena past the index
    /// region. Checked before a replicated edit changes anything, so a
    /// bad one is a divergence, never a panic (on a node replaying over a
    /// copy, which has no [`Meta`] to check it against, too).
    pub fn validate(&self, layout: &Layout, arena_len: u64) -> Result<(), IndexError> {
        self.check_fields(layout)?;
        if let Edit::Slot {
            entry: Some(e),
            bucket,
            slot,
        } = *self
        {
            let end = e.offset.checked_add(e.units as u64 * UNIT);
            if e.offset < layout.reserved_len() || end.is_none_or(|end| end > arena_len) {
                return Err(IndexError::BadEdit(format!(
                    "slot {bucket}/{slot} names {} units at {}, outside the objects' part \
                     ({}..{arena_len}) of the arena",
                    e.units,
                    e.offset,
                    layout.reserved_len()
                )));
            }
        }
        Ok(())
    }

    /// What [`Layout::apply`] needs to write the edit: a bucket and slot
    /// of the index, and an entry that encodes (a tag, an offset that is
    /// a multiple of 64 below [`MAX_ARENA_LEN`], at least one unit).
    fn check_fields(&self, layout: &Layout) -> Result<(), IndexError> {
        let bad = |m: String| Err(IndexError::BadEdit(m));
        match *self {
            Edit::Spill { bucket } if bucket >= layout.buckets => {
                bad(format!("spill of bucket {bucket} outside the index"))
            }
            Edit::Spill { .. } => Ok(()),
            Edit::Slot { bucket, slot, .. }
                if bucket > layout.buckets || slot as usize >= SLOTS =>
            {
                bad(format!("index slot {bucket}/{slot} outside the index"))
            }
            Edit::Slot {
                bucket,
                slot,
                entry: Some(e),
            } if e.tag == 0
                || !e.offset.is_multiple_of(UNIT)
                || e.offset >= MAX_ARENA_LEN
                || e.units == 0 =>
            {
                bad(format!(
                    "slot {bucket}/{slot} set to an entry that cannot be: {e:?}"
                ))
            }
            Edit::Slot { .. } => Ok(()),
        }
    }
}

/// Where a key's entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Found {
    /// Bucket number.
    pub bucket: u64,
    /// Slot number.
    pub slot: u8,
    /// The entry.
    pub entry: Slot,
}

impl Layout {
    /// A layout of `buckets` hashed buckets at arena offset `offset`.
    pub fn new(offset: u64, buckets: u64) -> Layout {
        assert!(buckets > 0, "an index has buckets");
        Layout { offset, buckets }
    }

    /// Bytes of arena the region takes (a multiple of 64).
    pub fn region_len(&self) -> u64 {
        (self.buckets + 1) * BUCKET_LEN as u64
    }

    /// The home bucket of a hash.
    pub fn home(&self, hash: u64) -> u64 {
        hash % self.buckets
    }

    /// Arena offset of bucket `no`.
    pub fn bucket_offset(&self, no: u64) -> u64 {
        assert!(no <= self.buckets, "bucket {no} outside the index");
        self.offset + no * BUCKET_LEN as u64
    }

    /// The layout a new group's arena gets: the superblock at offset 0,
    /// then the buckets. `buckets`: 0 chooses one per 16 KiB of arena (a
    /// region of about 3% of it; 31 slots per bucket hold an object per
    /// 528 bytes of arena when full).
    pub fn for_arena(arena_len: u64, buckets: u64) -> Layout {
        let buckets = if buckets == 0 {
            (arena_len / (16 << 10)).max(1)
        } else {
            buckets
        };
        Layout::new(SUPERBLOCK_LEN, buckets)
    }

    /// Bytes of the arena the superblock and the region take from offset
    /// 0 (the allocation the index holds).
    pub fn reserved_len(&self) -> u64 {
        self.offset + self.region_len()
    }

    /// The superblock describing this layout (written once, at offset 0,
    /// when a group's arena is formatted; a client reads it once).
    pub fn superblock(&self) -> [u8; SUPERBLOCK_LEN as usize] {
        let mut b = [0u8; SUPERBLOCK_LEN as usize];
        b[0..4].copy_from_slice(&SUPERBLOCK_MAGIC.to_le_bytes());
        b[4..8].copy_from_slice(&1u32.to_le_bytes());
        b[8..16].copy_from_slice(&self.offset.to_le_bytes());
        b[16..24].copy_from_slice(&self.buckets.to_le_bytes());
        let crc = crc32c::crc32c(&b[..60]);
        b[60..64].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// Decodes a superblock read from arena offset 0 of an arena of
    /// `arena_len` bytes: an index of at least one bucket, at a multiple
    /// of 64 past the superblock, wholly inside the arena.
    pub fn from_superblock(b: &[u8], arena_len: u64) -> Result<Layout, String> {
        if b.len() < SUPERBLOCK_LEN as usize {
            return Err(format!("superblock of {} bytes", b.len()));
        }
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().unwrap());
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        if u32_at(0) != SUPERBLOCK_MAGIC || u32_at(4) != 1 {
            return Err("the arena holds no key index (no superblock at offset 0)".into());
        }
        if crc32c::crc32c(&b[..60]) != u32_at(60) {
            return Err("the arena's superblock fails its checksum".into());
        }
        let (offset, buckets) = (u64_at(8), u64_at(16));
        // (Checked arithmetic: the checksum only says the bytes are what
        // was written, and they may come from anywhere.)
        let end = buckets
            .checked_add(1)
            .and_then(|n| n.checked_mul(BUCKET_LEN as u64))
            .and_then(|len| offset.checked_add(len));
        if buckets == 0
            || offset < SUPERBLOCK_LEN
            || !offset.is_multiple_of(UNIT)
            || end.is_none_or(|end| end > arena_len)
        {
            return Err(format!(
                "superblock names an index ({buckets} buckets at {offset}) that is unaligned \
                 or outside the arena"
            ));
        }
        Ok(Layout { offset, buckets })
    }

    /// Writes the superblock and every bucket empty (a new group's arena).
    pub fn format(&self, mem: &mut impl Memory) -> Result<(), IndexError> {
        if self.offset >= SUPERBLOCK_LEN {
            mem.write(0, &self.superblock())?;
        }
        for no in 0..=self.buckets {
            mem.write(self.bucket_offset(no), &encode_bucket(no, &Bucket::empty()))?;
        }
        Ok(())
    }

    /// Reads and checks bucket `no` from local memory.
    pub fn bucket(&self, mem: &impl Memory, no: u64) -> Result<Bucket, IndexError> {
        let mut b = [0u8; BUCKET_LEN];
        mem.read(self.bucket_offset(no), &mut b)?;
        decode_bucket(no, &b)
    }

    /// The entry of `key` (hash `hash`): `is_key(entry)` says whether the
    /// object an entry names holds this key (the caller reads its header).
    pub fn find(
        &self,
        mem: &impl Memory,
        hash: u64,
        mut is_key: impl FnMut(&Slot) -> bool,
    ) -> Result<Option<Found>, IndexError> {
        let home = self.home(hash);
        let tag = tag_of(hash);
        for no in [home, home + 1] {
            let b = self.bucket(mem, no)?;
            if let Some((slot, entry)) = b.matching(tag).find(|(_, s)| is_key(s)) {
                return Ok(Some(Found {
                    bucket: no,
                    slot: slot as u8,
                    entry,
                }));
            }
            if no == home && !b.spill {
                break;
            }
        }
        Ok(None)
    }

    /// Applies one edit at sequence number `version` (both nodes, in
    /// sequence order): the bucket is rewritten whole, checksum included.
    /// An edit that cannot be written (a slot outside the index, an entry
    /// without a tag, ...) is refused ([`IndexError::BadEdit`]), nothing
    /// written.
    pub fn apply(
        &self,
        mem: &mut impl Memory,
        edit: &Edit,
        version: u64,
    ) -> Result<(), IndexError> {
        self.apply_as(mem, edit, version, true)
    }

    /// [`Self::apply`] onto a bucket that may be torn: a secondary's copy
    /// of the arena is fuzzy (a bucket read while the primary rewrote it
    /// mixes two versions), but every slot that changed since the copy
    /// began is set again by a write the secondary replays, and the bytes
    /// of the slots that did not change are the same in either version. So
    /// the replay decodes without the checksum and rewrites the bucket
    /// whole, which leaves it exactly as on the primary.
    pub fn apply_over_copy(
        &self,
        mem: &mut impl Memory,
        edit: &Edit,
        version: u64,
    ) -> Result<(), IndexError> {
        self.apply_as(mem, edit, version, false)
    }

    fn apply_as(
        &self,
        mem: &mut impl Memory,
        edit: &Edit,
        version: u64,
        checked: bool,
    ) -> Result<(), IndexError> {
        edit.check_fields(self)?;
        let no = edit.bucket();
        let mut b = if checked {
            self.bucket(mem, no)?
        } else {
            let mut raw = [0u8; BUCKET_LEN];
            mem.read(self.bucket_offset(no), &mut raw)?;
            decode_fields(&raw)
        };
        match *edit {
            Edit::Slot { slot, entry, .. } => b.slots[slot as usize] = entry,
            Edit::Spill { .. } => b.spill = true,
        }
        b.version = version;
        mem.write(self.bucket_offset(no), &encode_bucket(no, &b))?;
        Ok(())
    }

    /// Every entry, bucket by bucket (a scan: `keys`, a rebuild).
    pub fn entries(&self, mem: &impl Memory) -> Result<Vec<Found>, IndexError> {
        let mut out = Vec::new();
        for no in 0..=self.buckets {
            let b = self.bucket(mem, no)?;
            for (i, s) in b.slots.iter().enumerate() {
                if let Some(entry) = s {
                    out.push(Found {
                        bucket: no,
                        slot: i as u8,
                        entry: *entry,
                    });
                }
            }
        }
        Ok(out)
    }
}

/// The index as the primary plans with it: which key has which slot and
/// which slots are taken, including writes not yet exposed in the arena
/// (the arena's bucket bytes change only when a write commits). Kept in
/// step on every node by [`Meta::apply`] with the same edits that
/// [`Layout::apply`] writes, and rebuilt from an arena's bytes by
/// [`Meta::from_memory`] (a node that copied the arena).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Meta {
    layout: Layout,
    /// Per bucket: bit `i` set when slot `i` is taken.
    used: Vec<u32>,
    spill: Vec<bool>,
    /// Per key: its entry and its object's whole generation.
    keys: std::collections::HashMap<Vec<u8>, (Found, u64)>,
    /// Arena offsets of the objects that belong to a key.
    owned: std::collections::HashSet<u64>,
}

impl Meta {
    /// An empty index.
    pub fn new(layout: Layout) -> Meta {
        let n = (layout.buckets + 1) as usize;
        Meta {
            layout,
            used: vec![0; n],
            spill: vec![false; n],
            keys: std::collections::HashMap::new(),
            owned: std::collections::HashSet::new(),
        }
    }

    /// Rebuilds the index's state from an arena: `key_of(entry)` reads the
    /// key and generation from the header of the object an entry names.
    pub fn from_memory(
        layout: Layout,
        mem: &impl Memory,
        mut key_of: impl FnMut(&Slot) -> Option<(Vec<u8>, u64)>,
    ) -> Result<Meta, String> {
        let mut m = Meta::new(layout);
        for no in 0..=layout.buckets {
            let b = layout.bucket(mem, no).map_err(|e| e.to_string())?;
            m.spill[no as usize] = b.spill;
            for (i, s) in b.slots.iter().enumerate() {
                let Some(entry) = s else { continue };
                let (key, generation) = key_of(entry)
                    .ok_or_else(|| format!("index bucket {no} slot {i} names no keyed object"))?;
                if generation as u32 != entry.generation || tag_of(key_hash(&key)) != entry.tag {
                    return Err(format!(
                        "index bucket {no} slot {i} does not match its object's key or generation"
                    ));
                }
                m.used[no as usize] |= 1 << i;
                let f = Found {
                    bucket: no,
                    slot: i as u8,
                    entry: *entry,
                };
                if m.keys.insert(key, (f, generation)).is_some() {
                    return Err(format!(
                        "a key has two index entries (bucket {no} slot {i})"
                    ));
                }
                if !m.owned.insert(entry.offset) {
                    return Err(format!(
                        "two index entries name the object at {} (bucket {no} slot {i})",
                        entry.offset
                    ));
                }
            }
        }
        Ok(m)
    }

    /// Where `key` is.
    pub fn get(&self, key: &[u8]) -> Option<&Found> {
        self.keys.get(key).map(|(f, _)| f)
    }

    /// The whole generation of `key`'s object.
    pub fn generation(&self, key: &[u8]) -> Option<u64> {
        self.keys.get(key).map(|&(_, g)| g)
    }

    /// Whether the object at arena offset `offset` belongs to a key.
    pub fn owns(&self, offset: u64) -> bool {
        self.owned.contains(&offset)
    }

    /// Keys in the index.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    /// Whether the index holds no key.
    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    fn free_slot(&self, no: u64) -> Option<u8> {
        let used = self.used[no as usize];
        (0..SLOTS as u8).find(|i| used & (1 << i) == 0)
    }

    /// The edits that point `key` at `entry`: its own slot if the key is
    /// in the index, else a free slot of its home bucket, else of the next
    /// (marking the home spilled).
    pub fn plan_put(&self, key: &[u8], entry: Slot) -> Result<Vec<Edit>, IndexError> {
        if let Some(f) = self.get(key) {
            return Ok(vec![Edit::Slot {
                bucket: f.bucket,
                slot: f.slot,
                entry: Some(entry),
            }]);
        }
        let home = self.layout.home(key_hash(key));
        debug_assert_eq!(entry.tag, tag_of(key_hash(key)));
        if let Some(slot) = self.free_slot(home) {
            return Ok(vec![Edit::Slot {
                bucket: home,
                slot,
                entry: Some(entry),
            }]);
        }
        let slot = self
            .free_slot(home + 1)
            .ok_or(IndexError::Full { bucket: home })?;
        let mut edits = vec![Edit::Slot {
            bucket: home + 1,
            slot,
            entry: Some(entry),
        }];
        if !self.spill[home as usize] {
            edits.push(Edit::Spill { bucket: home });
        }
        Ok(edits)
    }

    /// The edit that removes `key`, if it is in the index.
    pub fn plan_delete(&self, key: &[u8]) -> Option<Edit> {
        self.get(key).map(|f| Edit::Slot {
            bucket: f.bucket,
            slot: f.slot,
            entry: None,
        })
    }

    /// Applies an edit of `key`, whose object has generation `generation`
    /// (checked: an edit that does not fit the state is a divergence,
    /// reported, nothing changed: every check comes before any change).
    pub fn apply(&mut self, edit: &Edit, key: &[u8], generation: u64) -> Result<(), String> {
        edit.check_fields(&self.layout).map_err(|e| e.to_string())?;
        match *edit {
            Edit::Spill { bucket } => {
                self.spill[bucket as usize] = true;
            }
            Edit::Slot {
                bucket,
                slot,
                entry,
            } => {
                let bit = 1u32 << slot;
                let taken = self.used[bucket as usize] & bit != 0;
                let old = self.keys.get(key).map(|&(f, _)| f);
                let mine = old.is_some_and(|f| f.bucket == bucket && f.slot == slot);
                match entry {
                    Some(entry) => {
                        if taken && !mine {
                            return Err(format!("index slot {bucket}/{slot} is another key's"));
                        }
                        if !taken && old.is_some() {
                            return Err(format!("key already has an index slot ({bucket}/{slot})"));
                        }
                        if entry.generation != generation as u32 {
                            return Err(format!(
                                "index slot {bucket}/{slot} set for generation {generation} with {}",
                                entry.generation
                            ));
                        }
                        let old_offset = old.map(|f| f.entry.offset);
                        if self.owned.contains(&entry.offset) && old_offset != Some(entry.offset) {
                            return Err(format!(
                                "the object at {} already belongs to a key",
                                entry.offset
                            ));
                        }
                        if let Some(o) = old_offset {
                            self.owned.remove(&o);
                        }
                        self.owned.insert(entry.offset);
                        self.used[bucket as usize] |= bit;
                        self.keys.insert(
                            key.to_vec(),
                            (
                                Found {
                                    bucket,
                                    slot,
                                    entry,
                                },
                                generation,
                            ),
                        );
                    }
                    None => {
                        if !mine {
                            return Err(format!("index slot {bucket}/{slot} is not the key's"));
                        }
                        self.used[bucket as usize] &= !bit;
                        if let Some((f, _)) = self.keys.remove(key) {
                            self.owned.remove(&f.entry.offset);
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

#[path = "index_undo.rs"]
mod undo;
pub use undo::MetaUndo;

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
