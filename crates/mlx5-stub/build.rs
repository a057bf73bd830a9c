// Names the library libmlx5.so.1 and defines Debian's version nodes.
fn main() {
    let dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    println!("cargo:rerun-if-changed=mlx5.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,--version-script={dir}/mlx5.map");
    println!("cargo:rustc-cdylib-link-arg=-Wl,-soname,libmlx5.so.1");
}
