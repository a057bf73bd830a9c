//! Roles, epochs and leases: how a node becomes primary (a campaign won
//! at the coordinator), steps down (a newer epoch, a renewal refused),
//! rejoins (wiping its data under a new incarnation), what its timers do,
//! and what it makes of the coordinator's answers.
//!
//! Why at most one primary acknowledges writes or serves reads at a time:
//!
//! * A primary holds a lease at the coordinator for its epoch, and counts
//!   it from when it *sent* the renewal, less the share by which its clock
//!   may drift (`clock_drift_permille`): it stops serving reads and
//!   acknowledging writes before the coordinator can think the lease
//!   lapsed, and only then can another node win a newer epoch.
//! * Every message carries its sender's epoch; older ones are refused
//!   ([`Node::admit`]), and a primary that sees a newer one steps down,
//!   answering its waiting clients `NotPrimary` instead of acknowledging.
//!   A secondary takes a newer epoch only from its primary's stream, so it
//!   never refuses that stream's writes in flight.
//! * A renewal refused because the primary itself moved the epoch on
//!   (registering or dropping its secondary) is asked again at the new
//!   epoch, not taken as a loss (issue 16).
//! * A node the coordinator may name (a synced secondary, a former
//!   primary) retires its incarnation there before it wipes its data
//!   (`Leaving`), so no late campaign or registration can name an empty
//!   node; if the record names it, it keeps the data.

use std::collections::BTreeMap;

use super::{
    Addr, CoordReply, CoordRequest, Micros, Node, Primary, Replica, State, COPY_STALL_TIMEOUTS,
};
use crate::arena::Memory;
use crate::coord::{Campaign, GroupRecord};
use crate::proto::{Body, Envelope, Member, NodeId, StoreError};

impl<M: Memory> Node<M> {
    /// Whether this node's arena may be read at `now`: it is the primary
    /// and its lease (as it last renewed it, less the clock-drift margin)
    /// has not run out. Only the primary serves one-sided reads, and only
    /// committed writes are in its arena's bytes (`unexposed`), so reads
    /// are linearizable: a secondary's bytes can lag the primary's
    /// acknowledgements, or run ahead of what a failover keeps, and two
    /// copies exposing a write at different moments would let one reader
    /// see it and a later reader not (docs/store.md, "Consistency").
    pub fn serves_reads(&self, now: Micros) -> bool {
        self.reads_until().is_some_and(|u| now < u)
    }

    /// Until when (this node's clock) one-sided reads of the arena may be
    /// served: the network layer gives the arena's STag this deadline, so
    /// the engine refuses reads from then on even if no thread of the node
    /// runs at that moment (a paused or busy node cannot serve stale
    /// bytes). `None`: not at all.
    pub fn reads_until(&self) -> Option<Micros> {
        match &self.state {
            State::Primary(p) => Some(p.lease_until),
            _ => None,
        }
    }

    pub(super) fn primary_hint(&self) -> Option<NodeId> {
        match &self.state {
            State::Secondary { primary, .. } => Some(*primary),
            State::Joining {
                join_sent: Some((p, _)),
                ..
            } => Some(*p),
            State::Primary(_) => Some(self.cfg.member.node),
            _ => None,
        }
    }

    // ------------------------------------------------------------ epochs

