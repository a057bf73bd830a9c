//! The etcd coordinator, for groups that span machines.
//!
//! Two keys per group under `/softrdma/store/<group>/`:
//!
//! * `state` (no lease): `"<primary> <in_sync>"` with members written
//!   `NODE:INCARNATION` or `-`. **The epoch is this key's `mod_revision`**,
//!   so it comes from etcd and only grows; every change of the record
//!   (campaign won, in-sync member changed) is a new epoch.
//! * `leader` (attached to the primary's lease): `"<primary>"`. It vanishes
//!   when the lease expires or is revoked; its presence is "lease held".
//!
//! Every change is one transaction guarded by compares (put-if-absent for
//! `leader`, compare-and-set on `state`'s `mod_revision`), so the rules of
//! [`crate::coord`] hold under concurrency. etcd leases have a granularity
//! of one second (and etcd enforces a minimum of a few seconds), so
//! failover with etcd takes seconds, not the embedded coordinator's
//! sub-second time.
//!
//! `etcd-client` is async; tokio is confined to this file: the coordinator
//! owns a small current-thread runtime and blocks on it, so the rest of the
//! store stays thread-based.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};

use super::{Campaign, CoordError, Coordinator, GroupRecord};
use crate::proto::Member;

fn fmt_member(m: Option<Member>) -> String {
    match m {
        Some(m) => format!("{}:{}", m.node, m.incarnation),
        None => "-".into(),
    }
}

fn parse_member(s: &str) -> Option<Option<Member>> {
    if s == "-" {
        return Some(None);
    }
    let (n, i) = s.split_once(':')?;
    Some(Some(Member {
        node: n.parse().ok()?,
        incarnation: i.parse().ok()?,
    }))
}

fn io(e: etcd_client::Error) -> CoordError {
    CoordError::Io(format!("etcd: {e}"))
}

/// Current state of a group as read from etcd.
struct Snapshot {
    /// `(mod_revision, primary, in_sync)` of `state`, if present.
    state: Option<(i64, Member, Option<Member>)>,
    /// `(lease id, member)` of `leader`, if present.
    leader: Option<(i64, Member)>,
}

impl Snapshot {
    fn record(&self) -> Option<GroupRecord> {
        self.state.map(|(rev, primary, in_sync)| GroupRecord {
            epoch: rev as u64,
            primary,
            in_sync,
            lease_held: self.leader.is_some_and(|(_, m)| m == primary),
        })
    }
}

/// A [`Coordinator`] backed by etcd.
pub struct EtcdCoordinator {
    rt: tokio::runtime::Runtime,
    client: Mutex<Client>,
    /// Lease granted per group by this coordinator.
    leases: Mutex<BTreeMap<String, i64>>,
    prefix: String,
}

impl EtcdCoordinator {
    /// Connects to `endpoints` (e.g. `["http://127.0.0.1:2379"]`).
    pub fn connect(endpoints: &[String]) -> Result<EtcdCoordinator, CoordError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| CoordError::Setup(format!("tokio runtime: {e}")))?;
        let opts = etcd_client::ConnectOptions::new()
            .with_connect_timeout(Duration::from_secs(2))
            .with_timeout(Duration::from_secs(5));
        let client = rt
            .block_on(Client::connect(endpoints, Some(opts)))
            .map_err(io)?;
        Ok(EtcdCoordinator {
            rt,
            client: Mutex::new(client),
            leases: Mutex::new(BTreeMap::new()),
            prefix: "/softrdma/store".into(),
        })
    }

    fn key(&self, group: &str, which: &str) -> String {
        format!("{}/{group}/{which}", self.prefix)
    }

    fn snapshot(&self, c: &mut Client, group: &str) -> Result<Snapshot, CoordError> {
        let (sk, lk) = (self.key(group, "state"), self.key(group, "leader"));
        let s = self.rt.block_on(c.get(sk, None)).map_err(io)?;
        let l = self.rt.block_on(c.get(lk, None)).map_err(io)?;
        let bad = |what: &str| CoordError::Protocol(format!("malformed etcd {what} for {group}"));
        let state = match s.kvs().first() {
            None => None,
            Some(kv) => {
                let v = kv.value_str().map_err(|_| bad("state"))?;
                let (p, i) = v.split_once(' ').ok_or_else(|| bad("state"))?;
                let p = parse_member(p).flatten().ok_or_else(|| bad("state"))?;
                let i = parse_member(i).ok_or_else(|| bad("state"))?;
                Some((kv.mod_revision(), p, i))
            }
        };
        let leader = match l.kvs().first() {
            None => None,
            Some(kv) => {
                let v = kv.value_str().map_err(|_| bad("leader"))?;
                let m = parse_member(v).flatten().ok_or_else(|| bad("leader"))?;
                Some((kv.lease(), m))
            }
        };
        Ok(Snapshot { state, leader })
    }
}

