//! The door without a network, for the fuzzer (`fuzz/fuzz_targets/
//! store_door.rs`): arbitrary bytes go through the same decoder and the
//! same command paths ([`Session::serve_bytes`]) as a connection's, over
//! a node that answers every write with a plausible reply of its kind
//! and has no arena to read (reads then fall to store clients, which
//! this door has none of: `-TRYAGAIN`). What it checks: no input panics,
//! blocks, or makes the door write bytes that are not whole RESP replies.

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::session::{Out, Session};
use super::shared::{ConnInfo, Shared};
use super::Front;
use crate::auth::{Credentials, Rights};
use crate::net::handshake::{ClientAuth, Gate};
use crate::proto::{self, Modify, Op, StatusInfo, StoreError};
use crate::ptr::{ArenaRef, RemotePtr};
use crate::resp_codec::Decoder;

const ARENA: ArenaRef = ArenaRef {
    base: 0x7e00_0000_0000,
    len: 1 << 20,
    stag: 0x0012_3401,
};

/// A primary that answers and never reads.
struct StubFront;

impl Front for StubFront {
    fn arena(&self) -> ArenaRef {
        ARENA
    }

    fn client_auth(&self) -> Option<ClientAuth> {
        None
    }

    fn submit(
        &self,
        _client: u64,
        _req_id: u64,
        op: Op,
        _timeout: Duration,
        done: super::Answer,
    ) -> bool {
        done(stub_reply(op));
        true
    }

    fn read(&self, _offset: u64, _out: &mut [u8]) -> bool {
        false
    }

    fn read_begin(&self) -> Option<u64> {
        Some(0)
    }

    fn read_valid(&self, _since: u64) -> bool {
        true
    }
}

/// The stub's answer to `op`.
fn stub_reply(op: Op) -> Result<proto::Reply, StoreError> {
    let ptr = RemotePtr {
        addr: ARENA.base + 4096,
        stag: ARENA.stag,
        len: 64,
        gen: 1,
    };
    Ok(match op {
        Op::Batch { ops, .. } => {
            proto::Reply::Batch(ops.into_iter().map(stub_reply).collect::<Result<_, _>>()?)
        }
        Op::Status => proto::Reply::Status(StatusInfo {
            node: 1,
            role: proto::ROLE_PRIMARY,
            epoch: 3,
            arena_base: ARENA.base,
            arena_len: ARENA.len,
            stag: ARENA.stag,
            allocated: 0,
            objects: 0,
            redundant: true,
            applied_seq: 7,
            keys: 0,
            resp_port: 6379,
            min_in_sync: 1,
            expires: (0, 0),
            persist: 2,
            durable_seq: 7,
            incarnation: 9,
        }),
        Op::Put { .. } => proto::Reply::Stored {
            ptr,
            generation: 1,
            created: true,
        },
        Op::Remove { .. } => proto::Reply::Removed { existed: true },
        Op::Modify {
            how: Modify::IncrBy(by),
            ..
        } => proto::Reply::Modified {
            value: Some(by.to_string().into_bytes()),
            len: by.to_string().len() as u64,
        },
        Op::Modify { .. } => proto::Reply::Modified {
            value: Some(b"old".to_vec()),
            len: 3,
        },
        _ => return Err(StoreError::Other("not in the stub".into())),
    })
}

/// What the door wrote.
#[derive(Clone, Default)]
struct Sink(Arc<Mutex<Vec<u8>>>);

