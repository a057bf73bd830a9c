//! RESP, the Redis protocol (requests, and replies in version 2 or 3), as a pure codec: requests in,
//! replies out, no I/O. The store's RESP front door (`net::redis_door`) feeds it
//! the bytes of a connection.
//!
//! A request is an array of bulk strings (`*2\r\n$3\r\nGET\r\n$1\r\na\r\n`,
//! what every client library, `redis-cli` and `redis-benchmark` send) or an
//! inline command (`PING\r\n`, typed by hand over telnet). A [`Decoder`]
//! takes the bytes received so far and returns the first whole request and
//! the bytes it used, `Ok(None)` while it is incomplete, or an error for
//! bytes that are not RESP; Redis then answers `-ERR Protocol error: ...`
//! and closes the connection, and so does the front door.
//!
//! Bounds, each checked before anything is allocated or scanned again:
//! [`MAX_ARGS`] arguments, [`MAX_BULK`] bytes per argument, [`MAX_REQUEST`]
//! bytes per request (Redis's `client-query-buffer-limit`), [`MAX_INLINE`]
//! bytes per inline line. The decoder remembers how far into an incomplete
//! request it got, so a large request that arrives in many reads is
//! examined once, not again after every read. [`parse`] is the same
//! without memory, for one buffer.

/// Most arguments in one request.
pub const MAX_ARGS: usize = 1 << 20;
/// Longest argument. Redis's `proto-max-bulk-len` is 512 MiB; a store
/// value is at most `proto::MAX_VALUE` (64 MiB), so a longer value is
/// answered with a clear error up to this length and is a protocol error
/// beyond it.
pub const MAX_BULK: usize = 2 * crate::proto::MAX_VALUE;
/// Largest request (all its arguments and their framing): 256 MiB, an
/// `MSET` of three values of the largest size and more (Redis's
/// `client-query-buffer-limit` is 1 GiB).
pub const MAX_REQUEST: usize = 4 * crate::proto::MAX_VALUE;
/// Longest inline command line.
pub const MAX_INLINE: usize = 64 << 10;

/// A whole request: its arguments, and the bytes it took.
pub type Parsed = (Vec<Vec<u8>>, usize);

/// Why bytes are not a RESP request.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RespError {
    /// A length or count that is not a number, or out of range.
    #[error("invalid {what} length")]
    BadLength {
        /// "multibulk" or "bulk".
        what: &'static str,
    },
    /// The byte where `$` was expected.
    #[error("expected '$', got '{0}'")]
    ExpectedBulk(char),
    /// A bulk string not followed by CRLF.
    #[error("bulk string not terminated by CRLF")]
    BadTerminator,
    /// A request larger than [`MAX_REQUEST`].
    #[error("request larger than {MAX_REQUEST} bytes")]
    TooBig,
    /// An inline line too long, or with unbalanced quotes.
    #[error("{0}")]
    Inline(&'static str),
}

/// The position of the first CRLF at or after `from`.
fn line_end(b: &[u8], from: usize) -> Option<usize> {
    b.get(from..)?
        .windows(2)
        .position(|w| w == b"\r\n")
        .map(|p| from + p)
}

/// A decimal length between `lo` and `hi`.
fn number(b: &[u8], lo: i64, hi: i64, what: &'static str) -> Result<i64, RespError> {
    let bad = RespError::BadLength { what };
    if b.is_empty() || b.len() > 20 {
        return Err(bad);
    }
    let (neg, digits) = match b[0] {
        b'-' => (true, &b[1..]),
        _ => (false, b),
    };
    if digits.is_empty() || !digits.iter().all(u8::is_ascii_digit) {
        return Err(bad);
    }
    let mut v: i64 = 0;
    for &d in digits {
        v = v
            .checked_mul(10)
            .and_then(|v| v.checked_add((d - b'0') as i64))
            .ok_or(bad.clone())?;
    }
    let v = if neg { -v } else { v };
    if v < lo || v > hi {
        return Err(bad);
    }
    Ok(v)
}

/// The first whole request in `b` (see [`Decoder::decode`]), for one
/// buffer: nothing is remembered between calls.
pub fn parse(b: &[u8]) -> Result<Option<Parsed>, RespError> {
    Decoder::default().decode(b)
}

