//! RDMA Reads into several local SGEs (issue 29, finding 5). An iWARP
//! Read Request names one data sink (STag, TO), so the engine binds a
//! fresh STag over the scatter list, names it in the request and frees it
//! when the WR leaves the send queue. Checked here: every byte lands in
//! its SGE (distinct patterns, SGEs in different regions, out of address
//! order, boundaries inside FPDUs) and nothing around them changes, over
//! iWARP/TCP in each MPA mode, the same-host transport and the local
//! transport; a refused SGE gets the error a single-SGE Read gets; the
//! binding exists while the Read is outstanding, is gone after it
//! completes, fails or is flushed, and grants the peer nothing.

mod common;
use common::*;
use softrdma_verbs::pipe::Pipe;
use softrdma_verbs::sim::{self, SimParams};
use softrdma_verbs::*;

const SENTINEL: u8 = 0xEE;

fn read_wr(wr_id: u64, sgl: Vec<Sge>, remote_addr: u64, rkey: Rkey) -> SendWr {
    SendWr {
        wr_id,
        op: WrOp::RdmaRead { remote_addr, rkey },
        sgl,
        flags: SendFlags::SIGNALED,
    }
}

/// The scatter list of the tests: pieces of two regions `a` and `b`, out
/// of address order, from 1 byte to 100 KiB (so SGE boundaries fall inside
/// FPDUs and FPDUs span several SGEs).
fn pieces() -> Vec<(bool, usize, usize)> {
    vec![
        (false, 100, 5000),
        (true, 7, 70_000),
        (false, 20_000, 1),
        (true, 80_000, 64),
        (false, 30_000, 100_000),
        (true, 90_000, 3),
    ]
}

/// Remote bytes: a pattern that differs at every position that matters.
fn remote_pattern(n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).rotate_left(7) as u8 ^ (i >> 8) as u8)
        .collect()
}

/// Posts one Read of `remote[off..]` into [`pieces`] of `a` and `b`
/// (filled with the sentinel first), waits for it, and checks every byte
/// of both regions: each SGE holds its share of the remote bytes, in SGE
/// order, and everything else still holds the sentinel.
fn read_into_pieces(
    qp: &QueuePair,
    cq: &CompletionQueue,
    a: &MemoryRegion,
    b: &MemoryRegion,
    remote: &MemoryRegion,
    off: usize,
    what: &str,
) {
    a.write_at(0, &vec![SENTINEL; a.len()]);
    b.write_at(0, &vec![SENTINEL; b.len()]);
    let ps = pieces();
    let sgl: Vec<Sge> = ps
        .iter()
        .map(|&(in_b, at, len)| if in_b { b.sge(at, len) } else { a.sge(at, len) })
        .collect();
    let total: usize = ps.iter().map(|p| p.2).sum();
    qp.post_send(&read_wr(7, sgl, remote.addr() + off as u64, remote.rkey()))
        .unwrap();
    let wc = wait(cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len as usize),
        (7, WcStatus::Success, WcOpcode::RdmaRead, total),
        "{what}"
    );
    let src = remote.to_vec();
    let mut want_a = vec![SENTINEL; a.len()];
    let mut want_b = vec![SENTINEL; b.len()];
    let mut at_remote = off;
    for &(in_b, at, len) in &ps {
        let w = if in_b { &mut want_b } else { &mut want_a };
        w[at..at + len].copy_from_slice(&src[at_remote..at_remote + len]);
        at_remote += len;
    }
    for (name, got, want) in [("a", a.to_vec(), want_a), ("b", b.to_vec(), want_b)] {
        if got != want {
            let at = got.iter().zip(&want).position(|(x, y)| x != y).unwrap();
            panic!(
                "{what}: region {name} byte {at}: got {:#x}, want {:#x}",
                got[at], want[at]
            );
        }
    }
}

fn caps32() -> QpCaps {
    QpCaps {
        max_send_sge: 32,
        ..QpCaps::default()
    }
}

/// Fast-register bindings of protection domain `pd` in the device's STag
/// table (a multi-SGE Read's sink binding is one).
fn bindings(dev: &Device, pd: &ProtectionDomain) -> usize {
    dev.info()
        .mrs
        .iter()
        .filter(|m| m.fast_reg && m.pd == pd.id())
        .count()
}

