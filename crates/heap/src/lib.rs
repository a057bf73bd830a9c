//! # softrdma-heap: a registered-memory heap shared by several processes
//!
//! Registering memory for RDMA is costly: the pages are pinned (here with
//! `mlock`, see `softrdma_verbs::set_pin_limit`) and an STag is installed.
//! A heap that registers whole blocks once, and hands out allocations
//! carved from them with their keys already known, takes that cost off the
//! hot path. This one is shared: several processes map one segment and
//! allocate from it without synchronising with each other, and memory
//! allocated by one can be looked up (and so used in work requests) by all.
//!
//! ## Design
//!
//! * **Blocks** of `block_size` bytes (a power of two, a multiple of the
//!   page size; default 4 MiB) come from a sparse file under `/dev/shm`
//!   and go back to the OS by punching holes in it. Each block starts with
//!   a header holding its index in the descriptor table and a bitmap of
//!   its slots; all allocations of one block have one size class (64 B to
//!   `block_size / 4`, powers of two); larger allocations get a block of
//!   their own spanning several units.
//! * A **shared descriptor table** of `max_blocks` entries (in the same
//!   segment): each entry holds the block id (a 64-bit generation counter
//!   that never comes back to a value it had), the
//!   block's location and its size (`shared.rs` has the layout and the
//!   commit protocol).
//! * Each process keeps a **private registration table** indexed like the
//!   descriptor table: the block id it registered, and its memory region.
//!   On allocation from a block (and on [`Heap::lookup`]) the process
//!   compares the two ids. Equal: the registration is used. Different and
//!   non-zero: the registration is stale (the block was released, maybe
//!   replaced) and is deregistered; then the block is registered and its
//!   id stored.
//! * **Releasing** a block (when its last allocation is freed) sets its
//!   descriptor's location to none and its size to zero and increments its
//!   id, and signals no one: other processes retire their registrations
//!   lazily, by the check above.
//! * **Look-up**: address -> block header -> descriptor -> registration, in
//!   O(1) (the unit map finds the header of a multi-unit block).
//! * **Failures**: the table lock is a robust mutex; a process that dies
//!   holding it leaves work the next locker repairs; blocks of a process
//!   that died are released by the next process that needs room or calls
//!   [`Heap::reap`]. On clean exit (the last [`Heap`] handle and buffer
//!   dropped) a process deregisters everything and releases its blocks.
//! * In debug builds (or with [`HeapConfig::check_posts`]) the heap
//!   installs a [`softrdma_verbs::PostCheck`]: every SGE posted on the
//!   device whose lkey is one of the heap's registrations is checked
//!   against the descriptor's current id, so a stale registration can never
//!   be used for a work request.
//!
//! ## A taste
//!
//! ```no_run
//! use softrdma_heap::{Heap, HeapConfig};
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dev = softrdma_verbs::Device::open_default()?;
//! let pd = dev.alloc_pd()?;
//! let heap = Heap::open_or_create(&pd, &HeapConfig::new("demo"))?;
//! let mut buf = heap.alloc(4096)?;      // registered, keys known
//! buf.write_at(0, b"hello");           // copied in: never a slice over it
//! let (addr, rkey) = (buf.addr(), buf.rkey()); // give these to a peer
//! let keys = heap.lookup(addr, 5)?;      // O(1), from any process
//! assert_eq!(keys.lkey, buf.lkey());
//! # let _ = rkey; Ok(()) }
//! ```
//!
//! `docs/heap.md` compares this with async-rdma's jemalloc extent hooks.

mod shared;

use parking_lot::{Mutex, RwLock};
use shared::{gen_of, pack, state_of, used_of, Segment, ACTIVE, BLOCK_HDR, FREE, HUGE, NONE};
use softrdma_verbs::{
    Access, AccessGuard, MemoryRegion, PostCheck, ProtectionDomain, RegOptions, Sge,
};
use std::collections::HashMap;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};

pub use shared::path_of;

/// The 64-bit id of descriptor `d`'s live block and the word it was read
/// with; `None` when it holds no live block, or while a release is between
/// its commit (the word) and its new id (the two disagree for a moment).
fn live_id(d: &shared::Desc) -> Option<(u64, u64)> {
    let w = d.word.load(Ordering::Acquire);
    if state_of(w) != ACTIVE {
        return None;
    }
    let id = d.id.load(Ordering::Acquire);
    (id as u32 == gen_of(w)).then_some((id, w))
}

/// Errors of the heap.
#[derive(Debug, thiserror::Error, Clone, PartialEq, Eq)]
pub enum HeapError {
    #[error("heap {0:?} already exists")]
    Exists(String),
    #[error("no heap named {0:?}")]
    NotFound(String),
    #[error("invalid heap configuration: {0}")]
    Config(String),
    #[error("heap segment is damaged or foreign: {0}")]
    Corrupt(String),
    #[error(
        "heap {name:?} has segment layout version {found}, this build uses version {want} \
         (64-bit block ids since version 2); it cannot be read: once no process uses it, \
         remove it (softrdma heap unlink {name}) and create it again"
    )]
    Version { name: String, found: u32, want: u32 },
    #[error("descriptor table full ({0} blocks)")]
    TableFull(u32),
    #[error("no room for a block of {0} bytes in the heap's area")]
    AreaFull(u64),
    #[error("allocation of {len} bytes larger than the heap's area allows")]
    TooLarge { len: usize },
    #[error("address {0:#x} is not in an allocated block of this heap")]
    NotInHeap(u64),
    #[error("registration failed: {0}")]
    Register(String),
    #[error("system call failed: {0}")]
    Os(String),
}

pub type Result<T> = std::result::Result<T, HeapError>;

/// How a heap is created.
#[derive(Debug, Clone)]
pub struct HeapConfig {
    /// Segment name (`/dev/shm/softrdma-heap-NAME`): letters, digits, `._-`.
    pub name: String,
    /// Bytes per block: a power of two, 64 KiB to 1 GiB (default 4 MiB).
    pub block_size: u64,
    /// Descriptor table entries (default 1024).
    pub max_blocks: u32,
    /// Units of `block_size` in the area (default: `max_blocks`); the area
    /// is a sparse file, so only blocks in use take memory.
    pub units: u32,
    /// Rights of this process's registrations.
    pub access: Access,
    /// Check every posted SGE against the block generations (default: in
    /// debug builds).
    pub check_posts: bool,
}

