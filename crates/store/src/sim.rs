//! Deterministic simulation of a replica group.
//!
//! Two [`Node`]s (over [`HeapMemory`], since both "map" the arena at the same
//! address in one process), a simulated coordinator ([`LeaseTable`]) and a
//! few clients exchange messages through a simulated network driven by one
//! seeded random number generator and a virtual clock, so a failing seed
//! replays exactly.
//!
//! The network does what the real transport may do and nothing else: each
//! connection (ordered pair of parties) is reliable and in order, with random
//! delays (occasionally long stalls, which provoke false failure suspicion);
//! different connections are not ordered with respect to each other; a crash
//! drops everything in flight to or from the crashed node. Every message
//! goes through the binary codec.
//!
//! Faults: nodes crash at random points (never both copies of the data at
//! once: a crash is only injected while the other node is the coordinator's
//! primary or in-sync secondary) and restart empty, with garbage in their
//! arena, under a new incarnation; they rejoin and re-sync. Clients retry a
//! request on the other node when an answer is late.
//!
//! Checks, once the crash phase is over and the group is quiescent: every
//! acknowledged write reads back exactly, no deleted object is resurrected,
//! no object leaked (retries applied once), reads during the run returned
//! the last acknowledged value, both arenas, allocators and retry tables are
//! identical, and no secondary ever failed to apply a forwarded write.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use crate::arena::HeapMemory;
use crate::coord::LeaseTable;
use crate::node::{Addr, CoordReply, CoordRequest, Input, Micros, Node, NodeConfig, Output, Role};
use crate::object;
use crate::proto::{self, Body, Envelope, Member, NodeId, Op, Reply, StoreError};
use crate::ptr::{ArenaRef, RemotePtr};

/// SplitMix64: tiny, seedable, portable.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from a seed.
    pub fn new(seed: u64) -> Rng {
        Rng(seed ^ 0x5851_f42d_4c95_7f2d)
    }
    /// Next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    /// Uniform in `lo..hi` (`hi > lo`).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        assert!(hi > lo);
        lo + self.next_u64() % (hi - lo)
    }
    /// True with probability `p` percent.
    pub fn percent(&mut self, p: u64) -> bool {
        self.range(0, 100) < p
    }
}

/// Simulation parameters.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Concurrent clients.
    pub clients: usize,
    /// Operations per client.
    pub ops_per_client: usize,
    /// Inject crashes and long network stalls.
    pub faults: bool,
    /// Arena size.
    pub arena_len: u64,
    /// Largest value.
    pub max_value: usize,
    /// Live objects per client at most (keeps the arena from filling).
    pub max_objects: usize,
    /// Give up (failure) after this much virtual time.
    pub time_limit: Micros,
    /// Per mille of primary -> secondary `Replicate` messages dropped, as a
    /// link that breaks and is re-dialed drops what was in flight on it.
    pub drop_replicate_permille: u64,
    /// Per mille of recovery chunks (`SyncChunk`) lost, as when the
    /// primary refuses the joiner's RDMA Read of its arena (its STag is
    /// disabled until a new primary's first lease renewal) and the link
    /// breaks.
    pub drop_sync_chunk_permille: u64,
}

