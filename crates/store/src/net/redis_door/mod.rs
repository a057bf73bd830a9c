//! The store's Redis-compatible front door: `softrdma store serve` with
//! `resp = "ADDR"` (or `--resp ADDR`) accepts RESP connections, so
//! `redis-cli`, `redis-benchmark` and Redis client libraries work
//! unchanged.
//!
//! The connections are served by one event loop, as Redis serves them
//! (`event_loop.rs`, at most [`MAX_CLIENTS`]): it runs what need not wait
//! (a `GET` from this node's arena, a `SET` or counter step handed to the
//! node loop and answered when it comes back, the connection's own
//! commands: `fast.rs`) and hands a connection whose next command could
//! wait to a worker thread, which runs it as a thread per connection
//! would and hands the connection back. A
//! RESP command is a store request like any other, so it keeps every
//! guarantee of the native protocol: a write enters this node's loop
//! through its event queue ([`Front::request`]), the path a client's
//! message takes without the network, and is answered once replicated
//! (if that answer does not come, it is retried under the same request id
//! through a client of the connection's own, and takes effect once); a
//! read on the primary is the one-sided look-up run on the node's own
//! arena, each copy checked against the arena STag's validity and lease
//! deadline as a remote Read is ([`Front::read`]). What this node cannot
//! answer itself (reads while it is not the primary, `KEYS`, `SCAN`, the
//! peers' status) goes through a few
//! [`StoreClient`](crate::net::client::StoreClient)s shared by all
//! connections. Replies are written out as they pile up (a pipeline, a
//! long `MGET` step by step), so a connection holds at most a request
//! ([`crate::resp_codec::MAX_REQUEST`]) and a few hundred KiB of replies.
//! Commands:
//!
//! | command | store operation |
//! |---|---|
//! | `GET k` | one-sided look-up (`StoreClient::get`) |
//! | `SET k v [NX\|XX] [GET] [EX\|PX\|EXAT\|PXAT t\|KEEPTTL]` | `put` (Always / IfAbsent / IfPresent) with its deadline (`Ttl`); `$-1` when the condition fails; `GET`: a `Modify::Swap` |
//! | `SETEX`, `PSETEX`, `EXPIRE`, `PEXPIRE`, `EXPIREAT`, `PEXPIREAT`, `PERSIST`, `TTL`, `PTTL`, `EXPIRETIME`, `PEXPIRETIME`, `GETEX` | a put with a deadline, one `Modify::Expire`, a look-up's deadline (`expiry.rs`) |
//! | `INCR`, `DECR`, `INCRBY`, `DECRBY`, `INCRBYFLOAT`, `APPEND`, `SETRANGE`, `GETSET`, `GETDEL` | one `Op::Modify` each (`strings.rs`) |
//! | `SETNX k v` | `put` IfAbsent: `:1` / `:0` |
//! | `DEL k...`, `UNLINK k...` | the removes as one batch: the count that existed |
//! | `FLUSHDB`, `FLUSHALL` | every key (a scan) removed in batches |
//! | `EXISTS k...` | batched look-ups: the count found |
//! | `MGET k...` | look-ups in steps of 64 keys, each a snapshot on the primary ([`Session::consistent`]); on a secondary `get_many`, Reads batched |
//! | `MSET k v ...` | the puts as one `Op::Batch` (one replicated write); larger than one frame, consecutive batches |
//! | `MSETNX k v ...` | the puts IfAbsent as one batch, all or none |
//! | `MULTI`, `EXEC`, `DISCARD`, `WATCH`, `UNWATCH` | the queued commands as one batch, watched keys checked first (`transaction.rs`) |
//! | `KEYS p`, `SCAN c [MATCH p] [COUNT n]` | `scan` of the committed index |
//! | `DBSIZE` | keys in the index (`status`) |
//! | `TYPE k`, `STRLEN k`, `GETRANGE k a b` | a look-up |
//! | `INFO [section...]` | Redis's sections, the fields clients read, the store's own |
//! | `WAIT n t` | the secondaries holding every write answered (1 while the group is redundant), asked again until `t` ms while fewer than `n` |
//! | `HELLO [2\|3 [AUTH u p] [SETNAME n]]` | the connection's protocol (RESP3 maps, sets, nulls, verbatim text) |
//! | `CLUSTER ...`, `READONLY`, `READWRITE`, `ASKING`, `ROLE` | the group as one shard of all 16,384 slots (`cluster.rs`) |
//! | `COMMAND [INFO\|COUNT\|LIST\|DOCS]` | the command table (`command_table.rs`) |
//! | `PING`, `ECHO`, `SELECT 0`, `QUIT`, `TIME`, `CONFIG GET`, `CLIENT ...` | what clients send when they connect (`connection.rs`) |
//!
//! Anything else is answered `-ERR unknown command '...'`, as Redis does;
//! bytes that are not RESP get `-ERR Protocol error: ...` and the
//! connection is closed. A write sent to a node that is not the primary
//! is answered `-MOVED SLOT HOST:PORT` naming the key's cluster slot and
//! the primary's RESP address (`redis-cli -c` follows it; the host is the
//! primary's store address, the port its RESP port); while no primary is
//! known it waits for one (at most 5 s, then `-CLUSTERDOWN`);
//! reads on any node are served (through the primary's arena). Values
//! are at most `proto::MAX_VALUE` bytes (64 MiB), keys 1 to 1,024 bytes.
//!
//! The door is this module alone: the server starts it ([`spawn`]) and
//! hands it a [`Front`], the node as the door needs it, which the node
//! loop's side implements. Inside: `shared.rs` (what all connections
//! share: the pool of store clients, the node's last known role),
//! `event_loop.rs` (the sockets), `workers.rs` (the threads that run what
//! may wait), `fast.rs` (what the loop
//! runs itself), `session.rs` (a connection: its bytes, its authentication, the paths
//! of a write and of a local read), `commands.rs` (the dispatcher and the
//! keyed commands), `connection.rs` (the connection's and the server's
//! commands), `strings.rs` (the read-modify-write commands),
//! `transaction.rs` (`MULTI`/`EXEC`/`WATCH`), `cluster.rs`
//! (the cluster protocol) and `command_table.rs`.

