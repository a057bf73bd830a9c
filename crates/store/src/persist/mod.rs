//! Persistence through the storage endpoint (issue 33): the node's log of
//! committed effects on a partition of a storage endpoint, local or remote.
//!
//! * [`record`]: the record format, a pure codec (a CRC per record, a
//!   sequence number and a chain of CRCs, so a torn tail or a record left
//!   from an earlier lap or life is found and cut);
//! * [`checkpoint`]: the superblock of a node's partition (two copies, the
//!   higher valid generation wins) naming the arena, its latest snapshot
//!   and where the log continues it, and the partition's layout;
//! * [`entry`]: what a record carries, one replicated write as the primary
//!   forwards it (epoch, sequence number, effects, reply);
//! * [`driver`]: all of it as one object over a node's partition
//!   ([`driver::Persister`]: lives, snapshots, commits, recovery);
//! * [`log`]: the ring of records with group commit ([`log::LogWriter`])
//!   and the scan that recovers it ([`log::scan`]);
//! * [`qp_device`]: a partition of a storage endpoint as the log's device,
//!   through RDMA Writes, Reads and a Flush on a local or remote QP;
//! * [`mem`]: a device in memory that loses its unflushed writes (sector by
//!   sector, at random) on a simulated power loss: the tests' recorder.
//!
//! docs/store.md ("Persistence") says what each policy promises and how
//! the node uses the log.

pub mod checkpoint;
pub mod driver;
pub mod entry;
pub mod log;
pub mod mem;
pub mod qp_device;
pub mod record;
#[cfg(test)]
mod recovery_tests;
#[cfg(test)]
mod tests;

pub use log::{LogError, LogPos, LogStart, LogWriter, Scanned};

/// When a group's writes are durable (`persist = off | everysec | always`;
/// docs/store.md, "The policies").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Policy {
    /// Nothing is written: the group lives in its nodes' memory.
    #[default]
    Off,
    /// Each node's log commits at least once a second: a write is
    /// acknowledged once both nodes hold it in memory, and at most about
    /// the last second of them is lost when every node dies together.
    Everysec,
    /// A write is acknowledged (and shown to readers) only once both
    /// nodes' logs hold it durably.
    Always,
}

impl Policy {
    /// Whether the node logs its writes.
    pub fn logs(self) -> bool {
        self != Policy::Off
    }

    /// Its number in a status report (`StatusInfo::persist`).
    pub fn code(self) -> u8 {
        self as u8
    }

    /// The policy a status report's number names (`off` if unknown).
    pub fn from_code(c: u8) -> Policy {
        match c {
            1 => Policy::Everysec,
            2 => Policy::Always,
            _ => Policy::Off,
        }
    }
}

impl std::fmt::Display for Policy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Policy::Off => "off",
            Policy::Everysec => "everysec",
            Policy::Always => "always",
        })
    }
}

impl std::str::FromStr for Policy {
    type Err = String;
    fn from_str(s: &str) -> Result<Policy, String> {
        match s {
            "off" => Ok(Policy::Off),
            "everysec" => Ok(Policy::Everysec),
            "always" => Ok(Policy::Always),
            _ => Err(format!(
                "persist must be off, everysec or always, not {s:?}"
            )),
        }
    }
}

/// Where a log lives: bytes at offsets, and a flush that makes the writes
/// before it durable. A write's bytes are visible to reads at once; only a
/// flush promises they survive a power loss.
pub trait LogDevice {
    /// Bytes the device holds.
    fn capacity(&self) -> u64;
    /// Writes `bytes` at `offset` (not yet durable).
    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> std::io::Result<()>;
    /// Reads `out.len()` bytes at `offset`.
    fn read_at(&mut self, offset: u64, out: &mut [u8]) -> std::io::Result<()>;
    /// Makes every earlier write durable.
    fn flush(&mut self) -> std::io::Result<()>;
    /// Reads `len` bytes at `offset` in order, handing them to `sink` in
    /// pieces of at most `piece` bytes (the piece's offset from `offset`,
    /// its bytes). A device may keep several reads in flight meanwhile;
    /// this one reads a piece at a time.
    fn read_stream(
        &mut self,
        offset: u64,
        len: u64,
        piece: usize,
        sink: &mut dyn FnMut(u64, &[u8]) -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let mut buf = vec![0u8; piece.min(len as usize)];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(piece as u64) as usize;
            self.read_at(offset + done, &mut buf[..n])?;
            sink(done, &buf[..n])?;
            done += n as u64;
        }
        Ok(())
    }
}

/// A part of a device as a device of its own: the log ring, or a snapshot
/// slot, inside a node's partition.
pub struct Window<D> {
    dev: D,
    base: u64,
    len: u64,
}

impl<D: LogDevice> Window<D> {
    /// Bytes `[base, base + len)` of `dev`.
    pub fn new(dev: D, base: u64, len: u64) -> std::io::Result<Window<D>> {
        if base.checked_add(len).is_none_or(|e| e > dev.capacity()) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                format!(
                    "window [{base}, +{len}) outside a device of {}",
                    dev.capacity()
                ),
            ));
        }
        Ok(Window { dev, base, len })
    }

    /// The whole device.
    pub fn inner(&mut self) -> &mut D {
        &mut self.dev
    }

    /// The whole device, giving the window up.
    pub fn into_inner(self) -> D {
        self.dev
    }

    fn check(&self, offset: u64, len: usize) -> std::io::Result<u64> {
        if offset.checked_add(len as u64).is_none_or(|e| e > self.len) {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "outside the window",
            ));
        }
        Ok(self.base + offset)
    }
}

impl<D: LogDevice> LogDevice for Window<D> {
    fn capacity(&self) -> u64 {
        self.len
    }

    fn write_at(&mut self, offset: u64, bytes: &[u8]) -> std::io::Result<()> {
        let at = self.check(offset, bytes.len())?;
        self.dev.write_at(at, bytes)
    }

    fn read_at(&mut self, offset: u64, out: &mut [u8]) -> std::io::Result<()> {
        let at = self.check(offset, out.len())?;
        self.dev.read_at(at, out)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.dev.flush()
    }
}
