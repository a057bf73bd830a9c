//! `softrdma store bench-large`: large values against the raw TCP pump
//! (issue 32).
//!
//! Starts its own replica group (as `softrdma store bench` does) and, for
//! each value size, measures with one client for `--secs` each:
//!
//! * `put`: the native client's keyed put (`StoreClient::set_bytes`: the
//!   value handed over, not copied first) of a value
//!   of that size over one of four keys in turn (in place, so the arena
//!   does not grow), acknowledged once both nodes hold it: the client
//!   lends the request, the primary pulls it with RDMA Reads, the
//!   secondary pulls the replicated write from the primary;
//! * `get`: the keyed one-sided get of those keys (RDMA Reads of the index
//!   and of the object);
//!
//! and, in this process over loopback TCP, the same bytes moved by plain
//! sockets with nothing else to do (`TCP_NODELAY`, buffers reused, a
//! length before each message and a one-byte acknowledgement after it):
//!
//! * `tcp_relay`: client to A, A to B, B acknowledges to A, A to the
//!   client. The least a put that two hosts hold before it is acknowledged
//!   costs: the baseline of `put` (target: at least 0.8x);
//! * `tcp_hop`: client to A, A acknowledges: what moving the bytes once
//!   costs, beside `get` (which moves them the other way).
//!
//! Each row has its rate, MB/s, p50 and p99 latency, and CPU as fractions
//! of one core: the client process, the primary and the secondary for the
//! store's rows; this process (all three ends) for the pump's.
//!
//! The four are measured in turn, `--rounds` times (each for `--secs`
//! divided by the rounds), and each row sums its rounds: a machine whose
//! speed drifts over seconds (a shared host's neighbours) moves a put and
//! its baseline alike, where measuring each once, seconds apart, let the
//! drift into the ratio (the same build's 1 MiB puts ranged 0.46-0.81x
//! the relay in session 56). Each round's ratio is printed too (stderr).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;
use hdrhistogram::Histogram;
use softrdma_store::net::client::StoreClient;

use crate::store_bench::{start_group, work_dir, CpuSample};

#[derive(ClapArgs)]
pub struct Args {
    /// Print one JSON object per line (else a table).
    #[arg(long)]
    json: bool,
    /// Value sizes in bytes, comma-separated (at most the store's limit,
    /// 64 MiB).
    #[arg(long, value_delimiter = ',', default_values_t = [1usize << 20, 16 << 20, 64 << 20])]
    sizes: Vec<usize>,
    /// Seconds per measured row (all its rounds together).
    #[arg(long, default_value_t = 3.0)]
    secs: f64,
    /// Rounds: the rows are measured in turn this many times, and each
    /// sums its rounds.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Keep the nodes' logs here (default: a temporary directory, removed
    /// on success).
    #[arg(long)]
    workdir: Option<PathBuf>,
}

/// Keys the puts rotate over.
const KEYS: usize = 4;

/// One measured row (or one round of it).
struct Measured {
    ops: u64,
    secs: f64,
    /// CPU, fractions of one core: the client (or this process), the
    /// primary, the secondary (`None` for the pump's rows).
    cpu: [Option<f64>; 3],
    /// The latencies (ns), from which rounds are summed.
    hist: Histogram<u64>,
}

impl Measured {
    fn rate(&self) -> f64 {
        self.ops as f64 / self.secs
    }

    fn p50_us(&self) -> f64 {
        self.hist.value_at_quantile(0.5) as f64 / 1e3
    }

    fn p99_us(&self) -> f64 {
        self.hist.value_at_quantile(0.99) as f64 / 1e3
    }

