//! A Jepsen-style workload for the HA store: concurrent clients write and
//! read a few shared registers (objects updated in place, so a register
//! keeps its pointer) and record every operation's invocation, completion
//! and result; `softrdma_store::lincheck` then checks the history against a
//! register model. An operation whose outcome the client could not learn
//! (it gave up, the answer was lost) counts as possibly applied. A failing
//! history is saved (one JSON object per operation) and reported minimised.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use softrdma_store::lincheck::{self, Kind, Op};
use softrdma_store::net::client::{ClientConfig, ClientError, StoreClient};
use softrdma_store::proto::StoreError;
use softrdma_store::ptr::RemotePtr;

/// Bytes of every register's value (so updates stay in place).
const VALUE_LEN: usize = 64;

/// What a register is: an object updated in place through its pointer
/// (`update_ptr`, `read_ptr`), or a key (`set`, `get`: a one-sided look-up
/// of the index).
#[derive(Clone, Copy)]
pub enum Registers {
    Pointers,
    Keys,
}

fn key(k: usize) -> Vec<u8> {
    format!("register-{k}").into_bytes()
}

/// Reads register `k`: its value, or none (a key not there).
fn read_reg(
    c: &mut StoreClient,
    how: Registers,
    regs: &[RemotePtr],
    k: usize,
) -> Result<Option<Vec<u8>>, ClientError> {
    match how {
        Registers::Pointers => c.read_ptr(regs[k]).map(Some),
        Registers::Keys => c.get(&key(k)),
    }
}

fn value(tag: u64) -> Vec<u8> {
    tag.to_le_bytes().repeat(VALUE_LEN / 8)
}

fn tag_of(data: &[u8]) -> Option<u64> {
    let t = u64::from_le_bytes(data.get(..8)?.try_into().ok()?);
    (data == value(t).as_slice()).then_some(t)
}

/// Called first on every thread of the workload; the result is held for
/// the thread's life.
pub type Enter = Arc<dyn Fn() -> Box<dyn std::any::Any> + Send + Sync>;

/// An [`Enter`] that does nothing.
pub fn stay() -> Enter {
    Arc::new(|| Box::new(()))
}

/// What a run recorded.
pub struct Recorded {
    pub ops: Vec<Op>,
    /// Operations whose outcome stayed unknown.
    pub unknown: usize,
    /// Definite refusals (nothing changed), not in the history.
    pub refused: usize,
    /// One-sided reads completed, over all clients.
    pub one_sided: u64,
}

/// One client thread's record: its operations, unknown outcomes, refusals
/// and one-sided reads.
type ClientRun = (Vec<Op>, usize, usize, u64);

/// Concurrent clients on `nodes`, running until [`Workload::finish`].
pub struct Workload {
    stop: Arc<AtomicBool>,
    done: Arc<AtomicU64>,
    threads: Vec<JoinHandle<ClientRun>>,
    /// The registers' pointers.
    pub regs: Vec<RemotePtr>,
    t0: Instant,
}

impl Workload {
    /// Creates `registers` registers (written once each, recorded) and
    /// starts `clients` client threads. Every thread of the workload first
    /// calls `enter` and holds what it returns (a test may enter a network
    /// namespace there).
    /// Each client makes at most `per_second` operations a second (a
    /// history the checker can search in seconds: its cost grows with the
    /// operations per key).
    pub fn start(
        nodes: &[std::net::SocketAddr],
        registers: usize,
        clients: usize,
        per_second: u32,
        enter: Enter,
    ) -> Workload {
        Workload::start_with(
            nodes,
            Registers::Pointers,
            registers,
            clients,
            per_second,
            enter,
        )
    }

