//! Tests of [`super`] (the embedded coordinator), apart so that the
//! source file stays small.

use super::*;

fn m(node: u32, incarnation: u64) -> Member {
    Member { node, incarnation }
}

#[test]
fn two_clients_share_one_embedded_coordinator() {
    let server = EmbeddedServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
    let a = EmbeddedClient::new(server.addr());
    let b = EmbeddedClient::new(server.addr());
    let (ma, mb) = (m(1, 11), m(2, 22));
    let ttl = Duration::from_millis(300);
    assert_eq!(a.get("g").unwrap(), None);
    let Campaign::Won { epoch, .. } = a.campaign("g", ma, ttl).unwrap() else {
        panic!("first campaign must win")
    };
    let Campaign::Lost { record: Some(r) } = b.campaign("g", mb, ttl).unwrap() else {
        panic!("second campaign must lose")
    };
    assert_eq!((r.epoch, r.primary, r.lease_held), (epoch, ma, true));
    assert!(a.keep_alive("g", ma, epoch).unwrap());
    let e2 = a.set_in_sync("g", ma, epoch, Some(mb)).unwrap().unwrap();
    assert!(e2 > epoch);
    assert_eq!(a.set_in_sync("g", ma, epoch, None).unwrap(), None);
    assert_eq!(b.get("g").unwrap().unwrap().in_sync, Some(mb));
    // Resigning frees the lease at once: the in-sync member takes over
    // under a newer epoch, and the old primary is fenced.
    a.resign("g", ma, e2).unwrap();
    let Campaign::Won { epoch: e3, .. } = b.campaign("g", mb, ttl).unwrap() else {
        panic!("in-sync secondary must win after resign")
    };
    assert!(e3 > e2);
    assert!(!a.keep_alive("g", ma, e2).unwrap());
    // The operator's calls (issue 33) over the wire: refused while b
    // serves; after b resigns, a promotion names a, a reset retires it.
    let Override::LeaseHeld { record } = a.promote("g", ma).unwrap() else {
        panic!("promote under a live lease")
    };
    assert_eq!((record.epoch, record.primary), (e3, mb));
    assert!(!a.reset("g").unwrap().is_done());
    b.resign("g", mb, e3).unwrap();
    let Override::Done { record: Some(r) } = a.promote("g", ma).unwrap() else {
        panic!("promote without a lease")
    };
    assert!(r.epoch > e3 && r.primary == ma && r.in_sync.is_none() && !r.lease_held);
    assert_eq!(a.reset("g").unwrap(), Override::Done { record: Some(r) });
    assert_eq!(
        a.campaign("g", ma, ttl).unwrap(),
        Campaign::Lost { record: None }
    );
    assert_eq!(a.promote("g", ma).unwrap(), Override::Retired);
    assert_eq!(b.reset("g").unwrap(), Override::Done { record: None });
    // Malformed input is answered with an error, not a hang.
    assert!(matches!(a.get("bad group"), Err(CoordError::Protocol(_))));
    assert!(answer(&Mutex::new(LeaseTable::new()), 0, b"FOO").starts_with("ERR"));
    assert!(answer(&Mutex::new(LeaseTable::new()), 0, b"KEEPALIVE g x 1").starts_with("ERR"));
}

/// Issue 29, finding 10: one line from anyone who reaches the port
/// panicked the handler inside the table's lock, and every later
/// request panicked on the poisoned lock: the coordinator was dead.
#[test]
fn a_hostile_line_gets_an_error_and_the_coordinator_lives_on() {
    let server = EmbeddedServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
    let a = EmbeddedClient::new(server.addr());
    let Campaign::Won { epoch, .. } = a.campaign("g", m(1, 5), Duration::from_secs(5)).unwrap()
    else {
        panic!("first campaign must win")
    };
    // The primary named as its own secondary, as a raw line.
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut line = String::new();
    r.read_line(&mut line).unwrap();
    assert_eq!(line, "WELCOME\n");
    s.write_all(format!("SETINSYNC g 1:5 {epoch} 1:6\n").as_bytes())
        .unwrap();
    line.clear();
    r.read_line(&mut line).unwrap();
    assert!(line.starts_with("ERR "), "answered {line:?}");
    // The table is intact and served to everyone else.
    let b = EmbeddedClient::new(server.addr());
    let r = b.get("g").unwrap().expect("the record");
    assert_eq!((r.epoch, r.primary, r.in_sync), (epoch, m(1, 5), None));
    assert!(a.keep_alive("g", m(1, 5), epoch).unwrap());
}

