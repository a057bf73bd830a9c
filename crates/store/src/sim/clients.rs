//! The workload: clients that insert, update, delete and read objects and
//! keys (and swap and take keys' values: `GETSET`, `GETDEL`), one-sided
//! where they may, retry on the other node when an answer
//! is late, and record every operation in the checked history.

use super::{
    key_name, key_no, other, tag_of, Ent, Event, Inflight, Obj, OneSided, Payload, Sim,
    CLIENT_TIMEOUT, KEY_OID,
};
use crate::index::Layout;
use crate::lincheck::{self, Kind};
use crate::lookup::{Lookup, Outcome, Step};
use crate::object;
use crate::proto::{self, Body, Cond, Envelope, Modify, NodeId, Op, Reply, StoreError, Ttl};
use crate::ptr::RemotePtr;

impl Sim {
    fn client_send(&mut self, c: usize) {
        let cl = &mut self.clients[c];
        let inf = cl.inflight.as_ref().expect("in flight");
        let env = Envelope {
            epoch: cl.epoch,
            body: Body::Request {
                client: cl.id,
                req_id: inf.req_id,
                op: inf.op.clone(),
            },
        };
        let (id, target) = (cl.id, cl.target);
        cl.token += 1;
        let token = cl.token;
        if let Some(i) = cl.inflight.as_mut() {
            i.switch_on_wake = true;
        }
        self.transmit(
            Ent::Client(id),
            Ent::Node(target),
            Payload::Msg(proto::encode(&env)),
        );
        self.schedule(self.now + CLIENT_TIMEOUT, Event::ClientWake(c, token));
    }

