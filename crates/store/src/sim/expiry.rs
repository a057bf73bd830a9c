//! Expiry in the simulation (issue 32): keys written with deadlines and
//! read by every client, one-sided or through a node, across crashes,
//! pauses and failovers, with each node's wall clock off true time by at
//! most [`SimConfig::wall_skew_ms`](super::SimConfig::wall_skew_ms).
//!
//! Each TTL key has one writer (its client), whose deadlines only grow
//! (puts, and `EXPIRE`s that move a value's deadline later: header
//! rewrites), so a key's deadline is at least that of any write to it
//! acknowledged before. Two properties are checked after the run:
//! - **no expired read**: a read never returns a value whose deadline had
//!   passed before the read began (by true time; less the nodes' skew for
//!   a read a node served);
//! - **no early expiry**: a read that finds the key absent did not end
//!   while an acknowledged write's deadline was still more than the
//!   readers' clock bound ([`lookup::CLOCK_BOUND_MS`]) plus the skew away.
//!
//! These keys stay out of the linearizability check (its registers have
//! no timed writes); their puts are ordinary replicated writes otherwise,
//! and the primary reclaims them when they expire.

use super::{key_name, Inflight, Sim, CLOCK_ORIGIN_MS};
use crate::lookup;
use crate::proto::{Cond, ExpireWhen, Modify, Op, Reply, StoreError, Ttl};

/// Key numbers from here on are TTL keys (`ttl-N`).
pub(super) const TTL_KEY_BASE: u64 = 1 << 40;

/// TTL keys per client.
const KEYS_PER_CLIENT: u64 = 2;

/// A TTL put, or an `EXPIRE` that changed its key's deadline (`put`
/// false): its key, deadline, invocation and acknowledgement (`None`:
/// still in flight at the end, maybe applied).
#[derive(Debug, Clone)]
pub(super) struct TtlPut {
    key: u64,
    deadline: u64,
    put: bool,
    call: u64,
    ret: Option<u64>,
}

/// A read of a TTL key: the deadline of the value it returned, if any.
#[derive(Debug, Clone)]
pub(super) struct TtlRead {
    key: u64,
    call: u64,
    ret: u64,
    got: Option<u64>,
    /// Served by one-sided Reads (by the client's exact clock), not by a
    /// node (by its skewed one).
    one_sided: bool,
}

/// The TTL keys' history.
#[derive(Debug, Default)]
pub(super) struct TtlLog {
    puts: Vec<TtlPut>,
    reads: Vec<TtlRead>,
    /// Per key, the last deadline its writer chose.
    last: std::collections::BTreeMap<u64, u64>,
}

/// True time in Unix milliseconds at sim time `t` (what a client's
/// clock reads: the clients' clocks are exact).
pub(super) fn true_ms(t: u64) -> u64 {
    CLOCK_ORIGIN_MS + t / 1000
}

/// Whether key number `k` is a TTL key.
pub(super) fn is_ttl_key(k: u64) -> bool {
    k >= TTL_KEY_BASE
}

impl Sim {
    /// Client `c`'s next operation on a TTL key: a put of one of its own
    /// with a later deadline (30 to 300 ms from now), or a get of anyone's.
    /// Returns the op and its key number.
    pub(super) fn ttl_op(&mut self, c: usize, req_id: u64) -> (Op, u64) {
        let clients = self.clients.len() as u64;
        let id = self.clients[c].id;
        let now_ms = true_ms(self.now);
        if self.rng.percent(50) {
            let k = TTL_KEY_BASE + c as u64 * KEYS_PER_CLIENT + self.rng.range(0, KEYS_PER_CLIENT);
            let last = self.ttl.last.get(&k).copied().unwrap_or(0);
            let deadline = (now_ms + self.rng.range(30, 300)).max(last + 1);
            self.ttl.last.insert(k, deadline);
            // Now and then a later deadline for the value as it is
            // (`EXPIRE`: a header rewrite, `Effect::Retime`).
            if last != 0 && self.rng.percent(30) {
                let how = Modify::Expire {
                    at: deadline,
                    when: ExpireWhen::Always,
                };
                let op = Op::Modify {
                    key: key_name(k),
                    how,
                };
                return (op, k);
            }
            let mut data = Vec::with_capacity(40);
            data.extend_from_slice(&id.to_le_bytes());
            data.extend_from_slice(&req_id.to_le_bytes());
            data.extend_from_slice(&deadline.to_le_bytes());
            data.resize(40, 0xee);
            let op = Op::Put {
                key: key_name(k),
                data: data.into(),
                cond: Cond::Always,
                ttl: Ttl::At(deadline),
            };
            (op, k)
        } else {
            let k = TTL_KEY_BASE + self.rng.range(0, clients * KEYS_PER_CLIENT);
            (Op::Get { key: key_name(k) }, k)
        }
    }

