//! The siw guest (`../shared/kvm-rdma`) for the interoperability tests
//! (`interop_siw.rs`, `dropin_siw.rs`): finding it, booting it with a
//! generated script and reading its console line by line, host processes
//! beside it, rping's data, and the capture checks of one connection.
//! docs/interop.md describes how the harness and the guest talk.

use super::*;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::sync::Mutex;
use std::thread;
use std::time::{Duration, Instant};

pub const SOFTRDMA: &str = env!("CARGO_BIN_EXE_softrdma");

/// Guest boots must not overlap: the machines running CI have two cores.
pub static GUEST_LOCK: Mutex<()> = Mutex::new(());

/// Smallest `-S` rping accepts (`RPING_MIN_BUFSIZE`, see docs/rping-protocol.md).
pub const RPING_MIN_SIZE: usize = 23;
/// Largest `-S` rping accepts (`RPING_BUFSIZE - 1`).
pub const RPING_MAX_SIZE: usize = 65535;

/// The `size` bytes rping's client puts in its start buffer for ping `ping`:
/// `rdma-ping-<ping>: ` then characters 'A'..='z' rotating from a start that
/// advances by one each ping, the last byte NUL.
pub fn rping_payload(ping: usize, size: usize) -> Vec<u8> {
    assert!(size >= RPING_MIN_SIZE);
    let prefix = format!("rdma-ping-{ping}: ");
    let mut buf = vec![0u8; size];
    buf[..prefix.len()].copy_from_slice(prefix.as_bytes());
    let mut c = b'A' + (ping % 58) as u8;
    for b in buf.iter_mut().skip(prefix.len()) {
        *b = c;
        c = if c >= b'z' { b'A' } else { c + 1 };
    }
    buf[size - 1] = 0;
    buf
}

/// What `rping -v` prints, one line per ping: `ping data: ...` on the client,
/// `server ping data: ...` on the server.
pub fn rping_verbose_lines(server: bool, count: usize, size: usize) -> Vec<String> {
    let tag = if server {
        "server ping data: "
    } else {
        "ping data: "
    };
    (0..count)
        .map(|i| {
            let p = rping_payload(i, size);
            format!("{tag}{}", String::from_utf8_lossy(&p[..size - 1]))
        })
        .collect()
}

pub fn rping_verbose_text(server: bool, count: usize, size: usize) -> String {
    let mut s = rping_verbose_lines(server, count, size).join("\n");
    s.push('\n');
    s
}

pub struct GuestEnv {
    pub run_sh: PathBuf,
}

pub fn repo_root() -> PathBuf {
    let manifest = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let root = manifest.join("../..");
    root.canonicalize().unwrap_or(root)
}

pub fn shared_dir() -> PathBuf {
    match std::env::var_os("SOFTRDMA_SHARED") {
        Some(d) => PathBuf::from(d),
        None => repo_root().join("../shared"),
    }
}

pub fn guest_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("KVM_RDMA_DIR") {
        return PathBuf::from(d);
    }
    let cache = match std::env::var_os("XDG_CACHE_HOME") {
        Some(d) => PathBuf::from(d),
        None => {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into())).join(".cache")
        }
    };
    cache.join("kvm-rdma")
}