/// A bulk argument at least this long is gathered into its own buffer as
/// its bytes arrive ([`Decoder::bulk_room`]).
pub const FILL_MIN: usize = 64 << 10;

/// The room a long bulk argument's buffer gets at first; it grows as its
/// bytes arrive (a length alone allocates no more than this).
const FILL_FIRST: usize = 2 << 20;

/// The requests of one connection, decoded as its bytes arrive.
#[derive(Debug)]
pub struct Decoder {
    state: State,
    /// Argument buffers given back ([`Self::recycle`]), for the next
    /// requests' arguments: no allocation per argument once a connection
    /// runs.
    spare: Vec<Vec<u8>>,
    /// An argument list given back, for the next request.
    spare_list: Vec<Vec<u8>>,
    /// [`FILL_MIN`] (the tests' decoders gather shorter arguments too).
    fill_min: usize,
}

impl Decoder {
    /// A decoder that gathers bulk arguments of `min` bytes or more apart
    /// ([`Decoder::bulk_room`]; [`FILL_MIN`] for [`Decoder::default`]):
    /// tests and fuzzing reach that path with short arguments.
    pub fn gathering_from(min: usize) -> Decoder {
        Decoder {
            fill_min: min,
            ..Decoder::default()
        }
    }
}

impl Default for Decoder {
    fn default() -> Decoder {
        Decoder {
            state: State::Start,
            spare: Vec::new(),
            spare_list: Vec::new(),
            fill_min: FILL_MIN,
        }
    }
}

/// Argument buffers a decoder keeps for reuse ([`Decoder::recycle`]), and
/// the largest one kept: a few small ones (a command's name, a key, a
/// small value) per connection.
const SPARE: usize = 8;
const SPARE_LEN: usize = 512;

#[derive(Debug, Default)]
enum State {
    /// At the start of a request.
    #[default]
    Start,
    /// Inside a multibulk request: the arguments so far, how many there
    /// will be, and where the next one begins.
    Multibulk {
        args: Vec<Vec<u8>>,
        want: usize,
        at: usize,
    },
    /// Inside an inline line: bytes already searched for its newline.
    Inline { searched: usize },
    /// Inside a multibulk request, gathering a long bulk argument: `arg`
    /// holds its bytes so far (and then its CRLF), `len` long; `at` is
    /// where the bytes not yet gathered begin.
    Filling {
        args: Vec<Vec<u8>>,
        want: usize,
        at: usize,
        arg: Vec<u8>,
        len: usize,
    },
}

impl Decoder {
    /// The first whole request in `b`, the connection's bytes not yet
    /// used: its arguments and the bytes it took; `Ok(None)`: more bytes
    /// are needed. Between a call that answered `Ok(None)` and the next,
    /// the caller may only append to `b` (the decoder goes on where it
    /// stopped); after a request or an error it starts afresh. An empty
    /// request (a blank inline line, `*0`) has no arguments; the caller
    /// ignores it.
    pub fn decode(&mut self, b: &[u8]) -> Result<Option<Parsed>, RespError> {
        let r = match std::mem::take(&mut self.state) {
            State::Start => match b.first() {
                None => Ok(None),
                Some(b'*') => self.multibulk_header(b),
                Some(_) => self.inline(b, 0),
            },
            State::Multibulk { args, want, at } => self.bulks(b, args, want, at),
            State::Inline { searched } => self.inline(b, searched),
            State::Filling {
                args,
                want,
                at,
                arg,
                len,
            } => self.fill(b, args, want, at, arg, len),
        };
        if r.is_err() {
            self.state = State::Start;
        }
        r
    }

    /// While a bulk argument of [`FILL_MIN`] bytes or more arrives (it is
    /// gathered into its own buffer as its bytes come): that buffer, and
    /// the bytes it still misses, its CRLF included. A caller may read
    /// them straight into it instead of appending them to the bytes it
    /// passes to [`Self::decode`] (a large value is then not copied out of
    /// the connection's input); the next `decode` goes on from there.
    pub fn bulk_room(&mut self) -> Option<(&mut Vec<u8>, usize)> {
        match &mut self.state {
            State::Filling { arg, len, .. } => {
                let missing = (*len + 2).saturating_sub(arg.len());
                Some((arg, missing))
            }
            _ => None,
        }
    }

