//! The shared segment: one file under `/dev/shm` that every process of a
//! heap maps, holding
//!
//! ```text
//! offset 0          header: geometry, the table lock, free-list head, counters
//! desc_off          descriptor table: MAX_BLOCKS x 64-byte descriptors
//! unit_off          unit map: one u32 per BLOCK_SIZE unit of the area
//!                   (descriptor index + 1 of the block covering it, 0: free)
//! area_off          block area: UNITS x BLOCK_SIZE, sparse (blocks are
//!                   given back to the OS by punching holes)
//! ```
//!
//! A descriptor's `word` is the commit point of every change to it:
//! `id (low 32 bits) | state (2) | slots in use (30)`. A block becomes
//! live when its word turns ACTIVE (after its location, size, unit map and
//! header are written) and dies when a compare-and-swap from
//! `(g, ACTIVE, 0 in use)` to `(g + 1, FREE, 0)` succeeds: an allocation
//! racing with the release fails its own compare-and-swap on the same word.
//! The block id is 64 bits: the descriptor's `id` holds all of it (the
//! word, its low 32 bits), changes only under the table lock, right after
//! a release commits, and never comes back to a value it had (2^64
//! releases of one descriptor). Every process holding a registration of id
//! `g` sees it is stale without being told, and the access guard of each
//! registration compares `id` with `g`.
//!
//! Obtaining and releasing blocks take the table lock, a robust
//! process-shared `pthread` mutex: if its holder dies, the next locker gets
//! `EOWNERDEAD` and rebuilds everything derived (free list, unit map, the
//! location of dead descriptors, holes for free units) from the descriptor
//! words, the only state that was committed. Allocating and freeing slots
//! inside a live block take no lock (atomic bitmap in the block header).
//!
//! All `unsafe` code of the heap is in this file.

use crate::{HeapError, Result};
use std::cell::UnsafeCell;
use std::fs::File;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};

pub const MAGIC: u64 = u64::from_le_bytes(*b"SRHEAP01");
pub const BLOCK_MAGIC: u64 = u64::from_le_bytes(*b"SRBLOCK1");
/// Layout version: 2 since block ids are 64 bits (the descriptor's `id`,
/// the block header's `gen`); a segment of another version is refused.
pub const VERSION: u32 = 2;

/// Descriptor states.
pub const FREE: u64 = 0;
pub const ACTIVE: u64 = 1;

/// `location` of a descriptor that has no block.
pub const NONE: u64 = u64::MAX;

/// Class of a block holding one large allocation.
pub const HUGE: u32 = u32::MAX;

/// Bytes of a block header before its bitmap.
pub const BLOCK_HDR: usize = 64;

/// A descriptor word: the low 32 bits of block id `id`, a state, a count.
#[inline]
pub fn pack(id: u64, state: u64, used: u32) -> u64 {
    debug_assert!(used < 1 << 30);
    (id as u32 as u64) << 32 | state << 30 | used as u64
}
/// The low 32 bits of the block id in a descriptor word.
#[inline]
pub fn gen_of(w: u64) -> u32 {
    (w >> 32) as u32
}
#[inline]
pub fn state_of(w: u64) -> u64 {
    (w >> 30) & 3
}
#[inline]
pub fn used_of(w: u64) -> u32 {
    (w & ((1 << 30) - 1)) as u32
}

#[repr(C)]
pub struct Header {
    /// Written last by the creator.
    pub magic: AtomicU64,
    pub version: AtomicU32,
    pub max_blocks: AtomicU32,
    pub block_size: AtomicU64,
    pub units: AtomicU32,
    _pad0: u32,
    pub desc_off: AtomicU64,
    pub unit_off: AtomicU64,
    pub area_off: AtomicU64,
    pub total_len: AtomicU64,
    /// The creator's mapping address: others try to map there too, so
    /// heap addresses are equal in every process when possible.
    pub base_hint: AtomicU64,
    /// Under the lock: index + 1 of the first free descriptor (0: none).
    pub free_head: AtomicU32,
    /// Under the lock: where the next search for free units starts.
    pub unit_hint: AtomicU32,
    pub obtained: AtomicU64,
    pub released: AtomicU64,
    /// Times a locker found the previous holder dead and repaired.
    pub recovered: AtomicU64,
    /// Blocks of dead processes released by others.
    pub reaped: AtomicU64,
    _pad1: [u64; 2],
    lock: UnsafeCell<libc::pthread_mutex_t>,
}

