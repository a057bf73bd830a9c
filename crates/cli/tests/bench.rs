//! `softrdma bench --loopback` end to end: every test at small counts, the
//! JSON fields the issue asks for, the TCP baseline and its ratio, several
//! QPs, CRC, MPA revision 1, the idle-QP report and RFC 7306 atomics. Speed is not asserted here (BENCHMARKS.md records it).

use serde_json::Value;
use std::process::Command;

const SOFTRDMA: &str = env!("CARGO_BIN_EXE_softrdma");

fn bench(args: &[&str]) -> Vec<Value> {
    bench_env(args, &[])
}

fn bench_env(args: &[&str], env: &[(&str, &str)]) -> Vec<Value> {
    let out = Command::new(SOFTRDMA)
        .args(["bench", "--loopback", "--json"])
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run softrdma");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "softrdma bench {args:?} failed ({})\nstdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64()
        .unwrap_or_else(|| panic!("field {k} missing or not a number in {v}"))
}

fn check_line(v: &Value, test: &str, size: u64, iters: u64) {
    assert_eq!(v["test"], test, "{v}");
    // --loopback: both ends on this host, with extensions: Writes and Reads
    // go straight into the other process's memory.
    assert_eq!(v["transport"], "same-host", "{v}");
    assert_eq!(v["size"].as_u64(), Some(size), "{v}");
    assert_eq!(v["iters"].as_u64(), Some(iters), "{v}");
    assert!(f(v, "gbps") > 0.0, "{v}");
    assert!(f(v, "msg_rate") > 0.0, "{v}");
    let (p50, p99, max) = (f(v, "lat_us_p50"), f(v, "lat_us_p99"), f(v, "lat_us_max"));
    assert!(p50 > 0.0 && p50 <= p99 && p99 <= max, "{v}");
}

#[test]
fn bandwidth_tests_with_baseline() {
    for test in ["write_bw", "read_bw", "send_bw"] {
        let lines = bench(&[
            "--test",
            test,
            "--size",
            "2,4096,1M",
            "--iters",
            "300",
            "--baseline",
            "tcp",
        ]);
        assert_eq!(lines.len(), 3, "{lines:?}");
        for (v, size) in lines.iter().zip([2, 4096, 1 << 20]) {
            check_line(v, test, size, 300);
            let (g, b, r) = (f(v, "gbps"), f(v, "baseline_gbps"), f(v, "ratio"));
            assert!(b > 0.0, "{v}");
            assert!(
                (r - g / b).abs() < 0.01 * r.max(0.01) + 0.002,
                "ratio != gbps/baseline: {v}"
            );
        }
    }
}

/// `--baseline tcp,tcp-segments --repeat 3`: the pump written as the siw
/// framing writes (a message per MSS) beside the plain pump, each with its
/// ratio, and the plain pump's Gbit/s per run beside ours.
#[test]
fn segment_pump_baseline_and_baseline_runs() {
    let lines = bench(&[
        "--test",
        "write_bw",
        "--size",
        "1M",
        "--iters",
        "200",
        "--no-ext",
        "--repeat",
        "3",
        "--baseline",
        "tcp,tcp-segments",
    ]);
    assert_eq!(lines.len(), 1, "{lines:?}");
    let v = &lines[0];
    let (g, s, r) = (
        f(v, "gbps"),
        f(v, "tcp_segments_gbps"),
        f(v, "ratio_tcp_segments"),
    );
    assert!(s > 0.0, "{v}");
    assert!((r - g / s).abs() < 0.01 * r.max(0.01) + 0.002, "{v}");
    let runs = v["baseline_runs_gbps"].as_array().expect("baseline runs");
    assert_eq!(runs.len(), 3, "{v}");
    let b = f(v, "baseline_gbps");
    let mut sorted: Vec<f64> = runs.iter().map(|x| x.as_f64().unwrap()).collect();
    sorted.sort_by(f64::total_cmp);
    assert!((sorted[1] - b).abs() < 0.01 * b, "the median baseline: {v}");
    assert!(f(v, "baseline_runs_min_over_max") <= 1.0, "{v}");
}

#[test]
fn latency_tests_with_baseline() {
    for test in ["write_lat", "read_lat", "send_lat"] {
        let lines = bench(&[
            "--test",
            test,
            "--size",
            "8,65536",
            "--iters",
            "200",
            "--baseline",
            "tcp",
        ]);
        assert_eq!(lines.len(), 2, "{lines:?}");
        for (v, size) in lines.iter().zip([8, 65536]) {
            check_line(v, test, size, 200);
            assert!(f(v, "baseline_lat_us_p50") > 0.0, "{v}");
            assert!(f(v, "ratio") > 0.0, "{v}");
        }
    }
}

#[test]
fn busy_poll_latency_and_bandwidth() {
    for test in ["write_lat", "read_lat", "send_lat", "send_bw"] {
        let lines = bench(&[
            "--test",
            test,
            "--size",
            "8",
            "--iters",
            "300",
            "--busy-poll",
        ]);
        assert_eq!(lines[0]["busy_poll"], true);
        check_line(&lines[0], test, 8, 300);
    }
}

