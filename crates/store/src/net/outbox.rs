//! The node loop's outgoing messages (`node_loop.rs`): queued per link
//! during a round of events and sent together at its end, except where a
//! message is better sent at once.

use std::sync::Arc;
use std::time::Duration;

use super::link::{Endpoint, Link, Outbound};

/// The node loop's outgoing messages, per link, in order.
#[derive(Default)]
pub(super) struct Outbox {
    links: Vec<(Arc<Link>, Vec<Outbound>)>,
}

impl Outbox {
    /// Queues a message for `link`, or sends it at once over a same-host
    /// ring: there a Send costs no system call, and the peer (polling its
    /// ring) starts on it while this loop handles the rest of the round;
    /// queueing it behind the round cost 16 same-host clients 30-40% of
    /// their write rate.
    pub(super) fn send(
        &mut self,
        link: &Arc<Link>,
        bytes: Outbound,
        ep: &Endpoint,
        timeout: Duration,
    ) {
        match self.links.iter_mut().find(|(l, _)| l.id() == link.id()) {
            Some((_, q)) => q.push(bytes),
            None if link.qp().input_in_ring() => {
                if let Err(e) = link.send_owned(bytes, timeout) {
                    tracing::debug!(link = link.id(), error = %e, "send failed; closing link");
                    ep.remove(link.id());
                }
            }
            None => self.links.push((link.clone(), vec![bytes])),
        }
    }

    /// Sends everything queued; a link whose send fails is closed.
    pub(super) fn flush(&mut self, ep: &Endpoint, timeout: Duration) {
        for (link, msgs) in self.links.drain(..) {
            if let Err(e) = link.send_batch(msgs, timeout) {
                tracing::debug!(link = link.id(), error = %e, "send failed; closing link");
                ep.remove(link.id());
            }
        }
    }
}
