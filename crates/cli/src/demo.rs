//! `softrdma demo`: the HA store's failover, end to end, in ~20 s.
//!
//! Starts the embedded coordinator (in this process), a primary and a
//! secondary (`softrdma store serve`, separate processes) and a verifying
//! client workload (`softrdma store load`, a separate process); kills the
//! primary with SIGKILL half-way; the clients fail over to the secondary,
//! which the coordinator promotes under a new epoch; the killed node is
//! restarted and rejoins as secondary (copying the arena while writes go
//! on). At the end the workload reads back every acknowledged write; the
//! demo prints the summary and `lost writes: N` and exits non-zero if any
//! check failed.

use crate::child::Proc;
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{mpsc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use clap::Args as ClapArgs;
use indicatif::{ProgressBar, ProgressStyle};
use softrdma_store::auth::Secret;
use softrdma_store::coord::embedded::EmbeddedServer;
use softrdma_store::net::client::{ClientConfig, StoreClient};
use softrdma_store::net::handshake::ClientAuth;

#[derive(ClapArgs)]
pub struct Args {
    /// Seconds of client load.
    #[arg(long, default_value_t = 14.0)]
    duration: f64,
    /// Concurrent clients.
    #[arg(long, default_value_t = 4)]
    clients: usize,
    /// Seconds into the load at which the primary is killed.
    #[arg(long)]
    kill_at: Option<f64>,
    /// Arena size.
    #[arg(long, default_value = "64MiB")]
    arena: String,
    /// Random seed of the workload.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Keep the nodes' logs here (default: a temporary directory, removed
    /// on success).
    #[arg(long)]
    workdir: Option<PathBuf>,
    /// Persist (issue 33): each node logs to a store file of its own in the
    /// work directory under this policy (`always` or `everysec`), and
    /// instead of the primary both nodes are killed at once, then
    /// restarted from their partitions.
    #[arg(long)]
    persist: Option<String>,
}

/// The demo process's own log file (`demo.log` in the work directory),
/// once the directory is known; log lines before that are dropped.
static LOG: OnceLock<std::fs::File> = OnceLock::new();

/// Where `main` sends the demo's log lines.
pub struct LogFile;

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for LogFile {
    type Writer = Box<dyn Write + 'a>;
    fn make_writer(&'a self) -> Self::Writer {
        match LOG.get() {
            Some(f) => Box::new(f),
            None => Box::new(std::io::sink()),
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn write_config(
    dir: &Path,
    id: u32,
    listen: SocketAddr,
    peer: SocketAddr,
    coord: SocketAddr,
    arena: &str,
    resp: u16,
    persist: Option<softrdma_store::persist::Policy>,
) -> Result<PathBuf> {
    let p = dir.join(format!("node{id}.toml"));
    let text = format!(
        "group = \"demo\"\nnode_id = {id}\nrole = \"{}\"\nlisten = \"{listen}\"\npeers = [\"{peer}\"]\n\
         arena_size = \"{arena}\"\nheartbeat_interval_ms = 50\nheartbeat_timeout_ms = 250\nlease_ttl_ms = 300\n\
         resp = \"127.0.0.1:{resp}\"\n\n\
         [auth]\nsecret_file = \"group.secret\"\n\n{}\
         [coordinator]\nkind = \"embedded\"\naddr = \"{coord}\"\n",
        if id == 1 { "primary" } else { "secondary" },
        match persist {
            Some(p) => format!(
                "[persist]\nstorage = \"{}\"\npartition = 0\nprincipal = \"store\"\npolicy = \"{p}\"\n\n",
                dir.join(format!("node{id}.store")).display()
            ),
            None => String::new(),
        }
    );
    std::fs::write(&p, text)?;
    Ok(p)
}

/// Starts a node (`child::start_node`) and shows its `ready` line.
fn start_node(dir: &Path, id: u32, cfg: &Path, role: &str) -> Result<Proc> {
    let (p, ready) = crate::child::start_node(dir, id, cfg, role, true)?;
    println!("  {ready}");
    Ok(p)
}

/// Polls status until `pred` holds for the group or `timeout` passes.
fn wait_group(
    c: &mut StoreClient,
    timeout: Duration,
    pred: impl Fn(&[(u32, u8, bool)]) -> bool,
) -> Option<Vec<(u32, u8, bool)>> {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        let st: Vec<(u32, u8, bool)> = c
            .status_all()
            .into_iter()
            .filter_map(|(_, r)| r.ok().map(|s| (s.node, s.role, s.redundant)))
            .collect();
        if pred(&st) {
            return Some(st);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

const PRIMARY: u8 = 2;

/// A store file per node in `dir`, one partition granted `rw` to principal
/// `store`, with room for two snapshots of the arena and a log.
fn make_stores(dir: &Path, arena: &str) -> Result<()> {
    use softrdma_storage::layout::Rights;
    use softrdma_storage::{InitOptions, PartitionSpec, Store};
    let arena = softrdma_store::config::parse_size(arena).map_err(anyhow::Error::msg)?;
    for n in 1..=2 {
        let path = dir.join(format!("node{n}.store"));
        // A new store (a kept one would hold an earlier run's group).
        let _ = std::fs::remove_file(&path);
        Store::init(
            &path,
            &InitOptions {
                size: Some((2 * arena + (64 << 20)).div_ceil(1 << 20) * (1 << 20) + (4 << 20)),
                partitions: PartitionSpec::Equal(1),
                align: 1 << 20,
                force: false,
            },
        )?;
        Store::open(&path)?.grant("0", "store", Rights::READ_WRITE)?;
    }
    Ok(())
}

/// A line above the progress bar (or plain, when there is no terminal).
fn say(bar: &ProgressBar, msg: String) {
    if bar.is_hidden() {
        println!("{msg}");
    } else {
        bar.println(msg);
    }
}

pub fn run(a: Args) -> Result<()> {
    let t_start = Instant::now();
    let tmp;
    let dir = match &a.workdir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            d.clone()
        }
        None => {
            tmp = std::env::temp_dir().join(format!("softrdma-demo-{}", std::process::id()));
            std::fs::create_dir_all(&tmp)?;
            tmp.clone()
        }
    };
    if let Ok(f) = std::fs::File::create(dir.join("demo.log")) {
        let _ = LOG.set(f);
    }
    println!("softrdma demo: HA remote memory store, failover under load");
    // A group secret for this run: nodes, the coordinator and clients
    // prove it (issue 29); it stays in a file readable by this user only.
    let secret_file = dir.join("group.secret");
    let secret = crate::store_coord::write_new_secret(&secret_file, false)?;
    let coord =
        EmbeddedServer::start_with("127.0.0.1:0".parse()?, Some(Secret::new(secret.as_bytes())))?;
    let ports = crate::net::free_ports(4)?;
    let n1: SocketAddr = format!("127.0.0.1:{}", ports[0]).parse()?;
    let n2: SocketAddr = format!("127.0.0.1:{}", ports[1]).parse()?;
    let persist = match &a.persist {
        Some(p) => {
            let p: softrdma_store::persist::Policy = p.parse().map_err(anyhow::Error::msg)?;
            if !p.logs() {
                bail!("--persist: always or everysec");
            }
            make_stores(&dir, &a.arena)?;
            Some(p)
        }
        None => None,
    };
    let c1 = write_config(&dir, 1, n1, n2, coord.addr(), &a.arena, ports[2], persist)?;
    let c2 = write_config(&dir, 2, n2, n1, coord.addr(), &a.arena, ports[3], persist)?;
    println!(
        "  coordinator (embedded) at {}; nodes at {n1} and {n2} (Redis protocol on ports {} \
         and {}); logs in {}",
        coord.addr(),
        ports[2],
        ports[3],
        dir.display()
    );
    println!(
        "  access: a group secret made for this run in {} (nodes, coordinator and clients \
         prove it; try REDISCLI_AUTH=$(cat {0}) redis-cli -p {})",
        secret_file.display(),
        ports[2]
    );
    println!(
        "  durability (min_in_sync_replicas = 1, the default): {}",
        softrdma_store::config::durability(1)
    );
    if let Some(p) = persist {
        println!(
            "  persistence: each node logs to its own store file ({} and {}), persist = {p}; \
             part-way both nodes are killed at once and restarted from them",
            dir.join("node1.store").display(),
            dir.join("node2.store").display()
        );
    }
    let mut nodes: Vec<Option<Proc>> = vec![Some(start_node(&dir, 1, &c1, "primary")?), None];
    nodes[1] = Some(start_node(&dir, 2, &c2, "secondary")?);
    let mut probe = StoreClient::new({
        let mut cfg = ClientConfig::new(vec![n1, n2]);
        cfg.auth = Some(ClientAuth {
            user: softrdma_store::auth::DEFAULT_USER.into(),
            secret: Secret::new(secret.as_bytes()),
        });
        cfg
    })?;
    let t_red = Instant::now();
    let Some(st) = wait_group(&mut probe, Duration::from_secs(30), |s| {
        s.len() == 2 && s.iter().any(|x| x.1 == PRIMARY && x.2)
    }) else {
        bail!("the group did not become redundant");
    };
    let primary = st.iter().find(|x| x.1 == PRIMARY).map(|x| x.0).unwrap_or(1);
    println!(
        "  group redundant after {:.2} s: primary node {primary}, arena {}",
        t_red.elapsed().as_secs_f64(),
        probe
            .arena()
            .map(|r| format!("{:#x} stag {:#010x}", r.base, r.stag))
            .unwrap_or_default()
    );

    // The workload.
    let exe = std::env::current_exe()?;
    let mut load = Proc::spawn(
        "the workload",
        Command::new(exe)
            .args(["store", "load", "--progress", "--nodes"])
            .arg(format!("{n1},{n2}"))
            .args([
                "--duration",
                &a.duration.to_string(),
                "--clients",
                &a.clients.to_string(),
            ])
            .args(["--seed", &a.seed.to_string()])
            .env(softrdma_store::net::handshake::PASSWORD_ENV, &secret)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(dir.join("load.log"))?),
    )?;
    let out = load.child.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
            let _ = tx.send(line);
        }
    });
    let bar = ProgressBar::new((a.duration * 1000.0) as u64);
    bar.set_style(
        ProgressStyle::with_template("  [{bar:40}] {msg}")
            .expect("template")
            .progress_chars("=> "),
    );
    let kill_at = a.kill_at.unwrap_or(a.duration * 0.35);
    let mut killed: Option<(u32, Instant)> = None;
    let mut rejoined: Option<f64> = None;
    let mut summary: Option<serde_json::Value> = None;
    let mut events: Vec<String> = Vec::new();
    let mut rejoin_started: Option<Instant> = None;
    let mut restarted = false;
    let mut promoted: Option<f64> = None;
    let mut kill_t = 0.0;
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(line) => {
                let Ok(v) = serde_json::from_str::<serde_json::Value>(&line) else {
                    continue;
                };
                match v["type"].as_str() {
                    Some("progress") => {
                        let t = v["t"].as_f64().unwrap_or(0.0);
                        bar.set_position((t * 1000.0) as u64);
                        bar.set_message(format!(
                            "{:>5.1} s  {:>7.0} ops/s  {} ops{}",
                            t,
                            v["ops_per_s"].as_f64().unwrap_or(0.0),
                            v["ops"],
                            match (&killed, rejoined) {
                                (None, _) => "".to_string(),
                                (Some((n, _)), None) => format!("  (node {n} killed)"),
                                (Some(_), Some(_)) => "  (redundant again)".to_string(),
                            }
                        ));
                        if killed.is_none() && t >= kill_at {
                            let st = wait_group(&mut probe, Duration::from_secs(2), |s| {
                                s.iter().any(|x| x.1 == PRIMARY)
                            })
                            .unwrap_or_default();
                            let p = st
                                .iter()
                                .find(|x| x.1 == PRIMARY)
                                .map(|x| x.0)
                                .unwrap_or(primary);
                            if persist.is_some() {
                                // The whole group at once, then both back
                                // from their partitions.
                                for n in nodes.iter_mut() {
                                    if let Some(mut proc_) = n.take() {
                                        let _ = proc_.child.kill(); // SIGKILL
                                        let _ = proc_.child.wait();
                                    }
                                }
                                events.push(format!(
                                    "{t:.1} s: both nodes killed with SIGKILL at once"
                                ));
                                say(&bar, format!("  ! {t:.1} s: killed both nodes (SIGKILL)"));
                                killed = Some((0, Instant::now()));
                                kill_t = t;
                                for (i, cfg) in [&c1, &c2].into_iter().enumerate() {
                                    match start_node(&dir, i as u32 + 1, cfg, "auto") {
                                        Ok(pr) => nodes[i] = Some(pr),
                                        Err(e) => say(&bar, format!("  ! restart failed: {e:#}")),
                                    }
                                }
                                say(
                                    &bar,
                                    "  + both nodes restarted, recovering from their partitions"
                                        .into(),
                                );
                                restarted = true;
                                rejoin_started = Some(Instant::now());
                                continue;
                            }
                            if let Some(mut proc_) = nodes[(p - 1) as usize].take() {
                                let _ = proc_.child.kill(); // SIGKILL
                                let _ = proc_.child.wait();
                                drop(proc_);
                            }
                            events
                                .push(format!("{t:.1} s: node {p} (primary) killed with SIGKILL"));
                            say(
                                &bar,
                                format!("  ! {t:.1} s: killed the primary, node {p} (SIGKILL)"),
                            );
                            killed = Some((p, Instant::now()));
                            kill_t = t;
                        }
                    }
                    Some("summary") => {
                        summary = Some(v);
                    }
                    _ => {}
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        // Restart the killed node once the survivor has taken over.
        if let Some((p, at)) = killed {
            if promoted.is_none() {
                let st: Vec<_> = probe
                    .status_all()
                    .into_iter()
                    .filter_map(|(_, r)| r.ok())
                    .collect();
                if let Some(s) = st.iter().find(|s| s.role == PRIMARY && s.node != p) {
                    let ms = at.elapsed().as_secs_f64() * 1e3;
                    promoted = Some(ms);
                    say(
                        &bar,
                        match p {
                            0 => format!(
                                "  > node {} primary again (epoch {}) {ms:.0} ms after the kill, \
                                 recovered from its partition through write {}",
                                s.node, s.epoch, s.durable_seq
                            ),
                            _ => format!(
                                "  > node {} took over as primary (epoch {}) {ms:.0} ms after the \
                                 kill; clients saw node {p}'s connections reset and failed over",
                                s.node, s.epoch
                            ),
                        },
                    );
                    events.push(format!(
                        "{:.1} s: node {} promoted to primary ({ms:.0} ms after the kill)",
                        kill_t + ms / 1e3,
                        s.node
                    ));
                }
            }
            // (Restarted once the survivor leads: it copies from it. Under
            // the default min_in_sync_replicas = 1 the survivor takes no
            // write until then.)
            if !restarted && (promoted.is_some() || at.elapsed() > Duration::from_millis(1500)) {
                restarted = true;
                let cfg = if p == 1 { &c1 } else { &c2 };
                match start_node(&dir, p, cfg, "secondary") {
                    Ok(pr) => {
                        say(
                            &bar,
                            format!("  + node {p} restarted; rejoining as secondary"),
                        );
                        nodes[(p - 1) as usize] = Some(pr);
                        rejoin_started = Some(Instant::now());
                    }
                    Err(e) => say(&bar, format!("  ! restart failed: {e:#}")),
                }
            }
            if let (Some(rs), None) = (rejoin_started, rejoined) {
                let st: Vec<_> = probe
                    .status_all()
                    .into_iter()
                    .filter_map(|(_, r)| r.ok())
                    .collect();
                if st
                    .iter()
                    .any(|s| s.role == PRIMARY && s.redundant && s.node != p)
                {
                    let secs = rs.elapsed().as_secs_f64();
                    rejoined = Some(secs);
                    let who = match p {
                        0 => "the group".to_string(),
                        _ => format!("node {p}"),
                    };
                    say(
                        &bar,
                        format!("  + {who} back in sync after {secs:.2} s: redundant again"),
                    );
                }
            }
        }
    }
    bar.finish_and_clear();
    let status = load.child.wait()?;
    let Some(s) = summary else {
        bail!(
            "the workload printed no summary ({status}); see {}",
            dir.join("load.log").display()
        );
    };
    // Final state of the group.
    let fin = wait_group(&mut probe, Duration::from_secs(10), |s| {
        s.len() == 2 && s.iter().any(|x| x.1 == PRIMARY && x.2)
    });
    println!();
    println!("summary");
    println!(
        "  operations on keys: {} in {:.1} s = {:.0} ops/s ({} clients); gets by one-sided look-up {} \
         ({} cache hits, {} restarts), by the node {} (raced {}, refused {})",
        s["ops"],
        s["secs"].as_f64().unwrap_or(0.0),
        s["ops_per_s"].as_f64().unwrap_or(0.0),
        a.clients,
        s["keyed_one_sided"],
        s["cache_hits"],
        s["lookup_restarts"],
        s["server_reads"],
        s["fallback_raced"],
        s["fallback_refused"]
    );
    println!(
        "  delete-and-reuse steps that put another key in a removed key's space: {}; \
         values returned for the wrong key: {}",
        s["reuse_forced"], s["wrong_key"]
    );
    println!(
        "  pointer API delete-and-reuse steps that put another object in a deleted one's space: \
         {}; stale pointers that read, changed or freed it: {}",
        s["ptr_reuse_forced"], s["stale_reached"]
    );
    if let Some(l) = s["latency"].as_array() {
        for op in l {
            println!(
                "  {:<7} {:>7} ops  p50 {:>7.1} us  p99 {:>8.1} us",
                op["op"].as_str().unwrap_or("?"),
                op["count"],
                op["p50_us"].as_f64().unwrap_or(0.0),
                op["p99_us"].as_f64().unwrap_or(0.0)
            );
        }
    }
    for e in &events {
        println!("  {e}");
    }
    println!(
        "  failover gap (longest time without a completed operation): {:.0} ms",
        s["max_gap_ms"].as_f64().unwrap_or(0.0)
    );
    match rejoined {
        Some(r) => println!("  rejoin: the restarted node was back in sync after {r:.2} s"),
        None => println!("  rejoin: the restarted node did NOT get back in sync"),
    }
    // The verification's look-ups: on the new primary (the former
    // secondary's arena, under the same STag), every fallback explained.
    let new_primary = match killed {
        // After a whole-group crash: whichever node leads now.
        Some((0, _)) => probe
            .status_all()
            .into_iter()
            .find(|(_, r)| r.as_ref().is_ok_and(|s| s.role == PRIMARY))
            .map(|(addr, _)| addr),
        k => k.map(|(p, _)| if p == 1 { n2 } else { n1 }),
    };
    let on_new = new_primary
        .and_then(|a| s["verify_one_sided_by_node"][a.to_string()].as_u64())
        .unwrap_or(0);
    let (vraced, vrefused) = (
        s["verify_fallback_raced"].as_u64().unwrap_or(u64::MAX),
        s["verify_fallback_refused"].as_u64().unwrap_or(u64::MAX),
    );
    println!(
        "  verified at the end: {} keys, each as last acknowledged (or absent if removed); errors: {}",
        s["verified"], s["errors"]
    );
    println!(
        "  verification reads: {} one-sided, {on_new} of them on the new primary {}; \
         {} by the node (look-up raced writes: {vraced}; one-sided read refused, first \
         contact with a non-primary: {vrefused})",
        s["verify_one_sided"],
        new_primary.map(|a| a.to_string()).unwrap_or_default(),
        s["verify_server_reads"],
    );
    if let Some(e) = s["first_error"].as_str() {
        println!("  first error: {e}");
    }
    let lost = s["lost_writes"].as_u64().unwrap_or(u64::MAX);
    let resurrected = s["resurrected"].as_u64().unwrap_or(0);
    println!("  resurrected deletes: {resurrected}");
    println!(
        "  durability: {} (min_in_sync_replicas = 1){}",
        softrdma_store::config::durability(1),
        match persist {
            Some(p) => format!(
                "; persist = {p}: {}",
                match p {
                    softrdma_store::persist::Policy::Always => {
                        "every acknowledged write was durable in both nodes' logs"
                    }
                    _ => "each node's log commits at least once a second",
                }
            ),
            None => String::new(),
        }
    );
    println!("lost writes: {lost}");
    println!("(took {:.1} s)", t_start.elapsed().as_secs_f64());
    std::io::stdout().flush()?;
    // Each verifying client may find a secondary first (one refused
    // read, then it follows the primary); nothing else may send a
    // verification read to the node.
    let verify_fallbacks_ok = vraced == 0 && vrefused <= a.clients as u64;
    if !verify_fallbacks_ok {
        println!("  FAILED: verification reads fell back to the node beyond first contact");
    }
    let ok = lost == 0
        && resurrected == 0
        && verify_fallbacks_ok
        && on_new > 0
        && s["wrong_key"].as_u64() == Some(0)
        && s["stale_reached"].as_u64() == Some(0)
        && s["errors"].as_u64() == Some(0)
        && killed.is_some()
        && rejoined.is_some()
        && fin.is_some();
    drop(nodes);
    if !ok {
        bail!("demo checks failed (logs kept in {})", dir.display());
    }
    if a.workdir.is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}
