//! Deterministic allocator over arena offsets.
//!
//! The allocator hands out 64-byte aligned ranges of an arena. Its metadata
//! lives entirely **outside** the arena (ordinary `BTreeMap`s), so the arena
//! holds nothing but objects, and a remote reader can never corrupt or be
//! confused by allocator state.
//!
//! Policy: best fit, ties broken by the lowest offset; freed ranges coalesce
//! with their free neighbours. Every decision depends only on the sequence
//! of operations, so the same sequence always yields the same offsets. A
//! secondary does not rely on that, though: it applies the primary's
//! choices with [`Allocator::alloc_at`].
//!
//! ```
//! use softrdma_store::alloc::Allocator;
//! let mut a = Allocator::new(4096);
//! let x = a.alloc(100).unwrap();          // 128 bytes at offset 0
//! let mut b = Allocator::new(4096);
//! b.alloc_at(x, 100).unwrap();             // the replica mirrors it
//! assert!(b.is_allocated(x, 128));
//! ```

use std::collections::{BTreeMap, BTreeSet};

use rustc_hash::FxHashMap;

/// Alignment (and granularity) of every allocation.
pub const ALIGN: u64 = 64;

/// Errors from the allocator. None of them changes any state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AllocError {
    /// A zero-length allocation was requested.
    #[error("zero-length allocation")]
    ZeroLength,
    /// The request can never be satisfied, even by an empty arena.
    #[error(
        "allocation of {requested} bytes exceeds the largest possible allocation ({max} bytes)"
    )]
    TooLarge {
        /// Requested length (before rounding).
        requested: u64,
        /// Arena size.
        max: u64,
    },
    /// No free range is large enough right now.
    #[error(
        "arena full: no free range of {requested} bytes (largest free range: {largest_free} bytes)"
    )]
    Full {
        /// Requested length (before rounding).
        requested: u64,
        /// Largest free range.
        largest_free: u64,
    },
    /// The offset was allocated once and has since been freed.
    #[error("double free of offset {offset}")]
    DoubleFree {
        /// The offset.
        offset: u64,
    },
    /// The offset is not the start of an allocation.
    #[error("offset {offset} is not the start of an allocation")]
    NotAllocated {
        /// The offset.
        offset: u64,
    },
    /// `alloc_at` asked for a range that is not entirely free.
    #[error("range {offset}+{len} is not free")]
    NotFree {
        /// The offset.
        offset: u64,
        /// The rounded length.
        len: u64,
    },
    /// `alloc_at` asked for an offset that is not 64-byte aligned.
    #[error("offset {offset} is not {ALIGN}-byte aligned")]
    Misaligned {
        /// The offset.
        offset: u64,
    },
}

/// Usage figures.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Arena size.
    pub size: u64,
    /// Bytes in allocations (rounded).
    pub allocated: u64,
    /// Bytes free.
    pub free: u64,
    /// Number of allocations.
    pub allocations: u64,
    /// Number of free ranges (fragmentation).
    pub free_ranges: u64,
    /// Largest free range.
    pub largest_free: u64,
}

/// The state needed to rebuild an identical allocator (used by recovery).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AllocSnapshot {
    /// Arena size.
    pub size: u64,
    /// `(offset, rounded length)` of every allocation, by offset.
    pub allocations: Vec<(u64, u64)>,
    /// Offsets freed and not reused since (for double-free reporting).
    pub freed: Vec<u64>,
}

/// Allocator over `[0, size)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Allocator {
    size: u64,
    /// Free ranges: offset -> length.
    free: BTreeMap<u64, u64>,
    /// Free ranges by (length, offset), for best fit.
    by_size: BTreeSet<(u64, u64)>,
    /// Allocations: offset -> rounded length. Hashed, not ordered: every
    /// write looks its allocation up (a node's `apply_meta`), and a
    /// B-tree of 40,000 allocations cost a cache miss per level there
    /// (8.6% of a primary's node loop under SETs); only snapshots and
    /// rebuilds want them in order, and sort them.
    allocated: FxHashMap<u64, u64>,
    /// Starts of freed allocations whose bytes are still free.
    freed: BTreeSet<u64>,
    allocated_bytes: u64,
}

/// Rounds `len` up to [`ALIGN`], or `None` on overflow.
pub fn round_up(len: u64) -> Option<u64> {
    len.checked_add(ALIGN - 1).map(|l| l & !(ALIGN - 1))
}

