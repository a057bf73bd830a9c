//! A node's persistence in the runtime (issue 33): the partition opened
//! at start (and the node recovered from it), and a thread that owns the
//! [`Persister`] from then on.
//!
//! The node loop hands the thread the node's log entries as the node makes
//! them ([`ToPersist::Entry`]); the thread appends them and commits (under
//! `always` as soon as anything waits: entries that arrive during a flush
//! go together in the next one, which is the group commit; under
//! `everysec` once a second, or once 1 MiB waits) and reports the log's
//! durable write back (on the node loop's queue). For a snapshot it asks the node
//! loop for the arena's bytes a chunk at a time (the loop owns the arena,
//! and reads a chunk between two events), and writes them to the
//! snapshot's slot, while writes go on. A device error stops the thread:
//! under `always` the node then acknowledges no more writes (its log is
//! no longer durable), which is the promise; under `everysec` it serves
//! on without persistence, and says so in its log.

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender, TryRecvError};
use std::time::{Duration, Instant};

use crate::arena::Arena;
use crate::config::{Config, PersistConfig};
use crate::node::{Node, NodeConfig, Recovering};
use crate::persist::checkpoint::{self, ArenaId, Checkpoint};
use crate::persist::driver::{Found, PersistError, Persister};
use crate::persist::entry::Entry;
use crate::persist::qp_device::QpDevice;
use crate::persist::Policy;

/// From the node loop to the thread.
pub(crate) enum ToPersist {
    /// Entries the node made, in order.
    Entries(Vec<Entry>),
    /// The arena's bytes at `offset`, as asked.
    Chunk { offset: u64, bytes: Vec<u8> },
}

/// From the thread to the node loop.
pub(crate) enum FromPersist {
    /// The log of `incarnation` is durable through `seq`.
    Durable { incarnation: u64, seq: u64 },
    /// The log wants a snapshot.
    SnapshotDue,
    /// The snapshot wants the arena's bytes `[offset, +len)`.
    WantChunk { offset: u64, len: usize },
    /// Writes wait in memory for room in the ring, or no longer.
    Pressure(bool),
}

/// Under `everysec`: a commit at least this often...
const EVERYSEC: Duration = Duration::from_secs(1);
/// ...and whenever this much waits.
const EVERYSEC_BYTES: usize = 1 << 20;
/// How often the `everysec` thread looks for entries and snapshot chunks.
const EVERYSEC_POLL: Duration = Duration::from_millis(5);

/// Opens this node's partition as `cfg.persist` names it.
pub(crate) fn open_device(cfg: &Config) -> Result<QpDevice, String> {
    let p: &PersistConfig = &cfg.persist;
    let r = match (&p.storage, p.target) {
        (Some(path), _) => QpDevice::local(path, &p.principal, p.partition),
        (None, Some(addr)) => {
            let file = p
                .token_file
                .as_ref()
                .expect("validated: a target has a token file");
            let file = match (&cfg.source, file.is_relative()) {
                (Some(src), true) => src.parent().unwrap_or(src).join(file),
                _ => file.clone(),
            };
            let text = std::fs::read_to_string(&file)
                .map_err(|e| format!("persist.token_file {}: {e}", file.display()))?;
            let token = softrdma_storage::parse_token(text.trim())
                .map_err(|e| format!("persist.token_file {}: {e}", file.display()))?;
            QpDevice::remote(addr, &token, p.partition)
        }
        (None, None) => return Err("persist: no storage or target".into()),
    };
    r.map_err(|e| format!("persist: partition {}: {e}", p.partition))
}

/// The checkpoint on the partition, if it names a node's state: the arena
/// that state lives in (the node maps it there).
pub(crate) fn stored_arena(dev: &mut QpDevice) -> Result<Option<ArenaId>, String> {
    let (c, damaged) = checkpoint::read(dev).map_err(|e| format!("persist: checkpoint: {e}"))?;
    if damaged > 0 {
        tracing::warn!(
            damaged,
            "a checkpoint copy on the partition is damaged; using the other"
        );
    }
    Ok(c.and_then(|c: Checkpoint| c.snapshot.map(|_| c.arena)))
}

/// The node, recovered from what `p` found: the snapshot into `arena`,
/// the logged writes over it. `started`: when the process started (the
/// node has been silent since, at least).
pub(crate) fn recover(
    p: &mut Persister<QpDevice>,
    found: &Found,
    cfg: NodeConfig,
    arena: Arena,
    started: Instant,
) -> Result<Node<Arena>, String> {
    let t = Instant::now();
    let mut r = Recovering::new(cfg, arena, &found.base)?;
    p.load_snapshot(found, |off, b| r.snapshot(off, b))
        .map_err(|e| e.to_string())?;
    let loaded = t.elapsed();
    for e in &found.entries {
        r.replay(e)?;
    }
    let seq = r.seq();
    let node = r.finish(started.elapsed().as_micros() as u64)?;
    tracing::info!(
        base = found.base.seq,
        through = seq,
        writes = found.entries.len(),
        snapshot_ms = loaded.as_millis() as u64,
        total_ms = t.elapsed().as_millis() as u64,
        "recovered from the partition"
    );
    Ok(node)
}

