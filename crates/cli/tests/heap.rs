//! The registered-memory heap across real processes (`softrdma heap
//! worker`, one per participant, driven line by line over stdin/stdout):
//!
//! * `four_processes_write_into_each_other`: four processes share a heap,
//!   allocate, RDMA-Write into each other's allocations over the engine
//!   (same-host and TCP connections), free, release blocks; a process's
//!   registration of a block another released is refused by the post check
//!   and retired by its next look-up; the table checks out and clean exits
//!   leave it empty.
//! * `a_stale_rkey_grants_no_remote_access`: a remote peer holding process
//!   A's rkey for a heap block that process C freed and process B then
//!   reused is refused by A's engine (the descriptor's block id no longer matches),
//!   over TCP and over the same-host path, and B's bytes stay untouched.
//! * `killed_processes_leave_the_table_consistent`: processes are killed
//!   while they allocate and free, and inside the table lock at each of its
//!   crash points; the survivors repair (robust lock) and reap, and the
//!   table checks out.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use serde_json::Value;
use softrdma_heap::{Heap, HeapConfig};

const SOFTRDMA: &str = env!("CARGO_BIN_EXE_softrdma");

struct Worker {
    child: Child,
    stdin: ChildStdin,
    rx: mpsc::Receiver<String>,
}

impl Worker {
    fn start(heap: &str, same_host: bool, env: &[(&str, &str)]) -> Worker {
        let mut cmd = Command::new(SOFTRDMA);
        cmd.args(["heap", "worker", heap])
            .env("SOFTRDMA_HEAP_CHECK_POSTS", "1")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if same_host {
            cmd.arg("--same-host");
        }
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("start softrdma heap worker");
        let stdin = child.stdin.take().unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(|l| l.ok()) {
                let _ = tx.send(l);
            }
        });
        let mut w = Worker { child, stdin, rx };
        let r = w.line();
        assert_eq!(r["ready"], true, "{r}");
        w
    }

    fn line(&mut self) -> Value {
        let l = self
            .rx
            .recv_timeout(Duration::from_secs(60))
            .expect("worker answered");
        serde_json::from_str(&l).unwrap_or_else(|e| panic!("{e}: {l}"))
    }

    fn send(&mut self, cmd: &str) {
        writeln!(self.stdin, "{cmd}").unwrap();
        self.stdin.flush().unwrap();
    }

    fn ask(&mut self, cmd: &str) -> Value {
        self.send(cmd);
        let v = self.line();
        assert!(v.get("error").is_none(), "{cmd}: {v}");
        v
    }

    fn exit(mut self) {
        self.send("exit");
        let st = self.child.wait().unwrap();
        assert!(st.success(), "worker exit: {st}");
    }

    fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Unlink(String);
impl Drop for Unlink {
    fn drop(&mut self) {
        let _ = Heap::unlink(&self.0);
    }
}

fn create(name: &str, block: u64, blocks: u32) -> Unlink {
    let _ = Heap::unlink(name);
    let dev = softrdma_verbs::Device::open_default().unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cfg = HeapConfig {
        block_size: block,
        max_blocks: blocks,
        units: blocks,
        ..HeapConfig::new(name)
    };
    drop(Heap::create(&pd, &cfg).unwrap());
    Unlink(name.to_string())
}

fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64().unwrap_or_else(|| panic!("{k} in {v}"))
}

