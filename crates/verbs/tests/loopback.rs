//! Data-path tests between two QPs over loopback TCP.

mod common;
use common::*;
use softrdma_verbs::*;
use std::time::Duration;

fn all_params() -> Vec<ConnParams> {
    let mut v = Vec::new();
    for rev in [1u8, 2] {
        for crc in [false, true] {
            for extensions in [false, true] {
                v.push(ConnParams {
                    mpa_revision: rev,
                    crc,
                    extensions,
                    ..Default::default()
                });
            }
        }
    }
    v
}

#[test]
fn send_recv_sizes_all_mpa_modes() {
    for p in all_params() {
        let sizes = [0usize, 1, 7, 4096, 65_536, 100_000, 1 << 20];
        let (c, s) = pair_with(p.clone(), ConnParams::default(), |_| {});
        let rmr = s.pd.alloc_mr(1 << 20, Access::LOCAL_WRITE).unwrap();
        let smr = c.pd.alloc_mr(1 << 20, Access::LOCAL_WRITE).unwrap();
        for (i, &n) in sizes.iter().enumerate() {
            let data = pattern(n, i as u8);
            smr.write_at(0, &data);
            s.qp.post_recv(&RecvWr::new(i as u64, &[rmr.sge_all()]))
                .unwrap();
            c.qp.post_send(&SendWr::send(100 + i as u64, &[smr.sge(0, n)]))
                .unwrap();
            let wc = wait(&c.cq);
            assert_eq!(
                (wc.status, wc.wr_id, wc.opcode),
                (WcStatus::Success, 100 + i as u64, WcOpcode::Send)
            );
            let wc = wait(&s.cq);
            assert_eq!(
                (wc.status, wc.wr_id, wc.opcode),
                (WcStatus::Success, i as u64, WcOpcode::Recv),
                "{p:?} size {n}"
            );
            assert_eq!(wc.byte_len as usize, n);
            let mut got = vec![0; n];
            rmr.read_at(0, &mut got);
            assert!(got == data, "payload mismatch at size {n} with {p:?}");
        }
        let np = c.qp.conn_params().unwrap();
        assert_eq!(np.revision, p.mpa_revision);
        assert_eq!(np.crc, p.crc);
    }
}