    /// Gives back a request's arguments once used: small buffers are
    /// kept (at most [`SPARE`], each of at most [`SPARE_LEN`] bytes) for
    /// the next requests.
    pub fn recycle(&mut self, mut args: Vec<Vec<u8>>) {
        for a in args.drain(..) {
            if self.spare.len() >= SPARE {
                break;
            }
            if a.capacity() <= SPARE_LEN {
                self.spare.push(a);
            }
        }
        if args.capacity() <= SPARE && self.spare_list.capacity() == 0 {
            self.spare_list = args;
        }
    }

    fn multibulk_header(&mut self, b: &[u8]) -> Result<Option<Parsed>, RespError> {
        let Some(end) = line_end(b, 1) else {
            if b.len() > 32 {
                return Err(RespError::BadLength { what: "multibulk" });
            }
            return Ok(None);
        };
        let n = number(&b[1..end], -1, MAX_ARGS as i64, "multibulk")?;
        let at = end + 2;
        if n <= 0 {
            return Ok(Some((Vec::new(), at)));
        }
        // Each argument takes at least 6 bytes ("$0\r\n\r\n"): no more is
        // reserved than the bytes at hand could hold.
        let want = (n as usize).min(b.len() / 6 + 1);
        let args = match self.spare_list.capacity() >= want {
            true => std::mem::take(&mut self.spare_list),
            false => Vec::with_capacity(want),
        };
        self.bulks(b, args, n as usize, at)
    }

    fn bulks(
        &mut self,
        b: &[u8],
        mut args: Vec<Vec<u8>>,
        want: usize,
        mut at: usize,
    ) -> Result<Option<Parsed>, RespError> {
        while args.len() < want {
            let Some(&first) = b.get(at) else {
                self.state = State::Multibulk { args, want, at };
                return Ok(None);
            };
            if first != b'$' {
                return Err(RespError::ExpectedBulk(first as char));
            }
            let Some(end) = line_end(b, at + 1) else {
                if b.len() - at > 32 {
                    return Err(RespError::BadLength { what: "bulk" });
                }
                self.state = State::Multibulk { args, want, at };
                return Ok(None);
            };
            let len = number(&b[at + 1..end], 0, MAX_BULK as i64, "bulk")? as usize;
            let start = end + 2;
            if start + len + 2 > MAX_REQUEST {
                return Err(RespError::TooBig);
            }
            if b.len() < start + len + 2 {
                if len >= self.fill_min {
                    let arg = Vec::with_capacity((len + 2).min(FILL_FIRST));
                    return self.fill(b, args, want, start, arg, len);
                }
                self.state = State::Multibulk { args, want, at };
                return Ok(None);
            }
            if &b[start + len..start + len + 2] != b"\r\n" {
                return Err(RespError::BadTerminator);
            }
            let mut arg = self.spare.pop().unwrap_or_default();
            arg.clear();
            arg.extend_from_slice(&b[start..start + len]);
            args.push(arg);
            at = start + len + 2;
        }
        Ok(Some((args, at)))
    }

    /// A long bulk argument's bytes from `at` on gathered into `arg` (from
    /// its first byte when `bulks` meets it); once it is whole (CRLF
    /// checked) the request goes on.
    fn fill(
        &mut self,
        b: &[u8],
        mut args: Vec<Vec<u8>>,
        want: usize,
        mut at: usize,
        mut arg: Vec<u8>,
        len: usize,
    ) -> Result<Option<Parsed>, RespError> {
        let rest = b.get(at..).unwrap_or_default();
        let n = (len + 2).saturating_sub(arg.len()).min(rest.len());
        arg.extend_from_slice(&rest[..n]);
        at += n;
        if arg.len() < len + 2 {
            self.state = State::Filling {
                args,
                want,
                at,
                arg,
                len,
            };
            return Ok(None);
        }
        if arg[len..] != *b"\r\n" {
            return Err(RespError::BadTerminator);
        }
        arg.truncate(len);
        args.push(arg);
        self.bulks(b, args, want, at)
    }

