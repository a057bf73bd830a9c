//! The device's STag table: which registration each STag index names,
//! which indices are reserved, and (with a same-host segment) what peers
//! on this host may reach.

use super::*;

const MAX_INDEX: u32 = Stag::MAX_INDEX;

#[derive(Default)]
struct Slot {
    mr: Option<Arc<MrInner>>,
    /// Reserved by a fast-register region even while invalid.
    reserved_by_pd: Option<u32>,
}

/// STag indices per page of [`Slots`].
const PAGE: usize = 1 << 12;

/// The STag table's slots, in pages allocated when an index in them is
/// first used. Indices a caller chooses (`RegOptions::stag`: a store's
/// arena is registered under the group's STag, whose index is anywhere in
/// 24 bits) cost only their own page: a vector grown to such an index,
/// with every index below it on a free list, took ~200 MB and a third of
/// a second of every store node at start.
struct Slots {
    pages: Vec<Option<Box<[Slot]>>>,
    /// The lowest index [`StagTable::reserve`] has not handed out or
    /// passed (indices below it are reserved or on the free list).
    next: u32,
}

impl Slots {
    fn new() -> Slots {
        Slots {
            pages: (0..(MAX_INDEX as usize + 1).div_ceil(PAGE))
                .map(|_| None)
                .collect(),
            next: 1,
        }
    }

    fn get(&self, index: u32) -> Option<&Slot> {
        let page = self.pages.get(index as usize / PAGE)?.as_ref()?;
        Some(&page[index as usize % PAGE])
    }

    /// The slot of `index` (at most [`MAX_INDEX`]), its page allocated if
    /// need be.
    fn get_mut(&mut self, index: u32) -> &mut Slot {
        let page = self.pages[index as usize / PAGE]
            .get_or_insert_with(|| (0..PAGE).map(|_| Slot::default()).collect());
        &mut page[index as usize % PAGE]
    }

    fn iter(&self) -> impl Iterator<Item = &Slot> {
        self.pages.iter().flatten().flat_map(|p| p.iter())
    }
}

/// The device's STag table. With a same-host segment, every change of a
/// registration that peers may reach is published there too, and a
/// registration is only dropped (its memory possibly freed) after no peer
/// copies to or from it any more (`shm.rs`).
pub(crate) struct StagTable {
    slots: RwLock<Slots>,
    free: Mutex<Vec<u32>>,
    shm: Option<Arc<crate::shm::LocalShm>>,
}

impl StagTable {
    pub fn new(shm: Option<Arc<crate::shm::LocalShm>>) -> StagTable {
        StagTable {
            // Index 0 is never used (`Slots::next` starts at 1).
            slots: RwLock::new(Slots::new()),
            free: Mutex::new(Vec::new()),
            shm,
        }
    }

    /// Publishes `mr` in the same-host segment (reachable only while valid,
    /// with remote rights, as one contiguous piece of memory).
    fn publish(&self, mr: &MrInner) {
        let Some(shm) = &self.shm else { return };
        let remote = Access(Access::REMOTE_READ.0 | Access::REMOTE_WRITE.0);
        let access = mr.access_now();
        // A guarded region is reachable only if peers can check its guard:
        // one guard whose word is in the region's own chunk.
        let guard = match (mr.guards.as_slice(), mr.chunk) {
            ([], _) => None,
            ([g], Some(_)) => g.file_off.map(|o| (o, g.mask, g.expect)),
            _ => None,
        };
        let addr = match mr.spans.as_slice() {
            [s] if mr.valid.load(Ordering::Acquire)
                && access.0 & remote.0 != 0
                && (mr.guards.is_empty() || guard.is_some()) =>
            {
                s.ptr as u64
            }
            _ => 0,
        };
        shm.publish(
            Stag::from_raw(mr.stag).index(),
            &crate::shm::Publication {
                stag: mr.stag,
                pd: mr.pd,
                access: access.0,
                iova: mr.iova,
                len: mr.len,
                addr,
                chunk: if addr != 0 { mr.chunk } else { None },
                deadline: mr.deadline.load(Ordering::Acquire),
                guard,
            },
        );
    }

    /// Sets `mr`'s deadline (`sys::mono_ns` instant, [`NO_DEADLINE`]:
    /// none). A later deadline is published with one store (an access that
    /// read the earlier one only stops sooner); an earlier one republishes
    /// the entry and waits, like invalidation, until no same-host peer is
    /// inside an access that passed the old deadline.
    pub fn set_deadline(&self, mr: &MrInner, deadline: u64) {
        let old = mr.deadline.swap(deadline, Ordering::AcqRel);
        if !self.lookup(mr.stag).is_some_and(|m| std::ptr::eq(&*m, mr)) {
            return;
        }
        match &self.shm {
            Some(shm) if deadline >= old => {
                shm.extend_deadline(Stag::from_raw(mr.stag).index(), deadline)
            }
            Some(_) => self.publish(mr),
            None => {}
        }
    }

