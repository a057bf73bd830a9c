//! `softrdma store bench --json` end to end, shortened: its own store group
//! and a Redis primary + replica, one point (100-byte values, one client,
//! 0.5 s per op). Every output line must be a JSON object with positive
//! rates for the store and for Redis (and, for writes, Redis SET+WAIT). Redis is required (installed by
//! scripts/setup.sh); without it the test fails.

use std::process::Command;
use std::time::{Duration, Instant};

const SOFTRDMA: &str = env!("CARGO_BIN_EXE_softrdma");

#[test]
fn bench_json_one_point() {
    let t = Instant::now();
    let out = Command::new(SOFTRDMA)
        .args([
            "store",
            "bench",
            "--json",
            "--sizes",
            "100",
            "--clients",
            "1",
        ])
        .args(["--secs", "0.5"])
        .output()
        .expect("run softrdma");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "softrdma store bench failed ({}); if redis-server/redis-benchmark are missing, \
         run scripts/setup.sh\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let lines: Vec<&str> = stdout.lines().filter(|l| !l.trim().is_empty()).collect();
    let ops: Vec<String> = lines
        .iter()
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l)
                .unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}\nstderr:\n{stderr}"));
            for f in ["ops_per_s", "redis_ops_per_s", "ratio", "p50_us", "p99_us"] {
                let x = v[f].as_f64().unwrap_or_else(|| panic!("no {f}: {l}"));
                if f.ends_with("ops_per_s") {
                    assert!(x > 0.0, "{f} must be positive: {l}");
                }
            }
            assert_eq!(v["value_size"], 100, "{l}");
            assert_eq!(v["clients"], 1, "{l}");
            assert!(v["meets_target"].is_boolean(), "{l}");
            // CPU beside every rate: the clients' process and both nodes
            // (fractions of one core; the clients never idle).
            for f in ["cpu_client", "cpu_primary", "cpu_secondary"] {
                let x = v[f].as_f64().unwrap_or_else(|| panic!("no {f}: {l}"));
                assert!((0.0..=16.0).contains(&x), "{f} out of range: {l}");
            }
            assert!(v["cpu_client"].as_f64().unwrap() > 0.0, "{l}");
            // Writes also stand beside Redis's replicated write (SET then
            // WAIT 1 0); reads have no such baseline.
            let wait = v["redis_set_wait_ops_per_s"].as_f64();
            let op = v["op"].as_str().unwrap_or_default();
            if op.starts_with("read") || op.starts_with("get") {
                assert!(wait.is_none(), "{l}");
                // Every read one-sided (nothing was torn or missing).
                assert!(v["one_sided_reads"].as_u64() == v["ops"].as_u64(), "{l}");
                let redis = if op == "read_many" { "GET-P16" } else { "GET" };
                assert_eq!(v["redis_op"], redis, "{l}");
                if op.starts_with("get") {
                    // Keyed: every get a one-sided look-up, none sent to
                    // the node; cached ones cost one Read.
                    assert_eq!(v["keyed_one_sided"], v["ops"], "{l}");
                    assert_eq!(v["keyed_fallbacks"], 0, "{l}");
                    let hits = v["cache_hits"].as_u64().unwrap();
                    let ops = v["ops"].as_u64().unwrap();
                    if op == "get" {
                        assert!(hits * 10 >= ops * 9, "{l}");
                    } else {
                        assert_eq!(hits, 0, "{l}");
                    }
                }
            } else if op == "resp_get" {
                assert_eq!(v["redis_op"], "GET", "{l}");
                // The door's GET aims at Redis's rate on one host too, not
                // at the one-sided reads' twice (issue 32).
                assert_eq!(v["target"], 1.0, "{l}");
            } else if op == "resp_mset" {
                // Redis's MSET of ten keys beside it.
                assert_eq!(v["redis_op"], "MSET", "{l}");
                assert!(v["ops_per_s"].as_f64().unwrap() > 0.0, "{l}");
            } else if op == "resp_incr" {
                // Redis's INCR beside it, and its SET+WAIT.
                assert_eq!(v["redis_op"], "INCR", "{l}");
                assert!(v["ops_per_s"].as_f64().unwrap() > 0.0, "{l}");
            } else {
                assert!(wait.is_some_and(|x| x > 0.0), "no SET+WAIT rate: {l}");
                assert!(v["ratio_set_wait"].as_f64().is_some(), "{l}");
                let p50 = v["redis_set_wait_p50_us"].as_f64().expect("SET+WAIT p50");
                assert!(p50 > 0.0, "{l}");
                for f in ["redis_set_wait_cpu_client", "redis_set_wait_cpu_server"] {
                    let x = v[f].as_f64().unwrap_or_else(|| panic!("no {f}: {l}"));
                    assert!(x > 0.0 && x <= 16.0, "{f} out of range: {l}");
                }
            }
            if op == "resp_get" || op == "resp_set" {
                // The alternating rounds: a ratio per round, and beside
                // each its two rates, their p99 and the servers' CPU.
                let ratios = v["ratio_rounds"].as_array().expect("ratio_rounds");
                let each = v["rounds_detail"].as_array().expect("rounds_detail");
                assert!(!ratios.is_empty() && each.len() == ratios.len(), "{l}");
                for r in each {
                    for f in ["ops_per_s", "redis_ops_per_s", "p99_us", "redis_p99_us"] {
                        let x = r[f].as_f64().unwrap_or_else(|| panic!("no {f}: {l}"));
                        assert!(x > 0.0, "{f}: {l}");
                    }
                    for f in ["cpu_primary", "cpu_secondary", "redis_cpu_server"] {
                        let x = r[f].as_f64().unwrap_or_else(|| panic!("no {f}: {l}"));
                        assert!((0.0..=16.0).contains(&x), "{f} out of range: {l}");
                    }
                }
            }
            v["op"].as_str().expect("op").to_string()
        })
        .collect();
    assert_eq!(
        ops,
        [
            "insert",
            "update",
            "read",
            "read_many",
            "put",
            "get",
            "get_uncached",
            "resp_set",
            "resp_get",
            "resp_incr",
            "resp_mset"
        ],
        "stdout:\n{stdout}"
    );
    assert!(
        t.elapsed() < Duration::from_secs(60),
        "the shortened bench took {:?}",
        t.elapsed()
    );
}

