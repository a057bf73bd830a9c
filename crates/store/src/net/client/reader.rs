//! The one-sided reader: RDMA Reads of the primary's arena, with no
//! server CPU on the path.
//!
//! * An object at a remote pointer ([`Reader::read_ptr`],
//!   [`Reader::read_ptrs`]): one Read of exactly the allocation the
//!   pointer names; the object header's checksum detects a Read that raced
//!   an update, which is retried (`torn_retries`); a generation other than
//!   the pointer's is a stale pointer.
//! * A key ([`Reader::get`], [`Reader::get_many`]): a look-up in the
//!   arena's index ([`crate::lookup`]: the key's bucket, then its object),
//!   or one Read when the key -> pointer cache has the key (a stale entry
//!   is detected by the key in the object's header).
//!
//! Every function here answers `None` where the node must answer instead
//! (no arena known yet, a Read failed, the bytes are no object, the
//! look-up kept racing writes); the faces ([`super::keyed`],
//! [`super::pointers`]) then ask the node through the session. Each
//! fallback of a keyed get is counted with its reason ([`ClientStats`]).

use std::collections::HashMap;

use softrdma_verbs::{Access, MemoryRegion};

use super::error::{ClientError, Unreachable};
use super::session::Session;
use super::ClientStats;
use crate::index::Layout;
use crate::lookup::{Lookup, Outcome, Step};
use crate::net::link::READ_BATCH;
use crate::object::{self, ObjectError};
use crate::proto::{self, StoreError};
use crate::ptr::{ArenaRef, RemotePtr};

/// An object Read of at least this many bytes is scattered: the header
/// and key into the read buffer, the value (and the allocation's padding)
/// straight into the vector the get returns ([`Reader::read_split`]).
/// Below it, the value is copied out of the read buffer: a registration
/// per Read costs more than the copy of a small value.
pub const SPLIT_MIN: usize = 64 << 10;

/// Whether a Read of `len` bytes whose object's header and key take `head`
/// is scattered ([`SPLIT_MIN`]; there must be something after the head).
fn scattered(len: usize, head: usize) -> bool {
    len >= SPLIT_MIN.max(head + 1)
}

/// What a one-sided Read of the allocation a pointer names found.
enum Got {
    /// Its object's value.
    Value(Vec<u8>),
    /// Another generation's object: the pointer is stale.
    Stale,
    /// An object caught mid-write: read again.
    Torn,
    /// No object of that allocation: the node decides.
    Other,
}

impl Got {
    fn of(r: Result<object::Object<'_>, ObjectError>, ptr: RemotePtr) -> Got {
        match r {
            Ok(o) if o.generation != ptr.gen => Got::Stale,
            Ok(o) => Got::Value(o.data.to_vec()),
            Err(ObjectError::Torn) => Got::Torn,
            Err(_) => Got::Other,
        }
    }

    /// [`Got::of`] an allocation read in two parts, `head` (a header) and
    /// `body` (the rest), the value handed out in `body` without a copy.
    fn of_parts(head: &[u8], mut body: Vec<u8>, ptr: RemotePtr) -> Got {
        let len = match object::decode_parts(head, &body) {
            Some(Ok(o)) if o.generation == ptr.gen => o.data.len(),
            Some(r) => return Got::of(r, ptr),
            // A keyed object (its key follows the header): decoded whole.
            None => return Got::of(object::decode_exact(&[head, &body[..]].concat()), ptr),
        };
        body.truncate(len);
        Got::Value(body)
    }
}

/// Key -> pointer entries a client caches (at most about 1 GiB with keys
/// of the largest size, a few tens of MiB with typical ones).
pub const CACHE_ENTRIES: usize = 1 << 20;

/// The one-sided reader's state: its read buffer, the key cache, the
/// index layout and the counters.
#[derive(Default)]
pub(super) struct Reader {
    read_mr: Option<MemoryRegion>,
    /// Key -> (arena offset, allocation length) of its object as last
    /// seen: a hit costs one Read; a stale entry is detected by the key in
    /// the object's header (`lookup`). At most [`CACHE_ENTRIES`].
    cache: HashMap<Vec<u8>, (u64, u32)>,
    /// The key index's layout, read once from the arena's superblock.
    layout: Option<Layout>,
    /// Every counter but `retries` (the session's).
    stats: ClientStats,
    /// Where a keyed get's Reads are copied out of `read_mr` for the
    /// look-up to parse ([`Self::read_arena_into`]): kept, so a get of a
    /// large value neither allocates nor zeroes a buffer per Read (a
    /// `perf` of 1 MiB gets: the zeroing 8% of the client, the copy into
    /// the fresh buffer 11%).
    scratch: Vec<u8>,
}

