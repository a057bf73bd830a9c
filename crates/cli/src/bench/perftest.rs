//! perftest's `-R` (rdma_cm) exchange, so `ib_write_bw -R` and friends on
//! Linux siw complete against `softrdma bench --server`.
//! (Being written; until then such requests are rejected.)

use anyhow::{bail, Result};
use softrdma_verbs::{ConnectRequest, Device};

pub fn serve(_dev: &Device, req: ConnectRequest) -> Result<()> {
    let peer = req.peer_addr();
    req.reject(b"")?;
    bail!("connection from {peer} is not a softrdma bench client (perftest -R support pending)")
}