impl Write for Sink {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("sink").extend_from_slice(b);
        Ok(b.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Feeds `input` to a fresh connection in pieces of `step` bytes;
/// returns what the door wrote. Commands that block by design (`WAIT`
/// for more replicas than there are, with no timeout) are left out.
pub fn run(input: &[u8], step: usize) -> Vec<u8> {
    let addr: SocketAddr = "127.0.0.1:9".parse().expect("addr");
    let gate = Arc::new(Gate::new("fuzz".into(), Credentials::default(), false));
    let mut shared = Shared::new(vec![addr], Arc::new(StubFront), gate.clone(), false);
    shared.offline = true;
    let shared = Arc::new(shared);
    let info = Arc::new(ConnInfo::new(1, Some(addr), Some(addr)));
    let user = Some((crate::auth::DEFAULT_USER.to_string(), Rights::ReadWrite));
    let mut session = Session::new(&shared, info, user, gate.credentials(), gate.changes());
    let sink = Sink::default();
    let mut out = Out::new(Some(Box::new(sink.clone())));
    let mut decoder = Decoder::default();
    let mut buf = Vec::new();
    for piece in input.chunks(step.max(1)) {
        buf.extend_from_slice(piece);
        // Leave out WAIT: it waits as long as it is told to.
        if contains_wait(&buf) {
            break;
        }
        let (used, close) = serve_like_the_loop(&mut session, &mut decoder, &buf, &mut out);
        buf.drain(..used);
        out.flush();
        if close {
            break;
        }
    }
    let written = sink.0.lock().expect("sink").clone();
    written
}

/// The event loop's way through `buf`'s commands (`event_loop.rs`):
/// [`Session::fast`] first, its write answered when the node answers,
/// what it leaves to a worker run by [`Session::exec`], as the worker
/// does; the decode loop is the worker's own ([`Session::serve_with`]).
fn serve_like_the_loop(
    session: &mut Session,
    decoder: &mut Decoder,
    buf: &[u8],
    out: &mut Out,
) -> (usize, bool) {
    use super::fast::Fast;
    session.serve_with(decoder, buf, out, |session, args, out| {
        let mut rbuf = Vec::new();
        match session.fast(args, out, &mut rbuf, std::time::Instant::now()) {
            Fast::Done(close) => close,
            Fast::Value(at) => {
                out.bulk(&rbuf[at]);
                false
            }
            Fast::Pinned(pin) => {
                out.bulk(pin.bytes());
                false
            }
            Fast::Write(p) => {
                let mut first = session.shared.front.request(
                    session.id,
                    p.req_id,
                    p.op.clone(),
                    Duration::from_secs(1),
                );
                let reply = match session.answer(p, &mut first) {
                    Ok(r) => r,
                    Err(p) => session.answer_slow(p, first),
                };
                out.reply(&reply);
                false
            }
            Fast::Slow => session.exec(args, out),
        }
    })
}

fn contains_wait(b: &[u8]) -> bool {
    b.windows(4).any(|w| w.eq_ignore_ascii_case(b"wait"))
}

#[cfg(test)]
mod tests {
    use super::run;

    fn enc(args: &[&str]) -> Vec<u8> {
        let mut b = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            b.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
        }
        b
    }

    /// The offline door answers as the connected one does where it can,
    /// whatever the pieces the bytes come in.
    #[test]
    fn the_offline_door_answers_in_any_pieces() {
        let mut input = enc(&["PING"]);
        input.extend(enc(&["INCR", "k"]));
        input.extend(enc(&["HELLO", "3"]));
        input.extend(enc(&["GET", "k"]));
        input.extend(enc(&["CLUSTER", "KEYSLOT", "foo"]));
        input.extend(b"PING\r\n");
        for step in [1, 2, 7, 1000] {
            let out = String::from_utf8(run(&input, step)).unwrap();
            assert!(out.starts_with("+PONG\r\n:1\r\n%7\r\n"), "{step}: {out}");
            assert!(
                out.ends_with("-TRYAGAIN no store clients (offline)\r\n:12182\r\n+PONG\r\n"),
                "{step}: {out}"
            );
        }
        // A protocol error ends the connection, after its error.
        let out = run(b"*1\r\n$x\r\nPING\r\n", 3);
        assert!(out.starts_with(b"-ERR Protocol error"), "{out:?}");
    }
}