/// The guest, or `None` when `SOFTRDMA_NO_GUEST=1` allows skipping.
/// Anything missing without that variable is a failure.
pub fn guest_env(test: &str) -> Option<GuestEnv> {
    let run_sh = shared_dir().join("kvm-rdma/run.sh");
    let gdir = guest_dir();
    let mut missing = Vec::new();
    if !run_sh.is_file() {
        missing.push(format!(
            "{} (shared/ must be cloned beside the repo)",
            run_sh.display()
        ));
    }
    for f in ["vmlinuz", "base.cpio.gz"] {
        if !gdir.join(f).is_file() {
            missing.push(gdir.join(f).display().to_string());
        }
    }
    if missing.is_empty() {
        return Some(GuestEnv { run_sh });
    }
    if std::env::var("SOFTRDMA_NO_GUEST").as_deref() == Ok("1") {
        // Straight to the process's stderr: libtest would swallow eprintln!
        // output of a passing test.
        let bar = "!".repeat(72);
        let mut notice = format!(
            "\n{bar}\n!! {test}: NOT RUN: SOFTRDMA_NO_GUEST=1 and the siw guest is missing:\n"
        );
        for m in &missing {
            notice += &format!("!!   {m}\n");
        }
        notice += &format!("!! Interoperability with Linux siw was NOT tested.\n{bar}\n");
        let _ = io::Write::write_all(&mut io::stderr(), notice.as_bytes());
        return None;
    }
    panic!(
        "{test}: the siw guest is missing:\n  {}\nRun scripts/setup.sh (as root) to build it \
         (or set SOFTRDMA_NO_GUEST=1 to skip the interop tests, loudly).",
        missing.join("\n  ")
    );
}

/// Whether some socket listens on TCP `port` (any address), from /proc/net/tcp{,6}.
pub fn host_listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        fs::read_to_string(f)
            .unwrap_or_default()
            .lines()
            .skip(1)
            .any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && cols[1].ends_with(&want) && cols[3] == "0A"
            })
    })
}

/// A `softrdma` process with its stdout/stderr in files.
pub struct HostProc {
    pub name: String,
    pub args: Vec<String>,
    pub child: Child,
    pub out: PathBuf,
    pub err: PathBuf,
}

