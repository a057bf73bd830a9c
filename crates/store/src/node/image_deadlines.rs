//! The keys that have a deadline, ordered by it: how a primary finds the
//! keys to reclaim once they expire without scanning the index.
//!
//! Every node keeps it as it applies writes (the [`Image`](super::Image)'s
//! `apply_meta`: a keyed object written with a deadline is entered, one
//! written without or freed leaves), so a new primary has it the moment
//! it is promoted; a node that copied its arena rebuilds it from the
//! objects' headers with the index. The primary reclaims what is due as
//! its own writes (`node::REAP_CLIENT`, `Modify::Reap`), each removal
//! checked again when it is planned.

use std::collections::BTreeSet;

use rustc_hash::FxHashMap;

/// Keys with a deadline, by deadline and by object offset.
#[derive(Debug, Default)]
pub(in crate::node) struct Deadlines {
    /// Object offset -> (deadline, key). Hashed: every write of a keyed
    /// object looks its offset up here (see `alloc.rs`'s `allocated`).
    by_offset: FxHashMap<u64, (u64, Vec<u8>)>,
    /// (deadline, object offset), earliest first.
    by_time: BTreeSet<(u64, u64)>,
    /// The sum of the deadlines (for their mean, `INFO`'s `avg_ttl`).
    sum: u128,
}

impl Deadlines {
    /// The object at `offset` now holds `key` with `deadline` (0: none;
    /// an empty key is the pointer API's, which never expires).
    pub(in crate::node) fn written(&mut self, offset: u64, key: &[u8], deadline: u64) {
        self.freed(offset);
        if deadline != 0 && !key.is_empty() {
            self.by_offset.insert(offset, (deadline, key.to_vec()));
            self.by_time.insert((deadline, offset));
            self.sum += deadline as u128;
        }
    }

    /// The object at `offset` is gone.
    pub(in crate::node) fn freed(&mut self, offset: u64) {
        if let Some((d, _)) = self.by_offset.remove(&offset) {
            self.by_time.remove(&(d, offset));
            self.sum -= d as u128;
        }
    }

    /// Forgets every key.
    pub(in crate::node) fn clear(&mut self) {
        self.by_offset.clear();
        self.by_time.clear();
        self.sum = 0;
    }

    /// How many keys have a deadline, and the mean deadline (0: none).
    pub(in crate::node) fn count_and_mean(&self) -> (u64, u64) {
        let n = self.by_offset.len() as u64;
        (n, self.sum.checked_div(n as u128).unwrap_or(0) as u64)
    }

    /// Keys with a deadline.
    #[cfg(any(test, feature = "testing"))]
    pub(in crate::node) fn len(&self) -> usize {
        self.by_offset.len()
    }

    /// The keys whose deadline is at or before `now_ms`, earliest first:
    /// at most `max` of them and `max_bytes` of key bytes (at least one).
    pub(in crate::node) fn due(&self, now_ms: u64, max: usize, max_bytes: usize) -> Vec<Vec<u8>> {
        let mut keys = Vec::new();
        let mut bytes = 0;
        for (d, off) in &self.by_time {
            if *d > now_ms || keys.len() >= max {
                break;
            }
            let key = &self.by_offset[off].1;
            if !keys.is_empty() && bytes + key.len() > max_bytes {
                break;
            }
            bytes += key.len();
            keys.push(key.clone());
        }
        keys
    }

    /// Panics unless both orders hold the same entries.
    pub(in crate::node) fn check_invariants(&self) {
        assert_eq!(self.by_offset.len(), self.by_time.len());
        for (off, (d, _)) in &self.by_offset {
            assert!(self.by_time.contains(&(*d, *off)), "deadline order");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_come_due_in_deadline_order_and_leave_when_rewritten_or_freed() {
        let mut d = Deadlines::default();
        d.written(64, b"a", 30);
        d.written(128, b"b", 10);
        d.written(192, b"c", 20);
        d.written(256, b"", 5); // the pointer API's: never
        d.written(320, b"none", 0);
        assert_eq!(d.len(), 3);
        assert_eq!(d.due(25, 10, 1024), vec![b"b".to_vec(), b"c".to_vec()]);
        assert_eq!(d.due(25, 1, 1024), vec![b"b".to_vec()]);
        assert_eq!(d.due(9, 10, 1024), Vec::<Vec<u8>>::new());
        // Rewritten in place without a deadline, or freed: gone.
        d.written(128, b"b", 0);
        d.freed(192);
        assert_eq!(d.due(100, 10, 1024), vec![b"a".to_vec()]);
        // Rewritten with a later one: due later.
        d.written(64, b"a", 200);
        assert_eq!(d.due(100, 10, 1024), Vec::<Vec<u8>>::new());
        // At least one key, whatever its length.
        d.written(384, &[7u8; 900], 50);
        d.written(448, &[8u8; 900], 60);
        assert_eq!(d.due(100, 10, 1000).len(), 1);
        d.check_invariants();
        d.clear();
        assert_eq!(d.len(), 0);
    }
}
