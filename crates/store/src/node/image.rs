//! The replicated image: what a node holds of its group's data, and the
//! only code that changes it (TigerBeetle's state machine, to the node's
//! replica). [`Image`] owns the arena's memory, the allocator, the key
//! index's planning state, the retry (de-duplication) table and the
//! generations of the pointer API's objects, and knows nothing of roles,
//! epochs, peers or leases: the protocol ([`super`]) decides which writes
//! it applies, in which order, and when their bytes are exposed.
//!
//! Why every replica's image is the same after the same writes:
//!
//! * A write is decided once, by the primary's [`Image::plan`], which reads
//!   and changes nothing; what is replicated is its outcome (a [`RepOp`]:
//!   effects at explicit offsets, and the client's reply), so no replica
//!   decides anything again.
//! * Applying a write is two halves: [`Image::apply_meta`] (allocator,
//!   index state, retry table; every check of the bytes' effects too) and
//!   [`Image::apply_bytes`], which therefore cannot fail on a well-formed
//!   arena. Both depend on the image and the write only, and the sequence
//!   number must be the next one, so replicas that apply the same writes
//!   in order hold the same allocator, index and table, and the same bytes
//!   once every write is exposed.
//! * The primary applies the first half at once and the second when the
//!   write commits ([`Image::stage`], [`Image::expose`]): the arena's bytes,
//!   which clients read one-sided, hold committed writes only, while plans
//!   see every write applied so far. A secondary applies both at once.
//! * A copy ([`Image::begin_copy`] .. [`Image::rebuild_unkeyed_gens`])
//!   takes the allocator and the retry table as of a sequence number, the
//!   bytes fuzzily, replays every later write over them
//!   (`Layout::apply_over_copy` repairs a torn bucket) and then rebuilds
//!   the index state and the generations from the bytes, which are by
//!   then exactly the primary's.

use std::collections::{BTreeMap, VecDeque};

use crate::alloc::{AllocError, AllocSnapshot, Allocator};
use crate::arena::Memory;
use crate::index::{self, Layout, Meta};
use crate::object;
use crate::proto::{Bytes, DedupEntry, Effect, Op, RepOp, Reply, StoreError};
use crate::ptr::{ArenaRef, PtrError, RemotePtr};

#[path = "image_keys.rs"]
mod keys;

#[path = "image_batch.rs"]
mod batch;

#[path = "image_deadlines.rs"]
mod deadlines;

/// A write applied to the allocator and the retry table but not yet to
/// the arena's bytes.
#[derive(Debug, Clone)]
struct Staged {
    seq: u64,
    op: RepOp,
    /// The allocation of each `Write` and `Retime` effect, in order.
    caps: Vec<u64>,
}

/// Why a copy's starting state was refused ([`Image::begin_copy`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CopyStartError {
    /// The allocator snapshot does not decode.
    Malformed,
    /// Another arena's (its size or its STag index differs).
    OtherArena,
}

/// The replicated image of one node over memory `M`.
pub(super) struct Image<M: Memory> {
    /// The arena, its STag as of the last applied rotation.
    arena: ArenaRef,
    mem: M,
    alloc: Allocator,
    dedup: BTreeMap<u64, DedupEntry>,
    /// Highest applied write.
    applied_seq: u64,
    /// Writes applied to the allocator and the retry table but not yet to
    /// the arena's bytes: a primary makes a write visible to one-sided
    /// readers only once it is committed (held by the in-sync secondary,
    /// or by the primary alone where that is allowed), so no reader sees a
    /// write that a failover could lose. In sequence order, ending at
    /// `applied_seq`.
    unexposed: VecDeque<Staged>,
    /// The key index's place in the arena: known once the arena holds a
    /// group's data (formatted by a new group's first primary, or copied).
    layout: Option<Layout>,
    /// The key index as planned with (including unexposed writes); `None`
    /// while the node has no data or is still replaying its copy.
    index: Option<Meta>,
    /// The generation of every object of the pointer API, by arena
    /// offset, as planned with (including unexposed writes): a pointer
    /// whose generation differs is stale (finding 3). Kept by every
    /// replica as it applies writes; rebuilt from the headers after a copy.
    unkeyed_gens: BTreeMap<u64, u64>,
    /// While a batch is planned ([`Image::plan_batch`]): the object writes
    /// of its writes so far, which the next ones read (`current_object`).
    batch_writes: Vec<Effect>,
    /// The node's wall time (Unix milliseconds) as of its last input.
    wall_ms: u64,
    /// The keys with a deadline, as planned with (including unexposed
    /// writes): what a primary reclaims once they expire.
    deadlines: deadlines::Deadlines,
    /// Whether the arena may still hold objects of data this image
    /// discarded ([`Image::reset`]): [`Image::format`] zeroes it then, or a
    /// client's cached pointer would still find a discarded object whole.
    stale_bytes: bool,
}