#[test]
fn four_processes_write_into_each_other() {
    let name = format!("mp-{}", std::process::id());
    let _u = create(&name, 1 << 20, 256);
    // Workers 0 and 1 offer the same-host path: 0 -> 1 uses it, the other
    // connections of the ring are iWARP over TCP.
    let mut w: Vec<Worker> = (0..4).map(|k| Worker::start(&name, k < 2, &[])).collect();
    let ports: Vec<u64> = w.iter_mut().map(|x| u(&x.ask("listen"), "port")).collect();
    for k in 0..4 {
        let r = w[k].ask(&format!("connect {}", ports[(k + 1) % 4]));
        assert_eq!(
            r["same_host"],
            k == 0,
            "connection {k} -> {}: {r}",
            (k + 1) % 4
        );
    }
    // Each allocates buffers of several sizes (several classes and blocks,
    // one multi-unit block).
    let sizes = [64u64, 1000, 4096, 30000, 200 << 10, 3 << 20];
    let mut bufs: Vec<Vec<Value>> = Vec::new();
    for x in w.iter_mut() {
        bufs.push(sizes.iter().map(|s| x.ask(&format!("alloc {s}"))).collect());
    }
    // k writes a pattern from its own buffer into (k+1)'s buffer of the
    // same size; (k+1) checks the bytes.
    for k in 0..4 {
        let next = (k + 1) % 4;
        for (j, _) in sizes.iter().enumerate() {
            let pat = 0x10 + (k * 8 + j) as u64;
            let src = u(&bufs[k][j], "id");
            w[k].ask(&format!("fill {src} {pat}"));
            let dst = &bufs[next][j];
            let r = w[k].ask(&format!(
                "write {src} {} {}",
                u(dst, "addr"),
                u(dst, "rkey")
            ));
            assert_eq!(r["ok"], true, "write {k} -> {next}: {r}");
            let v = w[next].ask(&format!("verify {} {pat}", u(dst, "id")));
            assert_eq!(v["ok"], true, "bytes {k} -> {next} size {}: {v}", sizes[j]);
        }
    }
    // Worker 2 sends worker 0's 4 KiB buffer (by look-up: a block 2 did not
    // allocate) into worker 3's 30000-byte buffer.
    let src0 = &bufs[0][2];
    w[0].ask(&format!("fill {} 119", u(src0, "id")));
    let dst3 = bufs[3][3].clone();
    let r = w[2].ask(&format!(
        "write_from {} 4096 {} {}",
        u(src0, "offset"),
        u(&dst3, "addr"),
        u(&dst3, "rkey")
    ));
    assert_eq!(r["ok"], true, "{r}");
    let stale_lkey = u(&r, "lkey");
    let lk = w[2].ask(&format!("lookup {} 4096", u(src0, "offset")));
    assert_eq!(u(&lk, "block"), u(src0, "block"));
    // Worker 0 frees that buffer, the only one of its block, and releases
    // the block ...
    w[0].ask(&format!("free {}", u(src0, "id")));
    assert_eq!(u(&w[0].ask("trim"), "released"), 1);
    let gone = w[2].ask(&format!("lookup {} 4096", u(src0, "offset")));
    assert!(
        gone.get("not_in_heap").is_some(),
        "released block still found: {gone}"
    );
    // ... and obtains a new block under the same descriptor (LIFO free
    // list), somewhere else, with a new id.
    let fresh = w[0].ask("alloc 4096");
    assert_eq!(u(&fresh, "block"), u(src0, "block"));
    assert_ne!(u(&fresh, "gen"), u(src0, "gen"));
    // Worker 2 was not told: its registration is stale, and a work request
    // naming it is refused before it is queued.
    let held = w[2].ask("stats");
    let r = w[2].ask(&format!(
        "post_with {} 4096 {stale_lkey} {} {}",
        u(src0, "offset"),
        u(&dst3, "addr"),
        u(&dst3, "rkey")
    ));
    assert!(
        r["refused"]
            .as_str()
            .unwrap_or("")
            .contains("stale heap registration"),
        "{r}"
    );
    // Its next look-up of the block retires the stale one, registers anew.
    let lk = w[2].ask(&format!("lookup {} 4096", u(&fresh, "offset")));
    assert_eq!(u(&lk, "gen"), u(&fresh, "gen"));
    let st = w[2].ask("stats");
    assert_eq!(
        u(&st, "stale_retired"),
        u(&held, "stale_retired") + 1,
        "{st}"
    );
    assert_eq!(u(&st, "held"), u(&held, "held"), "{st}");
    // And the new block works for RDMA both ways.
    w[0].ask(&format!("fill {} 77", u(&fresh, "id")));
    let r = w[2].ask(&format!(
        "write_from {} 4096 {} {}",
        u(&fresh, "offset"),
        u(&dst3, "addr"),
        u(&dst3, "rkey")
    ));
    assert_eq!(r["ok"], true, "{r}");
    let v = w[3].ask(&format!("verify {} 77", u(&dst3, "id")));
    assert_eq!(
        v["first_bad"], 4096,
        "only the first 4096 bytes written: {v}"
    );
    let c = w[1].ask("check quiet");
    assert_eq!(c["ok"], true, "{c}");
    // Clean exits: each releases its blocks; the table ends empty.
    for x in w {
        x.exit();
    }
    let mut last = Worker::start(&name, false, &[]);
    let c = last.ask("check quiet");
    assert_eq!(c["ok"], true, "{c}");
    assert_eq!(u(&c, "active_blocks"), 0, "{c}");
    assert_eq!(u(&c, "reaped"), 0, "clean exits leave nothing to reap: {c}");
    last.exit();
}

