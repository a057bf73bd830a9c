//! The commands about the connection and the server rather than keys:
//! `HELLO`, `CLIENT`, `INFO`, `TIME`, `WAIT`, `COMMAND`, `CONFIG`, worded
//! and shaped as Redis 7 answers them (RESP2 and RESP3).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::command_table::{self, TABLE};
use super::session::{integer, unknown_subcommand, upper, Out, Session};
use super::MAX_CLIENTS;
use crate::proto;
use crate::resp_codec::{Proto, Reply};

/// The Redis version the door speaks (`INFO`, `HELLO`): the commands and
/// replies of Redis 7.0.
pub(super) const REDIS_VERSION: &str = "7.0.0";

/// How often `WAIT` asks whether the group became redundant.
const WAIT_POLL: Duration = Duration::from_millis(10);

impl Session {
    /// `HELLO [protover [AUTH user pass] [SETNAME name]]`: switches the
    /// protocol (after authenticating, if asked) and describes the server.
    pub(super) fn hello(&mut self, args: &[Vec<u8>], out: &mut Out) -> Reply {
        let mut proto = out.proto;
        if args.len() >= 2 {
            proto = match integer(&args[1]) {
                Ok(2) => Proto::Resp2,
                Ok(3) => Proto::Resp3,
                Ok(_) => return Reply::err("NOPROTO unsupported protocol version"),
                Err(_) => {
                    return Reply::err("ERR Protocol version is not an integer or out of range")
                }
            };
        }
        let (mut auth, mut name) = (None, None);
        let mut i = 2;
        while i < args.len() {
            let more = args.len() - i - 1;
            match upper(&args[i]).as_str() {
                "AUTH" if more >= 2 => {
                    auth = Some((args[i + 1].clone(), args[i + 2].clone()));
                    i += 3;
                }
                "SETNAME" if more >= 1 => {
                    name = Some(args[i + 1].clone());
                    i += 2;
                }
                _ => {
                    return Reply::err(format!(
                        "ERR Syntax error in HELLO option '{}'",
                        String::from_utf8_lossy(&args[i])
                    ))
                }
            }
        }
        if let Some((user, pass)) = auth {
            if let r @ Reply::Error(_) = self.auth(&[b"AUTH".to_vec(), user, pass]) {
                return r;
            }
        }
        if self.user.is_none() {
            return Reply::err(
                "NOAUTH HELLO must be called with the client already authenticated, otherwise \
                 the HELLO <proto> AUTH <user> <pass> option can be used to authenticate the \
                 client and select the RESP protocol version at the same time",
            );
        }
        if let Some(n) = name {
            if let Err(r) = self.set_name(n) {
                return r;
            }
        }
        out.proto = proto;
        self.info
            .resp
            .store(if proto == Proto::Resp3 { 3 } else { 2 }, Ordering::Relaxed);
        let role = match self.role(false) {
            Ok((s, _)) if s.role == proto::ROLE_PRIMARY => "master",
            _ => "replica",
        };
        let kv = |k: &str, v: Reply| (Reply::text(k), v);
        Reply::Map(vec![
            kv("server", Reply::text("redis")),
            kv("version", Reply::text(REDIS_VERSION)),
            kv(
                "proto",
                Reply::Int(if proto == Proto::Resp3 { 3 } else { 2 }),
            ),
            kv("id", Reply::Int(self.info.no as i64)),
            kv("mode", Reply::text("cluster")),
            kv("role", Reply::text(role)),
            kv("modules", Reply::Array(Vec::new())),
        ])
    }

    /// `CLIENT SETNAME`'s check, as Redis words it.
    fn set_name(&mut self, name: Vec<u8>) -> Result<(), Reply> {
        if name.iter().any(|&c| !(b'!'..=b'~').contains(&c)) {
            return Err(Reply::err(
                "ERR Client names cannot contain spaces, newlines or special characters.",
            ));
        }
        *self.info.name.lock().expect("name") = name;
        Ok(())
    }

