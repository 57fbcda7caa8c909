//! The TGT QPs a rank holds (created, or opened in the node's XRC domain),
//! by the manager's reference and by QP number, and the sweep that asks
//! them for their state.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use xrcbtl_fabric::{Context, Qp, QpState};
use xrcbtl_xrc_conn::TgtRef;

/// How often held TGT QPs are asked for their state, and how many at a
/// time: a rank holding n handles finds a dead one within
/// n / 64 × 50 ms.
const CHECK_EVERY: Duration = Duration::from_millis(50);
const CHECK_BATCH: usize = 64;

/// The TGT QPs a rank holds. Several handles may name one QP (a rank may
/// open the same TGT QP for two of its peers' processes).
pub(super) struct Tgts<C: Context> {
    by_ref: BTreeMap<TgtRef, C::Qp>,
    by_num: HashMap<u32, Vec<TgtRef>>,
    /// When the next handful is asked for its state, and where that
    /// round-robin sweep stands.
    check_at: Duration,
    cursor: TgtRef,
    batch: Vec<TgtRef>,
}

impl<C: Context> Tgts<C> {
    /// None held.
    pub fn new() -> Self {
        Tgts {
            by_ref: BTreeMap::new(),
            by_num: HashMap::new(),
            check_at: Duration::ZERO,
            cursor: TgtRef(0),
            batch: Vec::with_capacity(CHECK_BATCH),
        }
    }

    /// Holds `q` as the manager's `tgt`.
    pub fn insert(&mut self, tgt: TgtRef, q: C::Qp) {
        self.by_num.entry(q.qp_num()).or_default().push(tgt);
        self.by_ref.insert(tgt, q);
    }

    /// Lets go of the handle `tgt` (the QP goes with its last handle).
    pub fn remove(&mut self, tgt: TgtRef) -> Option<C::Qp> {
        let q = self.by_ref.remove(&tgt)?;
        let qpn = q.qp_num();
        if let Some(v) = self.by_num.get_mut(&qpn) {
            v.retain(|t| *t != tgt);
            if v.is_empty() {
                self.by_num.remove(&qpn);
            }
        }
        Some(q)
    }

    /// The QP of handle `tgt`.
    pub fn get(&self, tgt: TgtRef) -> Option<&C::Qp> {
        self.by_ref.get(&tgt)
    }

    /// The handles held on the QP numbered `qpn`.
    pub fn of_num(&self, qpn: u32) -> Option<&[TgtRef]> {
        self.by_num.get(&qpn).map(|v| v.as_slice())
    }

    /// When the sweep next asks, if anything is held.
    pub fn next_check(&self) -> Option<Duration> {
        (!self.by_ref.is_empty()).then_some(self.check_at)
    }

    /// When due, asks the next few held TGT QPs for their state, and
    /// names each found out of RTR and RTS to `dead`.
    pub fn sweep(&mut self, now: Duration, mut dead: impl FnMut(TgtRef)) {
        if self.by_ref.is_empty() || now < self.check_at {
            return;
        }
        self.check_at = now + CHECK_EVERY;
        let start = self.cursor;
        self.batch.clear();
        self.batch.extend(
            self.by_ref
                .range(start..)
                .chain(self.by_ref.range(..start))
                .take(CHECK_BATCH)
                .map(|(t, _)| *t),
        );
        self.cursor = self.batch.last().map_or(TgtRef(0), |t| TgtRef(t.0 + 1));
        for &tgt in &self.batch {
            let gone = self
                .by_ref
                .get(&tgt)
                .is_some_and(|q| !matches!(q.state(), Ok(QpState::Rtr | QpState::Rts)));
            if gone {
                dead(tgt);
            }
        }
    }
}
