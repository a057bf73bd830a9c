//! Helpers shared by the CLI's integration tests: scratch directories,
//! process clean-up, and tshark captures of loopback traffic decoded with
//! Wireshark's iWARP dissectors.
#![allow(dead_code)]

pub mod guest;
pub mod history;
pub mod resp;
pub mod store;

use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// `n` bytes that differ at every offset (xorshift), by seed.
pub fn pattern(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// `n` distinct free TCP ports on 127.0.0.1: all `n` listeners are held at
/// once before any is released, so the same port cannot come back twice.
pub fn free_ports(n: usize) -> Vec<u16> {
    let listeners: Vec<std::net::TcpListener> = (0..n)
        .map(|_| std::net::TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    listeners
        .iter()
        .map(|l| l.local_addr().unwrap().port())
        .collect()
}

/// The group secret every store test configures (issue 29: nodes admit
/// only clients and nodes that prove it).
pub const STORE_SECRET: &str = "test-group-secret-8f2c-not-for-production";

/// The credential of the store tests' clients: the `default` user, whose
/// password is the group secret.
pub fn store_auth() -> softrdma_store::net::handshake::ClientAuth {
    softrdma_store::net::handshake::ClientAuth {
        user: "default".into(),
        secret: softrdma_store::auth::Secret::new(STORE_SECRET.as_bytes()),
    }
}

/// Writes the group secret to `dir/group.secret` (mode 0600) and returns
/// the `[auth]` section that names it, for a node's configuration.
pub fn store_auth_toml(dir: &Path) -> String {
    use std::os::unix::fs::PermissionsExt;
    let f = dir.join("group.secret");
    fs::write(&f, format!("{STORE_SECRET}\n")).unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o600)).unwrap();
    format!("[auth]\nsecret_file = \"{}\"\n", f.display())
}

pub fn require_tool(tool: &str) {
    let ok = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .stdout(Stdio::null())
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(ok, "`{tool}` not found: run scripts/setup.sh");
}

/// A scratch directory (guest script, expected data, logs, capture), removed
/// when the test passes, kept when it fails or SOFTRDMA_KEEP_WORK=1.
pub struct Work {
    pub dir: PathBuf,
}

impl Work {
    pub fn new(name: &str) -> Work {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let dir = std::env::temp_dir().join(format!(
            "softrdma-test-{name}-{}-{nanos}",
            std::process::id()
        ));
        fs::create_dir_all(&dir).unwrap();
        Work { dir }
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.join(name)
    }
}

impl Drop for Work {
    fn drop(&mut self) {
        if thread::panicking() || std::env::var("SOFTRDMA_KEEP_WORK").as_deref() == Ok("1") {
            let msg = format!("test files kept in {}\n", self.dir.display());
            let _ = io::Write::write_all(&mut io::stderr(), msg.as_bytes());
        } else {
            let _ = fs::remove_dir_all(&self.dir);
        }
    }
}

/// Kills (SIGKILL) `child` and everything descended from it: its process
/// group, and by pid every descendant found in /proc (coreutils `timeout`,
/// which run.sh uses around qemu, moves itself and qemu to a group of
/// their own).
pub fn kill_group(child: &Child) {
    let root = child.id();
    let mut parent_of = Vec::new();
    for e in fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let stat = fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        // "pid (comm) state ppid ...": comm may hold spaces; split after ')'.
        if let Some(ppid) = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok())
        {
            parent_of.push((pid, ppid));
        }
    }
    let mut tree = vec![root];
    let mut i = 0;
    while i < tree.len() {
        let p = tree[i];
        tree.extend(parent_of.iter().filter(|(_, pp)| *pp == p).map(|(c, _)| *c));
        i += 1;
    }
    let mut args = vec!["-KILL".to_string(), "--".to_string(), format!("-{root}")];
    args.extend(tree.iter().map(|p| p.to_string()));
    let _ = Command::new("kill")
        .args(&args)
        .stderr(Stdio::null())
        .status();
}

