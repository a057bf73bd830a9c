//! Persistence in the simulation (issue 33): each node logs to its own
//! simulated partition ([`MemDevice`], which loses its unflushed writes,
//! sector by sector at random, on a power loss) through the same
//! [`Persister`] the runtime uses; every crash is a power loss of the
//! node's partition, and every restart recovers the node from it.
//!
//! * **Commits** come a random flush time after an entry is logged (under
//!   `always`; one commit carries every entry logged before it), or every
//!   [`EVERYSEC`] (under `everysec`); each reports the log's durable write
//!   to the node.
//! * **Snapshots** are asked for once the log holds more than
//!   [`SNAPSHOT_AFTER`] bytes; the arena's bytes are read from the node's
//!   memory a small chunk per step while writes go on, so a snapshot is
//!   as fuzzy as the runtime's.
//! * **Whole-group crashes** ([`SimConfig::group_crashes`](super::SimConfig))
//!   kill both nodes at once and cut both partitions' power; both restart
//!   from what their partitions kept. The run's checks (every acknowledged
//!   write reads back, no deleted object returns, the history is
//!   linearizable) then hold across the crashes only if nothing
//!   acknowledged was lost.

use super::{Event, Sim};
use crate::arena::{HeapMemory, Memory};
use crate::node::{Input, Micros, Node, NodeConfig, Recovering};
use crate::persist::checkpoint::ArenaId;
use crate::persist::driver::{PersistError, Persister};
use crate::persist::entry::Entry;
use crate::persist::mem::MemDevice;
use crate::persist::Policy;
use crate::proto::NodeId;

/// The log ring's bytes in use past which a snapshot is wanted.
const SNAPSHOT_AFTER: u64 = 48 << 10;
/// Bytes of the arena read per snapshot step.
const SNAPSHOT_STEP: usize = 16 << 10;
/// The commit period of `everysec`, scaled to the simulation's times.
pub(super) const EVERYSEC: Micros = 50_000;

/// `everysec`'s promise, scaled: a whole-group crash loses no write
/// acknowledged more than this before it (two commit periods: a write
/// exposed at `t` is in both logs' next commit, by `t + EVERYSEC`, unless
/// the crash tears that commit, which it can only do before then).
pub(super) const EVERYSEC_BOUND: Micros = 2 * EVERYSEC;
/// A log ring of 1 MiB (the least a layout leaves).
const LOG_LEN: u64 = 1 << 20;

/// A node's partition, while the node runs or between its lives.
pub(super) enum Disk {
    Up(Box<Persister<MemDevice>>),
    Down(MemDevice),
}

impl Sim {
    fn arena_id(&self) -> ArenaId {
        ArenaId {
            size: self.arena.len,
            base: self.arena.base,
            stag: self.arena.stag,
        }
    }

    /// A new blank partition for each node.
    pub(super) fn format_disks(&mut self) {
        for n in super::NODE_IDS {
            let len = 2 * 4096 + 2 * self.arena.len.div_ceil(4096) * 4096 + LOG_LEN;
            let seed = self.rng.next_u64();
            self.disks
                .insert(n, Disk::Down(MemDevice::new(len as usize, seed)));
        }
    }

    /// Node `n` starting: recovered from its partition if that holds its
    /// state, else `None` (it starts empty). Opens the partition.
    pub(super) fn recover_node(&mut self, n: NodeId, cfg: &NodeConfig) -> Option<Node<HeapMemory>> {
        if !self.cfg.persist.logs() {
            return None;
        }
        let Some(Disk::Down(dev)) = self.disks.remove(&n) else {
            panic!("node {n} starts with its partition up");
        };
        let (mut p, found) = match Persister::open(dev, self.arena_id(), SNAPSHOT_AFTER) {
            Ok(x) => x,
            Err(e) => {
                self.violations.push(format!("node {n}: partition: {e}"));
                return None;
            }
        };
        let node = found.and_then(|f| {
            let garbage = HeapMemory::new(self.arena.len);
            let r = (|| -> Result<Node<HeapMemory>, String> {
                let mut r = Recovering::new(cfg.clone(), garbage, &f.base)?;
                p.load_snapshot(&f, |off, b| r.snapshot(off, b))
                    .map_err(|e| e.to_string())?;
                for e in &f.entries {
                    r.replay(e)?;
                }
                // Silent since it died (the clock is the world's, near
                // enough the node's: drift is a few hundred ppm).
                r.finish(self.now - self.killed_at.get(&n).copied().unwrap_or(0))
            })();
            match r {
                Ok(node) => {
                    if self.trace {
                        eprintln!(
                            "{:>9} n{n} recovered: epoch {} applied {} (base {}, {} logged)",
                            self.now,
                            node.epoch(),
                            node.applied_seq(),
                            f.base.seq,
                            f.entries.len()
                        );
                    }
                    self.report.recoveries += 1;
                    Some(node)
                }
                Err(e) => {
                    self.violations.push(format!("node {n}: recovery: {e}"));
                    None
                }
            }
        });
        self.disks.insert(n, Disk::Up(Box::new(p)));
        node
    }

    /// Node `n` crashed: its partition loses power, half the time in the
    /// middle of a commit of what its log holds uncommitted (some of the
    /// commit's block writes done, the flush not), so that the power loss
    /// tears the log's tail.
    pub(super) fn power_loss(&mut self, n: NodeId) {
        let writes = self.rng.range(1, 4);
        let mid_commit = self.rng.percent(50) || self.crash_commits == Some(n);
        if let Some(Disk::Up(mut p)) = self.disks.remove(&n) {
            if mid_commit {
                let dev = p.device_mut();
                dev.fail_after_writes = Some(writes);
                dev.fail_flushes = true;
                let _ = p.commit();
            }
            self.report.crashes_in_snapshot += p.snapshot_wants().is_some() as u64;
            let mut dev = p.into_device();
            dev.fail_after_writes = None;
            dev.fail_flushes = false;
            self.report.torn_power_losses += (dev.power_loss() > 0) as u64;
            self.disks.insert(n, Disk::Down(dev));
        }
    }

