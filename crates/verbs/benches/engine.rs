//! Engine micro-benchmarks: STag lookup, CQ poll, posting Writes, and
//! memory registration.
//!
//! `cargo bench -p softrdma-verbs --bench engine` (add
//! `-- --warm-up-time 1 --measurement-time 3` for a short run). Figures
//! are in BENCHMARKS.md.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion};
use softrdma_verbs::*;
use std::time::{Duration, Instant};

/// A connected loopback pair on one device: (client QP, its CQ, server
/// region the client may write, keep-alive of everything else).
struct Pair {
    qp: QueuePair,
    cq: CompletionQueue,
    pd: ProtectionDomain,
    remote: (u64, u32),
    _keep: Box<dyn std::any::Any>,
}

fn pair(dev: &Device) -> Pair {
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
    let cq = dev.create_cq(1 << 16).unwrap();
    let mut attr = QpInitAttr::new(&cq);
    attr.caps.max_send_wr = 4096;
    let qp = pd.create_qp(attr).unwrap();
    qp.connect(addr, &ConnParams::default()).unwrap();
    let s = server.join().unwrap();
    let remote = (s.3.addr(), s.3.rkey());
    Pair {
        qp,
        cq,
        pd,
        remote,
        _keep: Box::new(s),
    }
}

fn stag_lookup(c: &mut Criterion) {
    let mut g = c.benchmark_group("stag_lookup");
    for n in [1usize, 1_000, 10_000] {
        let dev = Device::open(DeviceConfig {
            publish: false,
            ..DeviceConfig::default()
        })
        .unwrap();
        let pd = dev.alloc_pd().unwrap();
        let mrs: Vec<MemoryRegion> = (0..n)
            .map(|_| pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap())
            .collect();
        let stags: Vec<u32> = mrs.iter().map(|m| m.lkey()).collect();
        let mut i = 0usize;
        g.bench_with_input(BenchmarkId::new("hit", n), &n, |b, _| {
            b.iter(|| {
                i = (i + 7919) % stags.len();
                black_box(dev.bench_stag_lookup(black_box(stags[i])))
            })
        });
        let wrong_key = stags[0] ^ 0xff;
        g.bench_with_input(BenchmarkId::new("wrong_key", n), &n, |b, _| {
            b.iter(|| black_box(dev.bench_stag_lookup(black_box(wrong_key))))
        });
    }
    g.finish();
}

fn cq_poll(c: &mut Criterion) {
    let dev = Device::open(DeviceConfig {
        publish: false,
        ..DeviceConfig::default()
    })
    .unwrap();
    let p = pair(&dev);
    let src = p.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let mut g = c.benchmark_group("cq_poll");
    let mut wcs = vec![WorkCompletion::default(); 16];
    g.bench_function("empty", |b| b.iter(|| black_box(p.cq.poll(&mut wcs))));
    // 16 completions of zero-byte Writes wait in the CQ; only the poll
    // that takes them is timed.
    g.bench_function("batch_of_16", |b| {
        b.iter_custom(|iters| {
            let mut total = Duration::ZERO;
            for _ in 0..iters {
                let wrs: Vec<SendWr> = (0..16)
                    .map(|k| SendWr::write(k, &[src.sge(0, 0)], p.remote.0, p.remote.1))
                    .collect();
                p.qp.post_send_batch(&wrs).unwrap();
                while p.cq.len() < 16 {
                    std::hint::spin_loop();
                }
                let t = Instant::now();
                let n = p.cq.poll(&mut wcs);
                total += t.elapsed();
                assert_eq!(n, 16);
            }
            total
        })
    });
    g.finish();
}

fn post_writes(c: &mut Criterion) {
    let dev = Device::open(DeviceConfig {
        publish: false,
        ..DeviceConfig::default()
    })
    .unwrap();
    let p = pair(&dev);
    let src = p.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let mut g = c.benchmark_group("post_send");
    g.throughput(criterion::Throughput::Elements(16));
    // 16 unsignaled 8-byte Writes per doorbell, every 16th batch closed by
    // a signaled one whose completion retires them all (waited for).
    g.bench_function("16_writes_8B", |b| {
        let mut n = 0u64;
        let mut wc = [WorkCompletion::default()];
        b.iter(|| {
            n += 1;
            let last_signaled = n.is_multiple_of(16);
            let wrs: Vec<SendWr> = (0..16)
                .map(|k| {
                    let wr = SendWr::write(k, &[src.sge(0, 8)], p.remote.0, p.remote.1);
                    if last_signaled && k == 15 {
                        wr
                    } else {
                        wr.unsignaled()
                    }
                })
                .collect();
            p.qp.post_send_batch(&wrs).unwrap();
            if last_signaled {
                assert_eq!(p.cq.poll_wait(&mut wc, Duration::from_secs(5)), 1);
            }
        })
    });
    g.finish();
}

fn registration(c: &mut Criterion) {
    let dev = Device::open(DeviceConfig {
        publish: false,
        ..DeviceConfig::default()
    })
    .unwrap();
    let pd = dev.alloc_pd().unwrap();
    let mut g = c.benchmark_group("alloc_mr");
    for size in [4096usize, 1 << 20] {
        g.bench_with_input(BenchmarkId::from_parameter(size), &size, |b, &s| {
            b.iter(|| black_box(pd.alloc_mr(s, Access::LOCAL_WRITE).unwrap()))
        });
    }
    g.finish();
}

criterion_group!(benches, stag_lookup, cq_poll, post_writes, registration);
criterion_main!(benches);