impl Reader {
    pub(super) fn stats(&self) -> ClientStats {
        self.stats
    }

    /// A read the node served (a fallback, or asked for).
    pub(super) fn count_server_read(&mut self) {
        self.stats.server_reads += 1;
    }

    /// `key`'s object is at `ptr` now (a write or the node said so).
    pub(super) fn remember(&mut self, arena: Option<ArenaRef>, key: &[u8], ptr: RemotePtr) {
        if let Some(a) = arena {
            self.cache_put(key, (ptr.addr - a.base, ptr.len));
        }
    }

    /// `key` has no object now, or may have moved.
    pub(super) fn forget(&mut self, key: &[u8]) {
        self.cache.remove(key);
    }

    /// Forgets every cached key -> pointer entry.
    pub(super) fn clear_cache(&mut self) {
        self.cache.clear();
    }

    /// Caches `key`'s object (arena offset, allocation length); at most
    /// [`CACHE_ENTRIES`] entries: a new key then takes an arbitrary old
    /// one's place (a forgotten key costs its next get one more Read).
    fn cache_put(&mut self, key: &[u8], at: (u64, u32)) {
        if let Some(e) = self.cache.get_mut(key) {
            *e = at;
            return;
        }
        if self.cache.len() >= CACHE_ENTRIES {
            if let Some(old) = self.cache.keys().next().cloned() {
                self.cache.remove(&old);
            }
        }
        self.cache.insert(key.to_vec(), at);
    }

    /// The key index's layout: read once, one-sided, from the arena's
    /// superblock.
    fn layout(&mut self, s: &mut Session) -> Option<Layout> {
        if self.layout.is_none() {
            let arena = s.arena()?;
            let b = self
                .read_arena(s, 0, crate::index::SUPERBLOCK_LEN as u32)
                .ok()?;
            self.layout = Layout::from_superblock(&b, arena.len).ok();
        }
        self.layout
    }

    /// A read buffer of at least `len` bytes.
    fn ensure_read_mr(&mut self, s: &Session, len: usize) -> Result<(), ClientError> {
        if self.read_mr.as_ref().is_none_or(|m| m.len() < len) {
            let want = len.next_power_of_two();
            let mr = s
                .pd()
                .alloc_mr(want, Access::LOCAL_WRITE)
                .map_err(|source| ClientError::ReadBuffer { len: want, source })?;
            self.read_mr = Some(mr);
        }
        Ok(())
    }

    /// One RDMA Read of `len` bytes at arena offset `offset` from the node
    /// the session targets.
    fn read_arena(
        &mut self,
        s: &mut Session,
        offset: u64,
        len: u32,
    ) -> Result<Vec<u8>, ClientError> {
        self.read_arena_into(s, offset, len)?;
        Ok(self.scratch[..len as usize].to_vec())
    }

    /// The arena, if `[offset, offset + len)` lies inside it.
    fn arena_range(s: &Session, offset: u64, len: u32) -> Result<ArenaRef, ClientError> {
        let arena = s.arena().ok_or(Unreachable::ArenaUnknown)?;
        if offset.saturating_add(len as u64) > arena.len {
            return Err(ClientError::OutsideArena {
                offset,
                len: len as u64,
            });
        }
        Ok(arena)
    }

    /// A vector of `len` bytes registered for a scattered Read's value
    /// part (unpinned, as the rendezvous registers its buffers; from the
    /// link's pool, since the Read overwrites all of it).
    fn value_region(s: &Session, len: usize) -> Result<MemoryRegion, ClientError> {
        s.pd()
            .register_with(
                crate::net::link::pool::overwritable(len),
                Access::LOCAL_WRITE,
                crate::net::link::transient(),
            )
            .map_err(|source| ClientError::ReadBuffer { len, source })
    }