    fn disk(&mut self, n: NodeId) -> Option<&mut Persister<MemDevice>> {
        match self.disks.get_mut(&n) {
            Some(Disk::Up(p)) => Some(p),
            _ => None,
        }
    }

    fn persist_failed(&mut self, n: NodeId, e: PersistError) {
        self.violations.push(format!("node {n}: persistence: {e}"));
    }

    /// The time between two steps of a snapshot.
    fn snap_step_gap(&mut self) -> Micros {
        match self.cfg.slow_snapshots {
            true => self.rng.range(20_000, 60_000),
            false => self.rng.range(100, 1_000),
        }
    }

    /// Tells node `n` when writes begin or end waiting for room in its
    /// log's ring (as the runtime's persistence thread does).
    fn tell_pressure(&mut self, n: NodeId) {
        let Some(Disk::Up(p)) = self.disks.get(&n) else {
            return;
        };
        let on = p.pressed();
        if on != self.pressed.contains(&n) {
            if on {
                self.pressed.insert(n);
                self.report.log_pressures += 1;
            } else {
                self.pressed.remove(&n);
            }
            self.feed(n, Input::LogPressure(on));
        }
    }

    /// Node `n` asked its log to take `e`.
    pub(super) fn log_entry(&mut self, n: NodeId, e: Entry) {
        let is_base = matches!(e, Entry::Base(_));
        let Some(p) = self.disk(n) else { return };
        if let Err(err) = p.append(&e) {
            return self.persist_failed(n, err);
        }
        self.tell_pressure(n);
        let g = self.gen[&n];
        if is_base {
            self.report.snapshots += 1;
            let at = self.now + self.snap_step_gap();
            self.schedule(at, Event::SnapStep(n, g));
        }
        if self.cfg.persist == Policy::Always && !self.commit_due.contains(&n) {
            self.commit_due.insert(n);
            let at = self.now + self.rng.range(100, 1_500);
            self.schedule(at, Event::Commit(n, g));
        }
    }

    /// A commit of node `n`'s log (or, with a group crash armed, the
    /// moment of that crash: in the middle of this commit).
    pub(super) fn commit(&mut self, n: NodeId, g: u64) {
        if self.gen.get(&n) != Some(&g) || !self.nodes.contains_key(&n) {
            return;
        }
        if self.group_crash_armed && self.nodes.len() == 2 && !self.crash_phase_over {
            self.group_crash_armed = false;
            self.crash_commits = Some(n);
            self.crash_group_now();
            self.crash_commits = None;
            return;
        }
        self.commit_due.remove(&n);
        if self.cfg.persist == Policy::Everysec {
            self.schedule(self.now + EVERYSEC, Event::Commit(n, g));
        }
        let Some(p) = self.disk(n) else { return };
        let r = p.commit().map(|seq| (seq, p.life(), p.wants_snapshot()));
        match r {
            Err(e) => self.persist_failed(n, e),
            Ok((seq, life, wants)) => {
                if let Some(incarnation) = life {
                    self.feed(n, Input::Durable { incarnation, seq });
                }
                if wants {
                    self.feed(n, Input::SnapshotDue);
                }
            }
        }
    }

    /// One step of node `n`'s snapshot: a chunk of its arena as it is now.
    pub(super) fn snap_step(&mut self, n: NodeId, g: u64) {
        if self.gen.get(&n) != Some(&g) {
            return;
        }
        let Some(node) = self.nodes.get(&n) else {
            return;
        };
        let mem = node.memory();
        let Some(Disk::Up(p)) = self.disks.get_mut(&n) else {
            return;
        };
        let Some((off, len)) = p.snapshot_wants() else {
            return;
        };
        let len = len.min(SNAPSHOT_STEP);
        let mut buf = vec![0u8; len];
        mem.read(off, &mut buf).expect("inside the arena");
        match p.snapshot_chunk(off, &buf) {
            Err(e) => self.persist_failed(n, e),
            Ok(true) => {
                let (seq, life) = (p.durable(), p.life());
                if let Some(incarnation) = life {
                    self.feed(n, Input::Durable { incarnation, seq });
                }
                self.tell_pressure(n);
            }
            Ok(false) => {
                let at = self.now + self.snap_step_gap();
                self.schedule(at, Event::SnapStep(n, g));
            }
        }
    }

    /// Arms a whole-group crash: it comes at the next commit of either
    /// node's log (in its middle).
    pub(super) fn group_crash(&mut self) {
        if self.crash_phase_over || self.group_crashes_left == 0 {
            return;
        }
        self.group_crash_armed = true;
    }

    /// Both nodes die at once and their partitions lose power; both
    /// restart a little later from what the partitions kept.
    fn crash_group_now(&mut self) {
        self.group_crashes_left -= 1;
        if self.trace {
            eprintln!("{:>9} group crash", self.now);
        }
        for n in super::NODE_IDS {
            self.kill(n);
            let at = self.now + self.rng.range(5_000, 60_000);
            self.schedule(at, Event::Restart(n));
        }
        self.report.group_crashes += 1;
        if self.cfg.persist == Policy::Everysec {
            self.lossy
                .push((self.now.saturating_sub(EVERYSEC_BOUND), self.now));
        }
        if self.group_crashes_left > 0 {
            let at = self.now + self.rng.range(150_000, 400_000);
            self.schedule(at, Event::GroupCrash);
        }
    }
}
