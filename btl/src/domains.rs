//! The XRC domains of nodes: every rank of a job must receive the same
//! way (XRC or RC), and the XRC ranks of one node must share one domain,
//! since this rank reaches all of them through one INI QP. Each peer
//! states how it receives when it is added; a peer that disagrees is
//! refused before anything of it is kept.

use std::collections::hash_map::Entry;
use std::collections::HashMap;

use xrcbtl_fabric::{Error, Result, XrcdId};
use xrcbtl_xrc_conn::{Node, Rank};

use crate::types::{Peer, Receive};

/// How this rank receives, and the domain each node's peers stated.
pub(crate) struct Domains {
    /// How this rank receives.
    mine: Receive,
    /// This rank's node and rank.
    node: Node,
    rank: Rank,
    /// The XRC domain each other node's peers stated, and the first peer
    /// that stated it.
    known: HashMap<Node, (XrcdId, Rank)>,
}

impl Domains {
    /// `rank` on `node`, receiving by `mine`; no peer known yet.
    pub fn new(mine: Receive, node: Node, rank: Rank) -> Self {
        Domains {
            mine,
            node,
            rank,
            known: HashMap::new(),
        }
    }

    /// How this rank receives.
    pub fn mine(&self) -> Receive {
        self.mine
    }

    /// Refuses a peer that disagrees with this rank on how ranks receive:
    /// XRC against RC anywhere in the job, or another XRC domain on a
    /// node whose domain is known (this rank's own, or one a peer there
    /// stated).
    pub fn check(&self, p: &Peer) -> Result<()> {
        let Some(theirs) = p.receive else {
            return Ok(());
        };
        let mine = self.mine;
        let word = |r: Receive| match r {
            Receive::Xrc(_) => "XRC",
            Receive::Rc => "RC",
        };
        let known = if p.node == self.node {
            match mine {
                Receive::Xrc(a) => Some((a, self.rank)),
                Receive::Rc => None,
            }
        } else {
            self.known.get(&p.node).copied()
        };
        match (mine, theirs) {
            (Receive::Xrc(_), Receive::Xrc(b)) => match known {
                Some((a, other)) if a != b && other != p.rank => Err(Error::invalid(format!(
                    "rank {} on node {} opened another XRC domain than rank {other} there \
                     (key file dev {} inode {}, rank {other}'s dev {} inode {}): every rank \
                     of a node must find the same key file (one XRCBTL_XRCD_DIR on one file \
                     system)",
                    p.rank, p.node, b.dev, b.ino, a.dev, a.ino
                ))),
                _ => Ok(()),
            },
            (Receive::Xrc(_), Receive::Rc) | (Receive::Rc, Receive::Xrc(_)) => {
                Err(Error::invalid(format!(
                    "rank {} receives by {} and rank {} by {}: the ranks of a job must agree \
                     (XRCBTL_FORCE_RC=1 on every rank where some device lacks XRC)",
                    p.rank,
                    word(theirs),
                    self.rank,
                    word(mine)
                )))
            }
            _ => Ok(()),
        }
    }

    /// Checks peers as [`Domains::check`] does, each also against those
    /// before it, and remembers the domains they state; on a refusal,
    /// forgets what this call learnt.
    pub fn check_all(&mut self, peers: &[Peer]) -> Result<()> {
        let mut learnt = Vec::new();
        for p in peers {
            if let Err(e) = self.check(p) {
                for n in learnt {
                    self.known.remove(&n);
                }
                return Err(e);
            }
            if let Some(Receive::Xrc(x)) = p.receive {
                if let Entry::Vacant(v) = self.known.entry(p.node) {
                    v.insert((x, p.rank));
                    learnt.push(p.node);
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn xrc(ino: u64) -> Receive {
        Receive::Xrc(XrcdId { dev: 1, ino })
    }

    fn peer(rank: Rank, node: Node, receive: Option<Receive>) -> Peer {
        Peer {
            rank,
            node,
            addr: "127.0.0.1:1".parse().unwrap(),
            ib: None,
            receive,
        }
    }

    #[test]
    fn xrc_and_rc_ranks_are_refused_anywhere_and_unstated_ones_pass() {
        let mut d = Domains::new(xrc(7), 0, 0);
        assert!(d.check_all(&[peer(1, 5, Some(Receive::Rc))]).is_err());
        let mut rc = Domains::new(Receive::Rc, 0, 0);
        assert!(rc.check_all(&[peer(1, 5, Some(xrc(7)))]).is_err());
        assert!(rc.check_all(&[peer(1, 5, Some(Receive::Rc))]).is_ok());
        assert!(d.check_all(&[peer(2, 0, None)]).is_ok());
    }

    #[test]
    fn one_node_has_one_domain_this_ranks_own_or_the_first_stated() {
        let mut d = Domains::new(xrc(7), 0, 0);
        // This rank's node: its own domain.
        assert!(d.check_all(&[peer(1, 0, Some(xrc(7)))]).is_ok());
        assert!(d.check_all(&[peer(2, 0, Some(xrc(8)))]).is_err());
        // Another node: the first peer's, also within one call.
        assert!(d
            .check_all(&[peer(3, 4, Some(xrc(9))), peer(4, 4, Some(xrc(10)))])
            .is_err());
        assert!(d.check_all(&[peer(3, 4, Some(xrc(9)))]).is_ok());
        assert!(d.check_all(&[peer(4, 4, Some(xrc(10)))]).is_err());
        // The peer that stated it may state it again.
        assert!(d.check_all(&[peer(3, 4, Some(xrc(9)))]).is_ok());
    }

    #[test]
    fn a_refused_call_forgets_what_it_learnt() {
        let mut d = Domains::new(xrc(7), 0, 0);
        // Node 4 is learnt from rank 3, then rank 5 is refused.
        assert!(d
            .check_all(&[peer(3, 4, Some(xrc(9))), peer(5, 6, Some(Receive::Rc))])
            .is_err());
        // So node 4's domain is not known: another one is taken.
        assert!(d.check_all(&[peer(6, 4, Some(xrc(11)))]).is_ok());
    }
}
