//! Scale: 1,000 connected RC QP pairs between one server device and one
//! client device, each with the default (small, fixed) set of progress
//! threads, over loopback TCP.
//!
//! Every pair moves an RDMA Write followed by a Send; the data is checked
//! on the server. The process's thread count must stay bounded (no thread
//! per QP). Then every client QP disconnects: all QPs on both sides must
//! reach ERROR and flush their outstanding receives, and once everything
//! is dropped the sockets must be gone (no descriptor leak).
//!
//! Resident memory, thread counts and timings are printed (run with
//! `--nocapture` to see them). Only one test lives in this file so that the
//! process-wide figures are not disturbed by other tests running alongside.

mod common;
use common::*;
use softrdma_verbs::*;
use std::collections::HashMap;
use std::time::{Duration, Instant};

const PAIRS: usize = 1000;
/// Bytes per pair in the shared regions.
const SLOT: usize = 256;
/// Bytes each pair writes with its RDMA Write.
const WRITE_LEN: usize = 192;
/// Bytes each pair sends.
const SEND_LEN: usize = 64;
/// Threads connecting client QPs at the same time.
const CONNECTORS: usize = 4;

/// A numeric field of /proc/self/status ("Threads", "VmRSS" in kB).
fn proc_status(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(field)?.strip_prefix(':')?;
            rest.split_whitespace().next()?.parse().ok()
        })
        .unwrap_or_else(|| panic!("no {field} in /proc/self/status"))
}

fn threads() -> u64 {
    proc_status("Threads")
}

fn rss_kib() -> u64 {
    proc_status("VmRSS")
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").unwrap().count()
}

/// Makes sure the process may hold `want` descriptors (two sockets per
/// pair in this process, plus the listener, epoll and event fds).
fn raise_nofile(want: u64) {
    let mut r = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: r is a valid rlimit for the call to fill in.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut r) }, 0);
    if r.rlim_cur >= want {
        return;
    }
    r.rlim_cur = want.min(r.rlim_max);
    // SAFETY: r is a valid rlimit.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &r) }, 0);
    assert!(
        r.rlim_cur >= want,
        "RLIMIT_NOFILE hard limit {} is below the {want} this test needs",
        r.rlim_max
    );
}

/// The data pair `i` writes (`seed` 0) and sends (`seed` 1).
fn data_for(i: usize, seed: u8, len: usize) -> Vec<u8> {
    let mut d = pattern(len, (i as u8).wrapping_mul(7).wrapping_add(seed));
    d[..4].copy_from_slice(&(i as u32).to_be_bytes());
    d
}

/// Takes `n` completions from `cq`, failing after `deadline`.
fn take(cq: &CompletionQueue, n: usize, deadline: Instant) -> Vec<WorkCompletion> {
    let mut out = Vec::with_capacity(n);
    let mut buf = [WorkCompletion::default(); 64];
    while out.len() < n {
        let left = deadline.saturating_duration_since(Instant::now());
        assert!(
            !left.is_zero(),
            "only {} of {n} completions before the deadline",
            out.len()
        );
        let want = (n - out.len()).min(buf.len());
        let k = cq.poll_wait(&mut buf[..want], left);
        out.extend_from_slice(&buf[..k]);
    }
    out
}

