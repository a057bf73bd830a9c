//! The checks, once the group is quiescent: acknowledged writes read back,
//! nothing resurrected or leaked, identical replicas, and linearizable
//! histories.

use super::{tag_of, Sim, KEY_OID};
use crate::arena::Memory;
use crate::index::{self, Layout, Meta};
use crate::lincheck::{self, Kind};
use crate::node::{Micros, Role};
use crate::object;
use crate::proto::Op;

impl Sim {
    pub(super) fn quiescent(&self) -> bool {
        self.crash_phase_over
            && self.nodes.len() == 2
            && self
                .clients
                .iter()
                .all(|c| c.done >= self.cfg.ops_per_client && c.inflight.is_none())
            && {
                let p = self.nodes.values().find(|n| n.role() == Role::Primary);
                let s = self.nodes.values().find(|n| n.role() == Role::Secondary);
                match (p, s) {
                    (Some(p), Some(s)) => {
                        p.is_redundant()
                            && p.is_idle()
                            && s.is_synced_secondary()
                            && p.applied_seq() == s.applied_seq()
                    }
                    _ => false,
                }
            }
    }

    pub(super) fn verify(&mut self) {
        let p = self
            .nodes
            .values()
            .find(|n| n.role() == Role::Primary)
            .unwrap();
        let s = self
            .nodes
            .values()
            .find(|n| n.role() == Role::Secondary)
            .unwrap();
        let mut v = Vec::new();
        if p.memory().bytes() != s.memory().bytes() {
            let first = p
                .memory()
                .bytes()
                .iter()
                .zip(s.memory().bytes())
                .position(|(a, b)| a != b)
                .unwrap();
            v.push(format!("arenas differ (first at offset {first})"));
        }
        if p.allocator().snapshot() != s.allocator().snapshot() {
            v.push("allocators differ".into());
        }
        if p.dedup_table() != s.dedup_table() {
            v.push("retry tables differ".into());
        }
        let mut live = 0;
        for (c, cl) in self.clients.iter().enumerate() {
            for o in &cl.objects {
                live += 1;
                let off = o.ptr.addr - self.arena.base;
                match p.allocator().allocation_at(off) {
                    Some(l) if l == o.ptr.len as u64 => {}
                    other => v.push(format!("client {c}: object {} lost ({other:?})", o.ptr)),
                }
                match object::read_object(p.memory(), off, o.ptr.len as u64) {
                    Ok(d) if d.data == o.data => {}
                    r => v.push(format!(
                        "client {c}: object {} altered: {:?}",
                        o.ptr,
                        r.map(|d| (d.version, d.data.len()))
                    )),
                }
            }
            for (ptr, data) in &cl.deleted {
                let off = ptr.addr - self.arena.base;
                if let Ok(d) = object::read_object(p.memory(), off, ptr.len as u64) {
                    if &d.data == data {
                        v.push(format!("client {c}: deleted object {ptr} resurrected"));
                    }
                }
            }
        }
        // The history of every object is linearizable; writes still in
        // flight count as possibly applied (a conditional one as if it
        // were unconditional: looser, so never a false alarm).
        let mut h = self.history.clone();
        for (c, cl) in self.clients.iter().enumerate() {
            if let Some(inf) = &cl.inflight {
                // Keys with deadlines have checks of their own.
                if inf.key_no.is_some_and(super::expiry::is_ttl_key) {
                    continue;
                }
                // A batch's puts, each possibly applied.
                if let Op::Batch { ops, .. } = &inf.op {
                    for op in ops {
                        if let Op::Put { key, data, .. } = op {
                            h.push(lincheck::Op {
                                key: KEY_OID + super::key_no(key),
                                client: c as u64,
                                call: inf.call,
                                ret: None,
                                kind: Kind::Write(tag_of(data)),
                            });
                        }
                    }
                    continue;
                }
                let kind = match &inf.op {
                    Op::Update { data, .. }
                    | Op::Put { data, .. }
                    | Op::Modify {
                        how: crate::proto::Modify::Swap { data, .. },
                        ..
                    } => Kind::Write(tag_of(data)),
                    Op::Delete { .. } | Op::Remove { .. } | Op::Modify { .. } => Kind::Write(None),
                    _ => continue,
                };
                let oid = match inf.key_no {
                    Some(k) => KEY_OID + k,
                    None => cl.objects[inf.obj.unwrap()].oid,
                };
                h.push(lincheck::Op {
                    key: oid,
                    client: c as u64,
                    call: inf.call,
                    ret: None,
                    kind,
                });
            }
        }
        self.report.in_lossy_window += loosen_for_everysec(&self.lossy, &mut h);
        let bad = lincheck::check(&h);
        if !bad.is_empty() {
            v.push(format!(
                "{} objects' histories are not linearizable:\n{}",
                bad.len(),
                lincheck::report(&bad[..bad.len().min(3)])
            ));
        }
        // The key index: the same state on both nodes, and what the
        // primary's bytes say (rebuilt as a node that copied them would).
        let (pm, sm) = (p.index_meta(), s.index_meta());
        if pm != sm {
            v.push("the nodes' key indexes differ".into());
        }
        let layout = Layout::for_arena(self.arena.len, self.cfg.index_buckets);
        let mut sb = [0u8; index::SUPERBLOCK_LEN as usize];
        p.memory().read(0, &mut sb).expect("in the arena");
        if Layout::from_superblock(&sb, self.arena.len) != Ok(layout) {
            v.push("the arena's superblock does not describe its index".into());
        }
        let rebuilt = Meta::from_memory(layout, p.memory(), |s| {
            object::read_key(p.memory(), s.offset).ok()
        });
        if rebuilt.as_ref().ok() != pm {
            v.push(format!(
                "the index bytes disagree with its state: {rebuilt:?}"
            ));
        }
        let keys = pm.map_or(0, |m| m.len() as u64);
        // Objects of the pointer API, keys' objects, and the index.
        let allocs = p.allocator().usage().allocations;
        if allocs != live + keys + 1 {
            v.push(format!(
                "{allocs} allocations but {live} live objects, {keys} keys and the index \
                 (a retried write applied twice?)"
            ));
        }
        let div = self.divergences + p.divergences() + s.divergences();
        if div != 0 {
            v.push(format!(
                "{div} forwarded writes failed to apply on a secondary ({:?} {:?})",
                p.last_divergence(),
                s.last_divergence()
            ));
        }
        v.extend(self.ttl_check());
        self.violations.extend(v);
    }
}

/// Under `everysec`, a whole-group crash may lose writes acknowledged
/// within [`EVERYSEC_BOUND`](super::persist_sim) before it, and only
/// those: an operation that returned in such a window becomes one
/// whose outcome is unknown (a write may have taken effect or not),
/// and a read that returned in it is dropped (it may have seen a write
/// the crash took back). Whatever returned earlier must hold across
/// the crash, as under `always`. Returns how many acknowledged operations
/// it loosened.
fn loosen_for_everysec(windows: &[(Micros, Micros)], h: &mut Vec<lincheck::Op>) -> u64 {
    if windows.is_empty() {
        return 0;
    }
    let lossy = |t: Micros| windows.iter().any(|&(b, c)| t > b && t <= c);
    let before = h.iter().filter(|op| op.ret.is_some()).count();
    h.retain_mut(|op| match op.ret {
        Some(r) if lossy(r) => match op.kind {
            Kind::Read(_) | Kind::Present(_) => false,
            Kind::Write(_) | Kind::Swap { .. } | Kind::Exchange { .. } => {
                op.ret = None;
                true
            }
        },
        _ => true,
    });
    let after = h.iter().filter(|op| op.ret.is_some()).count();
    (before - after) as u64
}
