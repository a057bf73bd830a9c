//! RFC 7306 over loopback: atomics (fetch-and-add, compare-and-swap) and
//! immediate data, available only on connections that negotiated them
//! (`ConnParams::extensions`; Linux siw never does).

mod common;
use common::*;
use softrdma_verbs::*;
use std::collections::HashSet;
use std::sync::Arc;

fn ext() -> ConnParams {
    ConnParams {
        extensions: true,
        ..Default::default()
    }
}

fn u64_at(mr: &MemoryRegion, off: usize) -> u64 {
    let mut b = [0u8; 8];
    mr.read_at(off, &mut b);
    u64::from_ne_bytes(b)
}

fn atomic_target(s: &Side, len: usize) -> MemoryRegion {
    s.pd.alloc_mr(
        len,
        Access::LOCAL_WRITE | Access::REMOTE_ATOMIC | Access::REMOTE_READ,
    )
    .unwrap()
}

#[test]
fn negotiated_only_with_extensions() {
    let (c, s) = pair_with(ext(), ConnParams::default(), |_| {});
    assert!(c.qp.conn_params().unwrap().rfc7306);
    assert!(s.qp.conn_params().unwrap().rfc7306);
    let (c, s) = pair();
    assert!(!c.qp.conn_params().unwrap().rfc7306);
    assert!(!s.qp.conn_params().unwrap().rfc7306);
    // Without it, posting an atomic or immediate data is refused at once
    // (nothing queued, the QP stays usable).
    let target = atomic_target(&s, 8);
    let res = c.pd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    for wr in [
        SendWr::fetch_add(1, res.sge_all(), target.addr(), target.rkey(), 1),
        SendWr::cmp_swap(2, res.sge_all(), target.addr(), target.rkey(), 0, 1),
        SendWr::send_imm(3, 7),
        SendWr::write_imm(4, &[res.sge_all()], target.addr(), target.rkey(), 7),
    ] {
        match c.qp.post_send(&wr) {
            Err(Error::InvalidArgument(m)) => assert!(m.contains("RFC 7306"), "{m}"),
            other => panic!("{:?} accepted without RFC 7306: {other:?}", wr.op),
        }
    }
    assert_eq!(c.qp.state(), QpState::Rts);
    assert!(c.cq.is_empty());
    c.qp.post_send(&SendWr::read(
        5,
        res.sge_all(),
        target.addr(),
        target.rkey(),
    ))
    .unwrap();
    assert!(wait(&c.cq).is_ok());
}

#[test]
fn fetch_add_and_cmp_swap_return_the_original() {
    for crc in [false, true] {
        let p = ConnParams { crc, ..ext() };
        let (c, s) = pair_with(p, ConnParams::default(), |_| {});
        let target = atomic_target(&s, 64);
        target.write_at(8, &40u64.to_ne_bytes());
        let res = c.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
        let at = target.addr() + 8;
        let wrs = [
            SendWr::fetch_add(1, res.sge(0, 8), at, target.rkey(), 2),
            // 42 == 42: swapped in.
            SendWr::cmp_swap(2, res.sge(8, 8), at, target.rkey(), 42, 1000),
            // 1000 != 42: left alone.
            SendWr::cmp_swap(3, res.sge(16, 8), at, target.rkey(), 42, 7),
            SendWr::fetch_add(4, res.sge(24, 8), at, target.rkey(), u64::MAX),
        ];
        c.qp.post_send_batch(&wrs).unwrap();
        let want = [
            (1, WcOpcode::FetchAdd),
            (2, WcOpcode::CompSwap),
            (3, WcOpcode::CompSwap),
            (4, WcOpcode::FetchAdd),
        ];
        for (id, op) in want {
            let wc = wait(&c.cq);
            assert_eq!(
                (wc.wr_id, wc.status, wc.opcode),
                (id, WcStatus::Success, op)
            );
            assert_eq!(wc.byte_len, 8);
        }
        assert_eq!(
            [0, 8, 16, 24].map(|o| u64_at(&res, o)),
            [40, 42, 1000, 1000],
            "originals (crc {crc})"
        );
        // 1000 + u64::MAX wraps to 999.
        assert_eq!(u64_at(&target, 8), 999);
        // Neighbours untouched.
        assert_eq!(u64_at(&target, 0), 0);
        assert_eq!(u64_at(&target, 16), 0);
    }
}

