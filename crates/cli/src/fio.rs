//! Running fio (the Debian package; scripts/setup.sh installs it), the
//! benchmarks' baseline for the device, and reading its JSON report.

use anyhow::{bail, Context, Result};
use serde_json::Value;

/// Runs fio with `args` (`--output-format=json` is added) and returns its
/// first job's report.
pub fn job(args: &[String]) -> Result<Value> {
    let out = std::process::Command::new("fio")
        .args(args)
        .arg("--output-format=json")
        .output()
        .context("running fio (Debian package fio; scripts/setup.sh installs it)")?;
    if !out.status.success() {
        bail!("fio failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let mut v: Value = serde_json::from_slice(&out.stdout).context("fio's JSON")?;
    Ok(v["jobs"][0].take())
}

/// The job's CPU: user and system time as a share of one core.
pub fn cpu(job: &Value) -> f64 {
    (job["usr_cpu"].as_f64().unwrap_or(0.0) + job["sys_cpu"].as_f64().unwrap_or(0.0)) / 100.0
}

/// The 99th percentile (µs) of a latency histogram (`clat_ns`, `lat_ns`).
pub fn p99_us(lat: &Value) -> f64 {
    lat["percentile"]["99.000000"].as_f64().unwrap_or(0.0) / 1e3
}