/// `softrdma store bench-large --json`, shortened (1 MiB, 0.3 s per row):
/// the store's put and get and both TCP pumps, each with a positive rate,
/// p99 and CPU; the store's rows name their baseline and the ratio to it.
#[test]
fn bench_large_json_one_size() {
    let out = Command::new(SOFTRDMA)
        .args(["store", "bench-large", "--json", "--sizes", "1048576"])
        .args(["--secs", "0.3"])
        .output()
        .expect("run softrdma");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench-large failed ({})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect();
    let ops: Vec<&str> = rows.iter().map(|v| v["op"].as_str().unwrap()).collect();
    assert_eq!(ops, ["put", "get", "tcp_relay", "tcp_hop"], "{stdout}");
    for v in &rows {
        assert_eq!(v["size"], 1048576, "{v}");
        for f in ["ops_per_s", "p99_us"] {
            let x = v[f].as_f64().unwrap_or_else(|| panic!("no {f}: {v}"));
            assert!(x > 0.0, "{f} must be positive: {v}");
        }
        // CPU is counted in 10 ms ticks: over 0.3 s on a loaded machine a
        // client that mostly waits may be charged none, so the figure is
        // only checked to be a share of this machine's cores.
        let cpu = v["cpu_client"]
            .as_f64()
            .unwrap_or_else(|| panic!("no cpu_client: {v}"));
        let cores = std::thread::available_parallelism().map_or(64, |n| n.get()) as f64;
        assert!((0.0..=cores).contains(&cpu), "cpu_client out of range: {v}");
    }
    for (v, base) in rows[..2].iter().zip(["tcp_relay", "tcp_hop"]) {
        assert_eq!(v["baseline"], base, "{v}");
        assert!(v["ratio"].as_f64().is_some_and(|r| r > 0.0), "{v}");
        for f in ["cpu_primary", "cpu_secondary"] {
            assert!(v[f].as_f64().is_some(), "no {f}: {v}");
        }
    }
}
