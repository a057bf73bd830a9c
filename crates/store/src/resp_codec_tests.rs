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

/// The requests `d` decodes from `stream` fed `step` bytes at a time (as
/// a connection delivers it), giving each request's arguments back when
/// `recycle` (as the door's event loop does); and the bytes left over.
fn decode_in_pieces(
    d: &mut Decoder,
    stream: &[u8],
    step: usize,
    recycle: bool,
) -> (Vec<Vec<Vec<u8>>>, usize) {
    let mut got = Vec::new();
    let mut buf: Vec<u8> = Vec::new();
    for piece in stream.chunks(step) {
        buf.extend_from_slice(piece);
        while let Some((a, used)) = d.decode(&buf).unwrap() {
            if recycle {
                got.push(a.clone());
                d.recycle(a);
            } else {
                got.push(a);
            }
            buf.drain(..used);
        }
    }
    (got, buf.len())
}

/// Up to `reqs` requests of up to `args` arguments of up to `len` bytes.
fn requests(len: usize, args: usize, reqs: usize) -> impl Strategy<Value = Vec<Vec<Vec<u8>>>> {
    let arg = prop::collection::vec(any::<u8>(), 0..len);
    prop::collection::vec(prop::collection::vec(arg, 1..args), 1..reqs)
}

/// `reqs` as a client sends them, one after the other.
fn stream_of(reqs: &[Vec<Vec<u8>>]) -> Vec<u8> {
    reqs.iter().flat_map(|r| multibulk(r)).collect()
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
        parse(b"set k \"a b\\x41\\n\" 'it\\'s' 'a\\b' \"\\x\" \"\\xZ1\"\n")
            .unwrap()
            .unwrap()
            .0,
        vec![
            b"set".to_vec(),
            b"k".to_vec(),
            b"a bA\n".to_vec(),
            b"it's".to_vec(),
            b"a\\b".to_vec(),
            b"x".to_vec(),
            b"xZ1".to_vec()
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
    // An argument longer than MAX_BULK, or one that would take the
    // request past MAX_REQUEST, is refused on its length line, before its
    // bytes arrive.
    assert!(parse(format!("*1\r\n${}\r\n", MAX_BULK + 1).as_bytes()).is_err());
    let mut big = b"*40\r\n".to_vec();
    for _ in 0..(MAX_REQUEST / MAX_BULK - 1) {
        big.extend_from_slice(format!("${MAX_BULK}\r\n").as_bytes());
        big.resize(big.len() + MAX_BULK, b'v');
        big.extend_from_slice(b"\r\n");
    }
    let cut = big.len();
    big.extend_from_slice(format!("${MAX_BULK}\r\n").as_bytes());
    assert_eq!(parse(&big[..cut]).unwrap(), None);
    assert_eq!(parse(&big), Err(RespError::TooBig));
    // An inline line that does end, but past MAX_INLINE.
    let mut long = vec![b'a'; MAX_INLINE + 1];
    long.push(b'\n');
    assert!(parse(&long).is_err());
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

#[test]
fn resp3_types_and_their_resp2_forms() {
    let r = Reply::Array(vec![
        Reply::Map(vec![(Reply::text("a"), Reply::Int(1))]),
        Reply::Set(vec![Reply::text("x")]),
        Reply::Bool(true),
        Reply::Nil,
        Reply::NilArray,
        Reply::Verbatim(b"k:v\r\n".to_vec()),
    ]);
    let (mut two, mut three) = (Vec::new(), Vec::new());
    r.encode_as(Proto::Resp2, &mut two);
    r.encode_as(Proto::Resp3, &mut three);
    assert_eq!(
        String::from_utf8(two).unwrap(),
        "*6\r\n*2\r\n$1\r\na\r\n:1\r\n*1\r\n$1\r\nx\r\n:1\r\n$-1\r\n*-1\r\n$5\r\nk:v\r\n\r\n"
    );
    assert_eq!(
        String::from_utf8(three).unwrap(),
        "*6\r\n%1\r\n$1\r\na\r\n:1\r\n~1\r\n$1\r\nx\r\n#t\r\n_\r\n_\r\n=9\r\ntxt:k:v\r\n\r\n"
    );
}

proptest! {
    /// Any request, cut anywhere: incomplete until the last byte, then
    /// whole; the bytes used are exactly the request's.
    #[test]
    fn split_anywhere_then_whole(
        args in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 1..6),
        extra in prop::collection::vec(any::<u8>(), 0..10),
        step in 1usize..50,
    ) {
        let b = multibulk(&args);
        for cut in 0..b.len() {
            prop_assert_eq!(parse(&b[..cut]), Ok(None), "cut {}", cut);
        }
        let mut more = b.clone();
        more.extend(&extra);
        prop_assert_eq!(parse(&more), Ok(Some((args.clone(), b.len()))));
        // The same bytes arriving in pieces through one decoder (it goes
        // on where it stopped): the same request, then the next.
        let mut stream = b.clone();
        stream.extend(multibulk(&[b"PING".to_vec()]));
        // And through a decoder that gathers long arguments apart (as the
        // door's does from 64 KiB, here from 8 bytes).
        for mut d in [Decoder::default(), Decoder::gathering_from(8)] {
            let (got, left) = decode_in_pieces(&mut d, &stream, step, false);
            prop_assert_eq!(left, 0);
            prop_assert_eq!(got, vec![args.clone(), vec![b"PING".to_vec()]]);
        }
    }

    /// Requests decoded by one decoder whose used arguments are given
    /// back each time ([`Decoder::recycle`], as the door's event loop
    /// does): each the same as a fresh decoder's, nothing of an earlier
    /// one left in a reused buffer.
    #[test]
    fn recycled_arguments_carry_nothing_over(
        reqs in requests(700, 12, 8),
        step in 1usize..300,
        gather in prop::option::of(1usize..700),
    ) {
        let stream = stream_of(&reqs);
        let mut d = gather.map_or_else(Decoder::default, Decoder::gathering_from);
        let (got, left) = decode_in_pieces(&mut d, &stream, step, true);
        prop_assert_eq!(left, 0);
        prop_assert!(d.spare.len() <= SPARE);
        prop_assert!(d.spare.iter().all(|a| a.capacity() <= SPARE_LEN));
        prop_assert_eq!(got, reqs);
    }

    /// Inline lines fed in pieces: the same as in one buffer.
    #[test]
    fn inline_in_pieces(words in prop::collection::vec("[a-z]{1,8}", 1..5), step in 1usize..7) {
        let line = format!("{}\r\n", words.join(" "));
        let mut d = Decoder::default();
        let mut buf: Vec<u8> = Vec::new();
        let mut got = None;
        for piece in line.as_bytes().chunks(step) {
            prop_assert!(got.is_none());
            buf.extend_from_slice(piece);
            got = d.decode(&buf).unwrap();
        }
        let want: Vec<Vec<u8>> = words.iter().map(|w| w.as_bytes().to_vec()).collect();
        prop_assert_eq!(got, Some((want, line.len())));
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
        // In pieces, through a decoder that gathers arguments apart.
        let mut d = Decoder::gathering_from(4);
        for cut in 1..=b.len() {
            match d.decode(&b[..cut]) {
                Ok(Some((_, used))) => {
                    prop_assert!(used <= cut);
                    break;
                }
                Ok(None) => {}
                Err(_) => break,
            }
        }
    }
}

#[test]
fn key_slots_are_redis_clusters() {
    // CRC16/XMODEM's check value, and slots as Redis Cluster gives them
    // (`redis-cli -c set foo bar` is redirected to slot 12182).
    assert_eq!(crc16(b"123456789"), 0x31c3);
    assert_eq!(key_slot(b"foo"), 12182);
    assert_eq!(key_slot(b"{foo}.bar"), 12182);
    assert_eq!(key_slot(b"x{foo}"), 12182);
    // An empty tag is no tag: the whole key counts.
    assert_eq!(key_slot(b"{}foo"), crc16(b"{}foo") & 0x3fff);
    assert!(key_slot(b"") < 16384);
}

proptest! {
    /// Requests whose long arguments are gathered apart ([`FILL_MIN`],
    /// here 40 bytes), fed a step at a time, with what
    /// [`Decoder::bulk_room`] misses read straight into its room (as the
    /// door reads a large value) or appended to the input like the rest:
    /// the same requests as decoded whole, and what goes into the room
    /// never runs past its argument's CRLF.
    #[test]
    fn long_arguments_gathered_apart_decode_as_whole_ones(
        reqs in requests(300, 4, 5),
        step in 1usize..60,
        into_room in any::<bool>(),
        bad in any::<bool>(),
    ) {
        let mut stream = stream_of(&reqs);
        // A wrong terminator on the last long argument, if asked: refused.
        let long_end = reqs.last().unwrap().last().filter(|a| a.len() >= 40).map(|_| stream.len() - 2);
        if let (true, Some(at)) = (bad, long_end) {
            stream[at] = b'x';
        }
        let mut d = Decoder::gathering_from(40);
        let (mut buf, mut fed, mut got, mut gathered) = (Vec::new(), 0, Vec::new(), 0);
        let mut refused = false;
        'feed: while fed < stream.len() {
            let n = step.min(stream.len() - fed);
            match d.bulk_room() {
                Some((arg, missing)) if into_room => {
                    prop_assert!(missing > 0);
                    let n = n.min(missing);
                    arg.extend_from_slice(&stream[fed..fed + n]);
                    fed += n;
                    gathered += n;
                }
                _ => {
                    buf.extend_from_slice(&stream[fed..fed + n]);
                    fed += n;
                }
            }
            loop {
                match d.decode(&buf) {
                    Ok(Some((a, used))) => {
                        got.push(a);
                        buf.drain(..used);
                    }
                    Ok(None) => break,
                    Err(e) => {
                        prop_assert_eq!(e, RespError::BadTerminator);
                        refused = true;
                        break 'feed;
                    }
                }
            }
        }
        if bad && long_end.is_some() {
            prop_assert!(refused);
            prop_assert_eq!(&got[..], &reqs[..reqs.len() - 1]);
        } else {
            prop_assert!(!refused);
            prop_assert_eq!(&got, &reqs);
            prop_assert!(buf.is_empty());
        }
        // Long arguments fed a step at a time go through the room.
        let long = reqs.iter().flatten().any(|a| a.len() > 100) && step < 20 && into_room;
        prop_assert!(!long || gathered > 0 || refused);
    }
}

/// A 1 MiB `SET` value gathered apart ([`Decoder::bulk_room`]): after
/// the bytes before it and some of it arrived, its room misses the rest
/// and the CRLF; read there, the request is whole and its value is the
/// one sent.
#[test]
fn a_large_value_is_read_into_its_own_room() {
    let value: Vec<u8> = (0..1u32 << 20).map(|i| (i % 251) as u8).collect();
    let req = multibulk(&[b"SET".to_vec(), b"k".to_vec(), value.clone()]);
    let mut d = Decoder::default();
    let head = req.len() - value.len() - 2;
    assert_eq!(d.decode(&req[..head - 3]).unwrap(), None);
    assert!(d.bulk_room().is_none(), "the bulk's header is not whole");
    assert_eq!(d.decode(&req[..head + 1000]).unwrap(), None);
    let (room, missing) = d.bulk_room().expect("a room");
    assert_eq!((room.len(), missing), (1000, value.len() - 1000 + 2));
    room.extend_from_slice(&req[head + 1000..]);
    let (args, used) = d.decode(&req[..head + 1000]).unwrap().expect("whole");
    assert_eq!(used, head + 1000);
    assert_eq!(args[2], value);
    assert!(d.bulk_room().is_none());
}
