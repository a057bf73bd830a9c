//! Scripted scenarios: two nodes and a coordinator driven by hand, so a
//! test decides which message or coordinator answer comes when.
use std::collections::{BTreeMap, VecDeque};

use super::*;
use crate::arena::HeapMemory;
use crate::coord::LeaseTable;
use crate::object;
use crate::proto::Bytes;
use crate::proto::{Cond, Effect, Op};
use crate::ptr::RemotePtr;

#[path = "election_tests.rs"]
mod election_tests;

/// The nodes' wall clock at time 0 (Unix milliseconds).
const CLOCK_ORIGIN_MS: u64 = 1_700_000_000_000;

const ARENA: ArenaRef = ArenaRef {
    base: 0x7e00_0000_0000,
    len: 64 << 10,
    stag: 0x0012_3401,
};
const HB: Micros = 5_000;

struct Call {
    node: NodeId,
    id: u64,
    member: Member,
    req: CoordRequest,
}

/// Two nodes, a lease table, and the messages and calls in flight.
struct H {
    t: Micros,
    nodes: BTreeMap<NodeId, Node<HeapMemory>>,
    coord: LeaseTable,
    msgs: VecDeque<(NodeId, NodeId, Envelope)>,
    calls: Vec<Call>,
    sync_starts: usize,
    /// Answers to clients: (request id, result).
    answers: Vec<(u64, Result<Reply, StoreError>)>,
    req_id: u64,
}

impl H {
    fn new() -> H {
        H::persisting(crate::persist::Policy::Off)
    }

    fn persisting(persist: crate::persist::Policy) -> H {
        let mut nodes = BTreeMap::new();
        for n in [1, 2] {
            let cfg = NodeConfig {
                member: Member {
                    node: n,
                    incarnation: 100 * n as u64,
                },
                arena: ARENA,
                heartbeat_interval: HB,
                heartbeat_timeout: 5 * HB,
                secondary_timeout: 5 * HB,
                lease_ttl: 4 * HB,
                sync_chunk: 16 << 10,
                sync_window: 4,
                min_in_sync: 0,
                clock_drift_permille: 50,
                index_buckets: 0,
                resp_port: 0,
                clock_origin_ms: CLOCK_ORIGIN_MS,
                persist,
            };
            nodes.insert(n, Node::new(cfg, HeapMemory::new(ARENA.len)));
        }
        H {
            t: 1,
            nodes,
            coord: LeaseTable::new(),
            msgs: VecDeque::new(),
            calls: Vec::new(),
            sync_starts: 0,
            answers: Vec::new(),
            req_id: 0,
        }
    }

    /// Node `n`'s input (dropped while it is down: not in `nodes`).
    fn feed(&mut self, n: NodeId, input: Input) {
        let Some(node) = self.nodes.get_mut(&n) else {
            return;
        };
        let member = node.member();
        for o in node.handle(self.t, input) {
            match o {
                Output::Send {
                    to: Addr::Node(to),
                    env,
                } => {
                    if matches!(env.body, Body::SyncStart { .. }) {
                        self.sync_starts += 1;
                    }
                    self.msgs.push_back((n, to, env));
                }
                Output::Send {
                    to: Addr::Client(_),
                    env:
                        Envelope {
                            body: Body::Response { req_id, result },
                            ..
                        },
                } => self.answers.push((req_id, result)),
                Output::Send { .. } | Output::Log(_) => {}
                Output::Coord { id, req } => self.calls.push(Call {
                    node: n,
                    id,
                    member,
                    req,
                }),
            }
        }
    }

    /// Answers call `i` now.
    fn answer(&mut self, i: usize) {
        let c = self.calls.remove(i);
        let t = &mut self.coord;
        let now = self.t;
        let reply = match c.req {
            CoordRequest::Campaign => CoordReply::Campaign(t.campaign("g", c.member, 4 * HB, now)),
            CoordRequest::KeepAlive { epoch } => {
                CoordReply::KeepAlive(t.keep_alive("g", c.member, epoch, now))
            }
            CoordRequest::SetInSync { epoch, in_sync } => {
                CoordReply::SetInSync(t.set_in_sync("g", c.member, epoch, in_sync, now))
            }
            CoordRequest::Get => CoordReply::Get(t.get("g", now)),
            CoordRequest::Retire { new } => CoordReply::Retire(t.retire("g", c.member, new)),
        };
        self.feed(
            c.node,
            Input::Coord {
                id: c.id,
                reply: Ok(reply),
            },
        );
    }

