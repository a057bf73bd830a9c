//! The keyed face of [`StoreClient`]: values under keys, with Redis-like
//! verbs.
//!
//! | method | Redis | what it does |
//! |---|---|---|
//! | [`get`](StoreClient::get) | `GET` | one-sided look-up, the node as fallback |
//! | [`get_many`](StoreClient::get_many) | `MGET` | look-ups side by side, Reads batched |
//! | [`get_via_node`](StoreClient::get_via_node) | | the node's answer (no RDMA Read) |
//! | [`set`](StoreClient::set) | `SET` | create or replace, answered once replicated |
//! | [`set_if`](StoreClient::set_if) | `SET NX`/`XX` | the same if a [`Cond`] holds |
//! | [`del`](StoreClient::del) | `DEL` | remove the key |
//! | [`scan`](StoreClient::scan) | `KEYS`/`SCAN` | keys matching a glob |
//!
//! Writes go through the request session (`Op::Put`, `Op::Remove`), reads
//! through the one-sided reader; the key -> pointer cache follows both.
//! The pointer face ([`super::pointers`]) has none of these verbs.

use super::error::{ClientError, OpKind};
use super::StoreClient;
use crate::proto::{self, Bytes, Cond, Op, Reply, StoreError, Ttl, MAX_VALUE};
use crate::ptr::RemotePtr;

/// A value no larger than a message can carry.
pub(super) fn check_value(data: &[u8]) -> Result<(), ClientError> {
    if data.len() > MAX_VALUE {
        return Err(ClientError::ValueTooLarge {
            len: data.len(),
            max: MAX_VALUE,
        });
    }
    Ok(())
}

impl StoreClient {
    /// Stores `data` under `key` (creating or replacing it; `SET`);
    /// answered once replicated. Returns where the key's object is now.
    pub fn set(&mut self, key: &[u8], data: &[u8]) -> Result<RemotePtr, ClientError> {
        match self.set_if(key, data, Cond::Always)? {
            Some(ptr) => Ok(ptr),
            None => Err(ClientError::unexpected(OpKind::Put, Reply::NotStored)),
        }
    }

    /// [`Self::set`] of a value the caller hands over: it is encoded
    /// into the request straight from `data`, not copied first (a large
    /// value's copy is a pass over all of it; `Bytes::from(vec)` makes
    /// no copy either).
    pub fn set_bytes(&mut self, key: &[u8], data: Bytes) -> Result<RemotePtr, ClientError> {
        match self.put(key, data, Cond::Always, Ttl::Clear)? {
            Some(ptr) => Ok(ptr),
            None => Err(ClientError::unexpected(OpKind::Put, Reply::NotStored)),
        }
    }

    /// Stores `data` under `key` if `cond` holds (`SET NX` / `SET XX`);
    /// `None`: it did not, nothing changed.
    pub fn set_if(
        &mut self,
        key: &[u8],
        data: &[u8],
        cond: Cond,
    ) -> Result<Option<RemotePtr>, ClientError> {
        self.set_with(key, data, cond, Ttl::Clear)
    }

    /// Stores `data` under `key` if `cond` holds, with the deadline `ttl`
    /// says (`SET ... EX|PX|EXAT|PXAT|KEEPTTL`): after it, every reader
    /// (this client's one-sided gets included) counts the key absent
    /// from [`crate::lookup::CLOCK_BOUND_MS`] before the deadline, and the
    /// primary removes it by its own clock. `None`: the condition did not
    /// hold, nothing changed.
    pub fn set_with(
        &mut self,
        key: &[u8],
        data: &[u8],
        cond: Cond,
        ttl: Ttl,
    ) -> Result<Option<RemotePtr>, ClientError> {
        check_value(data)?;
        self.put(key, Bytes::copy_from_slice(data), cond, ttl)
    }

