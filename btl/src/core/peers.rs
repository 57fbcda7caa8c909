//! The core's side of peers and connections: peers checked and added,
//! endpoints connected on demand, and what the connection driver reports
//! (a path ready, lost or gone, a QP destroyed, an SRQ low) acted on.

use std::time::Duration;

use xrcbtl_fabric::{Context, Error, IbAddr, Result};
use xrcbtl_xrc_conn::{ConnManager, Mode, Notice, Rank};

use crate::conn::{ConnEvent, DriverStats};
use crate::ep::{EpState, Path};
use crate::types::{BtlError, Peer, PeerResolver, Receive};
use crate::work::Item;

use super::Core;

impl<C: Context, H> Core<C, H> {
    /// How this rank receives ([`crate::domains::Domains::mine`]).
    pub fn receive(&self) -> Receive {
        self.domains.mine()
    }

    /// Checks peers before any is added ([`crate::domains::Domains::check_all`]).
    pub fn check_peers(&mut self, peers: &[Peer]) -> Result<()> {
        self.domains.check_all(peers)
    }

    /// Makes an endpoint for `p` (connected on first use); a known peer
    /// keeps its endpoint. On iWARP the receive queues grow with the peers.
    pub fn add_peer(&mut self, p: &Peer) {
        if p.rank != self.cfg.rank {
            self.drv.add_peer(p.rank, p.node, p.addr, p.ib);
        }
        self.eps.add(p.rank);
        if self.iface.credits() {
            let peers = self.eps.len().saturating_sub(1) as u32;
            match self
                .iface
                .provision(peers, self.cfg.credits, self.cfg.srq_refill)
            {
                Ok((added, short)) => {
                    self.stats.srq_grown += u64::from(added);
                    self.stats.overcommitted = u64::from(short);
                }
                Err(_) => self.stats.no_resource += 1,
            }
        }
    }

    /// Deletes the endpoint to `rank`: its work fails with `Closed`, and
    /// its own error callback is forgotten.
    pub fn remove_peer(&mut self, rank: Rank) {
        self.fail_rank(rank, BtlError::Closed(rank));
        self.eps.remove(rank);
        self.cbs.forget(rank);
    }

    /// Sets how requests from unknown ranks are answered.
    pub fn set_resolver(&mut self, resolver: PeerResolver) {
        self.resolver = Some(resolver);
    }

    /// The endpoint of `rank`, if it is usable.
    #[inline]
    pub fn endpoint(&self, rank: Rank) -> Result<u32> {
        match self.eps.find(rank) {
            Some(ei) if !matches!(self.eps.get(ei).state, EpState::Gone(_)) => Ok(ei),
            _ => Err(self.no_endpoint(rank)),
        }
    }

    /// Why [`Core::endpoint`] has no endpoint to `rank`.
    #[cold]
    #[inline(never)]
    fn no_endpoint(&self, rank: Rank) -> Error {
        match self.eps.find(rank).map(|ei| &self.eps.get(ei).state) {
            Some(EpState::Gone(e)) => Error::state(format!("endpoint to rank {rank} is gone: {e}")),
            _ => Error::invalid(format!("rank {rank} is not a known peer")),
        }
    }

    /// Starts connecting endpoint `ei` unless it has a path or is on its
    /// way to one.
    pub fn connect(&mut self, ei: u32) {
        let ep = self.eps.get_mut(ei);
        if ep.path.is_none() && !ep.connecting {
            ep.connecting = true;
            let rank = ep.rank;
            let now = self.cfg.clock.now();
            self.drv.connect(now, rank);
        }
    }

    /// Whether messages to `rank` can be posted now (a connection is up).
    pub fn is_connected(&self, rank: Rank) -> bool {
        self.eps
            .find(rank)
            .is_some_and(|ei| self.eps.get(ei).path.is_some())
    }

    /// Whether one-sided work can reach this rank's own memory (the
    /// device has a loopback).
    pub fn has_loopback(&self) -> bool {
        self.drv.has_loopback()
    }

