//! Persistence of the HA store (issue 33) with real processes: each node
//! of a two-node group logs to a partition of its own local store
//! (`softrdma storage init` files, through a local queue pair); both nodes
//! are killed with SIGKILL at once and restarted, and every acknowledged
//! write reads back, at the same remote pointers under the same STag.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

mod common;
use common::store::{Group, SOFTRDMA};

/// Two stores (one per node), each one partition granted `rw` to
/// principal `store`, in a directory of their own (the group's directory
/// is wiped when the group starts).
fn stores(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("softrdma-{name}-stores-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for n in 1..=2 {
        let path = dir.join(format!("node{n}.store"));
        run(
            &["storage", "init"],
            &path,
            &["--size", "48MiB", "--partitions", "1"],
        );
        run(&["storage", "grant"], &path, &["0", "store", "rw"]);
    }
    dir
}

fn run(cmd: &[&str], path: &Path, rest: &[&str]) {
    let out = Command::new(SOFTRDMA)
        .args(cmd)
        .arg(path)
        .args(rest)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "softrdma {cmd:?} {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn persist_toml(dir: &Path, policy: &str) -> String {
    format!(
        "[persist]\nstorage = \"{}/node{{node}}.store\"\npartition = 0\nprincipal = \"store\"\npolicy = \"{policy}\"\n",
        dir.display()
    )
}

/// `always`: both nodes killed at once after a run of acknowledged writes
/// (keyed and by pointer), both restarted: the group elects a primary
/// from what the partitions hold and serves every write, pointers and
/// STag unchanged.
#[test]
fn a_group_killed_whole_comes_back_with_every_acknowledged_write() {
    let dir = stores("persist-always");
    let mut g = Group::with_config(
        "persist-always",
        "8MiB",
        None,
        &persist_toml(&dir, "always"),
    );
    let arena_before = g.status()[0].stag;
    let mut keys = Vec::new();
    for i in 0..300u32 {
        let k = format!("key-{i}").into_bytes();
        let v = format!("value-{i}-{}", "x".repeat((i % 7) as usize * 100)).into_bytes();
        g.probe.set(&k, &v).unwrap();
        keys.push((k, v));
    }
    let ptrs: Vec<_> = (0..50u32)
        .map(|i| {
            let v = format!("object-{i}").into_bytes();
            (g.probe.alloc(&v).unwrap(), v)
        })
        .collect();
    // Some deleted: they must stay deleted.
    for (k, _) in keys.iter().step_by(10) {
        assert!(g.probe.del(k).unwrap());
    }
    // Both nodes say so, and (every write acknowledged) that their logs
    // hold every write durably.
    for s in g.status() {
        assert_eq!(s.persist, 2, "{s:?}");
        assert_eq!(s.durable_seq, s.applied_seq, "{s:?}");
    }
    let epoch = g.epoch();
    for n in &mut g.nodes {
        n.kill();
    }
    g.nodes[0].start("auto");
    g.nodes[1].start("auto");
    g.wait_redundant(Duration::from_secs(60), epoch);
    let st = g.status();
    assert_eq!(st[0].stag, arena_before, "the arena's STag survives");
    for (i, (k, v)) in keys.iter().enumerate() {
        let got = g.probe.get(k).unwrap();
        if i % 10 == 0 {
            assert_eq!(got, None, "key {} was deleted", String::from_utf8_lossy(k));
        } else {
            assert_eq!(got.as_ref(), Some(v), "key {}", String::from_utf8_lossy(k));
        }
    }
    for (p, v) in &ptrs {
        assert_eq!(
            &g.probe.read_ptr(*p).unwrap(),
            v,
            "pointer {p:?} (one-sided)"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}
