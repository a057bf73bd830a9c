//! `softrdma storage bench PATH`: the storage endpoint's Writes and Reads
//! (4 KiB and 128 KiB, queue depth 1 and 32, strict and relaxed ordering),
//! locally through a network-less QP and remotely through a storage
//! target on loopback, with `fio` (io_uring, same file, block size and
//! depth, buffered like the endpoint) and a raw TCP pump measured in the
//! same run as baselines; then a mixed-size workload (4 KiB Writes among
//! 1 MiB ones) under strict and relaxed ordering.

use anyhow::{bail, Context, Result};
use softrdma_storage::endpoint::{connect, Direct, Endpoint, Target};
use softrdma_storage::layout::Rights;
use softrdma_storage::{InitOptions, PartitionSpec, Store};
use softrdma_verbs::*;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub struct Opts {
    pub json: bool,
    pub duration: Duration,
    /// Bytes of partition 0 the workload cycles over.
    pub working_set: u64,
    pub fio: bool,
    /// O_DIRECT endpoint, fio --direct=1.
    pub direct: bool,
    /// Only these rows (all when empty; the mixed workload only then).
    pub only: Vec<Row>,
    /// Measurements of each row, fio and the endpoint in turn.
    pub repeat: usize,
}

/// One row of the table: an operation, a size and a queue depth.
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct Row {
    op: Op,
    size: usize,
    depth: usize,
}

impl Row {
    /// `OP:SIZE:DEPTH`, e.g. `read:128KiB:32`.
    pub fn parse(s: &str) -> Result<Row> {
        let bad = || anyhow::anyhow!("{s:?}: want OP:SIZE:DEPTH, e.g. read:128KiB:32");
        let mut it = s.split(':');
        let (Some(op), Some(size), Some(depth), None) =
            (it.next(), it.next(), it.next(), it.next())
        else {
            return Err(bad());
        };
        let op = match op {
            "read" => Op::Read,
            "write" => Op::Write,
            _ => return Err(bad()),
        };
        let size = softrdma_storage::parse_size(size).map_err(|e| anyhow::anyhow!("{s:?}: {e}"))?;
        let depth: usize = depth.parse().map_err(|_| bad())?;
        if ![4096, 128 << 10].contains(&size) || ![1, 32].contains(&depth) {
            bail!("{s:?}: the bench measures sizes 4KiB and 128KiB at depths 1 and 32");
        }
        Ok(Row {
            op,
            size: size as usize,
            depth,
        })
    }
}

const PRINCIPAL: &str = "bench";
const T: Duration = Duration::from_secs(30);

#[derive(Clone, Copy, PartialEq, Debug)]
enum Op {
    Write,
    Read,
}

/// Makes sure PATH is a store whose partition 0 "bench" may write:
/// creates a 1 GiB store if PATH does not exist.
fn prepare(path: &Path, ws: u64) -> Result<(u64, [u8; 32])> {
    if !path.exists() {
        Store::init(
            path,
            &InitOptions {
                size: Some((ws + (2 << 20)).max(1 << 30)),
                partitions: PartitionSpec::Equal(1),
                align: 1 << 20,
                force: false,
            },
        )?;
        eprintln!("created {} (1 partition)", path.display());
    }
    let mut s = Store::open(path)?;
    if s.token(PRINCIPAL).is_err()
        || !s
            .layout()
            .rights(0, principal_index(&s)?)
            .contains(Rights::READ_WRITE)
    {
        s.grant("0", PRINCIPAL, Rights::READ_WRITE)?;
        eprintln!(
            "granted principal {PRINCIPAL:?} rw on partition 0 of {}",
            path.display()
        );
    }
    let p = &s.layout().partitions[0];
    if p.size < ws {
        bail!(
            "partition 0 has {} bytes; the working set needs {ws}",
            p.size
        );
    }
    Ok((p.offset, s.token(PRINCIPAL)?))
}

fn principal_index(s: &Store) -> Result<u32> {
    Ok(s.layout()
        .principals
        .iter()
        .position(|p| p.name == PRINCIPAL)
        .unwrap_or(usize::MAX) as u32)
}

