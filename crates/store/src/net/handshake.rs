//! The connection handshake of nodes and clients: who connects, and the
//! proofs that only holders of the group's credentials can make
//! ([`crate::auth`] describes the exchange).
//!
//! Private data, all integers little-endian:
//!
//! ```text
//! connect (node)    SRN2 | node u32 | incarnation u64 | group len u8 | group | [proof]
//! connect (client)  SRC2 | client u64 | user len u8 | user | [proof]
//!   proof           server nonce [16] | client nonce [16] | HMAC [32]
//! reject            SRX2 | server nonce [16]        (a challenge: connect again with a proof)
//!                   SRE2 | reason (UTF-8)            (refused: the reason is for the user)
//! accept            SRA2 | node u32 | arena base u64 | arena len u64 | STag u32 | rights u8 | [HMAC [32]]
//! ```
//!
//! The client's HMAC covers its connect data before the proof and both
//! nonces; the node's covers both nonces and its accept data before the
//! HMAC. A node with credentials accepts only proven connections and
//! proves itself in return; a node without ("protected mode") accepts
//! unproven ones from loopback peers only. A client or node holding
//! credentials accepts only a node that proved itself.

use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use super::link::{Endpoint, Link, LinkError};
use crate::auth::{
    self, Credentials, Issuer, Rights, Secret, CHALLENGE_MAGIC, NONCE_LEN, PROOF_LEN, REJECT_MAGIC,
};
use crate::proto::{Member, NodeId};
use crate::ptr::ArenaRef;

/// A node's introduction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeHello {
    /// The node.
    pub member: Member,
    /// Its group.
    pub group: String,
}

/// Who connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// A node of the group.
    Node(NodeHello),
    /// A client with this id, as this user.
    Client {
        /// The client's id.
        id: u64,
        /// The user it authenticates as ([`auth::DEFAULT_USER`] for the
        /// group secret).
        user: String,
    },
}

/// A proof attached to a connect request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proof {
    /// The node's challenge.
    pub server_nonce: [u8; NONCE_LEN],
    /// The connecting side's nonce.
    pub client_nonce: [u8; NONCE_LEN],
    /// The HMAC.
    pub mac: [u8; PROOF_LEN],
}

/// Connect private data: who connects, and its proof if it has one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Intro {
    /// Who.
    pub hello: Hello,
    /// The proof (absent on a first attempt).
    pub proof: Option<Proof>,
}

impl Hello {
    /// The private data before any proof (what a proof covers).
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(64);
        match self {
            Hello::Node(h) => {
                v.extend_from_slice(b"SRN2");
                v.extend_from_slice(&h.member.node.to_le_bytes());
                v.extend_from_slice(&h.member.incarnation.to_le_bytes());
                push_short(&mut v, h.group.as_bytes());
            }
            Hello::Client { id, user } => {
                v.extend_from_slice(b"SRC2");
                v.extend_from_slice(&id.to_le_bytes());
                push_short(&mut v, user.as_bytes());
            }
        }
        v
    }
}

fn push_short(v: &mut Vec<u8>, b: &[u8]) {
    let n = b.len().min(255);
    v.push(n as u8);
    v.extend_from_slice(&b[..n]);
}

impl Intro {
    /// The connect private data.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = self.hello.encode();
        if let Some(p) = &self.proof {
            v.extend_from_slice(&p.server_nonce);
            v.extend_from_slice(&p.client_nonce);
            v.extend_from_slice(&p.mac);
        }
        v
    }
}

/// Reads `n` bytes.
fn take<'a>(b: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if b.len() < n {
        return None;
    }
    let (h, t) = b.split_at(n);
    *b = t;
    Some(h)
}

fn take_u32(b: &mut &[u8]) -> Option<u32> {
    Some(u32::from_le_bytes(take(b, 4)?.try_into().ok()?))
}

fn take_u64(b: &mut &[u8]) -> Option<u64> {
    Some(u64::from_le_bytes(take(b, 8)?.try_into().ok()?))
}

