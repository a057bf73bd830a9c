//! `softrdma bench`: perftest-style benchmarks of the engine, with a raw
//! TCP baseline measured in the same run between the same two processes.
//!
//! * `proto.rs`: our session set-up in MPA private data;
//! * `server.rs`: the server (ours and perftest's `-R` clients);
//! * `perftest.rs`: perftest's rdma_cm exchange;
//! * `tcp.rs`: the TCP pump and ping-pong baseline;
//! * this file: arguments, the client side of every test, output.
//!
//! Units: `gbps` is 10^9 bits per second of payload; latencies are half
//! round trips for `*_lat` ping-pongs (perftest's convention) and full
//! post-to-completion times for `read_lat`; `ratio` is ours / baseline
//! (bandwidth: higher is better; latency: lower is better).

mod perftest;
mod proto;
mod server;
pub(crate) mod tcp;
mod ucx;

use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use proto::{Hello, Reply, Test};
use softrdma_verbs::*;
use std::collections::VecDeque;
use std::io::{BufRead, BufReader, Write};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Run the server (answers `softrdma bench` and perftest `-R` clients).
    #[arg(long)]
    server: bool,
    /// Server port (`--server`), 0 for any.
    #[arg(long, default_value_t = 18515)]
    port: u16,
    /// Server address to listen on.
    #[arg(long, default_value = "0.0.0.0")]
    bind: IpAddr,
    /// Client: the server to measure against (HOST:PORT).
    #[arg(long)]
    connect: Option<String>,
    /// Client: start a server as a child process on 127.0.0.1 and measure
    /// against it (one command).
    #[arg(long)]
    loopback: bool,
    /// The test.
    #[arg(long, value_enum, default_value = "write_bw")]
    test: Test,
    /// Message size in bytes (suffixes K, M), a comma-separated list, or
    /// `all` for powers of two from 2 bytes to 8 MiB (default 65536). With
    /// `--server --perftest write_lat`: the size the perftest clients use
    /// (their `-s`; default 2, perftest's).
    #[arg(long)]
    size: Option<String>,
    /// Messages per QP (bandwidth) or round trips (latency); default scales
    /// with the size. With `--server --perftest write_lat`: the clients'
    /// `-n` (default 1000, perftest's).
    #[arg(long)]
    iters: Option<u64>,
    /// Server: the test perftest `-R` clients run (perftest tells the
    /// server neither the test nor the size nor the count, and the latency
    /// tests need the server to answer). Without it the server serves
    /// write_bw, read_bw and send_bw clients, telling them apart by what
    /// they do.
    #[arg(long, value_enum)]
    perftest: Option<Test>,
    /// Run each size for this many seconds instead of a count.
    #[arg(long)]
    duration: Option<f64>,
    /// Queue pairs (bandwidth tests run them from one thread, one CQ).
    #[arg(long, default_value_t = 1)]
    qps: usize,
    /// Outstanding work requests per QP (bandwidth tests).
    #[arg(long, default_value_t = 64)]
    depth: usize,
    /// Bandwidth tests: request a completion every N work requests (the
    /// rest are unsignaled); default min(depth, 16).
    #[arg(long)]
    cq_mod: Option<usize>,
    /// Poll completions (and memory) without sleeping.
    #[arg(long)]
    busy_poll: bool,
    /// Also measure baselines in the same run: `tcp` (a raw TCP pump or
    /// ping-pong between the same two processes), `ucx` (Debian's
    /// ucx_perftest, the closest UCP test), or both (`tcp,ucx`).
    #[arg(long, value_enum, value_delimiter = ',')]
    baseline: Vec<Baseline>,
    /// UCX_TLS for `--baseline ucx`.
    #[arg(long, default_value = "tcp")]
    ucx_tls: String,
    /// One JSON object per line instead of a table.
    #[arg(long)]
    json: bool,
    /// Draw bandwidth (or latency) against size into this SVG file.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// MPA revision to offer (1 or 2).
    #[arg(long, default_value_t = 2)]
    mpa_rev: u8,
    /// Ask for MPA CRC32c (with `--server`: turn it on for perftest
    /// clients, which ask only when siw's `mpa_crc_required` is set).
    #[arg(long)]
    crc: bool,
    /// Do not offer softrdma's connection extensions (large batched
    /// segments instead of one FPDU per TCP segment): measures the plain
    /// iWARP path a Linux siw peer gets.
    #[arg(long)]
    no_ext: bool,
    /// Keep softrdma's extensions but not the same-host transport: Writes
    /// and Reads between two processes on this host then go over TCP
    /// instead of straight into the peer's memory.
    #[arg(long)]
    no_same_host: bool,
    /// Run each size this many times (alternating with the baseline) and
    /// report the median.
    #[arg(long, default_value_t = 1)]
    repeat: usize,
    /// `--idle-secs` for idle_qps: how long to watch the idle QPs.
    #[arg(long, default_value_t = 3.0)]
    idle_secs: f64,
    /// (internal) exit when stdin closes; used by `--loopback`.
    #[arg(long, hide = true)]
    exit_on_stdin_eof: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Baseline {
    Tcp,
    /// The TCP pump writing as the siw framing does (a message per MSS
    /// with `MSG_EOR`): the kernel's cost of FPDU-aligned segments, for
    /// bandwidth tests. Reported as `tcp_segments_gbps` beside `tcp`.
    TcpSegments,
    Ucx,
}

