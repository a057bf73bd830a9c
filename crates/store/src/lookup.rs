//! The one-sided look-up of a key, as a pure state machine: it asks for
//! reads of the arena ([`Step::Read`]) and is fed the bytes each returned
//! ([`Lookup::on_read`]), so the real client (RDMA Reads of the primary's
//! arena), the simulation (reads of a simulated node's memory at a
//! simulated instant) and the node's own `Op::Get` (reads of its memory)
//! run exactly the same logic.
//!
//! The steps (Pilaf, FaRM): read the key's home bucket (512 bytes) and
//! check its checksum; read the object of each slot whose tag matches;
//! read the next bucket only if the home's spill flag is set. With a
//! cached pointer the first read is the object itself.
//!
//! Why every answer is linearizable, given that a primary's arena holds
//! committed writes only and one key has at most one live object there:
//!
//! * An object that decodes whole and carries the key **is** the key's
//!   value at the instant it was read, wherever the pointer to it came
//!   from (a cached pointer, a slot read earlier). An update in place
//!   changes it under the checksum (a torn read is retried), an update
//!   that moves it writes the new object before it scrubs the old one, and
//!   a delete scrubs it; all are acknowledged only after.
//! * "Absent" is answered only from a bucket read whole: no slot of the
//!   key in the home bucket (and, if it spilled, none in the next bucket,
//!   read later: a key never moves between buckets while it lives, so if
//!   it existed at both reads it was in one of them, and otherwise it was
//!   absent at some instant between).
//! * A candidate slot whose object holds another key **of the slot's tag**
//!   (the header's key hash) in the slot's generation is a tag collision:
//!   that object is the one the slot was written for, so the slot is
//!   another key's and skipping it loses nothing (space reused by another
//!   key's object passes for it only if that key has the slot's tag too
//!   and a generation a multiple of 2^32 apart). Anything else (freed
//!   space, space reused by another object, a torn object) means the slot
//!   changed since the bucket was read: the look-up starts over from the
//!   home bucket, at most [`MAX_RESTARTS`] times, then gives up and the
//!   caller asks the node (the counted fallback).

use crate::index::{self, key_hash, tag_of, Layout, Slot, BUCKET_LEN};
use crate::object;

/// Restarts (torn reads, slots that changed under the look-up) before it
/// gives up.
pub const MAX_RESTARTS: u32 = 4;

/// How far a reader's clock may be behind the primary's, in
/// milliseconds: a reader counts a key as expired this long before its
/// own clock reaches the deadline ([`live`]), so that no reader returns a
/// value the primary already counts as expired.
pub const CLOCK_BOUND_MS: u64 = 100;

/// Whether an object whose header carries `deadline` (milliseconds since
/// the Unix epoch; 0: none) is still the key's value for a reader whose
/// clock reads `now_ms`: the primary decides expiry by its own clock, and
/// a reader's may lag it by up to [`CLOCK_BOUND_MS`], so the reader
/// counts the key absent from `deadline - CLOCK_BOUND_MS` on.
pub fn live(deadline: u64, now_ms: u64) -> bool {
    deadline == 0 || now_ms.saturating_add(CLOCK_BOUND_MS) < deadline
}

/// [`live`] by this host's clock, read only for an object with a deadline
/// (most have none; a clock read per look-up showed in the RESP door's
/// profile).
pub fn live_now(deadline: u64) -> bool {
    deadline == 0 || live(deadline, wall_ms())
}

/// This host's Unix time in milliseconds (0 before 1970).
pub fn wall_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// What to do next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Read `len` bytes at arena offset `offset`, then call
    /// [`Lookup::on_read`] with them.
    Read {
        /// Arena offset.
        offset: u64,
        /// Bytes.
        len: u32,
    },
    /// Finished.
    Done(Outcome),
}

/// How a look-up ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The key's object.
    Found {
        /// Its arena offset.
        offset: u64,
        /// Its allocation's length.
        len: u32,
        /// Its generation.
        generation: u64,
        /// Its version.
        version: u64,
        /// The value (empty if the look-up was told not to copy it:
        /// [`run_in`]).
        data: Vec<u8>,
        /// Where the value lies in the object's bytes as read (the last
        /// read of the look-up): `data_at..data_at + data_len`.
        data_at: usize,
        /// The value's length.
        data_len: usize,
        /// When the key expires (milliseconds since the Unix epoch; 0:
        /// never): its reader decides by [`live`].
        deadline: u64,
    },
    /// No such key.
    Absent,
    /// Reads kept racing writes ([`MAX_RESTARTS`]); ask the node.
    GaveUp,
}

