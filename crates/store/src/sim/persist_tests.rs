//! The simulation with persistence (issue 33, `persist_sim.rs`): nodes
//! that log to partitions which lose their unflushed writes on every
//! crash, recover from them on every restart, and whole-group crashes.

use super::*;
use crate::persist::Policy;

/// The seeds to run: `SOFTRDMA_SEED` alone if set, else `default` of
/// them (`soak` under `SOFTRDMA_SOAK=1`).
fn seeds(default: u64, soak: u64) -> std::ops::Range<u64> {
    if let Ok(s) = std::env::var("SOFTRDMA_SEED") {
        let s: u64 = s.parse().expect("a seed");
        return s..s + 1;
    }
    if std::env::var("SOFTRDMA_SOAK").is_ok_and(|v| v == "1") {
        0..soak
    } else {
        0..default
    }
}

fn persisting(policy: Policy) -> SimConfig {
    SimConfig {
        persist: policy,
        keyed_percent: 60,
        // Long enough for group crashes in the middle of the load.
        ops_per_client: 400,
        ..SimConfig::default()
    }
}

/// Under `always`, whole-group crashes with power lost on both
/// partitions, at random moments (in the middle of commits, snapshots and
/// copies), lose nothing acknowledged: every acknowledged write reads
/// back, no deleted object returns, the history stays linearizable across
/// the crashes, and the nodes end identical.
#[test]
fn always_loses_no_acknowledged_write_across_whole_group_crashes() {
    let cfg = SimConfig {
        group_crashes: 3,
        ..persisting(Policy::Always)
    };
    let batched = SimConfig {
        batches: true,
        ..cfg.clone()
    };
    let mut total = SimReport::default();
    for (seed, cfg) in seeds(8, 200).flat_map(|s| [(s, &cfg), (s, &batched)]) {
        let r = run(seed, cfg).unwrap_or_else(|e| panic!("{e}"));
        total += &r;
    }
    eprintln!("{total:?}");
    assert!(total.group_crashes >= 16, "{total:?}");
    assert!(total.recoveries >= 2 * total.group_crashes, "{total:?}");
    assert!(total.snapshots > total.group_crashes, "{total:?}");
    assert!(total.crashes_in_snapshot > 0, "{total:?}");
    // (Each group crash comes in the middle of a commit: its tail torn.)
    assert!(total.torn_power_losses >= total.group_crashes, "{total:?}");
}

/// Under `everysec`, whole-group crashes with power lost on both
/// partitions, at random moments: nothing acknowledged more than two
/// commit periods before a crash is lost (`EVERYSEC_BOUND`, the
/// simulation's scale of the promise's 2 s), checked by the history's
/// linearizability with the writes acknowledged within that window
/// before each crash counted as unknown and the reads in it dropped;
/// the nodes end identical. Keyed operations only (a pointer's object is
/// checked byte for byte, with no such window).
#[test]
fn everysec_loses_nothing_acknowledged_before_the_bound_across_whole_group_crashes() {
    let cfg = SimConfig {
        group_crashes: 3,
        keyed_percent: 100,
        shared_reads_percent: 0,
        ..persisting(Policy::Everysec)
    };
    let mut total = SimReport::default();
    for seed in seeds(8, 200) {
        let r = run(seed, &cfg).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        total += &r;
    }
    eprintln!("{total:?}");
    assert!(total.group_crashes >= 16, "{total:?}");
    assert!(total.recoveries >= 2 * total.group_crashes, "{total:?}");
    assert!(total.torn_power_losses >= total.group_crashes, "{total:?}");
    // The window is not empty: the check really was loosened, and only
    // for a part of the history.
    assert!(total.in_lossy_window > 0, "{total:?}");
    assert!(total.in_lossy_window < total.acked_ops / 2, "{total:?}");
}

/// Single crashes (each with its partition's power lost) under both
/// policies: a restarted node recovers from its partition and rejoins;
/// the group loses nothing (its peer holds every acknowledged write).
#[test]
fn restarted_nodes_recover_from_their_partitions() {
    for policy in [Policy::Always, Policy::Everysec] {
        let cfg = persisting(policy);
        let mut total = SimReport::default();
        for seed in seeds(6, 100) {
            let r = run(seed, &cfg).unwrap_or_else(|e| panic!("{policy}: {e}"));
            total += &r;
        }
        eprintln!("{policy}: {total:?}");
        assert!(total.recoveries > 0, "{policy}: {total:?}");
    }
}

/// Crashes with pauses (a node stopped for up to four leases) under
/// `always`: a primary back from its log may win again while its
/// secondary, alive but stopped, could not take over in time; that
/// secondary may hold forwarded writes the log lost (never acknowledged)
/// and must copy again rather than stay in sync.
#[test]
fn a_recovered_primary_does_not_keep_a_secondary_that_may_hold_more() {
    let cfg = SimConfig {
        pauses: true,
        ..persisting(Policy::Always)
    };
    let mut total = SimReport::default();
    // (200 seeds: about 4 s; seed 186 is one that needs the rule.)
    for seed in seeds(200, 2000) {
        let r = run(seed, &cfg).unwrap_or_else(|e| panic!("{e}"));
        total += &r;
    }
    eprintln!("{total:?}");
    assert!(total.recoveries > 0 && total.pauses > 0, "{total:?}");
}

/// `always` under `min_in_sync` 1 (the runtime's default): a primary whose
/// secondary died with writes unacknowledged keeps them unexposed (they
/// never commit without a secondary), so its arena never gets quiet; the
/// Join of the restarted secondary must still be answered (once the log
/// holds every applied write, not once the arena is quiet) and writes
/// refused meanwhile are refused at once, not held.
#[test]
fn always_with_min_in_sync_1_rejoins_after_a_secondary_crash() {
    let cfg = SimConfig {
        min_in_sync: 1,
        ..persisting(Policy::Always)
    };
    let mut total = SimReport::default();
    for seed in seeds(12, 200) {
        let r = run(seed, &cfg).unwrap_or_else(|e| panic!("{e}"));
        total += &r;
    }
    eprintln!("{total:?}");
    assert!(total.crashes > 0 && total.refused_writes > 0, "{total:?}");
}

/// Snapshots slow enough that writes fill the log's ring while one runs:
/// writes wait in memory for room (the log is pressed), the node holds
/// new writes (a primary) or acknowledges only durable ones (a
/// secondary) until a snapshot releases the ring, and nothing is lost
/// across crashes. Without the hold, under `everysec` the
/// writes that waited grew the next base past the ring's room (`log
/// full`), and under `always` a primary's waiting writes could never be
/// exposed (they become durable only through a snapshot, whose base needs
/// them exposed): no quiescence.
#[test]
fn a_pressed_log_holds_writes_until_a_snapshot_releases_it() {
    let mut total = SimReport::default();
    for policy in [Policy::Always, Policy::Everysec] {
        let cfg = SimConfig {
            slow_snapshots: true,
            ops_per_client: 1_500,
            max_value: 2_000,
            arena_len: 1 << 20,
            ..persisting(policy)
        };
        for seed in seeds(3, 40) {
            let r = run(seed, &cfg).unwrap_or_else(|e| panic!("{policy} seed {seed}: {e}"));
            total += &r;
        }
    }
    eprintln!("{total:?}");
    assert!(total.log_pressures >= 6, "{total:?}");
}
