//! The node's side of persistence (issue 33): what it asks its log to
//! hold, what it waits for, and how a node comes back from its log.
//!
//! * **Logging.** With a policy other than `off`, a primary hands each
//!   write to its log as it stages it, and a secondary as it applies it
//!   ([`Output::Log`] of an [`Entry::Write`]); the runtime appends, commits
//!   in groups, and reports the log durable through some write
//!   ([`Input::Durable`]).
//! * **Lives.** A log continues one image: it starts with a base
//!   ([`Entry::Base`], the allocator and the retry table as of write S)
//!   after which the runtime writes a snapshot of the arena, taken while
//!   writes go on, exactly as a joining node copies its primary's arena.
//!   A node starts a life when it gets an image: the group's first
//!   primary once it formats the arena, a secondary once its copy is done.
//!   A recovered node continues its life. A life belongs to one
//!   incarnation (a rejoin takes a new one), so a report about an older
//!   life is ignored. A later base (the log wants a snapshot to release
//!   its ring, [`Input::SnapshotDue`]) starts a snapshot within the life.
//! * **A quiet moment.** A base is the image's state as of its write S,
//!   and the arena's bytes must hold every write through S before the
//!   snapshot reads them; so a base is taken when every applied write is
//!   in the arena. A primary makes such a moment by holding new writes
//!   while its staged ones commit (one round of replication and one
//!   flush), then takes the base and serves the held writes in order.
//!   Under `always` a primary's copy for a joining node waits (holding
//!   new writes too) until its log holds every applied write: the copy
//!   exposes them all, and under `always` only durable writes may be
//!   exposed. (Writes a lost secondary never acknowledged stay unexposed
//!   under `min_in_sync` 1 until a copy begins, so the arena may never be
//!   quiet before it.) A write the policy refuses now is refused at once,
//!   never held.
//! * **`always`.** A primary commits (exposes and answers) a write only
//!   once its own log holds it durably and its in-sync secondary has
//!   acknowledged it, which that secondary does only once its own log
//!   holds it durably (and says `SyncDone` only once its new life's
//!   snapshot is durable). So every acknowledged write is in both logs,
//!   and the two flushes run at once.
//! * **Recovery** ([`Recovering`]): the base's allocator and retry table,
//!   the snapshot's bytes, then the logged writes replayed over them, as a
//!   copy's buffered writes are, and the derived state rebuilt. The node
//!   resumes its incarnation and epoch as a fenced node: it asks the
//!   coordinator, campaigns if the record names it (the record's primary
//!   and in-sync member hold every acknowledged write), and otherwise
//!   rejoins the group's primary.

use std::collections::VecDeque;

use super::{Addr, Node, NodeConfig, Output, State};
use crate::arena::Memory;
use crate::coord::GroupRecord;
use crate::persist::entry::{Base, Entry};
use crate::persist::Policy;
use crate::proto::{Body, Member, Op, RepOp, StoreError};

/// A write request held until a quiet moment.
#[derive(Debug, Clone)]
pub(super) struct Held {
    from: Addr,
    client: u64,
    req_id: u64,
    op: Op,
}

/// The log's state as the node sees it.
#[derive(Debug, Default)]
pub(super) struct Durability {
    /// The log is durable through this write (in this life).
    pub(super) durable: u64,
    /// A snapshot was asked for and no base taken since.
    pub(super) snapshot_due: bool,
    /// Write requests held until the quiet moment.
    held: VecDeque<Held>,
    /// A Join held until the quiet moment (`always`).
    join_held: Option<(Addr, Member, u64)>,
    /// A copy's `SyncDone` held until it is durable (`always`).
    pub(super) sync_done_held: Option<(u64, u64)>,
    /// Back from the log, holding what the log held: since when (the
    /// first input; 0 before it). Cleared once primary or rejoining.
    pub(super) recovered: Option<super::Micros>,
    /// Back from the log, it saw this peer hold the lease since.
    pub(super) peer_served: Option<Member>,
    /// Back from the log: how long it was already silent when its clock
    /// started (down, then loading its partition).
    pub(super) silent_for: super::Micros,
    /// Writes wait in memory for room in the log ([`Input::LogPressure`]).
    pub(super) pressed: bool,
    /// Back from the log: how new its state is, `(epoch, last write)`
    /// ([`Body::Standing`]).
    pub(super) standing: Option<(u64, u64)>,
    /// What other members back from their logs said of theirs, and when.
    heard: Vec<Heard>,
}