    /// `CLIENT subcommand ...`.
    pub(super) fn client(&mut self, args: &[Vec<u8>]) -> Reply {
        let n = args.len();
        let sub = upper(&args[1]);
        let arity = |want: bool| match want {
            true => None,
            false => Some(Reply::err(format!(
                "ERR wrong number of arguments for 'client|{}' command",
                sub.to_ascii_lowercase()
            ))),
        };
        match sub.as_str() {
            "SETNAME" => arity(n == 3).unwrap_or_else(|| match self.set_name(args[2].clone()) {
                Ok(()) => Reply::ok(),
                Err(r) => r,
            }),
            "GETNAME" => arity(n == 2).unwrap_or_else(|| {
                let name = self.info.name.lock().expect("name").clone();
                match name.is_empty() {
                    true => Reply::Nil,
                    false => Reply::Bulk(name),
                }
            }),
            "ID" => arity(n == 2).unwrap_or(Reply::Int(self.info.no as i64)),
            "SETINFO" => arity(n == 4).unwrap_or_else(Reply::ok),
            "INFO" => arity(n == 2)
                .unwrap_or_else(|| Reply::Verbatim(self.info.line("client|info").into())),
            "LIST" => {
                // `CLIENT LIST [TYPE normal]` lists every connection;
                // `ID id...` some.
                let mut only: Option<Vec<u64>> = None;
                match args.get(2).map(|a| upper(a)).as_deref() {
                    None => {}
                    Some("TYPE") if n == 4 => match upper(&args[3]).as_str() {
                        "NORMAL" => {}
                        "MASTER" | "REPLICA" | "SLAVE" | "PUBSUB" => only = Some(Vec::new()),
                        t => {
                            return Reply::err(format!(
                                "ERR Unknown client type '{}'",
                                t.to_ascii_lowercase()
                            ))
                        }
                    },
                    Some("ID") if n >= 4 => {
                        let mut ids = Vec::new();
                        for a in &args[3..] {
                            match integer(a) {
                                Ok(i) if i > 0 => ids.push(i as u64),
                                _ => return Reply::err("ERR Invalid client ID"),
                            }
                        }
                        only = Some(ids);
                    }
                    _ => return Reply::err("ERR syntax error"),
                }
                let clients: Vec<_> = self
                    .shared
                    .clients
                    .lock()
                    .expect("clients")
                    .values()
                    .cloned()
                    .collect();
                let mut t = String::new();
                for c in clients {
                    if only.as_ref().is_some_and(|ids| !ids.contains(&c.no)) {
                        continue;
                    }
                    let cmd = if c.no == self.info.no {
                        "client|list"
                    } else {
                        "NULL"
                    };
                    t.push_str(&c.line(cmd));
                }
                Reply::Verbatim(t.into_bytes())
            }
            "HELP" => Reply::Array(
                ["CLIENT <subcommand>: ID, INFO, LIST, SETNAME, GETNAME, SETINFO, HELP"]
                    .map(|l| Reply::Simple(l.into()))
                    .to_vec(),
            ),
            _ => unknown_subcommand("CLIENT", &args[1]),
        }
    }

    /// `COMMAND [COUNT|DOCS|INFO|LIST]`, from the command table.
    pub(super) fn command(&mut self, args: &[Vec<u8>]) -> Reply {
        if args.len() == 1 {
            return Reply::Array(TABLE.iter().map(|c| c.reply()).collect());
        }
        let n = args.len();
        match upper(&args[1]).as_str() {
            "DOCS" => Reply::Map(Vec::new()),
            "INFO" if n == 2 => Reply::Array(TABLE.iter().map(|c| c.reply()).collect()),
            "INFO" => Reply::Array(
                args[2..]
                    .iter()
                    .map(|a| {
                        command_table::find(&String::from_utf8_lossy(a))
                            .map_or(Reply::Nil, |c| c.reply())
                    })
                    .collect(),
            ),
            "LIST" => Reply::Array(TABLE.iter().map(|c| Reply::text(c.name)).collect()),
            "COUNT" if n == 2 => Reply::Int(TABLE.len() as i64),
            "COUNT" => Reply::err("ERR wrong number of arguments for 'command|count' command"),
            _ => unknown_subcommand("COMMAND", &args[1]),
        }
    }

    /// `CONFIG GET param...`: what clients and `redis-benchmark` ask; the
    /// store has no such settings (no snapshots, no append-only file).
    pub(super) fn config(&mut self, args: &[Vec<u8>]) -> Reply {
        match upper(&args[1]).as_str() {
            "GET" if args.len() >= 3 => {
                let mut pairs = Vec::new();
                for p in &args[2..] {
                    let v = match p.to_ascii_lowercase().as_slice() {
                        b"save" => String::new(),
                        b"appendonly" => "no".into(),
                        b"cluster-enabled" => "yes".into(),
                        b"databases" => "1".into(),
                        b"maxclients" => MAX_CLIENTS.to_string(),
                        _ => continue,
                    };
                    pairs.push((Reply::Bulk(p.to_ascii_lowercase()), Reply::text(v)));
                }
                Reply::Map(pairs)
            }
            "GET" => Reply::err("ERR wrong number of arguments for 'config|get' command"),
            _ => unknown_subcommand("CONFIG", &args[1]),
        }
    }