#[test]
fn scattered_read_lands_each_byte_in_its_sge_over_tcp() {
    let modes = [
        ConnParams::default(),
        ConnParams {
            crc: true,
            ..Default::default()
        },
        ConnParams {
            mpa_revision: 1,
            ..Default::default()
        },
        // softrdma's extensions (large segments) without the same-host
        // transport.
        ConnParams {
            extensions: true,
            ..Default::default()
        },
    ];
    for p in modes {
        let dev = Device::open(DeviceConfig {
            same_host: false,
            ..Default::default()
        })
        .unwrap();
        let (c, s) = pair_caps(&dev, &dev, p.clone(), p.clone(), caps32(), |_| {});
        let n = 300 << 10;
        let remote =
            s.pd.alloc_mr(n, Access::LOCAL_WRITE | Access::REMOTE_READ)
                .unwrap();
        remote.write_at(0, &remote_pattern(n));
        let a = c.pd.alloc_mr(200 << 10, Access::LOCAL_WRITE).unwrap();
        let b = c.pd.alloc_mr(100 << 10, Access::LOCAL_WRITE).unwrap();
        for off in [0, 333] {
            read_into_pieces(&c.qp, &c.cq, &a, &b, &remote, off, &format!("{p:?}"));
        }
        assert_eq!(bindings(&dev, &c.pd), 0, "binding freed after completion");
        // 32 SGEs of 64 bytes, every other 64 bytes of a region: one WR.
        let l = c.pd.alloc_mr(64 * 64, Access::LOCAL_WRITE).unwrap();
        l.write_at(0, &[SENTINEL; 64 * 64]);
        let sgl: Vec<Sge> = (0..32).map(|i| l.sge(i * 128, 64)).collect();
        c.qp.post_send(&read_wr(8, sgl, remote.addr() + 64, remote.rkey()))
            .unwrap();
        assert_eq!(wait(&c.cq).status, WcStatus::Success);
        let got = l.to_vec();
        let src = remote.to_vec();
        for i in 0..32 {
            assert_eq!(
                got[i * 128..i * 128 + 64],
                src[64 + i * 64..128 + i * 64],
                "{p:?}: SGE {i}"
            );
            assert!(got[i * 128 + 64..i * 128 + 128]
                .iter()
                .all(|&x| x == SENTINEL));
        }
    }
}