    /// Makes `mr` valid or invalid (Local Invalidate, Send with Invalidate,
    /// `MemoryRegion::set_valid`). Invalidation returns once no same-host
    /// peer is inside an access to it.
    pub fn set_valid(&self, mr: &MrInner, valid: bool) {
        mr.valid.store(valid, Ordering::Release);
        if self.lookup(mr.stag).is_some_and(|m| std::ptr::eq(&*m, mr)) {
            self.publish(mr);
        }
    }

    /// Takes every right outside `keep` away from `mr` for good
    /// (`MemoryRegion::restrict_access`), published to same-host peers.
    pub fn restrict(&self, mr: &MrInner, keep: Access) {
        mr.withdrawn.fetch_or(!keep.0, Ordering::AcqRel);
        if self.lookup(mr.stag).is_some_and(|m| std::ptr::eq(&*m, mr)) {
            self.publish(mr);
        }
    }

    /// Reserves an index: the given one, or a free one.
    pub fn reserve(&self, want: Option<u32>, pd: u32) -> Result<u32> {
        let mut slots = self.slots.write();
        if let Some(idx) = want {
            if idx == 0 || idx > MAX_INDEX {
                return Err(Error::inval("STag index must be 1..2^24-1"));
            }
            let s = slots.get_mut(idx);
            if s.reserved_by_pd.is_some() {
                return Err(Error::StagInUse(idx << 8));
            }
            s.reserved_by_pd = Some(pd);
            // If `idx` is on the free list, it is skipped there below.
            return Ok(idx);
        }
        let mut free = self.free.lock();
        while let Some(i) = free.pop() {
            let s = slots.get_mut(i);
            if s.reserved_by_pd.is_none() {
                s.reserved_by_pd = Some(pd);
                return Ok(i);
            }
        }
        // Past the indices chosen by callers.
        while slots.next <= MAX_INDEX {
            let i = slots.next;
            slots.next += 1;
            let s = slots.get_mut(i);
            if s.reserved_by_pd.is_none() {
                s.reserved_by_pd = Some(pd);
                return Ok(i);
            }
        }
        Err(Error::Exhausted("STag indices"))
    }

    /// Installs a registration at its (reserved) index.
    pub fn install(&self, mr: Arc<MrInner>) {
        let old = {
            let mut slots = self.slots.write();
            let s = slots.get_mut(Stag::from_raw(mr.stag).index());
            debug_assert_eq!(s.reserved_by_pd, Some(mr.pd));
            let old = s.mr.replace(mr.clone());
            if let Some(o) = &old {
                o.valid.store(false, Ordering::Release);
            }
            old
        };
        // Republishing waits for peers still copying to the old binding.
        self.publish(&mr);
        drop(old);
    }

    /// Frees an index.
    pub fn release(&self, index: u32) {
        let old = {
            let mut slots = self.slots.write();
            if slots.get(index).is_none() || index == 0 {
                return;
            }
            let s = slots.get_mut(index);
            let old = s.mr.take();
            if let Some(m) = &old {
                m.valid.store(false, Ordering::Release);
            }
            s.reserved_by_pd = None;
            old
        };
        // No same-host peer may copy to or from the memory once the
        // registration can be dropped (and the memory freed)...
        if let Some(shm) = &self.shm {
            shm.unpublish(index);
        }
        // ...nor this engine (caller-owned memory: the caller frees it as
        // soon as this returns; WRs still naming it fail instead)...
        if let Some(m) = &old {
            m.release_wait();
        }
        drop(old);
        // ...and the index is reused only after that.
        self.free.lock().push(index);
    }

    /// Looks up a full STag (index and key must both match).
    #[inline]
    pub fn lookup(&self, stag: u32) -> Option<Arc<MrInner>> {
        let slots = self.slots.read();
        let mr = slots.get(Stag::from_raw(stag).index())?.mr.as_ref()?;
        if mr.stag != stag {
            return None;
        }
        Some(mr.clone())
    }

    /// The protection domain that reserved `index`, if any.
    pub fn reserved_pd(&self, index: u32) -> Option<u32> {
        self.slots.read().get(index)?.reserved_by_pd
    }

    /// Every installed registration (for `softrdma info`).
    pub fn all(&self) -> Vec<Arc<MrInner>> {
        self.slots
            .read()
            .iter()
            .filter_map(|s| s.mr.clone())
            .collect()
    }
}
