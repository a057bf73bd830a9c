//! A linearizability checker for histories of registers, in the manner of
//! Knossos and Porcupine (Wing & Gong's search with Lowe's memoisation).
//!
//! A history is a set of operations on independent registers (keys), each
//! with the time it was invoked and the time its result came back. An
//! operation whose outcome is unknown (the client gave up, crashed, or the
//! answer was lost) has no return time: it may have taken effect at any
//! point after its invocation, or never. The history is linearizable iff,
//! for every key, there is a total order of its operations that respects
//! real time (an operation that returned before another was invoked comes
//! first), in which every read returns the value of the latest write
//! before it, and in which an operation with a known outcome appears.
//! Unknown writes may appear or be left out; unknown reads are ignored.
//! Keys are checked one by one (linearizability is compositional).
//!
//! The register model: the value is `Option<u64>`, `None` before the first
//! write and after a delete (`Write(None)`). Values are tags chosen by the
//! workload (typically unique per write), not the bytes. Besides reads and
//! writes, an operation may have seen only whether the register held a
//! value (`Present`: a conditional put that was refused), or have seen
//! that and written atomically (`Swap`: a remove that says whether the key
//! existed, a put that says whether it created the key), or have read the
//! value and written atomically (`Exchange`: `GETSET`, `GETDEL`).
//!
//! [`minimize`] shrinks a failing key's history to a small one that still
//! fails, for a readable report.

use std::collections::{BTreeMap, HashSet};
use std::fmt;

/// What an operation did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    /// Set the register (`None`: delete).
    Write(Option<u64>),
    /// Read the register and saw this value (`None`: absent).
    Read(Option<u64>),
    /// Read the register and saw only whether it held a value (`true`)
    /// or not.
    Present(bool),
    /// Saw whether the register held a value (`was`), then set it to
    /// `to`, atomically.
    Swap {
        /// Whether it held a value before.
        was: bool,
        /// The value it set (`None`: delete).
        to: Option<u64>,
    },
    /// Read the register's value (`was`), then set it to `to`,
    /// atomically (`GETSET`, `GETDEL`).
    Exchange {
        /// The value it held before (`None`: absent).
        was: Option<u64>,
        /// The value it set (`None`: delete).
        to: Option<u64>,
    },
}

impl Kind {
    /// Whether it may take effect on register state `state`, and the
    /// state after it.
    fn step(self, state: Option<u64>) -> (bool, Option<u64>) {
        match self {
            Kind::Write(v) => (true, v),
            Kind::Read(v) => (v == state, state),
            Kind::Present(p) => (state.is_some() == p, state),
            Kind::Swap { was, to } => (state.is_some() == was, to),
            Kind::Exchange { was, to } => (state == was, to),
        }
    }

    /// Whether it only reads (an unknown outcome then says nothing).
    fn is_read(self) -> bool {
        matches!(self, Kind::Read(_) | Kind::Present(_))
    }

    /// The value it writes, if it writes.
    fn written(self) -> Option<Option<u64>> {
        match self {
            Kind::Write(v) | Kind::Swap { to: v, .. } | Kind::Exchange { to: v, .. } => Some(v),
            Kind::Read(_) | Kind::Present(_) => None,
        }
    }
}

/// One operation of a history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Op {
    /// The register.
    pub key: u64,
    /// Who did it (for reports only).
    pub client: u64,
    /// Invocation time (any monotonic unit).
    pub call: u64,
    /// Return time; `None`: outcome unknown.
    pub ret: Option<u64>,
    /// What it did.
    pub kind: Kind,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let v = |x: Option<u64>| x.map_or("-".to_string(), |v| format!("{v:#x}"));
        let what = match self.kind {
            Kind::Write(x) => format!("write {}", v(x)),
            Kind::Read(x) => format!("read  {}", v(x)),
            Kind::Present(p) => format!("read  {}", if p { "(present)" } else { "(absent)" }),
            Kind::Swap { was, to } => format!(
                "write {} (was {})",
                v(to),
                if was { "present" } else { "absent" }
            ),
            Kind::Exchange { was, to } => format!("write {} (was {})", v(to), v(was)),
        };
        let ret = self.ret.map_or("?".to_string(), |r| r.to_string());
        write!(
            f,
            "key {:#x} client {:>4} [{:>10}, {:>10}] {what}",
            self.key, self.client, self.call, ret
        )
    }
}

/// A key whose history is not linearizable.
#[derive(Debug, Clone)]
pub struct Violation {
    /// The key.
    pub key: u64,
    /// Its operations (all of them).
    pub ops: Vec<Op>,
}