#[repr(C, align(64))]
pub struct Desc {
    pub word: AtomicU64,
    /// Byte offset of the block in the area, or [`NONE`].
    pub location: AtomicU64,
    /// Bytes (a multiple of the block size), 0 when free.
    pub size: AtomicU64,
    /// Slot size of the block's allocations (bytes), or [`HUGE`].
    pub class: AtomicU32,
    /// Under the lock: free-list link (index + 1, 0: end).
    pub next_free: AtomicU32,
    pub owner_pid: AtomicU32,
    _pad: u32,
    /// The owner's start time (clock ticks after boot): with the pid it
    /// names one process even after the pid is reused.
    pub owner_start: AtomicU64,
    /// The block id, 64 bits: of the live block (ACTIVE), or the one the
    /// next block will have (FREE). Its low 32 bits are the word's. The
    /// access guard of every registration of the block watches it.
    pub id: AtomicU64,
    _pad2: u64,
}

/// The start of a block (in the block's own memory, outside its
/// registration, so remote peers cannot reach it).
#[repr(C)]
pub struct BlockHeader {
    pub magic: AtomicU64,
    pub index: AtomicU32,
    pub class: AtomicU32,
    /// The block id (the descriptor's `id` when it was obtained).
    pub gen: AtomicU64,
    pub slots: AtomicU32,
    pub data_off: AtomicU32,
    /// Bitmap word where the next slot search starts.
    pub hint: AtomicU32,
    _pad: [u32; 7],
}

const _: () = assert!(std::mem::size_of::<Desc>() == 64);
const _: () = assert!(std::mem::size_of::<BlockHeader>() == BLOCK_HDR);

/// Geometry of a new segment.
#[derive(Debug, Clone, Copy)]
pub struct Geometry {
    pub block_size: u64,
    pub max_blocks: u32,
    pub units: u32,
}

/// A mapped segment. Unmapped when the last `Arc` goes (registrations of
/// its memory hold one, see `register_owned`).
pub struct Segment {
    base: *mut u8,
    len: usize,
    file: File,
    pub geo: Geometry,
    desc_off: usize,
    unit_off: usize,
    pub area_off: usize,
}

// SAFETY: the mapping is shared memory accessed only through atomics (the
// metadata) or through raw pointers handed to owners of slots; the raw
// pointer itself may move between threads.
unsafe impl Send for Segment {}
// SAFETY: as for Send.
unsafe impl Sync for Segment {}

pub fn page() -> u64 {
    // SAFETY: sysconf has no memory effects.
    unsafe { libc::sysconf(libc::_SC_PAGESIZE) as u64 }
}

fn io(what: &str, e: std::io::Error) -> HeapError {
    HeapError::Os(format!("{what}: {e}"))
}

fn layout_of(geo: &Geometry) -> (usize, usize, usize, usize) {
    let pg = page() as usize;
    let desc_off = std::mem::size_of::<Header>().next_multiple_of(64);
    let unit_off = desc_off + geo.max_blocks as usize * 64;
    let meta_end = (unit_off + geo.units as usize * 4).next_multiple_of(pg);
    let area_off = meta_end.next_multiple_of(geo.block_size as usize);
    let total = area_off + geo.units as usize * geo.block_size as usize;
    (desc_off, unit_off, area_off, total)
}

