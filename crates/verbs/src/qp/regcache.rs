//! The registration cache of [`QueuePair::advertise_buffers`]
//! (`docs/one-shot.md`): registrations of the pages of caller memory,
//! made on first use and reused by later advertisements of memory they
//! cover, as an RDMA storage initiator keeps them.
//!
//! The policy, so that no advertisement leaves memory registered (and its
//! pages pinned) for the QP's whole life:
//! - a registration in use by an open advertisement is kept;
//! - when its last advertisement ends by a cancel, a deadline or the QP's
//!   failure, it is released at once (the command failed: the caller may
//!   well free or reuse the memory now);
//! - when its last advertisement is closed by the peer, it stays cached
//!   for the next command, but the cache keeps at most [`IDLE_MAX`] idle
//!   registrations of at most [`IDLE_BYTES`] in all, and releases the least
//!   recently used beyond that;
//! - [`QueuePair::trim_registration_cache`] releases every idle one now,
//!   and the rest go with the QP.
//!
//! [`QueuePair::advertise_buffers`]: super::QueuePair::advertise_buffers
//! [`QueuePair::trim_registration_cache`]: super::QueuePair::trim_registration_cache

use crate::device::ProtectionDomain;
use crate::error::{Error, Result};
use crate::mr::Access;
use crate::MemoryRegion;
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::Arc;

/// Idle registrations (no open advertisement uses them) a QP's cache keeps.
pub const IDLE_MAX: usize = 64;
/// Bytes of idle registrations a QP's cache keeps (their pages are pinned).
pub const IDLE_BYTES: u64 = 64 << 20;

/// A QP's cache.
#[derive(Default)]
pub(crate) struct RegCache {
    st: Mutex<State>,
}

#[derive(Default)]
struct State {
    /// By page-aligned start.
    map: BTreeMap<u64, Entry>,
    /// Advances on every use, for least-recently-used eviction.
    tick: u64,
}

struct Entry {
    end: u64,
    mr: MemoryRegion,
    /// Open advertisements over it.
    users: usize,
    used: u64,
}

/// The registration covering `[a, b)`, by start: any registration starting
/// at or before `a` may cover it (they can overlap), not only the nearest.
fn covered(map: &BTreeMap<u64, Entry>, a: u64, b: u64) -> Option<(u64, crate::Lkey)> {
    map.range(..=a)
        .rev()
        .find(|(_, e)| e.end >= b)
        .map(|(&s, e)| (s, e.mr.lkey()))
}

impl State {
    /// Takes idle registrations out beyond the bounds, least recently used
    /// first (the caller drops them after unlocking).
    fn evict(&mut self, out: &mut Vec<MemoryRegion>) {
        let mut idle: Vec<(u64, u64, u64)> = self
            .map
            .iter()
            .filter(|(_, e)| e.users == 0)
            .map(|(&s, e)| (e.used, s, e.end - s))
            .collect();
        let mut bytes: u64 = idle.iter().map(|i| i.2).sum();
        idle.sort_unstable();
        let mut n = idle.len();
        for (_, start, len) in idle {
            if n <= IDLE_MAX && bytes <= IDLE_BYTES {
                break;
            }
            if let Some(e) = self.map.remove(&start) {
                out.push(e.mr);
            }
            n -= 1;
            bytes -= len;
        }
    }
}

