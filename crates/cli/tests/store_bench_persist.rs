//! `softrdma store bench-persist --json` end to end, shortened: a group
//! persisting under each policy against Redis with one replica and AOF,
//! and fio's fdatasync rate (Redis and fio are installed by
//! scripts/setup.sh; without them the test fails). Every round must have
//! positive rates for both sides, a p99, the nodes' CPU, and fio's rate;
//! the speed targets themselves are the benchmark's to show, not this
//! test's.

use std::process::Command;

const SOFTRDMA: &str = env!("CARGO_BIN_EXE_softrdma");

/// Runs `softrdma store <args>`, which must succeed, and returns its
/// stdout's JSON lines.
fn json_rows(args: &[&str], env: &[(&str, &str)]) -> Vec<serde_json::Value> {
    let out = Command::new(SOFTRDMA)
        .arg("store")
        .args(args)
        .envs(env.iter().copied())
        .output()
        .expect("run softrdma");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "softrdma store {} failed ({}); if redis or fio is missing, run \
         scripts/setup.sh\nstdout:\n{stdout}\nstderr:\n{stderr}",
        args.join(" "),
        out.status
    );
    stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

#[test]
fn bench_persist_json_rounds() {
    let rows = json_rows(
        &[
            "bench-persist",
            "--json",
            "--arena",
            "16MiB",
            "--secs",
            "0.5",
            "--rounds",
            "2",
            "--clients",
            "4",
        ],
        &[("SOFTRDMA_SAME_HOST", "0")],
    );
    assert_eq!(rows.len(), 4, "{rows:?}");
    for (i, v) in rows.iter().enumerate() {
        let f = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("no {k}: {v}"));
        assert_eq!(
            v["policy"],
            if i < 2 { "always" } else { "everysec" },
            "{v}"
        );
        assert!(f("ops_per_s") > 0.0 && f("redis_ops_per_s") > 0.0, "{v}");
        assert!(f("p99_us") > 0.0 && f("redis_p99_us") > 0.0, "{v}");
        assert!(f("cpu_primary") > 0.0 && f("cpu_secondary") > 0.0, "{v}");
        assert!(f("fio_fdatasync_per_s") > 0.0, "{v}");
    }
}

/// `--policies off`: the baseline without a log, against Redis without
/// AOF; no fio (the device's flush rate is no limit there).
#[test]
fn bench_persist_off_baseline() {
    let work = std::env::temp_dir().join(format!("softrdma-bp-off-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let rows = json_rows(
        &[
            "bench-persist",
            "--json",
            "--arena",
            "16MiB",
            "--policies",
            "off",
            "--secs",
            "0.5",
            "--rounds",
            "1",
            "--clients",
            "4",
            "--workdir",
            &work.to_string_lossy(),
        ],
        &[("SOFTRDMA_SAME_HOST", "0")],
    );
    assert_eq!(rows.len(), 1, "{rows:?}");
    let v = &rows[0];
    let f = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("no {k}: {v}"));
    assert_eq!(v["policy"], "off", "{v}");
    assert!(f("ops_per_s") > 0.0 && f("redis_ops_per_s") > 0.0, "{v}");
    assert!(f("p99_us") > 0.0 && f("redis_p99_us") > 0.0, "{v}");
    assert!(v.get("fio_fdatasync_per_s").is_none(), "{v}");
    // The group logged nothing: no store file beside its nodes' files.
    let dir = work.join("off");
    let names: Vec<String> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.is_empty(), "{names:?}");
    assert!(!names.iter().any(|n| n.ends_with(".store")), "{names:?}");
    let _ = std::fs::remove_dir_all(&work);
}

/// `softrdma store bench-recovery --json`, shortened (a 16 MiB arena half
/// filled): the group recovers every write it held (the bench checks the
/// primary's applied write), and the row has the recovery time and rate,
/// fio's read bandwidth with its p99 and CPU, their ratio, and each
/// node's CPU from its start to serving.
#[test]
fn bench_recovery_json_row() {
    let rows = json_rows(
        &[
            "bench-recovery",
            "--json",
            "--arena",
            "16MiB",
            "--fill",
            "0.5",
            "--threads",
            "2",
        ],
        &[],
    );
    assert_eq!(rows.len(), 1, "one JSON row: {rows:?}");
    let v = &rows[0];
    let f = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("no {k}: {v}"));
    assert!(
        f("values") > 0.0 && f("allocated") >= 8.0 * (1 << 20) as f64 * 0.9,
        "{v}"
    );
    assert!(
        f("recovery_s") > 0.0 && f("recovery_mib_per_s") > 0.0,
        "{v}"
    );
    assert!(
        f("fio_read_mib_per_s") > 0.0 && f("fio_p99_us") > 0.0,
        "{v}"
    );
    assert!(f("ratio") > 0.0, "{v}");
    let cpu = v["node_cpu"].as_array().expect("node_cpu");
    assert_eq!(cpu.len(), 2, "{v}");
    // Read from each node's /proc stat (null, which fails here, if it
    // could not be): no more than the machine's cores (a 16 MiB recovery may take less than the
    // 10 ms a tick counts).
    let cores = std::thread::available_parallelism().map_or(64, |n| n.get()) as f64;
    for c in cpu {
        let c = c.as_f64().unwrap_or_else(|| panic!("node_cpu {c}: {v}"));
        assert!((0.0..=cores).contains(&c), "{v}");
    }
}
