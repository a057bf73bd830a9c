//! The door's command table: each command it serves with Redis 7's
//! arity, flags, key positions and ACL categories, for `COMMAND`,
//! `COMMAND INFO|COUNT|LIST` and the arity check every request passes.
//! Cluster clients (redis-py's `RedisCluster`, ioredis's `Cluster`) read
//! the key positions to find a command's slot. Key specs, tips and
//! subcommands are not given (first/last/step describe every command
//! here).

use crate::resp_codec::Reply;

/// One command as `COMMAND INFO` describes it.
pub(super) struct Cmd {
    /// Lower case.
    pub(super) name: &'static str,
    /// Arguments with the name: exactly `arity`, or at least `-arity`.
    pub(super) arity: i64,
    pub(super) flags: &'static [&'static str],
    /// First key, last key (negative: from the end), step.
    pub(super) keys: (i64, i64, i64),
    pub(super) acl: &'static [&'static str],
}

/// Every command the door serves.
pub(super) const TABLE: &[Cmd] = &[
    Cmd {
        name: "ping",
        arity: -1,
        flags: &["fast"],
        keys: (0, 0, 0),
        acl: &["@fast", "@connection"],
    },
    Cmd {
        name: "echo",
        arity: 2,
        flags: &["loading", "stale", "fast"],
        keys: (0, 0, 0),
        acl: &["@fast", "@connection"],
    },
    Cmd {
        name: "quit",
        arity: -1,
        flags: &[
            "noscript",
            "loading",
            "stale",
            "fast",
            "no_auth",
            "allow_busy",
        ],
        keys: (0, 0, 0),
        acl: &["@fast", "@connection"],
    },
    Cmd {
        name: "select",
        arity: 2,
        flags: &["loading", "stale", "fast"],
        keys: (0, 0, 0),
        acl: &["@fast", "@connection"],
    },
    Cmd {
        name: "command",
        arity: -1,
        flags: &["loading", "stale"],
        keys: (0, 0, 0),
        acl: &["@slow", "@connection"],
    },
    Cmd {
        name: "client",
        arity: -2,
        flags: &[],
        keys: (0, 0, 0),
        acl: &["@slow"],
    },
    Cmd {
        name: "config",
        arity: -2,
        flags: &[],
        keys: (0, 0, 0),
        acl: &["@slow"],
    },
    Cmd {
        name: "hello",
        arity: -1,
        flags: &[
            "noscript",
            "loading",
            "stale",
            "fast",
            "no_auth",
            "allow_busy",
        ],
        keys: (0, 0, 0),
        acl: &["@fast", "@connection"],
    },
    Cmd {
        name: "auth",
        arity: -2,
        flags: &[
            "noscript",
            "loading",
            "stale",
            "fast",
            "no_auth",
            "allow_busy",
        ],
        keys: (0, 0, 0),
        acl: &["@fast", "@connection"],
    },
    Cmd {
        name: "info",
        arity: -1,
        flags: &["loading", "stale"],
        keys: (0, 0, 0),
        acl: &["@slow", "@dangerous"],
    },
    Cmd {
        name: "time",
        arity: 1,
        flags: &["loading", "stale", "fast"],
        keys: (0, 0, 0),
        acl: &["@fast"],
    },
    Cmd {
        name: "role",
        arity: 1,
        flags: &["noscript", "loading", "stale", "fast"],
        keys: (0, 0, 0),
        acl: &["@admin", "@fast", "@dangerous"],
    },
    Cmd {
        name: "wait",
        arity: 3,
        flags: &["noscript"],
        keys: (0, 0, 0),
        acl: &["@slow", "@connection"],
    },
    Cmd {
        name: "cluster",
        arity: -2,
        flags: &[],
        keys: (0, 0, 0),
        acl: &["@slow"],
    },
    Cmd {
        name: "readonly",
        arity: 1,
        flags: &["loading", "stale", "fast"],
        keys: (0, 0, 0),
        acl: &["@fast", "@connection"],
    },
    Cmd {
        name: "readwrite",
        arity: 1,
        flags: &["loading", "stale", "fast"],
        keys: (0, 0, 0),
        acl: &["@fast", "@connection"],
    },
    Cmd {
        name: "asking",
        arity: 1,
        flags: &["fast"],
        keys: (0, 0, 0),
        acl: &["@fast", "@connection"],
    },
    Cmd {
        name: "get",
        arity: 2,
        flags: &["readonly", "fast"],
        keys: (1, 1, 1),
        acl: &["@read", "@string", "@fast"],
    },
    Cmd {
        name: "expire",
        arity: -3,
        flags: &["write", "fast"],
        keys: (1, 1, 1),
        acl: &["@keyspace", "@write", "@fast"],
    },
    Cmd {
        name: "pexpire",
        arity: -3,
        flags: &["write", "fast"],
        keys: (1, 1, 1),
        acl: &["@keyspace", "@write", "@fast"],
    },
    Cmd {
        name: "expireat",
        arity: -3,
        flags: &["write", "fast"],
        keys: (1, 1, 1),
        acl: &["@keyspace", "@write", "@fast"],
    },
    Cmd {
        name: "pexpireat",
        arity: -3,
        flags: &["write", "fast"],
        keys: (1, 1, 1),
        acl: &["@keyspace", "@write", "@fast"],
    },
    Cmd {
        name: "persist",
        arity: 2,
        flags: &["write", "fast"],
        keys: (1, 1, 1),
        acl: &["@keyspace", "@write", "@fast"],
    },
    Cmd {
        name: "ttl",
        arity: 2,
        flags: &["readonly", "fast"],
        keys: (1, 1, 1),
        acl: &["@keyspace", "@read", "@fast"],
    },
    Cmd {
        name: "pttl",
        arity: 2,
        flags: &["readonly", "fast"],
        keys: (1, 1, 1),
        acl: &["@keyspace", "@read", "@fast"],
    },
    Cmd {
        name: "expiretime",
        arity: 2,
        flags: &["readonly", "fast"],
        keys: (1, 1, 1),
        acl: &["@keyspace", "@read", "@fast"],
    },
    Cmd {
        name: "pexpiretime",
        arity: 2,
        flags: &["readonly", "fast"],
        keys: (1, 1, 1),
        acl: &["@keyspace", "@read", "@fast"],
    },
    Cmd {
        name: "setex",
        arity: 4,
        flags: &["write", "denyoom"],
        keys: (1, 1, 1),
        acl: &["@write", "@string", "@slow"],
    },
    Cmd {
        name: "psetex",
        arity: 4,
        flags: &["write", "denyoom"],
        keys: (1, 1, 1),
        acl: &["@write", "@string", "@slow"],
    },
    Cmd {
        name: "getex",
        arity: -2,
        flags: &["write", "fast"],
        keys: (1, 1, 1),
        acl: &["@write", "@string", "@fast"],
    },
    Cmd {
        name: "set",
        arity: -3,
        flags: &["write", "denyoom"],
        keys: (1, 1, 1),
        acl: &["@write", "@string", "@slow"],
    },
    Cmd {
        name: "setnx",
        arity: 3,
        flags: &["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: &["@write", "@string", "@fast"],
    },
    Cmd {
        name: "del",
        arity: -2,
        flags: &["write"],
        keys: (1, -1, 1),
        acl: &["@keyspace", "@write", "@slow"],
    },
    Cmd {
        name: "unlink",
        arity: -2,
        flags: &["write", "fast"],
        keys: (1, -1, 1),
        acl: &["@keyspace", "@write", "@fast"],
    },
    Cmd {
        name: "exists",
        arity: -2,
        flags: &["readonly", "fast"],
        keys: (1, -1, 1),
        acl: &["@keyspace", "@read", "@fast"],
    },
    Cmd {
        name: "mget",
        arity: -2,
        flags: &["readonly", "fast"],
        keys: (1, -1, 1),
        acl: &["@read", "@string", "@fast"],
    },
    Cmd {
        name: "mset",
        arity: -3,
        flags: &["write", "denyoom"],
        keys: (1, -1, 2),
        acl: &["@write", "@string", "@slow"],
    },
    Cmd {
        name: "flushdb",
        arity: -1,
        flags: &["write"],
        keys: (0, 0, 0),
        acl: &["@keyspace", "@write", "@slow", "@dangerous"],
    },
    Cmd {
        name: "flushall",
        arity: -1,
        flags: &["write"],
        keys: (0, 0, 0),
        acl: &["@keyspace", "@write", "@slow", "@dangerous"],
    },
    Cmd {
        name: "multi",
        arity: 1,
        flags: &["noscript", "loading", "stale", "fast", "allow_busy"],
        keys: (0, 0, 0),
        acl: &["@fast", "@transaction"],
    },
    Cmd {
        name: "exec",
        arity: 1,
        flags: &["noscript", "loading", "stale", "skip_slowlog"],
        keys: (0, 0, 0),
        acl: &["@slow", "@transaction"],
    },
    Cmd {
        name: "discard",
        arity: 1,
        flags: &["noscript", "loading", "stale", "fast", "allow_busy"],
        keys: (0, 0, 0),
        acl: &["@fast", "@transaction"],
    },
    Cmd {
        name: "watch",
        arity: -2,
        flags: &["noscript", "loading", "stale", "fast", "allow_busy"],
        keys: (1, -1, 1),
        acl: &["@fast", "@transaction"],
    },
    Cmd {
        name: "unwatch",
        arity: 1,
        flags: &["noscript", "loading", "stale", "fast", "allow_busy"],
        keys: (0, 0, 0),
        acl: &["@fast", "@transaction"],
    },
    Cmd {
        name: "msetnx",
        arity: -3,
        flags: &["write", "denyoom"],
        keys: (1, -1, 2),
        acl: &["@write", "@string", "@slow"],
    },
    Cmd {
        name: "keys",
        arity: 2,
        flags: &["readonly"],
        keys: (0, 0, 0),
        acl: &["@keyspace", "@read", "@slow", "@dangerous"],
    },
    Cmd {
        name: "scan",
        arity: -2,
        flags: &["readonly"],
        keys: (0, 0, 0),
        acl: &["@keyspace", "@read", "@slow"],
    },
    Cmd {
        name: "dbsize",
        arity: 1,
        flags: &["readonly", "fast"],
        keys: (0, 0, 0),
        acl: &["@keyspace", "@read", "@fast"],
    },
    Cmd {
        name: "type",
        arity: 2,
        flags: &["readonly", "fast"],
        keys: (1, 1, 1),
        acl: &["@keyspace", "@read", "@fast"],
    },
    Cmd {
        name: "strlen",
        arity: 2,
        flags: &["readonly", "fast"],
        keys: (1, 1, 1),
        acl: &["@read", "@string", "@fast"],
    },
    Cmd {
        name: "getrange",
        arity: 4,
        flags: &["readonly"],
        keys: (1, 1, 1),
        acl: &["@read", "@string", "@slow"],
    },
    Cmd {
        name: "substr",
        arity: 4,
        flags: &["readonly"],
        keys: (1, 1, 1),
        acl: &["@read", "@string", "@slow"],
    },
    Cmd {
        name: "incr",
        arity: 2,
        flags: &["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: &["@write", "@string", "@fast"],
    },
    Cmd {
        name: "incrby",
        arity: 3,
        flags: &["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: &["@write", "@string", "@fast"],
    },
    Cmd {
        name: "decr",
        arity: 2,
        flags: &["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: &["@write", "@string", "@fast"],
    },
    Cmd {
        name: "decrby",
        arity: 3,
        flags: &["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: &["@write", "@string", "@fast"],
    },
    Cmd {
        name: "incrbyfloat",
        arity: 3,
        flags: &["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: &["@write", "@string", "@fast"],
    },
    Cmd {
        name: "append",
        arity: 3,
        flags: &["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: &["@write", "@string", "@fast"],
    },
    Cmd {
        name: "setrange",
        arity: 4,
        flags: &["write", "denyoom"],
        keys: (1, 1, 1),
        acl: &["@write", "@string", "@slow"],
    },
    Cmd {
        name: "getset",
        arity: 3,
        flags: &["write", "denyoom", "fast"],
        keys: (1, 1, 1),
        acl: &["@write", "@string", "@fast"],
    },
    Cmd {
        name: "getdel",
        arity: 2,
        flags: &["write", "fast"],
        keys: (1, 1, 1),
        acl: &["@write", "@string", "@fast"],
    },
];

/// `name`'s entry (any case).
pub(super) fn find(name: &str) -> Option<&'static Cmd> {
    // By name, upper case (every command runs this, twice: a hash, not a
    // walk through the table).
    static INDEX: std::sync::LazyLock<std::collections::HashMap<String, usize>> =
        std::sync::LazyLock::new(|| {
            TABLE
                .iter()
                .enumerate()
                .map(|(i, c)| (c.name.to_ascii_uppercase(), i))
                .collect()
        });
    let i = match name.bytes().any(|b| b.is_ascii_lowercase()) {
        false => INDEX.get(name),
        true => INDEX.get(&name.to_ascii_uppercase()),
    };
    i.map(|&i| &TABLE[i])
}

/// Whether `n` arguments (with the name) suit `cmd`.
pub(super) fn arity_ok(cmd: &Cmd, n: usize) -> bool {
    let n = n as i64;
    match cmd.arity {
        a if a >= 0 => n == a,
        a => n >= -a,
    }
}

impl Cmd {
    /// Whether it changes keys (refused to read-only users).
    pub(super) fn writes(&self) -> bool {
        self.flags.contains(&"write")
    }

    /// Its `COMMAND INFO` entry.
    pub(super) fn reply(&self) -> Reply {
        let words =
            |w: &[&str]| Reply::Set(w.iter().map(|f| Reply::Simple(f.to_string())).collect());
        Reply::Array(vec![
            Reply::text(self.name),
            Reply::Int(self.arity),
            words(self.flags),
            Reply::Int(self.keys.0),
            Reply::Int(self.keys.1),
            Reply::Int(self.keys.2),
            words(self.acl),
            Reply::Set(Vec::new()),
            Reply::Set(Vec::new()),
            Reply::Array(Vec::new()),
        ])
    }
}