    /// Runs for `dt`: ticks every millisecond, every message delivered
    /// at once, every call answered at once unless `hold` says so.
    fn run(&mut self, dt: Micros, hold: &dyn Fn(&Call, &H) -> bool) {
        let end = self.t + dt;
        while self.t < end {
            self.t += 1_000;
            for n in [1, 2] {
                self.feed(n, Input::Tick);
            }
            loop {
                if let Some((from, to, env)) = self.msgs.pop_front() {
                    self.feed(
                        to,
                        Input::Message {
                            from: Addr::Node(from),
                            env,
                        },
                    );
                    continue;
                }
                match (0..self.calls.len()).find(|&i| !hold(&self.calls[i], self)) {
                    Some(i) => self.answer(i),
                    None => break,
                }
            }
        }
    }

    fn node(&self, n: NodeId) -> &Node<HeapMemory> {
        &self.nodes[&n]
    }

    /// Runs until node 1 is primary with node 2 in sync.
    fn redundant(&mut self) {
        self.run(200_000, &|_, _| false);
        assert!(self.node(1).is_redundant(), "{:?}", self.node(1).status());
    }

    /// A client's request to node 1, answered (replicated first if a
    /// write) within a few heartbeats.
    fn request(&mut self, op: Op) -> Result<Reply, StoreError> {
        self.request_to(1, op)
    }

    /// Node `n` as its log would bring it back if it died now with its
    /// log holding every write it applied (a base and a snapshot of its
    /// present state): a fenced node of its incarnation and epoch.
    fn recovered(&self, n: NodeId) -> Node<HeapMemory> {
        let node = self.node(n);
        assert!(
            !node.image.has_unexposed(),
            "every applied write in the arena"
        );
        let base = node.base();
        let mut r = Recovering::new(node.cfg.clone(), HeapMemory::new(ARENA.len), &base).unwrap();
        r.snapshot(0, node.image.memory().bytes()).unwrap();
        r.finish(0).unwrap()
    }

    /// A client's request to node `n`.
    fn request_to(&mut self, n: NodeId, op: Op) -> Result<Reply, StoreError> {
        self.req_id += 1;
        let req_id = self.req_id;
        let env = Envelope {
            epoch: self.node(n).epoch(),
            body: Body::Request {
                client: 77,
                req_id,
                op,
            },
        };
        self.feed(
            n,
            Input::Message {
                from: Addr::Client(77),
                env,
            },
        );
        self.run(4 * HB, &never);
        let i = self.answers.iter().position(|a| a.0 == req_id);
        self.answers.remove(i.expect("answered")).1
    }
}

fn never(_: &Call, _: &H) -> bool {
    false
}

/// Issue 16, finding 1's trigger: a renewal sent at epoch E comes back
/// false because the primary itself moved the epoch to E+1 (registering
/// its secondary) meanwhile. The primary must not step down (it did,
/// then won E+2 with nobody in sync and acknowledged writes alone while
/// the secondary still served reads).
#[test]
fn a_renewal_refused_for_our_own_epoch_bump_is_not_a_step_down() {
    let mut h = H::new();
    let is_reg = |c: &Call| {
        matches!(
            c.req,
            CoordRequest::SetInSync {
                in_sync: Some(_),
                ..
            }
        )
    };
    let is_ka = |c: &Call| c.node == 1 && matches!(c.req, CoordRequest::KeepAlive { .. });
    // Until node 1 asks to register node 2 (held)...
    h.run(200_000, &|c, _| is_reg(c));
    let reg = h.calls.iter().position(is_reg).expect("registration asked");
    assert!(h.node(1).role() == Role::Primary && !h.node(1).is_redundant());
    // ... and a renewal goes out while it is pending (held too).
    h.run(2 * HB, &|c, _| is_reg(c) || is_ka(c));
    assert!(h.calls.iter().any(is_ka), "a renewal in flight");
    let e = h.node(1).epoch();
    // The registration is answered first: the epoch moves to e + 1.
    let reg = h.calls.iter().position(is_reg).unwrap_or(reg);
    h.answer(reg);
    assert_eq!(h.node(1).epoch(), e + 1);
    assert!(h.node(1).is_redundant());
    // Then the renewal named e: refused for the epoch.
    let ka = h.calls.iter().position(is_ka).unwrap();
    let CoordRequest::KeepAlive { epoch } = h.calls[ka].req else {
        unreachable!()
    };
    assert_eq!(epoch, e);
    h.answer(ka);
    assert_eq!(h.node(1).role(), Role::Primary, "stepped down");
    assert!(h.node(1).is_redundant());
    h.run(100_000, &never);
    assert!(h.node(1).is_redundant());
    assert_eq!(h.node(1).epoch(), e + 1, "no new election");
    assert_eq!(h.sync_starts, 1, "the secondary copied once");
}

