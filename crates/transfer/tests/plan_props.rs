//! The planner against a model: random buffer chains, remote ranges
//! (some contiguous, so they merge) and limits; every byte of every
//! transfer is moved exactly once, to the right remote offset, by a WR of
//! the transfer's kind and rkey; no WR exceeds a limit (Reads their own
//! SGE limit); the WRs planned are the WRs announced, in all and per
//! transfer. Reads coalesce as Writes do: under equal SGE limits a queue
//! of Reads is planned into exactly the WRs the same queue of Writes gets.

use proptest::prelude::*;
use softrdma_transfer::{plan, Limits, Op, Planner, Transfer};
use softrdma_verbs::Sge;
use std::collections::HashMap;

#[derive(Debug, Clone)]
struct Case {
    limits: Limits,
    transfers: Vec<Transfer>,
}

/// Buffers are laid out in a local address space, with a gap or not
/// (adjacent buffers under one lkey may share an SGE); remote ranges follow
/// the previous transfer's (a merge candidate) or jump.
fn case() -> impl Strategy<Value = Case> {
    let limits = (1u32..600, 1usize..6, 1usize..6, 1usize..5).prop_map(
        |(max_msg, max_sge, max_sge_rd, slots)| Limits {
            max_msg,
            max_sge,
            max_sge_rd,
            slots,
        },
    );
    let transfer = (
        any::<bool>(),
        prop::collection::vec((0u32..300, any::<bool>(), 0u32..2), 0..8),
        any::<bool>(),
        0u32..2,
    );
    (limits, prop::collection::vec(transfer, 0..12)).prop_map(|(limits, ts)| {
        let mut local = 0x1000u64;
        let mut remote = 0x10_0000u64;
        let transfers = ts
            .into_iter()
            .map(|(read, bufs, contiguous, rkey)| {
                if !contiguous {
                    remote += 4096;
                }
                let sgl: Vec<Sge> = bufs
                    .into_iter()
                    .map(|(len, gap, lkey)| {
                        if gap {
                            local += 64;
                        }
                        let s = Sge {
                            addr: local,
                            length: len,
                            lkey: softrdma_verbs::Lkey::from_raw(100 + lkey),
                        };
                        local += len as u64;
                        s
                    })
                    .collect();
                let t = Transfer {
                    op: if read { Op::Read } else { Op::Write },
                    local: sgl,
                    remote_addr: remote,
                    rkey: 7 + rkey,
                };
                remote += t.len();
                t
            })
            .collect();
        Case { limits, transfers }
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]
    #[test]
    fn every_byte_once_within_limits(c in case()) {
        // Local byte -> (transfer, offset in it).
        let mut owner: HashMap<(softrdma_verbs::Lkey, u64), (usize, u64)> = HashMap::new();
        for (i, t) in c.transfers.iter().enumerate() {
            let mut off = 0;
            for s in &t.local {
                for b in 0..s.length as u64 {
                    owner.insert((s.lkey, s.addr + b), (i, off));
                    off += 1;
                }
            }
        }
        let p = Planner::new(c.limits, c.transfers.clone());
        let (total, need) = p.announced();
        let need = need.to_vec();
        let wrs = plan(c.limits, c.transfers.clone());
        prop_assert_eq!(wrs.len(), total);
        let mut moved: HashMap<(usize, u64), usize> = HashMap::new();
        let mut per = vec![0usize; c.transfers.len()];
        for w in &wrs {
            prop_assert!(w.len >= 1 && w.len <= c.limits.max_msg as u64);
            let max_sge = if w.op == Op::Read { c.limits.max_sge_rd } else { c.limits.max_sge };
            prop_assert!(!w.sgl.is_empty() && w.sgl.len() <= max_sge);
            prop_assert_eq!(w.len, w.sgl.iter().map(|s| s.length as u64).sum::<u64>());
            prop_assert_eq!(w.parts.iter().map(|p| p.bytes).sum::<u64>(), w.len);
            let mut remote = w.remote_addr;
            for s in &w.sgl {
                for b in 0..s.length as u64 {
                    let (t, off) = owner[&(s.lkey, s.addr + b)];
                    let tr = &c.transfers[t];
                    prop_assert_eq!(remote, tr.remote_addr + off, "byte {} of transfer {}", off, t);
                    prop_assert_eq!((w.op, w.rkey), (tr.op, tr.rkey));
                    *moved.entry((t, off)).or_default() += 1;
                    remote += 1;
                }
            }
            for part in &w.parts {
                per[part.transfer] += 1;
            }
        }
        prop_assert_eq!(moved.len(), owner.len(), "every byte moved");
        prop_assert!(moved.values().all(|&n| n == 1), "exactly once");
        prop_assert_eq!(per, need);
    }

    #[test]
    fn reads_coalesce_like_writes(c in case()) {
        let as_op = |op| {
            c.transfers
                .iter()
                .map(|t| Transfer { op, ..t.clone() })
                .collect::<Vec<_>>()
        };
        let l = Limits { max_sge_rd: c.limits.max_sge, ..c.limits };
        let reads = plan(l, as_op(Op::Read));
        let writes = plan(l, as_op(Op::Write));
        prop_assert_eq!(reads.len(), writes.len());
        for (r, w) in reads.iter().zip(&writes) {
            prop_assert_eq!(r.op, Op::Read);
            prop_assert_eq!((&r.sgl, r.remote_addr, r.rkey, &r.parts), (&w.sgl, w.remote_addr, w.rkey, &w.parts));
        }
    }
}

fn sge(addr: u64, length: u32) -> Sge {
    Sge {
        addr,
        length,
        lkey: softrdma_verbs::Lkey::from_raw(1),
    }
}

/// 4,096 separate 64-byte Writes to contiguous remote memory, from
/// scattered local buffers: merged into WRs of 32 SGEs (the device's SGE
/// limit), 128 WRs instead of 4,096.
#[test]
fn contiguous_small_writes_merge() {
    let ts: Vec<Transfer> = (0..4096u64)
        .map(|i| Transfer {
            op: Op::Write,
            local: vec![sge(0x10000 + i * 128, 64)],
            remote_addr: 0x900000 + i * 64,
            rkey: 5,
        })
        .collect();
    let l = Limits {
        max_msg: 4 << 20,
        max_sge: 32,
        max_sge_rd: 1,
        slots: 16,
    };
    let wrs = plan(l, ts);
    assert_eq!(wrs.len(), 128);
    assert!(wrs
        .iter()
        .all(|w| w.sgl.len() == 32 && w.len == 2048 && w.parts.len() == 32));
}

/// 4,096 separate 64-byte Reads of contiguous remote memory into
/// scattered local buffers, within this device's limits: merged into WRs
/// of `max_sge_rd` SGEs, at most a tenth of the WRs (issue 29). Every
/// buffer is filled once, in order, from the right remote offset.
#[test]
fn contiguous_small_reads_merge_within_the_device_limits() {
    let dev = softrdma_verbs::Device::open_default().unwrap();
    let l = Limits::of_device(&dev, 16);
    assert_eq!(l.max_sge_rd as u32, dev.attr().max_sge_rd);
    let ts: Vec<Transfer> = (0..4096u64)
        .map(|i| Transfer {
            op: Op::Read,
            local: vec![sge(0x10000 + i * 128, 64)],
            remote_addr: 0x900000 + i * 64,
            rkey: 5,
        })
        .collect();
    let wrs = plan(l, ts);
    assert!(
        wrs.len() <= 4096 / 10,
        "{} Read WRs for 4,096 Reads",
        wrs.len()
    );
    assert_eq!(wrs.len(), 4096usize.div_ceil(l.max_sge_rd));
    let mut next = 0u64;
    for w in &wrs {
        assert!(w.op == Op::Read && w.sgl.len() <= l.max_sge_rd);
        assert_eq!(w.remote_addr, 0x900000 + next * 64);
        for s in &w.sgl {
            assert_eq!((s.addr, s.length), (0x10000 + next * 128, 64));
            next += 1;
        }
    }
    assert_eq!(next, 4096);
}

/// Adjacent local buffers share an SGE; a buffer larger than the message
/// limit is divided; Reads and Writes, or different rkeys, never merge.
#[test]
fn divide_extend_and_no_false_merges() {
    let l = Limits {
        max_msg: 4 << 20,
        max_sge: 4,
        max_sge_rd: 1,
        slots: 16,
    };
    let one = Transfer {
        op: Op::Write,
        local: vec![sge(0, 5 << 20), sge(5 << 20, 5 << 20)],
        remote_addr: 0,
        rkey: 1,
    };
    let wrs = plan(l, vec![one]);
    assert_eq!(
        wrs.iter().map(|w| w.len).collect::<Vec<_>>(),
        [4 << 20, 4 << 20, 2 << 20]
    );
    assert!(
        wrs.iter().all(|w| w.sgl.len() == 1),
        "adjacent buffers share an SGE"
    );
    let a = Transfer {
        op: Op::Write,
        local: vec![sge(0, 10)],
        remote_addr: 0,
        rkey: 1,
    };
    let mut b = a.clone();
    b.remote_addr = 10;
    b.local = vec![sge(100, 10)];
    b.op = Op::Read;
    let mut c = b.clone();
    c.op = Op::Write;
    c.rkey = 2;
    assert_eq!(plan(l, vec![a, b, c]).len(), 3);
}
