//! Unmodified Debian 12 RDMA applications on softrdma's user-space
//! libibverbs and librdmacm (issue 30; docs/libibverbs.md), both ends on
//! this host, with no kernel RDMA module:
//!
//! - the static check: every symbol the target binaries import from
//!   libibverbs, librdmacm, libmlx5 and libefa is exported by ours with the
//!   same version (`objdump -T`);
//! - `ibv_devinfo`; `rping`, `ucmatose`, `rdma_server`/`rdma_client`,
//!   perftest's six `-R` tests at 8 B, 4 KiB and 1 MiB, `qperf` `rc_bw` and
//!   `rc_lat`: each over the TCP path (`--tcp-only`) and the same-host path;
//! - `tests/dropin/verbs_check.c`, an ordinary rdma-core program compiled
//!   here against Debian's headers: data written, read back and sent is
//!   checked byte by byte, and one test per misuse asserts its errno or
//!   error completion;
//! - an rping pair and an `ib_write_bw -R` pair as the unprivileged user
//!   `nobody`, with Debian's default RLIMIT_MEMLOCK.
//!
//! The libraries are built next to the `softrdma` binary (`cargo build
//! --release --workspace`, as scripts/test.sh does).

mod common;
use common::*;
use std::collections::BTreeMap;
use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

const SOFTRDMA: &str = env!("CARGO_BIN_EXE_softrdma");

/// Pairs run one at a time: the machines running CI have two cores, and
/// perftest's timings are meaningless when pairs share them.
static PAIR_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn lib_dir() -> PathBuf {
    let d = Path::new(SOFTRDMA).parent().unwrap().to_path_buf();
    for f in ["libibverbs.so", "librdmacm.so", "libmlx5.so", "libefa.so"] {
        assert!(
            d.join(f).is_file(),
            "{} is missing: build the workspace's libraries (cargo build --release --workspace)",
            d.join(f).display()
        );
    }
    d
}

/// No kernel RDMA here: what runs is ours.
fn assert_no_kernel_rdma() {
    for m in ["siw", "rdma_rxe", "ib_uverbs"] {
        assert!(
            !Path::new("/sys/module").join(m).exists(),
            "kernel module {m} is loaded on this host: these tests must show user space alone"
        );
    }
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Path_ {
    Tcp,
    SameHost,
}

const PATHS: [Path_; 2] = [Path_::Tcp, Path_::SameHost];

/// `softrdma run [--tcp-only] -- prog args`, in a process group of its own.
fn run_cmd(path: Path_, prog: &str, args: &[String], log: bool) -> Command {
    let mut c = Command::new(SOFTRDMA);
    c.arg("run");
    if path == Path_::Tcp {
        c.arg("--tcp-only");
    }
    if log {
        c.args(["--lib-log", "softrdma_verbs::cm=debug"]);
    }
    c.arg("--").arg(prog).args(args);
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    c
}

/// Whether something listens on TCP `port` (from /proc/net/tcp{,6}):
/// readiness without connecting to the server.
fn listening(port: u16) -> bool {
    let want = format!(":{port:04X} ");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f)
            .unwrap_or_default()
            .lines()
            .any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && format!("{} ", cols[1]).ends_with(&want) && cols[3] == "0A"
            })
    })
}

struct Ran {
    ok: bool,
    out: String,
    err: String,
}

fn finish(mut c: Child, deadline: Instant, what: &str) -> Ran {
    let st = wait_deadline(&mut c, deadline);
    if st.is_none() {
        kill_group(&c);
    }
    let mut out = String::new();
    let mut err = String::new();
    c.stdout.take().unwrap().read_to_string(&mut out).unwrap();
    c.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    if st.is_none() {
        err.push_str(&format!("\n[{what} killed at its deadline]"));
    }
    Ran {
        ok: st.is_some_and(|s| s.success()),
        out,
        err,
    }
}

/// Runs a server and, once it listens on `port`, a client; both must exit
/// 0 within `secs`. Returns (server, client).
fn pair(
    path: Path_,
    prog: &str,
    srv: &[String],
    cli: &[String],
    port: u16,
    secs: u64,
    log: bool,
) -> (Ran, Ran) {
    pair2(path, (prog, srv), (prog, cli), port, secs, log)
}

