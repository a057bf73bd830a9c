//! `softrdma storage init|show|grant|revoke|token` on real files: layouts,
//! grants that persist, and invalid or damaged input that gets a clear
//! error and leaves the file byte for byte as it was.

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SOFTRDMA: &str = env!("CARGO_BIN_EXE_softrdma");
const MIB: u64 = 1 << 20;

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let d =
            std::env::temp_dir().join(format!("softrdma-storage-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn file(&self, n: &str) -> PathBuf {
        self.0.join(n)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn storage(args: &[&str]) -> Output {
    Command::new(SOFTRDMA)
        .arg("storage")
        .args(args)
        .output()
        .expect("run softrdma")
}

fn ok(args: &[&str]) -> String {
    let o = storage(args);
    assert!(
        o.status.success(),
        "storage {args:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8(o.stdout).unwrap()
}

/// Runs a command that must fail; returns its error text.
fn fails(args: &[&str]) -> String {
    let o = storage(args);
    assert!(!o.status.success(), "storage {args:?} should have failed");
    String::from_utf8(o.stderr).unwrap()
}

fn show(p: &Path) -> Value {
    serde_json::from_str(&ok(&["show", p.to_str().unwrap(), "--json"])).unwrap()
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

#[test]
fn init_equal_partitions_and_show() {
    let d = Dir::new("equal");
    let f = d.file("store.img");
    let out = ok(&["init", s(&f), "--size", "64MiB", "--partitions", "4"]);
    assert!(out.contains("4 partitions"), "{out}");
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 64 * MIB);
    let v = show(&f);
    assert_eq!(v["size"].as_u64(), Some(64 * MIB));
    assert_eq!(v["generation"].as_u64(), Some(1));
    assert_eq!(v["store_id"].as_str().unwrap().len(), 32);
    let parts = v["partitions"].as_array().unwrap();
    assert_eq!(parts.len(), 4);
    let mut end = MIB; // the metadata area
    for p in parts {
        let (off, size) = (p["offset"].as_u64().unwrap(), p["size"].as_u64().unwrap());
        assert_eq!(off, end, "{p}");
        assert_eq!(off % MIB, 0);
        assert_eq!(size, 15 * MIB, "63 MiB / 4 rounded down to the alignment");
        end = off + size;
    }
    let text = ok(&["show", s(&f)]);
    assert!(text.contains("principals: none"), "{text}");
}

#[test]
fn layout_spec_names_and_rest() {
    let d = Dir::new("layout");
    let f = d.file("store.img");
    ok(&[
        "init",
        s(&f),
        "--size",
        "32MiB",
        "--layout",
        "meta=4MiB,data=rest",
        "--align",
        "64KiB",
    ]);
    let v = show(&f);
    let p = v["partitions"].as_array().unwrap();
    assert_eq!(p[0]["name"], "meta");
    assert_eq!(p[0]["size"].as_u64(), Some(4 * MIB));
    assert_eq!(p[1]["name"], "data");
    assert_eq!(p[1]["offset"].as_u64(), Some(5 * MIB));
    assert_eq!(p[1]["size"].as_u64(), Some(27 * MIB));
}

#[test]
fn grants_persist_and_revoke_narrows() {
    let d = Dir::new("grants");
    let f = d.file("store.img");
    ok(&[
        "init",
        s(&f),
        "--size",
        "16MiB",
        "--layout",
        "a=4MiB,b=rest",
    ]);
    let out = ok(&["grant", s(&f), "a", "alice", "rw"]);
    let token = out
        .lines()
        .find_map(|l| l.split("token ").nth(1))
        .expect("a new principal's token is printed")
        .trim()
        .to_string();
    assert_eq!(token.len(), 64);
    assert_eq!(ok(&["token", s(&f), "alice"]).trim(), token);
    // A second grant to a known principal prints no new token.
    let out = ok(&["grant", s(&f), "1", "alice", "r"]);
    assert!(!out.contains("token"), "{out}");
    ok(&["grant", s(&f), "b", "bob", "r"]);
    let v = show(&f);
    assert_eq!(v["partitions"][0]["access"]["alice"], "rw");
    assert_eq!(v["partitions"][1]["access"]["alice"], "r");
    assert_eq!(v["partitions"][1]["access"]["bob"], "r");
    assert_eq!(v["generation"].as_u64(), Some(4));
    ok(&["revoke", s(&f), "a", "alice", "w"]);
    assert_eq!(show(&f)["partitions"][0]["access"]["alice"], "r");
    ok(&["revoke", s(&f), "a", "alice", "rw"]);
    assert!(show(&f)["partitions"][0]["access"].get("alice").is_none());
    // Unknown partition and principal: clear errors.
    assert!(fails(&["grant", s(&f), "zz", "alice", "r"]).contains("no partition"));
    assert!(fails(&["grant", s(&f), "7", "alice", "r"]).contains("no partition"));
    assert!(fails(&["revoke", s(&f), "a", "carol", "r"]).contains("no principal"));
    assert!(fails(&["grant", s(&f), "a", "alice", "x"]).contains("r, w or rw"));
}

/// Invalid settings: an error that names the problem, and the file exactly
/// as before (or not created at all).
#[test]
fn invalid_settings_leave_the_store_untouched() {
    let d = Dir::new("invalid");
    let f = d.file("store.img");
    ok(&["init", s(&f), "--size", "16MiB", "--partitions", "2"]);
    ok(&["grant", s(&f), "0", "alice", "rw"]);
    let before = std::fs::read(&f).unwrap();
    let cases: &[(&[&str], &str)] = &[
        (&["--layout", "4MiB@1MiB,4MiB@3MiB", "--force"], "overlap"),
        (
            &["--layout", "4MiB@1028KiB", "--force"],
            "not a multiple of the alignment",
        ),
        (
            &["--layout", "4MiB@0", "--force"],
            "inside the metadata area",
        ),
        (&["--layout", "20MiB", "--force"], "past the end"),
        (&["--partitions", "0", "--force"], "at least one partition"),
        (&["--align", "3000", "--force"], "alignment"),
        (&["--size", "1MiB", "--force"], "too small"),
        (&["--layout", "a=1MiB,a=1MiB", "--force"], "duplicate name"),
        (&[], "already holds a softrdma store"),
    ];
    for (extra, want) in cases {
        let mut args = vec!["init", s(&f)];
        args.extend_from_slice(extra);
        let err = fails(&args);
        assert!(err.contains(want), "{extra:?}: want {want:?} in {err}");
        assert!(
            std::fs::read(&f).unwrap() == before,
            "{extra:?} changed the file"
        );
    }
    // A new path with an invalid layout is not even created.
    let g = d.file("new.img");
    let err = fails(&[
        "init",
        s(&g),
        "--size",
        "8MiB",
        "--layout",
        "4MiB@1MiB,4MiB@2MiB",
    ]);
    assert!(err.contains("overlap"), "{err}");
    assert!(!g.exists());
    assert!(fails(&["init", s(&g)]).contains("give a size"));
    assert!(!g.exists());
}

#[test]
fn foreign_and_corrupt_superblocks() {
    let d = Dir::new("corrupt");
    // Foreign data: refused by show and init; --force overwrites.
    let f = d.file("foreign.img");
    let junk: Vec<u8> = (0..4 * MIB).map(|i| (i * 7 + 3) as u8).collect();
    std::fs::write(&f, &junk).unwrap();
    assert!(fails(&["show", s(&f)]).contains("not a softrdma store"));
    assert!(fails(&["grant", s(&f), "0", "x", "r"]).contains("not a softrdma store"));
    assert!(fails(&["init", s(&f)]).contains("not a softrdma store (use --force"));
    assert!(std::fs::read(&f).unwrap() == junk);
    ok(&["init", s(&f), "--force"]);
    assert_eq!(show(&f)["size"].as_u64(), Some(4 * MIB));

    // One damaged copy: the other is used and the damage reported; the
    // next update rewrites the damaged (older) copy.
    let g = d.file("store.img");
    ok(&["init", s(&g), "--size", "8MiB"]);
    ok(&["grant", s(&g), "0", "alice", "r"]); // generation 2, in copy 0
    let mut b = std::fs::read(&g).unwrap();
    b[40] ^= 0xff; // copy 0's device size field
    std::fs::write(&g, &b).unwrap();
    let v = show(&g);
    assert_eq!(v["damaged_copies"], serde_json::json!([0]));
    assert_eq!(v["generation"].as_u64(), Some(1), "falls back to copy 1");
    assert!(ok(&["show", s(&g)]).contains("copy 0 is damaged"));
    ok(&["grant", s(&g), "0", "bob", "r"]); // generation 2 again, into copy 0
    let v = show(&g);
    assert_eq!(v["damaged_copies"], serde_json::json!([]));
    assert!(v["partitions"][0]["access"].get("bob").is_some());

    // Both copies damaged: a clear error, nothing written by anyone.
    let mut b = std::fs::read(&g).unwrap();
    b[40] ^= 0xff;
    b[(MIB / 2) as usize + 40] ^= 0xff;
    std::fs::write(&g, &b).unwrap();
    assert!(fails(&["show", s(&g)]).contains("corrupt superblock"));
    assert!(fails(&["grant", s(&g), "0", "carol", "r"]).contains("corrupt superblock"));
    assert!(fails(&["init", s(&g)]).contains("already holds"));
    assert!(std::fs::read(&g).unwrap() == b);
}

/// Updates from several processes at once all land: each takes the
/// device's lock and re-reads the metadata before writing the next
/// generation (without it, they would overwrite each other's grants).
#[test]
fn concurrent_grants_are_not_lost() {
    let d = Dir::new("concurrent");
    let f = d.file("store.img");
    ok(&["init", s(&f), "--size", "8MiB"]);
    let children: Vec<_> = (0..24)
        .map(|i| {
            Command::new(SOFTRDMA)
                .args(["storage", "grant", s(&f), "0", &format!("p{i}"), "rw"])
                .stdout(std::process::Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    for mut c in children {
        assert!(c.wait().unwrap().success());
    }
    let v = show(&f);
    let acc = v["partitions"][0]["access"].as_object().unwrap();
    assert_eq!(acc.len(), 24, "{acc:?}");
    assert_eq!(v["generation"].as_u64(), Some(25));
}

/// A block device (a loop device over a file, set up here; needs root and
/// util-linux's `losetup`, which scripts/setup.sh provides): its size comes
/// from the device, a larger `--size` is refused, and what `init` and
/// `grant` write reaches the backing file.
#[test]
fn block_device_via_loop() {
    struct Loop(String);
    impl Drop for Loop {
        fn drop(&mut self) {
            let _ = Command::new("losetup").args(["-d", &self.0]).status();
        }
    }
    let d = Dir::new("loop");
    let img = d.file("backing.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(32 * MIB)
        .unwrap();
    let out = Command::new("losetup")
        .args(["-f", "--show", s(&img)])
        .output()
        .expect("losetup (util-linux) must be installed");
    assert!(
        out.status.success(),
        "losetup -f failed (root and /dev/loop-control needed): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dev = Loop(String::from_utf8(out.stdout).unwrap().trim().to_string());
    let err = fails(&["init", &dev.0, "--size", "64MiB"]);
    assert!(err.contains("larger than the device"), "{err}");
    ok(&["init", &dev.0, "--partitions", "2"]);
    ok(&["grant", &dev.0, "1", "alice", "rw"]);
    let v: Value = serde_json::from_str(&ok(&["show", &dev.0, "--json"])).unwrap();
    assert_eq!(v["block_device"], true);
    assert_eq!(v["size"].as_u64(), Some(32 * MIB));
    assert_eq!(v["partitions"][1]["access"]["alice"], "rw");
    drop(dev);
    // Through the device into the file.
    let v = show(&img);
    assert_eq!(v["block_device"], false);
    assert_eq!(v["partitions"][1]["access"]["alice"], "rw");
}
