//! One-shot advertise and close (`docs/one-shot.md`): one call binds a
//! fresh STag over an SGL and sends the command; the peer's close
//! invalidates and frees the binding before the initiator's completion,
//! which carries the STag and the reference. With the extension
//! negotiated the STag rides in the RDMAP header; without it, in the
//! payload, and the close is a standard Send with Invalidate.

mod common;
use common::*;
use softrdma_verbs::*;

fn ext() -> ConnParams {
    ConnParams {
        extensions: true,
        ..Default::default()
    }
}

struct Cmd {
    stag: Rkey,
    payload: Vec<u8>,
}

/// A advertises 40 KiB in two pieces with a command; B receives it.
fn advertise(a: &Side, b: &Side, data: &MemoryRegion, bbuf: &MemoryRegion, r: u64) -> (Rkey, Cmd) {
    b.qp.post_recv(&RecvWr::new(1, &[bbuf.sge(0, 256)]))
        .unwrap();
    let stag =
        a.qp.advertise(
            10,
            &[data.sge(0, 30 << 10), data.sge(50 << 10, 10 << 10)],
            Access::REMOTE_READ,
            b"WRITE lba=7 len=40K",
            r,
        )
        .unwrap();
    assert_eq!(a.qp.open_advertisements(), 1);
    let wc = wait(&b.cq);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::Success));
    let mut payload = vec![0; wc.byte_len as usize];
    bbuf.read_at(0, &mut payload);
    let seen = match wc.advertised_stag {
        Some(s) => s,
        None => Rkey::from_raw(u32::from_be_bytes(payload[..4].try_into().unwrap())),
    };
    (
        stag,
        Cmd {
            stag: seen,
            payload,
        },
    )
}

/// B reads the advertised bytes and closes; A sees one completion with the
/// STag and the reference, the binding gone.
fn read_and_close(
    a: &Side,
    b: &Side,
    data: &MemoryRegion,
    bbuf: &MemoryRegion,
    stag: Rkey,
    close: SendWr,
) {
    b.qp.post_send(&SendWr::read(2, bbuf.sge(4096, 40 << 10), 0, stag))
        .unwrap();
    assert_eq!(wait(&b.cq).status, WcStatus::Success);
    let mut got = vec![0; 40 << 10];
    bbuf.read_at(4096, &mut got);
    let mut want = vec![0; 40 << 10];
    data.read_at(0, &mut want[..30 << 10]);
    data.read_at(50 << 10, &mut want[30 << 10..]);
    assert!(got == want, "B read the advertised SGL");
    a.qp.post_recv(&RecvWr::new(20, &[data.sge(100 << 10, 64)]))
        .unwrap();
    b.qp.post_send(&close).unwrap();
    assert_eq!(wait(&b.cq).status, WcStatus::Success);
    let wc = wait(&a.cq);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode),
        (20, WcStatus::Success, WcOpcode::Recv)
    );
    assert_eq!(wc.invalidated_rkey, Some(stag));
    assert_eq!(wc.reference, Some(42));
    assert_eq!(a.qp.open_advertisements(), 0);
    // The binding is gone: a Read through it now fails the connection.
    b.qp.post_send(&SendWr::read(3, bbuf.sge(0, 16), 0, stag))
        .unwrap();
    assert_ne!(wait(&b.cq).status, WcStatus::Success);
    assert!(b.qp.wait_state(QpState::Error, T));
}

#[test]
fn negotiated_stag_in_the_header() {
    let (a, b) = pair_with(ext(), ext(), |_| {});
    assert!(a.qp.conn_params().unwrap().one_shot);
    let data = a.pd.alloc_mr(128 << 10, Access::LOCAL_WRITE).unwrap();
    data.write_at(0, &pattern(128 << 10, 4));
    let bbuf = b.pd.alloc_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
    let (stag, cmd) = advertise(&a, &b, &data, &bbuf, 42);
    assert_eq!(cmd.stag, stag, "the STag arrived in the header");
    assert_eq!(cmd.payload, b"WRITE lba=7 len=40K", "payload untouched");
    read_and_close(
        &a,
        &b,
        &data,
        &bbuf,
        stag,
        SendWr::send_close(5, &[bbuf.sge(0, 2)], stag),
    );
}