#[test]
fn rdma_write_and_read_multi_segment() {
    for p in all_params() {
        let (c, s) = pair_with(p.clone(), ConnParams::default(), |_| {});
        let n = 3 * 65_536 + 123;
        let remote =
            s.pd.alloc_mr(
                n,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .unwrap();
        let local = c.pd.alloc_mr(n, Access::LOCAL_WRITE).unwrap();
        let data = pattern(n, 9);
        local.write_at(0, &data);
        c.qp.post_send(&SendWr::write(
            1,
            &[local.sge_all()],
            remote.addr(),
            remote.rkey(),
        ))
        .unwrap();
        assert_eq!(wait(&c.cq).status, WcStatus::Success);
        // A Read after the Write sees the written data (RDMA ordering).
        let back = c.pd.alloc_mr(n, Access::LOCAL_WRITE).unwrap();
        c.qp.post_send(&SendWr::read(
            2,
            back.sge_all(),
            remote.addr(),
            remote.rkey(),
        ))
        .unwrap();
        let wc = wait(&c.cq);
        assert_eq!(
            (wc.status, wc.wr_id, wc.opcode),
            (WcStatus::Success, 2, WcOpcode::RdmaRead)
        );
        assert!(back.to_vec() == data, "read-back mismatch with {p:?}");
        assert!(remote.to_vec() == data);
    }
}

#[test]
fn scatter_gather_send_and_write() {
    let (c, s) = pair();
    let a = c.pd.alloc_mr(1000, Access::LOCAL_WRITE).unwrap();
    let b = c.pd.alloc_mr(70_000, Access::LOCAL_WRITE).unwrap();
    a.write_at(0, &pattern(1000, 1));
    b.write_at(0, &pattern(70_000, 2));
    let r1 = s.pd.alloc_mr(500, Access::LOCAL_WRITE).unwrap();
    let r2 = s.pd.alloc_mr(80_000, Access::LOCAL_WRITE).unwrap();
    s.qp.post_recv(&RecvWr::new(7, &[r1.sge_all(), r2.sge_all()]))
        .unwrap();
    c.qp.post_send(&SendWr::send(1, &[a.sge_all(), b.sge_all()]))
        .unwrap();
    assert!(wait(&c.cq).is_ok());
    let wc = wait(&s.cq);
    assert_eq!(wc.byte_len, 71_000);
    let mut want = pattern(1000, 1);
    want.extend(pattern(70_000, 2));
    let mut got = r1.to_vec();
    got.extend(&r2.to_vec()[..70_500]);
    assert!(got == want);
}

#[test]
fn completions_in_order_with_unsignaled_and_fence() {
    let (c, s) = pair();
    let remote =
        s.pd.alloc_mr(
            1 << 20,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    remote.write_at(0, &pattern(1 << 20, 3));
    let local = c.pd.alloc_mr(2 << 20, Access::LOCAL_WRITE).unwrap();
    let mut wrs = Vec::new();
    // A big Read, then Writes; completions come in post order.
    wrs.push(SendWr::read(
        1,
        local.sge(0, 1 << 20),
        remote.addr(),
        remote.rkey(),
    ));
    for i in 0..20u64 {
        let w = SendWr::write(
            10 + i,
            &[local.sge(1 << 20, 64)],
            remote.addr(),
            remote.rkey(),
        );
        wrs.push(if i % 2 == 0 { w.unsignaled() } else { w });
    }
    // A fenced Write of what the Read brought back.
    wrs.push(
        SendWr::write(
            99,
            &[local.sge(0, 4096)],
            remote.addr() + 8192,
            remote.rkey(),
        )
        .fenced(),
    );
    c.qp.post_send_batch(&wrs).unwrap();
    let mut ids = Vec::new();
    while ids.len() < 12 {
        let wc = wait(&c.cq);
        assert!(wc.is_ok(), "{wc:?}");
        ids.push(wc.wr_id);
    }
    let mut want = vec![1];
    want.extend((0..20u64).filter(|i| i % 2 == 1).map(|i| 10 + i));
    want.push(99);
    assert_eq!(ids, want);
}

#[test]
fn send_with_invalidate_invalidates_before_completion() {
    let (c, s) = pair();
    // The server exposes a region and the client invalidates it with its
    // reply.
    let exposed =
        s.pd.alloc_mr_with(
            4096,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            RegOptions {
                key: Some(0x5a),
                invalidatable: true,
                ..Default::default()
            },
        )
        .unwrap();
    assert_eq!(exposed.rkey().raw() & 0xff, 0x5a);
    let rbuf = s.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    s.qp.post_recv(&RecvWr::new(5, &[rbuf.sge_all()])).unwrap();
    let m = c.pd.alloc_mr(16, Access::LOCAL_WRITE).unwrap();
    c.qp.post_send(&SendWr::send_inv(1, &[m.sge_all()], exposed.rkey()))
        .unwrap();
    assert!(wait(&c.cq).is_ok());
    let wc = wait(&s.cq);
    assert!(wc.is_ok());
    assert_eq!(wc.invalidated_rkey, Some(exposed.rkey()));
    assert!(!exposed.is_valid());
    // A Write to the invalidated STag is refused by the target with a
    // Terminate (invalid STag); both QPs end in ERROR. (An RDMA Write
    // completes at the initiator once sent, as on any iWARP stack.)
    c.qp.post_send(&SendWr::write(
        2,
        &[m.sge_all()],
        exposed.addr(),
        exposed.rkey(),
    ))
    .unwrap();
    assert!(s.qp.wait_state(QpState::Error, T));
    assert!(c.qp.wait_state(QpState::Error, T));
    let mut saw = None;
    while let Some(ev) = s.dev.next_event(std::time::Duration::from_millis(200)) {
        if let AsyncEvent::Terminated { code, by_peer, .. } = ev {
            saw = Some((code, by_peer));
        }
    }
    let (code, _) = saw.expect("a Terminate event");
    assert_eq!(code, wire::terminate::codes::DDP_TAGGED_INVALID_STAG);
}

#[test]
fn solicited_only_notification() {
    let (c, s) = pair();
    let rbuf = s.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    for i in 0..2 {
        s.qp.post_recv(&RecvWr::new(i, &[rbuf.sge(0, 64)])).unwrap();
    }
    let m = c.pd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    s.cq.req_notify(true);
    c.qp.post_send(&SendWr::send(1, &[m.sge_all()])).unwrap();
    assert!(wait(&c.cq).is_ok());
    // The plain Send arrives but does not fire a solicited-only event.
    while s.cq.is_empty() {
        std::thread::yield_now();
    }
    assert!(!s.cq.wait_event(Some(std::time::Duration::from_millis(50))));
    c.qp.post_send(&SendWr::send(2, &[m.sge_all()]).solicited())
        .unwrap();
    assert!(s.cq.wait_event(Some(T)), "solicited Send fires the event");
    let a = wait(&s.cq);
    let b = wait(&s.cq);
    assert!(!a.solicited && b.solicited);
}

#[test]
fn fast_register_binds_new_key() {
    let (c, s) = pair();
    let backing = s.pd.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
    let fr = s.pd.alloc_fast_reg_mr().unwrap();
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
    let iova = 0x1000_0000u64;
    s.qp.post_send(&SendWr::fast_reg(
        1,
        &fr,
        0x33,
        &[backing.sge(4096, 4096)],
        iova,
        access,
    ))
    .unwrap();
    let wc = wait(&s.cq);
    assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::RegMr));
    let stag = fr.stag_with_key(0x33);
    assert_eq!(fr.current_stag(), Some(stag));
    let m = c.pd.alloc_mr(100, Access::LOCAL_WRITE).unwrap();
    m.write_at(0, &pattern(100, 4));
    let r = s.pd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
    s.qp.post_recv(&RecvWr::new(9, &[r.sge_all()])).unwrap();
    c.qp.post_send(&SendWr::write(2, &[m.sge_all()], iova + 10, stag.rkey()))
        .unwrap();
    // A Send after the Write: once it is received, the Write is placed.
    c.qp.post_send(&SendWr::send(3, &[m.sge(0, 8)])).unwrap();
    assert!(wait(&c.cq).is_ok());
    assert!(wait(&c.cq).is_ok());
    assert_eq!(wait(&s.cq).wr_id, 9);
    s.qp.post_send(&SendWr::local_inv(3, stag.rkey())).unwrap();
    assert!(wait(&s.cq).is_ok());
    assert_eq!(fr.current_stag(), None);
    let mut got = vec![0; 100];
    backing.read_at(4096 + 10, &mut got);
    assert_eq!(got, pattern(100, 4));
}

