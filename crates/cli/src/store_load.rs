//! `softrdma store load`: the verifying keyed workload that the demo and
//! the crash tests run against a group while they kill its primary.
//!
//! Each client thread owns its keys (`c<seed>:k<i>`), so it knows exactly
//! what every key must hold: puts, gets, removes, and a **delete-and-reuse**
//! step that forces the stale-cache case (a second client caches a key's
//! pointer, the key is removed and another key is put with a value of the
//! same size, which the allocator places in the same space; the cached
//! pointer must not return the other key's value). Every value starts with
//! its key, so a value returned for the wrong key is recognised as such.
//! At the end a fresh client (cold cache) reads every key with one-sided
//! look-ups and the report says which node served them and why any read
//! went to the node instead.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::ops::AddAssign;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::Result;
use clap::Args as ClapArgs;
use hdrhistogram::Histogram;
use softrdma_store::net::client::{ClientConfig, ClientError, ClientStats, StoreClient};
use softrdma_store::proto::StoreError;
use softrdma_store::ptr::RemotePtr;

#[derive(ClapArgs)]
pub struct LoadArgs {
    /// The group's nodes, comma-separated host:port.
    #[arg(long, value_delimiter = ',', required = true)]
    nodes: Vec<SocketAddr>,
    /// Seconds to run.
    #[arg(long, default_value_t = 10.0)]
    pub duration: f64,
    /// Concurrent clients (threads, one connection each).
    #[arg(long, default_value_t = 2)]
    pub clients: usize,
    /// Random seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Largest value in bytes (values are 16..=max).
    #[arg(long, default_value_t = 512)]
    pub max_value: usize,
    /// Keys per client.
    #[arg(long, default_value_t = 1000)]
    pub keys: usize,
    /// Print a JSON progress line every 250 ms.
    #[arg(long)]
    pub progress: bool,
}

/// Deterministic generator (splitmix64).
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo + 1)
    }
}

/// Result of a workload run.
#[derive(Debug, Default, Clone)]
pub struct LoadReport {
    pub ops: u64,
    pub secs: f64,
    pub errors: u64,
    /// Acknowledged puts not found as acknowledged (absent or other bytes).
    pub lost: u64,
    /// Removed keys found again.
    pub resurrected: u64,
    /// Values returned for another key than the one asked.
    pub wrong_key: u64,
    /// Delete-and-reuse steps in which the other key's object did land in
    /// the removed key's space (the stale cached pointer was forced).
    pub reuse_forced: u64,
    /// Pointer-API delete-and-reuse steps in which the new object took the
    /// deleted one's space (a stale pointer of the pointer API forced).
    pub ptr_reuse_forced: u64,
    /// Stale pointers of the pointer API that read, changed or freed the
    /// object that took their space (must be 0: issue 29, finding 3).
    pub stale_reached: u64,
    /// Keys read back at the end.
    pub verified: u64,
    pub max_gap_ms: f64,
    pub stats: ClientStats,
    /// The end's verification: its client's counters, and the node that
    /// served its one-sided look-ups.
    pub verify_stats: ClientStats,
    pub nodes: Vec<SocketAddr>,
    /// (op, count, p50 us, p99 us)
    pub lat: Vec<(String, u64, f64, f64)>,
    pub first_error: Option<String>,
}

