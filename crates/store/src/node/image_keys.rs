//! The keyed half of the [`Image`]: planning puts and removes (their
//! object and index effects), and the server-side get and scan, which read
//! the committed bytes exactly as a one-sided reader would.
//!
//! Why a planned put keeps one live object per key: it either rewrites
//! the key's object in place (the allocation holds the new value) or
//! writes a new object, repoints the key's slot and frees the old one, all
//! in one replicated write; a new key gets its slot from the index's own
//! plan, which refuses (`IndexFull`) rather than lose a key. Get and scan
//! read the arena's bytes, which hold committed writes only.

use super::*;
use crate::glob;
use crate::index::{key_hash, tag_of, Slot};
use crate::lookup::{self, Outcome};
use crate::proto::{Cond, ExpireWhen, Modify, Ttl, MAX_MODIFY_BYTES};
use crate::redis_int::redis_i64;
use bytes::Bytes;

/// Buckets one scan request walks at most, so a sparse match cannot hold
/// the node loop for long.
const SCAN_BUCKETS: u64 = 256;

/// Matching work (key bytes times pattern bytes, a bound on the
/// matcher's steps) after which a scan request ends with the bucket it is
/// in, so long keys and a long pattern cannot hold the node loop either.
const SCAN_WORK: u64 = 1 << 26;

/// The refusal of a deadline out of range (Redis's text without the
/// command's name, which the door adds).
const INVALID_EXPIRE: &str = "ERR invalid expire time";

/// A key's latest write ([`Image::current_object`]): its value only when
/// asked for ([`Want`]).
struct Current {
    version: u64,
    data: Vec<u8>,
    deadline: u64,
}

/// What a look-up of a key's latest write needs: its value, or only its
/// version and deadline (a condition, a remove, a WATCH check), which are
/// read from the object's header without copying the value.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Want {
    Value,
    Head,
}

impl<M: Memory> Image<M> {
    fn meta(&self) -> Result<&Meta, StoreError> {
        self.index
            .as_ref()
            .ok_or_else(|| StoreError::Other("this node holds no key index yet".into()))
    }

    /// A put at sequence number `seq` whose deadline `ttl` says
    /// ([`Ttl::Keep`]: the key's, none if it is absent or expired); a
    /// deadline out of range ([`Ttl::At`] 0 or past
    /// [`object::MAX_DEADLINE`]) is refused, without effects.
    pub(super) fn plan_put(
        &self,
        seq: u64,
        key: &[u8],
        data: &Bytes,
        cond: Cond,
        ttl: Ttl,
    ) -> Result<(Vec<Effect>, Reply), StoreError> {
        let deadline = match ttl {
            Ttl::Clear => 0,
            Ttl::Keep => {
                crate::proto::check_key(key)?;
                self.live(key, Want::Head)?.map_or(0, |c| c.deadline)
            }
            Ttl::At(at) if at == 0 || at > object::MAX_DEADLINE => {
                return Ok((Vec::new(), Reply::Refused(INVALID_EXPIRE.into())))
            }
            Ttl::At(at) => at,
        };
        self.plan_put_at(seq, key, data, cond, deadline)
    }

