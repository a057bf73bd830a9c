//! The same-host transport: two softrdma ends on one host that connect
//! with extensions reach each other's memory directly for RDMA Write and
//! Read (`docs/same-host.md`), with the STag checks of the TCP path, in
//! RDMA's order, and never into memory being released.

mod common;
use common::*;
use softrdma_verbs::*;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

fn ext() -> ConnParams {
    ConnParams {
        extensions: true,
        ..Default::default()
    }
}

#[test]
fn negotiated_with_extensions_only() {
    let (c, s) = pair_with(ext(), ConnParams::default(), |_| {});
    assert!(c.qp.conn_params().unwrap().same_host);
    assert!(s.qp.conn_params().unwrap().same_host);
    assert_eq!(c.qp.same_host_stats(), Some(SameHostStats::default()));
    let (c, s) = pair();
    assert!(!c.qp.conn_params().unwrap().same_host);
    assert!(!s.qp.conn_params().unwrap().same_host);
    assert_eq!(c.qp.same_host_stats(), None);
    // A device that does not offer it.
    let off = Device::open(DeviceConfig {
        same_host: false,
        ..Default::default()
    })
    .unwrap();
    let on = Device::open_default().unwrap();
    for (a, b) in [(&off, &on), (&on, &off)] {
        let (c, s) = pair_on(a, b, ext(), ConnParams::default(), |_| {});
        assert!(!c.qp.conn_params().unwrap().same_host);
        assert!(!s.qp.conn_params().unwrap().same_host);
        assert!(
            c.qp.conn_params().unwrap().rfc7306,
            "the other extensions stay"
        );
    }
}

/// Writes and Reads of many sizes and offsets, multi-SGE locally: every
/// byte lands where it should, and each one went the direct way.
#[test]
fn writes_and_reads_go_direct() {
    let (c, s) = pair_with(ext(), ConnParams::default(), |_| {});
    let n = 1 << 20;
    let remote = s.pd.alloc_mr(n, Access::ALL).unwrap();
    let a = c.pd.alloc_mr(n, Access::LOCAL_WRITE).unwrap();
    let b = c.pd.alloc_mr(n, Access::LOCAL_WRITE).unwrap();
    let data = pattern(n, 17);
    a.write_at(0, &data);
    let mut ops = 0;
    for (i, &(off, len)) in [(0, 1), (7, 4096), (4096, 65_536), (100, 300_000), (0, n)]
        .iter()
        .enumerate()
    {
        // Write from two SGEs of the local region.
        let half = len / 2;
        c.qp.post_send(&SendWr::write(
            i as u64,
            &[a.sge(off, half), a.sge(off + half, len - half)],
            remote.addr() + off as u64,
            remote.rkey(),
        ))
        .unwrap();
        assert!(wait(&c.cq).is_ok());
        let mut got = vec![0; len];
        remote.read_at(off, &mut got);
        assert!(got == data[off..off + len], "write at {off} len {len}");
        // And read it back into the other region.
        c.qp.post_send(&SendWr::read(
            100 + i as u64,
            b.sge(off, len),
            remote.addr() + off as u64,
            remote.rkey(),
        ))
        .unwrap();
        assert!(wait(&c.cq).is_ok());
        let mut back = vec![0; len];
        b.read_at(off, &mut back);
        assert!(back == data[off..off + len], "read at {off} len {len}");
        ops += 2;
    }
    // alloc_mr memory lives in the device's shared chunks: mapped.
    assert_eq!(
        c.qp.same_host_stats(),
        Some(SameHostStats {
            direct_ops: ops,
            mapped_ops: ops,
            tcp_fallbacks: 0,
            ring_bytes: 0,
            ring_waits: 0,
        })
    );
}

