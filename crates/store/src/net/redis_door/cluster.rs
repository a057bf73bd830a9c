//! The Redis Cluster protocol of the front door: a replica group is one
//! shard that holds all 16,384 slots, its primary the shard's master and
//! its secondary the replica. `CLUSTER SLOTS|SHARDS|NODES|MYID|INFO|
//! KEYSLOT`, `READONLY`/`READWRITE`/`ASKING` and `ROLE` answer from the
//! nodes' status, asked of each node directly, so every node names the
//! current primary and secondary.
//!
//! Reads stay linearizable: `READONLY` is accepted (cluster clients send
//! it before reading from a replica) but changes nothing, because every
//! node serves reads from the primary's arena (one-sided), never from a
//! copy of its own that could lag.

use std::net::SocketAddr;

use super::session::{integer, upper, wrong_args, Session};
use crate::proto::{self, StatusInfo};
use crate::resp_codec::{self, Reply};

/// Cluster slots: Redis Cluster's 16,384.
const SLOTS: i64 = 16384;

/// One node of the group as the cluster commands show it.
#[derive(Debug, Clone)]
pub(super) struct Member {
    /// Its RESP address (its store host, its RESP port).
    pub(super) resp: SocketAddr,
    /// Its store address (the "bus" of `CLUSTER NODES`).
    pub(super) store: SocketAddr,
    /// Its status.
    pub(super) status: StatusInfo,
    /// This node.
    pub(super) myself: bool,
}

impl Member {
    /// A 40-hex-digit node id, as stable as Redis's (a node keeps it
    /// across restarts): the group's arena address and the node's id.
    pub(super) fn id(&self) -> String {
        node_id(self.status.arena_base, self.status.node as u64)
    }

    fn is_primary(&self) -> bool {
        self.status.role == proto::ROLE_PRIMARY
    }
}

/// The cluster node id of node `node` of the group whose arena is at
/// `arena_base`.
pub(super) fn node_id(arena_base: u64, node: u64) -> String {
    format!("{arena_base:024x}{node:016x}")
}

impl Session {
    /// The group's nodes that answer now, this node first, each asked
    /// its status now.
    pub(super) fn members(&mut self) -> Result<Vec<Member>, Reply> {
        let (me, _) = self.role(true)?;
        let nodes = self.shared.nodes.clone();
        let resp_at = |addr: SocketAddr, s: &StatusInfo| SocketAddr::new(addr.ip(), s.resp_port);
        let mut out = vec![Member {
            resp: resp_at(nodes[0], &me),
            store: nodes[0],
            status: me,
            myself: true,
        }];
        self.shared.pooled(|c| {
            for (i, addr) in nodes.iter().enumerate().skip(1) {
                if let Ok(s) = c.status_of(i) {
                    if s.resp_port != 0 {
                        out.push(Member {
                            resp: resp_at(*addr, &s),
                            store: *addr,
                            status: s,
                            myself: false,
                        });
                    }
                }
            }
        })?;
        // A node that lost the primacy (fenced, or a stale primary that
        // has not heard yet) while a peer holds it at a higher epoch is
        // not a master.
        let top = out
            .iter()
            .filter(|m| m.is_primary())
            .map(|m| m.status.epoch)
            .max();
        for m in &mut out {
            if m.is_primary() && Some(m.status.epoch) != top {
                m.status.role = proto::ROLE_FENCED;
            }
        }
        Ok(out)
    }