/// Waits for `child` until `deadline`; kills it (SIGKILL) past it.
pub fn wait_deadline(child: &mut Child, deadline: Instant) -> Option<ExitStatus> {
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            return Some(st);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// A running `tshark -i lo` capture.
pub struct Capture {
    child: Option<Child>,
    file: PathBuf,
    err: PathBuf,
}

impl Capture {
    pub fn start(work: &Work, ports: &[u16]) -> Capture {
        require_tool("tshark");
        let file = work.path("capture.pcapng");
        let err = work.path("tshark.err");
        // A port nobody listens on, for the start-up probes below.
        let probe = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .unwrap()
            .port();
        let filter = ports
            .iter()
            .chain([&probe])
            .map(|p| format!("tcp port {p}"))
            .collect::<Vec<_>>()
            .join(" or ");
        let child = Command::new("tshark")
            // A 64 MiB kernel buffer (the default is 2): on a busy two-core
            // machine dumpcap can fall behind a burst of MiB-sized messages,
            // and a packet it drops is a message the checks count as missing.
            .args(["-q", "-i", "lo", "-B", "64", "-f", &filter, "-w"])
            .arg(&file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&err).unwrap())
            // Its own process group: tshark runs dumpcap, which must go too.
            .process_group(0)
            .spawn()
            .expect("cannot start tshark");
        let mut cap = Capture {
            child: Some(child),
            file,
            err,
        };
        // "Capturing on 'Loopback: lo'" comes first, but dumpcap may start
        // capturing a moment later: the connection attempts to `probe`
        // (refused: a SYN and a RST) go on until their packets reach the
        // file. From then on nothing on the filtered ports is missed.
        let deadline = Instant::now() + Duration::from_secs(30);
        let size = |f: &Path| fs::metadata(f).map(|m| m.len()).unwrap_or(0);
        let mut header = None;
        loop {
            let e = fs::read_to_string(&cap.err).unwrap_or_default();
            let exited = cap.child.as_mut().unwrap().try_wait().unwrap();
            if exited.is_some() || Instant::now() > deadline {
                panic!(
                    "tshark capture did not start ({exited:?}); tshark needs root or \
                     capture rights (scripts/setup.sh). Its stderr:\n{e}"
                );
            }
            if e.contains("Capturing on") {
                let now = size(&cap.file);
                match header {
                    // The file holds its header; probes grow it.
                    None if now > 0 => header = Some(now),
                    Some(h) if now > h => break,
                    _ => {}
                }
                let _ = std::net::TcpStream::connect(("127.0.0.1", probe));
            }
            thread::sleep(Duration::from_millis(50));
        }
        println!("host| tshark capturing on lo, filter `{filter}`");
        cap
    }

    /// Stops the capture (SIGINT, so tshark finishes the file) and returns it.
    pub fn stop(mut self) -> PathBuf {
        // dumpcap may lag behind a burst (MiB-sized messages on a busy
        // two-core machine), and what it has not read from the kernel when
        // it stops is lost: wait until the file has stopped growing.
        let size = |f: &Path| fs::metadata(f).map(|m| m.len()).unwrap_or(0);
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut last = size(&self.file);
        let mut still = 0;
        while still < 10 && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(100));
            let now = size(&self.file);
            still = if now == last { still + 1 } else { 0 };
            last = now;
        }
        let mut child = self.child.take().unwrap();
        let _ = Command::new("kill")
            .args(["-INT", &child.id().to_string()])
            .status();
        if wait_deadline(&mut child, Instant::now() + Duration::from_secs(30)).is_none() {
            panic!("tshark did not stop");
        }
        assert!(self.file.is_file(), "tshark wrote no capture file");
        // tshark reports "N packets dropped from lo" on stop when dumpcap
        // lost any: then the capture is incomplete and a count taken from it
        // means nothing, so say so rather than fail a count further on.
        let err = fs::read_to_string(&self.err).unwrap_or_default();
        let dropped: Vec<&str> = err
            .lines()
            .filter(|l| {
                let n = l
                    .split_whitespace()
                    .next()
                    .and_then(|w| w.parse::<u64>().ok());
                l.contains("dropped") && n.is_some_and(|n| n > 0)
            })
            .collect();
        assert!(
            dropped.is_empty(),
            "the capture is incomplete (the traffic went through, the capture lost \
             packets): {}",
            dropped.join("; ")
        );
        self.file.clone()
    }
}