/// Issue 29, findings 1 and 10: a coordinator with the group's
/// secret serves only clients that prove it, and proves itself.
#[test]
fn only_holders_of_the_secret_talk_to_a_coordinator_with_one() {
    let secret = Secret::new(b"group secret");
    let server =
        EmbeddedServer::start_with("127.0.0.1:0".parse().unwrap(), Some(secret.clone())).unwrap();
    let good = EmbeddedClient::with_secret(server.addr(), Some(secret.clone()));
    assert_eq!(good.get("g").unwrap(), None);
    let wrong = EmbeddedClient::with_secret(server.addr(), Some(Secret::new(b"guess")));
    let e = wrong.get("g").unwrap_err().to_string();
    assert!(e.contains("authentication refused"), "{e}");
    let none = EmbeddedClient::new(server.addr());
    let e = none
        .campaign("g", m(1, 1), Duration::from_secs(1))
        .unwrap_err();
    assert!(e.to_string().contains("requires the group's secret"), "{e}");
    // A raw request without the handshake changes nothing.
    let mut s = TcpStream::connect(server.addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut r = BufReader::new(s.try_clone().unwrap());
    let mut greeting = String::new();
    r.read_line(&mut greeting).unwrap();
    assert!(greeting.starts_with("CHALLENGE "), "{greeting:?}");
    s.write_all(b"CAMPAIGN g 1:1 1000000\n").unwrap();
    let mut ans = String::new();
    r.read_line(&mut ans).unwrap();
    assert!(ans.starts_with("ERR authentication failed"), "{ans:?}");
    assert_eq!(good.get("g").unwrap(), None, "no record was made");
    // A server without the secret is refused by a client with one.
    let open = EmbeddedServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
    let e = EmbeddedClient::with_secret(open.addr(), Some(secret))
        .get("g")
        .unwrap_err();
    assert!(e.to_string().contains("did not authenticate itself"), "{e}");
}

#[test]
fn lease_expires_by_ttl() {
    let server = EmbeddedServer::start("127.0.0.1:0".parse().unwrap()).unwrap();
    let a = EmbeddedClient::new(server.addr());
    let b = EmbeddedClient::new(server.addr());
    let (ma, mb) = (m(1, 1), m(2, 2));
    let Campaign::Won { epoch, .. } = a.campaign("g", ma, Duration::from_millis(100)).unwrap()
    else {
        panic!()
    };
    a.set_in_sync("g", ma, epoch, Some(mb)).unwrap().unwrap();
    let start = Instant::now();
    // Poll with a deadline until the lease lapses and b wins.
    let deadline = start + Duration::from_secs(5);
    loop {
        match b.campaign("g", mb, Duration::from_secs(1)).unwrap() {
            Campaign::Won { .. } => break,
            Campaign::Lost { .. } => {
                assert!(Instant::now() < deadline, "lease never expired");
                std::thread::park_timeout(Duration::from_millis(10));
            }
        }
    }
    assert!(
        start.elapsed() >= Duration::from_millis(90),
        "won before the TTL"
    );
    let addr = server.addr();
    drop(server);
    // The server is gone: calls fail cleanly.
    let c = EmbeddedClient::new(addr);
    assert!(matches!(c.get("g"), Err(CoordError::Io(_))));
}