#[test]
fn thousand_qp_pairs_on_one_device() {
    raise_nofile(4 * PAIRS as u64 + 256);
    let fds0 = open_fds();
    let threads0 = threads();
    let rss0 = rss_kib();
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(50);

    let server_dev = Device::open(DeviceConfig {
        name: "scale-server".into(),
        ..Default::default()
    })
    .unwrap();
    let client_dev = Device::open(DeviceConfig {
        name: "scale-client".into(),
        ..Default::default()
    })
    .unwrap();
    let progress = server_dev.info().progress_threads;

    // Small queues: one outstanding Write + Send, two receives.
    let caps = QpCaps {
        max_send_wr: 4,
        max_recv_wr: 4,
        max_send_sge: 1,
        max_recv_sge: 1,
    };
    let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE;

    // Server: one PD, one CQ for all QPs (each CQ has an event fd), one
    // region receiving the Sends and one the Writes, a slot per pair.
    let spd = server_dev.alloc_pd().unwrap();
    let scq = server_dev.create_cq(4 * PAIRS).unwrap();
    let recv_mr = spd.alloc_mr(PAIRS * SLOT, Access::LOCAL_WRITE).unwrap();
    let write_mr = spd.alloc_mr(PAIRS * SLOT, access).unwrap();
    let (write_addr, write_rkey) = (write_mr.addr(), write_mr.rkey());

    let listener = server_dev.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let server = {
        let (spd, scq) = (spd.clone(), scq.clone());
        let recv = recv_mr.sge_all();
        std::thread::Builder::new()
            .name("scale-accept".into())
            .spawn(move || {
                let mut qps: Vec<Option<QueuePair>> = (0..PAIRS).map(|_| None).collect();
                for _ in 0..PAIRS {
                    let req = listener.get_request().unwrap();
                    let i = u32::from_be_bytes(req.private_data().try_into().unwrap()) as usize;
                    let mut attr = QpInitAttr::new(&scq);
                    attr.caps = caps;
                    let qp = spd.create_qp(attr).unwrap();
                    qp.modify(QpState::Init).unwrap();
                    // Slot i receives the Send; the second receive is
                    // flushed at disconnect.
                    for k in 0..2 {
                        let sge = Sge {
                            addr: recv.addr + (i * SLOT) as u64,
                            length: SLOT as u32,
                            lkey: recv.lkey,
                        };
                        qp.post_recv(&RecvWr::new((k * PAIRS + i) as u64, &[sge]))
                            .unwrap();
                    }
                    req.accept(&qp, &ConnParams::default()).unwrap();
                    assert!(qps[i].replace(qp).is_none(), "pair {i} twice");
                }
                qps.into_iter().map(Option::unwrap).collect::<Vec<_>>()
            })
            .unwrap()
    };

    // Client: one PD, one CQ, one source region.
    let cpd = client_dev.alloc_pd().unwrap();
    let ccq = client_dev.create_cq(4 * PAIRS).unwrap();
    let src = cpd.alloc_mr(PAIRS * SLOT, Access::LOCAL_WRITE).unwrap();
    let sink = cpd.alloc_mr(PAIRS * 8, Access::LOCAL_WRITE).unwrap();
    // Connect from a few threads at once (concurrent connects on one
    // device, several requests queued on the listener).
    let cqps: Vec<QueuePair> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..CONNECTORS)
            .map(|w| {
                let (cpd, ccq, sink) = (&cpd, &ccq, &sink);
                s.spawn(move || {
                    let mut mine = Vec::new();
                    for i in (w..PAIRS).step_by(CONNECTORS) {
                        let mut attr = QpInitAttr::new(ccq);
                        attr.caps = caps;
                        let qp = cpd.create_qp(attr).unwrap();
                        qp.modify(QpState::Init).unwrap();
                        // Never matched: flushed at disconnect.
                        qp.post_recv(&RecvWr::new(i as u64, &[sink.sge(i * 8, 8)]))
                            .unwrap();
                        let p = ConnParams {
                            private_data: (i as u32).to_be_bytes().to_vec(),
                            ..Default::default()
                        };
                        qp.connect(addr, &p)
                            .unwrap_or_else(|e| panic!("connect {i}: {e}"));
                        mine.push((i, qp));
                    }
                    mine
                })
            })
            .collect();
        let mut all: Vec<(usize, QueuePair)> = workers
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect();
        all.sort_by_key(|(i, _)| *i);
        all.into_iter().map(|(_, q)| q).collect()
    });
    let sqps = server.join().unwrap();
    let t_connect = t0.elapsed();
    let threads_connected = threads();
    let rss_connected = rss_kib();
    let fds_connected = open_fds();
    assert!(cqps.iter().all(|q| q.state() == QpState::Rts));
    assert!(sqps.iter().all(|q| q.state() == QpState::Rts));
    // Two sockets per pair (both ends are in this process), at most a
    // handful of others.
    assert!(
        fds_connected >= fds0 + 2 * PAIRS && fds_connected <= fds0 + 2 * PAIRS + 32,
        "{fds_connected} descriptors open with {PAIRS} pairs (started with {fds0})"
    );

    // Traffic: on every pair an RDMA Write into the pair's slot, then a
    // Send; posted all at once, then reaped.
    let t1 = Instant::now();
    for (i, qp) in cqps.iter().enumerate() {
        src.write_at(i * SLOT, &data_for(i, 0, WRITE_LEN));
        src.write_at(i * SLOT + WRITE_LEN, &data_for(i, 1, SEND_LEN));
        let off = (i * SLOT) as u64;
        qp.post_send_batch(&[
            SendWr::write(
                u64::MAX,
                &[src.sge(i * SLOT, WRITE_LEN)],
                write_addr + off,
                write_rkey,
            )
            .unsignaled(),
            SendWr::send(i as u64, &[src.sge(i * SLOT + WRITE_LEN, SEND_LEN)]),
        ])
        .unwrap();
    }
    let mut sent = vec![false; PAIRS];
    for wc in take(&ccq, PAIRS, deadline) {
        assert_eq!((wc.status, wc.opcode), (WcStatus::Success, WcOpcode::Send));
        let i = wc.wr_id as usize;
        assert_eq!(wc.qp_num, cqps[i].qp_num());
        assert!(!std::mem::replace(&mut sent[i], true));
    }
    let mut got = vec![false; PAIRS];
    for wc in take(&scq, PAIRS, deadline) {
        assert_eq!(
            (wc.status, wc.opcode, wc.byte_len as usize),
            (WcStatus::Success, WcOpcode::Recv, SEND_LEN),
            "{wc:?}"
        );
        let i = wc.wr_id as usize;
        assert!(i < PAIRS, "the first receive of a pair completes first");
        assert_eq!(wc.qp_num, sqps[i].qp_num());
        assert!(!std::mem::replace(&mut got[i], true));
        // The Send arrived, so the Write before it is placed.
        let mut b = vec![0; WRITE_LEN];
        write_mr.read_at(i * SLOT, &mut b);
        assert!(b == data_for(i, 0, WRITE_LEN), "Write data of pair {i}");
        let mut b = vec![0; SEND_LEN];
        recv_mr.read_at(i * SLOT, &mut b);
        assert!(b == data_for(i, 1, SEND_LEN), "Send data of pair {i}");
    }
    let t_traffic = t1.elapsed();
    let threads_traffic = threads();
    let rss_traffic = rss_kib();
    assert!(ccq.is_empty() && scq.is_empty());
    assert!(!ccq.overflowed() && !scq.overflowed());

    // Every pair's traffic went over its own connection, and the server's
    // info knows all of them.
    let info = server_dev.info();
    assert_eq!(info.qps.len(), PAIRS);
    assert!(info.qps.iter().all(|q| q.state == QpState::Rts));

    // Disconnect from the client side: both ends go to ERROR and flush.
    let t2 = Instant::now();
    for qp in &cqps {
        qp.disconnect();
        assert_eq!(qp.state(), QpState::Error);
    }
    let flushed = take(&ccq, PAIRS, deadline);
    let mut seen = vec![false; PAIRS];
    for wc in flushed {
        assert_eq!(
            (wc.status, wc.opcode),
            (WcStatus::WrFlushErr, WcOpcode::Recv)
        );
        let i = wc.wr_id as usize;
        assert_eq!(wc.qp_num, cqps[i].qp_num());
        assert!(!std::mem::replace(&mut seen[i], true));
    }
    let by_qpn: HashMap<Qpn, usize> = sqps
        .iter()
        .enumerate()
        .map(|(i, q)| (q.qp_num(), i))
        .collect();
    let mut seen = vec![false; PAIRS];
    for wc in take(&scq, PAIRS, deadline) {
        assert_eq!(
            (wc.status, wc.opcode),
            (WcStatus::WrFlushErr, WcOpcode::Recv),
            "{wc:?}"
        );
        let i = by_qpn[&wc.qp_num];
        assert_eq!(wc.wr_id as usize, PAIRS + i, "the second receive flushes");
        assert!(!std::mem::replace(&mut seen[i], true));
    }
    for (i, qp) in sqps.iter().enumerate() {
        assert!(
            qp.wait_state(
                QpState::Error,
                deadline.saturating_duration_since(Instant::now())
            ),
            "server QP {i} still {:?}",
            qp.state()
        );
    }
    // One Disconnected event per server QP.
    let mut disc = vec![false; PAIRS];
    let mut n = 0;
    while n < PAIRS {
        let left = deadline.saturating_duration_since(Instant::now());
        let ev = server_dev
            .next_event(left)
            .unwrap_or_else(|| panic!("only {n} of {PAIRS} disconnect events"));
        match ev {
            AsyncEvent::Disconnected { qpn } => {
                assert!(!std::mem::replace(&mut disc[by_qpn[&qpn]], true));
                n += 1;
            }
            e => panic!("unexpected event {e:?}"),
        }
    }
    let t_disconnect = t2.elapsed();
    assert!(ccq.is_empty() && scq.is_empty());

    // Dropping everything closes every socket and stops the threads.
    drop((cqps, sqps, src, sink, recv_mr, write_mr));
    drop((ccq, scq, cpd, spd, client_dev, server_dev));
    let fds_end = open_fds();
    // A joined thread may still be counted for a moment while the kernel
    // reaps it.
    let mut threads_end = threads();
    let settle = Instant::now() + Duration::from_secs(5);
    while threads_end > threads0 && Instant::now() < settle {
        std::thread::yield_now();
        threads_end = threads();
    }
    let total = t0.elapsed();

    println!("scale: {PAIRS} RC QP pairs, {progress} progress threads per device");
    println!(
        "scale: threads {threads0} at start, {threads_connected} connected, \
         {threads_traffic} after traffic, {threads_end} at the end"
    );
    println!(
        "scale: VmRSS {rss0} KiB at start, {rss_connected} KiB connected \
         ({:+} KiB), {rss_traffic} KiB after traffic ({:+} KiB); \
         ~{} bytes per pair",
        rss_connected as i64 - rss0 as i64,
        rss_traffic as i64 - rss0 as i64,
        (rss_traffic.saturating_sub(rss0)) * 1024 / PAIRS as u64
    );
    println!("scale: descriptors {fds0} at start, {fds_connected} connected, {fds_end} at the end");
    println!(
        "scale: connect {:.3} s, traffic {:.3} s, disconnect {:.3} s, total {:.3} s",
        t_connect.as_secs_f64(),
        t_traffic.as_secs_f64(),
        t_disconnect.as_secs_f64(),
        total.as_secs_f64()
    );

    // No thread per QP: a fixed set per device (progress threads and the
    // info publisher), the accept thread of this test, the test harness.
    assert!(
        threads_connected < 64 && threads_traffic < 64,
        "{threads_traffic} threads with {PAIRS} QP pairs"
    );
    assert!(
        threads_traffic <= threads0 + 2 * (progress as u64 + 1) + 1,
        "threads grew from {threads0} to {threads_traffic}"
    );
    assert!(
        fds_end <= fds0,
        "descriptor leak: {fds_end} open at the end, {fds0} at the start"
    );
    assert!(
        threads_end <= threads0,
        "threads left behind: {threads_end} at the end, {threads0} at the start"
    );
}
