//! Posts queued without their doorbell (`QueuePair::post_send_held`, which
//! the C ABI uses to send several posts in one `sendmsg`): nothing goes out
//! before a push, then everything in posting order; a post that transmits
//! takes the held ones before it.

mod common;
use common::*;
use softrdma_verbs::*;

/// Connects a pair and makes one round trip on it, so that no set-up
/// traffic is left to wake the client's transmitter.
fn settled_pair() -> (Side, Side, MemoryRegion, MemoryRegion) {
    let (c, s) = pair();
    let remote =
        s.pd.alloc_mr(
            4096,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
        )
        .unwrap();
    let local = c.pd.alloc_mr(4096, Access::LOCAL_WRITE).unwrap();
    c.qp.post_send(&SendWr::read(
        0,
        local.sge(0, 8),
        remote.addr(),
        remote.rkey(),
    ))
    .unwrap();
    assert_eq!(wait(&c.cq).status, WcStatus::Success);
    (c, s, local, remote)
}

fn write(id: u64, local: &MemoryRegion, remote: &MemoryRegion, off: usize) -> SendWr {
    SendWr::write(
        id,
        &[local.sge(off, 64)],
        remote.addr() + off as u64,
        remote.rkey(),
    )
}

#[test]
fn held_posts_go_out_at_push_in_order() {
    let (c, _s, local, remote) = settled_pair();
    let data = pattern(256, 5);
    local.write_at(0, &data);
    for i in 0..4usize {
        c.qp.post_send_held(&[write(i as u64 + 1, &local, &remote, i * 64)])
            .unwrap();
    }
    // A Write completes when it is sent: held, none is.
    assert!(c.cq.is_empty(), "a held post was sent before the push");
    c.qp.push();
    let ids: Vec<u64> = (0..4)
        .map(|_| {
            let wc = wait(&c.cq);
            assert_eq!(wc.status, WcStatus::Success);
            wc.wr_id
        })
        .collect();
    assert_eq!(ids, [1, 2, 3, 4]);
    // Read back through the connection: the Writes landed before it.
    let back = c.pd.alloc_mr(256, Access::LOCAL_WRITE).unwrap();
    c.qp.post_send(&SendWr::read(
        9,
        back.sge_all(),
        remote.addr(),
        remote.rkey(),
    ))
    .unwrap();
    assert_eq!(wait(&c.cq).status, WcStatus::Success);
    assert!(back.to_vec() == data);
}

#[test]
fn a_post_that_transmits_takes_the_held_ones_first() {
    let (c, _s, local, remote) = settled_pair();
    local.write_at(0, &pattern(192, 6));
    c.qp.post_send_held(&[write(1, &local, &remote, 0)])
        .unwrap();
    c.qp.post_send_held(&[write(2, &local, &remote, 64)])
        .unwrap();
    assert!(c.cq.is_empty(), "a held post was sent before the push");
    c.qp.post_send(&write(3, &local, &remote, 128)).unwrap();
    let ids: Vec<u64> = (0..3).map(|_| wait(&c.cq).wr_id).collect();
    assert_eq!(ids, [1, 2, 3]);
}

/// The C ABI's event thread sleeps in `next_event` and is woken when posts
/// start being held, to look for ones held too long: a wake-up ends the
/// wait at once, and one given before the wait is kept for it (else a
/// hold that raced the thread's choice of timeout went unwatched).
#[test]
fn a_woken_event_waiter_returns_and_a_wakeup_is_kept() {
    let dev = Device::open_default().unwrap();
    let long = std::time::Duration::from_secs(30);
    // Given before the wait: kept.
    dev.wake_event_waiter();
    let t0 = std::time::Instant::now();
    assert!(dev.next_event(long).is_none());
    assert!(t0.elapsed() < long / 2, "the kept wake-up was lost");
    // Given during the wait.
    let d = dev.clone();
    let waiter = std::thread::spawn(move || {
        let t0 = std::time::Instant::now();
        let ev = d.next_event(long);
        (ev.is_none(), t0.elapsed())
    });
    // Whether the waiter is already waiting or not yet: one wake-up ends
    // its wait (a kept one, if it comes before).
    dev.wake_event_waiter();
    let (none, took) = waiter.join().unwrap();
    assert!(none && took < long / 2, "the waiter slept on: {took:?}");
}
