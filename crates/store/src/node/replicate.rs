//! Client requests, and the stream of writes from a primary to its
//! secondary: a write is planned and applied (not yet exposed) by the
//! primary, forwarded with its sequence number, applied and acknowledged
//! by the secondary in sequence order, and answered once committed.
//!
//! Why an acknowledged write survives a failover, and readers see it
//! only once it would: a write is committed when the in-sync secondary
//! acknowledged it (acknowledgements are cumulative, and a secondary
//! applies writes only in order, so it holds every earlier one too), or
//! when the primary alone holds it and the policy (`min_in_sync` 0) and
//! the coordinator's record (no secondary in sync) allow it. Only then do
//! its bytes reach the arena ([`Node::release`] exposes them) and its
//! client's answer go out, in sequence order, and only while the lease
//! holds. A write lost on a broken link shows as a gap in the sequence
//! numbers (in the stream, or against the primary's heartbeat), and the
//! primary sends it again from the writes not yet committed, which it
//! still keeps unexposed; a secondary that asks for committed writes is
//! dropped instead.

use super::{Addr, CoordRequest, Node, Replica, State, Waiter};
use crate::arena::Memory;
use crate::persist::Policy;
use crate::proto::{Body, Effect, NodeId, Op, RepOp, Reply, StoreError};

impl<M: Memory> Node<M> {
    pub(super) fn on_heartbeat(&mut self, from: Addr) {
        let now = self.now;
        match &mut self.state {
            State::Primary(p) => {
                if let Addr::Node(n) = from {
                    p.replica.touch(n, now);
                }
            }
            State::Secondary {
                primary,
                last_heard,
                ..
            } if from == Addr::Node(*primary) => *last_heard = now,
            _ => {}
        }
        if let Addr::Client(_) = from {
            self.send(from, Body::Heartbeat);
        }
    }

    pub(super) fn on_request(&mut self, from: Addr, client: u64, req_id: u64, op: Op) {
        if let Op::Status = op {
            let s = self.status();
            self.send(
                from,
                Body::Response {
                    req_id,
                    result: Ok(Reply::Status(s)),
                },
            );
            return;
        }
        if !matches!(self.state, State::Primary(_)) {
            let primary = self.primary_hint();
            self.send(
                from,
                Body::Response {
                    req_id,
                    result: Err(StoreError::NotPrimary { primary }),
                },
            );
            return;
        }
        if matches!(op, Op::Read { .. } | Op::Get { .. } | Op::Scan { .. }) {
            // A primary whose lease may have run out (cut off from the
            // coordinator, possibly replaced) must not answer reads either.
            if !self.serves_reads(self.now) {
                self.send(
                    from,
                    Body::Response {
                        req_id,
                        result: Err(StoreError::NotPrimary { primary: None }),
                    },
                );
                return;
            }
            let result = match op {
                Op::Read { ptr } => self.image.read(ptr),
                Op::Get { key } => self.image.get_key(&key),
                Op::Scan {
                    cursor,
                    count,
                    pattern,
                } => self.image.scan(cursor, count, &pattern),
                _ => unreachable!(),
            };
            self.send(from, Body::Response { req_id, result });
            return;
        }
        // A retry of a write already applied: answer as before, once that
        // write is safe.
        if let Some(e) = self.image.dedup_entry(client) {
            if e.req_id == req_id {
                let (seq, reply) = (e.seq, e.reply.clone());
                self.add_waiter(seq, from, req_id, Ok(reply));
                self.release();
                return;
            }
            if e.req_id > req_id {
                return; // an old duplicate; the client has moved on
            }
        }
        // A snapshot or a copy waits for a quiet moment: new writes wait
        // for it (`durable.rs`).
        let Some(op) = self.hold_write(from, client, req_id, op) else {
            return;
        };
        if !self.may_accept_writes() {
            return self.send(
                from,
                Body::Response {
                    req_id,
                    result: Err(StoreError::NotEnoughReplicas),
                },
            );
        }
        match self.image.plan_write(&op) {
            Err(e) => self.send(
                from,
                Body::Response {
                    req_id,
                    result: Err(e),
                },
            ),
            Ok((effects, reply)) => {
                let State::Primary(p) = &mut self.state else {
                    unreachable!()
                };
                let seq = p.next_seq;
                p.next_seq += 1;
                let rep = RepOp {
                    client,
                    req_id,
                    effects,
                    reply: reply.clone(),
                };
                // The bytes reach the arena (and one-sided readers) when
                // the write commits (`release`); the log has it at once.
                self.log_write(seq, &rep);
                self.image
                    .stage(seq, rep.clone())
                    .expect("a planned write applies");
                let State::Primary(p) = &self.state else {
                    unreachable!()
                };
                if let Some(n) = p.replica.node() {
                    self.send(Addr::Node(n), Body::Replicate { seq, op: rep });
                }
                self.add_waiter(seq, from, req_id, Ok(reply));
                self.release();
            }
        }
    }