impl Drop for HostProc {
    /// A process left running (its test failed early) does not outlive it.
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl HostProc {
    pub fn spawn(work: &Work, name: &str, args: &[String]) -> HostProc {
        Self::spawn_env(work, name, args, &[])
    }

    pub fn spawn_env(work: &Work, name: &str, args: &[String], env: &[(&str, &str)]) -> HostProc {
        let out = work.path(&format!("{name}.out"));
        let err = work.path(&format!("{name}.err"));
        let child = Command::new(SOFTRDMA)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(fs::File::create(&out).unwrap())
            .stderr(fs::File::create(&err).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {SOFTRDMA}: {e}"));
        println!("host| {name}: softrdma {}", args.join(" "));
        HostProc {
            name: name.into(),
            args: args.to_vec(),
            child,
            out,
            err,
        }
    }

    /// Waits for exit (killing it at `deadline`); returns a description of
    /// what is wrong, if anything, checking the `-v` lines against `expect`.
    pub fn finish(self, deadline: Instant, expect: &[String]) -> Result<(), String> {
        self.check(deadline, Some(expect))
    }

    /// For a run that is expected to connect and then fail (MPA revision 1
    /// against rping): checks only that it connected with revision `rev`
    /// and the CRC setting asked for, and that it exited.
    pub fn connected_only(mut self, deadline: Instant, rev: u32, crc: bool) -> Result<(), String> {
        let st = wait_deadline(&mut self.child, deadline);
        let out = fs::read_to_string(&self.out).unwrap_or_default();
        let err = fs::read_to_string(&self.err).unwrap_or_default();
        println!("host| {} finished: {st:?}", self.name);
        let want = format!("(MPA rev {rev}, CRC {})", if crc { "on" } else { "off" });
        let connected = out
            .lines()
            .any(|l| l.starts_with("connected to ") && l.ends_with(&want));
        if st.is_some() && connected {
            return Ok(());
        }
        Err(format!(
            "{} (softrdma {}): expected a connection {want} and an exit; exit {st:?}\n    --- stdout:\n{}\n    --- stderr:\n{}",
            self.name,
            self.args.join(" "),
            indent(&out),
            indent(&err)
        ))
    }

    /// Waits for exit (killing it at `deadline`); Ok when it exited 0 and
    /// every string of `want` is in some line of its stdout (for
    /// `softrdma cmatose`).
    pub fn finish_lines(mut self, deadline: Instant, want: &[String]) -> Result<(), String> {
        let st = wait_deadline(&mut self.child, deadline);
        let out = fs::read_to_string(&self.out).unwrap_or_default();
        let err = fs::read_to_string(&self.err).unwrap_or_default();
        println!("host| {} finished: {st:?}", self.name);
        let mut problems = Vec::new();
        match st {
            None => problems.push("did not exit in time (killed)".to_string()),
            Some(s) if !s.success() => problems.push(s.to_string()),
            Some(_) => {}
        }
        for w in want {
            if !out.lines().any(|l| l.contains(w.as_str())) {
                problems.push(format!("no line with `{w}`"));
            }
        }
        if problems.is_empty() {
            return Ok(());
        }
        Err(format!(
            "{} (softrdma {}): {}\n    --- stdout:\n{}\n    --- stderr:\n{}",
            self.name,
            self.args.join(" "),
            problems.join("; "),
            indent(&out),
            indent(&err)
        ))
    }

    /// The report of a process that stopped (or never started listening)
    /// before its peer ran.
    pub fn premature(self) -> String {
        self.check(Instant::now(), None).err().unwrap_or_default()
    }

    pub fn check(mut self, deadline: Instant, expect: Option<&[String]>) -> Result<(), String> {
        let st = wait_deadline(&mut self.child, deadline);
        let out = fs::read_to_string(&self.out).unwrap_or_default();
        let err = fs::read_to_string(&self.err).unwrap_or_default();
        let mut problems = Vec::new();
        let expect = expect.unwrap_or_else(|| {
            problems.push("stopped before its peer ran".to_string());
            &[]
        });
        let tag = if expect.first().is_some_and(|l| l.starts_with("server ")) {
            "server ping data: "
        } else {
            "ping data: "
        };
        let got: Vec<&str> = out.lines().filter(|l| l.starts_with(tag)).collect();
        match st {
            None => problems.push("did not exit in time (killed)".to_string()),
            Some(s) if !s.success() => problems.push(s.to_string()),
            Some(_) => {}
        }
        if got.len() != expect.len() {
            problems.push(format!(
                "{} `{tag}` lines, expected {}",
                got.len(),
                expect.len()
            ));
        }
        if let Some(i) = got.iter().zip(expect).position(|(g, e)| g != e) {
            problems.push(format!(
                "line {i} differs:\n      got      {}\n      expected {}",
                clip(got[i]),
                clip(&expect[i])
            ));
        }
        println!("host| {} finished: {st:?}", self.name);
        if problems.is_empty() {
            return Ok(());
        }
        Err(format!(
            "{} (softrdma {}): {}\n    --- stdout (clipped):\n{}\n    --- stderr:\n{}",
            self.name,
            self.args.join(" "),
            problems.join("; "),
            indent(&out.lines().map(clip).collect::<Vec<_>>().join("\n")),
            indent(&err)
        ))
    }
}

pub fn clip(s: &str) -> String {
    if s.len() > 120 {
        format!("{}... ({} bytes)", &s[..120], s.len())
    } else {
        s.to_string()
    }
}

pub fn indent(s: &str) -> String {
    s.lines().map(|l| format!("      {l}\n")).collect()
}

/// Guest console lines that mean its kernel is in trouble.
pub const KERNEL_TROUBLE: [&str; 4] = ["] kernel BUG at", "] Oops:", "] BUG: ", "] Kernel panic"];

/// Shell functions for guest scripts (scripts/interop/guest-lib.sh).
pub const GUEST_LIB: &str = include_str!("../../../../scripts/interop/guest-lib.sh");

/// The start of every guest script: the helper functions, then siw0.
pub fn guest_prelude() -> String {
    format!(
        "#!/bin/sh\n# Generated by crates/cli/tests (common/guest.rs); runs in the kvm-rdma guest.\n\
         {GUEST_LIB}\n\
         siw_up || {{ echo SIW-SETUP-FAILED; exit 90; }}\n\
         echo SIW-UP\n"
    )
}

/// One guest boot running `script`, read line by line as it runs.
pub struct Guest {
    pub child: Child,
    pub lines: Receiver<String>,
    /// A line read ahead by the boot watchdog, returned first.
    pub pending: Option<String>,
    pub log: Vec<String>,
    pub deadline: Instant,
    pub started: Instant,
    pub ready_at: Option<Duration>,
    pub log_file: PathBuf,
}

/// How long a booting guest may stay silent (see [`Guest::boot`]).
pub const BOOT_LIMIT: Duration = Duration::from_secs(120);

impl Guest {
    /// Boots the guest. `fwd` are (host port, guest port) forwards; `add` are
    /// files or directories copied into the guest's /opt.
    ///
    /// A boot watchdog: the guest boots in about 7 s here (TCG, idle
    /// machine), and run.sh passes nothing on before `GUEST-READY`. Once
    /// (2026-11-25) QEMU printed nothing at all until the run's own
    /// timeout, 18 minutes later, with no traffic to the host servers: a
    /// boot that hung. A guest silent for [`BOOT_LIMIT`] is
    /// killed and booted again, once, saying so; a second silent boot is
    /// left to the run's timeout and fails the test as before.
    pub fn boot(
        env: &GuestEnv,
        work: &Work,
        script: &str,
        fwd: &[(u16, u16)],
        add: &[PathBuf],
        vm_timeout_s: u64,
    ) -> Guest {
        let mut g = Self::start(env, work, script, fwd, add, vm_timeout_s);
        match g.lines.recv_timeout(BOOT_LIMIT) {
            Ok(l) => g.pending = Some(l),
            Err(RecvTimeoutError::Timeout) => {
                println!(
                    "host| guest: nothing after {} s, not booted; killing it and booting again",
                    BOOT_LIMIT.as_secs()
                );
                kill_group(&g.child);
                let _ = g.child.wait();
                g = Self::start(env, work, script, fwd, add, vm_timeout_s);
            }
            Err(RecvTimeoutError::Disconnected) => {}
        }
        g
    }

    pub fn start(
        env: &GuestEnv,
        work: &Work,
        script: &str,
        fwd: &[(u16, u16)],
        add: &[PathBuf],
        vm_timeout_s: u64,
    ) -> Guest {
        let script_path = work.path("guest.sh");
        fs::write(&script_path, script).unwrap();
        // run.sh pipes the console through `tr` and `sed`, which buffer
        // blocks when writing to a pipe; stdbuf (inherited through
        // LD_PRELOAD) makes them pass each line on at once, so marker lines
        // arrive while the guest runs.
        let mut cmd = Command::new("stdbuf");
        cmd.args(["-oL", "-eL", "bash"]).arg(&env.run_sh);
        for (h, g) in fwd {
            cmd.arg("--fwd").arg(format!("tcp:127.0.0.1:{h}-:{g}"));
        }
        for a in add {
            cmd.arg("--add").arg(a);
        }
        cmd.arg(&script_path)
            .env("VM_TIMEOUT", vm_timeout_s.to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let started = Instant::now();
        let mut child = cmd.spawn().expect("cannot run kvm-rdma/run.sh");
        let (tx, rx) = mpsc::channel();
        let out = child.stdout.take().unwrap();
        let err = child.stderr.take().unwrap();
        let tx2 = tx.clone();
        thread::spawn(move || forward_lines(out, "", tx));
        thread::spawn(move || forward_lines(err, "[run.sh stderr] ", tx2));
        Guest {
            child,
            lines: rx,
            pending: None,
            log: Vec::new(),
            deadline: started + Duration::from_secs(vm_timeout_s + 60),
            started,
            ready_at: None,
            log_file: work.path("guest.log"),
        }
    }

    /// The next line the guest prints, `None` once it has powered off.
    pub fn next_line(&mut self) -> Option<String> {
        match self.next_line_by(self.deadline) {
            Ok(l) => l,
            Err(()) => self.abort("the guest did not finish in time (killed)"),
        }
    }

    /// Like `next_line`, but `Err` (the guest left running) when nothing
    /// comes before `until`.
    pub fn next_line_by(&mut self, until: Instant) -> Result<Option<String>, ()> {
        let left = until
            .min(self.deadline)
            .saturating_duration_since(Instant::now());
        let next = match self.pending.take() {
            Some(l) => Ok(l),
            None => self.lines.recv_timeout(left),
        };
        match next {
            Ok(l) => {
                println!("guest| {l}");
                if l.contains("GUEST-READY") && self.ready_at.is_none() {
                    self.ready_at = Some(self.started.elapsed());
                }
                self.log.push(l.clone());
                if KERNEL_TROUBLE.iter().any(|k| l.contains(k)) {
                    // Keep the oops text (a few more lines), then stop: the
                    // guest's processes are wedged and would only time out.
                    let until = Instant::now() + Duration::from_secs(3);
                    while let Ok(more) = self
                        .lines
                        .recv_timeout(until.saturating_duration_since(Instant::now()))
                    {
                        println!("guest| {more}");
                        self.log.push(more);
                        if Instant::now() >= until {
                            break;
                        }
                    }
                    self.abort("the guest kernel reported a bug (see its output)");
                }
                Ok(Some(l))
            }
            Err(RecvTimeoutError::Disconnected) => Ok(None),
            Err(RecvTimeoutError::Timeout) => Err(()),
        }
    }

    /// Powers the guest off (kills qemu) and fails the test.
    pub fn abort(&mut self, why: &str) -> ! {
        kill_group(&self.child);
        let _ = self.child.wait();
        self.fail(why)
    }

    /// Reads the rest of the output, waits for qemu, returns GUEST-EXIT's N.
    pub fn finish(&mut self) -> i32 {
        while self.next_line().is_some() {}
        let left = self.deadline.saturating_duration_since(Instant::now());
        if wait_deadline(&mut self.child, Instant::now() + left).is_none() {
            kill_group(&self.child);
            self.fail("run.sh did not exit");
        }
        println!(
            "host| guest: ready after {:.1} s, powered off after {:.1} s",
            self.ready_at.unwrap_or_default().as_secs_f64(),
            self.started.elapsed().as_secs_f64()
        );
        let exit = self.log.iter().rev().find_map(|l| {
            l.trim()
                .strip_prefix("GUEST-EXIT ")
                .map(|n| n.trim().parse::<i32>())
        });
        match exit {
            Some(Ok(n)) => n,
            _ => self.fail("no `GUEST-EXIT N` line: the guest script did not complete"),
        }
    }

    /// Fails the test with `why`. The guest's output was printed as it
    /// came (`guest| ` lines) and is written to `guest.log`; the message
    /// does not repeat it, so that `why` ends the test's output, where a
    /// CI excerpt (its first and last lines) shows it.
    pub fn fail(&self, why: &str) -> ! {
        let _ = fs::write(&self.log_file, self.log.join("\n"));
        panic!(
            "{why}\n(the guest's output is above, as `guest| ` lines, and in {})",
            self.log_file.display()
        );
    }

    /// `CASE NAME RC n DATA d ...` lines the guest script printed, by name.
    pub fn cases(&self) -> BTreeMap<String, (String, String)> {
        let mut m = BTreeMap::new();
        for l in &self.log {
            let w: Vec<&str> = l.split_whitespace().collect();
            if w.len() >= 6 && w[0] == "CASE" && w[2] == "RC" && w[4] == "DATA" {
                m.insert(w[1].to_string(), (w[3].to_string(), w[5].to_string()));
            }
        }
        m
    }
}

impl Drop for Guest {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            kill_group(&self.child);
            let _ = self.child.wait();
        }
    }
}

pub fn forward_lines(r: impl Read, prefix: &'static str, tx: mpsc::Sender<String>) {
    let mut r = BufReader::new(r);
    let mut buf = Vec::new();
    loop {
        buf.clear();
        match r.read_until(b'\n', &mut buf) {
            Ok(0) | Err(_) => return,
            Ok(_) => {
                let l = String::from_utf8_lossy(&buf);
                let l = l.trim_end_matches(['\n', '\r']);
                if tx.send(format!("{prefix}{l}")).is_err() {
                    return;
                }
            }
        }
    }
}

/// Writes rping's expected `-v` output for a case under `dir`, returns its
/// path inside the guest (`/opt/expect/NAME`).
pub fn write_expect(dir: &Path, name: &str, server: bool, count: usize, size: usize) -> String {
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join(name), rping_verbose_text(server, count, size)).unwrap();
    format!("/opt/expect/{name}")
}