    fn client_next(&mut self, c: usize) {
        let max_value = self.cfg.max_value as u64;
        let max_objects = self.cfg.max_objects;
        let ops = self.cfg.ops_per_client;
        let shared = self.cfg.shared_reads_percent;
        if self.clients[c].done >= ops {
            return;
        }
        // Another client's object, sometimes.
        let others: Vec<usize> = (0..self.clients.len())
            .filter(|&o| o != c && !self.clients[o].objects.is_empty())
            .collect();
        let shared_read = !others.is_empty() && self.rng.range(0, 100) < shared;
        let foreign = if shared_read {
            let o = others[self.rng.range(0, others.len() as u64) as usize];
            let objs = &self.clients[o].objects;
            let k = self.rng.range(0, objs.len() as u64) as usize;
            Some((objs[k].ptr, objs[k].oid))
        } else {
            None
        };
        let now = self.now;
        let rng = &mut self.rng;
        let cl = &mut self.clients[c];
        cl.next_req += 1;
        let req_id = cl.next_req;
        let len = rng.range(16, max_value) as usize;
        let mut value = Vec::with_capacity(len);
        value.extend_from_slice(&cl.id.to_le_bytes());
        value.extend_from_slice(&req_id.to_le_bytes());
        while value.len() < len {
            value.push(rng.next_u64() as u8);
        }
        let n = cl.objects.len();
        let dice = rng.range(0, 100);
        let keyed = !shared_read && rng.range(0, 100) < self.cfg.keyed_percent;
        let ttl = keyed && self.cfg.ttl_percent > 0 && rng.percent(self.cfg.ttl_percent);
        if keyed {
            let k = rng.range(0, self.cfg.keys);
            let key = key_name(k);
            let (op, k) = if ttl {
                self.ttl_op(c, req_id)
            } else {
                let op = match dice {
                    0..40 => Op::Put {
                        key,
                        data: value.into(),
                        cond: Cond::Always,
                        ttl: Ttl::Clear,
                    },
                    40..50 => Op::Put {
                        key,
                        data: value.into(),
                        cond: Cond::IfAbsent,
                        ttl: Ttl::Clear,
                    },
                    50..60 => Op::Put {
                        key,
                        data: value.into(),
                        cond: Cond::IfPresent,
                        ttl: Ttl::Clear,
                    },
                    60..72 => Op::Remove { key },
                    // Read-modify-writes (issue 32): GETSET and GETDEL.
                    72..80 => Op::Modify {
                        key,
                        how: Modify::Swap {
                            data: value.into(),
                            cond: Cond::Always,
                            ttl: Ttl::Clear,
                        },
                    },
                    80..84 => Op::Modify {
                        key,
                        how: Modify::Take,
                    },
                    // MSET (issue 32): two keys' puts as one replicated
                    // batch; the second value's tag is the request's with bit
                    // 31 set.
                    84..90 if self.cfg.batches => {
                        let k2 = (k + 1 + rng.range(0, self.cfg.keys.max(2) - 1)) % self.cfg.keys;
                        let mut v2 = value.clone();
                        v2[8..16].copy_from_slice(&(req_id | 1 << 31).to_le_bytes());
                        for (kk, v) in [(k, &value), (k2, &v2)] {
                            if let Some(t) = tag_of(v) {
                                self.tag_key.insert(t, KEY_OID + kk);
                            }
                        }
                        Op::Batch {
                            ops: vec![
                                Op::Put {
                                    key,
                                    data: value.into(),
                                    cond: Cond::Always,
                                    ttl: Ttl::Clear,
                                },
                                Op::Put {
                                    key: key_name(k2),
                                    data: v2.into(),
                                    cond: Cond::Always,
                                    ttl: Ttl::Clear,
                                },
                            ],
                            all_or_none: false,
                        }
                    }
                    _ => Op::Get { key },
                };
                (op, k)
            };
            if let Op::Put { data, .. }
            | Op::Modify {
                how: Modify::Swap { data, .. },
                ..
            } = &op
            {
                if let Some(t) = tag_of(data) {
                    self.tag_key.insert(t, KEY_OID + k);
                }
            }
            let cached = self.clients[c].cache.get(&k).copied();
            let one_sided = matches!(op, Op::Get { .. }) && self.cfg.one_sided_reads;
            let lookup = one_sided.then(|| {
                let layout = Layout::for_arena(self.arena.len, self.cfg.index_buckets);
                match Lookup::start(&key_name(k), layout, cached) {
                    (l, Step::Read { offset, len }) => (l, (offset, len)),
                    (_, Step::Done(_)) => unreachable!("a look-up starts with a read"),
                }
            });
            self.clients[c].inflight = Some(Inflight {
                req_id,
                op,
                obj: None,
                switch_on_wake: true,
                call: now,
                read_oid: None,
                one_sided,
                torn: 0,
                key_no: Some(k),
                lookup,
                cached: cached.is_some(),
            });
            if one_sided {
                self.read_one_sided(c);
            } else {
                self.client_send(c);
            }
            return;
        }
        let (op, obj, read_oid) = if let Some((ptr, oid)) = foreign {
            (Op::Read { ptr }, None, Some(oid))
        } else if n == 0 || (dice < 35 && n < max_objects) {
            (Op::Insert { data: value.into() }, None, None)
        } else {
            let i = rng.range(0, n as u64) as usize;
            let (ptr, oid) = (cl.objects[i].ptr, cl.objects[i].oid);
            if dice < 65 {
                if let Some(t) = tag_of(&value) {
                    self.tag_key.insert(t, oid);
                }
                if object::encoded_len(0, value.len()) as u64 > ptr.len as u64 {
                    let u = self.unstable.entry(oid).or_insert(now);
                    *u = (*u).min(now);
                }
                (
                    Op::Update {
                        ptr,
                        data: value.into(),
                    },
                    Some(i),
                    None,
                )
            } else if dice < 80 {
                let u = self.unstable.entry(oid).or_insert(now);
                *u = (*u).min(now);
                (Op::Delete { ptr }, Some(i), None)
            } else {
                (Op::Read { ptr }, Some(i), Some(oid))
            }
        };
        let one_sided = matches!(op, Op::Read { .. }) && self.cfg.one_sided_reads;
        let cl = &mut self.clients[c];
        cl.inflight = Some(Inflight {
            req_id,
            op,
            obj,
            switch_on_wake: true,
            call: now,
            read_oid,
            one_sided,
            torn: 0,
            key_no: None,
            lookup: None,
            cached: false,
        });
        if one_sided {
            self.read_one_sided(c);
        } else {
            self.client_send(c);
        }
    }