    /// An inline command: words separated by spaces, with Redis's quoting
    /// (`"..."` with `\n`, `\xHH` escapes; `'...'` with `\'`).
    fn inline(&mut self, b: &[u8], searched: usize) -> Result<Option<Parsed>, RespError> {
        let from = searched.min(b.len());
        let Some(nl) = b[from..].iter().position(|&c| c == b'\n').map(|p| from + p) else {
            if b.len() > MAX_INLINE {
                return Err(RespError::Inline("too big inline request"));
            }
            self.state = State::Inline { searched: b.len() };
            return Ok(None);
        };
        if nl > MAX_INLINE {
            return Err(RespError::Inline("too big inline request"));
        }
        let mut line = &b[..nl];
        if line.last() == Some(&b'\r') {
            line = &line[..line.len() - 1];
        }
        let args = split_args(line).ok_or(RespError::Inline("unbalanced quotes in request"))?;
        Ok(Some((args, nl + 1)))
    }
}

/// Redis's `isspace`: ASCII whitespace and vertical tab.
fn space(c: u8) -> bool {
    c.is_ascii_whitespace() || c == 0x0b
}

fn hex(c: u8) -> Option<u8> {
    (c as char).to_digit(16).map(|d| d as u8)
}

fn split_args(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let mut out = Vec::new();
    let mut i = 0;
    loop {
        while i < line.len() && space(line[i]) {
            i += 1;
        }
        if i == line.len() {
            return Some(out);
        }
        let mut cur = Vec::new();
        match line[i] {
            b'"' => {
                i += 1;
                loop {
                    let c = *line.get(i)?;
                    match c {
                        b'"' => {
                            i += 1;
                            break;
                        }
                        b'\\' => {
                            let e = *line.get(i + 1)?;
                            if e == b'x' {
                                let h = line.get(i + 2).and_then(|&c| hex(c));
                                let l = line.get(i + 3).and_then(|&c| hex(c));
                                if let (Some(h), Some(l)) = (h, l) {
                                    cur.push(h << 4 | l);
                                    i += 4;
                                    continue;
                                }
                            }
                            cur.push(match e {
                                b'n' => b'\n',
                                b'r' => b'\r',
                                b't' => b'\t',
                                b'b' => 8,
                                b'a' => 7,
                                o => o,
                            });
                            i += 2;
                        }
                        o => {
                            cur.push(o);
                            i += 1;
                        }
                    }
                }
                // A closing quote must end the word.
                if line.get(i).is_some_and(|&c| !space(c)) {
                    return None;
                }
            }
            b'\'' => {
                i += 1;
                loop {
                    let c = *line.get(i)?;
                    // Redis: `\'` inside single quotes is a quote; every
                    // other byte, a backslash included, is itself.
                    if c == b'\\' && line.get(i + 1) == Some(&b'\'') {
                        cur.push(b'\'');
                        i += 2;
                        continue;
                    }
                    if c == b'\'' {
                        i += 1;
                        break;
                    }
                    cur.push(c);
                    i += 1;
                }
                if line.get(i).is_some_and(|&c| !space(c)) {
                    return None;
                }
            }
            _ => {
                while i < line.len() && !space(line[i]) {
                    cur.push(line[i]);
                    i += 1;
                }
            }
        }
        out.push(cur);
    }
}

/// The Redis Cluster slot of `key`: CRC16 (XMODEM) of the key, or of its
/// `{hash tag}` when it has a non-empty one, modulo 16,384. The front
/// door names it in `-MOVED` redirections, as a cluster node does.
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&c| c == b'{').and_then(|s| {
        let rest = &key[s + 1..];
        match rest.iter().position(|&c| c == b'}') {
            Some(e) if e > 0 => Some(&rest[..e]),
            _ => None,
        }
    });
    crc16(tagged.unwrap_or(key)) & 0x3fff
}

