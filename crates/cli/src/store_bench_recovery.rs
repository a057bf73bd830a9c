//! `softrdma store bench-recovery` (issue 33): how fast a group killed
//! whole comes back, against the device's sequential read bandwidth.
//!
//! A group of two nodes persisting to a store file each (a local queue
//! pair) is filled with values (4 KiB by default) until its arena is
//! nearly full, waits until both logs hold every write, and both nodes are
//! killed with SIGKILL. fio then reads node 1's store file sequentially
//! (O_DIRECT, 128 KiB at depth 32, as recovery reads) for the device's
//! bandwidth; both nodes are started again, and the time from their
//! processes' start to a primary serving (a key read back) is the
//! recovery time. The rate is the arena's allocated bytes over that time,
//! and the ratio is against fio's (the target: at least 0.5x). Each
//! node's CPU from its start to serving (a share of a core) is printed
//! beside it.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;
use softrdma_store::net::client::StoreClient;
use softrdma_store::proto::{StatusInfo, ROLE_PRIMARY};

use super::{start_group_with, work_dir};

#[derive(ClapArgs)]
pub struct Args {
    /// Print one JSON object (else lines of text).
    #[arg(long)]
    json: bool,
    /// Arena size of the nodes.
    #[arg(long, default_value = "1GiB")]
    arena: String,
    /// Value size in bytes.
    #[arg(long, default_value_t = 4096)]
    size: usize,
    /// Fill the arena up to this fraction.
    #[arg(long, default_value_t = 0.9)]
    fill: f64,
    /// The policy the group persists under while it is filled.
    #[arg(long, default_value = "everysec")]
    policy: String,
    /// Writing client threads.
    #[arg(long, default_value_t = 4)]
    threads: usize,
    /// Keep the nodes' files here (default: a temporary directory, removed
    /// on success).
    #[arg(long)]
    workdir: Option<PathBuf>,
}

fn statuses(c: &mut StoreClient) -> Vec<StatusInfo> {
    c.status_all()
        .into_iter()
        .filter_map(|(_, r)| r.ok())
        .collect()
}

/// fio's sequential O_DIRECT read of `file` (128 KiB at depth 32):
/// (MiB/s, p99 completion latency in µs, CPU).
fn fio_read(file: &std::path::Path, size: u64) -> Result<(f64, f64, f64)> {
    let j = crate::fio::job(&[
        "--name=softrdma-recovery".into(),
        format!("--filename={}", file.display()),
        format!("--size={size}"),
        "--rw=read".into(),
        "--bs=128k".into(),
        "--iodepth=32".into(),
        "--ioengine=libaio".into(),
        "--direct=1".into(),
    ])?;
    let bw = j["read"]["bw_bytes"].as_f64().context("fio: read bw")? / (1 << 20) as f64;
    Ok((
        bw,
        crate::fio::p99_us(&j["read"]["clat_ns"]),
        crate::fio::cpu(&j),
    ))
}