/// What the fast path cannot check successfully goes on the TCP stream,
/// where the engine refuses it with the RFC's Terminate, as without it: a
/// refused Read completes with the remote access error, a refused Write
/// leaves the target untouched and both QPs in ERROR.
#[test]
fn refusals_take_the_tcp_path() {
    let rw = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
    for (what, access, bad_key, off) in [
        (
            "no remote read",
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            false,
            0u64,
        ),
        ("wrong key", rw, true, 0),
        ("past the end", rw, false, 60),
    ] {
        let (c, s) = pair_with(ext(), ConnParams::default(), |_| {});
        let target = s.pd.alloc_mr(64, access).unwrap();
        let sink = c.pd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
        let rkey = if bad_key {
            Rkey::from_raw(target.rkey().raw() ^ 0x33)
        } else {
            target.rkey()
        };
        c.qp.post_send(&SendWr::read(1, sink.sge_all(), target.addr() + off, rkey))
            .unwrap();
        let wc = wait(&c.cq);
        assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RemAccessErr), "{what}");
        assert!(s.qp.wait_state(QpState::Error, T), "{what}");
        assert_eq!(c.qp.same_host_stats().unwrap().direct_ops, 0, "{what}");
        assert_eq!(c.qp.same_host_stats().unwrap().tcp_fallbacks, 1, "{what}");
    }
    for (what, access, bad_key, off) in [
        (
            "no remote write",
            Access::LOCAL_WRITE | Access::REMOTE_READ,
            false,
            0u64,
        ),
        ("wrong key", rw, true, 0),
        ("past the end", rw, false, 60),
    ] {
        let (c, s) = pair_with(ext(), ConnParams::default(), |_| {});
        let target = s.pd.alloc_mr(64, access).unwrap();
        target.write_at(0, &[0x11; 64]);
        let src = c.pd.alloc_mr(8, Access::LOCAL_WRITE).unwrap();
        let rkey = if bad_key {
            Rkey::from_raw(target.rkey().raw() ^ 0x33)
        } else {
            target.rkey()
        };
        c.qp.post_send(&SendWr::write(
            1,
            &[src.sge_all()],
            target.addr() + off,
            rkey,
        ))
        .unwrap();
        assert!(s.qp.wait_state(QpState::Error, T), "{what}");
        assert!(c.qp.wait_state(QpState::Error, T), "{what}");
        assert_eq!(target.to_vec(), vec![0x11; 64], "{what}: untouched");
        assert_eq!(c.qp.same_host_stats().unwrap().direct_ops, 0, "{what}");
    }
}

/// RDMA order: a Write behind an atomic to the same word lands after it.
/// The atomic travels on the stream, so the Write must wait for the peer
/// to have processed it, not overtake it by copying at once.
#[test]
fn direct_copies_keep_rdma_order() {
    let (c, s) = pair_with(ext(), ConnParams::default(), |_| {});
    let target = s.pd.alloc_mr(8, Access::ALL).unwrap();
    let res = c.pd.alloc_mr(16, Access::LOCAL_WRITE).unwrap();
    res.write_at(8, &100u64.to_ne_bytes());
    for round in 0..200u64 {
        target.write_at(0, &round.to_ne_bytes());
        c.qp.post_send_batch(&[
            SendWr::fetch_add(1, res.sge(0, 8), target.addr(), target.rkey(), 1).unsignaled(),
            SendWr::write(2, &[res.sge(8, 8)], target.addr(), target.rkey()).unsignaled(),
            SendWr::read(3, res.sge(0, 8), target.addr(), target.rkey()),
        ])
        .unwrap();
        assert!(wait(&c.cq).is_ok());
        let mut b = [0u8; 8];
        res.read_at(0, &mut b);
        assert_eq!(
            u64::from_ne_bytes(b),
            100,
            "round {round}: the Write came last"
        );
    }
    let st = c.qp.same_host_stats().unwrap();
    assert!(
        st.tcp_fallbacks > 0,
        "the Writes behind atomics waited: {st:?}"
    );
}

