//! Issue 32: values up to 64 MiB (`proto::MAX_VALUE`) through the native
//! client and the RESP door, on real processes over loopback TCP.
//!
//! A message over 64 KiB travels by rendezvous (`net/link/rendezvous.rs`):
//! the client lends its request and the primary pulls it with RDMA Reads,
//! the secondary pulls the replicated write from the primary the same way,
//! and readers fetch the object with one-sided Reads. Checked here: every
//! size, from one that still goes as Sends to the largest, reads back
//! byte for byte from a client that knows nothing (one-sided), and from
//! the secondary once the primary is killed with `kill -9` (so the
//! secondary held the bytes it pulled before the writes were
//! acknowledged); the door takes `SET`, `GET`, `APPEND`, `STRLEN` and
//! `GETRANGE` of such values; one byte over the limit gets a clear error
//! and changes nothing.

use std::time::{Duration, Instant};

use softrdma_store::net::client::{ClientError, StoreClient};
use softrdma_store::proto::MAX_VALUE;

mod common;
use common::pattern;
use common::resp::Conn;
use common::store::{client_config, wait_for, Group};

/// `GET key` over RESP: the bulk's bytes (`None` for a nil).
fn door_get(c: &mut Conn, key: &[u8]) -> Option<Vec<u8>> {
    let r = c.call(&[b"GET", key]);
    if r == b"$-1\r\n" {
        return None;
    }
    let head = r.iter().position(|&b| b == b'\n').expect("a bulk") + 1;
    let len: usize = std::str::from_utf8(&r[1..head - 2])
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(r.len(), head + len + 2, "one whole bulk");
    Some(r[head..head + len].to_vec())
}

fn door(port: u16) -> Conn {
    let mut c = Conn::new(port);
    c.s.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    assert_eq!(c.cmd(&format!("AUTH {}", common::STORE_SECRET)), b"+OK\r\n");
    c
}