/// Issue 16, finding 2: a lease hiccup (renewals late past the TTL)
/// makes the primary step down and win again; the in-sync secondary
/// stays in sync (no second copy of the arena) and the group is
/// redundant again at a higher epoch.
#[test]
fn a_lease_hiccup_keeps_the_secondary_in_sync() {
    let mut h = H::new();
    h.redundant();
    let (e0, s0) = (h.node(1).epoch(), h.node(2).member());
    assert_eq!(h.sync_starts, 1);
    // No renewal of node 1 answered for 6 heartbeats (> the 4-beat TTL,
    // < node 2's 5-beat timeout: node 2 keeps hearing node 1).
    h.run(6 * HB, &|c, _| {
        c.node == 1 && matches!(c.req, CoordRequest::KeepAlive { .. })
    });
    h.run(100_000, &never);
    assert_eq!(h.node(1).role(), Role::Primary);
    assert!(h.node(1).epoch() > e0, "re-elected");
    assert!(h.node(1).is_redundant(), "{:?}", h.node(1).status());
    assert_eq!(h.node(2).member(), s0, "same incarnation, same copy");
    assert_eq!(h.sync_starts, 1, "no second copy of the arena");
}

/// Issue 16, finding 4: a secondary that finished copying reports
/// "syncing" until its primary says the coordinator records it in sync.
#[test]
fn status_says_secondary_only_once_registered() {
    let mut h = H::new();
    // Hold the registration.
    let hold = |c: &Call, _: &H| {
        matches!(
            c.req,
            CoordRequest::SetInSync {
                in_sync: Some(_),
                ..
            }
        )
    };
    h.run(200_000, &hold);
    assert!(h.node(2).is_synced_secondary(), "copy done");
    assert_eq!(h.node(2).status().role, proto::ROLE_SYNCING);
    h.run(50_000, &never);
    assert!(h.node(1).is_redundant());
    assert_eq!(h.node(2).status().role, proto::ROLE_SECONDARY);
}

/// A scan pattern longer than `glob::MAX_PATTERN_LEN` is refused (the
/// matcher's cost grows with it, and the scan runs on the node loop);
/// one at the limit is taken.
#[test]
fn a_scan_pattern_too_long_is_refused() {
    let mut h = H::new();
    h.redundant();
    let put = Op::Put {
        key: b"k1".to_vec(),
        data: b"v".to_vec().into(),
        cond: Cond::Always,
        ttl: crate::proto::Ttl::Clear,
    };
    assert!(matches!(h.request(put), Ok(Reply::Stored { .. })));
    let scan = |pattern: Vec<u8>| Op::Scan {
        cursor: 0,
        count: 100,
        pattern,
    };
    let max = crate::glob::MAX_PATTERN_LEN;
    assert_eq!(
        h.request(scan(vec![b'*'; max + 1])),
        Err(StoreError::BadPattern {
            len: max as u64 + 1,
            max: max as u64
        })
    );
    assert_eq!(
        h.request(scan(vec![b'*'; max])),
        Ok(Reply::Keys {
            keys: vec![b"k1".to_vec()],
            next: 0
        })
    );
}

