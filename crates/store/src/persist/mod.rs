//! Persistence through the storage endpoint (issue 33): the node's log of
//! committed effects on a partition of a storage endpoint, local or remote.
//!
//! * [`record`]: the record format, a pure codec (a CRC per record, a
//!   sequence number and a chain of CRCs, so a torn tail or a record left
//!   from an earlier lap or life is found and cut);
//! * [`log`]: the ring of records with group commit ([`log::LogWriter`])
//!   and the scan that recovers it ([`log::scan`]);
//! * [`qp_device`]: a partition of a storage endpoint as the log's device,
//!   through RDMA Writes, Reads and a Flush on a local or remote QP;
//! * [`mem`]: a device in memory that loses its unflushed writes (sector by
//!   sector, at random) on a simulated power loss: the tests' recorder.
//!
//! docs/store.md ("Persistence") says what each policy promises and how
//! the node uses the log.

pub mod log;
pub mod mem;
pub mod qp_device;
pub mod record;
#[cfg(test)]
mod tests;

pub use log::{LogError, LogPos, LogStart, LogWriter, Scanned};

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
}
