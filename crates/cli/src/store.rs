//! `softrdma store ...`: serve a node, client operations, a workload.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::{Args as ClapArgs, Subcommand};
use hdrhistogram::Histogram;
use softrdma_store::config::{Config, HexU64, RoleHint};
use softrdma_store::net::client::{ClientConfig, ClientError, StoreClient};
use softrdma_store::net::server;
use softrdma_store::proto::StoreError;
use softrdma_store::ptr::RemotePtr;

#[derive(ClapArgs)]
pub struct Args {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run one node of a replica group.
    Serve(ServeArgs),
    /// Insert a value; prints its remote pointer.
    Put(OpArgs),
    /// Read the value at a remote pointer (one-sided RDMA Read).
    Get(OpArgs),
    /// Replace the value at a remote pointer; prints the (new) pointer.
    Update(OpArgs),
    /// Delete the value at a remote pointer.
    Del(OpArgs),
    /// Roles, epoch, arena use and redundancy of every node.
    Status(NodesArg),
    /// A verifying mixed workload (used by `softrdma demo` and the tests).
    Load(LoadArgs),
    /// Throughput and latency of insert/update/one-sided read against Redis
    /// (primary + replica) at the same concurrency (own group and Redis).
    Bench(crate::store_bench::Args),
    /// Checks a recorded history (JSON lines: key, client, call, ret,
    /// op "write"|"read", value; as the linearizability tests save them)
    /// against a register model; prints each failing key's minimal history.
    Lincheck {
        /// The history file.
        file: std::path::PathBuf,
    },
}

#[derive(ClapArgs)]
struct ServeArgs {
    /// TOML configuration (see docs/store.md).
    #[arg(long)]
    config: PathBuf,
    /// Override `node_id`.
    #[arg(long)]
    node_id: Option<u32>,
    /// Override `listen`.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// Override `role` (primary | secondary | auto).
    #[arg(long)]
    role: Option<String>,
    /// Override `arena_addr` (hex).
    #[arg(long)]
    arena_addr: Option<String>,
}

#[derive(ClapArgs)]
struct NodesArg {
    /// The group's nodes, comma-separated host:port.
    #[arg(long, value_delimiter = ',', required = true)]
    nodes: Vec<SocketAddr>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(ClapArgs)]
struct OpArgs {
    #[command(flatten)]
    nodes: NodesArg,
    /// Remote pointer (`0xADDR:0xSTAG:LEN`) for get/update/del; value for put.
    first: String,
    /// The value for update.
    second: Option<String>,
}

#[derive(ClapArgs)]
pub struct LoadArgs {
    #[command(flatten)]
    nodes: NodesArg,
    /// Seconds to run.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Concurrent clients (threads, one connection each).
    #[arg(long, default_value_t = 2)]
    pub clients: usize,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Largest value in bytes (values are 16..=max).
    #[arg(long, default_value_t = 512)]
    pub max_value: usize,
    /// Print a JSON progress line every 250 ms.
    #[arg(long)]
    pub progress: bool,
}

pub fn run(a: Args) -> Result<()> {
    match a.cmd {
        Cmd::Serve(s) => serve(s),
        Cmd::Lincheck { file } => lincheck(&file),
        Cmd::Put(o) => {
            let mut c = client(&o.nodes.nodes)?;
            let p = c.insert(o.first.as_bytes())?;
            println!("{p}");
            Ok(())
        }
        Cmd::Get(o) => {
            let mut c = client(&o.nodes.nodes)?;
            let p: RemotePtr = o.first.parse().context("remote pointer")?;
            let v = c.read(p)?;
            println!("{}", String::from_utf8_lossy(&v));
            Ok(())
        }
        Cmd::Update(o) => {
            let mut c = client(&o.nodes.nodes)?;
            let p: RemotePtr = o.first.parse().context("remote pointer")?;
            let Some(v) = o.second else {
                bail!("update needs POINTER VALUE")
            };
            println!("{}", c.update(p, v.as_bytes())?);
            Ok(())
        }
        Cmd::Del(o) => {
            let mut c = client(&o.nodes.nodes)?;
            let p: RemotePtr = o.first.parse().context("remote pointer")?;
            c.delete(p)?;
            println!("deleted {p}");
            Ok(())
        }
        Cmd::Status(n) => status(&n),
        Cmd::Load(l) => {
            let r = load(&l)?;
            println!("{}", r.to_json());
            if r.lost != 0 || r.errors != 0 {
                std::process::exit(3);
            }
            Ok(())
        }
        Cmd::Bench(b) => crate::store_bench::run(b),
    }
}