    /// Records client `c`'s finished operation on a TTL key.
    pub(super) fn ttl_record(&mut self, inf: &Inflight, result: &Result<Reply, StoreError>) {
        let k = inf.key_no.expect("a keyed op");
        let given = |s: &mut Sim, deadline: u64, put: bool| {
            s.ttl.puts.push(TtlPut {
                key: k,
                deadline,
                put,
                call: inf.call,
                ret: Some(s.now),
            })
        };
        match (&inf.op, result) {
            (
                Op::Put {
                    ttl: Ttl::At(d), ..
                },
                Ok(Reply::Stored { .. }),
            ) => {
                self.report.ttl_puts += 1;
                given(self, *d, true);
            }
            // `len` 0: the key was gone (expired), nothing changed.
            (
                Op::Modify {
                    how: Modify::Expire { at, .. },
                    ..
                },
                Ok(Reply::Modified { len, .. }),
            ) => {
                if *len == 1 {
                    self.report.ttl_retimes += 1;
                    given(self, *at, false);
                }
            }
            (Op::Get { .. }, Ok(r)) => {
                let got = match r {
                    Reply::Value { data, .. } => Some(deadline_of(data)),
                    _ => None,
                };
                match got {
                    Some(_) => self.report.ttl_reads_found += 1,
                    None => self.report.ttl_reads_absent += 1,
                }
                self.ttl.reads.push(TtlRead {
                    key: k,
                    call: inf.call,
                    ret: self.now,
                    got,
                    one_sided: inf.one_sided,
                });
            }
            (op, r) => self
                .violations
                .push(format!("a TTL key's {op:?} answered {r:?}")),
        }
    }

    /// The two properties of the module's doc; their violations.
    pub(super) fn ttl_check(&self) -> Vec<String> {
        // The nodes' skew, and 2 ms for clocks read in whole milliseconds.
        let skew = self.cfg.wall_skew_ms + 2;
        // Puts and expires still in flight may have been applied.
        let mut in_flight = Vec::new();
        for c in &self.clients {
            let Some(inf) = &c.inflight else { continue };
            let (Some(key), call) = (inf.key_no, inf.call) else {
                continue;
            };
            let (deadline, put) = match &inf.op {
                Op::Put {
                    ttl: Ttl::At(d), ..
                } => (*d, true),
                Op::Modify {
                    how: Modify::Expire { at, .. },
                    ..
                } => (*at, false),
                _ => continue,
            };
            in_flight.push(TtlPut {
                key,
                deadline,
                put,
                call,
                ret: None,
            });
        }
        let all = || self.ttl.puts.iter().chain(&in_flight);
        let mut v = Vec::new();
        for r in &self.ttl.reads {
            match r.got {
                Some(d) => {
                    if !all().any(|p| p.put && p.key == r.key && p.deadline == d) {
                        v.push(format!(
                            "a read of TTL key {} found a value never written",
                            r.key
                        ));
                    }
                    // Its deadline may have been moved later since it was
                    // written (deadlines only grow): the latest one given
                    // by an operation invoked before the read ended.
                    let d = all()
                        .filter(|p| p.key == r.key && p.call < r.ret)
                        .map(|p| p.deadline)
                        .fold(d, u64::max);
                    // A node's clock may lag true time by the skew; a
                    // one-sided reader's (exact here) by nothing.
                    let allowed = if r.one_sided { 0 } else { skew };
                    if d + allowed <= true_ms(r.call) {
                        v.push(format!(
                            "expired read: TTL key {} read at {} ms returned a value whose \
                             deadline was {d}",
                            r.key,
                            true_ms(r.call)
                        ));
                    }
                }
                None => {
                    let ended = true_ms(r.ret);
                    if let Some(p) = self.ttl.puts.iter().find(|p| {
                        p.key == r.key
                            && p.ret.is_some_and(|t| t < r.call)
                            && ended + lookup::CLOCK_BOUND_MS + skew < p.deadline
                    }) {
                        v.push(format!(
                            "early expiry: TTL key {} absent to a read ending at {ended} ms, \
                             acknowledged with deadline {} at {} ms",
                            r.key,
                            p.deadline,
                            true_ms(p.ret.unwrap())
                        ));
                    }
                }
            }
        }
        v
    }
}

/// The deadline a TTL key's value carries (bytes 16..24).
fn deadline_of(data: &[u8]) -> u64 {
    data.get(16..24)
        .map_or(0, |b| u64::from_le_bytes(b.try_into().unwrap()))
}