pub fn run(a: Args) -> Result<()> {
    if a.server {
        let mut expect = perftest::Expect {
            test: a.perftest,
            crc: a.crc,
            ..perftest::Expect::default()
        };
        if let Some(s) = &a.size {
            let v = sizes(s)?;
            if v.len() != 1 {
                bail!("--server: --size takes one size (perftest's `-s`), not {s}");
            }
            expect.size = usize::try_from(v[0]).context("--size")?;
        }
        if let Some(n) = a.iters {
            expect.iters = n;
        }
        return server::run(a.bind, a.port, a.exit_on_stdin_eof, expect);
    }
    let mut child = None;
    let server: SocketAddr = if a.loopback {
        let (c, addr) = spawn_loopback_server()?;
        child = Some(c);
        addr
    } else {
        let s = a
            .connect
            .as_deref()
            .context("give --server, --connect HOST:PORT or --loopback")?;
        s.to_socket_addrs()?
            .next()
            .with_context(|| format!("cannot resolve {s}"))?
    };
    let res = run_client(&a, server, child.as_ref().map(|c| c.id()));
    if let Some(mut c) = child {
        drop(c.stdin.take());
        let _ = c.kill();
        let _ = c.wait();
    }
    res
}

fn spawn_loopback_server() -> Result<(Child, SocketAddr)> {
    let exe = std::env::current_exe()?;
    let mut c = Command::new(exe)
        .args([
            "bench",
            "--server",
            "--bind",
            "127.0.0.1",
            "--port",
            "0",
            "--exit-on-stdin-eof",
        ])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .context("cannot start the loopback server")?;
    let out = c.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    let line = lines
        .next()
        .context("the loopback server exited before listening")??;
    let addr = line
        .strip_prefix("BENCH-SERVER-LISTENING ")
        .and_then(|r| r.split_whitespace().next())
        .with_context(|| format!("unexpected loopback server output: {line}"))?
        .parse()?;
    // Keep draining its stdout so it never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines.by_ref() {});
    Ok((c, addr))
}

fn parse_size(s: &str) -> Result<u64> {
    let s = s.trim();
    let (num, mul) = match s.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((i, _)) => {
            let m = match s[i..].to_ascii_lowercase().as_str() {
                "k" | "kib" | "kb" => 1 << 10,
                "m" | "mib" | "mb" => 1 << 20,
                "g" | "gib" | "gb" => 1 << 30,
                "b" => 1,
                o => bail!("unknown size suffix {o:?}"),
            };
            (&s[..i], m)
        }
        None => (s, 1),
    };
    Ok(num.trim().parse::<u64>()? * mul)
}

fn sizes(s: &str) -> Result<Vec<u64>> {
    if s == "all" {
        return Ok((1..=23).map(|p| 1u64 << p).collect());
    }
    let v = s.split(',').map(parse_size).collect::<Result<Vec<_>>>()?;
    for &z in &v {
        if z == 0 || z > 8 << 20 {
            bail!("size {z} outside 1 byte .. 8 MiB");
        }
    }
    Ok(v)
}

fn default_iters(test: Test, size: u64) -> u64 {
    if test.is_lat() {
        ((256u64 << 20) / size).clamp(50, 10_000)
    } else {
        ((1u64 << 30) / size).clamp(100, 100_000)
    }
}

/// One output record.
#[derive(Debug, Default, Clone)]
struct Record {
    test: &'static str,
    size: u64,
    iters: u64,
    qps: usize,
    depth: usize,
    secs: f64,
    gbps: f64,
    msg_rate: f64,
    lat: Option<(f64, f64, f64)>,
    cpu_client: f64,
    cpu_server: Option<f64>,
    baseline_gbps: Option<f64>,
    baseline_lat_us_p50: Option<f64>,
    ratio: Option<f64>,
    /// `--baseline tcp-segments`: the pump in MSS-sized `MSG_EOR` messages.
    seg_baseline_gbps: Option<f64>,
    rss_client_mib: Option<f64>,
    rss_server_mib: Option<f64>,
    /// The server's TCP baseline port (not printed).
    tcp_port: u16,
    ucx: Option<ucx::UcxResult>,
    /// Ours / UCX: message rate for bandwidth tests, p50 latency for
    /// latency tests.
    ucx_ratio: Option<f64>,
    /// "same-host" when Writes and Reads went straight into the peer's
    /// memory, else "iwarp-tcp".
    transport: &'static str,
    /// Same-host: Writes and Reads copied directly / sent over TCP.
    direct_ops: u64,
    tcp_fallbacks: u64,
    /// With --repeat: every run's (Gbit/s, p50 us, p99 us), in run order.
    runs: Vec<(f64, f64, f64)>,
    /// With --repeat and a TCP pump baseline: its Gbit/s per run, in run
    /// order (how steady the machine itself was).
    base_runs: Vec<f64>,
}