/// [`pair`] with a server and a client program of their own.
fn pair2(
    path: Path_,
    (prog, srv): (&str, &[String]),
    (cprog, cli): (&str, &[String]),
    port: u16,
    secs: u64,
    log: bool,
) -> (Ran, Ran) {
    let _g = PAIR_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut s = run_cmd(path, prog, srv, log).spawn().unwrap();
    while !listening(port) {
        if let Some(st) = s.try_wait().unwrap() {
            let r = finish(s, deadline, "server");
            panic!(
                "{prog} server exited ({st}) before listening:\n{}\n{}",
                r.out, r.err
            );
        }
        if Instant::now() > deadline {
            kill_group(&s);
            panic!("{prog} server did not listen on {port}");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    let c = run_cmd(path, cprog, cli, log).spawn().unwrap();
    let cr = finish(c, deadline, "client");
    let sr = finish(s, deadline, "server");
    (sr, cr)
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

fn assert_pair(what: &str, (s, c): &(Ran, Ran)) {
    assert!(
        s.ok && c.ok,
        "{what}: server ok={} client ok={}\n--- server out\n{}\n--- server err\n{}\n--- client out\n{}\n--- client err\n{}",
        s.ok,
        c.ok,
        s.out,
        s.err,
        c.out,
        c.err
    );
}

/// The negotiated path, from the engine's debug line for the connection.
fn same_host_of(r: &Ran) -> Option<bool> {
    let l = r
        .err
        .lines()
        .find(|l| l.contains("connection established"))?;
    Some(l.contains("same_host: true"))
}

// ------------------------------------------------------------ static check

/// `objdump -T` of a file: (symbol, version) pairs, imported (UND) or
/// defined.
fn dynsyms(file: &Path, undefined: bool) -> Vec<(String, String)> {
    let out = Command::new("objdump")
        .arg("-T")
        .arg(file)
        .output()
        .expect("objdump (binutils)");
    assert!(out.status.success(), "objdump -T {}", file.display());
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter(|l| l.contains("*UND*") == undefined && (l.contains(" DF ") || l.contains(" DO ")))
        .filter_map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let name = cols.last()?.to_string();
            let ver = cols
                .get(cols.len().checked_sub(2)?)?
                .trim_matches(|c| c == '(' || c == ')')
                .to_string();
            Some((name, ver))
        })
        .collect()
}

const TARGETS: [&str; 14] = [
    "ibv_devinfo",
    "rping",
    "ucmatose",
    "udaddy",
    "rdma_server",
    "rdma_client",
    "ib_write_bw",
    "ib_read_bw",
    "ib_send_bw",
    "ib_write_lat",
    "ib_read_lat",
    "ib_send_lat",
    "qperf",
    "ibv_rc_pingpong",
];

fn which(b: &str) -> PathBuf {
    let out = Command::new("sh")
        .args(["-c", &format!("command -v {b}")])
        .output()
        .unwrap();
    let p = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(!p.is_empty(), "`{b}` not found: run scripts/setup.sh");
    PathBuf::from(p)
}

#[test]
fn every_imported_symbol_is_exported_with_its_version() {
    let dir = lib_dir();
    let mut ours: BTreeMap<String, String> = BTreeMap::new();
    for f in ["libibverbs.so", "librdmacm.so", "libmlx5.so", "libefa.so"] {
        for (n, v) in dynsyms(&dir.join(f), false) {
            ours.insert(n, v);
        }
    }
    let mut missing = Vec::new();
    let mut checked = 0;
    for b in TARGETS {
        for (n, v) in dynsyms(&which(b), true) {
            if !["IBVERBS_", "RDMACM_", "MLX5_", "EFA_"]
                .iter()
                .any(|p| v.starts_with(p))
            {
                continue;
            }
            checked += 1;
            match ours.get(&n) {
                Some(have) if *have == v => {}
                Some(have) => missing.push(format!("{b}: {n}@{v} (ours: {n}@{have})")),
                None => missing.push(format!("{b}: {n}@{v} (not exported)")),
            }
        }
    }
    println!("{checked} imported symbols checked");
    assert!(
        checked > 100,
        "too few imports found ({checked}): objdump output changed?"
    );
    assert!(
        missing.is_empty(),
        "imports our libraries do not satisfy:\n{}",
        missing.join("\n")
    );
}

// ------------------------------------------------------------ the device

#[test]
fn ibv_devinfo_shows_an_active_iwarp_port() {
    lib_dir();
    assert_no_kernel_rdma();
    let out = run_cmd(Path_::Tcp, "ibv_devinfo", &strs(&["-v"]), false)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "ibv_devinfo failed: {text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for want in [
        "hca_id:\tsoftrdma0",
        "transport:\t\t\tiWARP (1)",
        "state:\t\t\tPORT_ACTIVE (4)",
        "link_layer:\t\tEthernet",
        "atomic_cap:\t\t\tATOMIC_NONE (0)",
        "NO SUPPORT", // no ODP
    ] {
        assert!(
            text.contains(want),
            "ibv_devinfo -v lacks {want:?}:\n{text}"
        );
    }
    // The GID is the device's address, IPv4-mapped.
    assert!(
        text.contains("GID[  0]:\t\t::ffff:")
            || text.contains("GID[  0]:\t\t0000:0000:0000:0000:0000:ffff:"),
        "no address GID:\n{text}"
    );
}

