//! The recovery protocol end to end on a simulated partition: checkpoints,
//! snapshots in alternating slots, the log, and power losses anywhere in
//! them (in the middle of a snapshot, of a checkpoint, of a commit).
//!
//! A small stand-in for the node: its "arena" is a byte array, a write is
//! (sequence number, offset, bytes) logged and applied, a snapshot is the
//! array as of a write. After every power loss the recovered array must
//! be exactly the effect of the writes 1..=n for some n at least the last
//! acknowledged one, and the writes must come back in order with none
//! missing.

use super::checkpoint::{self, ArenaId, Checkpoint, Layout, Snapshot};
use super::log::{LogStart, LogWriter};
use super::mem::MemDevice;
use super::{LogDevice, Window};

const ARENA: usize = 16 << 10;
const PART: usize = 2 * 4096 + 2 * ARENA + (1 << 20);

struct Mini {
    w: LogWriter<Window<MemDevice>>,
    layout: Layout,
    ckpt: Checkpoint,
    arena: Vec<u8>,
    seq: u64,
}

fn arena_id() -> ArenaId {
    ArenaId {
        size: ARENA as u64,
        base: 0x7f00_0000_0000,
        stag: 0x1234_5600,
    }
}

fn apply(arena: &mut [u8], payload: &[u8]) -> u64 {
    let seq = u64::from_le_bytes(payload[..8].try_into().unwrap());
    let off = u32::from_le_bytes(payload[8..12].try_into().unwrap()) as usize;
    arena[off..off + payload.len() - 12].copy_from_slice(&payload[12..]);
    seq
}

impl Mini {
    /// Formats a fresh partition, or recovers the one there.
    fn start(mut dev: MemDevice) -> Result<Mini, String> {
        let layout = Layout::new(dev.capacity(), ARENA as u64)?;
        let (found, _damaged) = checkpoint::read(&mut dev).map_err(|e| e.to_string())?;
        let ckpt = match found {
            Some(c) => c,
            None => {
                let c = Checkpoint {
                    generation: 1,
                    log: LogStart::fresh(0xabcd),
                    snapshot: None,
                    arena: arena_id(),
                };
                checkpoint::write(&mut dev, &c).map_err(|e| e.to_string())?;
                c
            }
        };
        assert_eq!(ckpt.arena, arena_id());
        let mut arena = vec![0u8; ARENA];
        let mut seq = 0;
        if let Some(s) = ckpt.snapshot {
            let mut img = vec![0u8; s.len as usize];
            dev.read_at(layout.slot(s.slot), &mut img)
                .map_err(|e| e.to_string())?;
            if crc32c::crc32c(&img) != s.crc {
                return Err(format!("snapshot slot {} damaged", s.slot));
            }
            arena.copy_from_slice(&img);
            seq = s.seq;
        }
        let window = Window::new(dev, layout.log, layout.log_len).map_err(|e| e.to_string())?;
        let mut bad = None;
        let (w, _) = LogWriter::open(window, ckpt.log, |_, p| {
            let s = apply(&mut arena, p);
            if s != seq + 1 && bad.is_none() {
                bad = Some((seq, s));
            }
            seq = s;
        })
        .map_err(|e| e.to_string())?;
        if let Some((a, b)) = bad {
            return Err(format!("log replay jumped from write {a} to {b}"));
        }
        Ok(Mini {
            w,
            layout,
            ckpt,
            arena,
            seq,
        })
    }

    fn write(&mut self, off: usize, bytes: &[u8]) -> Result<u64, String> {
        let seq = self.seq + 1;
        let mut p = seq.to_le_bytes().to_vec();
        p.extend_from_slice(&(off as u32).to_le_bytes());
        p.extend_from_slice(bytes);
        self.w.append(&p).map_err(|e| e.to_string())?;
        apply(&mut self.arena, &p);
        self.seq = seq;
        Ok(seq)
    }

    /// A snapshot of the arena as of the last write into the slot the
    /// checkpoint does not name, then the checkpoint naming it, then the
    /// log released up to it.
    fn snapshot(&mut self) -> Result<(), String> {
        let e = |e: std::io::Error| e.to_string();
        let pos = self.w.position();
        let slot = self.ckpt.snapshot.map_or(0, |s| 1 - s.slot);
        let at = self.layout.slot(slot);
        let dev = self.w.device().inner();
        dev.write_at(at, &self.arena).map_err(e)?;
        dev.flush().map_err(e)?;
        let next = Checkpoint {
            generation: self.ckpt.generation + 1,
            log: LogStart {
                log_id: self.ckpt.log.log_id,
                pos,
            },
            snapshot: Some(Snapshot {
                slot,
                seq: self.seq,
                epoch: 1,
                len: ARENA as u64,
                crc: crc32c::crc32c(&self.arena),
            }),
            arena: self.ckpt.arena,
        };
        checkpoint::write(dev, &next).map_err(e)?;
        self.ckpt = next;
        self.w.release(pos);
        Ok(())
    }
}

fn lcg(r: &mut u64) -> u64 {
    *r = r
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    *r >> 33
}