impl Default for SimConfig {
    fn default() -> SimConfig {
        SimConfig {
            clients: 3,
            ops_per_client: 150,
            faults: true,
            arena_len: 256 << 10,
            max_value: 300,
            max_objects: 40,
            time_limit: 60_000_000,
            drop_replicate_permille: 0,
            drop_sync_chunk_permille: 0,
        }
    }
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct SimReport {
    /// Acknowledged client operations.
    pub acked_ops: u64,
    /// Node crashes injected.
    pub crashes: u64,
    /// Distinct primaries elected (epochs won by campaign).
    pub elections: u64,
    /// Client retries (timeouts and redirects).
    pub retries: u64,
    /// Messages delivered.
    pub messages: u64,
    /// Virtual time at the end.
    pub end_time: Micros,
    /// `Replicate` messages the network dropped.
    pub dropped_replicates: u64,
    /// Times a secondary noticed a lost `Replicate` and re-synchronised.
    pub repaired_losses: u64,
    /// `SyncChunk` messages the network dropped.
    pub dropped_chunks: u64,
}

const HEARTBEAT: Micros = 5_000;
const TIMEOUT: Micros = 25_000;
const LEASE: Micros = 20_000;
const TICK: Micros = 1_000;
const CLIENT_TIMEOUT: Micros = 40_000;
const NODE_IDS: [NodeId; 2] = [1, 2];

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
enum Ent {
    Node(NodeId),
    Client(u64),
    Coord,
}

#[derive(Debug)]
enum Payload {
    Msg(Vec<u8>),
    CoordReq {
        id: u64,
        member: Member,
        req: CoordRequest,
    },
    CoordRep {
        id: u64,
        reply: CoordReply,
    },
}

#[derive(Debug)]
enum Event {
    Deliver {
        from: Ent,
        to: Ent,
        gens: (u64, u64),
        payload: Payload,
    },
    Tick(NodeId, u64),
    ClientWake(usize, u64),
    Crash,
    Restart(NodeId),
}

#[derive(Debug, Clone)]
struct Obj {
    ptr: RemotePtr,
    data: Vec<u8>,
}

#[derive(Debug, Clone)]
struct Inflight {
    req_id: u64,
    op: Op,
    obj: Option<usize>,
    switch_on_wake: bool,
}

#[derive(Debug)]
struct Client {
    id: u64,
    epoch: u64,
    target: NodeId,
    next_req: u64,
    inflight: Option<Inflight>,
    done: usize,
    objects: Vec<Obj>,
    deleted: Vec<(RemotePtr, Vec<u8>)>,
    token: u64,
}

struct Sim {
    cfg: SimConfig,
    rng: Rng,
    now: Micros,
    seq: u64,
    queue: BinaryHeap<Reverse<(Micros, u64, usize)>>,
    events: BTreeMap<usize, Event>,
    next_event: usize,
    channel_last: BTreeMap<(Ent, Ent), Micros>,
    nodes: BTreeMap<NodeId, Node<HeapMemory>>,
    gen: BTreeMap<NodeId, u64>,
    coord: LeaseTable,
    clients: Vec<Client>,
    arena: ArenaRef,
    crash_phase_over: bool,
    divergences: u64,
    violations: Vec<String>,
    report: SimReport,
    trace: bool,
}

fn summarize(i: &Input) -> String {
    match i {
        Input::Tick => String::new(),
        Input::Coord { reply, .. } => format!("coord {reply:?}"),
        Input::Message { from, env } => match &env.body {
            Body::Request { .. }
            | Body::Heartbeat
            | Body::SyncChunk { .. }
            | Body::SyncRequest { .. } => String::new(),
            Body::Replicate { seq, .. } => format!("from {from:?} e{} Replicate {seq}", env.epoch),
            b => format!("from {from:?} e{} {b:?}", env.epoch),
        },
    }
}

fn other(n: NodeId) -> NodeId {
    if n == 1 {
        2
    } else {
        1
    }
}

impl Sim {
    fn schedule(&mut self, at: Micros, ev: Event) {
        let id = self.next_event;
        self.next_event += 1;
        self.seq += 1;
        self.events.insert(id, ev);
        self.queue.push(Reverse((at, self.seq, id)));
    }

    fn gen_of(&self, e: Ent) -> u64 {
        match e {
            Ent::Node(n) => self.gen[&n],
            _ => 0,
        }
    }

    fn alive(&self, e: Ent) -> bool {
        match e {
            Ent::Node(n) => self.nodes.contains_key(&n),
            _ => true,
        }
    }

    fn delay(&mut self) -> Micros {
        let r = self.rng.range(0, 1000);
        if !self.cfg.faults || r < 950 {
            self.rng.range(20, 400)
        } else if r < 995 {
            self.rng.range(400, 5_000)
        } else {
            self.rng.range(5_000, 40_000)
        }
    }

    fn transmit(&mut self, from: Ent, to: Ent, payload: Payload) {
        if !self.alive(from) || !self.alive(to) {
            return;
        }
        let at = self.now + self.delay();
        let last = self.channel_last.entry((from, to)).or_insert(0);
        let at = at.max(*last);
        *last = at;
        let gens = (self.gen_of(from), self.gen_of(to));
        self.schedule(
            at,
            Event::Deliver {
                from,
                to,
                gens,
                payload,
            },
        );
    }