/// A [`Body::Standing`] heard.
#[derive(Debug, Clone, Copy)]
struct Heard {
    member: Member,
    standing: (u64, u64),
    /// Still loading its snapshot: not waited for unless strictly newer.
    loading: bool,
    at: super::Micros,
}

/// The order of the election of the newest: the newer `(epoch, seq)`,
/// then the lower node id.
fn rank(node: u32, (epoch, seq): (u64, u64)) -> (u64, u64, std::cmp::Reverse<u32>) {
    (epoch, seq, std::cmp::Reverse(node))
}

impl<M: Memory> Node<M> {
    /// Hands write `seq` to the log (if the policy logs).
    pub(super) fn log_write(&mut self, seq: u64, op: &RepOp) {
        if self.cfg.persist.logs() {
            self.out.push(Output::Log(Entry::Write {
                epoch: self.epoch,
                seq,
                op: op.clone(),
            }));
        }
    }

    /// Starts a life of the log (or a snapshot within one): a base as of
    /// the last applied write, which the arena holds.
    pub(super) fn begin_life(&mut self) {
        if !self.cfg.persist.logs() {
            return;
        }
        assert!(
            !self.image.has_unexposed(),
            "a base needs every applied write in the arena"
        );
        self.dur.snapshot_due = false;
        let base = self.base();
        self.out.push(Output::Log(Entry::Base(base)));
    }

    /// The image's base as of its last applied write.
    pub(super) fn base(&self) -> Base {
        Base {
            epoch: self.epoch,
            seq: self.image.applied_seq(),
            incarnation: self.cfg.member.incarnation,
            alloc: self.image.allocator().snapshot(),
            dedup: self.image.dedup_table(),
            stag: self.image.arena().stag,
        }
    }

    /// What a secondary may acknowledge: every applied write, or under
    /// `always` (or while its log is pressed) every durable one.
    pub(super) fn acked_through(&self) -> u64 {
        let applied = self.image.applied_seq();
        if self.acks_wait_for_log() {
            applied.min(self.dur.durable)
        } else {
            applied
        }
    }

    /// Whether a secondary's acknowledgements wait for its log: always
    /// under `always`; under `everysec` while writes wait in memory for
    /// room in its ring. Acknowledging them at once let the primary's
    /// clients go on writing while the ring had no room; every allocation
    /// grew the next base, which then did not fit (`log full: 6619912
    /// bytes needed, 3019192 free`, filling a 1 GiB arena).
    pub(super) fn acks_wait_for_log(&self) -> bool {
        self.cfg.persist == Policy::Always || self.dur.pressed
    }

    /// The log's ring has room again, or no longer ([`Input::LogPressure`]).
    /// A secondary relieved acknowledges what it applied meanwhile; a
    /// primary relieved serves the requests it held (`barrier`).
    pub(super) fn on_log_pressure(&mut self, on: bool) {
        let was = std::mem::replace(&mut self.dur.pressed, on && self.cfg.persist.logs());
        if was && !self.dur.pressed {
            if let State::Secondary {
                primary,
                copy: None,
                ..
            } = self.state
            {
                let seq = self.acked_through();
                self.send(Addr::Node(primary), Body::ReplicateAck { seq });
            }
        }
    }

    pub(super) fn on_durable(&mut self, incarnation: u64, seq: u64) {
        if incarnation != self.cfg.member.incarnation || !self.holds_data() {
            return; // a report about a life before a rejoin
        }
        self.dur.durable = self.dur.durable.max(seq);
        if !self.acks_wait_for_log() {
            return;
        }
        match self.state {
            State::Primary(_) => self.release(),
            State::Secondary {
                primary,
                copy: None,
                ..
            } => {
                if let Some((session, through_seq)) = self.dur.sync_done_held {
                    if self.dur.durable < through_seq {
                        return;
                    }
                    self.dur.sync_done_held = None;
                    self.send(
                        Addr::Node(primary),
                        Body::SyncDone {
                            session,
                            through_seq,
                        },
                    );
                }
                let seq = self.acked_through();
                self.send(Addr::Node(primary), Body::ReplicateAck { seq });
            }
            _ => {}
        }
    }

