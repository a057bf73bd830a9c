//! Issue 33: which node a group back from its logs elects (the
//! scripted harness of `tests.rs`).

use super::*;

/// Issue 33, the election of the newest: a whole group back from its
/// logs under `everysec`, where the in-sync secondary's log holds more
/// than the primary's (the primary's last commit was lost). Both are
/// eligible; the secondary must win, at once (it heard that the only
/// other member is back from its log with less: no live peer to wait
/// for), and the former primary copy from it: the writes only the
/// secondary's log held survive. Before, the record's primary won after
/// the grace and its peer copied from it: `k5` and `k6` were lost.
#[test]
fn a_group_back_from_its_logs_elects_the_newest_state() {
    elect_the_newest(20 * HB);
}

/// The same, restarted while the dead primary's lease still runs: the
/// secondary sees it held, and under `everysec` a node back from its log
/// that saw its peer serve never campaigns. Its peer's `Standing` shows
/// the lease was its last life's, so the newest still wins. Before, the
/// older primary won once its lease ran out (the newer node did not
/// campaign, and said so).
#[test]
fn the_newest_wins_when_the_group_restarts_within_the_dead_primarys_lease() {
    elect_the_newest(HB);
}

/// Both nodes die `down` after the newer secondary's last write and start
/// on their logs; the secondary must win before the grace and keep what
/// only its log held.
fn elect_the_newest(down: Micros) {
    use crate::persist::Policy;
    let mut h = H::persisting(Policy::Everysec);
    h.redundant();
    let put = |k: u8| Op::Put {
        key: vec![b'k', k],
        data: vec![k; 40].into(),
        cond: Cond::Always,
        ttl: crate::proto::Ttl::Clear,
    };
    for k in 1..=4 {
        assert!(matches!(h.request(put(k)), Ok(Reply::Stored { .. })));
    }
    h.run(4 * HB, &never);
    let old_primary = h.recovered(1);
    for k in 5..=6 {
        assert!(matches!(h.request(put(k)), Ok(Reply::Stored { .. })));
    }
    h.run(4 * HB, &never);
    let newer_secondary = h.recovered(2);
    assert!(newer_secondary.applied_seq() > old_primary.applied_seq());
    // Both die; their leases run out; both start on their logs.
    h.msgs.clear();
    h.calls.clear();
    h.t += down;
    h.nodes.insert(1, old_primary);
    h.nodes.insert(2, newer_secondary);
    let restart = h.t;
    let grace = 5 * HB + 2 * 4 * HB;
    let mut won = None;
    while h.t < restart + 40 * HB {
        h.run(HB / 5, &never);
        if won.is_none() && h.node(2).role() == Role::Primary {
            won = Some(h.t - restart);
        }
        assert_ne!(h.node(1).role(), Role::Primary, "the older state won");
    }
    let won = won.expect("the newer node never became primary");
    assert!(
        won < grace,
        "won after {won} us: it waited for the grace ({grace} us)"
    );
    h.run(200_000, &never);
    assert!(h.node(2).is_redundant(), "{:?}", h.node(2).status());
    for k in 1..=6 {
        let get = Op::Get { key: vec![b'k', k] };
        let Ok(Reply::Value { data, .. }) = h.request_to(2, get) else {
            panic!("k{k} lost")
        };
        assert_eq!(data, vec![k; 40]);
    }
}
