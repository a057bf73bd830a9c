//! What the store tests share (store_ha.rs, store_partition.rs,
//! store_cli_group.rs): `softrdma store serve` nodes started and waited for
//! (their `ready` line, no sleeps), their configuration files, clients
//! that prove the group secret, a real etcd, polling until a state is
//! reached.

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use softrdma_store::net::client::ClientConfig;

/// The `softrdma` binary cargo built for these tests.
pub const SOFTRDMA: &str = env!("CARGO_BIN_EXE_softrdma");

/// A client configuration for the test groups (they require the group
/// secret, [`super::STORE_SECRET`]).
pub fn client_config(nodes: &[SocketAddr]) -> ClientConfig {
    let mut c = ClientConfig::new(nodes.to_vec());
    c.auth = Some(super::store_auth());
    c
}

/// The last `n` lines of the file at `path` (empty if unreadable).
pub fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// Prints the last `n` lines of a log to stderr (a failing test shows
/// them: CI keeps no files).
pub fn print_log_tail(what: &str, path: &Path, n: usize) {
    eprintln!("---- last lines of {what} ({}) ----", path.display());
    eprintln!("{}", log_tail(path, n));
}

/// Starts `cmd` with its stdout piped and its stderr appended to `log`,
/// and waits up to `timeout` for its first line of output, which it
/// returns with the child (the rest of its output is read and dropped).
/// Err, with the log's tail, when nothing came in time (the child is then
/// killed).
pub fn start_until_line(
    cmd: &mut Command,
    what: &str,
    log: &Path,
    timeout: Duration,
) -> Result<(Child, String), String> {
    let err = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(err)
        .spawn()
        .unwrap_or_else(|e| panic!("start {what}: {e}"));
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(|l| l.ok()) {
            let _ = tx.send(l);
        }
    });
    match rx.recv_timeout(timeout) {
        Ok(l) => Ok((child, l)),
        Err(e) => {
            // Stop it and show what it said (CI keeps no files).
            let _ = child.kill();
            let st = child.wait();
            Err(format!(
                "{what} did not get ready ({e:?}, exit {st:?}); its log ({}):\n{}",
                log.display(),
                log_tail(log, 60)
            ))
        }
    }
}

/// One `softrdma -v store serve` process: started with a role hint, ready
/// once it printed its `ready` line, killed (SIGKILL) by [`StoreNode::kill`]
/// or when dropped.
pub struct StoreNode {
    pub id: u32,
    pub cfg: PathBuf,
    /// Its stderr (log lines), appended to across restarts.
    pub log: PathBuf,
    /// The command it runs under (`ip netns exec NS`); empty: none.
    pub wrap: Vec<String>,
    /// How long [`StoreNode::try_start`] waits for the `ready` line.
    pub ready_timeout: Duration,
    pub child: Option<Child>,
}

impl Drop for StoreNode {
    fn drop(&mut self) {
        self.kill();
    }
}

impl StoreNode {
    /// Node `id` with configuration `cfg` and its log in `log`.
    pub fn new(id: u32, cfg: PathBuf, log: PathBuf) -> StoreNode {
        StoreNode {
            id,
            cfg,
            log,
            wrap: Vec::new(),
            ready_timeout: Duration::from_secs(40),
            child: None,
        }
    }

    /// The node runs in network namespace `ns` (`ip netns exec` execs the
    /// command: the child is the node itself).
    pub fn in_netns(mut self, ns: &str) -> StoreNode {
        self.wrap = ["ip", "netns", "exec", ns].map(String::from).to_vec();
        self.ready_timeout = Duration::from_secs(20);
        self
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill(); // SIGKILL
            let _ = c.wait();
        }
    }

    pub fn start(&mut self, role: &str) {
        if let Err(e) = self.try_start(role) {
            panic!("{e}");
        }
    }

    /// Starts the node; Err (with its log's tail) if it did not get ready.
    pub fn try_start(&mut self, role: &str) -> Result<(), String> {
        assert!(self.child.is_none());
        let mut cmd = match self.wrap.split_first() {
            Some((prog, args)) => {
                let mut c = Command::new(prog);
                c.args(args).arg(SOFTRDMA);
                c
            }
            None => Command::new(SOFTRDMA),
        };
        cmd.args(["-v", "store", "serve", "--config"])
            .arg(&self.cfg)
            .args(["--role", role]);
        let what = format!("node {}", self.id);
        let (child, line) = start_until_line(&mut cmd, &what, &self.log, self.ready_timeout)?;
        // Keep the child (so it is killed) before checking.
        self.child = Some(child);
        assert!(line.starts_with("ready"), "node {}: {line}", self.id);
        Ok(())
    }

    /// The running process's id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }
}

