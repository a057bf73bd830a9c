//! Interoperability with Linux soft-iWARP (`siw`) and rdma-core's `rping`.
//!
//! The peer is a qemu guest (`../shared/kvm-rdma`, built by `scripts/setup.sh`)
//! running the kernel's own siw driver and rdma-core's user space. Our
//! `softrdma` binary runs on the host; traffic crosses the host's loopback,
//! where tshark captures it and Wireshark's `iwarp_mpa` / `iwarp_ddp_rdmap`
//! dissectors check it.
//!
//! - `guest_self_check`: rping against rping inside one guest, plus two runs
//!   whose TCP stream loops through the host (through a relay of this test),
//!   so that tshark sees genuine siw traffic, with CRC off and on. Proves the
//!   guest image, siw, rping, port forwarding, the marker handshake and the
//!   capture checks.
//! - `guest_rping_client_vs_softrdma_server`: guest `rping -c` against
//!   `softrdma rping --server`.
//! - `softrdma_client_vs_guest_rping_server`: `softrdma rping --client`
//!   against guest `rping -s`.
//! - `guest_ucmatose_client_vs_softrdma_server` and
//!   `softrdma_client_vs_guest_ucmatose_server`: rdma-core's `ucmatose`
//!   (Sends of any size, 1 byte to 1 MiB here) against `softrdma cmatose`,
//!   both ways (docs/cmatose-protocol.md).
//! - `one_shot_against_guest_siw_target` (both directions, solicited close,
//!   cancel) and
//!   `guest_siw_client_vs_softrdma_storage_target`: rdma-core programs of
//!   ours (`tests/guest/*.c`) on siw against the one-shot initiator and
//!   the storage target.
//! - `scattered_reads_from_guest_siw`: RDMA Reads into several local SGEs
//!   (one sink STag bound over them) answered by siw (`tests/guest/read_source.c`).
//!
//! A missing guest image is a failure (run `scripts/setup.sh`), unless
//! `SOFTRDMA_NO_GUEST=1` is set. Guest boots are serialised (one at a time).
//! `SOFTRDMA_SOAK=1` raises the ping count. See docs/interop.md; the rping
//! protocol is in docs/rping-protocol.md.

mod common;
use common::guest::*;
use common::*;
use std::collections::{BTreeMap, BTreeSet};
use std::fs;
use std::io::{self, Read};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc::{self, Receiver};
use std::thread;
use std::time::{Duration, Instant};

const SIZES: [usize; 3] = [RPING_MIN_SIZE, 4096, RPING_MAX_SIZE];

/// Seconds one rping run may take inside the guest (it runs under TCG).
fn case_timeout_s(count: usize) -> u64 {
    30 + count as u64 / 5
}

/// Pings per case: 10, or with SOFTRDMA_SOAK=1 1000 (100 for sizes over
/// 4 KiB, whose expected output the guest has to hold in memory).
fn ping_count(size: usize) -> usize {
    match std::env::var("SOFTRDMA_SOAK").as_deref() {
        Ok("1") if size > 4096 => 100,
        Ok("1") => 1000,
        _ => 10,
    }
}

// ---------------------------------------------------------------------------
// rping's data (see docs/rping-protocol.md, "Buffer contents")
// ---------------------------------------------------------------------------

#[test]
fn payload_pattern_matches_rping() {
    // Checked against rdma-core 44's rping output in the guest.
    let p = rping_payload(0, 64);
    assert_eq!(
        &p[..63],
        b"rdma-ping-0: ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqr"
    );
    assert_eq!(p[63], 0);
    let p = rping_payload(2, 64);
    assert!(p.starts_with(b"rdma-ping-2: CDEFG"));
    // The start character wraps from 'z' back to 'A' after 58 pings.
    assert!(rping_payload(57, 30).starts_with(b"rdma-ping-57: z"));
    assert!(rping_payload(58, 30).starts_with(b"rdma-ping-58: A"));
    assert_eq!(rping_payload(1, RPING_MIN_SIZE).len(), RPING_MIN_SIZE);
}

// ---------------------------------------------------------------------------
// Environment
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// Host-side softrdma processes
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// The guest
// ---------------------------------------------------------------------------

// ---------------------------------------------------------------------------
// tshark
// ---------------------------------------------------------------------------

/// A one-connection TCP relay on the host, 127.0.0.1:(returned port) ->
/// 127.0.0.1:`target`. It accepts at once but connects on to `target` only
/// once `gate` fires. With `ask_crc` it sets the CRC bit (0x40 of byte 16)
/// in the MPA request passing through, so two siw ends (neither of which asks
/// for CRC by itself) negotiate CRC. Reports the bytes copied each way.
///
/// It passes the initiator's bytes after its MPA request on only
/// [`FIRST_FPDU_GRACE`] after the MPA reply went back: Linux siw as the
/// responder installs its RDMA-mode socket callback only after it sent the
/// reply (`siw_accept`), and an FPDU that arrives in between stays unnoticed
/// in its socket until more data comes, so rping's server waits for the
/// client's first Send forever. Guest-to-guest through the host that window
/// is normally missed, but not on a loaded host: `loopcrc` hung once in CI
/// beside a CPU hog (client "wait for RDMA_WRITE_ADV state 10", server killed
/// at its timeout, exit 143). The drop-in and `softrdma rping` wait the same
/// 50 ms for the same reason (`FIRST_SEND_GRACE`, `--first-send-delay-ms`).
fn start_relay(
    target: u16,
    gate: Receiver<()>,
    ask_crc: bool,
) -> (u16, Receiver<io::Result<(u64, u64)>>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let r = (|| {
            let (a, _) = l.accept()?;
            gate.recv_timeout(Duration::from_secs(120))
                .map_err(|_| io::Error::other("relay: gate never opened"))?;
            let b = TcpStream::connect(("127.0.0.1", target))?;
            let (mut a2, mut b2) = (a.try_clone()?, b.try_clone()?);
            // When the MPA reply went back to the initiator.
            let (replied_tx, replied) = mpsc::channel::<Instant>();
            let up = thread::spawn(move || -> io::Result<u64> {
                // The MPA request: 16-byte key, flags, revision, PD length,
                // then the private data.
                let (mut head, pd) = read_mpa_frame(&mut a2)?;
                if ask_crc {
                    head[16] |= 0x40;
                }
                io::Write::write_all(&mut b2, &head)?;
                io::Write::write_all(&mut b2, &pd)?;
                // Nothing more before the reply; if none comes (the
                // responder went away), pass the rest on anyway.
                if let Ok(at) = replied.recv() {
                    thread::sleep(FIRST_FPDU_GRACE.saturating_sub(at.elapsed()));
                }
                let n = io::copy(&mut a2, &mut b2);
                let _ = b2.shutdown(Shutdown::Write);
                Ok(n? + 20 + pd.len() as u64)
            });
            let (mut a3, mut b3) = (a, b);
            let reply = read_mpa_frame(&mut b3).and_then(|(head, pd)| {
                io::Write::write_all(&mut a3, &head)?;
                io::Write::write_all(&mut a3, &pd)?;
                Ok(20 + pd.len() as u64)
            });
            let _ = replied_tx.send(Instant::now());
            drop(replied_tx);
            let down = reply.and_then(|n| Ok(n + io::copy(&mut b3, &mut a3)?));
            let _ = a3.shutdown(Shutdown::Write);
            let up = up
                .join()
                .map_err(|_| io::Error::other("relay thread panicked"))?;
            Ok((up?, down?))
        })();
        let _ = tx.send(r);
    });
    (port, rx)
}

/// How long [`start_relay`] holds the initiator's first FPDU after the MPA
/// reply (not synchronisation with anything observable: the siw responder
/// race it describes).
const FIRST_FPDU_GRACE: Duration = Duration::from_millis(50);

/// An MPA request or reply: its 20-byte header and its private data.
fn read_mpa_frame(s: &mut TcpStream) -> io::Result<([u8; 20], Vec<u8>)> {
    let mut head = [0u8; 20];
    s.read_exact(&mut head)?;
    let mut pd = vec![0u8; u16::from_be_bytes([head[18], head[19]]) as usize];
    s.read_exact(&mut pd)?;
    Ok((head, pd))
}

// ---------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------

/// rping against rping in one guest (both on siw over eth0), then two runs
/// looped through the host (CRC off, CRC on) so that tshark sees siw's own
/// traffic, each started by a marker line from the guest.
#[test]
fn guest_self_check() {
    let Some(env) = guest_env("guest_self_check") else {
        return;
    };
    let _serial = lock_guest();
    let work = Work::new("self");
    let ct = case_timeout_s(ping_count(0));
    let expect_dir = work.path("expect");

    let mut script = guest_prelude();
    // 1. siw <-> siw inside the guest. (siw on `lo` does not do: rdma_cm
    //    cannot resolve 127.0.0.1 to it. The guest's own eth0 address loops
    //    inside the kernel just the same.)
    //    Each pair runs twice (`self{size}` and `self{size}b`): this is
    //    Linux siw and rping alone, and beside a CPU hog rping's own state
    //    machine lost a pair now and then (stop 43's second CI run: both
    //    ends of the 23-byte pair ended with "wait for RDMA_WRITE_ADV state
    //    10" and no data); a size passes when one of its pairs does, and a
    //    failed first pair is said aloud.
    for (i, size) in SIZES.iter().enumerate() {
        for (attempt, suffix) in ["", "b"].iter().enumerate() {
            let port = 7180 + i + 5 * attempt;
            let count = ping_count(*size);
            let es = write_expect(
                &expect_dir,
                &format!("self{size}{suffix}.server"),
                true,
                count,
                *size,
            );
            let ec = write_expect(
                &expect_dir,
                &format!("self{size}{suffix}.client"),
                false,
                count,
                *size,
            );
            script += &format!(
                "timeout {ct} rping -s -a 10.0.2.15 -p {port} -C {count} -S {size} -v > /tmp/s.out 2> /tmp/s.err &\n\
                 spid=$!\n\
                 wait_listen {port} || echo 'rping server not listening'\n\
                 timeout {ct} rping -c -a 10.0.2.15 -p {port} -C {count} -S {size} -v -V > /tmp/c.out 2> /tmp/c.err\n\
                 report self{size}{suffix}-client $? /tmp/c.out {ec} /tmp/c.err\n\
                 wait $spid\n\
                 report self{size}{suffix}-server $? /tmp/s.out {es} /tmp/s.err\n"
            );
        }
    }
    // 2. Client -> host relay -> forwarded port -> server, all siw, so the
    //    capture on the host's lo holds siw's own traffic; once as siw does
    //    it (no CRC), once with the relay asking for CRC on the client's
    //    behalf, so that both ends use CRC and tshark checks real CRCs. The
    //    relay connects on to the server only when the host has read the
    //    guest's LOOP-READY marker: the handshake the host-client tests rely
    //    on (siw gives up on an unanswered MPA request after 10 s).
    struct Loop {
        name: &'static str,
        crc: bool,
        guest_port: u16,
        fwd: u16,
        relay: u16,
        gate: mpsc::Sender<()>,
        done: Receiver<io::Result<(u64, u64)>>,
    }
    let loop_size = 4096;
    let count = ping_count(loop_size);
    let mut loops = Vec::new();
    let fwd_ports = free_ports(2);
    for (name, crc, guest_port, fwd) in [
        ("loop", false, 7190, fwd_ports[0]),
        ("loopcrc", true, 7191, fwd_ports[1]),
    ] {
        let (gate, gate_rx) = mpsc::channel();
        let (relay, done) = start_relay(fwd, gate_rx, crc);
        let es = write_expect(
            &expect_dir,
            &format!("{name}.server"),
            true,
            count,
            loop_size,
        );
        let ec = write_expect(
            &expect_dir,
            &format!("{name}.client"),
            false,
            count,
            loop_size,
        );
        script += &format!(
            "timeout {ct} rping -s -a 10.0.2.15 -p {guest_port} -C {count} -S {loop_size} -v > /tmp/s.out 2> /tmp/s.err &\n\
             spid=$!\n\
             if wait_listen {guest_port}; then marker 'LOOP-READY {name}'; else echo 'rping server not listening'; fi\n\
             timeout {ct} rping -c -a 10.0.2.2 -p {relay} -C {count} -S {loop_size} -v -V > /tmp/c.out 2> /tmp/c.err\n\
             report {name}-client $? /tmp/c.out {ec} /tmp/c.err\n\
             wait $spid\n\
             report {name}-server $? /tmp/s.out {es} /tmp/s.err\n"
        );
        loops.push(Loop {
            name,
            crc,
            guest_port,
            fwd,
            relay,
            gate,
            done,
        });
    }
    script += "exit $fail\n";

    let ports: Vec<u16> = loops.iter().flat_map(|l| [l.relay, l.fwd]).collect();
    let fwds: Vec<(u16, u16)> = loops.iter().map(|l| (l.fwd, l.guest_port)).collect();
    let cap = Capture::start(&work, &ports);
    let mut guest = Guest::boot(&env, &work, &script, &fwds, &[expect_dir], 120 + 8 * ct);
    let mut markers = 0;
    while let Some(line) = guest.next_line() {
        if let Some(name) = line.trim().strip_prefix("LOOP-READY ") {
            if let Some(l) = loops.iter().find(|l| l.name == name) {
                markers += 1;
                let _ = l.gate.send(());
            }
        }
    }
    let exit = guest.finish();
    let pcap = cap.stop();

    let cases = guest.cases();
    let mut problems = Vec::new();
    let ok = |n: &str| matches!(cases.get(n), Some((rc, data)) if rc == "0" && data == "match");
    for size in SIZES {
        let pair_ok = |suffix: &str| {
            ok(&format!("self{size}{suffix}-client")) && ok(&format!("self{size}{suffix}-server"))
        };
        match (pair_ok(""), pair_ok("b")) {
            (true, _) => {}
            (false, true) => println!(
                "host| self{size}: the first siw<->siw rping pair failed ({:?}, {:?}); the second \
                 passed",
                cases.get(&format!("self{size}-client")),
                cases.get(&format!("self{size}-server"))
            ),
            (false, false) => {
                for n in ["", "b"].iter().flat_map(|x| {
                    [
                        format!("self{size}{x}-client"),
                        format!("self{size}{x}-server"),
                    ]
                }) {
                    problems.push(format!("{n}: {:?}", cases.get(&n)));
                }
            }
        }
    }
    let mut names: Vec<String> = Vec::new();
    for l in &loops {
        names.extend([format!("{}-client", l.name), format!("{}-server", l.name)]);
    }
    for n in &names {
        match cases.get(n) {
            Some((rc, data)) if rc == "0" && data == "match" => {}
            other => problems.push(format!("{n}: {other:?}")),
        }
    }
    if markers != loops.len() {
        problems.push(format!(
            "saw {markers} LOOP-READY markers of {}",
            loops.len()
        ));
    }
    if exit != 0 {
        problems.push(format!("GUEST-EXIT {exit}"));
    }
    for l in &loops {
        match l.done.recv_timeout(Duration::from_secs(30)) {
            Ok(Ok((up, down))) => {
                println!("host| relay {} copied {up} bytes up, {down} down", l.name)
            }
            other => problems.push(format!("relay {}: {other:?}", l.name)),
        }
    }
    if !problems.is_empty() {
        guest.fail(&format!(
            "guest self-check failed:\n  {}",
            problems.join("\n  ")
        ));
    }

    // siw <-> siw through the host: every leg decodes, MPA rev 2, CRC as set.
    let conns = analyse_capture(&pcap, &ports);
    for l in &loops {
        for port in [l.relay, l.fwd] {
            if let Err(e) = check_conn(&conns, port, 2, l.crc) {
                panic!("capture check ({}): {e}\nall: {conns:#?}", l.name);
            }
        }
    }
    println!("host| capture: {conns:?}");
}

