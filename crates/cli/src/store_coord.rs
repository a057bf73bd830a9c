//! `softrdma store coordinator`: the embedded coordinator of a replica
//! group in the foreground, for groups without etcd (the nodes'
//! `[coordinator] kind = "embedded"`, `addr = ...` names it).
//!
//! It proves the group secret that the nodes' `[auth]` section names (the
//! same file, or read from a node's configuration with `--config`), so only
//! the group's nodes can take part in its elections; without a secret it
//! serves loopback clients only, as a node without `[auth]` does. It prints
//! one line, `coordinator listening on ADDR (...)`, and runs until SIGINT
//! or SIGTERM. The group's record (epoch, primary, lease) lives in its
//! memory only: it must run as long as the group does (a restarted one
//! starts empty, and the running nodes do not elect a primary through it
//! again; docs/store.md, "Quick start").

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;
use softrdma_store::auth::{AuthConfig, Secret};
use softrdma_store::config::{Config, CoordinatorConfig};
use softrdma_store::coord::embedded::EmbeddedServer;

#[derive(ClapArgs)]
pub struct Args {
    /// Address to listen on, e.g. 127.0.0.1:7400 (port 0: any free port;
    /// the line printed at start names it). Default: the `[coordinator]
    /// addr` of --config.
    #[arg(long)]
    listen: Option<SocketAddr>,
    /// A node's TOML configuration: listen on its `[coordinator] addr`
    /// (kind "embedded") and prove its `[auth]` group secret.
    #[arg(long, conflicts_with = "secret_file")]
    config: Option<PathBuf>,
    /// A file whose first line is the group secret (the nodes' `[auth]
    /// secret_file`). Without a secret the coordinator serves loopback
    /// clients only.
    #[arg(long)]
    secret_file: Option<PathBuf>,
    /// Create --secret-file with a new random secret (mode 0600) if it does
    /// not exist yet.
    #[arg(long, requires = "secret_file")]
    create_secret: bool,
}

/// A new random group secret (128 bits, as hex), written to `path` with
/// mode 0600: `create_new` refuses an existing file, else it is replaced.
pub fn write_new_secret(path: &Path, create_new: bool) -> Result<String> {
    use std::os::unix::fs::OpenOptionsExt;
    let secret = format!(
        "{:016x}{:016x}",
        softrdma_store::net::random_u64(),
        softrdma_store::net::random_u64()
    );
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).mode(0o600);
    if create_new {
        opts.create_new(true);
    } else {
        opts.create(true).truncate(true);
    }
    let mut f = opts
        .open(path)
        .with_context(|| format!("{}", path.display()))?;
    writeln!(f, "{secret}")?;
    Ok(secret)
}

/// Where to listen and which secret to prove, and where that came from
/// (for the printed line).
fn settings(a: &Args) -> Result<(SocketAddr, Option<Secret>, String)> {
    if let Some(path) = &a.config {
        let cfg = Config::load(path).with_context(|| format!("{}", path.display()))?;
        let listen = match (a.listen, &cfg.coordinator) {
            (Some(l), _) => l,
            (None, CoordinatorConfig::Embedded { addr }) => *addr,
            (None, CoordinatorConfig::Etcd { .. }) => bail!(
                "{}: its coordinator is etcd, not embedded; give --listen",
                path.display()
            ),
        };
        let secret = cfg.credentials()?.secret;
        let from = format!("the group secret of {}", path.display());
        return Ok((listen, secret, from));
    }
    let Some(listen) = a.listen else {
        bail!("give --listen ADDR (or --config with a node's configuration)");
    };
    let Some(file) = &a.secret_file else {
        return Ok((
            listen,
            None,
            "no group secret: loopback clients only".into(),
        ));
    };
    if a.create_secret && !file.exists() {
        write_new_secret(file, true)?;
    }
    let auth = AuthConfig {
        secret_file: Some(file.clone()),
        ..AuthConfig::default()
    };
    let secret = auth.credentials(None).map_err(anyhow::Error::msg)?.secret;
    Ok((
        listen,
        secret,
        format!("group secret from {}", file.display()),
    ))
}

pub fn run(a: Args) -> Result<()> {
    let (listen, secret, from) = settings(&a)?;
    // Before the server's threads start, so that they inherit the mask and
    // the signal comes to `wait` below.
    let signals = crate::signals::block().context("block SIGINT and SIGTERM")?;
    let server = EmbeddedServer::start_with(listen, secret)?;
    println!("coordinator listening on {} ({from})", server.addr());
    std::io::stdout().flush()?;
    let sig = signals.wait().context("wait for SIGINT or SIGTERM")?;
    tracing::info!("{sig}: the coordinator stops");
    drop(server);
    Ok(())
}
