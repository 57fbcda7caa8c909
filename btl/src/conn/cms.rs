//! The CM ids of the driver, by the manager's reference: found again by the
//! key the CM reports events under, with the rank an outgoing one resolves
//! towards, and on iWARP the QP a QP-less request connects with.

use std::collections::HashMap;

use xrcbtl_fabric::{CmId, Context};
use xrcbtl_xrc_conn::{CmRef, Rank};

use super::CmIdOf;

/// Every CM id the driver holds.
pub(super) struct CmIds<C: Context> {
    ids: HashMap<CmRef, CmIdOf<C>>,
    /// Each id's reference, by the key its events name.
    by_key: HashMap<u64, CmRef>,
    /// The rank each outgoing id resolves towards.
    rank: HashMap<CmRef, Rank>,
    /// iWARP: the QP each QP-less request (a Leave) connects with, made
    /// for it and destroyed with its id. The iWARP CM cannot connect
    /// without a QP, so a request with none would never leave.
    carriers: HashMap<CmRef, C::Qp>,
}

impl<C: Context> CmIds<C> {
    /// No id yet.
    pub fn new() -> Self {
        CmIds {
            ids: HashMap::new(),
            by_key: HashMap::new(),
            rank: HashMap::new(),
            carriers: HashMap::new(),
        }
    }

    /// Holds `id` as `cm`: an incoming request's, or (with `rank`) one
    /// resolving towards `rank`.
    pub fn insert(&mut self, cm: CmRef, id: CmIdOf<C>, rank: Option<Rank>) {
        self.by_key.insert(id.key(), cm);
        self.ids.insert(cm, id);
        if let Some(rank) = rank {
            self.rank.insert(cm, rank);
        }
    }

    /// The id of `cm`.
    pub fn get(&self, cm: CmRef) -> Option<&CmIdOf<C>> {
        self.ids.get(&cm)
    }

    /// The reference of the id whose events carry `key`.
    pub fn of_key(&self, key: u64) -> Option<CmRef> {
        self.by_key.get(&key).copied()
    }

    /// The rank outgoing `cm` resolves towards.
    pub fn rank(&self, cm: CmRef) -> Option<Rank> {
        self.rank.get(&cm).copied()
    }

    /// Keeps `qp`, which QP-less `cm` connects with, until `cm` goes.
    pub fn carry(&mut self, cm: CmRef, qp: C::Qp) {
        self.carriers.insert(cm, qp);
    }

    /// Destroys the id of `cm`, then the QP it carried (the CM lets go of
    /// the QP first); whether there was an id.
    pub fn remove(&mut self, cm: CmRef) -> bool {
        let had = match self.ids.remove(&cm) {
            Some(id) => {
                self.by_key.remove(&id.key());
                true
            }
            None => false,
        };
        self.rank.remove(&cm);
        self.carriers.remove(&cm);
        had
    }
}