fn client(nodes: &[SocketAddr]) -> Result<StoreClient> {
    Ok(StoreClient::new(ClientConfig::new(nodes.to_vec()))?)
}

fn serve(s: ServeArgs) -> Result<()> {
    let mut cfg = Config::load(&s.config).with_context(|| format!("{}", s.config.display()))?;
    if let Some(n) = s.node_id {
        cfg.node_id = n;
    }
    if let Some(l) = s.listen {
        cfg.listen = l;
    }
    if let Some(r) = s.role {
        cfg.role = match r.as_str() {
            "primary" => RoleHint::Primary,
            "secondary" => RoleHint::Secondary,
            "auto" => RoleHint::Auto,
            o => bail!("unknown role {o:?}"),
        };
    }
    if let Some(a) = s.arena_addr {
        let t = a.trim_start_matches("0x").replace('_', "");
        cfg.arena_addr = Some(HexU64(
            u64::from_str_radix(&t, 16).context("arena address")?,
        ));
    }
    let (id, listen) = (cfg.node_id, cfg.listen);
    server::serve(cfg, |a| {
        println!(
            "ready node {id} listening on {listen} arena {:#x}+{} stag {:#010x}",
            a.base, a.len, a.stag
        );
    })?;
    Ok(())
}

use softrdma_store::proto::role_name;

fn status(n: &NodesArg) -> Result<()> {
    let mut c = client(&n.nodes)?;
    let mut any = false;
    for (addr, r) in c.status_all() {
        match r {
            Ok(s) => {
                any = true;
                if n.json {
                    println!(
                        "{}",
                        serde_json::json!({
                            "addr": addr.to_string(), "node": s.node, "role": role_name(s.role),
                            "epoch": s.epoch, "arena_base": s.arena_base, "arena_len": s.arena_len,
                            "stag": s.stag, "allocated": s.allocated, "objects": s.objects,
                            "redundant": s.redundant, "applied_seq": s.applied_seq,
                        })
                    );
                } else {
                    println!(
                        "node {} at {addr}: {} epoch {} arena {:#x}+{} stag {:#010x} used {} bytes in {} objects, {}",
                        s.node,
                        role_name(s.role),
                        s.epoch,
                        s.arena_base,
                        s.arena_len,
                        s.stag,
                        s.allocated,
                        s.objects,
                        if s.redundant { "redundant" } else { "NOT redundant" }
                    );
                }
            }
            Err(e) => {
                if n.json {
                    println!(
                        "{}",
                        serde_json::json!({"addr": addr.to_string(), "error": e.to_string()})
                    );
                } else {
                    println!("node at {addr}: unreachable ({e})");
                }
            }
        }
    }
    if !any {
        bail!("no node answered");
    }
    Ok(())
}

/// Deterministic generator (splitmix64).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// Result of a workload run.
#[derive(Debug, Default, Clone)]
pub struct LoadReport {
    pub ops: u64,
    pub secs: f64,
    pub errors: u64,
    pub lost: u64,
    pub resurrected: u64,
    pub verified: u64,
    pub max_gap_ms: f64,
    pub retries: u64,
    pub one_sided: u64,
    pub torn: u64,
    /// (op, count, p50 us, p99 us)
    pub lat: Vec<(String, u64, f64, f64)>,
    pub first_error: Option<String>,
}

impl LoadReport {
    pub fn to_json(&self) -> String {
        let lat: Vec<_> = self
            .lat
            .iter()
            .map(|(op, n, p50, p99)| serde_json::json!({"op": op, "count": n, "p50_us": p50, "p99_us": p99}))
            .collect();
        serde_json::json!({
            "type": "summary", "ops": self.ops, "secs": self.secs,
            "ops_per_s": self.ops as f64 / self.secs.max(1e-9),
            "errors": self.errors, "lost_writes": self.lost, "resurrected": self.resurrected,
            "verified": self.verified, "max_gap_ms": self.max_gap_ms, "retries": self.retries,
            "one_sided_reads": self.one_sided, "torn_reads": self.torn, "latency": lat,
            "first_error": self.first_error,
        })
        .to_string()
    }
}

const OPS: [&str; 4] = ["insert", "update", "read", "delete"];

struct Live {
    ptr: RemotePtr,
    data: Vec<u8>,
}

struct Worker {
    ops: u64,
    errors: u64,
    lost: u64,
    resurrected: u64,
    verified: u64,
    max_gap: Duration,
    hist: Vec<Histogram<u64>>,
    first_error: Option<String>,
    stats: softrdma_store::net::client::ClientStats,
}

