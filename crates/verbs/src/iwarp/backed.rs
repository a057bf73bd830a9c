//! Storage-backed regions on the receive path (`backend.rs`): the segments
//! of a Write into a backed region accumulate and reach the backend in
//! long, aligned runs; a Read of one is answered from a holder the Read
//! Response keeps alive. softrdma's own (siw has no storage transport);
//! kept apart so the receiver (`rx.rs`) reads as siw's does.

use super::*;

/// Bytes of one Write message accumulated before part of them goes to the
/// backend.
pub(super) const BACKED_RUN: usize = 1 << 20;
/// A long message is passed on in multiples of this (O_DIRECT's alignment).
pub(super) const BACKED_ALIGN: usize = 4096;

/// Hands the accumulated run of Write segments to its backend: all of it
/// (`unit` = usize::MAX), or its longest prefix that is a multiple of
/// `unit`, keeping the rest for the next segments.
pub(super) fn flush_backed(rx: &mut Rx, unit: usize) -> io::Result<()> {
    let Some((mr, off, len)) = rx.backed_run.take() else {
        return Ok(());
    };
    let n = if unit == usize::MAX {
        len
    } else {
        len / unit * unit
    };
    if n > 0 {
        let b = mr.backend.as_ref().expect("backed region");
        b.write_at(off, &rx.backed[..n])?;
    }
    if n < len {
        rx.backed.copy_within(n..len, 0);
        rx.backed_run = Some((mr, off + n as u64, len - n));
    }
    Ok(())
}

/// A backend's refusal of a Write it was handed: `PermissionDenied` means
/// the access was withdrawn after the segment's STag check (its owner
/// revoked the right meanwhile, `backend.rs`), and gets the protection
/// Terminate the check would have given a moment later; any other error
/// is the device's, a catastrophic one.
pub(super) fn backed_failed(q: &QpInner, raw: &[u8], e: io::Error) -> RxEnd {
    if e.kind() == io::ErrorKind::PermissionDenied {
        tracing::warn!(qpn = q.qpn, "backed write refused: {e}");
        return fatal(codes::DDP_TAGGED_INVALID_STAG, raw, WcStatus::WrFlushErr);
    }
    tracing::error!(qpn = q.qpn, "backed write failed: {e}");
    fatal(codes::RDMAP_CATASTROPHIC_STREAM, raw, WcStatus::WrFlushErr)
}

/// The same for a Read Request the backend could not answer.
pub(super) fn backed_read_failed(q: &QpInner, stag: u32, raw: &[u8], e: io::Error) -> RxEnd {
    if e.kind() == io::ErrorKind::PermissionDenied {
        tracing::warn!(qpn = q.qpn, stag, "backed read refused: {e}");
        return fatal(codes::RDMAP_INVALID_STAG, raw, WcStatus::WrFlushErr);
    }
    tracing::error!(qpn = q.qpn, stag, "backed read failed: {e}");
    fatal(codes::RDMAP_CATASTROPHIC_STREAM, raw, WcStatus::WrFlushErr)
}

/// Answers a Read Request from a backed region: a flush when it is empty,
/// else the bytes, read into a holder the Read Response keeps alive.
pub(super) fn backed_read(mr: &MrInner, rr: &ReadRequest) -> io::Result<Arc<MrInner>> {
    let b = mr.backend.as_ref().expect("backed region");
    if rr.size == 0 {
        b.flush()?;
        return Ok(Arc::new(MrInner::holding(Box::new([]), rr.src_to)));
    }
    let mut buf = vec![0u8; rr.size as usize].into_boxed_slice();
    b.read_at(rr.src_to - mr.iova, &mut buf)?;
    Ok(Arc::new(MrInner::holding(buf, rr.src_to)))
}
