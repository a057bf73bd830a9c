//! The log on a [`LogDevice`]: a ring of records ([`record`]) with group
//! commit, and the scan that recovers it.
//!
//! The writer buffers appended records and makes them durable together
//! ([`LogWriter::commit`]: one write per contiguous run, then one flush).
//! Every write covers whole 4 KiB blocks, from the block holding the first
//! byte not yet durable to the block holding the last record, padded with
//! zeros; the partial last block is written again, with the same bytes
//! in front, by the next commit. So the device sees aligned writes (the
//! O_DIRECT path of a storage endpoint), and a record that was durable is
//! only ever overwritten by its own bytes, which a torn write (old or new
//! bytes per sector) cannot damage.
//!
//! The ring: a record never straddles the end; a wrap record (or, with
//! less than a header's room left, nothing) sends the reader to offset 0.
//! The space from the oldest record still needed (the tail, moved on by
//! [`LogWriter::release`] once a snapshot holds what it covered) to the
//! head is never written, and a block's worth of room is kept in front of
//! the tail so the zero padding of the last block cannot reach it.
//! Appending into a full ring is refused ([`LogError::Full`]).
//!
//! [`record`]: super::record

use super::record::{self, Decoded, EndReason, Expect, Kind};
use super::LogDevice;
use std::io;

/// The unit of the device's writes and of the ring's size.
pub const BLOCK: u64 = 4096;
/// Bytes read at once by the scan.
const CHUNK: usize = 1 << 20;

/// Where the next record goes and what it carries: the log's position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogPos {
    /// Byte offset in the ring.
    pub offset: u64,
    /// Its sequence number.
    pub lsn: u64,
    /// The CRC of the record before it.
    pub prev_crc: u32,
}

/// Which log, and where its oldest needed record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LogStart {
    /// The log's id (a reset log gets a new one).
    pub log_id: u32,
    /// The first record to read.
    pub pos: LogPos,
}

impl LogStart {
    /// A new, empty log with this id.
    pub fn fresh(log_id: u32) -> LogStart {
        LogStart {
            log_id,
            pos: LogPos {
                offset: 0,
                lsn: 1,
                prev_crc: 0,
            },
        }
    }
}

/// Errors of the log.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// The device failed. A writer that saw this refuses everything after
    /// it ([`LogError::Failed`]): what reached the device is unknown until
    /// the log is scanned again.
    #[error("log device: {0}")]
    Io(#[from] io::Error),
    /// An earlier device error stopped this writer.
    #[error("the log stopped after a device error; reopen it")]
    Failed,
    /// The ring has no room: release records (a snapshot) first.
    #[error("log full: {need} bytes needed, {free} free")]
    Full {
        /// Bytes the record needs (with a wrap's waste).
        need: u64,
        /// Bytes free.
        free: u64,
    },
    /// A record larger than the ring (or the format) allows.
    #[error("log record of {len} bytes; at most {max}")]
    TooLarge {
        /// Payload length.
        len: usize,
        /// The most this log takes.
        max: usize,
    },
    /// The device is smaller than two blocks, or a start lies outside it.
    #[error("bad log geometry: {0}")]
    Geometry(String),
}

/// What a scan found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scanned {
    /// Where the next record goes.
    pub end: LogPos,
    /// Entries passed to the caller.
    pub entries: u64,
    /// Why the log ends there.
    pub reason: EndReason,
    /// Ring bytes from the start to the end (wrap waste included).
    pub used: u64,
}

fn ring_cap<D: LogDevice>(dev: &D) -> Result<u64, LogError> {
    let cap = dev.capacity() / BLOCK * BLOCK;
    if cap < 2 * BLOCK {
        return Err(LogError::Geometry(format!(
            "{} bytes; a log needs at least {}",
            dev.capacity(),
            2 * BLOCK
        )));
    }
    Ok(cap)
}

