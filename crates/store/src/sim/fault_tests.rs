//! The coordinator's faults, pauses and clock drift, checked for
//! linearizable histories; `SOFTRDMA_SEEDS` sets the number of seeds.

use super::*;

fn count(default: u64, soak: u64) -> u64 {
    std::env::var("SOFTRDMA_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(if std::env::var("SOFTRDMA_SOAK").is_ok_and(|v| v == "1") {
            soak
        } else {
            default
        })
}

/// The faults that found issue 16: a coordinator that answers late,
/// out of order and loses requests and replies, node clocks drifting by
/// up to 2%, nodes paused for longer than their lease, on top of the
/// crashes; one-sided reads and reads of other clients' objects; every
/// object's history must be linearizable and no acknowledged write lost.
#[test]
fn coordinator_faults_pauses_and_drift_keep_histories_linearizable() {
    let cfg = SimConfig {
        coord_faults: true,
        clock_drift_permille: 20,
        pauses: true,
        ..SimConfig::default()
    };
    let first: u64 = std::env::var("SOFTRDMA_SEED").map_or(0, |s| s.parse().unwrap());
    // (`min_in_sync` 0 here; the default, 1, gets the most seeds below.)
    let n = count(500, 10_000);
    let mut total = SimReport::default();
    let mut failures = Vec::new();
    for seed in first..first + n {
        match run(seed, &cfg) {
            Ok(r) => total += &r,
            Err(e) => failures.push(e),
        }
    }
    eprintln!(
        "sim: {n} seeds, {} crashes, {} pauses, {} coordinator losses, {} elections, \
         {} one-sided reads ({} refused), {} ops checked; keyed gets one-sided {} \
         ({} cache hits, {} restarts, {} gave up); {} failed",
        total.crashes,
        total.pauses,
        total.coord_losses,
        total.elections,
        total.one_sided_reads,
        total.refused_reads,
        total.history_ops,
        total.keyed_one_sided,
        total.cache_hits,
        total.lookup_restarts,
        total.lookup_fallbacks,
        failures.len()
    );
    for f in failures.iter().take(5) {
        eprintln!("--- {f}");
    }
    assert!(
        failures.is_empty(),
        "{} of {n} seeds failed; first: {}",
        failures.len(),
        failures[0]
    );
    assert!(total.pauses > n && total.coord_losses > n / 2 && total.crashes > n);
    // Keys are exercised: one-sided look-ups, cache hits, and look-ups
    // that raced writes.
    assert!(total.keyed_one_sided > 10 * n && total.cache_hits > n);
    assert!(total.lookup_restarts > 0);
}

/// The same faults with `min_in_sync` 1 (the default since issue 29): a
/// primary left alone refuses new writes (and acknowledges none held by
/// it only), and everything still holds.
#[test]
fn min_in_sync_one_refuses_instead_of_acknowledging_alone() {
    let cfg = SimConfig {
        coord_faults: true,
        clock_drift_permille: 20,
        pauses: true,
        min_in_sync: 1,
        ..SimConfig::default()
    };
    let n = count(2000, 50_000);
    let first: u64 = std::env::var("SOFTRDMA_SEED").map_or(0, |s| s.parse().unwrap());
    let mut total = SimReport::default();
    for seed in first..first + n {
        total += &run(seed, &cfg).unwrap_or_else(|e| panic!("{e}"));
    }
    eprintln!(
        "sim (min_in_sync 1): {n} seeds, {} ops, {} writes refused",
        total.acked_ops, total.refused_writes
    );
    assert!(total.refused_writes > 0, "the policy was never exercised");
}
