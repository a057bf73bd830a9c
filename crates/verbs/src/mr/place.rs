//! Placement: bytes copied into and out of registered memory through raw
//! spans (the memory a peer may write at any time is never handed out as a
//! Rust slice beyond one call), CRC over it, and RFC 7306 atomics on it.

use super::*;

/// Performs an RFC 7306 atomic operation on the 64-bit value (host byte
/// order) at `target`; returns the original value.
///
/// # Safety
/// `target` must come from [`MrInner::atomic_target`] of a registration
/// the caller holds (so the 8 bytes are live, aligned and inside it).
pub(crate) unsafe fn atomic_apply(target: RawSpan, req: &softrdma_wire::AtomicRequest) -> u64 {
    use softrdma_wire::AtomicOp;
    // SAFETY: the pointer is 8-byte aligned and valid for reads and writes
    // for as long as the caller holds the registration (contract above).
    // Every atomic this engine performs on registered memory goes through
    // this function, so atomics are atomic with respect to each other, on
    // any QP, progress thread or process mapping the memory. As on RDMA
    // hardware, they are not atomic with respect to RDMA Writes or the
    // application's plain stores to the same bytes; those are the
    // application's to order.
    let a = unsafe { AtomicU64::from_ptr(target.ptr as *mut u64) };
    match req.op {
        // Plain fetch-and-add only without a mask; a masked one adds its
        // fields independently (RFC 7306 section 4.1; issue 20, item 9).
        AtomicOp::FetchAdd if req.add_swap_mask == 0 => a.fetch_add(req.add_swap, Ordering::AcqRel),
        op => match a.fetch_update(Ordering::AcqRel, Ordering::Acquire, |v| {
            Some(op.apply(v, req))
        }) {
            Ok(v) | Err(v) => v,
        },
    }
}

/// Copies `src` into the memory behind `spans`, starting `skip` bytes in.
///
/// # Safety
/// The spans must come from a registration the caller holds (so the memory is
/// alive) and lie within it.
pub(crate) unsafe fn copy_into_spans(spans: &[RawSpan], mut skip: usize, mut src: &[u8]) {
    for s in spans {
        if src.is_empty() {
            break;
        }
        if skip >= s.len {
            skip -= s.len;
            continue;
        }
        let n = (s.len - skip).min(src.len());
        // SAFETY: [skip, skip+n) lies inside span s (caller's contract);
        // src has at least n bytes; registered memory never overlaps the
        // engine's own buffers.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), s.ptr.add(skip), n) };
        src = &src[n..];
        skip = 0;
    }
}

/// Copies the memory behind `src` into the memory behind `dst`, starting
/// `skip` bytes into `dst` (no Rust slice over either: both may be written
/// by others meanwhile, as with a NIC's DMA).
///
/// # Safety
/// As for [`copy_into_spans`], for both span lists; they do not overlap.
pub(crate) unsafe fn copy_spans_into_spans(src: &[RawSpan], dst: &[RawSpan], mut skip: usize) {
    let (mut di, mut doff) = (0, 0);
    // Find where `skip` lands in dst.
    while di < dst.len() && skip >= dst[di].len {
        skip -= dst[di].len;
        di += 1;
    }
    doff += skip;
    for s in src {
        let mut soff = 0;
        while soff < s.len && di < dst.len() {
            let d = dst[di];
            let n = (s.len - soff).min(d.len - doff);
            // SAFETY: [soff, soff+n) lies in span s and [doff, doff+n) in
            // span d (both the caller's contract); they do not overlap.
            unsafe { std::ptr::copy_nonoverlapping(s.ptr.add(soff), d.ptr.add(doff), n) };
            soff += n;
            doff += n;
            if doff == d.len {
                di += 1;
                doff = 0;
            }
        }
    }
}

/// Copies from the memory behind `spans` into `dst`.
///
/// # Safety
/// As for [`copy_into_spans`].
pub(crate) unsafe fn copy_from_spans(spans: &[RawSpan], mut skip: usize, mut dst: &mut [u8]) {
    for s in spans {
        if dst.is_empty() {
            break;
        }
        if skip >= s.len {
            skip -= s.len;
            continue;
        }
        let n = (s.len - skip).min(dst.len());
        // SAFETY: as in copy_into_spans.
        unsafe { std::ptr::copy_nonoverlapping(s.ptr.add(skip), dst.as_mut_ptr(), n) };
        dst = &mut dst[n..];
        skip = 0;
    }
}

/// CRC32c over the memory behind `spans`.
///
/// # Safety
/// As for [`copy_into_spans`].
pub(crate) unsafe fn crc_spans(mut crc: u32, spans: &[RawSpan]) -> u32 {
    for s in spans {
        // SAFETY: the span is live registered memory (caller's contract).
        let sl = unsafe { std::slice::from_raw_parts(s.ptr as *const u8, s.len) };
        crc = crc32c::crc32c_append(crc, sl);
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spans(buf: &mut [u8], cuts: &[usize]) -> Vec<RawSpan> {
        let mut out = Vec::new();
        let mut at = 0;
        for &c in cuts.iter().chain(std::iter::once(&buf.len())) {
            out.push(RawSpan {
                // SAFETY: at <= c <= buf.len().
                ptr: unsafe { buf.as_mut_ptr().add(at) },
                len: c - at,
            });
            at = c;
        }
        out
    }

    #[test]
    fn span_to_span_copies_keep_order_across_any_cuts() {
        for (src_cuts, dst_cuts, skip) in [
            (vec![], vec![], 0),
            (vec![3, 4, 10], vec![1, 7], 0),
            (vec![5], vec![2, 3, 9, 12], 4),
            (vec![1, 2, 3, 4, 5], vec![16], 7),
        ] {
            let mut src: Vec<u8> = (1..=16).collect();
            let mut dst = vec![0u8; 24];
            let s = spans(&mut src, &src_cuts);
            let d = spans(&mut dst, &dst_cuts);
            // SAFETY: the spans cover two live, distinct local buffers.
            unsafe { copy_spans_into_spans(&s, &d, skip) };
            let mut want = vec![0u8; 24];
            want[skip..skip + 16].copy_from_slice(&(1..=16).collect::<Vec<u8>>());
            assert_eq!(dst, want, "cuts {src_cuts:?} / {dst_cuts:?}, skip {skip}");
        }
    }
}
