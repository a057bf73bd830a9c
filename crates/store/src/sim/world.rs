//! The world: the network (delays, stalls, drops, crashes), the virtual
//! clock and the nodes' drifting clocks, the nodes and the coordinator,
//! the faults injected, and the event loop ([`run`]).

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use super::{
    other, Client, Ent, Event, Payload, Rng, Sim, SimConfig, SimReport, COORD_TIMEOUT, HEARTBEAT,
    LEASE, LONG_PAUSE_AT, NODE_IDS, SECONDARY_TIMEOUT, TICK, TIMEOUT,
};
use crate::arena::HeapMemory;
use crate::coord::LeaseTable;
use crate::node::{Addr, CoordReply, CoordRequest, Input, Micros, Node, NodeConfig, Output, Role};
use crate::proto::{self, Body, Member, NodeId};
use crate::ptr::ArenaRef;

fn summarize(i: &Input) -> String {
    match i {
        Input::Tick => String::new(),
        Input::Durable { seq, .. } => format!("durable {seq}"),
        Input::SnapshotDue => "snapshot due".into(),
        Input::LogPressure(on) => format!("log pressed {on}"),
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

impl Sim {
    pub(super) fn schedule(&mut self, at: Micros, ev: Event) {
        let id = self.next_event;
        self.next_event += 1;
        self.seq += 1;
        self.events.insert(id, ev);
        self.queue.push(Reverse((at, self.seq, id)));
    }

    pub(super) fn gen_of(&self, e: Ent) -> u64 {
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

    pub(super) fn delay(&mut self) -> Micros {
        let r = self.rng.range(0, 1000);
        if !self.cfg.faults || !self.cfg.stalls || r < 950 {
            self.rng.range(20, 400)
        } else if r < 995 {
            self.rng.range(400, 5_000)
        } else {
            self.rng.range(5_000, 40_000)
        }
    }

    pub(super) fn transmit(&mut self, from: Ent, to: Ent, payload: Payload) {
        if !self.alive(from) || !self.alive(to) {
            return;
        }
        let coord = from == Ent::Coord || to == Ent::Coord;
        let at = if coord && self.cfg.coord_faults {
            // Late and out of order: no FIFO on the coordinator's channel.
            let r = self.rng.range(0, 100);
            self.now
                + if r < 80 {
                    self.rng.range(20, 400)
                } else if r < 95 {
                    self.rng.range(400, LEASE)
                } else {
                    self.rng.range(LEASE, 3 * LEASE)
                }
        } else {
            let at = self.now + self.delay();
            let last = self.channel_last.entry((from, to)).or_insert(0);
            let at = at.max(*last);
            *last = at;
            at
        };
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

    fn node_config(&mut self, n: NodeId, incarnation: u64) -> NodeConfig {
        NodeConfig {
            member: Member {
                node: n,
                incarnation,
            },
            arena: self.arena,
            heartbeat_interval: HEARTBEAT,
            heartbeat_timeout: TIMEOUT,
            secondary_timeout: SECONDARY_TIMEOUT,
            lease_ttl: LEASE,
            sync_chunk: 16 << 10,
            sync_window: 4,
            min_in_sync: self.cfg.min_in_sync,
            clock_drift_permille: 50,
            index_buckets: self.cfg.index_buckets,
            resp_port: 0,
            clock_origin_ms: self.wall_origin(n),
            persist: self.cfg.persist,
        }
    }

    /// Node `n`'s wall clock at its time 0 (Unix milliseconds). With keys
    /// that expire, it reads true time now, off by a skew of at most
    /// [`SimConfig::wall_skew_ms`](super::SimConfig::wall_skew_ms) (as NTP
    /// keeps real hosts); else a constant (and no random draw, so the
    /// other runs' schedules stay as they were).
    fn wall_origin(&mut self, n: NodeId) -> u64 {
        if self.cfg.ttl_percent == 0 {
            return super::CLOCK_ORIGIN_MS;
        }
        let s = self.cfg.wall_skew_ms;
        let skew = self.rng.range(0, 2 * s + 1) as i128 - s as i128;
        let at = (super::CLOCK_ORIGIN_MS + self.now / 1000) as i128;
        (at + skew - (self.node_now(n) / 1000) as i128) as u64
    }

    /// Node `n`'s clock now: its own origin and rate (drift).
    pub(super) fn node_now(&self, n: NodeId) -> Micros {
        let (ppm, origin) = self.clocks.get(&n).copied().unwrap_or((0, 0));
        let t = self.now as i128;
        (origin as i128 + t + t * ppm as i128 / 1_000_000) as Micros
    }

    fn start_node(&mut self, n: NodeId) {
        let d = self.cfg.clock_drift_permille as i64 * 1000;
        let ppm = if d > 0 {
            self.rng.range(0, 2 * d as u64 + 1) as i64 - d
        } else {
            0
        };
        let origin = self.rng.range(0, 1 << 30);
        // Keep the node's clock monotonic across incarnations.
        let floor = self.clocks.get(&n).map(|_| self.node_now(n)).unwrap_or(0);
        self.clocks.insert(n, (ppm, origin + floor));
        self.paused.remove(&n);
        self.reads_until.insert(n, None);
        let mut garbage = vec![0u8; self.arena.len as usize];
        for chunk in garbage.chunks_mut(8) {
            let r = self.rng.next_u64().to_le_bytes();
            chunk.copy_from_slice(&r[..chunk.len()]);
        }
        let inc = self.rng.next_u64();
        let cfg = self.node_config(n, inc);
        let node = match self.recover_node(n, &cfg) {
            Some(node) => node,
            None => Node::new(cfg, HeapMemory::from_bytes(garbage)),
        };
        self.nodes.insert(n, node);
        *self.gen.entry(n).or_insert(0) += 1;
        let g = self.gen[&n];
        let at = self.now + self.rng.range(0, TICK);
        self.schedule(at, Event::Tick(n, g));
        self.commit_due.remove(&n);
        if self.cfg.persist == crate::persist::Policy::Everysec {
            let at = self.now + self.rng.range(0, super::persist_sim::EVERYSEC);
            self.schedule(at, Event::Commit(n, g));
        }
    }

    pub(super) fn feed(&mut self, n: NodeId, input: Input) {
        let Some(node) = self.nodes.get_mut(&n) else {
            return;
        };
        let before = node.role();
        let summary = if self.trace {
            Some(summarize(&input))
        } else {
            None
        };
        let t = {
            let (ppm, origin) = self.clocks.get(&n).copied().unwrap_or((0, 0));
            let x = self.now as i128;
            (origin as i128 + x + x * ppm as i128 / 1_000_000) as Micros
        };
        let outs = node.handle(t, input);
        // As the node loop does once the outputs are on their way.
        node.settle();
        let after = node.role();
        let until = node.reads_until();
        self.reads_until.insert(n, until);
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
        if before == Role::Primary && after != Role::Primary {
            self.report.step_downs += 1;
        }
        let member = node.member();
        for o in outs {
            match o {
                Output::Send { to, env } => {
                    if let Body::SyncStart { .. } = env.body {
                        self.report.copies += 1;
                    }
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
                Output::Log(e) => self.log_entry(n, e),
                Output::Coord { id, req } => {
                    if self.cfg.coord_faults && self.rng.range(0, 100) < 2 {
                        // The request is lost: the runtime reports the
                        // failure after its timeout.
                        self.report.coord_losses += 1;
                        let at = self.now + COORD_TIMEOUT;
                        let gens = (0, self.gen_of(Ent::Node(n)));
                        self.schedule(
                            at,
                            Event::Deliver {
                                from: Ent::Coord,
                                to: Ent::Node(n),
                                gens,
                                payload: Payload::CoordRep {
                                    id,
                                    reply: Err("coordinator timeout".into()),
                                },
                            },
                        );
                        continue;
                    }
                    self.transmit(
                        Ent::Node(n),
                        Ent::Coord,
                        Payload::CoordReq { id, member, req },
                    )
                }
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
            CoordRequest::Retire { new } => CoordReply::Retire(t.retire("g", member, new)),
        };
        let reply = if self.cfg.coord_faults && self.rng.range(0, 100) < 2 {
            // Applied, but the answer is lost.
            self.report.coord_losses += 1;
            Err("coordinator timeout".to_string())
        } else {
            Ok(reply)
        };
        self.transmit(Ent::Coord, Ent::Node(from), Payload::CoordRep { id, reply });
    }

    // ------------------------------------------------------------ faults

    fn crash(&mut self) {
        if self.crash_phase_over {
            return;
        }
        let next = self.now + self.rng.range(30_000, 250_000);
        self.schedule(next, Event::Crash);
        let victim = NODE_IDS[self.rng.range(0, 2) as usize];
        // The long pause, the drop and the rejoin come first: no crash
        // until the paused node is back in sync after the pause.
        if self.cfg.long_secondary_pause > 0 {
            let rejoined = self.long_pause_end.is_some_and(|e| self.now > e)
                && self.report.copies >= 2
                && self
                    .nodes
                    .values()
                    .any(|n| n.role() == Role::Primary && n.is_redundant());
            if !rejoined {
                return;
            }
        }
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
        // A survivor back from its log is named by the record but may
        // lack what its log lost (`everysec`): it holds every write only
        // once it serves or follows again.
        if !(survivor.role() == Role::Primary || survivor.is_synced_secondary()) {
            return;
        }
        if self.cfg.crash_secondary_only
            && (rec.primary != m || rec.in_sync != self.nodes.get(&victim).map(|n| n.member()))
        {
            return;
        }
        self.kill(victim);
        let at = self.now + self.rng.range(5_000, 60_000);
        self.schedule(at, Event::Restart(victim));
    }

    /// Node `n` dies (its partition, if any, loses power).
    pub(super) fn kill(&mut self, n: NodeId) {
        let node = self.nodes.remove(&n).expect("victim alive");
        if self.trace {
            eprintln!(
                "{:>9} n{n} crashes: {:?} epoch {} applied {}",
                self.now,
                node.role(),
                node.epoch(),
                node.applied_seq()
            );
        }
        self.divergences += node.divergences();
        self.report.repaired_losses += node.lost_replicates();
        if let Some(d) = node.last_divergence() {
            self.violations.push(format!("node {n} diverged: {d}"));
        }
        *self.gen.get_mut(&n).unwrap() += 1;
        self.killed_at.insert(n, self.now);
        self.pressed.remove(&n);
        self.report.crashes += 1;
        self.power_loss(n);
    }

    /// Pauses a random node for one to four lease TTLs (as SIGSTOP does:
    /// its messages, ticks and one-sided reads wait until it resumes).
    fn pause(&mut self) {
        if self.crash_phase_over {
            return;
        }
        let next = self.now + self.rng.range(50_000, 300_000);
        self.schedule(next, Event::Pause);
        let n = if self.cfg.pause_secondary_only {
            match self.coord.get("g", self.now).and_then(|r| r.in_sync) {
                Some(m) => m.node,
                None => return,
            }
        } else {
            NODE_IDS[self.rng.range(0, 2) as usize]
        };
        if !self.nodes.contains_key(&n) || self.paused.get(&n).is_some_and(|&u| u > self.now) {
            return;
        }
        let until = self.now + self.rng.range(LEASE, 4 * LEASE);
        self.paused.insert(n, until);
        self.report.pauses += 1;
    }

    /// Pauses the in-sync secondary for [`SimConfig::long_secondary_pause`]
    /// (once; tried again later while none is in sync).
    fn long_pause(&mut self) {
        let n = self
            .coord
            .get("g", self.now)
            .and_then(|r| r.in_sync)
            .map(|m| m.node)
            .filter(|n| self.nodes.contains_key(n));
        match n {
            Some(n) => {
                let end = self.now + self.cfg.long_secondary_pause;
                self.paused.insert(n, end);
                self.long_pause_end = Some(end);
                self.report.pauses += 1;
            }
            None => self.schedule(self.now + 20_000, Event::LongPause),
        }
    }

    /// Until when node `n` is paused, if it is now.
    fn paused_until(&self, n: NodeId) -> Option<Micros> {
        self.paused.get(&n).copied().filter(|&u| u > self.now)
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
        crash_phase_over: !(cfg.faults || cfg.pauses),
        divergences: 0,
        violations: Vec::new(),
        report: SimReport::default(),
        trace: std::env::var("SOFTRDMA_SIM_TRACE").is_ok_and(|v| v == "1"),
        clocks: BTreeMap::new(),
        paused: BTreeMap::new(),
        reads_until: BTreeMap::new(),
        long_pause_end: None,
        history: Vec::new(),
        unstable: BTreeMap::new(),
        next_oid: 0,
        tag_key: BTreeMap::new(),
        ttl: Default::default(),
        disks: BTreeMap::new(),
        killed_at: BTreeMap::new(),
        pressed: Default::default(),
        commit_due: Default::default(),
        group_crashes_left: cfg.group_crashes,
        group_crash_armed: false,
        crash_commits: None,
        lossy: Vec::new(),
    };
    if cfg.persist.logs() {
        sim.format_disks();
        if cfg.group_crashes > 0 {
            let at = sim.rng.range(100_000, 300_000);
            sim.schedule(at, Event::GroupCrash);
        }
    }
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
            cache: BTreeMap::new(),
        });
        let at = sim.rng.range(0, 10_000);
        sim.schedule(at, Event::ClientWake(i, 0));
    }
    if cfg.faults {
        let at = sim.rng.range(20_000, 100_000);
        sim.schedule(at, Event::Crash);
    }
    if cfg.pauses {
        let at = sim.rng.range(20_000, 100_000);
        sim.schedule(at, Event::Pause);
    }
    if cfg.long_secondary_pause > 0 {
        sim.schedule(LONG_PAUSE_AT, Event::LongPause);
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
        if (cfg.faults || cfg.pauses) && !sim.crash_phase_over && clients_done {
            sim.crash_phase_over = true;
        }
        let ev = sim.events.remove(&id).expect("event");
        // A paused node gets nothing until it resumes (in the same order).
        let at_node = match &ev {
            Event::Deliver {
                to: Ent::Node(n), ..
            }
            | Event::Tick(n, _)
            | Event::Commit(n, _)
            | Event::SnapStep(n, _)
            | Event::ReadArrive { n, .. } => Some(*n),
            _ => None,
        };
        if let Some(until) = at_node.and_then(|n| sim.paused_until(n)) {
            sim.schedule(until, ev);
            continue;
        }
        match ev {
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
                    (Ent::Node(n), Payload::CoordRep { id, reply }) => {
                        sim.feed(n, Input::Coord { id, reply })
                    }
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
            Event::Pause => sim.pause(),
            Event::LongPause => sim.long_pause(),
            Event::ReadArrive {
                c,
                n,
                gens,
                token,
                at,
            } => sim.read_arrive(c, n, gens, token, at),
            Event::ReadDone { c, token, outcome } => sim.read_done(c, token, outcome),
            Event::Commit(n, g) => sim.commit(n, g),
            Event::SnapStep(n, g) => sim.snap_step(n, g),
            Event::GroupCrash => sim.group_crash(),
        }
    }
    sim.report.end_time = sim.now;
    sim.report.history_ops = sim.history.len() as u64;
    sim.report.repaired_losses += sim.nodes.values().map(|n| n.lost_replicates()).sum::<u64>();
    if sim.violations.is_empty() {
        Ok(sim.report)
    } else {
        Err(format!("seed {seed}: {}", sim.violations.join("; ")))
    }
}