/// Checks one connection's wire record against what the case asked for.
pub fn check_conn(
    conns: &BTreeMap<u16, ConnWire>,
    port: u16,
    rev: u32,
    crc: bool,
) -> Result<(), String> {
    // rping uses Send (3), RDMA Read Request (1), Read Response (2), Write (0).
    check_conn_ops(conns, port, rev, crc, &[0, 1, 2, 3])
}

/// [`check_conn`] with the RDMAP opcodes that must appear.
pub fn check_conn_ops(
    conns: &BTreeMap<u16, ConnWire>,
    port: u16,
    rev: u32,
    crc: bool,
    ops: &[u32],
) -> Result<(), String> {
    let Some(c) = conns.get(&port) else {
        return Err(format!("port {port}: no iWARP traffic decoded"));
    };
    let mut p = Vec::new();
    if c.req_rev.is_none() || c.rep_rev.is_none() {
        p.push("MPA request or reply not seen".to_string());
    }
    if c.rep_rev != Some(rev) {
        p.push(format!(
            "MPA reply revision {:?}, expected {rev}",
            c.rep_rev
        ));
    }
    if c.rejected {
        p.push("MPA reply has the reject bit".into());
    }
    if (c.req_crc || c.rep_crc) != crc {
        p.push(format!(
            "CRC flags req {} rep {}, expected CRC {crc}",
            c.req_crc, c.rep_crc
        ));
    }
    if crc && (c.fpdus_checked_crc == 0 || c.fpdus_plain_crc != 0) {
        p.push(format!(
            "CRC on, yet {} FPDUs checked and {} not",
            c.fpdus_checked_crc, c.fpdus_plain_crc
        ));
    }
    if !crc && c.fpdus_checked_crc != 0 {
        p.push(format!(
            "CRC off, yet {} FPDUs carry a checked CRC",
            c.fpdus_checked_crc
        ));
    }
    for &op in ops {
        if !c.opcodes.contains(&op) {
            p.push(format!("no RDMAP opcode {op} seen (saw {:?})", c.opcodes));
        }
    }
    if p.is_empty() {
        Ok(())
    } else {
        Err(format!("port {port}: {} ({c:?})", p.join("; ")))
    }
}