impl LoadReport {
    pub fn to_json(&self) -> String {
        let lat: Vec<_> = self
            .lat
            .iter()
            .map(|(op, n, p50, p99)| serde_json::json!({"op": op, "count": n, "p50_us": p50, "p99_us": p99}))
            .collect();
        let by_node = |s: &ClientStats| -> serde_json::Value {
            self.nodes
                .iter()
                .enumerate()
                .map(|(i, a)| (a.to_string(), s.keyed_one_sided_at[i.min(3)].into()))
                .collect::<serde_json::Map<_, _>>()
                .into()
        };
        let (s, v) = (&self.stats, &self.verify_stats);
        serde_json::json!({
            "type": "summary", "ops": self.ops, "secs": self.secs,
            "ops_per_s": self.ops as f64 / self.secs.max(1e-9),
            "errors": self.errors, "lost_writes": self.lost, "resurrected": self.resurrected,
            "wrong_key": self.wrong_key, "reuse_forced": self.reuse_forced,
            "ptr_reuse_forced": self.ptr_reuse_forced, "stale_reached": self.stale_reached,
            "verified": self.verified, "max_gap_ms": self.max_gap_ms, "retries": s.retries,
            "one_sided_reads": s.one_sided_reads, "torn_reads": s.torn_reads,
            "keyed_one_sided": s.keyed_one_sided, "cache_hits": s.cache_hits,
            "lookup_restarts": s.lookup_restarts,
            "fallback_raced": s.keyed_fallback_raced,
            "fallback_refused": s.keyed_fallback_refused,
            "server_reads": s.server_reads,
            "keyed_one_sided_by_node": by_node(s),
            "verify_one_sided": v.keyed_one_sided,
            "verify_one_sided_by_node": by_node(v),
            "verify_fallback_raced": v.keyed_fallback_raced,
            "verify_fallback_refused": v.keyed_fallback_refused,
            "verify_server_reads": v.server_reads,
            "latency": lat,
            "first_error": self.first_error,
        })
        .to_string()
    }
}

const OPS: [&str; 5] = ["put", "get", "remove", "reuse", "ptr_reuse"];

/// What a key must hold.
#[derive(Clone)]
struct Known {
    data: Vec<u8>,
    ptr: RemotePtr,
}

struct Worker {
    ops: u64,
    errors: u64,
    lost: u64,
    resurrected: u64,
    wrong_key: u64,
    reuse_forced: u64,
    ptr_reuse_forced: u64,
    stale_reached: u64,
    verified: u64,
    max_gap: Duration,
    hist: Vec<Histogram<u64>>,
    first_error: Option<String>,
    stats: ClientStats,
    verify_stats: ClientStats,
}

/// A worker's counts into the run's totals: counters and client stats
/// added, the longest gap kept, the first error kept. (Its latency
/// histograms are merged by the caller, which keeps them apart from the
/// report.)
impl AddAssign<Worker> for LoadReport {
    fn add_assign(&mut self, w: Worker) {
        let Worker {
            ops,
            errors,
            lost,
            resurrected,
            wrong_key,
            reuse_forced,
            ptr_reuse_forced,
            stale_reached,
            verified,
            max_gap,
            hist: _,
            first_error,
            stats,
            verify_stats,
        } = w;
        self.ops += ops;
        self.errors += errors;
        self.lost += lost;
        self.resurrected += resurrected;
        self.wrong_key += wrong_key;
        self.reuse_forced += reuse_forced;
        self.ptr_reuse_forced += ptr_reuse_forced;
        self.stale_reached += stale_reached;
        self.verified += verified;
        self.max_gap_ms = self.max_gap_ms.max(max_gap.as_secs_f64() * 1e3);
        self.stats = self.stats + stats;
        self.verify_stats = self.verify_stats + verify_stats;
        if self.first_error.is_none() {
            self.first_error = first_error;
        }
    }
}

impl Worker {
    fn err(&mut self, what: String) {
        self.errors += 1;
        if self.first_error.is_none() {
            self.first_error = Some(what);
        }
    }

    /// Checks what a get of `key` returned against what it must hold.
    fn check(
        &mut self,
        key: &[u8],
        want: Option<&Known>,
        got: Result<Option<Vec<u8>>, ClientError>,
        what: &str,
    ) -> bool {
        let name = String::from_utf8_lossy(key).into_owned();
        match (want, got) {
            (_, Err(e)) => {
                if want.is_some() {
                    self.lost += 1;
                }
                self.err(format!("{what} {name}: {e}"));
                false
            }
            (Some(k), Ok(Some(d))) if d == k.data => true,
            (None, Ok(None)) => true,
            (_, Ok(Some(d))) if !owned_by(&d, key) => {
                self.wrong_key += 1;
                self.err(format!("{what} {name}: another key's value came back"));
                false
            }
            (Some(_), Ok(_)) => {
                self.lost += 1;
                self.err(format!("{what} {name}: not the acknowledged value"));
                false
            }
            (None, Ok(Some(_))) => {
                self.resurrected += 1;
                self.err(format!("{what} {name}: a removed key came back"));
                false
            }
        }
    }
}

