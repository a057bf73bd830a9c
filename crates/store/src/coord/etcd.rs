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
//! * `retired/<node>/<incarnation>` (no lease): one key per retired
//!   incarnation, written by [`Coordinator::retire`]; a registration or
//!   campaign naming a retired incarnation fails (the transaction compares
//!   that its key is absent). A node's next process, with a fresh
//!   incarnation, is not retired (see [`crate::coord`]).
//!
//! Every change is one transaction guarded by compares (put-if-absent for
//! `leader`, compare-and-set on `state`'s `mod_revision`), so the rules of
//! [`crate::coord`] hold under concurrency. Both keys are read in one
//! transaction, so a snapshot is consistent. etcd leases have a granularity
//! of one second (and etcd enforces a minimum of a few seconds), so
//! failover with etcd takes seconds, not the embedded coordinator's
//! sub-second time.
//!
//! ## Transport: etcd's JSON gateway
//!
//! etcd serves its v3 API twice on the client port: as gRPC and as JSON
//! over HTTP/1.1 (the "gRPC gateway", `POST /v3/kv/range`, `/v3/kv/txn`,
//! `/v3/lease/grant`, `/v3/lease/keepalive`, `/v3/lease/revoke`; documented
//! at <https://etcd.io/docs/v3.4/dev-guide/api_grpc_gateway/>, present in
//! every etcd since 3.3). We use the JSON form: a gRPC client needs code
//! generated from etcd's `.proto` files at build time, which needs
//! `protoc`, which a fresh machine does not have; the JSON form needs only
//! a blocking HTTP client (`ureq`, kept-alive connections), `serde_json`
//! and `base64`. Keys and values travel base64-encoded, 64-bit integers as
//! decimal strings, and fields equal to zero/false are omitted by the
//! server (so a missing field reads as its default).
//!
//! Several endpoints may be given; a request that cannot reach one
//! endpoint is retried on the next.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine as _;
use serde_json::{json, Value};

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

/// An int64 field of a gateway answer: a decimal string, a number, or
/// absent (zero).
fn int(v: &Value, field: &str) -> Result<i64, CoordError> {
    match v.get(field) {
        None | Some(Value::Null) => Ok(0),
        Some(Value::String(s)) => s
            .parse()
            .map_err(|_| CoordError::Protocol(format!("etcd: {field} is not an integer: {s:?}"))),
        Some(Value::Number(n)) => n
            .as_i64()
            .ok_or_else(|| CoordError::Protocol(format!("etcd: {field} out of range: {n}"))),
        Some(o) => Err(CoordError::Protocol(format!(
            "etcd: {field} has an unexpected type: {o}"
        ))),
    }
}

fn b64(s: &str) -> String {
    B64.encode(s.as_bytes())
}

/// One key-value of a range answer: `(value, mod_revision, lease)`.
fn kv_of(range: &Value, what: &str) -> Result<Option<(String, i64, i64)>, CoordError> {
    let Some(kv) = range
        .get("kvs")
        .and_then(|k| k.as_array())
        .and_then(|a| a.first())
    else {
        return Ok(None);
    };
    let bad = || CoordError::Protocol(format!("malformed etcd value of {what}"));
    let raw = kv.get("value").and_then(|v| v.as_str()).unwrap_or("");
    let bytes = B64.decode(raw).map_err(|_| bad())?;
    let value = String::from_utf8(bytes).map_err(|_| bad())?;
    Ok(Some((value, int(kv, "mod_revision")?, int(kv, "lease")?)))
}

/// A blocking client of etcd's JSON gateway.
struct Gateway {
    agent: ureq::Agent,
    endpoints: Vec<String>,
    /// Index of the endpoint that answered last.
    current: Mutex<usize>,
}

