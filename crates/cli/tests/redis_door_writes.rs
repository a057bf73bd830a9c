//! Issue 32: what the RESP door's writes promise: `WAIT` counts the
//! replicas that hold them, an `MSET` is one write that readers see
//! whole, and `WATCH`/`MULTI`/`EXEC` count exactly.

use std::time::{Duration, Instant};

mod common;
use common::resp::{parse, show, Conn, V};
use common::store::{wait_for, Group};

/// `WAIT n t` counts the secondaries that hold the connection's writes:
/// 1 while the group is redundant; with the secondary gone (a primary
/// that goes on alone under `min_in_sync_replicas = 0`), 0 after waiting
/// `t` ms for one; and once a restarted secondary is in sync, `WAIT 1 0`
/// answers 1 (it waited for it).
#[test]
fn wait_counts_the_replicas_that_hold_the_writes() {
    let mut g = Group::with_options("wait", "16MiB", None, "min_in_sync_replicas = 0", true, "");
    let p = g.primary() as usize - 1;
    let mut c = Conn::new(g.resp[p]);
    c.cmd(&format!("AUTH {}", common::STORE_SECRET));
    assert_eq!(c.cmd("SET w 1"), b"+OK\r\n");
    assert_eq!(c.cmd("WAIT 1 0"), b":1\r\n");
    let before = g.epoch();
    g.nodes[1 - p].kill();
    // The primary notices and goes on alone (its writes held by it only).
    wait_for("the primary alone", Duration::from_secs(10), || {
        match c.cmd("INFO replication") {
            r if String::from_utf8_lossy(&r).contains("redundant:0") => Ok(()),
            r => Err(String::from_utf8_lossy(&r).into_owned()),
        }
    });
    assert_eq!(c.cmd("SET w 2"), b"+OK\r\n");
    let t0 = Instant::now();
    assert_eq!(c.cmd("WAIT 1 300"), b":0\r\n");
    let waited = t0.elapsed();
    assert!(
        waited >= Duration::from_millis(300),
        "WAIT returned after {waited:?}"
    );
    assert_eq!(c.cmd("WAIT 0 0"), b":0\r\n");
    // The secondary comes back and copies; WAIT 1 0 waits for it.
    let mut w = Conn::new(g.resp[p]);
    w.cmd(&format!("AUTH {}", common::STORE_SECRET));
    let waiter = std::thread::spawn(move || {
        let t0 = Instant::now();
        (w.cmd("WAIT 1 0"), t0.elapsed())
    });
    g.nodes[1 - p].start("secondary");
    g.wait_redundant(Duration::from_secs(30), before);
    let (r, took) = waiter.join().unwrap();
    assert_eq!(r, b":1\r\n");
    eprintln!("WAIT 1 300 alone took {waited:?}; WAIT 1 0 returned after {took:?}");
}

/// Issue 32: `MSET` is one replicated write that readers see whole, as
/// Redis promises ("not possible for clients to see that some of the keys
/// were updated while others are unchanged"). A writer sets `a` and `b` to
/// the same rising number with `MSET` while three readers on the primary
/// read both: `MGET` (a snapshot: `a == b`), `GET a` then `GET b` (`b` is
/// never behind `a`) and a transaction (`MULTI`, `GET`, `GET`, `EXEC`:
/// `a == b`). The primary writes a batch's objects into its arena one
/// after another; without the door's look-ups waiting out a batch being
/// written (`Exposures`) the `MGET` reader sees `a` behind `b` at once,
/// and keys set one after the other (as the door did before batches) fail
/// the transaction too. `MSETNX` on the same keys never sets them (they
/// exist), and a key of its own is set with them or not at all.
#[test]
fn mset_is_one_write_that_readers_see_whole() {
    let mut g = Group::with_resp("msetwhole", "16MiB");
    let p = g.primary() as usize - 1;
    let auth = format!("AUTH {}", common::STORE_SECRET);
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let readers: Vec<_> = ["MGET", "GET", "MULTI"]
        .into_iter()
        .map(|how| {
            let (port, stop, auth) = (g.resp[p], stop.clone(), auth.clone());
            std::thread::spawn(move || {
                let mut c = Conn::new(port);
                c.cmd(&auth);
                let num = |v: &V| match v {
                    V::Bulk(b) => String::from_utf8_lossy(b).parse::<u64>().unwrap(),
                    _ => 0,
                };
                let one = |r: Vec<u8>| match parse(&r) {
                    Some((v, _)) => num(&v),
                    None => panic!("GET answered {}", show(&r)),
                };
                let (mut reads, mut moving) = (0u64, 0u64);
                let mut last = 0;
                while !stop.load(std::sync::atomic::Ordering::Acquire) {
                    let (a, b) = match how {
                        "GET" => {
                            let a = one(c.call(&[b"GET", b"{m}a"]));
                            (a, one(c.call(&[b"GET", b"{m}b"])))
                        }
                        _ => {
                            let r = if how == "MGET" {
                                c.call(&[b"MGET", b"{m}a", b"{m}b"])
                            } else {
                                assert_eq!(c.cmd("MULTI"), b"+OK\r\n");
                                assert_eq!(c.cmd("GET {m}a"), b"+QUEUED\r\n");
                                assert_eq!(c.cmd("GET {m}b"), b"+QUEUED\r\n");
                                c.cmd("EXEC")
                            };
                            let Some((V::Array(v), _)) = parse(&r) else {
                                panic!("{how} answered {}", show(&r))
                            };
                            let (a, b) = (num(&v[0]), num(&v[1]));
                            assert_eq!(a, b, "{how} saw a part of an MSET");
                            (a, b)
                        }
                    };
                    assert!(
                        a <= b,
                        "{how}: read a = {a} and then b = {b}: a part of an MSET"
                    );
                    reads += 1;
                    moving += (a != last) as u64;
                    last = a;
                }
                (how, reads, moving)
            })
        })
        .collect();
    let mut w = Conn::new(g.resp[p]);
    w.cmd(&auth);
    let t0 = Instant::now();
    let mut n = 0u64;
    while t0.elapsed() < Duration::from_secs(3) {
        n += 1;
        let v = n.to_string();
        let r = w.call(&[b"MSET", b"{m}a", v.as_bytes(), b"{m}b", v.as_bytes()]);
        assert_eq!(r, b"+OK\r\n");
        let r = w.call(&[b"MSETNX", b"{m}own", v.as_bytes(), b"{m}a", b"x"]);
        assert_eq!(r, b":0\r\n");
    }
    stop.store(true, std::sync::atomic::Ordering::Release);
    for (i, r) in readers.into_iter().enumerate() {
        let (how, reads, moving) = r.join().unwrap();
        eprintln!("reader {i} ({how}): {reads} reads beside {n} MSETs, {moving} saw a new value");
        assert!(
            reads > 100 && moving > 10,
            "reader {i} ({how}): {reads} reads, {moving} new values"
        );
    }
    assert_eq!(w.call(&[b"EXISTS", b"{m}own"]), b":0\r\n");
    let v = n.to_string();
    let r = w.call(&[b"MGET", b"{m}a", b"{m}b"]);
    assert_eq!(
        parse(&r).unwrap().0,
        V::Array(vec![
            V::Bulk(v.clone().into_bytes()),
            V::Bulk(v.into_bytes())
        ])
    );
}