/// Checks every key of `ops`; returns the keys that fail, each with its
/// whole history.
pub fn check(ops: &[Op]) -> Vec<Violation> {
    let mut by_key: BTreeMap<u64, Vec<Op>> = BTreeMap::new();
    for o in ops {
        // A read whose result never came back says nothing.
        if o.kind.is_read() && o.ret.is_none() {
            continue;
        }
        by_key.entry(o.key).or_default().push(o.clone());
    }
    by_key
        .into_iter()
        .filter(|(_, h)| !linearizable(h))
        .map(|(key, ops)| Violation { key, ops })
        .collect()
}

/// Entries of the search list: the call or the return of operation `op`.
#[derive(Clone, Copy)]
struct Entry {
    op: usize,
    is_call: bool,
}

/// Whether one key's history (all ops on the same key) is linearizable.
pub fn linearizable(ops: &[Op]) -> bool {
    let n = ops.len();
    if n == 0 {
        return true;
    }
    // Events in time order; at equal times calls come first (concurrent).
    let mut ev: Vec<(u64, u8, usize)> = Vec::with_capacity(2 * n);
    for (i, o) in ops.iter().enumerate() {
        ev.push((o.call, 0, i));
        ev.push((o.ret.unwrap_or(u64::MAX), 1, i));
    }
    ev.sort_unstable();
    let entries: Vec<Entry> = ev
        .iter()
        .map(|&(_, r, op)| Entry {
            op,
            is_call: r == 0,
        })
        .collect();
    // A doubly linked list over `entries` (index m = 2n is the head).
    let m = entries.len();
    let head = m;
    let mut next = vec![usize::MAX; m + 1];
    let mut prev = vec![usize::MAX; m + 1];
    next[head] = 0;
    for i in 0..m {
        prev[i] = if i == 0 { head } else { i - 1 };
        next[i] = if i + 1 < m { i + 1 } else { usize::MAX };
    }
    let mut ret_of = vec![0usize; n];
    let mut call_of = vec![0usize; n];
    for (i, e) in entries.iter().enumerate() {
        if e.is_call {
            call_of[e.op] = i;
        } else {
            ret_of[e.op] = i;
        }
    }
    let unlink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, i: usize| {
        let (p, q) = (prev[i], next[i]);
        next[p] = q;
        if q != usize::MAX {
            prev[q] = p;
        }
    };
    let relink = |next: &mut Vec<usize>, prev: &mut Vec<usize>, i: usize| {
        let (p, q) = (prev[i], next[i]);
        next[p] = i;
        if q != usize::MAX {
            prev[q] = i;
        }
    };
    let words = n.div_ceil(64);
    let mut done = vec![0u64; words];
    let mut seen: HashSet<(Vec<u64>, Option<u64>)> = HashSet::new();
    let mut state: Option<u64> = None;
    // The stack of linearized ops: (op, state before it).
    let mut stack: Vec<(usize, Option<u64>)> = Vec::new();
    let mut cur = next[head];
    // Unknown writes may also be skipped: they stay in the list with their
    // return at infinity, which is never reached before the others.
    loop {
        if cur == usize::MAX {
            // Only unknown ops (returns at infinity) can be left.
            if stack.len() == n || remaining_all_unknown(&entries, &next, head, ops) {
                return true;
            }
            // Unreachable: a known op's return is in the list.
            return false;
        }
        let e = entries[cur];
        if e.is_call {
            let o = &ops[e.op];
            let (ok, new_state) = o.kind.step(state);
            if ok {
                let mut d = done.clone();
                d[e.op / 64] |= 1 << (e.op % 64);
                if seen.insert((d.clone(), new_state)) {
                    stack.push((e.op, state));
                    state = new_state;
                    done = d;
                    unlink(&mut next, &mut prev, call_of[e.op]);
                    unlink(&mut next, &mut prev, ret_of[e.op]);
                    cur = next[head];
                    continue;
                }
            }
            cur = next[cur];
        } else {
            // A return whose op is not linearized yet: it must have taken
            // effect before now; undo the last choice. An unknown op's
            // "return" (at infinity) being reached means every known op is
            // linearized: done.
            if ops[e.op].ret.is_none() {
                return true;
            }
            let Some((op, before)) = stack.pop() else {
                return false;
            };
            state = before;
            done[op / 64] &= !(1 << (op % 64));
            relink(&mut next, &mut prev, ret_of[op]);
            relink(&mut next, &mut prev, call_of[op]);
            cur = next[call_of[op]];
        }
    }
}

fn remaining_all_unknown(entries: &[Entry], next: &[usize], head: usize, ops: &[Op]) -> bool {
    let mut i = next[head];
    while i != usize::MAX {
        if ops[entries[i].op].ret.is_some() {
            return false;
        }
        i = next[i];
    }
    true
}

