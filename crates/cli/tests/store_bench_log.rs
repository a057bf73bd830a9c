//! `softrdma store bench-log --json` end to end, shortened: the durable log
//! on a store file through a local QP and through a storage target on
//! loopback, beside fio's fdatasync rate (fio is installed by
//! scripts/setup.sh; without it the test fails). Every row must have
//! positive rates, a p99 at least its p50, CPU, and a ratio to fio; and
//! records per second must be commits times the batch.

use std::process::Command;

const SOFTRDMA: &str = env!("CARGO_BIN_EXE_softrdma");

#[test]
fn bench_log_json_rows() {
    let out = Command::new(SOFTRDMA)
        .args([
            "store",
            "bench-log",
            "--json",
            "--sizes",
            "100,4096",
            "--batches",
            "1,16",
        ])
        .args(["--secs", "0.4", "--rounds", "2"])
        .output()
        .expect("run softrdma");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "softrdma store bench-log failed ({}); if fio is missing, run scripts/setup.sh\n\
         stdout:\n{stdout}\nstderr:\n{stderr}",
        out.status
    );
    let rows: Vec<serde_json::Value> = stdout
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert_eq!(rows.len(), 8, "{stdout}");
    for (i, v) in rows.iter().enumerate() {
        let f = |k: &str| v[k].as_f64().unwrap_or_else(|| panic!("no {k}: {v}"));
        assert_eq!(v["where"], if i < 4 { "local" } else { "remote" }, "{v}");
        assert!(f("commits_per_s") > 0.0, "{v}");
        let batch = f("batch");
        let want = f("commits_per_s") * batch;
        assert!(
            (f("records_per_s") - want).abs() <= want * 0.01 + 1.0,
            "{v}"
        );
        assert!(
            f("commit_p99_us") >= f("commit_p50_us") && f("commit_p50_us") > 0.0,
            "{v}"
        );
        assert!(f("cpu") > 0.0 && f("cpu") <= 16.0, "{v}");
        assert!(f("fio_fdatasync_per_s") > 0.0, "{v}");
        assert!(f("ratio") > 0.0, "{v}");
        // One commit of `batch` records writes whole blocks.
        assert_eq!(f("fio_bs") as u64 % 4096, 0, "{v}");
    }
}
