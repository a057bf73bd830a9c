//! A joining node's copy of its primary's image, both sides: the primary
//! answers a `Join` with a session (`SyncStart`: the allocator and the
//! retry table as of a sequence number) and serves the arena's bytes in
//! chunks (the fallback for RDMA Reads of its arena); the joining node
//! buffers the writes forwarded meanwhile, replays them over the copied
//! bytes, rebuilds the image's derived state from them, and says
//! `SyncDone`, after which the primary registers it as in sync.
//!
//! Why the copy ends exactly the primary's image at `through_seq`:
//!
//! * Before `SyncStart` the primary exposes every write it applied
//!   (nobody's acknowledgements are required then, so none of them can be
//!   lost by a failover after a reader saw it), so the bytes lag the
//!   snapshot by no write, and every later write is forwarded, from
//!   `start_seq` on, over the same ordered link.
//! * The bytes are read while writes land, so a chunk may hold any mix of
//!   older and newer bytes; replaying every write from `start_seq` over
//!   them, in order, rewrites whatever a later write touched (objects
//!   whole, index buckets with `Layout::apply_over_copy`, which repairs a
//!   torn bucket), and what no later write touched was read settled.
//! * A gap among the buffered writes (a link broke under them) restarts
//!   the copy: the primary keeps no copying secondary's writes. Only the
//!   newest session is followed, on either side, so chunks and writes of
//!   an abandoned session change nothing.
//! * A copy that stops making progress while the primary still beats is
//!   restarted from a tick (`roles.rs`), and one whose primary falls
//!   silent is abandoned.

use super::image::CopyStartError;
use super::{Addr, Copy, Node, Replica, State};
use crate::alloc::AllocSnapshot;
use crate::arena::Memory;
use crate::proto::{Body, DedupEntry, Member};

impl<M: Memory> Node<M> {
    pub(super) fn on_join(&mut self, from: Addr, member: Member, arena_len: u64) {
        let Addr::Node(n) = from else { return };
        if self.hold_join(from, member, arena_len) {
            return;
        }
        let refuse = |s: &mut Self, reason: &str| {
            s.send(
                from,
                Body::JoinRefused {
                    reason: reason.to_string(),
                },
            )
        };
        if member.node != n || member.node == self.cfg.member.node {
            return refuse(self, "bad member");
        }
        if arena_len != self.cfg.arena.len {
            return refuse(self, "arena size differs");
        }
        let now = self.now;
        let State::Primary(p) = &mut self.state else {
            return refuse(self, "not the primary");
        };
        match p.replica {
            Replica::None => {}
            Replica::Syncing { m, .. } if m.node == n => {}
            Replica::Registering { m, coord: None, .. } if m.node == n && m != member => {
                // It restarted before it was registered: forget it (as
                // when it falls silent) and copy to the new incarnation.
                p.replica = Replica::None;
            }
            Replica::Registering {
                m, ref mut failed, ..
            } if m.node == n && m != member => {
                // Being registered: dropped once the registration is
                // answered; the new incarnation retries its Join.
                *failed = true;
                return refuse(self, "previous incarnation being removed; retry");
            }
            Replica::InSync { m, .. } if m.node == n => {
                // It restarted: drop it from the record first.
                self.drop_replica();
                return refuse(self, "previous incarnation being removed; retry");
            }
            _ => return refuse(self, "another secondary is active"),
        }
        // The copy reads our arena's bytes: put every write in them first.
        // No secondary's acknowledgements are required here (we are alone
        // or copying to this very node), so no other node can take over
        // and lose these writes after a reader saw them.
        let State::Primary(p) = &self.state else {
            unreachable!()
        };
        assert!(!p.replica.acks_required());
        self.image.expose(self.image.applied_seq());
        let start_seq = self.image.applied_seq() + 1;
        self.sessions += 1;
        let session = self.sessions;
        let State::Primary(p) = &mut self.state else {
            unreachable!()
        };
        p.replica = Replica::Syncing {
            m: member,
            last_heard: now,
            session,
        };
        p.replicated_through = 0;
        let alloc = self.image.allocator().snapshot();
        let dedup = self.dedup_table();
        let stag = self.image.arena().stag;
        self.send(
            from,
            Body::SyncStart {
                session,
                start_seq,
                alloc,
                dedup,
                stag,
            },
        );
    }

    pub(super) fn on_sync_start(
        &mut self,
        from: Addr,
        session: u64,
        start_seq: u64,
        alloc: AllocSnapshot,
        dedup: Vec<DedupEntry>,
        stag: u32,
    ) {
        // Accepted from the primary we joined, also while copying or after:
        // the primary restarts a session when it sees a (possibly late,
        // duplicate) Join, and only the newest session's stream is
        // contiguous, so always follow the newest SyncStart.
        let p = match self.state {
            State::Joining {
                join_sent: Some((p, _)),
                ..
            } => p,
            State::Secondary { primary, .. } => primary,
            _ => return,
        };
        if from != Addr::Node(p) || start_seq == 0 {
            return;
        }
        match self.image.begin_copy(start_seq, &alloc, dedup, stag) {
            Ok(()) => {}
            Err(CopyStartError::Malformed) => {
                self.diverged("bad allocator snapshot".into());
                return self.become_joining(None);
            }
            Err(CopyStartError::OtherArena) => return self.become_joining(None),
        }
        self.state = State::Secondary {
            primary: p,
            last_heard: self.now,
            last_beat: self.now,
            registered: false,
            copy: Some(Copy {
                session,
                next_offset: 0,
                outstanding: 0,
                buffered: Vec::new(),
                last_progress: self.now,
            }),
            campaign: None,
        };
        self.request_chunks();
    }

