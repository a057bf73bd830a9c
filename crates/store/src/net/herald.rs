//! The herald: while a node back from its log loads its snapshot (a
//! second or more for a 1 GiB arena), it tells its peers how new the
//! state it is loading is, so that a peer already loaded need not wait
//! for it in the dark.
//!
//! The election of the newest (`node/durable.rs`) lets a node back from
//! its log campaign at once only when it heard every other member and
//! none is newer. A peer still loading said nothing before the herald:
//! its node loop starts after the load. Under `everysec` a loaded node
//! that heard nobody waits a grace for a peer that may be loading a
//! newer log; in `softrdma store bench-recovery` that wait cost 0.9 s of
//! a 1.5-2.4 s recovery, and bought nothing (both logs ended at the same
//! write). Heard as `loading`, an equal or older peer is not waited for;
//! a strictly newer one is, until it has loaded and campaigns.
//!
//! One thread per configured peer, on an endpoint of its own (the node
//! loop's is not driven yet): it dials the peer as a node (the same
//! handshake and proof as the dialers), sends a [`Body::Standing`] with
//! `loading` set every heartbeat interval, and closes its link when
//! [`Herald::stop`] is called, just before the node loop starts and says
//! its own. What the peer sends on the link (it uses it while it has no
//! link of its own to this node) is read and dropped: it is for a node
//! that is not running yet, and the node loop hears it again.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use super::handshake::{self, ClientAuth, Hello};
use super::link::{Endpoint, Link};
use super::CONNECT_TIMEOUT;
use crate::proto::{encode, Body, Envelope, Member};

/// The herald's threads; [`Herald::stop`] ends them.
pub(super) struct Herald {
    stop: Arc<AtomicBool>,
}

impl Herald {
    /// Starts telling each of `peers` that `me` is loading a state of
    /// `(epoch, seq)`, every `every`.
    pub(super) fn start(
        peers: &[SocketAddr],
        hello: Hello,
        auth: Option<ClientAuth>,
        me: Member,
        (epoch, seq): (u64, u64),
        every: Duration,
    ) -> Herald {
        let stop = Arc::new(AtomicBool::new(false));
        let env = Envelope {
            epoch,
            body: Body::Standing {
                member: me,
                epoch,
                seq,
                campaigns: true,
                loading: true,
            },
        };
        let msg = encode(&env);
        for &peer in peers {
            let (stop, hello, auth, msg) = (stop.clone(), hello.clone(), auth.clone(), msg.clone());
            let spawned = std::thread::Builder::new()
                .name("store-herald".into())
                .spawn(move || tell(peer, &hello, auth.as_ref(), &msg, every, &stop));
            if let Err(e) = spawned {
                // Without it the peer waits as it did before the herald.
                tracing::warn!(%peer, error = %e, "herald not started");
            }
        }
        Herald { stop }
    }

    /// Stops the threads (each closes its link at its next beat); the
    /// node loop speaks for the node from now on.
    pub(super) fn stop(self) {
        self.stop.store(true, Ordering::Release);
    }
}

/// One peer's thread: dial, say `msg` every `every`, redial when the link
/// dies, until `stop`.
fn tell(
    peer: SocketAddr,
    hello: &Hello,
    auth: Option<&ClientAuth>,
    msg: &[u8],
    every: Duration,
    stop: &AtomicBool,
) {
    let ep = match Endpoint::open("store-herald") {
        Ok(ep) => ep,
        Err(e) => {
            tracing::warn!(%peer, error = %e, "herald: no endpoint");
            return;
        }
    };
    let mut link: Option<Arc<Link>> = None;
    let mut told = 0u64;
    let mut heard = Vec::new();
    while !stop.load(Ordering::Acquire) {
        // What the peer says on this link (its own `Standing`, while it
        // has no link of its own to this node) is for the node loop, which
        // will hear it again on its own links: dropped, but read, so that
        // the link's receives stay posted.
        ep.poll(&mut heard);
        heard.clear();
        if link.as_ref().is_none_or(|l| l.is_dead()) {
            if let Some(l) = link.take() {
                ep.remove(l.id());
            }
            // A peer not up yet refuses at once on this host; a dead host
            // costs a connect timeout, and the herald tries again.
            link = handshake::connect(&ep, peer, hello, auth, CONNECT_TIMEOUT)
                .ok()
                .map(|(l, _)| l);
        }
        if let Some(l) = &link {
            if l.send(msg, every).is_ok() {
                told += 1;
            }
        }
        std::thread::sleep(every);
    }
    // (The peer logs a reset of this link, `connection error`, once: the
    // close does not wait for the peer's own close.)
    tracing::debug!(%peer, told, "herald stopped");
    ep.shutdown();
}