    /// [`Self::read_arena`] into the front of [`Self::scratch`] (grown,
    /// never shrunk, so it is zeroed once per size reached; the read
    /// buffer `read_mr` is kept at its largest size the same way): the
    /// bytes read are `scratch[..len]`.
    fn read_arena_into(
        &mut self,
        s: &mut Session,
        offset: u64,
        len: u32,
    ) -> Result<(), ClientError> {
        let arena = Self::arena_range(s, offset, len)?;
        let len = len as usize;
        self.ensure_read_mr(s, len)?;
        let (t, link) = s.target_link()?;
        let mr = self.read_mr.as_ref().expect("read buffer");
        let timeout = s.cfg().attempt_for(len);
        if let Err(e) = link.read(mr, len, arena.base + offset, arena.stag, timeout) {
            return Err(s.read_failed(t, e));
        }
        if self.scratch.len() < len {
            self.scratch.resize(len, 0);
        }
        mr.read_at(0, &mut self.scratch[..len]);
        Ok(())
    }

    /// One RDMA Read of the `len`-byte allocation at arena offset `offset`
    /// scattered in two: its first `head` bytes (an object header and a
    /// key) into the read buffer and copied to the front of
    /// [`Self::scratch`], the rest into a vector of its own, registered
    /// for the Read (unpinned, as the rendezvous registers its buffers)
    /// and returned: a large value is copied once, by the transport, and
    /// not again out of a read buffer.
    fn read_split(
        &mut self,
        s: &mut Session,
        offset: u64,
        len: u32,
        head: usize,
    ) -> Result<Vec<u8>, ClientError> {
        let arena = Self::arena_range(s, offset, len)?;
        let len = len as usize;
        self.ensure_read_mr(s, head)?;
        let body = Self::value_region(s, len - head)?;
        let (t, link) = s.target_link()?;
        let mr = self.read_mr.as_ref().expect("read buffer");
        let sgl = [mr.sge(0, head), body.sge_all()];
        let timeout = s.cfg().attempt_for(len);
        if let Err(e) = link.read_scatter(&sgl, arena.base + offset, arena.stag, timeout) {
            return Err(s.read_failed(t, e));
        }
        if self.scratch.len() < head {
            self.scratch.resize(head, 0);
        }
        mr.read_at(0, &mut self.scratch[..head]);
        Ok(body.into_vec())
    }

    /// Several RDMA Reads `(arena offset, len, head)` posted together; a
    /// Read of [`SPLIT_MIN`] bytes or more and longer than its `head` (an
    /// object header and the key looked up) is scattered as
    /// [`Self::read_split`] scatters one: its head into the read buffer,
    /// the rest into a vector of its own.
    fn read_arena_batch(
        &mut self,
        s: &mut Session,
        reads: &[(u64, u32, usize)],
    ) -> Result<Vec<Batched>, ClientError> {
        // Each Read's stretch of the read buffer (the whole allocation, or
        // the head of a scattered one) and the vector of a scattered one's
        // value.
        let mut offs = Vec::with_capacity(reads.len());
        let mut bodies = Vec::with_capacity(reads.len());
        let (mut total, mut bytes) = (0usize, 0usize);
        let mut arena = None;
        for &(offset, len, head) in reads {
            arena = Some(Self::arena_range(s, offset, len)?);
            let len = len as usize;
            offs.push(total);
            bytes += len;
            if scattered(len, head) {
                total += head.next_multiple_of(64);
                bodies.push(Some(Self::value_region(s, len - head)?));
            } else {
                total += len.next_multiple_of(64);
                bodies.push(None);
            }
        }
        let Some(arena) = arena else {
            return Ok(Vec::new());
        };
        self.ensure_read_mr(s, total)?;
        let (t, link) = s.target_link()?;
        let mr = self.read_mr.as_ref().expect("read buffer");
        let sgls: Vec<Vec<softrdma_verbs::Sge>> = reads
            .iter()
            .zip(&offs)
            .zip(&bodies)
            .map(|((&(_, len, head), &o), body)| match body {
                Some(b) => vec![mr.sge(o, head), b.sge_all()],
                None => vec![mr.sge(o, len as usize)],
            })
            .collect();
        let posts: Vec<(&[softrdma_verbs::Sge], u64)> = sgls
            .iter()
            .zip(reads)
            .map(|(sgl, &(offset, _, _))| (&sgl[..], arena.base + offset))
            .collect();
        if let Err(e) = link.read_scatters(&posts, arena.stag, s.cfg().attempt_for(bytes)) {
            return Err(s.read_failed(t, e));
        }
        Ok(reads
            .iter()
            .zip(&offs)
            .zip(bodies)
            .map(|((&(_, len, head), &o), body)| {
                let mut b = vec![0u8; if body.is_some() { head } else { len as usize }];
                mr.read_at(o, &mut b);
                match body {
                    Some(body) => Batched::Parts(b, body.into_vec()),
                    None => Batched::Whole(b),
                }
            })
            .collect())
    }

