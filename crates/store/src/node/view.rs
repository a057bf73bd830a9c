//! What a node shows of itself: its role, epoch and arena, its status
//! report, and (for tests) its image's parts.

#[cfg(any(test, feature = "testing"))]
use super::Allocator;
#[cfg(any(test, feature = "testing"))]
use super::Meta;
use super::{proto, ArenaRef, DedupEntry, Member, Node, Replica, Role, State, StatusInfo};
use crate::arena::Memory;

impl<M: Memory> Node<M> {
    /// Current role.
    pub fn role(&self) -> Role {
        match self.state {
            State::Joining { .. } => Role::Joining,
            State::Secondary { .. } => Role::Secondary,
            State::Primary(_) => Role::Primary,
            State::Fenced { .. } | State::Leaving { .. } => Role::Fenced,
        }
    }
    /// Current epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }
    /// This node.
    pub fn member(&self) -> Member {
        self.cfg.member
    }
    /// Copies the arena's bytes at `offset` (false: outside it).
    pub fn read_arena(&self, offset: u64, out: &mut [u8]) -> bool {
        self.image.memory().read(offset, out).is_ok()
    }
    /// The arena memory.
    #[cfg(any(test, feature = "testing"))]
    pub fn memory(&self) -> &M {
        self.image.memory()
    }
    /// The allocator.
    #[cfg(any(test, feature = "testing"))]
    pub fn allocator(&self) -> &Allocator {
        self.image.allocator()
    }

    /// The key index's layout, once the node holds a group's data.
    #[cfg(test)]
    pub fn index_layout(&self) -> Option<crate::index::Layout> {
        self.image.layout()
    }

    /// The key index's planning state, once the node holds a group's data.
    #[cfg(any(test, feature = "testing"))]
    pub fn index_meta(&self) -> Option<&Meta> {
        self.image.index_meta()
    }
    /// Highest applied write.
    #[cfg(any(test, feature = "testing"))]
    pub fn applied_seq(&self) -> u64 {
        self.image.applied_seq()
    }
    /// The retry table.
    pub fn dedup_table(&self) -> Vec<DedupEntry> {
        self.image.dedup_table()
    }
    /// Replicated writes a secondary could not apply (always 0 unless there
    /// is a bug; such a secondary rejoins).
    #[cfg(any(test, feature = "testing"))]
    pub fn divergences(&self) -> u64 {
        self.divergences
    }
    /// Why the last divergence happened.
    #[cfg(any(test, feature = "testing"))]
    pub fn last_divergence(&self) -> Option<&str> {
        self.last_divergence.as_deref()
    }

    pub(super) fn diverged(&mut self, why: String) {
        self.divergences += 1;
        self.last_divergence = Some(why);
    }

    /// Forwarded writes this node found missing (a link to its primary
    /// broke and dropped them) and had sent again (or, while copying,
    /// repaired by starting the copy over).
    #[cfg(any(test, feature = "testing"))]
    pub fn lost_replicates(&self) -> u64 {
        self.lost_replicates
    }

    /// The arena (its STag as of the last applied rotation).
    pub fn arena(&self) -> ArenaRef {
        self.image.arena()
    }

    /// Primary with an in-sync secondary.
    pub fn is_redundant(&self) -> bool {
        matches!(&self.state, State::Primary(p) if matches!(p.replica, Replica::InSync { .. }))
    }
    /// Secondary that finished copying.
    #[cfg(any(test, feature = "testing"))]
    pub fn is_synced_secondary(&self) -> bool {
        matches!(self.state, State::Secondary { copy: None, .. })
    }
    /// Primary with no write awaiting acknowledgement (or exposure).
    #[cfg(any(test, feature = "testing"))]
    pub fn is_idle(&self) -> bool {
        match &self.state {
            State::Primary(p) => p.pending.is_empty() && !self.image.has_unexposed(),
            _ => true,
        }
    }
    /// Status report.
    pub fn status(&self) -> StatusInfo {
        let (arena, alloc) = (self.image.arena(), self.image.allocator());
        let u = alloc.usage();
        StatusInfo {
            node: self.cfg.member.node,
            role: match &self.state {
                State::Joining { .. } => proto::ROLE_JOINING,
                State::Secondary {
                    copy: None,
                    registered: true,
                    ..
                } => proto::ROLE_SECONDARY,
                State::Secondary { .. } => proto::ROLE_SYNCING,
                State::Primary(_) => proto::ROLE_PRIMARY,
                State::Fenced { .. } | State::Leaving { .. } => proto::ROLE_FENCED,
            },
            epoch: self.epoch,
            arena_base: arena.base,
            arena_len: arena.len,
            stag: arena.stag,
            allocated: u.allocated,
            // The index's region is an allocation, no object.
            objects: u.allocations - alloc.allocation_at(0).is_some() as u64,
            redundant: self.is_redundant(),
            applied_seq: self.image.applied_seq(),
            keys: self.image.index_meta().map_or(0, |m| m.len() as u64),
            expires: self.image.expires(),
            resp_port: self.cfg.resp_port,
            min_in_sync: self.cfg.min_in_sync,
            persist: self.cfg.persist.code(),
            durable_seq: self.dur.durable,
            incarnation: self.cfg.member.incarnation,
        }
    }
}