    fn put(
        &mut self,
        key: &[u8],
        data: Bytes,
        cond: Cond,
        ttl: Ttl,
    ) -> Result<Option<RemotePtr>, ClientError> {
        proto::check_key(key)?;
        check_value(&data)?;
        let op = Op::Put {
            key: key.to_vec(),
            data,
            cond,
            ttl,
        };
        match self.session.request(op)? {
            Reply::Stored { ptr, .. } => {
                self.remember(key, ptr);
                Ok(Some(ptr))
            }
            Reply::NotStored => Ok(None),
            r => Err(ClientError::unexpected(OpKind::Put, r)),
        }
    }

    /// Deletes `key` (`DEL`); whether it existed.
    pub fn del(&mut self, key: &[u8]) -> Result<bool, ClientError> {
        proto::check_key(key)?;
        self.reader.forget(key);
        match self.session.request(Op::Remove { key: key.to_vec() })? {
            Reply::Removed { existed } => Ok(existed),
            r => Err(ClientError::unexpected(OpKind::Remove, r)),
        }
    }

    /// The node's answer for `key` (the fallback of [`Self::get`]; no
    /// RDMA Read).
    pub fn get_via_node(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, ClientError> {
        proto::check_key(key)?;
        self.reader.count_server_read();
        match self.session.request(Op::Get { key: key.to_vec() })? {
            Reply::Value { ptr, data, .. } => {
                self.remember(key, ptr);
                Ok(Some(data))
            }
            Reply::NoKey => {
                self.reader.forget(key);
                Ok(None)
            }
            r => Err(ClientError::unexpected(OpKind::Get, r)),
        }
    }

    /// Reads `key`'s value (`GET`) with one-sided RDMA Reads of the
    /// primary's arena (the cached pointer, else the key's index bucket
    /// and then the object), no server CPU on the path. Falls back to the
    /// node ([`Self::get_via_node`]) when a Read fails or the look-up keeps
    /// racing writes; each fallback is counted with its reason
    /// ([`super::ClientStats`]).
    pub fn get(&mut self, key: &[u8]) -> Result<Option<Vec<u8>>, ClientError> {
        proto::check_key(key)?;
        match self.reader.get(&mut self.session, key) {
            Some(v) => Ok(v),
            None => self.get_via_node(key),
        }
    }

    /// Reads many keys (`MGET`): their look-ups run side by side, each
    /// round of their next Reads posted together (up to
    /// [`crate::net::link::READ_BATCH`] in flight on the one connection),
    /// so a round costs about one round trip however many keys it serves.
    /// Each result is what [`Self::get`] gives for that key.
    pub fn get_many(&mut self, keys: &[&[u8]]) -> Vec<Result<Option<Vec<u8>>, ClientError>> {
        let found = self.reader.get_many(&mut self.session, keys);
        keys.iter()
            .zip(found)
            .map(|(k, r)| match (proto::check_key(k), r) {
                (Err(e), _) => Err(e.into()),
                (Ok(()), Some(v)) => Ok(v),
                (Ok(()), None) => self.get(k),
            })
            .collect()
    }

    /// Keys matching a glob `pattern` (empty: all; at most
    /// [`crate::glob::MAX_PATTERN_LEN`] bytes), in index order; a scan of
    /// the committed index on the primary, a few hundred buckets per
    /// request.
    pub fn scan(&mut self, pattern: &[u8]) -> Result<Vec<Vec<u8>>, ClientError> {
        if pattern.len() > crate::glob::MAX_PATTERN_LEN {
            return Err(StoreError::BadPattern {
                len: pattern.len() as u64,
                max: crate::glob::MAX_PATTERN_LEN as u64,
            }
            .into());
        }
        let mut keys = Vec::new();
        let mut cursor = 0;
        loop {
            let op = Op::Scan {
                cursor,
                count: 1000,
                pattern: pattern.to_vec(),
            };
            match self.session.request(op)? {
                Reply::Keys { keys: k, next } => {
                    keys.extend(k);
                    if next == 0 {
                        return Ok(keys);
                    }
                    cursor = next;
                }
                r => return Err(ClientError::unexpected(OpKind::Scan, r)),
            }
        }
    }
}