    /// `CLUSTER subcommand ...`.
    pub(super) fn cluster(&mut self, args: &[Vec<u8>]) -> Reply {
        if args.len() < 2 {
            return wrong_args("CLUSTER");
        }
        let sub = upper(&args[1]);
        let arity = |ok: bool| -> Result<(), Reply> {
            match ok {
                true => Ok(()),
                false => Err(Reply::err(format!(
                    "ERR wrong number of arguments for 'cluster|{}' command",
                    sub.to_ascii_lowercase()
                ))),
            }
        };
        let n = args.len();
        let r = match sub.as_str() {
            "KEYSLOT" => arity(n == 3).map(|()| Reply::Int(resp_codec::key_slot(&args[2]) as i64)),
            "COUNTKEYSINSLOT" => arity(n == 3).and_then(|()| match integer(&args[2]) {
                Ok(s) if (0..SLOTS).contains(&s) => Err(Reply::err(
                    "ERR CLUSTER COUNTKEYSINSLOT is not supported: the store keeps no index by slot",
                )),
                _ => Err(Reply::err("ERR Invalid slot")),
            }),
            "MYID" => arity(n == 2).and_then(|()| {
                let m = self.members()?;
                Ok(Reply::text(m[0].id()))
            }),
            "SLOTS" => arity(n == 2).and_then(|()| Ok(slots(&self.members()?))),
            "SHARDS" => arity(n == 2).and_then(|()| Ok(shards(&self.members()?))),
            "NODES" => arity(n == 2).and_then(|()| Ok(Reply::Verbatim(nodes(&self.members()?)))),
            "INFO" => arity(n == 2).and_then(|()| Ok(Reply::Verbatim(info(&self.members()?)))),
            "HELP" => Ok(Reply::Array(
                [
                    "CLUSTER <subcommand> [<arg> [value] [opt] ...]. softrdma-store answers:",
                    "KEYSLOT <key>, MYID, SLOTS, SHARDS, NODES, INFO, HELP",
                    "(one shard: the replica group's primary holds all 16384 slots)",
                ]
                .map(|l| Reply::Simple(l.into()))
                .to_vec(),
            )),
            _ => Err(Reply::err(format!(
                "ERR unknown subcommand '{}'. Try CLUSTER HELP.",
                String::from_utf8_lossy(&args[1])
            ))),
        };
        r.unwrap_or_else(|e| e)
    }

    /// `ROLE`: `master` with its replica, or `slave` with its master.
    pub(super) fn role_reply(&mut self) -> Reply {
        let m = match self.members() {
            Ok(m) => m,
            Err(r) => return r,
        };
        let me = &m[0];
        let offset = Reply::Int(me.status.applied_seq as i64);
        if me.is_primary() {
            let replicas = m[1..]
                .iter()
                .filter(|r| r.status.role == proto::ROLE_SECONDARY)
                .map(|r| {
                    Reply::Array(vec![
                        Reply::text(r.resp.ip().to_string()),
                        Reply::text(r.resp.port().to_string()),
                        Reply::text(r.status.applied_seq.to_string()),
                    ])
                })
                .collect();
            return Reply::Array(vec![Reply::text("master"), offset, Reply::Array(replicas)]);
        }
        let (host, port, state) = match m.iter().find(|p| p.is_primary()) {
            Some(p) => (p.resp.ip().to_string(), p.resp.port() as i64, "connected"),
            None => ("?".to_string(), -1, "connect"),
        };
        let state = match me.status.role {
            proto::ROLE_SYNCING => "sync",
            _ => state,
        };
        Reply::Array(vec![
            Reply::text("slave"),
            Reply::text(host),
            Reply::Int(port),
            Reply::text(state),
            offset,
        ])
    }
}

/// A node of `CLUSTER SLOTS`: ip, port, id, metadata.
fn slot_node(m: &Member) -> Reply {
    Reply::Array(vec![
        Reply::text(m.resp.ip().to_string()),
        Reply::Int(m.resp.port() as i64),
        Reply::text(m.id()),
        Reply::Map(Vec::new()),
    ])
}

/// The primary, then the secondaries. While no node is the primary (a
/// failover under way), this node stands in as the master: a client's
/// write sent to it waits for the new primary (at most
/// `session::FAILOVER_WAIT`) and is then served or redirected, where an
/// empty topology would make cluster clients give up.
fn ordered(m: &[Member]) -> (Option<&Member>, Vec<&Member>) {
    let primary = m
        .iter()
        .find(|x| x.is_primary())
        .or_else(|| m.iter().find(|x| x.myself));
    let replicas = m
        .iter()
        .filter(|x| x.status.role == proto::ROLE_SECONDARY)
        .filter(|x| primary.is_none_or(|p| p.status.node != x.status.node))
        .collect();
    (primary, replicas)
}

