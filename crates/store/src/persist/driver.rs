//! A node's persistence on its partition, as one object: the log of its
//! entries with group commit, the snapshots that let the log be released,
//! the checkpoint that names them, and recovery. It performs the device's
//! I/O but keeps no thread and reads no clock: its owner (the node's
//! runtime, or the simulation) hands it the node's [`Entry`]s, commits
//! when the policy says, feeds it the arena's bytes when it wants a
//! snapshot, and reports [`Persister::durable`] back to the node.
//!
//! Lives and snapshots (docs/store.md, "Persistence"):
//!
//! * A base ([`Entry::Base`]) of a new incarnation starts a **new life**:
//!   first a checkpoint that names no snapshot (the partition holds no
//!   node's state until the new life's first snapshot is durable: the old
//!   state was discarded with the old incarnation), then a fresh log (a new
//!   id, so no record of the old life is read as one of the new), the base
//!   record, and a snapshot. Until that snapshot's checkpoint is durable,
//!   nothing of the life is: [`Persister::durable`] says 0.
//! * A base of the current life starts a **snapshot within the life**: the
//!   current checkpoint still covers every record, so writes stay durable
//!   as before while it is taken.
//! * **A snapshot** goes to the slot the current checkpoint does not name,
//!   from the arena's bytes as the owner reads them while writes go on; then
//!   one commit makes the snapshot and the log through the base durable
//!   (a flush covers every earlier write), then the checkpoint names the
//!   slot, the base's sequence number and the base record's position, and
//!   only then is the ring released up to the base.
//! * **Recovery** reads the checkpoint, the log from the base it names
//!   (the first record is that base), and the snapshot (its CRC checked),
//!   and hands them to the owner in that order of use: base, snapshot
//!   bytes, writes.

use std::collections::{HashMap, VecDeque};

use super::checkpoint::{self, ArenaId, Checkpoint, Layout, Snapshot};
use super::entry::{self, Base, Entry};
use super::log::{LogPos, LogStart, LogWriter};
use super::{record, LogDevice, LogError, Window};
use crate::proto::Effect;

/// Bytes of the arena the owner hands over per snapshot step.
pub const SNAPSHOT_CHUNK: usize = 1 << 20;