/// Guest `rping -c` (siw) against `softrdma rping --server` on the host.
/// The guest's siw always asks for MPA revision 2 (enhanced) and no CRC; our
/// server decides CRC with `--crc`. A revision-1 reply to siw's revision-2
/// request is a protocol error for siw, so revision 1 is covered by the
/// host-client test only.
#[test]
fn guest_rping_client_vs_softrdma_server() {
    let Some(env) = guest_env("guest_rping_client_vs_softrdma_server") else {
        return;
    };
    let _serial = lock_guest();
    let work = Work::new("srv");
    let ct = case_timeout_s(ping_count(0));
    let expect_dir = work.path("expect");

    struct Case {
        name: String,
        port: u16,
        size: usize,
        crc: bool,
        proc_: Option<HostProc>,
    }
    let mut cases = Vec::new();
    let ports = free_ports(SIZES.len() * 2);
    for (i, (size, crc)) in SIZES
        .iter()
        .flat_map(|s| [(*s, false), (*s, true)])
        .enumerate()
    {
        let name = format!("s{size}-crc{}", crc as u8);
        cases.push(Case {
            name,
            port: ports[i],
            size,
            crc,
            proc_: None,
        });
    }
    let mut script = guest_prelude();
    for c in &mut cases {
        let count = ping_count(c.size);
        let mut args: Vec<String> = [
            "rping",
            "--server",
            "--port",
            &c.port.to_string(),
            "--count",
            &count.to_string(),
            "--size",
            &c.size.to_string(),
            "--verbose",
            "--mpa-rev",
            "2",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if c.crc {
            args.push("--crc".into());
        }
        c.proc_ = Some(HostProc::spawn(&work, &c.name, &args));
        let ec = write_expect(&expect_dir, &c.name, false, count, c.size);
        script += &format!(
            "marker 'CLIENT-START {name}'\n\
             timeout {ct} rping -c -a 10.0.2.2 -p {port} -C {count} -S {size} -v -V > /tmp/c.out 2> /tmp/c.err\n\
             report {name} $? /tmp/c.out {ec} /tmp/c.err\n",
            name = c.name,
            port = c.port,
            size = c.size
        );
    }
    script += "exit $fail\n";
    // Every server listens before the guest boots: no connection is refused.
    let deadline = Instant::now() + Duration::from_secs(30);
    for c in &mut cases {
        while !host_listening(c.port) {
            let p = c.proc_.as_mut().unwrap();
            if p.child.try_wait().unwrap().is_some() || Instant::now() > deadline {
                let p = c.proc_.take().unwrap();
                let e = p.premature();
                panic!(
                    "softrdma server {} never listened on {}: {e}",
                    c.name, c.port
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
    let ports: Vec<u16> = cases.iter().map(|c| c.port).collect();
    let cap = Capture::start(&work, &ports);
    let mut guest = Guest::boot(
        &env,
        &work,
        &script,
        &[],
        &[expect_dir],
        120 + cases.len() as u64 * ct,
    );
    // A guest rping client facing no listener hangs until its timeout: stop
    // at once if the server of the case about to run has already exited.
    while let Some(line) = guest.next_line() {
        let Some(name) = line.trim().strip_prefix("CLIENT-START ") else {
            continue;
        };
        let Some(c) = cases.iter_mut().find(|c| c.name == name) else {
            continue;
        };
        if c.proc_
            .as_mut()
            .unwrap()
            .child
            .try_wait()
            .unwrap()
            .is_some()
        {
            let p = c.proc_.take().unwrap();
            let e = p.premature();
            guest.abort(&format!(
                "softrdma server {} exited before its client started: {e}",
                c.name
            ));
        }
    }
    let exit = guest.finish();
    let pcap = cap.stop();

    let gcases = guest.cases();
    let mut problems = Vec::new();
    let end = Instant::now() + Duration::from_secs(30);
    for c in &mut cases {
        let count = ping_count(c.size);
        match gcases.get(&c.name) {
            Some((rc, data)) if rc == "0" && data == "match" => {}
            other => problems.push(format!("{}: guest rping client: {other:?}", c.name)),
        }
        let expect = rping_verbose_lines(true, count, c.size);
        if let Err(e) = c.proc_.take().unwrap().finish(end, &expect) {
            problems.push(e);
        }
    }
    if exit != 0 {
        problems.push(format!("GUEST-EXIT {exit}"));
    }
    if !problems.is_empty() {
        guest.fail(&format!(
            "guest client -> softrdma server:\n  {}",
            problems.join("\n  ")
        ));
    }
    let conns = analyse_capture(&pcap, &ports);
    let errs: Vec<String> = cases
        .iter()
        .filter_map(|c| check_conn(&conns, c.port, 2, c.crc).err())
        .collect();
    assert!(
        errs.is_empty(),
        "capture checks failed:\n  {}",
        errs.join("\n  ")
    );
}

/// `softrdma rping --client` on the host against guest `rping -s` (siw),
/// through qemu's port forwarding; MPA revision 1 and 2, CRC off and on.
/// The guest prints `SERVER-READY NAME` once its rping listens; only then
/// does the host start that case's client.
#[test]
fn softrdma_client_vs_guest_rping_server() {
    let Some(env) = guest_env("softrdma_client_vs_guest_rping_server") else {
        return;
    };
    let _serial = lock_guest();
    let work = Work::new("cli");
    let ct = case_timeout_s(ping_count(0));
    let expect_dir = work.path("expect");

    struct Case {
        name: String,
        host_port: u16,
        guest_port: u16,
        size: usize,
        rev: u32,
        crc: bool,
        result: Option<Result<(), String>>,
    }
    let mut cases = Vec::new();
    let combos: Vec<(usize, u32, bool)> = SIZES
        .iter()
        .flat_map(|s| [(*s, 1, false), (*s, 1, true), (*s, 2, false), (*s, 2, true)])
        .collect();
    let ports = free_ports(combos.len());
    for (i, (size, rev, crc)) in combos.into_iter().enumerate() {
        cases.push(Case {
            name: format!("c{size}-rev{rev}-crc{}", crc as u8),
            host_port: ports[i],
            guest_port: 7200 + i as u16,
            size,
            rev,
            crc,
            result: None,
        });
    }
    let mut script = guest_prelude();
    for c in &cases {
        let count = ping_count(c.size);
        let es = write_expect(&expect_dir, &c.name, true, count, c.size);
        script += &format!(
            "timeout {ct} rping -s -a 10.0.2.15 -p {gp} -C {count} -S {size} -v > /tmp/s.out 2> /tmp/s.err &\n\
             spid=$!\n\
             if wait_listen {gp}; then marker 'SERVER-READY {name}'; else echo 'SERVER-NOT-LISTENING {name}'; fi\n\
             wait $spid\n\
             {keep}report {name} $? /tmp/s.out {es} /tmp/s.err{restore}\n",
            gp = c.guest_port,
            size = c.size,
            name = c.name,
            // Revision 1 is expected to fail in rping (checked per case
            // below), so it must not fail the guest script as a whole.
            keep = if c.rev == 1 { "f=$fail; " } else { "" },
            restore = if c.rev == 1 { "; fail=$f" } else { "" },
        );
    }
    script += "exit $fail\n";
    let fwd: Vec<(u16, u16)> = cases.iter().map(|c| (c.host_port, c.guest_port)).collect();
    let ports: Vec<u16> = cases.iter().map(|c| c.host_port).collect();
    let cap = Capture::start(&work, &ports);
    let mut guest = Guest::boot(
        &env,
        &work,
        &script,
        &fwd,
        &[expect_dir],
        120 + cases.len() as u64 * ct,
    );
    // After a failed host client, the guest's rping server may wait for a
    // connection that never comes: give it a little while to report, then
    // stop the guest rather than wait for its timeout.
    let mut waiting: Option<(String, Instant)> = None;
    loop {
        let line = match &waiting {
            None => guest.next_line(),
            Some((name, until)) => match guest.next_line_by(*until) {
                Ok(l) => l,
                Err(()) => {
                    let e = cases
                        .iter()
                        .find(|c| &c.name == name)
                        .and_then(|c| c.result.clone())
                        .and_then(|r| r.err())
                        .unwrap_or_default();
                    guest.abort(&format!(
                        "{name}: the host client failed and the guest's rping server did not \
                         finish (guest stopped):\n  {e}"
                    ));
                }
            },
        };
        let Some(line) = line else { break };
        if waiting
            .as_ref()
            .is_some_and(|(n, _)| line.starts_with(&format!("CASE {n} ")))
        {
            waiting = None;
        }
        let Some(name) = line.trim().strip_prefix("SERVER-READY ") else {
            continue;
        };
        let Some(c) = cases.iter_mut().find(|c| c.name == name) else {
            continue;
        };
        let count = ping_count(c.size);
        let mut args: Vec<String> = [
            "rping",
            "--client",
            "--addr",
            "127.0.0.1",
            "--port",
            &c.host_port.to_string(),
            "--count",
            &count.to_string(),
            "--size",
            &c.size.to_string(),
            "--verbose",
            "--mpa-rev",
            &c.rev.to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if c.crc {
            args.push("--crc".into());
        }
        let p = HostProc::spawn(&work, &c.name, &args);
        let expect = rping_verbose_lines(false, count, c.size);
        let r = if c.rev == 1 {
            p.connected_only(Instant::now() + Duration::from_secs(ct), 1, c.crc)
        } else {
            p.finish(Instant::now() + Duration::from_secs(ct), &expect)
        };
        if r.is_err() {
            waiting = Some((c.name.clone(), Instant::now() + Duration::from_secs(15)));
        }
        c.result = Some(r);
    }
    let exit = guest.finish();
    let pcap = cap.stop();

    let gcases = guest.cases();
    let mut problems = Vec::new();
    for c in &mut cases {
        match gcases.get(&c.name) {
            Some((rc, data)) if c.rev == 2 && rc == "0" && data == "match" => {}
            // MPA revision 1 carries no IRD/ORD: siw reports IRD = ORD = 0
            // in the connect request, rping accepts with them, and its
            // first RDMA Read cannot be posted ("post send error"): rping
            // fails after receiving our first Send (docs/interop.md): either
            // the post fails (exit 255) or the Read stalls on an empty ORQ
            // until the guest's `timeout` stops rping (exit 143). Some
            // rping builds print the "post send error" and still exit 0.
            Some((rc, data))
                if c.rev == 1 && (rc == "255" || rc == "143" || rc == "0") && data == "missing" => {
            }
            other => problems.push(format!("{}: guest rping server: {other:?}", c.name)),
        }
        match c.result.take() {
            Some(Ok(())) => {}
            Some(Err(e)) => problems.push(e),
            None => problems.push(format!("{}: host client never ran", c.name)),
        }
    }
    if exit != 0 {
        problems.push(format!("GUEST-EXIT {exit}"));
    }
    if !problems.is_empty() {
        guest.fail(&format!(
            "softrdma client -> guest server:\n  {}",
            problems.join("\n  ")
        ));
    }
    let conns = analyse_capture(&pcap, &ports);
    let errs: Vec<String> = cases
        .iter()
        .filter_map(|c| {
            // Revision 1 against rping: the handshake and one Send only.
            let ops: &[u32] = if c.rev == 1 { &[3] } else { &[0, 1, 2, 3] };
            check_conn_ops(&conns, c.host_port, c.rev, c.crc, ops).err()
        })
        .collect();
    assert!(
        errs.is_empty(),
        "capture checks failed:\n  {}",
        errs.join("\n  ")
    );
}

// ---------------------------------------------------------------------------
// ucmatose (docs/cmatose-protocol.md)
// ---------------------------------------------------------------------------

/// Message sizes of the ucmatose cases: 1 byte to 1 MiB (rping's range is
/// only 23..=65535).
const CMA_SIZES: [usize; 4] = [1, 4096, 65536, 1 << 20];

/// Messages each way per ucmatose case: 4 (SOFTRDMA_SOAK=1: 32).
fn cma_count() -> usize {
    match std::env::var("SOFTRDMA_SOAK").as_deref() {
        Ok("1") => 32,
        _ => 4,
    }
}

/// Seconds one ucmatose case may take inside the guest: 1 MiB messages
/// through the emulated guest take a while.
fn cma_case_timeout_s(size: usize, count: usize) -> u64 {
    30 + (size * count) as u64 / (256 << 10)
}

/// The cases: every size with CRC off and on, named `PREFIX<size>-crc<0|1>`.
fn cma_cases(prefix: &str) -> Vec<(String, usize, bool)> {
    CMA_SIZES
        .iter()
        .flat_map(|s| [(*s, false), (*s, true)])
        .map(|(s, crc)| (format!("{prefix}{s}-crc{}", crc as u8), s, crc))
        .collect()
}

/// `softrdma cmatose` arguments for a case (the client's with `server`).
fn cma_args(server: Option<&str>, port: u16, count: usize, size: usize, crc: bool) -> Vec<String> {
    cma_args_rev(server, port, count, size, crc, 2)
}

fn cma_args_rev(
    server: Option<&str>,
    port: u16,
    count: usize,
    size: usize,
    crc: bool,
    rev: u8,
) -> Vec<String> {
    let mut a: Vec<String> = vec!["cmatose".into()];
    if let Some(s) = server {
        a.extend(["--server-addr".into(), s.into()]);
    }
    a.extend(
        [
            "--port",
            &port.to_string(),
            "--count",
            &count.to_string(),
            "--size",
            &size.to_string(),
            "--mpa-rev",
            &rev.to_string(),
            "--timeout",
            "60",
        ]
        .iter()
        .map(|s| s.to_string()),
    );
    if crc {
        a.push("--crc".into());
    }
    // ucmatose's server sends first, and siw as the initiator fails a
    // connection whose MPA reply is followed by more bytes in the same read
    // (`siw_recv_mpa_rr`: "peer sent extra data"). Our server sends at once
    // (no `--send-delay-ms`): the engine itself holds a responder's first
    // FPDU for a non-softrdma initiator until that peer's first FPDU or
    // `DeviceConfig::responder_hold` (issue 20, item 2;
    // docs/cmatose-protocol.md, "Who sends first").
    let _ = server;
    a
}

/// The capture checks of one ucmatose connection: decodes, MPA rev 2, the
/// CRC setting, Sends seen, and `count` complete Send messages each way.
fn check_cma_conn(
    conns: &BTreeMap<u16, ConnWire>,
    pcap: &Path,
    port: u16,
    crc: bool,
    count: usize,
) -> Result<(), String> {
    check_cma_conn_rev(conns, pcap, port, crc, count, 2)
}

fn check_cma_conn_rev(
    conns: &BTreeMap<u16, ConnWire>,
    pcap: &Path,
    port: u16,
    crc: bool,
    count: usize,
    rev: u32,
) -> Result<(), String> {
    check_conn_ops(conns, port, rev, crc, &[3])?;
    match send_messages(pcap, port) {
        (up, down) if up == count && down == count => Ok(()),
        (up, down) => Err(format!(
            "port {port}: {down} Send messages from the server and {up} to it, expected {count} each"
        )),
    }
}

/// Guest `ucmatose -s 10.0.2.2` (siw client) against `softrdma cmatose`
/// servers on the host: 1 byte to 1 MiB, CRC off and on (siw asks for no
/// CRC; our server's `--crc` grants it anyway and siw follows).
#[test]
fn guest_ucmatose_client_vs_softrdma_server() {
    let Some(env) = guest_env("guest_ucmatose_client_vs_softrdma_server") else {
        return;
    };
    let _serial = lock_guest();
    let work = Work::new("cma-srv");
    let count = cma_count();
    let expect_dir = work.path("expect");

    struct Case {
        name: String,
        port: u16,
        size: usize,
        crc: bool,
        proc_: Option<HostProc>,
    }
    let combos = cma_cases("s");
    let ports = free_ports(combos.len());
    let mut cases: Vec<Case> = combos
        .into_iter()
        .zip(ports)
        .map(|((name, size, crc), port)| Case {
            name,
            port,
            size,
            crc,
            proc_: None,
        })
        .collect();
    let mut script = guest_prelude();
    let mut total_ct = 0;
    for c in &mut cases {
        let args = cma_args(None, c.port, count, c.size, c.crc);
        c.proc_ = Some(HostProc::spawn(&work, &c.name, &args));
        let ec = write_cma_expect(&expect_dir, &c.name, false);
        let ct = cma_case_timeout_s(c.size, count);
        total_ct += ct;
        script += &format!(
            "marker 'CLIENT-START {name}'\n\
             t0=$(date +%s)\n\
             timeout {ct} ucmatose -s 10.0.2.2 -p {port} -C {count} -S {size} > /tmp/c.out 2> /tmp/c.err\n\
             rc=$?; echo \"TIME {name} $(( $(date +%s) - t0 )) s\"\n\
             report {name} $rc /tmp/c.out {ec} /tmp/c.err\n",
            name = c.name,
            port = c.port,
            size = c.size
        );
    }
    script += "exit $fail\n";
    // Every server listens before the guest boots.
    let deadline = Instant::now() + Duration::from_secs(30);
    for c in &mut cases {
        while !host_listening(c.port) {
            let p = c.proc_.as_mut().unwrap();
            if p.child.try_wait().unwrap().is_some() || Instant::now() > deadline {
                let e = c.proc_.take().unwrap().premature();
                panic!(
                    "softrdma cmatose server {} never listened on {}: {e}",
                    c.name, c.port
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
    let ports: Vec<u16> = cases.iter().map(|c| c.port).collect();
    let cap = Capture::start(&work, &ports);
    let mut guest = Guest::boot(&env, &work, &script, &[], &[expect_dir], 120 + total_ct);
    while let Some(line) = guest.next_line() {
        let Some(name) = line.trim().strip_prefix("CLIENT-START ") else {
            continue;
        };
        let Some(c) = cases.iter_mut().find(|c| c.name == name) else {
            continue;
        };
        if c.proc_
            .as_mut()
            .unwrap()
            .child
            .try_wait()
            .unwrap()
            .is_some()
        {
            let e = c.proc_.take().unwrap().premature();
            guest.abort(&format!(
                "softrdma cmatose server {} exited before its client started: {e}",
                c.name
            ));
        }
    }
    let exit = guest.finish();
    let pcap = cap.stop();

    let gcases = guest.cases();
    let mut problems = Vec::new();
    let end = Instant::now() + Duration::from_secs(30);
    for c in &mut cases {
        match gcases.get(&c.name) {
            Some((rc, data)) if rc == "0" && data == "match" => {}
            other => problems.push(format!("{}: guest ucmatose client: {other:?}", c.name)),
        }
        let want = [
            format!(
                "(MPA rev 2, CRC {},",
                if c.crc { "on" } else { "off" }
            ),
            format!(
                "cmatose: 1 connection(s): {count} messages of {} bytes sent and {count} echoed back, verified",
                c.size
            ),
            "disconnected".to_string(),
            "return status 0".to_string(),
        ];
        if let Err(e) = c.proc_.take().unwrap().finish_lines(end, &want) {
            problems.push(e);
        }
    }
    if exit != 0 {
        problems.push(format!("GUEST-EXIT {exit}"));
    }
    if !problems.is_empty() {
        guest.fail(&format!(
            "guest ucmatose client -> softrdma cmatose server:\n  {}",
            problems.join("\n  ")
        ));
    }
    let conns = analyse_capture(&pcap, &ports);
    let errs: Vec<String> = cases
        .iter()
        .filter_map(|c| check_cma_conn(&conns, &pcap, c.port, c.crc, count).err())
        .collect();
    assert!(
        errs.is_empty(),
        "capture checks failed:\n  {}",
        errs.join("\n  ")
    );
}

/// `softrdma cmatose --server-addr` on the host against guest
/// `ucmatose -b 10.0.2.15` (siw server) through qemu's port forwarding:
/// 1 byte to 1 MiB, CRC off and on (our client asks; siw mirrors it). The
/// guest prints `SERVER-READY NAME` once ucmatose listens; only then does
/// the host start that case's client.
#[test]
fn softrdma_client_vs_guest_ucmatose_server() {
    let Some(env) = guest_env("softrdma_client_vs_guest_ucmatose_server") else {
        return;
    };
    let _serial = lock_guest();
    let work = Work::new("cma-cli");
    let count = cma_count();
    let expect_dir = work.path("expect");

    struct Case {
        name: String,
        host_port: u16,
        guest_port: u16,
        size: usize,
        crc: bool,
        rev: u8,
        result: Option<Result<(), String>>,
    }
    // MPA revision 2 at every size, and revision 1 (no IRD/ORD exchange;
    // Sends need none) at the smallest and largest.
    let mut combos: Vec<(String, usize, bool, u8)> = cma_cases("c")
        .into_iter()
        .map(|(n, s, c)| (n, s, c, 2))
        .collect();
    for (n, s, c) in cma_cases("c") {
        if s == CMA_SIZES[0] || s == CMA_SIZES[CMA_SIZES.len() - 1] {
            combos.push((format!("{n}-rev1"), s, c, 1));
        }
    }
    let ports = free_ports(combos.len());
    let mut cases: Vec<Case> = combos
        .into_iter()
        .zip(ports)
        .enumerate()
        .map(|(i, ((name, size, crc, rev), host_port))| Case {
            name,
            host_port,
            guest_port: 7300 + i as u16,
            size,
            crc,
            rev,
            result: None,
        })
        .collect();
    let mut script = guest_prelude();
    let mut total_ct = 0;
    for c in &cases {
        let es = write_cma_expect(&expect_dir, &c.name, true);
        let ct = cma_case_timeout_s(c.size, count);
        total_ct += ct;
        script += &format!(
            "t0=$(date +%s)\n\
             timeout {ct} ucmatose -b 10.0.2.15 -p {gp} -C {count} -S {size} > /tmp/s.out 2> /tmp/s.err &\n\
             spid=$!\n\
             if wait_listen {gp}; then marker 'SERVER-READY {name}'; else echo 'SERVER-NOT-LISTENING {name}'; fi\n\
             wait $spid\n\
             rc=$?; echo \"TIME {name} $(( $(date +%s) - t0 )) s\"\n\
             report {name} $rc /tmp/s.out {es} /tmp/s.err\n",
            gp = c.guest_port,
            size = c.size,
            name = c.name
        );
    }
    script += "exit $fail\n";
    let fwd: Vec<(u16, u16)> = cases.iter().map(|c| (c.host_port, c.guest_port)).collect();
    let ports: Vec<u16> = cases.iter().map(|c| c.host_port).collect();
    let cap = Capture::start(&work, &ports);
    let mut guest = Guest::boot(&env, &work, &script, &fwd, &[expect_dir], 120 + total_ct);
    // After a failed host client the guest's ucmatose server may wait on:
    // give it a little while to report, then stop the guest.
    let mut waiting: Option<(String, Instant)> = None;
    loop {
        let line = match &waiting {
            None => guest.next_line(),
            Some((name, until)) => match guest.next_line_by(*until) {
                Ok(l) => l,
                Err(()) => {
                    let e = cases
                        .iter()
                        .find(|c| &c.name == name)
                        .and_then(|c| c.result.clone())
                        .and_then(|r| r.err())
                        .unwrap_or_default();
                    guest.abort(&format!(
                        "{name}: the host client failed and the guest's ucmatose server did \
                         not finish (guest stopped):\n  {e}"
                    ));
                }
            },
        };
        let Some(line) = line else { break };
        if waiting
            .as_ref()
            .is_some_and(|(n, _)| line.starts_with(&format!("CASE {n} ")))
        {
            waiting = None;
        }
        let Some(name) = line.trim().strip_prefix("SERVER-READY ") else {
            continue;
        };
        let Some(c) = cases.iter_mut().find(|c| c.name == name) else {
            continue;
        };
        let args = cma_args_rev(Some("127.0.0.1"), c.host_port, count, c.size, c.crc, c.rev);
        let t0 = Instant::now();
        let p = HostProc::spawn(&work, &c.name, &args);
        let want = [
            format!(
                "cmatose: connected to 127.0.0.1:{} (MPA rev {}, CRC {},",
                c.host_port,
                c.rev,
                if c.crc { "on" } else { "off" }
            ),
            format!(
                "cmatose: 1 connection(s): {count} messages of {} bytes received, {count} replies sent",
                c.size
            ),
            "disconnected".to_string(),
            "return status 0".to_string(),
        ];
        let ct = cma_case_timeout_s(c.size, count);
        let r = p.finish_lines(Instant::now() + Duration::from_secs(ct), &want);
        println!(
            "host| {}: client took {:.1} s",
            c.name,
            t0.elapsed().as_secs_f64()
        );
        if r.is_err() {
            waiting = Some((c.name.clone(), Instant::now() + Duration::from_secs(15)));
        }
        c.result = Some(r);
    }
    let exit = guest.finish();
    let pcap = cap.stop();

    let gcases = guest.cases();
    let mut problems = Vec::new();
    for c in &mut cases {
        match gcases.get(&c.name) {
            Some((rc, data)) if rc == "0" && data == "match" => {}
            other => problems.push(format!("{}: guest ucmatose server: {other:?}", c.name)),
        }
        match c.result.take() {
            Some(Ok(())) => {}
            Some(Err(e)) => problems.push(e),
            None => problems.push(format!("{}: host client never ran", c.name)),
        }
    }
    if exit != 0 {
        problems.push(format!("GUEST-EXIT {exit}"));
    }
    if !problems.is_empty() {
        guest.fail(&format!(
            "softrdma cmatose client -> guest ucmatose server:\n  {}",
            problems.join("\n  ")
        ));
    }
    let conns = analyse_capture(&pcap, &ports);
    let errs: Vec<String> = cases
        .iter()
        .filter_map(|c| {
            check_cma_conn_rev(&conns, &pcap, c.host_port, c.crc, count, c.rev as u32).err()
        })
        .collect();
    assert!(
        errs.is_empty(),
        "capture checks failed:\n  {}",
        errs.join("\n  ")
    );
}

// ---------------------------------------------------------------------------
// perftest -R against softrdma bench --server (docs/perftest-protocol.md)
// ---------------------------------------------------------------------------

/// One guest perftest client run against `softrdma bench --server`.
struct PerftestCase {
    name: &'static str,
    /// The perftest tool.
    tool: &'static str,
    /// Its title line, and the test our server's summary line names.
    title: &'static str,
    kind: &'static str,
    /// Options besides `-R -d siw0 -p PORT [-F] SERVER`.
    args: &'static str,
    /// Whether `-F` is given (every case but the CPU-hog test's): without
    /// it a client whose clock calibration fails exits 1 after its test
    /// (`Can't produce a report`), see [`check_perftest_output`].
    freq_f: bool,
    /// A command the client runs under, in the guest (`taskset -c 0`), or
    /// nothing.
    wrap: &'static str,
    size: usize,
    /// Iterations per QP, and QPs.
    iters: usize,
    qps: usize,
    /// Which of the run's servers it talks to.
    server: usize,
}

impl PerftestCase {
    /// Sends our server receives on the test QPs.
    fn sends(&self) -> usize {
        match self.kind {
            "send_bw" | "send_lat" => self.iters * self.qps,
            _ => 0,
        }
    }
    /// Answers it gives: a Send per send_lat Send, a Write per write_lat
    /// round.
    fn answers(&self) -> usize {
        match self.kind {
            "send_lat" | "write_lat" => self.iters,
            _ => 0,
        }
    }
    /// Control messages a bandwidth client sends in all
    /// (docs/perftest-protocol.md, section 3; `None`: not checked).
    fn control(&self) -> Option<usize> {
        match self.kind {
            "write_bw" | "read_bw" => Some(14 + 2 * self.qps),
            "send_bw" => Some(9 + 2 * self.qps),
            _ => None,
        }
    }
}

/// How a client's run ended, when it passed [`check_perftest_output`].
#[derive(Debug, Clone, Copy, PartialEq)]
enum PerftestEnd {
    /// It completed every exchange.
    Complete,
    /// With `-F`: it completed every exchange, but its clock calibration
    /// failed, so its result row is zeros.
    Uncalibrated,
    /// Without `-F`: its clock calibration failed, so it exited 1 after its
    /// test, before its closing exchange (perftest's own failure).
    CalibrationExit,
}

/// One `softrdma bench --server` of a perftest run.
struct PerftestServer {
    /// Options besides `bench --server --port PORT`.
    args: &'static [&'static str],
    /// MPA CRC on (the server's `--crc`; siw asks for none).
    crc: bool,
    /// RDMAP opcodes its connections must show (Send: the control
    /// messages).
    ops: &'static [u32],
}

#[allow(clippy::too_many_arguments)]
fn perftest_case(
    name: &'static str,
    (tool, title, kind): (&'static str, &'static str, &'static str),
    args: &'static str,
    size: usize,
    iters: usize,
    qps: usize,
    server: usize,
) -> PerftestCase {
    PerftestCase {
        name,
        tool,
        title,
        kind,
        args,
        freq_f: true,
        wrap: "",
        size,
        iters,
        qps,
        server,
    }
}

/// Write, Read and Send bandwidth at perftest's default size (64 KiB), the
/// smallest (2 bytes) and 1 MiB; send_bw also with a 16-deep receive window
/// (1000 messages carried by the iWARP credits) and with two QPs.
fn perftest_cases() -> Vec<PerftestCase> {
    let c = perftest_case;
    let (w, r, s) = (
        ("ib_write_bw", "RDMA_Write BW Test", "write_bw"),
        ("ib_read_bw", "RDMA_Read BW Test", "read_bw"),
        ("ib_send_bw", "Send BW Test", "send_bw"),
    );
    vec![
        c("write-64k", w, "-n 100", 65536, 100, 1, 0),
        c("write-2", w, "-s 2 -n 200", 2, 200, 1, 0),
        c("write-1m", w, "-s 1048576 -n 5", 1 << 20, 5, 1, 0),
        c("read-64k", r, "-n 100", 65536, 100, 1, 0),
        c("read-2", r, "-s 2 -n 200", 2, 200, 1, 0),
        c("read-1m", r, "-s 1048576 -n 5", 1 << 20, 5, 1, 0),
        c("send-64k", s, "-n 100", 65536, 100, 1, 0),
        c("send-2-r16", s, "-s 2 -n 1000 -r 16", 2, 1000, 1, 0),
        c(
            "send-4k-q2",
            s,
            "-s 4096 -n 300 -q 2 -r 32",
            4096,
            300,
            2,
            0,
        ),
        c("send-1m", s, "-s 1048576 -n 5", 1 << 20, 5, 1, 0),
    ]
}

/// The latency tests, each against a server told the test (perftest's
/// latency servers take part in the ping-pong): write_lat at 64 bytes and
/// at perftest's default 2 bytes with MPA CRC turned on by our server,
/// send_lat at 64 bytes and 4 KiB, read_lat at 64 bytes, and send_lat and
/// read_lat at 64 bytes with CRC on.
fn perftest_lat_servers() -> Vec<PerftestServer> {
    vec![
        PerftestServer {
            args: &["--perftest", "write_lat", "--size", "64", "--iters", "300"],
            crc: false,
            ops: &[0, 3],
        },
        PerftestServer {
            args: &["--perftest", "write_lat", "--iters", "300", "--crc"],
            crc: true,
            ops: &[0, 3],
        },
        PerftestServer {
            args: &["--perftest", "send_lat"],
            crc: false,
            ops: &[3],
        },
        PerftestServer {
            args: &["--perftest", "read_lat"],
            crc: false,
            ops: &[1, 2, 3],
        },
        PerftestServer {
            args: &["--perftest", "send_lat", "--crc"],
            crc: true,
            ops: &[3],
        },
        PerftestServer {
            args: &["--perftest", "read_lat", "--crc"],
            crc: true,
            ops: &[1, 2, 3],
        },
    ]
}

fn perftest_lat_cases() -> Vec<PerftestCase> {
    let c = perftest_case;
    let (w, s, r) = (
        ("ib_write_lat", "RDMA_Write Latency Test", "write_lat"),
        ("ib_send_lat", "Send Latency Test", "send_lat"),
        ("ib_read_lat", "RDMA_Read Latency Test", "read_lat"),
    );
    vec![
        c("write-lat-64", w, "-s 64 -n 300", 64, 300, 1, 0),
        c("write-lat-2-crc", w, "-n 300", 2, 300, 1, 1),
        c("send-lat-64", s, "-s 64 -n 300", 64, 300, 1, 2),
        c("send-lat-4k", s, "-s 4096 -n 100", 4096, 100, 1, 2),
        c("read-lat-64", r, "-s 64 -n 300", 64, 300, 1, 3),
        c("send-lat-64-crc", s, "-s 64 -n 300", 64, 300, 1, 4),
        c("read-lat-64-crc", r, "-s 64 -n 300", 64, 300, 1, 5),
    ]
}

/// What is wrong with one perftest client's run, from the guest's output:
/// its exit status, its title, and the result row under the table header
/// (size, iterations over all QPs, a non-zero average bandwidth or message
/// rate, or for the latency tests a non-zero typical and average latency).
/// Exit status 0 means every Write, Read or Send completed without error.
/// Under TCG perftest's clock calibration (`sample_get_cpu_mhz`) sometimes
/// fails, printing `Correlation coefficient r^2: ... < 0.9` on stderr; it
/// then knows no CPU frequency and, with `-F`, prints a row of zeros: only
/// then is a zero row accepted. Without `-F` it prints `Can't produce a
/// report` and exits 1 right after the table header, before its closing
/// exchange (`print_report_bw`): accepted only then, as
/// [`PerftestEnd::CalibrationExit`].
fn check_perftest_output(
    c: &PerftestCase,
    rc: Option<&str>,
    out: &[String],
    err: &[String],
) -> Result<PerftestEnd, String> {
    let calibration = err.iter().any(|l| l.contains("Correlation coefficient"));
    if !c.freq_f
        && rc == Some("1")
        && calibration
        && err.iter().any(|l| l.contains("Can't produce a report"))
        && out.iter().any(|l| l.contains(c.title))
        && out
            .last()
            .is_some_and(|l| l.contains("#bytes") && l.contains("#iterations"))
    {
        return Ok(PerftestEnd::CalibrationExit);
    }
    let mut p = Vec::new();
    if rc != Some("0") {
        p.push(format!("exit status {rc:?}"));
    }
    if !out.iter().any(|l| l.contains(c.title)) {
        p.push(format!("no `{}` title", c.title));
    }
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
        (None, _) => p.push("no result table header".into()),
        (Some(_), None) => p.push("no result row".into()),
        (Some(_), Some(f)) => {
            let want_iters = c.iters * c.qps;
            let num = |s: &str| s.parse::<f64>().unwrap_or(0.0);
            if f[0] != c.size.to_string() || f[1] != want_iters.to_string() {
                p.push(format!(
                    "result row {f:?}: expected {} bytes, {want_iters} iterations",
                    c.size
                ));
            } else if num(f[3]) <= 0.0 && num(f[4]) <= 0.0 && !calibration {
                p.push(format!("result row {f:?}: all zero"));
            }
        }
    }
    if p.is_empty() {
        Ok(if calibration {
            PerftestEnd::Uncalibrated
        } else {
            PerftestEnd::Complete
        })
    } else {
        Err(format!(
            "{} ({} {}): {}\n    --- output:\n{}    --- stderr:\n{}",
            c.name,
            c.tool,
            c.args,
            p.join("; "),
            indent(&out.join("\n")),
            indent(&err.join("\n"))
        ))
    }
}

/// The numbers of one summary line of our server:
/// `perftest: PEER: KIND client (perftest V): N test QP(s) (...), M control
/// messages (...), S Sends received (B bytes), C credit Writes, A latency
/// answers[; the client left after its Sends without its closing exchange
/// (...)], done`.
#[derive(Debug, PartialEq)]
struct PerftestSummary {
    kind: String,
    qps: usize,
    control: usize,
    sends: usize,
    send_bytes: usize,
    answers: usize,
    /// The server saw the client leave after its Sends without the
    /// closing exchange.
    left_early: bool,
}

fn parse_perftest_summary(line: &str) -> Option<PerftestSummary> {
    let rest = line.strip_prefix("perftest: ")?.strip_suffix(", done")?;
    let w: Vec<&str> = rest.split_whitespace().collect();
    let before = |word: &str| {
        w.iter()
            .position(|x| *x == word)
            .and_then(|i| i.checked_sub(1))
            .and_then(|i| w[i].trim_start_matches('(').parse::<usize>().ok())
    };
    Some(PerftestSummary {
        kind: w.get(1)?.to_string(),
        qps: before("test")?,
        control: before("control")?,
        sends: before("Sends")?,
        send_bytes: before("bytes),")?,
        answers: before("latency")?,
        left_early: rest.contains("without its closing exchange"),
    })
}

/// Runs guest perftest `-R` clients (`cases`, one after another, in one
/// guest boot) against `softrdma bench --server`s on the host (`servers`,
/// each on a port of its own) and checks: every client exits 0 and prints
/// its result row; every server prints one summary line per client naming
/// its test and counting the Sends it received and the answers it gave;
/// no server reports an error or exits; and the capture decodes, shows the
/// MPA revision, CRC and RDMAP operations each server's clients use, and
/// holds exactly the Send messages the servers counted (control messages
/// and test Sends towards a server; answers from it).
fn run_perftest(test: &str, servers: &[PerftestServer], cases: &[PerftestCase]) {
    run_perftest_with(test, servers, cases, "", 60, true);
}

/// [`run_perftest`] with extra guest shell lines run before the clients,
/// `ct` seconds for each client, and the capture and its checks only with
/// `capture`. Returns how each client ended (empty when the guest is
/// missing and allowed to be).
fn run_perftest_with(
    test: &str,
    servers: &[PerftestServer],
    cases: &[PerftestCase],
    guest_setup: &str,
    ct: u64,
    capture: bool,
) -> Vec<PerftestEnd> {
    let Some(env) = guest_env(test) else {
        return Vec::new();
    };
    let _serial = lock_guest();
    let work = Work::new("perftest");
    let ports = free_ports(servers.len());
    let mut procs = Vec::new();
    for (i, (srv, port)) in servers.iter().zip(&ports).enumerate() {
        let mut args: Vec<String> = ["bench", "--server", "--port", &port.to_string()]
            .iter()
            .map(|s| s.to_string())
            .collect();
        args.extend(srv.args.iter().map(|s| s.to_string()));
        procs.push(HostProc::spawn(&work, &format!("bench-server-{i}"), &args));
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for (i, port) in ports.iter().enumerate() {
        while !host_listening(*port) {
            if procs[i].child.try_wait().unwrap().is_some() || Instant::now() > deadline {
                panic!(
                    "softrdma bench server never listened on {port}: {}",
                    procs.remove(i).premature()
                );
            }
            thread::sleep(Duration::from_millis(20));
        }
    }
    // Against a CRC server, a client that fails posting or with an error
    // completion runs again, up to `attempts` times in all, but only when
    // the guest kernel logged a new `siw: crc error. in: X, own Y` for it.
    // The guest's siw (ib_read_bw receiving 64 KiB Read Responses with
    // CRC) misreads the CRC trailer of some FPDUs: in 8 of 24 runs of 100
    // Reads here, always 16 to 27 Reads in, and in both attempts of one CI
    // run. Its own CRC over the data (`own`) is the CRC our server put on
    // the wire, while the trailer it reports (`in`) has two of the four
    // bytes right and the others moved: siw's receive path, after QEMU's
    // slirp re-segments our 32 KiB FPDUs into 1460-byte segments, not our
    // bytes. The host checks that claim for every retry: each `own` must
    // be a CRC that tshark found (and checked good) in this server's
    // traffic. Every attempt is printed and counted (its messages are in
    // the server's summary and in the capture), and any other failure, or
    // running out of attempts, fails the test.
    let attempts: u64 = 8;
    let mut script = guest_prelude();
    script += guest_setup;
    for c in cases {
        script += &format!(
            "marker 'CLIENT-START {name}'\n\
             t0=$(date +%s)\n\
             n=1\n\
             {count}\
             timeout {ct} {wrap} {tool} -R -d siw0 -p {port} {f} {args} 10.0.2.2 > /tmp/c.out 2> /tmp/c.err\n\
             rc=$?\n\
             while [ $rc != 0 ] && [ {crc} = true ] && [ $n -lt {attempts} ] \\\n\
               && grep -q -e \"Couldn't post send\" -e \"Completion with error\" /tmp/c.err \\\n\
               && {new}; do\n\
             sed 's/^/RETRIED {name}| /' /tmp/c.err\n\
             {lines}\
             {count}\
             n=$((n + 1))\n\
             echo \"RETRY {name} ATTEMPT $n\"\n\
             timeout {ct} {wrap} {tool} -R -d siw0 -p {port} {f} {args} 10.0.2.2 > /tmp/c.out 2> /tmp/c.err\n\
             rc=$?\n\
             done\n\
             echo \"PERFTEST {name} RC $rc TIME $(( $(date +%s) - t0 )) s TIME-WAIT $(awk '$4==\"06\"' /proc/net/tcp | wc -l)\"\n\
             sed 's/^/OUT {name}| /' /tmp/c.out\n\
             sed 's/^/ERR {name}| /' /tmp/c.err\n\
             [ $rc = 0 ] || [ {f_off} = true ] || fail=1\n",
            name = c.name,
            count = SIW_CRC_COUNT,
            new = SIW_CRC_NEW,
            lines = siw_crc_lines(c.name),
            tool = c.tool,
            port = ports[c.server],
            f = if c.freq_f { "-F" } else { "" },
            wrap = c.wrap,
            f_off = !c.freq_f,
            args = c.args,
            crc = servers[c.server].crc,
        );
    }
    script += "exit $fail\n";
    let crc_cases = cases.iter().filter(|c| servers[c.server].crc).count() as u64;
    let cap = capture.then(|| Capture::start(&work, &ports));
    let mut guest = Guest::boot(
        &env,
        &work,
        &script,
        &[],
        &[],
        120 + cases.len() as u64 * ct + crc_cases * (attempts - 1) * 10,
    );
    while let Some(line) = guest.next_line() {
        if line.trim().starts_with("CLIENT-START ") {
            if let Some(i) = procs
                .iter_mut()
                .position(|p| p.child.try_wait().unwrap().is_some())
            {
                let e = procs.remove(i).premature();
                guest.abort(&format!("softrdma bench server exited: {e}"));
            }
        }
    }
    let exit = guest.finish();
    let pcap = cap.map(Capture::stop);
    let mut problems = Vec::new();
    let mut outs = Vec::new();
    for (i, p) in procs.iter_mut().enumerate() {
        // A server serves until killed; it must still be running.
        if p.child.try_wait().unwrap().is_some() {
            problems.push(format!("bench server {i} exited during the run"));
        }
        let _ = p.child.kill();
        let _ = p.child.wait();
        let out = fs::read_to_string(&p.out).unwrap_or_default();
        let err = fs::read_to_string(&p.err).unwrap_or_default();
        if err.contains("bench server:") {
            problems.push(format!("bench server {i} reported errors"));
        }
        outs.push((out, err));
    }
    let mut ends = Vec::new();
    for c in cases {
        let tag = format!("PERFTEST {} RC ", c.name);
        let rc = guest
            .log
            .iter()
            .find_map(|l| l.trim().strip_prefix(tag.as_str()))
            .and_then(|r| r.split_whitespace().next());
        let lines = |tag: &str| -> Vec<String> {
            let prefix = format!("{tag} {}| ", c.name);
            guest
                .log
                .iter()
                .filter_map(|l| l.strip_prefix(prefix.as_str()).map(str::to_string))
                .collect()
        };
        match check_perftest_output(c, rc, &lines("OUT"), &lines("ERR")) {
            Ok(end) => ends.push(end),
            Err(e) => {
                problems.push(e);
                ends.push(PerftestEnd::Complete);
            }
        }
    }
    // Per server: one summary line per client, naming its test and counting
    // its Sends and our answers.
    let mut totals = Vec::new();
    // Retries: (case, attempts that failed), and siw's CRC reports.
    let mut retried: Vec<(&PerftestCase, usize)> = Vec::new();
    let mut siw_crc_own: Vec<(usize, String, Option<u32>)> = Vec::new();
    for c in cases {
        let again = format!("RETRY {} ATTEMPT ", c.name);
        let failed = guest.log.iter().filter(|l| l.starts_with(&again)).count();
        let tag = format!("RETRIED {}| ", c.name);
        for l in guest.log.iter().filter(|l| l.starts_with(&tag)) {
            println!("host| failed attempt, ran again: {l}");
        }
        let crc_tag = format!("SIWCRC {}| ", c.name);
        let reports: Vec<&String> = guest
            .log
            .iter()
            .filter(|l| l.starts_with(&crc_tag))
            .collect();
        for l in &reports {
            println!("host| guest kernel: {l}");
            siw_crc_own.push((c.server, l.to_string(), parse_siw_crc_own(l)));
        }
        if failed > 0 {
            if reports.len() < failed {
                problems.push(format!(
                    "{}: {failed} retries but {} siw CRC reports",
                    c.name,
                    reports.len()
                ));
            }
            retried.push((c, failed));
        }
    }
    for (i, (out, _)) in outs.iter().enumerate() {
        let mut summaries: Vec<PerftestSummary> =
            out.lines().filter_map(parse_perftest_summary).collect();
        let found = summaries.len();
        let (mut control, mut sends, mut answers) = (0, 0, 0);
        for s in &summaries {
            control += s.control;
            sends += s.sends;
            if s.kind == "send_lat" {
                answers += s.answers;
            }
        }
        totals.push((control, sends, answers));
        let mine: Vec<(&PerftestCase, PerftestEnd)> = cases
            .iter()
            .zip(ends.iter().copied())
            .filter(|(c, _)| c.server == i)
            .collect();
        for (c, end) in &mine {
            // A client that exited on its own before its closing exchange
            // sent one control message fewer, and the server says so.
            let early = *end == PerftestEnd::CalibrationExit;
            let control = c.control().map(|m| m - early as usize);
            match summaries.iter().position(|s| {
                s.kind == c.kind
                    && s.qps == c.qps
                    && s.sends == c.sends()
                    && s.send_bytes == c.sends() * c.size
                    && s.answers == c.answers()
                    && control.is_none_or(|m| s.control == m)
                    && s.left_early == early
            }) {
                Some(k) => {
                    summaries.remove(k);
                }
                None => problems.push(format!(
                    "{}: no summary from server {i} for {} with {} QP(s), {} Sends of {} \
                     bytes, {} answers, {control:?} control messages{}",
                    c.name,
                    c.kind,
                    c.qps,
                    c.sends(),
                    c.size,
                    c.answers(),
                    if early {
                        " and no closing exchange"
                    } else {
                        ""
                    }
                )),
            }
        }
        // A retried client's first connection has its summary too.
        let again: usize = retried
            .iter()
            .filter(|(c, _)| c.server == i)
            .map(|(_, n)| n)
            .sum();
        if found != mine.len() + again {
            problems.push(format!(
                "server {i}: {found} summary lines for {} clients ({again} run twice)",
                mine.len()
            ));
        }
    }
    if exit != 0 {
        problems.push(format!("GUEST-EXIT {exit}"));
    }
    if !problems.is_empty() {
        let logs: Vec<String> = outs
            .iter()
            .enumerate()
            .map(|(i, (o, e))| {
                format!(
                    "  --- server {i} stdout:\n{}  --- server {i} stderr:\n{}",
                    indent(o),
                    indent(e)
                )
            })
            .collect();
        guest.fail(&format!(
            "guest perftest -R clients -> softrdma bench servers:\n  {}\n{}",
            problems.join("\n  "),
            logs.join("\n")
        ));
    }
    // The wire: decodes, MPA rev 2, CRC as the server decided, the
    // operations the clients use; every control message and test Send a
    // server counted is one complete Send message towards it, every answer
    // (control reply, send_lat answer) one from it.
    let Some(pcap) = pcap else {
        assert!(
            siw_crc_own.is_empty(),
            "siw CRC reports, and no capture to check them against"
        );
        return ends;
    };
    let conns = analyse_capture(&pcap, &ports);
    let mut errs = Vec::new();
    // A retry is allowed only where siw's own CRC over the data is one our
    // server sent (and tshark checked): siw misread the trailer, not us.
    for (server, line, own) in &siw_crc_own {
        let sent = sent_crcs(&pcap, &format!("tcp.srcport == {}", ports[*server]));
        match own {
            Some(own) if siw_own_crc_was_sent(*own, &sent) => {}
            _ => errs.push(format!(
                "server {server}: guest siw reported `{line}`, and its own CRC is none \
                 of the {} CRCs the server sent",
                sent.len()
            )),
        }
    }
    for (i, (srv, port)) in servers.iter().zip(&ports).enumerate() {
        if let Err(e) = check_conn_ops(&conns, *port, 2, srv.crc, srv.ops) {
            errs.push(e);
        }
        let (control, sends, answers) = totals[i];
        let got = send_messages(&pcap, *port);
        if got != (control + sends, control + answers) {
            errs.push(format!(
                "server {i}: Send messages (to, from) it in the capture {got:?} vs. its \
                 counts ({control} control messages, {sends} test Sends, {answers} answers)"
            ));
        }
    }
    assert!(
        errs.is_empty(),
        "capture checks failed:\n  {}",
        errs.join("\n  ")
    );
    ends
}

/// siw's own Terminates, received and decoded by the engine: our rping
/// server Reads from (CRC off) or Writes to (CRC on) the guest rping
/// client's buffer under a wrong key (`--fault`); siw answers with a
/// Terminate in its own bit layout, and the engine must decode it to what
/// siw's source sends: for the Read Request, RDMAP remote protection,
/// invalid STag (0/1/0x00); for the Write, DDP tagged buffer, invalid STag
/// (1/1/0x00). The server prints it and fails; the capture holds the
/// Terminate (opcode 7), with good CRCs where CRC is on.
#[test]
fn guest_siw_terminates_are_decoded() {
    let Some(env) = guest_env("guest_siw_terminates_are_decoded") else {
        return;
    };
    let _serial = lock_guest();
    let work = Work::new("term");
    // (name, fault, CRC, the line our server must print, RDMAP opcodes seen)
    let cases: [(&str, &str, bool, &str, &[u32]); 2] = [
        (
            "read",
            "bad-read-stag",
            false,
            "rping server: peer Terminate: layer 0 etype 0x1 ecode 0x00",
            &[1, 3, 7],
        ),
        (
            "write-crc",
            "bad-write-stag",
            true,
            "rping server: peer Terminate: layer 1 etype 0x1 ecode 0x00",
            &[0, 1, 2, 3, 7],
        ),
    ];
    const ATTEMPTS: u32 = 3;
    for attempt in 1..=ATTEMPTS {
        let ports = free_ports(cases.len());
        let mut procs = Vec::new();
        let mut script = guest_prelude();
        for ((name, fault, crc, _, _), port) in cases.iter().zip(&ports) {
            let mut args: Vec<String> = [
                "rping",
                "--server",
                "--port",
                &port.to_string(),
                "--count",
                "1",
                "--size",
                "64",
                "--timeout",
                "20",
                "--fault",
                fault,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            if *crc {
                args.push("--crc".into());
            }
            procs.push(HostProc::spawn(&work, name, &args));
            script += &format!(
                "marker 'CLIENT-START {name}'\n\
                 timeout 30 rping -c -a 10.0.2.2 -p {port} -C 1 -S 64 -v > /tmp/c.out 2> /tmp/c.err\n\
                 echo \"TERM-CASE {name} RC $?\"\n\
                 sed 's/^/OUT {name}| /' /tmp/c.out /tmp/c.err\n"
            );
        }
        script += "exit 0\n";
        let deadline = Instant::now() + Duration::from_secs(30);
        for (i, port) in ports.iter().enumerate() {
            while !host_listening(*port) {
                if procs[i].child.try_wait().unwrap().is_some() || Instant::now() > deadline {
                    panic!(
                        "rping server never listened on {port}: {}",
                        procs.remove(i).premature()
                    );
                }
                thread::sleep(Duration::from_millis(20));
            }
        }
        let cap = Capture::start(&work, &ports);
        let mut guest = Guest::boot(
            &env,
            &work,
            &script,
            &[],
            &[],
            120 + 40 * cases.len() as u64,
        );
        while guest.next_line().is_some() {}
        let exit = guest.finish();
        let pcap = cap.stop();
        let mut problems = Vec::new();
        let mut siw_silent = Vec::new();
        for (((name, _, _, want, _), p), port) in cases.iter().zip(procs.iter_mut()).zip(&ports) {
            let st = wait_deadline(&mut p.child, Instant::now() + Duration::from_secs(30));
            let out = fs::read_to_string(&p.out).unwrap_or_default();
            let err = fs::read_to_string(&p.err).unwrap_or_default();
            if st.is_none_or(|s| s.success()) {
                problems.push(format!("{name}: our server did not fail: {st:?}"));
            }
            if !out.lines().any(|l| l.starts_with(want)) {
                if out.contains("rping server: no Terminate from the peer") {
                    siw_silent.push(*port);
                }
                problems.push(format!(
                    "{name}: no `{want}` line\n    --- stdout:\n{}    --- stderr:\n{}",
                    indent(&out),
                    indent(&err)
                ));
            }
            if !guest
                .log
                .iter()
                .any(|l| l.trim().starts_with(&format!("TERM-CASE {name} RC ")))
            {
                problems.push(format!("{name}: the guest client never finished"));
            }
        }
        if exit != 0 {
            problems.push(format!("GUEST-EXIT {exit}"));
        }
        let conns = analyse_capture(&pcap, &ports);
        if !problems.is_empty() {
            // Linux siw sometimes tears the connection down without sending
            // the Terminate it owes (seen beside a CPU hog: our bad-STag Write,
            // then siw's FIN, no opcode 7 on the wire): a race in the peer, not
            // a Terminate we missed. Again, then, while the capture shows it.
            if attempt < ATTEMPTS && exit == 0 && siw_silent.len() == problems.len() {
                let no_term = siw_silent
                    .iter()
                    .all(|port| conns.get(port).is_none_or(|c| !c.opcodes.contains(&7)));
                if no_term {
                    eprintln!("attempt {attempt}: siw closed without its Terminate; again");
                    continue;
                }
            }
            guest.fail(&format!("siw Terminates:\n  {}", problems.join("\n  ")));
        }
        let errs: Vec<String> = cases
            .iter()
            .zip(&ports)
            .filter_map(|((_, _, crc, _, ops), port)| {
                check_conn_ops(&conns, *port, 2, *crc, ops).err()
            })
            .collect();
        assert!(
            errs.is_empty(),
            "capture checks failed:\n  {}",
            errs.join("\n  ")
        );
        return;
    }
}

/// Guest perftest `-R` bandwidth clients (`ib_write_bw`, `ib_read_bw`,
/// `ib_send_bw` on siw) against a `softrdma bench --server` on the host,
/// and at 64 KiB also against one that turns MPA CRC on (see
/// [`run_perftest`] for what is checked).
#[test]
fn guest_perftest_clients_vs_softrdma_bench_server() {
    let mut cases = perftest_cases();
    let c = perftest_case;
    cases.extend([
        c(
            "write-64k-crc",
            ("ib_write_bw", "RDMA_Write BW Test", "write_bw"),
            "-n 100",
            65536,
            100,
            1,
            1,
        ),
        c(
            "read-64k-crc",
            ("ib_read_bw", "RDMA_Read BW Test", "read_bw"),
            "-n 100",
            65536,
            100,
            1,
            1,
        ),
        c(
            "send-64k-crc",
            ("ib_send_bw", "Send BW Test", "send_bw"),
            "-n 100",
            65536,
            100,
            1,
            1,
        ),
    ]);
    run_perftest(
        "guest_perftest_clients_vs_softrdma_bench_server",
        &[
            PerftestServer {
                args: &[],
                crc: false,
                ops: &[0, 1, 2, 3],
            },
            PerftestServer {
                args: &["--crc"],
                crc: true,
                ops: &[0, 1, 2, 3],
            },
        ],
        &cases,
    );
}

/// Guest perftest `-R` latency clients (`ib_write_lat`, `ib_send_lat`,
/// `ib_read_lat` on siw) against `softrdma bench --server --perftest TEST`
/// servers, one with MPA CRC on: the server answers every round (a Write
/// per write_lat round, a Send per send_lat Send), as the summaries and
/// the capture show.
#[test]
fn guest_perftest_latency_clients_vs_softrdma_bench_server() {
    run_perftest(
        "guest_perftest_latency_clients_vs_softrdma_bench_server",
        &perftest_lat_servers(),
        &perftest_lat_cases(),
    );
}

/// Issue 29, finding 8: `ib_send_bw -R -s 1048576 -n 50` from the guest's
/// siw, `SOFTRDMA_PERFTEST_HOG_CLIENTS` times (default 3) against one
/// server, each client on the guest's CPU 0 beside a busy loop there (CPU 1
/// is left to the guest's siw threads and network). The clients alternate
/// between the issue's exact command (no `-F`) and the suite's (`-F`).
///
/// What happened in the issue: a client exited 1 right after its table
/// header, and the server counted 10 control messages (6 dests) instead of
/// 11 (7), with all 50 Sends received. That is perftest's own clock
/// calibration, not the exchange with us: after the test
/// `print_report_bw` calls `get_cpu_mhz`, whose `sample_get_cpu_mhz` fits
/// TSC cycles against `gettimeofday` over 200 intervals of 0.1 to 2 ms and
/// gives up below r^2 = 0.9 (`Correlation coefficient r^2: ... < 0.9`); a
/// preemption between its `rdtsc` and its `gettimeofday` (an HPET read in
/// the TCG guest, slow) is enough. Without `-F` perftest then prints
/// `Can't produce a report` and calls `exit(1)`, before its closing
/// exchange (`ctx_close_connection`). docs/perftest-protocol.md, section 7,
/// has the numbers.
///
/// Checked for every client: with `-F` it exits 0 and completes every
/// exchange (11 control messages, 7 dests, 50 Sends; a zero row only after
/// the calibration failure); without it, either that, or exactly
/// perftest's calibration exit, which our server reports as a client that
/// left after its Sends without its closing exchange (10 control messages,
/// 50 Sends). Whether a client met the calibration failure is printed
/// (`NOT EXERCISED` when none in four rounds did): it is the guest
/// scheduler's to give, and no hog made it certain.
#[test]
fn guest_perftest_send_bw_1m_under_cpu_hog() {
    let clients: usize = std::env::var("SOFTRDMA_PERFTEST_HOG_CLIENTS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    let cases: Vec<PerftestCase> = (0..clients)
        .map(|i| PerftestCase {
            freq_f: i % 2 == 1,
            wrap: "taskset -c 0",
            ..perftest_case(
                Box::leak(format!("send-1m-hog-{i}").into_boxed_str()),
                ("ib_send_bw", "Send BW Test", "send_bw"),
                "-s 1048576 -n 50",
                1 << 20,
                50,
                1,
                0,
            )
        })
        .collect();
    // The hog: a busy loop on the clients' CPU, for the whole run.
    let hog = "taskset -c 0 sh -c 'while :; do :; done' &\n";
    // The calibration failure is perftest's, at the mercy of the guest's
    // scheduler: a round of clients may meet none. Another round (another
    // guest boot) then, up to four; every client of every round is checked
    // all the same. It cannot be forced: stop 43's CI met it in none of 4
    // rounds (here: 1 client in 3 to 6), and a hog at nice -10 (more,
    // shorter slices for the clients) made it rarer (0 in 12 clients). So
    // the rounds say plainly whether it was met, and what fails the test
    // is a client that ended in any other way.
    for round in 1..=4 {
        let ends = run_perftest_with(
            "guest_perftest_send_bw_1m_under_cpu_hog",
            &[PerftestServer {
                args: &[],
                crc: false,
                ops: &[],
            }],
            &cases,
            hog,
            240,
            // 150 MiB of traffic: tshark's decoding of it would take minutes,
            // and the server's counts are what this test is about.
            false,
        );
        if ends.is_empty() {
            return; // no guest, and SOFTRDMA_NO_GUEST=1 allowed that
        }
        let count = |e: PerftestEnd| ends.iter().filter(|x| **x == e).count();
        let (exits, zeros) = (
            count(PerftestEnd::CalibrationExit),
            count(PerftestEnd::Uncalibrated),
        );
        println!(
            "host| round {round} under the CPU hog: {exits} of {} clients without -F exited on \
             perftest's clock calibration, {zeros} of {} with -F printed zeros after it; all \
             others completed",
            cases.iter().filter(|c| !c.freq_f).count(),
            cases.iter().filter(|c| c.freq_f).count(),
        );
        if exits + zeros > 0 {
            return;
        }
    }
    println!(
        "host| NOT EXERCISED: no client of 4 rounds met perftest's calibration failure under the \
         CPU hog (the case of issue 29, finding 8); all {} clients completed every exchange",
        4 * cases.len()
    );
}

/// Soak (run with `--ignored`): `ib_write_bw -R` at 1 B, 4 KiB, 64 KiB and
/// 1 MiB in a row, `SOFTRDMA_PERFTEST_ROUNDS` times (default 6), then the
/// same for `ib_read_bw` and `ib_send_bw`, all against one server: every
/// client must pass every time (issue 20 saw `-s 4096` fail in 2 of 4 such
/// sequences).
#[test]
#[ignore = "soak: several minutes in the guest; run with --ignored"]
fn guest_perftest_bandwidth_sequences_soak() {
    let rounds: usize = std::env::var("SOFTRDMA_PERFTEST_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let tools = [
        ("ib_write_bw", "RDMA_Write BW Test", "write_bw"),
        ("ib_read_bw", "RDMA_Read BW Test", "read_bw"),
        ("ib_send_bw", "Send BW Test", "send_bw"),
    ];
    let mut cases = Vec::new();
    for t in tools {
        for r in 0..rounds {
            for (size, iters) in [(1usize, 200usize), (4096, 200), (65536, 50), (1 << 20, 5)] {
                let name: &'static str = Box::leak(format!("{}-{size}-r{r}", t.2).into_boxed_str());
                let args: &'static str =
                    Box::leak(format!("-s {size} -n {iters}").into_boxed_str());
                cases.push(perftest_case(name, t, args, size, iters, 1, 0));
            }
        }
    }
    // Linux rdma_cm picks the client's local port from
    // ip_local_port_range without regard to TCP's TIME_WAIT sockets, and
    // siw binds it; a port whose earlier connection to the same server port
    // is still in TIME_WAIT on the client fails its connect with
    // EADDRNOTAVAIL. A narrow range (SOFTRDMA_GUEST_PORT_RANGE, "LOW HIGH")
    // makes that the common case instead of a rare one.
    let setup = match std::env::var("SOFTRDMA_GUEST_PORT_RANGE") {
        Ok(r) => format!("echo '{r}' > /proc/sys/net/ipv4/ip_local_port_range\n"),
        Err(_) => String::new(),
    };
    run_perftest_with(
        "guest_perftest_bandwidth_sequences_soak",
        &[PerftestServer {
            args: &[],
            crc: false,
            ops: &[0, 1, 2, 3],
        }],
        &cases,
        &setup,
        60,
        true,
    );
}

#[test]
fn siw_crc_report_parses() {
    let l = "SIWCRC read-64k-crc| crc error. in: be77978e, own 8e7797f9, op 2";
    assert_eq!(parse_siw_crc_own(l), Some(0x8e77_97f9));
    // tshark showed that FPDU's CRC as 0xf997778e: the same four bytes.
    let sent: BTreeSet<u32> = [0x03a7_76be, 0xf997_778e].into();
    assert!(siw_own_crc_was_sent(0x8e77_97f9, &sent));
    // siw's `in` (the trailer it misread) is none of ours.
    assert!(!siw_own_crc_was_sent(0xbe77_978e, &sent));
    assert_eq!(parse_siw_crc_own("SIWCRC x| crc error. in: 1234"), None);
}

#[test]
fn perftest_summary_parses() {
    let l = "perftest: 127.0.0.1:34942: send_bw client (perftest 6.06): 1 test QP(s) \
             (client IRD 0 ORD 0), 11 control messages (7 pingpong_dest), 2000 Sends \
             received (4000 bytes), 864 credit Writes, 7 latency answers, done";
    assert_eq!(
        parse_perftest_summary(l),
        Some(PerftestSummary {
            kind: "send_bw".into(),
            qps: 1,
            control: 11,
            sends: 2000,
            send_bytes: 4000,
            answers: 7,
            left_early: false,
        })
    );
    let l = "perftest: 127.0.0.1:45026: send_bw client (perftest 6.06): 1 test QP(s) \
             (client IRD 0 ORD 0), 10 control messages (6 pingpong_dest), 50 Sends received \
             (52428800 bytes), 50 credit Writes, 0 latency answers; the client left after its \
             Sends without its closing exchange (a failure on its side: see its output), done";
    let s = parse_perftest_summary(l).unwrap();
    assert_eq!((s.control, s.sends, s.left_early), (10, 50, true));
    assert_eq!(parse_perftest_summary("perftest: x: write_bw client"), None);
}

/// Builds `tests/guest/NAME.c` against rdma-core into the work directory
/// (the guest runs the binary from /opt).
fn build_guest_program(work: &Work, name: &str) -> PathBuf {
    let src = repo_root().join(format!("crates/cli/tests/guest/{name}.c"));
    let bin = work.path(name);
    let st = Command::new("cc")
        .args(["-O2", "-Wall", "-o"])
        .arg(&bin)
        .arg(&src)
        .args(["-lrdmacm", "-libverbs"])
        .status()
        .expect("run cc");
    assert!(
        st.success(),
        "building the guest's {name} failed (needs libibverbs-dev and librdmacm-dev: \
         scripts/setup.sh installs them)"
    );
    bin
}

/// One-shot advertise/close against a standard peer (docs/one-shot.md): a
/// verbs program on Linux siw in the guest (`tests/guest/oneshot_target.c`,
/// built here against rdma-core) reads the advertised STag from the start
/// of each command's payload and, for a read command, RDMA-Reads the
/// advertised SGL (one or two pieces, 1,000 bytes to 200 KiB) at address
/// 0, or for a write command (a storage read) RDMA-Writes its pattern
/// there, into registered memory or `advertise_buffers` memory; then it
/// closes with `IBV_WR_SEND_WITH_INV`, with `IBV_SEND_SOLICITED` where the
/// command asks. Each command is one `advertise` call and one completion
/// here, which must carry the STag and the reference, with the binding
/// already gone; a solicited close must fire a solicited-only CQ
/// notification. The checksum siw computed of what it read must match the
/// advertised bytes; what it wrote must be exactly in the advertised
/// pieces, nothing around them touched. The last command is cancelled
/// before siw accesses it (siw waits for a "GO" sent after the cancel):
/// siw's Write meets the dead STag, our side answers with the
/// invalid-STag Terminate, and the memory is unchanged.
#[test]
fn one_shot_against_guest_siw_target() {
    use softrdma_verbs::wire::terminate::codes;
    use softrdma_verbs::*;
    // Command flags (tests/guest/oneshot_target.c).
    const WRITE: u32 = 1;
    const SOLICITED: u32 = 2;
    const CANCELLED: u32 = 4;
    // The bytes the target writes: byte k of command i (its `wpat`).
    let wpat = |i: usize, k: usize| {
        (k as u32)
            .wrapping_mul(131)
            .wrapping_add(i as u32 * 17)
            .wrapping_add(k as u32 >> 9) as u8
    };
    let Some(env) = guest_env("one_shot_against_guest_siw_target") else {
        return;
    };
    let _serial = lock_guest();
    let work = Work::new("oneshot");
    let bin = build_guest_program(&work, "oneshot_target");
    // (length, second piece, flags, in advertise_buffers memory)
    let cases: [(usize, usize, u32, bool); 12] = [
        (4096, 0, 0, false),
        (65536, 0, 0, false),
        (1000, 0, 0, false),
        (200 << 10, 0, 0, false),
        (30 << 10, 10 << 10, 0, false),
        (4096, 4096, 0, false),
        (64 << 10, 0, WRITE, false),
        (30 << 10, 10 << 10, WRITE, false),
        (20 << 10, 5 << 10, WRITE, true),
        (8 << 10, 0, SOLICITED, false),
        (8 << 10, 2 << 10, WRITE | SOLICITED, false),
        (16 << 10, 0, WRITE | CANCELLED, false),
    ];
    let n = cases.len();
    let host_port = free_ports(1)[0];
    let guest_port = 7300;
    let script = format!(
        "{}/opt/oneshot_target 10.0.2.15 {guest_port} {n} &\n\
         tpid=$!\n\
         if wait_listen {guest_port}; then marker TARGET-READY; else echo TARGET-NOT-LISTENING; fi\n\
         wait $tpid; echo TARGET-RC $?\n",
        guest_prelude()
    );
    let mut guest = Guest::boot(
        &env,
        &work,
        &script,
        &[(host_port, guest_port)],
        &[bin],
        300,
    );
    loop {
        match guest.next_line() {
            Some(l) if l.contains("TARGET-READY") => break,
            Some(l) if l.contains("TARGET-NOT-LISTENING") => {
                guest.fail("the siw target did not listen")
            }
            Some(_) => {}
            None => guest.fail("the guest ended before the target listened"),
        }
    }
    let dev = Device::open(DeviceConfig {
        same_host: false,
        ..Default::default()
    })
    .unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(64).unwrap();
    let qp = pd.create_qp(QpInitAttr::new(&cq)).unwrap();
    let params = ConnParams {
        timeout: Duration::from_secs(60),
        ..Default::default()
    };
    // The target's "RDY!" (sent once siw has the connection set up) lands
    // here; the first command goes out after it.
    let resp = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    qp.modify(QpState::Init).unwrap();
    qp.post_recv(&RecvWr::new(999, &[resp.sge(0, 64)])).unwrap();
    qp.connect(("127.0.0.1", host_port), &params)
        .expect("connect to the guest's target");
    let rdy = cq
        .wait_one(Duration::from_secs(60))
        .unwrap_or_else(|| guest.fail("no RDY! from the siw target"));
    assert_eq!(
        (rdy.wr_id, rdy.status, rdy.byte_len),
        (999, WcStatus::Success, 4)
    );
    assert!(
        !qp.conn_params().unwrap().one_shot,
        "siw knows no extensions"
    );
    let data = pd.alloc_mr(512 << 10, Access::LOCAL_WRITE).unwrap();
    let pat: Vec<u8> = (0..512 << 10)
        .map(|i: usize| (i * 7 + i / 251) as u8)
        .collect();
    data.write_at(0, &pat);
    const RAW_FILL: u8 = 0xA5;
    let mut raw = vec![RAW_FILL; 64 << 10];
    let fnv = |b: &[u8]| {
        b.iter()
            .fold(2166136261u32, |h, &x| (h ^ x as u32).wrapping_mul(16777619))
    };
    for (i, &(len, second, flags, buffers)) in cases.iter().enumerate() {
        let write = flags & WRITE != 0;
        let cancelled = flags & CANCELLED != 0;
        if !cancelled {
            qp.post_recv(&RecvWr::new(i as u64, &[resp.sge(0, 64)]))
                .unwrap();
        }
        // The advertised pieces, as (offset, length) in `data` (or `raw`).
        let mut pieces = vec![(0usize, len)];
        if second > 0 {
            pieces.push((if buffers { 32 << 10 } else { 300 << 10 }, second));
        }
        let total = len + second;
        let mut msg = (total as u32).to_be_bytes().to_vec();
        msg.extend_from_slice(&flags.to_be_bytes());
        let access = if write {
            Access::REMOTE_WRITE
        } else {
            Access::REMOTE_READ
        };
        if flags & SOLICITED != 0 {
            cq.req_notify(true);
        }
        let stag = if buffers {
            let base = raw.as_mut_ptr();
            let bufs: Vec<(*mut u8, usize)> = pieces
                .iter()
                // SAFETY: the pieces lie inside `raw`.
                .map(|&(o, l)| (unsafe { base.add(o) }, l))
                .collect();
            // SAFETY: `raw` outlives the QP (dropped after it).
            unsafe { qp.advertise_buffers(100 + i as u64, &bufs, access, &msg, 1000 + i as u64) }
                .unwrap()
        } else {
            let sgl: Vec<Sge> = pieces.iter().map(|&(o, l)| data.sge(o, l)).collect();
            qp.advertise(100 + i as u64, &sgl, access, &msg, 1000 + i as u64)
                .unwrap()
        };
        if cancelled {
            assert!(qp.cancel_advertisement(stag), "command {i}: open");
            let wc = cq.poll_one().expect("the cancel's completion");
            assert_eq!(
                (wc.opcode, wc.status, wc.reference, wc.invalidated_rkey),
                (
                    WcOpcode::AdvertiseEnd,
                    WcStatus::Cancelled,
                    Some(1000 + i as u64),
                    Some(stag)
                ),
                "command {i}"
            );
            resp.write_at(128, b"GO");
            qp.post_send(&SendWr::send(7777, &[resp.sge(128, 2)]))
                .unwrap();
            let wc = cq
                .wait_one(Duration::from_secs(60))
                .unwrap_or_else(|| guest.fail("the GO was not sent"));
            assert_eq!((wc.wr_id, wc.status), (7777, WcStatus::Success));
            if !qp.wait_state(QpState::Error, Duration::from_secs(60)) {
                guest.fail(&format!(
                    "command {i}: siw's access after the cancel was not refused"
                ));
            }
            let ev = dev.next_event(Duration::from_secs(5));
            assert!(
                matches!(
                    ev,
                    Some(AsyncEvent::Terminated { code, by_peer: false, .. })
                        if code == codes::DDP_TAGGED_INVALID_STAG
                ),
                "command {i}: {ev:?}"
            );
            let mut now = vec![0; 512 << 10];
            data.read_at(0, &mut now);
            assert!(now == pat, "command {i}: memory changed after the cancel");
            break;
        }
        let Some(wc) = cq.wait_one(Duration::from_secs(60)) else {
            // Collect what the guest said meanwhile, then fail.
            let until = Instant::now() + Duration::from_secs(5);
            while let Ok(Some(_)) = guest.next_line_by(until) {}
            guest.fail(&format!(
                "command {i}: no close from the siw target (QP {:?})",
                qp.state()
            ))
        };
        if wc.status != WcStatus::Success {
            let ev = dev.next_event(Duration::from_secs(1));
            let until = Instant::now() + Duration::from_secs(5);
            while let Ok(Some(_)) = guest.next_line_by(until) {}
            guest.fail(&format!(
                "command {i} (STag {stag:#x}): {:?}; engine event {ev:?}",
                wc.status
            ));
        }
        assert_eq!(
            (wc.wr_id, wc.opcode),
            (i as u64, WcOpcode::Recv),
            "command {i}: advertised STag {stag:#x}"
        );
        assert_eq!(wc.invalidated_rkey, Some(stag), "command {i}");
        assert_eq!(wc.reference, Some(1000 + i as u64), "command {i}");
        assert_eq!(wc.solicited, flags & SOLICITED != 0, "command {i}");
        if flags & SOLICITED != 0 {
            assert!(
                cq.wait_event(Some(Duration::from_secs(10))),
                "command {i}: the solicited close did not fire the notification"
            );
            cq.ack_events();
        }
        assert_eq!(
            qp.open_advertisements(),
            0,
            "binding freed before the completion"
        );
        // What the advertised pieces hold now, and what they must.
        let mut got = Vec::new();
        for &(o, l) in &pieces {
            if buffers {
                got.extend_from_slice(&raw[o..o + l]);
            } else {
                let mut b = vec![0; l];
                data.read_at(o, &mut b);
                got.extend_from_slice(&b);
            }
        }
        let want: Vec<u8> = if write {
            (0..total).map(|k| wpat(i, k)).collect()
        } else {
            pieces
                .iter()
                .flat_map(|&(o, l)| pat[o..o + l].iter().copied())
                .collect()
        };
        assert!(got == want, "command {i}: the advertised bytes");
        let mut sum = [0u8; 4];
        resp.read_at(0, &mut sum);
        assert_eq!(
            u32::from_be_bytes(sum),
            fnv(&want),
            "command {i}: siw {} other bytes",
            if write { "wrote" } else { "read" }
        );
        if write {
            // Nothing around the pieces was touched; then the pieces get
            // their old bytes back for the next commands.
            for &(o, l) in &pieces {
                if buffers {
                    let mut around = raw[o.saturating_sub(4096)..o]
                        .iter()
                        .chain(&raw[o + l..(o + l + 4096).min(raw.len())]);
                    assert!(around.all(|&x| x == RAW_FILL), "command {i}");
                    raw[o..o + l].fill(RAW_FILL);
                } else {
                    let (lo, hi) = (o.saturating_sub(4096), (o + l + 4096).min(pat.len()));
                    let mut b = vec![0; hi - lo];
                    data.read_at(lo, &mut b);
                    assert!(b[..o - lo] == pat[lo..o], "command {i}: before a piece");
                    assert!(
                        b[o + l - lo..] == pat[o + l..hi],
                        "command {i}: after a piece"
                    );
                    data.write_at(o, &pat[o..o + l]);
                }
            }
        }
    }
    qp.disconnect();
    let rc = guest.finish();
    assert_eq!(rc, 0, "guest script failed");
    assert!(
        guest
            .log
            .iter()
            .any(|l| l.contains(&format!("ACCESS {}", n - 1))),
        "the target did not report its access after the cancel"
    );
    assert!(
        guest.log.iter().any(|l| l.contains(&format!("DONE {n}"))),
        "the target did not finish"
    );
    assert!(guest.log.iter().any(|l| l.contains("TARGET-RC 0")));
    drop(qp);
    drop(raw);
}

/// The bytes the guest's storage client writes at partition offset `o` in
/// its Write `k` (`pat` in tests/guest/storage_client.c).
fn storage_pat(o: u64, k: u32) -> u8 {
    (((o as u32).wrapping_mul(2_654_435_761)) >> 11) as u8 ^ (k.wrapping_mul(37)) as u8
}

/// A Linux siw client against `softrdma storage serve` (docs/storage.md):
/// `tests/guest/storage_client.c`, built here against rdma-core, connects
/// from the guest with a principal's token in its MPA private data. A wrong
/// token is refused at connect time; with the right one it reads the
/// partition list from the accept and the rest of it with Info control
/// messages (20 partitions, the accept lists 15), reads the last one, pings
/// over Send/Receive, RDMA-Writes overlapping ranges into its read-write
/// partition, flushes with a zero-length RDMA Read and with the FlushAll
/// control message, reads everything back, reads the read-only partition
/// and fails the connection by Writing to it; then Writes, flushes and
/// reads back on a relaxed-ordering connection; then, connected again,
/// waits while the host runs `storage revoke ... w`, sees partition 0
/// narrowed to read in Info (same STag), reads it and has its Write
/// refused. Afterwards the target is SIGKILLed and the store file itself
/// must hold exactly the modelled bytes (the later of two overlapping
/// strict Writes wins; the refused Writes changed nothing), and every
/// captured FPDU decodes cleanly in tshark, our Terminate included.
#[test]
fn guest_siw_client_vs_softrdma_storage_target() {
    use softrdma_storage::layout::Rights;
    use softrdma_storage::{InitOptions, PartitionSpec, Store};
    use std::os::unix::fs::FileExt;
    let Some(env) = guest_env("guest_siw_client_vs_softrdma_storage_target") else {
        return;
    };
    let _serial = lock_guest();
    let work = Work::new("storage");
    let bin = build_guest_program(&work, "storage_client");
    // Two 8 MiB partitions: the guest's principal may write 0 and read 1;
    // and 18 of 1 MiB it may read, so that it reaches 20, more than the
    // accept lists (15): the client asks for the rest with Info.
    const MIB: u64 = 1 << 20;
    const PARTS: usize = 20;
    let path = work.path("store.img");
    let spec = format!("8MiB,8MiB{}", ",1MiB".repeat(PARTS - 2));
    let mut store = Store::init(
        &path,
        &InitOptions {
            size: Some(35 * MIB),
            partitions: PartitionSpec::Layout(softrdma_storage::parse_layout(&spec).unwrap()),
            align: MIB,
            force: false,
        },
    )
    .unwrap();
    let token = store
        .grant("0", "guest", Rights::READ_WRITE)
        .unwrap()
        .expect("a new principal gets a token");
    for i in 1..PARTS {
        store.grant(&i.to_string(), "guest", Rights::READ).unwrap();
    }
    let parts: Vec<(u64, u64)> = store
        .layout()
        .partitions
        .iter()
        .map(|p| (p.offset, p.size))
        .collect();
    drop(store);
    let (p0, p1) = (parts[0], parts[1]);
    let ro_fill: Vec<u8> = (0..256 << 10).map(|o| storage_pat(o, 99)).collect();
    let f = fs::OpenOptions::new().write(true).open(&path).unwrap();
    f.write_all_at(&ro_fill, p1.0).unwrap();
    // The last partition, which only Info lists: 4 KiB the client checks.
    let last: Vec<u8> = (0..4096).map(|o| storage_pat(o, 77)).collect();
    f.write_all_at(&last, parts[PARTS - 1].0).unwrap();
    drop(f);
    let hex: String = token.iter().map(|b| format!("{b:02x}")).collect();

    let port = free_ports(1)[0];
    let args: Vec<String> = [
        "storage",
        "serve",
        path.to_str().unwrap(),
        "--port",
        &port.to_string(),
        "--direct",
        "off",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    // (Its log at info level names each admitted connection: the host
    // revokes once the client's fourth connection is up.)
    let mut server = HostProc::spawn_env(&work, "target", &args, &[("RUST_LOG", "info")]);
    let deadline = Instant::now() + Duration::from_secs(30);
    while !host_listening(port) {
        if server.child.try_wait().unwrap().is_some() || Instant::now() > deadline {
            panic!("storage target never listened: {}", server.premature());
        }
        thread::sleep(Duration::from_millis(20));
    }
    let cap = Capture::start(&work, &[port]);
    let script = format!(
        "{}timeout 240 /opt/storage_client 10.0.2.2 {port} {hex}; echo CLIENT-RC $?\n",
        guest_prelude()
    );
    let mut guest = Guest::boot(&env, &work, &script, &[], &[bin], 300);
    // Step 4: the client holds its fourth connection open (the third
    // admitted: the first had a wrong token); revoke its write right on
    // partition 0 from another process while it is connected. (Waiting
    // for the target's log, not the guest's REVOKE-READY line: under TCG
    // the guest's console output can lag its program by minutes.)
    let deadline = Instant::now() + Duration::from_secs(240);
    loop {
        let log = fs::read_to_string(&server.err).unwrap_or_default();
        let admitted = log
            .lines()
            .filter(|l| l.contains("storage connection") && !l.contains("refused"))
            .count();
        if admitted >= 3 {
            break;
        }
        if server.child.try_wait().unwrap().is_some() || Instant::now() > deadline {
            guest.fail(&format!(
                "the client's fourth connection never came: {}",
                server.premature()
            ));
        }
        thread::sleep(Duration::from_millis(50));
    }
    let revoke = Command::new(SOFTRDMA)
        .args(["storage", "revoke"])
        .arg(&path)
        .args(["0", "guest", "w"])
        .output()
        .unwrap();
    if !revoke.status.success() {
        guest.fail(&format!(
            "storage revoke: {}",
            String::from_utf8_lossy(&revoke.stderr)
        ));
    }
    let exit = guest.finish();
    let pcap = cap.stop();
    let has = |s: &str| guest.log.iter().any(|l| l.contains(s));
    for want in [
        "REJECTED",
        "LISTED 20 PARTITIONS (5 by Info)",
        "LAST-PARTITION 19 READ OK",
        "PING OK",
        "FLUSH OK",
        "FLUSHALL OK",
        "STRICT VERIFIED",
        "RO-READ OK",
        "RO-WRITE REFUSED",
        "RELAXED VERIFIED",
        "NARROWED after",
        "NARROWED-READ OK",
        "NARROWED-WRITE REFUSED",
        "DONE",
        "CLIENT-RC 0",
    ] {
        if !has(want) {
            guest.fail(&format!("the siw client did not print {want:?}"));
        }
    }
    assert_eq!(exit, 0, "guest script failed");
    if server.child.try_wait().unwrap().is_some() {
        guest.fail(&format!("the target exited: {}", server.premature()));
    }
    // SIGKILL: what the client saw flushed must be in the file.
    server.child.kill().unwrap();
    server.child.wait().unwrap();

    let file = fs::File::open(&path).unwrap();
    let read = |at: u64, n: u64| {
        let mut v = vec![0u8; n as usize];
        file.read_exact_at(&mut v, at).unwrap();
        v
    };
    // The strict Writes, applied in order (storage_client.c's W table).
    let writes: [(u64, u64); 5] = [
        (0, 4096),
        (12388, 70000),
        (MIB, (200 << 10) + 5),
        (50000, 30000),
        (p0.1 - 1000, 1000),
    ];
    let mut model = vec![0u8; p0.1 as usize];
    for (k, &(off, len)) in writes.iter().enumerate() {
        for o in off..off + len {
            model[o as usize] = storage_pat(o, k as u32);
        }
    }
    // The relaxed ones, disjoint from 3 MiB on.
    let mut off = 3 * MIB;
    for k in 0..16u32 {
        let len = 8192 + (k as u64 * 4100) % 61440;
        for o in off..off + len {
            model[o as usize] = storage_pat(o, 100 + k);
        }
        off += len;
    }
    let got = read(p0.0, p0.1);
    if let Some(i) = (0..model.len()).find(|&i| got[i] != model[i]) {
        panic!(
            "store file, partition 0 byte {i}: {:#x}, expected {:#x}",
            got[i], model[i]
        );
    }
    let mut ro = ro_fill.clone();
    ro.resize(p1.1 as usize, 0);
    assert!(
        read(p1.0, p1.1) == ro,
        "the read-only partition changed (the refused Write landed?)"
    );
    // Every frame decodes; the connections carried Writes, Read Requests
    // and Responses, Sends and our Terminate; one MPA reply was a reject.
    let conns = analyse_capture(&pcap, &[port]);
    let c = conns
        .get(&port)
        .unwrap_or_else(|| panic!("no iWARP traffic decoded on port {port}"));
    for op in [0u32, 1, 2, 3, 7] {
        assert!(
            c.opcodes.contains(&op),
            "RDMAP opcode {op} not seen (saw {:?})",
            c.opcodes
        );
    }
    assert!(c.rejected, "the wrong token's MPA reject was not seen");
}

/// Byte `i` of the guest's Read source (`pattern` in
/// tests/guest/read_source.c).
fn read_source_pat(i: u64) -> u8 {
    ((i.wrapping_mul(2_654_435_761) as u32) >> 13) as u8 ^ (i >> 9) as u8
}

/// Scattered RDMA Reads against Linux siw as the responder (issue 29): a
/// verbs program on siw in the guest (`tests/guest/read_source.c`, built
/// here against rdma-core) registers 1 MiB with remote read and sends its
/// address and rkey. Here one Read lands in six SGEs of two regions (1
/// byte to 100 KiB, out of address order), one in 32 SGEs of 64 bytes,
/// eight such Reads are outstanding at once, and the transfer planner
/// reads 4,096 64-byte pieces into scattered buffers in 128 WRs. Each
/// Read names one sink STag that the engine bound over its SGEs; siw
/// answers it like any Read. Every byte is checked, the bytes between the
/// SGEs keep a sentinel, and no binding is left afterwards.
#[test]
fn scattered_reads_from_guest_siw() {
    use softrdma_transfer::{exec, Limits, Op, Planner, Transfer};
    use softrdma_verbs::*;
    let Some(env) = guest_env("scattered_reads_from_guest_siw") else {
        return;
    };
    let _serial = lock_guest();
    let work = Work::new("readsgl");
    let bin = build_guest_program(&work, "read_source");
    let src_len = 1usize << 20;
    let host_port = free_ports(1)[0];
    let guest_port = 7310;
    let script = format!(
        "{}/opt/read_source 10.0.2.15 {guest_port} {src_len} &\n\
         spid=$!\n\
         if wait_listen {guest_port}; then marker SOURCE-READY; else echo SOURCE-NOT-LISTENING; fi\n\
         wait $spid; echo SOURCE-RC $?\n",
        guest_prelude()
    );
    let mut guest = Guest::boot(
        &env,
        &work,
        &script,
        &[(host_port, guest_port)],
        &[bin],
        300,
    );
    loop {
        match guest.next_line() {
            Some(l) if l.contains("SOURCE-READY") => break,
            Some(l) if l.contains("SOURCE-NOT-LISTENING") => {
                guest.fail("the siw Read source did not listen")
            }
            Some(_) => {}
            None => guest.fail("the guest ended before the Read source listened"),
        }
    }
    let dev = Device::open(DeviceConfig {
        same_host: false,
        ..Default::default()
    })
    .unwrap();
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4096).unwrap();
    let mut attr = QpInitAttr::new(&cq);
    attr.caps.max_send_sge = 32;
    attr.caps.max_send_wr = 1024;
    let qp = pd.create_qp(attr).unwrap();
    let params = ConnParams {
        timeout: Duration::from_secs(60),
        ..Default::default()
    };
    let msg = pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    qp.modify(QpState::Init).unwrap();
    qp.post_recv(&RecvWr::new(999, &[msg.sge(0, 64)])).unwrap();
    qp.connect(("127.0.0.1", host_port), &params)
        .expect("connect to the guest's Read source");
    let wc = cq
        .wait_one(Duration::from_secs(60))
        .unwrap_or_else(|| guest.fail("no address from the siw Read source"));
    assert_eq!(
        (wc.wr_id, wc.status, wc.byte_len),
        (999, WcStatus::Success, 16)
    );
    let mut info = [0u8; 16];
    msg.read_at(0, &mut info);
    let raddr = u64::from_be_bytes(info[..8].try_into().unwrap());
    let rkey = u32::from_be_bytes(info[8..12].try_into().unwrap());
    assert_eq!(
        u32::from_be_bytes(info[12..].try_into().unwrap()),
        src_len as u32
    );
    let n = qp.conn_params().unwrap();
    assert!(!n.one_shot && n.ord >= 8, "siw's IRD: {n:?}");

    const SENTINEL: u8 = 0xEE;
    let a = pd.alloc_mr(512 << 10, Access::LOCAL_WRITE).unwrap();
    let b = pd.alloc_mr(512 << 10, Access::LOCAL_WRITE).unwrap();
    let wait = |what: &str| {
        let wc = cq
            .wait_one(Duration::from_secs(120))
            .unwrap_or_else(|| guest.fail(&format!("{what}: no completion (QP {:?})", qp.state())));
        if wc.status != WcStatus::Success {
            let ev = dev.next_event(Duration::from_secs(1));
            guest.fail(&format!(
                "{what}: WR {} {:?}; engine event {ev:?}",
                wc.wr_id, wc.status
            ));
        }
        wc
    };
    // Checks both regions against `pieces` (region b?, offset, len) read
    // from remote offset `from`, in order; all else is the sentinel.
    let check = |pieces: &[(bool, usize, usize)], from: usize, what: &str| {
        let mut want = [vec![SENTINEL; a.len()], vec![SENTINEL; b.len()]];
        let mut at = from as u64;
        for &(in_b, off, len) in pieces {
            for k in 0..len {
                want[in_b as usize][off + k] = read_source_pat(at);
                at += 1;
            }
        }
        for (i, mr) in [&a, &b].into_iter().enumerate() {
            let got = mr.to_vec();
            if let Some(p) = got.iter().zip(&want[i]).position(|(x, y)| x != y) {
                panic!(
                    "{what}: region {i} byte {p}: got {:#x}, want {:#x}",
                    got[p], want[i][p]
                );
            }
        }
    };
    let clear = || {
        a.write_at(0, &vec![SENTINEL; a.len()]);
        b.write_at(0, &vec![SENTINEL; b.len()]);
    };
    let sgl_of = |pieces: &[(bool, usize, usize)]| -> Vec<Sge> {
        pieces
            .iter()
            .map(|&(in_b, off, len)| {
                if in_b {
                    b.sge(off, len)
                } else {
                    a.sge(off, len)
                }
            })
            .collect()
    };
    let rk = Rkey::from_raw(rkey);

    // Six SGEs of two regions, out of address order.
    let six = [
        (false, 100, 5000),
        (true, 7, 70_000),
        (false, 20_000, 1),
        (true, 80_000, 64),
        (false, 30_000, 100_000),
        (true, 90_000, 3),
    ];
    clear();
    qp.post_send(&SendWr::read_sgl(1, &sgl_of(&six), raddr + 333, rk))
        .unwrap();
    assert_eq!(wait("six SGEs").byte_len, 175_068);
    check(&six, 333, "six SGEs");

    // 32 SGEs of 64 bytes, every other 64 bytes.
    let thirty_two: Vec<(bool, usize, usize)> = (0..32).map(|i| (true, i * 128, 64)).collect();
    clear();
    qp.post_send(&SendWr::read_sgl(2, &sgl_of(&thirty_two), raddr + 4096, rk))
        .unwrap();
    wait("32 SGEs");
    check(&thirty_two, 4096, "32 SGEs");

    // Eight scattered Reads outstanding at once, each into 3 pieces of
    // its own 32 KiB of `a` and `b`, from consecutive 24 KiB of the source.
    clear();
    let mut all = Vec::new();
    let wrs: Vec<SendWr> = (0..8usize)
        .map(|i| {
            let p = [
                (false, i * 32768 + 10, 10_000),
                (true, i * 32768 + 5, 4_576),
                (false, i * 32768 + 20_000, 10_000),
            ];
            all.extend_from_slice(&p);
            let mut wr =
                SendWr::read_sgl(10 + i as u64, &sgl_of(&p), raddr + (i * 24_576) as u64, rk);
            if i < 7 {
                wr.flags = SendFlags::NONE;
            }
            wr
        })
        .collect();
    qp.post_send_batch(&wrs).unwrap();
    assert_eq!(wait("eight outstanding").wr_id, 17);
    check(&all, 0, "eight outstanding");

    // The planner: 4,096 64-byte Reads of contiguous source bytes into
    // every other 64 bytes of `a`, coalesced within the device's limits.
    clear();
    let ts: Vec<Transfer> = (0..4096usize)
        .map(|i| Transfer {
            op: Op::Read,
            local: vec![a.sge(i * 128, 64)],
            remote_addr: raddr + 64 * i as u64,
            rkey,
        })
        .collect();
    let planner = Planner::new(Limits::of_device(&dev, 16), ts);
    assert_eq!(planner.announced().0, 128, "4,096 Reads in WRs of 32 SGEs");
    let mut done = 0;
    let st = exec::run(&qp, &cq, planner, Duration::from_secs(120), |_| done += 1)
        .unwrap_or_else(|e| guest.fail(&format!("planned Reads: {e}")));
    assert_eq!((st.wrs, done), (128, 4096));
    let planned: Vec<(bool, usize, usize)> = (0..4096).map(|i| (false, i * 128, 64)).collect();
    check(&planned, 0, "planned Reads");

    assert!(
        !dev.info().mrs.iter().any(|m| m.fast_reg),
        "a Read's sink binding outlived it"
    );
    let done_msg = pd.alloc_mr(4, Access::LOCAL_WRITE).unwrap();
    done_msg.write_at(0, b"DONE");
    qp.post_send(&SendWr::send(3, &[done_msg.sge_all()]))
        .unwrap();
    wait("DONE");
    qp.disconnect();
    let rc = guest.finish();
    assert_eq!(rc, 0, "guest script failed");
    assert!(guest.log.iter().any(|l| l.contains("SERVED")));
    assert!(guest.log.iter().any(|l| l.contains("SOURCE-RC 0")));
}