    /// Whether a node back from its log still waits before it campaigns:
    /// for a heartbeat timeout and two leases of silence, time enough for
    /// a live peer (which may hold writes the log lost) to notice the
    /// silence and take over. The silence began when the node went down,
    /// before its process started: the time it was down and loading
    /// counts (`Recovering::finish`), so a group restarted whole, whose
    /// loading took longer than the grace, campaigns at once (it waited
    /// 0.9 s more with a 1 GiB arena, half its recovery time). A node that campaigned first would
    /// win (the record names it) and, under `everysec`, lose what its peer
    /// still holds; under `always` it would lose nothing, but its peer
    /// would have to copy.
    ///
    /// Under `everysec` a node back from its log that saw its peer serve
    /// since never campaigns: the record may still name it (as the
    /// in-sync member) until the primary drops it, but its log may lack
    /// writes it acknowledged, so it is no longer what the record says.
    /// It waits to be dropped and rejoins; if the primary dies first, the
    /// group waits for an operator (`store promote`), as it must: the
    /// primary held writes no other live node holds.
    ///
    /// `newest` ([`Node::newest`]) elects the newest of the members back
    /// from their logs: one that heard a newer member waits for it; one
    /// that heard every other member older campaigns at once. Under
    /// `everysec`, where the newer state loses less, a node that heard
    /// nothing yet also waits for the grace counted from its own start
    /// (not from its death): its peer may still be loading.
    pub(super) fn recovery_grace(&self, newest: Option<bool>) -> bool {
        let grace = self.cfg.heartbeat_timeout + 2 * self.cfg.lease_ttl;
        let Some(since) = self.dur.recovered else {
            return false;
        };
        if self.never_campaigns() {
            return true;
        }
        let up = self.now.saturating_sub(since);
        match newest {
            Some(this_is_newest) => !this_is_newest,
            None => {
                up + self.dur.silent_for < grace
                    || (self.cfg.persist == Policy::Everysec && up < grace)
            }
        }
    }

    /// A node back from its log, looking at its group's record `r`: tells
    /// the other members `r` names how new its state is.
    pub(super) fn tell_standing(&mut self, r: &GroupRecord) {
        let (Some(_), Some((epoch, seq))) = (self.dur.recovered, self.dur.standing) else {
            return;
        };
        let me = self.cfg.member;
        let campaigns = !self.never_campaigns();
        for m in [Some(r.primary), r.in_sync].into_iter().flatten() {
            if m.node != me.node {
                self.send(
                    Addr::Node(m.node),
                    Body::Standing {
                        member: me,
                        epoch,
                        seq,
                        campaigns,
                        loading: false,
                    },
                );
            }
        }
    }

    /// A member back from its log says how new its state is.
    /// (One that never campaigns, `everysec`'s rule below, is not waited
    /// for: it would wait for this one, forever.)
    ///
    /// The lease holder that kept this node from campaigning (`everysec`)
    /// saying it is back from its log means the lease seen was its last
    /// life's (both died together, and the lease outlived them), or that it
    /// served and died since, at a newer epoch (dropping this node from
    /// sync took one) or further on the same stream: either way what it
    /// holds is now just a state to compare, and the newest wins.
    ///
    /// One still `loading` its snapshot (`net/herald.rs`) is waited for
    /// only if its state is strictly newer: with the same state, the node
    /// already loaded campaigns (the lower node id breaks the tie only
    /// between nodes that are both ready; waiting for a loading peer's
    /// equal state bought nothing and cost its whole load).
    pub(super) fn on_standing(
        &mut self,
        member: Member,
        standing: (u64, u64),
        campaigns: bool,
        loading: bool,
    ) {
        let at = self.now;
        if self.dur.peer_served == Some(member) {
            self.dur.peer_served = None;
        }
        self.dur.heard.retain(|h| h.member.node != member.node);
        let standing = if campaigns { standing } else { (0, 0) };
        self.dur.heard.push(Heard {
            member,
            standing,
            loading,
            at,
        });
    }

    /// `everysec`'s rule: a node back from its log that saw its peer hold
    /// the lease since never campaigns ([`Node::recovery_grace`]).
    fn never_campaigns(&self) -> bool {
        self.cfg.persist != Policy::Always && self.dur.peer_served.is_some()
    }

