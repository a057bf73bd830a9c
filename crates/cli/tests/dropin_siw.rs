//! Unmodified Debian 12 binaries on softrdma's drop-in libibverbs and
//! librdmacm (`softrdma run`, docs/libibverbs.md) against the Linux
//! kernel's soft-iWARP (`siw`) in the qemu guest (`../shared/kvm-rdma`,
//! docs/interop.md), the interoperability part of issue 30:
//!
//! - `guest_siw_clients_vs_dropin_servers`: the guest's rping (`-V`,
//!   23 B / 4 KiB / 64 KiB-1), ucmatose and perftest's six `-R` tests, each
//!   as a client on siw against the same Debian program as a server on the
//!   drop-in (`softrdma run --extensions off [--crc]`), CRC off and on: one
//!   guest boot;
//! - `dropin_clients_vs_guest_siw_servers`: the same programs the other way
//!   round, the drop-in clients reaching the guest's servers through
//!   qemu's port forwards: one guest boot;
//! - `dropin_rping_vs_softrdma_rping`: no guest: Debian's rping on the
//!   drop-in against `softrdma rping` (the engine's Rust API), both ways.
//!
//! Every run checks exit statuses and what the programs print (rping's
//! `-v` lines byte for byte on both sides, ucmatose's stdout line for line,
//! perftest's title and result row); the guest runs capture the loopback
//! with tshark, and Wireshark's iWARP dissectors must find every FPDU well
//! formed, MPA revision 2, CRC as negotiated (every CRC good when on, none
//! when off) and the RDMAP operations each program uses.
//!
//! The drop-in is given `--extensions off`: the guest is reached through a
//! 127.0.0.1 port forward, which looks like this host, and would otherwise
//! be offered softrdma's private-data extension block. CRC is decided on
//! the host side (`--crc`): siw as the responder mirrors the request's CRC
//! bit, and as the initiator it follows the reply's.
//!
//! Three behaviours of the guest side are dealt with openly, each explained
//! where it is handled: a perftest server that is not listening yet when
//! the drop-in's client makes its second connection ([`GatedRelay`]),
//! siw completing its last Send in error when the drop-in peer closes the
//! moment it has that Send ([`check_perftest`]; every such run is printed
//! as a `NOTE`), and siw misreading the CRC trailer of a large FPDU, which
//! runs a guest rping or ucmatose server again only against a kernel
//! report whose CRC the capture shows the host sent
//! ([`guest_server_with_retry`]). The drop-in itself holds ESTABLISHED back 50 ms towards a
//! peer that is not softrdma (`FIRST_SEND_GRACE` in
//! crates/ibverbs/src/cm/mod.rs): without it rping and perftest hung
//! against siw.
//!
//! A missing guest image is a failure (run `scripts/setup.sh`), unless
//! `SOFTRDMA_NO_GUEST=1` is set. The libraries are built next to the
//! `softrdma` binary (`cargo build --release --workspace`).

mod common;
use common::guest::*;
use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io;
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::Path;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread;
use std::time::{Duration, Instant};

/// rping's sizes: its smallest, a page, its largest.
const RPING_SIZES: [usize; 3] = [RPING_MIN_SIZE, 4096, RPING_MAX_SIZE];
/// Pings per rping run.
const PINGS: usize = 10;
/// ucmatose: messages each way, and their size.
const CMA_COUNT: usize = 10;
const CMA_SIZE: usize = 4096;
/// Seconds one program may run in the guest (it runs under TCG).
const GUEST_CASE_S: u64 = 45;

/// One perftest `-R` test: the program, its title line, message size and
/// iterations, and the RDMAP opcodes its connections carry (Sends: the
/// control exchange; 0 Write, 1 Read Request, 2 Read Response, 3 Send).
struct Perf {
    tool: &'static str,
    title: &'static str,
    size: usize,
    iters: usize,
    ops: &'static [u32],
}

static PERFTESTS: [Perf; 6] = [
    Perf {
        tool: "ib_write_bw",
        title: "RDMA_Write BW Test",
        size: 65536,
        iters: 20,
        ops: &[0, 3],
    },
    // Reads at 4 KiB: the guest's siw misreads the CRC trailer of some
    // 64 KiB Read Responses that qemu's slirp has re-segmented (see
    // interop_siw.rs, `run_perftest_with`).
    Perf {
        tool: "ib_read_bw",
        title: "RDMA_Read BW Test",
        size: 4096,
        iters: 50,
        ops: &[1, 2, 3],
    },
    Perf {
        tool: "ib_send_bw",
        title: "Send BW Test",
        size: 65536,
        iters: 20,
        ops: &[3],
    },
    Perf {
        tool: "ib_write_lat",
        title: "RDMA_Write Latency Test",
        size: 64,
        iters: 100,
        ops: &[0, 3],
    },
    Perf {
        tool: "ib_read_lat",
        title: "RDMA_Read Latency Test",
        size: 64,
        iters: 100,
        ops: &[1, 2, 3],
    },
    Perf {
        tool: "ib_send_lat",
        title: "Send Latency Test",
        size: 64,
        iters: 100,
        ops: &[3],
    },
];

impl Perf {
    /// The options both sides give (`-F`: under TCG perftest's clock
    /// calibration may fail, and without it the client then exits 1).
    fn args(&self) -> Vec<String> {
        strs(&[
            "-R",
            "-F",
            "-s",
            &self.size.to_string(),
            "-n",
            &self.iters.to_string(),
        ])
    }
}