#[test]
fn values_up_to_the_limit_read_back_everywhere_and_survive_a_failover() {
    // The new primary goes on alone after the kill.
    let mut g = Group::with_options(
        "large",
        "320MiB",
        None,
        "min_in_sync_replicas = 0",
        true,
        "",
    );
    let sizes = [40 << 10, (64 << 10) + 1, 1 << 20, 16 << 20, MAX_VALUE];
    let epoch = g.epoch();
    let key = |i: usize| format!("big-{i}").into_bytes();
    let mut a = StoreClient::new(client_config(&g.addrs)).unwrap();
    for (i, &n) in sizes.iter().enumerate() {
        let v = pattern(n, i as u64);
        let t = Instant::now();
        a.set(&key(i), &v).unwrap();
        eprintln!(
            "native put of {n} bytes acknowledged after {:?}",
            t.elapsed()
        );
    }
    // One byte too many: a clear error, nothing sent.
    match a.set(b"too-big", &vec![1u8; MAX_VALUE + 1]) {
        Err(ClientError::ValueTooLarge { len, max }) => {
            assert_eq!((len, max), (MAX_VALUE + 1, MAX_VALUE))
        }
        r => panic!("a value over the limit: {r:?}"),
    }

    // The door: a 3 MiB SET, then APPEND, STRLEN and GETRANGE on it.
    let p = g.primary() as usize - 1;
    let mut c = door(g.resp[p]);
    let mut v = pattern(3 << 20, 77);
    assert_eq!(c.call(&[b"SET", b"door-big", &v]), b"+OK\r\n");
    let tail = pattern((512 << 10) + 3, 78);
    v.extend_from_slice(&tail);
    assert_eq!(
        c.call(&[b"APPEND", b"door-big", &tail]),
        format!(":{}\r\n", v.len()).into_bytes()
    );
    assert_eq!(
        c.call(&[b"STRLEN", b"door-big"]),
        format!(":{}\r\n", v.len()).into_bytes()
    );
    let from = v.len() - 10;
    let mut want = b"$10\r\n".to_vec();
    want.extend_from_slice(&v[from..]);
    want.extend_from_slice(b"\r\n");
    assert_eq!(
        c.call(&[b"GETRANGE", b"door-big", from.to_string().as_bytes(), b"-1"]),
        want
    );
    assert!(door_get(&mut c, b"door-big") == Some(v.clone()));
    let over = vec![b'x'; MAX_VALUE + 1];
    assert_eq!(
        c.call(&[b"SET", b"door-too-big", &over]),
        format!(
            "-ERR value of {} bytes exceeds the limit of {MAX_VALUE} bytes\r\n",
            MAX_VALUE + 1
        )
        .into_bytes()
    );
    assert_eq!(door_get(&mut c, b"door-too-big"), None);

    // A client that knows nothing reads every value one-sided.
    let mut b = StoreClient::new(client_config(&g.addrs)).unwrap();
    // It finds the primary first (its first target may be the secondary,
    // which turns one-sided reads away: one read answered by a node).
    assert_eq!(b.get(b"absent").unwrap(), None);
    let s0 = b.stats();
    for (i, &n) in sizes.iter().enumerate() {
        let t = Instant::now();
        let got = b.get(&key(i)).unwrap();
        assert!(got == Some(pattern(n, i as u64)), "value {i} ({n} bytes)");
        eprintln!("one-sided get of {n} bytes took {:?}", t.elapsed());
    }
    let s = b.stats();
    assert_eq!(
        (
            s.keyed_one_sided - s0.keyed_one_sided,
            s.server_reads - s0.server_reads
        ),
        (sizes.len() as u64, 0),
        "{s0:?} then {s:?}"
    );
    // None of it cost the primary its lease (a node loop busy copying a
    // value for longer than the peers' heartbeat timeout would).
    assert_eq!(
        g.epoch(),
        epoch,
        "the group failed over during the large writes"
    );
    let st = g.status();
    assert!(
        st.len() == 2 && st.iter().all(|s| s.keys == sizes.len() as u64 + 1),
        "both nodes hold every key: {st:?}"
    );

    // kill -9 the primary: the secondary serves the same bytes.
    g.nodes[p].kill();
    let mut cs = door(g.resp[1 - p]);
    let (_, took) = wait_for("a new primary", Duration::from_secs(20), || {
        match cs.cmd("SET probe x").as_slice() {
            b"+OK\r\n" => Ok(()),
            r => Err(String::from_utf8_lossy(r).into_owned()),
        }
    });
    eprintln!("the secondary took writes {took:?} after the kill");
    let mut n = StoreClient::new(client_config(&g.addrs)).unwrap();
    for (i, &len) in sizes.iter().enumerate() {
        let got = n.get(&key(i)).unwrap();
        assert!(
            got == Some(pattern(len, i as u64)),
            "value {i} ({len} bytes) after the failover"
        );
    }
    assert!(
        door_get(&mut cs, b"door-big") == Some(v),
        "the door's value after the failover"
    );
    // And the new primary takes large writes alone.
    let w = pattern(MAX_VALUE, 99);
    assert_eq!(cs.call(&[b"SET", b"after", &w]), b"+OK\r\n");
    assert!(n.get(b"after").unwrap() == Some(w));
}