    /// A put at sequence number `seq`: in place when the key's allocation
    /// holds the new value, else a new object, the old one freed and the
    /// key's slot repointed; a new key gets a new object and a slot. A
    /// failed condition is a write without effects, so its answer is
    /// replicated and ordered like any other (it reflects writes that may
    /// not be committed yet). The object gets `deadline` (0: none).
    fn plan_put_at(
        &self,
        seq: u64,
        key: &[u8],
        data: &Bytes,
        cond: Cond,
        deadline: u64,
    ) -> Result<(Vec<Effect>, Reply), StoreError> {
        crate::proto::check_key(key)?;
        let meta = self.meta()?;
        let existing = meta.get(key).copied();
        // An expired key is absent to a condition (its slot is reused).
        let present =
            existing.is_some() && (cond == Cond::Always || self.live(key, Want::Head)?.is_some());
        match (cond, present) {
            (Cond::IfAbsent, true) | (Cond::IfPresent, false) => {
                return Ok((Vec::new(), Reply::NotStored))
            }
            _ => {}
        }
        let need = object::encoded_len(key.len(), data.len());
        let generation = match existing {
            Some(_) => meta.generation(key).expect("a key in the index has one"),
            None => seq,
        };
        let write = |offset| Effect::Write {
            offset,
            version: seq,
            generation,
            key: key.to_vec(),
            data: data.clone(),
            deadline,
        };
        if let Some(f) = existing {
            let cap = f.entry.units as u64 * object::UNIT;
            if need as u64 <= cap {
                return Ok((
                    vec![write(f.entry.offset)],
                    Reply::Stored {
                        ptr: self.ptr_at(f.entry.offset, cap, generation),
                        generation,
                        created: false,
                    },
                ));
            }
        }
        let (off, len) = self.new_allocation(key.len(), data.len())?;
        let entry = Slot {
            tag: tag_of(key_hash(key)),
            offset: off,
            units: (len / object::UNIT) as u32,
            generation: generation as u32,
        };
        let edits = meta.plan_put(key, entry).map_err(|e| match e {
            index::IndexError::Full { bucket } => StoreError::IndexFull { bucket },
            e => StoreError::Other(e.to_string()),
        })?;
        let mut effects = vec![Effect::Alloc { offset: off, len }, write(off)];
        if let Some(f) = existing {
            effects.push(Effect::Free {
                offset: f.entry.offset,
            });
        }
        effects.extend(edits.into_iter().map(|edit| Effect::Index {
            key: key.to_vec(),
            generation,
            edit,
        }));
        Ok((
            effects,
            Reply::Stored {
                ptr: self.ptr_at(off, len, generation),
                generation,
                created: existing.is_none(),
            },
        ))
    }

    /// A remove: the object freed and the slot cleared; a missing key is a
    /// write without effects (ordered like the rest).
    pub(super) fn plan_remove(&self, key: &[u8]) -> Result<(Vec<Effect>, Reply), StoreError> {
        crate::proto::check_key(key)?;
        let meta = self.meta()?;
        let Some(edit) = meta.plan_delete(key) else {
            return Ok((Vec::new(), Reply::Removed { existed: false }));
        };
        let offset = meta.get(key).expect("planned from it").entry.offset;
        // An expired key is removed too, but did not exist (Redis's DEL).
        let existed = self.live(key, Want::Head)?.is_some();
        Ok((
            vec![
                Effect::Free { offset },
                Effect::Index {
                    key: key.to_vec(),
                    generation: 0,
                    edit,
                },
            ],
            Reply::Removed { existed },
        ))
    }

    /// [`Self::current_object`] unless it has expired by this node's
    /// clock: the key as a command sees it.
    fn live(&self, key: &[u8], want: Want) -> Result<Option<Current>, StoreError> {
        Ok(self
            .current_object(key, want)?
            .filter(|c| !self.expired(c.deadline)))
    }

