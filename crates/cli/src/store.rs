//! `softrdma store ...`: serve a node, the embedded coordinator, client
//! operations, a workload.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::{Args as ClapArgs, Subcommand};
use softrdma_store::config::{Config, HexU64, RoleHint};
use softrdma_store::net::client::{ClientConfig, StoreClient};
use softrdma_store::net::handshake::ClientAuth;
use softrdma_store::net::server;
use softrdma_store::persist::Policy;
use softrdma_store::proto::Cond;
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
    /// Run the embedded coordinator of a replica group (its nodes'
    /// `[coordinator] kind = "embedded"`) in the foreground until SIGINT or
    /// SIGTERM; for groups without etcd.
    Coordinator(crate::store_coord::Args),
    /// After a double failure, make a node that the group's record does not
    /// name (a stale secondary) its primary, giving up the writes it lacks
    /// (named first; nothing changes without --yes). Refused while a
    /// primary holds the lease.
    Promote(crate::store_admin::PromoteArgs),
    /// Start the group over, empty: the coordinator forgets its record and
    /// the nodes it names discard their data (nothing changes without
    /// --yes). Refused while a primary holds the lease.
    Reset(crate::store_admin::ResetArgs),
    /// Store a value under a key (replicated before it is acknowledged).
    #[command(alias = "set")]
    Put(PutArgs),
    /// Print a key's value (one-sided RDMA Reads of the index and the
    /// object; exit status 1 if the key does not exist).
    Get(KeyArgs),
    /// Delete a key (exit status 1 if it did not exist).
    Del(KeyArgs),
    /// List the keys matching a glob pattern (`*`, `?`, `[...]`).
    #[command(alias = "scan")]
    Keys(KeysArgs),
    /// Pointer API: store a value without a key; prints its remote pointer.
    /// (The pointer commands are named as `StoreClient`'s pointer face:
    /// `alloc`, `read-ptr`, `update-ptr`, `free`; the keyed ones `put`,
    /// `get`, `del`. The old names insert/read/update/delete still work.)
    #[command(alias = "insert")]
    Alloc(AllocArgs),
    /// Pointer API: read the value at a remote pointer (one-sided).
    #[command(alias = "read")]
    ReadPtr(PointerArgs),
    /// Pointer API: replace the value at a remote pointer; prints the (new)
    /// pointer.
    #[command(alias = "update")]
    UpdatePtr(UpdateArgs),
    /// Pointer API: free the value at a remote pointer.
    #[command(alias = "delete")]
    Free(PointerArgs),
    /// Roles, epoch, arena use and redundancy of every node.
    Status(StatusArgs),
    /// A verifying mixed workload (used by `softrdma demo` and the tests).
    Load(crate::store_load::LoadArgs),
    /// Throughput and latency of insert/update/one-sided read against Redis
    /// (primary + replica) at the same concurrency (own group and Redis).
    Bench(crate::store_bench::Args),
    /// Large values (1 to 64 MiB): the native client's put and one-sided
    /// get against the same bytes over plain TCP sockets (a relay through
    /// two ends, one hop), with p99 and CPU.
    BenchLarge(crate::store_bench_large::Args),
    /// The durable log (issue 33) on a storage endpoint, local and remote:
    /// commits of 1 to 256 records against the device's fdatasync rate
    /// (fio), with p99 and CPU.
    BenchLog(crate::store_bench_log::Args),
    /// Writes under `persist = always` and `everysec` (issue 33) against
    /// Redis with one replica and AOF (`appendfsync always|everysec`, SET +
    /// `WAIT 1 0`) in the same run, reads beside them, and the device's
    /// fdatasync rate (fio) as the physical limit; p99 and CPU.
    BenchPersist(crate::store_bench::persist::Args),
    /// Recovery of a group killed whole, with its arena filled (1 GiB of
    /// 4 KiB values by default): from process start to serving, against
    /// fio's sequential O_DIRECT read of the same store file.
    BenchRecovery(crate::store_bench::recovery::Args),
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
    /// Serve the Redis protocol (RESP) on this address (overrides `resp`).
    #[arg(long)]
    resp: Option<SocketAddr>,
}

#[derive(ClapArgs)]
struct NodesArg {
    /// The group's nodes, comma-separated host:port.
    #[arg(long, value_delimiter = ',', required = true)]
    nodes: Vec<SocketAddr>,
    #[command(flatten)]
    auth: AuthArgs,
}

#[derive(ClapArgs)]
struct StatusArgs {
    #[command(flatten)]
    nodes: NodesArg,
    /// `status`: print one JSON object per node.
    #[arg(long)]
    json: bool,
}