/// The same over the same-host transport (copied straight from the peer's
/// memory) and the local transport (a region of the QP's own device).
#[test]
fn scattered_read_on_same_host_and_local_transports() {
    let dev = Device::open(DeviceConfig {
        same_host: true,
        ..Default::default()
    })
    .unwrap();
    let p = ConnParams {
        extensions: true,
        ..Default::default()
    };
    let (c, s) = pair_caps(&dev, &dev, p.clone(), p, caps32(), |_| {});
    assert!(c.qp.conn_params().unwrap().same_host, "same-host transport");
    let n = 300 << 10;
    let remote =
        s.pd.alloc_mr(n, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
    remote.write_at(0, &remote_pattern(n));
    let a = c.pd.alloc_mr(200 << 10, Access::LOCAL_WRITE).unwrap();
    let b = c.pd.alloc_mr(100 << 10, Access::LOCAL_WRITE).unwrap();
    read_into_pieces(&c.qp, &c.cq, &a, &b, &remote, 11, "same-host");

    let l = side(&dev, caps32());
    l.qp.connect_local().unwrap();
    let target =
        l.pd.alloc_mr(n, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
    target.write_at(0, &remote_pattern(n));
    let a = l.pd.alloc_mr(200 << 10, Access::LOCAL_WRITE).unwrap();
    let b = l.pd.alloc_mr(100 << 10, Access::LOCAL_WRITE).unwrap();
    read_into_pieces(&l.qp, &l.cq, &a, &b, &target, 5, "local");
}

/// An SGE the Read may not write into fails the WR as it does with one
/// SGE: a bad lkey, or a region without local write, is `LocProtErr`; the
/// other SGEs' bytes are not touched and no binding is left behind.
#[test]
fn a_refused_sge_fails_the_read() {
    let dev = Device::open(DeviceConfig {
        same_host: false,
        ..Default::default()
    })
    .unwrap();
    let ro = |pd: &ProtectionDomain| pd.alloc_mr(4096, Access::REMOTE_READ).unwrap();
    for case in ["bad lkey", "no local write", "outside its region"] {
        let (c, s) = pair_caps(
            &dev,
            &dev,
            ConnParams::default(),
            ConnParams::default(),
            caps32(),
            |_| {},
        );
        let remote =
            s.pd.alloc_mr(8192, Access::LOCAL_WRITE | Access::REMOTE_READ)
                .unwrap();
        remote.write_at(0, &remote_pattern(8192));
        let a = c.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
        a.write_at(0, &[SENTINEL; 4096]);
        let readonly = ro(&c.pd);
        let second = match case {
            "bad lkey" => Sge {
                addr: a.addr(),
                length: 100,
                lkey: Lkey::from_raw(a.lkey().raw() ^ 0x5500),
            },
            "no local write" => readonly.sge(0, 100),
            _ => Sge {
                addr: a.addr() + 4000,
                length: 200,
                lkey: a.lkey(),
            },
        };
        c.qp.post_send(&read_wr(
            9,
            vec![a.sge(0, 100), second, a.sge(200, 100)],
            remote.addr(),
            remote.rkey(),
        ))
        .unwrap();
        let wc = wait(&c.cq);
        assert_eq!((wc.wr_id, wc.status), (9, WcStatus::LocProtErr), "{case}");
        assert_eq!(c.qp.state(), QpState::Error, "{case}");
        assert!(a.to_vec().iter().all(|&x| x == SENTINEL), "{case}");
        assert_eq!(bindings(&dev, &c.pd), 0, "{case}");
    }
}

/// Runs both ends of a simulated connection until nothing moves.
fn settle(pipe: &Pipe, qps: [&QueuePair; 2]) {
    for _ in 0..10_000 {
        let mut moved = false;
        for (side, qp) in qps.iter().enumerate() {
            let r = pipe.ready(side);
            if r.input {
                sim::on_readable(qp, 64);
                moved = true;
            }
            if r.output {
                sim::on_writable(qp);
            }
            moved |= pipe.deliver(side, usize::MAX) > 0;
        }
        if !moved {
            return;
        }
    }
    panic!("the simulated connection never settled");
}

struct SimPair {
    dev: Device,
    pipe: std::sync::Arc<Pipe>,
    c: Side,
    s: Side,
    remote: MemoryRegion,
    a: MemoryRegion,
    b: MemoryRegion,
}

fn sim_pair() -> SimPair {
    let dev = Device::open(DeviceConfig {
        same_host: false,
        ..Default::default()
    })
    .unwrap();
    let c = side(&dev, caps32());
    let s = side(&dev, caps32());
    let pipe = sim::connect(&c.qp, &s.qp, &SimParams::default()).unwrap();
    let remote =
        s.pd.alloc_mr(
            300 << 10,
            Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE,
        )
        .unwrap();
    remote.write_at(0, &remote_pattern(300 << 10));
    let a = c.pd.alloc_mr(200 << 10, Access::LOCAL_WRITE).unwrap();
    let b = c.pd.alloc_mr(100 << 10, Access::LOCAL_WRITE).unwrap();
    a.write_at(0, &vec![SENTINEL; a.len()]);
    b.write_at(0, &vec![SENTINEL; b.len()]);
    SimPair {
        dev,
        pipe,
        c,
        s,
        remote,
        a,
        b,
    }
}

impl SimPair {
    /// Posts the scattered Read; its Read Request is written, not
    /// delivered.
    fn post_read(&self) {
        let sgl: Vec<Sge> = pieces()
            .iter()
            .map(|&(in_b, at, len)| {
                if in_b {
                    self.b.sge(at, len)
                } else {
                    self.a.sge(at, len)
                }
            })
            .collect();
        self.c
            .qp
            .post_send(&read_wr(1, sgl, self.remote.addr(), self.remote.rkey()))
            .unwrap();
        sim::on_writable(&self.c.qp);
        assert!(self.pipe.in_flight(0) > 0, "the Read Request went out");
    }

    fn untouched(&self) -> bool {
        self.a.to_vec().iter().all(|&x| x == SENTINEL)
            && self.b.to_vec().iter().all(|&x| x == SENTINEL)
    }
}

/// The binding lives while the Read is outstanding and goes when the QP
/// fails with the Read in flight (a flush); a Read Response arriving after
/// that places nothing.
#[test]
fn a_flushed_read_releases_its_binding() {
    let w = sim_pair();
    w.post_read();
    let during = w.dev.info();
    let binding: Vec<_> = during
        .mrs
        .iter()
        .filter(|m| m.fast_reg && m.pd == w.c.pd.id())
        .collect();
    assert_eq!(binding.len(), 1, "one binding while outstanding");
    let total: usize = pieces().iter().map(|p| p.2).sum();
    assert_eq!(binding[0].len, total as u64);
    assert!(
        !binding[0].access.contains(Access::REMOTE_WRITE)
            && !binding[0].access.contains(Access::REMOTE_READ),
        "the sink binding grants no remote access: {:?}",
        binding[0].access
    );
    w.c.qp.modify(QpState::Error).unwrap();
    let wc = wait(&w.c.cq);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::WrFlushErr));
    assert_eq!(bindings(&w.dev, &w.c.pd), 0, "flushed: binding released");
    // The responder answers anyway: nothing lands.
    settle(&w.pipe, [&w.c.qp, &w.s.qp]);
    assert!(w.untouched(), "a flushed Read placed bytes");
    assert_eq!(bindings(&w.dev, &w.c.pd), 0);
}

