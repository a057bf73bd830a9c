//! Issue 32: the store's RESP door across a failover. The cluster
//! protocol (`CLUSTER SLOTS|SHARDS|NODES|...` name the primary and the
//! secondary on both nodes, a secondary redirects writes with `-MOVED`,
//! and after the primary is killed both the topology and the redirect
//! name the new primary); unmodified client libraries (redis-py, ioredis)
//! running a small application across a `kill -9` of the primary; keys
//! that expire on time on both nodes and across a failover.

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::resp::{parse, Conn, V};
use common::store::{wait_for, Group};

// ----------------------------------------------------- cluster protocol

/// `CLUSTER SLOTS` of the node at `port`: (primary port, replica ports).
fn slots_of(port: u16) -> Option<(i64, Vec<i64>)> {
    let mut c = Conn::new(port);
    c.cmd(&format!("AUTH {}", common::STORE_SECRET));
    let V::Array(ranges) = parse(&c.cmd("CLUSTER SLOTS")).unwrap().0 else {
        panic!("CLUSTER SLOTS is not an array");
    };
    let V::Array(r) = ranges.first()? else {
        panic!("a range is not an array");
    };
    assert_eq!(r[0], V::Int(0));
    assert_eq!(r[1], V::Int(16383));
    let port_of = |n: &V| match n {
        V::Array(f) => match f[1] {
            V::Int(p) => p,
            _ => panic!("port"),
        },
        _ => panic!("node"),
    };
    Some((port_of(&r[2]), r[3..].iter().map(port_of).collect()))
}

#[test]
fn cluster_topology_names_the_primary_and_follows_a_failover() {
    // A primary left alone keeps taking writes (under the default, it
    // would refuse them until a secondary is back in sync).
    let mut g = Group::with_options(
        "cluster",
        "16MiB",
        None,
        "min_in_sync_replicas = 0",
        true,
        "",
    );
    let p = g.primary() as usize - 1;
    let (pp, sp) = (g.resp[p] as i64, g.resp[1 - p] as i64);
    // Both nodes name the primary first and the secondary after it.
    for port in [pp, sp] {
        assert_eq!(slots_of(port as u16), Some((pp, vec![sp])), "node {port}");
    }
    let mut c = Conn::new(sp as u16);
    c.cmd(&format!("AUTH {}", common::STORE_SECRET));
    // MYID, NODES, SHARDS and INFO agree with each other.
    let V::Bulk(myid) = parse(&c.cmd("CLUSTER MYID")).unwrap().0 else {
        panic!("MYID")
    };
    let myid = String::from_utf8(myid).unwrap();
    assert_eq!(myid.len(), 40);
    let V::Bulk(nodes) = parse(&c.cmd("CLUSTER NODES")).unwrap().0 else {
        panic!("NODES")
    };
    let nodes = String::from_utf8(nodes).unwrap();
    let mine = nodes.lines().find(|l| l.contains("myself")).unwrap();
    assert!(mine.starts_with(&myid), "{nodes}");
    assert!(mine.contains("myself,slave "), "{nodes}");
    let master = nodes.lines().find(|l| l.contains(" master ")).unwrap();
    assert!(master.contains(&format!(":{pp}@")), "{nodes}");
    assert!(master.ends_with(" connected 0-16383"), "{nodes}");
    assert!(mine.contains(master.split(' ').next().unwrap()), "{nodes}");
    let V::Bulk(info) = parse(&c.cmd("CLUSTER INFO")).unwrap().0 else {
        panic!("INFO")
    };
    let info = String::from_utf8(info).unwrap();
    assert!(info.starts_with("cluster_state:ok\r\n"), "{info}");
    assert!(info.contains("cluster_known_nodes:2\r\n"), "{info}");
    assert!(
        String::from_utf8(c.cmd("INFO cluster"))
            .unwrap()
            .contains("cluster_enabled:1"),
        "INFO cluster"
    );
    assert_eq!(c.cmd("CLUSTER KEYSLOT foo"), b":12182\r\n");
    assert_eq!(c.cmd("READONLY"), b"+OK\r\n");
    c.cmd("HELLO 3");
    let shards = parse(&c.cmd("CLUSTER SHARDS")).unwrap().0;
    let text = format!("{shards:?}");
    assert!(
        text.starts_with("Array([Map([(Bulk([115, 108, 111, 116, 115])"),
        "{text}"
    );
    // A write to the secondary is redirected to the primary.
    let moved = String::from_utf8(c.cmd("SET foo bar")).unwrap();
    assert_eq!(moved, format!("-MOVED 12182 127.0.0.1:{pp}\r\n"));
    // The primary dies. A write sent to the secondary at once is either
    // redirected to the old primary (while the secondary still thinks it
    // alive: a client follows, fails to connect, asks again) or waits for
    // the new primary and is served; never an error.
    g.nodes[p].kill();
    let t0 = Instant::now();
    let mut moved = 0;
    let mut slowest = Duration::ZERO;
    loop {
        let t = Instant::now();
        let r = String::from_utf8(c.cmd("SET foo baz")).unwrap();
        slowest = slowest.max(t.elapsed());
        if r == "+OK\r\n" {
            break;
        }
        assert!(
            r.starts_with("-MOVED 12182 "),
            "a write during the failover: {r}"
        );
        moved += 1;
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no new primary: {r}"
        );
    }
    eprintln!(
        "a write sent at the kill was served after {:?} ({moved} redirects to the dead primary \
         first; the slowest answer took {slowest:?})",
        t0.elapsed()
    );
    // Within a lease its topology names itself.
    let (_, took) = wait_for(
        "the secondary names itself",
        Duration::from_secs(10),
        || match slots_of(sp as u16) {
            Some((m, _)) if m == sp => Ok(()),
            s => Err(format!("{s:?}")),
        },
    );
    eprintln!("topology named the new primary {took:?} after the write");
    assert_eq!(c.cmd("GET foo"), b"$3\r\nbaz\r\n");
    let role = parse(&c.cmd("ROLE")).unwrap().0;
    assert!(
        matches!(&role, V::Array(r) if r[0] == V::Bulk(b"master".to_vec())),
        "{role:?}"
    );
}