impl Record {
    fn json(&self, a: &Args) -> String {
        let mut o = serde_json::json!({
            "test": self.test,
            "transport": if self.transport.is_empty() { "iwarp-tcp" } else { self.transport },
            "size": self.size,
            "iters": self.iters,
            "qps": self.qps,
            "depth": self.depth,
            "busy_poll": a.busy_poll,
            "crc": a.crc,
            "mpa_rev": a.mpa_rev,
            "repeat": a.repeat.max(1),
            "extensions": !a.no_ext,
            "secs": round(self.secs, 4),
            "gbps": round(self.gbps, 6),
            "msg_rate": round(self.msg_rate, 1),
            "lat_us_p50": self.lat.map(|l| round(l.0, 2)),
            "lat_us_p99": self.lat.map(|l| round(l.1, 2)),
            "lat_us_max": self.lat.map(|l| round(l.2, 2)),
            "cpu_client": round(self.cpu_client, 3),
            "cpu_server": self.cpu_server.map(|c| round(c, 3)),
        });
        let m = o.as_object_mut().unwrap();
        if let Some(b) = self.baseline_gbps {
            m.insert("baseline_gbps".into(), round(b, 6).into());
        }
        if let Some(b) = self.baseline_lat_us_p50 {
            m.insert("baseline_lat_us_p50".into(), round(b, 2).into());
        }
        if let Some(r) = self.ratio {
            m.insert("ratio".into(), round(r, 3).into());
        }
        if let Some(b) = self.seg_baseline_gbps {
            m.insert("tcp_segments_gbps".into(), round(b, 6).into());
            m.insert("ratio_tcp_segments".into(), round(self.gbps / b, 3).into());
        }
        if let Some(u) = &self.ucx {
            m.insert("ucx_tls".into(), a.ucx_tls.clone().into());
            m.insert("ucx_gbps".into(), round(u.gbps, 6).into());
            m.insert("ucx_msg_rate".into(), round(u.msg_rate, 1).into());
            m.insert("ucx_lat_us_p50".into(), round(u.lat_us_p50, 3).into());
        }
        if let Some(r) = self.ucx_ratio {
            m.insert("ucx_ratio".into(), round(r, 3).into());
        }
        if self.runs.len() > 1 {
            // Every run, so a bimodal result cannot hide behind the median:
            // the spread (slowest / fastest run) and each run's p99 / p50.
            let g: Vec<f64> = self.runs.iter().map(|r| round(r.0, 3)).collect();
            let tails: Vec<f64> = self
                .runs
                .iter()
                .map(|r| if r.1 > 0.0 { round(r.2 / r.1, 2) } else { 0.0 })
                .collect();
            let lo = self.runs.iter().map(|r| r.0).fold(f64::INFINITY, f64::min);
            let hi = self.runs.iter().map(|r| r.0).fold(0.0, f64::max);
            m.insert("runs_gbps".into(), g.into());
            m.insert("runs_p99_over_p50".into(), tails.into());
            if hi > 0.0 {
                m.insert("runs_min_over_max".into(), round(lo / hi, 3).into());
            }
            if self.base_runs.len() == self.runs.len() {
                let lo = self.base_runs.iter().copied().fold(f64::INFINITY, f64::min);
                let hi = self.base_runs.iter().copied().fold(0.0, f64::max);
                let g: Vec<f64> = self.base_runs.iter().map(|&b| round(b, 3)).collect();
                m.insert("baseline_runs_gbps".into(), g.into());
                if hi > 0.0 {
                    m.insert(
                        "baseline_runs_min_over_max".into(),
                        round(lo / hi, 3).into(),
                    );
                }
            }
        }
        if self.transport == "same-host" {
            m.insert("direct_ops".into(), self.direct_ops.into());
            m.insert("tcp_fallbacks".into(), self.tcp_fallbacks.into());
        }
        if let Some(r) = self.rss_client_mib {
            m.insert("rss_client_mib".into(), round(r, 1).into());
        }
        if let Some(r) = self.rss_server_mib {
            m.insert("rss_server_mib".into(), round(r, 1).into());
        }
        o.to_string()
    }
}

fn round(x: f64, digits: i32) -> f64 {
    let p = 10f64.powi(digits);
    (x * p).round() / p
}

/// CPU seconds (user + system) used so far by a process, from
/// /proc/PID/stat (USER_HZ is 100 on Linux).
pub(crate) fn cpu_secs(pid: Option<u32>) -> Option<f64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/stat"),
        None => "/proc/self/stat".into(),
    };
    let s = std::fs::read_to_string(path).ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 14 and 15 of stat are utime and stime; `rest` starts at 3.
    let ticks: u64 = f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

/// CPU seconds (user + system) of this process's children that have
/// exited and been waited for (`cutime` + `cstime`): a child command's
/// CPU is the difference across its run.
pub(crate) fn children_cpu_secs() -> Option<f64> {
    let s = std::fs::read_to_string("/proc/self/stat").ok()?;
    let rest = &s[s.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // Fields 16 and 17: cutime and cstime.
    let ticks: u64 = f.get(13)?.parse::<u64>().ok()? + f.get(14)?.parse::<u64>().ok()?;
    Some(ticks as f64 / 100.0)
}

fn rss_mib(pid: Option<u32>) -> Option<f64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".into(),
    };
    let s = std::fs::read_to_string(path).ok()?;
    let l = s.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: f64 = l.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn run_client(a: &Args, server: SocketAddr, server_pid: Option<u32>) -> Result<()> {
    if a.test == Test::AtomicLat && a.no_ext {
        bail!(
            "atomic_lat needs RFC 7306 atomics, which softrdma negotiates only through its \
             extensions: drop --no-ext (Linux siw has no atomics)"
        );
    }
    if a.qps == 0 || a.depth == 0 {
        bail!("--qps and --depth must be at least 1");
    }
    let mut cfg = DeviceConfig {
        name: "bench-client".into(),
        ..DeviceConfig::default()
    };
    // The default already honours SOFTRDMA_SAME_HOST=0.
    cfg.same_host &= !a.no_same_host;
    let dev = Device::open(cfg)?;
    let sizes = if a.test == Test::IdleQps {
        vec![64]
    } else if a.test == Test::AtomicLat {
        // Atomics work on one 64-bit word.
        vec![8]
    } else {
        sizes(a.size.as_deref().unwrap_or("65536"))?
    };
    let mut records = Vec::new();
    let mut header = false;
    for &size in &sizes {
        let iters = a.iters.unwrap_or_else(|| default_iters(a.test, size));
        // With --repeat N, RDMA and TCP runs alternate N times and the
        // median run of each is reported (a shared 2-core machine is noisy).
        let mut runs = Vec::new();
        for _ in 0..a.repeat.max(1) {
            let cpu0 = (cpu_secs(None), cpu_secs(server_pid));
            let t0 = Instant::now();
            let mut r = if a.test == Test::IdleQps {
                idle_qps(a, &dev, server, server_pid)?
            } else {
                measure(a, &dev, server, size, iters)?
            };
            let wall = t0.elapsed().as_secs_f64();
            if a.test != Test::IdleQps {
                if let (Some(c0), Some(c1)) = (cpu0.0, cpu_secs(None)) {
                    r.cpu_client = (c1 - c0) / wall;
                }
                if let (Some(c0), Some(c1)) = (cpu0.1, cpu_secs(server_pid)) {
                    r.cpu_server = Some((c1 - c0) / wall);
                }
            }
            if a.baseline.contains(&Baseline::Tcp) && a.test != Test::IdleQps {
                baseline(a, server, &mut r, size, iters)?;
            }
            if a.baseline.contains(&Baseline::TcpSegments)
                && !a.test.is_lat()
                && a.test != Test::IdleQps
            {
                r.seg_baseline_gbps = Some(pump_gbps(a, server, r.tcp_port, size, iters, true)?);
            }
            if a.baseline.contains(&Baseline::Ucx) && a.test != Test::IdleQps {
                let u = ucx::run(a.test, size, iters, &a.ucx_tls)?;
                r.ucx_ratio = Some(if a.test.is_lat() {
                    r.lat.map_or(0.0, |l| l.0) / u.lat_us_p50
                } else {
                    r.msg_rate / u.msg_rate
                });
                r.ucx = Some(u);
            }
            runs.push(r);
        }
        let r = median_run(runs, a.test.is_lat());
        if a.json {
            println!("{}", r.json(a));
        } else {
            if !header {
                print_header(a);
                header = true;
            }
            print_row(&r);
        }
        std::io::stdout().flush()?;
        records.push(r);
    }
    if let Some(p) = &a.plot {
        plot(p, a, &records)?;
    }
    Ok(())
}