    /// `TIME`: seconds and microseconds since the epoch, as bulk strings.
    pub(super) fn time(&mut self) -> Reply {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default();
        Reply::Array(vec![
            Reply::text(now.as_secs().to_string()),
            Reply::text(now.subsec_micros().to_string()),
        ])
    }

    /// `WAIT numreplicas timeout`: the secondaries that hold every write
    /// this connection was answered (each write is acknowledged only once
    /// replicated, unless the group runs degraded under
    /// `min_in_sync_replicas = 0`): 1 while the group is redundant, else
    /// 0; while fewer than `numreplicas`, asked again until `timeout` ms
    /// (0: for ever), as Redis waits.
    pub(super) fn wait(&mut self, args: &[Vec<u8>]) -> Reply {
        let (want, timeout) = match (integer(&args[1]), integer(&args[2])) {
            (Err(r), _) | (_, Err(r)) => return r,
            (_, Ok(t)) if t < 0 => return Reply::err("ERR timeout is negative"),
            (Ok(w), Ok(t)) => (w, t),
        };
        let deadline =
            (timeout > 0).then(|| Instant::now() + Duration::from_millis(timeout as u64));
        loop {
            let have = match self.replicas_in_sync() {
                Ok(n) => n,
                Err(r) => return r,
            };
            if have >= want || deadline.is_some_and(|d| Instant::now() >= d) {
                return Reply::Int(have);
            }
            std::thread::sleep(WAIT_POLL);
        }
    }

    /// Secondaries in sync with the primary (1 or 0), as the primary says.
    fn replicas_in_sync(&mut self) -> Result<i64, Reply> {
        let (me, _) = self.role(true)?;
        if me.role == proto::ROLE_PRIMARY {
            return Ok(me.redundant as i64);
        }
        let members = self.members()?;
        Ok(members
            .iter()
            .find(|m| m.status.role == proto::ROLE_PRIMARY)
            .map_or(0, |p| p.status.redundant as i64))
    }