impl Coordinator for EtcdCoordinator {
    fn campaign(&self, group: &str, me: Member, ttl: Duration) -> Result<Campaign, CoordError> {
        let mut c = self.client.lock().unwrap();
        let snap = self.snapshot(&mut c, group)?;
        let lease_ok = snap.leader.is_none_or(|(_, m)| m == me);
        let eligible = match snap.state {
            None => true,
            Some((_, p, i)) => p == me || i == Some(me),
        };
        if !(lease_ok && eligible) {
            return Ok(Campaign::Lost {
                record: snap.record(),
            });
        }
        let secs = ttl.as_secs_f64().ceil().max(1.0) as i64;
        let lease = self
            .rt
            .block_on(c.lease_grant(secs, None))
            .map_err(io)?
            .id();
        let (sk, lk) = (self.key(group, "state"), self.key(group, "leader"));
        let state_cmp = match snap.state {
            None => Compare::version(sk.clone(), CompareOp::Equal, 0),
            Some((rev, _, _)) => Compare::mod_revision(sk.clone(), CompareOp::Equal, rev),
        };
        let leader_cmp = match snap.leader {
            None => Compare::version(lk.clone(), CompareOp::Equal, 0),
            Some((old, _)) => Compare::lease(lk.clone(), CompareOp::Equal, old),
        };
        let txn = Txn::new().when([state_cmp, leader_cmp]).and_then([
            TxnOp::put(sk, format!("{} -", fmt_member(Some(me))), None),
            TxnOp::put(
                lk,
                fmt_member(Some(me)),
                Some(PutOptions::new().with_lease(lease)),
            ),
        ]);
        let resp = self.rt.block_on(c.txn(txn)).map_err(io)?;
        if !resp.succeeded() {
            let _ = self.rt.block_on(c.lease_revoke(lease));
            let snap = self.snapshot(&mut c, group)?;
            return Ok(Campaign::Lost {
                record: snap.record(),
            });
        }
        let epoch = resp
            .header()
            .ok_or_else(|| CoordError::Protocol("etcd txn without header".into()))?
            .revision() as u64;
        if let Some(old) = self.leases.lock().unwrap().insert(group.to_string(), lease) {
            if snap.leader.is_some_and(|(l, _)| l == old) {
                let _ = self.rt.block_on(c.lease_revoke(old));
            }
        }
        Ok(Campaign::Won { epoch })
    }

    fn keep_alive(&self, group: &str, me: Member, epoch: u64) -> Result<bool, CoordError> {
        let Some(lease) = self.leases.lock().unwrap().get(group).copied() else {
            return Ok(false);
        };
        let mut c = self.client.lock().unwrap();
        let snap = self.snapshot(&mut c, group)?;
        let current = snap
            .state
            .is_some_and(|(rev, p, _)| rev as u64 == epoch && p == me)
            && snap.leader.is_some_and(|(l, m)| l == lease && m == me);
        if !current {
            return Ok(false);
        }
        let ttl = self.rt.block_on(async {
            let (mut keeper, mut stream) = c.lease_keep_alive(lease).await?;
            keeper.keep_alive().await?;
            Ok::<_, etcd_client::Error>(stream.message().await?.map_or(0, |r| r.ttl()))
        });
        Ok(ttl.map_err(io)? > 0)
    }

    fn set_in_sync(
        &self,
        group: &str,
        me: Member,
        epoch: u64,
        in_sync: Option<Member>,
    ) -> Result<Option<u64>, CoordError> {
        let Some(lease) = self.leases.lock().unwrap().get(group).copied() else {
            return Ok(None);
        };
        let mut c = self.client.lock().unwrap();
        // `state` at revision `epoch` naming us is exactly what the
        // compare-and-set below protects.
        let snap = self.snapshot(&mut c, group)?;
        if !snap
            .state
            .is_some_and(|(rev, p, _)| rev as u64 == epoch && p == me)
        {
            return Ok(None);
        }
        let (sk, lk) = (self.key(group, "state"), self.key(group, "leader"));
        let txn = Txn::new()
            .when([
                Compare::mod_revision(sk.clone(), CompareOp::Equal, epoch as i64),
                Compare::lease(lk, CompareOp::Equal, lease),
            ])
            .and_then([TxnOp::put(
                sk,
                format!("{} {}", fmt_member(Some(me)), fmt_member(in_sync)),
                None,
            )]);
        let resp = self.rt.block_on(c.txn(txn)).map_err(io)?;
        if !resp.succeeded() {
            return Ok(None);
        }
        Ok(resp.header().map(|h| h.revision() as u64))
    }

    fn resign(&self, group: &str, me: Member, epoch: u64) -> Result<(), CoordError> {
        let Some(lease) = self.leases.lock().unwrap().remove(group) else {
            return Ok(());
        };
        let mut c = self.client.lock().unwrap();
        let snap = self.snapshot(&mut c, group)?;
        if snap
            .state
            .is_some_and(|(rev, p, _)| rev as u64 == epoch && p == me)
        {
            self.rt.block_on(c.lease_revoke(lease)).map_err(io)?;
        }
        Ok(())
    }

    fn get(&self, group: &str) -> Result<Option<GroupRecord>, CoordError> {
        let mut c = self.client.lock().unwrap();
        Ok(self.snapshot(&mut c, group)?.record())
    }
}

#[cfg(test)]
mod tests {
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

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
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
        let (cp, pp) = (free_port(), free_port());
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
        let Campaign::Won { epoch: e1 } = a.campaign("g", ma, ttl).unwrap() else {
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
        // The primary resigns: the in-sync secondary wins a newer epoch and
        // the old primary is fenced.
        a.resign("g", ma, e2).unwrap();
        let Campaign::Won { epoch: e3 } = b.campaign("g", mb, ttl).unwrap() else {
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
    }
}