    fn node_config(&self, n: NodeId, incarnation: u64) -> NodeConfig {
        NodeConfig {
            member: Member {
                node: n,
                incarnation,
            },
            arena: self.arena,
            heartbeat_interval: HEARTBEAT,
            heartbeat_timeout: TIMEOUT,
            lease_ttl: LEASE,
            sync_chunk: 16 << 10,
            sync_window: 4,
        }
    }

    fn start_node(&mut self, n: NodeId) {
        let mut garbage = vec![0u8; self.arena.len as usize];
        for chunk in garbage.chunks_mut(8) {
            let r = self.rng.next_u64().to_le_bytes();
            chunk.copy_from_slice(&r[..chunk.len()]);
        }
        let inc = self.rng.next_u64();
        let cfg = self.node_config(n, inc);
        self.nodes
            .insert(n, Node::new(cfg, HeapMemory::from_bytes(garbage)));
        *self.gen.entry(n).or_insert(0) += 1;
        let g = self.gen[&n];
        let at = self.now + self.rng.range(0, TICK);
        self.schedule(at, Event::Tick(n, g));
    }

    fn feed(&mut self, n: NodeId, input: Input) {
        let Some(node) = self.nodes.get_mut(&n) else {
            return;
        };
        let before = node.role();
        let summary = if self.trace {
            Some(summarize(&input))
        } else {
            None
        };
        let outs = node.handle(self.now, input);
        let after = node.role();
        if let Some(sm) = summary.filter(|s| !s.is_empty()) {
            eprintln!(
                "{:>9} n{n} {:?}->{:?} e{} a{} {sm}",
                self.now,
                before,
                after,
                node.epoch(),
                node.applied_seq()
            );
        }
        if after == Role::Primary && before != Role::Primary {
            self.report.elections += 1;
        }
        let member = node.member();
        for o in outs {
            match o {
                Output::Send { to, env } => {
                    if let (Addr::Node(_), Body::Replicate { .. }) = (to, &env.body) {
                        let p = self.cfg.drop_replicate_permille;
                        if p > 0 && self.rng.range(0, 1000) < p {
                            self.report.dropped_replicates += 1;
                            continue;
                        }
                    }
                    if let (Addr::Node(_), Body::SyncChunk { .. }) = (to, &env.body) {
                        let p = self.cfg.drop_sync_chunk_permille;
                        if p > 0 && self.rng.range(0, 1000) < p {
                            self.report.dropped_chunks += 1;
                            continue;
                        }
                    }
                    let to = match to {
                        Addr::Node(x) => Ent::Node(x),
                        Addr::Client(c) => Ent::Client(c),
                    };
                    let bytes = proto::encode(&env);
                    self.transmit(Ent::Node(n), to, Payload::Msg(bytes));
                }
                Output::Coord { id, req } => self.transmit(
                    Ent::Node(n),
                    Ent::Coord,
                    Payload::CoordReq { id, member, req },
                ),
            }
        }
    }

    fn on_coord(&mut self, from: NodeId, id: u64, member: Member, req: CoordRequest) {
        let now = self.now;
        let t = &mut self.coord;
        let reply = match req {
            CoordRequest::Campaign => CoordReply::Campaign(t.campaign("g", member, LEASE, now)),
            CoordRequest::KeepAlive { epoch } => {
                CoordReply::KeepAlive(t.keep_alive("g", member, epoch, now))
            }
            CoordRequest::SetInSync { epoch, in_sync } => {
                CoordReply::SetInSync(t.set_in_sync("g", member, epoch, in_sync, now))
            }
            CoordRequest::Get => CoordReply::Get(t.get("g", now)),
        };
        self.transmit(Ent::Coord, Ent::Node(from), Payload::CoordRep { id, reply });
    }

