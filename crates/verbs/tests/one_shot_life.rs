//! The life cycle of one-shot advertisements (`docs/one-shot.md`, issue
//! 29 finding 6): an advertisement the peer does not close ends by a
//! cancel, by its deadline or with the QP, each with one
//! `WcOpcode::AdvertiseEnd` completion; a cancel waits for a placement in
//! flight into the memory; a close racing a cancel completes exactly one
//! of them; the registrations `advertise_buffers` made are released when
//! their advertisement fails and bounded when it succeeds.

mod common;
use common::*;
use softrdma_verbs::wire::terminate::codes;
use softrdma_verbs::*;
use std::sync::mpsc;
use std::time::{Duration, Instant};

const FILL: u8 = 0x5A;

fn ext() -> ConnParams {
    ConnParams {
        extensions: true,
        ..Default::default()
    }
}

/// Two devices without the same-host transport: every Write and Read
/// crosses the stream, where the advertiser's receiver places it.
fn pair_over_tcp(params: ConnParams) -> (Side, Side) {
    let cfg = || DeviceConfig {
        same_host: false,
        ..Default::default()
    };
    let (dc, ds) = (Device::open(cfg()).unwrap(), Device::open(cfg()).unwrap());
    pair_on(&dc, &ds, params.clone(), params, |_| {})
}

/// B's view of a command: the STag it names.
fn receive_command(b: &Side, bbuf: &MemoryRegion) -> Rkey {
    let wc = wait(&b.cq);
    assert_eq!(wc.status, WcStatus::Success, "the command arrived");
    wc.advertised_stag.unwrap_or_else(|| {
        let mut h = [0; 4];
        bbuf.read_at(0, &mut h);
        Rkey::from_raw(u32::from_be_bytes(h))
    })
}

/// A advertises `len` bytes of `data` at `off` with `access`; B receives
/// the command into `bbuf`.
fn advertise_one(
    (a, b, bbuf, data): (&Side, &Side, &MemoryRegion, &MemoryRegion),
    (off, len): (usize, usize),
    access: Access,
    (wr_id, reference): (u64, u64),
    deadline: Option<Instant>,
) -> Rkey {
    b.qp.post_recv(&RecvWr::new(1, &[bbuf.sge(0, 256)]))
        .unwrap();
    let stag =
        a.qp.advertise_until(
            wr_id,
            &[data.sge(off, len)],
            access,
            b"cmd",
            reference,
            deadline,
        )
        .unwrap();
    assert_eq!(receive_command(b, bbuf), stag);
    stag
}

/// The `AdvertiseEnd` completion A must see for `stag`.
fn assert_ended(wc: WorkCompletion, status: WcStatus, wr_id: u64, reference: u64, stag: Rkey) {
    assert_eq!(
        (
            wc.opcode,
            wc.status,
            wc.wr_id,
            wc.reference,
            wc.invalidated_rkey
        ),
        (
            WcOpcode::AdvertiseEnd,
            status,
            wr_id,
            Some(reference),
            Some(stag)
        ),
        "{wc:?}"
    );
}

/// The next Terminated event of QP `qpn` on `dev` (others are skipped).
fn terminated(dev: &Device, qpn: Qpn) -> AsyncEvent {
    let deadline = Instant::now() + T;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match dev.next_event(left) {
            Some(ev @ AsyncEvent::Terminated { qpn: q, .. }) if q == qpn => return ev,
            Some(_) => {}
            None => panic!("no Terminate on QP {qpn:?}"),
        }
    }
}