#[test]
fn a_stale_rkey_grants_no_remote_access() {
    for same_host in [false, true] {
        let name = format!("stale-rkey-{}-{same_host}", std::process::id());
        // Four 1 MiB units: the remote peer's two blocks, C's block, one
        // spare, so that B's two one-unit allocations must cover C's.
        let _u = create(&name, 1 << 20, 4);
        let mut r = Worker::start(&name, same_host, &[]);
        let mut a = Worker::start(&name, same_host, &[]);
        let mut b = Worker::start(&name, same_host, &[]);
        let mut c = Worker::start(&name, same_host, &[]);
        let src = r.ask("alloc 1000");
        r.ask(&format!("fill {} 51", u(&src, "id")));
        let port = u(&a.ask("listen"), "port");
        let conn = r.ask(&format!("connect {port}"));
        assert_eq!(conn["same_host"], same_host, "{conn}");
        // C allocates; A looks the buffer up (registering C's block in A)
        // and hands out its own (addr, rkey); the peer writes: fine.
        let x = c.ask("alloc 1000");
        c.ask(&format!("fill {} 17", u(&x, "id")));
        let k = a.ask(&format!("lookup {} 1000", u(&x, "offset")));
        let (addr, rkey) = (u(&k, "addr"), u(&k, "rkey"));
        let w = r.ask(&format!("write {} {addr} {rkey}", u(&src, "id")));
        assert_eq!(w["ok"], true, "same_host {same_host}: {w}");
        let v = c.ask(&format!("verify {} 51", u(&x, "id")));
        assert_eq!(v["ok"], true, "{v}");
        // C frees the buffer and releases its block; B's allocations take
        // every free unit, C's old one included.
        c.ask(&format!("free {}", u(&x, "id")));
        assert_eq!(u(&c.ask("trim"), "released"), 1);
        let mut bbufs = Vec::new();
        for _ in 0..2 {
            let y = b.ask("alloc 600000");
            b.ask(&format!("fill {} 34", u(&y, "id")));
            bbufs.push(y);
        }
        let old_unit = u(&x, "offset") >> 20;
        assert!(
            bbufs.iter().any(|y| u(y, "offset") >> 20 == old_unit),
            "B reused the released unit: {bbufs:?} vs {x}"
        );
        // A still holds its registration (nobody told it), but the peer's
        // Write through the old rkey is refused: the flush Read after it
        // fails with the connection, and B's bytes are intact.
        let w = r.ask(&format!("write {} {addr} {rkey}", u(&src, "id")));
        assert_eq!(w["ok"], false, "same_host {same_host}: {w}");
        for y in &bbufs {
            let v = b.ask(&format!("verify {} 34", u(y, "id")));
            assert_eq!(v["ok"], true, "same_host {same_host}: B's bytes: {v}");
        }
        let held = a.ask("stats");
        assert_eq!(u(&held, "held"), 1, "A kept the stale registration: {held}");
        r.kill();
        a.kill();
        b.kill();
        c.kill();
    }
}

