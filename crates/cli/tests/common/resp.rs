//! A RESP client for the tests of the store's Redis door: replies parsed
//! into values ([`V`]), and a connection that sends commands and reads
//! whole replies ([`Conn`]).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// A reply, parsed (for comparing shapes and normalising what differs on
/// purpose).
#[derive(Debug, Clone, PartialEq)]
pub enum V {
    Simple(String),
    Error(String),
    Int(i64),
    Bulk(Vec<u8>),
    Null,
    Array(Vec<V>),
    Map(Vec<(V, V)>),
    Set(Vec<V>),
    Bool(bool),
    Verbatim(Vec<u8>),
    Other(u8, Vec<u8>),
}

/// The first whole reply in `b` and its length; `None` while incomplete.
pub fn parse(b: &[u8]) -> Option<(V, usize)> {
    let end = b.windows(2).position(|w| w == b"\r\n")?;
    let line = std::str::from_utf8(&b[1..end]).ok()?;
    let at = end + 2;
    let n = || line.parse::<i64>().ok();
    let many = |count: usize, b: &[u8]| -> Option<(Vec<V>, usize)> {
        let mut v = Vec::new();
        let mut at = 0;
        for _ in 0..count {
            let (x, used) = parse(&b[at..])?;
            v.push(x);
            at += used;
        }
        Some((v, at))
    };
    Some(match b[0] {
        b'+' => (V::Simple(line.into()), at),
        b'-' => (V::Error(line.into()), at),
        b':' => (V::Int(n()?), at),
        b'_' => (V::Null, at),
        b'#' => (V::Bool(line == "t"), at),
        b'$' | b'=' => {
            let len = n()?;
            if len < 0 {
                return Some((V::Null, at));
            }
            let len = len as usize;
            if b.len() < at + len + 2 {
                return None;
            }
            let body = b[at..at + len].to_vec();
            let v = match b[0] {
                b'$' => V::Bulk(body),
                _ => V::Verbatim(body[4..].to_vec()),
            };
            (v, at + len + 2)
        }
        b'*' | b'~' | b'>' => {
            let len = n()?;
            if len < 0 {
                return Some((V::Null, at));
            }
            let (v, used) = many(len as usize, &b[at..])?;
            let v = if b[0] == b'~' { V::Set(v) } else { V::Array(v) };
            (v, at + used)
        }
        b'%' => {
            let len = n()? as usize;
            let (v, used) = many(2 * len, &b[at..])?;
            let pairs = v.chunks(2).map(|p| (p[0].clone(), p[1].clone())).collect();
            (V::Map(pairs), at + used)
        }
        c => (V::Other(c, line.as_bytes().to_vec()), at),
    })
}

/// A RESP connection that sends commands and reads whole replies.
pub struct Conn {
    pub s: TcpStream,
    pub buf: Vec<u8>,
}

impl Conn {
    pub fn new(port: u16) -> Conn {
        let s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        s.set_nodelay(true).unwrap();
        Conn { s, buf: Vec::new() }
    }

    /// Sends `args` and returns the reply's bytes.
    pub fn call(&mut self, args: &[&[u8]]) -> Vec<u8> {
        let mut req = format!("*{}\r\n", args.len()).into_bytes();
        for a in args {
            req.extend_from_slice(format!("${}\r\n", a.len()).as_bytes());
            req.extend_from_slice(a);
            req.extend_from_slice(b"\r\n");
        }
        self.s.write_all(&req).unwrap();
        self.read_reply()
    }

    pub fn read_reply(&mut self) -> Vec<u8> {
        let mut chunk = [0u8; 64 << 10];
        loop {
            if let Some((_, n)) = parse(&self.buf) {
                return self.buf.drain(..n).collect();
            }
            let n = self.s.read(&mut chunk).expect("reply");
            assert!(
                n > 0,
                "connection closed; got so far: {:?}",
                show(&self.buf)
            );
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    pub fn cmd(&mut self, line: &str) -> Vec<u8> {
        let args: Vec<&[u8]> = line.split(' ').map(str::as_bytes).collect();
        self.call(&args)
    }
}

pub fn show(b: &[u8]) -> String {
    String::from_utf8_lossy(b).replace("\r\n", "\\r\\n")
}