    // ------------------------------------------------------------ clients

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
        let rng = &mut self.rng;
        let cl = &mut self.clients[c];
        if cl.done >= ops {
            return;
        }
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
        let (op, obj) = if n == 0 || (dice < 35 && n < max_objects) {
            (Op::Insert { data: value }, None)
        } else {
            let i = rng.range(0, n as u64) as usize;
            let ptr = cl.objects[i].ptr;
            if dice < 65 {
                (Op::Update { ptr, data: value }, Some(i))
            } else if dice < 80 {
                (Op::Delete { ptr }, Some(i))
            } else {
                (Op::Read { ptr }, Some(i))
            }
        };
        cl.inflight = Some(Inflight {
            req_id,
            op,
            obj,
            switch_on_wake: true,
        });
        self.client_send(c);
    }

    fn client_wake(&mut self, c: usize, token: u64) {
        let cl = &mut self.clients[c];
        if cl.token != token {
            return;
        }
        match &cl.inflight {
            None => self.client_next(c),
            Some(i) => {
                if i.switch_on_wake {
                    cl.target = other(cl.target);
                }
                self.report.retries += 1;
                self.client_send(c);
            }
        }
    }

    fn client_receive(&mut self, c: usize, from: NodeId, env: Envelope) {
        let cl = &mut self.clients[c];
        cl.epoch = cl.epoch.max(env.epoch);
        let Body::Response { req_id, result } = env.body else {
            return;
        };
        let Some(inf) = cl.inflight.clone() else {
            return;
        };
        if inf.req_id != req_id {
            return;
        }
        match result {
            Ok(reply) => {
                self.apply_reply(c, &inf, reply);
                let cl = &mut self.clients[c];
                cl.inflight = None;
                cl.done += 1;
                self.report.acked_ops += 1;
                cl.token += 1;
                let token = cl.token;
                let at = self.now + self.rng.range(0, 2_000);
                self.schedule(at, Event::ClientWake(c, token));
            }
            Err(StoreError::StaleEpoch { .. }) => {
                if cl.target == from {
                    self.client_send(c);
                }
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
            Err(e) => self
                .violations
                .push(format!("client {c}: {:?} failed: {e}", inf.op)),
        }
    }

    fn apply_reply(&mut self, c: usize, inf: &Inflight, reply: Reply) {
        let cl = &mut self.clients[c];
        match (&inf.op, reply) {
            (Op::Insert { data }, Reply::Inserted(ptr)) => cl.objects.push(Obj {
                ptr,
                data: data.clone(),
            }),
            (Op::Update { data, .. }, Reply::Updated(ptr)) => {
                let o = &mut cl.objects[inf.obj.unwrap()];
                o.ptr = ptr;
                o.data = data.clone();
            }
            (Op::Delete { .. }, Reply::Deleted) => {
                let o = cl.objects.swap_remove(inf.obj.unwrap());
                cl.deleted.push((o.ptr, o.data));
            }
            (Op::Read { .. }, Reply::Data { data, .. }) => {
                let o = &cl.objects[inf.obj.unwrap()];
                if o.data != data {
                    self.violations.push(format!(
                        "client {c}: read of {} returned other bytes than last acknowledged",
                        o.ptr
                    ));
                }
            }
            (op, r) => self
                .violations
                .push(format!("client {c}: {op:?} answered with {r:?}")),
        }
    }

    // ------------------------------------------------------------ faults

    fn crash(&mut self) {
        if self.crash_phase_over {
            return;
        }
        let next = self.now + self.rng.range(30_000, 250_000);
        self.schedule(next, Event::Crash);
        let victim = NODE_IDS[self.rng.range(0, 2) as usize];
        if !self.nodes.contains_key(&victim) {
            return;
        }
        let Some(survivor) = self.nodes.get(&other(victim)) else {
            return;
        };
        let Some(rec) = self.coord.get("g", self.now) else {
            return;
        };
        let m = survivor.member();
        if !(rec.primary == m || rec.in_sync == Some(m)) {
            return; // the victim may hold the only copy of some writes
        }
        let node = self.nodes.remove(&victim).expect("victim alive");
        self.divergences += node.divergences();
        self.report.repaired_losses += node.lost_replicates();
        if let Some(d) = node.last_divergence() {
            self.violations.push(format!("node {victim} diverged: {d}"));
        }
        *self.gen.get_mut(&victim).unwrap() += 1;
        self.report.crashes += 1;
        let at = self.now + self.rng.range(5_000, 60_000);
        self.schedule(at, Event::Restart(victim));
    }

    fn quiescent(&self) -> bool {
        self.crash_phase_over
            && self.nodes.len() == 2
            && self
                .clients
                .iter()
                .all(|c| c.done >= self.cfg.ops_per_client && c.inflight.is_none())
            && {
                let p = self.nodes.values().find(|n| n.role() == Role::Primary);
                let s = self.nodes.values().find(|n| n.role() == Role::Secondary);
                match (p, s) {
                    (Some(p), Some(s)) => {
                        p.is_redundant()
                            && p.is_idle()
                            && s.is_synced_secondary()
                            && p.applied_seq() == s.applied_seq()
                    }
                    _ => false,
                }
            }
    }

    fn verify(&mut self) {
        let p = self
            .nodes
            .values()
            .find(|n| n.role() == Role::Primary)
            .unwrap();
        let s = self
            .nodes
            .values()
            .find(|n| n.role() == Role::Secondary)
            .unwrap();
        let mut v = Vec::new();
        if p.memory().bytes() != s.memory().bytes() {
            let first = p
                .memory()
                .bytes()
                .iter()
                .zip(s.memory().bytes())
                .position(|(a, b)| a != b)
                .unwrap();
            v.push(format!("arenas differ (first at offset {first})"));
        }
        if p.allocator().snapshot() != s.allocator().snapshot() {
            v.push("allocators differ".into());
        }
        if p.dedup_table() != s.dedup_table() {
            v.push("retry tables differ".into());
        }
        let mut live = 0;
        for (c, cl) in self.clients.iter().enumerate() {
            for o in &cl.objects {
                live += 1;
                let off = o.ptr.addr - self.arena.base;
                match p.allocator().allocation_at(off) {
                    Some(l) if l == o.ptr.len as u64 => {}
                    other => v.push(format!("client {c}: object {} lost ({other:?})", o.ptr)),
                }
                match object::read_object(p.memory(), off, o.ptr.len as u64) {
                    Ok((_, d)) if d == o.data => {}
                    r => v.push(format!(
                        "client {c}: object {} altered: {:?}",
                        o.ptr,
                        r.map(|(ver, d)| (ver, d.len()))
                    )),
                }
            }
            for (ptr, data) in &cl.deleted {
                let off = ptr.addr - self.arena.base;
                if let Ok((_, d)) = object::read_object(p.memory(), off, ptr.len as u64) {
                    if &d == data {
                        v.push(format!("client {c}: deleted object {ptr} resurrected"));
                    }
                }
            }
        }
        let allocs = p.allocator().usage().allocations;
        if allocs != live {
            v.push(format!(
                "{allocs} allocations but {live} live objects (a retried write applied twice?)"
            ));
        }
        let div = self.divergences + p.divergences() + s.divergences();
        if div != 0 {
            v.push(format!(
                "{div} forwarded writes failed to apply on a secondary ({:?} {:?})",
                p.last_divergence(),
                s.last_divergence()
            ));
        }
        self.violations.extend(v);
    }
}

/// Runs one simulation; `Err` describes every violated property.
pub fn run(seed: u64, cfg: &SimConfig) -> Result<SimReport, String> {
    let mut sim = Sim {
        cfg: cfg.clone(),
        rng: Rng::new(seed),
        now: 0,
        seq: 0,
        queue: BinaryHeap::new(),
        events: BTreeMap::new(),
        next_event: 0,
        channel_last: BTreeMap::new(),
        nodes: BTreeMap::new(),
        gen: BTreeMap::new(),
        coord: LeaseTable::new(),
        clients: Vec::new(),
        arena: ArenaRef {
            base: 0x7e00_0000_0000,
            len: cfg.arena_len,
            stag: 0x0012_3401,
        },
        crash_phase_over: !cfg.faults,
        divergences: 0,
        violations: Vec::new(),
        report: SimReport::default(),
        trace: std::env::var("SOFTRDMA_SIM_TRACE").is_ok_and(|v| v == "1"),
    };
    for n in NODE_IDS {
        sim.start_node(n);
    }
    for i in 0..cfg.clients {
        let id = 1000 + i as u64;
        sim.clients.push(Client {
            id,
            epoch: 0,
            target: NODE_IDS[i % 2],
            next_req: 0,
            inflight: None,
            done: 0,
            objects: Vec::new(),
            deleted: Vec::new(),
            token: 0,
        });
        let at = sim.rng.range(0, 10_000);
        sim.schedule(at, Event::ClientWake(i, 0));
    }
    if cfg.faults {
        let at = sim.rng.range(20_000, 100_000);
        sim.schedule(at, Event::Crash);
    }
    while let Some(Reverse((at, _, id))) = sim.queue.pop() {
        assert!(at >= sim.now);
        sim.now = at;
        if sim.now > cfg.time_limit {
            let roles: Vec<String> = sim
                .nodes
                .iter()
                .map(|(n, x)| {
                    format!(
                        "node {n}: {:?} epoch {} applied {} redundant {}",
                        x.role(),
                        x.epoch(),
                        x.applied_seq(),
                        x.is_redundant()
                    )
                })
                .collect();
            let pending: usize = sim.clients.iter().filter(|c| c.inflight.is_some()).count();
            sim.violations.push(format!(
                "no quiescence by {} us: {roles:?}, {pending} clients waiting, coordinator {:?}",
                cfg.time_limit,
                sim.coord.get("g", sim.now)
            ));
            break;
        }
        let clients_done = sim
            .clients
            .iter()
            .all(|c| c.done >= cfg.ops_per_client && c.inflight.is_none());
        if cfg.faults && !sim.crash_phase_over && clients_done {
            sim.crash_phase_over = true;
        }
        match sim.events.remove(&id).expect("event") {
            Event::Deliver {
                from,
                to,
                gens,
                payload,
            } => {
                if gens != (sim.gen_of(from), sim.gen_of(to)) || !sim.alive(to) {
                    continue; // the connection died with a crash
                }
                sim.report.messages += 1;
                match (to, payload) {
                    (Ent::Coord, Payload::CoordReq { id, member, req }) => {
                        let Ent::Node(n) = from else { unreachable!() };
                        sim.on_coord(n, id, member, req);
                    }
                    (Ent::Node(n), Payload::CoordRep { id, reply }) => sim.feed(
                        n,
                        Input::Coord {
                            id,
                            reply: Ok(reply),
                        },
                    ),
                    (Ent::Node(n), Payload::Msg(bytes)) => {
                        let env = proto::decode(&bytes).expect("codec round trip");
                        let from = match from {
                            Ent::Node(x) => Addr::Node(x),
                            Ent::Client(c) => Addr::Client(c),
                            Ent::Coord => unreachable!(),
                        };
                        sim.feed(n, Input::Message { from, env });
                    }
                    (Ent::Client(c), Payload::Msg(bytes)) => {
                        let env = proto::decode(&bytes).expect("codec round trip");
                        let Ent::Node(n) = from else { unreachable!() };
                        sim.client_receive((c - 1000) as usize, n, env);
                    }
                    _ => unreachable!("misrouted payload"),
                }
            }
            Event::Tick(n, g) => {
                if sim.gen.get(&n) != Some(&g) || !sim.nodes.contains_key(&n) {
                    continue;
                }
                sim.feed(n, Input::Tick);
                let at = sim.now + TICK + sim.rng.range(0, 200);
                sim.schedule(at, Event::Tick(n, g));
                if sim.quiescent() {
                    sim.verify();
                    break;
                }
            }
            Event::ClientWake(c, token) => sim.client_wake(c, token),
            Event::Crash => sim.crash(),
            Event::Restart(n) => sim.start_node(n),
        }
    }
    sim.report.end_time = sim.now;
    sim.report.repaired_losses += sim.nodes.values().map(|n| n.lost_replicates()).sum::<u64>();
    if sim.violations.is_empty() {
        Ok(sim.report)
    } else {
        Err(format!("seed {seed}: {}", sim.violations.join("; ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seeds(default: u64, soak: u64) -> u64 {
        if std::env::var("SOFTRDMA_SOAK").is_ok_and(|v| v == "1") {
            soak
        } else {
            default
        }
    }

    #[test]
    fn fault_free_group_stays_redundant_and_identical() {
        let cfg = SimConfig {
            faults: false,
            ..SimConfig::default()
        };
        for seed in 0..seeds(5, 100) {
            let r = run(seed, &cfg).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(r.crashes, 0);
            assert_eq!(r.acked_ops, (cfg.clients * cfg.ops_per_client) as u64);
        }
    }

    #[test]
    fn crashes_lose_no_acknowledged_write() {
        let cfg = SimConfig::default();
        let mut crashes = 0;
        let mut elections = 0;
        let (mut retries, mut ops) = (0, 0);
        let first: u64 = std::env::var("SOFTRDMA_SEED").map_or(0, |s| s.parse().unwrap());
        let count = std::env::var("SOFTRDMA_SEEDS").map_or(seeds(40, 2000), |s| s.parse().unwrap());
        for seed in first..first + count {
            let r = run(seed, &cfg).unwrap_or_else(|e| panic!("{e}"));
            crashes += r.crashes;
            elections += r.elections;
            retries += r.retries;
            ops += r.acked_ops;
        }
        eprintln!("sim: {ops} acknowledged ops, {crashes} crashes, {elections} elections, {retries} client retries");
        // The fault injector must actually exercise failover.
        assert!(crashes > 20, "only {crashes} crashes injected");
        assert!(elections > crashes / 2, "only {elections} elections");
    }

    /// A link that breaks drops the `Replicate`s in flight on it. The
    /// secondary must notice (a sequence gap, or the primary's
    /// `ReplicateHead` when no later write comes) and re-synchronise, and
    /// every client operation must still be acknowledged: a lost forwarded
    /// write must not leave its client waiting forever.
    #[test]
    fn lost_replicates_are_repaired() {
        // One client: no later write can reveal the gap, so only the
        // primary's ReplicateHead does. Three: both ways.
        let one = SimConfig {
            clients: 1,
            faults: false,
            drop_replicate_permille: 30,
            ..SimConfig::default()
        };
        let three = SimConfig {
            faults: false,
            drop_replicate_permille: 15,
            ..SimConfig::default()
        };
        let (mut dropped, mut repaired) = (0, 0);
        for (seed, cfg) in (0..seeds(10, 300)).flat_map(|s| [(s, &one), (s, &three)]) {
            let r = run(seed, cfg).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(r.acked_ops, (cfg.clients * cfg.ops_per_client) as u64);
            assert!(r.repaired_losses <= r.dropped_replicates, "{r:?}");
            if r.dropped_replicates > 0 {
                assert!(
                    r.repaired_losses > 0,
                    "seed {seed}: drops never noticed: {r:?}"
                );
            }
            dropped += r.dropped_replicates;
            repaired += r.repaired_losses;
        }
        eprintln!("sim: {dropped} Replicates dropped, {repaired} re-syncs");
        assert!(
            dropped >= 10,
            "the fault was not exercised ({dropped} drops)"
        );
    }

    /// A recovery copy whose chunk never comes (the primary refused the
    /// Read) is restarted instead of waiting forever: every run still ends
    /// redundant with identical replicas (`quiescent`).
    #[test]
    fn lost_chunks_restart_the_copy() {
        let cfg = SimConfig {
            faults: false,
            arena_len: 1 << 20,
            drop_sync_chunk_permille: 40,
            ..SimConfig::default()
        };
        let mut dropped = 0;
        for seed in 0..seeds(10, 200) {
            let r = run(seed, &cfg).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            assert_eq!(r.acked_ops, (cfg.clients * cfg.ops_per_client) as u64);
            dropped += r.dropped_chunks;
        }
        assert!(
            dropped >= 5,
            "the fault was not exercised ({dropped} drops)"
        );
    }

    #[test]
    fn runs_are_deterministic() {
        let cfg = SimConfig::default();
        let a = run(7, &cfg).unwrap();
        let b = run(7, &cfg).unwrap();
        assert_eq!(
            (a.acked_ops, a.crashes, a.messages, a.end_time),
            (b.acked_ops, b.crashes, b.messages, b.end_time)
        );
    }
}
