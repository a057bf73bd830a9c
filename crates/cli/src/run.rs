//! `softrdma run -- CMD ARGS`: runs an unmodified RDMA application on
//! softrdma's user-space libibverbs and librdmacm (docs/libibverbs.md).
//!
//! The libraries are built next to this binary (`cargo build --release`
//! builds `libibverbs.so`, `librdmacm.so`, `libmlx5.so` and `libefa.so` in
//! the same directory); the dynamic loader wants them under their sonames,
//! so a per-user directory of links named `libibverbs.so.1` and so on is
//! made and put first on `LD_LIBRARY_PATH`. Then the command replaces this
//! process (`exec`), so its exit status and signals are the command's own.

use anyhow::{bail, Context, Result};
use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

#[derive(clap::Args)]
pub struct Args {
    /// The device's address (its GID, what ibv_devinfo shows):
    /// SOFTRDMA_ADDR. Default: the address of the default route.
    #[arg(long)]
    addr: Option<std::net::IpAddr>,
    /// Ask for (and grant) MPA CRC32c on every connection: SOFTRDMA_CRC=1.
    #[arg(long)]
    crc: bool,
    /// No shared-memory path between processes on this host: every
    /// connection carries its bytes over TCP (SOFTRDMA_SAME_HOST=0).
    #[arg(long)]
    tcp_only: bool,
    /// Offer softrdma's extensions to every peer (`on`), to none (`off`;
    /// for a kernel siw peer reached through a port on this host), or only
    /// to peers on this host (`auto`, the default): SOFTRDMA_EXTENSIONS.
    #[arg(long, default_value = "auto", value_parser = ["auto", "on", "off"])]
    extensions: String,
    /// Log filter for the libraries' messages on stderr (SOFTRDMA_LOG):
    /// warn (default), info, debug.
    #[arg(long)]
    lib_log: Option<String>,
    /// Where the built libraries are (SOFTRDMA_LIB_DIR); default: the
    /// directory of this binary.
    #[arg(long)]
    lib_dir: Option<PathBuf>,
    /// Only print the environment the command would get (as `export`
    /// lines for a shell) and exit.
    #[arg(long)]
    print_env: bool,
    /// The command and its arguments.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        required_unless_present = "print_env"
    )]
    cmd: Vec<OsString>,
}

/// The libraries: built file name, soname.
pub const LIBS: [(&str, &str); 4] = [
    ("libibverbs.so", "libibverbs.so.1"),
    ("librdmacm.so", "librdmacm.so.1"),
    ("libmlx5.so", "libmlx5.so.1"),
    ("libefa.so", "libefa.so.1"),
];

fn lib_dir(args: &Args) -> Result<PathBuf> {
    if let Some(d) = args
        .lib_dir
        .clone()
        .or_else(|| std::env::var_os("SOFTRDMA_LIB_DIR").map(PathBuf::from))
    {
        return Ok(d);
    }
    let exe = std::env::current_exe().context("cannot find this binary's path")?;
    Ok(exe
        .parent()
        .context("this binary has no directory")?
        .to_path_buf())
}

/// A directory of links under the sonames, made once per user and library
/// directory, updated if a link points elsewhere.
fn soname_dir(libs: &Path) -> Result<PathBuf> {
    for (file, _) in LIBS {
        if !libs.join(file).is_file() {
            bail!(
                "{} is missing: build the libraries with `cargo build --release` \
                 (they are workspace members), or point --lib-dir at them",
                libs.join(file).display()
            );
        }
    }
    // This process's owner: the owner of its /proc entry.
    let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self")?);
    let tag = {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        libs.hash(&mut h);
        h.finish()
    };
    let name = format!("softrdma-libs-{uid}-{tag:016x}");
    // XDG_RUNTIME_DIR when this user can write there (a `runuser` or
    // `sudo` may leave another user's), else the temporary directory.
    let dir = std::env::var_os("XDG_RUNTIME_DIR")
        .map(|p| PathBuf::from(p).join(&name))
        .filter(|d| std::fs::create_dir_all(d).is_ok())
        .unwrap_or_else(|| std::env::temp_dir().join(&name));
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    for (file, soname) in LIBS {
        let target = libs.join(file);
        let link = dir.join(soname);
        if std::fs::read_link(&link).ok().as_deref() == Some(target.as_path()) {
            continue;
        }
        // Made under another name and renamed over: a command starting
        // meanwhile sees the old link or the new one, never none.
        let tmp = dir.join(format!(".{soname}.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(&target, &tmp)
            .and_then(|_| std::fs::rename(&tmp, &link))
            .with_context(|| format!("cannot link {} to {}", link.display(), target.display()))?;
    }
    Ok(dir)
}

pub fn run(args: Args) -> Result<()> {
    let libs = lib_dir(&args)?;
    let libs = libs.canonicalize().unwrap_or(libs);
    let dir = soname_dir(&libs)?;
    let mut path = OsString::from(dir.as_os_str());
    if let Some(old) = std::env::var_os("LD_LIBRARY_PATH").filter(|v| !v.is_empty()) {
        path.push(":");
        path.push(old);
    }
    let mut env: Vec<(&str, OsString)> = vec![("LD_LIBRARY_PATH", path)];
    if let Some(a) = args.addr {
        env.push(("SOFTRDMA_ADDR", a.to_string().into()));
    }
    if args.crc {
        env.push(("SOFTRDMA_CRC", "1".into()));
    }
    if args.tcp_only {
        env.push(("SOFTRDMA_SAME_HOST", "0".into()));
    }
    match args.extensions.as_str() {
        "on" => env.push(("SOFTRDMA_EXTENSIONS", "1".into())),
        "off" => env.push(("SOFTRDMA_EXTENSIONS", "0".into())),
        _ => {}
    }
    if let Some(l) = &args.lib_log {
        env.push(("SOFTRDMA_LOG", l.into()));
    }
    if args.print_env {
        for (k, v) in &env {
            println!("export {k}='{}'", v.to_string_lossy());
        }
        return Ok(());
    }
    let (prog, rest) = args.cmd.split_first().context("no command given")?;
    let err = std::process::Command::new(prog).args(rest).envs(env).exec();
    bail!("cannot run {}: {err}", prog.to_string_lossy())
}
