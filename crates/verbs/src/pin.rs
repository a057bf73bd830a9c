//! Page pinning: what a registration costs on a real RDMA stack.
//!
//! `ibv_reg_mr` pins the pages of a region (the kernel's
//! `pin_user_pages`), counts them against `RLIMIT_MEMLOCK`, and unpins them
//! when the region is deregistered. The engine does the same with
//! `mlock(2)`/`munlock(2)`, so registration is as costly here as it is
//! there, and so the registered-memory heap's caching (`softrdma-heap`) is
//! measurable against it.
//!
//! `mlock` does not count: one `munlock` unlocks a page however many times
//! it was locked. Registrations overlap (the same buffer registered twice,
//! by two devices of one process, say), so the pins of the whole process
//! are kept in one map of page ranges with a count each ([`PinMap`]): a
//! range is locked when its count goes from 0 to 1 and unlocked when it
//! returns to 0. Pinned bytes are counted against a process-wide limit
//! ([`set_pin_limit`], or `SOFTRDMA_PIN_LIMIT=512M` in the environment;
//! default: none beyond the kernel's own `RLIMIT_MEMLOCK`).
//! `SOFTRDMA_PIN=0` in the environment turns pinning off for the process
//! (registrations then cost only the STag table update).

use crate::error::{Error, Result};
use parking_lot::Mutex;
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// Page ranges with pin counts. Pure bookkeeping: it says which ranges must
/// be locked or unlocked; `Pinner` makes the system calls.
#[derive(Debug, Default, Clone)]
pub struct PinMap {
    /// start -> (end, count), disjoint, count > 0.
    map: BTreeMap<u64, (u64, u32)>,
    bytes: u64,
}

impl PinMap {
    /// Bytes with a count above zero.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Number of ranges kept (for tests: merging keeps it small).
    pub fn ranges(&self) -> usize {
        self.map.len()
    }

    /// The count of the byte at `x`.
    pub fn count_at(&self, x: u64) -> u32 {
        match self.map.range(..=x).next_back() {
            Some((_, &(end, c))) if x < end => c,
            _ => 0,
        }
    }

    /// Splits the range containing `x` (strictly inside) at `x`.
    fn split_at(&mut self, x: u64) {
        if let Some((&a, &(b, c))) = self.map.range(..x).next_back() {
            if x < b {
                self.map.insert(a, (x, c));
                self.map.insert(x, (b, c));
            }
        }
    }

    /// Merges the ranges meeting at `x` if their counts are equal.
    fn merge_at(&mut self, x: u64) {
        let Some(&(b, c)) = self.map.get(&x) else {
            return;
        };
        if let Some((&a, &(e, c0))) = self.map.range(..x).next_back() {
            if e == x && c0 == c {
                self.map.remove(&x);
                self.map.insert(a, (b, c));
            }
        }
    }

    /// The parts of `[s, e)` with count zero.
    pub fn gaps(&self, s: u64, e: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        let mut at = s;
        let first = match self.map.range(..s).next_back() {
            Some((&a, _)) => a,
            None => s,
        };
        for (&a, &(b, _)) in self.map.range(first..e) {
            if b <= at {
                continue;
            }
            if a > at {
                out.push((at, a.min(e)));
            }
            at = b;
            if at >= e {
                break;
            }
        }
        if at < e {
            out.push((at, e));
        }
        out
    }

    /// Counts `[s, e)` once more; returns the ranges that went from 0 to 1
    /// (to be locked).
    pub fn pin(&mut self, s: u64, e: u64) -> Vec<(u64, u64)> {
        assert!(s < e, "empty pin range");
        let gaps = self.gaps(s, e);
        self.split_at(s);
        self.split_at(e);
        let keys: Vec<u64> = self.map.range(s..e).map(|(&a, _)| a).collect();
        for a in keys {
            self.map.get_mut(&a).unwrap().1 += 1;
        }
        for &(a, b) in &gaps {
            self.map.insert(a, (b, 1));
            self.bytes += b - a;
        }
        self.merge_at(s);
        self.merge_at(e);
        gaps
    }