    /// The election of the newest, for a node back from its log that may
    /// campaign under record `r`: `Some(false)` if another member `r`
    /// names, back from its log too and heard within a heartbeat timeout,
    /// holds a newer state (it campaigns; this node waits, then copies
    /// from it), or, still loading its snapshot, a strictly newer one;
    /// `Some(true)` if every other member `r` names was heard so and holds
    /// an older one, or is loading the same (none of them is a live node
    /// whose memory may hold more: no grace is due to them); `None`
    /// otherwise.
    pub(super) fn newest(&self, r: &GroupRecord) -> Option<bool> {
        self.dur.recovered?;
        let ours = self.dur.standing?;
        let mine = rank(self.cfg.member.node, ours);
        let fresh = |h: &&Heard| self.now.saturating_sub(h.at) <= self.cfg.heartbeat_timeout;
        let mut all_older = true;
        for m in [Some(r.primary), r.in_sync].into_iter().flatten() {
            if m.node == self.cfg.member.node {
                continue;
            }
            match self.dur.heard.iter().filter(fresh).find(|h| h.member == m) {
                Some(h) if h.loading && h.standing > ours => return Some(false),
                Some(h) if !h.loading && rank(m.node, h.standing) > mine => return Some(false),
                Some(_) => {}
                None => all_older = false,
            }
        }
        all_older.then_some(true)
    }

    /// Whether the node holds an image (a primary, a secondary done
    /// copying, a fenced node).
    fn holds_data(&self) -> bool {
        match self.state {
            State::Primary(_) | State::Fenced { .. } => true,
            State::Secondary { ref copy, .. } => copy.is_none(),
            State::Joining { .. } | State::Leaving { .. } => false,
        }
    }

    /// Whether a primary holds new write requests: while it makes a quiet
    /// moment (for a base or a held Join), and while its log is pressed
    /// (what it would accept now would wait in memory, and grow the next
    /// base, until a snapshot releases the ring).
    fn draining(&self) -> bool {
        matches!(self.state, State::Primary(_))
            && (self.dur.snapshot_due || self.dur.join_held.is_some() || self.dur.pressed)
    }

    /// Every applied write is in the arena.
    fn quiet(&self) -> bool {
        !self.image.has_unexposed() && self.unsettled.is_none()
    }

    /// A write request, unless it is held for the quiet moment (one the
    /// policy refuses now is refused at once instead).
    pub(super) fn hold_write(
        &mut self,
        from: Addr,
        client: u64,
        req_id: u64,
        op: Op,
    ) -> Option<Op> {
        if !self.draining() || !self.may_accept_writes() {
            return Some(op);
        }
        self.dur.held.push_back(Held {
            from,
            client,
            req_id,
            op,
        });
        None
    }

    /// Whether a Join waits (under `always`) until the log holds every
    /// applied write: the copy exposes them all, and only durable writes
    /// may be exposed. (Not until the arena is quiet: with `min_in_sync`
    /// 1, writes its lost secondary never acknowledged stay unexposed
    /// until a copy begins, so that moment would never come.) New writes
    /// are held meanwhile, so the log catches up.
    pub(super) fn hold_join(&mut self, from: Addr, member: Member, arena_len: u64) -> bool {
        if !self.join_waits() {
            return false;
        }
        self.dur.join_held = Some((from, member, arena_len));
        true
    }

    fn join_waits(&self) -> bool {
        self.cfg.persist == Policy::Always
            && matches!(self.state, State::Primary(_))
            && self.dur.durable < self.image.applied_seq()
    }

    /// After every input: take the base, or answer the Join, that waits
    /// for a quiet moment once it comes, then serve the writes held for
    /// it; a node that is no longer primary refuses them.
    pub(super) fn barrier(&mut self) {
        if !matches!(self.state, State::Primary(_)) {
            self.dur.join_held = None;
            for h in std::mem::take(&mut self.dur.held) {
                let primary = self.primary_hint();
                self.send(
                    h.from,
                    Body::Response {
                        req_id: h.req_id,
                        result: Err(StoreError::NotPrimary { primary }),
                    },
                );
            }
        }
        if self.dur.join_held.is_some() && !self.join_waits() {
            let (from, member, arena_len) = self.dur.join_held.take().expect("held");
            self.on_join(from, member, arena_len);
        }
        if self.dur.snapshot_due && self.holds_data() && self.quiet() {
            self.begin_life();
        }
        while !self.draining() {
            let Some(h) = self.dur.held.pop_front() else {
                break;
            };
            self.on_request(h.from, h.client, h.req_id, h.op);
        }
    }
}

