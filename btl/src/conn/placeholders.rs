//! QPs that lend their numbers to QP-less requests.

use std::collections::HashMap;

use xrcbtl_fabric::{Context, Qp, Result};
use xrcbtl_xrc_conn::{CmRef, Node};

/// QPs that only lend their numbers to QP-less requests (Reuse, Leave).
///
/// The IB CM turns a REQ away as a stale connection while it holds another
/// with the same (announced QP number, sending HCA), so every QP-less
/// request in flight from this node to one remote node needs a number of
/// its own; numbers are unique per HCA, so a QP's is. A placeholder QP stays
/// in RESET, never connected; one is lent per request in flight to a node,
/// and the pool only grows to the most requests ever in flight to one node
/// at once (at most that node's ranks).
pub(super) struct Placeholders<C: Context> {
    qps: Vec<C::Qp>,
    /// Which placeholders a node's requests are using.
    busy: HashMap<Node, Vec<usize>>,
    lent: HashMap<CmRef, (Node, usize)>,
}

impl<C: Context> Placeholders<C> {
    pub fn new() -> Self {
        Placeholders {
            qps: Vec::new(),
            busy: HashMap::new(),
            lent: HashMap::new(),
        }
    }

    /// Lends `cm` a number unused by other requests to `node`, making a
    /// placeholder with `make` when every one is in use there.
    pub fn lend(
        &mut self,
        cm: CmRef,
        node: Node,
        make: impl FnOnce() -> Result<C::Qp>,
    ) -> Option<u32> {
        let busy = self.busy.entry(node).or_default();
        let i = match (0..self.qps.len()).find(|i| !busy.contains(i)) {
            Some(i) => i,
            None => {
                self.qps.push(make().ok()?);
                self.qps.len() - 1
            }
        };
        busy.push(i);
        self.lent.insert(cm, (node, i));
        Some(self.qps[i].qp_num())
    }

    /// Placeholders made so far.
    pub fn made(&self) -> usize {
        self.qps.len()
    }

    /// The request `cm` is over: its number is free for `node` again.
    pub fn give_back(&mut self, cm: CmRef) {
        if let Some((node, i)) = self.lent.remove(&cm) {
            if let Some(b) = self.busy.get_mut(&node) {
                b.retain(|x| *x != i);
                if b.is_empty() {
                    self.busy.remove(&node);
                }
            }
        }
    }
}