    pub(super) fn on_conn_event(&mut self, ev: ConnEvent) {
        match ev {
            ConnEvent::Ready {
                rank,
                slot,
                qpn,
                srqns,
            } => {
                self.sends.slot_ready(slot);
                if let Some(ei) = self.eps.find(rank) {
                    let ep = self.eps.get_mut(ei);
                    ep.connecting = false;
                    let small_srqn = self.iface.small_class.and_then(|c| srqns.get(c).copied());
                    ep.path = Some(Path {
                        slot,
                        qpn,
                        srqns,
                        small_srqn,
                    });
                    self.eps.mark_ready(ei);
                    if self.iface.mode == Mode::Xrc && rank != self.cfg.rank {
                        self.eps.uses_ini(slot, ei);
                    }
                }
            }
            ConnEvent::Notice(Notice::Lost { rank }) => {
                if let Some(ei) = self.eps.find(rank) {
                    let ep = self.eps.get_mut(ei);
                    ep.path = None;
                    // Rebuilt at once, with or without work waiting: a rank
                    // that only waits for this peer must hear of its death
                    // (the rebuild fails, and the peer with it) within the
                    // connection retries, not at its next send.
                    ep.connecting = ep.is_open();
                    if ep.connecting {
                        let now = self.cfg.clock.now();
                        self.drv.connect(now, rank);
                    }
                    self.eps.mark_ready(ei);
                }
            }
            ConnEvent::Notice(Notice::Closed { rank }) => {
                self.fail_rank(rank, BtlError::Closed(rank))
            }
            ConnEvent::Notice(Notice::Failed { rank, reason }) => {
                self.fail_rank(rank, BtlError::Unreachable(rank, reason))
            }
            ConnEvent::Notice(Notice::Drained) => self.drained = true,
            ConnEvent::Notice(Notice::UnknownPeer { rank }) => {
                // The resolver runs under the lock: it must not call into
                // the BTL (it reads the library's address exchange).
                let from = self.drv.unknown_source(rank);
                let found = self.resolver.as_ref().and_then(|f| f(rank, from));
                match found {
                    Some(p) if p.rank == rank && self.check_peers(&[p]).is_ok() => {
                        self.stats.peers_resolved += 1;
                        self.add_peer(&p);
                    }
                    _ => {
                        let now = self.cfg.clock.now();
                        self.drv.unknown_peer(now, rank);
                    }
                }
            }
            ConnEvent::Notice(Notice::Ready { .. } | Notice::Refused { .. }) => {}
            ConnEvent::Destroyed { slot, qpn, peer } => {
                self.sends.slot_destroyed(slot);
                // Only the endpoints that used the QP hold anything of it:
                // its peer's (RC, loopback), or those whose path it was
                // (XRC INI). Not a look through every endpoint: a million
                // RC QPs going at exit would make that quadratic.
                let mut users = self.eps.take_ini_users(slot);
                users.extend(peer.and_then(|r| self.eps.find(r)));
                for &ei in &users {
                    let ep = self.eps.get_mut(ei);
                    ep.credits.forget(qpn);
                    if ep.path.as_ref().is_some_and(|p| p.slot == slot) {
                        ep.path = None;
                    }
                }
                #[cfg(debug_assertions)]
                for (ei, ep) in self.eps.all() {
                    let live = self.eps.find(ep.rank) == Some(ei);
                    assert!(
                        !live
                            || ep.path.as_ref().is_none_or(|p| p.slot != slot)
                                && !ep.credits.has(qpn),
                        "rank {}'s endpoint still uses destroyed QP {qpn} (slot {slot})",
                        ep.rank
                    );
                }
                // Work on a destroyed QP never completes, and messages that
                // left on it may not have arrived: post them again, in
                // order. A credit-only message that left is never sent
                // again (its credits belonged to this connection), nor is
                // one that left for an endpoint failed since (nothing more
                // is owed to it).
                for p in self.sends.take(&mut self.eps, Some(slot), |p| p.qp == slot) {
                    if p.left && (p.item.is_credit() || !self.eps.get(p.ep).is_open()) {
                        self.let_go_kept(p.item);
                    } else {
                        self.requeue(p.ep, p.item);
                    }
                }
            }
            ConnEvent::SrqLimit { srq } => {
                if let Some(class) = self.iface.class_of_srq(srq) {
                    self.stats.srq_limit_events += 1;
                    match self.iface.refill(class) {
                        Ok(n) => self.stats.srq_grown += u64::from(n),
                        Err(_) => self.stats.no_resource += 1,
                    }
                }
            }
        }
    }

    /// A rendezvous waits on its peer for an answer (RTR, ATS, FIN), and a
    /// peer may have given this rank up without a word reaching it: it
    /// declared this rank failed while this rank was stopped, or cut off,
    /// for longer than its retries, and its Leave found nobody. Such a
    /// peer says so when it next hears from this rank (`disown`). So every
    /// [`super::PROBE_EVERY`], a peer waited on that has sent nothing since the
    /// last look gets an empty credit message; a live peer ignores it.
    pub(super) fn probe_silent(&mut self) {
        for rank in self.rndv.waiting_on() {
            let Some(ei) = self.eps.find(rank) else {
                continue;
            };
            let ep = self.eps.get_mut(ei);
            if !ep.is_open() {
                continue;
            }
            let heard = ep.rx.expected();
            if ep.probe_seen.replace(heard) == Some(heard) {
                self.stats.probes += 1;
                self.eps.requeue(ei, Item::credit());
            }
        }
    }

    /// The connection driver's counters.
    pub fn driver_stats(&self) -> DriverStats {
        self.drv.stats().clone()
    }

    /// Runs `f` on the connection manager (counters, state).
    pub fn with_manager<R>(&self, f: impl FnOnce(&ConnManager) -> R) -> R {
        f(self.drv.manager())
    }

    /// Connection notices seen since the last call.
    pub fn take_notices(&mut self) -> Vec<Notice> {
        self.drv.take_notices()
    }

    /// When progress is next needed for a connection timer, if ever.
    pub fn next_timeout(&self) -> Option<Duration> {
        self.drv.next_timeout()
    }

    /// The native InfiniBand address peers reach this rank by, if any.
    pub fn listen_ib_addr(&self) -> Option<IbAddr> {
        self.drv.listen_ib_addr()
    }
}
