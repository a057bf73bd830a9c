//! `softrdma store serve`: one node of a replica group on the verbs engine.
//!
//! Threads: the engine's progress thread (blocked output, hang-ups); a
//! listener accepting peers and clients; one dialer per configured peer
//! (each node sends to a peer on the link it dialed and receives on the
//! link the peer dialed); a ticker; a coordinator thread making the
//! blocking [`Coordinator`] calls; the RESP front door's
//! ([`super::redis_door`], if configured); and the **node loop**
//! (`node_loop.rs`), the only owner of the `Node` state machine and of
//! the arena's contents. The other threads post their events on the node
//! loop's channel and ring its waker. [`serve`] starts them in that order,
//! one named step each. Before them, a node back from its log runs the
//! herald (`herald.rs`) while it loads its snapshot, and stops it just
//! before the node loop starts.
//!
//! The arena is registered once, for remote reads, under the group's STag
//! at its own virtual address (`arena_reg.rs`), so a client's one-sided
//! RDMA Read of a [`RemotePtr`](crate::ptr::RemotePtr) works on either
//! node. The arena is never unmapped while the process runs: the engine
//! may be reading it.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use softrdma_verbs::{ConnParams, ConnectRequest};

use super::arena_reg::ArenaReg;
use super::handshake::{self, Admission, ClientAuth, Gate, Hello, NodeHello};
use super::herald::Herald;
use super::link::Endpoint;
use super::node_front::NodeFront;
use super::node_loop::{Ev, EvTx, NodeLoop, ROTATE_CLIENT};
use super::{persist_thread, random_u64, redis_door, CONNECT_TIMEOUT};
use crate::arena::{Arena, ArenaKind};
use crate::auth::Credentials;
use crate::config::{Config, CoordinatorConfig};
use crate::coord::embedded::EmbeddedClient;
use crate::coord::etcd::EtcdCoordinator;
use crate::coord::Coordinator;
use crate::node::{Addr, CoordReply, CoordRequest, Node, NodeConfig, Recovering};
use crate::persist::checkpoint::ArenaId;
use crate::persist::driver::Persister;
use crate::persist::Policy;
use crate::proto::Member;
use crate::ptr::ArenaRef;

/// Errors that stop `serve` from starting.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    /// Invalid configuration or arena placement.
    #[error("{0}")]
    Setup(String),
}

fn setup(e: impl std::fmt::Display) -> ServeError {
    ServeError::Setup(e.to_string())
}

fn coordinator(cfg: &Config, creds: &Credentials) -> Result<Arc<dyn Coordinator>, ServeError> {
    Ok(match &cfg.coordinator {
        CoordinatorConfig::Embedded { addr } => {
            Arc::new(EmbeddedClient::with_secret(*addr, creds.secret.clone()))
        }
        CoordinatorConfig::Etcd { endpoints } => {
            Arc::new(EtcdCoordinator::connect(endpoints).map_err(setup)?)
        }
    })
}

/// The coordinator `cfg` names, proving its `[auth]` secret (the
/// operator's `softrdma store promote` and `store reset` call it).
pub fn coordinator_for(cfg: &Config) -> Result<Arc<dyn Coordinator>, ServeError> {
    let creds = cfg.credentials().map_err(setup)?;
    coordinator(cfg, &creds)
}