    /// The epoch rules for a message from `from`: one from an older epoch
    /// is refused (and changes nothing, but for a secondary's own
    /// primary's write, which leaves a gap: it rejoins); a newer epoch is
    /// adopted (a primary steps down). Whether the message goes on to its
    /// handler.
    pub(super) fn admit(&mut self, from: Addr, env: &Envelope) -> bool {
        if env.epoch < self.epoch && matches!(env.body, Body::Standing { .. }) {
            // What a member back from its log holds: its own epoch (which
            // the record's may have passed) says nothing about the news.
            return true;
        }
        if env.epoch < self.epoch {
            if let (State::Secondary { primary, .. }, Body::Replicate { seq, .. }) =
                (&self.state, &env.body)
            {
                if from == Addr::Node(*primary) {
                    // Refusing part of the stream would leave a gap.
                    let (primary, seq) = (*primary, *seq);
                    self.diverged(format!("write {seq} from my primary at an older epoch"));
                    self.become_joining(Some(primary));
                    return false;
                }
            }
            match &env.body {
                Body::Request { req_id, .. } => self.send(
                    from,
                    Body::Response {
                        req_id: *req_id,
                        result: Err(StoreError::StaleEpoch {
                            current: self.epoch,
                        }),
                    },
                ),
                Body::Stale | Body::Response { .. } => {}
                _ => self.send(from, Body::Stale),
            }
            return false;
        }
        if env.epoch > self.epoch {
            match &self.state {
                State::Primary(p) => {
                    let cas_in_flight = matches!(
                        p.replica,
                        Replica::Registering { coord: Some(_), .. }
                            | Replica::Dropping { coord: Some(_) }
                    );
                    if cas_in_flight {
                        // Our own epoch bump may be in flight; the sender
                        // (which learned it from the coordinator) retries.
                        return false;
                    }
                    self.epoch = env.epoch;
                    self.step_down();
                }
                // A secondary takes its epoch only from its primary's
                // stream: adopting a newer one from elsewhere (a client that
                // already saw the primary's latest epoch bump) would make it
                // refuse writes still in flight from its primary, leaving a
                // gap in the sequence.
                State::Secondary { primary, .. } => {
                    if from == Addr::Node(*primary) {
                        self.epoch = env.epoch;
                    }
                }
                _ => {
                    if let Addr::Node(_) = from {
                        self.epoch = env.epoch;
                    }
                }
            }
        }
        true
    }

    // ------------------------------------------------------------ roles

    /// Discards all data and starts joining under a fresh incarnation (the
    /// coordinator must never mistake this empty node for its former self).
    ///
    /// A node whose incarnation the coordinator may name (a synced
    /// secondary, a former primary) first retires it at the coordinator
    /// (`Leaving`), keeping its data until that is done: if the record
    /// names it (its data may be the only full copy, or a campaign of its
    /// is on its way) it keeps the data, and once retired no late
    /// registration or campaign can name it.
    pub(super) fn become_joining(&mut self, primary: Option<NodeId>) {
        let named = match &self.state {
            State::Joining { .. } | State::Leaving { .. } => false,
            State::Secondary { copy, .. } => copy.is_none(),
            State::Primary(_) | State::Fenced { .. } => true,
        };
        if named {
            let new = self.cfg.member.incarnation.wrapping_add(1);
            let id = self.coord(CoordRequest::Retire { new });
            self.state = State::Leaving {
                to: primary,
                new,
                asked: Some(id),
                last_try: self.now,
            };
            return;
        }
        self.rejoin_now(primary, self.cfg.member.incarnation.wrapping_add(1));
    }

    /// Discards all data and joins as incarnation `incarnation`.
    pub(super) fn rejoin_now(&mut self, primary: Option<NodeId>, incarnation: u64) {
        self.cfg.member.incarnation = incarnation;
        self.image.reset();
        self.dur.durable = 0;
        self.dur.recovered = None;
        self.dur.peer_served = None;
        self.state = State::Joining {
            join_sent: None,
            asked: None,
            last_try: self.now,
        };
        if let Some(p) = primary {
            self.send_join(p);
        }
    }

    pub(super) fn send_join(&mut self, primary: NodeId) {
        self.state = State::Joining {
            join_sent: Some((primary, self.now)),
            asked: None,
            last_try: self.now,
        };
        let member = self.cfg.member;
        let arena_len = self.image.arena().len;
        self.send(Addr::Node(primary), Body::Join { member, arena_len });
    }

