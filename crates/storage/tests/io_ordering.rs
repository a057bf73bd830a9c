//! The storage I/O queue on a real file: strict ordering completes in
//! submission order, relaxed ordering lets a small request overtake a large
//! one, fences and barriers hold later requests and see every earlier
//! Write, and a request outside its partition touches nothing.

use softrdma_storage::io::{IoCompletion, IoError, IoOp, IoQueue, IoRequest, Ordering};
use softrdma_storage::layout::Partition;
use std::fs::{File, OpenOptions};
use std::path::PathBuf;
use std::time::Duration;

const MIB: u64 = 1 << 20;

struct Tmp(PathBuf);
impl Drop for Tmp {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn device(name: &str, len: u64) -> (Tmp, File) {
    let p = std::env::temp_dir().join(format!("softrdma-io-{name}-{}", std::process::id()));
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&p)
        .unwrap();
    f.set_len(len).unwrap();
    (Tmp(p), f)
}

fn parts() -> Vec<Partition> {
    vec![
        Partition {
            name: "a".into(),
            offset: MIB,
            size: 16 * MIB,
        },
        Partition {
            name: "b".into(),
            offset: 17 * MIB,
            size: 16 * MIB,
        },
    ]
}

fn collect(q: &IoQueue, n: usize) -> Vec<IoCompletion> {
    let mut out = Vec::new();
    while out.len() < n {
        let got = q.wait(n - out.len(), Duration::from_secs(20));
        assert!(
            !got.is_empty(),
            "no completion within 20 s ({} of {n})",
            out.len()
        );
        out.extend(got);
    }
    out
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn write(id: u64, partition: u32, offset: u64, data: Vec<u8>) -> IoRequest {
    IoRequest {
        id,
        partition,
        op: IoOp::Write { offset, data },
    }
}

#[test]
fn strict_completes_in_submission_order_with_sequential_effect() {
    let (_t, f) = device("strict", 40 * MIB);
    let q = IoQueue::new(f.try_clone().unwrap(), parts(), Ordering::Strict, 4);
    let mut model = vec![0u8; 16 * MIB as usize];
    let mut n = 0;
    for i in 0..200u64 {
        let len = [512usize, 4096, 65536, 1 << 20][(i % 4) as usize];
        let off = (i * 7919 * 4096) % (16 * MIB - len as u64);
        let data = pattern(len, i);
        model[off as usize..off as usize + len].copy_from_slice(&data);
        q.submit(write(i, 0, off, data));
        n += 1;
    }
    q.submit(IoRequest {
        id: 1000,
        partition: 0,
        op: IoOp::Read {
            offset: 0,
            len: 16 * MIB as usize,
        },
    });
    let done = collect(&q, n + 1);
    let ids: Vec<u64> = done.iter().map(|c| c.id).collect();
    let mut want: Vec<u64> = (0..200).collect();
    want.push(1000);
    assert_eq!(ids, want);
    let read = done.last().unwrap().result.clone().unwrap().unwrap();
    assert!(
        read == model,
        "the read after the writes sees them, in order"
    );
}

/// Relaxed: a 4 KiB Write submitted behind a 16 MiB one completes first at
/// least sometimes (out-of-order completion); strict never lets it.
#[test]
fn relaxed_lets_small_requests_overtake() {
    let (_t, f) = device("relaxed", 40 * MIB);
    let mut overtook = [0usize; 2];
    for (k, ordering) in [Ordering::Strict, Ordering::Relaxed]
        .into_iter()
        .enumerate()
    {
        let q = IoQueue::new(f.try_clone().unwrap(), parts(), ordering, 4);
        for round in 0..20u64 {
            q.submit(write(2 * round, 0, 0, pattern(16 * MIB as usize, round)));
            q.submit(write(2 * round + 1, 1, 0, pattern(4096, round)));
            let done = collect(&q, 2);
            if done[0].id == 2 * round + 1 {
                overtook[k] += 1;
            }
            assert!(done.iter().all(|c| c.result.is_ok()));
        }
    }
    assert_eq!(overtook[0], 0, "strict never reorders");
    assert!(
        overtook[1] > 0,
        "relaxed never let the small write overtake (20 tries)"
    );
}

/// A fence (and a barrier) in relaxed mode: completes after every earlier
/// request, before any later one, and a Read behind it sees every earlier
/// Write.
#[test]
fn fence_and_barrier_order_everything_around_them() {
    let (_t, f) = device("fence", 40 * MIB);
    let q = IoQueue::new(f.try_clone().unwrap(), parts(), Ordering::Relaxed, 4);
    for (round, op) in [IoOp::Fence, IoOp::Barrier, IoOp::Fence]
        .into_iter()
        .enumerate()
    {
        let base = 1000 * round as u64;
        let mut model = vec![0u8; 8 * MIB as usize];
        let sizes = [1 << 20, 4096, 512 << 10, 8192, 64 << 10];
        let mut off = 0usize;
        for (i, &len) in sizes.iter().enumerate() {
            let data = pattern(len, base + i as u64);
            model[off..off + len].copy_from_slice(&data);
            q.submit(write(base + i as u64, 1, off as u64, data));
            off += len;
        }
        q.submit(IoRequest {
            id: base + 100,
            partition: 1,
            op: op.clone(),
        });
        for i in 0..5u64 {
            q.submit(IoRequest {
                id: base + 200 + i,
                partition: 1,
                op: IoOp::Read {
                    offset: 0,
                    len: off,
                },
            });
        }
        let done = collect(&q, 11);
        let pos = done.iter().position(|c| c.id == base + 100).unwrap();
        assert_eq!(
            pos, 5,
            "{op:?} completes after the 5 writes, before the reads: {done:?}"
        );
        assert!(done[..5].iter().all(|c| c.id < base + 100));
        for c in &done[6..] {
            let got = c.result.clone().unwrap().unwrap();
            assert!(
                got == model[..off],
                "a read behind the {op:?} sees every earlier write"
            );
        }
    }
}

#[test]
fn out_of_partition_requests_touch_nothing() {
    let (t, f) = device("bounds", 40 * MIB);
    let before = std::fs::read(&t.0).unwrap();
    let q = IoQueue::new(f.try_clone().unwrap(), parts(), Ordering::Relaxed, 2);
    q.submit(write(1, 0, 16 * MIB - 100, vec![1; 200]));
    q.submit(write(2, 1, u64::MAX - 10, vec![1; 200]));
    q.submit(write(3, 2, 0, vec![1; 10]));
    q.submit(IoRequest {
        id: 4,
        partition: 0,
        op: IoOp::Read {
            offset: 16 * MIB,
            len: 1,
        },
    });
    let mut done = collect(&q, 4);
    done.sort_by_key(|c| c.id);
    assert!(matches!(
        done[0].result,
        Err(IoError::OutOfRange { partition: 0, .. })
    ));
    assert!(matches!(
        done[1].result,
        Err(IoError::OutOfRange { partition: 1, .. })
    ));
    assert_eq!(done[2].result, Err(IoError::NoPartition(2)));
    assert!(matches!(done[3].result, Err(IoError::OutOfRange { .. })));
    drop(q);
    assert!(
        std::fs::read(&t.0).unwrap() == before,
        "the device is unchanged"
    );
}