    /// The rounds of one row as one measurement: their operations over
    /// their time, their latencies together, CPU weighted by time.
    fn sum(rounds: &[Measured]) -> Measured {
        let mut hist = hist();
        for r in rounds {
            hist.add(&r.hist).expect("histograms of the same bounds");
        }
        let secs: f64 = rounds.iter().map(|r| r.secs).sum();
        let mut cpu = [None; 3];
        for (i, c) in cpu.iter_mut().enumerate() {
            *c = rounds
                .iter()
                .map(|r| r.cpu[i].map(|x| x * r.secs))
                .sum::<Option<f64>>()
                .map(|t| t / secs.max(1e-9));
        }
        Measured {
            ops: rounds.iter().map(|r| r.ops).sum(),
            secs,
            cpu,
            hist,
        }
    }
}

/// `n` bytes that differ from one position to the next and per `seed`.
fn pattern(n: usize, seed: u64) -> Vec<u8> {
    (0..n as u64)
        .map(|i| (i.wrapping_mul(31) ^ seed.wrapping_mul(131)) as u8)
        .collect()
}

fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 600_000_000_000, 3).expect("histogram bounds")
}

/// Runs `step` back to back for `secs` (after one unmeasured call),
/// recording each call's latency; CPU sampled around it.
fn timed(
    secs: f64,
    pids: &[Option<u32>; 2],
    mut step: impl FnMut() -> Result<()>,
) -> Result<Measured> {
    step()?;
    let mut h = hist();
    let c0 = CpuSample::now(pids);
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs_f64(secs);
    let mut ops = 0u64;
    while Instant::now() < until {
        let t = Instant::now();
        step()?;
        h.record(t.elapsed().as_nanos().max(1) as u64)?;
        ops += 1;
    }
    let elapsed = t0.elapsed().as_secs_f64();
    let c1 = CpuSample::now(pids);
    Ok(Measured {
        ops,
        secs: elapsed,
        cpu: c0.until(&c1),
        hist: h,
    })
}

// ---------------------------------------------------------------------------
// The raw TCP pump.

/// Reads one message (a `u64` length, then the bytes) into `buf`; `None`
/// at the end of the stream.
fn read_msg(s: &mut TcpStream, buf: &mut Vec<u8>) -> std::io::Result<Option<()>> {
    let mut len = [0u8; 8];
    match s.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    buf.resize(u64::from_le_bytes(len) as usize, 0);
    s.read_exact(buf)?;
    Ok(Some(()))
}

fn write_msg(s: &mut TcpStream, msg: &[u8]) -> std::io::Result<()> {
    s.write_all(&(msg.len() as u64).to_le_bytes())?;
    s.write_all(msg)
}

/// A pump end: takes messages from its one connection, forwards each to
/// `next` (waiting for its acknowledgement) if there is one, and
/// acknowledges it; until the connection ends.
fn pump_end(listener: TcpListener, next: Option<std::net::SocketAddr>) -> Result<()> {
    let (mut s, _) = listener.accept()?;
    s.set_nodelay(true)?;
    let mut next = match next {
        Some(a) => {
            let n = TcpStream::connect(a)?;
            n.set_nodelay(true)?;
            Some(n)
        }
        None => None,
    };
    let mut buf = Vec::new();
    let mut ack = [0u8; 1];
    while read_msg(&mut s, &mut buf)?.is_some() {
        if let Some(n) = next.as_mut() {
            write_msg(n, &buf)?;
            n.read_exact(&mut ack)?;
        }
        s.write_all(&[1])?;
    }
    if let Some(n) = next {
        let _ = n.shutdown(Shutdown::Write);
    }
    Ok(())
}

