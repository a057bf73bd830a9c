//! Planning an [`Op::Batch`]: keyed writes decided in order, each seeing
//! the ones before it, and replicated as one write.
//!
//! Each write is planned by the ordinary planner ([`Image::plan`]) and its
//! effects are then applied to what the planner reads (the allocator, the
//! key index's state, and for values the batch's own object writes), so
//! the next write finds the space taken, the slot used, the value changed.
//! When the batch is planned, every one of those changes is taken back,
//! last first, exactly (`Allocator::undo_alloc`, `Meta::undo`): the image
//! is as it was, and the batch's concatenated effects are then staged and
//! replicated as one write like any other, whose `apply_meta` makes the
//! same changes again on every node. Nothing of a batch that fails (a
//! store error part-way, a failed condition under `all_or_none`, a
//! replicated write larger than a frame) is left anywhere.

use super::*;
use crate::index::MetaUndo;
use crate::proto::{MAX_BATCH_BYTES, MAX_BATCH_OPS};

/// One change made while planning a batch, to take back.
enum Undo {
    Alloc { offset: u64, freed: Vec<u64> },
    Free { offset: u64, len: u64 },
    Index(MetaUndo),
    Write,
}

impl<M: Memory> Image<M> {
    /// A write's effects and reply, planned as the next write; a batch
    /// through [`Image::plan_batch`].
    pub(in crate::node) fn plan_write(
        &mut self,
        op: &Op,
    ) -> Result<(Vec<Effect>, Reply), StoreError> {
        match op {
            Op::Batch { ops, all_or_none } => self.plan_batch(ops, *all_or_none),
            op => self.plan(op),
        }
    }

    /// Plans `ops` in order as one write (see the module's doc). With
    /// `all_or_none`, a write answered [`Reply::NotStored`] makes it a
    /// write without effects, answered with the replies up to it.
    pub(in crate::node) fn plan_batch(
        &mut self,
        ops: &[Op],
        all_or_none: bool,
    ) -> Result<(Vec<Effect>, Reply), StoreError> {
        let too_large = |len: usize| StoreError::BatchTooLarge {
            ops: ops.len() as u64,
            len: len as u64,
            max: MAX_BATCH_BYTES as u64,
        };
        let keyed = |op: &Op| matches!(op, Op::Put { .. } | Op::Remove { .. } | Op::Modify { .. });
        if ops.len() > MAX_BATCH_OPS || !ops.iter().all(keyed) {
            return Err(too_large(0));
        }
        let mut journal = Vec::new();
        let planned = self.plan_each(ops, all_or_none, &mut journal);
        self.take_back(journal);
        let (effects, replies) = planned?;
        // What is replicated must fit one frame (the envelope's few bytes
        // aside); measured as encoded.
        let env = crate::proto::Envelope {
            epoch: 0,
            body: crate::proto::Body::Replicate {
                seq: 0,
                op: RepOp {
                    client: 0,
                    req_id: 0,
                    effects,
                    reply: Reply::Batch(replies),
                },
            },
        };
        let len = crate::proto::encode(&env).len();
        if len > MAX_BATCH_BYTES {
            return Err(too_large(len));
        }
        let crate::proto::Body::Replicate { op, .. } = env.body else {
            unreachable!("built above")
        };
        Ok((op.effects, op.reply))
    }

    /// Plans each write and applies its effects to the planner's state,
    /// recording how to take them back in `journal`.
    fn plan_each(
        &mut self,
        ops: &[Op],
        all_or_none: bool,
        journal: &mut Vec<Undo>,
    ) -> Result<(Vec<Effect>, Vec<Reply>), StoreError> {
        let (mut effects, mut replies) = (Vec::new(), Vec::new());
        for op in ops {
            let (e, reply) = self.plan(op)?;
            self.apply_planned(&e, journal)?;
            let failed = matches!(reply, Reply::NotStored);
            let changed = matches!(reply, Reply::Changed);
            effects.extend(e);
            replies.push(reply);
            if (all_or_none && failed) || changed {
                return Ok((Vec::new(), replies));
            }
        }
        Ok((effects, replies))
    }

    /// A planned write's effects on the allocator, the key index's state
    /// and the batch's writes (what the planner reads).
    fn apply_planned(
        &mut self,
        effects: &[Effect],
        journal: &mut Vec<Undo>,
    ) -> Result<(), StoreError> {
        let fail = |e: String| StoreError::Other(format!("planning a batch: {e}"));
        for e in effects {
            match e {
                Effect::Alloc { offset, len } => {
                    let freed = self.alloc.freed_in(*offset, *len);
                    self.alloc
                        .alloc_at(*offset, *len)
                        .map_err(|e| fail(e.to_string()))?;
                    journal.push(Undo::Alloc {
                        offset: *offset,
                        freed,
                    });
                }
                Effect::Free { offset } => {
                    let len = self.alloc.free(*offset).map_err(|e| fail(e.to_string()))?;
                    journal.push(Undo::Free {
                        offset: *offset,
                        len,
                    });
                }
                Effect::Write { .. } | Effect::Retime { .. } => {
                    self.batch_writes.push(e.clone());
                    journal.push(Undo::Write);
                }
                Effect::Index {
                    key,
                    generation,
                    edit,
                } => {
                    let m = self
                        .index
                        .as_mut()
                        .ok_or_else(|| fail("no key index".into()))?;
                    let undo = m.undo_record(edit, key);
                    m.apply(edit, key, *generation).map_err(fail)?;
                    journal.push(Undo::Index(undo));
                }
                Effect::Stag { .. } => return Err(fail("a rotation in a batch".into())),
            }
        }
        Ok(())
    }

    /// Takes back every change of `journal`, last first.
    fn take_back(&mut self, journal: Vec<Undo>) {
        for u in journal.into_iter().rev() {
            match u {
                Undo::Alloc { offset, freed } => self
                    .alloc
                    .undo_alloc(offset, &freed)
                    .expect("an allocation made by the batch"),
                Undo::Free { offset, len } => self
                    .alloc
                    .undo_free(offset, len)
                    .expect("a range freed by the batch"),
                Undo::Index(undo) => self
                    .index
                    .as_mut()
                    .expect("the index the batch edited")
                    .undo(undo),
                Undo::Write => {
                    self.batch_writes.pop();
                }
            }
        }
        debug_assert!(self.batch_writes.is_empty());
    }
}

#[cfg(test)]
impl<M: Memory> Image<M> {
    /// What the planner reads (the allocator, the key index's state), to
    /// compare before and after a batch.
    pub(in crate::node) fn planner_state(&self) -> (crate::alloc::Allocator, Option<Meta>) {
        (self.alloc.clone(), self.index.clone())
    }
}