#[test]
fn disconnect_flushes_both_sides() {
    let (c, s) = pair();
    let r = s.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    for i in 0..3 {
        s.qp.post_recv(&RecvWr::new(i, &[r.sge_all()])).unwrap();
    }
    c.qp.disconnect();
    assert_eq!(c.qp.state(), QpState::Error);
    assert!(s.qp.wait_state(QpState::Error, T));
    for _ in 0..3 {
        assert_eq!(wait(&s.cq).status, WcStatus::WrFlushErr);
    }
    let ev = s.dev.next_event(T).unwrap();
    assert!(matches!(ev, AsyncEvent::Disconnected { .. }), "{ev:?}");
    // Posting on an errored QP completes at once with a flush status.
    s.qp.post_recv(&RecvWr::new(9, &[r.sge_all()])).unwrap();
    assert_eq!(wait(&s.cq).status, WcStatus::WrFlushErr);
}

#[test]
fn reject_with_private_data() {
    let dev = Device::open_default().unwrap();
    let l = dev.listen("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let t = std::thread::spawn(move || {
        let req = l.get_request().unwrap();
        assert_eq!(req.private_data(), b"hello");
        req.reject(b"go away").unwrap();
    });
    let c = side(&dev, QpCaps::default());
    let err =
        c.qp.connect(
            addr,
            &ConnParams {
                private_data: b"hello".to_vec(),
                ..Default::default()
            },
        )
        .unwrap_err();
    match err {
        Error::Rejected { private_data } => assert_eq!(private_data, b"go away"),
        e => panic!("expected a reject, got {e}"),
    }
    t.join().unwrap();
}

