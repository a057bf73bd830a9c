//! `softrdma storage`: initialise, show and administer a local persistent
//! store (a file or block device partitioned for RDMA access).

use anyhow::{Context, Result};
use clap::{Args as ClapArgs, Subcommand};
use softrdma_storage::layout::{Rights, META_LEN};
use softrdma_storage::{hex, parse_layout, parse_size, InitOptions, PartitionSpec, Store};
use std::path::PathBuf;

#[derive(ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Initialise PATH (a regular file, created or grown to --size, or a
    /// block device) as a store: superblock, partition table, no grants.
    Init {
        path: PathBuf,
        /// Store size (e.g. 1GiB); default: the device's or file's size.
        #[arg(long, value_parser = parse_size)]
        size: Option<u64>,
        /// N equal partitions.
        #[arg(long, conflicts_with = "layout")]
        partitions: Option<usize>,
        /// Unequal partitions: comma-separated `[NAME=]SIZE[@OFFSET]`,
        /// SIZE may be `rest` for the last (e.g. `meta=64MiB,data=rest`).
        #[arg(long)]
        layout: Option<String>,
        /// Partition alignment (power of two, at least 4KiB).
        #[arg(long, default_value = "1MiB", value_parser = parse_size)]
        align: u64,
        /// Overwrite an existing store or foreign data.
        #[arg(long)]
        force: bool,
    },
    /// Show the superblock, partitions and grants.
    Show {
        path: PathBuf,
        /// One JSON object.
        #[arg(long)]
        json: bool,
    },
    /// Give PRINCIPAL rights (r, w or rw) on PARTITION (index or name). A
    /// new principal gets a random token, printed once. A running target
    /// applies it to the next connection.
    Grant {
        path: PathBuf,
        partition: String,
        principal: String,
        rights: Rights,
    },
    /// Take rights (r, w or rw) on PARTITION away from PRINCIPAL. A running
    /// target narrows its live connections within about 20 ms (their next
    /// access without the right gets the protection Terminate).
    Revoke {
        path: PathBuf,
        partition: String,
        principal: String,
        rights: Rights,
    },
    /// Print PRINCIPAL's token (what its peers present when they connect).
    Token { path: PathBuf, principal: String },
    /// Serve the store as an iWARP storage target: peers connect with a
    /// principal's token in their MPA private data and RDMA-Write, Read
    /// and Flush its partitions (docs/storage.md). Runs until killed.
    Serve {
        path: PathBuf,
        /// TCP port (0: any; the line printed at start names it).
        #[arg(long, default_value_t = 7472)]
        port: u16,
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1")]
        bind: std::net::IpAddr,
        /// O_DIRECT for 4 KiB-aligned transfers: auto (block devices),
        /// on, off.
        #[arg(long, default_value = "auto", value_parser = ["auto", "on", "off"])]
        direct: String,
    },
    /// Benchmark the endpoint (local and through a target on loopback)
    /// against fio and a raw TCP pump in the same run. PATH: a store
    /// (principal "bench" gets rw on partition 0) or a new file (a 1 GiB
    /// store is created).
    Bench {
        path: PathBuf,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
        /// Seconds per measurement.
        #[arg(long, default_value_t = 1.5)]
        seconds: f64,
        /// Bytes of partition 0 to cycle over.
        #[arg(long, default_value = "256MiB", value_parser = parse_size)]
        working_set: u64,
        /// Skip fio.
        #[arg(long)]
        no_fio: bool,
        /// Bypass the page cache (endpoint with O_DIRECT, fio --direct=1).
        #[arg(long)]
        direct: bool,
        /// Only these rows, as OP:SIZE:DEPTH (e.g. `read:128KiB:32`), comma
        /// separated; the mixed workload runs only without this.
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// Measure each row this many times, fio and the endpoint in turn
        /// (fio, strict, relaxed, fio, ...): each ratio is against the
        /// mean of the fio runs just before and just after it, so a drift
        /// of the device's speed shows instead of skewing one side.
        #[arg(long, default_value_t = 1)]
        repeat: usize,
    },
}

