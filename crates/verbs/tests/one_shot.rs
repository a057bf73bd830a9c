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
/// and the real binding is released with the QP.
#[test]
fn close_of_an_unknown_stag_is_a_protocol_violation() {
    let (a, b) = pair_with(ext(), ext(), |_| {});
    let data = a.pd.alloc_mr(128 << 10, Access::LOCAL_WRITE).unwrap();
    let bbuf = b.pd.alloc_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
    let (stag, _) = advertise(&a, &b, &data, &bbuf, 42);
    a.qp.post_recv(&RecvWr::new(20, &[data.sge(100 << 10, 64)]))
        .unwrap();
    b.qp.post_send(&SendWr::send_close(
        5,
        &[bbuf.sge(0, 2)],
        Rkey::from_raw(stag.raw() ^ 0x55),
    ))
    .unwrap();
    let wc = wait(&a.cq);
    assert_eq!((wc.wr_id, wc.status), (20, WcStatus::RemInvReqErr));
    assert!(a.qp.wait_state(QpState::Error, T));
    assert_eq!(
        a.qp.open_advertisements(),
        1,
        "the real binding is still ours"
    );
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