    /// Takes over as primary at `epoch`. `in_sync`: the secondary the
    /// coordinator kept in sync (a re-election of this very node after a
    /// lease hiccup): its acknowledgements stay required, and it keeps its
    /// copy instead of copying the whole arena again.
    pub(super) fn become_primary(&mut self, epoch: u64, in_sync: Option<Member>) {
        if epoch < self.epoch {
            // A late answer: someone won a later epoch since (we heard of
            // it from a peer). We are superseded; find out by whom.
            let id = self.coord(CoordRequest::Get);
            self.state = State::Fenced {
                asked: Some(id),
                last_try: self.now,
            };
            return;
        }
        self.epoch = epoch;
        if self.image.layout().is_none() {
            // A new group's first primary: its arena holds nothing yet
            // (a node with data always knows its layout). Reserve and
            // format the key index at offset 0.
            self.image.format(self.cfg.index_buckets);
            self.begin_life();
        }
        // The lease began at the coordinator some time before this reply:
        // count it as expired until a renewal sent from now on succeeds.
        let id = self.coord(CoordRequest::KeepAlive { epoch: self.epoch });
        let replica = match in_sync {
            // (A node back from its log cannot keep its secondary: that
            // one may hold writes the log lost, none of them acknowledged.)
            Some(m) if m.node != self.cfg.member.node && self.dur.recovered.is_none() => {
                Replica::InSync {
                    m,
                    last_heard: self.now,
                }
            }
            _ => Replica::None,
        };
        let drop_kept = in_sync.is_some() && self.dur.recovered.is_some();
        self.dur.recovered = None;
        self.dur.peer_served = None;
        self.state = State::Primary(Primary {
            next_seq: self.image.applied_seq() + 1,
            pending: BTreeMap::new(),
            replica,
            replicated_through: 0,
            max_released: 0,
            lease_until: self.now,
            keepalive: Some((id, self.now, self.epoch)),
            last_beat: self.now,
        });
        if drop_kept {
            self.drop_replica();
        }
    }

    pub(super) fn step_down(&mut self) {
        if let State::Primary(p) = std::mem::replace(
            &mut self.state,
            State::Fenced {
                asked: None,
                last_try: self.now,
            },
        ) {
            for (_, ws) in p.pending {
                for w in ws {
                    self.send(
                        w.to,
                        Body::Response {
                            req_id: w.req_id,
                            result: Err(StoreError::NotPrimary { primary: None }),
                        },
                    );
                }
            }
        }
        let id = self.coord(CoordRequest::Get);
        self.state = State::Fenced {
            asked: Some(id),
            last_try: self.now,
        };
    }

    /// Whether a new write may be accepted now (the `min_in_sync` policy):
    /// with 1, only while a secondary's acknowledgements are required and
    /// it is not being dropped.
    pub(super) fn may_accept_writes(&self) -> bool {
        match &self.state {
            State::Primary(p) => {
                self.cfg.min_in_sync == 0
                    || matches!(
                        p.replica,
                        Replica::Registering { failed: false, .. } | Replica::InSync { .. }
                    )
            }
            _ => false,
        }
    }

    // ------------------------------------------------------------ timers