impl HeapConfig {
    pub fn new(name: &str) -> HeapConfig {
        HeapConfig {
            name: name.to_string(),
            block_size: 4 << 20,
            max_blocks: 1024,
            units: 1024,
            access: Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
            check_posts: cfg!(debug_assertions),
        }
    }
}

fn check_name(name: &str) -> Result<()> {
    if name.is_empty()
        || name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
    {
        return Err(HeapError::Config(format!(
            "bad heap name {name:?} (1-64 of A-Z a-z 0-9 . _ -)"
        )));
    }
    Ok(())
}

/// Keys of an address range ([`Heap::lookup`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keys {
    pub lkey: u32,
    pub rkey: u32,
    /// The descriptor index and block id (64 bits: never reused) of the
    /// block.
    pub block: u32,
    pub gen: u64,
    /// The registered region: its first address and length.
    pub region_addr: u64,
    pub region_len: u64,
}

/// Counters of this process's use of the heap.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HeapStats {
    pub registrations: u64,
    pub deregistrations: u64,
    /// Stale registrations found by the id check and retired.
    pub stale_retired: u64,
    /// Allocations and look-ups served by a cached registration.
    pub cache_hits: u64,
    pub blocks_obtained: u64,
    pub blocks_released: u64,
    /// Blocks of dead processes this process released.
    pub blocks_reaped: u64,
}

/// The shared table as [`Heap::check`] found it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TableReport {
    pub active_blocks: u32,
    pub free_descriptors: u32,
    pub units_used: u32,
    /// Slots in use over all live blocks.
    pub slots_used: u64,
    /// Times a locker repaired after a holder died (segment lifetime).
    pub recovered: u64,
    /// Blocks of dead processes released (segment lifetime).
    pub reaped: u64,
}

struct Reg {
    id: u64,
    mr: MemoryRegion,
}

#[derive(Default)]
struct Counters {
    registrations: AtomicU64,
    deregistrations: AtomicU64,
    stale_retired: AtomicU64,
    cache_hits: AtomicU64,
    obtained: AtomicU64,
    released: AtomicU64,
    reaped: AtomicU64,
}

struct Inner {
    seg: Arc<Segment>,
    pd: ProtectionDomain,
    access: Access,
    /// Private registration table, indexed like the descriptor table.
    regs: Mutex<Vec<Option<Reg>>>,
    /// lkey -> (block, id) of our registrations, for the post check.
    lkeys: RwLock<HashMap<softrdma_verbs::Lkey, (u32, u64)>>,
    /// Per size class: the block (index, id) this process allocates from.
    current: Mutex<Vec<Option<(u32, u64)>>>,
    pid: u32,
    start: u64,
    check_id: Mutex<Option<u64>>,
    c: Counters,
}

/// A process's handle on a shared heap. Cheap to clone.
#[derive(Clone)]
pub struct Heap {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Heap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Heap")
            .field("base", &format_args!("{:#x}", self.inner.seg.base()))
            .field("block_size", &self.inner.seg.geo.block_size)
            .finish()
    }
}

/// Slot size -> (data offset, slots) of a block of `bs` bytes.
fn slab_layout(bs: u64, slot: u64) -> (u64, u32) {
    let pg = page();
    let n0 = (bs - pg) / slot;
    let bitmap = n0.div_ceil(64) * 8;
    let data_off = (BLOCK_HDR as u64 + bitmap).next_multiple_of(pg);
    (data_off, ((bs - data_off) / slot) as u32)
}

use shared::page;

/// Smallest slot.
const MIN_SLOT: u64 = 64;

impl Heap {
    /// Creates the heap `cfg.name` (its segment must not exist) and opens it.
    pub fn create(pd: &ProtectionDomain, cfg: &HeapConfig) -> Result<Heap> {
        check_name(&cfg.name)?;
        let bs = cfg.block_size;
        if !bs.is_power_of_two() || !(64 << 10..=1 << 30).contains(&bs) {
            return Err(HeapError::Config(format!(
                "block size {bs} must be a power of two from 64 KiB to 1 GiB"
            )));
        }
        if cfg.max_blocks == 0 || cfg.max_blocks > 1 << 20 {
            return Err(HeapError::Config("max_blocks must be 1..=1048576".into()));
        }
        if cfg.units == 0 || (cfg.units as u64).saturating_mul(bs) > 1 << 46 {
            return Err(HeapError::Config(
                "units must be > 0 and the area under 64 TiB".into(),
            ));
        }
        let seg = Segment::create(
            &cfg.name,
            shared::Geometry {
                block_size: bs,
                max_blocks: cfg.max_blocks,
                units: cfg.units,
            },
        )?;
        Ok(Heap::attach(seg, pd, cfg.access, cfg.check_posts))
    }

    /// Opens the existing heap `name` (geometry from its segment).
    pub fn open(
        pd: &ProtectionDomain,
        name: &str,
        access: Access,
        check_posts: bool,
    ) -> Result<Heap> {
        check_name(name)?;
        let seg = Segment::open(name)?;
        let h = Heap::attach(seg, pd, access, check_posts);
        // A newcomer cleans up after processes that died.
        h.reap()?;
        Ok(h)
    }

    /// Opens the heap `cfg.name`, creating it if it does not exist.
    pub fn open_or_create(pd: &ProtectionDomain, cfg: &HeapConfig) -> Result<Heap> {
        match Heap::create(pd, cfg) {
            Err(HeapError::Exists(_)) => Heap::open(pd, &cfg.name, cfg.access, cfg.check_posts),
            r => r,
        }
    }

    /// Removes the segment's name (mapped processes keep their mapping).
    pub fn unlink(name: &str) -> Result<()> {
        check_name(name)?;
        std::fs::remove_file(path_of(name)).map_err(|e| HeapError::Os(format!("unlink: {e}")))
    }