/// The run with the median result, its baseline replaced by the median
/// baseline (and the ratio recomputed).
fn median_run(mut runs: Vec<Record>, lat: bool) -> Record {
    let all: Vec<(f64, f64, f64)> = runs
        .iter()
        .map(|r| {
            let (p50, p99, _) = r.lat.unwrap_or((0.0, 0.0, 0.0));
            (r.gbps, p50, p99)
        })
        .collect();
    let base_runs: Vec<f64> = runs.iter().filter_map(|r| r.baseline_gbps).collect();
    let key = |r: &Record| {
        if lat {
            r.lat.map_or(0.0, |l| l.0)
        } else {
            r.gbps
        }
    };
    runs.sort_by(|x, y| key(x).total_cmp(&key(y)));
    let mid = runs.len() / 2;
    let mut base_g = base_runs.clone();
    let mut base_l: Vec<f64> = runs.iter().filter_map(|r| r.baseline_lat_us_p50).collect();
    let mut base_s: Vec<f64> = runs.iter().filter_map(|r| r.seg_baseline_gbps).collect();
    base_s.sort_by(f64::total_cmp);
    base_g.sort_by(f64::total_cmp);
    base_l.sort_by(f64::total_cmp);
    let mut r = runs.swap_remove(mid);
    if !base_g.is_empty() {
        let b = base_g[base_g.len() / 2];
        r.baseline_gbps = Some(b);
        r.ratio = Some(r.gbps / b);
    }
    if !base_s.is_empty() {
        r.seg_baseline_gbps = Some(base_s[base_s.len() / 2]);
    }
    if !base_l.is_empty() {
        let b = base_l[base_l.len() / 2];
        r.baseline_lat_us_p50 = Some(b);
        r.ratio = r.lat.map(|l| l.0 / b);
    }
    r.runs = all;
    r.base_runs = base_runs;
    r
}

fn print_header(a: &Args) {
    println!(
        "---------------------------------------------------------------------------------------"
    );
    println!(
        " softrdma bench {}  qps {}  depth {}  mpa rev {}{}{}{}",
        a.test.name(),
        a.qps,
        a.depth,
        a.mpa_rev,
        if a.crc { "  crc" } else { "" },
        if a.busy_poll { "  busy-poll" } else { "" },
        if a.no_ext {
            "  no extensions"
        } else if a.no_same_host {
            "  no same-host"
        } else {
            ""
        }
    );
    println!(
        " {:>9} {:>10} {:>12} {:>12} {:>9} {:>9} {:>9} {:>8} {:>12} {:>7}",
        "#bytes",
        "#iters",
        "BW [MB/s]",
        "Rate [Mpps]",
        "p50 [us]",
        "p99 [us]",
        "max [us]",
        "CPU",
        "TCP base",
        "ratio"
    );
}

fn print_row(r: &Record) {
    let (p50, p99, max) = r.lat.unwrap_or((f64::NAN, f64::NAN, f64::NAN));
    let base = match (r.baseline_gbps, r.baseline_lat_us_p50) {
        (Some(g), _) => format!("{:.1} MB/s", g * 1e9 / 8.0 / 1e6),
        (None, Some(l)) => format!("{l:.2} us"),
        _ => "-".into(),
    };
    let ratio = r.ratio.map(|x| format!("{x:.2}")).unwrap_or("-".into());
    println!(
        " {:>9} {:>10} {:>12.1} {:>12.4} {:>9.2} {:>9.2} {:>9.2} {:>7.0}% {:>12} {:>7}",
        r.size,
        r.iters,
        r.gbps * 1e9 / 8.0 / 1e6,
        r.msg_rate / 1e6,
        p50,
        p99,
        max,
        r.cpu_client * 100.0,
        base,
        ratio
    );
    if let (Some(c), Some(s)) = (r.rss_client_mib, r.rss_server_mib) {
        println!(
            "   {} idle QPs: RSS client {c:.1} MiB, server {s:.1} MiB; idle CPU client {:.1}%, server {}",
            r.qps,
            r.cpu_client * 100.0,
            r.cpu_server
                .map(|c| format!("{:.1}%", c * 100.0))
                .unwrap_or("-".into())
        );
    }
}