/// A cancel invalidates, frees and completes (once, with `Cancelled`,
/// before it returns); a peer Read or Write through the STag afterwards
/// gets the invalid-STag Terminate and the memory is unchanged. A second
/// cancel does nothing.
#[test]
fn cancel_then_peer_access_is_refused_and_memory_unchanged() {
    for write in [false, true] {
        let (a, b) = pair_over_tcp(ext());
        let data = a.pd.alloc_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
        data.write_at(0, &[FILL; 64 << 10]);
        let bbuf = b.pd.alloc_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
        bbuf.write_at(4096, &pattern(16 << 10, 3));
        let rw = Access::REMOTE_READ | Access::REMOTE_WRITE;
        let stag = advertise_one((&a, &b, &bbuf, &data), (4096, 16 << 10), rw, (10, 42), None);
        assert_eq!(a.qp.open_advertisements(), 1);
        assert!(a.qp.cancel_advertisement(stag), "it was open");
        let wc =
            a.cq.poll_one()
                .expect("completion queued before the cancel returned");
        assert_ended(wc, WcStatus::Cancelled, 10, 42, stag);
        assert_eq!(a.qp.open_advertisements(), 0);
        assert!(!a.qp.cancel_advertisement(stag), "a second cancel");
        assert_eq!(a.cq.poll_one(), None, "one completion only");
        if write {
            b.qp.post_send(&SendWr::write(2, &[bbuf.sge(4096, 16 << 10)], 0, stag))
                .unwrap();
        } else {
            b.qp.post_send(&SendWr::read(2, bbuf.sge(4096, 16 << 10), 0, stag))
                .unwrap();
            let wc = wait(&b.cq);
            assert_eq!(
                wc.status,
                WcStatus::RemAccessErr,
                "the Read after the cancel"
            );
        }
        match terminated(&a.dev, a.qp.qp_num()) {
            AsyncEvent::Terminated { code, by_peer, .. } => {
                assert!(!by_peer);
                let want = if write {
                    codes::DDP_TAGGED_INVALID_STAG
                } else {
                    codes::RDMAP_INVALID_STAG
                };
                assert_eq!(code, want, "write {write}");
            }
            ev => unreachable!("{ev:?}"),
        }
        assert!(a.qp.wait_state(QpState::Error, T));
        let mut got = vec![0; 64 << 10];
        data.read_at(0, &mut got);
        assert!(
            got.iter().all(|&x| x == FILL),
            "write {write}: memory changed"
        );
        assert_eq!(
            a.cq.poll_one(),
            None,
            "nothing more for the cancelled command"
        );
    }
}

/// A cancel must not return while the engine places an RDMA Write into
/// the advertised memory: a Write's placement is held (its memory entered,
/// the bytes not yet copied) and the cancel waits for it, as a
/// deregistration does; after the cancel returns, nothing more lands (the
/// rest meets a dead STag: Terminate). Memory the engine allocated
/// (`alloc_mr`) and caller memory (`advertise_buffers`).
#[test]
fn cancel_waits_for_a_placement_in_flight() {
    for buffers in [false, true] {
        let (a, b) = pair_over_tcp(ext());
        let data = a.pd.alloc_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
        data.write_at(0, &[FILL; 64 << 10]);
        let mut raw = vec![FILL; 64 << 10];
        let bbuf = b.pd.alloc_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
        bbuf.write_at(4096, &pattern(40 << 10, 5));
        b.qp.post_recv(&RecvWr::new(1, &[bbuf.sge(0, 256)]))
            .unwrap();
        let stag = if buffers {
            // SAFETY: `raw` outlives the QP (dropped after `a`).
            unsafe {
                a.qp.advertise_buffers(
                    10,
                    &[(raw.as_mut_ptr(), 32 << 10)],
                    Access::REMOTE_WRITE,
                    b"cmd",
                    7,
                )
            }
            .unwrap()
        } else {
            a.qp.advertise(
                10,
                &[data.sge(0, 32 << 10)],
                Access::REMOTE_WRITE,
                b"cmd",
                7,
            )
            .unwrap()
        };
        assert_eq!(receive_command(&b, &bbuf), stag);
        let pause = softrdma_verbs::test_hooks::pause_placement(&a.qp);
        b.qp.post_send(&SendWr::write(2, &[bbuf.sge(4096, 32 << 10)], 0, stag))
            .unwrap();
        b.qp.post_send(&SendWr::write(3, &[bbuf.sge(4096, 8 << 10)], 0, stag))
            .unwrap();
        assert!(pause.wait_reached(T), "the Write never reached placement");
        let snapshot = std::thread::scope(|s| {
            let (tx, rx) = mpsc::channel();
            let qp = &a.qp;
            s.spawn(move || tx.send(qp.cancel_advertisement(stag)).unwrap());
            assert_eq!(
                rx.recv_timeout(Duration::from_millis(300)),
                Err(mpsc::RecvTimeoutError::Timeout),
                "buffers {buffers}: the cancel returned under a placement in flight"
            );
            pause.release();
            assert_eq!(
                rx.recv_timeout(T),
                Ok(true),
                "the cancel returned once placement ended"
            );
            // Whatever was placed so far: nothing may change from here on.
            if buffers {
                raw.clone()
            } else {
                data.to_vec()
            }
        });
        assert_ended(wait(&a.cq), WcStatus::Cancelled, 10, 7, stag);
        // The rest of the first Write, or the second, met the dead STag.
        assert!(a.qp.wait_state(QpState::Error, T));
        match terminated(&a.dev, a.qp.qp_num()) {
            AsyncEvent::Terminated { code, .. } => {
                assert_eq!(code, codes::DDP_TAGGED_INVALID_STAG)
            }
            ev => unreachable!("{ev:?}"),
        }
        let now = if buffers { raw.clone() } else { data.to_vec() };
        assert!(
            now == snapshot,
            "buffers {buffers}: bytes placed after the cancel returned"
        );
        assert!(
            now[32 << 10..].iter().all(|&x| x == FILL),
            "outside the advertisement"
        );
        drop(a);
        drop(raw);
    }
}

