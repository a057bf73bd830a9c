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

use softrdma_store::coord::embedded::EmbeddedServer;
use softrdma_store::net::client::{ClientConfig, StoreClient};
use softrdma_store::proto::StatusInfo;

/// `StatusInfo::role` of a primary and of a secondary.
pub const PRIMARY: u8 = 2;
pub const SECONDARY: u8 = 1;

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

/// A two-node test group: `softrdma store serve` processes on loopback,
/// the embedded coordinator (or etcd), a probe client; a failing test
/// prints the nodes' logs.
pub struct Group {
    pub dir: PathBuf,
    pub _coord: EmbeddedServer,
    pub nodes: Vec<StoreNode>,
    pub addrs: Vec<SocketAddr>,
    /// RESP ports by node ([`Group::with_resp`]; else empty).
    pub resp: Vec<u16>,
    pub probe: StoreClient,
}

/// A failing test shows the nodes' logs (CI keeps no files).
impl Drop for Group {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        for n in &mut self.nodes {
            n.kill();
        }
        for n in &self.nodes {
            print_log_tail(&format!("node {}", n.id), &n.log, 80);
        }
    }
}

impl Group {
    pub fn new(name: &str, arena: &str) -> Group {
        Group::with_coordinator(name, arena, None)
    }

    /// `etcd`: client URL of an etcd to coordinate through (else the
    /// embedded coordinator, which this test process runs).
    pub fn with_coordinator(name: &str, arena: &str, etcd: Option<&str>) -> Group {
        Group::with_config(name, arena, etcd, "")
    }

    /// `extra`: more lines for both nodes' configuration files (`{node}`
    /// in them is each node's id).
    pub fn with_config(name: &str, arena: &str, etcd: Option<&str>, extra: &str) -> Group {
        Group::with_options(name, arena, etcd, extra, false, "")
    }

    /// Each node also serves RESP, on the ports in `resp`.
    pub fn with_resp(name: &str, arena: &str) -> Group {
        Group::with_options(name, arena, None, "", true, "")
    }

    /// RESP too, and `users` (`[[auth.users]]` tables) beside the group
    /// secret.
    pub fn with_users(name: &str, arena: &str, users: &str) -> Group {
        Group::with_options(name, arena, None, "", true, users)
    }

    pub fn with_options(
        name: &str,
        arena: &str,
        etcd: Option<&str>,
        extra: &str,
        resp: bool,
        users: &str,
    ) -> Group {
        // `free_ports` hands out ports that were free a moment ago; another
        // test's connection may take one before the node binds it. That
        // (and only that) is worth another try with new ports.
        for attempt in 1.. {
            match Group::try_with_config(name, arena, etcd, extra, resp, users) {
                Ok(g) => return g,
                Err(e) if attempt < 3 && e.contains("Address already in use") => {
                    eprintln!("a node's port was taken meanwhile; new ports (attempt {attempt})");
                }
                Err(e) => panic!("{e}"),
            }
        }
        unreachable!()
    }

    fn try_with_config(
        name: &str,
        arena: &str,
        etcd: Option<&str>,
        extra: &str,
        resp: bool,
        users: &str,
    ) -> Result<Group, String> {
        let dir = std::env::temp_dir().join(format!("softrdma-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let coord = EmbeddedServer::start_with(
            "127.0.0.1:0".parse().unwrap(),
            Some(softrdma_store::auth::Secret::new(
                super::STORE_SECRET.as_bytes(),
            )),
        )
        .unwrap();
        let auth = super::store_auth_toml(&dir);
        let ports = super::free_ports(if resp { 4 } else { 2 });
        let addrs: Vec<SocketAddr> = ports[..2]
            .iter()
            .map(|p| format!("127.0.0.1:{p}").parse().unwrap())
            .collect();
        let resp_ports = ports[2..].to_vec();
        let mut nodes = Vec::new();
        for i in 0..2 {
            let id = i as u32 + 1;
            let cfg = dir.join(format!("node{id}.toml"));
            NodeToml {
                group: name,
                node_id: id,
                listen: addrs[i],
                peer: addrs[1 - i],
                arena,
                lease_ttl_ms: 300,
                // (`{node}` in `extra` is the node's id; its tables, such
                // as `[persist]`, come last.)
                extra: &match resp_ports.get(i) {
                    Some(p) => format!("resp = \"127.0.0.1:{p}\"\n{extra}"),
                    None => extra.to_string(),
                }
                .replace("{node}", &id.to_string()),
                auth: &format!("{auth}{users}"),
                coordinator: match etcd {
                    None => CoordToml::Embedded(coord.addr()),
                    Some(url) => CoordToml::Etcd(url),
                },
            }
            .write(&cfg);
            nodes.push(StoreNode::new(id, cfg, dir.join(format!("node{id}.log"))));
        }
        nodes[0].try_start("primary")?;
        nodes[1].try_start("secondary")?;
        let probe = StoreClient::new(client_config(&addrs)).unwrap();
        let mut g = Group {
            dir,
            _coord: coord,
            nodes,
            addrs,
            resp: resp_ports,
            probe,
        };
        g.wait_redundant(Duration::from_secs(30), 0);
        Ok(g)
    }

    pub fn status(&mut self) -> Vec<StatusInfo> {
        self.probe
            .status_all()
            .into_iter()
            .filter_map(|(_, r)| r.ok())
            .collect()
    }

    /// Waits until a primary reports the group redundant at an epoch above
    /// `after` and the other node answers as its secondary at that same
    /// epoch; returns the primary's id. A node restarted a moment ago must
    /// pass `after` = the epoch before it went down: until the primary
    /// notices the old incarnation's death it still reports the group
    /// redundant, and only registering the new one raises the epoch.
    pub fn wait_redundant(&mut self, timeout: Duration, after: u64) -> u32 {
        let deadline = Instant::now() + timeout;
        loop {
            let st = self.status();
            if st.len() == 2 {
                if let Some(p) = st.iter().find(|s| s.role == PRIMARY && s.redundant) {
                    let s = st.iter().find(|s| s.node != p.node).unwrap();
                    if p.epoch > after && s.role == SECONDARY && s.epoch == p.epoch {
                        return p.node;
                    }
                }
            }
            assert!(
                Instant::now() < deadline,
                "group not redundant in {timeout:?}: {st:?} (logs in {})",
                self.dir.display()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The primary's epoch now.
    pub fn epoch(&mut self) -> u64 {
        let p = self.primary();
        self.status()
            .iter()
            .find(|s| s.node == p)
            .map_or(0, |s| s.epoch)
    }

    pub fn primary(&mut self) -> u32 {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(p) = self.status().iter().find(|s| s.role == PRIMARY) {
                return p.node;
            }
            assert!(Instant::now() < deadline, "no primary");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn nodes_arg(&self) -> String {
        format!("{},{}", self.addrs[0], self.addrs[1])
    }
}