fn baseline(a: &Args, server: SocketAddr, r: &mut Record, size: u64, iters: u64) -> Result<()> {
    let addr = SocketAddr::new(server.ip(), r.tcp_port);
    let until = a.duration.map(Duration::from_secs_f64);
    if a.test.is_lat() {
        let mut halves = tcp::pingpong(addr, size as usize, iters, until, a.busy_poll)?;
        if matches!(a.test, Test::ReadLat | Test::AtomicLat) {
            // read_lat and atomic_lat report whole round trips (as
            // perftest does).
            halves.iter_mut().for_each(|h| *h *= 2);
        }
        let (p50, _, _) = percentiles(&halves);
        r.baseline_lat_us_p50 = Some(p50);
        if let Some((ours, _, _)) = r.lat {
            r.ratio = Some(ours / p50);
        }
    } else {
        let g = pump_gbps(a, server, r.tcp_port, size, iters, false)?;
        r.baseline_gbps = Some(g);
        r.ratio = Some(r.gbps / g);
    }
    Ok(())
}

/// The TCP pump to the server's baseline port (`segments`: written as
/// the siw framing writes), in Gbit/s.
fn pump_gbps(
    a: &Args,
    server: SocketAddr,
    tcp_port: u16,
    size: u64,
    iters: u64,
    segments: bool,
) -> Result<f64> {
    let addr = SocketAddr::new(server.ip(), tcp_port);
    let until = a.duration.map(Duration::from_secs_f64);
    let (bytes, secs) = tcp::pump(addr, size as usize, iters, until, a.qps, segments)?;
    Ok(bytes as f64 * 8.0 / secs / 1e9)
}

/// p50, p99 and max of nanosecond samples, in microseconds (an HDR
/// histogram, 3 significant digits).
pub(crate) fn percentiles(ns: &[u64]) -> (f64, f64, f64) {
    let mut h = Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).unwrap();
    for &v in ns {
        let _ = h.record(v.max(1));
    }
    (
        h.value_at_quantile(0.5) as f64 / 1e3,
        h.value_at_quantile(0.99) as f64 / 1e3,
        h.max() as f64 / 1e3,
    )
}

/// Connected QPs of one run, with their buffers.
struct Session {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qps: Vec<QueuePair>,
    replies: Vec<Reply>,
    /// Source of Writes and Sends, sink of Reads (one per QP).
    local: Vec<MemoryRegion>,
    /// Small receive buffers (send_bw credits, send_lat echoes).
    ctl: Vec<MemoryRegion>,
    /// Without busy-polling: the waiting thread runs the QPs' input
    /// itself, sleeping in epoll (no progress-thread hand-off).
    driven: Option<DrivenCq>,
}

const RECV: u64 = 1 << 63;

fn wr_id(qp: usize, seq: u64) -> u64 {
    (qp as u64) << 40 | seq
}
fn wr_qp(id: u64) -> usize {
    ((id & !RECV) >> 40) as usize
}
fn wr_seq(id: u64) -> u64 {
    id & ((1 << 40) - 1)
}

/// Receive slots a client keeps posted per QP.
const CTL_SLOTS: usize = 16;

impl Session {
    fn connect(
        a: &Args,
        dev: &Device,
        server: SocketAddr,
        test: Test,
        size: u64,
        iters: u64,
        qps: usize,
    ) -> Result<Session> {
        let pd = dev.alloc_pd()?;
        let depth = a.depth.min(4096);
        let cq = dev.create_cq(qps * (depth + CTL_SLOTS + 8) + 64)?;
        let session = (Instant::now().elapsed().as_nanos() as u64) ^ std::process::id() as u64;
        let mut s = Session {
            pd: pd.clone(),
            cq: cq.clone(),
            qps: Vec::new(),
            replies: Vec::new(),
            local: Vec::new(),
            ctl: Vec::new(),
            driven: None,
        };
        let access = Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ;
        // Receives come only for send_bw credits and send_lat echoes.
        let slot = match test {
            Test::SendLat => size as usize,
            _ => 8,
        };
        let posted_recvs = matches!(test, Test::SendBw | Test::SendLat);
        for i in 0..qps {
            let mut attr = QpInitAttr::new(&cq);
            attr.caps.max_send_wr = depth + 8;
            attr.caps.max_recv_wr = CTL_SLOTS;
            let qp = pd.create_qp(attr)?;
            qp.modify(QpState::Init)?;
            let local = pd.alloc_mr(size.max(1) as usize, access)?;
            let ctl = pd.alloc_mr(slot * CTL_SLOTS, Access::LOCAL_WRITE)?;
            if posted_recvs {
                for k in 0..CTL_SLOTS {
                    qp.post_recv(&RecvWr::new(
                        RECV | wr_id(i, k as u64),
                        &[ctl.sge(k * slot, slot)],
                    ))?;
                }
            }
            let hello = Hello {
                test,
                busy_poll: a.busy_poll,
                depth: depth as u32,
                size,
                iters,
                client_addr: local.addr(),
                client_rkey: local.rkey().raw(),
                client_len: local.len() as u32,
                session,
                qp_index: i as u32,
                qp_count: qps as u32,
            };
            let params = ConnParams {
                private_data: hello.encode(),
                ird: 16,
                ord: (depth as u16).clamp(1, 128),
                mpa_revision: a.mpa_rev,
                crc: a.crc,
                extensions: !a.no_ext,
                ..ConnParams::default()
            };
            let pd_reply = qp
                .connect(server, &params)
                .with_context(|| format!("connecting QP {i} to {server}"))?;
            let reply = Reply::decode(&pd_reply)?;
            if a.busy_poll {
                qp.set_busy_poll(true)?;
            }
            if (reply.len as u64) < size.max(1) {
                bail!(
                    "the server's buffer ({} bytes) is smaller than the message",
                    reply.len
                );
            }
            s.qps.push(qp);
            s.replies.push(reply);
            s.local.push(local);
            s.ctl.push(ctl);
        }
        if !a.busy_poll {
            s.driven = Some(DrivenCq::new(&s.cq, &s.qps)?);
        }
        Ok(s)
    }