#[test]
fn killed_processes_leave_the_table_consistent() {
    let name = format!("kill-{}", std::process::id());
    let _u = create(&name, 1 << 20, 512);
    // Three processes allocate and free at random (with trims); one is
    // SIGKILLed mid-way, the others finish.
    // Each checks that no allocation overlapped another (tags, see the
    // worker's `chaos`). SOFTRDMA_SOAK=1: 200,000 operations each.
    let ops = if std::env::var("SOFTRDMA_SOAK").is_ok_and(|v| v == "1") {
        200_000
    } else {
        3000
    };
    let mut w: Vec<Worker> = (0..3).map(|_| Worker::start(&name, false, &[])).collect();
    for (k, x) in w.iter_mut().enumerate() {
        let n = if k == 0 { u32::MAX as u64 } else { ops };
        x.send(&format!("chaos {} {n}", 11 + k));
        assert_eq!(x.line()["chaos"], "started");
    }
    // Let the victim run until its peers are done (it never finishes).
    for x in w.iter_mut().skip(1) {
        let r = x.line();
        assert_eq!(u(&r, "corrupt"), 0, "an allocation overlapped another: {r}");
        assert_eq!(r["ok"], true, "{r}");
    }
    let victim = w.remove(0);
    victim.kill();
    let c = w[0].ask("check");
    assert_eq!(c["ok"], true, "after the kill: {c}");
    // Its blocks are reaped by whoever asks (a newcomer does at open).
    let r = w[1].ask("reap");
    assert!(u(&r, "reaped") >= 1, "the victim held blocks: {r}");
    for x in w {
        x.exit();
    }
    // Deaths inside the table lock, at each crash point: the next locker
    // repairs from the descriptor words.
    let mut recovered = 0;
    for point in ["obtain", "obtain-late", "release"] {
        let mut x = Worker::start(&name, false, &[("SOFTRDMA_HEAP_CRASH", point)]);
        x.send("chaos 5 100000");
        let _ = x.line(); // started
        let st = x.child.wait().unwrap();
        use std::os::unix::process::ExitStatusExt;
        assert_eq!(
            st.signal(),
            Some(9),
            "{point}: the worker died at its crash point"
        );
        let mut y = Worker::start(&name, false, &[]);
        let c = y.ask("check");
        assert_eq!(c["ok"], true, "after a death at {point}: {c}");
        assert!(
            u(&c, "recovered") > recovered,
            "{point}: the lock was repaired: {c}"
        );
        recovered = u(&c, "recovered");
        // The survivor allocates, frees and trims normally.
        y.send("chaos 9 500");
        assert_eq!(y.line()["chaos"], "started");
        let r = y.line();
        assert_eq!(r["ok"], true, "{r}");
        y.ask("trim");
        y.exit();
    }
    let mut last = Worker::start(&name, false, &[]);
    let c = last.ask("check quiet");
    assert_eq!(c["ok"], true, "{c}");
    assert_eq!(
        u(&c, "active_blocks"),
        0,
        "every dead process's block reaped: {c}"
    );
    last.exit();
}

/// `SOFTRDMA_PIN_LIMIT` bounds what a process may pin: the second block
/// does not fit, and the allocation fails with a clear error.
#[test]
fn pin_limit_from_the_environment() {
    let name = format!("pinlim-{}", std::process::id());
    let _u = create(&name, 1 << 20, 16);
    let mut w = Worker::start(&name, false, &[("SOFTRDMA_PIN_LIMIT", "1M")]);
    w.ask("alloc 64");
    w.send("alloc 200000");
    let r = w.line();
    let e = r["error"].as_str().unwrap_or_default();
    assert!(e.contains("pinned memory"), "{r}");
    let c = w.ask("check quiet");
    assert_eq!(
        u(&c, "slots_used"),
        1,
        "the failed allocation holds nothing: {c}"
    );
    w.exit();
}

/// `softrdma heap bench --json` prints one line per size and process count
/// with the fields the issue names (a short run: figures are not checked
/// here, BENCHMARKS.md records them).
#[test]
fn bench_prints_its_json_lines() {
    let out = Command::new(SOFTRDMA)
        .args([
            "heap",
            "bench",
            "--json",
            "--sizes",
            "64,4096",
            "--processes",
            "1,2",
            "--secs",
            "0.05",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 4);
    for (v, (size, np)) in lines.iter().zip([(64, 1), (64, 2), (4096, 1), (4096, 2)]) {
        assert_eq!((u(v, "size"), u(v, "processes")), (size, np), "{v}");
        for k in ["cached_ns", "uncached_ns", "speedup"] {
            assert!(v[k].as_f64().is_some_and(|x| x > 0.0), "{k} in {v}");
        }
    }
}
