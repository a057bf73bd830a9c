//! What a log record carries: one replicated write, exactly as the primary
//! forwards it to its secondary (`Body::Replicate` in its epoch's
//! envelope, the store's message codec). Its effects are physical (this
//! allocation, this object at this offset, this index edit), so replaying
//! the entries over a snapshot rebuilds the arena byte for byte at the same
//! offsets, through the path a secondary applies writes by.

use crate::proto::{self, Body, Envelope, RepOp};

/// One logged write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// The epoch it was made in.
    pub epoch: u64,
    /// Its sequence number.
    pub seq: u64,
    /// The write.
    pub op: RepOp,
}

/// A record's payload that is not a logged write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// The bytes do not decode as a message.
    #[error("log entry does not decode: {0}")]
    Decode(String),
    /// A message, but not a replicated write.
    #[error("log entry holds another message")]
    NotAWrite,
}

/// The payload of a record holding write `seq` of epoch `epoch`.
pub fn encode(epoch: u64, seq: u64, op: &RepOp) -> Vec<u8> {
    proto::encode(&Envelope {
        epoch,
        body: Body::Replicate {
            seq,
            op: op.clone(),
        },
    })
}

/// The write a record's payload holds.
pub fn decode(payload: &[u8]) -> Result<Entry, EntryError> {
    let env = proto::decode(payload).map_err(|e| EntryError::Decode(e.to_string()))?;
    match env.body {
        Body::Replicate { seq, op } => Ok(Entry {
            epoch: env.epoch,
            seq,
            op,
        }),
        _ => Err(EntryError::NotAWrite),
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
            let op = RepOp { client, req_id, effects, reply };
            let b = encode(epoch, seq, &op);
            prop_assert_eq!(decode(&b), Ok(Entry { epoch, seq, op }));
        }

        #[test]
        fn other_bytes_are_an_error_not_a_panic(b in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode(&b);
        }
    }

    #[test]
    fn another_message_is_not_a_write() {
        let b = proto::encode(&Envelope {
            epoch: 3,
            body: Body::Heartbeat,
        });
        assert_eq!(decode(&b), Err(EntryError::NotAWrite));
    }
}
