//! A command's child processes end with it, however it ends (issue 31,
//! "clean output": a `softrdma demo` stopped with SIGTERM left its two
//! `store serve` nodes running, holding their ports).

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The children of `pid` (every thread's), with their command lines.
fn children(pid: u32) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let list = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        for c in list
            .split_whitespace()
            .filter_map(|c| c.parse::<u32>().ok())
        {
            let cmd = std::fs::read(format!("/proc/{c}/cmdline")).unwrap_or_default();
            let cmd = String::from_utf8_lossy(&cmd).replace('\0', " ");
            out.push((c, cmd));
        }
    }
    out
}

/// Whether `pid` still runs (a zombie nobody reaped has ended).
fn running(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| r.chars().next()))
        .flatten()
        .is_some_and(|state| state != 'Z')
}

#[test]
fn a_demo_stopped_with_sigterm_leaves_no_node_behind() {
    let work = std::env::temp_dir().join(format!("softrdma-child-test-{}", std::process::id()));
    let mut demo = Command::new(env!("CARGO_BIN_EXE_softrdma"))
        .args(["demo", "--duration", "120", "--workdir"])
        .arg(&work)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = demo.id();
    // Both nodes print their `ready` line through the demo.
    let mut lines = BufReader::new(demo.stdout.take().unwrap()).lines();
    let mut ready = 0;
    let mut seen = String::new();
    while ready < 2 {
        let l = lines
            .next()
            .unwrap_or_else(|| panic!("the demo ended early:\n{seen}"))
            .unwrap();
        seen.push_str(&l);
        seen.push('\n');
        if l.trim_start().starts_with("ready") {
            ready += 1;
        }
    }
    let nodes: Vec<u32> = children(pid)
        .into_iter()
        .filter(|(_, cmd)| cmd.contains("store serve"))
        .map(|(c, _)| c)
        .collect();
    assert_eq!(
        nodes.len(),
        2,
        "the demo's nodes: {:?}\n{seen}",
        children(pid)
    );
    let st = Command::new("kill")
        .args(["-TERM", &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
    let status = demo.wait().unwrap();
    assert!(!status.success(), "the demo ended by SIGTERM: {status}");
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut left: Vec<u32> = nodes.clone();
    while !left.is_empty() && Instant::now() < deadline {
        left.retain(|&n| running(n));
        std::thread::sleep(Duration::from_millis(20));
    }
    // Never leave them behind, whatever the test found.
    for n in &left {
        let _ = Command::new("kill")
            .args(["-KILL", &n.to_string()])
            .status();
    }
    assert!(
        left.is_empty(),
        "nodes {left:?} outlived the demo that started them"
    );
    let _ = std::fs::remove_dir_all(&work);
}
