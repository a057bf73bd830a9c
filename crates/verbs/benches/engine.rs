//! Engine micro-benchmarks: STag lookup, CQ poll, posting RDMA Writes,
//! memory registration.
//!
//! `cargo bench -p softrdma-verbs --bench engine` (add
//! `-- --warm-up-time 1 --measurement-time 3` for a short run). Figures and
//! the exact command of the recorded run are in BENCHMARKS.md
//! ("Micro-benchmarks (criterion)").
//!
//! - `stag_lookup`: resolving an STag to its region as the receive path does
//!   for every tagged segment (`Device::bench_stag_lookup`, a hidden bench
//!   hook over the engine's STag table), with 1, 1,000 and 100,000
//!   registered regions; hits in a random order over all of them, and a miss
//!   (right index, wrong key). `stag_lookup_2_threads`: the same with a
//!   second thread looking up at the same time.
//! - `cq_poll`: `CompletionQueue::poll` of an empty CQ, and of 16 waiting
//!   completions. Those are produced by the engine's own completion path
//!   (a batch of 16 WRs posted to a QP in ERROR completes at once with
//!   flush status), outside the timed region.
//! - `post_send`: `post_send_batch` of 16 unsignaled 8-byte RDMA Writes on a
//!   connected loopback pair (the transmitter runs inline, so this includes
//!   composing the FPDUs and the `writev`).
//! - `register`: `alloc_mr` (allocate, zero, register, deregister, free) and
//!   `register` of a caller's buffer (registration only).

use criterion::{
    black_box, criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput,
};
use softrdma_verbs::*;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn device() -> Device {
    Device::open(DeviceConfig {
        publish: false,
        ..DeviceConfig::default()
    })
    .unwrap()
}

/// xorshift64: a cheap, fixed pseudo-random sequence.
fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed | 1;
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

/// STags of `n` small regions registered on `dev`, plus the regions.
fn regions(dev: &Device, n: usize) -> (ProtectionDomain, Vec<MemoryRegion>) {
    let pd = dev.alloc_pd().unwrap();
    let mrs = (0..n)
        .map(|_| {
            pd.register(vec![0u8; 64], Access::LOCAL_WRITE | Access::REMOTE_WRITE)
                .unwrap()
        })
        .collect();
    (pd, mrs)
}

/// 64 Ki STags drawn at random from `mrs` (a power of two, so the bench
/// loop indexes with a mask instead of a division).
const ORDER: usize = 1 << 16;
fn random_order(mrs: &[MemoryRegion]) -> Vec<Rkey> {
    let mut r = rng(0x9e37_79b9_7f4a_7c15);
    (0..ORDER)
        .map(|_| mrs[(r() % mrs.len() as u64) as usize].rkey())
        .collect()
}

fn stag_lookup(c: &mut Criterion) {
    let mut g = c.benchmark_group("stag_lookup");
    for n in [1usize, 1_000, 100_000] {
        let dev = device();
        let (_pd, mrs) = regions(&dev, n);
        let order = random_order(&mrs);
        let mut i = 0usize;
        g.bench_with_input(BenchmarkId::new("hit", n), &n, |b, _| {
            b.iter(|| {
                i = (i + 1) & (ORDER - 1);
                let hit = dev.bench_stag_lookup(black_box(order[i]));
                debug_assert!(hit);
                hit
            })
        });
        let wrong_key = Rkey::from_raw(mrs[n / 2].rkey().raw() ^ 0x5a);
        g.bench_with_input(BenchmarkId::new("miss_wrong_key", n), &n, |b, _| {
            b.iter(|| dev.bench_stag_lookup(black_box(wrong_key)))
        });
    }
    g.finish();

    // Two threads at once (the engine runs lookups on every progress thread
    // and on busy-polling application threads): every lookup takes the
    // table's read lock and a reference on the region, so both threads
    // write the lock word, and, for the same STag, the region's count.
    let mut g = c.benchmark_group("stag_lookup_2_threads");
    let dev = device();
    let (_pd, mrs) = regions(&dev, 1_000);
    for (name, other) in [("same_stag", mrs[0].rkey()), ("other_stag", mrs[1].rkey())] {
        let stop = Arc::new(AtomicBool::new(false));
        let bg = {
            let (dev, stop) = (dev.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    black_box(dev.bench_stag_lookup(black_box(other)));
                }
            })
        };
        let mine = mrs[0].rkey();
        g.bench_function(name, |b| b.iter(|| dev.bench_stag_lookup(black_box(mine))));
        stop.store(true, Ordering::Relaxed);
        bg.join().unwrap();
    }
    g.finish();
}