fn ptr_error(e: PtrError) -> StoreError {
    match e {
        PtrError::WrongStag { got, expected } => StoreError::WrongStag { got, expected },
        PtrError::OutOfArena { .. } => StoreError::OutOfArena,
        PtrError::Freed { .. } => StoreError::Freed,
        PtrError::NotAllocated { .. } | PtrError::Parse(_) => StoreError::NotAllocated,
    }
}

impl<M: Memory> Image<M> {
    /// An empty image of `arena` in `mem` (its contents are irrelevant:
    /// formatting or a copy overwrites what is read).
    pub(super) fn new(arena: ArenaRef, mem: M) -> Image<M> {
        Image {
            alloc: Allocator::new(arena.len),
            arena,
            mem,
            dedup: BTreeMap::new(),
            applied_seq: 0,
            unexposed: VecDeque::new(),
            batch_writes: Vec::new(),
            layout: None,
            index: None,
            unkeyed_gens: BTreeMap::new(),
            wall_ms: 0,
            deadlines: Default::default(),
            stale_bytes: false,
        }
    }

    /// The node's wall time now (Unix milliseconds), by which plans decide
    /// which keys have expired.
    pub(super) fn set_wall_ms(&mut self, ms: u64) {
        self.wall_ms = ms;
    }

    /// Whether a key whose object carries `deadline` has expired, by this
    /// node's clock (a primary's decision; readers allow for their clock's
    /// lag, `lookup::live`).
    pub(super) fn expired(&self, deadline: u64) -> bool {
        deadline != 0 && self.wall_ms >= deadline
    }

    /// Discards all data (the STag stays the last one applied).
    pub(super) fn reset(&mut self) {
        self.alloc = Allocator::new(self.arena.len);
        self.dedup.clear();
        self.applied_seq = 0;
        self.unexposed.clear();
        self.layout = None;
        self.index = None;
        self.unkeyed_gens.clear();
        self.deadlines.clear();
        self.stale_bytes = true;
    }

    /// Reserves and formats the key index at offset 0, with `buckets`
    /// buckets (0: `Layout::for_arena`'s default): a new group's first
    /// primary, whose arena holds nothing yet.
    pub(super) fn format(&mut self, buckets: u64) {
        assert_eq!(self.applied_seq, 0, "a node with data knows its index");
        if std::mem::take(&mut self.stale_bytes) {
            // A group started over on a node that held data (an operator's
            // reset): no object of it may stay readable.
            let zeros = vec![0u8; 1 << 20];
            let mut off = 0;
            while off < self.arena.len {
                let n = (self.arena.len - off).min(zeros.len() as u64);
                self.mem
                    .write(off, &zeros[..n as usize])
                    .expect("inside the arena");
                off += n;
            }
        }
        let layout = Layout::for_arena(self.arena.len, buckets);
        self.alloc
            .alloc_at(0, layout.reserved_len())
            .expect("the index fits an empty arena");
        layout
            .format(&mut self.mem)
            .expect("the index lies inside the arena");
        self.layout = Some(layout);
        self.index = Some(Meta::new(layout));
    }

    // ------------------------------------------------------------ accessors

