//! `softrdma store bench-log`: the store's durable log (issue 33) on a
//! storage endpoint against the device's own synchronous write rate.
//!
//! Creates a store file (or uses `--workdir`'s), opens its partition as a
//! log device through a local QP (`storage:PATH`, no network) and through
//! a storage target on loopback (`remote`: RDMA Writes and a Flush over
//! iWARP/TCP, or the same-host transport unless `SOFTRDMA_SAME_HOST=0`),
//! and for each record size and batch measures commits: `batch` records
//! appended, then one commit (their blocks written, one Flush, which the
//! endpoint turns into `fdatasync`). Batch 1 is what `persist = always`
//! costs a lone writer; larger batches are group commit under load.
//!
//! The baseline is `fio` on a file beside the store, in the same run:
//! `--rw=write --fdatasync=1 --ioengine=sync` with the block size one
//! commit writes: the device's physical limit for durable writes of that
//! size. Each row alternates ours and fio's `--rounds` times (a shared
//! host's disk drifts over seconds) and sums them. Rows carry commits and
//! records per second, MB/s, the commit's p50 and p99, and this process's
//! CPU (the remote rows' target runs in this process too).

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;
use softrdma_storage::endpoint::{Endpoint, Target};
use softrdma_storage::layout::Rights;
use softrdma_storage::{InitOptions, PartitionSpec, Store};
use softrdma_store::persist::log::{zero_fill, LogStart, LogWriter, BLOCK};
use softrdma_store::persist::qp_device::QpDevice;
use softrdma_store::persist::record;

use crate::store_bench::work_dir;

#[derive(ClapArgs)]
pub struct Args {
    /// Print one JSON object per line (else a table).
    #[arg(long)]
    json: bool,
    /// Record payload sizes in bytes, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [100usize, 4096])]
    sizes: Vec<usize>,
    /// Records per commit, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = [1usize, 16, 256])]
    batches: Vec<usize>,
    /// Seconds per row, ours (fio takes as long again).
    #[arg(long, default_value_t = 2.0)]
    secs: f64,
    /// Rounds: ours and fio alternate this many times per row.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Leave fio out.
    #[arg(long)]
    no_fio: bool,
    /// Do not write the partition with zeros first (a new store file is
    /// sparse: commits into its holes also commit the file system's
    /// journal).
    #[arg(long)]
    no_zero_fill: bool,
    /// Keep the store file here (default: a temporary directory, removed
    /// on success).
    #[arg(long)]
    workdir: Option<PathBuf>,
}

const PRINCIPAL: &str = "bench-log";
const STORE_SIZE: u64 = 256 << 20;

struct Run {
    commits: u64,
    records: u64,
    bytes: u64,
    secs: f64,
    lat_ns: Vec<u64>,
    cpu: f64,
}