/// A deadline ends an advertisement the peer does not close, on the
/// engine's timer: `Expired`, in deadline order whatever the order of the
/// advertisements, not before the deadline; the STag grants nothing
/// afterwards. An advertisement closed in time never expires.
#[test]
fn deadline_expires_unclosed_advertisements() {
    let (a, b) = pair_over_tcp(ext());
    let data = a.pd.alloc_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
    let bbuf = b.pd.alloc_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
    let t0 = Instant::now();
    // Closed in time (well before its deadline, even on a loaded
    // machine): no completion but the close's.
    let kept_until = t0 + Duration::from_secs(3);
    let kept = advertise_one(
        (&a, &b, &bbuf, &data),
        (0, 4096),
        Access::REMOTE_READ,
        (9, 900),
        Some(kept_until),
    );
    let mut stags = Vec::new();
    for (k, ms) in [(0u64, 450u64), (1, 150), (2, 300)] {
        let d = t0 + Duration::from_millis(ms);
        stags.push(advertise_one(
            (&a, &b, &bbuf, &data),
            (8192 * (k as usize + 1), 4096),
            Access::REMOTE_READ,
            (10 + k, 100 + k),
            Some(d),
        ));
    }
    a.qp.post_recv(&RecvWr::new(20, &[data.sge(60 << 10, 64)]))
        .unwrap();
    b.qp.post_send(&SendWr::send_close(5, &[bbuf.sge(0, 2)], kept))
        .unwrap();
    assert_eq!(wait(&b.cq).status, WcStatus::Success);
    let wc = wait(&a.cq);
    assert_eq!((wc.wr_id, wc.reference), (20, Some(900)), "{wc:?}");
    for k in [1u64, 2, 0] {
        let wc = wait(&a.cq);
        let ms = [450, 150, 300][k as usize];
        assert!(
            t0.elapsed() >= Duration::from_millis(ms),
            "advertisement {k} expired after {:?}, before its deadline",
            t0.elapsed()
        );
        assert_ended(wc, WcStatus::Expired, 10 + k, 100 + k, stags[k as usize]);
    }
    assert_eq!(a.qp.open_advertisements(), 0);
    let past = (kept_until + Duration::from_millis(300)).saturating_duration_since(Instant::now());
    assert_eq!(
        a.cq.wait_one(past),
        None,
        "the closed advertisement expired too"
    );
    assert!(!a.qp.cancel_advertisement(stags[0]), "expired already");
    b.qp.post_send(&SendWr::read(2, bbuf.sge(4096, 4096), 0, stags[0]))
        .unwrap();
    assert_eq!(wait(&b.cq).status, WcStatus::RemAccessErr);
    assert!(a.qp.wait_state(QpState::Error, T));
}

/// A close that arrives after its advertisement expired (or was
/// cancelled) is a late close: its receive completes with the STag and no
/// reference, the connection goes on, and the advertisement had its one
/// completion. A second close of the same STag is a protocol violation.
#[test]
fn late_close_after_expiry_or_cancel_keeps_the_connection() {
    let (a, b) = pair_over_tcp(ext());
    let data = a.pd.alloc_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
    let bbuf = b.pd.alloc_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
    for (round, cancel) in [(0u64, false), (1, true)] {
        let deadline = (!cancel).then(|| Instant::now() + Duration::from_millis(100));
        let stag = advertise_one(
            (&a, &b, &bbuf, &data),
            (0, 4096),
            Access::REMOTE_READ,
            (10 + round, 50 + round),
            deadline,
        );
        if cancel {
            assert!(a.qp.cancel_advertisement(stag));
        }
        let status = if cancel {
            WcStatus::Cancelled
        } else {
            WcStatus::Expired
        };
        assert_ended(wait(&a.cq), status, 10 + round, 50 + round, stag);
        a.qp.post_recv(&RecvWr::new(20 + round, &[data.sge(60 << 10, 64)]))
            .unwrap();
        b.qp.post_send(&SendWr::send_close(5, &[bbuf.sge(0, 2)], stag))
            .unwrap();
        assert_eq!(wait(&b.cq).status, WcStatus::Success);
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
                20 + round,
                WcStatus::Success,
                WcOpcode::Recv,
                None,
                Some(stag)
            ),
            "round {round}: the late close"
        );
        assert_eq!(a.qp.state(), QpState::Rts, "round {round}");
    }
    // Still a working one-shot connection.
    let stag = advertise_one(
        (&a, &b, &bbuf, &data),
        (0, 4096),
        Access::REMOTE_READ,
        (12, 52),
        None,
    );
    a.qp.post_recv(&RecvWr::new(22, &[data.sge(60 << 10, 64)]))
        .unwrap();
    b.qp.post_send(&SendWr::send_close(5, &[bbuf.sge(0, 2)], stag))
        .unwrap();
    assert_eq!(wait(&a.cq).reference, Some(52));
    // The late close was used up: closing that STag again violates.
    a.qp.post_recv(&RecvWr::new(23, &[data.sge(60 << 10, 64)]))
        .unwrap();
    b.qp.post_send(&SendWr::send_close(6, &[bbuf.sge(0, 2)], stag))
        .unwrap();
    assert_eq!(wait(&a.cq).status, WcStatus::RemInvReqErr);
    assert!(a.qp.wait_state(QpState::Error, T));
}