/// Complete Send messages (RDMAP opcode 3 with the DDP Last flag) on the
/// connections to server port `port`: (towards the server, from it).
pub fn send_messages(file: &Path, port: u16) -> (usize, usize) {
    let rows = tshark_fields(
        file,
        &format!("iwarp_ddp && tcp.port == {port}"),
        &["tcp.dstport", "iwarp_rdma.opcode", "iwarp_ddp.last_flag"],
    );
    let (mut up, mut down) = (0, 0);
    for f in &rows {
        if f.len() < 3 {
            continue;
        }
        let n = f[1]
            .split(',')
            .zip(f[2].split(','))
            .filter(|(op, last)| parse_num(op) == Some(3) && truthy(last))
            .count();
        if parse_num(&f[0]) == Some(port as u32) {
            up += n;
        } else {
            down += n;
        }
    }
    (up, down)
}

pub fn lock_guest() -> std::sync::MutexGuard<'static, ()> {
    GUEST_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// What ucmatose prints on stdout when all goes well (rdma-core 44).
pub fn cma_expected_lines(server: bool) -> &'static [&'static str] {
    if server {
        &[
            "cmatose: starting server",
            "initiating data transfers",
            "completing sends",
            "receiving data transfers",
            "data transfers complete",
            "cmatose: disconnecting",
            "disconnected",
            "test complete",
            "return status 0",
        ]
    } else {
        &[
            "cmatose: starting client",
            "cmatose: connecting",
            "receiving data transfers",
            "sending replies",
            "data transfers complete",
            "test complete",
            "return status 0",
        ]
    }
}