fn value(rng: &mut Rng, id: u64, n: u64, max: usize) -> Vec<u8> {
    let len = rng.range(16, max.max(16) as u64) as usize;
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&id.to_le_bytes());
    v.extend_from_slice(&n.to_le_bytes());
    while v.len() < len {
        v.push(rng.next() as u8);
    }
    v
}

fn worker(
    nodes: Vec<SocketAddr>,
    seed: u64,
    until: Instant,
    max_value: usize,
    done: &std::sync::atomic::AtomicU64,
) -> Result<Worker> {
    let mut c = client(&nodes)?;
    let mut rng = Rng(seed);
    let mut live: Vec<Live> = Vec::new();
    let mut deleted: Vec<(RemotePtr, Vec<u8>)> = Vec::new();
    let mut w = Worker {
        ops: 0,
        errors: 0,
        lost: 0,
        resurrected: 0,
        verified: 0,
        max_gap: Duration::ZERO,
        hist: (0..4)
            .map(|_| Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram"))
            .collect(),
        first_error: None,
        stats: Default::default(),
    };
    let mut last_ok = Instant::now();
    let mut n = 0u64;
    let err = |w: &mut Worker, what: String| {
        w.errors += 1;
        if w.first_error.is_none() {
            w.first_error = Some(what);
        }
    };
    while Instant::now() < until {
        n += 1;
        let dice = rng.range(0, 99);
        let kind = if live.is_empty() || (dice < 35 && live.len() < 2000) {
            0
        } else if dice < 60 {
            1
        } else if dice < 90 {
            2
        } else {
            3
        };
        let t = Instant::now();
        let ok = match kind {
            0 => {
                let v = value(&mut rng, c.id(), n, max_value);
                match c.insert(&v) {
                    Ok(p) => {
                        live.push(Live { ptr: p, data: v });
                        true
                    }
                    Err(e) => {
                        err(&mut w, format!("insert: {e}"));
                        false
                    }
                }
            }
            1 => {
                let i = rng.range(0, live.len() as u64 - 1) as usize;
                let v = value(&mut rng, c.id(), n, max_value);
                match c.update(live[i].ptr, &v) {
                    Ok(p) => {
                        live[i] = Live { ptr: p, data: v };
                        true
                    }
                    Err(e) => {
                        err(&mut w, format!("update {}: {e}", live[i].ptr));
                        false
                    }
                }
            }
            2 => {
                let i = rng.range(0, live.len() as u64 - 1) as usize;
                match c.read(live[i].ptr) {
                    Ok(d) if d == live[i].data => true,
                    Ok(_) => {
                        w.lost += 1;
                        err(
                            &mut w,
                            format!("read {}: other bytes than acknowledged", live[i].ptr),
                        );
                        false
                    }
                    Err(e) => {
                        w.lost += 1;
                        err(&mut w, format!("read {}: {e}", live[i].ptr));
                        false
                    }
                }
            }
            _ => {
                let i = rng.range(0, live.len() as u64 - 1) as usize;
                let o = live.swap_remove(i);
                match c.delete(o.ptr) {
                    Ok(()) => {
                        deleted.push((o.ptr, o.data));
                        true
                    }
                    Err(e) => {
                        err(&mut w, format!("delete {}: {e}", o.ptr));
                        false
                    }
                }
            }
        };
        let el = t.elapsed();
        if ok {
            let _ = w.hist[kind].record((el.as_micros() as u64).max(1));
            w.ops += 1;
            done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            w.max_gap = w.max_gap.max(last_ok.elapsed());
            last_ok = Instant::now();
        }
    }
    // Verify: every acknowledged object reads back exactly; deleted
    // pointers whose space was not reused read as freed.
    let live_addrs: std::collections::HashSet<u64> = live.iter().map(|l| l.ptr.addr).collect();
    for (k, l) in live.iter().enumerate() {
        match c.read(l.ptr) {
            Ok(d) if d == l.data => w.verified += 1,
            // No node answered for the client's whole deadline: the group
            // has no primary (both nodes lost, or a degraded primary lost:
            // docs/store.md, "Durability, by policy"). Every object left
            // is unverifiable; say so once instead of waiting a deadline
            // per object.
            Err(e @ ClientError::Unavailable(_)) => {
                let left = (live.len() - k) as u64;
                w.lost += left;
                err(
                    &mut w,
                    format!("verify: {e}; {left} acknowledged objects could not be read"),
                );
                w.stats = c.stats();
                return Ok(w);
            }
            Ok(_) => {
                w.lost += 1;
                err(
                    &mut w,
                    format!("verify {}: other bytes than acknowledged", l.ptr),
                );
            }
            Err(e) => {
                w.lost += 1;
                err(&mut w, format!("verify {}: {e}", l.ptr));
            }
        }
    }
    for (p, data) in deleted
        .iter()
        .filter(|(p, _)| !live_addrs.contains(&p.addr))
        .take(200)
    {
        match c.read_server(*p) {
            Err(ClientError::Store(
                StoreError::Freed | StoreError::NotAllocated | StoreError::OutOfArena,
            )) => {}
            Err(e) => err(&mut w, format!("verify deleted {p}: {e}")),
            // The space may hold another client's newer object; only the
            // deleted bytes themselves coming back is a resurrection.
            Ok(d) if &d == data => {
                w.resurrected += 1;
                err(&mut w, format!("deleted object {p} came back"));
            }
            Ok(_) => {}
        }
    }
    w.stats = c.stats();
    Ok(w)
}

/// Runs the verifying workload.
pub fn load(l: &LoadArgs) -> Result<LoadReport> {
    use std::sync::atomic::{AtomicU64, Ordering};
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs_f64(l.duration);
    let done = std::sync::Arc::new(AtomicU64::new(0));
    let mut hs = Vec::new();
    for i in 0..l.clients.max(1) {
        let nodes = l.nodes.nodes.clone();
        let seed = l.seed.wrapping_mul(1000).wrapping_add(i as u64);
        let max_value = l.max_value;
        let done = done.clone();
        hs.push(std::thread::spawn(move || {
            worker(nodes, seed, until, max_value, &done)
        }));
    }
    if l.progress {
        let mut last = (Instant::now(), 0u64);
        while hs.iter().any(|h| !h.is_finished()) {
            std::thread::sleep(Duration::from_millis(250));
            let d = done.load(Ordering::Relaxed);
            let now = Instant::now();
            let rate = (d - last.1) as f64 / now.duration_since(last.0).as_secs_f64();
            last = (now, d);
            println!(
                "{}",
                serde_json::json!({"type": "progress", "t": t0.elapsed().as_secs_f64(), "ops": d, "ops_per_s": rate})
            );
        }
    }
    let mut r = LoadReport::default();
    let mut hist: Vec<Histogram<u64>> = (0..4)
        .map(|_| Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram"))
        .collect();
    for h in hs {
        let w = h.join().map_err(|_| anyhow::anyhow!("worker panicked"))??;
        r.ops += w.ops;
        r.errors += w.errors;
        r.lost += w.lost;
        r.resurrected += w.resurrected;
        r.verified += w.verified;
        r.max_gap_ms = r.max_gap_ms.max(w.max_gap.as_secs_f64() * 1e3);
        r.retries += w.stats.retries;
        r.one_sided += w.stats.one_sided_reads;
        r.torn += w.stats.torn_reads;
        if r.first_error.is_none() {
            r.first_error = w.first_error;
        }
        for (a, b) in hist.iter_mut().zip(&w.hist) {
            a.add(b).expect("same bounds");
        }
    }
    r.secs = l.duration;
    r.lat = OPS
        .iter()
        .zip(&hist)
        .map(|(op, h)| {
            (
                op.to_string(),
                h.len(),
                h.value_at_quantile(0.5) as f64,
                h.value_at_quantile(0.99) as f64,
            )
        })
        .collect();
    Ok(r)
}

/// `softrdma store lincheck FILE`.
fn lincheck(file: &std::path::Path) -> Result<()> {
    use softrdma_store::lincheck::{check, report, Kind, Op};
    let text = std::fs::read_to_string(file).with_context(|| format!("{}", file.display()))?;
    let mut ops = Vec::new();
    for (n, line) in text
        .lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
    {
        let v: serde_json::Value =
            serde_json::from_str(line).with_context(|| format!("line {}", n + 1))?;
        let num = |k: &str| v[k].as_u64();
        let value = num("value");
        let kind = match v["op"].as_str() {
            Some("write") => Kind::Write(value),
            Some("read") => Kind::Read(value),
            o => bail!("line {}: op {o:?}", n + 1),
        };
        ops.push(Op {
            key: num("key").with_context(|| format!("line {}: key", n + 1))?,
            client: num("client").unwrap_or(0),
            call: num("call").with_context(|| format!("line {}: call", n + 1))?,
            ret: num("ret"),
            kind,
        });
    }
    let bad = check(&ops);
    if bad.is_empty() {
        println!("{} operations: linearizable", ops.len());
        return Ok(());
    }
    print!("{}", report(&bad));
    bail!("{} of the keys are not linearizable", bad.len())
}
