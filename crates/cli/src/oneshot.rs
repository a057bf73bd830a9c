//! `softrdma transfer oneshot`: an iSER-like write, host A asking host B
//! to fetch A's data, done the one-shot way (A: `advertise` + wait for
//! B's close) and the conventional way (A: fast-register WR + Send, wait,
//! Local Invalidate WR), with the driver calls each side makes and the
//! messages on the wire counted, and commands/s measured for both.
//! Both ends are in this process on iWARP over loopback TCP, with
//! softrdma's extensions (so the STag rides in the RDMAP header).

use anyhow::{bail, Context, Result};
use softrdma_verbs::*;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(30);

/// Driver calls, counted where they are made.
#[derive(Default, Clone, Copy)]
struct Calls {
    posts: u64,
    polls: u64,
}

/// Polls for completions (one driver call, counted), waiting for the
/// first if none is ready; any failed one is an error.
fn reap(cq: &CompletionQueue, wcs: &mut [WorkCompletion], calls: &mut Calls) -> Result<usize> {
    calls.polls += 1;
    let mut n = cq.poll(wcs);
    if n == 0 {
        wcs[0] = cq.wait_one(T).context("no completion")?;
        n = 1;
    }
    for wc in &wcs[..n] {
        if wc.status != WcStatus::Success {
            bail!("WR {} failed: {:?}", wc.wr_id, wc.status);
        }
    }
    Ok(n)
}

/// Receive slots (and command buffers) on each side.
const RECVS: usize = 32;
/// WR id bases on the target.
const READ: u64 = 1 << 32;
const REPLY: u64 = 2 << 32;

fn be32(b: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(b.get(..4)?.try_into().ok()?))
}

/// The target (B): receive commands (STag, length, command id), RDMA-Read
/// the data, answer each: a close (one-shot) or a plain Send carrying the
/// command id (conventional). Up to `RECVS` commands at once.
fn target(
    qp: &QueuePair,
    cq: &CompletionQueue,
    cmdbuf: &MemoryRegion,
    data: &MemoryRegion,
    n: u64,
    one_shot: bool,
) -> Result<Calls> {
    let mut calls = Calls::default();
    let mut wcs = vec![WorkCompletion::default(); 64];
    // Per receive slot: the command being served (STag, id).
    let mut serving = vec![(0u32, 0u64); RECVS];
    let mut served = 0u64;
    while served < n {
        let k = reap(cq, &mut wcs, &mut calls)?;
        for wc in wcs[..k].iter().copied() {
            if wc.opcode == WcOpcode::Recv {
                let r = wc.wr_id as usize;
                let mut m = vec![0; wc.byte_len as usize];
                cmdbuf.read_at(r * 256, &mut m);
                let (stag, body) = match wc.advertised_stag {
                    Some(s) => (s.raw(), &m[..]),
                    None => (
                        be32(&m).context("command without an STag")?,
                        m.get(4..).unwrap_or(&[]),
                    ),
                };
                let len = be32(body).context("command without a length")? as usize;
                let id = body
                    .get(4..12)
                    .map(|b| u64::from_be_bytes(b.try_into().expect("8 bytes")))
                    .context("command without an id")?;
                if len > data.len() {
                    bail!(
                        "command asks for {len} bytes, more than the {} buffered",
                        data.len()
                    );
                }
                serving[r] = (stag, id);
                qp.post_recv(&RecvWr::new(r as u64, &[cmdbuf.sge(r * 256, 256)]))?;
                qp.post_send(&SendWr::read(
                    READ + r as u64,
                    data.sge(0, len),
                    0,
                    softrdma_verbs::Rkey::from_raw(stag),
                ))?;
                calls.posts += 2;
            } else if wc.wr_id & READ != 0 {
                let r = (wc.wr_id - READ) as usize;
                let (stag, id) = serving[r];
                // The reply's bytes: the command id, in a slot of its own.
                let at = 2 * RECVS * 256 + r * 16;
                cmdbuf.write_at(at, &id.to_be_bytes());
                let mut resp = if one_shot {
                    SendWr::send_close(
                        REPLY,
                        &[cmdbuf.sge(at, 8)],
                        softrdma_verbs::Rkey::from_raw(stag),
                    )
                } else {
                    SendWr::send(REPLY, &[cmdbuf.sge(at, 8)])
                };
                resp.flags = SendFlags::NONE;
                qp.post_send(&resp)?;
                calls.posts += 1;
                served += 1;
            }
        }
    }
    Ok(calls)
}

struct Side {
    pd: ProtectionDomain,
    cq: CompletionQueue,
    qp: QueuePair,
}