    /// Counts `[s, e)` once less (it must have been pinned); returns the
    /// ranges that went from 1 to 0 (to be unlocked).
    pub fn unpin(&mut self, s: u64, e: u64) -> Vec<(u64, u64)> {
        assert!(s < e, "empty pin range");
        assert!(self.gaps(s, e).is_empty(), "unpin of a range not pinned");
        self.split_at(s);
        self.split_at(e);
        let keys: Vec<u64> = self.map.range(s..e).map(|(&a, _)| a).collect();
        let mut freed: Vec<(u64, u64)> = Vec::new();
        for a in keys {
            let r = self.map.get_mut(&a).unwrap();
            r.1 -= 1;
            if r.1 == 0 {
                let b = r.0;
                self.map.remove(&a);
                self.bytes -= b - a;
                match freed.last_mut() {
                    Some(last) if last.1 == a => last.1 = b,
                    _ => freed.push((a, b)),
                }
            }
        }
        self.merge_at(s);
        self.merge_at(e);
        freed
    }
}

struct Pinner {
    map: Mutex<PinMap>,
    /// Bytes; `u64::MAX`: no limit.
    limit: AtomicU64,
    enabled: bool,
}

fn pinner() -> &'static Pinner {
    static P: OnceLock<Pinner> = OnceLock::new();
    P.get_or_init(|| {
        let enabled = std::env::var("SOFTRDMA_PIN").map_or(true, |v| v != "0");
        if enabled {
            raise_memlock_limit();
        }
        let limit = std::env::var("SOFTRDMA_PIN_LIMIT").ok().and_then(|v| {
            let r = parse_bytes(&v);
            if r.is_none() {
                tracing::warn!(value = %v, "SOFTRDMA_PIN_LIMIT is not a size (like 512M); ignored");
            }
            r
        });
        Pinner {
            map: Mutex::new(PinMap::default()),
            limit: AtomicU64::new(limit.unwrap_or(u64::MAX)),
            enabled,
        }
    })
}

/// `123`, `64K`, `512M`, `2G` -> bytes.
fn parse_bytes(v: &str) -> Option<u64> {
    let v = v.trim();
    let (num, mul) = match v.chars().last()? {
        'K' | 'k' => (&v[..v.len() - 1], 1u64 << 10),
        'M' | 'm' => (&v[..v.len() - 1], 1 << 20),
        'G' | 'g' => (&v[..v.len() - 1], 1 << 30),
        _ => (v, 1),
    };
    num.parse::<u64>().ok()?.checked_mul(mul)
}

/// Raises the soft `RLIMIT_MEMLOCK` to the hard one, as RDMA applications
/// are told to (`ulimit -l`); a privileged process is not limited anyway.
fn raise_memlock_limit() {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit read and write the local `rlimit` only.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_MEMLOCK, &mut r) == 0 && r.rlim_cur < r.rlim_max {
            r.rlim_cur = r.rlim_max;
            libc::setrlimit(libc::RLIMIT_MEMLOCK, &r);
        }
    }
}

/// Sets the most bytes this process may have pinned by registrations
/// (`None`: no limit but the kernel's). Registrations past it fail with
/// [`Error::Exhausted`], like `ibv_reg_mr` past `RLIMIT_MEMLOCK`.
pub fn set_pin_limit(limit: Option<u64>) {
    pinner()
        .limit
        .store(limit.unwrap_or(u64::MAX), Ordering::Relaxed);
}

/// Bytes pinned by this process's registrations now.
pub fn pinned_bytes() -> u64 {
    pinner().map.lock().bytes()
}

/// Whether registrations pin their pages in this process.
pub fn pinning_enabled() -> bool {
    pinner().enabled
}

/// The pin of one registration's memory; unpins on drop.
#[derive(Debug)]
pub(crate) struct PinGuard {
    start: u64,
    end: u64,
}

fn page_range(ptr: u64, len: usize) -> (u64, u64) {
    let page = crate::sys::page_size() as u64;
    let s = ptr & !(page - 1);
    let e = (ptr + len as u64).div_ceil(page) * page;
    (s, e)
}