    /// `key`'s object as of the next write: its latest write, committed
    /// or not (a primary plans with writes not yet replicated; a
    /// read-modify-write must see them, or two pipelined `INCR`s would
    /// both add to the same value): its version (the write's sequence
    /// number), deadline and, with [`Want::Value`], value (else empty:
    /// only the header is read, so a condition on a large value costs no
    /// copy of it).
    fn current_object(&self, key: &[u8], want: Want) -> Result<Option<Current>, StoreError> {
        let Some(f) = self.meta()?.get(key) else {
            return Ok(None);
        };
        let off = f.entry.offset;
        // The index as planned names the key's object at `off`; the
        // latest unexposed write there is that object (another object
        // could be written there only after this one was freed, which
        // would have removed the key or moved it). A batch's earlier
        // writes come later still.
        let unexposed = self
            .unexposed
            .iter()
            .rev()
            .flat_map(|w| w.op.effects.iter().rev());
        // The latest retime, if it came after the latest write: its
        // version and deadline, over that write's value.
        let mut retimed: Option<(u64, u64)> = None;
        for e in self.batch_writes.iter().rev().chain(unexposed) {
            match e {
                Effect::Write {
                    offset,
                    key: k,
                    data,
                    version,
                    deadline,
                    ..
                } if *offset == off && k == key => {
                    let (version, deadline) = retimed.unwrap_or((*version, *deadline));
                    return Ok(Some(Current {
                        version,
                        data: match want {
                            Want::Value => data.to_vec(),
                            Want::Head => Vec::new(),
                        },
                        deadline,
                    }));
                }
                Effect::Retime {
                    offset,
                    key: k,
                    version,
                    deadline,
                } if *offset == off && k == key && retimed.is_none() => {
                    retimed = Some((*version, *deadline));
                    if want == Want::Head {
                        return Ok(Some(Current {
                            version: *version,
                            data: Vec::new(),
                            deadline: *deadline,
                        }));
                    }
                }
                _ => {}
            }
        }
        let corrupt =
            |e: object::ObjectError| StoreError::Other(format!("the object of a key: {e}"));
        let (k, mut current) = match want {
            Want::Value => {
                let cap = f.entry.units as u64 * object::UNIT;
                let o = object::read_object(&self.mem, off, cap).map_err(corrupt)?;
                let (version, deadline) = (o.version, o.deadline);
                (
                    o.key,
                    Current {
                        version,
                        data: o.data,
                        deadline,
                    },
                )
            }
            Want::Head => {
                let h = object::read_head(&self.mem, off).map_err(corrupt)?;
                let (version, deadline) = (h.version, h.deadline);
                (
                    h.key,
                    Current {
                        version,
                        data: Vec::new(),
                        deadline,
                    },
                )
            }
        };
        if k != key {
            return Err(StoreError::Other(
                "index: the key's slot does not match its object".into(),
            ));
        }
        if let Some((version, deadline)) = retimed {
            current.version = version;
            current.deadline = deadline;
        }
        Ok(Some(current))
    }

