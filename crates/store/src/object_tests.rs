//! The object format's tests: encoding, decoding (whole and in two
//! parts), writes in place and their checksums.

use super::*;
use crate::arena::HeapMemory;
use proptest::prelude::*;

/// The value written and checksummed piece by piece gives the bytes
/// the whole-value encoder gives, at every length around the pieces.
#[test]
fn a_value_written_in_pieces_is_the_object_the_encoder_makes() {
    for n in [0, 1, FUSED - 1, FUSED, FUSED + 1, 3 * FUSED + 5] {
        let data: Vec<u8> = (0..n).map(|i| (i * 7 + n) as u8).collect();
        let f = Fields {
            version: 3,
            generation: 5,
            key: b"some key",
            data: &data,
            deadline: 99,
        };
        let cap = (encoded_len(8, n) as u64).div_ceil(UNIT) * UNIT;
        let mut m = HeapMemory::new(cap + 64);
        write_object(&mut m, 64, cap, &f).unwrap();
        let mut want = vec![0u8; cap as usize];
        encode_into(&mut want, &f).unwrap();
        let mut got = vec![0u8; cap as usize];
        m.read(64, &mut got).unwrap();
        assert!(got == want, "{n} bytes");
        assert_eq!(read_object(&m, 64, cap).unwrap().data, data);
    }
}

/// An object read in two parts, split where its key ends, decodes as
/// it does whole; split anywhere else it is handed back to be joined;
/// its checks (checksum, exact length, empty) hold on the parts.
#[test]
fn an_object_in_two_parts_decodes_as_it_does_whole() {
    let data: Vec<u8> = (0..5000u32).map(|i| (i * 13) as u8).collect();
    let f = Fields {
        version: 4,
        generation: 9,
        key: b"parted",
        data: &data,
        deadline: 77,
    };
    let obj = encode(&f);
    let head = HEADER_LEN + 6;
    let (h, b) = obj.split_at(head);
    let whole = decode_exact(&obj).unwrap();
    let parts = decode_parts(h, b)
        .expect("split where the key ends")
        .unwrap();
    assert_eq!(
        (parts.key, parts.data, parts.version, parts.generation),
        (whole.key, whole.data, whole.version, whole.generation)
    );
    assert_eq!((parts.allocation, parts.deadline), (obj.len() as u64, 77));
    // A key of another length: not split where it ends.
    for at in [head - 1, head + 1] {
        let (h, b) = obj.split_at(at);
        assert!(decode_parts(h, b).is_none(), "split at {at}");
    }
    let (h, b) = obj.split_at(HEADER_LEN - 1);
    assert!(decode_parts(h, b).is_none(), "no whole header");
    // A value byte changed: torn.
    let mut bad = obj.clone();
    bad[head + 100] ^= 1;
    let (h, b) = bad.split_at(head);
    assert!(matches!(decode_parts(h, b), Some(Err(ObjectError::Torn))));
    // Fewer bytes than the allocation: the pointer named another.
    let (h, b) = obj[..obj.len() - UNIT as usize].split_at(head);
    assert!(matches!(
        decode_parts(h, b),
        Some(Err(ObjectError::WrongLength { .. }))
    ));
    let zero = vec![0u8; obj.len()];
    let (h, b) = zero.split_at(head);
    assert!(matches!(decode_parts(h, b), Some(Err(ObjectError::Empty))));
}

#[test]
fn round_trip_in_memory() {
    let mut m = HeapMemory::new(256);
    write_object(&mut m, 64, 128, &Fields::unkeyed(7, b"hello world")).unwrap();
    let o = read_object(&m, 64, 128).unwrap();
    assert_eq!((o.version, o.data), (7, b"hello world".to_vec()));
    // Overwrite in place with shorter data.
    write_object(&mut m, 64, 128, &Fields::unkeyed(8, b"bye")).unwrap();
    let o = read_object(&m, 64, 128).unwrap();
    assert_eq!((o.version, o.data), (8, b"bye".to_vec()));
    assert!(matches!(
        write_object(&mut m, 64, 128, &Fields::unkeyed(9, &[0; 81])),
        Err(ObjectError::TooBig {
            len: 81,
            capacity: 80
        })
    ));
    scrub(&mut m, 64).unwrap();
    assert_eq!(read_object(&m, 64, 128), Err(ObjectError::Empty));
    assert_eq!(decode(&[0; 10]), Err(ObjectError::Short { len: 10 }));
}