    /// The arena (its STag as of the last applied rotation).
    pub(super) fn arena(&self) -> ArenaRef {
        self.arena
    }
    /// The arena memory.
    pub(super) fn memory(&self) -> &M {
        &self.mem
    }
    /// The allocator.
    pub(super) fn allocator(&self) -> &Allocator {
        &self.alloc
    }
    /// The key index's layout, once the image holds a group's data.
    pub(super) fn layout(&self) -> Option<Layout> {
        self.layout
    }
    /// The key index's planning state, once the image holds a group's data.
    pub(super) fn index_meta(&self) -> Option<&Meta> {
        self.index.as_ref()
    }
    /// Highest applied write.
    pub(super) fn applied_seq(&self) -> u64 {
        self.applied_seq
    }
    /// The retry table.
    pub(super) fn dedup_table(&self) -> Vec<DedupEntry> {
        self.dedup.values().cloned().collect()
    }
    /// The last write of `client`, if any.
    pub(super) fn dedup_entry(&self, client: u64) -> Option<&DedupEntry> {
        self.dedup.get(&client)
    }
    /// Whether some applied write's bytes are not in the arena yet.
    pub(super) fn has_unexposed(&self) -> bool {
        !self.unexposed.is_empty()
    }
    /// The first write whose bytes are not in the arena yet.
    pub(super) fn first_unexposed(&self) -> Option<u64> {
        self.unexposed.front().map(|w| w.seq)
    }
    /// The unexposed writes from `first` on, in order.
    pub(super) fn unexposed_from(&self, first: u64) -> Vec<(u64, RepOp)> {
        self.unexposed
            .iter()
            .filter(|w| w.seq >= first)
            .map(|w| (w.seq, w.op.clone()))
            .collect()
    }

    /// Panics unless the unexposed writes are the last applied ones,
    /// contiguous (and, in debug builds, the allocator is consistent).
    pub(super) fn check_invariants(&self) {
        if let (Some(f), Some(b)) = (self.unexposed.front(), self.unexposed.back()) {
            assert!(
                b.seq == self.applied_seq && b.seq - f.seq + 1 == self.unexposed.len() as u64,
                "unexposed writes are the last applied ones, contiguous"
            );
        }
        debug_assert!({
            self.alloc.check_invariants();
            self.deadlines.check_invariants();
            true
        });
    }

    // ------------------------------------------------------------ reads

    /// The pointer API's read of the committed object `ptr` names.
    pub(super) fn read(&self, ptr: RemotePtr) -> Result<Reply, StoreError> {
        let off = self.object_offset(&ptr)?;
        // Another object of the pointer API holds the space now (maybe
        // not yet exposed in the bytes).
        let keyed = self.index.as_ref().is_some_and(|m| m.owns(off));
        if !keyed && self.unkeyed_gens.get(&off) != Some(&ptr.gen) {
            return Err(StoreError::StalePointer { expected: ptr.gen });
        }
        match object::read_object(&self.mem, off, ptr.len as u64) {
            // The space holds another object than the pointer's.
            Ok(o) if o.generation != ptr.gen => Err(StoreError::StalePointer { expected: ptr.gen }),
            Ok(o) => Ok(Reply::Data {
                version: o.version,
                data: o.data,
            }),
            // A live allocation whose bytes are not exposed yet (empty, or
            // what an older object left there, which does not decode):
            // another object's, being written. (This loop is the only
            // writer of the arena, so a committed object never reads torn
            // here; and a pointer is handed out only once its object is
            // committed.)
            Err(object::ObjectError::Empty | object::ObjectError::Torn) => {
                Err(StoreError::StalePointer { expected: ptr.gen })
            }
            Err(e) => Err(StoreError::Other(e.to_string())),
        }
    }

    // ------------------------------------------------------------ planning

    /// The largest value that an object with a key of `key_len` bytes (0:
    /// the pointer API) can hold: the largest allocation there can be (the
    /// arena less the key index's region, and what a pointer's 32-bit
    /// length names) less the header and the key.
    fn max_value(&self, key_len: usize) -> u64 {
        let reserved = self.layout.map_or(0, |l| l.reserved_len());
        let largest = self.alloc.size().saturating_sub(reserved);
        let largest = largest.min(u32::MAX as u64 & !(object::UNIT - 1));
        // The protocol's limit too: a client that sends more (past its own
        // library's check) is refused, not served with a long stall.
        largest
            .saturating_sub(object::encoded_len(key_len, 0) as u64)
            .min(crate::proto::MAX_VALUE as u64)
    }

    fn alloc_error(&self, e: AllocError, key_len: usize, value_len: usize) -> StoreError {
        match e {
            AllocError::TooLarge { .. } => StoreError::TooLarge {
                len: value_len as u64,
                max: self.max_value(key_len),
            },
            AllocError::Full { largest_free, .. } => StoreError::Full { largest_free },
            e => StoreError::Other(e.to_string()),
        }
    }

