//! `softrdma`: the command-line front end of the softrdma system.

#![deny(unsafe_code)]

use clap::{Parser, Subcommand};

mod bench;
#[allow(unsafe_code)]
mod child;
mod cmatose;
mod demo;
mod fio;
#[allow(unsafe_code)]
mod heap;
mod info;
#[allow(unsafe_code)]
mod malloc;
mod net;
mod oneshot;
mod resp_wait;
mod rping;
mod run;
#[allow(unsafe_code)]
mod signals;
mod storage;
mod storage_bench;
mod store;
mod store_admin;
mod store_bench;
mod store_bench_large;
mod store_bench_log;
mod store_coord;
mod store_load;
mod transfer;

#[derive(Parser)]
#[command(
    name = "softrdma",
    version,
    about = "Software RDMA (iWARP over TCP) and the services on top of it"
)]
struct Cli {
    /// More log output (-v info, -vv debug, -vvv trace). RUST_LOG overrides.
    #[arg(short = 'v', long = "log-verbose", action = clap::ArgAction::Count, global = true)]
    log: u8,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Show softrdma devices of running processes, with their QPs and MRs
    /// (like `rdma resource show`).
    Info(info::Args),
    /// rping-compatible ping over RDMA Send / Read / Write (rdma-core's
    /// rping protocol; interoperates with rping on Linux siw).
    Rping(rping::Args),
    /// ucmatose-compatible Send exchange (rdma-core's cmatose protocol;
    /// interoperates with ucmatose on Linux siw, any message size).
    Cmatose(cmatose::Args),
    /// perftest-style benchmarks (write/read/send bandwidth and latency,
    /// idle QPs) with a raw TCP baseline measured in the same run.
    Bench(bench::Args),
    /// The highly available remote memory store: serve a node, run the
    /// embedded coordinator, client operations, status, a verifying
    /// workload.
    Store(store::Args),
    /// Local persistent storage as an RDMA endpoint: initialise a file or
    /// block device with partitions, show it, grant and revoke access.
    Storage(storage::Args),
    /// The transfer planner: divides and coalesces transfers into WRs
    /// within the device's limits (`bench` compares it with one WR per
    /// buffer).
    Transfer(transfer::Args),
    /// The registered-memory heap shared by several processes: create,
    /// show (checks the shared table), unlink, bench (cached registrations
    /// against registering each allocation).
    Heap(heap::Args),
    /// The main demo: a primary, a secondary and a verifying client load;
    /// the primary is killed half-way, the secondary takes over, the old
    /// node rejoins; prints `lost writes: N` (must be 0). About 20 s.
    Demo(demo::Args),
    /// Run an unmodified RDMA application (rping, perftest, qperf, ...) on
    /// softrdma's user-space libibverbs and librdmacm: no kernel module,
    /// no root (docs/libibverbs.md). `softrdma run -- rping -s -a 0.0.0.0`
    Run(run::Args),
}

fn main() {
    let cli = Cli::parse();
    let level = match cli.log {
        0 => "warn",
        1 => "info",
        2 => "debug",
        _ => "trace",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(level));
    if matches!(cli.cmd, Cmd::Demo(_)) {
        // The demo's terminal shows progress and the summary; its own log
        // lines (the expected connection reset when it kills the primary
        // among them) go to demo.log in its work directory.
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(false)
            .with_writer(demo::LogFile)
            .init();
    } else {
        // Colours only for a terminal: logs kept in files stay plain text.
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
            .with_writer(std::io::stderr)
            .init();
    }
    let res = match cli.cmd {
        Cmd::Info(a) => info::run(a),
        Cmd::Rping(a) => rping::run(a),
        Cmd::Cmatose(a) => cmatose::run(a),
        Cmd::Bench(a) => bench::run(a),
        Cmd::Store(a) => store::run(a),
        Cmd::Storage(a) => storage::run(a),
        Cmd::Transfer(a) => transfer::run(a),
        Cmd::Heap(a) => heap::run(a),
        Cmd::Demo(a) => demo::run(a),
        Cmd::Run(a) => run::run(a),
    };
    if let Err(e) = res {
        eprintln!("softrdma: error: {e:#}");
        std::process::exit(1);
    }
}
