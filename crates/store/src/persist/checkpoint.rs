//! The persistence superblock: where a node's durable state starts.
//!
//! A node's partition is laid out as
//!
//! ```text
//! [checkpoint copy 0][checkpoint copy 1][snapshot slot 0][snapshot slot 1][log ring .......]
//!  4 KiB              4 KiB              arena size       arena size       the rest
//! ```
//!
//! A checkpoint names the snapshot slot that holds the arena as of some
//! write (or none: an empty arena), the log position right after that
//! write, and the arena's identity (size, base address, STag), so that a
//! recovered node maps its arena where it was and remote pointers stay
//! valid. Checkpoint generation g lives in copy g mod 2 and is written
//! only after the snapshot it names is durable; a crash while writing it
//! leaves copy g - 1 whole, and the reader takes the valid copy with the
//! higher generation (the storage superblock's rule). A new snapshot goes
//! to the slot the current checkpoint does not name, so a torn snapshot is
//! never named by any checkpoint.

use super::log::{LogPos, LogStart, BLOCK};
use super::LogDevice;
use std::io;

const MAGIC: [u8; 4] = *b"SRPC";
const VERSION: u8 = 1;
/// Bytes of a checkpoint's encoding.
pub const ENCODED_LEN: usize = 96;

/// A snapshot of the arena in one of the two slots.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    /// Which slot (0 or 1).
    pub slot: u8,
    /// The last write the image holds (its sequence number).
    pub seq: u64,
    /// The epoch that write was made in.
    pub epoch: u64,
    /// Bytes of the image.
    pub len: u64,
    /// CRC32C of the image.
    pub crc: u32,
}

/// The arena a node's state belongs to: a recovered node maps it at the
/// same address under the same STag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ArenaId {
    /// Bytes.
    pub size: u64,
    /// Virtual address of its first byte.
    pub base: u64,
    /// Its STag.
    pub stag: u32,
}

/// One generation of the superblock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Checkpoint {
    /// Generation (copy `generation % 2`).
    pub generation: u64,
    /// The log: its id and the first record to replay.
    pub log: LogStart,
    /// The snapshot the log continues, if any.
    pub snapshot: Option<Snapshot>,
    /// The arena.
    pub arena: ArenaId,
}

impl Checkpoint {
    /// Encodes it ([`ENCODED_LEN`] bytes).
    pub fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(ENCODED_LEN);
        b.extend_from_slice(&MAGIC);
        b.extend_from_slice(&[VERSION, 0, 0, 0]);
        b.extend_from_slice(&self.generation.to_le_bytes());
        b.extend_from_slice(&self.log.log_id.to_le_bytes());
        b.extend_from_slice(&self.log.pos.prev_crc.to_le_bytes());
        b.extend_from_slice(&self.log.pos.offset.to_le_bytes());
        b.extend_from_slice(&self.log.pos.lsn.to_le_bytes());
        let s = self.snapshot.unwrap_or(Snapshot {
            slot: 0xff,
            seq: 0,
            epoch: 0,
            len: 0,
            crc: 0,
        });
        b.extend_from_slice(&[s.slot, 0, 0, 0]);
        b.extend_from_slice(&s.crc.to_le_bytes());
        b.extend_from_slice(&s.seq.to_le_bytes());
        b.extend_from_slice(&s.epoch.to_le_bytes());
        b.extend_from_slice(&s.len.to_le_bytes());
        b.extend_from_slice(&self.arena.size.to_le_bytes());
        b.extend_from_slice(&self.arena.base.to_le_bytes());
        b.extend_from_slice(&self.arena.stag.to_le_bytes());
        let crc = crc32c::crc32c(&b);
        b.extend_from_slice(&crc.to_le_bytes());
        debug_assert_eq!(b.len(), ENCODED_LEN);
        b
    }

    /// Decodes one copy; `None` unless every field checks out.
    pub fn decode(b: &[u8]) -> Option<Checkpoint> {
        if b.len() < ENCODED_LEN || b[..4] != MAGIC || b[4..8] != [VERSION, 0, 0, 0] {
            return None;
        }
        let crc = u32::from_le_bytes(b[92..96].try_into().ok()?);
        if crc32c::crc32c(&b[..92]) != crc {
            return None;
        }
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_le_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let snapshot = match b[40] {
            0xff => None,
            slot @ (0 | 1) => Some(Snapshot {
                slot,
                crc: u32_at(44),
                seq: u64_at(48),
                epoch: u64_at(56),
                len: u64_at(64),
            }),
            _ => return None,
        };
        if b[41..44] != [0, 0, 0] {
            return None;
        }
        Some(Checkpoint {
            generation: u64_at(8),
            log: LogStart {
                log_id: u32_at(16),
                pos: LogPos {
                    prev_crc: u32_at(20),
                    offset: u64_at(24),
                    lsn: u64_at(32),
                },
            },
            snapshot,
            arena: ArenaId {
                size: u64_at(72),
                base: u64_at(80),
                stag: u32_at(88),
            },
        })
    }
}

