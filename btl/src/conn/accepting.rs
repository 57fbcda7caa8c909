//! Accepted CM ids waiting for their RTU.

use std::collections::HashMap;

use xrcbtl_xrc_conn::CmRef;

/// Accepted ids waiting for their RTU, found by QP number (the QP heard
/// the peer first) or by id (the RTU came, or the id went) without a
/// search: a rank accepting a storm of connections holds many at once.
#[derive(Default)]
pub(super) struct Accepting {
    by_qpn: HashMap<u32, CmRef>,
    by_cm: HashMap<CmRef, u32>,
}

impl Accepting {
    pub fn insert(&mut self, qpn: u32, cm: CmRef) {
        if let Some(old) = self.by_qpn.insert(qpn, cm) {
            self.by_cm.remove(&old);
        }
        if let Some(old) = self.by_cm.insert(cm, qpn) {
            if old != qpn {
                self.by_qpn.remove(&old);
            }
        }
    }

    /// The id accepted with QP `qpn`, no longer waiting.
    pub fn take_qpn(&mut self, qpn: u32) -> Option<CmRef> {
        let cm = self.by_qpn.remove(&qpn)?;
        self.by_cm.remove(&cm);
        Some(cm)
    }

    /// `cm` waits no more.
    pub fn forget(&mut self, cm: CmRef) {
        if let Some(qpn) = self.by_cm.remove(&cm) {
            self.by_qpn.remove(&qpn);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.by_qpn.is_empty()
    }
}