    /// Sends the in-flight read of client `c` as a one-sided RDMA Read to
    /// its target node.
    fn read_one_sided(&mut self, c: usize) {
        let base = self.arena.base;
        let cl = &mut self.clients[c];
        let read = match cl.inflight.as_ref() {
            Some(Inflight {
                op: Op::Read { ptr },
                ..
            }) => (ptr.addr - base, ptr.len),
            Some(Inflight {
                lookup: Some((_, at)),
                ..
            }) => *at,
            _ => unreachable!("a one-sided read in flight"),
        };
        cl.token += 1;
        let (token, mut n) = (cl.token, cl.target);
        let from = Ent::Client(cl.id);
        // Now and then a read goes to the other node, as from a client
        // that has not been redirected yet (or one that only reads).
        if self.rng.range(0, 100) < 30 {
            n = other(n);
        }
        // Same queue pair as the client's requests: FIFO with them.
        let at = self.now + self.delay();
        let last = self.channel_last.entry((from, Ent::Node(n))).or_insert(0);
        let at = at.max(*last);
        *last = at;
        let gens = (0, self.gen_of(Ent::Node(n)));
        self.schedule(
            at,
            Event::ReadArrive {
                c,
                n,
                gens,
                token,
                at: read,
            },
        );
        self.schedule(self.now + CLIENT_TIMEOUT, Event::ClientWake(c, token));
    }

    /// A one-sided read at node `n`: the engine serves it from the node's
    /// memory while the node's deadline (on the node's clock) allows.
    pub(super) fn read_arrive(
        &mut self,
        c: usize,
        n: NodeId,
        gens: (u64, u64),
        token: u64,
        read: (u64, u32),
    ) {
        let alive = self.nodes.contains_key(&n) && gens.1 == self.gen_of(Ent::Node(n));
        let valid = alive
            && self
                .reads_until
                .get(&n)
                .copied()
                .flatten()
                .is_some_and(|u| self.node_now(n) < u);
        let outcome = if !valid {
            OneSided::Refused
        } else {
            // The engine refuses a read outside the registered arena.
            let mem = self.nodes[&n].memory().bytes();
            let (off, len) = (read.0 as usize, read.1 as usize);
            match mem.get(off..off.saturating_add(len)) {
                Some(b) => OneSided::Bytes(b.to_vec()),
                None => OneSided::Refused,
            }
        };
        let at = self.now + self.delay();
        self.schedule(at, Event::ReadDone { c, token, outcome });
    }

    pub(super) fn read_done(&mut self, c: usize, token: u64, outcome: OneSided) {
        let cl = &mut self.clients[c];
        if cl.token != token {
            return;
        }
        let Some(inf) = cl.inflight.clone() else {
            return;
        };
        if let (Some((mut l, _)), OneSided::Bytes(bytes)) = (inf.lookup.clone(), &outcome) {
            return self.lookup_step(c, inf, &mut l, bytes);
        }
        let decoded = match &outcome {
            OneSided::Bytes(b) => {
                Some(object::decode_exact(b).map(|o| (o.generation, o.data.to_vec())))
            }
            OneSided::Refused => None,
        };
        let gen = match &inf.op {
            Op::Read { ptr } => ptr.gen,
            _ => 0,
        };
        match decoded {
            // As the real client: another object's generation there is a
            // stale pointer (finding 3), answered without the node.
            Some(Ok((g, _))) if g != gen => {
                self.report.one_sided_reads += 1;
                self.complete(c, &inf, Err(StoreError::StalePointer { expected: gen }));
            }
            Some(Ok((_, data))) => {
                self.report.one_sided_reads += 1;
                self.complete(c, &inf, Ok(Reply::Data { version: 0, data }));
            }
            Some(Err(object::ObjectError::Torn)) if inf.torn < 3 => {
                if let Some(i) = self.clients[c].inflight.as_mut() {
                    i.torn += 1;
                }
                self.read_one_sided(c);
            }
            _ => {
                // As the real client: ask the node instead.
                self.report.refused_reads += 1;
                if let Some(i) = self.clients[c].inflight.as_mut() {
                    i.one_sided = false;
                    i.lookup = None;
                }
                self.client_send(c);
            }
        }
    }