/// A close racing a cancel: exactly one of them completes the
/// advertisement. Either the cancel returns true, its `Cancelled`
/// completion carries the reference and the close is late (its receive
/// has none), or the cancel returns false and the close's completion
/// carries it; the connection survives either way.
#[test]
fn close_racing_cancel_completes_exactly_one() {
    let (a, b) = pair_over_tcp(ext());
    let data = a.pd.alloc_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
    let bbuf = b.pd.alloc_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
    let (mut cancels, mut closes) = (0, 0);
    for i in 0..200u64 {
        let stag = advertise_one(
            (&a, &b, &bbuf, &data),
            (0, 4096),
            Access::REMOTE_READ,
            (i, 1000 + i),
            None,
        );
        a.qp.post_recv(&RecvWr::new(1 << 32 | i, &[data.sge(60 << 10, 64)]))
            .unwrap();
        let barrier = std::sync::Barrier::new(2);
        let cancelled = std::thread::scope(|s| {
            s.spawn(|| {
                barrier.wait();
                b.qp.post_send(&SendWr::send_close(5, &[bbuf.sge(0, 2)], stag))
                    .unwrap();
            });
            barrier.wait();
            a.qp.cancel_advertisement(stag)
        });
        assert_eq!(wait(&b.cq).status, WcStatus::Success);
        let mut wcs = vec![wait(&a.cq)];
        if cancelled {
            wcs.push(wait(&a.cq));
        }
        let with_ref: Vec<_> = wcs.iter().filter(|w| w.reference.is_some()).collect();
        assert_eq!(with_ref.len(), 1, "round {i}: {wcs:?}");
        assert_eq!(with_ref[0].reference, Some(1000 + i));
        let recv = wcs
            .iter()
            .find(|w| w.opcode == WcOpcode::Recv)
            .expect("the close's receive");
        assert_eq!(
            (recv.wr_id, recv.status, recv.invalidated_rkey),
            (1 << 32 | i, WcStatus::Success, Some(stag))
        );
        if cancelled {
            cancels += 1;
            assert_ended(*with_ref[0], WcStatus::Cancelled, i, 1000 + i, stag);
            assert_eq!(recv.reference, None, "round {i}: a late close");
        } else {
            closes += 1;
            assert_eq!(recv.reference, Some(1000 + i));
        }
        assert_eq!(a.qp.open_advertisements(), 0);
        assert_eq!(a.qp.state(), QpState::Rts);
    }
    assert_eq!(a.cq.poll_one(), None);
    println!("cancel won {cancels} times, the close {closes} times");
}

/// A QP that fails ends its open advertisements, each with a flush
/// completion carrying its reference; nothing stays bound.
#[test]
fn qp_failure_flushes_open_advertisements() {
    let (a, b) = pair_over_tcp(ext());
    let data = a.pd.alloc_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
    let bbuf = b.pd.alloc_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
    let s1 = advertise_one(
        (&a, &b, &bbuf, &data),
        (0, 4096),
        Access::REMOTE_READ,
        (1, 11),
        None,
    );
    let s2 = advertise_one(
        (&a, &b, &bbuf, &data),
        (8192, 4096),
        Access::REMOTE_WRITE,
        (2, 12),
        Some(Instant::now() + Duration::from_secs(60)),
    );
    a.qp.modify(QpState::Error).unwrap();
    let mut got = [wait(&a.cq), wait(&a.cq)];
    got.sort_by_key(|w| w.wr_id);
    assert_ended(got[0], WcStatus::WrFlushErr, 1, 11, s1);
    assert_ended(got[1], WcStatus::WrFlushErr, 2, 12, s2);
    assert_eq!(a.qp.open_advertisements(), 0);
    assert_eq!(a.cq.wait_one(Duration::from_millis(100)), None);
}