/// Invalidation waits for direct copies in progress: once `set_valid(false)`
/// returns, nothing more lands in the region, however hard a peer writes.
#[test]
fn nothing_lands_after_invalidation_returns() {
    for round in 0..30 {
        let (c, s) = pair_with(ext(), ConnParams::default(), |_| {});
        let n = 256 << 10;
        let target = s.pd.alloc_mr(n, Access::ALL).unwrap();
        let src = c.pd.alloc_mr(n, Access::LOCAL_WRITE).unwrap();
        src.write_at(0, &vec![0xAB; n]);
        let (addr, rkey) = (target.addr(), target.rkey());
        let started = Arc::new(AtomicBool::new(false));
        let st = started.clone();
        let writer = std::thread::spawn(move || {
            let mut posted = 0u64;
            // Writes until the QP fails (the write after invalidation is
            // refused on the TCP path).
            loop {
                let wrs: Vec<SendWr> = (0..8)
                    .map(|k| {
                        let w = SendWr::write(posted + k, &[src.sge_all()], addr, rkey);
                        if k == 7 {
                            w
                        } else {
                            w.unsignaled()
                        }
                    })
                    .collect();
                if c.qp.post_send_batch(&wrs).is_err() {
                    break;
                }
                posted += 8;
                st.store(true, Ordering::Release);
                let wc = wait(&c.cq);
                if !wc.is_ok() {
                    break;
                }
            }
            c
        });
        while !started.load(Ordering::Acquire) {
            std::hint::spin_loop();
        }
        target.set_valid(false);
        let snapshot = target.to_vec();
        let c = writer.join().unwrap();
        assert!(s.qp.wait_state(QpState::Error, T), "round {round}");
        assert!(
            target.to_vec() == snapshot,
            "round {round}: bytes landed after invalidation"
        );
        assert!(
            c.qp.same_host_stats().unwrap().direct_ops > 0,
            "round {round}"
        );
    }
}

// ------------------------------------------------------------ rings

/// Sends of every size, in both directions, CRC off and on, travel in the
/// peers' rings (1 MiB: the larger ones wrap it several times while the
/// receiver drains it), byte for byte.
#[test]
fn sends_travel_in_the_rings() {
    for crc in [false, true] {
        let p = ConnParams { crc, ..ext() };
        let (c, s) = pair_with(p, ConnParams::default(), |_| {});
        let sizes = [0usize, 1, 63, 4096, 65_536, 300_000, 4 << 20];
        let max = *sizes.iter().max().unwrap();
        for (from, to) in [(&c, &s), (&s, &c)] {
            let src = from.pd.alloc_mr(max, Access::LOCAL_WRITE).unwrap();
            let dst = to.pd.alloc_mr(max, Access::LOCAL_WRITE).unwrap();
            let before = from.qp.same_host_stats().unwrap().ring_bytes;
            let mut total = 0;
            for (i, &n) in sizes.iter().enumerate() {
                let data = pattern(n, i as u8 + crc as u8);
                src.write_at(0, &data);
                to.qp
                    .post_recv(&RecvWr::new(i as u64, &[dst.sge_all()]))
                    .unwrap();
                from.qp
                    .post_send(&SendWr::send(i as u64, &[src.sge(0, n)]))
                    .unwrap();
                assert!(wait(&from.cq).is_ok());
                let wc = wait(&to.cq);
                assert_eq!(
                    (wc.wr_id, wc.status, wc.byte_len as usize),
                    (i as u64, WcStatus::Success, n)
                );
                let mut got = vec![0; n];
                dst.read_at(0, &mut got);
                assert!(got == data, "size {n} crc {crc}");
                total += n as u64;
            }
            let sent = from.qp.same_host_stats().unwrap().ring_bytes - before;
            assert!(
                sent > total,
                "{sent} ring bytes for {total} payload bytes (headers on top)"
            );
        }
    }
}