/// Without the extension (what a siw peer sees): the STag leads the
/// payload; the close is a standard Send with Invalidate, whether the
/// peer posts it as such or as a close.
#[test]
fn standard_peer_fallback() {
    for standard_close in [false, true] {
        let (a, b) = pair();
        assert!(!a.qp.conn_params().unwrap().one_shot);
        let data = a.pd.alloc_mr(128 << 10, Access::LOCAL_WRITE).unwrap();
        data.write_at(0, &pattern(128 << 10, 9));
        let bbuf = b.pd.alloc_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
        let (stag, cmd) = advertise(&a, &b, &data, &bbuf, 42);
        assert_eq!(cmd.stag, stag, "the STag leads the payload");
        assert_eq!(&cmd.payload[4..], b"WRITE lba=7 len=40K");
        let close = if standard_close {
            SendWr::send_inv(5, &[bbuf.sge(0, 2)], stag)
        } else {
            SendWr::send_close(5, &[bbuf.sge(0, 2)], stag)
        };
        read_and_close(&a, &b, &data, &bbuf, stag, close);
    }
}

/// A close naming an STag the initiator never advertised (here: another
/// key byte) is a protocol violation: RemInvReqErr, the connection ends,
/// and the real binding ends with the QP's flush (a flush completion with
/// its reference), whether the close asked for a solicited event or not.
#[test]
fn close_of_an_unknown_stag_is_a_protocol_violation() {
    for solicited in [false, true] {
        let (a, b) = pair_with(ext(), ext(), |_| {});
        assert!(a.qp.conn_params().unwrap().one_shot_se);
        let data = a.pd.alloc_mr(128 << 10, Access::LOCAL_WRITE).unwrap();
        let bbuf = b.pd.alloc_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
        let (stag, _) = advertise(&a, &b, &data, &bbuf, 42);
        a.qp.post_recv(&RecvWr::new(20, &[data.sge(100 << 10, 64)]))
            .unwrap();
        let mut close = SendWr::send_close(5, &[bbuf.sge(0, 2)], Rkey::from_raw(stag.raw() ^ 0x55));
        if solicited {
            close.flags = close.flags | SendFlags::SOLICITED;
        }
        b.qp.post_send(&close).unwrap();
        let wc = wait(&a.cq);
        assert_eq!((wc.wr_id, wc.status), (20, WcStatus::RemInvReqErr));
        assert!(a.qp.wait_state(QpState::Error, T));
        let wc = wait(&a.cq);
        assert_eq!(
            (
                wc.wr_id,
                wc.status,
                wc.opcode,
                wc.reference,
                wc.invalidated_rkey
            ),
            (
                10,
                WcStatus::WrFlushErr,
                WcOpcode::AdvertiseEnd,
                Some(42),
                Some(stag)
            ),
            "the real binding ends with the QP"
        );
        assert_eq!(a.qp.open_advertisements(), 0);
    }
}