/// Shrinks a non-linearizable history of one key to a small one that still
/// fails: drops operations one at a time while the rest stays
/// non-linearizable, but never the write of a value that a remaining read
/// returned (else every stale read would shrink to "a read of a value never
/// written", which hides the cause).
pub fn minimize(ops: &[Op]) -> Vec<Op> {
    let mut cur = ops.to_vec();
    debug_assert!(!linearizable(&cur));
    // Passes until nothing more goes (a write may become removable once
    // the reads of its value are gone).
    loop {
        let before = cur.len();
        cur = minimize_pass(cur);
        if cur.len() == before {
            break;
        }
    }
    cur.sort_by_key(|o| (o.call, o.ret));
    cur
}

fn minimize_pass(mut cur: Vec<Op>) -> Vec<Op> {
    let mut i = 0;
    while i < cur.len() {
        let explains = match cur[i].kind.written() {
            Some(v) => cur.iter().any(|o| o.kind == Kind::Read(v) && v.is_some()),
            None => false,
        };
        let mut trial = cur.clone();
        trial.remove(i);
        if !explains && !linearizable(&trial) {
            cur = trial;
        } else {
            i += 1;
        }
    }
    cur
}

/// A report of violations: per key, the minimised history (and how many
/// operations the key had).
pub fn report(v: &[Violation]) -> String {
    let mut s = String::new();
    for x in v {
        let min = minimize(&x.ops);
        s.push_str(&format!(
            "key {:#x}: not linearizable ({} ops); a minimal failing history:\n",
            x.key,
            x.ops.len()
        ));
        for o in &min {
            s.push_str(&format!("  {o}\n"));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn op(call: u64, ret: Option<u64>, kind: Kind) -> Op {
        Op {
            key: 1,
            client: 0,
            call,
            ret,
            kind,
        }
    }
    use Kind::*;

    #[test]
    fn known_answers() {
        // Sequential write then read.
        assert!(linearizable(&[
            op(0, Some(1), Write(Some(1))),
            op(2, Some(3), Read(Some(1))),
        ]));
        // A stale read: the write of 2 returned before the read began.
        assert!(!linearizable(&[
            op(0, Some(1), Write(Some(1))),
            op(2, Some(3), Write(Some(2))),
            op(4, Some(5), Read(Some(1))),
        ]));
        // Concurrent read may see either.
        for v in [1, 2] {
            assert!(linearizable(&[
                op(0, Some(1), Write(Some(1))),
                op(2, Some(6), Write(Some(2))),
                op(4, Some(5), Read(Some(v))),
            ]));
        }
        // New/old inversion between two readers.
        assert!(!linearizable(&[
            op(0, Some(1), Write(Some(1))),
            op(2, Some(10), Write(Some(2))),
            op(3, Some(4), Read(Some(2))),
            op(5, Some(6), Read(Some(1))),
        ]));
        // An unknown write may have happened...
        assert!(linearizable(&[
            op(0, Some(1), Write(Some(1))),
            op(2, None, Write(Some(2))),
            op(5, Some(6), Read(Some(2))),
            op(7, Some(8), Read(Some(2))),
        ]));
        // ... or not,
        assert!(linearizable(&[
            op(0, Some(1), Write(Some(1))),
            op(2, None, Write(Some(2))),
            op(5, Some(6), Read(Some(1))),
        ]));
        // but not both ways round in sequence.
        assert!(!linearizable(&[
            op(0, Some(1), Write(Some(1))),
            op(2, None, Write(Some(2))),
            op(5, Some(6), Read(Some(2))),
            op(7, Some(8), Read(Some(1))),
        ]));
        // A value nobody wrote.
        assert!(!linearizable(&[op(0, Some(1), Read(Some(9)))]));
        // Delete, then absent; a resurrection fails.
        assert!(linearizable(&[
            op(0, Some(1), Write(Some(1))),
            op(2, Some(3), Write(None)),
            op(4, Some(5), Read(None)),
        ]));
        assert!(!linearizable(&[
            op(0, Some(1), Write(Some(1))),
            op(2, Some(3), Write(None)),
            op(4, Some(5), Read(Some(1))),
        ]));
        // A read of a value before its write was invoked.
        assert!(!linearizable(&[
            op(0, Some(1), Read(Some(1))),
            op(2, Some(3), Write(Some(1))),
        ]));
    }

    /// What a refused conditional put and a remove's `existed` say about
    /// the register is checked too.
    #[test]
    fn presence_is_checked() {
        // A put "if absent" refused although the key was deleted before.
        assert!(!linearizable(&[
            op(0, Some(1), Write(Some(1))),
            op(2, Some(3), Write(None)),
            op(4, Some(5), Present(true)),
        ]));
        assert!(linearizable(&[
            op(0, Some(1), Write(Some(1))),
            op(2, Some(3), Present(true)),
            op(4, Some(5), Write(None)),
            op(6, Some(7), Present(false)),
        ]));
        // A remove that says the key existed, of a key never written.
        assert!(!linearizable(&[op(
            0,
            Some(1),
            Swap {
                was: true,
                to: None
            }
        )]));
        // Two removes that both say it existed, with no write between.
        assert!(!linearizable(&[
            op(0, Some(1), Write(Some(1))),
            op(
                2,
                Some(3),
                Swap {
                    was: true,
                    to: None
                }
            ),
            op(
                4,
                Some(5),
                Swap {
                    was: true,
                    to: None
                }
            ),
        ]));
        // Concurrent ones: one of them removed it.
        assert!(!linearizable(&[
            op(0, Some(1), Write(Some(1))),
            op(
                2,
                Some(5),
                Swap {
                    was: true,
                    to: None
                }
            ),
            op(
                3,
                Some(6),
                Swap {
                    was: true,
                    to: None
                }
            ),
        ]));
        assert!(linearizable(&[
            op(0, Some(1), Write(Some(1))),
            op(
                2,
                Some(5),
                Swap {
                    was: true,
                    to: None
                }
            ),
            op(
                3,
                Some(6),
                Swap {
                    was: false,
                    to: None
                }
            ),
        ]));
        // A put that created the key, which was there: not linearizable;
        // and what it wrote is read afterwards.
        assert!(!linearizable(&[
            op(0, Some(1), Write(Some(1))),
            op(
                2,
                Some(3),
                Swap {
                    was: false,
                    to: Some(2)
                }
            ),
        ]));
        assert!(linearizable(&[
            op(
                0,
                Some(1),
                Swap {
                    was: false,
                    to: Some(1)
                }
            ),
            op(
                2,
                Some(3),
                Swap {
                    was: true,
                    to: Some(2)
                }
            ),
            op(4, Some(5), Read(Some(2))),
        ]));
        // An unknown presence read says nothing.
        assert!(check(&[op(0, None, Present(true))]).is_empty());
    }

    #[test]
    fn minimize_keeps_the_failure_small() {
        let mut h = vec![op(0, Some(1), Write(Some(1)))];
        for i in 0..30 {
            h.push(op(10 + i * 10, Some(15 + i * 10), Read(Some(1))));
        }
        h.push(op(400, Some(401), Write(Some(2))));
        h.push(op(500, Some(501), Read(Some(1))));
        let min = minimize(&h);
        assert!(!linearizable(&min));
        assert!(min.len() <= 3, "{min:?}");
        assert!(report(&check(&h)).contains("not linearizable"));
    }

    /// Histories made by running operations one at a time against a real
    /// register, then widening each operation's interval at random (so
    /// they overlap) and forgetting some writes' outcomes, are
    /// linearizable; changing one read's value to a value that was never
    /// current in its window makes them fail.
    fn history(seed: Vec<(bool, u8, u8, u8)>) -> Vec<Op> {
        let mut reg: Option<u64> = None;
        let mut out = Vec::new();
        let mut next = 1;
        for (t, (is_write, before, after, unknown)) in seed.into_iter().enumerate() {
            let at = 30 * t as u64 + 50;
            let call = at - before as u64 % 50;
            let ret = at + after as u64 % 50;
            let kind = if is_write {
                reg = Some(next);
                next += 1;
                Write(reg)
            } else {
                Read(reg)
            };
            let ret = if is_write && unknown % 5 == 0 {
                None
            } else {
                Some(ret)
            };
            out.push(op(call, ret, kind));
        }
        out
    }

    proptest! {
        #[test]
        fn sequential_histories_widened_are_linearizable(
            seed in prop::collection::vec((any::<bool>(), any::<u8>(), any::<u8>(), any::<u8>()), 1..60)
        ) {
            let h = history(seed);
            prop_assert!(linearizable(&h), "{h:?}");
        }

        #[test]
        fn a_read_of_an_old_value_after_two_newer_writes_fails(
            seed in prop::collection::vec((any::<bool>(), any::<u8>(), any::<u8>(), any::<u8>()), 1..60)
        ) {
            let mut h = history(seed);
            // Two known writes after the first one, then a read of the
            // first value strictly after both returned.
            let t = h.iter().map(|o| o.ret.unwrap_or(o.call)).max().unwrap_or(0) + 10;
            h.push(op(t, Some(t + 1), Write(Some(1_000))));
            h.push(op(t + 2, Some(t + 3), Write(Some(1_001))));
            h.push(op(t + 4, Some(t + 5), Read(Some(1_000))));
            prop_assert!(!linearizable(&h));
        }
    }
}