struct Run {
    ops: u64,
    secs: f64,
    /// Latencies (ns) of the small requests (mixed workload only).
    small_lat: Vec<u64>,
    /// Post-to-completion times (ns; `drive` only) of every
    /// [`SAMPLE`]th WR: from the post of its batch to the poll that
    /// returned it.
    lat: Vec<u64>,
    /// CPU seconds of this whole process per wall second over the run: the
    /// client, the engine's threads, and for remote runs the target too.
    cpu: f64,
}

/// WRs in flight `drive` can time: a WR's post time sits at its id modulo
/// this (`depth` is at most 32; a WR would have to stay in flight while
/// this many later ones complete for two to share a slot).
const TIMED: usize = 4096;

/// `drive` times one WR in this many: reading the clock twice per WR cost
/// 6-7% of the rate at a million 4 KiB requests a second (local, depth 1);
/// one in eight still gives thousands of samples per point.
const SAMPLE: u64 = 8;

/// Keeps `depth` WRs of `size` bytes outstanding on `qp` for
/// `dur`, walking the working set sequentially.
#[allow(clippy::too_many_arguments)]
fn drive(
    qp: &QueuePair,
    cq: &CompletionQueue,
    buf: &MemoryRegion,
    rkey: u32,
    op: Op,
    size: usize,
    depth: usize,
    ws: u64,
    dur: Duration,
) -> Result<Run> {
    let mut off = 0u64;
    let mut next = 0u64;
    let mut done = 0u64;
    let start = Instant::now();
    let mut wcs = vec![WorkCompletion::default(); 64];
    let mut stopping = false;
    let mut batch = Vec::with_capacity(depth);
    let mut posted = vec![start; TIMED];
    let mut lat = Vec::new();
    let cpu0 = crate::bench::cpu_secs(None);
    loop {
        // Refill the queue with one post (one doorbell), as an RDMA
        // application posts a list of work requests.
        while !stopping && (next - done) < depth as u64 {
            if off + size as u64 > ws {
                off = 0;
            }
            let slot = (next % depth as u64) as usize;
            let sge = buf.sge(slot * size, size);
            batch.push(match op {
                Op::Write => SendWr::write(next, &[sge], off, softrdma_verbs::Rkey::from_raw(rkey)),
                Op::Read => SendWr::read(next, sge, off, softrdma_verbs::Rkey::from_raw(rkey)),
            });
            off += size as u64;
            next += 1;
        }
        if !batch.is_empty() {
            let mut t = None;
            for w in batch.iter().filter(|w| w.wr_id % SAMPLE == 0) {
                posted[w.wr_id as usize % TIMED] = *t.get_or_insert_with(Instant::now);
            }
            qp.post_send_batch(&batch)?;
            batch.clear();
        }
        if next == done {
            break;
        }
        let mut n = cq.poll(&mut wcs);
        if n == 0 {
            match cq.wait_one(T) {
                Some(wc) => {
                    wcs[0] = wc;
                    n = 1;
                }
                None => bail!("no completion for {T:?}"),
            }
        }
        let mut now = None;
        for wc in &wcs[..n] {
            if wc.status != WcStatus::Success {
                bail!("WR {} failed: {:?}", wc.wr_id, wc.status);
            }
            if wc.wr_id % SAMPLE == 0 {
                let now = *now.get_or_insert_with(Instant::now);
                lat.push((now - posted[wc.wr_id as usize % TIMED]).as_nanos() as u64);
            }
        }
        done += n as u64;
        if start.elapsed() >= dur {
            stopping = true;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(Run {
        ops: done,
        secs,
        small_lat: Vec::new(),
        lat,
        cpu: cpu_per_sec(cpu0, secs),
    })
}

/// The mixed workload (see its caller): pairs of a 1 MiB and a 4 KiB
/// Write, the small one's latency measured from when the pair was issued.
fn mixed(
    qp: &QueuePair,
    cq: &CompletionQueue,
    buf: &MemoryRegion,
    rkey: u32,
    op: Op,
    ws: u64,
    dur: Duration,
) -> Result<Run> {
    let wr = |id: u64, sge: Sge, to: u64| match op {
        Op::Write => SendWr::write(id, &[sge], to, softrdma_verbs::Rkey::from_raw(rkey)),
        Op::Read => SendWr::read(id, sge, to, softrdma_verbs::Rkey::from_raw(rkey)),
    };
    const BIG: usize = 1 << 20;
    const SMALL: usize = 4096;
    let slots = 16;
    let start = Instant::now();
    let (mut next, mut done, mut big_out) = (0u64, 0u64, 0usize);
    let mut off = 0u64;
    let mut small_lat = Vec::new();
    let cpu0 = crate::bench::cpu_secs(None);
    let take = |wc: WorkCompletion, big_out: &mut usize, small_seen: &mut bool| -> Result<()> {
        if wc.status != WcStatus::Success {
            bail!("WR {} failed: {:?}", wc.wr_id, wc.status);
        }
        if wc.wr_id.is_multiple_of(2) {
            *big_out -= 1;
        } else {
            *small_seen = true;
        }
        Ok(())
    };
    while start.elapsed() < dur {
        let mut small_seen = false;
        while big_out >= slots {
            let wc = cq.wait_one(T).context("no completion")?;
            take(wc, &mut big_out, &mut small_seen)?;
            done += 1;
        }
        if off + (BIG + SMALL) as u64 > ws {
            off = 0;
        }
        let slot = (next / 2) as usize % slots;
        let t0 = Instant::now();
        qp.post_send(&wr(next, buf.sge(slot * BIG, BIG), off))?;
        qp.post_send(&wr(next + 1, buf.sge(slots * BIG, SMALL), off + BIG as u64))?;
        big_out += 1;
        next += 2;
        off += (BIG + SMALL) as u64;
        while !small_seen {
            let wc = cq.wait_one(T).context("no completion")?;
            take(wc, &mut big_out, &mut small_seen)?;
            done += 1;
        }
        small_lat.push(t0.elapsed().as_nanos() as u64);
    }
    while done < next {
        let wc = cq.wait_one(T).context("no completion")?;
        let mut s = false;
        take(wc, &mut big_out, &mut s)?;
        done += 1;
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(Run {
        ops: done,
        secs,
        small_lat,
        lat: Vec::new(),
        cpu: cpu_per_sec(cpu0, secs),
    })
}

/// fio with io_uring on the same bytes: (GB/s, IOPS).
#[allow(clippy::too_many_arguments)]
fn fio(
    path: &Path,
    offset: u64,
    ws: u64,
    op: Op,
    size: usize,
    depth: usize,
    dur: Duration,
    direct: bool,
) -> Result<(f64, f64)> {
    let rw = if op == Op::Write { "write" } else { "read" };
    let v = crate::fio::job(&[
        "--name=softrdma".into(),
        format!("--filename={}", path.display()),
        format!("--offset={offset}"),
        format!("--size={ws}"),
        format!("--rw={rw}"),
        format!("--bs={size}"),
        format!("--iodepth={depth}"),
        "--ioengine=io_uring".into(),
        if direct { "--direct=1" } else { "--direct=0" }.into(),
        "--time_based".into(),
        format!("--runtime={}ms", dur.as_millis()),
    ])?;
    let j = &v[rw];
    let bw = j["bw_bytes"].as_f64().unwrap_or(0.0);
    let iops = j["iops"].as_f64().unwrap_or(0.0);
    Ok((bw / 1e9, iops))
}

fn emit(o: &Opts, v: serde_json::Value) {
    if o.json {
        println!("{v}");
    } else {
        let s = |k: &str| {
            v.get(k)
                .map(|x| x.to_string())
                .unwrap_or_else(|| "-".into())
        };
        println!(
            "{:<12} {:>7} {:>5} {:<7} {:<6} {:>8} {:>9} {:>8} {:>5} {:>8} {:>6} {:>8}",
            s("op").trim_matches('"'),
            s("size"),
            s("depth"),
            s("ordering").trim_matches('"'),
            s("where").trim_matches('"'),
            s("gbps"),
            s("iops"),
            v.get("lat_us_p99")
                .or(v.get("small_lat_us_p99"))
                .map(|x| x.to_string())
                .unwrap_or_else(|| "-".into()),
            s("cpu"),
            s("fio_gbps"),
            s("ratio"),
            s("tcp_gbps"),
        );
    }
}

/// Cores busy in this process since `cpu0` (its CPU seconds then) over
/// `secs` of wall time; 0 where /proc cannot be read.
fn cpu_per_sec(cpu0: Option<f64>, secs: f64) -> f64 {
    match (cpu0, crate::bench::cpu_secs(None)) {
        (Some(a), Some(b)) if secs > 0.0 => (b - a) / secs,
        _ => 0.0,
    }
}

fn r3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

pub fn run(path: &Path, o: Opts) -> Result<()> {
    let ws = o.working_set;
    let (offset, token) = prepare(path, ws)?;
    let direct = if o.direct { Direct::On } else { Direct::Off };
    let ep = Arc::new(Endpoint::open_with(&path.to_string_lossy(), direct)?);
    if !o.json {
        println!(
            "{:<12} {:>7} {:>5} {:<7} {:<6} {:>8} {:>9} {:>8} {:>5} {:>8} {:>6} {:>8}",
            "op",
            "size",
            "depth",
            "order",
            "where",
            "GB/s",
            "IOPS",
            "p99 us",
            "CPU",
            "fio",
            "ratio",
            "tcp GB/s"
        );
    }
    // Local: QPs on the endpoint's protection domain.
    let dev = Device::open_default()?;
    let pd = dev.alloc_pd()?;
    let session = ep.attach(&pd, PRINCIPAL)?;
    let rkey = session.region(0).context("partition 0")?.rkey;
    let max_depth = 32;
    let buf = pd.alloc_mr(max_depth * (1 << 20), Access::LOCAL_WRITE)?;
    buf.write_at(0, &vec![0x5a; 1 << 20]);
    let local_qp = |relaxed: bool| -> Result<(QueuePair, CompletionQueue)> {
        let cq = dev.create_cq(1024)?;
        let mut a = QpInitAttr::new(&cq);
        a.relaxed_ordering = relaxed;
        a.caps.max_send_wr = 64;
        let qp = pd.create_qp(a)?;
        qp.connect_local()?;
        Ok((qp, cq))
    };
    // Remote: a target on loopback, a client device of its own.
    let target = Target::bind(ep.clone(), "127.0.0.1:0".parse()?).map_err(anyhow::Error::msg)?;
    let taddr = target.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let tstop = stop.clone();
    let th = std::thread::spawn(move || target.run(&tstop));
    let cdev = Device::open(DeviceConfig {
        same_host: false,
        ..Default::default()
    })?;
    let cpd = cdev.alloc_pd()?;
    let cbuf = cpd.alloc_mr(max_depth * (1 << 20), Access::LOCAL_WRITE)?;
    let remote_qp = |relaxed: bool| -> Result<(QueuePair, CompletionQueue, u32)> {
        let cq = cdev.create_cq(1024)?;
        let mut a = QpInitAttr::new(&cq);
        a.caps.max_send_wr = 64;
        let qp = cpd.create_qp(a)?;
        let regions = connect(&qp, &cq, taddr, &token, relaxed)?;
        Ok((qp, cq, regions[0].rkey))
    };
    // TCP baseline server.
    let tl = std::net::TcpListener::bind("127.0.0.1:0")?;
    let tcp_addr = tl.local_addr()?;
    std::thread::spawn(move || crate::bench::tcp::serve(tl));

    let sizes = [4096usize, 128 << 10];
    let mut tcp_gbps = std::collections::HashMap::new();
    for where_ in ["local", "remote"] {
        for op in [Op::Write, Op::Read] {
            for &size in &sizes {
                for depth in [1usize, 32] {
                    let row = Row { op, size, depth };
                    if !o.only.is_empty() && !o.only.contains(&row) {
                        continue;
                    }
                    let with_fio = o.fio && where_ == "local";
                    let fio_run = || fio(path, offset, ws, op, size, depth, o.duration, o.direct);
                    let mut fio_before = if with_fio { Some(fio_run()?) } else { None };
                    for repeat in 0..o.repeat {
                        let mut lines = Vec::new();
                        for relaxed in [false, true] {
                            let r = if where_ == "local" {
                                let (qp, cq) = local_qp(relaxed)?;
                                drive(&qp, &cq, &buf, rkey, op, size, depth, ws, o.duration)?
                            } else {
                                let (qp, cq, rk) = remote_qp(relaxed)?;
                                drive(&qp, &cq, &cbuf, rk, op, size, depth, ws, o.duration)?
                            };
                            let gbps = r.ops as f64 * size as f64 / r.secs / 1e9;
                            let (p50, p99, _) = crate::bench::percentiles(&r.lat);
                            let mut v = serde_json::json!({
                                "op": if op == Op::Write { "write" } else { "read" },
                                "size": size,
                                "depth": depth,
                                "ordering": if relaxed { "relaxed" } else { "strict" },
                                "where": where_,
                                "direct": o.direct,
                                "gbps": r3(gbps),
                                "iops": (r.ops as f64 / r.secs).round(),
                                "lat_us_p50": r3(p50),
                                "lat_us_p99": r3(p99),
                                "cpu": r3(r.cpu),
                            });
                            if o.repeat > 1 {
                                v["repeat"] = (repeat + 1).into();
                            }
                            if where_ == "remote" {
                                let t = match tcp_gbps.get(&size) {
                                    Some(t) => *t,
                                    None => {
                                        let (b, s) = crate::bench::tcp::pump(
                                            tcp_addr,
                                            size,
                                            0,
                                            Some(o.duration),
                                            1,
                                            false,
                                        )?;
                                        let t = b as f64 / s / 1e9;
                                        tcp_gbps.insert(size, t);
                                        t
                                    }
                                };
                                v["tcp_gbps"] = r3(t).into();
                                v["tcp_ratio"] = r3(gbps / t).into();
                            }
                            lines.push((v, gbps));
                        }
                        // fio again after the endpoint's runs when measuring
                        // in turn: each ratio is against both neighbours.
                        let fio_after = match fio_before {
                            Some(b) if o.repeat > 1 => Some((b, fio_run()?)),
                            Some(b) => Some((b, b)),
                            None => None,
                        };
                        for (mut v, gbps) in lines {
                            if let Some(((b, _), (a, _))) = fio_after {
                                let fg = (b + a) / 2.0;
                                v["fio_gbps"] = r3(fg).into();
                                if o.repeat > 1 {
                                    v["fio_gbps_before"] = r3(b).into();
                                    v["fio_gbps_after"] = r3(a).into();
                                }
                                v["ratio"] = r3(gbps / fg).into();
                            }
                            emit(&o, v);
                        }
                        fio_before = fio_after.map(|(_, a)| a);
                    }
                }
            }
        }
    }
    // Mixed sizes: the application issues a 1 MiB Write and a 4 KiB one
    // together and waits for the small one (up to 16 large ones stay in
    // flight). Strict: the small one completes after the large one;
    // relaxed: at once. `speedup` compares the small Writes' p50 latency.
    for op in [Op::Write, Op::Read] {
        if !o.only.is_empty() {
            break;
        }
        let mut strict_p50 = 0.0;
        for relaxed in [false, true] {
            let (qp, cq) = local_qp(relaxed)?;
            let r = mixed(&qp, &cq, &buf, rkey, op, ws, o.duration)?;
            let (p50, p99, _) = crate::bench::percentiles(&r.small_lat);
            let pairs = r.ops as f64 / 2.0;
            let gbps = pairs * (4096.0 + (1 << 20) as f64) / r.secs / 1e9;
            let mut v = serde_json::json!({
                            "op": if op == Op::Write { "write_mixed" } else { "read_mixed" },
                "size": "4K+1M",
                "depth": 32,
                "ordering": if relaxed { "relaxed" } else { "strict" },
                "where": "local",
            "direct": o.direct,
            "gbps": r3(gbps),
                "iops": (r.ops as f64 / r.secs).round(),
                "small_lat_us_p50": r3(p50),
                "small_lat_us_p99": r3(p99),
                "cpu": r3(r.cpu),
            });
            if relaxed {
                v["speedup"] = r3(strict_p50 / p50.max(1e-3)).into();
            } else {
                strict_p50 = p50;
            }
            emit(&o, v);
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = th.join();
    drop(session);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_parse_and_bad_ones_are_refused() {
        assert_eq!(
            Row::parse("read:128KiB:32").unwrap(),
            Row {
                op: Op::Read,
                size: 128 << 10,
                depth: 32
            }
        );
        assert_eq!(
            Row::parse("write:4096:1").unwrap(),
            Row {
                op: Op::Write,
                size: 4096,
                depth: 1
            }
        );
        for bad in [
            "read:128KiB",
            "read:64KiB:32",
            "read:4KiB:8",
            "copy:4KiB:1",
            "read:4KiB:1:2",
        ] {
            assert!(Row::parse(bad).is_err(), "{bad} accepted");
        }
    }
}