    pub(super) fn add_waiter(
        &mut self,
        seq: u64,
        to: Addr,
        req_id: u64,
        result: Result<Reply, StoreError>,
    ) {
        let State::Primary(p) = &mut self.state else {
            unreachable!()
        };
        p.pending
            .entry(seq)
            .or_default()
            .push(Waiter { to, req_id, result });
    }

    /// Sends the responses that may go now, in sequence order.
    pub(super) fn release(&mut self) {
        let now = self.now;
        let State::Primary(p) = &mut self.state else {
            return;
        };
        if now >= p.lease_until {
            return; // lease possibly lost: acknowledge nothing
        }
        // Committed: held by the in-sync secondary, or by us alone where
        // the policy allows it (with min_in_sync 1 a write waits for a
        // secondary to be in sync again).
        let committed = if p.replica.acks_required() {
            p.replicated_through
        } else if self.cfg.min_in_sync == 0 {
            self.image.applied_seq()
        } else {
            0
        };
        // Under `always` committed also means durable here.
        let committed = if self.cfg.persist == Policy::Always {
            committed.min(self.dur.durable)
        } else {
            committed
        };
        let committed = committed.max(p.max_released);
        self.image.expose(committed);
        let State::Primary(p) = &mut self.state else {
            unreachable!()
        };
        let mut sends = Vec::new();
        while let Some(entry) = p.pending.first_entry() {
            let seq = *entry.key();
            if seq > committed {
                break;
            }
            for w in entry.remove() {
                sends.push((w.to, w.req_id, w.result));
            }
            p.max_released = p.max_released.max(seq);
        }
        for (to, req_id, result) in sends {
            self.send(to, Body::Response { req_id, result });
        }
        self.maybe_register();
    }

    /// Registers a caught-up secondary once it holds every released write.
    pub(super) fn maybe_register(&mut self) {
        let State::Primary(p) = &mut self.state else {
            return;
        };
        if let Replica::Registering {
            m,
            coord: None,
            failed: false,
            ..
        } = p.replica
        {
            if p.replicated_through >= p.max_released {
                let epoch = self.epoch;
                let id = self.coord(CoordRequest::SetInSync {
                    epoch,
                    in_sync: Some(m),
                });
                if let State::Primary(p) = &mut self.state {
                    if let Replica::Registering { coord, .. } = &mut p.replica {
                        *coord = Some(id);
                    }
                }
            }
        }
    }

    pub(super) fn on_replicate(&mut self, from: Addr, seq: u64, op: RepOp) {
        let State::Secondary {
            primary,
            last_heard,
            copy,
            ..
        } = &mut self.state
        else {
            return;
        };
        if from != Addr::Node(*primary) {
            return;
        }
        *last_heard = self.now;
        if let Some(c) = copy {
            c.buffered.push((seq, op));
            return;
        }
        let primary = *primary;
        if seq > self.image.applied_seq() + 1 {
            return self.lost_replicate(primary, self.image.applied_seq() + 1, seq);
        }
        if seq <= self.image.applied_seq() {
            // Sent again after a `Resend` while the original was still on
            // its way: applied already.
            let seq = self.acked_through();
            return self.send(Addr::Node(primary), Body::ReplicateAck { seq });
        }
        // Acknowledged once planned against the allocator and the index
        // (every check made); its bytes reach the arena when the node
        // settles, right after the acknowledgement is sent and before any
        // other input (`Node::settle`).
        self.settle();
        let bytes = op
            .effects
            .iter()
            .map(|e| match e {
                Effect::Write { data, .. } => data.len(),
                _ => 0,
            })
            .sum();
        self.log_write(seq, &op);
        match self.image.stage(seq, op) {
            Ok(()) => {
                self.unsettled = Some((seq, bytes));
                // Under `always` (or while the log is pressed) the
                // acknowledgement waits for the flush (`Node::on_durable`).
                if !self.acks_wait_for_log() {
                    self.send(Addr::Node(primary), Body::ReplicateAck { seq })
                }
            }
            Err(e) => {
                self.diverged(e);
                self.become_joining(Some(primary));
            }
        }
    }

