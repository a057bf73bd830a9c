//! The pointer face of [`StoreClient`]: objects named by the
//! [`RemotePtr`] the store gave them, with memory verbs.
//!
//! | method | what it does |
//! |---|---|
//! | [`alloc`](StoreClient::alloc) | stores a new object, returns its pointer |
//! | [`read_ptr`](StoreClient::read_ptr) | one-sided Read of the object, the node as fallback |
//! | [`read_ptrs`](StoreClient::read_ptrs) | the same for many, Reads batched |
//! | [`read_ptr_via_node`](StoreClient::read_ptr_via_node) | the node's answer (no RDMA Read) |
//! | [`update_ptr`](StoreClient::update_ptr) | replaces the object, returns its (maybe new) pointer |
//! | [`free`](StoreClient::free) | frees the object |
//!
//! Writes go through the request session (`Op::Insert`, `Op::Update`,
//! `Op::Delete`), reads through the one-sided reader. An object that
//! belongs to a key is refused here (`Keyed`): keys have the keyed face
//! ([`super::keyed`]), whose verbs (`get`, `set`, `del`, ...) none of these
//! resembles.

use super::error::{ClientError, OpKind};
use super::keyed::check_value;
use super::StoreClient;
use crate::proto::{Bytes, Op, Reply};
use crate::ptr::RemotePtr;

impl StoreClient {
    /// Stores `data` as a new object; returns its remote pointer.
    pub fn alloc(&mut self, data: &[u8]) -> Result<RemotePtr, ClientError> {
        check_value(data)?;
        match self.session.request(Op::Insert {
            data: Bytes::copy_from_slice(data),
        })? {
            Reply::Inserted(p) => Ok(p),
            r => Err(ClientError::unexpected(OpKind::Insert, r)),
        }
    }

    /// Replaces the object at `ptr`; returns its pointer (the same one if
    /// the data fit the old space).
    pub fn update_ptr(&mut self, ptr: RemotePtr, data: &[u8]) -> Result<RemotePtr, ClientError> {
        check_value(data)?;
        match self.session.request(Op::Update {
            ptr,
            data: Bytes::copy_from_slice(data),
        })? {
            Reply::Updated(p) => Ok(p),
            r => Err(ClientError::unexpected(OpKind::Update, r)),
        }
    }

    /// Frees the object at `ptr`.
    pub fn free(&mut self, ptr: RemotePtr) -> Result<(), ClientError> {
        match self.session.request(Op::Delete { ptr })? {
            Reply::Deleted => Ok(()),
            r => Err(ClientError::unexpected(OpKind::Delete, r)),
        }
    }

    /// Reads the object at `ptr` through the node (no RDMA Read).
    pub fn read_ptr_via_node(&mut self, ptr: RemotePtr) -> Result<Vec<u8>, ClientError> {
        self.reader.count_server_read();
        match self.session.request(Op::Read { ptr })? {
            Reply::Data { data, .. } => Ok(data),
            r => Err(ClientError::unexpected(OpKind::Read, r)),
        }
    }

    /// Reads the object at `ptr` with a one-sided RDMA Read from the
    /// primary, retrying torn reads; falls back to
    /// [`read_ptr_via_node`](Self::read_ptr_via_node) when the bytes are
    /// no object or keep tearing.
    pub fn read_ptr(&mut self, ptr: RemotePtr) -> Result<Vec<u8>, ClientError> {
        match self.reader.read_ptr(&mut self.session, ptr)? {
            Some(data) => Ok(data),
            None => self.read_ptr_via_node(ptr),
        }
    }

    /// Reads the objects at `ptrs` with one-sided RDMA Reads from the
    /// primary, up to [`crate::net::link::READ_BATCH`] in flight at once
    /// on the one connection. Each result is what
    /// [`read_ptr`](Self::read_ptr) gives for that pointer: a pointer
    /// outside the arena, a torn object or a failed batch falls back to
    /// `read_ptr` for the pointers concerned, so errors are per pointer.
    pub fn read_ptrs(&mut self, ptrs: &[RemotePtr]) -> Vec<Result<Vec<u8>, ClientError>> {
        let found = self.reader.read_ptrs(&mut self.session, ptrs);
        ptrs.iter()
            .zip(found)
            .map(|(&p, r)| r.unwrap_or_else(|| self.read_ptr(p)))
            .collect()
    }
}
