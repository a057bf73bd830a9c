//! Who may talk to a replica group: credentials and the connection
//! handshake's proofs (issue 29, finding 1).
//!
//! A group has a **secret** (`[auth] secret` or `secret_file` in every
//! node's configuration): nodes prove it to each other, and it is the
//! password of the `default` user, as Redis's `requirepass` is. More
//! **users** may be listed, each with a password and rights: `read`
//! (one-sided reads, `get`, `keys`, status) or `readwrite`. Key patterns
//! are not offered: a client that may read gets the arena's STag, and a
//! one-sided RDMA Read reaches every byte of the arena, so a per-key read
//! right could not be enforced without giving up one-sided reads.
//!
//! Nothing secret crosses the network. A native connection is
//! challenge-response in the RDMA connection manager's private data (two
//! MPA exchanges, at connect time only):
//!
//! 1. the client connects naming itself and its user, without a proof;
//! 2. a node that requires credentials rejects that attempt with a
//!    challenge: a fresh **server nonce** ([`Issuer`]: a time stamp and a
//!    MAC under a per-process key, so the node keeps no state for it);
//! 3. the client connects again with the nonce, a nonce of its own and
//!    `HMAC-SHA256(key, what it says)` ([`client_proof`]);
//! 4. the node checks the MAC and the nonce (its own, younger than
//!    [`NONCE_TTL`], never used before: [`Issuer::redeem`]) and accepts
//!    with the arena's address and STag and a proof of its own over both
//!    nonces and what it answers ([`server_proof`]), so the client knows
//!    it reached a node of the group and that the STag is the group's.
//!
//! A refusal is a rejection with a reason ([`REJECT_MAGIC`]), which the
//! client reports at once ("authentication failed"), never a timeout.
//! `key` is SHA-256 of the password under a domain label ([`Secret`]); a
//! captured exchange cannot be replayed (the server nonce is single-use)
//! and does not reveal the password except to an offline guess of a weak
//! one. The traffic itself is not encrypted: docs/store.md, "Threat
//! model".

use std::collections::HashMap;
use std::fmt;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// Length of a nonce.
pub const NONCE_LEN: usize = 16;
/// Length of a proof (HMAC-SHA256).
pub const PROOF_LEN: usize = 32;
/// How long a server nonce may be redeemed after it was issued.
pub const NONCE_TTL: Duration = Duration::from_secs(10);
/// Longest user name.
pub const MAX_USER: usize = 64;
/// The first bytes of a rejection's private data that carries a reason
/// for the client (authentication failed, protected mode, ...).
pub const REJECT_MAGIC: &[u8; 4] = b"SRE2";
/// The first bytes of a rejection that carries a challenge.
pub const CHALLENGE_MAGIC: &[u8; 4] = b"SRX2";
/// The user a group's secret is the password of.
pub const DEFAULT_USER: &str = "default";

/// A password or secret, kept only as the key derived from it. Its
/// `Debug` and `Display` never show it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret {
    key: [u8; 32],
}

impl Secret {
    /// The key of `password`.
    pub fn new(password: &[u8]) -> Secret {
        let mut h = Sha256::new();
        h.update(b"softrdma-store password v1\0");
        h.update(password);
        Secret {
            key: h.finalize().into(),
        }
    }

    /// Whether `password` is this secret's (constant time).
    pub fn matches(&self, password: &[u8]) -> bool {
        let other = Secret::new(password);
        let mut diff = 0u8;
        for (a, b) in self.key.iter().zip(other.key.iter()) {
            diff |= a ^ b;
        }
        diff == 0
    }