    /// A new allocation for an object of a `key_len`-byte key and a
    /// `value_len`-byte value: its offset and length. A value that no
    /// allocation could ever hold is `TooLarge` (not `Full`), with the
    /// largest that could be stored.
    fn new_allocation(&self, key_len: usize, value_len: usize) -> Result<(u64, u64), StoreError> {
        if value_len as u64 > self.max_value(key_len) {
            return Err(StoreError::TooLarge {
                len: value_len as u64,
                max: self.max_value(key_len),
            });
        }
        let need = object::encoded_len(key_len, value_len) as u64;
        let off = self
            .alloc
            .find_fit(need)
            .map_err(|e| self.alloc_error(e, key_len, value_len))?;
        Ok((off, crate::alloc::round_up(need).unwrap()))
    }

    fn ptr_at(&self, off: u64, len: u64, gen: u64) -> RemotePtr {
        RemotePtr {
            addr: self.arena.base + off,
            stag: self.arena.stag,
            len: len as u32,
            gen,
        }
    }

    /// The arena offset a pointer of the pointer API names: an allocation
    /// (`RemotePtr::validate`), and not the key index's region, which is
    /// one but holds no object.
    fn object_offset(&self, ptr: &RemotePtr) -> Result<u64, StoreError> {
        let off = ptr.validate(&self.arena, &self.alloc).map_err(ptr_error)?;
        if let Some(l) = self.layout.filter(|l| off < l.reserved_len()) {
            return Err(StoreError::Other(format!(
                "the pointer names the key index (arena bytes 0..{}), not an object",
                l.reserved_len()
            )));
        }
        Ok(off)
    }

    /// The arena offset a pointer names, for a write of the pointer API:
    /// objects that belong to a key change only through the key, and the
    /// object must be the pointer's (its generation), not one that took
    /// its space after a delete.
    fn unkeyed_offset(&self, ptr: &RemotePtr) -> Result<u64, StoreError> {
        let off = self.object_offset(ptr)?;
        if self.index.as_ref().is_some_and(|m| m.owns(off)) {
            return Err(StoreError::Keyed);
        }
        if self.unkeyed_gens.get(&off) != Some(&ptr.gen) {
            return Err(StoreError::StalePointer { expected: ptr.gen });
        }
        Ok(off)
    }

    /// Decides a write's effects (as the next write, `applied_seq + 1`)
    /// without changing anything.
    pub(super) fn plan(&self, op: &Op) -> Result<(Vec<Effect>, Reply), StoreError> {
        let seq = self.applied_seq + 1;
        let write = |offset: u64, data: &Bytes, generation: u64| Effect::Write {
            offset,
            version: seq,
            generation,
            key: Vec::new(),
            data: data.clone(),
            deadline: 0,
        };
        match op {
            Op::Insert { data } => {
                let (off, len) = self.new_allocation(0, data.len())?;
                Ok((
                    vec![Effect::Alloc { offset: off, len }, write(off, data, seq)],
                    Reply::Inserted(self.ptr_at(off, len, seq)),
                ))
            }
            Op::Update { ptr, data } => {
                let off = self.unkeyed_offset(ptr)?;
                let need = object::encoded_len(0, data.len());
                if need as u64 <= ptr.len as u64 {
                    // In place: the object keeps its generation (and the
                    // pointer stays valid); its STag is the arena's now.
                    let p = RemotePtr {
                        stag: self.arena.stag,
                        ..*ptr
                    };
                    return Ok((vec![write(off, data, ptr.gen)], Reply::Updated(p)));
                }
                let (new_off, len) = self.new_allocation(0, data.len())?;
                Ok((
                    vec![
                        Effect::Alloc {
                            offset: new_off,
                            len,
                        },
                        write(new_off, data, seq),
                        Effect::Free { offset: off },
                    ],
                    Reply::Updated(self.ptr_at(new_off, len, seq)),
                ))
            }
            Op::Delete { ptr } => {
                let off = self.unkeyed_offset(ptr)?;
                Ok((vec![Effect::Free { offset: off }], Reply::Deleted))
            }
            // A put's value has no deadline (as Redis's SET clears one).
            Op::Put {
                key,
                data,
                cond,
                ttl,
            } => self.plan_put(seq, key, data, *cond, *ttl),
            Op::Remove { key } => self.plan_remove(key),
            Op::Modify { key, how } => self.plan_modify(seq, key, how),
            Op::RotateStag { stag } => {
                if !crate::ptr::same_arena(*stag, self.arena.stag) || *stag == 0 {
                    return Err(StoreError::Other(format!(
                        "a rotation keeps the arena's STag index ({:#010x} -> {stag:#010x})",
                        self.arena.stag
                    )));
                }
                Ok((
                    vec![Effect::Stag { stag: *stag }],
                    Reply::Rotated { stag: *stag },
                ))
            }
            Op::Batch { .. } => Err(StoreError::BatchTooLarge {
                ops: 0,
                len: 0,
                max: crate::proto::MAX_BATCH_BYTES as u64,
            }),
            Op::Read { .. } | Op::Get { .. } | Op::Scan { .. } | Op::Status => {
                unreachable!("not a write")
            }
        }
    }

