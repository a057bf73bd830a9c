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

fn wait(cq: &CompletionQueue, calls: &mut Calls) -> Result<WorkCompletion> {
    calls.polls += 1;
    let wc = match cq.poll_one() {
        Some(wc) => wc,
        None => cq.wait_one(T).context("no completion")?,
    };
    if wc.status != WcStatus::Success {
        bail!("WR {} failed: {:?}", wc.wr_id, wc.status);
    }
    Ok(wc)
}

/// The target (B): receive a command (STag + length), RDMA-Read the data,
/// answer: a close (one-shot) or a plain Send (conventional).
fn target(
    qp: &QueuePair,
    cq: &CompletionQueue,
    cmdbuf: &MemoryRegion,
    data: &MemoryRegion,
    n: u64,
    one_shot: bool,
) -> Result<Calls> {
    let mut calls = Calls::default();
    for _ in 0..n {
        let wc = wait(cq, &mut calls)?;
        let mut m = vec![0; wc.byte_len as usize];
        cmdbuf.read_at(0, &mut m);
        let be32 = |b: &[u8]| {
            b.get(..4)
                .map(|x| u32::from_be_bytes([x[0], x[1], x[2], x[3]]))
        };
        let (stag, body) = match wc.advertised_stag {
            Some(s) => (s, &m[..]),
            None => (
                be32(&m).context("command without an STag")?,
                m.get(4..).unwrap_or(&[]),
            ),
        };
        let len = be32(body).context("command without a length")? as usize;
        if len > data.len() {
            bail!(
                "command asks for {len} bytes, more than the {} buffered",
                data.len()
            );
        }
        qp.post_recv(&RecvWr::new(0, &[cmdbuf.sge(0, 256)]))?;
        qp.post_send(&SendWr::read(1, data.sge(0, len), 0, stag))?;
        wait(cq, &mut calls)?;
        let mut resp = if one_shot {
            SendWr::send_close(2, &[cmdbuf.sge(1024, 8)], stag)
        } else {
            SendWr::send(2, &[cmdbuf.sge(1024, 8)])
        };
        resp.flags = SendFlags::NONE;
        qp.post_send(&resp)?;
        calls.posts += 3;
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

pub fn run(json: bool, commands: u64) -> Result<()> {
    // No same-host path: the iWARP wire is what is measured.
    let dev = Device::open(DeviceConfig {
        same_host: false,
        ..Default::default()
    })?;
    for size in [4096usize, 64 << 10] {
        for one_shot in [false, true] {
            let (a, b) = pair(&dev)?;
            let data = a.pd.alloc_mr(64 << 10, Access::LOCAL_WRITE)?;
            data.write_at(0, &vec![0x3c; 64 << 10]);
            let resp = a.pd.alloc_mr(4096, Access::LOCAL_WRITE)?;
            let cmd = a.pd.alloc_mr(4096, Access::LOCAL_WRITE)?;
            let fr = a.pd.alloc_fast_reg_mr()?;
            let mut calls = Calls::default();
            let before_open = a.qp.open_advertisements();
            // B's first receive is up before A sends anything.
            let bcmd = b.pd.alloc_mr(4096, Access::LOCAL_WRITE)?;
            let bdata = b.pd.alloc_mr(64 << 10, Access::LOCAL_WRITE)?;
            b.qp.post_recv(&RecvWr::new(0, &[bcmd.sge(0, 256)]))?;
            let bt = std::thread::scope(|s| -> Result<(f64, Calls)> {
                let tb = s.spawn(|| target(&b.qp, &b.cq, &bcmd, &bdata, commands, one_shot));
                let t0 = Instant::now();
                for i in 0..commands {
                    a.qp.post_recv(&RecvWr::new(100 + i, &[resp.sge(0, 64)]))?;
                    calls.posts += 1;
                    let mut body = (size as u32).to_be_bytes().to_vec();
                    body.extend_from_slice(b"WRITE lba=0");
                    if one_shot {
                        // One call: bind + table + send.
                        let stag =
                            a.qp.advertise(i, &[data.sge(0, size)], Access::REMOTE_READ, &body, i)?;
                        calls.posts += 1;
                        // The close is the only completion.
                        let wc = wait(&a.cq, &mut calls)?;
                        if wc.invalidated_rkey != Some(stag) || wc.reference != Some(i) {
                            bail!(
                                "close for {:?}/{:?}, expected {stag:#x}/{i}",
                                wc.invalidated_rkey,
                                wc.reference
                            );
                        }
                    } else {
                        // Bind a new key over the buffer, send the command
                        // with the STag in its payload (one doorbell).
                        let key = i as u8;
                        let stag = fr.stag_with_key(key);
                        let mut msg = stag.to_be_bytes().to_vec();
                        msg.extend_from_slice(&body);
                        cmd.write_at(0, &msg);
                        let mut reg = SendWr::fast_reg(
                            1,
                            &fr,
                            key,
                            &[data.sge(0, size)],
                            0,
                            Access::REMOTE_READ,
                        );
                        reg.flags = SendFlags::NONE;
                        a.qp.post_send_batch(&[reg, SendWr::send(2, &[cmd.sge(0, msg.len())])])?;
                        calls.posts += 1;
                        wait(&a.cq, &mut calls)?; // the Send
                        wait(&a.cq, &mut calls)?; // the response
                                                  // Unbind.
                        a.qp.post_send(&SendWr::local_inv(3, stag))?;
                        calls.posts += 1;
                        wait(&a.cq, &mut calls)?;
                    }
                }
                let secs = t0.elapsed().as_secs_f64();
                let bc = tb
                    .join()
                    .map_err(|_| anyhow::anyhow!("target panicked"))??;
                Ok((secs, bc))
            })?;
            let (secs, bcalls) = bt;
            if a.qp.open_advertisements() != before_open {
                bail!("bindings left open");
            }
            let per = |x: u64| (x as f64 / commands as f64 * 100.0).round() / 100.0;
            let v = serde_json::json!({
                "bench": if one_shot { "iser_write_one_shot" } else { "iser_write_conventional" },
                "size": size,
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
                    "{:<26} {:>6} B  {:>8} cmd/s  initiator {} calls/cmd ({} posts, {} polls), target {}",
                    v["bench"].as_str().unwrap_or(""),
                    size,
                    v["commands_per_s"],
                    v["initiator_calls_per_cmd"],
                    v["initiator_posts_per_cmd"],
                    v["initiator_polls_per_cmd"],
                    v["target_calls_per_cmd"]
                );
            }
        }
    }
    Ok(())
}