/// `tcp_hop` (`relay` false) or `tcp_relay` (true) with `size`-byte
/// messages.
fn measure_pump(size: usize, secs: f64, relay: bool) -> Result<Measured> {
    let a = TcpListener::bind("127.0.0.1:0")?;
    let b = TcpListener::bind("127.0.0.1:0")?;
    let b_addr = b.local_addr()?;
    let a_addr = a.local_addr()?;
    let mut ends = vec![std::thread::spawn(move || {
        pump_end(a, relay.then_some(b_addr))
    })];
    if relay {
        ends.push(std::thread::spawn(move || pump_end(b, None)));
    }
    let mut c = TcpStream::connect(a_addr)?;
    c.set_nodelay(true)?;
    let msg = pattern(size, 7);
    let mut ack = [0u8; 1];
    let m = timed(secs, &[None, None], || {
        write_msg(&mut c, &msg)?;
        c.read_exact(&mut ack)?;
        Ok(())
    });
    c.shutdown(Shutdown::Write)?;
    for e in ends {
        e.join()
            .map_err(|_| anyhow::anyhow!("a pump end panicked"))??;
    }
    let mut m = m?;
    // The pump's CPU is all in this process.
    m.cpu = [m.cpu[0], None, None];
    Ok(m)
}

// ---------------------------------------------------------------------------
// The report.

struct Row<'a> {
    op: &'a str,
    size: usize,
    m: &'a Measured,
    /// The row this one is compared with, and the target ratio.
    base: Option<(&'a str, &'a Measured, Option<f64>)>,
}

fn fmt_cpu(c: &[Option<f64>; 3]) -> String {
    c.iter()
        .map(|v| v.map_or("-".into(), |v| format!("{v:.2}")))
        .collect::<Vec<_>>()
        .join("/")
}

fn opt(v: Option<f64>) -> String {
    v.map_or("null".into(), |v| format!("{v:.3}"))
}

impl Row<'_> {
    fn json(&self) -> String {
        let m = self.m;
        let mut s = format!(
            "{{\"op\":\"{}\",\"size\":{},\"ops\":{},\"ops_per_s\":{:.1},\"mb_per_s\":{:.1},\
             \"p50_us\":{:.1},\"p99_us\":{:.1},\"cpu_client\":{},\"cpu_primary\":{},\"cpu_secondary\":{}",
            self.op,
            self.size,
            m.ops,
            m.rate(),
            m.rate() * self.size as f64 / 1e6,
            m.p50_us(),
            m.p99_us(),
            opt(m.cpu[0]),
            opt(m.cpu[1]),
            opt(m.cpu[2]),
        );
        if let Some((op, b, target)) = self.base {
            s += &format!(
                ",\"baseline\":\"{op}\",\"baseline_ops_per_s\":{:.1},\"baseline_p99_us\":{:.1},\
                 \"baseline_cpu\":{},\"ratio\":{:.3},\"target\":{}",
                b.rate(),
                b.p99_us(),
                opt(b.cpu[0]),
                m.rate() / b.rate().max(1e-9),
                opt(target),
            );
        }
        s + "}"
    }

    fn print(&self) {
        let m = self.m;
        let base = match self.base {
            Some((op, b, target)) => format!(
                "{:>10} {:>9.1} {:>10.0} {:>6.2}x {:>7}",
                op,
                b.rate(),
                b.p99_us(),
                m.rate() / b.rate().max(1e-9),
                target.map_or("-".into(), |t| format!(">={t}x")),
            ),
            None => String::new(),
        };
        println!(
            "{:<10} {:>9} {:>9.1} {:>8.0} {:>10.0} {:>10.0} {:>16} {base}",
            self.op,
            self.size,
            m.rate(),
            m.rate() * self.size as f64 / 1e6,
            m.p50_us(),
            m.p99_us(),
            fmt_cpu(&m.cpu),
        );
    }
}

fn print_header() {
    println!(
        "{:<10} {:>9} {:>9} {:>8} {:>10} {:>10} {:>16} {:>10} {:>9} {:>10} {:>7} {:>7}",
        "op",
        "bytes",
        "ops/s",
        "MB/s",
        "p50 us",
        "p99 us",
        "cpu c/p/s",
        "baseline",
        "ops/s",
        "p99 us",
        "ratio",
        "target"
    );
}

