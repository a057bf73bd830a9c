//! Addresses: sockaddrs both ways, the source address for a destination,
//! `rdma_getaddrinfo`, and `rpoll`.

use super::*;

export!("SOFTRDMA_PRIVATE_1": softrdma_rdma_getaddrinfo, softrdma_rdma_freeaddrinfo, softrdma_rpoll);

pub(super) fn read_sockaddr(p: *const sockaddr) -> Option<SocketAddr> {
    if p.is_null() {
        return None;
    }
    // SAFETY: the caller's sockaddr; its family says how long it is.
    unsafe {
        match (*p).sa_family as c_int {
            libc::AF_INET => {
                let s = &*p.cast::<libc::sockaddr_in>();
                Some(SocketAddr::V4(SocketAddrV4::new(
                    Ipv4Addr::from(u32::from_be(s.sin_addr.s_addr)),
                    u16::from_be(s.sin_port),
                )))
            }
            libc::AF_INET6 => {
                let s = &*p.cast::<libc::sockaddr_in6>();
                Some(SocketAddr::V6(SocketAddrV6::new(
                    Ipv6Addr::from(s.sin6_addr.s6_addr),
                    u16::from_be(s.sin6_port),
                    s.sin6_flowinfo,
                    s.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

/// # Safety
/// `p` points to writable storage for a `sockaddr_storage`.
pub(super) unsafe fn write_sockaddr(a: SocketAddr, p: *mut libc::sockaddr_storage) {
    // SAFETY: the caller's storage, large enough for either family.
    unsafe {
        std::ptr::write_bytes(p, 0, 1);
        match a {
            SocketAddr::V4(v) => {
                let s = &mut *p.cast::<libc::sockaddr_in>();
                s.sin_family = libc::AF_INET as libc::sa_family_t;
                s.sin_port = v.port().to_be();
                s.sin_addr.s_addr = u32::from(*v.ip()).to_be();
            }
            SocketAddr::V6(v) => {
                let s = &mut *p.cast::<libc::sockaddr_in6>();
                s.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                s.sin6_port = v.port().to_be();
                s.sin6_addr.s6_addr = v.ip().octets();
                s.sin6_flowinfo = v.flowinfo();
                s.sin6_scope_id = v.scope_id();
            }
        }
    }
}

/// The source address the kernel would use towards `dst`.
pub(super) fn source_for(dst: SocketAddr) -> SocketAddr {
    let any: SocketAddr = match dst {
        SocketAddr::V4(_) => (Ipv4Addr::UNSPECIFIED, 0).into(),
        SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
    };
    std::net::UdpSocket::bind(any)
        .and_then(|s| {
            s.connect(dst)?;
            s.local_addr()
        })
        .map(|a| SocketAddr::new(a.ip(), 0))
        .unwrap_or(any)
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const rdma_addrinfo,
    res: *mut *mut rdma_addrinfo,
) -> c_int {
    guard_rc(|| {
        if res.is_null() || (node.is_null() && service.is_null()) {
            return Err(libc::EINVAL);
        }
        // SAFETY: the caller's hints or null.
        let h = unsafe { hints.as_ref() };
        let passive = h.is_some_and(|h| h.ai_flags & RAI_PASSIVE as c_int != 0);
        // SAFETY: plain data; all zeroes is valid.
        let mut lh: libc::addrinfo = unsafe { std::mem::zeroed() };
        lh.ai_family = h.map_or(libc::AF_UNSPEC, |h| h.ai_family);
        lh.ai_socktype = libc::SOCK_STREAM;
        if passive {
            lh.ai_flags |= libc::AI_PASSIVE;
        }
        if h.is_some_and(|h| h.ai_flags & RAI_NUMERICHOST as c_int != 0) {
            lh.ai_flags |= libc::AI_NUMERICHOST;
        }
        let mut found: *mut libc::addrinfo = std::ptr::null_mut();
        // SAFETY: C strings or null from the caller; our hints; out pointer.
        let r = unsafe { libc::getaddrinfo(node, service, &lh, &mut found) };
        if r != 0 || found.is_null() {
            return Err(libc::EADDRNOTAVAIL);
        }
        // SAFETY: a result of getaddrinfo, freed below.
        let addr = read_sockaddr(unsafe { (*found).ai_addr }.cast());
        // SAFETY: from getaddrinfo.
        unsafe { libc::freeaddrinfo(found) };
        let addr = addr.ok_or(libc::EAFNOSUPPORT)?;
        let sa_len = std::mem::size_of::<libc::sockaddr_storage>();
        // SAFETY: calloc'd, checked; freed by `rdma_freeaddrinfo`.
        unsafe {
            let ai = libc::calloc(1, std::mem::size_of::<rdma_addrinfo>()).cast::<rdma_addrinfo>();
            let sa = libc::calloc(1, sa_len).cast::<libc::sockaddr_storage>();
            if ai.is_null() || sa.is_null() {
                libc::free(ai.cast());
                libc::free(sa.cast());
                return Err(libc::ENOMEM);
            }
            write_sockaddr(addr, sa);
            let a = &mut *ai;
            a.ai_flags = h.map_or(0, |h| h.ai_flags);
            a.ai_family = if addr.is_ipv4() {
                libc::AF_INET
            } else {
                libc::AF_INET6
            };
            a.ai_qp_type = h.map_or(IBV_QPT_RC as c_int, |h| {
                if h.ai_qp_type == 0 {
                    IBV_QPT_RC as c_int
                } else {
                    h.ai_qp_type
                }
            });
            a.ai_port_space = h.map_or(RDMA_PS_TCP as c_int, |h| {
                if h.ai_port_space == 0 {
                    RDMA_PS_TCP as c_int
                } else {
                    h.ai_port_space
                }
            });
            let len = if addr.is_ipv4() {
                std::mem::size_of::<libc::sockaddr_in>()
            } else {
                std::mem::size_of::<libc::sockaddr_in6>()
            } as socklen_t;
            if passive {
                a.ai_src_addr = sa.cast();
                a.ai_src_len = len;
            } else {
                a.ai_dst_addr = sa.cast();
                a.ai_dst_len = len;
                if let Some(src) = h.and_then(|h| read_sockaddr(h.ai_src_addr)) {
                    let s2 = libc::calloc(1, sa_len).cast::<libc::sockaddr_storage>();
                    if !s2.is_null() {
                        write_sockaddr(src, s2);
                        a.ai_src_addr = s2.cast();
                        a.ai_src_len = h.map_or(0, |h| h.ai_src_len);
                    }
                }
            }
            *res = ai;
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn softrdma_rdma_freeaddrinfo(res: *mut rdma_addrinfo) {
    let mut cur = res;
    while !cur.is_null() {
        // SAFETY: a list from `rdma_getaddrinfo` (calloc'd pieces).
        unsafe {
            let next = (*cur).ai_next;
            libc::free((*cur).ai_src_addr.cast());
            libc::free((*cur).ai_dst_addr.cast());
            libc::free(cur.cast());
            cur = next;
        }
    }
}

/// rsockets' `rpoll` (rping imports it): there are no rsockets here, and
/// for ordinary descriptors `rpoll` is `poll`.
#[no_mangle]
pub extern "C" fn softrdma_rpoll(fds: *mut libc::pollfd, n: libc::nfds_t, timeout: c_int) -> c_int {
    // SAFETY: the caller's array of `n` pollfds, as for poll(2).
    unsafe { libc::poll(fds, n, timeout) }
}