    /// A read-modify-write ([`Modify`]) at sequence number `seq`: the new
    /// value decided from the current one and planned as a put (or a
    /// remove), so it is replicated as one write. A value that does not
    /// suit the operation is a [`Reply::Refused`] without effects,
    /// ordered like any write (its answer reflects earlier writes).
    pub(super) fn plan_modify(
        &self,
        seq: u64,
        key: &[u8],
        how: &Modify,
    ) -> Result<(Vec<Effect>, Reply), StoreError> {
        crate::proto::check_key(key)?;
        // Only the header where the value plays no part.
        let want = match how {
            Modify::Deadline | Modify::Unchanged { .. } | Modify::Reap | Modify::Expire { .. } => {
                Want::Head
            }
            _ => Want::Value,
        };
        if let Modify::Reap = how {
            // The key as it is, expired or not: removed only if it is.
            let due = self
                .current_object(key, Want::Head)?
                .is_some_and(|c| self.expired(c.deadline));
            if !due {
                return Ok((
                    Vec::new(),
                    Reply::Modified {
                        value: None,
                        len: 0,
                    },
                ));
            }
            let (effects, _) = self.plan_remove(key)?;
            return Ok((
                effects,
                Reply::Modified {
                    value: None,
                    len: 1,
                },
            ));
        }
        let current = self.live(key, want)?;
        let version = current.as_ref().map(|c| c.version);
        // A read-modify-write keeps the key's deadline (Redis's INCR,
        // APPEND and SETRANGE keep a TTL); a swap is a SET, which clears it.
        let kept = current.as_ref().map_or(0, |c| c.deadline);
        let old = current.map(|c| c.data);
        let refuse = |text: &str| Ok((Vec::new(), Reply::Refused(text.into())));
        let too_big = |len: usize| {
            (len > MAX_MODIFY_BYTES).then(|| {
                Reply::Refused(format!(
                    "ERR string exceeds maximum allowed size ({MAX_MODIFY_BYTES} bytes in this store)",
                ))
            })
        };
        let put = |data: &Bytes, cond: Cond, deadline: u64| {
            let (effects, reply) = self.plan_put_at(seq, key, data, cond, deadline)?;
            Ok::<_, StoreError>((effects, matches!(reply, Reply::Stored { .. })))
        };
        // The value becomes `v`; the answer is its length, and with
        // `answer_value` (a counter's new text) the value itself.
        let rewrite = |v: Vec<u8>, answer_value: bool| {
            let v = Bytes::from(v);
            let (effects, _) = put(&v, Cond::Always, kept)?;
            let len = v.len() as u64;
            let value = answer_value.then(|| v.to_vec());
            Ok((effects, Reply::Modified { value, len }))
        };
        match how {
            Modify::IncrBy(by) => {
                let cur = match &old {
                    None => 0,
                    Some(v) => match redis_i64(v) {
                        Some(n) => n,
                        None => return refuse("ERR value is not an integer or out of range"),
                    },
                };
                let Some(n) = cur.checked_add(*by) else {
                    return refuse("ERR increment or decrement would overflow");
                };
                rewrite(n.to_string().into_bytes(), true)
            }
            Modify::IncrByFloat(by) => {
                match crate::redis_float::incr_by_float(old.as_deref(), by) {
                    Ok(t) => rewrite(t.into_bytes(), true),
                    Err(e) => refuse(e.text()),
                }
            }
            Modify::Append(data) => {
                let mut v = old.unwrap_or_default();
                if let Some(r) = too_big(v.len() + data.len()) {
                    return Ok((Vec::new(), r));
                }
                v.extend_from_slice(data);
                rewrite(v, false)
            }
            Modify::SetRange { offset, data } => {
                let mut v = old.unwrap_or_default();
                if data.is_empty() {
                    // Nothing to write: the length as it is.
                    let len = v.len() as u64;
                    return Ok((Vec::new(), Reply::Modified { value: None, len }));
                }
                let end = offset.saturating_add(data.len() as u64);
                if let Some(r) = too_big(end.min(usize::MAX as u64) as usize) {
                    return Ok((Vec::new(), r));
                }
                let (o, end) = (*offset as usize, end as usize);
                if v.len() < end {
                    v.resize(end, 0);
                }
                v[o..end].copy_from_slice(data);
                rewrite(v, false)
            }
            Modify::Swap { data, cond, ttl } => {
                let carried = data.len() + old.as_ref().map_or(0, Vec::len);
                if let Some(r) = too_big(carried) {
                    return Ok((Vec::new(), r));
                }
                let deadline = match *ttl {
                    Ttl::Clear => 0,
                    Ttl::Keep => kept,
                    Ttl::At(at) if at == 0 || at > object::MAX_DEADLINE => {
                        return refuse(INVALID_EXPIRE)
                    }
                    Ttl::At(at) => at,
                };
                let (effects, stored) = put(data, *cond, deadline)?;
                let len = match stored {
                    true => data.len(),
                    false => old.as_ref().map_or(0, Vec::len),
                };
                Ok((
                    effects,
                    Reply::Modified {
                        value: old,
                        len: len as u64,
                    },
                ))
            }
            Modify::Peek => {
                let len = old.as_ref().map_or(0, Vec::len) as u64;
                Ok((Vec::new(), Reply::Modified { value: old, len }))
            }
            Modify::Unchanged {
                version: version_seen,
            } => match version == *version_seen {
                true => Ok((
                    Vec::new(),
                    Reply::Modified {
                        value: None,
                        len: 0,
                    },
                )),
                false => Ok((Vec::new(), Reply::Changed)),
            },
            Modify::Take => {
                let (effects, _) = self.plan_remove(key)?;
                Ok((effects, Reply::Modified { value: old, len: 0 }))
            }
            Modify::Reap => unreachable!("planned above"),
            Modify::Deadline => match old {
                Some(_) => Ok((
                    Vec::new(),
                    Reply::Modified {
                        value: None,
                        len: kept,
                    },
                )),
                None => Ok((Vec::new(), Reply::NoKey)),
            },
            Modify::Expire { at, when } => {
                let changed = |len| Reply::Modified { value: None, len };
                if old.is_none() {
                    return Ok((Vec::new(), changed(0)));
                }
                // No deadline counts as an infinite one (Redis's GT, LT).
                let inf = |d: u64| if d == 0 { u64::MAX } else { d };
                let allowed = match when {
                    ExpireWhen::Always => true,
                    ExpireWhen::IfNone => kept == 0,
                    ExpireWhen::IfSet => kept != 0,
                    ExpireWhen::IfLater => inf(*at) > inf(kept),
                    ExpireWhen::IfEarlier => inf(*at) < inf(kept),
                    ExpireWhen::IfSetAndEarlier => kept != 0 && inf(*at) < inf(kept),
                };
                if !allowed {
                    return Ok((Vec::new(), changed(0)));
                }
                if *at != 0 && self.expired(*at) {
                    let (effects, _) = self.plan_remove(key)?;
                    return Ok((effects, changed(1)));
                }
                if *at > object::MAX_DEADLINE {
                    return refuse(INVALID_EXPIRE);
                }
                // Only the header changes: no value bytes replicated.
                let offset = self.meta()?.get(key).expect("a live key").entry.offset;
                let retime = Effect::Retime {
                    offset,
                    key: key.to_vec(),
                    version: seq,
                    deadline: *at,
                };
                Ok((vec![retime], changed(1)))
            }
        }
    }

