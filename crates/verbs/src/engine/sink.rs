//! The data sink of an RDMA Read or an atomic: where its response is
//! placed. An iWARP Read Request names one sink, an STag and a tagged
//! offset (RFC 5040 section 4.4), and the responder places its Read
//! Response there. A Read into one local SGE names that SGE's region. A
//! Read into several (up to `DeviceAttr::max_sge_rd`) gets an STag of its
//! own, bound over the scatter list as a fast-register would bind it: one
//! virtual range from offset 0, the SGEs in order. Any peer, Linux siw
//! included, sees one sink STag and offset and needs nothing more.
//!
//! The binding allows local write only (the peer can neither Write to it
//! nor invalidate it: an RDMA Write naming it is a protection error), is
//! made when the Read Request is about to go on the wire (a Read that a
//! same-host peer's memory answers directly needs none), and is released
//! from the STag table when the WR leaves the send queue (completed,
//! failed or flushed, or the QP destroyed), never before: until then a
//! Read Response may still be placed through it, and a placement in
//! progress holds the registration itself (`Rx::_target_keep`), so its
//! memory outlives even the release.

use super::*;

/// A Read's or an atomic's sink: the region and the tagged offset the
/// request names.
pub(crate) struct Sink {
    pub mr: Arc<MrInner>,
    pub to: u64,
    /// The STag bound for a scattered Read, released with the sink.
    _binding: Option<Binding>,
}

impl Sink {
    /// `mr` at `to` (an SGE's own region).
    pub fn at(mr: Arc<MrInner>, to: u64) -> Sink {
        Sink {
            mr,
            to,
            _binding: None,
        }
    }

    /// Binds a fresh STag (index reserved for `pd`, key byte `key`) over
    /// `spans`, the memory of the registrations `keep`, as a Read's sink.
    pub fn bind(
        core: &Arc<Core>,
        pd: u32,
        key: u8,
        keep: Vec<Arc<MrInner>>,
        spans: Vec<RawSpan>,
    ) -> Result<Sink> {
        let index = core.stags.reserve(None, pd)?;
        let guards = keep.iter().flat_map(|p| p.guards.iter().copied()).collect();
        let mr = Arc::new(
            NewMr {
                pd,
                access: Access::LOCAL_WRITE,
                iova: 0,
                spans,
                backing: Backing::Parents(keep),
                invalidatable: false,
                fast_reg: true,
                chunk: None,
                backend: None,
                pins: Vec::new(), // the parents are pinned
                guards,
            }
            .build(Stag::new(index, key).raw()),
        );
        core.stags.install(mr.clone());
        Ok(Sink {
            mr,
            to: 0,
            _binding: Some(Binding {
                core: core.clone(),
                index,
            }),
        })
    }
}

/// An STag index bound for a sink; freed when dropped.
struct Binding {
    core: Arc<Core>,
    index: u32,
}

impl Drop for Binding {
    fn drop(&mut self) {
        self.core.stags.release(self.index);
    }
}
