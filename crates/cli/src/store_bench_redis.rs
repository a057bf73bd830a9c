//! `softrdma store bench`'s Redis side (`store_bench.rs`): a Redis primary
//! with one attached replica, `redis-benchmark` runs calibrated to last
//! about the row's seconds, and its CSV parsed.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use super::CpuSample;
use crate::child::Proc;

/// Redis primary + replica, killed when dropped.
pub(super) struct Redis {
    pub(super) port: u16,
    pub(super) procs: Vec<Proc>,
}

pub(super) fn redis_cli(port: u16, args: &[&str]) -> Result<String> {
    let out = Command::new("redis-cli")
        .args(["-p", &port.to_string()])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("run redis-cli")?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

fn start_redis_server(dir: &Path, name: &str, port: u16, extra: &[String]) -> Result<Proc> {
    let d = dir.join(name);
    std::fs::create_dir_all(&d)?;
    let p = Proc::spawn(
        format!("redis {name}"),
        Command::new("redis-server")
            .args(["--port", &port.to_string()])
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .args(["--daemonize", "no", "--logfile", "", "--dir"])
            .arg(&d)
            .args(["--repl-diskless-sync-delay", "0"])
            .args(extra)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join(format!("{name}.log")))?)
            .stderr(Stdio::null()),
    )?;
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis_cli(port, &["ping"])?.trim() != "PONG" {
        if Instant::now() > deadline {
            bail!(
                "{} on port {port} did not answer PING (log: {})",
                p.name,
                dir.join(format!("{name}.log")).display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(p)
}

pub(super) fn start_redis(dir: &Path) -> Result<Redis> {
    start_redis_with(dir, &[])
}

/// [`start_redis`] with more options for both servers (after the
/// defaults, so they override them: `--appendonly yes`).
pub(super) fn start_redis_with(dir: &Path, extra: &[String]) -> Result<Redis> {
    let ports = crate::net::free_ports(2)?;
    let (port, rport) = (ports[0], ports[1]);
    let primary = start_redis_server(dir, "redis-primary", port, extra)?;
    let mut rextra = extra.to_vec();
    rextra.extend(["--replicaof".into(), "127.0.0.1".into(), port.to_string()]);
    let replica = start_redis_server(dir, "redis-replica", rport, &rextra)?;
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let info = redis_cli(rport, &["info", "replication"])?;
        let up = info.lines().any(|l| l.trim() == "master_link_status:up");
        let attached = redis_cli(port, &["info", "replication"])?
            .lines()
            .any(|l| l.trim() == "connected_slaves:1");
        if up && attached {
            break;
        }
        if Instant::now() > deadline {
            bail!(
                "the Redis replica did not attach to its primary (logs in {})",
                dir.display()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(Redis {
        port,
        procs: vec![primary, replica],
    })
}

#[derive(Debug, Clone, Copy, Default)]
pub(super) struct RedisResult {
    pub(super) ops_per_s: f64,
    pub(super) p50_us: Option<f64>,
    pub(super) p99_us: Option<f64>,
}

/// Parses `redis-benchmark --csv`: a header line (Redis >= 7: `"test",
/// "rps", "avg_latency_ms", ..., "p50_latency_ms", ..., "p99_latency_ms",
/// ...`) then one line per test; older versions print `"TEST","rps"` lines
/// without a header.
fn parse_csv(text: &str) -> Vec<(String, RedisResult)> {
    let split = |l: &str| -> Vec<String> {
        l.split(',')
            .map(|f| f.trim().trim_matches('"').to_string())
            .collect()
    };
    let mut header: Option<Vec<String>> = None;
    let mut out = Vec::new();
    for line in text.lines().filter(|l| l.starts_with('"')) {
        let f = split(line);
        if f.first().is_some_and(|t| t == "test") {
            header = Some(f);
            continue;
        }
        let col = |name: &str, default: Option<usize>| -> Option<f64> {
            let i = match &header {
                Some(h) => h.iter().position(|c| c == name)?,
                None => default?,
            };
            f.get(i)?.parse().ok()
        };
        let Some(rps) = col("rps", Some(1)) else {
            continue;
        };
        out.push((
            f[0].clone(),
            RedisResult {
                ops_per_s: rps,
                p50_us: col("p50_latency_ms", None).map(|ms| ms * 1e3),
                p99_us: col("p99_latency_ms", None).map(|ms| ms * 1e3),
            },
        ));
    }
    out
}

/// `redis-benchmark --csv` with `pipeline` requests in flight per
/// connection (`-P`).
fn redis_benchmark(
    port: u16,
    tests: &str,
    size: usize,
    clients: usize,
    n: u64,
    pipeline: usize,
    password: Option<&str>,
) -> Result<String> {
    // Random keys over a keyspace that the SETs cover ~5 times, so nearly
    // every GET finds a value of `size` bytes.
    let keyspace = (n / 5).clamp(100, 1_000_000);
    let out = Command::new("redis-benchmark")
        .args(["-p", &port.to_string(), "-t", tests])
        .args(["-d", &size.to_string(), "-c", &clients.to_string()])
        .args(["-n", &n.to_string(), "-r", &keyspace.to_string(), "--csv"])
        .args(["-P", &pipeline.to_string()])
        .args(password.map(|p| ["-a", p]).into_iter().flatten())
        .stdin(Stdio::null())
        .output()
        .context("run redis-benchmark")?;
    if !out.status.success() {
        bail!(
            "redis-benchmark failed ({}): {}",
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// SET, GET, INCR and MSET against Redis, one request in flight per
/// connection; each runs about `secs` (the request count is calibrated by a
/// short SET run).
pub(super) fn measure_redis(redis: &Redis, size: usize, clients: usize, secs: f64) -> Result<Resp> {
    let n = calibrated_n(redis.port, size, clients, secs, 1, None)?;
    let out = measure_resp(redis.port, size, clients, n, 1, None)?;
    redis_cli(redis.port, &["flushall"])?;
    Ok(out)
}

/// GET against Redis with `pipeline` requests in flight per connection
/// (after SETs that fill the keys): about `secs`.
pub(super) fn measure_redis_get_pipelined(
    redis: &Redis,
    size: usize,
    clients: usize,
    secs: f64,
    pipeline: usize,
) -> Result<RedisResult> {
    let n = calibrated_n(redis.port, size, clients, secs, pipeline, None)?;
    let text = redis_benchmark(redis.port, "set,get", size, clients, n, pipeline, None)?;
    let get = result_of(&parse_csv(&text), "GET", &text)?;
    redis_cli(redis.port, &["flushall"])?;
    Ok(get)
}

/// What `redis-benchmark -t set,get,incr,mset` measured.
pub(super) struct Resp {
    /// Requests of each test (the same for Redis and the store's door:
    /// the same work, keyspace included).
    pub(super) n: u64,
    pub(super) set: RedisResult,
    pub(super) get: RedisResult,
    pub(super) incr: RedisResult,
    /// `MSET` of 10 keys (redis-benchmark's): commands per second.
    pub(super) mset: RedisResult,
}

/// How many requests of each test take about `secs`, from a short SET run
/// at the same point.
fn calibrated_n(
    port: u16,
    size: usize,
    clients: usize,
    secs: f64,
    pipeline: usize,
    password: Option<&str>,
) -> Result<u64> {
    // The calibration's request count, bounded in bytes too: at 1 MiB,
    // 16 clients and 16 in flight, 1000 per client would be 256 GB of SETs.
    let in_flight = (clients * pipeline) as u64;
    let cal_n = (2000.max(1000 * clients as u64) * pipeline as u64)
        .min((CAL_BYTES / size.max(1) as u64).max(4 * in_flight));
    let text = redis_benchmark(port, "set", size, clients, cal_n, pipeline, password)?;
    let rate = result_of(&parse_csv(&text), "SET", &text)?.ops_per_s;
    let n = ((rate * secs) as u64).clamp((4 * in_flight).min(1000), 10_000_000);
    Ok(n)
}

/// Test `test`'s figures in `res`, parsed from redis-benchmark's `text`
/// (quoted in the error when it is missing).
fn result_of(res: &[(String, RedisResult)], test: &str, text: &str) -> Result<RedisResult> {
    res.iter()
        .find(|(t, _)| t == test)
        .map(|(_, r)| *r)
        .with_context(|| format!("redis-benchmark printed no {test} result: {text:?}"))
}

/// The most a calibration run writes (its SETs' values together).
const CAL_BYTES: u64 = 512 << 20;

/// `redis-benchmark -t set,get,incr,mset`, `n` requests each, against
/// any RESP server at `port` (Redis, or the store's front door).
pub(super) fn measure_resp(
    port: u16,
    size: usize,
    clients: usize,
    n: u64,
    pipeline: usize,
    password: Option<&str>,
) -> Result<Resp> {
    let text = redis_benchmark(
        port,
        "set,get,incr,mset",
        size,
        clients,
        n,
        pipeline,
        password,
    )?;
    let res = parse_csv(&text);
    let get = |t: &str| result_of(&res, t, &text);
    Ok(Resp {
        n,
        set: get("SET")?,
        get: get("GET")?,
        incr: get("INCR")?,
        mset: get("MSET (10 keys)")?,
    })
}

/// `FLUSHALL` through the store's RESP door at `port`.
pub(super) fn flush_door(port: u16, password: Option<&str>) -> Result<()> {
    let mut args = vec!["--no-auth-warning"];
    if let Some(p) = password {
        args.extend(["-a", p]);
    }
    args.push("flushall");
    let out = redis_cli(port, &args)?;
    if out.trim() != "OK" {
        bail!("FLUSHALL through the store's door answered {out:?}");
    }
    Ok(())
}

/// The door's GET against Redis's, and its SET against Redis's SET+WAIT,
/// measured `rounds` times alternately (Redis, Redis's SET+WAIT, the door,
/// each emptied first; `n` requests each): the ratios of each round. On
/// this machine one command's rate moves by up to 40% from one run to the
/// next, so a single pair can land either side of a target it is near.
pub(super) struct Rounds {
    pub(super) get: Vec<f64>,
    pub(super) set_wait: Vec<f64>,
    /// What each round measured, beside its ratios.
    pub(super) each: Vec<Round>,
}

/// One round of [`measure_rounds`]: each side's rate and latency, and the
/// servers' CPU (fractions of one core) over their `set,get` run.
pub(super) struct Round {
    pub(super) door_set: RedisResult,
    pub(super) door_get: RedisResult,
    pub(super) redis_get: RedisResult,
    pub(super) set_wait: crate::resp_wait::SetWait,
    /// The door's primary and secondary over the door's run.
    pub(super) door_cpu: [Option<f64>; 2],
    /// Redis's primary and replica together over Redis's run.
    pub(super) redis_cpu: Option<f64>,
}

impl Round {
    /// One line: GET against GET, SET against SET+WAIT, p99 and CPU.
    pub(super) fn describe(&self) -> String {
        let us = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.0} us"));
        let cpu = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.2}"));
        format!(
            "door GET {:.0}/s p99 {}, SET {:.0}/s p99 {} (CPU primary/secondary {}/{}); \
             Redis GET {:.0}/s p99 {} (CPU {}), SET+WAIT {:.0}/s p99 {:.0} us (CPU {})",
            self.door_get.ops_per_s,
            us(self.door_get.p99_us),
            self.door_set.ops_per_s,
            us(self.door_set.p99_us),
            cpu(self.door_cpu[0]),
            cpu(self.door_cpu[1]),
            self.redis_get.ops_per_s,
            us(self.redis_get.p99_us),
            cpu(self.redis_cpu),
            self.set_wait.ops_per_s,
            self.set_wait.p99_us,
            cpu(self.set_wait.cpu_server),
        )
    }

    /// The round as the JSON of the door's `op` row (`resp_get` or
    /// `resp_set`).
    pub(super) fn json(&self, op: &str) -> serde_json::Value {
        let r = |x: f64| (x * 100.0).round() / 100.0;
        let (door, base, base_p99, base_cpu) = match op {
            "resp_get" => (
                &self.door_get,
                self.redis_get.ops_per_s,
                self.redis_get.p99_us,
                self.redis_cpu,
            ),
            _ => (
                &self.door_set,
                self.set_wait.ops_per_s,
                Some(self.set_wait.p99_us),
                self.set_wait.cpu_server,
            ),
        };
        serde_json::json!({
            "ops_per_s": r(door.ops_per_s),
            "p99_us": door.p99_us.map(r),
            "cpu_primary": self.door_cpu[0].map(r),
            "cpu_secondary": self.door_cpu[1].map(r),
            "redis_ops_per_s": r(base),
            "redis_p99_us": base_p99.map(r),
            "redis_cpu_server": base_cpu.map(r),
        })
    }
}

/// The CPU seconds `pids` have used, together (`None` if any cannot be
/// read).
fn cpu_of(pids: &[u32]) -> Option<f64> {
    pids.iter()
        .map(|&p| crate::bench::cpu_secs(Some(p)))
        .sum::<Option<f64>>()
}

#[allow(clippy::too_many_arguments)]
pub(super) fn measure_rounds(
    redis: &Redis,
    door_port: u16,
    password: Option<&str>,
    size: usize,
    clients: usize,
    n: u64,
    secs: f64,
    rounds: usize,
    node_pids: &[Option<u32>; 2],
) -> Result<Rounds> {
    let pids: Vec<u32> = redis.procs.iter().map(|p| p.child.id()).collect();
    let set_get = |port: u16, pw: Option<&str>| -> Result<(RedisResult, RedisResult)> {
        let text = redis_benchmark(port, "set,get", size, clients, n, 1, pw)?;
        let res = parse_csv(&text);
        Ok((
            result_of(&res, "SET", &text)?,
            result_of(&res, "GET", &text)?,
        ))
    };
    let mut out = Rounds {
        get: Vec::new(),
        set_wait: Vec::new(),
        each: Vec::new(),
    };
    for _ in 0..rounds {
        let (t0, r0) = (Instant::now(), cpu_of(&pids));
        let (_, redis_get) = set_get(redis.port, None)?;
        let redis_cpu = match (r0, cpu_of(&pids)) {
            (Some(a), Some(b)) => Some((b - a) / t0.elapsed().as_secs_f64().max(1e-9)),
            _ => None,
        };
        redis_cli(redis.port, &["flushall"])?;
        let wait = crate::resp_wait::measure(redis.port, &pids, size, clients, secs)?;
        redis_cli(redis.port, &["flushall"])?;
        flush_door(door_port, password)?;
        let c0 = CpuSample::now(node_pids);
        let (door_set, door_get) = set_get(door_port, password)?;
        let door_cpu = c0.until(&CpuSample::now(node_pids));
        out.get
            .push(door_get.ops_per_s / redis_get.ops_per_s.max(1e-9));
        out.set_wait
            .push(door_set.ops_per_s / wait.ops_per_s.max(1e-9));
        out.each.push(Round {
            door_set,
            door_get,
            redis_get,
            set_wait: wait,
            door_cpu: [door_cpu[1], door_cpu[2]],
            redis_cpu,
        });
    }
    Ok(out)
}

/// The median of `v` (not empty) and its range, as "m (lo-hi of k)".
pub(super) fn median_range(v: &[f64]) -> (f64, String) {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let m = match s.len() % 2 {
        1 => s[s.len() / 2],
        _ => (s[s.len() / 2 - 1] + s[s.len() / 2]) / 2.0,
    };
    let text = format!("{m:.2} ({:.2}-{:.2} of {})", s[0], s[s.len() - 1], s.len());
    (m, text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_redis_7_csv() {
        let text = "\"test\",\"rps\",\"avg_latency_ms\",\"min_latency_ms\",\"p50_latency_ms\",\"p95_latency_ms\",\"p99_latency_ms\",\"max_latency_ms\"\n\
                    \"SET\",\"17953.32\",\"0.052\",\"0.008\",\"0.023\",\"0.047\",\"0.175\",\"23.647\"\n\
                    \"GET\",\"16366.61\",\"0.058\",\"0.008\",\"0.023\",\"0.039\",\"0.399\",\"39.359\"\n";
        let r = parse_csv(text);
        assert_eq!(r.len(), 2);
        assert_eq!(r[0].0, "SET");
        assert!((r[0].1.ops_per_s - 17953.32).abs() < 1e-6);
        assert!((r[0].1.p50_us.unwrap() - 23.0).abs() < 1e-6);
        assert!((r[1].1.p99_us.unwrap() - 399.0).abs() < 1e-6);
    }

    #[test]
    fn median_and_range_of_rounds() {
        assert_eq!(median_range(&[1.2, 0.8, 1.0]).1, "1.00 (0.80-1.20 of 3)");
        assert_eq!(median_range(&[0.9, 1.1]).0, 1.0);
    }

    #[test]
    fn parses_old_csv_without_header() {
        let r = parse_csv("\"SET\",\"1000.50\"\n\"GET\",\"2000.00\"\n");
        assert_eq!(r.len(), 2);
        assert!((r[1].1.ops_per_s - 2000.0).abs() < 1e-6);
        assert!(r[1].1.p50_us.is_none());
    }
}