    /// A keyed get's look-up got the bytes of its last read.
    fn lookup_step(&mut self, c: usize, inf: Inflight, l: &mut Lookup, bytes: &[u8]) {
        let k = inf.key_no.expect("a keyed get");
        let restarts = l.restarts();
        let step = l.on_read(bytes);
        self.report.lookup_restarts += (l.restarts() - restarts) as u64;
        let base = self.arena.base;
        let stag = self.arena.stag;
        match step {
            Step::Read { offset, len } => {
                if let Some(i) = self.clients[c].inflight.as_mut() {
                    i.lookup = Some((l.clone(), (offset, len)));
                }
                self.read_one_sided(c);
            }
            // Expired by this client's clock, allowing for the primary's
            // lead (`lookup::live`): absent, as the real client reads it.
            Step::Done(Outcome::Found { deadline, .. })
                if !crate::lookup::live(deadline, super::expiry::true_ms(self.now)) =>
            {
                self.report.one_sided_reads += 1;
                self.report.keyed_one_sided += 1;
                self.complete(c, &inf, Ok(Reply::NoKey));
            }
            Step::Done(Outcome::Found {
                offset,
                len,
                generation,
                version,
                data,
                deadline: _,
                ..
            }) => {
                self.report.one_sided_reads += 1;
                self.report.keyed_one_sided += 1;
                if inf.cached && l.reads() == 1 {
                    self.report.cache_hits += 1;
                }
                self.clients[c].cache.insert(k, (offset, len));
                let ptr = RemotePtr {
                    addr: base + offset,
                    stag,
                    len,
                    gen: generation,
                };
                self.complete(
                    c,
                    &inf,
                    Ok(Reply::Value {
                        ptr,
                        generation,
                        version,
                        data,
                    }),
                );
            }
            Step::Done(Outcome::Absent) => {
                self.report.one_sided_reads += 1;
                self.report.keyed_one_sided += 1;
                self.clients[c].cache.remove(&k);
                self.complete(c, &inf, Ok(Reply::NoKey));
            }
            Step::Done(Outcome::GaveUp) => {
                self.report.lookup_fallbacks += 1;
                if let Some(i) = self.clients[c].inflight.as_mut() {
                    i.one_sided = false;
                    i.lookup = None;
                }
                self.client_send(c);
            }
        }
    }

    pub(super) fn client_wake(&mut self, c: usize, token: u64) {
        let cl = &mut self.clients[c];
        if cl.token != token {
            return;
        }
        match &mut cl.inflight {
            None => self.client_next(c),
            Some(i) => {
                if i.switch_on_wake || i.one_sided {
                    cl.target = other(cl.target);
                }
                i.one_sided = false;
                i.lookup = None;
                self.report.retries += 1;
                self.client_send(c);
            }
        }
    }

    pub(super) fn client_receive(&mut self, c: usize, from: NodeId, env: Envelope) {
        let cl = &mut self.clients[c];
        cl.epoch = cl.epoch.max(env.epoch);
        let Body::Response { req_id, result } = env.body else {
            return;
        };
        let Some(inf) = cl.inflight.clone() else {
            return;
        };
        if inf.req_id != req_id || inf.one_sided {
            return;
        }
        match result {
            Err(StoreError::StaleEpoch { .. }) => {
                if cl.target == from {
                    self.client_send(c);
                }
            }
            Err(StoreError::NotEnoughReplicas) => {
                // Refused, nothing changed (min_in_sync 1 while the group
                // is not redundant): try again a little later.
                self.report.refused_writes += 1;
                cl.token += 1;
                let token = cl.token;
                if let Some(i) = cl.inflight.as_mut() {
                    i.switch_on_wake = false;
                }
                self.schedule(self.now + 5_000, Event::ClientWake(c, token));
            }
            Err(StoreError::NotPrimary { primary }) => {
                cl.target = match primary {
                    Some(p) if p != from => p,
                    _ => other(from),
                };
                cl.token += 1;
                let token = cl.token;
                if let Some(i) = cl.inflight.as_mut() {
                    i.switch_on_wake = false;
                }
                self.schedule(self.now + 1_000, Event::ClientWake(c, token));
            }
            r => self.complete(c, &inf, r),
        }
    }