    pub(super) fn on_tick(&mut self) {
        let now = self.now;
        let cfg = self.cfg.clone();
        // A tick after a gap of half a heartbeat timeout or more (the
        // ticker runs every half heartbeat interval) means this node did
        // not run for that long: its peers' messages may be waiting unread
        // behind it, so nobody is judged dead on this tick (finding 4: a
        // loaded host descheduled both processes, and the primary dropped
        // a healthy secondary on waking, before reading its heartbeats).
        let starved = self
            .last_tick
            .is_some_and(|t| now.saturating_sub(t) >= cfg.heartbeat_timeout / 2);
        self.last_tick = Some(now);
        let due = |last: Micros| now.saturating_sub(last) >= cfg.heartbeat_interval;
        let dead = |last: Micros| !starved && now.saturating_sub(last) > cfg.heartbeat_timeout;
        let replica_dead =
            |last: Micros| !starved && now.saturating_sub(last) > cfg.secondary_timeout;
        match &mut self.state {
            State::Joining {
                join_sent,
                asked,
                last_try,
            } => {
                if let Some((_, at)) = join_sent {
                    if dead(*at) {
                        *join_sent = None;
                    }
                }
                if join_sent.is_none() && asked.is_none() && due(*last_try) {
                    *last_try = now;
                    let id = self.coord(CoordRequest::Get);
                    if let State::Joining { asked, .. } = &mut self.state {
                        *asked = Some(id);
                    }
                }
            }
            State::Leaving {
                to,
                new,
                asked,
                last_try,
            } => {
                if asked.is_none() && due(*last_try) {
                    let (to, new) = (*to, *new);
                    let id = self.coord(CoordRequest::Retire { new });
                    self.state = State::Leaving {
                        to,
                        new,
                        asked: Some(id),
                        last_try: now,
                    };
                }
            }
            State::Fenced { asked, last_try } => {
                if asked.is_none() && due(*last_try) {
                    *last_try = now;
                    let id = self.coord(CoordRequest::Get);
                    self.state = State::Fenced {
                        asked: Some(id),
                        last_try: now,
                    };
                }
            }
            State::Secondary {
                primary,
                last_heard,
                last_beat,
                copy,
                campaign,
                ..
            } => {
                let primary = *primary;
                let beat = due(*last_beat);
                if beat {
                    *last_beat = now;
                }
                let silent = dead(*last_heard);
                let copying = copy.is_some();
                let stalled = copy.as_ref().is_some_and(|c| {
                    now.saturating_sub(c.last_progress)
                        > COPY_STALL_TIMEOUTS * cfg.heartbeat_timeout
                });
                // One campaign in flight at a time, one per interval.
                // (`last_heard` stays what it is: `after_lost` asks whether
                // the primary still talks to us.)
                let can_campaign = campaign.is_none() && due(self.last_campaign);
                if beat {
                    self.send(Addr::Node(primary), Body::Heartbeat);
                    if !copying {
                        // Acks are cumulative: repeating the latest one
                        // repairs an ack the primary refused (sent just
                        // before an epoch bump) or a link lost.
                        let seq = self.acked_through();
                        self.send(Addr::Node(primary), Body::ReplicateAck { seq });
                    }
                }
                if silent && copying {
                    self.become_joining(None);
                } else if stalled {
                    // Ask the same primary for a new session.
                    self.become_joining(Some(primary));
                } else if silent && can_campaign {
                    self.last_campaign = now;
                    let id = self.coord(CoordRequest::Campaign);
                    if let State::Secondary { campaign, .. } = &mut self.state {
                        *campaign = Some(id);
                    }
                }
            }
            State::Primary(p) => {
                if due(p.last_beat) {
                    p.last_beat = now;
                    if let Some(n) = p.replica.node() {
                        let in_sync = matches!(p.replica, Replica::InSync { .. });
                        self.send(Addr::Node(n), Body::Heartbeat);
                        let seq = self.image.applied_seq();
                        self.send(Addr::Node(n), Body::ReplicateHead { seq, in_sync });
                    }
                    let State::Primary(p) = &mut self.state else {
                        unreachable!()
                    };
                    if p.keepalive.is_none() {
                        let epoch = self.epoch;
                        let id = self.coord(CoordRequest::KeepAlive { epoch });
                        if let State::Primary(p) = &mut self.state {
                            p.keepalive = Some((id, now, epoch));
                        }
                    }
                }
                let State::Primary(p) = &mut self.state else {
                    unreachable!()
                };
                match p.replica {
                    Replica::Syncing { last_heard, .. } if replica_dead(last_heard) => {
                        p.replica = Replica::None;
                    }
                    Replica::Registering {
                        last_heard,
                        coord: None,
                        ..
                    } if replica_dead(last_heard) => {
                        p.replica = Replica::None;
                    }
                    Replica::Registering {
                        last_heard,
                        ref mut failed,
                        ..
                    } if replica_dead(last_heard) => {
                        *failed = true;
                    }
                    Replica::InSync { last_heard, .. } if replica_dead(last_heard) => {
                        self.drop_replica();
                    }
                    _ => {}
                }
                self.release();
            }
        }
    }

    pub(super) fn drop_replica(&mut self) {
        let epoch = self.epoch;
        let id = self.coord(CoordRequest::SetInSync {
            epoch,
            in_sync: None,
        });
        if let State::Primary(p) = &mut self.state {
            p.replica = Replica::Dropping { coord: Some(id) };
        }
    }

    // ------------------------------------------------------------ coordinator

