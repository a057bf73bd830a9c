//! TOML configuration of `softrdma store serve --config FILE`.
//!
//! ```toml
//! group = "demo"
//! node_id = 1
//! role = "primary"                 # hint: "primary" | "secondary" | "auto"
//! listen = "127.0.0.1:7401"
//! peers = ["127.0.0.1:7402"]
//! arena_size = "64MiB"             # or a byte count
//! arena_addr = "0x7e00_0000_0000"  # optional: else the primary proposes one
//! stag = "0x00012345"              # optional: else the primary generates one
//! heartbeat_interval_ms = 50
//! heartbeat_timeout_ms = 250
//! secondary_timeout_ms = 2000      # a primary drops a silent secondary (default 8x the above)
//! min_in_sync_replicas = 1         # 0: a primary left alone acknowledges writes alone
//! clock_drift_permille = 50        # lease margin for clocks that run slow
//! index_buckets = 0                # key index size of a new group (0: one per 16 KiB of arena)
//! resp = "127.0.0.1:6380"          # optional: serve the Redis protocol here
//!
//! [auth]                           # optional: without it, loopback peers only
//! secret_file = "group.secret"     # or secret = "..."; nodes prove it, and it is
//!                                  # the `default` user's password (re-read while running)
//! [[auth.users]]
//! name = "reader"
//! password_file = "reader.secret"  # or password = "..."
//! rights = "read"                  # or "readwrite"
//!
//! [persist]                        # optional: without it, the group lives in memory
//! storage = "/var/lib/softrdma/n1.store"  # a local store (`softrdma storage init`), or
//! # target = "10.0.0.9:7470"       # a storage target (`softrdma storage serve`)
//! # token_file = "n1.token"        # with a target: the principal's token
//! partition = 0                    # this node's partition (index)
//! principal = "store"              # with a local store: who this node is there
//! policy = "everysec"              # off | everysec (the default here) | always
//!
//! [coordinator]
//! kind = "embedded"                # or "etcd"
//! addr = "127.0.0.1:7400"
//! # kind = "etcd"
//! # endpoints = ["http://127.0.0.1:2379"]
//! ```
//!
//! Defaults aim at sub-second failover: heartbeats every 50 ms, a peer is
//! declared failed after 250 ms of silence, leases last 200 ms.
//! [`Config::validate`] rejects inconsistent values with a message naming
//! the field; command-line flags override fields after parsing.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::arena::PAGE_SIZE;

/// Role hint; the coordinator decides.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum RoleHint {
    /// Campaign at start.
    Primary,
    /// Join an existing primary.
    Secondary,
    /// Ask the coordinator.
    #[default]
    Auto,
}

/// Which coordinator.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum CoordinatorConfig {
    /// The embedded coordinator at `addr` (started by one process of the
    /// group or the demo).
    Embedded {
        /// Loopback address.
        addr: SocketAddr,
    },
    /// An etcd cluster.
    Etcd {
        /// Client URLs.
        endpoints: Vec<String>,
    },
}

/// A byte size: an integer, or a string like `"64MiB"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "SizeRepr")]
pub struct ByteSize(pub u64);

#[derive(Deserialize)]
#[serde(untagged)]
enum SizeRepr {
    N(u64),
    S(String),
}

impl TryFrom<SizeRepr> for ByteSize {
    type Error = String;
    fn try_from(r: SizeRepr) -> Result<ByteSize, String> {
        match r {
            SizeRepr::N(n) => Ok(ByteSize(n)),
            SizeRepr::S(s) => parse_size(&s).map(ByteSize),
        }
    }
}

/// Parses `"4096"`, `"64KiB"`, `"64MiB"`, `"1GiB"` (also `K`, `M`, `G`).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim().replace('_', "");
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: u64 = num.parse().map_err(|_| format!("bad size {s:?}"))?;
    let mult: u64 = match unit.trim() {
        "" | "B" => 1,
        "K" | "KiB" => 1 << 10,
        "M" | "MiB" => 1 << 20,
        "G" | "GiB" => 1 << 30,
        u => return Err(format!("bad size unit {u:?} in {s:?}")),
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} overflows"))
}