/// A consumer far slower than its producer: the producer fills the ring,
/// waits, and is woken by the consumer's doorbell each time it made room.
/// (Receiver in busy-poll mode, so only its slow thread drains the ring.)
#[test]
fn a_full_ring_waits_for_room() {
    let (c, s) = pair_with(ext(), ConnParams::default(), |_| {});
    const N: usize = 64;
    const LEN: usize = 64 << 10;
    let dst = s.pd.alloc_mr(N * LEN, Access::LOCAL_WRITE).unwrap();
    for i in 0..N {
        s.qp.post_recv(&RecvWr::new(i as u64, &[dst.sge(i * LEN, LEN)]))
            .unwrap();
    }
    s.qp.set_busy_poll(true).unwrap();
    let src = c.pd.alloc_mr(N * LEN, Access::LOCAL_WRITE).unwrap();
    let data = pattern(N * LEN, 3);
    src.write_at(0, &data);
    let wrs: Vec<SendWr> = (0..N)
        .map(|i| SendWr::send(i as u64, &[src.sge(i * LEN, LEN)]))
        .collect();
    c.qp.post_send_batch(&wrs).unwrap();
    // 4 MiB through a 1 MiB ring, drained one slow step at a time.
    let mut got = 0;
    let deadline = std::time::Instant::now() + T;
    while got < N {
        assert!(
            std::time::Instant::now() < deadline,
            "stuck after {got} messages"
        );
        std::thread::sleep(std::time::Duration::from_micros(300));
        s.qp.progress();
        while let Some(wc) = s.cq.poll_one() {
            assert!(wc.is_ok(), "{wc:?}");
            assert_eq!(wc.wr_id, got as u64);
            got += 1;
        }
    }
    for i in 0..N {
        assert!(wait(&c.cq).is_ok(), "send {i}");
    }
    assert!(dst.to_vec() == data);
    let st = c.qp.same_host_stats().unwrap();
    assert!(st.ring_waits > 0, "the producer waited for room: {st:?}");
}

/// Messages in the ring when the sender disconnects are all delivered
/// before the disconnect is.
#[test]
fn disconnect_after_sending_delivers_everything() {
    let (c, s) = pair_with(ext(), ConnParams::default(), |_| {});
    const N: usize = 200;
    let dst = s.pd.alloc_mr(N * 1024, Access::LOCAL_WRITE).unwrap();
    for i in 0..N {
        s.qp.post_recv(&RecvWr::new(i as u64, &[dst.sge(i * 1024, 1024)]))
            .unwrap();
    }
    let src = c.pd.alloc_mr(N * 1024, Access::LOCAL_WRITE).unwrap();
    src.write_at(0, &pattern(N * 1024, 8));
    let wrs: Vec<SendWr> = (0..N)
        .map(|i| SendWr::send(i as u64, &[src.sge(i * 1024, 1024)]).unsignaled())
        .collect();
    c.qp.post_send_batch(&wrs).unwrap();
    c.qp.disconnect();
    for i in 0..N {
        let wc = wait(&s.cq);
        assert_eq!(
            (wc.wr_id, wc.status),
            (i as u64, WcStatus::Success),
            "message {i}"
        );
    }
    assert!(dst.to_vec() == pattern(N * 1024, 8));
    assert!(s.qp.wait_state(QpState::Error, T), "then the disconnect");
}

// ------------------------------------------------------------ two processes

const CHILD: &str = "SOFTRDMA_SAME_HOST_CHILD";