/// [`cma_expected_lines`] as a file for the guest's `report` under `dir`;
/// returns its guest path.
pub fn write_cma_expect(dir: &Path, name: &str, server: bool) -> String {
    let lines = cma_expected_lines(server);
    fs::create_dir_all(dir).unwrap();
    fs::write(dir.join(name), lines.join("\n") + "\n").unwrap();
    format!("/opt/expect/{name}")
}

// ---------------------------------------------------------------------------
// siw's CRC reports
// ---------------------------------------------------------------------------
//
// The guest's siw misreads the MPA CRC trailer of some large FPDUs (64 KiB
// Read Responses, rping's 65535-byte Reads) after QEMU's slirp has
// re-segmented them: it logs `siw: crc error. in: X, own Y, op N`, where
// its own CRC over the data (Y) is the CRC the host put on the wire and X
// the trailer misread. A test may run such a case again only when the guest
// kernel logged a new report for it and each report's `own` is a CRC that
// tshark found, and checked good, in the host's traffic (interop_siw.rs
// `run_perftest_with`, dropin_siw.rs; docs/interop.md).

/// The `own` value of a guest kernel line `siw: crc error. in: X, own Y,
/// op N` (printed as a little-endian word: the bytes swapped against the
/// big-endian value tshark shows).
pub fn parse_siw_crc_own(line: &str) -> Option<u32> {
    let own = line.split("own ").nth(1)?;
    let hex: String = own.chars().take_while(|c| c.is_ascii_hexdigit()).collect();
    u32::from_str_radix(&hex, 16).ok()
}