/// The registration cache's policy: a registration whose last
/// advertisement is cancelled (or expires) is released at once; one still
/// used by another open advertisement stays; after a close it stays cached
/// (reused by the next command), the idle ones bounded by
/// `REG_CACHE_IDLE_MAX`, and `trim_registration_cache` releases them.
#[test]
fn cached_registrations_are_released_or_bounded() {
    let (a, b) = pair_over_tcp(ext());
    let bbuf = b.pd.alloc_mr(64 << 10, Access::LOCAL_WRITE).unwrap();
    let resp = a.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    let page = 4096;
    let n = REG_CACHE_IDLE_MAX + 6;
    // One buffer per page, a page apart: one registration each.
    let mut mem = vec![FILL; (2 * n + 2) * page];
    let base = mem.as_mut_ptr();
    let buf = |i: usize| {
        // SAFETY: within `mem` (i < n + 1).
        (unsafe { base.add(2 * i * page + 100) }, 200)
    };
    let advertise = |bufs: &[(*mut u8, usize)], reference: u64, deadline: Option<Instant>| {
        b.qp.post_recv(&RecvWr::new(1, &[bbuf.sge(0, 256)]))
            .unwrap();
        // SAFETY: `mem` outlives the QP (dropped after `a`).
        let stag = unsafe {
            a.qp.advertise_buffers_until(7, bufs, Access::REMOTE_READ, b"c", reference, deadline)
        }
        .unwrap();
        assert_eq!(receive_command(&b, &bbuf), stag);
        stag
    };
    let close = |stag: Rkey, reference: u64| {
        a.qp.post_recv(&RecvWr::new(20, &[resp.sge(0, 64)]))
            .unwrap();
        b.qp.post_send(&SendWr::send_close(5, &[bbuf.sge(0, 2)], stag))
            .unwrap();
        assert_eq!(wait(&b.cq).status, WcStatus::Success);
        let wc = wait(&a.cq);
        assert_eq!(
            (wc.status, wc.reference),
            (WcStatus::Success, Some(reference))
        );
    };
    // Cancelled: released at once.
    let s = advertise(&[buf(0)], 1, None);
    assert_eq!(a.qp.cached_registrations(), 1);
    assert!(a.qp.cancel_advertisement(s));
    assert_ended(wait(&a.cq), WcStatus::Cancelled, 7, 1, s);
    assert_eq!(a.qp.cached_registrations(), 0, "released with the cancel");
    // Expired: released too.
    let s = advertise(
        &[buf(0)],
        2,
        Some(Instant::now() + Duration::from_millis(50)),
    );
    assert_ended(wait(&a.cq), WcStatus::Expired, 7, 2, s);
    assert_eq!(a.qp.cached_registrations(), 0, "released when it expired");
    // Two open over one registration: the cancel of one keeps it.
    let s1 = advertise(&[buf(0)], 3, None);
    let s2 = advertise(&[buf(0)], 4, None);
    assert_eq!(a.qp.cached_registrations(), 1);
    assert!(a.qp.cancel_advertisement(s1));
    assert_ended(wait(&a.cq), WcStatus::Cancelled, 7, 3, s1);
    assert_eq!(a.qp.cached_registrations(), 1, "still used by the other");
    close(s2, 4);
    assert_eq!(a.qp.cached_registrations(), 1, "kept for the next command");
    // Many closed commands over distinct memory: bounded.
    for i in 0..n {
        let s = advertise(&[buf(i)], 100 + i as u64, None);
        close(s, 100 + i as u64);
        assert!(
            a.qp.cached_registrations() <= REG_CACHE_IDLE_MAX,
            "command {i}"
        );
    }
    assert_eq!(a.qp.cached_registrations(), REG_CACHE_IDLE_MAX);
    // The most recently used stayed: the last buffer's command reuses it.
    let s = advertise(&[buf(n - 1)], 999, None);
    assert_eq!(a.qp.cached_registrations(), REG_CACHE_IDLE_MAX, "reused");
    assert_eq!(
        a.qp.trim_registration_cache(),
        REG_CACHE_IDLE_MAX - 1,
        "all but the open one"
    );
    assert_eq!(a.qp.cached_registrations(), 1);
    close(s, 999);
    drop(a);
    drop(mem);
}