/// The server half of `across_processes`, run in a child process (this test
/// binary again, with `--ignored --exact`): registers a patterned region,
/// accepts one connection, prints its address and key, waits for a line
/// on stdin, checks what the parent wrote, and says so.
#[test]
#[ignore = "helper: run by across_processes in a child process"]
fn child_server() {
    let Ok(region_len) = std::env::var(CHILD) else {
        panic!("run by across_processes only");
    };
    let n: usize = region_len.parse().unwrap();
    let dev = Device::open_default().unwrap();
    let l = dev.listen("127.0.0.1:0").unwrap();
    let s = side(&dev, QpCaps::default());
    // One region in the device's shared chunks, one in a plain Vec.
    let mr = s.pd.alloc_mr(n, Access::ALL).unwrap();
    mr.write_at(0, &pattern(n, 5));
    let vec = s.pd.register(pattern(n, 6), Access::ALL).unwrap();
    // And a receive for the parent's Send (through this process's ring).
    let inbox = s.pd.alloc_mr(300_000, Access::LOCAL_WRITE).unwrap();
    s.qp.modify(QpState::Init).unwrap();
    s.qp.post_recv(&RecvWr::new(1, &[inbox.sge_all()])).unwrap();
    println!(
        "READY {} {} {} {} {}",
        l.local_addr().unwrap(),
        mr.addr(),
        mr.rkey().raw(),
        vec.addr(),
        vec.rkey().raw()
    );
    std::io::stdout().flush().unwrap();
    l.get_request()
        .unwrap()
        .accept(&s.qp, &ConnParams::default())
        .unwrap();
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    // The parent wrote pattern 9 over the second half.
    let mut want = pattern(n, 5);
    want[n / 2..].copy_from_slice(&pattern(n, 9)[n / 2..]);
    let mut want_vec = pattern(n, 6);
    want_vec[..n / 2].copy_from_slice(&pattern(n, 9)[..n / 2]);
    let wc = s.cq.wait_one(T).expect("the parent's Send");
    let got_send = wc.is_ok() && wc.byte_len == 300_000 && inbox.to_vec() == pattern(300_000, 4);
    let ok = mr.to_vec() == want && vec.to_vec() == want_vec && got_send;
    println!("CHECK {}", if ok { "ok" } else { "bad" });
    std::io::stdout().flush().unwrap();
    // Stay up until the parent has seen the answer.
    let _ = std::io::stdin().read_line(&mut line);
}

/// A real second process: Reads and Writes cross address spaces, through a
/// mapping of the child's shared chunk (its `alloc_mr` region) and with
/// process_vm_readv / process_vm_writev (its `register(Vec)` region),
/// checked byte for byte.
#[test]
fn across_processes() {
    let n = 1 << 20;
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--ignored",
            "--exact",
            "child_server",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, n.to_string())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // A failing check here must not leave the child waiting for a
    // connection forever (it would hold the test run's output open).
    struct KillOnPanic(u32);
    impl Drop for KillOnPanic {
        fn drop(&mut self) {
            if std::thread::panicking() {
                let _ = Command::new("kill").arg(self.0.to_string()).status();
            }
        }
    }
    let _guard = KillOnPanic(child.id());
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut stdin = child.stdin.take().unwrap();
    let mut line = String::new();
    let ready = loop {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "child ended early");
        // (libtest's "test child_server ... " may precede it on the line.)
        if let Some(at) = line.find("READY ") {
            break line[at + 6..].trim().to_string();
        }
    };
    let f: Vec<&str> = ready.split(' ').collect();
    let (addr, raddr, rkey): (&str, u64, u32) =
        (f[0], f[1].parse().unwrap(), f[2].parse().unwrap());
    let (vaddr, vkey): (u64, u32) = (f[3].parse().unwrap(), f[4].parse().unwrap());
    let dev = Device::open_default().unwrap();
    let c = side(&dev, QpCaps::default());
    c.qp.connect(addr, &ext()).unwrap();
    assert!(c.qp.conn_params().unwrap().same_host);
    let buf = c.pd.alloc_mr(n, Access::LOCAL_WRITE).unwrap();
    // Read the whole region, in pieces.
    for k in 0..4 {
        let q = n / 4;
        c.qp.post_send(&SendWr::read(
            k as u64,
            buf.sge(k * q, q),
            raddr + (k * q) as u64,
            Rkey::from_raw(rkey),
        ))
        .unwrap();
        assert!(wait(&c.cq).is_ok());
    }
    assert!(buf.to_vec() == pattern(n, 5), "read across processes");
    // Write the second half.
    buf.write_at(0, &pattern(n, 9));
    c.qp.post_send(&SendWr::write(
        9,
        &[buf.sge(n / 2, n / 2)],
        raddr + (n / 2) as u64,
        Rkey::from_raw(rkey),
    ))
    .unwrap();
    assert!(wait(&c.cq).is_ok());
    // The Vec region: read it, then write its first half.
    let buf2 = c.pd.alloc_mr(n, Access::LOCAL_WRITE).unwrap();
    c.qp.post_send(&SendWr::read(
        10,
        buf2.sge_all(),
        vaddr,
        Rkey::from_raw(vkey),
    ))
    .unwrap();
    assert!(wait(&c.cq).is_ok());
    assert!(buf2.to_vec() == pattern(n, 6), "read of the Vec region");
    c.qp.post_send(&SendWr::write(
        11,
        &[buf.sge(0, n / 2)],
        vaddr,
        Rkey::from_raw(vkey),
    ))
    .unwrap();
    assert!(wait(&c.cq).is_ok());
    // A Send larger than the child's ring.
    let msg = c.pd.alloc_mr(300_000, Access::LOCAL_WRITE).unwrap();
    msg.write_at(0, &pattern(300_000, 4));
    c.qp.post_send(&SendWr::send(12, &[msg.sge_all()])).unwrap();
    assert!(wait(&c.cq).is_ok());
    writeln!(stdin, "done").unwrap();
    line.clear();
    out.read_line(&mut line).unwrap();
    assert!(line.contains("CHECK ok"), "the child saw the write: {line}");
    let st = c.qp.same_host_stats().unwrap();
    assert_eq!(
        st,
        SameHostStats {
            direct_ops: 7,
            mapped_ops: 5,
            tcp_fallbacks: 0,
            ring_bytes: st.ring_bytes,
            ring_waits: st.ring_waits,
        }
    );
    assert!(
        st.ring_bytes > 300_000,
        "the Send went through the ring: {st:?}"
    );
    drop(stdin);
    assert!(child.wait().unwrap().success());
}

