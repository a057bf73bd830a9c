//! Tests of [`super`] (the etcd coordinator), apart so that the
//! source file stays small.

use super::*;
use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Instant;

/// An etcd server on free loopback ports with a temporary data dir,
/// killed and cleaned up on drop.
struct Etcd {
    child: Child,
    dir: std::path::PathBuf,
    url: String,
}

impl Drop for Etcd {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Two distinct free ports: both listeners are held before either is
/// released, so the kernel cannot return the same port twice.
fn free_port_pair() -> (u16, u16) {
    let a = TcpListener::bind("127.0.0.1:0").unwrap();
    let b = TcpListener::bind("127.0.0.1:0").unwrap();
    (
        a.local_addr().unwrap().port(),
        b.local_addr().unwrap().port(),
    )
}

fn start_etcd() -> Etcd {
    let bin = ["/usr/bin/etcd", "/usr/local/bin/etcd"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or_else(|| {
            panic!(
                "etcd binary not found: install it with `apt-get install -y etcd-server` \
                 (scripts/setup.sh does); this test does not skip"
            )
        });
    let (cp, pp) = free_port_pair();
    let dir = std::env::temp_dir().join(format!("softrdma-etcd-{}-{cp}", std::process::id()));
    let url = format!("http://127.0.0.1:{cp}");
    let peer = format!("http://127.0.0.1:{pp}");
    let child = Command::new(bin)
        .args(["--name", "t", "--data-dir"])
        .arg(&dir)
        .args([
            "--listen-client-urls",
            &url,
            "--advertise-client-urls",
            &url,
        ])
        .args([
            "--listen-peer-urls",
            &peer,
            "--initial-advertise-peer-urls",
            &peer,
        ])
        .args(["--initial-cluster", &format!("t={peer}")])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn etcd");
    Etcd { child, dir, url }
}

#[test]
fn etcd_coordinator_follows_the_rules() {
    let etcd = start_etcd();
    let eps = vec![etcd.url.clone()];
    // Wait (with a deadline) until etcd answers.
    let deadline = Instant::now() + Duration::from_secs(20);
    let a = loop {
        match EtcdCoordinator::connect(&eps).and_then(|c| c.get("probe").map(|_| c)) {
            Ok(c) => break c,
            Err(e) => {
                assert!(Instant::now() < deadline, "etcd did not come up: {e}");
                std::thread::park_timeout(Duration::from_millis(50));
            }
        }
    };
    let b = EtcdCoordinator::connect(&eps).unwrap();
    let ma = Member {
        node: 1,
        incarnation: 7,
    };
    let mb = Member {
        node: 2,
        incarnation: 8,
    };
    let ttl = Duration::from_secs(2);

    assert_eq!(a.get("g").unwrap(), None);
    let Campaign::Won { epoch: e1, .. } = a.campaign("g", ma, ttl).unwrap() else {
        panic!("bootstrap campaign must win")
    };
    let r = b.get("g").unwrap().unwrap();
    assert_eq!(
        (r.epoch, r.primary, r.in_sync, r.lease_held),
        (e1, ma, None, true)
    );
    // b is neither eligible nor is the lease free.
    assert!(matches!(
        b.campaign("g", mb, ttl).unwrap(),
        Campaign::Lost { .. }
    ));
    assert!(a.keep_alive("g", ma, e1).unwrap());
    let e2 = a
        .set_in_sync("g", ma, e1, Some(mb))
        .unwrap()
        .expect("CAS at e1");
    assert!(e2 > e1);
    assert_eq!(
        a.set_in_sync("g", ma, e1, None).unwrap(),
        None,
        "stale epoch"
    );
    assert_eq!(b.get("g").unwrap().unwrap().in_sync, Some(mb));
    // Named in the record: b may not retire that incarnation.
    assert!(!b.retire("g", mb, 9).unwrap());
    // The primary resigns: the in-sync secondary wins a newer epoch and
    // the old primary is fenced.
    a.resign("g", ma, e2).unwrap();
    let Campaign::Won { epoch: e3, .. } = b.campaign("g", mb, ttl).unwrap() else {
        panic!("in-sync secondary must win")
    };
    assert!(e3 > e2);
    assert!(!a.keep_alive("g", ma, e2).unwrap());
    assert_eq!(a.set_in_sync("g", ma, e2, None).unwrap(), None);
    // a is not eligible any more (b recorded no in-sync member).
    drop(b); // its lease is not renewed and expires by TTL
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let r = a.get("g").unwrap().unwrap();
        if !r.lease_held {
            break;
        }
        assert!(Instant::now() < deadline, "lease never expired");
        std::thread::park_timeout(Duration::from_millis(100));
    }
    assert!(matches!(
        a.campaign("g", ma, ttl).unwrap(),
        Campaign::Lost { .. }
    ));
    // a (named nowhere now) retires; its old incarnation can neither be
    // registered nor campaign any more, the new one can be registered.
    assert!(a.retire("g", ma, 70).unwrap());
    let ma2 = Member {
        node: 1,
        incarnation: 70,
    };
    let c = EtcdCoordinator::connect(&eps).unwrap();
    let Campaign::Won { epoch: e4, in_sync } = c.campaign("g", mb, ttl).unwrap() else {
        panic!("b's record, lease lapsed: b wins again")
    };
    assert_eq!(in_sync, None);
    assert_eq!(
        c.set_in_sync("g", mb, e4, Some(ma)).unwrap(),
        None,
        "retired"
    );
    let e5 = c
        .set_in_sync("g", mb, e4, Some(ma2))
        .unwrap()
        .expect("the current incarnation");
    // A re-election of b keeps a's new incarnation in sync.
    c.resign("g", mb, e5).unwrap();
    let Campaign::Won { epoch: e6, in_sync } = c.campaign("g", mb, ttl).unwrap() else {
        panic!("re-election")
    };
    assert_eq!(in_sync, Some(ma2));
    // Node 1's process dies and a new one starts with a fresh
    // incarnation: it was never retired, so it is registered at once
    // (issue 29, finding 9: it used to be refused until it retired
    // itself, costing a step-down and a second copy).
    let e7 = c.set_in_sync("g", mb, e6, None).unwrap().expect("drop");
    let fresh = Member {
        node: 1,
        incarnation: 0x5eed,
    };
    let e8 = c
        .set_in_sync("g", mb, e7, Some(fresh))
        .unwrap()
        .expect("a fresh incarnation is registered");
    // The operator's calls (issue 33): refused while b holds the lease.
    let Override::LeaseHeld { record } = a.promote("g", ma2).unwrap() else {
        panic!("promote under a live lease")
    };
    assert_eq!((record.epoch, record.primary), (e8, mb));
    assert!(!a.reset("g").unwrap().is_done());
    assert_eq!(a.get("g").unwrap().unwrap().epoch, e8, "nothing changed");
    // b resigns: node 1's fresh incarnation is promoted, b is stale.
    c.set_in_sync("g", mb, e8, None).unwrap().expect("drop");
    let e9 = c.get("g").unwrap().unwrap().epoch;
    c.resign("g", mb, e9).unwrap();
    assert_eq!(a.promote("g", ma).unwrap(), Override::Retired);
    let Override::Done { record: Some(r) } = a.promote("g", fresh).unwrap() else {
        panic!("promote without a lease")
    };
    assert!(r.epoch > e9 && r.primary == fresh && r.in_sync.is_none());
    assert!(matches!(
        c.campaign("g", mb, ttl).unwrap(),
        Campaign::Lost { .. }
    ));
    let Campaign::Won { epoch: e10, .. } = a.campaign("g", fresh, ttl).unwrap() else {
        panic!("the promoted incarnation wins")
    };
    a.resign("g", fresh, e10).unwrap();
    // A reset retires it: its campaign is refused with no record; a
    // new incarnation starts the group above every earlier epoch.
    let Override::Done { record: Some(old) } = a.reset("g").unwrap() else {
        panic!("reset without a lease")
    };
    assert_eq!((old.epoch, old.primary), (e10, fresh));
    assert_eq!(a.get("g").unwrap(), None);
    assert_eq!(
        a.campaign("g", fresh, ttl).unwrap(),
        Campaign::Lost { record: None }
    );
    let newer = Member {
        node: 1,
        incarnation: 0x5eee,
    };
    let Campaign::Won { epoch: e11, .. } = a.campaign("g", newer, ttl).unwrap() else {
        panic!("a new incarnation starts the group")
    };
    assert!(e11 > e10);
}