impl Allocator {
    /// An empty allocator over `size` bytes (rounded down to [`ALIGN`]).
    pub fn new(size: u64) -> Allocator {
        let size = size & !(ALIGN - 1);
        let mut a = Allocator {
            size,
            free: BTreeMap::new(),
            by_size: BTreeSet::new(),
            allocated: FxHashMap::default(),
            freed: BTreeSet::new(),
            allocated_bytes: 0,
        };
        if size > 0 {
            a.insert_free(0, size);
        }
        a
    }

    /// Arena size managed.
    pub fn size(&self) -> u64 {
        self.size
    }

    fn insert_free(&mut self, offset: u64, len: u64) {
        debug_assert!(len > 0 && offset.is_multiple_of(ALIGN) && len.is_multiple_of(ALIGN));
        let old = self.free.insert(offset, len);
        assert!(old.is_none(), "free range at {offset} inserted twice");
        self.by_size.insert((len, offset));
    }

    fn remove_free(&mut self, offset: u64) -> u64 {
        let len = self.free.remove(&offset).expect("free range exists");
        assert!(self.by_size.remove(&(len, offset)));
        len
    }

    fn check_len(&self, len: u64) -> Result<u64, AllocError> {
        if len == 0 {
            return Err(AllocError::ZeroLength);
        }
        match round_up(len) {
            Some(r) if r <= self.size => Ok(r),
            _ => Err(AllocError::TooLarge {
                requested: len,
                max: self.size,
            }),
        }
    }

    /// Takes `[offset, offset + len)` out of the free range starting at
    /// `range_start` (which must contain it).
    fn carve(&mut self, range_start: u64, offset: u64, len: u64) {
        let range_len = self.remove_free(range_start);
        assert!(range_start <= offset && offset + len <= range_start + range_len);
        if offset > range_start {
            self.insert_free(range_start, offset - range_start);
        }
        let end = offset + len;
        if end < range_start + range_len {
            self.insert_free(end, range_start + range_len - end);
        }
        let old = self.allocated.insert(offset, len);
        assert!(old.is_none());
        self.allocated_bytes += len;
        let stale: Vec<u64> = self.freed.range(offset..end).copied().collect();
        for s in stale {
            self.freed.remove(&s);
        }
    }

    /// The offset [`alloc`](Allocator::alloc) would return for `len`,
    /// without allocating.
    pub fn find_fit(&self, len: u64) -> Result<u64, AllocError> {
        let rounded = self.check_len(len)?;
        match self.by_size.range((rounded, 0)..).next() {
            Some(&(_, start)) => Ok(start),
            None => Err(AllocError::Full {
                requested: len,
                largest_free: self.largest_free(),
            }),
        }
    }

    /// Allocates `len` bytes (rounded up to [`ALIGN`]); returns the offset.
    pub fn alloc(&mut self, len: u64) -> Result<u64, AllocError> {
        let start = self.find_fit(len)?;
        let rounded = round_up(len).expect("checked by find_fit");
        self.carve(start, start, rounded);
        Ok(start)
    }

    /// Allocates exactly `[offset, offset + len)` (rounded up), as chosen by
    /// a primary.
    pub fn alloc_at(&mut self, offset: u64, len: u64) -> Result<(), AllocError> {
        let rounded = self.check_len(len)?;
        if !offset.is_multiple_of(ALIGN) {
            return Err(AllocError::Misaligned { offset });
        }
        let not_free = AllocError::NotFree {
            offset,
            len: rounded,
        };
        let Some((&start, &flen)) = self.free.range(..=offset).next_back() else {
            return Err(not_free);
        };
        match offset.checked_add(rounded) {
            Some(end) if end <= start + flen => {}
            _ => return Err(not_free),
        }
        self.carve(start, offset, rounded);
        Ok(())
    }

    /// Frees the allocation starting at `offset`; returns its length.
    pub fn free(&mut self, offset: u64) -> Result<u64, AllocError> {
        let Some(len) = self.allocated.remove(&offset) else {
            if self.freed.contains(&offset) {
                return Err(AllocError::DoubleFree { offset });
            }
            return Err(AllocError::NotAllocated { offset });
        };
        self.allocated_bytes -= len;
        let mut start = offset;
        let mut total = len;
        if let Some((&p, &plen)) = self.free.range(..offset).next_back() {
            if p + plen == offset {
                self.remove_free(p);
                start = p;
                total += plen;
            }
        }
        if self.free.contains_key(&(offset + len)) {
            total += self.remove_free(offset + len);
        }
        self.insert_free(start, total);
        self.freed.insert(offset);
        Ok(len)
    }

    /// Offsets freed and not reused inside `[offset, offset + len)`: what
    /// an [`alloc_at`](Allocator::alloc_at) there forgets, and
    /// [`undo_alloc`](Allocator::undo_alloc) puts back.
    pub fn freed_in(&self, offset: u64, len: u64) -> Vec<u64> {
        let end = offset.saturating_add(round_up(len).unwrap_or(u64::MAX));
        self.freed.range(offset..end).copied().collect()
    }