#[derive(Clone, Copy)]
enum Prog {
    Rping(usize),
    Ucmatose,
    Perftest(&'static Perf),
}

struct Case {
    name: String,
    prog: Prog,
    crc: bool,
    /// The port a host program listens on or connects to.
    host_port: u16,
    /// The guest's port (host-client direction).
    guest_port: u16,
}

fn strs(v: &[&str]) -> Vec<String> {
    v.iter().map(|s| s.to_string()).collect()
}

/// Every program at CRC off and on, each case with a free host port and a
/// guest port counted from `guest_base`.
fn cases(guest_base: u16) -> Vec<Case> {
    let mut progs: Vec<(String, Prog)> = RPING_SIZES
        .iter()
        .map(|s| (format!("rping-{s}"), Prog::Rping(*s)))
        .collect();
    progs.push(("ucmatose".into(), Prog::Ucmatose));
    for p in &PERFTESTS {
        progs.push((p.tool.replace('_', "-"), Prog::Perftest(p)));
    }
    let combos: Vec<(String, Prog, bool)> = progs
        .into_iter()
        .flat_map(|(n, p)| [(n.clone(), p, false), (n, p, true)])
        .collect();
    let ports = free_ports(combos.len());
    combos
        .into_iter()
        .zip(ports)
        .enumerate()
        .map(|(i, ((n, prog, crc), host_port))| Case {
            name: format!("{n}-crc{}", crc as u8),
            prog,
            crc,
            host_port,
            guest_port: guest_base + i as u16,
        })
        .collect()
}

/// `softrdma run --extensions off [--crc] -- PROG ARGS`.
fn dropin(crc: bool, prog: &str, args: &[String]) -> Vec<String> {
    let mut a = strs(&["run", "--extensions", "off"]);
    if crc {
        a.push("--crc".into());
    }
    a.push("--".into());
    a.push(prog.into());
    a.extend(args.iter().cloned());
    a
}

fn lib_dir_check() {
    let d = Path::new(SOFTRDMA).parent().unwrap();
    for f in ["libibverbs.so", "librdmacm.so", "libmlx5.so", "libefa.so"] {
        assert!(
            d.join(f).is_file(),
            "{} is missing: build the workspace's libraries (cargo build --release --workspace)",
            d.join(f).display()
        );
    }
}

// ---------------------------------------------------------------------------
// perftest output
// ---------------------------------------------------------------------------

/// How a perftest run that passed [`check_perftest`] ended.
#[derive(Debug, Clone, Copy, PartialEq)]
enum PerfEnd {
    Complete,
    /// siw's own last Send of the closing exchange completed in error
    /// although it had been sent (see [`check_perftest`]).
    SiwLateCompletion,
}

/// What is wrong with one perftest run: its exit status, its title, and
/// the result row under the table header (size, iterations; an
/// `ib_read_lat` server prints none). `-F` keeps a failed clock
/// calibration (TCG) from failing the run: its row may then be zeros, so
/// the numbers are not checked; exit status 0 means every Write, Read and
/// Send completed without error.
///
/// One failure of the siw side (`siw`) is told apart: perftest's closing
/// exchange (`ctx_close_connection`: the client sends, the server answers,
/// both exit) ends with the siw side's Send failing with status 2
/// (`IBV_WC_LOC_QP_OP_ERR`, printed `Bad wc status 2`, then `Unable to
/// write ... socket/rdma_cm` and `Failed to close connection between
/// server and client`, exit 1) after that Send went out whole: the
/// drop-in peer, fast beside the emulated guest, received it, answered or
/// exited, and closed before siw's transmit path got back to the Send.
/// siw checks `tx_suspend` (set when the peer closes) after a fully sent
/// DDP segment and before it looks at the Last flag
/// (`siw_qp_sq_proc_tx`, drivers/infiniband/sw/siw/siw_qp_tx.c: "Verbs,
/// 6.4.: Try stopping sending after a full DDP segment if the connection
/// goes down"), so a Send already on the wire completes in error. That
/// outcome is accepted, and returned as [`PerfEnd::SiwLateCompletion`],
/// only with everything else of the run in order; the callers require the
/// drop-in peer to pass in full, and its closing exchange succeeds only
/// once it has received that very Send (the server reads it before it
/// answers; the client reads the server's answer last).
fn check_perftest(
    p: &Perf,
    server: bool,
    siw: bool,
    rc: Option<&str>,
    out: &[String],
    err: &[String],
) -> Result<PerfEnd, String> {
    let mut problems = Vec::new();
    let late = siw && rc == Some("1") && {
        let e: Vec<&str> = err
            .iter()
            .map(|l| l.trim())
            // perftest's notices: siw has no inline data; the clock
            // calibration failed under TCG (`-F` goes on regardless).
            .filter(|l| {
                !l.starts_with("Device not recognized to implement inline feature")
                    && !l.starts_with("Correlation coefficient r^2:")
            })
            .collect();
        e.len() == 3
            && e[0] == "Bad wc status 2"
            && (e[1] == "Unable to write to socket/rdma_cm"
                || e[1] == "Unable to write from socket/rdma_cm")
            && e[2] == "Failed to close connection between server and client"
    };
    if rc != Some("0") && !late {
        problems.push(format!("exit status {rc:?}"));
    }
    if !out.iter().any(|l| l.contains(p.title)) {
        problems.push(format!("no `{}` title", p.title));
    }
    if !(server && p.tool == "ib_read_lat") {
        let header = out
            .iter()
            .position(|l| l.contains("#bytes") && l.contains("#iterations"));
        let row = header.and_then(|h| {
            out[h + 1..].iter().find_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.len() >= 5 && f[0].parse::<usize>().is_ok()).then_some(f)
            })
        });
        match (header, row) {
            (None, _) => problems.push("no result table header".into()),
            (Some(_), None) => problems.push("no result row".into()),
            (Some(_), Some(f)) => {
                if f[0] != p.size.to_string() || f[1] != p.iters.to_string() {
                    problems.push(format!(
                        "result row {f:?}: expected {} bytes, {} iterations",
                        p.size, p.iters
                    ));
                }
            }
        }
    }
    if problems.is_empty() {
        return Ok(if late {
            PerfEnd::SiwLateCompletion
        } else {
            PerfEnd::Complete
        });
    }
    Err(format!(
        "{}: {}\n    --- stdout:\n{}    --- stderr:\n{}",
        p.tool,
        problems.join("; "),
        indent(&out.join("\n")),
        indent(&err.join("\n"))
    ))
}

/// Waits for a host perftest (killing it at `deadline`) and checks it.
fn finish_perftest(
    mut proc_: HostProc,
    deadline: Instant,
    p: &Perf,
    server: bool,
) -> Result<(), String> {
    let st = wait_deadline(&mut proc_.child, deadline);
    println!("host| {} finished: {st:?}", proc_.name);
    let out = fs::read_to_string(&proc_.out).unwrap_or_default();
    let err = fs::read_to_string(&proc_.err).unwrap_or_default();
    let rc = match st {
        Some(s) => s.code().map(|c| c.to_string()).unwrap_or(s.to_string()),
        None => "killed at its deadline".into(),
    };
    let lines = |s: &str| s.lines().map(str::to_string).collect::<Vec<_>>();
    check_perftest(p, server, false, Some(&rc), &lines(&out), &lines(&err))
        .map(|_| ())
        .map_err(|e| format!("{} (host): {e}", proc_.name))
}

