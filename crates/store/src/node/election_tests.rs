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

/// What a node still loading its snapshot says (`net/herald.rs`) is what
/// it will say once loaded: the state its log's scan found.
#[test]
fn the_herald_says_the_state_the_load_ends_at() {
    use crate::persist::Policy;
    let mut h = H::persisting(Policy::Everysec);
    h.redundant();
    h.run(4 * HB, &never);
    let node = h.node(2);
    let base = node.base();
    let entries: Vec<Entry> = (1..=3u64)
        .map(|i| Entry::Write {
            epoch: base.epoch + i / 2,
            seq: base.seq + i,
            op: RepOp {
                client: 9,
                req_id: i,
                effects: Vec::new(),
                reply: Reply::Refused("nothing to do".into()),
            },
        })
        .collect();
    let said = Recovering::<HeapMemory>::standing_of(&base, &entries);
    let mut r = Recovering::new(node.cfg.clone(), HeapMemory::new(ARENA.len), &base).unwrap();
    r.snapshot(0, node.image.memory().bytes()).unwrap();
    for e in &entries {
        r.replay(e).unwrap();
    }
    let loaded = r.finish(0).unwrap();
    assert_eq!(Some(said), loaded.dur.standing);
    assert_eq!(said, (base.epoch + 1, base.seq + 3));
}

/// Node 1 is still loading its snapshot, of the same state as node 2's
/// (both logs end at the same write, as after a quiet moment), and its
/// herald says so. Node 2, loaded, must campaign at once: its peer holds
/// nothing newer and is not a live node. Before the herald's `loading`,
/// node 2 heard nothing and waited the `everysec` grace for a peer that
/// might be loading more (0.9 s of a 1.5-2.4 s recovery in
/// `store bench-recovery`); heard as an equal peer, the lower node id
/// would win the tie and node 2 would wait for node 1's whole load.
#[test]
fn a_peer_loading_the_same_state_is_not_waited_for() {
    let (mut h, loading) = one_loading(false);
    let restart = h.t;
    let grace = 5 * HB + 2 * 4 * HB;
    while h.node(2).role() != Role::Primary {
        assert!(
            h.t < restart + grace,
            "node 2 waited the grace for a peer loading the same state"
        );
        herald(&mut h, &loading);
        h.run(HB, &never);
    }
    h.nodes.insert(1, loading);
    h.run(400_000, &never);
    assert!(h.node(2).is_redundant(), "{:?}", h.node(2).status());
}

/// Node 1 is still loading a newer state than node 2's (its log holds
/// two writes more). Node 2 must wait for it, past the grace, and copy
/// from it once it has loaded and won: the newest state wins even when it
/// is the slower to load.
#[test]
fn a_peer_loading_a_newer_state_is_waited_for() {
    let (mut h, loading) = one_loading(true);
    let restart = h.t;
    while h.t < restart + 30 * HB {
        herald(&mut h, &loading);
        h.run(HB, &never);
        assert_ne!(h.node(2).role(), Role::Primary, "the older state won");
    }
    h.nodes.insert(1, loading);
    h.run(400_000, &never);
    assert_eq!(h.node(1).role(), Role::Primary);
    assert!(h.node(1).is_redundant(), "{:?}", h.node(1).status());
    for k in 1..=6 {
        let get = Op::Get { key: vec![b'k', k] };
        let Ok(Reply::Value { data, .. }) = h.request_to(1, get) else {
            panic!("k{k} lost")
        };
        assert_eq!(data, vec![k; 40]);
    }
}

/// A group back from its logs under `everysec`: node 2 loaded and
/// running, node 1 (returned) still loading its snapshot; node 1's log
/// holds two writes more than node 2's if `newer`, the same otherwise.
fn one_loading(newer: bool) -> (H, Node<HeapMemory>) {
    use crate::persist::Policy;
    let mut h = H::persisting(Policy::Everysec);
    h.redundant();
    for k in 1..=4 {
        assert!(matches!(h.request(put(k)), Ok(Reply::Stored { .. })));
    }
    h.run(4 * HB, &never);
    let loaded = h.recovered(2);
    if newer {
        for k in 5..=6 {
            assert!(matches!(h.request(put(k)), Ok(Reply::Stored { .. })));
        }
        h.run(4 * HB, &never);
    }
    let loading = h.recovered(1);
    assert_eq!(
        loading.applied_seq() > loaded.applied_seq(),
        newer,
        "the states are as the test needs"
    );
    h.msgs.clear();
    h.calls.clear();
    h.t += 20 * HB;
    h.nodes.remove(&1);
    h.nodes.insert(2, loaded);
    (h, loading)
}

/// What node 1's herald sends node 2 each beat while node 1 loads.
fn herald(h: &mut H, loading: &Node<HeapMemory>) {
    let (epoch, seq) = loading.dur.standing.expect("back from its log");
    let env = Envelope {
        epoch,
        body: Body::Standing {
            member: loading.member(),
            epoch,
            seq,
            campaigns: true,
            loading: true,
        },
    };
    h.feed(
        2,
        Input::Message {
            from: Addr::Node(1),
            env,
        },
    );
}

/// Sets key `k<k>` to 40 bytes of `k`.
fn put(k: u8) -> Op {
    Op::Put {
        key: vec![b'k', k],
        data: vec![k; 40].into(),
        cond: Cond::Always,
        ttl: crate::proto::Ttl::Clear,
    }
}