/// `MemoryRegion::set_valid_until`: a region readable until a deadline is
/// read directly by a same-host peer and over TCP before it, and refused
/// after it on both paths, although no thread of the owner does anything at
/// the deadline (a lease-holder that is stopped or busy cannot extend its
/// lease, and its memory must stop being served on time). A later deadline
/// makes it readable again; `None` removes the deadline.
#[test]
fn deadline_bounds_remote_reads_on_both_paths() {
    for same_host in [true, false] {
        let params = if same_host {
            ext()
        } else {
            ConnParams::default()
        };
        let lease = std::time::Duration::from_millis(300);
        let (c, s) = pair_with(params.clone(), params, |_| {});
        let n = 4096;
        let remote = s.pd.alloc_mr(n, Access::ALL).unwrap();
        let data = pattern(n, 5);
        remote.write_at(0, &data);
        let local = c.pd.alloc_mr(n, Access::LOCAL_WRITE).unwrap();
        let deadline = std::time::Instant::now() + lease;
        remote.set_valid_until(Some(deadline));
        let read = |id: u64| {
            local.write_at(0, &vec![0; n]);
            c.qp.post_send(&SendWr::read(
                id,
                local.sge_all(),
                remote.addr(),
                remote.rkey(),
            ))
            .unwrap();
            wait(&c.cq)
        };
        let wc = read(1);
        assert!(wc.is_ok(), "same_host {same_host}: {wc:?}");
        assert_eq!(local.to_vec(), data);
        let direct = c.qp.same_host_stats().map_or(0, |st| st.direct_ops);
        assert_eq!(direct, same_host as u64);
        // Past the deadline (the owner's threads idle): refused.
        while std::time::Instant::now() < deadline {
            std::thread::park_timeout(deadline - std::time::Instant::now());
        }
        let wc = read(2);
        assert!(
            !wc.is_ok(),
            "same_host {same_host}: read after the deadline: {wc:?}"
        );
        assert_eq!(local.to_vec(), vec![0; n], "no byte of the region copied");
        assert_eq!(
            c.qp.same_host_stats().map_or(0, |st| st.direct_ops),
            direct,
            "not read directly"
        );
        // The refusal ended that connection (Terminate); a new one reads
        // again once the deadline moves on, and with no deadline.
        for d in [Some(std::time::Instant::now() + lease), None] {
            remote.set_valid_until(d);
            // A new QP of the region's protection domain serves it.
            let l = s.dev.listen("127.0.0.1:0").unwrap();
            let addr = l.local_addr().unwrap();
            let sqp = s.pd.create_qp(QpInitAttr::new(&s.cq)).unwrap();
            let c2 = side(&c.dev, QpCaps::default());
            let params = if same_host {
                ext()
            } else {
                ConnParams::default()
            };
            std::thread::scope(|sc| {
                sc.spawn(|| l.get_request().unwrap().accept(&sqp, &params).unwrap());
                c2.qp.connect(addr, &params).unwrap();
            });
            let l2 = c2.pd.alloc_mr(n, Access::LOCAL_WRITE).unwrap();
            c2.qp
                .post_send(&SendWr::read(3, l2.sge_all(), remote.addr(), remote.rkey()))
                .unwrap();
            let wc = wait(&c2.cq);
            assert!(wc.is_ok(), "same_host {same_host}, deadline {d:?}: {wc:?}");
            assert_eq!(l2.to_vec(), data);
        }
    }
}