#[test]
fn a_read_of_another_length_than_the_allocation_is_refused() {
    let mut m = HeapMemory::new(512);
    write_object(&mut m, 0, 128, &Fields::unkeyed(4, b"hello")).unwrap();
    write_object(&mut m, 128, 64, &Fields::unkeyed(5, b"next")).unwrap();
    let mut buf = vec![0; 512];
    m.read(0, &mut buf).unwrap();
    assert_eq!(decode_exact(&buf[..128]).unwrap().data, b"hello");
    assert_eq!(decode_exact(&buf[..128]).unwrap().allocation, 128);
    // Issue 16, finding 5: a pointer longer (or shorter) than the
    // allocation used to get the object back.
    for len in [64, 192, 256] {
        assert_eq!(
            decode_exact(&buf[..len]),
            Err(ObjectError::WrongLength {
                read: len,
                allocation: 128
            })
        );
    }
}

/// The deadline round-trips through the header (48 bits, covered by
/// the checksum), and a header of before deadlines (zero bytes
/// there) reads as "never".
#[test]
fn the_deadline_is_kept_in_the_header() {
    for deadline in [0, 1, 1_790_000_000_123, MAX_DEADLINE] {
        let f = Fields {
            version: 7,
            generation: 3,
            key: b"k",
            data: b"v",
            deadline,
        };
        let enc = encode(&f);
        let o = decode_exact(&enc).unwrap();
        assert_eq!(
            (o.deadline, o.data, o.key),
            (deadline, &b"v"[..], &b"k"[..])
        );
    }
    let mut enc = encode(&Fields {
        version: 7,
        generation: 3,
        key: b"k",
        data: b"v",
        deadline: 5,
    });
    enc[42] ^= 4;
    assert_eq!(
        decode(&enc),
        Err(ObjectError::Torn),
        "covered by the checksum"
    );
}

#[test]
fn a_retime_rewrites_only_the_header() {
    let mut m = HeapMemory::new(4096);
    let f = Fields {
        version: 9,
        generation: 4,
        key: b"key",
        data: &[7u8; 1000],
        deadline: 0,
    };
    write_object(&mut m, 64, 2048, &f).unwrap();
    let body = m.bytes()[64 + HEADER_LEN..64 + 2048].to_vec();
    retime(&mut m, 64, 2048, b"key", 12, 1_790_000_000_000).unwrap();
    let o = read_object(&m, 64, 2048).unwrap();
    assert_eq!(
        (o.version, o.generation, o.deadline, o.data),
        (12, 4, 1_790_000_000_000, vec![7u8; 1000])
    );
    assert_eq!(&m.bytes()[64 + HEADER_LEN..64 + 2048], &body[..]);
    assert_eq!(
        retime(&mut m, 64, 2048, b"other", 13, 0),
        Err(ObjectError::Torn),
        "another key's object"
    );
}

#[test]
fn the_head_is_read_without_the_value() {
    let mut m = HeapMemory::new(4096);
    let f = Fields {
        version: 9,
        generation: 4,
        key: b"key",
        data: &[7u8; 1000],
        deadline: 1_790_000_000_123,
    };
    write_object(&mut m, 64, 2048, &f).unwrap();
    assert_eq!(
        read_head(&m, 64).unwrap(),
        Head {
            key: b"key".to_vec(),
            generation: 4,
            version: 9,
            deadline: 1_790_000_000_123,
        }
    );
    assert_eq!(read_key(&m, 64).unwrap(), (b"key".to_vec(), 4));
    scrub(&mut m, 64).unwrap();
    assert_eq!(read_head(&m, 64), Err(ObjectError::Empty));
}