/// How a client proves itself to nodes that have credentials. The password
/// never goes on the command line: a file, or the environment variable
/// SOFTRDMA_STORE_PASSWORD.
#[derive(ClapArgs, Clone, Default)]
pub struct AuthArgs {
    /// The user (default: $SOFTRDMA_STORE_USER, else `default`, whose
    /// password is the group's secret).
    #[arg(long)]
    pub user: Option<String>,
    /// A file whose first line is the password (default:
    /// $SOFTRDMA_STORE_PASSWORD).
    #[arg(long)]
    pub password_file: Option<PathBuf>,
}

impl AuthArgs {
    /// The credential, if a password was given.
    pub fn client_auth(&self) -> Result<Option<ClientAuth>> {
        ClientAuth::from_env(self.user.as_deref(), self.password_file.as_deref())
            .map_err(anyhow::Error::msg)
    }
}

/// A client of `nodes` proving `auth`'s credential.
pub fn client_with(nodes: &[SocketAddr], auth: &AuthArgs) -> Result<StoreClient> {
    let mut cfg = ClientConfig::new(nodes.to_vec());
    cfg.auth = auth.client_auth()?;
    Ok(StoreClient::new(cfg)?)
}

#[derive(ClapArgs)]
struct AllocArgs {
    #[command(flatten)]
    nodes: NodesArg,
    /// `alloc`: the value to store.
    value: String,
}

#[derive(ClapArgs)]
struct PointerArgs {
    #[command(flatten)]
    nodes: NodesArg,
    /// `read-ptr`, `free`: the remote pointer, as `alloc` and `update-ptr`
    /// print it (`ADDR:STAG:LEN:GENERATION`, e.g. `0x7f00_0000_1000:0x00012345:4096:17`).
    pointer: String,
}

#[derive(ClapArgs)]
struct UpdateArgs {
    #[command(flatten)]
    nodes: NodesArg,
    /// `update-ptr`: the remote pointer, as `alloc` and `update-ptr` print it
    /// (`ADDR:STAG:LEN:GENERATION`, e.g. `0x7f00_0000_1000:0x00012345:4096:17`).
    pointer: String,
    /// `update-ptr`: the new value.
    value: String,
}

#[derive(ClapArgs)]
struct PutArgs {
    #[command(flatten)]
    nodes: NodesArg,
    /// The key (1 to 1024 bytes).
    key: String,
    /// The value (or --file, or --stdin for binary data).
    value: Option<String>,
    /// Read the value from this file.
    #[arg(long, conflicts_with_all = ["value", "stdin"])]
    file: Option<PathBuf>,
    /// Read the value from standard input.
    #[arg(long, conflicts_with = "value")]
    stdin: bool,
    /// Only if the key does not exist (SET NX).
    #[arg(long, conflicts_with = "xx")]
    nx: bool,
    /// Only if the key exists (SET XX).
    #[arg(long)]
    xx: bool,
}

#[derive(ClapArgs)]
struct KeyArgs {
    #[command(flatten)]
    nodes: NodesArg,
    /// The key.
    key: String,
    /// `get`: write the value's bytes unchanged (no newline) to standard
    /// output, or to this file with --out.
    #[arg(long)]
    raw: bool,
    /// `get`: write the value to this file.
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(ClapArgs)]
struct KeysArgs {
    #[command(flatten)]
    nodes: NodesArg,
    /// Glob pattern; all keys if omitted.
    #[arg(default_value = "*")]
    pattern: String,
    /// Only keys starting with this prefix (a pattern of PREFIX*).
    #[arg(long, conflicts_with = "pattern")]
    prefix: Option<String>,
}