/// Memory that was never registered: `advertise_buffers` registers its
/// pages on first use and reuses that registration for later commands over
/// the same memory; the peer reads exactly the advertised bytes.
#[test]
fn unregistered_buffers_are_registered_once_and_reused() {
    let (a, b) = pair_with(ext(), ext(), |_| {});
    let mut mem = pattern(100 << 10, 21);
    let mut other = pattern(8192, 22);
    let bbuf = b.pd.alloc_mr(128 << 10, Access::LOCAL_WRITE).unwrap();
    let base = mem.as_mut_ptr();
    // Round 0 advertises all of `mem` (registered then); round 1 two
    // pieces inside it (covered: no new registration).
    for (round, (off, len, off2, len2)) in [
        (0usize, 60 << 10, 60 << 10, 40 << 10),
        (100, 1000, 50_000, 9),
    ]
    .into_iter()
    .enumerate()
    {
        b.qp.post_recv(&RecvWr::new(1, &[bbuf.sge(0, 256)]))
            .unwrap();
        // SAFETY: `mem` outlives the close awaited below.
        let stag = unsafe {
            a.qp.advertise_buffers(
                1,
                &[(base.add(off), len), (base.add(off2), len2)],
                Access::REMOTE_READ,
                b"cmd",
                round as u64,
            )
        }
        .unwrap();
        assert_eq!(
            a.qp.cached_registrations(),
            1,
            "round {round}: one registration covers it"
        );
        let wc = wait(&b.cq);
        assert_eq!(wc.advertised_stag, Some(stag));
        b.qp.post_send(&SendWr::read(
            2,
            bbuf.sge(4096, len + len2),
            0,
            Rkey::from_raw(stag.raw()),
        ))
        .unwrap();
        assert_eq!(wait(&b.cq).status, WcStatus::Success);
        let mut got = vec![0; len + len2];
        bbuf.read_at(4096, &mut got);
        let mut want = mem[off..off + len].to_vec();
        want.extend_from_slice(&mem[off2..off2 + len2]);
        assert!(got == want, "round {round}");
        let resp = a.pd.alloc_mr(64, Access::LOCAL_WRITE).unwrap();
        a.qp.post_recv(&RecvWr::new(21, &[resp.sge(0, 64)]))
            .unwrap();
        b.qp.post_send(&SendWr::send_close(
            5,
            &[bbuf.sge(0, 2)],
            Rkey::from_raw(stag.raw()),
        ))
        .unwrap();
        assert_eq!(wait(&b.cq).status, WcStatus::Success);
        let wc = wait(&a.cq);
        assert_eq!(
            (wc.status, wc.reference),
            (WcStatus::Success, Some(round as u64))
        );
    }
    // Other memory: a second registration.
    b.qp.post_recv(&RecvWr::new(1, &[bbuf.sge(0, 256)]))
        .unwrap();
    // SAFETY: `other` outlives the QP's use of it (the QP is dropped first
    // at the end of the test, freeing the binding).
    unsafe {
        a.qp.advertise_buffers(
            3,
            &[(other.as_mut_ptr(), 8192)],
            Access::REMOTE_READ,
            b"x",
            9,
        )
    }
    .unwrap();
    assert_eq!(a.qp.cached_registrations(), 2);
    let _ = wait(&b.cq);
    drop(a);
    drop(other);
    drop(mem);
}

/// Devices without the same-host transport: every Write and Read crosses
/// the connection's stream, where the receiver places it.
fn pair_over_tcp(params: ConnParams) -> (Side, Side) {
    let cfg = || DeviceConfig {
        same_host: false,
        ..Default::default()
    };
    let (dc, ds) = (Device::open(cfg()).unwrap(), Device::open(cfg()).unwrap());
    pair_on(&dc, &ds, params.clone(), params, |_| {})
}

/// A close sent with `SendFlags::SOLICITED` gives the advertiser a
/// solicited receive completion, which fires a solicited-only CQ
/// notification; a close without it does not. With the extension both
/// ways (0xE here; the negotiated close used to drop the flag), and
/// without it (a standard Send with Solicited Event and Invalidate, as a
/// siw peer sends), posted as a close or as a Send with Invalidate.
#[test]
fn solicited_close_wakes_a_solicited_only_notification() {
    for (extensions, standard_close) in [(true, false), (false, false), (false, true)] {
        let case = format!("extensions {extensions}, standard close {standard_close}");
        let params = if extensions {
            ext()
        } else {
            ConnParams::default()
        };
        let (a, b) = pair_with(params.clone(), params, |_| {});
        assert_eq!(a.qp.conn_params().unwrap().one_shot, extensions);
        let data = a.pd.alloc_mr(128 << 10, Access::LOCAL_WRITE).unwrap();
        let bbuf = b.pd.alloc_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
        for (round, solicited) in [(0u64, false), (1, true)] {
            let (stag, _) = advertise(&a, &b, &data, &bbuf, 42 + round);
            a.qp.post_recv(&RecvWr::new(20 + round, &[data.sge(100 << 10, 64)]))
                .unwrap();
            a.cq.req_notify(true);
            let mut close = if standard_close {
                SendWr::send_inv(5, &[bbuf.sge(0, 2)], stag)
            } else {
                SendWr::send_close(5, &[bbuf.sge(0, 2)], stag)
            };
            if solicited {
                close.flags = close.flags | SendFlags::SOLICITED;
            }
            b.qp.post_send(&close).unwrap();
            assert_eq!(wait(&b.cq).status, WcStatus::Success, "{case}");
            let wc = wait(&a.cq);
            assert_eq!(
                (wc.wr_id, wc.status, wc.opcode, wc.reference),
                (
                    20 + round,
                    WcStatus::Success,
                    WcOpcode::Recv,
                    Some(42 + round)
                ),
                "{case}"
            );
            assert_eq!(wc.invalidated_rkey, Some(stag), "{case}");
            assert_eq!(wc.solicited, solicited, "{case}: the completion's flag");
            if solicited {
                assert!(
                    a.cq.wait_event(Some(T)),
                    "{case}: the solicited close did not fire the notification"
                );
                a.cq.ack_events();
            } else {
                assert!(
                    !a.cq.cancel_notify(),
                    "{case}: a close without Solicited Event fired a solicited-only notification"
                );
            }
            assert_eq!(a.qp.open_advertisements(), 0);
        }
        assert_eq!(a.qp.state(), QpState::Rts, "{case}");
    }
}

