//! The loopback: one-sided work on a rank's own memory through its device.

use xrcbtl_fabric::{
    Access, Context, InitAttr, PortAddr, Qp, QpCaps, QpInit, QpTransition, QpType, Result, RtrAttr,
    RtsAttr,
};

/// A pair of RC QPs joined to each other on this rank's own port: one-sided
/// operations and atomics on the rank's own memory go through the device
/// like a peer's, so that its atomics stay atomic with the peers' on the
/// same memory. Made on first use, outside the manager (no CM, no peer);
/// not on iWARP, whose connections need the CM.
pub(super) struct Loopback<C: Context> {
    /// Its slot (taken from the slot numbers, never in the slot table).
    pub slot: u32,
    /// Where work is posted.
    pub req: C::Qp,
    /// The responder.
    _resp: C::Qp,
    /// The sizes the device granted the requester.
    pub caps: QpCaps,
}

impl<C: Context> Loopback<C> {
    /// Makes the pair on `ctx`'s first port, on `pd` and the `[send, recv]`
    /// CQs, open to `access`, in the slot `slot` numbers once both are
    /// ready.
    pub fn make(
        ctx: &C,
        pd: &C::Pd,
        [send_cq, recv_cq]: [&C::Cq; 2],
        access: Access,
        slot: impl FnOnce() -> u32,
    ) -> Result<Self> {
        let port = ctx.query_port(1)?;
        let dest = PortAddr {
            lid: port.lid,
            gid: port.gid,
        };
        let caps = QpCaps {
            max_send_wr: 64.min(ctx.caps().max_qp_wr),
            // Only RDMA and atomics travel: nothing is ever received.
            max_recv_wr: 1,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline: 0,
        };
        let init = QpInit {
            qp_type: QpType::Rc,
            send_cq,
            recv_cq: Some(recv_cq),
            srq: None,
            caps,
        };
        let req = ctx.create_qp(pd, &init)?;
        let resp = ctx.create_qp(pd, &init)?;
        for (q, peer) in [(&req, resp.qp_num()), (&resp, req.qp_num())] {
            q.modify(&QpTransition::Init(InitAttr {
                access,
                ..InitAttr::default()
            }))?;
            q.modify(&QpTransition::Rtr(RtrAttr::new(dest, peer)))?;
            q.modify(&QpTransition::Rts(RtsAttr::default()))?;
        }
        let slot = slot();
        Ok(Loopback {
            slot,
            caps: req.caps(),
            req,
            _resp: resp,
        })
    }
}
