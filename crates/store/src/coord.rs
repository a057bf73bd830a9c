//! Coordinators: who is primary of a group, under which epoch.
//!
//! A replica group's leadership lives in a coordinator, not in the nodes:
//!
//! * a **record** per group: `epoch`, `primary` and the `in_sync` secondary
//!   (the one node holding every acknowledged write), each a
//!   [`Member`] (node id + incarnation, so a restarted node that lost its
//!   memory is not mistaken for its former self);
//! * a **lease** with a TTL held by the primary, renewed by
//!   [`Coordinator::keep_alive`].
//!
//! Rules (identical in every implementation):
//!
//! * [`campaign`](Coordinator::campaign) wins iff the lease is free (or
//!   already the caller's) and the caller is *eligible*: there is no record
//!   yet (bootstrap), or it is the record's primary or in-sync member. Winning
//!   writes a new record `{new epoch, caller, in_sync}`, where `in_sync` is
//!   the old record's when the caller was its primary (a re-election: the
//!   in-sync member still holds every acknowledged write, since the primary
//!   acknowledged none without it) and none otherwise (a failover: the old
//!   primary is gone or fenced). [`Campaign::Won`] says which.
//! * [`set_in_sync`](Coordinator::set_in_sync) succeeds only for the current
//!   primary holding the lease at the current epoch (compare-and-set) and
//!   bumps the epoch.
//! * Epochs only grow.
//! * [`retire`](Coordinator::retire): a node about to discard its data and
//!   rejoin under a new incarnation asks first. Refused while the record
//!   names the old incarnation (as primary or in-sync member: its data may
//!   be the only full copy); otherwise the old incarnation is recorded as
//!   **retired**, and from then on it can neither be registered in sync (a
//!   `set_in_sync` still on its way fails) nor win a campaign (one still
//!   on its way loses). Without this a late registration or campaign could
//!   name an incarnation that no longer exists, and with the other node
//!   lost the group could never elect a primary again. Only incarnations
//!   that were retired are refused: a node's next process starts with a
//!   fresh random incarnation that was never retired, and is registered
//!   like any other (issue 29, finding 9: "not the node's latest retired-to
//!   incarnation" used to count as retired, so every restart after a
//!   retirement cost a step-down of the primary and a second copy).
//!   Retired incarnations are kept for the group's life: a retirement
//!   happens once per in-process rejoin, 8 bytes each, and a message of a
//!   retired incarnation may be late by any amount.
//!
//! * Two **operator** calls, for what no election can decide (issue 33:
//!   both nodes lost together), both refused while a lease is held (a
//!   healthy primary serves): [`promote`](Coordinator::promote) writes a
//!   record naming one incarnation primary (no in-sync member, no lease,
//!   a new epoch), so that node's next campaign wins even though the
//!   record named another (writes only the other held are given up, and
//!   the other, if it comes back, copies from the promoted one);
//!   [`reset`](Coordinator::reset) forgets the record and retires the
//!   incarnations it named, so those nodes discard their data (a campaign
//!   refused with no record at all tells a node it was retired) and the
//!   group starts empty. Epochs stay above every earlier one.
//!
//! Hence a primary may acknowledge writes alone ("degraded") only after it
//! has recorded `in_sync: none`; from then on the former secondary can never
//! win a campaign, so no acknowledged write can be lost by promoting it.
//!
//! Implementations: [`LeaseTable`] (pure, explicit time; the heart of the
//! embedded coordinator and of the simulation), [`embedded`] (a tiny TCP
//! server on loopback plus its client) and [`etcd`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use crate::proto::Member;

pub mod embedded;
pub mod etcd;

/// A group's leadership record.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupRecord {
    /// Current epoch.
    pub epoch: u64,
    /// The primary elected at `epoch`.
    pub primary: Member,
    /// The secondary that holds every acknowledged write, if any.
    pub in_sync: Option<Member>,
    /// Whether the primary's lease is live.
    pub lease_held: bool,
}

/// Result of a campaign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Campaign {
    /// The caller is primary at `epoch`.
    Won {
        /// The new epoch.
        epoch: u64,
        /// The in-sync secondary it keeps (a re-election), if any.
        in_sync: Option<Member>,
    },
    /// Someone else is primary, or the caller is not eligible.
    Lost {
        /// The record as it stands.
        record: Option<GroupRecord>,
    },
}