/// `mmap` of the whole file, at `hint` if that range is free.
fn map(fd: RawFd, len: usize, hint: u64, align: usize) -> Result<*mut u8> {
    let prot = libc::PROT_READ | libc::PROT_WRITE;
    if hint != 0 {
        // SAFETY: MAP_FIXED_NOREPLACE never replaces an existing mapping;
        // it fails instead when the range is taken.
        let p = unsafe {
            libc::mmap(
                hint as *mut libc::c_void,
                len,
                prot,
                libc::MAP_SHARED | libc::MAP_FIXED_NOREPLACE,
                fd,
                0,
            )
        };
        if p != libc::MAP_FAILED {
            if p as u64 == hint {
                return Ok(p as *mut u8);
            }
            // Old kernels treat the flag as a hint: not where we asked.
            // SAFETY: p is the mapping just made, of len bytes.
            unsafe { libc::munmap(p, len) };
        }
    }
    // Reserve len + align so that the area can start block-aligned: blocks
    // are found from an address by rounding down to the block size.
    // SAFETY: a fresh anonymous reservation; nothing else refers to it.
    let r = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len + align,
            libc::PROT_NONE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if r == libc::MAP_FAILED {
        return Err(io("mmap", std::io::Error::last_os_error()));
    }
    let start = (r as usize).next_multiple_of(align);
    // SAFETY: [start, start+len) lies inside the reservation made above,
    // which MAP_FIXED replaces with the file; the rest is unmapped below.
    let p = unsafe {
        libc::mmap(
            start as *mut libc::c_void,
            len,
            prot,
            libc::MAP_SHARED | libc::MAP_FIXED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        let e = std::io::Error::last_os_error();
        // SAFETY: the reservation made above.
        unsafe { libc::munmap(r, len + align) };
        return Err(io("mmap", e));
    }
    let head = start - r as usize;
    // SAFETY: the unused ends of our own reservation.
    unsafe {
        if head > 0 {
            libc::munmap(r, head);
        }
        let tail = align - head;
        if tail > 0 {
            libc::munmap((start + len) as *mut libc::c_void, tail);
        }
    }
    Ok(p as *mut u8)
}

pub fn path_of(name: &str) -> std::path::PathBuf {
    std::path::PathBuf::from(format!("/dev/shm/softrdma-heap-{name}"))
}

impl Segment {
    /// Creates and initialises the segment `name`; fails if it exists.
    pub fn create(name: &str, geo: Geometry) -> Result<Segment> {
        let path = path_of(name);
        if path.exists() {
            return Err(HeapError::Exists(name.to_string()));
        }
        // Initialise under a private name, then publish with link(2), which
        // fails if the name exists: an opener never sees a segment that is
        // not initialised, and of two racing creators one wins.
        let tmp = path.with_file_name(format!(
            "softrdma-heap-{name}.init-{}-{:x}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos())
        ));
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&tmp)
            .map_err(|e| io(&format!("create {}", tmp.display()), e))?;
        let (desc_off, unit_off, area_off, total) = layout_of(&geo);
        let done = (|| {
            file.set_len(total as u64).map_err(|e| io("ftruncate", e))?;
            let base = map(file.as_raw_fd(), total, 0, geo.block_size as usize)?;
            let seg = Segment {
                base,
                len: total,
                file,
                geo,
                desc_off,
                unit_off,
                area_off,
            };
            seg.init()?;
            std::fs::hard_link(&tmp, &path).map_err(|e| {
                if e.kind() == std::io::ErrorKind::AlreadyExists {
                    HeapError::Exists(name.to_string())
                } else {
                    io(&format!("link {}", path.display()), e)
                }
            })?;
            Ok(seg)
        })();
        let _ = std::fs::remove_file(&tmp);
        done
    }

    fn init(&self) -> Result<()> {
        let h = self.header();
        h.version.store(VERSION, Ordering::Relaxed);
        h.max_blocks.store(self.geo.max_blocks, Ordering::Relaxed);
        h.block_size.store(self.geo.block_size, Ordering::Relaxed);
        h.units.store(self.geo.units, Ordering::Relaxed);
        h.desc_off.store(self.desc_off as u64, Ordering::Relaxed);
        h.unit_off.store(self.unit_off as u64, Ordering::Relaxed);
        h.area_off.store(self.area_off as u64, Ordering::Relaxed);
        h.total_len.store(self.len as u64, Ordering::Relaxed);
        h.base_hint.store(self.base as u64, Ordering::Relaxed);
        for i in 0..self.geo.max_blocks {
            let d = self.desc(i);
            d.word.store(pack(1, FREE, 0), Ordering::Relaxed);
            d.id.store(1, Ordering::Relaxed);
            d.location.store(NONE, Ordering::Relaxed);
            d.next_free.store(
                if i + 1 < self.geo.max_blocks {
                    i + 2
                } else {
                    0
                },
                Ordering::Relaxed,
            );
        }
        h.free_head.store(1, Ordering::Relaxed);
        // SAFETY: the mutex lives in the shared header, which no other
        // process reads before `magic` is set below; the attribute object
        // is local and destroyed after use.
        unsafe {
            let mut attr: libc::pthread_mutexattr_t = std::mem::zeroed();
            let m = h.lock.get();
            let r = (|| {
                for r in [
                    libc::pthread_mutexattr_init(&mut attr),
                    libc::pthread_mutexattr_setpshared(&mut attr, libc::PTHREAD_PROCESS_SHARED),
                    libc::pthread_mutexattr_setrobust(&mut attr, libc::PTHREAD_MUTEX_ROBUST),
                    libc::pthread_mutex_init(m, &attr),
                ] {
                    if r != 0 {
                        return Err(std::io::Error::from_raw_os_error(r));
                    }
                }
                Ok(())
            })();
            libc::pthread_mutexattr_destroy(&mut attr);
            r.map_err(|e| io("pthread_mutex_init", e))?;
        }
        h.magic.store(MAGIC, Ordering::Release);
        Ok(())
    }

    /// Maps the existing segment `name`.
    pub fn open(name: &str) -> Result<Segment> {
        let path = path_of(name);
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| {
                if e.kind() == std::io::ErrorKind::NotFound {
                    HeapError::NotFound(name.to_string())
                } else {
                    io(&format!("open {}", path.display()), e)
                }
            })?;
        Self::open_file(file, name)
    }

    fn open_file(file: File, name: &str) -> Result<Segment> {
        let size = file.metadata().map_err(|e| io("stat", e))?.len() as usize;
        let hdr = std::mem::size_of::<Header>();
        if size < hdr {
            return Err(HeapError::Corrupt("segment shorter than its header".into()));
        }
        // Read the header with pread: its geometry says how much to map.
        let mut raw = vec![0u8; hdr];
        std::os::unix::fs::FileExt::read_exact_at(&file, &mut raw, 0)
            .map_err(|e| io("read header", e))?;
        let word = |off: usize| u64::from_le_bytes(raw[off..off + 8].try_into().unwrap());
        let word32 = |off: usize| u32::from_le_bytes(raw[off..off + 4].try_into().unwrap());
        if word(0) != MAGIC {
            return Err(HeapError::Corrupt("not a softrdma heap (bad magic)".into()));
        }
        if word32(8) != VERSION {
            return Err(HeapError::Version {
                name: name.to_string(),
                found: word32(8),
                want: VERSION,
            });
        }
        let geo = Geometry {
            max_blocks: word32(12),
            block_size: word(16),
            units: word32(24),
        };
        let (desc_off, unit_off, area_off, total) = layout_of(&geo);
        if total != size || word(56) != total as u64 || word(48) != area_off as u64 {
            return Err(HeapError::Corrupt(
                "segment size does not match its geometry".into(),
            ));
        }
        let hint = word(64);
        let base = map(file.as_raw_fd(), total, hint, geo.block_size as usize)?;
        Ok(Segment {
            base,
            len: total,
            file,
            geo,
            desc_off,
            unit_off,
            area_off,
        })
    }

    pub fn fd(&self) -> RawFd {
        self.file.as_raw_fd()
    }

    pub fn base(&self) -> u64 {
        self.base as u64
    }

    pub fn header(&self) -> &Header {
        // SAFETY: the header is at offset 0 of a mapping at least that long
        // (checked at open), suitably aligned (page-aligned mapping), and
        // all its fields are atomics or the mutex (shared access is fine).
        unsafe { &*(self.base as *const Header) }
    }

    pub fn desc(&self, i: u32) -> &Desc {
        assert!(i < self.geo.max_blocks, "descriptor index {i} out of range");
        // SAFETY: in bounds (asserted), 64-byte aligned, atomics only.
        unsafe { &*(self.base.add(self.desc_off + i as usize * 64) as *const Desc) }
    }

    pub fn unit(&self, u: u32) -> &AtomicU32 {
        assert!(u < self.geo.units, "unit {u} out of range");
        // SAFETY: in bounds (asserted), 4-byte aligned, an atomic.
        unsafe { &*(self.base.add(self.unit_off + u as usize * 4) as *const AtomicU32) }
    }

    /// Address of byte `off` of the area.
    pub fn area_ptr(&self, off: u64) -> *mut u8 {
        assert!(off <= self.geo.units as u64 * self.geo.block_size);
        // SAFETY: within the mapping (asserted).
        unsafe { self.base.add(self.area_off + off as usize) }
    }

    pub fn area_len(&self) -> u64 {
        self.geo.units as u64 * self.geo.block_size
    }

    /// The header of the block at area offset `loc` (any unit start).
    pub fn block(&self, loc: u64) -> &BlockHeader {
        assert!(loc.is_multiple_of(self.geo.block_size) && loc < self.area_len());
        // SAFETY: unit starts are block-size (so 64-byte) aligned and
        // mapped; the header's fields are atomics.
        unsafe { &*(self.area_ptr(loc) as *const BlockHeader) }
    }

    /// Bitmap word `w` of the block at `loc`.
    pub fn bitmap(&self, loc: u64, w: u32) -> &AtomicU64 {
        let off = BLOCK_HDR + w as usize * 8;
        assert!(off + 8 <= self.geo.block_size as usize);
        // SAFETY: inside the block's first unit (asserted), 8-aligned.
        unsafe { &*(self.area_ptr(loc).add(off) as *const AtomicU64) }
    }

    /// Gives the pages of `[off, off + len)` of the area back to the OS.
    pub fn punch(&self, off: u64, len: u64) {
        let r = unsafe {
            // SAFETY: fallocate on our own descriptor; the range is inside
            // the file. The pages read as zero afterwards.
            libc::fallocate(
                self.fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                (self.area_off as u64 + off) as libc::off_t,
                len as libc::off_t,
            )
        };
        if r != 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), "punching a released block failed");
        }
    }

    /// Takes the table lock. `repair` runs (with the lock held) when the
    /// previous holder died holding it.
    pub fn lock(&self, repair: impl FnOnce(&Segment)) -> Result<TableLock<'_>> {
        let m = self.header().lock.get();
        // SAFETY: the mutex was initialised by the creator before `magic`
        // was published, and lives as long as the mapping.
        let r = unsafe { libc::pthread_mutex_lock(m) };
        match r {
            0 => {}
            libc::EOWNERDEAD => {
                repair(self);
                self.header().recovered.fetch_add(1, Ordering::Relaxed);
                // SAFETY: we hold the mutex (EOWNERDEAD returns it locked).
                unsafe { libc::pthread_mutex_consistent(m) };
            }
            e => return Err(io("table lock", std::io::Error::from_raw_os_error(e))),
        }
        Ok(TableLock { seg: self })
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: our own mapping; nothing refers to it any more (every
        // registration and buffer holds an Arc of this segment).
        unsafe { libc::munmap(self.base as *mut libc::c_void, self.len) };
    }
}