    fn mac(&self) -> HmacSha256 {
        <HmacSha256 as Mac>::new_from_slice(&self.key).expect("HMAC takes any key length")
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// What a user may do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Rights {
    /// One-sided reads, `get`, `keys`, status.
    Read,
    /// Everything a client can do.
    ReadWrite,
}

impl Rights {
    /// Its byte in the accept reply.
    pub fn byte(self) -> u8 {
        match self {
            Rights::Read => 1,
            Rights::ReadWrite => 3,
        }
    }
    /// From its byte in the accept reply.
    pub fn from_byte(b: u8) -> Option<Rights> {
        match b {
            1 => Some(Rights::Read),
            3 => Some(Rights::ReadWrite),
            _ => None,
        }
    }
}

/// A user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// Name, 1 to [`MAX_USER`] bytes, no spaces.
    pub name: String,
    /// Password.
    pub secret: Secret,
    /// Rights.
    pub rights: Rights,
}

/// A node's credentials: the group secret and the users.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Credentials {
    /// The group's secret (nodes; the `default` user's password).
    pub secret: Option<Secret>,
    /// Further users.
    pub users: Vec<User>,
}

impl Credentials {
    /// Whether any credential is configured (else the node runs in
    /// protected mode: loopback peers only).
    pub fn configured(&self) -> bool {
        self.secret.is_some() || !self.users.is_empty()
    }

    /// The key and rights of `user`, if it exists.
    pub fn user(&self, user: &str) -> Option<(&Secret, Rights)> {
        if let Some(u) = self.users.iter().find(|u| u.name == user) {
            return Some((&u.secret, u.rights));
        }
        match (&self.secret, user) {
            (Some(s), DEFAULT_USER) => Some((s, Rights::ReadWrite)),
            _ => None,
        }
    }

    /// Checks a RESP `AUTH [user] password`: the user's rights, or `None`.
    pub fn check_password(&self, user: &str, password: &[u8]) -> Option<Rights> {
        self.user(user)
            .filter(|(s, _)| s.matches(password))
            .map(|(_, r)| r)
    }

    /// Whether a principal authenticated under `old` (user, rights) keeps
    /// the same access under `self`: same key, rights not narrowed.
    pub fn still_grants(&self, old: &Credentials, user: &str) -> bool {
        match (old.user(user), self.user(user)) {
            (Some((ok, or)), Some((nk, nr))) => ok == nk && nr >= or,
            _ => false,
        }
    }

    /// Whether `self` takes any access away from what `old` granted (a
    /// user removed, a password or the secret changed, rights narrowed):
    /// what must rotate the arena's STag.
    pub fn narrows(&self, old: &Credentials) -> bool {
        let mut names: Vec<&str> = old.users.iter().map(|u| u.name.as_str()).collect();
        if old.secret.is_some() {
            names.push(DEFAULT_USER);
        }
        names.into_iter().any(|n| !self.still_grants(old, n))
    }
}

/// Text that must not be shown (a password in the configuration): its
/// `Debug` is redacted.
#[derive(Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(transparent)]
pub struct SecretText(String);

impl fmt::Debug for SecretText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// A user in the configuration.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UserConfig {
    /// Name.
    pub name: String,
    /// Password, in the file itself.
    #[serde(default)]
    pub password: Option<SecretText>,
    /// Or a file whose first line is the password.
    #[serde(default)]
    pub password_file: Option<std::path::PathBuf>,
    /// `read` or `readwrite`.
    pub rights: Rights,
}

fn yes() -> bool {
    true
}

/// The `[auth]` section of a node's configuration. Secrets live in the
/// configuration file (or files it names), never on a command line.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    /// The group secret, in the file itself.
    #[serde(default)]
    pub secret: Option<SecretText>,
    /// Or a file whose first line is the group secret.
    #[serde(default)]
    pub secret_file: Option<std::path::PathBuf>,
    /// Further users.
    #[serde(default)]
    pub users: Vec<UserConfig>,
    /// With no credential configured, serve loopback peers only (default
    /// true, as Redis's `protected-mode yes`).
    #[serde(default = "yes")]
    pub protected_mode: bool,
}

impl Default for AuthConfig {
    fn default() -> AuthConfig {
        AuthConfig {
            secret: None,
            secret_file: None,
            users: Vec::new(),
            protected_mode: true,
        }
    }
}

