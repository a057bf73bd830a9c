//! Issue 32: the RESP door's I/O is one event loop, as Redis's is, with
//! workers for the commands that wait. What that must keep: replies in
//! the order of the requests whatever path each takes, a command that
//! waits holding up no other connection, and a connection costing no
//! thread of its own.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::time::Duration;

mod common;
use common::resp::{parse, show, Conn};
use common::store::{wait_for, Group};

fn encode(args: &[String]) -> Vec<u8> {
    let mut b = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        b.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    b
}

/// Sends every command of `cmds` in one write and reads the replies.
fn pipeline(port: u16, cmds: &[Vec<String>]) -> Vec<Vec<u8>> {
    let mut c = Conn::new(port);
    let auth = c.cmd(&format!("AUTH {}", common::STORE_SECRET));
    assert_eq!(auth, b"+OK\r\n");
    let mut all = Vec::new();
    for cmd in cmds {
        all.extend(encode(cmd));
    }
    c.s.write_all(&all).unwrap();
    cmds.iter().map(|_| c.read_reply()).collect()
}

/// A Redis of the test's own.
struct Redis(std::process::Child, u16);

impl Drop for Redis {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn redis() -> Redis {
    common::require_tool("redis-server");
    let port = common::free_ports(1)[0];
    let child = std::process::Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .args(["--requirepass", common::STORE_SECRET])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("redis-server (Debian redis-server)");
    wait_for("redis-server up", Duration::from_secs(20), || {
        TcpStream::connect(("127.0.0.1", port))
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    Redis(child, port)
}

/// A pipeline that mixes what the loop runs (GET, SET, MSET, INCR, PING) with
/// what workers run (transactions, MGET, APPEND, EXPIRE/TTL, DEL,
/// WAIT) is answered in order, byte for byte as Redis answers it.
#[test]
fn a_pipeline_mixing_loop_and_worker_commands_answers_in_order_as_redis_does() {
    let mut g = Group::with_resp("doorpipe", "64MiB");
    let r = redis();
    let mut cmds: Vec<Vec<String>> = Vec::new();
    let c = |s: &str| -> Vec<String> { s.split(' ').map(String::from).collect() };
    for i in 0..300 {
        let k = format!("p:{}", i % 7);
        let n = format!("n:{}", i % 5);
        match i % 12 {
            0 => cmds.push(c(&format!("SET {k} v{i}"))),
            1 => cmds.push(c(&format!("GET {k}"))),
            2 => cmds.push(c(&format!("INCR {n}"))),
            3 => cmds.push(c(&format!("APPEND {k} x{i}"))),
            4 => {
                cmds.push(c("MULTI"));
                cmds.push(c(&format!("INCRBY {n} {i}")));
                cmds.push(c(&format!("GET {k}")));
                cmds.push(c("EXEC"));
            }
            5 => cmds.push(c(&format!("MSET {k} m{i} p:x {i}"))),
            6 => cmds.push(c(&format!("MGET {k} p:x p:none {n}"))),
            7 => cmds.push(c(&format!("EXPIRE {k} 1000"))),
            8 => cmds.push(c(&format!("TTL {k}"))),
            9 => cmds.push(c("PING")),
            10 => cmds.push(c(&format!("DEL {k} p:none"))),
            _ => cmds.push(c(&format!("SET {k} s{i} XX GET"))),
        }
    }
    let from_redis = pipeline(r.1, &cmds);
    let primary = g.primary() as usize - 1;
    let from_store = pipeline(g.resp[primary], &cmds);
    for (i, (a, b)) in from_redis.iter().zip(&from_store).enumerate() {
        assert_eq!(
            show(a),
            show(b),
            "reply {i} to {:?} differs (redis, store)",
            cmds[i]
        );
    }
}

/// A `WAIT` that waits (for a second replica the group does not have)
/// holds up neither the loop nor any other connection: another client's
/// reads and writes are answered while it waits.
#[test]
fn a_waiting_command_holds_up_no_other_connection() {
    let mut g = Group::with_resp("doorwait", "64MiB");
    let primary = g.primary() as usize - 1;
    let port = g.resp[primary];
    let mut waiting = Conn::new(port);
    waiting.cmd(&format!("AUTH {}", common::STORE_SECRET));
    waiting
        .s
        .write_all(&encode(&["WAIT".into(), "2".into(), "3000".into()]))
        .unwrap();
    let mut other = Conn::new(port);
    other.cmd(&format!("AUTH {}", common::STORE_SECRET));
    for i in 0..200 {
        assert_eq!(other.cmd(&format!("SET w{} {i}", i % 10)), b"+OK\r\n");
        assert_eq!(
            other.cmd(&format!("GET w{}", i % 10)),
            format!("${}\r\n{i}\r\n", i.to_string().len()).as_bytes()
        );
        assert_eq!(other.cmd("INCR c"), format!(":{}\r\n", i + 1).as_bytes());
    }
    // All of that while the WAIT still waits (3 s).
    waiting.s.set_nonblocking(true).unwrap();
    let mut b = [0u8; 64];
    match waiting.s.read(&mut b) {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        r => panic!("WAIT answered before the other client's 600 commands: {r:?}"),
    }
    waiting.s.set_nonblocking(false).unwrap();
    assert_eq!(waiting.read_reply(), b":1\r\n");
}

/// Threads of process `pid`.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .count()
}

/// Connections are the loop's, not a thread's each: 300 open connections
/// (each has run commands of both kinds) add a handful of threads.
#[test]
fn connections_cost_no_thread_each() {
    let mut g = Group::with_resp("doorthreads", "64MiB");
    let p = g.primary() as usize - 1;
    let pid = g.nodes[p].pid();
    let port = g.resp[p];
    let before = threads(pid);
    let mut conns: Vec<Conn> = (0..300).map(|_| Conn::new(port)).collect();
    for (i, c) in conns.iter_mut().enumerate() {
        assert_eq!(c.cmd(&format!("AUTH {}", common::STORE_SECRET)), b"+OK\r\n");
        assert_eq!(c.cmd(&format!("SET t{i} {i}")), b"+OK\r\n");
        // A worker's command.
        assert_eq!(
            c.cmd(&format!("STRLEN t{i}")),
            format!(":{}\r\n", i.to_string().len()).as_bytes()
        );
    }
    let during = threads(pid);
    eprintln!("{before} threads before, {during} with 300 connections open");
    assert!(
        during < before + 32,
        "{before} threads before, {during} with 300 connections open"
    );
    // All still served.
    for (i, c) in conns.iter_mut().enumerate() {
        let r = c.cmd(&format!("GET t{i}"));
        assert_eq!(parse(&r).map(|(_, n)| n), Some(r.len()));
        assert_eq!(r, format!("${}\r\n{i}\r\n", i.to_string().len()).as_bytes());
    }
}

/// A large value is written from the loop's read buffer straight to the
/// socket; what the socket does not take at once is queued, and the
/// replies pipelined behind it still come after it, whole.
#[test]
fn pipelined_replies_follow_a_large_value_written_straight_out() {
    let mut g = Group::with_resp("doorbig", "64MiB");
    let primary = g.primary() as usize - 1;
    let big: String = (0..(4 << 20))
        .map(|i| (b'a' + (i % 26) as u8) as char)
        .collect();
    let c = |s: &str| -> Vec<String> { s.split(' ').map(String::from).collect() };
    let mut cmds = vec![vec!["SET".to_string(), "big".into(), big.clone()]];
    for i in 0..3 {
        cmds.push(c("GET big"));
        cmds.push(c(&format!("INCR n{i}")));
        cmds.push(c("PING"));
    }
    let replies = pipeline(g.resp[primary], &cmds);
    let bulk = format!("${}\r\n{big}\r\n", big.len()).into_bytes();
    assert_eq!(replies[0], b"+OK\r\n");
    for i in 0..3 {
        assert!(
            replies[1 + 3 * i] == bulk,
            "GET {i}: {} bytes",
            replies[1 + 3 * i].len()
        );
        assert_eq!(replies[2 + 3 * i], b":1\r\n");
        assert_eq!(replies[3 + 3 * i], b"+PONG\r\n");
    }
}

/// A large value's bytes are read straight into its argument (the
/// decoder's room for a bulk of 64 KiB or more): one that arrives in
/// small pieces, with the next request right behind its last piece, is
/// stored whole and answered in order; one whose CRLF is missing is a
/// protocol error that ends its connection, as before.
#[test]
fn a_large_value_arriving_in_pieces_is_stored_whole() {
    let mut g = Group::with_resp("doorpieces", "64MiB");
    let primary = g.primary() as usize - 1;
    let port = g.resp[primary];
    let value: Vec<u8> = (0..(1usize << 20) + 12345)
        .map(|i| (i % 253) as u8)
        .collect();
    let mut req = format!("*3\r\n$3\r\nSET\r\n$5\r\npiece\r\n${}\r\n", value.len()).into_bytes();
    req.extend_from_slice(&value);
    req.extend_from_slice(b"\r\n*1\r\n$4\r\nPING\r\n");
    let mut c = Conn::new(port);
    assert_eq!(c.cmd(&format!("AUTH {}", common::STORE_SECRET)), b"+OK\r\n");
    for piece in req.chunks(7919) {
        c.s.write_all(piece).unwrap();
    }
    assert_eq!(c.read_reply(), b"+OK\r\n");
    assert_eq!(c.read_reply(), b"+PONG\r\n");
    let got = c.call(&[b"GET", b"piece"]);
    let mut want = format!("${}\r\n", value.len()).into_bytes();
    want.extend_from_slice(&value);
    want.extend_from_slice(b"\r\n");
    assert!(got == want, "GET: {} bytes", got.len());
    // Its CRLF replaced: the protocol error, then the end.
    let mut bad = req[..req.len() - 14].to_vec();
    let n = bad.len();
    bad[n - 2..].copy_from_slice(b"xx");
    let mut c = Conn::new(port);
    assert_eq!(c.cmd(&format!("AUTH {}", common::STORE_SECRET)), b"+OK\r\n");
    c.s.write_all(&bad).unwrap();
    let reply = c.read_reply();
    assert!(
        reply.starts_with(b"-ERR Protocol error"),
        "{}",
        show(&reply)
    );
    let mut rest = Vec::new();
    c.s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    assert_eq!(c.s.read_to_end(&mut rest).map(|_| rest.len()).ok(), Some(0));
}

/// A large value is sent from the arena itself, pinned while it is sent:
/// a writer overwriting the same key (in place, and moved to a larger
/// allocation) meanwhile waits for the pin, so every value a `GET` returns
/// is one that was written, whole.
#[test]
fn large_values_sent_from_the_arena_are_whole_while_overwritten() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut g = Group::with_resp("doorpin", "64MiB");
    let primary = g.primary() as usize - 1;
    let port = g.resp[primary];
    let sizes = [256 << 10, 200 << 10, 600 << 10];
    let value = |i: usize| vec![b'a' + (i % 26) as u8; sizes[i % sizes.len()]];
    let mut w = Conn::new(port);
    assert_eq!(w.cmd(&format!("AUTH {}", common::STORE_SECRET)), b"+OK\r\n");
    assert_eq!(w.call(&[b"SET", b"big", &value(0)]), b"+OK\r\n");
    let done = AtomicBool::new(false);
    let gets = std::thread::scope(|s| {
        let reader = s.spawn(|| {
            let mut r = Conn::new(port);
            assert_eq!(r.cmd(&format!("AUTH {}", common::STORE_SECRET)), b"+OK\r\n");
            let mut gets = 0;
            while !done.load(Ordering::Acquire) || gets < 50 {
                let reply = r.call(&[b"GET", b"big"]);
                let head = reply
                    .iter()
                    .position(|&b| b == b'\r')
                    .expect("a bulk string");
                let len: usize = std::str::from_utf8(&reply[1..head])
                    .unwrap()
                    .parse()
                    .unwrap();
                let body = &reply[head + 2..reply.len() - 2];
                assert!(
                    sizes.contains(&len) && body.len() == len,
                    "GET {gets}: {len} bytes"
                );
                assert!(
                    body.iter().all(|&b| b == body[0]),
                    "GET {gets}: a value no one wrote (torn)"
                );
                gets += 1;
            }
            gets
        });
        for i in 1..600 {
            assert_eq!(w.call(&[b"SET", b"big", &value(i)]), b"+OK\r\n", "SET {i}");
        }
        done.store(true, Ordering::Release);
        reader.join().unwrap()
    });
    assert!(gets >= 50);
}

/// A client that sends its requests and closes its side at once (as
/// `nc`, or a script piping commands, does) gets every reply and then the
/// end of the stream: the end of its input may arrive with the last
/// request, in the same read, and raises no event of its own.
#[test]
fn a_client_that_half_closes_gets_its_replies_and_the_end() {
    let mut g = Group::with_resp("doorhalf", "64MiB");
    let primary = g.primary() as usize - 1;
    let port = g.resp[primary];
    let req = format!(
        "AUTH {}\r\nSET h v\r\nGET h\r\nPING\r\n",
        common::STORE_SECRET
    );
    for i in 0..300 {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        s.write_all(req.as_bytes()).unwrap();
        s.shutdown(std::net::Shutdown::Write).unwrap();
        let mut r = Vec::new();
        if let Err(e) = s.read_to_end(&mut r) {
            panic!(
                "connection {i}: no end of stream ({e}) after {:?}",
                show(&r)
            );
        }
        assert_eq!(r, b"+OK\r\n+OK\r\n$1\r\nv\r\n+PONG\r\n", "connection {i}");
    }
}