/// A hex (`0x…`, underscores allowed) or decimal integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(try_from = "SizeRepr")]
pub struct HexU64(pub u64);

impl TryFrom<SizeRepr> for HexU64 {
    type Error = String;
    fn try_from(r: SizeRepr) -> Result<HexU64, String> {
        match r {
            SizeRepr::N(n) => Ok(HexU64(n)),
            SizeRepr::S(s) => {
                let t = s.trim().replace('_', "");
                let v = match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
                    Some(h) => u64::from_str_radix(h, 16),
                    None => t.parse(),
                };
                v.map(HexU64).map_err(|_| format!("bad number {s:?}"))
            }
        }
    }
}

fn default_hb_interval() -> u64 {
    50
}
fn default_hb_timeout() -> u64 {
    250
}
fn default_lease() -> u64 {
    200
}
fn default_drift() -> u64 {
    50
}
fn default_min_in_sync() -> u8 {
    1
}

/// A node's configuration.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Replica group name.
    pub group: String,
    /// This node's id (unique in the group, non-zero).
    pub node_id: u32,
    /// Role hint.
    #[serde(default)]
    pub role: RoleHint,
    /// Address to listen on (clients and peers).
    pub listen: SocketAddr,
    /// The other nodes.
    #[serde(default)]
    pub peers: Vec<SocketAddr>,
    /// Arena size (multiple of 4096, at most 256 GiB).
    pub arena_size: ByteSize,
    /// Arena address; if absent the primary proposes one.
    #[serde(default)]
    pub arena_addr: Option<HexU64>,
    /// STag; if absent the primary generates one.
    #[serde(default)]
    pub stag: Option<HexU64>,
    /// Heartbeat interval in ms.
    #[serde(default = "default_hb_interval")]
    pub heartbeat_interval_ms: u64,
    /// Silence in ms after which a peer counts as failed.
    #[serde(default = "default_hb_timeout")]
    pub heartbeat_timeout_ms: u64,
    /// Silence in ms after which a primary drops its secondary (default
    /// 8 x `heartbeat_timeout_ms`; at least that). See
    /// `NodeConfig::secondary_timeout` (node/mod.rs).
    #[serde(default)]
    pub secondary_timeout_ms: Option<u64>,
    /// Lease TTL in ms.
    #[serde(default = "default_lease")]
    pub lease_ttl_ms: u64,
    /// Secondaries that must hold a write before it is acknowledged: 1
    /// (default: every acknowledged write is in both nodes' memory; a
    /// primary left alone refuses writes until a secondary is in sync
    /// again) or 0 (a primary left alone keeps acknowledging writes, held
    /// by it only, and lost if it fails before a copy completes). The
    /// trade-off is in docs/store.md (issue 29, finding 4).
    #[serde(default = "default_min_in_sync")]
    pub min_in_sync_replicas: u8,
    /// How much (parts per thousand) a node's clock may run slow against
    /// the coordinator's; the primary stops serving this share of its
    /// lease early.
    #[serde(default = "default_drift")]
    pub clock_drift_permille: u64,
    /// Buckets of the key index (31 keys each) a new group's arena gets;
    /// 0 (default): one per 16 KiB of arena. A joining node takes the
    /// group's, whatever it is configured with.
    #[serde(default)]
    pub index_buckets: u64,
    /// Where to serve the Redis protocol (RESP), if anywhere
    /// (`net::redis_door`).
    #[serde(default)]
    pub resp: Option<SocketAddr>,
    /// Coordinator.
    pub coordinator: CoordinatorConfig,
    /// Credentials (`[auth]`): the group secret and users; none: protected
    /// mode (loopback peers only). Re-read while the node runs.
    #[serde(default)]
    pub auth: crate::auth::AuthConfig,
    /// Persistence (`[persist]`, issue 33): where this node's log and
    /// snapshots go, and the policy.
    #[serde(default)]
    pub persist: PersistConfig,
    /// The file this configuration was read from (relative secret files
    /// are taken from its folder; the node watches it for credential
    /// changes).
    #[serde(skip)]
    pub source: Option<std::path::PathBuf>,
}

