//! `softrdma info` against a live process: an `rping --server` waiting for
//! its client shows its device, PD, QP and MRs, as a table and as JSON;
//! then an `rping --client` completes the exchange and both exit 0.
//!
//! The processes get their own `XDG_RUNTIME_DIR`, so `info` sees only the
//! devices of this test.

use std::io::{BufRead, BufReader, Read};
use std::path::PathBuf;
use std::process::{Child, Command, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const SOFTRDMA: &str = env!("CARGO_BIN_EXE_softrdma");
const SIZE: usize = 64;

/// A private registry directory, removed at the end.
struct RunDir(PathBuf);

impl RunDir {
    fn new() -> RunDir {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .subsec_nanos();
        let d =
            std::env::temp_dir().join(format!("softrdma-info-test-{}-{nanos}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        RunDir(d)
    }

    fn cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(SOFTRDMA);
        c.args(args)
            .env("XDG_RUNTIME_DIR", &self.0)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null());
        c
    }

    fn run(&self, args: &[&str]) -> Output {
        let out = self.cmd(args).output().unwrap();
        assert!(
            out.status.success(),
            "softrdma {args:?} failed: {}\n{}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The server process; killed if the test fails before it exits.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        if let Ok(None) = self.0.try_wait() {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

fn text(o: &Output) -> String {
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// The JSON line `info --json` prints for process `pid`, if any.
fn json_line(json: &str, pid: u32) -> Option<String> {
    let head = format!("{{\"pid\":{pid},");
    json.lines()
        .find(|l| l.starts_with(&head))
        .map(str::to_string)
}

#[test]
fn info_shows_a_waiting_rping_server() {
    let t0 = Instant::now();
    let deadline = t0 + Duration::from_secs(8);
    let dir = RunDir::new();
    let size = SIZE.to_string();

    // Port 0: the server picks a free port and prints it.
    let mut server = Server(
        dir.cmd(&[
            "rping", "--server", "--port", "0", "--count", "1", "--size", &size,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap(),
    );
    let pid = server.0.id();
    let (tx, lines) = mpsc::channel();
    let stdout = server.0.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let first = lines
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
        .expect("the server announces its address");
    let port: u16 = first
        .strip_prefix("rping server listening on ")
        .and_then(|a| a.rsplit(':').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("unexpected first line {first:?}"));

    // The device shows up in `info` once the server has opened it; it is
    // ready for its client once its rping buffer is registered (after the
    // listen). Poll until then.
    let json = loop {
        let out = text(&dir.run(&["info", "--json"]));
        if let Some(l) = json_line(&out, pid) {
            if l.contains(&format!("\"len\":{SIZE},")) {
                break l;
            }
        }
        assert!(
            Instant::now() < deadline,
            "the server's device never appeared in `softrdma info --json`: {out}"
        );
        if let Ok(Some(st)) = server.0.try_wait() {
            panic!("the server exited early: {st}");
        }
        std::thread::sleep(Duration::from_millis(20));
    };

    // JSON: one object per device, with its QP (created, waiting in INIT)
    // and its three MRs (receive and send buffers, the rping buffer open
    // to remote reads and writes).
    assert!(
        json.starts_with(&format!(
            "{{\"pid\":{pid},\"device\":{{\"name\":\"softrdma0\",\"addr\":\"127.0.0.1\",\"progress_threads\":1,"
        )),
        "{json}"
    );
    assert!(
        json.contains("\"qps\":[{\"qpn\":1,\"pd\":1,\"state\":\"Init\","),
        "{json}"
    );
    assert_eq!(json.matches("\"qpn\":").count(), 1, "{json}");
    assert_eq!(json.matches("\"stag\":").count(), 3, "{json}");
    assert_eq!(json.matches("\"len\":16,").count(), 2, "{json}");
    // LOCAL_WRITE | REMOTE_WRITE | REMOTE_READ = 7.
    assert!(
        json.contains(&format!(
            "\"len\":{SIZE},\"access\":7,\"valid\":true,\"fast_reg\":false}}"
        )),
        "{json}"
    );
    assert!(json.ends_with("]}}"), "{json}");

    // Table.
    let table = text(&dir.run(&["info"]));
    let mut lines_of = table
        .lines()
        .skip_while(|l| *l != format!("process {pid}:"));
    assert_eq!(
        lines_of.next(),
        Some(format!("process {pid}:").as_str()),
        "{table}"
    );
    let body: Vec<&str> = lines_of.take_while(|l| l.starts_with("  ")).collect();
    assert_eq!(
        body.first().copied(),
        // rping's three regions, a page each in the device's shared chunks.
        Some("  dev softrdma0 addr 127.0.0.1 progress_threads 1 shared_bytes 12288 qps 1 mrs 3"),
        "{table}"
    );
    assert!(
        body.iter()
            .any(|l| l.starts_with("  qp 1 pd 1 state Init local - peer - ")),
        "{table}"
    );
    let mrs: Vec<&&str> = body
        .iter()
        .filter(|l| l.starts_with("  mr stag "))
        .collect();
    assert_eq!(mrs.len(), 3, "{table}");
    assert!(
        mrs.iter()
            .any(|l| l.contains(" pd 1 ") && l.ends_with(&format!(" len {SIZE} access 0x7"))),
        "{table}"
    );

    // The client lets the server finish; both exit 0.
    let port = port.to_string();
    let client = dir.run(&[
        "rping", "--client", "--port", &port, "--count", "1", "--size", &size,
    ]);
    assert!(
        text(&client).contains("rping client: 1 iterations verified"),
        "{}",
        text(&client)
    );
    let status = loop {
        if let Some(st) = server.0.try_wait().unwrap() {
            break st;
        }
        assert!(Instant::now() < deadline, "the server did not exit");
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut err = String::new();
    server
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert!(status.success(), "server: {status}\n{err}");
    reader.join().unwrap();
    let rest: Vec<String> = lines.try_iter().collect();
    assert!(
        rest.iter().any(|l| l == "rping server: 1 iterations done"),
        "{rest:?}"
    );

    // Both processes are gone: `info` finds no device (and removes any
    // stale socket).
    let after = text(&dir.run(&["info", "--json"]));
    assert!(json_line(&after, pid).is_none(), "{after}");
    assert!(t0.elapsed() < Duration::from_secs(10));
}