    pub(super) fn on_coord(&mut self, id: u64, reply: Result<CoordReply, String>) {
        let now = self.now;
        match (&mut self.state, reply) {
            (State::Primary(p), reply) if p.keepalive.is_some_and(|(k, ..)| k == id) => {
                let (_, sent, asked_epoch) = p.keepalive.take().unwrap();
                match reply {
                    Ok(CoordReply::KeepAlive(true)) => {
                        // Counted from when we asked, less the share by
                        // which our clock may run slow against the
                        // coordinator's: we stop before it can think the
                        // lease lapsed.
                        let ttl = self.cfg.lease_ttl;
                        let margin = ttl * self.cfg.clock_drift_permille / 1000;
                        p.lease_until = p.lease_until.max(sent + ttl - margin);
                        self.release();
                    }
                    Ok(CoordReply::KeepAlive(false)) if asked_epoch < self.epoch => {
                        // A renewal that named the epoch before our own
                        // bump (registering or dropping the secondary): the
                        // coordinator refused it for the epoch, not because
                        // someone else leads. Ask again at the current one
                        // (issue 16: stepping down here threw the in-sync
                        // secondary away and served stale reads).
                        let epoch = self.epoch;
                        let id = self.coord(CoordRequest::KeepAlive { epoch });
                        if let State::Primary(p) = &mut self.state {
                            p.keepalive = Some((id, now, epoch));
                        }
                    }
                    Ok(CoordReply::KeepAlive(false)) => self.step_down(),
                    _ => {} // retried on the next beat
                }
            }
            (State::Primary(p), reply) => {
                let (cas_for, was_registering) = match &p.replica {
                    Replica::Registering { coord: Some(c), .. } => (*c, true),
                    Replica::Dropping { coord: Some(c) } => (*c, false),
                    _ => return,
                };
                if cas_for != id {
                    return;
                }
                match reply {
                    Ok(CoordReply::SetInSync(Some(epoch))) => {
                        assert!(epoch > self.epoch, "the coordinator's epochs only grow");
                        self.epoch = epoch;
                        let State::Primary(p) = &mut self.state else {
                            unreachable!()
                        };
                        if was_registering {
                            let Replica::Registering {
                                m,
                                last_heard,
                                failed,
                                ..
                            } = p.replica
                            else {
                                unreachable!()
                            };
                            p.replica = Replica::InSync { m, last_heard };
                            if failed {
                                self.drop_replica();
                            }
                        } else {
                            p.replica = Replica::None;
                        }
                        self.release();
                    }
                    Ok(CoordReply::SetInSync(None)) => self.step_down(),
                    _ => {
                        // Could not reach the coordinator: ask again.
                        let epoch = self.epoch;
                        let in_sync = match &p.replica {
                            Replica::Registering { m, .. } => Some(*m),
                            _ => None,
                        };
                        let nid = self.coord(CoordRequest::SetInSync { epoch, in_sync });
                        if let State::Primary(p) = &mut self.state {
                            match &mut p.replica {
                                Replica::Registering { coord, .. }
                                | Replica::Dropping { coord } => *coord = Some(nid),
                                _ => unreachable!(),
                            }
                        }
                    }
                }
            }
            (State::Secondary { campaign, .. }, reply) if *campaign == Some(id) => {
                *campaign = None;
                match reply {
                    Ok(CoordReply::Campaign(Campaign::Won { epoch, in_sync })) => {
                        self.become_primary(epoch, in_sync)
                    }
                    // Refused with no record at all: an operator's reset
                    // retired this incarnation (`crate::coord`): discard.
                    Ok(CoordReply::Campaign(Campaign::Lost { record: None })) => {
                        self.become_joining(None)
                    }
                    Ok(CoordReply::Campaign(Campaign::Lost { record }))
                        if record.is_none_or(|r| r.epoch >= self.epoch) =>
                    {
                        self.after_lost(record)
                    }
                    _ => {
                        // (A refusal that shows a record older than our
                        // epoch is a late answer: it says nothing of now.)
                        // Unknown outcome (it may have won): ask again; a
                        // campaign by the record's primary wins again, so
                        // the answer settles it.
                        let id = self.coord(CoordRequest::Campaign);
                        if let State::Secondary { campaign, .. } = &mut self.state {
                            *campaign = Some(id);
                        }
                    }
                }
            }
            (State::Joining { asked, .. }, reply) if *asked == Some(id) => {
                *asked = None;
                match reply {
                    Ok(CoordReply::Get(None)) => {
                        let id = self.coord(CoordRequest::Campaign);
                        if let State::Joining { asked, .. } = &mut self.state {
                            *asked = Some(id);
                        }
                    }
                    Ok(CoordReply::Get(Some(r))) => {
                        self.epoch = self.epoch.max(r.epoch);
                        if r.lease_held && r.primary.node != self.cfg.member.node {
                            self.send_join(r.primary.node);
                        } else if r.primary == self.cfg.member && !r.lease_held {
                            // We won the bootstrap campaign but its answer
                            // was lost (a joining incarnation is named
                            // nowhere else: `become_joining` takes a new
                            // one). Nothing was written yet: campaign again.
                            let id = self.coord(CoordRequest::Campaign);
                            if let State::Joining { asked, .. } = &mut self.state {
                                *asked = Some(id);
                            }
                        }
                    }
                    Ok(CoordReply::Campaign(Campaign::Won { epoch, in_sync })) => {
                        // Bootstrap: an empty group starts with this node.
                        self.become_primary(epoch, in_sync);
                    }
                    _ => {}
                }
            }
            (State::Leaving { to, new, asked, .. }, reply) if *asked == Some(id) => {
                *asked = None;
                let (to, new) = (*to, *new);
                match reply {
                    Ok(CoordReply::Retire(true)) => self.rejoin_now(to, new),
                    Ok(CoordReply::Retire(false)) => {
                        // The record names us: keep the data (we may hold
                        // the only full copy) and ask again later, as a
                        // fenced node, which campaigns when it may.
                        self.state = State::Fenced {
                            asked: None,
                            last_try: now,
                        };
                    }
                    _ => {} // retried on a tick
                }
            }
            (State::Fenced { asked, .. }, reply) if *asked == Some(id) => {
                *asked = None;
                match reply {
                    // A late answer (older than what we know): ask again.
                    Ok(CoordReply::Get(Some(r))) if r.epoch < self.epoch => {}
                    Ok(CoordReply::Get(r)) => {
                        // A record naming this node primary with nobody in
                        // sync and no lease (an operator's promotion, or our
                        // own record after dropping the secondary): no other
                        // node may win, so the grace is pointless.
                        let only_us = r.is_some_and(|r| {
                            r.primary == self.cfg.member && r.in_sync.is_none() && !r.lease_held
                        });
                        let newest = r.as_ref().and_then(|r| {
                            self.tell_standing(r);
                            self.newest(r)
                        });
                        let r = r.filter(|r| r.lease_held && r.primary != self.cfg.member);
                        match r {
                            Some(r) => {
                                self.epoch = self.epoch.max(r.epoch);
                                if self.dur.recovered.is_some() {
                                    self.dur.peer_served = Some(r.primary);
                                }
                                self.become_joining(Some(r.primary.node));
                            }
                            // A node back from its log first gives a live
                            // peer the time to take over, leaves the
                            // campaign to a member back from its log with a
                            // newer state, and under `everysec` never
                            // campaigns once it saw a peer serve
                            // (`durable.rs`).
                            None if self.recovery_grace(newest) && !only_us => {}
                            None => {
                                let id = self.coord(CoordRequest::Campaign);
                                self.state = State::Fenced {
                                    asked: Some(id),
                                    last_try: now,
                                };
                            }
                        }
                    }
                    Ok(CoordReply::Campaign(Campaign::Won { epoch, in_sync })) => {
                        self.become_primary(epoch, in_sync)
                    }
                    // Refused with no record at all: an operator's reset
                    // retired this incarnation (`crate::coord`): its data
                    // is given up, and the node starts over.
                    Ok(CoordReply::Campaign(Campaign::Lost { record: None })) => {
                        self.become_joining(None)
                    }
                    Ok(CoordReply::Campaign(Campaign::Lost { record })) => self.after_lost(record),
                    _ => {}
                }
            }
            _ => {}
        }
    }

    /// After a lost campaign: stay secondary if still the in-sync one of a
    /// live primary, otherwise rejoin that primary; wait if nobody leads.
    pub(super) fn after_lost(&mut self, record: Option<GroupRecord>) {
        let Some(r) = record else { return };
        if !r.lease_held || r.epoch < self.epoch {
            return; // retry later (nobody leads, or a late answer)
        }
        let me = self.cfg.member;
        let heard = |last: Micros| self.now.saturating_sub(last) <= self.cfg.heartbeat_timeout;
        match self.state {
            // Still the in-sync secondary of a live primary: keep the epoch
            // of its stream (see `on_message`). Also when that primary still
            // talks to us: it is the authority on whether we are its
            // secondary (the answer may be older than its latest
            // registration of us; if it dropped us it stops talking and we
            // come back here once silent).
            State::Secondary {
                primary,
                last_heard,
                ..
            } if primary == r.primary.node && (r.in_sync == Some(me) || heard(last_heard)) => {}
            _ => {
                self.epoch = self.epoch.max(r.epoch);
                self.become_joining(Some(r.primary.node));
            }
        }
    }
}
