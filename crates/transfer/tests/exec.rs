//! The executor on a real connected pair (iWARP over loopback TCP): random
//! transfers, Writes then Reads back into other buffers, with few slots
//! and small messages so that WRs are divided, coalesced and merged (Reads
//! too: several local SGEs per Read WR); every byte checked, nothing
//! written outside the buffers, each transfer reported exactly once, the
//! WRs posted equal to the WRs announced.

use softrdma_transfer::{exec, plan, Limits, Op, Planner, Transfer};
use softrdma_verbs::*;
use std::time::Duration;

fn pair(
    dev: &Device,
) -> (
    ProtectionDomain,
    CompletionQueue,
    QueuePair,
    ProtectionDomain,
    QueuePair,
) {
    let l = dev.listen("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let spd = dev.alloc_pd().unwrap();
    let scq = dev.create_cq(16).unwrap();
    let sqp = spd.create_qp(QpInitAttr::new(&scq)).unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(1024).unwrap();
    let mut a = QpInitAttr::new(&cq);
    a.caps.max_send_sge = 8;
    let qp = pd.create_qp(a).unwrap();
    std::thread::scope(|s| {
        s.spawn(|| {
            l.get_request()
                .unwrap()
                .accept(&sqp, &ConnParams::default())
                .unwrap()
        });
        qp.connect(addr, &ConnParams::default()).unwrap();
    });
    std::mem::forget(scq);
    (pd, cq, qp, spd, sqp)
}

#[test]
fn random_transfers_move_every_byte_and_report_once() {
    let dev = Device::open_default().unwrap();
    let (pd, cq, qp, spd, _sqp) = pair(&dev);
    let mut x = 12345u64;
    let mut rnd = move |m: u64| {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x % m
    };
    let src = pd.alloc_mr(1 << 20, Access::LOCAL_WRITE).unwrap();
    let dst = pd.alloc_mr(1 << 20, Access::LOCAL_WRITE).unwrap();
    let pat: Vec<u8> = (0..1 << 20).map(|i: usize| (i * 13 + 1) as u8).collect();
    src.write_at(0, &pat);
    let remote = spd
        .alloc_mr(1 << 20, Access::REMOTE_WRITE | Access::REMOTE_READ)
        .unwrap();
    let mut scattered_reads = 0;
    for round in 0..20 {
        // Transfers: chains of 1-6 buffers (1-3000 bytes, some adjacent),
        // remote ranges back to back or apart.
        let mut ts = Vec::new();
        let (mut l, mut r) = (0u64, 0u64);
        for _ in 0..1 + rnd(30) {
            if rnd(3) == 0 {
                r += rnd(5000);
            }
            let mut sgl = Vec::new();
            for _ in 0..1 + rnd(6) {
                if rnd(2) == 0 {
                    l += rnd(100);
                }
                let n = 1 + rnd(3000);
                if l + n > 1 << 20 || r + n > 1 << 20 {
                    break;
                }
                sgl.push(src.sge(l as usize, n as usize));
                l += n;
            }
            let t = Transfer {
                op: Op::Write,
                local: sgl,
                remote_addr: remote.addr() + r,
                rkey: remote.rkey().raw(),
            };
            r += t.len();
            ts.push(t);
        }
        let limits = Limits {
            max_msg: 1 + rnd(9000) as u32,
            max_sge: 1 + rnd(8) as usize,
            max_sge_rd: 1 + rnd(8) as usize,
            slots: 1 + rnd(6) as usize,
        };
        let planner = Planner::new(limits, ts.clone());
        let announced = planner.announced().0;
        let mut reported = vec![0; ts.len()];
        let st = exec::run(&qp, &cq, planner, Duration::from_secs(20), |i| {
            reported[i] += 1
        })
        .unwrap();
        assert_eq!(st.wrs, announced, "round {round}");
        assert!(
            reported.iter().all(|&n| n == 1),
            "round {round}: {reported:?}"
        );
        // A Write's completion means sent, not placed: a Flush (a
        // zero-length Read, answered after every earlier Write is placed)
        // before looking at the remote memory.
        exec::flush(
            &qp,
            &cq,
            remote.addr(),
            remote.rkey().raw(),
            Duration::from_secs(20),
        )
        .unwrap();
        let image = remote.to_vec();
        for t in &ts {
            let mut at = (t.remote_addr - remote.addr()) as usize;
            for s in &t.local {
                let o = (s.addr - src.addr()) as usize;
                assert!(
                    image[at..at + s.length as usize] == pat[o..o + s.length as usize],
                    "round {round}: write"
                );
                at += s.length as usize;
            }
        }
        // Read everything back into the same offsets of `dst`.
        let back: Vec<Transfer> = ts
            .iter()
            .map(|t| Transfer {
                op: Op::Read,
                local: t
                    .local
                    .iter()
                    .map(|s| dst.sge((s.addr - src.addr()) as usize, s.length as usize))
                    .collect(),
                ..t.clone()
            })
            .collect();
        // The sinks start as a sentinel: bytes no Read may touch keep it.
        dst.write_at(0, &vec![SENTINEL; 1 << 20]);
        scattered_reads += plan(limits, back.clone())
            .iter()
            .filter(|w| w.sgl.len() > 1)
            .count();
        let mut n = 0;
        let st = exec::run(
            &qp,
            &cq,
            Planner::new(limits, back.clone()),
            Duration::from_secs(20),
            |_| n += 1,
        )
        .unwrap();
        assert_eq!(n, back.len());
        assert_eq!(st.wrs, Planner::new(limits, back).announced().0);
        let got = dst.to_vec();
        let mut want = vec![SENTINEL; 1 << 20];
        for t in &ts {
            for s in &t.local {
                let o = (s.addr - src.addr()) as usize;
                want[o..o + s.length as usize].copy_from_slice(&pat[o..o + s.length as usize]);
            }
        }
        if let Some(at) = got.iter().zip(&want).position(|(a, b)| a != b) {
            panic!(
                "round {round}: read: byte {at} is {:#x}, want {:#x}",
                got[at], want[at]
            );
        }
    }
    assert!(
        scattered_reads > 20,
        "only {scattered_reads} Read WRs had several SGEs"
    );
}

const SENTINEL: u8 = 0xEE;