pub fn run(a: Args) -> Result<()> {
    match a.cmd {
        Cmd::Init {
            path,
            size,
            partitions,
            layout,
            align,
            force,
        } => {
            let partitions = match (partitions, layout) {
                (_, Some(spec)) => {
                    PartitionSpec::Layout(parse_layout(&spec).map_err(anyhow::Error::msg)?)
                }
                (Some(n), None) => PartitionSpec::Equal(n),
                (None, None) => PartitionSpec::Equal(1),
            };
            let o = InitOptions {
                size,
                partitions,
                align,
                force,
            };
            let s = Store::init(&path, &o)?;
            println!(
                "initialised {}: store {}, {} bytes, {} partitions",
                path.display(),
                hex(&s.layout().store_id),
                s.layout().device_size,
                s.layout().partitions.len()
            );
            Ok(())
        }
        Cmd::Show { path, json } => {
            let s = Store::open(&path)?;
            if json {
                println!("{}", show_json(&s));
            } else {
                print!("{}", show_text(&s));
            }
            Ok(())
        }
        Cmd::Grant {
            path,
            partition,
            principal,
            rights,
        } => {
            let mut s = Store::open(&path)?;
            let token = s.grant(&partition, &principal, rights)?;
            print_rights(&s, &partition, &principal)?;
            if let Some(t) = token {
                println!("new principal {principal}, token {}", hex(&t));
            }
            Ok(())
        }
        Cmd::Revoke {
            path,
            partition,
            principal,
            rights,
        } => {
            let mut s = Store::open(&path)?;
            s.revoke(&partition, &principal, rights)?;
            print_rights(&s, &partition, &principal)
        }
        Cmd::Token { path, principal } => {
            let s = Store::open(&path)?;
            println!("{}", hex(&s.token(&principal)?));
            Ok(())
        }
        Cmd::Bench {
            path,
            json,
            seconds,
            working_set,
            no_fio,
            direct,
            only,
            repeat,
        } => crate::storage_bench::run(
            &path,
            crate::storage_bench::Opts {
                json,
                duration: std::time::Duration::from_secs_f64(seconds),
                working_set,
                fio: !no_fio,
                direct,
                only: only
                    .iter()
                    .map(|r| crate::storage_bench::Row::parse(r))
                    .collect::<Result<_>>()?,
                repeat: repeat.max(1),
            },
        ),
        Cmd::Serve {
            path,
            port,
            bind,
            direct,
        } => {
            use softrdma_storage::endpoint::{Direct, Endpoint, Target};
            let direct = match direct.as_str() {
                "on" => Direct::On,
                "off" => Direct::Off,
                _ => Direct::Auto,
            };
            let ep = std::sync::Arc::new(Endpoint::open_with(&path.to_string_lossy(), direct)?);
            let n = ep.store().layout().partitions.len();
            let d = ep.is_direct();
            let name = ep.name();
            let t = Target::bind(ep, std::net::SocketAddr::new(bind, port))
                .map_err(anyhow::Error::msg)
                .context("starting the storage target")?;
            println!(
                "serving {name} on {} ({n} partitions, {} I/O)",
                t.local_addr(),
                if d { "O_DIRECT" } else { "buffered" }
            );
            use std::io::Write;
            std::io::stdout().flush()?;
            t.run(&std::sync::atomic::AtomicBool::new(false));
            Ok(())
        }
    }
}

/// Prints what `principal` may now do on `partition`.
fn print_rights(s: &Store, partition: &str, principal: &str) -> Result<()> {
    let p = s.partition(partition)?;
    let q = s
        .layout()
        .principal(principal)
        .context("no such principal")?;
    println!("{principal} on partition {p}: {}", s.layout().rights(p, q));
    Ok(())
}

fn grants_of(s: &Store, p: u32) -> Vec<(String, Rights)> {
    let l = s.layout();
    l.grants
        .iter()
        .filter(|g| g.partition == p)
        .map(|g| (l.principals[g.principal as usize].name.clone(), g.rights))
        .collect()
}

fn show_json(s: &Store) -> serde_json::Value {
    let l = s.layout();
    let parts: Vec<_> = l
        .partitions
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let access: serde_json::Map<String, serde_json::Value> = grants_of(s, i as u32)
                .into_iter()
                .map(|(n, r)| (n, serde_json::Value::String(r.to_string())))
                .collect();
            serde_json::json!({
                "index": i, "name": p.name, "offset": p.offset, "size": p.size, "access": access,
            })
        })
        .collect();
    serde_json::json!({
        "path": s.path().display().to_string(),
        "store_id": hex(&l.store_id),
        "version": softrdma_storage::layout::VERSION,
        "generation": l.generation,
        "size": l.device_size,
        "device_len": s.device_len(),
        "block_device": s.is_block_device(),
        "align": l.align,
        "metadata_bytes": META_LEN,
        "damaged_copies": s.damaged_copies(),
        "partitions": parts,
        "principals": l.principals.iter().map(|p| p.name.clone()).collect::<Vec<_>>(),
    })
}

fn show_text(s: &Store) -> String {
    use std::fmt::Write;
    let l = s.layout();
    let mut o = String::new();
    let _ = writeln!(
        o,
        "store {} (format {}, generation {}) on {}{}",
        hex(&l.store_id),
        softrdma_storage::layout::VERSION,
        l.generation,
        s.path().display(),
        if s.is_block_device() {
            " (block device)"
        } else {
            ""
        }
    );
    let _ = writeln!(
        o,
        "size {} bytes, metadata {} bytes (two copies), alignment {}",
        l.device_size, META_LEN, l.align
    );
    for c in s.damaged_copies() {
        let _ = writeln!(
            o,
            "warning: metadata copy {c} is damaged; the other copy is in use"
        );
    }
    let _ = writeln!(
        o,
        "{:>5}  {:<16} {:>14} {:>14}  access",
        "part", "name", "offset", "size"
    );
    for (i, p) in l.partitions.iter().enumerate() {
        let acc: Vec<String> = grants_of(s, i as u32)
            .into_iter()
            .map(|(n, r)| format!("{n}:{r}"))
            .collect();
        let _ = writeln!(
            o,
            "{:>5}  {:<16} {:>#14x} {:>14}  {}",
            i,
            if p.name.is_empty() { "-" } else { &p.name },
            p.offset,
            p.size,
            if acc.is_empty() {
                "none".to_string()
            } else {
                acc.join(" ")
            }
        );
    }
    let names: Vec<&str> = l.principals.iter().map(|p| p.name.as_str()).collect();
    let _ = writeln!(
        o,
        "principals: {}",
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    );
    o
}
