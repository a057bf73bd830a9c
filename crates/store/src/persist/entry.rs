//! What a log record carries, in the store's message codec (each one a
//! message in its epoch's envelope):
//!
//! * a **write**: one replicated write, exactly as the primary forwards it
//!   to its secondary (`Body::Replicate`). Its effects are physical (this
//!   allocation, this object at this offset, this index edit), so replaying
//!   the writes over a snapshot rebuilds the arena byte for byte at the
//!   same offsets, through the path a secondary applies writes by.
//! * a **base**: where a snapshot starts, the state a joining node's copy
//!   starts from (`Body::SyncStart`: the allocator and the retry table as
//!   of write `seq`, and the arena's STag then), its `session` field
//!   holding the node's incarnation (the member the log belongs to: a
//!   recovered node resumes it, so the coordinator's record still names
//!   it). A snapshot of the arena taken after the base, while writes go
//!   on, and the writes logged after the base rebuild the image exactly as
//!   a copy does (docs/store.md, "Snapshots while serving").

use crate::alloc::AllocSnapshot;
use crate::proto::{self, Body, DedupEntry, Envelope, RepOp};

/// Where a snapshot starts: the image's bookkeeping as of write `seq`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Base {
    /// The epoch the node was at.
    pub epoch: u64,
    /// The last write the image holds.
    pub seq: u64,
    /// The node's incarnation.
    pub incarnation: u64,
    /// The allocator as of `seq`.
    pub alloc: AllocSnapshot,
    /// The retry table as of `seq`.
    pub dedup: Vec<DedupEntry>,
    /// The arena's STag as of `seq`.
    pub stag: u32,
}

/// One record's payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    /// A write.
    Write {
        /// The epoch it was made in.
        epoch: u64,
        /// Its sequence number.
        seq: u64,
        /// The write.
        op: RepOp,
    },
    /// A snapshot's start.
    Base(Base),
}

impl Entry {
    /// The write this entry names (a base: the last write it holds).
    pub fn seq(&self) -> u64 {
        match self {
            Entry::Write { seq, .. } => *seq,
            Entry::Base(b) => b.seq,
        }
    }
}

/// A record's payload that holds no entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// The bytes do not decode as a message.
    #[error("log entry does not decode: {0}")]
    Decode(String),
    /// A message, but neither a write nor a base.
    #[error("log entry holds another message")]
    NotAnEntry,
}

/// The payload of a record holding `e`.
pub fn encode(e: &Entry) -> Vec<u8> {
    proto::encode(&match e {
        Entry::Write { epoch, seq, op } => Envelope {
            epoch: *epoch,
            body: Body::Replicate {
                seq: *seq,
                op: op.clone(),
            },
        },
        Entry::Base(b) => Envelope {
            epoch: b.epoch,
            body: Body::SyncStart {
                session: b.incarnation,
                start_seq: b.seq + 1,
                alloc: b.alloc.clone(),
                dedup: b.dedup.clone(),
                stag: b.stag,
            },
        },
    })
}

/// The entry a record's payload holds.
pub fn decode(payload: &[u8]) -> Result<Entry, EntryError> {
    let env = proto::decode(payload).map_err(|e| EntryError::Decode(e.to_string()))?;
    match env.body {
        Body::Replicate { seq, op } => Ok(Entry::Write {
            epoch: env.epoch,
            seq,
            op,
        }),
        Body::SyncStart {
            session,
            start_seq: start_seq @ 1..,
            alloc,
            dedup,
            stag,
        } => Ok(Entry::Base(Base {
            epoch: env.epoch,
            seq: start_seq - 1,
            incarnation: session,
            alloc,
            dedup,
            stag,
        })),
        _ => Err(EntryError::NotAnEntry),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::tests::{effect, reply};
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_logged_write_comes_back_whole(
            epoch in any::<u64>(), seq in any::<u64>(), client in any::<u64>(), req_id in any::<u64>(),
            effects in proptest::collection::vec(effect(), 0..6), reply in reply(),
        ) {
            let e = Entry::Write { epoch, seq, op: RepOp { client, req_id, effects, reply } };
            prop_assert_eq!(decode(&encode(&e)), Ok(e));
        }

        #[test]
        fn a_base_comes_back_whole(
            epoch in any::<u64>(), seq in 0..u64::MAX - 1, incarnation in any::<u64>(),
            allocations in proptest::collection::vec((any::<u64>(), any::<u64>()), 0..8),
            freed in proptest::collection::vec(any::<u64>(), 0..8),
            stag in any::<u32>(), size in any::<u64>(),
        ) {
            let e = Entry::Base(Base {
                epoch, seq, incarnation,
                alloc: AllocSnapshot { size, allocations, freed },
                dedup: Vec::new(),
                stag,
            });
            prop_assert_eq!(decode(&encode(&e)), Ok(e));
        }

        #[test]
        fn other_bytes_are_an_error_not_a_panic(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode(&b);
        }
    }

    #[test]
    fn another_message_is_not_an_entry() {
        let b = proto::encode(&Envelope {
            epoch: 3,
            body: Body::Heartbeat,
        });
        assert_eq!(decode(&b), Err(EntryError::NotAnEntry));
    }
}
