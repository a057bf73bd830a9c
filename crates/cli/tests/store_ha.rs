//! The HA store end to end: real processes (`softrdma store serve`), real
//! RDMA links over loopback TCP, the embedded coordinator, SIGKILL.
//!
//! * `crash_primary_20_times`: 20 rounds, each a verifying mixed keyed
//!   put/get/remove load with delete-and-reuse of cached pointers
//!   (`softrdma store load`, its own seed) during which the primary is
//!   killed with SIGKILL and restarted to rejoin; every round's load must
//!   end with no acknowledged key lost or altered, no removed key back, no
//!   value returned for another key, and its verification read one-sided
//!   from the new primary; over the rounds both nodes served one-sided
//!   look-ups and stale cached pointers were forced.
//! * `secondary_loss_and_resync`: the secondary dies, the primary keeps
//!   serving (degraded, reported by status), a replacement re-syncs and the
//!   group is redundant again with every object intact.
//! * `bad_pointers_and_limits`: wrong STag, pointer outside the arena or to
//!   freed space, double delete, value too large, arena full: each a clear
//!   error and the store's state unchanged.
//! * `read_many_answers_each_pointer_as_read_does`: batched one-sided reads,
//!   good and bad pointers mixed, before and after a failover.

use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

mod common;
use common::free_ports;
use common::history::{self, assert_linearizable, Workload};
use common::store::{client_config, start_etcd, Group, StoreNode as Node, PRIMARY, SOFTRDMA};

use softrdma_store::auth::Secret;
use softrdma_store::net::client::{ClientConfig, ClientError, StoreClient};
use softrdma_store::net::handshake::{self, ClientAuth, HandshakeError, Hello, NodeHello};
use softrdma_store::net::link::Endpoint;
use softrdma_store::net::link::READ_BATCH;
use softrdma_store::net::CONNECT_TIMEOUT;
use softrdma_store::proto::{StatusInfo, StoreError};
use softrdma_store::ptr::RemotePtr;
use softrdma_verbs::Access;

/// Starts `softrdma store load`; returns the child and its stdout lines.
fn start_load(g: &Group, seed: u64, secs: f64) -> (Child, mpsc::Receiver<String>) {
    let mut child = Command::new(SOFTRDMA)
        .args(["store", "load", "--progress", "--clients", "2", "--nodes"])
        .arg(g.nodes_arg())
        .env("SOFTRDMA_STORE_PASSWORD", common::STORE_SECRET)
        .args(["--duration", &secs.to_string(), "--seed", &seed.to_string()])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(|l| l.ok()) {
            let _ = tx.send(l);
        }
    });
    (child, rx)
}

/// Waits for a progress line at or after `t` seconds of load.
fn wait_progress(rx: &mpsc::Receiver<String>, t: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Instant::now() < deadline {
        if let Ok(l) = rx.recv_timeout(Duration::from_secs(1)) {
            let v: serde_json::Value = serde_json::from_str(&l).unwrap_or_default();
            if v["type"] == "progress" && v["t"].as_f64().unwrap_or(0.0) >= t {
                return;
            }
        }
    }
    panic!("the load made no progress");
}

/// Waits for the load's end; returns its summary.
fn finish_load(mut child: Child, rx: mpsc::Receiver<String>) -> serde_json::Value {
    let st = child.wait().unwrap();
    let mut summary = None;
    for l in rx.iter() {
        let v: serde_json::Value = serde_json::from_str(&l).unwrap_or_default();
        if v["type"] == "summary" {
            summary = Some(v);
        }
    }
    let s = summary.unwrap_or_else(|| panic!("load printed no summary ({st})"));
    assert!(st.success(), "load failed ({st}): {s}");
    s
}