// ------------------------------------------------ unmodified client libraries

/// The Python with redis-py that `scripts/setup.sh` installs.
fn python() -> String {
    std::env::var("SOFTRDMA_PYTHON").unwrap_or_else(|_| "/opt/softrdma-py/bin/python".into())
}

/// Where `scripts/setup.sh` installs ioredis.
fn node_modules() -> String {
    std::env::var("SOFTRDMA_NODE_MODULES")
        .unwrap_or_else(|_| "/opt/softrdma-node/node_modules".into())
}

/// Acknowledged writes after which [`run_app`] kills the primary, or a
/// third of the application's time, whichever comes first (a loaded
/// machine, CI beside a CPU hog, once reached only 1,832 writes in 6 s).
const KILL_AT: u64 = 3000;

/// What each application must have seen (more than each): it goes on past
/// its time until it has, up to ten times as long (`kv_app.py`): a
/// minimum over a fixed time failed beside CI's CPU hog (ioredis at 330
/// operations/s: 966 increments, 1,934 writes in 6 s).
const MINIMUM: [(&str, u64); 5] = [
    // It went on writing after the failover.
    ("acked", KILL_AT),
    ("increments", 1000),
    ("transfers", 500),
    ("short_sessions", 100),
    ("sessions", 50),
];

/// Runs `kv_app.py MODE` (`kv_app.js` for `ioredis`) against the group, kills the primary with
/// SIGKILL once the application has [`KILL_AT`] acknowledged writes (or a third of its time), restarts it
/// (it rejoins as the secondary); returns the application's summary.
fn run_app(g: &mut Group, mode: &str, secs: f64) -> serde_json::Value {
    use std::io::{BufRead, BufReader};
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/redis_clients");
    let ports = format!("{},{}", g.resp[0], g.resp[1]);
    let minimum = serde_json::Value::from_iter(
        MINIMUM
            .iter()
            .map(|&(k, v)| (k.to_string(), serde_json::Value::from(v))),
    )
    .to_string();
    let (prog, mut cmd) = match mode {
        "ioredis" => {
            let modules = node_modules();
            assert!(
                std::path::Path::new(&modules).join("ioredis").exists(),
                "{modules}/ioredis not found: scripts/setup.sh installs ioredis there"
            );
            let mut c = Command::new("node");
            c.env("NODE_PATH", &modules)
                .arg(format!("{dir}/kv_app.js"))
                .args([&ports, &secs.to_string(), &minimum]);
            ("node".to_string(), c)
        }
        _ => {
            let py = python();
            assert!(
                std::path::Path::new(&py).exists() || std::env::var("SOFTRDMA_PYTHON").is_ok(),
                "{py} not found: scripts/setup.sh installs redis-py there"
            );
            let mut c = Command::new(&py);
            c.arg(format!("{dir}/kv_app.py"))
                .args([mode, &ports, &secs.to_string(), &minimum]);
            (py, c)
        }
    };
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("{prog}: {e}"));
    // The password on stdin, not in the command line.
    writeln!(child.stdin.take().unwrap(), "{}", common::STORE_SECRET).unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut killed = false;
    let mut summary = None;
    for l in lines.by_ref() {
        let l = l.unwrap();
        let v: serde_json::Value =
            serde_json::from_str(&l).unwrap_or_else(|_| panic!("app said: {l}"));
        let due = v["acked"].as_u64().unwrap_or(0) >= KILL_AT
            || v["t"].as_f64().unwrap_or(0.0) >= secs / 3.0;
        if v["type"] == "progress" && !killed && due {
            let p = g.primary() as usize - 1;
            let before = g.epoch();
            eprintln!("{mode}: SIGKILL to the primary (node {}) at {l}", p + 1);
            g.nodes[p].kill();
            g.nodes[p].start("secondary");
            g.wait_redundant(Duration::from_secs(30), before);
            killed = true;
        }
        if v["type"] == "summary" {
            summary = Some(v);
        }
    }
    let st = child.wait().unwrap();
    let s = summary.unwrap_or_else(|| panic!("{mode}: no summary ({st})"));
    eprintln!("{mode}: {s}");
    assert!(killed, "{mode}: the application ended before the kill: {s}");
    assert!(st.success(), "{mode}: the application failed ({st}): {s}");
    s
}

