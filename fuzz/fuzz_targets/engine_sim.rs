//! The real engine, as initiator or as responder, fed arbitrary byte
//! streams in arbitrary segmentations over a simulated connection
//! (`softrdma_verbs::sim`, issue 19). Unlike `engine_stream`, which goes
//! through loopback TCP, this runs on the fuzzer's thread with no socket:
//! deterministic (a finding replays exactly) and thousands of inputs a
//! second, and it can play the peer of an initiator, which has Reads,
//! atomics and Sends outstanding whose answers the input forges.
//!
//! Input: byte 0 = flags (bit 0 CRC, bit 1 initiator, bit 2 MPA revision
//! 1, bits 3-4 peer-to-peer RTR none/Write/Read, bit 5 large segments,
//! bit 6 the peer never reads what the engine sends), byte 1 = the
//! segmentation seed, the rest = the peer's byte stream.
//!
//! The engine's QP has a region with a fixed STag at a fixed address
//! (all remote rights) and a receive region, both between guard bytes. As
//! initiator it has posted, before the stream starts, a Read into the
//! receive region, a Write, a Send, a Fetch-and-Add and a Compare-and-Swap.
//!
//! Checked: no panic; after every chunk, the connection's own buffers
//! (`sim::conn_memory`) stay under a bound that does not grow with the
//! input; after the peer's end of stream the QP is in ERROR (the engine
//! ended the connection: a Terminate or a disconnect, never a hang); every
//! posted work request, send and receive, completed exactly once; and no
//! byte outside the two regions changed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use softrdma_verbs::sim::{self, Rtr, SimParams};
use softrdma_verbs::*;
use std::sync::OnceLock;

#[path = "common/regions.rs"]
mod regions;
use regions::{Guarded, IOVA, LEN, STAG};

/// Most bytes a connection may hold in its own buffers, whatever the
/// peer sends: the 64 KiB receive stage, one composed batch (1 MiB) and
/// queued responses bounded by the IRD.
const MEMORY_BOUND: usize = 2 << 20;

struct Env {
    pd: ProtectionDomain,
    dev: Device,
    target: Guarded,
    recv: Guarded,
    rmr: MemoryRegion,
    _tmr: MemoryRegion,
}

fn env() -> &'static Env {
    static ENV: OnceLock<Env> = OnceLock::new();
    ENV.get_or_init(|| {
        let dev = Device::open_default().unwrap();
        let pd = dev.alloc_pd().unwrap();
        let (target, recv, tmr, rmr) = regions::register(&pd);
        Env {
            pd,
            dev,
            target,
            recv,
            rmr,
            _tmr: tmr,
        }
    })
}

fuzz_target!(|data: &[u8]| {
    if data.len() < 2 {
        return;
    }
    let e = env();
    let flags = data[0];
    let initiator = flags & 2 != 0;
    let revision = if flags & 4 != 0 { 1 } else { 2 };
    let params = SimParams {
        revision,
        crc: flags & 1 != 0,
        rtr: match (flags >> 3) & 3 {
            1 => Some(Rtr::Write),
            2 => Some(Rtr::Read),
            _ => None,
        },
        initiator_ird: 4,
        responder_ird: 4,
        rfc7306: true,
        large_segments: flags & 0x20 != 0,
        seg: 1460,
        cap: 64 * 1024,
        max_read: 1 << 20,
        seed: data[1] as u64 + 1,
    };
    let never_read = flags & 0x40 != 0;
    let mut seed = data[1] as u32 | 0x100;
    let stream = &data[2..];

    let cq = e.dev.create_cq(256).unwrap();
    let qp = e.pd.create_qp(QpInitAttr::new(&cq)).unwrap();
    qp.modify(QpState::Init).unwrap();
    let mut posted = 0usize;
    for i in 0..4u64 {
        let sge = e.rmr.sge(i as usize * (LEN / 4), LEN / 4);
        qp.post_recv(&RecvWr::new(100 + i, &[sge])).unwrap();
        posted += 1;
    }
    let pipe = sim::attach(&qp, initiator, &params).unwrap();
    if initiator {
        // Work whose answers the peer forges. (The Read's sink is the
        // last receive buffer: what lands there is not checked, only that
        // nothing lands outside the region.)
        let q = LEN / 4;
        let wrs = [
            SendWr::read(1, e.rmr.sge(3 * q, q), IOVA, Rkey::from_raw(STAG)),
            SendWr::write(2, &[e.rmr.sge(0, 64)], IOVA + 64, Rkey::from_raw(STAG)),
            SendWr::send(3, &[e.rmr.sge(0, 32)]),
            SendWr::fetch_add(4, e.rmr.sge(8, 8), IOVA, Rkey::from_raw(STAG), 1),
            SendWr::cmp_swap(5, e.rmr.sge(16, 8), IOVA + 8, Rkey::from_raw(STAG), 0, 7),
        ];
        for wr in &wrs {
            qp.post_send(wr).unwrap();
            posted += 1;
        }
    }

    // The engine's own output (the RTR, requests) before the peer speaks.
    let run = |pipe: &std::sync::Arc<softrdma_verbs::pipe::Pipe>| {
        for _ in 0..64 {
            let r = pipe.ready(0);
            let mut moved = false;
            if r.input {
                while sim::on_readable(&qp, 64) {}
                moved = true;
            }
            if r.output {
                sim::on_writable(&qp);
                moved = true;
            }
            if r.timer && pipe.take_timer(0) {
                sim::on_timer(&qp);
                moved = true;
            }
            if !never_read {
                pipe.take_sent(0);
            }
            let mem = sim::conn_memory(&qp);
            assert!(mem <= MEMORY_BOUND, "the connection holds {mem} bytes");
            if !moved {
                break;
            }
        }
    };
    run(&pipe);

    // The stream, in chunks of sizes the seed picks (1 byte to 2 KiB).
    let mut rest = stream;
    while !rest.is_empty() && !pipe.is_closed(0) {
        seed ^= seed << 13;
        seed ^= seed >> 17;
        seed ^= seed << 5;
        let n = match seed % 4 {
            0 => 1 + (seed >> 8) as usize % 7,
            1 => 1 + (seed >> 8) as usize % 64,
            _ => 1 + (seed >> 8) as usize % 2048,
        }
        .min(rest.len());
        pipe.inject(1, &rest[..n]);
        rest = &rest[n..];
        run(&pipe);
    }
    pipe.shutdown_write(1);
    run(&pipe);
    pipe.take_sent(0);
    run(&pipe);
    assert_eq!(
        qp.state(),
        QpState::Error,
        "the engine did not end the connection after the peer's end of stream"
    );
    let mut done = 0;
    while let Some(_wc) = cq.poll_one() {
        done += 1;
    }
    assert_eq!(
        done, posted,
        "every posted work request completes exactly once"
    );
    drop(qp);
    assert!(
        e.target.guards_intact(),
        "bytes written outside the target region"
    );
    assert!(
        e.recv.guards_intact(),
        "bytes written outside the receive region"
    );
});