/// `CLUSTER SLOTS`: one range, 0-16383, the primary first.
fn slots(m: &[Member]) -> Reply {
    let (Some(p), replicas) = ordered(m) else {
        return Reply::Array(Vec::new());
    };
    let mut range = vec![Reply::Int(0), Reply::Int(SLOTS - 1), slot_node(p)];
    range.extend(replicas.into_iter().map(slot_node));
    Reply::Array(vec![Reply::Array(range)])
}

/// `CLUSTER SHARDS`: the one shard, its slots and nodes.
fn shards(m: &[Member]) -> Reply {
    let (primary, replicas) = ordered(m);
    let node = |x: &Member, role: &str| {
        let kv = |k: &str, v: Reply| (Reply::text(k), v);
        Reply::Map(vec![
            kv("id", Reply::text(x.id())),
            kv("port", Reply::Int(x.resp.port() as i64)),
            kv("ip", Reply::text(x.resp.ip().to_string())),
            kv("endpoint", Reply::text(x.resp.ip().to_string())),
            kv("role", Reply::text(role)),
            kv(
                "replication-offset",
                Reply::Int(x.status.applied_seq as i64),
            ),
            kv("health", Reply::text("online")),
        ])
    };
    let mut nodes: Vec<Reply> = primary.iter().map(|p| node(p, "master")).collect();
    nodes.extend(replicas.into_iter().map(|r| node(r, "replica")));
    let slots = match primary {
        Some(_) => vec![Reply::Int(0), Reply::Int(SLOTS - 1)],
        None => Vec::new(),
    };
    Reply::Array(vec![Reply::Map(vec![
        (Reply::text("slots"), Reply::Array(slots)),
        (Reply::text("nodes"), Reply::Array(nodes)),
    ])])
}

/// `CLUSTER NODES`: a line per node, as Redis writes them (the store
/// port stands where a cluster bus port would).
fn nodes(m: &[Member]) -> Vec<u8> {
    let (primary, _) = ordered(m);
    let mut t = String::new();
    for x in m {
        let myself = if x.myself { "myself," } else { "" };
        let (flags, master) = match x.status.role {
            proto::ROLE_PRIMARY => ("master", "-".to_string()),
            proto::ROLE_SECONDARY | proto::ROLE_SYNCING => {
                ("slave", primary.map_or("-".to_string(), Member::id))
            }
            _ => ("noflags", "-".to_string()),
        };
        let slots = if x.is_primary() { " 0-16383" } else { "" };
        t.push_str(&format!(
            "{} {}:{}@{} {myself}{flags} {master} 0 0 {} connected{slots}\n",
            x.id(),
            x.resp.ip(),
            x.resp.port(),
            x.store.port(),
            x.status.epoch,
        ));
    }
    t.into_bytes()
}

/// `CLUSTER INFO`.
fn info(m: &[Member]) -> Vec<u8> {
    let ok = m.iter().any(Member::is_primary);
    let served = if ok { SLOTS } else { 0 };
    let epoch = m.iter().map(|x| x.status.epoch).max().unwrap_or(0);
    format!(
        "cluster_state:{}\r\ncluster_slots_assigned:{SLOTS}\r\ncluster_slots_ok:{served}\r\n\
         cluster_slots_pfail:0\r\ncluster_slots_fail:{}\r\ncluster_known_nodes:{}\r\n\
         cluster_size:1\r\ncluster_current_epoch:{epoch}\r\ncluster_my_epoch:{}\r\n\
         cluster_stats_messages_sent:0\r\ncluster_stats_messages_received:0\r\n\
         total_cluster_links_buffer_limit_exceeded:0\r\n",
        if ok { "ok" } else { "fail" },
        SLOTS - served,
        m.len(),
        m[0].status.epoch,
    )
    .into_bytes()
}