/// CRC16/XMODEM (polynomial 0x1021, initial value 0), Redis Cluster's.
fn crc16(b: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &x in b {
        crc ^= (x as u16) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

/// The protocol a connection speaks (`HELLO 2|3`): replies that RESP3
/// types (maps, sets, nulls, booleans, verbatim text) are written in
/// their RESP2 form under [`Proto::Resp2`], as Redis 7 writes them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Proto {
    /// RESP2, every connection's protocol until `HELLO 3`.
    #[default]
    Resp2,
    /// RESP3.
    Resp3,
}

/// One reply.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// `+OK`.
    Simple(String),
    /// `-ERR ...` (the text includes the error's code word).
    Error(String),
    /// `:42`.
    Int(i64),
    /// `$3\r\nabc`.
    Bulk(Vec<u8>),
    /// A missing value: `$-1` in RESP2, `_` in RESP3.
    Nil,
    /// A missing array (`EXEC` after a `WATCH`ed key changed): `*-1` in
    /// RESP2, `_` in RESP3.
    NilArray,
    /// `*N` and the elements.
    Array(Vec<Reply>),
    /// `%N` and the pairs in RESP3; an array of 2N elements in RESP2.
    Map(Vec<(Reply, Reply)>),
    /// `~N` in RESP3; an array in RESP2.
    Set(Vec<Reply>),
    /// `#t`/`#f` in RESP3; `:1`/`:0` in RESP2.
    Bool(bool),
    /// Text (`INFO`, `CLUSTER NODES`, `CLIENT LIST`): `=N\r\ntxt:...` in
    /// RESP3; a bulk string in RESP2.
    Verbatim(Vec<u8>),
}

impl Reply {
    /// `+OK`.
    pub fn ok() -> Reply {
        Reply::Simple("OK".into())
    }

    /// An error reply; CR and LF in `text` become spaces (they would end
    /// the reply).
    pub fn err(text: impl Into<String>) -> Reply {
        Reply::Error(text.into().replace(['\r', '\n'], " "))
    }

    /// A bulk string of `text`.
    pub fn text(text: impl Into<String>) -> Reply {
        Reply::Bulk(text.into().into_bytes())
    }

    /// Appends the reply's RESP2 bytes to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        self.encode_as(Proto::Resp2, out)
    }

    /// Appends the reply's bytes in protocol `proto` to `out`.
    pub fn encode_as(&self, proto: Proto, out: &mut Vec<u8>) {
        let v3 = proto == Proto::Resp3;
        let line = |out: &mut Vec<u8>, tag: u8, s: &str| {
            out.push(tag);
            out.extend(s.bytes().filter(|&c| c != b'\r' && c != b'\n'));
            out.extend_from_slice(b"\r\n");
        };
        let len = |out: &mut Vec<u8>, tag: u8, n: usize| {
            out.push(tag);
            out.extend_from_slice(itoa(n as i64).as_bytes());
            out.extend_from_slice(b"\r\n");
        };
        match self {
            Reply::Simple(s) => line(out, b'+', s),
            Reply::Error(s) => line(out, b'-', s),
            Reply::Int(i) => line(out, b':', &itoa(*i)),
            Reply::Bulk(b) => {
                len(out, b'$', b.len());
                out.extend_from_slice(b);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Nil if v3 => out.extend_from_slice(b"_\r\n"),
            Reply::Nil => out.extend_from_slice(b"$-1\r\n"),
            Reply::NilArray if v3 => out.extend_from_slice(b"_\r\n"),
            Reply::NilArray => out.extend_from_slice(b"*-1\r\n"),
            Reply::Array(v) => {
                len(out, b'*', v.len());
                v.iter().for_each(|r| r.encode_as(proto, out));
            }
            Reply::Set(v) => {
                len(out, if v3 { b'~' } else { b'*' }, v.len());
                v.iter().for_each(|r| r.encode_as(proto, out));
            }
            Reply::Map(v) => {
                match v3 {
                    true => len(out, b'%', v.len()),
                    false => len(out, b'*', 2 * v.len()),
                }
                for (k, r) in v {
                    k.encode_as(proto, out);
                    r.encode_as(proto, out);
                }
            }
            Reply::Bool(b) if v3 => out.extend_from_slice(if *b { b"#t\r\n" } else { b"#f\r\n" }),
            Reply::Bool(b) => out.extend_from_slice(if *b { b":1\r\n" } else { b":0\r\n" }),
            Reply::Verbatim(t) if v3 => {
                len(out, b'=', t.len() + 4);
                out.extend_from_slice(b"txt:");
                out.extend_from_slice(t);
                out.extend_from_slice(b"\r\n");
            }
            Reply::Verbatim(t) => Reply::Bulk(t.clone()).encode_as(proto, out),
        }
    }
}

/// `n` in decimal.
fn itoa(n: i64) -> String {
    n.to_string()
}

#[cfg(test)]
#[path = "resp_codec_tests.rs"]
mod tests;