/// Starts the thread; returns where the node loop sends to it. `tell`
/// posts the thread's news on the node loop's queue (false once the loop
/// is gone).
pub(crate) fn spawn(
    p: Persister<QpDevice>,
    policy: Policy,
    tell: impl Fn(FromPersist) -> bool + Send + 'static,
) -> std::io::Result<Sender<ToPersist>> {
    let (tx, rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("store-persist".into())
        .spawn(move || {
            if let Err(e) = run(p, policy, &rx, &tell) {
                tracing::error!(
                    error = %e,
                    "persistence stopped: {}",
                    match policy {
                        Policy::Always => "no write is acknowledged from now on",
                        _ => "the node serves on, but nothing more is made durable",
                    }
                );
            }
        })?;
    Ok(tx)
}

fn run(
    mut p: Persister<QpDevice>,
    policy: Policy,
    rx: &Receiver<ToPersist>,
    tell: &impl Fn(FromPersist) -> bool,
) -> Result<(), PersistError> {
    let mut waiting = 0usize; // entry bytes not yet committed
    let mut dirty = false;
    let mut last_commit = Instant::now();
    let mut chunk_asked = false;
    let mut pressed = false;
    let mut last_report = Instant::now();
    loop {
        // What waits, now and then (a stall shows in the node's log).
        if last_report.elapsed() >= Duration::from_secs(5) {
            last_report = Instant::now();
            if p.backlog() > 0 || p.snapshot_wants().is_some() {
                tracing::info!(chunk_asked, "persistence: {}", p.state());
            }
        }
        let mut next = if policy == Policy::Always {
            let timeout = match dirty {
                true => Duration::ZERO,
                false => Duration::from_secs(3600),
            };
            match rx.recv_timeout(timeout) {
                Ok(m) => Some(m),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            }
        } else if chunk_asked {
            // A snapshot's chunk is on its way: take it as soon as it
            // comes (a chunk per poll read a 1 GiB arena in 5 s at best,
            // while writes filled the ring).
            match rx.recv_timeout(EVERYSEC_POLL) {
                Ok(m) => Some(m),
                Err(RecvTimeoutError::Timeout) => None,
                Err(RecvTimeoutError::Disconnected) => return Ok(()),
            }
        } else {
            // Under `everysec` the thread looks now and then instead of
            // being woken by every batch of entries (a wake-up costs the
            // node loop a system call and both a context switch).
            std::thread::sleep(EVERYSEC_POLL);
            match rx.try_recv() {
                Ok(m) => Some(m),
                Err(TryRecvError::Empty) => None,
                Err(TryRecvError::Disconnected) => return Ok(()),
            }
        };
        // Everything that waits goes into this round.
        while let Some(m) = next.take().or_else(|| rx.try_recv().ok()) {
            match m {
                ToPersist::Entries(es) => {
                    for e in &es {
                        waiting += p.append(e)?;
                    }
                    dirty = true;
                }
                ToPersist::Chunk { offset, bytes } => {
                    chunk_asked = false;
                    if p.snapshot_chunk(offset, &bytes)? {
                        if let Some(incarnation) = p.life() {
                            tell(FromPersist::Durable {
                                incarnation,
                                seq: p.durable(),
                            });
                        }
                        tracing::debug!(seq = p.durable(), "snapshot durable");
                    }
                }
            }
        }
        let due = match policy {
            Policy::Always => dirty,
            _ => dirty && (last_commit.elapsed() >= EVERYSEC || waiting >= EVERYSEC_BYTES),
        };
        if due {
            let seq = p.commit()?;
            dirty = false;
            waiting = 0;
            last_commit = Instant::now();
            if let Some(incarnation) = p.life() {
                tell(FromPersist::Durable { incarnation, seq });
            }
        }
        // (Asked on every round, not only after a commit: writes that wait
        // in the backlog once the load stopped are made durable only by a
        // snapshot, and no commit comes to ask for it; they stayed
        // undurable for good.)
        if p.pressed() != pressed {
            pressed = p.pressed();
            tracing::debug!(pressed, "persistence: {}", p.state());
            tell(FromPersist::Pressure(pressed));
        }
        if p.wants_snapshot() {
            tracing::debug!("persistence: snapshot due: {}", p.state());
            tell(FromPersist::SnapshotDue);
        }
        if !chunk_asked {
            if let Some((offset, len)) = p.snapshot_wants() {
                chunk_asked = tell(FromPersist::WantChunk { offset, len });
            }
        }
    }
}