pub fn run(a: Args) -> Result<()> {
    let max = softrdma_store::proto::MAX_VALUE;
    if a.sizes.is_empty() || a.sizes.iter().any(|&s| s == 0 || s > max) {
        bail!("--sizes: 1 to {max} bytes each");
    }
    if !(a.secs > 0.0 && a.secs.is_finite()) {
        bail!("--secs must be positive");
    }
    if a.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let secs = a.secs / a.rounds as f64;
    let dir = work_dir(a.workdir.as_deref(), "softrdma-bench-large")?;
    let t0 = Instant::now();
    let say = |m: String| eprintln!("[{:6.1} s] {m}", t0.elapsed().as_secs_f64());
    // Room for the keys' values and a new copy of each (a put that does
    // not fit in place), with slack.
    let largest = *a.sizes.iter().max().expect("a size");
    let arena = format!("{}MiB", (3 * KEYS * largest).div_ceil(1 << 20).max(256));
    let group = start_group(&dir, &arena, true)?;
    say(format!(
        "store group redundant (arena {arena}, logs in {}), transport {}",
        dir.display(),
        if softrdma_verbs::same_host_default() {
            "same-host"
        } else {
            "TCP"
        }
    ));
    let pids = [
        Some(group.procs[0].child.id()),
        Some(group.procs[1].child.id()),
    ];
    let mut c = StoreClient::new(group.client_config())?;
    if !a.json {
        print_header();
    }
    for &size in &a.sizes {
        // Handed over, not copied per put (`set_bytes`).
        let value = softrdma_store::proto::Bytes::from(pattern(size, size as u64));
        let keys: Vec<Vec<u8>> = (0..KEYS)
            .map(|i| format!("large:{i}").into_bytes())
            .collect();
        for k in &keys {
            c.set(k, &value).context("the first put of a key")?;
        }
        say(format!(
            "{size} B: store puts and gets, then the TCP pumps, {} rounds",
            a.rounds
        ));
        let mut i = 0usize;
        let (mut puts, mut gets, mut relays, mut hops) = (vec![], vec![], vec![], vec![]);
        for _ in 0..a.rounds {
            puts.push(timed(secs, &pids, || {
                i += 1;
                c.set_bytes(&keys[i % KEYS], value.clone())?;
                Ok(())
            })?);
            gets.push(timed(secs, &pids, || {
                i += 1;
                match c.get(&keys[i % KEYS])? {
                    Some(v) if v.len() == size => Ok(()),
                    v => bail!("a get returned {:?} bytes, not {size}", v.map(|v| v.len())),
                }
            })?);
            relays.push(measure_pump(size, secs, true)?);
            hops.push(measure_pump(size, secs, false)?);
        }
        let ratios = |m: &[Measured], b: &[Measured]| {
            let r: Vec<String> = m
                .iter()
                .zip(b)
                .map(|(m, b)| format!("{:.2}", m.rate() / b.rate().max(1e-9)))
                .collect();
            r.join(" ")
        };
        say(format!(
            "{size} B rounds: put/tcp_relay {}, get/tcp_hop {}",
            ratios(&puts, &relays),
            ratios(&gets, &hops)
        ));
        let (put, get) = (Measured::sum(&puts), Measured::sum(&gets));
        let (relay, hop) = (Measured::sum(&relays), Measured::sum(&hops));
        let rows = [
            Row {
                op: "put",
                size,
                m: &put,
                base: Some(("tcp_relay", &relay, Some(0.8))),
            },
            Row {
                op: "get",
                size,
                m: &get,
                base: Some(("tcp_hop", &hop, None)),
            },
            Row {
                op: "tcp_relay",
                size,
                m: &relay,
                base: None,
            },
            Row {
                op: "tcp_hop",
                size,
                m: &hop,
                base: None,
            },
        ];
        for r in &rows {
            if a.json {
                println!("{}", r.json());
            } else {
                r.print();
            }
        }
        for k in &keys {
            c.del(k)?;
        }
    }
    drop(group);
    say("done".into());
    if a.workdir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}