#[test]
fn crash_primary_20_times() {
    // Each round's load keeps up to 2 x 2000 objects alive and leaves them
    // behind (about 1.3 MB a round, 20 rounds): room for all of them.
    let mut g = Group::new("crash", "128MiB");
    let rounds: u64 = std::env::var("SOFTRDMA_CRASH_ROUNDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let mut total_ops = 0;
    let mut worst_gap: f64 = 0.0;
    let mut one_sided_at = std::collections::BTreeMap::new();
    let mut reuse_forced = 0;
    let mut ptr_reuse_forced = 0;
    for seed in 1..=rounds {
        let (child, rx) = start_load(&g, seed, 2.0);
        wait_progress(&rx, 0.5 + (seed % 5) as f64 * 0.2);
        // Kill a redundant primary. A primary that dropped its secondary
        // (a heartbeat missed on a loaded machine) acknowledges alone, and
        // killing it then loses those writes by design (docs/store.md,
        // "Durability, by policy"): a double fault, not this test's case.
        // Checked right before the kill; a drop in the few milliseconds
        // left shows up as lost writes below, not as a hang.
        let now = g.epoch();
        let p = g.wait_redundant(Duration::from_secs(30), now.saturating_sub(1));
        let e = g.epoch();
        let fenced0 = log_count(&g, 3 - p, "role=Fenced");
        g.nodes[(p - 1) as usize].kill();
        // Restart the killed node at once: it must rejoin as secondary.
        g.nodes[(p - 1) as usize].start("secondary");
        let s = finish_load(child, rx);
        assert_eq!(s["lost_writes"], 0, "round {seed}: {s}");
        assert_eq!(s["resurrected"], 0, "round {seed}: {s}");
        assert_eq!(s["wrong_key"], 0, "round {seed}: {s}");
        assert_eq!(s["stale_reached"], 0, "round {seed}: {s}");
        assert_eq!(s["errors"], 0, "round {seed}: {s}");
        assert!(s["verified"].as_u64().unwrap() > 0, "round {seed}: {s}");
        // The verification read the keys one-sided from the new primary
        // (the killed node's former secondary), under the same STag.
        let np_addr = g.addrs[(2 - p) as usize].to_string();
        let on_new = s["verify_one_sided_by_node"][&np_addr]
            .as_u64()
            .unwrap_or(0);
        assert!(
            on_new > 0,
            "round {seed}: no one-sided read on the new primary: {s}"
        );
        assert_eq!(s["verify_fallback_raced"], 0, "round {seed}: {s}");
        for (a, n) in s["keyed_one_sided_by_node"].as_object().unwrap() {
            *one_sided_at.entry(a.clone()).or_insert(0) += n.as_u64().unwrap();
        }
        reuse_forced += s["reuse_forced"].as_u64().unwrap();
        ptr_reuse_forced += s["ptr_reuse_forced"].as_u64().unwrap();
        total_ops += s["ops"].as_u64().unwrap();
        worst_gap = worst_gap.max(s["max_gap_ms"].as_f64().unwrap());
        // The killed node rejoins as secondary; it may be primary again
        // only through a second failover: its successor fenced itself
        // (a lease renewal starved on a loaded machine, seen in CI with a
        // CPU hog and a guest beside the suite), and the rejoined, in-sync
        // node took over, as it should.
        let np = g.wait_redundant(Duration::from_secs(30), e);
        if np == p {
            assert!(
                log_count(&g, 3 - p, "role=Fenced") > fenced0,
                "round {seed}: the killed node is primary again, but its successor never stepped down"
            );
        }
    }
    println!(
        "{rounds} primary crashes: {total_ops} acknowledged ops verified, worst gap \
         {worst_gap:.0} ms; keyed one-sided look-ups by node {one_sided_at:?}; \
         {reuse_forced} stale cached pointers forced, {ptr_reuse_forced} pointer-API spaces \
         reused under stale pointers"
    );
    // Both nodes served one-sided look-ups (a broken STag on either would
    // show here, not hide behind the server-side fallback), and the
    // delete-and-reuse case happened.
    for a in &g.addrs {
        assert!(
            one_sided_at.get(&a.to_string()).copied().unwrap_or(0) > 0,
            "no one-sided look-up served by {a}: {one_sided_at:?}"
        );
    }
    assert!(reuse_forced > 0, "no stale cached pointer was forced");
    // And stale pointers of the pointer API (issue 29, finding 3).
    assert!(ptr_reuse_forced > 0, "no pointer-API space was reused");
    let _ = std::fs::remove_dir_all(&g.dir);
}

/// A joiner copying a large arena (768 MiB, over a second of RDMA Reads)
/// keeps its heartbeats going: with the default 250 ms timeout the group
/// still becomes redundant, at start and after the secondary restarts.
#[test]
fn large_arena_rejoins_with_default_timings() {
    let mut g = Group::new("bigarena", "768MiB");
    let p = g.primary();
    let s = 3 - p;
    let mut c = StoreClient::new(client_config(&g.addrs)).unwrap();
    let objs: Vec<(RemotePtr, Vec<u8>)> = (0..20u32)
        .map(|i| {
            let v = vec![i as u8; 1000 + i as usize];
            (c.alloc(&v).unwrap(), v)
        })
        .collect();
    let e = g.epoch();
    g.nodes[(s - 1) as usize].kill();
    g.nodes[(s - 1) as usize].start("secondary");
    assert_eq!(g.wait_redundant(Duration::from_secs(60), e), p);
    g.nodes[(p - 1) as usize].kill();
    for (ptr, v) in &objs {
        assert_eq!(&c.read_ptr(*ptr).unwrap(), v, "{ptr}");
    }
    let _ = std::fs::remove_dir_all(&g.dir);
}

#[test]
fn secondary_loss_and_resync() {
    // The degraded mode this test is about is the opt-in policy since
    // issue 29 (the default refuses writes held by one node).
    let mut g = Group::with_config("secloss", "16MiB", None, "min_in_sync_replicas = 0");
    let p = g.primary();
    let s = 3 - p;
    let mut c = StoreClient::new(client_config(&g.addrs)).unwrap();
    let mut objs: Vec<(RemotePtr, Vec<u8>)> = (0..50u32)
        .map(|i| {
            let v = format!("before-{i}").into_bytes();
            (c.alloc(&v).unwrap(), v)
        })
        .collect();
    let e = g.epoch();
    g.nodes[(s - 1) as usize].kill();
    // The primary goes on alone once the coordinator records it degraded.
    for i in 0..50u32 {
        let v = format!("degraded-{i}").into_bytes();
        objs.push((c.alloc(&v).unwrap(), v));
    }
    let st = g.status();
    assert_eq!(st.len(), 1, "only the primary answers: {st:?}");
    assert_eq!(st[0].node, p);
    assert_eq!(st[0].role, PRIMARY);
    assert!(!st[0].redundant, "status must report the group degraded");
    // A replacement joins, copies the arena and the group is redundant.
    g.nodes[(s - 1) as usize].start("secondary");
    assert_eq!(g.wait_redundant(Duration::from_secs(30), e), p);
    let st = g.status();
    let (a, b) = (&st[0], &st[1]);
    assert_eq!((a.allocated, a.objects), (b.allocated, b.objects), "{st:?}");
    // Now lose the primary: the re-synced node must hold everything.
    g.nodes[(p - 1) as usize].kill();
    for (ptr, v) in &objs {
        assert_eq!(&c.read_ptr(*ptr).unwrap(), v, "{ptr}");
    }
    assert_eq!(g.primary(), s);
    let _ = std::fs::remove_dir_all(&g.dir);
}

#[test]
fn bad_pointers_and_limits() {
    let mut g = Group::new("badptr", "1MiB");
    let mut c = StoreClient::new(client_config(&g.addrs)).unwrap();
    let p = c.alloc(b"hello").unwrap();
    let arena = c.arena().expect("arena known");
    let before = g.status();
    let check_unchanged = |g: &mut Group| {
        let now = g.status();
        let f = |s: &[StatusInfo]| {
            let mut v: Vec<_> = s.iter().map(|x| (x.node, x.allocated, x.objects)).collect();
            v.sort();
            v
        };
        assert_eq!(f(&now), f(&before), "state changed by a refused request");
    };
    let store_err = |r: Result<Vec<u8>, ClientError>| match r {
        Err(ClientError::Store(e)) => e,
        other => panic!("expected a store error, got {other:?}"),
    };
    // Wrong STag.
    let bad = RemotePtr {
        stag: p.stag ^ 0x100,
        ..p
    };
    assert!(matches!(
        store_err(c.read_ptr(bad)),
        StoreError::WrongStag { .. }
    ));
    assert!(matches!(
        c.update_ptr(bad, b"x"),
        Err(ClientError::Store(StoreError::WrongStag { .. }))
    ));
    assert!(matches!(
        c.free(bad),
        Err(ClientError::Store(StoreError::WrongStag { .. }))
    ));
    // Outside the arena.
    let out = RemotePtr {
        addr: arena.base + arena.len,
        ..p
    };
    assert!(matches!(store_err(c.read_ptr(out)), StoreError::OutOfArena));
    assert!(matches!(
        c.free(out),
        Err(ClientError::Store(StoreError::OutOfArena))
    ));
    // Not the start of an allocation.
    let mid = RemotePtr {
        addr: p.addr + 64,
        ..p
    };
    assert!(c.read_ptr(mid).is_err());
    // A pointer whose length is not the allocation's (issue 16, finding 5:
    // a get with a longer one returned the object while update and delete
    // refused it): refused the same way by get, update and delete.
    for len in [p.len + 64, p.len + 128] {
        let wrong = RemotePtr { len, ..p };
        assert!(
            matches!(store_err(c.read_ptr(wrong)), StoreError::NotAllocated),
            "get with length {len} of an allocation of {}",
            p.len
        );
        assert!(matches!(
            c.update_ptr(wrong, b"x"),
            Err(ClientError::Store(StoreError::NotAllocated))
        ));
        assert!(matches!(
            c.free(wrong),
            Err(ClientError::Store(StoreError::NotAllocated))
        ));
    }
    assert_eq!(c.read_ptr(p).unwrap(), b"hello");
    check_unchanged(&mut g);
    // Freed space and double delete.
    let q = c.alloc(b"short-lived").unwrap();
    c.free(q).unwrap();
    assert!(matches!(
        store_err(c.read_ptr(q)),
        StoreError::Freed | StoreError::NotAllocated
    ));
    assert!(matches!(
        c.free(q),
        Err(ClientError::Store(
            StoreError::Freed | StoreError::NotAllocated
        ))
    ));
    assert!(matches!(
        c.update_ptr(q, b"zombie"),
        Err(ClientError::Store(
            StoreError::Freed | StoreError::NotAllocated
        ))
    ));
    check_unchanged(&mut g);
    // A value over the protocol's limit: refused before anything is sent.
    assert!(matches!(
        c.alloc(&vec![7u8; softrdma_store::proto::MAX_VALUE + 1]),
        Err(ClientError::ValueTooLarge { .. })
    ));
    // One within it but larger than this 1 MiB arena can hold: the node
    // says how large a value may be (it travelled by rendezvous).
    assert!(matches!(
        c.alloc(&vec![7u8; 1 << 20]),
        Err(ClientError::Store(StoreError::TooLarge {
            len: 1048576,
            ..
        }))
    ));
    // Arena full: fill 1 MiB with ~30 KiB values until refused.
    let big = vec![0xabu8; 30_000];
    let mut n = 0;
    let full = loop {
        match c.alloc(&big) {
            Ok(_) => n += 1,
            Err(e) => break e,
        }
        assert!(n < 100, "a 1 MiB arena took {n} x 30 KB");
    };
    assert!(
        matches!(full, ClientError::Store(StoreError::Full { .. })),
        "{full:?}"
    );
    assert!(n > 20, "only {n} values fit");
    // The first object is intact, on both nodes (read after failover).
    assert_eq!(c.read_ptr(p).unwrap(), b"hello");
    let pr = g.primary();
    g.nodes[(pr - 1) as usize].kill();
    assert_eq!(c.read_ptr(p).unwrap(), b"hello");
    let _ = std::fs::remove_dir_all(&g.dir);
}

/// `read_many` gives, pointer by pointer, what `read` gives: values from
/// one-sided Reads in batches (more pointers than one batch, sizes from a
/// few bytes to 30 KB), a clear error for each bad pointer among them, and
/// the same values from the new primary after the old one was killed.
#[test]
fn read_many_answers_each_pointer_as_read_does() {
    let mut g = Group::new("readmany", "16MiB");
    let mut c = StoreClient::new(client_config(&g.addrs)).unwrap();
    let objs: Vec<(RemotePtr, Vec<u8>)> = (0..40u32)
        .map(|i| {
            let len = [5usize, 100, 4096, 30_000][i as usize % 4] + i as usize;
            let v: Vec<u8> = (0..len).map(|k| (k as u32 ^ i) as u8).collect();
            (c.alloc(&v).unwrap(), v)
        })
        .collect();
    let arena = c.arena().expect("arena known");
    let p0 = objs[0].0;
    let freed = c.alloc(b"short-lived").unwrap();
    c.free(freed).unwrap();
    let bad = [
        RemotePtr {
            stag: p0.stag ^ 0x100,
            ..p0
        },
        RemotePtr {
            addr: arena.base + arena.len,
            ..p0
        },
        RemotePtr {
            addr: p0.addr + 64,
            ..p0
        },
        freed,
    ];
    // Bad pointers spread among the good ones, across batch boundaries.
    let mut ptrs: Vec<RemotePtr> = objs.iter().map(|(p, _)| *p).collect();
    for (k, b) in bad.iter().enumerate() {
        ptrs.insert(3 + k * 11, *b);
    }
    // `min_one_sided`: after a failover the batch that found the old
    // primary gone is read through the new one by `read`, which may go
    // through the node for the first pointer (while it learns the primary).
    let check = |c: &mut StoreClient, min_one_sided: u64| {
        let before = c.stats().one_sided_reads;
        let got = c.read_ptrs(&ptrs);
        assert_eq!(got.len(), ptrs.len());
        for (p, r) in ptrs.iter().zip(&got) {
            match (objs.iter().find(|(q, _)| q == p), r) {
                (Some((_, v)), Ok(d)) => assert_eq!(d, v, "{p}"),
                (Some(_), Err(e)) => panic!("{p}: {e}"),
                (None, Ok(d)) => panic!("bad pointer {p} read {} bytes", d.len()),
                (None, Err(e)) => {
                    // The same error `read` gives.
                    let single = c.read_ptr(*p).expect_err("bad pointer");
                    assert_eq!(e.to_string(), single.to_string(), "{p}");
                }
            }
        }
        let one_sided = c.stats().one_sided_reads - before;
        assert!(
            one_sided >= min_one_sided && one_sided <= objs.len() as u64,
            "{one_sided} one-sided reads for {} objects",
            objs.len()
        );
    };
    check(&mut c, objs.len() as u64);
    let pr = g.primary();
    g.nodes[(pr - 1) as usize].kill();
    check(&mut c, (objs.len() - READ_BATCH) as u64);
    let _ = std::fs::remove_dir_all(&g.dir);
}

#[test]
fn failover_with_etcd_coordinator() {
    let etcd = start_etcd();
    let mut g = Group::with_coordinator("etcdha", "16MiB", Some(&etcd.url));
    let (child, rx) = start_load(&g, 77, 4.0);
    wait_progress(&rx, 1.0);
    let p = g.primary();
    let e = g.epoch();
    g.nodes[(p - 1) as usize].kill();
    g.nodes[(p - 1) as usize].start("secondary");
    let s = finish_load(child, rx);
    assert_eq!(s["lost_writes"], 0, "{s}");
    assert_eq!(s["errors"], 0, "{s}");
    assert_eq!(s["resurrected"], 0, "{s}");
    let np = g.wait_redundant(Duration::from_secs(30), e);
    assert_ne!(np, p);
    println!(
        "etcd failover: {} ops, gap {:.0} ms",
        s["ops"],
        s["max_gap_ms"].as_f64().unwrap_or(0.0)
    );
    let _ = std::fs::remove_dir_all(&g.dir);
}

/// The first request on a freshly accepted connection is answered the first
/// time (issue 16, finding 7): the node loop used to drop frames that
/// arrived before it had registered the connection (the listener made the
/// link live, then announced it), and about 3-5% of fresh CLI calls waited
/// for a 300 ms retry, or `status` reported a live node as "no answer".
#[test]
fn fresh_connections_are_answered_first_time() {
    let mut g = Group::new("fresh", "16MiB");
    let mut missed = Vec::new();
    for i in 0..200 {
        let mut c = StoreClient::new(client_config(&g.addrs)).unwrap();
        for (addr, r) in c.status_all() {
            if let Err(e) = r {
                missed.push(format!("client {i}, {addr}: {e}"));
            }
        }
        assert_eq!(c.stats().retries, 0, "client {i}");
    }
    assert!(
        missed.is_empty(),
        "{} of 400 first requests unanswered: {missed:?}",
        missed.len()
    );
    g.wait_redundant(Duration::from_secs(5), 0);
}

/// A client pointed at something that is not a store node (a TCP server
/// answering garbage) fails at once with a clear error and a few lines of
/// output (issue 16, finding 6: it retried for 15 s, filling its completion
/// queue with the receives of every failed attempt, and logged 56,000 to
/// 73,000 "completion queue overflow" lines).
#[test]
fn a_garbage_server_is_refused_at_once_and_quietly() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    std::thread::spawn(move || {
        for c in l.incoming() {
            let Ok(mut c) = c else { return };
            std::thread::spawn(move || {
                use std::io::{Read, Write};
                let mut b = [0u8; 512];
                let _ = c.read(&mut b);
                let junk: Vec<u8> = (0..4096u32)
                    .map(|i| (i.wrapping_mul(2654435761u32) >> 13) as u8)
                    .collect();
                let _ = c.write_all(&junk);
            });
        }
    });
    for args in [
        vec!["store", "read-ptr", "0x7f0000001000:0x00012345:64:1"],
        vec!["store", "put", "greeting", "hello"],
        vec!["store", "get", "greeting"],
        vec!["store", "status"],
    ] {
        let t0 = Instant::now();
        let out = Command::new(SOFTRDMA)
            .args(&args)
            .args(["--nodes", &addr.to_string()])
            .output()
            .unwrap();
        let secs = t0.elapsed().as_secs_f64();
        let err = String::from_utf8_lossy(&out.stderr);
        let lines = err.lines().count() + String::from_utf8_lossy(&out.stdout).lines().count();
        assert!(!out.status.success(), "{args:?} succeeded");
        assert!(
            lines <= 5,
            "{args:?}: {lines} lines of output:\n{err:.2000}"
        );
        assert!(secs < 5.0, "{args:?} took {secs:.1} s");
        assert!(
            err.contains("not a store node") || err.contains("no node answered"),
            "{args:?}: {err}"
        );
    }
}