/// The write direction (a storage read): A advertises a two-piece SGL for
/// the peer to write; B RDMA-Writes 40 KiB at address 0 of the STag in
/// two Writes (the second crosses from the first piece into the second)
/// and closes. A's
/// single completion carries the reference; the advertised bytes hold
/// exactly what B wrote, and the memory around the pieces is untouched.
/// Registered memory and `advertise_buffers` memory, with the extension and
/// without it, with and without the same-host transport.
#[test]
fn write_direction_peer_writes_then_closes() {
    const FILL: u8 = 0x5A;
    for (extensions, tcp_only, buffers) in [
        (true, false, false),
        (true, true, false),
        (false, false, false),
        (true, true, true),
        (false, true, true),
    ] {
        let case = format!("extensions {extensions}, TCP only {tcp_only}, buffers {buffers}");
        let params = if extensions {
            ext()
        } else {
            ConnParams::default()
        };
        let (a, b) = if tcp_only {
            pair_over_tcp(params)
        } else {
            pair_with(params.clone(), params, |_| {})
        };
        let data = a.pd.alloc_mr(128 << 10, Access::LOCAL_WRITE).unwrap();
        data.write_at(0, &[FILL; 128 << 10]);
        let mut raw = vec![FILL; 128 << 10];
        let bbuf = b.pd.alloc_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
        let want = pattern(40 << 10, 77);
        bbuf.write_at(4096, &want);
        b.qp.post_recv(&RecvWr::new(1, &[bbuf.sge(0, 256)]))
            .unwrap();
        let access = Access::REMOTE_WRITE;
        let stag = if buffers {
            let base = raw.as_mut_ptr();
            // SAFETY: `raw` outlives the close awaited below and the QP.
            unsafe {
                a.qp.advertise_buffers(
                    10,
                    &[(base, 30 << 10), (base.add(50 << 10), 10 << 10)],
                    access,
                    b"READ lba=7 len=40K",
                    42,
                )
            }
            .unwrap()
        } else {
            a.qp.advertise(
                10,
                &[data.sge(0, 30 << 10), data.sge(50 << 10, 10 << 10)],
                access,
                b"READ lba=7 len=40K",
                42,
            )
            .unwrap()
        };
        let wc = wait(&b.cq);
        assert_eq!(wc.status, WcStatus::Success, "{case}");
        let seen = match wc.advertised_stag {
            Some(s) => s,
            None => {
                let mut h = [0; 4];
                bbuf.read_at(0, &mut h);
                Rkey::from_raw(u32::from_be_bytes(h))
            }
        };
        assert_eq!(seen, stag, "{case}");
        // Two Writes, the second crossing from the first piece into the
        // second.
        b.qp.post_send(&SendWr::write(2, &[bbuf.sge(4096, 20 << 10)], 0, stag))
            .unwrap();
        b.qp.post_send(&SendWr::write(
            3,
            &[bbuf.sge(4096 + (20 << 10), 20 << 10)],
            20 << 10,
            stag,
        ))
        .unwrap();
        a.qp.post_recv(&RecvWr::new(20, &[data.sge(100 << 10, 64)]))
            .unwrap();
        b.qp.post_send(&SendWr::send_close(5, &[bbuf.sge(0, 2)], stag))
            .unwrap();
        for _ in 0..3 {
            assert_eq!(wait(&b.cq).status, WcStatus::Success, "{case}");
        }
        let wc = wait(&a.cq);
        assert_eq!(
            (wc.wr_id, wc.status, wc.reference, wc.invalidated_rkey),
            (20, WcStatus::Success, Some(42), Some(stag)),
            "{case}"
        );
        assert_eq!(a.qp.open_advertisements(), 0, "{case}");
        let mut got = vec![0; 128 << 10];
        if buffers {
            got.copy_from_slice(&raw);
        } else {
            data.read_at(0, &mut got);
        }
        assert!(got[..30 << 10] == want[..30 << 10], "{case}: first piece");
        assert!(
            got[50 << 10..60 << 10] == want[30 << 10..],
            "{case}: second piece"
        );
        assert!(
            got[30 << 10..50 << 10].iter().all(|&x| x == FILL),
            "{case}: between the pieces"
        );
        assert!(
            got[60 << 10..100 << 10].iter().all(|&x| x == FILL),
            "{case}: after the pieces"
        );
        drop(a);
        drop(raw);
    }
}