use std::net::{SocketAddr, TcpListener};
use std::sync::Arc;
use std::time::Duration;

use crate::net::handshake::{ClientAuth, Gate};
use crate::proto;
use crate::ptr::ArenaRef;

mod cluster;
mod command_table;
mod commands;
mod connection;
mod event_loop;
mod expiry;
mod fast;
#[doc(hidden)]
pub mod fuzzing;
mod session;
mod shared;
mod strings;
mod transaction;
mod workers;

use shared::Shared;

/// Where the node loop hands the answer to a front-door request.
pub type Answer = Box<dyn FnOnce(Result<proto::Reply, proto::StoreError>) + Send>;

/// The node as the RESP front door sees it: requests go to the node's
/// loop (the same path as a client's message, with the same
/// de-duplication and replication), and reads of the arena are local
/// copies that obey the STag's validity and deadline exactly as a remote
/// one-sided Read does.
pub trait Front: Send + Sync {
    /// The arena (with its STag now).
    fn arena(&self) -> ArenaRef;

    /// The credential the front door's own store clients use.
    fn client_auth(&self) -> Option<ClientAuth>;

    /// Sends request `req_id` of client `client` to the node loop, which
    /// calls `done` with its answer (from the node loop's thread: `done`
    /// only hands the answer on). `done` is dropped uncalled if no answer
    /// comes within `timeout`; false if the node loop is gone. Either way
    /// the outcome is then unknown, and a retry with the same ids through
    /// any node learns it.
    fn submit(
        &self,
        client: u64,
        req_id: u64,
        op: proto::Op,
        timeout: Duration,
        done: Answer,
    ) -> bool;

    /// Several [`Self::submit`]s (`(client, req_id, op, done)`), the node
    /// loop woken once for all of them.
    fn submit_all(&self, reqs: Vec<(u64, u64, proto::Op, Answer)>, timeout: Duration) -> bool {
        reqs.into_iter()
            .all(|(client, req_id, op, done)| self.submit(client, req_id, op, timeout, done))
    }

    /// [`Self::submit`], waiting for the answer at most `timeout`. `None`:
    /// no answer in time (or the node loop is gone).
    fn request(
        &self,
        client: u64,
        req_id: u64,
        op: proto::Op,
        timeout: Duration,
    ) -> Option<Result<proto::Reply, proto::StoreError>> {
        let (tx, rx) = std::sync::mpsc::channel();
        let done: Answer = Box::new(move |r| {
            let _ = tx.send(r);
        });
        if !self.submit(client, req_id, op, timeout, done) {
            return None;
        }
        rx.recv_timeout(timeout).ok()
    }

    /// Copies arena bytes at `offset` into `out`; `false` outside the
    /// arena. Meaningful only between [`Self::read_begin`] and a
    /// [`Self::read_valid`] that says so.
    fn read(&self, offset: u64, out: &mut [u8]) -> bool;

    /// Where a set of [`Self::read`]s starts: `None` while this node does
    /// not serve one-sided reads (its STag invalid or past its deadline)
    /// or a batch is being written into the arena
    /// ([`crate::arena::Exposures`]).
    fn read_begin(&self) -> Option<u64>;

    /// Whether the reads since [`Self::read_begin`] gave `since` saw
    /// every batch whole or not at all, and this node still serves
    /// one-sided reads (the STag checked before and after the copies, as
    /// a remote Read's is).
    fn read_valid(&self, since: u64) -> bool;

    /// Where a look-up that may pin a large value starts: the count of
    /// the arena's writes (`arena::pins`), `None` while one is under way
    /// or where values are not sent from the arena.
    fn write_epoch(&self) -> Option<u64> {
        None
    }

    /// Whether no write of the arena began since [`Self::write_epoch`]
    /// gave `since`: the reads in between saw the arena as it was then.
    fn unchanged(&self, _since: u64) -> bool {
        false
    }

    /// Pins `len` arena bytes at `offset` for sending if no write began
    /// since [`Self::write_epoch`] gave `since` and this node still serves
    /// one-sided reads (as [`Self::read_valid`] asks); `None` otherwise.
    fn pin(&self, _offset: u64, _len: u64, _since: u64) -> Option<crate::arena::Pin> {
        None
    }
}

/// Connections served at once (Redis's `maxclients` is 10,000; a
/// connection costs the loop its buffers, and a worker thread only while
/// a command of it waits). One more is answered with Redis's error and
/// closed.
pub const MAX_CLIENTS: usize = 1000;

/// Serves RESP on `listener` for the node at `nodes[0]` (its peers
/// after it), from an event loop ([`event_loop`]), until the process
/// ends.
pub fn spawn(
    listener: TcpListener,
    nodes: Vec<SocketAddr>,
    front: Arc<dyn Front>,
    gate: Arc<Gate>,
    protected_mode: bool,
) -> std::io::Result<()> {
    let shared = Arc::new(Shared::new(nodes, front, gate, protected_mode));
    event_loop::start(listener, shared)
}