#[test]
fn client_library_applications_lose_no_acknowledged_write_across_a_primary_kill() {
    // Each: keys, counters, MULTI transfers and sessions with TTLs.
    // redis-py's RedisCluster, redis-py's plain Redis (failing over by
    // hand), ioredis's Cluster.
    for mode in ["cluster", "plain", "ioredis"] {
        let mut g = Group::with_resp(&format!("py{mode}"), "16MiB");
        let s = run_app(&mut g, mode, 6.0);
        assert_eq!(s["lost"], 0, "{mode}: {s}");
        assert_eq!(s["counters_off"], serde_json::json!([]), "{mode}: {s}");
        assert_eq!(s["transfers_off"], serde_json::json!([]), "{mode}: {s}");
        // At most the one command in flight at the kill applied twice (the
        // library sent it again: at-least-once, as against Redis).
        assert!(s["retried"].as_u64().unwrap() <= 1, "{mode}: {s}");
        // Sessions with TTLs: the long ones kept, the short ones read back
        // at once and gone after their deadline, across the failover.
        assert_eq!(s["sessions_off"], serde_json::json!([]), "{mode}: {s}");
        assert_eq!(s["early"], 0, "{mode}: {s}");
        for (k, v) in MINIMUM {
            assert!(s[k].as_u64().unwrap() > v, "{mode}: {k}: {s}");
        }
        if mode == "plain" {
            // redis-py asked for RESP3 (HELLO 3) and got it.
            assert_eq!(s["proto"], 3, "{s}");
        }
    }
}