/// Forty 1 MiB keys, each read back after every put, through cached
/// pointers and after the cache is dropped (bucket, then object); then
/// all of them in one batched get.
#[test]
fn many_large_keys_read_back_with_and_without_cached_pointers() {
    let g = Group::new("large-many", "256MiB");
    let mut a = StoreClient::new(client_config(&g.addrs)).unwrap();
    let key = |i: usize| format!("b0:{i}").into_bytes();
    let values: Vec<Vec<u8>> = (0..40).map(|i| pattern(1 << 20, i as u64)).collect();
    for (i, v) in values.iter().enumerate() {
        a.set(&key(i), v).unwrap();
        for how in ["cached", "uncached"] {
            if how == "uncached" {
                a.clear_cache();
            }
            for (j, want) in values[..=i].iter().enumerate() {
                let got = a.get(&key(j)).unwrap();
                assert!(
                    got.as_ref() == Some(want),
                    "after put {i}: key {j} ({how}) {:?}",
                    got.map(|g| g.len())
                );
            }
        }
    }
    // Batched (`get_many`: the objects' Reads scattered side by side), the
    // large keys with a small one and an absent one, through cached
    // pointers and after the cache is dropped; none asks the node.
    a.set(b"small", b"tiny").unwrap();
    let names: Vec<Vec<u8>> = (0..40)
        .map(key)
        .chain([b"small".to_vec(), b"absent".to_vec()])
        .collect();
    let refs: Vec<&[u8]> = names.iter().map(|k| k.as_slice()).collect();
    for how in ["cached", "uncached"] {
        if how == "uncached" {
            a.clear_cache();
        }
        let s0 = a.stats();
        let got = a.get_many(&refs);
        for (j, want) in values.iter().enumerate() {
            assert!(
                got[j].as_ref().unwrap().as_ref() == Some(want),
                "key {j} in a batch ({how})"
            );
        }
        assert_eq!(got[40].as_ref().unwrap().as_deref(), Some(&b"tiny"[..]));
        assert_eq!(got[41].as_ref().unwrap(), &None);
        let s = a.stats();
        assert_eq!(
            (
                s.keyed_one_sided - s0.keyed_one_sided,
                s.server_reads - s0.server_reads
            ),
            (42, 0),
            "{how}: {s0:?} then {s:?}"
        );
    }
}

/// Large objects by pointer (`alloc`, `read_ptr`, `read_ptrs`): read
/// one-sided, alone and in a batch, their Read scattered so that the
/// value lands in the vector returned (`client/reader.rs`, `SPLIT_MIN`),
/// at sizes either side of the split; a pointer whose space was freed and
/// taken by another object is refused, never answered with the other
/// object's bytes.
#[test]
fn large_objects_by_pointer_read_back_one_sided() {
    let g = Group::new("large-ptr", "256MiB");
    let mut a = StoreClient::new(client_config(&g.addrs)).unwrap();
    let sizes = [(64 << 10) - 200, 64 << 10, (1 << 20) + 3, 4 << 20];
    let mut ptrs = Vec::new();
    for (i, &n) in sizes.iter().enumerate() {
        ptrs.push(a.alloc(&pattern(n, i as u64)).unwrap());
    }
    // Reads from a client that knows nothing go one-sided once it has
    // found the primary.
    let mut b = StoreClient::new(client_config(&g.addrs)).unwrap();
    assert_eq!(b.get(b"absent").unwrap(), None);
    let s0 = b.stats();
    for round in 0..2 {
        for (i, (&n, &p)) in sizes.iter().zip(&ptrs).enumerate() {
            let got = b.read_ptr(p).unwrap();
            assert!(got == pattern(n, i as u64), "{n} bytes, round {round}");
        }
    }
    // Together: one batch of Reads, small and scattered ones side by side.
    for (i, got) in b.read_ptrs(&ptrs).into_iter().enumerate() {
        assert!(
            got.unwrap() == pattern(sizes[i], i as u64),
            "{i} in a batch"
        );
    }
    let s = b.stats();
    assert_eq!(
        (
            s.one_sided_reads - s0.one_sided_reads,
            s.server_reads - s0.server_reads
        ),
        (3 * sizes.len() as u64, 0),
        "{s0:?} then {s:?}"
    );
    // The largest freed, and its space taken by another object of its
    // size: the old pointer names another generation.
    let old = ptrs[3];
    a.free(old).unwrap();
    let new = a.alloc(&pattern(4 << 20, 77)).unwrap();
    assert!(b.read_ptr(new).unwrap() == pattern(4 << 20, 77));
    match b.read_ptr(old) {
        Err(ClientError::Store(e)) => eprintln!("the freed pointer: {e}"),
        r => panic!(
            "a freed pointer answered {:?} (new object at {new}, old at {old})",
            r.map(|v| v.len())
        ),
    }
}