    fn disconnect(&self) {
        for qp in &self.qps {
            qp.disconnect();
        }
    }

    /// Waits for completions: spins with `busy`, else blocks.
    fn wait(&self, wcs: &mut [WorkCompletion], busy: bool) -> Result<usize> {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let n = if busy {
                for qp in &self.qps {
                    qp.progress();
                }
                self.cq.poll(wcs)
            } else if let Some(d) = &self.driven {
                d.poll_wait(wcs, Duration::from_secs(1))
            } else {
                self.cq.poll_wait(wcs, Duration::from_secs(1))
            };
            if n > 0 {
                if let Some(bad) = wcs[..n].iter().find(|w| !w.is_ok()) {
                    bail!("work request failed: {bad:?}");
                }
                return Ok(n);
            }
            if Instant::now() > deadline {
                bail!("no completion for 30 s");
            }
            if busy {
                std::hint::spin_loop();
            }
        }
    }
}

/// Spins until `f` holds; fails if the QP goes to ERROR. Without `busy`,
/// yields the CPU between checks (2-core machines run both ends).
pub(crate) fn spin_until(mut f: impl FnMut() -> bool, qp: &QueuePair, busy: bool) -> Result<()> {
    let mut n = 0u64;
    loop {
        if f() {
            return Ok(());
        }
        // In busy-poll mode (or driven by a waiting thread: `DrivenCq`)
        // only this thread runs the QP's receiver; otherwise the progress
        // thread does, and taking it from there would only contend.
        if qp.is_busy_poll() {
            qp.progress();
            if f() {
                return Ok(());
            }
        }
        n += 1;
        if n.is_multiple_of(1024) && qp.state() == QpState::Error {
            bail!("QP {} went to ERROR while waiting", qp.qp_num());
        }
        if busy {
            std::hint::spin_loop();
        } else {
            std::thread::yield_now();
        }
    }
}

fn measure(a: &Args, dev: &Device, server: SocketAddr, size: u64, iters: u64) -> Result<Record> {
    let s = Session::connect(a, dev, server, a.test, size, iters, a.qps)?;
    let mut r = Record {
        test: a.test.name(),
        size,
        qps: a.qps,
        depth: a.depth,
        tcp_port: s.replies[0].tcp_port,
        ..Record::default()
    };
    let res = match a.test {
        Test::WriteBw | Test::ReadBw | Test::SendBw => bw(a, &s, size, iters, &mut r),
        Test::WriteLat | Test::ReadLat | Test::SendLat | Test::AtomicLat => {
            lat(a, &s, size, iters, &mut r)
        }
        Test::IdleQps => unreachable!(),
    };
    r.transport = "iwarp-tcp";
    for qp in &s.qps {
        if let Some(st) = qp.same_host_stats() {
            r.transport = "same-host";
            r.direct_ops += st.direct_ops;
            r.tcp_fallbacks += st.tcp_fallbacks;
        }
    }
    s.disconnect();
    res.map(|_| r)
}

/// Per-QP progress of a bandwidth run.
#[derive(Default)]
struct QpRun {
    posted: u64,
    done: u64,
    /// send_bw: receives the server has reposted (cumulative).
    credited: u64,
    /// Post times of signaled WRs still outstanding.
    signaled: VecDeque<(u64, Instant)>,
    fin_posted: bool,
    fin_done: bool,
}