    /// The primary's heartbeat says it has forwarded writes through `seq`.
    /// Its messages reach us in order, so having applied less means a
    /// `Replicate` was lost with a broken link: resynchronise now rather
    /// than when the next write shows the gap (there may be none, and the
    /// lost write's client would wait for an ack that never comes).
    pub(super) fn on_replicate_head(&mut self, from: Addr, seq: u64, in_sync: bool) {
        let State::Secondary {
            primary,
            copy: None,
            ref mut registered,
            ..
        } = self.state
        else {
            return;
        };
        if from != Addr::Node(primary) {
            return;
        }
        *registered = in_sync;
        if seq <= self.image.applied_seq() {
            return;
        }
        self.lost_replicate(primary, self.image.applied_seq() + 1, seq);
    }

    /// Our secondary lost forwarded writes from `first` on: send them again
    /// from the writes it has not acknowledged (kept unexposed while its
    /// acknowledgements are required). A secondary whose acknowledgements
    /// are not required is copying: it starts over by itself.
    pub(super) fn on_resend(&mut self, from: Addr, first: u64) {
        let State::Primary(p) = &self.state else {
            return;
        };
        let Addr::Node(n) = from else { return };
        if p.replica.node() != Some(n) || !p.replica.acks_required() {
            return;
        }
        let covered = first > self.image.applied_seq()
            || self.image.first_unexposed().is_some_and(|f| f <= first);
        if !covered {
            // It lacks writes released already: not a replica we can
            // trust. An in-sync one acknowledged them (it diverged); one
            // done copying and not yet registered lost a write forwarded
            // while it copied (released then without its ack) and would
            // ask for it forever, holding every later write's
            // acknowledgement (sim seed 15, one client, 3% of Replicates
            // lost): it starts over with a new copy once dropped (it hears
            // no more from us, as any dropped secondary).
            tracing::warn!(first, "secondary asks for released writes; dropping it");
            if let State::Primary(p) = &mut self.state {
                match &mut p.replica {
                    Replica::InSync { .. } => return self.drop_replica(),
                    Replica::Registering { coord: None, .. } => {
                        p.replica = Replica::None;
                        self.release();
                    }
                    // (The registration's answer drops it: `roles.rs`.)
                    Replica::Registering { failed, .. } => *failed = true,
                    _ => {}
                }
            }
            return;
        }
        for (seq, op) in self.image.unexposed_from(first) {
            self.send(from, Body::Replicate { seq, op });
        }
    }

    pub(super) fn on_replicate_ack(&mut self, from: Addr, seq: u64) {
        let now = self.now;
        let State::Primary(p) = &mut self.state else {
            return;
        };
        let Addr::Node(n) = from else { return };
        if p.replica.node() != Some(n) || seq > self.image.applied_seq() {
            return;
        }
        p.replica.touch(n, now);
        p.replicated_through = p.replicated_through.max(seq);
        self.release();
    }

    /// A forwarded write never arrived (a link broke under it): ask the
    /// primary to send it again, from `expected` on. The primary holds
    /// every write we have not acknowledged, so we keep our copy (and our
    /// place as the in-sync member: throwing it away for a full copy left
    /// a window in which the group had no member able to take over). Not a
    /// divergence: links may drop messages when they break, and the
    /// sequence numbers exist to notice. Asked again after a heartbeat
    /// interval while the gap stays.
    pub(super) fn lost_replicate(&mut self, primary: NodeId, expected: u64, seen: u64) {
        let now = self.now;
        if self.resend_asked.is_some_and(|(f, at)| {
            f == expected && now.saturating_sub(at) < self.cfg.heartbeat_interval
        }) {
            return;
        }
        if self.resend_asked.is_none_or(|(f, _)| f != expected) {
            tracing::warn!(
                expected,
                seen,
                "a replicated write from the primary was lost; asking for it again"
            );
            self.lost_replicates += 1;
        }
        self.resend_asked = Some((expected, now));
        self.send(Addr::Node(primary), Body::Resend { from: expected });
    }
}