pub fn run(a: Args) -> Result<()> {
    match a.cmd {
        Cmd::Serve(s) => serve(s),
        Cmd::Coordinator(c) => crate::store_coord::run(c),
        Cmd::Promote(p) => crate::store_admin::promote(p),
        Cmd::Reset(r) => crate::store_admin::reset(r),
        Cmd::Lincheck { file } => lincheck(&file),
        Cmd::Put(a) => put(a),
        Cmd::Get(a) => {
            let mut c = client(&a.nodes)?;
            match c.get(a.key.as_bytes())? {
                None => {
                    eprintln!("(nil): no key {:?}", a.key);
                    std::process::exit(1);
                }
                Some(v) => {
                    if let Some(path) = &a.out {
                        std::fs::write(path, &v).with_context(|| path.display().to_string())?;
                    } else if a.raw {
                        use std::io::Write;
                        std::io::stdout().write_all(&v)?;
                    } else {
                        println!("{}", String::from_utf8_lossy(&v));
                    }
                    Ok(())
                }
            }
        }
        Cmd::Del(a) => {
            let mut c = client(&a.nodes)?;
            if c.del(a.key.as_bytes())? {
                println!("deleted {:?}", a.key);
                Ok(())
            } else {
                eprintln!("no key {:?}", a.key);
                std::process::exit(1);
            }
        }
        Cmd::Keys(a) => {
            let mut c = client(&a.nodes)?;
            let pattern = match &a.prefix {
                Some(p) => glob_escape(p) + "*",
                None => a.pattern.clone(),
            };
            for k in c.scan(pattern.as_bytes())? {
                println!("{}", String::from_utf8_lossy(&k));
            }
            Ok(())
        }
        Cmd::Alloc(o) => {
            let mut c = client(&o.nodes)?;
            let p = c.alloc(o.value.as_bytes())?;
            println!("{p}");
            Ok(())
        }
        Cmd::ReadPtr(o) => {
            let mut c = client(&o.nodes)?;
            let p: RemotePtr = o.pointer.parse().context("remote pointer")?;
            let v = c.read_ptr(p)?;
            println!("{}", String::from_utf8_lossy(&v));
            Ok(())
        }
        Cmd::UpdatePtr(o) => {
            let mut c = client(&o.nodes)?;
            let p: RemotePtr = o.pointer.parse().context("remote pointer")?;
            println!("{}", c.update_ptr(p, o.value.as_bytes())?);
            Ok(())
        }
        Cmd::Free(o) => {
            let mut c = client(&o.nodes)?;
            let p: RemotePtr = o.pointer.parse().context("remote pointer")?;
            c.free(p)?;
            println!("freed {p}");
            Ok(())
        }
        Cmd::Status(n) => status(&n),
        Cmd::Load(l) => {
            let r = crate::store_load::load(&l)?;
            println!("{}", r.to_json());
            if r.lost != 0 || r.errors != 0 || r.wrong_key != 0 || r.resurrected != 0 {
                std::process::exit(3);
            }
            Ok(())
        }
        Cmd::Bench(b) => crate::store_bench::run(b),
        Cmd::BenchLarge(b) => crate::store_bench_large::run(b),
        Cmd::BenchLog(b) => crate::store_bench_log::run(b),
        Cmd::BenchPersist(b) => crate::store_bench::persist::run(b),
        Cmd::BenchRecovery(b) => crate::store_bench::recovery::run(b),
    }
}

/// A pattern that matches `s` literally.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for ch in s.chars() {
        if matches!(ch, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(ch);
    }
    out
}

fn put(a: PutArgs) -> Result<()> {
    let value = if let Some(path) = &a.file {
        std::fs::read(path).with_context(|| path.display().to_string())?
    } else if a.stdin {
        use std::io::Read;
        let mut v = Vec::new();
        std::io::stdin().read_to_end(&mut v)?;
        v
    } else {
        match a.value {
            Some(v) => v.into_bytes(),
            None => bail!("put needs KEY VALUE, or KEY with --file or --stdin"),
        }
    };
    let cond = match (a.nx, a.xx) {
        (true, _) => Cond::IfAbsent,
        (_, true) => Cond::IfPresent,
        _ => Cond::Always,
    };
    let mut c = client(&a.nodes)?;
    match c.set_if(a.key.as_bytes(), &value, cond)? {
        Some(p) => {
            println!("OK {p}");
            Ok(())
        }
        None => {
            eprintln!(
                "not stored: key {:?} {}",
                a.key,
                if a.nx { "exists" } else { "does not exist" }
            );
            std::process::exit(1);
        }
    }
}

fn client(n: &NodesArg) -> Result<StoreClient> {
    client_with(&n.nodes, &n.auth)
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
    if let Some(r) = s.resp {
        cfg.resp = Some(r);
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

fn status(a: &StatusArgs) -> Result<()> {
    let mut c = client(&a.nodes)?;
    let mut any = false;
    for (addr, r) in c.status_all() {
        match r {
            Ok(s) => {
                any = true;
                if a.json {
                    println!(
                        "{}",
                        serde_json::json!({
                            "addr": addr.to_string(), "node": s.node, "role": role_name(s.role),
                            "epoch": s.epoch, "arena_base": s.arena_base, "arena_len": s.arena_len,
                            "stag": s.stag, "allocated": s.allocated, "objects": s.objects,
                            "redundant": s.redundant, "applied_seq": s.applied_seq,
                            "persist": Policy::from_code(s.persist).to_string(),
                            "durable_seq": s.durable_seq,
                        })
                    );
                } else {
                    let persist = match Policy::from_code(s.persist) {
                        Policy::Off => String::new(),
                        p => format!(", persist {p} (durable through write {})", s.durable_seq),
                    };
                    println!(
                        "node {} at {addr}: {} epoch {} arena {:#x}+{} stag {:#010x} used {} bytes in {} objects, {}{persist}",
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
                if a.json {
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