    fn attach(seg: Segment, pd: &ProtectionDomain, access: Access, check_posts: bool) -> Heap {
        let n = seg.geo.max_blocks as usize;
        let classes = (seg.geo.block_size / 4 / MIN_SLOT).trailing_zeros() as usize + 1;
        let pid = std::process::id();
        let inner = Arc::new(Inner {
            seg: Arc::new(seg),
            pd: pd.clone(),
            access,
            regs: Mutex::new((0..n).map(|_| None).collect()),
            lkeys: RwLock::new(HashMap::new()),
            current: Mutex::new(vec![None; classes]),
            pid,
            start: shared::start_time(pid).unwrap_or(0),
            check_id: Mutex::new(None),
            c: Counters::default(),
        });
        if check_posts {
            let id = pd.device().add_post_check(Arc::new(StaleCheck {
                heap: Arc::downgrade(&inner),
            }));
            *inner.check_id.lock() = Some(id);
        }
        Heap { inner }
    }

    /// The protection domain this process registers the heap's blocks in.
    pub fn pd(&self) -> &ProtectionDomain {
        &self.inner.pd
    }

    /// The heap's geometry: (block size, descriptor entries, units).
    pub fn geometry(&self) -> (u64, u32, u32) {
        let g = &self.inner.seg.geo;
        (g.block_size, g.max_blocks, g.units)
    }

    /// Address of the block area in this process.
    pub fn area_base(&self) -> u64 {
        self.inner.seg.area_ptr(0) as u64
    }

    /// Whether this process mapped the heap at the creator's address (then
    /// heap addresses mean the same in both).
    pub fn same_address_as_creator(&self) -> bool {
        self.inner.seg.base() == self.inner.seg.header().base_hint.load(Ordering::Relaxed)
    }

    /// The address in this process of area offset `off` (from
    /// [`HeapBuf::offset`] in another process).
    pub fn addr_of(&self, off: u64) -> Result<u64> {
        if off >= self.inner.seg.area_len() {
            return Err(HeapError::NotInHeap(off));
        }
        Ok(self.area_base() + off)
    }

    /// This process's counters.
    pub fn stats(&self) -> HeapStats {
        let c = &self.inner.c;
        HeapStats {
            registrations: c.registrations.load(Ordering::Relaxed),
            deregistrations: c.deregistrations.load(Ordering::Relaxed),
            stale_retired: c.stale_retired.load(Ordering::Relaxed),
            cache_hits: c.cache_hits.load(Ordering::Relaxed),
            blocks_obtained: c.obtained.load(Ordering::Relaxed),
            blocks_released: c.released.load(Ordering::Relaxed),
            blocks_reaped: c.reaped.load(Ordering::Relaxed),
        }
    }

    /// Registrations this process holds now (stale ones included until
    /// retired).
    pub fn registrations_held(&self) -> usize {
        self.inner
            .regs
            .lock()
            .iter()
            .filter(|r| r.is_some())
            .count()
    }

    /// Allocates `len` bytes (at least 1): a buffer registered with this
    /// process's PD, 64-byte aligned (page-aligned from 4 KiB up).
    pub fn alloc(&self, len: usize) -> Result<HeapBuf> {
        let inner = &self.inner;
        let len = len.max(1);
        let bs = inner.seg.geo.block_size;
        let slot = (len as u64).next_power_of_two().max(MIN_SLOT);
        if slot > bs / 4 {
            return self.alloc_huge(len);
        }
        let class = (slot / MIN_SLOT).trailing_zeros() as usize;
        loop {
            let cur = inner.current.lock()[class];
            if let Some((i, g)) = cur {
                if let Some(s) = inner.take_slot(i, g) {
                    return self.finish_alloc(i, g, s, slot, len);
                }
            }
            // The current block is full (or gone): another of ours with
            // room, else a new one.
            let next = match inner.find_own_block(slot as u32, cur) {
                Some(b) => b,
                None => inner.obtain(slot as u32, 1)?,
            };
            inner.current.lock()[class] = Some(next);
        }
    }

    /// Like [`Heap::alloc`], with the bytes zeroed (a slot keeps what its
    /// previous owner, maybe another process, left in it).
    pub fn alloc_zeroed(&self, len: usize) -> Result<HeapBuf> {
        let mut b = self.alloc(len)?;
        b.fill(0);
        Ok(b)
    }

    fn alloc_huge(&self, len: usize) -> Result<HeapBuf> {
        let inner = &self.inner;
        let bs = inner.seg.geo.block_size;
        let units = (page() + len as u64).div_ceil(bs);
        if units > inner.seg.geo.units as u64 {
            return Err(HeapError::TooLarge { len });
        }
        let (i, g) = inner.obtain(HUGE, units as u32)?;
        let s = inner
            .take_slot(i, g)
            .expect("a new huge block has its one slot free");
        self.finish_alloc(i, g, s, 0, len)
    }

    fn finish_alloc(&self, i: u32, g: u64, s: u32, slot: u64, len: usize) -> Result<HeapBuf> {
        let inner = &self.inner;
        let loc = inner.seg.desc(i).location.load(Ordering::Acquire);
        let data_off = inner.seg.block(loc).data_off.load(Ordering::Acquire) as u64;
        let off = loc + data_off + s as u64 * slot;
        let keys = match inner.ensure_reg(i, g) {
            Ok(k) => k,
            Err(e) => {
                inner.free_slot(i, g, s);
                return Err(e);
            }
        };
        let ptr = NonNull::new(inner.seg.area_ptr(off)).expect("mapped");
        Ok(HeapBuf {
            heap: self.clone(),
            ptr,
            len,
            block: i,
            gen: g,
            slot: s,
            lkey: keys.lkey,
            rkey: keys.rkey,
        })
    }