/// The table lock, held.
pub struct TableLock<'a> {
    seg: &'a Segment,
}

impl Drop for TableLock<'_> {
    fn drop(&mut self) {
        // SAFETY: we hold the mutex.
        unsafe { libc::pthread_mutex_unlock(self.seg.header().lock.get()) };
    }
}

/// Test hook: `SOFTRDMA_HEAP_CRASH=<point>` kills the process (SIGKILL,
/// like an OOM kill) when it reaches `point` inside the table lock.
pub fn crash_point(point: &str) {
    static AT: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    if AT
        .get_or_init(|| std::env::var("SOFTRDMA_HEAP_CRASH").ok())
        .as_deref()
        == Some(point)
    {
        // SAFETY: raising a signal at ourselves.
        unsafe { libc::raise(libc::SIGKILL) };
    }
}

/// Test hook: `SOFTRDMA_HEAP_ID_STEP=N` makes each release of this process
/// advance the block id as N releases would (as if the descriptor had been
/// obtained and released N - 1 more times in between), so that a test can
/// bring an id to where it wraps without 2^32 releases.
pub fn id_step() -> u64 {
    static STEP: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *STEP.get_or_init(|| {
        std::env::var("SOFTRDMA_HEAP_ID_STEP")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|&n| n > 0)
            .unwrap_or(1)
    })
}

/// The start time of process `pid` in clock ticks after boot
/// (`/proc/PID/stat` field 22); `None` if it is gone or a zombie (a
/// zombie holds nothing), or when `/proc` cannot tell.
pub fn start_time(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let mut f = rest.split_whitespace();
    let state = f.next()?;
    if state == "Z" || state == "X" {
        return None;
    }
    f.nth(18)?.parse().ok()
}

/// Whether the process `pid` started at `start` is still alive. Without a
/// readable `/proc` (then our own start time is 0 too), only whether a
/// process with that pid exists.
pub fn alive(pid: u32, start: u64) -> bool {
    if pid == 0 {
        return false;
    }
    if start != 0 {
        return start_time(pid) == Some(start);
    }
    // SAFETY: signal 0 only checks that the process exists.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() != Some(libc::ESRCH)
}
