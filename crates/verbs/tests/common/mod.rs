#![allow(dead_code)]
//! Shared set-up for the engine's integration tests: a device and a pair of
//! queue pairs connected over loopback TCP.

use softrdma_verbs::*;
use std::time::Duration;

pub const T: Duration = Duration::from_secs(10);

pub struct Side {
    pub dev: Device,
    pub pd: ProtectionDomain,
    pub cq: CompletionQueue,
    pub qp: QueuePair,
}

pub fn side(dev: &Device, caps: QpCaps) -> Side {
    let pd = dev.alloc_pd().unwrap();
    let cq = dev.create_cq(4096).unwrap();
    let mut attr = QpInitAttr::new(&cq);
    attr.caps = caps;
    let qp = pd.create_qp(attr).unwrap();
    Side {
        dev: dev.clone(),
        pd,
        cq,
        qp,
    }
}

/// Connects two fresh QPs on one device; `pre` runs on the server side
/// before accept (to post receives).
pub fn pair_with(
    params_c: ConnParams,
    params_s: ConnParams,
    pre: impl FnOnce(&Side) + Send + 'static,
) -> (Side, Side) {
    let dev = Device::open_default().unwrap();
    pair_on(&dev, &dev, params_c, params_s, pre)
}

pub fn pair_on(
    dev_c: &Device,
    dev_s: &Device,
    params_c: ConnParams,
    params_s: ConnParams,
    pre: impl FnOnce(&Side) + Send + 'static,
) -> (Side, Side) {
    pair_caps(dev_c, dev_s, params_c, params_s, QpCaps::default(), pre)
}

/// Like [`pair_on`], both QPs created with `caps`.
pub fn pair_caps(
    dev_c: &Device,
    dev_s: &Device,
    params_c: ConnParams,
    params_s: ConnParams,
    caps: QpCaps,
    pre: impl FnOnce(&Side) + Send + 'static,
) -> (Side, Side) {
    let listener = dev_s.listen("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let s = side(dev_s, caps);
    let server = std::thread::spawn(move || {
        pre(&s);
        let req = listener.get_request().unwrap();
        req.accept(&s.qp, &params_s).unwrap();
        s
    });
    let c = side(dev_c, caps);
    c.qp.connect(addr, &params_c).unwrap();
    let s = server.join().unwrap();
    (c, s)
}

pub fn pair() -> (Side, Side) {
    pair_with(ConnParams::default(), ConnParams::default(), |_| {})
}

pub fn wait(cq: &CompletionQueue) -> WorkCompletion {
    cq.wait_one(T).expect("completion within 10 s")
}

pub fn pattern(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(31).wrapping_add(seed as u32) as u8)
        .collect()
}
