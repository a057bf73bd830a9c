//! Links over real TCP on loopback: messages of every size arrive whole
//! and in order; large ones are pulled, not sent; a malformed pull ends
//! the link and delivers nothing.

use super::rendezvous::{FLAG_PULL, PULL_HEAD};
use super::*;

const T: Duration = Duration::from_secs(20);

/// An endpoint and its end of a link.
type End = (Arc<Endpoint>, Arc<Link>);

/// Two endpoints and a link between them: (sender's, receiver's).
fn pair() -> (End, End) {
    let a = Endpoint::open("link-test-a").unwrap();
    let b = Endpoint::open("link-test-b").unwrap();
    let listener = b.device().listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let b2 = b.clone();
    let acceptor = std::thread::spawn(move || {
        let req = listener.get_request_timeout(T).unwrap().expect("a request");
        let link = b2.new_link().unwrap();
        req.accept(link.qp(), &ConnParams::default()).unwrap();
        b2.activate(&link).unwrap();
        link
    });
    let (la, _) = a.connect(addr, b"", T).unwrap();
    let lb = acceptor.join().unwrap();
    ((a, la), (b, lb))
}

/// Bytes that differ at every offset, by seed.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

/// Polls `ep` until `want` frames arrived or a link went down, while
/// another thread, as `other`'s owner, runs its links (the lender answers
/// the Reads of a pull and takes the close).
fn receive(ep: &Endpoint, other: &Arc<Endpoint>, want: usize) -> (Vec<Vec<u8>>, bool) {
    let stop = Arc::new(AtomicBool::new(false));
    let owner = {
        let (other, stop) = (other.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                other.poll(&mut Vec::new());
                other.wait(Duration::from_millis(5));
            }
        })
    };
    let (mut got, mut down) = (Vec::new(), false);
    let until = Instant::now() + T;
    let mut evs = Vec::new();
    while got.len() < want && !down && Instant::now() < until {
        ep.poll(&mut evs);
        for e in evs.drain(..) {
            match e {
                LinkEvent::Frame { bytes, .. } => got.push(bytes.to_vec()),
                LinkEvent::Down { .. } => down = true,
            }
        }
        if got.len() < want && !down {
            // Over TCP only a wait learns of the socket's input.
            ep.wait(Duration::from_millis(100));
        }
    }
    stop.store(true, Ordering::Release);
    owner.join().unwrap();
    (got, down)
}

#[test]
fn messages_of_every_size_arrive_whole_and_in_order_and_large_ones_are_pulled() {
    let ((a, la), (b, lb)) = pair();
    let sizes = [
        1,
        MAX_FRAME - 1,
        MAX_FRAME,
        40 << 10,
        EAGER_MAX,
        EAGER_MAX + 1,
        3,
        1 << 20,
        16 << 20,
        crate::proto::MAX_VALUE + 4096,
        7,
    ];
    let msgs: Vec<Vec<u8>> = sizes
        .iter()
        .enumerate()
        .map(|(i, &n)| pattern(n, i as u64 + 1))
        .collect();
    let sends_before = la.sends_posted();
    la.send_batch(msgs.iter().cloned().map(Outbound::from).collect(), T)
        .unwrap();
    let eager: u64 = sizes
        .iter()
        .filter(|&&n| n <= EAGER_MAX)
        .map(|&n| n.div_ceil(MAX_FRAME - 1) as u64)
        .sum();
    // The large messages took no Send of their own: only the eager ones'
    // fragments went as Sends (their advertisements carry 13 bytes each).
    assert_eq!(la.sends_posted() - sends_before, eager);
    let (got, down) = receive(&b, &a, msgs.len());
    assert!(!down, "the link went down after {} messages", got.len());
    assert_eq!(got.len(), msgs.len());
    for (i, (g, m)) in got.iter().zip(&msgs).enumerate() {
        assert!(g == m, "message {i} ({} bytes) differs", m.len());
    }
    // Each pulled message was closed by one Send of the receiver's, and
    // every lent buffer came back to the sender.
    let lent = sizes.iter().filter(|&&n| n > EAGER_MAX).count() as u64;
    assert_eq!(lb.sends_posted(), lent);
    let until = Instant::now() + T;
    while la.lent() > 0 && Instant::now() < until {
        a.poll(&mut Vec::new());
        a.wait(Duration::from_millis(100));
    }
    assert_eq!(la.lent(), 0, "lent messages not given back");
    for n in [1usize << 20, 16 << 20, 64 << 20] {
        let m = pattern(n, 3);
        let t = Instant::now();
        la.send_owned(m, T).unwrap();
        let (got, _) = receive(&b, &a, 1);
        eprintln!("{n} bytes pulled in {:?}", t.elapsed());
        assert_eq!(got.len(), 1);
    }
    // And the other way, from a borrowed buffer.
    let back = pattern(2 << 20, 99);
    lb.send(&back, T).unwrap();
    let (got, down) = receive(&a, &b, 1);
    assert!(!down && got == vec![back]);
}