/// Errors of a partition (each ends the persister's use: reopen it).
#[derive(Debug, thiserror::Error)]
pub enum PersistError {
    /// The log refused (device error, a record too large).
    #[error(transparent)]
    Log(#[from] LogError),
    /// The device failed outside the log.
    #[error("persistence device: {0}")]
    Io(#[from] std::io::Error),
    /// The partition's contents are not what they must be.
    #[error("{0}")]
    Corrupt(String),
}

/// What a partition holds of a node, to recover it from.
#[derive(Debug)]
pub struct Found {
    /// Where the snapshot starts.
    pub base: Base,
    /// The snapshot.
    pub snapshot: Snapshot,
    /// The writes logged after the base, oldest first.
    pub entries: Vec<Entry>,
}

/// A snapshot being written.
#[derive(Debug)]
struct Job {
    base_pos: LogPos,
    base_seq: u64,
    base_epoch: u64,
    slot: u8,
    next: u64,
    crc: u32,
}

enum Dev<D: LogDevice> {
    Bare(D),
    Log(LogWriter<Window<D>>),
    Taken,
}

/// A node's partition in use.
pub struct Persister<D: LogDevice> {
    dev: Dev<D>,
    layout: Layout,
    arena: ArenaId,
    ckpt: Option<Checkpoint>,
    /// The incarnation whose life the log holds.
    life: Option<u64>,
    /// A checkpoint of this life is durable.
    based: bool,
    /// Sequence numbers of the records appended and not yet durable.
    seqs: VecDeque<(u64, u64)>,
    durable_seq: u64,
    job: Option<Job>,
    /// Payloads the ring had no room for, in order, with their writes'
    /// sequence numbers (appended once a snapshot releases it).
    backlog: VecDeque<(u64, Vec<u8>)>,
    /// Ring bytes in use after which a snapshot is wanted.
    snapshot_after: u64,
    /// A snapshot was asked for and no base came since.
    asked: bool,
    /// Ring bytes kept free for a base: twice the largest base so far
    /// (at least; see [`Persister::base_room`]).
    reserve: u64,
    /// The last base's record size (0 before any).
    base_len: u64,
    /// How much larger than the last base the next may be, from the writes
    /// logged since: [`BASE_BYTES_PER_CHANGE`] per allocation or free.
    growth: u64,
    /// Per client that wrote since the last base: its last write's payload
    /// length, a bound on its entry in the next base's retry table (the
    /// entry holds that write's reply); and their sum.
    clients: HashMap<u64, u64>,
    clients_len: u64,
    /// While a snapshot runs whose base came when the backlog held writes
    /// (which only that snapshot holds, not the log): the last write
    /// before them. Nothing after it is durable until the snapshot is.
    hole: Option<u64>,
}

/// A bound on the bytes one allocation or free adds to a base's
/// allocator (an offset and a length, each at most a 10-byte varint, and
/// the entry's framing).
pub const BASE_BYTES_PER_CHANGE: u64 = 24;

fn corrupt(s: impl Into<String>) -> PersistError {
    PersistError::Corrupt(s.into())
}

impl<D: LogDevice> Persister<D> {
    /// Opens a partition for an arena `arena`: a blank one, or one that
    /// holds this arena's state ([`Found`]). `snapshot_after`: ring bytes
    /// in use past which a snapshot is wanted (0: half the ring).
    pub fn open(
        mut dev: D,
        arena: ArenaId,
        snapshot_after: u64,
    ) -> Result<(Persister<D>, Option<Found>), PersistError> {
        let layout = Layout::new(dev.capacity(), arena.size).map_err(corrupt)?;
        let (ckpt, _damaged) = checkpoint::read(&mut dev)?;
        // (A checkpoint that names no snapshot holds no state: the next
        // life writes this arena's.)
        if let Some(c) = ckpt.filter(|c| c.snapshot.is_some()) {
            if c.arena != arena {
                return Err(corrupt(format!(
                    "the partition holds the state of another arena ({:?}, not {arena:?})",
                    c.arena
                )));
            }
        }
        let snapshot_after = match snapshot_after {
            0 => layout.log_len / 2,
            n => n.min(layout.log_len / 2),
        };
        let mut p = Persister {
            dev: Dev::Bare(dev),
            layout,
            arena,
            ckpt,
            life: None,
            based: false,
            seqs: VecDeque::new(),
            durable_seq: 0,
            job: None,
            backlog: VecDeque::new(),
            snapshot_after,
            asked: false,
            reserve: 64 << 10,
            base_len: 0,
            growth: 0,
            clients: HashMap::new(),
            clients_len: 0,
            hole: None,
        };
        let Some(c) = ckpt else {
            // A blank partition: its log ring is written with zeros once
            // (a commit into a sparse file's hole would also commit the
            // file system's journal; `log::zero_fill`).
            let Dev::Bare(dev) = std::mem::replace(&mut p.dev, Dev::Taken) else {
                unreachable!()
            };
            let mut w = Window::new(dev, layout.log, layout.log_len)?;
            super::log::zero_fill(&mut w)?;
            p.dev = Dev::Bare(w.into_inner());
            return Ok((p, None));
        };
        let Some(snapshot) = c.snapshot else {
            return Ok((p, None));
        };
        let Dev::Bare(dev) = std::mem::replace(&mut p.dev, Dev::Taken) else {
            unreachable!()
        };
        let window = Window::new(dev, layout.log, layout.log_len)?;
        let mut payloads = Vec::new();
        let (w, _) = LogWriter::open(window, c.log, |_, b| payloads.push(b.to_vec()))?;
        p.dev = Dev::Log(w);
        // The recovered base and writes bound the next base as they did
        // before the restart (a persister that knew nothing of them kept
        // 64 KiB for a base of megabytes, and the ring filled).
        let mut entries = Vec::with_capacity(payloads.len());
        for b in payloads {
            let e = entry::decode(&b).map_err(|e| corrupt(e.to_string()))?;
            p.account(&e, b.len());
            entries.push(e);
        }
        let mut entries = entries.into_iter();
        let base = match entries.next() {
            Some(Entry::Base(b)) if b.seq == snapshot.seq => b,
            other => {
                return Err(corrupt(format!(
                    "the log does not start with the base of its snapshot (write {}): {:?}",
                    snapshot.seq,
                    other.map(|e| e.seq())
                )))
            }
        };
        let entries: Vec<Entry> = entries.collect();
        p.life = Some(base.incarnation);
        p.based = true;
        p.durable_seq = entries.last().map_or(base.seq, Entry::seq);
        Ok((
            p,
            Some(Found {
                base,
                snapshot,
                entries,
            }),
        ))
    }

    /// Reads the snapshot `found` names, in chunks, into `sink` (offset,
    /// bytes); an error if its CRC does not match (then the bytes given
    /// are not an image).
    pub fn load_snapshot(
        &mut self,
        found: &Found,
        mut sink: impl FnMut(u64, &[u8]) -> Result<(), String>,
    ) -> Result<(), PersistError> {
        let s = found.snapshot;
        let at = self.layout.slot(s.slot);
        let mut crc = 0u32;
        let mut bad = None;
        self.device()
            .read_stream(at, s.len, SNAPSHOT_CHUNK, &mut |off, b| {
                crc = crc32c::crc32c_append(crc, b);
                sink(off, b).map_err(|e| {
                    bad = Some(e);
                    std::io::Error::other("the sink refused")
                })
            })
            .map_err(|e| match bad.take() {
                Some(b) => corrupt(b),
                None => e.into(),
            })?;
        if crc != s.crc {
            return Err(corrupt(format!(
                "snapshot slot {} does not match its checkpoint's CRC",
                s.slot
            )));
        }
        Ok(())
    }

    fn device(&mut self) -> &mut D {
        match &mut self.dev {
            Dev::Bare(d) => d,
            Dev::Log(w) => w.device().inner(),
            Dev::Taken => unreachable!("the device is always put back"),
        }
    }

    /// Writes waiting in memory for room in the ring.
    pub fn backlog(&self) -> usize {
        self.backlog.len()
    }

    /// Whether writes wait in memory for room in the ring: the owner
    /// tells the node ([`crate::node::Input::LogPressure`]), which stops
    /// taking more until a snapshot releases the ring. Each waiting write
    /// may grow the next base (its allocations), and the ring's room was
    /// kept for the base as it was bounded when the backlog began.
    pub fn pressed(&self) -> bool {
        !self.backlog.is_empty()
    }

    /// A line on what waits, for the owner's log: the backlog, the
    /// snapshot in progress (bytes read of the arena), whether one was
    /// asked for, the ring's free bytes.
    pub fn state(&self) -> String {
        let free = match &self.dev {
            Dev::Log(w) => w.free(),
            _ => 0,
        };
        format!(
            "durable {} backlog {} snapshot {:?} asked {} ring free {free} of {} (base room {})",
            self.durable(),
            self.backlog.len(),
            self.job.as_ref().map(|j| (j.base_seq, j.next)),
            self.asked,
            self.layout.log_len,
            self.base_room()
        )
    }

    /// The incarnation whose life the log holds.
    pub fn life(&self) -> Option<u64> {
        self.life
    }

    /// The last write durable in the current life (0 until its first
    /// snapshot's checkpoint is durable).
    pub fn durable(&self) -> u64 {
        match (self.based, self.hole) {
            (false, _) => 0,
            (true, Some(cap)) => self.durable_seq.min(cap),
            (true, None) => self.durable_seq,
        }
    }

    /// Takes the node's next entry (durable once a later commit returns);
    /// returns its record's bytes.
    pub fn append(&mut self, e: &Entry) -> Result<usize, PersistError> {
        if let Entry::Base(b) = e {
            self.asked = false;
            if self.life != Some(b.incarnation) {
                self.new_life(b.incarnation)?;
            }
        }
        if !matches!(self.dev, Dev::Log(_)) {
            // A write with no life (a node logs only once it holds an
            // image, whose base comes first).
            return Err(corrupt("a logged write before any base"));
        }
        let payload = entry::encode(e);
        let size = record::record_size(payload.len());
        self.account(e, payload.len());
        let room = size as u64 + self.base_room();
        let Dev::Log(w) = &mut self.dev else {
            unreachable!()
        };
        let pos = w.position();
        let Entry::Base(b) = e else {
            // A write goes to the ring while it leaves room for a base
            // (the next snapshot's, which is what frees the ring), else to
            // the backlog.
            if !self.backlog.is_empty() || w.free() < room {
                self.backlog.push_back((e.seq(), payload));
                return Ok(size);
            }
            let lsn = w.append(&payload)?;
            self.seqs.push_back((lsn, e.seq()));
            return Ok(size);
        };
        // Whatever waited for room is in this base's snapshot, and durable
        // only once that is (the base's record in the log does not hold
        // it: durable through the base's write on its commit, a crash
        // before the snapshot's checkpoint lost every one of them).
        if let Some(&(first, _)) = self.backlog.front() {
            self.hole = Some(first - 1);
        }
        self.backlog.clear();
        let lsn = w.append(&payload)?;
        self.seqs.push_back((lsn, b.seq));
        {
            let named = self.ckpt.and_then(|c| c.snapshot).map(|s| s.slot);
            self.job = Some(Job {
                base_pos: pos,
                base_seq: b.seq,
                base_epoch: b.epoch,
                slot: named.map_or(0, |s| 1 - s),
                next: 0,
                crc: 0,
            });
        }
        Ok(size)
    }

    /// Counts what entry `e` (its payload `len` bytes) adds to the next
    /// base: a base sets the bound anew, a write grows it.
    fn account(&mut self, e: &Entry, len: usize) {
        match e {
            Entry::Base(_) => {
                self.base_len = record::record_size(len) as u64;
                self.reserve = self.reserve.max(2 * self.base_len);
                self.growth = 0;
                self.clients.clear();
                self.clients_len = 0;
            }
            Entry::Write { op, .. } => {
                let changes = op
                    .effects
                    .iter()
                    .filter(|f| matches!(f, Effect::Alloc { .. } | Effect::Free { .. }))
                    .count() as u64;
                self.growth += BASE_BYTES_PER_CHANGE * changes;
                let len = len as u64;
                let old = self.clients.insert(op.client, len).unwrap_or(0);
                self.clients_len = self.clients_len + len - old;
            }
        }
    }

    /// The ring bytes a write must leave free for the next base: twice the
    /// largest base so far, and twice a bound on the next one (the last
    /// base, the allocations and frees logged since, every retry-table
    /// entry written since). A base grows with the arena's allocations;
    /// kept to the largest so far only, a ring filled with writes after a
    /// small base had no room for the next, larger one, and persistence
    /// stopped (`log full: 1603864 bytes needed`, a 1 GiB arena of 4 KiB
    /// values after a life began on an empty arena).
    fn base_room(&self) -> u64 {
        let bound = self.base_len + self.growth + self.clients_len + 64;
        self.reserve.max(2 * bound)
    }

    /// A new life for incarnation `inc`: a checkpoint that names no
    /// snapshot, then a fresh log.
    fn new_life(&mut self, inc: u64) -> Result<(), PersistError> {
        let generation = self.ckpt.map_or(1, |c| c.generation + 1);
        let log_id = self.ckpt.map_or(1, |c| c.log.log_id.wrapping_add(1).max(1));
        let c = Checkpoint {
            generation,
            log: LogStart::fresh(log_id),
            snapshot: None,
            arena: self.arena,
        };
        let dev = match std::mem::replace(&mut self.dev, Dev::Taken) {
            Dev::Bare(d) => d,
            Dev::Log(w) => w.into_device().into_inner(),
            Dev::Taken => unreachable!(),
        };
        self.dev = Dev::Bare(dev);
        checkpoint::write(self.device(), &c)?;
        self.ckpt = Some(c);
        let Dev::Bare(dev) = std::mem::replace(&mut self.dev, Dev::Taken) else {
            unreachable!()
        };
        let window = Window::new(dev, self.layout.log, self.layout.log_len)?;
        let (w, _) = LogWriter::open(window, c.log, |_, _| {})?;
        self.dev = Dev::Log(w);
        self.life = Some(inc);
        self.based = false;
        self.seqs.clear();
        self.durable_seq = 0;
        self.job = None;
        self.backlog.clear();
        self.hole = None;
        Ok(())
    }

    /// Makes every entry taken so far durable (one flush); returns
    /// [`Persister::durable`].
    pub fn commit(&mut self) -> Result<u64, PersistError> {
        let Dev::Log(w) = &mut self.dev else {
            return Ok(0);
        };
        let lsn = w.commit()?;
        while self.seqs.front().is_some_and(|&(l, _)| l <= lsn) {
            self.durable_seq = self.seqs.pop_front().expect("front").1;
        }
        Ok(self.durable())
    }

    /// Whether the owner should ask the node for a snapshot now (once per
    /// snapshot: the node answers with a base at its next quiet moment).
    pub fn wants_snapshot(&mut self) -> bool {
        let Dev::Log(w) = &self.dev else { return false };
        let used = self.layout.log_len - w.free();
        if self.asked
            || self.job.is_some()
            || (used < self.snapshot_after && self.backlog.is_empty())
        {
            return false;
        }
        self.asked = true;
        true
    }

    /// The arena bytes the snapshot in progress wants next: (offset,
    /// length), or `None` when no snapshot is in progress.
    pub fn snapshot_wants(&self) -> Option<(u64, usize)> {
        let j = self.job.as_ref()?;
        let left = self.arena.size - j.next;
        Some((j.next, left.min(SNAPSHOT_CHUNK as u64) as usize))
    }

    /// The arena's bytes at `offset` (as [`Persister::snapshot_wants`]
    /// asked), read now; after the last chunk the snapshot is made durable
    /// and named (returns true then).
    pub fn snapshot_chunk(&mut self, offset: u64, bytes: &[u8]) -> Result<bool, PersistError> {
        let at = {
            let Some(j) = self.job.as_mut() else {
                return Ok(false);
            };
            assert_eq!(offset, j.next, "snapshot chunks come in order");
            j.crc = crc32c::crc32c_append(j.crc, bytes);
            j.next += bytes.len() as u64;
            self.layout.slot(j.slot) + offset
        };
        self.device().write_at(at, bytes)?;
        let j = self.job.as_ref().expect("a job");
        if j.next < self.arena.size {
            return Ok(false);
        }
        // The snapshot's bytes and the log through its base, durable in
        // one flush; then the checkpoint naming them; then the release.
        self.commit()?;
        let j = self.job.take().expect("a job");
        let prev = self.ckpt.expect("a life has a checkpoint");
        let c = Checkpoint {
            generation: prev.generation + 1,
            log: LogStart {
                log_id: prev.log.log_id,
                pos: j.base_pos,
            },
            snapshot: Some(Snapshot {
                slot: j.slot,
                seq: j.base_seq,
                epoch: j.base_epoch,
                len: self.arena.size,
                crc: j.crc,
            }),
            arena: self.arena,
        };
        checkpoint::write(self.device(), &c)?;
        self.ckpt = Some(c);
        self.based = true;
        self.hole = None;
        self.durable_seq = self.durable_seq.max(j.base_seq);
        let room = self.base_room();
        let Dev::Log(w) = &mut self.dev else {
            unreachable!()
        };
        w.release(j.base_pos);
        // What waited for room, committed now: no entry may come to make
        // the owner commit (the load stopped, or a primary under `always`
        // waits for exactly these writes), and they stayed undurable for
        // good (durable stuck at 199382 of 224768 after a 1 GiB fill;
        // under `always` the simulation's primary never quiesced).
        let mut drained = false;
        while let Some((seq, p)) = self.backlog.front() {
            if w.free() < record::record_size(p.len()) as u64 + room {
                break;
            }
            let lsn = w.append(p)?;
            self.seqs.push_back((lsn, *seq));
            self.backlog.pop_front();
            drained = true;
        }
        if drained {
            self.commit()?;
        }
        Ok(true)
    }

    /// The device, for a test's power loss.
    pub fn device_mut(&mut self) -> &mut D {
        self.device()
    }

    /// The device, giving the persister up.
    pub fn into_device(self) -> D {
        match self.dev {
            Dev::Bare(d) => d,
            Dev::Log(w) => w.into_device().into_inner(),
            Dev::Taken => unreachable!(),
        }
    }
}