    /// `key`'s value by one-sided look-up (the cached pointer, else the
    /// key's index bucket and then the object); `None`: the node must
    /// answer (counted with its reason). `key` is valid.
    pub(super) fn get(&mut self, s: &mut Session, key: &[u8]) -> Option<Option<Vec<u8>>> {
        s.learn_arena();
        let Some(layout) = self.layout(s) else {
            self.stats.keyed_fallback_refused += 1;
            return None;
        };
        let cached = self.cache.get(key).copied();
        // The reader drives the pure look-up itself (as `get_many` does),
        // rather than through `lookup::run` with a closure: the look-up
        // only answers what to read next, and never calls back into the
        // client, so a get's path visits lookup.rs and leaves it.
        let (mut l, mut step) = Lookup::start(key, layout, cached);
        // The value the last Read put in a vector of its own, if it did.
        let mut value = None;
        let head = object::HEADER_LEN + key.len();
        let outcome = loop {
            match step {
                Step::Read { offset, len } if scattered(len as usize, head) => {
                    let body = match self.read_split(s, offset, len, head) {
                        Ok(b) => b,
                        Err(_) => {
                            self.stats.keyed_fallback_refused += 1;
                            return None;
                        }
                    };
                    let head = &self.scratch[..head];
                    step = match l.on_read_parts(head, &body) {
                        Some(st) => st,
                        // Not an object of a key this long: decode it whole.
                        None => l.on_read(&[head, &body[..]].concat()),
                    };
                    value = Some(body);
                }
                Step::Read { offset, len } => match self.read_arena_into(s, offset, len) {
                    Ok(()) => {
                        step = l.on_read(&self.scratch[..len as usize]);
                        value = None;
                    }
                    Err(_) => {
                        self.stats.keyed_fallback_refused += 1;
                        return None;
                    }
                },
                Step::Done(o) => break o,
            }
        };
        let outcome = match value {
            Some(body) => outcome.take_value(body),
            None => outcome,
        };
        self.stats.lookup_restarts += l.restarts() as u64;
        let one_read = cached.is_some() && l.reads() == 1;
        self.finish(s.target(), key, outcome, one_read)
    }

    /// A finished look-up on node `target`: the answer, or `None` to ask
    /// the node.
    fn finish(
        &mut self,
        target: usize,
        key: &[u8],
        o: Outcome,
        one_read: bool,
    ) -> Option<Option<Vec<u8>>> {
        match o {
            Outcome::Found {
                offset,
                len,
                data,
                deadline,
                ..
            } => {
                self.stats.keyed_one_sided += 1;
                self.stats.keyed_one_sided_at[target.min(3)] += 1;
                self.stats.one_sided_reads += 1;
                self.stats.cache_hits += one_read as u64;
                self.cache_put(key, (offset, len));
                // Expired, allowing for this clock's lag behind the
                // primary's (`lookup::live`): absent.
                Some(crate::lookup::live_now(deadline).then_some(data))
            }
            Outcome::Absent => {
                self.stats.keyed_one_sided += 1;
                self.stats.keyed_one_sided_at[target.min(3)] += 1;
                self.stats.one_sided_reads += 1;
                self.cache.remove(key);
                Some(None)
            }
            Outcome::GaveUp => {
                self.stats.keyed_fallback_raced += 1;
                None
            }
        }
    }