/// A message lent as a gather list (its own bytes, a shared value where
/// it lies, more bytes) is pulled as their concatenation, in its place
/// among eager ones; once the peer closes it, the link holds the shared
/// value no more.
#[test]
fn a_gathered_message_is_pulled_whole_and_its_shared_value_let_go() {
    use crate::proto::{Bytes, Piece};
    let ((a, la), (b, _lb)) = pair();
    let value = Bytes::from(pattern(3 << 20, 11));
    let msg = Outbound::Pieces(vec![
        Piece::Own(pattern(300, 12)),
        Piece::Shared(value.clone()),
        Piece::Own(pattern(5, 13)),
    ]);
    let mut whole = pattern(300, 12);
    whole.extend_from_slice(&value);
    whole.extend_from_slice(&pattern(5, 13));
    la.send_batch(vec![pattern(10, 1).into(), msg, pattern(20, 2).into()], T)
        .unwrap();
    let (got, down) = receive(&b, &a, 3);
    assert!(!down);
    assert!(
        got == vec![pattern(10, 1), whole, pattern(20, 2)],
        "pieces or order differ"
    );
    let until = Instant::now() + T;
    while la.lent() > 0 && Instant::now() < until {
        a.poll(&mut Vec::new());
        a.wait(Duration::from_millis(100));
    }
    assert_eq!(la.lent(), 0, "the lent message was not given back");
    assert!(value.is_unique(), "the link still holds the shared value");
}

/// Advertises `body` with a pull head of the given length and flags.
fn advertise_raw(ep: &Endpoint, l: &Link, body: Vec<u8>, len: u64, flags: u32) -> MemoryRegion {
    let n = body.len();
    let mr = ep.pd().register(body, Access::LOCAL_READ).unwrap();
    let mut head = vec![FLAG_PULL];
    head.extend_from_slice(&len.to_le_bytes());
    head.extend_from_slice(&flags.to_le_bytes());
    assert_eq!(head.len(), 1 + PULL_HEAD);
    l.qp()
        .advertise(1, &[mr.sge(0, n)], Access::REMOTE_READ, &head, 0)
        .unwrap();
    mr
}

/// Lends `body_len` bytes under a pull head claiming `claimed` bytes with
/// `flags`: the receiver must end the link and deliver nothing.
fn assert_pull_refused(body_len: usize, claimed: u64, flags: u32) {
    let ((a, la), (b, _lb)) = pair();
    let body = pattern(body_len, body_len as u64);
    let _mr = advertise_raw(&a, &la, body, claimed, flags);
    let (got, down) = receive(&b, &a, 1);
    assert!(
        got.is_empty() && down,
        "got {} frames, down {down}",
        got.len()
    );
}

#[test]
fn a_pull_with_flags_this_link_does_not_know_ends_the_link_and_delivers_nothing() {
    assert_pull_refused(1 << 20, 1 << 20, 1);
}

#[test]
fn a_pull_of_a_length_sends_would_carry_ends_the_link() {
    assert_pull_refused(100, 100, 0);
}

#[test]
fn a_pull_longer_than_the_advertised_memory_ends_the_link() {
    // Claims 2 MiB over 1 MiB: the Reads past the end are refused by the
    // sender's engine.
    assert_pull_refused(1 << 20, 2 << 20, 0);
}

proptest::proptest! {
    /// A pull head is taken exactly when it has its 12 bytes, no flags, an
    /// advertised STag and a length Sends would not carry, within the
    /// largest message; anything else ends the link.
    #[test]
    fn pull_heads_are_taken_only_when_well_formed(
        len in proptest::prop_oneof![0u64..(2 * EAGER_MAX as u64), 0u64..(2 * crate::proto::MAX_MESSAGE as u64), proptest::num::u64::ANY],
        flags in proptest::prop_oneof![proptest::strategy::Just(0u32), proptest::num::u32::ANY],
        cut in 0usize..14,
        stag in proptest::option::of(proptest::num::u32::ANY),
    ) {
        let mut head = len.to_le_bytes().to_vec();
        head.extend_from_slice(&flags.to_le_bytes());
        head.push(0);
        let head = &head[..cut.min(head.len())];
        let wc = WorkCompletion {
            advertised_stag: stag.map(softrdma_verbs::Rkey::from_raw),
            ..Default::default()
        };
        let ok = head.len() == PULL_HEAD
            && flags == 0
            && stag.is_some()
            && len > EAGER_MAX as u64
            && len <= crate::proto::MAX_MESSAGE as u64;
        proptest::prop_assert_eq!(super::Pull::parse(3, &wc, head).is_some(), ok);
    }
}