/// Pins the pages of `[ptr, ptr + len)`. `None` when pinning is off or the
/// range is empty.
pub(crate) fn pin(ptr: *const u8, len: usize) -> Result<Option<PinGuard>> {
    let p = pinner();
    if !p.enabled || len == 0 {
        return Ok(None);
    }
    let (s, e) = page_range(ptr as u64, len);
    let mut map = p.map.lock();
    let gaps = map.gaps(s, e);
    let new: u64 = gaps.iter().map(|(a, b)| b - a).sum();
    if map.bytes().saturating_add(new) > p.limit.load(Ordering::Relaxed) {
        return Err(Error::Exhausted("pinned memory (the registration limit)"));
    }
    for (i, &(a, b)) in gaps.iter().enumerate() {
        // SAFETY: mlock only changes the residency of the caller's mapped
        // pages (the registration's memory); it reads or writes nothing.
        let r = unsafe { libc::mlock(a as *const libc::c_void, (b - a) as usize) };
        if r != 0 {
            let err = std::io::Error::last_os_error();
            for &(a, b) in &gaps[..i] {
                // SAFETY: as above; undoes the locks taken just now.
                unsafe { libc::munlock(a as *const libc::c_void, (b - a) as usize) };
            }
            return Err(Error::inval(format!(
                "pinning {} bytes failed ({err}): raise RLIMIT_MEMLOCK (ulimit -l) \
                 or set SOFTRDMA_PIN=0",
                b - a
            )));
        }
    }
    map.pin(s, e);
    Ok(Some(PinGuard { start: s, end: e }))
}

impl Drop for PinGuard {
    fn drop(&mut self) {
        let mut map = pinner().map.lock();
        for (a, b) in map.unpin(self.start, self.end) {
            // SAFETY: munlock only changes residency; the pages are still
            // mapped (the guard is dropped before the region's memory).
            unsafe { libc::munlock(a as *const libc::c_void, (b - a) as usize) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Against a per-page model: counts, bytes, and exactly the ranges
        /// crossing 0 <-> 1 are reported.
        #[test]
        fn pin_map_matches_a_page_model(ops in proptest::collection::vec((0u64..40, 1u64..12, any::<bool>()), 1..120)) {
            let mut m = PinMap::default();
            let mut model = [0u32; 64];
            let mut live: Vec<(u64, u64)> = Vec::new();
            for (s, n, unpin) in ops {
                if unpin && !live.is_empty() {
                    let (s, e) = live.swap_remove((s as usize) % live.len());
                    let freed = m.unpin(s, e);
                    let mut expect = Vec::new();
                    for p in s..e {
                        model[p as usize] -= 1;
                        if model[p as usize] == 0 { expect.push(p); }
                    }
                    let got: Vec<u64> = freed.iter().flat_map(|&(a, b)| a..b).collect();
                    prop_assert_eq!(got, expect);
                } else {
                    let e = s + n;
                    let locked = m.pin(s, e);
                    let mut expect = Vec::new();
                    for p in s..e {
                        if model[p as usize] == 0 { expect.push(p); }
                        model[p as usize] += 1;
                    }
                    let got: Vec<u64> = locked.iter().flat_map(|&(a, b)| a..b).collect();
                    prop_assert_eq!(got, expect);
                    live.push((s, e));
                }
                for p in 0..64u64 {
                    prop_assert_eq!(m.count_at(p), model[p as usize], "page {}", p);
                }
                prop_assert_eq!(m.bytes(), model.iter().filter(|&&c| c > 0).count() as u64);
                // Merging keeps at most one range per boundary of a live pin.
                prop_assert!(m.ranges() <= 2 * live.len() + 1);
            }
        }
    }

    #[test]
    fn limit_sizes_parse() {
        assert_eq!(parse_bytes("4096"), Some(4096));
        assert_eq!(parse_bytes("64K"), Some(64 << 10));
        assert_eq!(parse_bytes("512m"), Some(512 << 20));
        assert_eq!(parse_bytes("2G"), Some(2 << 30));
        assert_eq!(parse_bytes("lots"), None);
        assert_eq!(parse_bytes(""), None);
        assert_eq!(parse_bytes("99999999999999G"), None);
    }

    #[test]
    fn registration_pins_and_deregistration_unpins() {
        if !pinning_enabled() {
            return;
        }
        let page = crate::sys::page_size();
        let buf = vec![0u8; 8 * page];
        let p = buf.as_ptr();
        let before = pinned_bytes();
        let a = pin(p, 8 * page).unwrap().unwrap();
        let b = pin(p, page).unwrap().unwrap(); // overlapping
        let grown = pinned_bytes() - before;
        assert!(grown >= 8 * page as u64 && grown <= 9 * page as u64);
        drop(a);
        assert!(
            pinned_bytes() - before >= page as u64,
            "b still pins its page"
        );
        drop(b);
        assert_eq!(pinned_bytes(), before);
    }
}