    /// Many keys' look-ups side by side, each round of their next Reads
    /// posted together (up to [`READ_BATCH`] in flight on the one
    /// connection). Per key, what [`Self::get`] gives, or `None` where the
    /// key should go the single way (an invalid key, no layout, a failed
    /// batch, a look-up that gave up).
    pub(super) fn get_many(
        &mut self,
        s: &mut Session,
        keys: &[&[u8]],
    ) -> Vec<Option<Option<Vec<u8>>>> {
        let mut out = vec![None; keys.len()];
        s.learn_arena();
        let Some(layout) = self.layout(s) else {
            return out;
        };
        // Running look-ups: (key index, look-up, next read, cached).
        let mut running = Vec::new();
        for (i, k) in keys.iter().enumerate() {
            if proto::check_key(k).is_err() {
                continue;
            }
            let cached = self.cache.get(*k).copied();
            if let (l, Step::Read { offset, len }) = Lookup::start(k, layout, cached) {
                running.push((i, l, (offset, len), cached.is_some()));
            }
        }
        while !running.is_empty() {
            let mut next = Vec::new();
            for chunk in running.chunks_mut(READ_BATCH) {
                let reads: Vec<(u64, u32, usize)> = chunk
                    .iter()
                    .map(|r| (r.2 .0, r.2 .1, object::HEADER_LEN + keys[r.0].len()))
                    .collect();
                let Ok(got) = self.read_arena_batch(s, &reads) else {
                    // These keys go the single way.
                    continue;
                };
                for (r, b) in chunk.iter_mut().zip(got) {
                    let (step, value) = match b {
                        Batched::Whole(b) => (r.1.on_read(&b), None),
                        Batched::Parts(h, body) => match r.1.on_read_parts(&h, &body) {
                            Some(step) => (step, Some(body)),
                            // Not an object of a key this long: whole.
                            None => (r.1.on_read(&[&h[..], &body[..]].concat()), None),
                        },
                    };
                    match step {
                        Step::Read { offset, len } => {
                            r.2 = (offset, len);
                            next.push(r.clone());
                        }
                        Step::Done(o) => {
                            self.stats.lookup_restarts += r.1.restarts() as u64;
                            let one = r.3 && r.1.reads() == 1;
                            let o = match value {
                                Some(body) => o.take_value(body),
                                None => o,
                            };
                            out[r.0] = self.finish(s.target(), keys[r.0], o, one);
                        }
                    }
                }
            }
            running = next;
        }
        out
    }

    /// The object at `ptr` by one-sided Read, torn reads retried;
    /// `Ok(None)`: the node must answer (the pointer is not in the arena
    /// as this client knows it, a Read failed, the bytes are no object or
    /// kept tearing). A generation other than the pointer's is
    /// [`StoreError::StalePointer`].
    pub(super) fn read_ptr(
        &mut self,
        s: &mut Session,
        ptr: RemotePtr,
    ) -> Result<Option<Vec<u8>>, ClientError> {
        s.learn_arena();
        if !one_sided_ok(s.arena(), ptr) {
            // Not ours to read remotely: the node gives the precise error.
            return Ok(None);
        }
        let len = ptr.len as usize;
        if !scattered(len, object::HEADER_LEN) {
            self.ensure_read_mr(s, len)?;
        }
        for _ in 0..=s.cfg().torn_retries {
            let read = if scattered(len, object::HEADER_LEN) {
                self.read_ptr_split(s, ptr)
            } else {
                self.read_ptr_whole(s, ptr)
            };
            match read {
                Some(Got::Value(v)) => {
                    self.stats.one_sided_reads += 1;
                    return Ok(Some(v));
                }
                // Another object took the pointer's space (its generation
                // differs): the pointer is stale, nothing of it is returned.
                Some(Got::Stale) => {
                    return Err(StoreError::StalePointer { expected: ptr.gen }.into())
                }
                Some(Got::Torn) => self.stats.torn_reads += 1,
                Some(Got::Other) | None => break,
            }
        }
        Ok(None)
    }