#[test]
fn single_bit_flips_are_detected() {
    let f = Fields {
        version: 3,
        generation: 2,
        key: b"a key",
        data: b"some payload",
        deadline: 1_790_000_000_000,
    };
    let enc = encode(&f);
    // The header and the data (the rest of the allocation is no part of
    // the object).
    for byte in 0..encoded_len(f.key.len(), f.data.len()) {
        for bit in 0..8 {
            let mut b = enc.clone();
            b[byte] ^= 1 << bit;
            let r = decode(&b);
            assert!(
                matches!(r, Err(ObjectError::Torn) | Err(ObjectError::Empty)),
                "flip {byte}:{bit} gave {r:?}"
            );
        }
    }
}

#[test]
fn simulated_concurrent_overwrite_is_detected() {
    // A reader copies the allocation front to back while a writer
    // overwrites it (data first, then header). Model every interleaving:
    // the reader has copied `k` bytes before the writer runs to its
    // `w`-th step, then copies the rest afterwards.
    let cap = 128usize;
    let mut old = vec![0; cap];
    encode_into(&mut old, &Fields::unkeyed(1, &[0xAA; 60])).unwrap();
    let mut new = vec![0; cap];
    encode_into(&mut new, &Fields::unkeyed(2, &[0x55; 70])).unwrap();
    let new = &new[..encoded_len(0, 70)];
    let mut mem = HeapMemory::new(cap as u64);
    mem.write(0, &old).unwrap();
    let steps = [(HEADER_LEN, &new[HEADER_LEN..]), (0, &new[..HEADER_LEN])];
    let mut torn_seen = 0;
    for k in 0..=cap {
        for w in 0..=steps.len() {
            let mut m = mem.clone();
            let mut buf = vec![0u8; cap];
            m.read(0, &mut buf[..k]).unwrap();
            for &(at, bytes) in &steps[..w] {
                m.write(at as u64, bytes).unwrap();
            }
            m.read(k as u64, &mut buf[k..]).unwrap();
            match decode(&buf) {
                Ok(o) => assert!(
                    (o.version == 1 && o.data == [0xAA; 60])
                        || (o.version == 2 && o.data == [0x55; 70]),
                    "decode returned a mix: k={k} w={w}"
                ),
                Err(ObjectError::Torn) => torn_seen += 1,
                Err(e) => panic!("unexpected {e}"),
            }
        }
    }
    assert!(torn_seen > 0, "the model must produce torn reads");
}

proptest! {
    #[test]
    fn any_mix_of_two_versions_is_whole_or_torn(
        a in prop::collection::vec(any::<u8>(), 0..150),
        b in prop::collection::vec(any::<u8>(), 0..150),
        ka in prop::collection::vec(any::<u8>(), 0..8),
        kb in prop::collection::vec(any::<u8>(), 0..8),
        cut in 0usize..256,
        cut2 in 0usize..256,
    ) {
        let cap = 256;
        let mut ea = vec![0; cap];
        encode_into(&mut ea, &Fields { version: 10, generation: 1, key: &ka, data: &a, deadline: 0 }).unwrap();
        let mut eb = vec![0; cap];
        encode_into(&mut eb, &Fields { version: 11, generation: 2, key: &kb, data: &b, deadline: MAX_DEADLINE }).unwrap();
        let (lo, hi) = (cut.min(cut2), cut.max(cut2));
        // bytes [lo, hi) from b, the rest from a
        let mut mix = ea.clone();
        mix[lo..hi].copy_from_slice(&eb[lo..hi]);
        match decode(&mix) {
            Ok(o) => prop_assert!(
                (o.version == 10 && o.generation == 1 && o.key == &ka[..] && o.data == &a[..])
                    || (o.version == 11 && o.generation == 2 && o.key == &kb[..] && o.data == &b[..])
            ),
            Err(ObjectError::Torn) => {}
            Err(e) => prop_assert!(false, "unexpected {}", e),
        }
    }

    #[test]
    fn decode_never_panics(buf in prop::collection::vec(any::<u8>(), 0..100)) {
        let _ = decode(&buf);
    }
}