    // ------------------------------------------------------------ applying

    /// Applies a write's effects, allocator and arena bytes; identical on
    /// every replica. `over_copy`: a write replayed over a fuzzy copy of
    /// the arena (its index buckets may be torn; `Layout::apply_over_copy`).
    pub(super) fn apply(&mut self, seq: u64, op: &RepOp, over_copy: bool) -> Result<(), String> {
        let caps = self.apply_meta(seq, op)?;
        self.apply_bytes(seq, op, &caps, over_copy)
    }

    /// Applies write `seq` to everything but the arena's bytes, which
    /// [`Self::expose`] writes later (a primary's write, until it commits).
    pub(super) fn stage(&mut self, seq: u64, op: RepOp) -> Result<(), String> {
        let caps = self.apply_meta(seq, &op)?;
        self.unexposed.push_back(Staged { seq, op, caps });
        Ok(())
    }

    /// Writes the bytes of every unexposed write through `seq` into the
    /// arena, in order.
    pub(super) fn expose(&mut self, seq: u64) {
        while self.unexposed.front().is_some_and(|w| w.seq <= seq) {
            let w = self.unexposed.pop_front().expect("front");
            self.apply_bytes(w.seq, &w.op, &w.caps, false)
                .expect("apply_meta checked every effect");
        }
    }

    /// The bytes of write `seq` whose allocator effects [`Self::apply_meta`]
    /// already applied (checked there: they cannot fail on a well-formed
    /// arena); `caps`: the allocation of each `Write` effect, in order, as
    /// `apply_meta` found them.
    ///
    /// A batch's bytes are written together ([`Memory::begin_together`]):
    /// the RESP door's look-ups on this node see all of its keys' new
    /// values or none; and every write's bytes are one change
    /// ([`Memory::begin_group`]), which a large value the door sends from
    /// the arena is never in the middle of.
    fn apply_bytes(
        &mut self,
        seq: u64,
        op: &RepOp,
        caps: &[u64],
        over_copy: bool,
    ) -> Result<(), String> {
        let together = matches!(op.reply, Reply::Batch(_)) && op.effects.len() > 1;
        // One change for the door's pins, whatever it writes.
        self.mem.begin_group();
        if together {
            self.mem.begin_together();
        }
        let r = self.apply_effects(seq, op, caps, over_copy);
        if together {
            self.mem.end_together();
        }
        self.mem.end_group();
        r
    }

    /// [`Self::apply_bytes`]'s effects, in order.
    fn apply_effects(
        &mut self,
        seq: u64,
        op: &RepOp,
        caps: &[u64],
        over_copy: bool,
    ) -> Result<(), String> {
        let mut caps = caps.iter();
        for e in &op.effects {
            match e {
                Effect::Alloc { .. } => {}
                Effect::Write {
                    offset,
                    version,
                    generation,
                    key,
                    data,
                    deadline,
                } => {
                    let cap = *caps.next().ok_or("allocation of a write unknown")?;
                    let f = object::Fields {
                        version: *version,
                        generation: *generation,
                        key,
                        data,
                        deadline: *deadline,
                    };
                    object::write_object(&mut self.mem, *offset, cap, &f)
                        .map_err(|e| e.to_string())?;
                }
                Effect::Retime {
                    offset,
                    key,
                    version,
                    deadline,
                } => {
                    let cap = *caps.next().ok_or("allocation of a retime unknown")?;
                    object::retime(&mut self.mem, *offset, cap, key, *version, *deadline)
                        .map_err(|e| format!("a retime at {offset}: {e}"))?;
                }
                Effect::Free { offset } => {
                    object::scrub(&mut self.mem, *offset).map_err(|e| e.to_string())?;
                }
                // Applied in `apply_meta`: no bytes.
                Effect::Stag { .. } => {}
                Effect::Index { edit, .. } => {
                    let layout = self.layout.ok_or("an index edit before the index")?;
                    if over_copy {
                        layout.apply_over_copy(&mut self.mem, edit, seq)
                    } else {
                        layout.apply(&mut self.mem, edit, seq)
                    }
                    .map_err(|e| e.to_string())?;
                }
            }
        }
        Ok(())
    }