/// Reads the log from `start`, passing each entry's sequence number and
/// payload to `each`, until the first offset that holds no valid record
/// expected there. Never fails on the log's contents, only on the device.
pub fn scan<D: LogDevice>(
    dev: &mut D,
    start: LogStart,
    mut each: impl FnMut(u64, &[u8]),
) -> Result<Scanned, LogError> {
    let cap = ring_cap(dev)?;
    let mut at = start.pos;
    if at.lsn == 0 {
        return Err(LogError::Geometry("sequence numbers start at 1".into()));
    }
    if at.offset >= cap || !at.offset.is_multiple_of(record::ALIGN as u64) {
        return Err(LogError::Geometry(format!(
            "start offset {} in a ring of {cap}",
            at.offset
        )));
    }
    let mut buf: Vec<u8> = Vec::new();
    let mut buf_off = 0u64;
    let mut entries = 0u64;
    let mut used = 0u64;
    let mut want = record::HEADER_LEN;
    let reason = loop {
        if cap - at.offset < record::HEADER_LEN as u64 {
            used += cap - at.offset;
            at.offset = 0;
        }
        if used >= cap {
            // Came all the way round: cannot happen with a writer's log.
            break EndReason::Stale;
        }
        let end = at.offset + want as u64;
        if end > cap {
            break EndReason::BadHeader;
        }
        if at.offset < buf_off || end > buf_off + buf.len() as u64 {
            let n = (want.max(CHUNK) as u64).min(cap - at.offset) as usize;
            buf.resize(n, 0);
            dev.read_at(at.offset, &mut buf)?;
            buf_off = at.offset;
        }
        let here = &buf[(at.offset - buf_off) as usize..];
        match record::decode(
            here,
            Expect {
                lsn: at.lsn,
                prev_crc: at.prev_crc,
                log_id: start.log_id,
            },
        ) {
            Decoded::NeedMore(n) => {
                want = n;
                continue;
            }
            Decoded::End(r) => break r,
            Decoded::Record(_) if at.lsn == u64::MAX => break EndReason::Stale,
            Decoded::Record(f) => {
                if f.kind == Kind::Entry {
                    each(
                        at.lsn,
                        &here[record::HEADER_LEN..record::HEADER_LEN + f.len],
                    );
                    entries += 1;
                }
                at.lsn += 1;
                at.prev_crc = f.crc;
                want = record::HEADER_LEN;
                if f.kind == Kind::Wrap {
                    used += cap - at.offset;
                    at.offset = 0;
                } else {
                    used += f.size as u64;
                    at.offset += f.size as u64;
                }
            }
        }
    };
    Ok(Scanned {
        end: at,
        entries,
        reason,
        used,
    })
}

/// Writes zeros over the whole device and flushes: what formatting a
/// node's partition does once. A file system makes a write into a hole (or
/// into preallocated, unwritten space) durable only by committing its
/// journal as well, which costs every `fdatasync` that covers such a
/// write; PostgreSQL and InnoDB write their logs' space out ahead for the
/// same reason.
pub fn zero_fill<D: LogDevice>(dev: &mut D) -> io::Result<()> {
    let zeros = vec![0u8; CHUNK * 4];
    let cap = dev.capacity();
    let mut at = 0;
    while at < cap {
        let n = (cap - at).min(zeros.len() as u64) as usize;
        dev.write_at(at, &zeros[..n])?;
        at += n as u64;
    }
    dev.flush()
}

/// Bytes not yet durable that start at `base` (a block boundary).
struct Seg {
    base: u64,
    bytes: Vec<u8>,
}

/// Appends records to a log and makes them durable in groups.
pub struct LogWriter<D: LogDevice> {
    dev: D,
    log_id: u32,
    cap: u64,
    head: LogPos,
    tail: u64,
    used: u64,
    /// From the block holding the first byte not yet durable to the head;
    /// more than one after a wrap.
    segs: Vec<Seg>,
    /// The last durable record's sequence number (0: none).
    durable: u64,
    failed: bool,
}

impl<D: LogDevice> LogWriter<D> {
    /// Opens the log that starts at `start` on `dev`: scans it (each
    /// entry goes to `each`, oldest first) and appends after its last
    /// valid record. A fresh log is `LogStart::fresh(id)` on any device
    /// (what was there before ends the scan at once).
    pub fn open(
        mut dev: D,
        start: LogStart,
        each: impl FnMut(u64, &[u8]),
    ) -> Result<(LogWriter<D>, Scanned), LogError> {
        let cap = ring_cap(&dev)?;
        let s = scan(&mut dev, start, each)?;
        let base = s.end.offset / BLOCK * BLOCK;
        let mut bytes = vec![0; (s.end.offset - base) as usize];
        dev.read_at(base, &mut bytes)?;
        let w = LogWriter {
            dev,
            log_id: start.log_id,
            cap,
            head: s.end,
            tail: start.pos.offset,
            used: s.used,
            segs: vec![Seg { base, bytes }],
            durable: s.end.lsn.saturating_sub(1),
            failed: false,
        };
        Ok((w, s))
    }

    /// The position of the next record (what a snapshot taken now covers
    /// up to: pass it to [`LogWriter::release`] once the snapshot is
    /// durable).
    pub fn position(&self) -> LogPos {
        self.head
    }

    /// The sequence number of the last durable record (0: none yet).
    pub fn durable(&self) -> u64 {
        self.durable
    }

    /// Bytes of the ring that may still take records.
    pub fn free(&self) -> u64 {
        // A log written by another writer (or crafted) may fill the ring
        // past this writer's margin: then nothing is free.
        self.cap.saturating_sub(self.used + BLOCK)
    }

    /// The device, for its owner's other uses.
    pub fn device(&mut self) -> &mut D {
        &mut self.dev
    }