#[test]
fn recovery_after_power_losses_in_snapshots_checkpoints_and_commits() {
    let mut losses = 0;
    let mut snapshots = 0;
    let mut injected = 0;
    for seed in 1..=40u64 {
        let mut r = seed;
        let mut dev = MemDevice::new(PART, seed);
        // Every write ever made, in order: write n is writes[n - 1].
        let mut writes: Vec<(usize, Vec<u8>)> = Vec::new();
        let mut acked = 0u64;
        for life in 0..8 {
            let mut m = Mini::start(dev).unwrap_or_else(|e| panic!("seed {seed} life {life}: {e}"));
            // What came back is writes 1..=m.seq exactly.
            assert!(
                m.seq >= acked,
                "seed {seed} life {life}: acknowledged write {acked} lost (recovered {})",
                m.seq
            );
            let mut want = vec![0u8; ARENA];
            for (off, b) in &writes[..m.seq as usize] {
                want[*off..off + b.len()].copy_from_slice(b);
            }
            assert!(
                m.arena == want,
                "seed {seed} life {life}: recovered arena differs"
            );
            writes.truncate(m.seq as usize);
            acked = m.seq;
            for _ in 0..(30 + lcg(&mut r) % 200) {
                match lcg(&mut r) % 20 {
                    0..=13 => {
                        let len = 1 + lcg(&mut r) as usize % 700;
                        let off = lcg(&mut r) as usize % (ARENA - len);
                        let b: Vec<u8> = (0..len).map(|_| lcg(&mut r) as u8).collect();
                        if m.write(off, &b).is_ok() {
                            writes.push((off, b));
                        } else {
                            break; // the device failed: power loss next
                        }
                    }
                    14..=17 => match m.w.commit() {
                        Ok(_) => acked = m.seq,
                        Err(_) => break,
                    },
                    _ => {
                        // Sometimes the device fails part-way through.
                        if lcg(&mut r).is_multiple_of(3) {
                            m.w.device().inner().fail_after_writes = Some(lcg(&mut r) % 3);
                            injected += 1;
                        }
                        if m.w.commit().is_err() || m.snapshot().is_err() {
                            break;
                        }
                        acked = m.seq;
                        snapshots += 1;
                    }
                }
            }
            dev = std::mem::take(m.w.device().inner());
            dev.power_loss();
            losses += 1;
        }
    }
    assert_eq!(losses, 320);
    assert!(snapshots > 200, "only {snapshots} snapshots");
    assert!(injected > 50, "only {injected} device failures injected");
}

use proptest::prelude::*;

fn ckpt(generation: u64, snapshot: bool) -> Checkpoint {
    Checkpoint {
        generation,
        log: LogStart {
            log_id: 77,
            pos: super::log::LogPos {
                offset: 4096 * generation,
                lsn: 10 * generation,
                prev_crc: 0xdead_beef,
            },
        },
        snapshot: snapshot.then_some(Snapshot {
            slot: (generation % 2) as u8,
            seq: 5 * generation,
            epoch: 3,
            len: ARENA as u64,
            crc: 0x0102_0304,
        }),
        arena: arena_id(),
    }
}

proptest! {
    #[test]
    fn a_checkpoint_decodes_and_any_changed_byte_is_refused(
        generation in 1u64..1_000_000, snapshot: bool, at in 0usize..checkpoint::ENCODED_LEN, flip in 1u8..=255,
    ) {
        let c = ckpt(generation, snapshot);
        let mut b = c.encode();
        prop_assert_eq!(Checkpoint::decode(&b), Some(c));
        b[at] ^= flip;
        prop_assert_eq!(Checkpoint::decode(&b), None);
    }
}

#[test]
fn the_newer_whole_copy_wins_and_a_torn_one_is_reported() {
    let mut dev = MemDevice::new(PART, 3);
    assert_eq!(
        checkpoint::read(&mut dev).unwrap(),
        (None, 0),
        "a fresh partition"
    );
    for g in 1..=3 {
        checkpoint::write(&mut dev, &ckpt(g, g > 1)).unwrap();
    }
    assert_eq!(
        checkpoint::read(&mut dev).unwrap(),
        (Some(ckpt(3, true)), 0)
    );
    // Generation 4 torn on its way (copy 0): generation 3 stands.
    dev.fail_after_writes = None;
    let mut b = ckpt(4, true).encode();
    b.truncate(40);
    dev.write_at(0, &b).unwrap();
    assert_eq!(
        checkpoint::read(&mut dev).unwrap(),
        (Some(ckpt(3, true)), 1)
    );
    // A power loss while writing it: one generation or the other, never none.
    for seed in 0..50 {
        let mut d = MemDevice::new(PART, seed);
        checkpoint::write(&mut d, &ckpt(1, false)).unwrap();
        checkpoint::write(&mut d, &ckpt(2, true)).unwrap();
        let mut b = ckpt(3, true).encode();
        b.resize(4096, 0);
        d.write_at(4096, &b).unwrap();
        d.power_loss();
        let got = checkpoint::read(&mut d).unwrap().0.unwrap();
        assert!(got == ckpt(2, true) || got == ckpt(3, true), "{got:?}");
    }
}

#[test]
fn a_partition_too_small_for_the_arena_is_refused() {
    let l = Layout::new(PART as u64, ARENA as u64).unwrap();
    assert_eq!(l.slot(0), 8192);
    assert_eq!(l.slot(1), 8192 + ARENA as u64);
    assert_eq!(l.log, 8192 + 2 * ARENA as u64);
    assert_eq!(l.log + l.log_len, PART as u64);
    let e = Layout::new(PART as u64, 1 << 30).unwrap_err();
    assert!(e.contains("too small"), "{e}");
}