fn take_short<'a>(b: &mut &'a [u8]) -> Option<&'a [u8]> {
    let n = *take(b, 1)?.first()? as usize;
    take(b, n)
}

/// Parses connect private data; also returns how many of its bytes the
/// proof covers. `None`: not a store node's or client's.
pub fn decode_intro(b: &[u8]) -> Option<(Intro, usize)> {
    let mut r = b;
    let hello = match take(&mut r, 4)? {
        b"SRN2" => {
            let node = take_u32(&mut r)?;
            let incarnation = take_u64(&mut r)?;
            let group = String::from_utf8(take_short(&mut r)?.to_vec()).ok()?;
            Hello::Node(NodeHello {
                member: Member { node, incarnation },
                group,
            })
        }
        b"SRC2" => {
            let id = take_u64(&mut r)?;
            let user = String::from_utf8(take_short(&mut r)?.to_vec()).ok()?;
            Hello::Client { id, user }
        }
        _ => return None,
    };
    let covered = b.len() - r.len();
    let proof = match r.len() {
        0 => None,
        n if n == 2 * NONCE_LEN + PROOF_LEN => Some(Proof {
            server_nonce: take(&mut r, NONCE_LEN)?.try_into().ok()?,
            client_nonce: take(&mut r, NONCE_LEN)?.try_into().ok()?,
            mac: take(&mut r, PROOF_LEN)?.try_into().ok()?,
        }),
        _ => return None,
    };
    Some((Intro { hello, proof }, covered))
}

/// A node's accept reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Accept {
    /// The node's id.
    pub node: NodeId,
    /// The group's arena, if the node has one yet.
    pub arena: Option<ArenaRef>,
    /// What the connecting client may do (nodes: read-write).
    pub rights: Rights,
    /// The node's proof, when it authenticated the connection.
    pub proof: Option<[u8; PROOF_LEN]>,
}

impl Accept {
    /// The accept private data before the proof (what the proof covers).
    fn body(&self) -> Vec<u8> {
        let mut v = b"SRA2".to_vec();
        v.extend_from_slice(&self.node.to_le_bytes());
        let a = self.arena.unwrap_or(ArenaRef {
            base: 0,
            len: 0,
            stag: 0,
        });
        v.extend_from_slice(&a.base.to_le_bytes());
        v.extend_from_slice(&a.len.to_le_bytes());
        v.extend_from_slice(&a.stag.to_le_bytes());
        v.push(self.rights.byte());
        v
    }

    /// The accept private data.
    pub fn encode(&self) -> Vec<u8> {
        let mut v = self.body();
        if let Some(p) = &self.proof {
            v.extend_from_slice(p);
        }
        v
    }

    /// Parses accept private data.
    pub fn decode(b: &[u8]) -> Option<Accept> {
        let mut r = b;
        if take(&mut r, 4)? != b"SRA2" {
            return None;
        }
        let node = take_u32(&mut r)?;
        let base = take_u64(&mut r)?;
        let len = take_u64(&mut r)?;
        let stag = take_u32(&mut r)?;
        let rights = Rights::from_byte(*take(&mut r, 1)?.first()?)?;
        let proof = match r.len() {
            0 => None,
            PROOF_LEN => Some(r.try_into().ok()?),
            _ => return None,
        };
        Some(Accept {
            node,
            arena: (stag != 0).then_some(ArenaRef { base, len, stag }),
            rights,
            proof,
        })
    }
}

/// A rejection's private data.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Connect again with a proof over this nonce.
    Challenge([u8; NONCE_LEN]),
    /// Refused, for this reason.
    Reason(String),
}

impl Refusal {
    /// The reject private data.
    pub fn encode(&self) -> Vec<u8> {
        match self {
            Refusal::Challenge(n) => {
                let mut v = CHALLENGE_MAGIC.to_vec();
                v.extend_from_slice(n);
                v
            }
            Refusal::Reason(r) => {
                let mut v = REJECT_MAGIC.to_vec();
                // MPA private data is at most 512 bytes.
                let mut r = r.as_str();
                while r.len() > 400 {
                    let mut cut = 400;
                    while !r.is_char_boundary(cut) {
                        cut -= 1;
                    }
                    r = &r[..cut];
                }
                v.extend_from_slice(r.as_bytes());
                v
            }
        }
    }

