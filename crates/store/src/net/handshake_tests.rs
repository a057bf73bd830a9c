//! Tests of the connection handshake (`handshake.rs`).
use super::*;

#[test]
fn intro_accept_and_refusal_round_trip() {
    let h = Hello::Node(NodeHello {
        member: Member {
            node: 7,
            incarnation: 99,
        },
        group: "g1".into(),
    });
    let i = Intro {
        hello: h.clone(),
        proof: None,
    };
    assert_eq!(decode_intro(&i.encode()), Some((i, h.encode().len())));
    let c = Intro {
        hello: Hello::Client {
            id: 0xdead_beef,
            user: "reader".into(),
        },
        proof: Some(Proof {
            server_nonce: [1; 16],
            client_nonce: [2; 16],
            mac: [3; 32],
        }),
    };
    let enc = c.encode();
    assert_eq!(decode_intro(&enc).map(|x| x.0), Some(c));
    assert_eq!(decode_intro(&enc[..enc.len() - 1]), None);
    assert_eq!(decode_intro(b"SRC1abcdefgh"), None);
    let a = Accept {
        node: 3,
        arena: Some(ArenaRef {
            base: 0x7e00_0000_0000,
            len: 1 << 20,
            stag: 0x8000_0112,
        }),
        rights: Rights::Read,
        proof: Some([9; 32]),
    };
    assert_eq!(Accept::decode(&a.encode()), Some(a));
    for r in [Refusal::Challenge([5; 16]), Refusal::Reason("no".into())] {
        assert_eq!(Refusal::decode(&r.encode()), Some(r));
    }
    assert!(Refusal::Reason("x".repeat(2000)).encode().len() <= 512);
}

fn client(user: &str) -> Hello {
    Hello::Client {
        id: 1,
        user: user.into(),
    }
}

/// The gate's decisions, as a client would drive them.
fn run(gate: &Gate, hello: &Hello, password: Option<&[u8]>) -> Result<Accept, String> {
    let peer: SocketAddr = "127.0.0.1:5000".parse().unwrap();
    let arena = Some(ArenaRef {
        base: 1 << 40,
        len: 1 << 20,
        stag: 0x8000_0101,
    });
    let first = Intro {
        hello: hello.clone(),
        proof: None,
    };
    let nonce = match gate.admit(&first.encode(), peer, 1, arena) {
        Admission::Accept { reply, .. } => return Ok(Accept::decode(&reply).unwrap()),
        Admission::Reject { reply, .. } => match Refusal::decode(&reply).unwrap() {
            Refusal::Challenge(n) => n,
            Refusal::Reason(r) => return Err(r),
        },
    };
    let secret = Secret::new(password.ok_or("no password")?);
    let cn = auth::random_nonce();
    let p = Intro {
        hello: hello.clone(),
        proof: Some(Proof {
            server_nonce: nonce,
            client_nonce: cn,
            mac: auth::client_proof(&secret, &hello.encode(), &nonce, &cn),
        }),
    };
    let data = p.encode();
    match gate.admit(&data, peer, 1, arena) {
        Admission::Accept { reply, .. } => {
            let a = Accept::decode(&reply).unwrap();
            let want = auth::server_proof(&secret, &nonce, &cn, &a.body());
            assert!(auth::proofs_equal(&want, &a.proof.unwrap()));
            // The same proof again is a replay.
            match gate.admit(&data, peer, 1, arena) {
                Admission::Reject { why, .. } => assert!(why.contains("Replayed"), "{why}"),
                _ => panic!("a replayed proof was admitted"),
            }
            Ok(a)
        }
        Admission::Reject { reply, .. } => match Refusal::decode(&reply) {
            Some(Refusal::Reason(r)) => Err(r),
            r => panic!("{r:?}"),
        },
    }
}

#[test]
fn the_gate_admits_credentials_only() {
    let creds = Credentials {
        secret: Some(Secret::new(b"group-secret")),
        users: vec![auth::User {
            name: "ro".into(),
            secret: Secret::new(b"ro-pass"),
            rights: Rights::Read,
        }],
    };
    let gate = Gate::new("g".into(), creds, true);
    let a = run(&gate, &client("default"), Some(b"group-secret")).unwrap();
    assert_eq!(
        (a.rights, a.arena.unwrap().stag),
        (Rights::ReadWrite, 0x8000_0101)
    );
    assert_eq!(
        run(&gate, &client("ro"), Some(b"ro-pass")).unwrap().rights,
        Rights::Read
    );
    let e = run(&gate, &client("ro"), Some(b"group-secret")).unwrap_err();
    assert!(e.contains("authentication failed"), "{e}");
    let e = run(&gate, &client("nobody"), Some(b"x")).unwrap_err();
    assert!(e.contains("authentication failed"), "{e}");
    assert_eq!(
        run(&gate, &client("default"), None).unwrap_err(),
        "no password"
    );
    let node = Hello::Node(NodeHello {
        member: Member {
            node: 2,
            incarnation: 5,
        },
        group: "g".into(),
    });
    assert!(run(&gate, &node, Some(b"group-secret")).is_ok());
    assert!(run(&gate, &node, Some(b"ro-pass")).is_err());
    let other = Hello::Node(NodeHello {
        member: Member {
            node: 2,
            incarnation: 5,
        },
        group: "h".into(),
    });
    assert!(run(&gate, &other, Some(b"group-secret"))
        .unwrap_err()
        .contains("another group"));
}

#[test]
fn protected_mode_serves_loopback_only() {
    let gate = Gate::new("g".into(), Credentials::default(), true);
    let i = Intro {
        hello: client("default"),
        proof: None,
    }
    .encode();
    let lo: SocketAddr = "127.0.0.1:1".parse().unwrap();
    let far: SocketAddr = "192.0.2.7:1".parse().unwrap();
    assert!(matches!(
        gate.admit(&i, lo, 1, None),
        Admission::Accept { .. }
    ));
    match gate.admit(&i, far, 1, None) {
        Admission::Reject { why, .. } => assert!(why.contains("protected mode")),
        a => panic!("{a:?}"),
    }
    let open = Gate::new("g".into(), Credentials::default(), false);
    assert!(matches!(
        open.admit(&i, far, 1, None),
        Admission::Accept { .. }
    ));
}
