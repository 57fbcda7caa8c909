//! RC QPs on the shared SRQ on their way out.

use std::time::Duration;

use xrcbtl_fabric::{Context, Qp, QpState, QpTransition};

/// An RC QP on the shared SRQ on its way out: in the error state, kept
/// until the device reports its last receive (LAST_WQE_REACHED) and the
/// receive CQ has been polled dry, so that no receive it took from the SRQ
/// is lost with it (destroying a QP takes its completions out of the CQ).
pub(super) struct Draining<C: Context> {
    /// Held only: dropping it destroys the QP.
    pub _qp: C::Qp,
    /// The device reported the QP's last receive.
    pub last_wqe: bool,
    /// Destroyed then even without the event.
    pub deadline: Duration,
}

/// How long a draining QP waits for LAST_WQE_REACHED.
pub(super) const LAST_WQE_WAIT: Duration = Duration::from_secs(1);

/// Moves an RC QP that draws from the SRQ to the error state, so that the
/// device reports its last receive; false if it could not, or need not. A
/// QP still in RESET (never handed to the CM, or handed to a connection
/// that failed before the CM moved it to INIT) took no receive, and the QP
/// state table refuses RESET to ERR (rxe logs each refusal).
pub(super) fn stop_rc<Q: Qp>(qp: &Q, wired: bool) -> bool {
    if !wired || qp.state().map_or(true, |st| st == QpState::Reset) {
        return false;
    }
    qp.modify(&QpTransition::Error).is_ok()
}