    /// The keys of `[addr, addr + len)`, which must lie in one live block
    /// of the heap (allocated by any process): through the block header and
    /// the descriptor to this process's registration, registering (or
    /// replacing a stale registration) if needed. O(1).
    pub fn lookup(&self, addr: u64, len: usize) -> Result<Keys> {
        let inner = &self.inner;
        let seg = &inner.seg;
        let area = seg.area_ptr(0) as u64;
        let bs = seg.geo.block_size;
        let off = addr.wrapping_sub(area);
        if addr < area || off >= seg.area_len() {
            return Err(HeapError::NotInHeap(addr));
        }
        // Through the header when the unit starts a block; the unit map
        // for the other units of a multi-unit block (and when the bytes
        // that look like a header are an allocation's data).
        let hdr = seg.block(off / bs * bs);
        let by_header = (hdr.magic.load(Ordering::Acquire) == shared::BLOCK_MAGIC)
            .then(|| hdr.index.load(Ordering::Acquire));
        let by_map = seg
            .unit((off / bs) as u32)
            .load(Ordering::Acquire)
            .checked_sub(1);
        for i in by_header.into_iter().chain(by_map) {
            if i >= seg.geo.max_blocks {
                continue;
            }
            let d = seg.desc(i);
            let w = d.word.load(Ordering::Acquire);
            let (loc, size) = (
                d.location.load(Ordering::Acquire),
                d.size.load(Ordering::Acquire),
            );
            if state_of(w) != ACTIVE || loc == NONE || off < loc || off >= loc + size {
                continue;
            }
            let data_off = seg.block(loc).data_off.load(Ordering::Acquire) as u64;
            if off < loc + data_off || off + len as u64 > loc + size {
                return Err(HeapError::NotInHeap(addr));
            }
            let id = d.id.load(Ordering::Acquire);
            if id as u32 != gen_of(w) {
                continue; // released just now
            }
            return inner.ensure_reg(i, id);
        }
        Err(HeapError::NotInHeap(addr))
    }

    /// Releases every empty block this process owns (its current blocks
    /// too); returns how many.
    pub fn trim(&self) -> Result<usize> {
        let inner = &self.inner;
        let mut cur = inner.current.lock();
        let mut n = 0;
        for c in cur.iter_mut() {
            if let Some((i, g)) = c.take() {
                if inner.release(i, g)? {
                    n += 1;
                }
            }
        }
        drop(cur);
        for i in 0..inner.seg.geo.max_blocks {
            let d = inner.seg.desc(i);
            let Some((id, w)) = live_id(d) else {
                continue;
            };
            if used_of(w) == 0 && inner.owns(d) && inner.release(i, id)? {
                n += 1;
            }
        }
        Ok(n)
    }

    /// Releases the blocks of processes that died (their allocations died
    /// with them); returns how many. Runs when a process opens the heap
    /// and when the table or the area is full.
    pub fn reap(&self) -> Result<usize> {
        self.inner.reap()
    }

    /// Checks the shared table's invariants under the lock (every live
    /// block's units, header and slot count; the free list; the unit map).
    /// `quiet`: no allocation is in progress anywhere, so slot counts must
    /// match the bitmaps exactly.
    pub fn check(&self, quiet: bool) -> std::result::Result<TableReport, String> {
        let seg = &self.inner.seg;
        let _l = seg.lock(repair).map_err(|e| e.to_string())?;
        check_locked(seg, quiet)
    }
}

impl Inner {
    /// Whether this process obtained the block of `d`.
    fn owns(&self, d: &shared::Desc) -> bool {
        d.owner_pid.load(Ordering::Relaxed) == self.pid
            && d.owner_start.load(Ordering::Relaxed) == self.start
    }

    /// Claims a slot of block `i` at id `g`: reserves a count in the
    /// descriptor word (fails if the block is full, released or replaced),
    /// then a bit of the bitmap.
    fn take_slot(&self, i: u32, g: u64) -> Option<u32> {
        let seg = &self.seg;
        let d = seg.desc(i);
        let loc = d.location.load(Ordering::Acquire);
        // The whole id first: the word holds only its low 32 bits (it
        // cannot change 2^32 times before the compare-and-swap below).
        if loc == NONE || d.id.load(Ordering::Acquire) != g {
            return None;
        }
        let hdr = seg.block(loc);
        let slots = hdr.slots.load(Ordering::Acquire);
        let mut w = d.word.load(Ordering::Acquire);
        loop {
            if gen_of(w) != g as u32 || state_of(w) != ACTIVE || used_of(w) >= slots {
                return None;
            }
            match d
                .word
                .compare_exchange_weak(w, w + 1, Ordering::AcqRel, Ordering::Acquire)
            {
                Ok(_) => break,
                Err(x) => w = x,
            }
        }
        // A count is ours, so a free bit exists (counts never exceed bits).
        let words = slots.div_ceil(64);
        let start = hdr.hint.load(Ordering::Relaxed) % words;
        loop {
            for k in 0..words {
                let wi = (start + k) % words;
                let bm = seg.bitmap(loc, wi);
                let valid = if wi + 1 == words && !slots.is_multiple_of(64) {
                    (1u64 << (slots % 64)) - 1
                } else {
                    u64::MAX
                };
                let mut cur = bm.load(Ordering::Acquire);
                while !cur & valid != 0 {
                    let b = (!cur & valid).trailing_zeros();
                    let prev = bm.fetch_or(1 << b, Ordering::AcqRel);
                    if prev & (1 << b) == 0 {
                        hdr.hint.store(wi, Ordering::Relaxed);
                        return Some(wi * 64 + b);
                    }
                    cur = prev | 1 << b;
                }
            }
        }
    }

    /// Frees slot `s` of block `i`; releases the block when it empties and
    /// is not a current block of this process.
    fn free_slot(&self, i: u32, g: u64, s: u32) {
        let seg = &self.seg;
        let d = seg.desc(i);
        let loc = d.location.load(Ordering::Acquire);
        let prev = seg
            .bitmap(loc, s / 64)
            .fetch_and(!(1u64 << (s % 64)), Ordering::AcqRel);
        debug_assert!(
            prev & 1 << (s % 64) != 0,
            "double free of slot {s} in block {i}"
        );
        let w = d.word.fetch_sub(1, Ordering::AcqRel);
        debug_assert_eq!(gen_of(w), g as u32, "a block with live slots changed id");
        if used_of(w) == 1 {
            let current = self.current.lock().contains(&Some((i, g)));
            if !current {
                if let Err(e) = self.release(i, g) {
                    tracing::warn!(error = %e, block = i, "releasing an empty block failed");
                }
            }
        }
    }

