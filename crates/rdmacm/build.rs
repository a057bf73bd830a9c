// Names the library librdmacm.so.1, defines Debian's version nodes, and
// records that it needs libibverbs.so.1 (softrdma's, where the connection
// manager lives): a stand-in with that soname is linked for the NEEDED
// entry only; the `softrdma_rdma_*` symbols are resolved when loaded.
use std::process::Command;

fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let out = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    println!("cargo:rerun-if-changed=rdmacm.map");
    println!("cargo:rerun-if-changed=build.rs");
    let stub = format!("{out}/libibverbs.so.1");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let ok = Command::new(&cc)
        .args([
            "-shared",
            "-nostdlib",
            "-Wl,-soname,libibverbs.so.1",
            "-o",
            &stub,
            "-x",
            "c",
            "/dev/null",
        ])
        .status()
        .map(|s| s.success())
        .unwrap_or(false);
    assert!(
        ok,
        "{cc} could not link the libibverbs.so.1 stand-in (install build-essential)"
    );
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/rdmacm.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,librdmacm.so.1");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--no-as-needed");
    println!("cargo:rustc-cdylib-link-arg={stub}");
}