/// A guest perftest's report: its `PERFTEST NAME RC n` line and the
/// `OUT NAME| ` / `ERR NAME| ` lines before it.
fn guest_perftest(guest: &Guest, name: &str, p: &Perf, server: bool) -> Result<PerfEnd, String> {
    let tag = format!("PERFTEST {name} RC ");
    let rc = guest
        .log
        .iter()
        .find_map(|l| l.trim().strip_prefix(tag.as_str()))
        .map(|r| r.trim().to_string());
    let lines = |kind: &str| -> Vec<String> {
        let prefix = format!("{kind} {name}| ");
        guest
            .log
            .iter()
            .filter_map(|l| l.strip_prefix(prefix.as_str()).map(str::to_string))
            .collect()
    };
    let end = check_perftest(p, server, true, rc.as_deref(), &lines("OUT"), &lines("ERR"))
        .map_err(|e| format!("{name} (guest): {e}"))?;
    if end == PerfEnd::SiwLateCompletion {
        println!(
            "host| NOTE {name}: the guest's perftest exited 1: siw completed its last Send of \
             the closing exchange with status 2 after sending it (the drop-in peer received \
             it and closed first; see check_perftest)"
        );
    }
    Ok(end)
}

/// Guest shell lines that report a perftest run (its status in `$rc`, its
/// output in /tmp/p.out and /tmp/p.err) for [`guest_perftest`].
fn guest_perftest_report(name: &str) -> String {
    format!(
        "sed 's/^/OUT {name}| /' /tmp/p.out\n\
         sed 's/^/ERR {name}| /' /tmp/p.err\n\
         [ $rc = 0 ] || fail=1\n\
         marker \"PERFTEST {name} RC $rc\"\n"
    )
}

// ---------------------------------------------------------------------------
// capture
// ---------------------------------------------------------------------------

/// The capture checks of one case on `port`: decodes (checked for the
/// whole capture by `analyse_capture`), MPA revision 2, CRC as set, the
/// program's RDMAP operations, and for ucmatose its Sends, each way.
fn check_case_wire(
    conns: &BTreeMap<u16, ConnWire>,
    pcap: &Path,
    c: &Case,
    port: u16,
) -> Result<(), String> {
    match c.prog {
        // rping: Send, Read Request, Read Response, Write.
        Prog::Rping(_) => check_conn(conns, port, 2, c.crc),
        Prog::Ucmatose => {
            check_conn_ops(conns, port, 2, c.crc, &[3])?;
            match send_messages(pcap, port) {
                (up, down) if up == CMA_COUNT && down == CMA_COUNT => Ok(()),
                (up, down) => Err(format!(
                    "{}: port {port}: {down} Send messages from the server and {up} to it, \
                     expected {CMA_COUNT} each",
                    c.name
                )),
            }
        }
        Prog::Perftest(p) => check_conn_ops(conns, port, 2, c.crc, p.ops),
    }
    .map_err(|e| format!("{}: {e}", c.name))
}

fn assert_wire(pcap: &Path, checks: &[(&Case, u16)]) {
    let ports: Vec<u16> = checks.iter().map(|(_, p)| *p).collect();
    let conns = analyse_capture(pcap, &ports);
    let errs: Vec<String> = checks
        .iter()
        .filter_map(|(c, port)| check_case_wire(&conns, pcap, c, *port).err())
        .collect();
    assert!(
        errs.is_empty(),
        "capture checks failed:\n  {}\nall connections: {conns:#?}",
        errs.join("\n  ")
    );
    let (crc, plain): (usize, usize) = conns.values().fold((0, 0), |(a, b), c| {
        (a + c.fpdus_checked_crc, b + c.fpdus_plain_crc)
    });
    println!(
        "host| capture: {} server ports, {crc} FPDUs with a good CRC, {plain} without CRC, \
         none malformed",
        conns.len()
    );
}

// ---------------------------------------------------------------------------
// guest clients -> drop-in servers
// ---------------------------------------------------------------------------