/// Errors talking to a coordinator (not refusals: those are values).
#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    /// I/O with the coordinator failed.
    #[error("coordinator unreachable: {0}")]
    Io(String),
    /// The coordinator answered something unexpected.
    #[error("coordinator protocol error: {0}")]
    Protocol(String),
    /// The coordinator could not be started.
    #[error("{0}")]
    Setup(String),
}

/// The answer to an operator call ([`Coordinator::promote`],
/// [`Coordinator::reset`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Override {
    /// Done. `record`: after a promotion, the new record; after a reset,
    /// the record that was forgotten (if there was one).
    Done {
        /// See above.
        record: Option<GroupRecord>,
    },
    /// Refused: a primary holds the lease.
    LeaseHeld {
        /// The record as it stands.
        record: GroupRecord,
    },
    /// Refused: the incarnation to promote was retired (it discarded its
    /// data or never held any the group needs).
    Retired,
}

impl Override {
    /// Whether the call was carried out.
    pub fn is_done(&self) -> bool {
        matches!(self, Override::Done { .. })
    }
}

/// A coordinator, as used by a node's runtime (blocking calls).
pub trait Coordinator: Send + Sync {
    /// Tries to become primary of `group`.
    fn campaign(&self, group: &str, me: Member, ttl: Duration) -> Result<Campaign, CoordError>;
    /// Renews the lease; `false` if `me` is no longer primary at `epoch`.
    fn keep_alive(&self, group: &str, me: Member, epoch: u64) -> Result<bool, CoordError>;
    /// Records the in-sync secondary; returns the new epoch, or `None` if
    /// `me` is no longer primary at `epoch`.
    fn set_in_sync(
        &self,
        group: &str,
        me: Member,
        epoch: u64,
        in_sync: Option<Member>,
    ) -> Result<Option<u64>, CoordError>;
    /// Gives up the lease (the record stays, so the in-sync secondary can
    /// take over at once).
    fn resign(&self, group: &str, me: Member, epoch: u64) -> Result<(), CoordError>;
    /// Reads the record (poll).
    fn get(&self, group: &str) -> Result<Option<GroupRecord>, CoordError>;
    /// Retires `old` in favour of incarnation `new` of the same node;
    /// `false` if the record names `old` (keep the data).
    fn retire(&self, group: &str, old: Member, new: u64) -> Result<bool, CoordError>;
    /// Operator: makes `m` the primary of a new record with no in-sync
    /// member and no lease; its next campaign wins. Refused while a lease
    /// is held, or if `m` was retired.
    fn promote(&self, group: &str, m: Member) -> Result<Override, CoordError>;
    /// Operator: forgets the record and retires the incarnations it names;
    /// the next campaign of a node not retired starts an empty group.
    /// Refused while a lease is held.
    fn reset(&self, group: &str) -> Result<Override, CoordError>;
}

#[derive(Debug, Clone)]
struct Entry {
    epoch: u64,
    primary: Member,
    in_sync: Option<Member>,
    /// Lease expiry (time units of the caller), `None` when resigned.
    expires: Option<u64>,
    ttl: u64,
}

impl Entry {
    fn held(&self, now: u64) -> bool {
        self.expires.is_some_and(|e| now < e)
    }
    fn record(&self, now: u64) -> GroupRecord {
        GroupRecord {
            epoch: self.epoch,
            primary: self.primary,
            in_sync: self.in_sync,
            lease_held: self.held(now),
        }
    }
}

/// The coordinator's rules over explicit time (any monotonic unit, e.g.
/// microseconds). Deterministic; no I/O.
#[derive(Debug, Clone, Default)]
pub struct LeaseTable {
    groups: BTreeMap<String, Entry>,
    /// Per group and node: its retired incarnations.
    retired: BTreeMap<(String, u32), BTreeSet<u64>>,
    /// Per group that was reset: the forgotten record's epoch (a new
    /// record's epoch starts above it).
    floor: BTreeMap<String, u64>,
}

impl LeaseTable {
    /// An empty table.
    pub fn new() -> LeaseTable {
        LeaseTable::default()
    }

    /// Whether `m` was retired.
    fn retired(&self, group: &str, m: Member) -> bool {
        self.retired
            .get(&(group.to_string(), m.node))
            .is_some_and(|r| r.contains(&m.incarnation))
    }

