//! `softrdma store promote` and `softrdma store reset`: the operator's
//! tools for what no election decides (issue 33).
//!
//! After a double failure the group elects a primary by itself only among
//! the nodes its record names (the primary, the in-sync secondary); their
//! logs hold every acknowledged write. When such a node's storage is gone
//! for good, an operator can
//!
//! * **promote** another node (a stale secondary, back from its own log):
//!   the coordinator records it as primary, it wins its next campaign and
//!   serves what it holds; every write it lacks is given up (named below
//!   by sequence number, and by how many, as far as the nodes that answer
//!   tell), and a former primary that comes back copies from it;
//! * **reset** the group: the coordinator forgets its record and retires
//!   the incarnations it named; those nodes discard their data on their
//!   next campaign and the group starts empty.
//!
//! Both read the node's configuration (group, coordinator, `[auth]`, the
//! node's address and its peers'), ask the nodes that answer for their
//! state, print what the call would give up, and are refused while a
//! primary holds the lease (a healthy group needs neither). Nothing is
//! changed without `--yes`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args as ClapArgs;
use softrdma_store::config::Config;
use softrdma_store::coord::{GroupRecord, Override};
use softrdma_store::net::client::{ClientConfig, StoreClient};
use softrdma_store::net::handshake::ClientAuth;
use softrdma_store::net::server::coordinator_for;
use softrdma_store::persist::Policy;
use softrdma_store::proto::{role_name, Member, StatusInfo, ROLE_JOINING, ROLE_PRIMARY};

#[derive(ClapArgs)]
pub struct PromoteArgs {
    /// The configuration of the node to promote (it must be running: it
    /// says which incarnation and which writes it holds).
    #[arg(long)]
    config: PathBuf,
    /// Promote it, giving up the writes named. Without it, nothing changes.
    #[arg(long)]
    yes: bool,
}

#[derive(ClapArgs)]
pub struct ResetArgs {
    /// Any node's configuration (its group, coordinator and `[auth]`).
    #[arg(long)]
    config: PathBuf,
    /// Reset the group, giving up every key. Without it, nothing changes.
    #[arg(long)]
    yes: bool,
}

fn load(path: &std::path::Path) -> Result<Config> {
    let cfg = Config::load(path).with_context(|| format!("{}", path.display()))?;
    cfg.validate()
        .with_context(|| format!("{}", path.display()))?;
    Ok(cfg)
}

/// The state of the node at `addr`, proving the group secret.
fn status_of(cfg: &Config, addr: SocketAddr) -> Result<StatusInfo> {
    let creds = cfg.credentials()?;
    let mut c = ClientConfig::new(vec![addr]);
    c.deadline = Duration::from_secs(2);
    c.auth = creds.secret.map(|secret| ClientAuth {
        user: softrdma_store::auth::DEFAULT_USER.into(),
        secret,
    });
    let mut client = StoreClient::new(c)?;
    let (_, r) = client.status_all().pop().context("no status answer")?;
    Ok(r?)
}

fn member_text(m: Member) -> String {
    format!("node {} (incarnation {:#x})", m.node, m.incarnation)
}

fn describe(r: &GroupRecord) -> String {
    format!(
        "epoch {}, primary {}, in sync {}",
        r.epoch,
        member_text(r.primary),
        r.in_sync.map_or("none".into(), member_text)
    )
}

fn state_text(s: &StatusInfo) -> String {
    let persist = match Policy::from_code(s.persist) {
        Policy::Off => String::new(),
        p => format!(", persist {p}, durable through write {}", s.durable_seq),
    };
    format!(
        "{}, epoch {}, {} keys, applied through write {}{persist}",
        role_name(s.role),
        s.epoch,
        s.keys,
        s.applied_seq
    )
}

fn refuse_if_served(group: &str, r: &Option<GroupRecord>, what: &str) -> Result<()> {
    if let Some(r) = r.filter(|r| r.lease_held) {
        bail!(
            "refused: group {group} is served: {} holds the lease ({}); {what} is for a group \
             whose primary is gone",
            member_text(r.primary),
            describe(&r)
        );
    }
    Ok(())
}

