//! Child processes that end with their parent, however it ends, and the
//! store node launcher that the demo and the store bench share.
//!
//! The demo and the store bench start `softrdma store serve` nodes (the
//! bench also `redis-server`s). [`Proc`] kills and reaps its child when
//! dropped, but a parent stopped by SIGTERM, SIGKILL or a panic that
//! aborts runs no destructor, and the nodes lived on holding their ports
//! (a `softrdma demo` ended with `kill` left both). So every child is
//! started with `PR_SET_PDEATHSIG`: the kernel sends it SIGTERM when the
//! thread that started it ends, which for these callers is the main thread,
//! so the whole process (tests/child_processes.rs).

use anyhow::{bail, Context, Result};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A child process, killed (SIGKILL) and reaped when dropped, and sent
/// SIGTERM by the kernel if this process ends first.
pub struct Proc {
    pub name: String,
    pub child: Child,
}

impl Proc {
    /// Starts `cmd` so that it ends with this process (see the module).
    /// Call it from a thread that lives as long as the child should: the
    /// kernel's signal follows the starting thread, not the process.
    pub fn spawn(name: impl Into<String>, cmd: &mut Command) -> Result<Proc> {
        let name = name.into();
        let parent = std::process::id();
        // SAFETY: the closure runs in the child between fork and exec; it
        // makes two system calls (prctl, getppid), both async-signal-safe,
        // and allocates nothing (an `Errno` converts to `io::Error` without
        // allocating).
        unsafe {
            cmd.pre_exec(move || {
                use rustix::process::{getppid, set_parent_process_death_signal, Signal};
                set_parent_process_death_signal(Some(Signal::TERM))?;
                // The parent may have ended before the signal was asked for.
                match getppid() {
                    Some(p) if p.as_raw_nonzero().get() as u32 == parent => Ok(()),
                    _ => Err(rustix::io::Errno::SRCH.into()),
                }
            })
        };
        let child = cmd.spawn().with_context(|| format!("start {name}"))?;
        Ok(Proc { name, child })
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `softrdma store serve` with `cfg` in `role` (its log appended to
/// `dir/node<id>.log`, at info level with `verbose`) and waits up to 40 s
/// for its `ready` line, which it returns.
pub fn start_node(
    dir: &Path,
    id: u32,
    cfg: &Path,
    role: &str,
    verbose: bool,
) -> Result<(Proc, String)> {
    let s = spawn_node(dir, id, cfg, role, verbose)?;
    s.wait_ready()
}

/// A node started by [`spawn_node`], not yet ready.
pub struct Starting {
    p: Proc,
    rx: mpsc::Receiver<String>,
    log_path: std::path::PathBuf,
}

impl Starting {
    /// The node's process id.
    pub fn pid(&self) -> u32 {
        self.p.child.id()
    }

    /// Waits up to 40 s for the node's `ready` line.
    pub fn wait_ready(self) -> Result<(Proc, String)> {
        let Starting { p, rx, log_path } = self;
        match rx.recv_timeout(Duration::from_secs(40)) {
            Ok(l) if l.starts_with("ready") => Ok((p, l)),
            Ok(l) => bail!("{}: unexpected output {l:?}", p.name),
            Err(_) => bail!(
                "{} did not become ready (log: {})",
                p.name,
                log_path.display()
            ),
        }
    }
}

/// [`start_node`] without the wait (several nodes start at once).
pub fn spawn_node(dir: &Path, id: u32, cfg: &Path, role: &str, verbose: bool) -> Result<Starting> {
    let log_path = dir.join(format!("node{id}.log"));
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&log_path)?;
    let mut cmd = Command::new(std::env::current_exe()?);
    if verbose {
        cmd.arg("-v");
    }
    cmd.args(["store", "serve", "--config"])
        .arg(cfg)
        .args(["--role", role])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(log);
    let mut p = Proc::spawn(format!("node {id}"), &mut cmd)?;
    let out = p.child.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(|l| l.ok()) {
            let _ = tx.send(line);
        }
    });
    Ok(Starting { p, rx, log_path })
}
