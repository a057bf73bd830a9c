//! A device in memory that loses power: the recording backend of the
//! persistence tests.
//!
//! It keeps two images: what a reader sees now (every write applied) and
//! what is durable (only what a flush covered). [`MemDevice::power_loss`]
//! throws the difference away as a failing disk would: of the writes made
//! since the last flush, each 512-byte sector keeps its new bytes or its
//! old ones at random, independently (a write may be torn anywhere between
//! sectors, and later writes may survive where earlier ones did not), and
//! the device comes back holding that.

use super::LogDevice;
use std::io;

/// The unit that is written whole or not at all.
pub const SECTOR: usize = 512;

/// A device in memory whose unflushed writes a power loss may drop.
pub struct MemDevice {
    now: Vec<u8>,
    durable: Vec<u8>,
    /// Writes since the last flush: (offset, length).
    pending: Vec<(u64, usize)>,
    rng: u64,
    /// Flushes made (for tests that count them).
    pub flushes: u64,
    /// Writes made.
    pub writes: u64,
    /// Fail every call after this many more writes (None: never).
    pub fail_after_writes: Option<u64>,
    /// Fail every flush (the writes before it stay unflushed: a crash in
    /// the middle of a commit).
    pub fail_flushes: bool,
}

impl MemDevice {
    /// A zeroed device of `len` bytes; `seed` drives what a power loss
    /// keeps.
    pub fn new(len: usize, seed: u64) -> MemDevice {
        MemDevice {
            now: vec![0; len],
            durable: vec![0; len],
            pending: Vec::new(),
            rng: seed | 1,
            flushes: 0,
            writes: 0,
            fail_after_writes: None,
            fail_flushes: false,
        }
    }

    fn next(&mut self) -> u64 {
        // xorshift64*
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Power fails: every sector written since the last flush keeps its
    /// new bytes or returns to its durable ones, at random. Returns how
    /// many sectors were lost.
    pub fn power_loss(&mut self) -> usize {
        let mut sectors: Vec<usize> = Vec::new();
        for &(off, len) in &self.pending {
            let first = off as usize / SECTOR;
            let last = (off as usize + len).div_ceil(SECTOR);
            sectors.extend(first..last);
        }
        sectors.sort_unstable();
        sectors.dedup();
        let mut lost = 0;
        for s in sectors {
            let r = s * SECTOR..((s + 1) * SECTOR).min(self.now.len());
            if self.next().is_multiple_of(2) {
                self.durable[r.clone()].copy_from_slice(&self.now[r]);
            } else {
                lost += 1;
            }
        }
        self.pending.clear();
        self.now.copy_from_slice(&self.durable);
        self.fail_after_writes = None;
        lost
    }

    /// The bytes a reader sees now.
    pub fn bytes(&self) -> &[u8] {
        &self.now
    }

    /// Changes bytes as a reader sees them and makes that durable (a test
    /// damaging the device on purpose).
    pub fn damage(&mut self, offset: usize, bytes: &[u8]) {
        self.now[offset..offset + bytes.len()].copy_from_slice(bytes);
        self.durable[offset..offset + bytes.len()].copy_from_slice(bytes);
    }

    fn check(&mut self, offset: u64, len: usize) -> io::Result<()> {
        if offset
            .checked_add(len as u64)
            .is_none_or(|e| e > self.now.len() as u64)
        {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "outside the device",
            ));
        }
        Ok(())
    }
}

impl Default for MemDevice {
    /// An empty device (what `std::mem::take` leaves behind).
    fn default() -> MemDevice {
        MemDevice::new(0, 1)
    }
}

impl LogDevice for MemDevice {
    fn capacity(&self) -> u64 {
        self.now.len() as u64
    }

    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> io::Result<()> {
        self.check(offset, bytes.len())?;
        if let Some(n) = self.fail_after_writes.as_mut() {
            if *n == 0 {
                return Err(io::Error::other("injected device failure"));
            }
            *n -= 1;
        }
        self.writes += 1;
        let o = offset as usize;
        self.now[o..o + bytes.len()].copy_from_slice(bytes);
        self.pending.push((offset, bytes.len()));
        Ok(())
    }

    fn read_at(&mut self, offset: u64, out: &mut [u8]) -> io::Result<()> {
        self.check(offset, out.len())?;
        let o = offset as usize;
        out.copy_from_slice(&self.now[o..o + out.len()]);
        Ok(())
    }

    fn flush(&mut self) -> io::Result<()> {
        if self.fail_after_writes == Some(0) || self.fail_flushes {
            return Err(io::Error::other("injected device failure"));
        }
        self.flushes += 1;
        for (off, len) in std::mem::take(&mut self.pending) {
            let r = off as usize..off as usize + len;
            self.durable[r.clone()].copy_from_slice(&self.now[r]);
        }
        Ok(())
    }
}