/// Issue 32 (expiry): a key set with `PX` reads back on both nodes until
/// [`CLOCK_BOUND`] before its deadline and is gone after it, never early;
/// across a `kill -9` of the primary the new primary neither brings back
/// a key that expired nor drops a live one before its deadline.
#[test]
fn keys_expire_on_time_on_both_nodes_and_across_a_failover() {
    // The readers' allowance for clock lag (`lookup::CLOCK_BOUND_MS`),
    // and 2 ms for the clocks' whole milliseconds (the deadline and the
    // reader's time are each truncated).
    const CLOCK_BOUND: Duration = Duration::from_millis(102);
    // The new primary goes on alone (it takes writes without a secondary).
    let mut g = Group::with_options(
        "expiry",
        "16MiB",
        None,
        "min_in_sync_replicas = 0",
        true,
        "",
    );
    let p = g.primary() as usize - 1;
    let conn = |port: u16| {
        let mut c = Conn::new(port);
        c.cmd(&format!("AUTH {}", common::STORE_SECRET));
        c
    };
    let (mut cp, mut cs) = (conn(g.resp[p]), conn(g.resp[1 - p]));
    // When `key` first reads absent through `c`, polled from `t0`.
    let gone_after = |c: &mut Conn, key: &str, t0: Instant, limit: Duration| loop {
        match c.cmd(&format!("GET {key}")).as_slice() {
            b"$-1\r\n" | b"_\r\n" => return t0.elapsed(),
            b"$1\r\nv\r\n" => {}
            r => panic!("GET {key}: {}", String::from_utf8_lossy(r)),
        }
        assert!(t0.elapsed() < limit, "{key} did not expire");
        std::thread::sleep(Duration::from_millis(5));
    };
    let t0 = Instant::now();
    assert_eq!(cp.cmd("SET short v PX 700"), b"+OK\r\n");
    let acked = t0.elapsed();
    for c in [&mut cp, &mut cs] {
        let ttl = String::from_utf8(c.cmd("PTTL short")).unwrap();
        let ms: i64 = ttl.trim_start_matches(':').trim().parse().unwrap();
        assert!((1..=700).contains(&ms), "PTTL {ms}");
    }
    let on_primary = gone_after(&mut cp, "short", t0, Duration::from_secs(10));
    let on_secondary = gone_after(&mut cs, "short", t0, Duration::from_secs(10));
    eprintln!(
        "PX 700 (acknowledged after {acked:?}): gone on the primary after {on_primary:?}, \
         on the secondary after {on_secondary:?}"
    );
    for t in [on_primary, on_secondary] {
        assert!(
            t >= Duration::from_millis(700) - CLOCK_BOUND,
            "early: {t:?}"
        );
        assert!(t < acked + Duration::from_millis(700 + 1000), "late: {t:?}");
    }
    assert_eq!(cp.cmd("EXISTS short"), b":0\r\n");
    assert_eq!(cp.cmd("TTL short"), b":-2\r\n");
    // Across a failover: one key expired before the kill, one lives on.
    let t2 = Instant::now();
    assert_eq!(cp.cmd("SET long v PX 8000"), b"+OK\r\n");
    assert_eq!(cp.cmd("SET gone v PX 300"), b"+OK\r\n");
    gone_after(&mut cp, "gone", t2, Duration::from_secs(5));
    g.nodes[p].kill();
    // The new primary takes writes.
    let (_, took) = wait_for("a new primary", Duration::from_secs(10), || {
        match cs.cmd("SET probe x").as_slice() {
            b"+OK\r\n" => Ok(()),
            r => Err(String::from_utf8_lossy(r).into_owned()),
        }
    });
    eprintln!("the secondary took writes {took:?} after the kill");
    assert_eq!(cs.cmd("GET gone"), b"$-1\r\n", "an expired key came back");
    let seen = t2.elapsed();
    assert!(
        seen < Duration::from_millis(8000) - CLOCK_BOUND,
        "the failover took too long to check the live key ({seen:?})"
    );
    assert_eq!(
        cs.cmd("GET long"),
        b"$1\r\nv\r\n",
        "a live key expired early"
    );
    let left: i64 = String::from_utf8(cs.cmd("PTTL long"))
        .unwrap()
        .trim_start_matches(':')
        .trim()
        .parse()
        .unwrap();
    assert!((1..=8000).contains(&left), "PTTL {left}");
    let t = gone_after(&mut cs, "long", t2, Duration::from_secs(20));
    eprintln!("PX 8000 across the failover: gone after {t:?}");
    assert!(
        t >= Duration::from_millis(8000) - CLOCK_BOUND,
        "early: {t:?}"
    );
}