    /// A write's effects on the allocator, the key index's state and the
    /// retry table, with every check of its bytes' effects (so
    /// [`Self::apply_bytes`] cannot fail); returns the allocation of each
    /// `Write` effect.
    fn apply_meta(&mut self, seq: u64, op: &RepOp) -> Result<Vec<u64>, String> {
        if seq != self.applied_seq + 1 {
            return Err(format!(
                "write {seq} out of order after {}",
                self.applied_seq
            ));
        }
        let mut caps = Vec::new();
        for e in &op.effects {
            match e {
                Effect::Alloc { offset, len } => self
                    .alloc
                    .alloc_at(*offset, *len)
                    .map_err(|e| e.to_string())?,
                Effect::Write {
                    offset,
                    key,
                    data,
                    generation,
                    deadline,
                    ..
                } => {
                    if *deadline > object::MAX_DEADLINE || (key.is_empty() && *deadline != 0) {
                        return Err(format!("deadline {deadline} of a write at {offset}"));
                    }
                    if key.is_empty() {
                        self.unkeyed_gens.insert(*offset, *generation);
                    }
                    self.deadlines.written(*offset, key, *deadline);
                    let cap = self
                        .alloc
                        .allocation_at(*offset)
                        .ok_or_else(|| format!("write to unallocated offset {offset}"))?;
                    if object::encoded_len(key.len(), data.len()) as u64 > cap
                        || key.len() > object::MAX_KEY_LEN
                    {
                        return Err(format!(
                            "write of {} bytes into an allocation of {cap} at {offset}",
                            key.len() + data.len()
                        ));
                    }
                    caps.push(cap);
                }
                Effect::Retime {
                    offset,
                    key,
                    deadline,
                    ..
                } => {
                    if *deadline > object::MAX_DEADLINE || key.is_empty() {
                        return Err(format!("a retime to {deadline} at {offset}"));
                    }
                    let cap = self
                        .alloc
                        .allocation_at(*offset)
                        .ok_or_else(|| format!("a retime of unallocated offset {offset}"))?;
                    self.deadlines.written(*offset, key, *deadline);
                    caps.push(cap);
                }
                Effect::Free { offset } => {
                    self.alloc.free(*offset).map_err(|e| e.to_string())?;
                    self.unkeyed_gens.remove(offset);
                    self.deadlines.freed(*offset);
                }
                Effect::Stag { stag } => {
                    if !crate::ptr::same_arena(*stag, self.arena.stag) {
                        return Err(format!(
                            "a rotation to STag {stag:#010x} changes the arena's index ({:#010x})",
                            self.arena.stag
                        ));
                    }
                    self.arena.stag = *stag;
                }
                Effect::Index {
                    key,
                    generation,
                    edit,
                } => {
                    let layout = self.layout.ok_or("an index edit before the index")?;
                    // Checked here whether or not the index's state is
                    // kept (it is not while replaying a copy: rebuilt
                    // afterwards), so `apply_bytes` cannot fail on it.
                    edit.validate(&layout, self.arena.len)
                        .map_err(|e| e.to_string())?;
                    if let Some(m) = &mut self.index {
                        m.apply(edit, key, *generation)?;
                    }
                }
            }
        }
        self.dedup.insert(
            op.client,
            DedupEntry {
                client: op.client,
                req_id: op.req_id,
                seq,
                reply: op.reply.clone(),
            },
        );
        self.applied_seq = seq;
        Ok(caps)
    }

    // ------------------------------------------------------------ copying