/// Issue 32: `WATCH`, `MULTI` and `EXEC` as the optimistic counter of
/// Redis's documentation uses them: four clients, on both nodes, each
/// adding 1 fifty times by `WATCH k`, `GET k`, `MULTI`, `SET k n+1`,
/// `EXEC`, again while `EXEC` answers a null array. The count is exact
/// (a lost update would leave it short), and some `EXEC`s did abort (the
/// clients raced). Another client's write between `WATCH` and `EXEC`
/// aborts it; `DISCARD` and a finished `EXEC` forget the watched keys.
#[test]
fn watch_multi_exec_count_exactly() {
    let mut g = Group::with_resp("watchexec", "16MiB");
    let p = g.primary() as usize - 1;
    let auth = format!("AUTH {}", common::STORE_SECRET);
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let (port, auth) = (g.resp[p], auth.clone());
            std::thread::spawn(move || {
                let mut c = Conn::new(port);
                c.cmd(&auth);
                let mut aborts = 0u64;
                for _ in 0..50 {
                    loop {
                        assert_eq!(c.cmd("WATCH {c}n"), b"+OK\r\n");
                        let r = c.cmd("GET {c}n");
                        let n = match parse(&r) {
                            Some((V::Bulk(b), _)) => String::from_utf8_lossy(&b).parse().unwrap(),
                            _ => 0u64,
                        };
                        assert_eq!(c.cmd("MULTI"), b"+OK\r\n");
                        assert_eq!(c.cmd(&format!("SET {{c}}n {}", n + 1)), b"+QUEUED\r\n");
                        match c.cmd("EXEC") {
                            r if r == b"*1\r\n+OK\r\n" => break,
                            r if r == b"*-1\r\n" => aborts += 1,
                            r => panic!("EXEC answered {}", show(&r)),
                        }
                    }
                }
                aborts
            })
        })
        .collect();
    let aborts: u64 = clients.into_iter().map(|t| t.join().unwrap()).sum();
    let mut a = Conn::new(g.resp[p]);
    let mut b = Conn::new(g.resp[p]);
    a.cmd(&auth);
    b.cmd(&auth);
    assert_eq!(a.cmd("GET {c}n"), b"$3\r\n200\r\n");
    eprintln!("200 increments by 4 clients; {aborts} EXECs aborted by a race");
    assert!(aborts > 0, "the clients never raced: nothing was tested");
    // Another client's write between WATCH and EXEC aborts it.
    assert_eq!(a.cmd("WATCH {c}n {c}m"), b"+OK\r\n");
    assert_eq!(b.cmd("SET {c}m 1"), b"+OK\r\n");
    assert_eq!(a.cmd("MULTI"), b"+OK\r\n");
    assert_eq!(a.cmd("INCR {c}n"), b"+QUEUED\r\n");
    assert_eq!(a.cmd("EXEC"), b"*-1\r\n");
    assert_eq!(a.cmd("GET {c}n"), b"$3\r\n200\r\n");
    // A finished EXEC forgot them: the next runs.
    assert_eq!(b.cmd("SET {c}m 2"), b"+OK\r\n");
    assert_eq!(a.cmd("MULTI"), b"+OK\r\n");
    assert_eq!(a.cmd("INCR {c}n"), b"+QUEUED\r\n");
    assert_eq!(a.cmd("EXEC"), b"*1\r\n:201\r\n");
    // So does DISCARD.
    assert_eq!(a.cmd("WATCH {c}m"), b"+OK\r\n");
    assert_eq!(a.cmd("MULTI"), b"+OK\r\n");
    assert_eq!(a.cmd("DISCARD"), b"+OK\r\n");
    assert_eq!(b.cmd("SET {c}m 3"), b"+OK\r\n");
    assert_eq!(a.cmd("MULTI"), b"+OK\r\n");
    assert_eq!(a.cmd("INCR {c}n"), b"+QUEUED\r\n");
    assert_eq!(a.cmd("EXEC"), b"*1\r\n:202\r\n");
}
