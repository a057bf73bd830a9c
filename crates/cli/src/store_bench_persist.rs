//! `softrdma store bench-persist` (issue 33): the store's writes under
//! `persist = always` and `everysec` against Redis with one replica and
//! AOF (`appendonly yes`, `appendfsync always|everysec`, on both servers)
//! in the same run, and the device's own `fdatasync` rate (fio) as the
//! physical limit.
//!
//! For each policy: a group of two nodes, each logging to a partition of
//! its own store file in the work directory (a local queue pair), and a
//! Redis pair whose AOF files lie in the same directory. Each round, in
//! turn: Redis's GET, Redis's SET + `WAIT 1 0` (every write held by the
//! replica, as the store's is), the door's SET and GET (`redis-benchmark`
//! against the RESP door), then fio's 4 KiB writes each followed by
//! `fdatasync`. Rates with p50/p99 and the servers' CPU; the ratios'
//! median and range over the rounds.
//!
//! `--policies off,...` also measures a group that logs nothing against
//! Redis without AOF (no fio), the baseline that shows what the log
//! itself costs the door: the last line sets each logging policy's
//! median door SET and GET rates beside `off`'s of the same run.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Args as ClapArgs;
use softrdma_storage::layout::Rights;
use softrdma_storage::{InitOptions, PartitionSpec, Store};

use super::redis::{flush_door, measure_redis, measure_rounds, median_range, start_redis_with};
use super::{start_group_with, work_dir};

#[derive(ClapArgs)]
pub struct Args {
    /// Print one JSON object per line (else lines of text).
    #[arg(long)]
    json: bool,
    /// Policies to measure, comma-separated (`off` too: the baseline
    /// without a log, against Redis without AOF).
    #[arg(long, value_delimiter = ',', default_values_t = ["always".to_string(), "everysec".to_string()])]
    policies: Vec<String>,
    /// Value size in bytes.
    #[arg(long, default_value_t = 100)]
    size: usize,
    /// Concurrent clients (`redis-benchmark -c`).
    #[arg(long, default_value_t = 16)]
    clients: usize,
    /// Seconds per measurement.
    #[arg(long, default_value_t = 3.0)]
    secs: f64,
    /// Rounds: Redis, the store and fio alternate this many times.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Arena size of the store's nodes.
    #[arg(long, default_value = "256MiB")]
    arena: String,
    /// Keep the nodes', Redis's and the stores' files here (default: a
    /// temporary directory, removed on success).
    #[arg(long)]
    workdir: Option<PathBuf>,
}

/// Each node's store: two snapshot slots of the arena and a log.
fn store_size(arena: u64) -> u64 {
    (2 * arena + (256 << 20)).div_ceil(1 << 20) * (1 << 20) + (4 << 20)
}

/// A new store for each of the two nodes in `dir` (`node<n>.store`: one
/// partition granted `rw` to principal `store`), and the `[persist]` table
/// of node `n`'s configuration naming it under `policy`.
pub(super) fn new_stores(
    dir: &std::path::Path,
    arena: u64,
    policy: softrdma_store::persist::Policy,
) -> Result<impl Fn(u32) -> String + '_> {
    for n in 1..=2 {
        // A new store each run (a kept one would hold the last run's
        // group, which its nodes would recover).
        let path = dir.join(format!("node{n}.store"));
        // (`init --force` keeps the partitions' bytes.)
        let _ = std::fs::remove_file(&path);
        Store::init(
            &path,
            &InitOptions {
                size: Some(store_size(arena)),
                partitions: PartitionSpec::Equal(1),
                align: 1 << 20,
                force: false,
            },
        )?;
        Store::open(&path)?.grant("0", "store", Rights::READ_WRITE)?;
    }
    Ok(move |n: u32| {
        format!(
            "[persist]\nstorage = \"{}\"\npartition = 0\nprincipal = \"store\"\npolicy = \"{policy}\"\n",
            dir.join(format!("node{n}.store")).display()
        )
    })
}