/// Guest rping, ucmatose and perftest clients on siw against the same
/// programs as servers on the drop-in, CRC off and on (siw as the
/// initiator asks for no CRC; the server's `--crc` grants it and siw
/// follows), one guest boot. Every server listens before the guest boots.
#[test]
fn guest_siw_clients_vs_dropin_servers() {
    lib_dir_check();
    let Some(env) = guest_env("guest_siw_clients_vs_dropin_servers") else {
        return;
    };
    let _serial = lock_guest();
    let t0 = Instant::now();
    let work = Work::new("dropin-srv");
    let expect_dir = work.path("expect");
    let cases = cases(0);
    let mut servers: Vec<Option<HostProc>> = Vec::new();
    let mut script = guest_prelude();
    for c in &cases {
        let port = c.host_port.to_string();
        let (prog, args) = match c.prog {
            Prog::Rping(size) => (
                "rping",
                strs(&[
                    "-s",
                    "-a",
                    "127.0.0.1",
                    "-p",
                    &port,
                    "-C",
                    &PINGS.to_string(),
                    "-S",
                    &size.to_string(),
                    "-v",
                ]),
            ),
            Prog::Ucmatose => (
                "ucmatose",
                strs(&[
                    "-p",
                    &port,
                    "-C",
                    &CMA_COUNT.to_string(),
                    "-S",
                    &CMA_SIZE.to_string(),
                ]),
            ),
            Prog::Perftest(p) => {
                let mut a = p.args();
                a.extend(strs(&["-p", &port]));
                (p.tool, a)
            }
        };
        servers.push(Some(HostProc::spawn(
            &work,
            &c.name,
            &dropin(c.crc, prog, &args),
        )));
        script += &format!("marker 'CLIENT-START {}'\n", c.name);
        script += &match c.prog {
            Prog::Rping(size) => {
                let ec = write_expect(&expect_dir, &c.name, false, PINGS, size);
                format!(
                    "timeout {GUEST_CASE_S} rping -c -a 10.0.2.2 -p {port} -C {PINGS} -S {size} -v -V \
                     > /tmp/c.out 2> /tmp/c.err\n\
                     report {name} $? /tmp/c.out {ec} /tmp/c.err\n",
                    name = c.name
                )
            }
            Prog::Ucmatose => {
                let ec = write_cma_expect(&expect_dir, &c.name, false);
                format!(
                    "timeout {GUEST_CASE_S} ucmatose -s 10.0.2.2 -p {port} -C {CMA_COUNT} -S {CMA_SIZE} \
                     > /tmp/c.out 2> /tmp/c.err\n\
                     report {name} $? /tmp/c.out {ec} /tmp/c.err\n",
                    name = c.name
                )
            }
            Prog::Perftest(p) => format!(
                "timeout {GUEST_CASE_S} {tool} -d siw0 {args} -p {port} 10.0.2.2 > /tmp/p.out 2> /tmp/p.err\n\
                 rc=$?\n{report}",
                tool = p.tool,
                args = p.args().join(" "),
                report = guest_perftest_report(&c.name)
            ),
        };
    }
    script += "exit $fail\n";
    // Every server listens before the guest boots: no connection is refused.
    let deadline = Instant::now() + Duration::from_secs(30);
    for (c, s) in cases.iter().zip(servers.iter_mut()) {
        while !host_listening(c.host_port) {
            let p = s.as_mut().unwrap();
            if p.child.try_wait().unwrap().is_some() || Instant::now() > deadline {
                let e = s.take().unwrap().premature();
                panic!("{} never listened on {}: {e}", c.name, c.host_port);
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
    println!(
        "host| {} drop-in servers listening after {:.1} s",
        cases.len(),
        t0.elapsed().as_secs_f64()
    );
    let ports: Vec<u16> = cases.iter().map(|c| c.host_port).collect();
    let cap = Capture::start(&work, &ports);
    let mut guest = Guest::boot(
        &env,
        &work,
        &script,
        &[],
        &[expect_dir],
        120 + cases.len() as u64 * GUEST_CASE_S,
    );
    // A guest client facing a server that already exited would only time
    // out: stop at once instead.
    while let Some(line) = guest.next_line() {
        let Some(name) = line.trim().strip_prefix("CLIENT-START ") else {
            continue;
        };
        let Some(i) = cases.iter().position(|c| c.name == name) else {
            continue;
        };
        if servers[i]
            .as_mut()
            .unwrap()
            .child
            .try_wait()
            .unwrap()
            .is_some()
        {
            let e = servers[i].take().unwrap().premature();
            guest.abort(&format!(
                "drop-in server {name} exited before its client started: {e}"
            ));
        }
    }
    let exit = guest.finish();
    let pcap = cap.stop();

    let gcases = guest.cases();
    let mut problems = Vec::new();
    // Guest perftests accepted with siw's late completion of their last Send.
    let mut late = 0;
    let end = Instant::now() + Duration::from_secs(30);
    for (c, s) in cases.iter().zip(servers.iter_mut()) {
        let s = s.take().unwrap();
        let r = match c.prog {
            Prog::Rping(size) => {
                match gcases.get(&c.name) {
                    Some((rc, data)) if rc == "0" && data == "match" => {}
                    other => problems.push(format!("{}: guest rping client: {other:?}", c.name)),
                }
                s.finish(end, &rping_verbose_lines(true, PINGS, size))
            }
            Prog::Ucmatose => {
                match gcases.get(&c.name) {
                    Some((rc, data)) if rc == "0" && data == "match" => {}
                    other => problems.push(format!("{}: guest ucmatose client: {other:?}", c.name)),
                }
                s.finish_lines(end, &cma_lines(true))
            }
            Prog::Perftest(p) => {
                match guest_perftest(&guest, &c.name, p, false) {
                    Ok(PerfEnd::SiwLateCompletion) => late += 1,
                    Ok(PerfEnd::Complete) => {}
                    Err(e) => problems.push(e),
                }
                finish_perftest(s, end, p, true)
            }
        };
        if let Err(e) = r {
            problems.push(e);
        }
    }
    // The guest script counts any perftest exit status but 0 as a failure;
    // those accepted above are the only ones allowed.
    if exit != 0 && !(exit == 1 && late > 0 && problems.is_empty()) {
        problems.push(format!("GUEST-EXIT {exit}"));
    }
    if !problems.is_empty() {
        guest.fail(&format!(
            "guest siw clients -> drop-in servers:\n  {}",
            problems.join("\n  ")
        ));
    }
    let checks: Vec<(&Case, u16)> = cases.iter().map(|c| (c, c.host_port)).collect();
    assert_wire(&pcap, &checks);
    println!(
        "host| {} cases in {:.1} s ({late} guest perftests with siw's late completion of \
         their last Send)",
        cases.len(),
        t0.elapsed().as_secs_f64()
    );
}

/// ucmatose's stdout on success.
fn cma_lines(server: bool) -> Vec<String> {
    cma_expected_lines(server)
        .iter()
        .map(|s| s.to_string())
        .collect()
}

// ---------------------------------------------------------------------------
// drop-in clients -> guest servers
// ---------------------------------------------------------------------------

/// A TCP relay on the host for one perftest case: 127.0.0.1:(its port) to
/// 127.0.0.1:`target` (the forward into the guest). Connection `n` is
/// accepted at once but connected on only once `gates[n]` fires; the bytes
/// pass unchanged. Reports the bytes copied (up, down) per connection.
///
/// Why: a perftest `-R` server (4.5+0.17) accepts the control connection,
/// drops its listener, exchanges a message with the client over that
/// connection and only then listens again on the same port for the test
/// connection. The client connects right after that exchange; against
/// the guest, emulated and slow, the drop-in's client is there first, the
/// guest refuses the connection (captured: qemu accepts it on the host and
/// resets it 7 ms later), and perftest's retry of a refused connection
/// then uses the ids it has just destroyed (it crashes: fixed upstream in
/// linux-rdma/perftest 3d9d8d0, "Fix crashes and logical flaws in RDMA CM
/// connection retry"). So the test connection goes on only once the guest
/// says its server listens again (`RELISTEN`): the wait for a listening
/// port every other case does before its client starts.
struct GatedRelay {
    port: u16,
    gates: Vec<Sender<()>>,
    done: Receiver<Vec<io::Result<(u64, u64)>>>,
}

/// A relay to `target` on a port none of `reserved` (the ports qemu is
/// to forward: the kernel hands out a port that `free_ports` just
/// released, and qemu then cannot bind its forward; stop-42's CI failure:
/// "Could not set up host forwarding rule").
fn gated_relay(target: u16, conns: usize, reserved: &[u16]) -> GatedRelay {
    // Rejected listeners are held until a good one is found, so the
    // kernel does not hand the same port out again.
    let mut rejected = Vec::new();
    let l = loop {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        if !reserved.contains(&l.local_addr().unwrap().port()) {
            break l;
        }
        rejected.push(l);
    };
    drop(rejected);
    let port = l.local_addr().unwrap().port();
    let (gates, gate_rx): (Vec<Sender<()>>, Vec<Receiver<()>>) =
        (0..conns).map(|_| mpsc::channel()).unzip();
    let (tx, done) = mpsc::channel();
    thread::spawn(move || {
        let mut threads = Vec::new();
        for gate in gate_rx {
            let a = match l.accept() {
                Ok((a, _)) => a,
                Err(e) => {
                    threads.push(thread::spawn(move || Err(e)));
                    break;
                }
            };
            threads.push(thread::spawn(move || -> io::Result<(u64, u64)> {
                gate.recv_timeout(Duration::from_secs(120))
                    .map_err(|_| io::Error::other("relay: gate never opened"))?;
                let b = TcpStream::connect(("127.0.0.1", target))?;
                let (a2, b2) = (a.try_clone()?, b.try_clone()?);
                let up = thread::spawn(move || pass(a2, b2));
                let down = pass(b, a);
                let up = up
                    .join()
                    .map_err(|_| io::Error::other("relay thread panicked"))?;
                Ok((up, down))
            }));
        }
        let r = threads
            .into_iter()
            .map(|t| {
                t.join()
                    .unwrap_or_else(|_| Err(io::Error::other("relay thread panicked")))
            })
            .collect();
        let _ = tx.send(r);
    });
    GatedRelay { port, gates, done }
}

/// Copies `from` to `to` until `from` ends, then half-closes `to`; a
/// connection that ends with a reset (how the engine answers siw's FIN,
/// and how siw closes abruptly) ends the copy the same way, as a FIN.
/// Returns the bytes copied.
fn pass(mut from: TcpStream, mut to: TcpStream) -> u64 {
    let mut buf = vec![0u8; 64 << 10];
    let mut n = 0u64;
    loop {
        match io::Read::read(&mut from, &mut buf) {
            Ok(0) | Err(_) => break,
            Ok(k) => {
                if io::Write::write_all(&mut to, &buf[..k]).is_err() {
                    break;
                }
                n += k as u64;
            }
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    n
}

/// A drop-in client started on the guest's `SERVER-READY`.
struct Running {
    case: usize,
    proc_: HostProc,
    /// When it was seen to exit unsuccessfully (the guest's server then
    /// has a little while to report before the guest is stopped).
    failed_at: Option<Instant>,
}

/// Attempts a guest server (rping, ucmatose) may take in a CRC case.
const SERVER_ATTEMPTS: u32 = 4;

/// The guest script of one rping or ucmatose server case: `server` (a
/// command line) writes /tmp/s.out and /tmp/s.err, `ready` announces it
/// (`SERVER-READY NAME`), `expect` is its expected stdout; then
/// `CASE NAME RC ...` (guest-lib.sh `report`).
///
/// With CRC, a failed attempt runs again (up to [`SERVER_ATTEMPTS`]), but
/// only when the guest kernel logged a new `siw: crc error` meanwhile: siw
/// misreads the CRC trailer of some of the drop-in's 65535-byte Read
/// Responses once slirp has re-segmented them (common/guest.rs, "siw's CRC
/// reports"; one CI run lost `rping-65535-crc1` in a way that fits it,
/// siw failing its Write with status 2 after two pings, but printed no
/// kernel log to show it). It prints `RETRIED NAME| ...` (the
/// server's stderr), the reports as `SIWCRC NAME| ...` and
/// `RETRY NAME ATTEMPT n`; the host checks every report's CRC against the
/// capture ([`check_siw_crc_reports`]). A case that fails for good prints
/// the guest kernel's last lines (`DMESG NAME| ...`).
fn guest_server_with_retry(
    name: &str,
    crc: bool,
    server: &str,
    ready: &str,
    expect: &str,
) -> String {
    format!(
        "n=1\n\
         while :; do\n\
         {count}\
         {server} > /tmp/s.out 2> /tmp/s.err &\n\
         {ready}wait $spid\n\
         rc=$?\n\
         ok=false; [ $rc = 0 ] && cmp -s /tmp/s.out {expect} && ok=true\n\
         if [ {crc} = true ] && [ $ok = false ] && [ $n -lt {SERVER_ATTEMPTS} ] && {new}; then\n\
         sed 's/^/RETRIED {name}| /' /tmp/s.err\n\
         {lines}\
         n=$((n + 1))\n\
         marker \"RETRY {name} ATTEMPT $n\"\n\
         continue\n\
         fi\n\
         break\n\
         done\n\
         [ $ok = true ] || dmesg | tail -n 20 | sed 's/^/DMESG {name}| /'\n\
         report {name} $rc /tmp/s.out {expect} /tmp/s.err\n",
        count = SIW_CRC_COUNT,
        new = SIW_CRC_NEW,
        lines = siw_crc_lines(name),
    )
}

/// The guest's siw CRC reports (`SIWCRC NAME| ...`) against the capture:
/// every case run again has at least one report per retry, and each
/// report's own CRC is one that tshark found good in the drop-in client's
/// FPDUs to that case's port, so siw computed the CRC the host sent and
/// misread the trailer. Prints each retry and report.
///
/// `sent(port)`: the CRCs tshark found good in FPDUs to `port`
/// ([`sent_crcs`]).
fn check_siw_crc_reports(
    log: &[String],
    cases: &[Case],
    retries: &BTreeMap<usize, usize>,
    sent: impl Fn(u16) -> BTreeSet<u32>,
) -> Result<(), String> {
    let mut problems = Vec::new();
    for (i, c) in cases.iter().enumerate() {
        let tag = format!("SIWCRC {}| ", c.name);
        let reports: Vec<&String> = log.iter().filter(|l| l.starts_with(&tag)).collect();
        let again = retries.get(&i).copied().unwrap_or(0);
        let said = format!("RETRY {} ATTEMPT ", c.name);
        let guest_said = log.iter().filter(|l| l.starts_with(&said)).count();
        if again != guest_said {
            problems.push(format!(
                "{}: the guest ran it again {guest_said} times, the host saw {again}",
                c.name
            ));
        }
        if reports.is_empty() && again == 0 {
            continue;
        }
        println!(
            "host| {}: run again {again} times; guest kernel: {}",
            c.name,
            reports
                .iter()
                .map(|l| l.as_str())
                .collect::<Vec<_>>()
                .join(" / ")
        );
        if reports.len() < again {
            problems.push(format!(
                "{}: {again} retries but {} siw CRC reports",
                c.name,
                reports.len()
            ));
        }
        let sent = sent(c.host_port);
        for l in reports {
            match parse_siw_crc_own(l) {
                Some(own) if siw_own_crc_was_sent(own, &sent) => {}
                _ => problems.push(format!(
                    "{}: guest siw reported `{l}`, and its own CRC is none of the {} CRCs \
                     the drop-in client sent",
                    c.name,
                    sent.len()
                )),
            }
        }
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!("siw CRC reports:\n  {}", problems.join("\n  ")))
    }
}

/// Drop-in rping, ucmatose and perftest clients against the same programs
/// as servers on siw in the guest, through qemu's port forwards, CRC off
/// and on (the client's `--crc` asks; siw mirrors it), one guest boot. The
/// guest prints `SERVER-READY NAME` once a server listens; only then does
/// the host start that case's client.
#[test]
fn dropin_clients_vs_guest_siw_servers() {
    lib_dir_check();
    let Some(env) = guest_env("dropin_clients_vs_guest_siw_servers") else {
        return;
    };
    let _serial = lock_guest();
    let t0 = Instant::now();
    let work = Work::new("dropin-cli");
    let expect_dir = work.path("expect");
    let cases = cases(7400);
    let mut relays: BTreeMap<usize, GatedRelay> = BTreeMap::new();
    let mut script = guest_prelude();
    // listen_inode PORT: the inode of the socket listening on PORT.
    // wait_relisten PORT INODE PID: until another socket listens on PORT
    // (perftest's second listener), while PID lives.
    script += "listen_inode() {\n\
               hex=$(printf '%04X' \"$1\")\n\
               cat /proc/net/tcp /proc/net/tcp6 2>/dev/null | awk -v p=\":$hex\" \
               '$4 == \"0A\" && substr($2, length($2) - 4) == p { print $10; exit }'\n\
               }\n\
               wait_relisten() {\n\
               while kill -0 \"$3\" 2>/dev/null; do\n\
               i=$(listen_inode \"$1\"); [ -n \"$i\" ] && [ \"$i\" != \"$2\" ] && return 0; sleep 0.05\n\
               done; return 1\n\
               }\n";
    for (i, c) in cases.iter().enumerate() {
        let gp = c.guest_port;
        let name = &c.name;
        let ready = format!(
            "spid=$!\n\
             if wait_listen {gp}; then marker 'SERVER-READY {name}'; else echo 'SERVER-NOT-LISTENING {name}'; fi\n"
        );
        script += &match c.prog {
            Prog::Rping(size) => {
                let es = write_expect(&expect_dir, name, true, PINGS, size);
                let server = format!(
                    "timeout {GUEST_CASE_S} rping -s -a 10.0.2.15 -p {gp} -C {PINGS} -S {size} -v"
                );
                guest_server_with_retry(name, c.crc, &server, &ready, &es)
            }
            Prog::Ucmatose => {
                let es = write_cma_expect(&expect_dir, name, true);
                let server = format!(
                    "timeout {GUEST_CASE_S} ucmatose -b 10.0.2.15 -p {gp} -C {CMA_COUNT} -S {CMA_SIZE}"
                );
                guest_server_with_retry(name, c.crc, &server, &ready, &es)
            }
            Prog::Perftest(p) => {
                let reserved: Vec<u16> = cases.iter().map(|c| c.host_port).collect();
                relays.insert(i, gated_relay(c.host_port, 2, &reserved));
                format!(
                    "timeout {GUEST_CASE_S} {tool} -d siw0 {args} -p {gp} > /tmp/p.out 2> /tmp/p.err &\n\
                     spid=$!\n\
                     if wait_listen {gp}; then\n\
                     ino=$(listen_inode {gp})\n\
                     marker 'SERVER-READY {name}'\n\
                     if wait_relisten {gp} \"$ino\" $spid; then marker 'RELISTEN {name}'; fi\n\
                     else echo 'SERVER-NOT-LISTENING {name}'; fi\n\
                     wait $spid\n\
                     rc=$?\n{report}",
                    tool = p.tool,
                    args = p.args().join(" "),
                    report = guest_perftest_report(name)
                )
            }
        };
    }
    script += "exit $fail\n";
    let fwd: Vec<(u16, u16)> = cases.iter().map(|c| (c.host_port, c.guest_port)).collect();
    let mut ports: Vec<u16> = cases.iter().map(|c| c.host_port).collect();
    ports.extend(relays.values().map(|r| r.port));
    let cap = Capture::start(&work, &ports);
    let mut guest = Guest::boot(
        &env,
        &work,
        &script,
        &fwd,
        &[expect_dir],
        120 + cases.len() as u64 * GUEST_CASE_S,
    );
    let mut running: Vec<Running> = Vec::new();
    let mut results: BTreeMap<usize, Result<(), String>> = BTreeMap::new();
    // Attempts run again per case (`guest_server_with_retry`).
    let mut retries: BTreeMap<usize, usize> = BTreeMap::new();
    let poll = Duration::from_millis(200);
    loop {
        let line = match guest.next_line_by(Instant::now() + poll) {
            Ok(Some(l)) => Some(l),
            Ok(None) => break,
            Err(()) if Instant::now() >= guest.deadline => {
                guest.abort("the guest did not finish in time (killed)")
            }
            Err(()) => None,
        };
        // A client that failed leaves its guest server waiting: give the
        // server 15 s to report, then stop the guest.
        for r in running.iter_mut() {
            if r.failed_at.is_none() {
                if let Ok(Some(st)) = r.proc_.child.try_wait() {
                    if !st.success() {
                        r.failed_at = Some(Instant::now());
                    }
                }
            }
        }
        if let Some(r) = running.iter().position(|r| {
            r.failed_at
                .is_some_and(|t| t.elapsed() > Duration::from_secs(15))
        }) {
            let r = running.remove(r);
            let e = r.proc_.premature();
            guest.abort(&format!(
                "{}: the drop-in client failed and the guest's server did not finish \
                 (guest stopped):\n  {e}",
                cases[r.case].name
            ));
        }
        let Some(line) = line else { continue };
        let line = line.trim();
        if let Some(name) = line.strip_prefix("SERVER-READY ") {
            let Some(i) = cases.iter().position(|c| c.name == name) else {
                continue;
            };
            let c = &cases[i];
            let port = c.host_port.to_string();
            let (prog, args) = match c.prog {
                Prog::Rping(size) => (
                    "rping",
                    strs(&[
                        "-c",
                        "-a",
                        "127.0.0.1",
                        "-p",
                        &port,
                        "-C",
                        &PINGS.to_string(),
                        "-S",
                        &size.to_string(),
                        "-v",
                        "-V",
                    ]),
                ),
                Prog::Ucmatose => (
                    "ucmatose",
                    strs(&[
                        "-s",
                        "127.0.0.1",
                        "-p",
                        &port,
                        "-C",
                        &CMA_COUNT.to_string(),
                        "-S",
                        &CMA_SIZE.to_string(),
                    ]),
                ),
                Prog::Perftest(p) => {
                    let relay = &relays[&i];
                    // The control connection goes on at once.
                    let _ = relay.gates[0].send(());
                    let mut a = p.args();
                    a.extend(strs(&["-p", &relay.port.to_string(), "127.0.0.1"]));
                    (p.tool, a)
                }
            };
            // A case run again (`RETRY`) keeps each attempt's files.
            let attempt = 1 + retries.get(&i).copied().unwrap_or(0);
            let proc_name = if attempt == 1 {
                name.to_string()
            } else {
                format!("{name}.attempt{attempt}")
            };
            running.push(Running {
                case: i,
                proc_: HostProc::spawn(&work, &proc_name, &dropin(c.crc, prog, &args)),
                failed_at: None,
            });
        } else if let Some(name) = line
            .strip_prefix("RETRY ")
            .and_then(|rest| rest.split_whitespace().next())
        {
            // The guest's server failed after a siw CRC report and runs
            // again: this attempt's client is printed, not judged (the
            // reports are checked against the capture below).
            let Some(k) = running.iter().position(|r| cases[r.case].name == name) else {
                continue;
            };
            let mut r = running.remove(k);
            *retries.entry(r.case).or_insert(0) += 1;
            let st = wait_deadline(&mut r.proc_.child, Instant::now() + Duration::from_secs(30));
            println!(
                "host| {name}: attempt failed on the guest's side, run again; its client \
                 ended {st:?} (output in {})",
                r.proc_.out.display()
            );
        } else if let Some(name) = line.strip_prefix("RELISTEN ") {
            if let Some(r) = cases
                .iter()
                .position(|c| c.name == name)
                .and_then(|i| relays.get(&i))
            {
                let _ = r.gates[1].send(());
            }
        } else if let Some(name) = line
            .strip_prefix("CASE ")
            .or_else(|| line.strip_prefix("PERFTEST "))
            .and_then(|rest| rest.split_whitespace().next())
        {
            // The guest's server is done: its client must be done too.
            let Some(k) = running.iter().position(|r| cases[r.case].name == name) else {
                continue;
            };
            let r = running.remove(k);
            let end = Instant::now() + Duration::from_secs(30);
            let res = match cases[r.case].prog {
                Prog::Rping(size) => r
                    .proc_
                    .finish(end, &rping_verbose_lines(false, PINGS, size)),
                Prog::Ucmatose => r.proc_.finish_lines(end, &cma_lines(false)),
                Prog::Perftest(p) => finish_perftest(r.proc_, end, p, false),
            };
            results.insert(r.case, res);
        }
    }
    let exit = guest.finish();
    let pcap = cap.stop();

    let gcases = guest.cases();
    let mut problems = Vec::new();
    // Guest perftests accepted with siw's late completion of their last Send.
    let mut late = 0;
    for (i, c) in cases.iter().enumerate() {
        match c.prog {
            Prog::Perftest(p) => match guest_perftest(&guest, &c.name, p, true) {
                Ok(PerfEnd::SiwLateCompletion) => late += 1,
                Ok(PerfEnd::Complete) => {}
                Err(e) => problems.push(e),
            },
            _ => match gcases.get(&c.name) {
                Some((rc, data)) if rc == "0" && data == "match" => {}
                other => problems.push(format!("{}: guest server: {other:?}", c.name)),
            },
        }
        match results.remove(&i) {
            Some(Ok(())) => {}
            Some(Err(e)) => problems.push(e),
            None => problems.push(format!("{}: drop-in client never ran", c.name)),
        }
    }
    for (i, r) in &relays {
        match r.done.recv_timeout(Duration::from_secs(10)) {
            Ok(v)
                if v.len() == 2
                    && v.iter()
                        .all(|x| x.as_ref().is_ok_and(|(u, d)| *u > 0 && *d > 0)) => {}
            other => problems.push(format!("{}: relay: {other:?}", cases[*i].name)),
        }
    }
    // The guest script counts any perftest exit status but 0 as a failure;
    // those accepted above are the only ones allowed.
    if exit != 0 && !(exit == 1 && late > 0 && problems.is_empty()) {
        problems.push(format!("GUEST-EXIT {exit}"));
    }
    if !problems.is_empty() {
        guest.fail(&format!(
            "drop-in clients -> guest siw servers:\n  {}",
            problems.join("\n  ")
        ));
    }
    let sent = |port: u16| sent_crcs(&pcap, &format!("tcp.dstport == {port}"));
    if let Err(e) = check_siw_crc_reports(&guest.log, &cases, &retries, sent) {
        guest.fail(&e);
    }
    // Both legs of a relayed connection carry the same bytes: both checked.
    let mut checks: Vec<(&Case, u16)> = cases.iter().map(|c| (c, c.host_port)).collect();
    for (i, r) in &relays {
        checks.push((&cases[*i], r.port));
    }
    assert_wire(&pcap, &checks);
    println!(
        "host| {} cases in {:.1} s ({late} guest perftests with siw's late completion of \
         their last Send)",
        cases.len(),
        t0.elapsed().as_secs_f64()
    );
}

// ---------------------------------------------------------------------------
// the mixed pair: Debian's rping on the drop-in, softrdma rping on the engine
// ---------------------------------------------------------------------------

/// Debian's `rping` on the drop-in against `softrdma rping` (the engine's
/// Rust API, crates/cli/src/rping.rs), on this host, no guest: each as
/// server and as client, 4 KiB and 64 KiB-1, CRC off and on, and with the
/// Debian client over TCP (`--tcp-only`) and over the same-host path (the
/// drop-in offers softrdma's extensions to a peer on this host; the Rust
/// client offers none, so that direction is TCP). rping's `-v` lines on
/// both sides are checked against the pattern byte for byte; the Debian
/// client also checks them itself (`-V`).
#[test]
fn dropin_rping_vs_softrdma_rping() {
    lib_dir_check();
    let _serial = lock_guest();
    let work = Work::new("dropin-mixed");
    let count = 20;
    let mut problems = Vec::new();
    for size in [4096usize, RPING_MAX_SIZE] {
        for crc in [false, true] {
            // (Debian side is the server, Debian client over TCP only)
            for (debian_server, tcp_only) in [(true, false), (false, true), (false, false)] {
                let port = free_ports(1)[0];
                let p = port.to_string();
                let sz = size.to_string();
                let n = count.to_string();
                let name = format!(
                    "{}-{size}-crc{}{}",
                    if debian_server {
                        "debian-server"
                    } else {
                        "debian-client"
                    },
                    crc as u8,
                    if tcp_only { "-tcp" } else { "" }
                );
                let mut dropin_args = strs(&["run", "--lib-log", "softrdma_verbs::cm=debug"]);
                if crc {
                    dropin_args.push("--crc".into());
                }
                if tcp_only {
                    dropin_args.push("--tcp-only".into());
                }
                dropin_args.extend(strs(&["--", "rping"]));
                let role = if debian_server { "-s" } else { "-c" };
                dropin_args.extend(strs(&[
                    role,
                    "-a",
                    "127.0.0.1",
                    "-p",
                    &p,
                    "-C",
                    &n,
                    "-S",
                    &sz,
                    "-v",
                ]));
                if !debian_server {
                    dropin_args.push("-V".into());
                }
                let mut rust_args = strs(&[
                    "rping",
                    if debian_server {
                        "--client"
                    } else {
                        "--server"
                    },
                    "--addr",
                    "127.0.0.1",
                    "--port",
                    &p,
                    "--count",
                    &n,
                    "--size",
                    &sz,
                    "--verbose",
                ]);
                if crc {
                    rust_args.push("--crc".into());
                }
                let (srv_name, srv_args, cli_name, cli_args) = if debian_server {
                    (
                        format!("{name}.debian"),
                        dropin_args,
                        format!("{name}.rust"),
                        rust_args,
                    )
                } else {
                    (
                        format!("{name}.rust"),
                        rust_args,
                        format!("{name}.debian"),
                        dropin_args,
                    )
                };
                let deadline = Instant::now() + Duration::from_secs(60);
                let mut s = HostProc::spawn(&work, &srv_name, &srv_args);
                while !host_listening(port) {
                    if s.child.try_wait().unwrap().is_some() || Instant::now() > deadline {
                        panic!("{srv_name} never listened on {port}: {}", s.premature());
                    }
                    thread::sleep(Duration::from_millis(10));
                }
                let c = HostProc::spawn(&work, &cli_name, &cli_args);
                let debian_err = if debian_server { &s.err } else { &c.err }.clone();
                if let Err(e) = c.finish(deadline, &rping_verbose_lines(false, count, size)) {
                    problems.push(e);
                }
                if let Err(e) = s.finish(deadline, &rping_verbose_lines(true, count, size)) {
                    problems.push(e);
                }
                // The path and CRC the drop-in negotiated.
                let log = fs::read_to_string(&debian_err).unwrap_or_default();
                let est = log.lines().find(|l| l.contains("connection established"));
                let same_host = !debian_server && !tcp_only;
                match est {
                    Some(l)
                        if l.contains(&format!("same_host: {same_host}"))
                            && l.contains(&format!("crc: {crc}")) =>
                    {
                        println!("host| {name}: same_host {same_host}, crc {crc}")
                    }
                    other => problems.push(format!(
                        "{name}: expected same_host: {same_host}, crc: {crc} in the drop-in's \
                         log, found {other:?}"
                    )),
                }
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn siw_crc_reports_must_match_the_capture_and_the_retries() {
    let case = |name: &str, host_port| Case {
        name: name.into(),
        prog: Prog::Rping(RPING_MAX_SIZE),
        crc: true,
        host_port,
        guest_port: 7400,
    };
    let cases = [case("a", 1000), case("b", 2000)];
    let log = |lines: &[&str]| -> Vec<String> { lines.iter().map(|l| l.to_string()).collect() };
    // siw prints its own CRC byte-swapped against tshark's value.
    let sent = |port: u16| -> BTreeSet<u32> {
        if port == 1000 {
            [0xf997_778e].into()
        } else {
            BTreeSet::new()
        }
    };
    let good = log(&[
        "SIWCRC a| crc error. in: be77978e, own 8e7797f9, op 2",
        "RETRY a ATTEMPT 2",
    ]);
    let once: BTreeMap<usize, usize> = [(0, 1)].into();
    assert_eq!(check_siw_crc_reports(&good, &cases, &once, sent), Ok(()));
    // No retry, no report: nothing to check.
    assert_eq!(
        check_siw_crc_reports(&[], &cases, &BTreeMap::new(), sent),
        Ok(())
    );
    // A report whose own CRC the host never sent fails.
    let bogus = log(&[
        "SIWCRC a| crc error. in: 1234, own 5678, op 2",
        "RETRY a ATTEMPT 2",
    ]);
    let e = check_siw_crc_reports(&bogus, &cases, &once, sent).unwrap_err();
    assert!(e.contains("own CRC is none"), "{e}");
    // A retry without a report fails, and so does a retry the host missed.
    let bare = log(&["RETRY a ATTEMPT 2"]);
    let e = check_siw_crc_reports(&bare, &cases, &once, sent).unwrap_err();
    assert!(e.contains("1 retries but 0 siw CRC reports"), "{e}");
    let e = check_siw_crc_reports(&good, &cases, &BTreeMap::new(), sent).unwrap_err();
    assert!(e.contains("the host saw 0"), "{e}");
    // Reports are checked per case: b's port carried no such CRC.
    let other = log(&[
        "SIWCRC b| crc error. in: be77978e, own 8e7797f9, op 2",
        "RETRY b ATTEMPT 2",
    ]);
    let e = check_siw_crc_reports(&other, &cases, &[(1, 1)].into(), sent).unwrap_err();
    assert!(e.contains("b: guest siw reported"), "{e}");
}
