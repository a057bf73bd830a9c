//! The node as this process's RESP front door sees it ([`NodeFront`]):
//! the door's requests join the node loop's queue, and its reads of the
//! arena are local copies checked as a remote one-sided Read is.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::arena_reg::ArenaReg;
use super::handshake::ClientAuth;
use super::node_loop::{Ev, EvTx};
use super::redis_door::Front;
use crate::proto;
use crate::ptr::ArenaRef;

/// The node as this process's RESP front door sees it: requests go to the
/// node loop through its event queue (the same `Node::handle` path as a
/// client's message, with the same de-duplication and replication), and
/// reads of the arena are local copies that obey the STag's validity and
/// deadline as a remote one-sided Read does (checked before and after a
/// look-up's copies, by `read_begin` and `read_valid`).
pub(crate) struct NodeFront {
    pub(crate) tx: EvTx,
    pub(crate) reg: Arc<ArenaReg>,
    /// What this node's own clients (the front door's store clients)
    /// prove: the group secret, if one is configured.
    pub(crate) auth: Option<ClientAuth>,
}

impl Front for NodeFront {
    fn arena(&self) -> ArenaRef {
        self.reg.arena()
    }

    fn client_auth(&self) -> Option<ClientAuth> {
        self.auth.clone()
    }

    fn submit(
        &self,
        client: u64,
        req_id: u64,
        op: proto::Op,
        timeout: Duration,
        done: super::redis_door::Answer,
    ) -> bool {
        self.tx.send(Ev::Front {
            client,
            req_id,
            op,
            reply: done,
            until: Instant::now() + timeout,
        })
    }

    fn submit_all(
        &self,
        reqs: Vec<(u64, u64, proto::Op, super::redis_door::Answer)>,
        timeout: Duration,
    ) -> bool {
        let until = Instant::now() + timeout;
        let sent = reqs.into_iter().all(|(client, req_id, op, reply)| {
            self.tx.send_quiet(Ev::Front {
                client,
                req_id,
                op,
                reply,
                until,
            })
        });
        self.tx.wake();
        sent
    }

    fn read(&self, offset: u64, out: &mut [u8]) -> bool {
        self.reg.copy(offset, out)
    }

    fn read_begin(&self) -> Option<u64> {
        let since = self.reg.exposures.read_begin()?;
        self.reg.accessible().then_some(since)
    }

    fn read_valid(&self, since: u64) -> bool {
        self.reg.accessible() && self.reg.exposures.read_valid(since)
    }

    fn write_epoch(&self) -> Option<u64> {
        self.reg.pins.epoch()
    }

    fn unchanged(&self, since: u64) -> bool {
        self.reg.pins.unchanged(since)
    }

    fn pin(&self, offset: u64, len: u64, since: u64) -> Option<crate::arena::Pin> {
        let pin = self.reg.pins.pin(offset, len, since)?;
        self.reg.accessible().then_some(pin)
    }
}