    /// `INFO [section ...]`: Redis's sections (those a store has) with
    /// the fields client libraries read, and the store's own.
    pub(super) fn info_reply(&mut self, args: &[Vec<u8>]) -> Reply {
        let all = [
            "server",
            "clients",
            "memory",
            "persistence",
            "stats",
            "replication",
            "cpu",
            "modules",
            "errorstats",
            "cluster",
            "keyspace",
        ];
        let mut want: Vec<&str> = Vec::new();
        if args.len() == 1 {
            want = all.to_vec();
        }
        for a in &args[1..] {
            let a = String::from_utf8_lossy(a).to_ascii_lowercase();
            match a.as_str() {
                "all" | "everything" | "default" => want.extend(all),
                s => {
                    if let Some(x) = all.iter().find(|x| **x == s) {
                        want.push(x)
                    }
                }
            }
        }
        let (s, primary) = match self.role(true) {
            Ok(x) => x,
            Err(r) => return r,
        };
        let mut t = String::new();
        for sec in all.iter().filter(|x| want.contains(x)) {
            if !t.is_empty() {
                t.push_str("\r\n");
            }
            match *sec {
                "server" => {
                    t.push_str("# Server\r\n");
                    let up = self.shared.started.elapsed().as_secs();
                    let now = SystemTime::now()
                        .duration_since(UNIX_EPOCH)
                        .unwrap_or_default();
                    put(&mut t, "redis_version", REDIS_VERSION.into());
                    put(&mut t, "redis_mode", "cluster".into());
                    put(&mut t, "os", std::env::consts::OS.into());
                    put(&mut t, "arch_bits", (usize::BITS).to_string());
                    put(&mut t, "multiplexing_api", "epoll".into());
                    put(&mut t, "process_id", std::process::id().to_string());
                    put(
                        &mut t,
                        "run_id",
                        super::cluster::node_id(s.arena_base, s.node as u64),
                    );
                    put(
                        &mut t,
                        "tcp_port",
                        self.info.laddr.map_or(0, |a| a.port()).to_string(),
                    );
                    put(&mut t, "server_time_usec", now.as_micros().to_string());
                    put(&mut t, "uptime_in_seconds", up.to_string());
                    put(&mut t, "uptime_in_days", (up / 86400).to_string());
                    put(&mut t, "softrdma_store", "1".into());
                    put(&mut t, "softrdma_version", env!("CARGO_PKG_VERSION").into());
                }
                "clients" => {
                    t.push_str("# Clients\r\n");
                    put(
                        &mut t,
                        "connected_clients",
                        self.shared.conns.load(Ordering::Relaxed).to_string(),
                    );
                    put(&mut t, "maxclients", MAX_CLIENTS.to_string());
                    put(&mut t, "blocked_clients", "0".into());
                }
                "memory" => {
                    t.push_str("# Memory\r\n");
                    put(&mut t, "used_memory", s.allocated.to_string());
                    put(&mut t, "maxmemory", s.arena_len.to_string());
                    put(&mut t, "maxmemory_policy", "noeviction".into());
                    put(&mut t, "arena_bytes", s.arena_len.to_string());
                    put(&mut t, "arena_used_bytes", s.allocated.to_string());
                    put(&mut t, "objects", s.objects.to_string());
                }
                "persistence" => {
                    t.push_str("# Persistence\r\n");
                    put(&mut t, "loading", "0".into());
                    put(&mut t, "async_loading", "0".into());
                    put(&mut t, "rdb_changes_since_last_save", "0".into());
                    put(&mut t, "rdb_bgsave_in_progress", "0".into());
                    let policy = crate::persist::Policy::from_code(s.persist);
                    put(&mut t, "aof_enabled", (policy.logs() as u8).to_string());
                    put(&mut t, "aof_rewrite_in_progress", "0".into());
                    if policy.logs() {
                        // The store's own: the policy (as Redis's
                        // appendfsync) and the last durable write.
                        put(&mut t, "softrdma_persist", policy.to_string());
                        put(&mut t, "softrdma_durable_seq", s.durable_seq.to_string());
                    }
                }
                "stats" => {
                    t.push_str("# Stats\r\n");
                    put(
                        &mut t,
                        "total_connections_received",
                        self.shared.accepted.load(Ordering::Relaxed).to_string(),
                    );
                    put(&mut t, "expired_keys", "0".into());
                    put(&mut t, "evicted_keys", "0".into());
                }
                "replication" => {
                    t.push_str("# Replication\r\n");
                    let master = s.role == proto::ROLE_PRIMARY;
                    put(
                        &mut t,
                        "role",
                        if master { "master" } else { "slave" }.into(),
                    );
                    if let Some(p) = primary {
                        put(&mut t, "master_host", p.ip().to_string());
                        put(&mut t, "master_port", p.port().to_string());
                        put(&mut t, "master_link_status", "up".into());
                    }
                    put(&mut t, "connected_slaves", (s.redundant as u8).to_string());
                    put(&mut t, "master_repl_offset", s.applied_seq.to_string());
                    put(&mut t, "softrdma_role", proto::role_name(s.role).into());
                    put(&mut t, "epoch", s.epoch.to_string());
                    put(&mut t, "redundant", (s.redundant as u8).to_string());
                    put(&mut t, "applied_seq", s.applied_seq.to_string());
                    put(&mut t, "min_in_sync_replicas", s.min_in_sync.to_string());
                    put(
                        &mut t,
                        "durability",
                        crate::config::durability(s.min_in_sync).into(),
                    );
                }
                "cpu" => {
                    t.push_str("# CPU\r\n");
                    let (user, sys) = cpu_seconds();
                    put(&mut t, "used_cpu_sys", format!("{sys:.6}"));
                    put(&mut t, "used_cpu_user", format!("{user:.6}"));
                }
                "modules" => t.push_str("# Modules\r\n"),
                "errorstats" => t.push_str("# Errorstats\r\n"),
                "cluster" => {
                    t.push_str("# Cluster\r\n");
                    put(&mut t, "cluster_enabled", "1".into());
                }
                "keyspace" => {
                    t.push_str("# Keyspace\r\n");
                    if s.keys > 0 {
                        // Redis's avg_ttl is an estimate from sampled keys;
                        // this is the exact mean over every key with a TTL.
                        let (expires, mean) = s.expires;
                        let avg_ttl = match expires {
                            0 => 0,
                            _ => mean.saturating_sub(crate::lookup::wall_ms()),
                        };
                        put(
                            &mut t,
                            "db0",
                            format!("keys={},expires={expires},avg_ttl={avg_ttl}", s.keys),
                        );
                    }
                }
                _ => unreachable!("one of `all`"),
            }
        }
        Reply::Verbatim(t.into_bytes())
    }
}

/// This process's user and system CPU seconds (`/proc/self/stat`).
fn cpu_seconds() -> (f64, f64) {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    // Fields after the command name's closing parenthesis; utime and
    // stime are the 14th and 15th fields of the line.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0) / 100.0;
    (tick(11), tick(12))
}

/// One `INFO` field.
fn put(t: &mut String, k: &str, v: String) {
    t.push_str(&format!("{k}:{v}\r\n"));
}