impl Gateway {
    fn new(endpoints: &[String]) -> Result<Gateway, CoordError> {
        if endpoints.is_empty() {
            return Err(CoordError::Setup("etcd: no endpoints given".into()));
        }
        let endpoints = endpoints
            .iter()
            .map(|e| {
                let e = e.trim_end_matches('/');
                if e.starts_with("https://") {
                    Err(CoordError::Setup(format!(
                        "etcd endpoint {e}: TLS is not supported; use an http:// endpoint"
                    )))
                } else if e.starts_with("http://") {
                    Ok(e.to_string())
                } else {
                    Ok(format!("http://{e}"))
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        let agent = ureq::AgentBuilder::new()
            .timeout_connect(Duration::from_secs(2))
            .timeout(Duration::from_secs(5))
            .build();
        Ok(Gateway {
            agent,
            endpoints,
            current: Mutex::new(0),
        })
    }

    /// `POST path` with a JSON body; the answer's JSON. An endpoint that
    /// cannot be reached is skipped; an error answer is returned as is.
    fn call(&self, path: &str, body: &Value) -> Result<Value, CoordError> {
        let body = body.to_string();
        let start = *self.current.lock().unwrap();
        let n = self.endpoints.len();
        let mut last = String::new();
        for k in 0..n {
            let i = (start + k) % n;
            let url = format!("{}{path}", self.endpoints[i]);
            let text = match self
                .agent
                .post(&url)
                .set("Content-Type", "application/json")
                .send_string(&body)
            {
                Ok(r) => r.into_string(),
                Err(ureq::Error::Status(code, r)) => {
                    let text = r.into_string().unwrap_or_default();
                    let msg = serde_json::from_str::<Value>(&text)
                        .ok()
                        .and_then(|v| v.get("message").and_then(|m| m.as_str()).map(String::from))
                        .unwrap_or(text);
                    return Err(CoordError::Io(format!("etcd {url}: HTTP {code}: {msg}")));
                }
                Err(ureq::Error::Transport(t)) => {
                    last = format!("etcd {url}: {t}");
                    continue;
                }
            };
            let text = text.map_err(|e| CoordError::Io(format!("etcd {url}: {e}")))?;
            *self.current.lock().unwrap() = i;
            // A streaming call (keepalive) answers one JSON object per
            // line; we send one request, so the first line is the answer.
            let first = text.lines().next().unwrap_or("");
            return serde_json::from_str(first).map_err(|e| {
                CoordError::Protocol(format!("etcd {url}: not JSON ({e}): {first:.200}"))
            });
        }
        Err(CoordError::Io(last))
    }

    fn txn(&self, compare: Vec<Value>, success: Vec<Value>) -> Result<Value, CoordError> {
        self.call(
            "/v3/kv/txn",
            &json!({ "compare": compare, "success": success }),
        )
    }

    fn lease_grant(&self, ttl_secs: i64) -> Result<i64, CoordError> {
        let r = self.call("/v3/lease/grant", &json!({ "TTL": ttl_secs }))?;
        if let Some(e) = r
            .get("error")
            .and_then(|e| e.as_str())
            .filter(|e| !e.is_empty())
        {
            return Err(CoordError::Io(format!("etcd lease grant: {e}")));
        }
        match int(&r, "ID")? {
            0 => Err(CoordError::Protocol(
                "etcd lease grant without an ID".into(),
            )),
            id => Ok(id),
        }
    }

    fn lease_revoke(&self, id: i64) -> Result<(), CoordError> {
        match self.call("/v3/lease/revoke", &json!({ "ID": id.to_string() })) {
            Ok(_) => Ok(()),
            // Already gone (expired or revoked): what we wanted.
            Err(CoordError::Io(e)) if e.contains("lease not found") => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Renews lease `id`; its remaining TTL in seconds (0: gone).
    fn lease_keep_alive(&self, id: i64) -> Result<i64, CoordError> {
        let r = self.call("/v3/lease/keepalive", &json!({ "ID": id.to_string() }))?;
        match r.get("result") {
            Some(res) => int(res, "TTL"),
            None => Err(CoordError::Protocol(format!(
                "etcd keepalive: unexpected answer {r}"
            ))),
        }
    }
}

fn cmp_eq(target: &str, key: &str, field: &str, value: i64) -> Value {
    json!({ "target": target, "result": "EQUAL", "key": b64(key), field: value.to_string() })
}

fn put(key: &str, value: &str, lease: i64) -> Value {
    let mut p = json!({ "key": b64(key), "value": b64(value) });
    if lease != 0 {
        p["lease"] = json!(lease.to_string());
    }
    json!({ "request_put": p })
}

fn range(key: &str) -> Value {
    json!({ "request_range": { "key": b64(key) } })
}

fn succeeded(r: &Value) -> bool {
    r.get("succeeded")
        .and_then(|s| s.as_bool())
        .unwrap_or(false)
}

fn revision(r: &Value) -> Result<u64, CoordError> {
    let h = r
        .get("header")
        .ok_or_else(|| CoordError::Protocol("etcd answer without header".into()))?;
    Ok(int(h, "revision")? as u64)
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
    gw: Gateway,
    /// Serialises this coordinator's read-then-transact sequences (their
    /// safety comes from etcd's compares; this only keeps one node's own
    /// calls from interleaving).
    op: Mutex<()>,
    /// Lease granted per group by this coordinator.
    leases: Mutex<BTreeMap<String, i64>>,
    prefix: String,
}

impl EtcdCoordinator {
    /// Connects to `endpoints` (e.g. `["http://127.0.0.1:2379"]`) and checks
    /// that one of them answers.
    pub fn connect(endpoints: &[String]) -> Result<EtcdCoordinator, CoordError> {
        let c = EtcdCoordinator {
            gw: Gateway::new(endpoints)?,
            op: Mutex::new(()),
            leases: Mutex::new(BTreeMap::new()),
            prefix: "/softrdma/store".into(),
        };
        c.gw.call("/v3/kv/range", &json!({ "key": b64(&c.prefix) }))?;
        Ok(c)
    }

    fn key(&self, group: &str, which: &str) -> String {
        format!("{}/{group}/{which}", self.prefix)
    }

    /// The key that marks incarnation `m` retired.
    fn retired_key(&self, group: &str, m: Member) -> String {
        self.key(group, &format!("retired/{}/{}", m.node, m.incarnation))
    }

    /// The compare that `m` was not retired (its retirement key absent);
    /// `None` if it was.
    fn current_cmp(&self, group: &str, m: Member) -> Result<Option<Value>, CoordError> {
        let k = self.retired_key(group, m);
        let r = self.gw.call("/v3/kv/range", &json!({ "key": b64(&k) }))?;
        Ok(match kv_of(&r, "retired")? {
            None => Some(cmp_eq("VERSION", &k, "version", 0)),
            Some(_) => None,
        })
    }

    /// Both keys of `group`, read in one transaction (one revision).
    fn snapshot(&self, group: &str) -> Result<Snapshot, CoordError> {
        let (sk, lk) = (self.key(group, "state"), self.key(group, "leader"));
        let r = self.gw.txn(vec![], vec![range(&sk), range(&lk)])?;
        let bad = |what: &str| CoordError::Protocol(format!("malformed etcd {what} for {group}"));
        let resp = r
            .get("responses")
            .and_then(|a| a.as_array())
            .filter(|a| a.len() == 2)
            .ok_or_else(|| bad("snapshot"))?;
        let rng = |i: usize| resp[i].get("response_range").ok_or_else(|| bad("snapshot"));
        let state = match kv_of(rng(0)?, "state")? {
            None => None,
            Some((v, rev, _)) => {
                let (p, i) = v.split_once(' ').ok_or_else(|| bad("state"))?;
                let p = parse_member(p).flatten().ok_or_else(|| bad("state"))?;
                let i = parse_member(i).ok_or_else(|| bad("state"))?;
                Some((rev, p, i))
            }
        };
        let leader = match kv_of(rng(1)?, "leader")? {
            None => None,
            Some((v, _, lease)) => {
                let m = parse_member(&v).flatten().ok_or_else(|| bad("leader"))?;
                Some((lease, m))
            }
        };
        Ok(Snapshot { state, leader })
    }
}

impl Coordinator for EtcdCoordinator {
    fn campaign(&self, group: &str, me: Member, ttl: Duration) -> Result<Campaign, CoordError> {
        let _op = self.op.lock().unwrap();
        let snap = self.snapshot(group)?;
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
        let Some(me_cmp) = self.current_cmp(group, me)? else {
            // A retired incarnation (a late campaign of a node that moved on).
            return Ok(Campaign::Lost {
                record: snap.record(),
            });
        };
        let secs = ttl.as_secs_f64().ceil().max(1.0) as i64;
        let lease = self.gw.lease_grant(secs)?;
        let (sk, lk) = (self.key(group, "state"), self.key(group, "leader"));
        let state_cmp = match snap.state {
            None => cmp_eq("VERSION", &sk, "version", 0),
            Some((rev, _, _)) => cmp_eq("MOD", &sk, "mod_revision", rev),
        };
        let leader_cmp = match snap.leader {
            None => cmp_eq("VERSION", &lk, "version", 0),
            Some((old, _)) => cmp_eq("LEASE", &lk, "lease", old),
        };
        // A re-election keeps the in-sync member (see `crate::coord`).
        let in_sync = match snap.state {
            Some((_, p, i)) if p == me => i,
            _ => None,
        };
        let resp = self.gw.txn(
            vec![state_cmp, leader_cmp, me_cmp],
            vec![
                put(
                    &sk,
                    &format!("{} {}", fmt_member(Some(me)), fmt_member(in_sync)),
                    0,
                ),
                put(&lk, &fmt_member(Some(me)), lease),
            ],
        )?;
        if !succeeded(&resp) {
            let _ = self.gw.lease_revoke(lease);
            let snap = self.snapshot(group)?;
            return Ok(Campaign::Lost {
                record: snap.record(),
            });
        }
        let epoch = revision(&resp)?;
        if let Some(old) = self.leases.lock().unwrap().insert(group.to_string(), lease) {
            if snap.leader.is_some_and(|(l, _)| l == old) {
                let _ = self.gw.lease_revoke(old);
            }
        }
        Ok(Campaign::Won { epoch, in_sync })
    }

    fn keep_alive(&self, group: &str, me: Member, epoch: u64) -> Result<bool, CoordError> {
        let Some(lease) = self.leases.lock().unwrap().get(group).copied() else {
            return Ok(false);
        };
        let _op = self.op.lock().unwrap();
        let snap = self.snapshot(group)?;
        let current = snap
            .state
            .is_some_and(|(rev, p, _)| rev as u64 == epoch && p == me)
            && snap.leader.is_some_and(|(l, m)| l == lease && m == me);
        if !current {
            return Ok(false);
        }
        Ok(self.gw.lease_keep_alive(lease)? > 0)
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
        let _op = self.op.lock().unwrap();
        let (sk, lk) = (self.key(group, "state"), self.key(group, "leader"));
        // `state` at revision `epoch` and `leader` on our lease are exactly
        // what the compares protect; a record that names another primary
        // at that revision cannot exist (a campaign changes the revision).
        // A member to register must be its node's current incarnation.
        let mut cmps = vec![
            cmp_eq("MOD", &sk, "mod_revision", epoch as i64),
            cmp_eq("LEASE", &lk, "lease", lease),
        ];
        if let Some(m) = in_sync {
            match self.current_cmp(group, m)? {
                Some(c) => cmps.push(c),
                None => return Ok(None),
            }
        }
        let resp = self.gw.txn(
            cmps,
            vec![put(
                &sk,
                &format!("{} {}", fmt_member(Some(me)), fmt_member(in_sync)),
                0,
            )],
        )?;
        if !succeeded(&resp) {
            return Ok(None);
        }
        Ok(Some(revision(&resp)?))
    }

    fn resign(&self, group: &str, me: Member, epoch: u64) -> Result<(), CoordError> {
        let Some(lease) = self.leases.lock().unwrap().remove(group) else {
            return Ok(());
        };
        let _op = self.op.lock().unwrap();
        let snap = self.snapshot(group)?;
        if snap
            .state
            .is_some_and(|(rev, p, _)| rev as u64 == epoch && p == me)
        {
            self.gw.lease_revoke(lease)?;
        }
        Ok(())
    }

    fn get(&self, group: &str) -> Result<Option<GroupRecord>, CoordError> {
        Ok(self.snapshot(group)?.record())
    }

    fn retire(&self, group: &str, old: Member, new: u64) -> Result<bool, CoordError> {
        let _op = self.op.lock().unwrap();
        let sk = self.key(group, "state");
        let mk = self.retired_key(group, old);
        // Read, then write only if `state` did not change in between.
        for _ in 0..8 {
            let snap = self.snapshot(group)?;
            let state_cmp = match snap.state {
                Some((_, p, i)) if p == old || i == Some(old) => return Ok(false),
                Some((rev, ..)) => cmp_eq("MOD", &sk, "mod_revision", rev),
                None => cmp_eq("VERSION", &sk, "version", 0),
            };
            let r = self
                .gw
                .txn(vec![state_cmp], vec![put(&mk, &new.to_string(), 0)])?;
            if succeeded(&r) {
                return Ok(true);
            }
        }
        Err(CoordError::Protocol(format!(
            "etcd: the record of {group} kept changing during retire"
        )))
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
        assert!(
            c.set_in_sync("g", mb, e7, Some(fresh)).unwrap().is_some(),
            "a fresh incarnation is registered"
        );
    }
}