/// A replicated index edit that cannot be applied (here an entry
/// without a tag, which the bucket encoder refuses) is a divergence:
/// the secondary starts over with a copy of the arena. It used to pass
/// `apply_meta` and panic in `apply_bytes`.
#[test]
fn a_bad_replicated_index_edit_is_a_divergence() {
    let mut h = H::new();
    h.redundant();
    let put = Op::Put {
        key: b"k1".to_vec(),
        data: b"v".to_vec().into(),
        cond: Cond::Always,
        ttl: crate::proto::Ttl::Clear,
    };
    assert!(matches!(h.request(put), Ok(Reply::Stored { .. })));
    let layout = h.node(2).index_layout().unwrap();
    let seq = h.node(2).applied_seq() + 1;
    let bad = |tag, slot, offset| RepOp {
        client: 78,
        req_id: 1,
        effects: vec![Effect::Index {
            key: b"k2".to_vec(),
            generation: seq,
            edit: index::Edit::Slot {
                bucket: 0,
                slot,
                entry: Some(index::Slot {
                    tag,
                    offset,
                    units: 1,
                    generation: seq as u32,
                }),
            },
        }],
        reply: Reply::Removed { existed: false },
    };
    let objects = layout.reserved_len();
    for (i, op) in [
        bad(0, 30, objects),
        bad(3, 30, objects + 1),
        bad(3, 30, ARENA.len),
        bad(3, 30, 0),
    ]
    .into_iter()
    .enumerate()
    {
        let env = Envelope {
            epoch: h.node(1).epoch(),
            body: Body::Replicate { seq, op },
        };
        h.feed(
            2,
            Input::Message {
                from: Addr::Node(1),
                env,
            },
        );
        assert_eq!(h.node(2).divergences(), i as u64 + 1);
        assert!(h.node(2).last_divergence().unwrap().contains("index edit"));
        h.redundant();
    }
}

/// `TooLarge` names the largest value that can be stored under the
/// key: the arena less the index region, the header and the key (it
/// named the arena less the header, and a value between the two was
/// answered `Full`).
#[test]
fn too_large_names_the_largest_value_that_fits() {
    let mut h = H::new();
    h.redundant();
    let reserved = h.node(1).index_layout().unwrap().reserved_len();
    let most = ARENA.len - reserved - object::HEADER_LEN as u64;
    let put = |len: u64| Op::Put {
        key: b"k1".to_vec(),
        data: Bytes::from(vec![7; len as usize]),
        cond: Cond::Always,
        ttl: crate::proto::Ttl::Clear,
    };
    assert_eq!(
        h.request(put(most - 1)),
        Err(StoreError::TooLarge {
            len: most - 1,
            max: most - 2
        })
    );
    let insert = |len: u64| Op::Insert {
        data: Bytes::from(vec![7; len as usize]),
    };
    assert_eq!(
        h.request(insert(most + 1)),
        Err(StoreError::TooLarge {
            len: most + 1,
            max: most
        })
    );
    // The largest is stored: the arena holds nothing else.
    assert!(matches!(h.request(put(most - 2)), Ok(Reply::Stored { .. })));
}

/// The pointer API aimed at the key index's region (an allocation, but
/// no object) is refused with an error that says so, not `Torn` or
/// `Keyed`.
#[test]
fn a_pointer_to_the_index_region_is_refused() {
    let mut h = H::new();
    h.redundant();
    let reserved = h.node(1).index_layout().unwrap().reserved_len();
    let ptr = RemotePtr {
        addr: ARENA.base,
        stag: ARENA.stag,
        len: reserved as u32,
        gen: 0,
    };
    for op in [
        Op::Read { ptr },
        Op::Update {
            ptr,
            data: b"x".to_vec().into(),
        },
        Op::Delete { ptr },
    ] {
        let r = h.request(op.clone());
        assert!(
            matches!(&r, Err(StoreError::Other(m)) if m.contains("key index")),
            "{op:?}: {r:?}"
        );
    }
}