/// README command 1's main job, shortened: a primary killed under load,
/// failover, rejoin, every acknowledged write read back; the terminal shows
/// progress and the summary, no log lines.
#[test]
fn the_demo_loses_no_write_and_prints_no_log_lines() {
    let out = Command::new(SOFTRDMA)
        .args(["demo", "--duration", "5", "--kill-at", "2"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "demo failed:\n{text}\n{err}");
    assert!(text.contains("lost writes: 0"), "{text}");
    assert!(text.contains("took over as primary"), "{text}");
    for l in text.lines().chain(err.lines()) {
        assert!(
            !(l.contains(" WARN ") || l.contains(" ERROR ") || l.contains(" INFO ")),
            "a log line on the terminal: {l}"
        );
    }
}

/// Sends `sig` (STOP, CONT) to a node's process.
fn signal(n: &Node, sig: &str) {
    let pid = n.child.as_ref().expect("running").id();
    let st = Command::new("kill")
        .args([&format!("-{sig}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success(), "kill -{sig} {pid}");
}

/// Issue 16's checker: concurrent clients write and read shared registers
/// (one-sided reads) while the group goes through `kill -9` of the primary
/// and of the secondary (restarted, rejoining) and SIGSTOP of either for
/// longer than its lease; every operation's invocation, completion and
/// result is recorded and the history is checked against a register model
/// (unknown outcomes possibly applied). 8 faults here, 60 with
/// SOFTRDMA_SOAK=1; a failing history is saved and printed minimised.
#[test]
fn histories_stay_linearizable_under_kills_and_pauses() {
    let soak = std::env::var("SOFTRDMA_SOAK").is_ok_and(|v| v == "1");
    linearizable_under_faults(Group::new("lin", "16MiB"), if soak { 60 } else { 8 });
}

/// The same with etcd as the coordinator (where issue 16's stale reads were
/// seen most: its answers come late).
#[test]
fn histories_stay_linearizable_under_kills_and_pauses_with_etcd() {
    let etcd = start_etcd();
    let soak = std::env::var("SOFTRDMA_SOAK").is_ok_and(|v| v == "1");
    let g = Group::with_coordinator("linetcd", "16MiB", Some(&etcd.url));
    linearizable_under_faults(g, if soak { 20 } else { 4 });
}

fn linearizable_under_faults(mut g: Group, faults: usize) {
    let w = Workload::start(&g.addrs, 16, 4, 400, history::stay());
    w.wait_progress(200, Duration::from_secs(20));
    let dir = g.dir.clone();
    let mut done = Vec::new();
    for f in 0..faults {
        // Faults strike a redundant group (see crash_primary_20_times).
        let now = g.epoch();
        let p = g.wait_redundant(Duration::from_secs(30), now.saturating_sub(1));
        let s = 3 - p;
        let e = g.epoch();
        let what = match f % 4 {
            0 => {
                g.nodes[(p - 1) as usize].kill();
                g.nodes[(p - 1) as usize].start("secondary");
                "kill -9 primary"
            }
            1 => {
                signal(&g.nodes[(p - 1) as usize], "STOP");
                std::thread::sleep(Duration::from_millis(900)); // > lease + timeout
                signal(&g.nodes[(p - 1) as usize], "CONT");
                "SIGSTOP primary 900 ms"
            }
            2 => {
                signal(&g.nodes[(s - 1) as usize], "STOP");
                std::thread::sleep(Duration::from_millis(900));
                signal(&g.nodes[(s - 1) as usize], "CONT");
                "SIGSTOP secondary 900 ms"
            }
            _ => {
                g.nodes[(s - 1) as usize].kill();
                g.nodes[(s - 1) as usize].start("secondary");
                "kill -9 secondary"
            }
        };
        // After a kill the restarted node must be registered anew (a
        // higher epoch); a pause may change nothing at all (with etcd's
        // multi-second leases a paused primary can resume as primary).
        let after = if what.starts_with("kill") { e } else { e - 1 };
        g.wait_redundant(Duration::from_secs(30), after);
        w.wait_progress(100, Duration::from_secs(20));
        done.push(what);
    }
    let rec = w.finish();
    println!(
        "linearizability: {} ops ({} unknown, {} refused), {} one-sided reads, faults {done:?}",
        rec.ops.len(),
        rec.unknown,
        rec.refused,
        rec.one_sided
    );
    assert!(rec.one_sided > 0, "no one-sided read was made");
    assert_linearizable(&rec.ops, &dir, "kills-and-pauses");
}

/// Issue 16, finding 3: the durability policy. With
/// `min_in_sync_replicas = 1` a primary left alone (its secondary killed)
/// refuses writes with a clear error, changing nothing, until the
/// restarted secondary is in sync again; then it accepts them. With the
/// default 0 it keeps acknowledging writes held by it alone (reported as
/// not redundant), the trade-off docs/store.md describes.
#[test]
fn min_in_sync_replicas_refuses_writes_held_by_one_node() {
    for policy in [1u8, 0] {
        let extra = format!("min_in_sync_replicas = {policy}");
        let mut g = Group::with_config(&format!("minsync{policy}"), "16MiB", None, &extra);
        let mut cfg = client_config(&g.addrs);
        cfg.deadline = Duration::from_secs(2);
        // The refusal itself is what this test looks at.
        cfg.wait_for_replicas = Duration::ZERO;
        let mut c = StoreClient::new(cfg).unwrap();
        let p = c.alloc(b"while redundant").unwrap();
        let primary = g.primary();
        let s = 3 - primary;
        let e = g.epoch();
        g.nodes[(s - 1) as usize].kill();
        // Until the primary has dropped the dead secondary its writes wait
        // for it; then policy 1 refuses new ones, policy 0 acknowledges
        // them alone. (A write in flight when the secondary died stays
        // pending under policy 1 until a secondary is in sync again: its
        // client times out, outcome unknown.)
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut held = 0;
        let outcome = loop {
            match c.update_ptr(p, b"alone?") {
                Err(ClientError::Store(StoreError::NotEnoughReplicas)) => break "refused",
                Ok(_) if !g.status().iter().any(|x| x.redundant) => break "acknowledged alone",
                Err(ClientError::Unavailable(_)) if policy == 1 => held += 1,
                r => assert!(Instant::now() < deadline, "policy {policy}: {r:?}"),
            }
            assert!(Instant::now() < deadline, "policy {policy}: no outcome");
        };
        match policy {
            1 => {
                assert_eq!(outcome, "refused");
                // Refused writes changed nothing; the one held (if any) is
                // not visible either: not committed.
                assert!(held <= 1, "{held} writes held");
                assert_eq!(c.read_ptr(p).unwrap(), b"while redundant");
                assert!(matches!(
                    c.alloc(b"x"),
                    Err(ClientError::Store(StoreError::NotEnoughReplicas))
                ));
                let err = c.alloc(b"x").unwrap_err().to_string();
                assert!(err.contains("no secondary in sync"), "{err}");
            }
            _ => assert_eq!(outcome, "acknowledged alone"),
        }
        // The secondary comes back; writes are accepted (and replicated).
        g.nodes[(s - 1) as usize].start("secondary");
        g.wait_redundant(Duration::from_secs(30), e);
        c.update_ptr(p, b"redundant again").unwrap();
        assert_eq!(c.read_ptr(p).unwrap(), b"redundant again");
    }
}

/// Issue 18: named keys end to end. Keys written by one client are found
/// by another with one-sided look-ups alone (no fallback); a stale cached
/// pointer whose space now holds another key is detected; conditional
/// puts, scans and batched gets; after the primary is killed, every key is
/// found one-sided **on the new primary** (the former secondary's arena
/// under the same STag); the CLI's key forms.
#[test]
fn keys_are_found_one_sided_on_both_nodes() {
    let mut g = Group::new("keys", "16MiB");
    let before = g.wait_redundant(Duration::from_secs(20), 0);
    assert!(before > 0);
    let mut a = StoreClient::new(client_config(&g.addrs)).unwrap();
    let key = |i: u32| format!("key-{i}").into_bytes();
    let val = |i: u32, round: u32| -> Vec<u8> {
        (0..(i * 37 % 500 + 1))
            .map(|k| (k ^ i ^ round) as u8)
            .collect()
    };
    for i in 0..200 {
        a.set(&key(i), &val(i, 0)).unwrap();
    }
    use softrdma_store::proto::Cond;
    assert_eq!(a.set_if(&key(3), b"x", Cond::IfAbsent).unwrap(), None);
    assert_eq!(a.set_if(b"nope", b"x", Cond::IfPresent).unwrap(), None);
    assert!(a.set_if(b"fresh", b"x", Cond::IfAbsent).unwrap().is_some());
    assert!(a.del(b"fresh").unwrap());
    assert!(!a.del(b"fresh").unwrap());
    let st = g.status();
    assert!(st.iter().all(|s| s.keys == 200), "{st:?}");

    // Another client, knowing nothing: every key by RDMA Reads alone.
    let mut b = StoreClient::new(client_config(&g.addrs)).unwrap();
    for i in 0..200 {
        assert_eq!(b.get(&key(i)).unwrap(), Some(val(i, 0)), "key {i}");
    }
    assert_eq!(b.get(b"missing").unwrap(), None);
    let s = b.stats();
    assert_eq!(s.keyed_one_sided, 201, "{s:?}");
    assert_eq!(
        (
            s.server_reads,
            s.keyed_fallback_raced,
            s.keyed_fallback_refused
        ),
        (0, 0, 0),
        "{s:?}"
    );
    // Cached: one Read each.
    for i in 0..200 {
        assert_eq!(b.get(&key(i)).unwrap(), Some(val(i, 0)));
    }
    assert_eq!(b.stats().cache_hits - s.cache_hits, 200);

    // Delete and reuse: b's cached pointer for key-7 now names space that
    // holds another key's object of the same size.
    let old = a.set(&key(7), &val(7, 0)).unwrap();
    assert!(a.del(&key(7)).unwrap());
    let reused = a.set(b"usurper", &val(7, 0)).unwrap();
    assert_eq!(
        (reused.addr, reused.len),
        (old.addr, old.len),
        "the test must force reuse of the same space"
    );
    assert_ne!(reused.gen, old.gen, "another object: another generation");
    let s = b.stats();
    assert_eq!(
        b.get(&key(7)).unwrap(),
        None,
        "another key's value returned"
    );
    assert_eq!(
        b.stats().cache_hits,
        s.cache_hits,
        "the stale hit was detected"
    );
    assert_eq!(b.get(b"usurper").unwrap(), Some(val(7, 0)));
    // An update that moves the object: the cached pointer is stale, the
    // look-up finds the new one.
    let big = vec![9u8; 3000];
    a.set(&key(8), &big).unwrap();
    assert_eq!(b.get(&key(8)).unwrap(), Some(big.clone()));

    // Batched gets, a missing key among them.
    let names: Vec<Vec<u8>> = (100..150).map(key).chain([b"none".to_vec()]).collect();
    let refs: Vec<&[u8]> = names.iter().map(|k| k.as_slice()).collect();
    let got = b.get_many(&refs);
    for (i, r) in (100..150).zip(&got) {
        assert_eq!(r.as_ref().unwrap().as_ref(), Some(&val(i, 0)), "key {i}");
    }
    assert_eq!(got[50].as_ref().unwrap(), &None);
    // Scan with a pattern.
    let mut found = b.scan(b"key-1?").unwrap();
    found.sort();
    let mut want: Vec<Vec<u8>> = (10..20).map(key).collect();
    want.sort();
    assert_eq!(found, want);
    assert_eq!(b.scan(b"").unwrap().len(), 200);

    // Failover: the new primary serves the same look-ups.
    let epoch = g.epoch();
    let pr = g.primary();
    g.nodes[(pr - 1) as usize].kill();
    let deadline = Instant::now() + Duration::from_secs(20);
    let np = loop {
        let p = g.primary();
        if p != pr {
            break p;
        }
        assert!(
            Instant::now() < deadline,
            "no failover after killing node {pr}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert_ne!(np, pr);
    let s = b.stats();
    for i in (0..200).filter(|&i| i != 7 && i != 8) {
        assert_eq!(
            b.get(&key(i)).unwrap(),
            Some(val(i, 0)),
            "key {i} after failover"
        );
    }
    assert_eq!(b.get(&key(8)).unwrap(), Some(big));
    assert_eq!(b.get(&key(7)).unwrap(), None);
    let d = b.stats();
    let one_sided = d.keyed_one_sided - s.keyed_one_sided;
    let refused = d.keyed_fallback_refused - s.keyed_fallback_refused;
    // The first get finds the old primary gone and asks the new one (the
    // client learns it); the rest are one-sided reads of its arena.
    assert!(refused <= 2 && one_sided >= 198, "{s:?} -> {d:?}");
    assert!(g.epoch() > epoch);
    // A new client on the new primary, the same.
    let mut c = StoreClient::new(client_config(&g.addrs)).unwrap();
    for i in 0..20 {
        assert_eq!(c.get(&key(i + 20)).unwrap(), Some(val(i + 20, 0)));
    }
    assert!(c.stats().keyed_one_sided >= 19, "{:?}", c.stats());
    // The killed node rejoins: the group takes writes again (by default a
    // primary alone refuses them).
    let e = g.epoch();
    g.nodes[(pr - 1) as usize].start("secondary");
    assert_eq!(
        g.wait_redundant(Duration::from_secs(30), e.saturating_sub(1)),
        np
    );

    // The CLI's key forms.
    let cli = |args: &[&str]| {
        let out = Command::new(SOFTRDMA)
            .args(["store"])
            .args(args)
            .args(["--nodes", &g.nodes_arg()])
            .env("SOFTRDMA_STORE_PASSWORD", common::STORE_SECRET)
            .output()
            .unwrap();
        (out.status.code(), out.stdout)
    };
    assert_eq!(cli(&["put", "greeting", "hello world"]).0, Some(0));
    assert_eq!(
        cli(&["get", "greeting"]),
        (Some(0), b"hello world\n".to_vec())
    );
    assert_eq!(cli(&["put", "--nx", "greeting", "again"]).0, Some(1));
    let file = g.dir.join("value.bin");
    std::fs::write(&file, [0u8, 255, 10, 13]).unwrap();
    assert_eq!(
        cli(&["put", "bin", "--file", file.to_str().unwrap()]).0,
        Some(0)
    );
    assert_eq!(
        cli(&["get", "bin", "--raw"]),
        (Some(0), vec![0u8, 255, 10, 13])
    );
    assert_eq!(cli(&["keys", "gree*"]), (Some(0), b"greeting\n".to_vec()));
    assert_eq!(cli(&["del", "greeting"]).0, Some(0));
    assert_eq!(cli(&["get", "greeting"]).0, Some(1));
    assert_eq!(cli(&["del", "greeting"]).0, Some(1));
    let _ = std::fs::remove_dir_all(&g.dir);
}

/// Issue 18: the RESP front door. `redis-cli` and `redis-benchmark`
/// against both nodes: commands answered as Redis answers them, a write on
/// the secondary redirected to the primary (`redis-cli -c` follows), and a
/// RESP write taking the replication path (it survives `kill -9` of the
/// primary it was written to).
#[test]
fn redis_tools_work_against_the_resp_front_door() {
    let mut g = Group::with_resp("resp", "16MiB");
    let pr = g.primary();
    let (p, s) = (g.resp[pr as usize - 1], g.resp[2 - pr as usize]);
    let cli = |port: u16, args: &[&str]| -> String {
        let out = Command::new("redis-cli")
            .args(["-p", &port.to_string()])
            .args(args)
            // The password from the environment, off the command line.
            .env("REDISCLI_AUTH", common::STORE_SECRET)
            .output()
            .expect("redis-cli (Debian redis-tools)");
        assert!(out.status.success(), "redis-cli {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).trim_end().to_string()
    };
    assert_eq!(cli(p, &["ping"]), "PONG");
    assert_eq!(cli(p, &["set", "a", "b"]), "OK");
    assert_eq!(cli(p, &["get", "a"]), "b");
    assert_eq!(cli(p, &["set", "a", "c", "nx"]), "");
    assert_eq!(cli(p, &["set", "z", "c", "xx"]), "");
    assert_eq!(cli(p, &["get", "z"]), "");
    assert_eq!(cli(p, &["setnx", "a", "d"]), "0");
    assert_eq!(cli(p, &["mset", "k1", "v1", "k2", "v2"]), "OK");
    assert_eq!(cli(p, &["mget", "k1", "nope", "k2"]), "v1\n\nv2");
    assert_eq!(cli(p, &["exists", "k1", "k2", "nope"]), "2");
    assert_eq!(cli(p, &["dbsize"]), "3");
    assert_eq!(cli(p, &["del", "k2", "nope"]), "1");
    assert_eq!(cli(p, &["keys", "k*"]), "k1");
    assert_eq!(cli(p, &["wait", "1", "0"]), "1");
    let info = cli(p, &["info"]);
    assert!(
        info.contains("role:master") && info.contains("db0:keys=2"),
        "{info}"
    );
    assert!(info.contains("redundant:1"), "{info}");
    assert!(cli(p, &["hset", "h", "f", "v"])
        .starts_with("ERR unknown command 'hset', with args beginning with: 'h' 'f' 'v'"));
    assert_eq!(cli(p, &["set", "t", "v", "ex", "1000"]), "OK");
    assert_eq!(cli(p, &["ttl", "t"]), "1000");
    // INFO keyspace counts the key with a TTL and its mean remaining TTL
    // (ms), as Redis's `expires` and `avg_ttl`.
    let info = cli(p, &["info", "keyspace"]);
    let db0 = info
        .lines()
        .find_map(|l| l.strip_prefix("db0:"))
        .unwrap_or_else(|| panic!("{info}"));
    let field = |name: &str| -> u64 {
        db0.split(',')
            .find_map(|f| f.strip_prefix(name)?.strip_prefix('='))
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in {db0}"))
    };
    assert_eq!((field("keys"), field("expires")), (3, 1), "{db0}");
    assert!((990_000..=1_000_000).contains(&field("avg_ttl")), "{db0}");
    assert!(cli(p, &["set", "t", "v", "ex", "0"]).contains("invalid expire time in 'set' command"));
    assert!(cli(p, &["get"]).contains("wrong number of arguments"));
    // The secondary: a write names the primary and the key's cluster
    // slot; redis-cli -c follows.
    let slot = softrdma_store::resp_codec::key_slot(b"x");
    assert_eq!(
        cli(s, &["set", "x", "y"]),
        format!("MOVED {slot} 127.0.0.1:{p}")
    );
    assert_eq!(cli(s, &["-c", "set", "x", "y"]), "OK");
    assert_eq!(cli(s, &["get", "x"]), "y");
    assert!(cli(s, &["info", "replication"]).contains("role:slave"));
    // The exact bytes, requests pipelined in one write (redis-cli shows
    // a nil and an empty string alike): answered in order, as Redis
    // answers them; an inline command among them.
    // (Each connection authenticates first; its "+OK" is taken off.)
    let raw = |port: u16, req: &[u8]| -> Vec<u8> {
        use std::io::{Read, Write};
        let mut c = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
        c.write_all(format!("AUTH {}\r\n", common::STORE_SECRET).as_bytes())
            .unwrap();
        c.write_all(req).unwrap();
        c.shutdown(std::net::Shutdown::Write).unwrap();
        let mut r = Vec::new();
        c.read_to_end(&mut r).unwrap();
        assert!(r.starts_with(b"+OK\r\n"), "AUTH: {r:?}");
        r.drain(..5);
        r
    };
    let cmd = |args: &[&[u8]]| -> Vec<u8> {
        let mut b = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            b.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            b.extend_from_slice(a);
            b.extend_from_slice(b"\r\n");
        }
        b
    };
    let mut req = Vec::new();
    for c in [
        &[&b"SET"[..], b"p1", b"v1"][..],
        &[b"GET", b"p1"],
        &[b"GET", b"missing"],
        &[b"SET", b"p1", b"x", b"NX"],
        &[b"SET", b"p2", b"", b"XX"],
        &[b"MGET", b"p1", b"missing", b""],
        &[b"EXISTS", b"p1", b"p1", b"missing"],
        &[b"DEL", b"missing"],
    ] {
        req.extend(cmd(c));
    }
    req.extend_from_slice(b"PING\r\n");
    assert_eq!(
        String::from_utf8_lossy(&raw(p, &req)),
        "+OK\r\n$2\r\nv1\r\n$-1\r\n$-1\r\n$-1\r\n*3\r\n$2\r\nv1\r\n$-1\r\n$-1\r\n\
         :2\r\n:0\r\n+PONG\r\n"
    );
    // A request of many reads (100 values of 4,000 bytes) and a reply
    // far larger than the front door buffers (an MGET of 1,000 of them):
    // every value, in order.
    let vals: Vec<Vec<u8>> = (0..100u32)
        .map(|i| (0..4000).map(|j| (i * 7 + j) as u8).collect())
        .collect();
    let names: Vec<Vec<u8>> = (0..100).map(|i| format!("big{i}").into_bytes()).collect();
    let mut mset: Vec<&[u8]> = vec![b"MSET"];
    for (k, v) in names.iter().zip(&vals) {
        mset.push(k);
        mset.push(v);
    }
    let mut mget: Vec<&[u8]> = vec![b"MGET"];
    for i in 0..1000 {
        mget.push(&names[i % 100]);
    }
    let mut req = cmd(&mset);
    req.extend(cmd(&mget));
    let mut want = b"+OK\r\n*1000\r\n".to_vec();
    for i in 0..1000 {
        want.extend_from_slice(b"$4000\r\n");
        want.extend_from_slice(&vals[i % 100]);
        want.extend_from_slice(b"\r\n");
    }
    assert!(raw(p, &req) == want, "MSET + MGET of 1,000 values");
    // A protocol error ends the connection with a clear error.
    let r = raw(p, b"*1\r\n:oops\r\n");
    assert!(r.starts_with(b"-ERR Protocol error"), "{r:?}");
    // So does a request whose length passes the limit, before its bytes
    // come.
    let over = softrdma_store::resp_codec::MAX_BULK + 1;
    let r = raw(p, format!("*1\r\n${over}\r\n").as_bytes());
    assert!(r.starts_with(b"-ERR Protocol error"), "{r:?}");
    // redis-benchmark completes against the primary (whose writes are
    // replicated to the secondary) and reads through the secondary; its
    // SETs on the secondary stop at the redirection, as they stop at
    // -READONLY against a Redis replica.
    let bench = |port: u16, tests: &str| {
        Command::new("redis-benchmark")
            .args([
                "-p",
                &port.to_string(),
                "-t",
                tests,
                "-n",
                "2000",
                "-c",
                "4",
            ])
            .args(["-d", "64", "-q", "-a", common::STORE_SECRET])
            .output()
            .expect("redis-benchmark")
    };
    let out = bench(p, "set,get");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{out:?}");
    assert!(text.contains("SET:") && text.contains("GET:"), "{text}");
    let out = bench(s, "get");
    assert!(out.status.success(), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("GET:"),
        "{out:?}"
    );
    let out = bench(s, "set");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("MOVED ") && err.contains(&format!(" 127.0.0.1:{p}")),
        "{out:?}"
    );
    // The RESP write was replicated: it survives its primary.
    let epoch = g.epoch();
    g.nodes[pr as usize - 1].kill();
    let deadline = Instant::now() + Duration::from_secs(10);
    while g.epoch() <= epoch || g.primary() == pr {
        assert!(Instant::now() < deadline, "no failover");
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(cli(s, &["get", "a"]), "b");
    assert_eq!(cli(s, &["get", "x"]), "y");
    assert!(cli(s, &["info"]).contains("role:master"));
    let _ = std::fs::remove_dir_all(&g.dir);
}

// ------------------------------------------------------------------ issue 29

/// `softrdma store serve` log lines of node `id` that contain `what`
/// (colour codes taken out).
fn log_count(g: &Group, id: u32, what: &str) -> usize {
    let text = std::fs::read_to_string(g.dir.join(format!("node{id}.log"))).unwrap_or_default();
    let mut plain = String::with_capacity(text.len());
    let mut esc = false;
    for c in text.chars() {
        match (esc, c) {
            (false, '\x1b') => esc = true,
            (true, 'm') => esc = false,
            (true, _) => {}
            (false, c) => plain.push(c),
        }
    }
    plain.lines().filter(|l| l.contains(what)).count()
}

/// A client configuration proving `user`'s `password`.
fn user_config(nodes: &[SocketAddr], user: &str, password: &str) -> ClientConfig {
    let mut c = ClientConfig::new(nodes.to_vec());
    c.auth = Some(ClientAuth {
        user: user.into(),
        secret: Secret::new(password.as_bytes()),
    });
    c
}

/// `redis-cli -p PORT ARGS...`: its stdout and stderr together.
fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .output()
        .expect("redis-cli (Debian redis-tools)");
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

const READER: &str =
    "[[auth.users]]\nname = \"reader\"\npassword = \"reader-pass-1\"\nrights = \"read\"\n";
const WRITER: &str =
    "[[auth.users]]\nname = \"writer\"\npassword = \"writer-pass-2\"\nrights = \"readwrite\"\n";

/// Issue 29, finding 1: a client or a would-be node that lacks the
/// group's credentials gets nothing (no STag, no data, no join); a
/// read-only user reads and may not write; `redis-cli --user U --pass P`
/// works and `redis-cli` without credentials gets `-NOAUTH`; no secret
/// shows in the logs, `INFO` or `status`. (Before the fix any process that
/// reached a port read, wrote and listed everything.)
#[test]
fn without_the_credentials_there_is_no_stag_no_data_and_no_join() {
    let mut g = Group::with_users("authz", "16MiB", READER);
    let mut w = StoreClient::new(client_config(&g.addrs)).unwrap();
    w.set(b"secret-key", b"secret-value").unwrap();

    // A native client without credentials, or with a wrong password: a
    // clear refusal at connect time, at once, and no arena learnt.
    for (auth, why) in [
        (None, "requires authentication"),
        (
            Some(ClientAuth {
                user: "default".into(),
                secret: Secret::new(b"a guess"),
            }),
            "authentication failed",
        ),
        (
            Some(ClientAuth {
                user: "nobody".into(),
                secret: Secret::new(common::STORE_SECRET.as_bytes()),
            }),
            "authentication failed",
        ),
    ] {
        let mut cfg = ClientConfig::new(g.addrs.clone());
        cfg.auth = auth;
        let mut c = StoreClient::new(cfg).unwrap();
        let t0 = Instant::now();
        let e = c.get(b"secret-key").unwrap_err();
        assert!(matches!(&e, ClientError::Auth(m) if m.contains(why)), "{e}");
        assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
        assert_eq!(
            c.arena(),
            None,
            "an unauthenticated client learnt the arena"
        );
        let e = c.set(b"k", b"v").unwrap_err();
        assert!(matches!(e, ClientError::Auth(_)), "{e}");
    }
    assert_eq!(w.get(b"k").unwrap(), None, "a refused client wrote");

    // The read-only user: one-sided reads, no writes.
    let mut ro = StoreClient::new(user_config(&g.addrs, "reader", "reader-pass-1")).unwrap();
    assert_eq!(
        ro.get(b"secret-key").unwrap().as_deref(),
        Some(&b"secret-value"[..])
    );
    assert!(ro.stats().keyed_one_sided >= 1, "{:?}", ro.stats());
    for r in [
        ro.set(b"k", b"v").map(|_| ()),
        ro.del(b"secret-key").map(|_| ()),
    ] {
        assert!(
            matches!(r, Err(ClientError::Store(StoreError::NoPermission))),
            "{r:?}"
        );
    }
    assert!(matches!(
        ro.alloc(b"v"),
        Err(ClientError::Store(StoreError::NoPermission))
    ));

    // A would-be node that knows the addresses but not the secret: refused
    // before it is sent anything, so it never starts.
    let port = free_ports(1)[0];
    let cfg = g.dir.join("intruder.toml");
    std::fs::write(g.dir.join("wrong.secret"), "not the secret\n").unwrap();
    std::fs::write(
        &cfg,
        format!(
            "group = \"authz\"\nnode_id = 3\nlisten = \"127.0.0.1:{port}\"\npeers = [\"{}\", \"{}\"]\n\
             arena_size = \"16MiB\"\n[auth]\nsecret_file = \"wrong.secret\"\n\
             [coordinator]\nkind = \"embedded\"\naddr = \"{}\"\n",
            g.addrs[0],
            g.addrs[1],
            g._coord.addr()
        ),
    )
    .unwrap();
    let out = Command::new(SOFTRDMA)
        .args(["store", "serve", "--role", "secondary", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "an intruder node started: {err}");
    assert!(err.contains("refused this node"), "{err}");
    // Neither can it pose as a node with no secret at all.
    let ep = Endpoint::open("intruder").unwrap();
    let node_hello = Hello::Node(NodeHello {
        member: softrdma_store::proto::Member {
            node: 3,
            incarnation: 9,
        },
        group: "authz".into(),
    });
    let r = handshake::connect(&ep, g.addrs[0], &node_hello, None, CONNECT_TIMEOUT);
    assert!(
        matches!(&r, Err(HandshakeError::Refused(m)) if m.contains("requires authentication")),
        "{:?}",
        r.map(|(_, a)| a)
    );
    // The group went on: still redundant, same data.
    let st = g.status();
    assert!(
        st.iter().any(|s| s.role == PRIMARY && s.redundant),
        "{st:?}"
    );

    // RESP: NOAUTH without credentials, the read-only user's write NOPERM,
    // a wrong password WRONGPASS, and --user/--pass working.
    let pr = g.primary();
    let port = g.resp[pr as usize - 1];
    assert!(
        redis_cli(port, &["get", "secret-key"]).contains("NOAUTH Authentication required."),
        "{}",
        redis_cli(port, &["get", "secret-key"])
    );
    let ro_cli = |args: &[&str]| {
        let mut a = vec![
            "--no-auth-warning",
            "--user",
            "reader",
            "--pass",
            "reader-pass-1",
        ];
        a.extend_from_slice(args);
        redis_cli(port, &a)
    };
    assert_eq!(ro_cli(&["get", "secret-key"]).trim(), "secret-value");
    let out = ro_cli(&["set", "a", "b"]);
    assert!(
        out.contains("NOPERM User reader has no permissions to run the 'set' command"),
        "{out}"
    );
    let out = redis_cli(
        port,
        &[
            "--no-auth-warning",
            "--user",
            "reader",
            "--pass",
            "wrong",
            "get",
            "x",
        ],
    );
    assert!(out.contains("WRONGPASS"), "{out}");
    let out = redis_cli(
        port,
        &[
            "--no-auth-warning",
            "--pass",
            common::STORE_SECRET,
            "set",
            "a",
            "b",
        ],
    );
    assert_eq!(out.trim(), "OK");

    // No secret in INFO, status or the logs (the nodes log at -v).
    let info = redis_cli(
        port,
        &["--no-auth-warning", "--pass", common::STORE_SECRET, "info"],
    );
    assert!(info.contains("durability:"), "{info}");
    let status = Command::new(SOFTRDMA)
        .args(["store", "status", "--json", "--nodes", &g.nodes_arg()])
        .env("SOFTRDMA_STORE_PASSWORD", common::STORE_SECRET)
        .output()
        .unwrap();
    assert!(status.status.success(), "{status:?}");
    let mut seen = String::from_utf8_lossy(&status.stdout).into_owned() + &info;
    for id in 1..=2 {
        seen += &std::fs::read_to_string(g.dir.join(format!("node{id}.log"))).unwrap();
    }
    assert!(
        seen.contains("connection refused"),
        "the refusals are logged"
    );
    for s in [common::STORE_SECRET, "reader-pass-1", "not the secret"] {
        assert!(!seen.contains(s), "a secret shows: {s}");
    }
    let _ = std::fs::remove_dir_all(&g.dir);
}

/// Issue 29, finding 1: revocation is live. Removing a user from both
/// nodes' configuration ends its connections at once (native and RESP),
/// and the arena's STag rotates on both nodes, so a connection that kept
/// the old STag reads nothing; new connections learn the new one.
#[test]
fn a_revoked_user_is_shut_out_and_the_old_stag_reads_nothing() {
    let users = format!("{WRITER}{READER}");
    let mut g = Group::with_users("revoke", "16MiB", &users);
    let pr = g.primary();
    let paddr = g.addrs[pr as usize - 1];
    let mut writer = StoreClient::new(user_config(&g.addrs, "writer", "writer-pass-2")).unwrap();
    writer.set(b"k", b"v1").unwrap();
    let mut reader = StoreClient::new(user_config(&g.addrs, "reader", "reader-pass-1")).unwrap();
    assert_eq!(reader.get(b"k").unwrap().as_deref(), Some(&b"v1"[..]));
    // A RESP session of the reader.
    use std::io::{Read, Write};
    let mut resp = std::net::TcpStream::connect(("127.0.0.1", g.resp[pr as usize - 1])).unwrap();
    resp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut ask = |req: &str| -> String {
        resp.write_all(req.as_bytes()).unwrap();
        let mut b = [0u8; 256];
        let n = resp.read(&mut b).unwrap_or(0);
        String::from_utf8_lossy(&b[..n]).into_owned()
    };
    assert_eq!(ask("AUTH reader reader-pass-1\r\n"), "+OK\r\n");
    assert_eq!(ask("GET k\r\n"), "$2\r\nv1\r\n");
    // A connection (the default user, which stays) that holds the STag.
    let ep = Endpoint::open("stag-holder").unwrap();
    let hello = Hello::Client {
        id: 0x5eed,
        user: "default".into(),
    };
    let auth = common::store_auth();
    let (link, acc) = handshake::connect(&ep, paddr, &hello, Some(&auth), CONNECT_TIMEOUT).unwrap();
    let old = acc.arena.expect("the arena");
    let mr = ep.pd().alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    link.read(&mr, 64, old.base, old.stag, Duration::from_secs(2))
        .expect("the STag reads before the revocation");

    // Revoke the reader on both nodes (written whole, then renamed in).
    let t0 = Instant::now();
    for n in &g.nodes {
        let text = std::fs::read_to_string(&n.cfg).unwrap().replace(READER, "");
        let tmp = n.cfg.with_extension("tmp");
        std::fs::write(&tmp, text).unwrap();
        std::fs::rename(&tmp, &n.cfg).unwrap();
    }
    // The old STag stops reading: the primary rotated it.
    let deadline = t0 + Duration::from_secs(5);
    while link
        .read(&mr, 64, old.base, old.stag, Duration::from_millis(500))
        .is_ok()
    {
        assert!(Instant::now() < deadline, "the old STag still reads");
        std::thread::sleep(Duration::from_millis(5));
    }
    let rotated = t0.elapsed();
    // The reader's native client is refused from now on.
    let e = reader.get(b"k").unwrap_err();
    assert!(
        matches!(&e, ClientError::Auth(m) if m.contains("authentication failed")),
        "{e}"
    );
    // Its RESP session ends with NOAUTH.
    assert!(ask("GET k\r\n").starts_with("-NOAUTH"));
    // New connections learn the new STag (same arena index, another
    // key); the writer goes on reading one-sided and writing.
    let (_l2, acc2) = handshake::connect(&ep, paddr, &hello, Some(&auth), CONNECT_TIMEOUT).unwrap();
    let new = acc2.arena.unwrap();
    assert_ne!(new.stag, old.stag);
    assert_eq!(new.stag >> 8, old.stag >> 8, "the same arena");
    writer.set(b"k", b"v2").unwrap();
    assert_eq!(writer.get(b"k").unwrap().as_deref(), Some(&b"v2"[..]));
    assert_eq!(writer.arena().unwrap().stag, new.stag);
    // Both nodes took the rotation (it is replicated): after a failover
    // the old STag reads nothing either.
    let st = g.status();
    assert!(st.iter().all(|s| s.stag == new.stag), "{st:?}");
    println!("old STag refused {rotated:?} after the configuration changed");
    let _ = std::fs::remove_dir_all(&g.dir);
}

/// Issue 29, finding 3: a stale pointer of the pointer API reaches no
/// other object, through the CLI as a user meets it: insert, delete,
/// insert another value of the same length (the same space); the old
/// pointer reads, updates and deletes nothing. (Before the fix the new
/// object got the same pointer text, the old pointer read it, and an
/// update through it replaced what the new owner read.)
#[test]
fn a_stale_pointer_reaches_no_other_object() {
    let g = Group::new("stale", "16MiB");
    let cli = |args: &[&str]| {
        let out = Command::new(SOFTRDMA)
            .arg("store")
            .args(args)
            .args(["--nodes", &g.nodes_arg()])
            .env("SOFTRDMA_STORE_PASSWORD", common::STORE_SECRET)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).trim().to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, old, _) = cli(&["alloc", "first value"]);
    assert!(ok, "{old}");
    assert!(cli(&["free", &old]).0);
    // The pointer commands' old names (insert/read/update/delete) remain
    // aliases.
    let (ok, new, _) = cli(&["insert", "other value"]);
    assert!(ok);
    let (o, n): (RemotePtr, RemotePtr) = (old.parse().unwrap(), new.parse().unwrap());
    assert_eq!((o.addr, o.len), (n.addr, n.len), "the space was reused");
    assert_ne!(old, new, "the pointer texts differ (the generation)");
    for args in [
        vec!["read-ptr", old.as_str()],
        vec!["update-ptr", old.as_str(), "overwrite!!"],
        vec!["free", old.as_str()],
    ] {
        let (ok, out, err) = cli(&args);
        assert!(!ok, "{args:?} through the stale pointer worked: {out}");
        assert!(err.contains("stale pointer"), "{args:?}: {err}");
    }
    assert_eq!(cli(&["read-ptr", &new]).1, "other value");
    let _ = std::fs::remove_dir_all(&g.dir);
}

/// Issue 29, findings 4 and 9: under the default configuration, 20
/// restarts of the secondary under load cost the primary no step-down and
/// one copy each, and lose nothing. (A restart after an earlier retirement
/// was refused its registration: the primary stepped down and the node
/// copied twice.)
#[test]
fn secondary_restarts_cost_no_step_down_and_one_copy_each() {
    let mut g = Group::new("restarts", "64MiB");
    let p = g.primary();
    let s = 3 - p;
    let rounds = 20;
    // First the secondary stops for longer than the secondary timeout (2 s
    // by default): the primary drops it and it rejoins in process, retiring
    // its incarnation, as a node does after any drop. Every restart after
    // that is the case of finding 9.
    let e = g.epoch();
    signal(&g.nodes[(s - 1) as usize], "STOP");
    let deadline = Instant::now() + Duration::from_secs(10);
    while g.status().iter().any(|x| x.redundant) {
        assert!(
            Instant::now() < deadline,
            "the stopped secondary was never dropped"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    signal(&g.nodes[(s - 1) as usize], "CONT");
    assert_eq!(g.wait_redundant(Duration::from_secs(30), e), p);
    assert!(
        log_count(&g, s, "role=Joining") >= 2,
        "the secondary did not rejoin in process"
    );
    assert_eq!(
        log_count(&g, p, "role=Fenced"),
        0,
        "the primary stepped down"
    );
    let copies0 = log_count(&g, p, "sending SyncStart");
    for round in 1..=rounds {
        let (child, rx) = start_load(&g, 100 + round, 1.5);
        wait_progress(&rx, 0.4);
        let e = g.epoch();
        g.nodes[(s - 1) as usize].kill();
        g.nodes[(s - 1) as usize].start("secondary");
        let sum = finish_load(child, rx);
        for f in ["lost_writes", "resurrected", "wrong_key", "stale_reached"] {
            assert_eq!(sum[f], 0, "round {round}: {sum}");
        }
        assert_eq!(
            g.wait_redundant(Duration::from_secs(30), e),
            p,
            "round {round}"
        );
    }
    let copies = log_count(&g, p, "sending SyncStart") - copies0;
    let joins = log_count(&g, p, "role=Joining");
    let fences = log_count(&g, p, "role=Fenced");
    println!("{rounds} secondary restarts: {copies} copies, {joins} step-downs to a joining node, {fences} lease fences");
    // The defect (a restarted secondary refused its registration) made the
    // primary step down to a joining node and copy twice. A fence from a
    // lease renewal starved by the machine's load (seen in CI with a CPU
    // hog and a guest beside the suite) is not that: the primary resumes
    // with no copy, which the count of copies checks.
    assert_eq!(joins, 0, "the primary stepped down to rejoin");
    assert_eq!(copies, rounds as usize, "one copy per restart");
    assert!(
        fences <= 2,
        "the primary fenced itself {fences} times in {rounds} restarts"
    );
    let _ = std::fs::remove_dir_all(&g.dir);
}

/// Issue 29, finding 4: the double fault under the default configuration.
/// The secondary is killed, then the primary, then both restart: the
/// primary acknowledged no write while it was alone (each was refused or
/// never answered), and the restarted nodes do not serve an empty store as
/// if it were the group's.
#[test]
fn a_double_fault_under_defaults_acknowledged_nothing_held_by_one_node() {
    let mut g = Group::new("double", "16MiB");
    let p = g.primary();
    let s = 3 - p;
    let mut c = StoreClient::new(client_config(&g.addrs)).unwrap();
    c.set(b"before", b"both nodes hold it").unwrap();
    g.nodes[(s - 1) as usize].kill();
    // The primary is alone: writes are refused (or time out unanswered),
    // never acknowledged.
    let mut cfg = client_config(&g.addrs);
    cfg.deadline = Duration::from_secs(3);
    cfg.wait_for_replicas = Duration::ZERO;
    let mut alone = StoreClient::new(cfg).unwrap();
    let deadline = Instant::now() + Duration::from_secs(6);
    let (mut refused, mut tries) = (0, 0);
    while Instant::now() < deadline {
        tries += 1;
        match alone.set(format!("alone{tries}").as_bytes(), b"x") {
            Ok(_) => panic!("a write was acknowledged by the primary alone"),
            Err(ClientError::Store(StoreError::NotEnoughReplicas)) => refused += 1,
            Err(_) => {}
        }
    }
    assert!(refused > 0, "no write was refused outright ({tries} tries)");
    let st = g.status();
    assert!(st.iter().all(|x| !x.redundant), "{st:?}");
    g.nodes[(p - 1) as usize].kill();
    // Both come back: the group's record names incarnations that are gone,
    // so neither may lead; none answers "absent" for a key it lost.
    let started = g.nodes[(p - 1) as usize].try_start("auto");
    if started.is_ok() {
        let mut after = StoreClient::new({
            let mut cfg = client_config(&g.addrs);
            cfg.deadline = Duration::from_secs(2);
            cfg
        })
        .unwrap();
        let r = after.get(b"before");
        assert!(
            r.is_err(),
            "a restarted node answered {r:?} for a key it lost"
        );
    }
    let _ = std::fs::remove_dir_all(&g.dir);
}