/// Four QPs on four threads hammer one counter with fetch-and-add, up to
/// ORD outstanding each: the counter ends at the total and every returned
/// original value is distinct (each add saw a different state).
#[test]
fn atomics_are_atomic_across_qps() {
    const QPS: usize = 4;
    const PER: usize = 500;
    let dev_s = Device::open_default().unwrap();
    let dev_c = Device::open_default().unwrap();
    let listener = dev_s.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let pd = dev_s.alloc_pd().unwrap();
    let cq = dev_s.create_cq(1024).unwrap();
    let target = Arc::new(
        pd.alloc_mr(8, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC)
            .unwrap(),
    );
    let (va, rkey) = (target.addr(), target.rkey());
    let server = std::thread::spawn(move || {
        (0..QPS)
            .map(|_| {
                let qp = pd.create_qp(QpInitAttr::new(&cq)).unwrap();
                listener
                    .get_request()
                    .unwrap()
                    .accept(&qp, &ConnParams::default())
                    .unwrap();
                qp
            })
            .collect::<Vec<_>>()
    });
    let clients: Vec<_> = (0..QPS)
        .map(|_| {
            let s = side(&dev_c, QpCaps::default());
            s.qp.connect(addr, &ext()).unwrap();
            s
        })
        .collect();
    let _server_qps = server.join().unwrap();
    let threads: Vec<_> = clients
        .into_iter()
        .map(|c| {
            std::thread::spawn(move || {
                let ord = c.qp.conn_params().unwrap().ord as usize;
                let res = c.pd.alloc_mr(8 * PER, Access::LOCAL_WRITE).unwrap();
                let (mut posted, mut done) = (0, 0);
                while done < PER {
                    while posted < PER && posted - done < ord {
                        c.qp.post_send(&SendWr::fetch_add(
                            posted as u64,
                            res.sge(8 * posted, 8),
                            va,
                            rkey,
                            1,
                        ))
                        .unwrap();
                        posted += 1;
                    }
                    let wc = wait(&c.cq);
                    assert!(wc.is_ok(), "{wc:?}");
                    assert_eq!(wc.wr_id, done as u64, "in order");
                    done += 1;
                }
                (0..PER).map(|i| u64_at(&res, 8 * i)).collect::<Vec<_>>()
            })
        })
        .collect();
    let mut seen = HashSet::new();
    for t in threads {
        let originals = t.join().unwrap();
        // Each QP's adds apply in its own order.
        assert!(originals.windows(2).all(|w| w[0] < w[1]), "{originals:?}");
        for v in originals {
            assert!(seen.insert(v), "original value {v} returned twice");
        }
    }
    let total = (QPS * PER) as u64;
    assert_eq!(u64_at(&target, 0), total);
    assert_eq!(seen, (0..total).collect::<HashSet<_>>());
}

/// Atomics share the initiator's outstanding-request limit (ORD) and its
/// in-order completion with Reads; a fenced WR waits for them.
#[test]
fn atomics_interleave_with_reads_in_order() {
    let p = ConnParams { ord: 2, ..ext() };
    let (c, s) = pair_with(p, ConnParams::default(), |_| {});
    assert_eq!(c.qp.conn_params().unwrap().ord, 2);
    let target = s.pd.alloc_mr(4096, Access::ALL).unwrap();
    target.write_at(0, &pattern(4096, 3));
    let res = c.pd.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
    let mut wrs = Vec::new();
    for i in 0..8u64 {
        let off = 8 * (i as usize);
        if i % 2 == 0 {
            wrs.push(SendWr::fetch_add(
                i,
                res.sge(off, 8),
                target.addr() + 512,
                target.rkey(),
                1,
            ));
        } else {
            wrs.push(SendWr::read(
                i,
                res.sge(4096 + off, 8),
                target.addr() + 1024,
                target.rkey(),
            ));
        }
    }
    // A Write fenced behind the atomics and reads.
    let src = c.pd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    src.write_at(0, &[0xEE; 8]);
    wrs.push(SendWr::write(8, &[src.sge_all()], target.addr() + 512, target.rkey()).fenced());
    c.qp.post_send_batch(&wrs).unwrap();
    let base = u64::from_ne_bytes(pattern(4096, 3)[512..520].try_into().unwrap());
    for i in 0..9u64 {
        let wc = wait(&c.cq);
        assert_eq!((wc.wr_id, wc.status), (i, WcStatus::Success));
    }
    for k in 0..4u64 {
        assert_eq!(u64_at(&res, 16 * k as usize), base.wrapping_add(k));
        let mut b = [0u8; 8];
        res.read_at(4096 + 16 * k as usize + 8, &mut b);
        assert_eq!(&b[..], &pattern(4096, 3)[1024..1032]);
    }
    // The fenced Write came after all four adds: a Read behind it (the
    // responder handles one stream in order) sees its bytes, not base + 4.
    c.qp.post_send(&SendWr::read(
        9,
        res.sge(0, 8),
        target.addr() + 512,
        target.rkey(),
    ))
    .unwrap();
    assert!(wait(&c.cq).is_ok());
    assert_eq!(u64_at(&res, 0), u64::from_ne_bytes([0xEE; 8]));
}