/// The MPA CRCs (as tshark reads them, big-endian) of every FPDU that
/// `filter` (a tshark display filter: `tcp.srcport == P` for a host
/// server's, `tcp.dstport == P` for a host client's) selects.
pub fn sent_crcs(file: &Path, filter: &str) -> BTreeSet<u32> {
    tshark_fields(
        file,
        &format!("({filter}) && iwarp_mpa.crc_check"),
        &["iwarp_mpa.crc_check"],
    )
    .iter()
    .flat_map(|row| row[0].split(','))
    .filter_map(parse_num)
    .collect()
}

/// Whether siw's own CRC (`own`, as its kernel prints it) is one of the
/// CRCs tshark found on the wire (`sent`): siw computed what we sent.
pub fn siw_own_crc_was_sent(own: u32, sent: &BTreeSet<u32>) -> bool {
    sent.contains(&own.swap_bytes())
}

/// Guest shell: `crcs` counts the kernel's siw CRC reports so far (run
/// before an attempt).
pub const SIW_CRC_COUNT: &str = "crcs=$(dmesg | grep -c 'siw: crc error')\n";

/// Guest shell: true when the kernel logged siw CRC reports since
/// [`SIW_CRC_COUNT`].
pub const SIW_CRC_NEW: &str = "[ \"$(dmesg | grep -c 'siw: crc error')\" -gt \"$crcs\" ]";

/// Guest shell: prints the reports since [`SIW_CRC_COUNT`] as
/// `SIWCRC NAME| crc error. in: X, own Y, op N`.
pub fn siw_crc_lines(name: &str) -> String {
    format!(
        "dmesg | grep 'siw: crc error' | sed -n \"$((crcs + 1)),\\$p\" | sed 's/^.*siw: /SIWCRC {name}| /'\n"
    )
}