/// The first line of `path` (relative paths are taken from `base`), as a
/// secret; errors name the file, never its contents.
fn read_secret(path: &std::path::Path, base: Option<&std::path::Path>) -> Result<Secret, String> {
    let full = match base {
        Some(b) if path.is_relative() => b.join(path),
        _ => path.to_path_buf(),
    };
    let text = std::fs::read(&full).map_err(|e| format!("cannot read {}: {e}", full.display()))?;
    let line = text.split(|&b| b == b'\n').next().unwrap_or(&[]);
    let line = line.strip_suffix(b"\r").unwrap_or(line);
    if line.is_empty() {
        return Err(format!("{}: the first line is empty", full.display()));
    }
    Ok(Secret::new(line))
}

fn one_secret(
    what: &str,
    inline: &Option<SecretText>,
    file: &Option<std::path::PathBuf>,
    base: Option<&std::path::Path>,
) -> Result<Option<Secret>, String> {
    match (inline, file) {
        (Some(_), Some(_)) => Err(format!("{what}: give the text or a file, not both")),
        (Some(SecretText(t)), None) if t.is_empty() => Err(format!("{what} is empty")),
        (Some(SecretText(t)), None) => Ok(Some(Secret::new(t.as_bytes()))),
        (None, Some(f)) => read_secret(f, base).map(Some),
        (None, None) => Ok(None),
    }
}

impl AuthConfig {
    /// The credentials it describes (reading the files it names, relative
    /// to `base`, the configuration file's folder).
    pub fn credentials(&self, base: Option<&std::path::Path>) -> Result<Credentials, String> {
        let secret = one_secret("[auth] secret", &self.secret, &self.secret_file, base)?;
        let mut users = Vec::new();
        for u in &self.users {
            if !valid_user(&u.name) || u.name == DEFAULT_USER {
                return Err(format!(
                    "[[auth.users]] name {:?}: 1 to {MAX_USER} printable characters, no ':', \
                     not {DEFAULT_USER:?} (the group secret is its password)",
                    u.name
                ));
            }
            if users.iter().any(|x: &User| x.name == u.name) {
                return Err(format!("[[auth.users]] {:?} is listed twice", u.name));
            }
            let what = format!("[[auth.users]] {:?} password", u.name);
            let secret = one_secret(&what, &u.password, &u.password_file, base)?
                .ok_or_else(|| format!("{what}: missing (password or password_file)"))?;
            users.push(User {
                name: u.name.clone(),
                secret,
                rights: u.rights,
            });
        }
        if !users.is_empty() && secret.is_none() {
            return Err(
                "[[auth.users]] need the group's [auth] secret too (nodes prove it to \
                        each other)"
                    .into(),
            );
        }
        Ok(Credentials { secret, users })
    }
}

/// What a client says about itself and proves (the fields a proof
/// covers, in order).
fn proof_input(mac: &mut HmacSha256, label: &[u8], parts: &[&[u8]]) {
    mac.update(label);
    for p in parts {
        mac.update(&(p.len() as u32).to_le_bytes());
        mac.update(p);
    }
}

/// The client's proof: `HMAC(key, "client" | hello | server nonce |
/// client nonce)`, where `hello` is the connect private data before the
/// nonces (who connects, as which user).
pub fn client_proof(
    key: &Secret,
    hello: &[u8],
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
) -> [u8; PROOF_LEN] {
    let mut m = key.mac();
    proof_input(
        &mut m,
        b"softrdma-store client proof v1",
        &[hello, server_nonce, client_nonce],
    );
    m.finalize().into_bytes().into()
}

/// The node's proof over what it answers: `HMAC(key, "server" | both
/// nonces | reply)`.
pub fn server_proof(
    key: &Secret,
    server_nonce: &[u8; NONCE_LEN],
    client_nonce: &[u8; NONCE_LEN],
    reply: &[u8],
) -> [u8; PROOF_LEN] {
    let mut m = key.mac();
    proof_input(
        &mut m,
        b"softrdma-store server proof v1",
        &[server_nonce, client_nonce, reply],
    );
    m.finalize().into_bytes().into()
}

