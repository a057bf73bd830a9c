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
//!   reused is refused by A's engine (the descriptor's block id no longer
//!   matches), for RDMA Writes and Reads, slab and huge (multi-unit)
//!   blocks, over TCP and over the same-host path: B's bytes stay
//!   untouched, and a refused Read brings none of them.
//! * `a_wrapped_block_id_grants_no_remote_access`: the same after the
//!   descriptor's id went round to the stale registration's id (or its low
//!   32 bits) again.
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

/// How a remote peer uses a stale rkey in [`stale_rkey_case`].
#[derive(Debug, Clone, Copy, PartialEq)]
enum Access {
    Write,
    Read,
}

/// One run of the stale-rkey scenario: R (the remote peer) holds A's rkey
/// for the block of a buffer that C allocated (a 1000-byte slab slot, or
/// with `huge` a 1.5 MiB allocation: a block of two units, addressed in its
/// second unit, which look-up finds through the unit map). C frees it and
/// releases the block (with `SOFTRDMA_HEAP_ID_STEP=id_step`: as if it had
/// been released that many times, see the wrap test); B then allocates
/// every free unit (its first block under C's old descriptor, the head of
/// the free list) and fills them with 34. R's Write or Read through the
/// old rkey must be refused: B's bytes stay 34, and a Read brings none of
/// them into R's buffer (filled with 51).
fn stale_rkey_case(same_host: bool, access: Access, huge: bool, id_step: u64) {
    let what = format!("same_host {same_host}, {access:?}, huge {huge}, id step {id_step}");
    let name = format!(
        "stale-{}-{}-{:?}-{}-{id_step}",
        std::process::id(),
        same_host,
        access,
        huge
    );
    // 1 MiB units: R's two blocks (its buffer, the 64-byte scratch of the
    // flush Read), C's block (one or two units), the rest B's.
    let _u = create(&name, 1 << 20, 8);
    let step = id_step.to_string();
    let mut r = Worker::start(&name, same_host, &[]);
    let mut a = Worker::start(&name, same_host, &[]);
    let mut b = Worker::start(&name, same_host, &[]);
    let mut c = Worker::start(&name, same_host, &[("SOFTRDMA_HEAP_ID_STEP", &step)]);
    let src = r.ask("alloc 1000");
    let sid = u(&src, "id");
    r.ask(&format!("fill {sid} 51"));
    let port = u(&a.ask("listen"), "port");
    let conn = r.ask(&format!("connect {port}"));
    assert_eq!(conn["same_host"], same_host, "{what}: {conn}");
    // C allocates; A looks up 1000 bytes of it (registering C's block in
    // A) and hands out its own (addr, rkey).
    let x = c.ask(if huge { "alloc 1572864" } else { "alloc 1000" });
    let xid = u(&x, "id");
    c.ask(&format!("fill {xid} 17"));
    let within = if huge { (1 << 20) + 8192 } else { 0 };
    let k = a.ask(&format!("lookup {} 1000", u(&x, "offset") + within));
    assert_eq!(u(&k, "block"), u(&x, "block"), "{what}: {k} vs {x}");
    let (addr, rkey) = (u(&k, "addr"), u(&k, "rkey"));
    // While C's buffer lives, the peer's access works: a Write lands in C's
    // buffer, a Read brings C's bytes.
    match access {
        Access::Write => {
            let w = r.ask(&format!("write {sid} {addr} {rkey}"));
            assert_eq!(w["ok"], true, "{what}: {w}");
            let v = c.ask(&format!("verify {xid} 51 {within} 1000"));
            assert_eq!(v["ok"], true, "{what}: {v}");
        }
        Access::Read => {
            let rd = r.ask(&format!("read {sid} {addr} {rkey}"));
            assert_eq!(rd["ok"], true, "{what}: {rd}");
            let v = r.ask(&format!("verify {sid} 17"));
            assert_eq!(v["ok"], true, "{what}: {v}");
            r.ask(&format!("fill {sid} 51"));
        }
    }
    // C frees the buffer and releases its block (a huge block goes with
    // its one allocation, a slab block at the trim); B's allocations take
    // every free unit, C's old ones included.
    c.ask(&format!("free {xid}"));
    c.ask("trim");
    let st = c.ask("stats");
    assert_eq!(u(&st, "blocks_released"), 1, "{what}: {st}");
    let mut bbufs = Vec::new();
    loop {
        b.send("alloc 600000");
        let y = b.line();
        if let Some(e) = y.get("error") {
            let e = e.as_str().unwrap_or_default();
            assert!(
                e.contains("no room") || e.contains("table full"),
                "{what}: {y}"
            );
            break;
        }
        b.ask(&format!("fill {} 34", u(&y, "id")));
        bbufs.push(y);
    }
    assert_eq!(
        u(&bbufs[0], "block"),
        u(&x, "block"),
        "{what}: B's first block reuses C's descriptor"
    );
    let old = u(&x, "offset") >> 20;
    let old_units = if huge { old..old + 2 } else { old..old + 1 };
    for unit in old_units {
        assert!(
            bbufs.iter().any(|y| u(y, "offset") >> 20 == unit),
            "{what}: B reused unit {unit}: {bbufs:?} vs {x}"
        );
    }
    // A still holds its registration (nobody told it), but the peer's
    // access through the old rkey is refused.
    match access {
        Access::Write => {
            // The flush Read after the Write fails with the connection.
            let w = r.ask(&format!("write {sid} {addr} {rkey}"));
            assert_eq!(w["ok"], false, "{what}: a stale Write was let through: {w}");
        }
        Access::Read => {
            let rd = r.ask(&format!("read {sid} {addr} {rkey}"));
            assert_eq!(
                rd["ok"], false,
                "{what}: a stale Read was let through: {rd}"
            );
            let v = r.ask(&format!("verify {sid} 51"));
            assert_eq!(
                v["ok"], true,
                "{what}: the refused Read brought the new owner's bytes: {v}"
            );
        }
    }
    for y in &bbufs {
        let v = b.ask(&format!("verify {} 34", u(y, "id")));
        assert_eq!(v["ok"], true, "{what}: B's bytes: {v}");
    }
    let held = a.ask("stats");
    assert_eq!(
        u(&held, "held"),
        1,
        "{what}: A kept the stale registration: {held}"
    );
    r.kill();
    a.kill();
    b.kill();
    c.kill();
}

#[test]
fn a_stale_rkey_grants_no_remote_access() {
    for same_host in [false, true] {
        for access in [Access::Write, Access::Read] {
            for huge in [false, true] {
                stale_rkey_case(same_host, access, huge, 1);
            }
        }
    }
}

/// Block ids are per descriptor and count up at each release. A release
/// that brings the descriptor's id back to the value a stale registration
/// was made at (the hook `SOFTRDMA_HEAP_ID_STEP` stands for the releases
/// in between) must not make that registration valid again: with 2^32 - 1
/// steps a 32-bit id (which skips 0) is back where it was; with 2^32 its
/// low 32 bits are.
#[test]
fn a_wrapped_block_id_grants_no_remote_access() {
    for same_host in [false, true] {
        for (access, id_step) in [
            (Access::Write, (1u64 << 32) - 1),
            (Access::Read, (1 << 32) - 1),
            (Access::Write, 1 << 32),
            (Access::Read, 1 << 32),
        ] {
            stale_rkey_case(same_host, access, false, id_step);
        }
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