impl Drop for Capture {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            kill_group(&c);
            let _ = c.wait();
        }
    }
}

/// tshark reading `file` with the iWARP dissectors (heuristic: the capture
/// must hold each connection's MPA request and reply), with the two
/// sub-dissectors that misread short Sends turned off, and with TCP
/// reassembly of out-of-order segments on: loopback traffic from the guest
/// (QEMU's slirp writing from its own thread) now and then reaches the
/// capture, and the receiver, out of order (the receiver SACKs it), and
/// without this tshark leaves the FPDUs of such a segment undecoded (one
/// Send of 100 missing from a capture of a fresh-clone CI run here).
pub fn tshark_read(file: &Path, extra: &[&str]) -> String {
    let out = Command::new("tshark")
        .arg("-r")
        .arg(file)
        .args([
            "-o",
            "tcp.try_heuristic_first:TRUE",
            "-o",
            "tcp.reassemble_out_of_order:TRUE",
            "--enable-heuristic",
            "iwarp_mpa_tcp",
            "--disable-protocol",
            "rpcordma",
            "--disable-protocol",
            "smb_direct",
        ])
        .args(extra)
        .output()
        .expect("cannot run tshark");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "tshark {extra:?} failed: {stderr}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `tshark -T fields`: for each frame that matches `filter`, the values of
/// `names` (a field that occurs several times in a frame gives its values
/// joined with ','); frames whose fields are all empty are left out.
pub fn tshark_fields(file: &Path, filter: &str, names: &[&str]) -> Vec<Vec<String>> {
    let mut args = vec![
        "-Y",
        filter,
        "-T",
        "fields",
        "-E",
        "occurrence=a",
        "-E",
        "aggregator=,",
    ];
    for n in names {
        args.push("-e");
        args.push(n);
    }
    tshark_read(file, &args)
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.split('\t').map(str::to_string).collect())
        .collect()
}

/// What one TCP connection carried, as the dissectors saw it.
#[derive(Default, Debug)]
pub struct ConnWire {
    pub req_rev: Option<u32>,
    pub rep_rev: Option<u32>,
    pub req_crc: bool,
    pub rep_crc: bool,
    pub rejected: bool,
    pub fpdus_plain_crc: usize,
    pub fpdus_checked_crc: usize,
    pub opcodes: BTreeSet<u32>,
}

pub fn parse_num(s: &str) -> Option<u32> {
    let s = s.trim();
    match s.strip_prefix("0x") {
        Some(h) => u32::from_str_radix(h, 16).ok(),
        None => s.parse().ok(),
    }
}

pub fn truthy(s: &str) -> bool {
    matches!(s.trim(), "1" | "True" | "true")
}

const MALFORMED: &str = "_ws.malformed || iwarp_mpa.bad_length";

/// The malformed frames of `file` (frame number, TCP stream), leaving out
/// those of a connection that reused an earlier connection's ports in the
/// same capture, when that connection decodes cleanly on its own.
/// tshark's MPA dissector keeps its state per address/port pair, so it
/// reads the MPA request of a reused pair as an FPDU of the earlier
/// connection (seen once the engine reset a siw peer's FIN: no TIME_WAIT
/// is left on either side, and the host's kernel soon hands the same
/// ephemeral port to qemu again). Each such connection is written to a
/// file of its own and checked there, so nothing goes unchecked.
fn malformed_frames(file: &Path) -> Vec<(u64, u64)> {
    let rows = |f: &Path, filter: &str| -> Vec<(u64, u64)> {
        tshark_read(
            f,
            &[
                "-Y",
                filter,
                "-T",
                "fields",
                "-e",
                "frame.number",
                "-e",
                "tcp.stream",
            ],
        )
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.parse().ok()?, w.next()?.parse().ok()?))
        })
        .collect()
    };
    let bad = rows(file, MALFORMED);
    if bad.is_empty() {
        return bad;
    }
    let reused: BTreeSet<u64> = rows(file, "tcp.analysis.reused_ports")
        .into_iter()
        .map(|(_, s)| s)
        .collect();
    let streams: BTreeSet<u64> = bad.iter().map(|(_, s)| *s).collect();
    let mut left: Vec<(u64, u64)> = bad
        .iter()
        .filter(|(_, s)| !reused.contains(s))
        .copied()
        .collect();
    for s in streams.intersection(&reused) {
        let one = file.with_extension(format!("stream{s}.pcapng"));
        let st = Command::new("tshark")
            .arg("-r")
            .arg(file)
            .args(["-Y", &format!("tcp.stream == {s}"), "-w"])
            .arg(&one)
            .status()
            .expect("cannot run tshark");
        assert!(
            st.success(),
            "tshark could not write stream {s} to {}",
            one.display()
        );
        let again = rows(&one, MALFORMED);
        if !again.is_empty() {
            // Report them by their frame numbers in the whole capture.
            left.extend(bad.iter().filter(|(_, x)| x == s).copied());
        }
        let _ = std::fs::remove_file(&one);
    }
    left
}

