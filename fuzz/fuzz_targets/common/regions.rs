//! The two regions the engine fuzz targets give the engine (shared by
//! `engine_stream.rs` and `engine_sim.rs`): a target with a fixed STag at a
//! fixed address and all rights (so inputs can reach placement, Read
//! Responses and atomics), and a receive region, both between guard bytes
//! that the engine must never write.

use softrdma_verbs::{Access, MemoryRegion, ProtectionDomain, RegOptions};

pub const GUARD: usize = 256;
pub const LEN: usize = 4096;
pub const GUARD_BYTE: u8 = 0xA5;
/// The target region's STag (index 0x1234, key 0x56) and address.
pub const STAG: u32 = 0x1234 << 8 | 0x56;
pub const IOVA: u64 = 0x10000;

/// `LEN` bytes between two guards of `GUARD` bytes, leaked: regions over
/// it live as long as the fuzzing process.
pub struct Guarded {
    base: usize,
}

impl Guarded {
    fn new() -> Guarded {
        let v = vec![GUARD_BYTE; GUARD + LEN + GUARD].into_boxed_slice();
        let base = Box::leak(v).as_mut_ptr() as usize;
        Guarded { base }
    }

    fn middle(&self) -> *mut u8 {
        (self.base + GUARD) as *mut u8
    }

    /// Whether no guard byte changed.
    pub fn guards_intact(&self) -> bool {
        // SAFETY: the allocation is GUARD + LEN + GUARD bytes and is never
        // freed; the guard bytes are outside every registration, so the
        // engine never writes them (that is what is checked).
        let all =
            unsafe { std::slice::from_raw_parts(self.base as *const u8, GUARD + LEN + GUARD) };
        all[..GUARD]
            .iter()
            .chain(&all[GUARD + LEN..])
            .all(|&b| b == GUARD_BYTE)
    }
}

/// The regions in `pd`: (target memory, receive memory, target region at
/// `STAG`/`IOVA`, receive region).
pub fn register(pd: &ProtectionDomain) -> (Guarded, Guarded, MemoryRegion, MemoryRegion) {
    let target = Guarded::new();
    let recv = Guarded::new();
    // SAFETY: the memory is leaked (never freed), and only the engine
    // writes the registered middle parts.
    let (tmr, rmr) = unsafe {
        (
            pd.register_raw(
                target.middle(),
                LEN,
                Access::ALL,
                RegOptions {
                    stag: Some(STAG),
                    iova: Some(IOVA),
                    ..Default::default()
                },
            )
            .unwrap(),
            pd.register_raw(
                recv.middle(),
                LEN,
                Access::LOCAL_WRITE,
                RegOptions::default(),
            )
            .unwrap(),
        )
    };
    (target, recv, tmr, rmr)
}