/// Where a node persists, and when a write counts as durable
/// (docs/store.md, "Persistence").
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PersistConfig {
    /// `off`, `everysec` or `always`; the default is `everysec` when a
    /// storage is named, `off` otherwise.
    #[serde(default)]
    pub policy: Option<String>,
    /// A local store (a path, or `storage:PATH`), reached through a local
    /// queue pair.
    #[serde(default)]
    pub storage: Option<String>,
    /// A storage target (`softrdma storage serve`), reached over iWARP.
    #[serde(default)]
    pub target: Option<SocketAddr>,
    /// With `target`: the file holding the principal's token (hex, as
    /// `softrdma storage token` prints it).
    #[serde(default)]
    pub token_file: Option<PathBuf>,
    /// The partition (index) that holds this node's state.
    #[serde(default)]
    pub partition: u32,
    /// With `storage`: the principal this node is in the store (it needs
    /// `rw` on the partition).
    #[serde(default = "default_principal")]
    pub principal: String,
}

fn default_principal() -> String {
    "store".into()
}

impl PersistConfig {
    /// The policy in force.
    pub fn policy(&self) -> Result<crate::persist::Policy, ConfigError> {
        use crate::persist::Policy;
        let named = self.storage.is_some() || self.target.is_some();
        match self.policy.as_deref() {
            None if named => Ok(Policy::Everysec),
            None => Ok(Policy::Off),
            Some(p) => {
                let p: Policy = p.parse().map_err(ConfigError::Invalid)?;
                if p.logs() && !named {
                    return Err(ConfigError::Invalid(format!(
                        "persist.policy = \"{p}\" needs persist.storage or persist.target"
                    )));
                }
                Ok(p)
            }
        }
    }
}

/// A configuration error.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Unreadable file.
    #[error("cannot read {path}: {err}")]
    Io {
        /// File.
        path: String,
        /// Error.
        err: std::io::Error,
    },
    /// Not valid TOML or wrong fields.
    #[error("invalid configuration: {0}")]
    Parse(String),
    /// Inconsistent values.
    #[error("invalid configuration: {0}")]
    Invalid(String),
}

/// What an acknowledged write is held by under `min_in_sync_replicas`,
/// in words: the promise `status`, `INFO` and the demo print.
pub fn durability(min_in_sync_replicas: u8) -> &'static str {
    if min_in_sync_replicas >= 1 {
        "every acknowledged write is in both nodes' memory (lost only if both fail before a new copy completes)"
    } else {
        "acknowledged writes are in both nodes' memory while redundant, in the primary's alone while degraded (lost if it then fails)"
    }
}