    /// Takes back an [`alloc_at`](Allocator::alloc_at) at `offset`, which
    /// forgot the freed offsets `freed` ([`freed_in`](Allocator::freed_in)
    /// before it): the allocator is as it was before it, exactly (free
    /// ranges are always coalesced, so the split range joins again).
    pub fn undo_alloc(&mut self, offset: u64, freed: &[u64]) -> Result<(), AllocError> {
        self.free(offset)?;
        self.freed.remove(&offset);
        self.freed.extend(freed.iter().copied());
        Ok(())
    }

    /// Takes back a [`free`](Allocator::free) of the allocation of `len`
    /// bytes at `offset`: allocated again, and no longer counted as freed
    /// (an allocation holds no freed offset).
    pub fn undo_free(&mut self, offset: u64, len: u64) -> Result<(), AllocError> {
        self.alloc_at(offset, len)
    }

    /// Length of the allocation starting at `offset`, if any.
    pub fn allocation_at(&self, offset: u64) -> Option<u64> {
        self.allocated.get(&offset).copied()
    }

    /// Whether an allocation starts at `offset` and is at least `len` long.
    pub fn is_allocated(&self, offset: u64, len: u64) -> bool {
        self.allocation_at(offset).is_some_and(|l| l >= len)
    }

    /// Whether `offset` was freed and not reused since.
    pub fn was_freed(&self, offset: u64) -> bool {
        self.freed.contains(&offset)
    }

    /// Largest free range, i.e. the largest allocation possible right now.
    pub fn largest_free(&self) -> u64 {
        self.by_size.iter().next_back().map_or(0, |&(l, _)| l)
    }

    /// Usage figures.
    pub fn usage(&self) -> Usage {
        Usage {
            size: self.size,
            allocated: self.allocated_bytes,
            free: self.size - self.allocated_bytes,
            allocations: self.allocated.len() as u64,
            free_ranges: self.free.len() as u64,
            largest_free: self.largest_free(),
        }
    }

    /// The `(offset, length)` of every allocation, in offset order.
    pub fn allocations(&self) -> Vec<(u64, u64)> {
        let mut v: Vec<(u64, u64)> = self.allocated.iter().map(|(&o, &l)| (o, l)).collect();
        v.sort_unstable();
        v
    }

    /// The state needed to rebuild this allocator exactly.
    pub fn snapshot(&self) -> AllocSnapshot {
        AllocSnapshot {
            size: self.size,
            allocations: self.allocations(),
            freed: self.freed.iter().copied().collect(),
        }
    }

    /// Rebuilds an allocator from a snapshot, validating it.
    pub fn from_snapshot(s: &AllocSnapshot) -> Result<Allocator, AllocError> {
        let mut a = Allocator::new(s.size);
        for &(o, l) in &s.allocations {
            a.alloc_at(o, l)?;
        }
        for &f in &s.freed {
            if !f.is_multiple_of(ALIGN) || f >= a.size || a.allocated.contains_key(&f) {
                return Err(AllocError::NotFree { offset: f, len: 0 });
            }
            a.freed.insert(f);
        }
        Ok(a)
    }