impl Outcome {
    /// The outcome of a look-up whose last read came in two parts
    /// ([`Lookup::on_read_parts`]), with its value taken from `body`, the
    /// second part: a `Found` there has an empty `data`, and its value is
    /// `body[..data_len]`, which becomes `data` without a copy. Anything
    /// else (a `Found` from a whole read, `Absent`, `GaveUp`) is as it was.
    pub fn take_value(mut self, body: Vec<u8>) -> Outcome {
        if let Outcome::Found { data, data_len, .. } = &mut self {
            if data.is_empty() && *data_len > 0 {
                *data = body;
                data.truncate(*data_len);
            }
        }
        self
    }
}

#[derive(Debug, Clone)]
enum State {
    Cached {
        offset: u64,
    },
    Bucket {
        no: u64,
    },
    Object {
        no: u64,
        spill: bool,
        cands: Vec<Slot>,
        at: usize,
    },
}

/// One key's look-up in progress.
#[derive(Debug, Clone)]
pub struct Lookup {
    key: Vec<u8>,
    /// Whether [`Outcome::Found`] carries a copy of the value.
    keep_data: bool,
    hash: u64,
    layout: Layout,
    state: State,
    restarts: u32,
    reads: u32,
}

/// Runs a look-up of `key` to its end: `read(offset, len)` returns the
/// arena's `len` bytes at `offset` (checking the range before it
/// allocates), or fails, which ends the look-up with that error. The
/// outcome, and the finished look-up for its counters. The one driver of
/// the client, the node's server-side get and the RESP front door.
pub fn run<E>(
    key: &[u8],
    layout: Layout,
    cached: Option<(u64, u32)>,
    mut read: impl FnMut(u64, u32) -> Result<Vec<u8>, E>,
) -> Result<(Outcome, Lookup), E> {
    let (mut l, mut step) = Lookup::start(key, layout, cached);
    loop {
        match step {
            Step::Read { offset, len } => {
                let bytes = read(offset, len)?;
                step = l.on_read(&bytes);
            }
            Step::Done(o) => return Ok((o, l)),
        }
    }
}

/// [`run`] reading into one buffer the caller keeps (no allocation, and
/// no zeroing once it is large enough): `read(offset, len, buf)` leaves
/// the arena's `len` bytes at `offset` in `buf[..len]` (checking the
/// range before it grows `buf`). A found value is not copied out: it is
/// `buf[data_at..data_at + data_len]`.
pub fn run_in<E>(
    key: &[u8],
    layout: Layout,
    cached: Option<(u64, u32)>,
    buf: &mut Vec<u8>,
    mut read: impl FnMut(u64, u32, &mut Vec<u8>) -> Result<(), E>,
) -> Result<(Outcome, Lookup), E> {
    let (mut l, mut step) = Lookup::start(key, layout, cached);
    l.keep_data = false;
    loop {
        match step {
            Step::Read { offset, len } => {
                read(offset, len, buf)?;
                step = l.on_read(&buf[..len as usize]);
            }
            Step::Done(o) => return Ok((o, l)),
        }
    }
}

impl Lookup {
    /// Starts a look-up of `key` in an index of `layout`; `cached`: a
    /// pointer (arena offset, allocation length) to try first.
    pub fn start(key: &[u8], layout: Layout, cached: Option<(u64, u32)>) -> (Lookup, Step) {
        let hash = key_hash(key);
        let mut l = Lookup {
            key: key.to_vec(),
            keep_data: true,
            hash,
            layout,
            state: State::Cached { offset: 0 },
            restarts: 0,
            reads: 1,
        };
        let step = match cached {
            Some((offset, len)) if len as usize >= object::HEADER_LEN => {
                l.state = State::Cached { offset };
                Step::Read { offset, len }
            }
            _ => l.read_bucket(layout.home(hash)),
        };
        (l, step)
    }

    /// Whether [`Outcome::Found`] carries a copy of the value (by
    /// default it does; [`run_in`] and a reader of heads do not).
    pub fn keep_data(&mut self, keep: bool) {
        self.keep_data = keep;
    }

    /// Reads asked for so far.
    pub fn reads(&self) -> u32 {
        self.reads
    }