/// Shared bytes registered read-only (`register_bytes`) are lent where
/// they lie: a gather list of a vector of the caller's and the shared
/// bytes reads back as their concatenation. Nothing makes them writable:
/// write access at registration, an advertisement with remote write, a
/// fast-register granting remote write (refused only since it checks the
/// regions it maps, as this test first showed) and a Receive into them are
/// all refused, and the bytes are unchanged.
#[test]
fn shared_bytes_are_lent_read_only() {
    let shared = bytes::Bytes::from(pattern(48 << 10, 5));
    let reads = Access::LOCAL_READ;
    let opts = RegOptions::default;
    // Lent as the second piece of a gather list.
    let (a, b) = pair_with(ext(), ext(), |_| {});
    for bad in [
        Access::LOCAL_WRITE,
        Access::REMOTE_WRITE,
        Access::REMOTE_ATOMIC,
    ] {
        assert!(
            a.pd.register_bytes(shared.clone(), bad, opts()).is_err(),
            "{bad:?} granted over shared bytes"
        );
    }
    assert!(a
        .pd
        .register_bytes(bytes::Bytes::new(), reads, opts())
        .is_err());
    let mr = a.pd.register_bytes(shared.clone(), reads, opts()).unwrap();
    let head = a.pd.register(pattern(100, 6), reads).unwrap();
    assert!(a
        .qp
        .advertise(9, &[mr.sge_all()], Access::REMOTE_WRITE, b"w", 1)
        .is_err());
    let bbuf = b.pd.alloc_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
    b.qp.post_recv(&RecvWr::new(1, &[bbuf.sge(0, 256)]))
        .unwrap();
    let stag =
        a.qp.advertise(
            10,
            &[head.sge_all(), mr.sge_all()],
            Access::REMOTE_READ,
            b"pull",
            42,
        )
        .unwrap();
    assert_eq!(wait(&b.cq).status, WcStatus::Success);
    let len = 100 + (48 << 10);
    b.qp.post_send(&SendWr::read(2, bbuf.sge(4096, len), 0, stag))
        .unwrap();
    assert_eq!(wait(&b.cq).status, WcStatus::Success);
    let mut got = vec![0; len];
    bbuf.read_at(4096, &mut got);
    let mut want = pattern(100, 6);
    want.extend_from_slice(&shared);
    assert!(
        got == want,
        "the gather list read back as its concatenation"
    );
    // A fast-register granting remote write over them fails.
    let fr = a.pd.alloc_fast_reg_mr().unwrap();
    a.qp.post_send(&SendWr::fast_reg(
        8,
        &fr,
        0x21,
        &[mr.sge_all()],
        0,
        Access::REMOTE_READ | Access::REMOTE_WRITE,
    ))
    .unwrap();
    let wc = wait(&a.cq);
    assert_eq!((wc.wr_id, wc.status), (8, WcStatus::LocProtErr));
    assert_eq!(fr.current_stag(), None);
    // A Receive into them takes no bytes.
    let (c, d) = pair();
    let mr = c.pd.register_bytes(shared.clone(), reads, opts()).unwrap();
    let sent = d.pd.register(pattern(64, 7), reads).unwrap();
    match c.qp.post_recv(&RecvWr::new(3, &[mr.sge(0, 64)])) {
        Err(_) => {}
        Ok(()) => {
            d.qp.post_send(&SendWr::send(4, &[sent.sge_all()])).unwrap();
            let wc = wait(&c.cq);
            assert_eq!(wc.wr_id, 3);
            assert_ne!(wc.status, WcStatus::Success, "a Receive wrote shared bytes");
        }
    }
    drop(mr);
    assert!(
        shared[..] == pattern(48 << 10, 5)[..],
        "the shared bytes changed"
    );
}