/// Constant-time comparison of two proofs.
pub fn proofs_equal(a: &[u8; PROOF_LEN], b: &[u8]) -> bool {
    if b.len() != PROOF_LEN {
        return false;
    }
    let mut diff = 0u8;
    for (x, y) in a.iter().zip(b) {
        diff |= x ^ y;
    }
    diff == 0
}

/// 64 random bits from the kernel (`getrandom`).
pub fn random_u64() -> u64 {
    getrandom::u64().unwrap_or_else(|_| {
        // Never expected on Linux: fall back to the clock and the pid.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        t.as_nanos() as u64 ^ (std::process::id() as u64) << 32
    })
}

/// 16 random bytes from the kernel.
pub fn random_nonce() -> [u8; NONCE_LEN] {
    let mut n = [0u8; NONCE_LEN];
    n[..8].copy_from_slice(&random_u64().to_le_bytes());
    n[8..].copy_from_slice(&random_u64().to_le_bytes());
    n
}

/// Issues and redeems a node's server nonces. A nonce is its issue time
/// (8 bytes, µs since the issuer started) and a MAC of that time under a
/// random per-process key (8 bytes): the node keeps nothing per nonce
/// until it is redeemed, and then only until it expires, so a flood of
/// connection attempts costs it no memory.
pub struct Issuer {
    key: Secret,
    start: Instant,
    used: Mutex<HashMap<[u8; NONCE_LEN], u64>>,
}

/// Why a nonce was not accepted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NonceError {
    /// Not issued by this node (or mangled).
    Forged,
    /// Older than [`NONCE_TTL`].
    Expired,
    /// Redeemed before (a replay).
    Replayed,
}

impl Issuer {
    /// An issuer with a fresh random key.
    pub fn new() -> Issuer {
        Issuer {
            key: Secret::new(&random_nonce()),
            start: Instant::now(),
            used: Mutex::new(HashMap::new()),
        }
    }

    fn tag(&self, t: u64) -> [u8; 8] {
        let mut m = self.key.mac();
        m.update(&t.to_le_bytes());
        let full: [u8; 32] = m.finalize().into_bytes().into();
        full[..8].try_into().expect("8 bytes")
    }

    fn micros(&self) -> u64 {
        self.start.elapsed().as_micros() as u64
    }

    /// A fresh nonce.
    pub fn issue(&self) -> [u8; NONCE_LEN] {
        let t = self.micros();
        let mut n = [0u8; NONCE_LEN];
        n[..8].copy_from_slice(&t.to_le_bytes());
        n[8..].copy_from_slice(&self.tag(t));
        n
    }

    /// Checks `n` is this issuer's, young enough and not yet used; marks
    /// it used. Call only once the proof over it has checked out (so an
    /// attacker cannot spend other clients' nonces).
    pub fn redeem(&self, n: &[u8; NONCE_LEN]) -> Result<(), NonceError> {
        let t = u64::from_le_bytes(n[..8].try_into().expect("8 bytes"));
        if !proofs_equal_8(&self.tag(t), &n[8..]) {
            return Err(NonceError::Forged);
        }
        let now = self.micros();
        let ttl = NONCE_TTL.as_micros() as u64;
        if t > now || now - t > ttl {
            return Err(NonceError::Expired);
        }
        let mut used = self.used.lock().unwrap_or_else(|e| e.into_inner());
        used.retain(|_, &mut at| now.saturating_sub(at) <= ttl);
        if used.insert(*n, t).is_some() {
            return Err(NonceError::Replayed);
        }
        Ok(())
    }
}

impl Default for Issuer {
    fn default() -> Issuer {
        Issuer::new()
    }
}