/// Finds the group's arena: from the configuration, else from a peer that
/// has one (its accept reply), else, when the group has no record yet and
/// this node may start it, a new one (address chosen by the kernel, STag
/// generated here). Returns the mapped arena and its reference.
fn find_arena(
    cfg: &Config,
    ep: &Arc<Endpoint>,
    coord: &dyn Coordinator,
    me: Member,
    auth: Option<&ClientAuth>,
) -> Result<(Arena, ArenaRef), ServeError> {
    let len = cfg.arena_size.0;
    if let (Some(addr), Some(stag)) = (cfg.arena_addr, cfg.stag()) {
        let a = Arena::map_at(addr.0, len, ArenaKind::Private).map_err(setup)?;
        return Ok((
            a,
            ArenaRef {
                base: addr.0,
                len,
                stag,
            },
        ));
    }
    let hello = Hello::Node(NodeHello {
        member: me,
        group: cfg.group.clone(),
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut tries = 0u32;
    loop {
        tries += 1;
        for &p in &cfg.peers {
            let r = handshake::connect(ep, p, &hello, auth, CONNECT_TIMEOUT);
            match &r {
                // Credentials or the group do not match: waiting will not
                // change that.
                Err(handshake::HandshakeError::Refused(why)) => {
                    return Err(ServeError::Setup(format!(
                        "peer {p} refused this node: {why}"
                    )))
                }
                // Say why every ~2 s: a node stuck here otherwise logs nothing.
                Err(e) if tries % 20 == 1 => {
                    tracing::info!(peer = %p, error = %e, "no arena from peer yet")
                }
                _ => {}
            }
            if let Ok((link, acc)) = r {
                ep.remove(link.id());
                if let Some(r) = acc.arena {
                    if r.len != len {
                        return Err(ServeError::Setup(format!(
                            "peer {p} has an arena of {} bytes, this node is configured for {len}",
                            r.len
                        )));
                    }
                    let a = Arena::map_at(r.base, len, ArenaKind::Private).map_err(|e| {
                        ServeError::Setup(format!(
                            "cannot map the group's arena at the primary's address: {e}"
                        ))
                    })?;
                    tracing::info!(base = r.base, stag = r.stag, "arena adopted from peer {p}");
                    return Ok((a, r));
                }
            }
        }
        let record = coord.get(&cfg.group).map_err(setup)?;
        if record.is_none() && cfg.role != crate::config::RoleHint::Secondary {
            let a = match cfg.arena_addr {
                Some(addr) => Arena::map_at(addr.0, len, ArenaKind::Private),
                None => Arena::map_anywhere(len, ArenaKind::Private),
            }
            .map_err(setup)?;
            let stag = cfg.stag().unwrap_or_else(|| {
                // A 24-bit index in the upper half (local regions use low
                // indexes) and a random key byte.
                let r = random_u64();
                softrdma_verbs::Stag::new(0x80_0000 | (r as u32 & 0x7f_ffff), (r >> 32) as u8).raw()
            });
            let r = ArenaRef {
                base: a.base_addr(),
                len,
                stag,
            };
            tracing::info!(base = r.base, stag = r.stag, "new arena for group");
            return Ok((a, r));
        }
        if Instant::now() > deadline {
            return Err(ServeError::Setup(
                "no peer answered with the group's arena and the group already exists; \
                 is a primary running?"
                    .into(),
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Runs a node until the process is killed. `ready` is called once the node
/// listens, with the arena it serves.
pub fn serve(cfg: Config, ready: impl FnOnce(&ArenaRef)) -> Result<(), ServeError> {
    let started = Instant::now();
    cfg.validate().map_err(setup)?;
    let creds = Arc::new(cfg.credentials().map_err(setup)?);
    let mut me = Member {
        node: cfg.node_id,
        incarnation: random_u64(),
    };
    let policy = cfg.persist.policy().map_err(setup)?;
    // What this node proves to its peers (and its own store clients).
    let node_auth = creds.secret.clone().map(|secret| ClientAuth {
        user: crate::auth::DEFAULT_USER.into(),
        secret,
    });
    warn_if_open(&cfg, &creds);
    let gate = Arc::new(Gate::new(
        cfg.group.clone(),
        (*creds).clone(),
        cfg.auth.protected_mode,
    ));
    let ep = Endpoint::open(&format!("store{}", cfg.node_id)).map_err(setup)?;
    let (tx, rx) = EvTx::channel(ep.waker());
    let coord = coordinator(&cfg, &creds)?;
    // A node that persists and finds its state on its partition maps the
    // arena where that state lived (remote pointers stay valid) and
    // resumes its incarnation; otherwise it finds the group's arena.
    let mut dev = match policy.logs() {
        true => Some(persist_thread::open_device(&cfg).map_err(setup)?),
        false => None,
    };
    let stored = match dev.as_mut() {
        Some(d) => persist_thread::stored_arena(d).map_err(setup)?,
        None => None,
    };
    let (arena, aref) = match stored {
        Some(id) => {
            if id.size != cfg.arena_size.0 {
                return Err(ServeError::Setup(format!(
                    "the partition holds an arena of {} bytes; this node is configured for {}",
                    id.size, cfg.arena_size.0
                )));
            }
            let a = Arena::map_at(id.base, id.size, ArenaKind::Private).map_err(setup)?;
            let r = ArenaRef {
                base: id.base,
                len: id.size,
                stag: id.stag,
            };
            (a, r)
        }
        None => find_arena(&cfg, &ep, coord.as_ref(), me, node_auth.as_ref())?,
    };
    let mapped_ms = started.elapsed().as_millis() as u64;
    // Registered once the node holds its image (see `ArenaReg::unregistered`).
    let reg = ArenaReg::unregistered(&arena, aref);
    let mut persister = None;
    let mut herald = None;
    let node = match dev {
        None => Node::new(node_config(&cfg, me, aref, policy), arena),
        Some(dev) => {
            let id = ArenaId {
                size: aref.len,
                base: aref.base,
                stag: aref.stag,
            };
            let (mut p, found) = Persister::open(dev, id, 0).map_err(setup)?;
            tracing::info!(
                mapped_ms,
                opened_ms = started.elapsed().as_millis() as u64,
                "partition open"
            );
            let node = match found {
                Some(f) => {
                    me.incarnation = f.base.incarnation;
                    // Peers already loaded hear meanwhile how new the
                    // state this node loads is (`herald.rs`).
                    let standing = Recovering::<Arena>::standing_of(&f.base, &f.entries);
                    herald = Some(Herald::start(
                        &cfg.peers,
                        Hello::Node(NodeHello {
                            member: me,
                            group: cfg.group.clone(),
                        }),
                        node_auth.clone(),
                        me,
                        standing,
                        cfg.heartbeat_interval(),
                    ));
                    let ncfg = node_config(&cfg, me, aref, policy);
                    persist_thread::recover(&mut p, &f, ncfg, arena, started).map_err(|e| {
                        ServeError::Setup(format!(
                            "cannot recover from the partition: {e} (`softrdma store reset` \
                             starts this node empty)"
                        ))
                    })?
                }
                None => Node::new(node_config(&cfg, me, aref, policy), arena),
            };
            persister = Some(p);
            node
        }
    };
    reg.register(ep.pd(), aref.stag)
        .map_err(ServeError::Setup)?;
    tracing::info!(
        registered_ms = started.elapsed().as_millis() as u64,
        "arena registered"
    );
    let reg = Arc::new(reg);
    let persist = match persister {
        Some(p) => {
            let to_loop = tx.clone();
            let tell = move |m| to_loop.send(Ev::Persist(m));
            Some(persist_thread::spawn(p, policy, tell).map_err(setup)?)
        }
        None => None,
    };

    let threads = Threads {
        cfg: &cfg,
        me,
        ep: &ep,
        tx: &tx,
        stop: Arc::new(AtomicBool::new(false)),
        gate: &gate,
        reg: &reg,
        node_auth: &node_auth,
    };
    threads.listener()?;
    threads.dialers()?;
    threads.ticker(&creds)?;
    let coord = threads.coordinator(coord)?;
    threads.redis_door()?;
    ready(&aref);
    if let Some(h) = herald {
        h.stop();
    }
    NodeLoop::new(node, ep, (tx, rx), coord, reg, creds, persist).run();
    Ok(())
}

/// Says when the node serves without credentials.
fn warn_if_open(cfg: &Config, creds: &Credentials) {
    if creds.configured() {
        return;
    }
    if cfg.auth.protected_mode {
        tracing::warn!(
            "no credentials configured ([auth] secret): protected mode, serving loopback \
             peers only (native and RESP); configure a secret to serve other hosts"
        );
    } else {
        tracing::warn!(
            "no credentials configured and protected_mode = false: anyone who reaches \
             this node's ports can read and write the store"
        );
    }
}

/// The state machine's configuration, from the node's.
fn node_config(cfg: &Config, me: Member, aref: ArenaRef, persist: Policy) -> NodeConfig {
    NodeConfig {
        member: me,
        arena: aref,
        heartbeat_interval: cfg.heartbeat_interval().as_micros() as u64,
        heartbeat_timeout: cfg.heartbeat_timeout().as_micros() as u64,
        secondary_timeout: cfg.secondary_timeout().as_micros() as u64,
        lease_ttl: cfg.lease_ttl().as_micros() as u64,
        // Chunks are RDMA Reads of the primary's arena (see node_loop.rs).
        sync_chunk: 256 * 1024,
        sync_window: 4,
        min_in_sync: cfg.min_in_sync_replicas,
        clock_drift_permille: cfg.clock_drift_permille,
        index_buckets: cfg.index_buckets,
        resp_port: cfg.resp.map_or(0, |a| a.port()),
        // The node loop's clock starts when it is made, right after.
        clock_origin_ms: crate::lookup::wall_ms(),
        persist,
    }
}

/// What the threads around the node loop share; each method starts one
/// of them (or one per peer).
struct Threads<'a> {
    cfg: &'a Config,
    me: Member,
    ep: &'a Arc<Endpoint>,
    /// The node loop's queue.
    tx: &'a EvTx,
    /// Stops the listener and the dialers (never set: the process ends).
    stop: Arc<AtomicBool>,
    gate: &'a Arc<Gate>,
    reg: &'a Arc<ArenaReg>,
    node_auth: &'a Option<ClientAuth>,
}

impl Threads<'_> {
    /// The listener: admits peers and clients through the gate, and hands
    /// each link to the node loop.
    fn listener(&self) -> Result<(), ServeError> {
        let listener =
            self.ep.device().listen(self.cfg.listen).map_err(|e| {
                ServeError::Setup(format!("cannot listen on {}: {e}", self.cfg.listen))
            })?;
        let ep = self.ep.clone();
        let tx = self.tx.clone();
        let stop = self.stop.clone();
        let gate = self.gate.clone();
        let reg = self.reg.clone();
        let me = self.me.node;
        std::thread::Builder::new()
            .name("store-listen".into())
            .spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    let Ok(Some(req)) = listener.get_request_timeout(Duration::from_millis(200))
                    else {
                        continue;
                    };
                    accept(req, &ep, &gate, &reg, me, &tx);
                }
            })
            .map_err(setup)?;
        Ok(())
    }

    /// One dialer per configured peer.
    fn dialers(&self) -> Result<(), ServeError> {
        let hb = self.cfg.heartbeat_interval();
        for &peer in &self.cfg.peers {
            let ep = self.ep.clone();
            let tx = self.tx.clone();
            let stop = self.stop.clone();
            let hello = Hello::Node(NodeHello {
                member: self.me,
                group: self.cfg.group.clone(),
            });
            let auth = self.node_auth.clone();
            std::thread::Builder::new()
                .name("store-dial".into())
                .spawn(move || dialer(ep, peer, hello, auth, tx, stop, hb))
                .map_err(setup)?;
        }
        Ok(())
    }

    /// The ticker; it also watches the configuration file for credential
    /// changes (a stat per tick).
    fn ticker(&self, creds: &Arc<Credentials>) -> Result<(), ServeError> {
        let hb = self.cfg.heartbeat_interval();
        let tx = self.tx.clone();
        let watch = self.cfg.source.clone().map(|path| CredWatch {
            stamp: file_stamp(&path),
            path,
            creds: creds.clone(),
            gate: self.gate.clone(),
        });
        std::thread::Builder::new()
            .name("store-tick".into())
            .spawn(move || {
                let mut watch = watch;
                loop {
                    std::thread::sleep(hb / 2);
                    if let Some(ev) = watch.as_mut().and_then(CredWatch::poll) {
                        if !tx.send(ev) {
                            return;
                        }
                    }
                    if !tx.send(Ev::Tick) {
                        return;
                    }
                }
            })
            .map_err(setup)?;
        Ok(())
    }

    /// The coordinator thread; returns its queue. Each call is made as the
    /// member the node is when it asks: a node that rejoins takes a new
    /// incarnation (see `Node`), and the coordinator's record names that
    /// one as the in-sync secondary.
    fn coordinator(
        &self,
        coord: Arc<dyn Coordinator>,
    ) -> Result<Sender<(u64, CoordRequest, Member)>, ServeError> {
        let (ctx, crx) = mpsc::channel::<(u64, CoordRequest, Member)>();
        let tx = self.tx.clone();
        let group = self.cfg.group.clone();
        let ttl = self.cfg.lease_ttl();
        std::thread::Builder::new()
            .name("store-coord".into())
            .spawn(move || {
                for (id, req, me) in crx {
                    let c = coord.as_ref();
                    let reply = match req {
                        CoordRequest::Campaign => {
                            c.campaign(&group, me, ttl).map(CoordReply::Campaign)
                        }
                        CoordRequest::KeepAlive { epoch } => {
                            c.keep_alive(&group, me, epoch).map(CoordReply::KeepAlive)
                        }
                        CoordRequest::SetInSync { epoch, in_sync } => c
                            .set_in_sync(&group, me, epoch, in_sync)
                            .map(CoordReply::SetInSync),
                        CoordRequest::Get => c.get(&group).map(CoordReply::Get),
                        CoordRequest::Retire { new } => {
                            c.retire(&group, me, new).map(CoordReply::Retire)
                        }
                    }
                    .map_err(|e| e.to_string());
                    if !tx.send(Ev::Coord { id, reply }) {
                        return;
                    }
                }
            })
            .map_err(setup)?;
        Ok(ctx)
    }

    /// The RESP front door, if configured: it reaches the node only
    /// through a [`NodeFront`] (the node loop's queue and the arena's
    /// registration).
    fn redis_door(&self) -> Result<(), ServeError> {
        let Some(addr) = self.cfg.resp else {
            return Ok(());
        };
        let l = std::net::TcpListener::bind(addr)
            .map_err(|e| ServeError::Setup(format!("cannot listen for RESP on {addr}: {e}")))?;
        // The front door's clients talk to this node first.
        let mut own = self.cfg.listen;
        if own.ip().is_unspecified() {
            own.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        let nodes = std::iter::once(own)
            .chain(self.cfg.peers.iter().copied())
            .collect();
        let front = Arc::new(NodeFront {
            tx: self.tx.clone(),
            reg: self.reg.clone(),
            auth: self.node_auth.clone(),
        });
        redis_door::spawn(
            l,
            nodes,
            front,
            self.gate.clone(),
            self.cfg.auth.protected_mode,
        )
        .map_err(setup)
    }
}

/// Admits or refuses one connection request; an admitted link goes to the
/// node loop.
fn accept(
    req: ConnectRequest,
    ep: &Arc<Endpoint>,
    gate: &Gate,
    reg: &ArenaReg,
    me: crate::proto::NodeId,
    tx: &EvTx,
) {
    let peer = req.peer_addr();
    // The STag now: a client admitted after a rotation learns the new one.
    let arena = Some(reg.arena());
    let (hello, principal, reply) = match gate.admit(req.private_data(), peer, me, arena) {
        Admission::Accept {
            hello,
            principal,
            reply,
        } => (hello, principal, reply),
        Admission::Reject { reply, why } => {
            if why != "challenged" {
                tracing::info!(%peer, "connection refused: {why}");
            }
            let _ = req.reject(&reply);
            return;
        }
    };
    let who = match hello {
        Hello::Node(h) => Addr::Node(h.member.node),
        // The node's own rotations use this id: a client under it could
        // answer them from the retry table.
        Hello::Client { id, .. } if id == ROTATE_CLIENT || id == crate::node::REAP_CLIENT => {
            let _ = req.reject(
                &handshake::Refusal::Reason("softrdma-store: reserved client id".into()).encode(),
            );
            return;
        }
        Hello::Client { id, .. } => Addr::Client(id),
    };
    let Ok(link) = ep.new_link() else {
        let _ = req.reject(
            &handshake::Refusal::Reason("softrdma-store: out of resources".into()).encode(),
        );
        return;
    };
    link.set_peer(peer.to_string());
    let params = ConnParams {
        private_data: reply,
        ..Default::default()
    };
    if req.accept(link.qp(), &params).is_ok() && ep.activate(&link).is_ok() {
        let _ = tx.send(Ev::Accepted {
            link,
            who,
            principal,
        });
    } else {
        ep.remove(link.id());
    }
}

/// A file's modification time and size (`None`: unreadable).
fn file_stamp(path: &std::path::Path) -> Option<(std::time::SystemTime, u64)> {
    let m = std::fs::metadata(path).ok()?;
    Some((m.modified().ok()?, m.len()))
}

/// Re-reads the configuration's credentials when its file changes.
struct CredWatch {
    path: std::path::PathBuf,
    stamp: Option<(std::time::SystemTime, u64)>,
    creds: Arc<Credentials>,
    gate: Arc<Gate>,
}

impl CredWatch {
    /// An event for the node loop when the credentials changed. The gate
    /// checks new connections against them from here on, at once.
    fn poll(&mut self) -> Option<Ev> {
        let stamp = file_stamp(&self.path);
        if stamp == self.stamp {
            return None;
        }
        self.stamp = stamp;
        let new = match Config::load(&self.path).and_then(|c| c.credentials()) {
            Ok(c) => Arc::new(c),
            Err(e) => {
                // A half-written or bad file: keep the credentials we have.
                tracing::warn!("configuration changed but not taken: {e}");
                return None;
            }
        };
        if *new == *self.creds {
            return None;
        }
        tracing::info!(
            users = new.users.len(),
            secret = new.secret.is_some(),
            "credentials changed"
        );
        self.gate.set_credentials(new.clone());
        let old = std::mem::replace(&mut self.creds, new.clone());
        Some(Ev::Credentials { old, new })
    }
}

fn dialer(
    ep: Arc<Endpoint>,
    peer: SocketAddr,
    hello: Hello,
    auth: Option<ClientAuth>,
    tx: EvTx,
    stop: Arc<AtomicBool>,
    hb: Duration,
) {
    let mut refusals = 0u32;
    while !stop.load(Ordering::Acquire) {
        match handshake::connect(&ep, peer, &hello, auth.as_ref(), CONNECT_TIMEOUT) {
            Ok((link, acc)) => {
                refusals = 0;
                if !tx.send(Ev::Dialed {
                    link: link.clone(),
                    node: acc.node,
                }) {
                    return;
                }
                while !link.is_dead() && !stop.load(Ordering::Acquire) {
                    std::thread::sleep(hb / 2);
                }
            }
            Err(handshake::HandshakeError::Refused(why)) => {
                // Credentials differ (one node's configuration changed
                // before the other's): say so now and then, keep trying.
                if refusals.is_multiple_of(100) {
                    tracing::warn!(%peer, "peer refused this node: {why}");
                }
                refusals += 1;
            }
            Err(e) => tracing::debug!(%peer, error = %e, "dial failed"),
        }
        std::thread::sleep(hb);
    }
}