impl RegCache {
    /// Covers each buffer with a registration (registering the pages of
    /// those none covers, merged where they touch, local access only) and
    /// returns their SGEs and the advertisement's use of them.
    ///
    /// # Safety
    /// As [`super::QueuePair::advertise_buffers`]: the buffers stay valid
    /// while any advertisement over them is open.
    pub unsafe fn cover(
        self: &Arc<Self>,
        pd: &ProtectionDomain,
        bufs: &[(*mut u8, usize)],
    ) -> Result<(Vec<crate::Sge>, Uses)> {
        let page = crate::sys::page_size() as u64;
        let mut gone = Vec::new();
        let mut st = self.st.lock();
        let mut need: Vec<(u64, u64)> = Vec::new();
        for &(ptr, len) in bufs {
            if ptr.is_null() || len == 0 || len > u32::MAX as usize {
                return Err(Error::inval(
                    "advertise_buffers: empty, null or oversized buffer",
                ));
            }
            let (a, b) = (ptr as u64, ptr as u64 + len as u64);
            if covered(&st.map, a, b).is_none() {
                need.push((a / page * page, b.div_ceil(page) * page));
            }
        }
        need.sort_unstable();
        let mut merged: Vec<(u64, u64)> = Vec::new();
        for (s0, e0) in need {
            match merged.last_mut() {
                Some(last) if s0 <= last.1 => last.1 = last.1.max(e0),
                _ => merged.push((s0, e0)),
            }
        }
        st.tick += 1;
        let tick = st.tick;
        for (start, end) in merged {
            // SAFETY: the pages hold the caller's buffers, valid for as
            // long as any binding over them exists (this function's
            // contract); outside such a binding nothing reaches them
            // through this registration (local access only, and only this
            // cache names it).
            let mr = unsafe {
                pd.register_raw(
                    start as *mut u8,
                    (end - start) as usize,
                    Access::LOCAL_WRITE,
                    crate::RegOptions::default(),
                )?
            };
            st.map.insert(
                start,
                Entry {
                    end,
                    mr,
                    users: 0,
                    used: tick,
                },
            );
        }
        let mut sgl = Vec::with_capacity(bufs.len());
        let mut starts: Vec<u64> = Vec::new();
        for &(ptr, len) in bufs {
            let (a, b) = (ptr as u64, ptr as u64 + len as u64);
            let (start, lkey) = covered(&st.map, a, b).expect("registered above");
            sgl.push(crate::Sge {
                addr: a,
                length: len as u32,
                lkey,
            });
            if !starts.contains(&start) {
                starts.push(start);
            }
        }
        for s in &starts {
            let e = st.map.get_mut(s).expect("found above");
            e.users += 1;
            e.used = tick;
        }
        st.evict(&mut gone);
        drop(st);
        drop(gone);
        Ok((
            sgl,
            Uses {
                cache: self.clone(),
                starts,
                closed: true,
            },
        ))
    }

    pub fn len(&self) -> usize {
        self.st.lock().map.len()
    }

    /// Releases every idle registration; returns how many.
    pub fn trim(&self) -> usize {
        let gone: Vec<Entry> = {
            let mut st = self.st.lock();
            let idle: Vec<u64> = st
                .map
                .iter()
                .filter(|(_, e)| e.users == 0)
                .map(|(&s, _)| s)
                .collect();
            idle.iter().filter_map(|s| st.map.remove(s)).collect()
        };
        gone.len()
    }
}

/// An advertisement's use of cached registrations, let go of when it ends
/// (`engine::AdvertHold`), or when it is dropped unused (the advertise
/// failed: kept cached as after a close).
pub(crate) struct Uses {
    cache: Arc<RegCache>,
    starts: Vec<u64>,
    closed: bool,
}

impl crate::engine::AdvertHold for Uses {
    fn end(mut self: Box<Self>, closed: bool) {
        self.closed = closed;
    }
}

impl Drop for Uses {
    fn drop(&mut self) {
        let mut gone = Vec::new();
        {
            let mut st = self.cache.st.lock();
            st.tick += 1;
            let tick = st.tick;
            for s in &self.starts {
                let Some(e) = st.map.get_mut(s) else { continue };
                e.users = e.users.saturating_sub(1);
                e.used = tick;
                if e.users == 0 && !self.closed {
                    gone.extend(st.map.remove(s).map(|e| e.mr));
                }
            }
            st.evict(&mut gone);
        }
        // Deregistered here, after unlocking: each drop waits until no
        // engine access to its memory is in flight.
        drop(gone);
    }
}