/// Busy-poll mode handed back with messages already in the ring: the
/// progress thread takes them (nobody calls `progress`). In busy-poll mode
/// the peer rings no doorbell, so without a look at the ring when the
/// mode ends they waited for the next doorbell, which might never come
/// (an application that stopped spinning and went to sleep on its CQ).
#[test]
fn ending_busy_poll_hands_queued_input_to_the_progress_thread() {
    for round in 0..20u8 {
        let (c, s) = pair_with(ext(), ConnParams::default(), |_| {});
        let dst = s.pd.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
        for i in 0..2 {
            s.qp.post_recv(&RecvWr::new(i, &[dst.sge(i as usize * 4096, 4096)]))
                .unwrap();
        }
        s.qp.set_busy_poll(true).unwrap();
        let src = c.pd.alloc_mr(8192, Access::LOCAL_WRITE).unwrap();
        let data = pattern(8192, round);
        src.write_at(0, &data);
        let deadline = std::time::Instant::now() + T;
        // The first message is taken by the application's own `progress`,
        // which leaves the ring without asking for a doorbell.
        c.qp.post_send(&SendWr::send(0, &[src.sge(0, 4096)]))
            .unwrap();
        assert!(wait(&c.cq).is_ok(), "round {round}: send 0");
        let first = loop {
            s.qp.progress();
            if let Some(wc) = s.cq.poll_one() {
                break wc;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: no first message"
            );
        };
        assert!(first.is_ok(), "{first:?}");
        // Until the ring and the socket are empty (the doorbell the first
        // message rang read too).
        while s.qp.progress() {}
        s.qp.progress();
        // The second lands in the ring with no doorbell.
        c.qp.post_send(&SendWr::send(1, &[src.sge(4096, 4096)]))
            .unwrap();
        assert!(wait(&c.cq).is_ok(), "round {round}: send 1");
        while !s.qp.input_waiting() {
            assert!(
                std::time::Instant::now() < deadline,
                "round {round}: never in the ring"
            );
            std::thread::yield_now();
        }
        s.qp.set_busy_poll(false).unwrap();
        let wc =
            s.cq.wait_one(std::time::Duration::from_secs(5))
                .unwrap_or_else(|| panic!("round {round}: the queued message stayed in the ring"));
        assert!(wc.is_ok(), "{wc:?}");
        assert!(dst.to_vec() == data, "round {round}");
    }
}
