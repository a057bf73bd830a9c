//! The UCX baseline (`--baseline ucx`): Debian's `ucx_perftest` (ucx-utils)
//! run in the same invocation, server and client on 127.0.0.1, with the
//! closest UCP test and the same size and count. `UCX_TLS` comes from
//! `--ucx-tls` (default `tcp`; `cma,tcp` for UCX's same-host transport).
//!
//! | ours      | ucx_perftest |
//! |-----------|--------------|
//! | write_bw  | ucp_put_bw   |
//! | read_bw   | ucp_get      |
//! | send_bw   | ucp_am_bw    |
//! | write_lat | ucp_put_lat  |
//! | read_lat  | ucp_get (its latency column) |
//! | send_lat  | ucp_am_lat   |
//!
//! Figures come from ucx_perftest's `Final:` line: overall bandwidth (MB/s),
//! overall message rate, and the 50th-percentile "overhead" in microseconds
//! as its latency.

use super::proto::Test;
use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};

#[derive(Debug, Clone)]
pub struct UcxResult {
    pub gbps: f64,
    pub msg_rate: f64,
    pub lat_us_p50: f64,
}

fn ucx_test(t: Test) -> Option<&'static str> {
    Some(match t {
        Test::WriteBw => "ucp_put_bw",
        Test::ReadBw => "ucp_get",
        Test::SendBw => "ucp_am_bw",
        Test::WriteLat => "ucp_put_lat",
        Test::ReadLat => "ucp_get",
        Test::SendLat => "ucp_am_lat",
        Test::AtomicLat | Test::IdleQps => return None,
    })
}

/// Parses the numbers of ucx_perftest's `Final:` line.
pub fn parse_final(out: &str) -> Option<UcxResult> {
    let line = out
        .lines()
        .rev()
        .find(|l| l.trim_start().starts_with("Final:"))?;
    let f: Vec<f64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|w| w.replace(',', "").parse().ok())
        .collect();
    // iterations, overhead p50 / average / overall (us), bandwidth average /
    // overall (MB/s), message rate average / overall.
    if f.len() < 8 {
        return None;
    }
    Some(UcxResult {
        gbps: f[5] * 1e6 * 8.0 / 1e9,
        msg_rate: f[7],
        lat_us_p50: f[1],
    })
}

pub fn run(test: Test, size: u64, iters: u64, tls: &str) -> Result<UcxResult> {
    let Some(name) = ucx_test(test) else {
        bail!("no ucx_perftest counterpart for {}", test.name());
    };
    let port = crate::net::free_ports(1)?[0].to_string();
    // stdbuf: ucx_perftest block-buffers a piped stdout, and we wait for
    // its "Waiting for connection" line.
    let mut server = Command::new("stdbuf")
        .args(["-oL", "ucx_perftest", "-p", &port])
        .env("UCX_TLS", tls)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .context(
            "cannot run ucx_perftest (Debian package ucx-utils; scripts/setup.sh installs it)",
        )?;
    let mut lines = BufReader::new(server.stdout.take().unwrap()).lines();
    let ready = lines
        .by_ref()
        .map_while(|l| l.ok())
        .any(|l| l.contains("Waiting for connection"));
    if !ready {
        let _ = server.kill();
        let _ = server.wait();
        bail!("ucx_perftest server did not start");
    }
    std::thread::spawn(move || for _ in lines {});
    let out = Command::new("ucx_perftest")
        .args(["127.0.0.1", "-p", &port, "-t", name])
        .args(["-s", &size.to_string(), "-n", &iters.to_string()])
        .args(["-w", &(iters / 10).clamp(1, 10_000).to_string()])
        .env("UCX_TLS", tls)
        .stdin(Stdio::null())
        .output()
        .context("cannot run the ucx_perftest client")?;
    let _ = server.kill();
    let _ = server.wait();
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!(
            "ucx_perftest {name} failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    parse_final(&text).with_context(|| format!("no `Final:` line from ucx_perftest:\n{text}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn final_line() {
        let out = "+---+\nFinal:                200000      4.579   226.045     6.332        0.03       1.20        4424      157934\n";
        let r = super::parse_final(out).unwrap();
        assert_eq!(r.msg_rate, 157934.0);
        assert!((r.gbps - 1.20 * 8.0 / 1000.0).abs() < 1e-9);
        assert_eq!(r.lat_us_p50, 4.579);
        assert!(super::parse_final("no final line").is_none());
    }
}