/// The coordinator a node's configuration names.
#[derive(Clone, Copy)]
pub enum CoordToml<'a> {
    /// `kind = "embedded"` at this address.
    Embedded(SocketAddr),
    /// `kind = "etcd"` at this client URL.
    Etcd(&'a str),
}

/// The configuration file of one node of a two-node test group (the
/// tests' timings: heartbeats every 50 ms, a peer failed after 250 ms).
pub struct NodeToml<'a> {
    pub group: &'a str,
    pub node_id: u32,
    pub listen: SocketAddr,
    pub peer: SocketAddr,
    pub arena: &'a str,
    pub lease_ttl_ms: u64,
    /// More top-level lines.
    pub extra: &'a str,
    /// The `[auth]` section (and any `[[auth.users]]` tables).
    pub auth: &'a str,
    pub coordinator: CoordToml<'a>,
}

impl NodeToml<'_> {
    pub fn text(&self) -> String {
        format!(
            "group = \"{}\"\nnode_id = {}\nlisten = \"{}\"\npeers = [\"{}\"]\n\
             arena_size = \"{}\"\nheartbeat_interval_ms = 50\nheartbeat_timeout_ms = 250\n\
             lease_ttl_ms = {}\n{}\n{}\n[coordinator]\n{}\n",
            self.group,
            self.node_id,
            self.listen,
            self.peer,
            self.arena,
            self.lease_ttl_ms,
            self.extra,
            self.auth,
            match self.coordinator {
                CoordToml::Embedded(a) => format!("kind = \"embedded\"\naddr = \"{a}\""),
                CoordToml::Etcd(url) => format!("kind = \"etcd\"\nendpoints = [\"{url}\"]"),
            }
        )
    }

    /// Writes the file.
    pub fn write(&self, path: &Path) {
        std::fs::write(path, self.text()).unwrap();
    }
}

/// Polls `f` until it gives a value; panics after `timeout` with the last
/// state `f` described. Returns the value and the time it took.
pub fn wait_for<T>(
    what: &str,
    timeout: Duration,
    mut f: impl FnMut() -> Result<T, String>,
) -> (T, Duration) {
    let t0 = Instant::now();
    loop {
        match f() {
            Ok(v) => return (v, t0.elapsed()),
            Err(state) => assert!(
                t0.elapsed() < timeout,
                "{what}: not reached in {timeout:?}; last state: {state}"
            ),
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A running etcd, killed and its data removed when dropped.
pub struct Etcd {
    child: Child,
    dir: PathBuf,
    pub url: String,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Debian's etcd on free loopback ports (installed by scripts/setup.sh),
/// once it answers.
pub fn start_etcd() -> Etcd {
    static N: AtomicU32 = AtomicU32::new(0);
    let bin = ["/usr/bin/etcd", "/usr/local/bin/etcd"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("etcd not found: run scripts/setup.sh (apt-get install etcd-server)");
    let (cp, pp) = match super::free_ports(2)[..] {
        [c, p] => (c, p),
        _ => unreachable!(),
    };
    // Its own data directory, also when two tests of a process run one.
    let dir = std::env::temp_dir().join(format!(
        "softrdma-ha-etcd-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let url = format!("http://127.0.0.1:{cp}");
    let peer = format!("http://127.0.0.1:{pp}");
    let child = Command::new(bin)
        .args(["--name", "t", "--data-dir"])
        .arg(&dir)
        .args([
            "--listen-client-urls",
            &url,
            "--advertise-client-urls",
            &url,
        ])
        .args([
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ])
        .args(["--initial-cluster", &format!("t={peer}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn etcd");
    let e = Etcd { child, dir, url };
    wait_for("etcd answers", Duration::from_secs(20), || {
        use softrdma_store::coord::Coordinator;
        softrdma_store::coord::etcd::EtcdCoordinator::connect(std::slice::from_ref(&e.url))
            .and_then(|c| c.get("probe"))
            .map(drop)
            .map_err(|err| err.to_string())
    });
    e
}
