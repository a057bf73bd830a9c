// Names the library libefa.so.1 and defines Debian's version nodes.
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=efa.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/efa.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libefa.so.1");
}