fn measure<D: softrdma_store::persist::LogDevice>(
    w: &mut LogWriter<D>,
    size: usize,
    batch: usize,
    dur: Duration,
) -> Result<Run> {
    let payload = vec![0x5au8; size];
    let need = (batch * record::record_size(size)) as u64 + 2 * BLOCK;
    let mut lat_ns = Vec::new();
    let (mut commits, mut records) = (0u64, 0u64);
    let cpu0 = crate::bench::cpu_secs(None);
    let start = Instant::now();
    while start.elapsed() < dur {
        if w.free() < need {
            // What a snapshot does: the records before here are no longer
            // needed.
            let pos = w.position();
            w.release(pos);
        }
        let t = Instant::now();
        for _ in 0..batch {
            w.append(&payload)?;
        }
        w.commit()?;
        lat_ns.push(t.elapsed().as_nanos() as u64);
        commits += 1;
        records += batch as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    let cpu = match (cpu0, crate::bench::cpu_secs(None)) {
        (Some(a), Some(b)) => (b - a) / secs,
        _ => 0.0,
    };
    Ok(Run {
        commits,
        records,
        bytes: records * size as u64,
        secs,
        lat_ns,
        cpu,
    })
}

/// fio's synchronous writes of `bs` bytes, each followed by `fdatasync`:
/// (writes/s, p99 of the sync in us, CPU).
pub(crate) fn fio_sync(file: &std::path::Path, bs: u64, dur: Duration) -> Result<(f64, f64, f64)> {
    let j = crate::fio::job(&[
        "--name=softrdma-log".into(),
        format!("--filename={}", file.display()),
        "--size=64M".into(),
        "--rw=write".into(),
        format!("--bs={bs}"),
        "--fdatasync=1".into(),
        "--ioengine=sync".into(),
        "--time_based".into(),
        format!("--runtime={}ms", dur.as_millis().max(1)),
    ])?;
    let iops = j["write"]["iops"].as_f64().context("fio: write iops")?;
    Ok((
        iops,
        crate::fio::p99_us(&j["sync"]["lat_ns"]),
        crate::fio::cpu(&j),
    ))
}

pub fn run(a: Args) -> Result<()> {
    if a.rounds == 0 || a.sizes.is_empty() || a.batches.is_empty() {
        bail!("--rounds, --sizes and --batches need at least one each");
    }
    let dir = work_dir(a.workdir.as_deref(), "softrdma-bench-log")?;
    let path = dir.join("log.store");
    if !path.exists() {
        Store::init(
            &path,
            &InitOptions {
                size: Some(STORE_SIZE),
                partitions: PartitionSpec::Equal(1),
                align: 1 << 20,
                force: false,
            },
        )?;
    }
    let mut s = Store::open(&path)?;
    s.grant("0", PRINCIPAL, Rights::READ_WRITE)?;
    let token = s.token(PRINCIPAL)?;
    let name = format!("storage:{}", path.display());
    let fio_file = dir.join("fio-sync.dat");

    let ep = Arc::new(Endpoint::open(&name)?);
    let target = Target::bind(ep, "127.0.0.1:0".parse()?).map_err(anyhow::Error::msg)?;
    let addr = target.local_addr();
    let stop = Arc::new(AtomicBool::new(false));
    let tstop = stop.clone();
    let th = std::thread::spawn(move || target.run(&tstop));

    if !a.json {
        println!(
            "{:<7} {:>6} {:>6} {:>10} {:>11} {:>8} {:>8} {:>8} {:>5} | {:>7} {:>10} {:>8} {:>5} {:>6}",
            "where", "size", "batch", "commits/s", "records/s", "MB/s", "p50 us", "p99 us", "CPU",
            "fio bs", "fsyncs/s", "p99 us", "CPU", "ratio"
        );
    }
    let dur = Duration::from_secs_f64(a.secs / a.rounds as f64);
    for where_ in ["local", "remote"] {
        let dev = match where_ {
            "local" => QpDevice::local(&name, PRINCIPAL, 0)?,
            _ => QpDevice::remote(addr, &token, 0)?,
        };
        let mut dev = dev;
        if where_ == "local" && !a.no_zero_fill {
            // A node formats its partition once; a sparse store file's
            // holes would make each commit's fdatasync a journal commit.
            zero_fill(&mut dev)?;
        }
        let id = (std::process::id() << 8) ^ where_.len() as u32;
        let (mut w, _) = LogWriter::open(dev, LogStart::fresh(id), |_, _| {})?;
        for &size in &a.sizes {
            for &batch in &a.batches {
                let bs = ((batch * record::record_size(size)) as u64).div_ceil(BLOCK) * BLOCK;
                let mut ours = Vec::new();
                let mut fio = Vec::new();
                for _ in 0..a.rounds {
                    ours.push(measure(&mut w, size, batch, dur)?);
                    if !a.no_fio {
                        fio.push(fio_sync(&fio_file, bs, dur)?);
                    }
                }
                let secs: f64 = ours.iter().map(|r| r.secs).sum();
                let commits: u64 = ours.iter().map(|r| r.commits).sum();
                let records: u64 = ours.iter().map(|r| r.records).sum();
                let bytes: u64 = ours.iter().map(|r| r.bytes).sum();
                let cpu = ours.iter().map(|r| r.cpu * r.secs).sum::<f64>() / secs;
                let lat: Vec<u64> = ours.iter().flat_map(|r| r.lat_ns.iter().copied()).collect();
                let (p50, p99, _) = crate::bench::percentiles(&lat);
                let n = fio.len().max(1) as f64;
                let fio_rate = fio.iter().map(|f| f.0).sum::<f64>() / n;
                let fio_p99 = fio.iter().map(|f| f.1).fold(0.0, f64::max);
                let fio_cpu = fio.iter().map(|f| f.2).sum::<f64>() / n;
                let rate = commits as f64 / secs;
                let ratio = (!fio.is_empty()).then(|| rate / fio_rate.max(1e-9));
                let r3 = |x: f64| (x * 1000.0).round() / 1000.0;
                if a.json {
                    println!(
                        "{}",
                        serde_json::json!({
                            "where": where_,
                            "record_size": size,
                            "batch": batch,
                            "commits_per_s": r3(rate),
                            "records_per_s": r3(records as f64 / secs),
                            "mb_per_s": r3(bytes as f64 / secs / 1e6),
                            "commit_p50_us": r3(p50),
                            "commit_p99_us": r3(p99),
                            "cpu": r3(cpu),
                            "fio_bs": bs,
                            "fio_fdatasync_per_s": (!fio.is_empty()).then(|| r3(fio_rate)),
                            "fio_sync_p99_us": (!fio.is_empty()).then(|| r3(fio_p99)),
                            "fio_cpu": (!fio.is_empty()).then(|| r3(fio_cpu)),
                            "ratio": ratio.map(r3),
                            "rounds": a.rounds,
                            "same_host": softrdma_verbs::same_host_default(),
                        })
                    );
                } else {
                    let opt = |x: Option<f64>, p: usize| {
                        x.map_or("-".to_string(), |v| format!("{v:.p$}"))
                    };
                    println!(
                        "{:<7} {:>6} {:>6} {:>10.0} {:>11.0} {:>8.1} {:>8.0} {:>8.0} {:>5.2} | {:>7} {:>10} {:>8} {:>5} {:>6}",
                        where_,
                        size,
                        batch,
                        rate,
                        records as f64 / secs,
                        bytes as f64 / secs / 1e6,
                        p50,
                        p99,
                        cpu,
                        bs,
                        opt((!fio.is_empty()).then_some(fio_rate), 0),
                        opt((!fio.is_empty()).then_some(fio_p99), 0),
                        opt((!fio.is_empty()).then_some(fio_cpu), 2),
                        opt(ratio, 2),
                    );
                }
            }
        }
    }
    stop.store(true, Ordering::SeqCst);
    let _ = th.join();
    let _ = std::fs::remove_file(&fio_file);
    if a.workdir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}