    /// Another block of ours of slot size `class` with a free slot.
    fn find_own_block(&self, class: u32, not: Option<(u32, u64)>) -> Option<(u32, u64)> {
        let seg = &self.seg;
        for i in 0..seg.geo.max_blocks {
            let d = seg.desc(i);
            let Some((id, w)) = live_id(d) else {
                continue;
            };
            if Some((i, id)) == not || d.class.load(Ordering::Relaxed) != class || !self.owns(d) {
                continue;
            }
            let loc = d.location.load(Ordering::Acquire);
            if loc != NONE && used_of(w) < seg.block(loc).slots.load(Ordering::Acquire) {
                return Some((i, id));
            }
        }
        None
    }

    /// Obtains a block of `units` units for slot size `class` from the OS:
    /// a free descriptor, free units, the header; committed by turning the
    /// descriptor ACTIVE. Returns (index, id).
    fn obtain(&self, class: u32, units: u32) -> Result<(u32, u64)> {
        match self.obtain_once(class, units) {
            // Full: blocks of dead processes may make room, once.
            Err(e @ (HeapError::TableFull(_) | HeapError::AreaFull(_))) => {
                if self.reap()? > 0 {
                    self.obtain_once(class, units)
                } else {
                    Err(e)
                }
            }
            r => r,
        }
    }

    fn obtain_once(&self, class: u32, units: u32) -> Result<(u32, u64)> {
        let seg = &self.seg;
        let bs = seg.geo.block_size;
        let h = seg.header();
        let _l = seg.lock(repair)?;
        let head = h.free_head.load(Ordering::Relaxed);
        if head == 0 {
            return Err(HeapError::TableFull(seg.geo.max_blocks));
        }
        let i = head - 1;
        let d = seg.desc(i);
        let w = d.word.load(Ordering::Relaxed);
        assert_eq!(state_of(w), FREE, "free list names a live descriptor {i}");
        // The new block's id (set when the previous one was released).
        let id = d.id.load(Ordering::Relaxed);
        assert_eq!(id as u32, gen_of(w), "descriptor {i}: id and word disagree");
        let Some(u0) = find_units(seg, units) else {
            return Err(HeapError::AreaFull(units as u64 * bs));
        };
        h.free_head
            .store(d.next_free.load(Ordering::Relaxed), Ordering::Relaxed);
        shared::crash_point("obtain");
        for u in u0..u0 + units {
            seg.unit(u).store(i + 1, Ordering::Relaxed);
        }
        h.unit_hint.store(u0 + units, Ordering::Relaxed);
        let loc = u0 as u64 * bs;
        let size = units as u64 * bs;
        let (data_off, slots) = if class == HUGE {
            (page(), 1)
        } else {
            slab_layout(bs, class as u64)
        };
        let hdr = seg.block(loc);
        hdr.magic.store(shared::BLOCK_MAGIC, Ordering::Relaxed);
        hdr.index.store(i, Ordering::Relaxed);
        hdr.gen.store(id, Ordering::Relaxed);
        hdr.class.store(class, Ordering::Relaxed);
        hdr.slots.store(slots, Ordering::Relaxed);
        hdr.data_off.store(data_off as u32, Ordering::Relaxed);
        hdr.hint.store(0, Ordering::Relaxed);
        for k in 0..slots.div_ceil(64) {
            seg.bitmap(loc, k).store(0, Ordering::Relaxed);
        }
        d.location.store(loc, Ordering::Relaxed);
        d.size.store(size, Ordering::Relaxed);
        d.class.store(class, Ordering::Relaxed);
        d.owner_pid.store(self.pid, Ordering::Relaxed);
        d.owner_start.store(self.start, Ordering::Relaxed);
        d.next_free.store(0, Ordering::Relaxed);
        shared::crash_point("obtain-late");
        // Commit: everything above is visible to whoever sees ACTIVE.
        d.word.store(pack(id, ACTIVE, 0), Ordering::Release);
        h.obtained.fetch_add(1, Ordering::Relaxed);
        self.c.obtained.fetch_add(1, Ordering::Relaxed);
        Ok((i, id))
    }

    /// Releases block `i` if it is still id `g` and empty; `Ok(false)` if
    /// it is not (someone allocated from it meanwhile, or it is gone).
    fn release(&self, i: u32, g: u64) -> Result<bool> {
        let seg = &self.seg;
        let _l = seg.lock(repair)?;
        let done = release_locked(seg, i, g, false);
        drop(_l);
        if done {
            self.c.released.fetch_add(1, Ordering::Relaxed);
            // Our own registration of it is stale now: retire it at once
            // (others retire theirs lazily).
            self.retire(i, g);
        }
        Ok(done)
    }

    fn retire(&self, i: u32, g: u64) {
        let old = {
            let mut regs = self.regs.lock();
            match &regs[i as usize] {
                Some(r) if r.id == g => regs[i as usize].take(),
                _ => None,
            }
        };
        if let Some(r) = old {
            self.deregister(r);
        }
    }

    /// Deregisters one of our registrations (taken out of the table).
    fn deregister(&self, r: Reg) {
        self.lkeys.write().remove(&r.mr.lkey());
        self.c.deregistrations.fetch_add(1, Ordering::Relaxed);
    }

    fn reap(&self) -> Result<usize> {
        let seg = &self.seg;
        let mut n = 0;
        let _l = seg.lock(repair)?;
        for i in 0..seg.geo.max_blocks {
            let d = seg.desc(i);
            let w = d.word.load(Ordering::Acquire);
            if state_of(w) != ACTIVE {
                continue;
            }
            let (pid, start) = (
                d.owner_pid.load(Ordering::Relaxed),
                d.owner_start.load(Ordering::Relaxed),
            );
            if (pid == self.pid && start == self.start) || shared::alive(pid, start) {
                continue;
            }
            if release_locked(seg, i, d.id.load(Ordering::Relaxed), true) {
                seg.header().reaped.fetch_add(1, Ordering::Relaxed);
                n += 1;
            }
        }
        self.c.reaped.fetch_add(n as u64, Ordering::Relaxed);
        if n > 0 {
            tracing::info!(blocks = n, "released the blocks of dead processes");
        }
        Ok(n)
    }

