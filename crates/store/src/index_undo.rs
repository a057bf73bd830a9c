//! Taking back [`Meta::apply`]: what an edit changes, recorded before it
//! and put back after (a batch's planning, `node/image_batch.rs`, applies
//! each write's edits so the next write sees them, then takes them all
//! back, last first).

use super::{Edit, Found, Meta};

/// The state one [`Meta::apply`] changes, as it was before it
/// ([`Meta::undo_record`]).
#[derive(Debug, Clone)]
pub struct MetaUndo {
    bucket: u64,
    used: Option<u32>,
    spill: Option<bool>,
    key: Vec<u8>,
    entry: Option<(Found, u64)>,
    owned: Vec<(u64, bool)>,
}

impl Meta {
    /// What [`Meta::apply`] of `edit` for `key` would change, to put back
    /// with [`Meta::undo`] (a batch's planning applies each write's edits
    /// so the next write sees them, then takes them all back, last first).
    pub fn undo_record(&self, edit: &Edit, key: &[u8]) -> MetaUndo {
        let bucket = edit.bucket();
        let entry = self.keys.get(key).cloned();
        let mut offsets: Vec<u64> = entry.iter().map(|(f, _)| f.entry.offset).collect();
        if let Edit::Slot { entry: Some(e), .. } = edit {
            offsets.push(e.offset);
        }
        MetaUndo {
            bucket,
            used: self.used.get(bucket as usize).copied(),
            spill: self.spill.get(bucket as usize).copied(),
            key: key.to_vec(),
            entry,
            owned: offsets
                .into_iter()
                .map(|o| (o, self.owned.contains(&o)))
                .collect(),
        }
    }

    /// Puts back what [`Meta::undo_record`] recorded.
    pub fn undo(&mut self, u: MetaUndo) {
        let b = u.bucket as usize;
        if let (Some(used), Some(slot)) = (u.used, self.used.get_mut(b)) {
            *slot = used;
        }
        if let (Some(spill), Some(slot)) = (u.spill, self.spill.get_mut(b)) {
            *slot = spill;
        }
        match u.entry {
            Some(e) => {
                self.keys.insert(u.key, e);
            }
            None => {
                self.keys.remove(&u.key);
            }
        }
        for (o, was) in u.owned {
            if was {
                self.owned.insert(o);
            } else {
                self.owned.remove(&o);
            }
        }
    }
}