pub fn run(a: Args) -> Result<()> {
    if a.threads == 0 || a.size == 0 || !(a.fill > 0.0 && a.fill <= 1.0) {
        bail!("--threads and --size must be positive, --fill in (0, 1]");
    }
    let policy: softrdma_store::persist::Policy = a.policy.parse().map_err(anyhow::Error::msg)?;
    if !policy.logs() {
        bail!("--policy: always or everysec");
    }
    let arena = softrdma_store::config::parse_size(&a.arena)
        .map_err(|e| anyhow::anyhow!("--arena: {e}"))?;
    let dir = work_dir(a.workdir.as_deref(), "softrdma-bench-recovery")?;
    let t0 = Instant::now();
    let say = |m: String| eprintln!("[{:6.1} s] {m}", t0.elapsed().as_secs_f64());
    let tables = super::persist::new_stores(&dir, arena, policy)?;
    let mut group = start_group_with(&dir, &a.arena, true, &tables)?;
    say(format!("group persisting {policy}, redundant; filling"));
    let target = (arena as f64 * a.fill) as u64;
    let written = std::sync::atomic::AtomicU64::new(0);
    let value = vec![0x5au8; a.size];
    std::thread::scope(|s| -> Result<()> {
        let mut hs = Vec::new();
        for t in 0..a.threads {
            let cfg = group.client_config();
            let (written, value) = (&written, &value);
            hs.push(s.spawn(move || -> Result<()> {
                let mut c = StoreClient::new(cfg)?;
                for i in 0u64.. {
                    if i % 256 == 0 {
                        let used = statuses(&mut c).iter().map(|s| s.allocated).max();
                        if used.unwrap_or(0) >= target {
                            return Ok(());
                        }
                    }
                    match c.set(format!("t{t}-{i}").as_bytes(), value) {
                        Ok(_) => {
                            written.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        }
                        Err(e) if e.to_string().contains("full") => return Ok(()),
                        Err(e) => return Err(e.into()),
                    }
                }
                Ok(())
            }));
        }
        for h in hs {
            h.join().expect("writer thread")?;
        }
        Ok(())
    })?;
    let values = written.into_inner();
    let mut probe = StoreClient::new(group.client_config())?;
    // Both logs hold every write.
    let deadline = Instant::now() + Duration::from_secs(180);
    let mut told = Instant::now();
    let before = loop {
        let st = statuses(&mut probe);
        if st.len() == 2 && st.iter().all(|s| s.durable_seq == s.applied_seq) {
            break st;
        }
        if Instant::now() > deadline {
            bail!("the logs did not catch up: {st:?}");
        }
        if told.elapsed() > Duration::from_secs(5) {
            told = Instant::now();
            let d: Vec<String> = st
                .iter()
                .map(|s| format!("node {} {}/{}", s.node, s.durable_seq, s.applied_seq))
                .collect();
            say(format!("logs catching up: {}", d.join(", ")));
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let allocated = before.iter().map(|s| s.allocated).max().unwrap_or(0);
    say(format!(
        "{values} values of {} bytes, {} MiB allocated; killing both nodes",
        a.size,
        allocated >> 20
    ));
    for p in &mut group.procs {
        let _ = p.child.kill();
        let _ = p.child.wait();
    }
    let store = dir.join("node1.store");
    let (fio_bw, fio_p99, fio_cpu) = fio_read(&store, std::fs::metadata(&store)?.len())?;
    say(format!(
        "fio sequential O_DIRECT read: {fio_bw:.0} MiB/s; restarting"
    ));
    let start = Instant::now();
    let (serving, primary, node_cpu) = group.restart_then(&dir, |pids| {
        let deadline = start + Duration::from_secs(300);
        loop {
            let st = statuses(&mut probe);
            if let Some(p) = st.iter().find(|s| s.role == ROLE_PRIMARY) {
                if probe.get(b"t0-0")?.is_some() {
                    let serving = start.elapsed();
                    // Each node's CPU from its start to serving, as a
                    // share of a core over that time.
                    let cpu: Vec<f64> = pids
                        .iter()
                        .map(|&pid| {
                            crate::bench::cpu_secs(Some(pid)).unwrap_or(f64::NAN)
                                / serving.as_secs_f64()
                        })
                        .collect();
                    return Ok((serving, p.clone(), cpu));
                }
            }
            if Instant::now() > deadline {
                bail!("no primary served within 300 s: {st:?}");
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    })?;
    let ready = start.elapsed();
    say(format!(
        "a primary serving after {:.2} s (both nodes ready after {:.2} s)",
        serving.as_secs_f64(),
        ready.as_secs_f64()
    ));
    if primary.applied_seq < before[0].applied_seq.min(before[1].applied_seq) {
        bail!("recovered through write {} only", primary.applied_seq);
    }
    let rate = allocated as f64 / (1 << 20) as f64 / serving.as_secs_f64();
    let ratio = rate / fio_bw.max(1e-9);
    if a.json {
        println!(
            "{}",
            serde_json::json!({
                "arena": arena, "values": values, "value_size": a.size,
                "allocated": allocated, "policy": policy.to_string(),
                "recovery_s": serving.as_secs_f64(), "recovery_mib_per_s": rate,
                "fio_read_mib_per_s": fio_bw, "fio_p99_us": fio_p99, "fio_cpu": fio_cpu,
                "ratio": ratio, "node_cpu": node_cpu,
            })
        );
    } else {
        println!(
            "recovery of a {} MiB arena ({values} values of {} bytes, {} MiB allocated): \
             process start to serving in {:.2} s, {rate:.0} MiB/s = {ratio:.2}x fio sequential \
             O_DIRECT read {fio_bw:.0} MiB/s (128 KiB, depth 32; p99 {fio_p99:.0} us, CPU {fio_cpu:.2}); \
             nodes' CPU until then {:.2} / {:.2}",
            arena >> 20,
            a.size,
            allocated >> 20,
            serving.as_secs_f64(),
            node_cpu[0],
            node_cpu[1]
        );
    }
    drop(group);
    if a.workdir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}