    /// Whether the table holds anything of `group`.
    pub fn knows(&self, group: &str) -> bool {
        self.groups.contains_key(group)
            || self
                .retired
                .range((group.to_string(), 0)..=(group.to_string(), u32::MAX))
                .next()
                .is_some()
    }

    /// How many groups the table holds anything of.
    pub fn group_count(&self) -> usize {
        let mut n = self.groups.len();
        let mut last: Option<&str> = None;
        for (g, _) in self.retired.keys() {
            if last != Some(g.as_str()) && !self.groups.contains_key(g) {
                n += 1;
            }
            last = Some(g.as_str());
        }
        n
    }

    /// See [`Coordinator::campaign`].
    pub fn campaign(&mut self, group: &str, me: Member, ttl: u64, now: u64) -> Campaign {
        if self.retired(group, me) {
            return Campaign::Lost {
                record: self.groups.get(group).map(|e| e.record(now)),
            };
        }
        let (next_epoch, in_sync) = match self.groups.get(group) {
            None => (self.floor.get(group).copied().unwrap_or(0) + 1, None),
            Some(e) => {
                let lease_ok = !e.held(now) || e.primary == me;
                let eligible = e.primary == me || e.in_sync == Some(me);
                if !(lease_ok && eligible) {
                    return Campaign::Lost {
                        record: Some(e.record(now)),
                    };
                }
                let keep = if e.primary == me { e.in_sync } else { None };
                (e.epoch + 1, keep)
            }
        };
        self.groups.insert(
            group.to_string(),
            Entry {
                epoch: next_epoch,
                primary: me,
                in_sync,
                expires: Some(now.saturating_add(ttl)),
                ttl,
            },
        );
        Campaign::Won {
            epoch: next_epoch,
            in_sync,
        }
    }

    fn current_mut(&mut self, group: &str, me: Member, epoch: u64, now: u64) -> Option<&mut Entry> {
        self.groups
            .get_mut(group)
            .filter(|e| e.primary == me && e.epoch == epoch && e.held(now))
    }

    /// See [`Coordinator::keep_alive`].
    pub fn keep_alive(&mut self, group: &str, me: Member, epoch: u64, now: u64) -> bool {
        match self.current_mut(group, me, epoch, now) {
            Some(e) => {
                e.expires = Some(now.saturating_add(e.ttl));
                true
            }
            None => false,
        }
    }

    /// See [`Coordinator::set_in_sync`].
    pub fn set_in_sync(
        &mut self,
        group: &str,
        me: Member,
        epoch: u64,
        in_sync: Option<Member>,
        now: u64,
    ) -> Option<u64> {
        // A primary is never its own secondary: such a request (only a
        // broken or hostile client sends one) is refused like a stale one.
        if in_sync.is_some_and(|m| m.node == me.node || self.retired(group, m)) {
            return None;
        }
        let e = self.current_mut(group, me, epoch, now)?;
        e.in_sync = in_sync;
        e.epoch += 1;
        Some(e.epoch)
    }

    /// See [`Coordinator::resign`].
    pub fn resign(&mut self, group: &str, me: Member, epoch: u64, now: u64) {
        if let Some(e) = self.current_mut(group, me, epoch, now) {
            e.expires = None;
        }
    }

    /// See [`Coordinator::get`].
    pub fn get(&self, group: &str, now: u64) -> Option<GroupRecord> {
        self.groups.get(group).map(|e| e.record(now))
    }

    /// See [`Coordinator::retire`].
    pub fn retire(&mut self, group: &str, old: Member, new: u64) -> bool {
        if self
            .groups
            .get(group)
            .is_some_and(|e| e.primary == old || e.in_sync == Some(old))
        {
            return false;
        }
        let _ = new; // the node's next incarnation: fresh, so never retired
        self.retired
            .entry((group.to_string(), old.node))
            .or_default()
            .insert(old.incarnation);
        true
    }