/// A node coming back from its log: the base, the snapshot's bytes, then
/// the logged writes, in order.
pub struct Recovering<M: Memory> {
    node: Node<M>,
    layout_loaded: bool,
}

impl<M: Memory> Recovering<M> {
    /// Starts from `base` (its incarnation becomes the node's).
    pub fn new(mut cfg: NodeConfig, mem: M, base: &Base) -> Result<Recovering<M>, String> {
        cfg.member.incarnation = base.incarnation;
        let mut node = Node::new(cfg, mem);
        node.image
            .begin_copy(base.seq + 1, &base.alloc, base.dedup.clone(), base.stag)
            .map_err(|e| format!("the log's base does not fit this arena: {e:?}"))?;
        node.epoch = base.epoch;
        Ok(Recovering {
            node,
            layout_loaded: false,
        })
    }

    /// The snapshot's bytes at `offset` (all of them before any write).
    pub fn snapshot(&mut self, offset: u64, bytes: &[u8]) -> Result<(), String> {
        assert!(!self.layout_loaded, "the snapshot comes before the writes");
        self.node.image.write_chunk(offset, bytes)
    }

    /// The next logged entry: a write replays over the snapshot; a later
    /// base (a snapshot taken within the life) changes nothing.
    pub fn replay(&mut self, e: &Entry) -> Result<(), String> {
        let Entry::Write { epoch, seq, op } = e else {
            return Ok(());
        };
        if !self.layout_loaded {
            self.node
                .image
                .load_layout()
                .map_err(|e| format!("snapshot: {e}"))?;
            self.layout_loaded = true;
        }
        let expected = self.node.image.applied_seq() + 1;
        if *seq != expected {
            return Err(format!(
                "the log jumps from write {} to {seq}",
                expected - 1
            ));
        }
        self.node.epoch = self.node.epoch.max(*epoch);
        self.node.image.apply(*seq, op, true)
    }

    /// The `(epoch, last write)` a node recovering from `base` and the
    /// logged `entries` will stand at ([`Body::Standing`]): known from the
    /// log's scan, before the snapshot is loaded (`net/herald.rs` says it
    /// meanwhile). [`Recovering::finish`] finds the same.
    pub fn standing_of(base: &Base, entries: &[Entry]) -> (u64, u64) {
        entries
            .iter()
            .fold((base.epoch, base.seq), |(epoch, seq), e| match e {
                Entry::Write {
                    epoch: e, seq: s, ..
                } => (epoch.max(*e), *s),
                _ => (epoch, seq),
            })
    }

    /// The last write replayed.
    pub fn seq(&self) -> u64 {
        self.node.image.applied_seq()
    }

    /// The recovered node: a fenced node of its old incarnation and epoch,
    /// holding exactly the logged writes, all of them durable.
    /// `silent_for`: how long before its clock starts (its first input)
    /// the node last spoke to anyone, at least: its process's start (at
    /// most its death) to its clock's start.
    pub fn finish(mut self, silent_for: super::Micros) -> Result<Node<M>, String> {
        let n = &mut self.node;
        if !self.layout_loaded {
            n.image
                .load_layout()
                .map_err(|e| format!("snapshot: {e}"))?;
        }
        n.image.rebuild_index().map_err(|e| format!("index: {e}"))?;
        n.image
            .rebuild_unkeyed_gens()
            .map_err(|e| format!("objects: {e}"))?;
        n.image
            .rebuild_deadlines()
            .map_err(|e| format!("deadlines: {e}"))?;
        n.dur.durable = n.image.applied_seq();
        n.dur.standing = Some((n.epoch, n.image.applied_seq()));
        n.dur.recovered = Some(0);
        n.dur.silent_for = silent_for;
        n.state = State::Fenced {
            asked: None,
            last_try: 0,
        };
        Ok(self.node)
    }
}