/// The peer learns the binding's STag from the Read Request, but an RDMA
/// Write to it is a protection error at this end: nothing is placed, the
/// connection ends, and the Read's binding is released.
#[test]
fn the_sink_binding_grants_the_peer_nothing() {
    let w = sim_pair();
    w.post_read();
    let stag = w
        .dev
        .info()
        .mrs
        .iter()
        .find(|m| m.fast_reg && m.pd == w.c.pd.id())
        .expect("the binding")
        .stag;
    // The peer Writes to it before it even sees the Read Request.
    let src = w.s.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    src.write_at(0, &[0x11; 64]);
    w.s.qp
        .post_send(&SendWr::write(2, &[src.sge_all()], 0, Rkey::from_raw(stag)))
        .unwrap();
    sim::on_writable(&w.s.qp);
    settle(&w.pipe, [&w.c.qp, &w.s.qp]);
    let wc = wait(&w.c.cq);
    assert_eq!(wc.wr_id, 1);
    assert_ne!(wc.status, WcStatus::Success);
    assert_eq!(w.c.qp.state(), QpState::Error);
    assert!(w.untouched(), "the peer's Write reached the sink");
    assert_eq!(bindings(&w.dev, &w.c.pd), 0);
}

/// A Read whose response arrives completes normally and frees its
/// binding; many in a row leave none behind and reuse STag indices.
#[test]
fn completed_reads_leave_no_binding() {
    let w = sim_pair();
    for i in 0..300u64 {
        let sgl = vec![w.a.sge(0, 10), w.b.sge(5, 20), w.a.sge(100, 1)];
        w.c.qp
            .post_send(&read_wr(i, sgl, w.remote.addr() + i, w.remote.rkey()))
            .unwrap();
        settle(&w.pipe, [&w.c.qp, &w.s.qp]);
        let wc = wait(&w.c.cq);
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
        let src = &remote_pattern(400)[i as usize..];
        let mut got = vec![0u8; 31];
        w.a.read_at(0, &mut got[..10]);
        w.b.read_at(5, &mut got[10..30]);
        w.a.read_at(100, &mut got[30..]);
        assert_eq!(got, src[..31], "Read {i}");
    }
    assert_eq!(bindings(&w.dev, &w.c.pd), 0);
    let mrs = w.dev.info().mrs.len();
    assert!(mrs < 20, "{mrs} registrations: indices leak");
}

/// The device reports how many SGEs a Read takes, and a Read with more is
/// refused when posted, before anything is queued.
#[test]
fn max_sge_rd_is_reported_and_enforced() {
    assert_eq!(Device::open_default().unwrap().attr().max_sge_rd, 32);
    let mut cfg = DeviceConfig {
        same_host: false,
        ..Default::default()
    };
    cfg.attr.max_sge_rd = 2;
    let dev = Device::open(cfg).unwrap();
    assert_eq!(dev.attr().max_sge_rd, 2);
    let (c, s) = pair_caps(
        &dev,
        &dev,
        ConnParams::default(),
        ConnParams::default(),
        caps32(),
        |_| {},
    );
    let remote =
        s.pd.alloc_mr(4096, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
    remote.write_at(0, &remote_pattern(4096));
    let l = c.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let three = [l.sge(0, 10), l.sge(100, 10), l.sge(200, 10)];
    let err =
        c.qp.post_send(&SendWr::read_sgl(1, &three, remote.addr(), remote.rkey()))
            .unwrap_err();
    assert!(matches!(err, Error::InvalidArgument(_)), "{err:?}");
    assert_eq!(c.qp.state(), QpState::Rts, "nothing queued, QP unharmed");
    c.qp.post_send(&SendWr::read_sgl(
        2,
        &three[..2],
        remote.addr(),
        remote.rkey(),
    ))
    .unwrap();
    assert_eq!(wait(&c.cq).status, WcStatus::Success);
    let mut got = [0u8; 10];
    l.read_at(100, &mut got);
    assert_eq!(got, remote_pattern(20)[10..]);
}