/// A value of `key`: the key, `=`, then bytes up to `len` in all.
fn value(rng: &mut Rng, key: &[u8], len: usize) -> Vec<u8> {
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(key);
    v.push(b'=');
    while v.len() < len {
        v.push(rng.next() as u8);
    }
    v
}

fn owned_by(v: &[u8], key: &[u8]) -> bool {
    v.len() > key.len() && v.starts_with(key) && v[key.len()] == b'='
}

/// A client proving the credential of the environment
/// (`SOFTRDMA_STORE_PASSWORD`, `SOFTRDMA_STORE_USER`), as the demo and the
/// tests start this workload.
fn client(nodes: &[SocketAddr]) -> Result<StoreClient> {
    let mut cfg = ClientConfig::new(nodes.to_vec());
    cfg.auth = softrdma_store::net::handshake::ClientAuth::from_env(None, None)
        .map_err(anyhow::Error::msg)?;
    Ok(StoreClient::new(cfg)?)
}

/// Delete and reuse through the pointer API: a value is inserted and
/// deleted, another of the same length inserted (the allocator hands out
/// the same space when it is the best fit); the first pointer, now stale,
/// must read, change and free nothing of the second object: every use of
/// it is refused (`StalePointer`; `Freed` or `NotAllocated` if the space
/// was not reused, or not as one allocation; `Keyed` if another client's
/// key took it) and the second object keeps its value.
fn ptr_reuse(
    c: &mut StoreClient,
    r: &mut StoreClient,
    rng: &mut Rng,
    w: &mut Worker,
    n: usize,
) -> bool {
    let a_val = value(rng, b"ptr-a", n);
    let b_val = value(rng, b"ptr-b", n);
    let a = match c.alloc(&a_val) {
        Ok(p) => p,
        Err(e) => {
            w.err(format!("ptr reuse: insert: {e}"));
            return false;
        }
    };
    if let Err(e) = c.free(a) {
        w.err(format!("ptr reuse: delete: {e}"));
        return false;
    }
    let b = match c.alloc(&b_val) {
        Ok(p) => p,
        Err(e) => {
            w.err(format!("ptr reuse: insert again: {e}"));
            return false;
        }
    };
    w.ptr_reuse_forced += (b.addr == a.addr) as u64;
    fn refused<T>(x: &Result<T, ClientError>) -> bool {
        matches!(
            x,
            Err(ClientError::Store(
                StoreError::StalePointer { .. }
                    | StoreError::Freed
                    | StoreError::NotAllocated
                    // Another client's key took the space.
                    | StoreError::Keyed
            ))
        )
    }
    let mut ok = true;
    // One-sided (the reader) and through the node.
    let got = r.read_ptr(a);
    if !refused(&got) {
        w.stale_reached += 1;
        w.err(format!("ptr reuse: a stale pointer read gave {got:?}"));
        ok = false;
    }
    let upd = c.update_ptr(a, b"stale overwrite");
    if !refused(&upd) {
        w.stale_reached += 1;
        w.err(format!(
            "ptr reuse: an update through a stale pointer gave {upd:?}"
        ));
        ok = false;
    }
    let del = c.free(a);
    if !refused(&del) {
        w.stale_reached += 1;
        w.err(format!(
            "ptr reuse: a delete through a stale pointer gave {del:?}"
        ));
        ok = false;
    }
    match r.read_ptr(b) {
        Ok(v) if v == b_val => {}
        other => {
            w.stale_reached += 1;
            w.err(format!("ptr reuse: the new object reads {other:?}"));
            ok = false;
        }
    }
    if let Err(e) = c.free(b) {
        w.err(format!("ptr reuse: delete the second: {e}"));
        ok = false;
    }
    ok
}