    /// Restarts so far.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    fn read_bucket(&mut self, no: u64) -> Step {
        self.state = State::Bucket { no };
        Step::Read {
            offset: self.layout.bucket_offset(no),
            len: BUCKET_LEN as u32,
        }
    }

    fn restart(&mut self) -> Step {
        self.restarts += 1;
        if self.restarts > MAX_RESTARTS {
            return Step::Done(Outcome::GaveUp);
        }
        self.reads += 1;
        self.read_bucket(self.layout.home(self.hash))
    }

    fn next_candidate(&mut self, no: u64, spill: bool, cands: Vec<Slot>, at: usize) -> Step {
        if let Some(s) = cands.get(at) {
            let step = Step::Read {
                offset: s.offset,
                len: s.units.saturating_mul(object::UNIT as u32),
            };
            self.state = State::Object {
                no,
                spill,
                cands,
                at,
            };
            self.reads += 1;
            return step;
        }
        if no == self.layout.home(self.hash) && spill {
            self.reads += 1;
            return self.read_bucket(no + 1);
        }
        Step::Done(Outcome::Absent)
    }

    /// The bytes the last [`Step::Read`] returned.
    pub fn on_read(&mut self, bytes: &[u8]) -> Step {
        match std::mem::replace(&mut self.state, State::Cached { offset: 0 }) {
            State::Bucket { no } => match index::decode_bucket(no, bytes) {
                Err(_) => self.restart(),
                Ok(b) => {
                    let tag = tag_of(self.hash);
                    let cands: Vec<Slot> = b.matching(tag).map(|(_, s)| s).collect();
                    self.next_candidate(no, b.spill, cands, 0)
                }
            },
            state => self.on_object(state, object::decode_exact(bytes), self.keep_data),
        }
    }

    /// [`Self::on_read`] of an object read in two parts, `head` (its
    /// header and a key as long as this look-up's) and then `body`, with
    /// no copy of the value: a [`Outcome::Found`] from it has an empty
    /// `data`, and the value is `body[..data_len]`. `None`, with nothing
    /// changed, where the parts do not decode that way (the read was a
    /// bucket, or the object's key is of another length): the caller
    /// joins them and calls [`Self::on_read`].
    pub fn on_read_parts(&mut self, head: &[u8], body: &[u8]) -> Option<Step> {
        if matches!(self.state, State::Bucket { .. }) {
            return None;
        }
        let o = object::decode_parts(head, body)?;
        let state = std::mem::replace(&mut self.state, State::Cached { offset: 0 });
        Some(self.on_object(state, o, false))
    }

    /// [`Self::on_read`] of only the head of the object the last
    /// [`Step::Read`] asked for (`alloc` bytes): its header and a key as
    /// long as this look-up's, not checked against the object's checksum
    /// (see [`object::decode_head`]: only for a reader that knows nothing
    /// was written meanwhile). A [`Outcome::Found`] from it has an empty
    /// `data`; the value is the `data_len` bytes at `offset + data_at`
    /// of the arena. `None`, with nothing changed, where the head does not
    /// decode that way (the read was a bucket, or the object's key is of
    /// another length): the caller reads the object whole.
    pub fn on_read_head(&mut self, head: &[u8], alloc: usize) -> Option<Step> {
        if matches!(self.state, State::Bucket { .. }) {
            return None;
        }
        let (o, len) = match object::decode_head(head, alloc)? {
            Ok((o, len)) => (Ok(o), len),
            Err(e) => (Err(e), 0),
        };
        let state = std::mem::replace(&mut self.state, State::Cached { offset: 0 });
        let mut step = self.on_object(state, o, false);
        if let Step::Done(Outcome::Found { data_len, .. }) = &mut step {
            *data_len = len;
        }
        Some(step)
    }

    /// The object read in `state` (not a bucket), decoded: `o`.
    fn on_object(
        &mut self,
        state: State,
        o: Result<object::Object<'_>, object::ObjectError>,
        keep: bool,
    ) -> Step {
        match state {
            State::Cached { offset } => match o {
                Ok(o) if o.key == self.key.as_slice() => self.found(&o, offset, keep),
                // Freed, reused or torn: the cache is stale; the index
                // knows.
                _ => {
                    self.reads += 1;
                    self.read_bucket(self.layout.home(self.hash))
                }
            },
            State::Object {
                no,
                spill,
                cands,
                at,
            } => {
                let slot = cands[at];
                match o {
                    Ok(o) if o.key == self.key.as_slice() => self.found(&o, slot.offset, keep),
                    Ok(o)
                        if o.generation as u32 == slot.generation
                            && tag_of(o.key_hash) == slot.tag =>
                    {
                        // Another key with the same tag.
                        self.next_candidate(no, spill, cands, at + 1)
                    }
                    // Freed, reused, torn, or not this allocation: the
                    // slot changed since the bucket was read.
                    Ok(_) | Err(_) => self.restart(),
                }
            }
            State::Bucket { .. } => unreachable!("a bucket is no object"),
        }
    }

    fn found(&self, o: &object::Object<'_>, offset: u64, keep: bool) -> Step {
        Step::Done(Outcome::Found {
            offset,
            len: o.allocation as u32,
            generation: o.generation,
            version: o.version,
            data: match keep {
                true => o.data.to_vec(),
                false => Vec::new(),
            },
            // The key and value follow the header (`object::write_object`).
            data_at: object::HEADER_LEN + o.key.len(),
            data_len: o.data.len(),
            deadline: o.deadline,
        })
    }
}

#[cfg(test)]
#[path = "lookup_tests.rs"]
mod tests;