// ------------------------------------------------------------ rdma_cm tools

#[test]
fn rping_pair_checks_its_data_on_both_paths() {
    lib_dir();
    assert_no_kernel_rdma();
    for path in PATHS {
        for size in ["23", "4096", "65535"] {
            let port = free_ports(1)[0].to_string();
            let srv = strs(&[
                "-s",
                "-a",
                "127.0.0.1",
                "-p",
                &port,
                "-C",
                "100",
                "-S",
                size,
                "-V",
            ]);
            let cli = strs(&[
                "-c",
                "-a",
                "127.0.0.1",
                "-p",
                &port,
                "-C",
                "100",
                "-S",
                size,
                "-V",
            ]);
            let r = pair(path, "rping", &srv, &cli, port.parse().unwrap(), 60, true);
            assert_pair(&format!("rping {path:?} -S {size}"), &r);
            assert_eq!(
                same_host_of(&r.1),
                Some(path == Path_::SameHost),
                "negotiated path:\n{}",
                r.1.err
            );
            assert!(!r.1.out.contains("data mismatch") && !r.0.out.contains("data mismatch"));
        }
    }
}

#[test]
fn ucmatose_pair_on_both_paths() {
    lib_dir();
    for path in PATHS {
        let port = free_ports(1)[0].to_string();
        let srv = strs(&["-p", &port, "-c", "4", "-C", "50", "-S", "8192"]);
        let cli = strs(&[
            "-s",
            "127.0.0.1",
            "-p",
            &port,
            "-c",
            "4",
            "-C",
            "50",
            "-S",
            "8192",
        ]);
        let r = pair(
            path,
            "ucmatose",
            &srv,
            &cli,
            port.parse().unwrap(),
            60,
            false,
        );
        assert_pair(&format!("ucmatose {path:?}"), &r);
        assert!(
            r.1.out.contains("test complete") && r.1.out.contains("return status 0"),
            "{}",
            r.1.out
        );
    }
}

#[test]
fn rdma_server_and_client_on_both_paths() {
    lib_dir();
    for path in PATHS {
        let port = free_ports(1)[0].to_string();
        let r = pair2(
            path,
            ("rdma_server", &strs(&["-p", &port])),
            ("rdma_client", &strs(&["-s", "127.0.0.1", "-p", &port])),
            port.parse().unwrap(),
            60,
            false,
        );
        assert_pair(&format!("rdma_server/rdma_client {path:?}"), &r);
        assert!(r.1.out.contains("rdma_client: end 0"), "{}", r.1.out);
        assert!(r.0.out.contains("rdma_server: end 0"), "{}", r.0.out);
    }
}

/// The refusal a perftest client reports when its test connection comes
/// before the server listens again.
const PERFTEST_RELISTEN_RACE: &str = "Event: RDMA_CM_EVENT_REJECTED; error: -111.";