fn worker(
    nodes: Vec<SocketAddr>,
    seed: u64,
    keys: usize,
    until: Instant,
    max_value: usize,
    done: &AtomicU64,
) -> Result<Worker> {
    // The writer, and a reader that keeps its own pointer cache (a client
    // that did not make the changes it reads).
    let mut c = client(&nodes)?;
    let mut r = client(&nodes)?;
    let mut rng = Rng(seed);
    let names: Vec<Vec<u8>> = (0..keys.max(2))
        .map(|i| format!("c{seed}:k{i}").into_bytes())
        .collect();
    let mut known: HashMap<usize, Known> = HashMap::new();
    let mut w = Worker {
        ops: 0,
        errors: 0,
        lost: 0,
        resurrected: 0,
        wrong_key: 0,
        reuse_forced: 0,
        ptr_reuse_forced: 0,
        stale_reached: 0,
        verified: 0,
        max_gap: Duration::ZERO,
        hist: (0..OPS.len())
            .map(|_| Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram"))
            .collect(),
        first_error: None,
        stats: Default::default(),
        verify_stats: Default::default(),
    };
    let mut last_ok = Instant::now();
    let min_len = names.iter().map(|k| k.len()).max().unwrap_or(0) + 2;
    let len = |rng: &mut Rng| {
        rng.range(min_len.max(16) as u64, max_value.max(min_len + 16) as u64) as usize
    };
    while Instant::now() < until {
        let dice = rng.range(0, 99);
        let i = rng.range(0, names.len() as u64 - 1) as usize;
        let kind = match dice {
            0..35 => 0,
            35..70 => 1,
            70..85 => 2,
            85..93 => 3,
            _ => 4,
        };
        let t = Instant::now();
        let ok = match kind {
            0 => {
                let n = len(&mut rng);
                let v = value(&mut rng, &names[i], n);
                match c.set(&names[i], &v) {
                    Ok(ptr) => {
                        known.insert(i, Known { data: v, ptr });
                        true
                    }
                    Err(e) => {
                        w.err(format!("put {}: {e}", String::from_utf8_lossy(&names[i])));
                        false
                    }
                }
            }
            1 => {
                let got = r.get(&names[i]);
                w.check(&names[i], known.get(&i), got, "get")
            }
            2 => match c.del(&names[i]) {
                Ok(existed) if existed == known.contains_key(&i) => {
                    known.remove(&i);
                    true
                }
                Ok(existed) => {
                    w.err(format!(
                        "remove {}: existed {existed}, expected {}",
                        String::from_utf8_lossy(&names[i]),
                        !existed
                    ));
                    known.remove(&i);
                    false
                }
                Err(e) => {
                    w.err(format!(
                        "remove {}: {e}",
                        String::from_utf8_lossy(&names[i])
                    ));
                    false
                }
            },
            3 => {
                // Delete and reuse: the reader caches key i's pointer; i is
                // removed; a key not in the store gets a value that makes
                // its object (header, key, value) as long as i's was (the
                // same allocation size, so the allocator hands out the
                // same space); the reader's cached pointer must not give
                // i that value.
                let free = (0..names.len()).find(|&j| j != i && !known.contains_key(&j));
                match (known.get(&i).cloned(), free) {
                    (Some(old), Some(j)) => {
                        let got = r.get(&names[i]);
                        let mut ok = w.check(&names[i], Some(&old), got, "reuse: get");
                        let n = (old.data.len() + names[i].len()).saturating_sub(names[j].len());
                        let v = value(&mut rng, &names[j], n.max(names[j].len() + 1));
                        if let Err(e) = c.del(&names[i]) {
                            w.err(format!("reuse: remove: {e}"));
                            continue;
                        }
                        known.remove(&i);
                        match c.set(&names[j], &v) {
                            Ok(p) => {
                                w.reuse_forced +=
                                    ((p.addr, p.len) == (old.ptr.addr, old.ptr.len)) as u64;
                                known.insert(j, Known { data: v, ptr: p });
                                let got = r.get(&names[i]);
                                ok &= w.check(&names[i], None, got, "reuse: stale get");
                            }
                            Err(e) => {
                                w.err(format!("reuse: put: {e}"));
                                ok = false;
                            }
                        }
                        ok
                    }
                    _ => continue,
                }
            }
            4 => {
                let n = len(&mut rng);
                ptr_reuse(&mut c, &mut r, &mut rng, &mut w, n)
            }
            _ => unreachable!(),
        };
        let el = t.elapsed();
        if ok {
            let _ = w.hist[kind].record((el.as_micros() as u64).max(1));
            w.ops += 1;
            done.fetch_add(1, Ordering::Relaxed);
            w.max_gap = w.max_gap.max(last_ok.elapsed());
            last_ok = Instant::now();
        }
    }
    w.stats = c.stats() + r.stats();
    // Verify with a fresh client (nothing cached): every key holds what
    // was acknowledged last, removed keys are absent.
    let mut v = client(&nodes)?;
    for (i, name) in names.iter().enumerate() {
        let got = v.get(name);
        if let Err(e @ ClientError::Unavailable(_)) = &got {
            // No node answered for the client's whole deadline: the group
            // has no primary (docs/store.md, "Durability, by policy").
            // Say so once instead of waiting a deadline per key.
            let left = known.keys().filter(|&&k| k >= i).count() as u64;
            w.lost += left;
            w.err(format!(
                "verify: {e}; {left} acknowledged keys could not be read"
            ));
            break;
        }
        if w.check(name, known.get(&i), got, "verify") {
            w.verified += 1;
        }
    }
    w.verify_stats = v.stats();
    Ok(w)
}

/// Runs the verifying workload.
pub fn load(l: &LoadArgs) -> Result<LoadReport> {
    let t0 = Instant::now();
    let until = t0 + Duration::from_secs_f64(l.duration);
    let done = std::sync::Arc::new(AtomicU64::new(0));
    let mut hs = Vec::new();
    for i in 0..l.clients.max(1) {
        let nodes = l.nodes.clone();
        let seed = l.seed.wrapping_mul(1000).wrapping_add(i as u64);
        let (max_value, keys) = (l.max_value, l.keys);
        let done = done.clone();
        hs.push(std::thread::spawn(move || {
            worker(nodes, seed, keys, until, max_value, &done)
        }));
    }
    if l.progress {
        let mut last = (Instant::now(), 0u64);
        while hs.iter().any(|h| !h.is_finished()) {
            std::thread::sleep(Duration::from_millis(250));
            let d = done.load(Ordering::Relaxed);
            let now = Instant::now();
            let rate = (d - last.1) as f64 / now.duration_since(last.0).as_secs_f64();
            last = (now, d);
            println!(
                "{}",
                serde_json::json!({"type": "progress", "t": t0.elapsed().as_secs_f64(), "ops": d, "ops_per_s": rate})
            );
        }
    }
    let mut r = LoadReport {
        nodes: l.nodes.clone(),
        ..Default::default()
    };
    let mut hist: Vec<Histogram<u64>> = (0..OPS.len())
        .map(|_| Histogram::new_with_bounds(1, 60_000_000, 3).expect("histogram"))
        .collect();
    for h in hs {
        let w = h.join().map_err(|_| anyhow::anyhow!("worker panicked"))??;
        for (a, b) in hist.iter_mut().zip(&w.hist) {
            a.add(b).expect("same bounds");
        }
        r += w;
    }
    r.secs = l.duration;
    r.lat = OPS
        .iter()
        .zip(&hist)
        .map(|(op, h)| {
            (
                op.to_string(),
                h.len(),
                h.value_at_quantile(0.5) as f64,
                h.value_at_quantile(0.99) as f64,
            )
        })
        .collect();
    Ok(r)
}