    /// Asserts every internal invariant (used by tests and debug builds).
    pub fn check_invariants(&self) {
        let mut ranges: Vec<(u64, u64, bool)> = self
            .free
            .iter()
            .map(|(&o, &l)| (o, l, true))
            .chain(self.allocated.iter().map(|(&o, &l)| (o, l, false)))
            .collect();
        ranges.sort_unstable();
        let mut pos = 0;
        let mut prev_free = false;
        for &(o, l, is_free) in &ranges {
            assert_eq!(o, pos, "ranges must tile the arena without gap or overlap");
            assert!(l > 0 && l.is_multiple_of(ALIGN) && o.is_multiple_of(ALIGN));
            assert!(
                !(is_free && prev_free),
                "adjacent free ranges must coalesce"
            );
            prev_free = is_free;
            pos = o + l;
        }
        assert_eq!(pos, self.size);
        assert_eq!(self.by_size.len(), self.free.len());
        for (&o, &l) in &self.free {
            assert!(self.by_size.contains(&(l, o)));
        }
        assert_eq!(
            self.allocated_bytes,
            self.allocated.values().sum::<u64>(),
            "allocated byte count"
        );
        for f in &self.freed {
            assert!(!self.allocated.contains_key(f));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn errors_are_distinct_and_leave_state_unchanged() {
        let mut a = Allocator::new(1024);
        assert_eq!(a.alloc(0), Err(AllocError::ZeroLength));
        assert_eq!(
            a.alloc(1025),
            Err(AllocError::TooLarge {
                requested: 1025,
                max: 1024
            })
        );
        let x = a.alloc(1000).unwrap();
        assert_eq!(x, 0);
        assert_eq!(
            a.alloc(1),
            Err(AllocError::Full {
                requested: 1,
                largest_free: 0
            })
        );
        let before = a.clone();
        assert_eq!(a.free(64), Err(AllocError::NotAllocated { offset: 64 }));
        assert_eq!(a, before);
        assert_eq!(a.free(0), Ok(1024));
        assert_eq!(a.free(0), Err(AllocError::DoubleFree { offset: 0 }));
        assert_eq!(a.free(128), Err(AllocError::NotAllocated { offset: 128 }));
        assert_eq!(a.alloc_at(3, 10), Err(AllocError::Misaligned { offset: 3 }));
        a.alloc_at(64, 64).unwrap();
        assert_eq!(
            a.alloc_at(0, 128),
            Err(AllocError::NotFree {
                offset: 0,
                len: 128
            })
        );
        a.check_invariants();
    }

    #[test]
    fn best_fit_and_coalescing() {
        let mut a = Allocator::new(64 * 10);
        let offs: Vec<u64> = (0..10).map(|_| a.alloc(64).unwrap()).collect();
        assert_eq!(offs, (0..10).map(|i| i * 64).collect::<Vec<_>>());
        a.free(64).unwrap();
        a.free(128).unwrap(); // coalesces with 64 -> [64, 192)
        a.free(384).unwrap(); // a lone 64-byte hole
        assert_eq!(a.usage().free_ranges, 2);
        assert_eq!(a.largest_free(), 128);
        // Best fit: the 64-byte request takes the 64-byte hole.
        assert_eq!(a.alloc(10).unwrap(), 384);
        assert_eq!(a.alloc(100).unwrap(), 64);
        a.check_invariants();
        let u = a.usage();
        assert_eq!(u.allocated + u.free, u.size);
        assert_eq!(u.free, 0);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Alloc(u64),
        Free(usize),
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        prop::collection::vec(
            prop_oneof![
                3 => (1u64..3000).prop_map(Op::Alloc),
                2 => any::<usize>().prop_map(Op::Free),
            ],
            1..200,
        )
    }

    proptest! {
        #[test]
        fn random_sequences_never_overlap_and_replica_mirrors(ops in ops()) {
            let size = 64 * 1024;
            let mut a = Allocator::new(size);
            let mut replica = Allocator::new(size);
            let mut again = Allocator::new(size);
            let mut live: Vec<(u64, u64)> = Vec::new();
            for op in ops {
                match op {
                    Op::Alloc(len) => {
                        let r = a.alloc(len);
                        prop_assert_eq!(&r, &again.alloc(len), "deterministic");
                        if let Ok(off) = r {
                            let rl = round_up(len).unwrap();
                            prop_assert_eq!(off % ALIGN, 0);
                            for &(o, l) in &live {
                                prop_assert!(off + rl <= o || o + l <= off, "overlap");
                            }
                            live.push((off, rl));
                            replica.alloc_at(off, len).unwrap();
                        } else {
                            prop_assert!(rl_exceeds(len, a.largest_free()));
                        }
                    }
                    Op::Free(i) if !live.is_empty() => {
                        let (off, l) = live.swap_remove(i % live.len());
                        prop_assert_eq!(a.free(off), Ok(l));
                        prop_assert_eq!(again.free(off), Ok(l));
                        prop_assert_eq!(replica.free(off), Ok(l));
                        prop_assert_eq!(a.free(off), Err(AllocError::DoubleFree { offset: off }));
                    }
                    Op::Free(_) => {}
                }
                a.check_invariants();
                let u = a.usage();
                prop_assert_eq!(u.free + u.allocated, size);
                prop_assert_eq!(u.allocated, live.iter().map(|&(_, l)| l).sum::<u64>());
                prop_assert_eq!(&replica.snapshot().allocations, &a.snapshot().allocations);
            }
            let rebuilt = Allocator::from_snapshot(&a.snapshot()).unwrap();
            prop_assert_eq!(&rebuilt, &a);
            for &(o, l) in &live {
                prop_assert!(a.is_allocated(o, l));
                prop_assert!(!a.is_allocated(o, l + 1));
            }
        }
    }

    fn rl_exceeds(len: u64, largest: u64) -> bool {
        round_up(len).unwrap() > largest
    }
}
