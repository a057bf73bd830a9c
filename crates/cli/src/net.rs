//! Loopback port picking for the commands that start local processes (the
//! demo, the store bench, the UCX baseline).

use std::net::TcpListener;

use anyhow::Result;

/// `n` distinct free TCP ports on 127.0.0.1.
///
/// All `n` listeners are held at once before any is released, so the kernel
/// cannot hand the same port out twice (picking one port at a time can, and
/// then a node is told that its peer is itself). A port can still be taken
/// by someone else between this call and the caller's own bind; that window
/// is not closed here.
pub fn free_ports(n: usize) -> Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<std::io::Result<Vec<_>>>()?;
    let ports = listeners
        .iter()
        .map(|l| l.local_addr().map(|a| a.port()))
        .collect::<std::io::Result<Vec<_>>>()?;
    debug_assert!(
        ports
            .iter()
            .collect::<std::collections::BTreeSet<_>>()
            .len()
            == n,
        "ports held at once are distinct"
    );
    Ok(ports)
}

#[cfg(test)]
mod tests {
    #[test]
    fn ports_are_distinct() {
        for _ in 0..200 {
            let p = super::free_ports(4).unwrap();
            let set: std::collections::BTreeSet<_> = p.iter().collect();
            assert_eq!(set.len(), 4, "{p:?}");
        }
    }
}