    /// Starts a copy: the allocator and the retry table as the primary had
    /// them before write `start_seq`, under STag `stag`; the bytes come
    /// next ([`Self::write_chunk`]), the layout once they are whole
    /// ([`Self::load_layout`]). Nothing changes if it is refused.
    pub(super) fn begin_copy(
        &mut self,
        start_seq: u64,
        alloc: &AllocSnapshot,
        dedup: Vec<DedupEntry>,
        stag: u32,
    ) -> Result<(), CopyStartError> {
        let a = Allocator::from_snapshot(alloc).map_err(|_| CopyStartError::Malformed)?;
        if a.size() != self.alloc.size() || !crate::ptr::same_arena(stag, self.arena.stag) {
            return Err(CopyStartError::OtherArena);
        }
        self.alloc = a;
        self.arena.stag = stag;
        self.unkeyed_gens.clear();
        self.layout = None;
        self.index = None;
        self.dedup = dedup.into_iter().map(|d| (d.client, d)).collect();
        self.applied_seq = start_seq - 1;
        Ok(())
    }

    /// Copies a chunk of the primary's arena into ours.
    pub(super) fn write_chunk(&mut self, offset: u64, data: &[u8]) -> Result<(), String> {
        self.mem.write(offset, data).map_err(|e| e.to_string())
    }

    /// Takes the key index's layout from the copied arena's superblock (it
    /// never changes after the group's first primary wrote it, so the copy
    /// holds it whole).
    pub(super) fn load_layout(&mut self) -> Result<(), String> {
        let mut sb = [0u8; index::SUPERBLOCK_LEN as usize];
        let layout = self
            .mem
            .read(0, &mut sb)
            .map_err(|e| e.to_string())
            .and_then(|()| Layout::from_superblock(&sb, self.arena.len))?;
        self.layout = Some(layout);
        self.index = None;
        Ok(())
    }

    /// Rebuilds the key index's state from the arena's bytes (after a copy
    /// and its replay: they are then exactly the primary's).
    pub(super) fn rebuild_index(&mut self) -> Result<(), String> {
        let layout = self.layout.expect("loaded before");
        let mem = &self.mem;
        let m = Meta::from_memory(layout, mem, |s| object::read_key(mem, s.offset).ok())
            .map_err(|e| e.to_string())?;
        self.index = Some(m);
        Ok(())
    }

    /// Rebuilds the keys' deadlines from the objects' headers (after
    /// [`Self::rebuild_index`]).
    pub(super) fn rebuild_deadlines(&mut self) -> Result<(), String> {
        self.deadlines.clear();
        let Some(m) = &self.index else {
            return Ok(());
        };
        for (off, _) in self.alloc.allocations() {
            if m.owns(off) {
                let h = object::read_head(&self.mem, off)
                    .map_err(|e| format!("the object at {off}: {e}"))?;
                self.deadlines.written(off, &h.key, h.deadline);
            }
        }
        Ok(())
    }

    /// The keys whose deadline this node's clock has reached (at most
    /// `max`, and `max_bytes` of keys): what a primary reclaims next.
    pub(super) fn due_keys(&self, max: usize, max_bytes: usize) -> Vec<Vec<u8>> {
        self.deadlines.due(self.wall_ms, max, max_bytes)
    }

    /// How many keys have a deadline, and their mean deadline.
    pub(super) fn expires(&self) -> (u64, u64) {
        self.deadlines.count_and_mean()
    }

    /// Keys with a deadline.
    #[cfg(any(test, feature = "testing"))]
    pub(super) fn keys_with_deadlines(&self) -> usize {
        self.deadlines.len()
    }

    /// Rebuilds [`Self::unkeyed_gens`] from the objects' headers (after
    /// [`Self::rebuild_index`]): every allocation past the index's region
    /// that no key owns holds an object of the pointer API.
    pub(super) fn rebuild_unkeyed_gens(&mut self) -> Result<(), String> {
        let reserved = self.layout.map_or(0, |l| l.reserved_len());
        let mut gens = BTreeMap::new();
        for (off, _) in self.alloc.allocations() {
            if off < reserved || self.index.as_ref().is_some_and(|m| m.owns(off)) {
                continue;
            }
            let (key, generation) = object::read_key(&self.mem, off)
                .map_err(|e| format!("the object at {off}: {e}"))?;
            if !key.is_empty() {
                return Err(format!("the object at {off} has a key no slot names"));
            }
            gens.insert(off, generation);
        }
        self.unkeyed_gens = gens;
        Ok(())
    }
}
