//! Where peers are: each known rank's node and listeners, and the routes
//! resolved to each node, reused by the node's other ranks (one route
//! resolution per node, not per rank).

use std::collections::HashMap;
use std::net::SocketAddr;

use xrcbtl_fabric::{CmRoute, IbAddr};
use xrcbtl_xrc_conn::{Node, Rank, RouteRef};

/// The known ranks and the routes to their nodes.
pub(super) struct Directory {
    node: HashMap<Rank, Node>,
    addr: HashMap<Rank, SocketAddr>,
    /// Peers' native InfiniBand listeners, for those that have one.
    ib: HashMap<Rank, IbAddr>,
    routes: HashMap<RouteRef, CmRoute>,
    route_of_node: HashMap<Node, RouteRef>,
}

impl Directory {
    /// Nobody known yet.
    pub fn new() -> Self {
        Directory {
            node: HashMap::new(),
            addr: HashMap::new(),
            ib: HashMap::new(),
            routes: HashMap::new(),
            route_of_node: HashMap::new(),
        }
    }

    /// Makes `rank` known: its node, its listener, and its native
    /// InfiniBand listener if it has one (a rank added again may have lost
    /// it).
    pub fn add(&mut self, rank: Rank, node: Node, addr: SocketAddr, ib: Option<IbAddr>) {
        self.node.insert(rank, node);
        self.addr.insert(rank, addr);
        match ib {
            Some(a) => self.ib.insert(rank, a),
            None => self.ib.remove(&rank),
        };
    }

    /// `rank`'s node.
    pub fn node(&self, rank: Rank) -> Option<Node> {
        self.node.get(&rank).copied()
    }

    /// `rank`'s listener.
    pub fn addr(&self, rank: Rank) -> Option<SocketAddr> {
        self.addr.get(&rank).copied()
    }

    /// `rank`'s native InfiniBand listener.
    pub fn ib(&self, rank: Rank) -> Option<&IbAddr> {
        self.ib.get(&rank)
    }

    /// A route resolved before.
    pub fn route(&self, r: RouteRef) -> Option<&CmRoute> {
        self.routes.get(&r)
    }

    /// The route to `node`: the one kept already, else `route`, kept under
    /// the reference `fresh` makes.
    pub fn keep_route(
        &mut self,
        node: Node,
        route: CmRoute,
        fresh: impl FnOnce() -> RouteRef,
    ) -> RouteRef {
        let routes = &mut self.routes;
        *self.route_of_node.entry(node).or_insert_with(|| {
            let r = fresh();
            routes.insert(r, route);
            r
        })
    }
}