/// A perftest `-R` pair, run again (at most twice) when it lost a race of
/// Debian's perftest 4.5 itself: the server accepts the control
/// connection, drops its listener, exchanges its parameters over that
/// connection and only then listens again on the same port, while the
/// client connects for the test as soon as the exchange is over. A client
/// that comes first is refused (ECONNREFUSED, as the kernel's iWARP CM
/// refuses it: no listener) and gives up, and the server waits for a
/// client that never comes. Fixed upstream (linux-rdma/perftest 3d9d8d0,
/// a retry of refused connections); Debian 12 has the older one. Only that
/// exact refusal is run again, and a NOTE says so; anything else fails.
fn perftest_pair(path: Path_, prog: &str, srv: &[String], cli: &[String], port: u16) -> (Ran, Ran) {
    for attempt in 1.. {
        let _g = PAIR_LOCK.lock().unwrap_or_else(|e| e.into_inner());
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut s = run_cmd(path, prog, srv, false).spawn().unwrap();
        while !listening(port) {
            if s.try_wait().unwrap().is_some() || Instant::now() > deadline {
                kill_group(&s);
                let r = finish(s, deadline, "server");
                panic!(
                    "{prog} server did not listen on {port}:\n{}\n{}",
                    r.out, r.err
                );
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let c = run_cmd(path, prog, cli, false).spawn().unwrap();
        let cr = finish(c, deadline, "client");
        if !cr.ok && cr.err.contains(PERFTEST_RELISTEN_RACE) && attempt < 3 {
            kill_group(&s);
            let _ = finish(s, deadline, "server");
            eprintln!(
                "NOTE: {prog} {path:?} {}: the client came before the server listened again \
                 (perftest 4.5's relisten race); attempt {} of 3",
                srv.join(" "),
                attempt + 1
            );
            continue;
        }
        let sr = finish(s, deadline, "server");
        return (sr, cr);
    }
    unreachable!()
}

#[test]
fn perftest_rdma_cm_tests_at_three_sizes_on_both_paths() {
    lib_dir();
    assert_no_kernel_rdma();
    let tests = [
        "ib_write_bw",
        "ib_read_bw",
        "ib_send_bw",
        "ib_write_lat",
        "ib_read_lat",
        "ib_send_lat",
    ];
    for path in PATHS {
        for t in tests {
            for (size, iters) in [("8", "200"), ("4096", "200"), ("1048576", "20")] {
                let port = free_ports(1)[0].to_string();
                let common = ["-R", "-p", &port, "-s", size, "-n", iters];
                let srv = strs(&common);
                let mut cli = strs(&common);
                cli.push("127.0.0.1".into());
                let r = perftest_pair(path, t, &srv, &cli, port.parse().unwrap());
                assert_pair(&format!("{t} {path:?} -s {size}"), &r);
                let row =
                    r.1.out
                        .lines()
                        .find(|l| l.split_whitespace().next() == Some(size));
                assert!(
                    row.is_some(),
                    "{t} {path:?}: no result row for {size}:\n{}",
                    r.1.out
                );
            }
        }
    }
}

/// qperf's `rc_bw` and `rc_lat` over RDMA CM on both paths. `rc_bw`'s
/// sender does not wait for the receiver's buffers: it counts on
/// InfiniBand's RNR retry, which iWARP does not have (RFC 5040: a Send
/// with no posted receive ends the connection with a Terminate, as Linux
/// siw sends at once). Its server reposts as it goes, and starved of CPU
/// (beside a `yes` hog) it fell behind: "rc_bw failed: WR flush failure"
/// after our Terminate "invalid MSN, no buffer available", in 2 first
/// attempts of 6 here and in five attempts in a row in stop 43's CI. The
/// receiver now leaves such a Send unread until a receive is posted, up
/// to `DeviceConfig::recv_wait` (1 s), and this passes at the first attempt.
#[test]
fn qperf_rc_bw_and_rc_lat_over_rdma_cm() {
    lib_dir();
    for path in PATHS {
        let r = qperf_pair(path);
        assert!(r.ok, "qperf {path:?}:\n{}\n{}", r.out, r.err);
        assert!(
            r.out.contains("bw  =") && r.out.contains("latency  ="),
            "qperf {path:?}:\n{}",
            r.out
        );
        assert!(
            !r.out.contains("failed") && !r.out.contains("unexpected"),
            "{}",
            r.out
        );
    }
}

/// One qperf server and a client running `rc_bw` and `rc_lat` against it.
fn qperf_pair(path: Path_) -> Ran {
    let port = free_ports(1)[0].to_string();
    let _g = PAIR_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let deadline = Instant::now() + Duration::from_secs(60);
    let s = run_cmd(path, "qperf", &strs(&["-lp", &port]), false)
        .spawn()
        .unwrap();
    while !listening(port.parse().unwrap()) {
        assert!(Instant::now() < deadline, "qperf server did not listen");
        std::thread::sleep(Duration::from_millis(10));
    }
    let c = run_cmd(
        path,
        "qperf",
        &strs(&[
            "-lp",
            &port,
            "-cm1",
            "-t",
            "1",
            "127.0.0.1",
            "rc_bw",
            "rc_lat",
        ]),
        false,
    )
    .spawn()
    .unwrap();
    let r = finish(c, deadline, "qperf client");
    kill_group(&s);
    let _ = finish(s, Instant::now() + Duration::from_secs(5), "qperf server");
    r
}

// ------------------------------------------------------------ verbs_check

fn verbs_check() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let dir = std::env::temp_dir().join(format!("softrdma-verbs-check-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let bin = dir.join("verbs_check");
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/dropin/verbs_check.c");
        // Linked against Debian's libraries at build time (headers and
        // versions of v44); ours are loaded at run time.
        let out = Command::new("cc")
            .args(["-O1", "-Wall", "-o"])
            .arg(&bin)
            .arg(&src)
            .args(["-libverbs", "-lrdmacm"])
            .output()
            .expect("cc (build-essential)");
        assert!(
            out.status.success(),
            "cc verbs_check.c: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        bin
    })
}

#[test]
fn written_read_and_sent_bytes_arrive_intact_on_both_paths() {
    lib_dir();
    let bin = verbs_check().to_str().unwrap().to_string();
    for path in PATHS {
        let port = free_ports(1)[0].to_string();
        let r = pair(
            path,
            &bin,
            &strs(&["server", &port]),
            &strs(&["client", "127.0.0.1", &port]),
            port.parse().unwrap(),
            60,
            false,
        );
        assert_pair(&format!("verbs_check {path:?}"), &r);
        assert!(
            r.1.out.contains("device softrdma0"),
            "not our device:\n{}",
            r.1.out
        );
        assert!(r.1.out.contains("client: data ok") && r.0.out.contains("server: data ok"));
        // By default registered malloc pages move into a memfd on the
        // same-host path (`share.rs`), and stay where they are over TCP.
        let want = match path {
            Path_::SameHost => "buffer: memfd",
            Path_::Tcp => "buffer: private",
        };
        assert!(
            r.0.out.contains(want) && r.1.out.contains(want),
            "{path:?}: want {want}\n{}{}",
            r.0.out,
            r.1.out
        );
    }
}

/// With `SOFTRDMA_SHARE_MR=1` (the default) a registration of whole `malloc`
/// pages moves them into a memfd that same-host peers map
/// (`crates/ibverbs/src/share.rs`): the bytes written before the
/// registration are there after it, and the Writes, Reads and Send between
/// two processes arrive intact. With a second application thread alive
/// nothing moves (a store of that thread during the move could be lost),
/// nor over TCP, nor with `SOFTRDMA_SHARE_MR=0`; the data is intact too.
#[test]
fn registered_malloc_pages_move_into_a_shared_file_and_keep_their_bytes() {
    lib_dir();
    let bin = verbs_check().to_str().unwrap().to_string();
    for (path, opt, want) in [
        (Path_::SameHost, "share", "buffer: memfd"),
        (Path_::SameHost, "share-threaded", "buffer: private"),
        (Path_::Tcp, "share", "buffer: private"),
        (Path_::SameHost, "private", "buffer: private"),
    ] {
        let port = free_ports(1)[0].to_string();
        let r = pair(
            path,
            &bin,
            &strs(&["server", &port, opt]),
            &strs(&["client", "127.0.0.1", &port, opt]),
            port.parse().unwrap(),
            60,
            false,
        );
        let what = format!("verbs_check {path:?} {opt}");
        assert_pair(&what, &r);
        for (side, ran) in [("server", &r.0), ("client", &r.1)] {
            assert!(
                ran.out.contains(want) && ran.out.contains(&format!("{side}: data ok")),
                "{what}, {side} (want {want:?}):\n{}",
                ran.out
            );
        }
    }
}

fn misuse(case: &str) -> String {
    checker("misuse", case)
}

/// `verbs_check MODE CASE` on the TCP path; its output, once it passed.
fn checker(mode: &str, case: &str) -> String {
    lib_dir();
    let bin = verbs_check().to_str().unwrap().to_string();
    let c = run_cmd(Path_::Tcp, &bin, &strs(&[mode, case]), false)
        .spawn()
        .unwrap();
    let r = finish(c, Instant::now() + Duration::from_secs(60), case);
    assert!(r.ok, "{mode} {case}:\n{}\n{}", r.out, r.err);
    r.out
}

/// `ibv_req_notify_cq` arms for the next completion only, as siw and rxe
/// do: with completions already queued it fires nothing. (It fired at
/// once, so perftest's `-e` server, which re-arms its send CQ without
/// polling it, spun at 100% CPU in `ibv_get_cq_event`.)
#[test]
fn a_notification_fires_for_the_next_completion_only() {
    let out = checker("notify", "next-only");
    assert!(
        out.contains("queued completion after arming: no event (EAGAIN)")
            && out.contains("next completion: an event; completions polled: 2"),
        "{out}"
    );
}

/// A thread spinning on an empty CQ drives every QP of the process
/// (`crates/ibverbs/src/spin.rs`); once it stops polling, without arming a
/// CQ, the progress threads take the input back within the lease (1 ms):
/// a Write lands while nobody polls anything.
#[test]
fn a_spinning_pollers_qps_go_back_when_it_stops() {
    let out = checker("notify", "spin-then-stop");
    assert!(
        out.contains("the Write landed after the poller stopped"),
        "{out}"
    );
}

/// A thread that spins on a CQ that gets no completion for 1 ms waits in
/// the kernel for input on its QPs' sockets instead of asking them in a
/// loop (`crates/ibverbs/src/spin.rs`): over 300 ms it sleeps hundreds of
/// times (a pure spin, as before, sleeps about never), and a Send that then
/// arrives completes with its bytes.
#[test]
fn an_idle_spinning_poller_waits_for_input_in_the_kernel() {
    let out = checker("notify", "idle-spin");
    let switches: u64 = out
        .split("empty CQ: ")
        .nth(1)
        .and_then(|r| r.split(' ').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count in {out}"));
    assert!(switches >= 50, "{out}");
    assert!(
        out.contains("the Send after the idle spin arrived intact"),
        "{out}"
    );
}

/// A post made while 16 completions wait to be reaped is held for the
/// application's next poll (`crates/ibverbs/src/cork.rs`); when no poll
/// comes, the event thread sends it (within 1-2 ms): a Write lands while
/// the application only watches memory, and every completion is there.
#[test]
fn a_post_held_for_a_poll_goes_out_without_one() {
    let out = checker("notify", "held-write");
    assert!(
        out.contains("the held Write landed without a poll") && out.contains("completions: 21"),
        "{out}"
    );
}

/// A wait in `ibv_get_cq_event` goes on across SIGSTOP/SIGCONT (Ctrl-Z and
/// `fg`, a debugger attaching), as the kernel's `read` of the channel
/// does; `epoll_wait` returns EINTR there, and the application failed.
#[test]
fn a_completion_wait_survives_stop_and_continue() {
    let out = checker("notify", "stop-continue");
    assert!(
        out.contains("wait across SIGSTOP/SIGCONT: the event"),
        "{out}"
    );
}

#[test]
fn posting_on_a_qp_in_reset_is_einval_with_bad_wr() {
    let out = misuse("reset-post");
    assert!(
        out.contains("post on RESET: 22 (Invalid argument), bad_wr set"),
        "{out}"
    );
}

#[test]
fn an_sge_past_its_region_fails_without_touching_the_target() {
    let out = misuse("sge-bounds");
    assert!(
        out.contains("completion local protection error") || out.contains("post refused: 22"),
        "{out}"
    );
}

#[test]
fn a_deregistered_region_fails_without_touching_the_target() {
    let out = misuse("dereg");
    assert!(
        out.contains("completion local protection error") || out.contains("post refused: 22"),
        "{out}"
    );
}

#[test]
fn destroying_a_qp_with_work_in_flight_returns_and_the_process_goes_on() {
    let out = misuse("destroy-busy");
    assert!(out.contains("destroy with work in flight: 0"), "{out}");
}

#[test]
fn a_cq_overrun_is_an_error_and_an_async_event() {
    let out = misuse("cq-overrun");
    assert!(
        out.contains("poll after overrun: -1") && out.contains("async event: CQ error"),
        "{out}"
    );
}

/// librdmacm's `rdma_destroy_id` waits until every event handed out for the
/// id has been acknowledged: rping's CM thread still reads DISCONNECTED's
/// id while its main thread destroys that id (the drop-in freed it at once,
/// and rping against siw then failed now and then with
/// `rdma_get_cm_event: Bad file descriptor`, tests/dropin_siw.rs).
#[test]
fn destroying_an_id_waits_until_its_events_are_acknowledged() {
    let out = misuse("destroy-unacked");
    assert!(
        out.contains("destroy: 0, after the event was acknowledged; the event's id context intact"),
        "{out}"
    );
}

// ------------------------------------------------------------ no root

/// `runuser -u nobody -- softrdma run -- ...`: no root, Debian's default
/// RLIMIT_MEMLOCK (8 MiB), which `ib_write_bw -s 1M` with its default
/// queue depth exceeds: registration degrades (unpinned) and says so once.
#[test]
fn an_unprivileged_user_runs_rping_and_ib_write_bw() {
    lib_dir();
    assert_no_kernel_rdma();
    // Switching users needs root (CI runs as root).
    let root = std::fs::metadata("/proc/self")
        .map(|m| std::os::unix::fs::MetadataExt::uid(&m))
        .unwrap()
        == 0;
    assert!(
        root,
        "this test switches to `nobody` and needs to start as root (CI does)"
    );
    // `nobody` may not reach the checkout (under /root, say): the binary
    // and the libraries go to a directory it can read (`softrdma run` finds
    // the libraries next to the binary).
    let work = Work::new("nobody");
    let dir = work.path("bin");
    std::fs::create_dir_all(&dir).unwrap();
    for f in [
        "softrdma",
        "libibverbs.so",
        "librdmacm.so",
        "libmlx5.so",
        "libefa.so",
    ] {
        std::fs::copy(lib_dir().join(f), dir.join(f)).unwrap();
    }
    for d in [&work.dir, &dir] {
        std::fs::set_permissions(d, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    }
    let bin = dir.join("softrdma");
    let nobody = |prog: &str, args: Vec<String>| {
        let mut c = Command::new("runuser");
        c.args(["-u", "nobody", "--", "sh", "-c"]);
        // Debian's default limit, whatever this shell had.
        let mut line = format!("ulimit -l 8192; exec {} run -- {prog}", bin.display());
        for a in &args {
            line.push(' ');
            line.push_str(a);
        }
        c.arg(line)
            .current_dir("/")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        c
    };
    let _g = PAIR_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    for (prog, srv, cli) in [
        (
            "rping",
            vec!["-s", "-a", "127.0.0.1", "-C", "20", "-S", "4096", "-V"],
            vec!["-c", "-a", "127.0.0.1", "-C", "20", "-S", "4096", "-V"],
        ),
        // 8 MiB messages: the buffers alone pass the 8 MiB limit.
        (
            "ib_write_bw",
            vec!["-R", "-s", "8388608", "-n", "5"],
            vec!["-R", "-s", "8388608", "-n", "5", "127.0.0.1"],
        ),
    ] {
        let port = free_ports(1)[0].to_string();
        let mut srv = strs(&srv);
        let mut cli = strs(&cli);
        srv.extend(strs(&["-p", &port]));
        cli.extend(strs(&["-p", &port]));
        let deadline = Instant::now() + Duration::from_secs(60);
        let s = nobody(prog, srv).spawn().unwrap();
        while !listening(port.parse().unwrap()) {
            assert!(Instant::now() < deadline, "{prog} as nobody did not listen");
            std::thread::sleep(Duration::from_millis(10));
        }
        let c = nobody(prog, cli).spawn().unwrap();
        let cr = finish(c, deadline, "client");
        let sr = finish(s, deadline, "server");
        let degraded = [&sr.err, &cr.err]
            .iter()
            .all(|e| e.matches("is not pinned").count() == 1);
        assert_pair(&format!("{prog} as nobody"), &(sr, cr));
        if prog == "ib_write_bw" {
            assert!(
                degraded,
                "past RLIMIT_MEMLOCK each side says once that it stopped pinning"
            );
        }
    }
}

#[test]
fn ibv_query_qp_reports_the_capabilities_the_qp_got() {
    lib_dir();
    let bin = verbs_check().to_str().unwrap().to_string();
    let c = run_cmd(Path_::Tcp, &bin, &strs(&["query-qp"]), false)
        .spawn()
        .unwrap();
    let r = finish(c, Instant::now() + Duration::from_secs(30), "query-qp");
    assert!(r.ok, "query-qp:\n{}\n{}", r.out, r.err);
    assert!(
        r.out.contains("caps 8 4 2 1 16, init caps 8 4 2 1 16"),
        "{}",
        r.out
    );
}