    /// [`Workload::start`] with registers of either kind.
    pub fn start_with(
        nodes: &[std::net::SocketAddr],
        how: Registers,
        registers: usize,
        clients: usize,
        per_second: u32,
        enter: Enter,
    ) -> Workload {
        let t0 = Instant::now();
        let next_tag = Arc::new(AtomicU64::new(1));
        let us = move || t0.elapsed().as_micros() as u64;
        let cfg = |nodes: &[std::net::SocketAddr]| {
            let mut c = ClientConfig::new(nodes.to_vec());
            c.deadline = Duration::from_secs(5);
            c.auth = Some(super::store_auth());
            c
        };
        let (regs, init) = {
            let next_tag = next_tag.clone();
            let (cfg0, enter) = (cfg(nodes), enter.clone());
            std::thread::spawn(move || {
                let _in = enter();
                let mut c = StoreClient::new(cfg0).expect("client");
                let mut regs = Vec::new();
                let mut ops = Vec::new();
                for k in 0..registers {
                    let tag = next_tag.fetch_add(1, Ordering::Relaxed);
                    let call = us();
                    let p = match how {
                        Registers::Pointers => c.alloc(&value(tag)),
                        Registers::Keys => c.set(&key(k), &value(tag)),
                    }
                    .expect("create a register");
                    ops.push(Op {
                        key: k as u64,
                        client: 0,
                        call,
                        ret: Some(us()),
                        kind: Kind::Write(Some(tag)),
                    });
                    regs.push(p);
                }
                (regs, ops)
            })
            .join()
            .expect("set-up thread")
        };
        let stop = Arc::new(AtomicBool::new(false));
        let done = Arc::new(AtomicU64::new(0));
        let mut threads = Vec::new();
        for id in 0..clients {
            let (stop, regs, next_tag) = (stop.clone(), regs.clone(), next_tag.clone());
            let done = done.clone();
            let cfg = cfg(nodes);
            let init = if id == 0 { init.clone() } else { Vec::new() };
            let enter = enter.clone();
            threads.push(std::thread::spawn(move || {
                let _in = enter();
                let mut c = StoreClient::new(cfg).expect("client");
                let mut ops = init;
                let (mut unknown, mut refused) = (0, 0);
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ (id as u64 + 1);
                let pace = Duration::from_secs(1) / per_second;
                let mut next = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    done.store(ops.len() as u64, Ordering::Relaxed);
                    // Pacing the load, not waiting for anything.
                    next += pace;
                    if let Some(d) = next.checked_duration_since(Instant::now()) {
                        std::thread::sleep(d);
                    }
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let k = (x % regs.len() as u64) as usize;
                    let p = regs[k];
                    let call = us();
                    if x % 10 < 6 {
                        let tag = next_tag.fetch_add(1, Ordering::Relaxed);
                        let r = match how {
                            Registers::Pointers => c.update_ptr(p, &value(tag)),
                            Registers::Keys => c.set(&key(k), &value(tag)),
                        };
                        let ret = match r {
                            Ok(q) => {
                                if let Registers::Pointers = how {
                                    assert_eq!(q, p, "an in-place update moved the register");
                                }
                                Some(us())
                            }
                            // Refused with nothing changed.
                            Err(ClientError::Store(
                                StoreError::NotEnoughReplicas
                                | StoreError::NotPrimary { .. }
                                | StoreError::StaleEpoch { .. },
                            )) => {
                                refused += 1;
                                continue;
                            }
                            Err(ClientError::Store(e)) => panic!("update of register {k}: {e}"),
                            Err(_) => {
                                unknown += 1;
                                None
                            }
                        };
                        ops.push(Op {
                            key: k as u64,
                            client: id as u64 + 1,
                            call,
                            ret,
                            kind: Kind::Write(Some(tag)),
                        });
                    } else {
                        match read_reg(&mut c, how, &regs, k) {
                            Ok(d) => ops.push(Op {
                                key: k as u64,
                                client: id as u64 + 1,
                                call,
                                ret: Some(us()),
                                kind: Kind::Read(Some(
                                    d.and_then(|d| tag_of(&d)).unwrap_or(u64::MAX),
                                )),
                            }),
                            Err(ClientError::Store(e))
                                if !matches!(
                                    e,
                                    StoreError::NotPrimary { .. } | StoreError::StaleEpoch { .. }
                                ) =>
                            {
                                panic!("read of register {k}: {e}")
                            }
                            Err(_) => {} // no answer: says nothing
                        }
                    }
                }
                (ops, unknown, refused, c.stats().one_sided_reads)
            }));
        }
        // One reader per node that talks to that node alone (a client that
        // was never redirected, or one that only reads): whatever a node
        // answers, primary or not, goes into the history.
        for (i, &node) in nodes.iter().enumerate() {
            let (stop, regs, enter) = (stop.clone(), regs.clone(), enter.clone());
            let mut cfg = ClientConfig::new(vec![node]);
            cfg.auth = Some(super::store_auth());
            cfg.deadline = Duration::from_millis(500);
            cfg.attempt_timeout = Duration::from_millis(200);
            let client = 1000 + i as u64;
            threads.push(std::thread::spawn(move || {
                let _in = enter();
                let mut c = StoreClient::new(cfg).expect("client");
                let mut ops = Vec::new();
                let pace = Duration::from_secs(1) / per_second;
                let mut next = Instant::now();
                let mut k = i;
                while !stop.load(Ordering::Relaxed) {
                    next += pace;
                    if let Some(d) = next.checked_duration_since(Instant::now()) {
                        std::thread::sleep(d);
                    }
                    k = (k + 7) % regs.len();
                    let call = us();
                    if let Ok(d) = read_reg(&mut c, how, &regs, k) {
                        ops.push(Op {
                            key: k as u64,
                            client,
                            call,
                            ret: Some(us()),
                            kind: Kind::Read(Some(d.and_then(|d| tag_of(&d)).unwrap_or(u64::MAX))),
                        });
                    }
                }
                (ops, 0, 0, c.stats().one_sided_reads)
            }));
        }
        Workload {
            stop,
            done,
            threads,
            regs,
            t0,
        }
    }

    /// Operations recorded so far by one of the clients (a progress
    /// sign: it grows while the group serves).
    pub fn progress(&self) -> u64 {
        self.done.load(Ordering::Relaxed)
    }

    /// Waits until the clients made `n` more operations (the group
    /// serves); panics after `timeout`.
    pub fn wait_progress(&self, n: u64, timeout: Duration) {
        let (start, t0) = (self.progress(), Instant::now());
        while self.progress() < start + n {
            assert!(
                t0.elapsed() < timeout,
                "the workload made no progress in {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Microseconds since the start (the history's clock).
    pub fn now(&self) -> u64 {
        self.t0.elapsed().as_micros() as u64
    }

    /// Stops the clients; returns what they recorded.
    pub fn finish(self) -> Recorded {
        self.stop.store(true, Ordering::Relaxed);
        let mut r = Recorded {
            ops: Vec::new(),
            unknown: 0,
            refused: 0,
            one_sided: 0,
        };
        for t in self.threads {
            let (ops, u, f, o) = t.join().expect("client thread");
            r.ops.extend(ops);
            r.unknown += u;
            r.refused += f;
            r.one_sided += o;
        }
        r
    }
}

/// Checks `ops`; on a violation saves the history to `dir` and panics with
/// the minimised failing histories.
pub fn assert_linearizable(ops: &[Op], dir: &Path, what: &str) {
    let bad = lincheck::check(ops);
    if bad.is_empty() {
        return;
    }
    let _ = std::fs::create_dir_all(dir);
    let file = dir.join(format!("history-{what}.jsonl"));
    let text: String = ops
        .iter()
        .map(|o| {
            let (kind, v) = match o.kind {
                Kind::Write(v) => ("write", v),
                Kind::Read(v) => ("read", v),
                // (These tests record plain reads and writes only.)
                Kind::Present(_) | Kind::Swap { .. } | Kind::Exchange { .. } => {
                    unreachable!("not recorded here")
                }
            };
            format!(
                "{{\"key\":{},\"client\":{},\"call\":{},\"ret\":{},\"op\":\"{kind}\",\"value\":{}}}\n",
                o.key,
                o.client,
                o.call,
                o.ret.map_or("null".into(), |r| r.to_string()),
                v.map_or("null".into(), |v| v.to_string())
            )
        })
        .collect();
    let _ = std::fs::write(&file, text);
    panic!(
        "{what}: the history is not linearizable ({} ops, saved in {}):\n{}",
        ops.len(),
        file.display(),
        lincheck::report(&bad[..bad.len().min(3)])
    );
}
