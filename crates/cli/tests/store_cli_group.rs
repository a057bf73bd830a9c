//! A replica group run from the CLI alone, as docs/store.md's quick start
//! does: the coordinator (`softrdma store coordinator`, the embedded one,
//! or a real etcd), two `softrdma store serve` nodes, and the CLI's client
//! commands. A value `store put` stores is what `store get` reads back,
//! both nodes hold it, and the coordinator ends cleanly on SIGTERM.
//!
//! * `a_group_with_the_cli_coordinator`: `store coordinator --listen
//!   127.0.0.1:0 --secret-file F` (the printed line names the port).
//! * `the_cli_coordinator_takes_a_node_configuration`: `store coordinator
//!   --config node1.toml` (its `[coordinator] addr` and `[auth]` secret).
//! * `a_group_with_etcd`: the nodes coordinate through etcd.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

mod common;
use common::store::{print_log_tail, SOFTRDMA};
use common::store::{start_etcd, start_until_line, wait_for, CoordToml, NodeToml, StoreNode};
use common::{free_ports, wait_deadline, Work};

/// A process killed (SIGKILL) when dropped, unless it was waited for.
struct Running(Option<Child>);

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Starts `softrdma store coordinator ARGS` and returns it with the address
/// its first line names (`coordinator listening on ADDR (...)`).
fn start_coordinator(work: &Work, args: &[&str]) -> (Running, SocketAddr) {
    let mut cmd = Command::new(SOFTRDMA);
    cmd.args(["store", "coordinator"]).args(args);
    let log = work.path("coordinator.log");
    let (child, line) =
        start_until_line(&mut cmd, "the coordinator", &log, Duration::from_secs(20))
            .unwrap_or_else(|e| panic!("{e}"));
    let proc_ = Running(Some(child));
    let addr = line
        .strip_prefix("coordinator listening on ")
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("the coordinator's first line: {line:?}"));
    (proc_, addr)
}

/// Writes both nodes' configurations (the group secret in
/// `work/group.secret`); returns their paths and addresses.
fn write_configs(
    work: &Work,
    ports: &[u16],
    coord: CoordToml<'_>,
) -> Vec<(std::path::PathBuf, SocketAddr)> {
    let auth = common::store_auth_toml(&work.dir);
    let addrs: Vec<SocketAddr> = ports
        .iter()
        .map(|p| format!("127.0.0.1:{p}").parse().unwrap())
        .collect();
    (0..2)
        .map(|i| {
            let cfg = work.path(&format!("node{}.toml", i + 1));
            NodeToml {
                group: "cli",
                node_id: i as u32 + 1,
                listen: addrs[i],
                peer: addrs[1 - i],
                arena: "16MiB",
                lease_ttl_ms: 300,
                extra: "",
                auth: &auth,
                coordinator: coord,
            }
            .write(&cfg);
            (cfg, addrs[i])
        })
        .collect()
}