    /// Parses reject private data (`None`: not a store node's).
    pub fn decode(b: &[u8]) -> Option<Refusal> {
        match b.get(..4)? {
            m if m == CHALLENGE_MAGIC => Some(Refusal::Challenge(b.get(4..)?.try_into().ok()?)),
            m if m == REJECT_MAGIC => Some(Refusal::Reason(
                String::from_utf8_lossy(&b[4..]).into_owned(),
            )),
            _ => None,
        }
    }
}

/// Who an admitted connection is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principal {
    /// The user (clients), or `None` for a node of the group.
    pub user: Option<String>,
    /// What it may do.
    pub rights: Rights,
    /// Whether it proved a credential (else: admitted in protected mode).
    pub proven: bool,
}

/// What a node decides about a connect request.
#[derive(Debug)]
pub enum Admission {
    /// Accept with this private data.
    Accept {
        /// Who connects.
        hello: Hello,
        /// Its principal.
        principal: Principal,
        /// The accept private data.
        reply: Vec<u8>,
    },
    /// Reject with this private data (and say why in the log).
    Reject {
        /// The reject private data.
        reply: Vec<u8>,
        /// For the node's log (never a secret).
        why: String,
    },
}

/// A node's gatekeeper: its credentials, its nonces and the policy.
pub struct Gate {
    /// The credentials (swapped on reload).
    creds: RwLock<Arc<Credentials>>,
    /// Bumped by every [`Gate::set_credentials`]: a session checks this
    /// word per request, and the credentials only when it moved.
    changes: std::sync::atomic::AtomicU64,
    /// The group.
    pub group: String,
    /// Admit unproven loopback peers when no credential is configured.
    pub protected_mode: bool,
    issuer: Issuer,
    /// A key no one knows, checked for unknown users so that they take
    /// the same path as a wrong password.
    fake: Secret,
}

fn reject(why: &str) -> Admission {
    Admission::Reject {
        reply: Refusal::Reason(format!("softrdma-store: {why}")).encode(),
        why: why.to_string(),
    }
}

impl Gate {
    /// A gate for `group` with `creds`.
    pub fn new(group: String, creds: Credentials, protected_mode: bool) -> Gate {
        Gate {
            creds: RwLock::new(Arc::new(creds)),
            changes: std::sync::atomic::AtomicU64::new(0),
            group,
            protected_mode,
            issuer: Issuer::new(),
            fake: Secret::new(&auth::random_nonce()),
        }
    }

