//! The node loop's outgoing messages (`node_loop.rs`): queued per link
//! during a round of events and sent together at its end, except where a
//! message is better sent at once.

use std::sync::Arc;
use std::time::Duration;

use super::link::{Endpoint, Link, Outbound};

/// The node loop's outgoing messages, per link, in order.
#[derive(Default)]
pub(super) struct Outbox {
    links: Vec<(Arc<Link>, Queue<Outbound>)>,
}

/// One link's queued messages, in order, where a cumulative
/// acknowledgement ([`crate::proto::Body::ReplicateAck`]) queued right
/// behind another of the same epoch replaces it: it says all the other
/// said. A secondary handles a round's `Replicate`s one by one and
/// answers each; sent as they were made, the primary received (and its
/// engine completed, and it decoded) one acknowledgement per write.
pub(super) struct Queue<T> {
    msgs: Vec<T>,
    /// The epoch of the acknowledgement that is the last message queued,
    /// if it is one.
    ack_last: Option<u64>,
}

impl<T> Default for Queue<T> {
    fn default() -> Self {
        Queue {
            msgs: Vec::new(),
            ack_last: None,
        }
    }
}

impl<T> Queue<T> {
    pub(super) fn push(&mut self, msg: T) {
        self.msgs.push(msg);
        self.ack_last = None;
    }

    /// Queues `ack`, a cumulative acknowledgement of epoch `epoch`, in
    /// place of the last message if that is one of the same epoch.
    pub(super) fn push_ack(&mut self, ack: T, epoch: u64) {
        match (self.ack_last, self.msgs.last_mut()) {
            (Some(e), Some(last)) if e == epoch => *last = ack,
            _ => self.msgs.push(ack),
        }
        self.ack_last = Some(epoch);
    }

    pub(super) fn into_msgs(self) -> Vec<T> {
        self.msgs
    }
}

impl Outbox {
    /// Queues a message for `link`, or sends it at once over a same-host
    /// ring: there a Send costs no system call, and the peer (polling its
    /// ring) starts on it while this loop handles the rest of the round;
    /// queueing it behind the round cost 16 same-host clients 30-40% of
    /// their write rate.
    /// `ack`: `Some(epoch)` when `bytes` is a cumulative acknowledgement
    /// of that epoch ([`Queue::push_ack`]).
    pub(super) fn send(
        &mut self,
        link: &Arc<Link>,
        bytes: Outbound,
        ack: Option<u64>,
        ep: &Endpoint,
        timeout: Duration,
    ) {
        let q = match self.links.iter_mut().position(|(l, _)| l.id() == link.id()) {
            Some(i) => &mut self.links[i].1,
            None if link.qp().input_in_ring() => {
                if let Err(e) = link.send_owned(bytes, timeout) {
                    tracing::debug!(link = link.id(), error = %e, "send failed; closing link");
                    ep.remove(link.id());
                }
                return;
            }
            None => {
                self.links.push((link.clone(), Queue::default()));
                &mut self.links.last_mut().expect("pushed").1
            }
        };
        match ack {
            Some(epoch) => q.push_ack(bytes, epoch),
            None => q.push(bytes),
        }
    }

    /// Sends everything queued; a link whose send fails is closed.
    pub(super) fn flush(&mut self, ep: &Endpoint, timeout: Duration) {
        for (link, q) in self.links.drain(..) {
            if let Err(e) = link.send_batch(q.into_msgs(), timeout) {
                tracing::debug!(link = link.id(), error = %e, "send failed; closing link");
                ep.remove(link.id());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Queue;

    fn queued(ops: &[(u32, Option<u64>)]) -> Vec<u32> {
        let mut q = Queue::default();
        for &(m, ack) in ops {
            match ack {
                Some(epoch) => q.push_ack(m, epoch),
                None => q.push(m),
            }
        }
        q.into_msgs()
    }

    #[test]
    fn consecutive_acknowledgements_of_one_epoch_leave_the_last() {
        // Acks 1, 2, 3 of epoch 7 in a row: only 3 is sent.
        assert_eq!(queued(&[(1, Some(7)), (2, Some(7)), (3, Some(7))]), vec![3]);
        // Another message in between keeps the order (and both acks).
        assert_eq!(
            queued(&[(1, Some(7)), (100, None), (2, Some(7)), (3, Some(7))]),
            vec![1, 100, 3]
        );
        // A message queued after an ack is not replaced by the next ack.
        assert_eq!(
            queued(&[(1, Some(7)), (100, None), (2, Some(7))]),
            vec![1, 100, 2]
        );
        // An ack of another epoch does not replace one of this epoch.
        assert_eq!(
            queued(&[(1, Some(7)), (2, Some(8)), (3, Some(8))]),
            vec![1, 3]
        );
        assert_eq!(queued(&[(100, None), (101, None)]), vec![100, 101]);
    }
}