/// `softrdma store ARGS --nodes A,B --password-file work/group.secret`.
fn store_cli(work: &Work, nodes: &str, args: &[&str]) -> Output {
    Command::new(SOFTRDMA)
        .arg("store")
        .args(args)
        .args(["--nodes", nodes])
        .arg("--password-file")
        .arg(work.path("group.secret"))
        .output()
        .unwrap()
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Each node's `store status --json` object, or why there is none.
fn statuses(work: &Work, nodes: &str) -> Result<Vec<serde_json::Value>, String> {
    let out = store_cli(work, nodes, &["status", "--json"]);
    let v: Vec<serde_json::Value> = text(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    match v.len() {
        2 => Ok(v),
        _ => Err(format!("{}{}", text(&out.stdout), text(&out.stderr))),
    }
}

/// Starts the two nodes of `configs`, waits until node 1 is a redundant
/// primary with node 2 its secondary, puts a key with the CLI, reads it
/// back with the CLI and checks both nodes hold it.
fn run_group(work: &Work, configs: &[(std::path::PathBuf, SocketAddr)]) {
    let mut nodes: Vec<StoreNode> = configs
        .iter()
        .enumerate()
        .map(|(i, (cfg, _))| {
            let id = i as u32 + 1;
            StoreNode::new(id, cfg.clone(), work.path(&format!("node{id}.log")))
        })
        .collect();
    let started = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        nodes[0].start("primary");
        nodes[1].start("secondary");
        let list = format!("{},{}", configs[0].1, configs[1].1);
        wait_for("a redundant group", Duration::from_secs(30), || {
            let st = statuses(work, &list)?;
            let role = |i: usize| st[i]["role"].as_str().unwrap_or("").to_string();
            if role(0) == "primary" && st[0]["redundant"] == true && role(1) == "secondary" {
                Ok(())
            } else {
                Err(format!("{st:?}"))
            }
        });
        let value = "hello from the command line";
        let put = store_cli(work, &list, &["put", "greeting", value]);
        assert!(put.status.success(), "put: {}", text(&put.stderr));
        assert!(
            text(&put.stdout).starts_with("OK "),
            "put: {}",
            text(&put.stdout)
        );
        let get = store_cli(work, &list, &["get", "greeting"]);
        assert!(get.status.success(), "get: {}", text(&get.stderr));
        assert_eq!(
            text(&get.stdout),
            format!("{value}\n"),
            "the value read back"
        );
        // Replicated: both nodes count the object.
        wait_for("both nodes hold the key", Duration::from_secs(10), || {
            let st = statuses(work, &list)?;
            match st.iter().all(|s| s["objects"] == 1) {
                true => Ok(()),
                false => Err(format!("{st:?}")),
            }
        });
        let missing = store_cli(work, &list, &["get", "no-such-key"]);
        assert_eq!(missing.status.code(), Some(1), "a missing key");
    }));
    if let Err(p) = started {
        for n in &nodes {
            print_log_tail(&format!("node {}", n.id), &n.log, 60);
        }
        std::panic::resume_unwind(p);
    }
}

/// Sends SIGTERM to the coordinator; it must exit 0 within 5 s.
fn stop_coordinator(mut coord: Running, log: &Path) {
    let mut child = coord.0.take().unwrap();
    let st = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let st = wait_deadline(&mut child, Instant::now() + Duration::from_secs(5));
    assert!(
        st.is_some_and(|s| s.success()),
        "the coordinator did not end cleanly on SIGTERM ({st:?}); its log:\n{}",
        common::store::log_tail(log, 20)
    );
}

#[test]
fn a_group_with_the_cli_coordinator() {
    let work = Work::new("cli-group");
    // The group secret the nodes will name, in work/group.secret.
    let _ = common::store_auth_toml(&work.dir);
    let secret = work.path("group.secret");
    let (coord, addr) = start_coordinator(
        &work,
        &[
            "--listen",
            "127.0.0.1:0",
            "--secret-file",
            secret.to_str().unwrap(),
        ],
    );
    assert_ne!(addr.port(), 0, "the line names the port it got");
    let configs = write_configs(&work, &free_ports(2), CoordToml::Embedded(addr));
    run_group(&work, &configs);
    stop_coordinator(coord, &work.path("coordinator.log"));
}

#[test]
fn the_cli_coordinator_takes_a_node_configuration() {
    let work = Work::new("cli-group-config");
    let ports = free_ports(3);
    let addr: SocketAddr = format!("127.0.0.1:{}", ports[2]).parse().unwrap();
    let configs = write_configs(&work, &ports[..2], CoordToml::Embedded(addr));
    let (coord, listening) =
        start_coordinator(&work, &["--config", configs[0].0.to_str().unwrap()]);
    assert_eq!(listening, addr, "it listens on the configuration's address");
    run_group(&work, &configs);
    stop_coordinator(coord, &work.path("coordinator.log"));
}

#[test]
fn a_group_with_etcd() {
    let work = Work::new("cli-group-etcd");
    let etcd = start_etcd();
    let configs = write_configs(&work, &free_ports(2), CoordToml::Etcd(&etcd.url));
    run_group(&work, &configs);
}