fn cq_poll(c: &mut Criterion) {
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(1 << 16).unwrap();
    let mut g = c.benchmark_group("cq_poll");
    let mut wcs = [WorkCompletion::default(); 16];
    g.bench_function("empty", |b| b.iter(|| cq.poll(black_box(&mut wcs))));

    // A QP in ERROR completes whatever is posted to it at once (flush), through
    // the same completion path as the transmitter: 16 * CHUNK completions are
    // produced untimed, then CHUNK polls of 16 are timed back to back.
    let qp = pd.create_qp(QpInitAttr::new(&cq)).unwrap();
    qp.modify(QpState::Error).unwrap();
    let wrs: Vec<SendWr> = (0..16)
        .map(|k| SendWr::write(k, &[], 0, Rkey::from_raw(0)))
        .collect();
    const CHUNK: u64 = 256;
    g.throughput(Throughput::Elements(16));
    g.bench_function("batch_of_16", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            let mut left = iters;
            while left > 0 {
                let k = left.min(CHUNK);
                for _ in 0..k {
                    qp.post_send_batch(&wrs).unwrap();
                }
                assert_eq!(cq.len(), 16 * k as usize);
                let t = Instant::now();
                for _ in 0..k {
                    black_box(cq.poll(black_box(&mut wcs)));
                }
                total += t.elapsed();
                assert!(cq.is_empty());
                left -= k;
            }
            total
        })
    });
    g.finish();
}

/// A connected loopback pair on one device: the client QP and its CQ, a
/// client source region, the server region it writes into.
struct Pair {
    qp: QueuePair,
    cq: CompletionQueue,
    src: MemoryRegion,
    remote: (u64, Rkey),
    _keep: Box<dyn std::any::Any>,
}

fn pair(dev: &Device, params: &ConnParams) -> Pair {
    let listener = dev.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let sdev = dev.clone();
    let server = std::thread::spawn(move || {
        let pd = sdev.alloc_pd().unwrap();
        let cq = sdev.create_cq(64).unwrap();
        let qp = pd.create_qp(QpInitAttr::new(&cq)).unwrap();
        let mr = pd
            .alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
        let req = listener.get_request().unwrap();
        req.accept(&qp, &ConnParams::default()).unwrap();
        (pd, cq, qp, mr)
    });
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4096).unwrap();
    let mut attr = QpInitAttr::new(&cq);
    attr.caps.max_send_wr = 4096;
    let qp = pd.create_qp(attr).unwrap();
    qp.connect(addr, params).unwrap();
    let s = server.join().unwrap();
    let src = pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let remote = (s.3.addr(), s.3.rkey());
    Pair {
        qp,
        cq,
        src,
        remote,
        _keep: Box::new((pd, s)),
    }
}

fn post_send(c: &mut Criterion) {
    let mut g = c.benchmark_group("post_send");
    g.throughput(Throughput::Elements(16));
    // Default connection (what a siw peer gets: one FPDU per TCP segment),
    // and with softrdma's extensions (FPDUs batched, as `softrdma bench`
    // uses between two softrdma ends).
    for (name, extensions) in [("default", false), ("extensions", true)] {
        let dev = device();
        let params = ConnParams {
            extensions,
            ..ConnParams::default()
        };
        let p = pair(&dev, &params);
        let sge = [p.src.sge(0, 8)];
        let write = |k: u64| SendWr::write(k, &sge, p.remote.0, p.remote.1);
        let unsignaled: Vec<SendWr> = (0..16).map(|k| write(k).unsignaled()).collect();
        // Every 16th batch ends with a signaled Write; waiting for its
        // completion retires the unsignaled ones before it and keeps the send
        // queue short.
        let mut closing = unsignaled.clone();
        closing[15] = write(15);
        g.bench_function(BenchmarkId::new("16_writes_8B_unsignaled", name), |b| {
            let mut n = 0u64;
            let mut wc = [WorkCompletion::default()];
            b.iter(|| {
                n = (n + 1) & 15;
                if n == 0 {
                    p.qp.post_send_batch(&closing).unwrap();
                    assert_eq!(p.cq.poll_wait(&mut wc, Duration::from_secs(5)), 1);
                    assert!(wc[0].is_ok(), "{:?}", wc[0]);
                } else {
                    p.qp.post_send_batch(&unsignaled).unwrap();
                }
            })
        });
    }
    g.finish();
}

fn register(c: &mut Criterion) {
    let dev = device();
    let pd = dev.alloc_pd().unwrap();
    let mut g = c.benchmark_group("register");
    for size in [4096usize, 1 << 20] {
        // Allocate (page-aligned, zeroed), register, deregister, free.
        g.bench_with_input(BenchmarkId::new("alloc_mr", size), &size, |b, &s| {
            b.iter(|| pd.alloc_mr(s, Access::LOCAL_WRITE).unwrap())
        });
    }
    // Registration of a caller's buffer alone: the buffer is made and the
    // region dropped (deregistered) outside the timed part.
    g.bench_function(BenchmarkId::new("register_vec", 4096), |b| {
        b.iter_batched(
            || vec![0u8; 4096],
            |v| pd.register(v, Access::LOCAL_WRITE).unwrap(),
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, stag_lookup, cq_poll, post_send, register);
criterion_main!(benches);