    /// This process's registration of block `i` at id `g`, made if missing
    /// or stale (the id check of the design).
    fn ensure_reg(&self, i: u32, g: u64) -> Result<Keys> {
        let seg = &self.seg;
        let mut regs = self.regs.lock();
        if let Some(r) = &regs[i as usize] {
            if r.id == g {
                self.c.cache_hits.fetch_add(1, Ordering::Relaxed);
                return Ok(keys_of(i, g, &r.mr));
            }
            // Different and non-zero: stale. Deregister it.
            let r = regs[i as usize].take().unwrap();
            self.c.stale_retired.fetch_add(1, Ordering::Relaxed);
            self.deregister(r);
        }
        let d = seg.desc(i);
        let loc = d.location.load(Ordering::Acquire);
        let size = d.size.load(Ordering::Acquire);
        if loc == NONE {
            return Err(HeapError::NotInHeap(seg.area_ptr(0) as u64));
        }
        let data_off = seg.block(loc).data_off.load(Ordering::Acquire) as u64;
        let ptr = seg.area_ptr(loc + data_off);
        let len = (size - data_off) as usize;
        let file_off = seg.area_off as u64 + loc + data_off;
        // Remote (and local) accesses through this registration are
        // allowed only while the descriptor's 64-bit id is still g: once
        // the block is released (and maybe reused by another process) a
        // peer holding our old rkey is refused by the engine with the
        // protection Terminate, although nobody told us. The id moves on
        // at every release and never comes back (2^64 releases).
        let word = &d.id as *const AtomicU64 as u64;
        let opts = RegOptions {
            shared: Some((seg.fd(), file_off)),
            guard: Some(AccessGuard {
                word: word as usize,
                mask: u64::MAX,
                expect: g,
                file_off: Some(word - seg.base()),
            }),
            ..RegOptions::default()
        };
        let owner: Arc<dyn std::any::Any + Send + Sync> = self.seg.clone();
        // SAFETY: [ptr, ptr+len) is inside the segment's mapping, which
        // stays mapped as long as the `Segment` lives; the registration
        // holds an Arc of it (`owner`), so the memory outlives the region
        // and every work request naming it.
        let mr = unsafe { self.pd.register_owned(ptr, len, self.access, opts, owner) }
            .map_err(|e| HeapError::Register(e.to_string()))?;
        // The block may have been released while we registered it.
        if live_id(d).map(|(id, _)| id) != Some(g) {
            return Err(HeapError::NotInHeap(ptr as u64));
        }
        self.c.registrations.fetch_add(1, Ordering::Relaxed);
        let keys = keys_of(i, g, &mr);
        self.lkeys.write().insert(mr.lkey(), (i, g));
        regs[i as usize] = Some(Reg { id: g, mr });
        Ok(keys)
    }
}

fn keys_of(i: u32, g: u64, mr: &MemoryRegion) -> Keys {
    Keys {
        lkey: mr.lkey().raw(),
        rkey: mr.rkey().raw(),
        block: i,
        gen: g,
        region_addr: mr.addr(),
        region_len: mr.len() as u64,
    }
}

/// First fit of `n` free units, from the hint on, then from the start.
fn find_units(seg: &Segment, n: u32) -> Option<u32> {
    let units = seg.geo.units;
    if n == 0 || n > units {
        return None;
    }
    let hint = seg.header().unit_hint.load(Ordering::Relaxed) % units;
    let scan = |from: u32, to: u32| {
        let mut run = 0;
        for u in from..to {
            if seg.unit(u).load(Ordering::Relaxed) == 0 {
                run += 1;
                if run == n {
                    return Some(u + 1 - n);
                }
            } else {
                run = 0;
            }
        }
        None
    };
    scan(hint, units).or_else(|| scan(0, (hint + n - 1).min(units)))
}

/// With the lock held: releases block `i` at id `g` if it is empty (or
/// `force`: its owner died). The word's compare-and-swap commits it.
fn release_locked(seg: &Segment, i: u32, g: u64, force: bool) -> bool {
    let d = seg.desc(i);
    let h = seg.header();
    // The id changes only under the lock, which we hold.
    if d.id.load(Ordering::Relaxed) != g {
        return false;
    }
    // Ids count 1, 2, ... (0 is never one); the test hook may skip ahead.
    let next = g.wrapping_add(shared::id_step()).max(1);
    let mut w = d.word.load(Ordering::Acquire);
    loop {
        if gen_of(w) != g as u32 || state_of(w) != ACTIVE || (!force && used_of(w) != 0) {
            return false;
        }
        match d
            .word
            .compare_exchange(w, pack(next, FREE, 0), Ordering::AcqRel, Ordering::Acquire)
        {
            Ok(_) => break,
            Err(x) => w = x,
        }
    }
    shared::crash_point("release");
    // Registrations of id g grant no access from here on. Until this store
    // a peer could still reach the block, now empty and not yet reused
    // (reuse takes the lock), and its pages are given back only below.
    d.id.store(next, Ordering::Release);
    let loc = d.location.load(Ordering::Relaxed);
    let size = d.size.load(Ordering::Relaxed);
    // Back to the OS before the units can be reused.
    seg.punch(loc, size);
    let bs = seg.geo.block_size;
    for u in (loc / bs) as u32..((loc + size) / bs) as u32 {
        seg.unit(u).store(0, Ordering::Relaxed);
    }
    d.location.store(NONE, Ordering::Relaxed);
    d.size.store(0, Ordering::Relaxed);
    d.owner_pid.store(0, Ordering::Relaxed);
    d.next_free
        .store(h.free_head.load(Ordering::Relaxed), Ordering::Relaxed);
    h.free_head.store(i + 1, Ordering::Relaxed);
    h.released.fetch_add(1, Ordering::Relaxed);
    true
}