    /// One Read of the allocation `ptr` names into the read buffer: what
    /// it holds; `None` if the Read failed.
    fn read_ptr_whole(&mut self, s: &mut Session, ptr: RemotePtr) -> Option<Got> {
        let len = ptr.len as usize;
        self.ensure_read_mr(s, len).ok()?;
        let (t, link) = s.target_link().ok()?;
        let mr = self.read_mr.as_ref().expect("read buffer");
        // The arena's STag as the node gave it now (it rotates when
        // credentials are narrowed); the pointer's names the arena.
        let rkey = s.arena().map_or(ptr.stag, |a| a.stag);
        if let Err(e) = link.read(mr, len, ptr.addr, rkey, s.cfg().attempt_for(len)) {
            s.read_failed(t, e);
            return None;
        }
        if self.scratch.len() < len {
            self.scratch.resize(len, 0);
        }
        mr.read_at(0, &mut self.scratch[..len]);
        // Exactly the allocation the pointer names, or the node decides
        // (a pointer whose length is not the allocation's is refused, as
        // it is for update and delete).
        Some(Got::of(object::decode_exact(&self.scratch[..len]), ptr))
    }

    /// [`Self::read_ptr_whole`] of a large allocation, its Read scattered
    /// as a keyed get's is ([`Self::read_split`]: the header into the read
    /// buffer, the value straight into the vector returned).
    fn read_ptr_split(&mut self, s: &mut Session, ptr: RemotePtr) -> Option<Got> {
        let base = s.arena()?.base;
        let head = object::HEADER_LEN;
        let body = self.read_split(s, ptr.addr - base, ptr.len, head).ok()?;
        Some(Got::of_parts(&self.scratch[..head], body, ptr))
    }

    /// The objects at `ptrs` by one-sided Reads, up to [`READ_BATCH`] in
    /// flight at once on the one connection (posted together: over TCP
    /// the requests leave in one system call and the node answers them
    /// together). Per pointer, the answer, or `None` where it should go
    /// the single way ([`Self::read_ptr`]): outside the arena, torn, no
    /// object, or in a batch that failed.
    pub(super) fn read_ptrs(
        &mut self,
        s: &mut Session,
        ptrs: &[RemotePtr],
    ) -> Vec<Option<Result<Vec<u8>, ClientError>>> {
        let mut out: Vec<Option<Result<Vec<u8>, ClientError>>> = Vec::with_capacity(ptrs.len());
        out.resize_with(ptrs.len(), || None);
        s.learn_arena();
        // The pointers a one-sided Read may serve, by batch.
        let readable: Vec<usize> = (0..ptrs.len())
            .filter(|&i| one_sided_ok(s.arena(), ptrs[i]))
            .collect();
        let head = object::HEADER_LEN;
        for batch in readable.chunks(READ_BATCH) {
            let Some(base) = s.arena().map(|a| a.base) else {
                break;
            };
            let reads: Vec<(u64, u32, usize)> = batch
                .iter()
                .map(|&i| (ptrs[i].addr - base, ptrs[i].len, head))
                .collect();
            // A failed batch: its pointers go the single-read way, which
            // reports a read buffer that cannot be had per pointer.
            let Ok(got) = self.read_arena_batch(s, &reads) else {
                continue;
            };
            for (&i, b) in batch.iter().zip(got) {
                let got = match b {
                    Batched::Whole(b) => Got::of(object::decode_exact(&b), ptrs[i]),
                    Batched::Parts(h, body) => Got::of_parts(&h, body, ptrs[i]),
                };
                match got {
                    Got::Value(v) => {
                        self.stats.one_sided_reads += 1;
                        out[i] = Some(Ok(v));
                    }
                    Got::Stale => {
                        out[i] = Some(Err(StoreError::StalePointer {
                            expected: ptrs[i].gen,
                        }
                        .into()));
                    }
                    Got::Torn => self.stats.torn_reads += 1,
                    // Not an object there: `read_ptr` asks the node, which
                    // gives the precise error.
                    Got::Other => {}
                }
            }
        }
        out
    }
}

/// What one Read of a batch brought: the allocation read whole, or its
/// head and the rest ([`Reader::read_arena_batch`]).
enum Batched {
    Whole(Vec<u8>),
    Parts(Vec<u8>, Vec<u8>),
}

/// Whether `ptr` lies in `arena` (as far as this client knows it), so
/// that a one-sided Read may serve it.
fn one_sided_ok(arena: Option<ArenaRef>, ptr: RemotePtr) -> bool {
    arena.is_some_and(|a| {
        crate::ptr::same_arena(ptr.stag, a.stag)
            && ptr.len as usize >= object::HEADER_LEN
            && ptr.addr >= a.base
            && ptr
                .addr
                .checked_add(ptr.len as u64)
                .is_some_and(|e| e <= a.base + a.len)
    })
}