/// The node's `Op::Get` is the one-sided look-up on its own memory:
/// found (also after an update moved the object), absent, removed.
#[test]
fn the_server_side_get_is_the_look_up() {
    let mut h = H::new();
    h.redundant();
    let put = |data: &[u8]| Op::Put {
        key: b"k1".to_vec(),
        data: data.to_vec().into(),
        cond: Cond::Always,
        ttl: crate::proto::Ttl::Clear,
    };
    let get = |key: &[u8]| Op::Get { key: key.to_vec() };
    let Ok(Reply::Stored { ptr, .. }) = h.request(put(b"one")) else {
        panic!("not stored")
    };
    let Ok(Reply::Value { ptr: p, data, .. }) = h.request(get(b"k1")) else {
        panic!("not found")
    };
    assert_eq!((p, data), (ptr, b"one".to_vec()));
    // Moved to a larger allocation.
    let Ok(Reply::Stored { ptr: moved, .. }) = h.request(put(&[5; 300])) else {
        panic!("not stored")
    };
    assert_ne!(moved, ptr);
    let Ok(Reply::Value { ptr: p, data, .. }) = h.request(get(b"k1")) else {
        panic!("not found")
    };
    assert_eq!((p, data), (moved, vec![5; 300]));
    assert_eq!(h.request(get(b"k2")), Ok(Reply::NoKey));
    let remove = Op::Remove {
        key: b"k1".to_vec(),
    };
    assert_eq!(h.request(remove), Ok(Reply::Removed { existed: true }));
    assert_eq!(h.request(get(b"k1")), Ok(Reply::NoKey));
    assert!(matches!(
        h.request(get(b"")),
        Err(StoreError::BadKey { len: 0, .. })
    ));
}

/// Issue 32: a read-modify-write sees the writes before it, committed or
/// not. Three `INCRBY`s and an `APPEND` sent together (each planned while
/// the ones before it are still being replicated) answer 1, 3, 6 and
/// the length after the append; a value that does not suit is refused
/// in order and changes nothing; `Swap` and `Take` answer the old value.
#[test]
fn read_modify_writes_see_the_writes_before_them() {
    use crate::proto::Modify;
    let mut h = H::new();
    h.redundant();
    let m = |key: &[u8], how: Modify| Op::Modify {
        key: key.to_vec(),
        how,
    };
    // Sent together: none is committed when the next is planned.
    let mut ids = Vec::new();
    for op in [
        m(b"n", Modify::IncrBy(1)),
        m(b"n", Modify::IncrBy(2)),
        m(b"n", Modify::IncrBy(3)),
        m(b"n", Modify::Append(b"0".to_vec())),
        m(b"n", Modify::IncrBy(1)),
    ] {
        h.req_id += 1;
        ids.push(h.req_id);
        let env = Envelope {
            epoch: h.node(1).epoch(),
            body: Body::Request {
                client: 77,
                req_id: h.req_id,
                op,
            },
        };
        h.feed(
            1,
            Input::Message {
                from: Addr::Client(77),
                env,
            },
        );
    }
    h.run(4 * HB, &never);
    let got: Vec<_> = ids
        .iter()
        .map(|id| {
            h.answers
                .iter()
                .find(|a| a.0 == *id)
                .expect("answered")
                .1
                .clone()
        })
        .collect();
    let num = |v: &str| {
        Ok(Reply::Modified {
            value: Some(v.as_bytes().to_vec()),
            len: v.len() as u64,
        })
    };
    assert_eq!(got[..3], [num("1"), num("3"), num("6")]);
    assert_eq!(
        got[3],
        Ok(Reply::Modified {
            value: None,
            len: 2
        })
    );
    assert_eq!(got[4], num("61"));
    // Refused in order, nothing changed.
    h.request(Op::Put {
        key: b"s".to_vec(),
        data: b"abc".to_vec().into(),
        cond: Cond::Always,
        ttl: crate::proto::Ttl::Clear,
    })
    .unwrap();
    let refused = |t: &str| Ok(Reply::Refused(t.into()));
    assert_eq!(
        h.request(m(b"s", Modify::IncrBy(1))),
        refused("ERR value is not an integer or out of range")
    );
    h.request(m(b"big", Modify::IncrBy(i64::MAX))).unwrap();
    assert_eq!(
        h.request(m(b"big", Modify::IncrBy(1))),
        refused("ERR increment or decrement would overflow")
    );
    assert_eq!(
        h.request(m(
            b"s",
            Modify::SetRange {
                offset: crate::proto::MAX_MODIFY_BYTES as u64,
                data: b"x".to_vec()
            }
        )),
        refused(&format!(
            "ERR string exceeds maximum allowed size ({} bytes in this store)",
            crate::proto::MAX_MODIFY_BYTES
        ))
    );
    // SETRANGE pads with zeros.
    assert_eq!(
        h.request(m(
            b"s",
            Modify::SetRange {
                offset: 5,
                data: b"Z".to_vec()
            }
        )),
        Ok(Reply::Modified {
            value: None,
            len: 6
        })
    );
    let get = |h: &mut H, key: &[u8]| match h.request(Op::Get { key: key.to_vec() }) {
        Ok(Reply::Value { data, .. }) => Some(data),
        _ => None,
    };
    assert_eq!(get(&mut h, b"s"), Some(b"abc\0\0Z".to_vec()));
    // Swap answers the old value; under IfAbsent it stores nothing.
    let swap = |cond| Modify::Swap {
        data: b"new".to_vec().into(),
        cond,
        ttl: crate::proto::Ttl::Clear,
    };
    assert_eq!(
        h.request(m(b"s", swap(Cond::IfAbsent))),
        Ok(Reply::Modified {
            value: Some(b"abc\0\0Z".to_vec()),
            len: 6
        })
    );
    assert_eq!(
        h.request(m(b"s", swap(Cond::Always))),
        Ok(Reply::Modified {
            value: Some(b"abc\0\0Z".to_vec()),
            len: 3
        })
    );
    assert_eq!(
        h.request(m(b"s", Modify::Take)),
        Ok(Reply::Modified {
            value: Some(b"new".to_vec()),
            len: 0
        })
    );
    assert_eq!(get(&mut h, b"s"), None);
    assert_eq!(
        h.request(m(b"s", Modify::Take)),
        Ok(Reply::Modified {
            value: None,
            len: 0
        })
    );
    // Every write reached the secondary.
    assert_eq!(
        h.node(2).status().applied_seq,
        h.node(1).status().applied_seq
    );
}