/// Run by the locker that found the previous holder dead: rebuilds every
/// derived structure from the descriptor words (the commit points).
fn repair(seg: &Segment) {
    let h = seg.header();
    let bs = seg.geo.block_size;
    tracing::warn!("heap table lock holder died: repairing the table");
    for u in 0..seg.geo.units {
        seg.unit(u).store(0, Ordering::Relaxed);
    }
    let mut free_head = 0;
    for i in (0..seg.geo.max_blocks).rev() {
        let d = seg.desc(i);
        let w = d.word.load(Ordering::Acquire);
        // A release that committed (the word) but died before storing the
        // new id: the id catches up with the word's low 32 bits.
        let id = d.id.load(Ordering::Relaxed);
        if id as u32 != gen_of(w) {
            let next = id.wrapping_add(gen_of(w).wrapping_sub(id as u32) as u64);
            d.id.store(next, Ordering::Release);
        }
        if state_of(w) == ACTIVE {
            let (loc, size) = (
                d.location.load(Ordering::Relaxed),
                d.size.load(Ordering::Relaxed),
            );
            for u in (loc / bs) as u32..((loc + size) / bs) as u32 {
                seg.unit(u).store(i + 1, Ordering::Relaxed);
            }
        } else {
            d.location.store(NONE, Ordering::Relaxed);
            d.size.store(0, Ordering::Relaxed);
            d.owner_pid.store(0, Ordering::Relaxed);
            d.next_free.store(free_head, Ordering::Relaxed);
            free_head = i + 1;
        }
    }
    h.free_head.store(free_head, Ordering::Relaxed);
    // A release that committed but died before punching: free units give
    // their pages back now.
    let mut u = 0;
    while u < seg.geo.units {
        if seg.unit(u).load(Ordering::Relaxed) != 0 {
            u += 1;
            continue;
        }
        let s = u;
        while u < seg.geo.units && seg.unit(u).load(Ordering::Relaxed) == 0 {
            u += 1;
        }
        seg.punch(s as u64 * bs, (u - s) as u64 * bs);
    }
}

fn check_locked(seg: &Segment, quiet: bool) -> std::result::Result<TableReport, String> {
    let bs = seg.geo.block_size;
    let h = seg.header();
    let mut rep = TableReport {
        recovered: h.recovered.load(Ordering::Relaxed),
        reaped: h.reaped.load(Ordering::Relaxed),
        ..TableReport::default()
    };
    let mut owner = vec![0u32; seg.geo.units as usize];
    for i in 0..seg.geo.max_blocks {
        let d = seg.desc(i);
        let w = d.word.load(Ordering::Acquire);
        let (loc, size) = (
            d.location.load(Ordering::Relaxed),
            d.size.load(Ordering::Relaxed),
        );
        let id = d.id.load(Ordering::Relaxed);
        if id == 0 {
            return Err(format!("descriptor {i} has block id 0"));
        }
        if id as u32 != gen_of(w) {
            return Err(format!(
                "descriptor {i}: block id {id} but its word says {}",
                gen_of(w)
            ));
        }
        if state_of(w) == ACTIVE {
            rep.active_blocks += 1;
            if loc == NONE
                || loc % bs != 0
                || size == 0
                || size % bs != 0
                || loc + size > seg.area_len()
            {
                return Err(format!(
                    "live descriptor {i}: bad location {loc:#x} / size {size}"
                ));
            }
            let (a, b) = ((loc / bs) as usize, ((loc + size) / bs) as usize);
            for (k, o) in owner[a..b].iter_mut().enumerate() {
                if *o != 0 {
                    return Err(format!("unit {} in blocks {} and {i}", a + k, *o - 1));
                }
                *o = i + 1;
                rep.units_used += 1;
            }
            let hdr = seg.block(loc);
            if hdr.magic.load(Ordering::Relaxed) != shared::BLOCK_MAGIC
                || hdr.index.load(Ordering::Relaxed) != i
                || hdr.gen.load(Ordering::Relaxed) != id
            {
                return Err(format!("block {i}: header does not name it"));
            }
            let slots = hdr.slots.load(Ordering::Relaxed);
            let bits: u32 = (0..slots.div_ceil(64))
                .map(|k| seg.bitmap(loc, k).load(Ordering::Relaxed).count_ones())
                .sum();
            let used = used_of(w);
            if used > slots || bits > used || (quiet && bits != used) {
                return Err(format!(
                    "block {i}: {used} slots counted, {bits} marked, {slots} in all"
                ));
            }
            rep.slots_used += used as u64;
        } else if loc != NONE || size != 0 {
            return Err(format!(
                "free descriptor {i} still has location {loc:#x} / size {size}"
            ));
        }
    }
    for u in 0..seg.geo.units {
        let m = seg.unit(u).load(Ordering::Relaxed);
        if m != owner[u as usize] {
            return Err(format!(
                "unit map {u} says {m}, descriptors say {}",
                owner[u as usize]
            ));
        }
    }
    let mut seen = vec![false; seg.geo.max_blocks as usize];
    let mut at = h.free_head.load(Ordering::Relaxed);
    while at != 0 {
        let i = at - 1;
        if i >= seg.geo.max_blocks || seen[i as usize] {
            return Err(format!("free list broken at {i}"));
        }
        seen[i as usize] = true;
        if state_of(seg.desc(i).word.load(Ordering::Relaxed)) != FREE {
            return Err(format!("free list holds live descriptor {i}"));
        }
        rep.free_descriptors += 1;
        at = seg.desc(i).next_free.load(Ordering::Relaxed);
    }
    if rep.free_descriptors + rep.active_blocks != seg.geo.max_blocks {
        return Err(format!(
            "{} free + {} live != {} descriptors",
            rep.free_descriptors, rep.active_blocks, seg.geo.max_blocks
        ));
    }
    Ok(rep)
}

impl Drop for Inner {
    fn drop(&mut self) {
        if let Some(id) = self.check_id.lock().take() {
            self.pd.device().remove_post_check(id);
        }
        // Clean exit: deregister everything, give our blocks back.
        let regs: Vec<Reg> = self
            .regs
            .lock()
            .iter_mut()
            .filter_map(|r| r.take())
            .collect();
        for r in regs {
            self.deregister(r);
        }
        let seg = &self.seg;
        let _l = match seg.lock(repair) {
            Ok(l) => l,
            Err(e) => {
                tracing::warn!(error = %e, "heap: could not release this process's blocks at exit");
                return;
            }
        };
        for i in 0..seg.geo.max_blocks {
            let d = seg.desc(i);
            let w = d.word.load(Ordering::Acquire);
            if state_of(w) == ACTIVE && self.owns(d) {
                // Only empty ones: a leaked buffer's block stays (and is
                // reaped after this process exits).
                release_locked(seg, i, d.id.load(Ordering::Relaxed), false);
            }
        }
    }
}