    /// The server-side get: the one-sided reader's look-up ([`Lookup`])
    /// run on this node's committed bytes (a primary's arena holds
    /// committed writes only, and nothing changes them while the node
    /// loop runs it), so the node answers by the very rules a client
    /// reads by.
    pub(in crate::node) fn get_key(&self, key: &[u8]) -> Result<Reply, StoreError> {
        crate::proto::check_key(key)?;
        let layout = self
            .layout
            .ok_or_else(|| StoreError::Other("this node holds no key index yet".into()))?;
        let read = |offset: u64, len: u32| {
            let mut buf = vec![0u8; len as usize];
            self.mem
                .read(offset, &mut buf)
                .map(|()| buf)
                .map_err(|e| StoreError::Other(format!("index: {e}")))
        };
        match lookup::run(key, layout, None, read)?.0 {
            // Expired by this node's clock: absent, as to a command.
            Outcome::Found { deadline, .. } if self.expired(deadline) => Ok(Reply::NoKey),
            Outcome::Found {
                offset,
                len,
                generation,
                version,
                data,
                ..
            } => Ok(Reply::Value {
                ptr: self.ptr_at(offset, len as u64, generation),
                generation,
                version,
                data,
            }),
            Outcome::Absent => Ok(Reply::NoKey),
            // Memory that does not change cannot race the look-up: the
            // index does not match the objects.
            Outcome::GaveUp => Err(StoreError::Other(
                "index: the key's slots do not match their objects".into(),
            )),
        }
    }

    /// A scan step: the committed keys matching `pattern` in the buckets
    /// from `cursor` on, until `count` keys were seen, [`SCAN_BUCKETS`]
    /// buckets were walked or [`SCAN_WORK`] was spent matching.
    pub(in crate::node) fn scan(
        &self,
        cursor: u64,
        count: u32,
        pattern: &[u8],
    ) -> Result<Reply, StoreError> {
        if pattern.len() > glob::MAX_PATTERN_LEN {
            return Err(StoreError::BadPattern {
                len: pattern.len() as u64,
                max: glob::MAX_PATTERN_LEN as u64,
            });
        }
        let layout = self
            .layout
            .ok_or_else(|| StoreError::Other("this node holds no key index yet".into()))?;
        let glob = glob::Pattern::new(pattern);
        let mut keys = Vec::new();
        let (mut seen, mut work) = (0u64, 0u64);
        let mut no = cursor;
        while no <= layout.buckets && no < cursor.saturating_add(SCAN_BUCKETS) {
            let b = layout
                .bucket(&self.mem, no)
                .map_err(|e| StoreError::Other(format!("index: {e}")))?;
            for s in b.slots.iter().flatten() {
                if let Ok((k, _)) = object::read_key(&self.mem, s.offset) {
                    seen += 1;
                    work += (k.len() * pattern.len()) as u64;
                    if pattern.is_empty() || glob.matches(&k) {
                        keys.push(k);
                    }
                }
            }
            no += 1;
            if seen >= count.max(1) as u64 || work >= SCAN_WORK {
                break;
            }
        }
        let next = if no > layout.buckets { 0 } else { no };
        Ok(Reply::Keys { keys, next })
    }
}