    /// The credentials now.
    pub fn credentials(&self) -> Arc<Credentials> {
        self.creds.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the credentials (new connections are checked against
    /// these at once).
    pub fn set_credentials(&self, creds: Arc<Credentials>) {
        *self.creds.write().unwrap_or_else(|e| e.into_inner()) = creds;
        self.changes
            .fetch_add(1, std::sync::atomic::Ordering::Release);
    }

    /// How many times the credentials were replaced (see
    /// [`Gate::credentials`]).
    pub fn changes(&self) -> u64 {
        self.changes.load(std::sync::atomic::Ordering::Acquire)
    }

    /// Decides about connect private data `data` from `peer`; `me` and
    /// `arena` fill the accept reply.
    pub fn admit(
        &self,
        data: &[u8],
        peer: SocketAddr,
        me: NodeId,
        arena: Option<ArenaRef>,
    ) -> Admission {
        let Some((intro, covered)) = decode_intro(data) else {
            return reject("unknown peer (not a store node or client of this version)");
        };
        if let Hello::Node(h) = &intro.hello {
            if h.group != self.group {
                return reject(&format!("this node is of another group than {:?}", h.group));
            }
        }
        let creds = self.credentials();
        if !creds.configured() {
            if self.protected_mode && !peer.ip().is_loopback() {
                return reject(
                    "protected mode: no credentials are configured, so only loopback peers \
                     are served; configure [auth] secret (docs/store.md)",
                );
            }
            let principal = Principal {
                user: match &intro.hello {
                    Hello::Client { user, .. } => Some(user.clone()),
                    Hello::Node(_) => None,
                },
                rights: Rights::ReadWrite,
                proven: false,
            };
            let reply = Accept {
                node: me,
                arena,
                rights: Rights::ReadWrite,
                proof: None,
            }
            .encode();
            return Admission::Accept {
                hello: intro.hello,
                principal,
                reply,
            };
        }
        // Whose key proves this connection.
        let (key, rights, user) = match &intro.hello {
            Hello::Node(_) => match &creds.secret {
                Some(s) => (s, Rights::ReadWrite, None),
                None => return reject("nodes need the group's [auth] secret"),
            },
            Hello::Client { user, .. } => match creds.user(user) {
                Some((s, r)) => (s, r, Some(user.clone())),
                // The same answer as a wrong password, after the same
                // exchange: no way to learn which users exist.
                None => (&self.fake, Rights::Read, Some(user.clone())),
            },
        };
        let Some(proof) = &intro.proof else {
            return Admission::Reject {
                reply: Refusal::Challenge(self.issuer.issue()).encode(),
                why: "challenged".into(),
            };
        };
        let expect = auth::client_proof(
            key,
            &data[..covered],
            &proof.server_nonce,
            &proof.client_nonce,
        );
        if !auth::proofs_equal(&expect, &proof.mac) {
            return reject("authentication failed (wrong user or password)");
        }
        if let Err(e) = self.issuer.redeem(&proof.server_nonce) {
            return reject(&format!(
                "authentication failed (challenge {e:?}); try again"
            ));
        }
        let mut acc = Accept {
            node: me,
            arena,
            rights,
            proof: None,
        };
        acc.proof = Some(auth::server_proof(
            key,
            &proof.server_nonce,
            &proof.client_nonce,
            &acc.body(),
        ));
        Admission::Accept {
            hello: intro.hello,
            principal: Principal {
                user,
                rights,
                proven: true,
            },
            reply: acc.encode(),
        }
    }
}

/// What a connecting side proves itself with.
#[derive(Debug, Clone)]
pub struct ClientAuth {
    /// The user ([`auth::DEFAULT_USER`] for the group secret; nodes
    /// ignore it).
    pub user: String,
    /// Its password's key.
    pub secret: Secret,
}

/// The environment variable a command-line client reads its password from
/// (as `redis-cli` reads `REDISCLI_AUTH`), so that it stays off the
/// command line.
pub const PASSWORD_ENV: &str = "SOFTRDMA_STORE_PASSWORD";
/// The environment variable naming the user (default: `default`).
pub const USER_ENV: &str = "SOFTRDMA_STORE_USER";

impl ClientAuth {
    /// The credential a command-line client proves: the password from
    /// `password_file`'s first line, else from [`PASSWORD_ENV`]; the user
    /// from `user`, else [`USER_ENV`], else `default`. `None`: no password
    /// given (only nodes in protected mode admit such a client).
    pub fn from_env(
        user: Option<&str>,
        password_file: Option<&std::path::Path>,
    ) -> Result<Option<ClientAuth>, String> {
        let password = match password_file {
            Some(f) => {
                let text =
                    std::fs::read(f).map_err(|e| format!("cannot read {}: {e}", f.display()))?;
                let line = text.split(|&b| b == b'\n').next().unwrap_or(&[]);
                let line = line.strip_suffix(b"\r").unwrap_or(line).to_vec();
                if line.is_empty() {
                    return Err(format!("{}: the first line is empty", f.display()));
                }
                Some(line)
            }
            None => std::env::var_os(PASSWORD_ENV)
                .map(|v| std::os::unix::ffi::OsStrExt::as_bytes(v.as_os_str()).to_vec())
                .filter(|v| !v.is_empty()),
        };
        let Some(password) = password else {
            return Ok(None);
        };
        let user = match user {
            Some(u) => u.to_string(),
            None => std::env::var(USER_ENV).unwrap_or_else(|_| auth::DEFAULT_USER.into()),
        };
        if !auth::valid_user(&user) {
            return Err(format!("bad user name {user:?}"));
        }
        Ok(Some(ClientAuth {
            user,
            secret: Secret::new(&password),
        }))
    }
}

/// Why a connection was not made.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The link layer failed (unreachable, timed out, ...): retrying may help.
    #[error(transparent)]
    Link(#[from] LinkError),
    /// Refused for a reason that retrying will not change (credentials,
    /// protected mode, another group): the reason says which.
    #[error("{0}")]
    Refused(String),
    /// The peer is not a store node of this version.
    #[error("not a store node: {0}")]
    Protocol(String),
}

/// Connects to the node at `addr` as `hello`, proving `auth` when the node
/// asks (and requiring the node's proof whenever `auth` is given).
pub fn connect(
    ep: &Arc<Endpoint>,
    addr: SocketAddr,
    hello: &Hello,
    auth: Option<&ClientAuth>,
    timeout: Duration,
) -> Result<(Arc<Link>, Accept), HandshakeError> {
    let first = Intro {
        hello: hello.clone(),
        proof: None,
    };
    let nonce = match ep.connect(addr, &first.encode(), timeout) {
        Ok((link, reply)) => {
            let Some(acc) = Accept::decode(&reply) else {
                ep.remove(link.id());
                return Err(HandshakeError::Protocol(format!("{addr}: bad accept data")));
            };
            if auth.is_some() {
                // We hold credentials: a node that admits anyone without
                // proving itself is not one of our group's.
                ep.remove(link.id());
                return Err(HandshakeError::Refused(format!(
                    "{addr} admitted us without authenticating itself: its configuration has \
                     no credentials, ours does"
                )));
            }
            return Ok((link, acc));
        }
        Err(LinkError::Rejected(data)) => match Refusal::decode(&data) {
            Some(Refusal::Challenge(n)) => n,
            Some(Refusal::Reason(r)) => return Err(HandshakeError::Refused(r)),
            None => {
                return Err(HandshakeError::Protocol(format!(
                    "{addr} rejected the connection: {}",
                    String::from_utf8_lossy(&data)
                )))
            }
        },
        Err(e) => return Err(e.into()),
    };
    let Some(auth) = auth else {
        return Err(HandshakeError::Refused(format!(
            "{addr} requires authentication and no credentials were given \
             (SOFTRDMA_STORE_PASSWORD, --password-file or the node's [auth] secret)"
        )));
    };
    let body = hello.encode();
    let client_nonce = auth::random_nonce();
    let proof = Proof {
        server_nonce: nonce,
        client_nonce,
        mac: auth::client_proof(&auth.secret, &body, &nonce, &client_nonce),
    };
    let second = Intro {
        hello: hello.clone(),
        proof: Some(proof),
    };
    match ep.connect(addr, &second.encode(), timeout) {
        Ok((link, reply)) => {
            let acc = Accept::decode(&reply);
            let ok = acc.as_ref().is_some_and(|a| {
                a.proof.is_some_and(|p| {
                    auth::proofs_equal(
                        &auth::server_proof(&auth.secret, &nonce, &client_nonce, &a.body()),
                        &p,
                    )
                })
            });
            if !ok {
                ep.remove(link.id());
                return Err(HandshakeError::Refused(format!(
                    "{addr} did not prove it holds the group's credentials"
                )));
            }
            Ok((link, acc.expect("checked")))
        }
        Err(LinkError::Rejected(data)) => match Refusal::decode(&data) {
            Some(Refusal::Reason(r)) => Err(HandshakeError::Refused(r)),
            _ => Err(HandshakeError::Protocol(format!(
                "{addr} answered a proof with another challenge"
            ))),
        },
        Err(e) => Err(e.into()),
    }
}

#[cfg(test)]
#[path = "handshake_tests.rs"]
mod tests;
