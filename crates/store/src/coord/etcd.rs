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
//! The operator's calls ([`Coordinator::promote`], [`Coordinator::reset`])
//! compare that `leader` is absent (no lease held) and that `state` did
//! not change since it was read: a promotion puts `"<m> -"`, a reset
//! deletes `state` and writes the retirement keys of the members it named
//! (the next record's `mod_revision` is still above every earlier one).
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

use super::{Campaign, CoordError, Coordinator, GroupRecord, Override};
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

fn delete(key: &str) -> Value {
    json!({ "request_delete_range": { "key": b64(key) } })
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

    fn promote(&self, group: &str, m: Member) -> Result<Override, CoordError> {
        let _op = self.op.lock().unwrap();
        let (sk, lk) = (self.key(group, "state"), self.key(group, "leader"));
        for _ in 0..8 {
            let snap = self.snapshot(group)?;
            if let Some(held) = lease_held(&snap, group)? {
                return Ok(held);
            }
            let Some(m_cmp) = self.current_cmp(group, m)? else {
                return Ok(Override::Retired);
            };
            let state_cmp = match snap.state {
                Some((rev, ..)) => cmp_eq("MOD", &sk, "mod_revision", rev),
                None => cmp_eq("VERSION", &sk, "version", 0),
            };
            let r = self.gw.txn(
                vec![state_cmp, cmp_eq("VERSION", &lk, "version", 0), m_cmp],
                vec![put(&sk, &format!("{} -", fmt_member(Some(m))), 0)],
            )?;
            if succeeded(&r) {
                return Ok(Override::Done {
                    record: Some(GroupRecord {
                        epoch: revision(&r)?,
                        primary: m,
                        in_sync: None,
                        lease_held: false,
                    }),
                });
            }
        }
        Err(CoordError::Protocol(format!(
            "etcd: the record of {group} kept changing during promote"
        )))
    }

    fn reset(&self, group: &str) -> Result<Override, CoordError> {
        let _op = self.op.lock().unwrap();
        let (sk, lk) = (self.key(group, "state"), self.key(group, "leader"));
        for _ in 0..8 {
            let snap = self.snapshot(group)?;
            if let Some(held) = lease_held(&snap, group)? {
                return Ok(held);
            }
            let Some((rev, p, i)) = snap.state else {
                return Ok(Override::Done { record: None });
            };
            let mut ops = vec![delete(&sk)];
            for m in [Some(p), i].into_iter().flatten() {
                ops.push(put(&self.retired_key(group, m), "reset", 0));
            }
            let r = self.gw.txn(
                vec![
                    cmp_eq("MOD", &sk, "mod_revision", rev),
                    cmp_eq("VERSION", &lk, "version", 0),
                ],
                ops,
            )?;
            if succeeded(&r) {
                return Ok(Override::Done {
                    record: snap.record(),
                });
            }
        }
        Err(CoordError::Protocol(format!(
            "etcd: the record of {group} kept changing during reset"
        )))
    }
}

/// The refusal of an operator call while `leader` exists (a lease runs).
fn lease_held(snap: &Snapshot, group: &str) -> Result<Option<Override>, CoordError> {
    if snap.leader.is_none() {
        return Ok(None);
    }
    match snap.record() {
        Some(record) => Ok(Some(Override::LeaseHeld {
            record: GroupRecord {
                lease_held: true,
                ..record
            },
        })),
        None => Err(CoordError::Protocol(format!(
            "etcd: {group} has a lease but no record"
        ))),
    }
}

#[cfg(test)]
#[path = "etcd_tests.rs"]
mod tests;