/// A secondary acknowledges a replicated write once it is planned, and
/// writes its value into the arena right after (`Node::settle`, which its
/// node loop calls once the acknowledgement is on its way): the
/// acknowledgement is among the outputs of the input that brought the
/// write while the arena does not hold the value yet, and the next input
/// settles before anything else, so the arenas end up identical.
#[test]
fn a_secondary_acknowledges_a_write_before_its_copy_into_the_arena() {
    let mut h = H::new();
    h.redundant();
    let value: Vec<u8> = (0..3000u32).map(|i| (i * 7 + i / 251) as u8).collect();
    let holds = |h: &H, n| {
        h.node(n)
            .memory()
            .bytes()
            .windows(value.len())
            .any(|w| w == value)
    };
    h.req_id += 1;
    let env = Envelope {
        epoch: h.node(1).epoch(),
        body: Body::Request {
            client: 77,
            req_id: h.req_id,
            op: Op::Put {
                key: b"big".to_vec(),
                data: value.clone().into(),
                cond: Cond::Always,
                ttl: crate::proto::Ttl::Clear,
            },
        },
    };
    h.feed(
        1,
        Input::Message {
            from: Addr::Client(77),
            env,
        },
    );
    let (from, to, rep) = h.msgs.pop_front().expect("the replicated write");
    assert!(matches!(rep.body, Body::Replicate { .. }), "{:?}", rep.body);
    h.feed(
        to,
        Input::Message {
            from: Addr::Node(from),
            env: rep,
        },
    );
    assert!(
        h.msgs
            .iter()
            .any(|(f, t, e)| (*f, *t) == (2, 1) && matches!(e.body, Body::ReplicateAck { .. })),
        "acknowledged at once"
    );
    assert_eq!(h.node(2).unsettled(), value.len());
    assert!(!holds(&h, 2), "the value reaches the arena after the ack");
    // The next input settles first.
    h.feed(2, Input::Tick);
    assert_eq!(h.node(2).unsettled(), 0);
    assert!(holds(&h, 2));
    h.run(4 * HB, &never);
    assert!(holds(&h, 1), "committed on the primary");
    assert_eq!(h.node(1).memory().bytes(), h.node(2).memory().bytes());
    // `settle` itself: nothing left to write.
    assert!(!h.nodes.get_mut(&2).unwrap().settle());
}

#[path = "batch_tests.rs"]
mod batch;