#[test]
fn several_qps_crc_and_mpa_rev1() {
    let lines = bench(&[
        "--test", "write_bw", "--size", "8", "--iters", "2000", "--qps", "4", "--depth", "32",
        "--crc",
    ]);
    check_line(&lines[0], "write_bw", 8, 2000);
    assert_eq!(lines[0]["qps"].as_u64(), Some(4));
    assert_eq!(lines[0]["crc"], true);
    let lines = bench(&[
        "--test",
        "send_bw",
        "--size",
        "65536",
        "--iters",
        "500",
        "--mpa-rev",
        "1",
    ]);
    check_line(&lines[0], "send_bw", 65536, 500);
    // --repeat: the median of three runs, still one line per size.
    let lines = bench(&[
        "--test",
        "write_lat",
        "--size",
        "8",
        "--iters",
        "100",
        "--repeat",
        "3",
        "--baseline",
        "tcp",
    ]);
    assert_eq!(lines.len(), 1);
    assert_eq!(lines[0]["repeat"].as_u64(), Some(3));
    check_line(&lines[0], "write_lat", 8, 100);
    // A --duration run reports however many messages fitted.
    let lines = bench(&["--test", "read_bw", "--size", "4096", "--duration", "0.3"]);
    assert!(lines[0]["iters"].as_u64().unwrap() > 0, "{}", lines[0]);
}

/// The same-host transport carries the Writes and Reads of write_bw and
/// read_bw; `--no-same-host` and `--no-ext` keep them on TCP.
#[test]
fn same_host_transport_and_opting_out() {
    for test in ["write_bw", "read_bw"] {
        let v = &bench(&["--test", test, "--size", "65536", "--iters", "500"])[0];
        assert_eq!(v["transport"], "same-host", "{v}");
        assert!(v["direct_ops"].as_u64().unwrap() >= 500, "{v}");
        assert_eq!(v["tcp_fallbacks"].as_u64(), Some(0), "{v}");
        for opt in ["--no-same-host", "--no-ext"] {
            let v = &bench(&["--test", test, "--size", "65536", "--iters", "500", opt])[0];
            assert_eq!(v["transport"], "iwarp-tcp", "{opt}: {v}");
            assert!(v.get("direct_ops").is_none(), "{opt}: {v}");
        }
        // The environment turns it off for every softrdma process (the
        // bench's server child inherits it).
        let args = ["--test", test, "--size", "65536", "--iters", "500"];
        let v = &bench_env(&args, &[("SOFTRDMA_SAME_HOST", "0")])[0];
        assert_eq!(v["transport"], "iwarp-tcp", "SOFTRDMA_SAME_HOST=0: {v}");
        let v = &bench_env(&args, &[("SOFTRDMA_SAME_HOST", "1")])[0];
        assert_eq!(v["transport"], "same-host", "SOFTRDMA_SAME_HOST=1: {v}");
    }
}

#[test]
fn idle_qps_report_memory() {
    let lines = bench(&["--test", "idle_qps", "--qps", "100", "--idle-secs", "0.5"]);
    let v = &lines[0];
    assert_eq!(v["qps"].as_u64(), Some(100), "{v}");
    let (c, s) = (f(v, "rss_client_mib"), f(v, "rss_server_mib"));
    assert!(c > 1.0 && s > 1.0, "{v}");
}

/// atomic_lat: RFC 7306 fetch-and-add round trips (the client checks that
/// every answer is the previous one plus one), with and without busy
/// polling; without softrdma's extensions there are no atomics, and the
/// error says so.
#[test]
fn atomic_lat() {
    for busy in [false, true] {
        let mut args = vec![
            "--test",
            "atomic_lat",
            "--iters",
            "300",
            "--baseline",
            "tcp",
        ];
        if busy {
            args.push("--busy-poll");
        }
        let lines = bench(&args);
        assert_eq!(lines.len(), 1, "{lines:?}");
        check_line(&lines[0], "atomic_lat", 8, 300);
        assert!(f(&lines[0], "baseline_lat_us_p50") > 0.0, "{}", lines[0]);
    }
    let out = Command::new(SOFTRDMA)
        .args(["bench", "--loopback", "--test", "atomic_lat", "--no-ext"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("RFC 7306") && err.contains("--no-ext"),
        "{err}"
    );
}

#[test]
fn plot_writes_an_svg() {
    let dir = std::env::temp_dir().join(format!("softrdma-bench-plot-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let svg = dir.join("bw.svg");
    let lines = bench(&[
        "--test",
        "write_bw",
        "--size",
        "1K,64K",
        "--iters",
        "200",
        "--baseline",
        "tcp",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert_eq!(lines.len(), 2);
    let text = std::fs::read_to_string(&svg).expect("SVG written");
    assert!(
        text.starts_with("<svg") && text.contains("raw TCP"),
        "{}",
        &text[..200.min(text.len())]
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// `--baseline ucx` runs Debian's ucx_perftest (installed by
/// scripts/setup.sh) in the same invocation; missing, the test fails.
#[test]
fn ucx_baseline() {
    for (test, size) in [("write_bw", "8"), ("write_lat", "8")] {
        let lines = bench(&[
            "--test",
            test,
            "--size",
            size,
            "--iters",
            "2000",
            "--baseline",
            "tcp,ucx",
        ]);
        let v = &lines[0];
        assert_eq!(v["ucx_tls"], "tcp", "{v}");
        assert!(f(v, "ucx_msg_rate") > 0.0, "{v}");
        assert!(f(v, "ucx_ratio") > 0.0, "{v}");
        assert!(f(v, "ratio") > 0.0, "{v}");
    }
}
