//! The RESP codec: requests as clients send them, split anywhere; errors
//! for what is not RESP; no panic on anything.

use super::*;
use proptest::prelude::*;

/// A request as a client library encodes it.
fn multibulk(args: &[Vec<u8>]) -> Vec<u8> {
    let mut b = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        b.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
        b.extend_from_slice(a);
        b.extend_from_slice(b"\r\n");
    }
    b
}

fn words(s: &[&str]) -> Vec<Vec<u8>> {
    s.iter().map(|w| w.as_bytes().to_vec()).collect()
}

#[test]
fn requests_as_clients_send_them() {
    let b = multibulk(&words(&["SET", "key", "va\r\nlue"]));
    assert_eq!(
        parse(&b).unwrap(),
        Some((words(&["SET", "key", "va\r\nlue"]), b.len()))
    );
    // Two pipelined: the first, then the second.
    let mut two = b.clone();
    two.extend(multibulk(&words(&["GET", "key"])));
    let (args, used) = parse(&two).unwrap().unwrap();
    assert_eq!((args.len(), used), (3, b.len()));
    assert_eq!(
        parse(&two[used..]).unwrap().unwrap().0,
        words(&["GET", "key"])
    );
    // Inline, as typed over telnet, with Redis's quoting.
    assert_eq!(parse(b"PING\r\n").unwrap(), Some((words(&["PING"]), 6)));
    assert_eq!(
        parse(b"set k \"a b\\x41\\n\" 'it''s'\n")
            .unwrap()
            .unwrap()
            .0,
        vec![
            b"set".to_vec(),
            b"k".to_vec(),
            b"a bA\n".to_vec(),
            b"it's".to_vec()
        ]
    );
    assert_eq!(parse(b"\r\n").unwrap(), Some((vec![], 2)));
    assert_eq!(parse(b"*0\r\n").unwrap(), Some((vec![], 4)));
    assert_eq!(parse(b"*-1\r\n").unwrap(), Some((vec![], 5)));
}

#[test]
fn what_is_not_resp_is_refused() {
    for bad in [
        &b"*x\r\n"[..],
        b"*2\r\n:1\r\n",
        b"*1\r\n$-5\r\n",
        b"*1\r\n$3\r\nabcd\r\n",
        b"*99999999999\r\n",
        b"*1\r\n$99999999999\r\n",
        b"*1\r\n$1\r\na\r\r",
        b"get \"unbalanced\n",
        b"get \"a\"b\n",
    ] {
        assert!(parse(bad).is_err(), "{:?}", String::from_utf8_lossy(bad));
    }
    // A header line that never ends is refused once it is too long to be
    // one; an inline line, once longer than MAX_INLINE.
    assert!(parse(&[b'*'; 40]).is_err());
    assert!(parse(&vec![b'a'; MAX_INLINE + 1]).is_err());
    assert_eq!(parse(&[b'a'; 100]).unwrap(), None);
    // A huge count in a few bytes reserves nothing: it waits for bytes.
    assert_eq!(parse(b"*1000000\r\n$1\r\n").unwrap(), None);
}

#[test]
fn replies_encode_as_redis_does() {
    let mut out = Vec::new();
    Reply::Array(vec![
        Reply::ok(),
        Reply::err("ERR no\r\nway"),
        Reply::Int(-3),
        Reply::Bulk(b"x\r\n".to_vec()),
        Reply::Nil,
    ])
    .encode(&mut out);
    assert_eq!(
        out,
        b"*5\r\n+OK\r\n-ERR no  way\r\n:-3\r\n$3\r\nx\r\n\r\n$-1\r\n".to_vec()
    );
}

proptest! {
    /// Any request, cut anywhere: incomplete until the last byte, then
    /// whole; the bytes used are exactly the request's.
    #[test]
    fn split_anywhere_then_whole(
        args in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..6),
        extra in prop::collection::vec(any::<u8>(), 0..10),
    ) {
        let b = multibulk(&args);
        for cut in 0..b.len() {
            prop_assert_eq!(parse(&b[..cut]), Ok(None), "cut {}", cut);
        }
        let mut more = b.clone();
        more.extend(&extra);
        prop_assert_eq!(parse(&more), Ok(Some((args, b.len()))));
    }

    #[test]
    fn garbage_never_panics(b in prop::collection::vec(any::<u8>(), 0..200)) {
        if let Ok(Some((_, used))) = parse(&b) {
            prop_assert!(used <= b.len() && used > 0);
        }
    }

    #[test]
    fn mutated_requests_never_panic(
        args in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..20), 1..4),
        at in any::<usize>(),
        v in any::<u8>(),
    ) {
        let mut b = multibulk(&args);
        let i = at % b.len();
        b[i] = v;
        if let Ok(Some((_, used))) = parse(&b) {
            prop_assert!(used <= b.len());
        }
    }
}