fn bw(a: &Args, s: &Session, size: u64, iters: u64, r: &mut Record) -> Result<()> {
    let depth = a.depth as u64;
    let cq_mod = a.cq_mod.unwrap_or(16).clamp(1, a.depth) as u64;
    let until = a.duration.map(Duration::from_secs_f64);
    let mut st: Vec<QpRun> = (0..s.qps.len()).map(|_| QpRun::default()).collect();
    let mut lat_ns = Vec::new();
    let mut wcs = vec![WorkCompletion::default(); 256];
    let mut batch: Vec<SendWr> = Vec::with_capacity(depth as usize);
    let sz = size as usize;
    let start = Instant::now();
    let mut target = if until.is_some() { u64::MAX } else { iters };
    loop {
        if let Some(d) = until {
            if target == u64::MAX && start.elapsed() >= d {
                target = st.iter().map(|q| q.posted).max().unwrap_or(0);
            }
        }
        for (i, q) in st.iter_mut().enumerate() {
            let reply = &s.replies[i];
            let local = &s.local[i];
            let mut room = depth.saturating_sub(q.posted - q.done);
            if a.test == Test::SendBw {
                room = room.min((reply.credits as u64 + q.credited).saturating_sub(q.posted));
            }
            let n = room.min(target.saturating_sub(q.posted));
            batch.clear();
            let now = Instant::now();
            for k in 0..n {
                let seq = q.posted + k;
                let sig = (seq + 1).is_multiple_of(cq_mod) || seq + 1 == target;
                let id = wr_id(i, seq);
                let sge = local.sge(0, sz);
                let wr = match a.test {
                    Test::WriteBw => SendWr::write(
                        id,
                        &[sge],
                        reply.addr,
                        softrdma_verbs::Rkey::from_raw(reply.rkey),
                    ),
                    Test::ReadBw => SendWr::read(
                        id,
                        sge,
                        reply.addr,
                        softrdma_verbs::Rkey::from_raw(reply.rkey),
                    ),
                    _ => SendWr::send(id, &[sge]),
                };
                let wr = if sig { wr } else { wr.unsignaled() };
                if sig {
                    q.signaled.push_back((seq, now));
                }
                batch.push(wr);
            }
            if !batch.is_empty() {
                s.qps[i].post_send_batch(&batch)?;
                q.posted += n;
            }
            // Everything posted: one final 1-byte Read proves the data is
            // placed at the server (a Read response follows the Writes and
            // Sends before it) and, being signaled, retires them all.
            if q.posted >= target && !q.fin_posted && target != u64::MAX {
                s.qps[i].post_send(&SendWr::read(
                    wr_id(i, (1 << 40) - 1),
                    local.sge(0, 1),
                    reply.addr,
                    softrdma_verbs::Rkey::from_raw(reply.rkey),
                ))?;
                q.fin_posted = true;
            }
        }
        if st.iter().all(|q| q.fin_done) {
            break;
        }
        let n = s.wait(&mut wcs, a.busy_poll)?;
        let now = Instant::now();
        for wc in &wcs[..n] {
            let i = wr_qp(wc.wr_id);
            let q = &mut st[i];
            if wc.wr_id & RECV != 0 {
                // A credit message: the cumulative count of reposted receives.
                let slot = wr_seq(wc.wr_id) as usize;
                let mut b = [0u8; 8];
                s.ctl[i].read_at(slot * 8, &mut b);
                q.credited = q.credited.max(u64::from_be_bytes(b));
                s.qps[i].post_recv(&RecvWr::new(wc.wr_id, &[s.ctl[i].sge(slot * 8, 8)]))?;
                continue;
            }
            let seq = wr_seq(wc.wr_id);
            if seq == (1 << 40) - 1 {
                q.fin_done = true;
                q.done = q.posted;
                continue;
            }
            q.done = seq + 1;
            while let Some(&(sq, t)) = q.signaled.front() {
                if sq > seq {
                    break;
                }
                if sq == seq {
                    lat_ns.push((now - t).as_nanos() as u64);
                }
                q.signaled.pop_front();
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    let msgs: u64 = st.iter().map(|q| q.posted).sum();
    r.iters = msgs / s.qps.len() as u64;
    r.secs = secs;
    r.gbps = (msgs * size) as f64 * 8.0 / secs / 1e9;
    r.msg_rate = msgs as f64 / secs;
    if !lat_ns.is_empty() {
        r.lat = Some(percentiles(&lat_ns));
    }
    Ok(())
}

fn lat(a: &Args, s: &Session, size: u64, iters: u64, r: &mut Record) -> Result<()> {
    let qp = &s.qps[0];
    let reply = &s.replies[0];
    let local = &s.local[0];
    let sz = size as usize;
    let until = a.duration.map(Duration::from_secs_f64);
    let mut wcs = vec![WorkCompletion::default(); 16];
    let mut halves = Vec::with_capacity(iters.min(1 << 20) as usize);
    // write_lat: the server expects exactly `iters` rounds.
    let count = if a.test == Test::WriteLat || until.is_none() {
        iters
    } else {
        u64::MAX
    };
    let start = Instant::now();
    let mut i = 0u64;
    // write_lat writes from `src` into the server's buffer; the server
    // writes back into `local` (the buffer our hello advertised).
    let src = s.pd.alloc_mr(sz, Access::LOCAL_WRITE)?;
    while i < count {
        if let Some(d) = until {
            if a.test != Test::WriteLat && start.elapsed() >= d {
                break;
            }
        }
        i += 1;
        let t = Instant::now();
        match a.test {
            Test::WriteLat => {
                let want = i as u8;
                src.write_at(sz - 1, &[want]);
                qp.post_send(&SendWr::write(
                    wr_id(0, i),
                    &[src.sge(0, sz)],
                    reply.addr,
                    softrdma_verbs::Rkey::from_raw(reply.rkey),
                ))?;
                spin_until(|| local.peek_u8(sz - 1) == want, qp, a.busy_poll)?;
                let rtt = t.elapsed().as_nanos() as u64;
                halves.push(rtt / 2);
                // Reap our Write completions (they are already done).
                let n = s.cq.poll(&mut wcs);
                if let Some(bad) = wcs[..n].iter().find(|w| !w.is_ok()) {
                    bail!("write failed: {bad:?}");
                }
            }
            Test::ReadLat => {
                qp.post_send(&SendWr::read(
                    wr_id(0, i),
                    local.sge(0, sz),
                    reply.addr,
                    softrdma_verbs::Rkey::from_raw(reply.rkey),
                ))?;
                s.wait(&mut wcs[..1], a.busy_poll)?;
                halves.push(t.elapsed().as_nanos() as u64);
            }
            Test::AtomicLat => {
                // Fetch-and-add of 1 on the server's first word: each
                // answer must be the previous one plus one (nobody else
                // adds to this buffer).
                qp.post_send(&SendWr::fetch_add(
                    wr_id(0, i),
                    local.sge(0, 8),
                    reply.addr,
                    softrdma_verbs::Rkey::from_raw(reply.rkey),
                    1,
                ))?;
                s.wait(&mut wcs[..1], a.busy_poll)?;
                halves.push(t.elapsed().as_nanos() as u64);
                let mut b = [0u8; 8];
                local.read_at(0, &mut b);
                if u64::from_ne_bytes(b) != i - 1 {
                    bail!(
                        "fetch-and-add {i} returned {}, not {}",
                        u64::from_ne_bytes(b),
                        i - 1
                    );
                }
            }
            _ => {
                qp.post_send(&SendWr::send(wr_id(0, i), &[local.sge(0, sz)]))?;
                // Our Send's completion and the echo, in either order.
                let mut got_echo = false;
                let mut got_send = false;
                while !(got_echo && got_send) {
                    let n = s.wait(&mut wcs, a.busy_poll)?;
                    for wc in &wcs[..n] {
                        if wc.wr_id & RECV != 0 {
                            if !got_echo {
                                halves.push(t.elapsed().as_nanos() as u64 / 2);
                            }
                            got_echo = true;
                            let slot = wr_seq(wc.wr_id) as usize;
                            qp.post_recv(&RecvWr::new(wc.wr_id, &[s.ctl[0].sge(slot * sz, sz)]))?;
                        } else {
                            got_send = true;
                        }
                    }
                }
            }
        }
    }
    let secs = start.elapsed().as_secs_f64();
    r.iters = halves.len() as u64;
    r.secs = secs;
    r.msg_rate = halves.len() as f64 / secs;
    r.gbps = (halves.len() as u64 * size) as f64 * 8.0 / secs / 1e9;
    r.lat = Some(percentiles(&halves));
    Ok(())
}

/// Connects `--qps` QPs, lets them sit idle, and reports resident memory
/// and CPU of both processes.
fn idle_qps(a: &Args, dev: &Device, server: SocketAddr, server_pid: Option<u32>) -> Result<Record> {
    let s = Session::connect(a, dev, server, Test::IdleQps, 64, 1, a.qps)?;
    // Let the connection set-up settle before watching.
    let c0 = (cpu_secs(None), cpu_secs(server_pid));
    let t0 = Instant::now();
    std::thread::sleep(Duration::from_secs_f64(a.idle_secs));
    let wall = t0.elapsed().as_secs_f64();
    let c1 = (cpu_secs(None), cpu_secs(server_pid));
    let rss1 = (rss_mib(None), rss_mib(server_pid));
    for qp in &s.qps {
        if qp.state() != QpState::Rts {
            bail!("QP {} left RTS while idle: {:?}", qp.qp_num(), qp.state());
        }
    }
    s.disconnect();
    let cpu = |a: Option<f64>, b: Option<f64>| Some((b? - a?) / wall);
    Ok(Record {
        test: Test::IdleQps.name(),
        size: 64,
        iters: 0,
        qps: a.qps,
        depth: a.depth,
        secs: wall,
        cpu_client: cpu(c0.0, c1.0).unwrap_or(0.0),
        cpu_server: cpu(c0.1, c1.1),
        rss_client_mib: rss1.0,
        rss_server_mib: rss1.1,
        ..Record::default()
    })
}

fn plot(path: &PathBuf, a: &Args, rs: &[Record]) -> Result<()> {
    use plotters::prelude::*;
    if rs.is_empty() {
        return Ok(());
    }
    let lat = a.test.is_lat();
    let y = |r: &Record| -> f64 {
        if lat {
            r.lat.map(|l| l.0).unwrap_or(0.0)
        } else {
            r.gbps
        }
    };
    let yb = |r: &Record| -> Option<f64> {
        if lat {
            r.baseline_lat_us_p50
        } else {
            r.baseline_gbps
        }
    };
    let ymax = rs
        .iter()
        .flat_map(|r| [Some(y(r)), yb(r)])
        .flatten()
        .fold(0.0f64, f64::max)
        * 1.1
        + 1e-9;
    let xmin = rs.iter().map(|r| r.size).min().unwrap() as f64;
    let xmax = rs.iter().map(|r| r.size).max().unwrap() as f64 * 1.5;
    let root = SVGBackend::new(path, (900, 560)).into_drawing_area();
    root.fill(&WHITE)?;
    let title = format!("softrdma bench {} (loopback)", a.test.name());
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d((xmin..xmax).log_scale(), 0.0..ymax)?;
    chart
        .configure_mesh()
        .x_desc("message size [bytes]")
        .y_desc(if lat {
            "latency p50 [us]"
        } else {
            "bandwidth [Gbit/s]"
        })
        .draw()?;
    chart
        .draw_series(LineSeries::new(
            rs.iter().map(|r| (r.size as f64, y(r))),
            &BLUE,
        ))?
        .label("softrdma")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], BLUE));
    if rs.iter().any(|r| yb(r).is_some()) {
        chart
            .draw_series(LineSeries::new(
                rs.iter().filter_map(|r| yb(r).map(|b| (r.size as f64, b))),
                &RED,
            ))?
            .label("raw TCP")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], RED));
    }
    chart
        .configure_series_labels()
        .border_style(BLACK)
        .background_style(WHITE.mix(0.8))
        .draw()?;
    root.present()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(sizes("65536").unwrap(), vec![65536]);
        assert_eq!(sizes("64K,1M").unwrap(), vec![65536, 1 << 20]);
        assert_eq!(sizes("all").unwrap().len(), 23);
        assert_eq!(*sizes("all").unwrap().last().unwrap(), 8 << 20);
        assert!(sizes("0").is_err());
        assert!(sizes("9M").is_err());
        assert!(sizes("12Q").is_err());
    }

    #[test]
    fn wr_id_fields() {
        let id = RECV | wr_id(999, 12345);
        assert_eq!(wr_qp(id), 999);
        assert_eq!(wr_seq(id), 12345);
        assert_eq!(wr_qp(wr_id(3, (1 << 40) - 1)), 3);
    }

    #[test]
    fn percentiles_are_ordered() {
        let v: Vec<u64> = (1..=1000).map(|x| x * 1000).collect();
        let (p50, p99, max) = percentiles(&v);
        assert!((p50 - 500.0).abs() < 2.0, "{p50}");
        assert!((p99 - 990.0).abs() < 5.0, "{p99}");
        assert!((max - 1000.0).abs() < 2.0, "{max}");
    }
}