fn proofs_equal_8(a: &[u8; 8], b: &[u8]) -> bool {
    b.len() == 8 && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Whether a user name is acceptable.
pub fn valid_user(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= MAX_USER
        && name.bytes().all(|b| b.is_ascii_graphic() && b != b':')
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_never_print() {
        let s = Secret::new(b"hunter2-very-secret");
        let c = Credentials {
            secret: Some(s.clone()),
            users: vec![User {
                name: "reader".into(),
                secret: Secret::new(b"reader-pass"),
                rights: Rights::Read,
            }],
        };
        let shown = format!("{c:?} {s:?}");
        assert!(!shown.contains("hunter2") && !shown.contains("reader-pass"));
        assert!(s.matches(b"hunter2-very-secret") && !s.matches(b"hunter2"));
    }

    #[test]
    fn users_and_the_default_user() {
        let c = Credentials {
            secret: Some(Secret::new(b"group")),
            users: vec![User {
                name: "ro".into(),
                secret: Secret::new(b"ro-pass"),
                rights: Rights::Read,
            }],
        };
        assert_eq!(
            c.check_password("default", b"group"),
            Some(Rights::ReadWrite)
        );
        assert_eq!(c.check_password("ro", b"ro-pass"), Some(Rights::Read));
        assert_eq!(c.check_password("ro", b"group"), None);
        assert_eq!(c.check_password("nobody", b"group"), None);
        // Narrowing: removing a user, changing a password or the secret,
        // or taking a right away; adding a user is not.
        let mut more = c.clone();
        more.users.push(User {
            name: "new".into(),
            secret: Secret::new(b"x"),
            rights: Rights::ReadWrite,
        });
        assert!(!more.narrows(&c));
        let mut fewer = c.clone();
        fewer.users.clear();
        assert!(fewer.narrows(&c));
        let mut rekeyed = c.clone();
        rekeyed.secret = Some(Secret::new(b"group2"));
        assert!(rekeyed.narrows(&c));
        assert!(rekeyed.still_grants(&c, "ro") && !rekeyed.still_grants(&c, "default"));
    }

    #[test]
    fn proofs_bind_key_hello_and_nonces() {
        let k = Secret::new(b"s");
        let (sn, cn) = (random_nonce(), random_nonce());
        let p = client_proof(&k, b"hello", &sn, &cn);
        assert!(proofs_equal(&p, &client_proof(&k, b"hello", &sn, &cn)));
        assert!(!proofs_equal(
            &p,
            &client_proof(&Secret::new(b"t"), b"hello", &sn, &cn)
        ));
        assert!(!proofs_equal(&p, &client_proof(&k, b"hellp", &sn, &cn)));
        assert!(!proofs_equal(&p, &client_proof(&k, b"hello", &cn, &sn)));
        assert!(!proofs_equal(&p, &server_proof(&k, &sn, &cn, b"hello")));
        assert!(!proofs_equal(&p, &p[..31]));
    }

    #[test]
    fn nonces_are_single_use_and_unforgeable() {
        let i = Issuer::new();
        let n = i.issue();
        assert_eq!(i.redeem(&n), Ok(()));
        assert_eq!(i.redeem(&n), Err(NonceError::Replayed));
        let mut f = i.issue();
        f[15] ^= 1;
        assert_eq!(i.redeem(&f), Err(NonceError::Forged));
        assert_eq!(Issuer::new().redeem(&i.issue()), Err(NonceError::Forged));
        // An old one: forged time stamps are caught by the MAC, so make a
        // genuine nonce of a time long past.
        let old_t = 0u64;
        let mut old = [0u8; NONCE_LEN];
        old[..8].copy_from_slice(&old_t.to_le_bytes());
        old[8..].copy_from_slice(&i.tag(old_t));
        let later = Issuer {
            key: i.key.clone(),
            start: Instant::now() - NONCE_TTL - Duration::from_secs(1),
            used: Mutex::new(HashMap::new()),
        };
        assert_eq!(later.redeem(&old), Err(NonceError::Expired));
    }
}