    /// Client `c`'s operation `inf` finished with `result`.
    fn complete(&mut self, c: usize, inf: &Inflight, result: Result<Reply, StoreError>) {
        self.record(c, inf, &result);
        match result {
            Ok(reply) => self.apply_reply(c, inf, reply),
            // Reads of another client's object may find it gone.
            Err(_) if inf.obj.is_none() && inf.read_oid.is_some() => {}
            Err(e) => self
                .violations
                .push(format!("client {c}: {:?} failed: {e}", inf.op)),
        }
        let cl = &mut self.clients[c];
        cl.inflight = None;
        cl.done += 1;
        self.report.acked_ops += 1;
        cl.token += 1;
        let token = cl.token;
        let at = self.now + self.rng.range(0, 2_000);
        self.schedule(at, Event::ClientWake(c, token));
    }

    /// Adds client `c`'s finished operation to the history.
    fn record(&mut self, c: usize, inf: &Inflight, result: &Result<Reply, StoreError>) {
        if inf.key_no.is_some_and(super::expiry::is_ttl_key) {
            return self.ttl_record(inf, result);
        }
        let client = self.clients[c].id;
        let now = self.now;
        // A batch's puts: each a put of its key, at the batch's instants.
        if let (Op::Batch { ops, .. }, Ok(Reply::Batch(replies))) = (&inf.op, result) {
            if ops.len() != replies.len() {
                self.violations.push(format!(
                    "client {c}: a batch of {} writes answered {} replies",
                    ops.len(),
                    replies.len()
                ));
                return;
            }
            self.report.batches += 1;
            for (op, r) in ops.iter().zip(replies) {
                let (Op::Put { key, data, .. }, Reply::Stored { created, .. }) = (op, r) else {
                    self.violations
                        .push(format!("client {c}: a batched {op:?} answered {r:?}"));
                    continue;
                };
                self.history.push(lincheck::Op {
                    key: KEY_OID + key_no(key),
                    client,
                    call: inf.call,
                    ret: Some(now),
                    kind: Kind::Swap {
                        was: !*created,
                        to: tag_of(data),
                    },
                });
            }
            return;
        }
        let (key, kind) = match (&inf.op, result) {
            (Op::Insert { data }, Ok(Reply::Inserted(_))) => {
                // The key is made when the insert is acknowledged.
                self.next_oid += 1;
                if let Some(t) = tag_of(data) {
                    self.tag_key.insert(t, self.next_oid);
                }
                (self.next_oid, Kind::Write(tag_of(data)))
            }
            (Op::Update { data, .. }, Ok(_)) => {
                let o = &self.clients[c].objects[inf.obj.unwrap()];
                (o.oid, Kind::Write(tag_of(data)))
            }
            (Op::Delete { .. }, Ok(_)) => {
                let o = &self.clients[c].objects[inf.obj.unwrap()];
                (o.oid, Kind::Write(None))
            }
            // A keyed write's answer also says what it saw: whether the
            // put created the key, whether the remove found it, and a
            // refused condition that the key was there (NX) or not (XX).
            // Each is checked as a read of the key's presence, at the
            // write's instant (`lincheck::Kind::Swap` and `Present`).
            (Op::Put { data, cond, .. }, Ok(Reply::Stored { created, .. })) => {
                let was = !*created;
                if (*cond == Cond::IfAbsent && was) || (*cond == Cond::IfPresent && !was) {
                    self.violations.push(format!(
                        "client {c}: {cond:?} put stored with created = {created}"
                    ));
                }
                let to = tag_of(data);
                (KEY_OID + inf.key_no.unwrap(), Kind::Swap { was, to })
            }
            (Op::Put { cond, .. }, Ok(Reply::NotStored)) => {
                let present = match cond {
                    Cond::IfAbsent => true,
                    Cond::IfPresent => false,
                    Cond::Always => {
                        self.violations
                            .push(format!("client {c}: an unconditional put was not stored"));
                        return;
                    }
                };
                (KEY_OID + inf.key_no.unwrap(), Kind::Present(present))
            }
            (Op::Remove { .. }, Ok(Reply::Removed { existed })) => {
                let was = *existed;
                (KEY_OID + inf.key_no.unwrap(), Kind::Swap { was, to: None })
            }
            // A read-modify-write's answer is the value it replaced.
            (Op::Modify { how, .. }, Ok(Reply::Modified { value, .. })) => {
                let was = value.as_deref().and_then(tag_of);
                if value.as_ref().is_some_and(|v| tag_of(v).is_none()) {
                    self.violations.push(format!(
                        "client {c}: a GETSET answered a value no client wrote"
                    ));
                    return;
                }
                let to = match how {
                    Modify::Swap { data, .. } => tag_of(data),
                    _ => None,
                };
                (KEY_OID + inf.key_no.unwrap(), Kind::Exchange { was, to })
            }
            (Op::Get { .. }, Ok(Reply::Value { data, .. })) => {
                (KEY_OID + inf.key_no.unwrap(), Kind::Read(tag_of(data)))
            }
            (Op::Get { .. }, Ok(Reply::NoKey)) => (KEY_OID + inf.key_no.unwrap(), Kind::Read(None)),
            (Op::Read { .. }, r) => {
                let oid = inf.read_oid.expect("reads name their object");
                let seen = match r {
                    Ok(Reply::Data { data, .. }) => tag_of(data),
                    _ => None,
                };
                // Through a pointer the object has since left (moved or
                // deleted), a read finds nothing: never another object's
                // bytes (the pointer's generation; issue 29, finding 3).
                let moved = self.unstable.get(&oid).is_some_and(|&u| u <= now);
                let ours = |t: u64| self.tag_key.get(&t) == Some(&oid);
                if let Some(t) = seen.filter(|&t| !ours(t)) {
                    self.violations.push(format!(
                        "client {c}: a read of object {oid} returned another object's value \
                         (tag {t})"
                    ));
                    return;
                }
                if moved && seen.is_none() {
                    return;
                }
                (oid, Kind::Read(seen))
            }
            _ => return,
        };
        self.history.push(lincheck::Op {
            key,
            client,
            call: inf.call,
            ret: Some(now),
            kind,
        });
    }