/// `softrdma store promote`.
pub fn promote(a: PromoteArgs) -> Result<()> {
    let cfg = load(&a.config)?;
    let g = cfg.group.clone();
    let coord = coordinator_for(&cfg)?;
    let record = coord.get(&g)?;
    refuse_if_served(&g, &record, "promote")?;
    let me = status_of(&cfg, cfg.listen).with_context(|| {
        format!(
            "node {} at {} does not answer: start it on its persistent state first (it waits, \
             fenced, for a primary), then promote it",
            cfg.node_id, cfg.listen
        )
    })?;
    if me.node != cfg.node_id {
        bail!(
            "{} answers as node {}, not node {} of {}",
            cfg.listen,
            me.node,
            cfg.node_id,
            a.config.display()
        );
    }
    let member = Member {
        node: me.node,
        incarnation: me.incarnation,
    };
    println!(
        "group {g}: {}",
        record.as_ref().map_or("no record".into(), describe)
    );
    println!("to promote: {}: {}", member_text(member), state_text(&me));
    // What the others hold beyond it, as far as they answer.
    let mut lost = Vec::new();
    for peer in &cfg.peers {
        match status_of(&cfg, *peer) {
            Ok(s) if s.applied_seq > me.applied_seq && s.role != ROLE_JOINING => {
                lost.push(format!(
                    "writes {}..={} ({} writes) that node {} at {peer} holds ({})",
                    me.applied_seq + 1,
                    s.applied_seq,
                    s.applied_seq - me.applied_seq,
                    s.node,
                    state_text(&s)
                ))
            }
            Ok(s) => println!(
                "node {} at {peer}: {} (nothing beyond)",
                s.node,
                state_text(&s)
            ),
            Err(e) => println!("node at {peer}: does not answer ({e:#})"),
        }
    }
    if let Some(r) = record {
        for m in [Some(r.primary), r.in_sync].into_iter().flatten() {
            if m != member {
                lost.push(format!(
                    "every write after write {} that {} (named by the record) acknowledged, \
                     if it holds any: its log is given up",
                    me.applied_seq,
                    member_text(m)
                ));
            }
        }
    }
    if me.applied_seq == 0 || me.role == ROLE_JOINING {
        lost.push(format!(
            "node {} holds no data: the group starts empty (every key; `store reset` says so \
             plainly)",
            me.node
        ));
    }
    if lost.is_empty() {
        println!("writes that may be lost: none that the nodes answering know of");
    } else {
        println!("writes that may be lost:");
        for l in &lost {
            println!("  - {l}");
        }
    }
    if !a.yes {
        bail!(
            "nothing changed: run again with --yes to promote node {} and give these up",
            me.node
        );
    }
    match coord.promote(&g, member)? {
        Override::Done { record } => {
            println!(
                "promoted: {}",
                record.as_ref().map_or("(no record)".into(), describe)
            );
        }
        Override::LeaseHeld { record } => refuse_if_served(&g, &Some(record), "promote")?,
        Override::Retired => bail!(
            "refused: {} was retired (it discarded its data); promote a running node",
            member_text(member)
        ),
    }
    // It campaigns on its next look at the record.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        match status_of(&cfg, cfg.listen) {
            Ok(s) if s.role == ROLE_PRIMARY => {
                println!("node {} serves as primary at epoch {}", s.node, s.epoch);
                return Ok(());
            }
            _ if Instant::now() >= deadline => {
                bail!("node {} did not become primary within 15 s", me.node)
            }
            _ => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

/// `softrdma store reset`.
pub fn reset(a: ResetArgs) -> Result<()> {
    let cfg = load(&a.config)?;
    let g = cfg.group.clone();
    let coord = coordinator_for(&cfg)?;
    let record = coord.get(&g)?;
    refuse_if_served(&g, &record, "reset")?;
    println!(
        "group {g}: {}",
        record.as_ref().map_or("no record".into(), describe)
    );
    for addr in std::iter::once(cfg.listen).chain(cfg.peers.iter().copied()) {
        match status_of(&cfg, addr) {
            Ok(s) => println!("node {} at {addr}: {} (given up)", s.node, state_text(&s)),
            Err(e) => println!("node at {addr}: does not answer ({e:#})"),
        }
    }
    println!(
        "a reset forgets the record and retires the incarnations it names: those nodes discard \
         their data when they next campaign, and the group starts empty (every key is lost)"
    );
    if !a.yes {
        bail!("nothing changed: run again with --yes to reset group {g}");
    }
    match coord.reset(&g)? {
        Override::Done { record: Some(r) } => println!("reset: forgot {}", describe(&r)),
        Override::Done { record: None } => println!("reset: the coordinator held no record"),
        Override::LeaseHeld { record } => refuse_if_served(&g, &Some(record), "reset")?,
        Override::Retired => bail!("unexpected answer to reset"),
    }
    Ok(())
}