pub fn run(a: Args) -> Result<()> {
    if a.rounds == 0 || a.clients == 0 || !(a.secs.is_finite() && a.secs > 0.0) {
        bail!("--rounds, --clients and --secs must be positive");
    }
    let arena = softrdma_store::config::parse_size(&a.arena)
        .map_err(|e| anyhow::anyhow!("--arena: {e}"))?;
    let dir = work_dir(a.workdir.as_deref(), "softrdma-bench-persist")?;
    let t0 = Instant::now();
    let say = |m: String| eprintln!("[{:6.1} s] {m}", t0.elapsed().as_secs_f64());
    let mut policies = Vec::new();
    for policy in &a.policies {
        let policy: softrdma_store::persist::Policy = policy.parse().map_err(anyhow::Error::msg)?;
        policies.push(policy);
    }
    // Per policy: the door's median SET and GET rates.
    let mut medians = Vec::new();
    for policy in policies {
        let pdir = dir.join(policy.to_string());
        std::fs::create_dir_all(&pdir)?;
        let no_log = |_: u32| String::new();
        let tables: Box<dyn Fn(u32) -> String + '_> = if policy.logs() {
            Box::new(new_stores(&pdir, arena, policy)?)
        } else {
            Box::new(no_log)
        };
        let group = start_group_with(&pdir, &a.arena, true, &*tables)?;
        say(format!("store group persisting {policy}, redundant"));
        let aof: Vec<String> = if policy.logs() {
            ["--appendonly", "yes", "--appendfsync", &policy.to_string()]
                .map(String::from)
                .into()
        } else {
            ["--appendonly", "no"].map(String::from).into()
        };
        let redis = start_redis_with(&pdir, &aof)?;
        let redis_name = if policy.logs() {
            format!("Redis appendfsync {policy}")
        } else {
            "Redis without AOF".to_string()
        };
        say(format!("{redis_name}, with one replica"));
        // The number of requests that lasts about --secs, from a first
        // measure of Redis's GET.
        let n = measure_redis(&redis, a.size, a.clients, a.secs)?.n;
        flush_door(group.resp, group.password.as_deref())?;
        let pids = [
            group.procs.first().map(|p| p.child.id()),
            group.procs.get(1).map(|p| p.child.id()),
        ];
        let rounds = measure_rounds(
            &redis,
            group.resp,
            group.password.as_deref(),
            a.size,
            a.clients,
            n,
            a.secs,
            a.rounds,
            &pids,
        )?;
        let mut fio = Vec::new();
        for _ in 0..if policy.logs() { a.rounds } else { 0 } {
            let (iops, p99, cpu) = crate::store_bench_log::fio_sync(
                &pdir.join("fio-sync.dat"),
                4096,
                Duration::from_secs_f64(a.secs),
            )?;
            fio.push((iops, p99, cpu));
        }
        let (set, set_range) = median_range(&rounds.set_wait);
        let (get, get_range) = median_range(&rounds.get);
        let door_sets: Vec<f64> = rounds.each.iter().map(|r| r.door_set.ops_per_s).collect();
        let door_gets: Vec<f64> = rounds.each.iter().map(|r| r.door_get.ops_per_s).collect();
        let (door_set, _) = median_range(&door_sets);
        let (door_get, _) = median_range(&door_gets);
        medians.push((policy, door_set, door_get));
        if a.json {
            for (i, r) in rounds.each.iter().enumerate() {
                let mut j = r.json("resp_set");
                j["policy"] = policy.to_string().into();
                if let Some(f) = fio.get(i) {
                    j["fio_fdatasync_per_s"] = f.0.into();
                    j["fio_p99_us"] = f.1.into();
                }
                println!("{j}");
            }
        } else {
            let device = if fio.is_empty() {
                String::new()
            } else {
                let fio_rates: Vec<f64> = fio.iter().map(|f| f.0).collect();
                let (fio_rate, _) = median_range(&fio_rates);
                format!(
                    "; door SET {door_set:.0}/s against fio 4 KiB fdatasync {fio_rate:.0}/s \
                     ({:.1} writes per flush at the device's rate)",
                    door_set / fio_rate.max(1e-9)
                )
            };
            println!(
                "persist {policy}: door SET {set:.2}x {redis_name} SET+WAIT \
                 (median, {set_range}); GET {get:.2}x Redis GET ({get_range}){device}"
            );
            for (i, r) in rounds.each.iter().enumerate() {
                let fio = fio.get(i).map_or(String::new(), |f| {
                    format!("; fio {:.0}/s p99 {:.0} us (CPU {:.2})", f.0, f.1, f.2)
                });
                println!("  round {}: {}{fio}", i + 1, r.describe());
            }
        }
        drop(redis);
        drop(group);
    }
    let off = medians.iter().find(|m| !m.0.logs()).copied();
    if let (Some((_, off_set, off_get)), false) = (off, a.json) {
        for &(policy, set, get) in medians.iter().filter(|m| m.0.logs()) {
            println!(
                "{policy} against off (medians of each one's rounds, run one after the \
                 other): door SET {:.2}x, GET {:.2}x",
                set / off_set.max(1e-9),
                get / off_get.max(1e-9)
            );
        }
    }
    if a.workdir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}