fn pair(dev: &Device) -> Result<(Side, Side)> {
    let params = ConnParams {
        extensions: true,
        ..Default::default()
    };
    let l = dev.listen("127.0.0.1:0")?;
    let mk = || -> Result<Side> {
        let pd = dev.alloc_pd()?;
        let cq = dev.create_cq(256)?;
        let qp = pd.create_qp(QpInitAttr::new(&cq))?;
        Ok(Side { pd, cq, qp })
    };
    let (a, b) = (mk()?, mk()?);
    crate::transfer::connect_in_process(&l, &a.qp, &b.qp, &params)?;
    Ok((a, b))
}

/// What one measurement found.
struct Measured {
    secs: f64,
    calls: Calls,
    target: Calls,
}

/// WR ids on the initiator: kind in the high bits, command slot below.
const SEND: u64 = 1 << 32;
const INV: u64 = 2 << 32;
const ADV: u64 = 3 << 32;

/// A drives `commands` iSER-like writes of `size` bytes with `depth` in
/// flight; B serves them.
fn measure(
    dev: &Device,
    size: usize,
    one_shot: bool,
    depth: usize,
    commands: u64,
) -> Result<Measured> {
    let (a, b) = pair(dev)?;
    let data = a.pd.alloc_mr(depth * size, Access::LOCAL_WRITE)?;
    data.write_at(0, &vec![0x3c; depth * size]);
    let resp = a.pd.alloc_mr(RECVS * 64, Access::LOCAL_WRITE)?;
    let cmd = a.pd.alloc_mr(depth * 64, Access::LOCAL_WRITE)?;
    let fr: Vec<FastRegMr> = (0..depth)
        .map(|_| a.pd.alloc_fast_reg_mr())
        .collect::<Result<_, _>>()?;
    let before_open = a.qp.open_advertisements();
    // B's receives are up before A sends anything.
    let bcmd = b.pd.alloc_mr(3 * RECVS * 256, Access::LOCAL_WRITE)?;
    let bdata = b.pd.alloc_mr(64 << 10, Access::LOCAL_WRITE)?;
    for r in 0..RECVS {
        b.qp.post_recv(&RecvWr::new(r as u64, &[bcmd.sge(r * 256, 256)]))?;
    }
    let mut calls = Calls::default();
    // A's receives for the replies (not counted: both paths need them
    // posted up front the same way; the re-post per reply is counted).
    for r in 0..RECVS {
        a.qp.post_recv(&RecvWr::new(r as u64, &[resp.sge(r * 64, 64)]))?;
    }
    let m = std::thread::scope(|s| -> Result<Measured> {
        let tb = s.spawn(|| target(&b.qp, &b.cq, &bcmd, &bdata, commands, one_shot));
        let t0 = Instant::now();
        // Per slot: the command in it, and (conventional) what has come
        // back of it: its Send's completion, the reply.
        let mut slot_cmd = vec![0u64; depth];
        let mut sent = vec![false; depth];
        let mut replied = vec![false; depth];
        let mut stags = std::collections::HashMap::new();
        let mut next = 0u64;
        let mut done = 0u64;
        let issue = |k: usize,
                     id: u64,
                     calls: &mut Calls,
                     stags: &mut std::collections::HashMap<u64, u32>|
         -> Result<()> {
            let mut body = (size as u32).to_be_bytes().to_vec();
            body.extend_from_slice(&id.to_be_bytes());
            body.extend_from_slice(b"WRITE lba=0");
            let sge = data.sge(k * size, size);
            if one_shot {
                // One call: bind + table + send.
                let stag =
                    a.qp.advertise(ADV + k as u64, &[sge], Access::REMOTE_READ, &body, id)?;
                stags.insert(id, stag.raw());
            } else {
                // Bind a new key over the buffer, send the command with
                // the STag in its payload (one doorbell).
                let key = id as u8;
                let stag = fr[k].stag_with_key(key);
                let mut msg = stag.raw().to_be_bytes().to_vec();
                msg.extend_from_slice(&body);
                cmd.write_at(k * 64, &msg);
                let mut reg = SendWr::fast_reg(0, &fr[k], key, &[sge], 0, Access::REMOTE_READ);
                reg.flags = SendFlags::NONE;
                let send = SendWr::send(SEND + k as u64, &[cmd.sge(k * 64, msg.len())]);
                a.qp.post_send_batch(&[reg, send])?;
                stags.insert(id, stag.raw());
            }
            calls.posts += 1;
            Ok(())
        };
        while next < commands.min(depth as u64) {
            let k = next as usize;
            slot_cmd[k] = next;
            issue(k, next, &mut calls, &mut stags)?;
            next += 1;
        }
        let mut wcs = vec![WorkCompletion::default(); 64];
        let mut free = Vec::new();
        let mut unbind = Vec::new();
        while done < commands {
            let n = reap(&a.cq, &mut wcs, &mut calls)?;
            for wc in &wcs[..n] {
                if wc.opcode == WcOpcode::Recv {
                    let mut idb = [0u8; 8];
                    resp.read_at(wc.wr_id as usize * 64, &mut idb);
                    a.qp.post_recv(&RecvWr::new(
                        wc.wr_id,
                        &[resp.sge(wc.wr_id as usize * 64, 64)],
                    ))?;
                    calls.posts += 1;
                    if one_shot {
                        // The close is the command's only completion.
                        let id = wc.reference.context("a close without a reference")?;
                        let want = stags.remove(&id).map(softrdma_verbs::Rkey::from_raw);
                        if wc.invalidated_rkey.is_none() || wc.invalidated_rkey != want {
                            bail!(
                                "close for {:?}/{id}, expected {want:?}",
                                wc.invalidated_rkey
                            );
                        }
                        let k = slot_cmd
                            .iter()
                            .position(|&c| c == id)
                            .context("a close for no command in flight")?;
                        free.push(k);
                    } else {
                        let id = u64::from_be_bytes(idb);
                        let k = slot_cmd
                            .iter()
                            .position(|&c| c == id)
                            .context("a reply for no command in flight")?;
                        replied[k] = true;
                        unbind.push(k);
                    }
                } else if wc.wr_id & !0xffff_ffff == SEND {
                    let k = (wc.wr_id - SEND) as usize;
                    sent[k] = true;
                    unbind.push(k);
                } else if wc.wr_id & !0xffff_ffff == INV {
                    // Unbound: the slot is free.
                    free.push((wc.wr_id - INV) as usize);
                }
            }
            // Conventional: a command's Send completion and its reply
            // both came back: unbind its STag.
            for k in unbind.drain(..) {
                if sent[k] && replied[k] {
                    // (Both may have come in this batch: once.)
                    sent[k] = false;
                    replied[k] = false;
                    let stag = stags.remove(&slot_cmd[k]).expect("issued");
                    a.qp.post_send(&SendWr::local_inv(
                        INV + k as u64,
                        softrdma_verbs::Rkey::from_raw(stag),
                    ))?;
                    calls.posts += 1;
                }
            }
            for k in free.drain(..) {
                done += 1;
                if next < commands {
                    slot_cmd[k] = next;
                    issue(k, next, &mut calls, &mut stags)?;
                    next += 1;
                } else {
                    slot_cmd[k] = u64::MAX;
                }
            }
        }
        let secs = t0.elapsed().as_secs_f64();
        let target = tb
            .join()
            .map_err(|_| anyhow::anyhow!("target panicked"))??;
        Ok(Measured {
            secs,
            calls,
            target,
        })
    })?;
    if a.qp.open_advertisements() != before_open {
        bail!("bindings left open");
    }
    Ok(m)
}