impl Config {
    /// Parses and validates TOML text.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let c: Config = toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        c.validate()?;
        Ok(c)
    }

    /// Reads, parses and validates a file.
    pub fn load(path: &std::path::Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|err| ConfigError::Io {
            path: path.display().to_string(),
            err,
        })?;
        let mut c = Config::parse(&text)?;
        c.source = Some(path.to_path_buf());
        c.credentials()?;
        Ok(c)
    }

    /// The credentials the `[auth]` section describes (its files read now).
    pub fn credentials(&self) -> Result<crate::auth::Credentials, ConfigError> {
        let base = self.source.as_deref().and_then(|p| p.parent());
        self.auth.credentials(base).map_err(ConfigError::Invalid)
    }

    /// Checks the values are consistent.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.group.is_empty() || self.group.contains(['/', ' ', '\n']) {
            return bad(format!(
                "group {:?}: non-empty, no '/' or spaces",
                self.group
            ));
        }
        if self.node_id == 0 {
            return bad("node_id must be non-zero".into());
        }
        let size = self.arena_size.0;
        if size == 0 || !size.is_multiple_of(PAGE_SIZE) {
            return bad(format!(
                "arena_size {size} must be a non-zero multiple of {PAGE_SIZE}"
            ));
        }
        if size > crate::index::MAX_ARENA_LEN {
            // An index slot holds an object's offset in 64-byte units in
            // 32 bits.
            return bad(format!(
                "arena_size {size} exceeds the largest arena, {} bytes (256 GiB)",
                crate::index::MAX_ARENA_LEN
            ));
        }
        if let Some(HexU64(a)) = self.arena_addr {
            if a == 0 || !a.is_multiple_of(PAGE_SIZE) {
                return bad(format!(
                    "arena_addr {a:#x} must be non-zero and page aligned"
                ));
            }
        }
        if let Some(HexU64(s)) = self.stag {
            if s > u32::MAX as u64 {
                return bad(format!("stag {s:#x} exceeds 32 bits"));
            }
        }
        if self.heartbeat_interval_ms == 0
            || self.heartbeat_timeout_ms <= self.heartbeat_interval_ms
        {
            return bad(format!(
                "heartbeat_timeout_ms ({}) must exceed heartbeat_interval_ms ({}) > 0",
                self.heartbeat_timeout_ms, self.heartbeat_interval_ms
            ));
        }
        if self
            .secondary_timeout_ms
            .is_some_and(|t| t < self.heartbeat_timeout_ms)
        {
            return bad(format!(
                "secondary_timeout_ms ({}) must be at least heartbeat_timeout_ms ({})",
                self.secondary_timeout_ms.unwrap_or(0),
                self.heartbeat_timeout_ms
            ));
        }
        if self.lease_ttl_ms <= self.heartbeat_interval_ms {
            return bad(format!(
                "lease_ttl_ms ({}) must exceed heartbeat_interval_ms ({}): leases are renewed each beat",
                self.lease_ttl_ms, self.heartbeat_interval_ms
            ));
        }
        if self.min_in_sync_replicas > 1 {
            return bad(format!(
                "min_in_sync_replicas ({}) must be 0 or 1: a group has one secondary",
                self.min_in_sync_replicas
            ));
        }
        if self.clock_drift_permille >= 500 {
            return bad(format!(
                "clock_drift_permille ({}) must be below 500",
                self.clock_drift_permille
            ));
        }
        let most = (self.arena_size.0 / 4) / crate::index::BUCKET_LEN as u64;
        if self.index_buckets > most {
            return bad(format!(
                "index_buckets ({}) would take more than a quarter of the arena (at most {most})",
                self.index_buckets
            ));
        }
        if self.peers.contains(&self.listen) {
            return bad(format!(
                "peers include this node's own address {}",
                self.listen
            ));
        }
        if let CoordinatorConfig::Etcd { endpoints } = &self.coordinator {
            if endpoints.is_empty() {
                return bad("coordinator.endpoints is empty".into());
            }
        }
        let p = &self.persist;
        p.policy()?;
        if p.storage.is_some() && p.target.is_some() {
            return bad("persist: name storage or target, not both".into());
        }
        if p.target.is_some() != p.token_file.is_some() {
            return bad("persist: a target needs token_file (and only a target has one)".into());
        }
        Ok(())
    }

    /// Heartbeat interval.
    pub fn heartbeat_interval(&self) -> Duration {
        Duration::from_millis(self.heartbeat_interval_ms)
    }
    /// Heartbeat timeout.
    pub fn heartbeat_timeout(&self) -> Duration {
        Duration::from_millis(self.heartbeat_timeout_ms)
    }
    /// How long a primary waits for a silent secondary before it drops it.
    pub fn secondary_timeout(&self) -> Duration {
        Duration::from_millis(
            self.secondary_timeout_ms
                .unwrap_or(8 * self.heartbeat_timeout_ms),
        )
    }
    /// What an acknowledged write is held by under this configuration,
    /// in words (for `status`, `INFO` and the demo's summary).
    pub fn durability(&self) -> &'static str {
        durability(self.min_in_sync_replicas)
    }
    /// Lease TTL.
    pub fn lease_ttl(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_ms)
    }
    /// The STag, if configured.
    pub fn stag(&self) -> Option<u32> {
        self.stag.map(|s| s.0 as u32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FULL: &str = r#"
        group = "demo"
        node_id = 1
        role = "primary"
        listen = "127.0.0.1:7401"
        peers = ["127.0.0.1:7402"]
        arena_size = "64MiB"
        arena_addr = "0x7e00_0000_0000"
        stag = "0x00012345"
        heartbeat_interval_ms = 20
        heartbeat_timeout_ms = 100
        [coordinator]
        kind = "embedded"
        addr = "127.0.0.1:7400"
    "#;

    #[test]
    fn full_config_parses() {
        let c = Config::parse(FULL).unwrap();
        assert_eq!(c.group, "demo");
        assert_eq!(c.role, RoleHint::Primary);
        assert_eq!(c.arena_size, ByteSize(64 << 20));
        assert_eq!(c.arena_addr, Some(HexU64(0x7e00_0000_0000)));
        assert_eq!(c.stag(), Some(0x12345));
        assert_eq!(c.heartbeat_interval(), Duration::from_millis(20));
        assert_eq!(c.lease_ttl(), Duration::from_millis(200));
        assert_eq!(
            c.coordinator,
            CoordinatorConfig::Embedded {
                addr: "127.0.0.1:7400".parse().unwrap()
            }
        );
    }

    #[test]
    fn minimal_config_gets_subsecond_defaults() {
        let c = Config::parse(
            r#"
            group = "g"
            node_id = 2
            listen = "127.0.0.1:7402"
            arena_size = 1048576
            coordinator = { kind = "etcd", endpoints = ["http://127.0.0.1:2379"] }
            "#,
        )
        .unwrap();
        assert_eq!(c.role, RoleHint::Auto);
        assert_eq!(c.arena_addr, None);
        assert!(c.heartbeat_timeout() < Duration::from_secs(1));
        assert!(c.heartbeat_interval() < c.heartbeat_timeout());
    }

    #[test]
    fn bad_configs_name_the_field() {
        let cases = [
            (
                "arena_size = \"64MiB\"",
                "arena_size = \"1000\"",
                "arena_size",
            ),
            (
                "arena_addr = \"0x7e00_0000_0000\"",
                "arena_addr = \"0x7e00_0000_0001\"",
                "arena_addr",
            ),
            ("stag = \"0x00012345\"", "stag = \"0x1_0000_0000\"", "stag"),
            (
                "arena_size = \"64MiB\"",
                "arena_size = \"257GiB\"",
                "arena_size",
            ),
            (
                "heartbeat_timeout_ms = 100",
                "heartbeat_timeout_ms = 10",
                "heartbeat_timeout_ms",
            ),
            ("node_id = 1", "node_id = 0", "node_id"),
            ("role = \"primary\"", "role = \"boss\"", "role"),
            ("group = \"demo\"", "group = \"demo\"\nbogus = 1", "bogus"),
        ];
        for (from, to, field) in cases {
            let text = FULL.replace(from, to);
            let err = Config::parse(&text).unwrap_err().to_string();
            assert!(err.contains(field), "{field}: {err}");
        }
        // The largest arena is taken.
        let most = FULL.replace("arena_size = \"64MiB\"", "arena_size = \"256GiB\"");
        assert_eq!(
            Config::parse(&most).unwrap().arena_size,
            ByteSize(256 << 30)
        );
        assert_eq!(parse_size("4KiB"), Ok(4096));
        assert!(parse_size("4 parsecs").is_err());
    }
}