#[test]
fn write_with_immediate_and_immediate_data() {
    let (c, s) = pair_with(ext(), ConnParams::default(), |s| {
        s.qp.modify(QpState::Init).unwrap();
        for i in 0..3 {
            s.qp.post_recv(&RecvWr::new(i, &[])).unwrap();
        }
    });
    let remote =
        s.pd.alloc_mr(65_536, Access::LOCAL_WRITE | Access::REMOTE_WRITE)
            .unwrap();
    let local = c.pd.alloc_mr(65_536, Access::LOCAL_WRITE).unwrap();
    let data = pattern(65_536, 77);
    local.write_at(0, &data);
    c.qp.post_send(&SendWr::write_imm(
        10,
        &[local.sge_all()],
        remote.addr(),
        remote.rkey(),
        0xDEAD_BEEF,
    ))
    .unwrap();
    let wc = wait(&c.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (10, WcStatus::Success, WcOpcode::RdmaWrite)
    );
    // One receive consumed, carrying the value; the data is in place when
    // the completion is seen.
    let wc = wait(&s.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.imm_data),
        (
            0,
            WcStatus::Success,
            WcOpcode::RecvWithImm,
            Some(0xDEAD_BEEF)
        )
    );
    assert!(remote.to_vec() == data);
    // Immediate data alone, with a solicited event: wakes a
    // solicited-only waiter.
    s.cq.req_notify(true);
    c.qp.post_send(&SendWr::send_imm(11, 7).solicited())
        .unwrap();
    assert!(wait(&c.cq).is_ok());
    assert!(
        s.cq.wait_event(Some(T)),
        "solicited immediate data fires the event"
    );
    let wc = wait(&s.cq);
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.imm_data, wc.solicited, wc.byte_len),
        (1, WcOpcode::RecvWithImm, Some(7), true, 0)
    );
    // Sends still work on the same queue after the immediates (MSNs shared).
    let rbuf = s.pd.alloc_mr(16, Access::LOCAL_WRITE).unwrap();
    s.qp.post_recv(&RecvWr::new(3, &[rbuf.sge_all()])).unwrap();
    local.write_at(0, b"after immediates");
    c.qp.post_send(&SendWr::send(12, &[local.sge(0, 16)]))
        .unwrap();
    assert!(wait(&c.cq).is_ok());
    let wc = wait(&s.cq);
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.byte_len, wc.imm_data),
        (2, WcOpcode::Recv, 0, None)
    );
}

/// The responder refuses atomics it must refuse, with the RFC's Terminate,
/// and the target memory is untouched.
#[test]
fn atomic_refusals() {
    struct Case {
        what: &'static str,
        access: Access,
        offset: u64,
        bad_stag: bool,
        want: WcStatus,
    }
    let rights = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let cases = [
        Case {
            what: "no remote-atomic right",
            access: rights,
            offset: 0,
            bad_stag: false,
            want: WcStatus::RemAccessErr,
        },
        Case {
            what: "outside the region",
            access: Access::ALL,
            offset: 64,
            bad_stag: false,
            want: WcStatus::RemAccessErr,
        },
        Case {
            what: "unknown STag",
            access: Access::ALL,
            offset: 0,
            bad_stag: true,
            want: WcStatus::RemAccessErr,
        },
        Case {
            what: "misaligned",
            access: Access::ALL,
            offset: 4,
            bad_stag: false,
            want: WcStatus::RemOpErr,
        },
    ];
    for k in cases {
        let (c, s) = pair_with(ext(), ConnParams::default(), |_| {});
        let target = s.pd.alloc_mr(64, k.access).unwrap();
        target.write_at(0, &pattern(64, 5));
        let res = c.pd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
        let rkey = if k.bad_stag {
            Rkey::from_raw(target.rkey().raw() + 0x100)
        } else {
            target.rkey()
        };
        c.qp.post_send(&SendWr::fetch_add(
            1,
            res.sge_all(),
            target.addr() + k.offset,
            rkey,
            1,
        ))
        .unwrap();
        let wc = wait(&c.cq);
        assert_eq!((wc.wr_id, wc.status), (1, k.want), "{}", k.what);
        assert!(s.qp.wait_state(QpState::Error, T), "{}", k.what);
        assert_eq!(
            target.to_vec(),
            pattern(64, 5),
            "{}: target untouched",
            k.what
        );
        assert_eq!(u64_at(&res, 0), 0, "{}: no result", k.what);
    }
}

#[test]
fn atomic_result_buffer_must_be_eight_bytes() {
    let (c, s) = pair_with(ext(), ConnParams::default(), |_| {});
    let target = atomic_target(&s, 8);
    let res = c.pd.alloc_mr(16, Access::LOCAL_WRITE).unwrap();
    c.qp.post_send(&SendWr::fetch_add(
        1,
        res.sge(0, 16),
        target.addr(),
        target.rkey(),
        1,
    ))
    .unwrap();
    assert_eq!(wait(&c.cq).status, WcStatus::LocQpOpErr);
    assert_eq!(u64_at(&target, 0), 0);
}
