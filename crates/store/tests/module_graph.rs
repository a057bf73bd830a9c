//! The shape of the store's source (issue 31), as verbs' test keeps the
//! engine's: no import cycle among the top-level modules of `crates/store`,
//! and no source file over 800 lines. The file-size check is a ratchet:
//! a file over the limit must be listed below with a cap, which may only
//! come down; a file that gets within the limit must leave the list. The
//! list is empty since the rebuild of issue 31 took node.rs (2,824 lines),
//! sim.rs, proto.rs and net/{server,client,resp}.rs apart.
//!
//! How the graph is read: verbs' `tests/support/module_graph.rs`, shared;
//! `net/*.rs`, `coord/*.rs` and `node/*.rs` count as one module each there,
//! and the files of `net/` and `node/` get graphs of their own
//! ([`the_files_of_net_form_no_cycle`], `the_files_of_node_form_no_cycle`).

#[path = "../../verbs/tests/support/module_graph.rs"]
mod support;

use std::path::{Path, PathBuf};
use support::{assert_no_cycle, assert_small, graph};

/// Files still over the limit, with the most lines they may have.
const OVERSIZE: &[(&str, usize)] = &[];

const MAX_LINES: usize = 800;

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// The last two cycles went with this test: `index` -> `object` ->
/// `proto` -> `index` (the key hash moved to `object`, which defines the
/// header that stores it, and `check_key` to `proto`, which defines its
/// error), and `auth` -> `net` -> `node`/`config`/`coord` -> `auth`
/// (`random_u64` moved to `auth`, on the `getrandom` crate: no more
/// `unsafe` in `net/mod.rs`).
#[test]
fn the_modules_form_no_cycle() {
    assert_no_cycle(&graph(&src()), "the modules of crates/store");
}

/// The files of `node/` form no cycle among themselves: the replicated
/// image (`image.rs`) is a leaf, and the protocol's files (`replicate`,
/// `copy`, `roles`) use the types of `mod.rs` and the image, not each
/// other's. (`mod.rs` itself is left out: its children name its types.)
#[test]
fn the_files_of_node_form_no_cycle() {
    let g = support::dir_graph(&src().join("node"), "node");
    assert!(
        g.get("copy").is_some_and(|d| d.contains("image")),
        "the graph sees the files: {g:?}"
    );
    assert!(
        g.get("image").is_some_and(|d| d.is_empty()),
        "the image names no other file of node/: {g:?}"
    );
    assert_no_cycle(&g, "the files of crates/store/src/node");
}

#[test]
fn source_files_stay_small() {
    assert_small(&src(), OVERSIZE, MAX_LINES);
}

/// The files of `net/` (one module above) form no cycle among themselves
/// either. The last one, `server` <-> the RESP front door, went when the
/// door began to reach the node only through its own `Front` trait, which
/// the node loop's side implements: the server starts the door, the door
/// knows nothing of the server.
#[test]
fn the_files_of_net_form_no_cycle() {
    let g = support::dir_graph(&src().join("net"), "net");
    // It sees the files, and the door's directory as one node.
    assert!(
        g.get("server").is_some_and(|d| d.contains("redis_door"))
            && g.get("redis_door").is_some_and(|d| d.contains("client")),
        "the graph sees the files: {g:?}"
    );
    assert_no_cycle(&g, "the files of crates/store/src/net");
}