    fn apply_reply(&mut self, c: usize, inf: &Inflight, reply: Reply) {
        let oid = self.next_oid;
        let cl = &mut self.clients[c];
        match (&inf.op, reply) {
            (Op::Insert { data }, Reply::Inserted(ptr)) => cl.objects.push(Obj {
                ptr,
                data: data.to_vec(),
                oid,
            }),
            (Op::Update { data, .. }, Reply::Updated(ptr)) => {
                let o = &mut cl.objects[inf.obj.unwrap()];
                o.ptr = ptr;
                o.data = data.to_vec();
            }
            (Op::Delete { .. }, Reply::Deleted) => {
                let o = cl.objects.swap_remove(inf.obj.unwrap());
                cl.deleted.push((o.ptr, o.data));
            }
            (Op::Read { .. }, Reply::Data { .. }) => {}
            (Op::Put { .. }, Reply::Stored { ptr, .. }) => {
                let k = inf.key_no.unwrap();
                cl.cache.insert(k, (ptr.addr - self.arena.base, ptr.len));
            }
            (Op::Get { .. }, Reply::Value { ptr, .. }) => {
                let k = inf.key_no.unwrap();
                cl.cache.insert(k, (ptr.addr - self.arena.base, ptr.len));
            }
            (Op::Put { .. }, Reply::NotStored)
            | (Op::Batch { .. }, Reply::Batch(_))
            | (Op::Modify { .. }, Reply::Modified { .. })
            | (Op::Remove { .. }, Reply::Removed { .. })
            | (Op::Get { .. }, Reply::NoKey) => {}
            (op, r) => self
                .violations
                .push(format!("client {c}: {op:?} answered with {r:?}")),
        }
    }
}