    pub(super) fn request_chunks(&mut self) {
        let (chunk, window, len) = (
            self.cfg.sync_chunk,
            self.cfg.sync_window,
            self.cfg.arena.len,
        );
        let State::Secondary {
            primary,
            copy: Some(c),
            ..
        } = &mut self.state
        else {
            return;
        };
        let primary = *primary;
        let session = c.session;
        let mut reqs = Vec::new();
        while c.outstanding < window && c.next_offset < len {
            let n = (chunk as u64).min(len - c.next_offset) as u32;
            reqs.push((c.next_offset, n));
            c.next_offset += n as u64;
            c.outstanding += 1;
        }
        let done = c.outstanding == 0 && c.next_offset == len;
        for (offset, len) in reqs {
            self.send(
                Addr::Node(primary),
                Body::SyncRequest {
                    session,
                    offset,
                    len,
                },
            );
        }
        if done {
            self.finish_copy();
        }
    }

    pub(super) fn finish_copy(&mut self) {
        let State::Secondary { primary, copy, .. } = &mut self.state else {
            return;
        };
        let primary = *primary;
        let c = copy.take().expect("copying");
        let session = c.session;
        // The arena describes its index (the superblock never changes after
        // the group's first primary wrote it, so the copy holds it whole).
        if let Err(e) = self.image.load_layout() {
            self.diverged(format!("copied arena: {e}"));
            return self.become_joining(Some(primary));
        }
        for (seq, op) in c.buffered {
            if seq > self.image.applied_seq() + 1 {
                // A write forwarded during the copy was lost: the primary
                // does not keep those (it does not wait for a copying
                // secondary), so start the copy over.
                tracing::warn!(
                    expected = self.image.applied_seq() + 1,
                    seen = seq,
                    "a replicated write was lost during the copy; starting over"
                );
                self.lost_replicates += 1;
                return self.become_joining(Some(primary));
            }
            if let Err(e) = self.image.apply(seq, &op, true) {
                self.diverged(e);
                return self.become_joining(Some(primary));
            }
        }
        // The bytes are now exactly the primary's at `applied_seq`: the
        // index's state is rebuilt from them.
        if let Err(e) = self.image.rebuild_index() {
            self.diverged(format!("copied index: {e}"));
            return self.become_joining(Some(primary));
        }
        // So are the pointer API's generations: every allocation past the
        // index's region that no key owns holds an object of it.
        if let Err(e) = self.image.rebuild_unkeyed_gens() {
            self.diverged(format!("copied objects: {e}"));
            return self.become_joining(Some(primary));
        }
        // And the keys' deadlines, which a primary reclaims by.
        if let Err(e) = self.image.rebuild_deadlines() {
            self.diverged(format!("copied deadlines: {e}"));
            return self.become_joining(Some(primary));
        }
        let through_seq = self.image.applied_seq();
        // A new life of the log: this image, then the writes after it. The
        // primary counts on us once we say SyncDone, so under `always` that
        // waits until the snapshot and the log are durable through it.
        self.dur.durable = 0;
        self.begin_life();
        if self.cfg.persist == crate::persist::Policy::Always {
            self.dur.sync_done_held = Some((session, through_seq));
            return;
        }
        self.send(
            Addr::Node(primary),
            Body::SyncDone {
                session,
                through_seq,
            },
        );
    }

    pub(super) fn on_sync_request(&mut self, from: Addr, session: u64, offset: u64, len: u32) {
        let now = self.now;
        let State::Primary(p) = &mut self.state else {
            return;
        };
        let Replica::Syncing { m, session: s, .. } = p.replica else {
            return;
        };
        if Addr::Node(m.node) != from || s != session {
            return;
        }
        p.replica.touch(m.node, now);
        let mut data = vec![0u8; len as usize];
        if self.image.memory().read(offset, &mut data).is_ok() {
            self.send(
                from,
                Body::SyncChunk {
                    session,
                    offset,
                    data,
                },
            );
        }
    }

    pub(super) fn on_sync_chunk(&mut self, from: Addr, session: u64, offset: u64, data: Vec<u8>) {
        let State::Secondary {
            primary,
            last_heard,
            copy: Some(c),
            ..
        } = &mut self.state
        else {
            return;
        };
        if from != Addr::Node(*primary) || session != c.session {
            return; // a chunk of an abandoned session
        }
        *last_heard = self.now;
        c.last_progress = self.now;
        c.outstanding -= 1;
        if self.image.write_chunk(offset, &data).is_err() {
            self.diverged(format!("chunk at {offset} outside the arena"));
            return self.become_joining(None);
        }
        self.request_chunks();
    }

    pub(super) fn on_sync_done(&mut self, from: Addr, session: u64, through_seq: u64) {
        let now = self.now;
        let State::Primary(p) = &mut self.state else {
            return;
        };
        let Replica::Syncing { m, session: s, .. } = p.replica else {
            return;
        };
        if Addr::Node(m.node) != from || s != session || through_seq > self.image.applied_seq() {
            return;
        }
        p.replica = Replica::Registering {
            m,
            last_heard: now,
            coord: None,
            failed: false,
        };
        p.replicated_through = through_seq;
        self.release();
    }
}