    /// The device, giving the writer up (what was appended and not
    /// committed is dropped).
    pub fn into_device(self) -> D {
        self.dev
    }

    /// The largest payload one record may carry in this ring.
    pub fn max_payload(&self) -> usize {
        let room = (self.cap - 2 * BLOCK) as usize;
        (room - record::HEADER_LEN).min(record::MAX_PAYLOAD)
    }

    /// Buffers a record holding `payload`; returns its sequence number.
    /// It is durable once a later [`LogWriter::commit`] returns.
    pub fn append(&mut self, payload: &[u8]) -> Result<u64, LogError> {
        if self.failed {
            return Err(LogError::Failed);
        }
        if self.head.lsn >= u64::MAX - 1 {
            return Err(LogError::Geometry("sequence numbers exhausted".into()));
        }
        let max = self.max_payload();
        if payload.len() > max {
            return Err(LogError::TooLarge {
                len: payload.len(),
                max,
            });
        }
        let size = record::record_size(payload.len()) as u64;
        // A record that does not fit before the end goes to offset 0; one
        // that leaves less than a header's room behind it sends the next
        // one there too (the reader skips such a remnant).
        let wraps = self.head.offset + size > self.cap;
        let waste = if wraps {
            self.cap - self.head.offset
        } else {
            0
        };
        let end = if wraps { size } else { self.head.offset + size };
        let remnant = if self.cap - end < record::HEADER_LEN as u64 {
            self.cap - end
        } else {
            0
        };
        let need = waste + size + remnant;
        if self.used + need + BLOCK > self.cap {
            return Err(LogError::Full {
                need,
                free: self.free(),
            });
        }
        if wraps {
            self.wrap(waste);
        }
        let lsn = self.head.lsn;
        self.put(Kind::Entry, payload);
        self.used += size;
        self.head.offset += size;
        if remnant > 0 || self.head.offset == self.cap {
            self.wrap(remnant);
        }
        Ok(lsn)
    }

    /// Moves the head to offset 0, with a wrap record if there is room.
    fn wrap(&mut self, waste: u64) {
        if waste >= record::HEADER_LEN as u64 {
            self.put(Kind::Wrap, &[]);
        }
        self.used += waste;
        self.head.offset = 0;
        self.segs.push(Seg {
            base: 0,
            bytes: Vec::new(),
        });
    }

    /// Encodes a record at the head (the caller moves the offset).
    fn put(&mut self, kind: Kind, payload: &[u8]) {
        let seg = self.segs.last_mut().expect("a segment at the head");
        debug_assert_eq!(seg.base + seg.bytes.len() as u64, self.head.offset);
        let at = Expect {
            lsn: self.head.lsn,
            prev_crc: self.head.prev_crc,
            log_id: self.log_id,
        };
        self.head.prev_crc = record::encode(kind, at, payload, &mut seg.bytes);
        self.head.lsn += 1;
    }

    /// Makes every appended record durable: a write per contiguous run of
    /// whole blocks, then one flush. Returns the last durable sequence
    /// number. After an error the writer is stopped ([`LogError::Failed`]).
    pub fn commit(&mut self) -> Result<u64, LogError> {
        if self.failed {
            return Err(LogError::Failed);
        }
        if self.durable + 1 == self.head.lsn {
            return Ok(self.durable);
        }
        match self.write_out() {
            Ok(()) => {}
            Err(e) => {
                self.failed = true;
                return Err(e.into());
            }
        }
        self.durable = self.head.lsn - 1;
        // Keep the partial last block: the next commit writes it again.
        let last = self.segs.pop().expect("a segment at the head");
        let base = self.head.offset / BLOCK * BLOCK;
        let bytes = last.bytes[(base - last.base) as usize..].to_vec();
        self.segs.clear();
        self.segs.push(Seg { base, bytes });
        Ok(self.durable)
    }

    fn write_out(&mut self) -> io::Result<()> {
        for seg in &mut self.segs {
            let n = seg.bytes.len();
            let padded = (n as u64).div_ceil(BLOCK) * BLOCK;
            if padded == 0 {
                continue;
            }
            seg.bytes.resize(padded as usize, 0);
            let r = self.dev.write_at(seg.base, &seg.bytes);
            seg.bytes.truncate(n);
            r?;
        }
        self.dev.flush()
    }

    /// Gives the ring back up to `pos` (a position this writer returned,
    /// at or before the head): the records before it are no longer
    /// needed, so their space may take new ones.
    pub fn release(&mut self, pos: LogPos) {
        let dist = |from: u64, to: u64| (to + self.cap - from) % self.cap;
        let moved = dist(self.tail, pos.offset);
        assert!(moved <= self.used, "release past the head");
        self.tail = pos.offset;
        self.used = dist(self.tail, self.head.offset);
    }
}
