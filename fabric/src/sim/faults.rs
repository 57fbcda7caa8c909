//! Faults the simulated fabric can inject: partitions between nodes and rules
//! that drop, delay or duplicate CM messages. (Process crashes, forced QP
//! errors and port events are commands on [`super::SimFabric`].)
//!
//! Every random choice draws from the world's seeded generator, so a seed
//! replays the same faults.

use std::collections::BTreeSet;

use super::rng::Rng;

/// Kind of CM message, for aiming a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CmMsgKind {
    /// Connection request.
    Req,
    /// Reply (accept).
    Rep,
    /// Ready to use (the initiator's confirmation).
    Rtu,
    /// Reject.
    Rej,
    /// Disconnect request.
    Dreq,
    /// Disconnect reply.
    Drep,
}

/// What happens to a CM message a rule matches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmAction {
    /// Delivered normally (what happens when no rule matches).
    Deliver,
    /// Lost.
    Drop,
    /// Delivered this many nanoseconds late.
    Delay(u64),
    /// Delivered twice.
    Duplicate,
}

/// A rule for CM messages: which ones, what happens, how often.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CmFault {
    /// Only messages sent from this node (any if `None`).
    pub from_node: Option<usize>,
    /// Only messages sent to this node (any if `None`).
    pub to_node: Option<usize>,
    /// Only this kind of message (any if `None`).
    pub kind: Option<CmMsgKind>,
    /// What to do.
    pub action: CmAction,
    /// Chance per matching message, in parts per million.
    pub probability_ppm: u32,
    /// How many messages the rule may hit before it expires (`None`:
    /// forever).
    pub count: Option<u32>,
}

impl CmFault {
    /// A rule applying `action` to every message of `kind`, forever.
    pub fn new(kind: Option<CmMsgKind>, action: CmAction) -> Self {
        CmFault {
            from_node: None,
            to_node: None,
            kind,
            action,
            probability_ppm: 1_000_000,
            count: None,
        }
    }

    /// Limits the rule to its first `n` hits.
    pub fn times(mut self, n: u32) -> Self {
        self.count = Some(n);
        self
    }

    /// Makes the rule fire with this probability (parts per million).
    pub fn with_probability_ppm(mut self, ppm: u32) -> Self {
        self.probability_ppm = ppm;
        self
    }

    /// Limits the rule to messages between two nodes (in that direction).
    pub fn between(mut self, from: usize, to: usize) -> Self {
        self.from_node = Some(from);
        self.to_node = Some(to);
        self
    }
}

#[derive(Default)]
pub(crate) struct FaultState {
    partitions: BTreeSet<(usize, usize)>,
    cm: Vec<CmFault>,
}

impl FaultState {
    fn pair(a: usize, b: usize) -> (usize, usize) {
        (a.min(b), a.max(b))
    }

    pub(crate) fn partition(&mut self, a: usize, b: usize) {
        self.partitions.insert(Self::pair(a, b));
    }

    pub(crate) fn heal(&mut self, a: usize, b: usize) {
        self.partitions.remove(&Self::pair(a, b));
    }

    pub(crate) fn partitioned(&self, a: usize, b: usize) -> bool {
        a != b && self.partitions.contains(&Self::pair(a, b))
    }

    pub(crate) fn add_cm(&mut self, f: CmFault) {
        self.cm.push(f);
    }

    pub(crate) fn clear_cm(&mut self) {
        self.cm.clear();
    }

    /// The fate of a CM message: the first matching rule that fires.
    pub(crate) fn cm_action(
        &mut self,
        rng: &mut Rng,
        from: usize,
        to: usize,
        kind: CmMsgKind,
    ) -> CmAction {
        for i in 0..self.cm.len() {
            let r = &self.cm[i];
            let matches = r.from_node.is_none_or(|n| n == from)
                && r.to_node.is_none_or(|n| n == to)
                && r.kind.is_none_or(|k| k == kind)
                && r.count != Some(0);
            if !matches || !rng.chance_ppm(r.probability_ppm) {
                continue;
            }
            let action = r.action;
            let r = &mut self.cm[i];
            if let Some(c) = r.count.as_mut() {
                *c -= 1;
            }
            return action;
        }
        CmAction::Deliver
    }
}