pub fn run(json: bool, commands: u64, depths: &[usize]) -> Result<()> {
    // No same-host path: the iWARP wire is what is measured.
    let dev = Device::open(DeviceConfig {
        same_host: false,
        ..Default::default()
    })?;
    for &depth in depths {
        if depth == 0 || depth > 16 {
            bail!("--depth {depth}: 1 to 16 (the connection's ORD)");
        }
        for size in [4096usize, 64 << 10] {
            for one_shot in [false, true] {
                let m = measure(&dev, size, one_shot, depth, commands)?;
                let (secs, calls, bcalls) = (m.secs, m.calls, m.target);
                let per = |x: u64| (x as f64 / commands as f64 * 100.0).round() / 100.0;
                let v = serde_json::json!({
                    "bench": if one_shot { "iser_write_one_shot" } else { "iser_write_conventional" },
                    "size": size,
                    "depth": depth,
                    "commands": commands,
                    "commands_per_s": (commands as f64 / secs).round(),
                    "gbps": ((commands * size as u64) as f64 / secs / 1e9 * 1000.0).round() / 1000.0,
                    "initiator_calls_per_cmd": per(calls.posts + calls.polls),
                    "initiator_posts_per_cmd": per(calls.posts),
                    "initiator_polls_per_cmd": per(calls.polls),
                    "target_calls_per_cmd": per(bcalls.posts + bcalls.polls),
                    // Command, Read Request, Read Response, response/close.
                    "wire_messages_per_cmd": 4,
                    "round_trips_per_cmd": 2,
                });
                if json {
                    println!("{v}");
                } else {
                    println!(
                        "{:<26} {:>6} B  depth {:>2}  {:>8} cmd/s  initiator {} calls/cmd ({} posts, {} polls), target {}",
                        v["bench"].as_str().unwrap_or(""),
                        size,
                        depth,
                        v["commands_per_s"],
                        v["initiator_calls_per_cmd"],
                        v["initiator_posts_per_cmd"],
                        v["initiator_polls_per_cmd"],
                        v["target_calls_per_cmd"]
                    );
                }
            }
        }
    }
    Ok(())
}