#[test]
fn private_data_and_ird_ord_negotiation() {
    let pc = ConnParams {
        private_data: b"from client".to_vec(),
        ird: 4,
        ord: 8,
        ..Default::default()
    };
    let ps = ConnParams {
        private_data: b"from server".to_vec(),
        ird: 2,
        ord: 3,
        ..Default::default()
    };
    let dev = Device::open_default().unwrap();
    let l = dev.listen("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let s = side(&dev, QpCaps::default());
    let t = std::thread::spawn(move || {
        let req = l.get_request().unwrap();
        assert_eq!(req.private_data(), b"from client");
        assert_eq!(req.ird_ord(), Some((4, 8)));
        req.accept(&s.qp, &ps).unwrap();
        s
    });
    let c = side(&dev, QpCaps::default());
    let pd = c.qp.connect(addr, &pc).unwrap();
    let s = t.join().unwrap();
    assert_eq!(pd, b"from server");
    let nc = c.qp.conn_params().unwrap();
    let ns = s.qp.conn_params().unwrap();
    // Server: ORD limited by the client's IRD (4 > 3 so 3); IRD raised to
    // the client's ORD (8).
    assert_eq!((ns.ird, ns.ord), (8, 3));
    // Client: ORD limited by the server's IRD (8).
    assert_eq!((nc.ird, nc.ord), (4, 8));
}

#[test]
fn peer_to_peer_rtr() {
    let p = ConnParams {
        p2p: true,
        ..Default::default()
    };
    let (c, s) = pair_with(p, ConnParams::default(), |_| {});
    assert!(c.qp.conn_params().unwrap().p2p);
    assert!(s.qp.conn_params().unwrap().p2p);
    // Server sends first: it must have waited for the RTR, then the Send
    // goes through.
    let r = c.pd.alloc_mr(16, Access::LOCAL_WRITE).unwrap();
    c.qp.post_recv(&RecvWr::new(1, &[r.sge_all()])).unwrap();
    let m = s.pd.alloc_mr(16, Access::LOCAL_WRITE).unwrap();
    m.write_at(0, b"after RTR, hello");
    s.qp.post_send(&SendWr::send(2, &[m.sge_all()])).unwrap();
    assert!(wait(&s.cq).is_ok());
    assert!(wait(&c.cq).is_ok());
    assert_eq!(r.to_vec(), b"after RTR, hello");
}

#[test]
fn shared_receive_queue_serves_two_qps() {
    let dev = Device::open_default().unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let srq = pd.create_srq(16, 1).unwrap();
    let buf = pd.alloc_mr(4 * 64, Access::LOCAL_WRITE).unwrap();
    for i in 0..4 {
        srq.post_recv(&RecvWr::new(i, &[buf.sge(i as usize * 64, 64)]))
            .unwrap();
    }
    let l = dev.listen("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let mut server_qps = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..2 {
        let mut attr = QpInitAttr::new(&cq);
        attr.srq = Some(srq.clone());
        let sq = pd.create_qp(attr).unwrap();
        let c = side(&dev, QpCaps::default());
        let t = std::thread::spawn(move || {
            c.qp.connect(addr, &ConnParams::default()).unwrap();
            c
        });
        l.get_request()
            .unwrap()
            .accept(&sq, &ConnParams::default())
            .unwrap();
        server_qps.push(sq);
        clients.push(t.join().unwrap());
    }
    for (i, c) in clients.iter().enumerate() {
        let m = c.pd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
        m.write_at(0, &[i as u8; 8]);
        c.qp.post_send(&SendWr::send(1, &[m.sge_all()])).unwrap();
        assert!(wait(&c.cq).is_ok());
    }
    let mut qpns = Vec::new();
    for _ in 0..2 {
        let wc = wait(&cq);
        assert!(wc.is_ok());
        qpns.push(wc.qp_num);
    }
    qpns.sort();
    let mut want: Vec<Qpn> = server_qps.iter().map(|q| q.qp_num()).collect();
    want.sort();
    assert_eq!(qpns, want);
    assert_eq!(srq.len(), 2);
}

/// softrdma's extension block: offered by an initiator that asks for it,
/// answered by our responder, invisible to both applications' private
/// data, and never sent unasked.
#[test]
fn extensions_negotiated_and_stripped() {
    for offer in [false, true] {
        let dev = Device::open_default().unwrap();
        let listener = dev.listen("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap();
        let s = common::side(&dev, QpCaps::default());
        let server = std::thread::spawn(move || {
            let req = listener.get_request().unwrap();
            let seen = (req.private_data().to_vec(), req.extensions());
            let p = ConnParams {
                private_data: b"from server".to_vec(),
                ..Default::default()
            };
            req.accept(&s.qp, &p).unwrap();
            (s, seen)
        });
        let c = common::side(&dev, QpCaps::default());
        let p = ConnParams {
            private_data: b"from client".to_vec(),
            extensions: offer,
            ..Default::default()
        };
        let reply = c.qp.connect(addr, &p).unwrap();
        let (s, (req_pd, req_ext)) = server.join().unwrap();
        assert_eq!(req_pd, b"from client", "offer={offer}");
        assert_eq!(reply, b"from server", "offer={offer}");
        assert_eq!(req_ext.is_some(), offer);
        let (nc, ns) = (c.qp.conn_params().unwrap(), s.qp.conn_params().unwrap());
        assert_eq!(nc.large_segments, offer);
        assert_eq!(ns.large_segments, offer);
        // Data still flows both ways (1 MiB crosses many batches).
        let len = 1 << 20;
        let src = c.pd.alloc_mr(len, Access::LOCAL_WRITE).unwrap();
        let dst =
            s.pd.alloc_mr(
                len,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .unwrap();
        let data = pattern(len, 7);
        src.write_at(0, &data);
        c.qp.post_send(&SendWr::write(1, &[src.sge_all()], dst.addr(), dst.rkey()))
            .unwrap();
        assert!(wait(&c.cq).is_ok());
        let back = c.pd.alloc_mr(len, Access::LOCAL_WRITE).unwrap();
        c.qp.post_send(&SendWr::read(2, back.sge_all(), dst.addr(), dst.rkey()))
            .unwrap();
        assert!(wait(&c.cq).is_ok());
        assert!(back.to_vec() == data, "offer={offer}: data differs");
        assert!(dst.to_vec() == data, "offer={offer}: data differs");
    }
}

/// Busy-poll mode: the receiver runs on the caller's thread through
/// `progress()`; switching back hands input to the progress thread again.
#[test]
fn busy_poll_receives_through_progress() {
    let (c, s) = common::pair_with(ConnParams::default(), ConnParams::default(), |s| {
        let _ = s;
    });
    let rbuf = s.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    let sbuf = c.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    s.qp.set_busy_poll(true).unwrap();
    for round in 0..100u8 {
        s.qp.post_recv(&RecvWr::new(round as u64, &[rbuf.sge_all()]))
            .unwrap();
        sbuf.write_at(0, &[round; 64]);
        c.qp.post_send(&SendWr::send(round as u64, &[sbuf.sge_all()]))
            .unwrap();
        assert!(wait(&c.cq).is_ok());
        let deadline = std::time::Instant::now() + common::T;
        let wc = loop {
            s.qp.progress();
            if let Some(wc) = s.cq.poll_one() {
                break wc;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no receive via progress()"
            );
            std::hint::spin_loop();
        };
        assert!(wc.is_ok() && wc.wr_id == round as u64 && wc.byte_len == 64);
        assert_eq!(rbuf.to_vec(), vec![round; 64]);
    }
    // Back to the progress thread: a blocking wait sees the next message.
    s.qp.set_busy_poll(false).unwrap();
    s.qp.post_recv(&RecvWr::new(1000, &[rbuf.sge_all()]))
        .unwrap();
    c.qp.post_send(&SendWr::send(1000, &[sbuf.sge_all()]))
        .unwrap();
    assert!(wait(&c.cq).is_ok());
    assert_eq!(wait(&s.cq).wr_id, 1000);
}

/// `set_valid(false)` refuses remote access to the STag (the Read fails,
/// nothing is read) and keeps its index out of reuse; `set_valid(true)`
/// restores it.
#[test]
fn set_valid_toggles_the_stag_and_keeps_its_index() {
    let (c, s) = common::pair();
    let mr =
        s.pd.alloc_mr(64, Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
    mr.write_at(0, &[7; 64]);
    mr.set_valid(false);
    assert!(!mr.is_valid());
    let sink = c.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    c.qp.post_send(&SendWr::read(1, sink.sge_all(), mr.addr(), mr.rkey()))
        .unwrap();
    let wc = wait(&c.cq);
    assert!(
        !wc.is_ok(),
        "a Read of an invalidated STag succeeded: {wc:?}"
    );
    assert_eq!(
        sink.to_vec(),
        vec![0; 64],
        "bytes arrived from an invalid STag"
    );
    let others: Vec<MemoryRegion> = (0..64)
        .map(|_| s.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap())
        .collect();
    assert!(others
        .iter()
        .all(|o| o.rkey().stag().index() != mr.rkey().stag().index()));
    mr.set_valid(true);
    assert!(mr.is_valid());
}

/// `restrict_access` narrows a live registration in place: the STag stays,
/// Reads through it go on, a Write is refused with the protection
/// Terminate (DDP tagged "invalid STag", as siw words a rights error) and
/// places nothing; no later call gives a right back.
#[test]
fn restrict_access_narrows_a_live_stag() {
    let (c, s) = common::pair();
    let rw = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
    let mr = s.pd.alloc_mr(4096, rw).unwrap();
    let src = c.pd.register(vec![5; 4096], Access::LOCAL_WRITE).unwrap();
    let sink = c.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    c.qp.post_send(&SendWr::write(1, &[src.sge(0, 64)], mr.addr(), mr.rkey()))
        .unwrap();
    // (A Write completes when sent; the Read behind it, once the Write was
    // placed.)
    c.qp.post_send(&SendWr::read(9, sink.sge(0, 64), mr.addr(), mr.rkey()))
        .unwrap();
    assert!(wait(&c.cq).is_ok() && wait(&c.cq).is_ok());
    mr.restrict_access(Access::LOCAL_WRITE | Access::REMOTE_READ);
    assert_eq!(mr.access(), Access::LOCAL_WRITE | Access::REMOTE_READ);
    mr.restrict_access(rw);
    assert!(
        !mr.access().contains(Access::REMOTE_WRITE),
        "a right came back"
    );
    for id in 2..4 {
        c.qp.post_send(&SendWr::read(id, sink.sge(0, 64), mr.addr(), mr.rkey()))
            .unwrap();
        let wc = wait(&c.cq);
        assert!(wc.is_ok(), "a Read after narrowing to read: {wc:?}");
        assert_eq!(sink.to_vec()[..64], [5; 64]);
    }
    src.write_at(0, &[9; 64]);
    c.qp.post_send(&SendWr::write(4, &[src.sge(0, 64)], mr.addr(), mr.rkey()))
        .unwrap();
    c.qp.post_send(&SendWr::read(5, sink.sge(0, 64), mr.addr(), mr.rkey()))
        .unwrap();
    let statuses = [wait(&c.cq).status, wait(&c.cq).status];
    assert!(
        statuses.iter().any(|s| *s != WcStatus::Success),
        "{statuses:?}"
    );
    let code = loop {
        match c.dev.next_event(common::T) {
            Some(AsyncEvent::Terminated { code, .. }) => break code,
            Some(_) => continue,
            None => panic!("no Terminate"),
        }
    };
    use softrdma_verbs::wire::{terminate::codes, Layer};
    assert_eq!(code.layer, Layer::Ddp);
    assert_eq!(code, codes::DDP_TAGGED_INVALID_STAG);
    assert_eq!(mr.to_vec()[..64], [5; 64], "the refused Write placed bytes");
}

/// The receiver handles at most a budget of segments per wake-up and reads
/// a little ahead of what it needs, so when a burst ends just past the
/// budget the last FPDUs sit in its stage with the socket empty: epoll
/// reports nothing more, and the progress thread must run the receiver
/// again by itself. A burst of 520 small Writes (the budget is 512) and a
/// Read behind them: the Read request is in that tail, and its response
/// comes only if the tail is processed. (This hung `bench --test read_bw
/// --repeat 3` about every other run before the fix.)
#[test]
fn burst_just_past_the_receive_budget_is_processed() {
    let ext = ConnParams {
        extensions: true,
        ..Default::default()
    };
    for params in [ConnParams::default(), ext] {
        let dev = Device::open_default().unwrap();
        let caps = QpCaps {
            max_send_wr: 1024,
            ..QpCaps::default()
        };
        let (c, s) = pair_caps(&dev, &dev, params.clone(), params, caps, |_| {});
        let remote =
            s.pd.alloc_mr(
                4096,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            )
            .unwrap();
        let local = c.pd.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
        local.write_at(0, &pattern(4096, 9));
        for round in 0..20u64 {
            let mut wrs: Vec<SendWr> = (0..520u64)
                .map(|i| {
                    let off = (i % 512) * 8;
                    SendWr::write(
                        i,
                        &[local.sge(off as usize, 8)],
                        remote.addr() + off,
                        remote.rkey(),
                    )
                    .unsignaled()
                })
                .collect();
            wrs.push(SendWr::read(
                1000 + round,
                local.sge(4096, 4096),
                remote.addr(),
                remote.rkey(),
            ));
            c.qp.post_send_batch(&wrs).unwrap();
            let wc = wait(&c.cq);
            assert!(wc.is_ok(), "{wc:?}");
            assert_eq!(wc.wr_id, 1000 + round);
            assert!(
                local.to_vec()[4096..] == pattern(4096, 9)[..],
                "round {round}"
            );
        }
    }
}

/// Issue 20, item 6: the application moves a QP to ERROR (flushing the
/// receive in progress back to it) while a large Send is being placed into
/// that receive. Nothing is placed into the flushed buffer afterwards (a
/// receiver past its first closed-check used to, and then panicked the
/// progress thread on the missing receive), and the device keeps working.
#[test]
fn flush_during_a_receive_places_nothing_after_it() {
    let dev = Device::open_default().unwrap();
    const LEN: usize = 4 << 20;
    for round in 0..40 {
        let (c, s) = pair_on(
            &dev,
            &dev,
            ConnParams::default(),
            ConnParams::default(),
            |_| {},
        );
        let rbuf = s.pd.alloc_mr(LEN, Access::LOCAL_WRITE).unwrap();
        s.qp.post_recv(&RecvWr::new(1, &[rbuf.sge_all()])).unwrap();
        let sbuf = c.pd.alloc_mr(LEN, Access::LOCAL_WRITE).unwrap();
        sbuf.write_at(0, &vec![0x5a; LEN]);
        c.qp.post_send(&SendWr::send(2, &[sbuf.sge_all()])).unwrap();
        // Let part of it arrive (varying by round), then flush.
        let spin = std::time::Instant::now() + std::time::Duration::from_micros(50 * round);
        while std::time::Instant::now() < spin {
            std::hint::spin_loop();
        }
        s.qp.modify(QpState::Error).unwrap();
        let wc = wait(&s.cq);
        assert_eq!(wc.wr_id, 1);
        // Once flushed, the buffer is the application's: it must not
        // change any more.
        let snap = rbuf.to_vec();
        let _ = c.cq.wait_one(T);
        assert!(
            rbuf.to_vec() == snap,
            "round {round}: bytes placed after the flush"
        );
    }
    // The progress threads are alive: a fresh pair on the same device.
    let (c, s) = pair_on(
        &dev,
        &dev,
        ConnParams::default(),
        ConnParams::default(),
        |_| {},
    );
    let r = s.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    s.qp.post_recv(&RecvWr::new(9, &[r.sge_all()])).unwrap();
    let m = c.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    c.qp.post_send(&SendWr::send(10, &[m.sge_all()])).unwrap();
    assert!(wait(&s.cq).is_ok());
}

/// A dropped listener gives its port back before `drop` returns, as
/// `rdma_destroy_id` does in the kernel: perftest's server destroys its
/// listening id after the control handshake and listens again on the same
/// port at once (before, the acceptor thread held the socket until it was
/// next scheduled, and the second `listen` failed with EADDRINUSE now and
/// then, more often on a loaded machine).
#[test]
fn a_dropped_listener_frees_its_port_at_once() {
    let dev = Device::open_default().unwrap();
    let first = dev.listen("127.0.0.1:0").unwrap();
    let addr = first.local_addr().unwrap();
    drop(first);
    for round in 0..200 {
        let l = dev
            .listen(addr)
            .unwrap_or_else(|e| panic!("round {round}: listen again on {addr}: {e}"));
        drop(l);
    }
}

/// `Listener::close` wakes a thread blocked in `get_request` (how
/// `rdma_destroy_id` stops the drop-in's listening thread without polling),
/// and the port is free once the listener drops.
#[test]
fn closing_a_listener_wakes_its_waiter() {
    let dev = Device::open_default().unwrap();
    let l = std::sync::Arc::new(dev.listen("127.0.0.1:0").unwrap());
    let addr = l.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let (started_tx, started) = std::sync::mpsc::channel();
    let l2 = l.clone();
    let waiter = std::thread::spawn(move || {
        let _ = started_tx.send(());
        let _ = tx.send(l2.get_request().map(|_| ()));
    });
    // Close once the waiter is (all but) inside get_request, so that the
    // close has to wake it rather than find it not yet waiting.
    started.recv().unwrap();
    l.close();
    let got = rx
        .recv_timeout(std::time::Duration::from_secs(20))
        .expect("get_request still blocked 20 s after close");
    assert!(matches!(got, Err(Error::Closed)), "{got:?}");
    waiter.join().unwrap();
    assert!(matches!(
        l.get_request_timeout(std::time::Duration::from_secs(5)),
        Err(Error::Closed)
    ));
    drop(l);
    dev.listen(addr).expect("the port is free after the drop");
}

/// A Send that finds no posted receive waits for one
/// (`DeviceConfig::recv_wait`), as an InfiniBand requester retries after a
/// receiver-not-ready NAK (qperf's `rc_bw` counts on that: its sender runs
/// ahead of the receives its server reposts). Posted within the wait, the
/// receive gets the message, whole and in order with the ones behind it,
/// over TCP and over the same-host rings, to a QP's own receive queue and
/// to an SRQ. None posted by the deadline: the Terminate of RFC 5041
/// ("invalid MSN, no buffer available"), as Linux siw sends at once.
#[test]
fn a_send_waits_for_a_receive_posted_late() {
    for same_host in [false, true] {
        for srq in [false, true] {
            let what = format!("same_host {same_host}, srq {srq}");
            let dev = Device::open(DeviceConfig {
                publish: false,
                same_host,
                recv_wait: Duration::from_secs(5),
                ..Default::default()
            })
            .unwrap();
            let pd_s = dev.alloc_pd().unwrap();
            let cq_s = dev.create_cq(64).unwrap();
            let shared = srq.then(|| pd_s.create_srq(16, 1).unwrap());
            let mut attr = QpInitAttr::new(&cq_s);
            attr.srq = shared.clone();
            let qp_s = pd_s.create_qp(attr).unwrap();
            let l = dev.listen("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let c = side(&dev, QpCaps::default());
            let t = std::thread::spawn(move || {
                c.qp.connect(addr, &ConnParams::default()).unwrap();
                c
            });
            l.get_request()
                .unwrap()
                .accept(&qp_s, &ConnParams::default())
                .unwrap();
            let c = t.join().unwrap();
            // Three Sends, no receive posted yet: each completes at the
            // sender (handed to the connection), none at the receiver.
            let src = c.pd.alloc_mr(3 * 4096, Access::LOCAL_WRITE).unwrap();
            src.write_at(0, &pattern(3 * 4096, 7));
            for i in 0..3u64 {
                c.qp.post_send(&SendWr::send(i, &[src.sge(i as usize * 4096, 4096)]))
                    .unwrap();
            }
            for _ in 0..3 {
                assert!(wait(&c.cq).is_ok(), "{what}");
            }
            assert!(
                cq_s.wait_one(Duration::from_millis(300)).is_none(),
                "{what}: a completion with no receive posted"
            );
            assert_eq!(qp_s.state(), QpState::Rts, "{what}: the wait failed the QP");
            // Receives posted late, one at a time: each takes the next
            // message.
            let dst = pd_s.alloc_mr(3 * 4096, Access::LOCAL_WRITE).unwrap();
            for i in 0..3u64 {
                let wr = RecvWr::new(10 + i, &[dst.sge(i as usize * 4096, 4096)]);
                match &shared {
                    Some(s) => s.post_recv(&wr).unwrap(),
                    None => qp_s.post_recv(&wr).unwrap(),
                }
                let wc = wait(&cq_s);
                assert!(wc.is_ok(), "{what}: {wc:?}");
                assert_eq!((wc.wr_id, wc.byte_len), (10 + i, 4096), "{what}");
            }
            assert!(dst.to_vec() == pattern(3 * 4096, 7), "{what}: bytes differ");

            // No receive within the wait: the Terminate, the QP in ERROR.
            let dev2 = Device::open(DeviceConfig {
                publish: false,
                same_host,
                recv_wait: Duration::from_millis(200),
                ..Default::default()
            })
            .unwrap();
            let (c, s) = pair_on(
                &dev,
                &dev2,
                ConnParams::default(),
                ConnParams::default(),
                |_| {},
            );
            let m = c.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
            let t0 = std::time::Instant::now();
            c.qp.post_send(&SendWr::send(1, &[m.sge_all()])).unwrap();
            assert!(wait(&c.cq).is_ok(), "{what}");
            let code = loop {
                match s.dev.next_event(T) {
                    Some(AsyncEvent::Terminated { code, by_peer, .. }) => {
                        assert!(!by_peer, "{what}");
                        break code;
                    }
                    Some(_) => continue,
                    None => panic!("{what}: no Terminate"),
                }
            };
            assert_eq!(
                code,
                wire::terminate::codes::DDP_UNTAGGED_NO_BUFFER,
                "{what}"
            );
            assert!(
                t0.elapsed() >= Duration::from_millis(200),
                "{what}: terminated after {:?}, before the wait ran out",
                t0.elapsed()
            );
            assert_eq!(s.qp.state(), QpState::Error, "{what}");
        }
    }
}

/// A Read lands in a registered vector; `into_vec` deregisters it and
/// hands back the same memory (no copy), and the STag is refused after.
#[test]
fn into_vec_returns_the_registered_vector_after_a_read() {
    let (c, s) = pair_with(ConnParams::default(), ConnParams::default(), |_| {});
    let n = 1 << 20;
    let data = pattern(n, 3);
    let remote =
        s.pd.register(data.clone(), Access::LOCAL_WRITE | Access::REMOTE_READ)
            .unwrap();
    let landing = c.pd.register(vec![0; n], Access::LOCAL_WRITE).unwrap();
    let at = landing.as_ptr();
    c.qp.post_send(&SendWr::read(
        1,
        landing.sge_all(),
        remote.addr(),
        remote.rkey(),
    ))
    .unwrap();
    assert_eq!(wait(&c.cq).status, WcStatus::Success);
    let lkey = landing.lkey();
    let got = landing.into_vec();
    assert_eq!(got.as_ptr(), at as *const u8, "the same memory, not a copy");
    assert!(got == data, "the bytes the Read placed");
    // The registration is gone: a Read into it fails locally.
    let sge = Sge {
        addr: at as u64,
        length: 16,
        lkey,
    };
    c.qp.post_send(&SendWr::read(2, sge, remote.addr(), remote.rkey()))
        .unwrap();
    assert_ne!(wait(&c.cq).status, WcStatus::Success);
    // Another kind of region gives a copy of its bytes.
    let owned = c.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    owned.write_at(0, &[9; 64]);
    assert_eq!(owned.into_vec(), vec![9; 64]);
}

/// `try_into_vec` gives the registered vector back whole, spare capacity
/// included (a sender keeps it for its next large message), and nothing
/// for memory the region does not own.
#[test]
fn try_into_vec_returns_the_vector_with_its_capacity() {
    let (c, _s) = pair_with(ConnParams::default(), ConnParams::default(), |_| {});
    let mut v = Vec::with_capacity(3 << 20);
    v.resize(1 << 20, 5u8);
    let at = v.as_ptr();
    let mr = c.pd.register(v, Access::LOCAL_READ).unwrap();
    let got = mr.try_into_vec().expect("no transfer holds it");
    assert_eq!((got.as_ptr(), got.len()), (at, 1 << 20));
    assert!(got.capacity() >= 3 << 20, "shrunk to {}", got.capacity());
    let owned = c.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
    assert!(owned.try_into_vec().is_none());
}
