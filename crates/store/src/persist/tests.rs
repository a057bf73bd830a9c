//! The log's tests: the record codec, recovery across simulated power
//! losses (the recording device keeps only flushed writes and a random
//! subset, by sector, of the rest), torn tails, stale records of an
//! earlier life, a full ring, and the log on a real storage endpoint.

use super::log::{scan, LogError, LogPos, LogStart, LogWriter, BLOCK};
use super::mem::MemDevice;
use super::qp_device::QpDevice;
use super::record::{self, Decoded, EndReason, Expect, Kind};
use super::LogDevice;
use proptest::prelude::*;
use std::collections::BTreeMap;

const ID: u32 = 0x5eed_0001;

fn expect(lsn: u64) -> Expect {
    Expect {
        lsn,
        prev_crc: 7,
        log_id: ID,
    }
}

proptest! {
    #[test]
    fn a_record_decodes_and_any_changed_byte_is_refused(
        payload in proptest::collection::vec(any::<u8>(), 0..300),
        lsn in 1u64..u64::MAX,
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
    ) {
        let mut b = Vec::new();
        let crc = record::encode(Kind::Entry, expect(lsn), &payload, &mut b);
        prop_assert_eq!(b.len(), record::record_size(payload.len()));
        let f = match record::decode(&b, expect(lsn)) {
            Decoded::Record(f) => f,
            other => return Err(TestCaseError::fail(format!("{other:?}"))),
        };
        prop_assert_eq!(f.len, payload.len());
        prop_assert_eq!(f.crc, crc);
        prop_assert_eq!(&b[record::HEADER_LEN..record::HEADER_LEN + f.len], &payload[..]);
        // Any byte the CRC covers, changed, and the record is not read.
        let i = at.index(record::HEADER_LEN + payload.len());
        let mut bad = b.clone();
        bad[i] ^= flip;
        prop_assert!(!matches!(record::decode(&bad, expect(lsn)), Decoded::Record(_)));
        // Whole but not the one expected: another sequence number, chain
        // or log.
        for e in [expect(lsn ^ 1), Expect { prev_crc: 8, ..expect(lsn) }, Expect { log_id: ID + 1, ..expect(lsn) }] {
            prop_assert_eq!(record::decode(&b, e), Decoded::End(EndReason::Stale));
        }
        // Cut short: asks for the rest.
        if b.len() > 4 {
            let cut = 4 + i % (b.len() - 4);
            prop_assert!(matches!(record::decode(&b[..cut], expect(lsn)), Decoded::NeedMore(n) if n > cut));
        }
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_scan(bytes in proptest::collection::vec(any::<u8>(), 0..20_000), start in 0u64..2_000) {
        let _ = record::decode(&bytes, expect(1));
        let mut dev = MemDevice::new(3 * BLOCK as usize, 1);
        dev.damage(0, &bytes[..bytes.len().min(3 * BLOCK as usize)]);
        let mut n = 0;
        let s = scan(&mut dev, LogStart { log_id: ID, pos: LogPos { offset: start * 8 % (3 * BLOCK), lsn: 1, prev_crc: 0 } }, |_, _| n += 1).unwrap();
        prop_assert_eq!(n, s.entries);
    }
}

/// Entries the scan found, by sequence number.
fn read_all<D: LogDevice>(
    dev: &mut D,
    start: LogStart,
) -> (BTreeMap<u64, Vec<u8>>, super::Scanned) {
    let mut got = BTreeMap::new();
    let s = scan(dev, start, |lsn, p| {
        assert!(got.insert(lsn, p.to_vec()).is_none());
    })
    .unwrap();
    (got, s)
}

/// Payloads whose bytes say which record they are.
fn payload(rng: &mut u64, lsn_hint: u64) -> Vec<u8> {
    *rng = rng
        .wrapping_mul(6364136223846793005)
        .wrapping_add(1442695040888963407);
    let len = match (*rng >> 33) % 10 {
        0 => 0,
        1..=6 => (*rng >> 40) as usize % 200,
        7 | 8 => (*rng >> 40) as usize % 3_000,
        _ => (*rng >> 40) as usize % 9_000,
    };
    (0..len)
        .map(|i| (lsn_hint as usize * 31 + i) as u8 ^ (*rng >> 50) as u8)
        .collect()
}

/// Under many seeds: random appends, group commits, releases (a snapshot
/// taking over the records before a position) and injected device errors
/// on a ring small enough to wrap many times, with a power loss every few
/// dozen steps. After each, the log recovered from the last released
/// position holds every record a commit acknowledged, exactly, and
/// nothing that was not appended in this history.
#[test]
fn every_committed_record_survives_power_losses() {
    let mut losses = 0;
    let mut lost_sectors = 0;
    let mut wraps_seen = 0u64;
    for seed in 1..=60u64 {
        let mut rng = seed;
        let mut dev = MemDevice::new(8 * BLOCK as usize, seed);
        let mut start = LogStart::fresh(ID);
        let mut model: BTreeMap<u64, Vec<u8>> = BTreeMap::new();
        for life in 0..6 {
            let (mut w, _) = LogWriter::open(dev, start, |_, _| {}).unwrap();
            let mut acked = w.durable();
            for _ in 0..(40 + seed % 100) {
                rng = rng
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                match (rng >> 33) % 10 {
                    0..=5 => {
                        let p = payload(&mut rng, w.position().lsn);
                        let before = w.position().offset;
                        match w.append(&p) {
                            Ok(lsn) => {
                                wraps_seen += u64::from(w.position().offset < before);
                                model.insert(lsn, p);
                            }
                            Err(LogError::Full { .. }) => {
                                // Half the time a snapshot now: everything
                                // durable is taken over; else the ring stays
                                // full (what is in it must survive).
                                if let Ok(d) = w.commit() {
                                    acked = d;
                                    if (rng >> 41) % 2 == 0 {
                                        let pos = w.position();
                                        w.release(pos);
                                        start.pos = pos;
                                        model.retain(|&l, _| l >= pos.lsn);
                                    }
                                }
                            }
                            Err(LogError::Failed) => {}
                            Err(e) => panic!("{e}"),
                        }
                    }
                    6..=8 => {
                        if let Ok(d) = w.commit() {
                            acked = d;
                        }
                    }
                    _ => {
                        if (rng >> 40) % 8 == 0 {
                            // The device fails in the middle of a commit.
                            w.device().fail_after_writes = Some((rng >> 45) % 2);
                        } else if w.commit().is_ok() {
                            acked = w.durable();
                            let pos = w.position();
                            w.release(pos);
                            start.pos = pos;
                            model.retain(|&l, _| l >= pos.lsn);
                        }
                    }
                }
            }
            // Power fails.
            dev = into_device(w);
            lost_sectors += dev.power_loss();
            losses += 1;
            let (got, s) = read_all(&mut dev, start);
            for (lsn, p) in &model {
                if *lsn <= acked {
                    assert_eq!(
                        got.get(lsn),
                        Some(p),
                        "seed {seed} life {life}: acknowledged record {lsn} lost"
                    );
                }
            }
            for (lsn, p) in &got {
                assert_eq!(
                    model.get(lsn),
                    Some(p),
                    "seed {seed} life {life}: record {lsn} was never appended so"
                );
            }
            assert!(
                s.end.lsn > acked,
                "seed {seed}: the log ends before what was acknowledged"
            );
            // What the next life knows: what was recovered.
            model = got;
        }
    }
    assert_eq!(losses, 360);
    assert!(
        lost_sectors > 100,
        "power losses dropped only {lost_sectors} sectors: the test is not testing"
    );
    assert!(wraps_seen > 60, "the ring wrapped only {wraps_seen} times");
}

fn into_device<D: LogDevice + Default>(mut w: LogWriter<D>) -> D {
    std::mem::take(w.device())
}

#[test]
fn a_torn_tail_is_cut_and_the_next_life_writes_over_it() {
    let dev = MemDevice::new(16 * BLOCK as usize, 3);
    let start = LogStart::fresh(ID);
    let (mut w, _) = LogWriter::open(dev, start, |_, _| {}).unwrap();
    for i in 0..10u8 {
        w.append(&[i; 100]).unwrap();
    }
    assert_eq!(w.commit().unwrap(), 10);
    let last = w.position().offset - record::record_size(100) as u64;
    let mut dev = into_device(w);
    // The last record's payload damaged, as a torn write leaves it.
    dev.damage(last as usize + 40, &[0xee; 8]);
    let (got, s) = read_all(&mut dev, start);
    assert_eq!(got.len(), 9);
    assert_eq!(s.reason, EndReason::BadCrc);
    assert_eq!(s.end.offset, last);
    // The next life appends where the valid log ends.
    let (mut w, _) = LogWriter::open(dev, start, |_, _| {}).unwrap();
    assert_eq!(w.append(b"after").unwrap(), 10);
    w.commit().unwrap();
    let mut dev = into_device(w);
    let (got, s) = read_all(&mut dev, start);
    assert_eq!(got.len(), 10);
    assert_eq!(got[&10], b"after");
    assert_eq!(s.reason, EndReason::NoMagic);
}

/// A record written by an earlier life after a record that was torn is
/// never read after the next life's records: its chain names the torn
/// record's CRC, not the new one's, even where its sequence number and
/// offset are what the reader expects.
#[test]
fn a_stale_record_of_an_earlier_life_is_not_read() {
    let dev = MemDevice::new(16 * BLOCK as usize, 5);
    let start = LogStart::fresh(ID);
    let (mut w, _) = LogWriter::open(dev, start, |_, _| {}).unwrap();
    w.append(b"one").unwrap();
    w.commit().unwrap();
    let torn_at = w.position().offset;
    w.append(b"two, first life").unwrap();
    w.append(b"three, first life").unwrap();
    w.commit().unwrap();
    let mut dev = into_device(w);
    dev.damage(torn_at as usize + 36, b"X");
    let (got, _) = read_all(&mut dev, start);
    assert_eq!(got.len(), 1);
    // The second life writes a record of the same size at the same place:
    // record 3 of the first life now sits where the reader expects 3.
    let (mut w, _) = LogWriter::open(dev, start, |_, _| {}).unwrap();
    assert_eq!(w.append(b"two, other life").unwrap(), 2);
    // Written, not committed: only the one block goes out on commit, so
    // write record 2 alone without padding over record 3.
    let mut dev = into_device_raw(w, torn_at);
    let (got, s) = read_all(&mut dev, start);
    assert_eq!(got.keys().copied().collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(got[&2], b"two, other life");
    assert_eq!(
        s.reason,
        EndReason::Stale,
        "record 3 of the first life was read"
    );
}

/// Writes the writer's pending record at `at` by hand, without the zero
/// padding a commit adds, and flushes: the bytes after it stay as the
/// earlier life left them.
fn into_device_raw(mut w: LogWriter<MemDevice>, at: u64) -> MemDevice {
    let mut rec = Vec::new();
    record::encode(
        Kind::Entry,
        Expect {
            lsn: 2,
            prev_crc: prev_crc_of(&mut w, at),
            log_id: ID,
        },
        b"two, other life",
        &mut rec,
    );
    let mut dev = std::mem::take(w.device());
    dev.write_at(at, &rec).unwrap();
    dev.flush().unwrap();
    dev
}

fn prev_crc_of(w: &mut LogWriter<MemDevice>, at: u64) -> u32 {
    // The record before `at` is record 1, at offset 0.
    let mut b = vec![0u8; at as usize];
    w.device().read_at(0, &mut b).unwrap();
    match record::decode(
        &b,
        Expect {
            lsn: 1,
            prev_crc: 0,
            log_id: ID,
        },
    ) {
        Decoded::Record(f) => f.crc,
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_full_ring_refuses_until_released() {
    let dev = MemDevice::new(4 * BLOCK as usize, 9);
    let (mut w, _) = LogWriter::open(dev, LogStart::fresh(ID), |_, _| {}).unwrap();
    let mut n = 0;
    let err = loop {
        match w.append(&[1; 1000]) {
            Ok(_) => n += 1,
            Err(e) => break e,
        }
    };
    assert!(matches!(err, LogError::Full { .. }), "{err}");
    // A block's worth is kept in front of the tail.
    assert_eq!(n, 3 * BLOCK as usize / record::record_size(1000));
    w.commit().unwrap();
    let pos = w.position();
    w.release(pos);
    w.append(&[2; 1000]).unwrap();
    assert!(matches!(
        w.append(&vec![0; w.max_payload() + 1]),
        Err(LogError::TooLarge { .. })
    ));
    // A failed device stops the writer until the log is opened again.
    w.device().fail_after_writes = Some(0);
    assert!(matches!(w.commit(), Err(LogError::Io(_))));
    assert!(matches!(w.append(b"x"), Err(LogError::Failed)));
    assert!(matches!(w.commit(), Err(LogError::Failed)));
}

/// The log on a real storage endpoint: a store file, its partition reached
/// through a local QP (RDMA Writes, a Flush, RDMA Reads), then the same
/// partition through a storage target on loopback.
#[test]
fn the_log_on_a_storage_endpoint_local_and_remote() {
    use softrdma_storage::endpoint::{Endpoint, Target};
    use softrdma_storage::layout::Rights;
    use softrdma_storage::{InitOptions, PartitionSpec, Store};
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    let dir = std::env::temp_dir().join(format!("softrdma-persist-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("log.store");
    Store::init(
        &path,
        &InitOptions {
            size: Some(64 << 20),
            partitions: PartitionSpec::Equal(2),
            align: 1 << 20,
            force: false,
        },
    )
    .unwrap();
    let mut s = Store::open(&path).unwrap();
    s.grant("1", "node1", Rights::READ_WRITE).unwrap();
    let token = s.token("node1").unwrap();
    let name = format!("storage:{}", path.display());

    let start = LogStart::fresh(ID);
    let mut rng = 11u64;
    let mut want = BTreeMap::new();
    {
        let dev = QpDevice::local(&name, "node1", 1).unwrap();
        assert!(dev.capacity() >= 30 << 20);
        let (mut w, s) = LogWriter::open(dev, start, |_, _| {}).unwrap();
        assert_eq!(s.entries, 0);
        for i in 0..2_000u64 {
            let p = payload(&mut rng, i);
            want.insert(w.append(&p).unwrap(), p);
            if i % 50 == 49 {
                w.commit().unwrap();
            }
        }
        w.commit().unwrap();
    }
    // Another principal has no right on the partition.
    assert!(QpDevice::local(&name, "nobody", 1).is_err());
    // Read back in a new process's way: a new endpoint, a new QP.
    let (got, s) = read_all(&mut QpDevice::local(&name, "node1", 1).unwrap(), start);
    assert_eq!(got, want);
    assert_eq!(s.reason, EndReason::NoMagic);

    // Remote: a storage target on loopback, appending to the same log.
    let ep = Arc::new(Endpoint::open(&name).unwrap());
    let target = Target::bind(ep, "127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = target.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let stop2 = stop.clone();
    let th = std::thread::spawn(move || target.run(&stop2));
    {
        let dev = QpDevice::remote(addr, &token, 1).unwrap();
        let mut n = 0;
        let (mut w, _) = LogWriter::open(dev, start, |_, _| n += 1).unwrap();
        assert_eq!(n, 2_000);
        for i in 0..300u64 {
            let p = payload(&mut rng, i);
            want.insert(w.append(&p).unwrap(), p);
        }
        w.commit().unwrap();
    }
    assert!(
        QpDevice::remote(addr, &[0; 32], 1).is_err(),
        "a wrong token connected"
    );
    stop.store(true, Ordering::SeqCst);
    th.join().unwrap();
    let (got, _) = read_all(&mut QpDevice::local(&name, "node1", 1).unwrap(), start);
    assert_eq!(got.len(), 2_300);
    assert_eq!(got, want);

    // A stream of Reads in flight (recovery's snapshot load) hands the
    // bytes over in order, in pieces that do or do not divide the
    // staging region, the last one short.
    let mut dev = QpDevice::local(&name, "node1", 1).unwrap();
    let len = (9 << 20) + 12_345;
    let bytes: Vec<u8> = (0..len).map(|i| (i * 7 + i / 4093) as u8).collect();
    dev.write_at(4_103, &bytes).unwrap();
    dev.flush().unwrap();
    for piece in [300_000, 1 << 20, 8 << 20] {
        let mut got = Vec::new();
        dev.read_stream(4_103, len as u64, piece, &mut |off, b| {
            assert_eq!(off, got.len() as u64);
            assert!(b.len() <= piece);
            got.extend_from_slice(b);
            Ok(())
        })
        .unwrap();
        assert!(got == bytes, "piece {piece}: the bytes differ");
    }
    let mut n = 0;
    let r = dev.read_stream(0, 4 << 20, 1 << 20, &mut |_, _| {
        n += 1;
        Err(std::io::Error::other("enough"))
    });
    assert!(r.is_err() && n == 1, "a sink's error ends the stream");
    assert!(dev
        .read_stream(dev.capacity() - 10, 11, 4, &mut |_, _| Ok(()))
        .is_err());
    // (The device still works after the error: Reads in flight drained.)
    dev.read_stream(0, 8, 8, &mut |_, _| Ok(())).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn zero_fill_writes_the_whole_device_durably() {
    let mut dev = MemDevice::new(5 * BLOCK as usize + 100, 4);
    dev.damage(0, &[0xff; 3000]);
    dev.damage(5 * BLOCK as usize, &[0xff; 100]);
    dev.write_at(4096, &[1; 10]).unwrap();
    super::log::zero_fill(&mut dev).unwrap();
    dev.power_loss();
    assert!(dev.bytes().iter().all(|&b| b == 0));
    assert_eq!(dev.flushes, 1);
}

/// A base grows with the arena's allocations. A life that began on an
/// empty arena kept room for a base twice the size of that first, tiny
/// one; writes that each allocate filled the ring up to it while the
/// first snapshot ran, and the next base (every allocation since) did not
/// fit: `log full`, and persistence stopped (a 1 GiB arena of 4 KiB
/// values, `store bench-recovery`). The room kept now bounds the next
/// base from the writes logged since. And the writes that waited in the
/// backlog are in that base's snapshot only: durable once the snapshot's
/// checkpoint is, not when the base's record is committed (they were
/// reported durable then, and a crash before the checkpoint lost them).
/// The arena the persister tests' partitions hold (64 KiB).
fn test_arena() -> super::checkpoint::ArenaId {
    super::checkpoint::ArenaId {
        size: 64 << 10,
        base: 0x7f00_0000_0000,
        stag: 0x1234_5600,
    }
}

#[test]
fn the_ring_keeps_room_for_a_base_that_grew_and_the_backlog_waits_for_its_snapshot() {
    use super::driver::Persister;
    use super::entry::{Base, Entry};
    use crate::alloc::AllocSnapshot;
    use crate::proto::{Effect, RepOp, Reply};
    const ARENA: u64 = 64 << 10;
    const PER_WRITE: u64 = 2;
    let arena = test_arena();
    let dev = MemDevice::new((2 * 4096 + 2 * ARENA + (2 << 20)) as usize, 7);
    let (mut p, found) = Persister::open(dev, arena, 0).unwrap();
    assert!(found.is_none());
    let base = |seq: u64, allocations: u64| {
        Entry::Base(Base {
            epoch: 1,
            seq,
            incarnation: 9,
            alloc: AllocSnapshot {
                size: ARENA,
                allocations: (0..allocations).map(|i| (i * 64, 64)).collect(),
                freed: Vec::new(),
            },
            dedup: Vec::new(),
            stag: arena.stag,
        })
    };
    let write = |seq: u64| {
        let effects = (0..PER_WRITE)
            .map(|i| Effect::Alloc {
                offset: (seq * PER_WRITE + i) * 64,
                len: 64,
            })
            .collect();
        let op = RepOp {
            client: 1,
            req_id: seq,
            effects,
            reply: Reply::Refused("x".repeat(200)),
        };
        Entry::Write { epoch: 1, seq, op }
    };
    // A life begins on the empty arena; while its first snapshot runs,
    // writes fill the ring until one waits in the backlog.
    p.append(&base(0, 0)).unwrap();
    let mut seq = 0;
    while p.backlog() == 0 {
        seq += 1;
        p.append(&write(seq)).unwrap();
        if seq % 100 == 0 {
            p.commit().unwrap();
        }
    }
    p.commit().unwrap();
    while let Some((off, len)) = p.snapshot_wants() {
        p.snapshot_chunk(off, &vec![0u8; len]).unwrap();
    }
    // (Releasing the first base freed a little: fill it again.)
    while p.backlog() == 0 {
        seq += 1;
        p.append(&write(seq)).unwrap();
    }
    p.commit().unwrap();
    let in_ring = seq - p.backlog() as u64;
    assert_eq!(p.durable(), in_ring, "the ring's writes are durable");
    assert!(p.wants_snapshot(), "the backlog holds writes");
    // The next base holds every allocation so far, and fits.
    let size = p.append(&base(seq, seq * PER_WRITE)).unwrap();
    assert!(
        size > 128 << 10,
        "a base of {size} bytes: larger than the first room"
    );
    // Its record committed, with a write after it: the backlog's writes
    // are not durable yet.
    p.append(&write(seq + 1)).unwrap();
    p.commit().unwrap();
    assert_eq!(p.durable(), in_ring, "the backlog waits for the snapshot");
    while let Some((off, len)) = p.snapshot_wants() {
        p.snapshot_chunk(off, &vec![0u8; len]).unwrap();
    }
    // Durable through the base now; the write after it waited for room
    // and went to the ring as the snapshot released it, durable with no
    // other commit (none may come: the load stopped, or a primary under
    // `always` waits for exactly this write).
    assert_eq!(p.backlog(), 0);
    assert!(
        p.durable() == seq + 1,
        "durable {} backlog {}",
        p.durable(),
        p.backlog()
    );
}

/// A recovered persister keeps room for a base as large as the one it
/// recovered: it knew nothing of it (64 KiB kept), so writes after a
/// restart could fill the ring and leave no room for the next base (found
/// reading `Persister::open`; this test failed with `Log(Full { need:
/// 389888, free: 65704 })`).
#[test]
fn a_recovered_ring_keeps_room_for_a_base_as_large_as_the_one_it_recovered() {
    use super::driver::Persister;
    use super::entry::{Base, Entry};
    use crate::alloc::AllocSnapshot;
    use crate::proto::{RepOp, Reply};
    const ARENA: u64 = 64 << 10;
    const ALLOCATIONS: u64 = 20_000;
    let arena = test_arena();
    let base = |seq: u64| {
        Entry::Base(Base {
            epoch: 1,
            seq,
            incarnation: 9,
            alloc: AllocSnapshot {
                size: 1 << 40,
                allocations: (0..ALLOCATIONS).map(|i| (i << 20, 4096)).collect(),
                freed: Vec::new(),
            },
            dedup: Vec::new(),
            stag: arena.stag,
        })
    };
    // A write that changes no allocation (an overwrite in place).
    let write = |seq: u64| Entry::Write {
        epoch: 1,
        seq,
        op: RepOp {
            client: 1,
            req_id: seq,
            effects: Vec::new(),
            reply: Reply::Refused("x".repeat(500)),
        },
    };
    let snapshot = |p: &mut Persister<MemDevice>| {
        while let Some((off, len)) = p.snapshot_wants() {
            p.snapshot_chunk(off, &vec![7u8; len]).unwrap();
        }
    };
    let dev = MemDevice::new((2 * 4096 + 2 * ARENA + (2 << 20)) as usize, 3);
    let (mut p, _) = Persister::open(dev, arena, 0).unwrap();
    let size = p.append(&base(0)).unwrap() as u64;
    assert!(size > 128 << 10, "a base of {size} bytes, over 64 KiB");
    snapshot(&mut p);
    p.append(&write(1)).unwrap();
    p.commit().unwrap();
    // Restart: recovery finds the base and the write.
    let (mut p, found) = Persister::open(p.into_device(), arena, 0).unwrap();
    let found = found.expect("the partition holds the node");
    assert_eq!((found.base.seq, found.entries.len()), (0, 1));
    let mut seq = 1;
    while p.backlog() == 0 {
        seq += 1;
        p.append(&write(seq)).unwrap();
        if seq % 100 == 0 {
            p.commit().unwrap();
        }
    }
    p.commit().unwrap();
    assert!(p.wants_snapshot(), "the backlog holds writes");
    // The next base is as large as the recovered one, and fits.
    p.append(&base(seq)).expect("room for the base");
    snapshot(&mut p);
    p.commit().unwrap();
    assert!(p.durable() >= seq, "durable {} after {seq}", p.durable());
}