/// The debug-build check that no work request names a stale registration.
struct StaleCheck {
    heap: Weak<Inner>,
}

impl PostCheck for StaleCheck {
    fn check(&self, sge: &Sge) -> std::result::Result<(), String> {
        let Some(h) = self.heap.upgrade() else {
            return Ok(());
        };
        let Some(&(i, g)) = h.lkeys.read().get(&sge.lkey) else {
            return Ok(()); // not one of the heap's registrations
        };
        let d = h.seg.desc(i);
        let id = d.id.load(Ordering::Acquire);
        let w = d.word.load(Ordering::Acquire);
        if id != g || state_of(w) != ACTIVE {
            return Err(format!(
                "lkey {:#x} is a stale heap registration: block {i} was id {g}, is now id {id} ({})",
                sge.lkey,
                if state_of(w) == ACTIVE && id != g {
                    "replaced"
                } else {
                    "released"
                }
            ));
        }
        Ok(())
    }
}

/// An allocation: owned bytes of the heap that know their keys, returned
/// to the heap on drop.
///
/// Remote peers given [`HeapBuf::addr`] and [`HeapBuf::rkey`] may write
/// into it at any time while registered; as with any RDMA buffer, the
/// application protocol says when the bytes are the application's to read.
pub struct HeapBuf {
    heap: Heap,
    ptr: NonNull<u8>,
    len: usize,
    block: u32,
    gen: u64,
    slot: u32,
    lkey: u32,
    rkey: u32,
}

// SAFETY: a HeapBuf owns its slot exclusively (its bitmap bit), and the
// mapping lives as long as the heap handle it holds.
unsafe impl Send for HeapBuf {}
// SAFETY: as for Send.
unsafe impl Sync for HeapBuf {}

impl HeapBuf {
    pub fn lkey(&self) -> u32 {
        self.lkey
    }
    pub fn rkey(&self) -> u32 {
        self.rkey
    }
    /// Address in this process (and in peers that mapped the heap at the
    /// same address).
    pub fn addr(&self) -> u64 {
        self.ptr.as_ptr() as u64
    }
    /// Offset in the heap's area: names the bytes in every process.
    pub fn offset(&self) -> u64 {
        self.addr() - self.heap.area_base()
    }
    /// (descriptor index, block id) of its block.
    pub fn block(&self) -> (u32, u64) {
        (self.block, self.gen)
    }
    /// An SGE of `len` bytes at `offset` in the buffer.
    pub fn sge(&self, offset: usize, len: usize) -> Sge {
        assert!(offset + len <= self.len, "SGE outside the buffer");
        Sge {
            addr: self.addr() + offset as u64,
            length: len as u32,
            lkey: softrdma_verbs::Lkey::from_raw(self.lkey),
        }
    }
    /// The whole buffer as an SGE.
    pub fn sge_all(&self) -> Sge {
        self.sge(0, self.len)
    }
    pub fn heap(&self) -> &Heap {
        &self.heap
    }
}

/// A buffer's bytes are registered memory: a peer (RDMA Write) or the
/// engine (a receive, a Read Response) may write them at any moment, so
/// they are never handed out as a Rust slice (issue 19). Bytes are copied
/// in and out through the raw pointer instead, as the store's `Arena`
/// does; what a copy sees of a concurrent write is whatever the hardware
/// gives, never undefined behaviour in this process's Rust code.
impl HeapBuf {
    /// Copies `out.len()` bytes starting `offset` bytes in.
    pub fn read_at(&self, offset: usize, out: &mut [u8]) {
        assert!(
            offset.checked_add(out.len()).is_some_and(|e| e <= self.len),
            "read outside the buffer"
        );
        // SAFETY: [offset, offset + out.len()) lies in our slot (checked
        // above), inside a mapping that lives while `self.heap` does; `out`
        // is a distinct Rust buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            )
        }
    }

    /// Copies `data` in, starting `offset` bytes in.
    pub fn write_at(&mut self, offset: usize, data: &[u8]) {
        assert!(
            offset
                .checked_add(data.len())
                .is_some_and(|e| e <= self.len),
            "write outside the buffer"
        );
        // SAFETY: as for read_at; `&mut self` makes this process's access
        // unique.
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len())
        }
    }

    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Sets every byte to `byte`.
    pub fn fill(&mut self, byte: u8) {
        // SAFETY: the slot is ours and `len` bytes long (as for read_at).
        unsafe { std::ptr::write_bytes(self.ptr.as_ptr(), byte, self.len) }
    }

    /// A copy of the whole buffer.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = vec![0u8; self.len];
        self.read_at(0, &mut v);
        v
    }
}

impl std::fmt::Debug for HeapBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeapBuf")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len)
            .field("block", &self.block)
            .field("gen", &self.gen)
            .field("lkey", &format_args!("{:#x}", self.lkey))
            .finish()
    }
}

impl Drop for HeapBuf {
    fn drop(&mut self) {
        self.heap.inner.free_slot(self.block, self.gen, self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn packing_round_trips() {
        let w = pack(7, ACTIVE, 12345);
        assert_eq!((gen_of(w), state_of(w), used_of(w)), (7, ACTIVE, 12345));
        assert_eq!(used_of(w + 1), 12346);
    }

    #[test]
    fn the_word_holds_the_low_32_bits_of_the_id() {
        let w = pack((5 << 32) + 7, ACTIVE, 3);
        assert_eq!((gen_of(w), state_of(w), used_of(w)), (7, ACTIVE, 3));
        assert_eq!(pack(1 << 32, FREE, 0), pack(0, FREE, 0));
    }

    #[test]
    fn slab_layouts_fit() {
        for bs in [64u64 << 10, 4 << 20, 1 << 30] {
            let mut slot = MIN_SLOT;
            while slot <= bs / 4 {
                let (off, n) = slab_layout(bs, slot);
                assert!(n >= 3, "bs {bs} slot {slot}: {n} slots");
                assert!(off + n as u64 * slot <= bs);
                assert!(BLOCK_HDR as u64 + (n as u64).div_ceil(64) * 8 <= off);
                assert_eq!(off % page(), 0);
                slot *= 2;
            }
        }
    }
}