/// Where each part lies in a node's partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// Offset of snapshot slot 0 (slot 1 follows it).
    pub snapshots: u64,
    /// Bytes of each snapshot slot (the arena's size, in whole blocks).
    pub slot_len: u64,
    /// Offset of the log ring.
    pub log: u64,
    /// Bytes of the log ring.
    pub log_len: u64,
}

/// The smallest log ring a layout leaves.
pub const MIN_LOG: u64 = 1 << 20;

impl Layout {
    /// The layout of a partition of `capacity` bytes for an arena of
    /// `arena_size`; an error names what does not fit.
    pub fn new(capacity: u64, arena_size: u64) -> Result<Layout, String> {
        let slot_len = arena_size.div_ceil(BLOCK) * BLOCK;
        let snapshots = 2 * BLOCK;
        let log = snapshots + 2 * slot_len;
        let log_len = capacity.saturating_sub(log) / BLOCK * BLOCK;
        if log_len < MIN_LOG {
            return Err(format!(
                "a partition of {capacity} bytes is too small for an arena of {arena_size}: \
                 two checkpoint blocks, two snapshots of {slot_len} bytes and a log of at \
                 least {MIN_LOG} bytes need {}",
                log + MIN_LOG
            ));
        }
        Ok(Layout {
            snapshots,
            slot_len,
            log,
            log_len,
        })
    }

    /// Offset of snapshot slot `slot`.
    pub fn slot(&self, slot: u8) -> u64 {
        self.snapshots + u64::from(slot) * self.slot_len
    }
}

/// Reads both copies; the valid one with the higher generation, with
/// how many copies were damaged (not counting never-written ones:
/// all-zero blocks). `None` when neither copy holds a checkpoint.
pub fn read<D: LogDevice>(dev: &mut D) -> io::Result<(Option<Checkpoint>, usize)> {
    let mut best: Option<Checkpoint> = None;
    let mut damaged = 0;
    for copy in 0..2u64 {
        let mut b = vec![0u8; ENCODED_LEN];
        dev.read_at(copy * BLOCK, &mut b)?;
        match Checkpoint::decode(&b) {
            Some(c) if c.generation % 2 == copy => {
                if best.is_none_or(|x| c.generation > x.generation) {
                    best = Some(c);
                }
            }
            _ if b.iter().all(|&x| x == 0) => {}
            _ => damaged += 1,
        }
    }
    Ok((best, damaged))
}

/// Writes `c` over the older copy and flushes: durable when this returns.
pub fn write<D: LogDevice>(dev: &mut D, c: &Checkpoint) -> io::Result<()> {
    let mut b = c.encode();
    b.resize(BLOCK as usize, 0);
    dev.write_at((c.generation % 2) * BLOCK, &b)?;
    dev.flush()
}