/// Decodes `file` and checks it as a whole: no malformed frame, no bad CRC.
/// Returns what each server port's connections carried.
pub fn analyse_capture(file: &Path, server_ports: &[u16]) -> BTreeMap<u16, ConnWire> {
    let malformed = malformed_frames(file);
    assert!(
        malformed.is_empty(),
        "malformed frames in {}: {}\n{}",
        file.display(),
        malformed
            .iter()
            .map(|(f, _)| f.to_string())
            .collect::<Vec<_>>()
            .join(" "),
        tshark_read(file, &["-Y", MALFORMED, "-V"])
    );
    let rows = tshark_fields(
        file,
        "iwarp_mpa",
        &[
            "tcp.srcport",
            "tcp.dstport",
            "iwarp_mpa.key.req",
            "iwarp_mpa.key.rep",
            "iwarp_mpa.rev",
            "iwarp_mpa.crc_flag",
            "iwarp_mpa.rej_flag",
            "iwarp_mpa.crc",
            "iwarp_mpa.crc_check",
            "iwarp_rdma.opcode",
        ],
    );
    let mut conns: BTreeMap<u16, ConnWire> = BTreeMap::new();
    let mut checked_total = 0;
    for row in &rows {
        let f: Vec<&str> = row.iter().map(String::as_str).collect();
        if f.len() < 10 {
            continue;
        }
        let (sp, dp) = (
            parse_num(f[0]).unwrap_or(0) as u16,
            parse_num(f[1]).unwrap_or(0) as u16,
        );
        let Some(port) = server_ports.iter().copied().find(|p| *p == sp || *p == dp) else {
            continue;
        };
        let c = conns.entry(port).or_default();
        let list = |s: &str| {
            s.split(',')
                .filter(|x| !x.is_empty())
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        if !f[2].is_empty() {
            c.req_rev = parse_num(f[4]);
            c.req_crc = truthy(f[5]);
        }
        if !f[3].is_empty() {
            c.rep_rev = parse_num(f[4]);
            c.rep_crc = truthy(f[5]);
            c.rejected |= truthy(f[6]);
        }
        c.fpdus_plain_crc += list(f[7]).len();
        let checked = list(f[8]).len();
        c.fpdus_checked_crc += checked;
        checked_total += checked;
        for op in list(f[9]) {
            if let Some(n) = parse_num(&op) {
                c.opcodes.insert(n);
            }
        }
    }
    if checked_total > 0 {
        let text = tshark_read(file, &["-Y", "iwarp_mpa.crc_check", "-V"]);
        let good = text.matches("(Good CRC32)").count();
        let bad: Vec<&str> = text.lines().filter(|l| l.contains("Bad CRC32")).collect();
        assert!(
            bad.is_empty(),
            "bad MPA CRCs in {}:\n{}",
            file.display(),
            bad.join("\n")
        );
        assert_eq!(
            good, checked_total,
            "CRC checks: {good} good of {checked_total}"
        );
    }
    conns
}

/// Runs `softrdma ARGS` (which must succeed) and parses its stdout as one
/// JSON object per line.
pub fn softrdma_json(args: &[&str]) -> Vec<serde_json::Value> {
    let out = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(args)
        .output()
        .expect("run softrdma");
    assert!(
        out.status.success(),
        "softrdma {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("UTF-8 output")
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}