    /// See [`Coordinator::promote`].
    pub fn promote(&mut self, group: &str, m: Member, now: u64) -> Override {
        if self.retired(group, m) {
            return Override::Retired;
        }
        let (epoch, ttl) = match self.groups.get(group) {
            Some(e) if e.held(now) => {
                return Override::LeaseHeld {
                    record: e.record(now),
                }
            }
            Some(e) => (e.epoch, e.ttl),
            None => (self.floor.get(group).copied().unwrap_or(0), 0),
        };
        let e = Entry {
            epoch: epoch + 1,
            primary: m,
            in_sync: None,
            expires: None,
            ttl,
        };
        let record = Some(e.record(now));
        self.groups.insert(group.to_string(), e);
        Override::Done { record }
    }

    /// See [`Coordinator::reset`].
    pub fn reset(&mut self, group: &str, now: u64) -> Override {
        let Some(e) = self.groups.get(group) else {
            return Override::Done { record: None };
        };
        let record = e.record(now);
        if record.lease_held {
            return Override::LeaseHeld { record };
        }
        self.groups.remove(group);
        self.floor.insert(group.to_string(), record.epoch);
        for m in [Some(record.primary), record.in_sync].into_iter().flatten() {
            self.retired
                .entry((group.to_string(), m.node))
                .or_default()
                .insert(m.incarnation);
        }
        Override::Done {
            record: Some(record),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn m(node: u32, incarnation: u64) -> Member {
        Member { node, incarnation }
    }

    /// Issue 29, finding 9: once a node had retired an incarnation, its
    /// next process (a fresh random incarnation) counted as retired too,
    /// so its registration was refused and the primary stepped down.
    #[test]
    fn a_restarted_node_is_not_retired_by_an_earlier_retirement() {
        let mut t = LeaseTable::new();
        let (p, s1) = (m(2, 7), m(1, 100));
        let Campaign::Won { epoch, .. } = t.campaign("g", p, 1_000, 0) else {
            panic!()
        };
        // Node 1 rejoins once in-process: 100 retires in favour of 101.
        assert!(t.retire("g", s1, 101));
        assert_eq!(t.set_in_sync("g", p, epoch, Some(s1), 1), None, "retired");
        let e = t.set_in_sync("g", p, epoch, Some(m(1, 101)), 2).unwrap();
        // Node 1's process dies; the primary drops it; a new process of
        // node 1 starts with a fresh random incarnation.
        let e = t.set_in_sync("g", p, e, None, 3).unwrap();
        let fresh = m(1, 0x5eed_0000_0000_0001);
        assert_eq!(
            t.set_in_sync("g", p, e, Some(fresh), 4),
            Some(e + 1),
            "a fresh incarnation was never retired"
        );
        // The retired ones stay retired.
        let e = e + 1;
        assert_eq!(t.set_in_sync("g", p, e, Some(s1), 5), None, "still retired");
    }

    /// The operator's calls (issue 33): refused under a live lease; a
    /// promotion lets a node the record did not name win; a reset retires
    /// the named incarnations (their campaigns are refused with no record,
    /// which tells them so) and a new node starts the group above every
    /// earlier epoch.
    #[test]
    fn promote_and_reset_only_without_a_live_lease() {
        let mut t = LeaseTable::new();
        let (a, b, c) = (m(1, 10), m(2, 20), m(3, 30));
        let Campaign::Won { epoch, .. } = t.campaign("g", a, 100, 0) else {
            panic!()
        };
        let e = t.set_in_sync("g", a, epoch, Some(b), 1).unwrap();
        let e = t.set_in_sync("g", a, e, None, 2).unwrap();
        // a serves: both refused, nothing changed.
        let live = t.get("g", 50).unwrap();
        assert_eq!(t.promote("g", b, 50), Override::LeaseHeld { record: live });
        assert_eq!(t.reset("g", 50), Override::LeaseHeld { record: live });
        assert_eq!(t.get("g", 50), Some(live));
        // a's lease lapses: b (dropped from sync) cannot win by itself...
        assert!(matches!(
            t.campaign("g", b, 100, 200),
            Campaign::Lost { .. }
        ));
        // ...until promoted.
        let Override::Done { record: Some(r) } = t.promote("g", b, 200) else {
            panic!()
        };
        assert_eq!(
            (r.epoch, r.primary, r.in_sync, r.lease_held),
            (e + 1, b, None, false)
        );
        assert!(
            matches!(t.campaign("g", a, 100, 201), Campaign::Lost { .. }),
            "a is stale now"
        );
        assert_eq!(
            t.campaign("g", b, 100, 202),
            Campaign::Won {
                epoch: e + 2,
                in_sync: None
            }
        );
        let e = t.set_in_sync("g", b, e + 2, Some(c), 203).unwrap();
        // Both lost: reset. b and c are retired, the record is gone.
        let Override::Done { record: Some(old) } = t.reset("g", 400) else {
            panic!()
        };
        assert_eq!((old.epoch, old.primary, old.in_sync), (e, b, Some(c)));
        assert_eq!(t.get("g", 400), None);
        assert_eq!(
            t.campaign("g", b, 100, 401),
            Campaign::Lost { record: None }
        );
        assert_eq!(
            t.campaign("g", c, 100, 401),
            Campaign::Lost { record: None }
        );
        assert_eq!(t.promote("g", c, 401), Override::Retired);
        // A node's next incarnation starts the group, above every epoch.
        assert_eq!(
            t.campaign("g", m(2, 21), 100, 402),
            Campaign::Won {
                epoch: e + 1,
                in_sync: None
            }
        );
        assert!(!t.reset("g", 403).is_done(), "its lease is live");
    }

    #[test]
    fn lease_table_rules() {
        let mut t = LeaseTable::new();
        let (a, b) = (m(1, 10), m(2, 20));
        assert_eq!(
            t.campaign("g", a, 100, 0),
            Campaign::Won {
                epoch: 1,
                in_sync: None
            }
        );
        // b is not eligible and the lease is held.
        assert!(matches!(t.campaign("g", b, 100, 50), Campaign::Lost { .. }));
        assert!(t.keep_alive("g", a, 1, 90));
        assert_eq!(t.set_in_sync("g", a, 1, Some(b), 95), Some(2));
        assert_eq!(t.set_in_sync("g", a, 1, None, 96), None, "stale epoch");
        // Lease renewed at 90 -> expires at 190: b must wait.
        assert!(matches!(
            t.campaign("g", b, 100, 189),
            Campaign::Lost { .. }
        ));
        // A failover: the new primary records no in-sync member.
        assert_eq!(
            t.campaign("g", b, 100, 190),
            Campaign::Won {
                epoch: 3,
                in_sync: None
            }
        );
        // The old primary is fenced: no renewal, no CAS.
        assert!(!t.keep_alive("g", a, 2, 191));
        assert_eq!(t.set_in_sync("g", a, 2, None, 191), None);
        let r = t.get("g", 191).unwrap();
        assert_eq!(
            (r.epoch, r.primary, r.in_sync, r.lease_held),
            (3, b, None, true)
        );
        // After b's lease lapses, a (no longer primary nor in sync) cannot win,
        // and a restarted b (new incarnation) cannot either.
        assert!(matches!(
            t.campaign("g", a, 100, 400),
            Campaign::Lost { .. }
        ));
        assert!(matches!(
            t.campaign("g", m(2, 21), 100, 400),
            Campaign::Lost { .. }
        ));
        // b itself can, under a new epoch.
        assert_eq!(
            t.campaign("g", b, 100, 400),
            Campaign::Won {
                epoch: 4,
                in_sync: None
            }
        );
        t.resign("g", b, 4, 401);
        assert!(!t.get("g", 401).unwrap().lease_held);
        // A re-election of the record's primary keeps its in-sync member
        // (issue 16: a lease hiccup must not cost the secondary a full
        // copy); a failover to the in-sync member does not.
        let c = m(3, 30);
        assert_eq!(t.set_in_sync("g", b, 4, Some(c), 402), None, "resigned");
        assert_eq!(
            t.campaign("g", b, 100, 403),
            Campaign::Won {
                epoch: 5,
                in_sync: None
            }
        );
        assert_eq!(t.set_in_sync("g", b, 5, Some(c), 404), Some(6));
        // b's lease lapses (no renewal): b wins again, c stays in sync.
        assert_eq!(
            t.campaign("g", b, 100, 600),
            Campaign::Won {
                epoch: 7,
                in_sync: Some(c)
            }
        );
        // c cannot retire while named; a retired incarnation can neither be
        // registered nor win.
        assert!(!t.retire("g", c, 31));
        // Now b dies; c takes over with nobody in sync.
        assert_eq!(
            t.campaign("g", c, 100, 800),
            Campaign::Won {
                epoch: 8,
                in_sync: None
            }
        );
    }
}
