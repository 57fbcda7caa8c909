//! The BTL rank behind a domain on a real verbs device.
//!
//! libfabric gives a provider no job: no rank, no size, no address
//! exchange before `fi_av_insert`. A BTL rank still needs a number that no
//! other rank it meets shares, from before it can say anything. A domain's
//! rank is therefore its listener: the low 16 bits of its IPv4 address,
//! then its port ([`rank_of`]). The domain picks a port, tries to listen
//! there, and takes the next one when another process holds it. Ranks are
//! unique while the hosts of a job differ in the low 16 bits of their
//! addresses (any one /16 network; the README says so), and a rank can be
//! turned back into its listener from the address its requests come from
//! ([`Resolver`]): a peer that connects before its address was inserted
//! is found, as the Open MPI component finds one through the modex.
//!
//! The ranks of a host on one device share an XRC domain file named after
//! the job (`XRCBTL_OFI_JOB`, `ofi` by default), and a node is a
//! listener's IP address ([`EpAddr::node_key`]), so that a host's domains
//! share one INI QP to each remote node as the BTL's ranks do.
#![forbid(unsafe_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use xrcbtl_btl::addr::NodeNumbers;
use xrcbtl_btl::Peer;

pub use crate::addr::rank_of;
use crate::addr::EpAddr;

/// The variable naming the job, whose ranks on a host share an XRC domain
/// file.
pub const JOB_VAR: &str = "XRCBTL_OFI_JOB";
/// The job name without it.
pub const DEFAULT_JOB: &str = "ofi";
/// Ports a domain tries before it gives up.
pub const PORT_TRIES: u16 = 64;
/// The first port tried is in `[PORT_BASE, PORT_BASE + PORT_SPAN)`.
pub const PORT_BASE: u16 = 20_000;
/// See [`PORT_BASE`].
pub const PORT_SPAN: u16 = 30_000;

/// The ports the `nth` domain a process opens tries, in order: a start
/// spread by its process id (so that the ranks of a host seldom meet) and
/// moved on for each domain the process opened before (so that a domain
/// opened after another closed is not taken, by peers that knew the
/// first, for the same rank back again: a rank that left stays gone), then
/// every 97th port after it, within the span.
pub fn ports(pid: u32, nth: u32) -> impl Iterator<Item = u16> {
    let start =
        ((pid.wrapping_mul(2_654_435_761) >> 8) + nth.wrapping_mul(7_919)) % u32::from(PORT_SPAN);
    (0..u32::from(PORT_TRIES))
        .map(move |i| PORT_BASE + ((start + i * 97) % u32::from(PORT_SPAN)) as u16)
}

/// The settings of the provider itself (`XRCBTL_OFI_*`), which the BTL's
/// check of its own names leaves alone.
pub const OFI_VARS: [&str; 6] = [
    crate::devices::FABRIC_VAR,
    crate::world::NODES_VAR,
    crate::world::RANKS_VAR,
    crate::engine::UNEXPECTED_VAR,
    crate::engine::VERBOSE_VAR,
    JOB_VAR,
];

/// Refuses an `XRCBTL_*` variable among `names` that is neither a BTL
/// setting nor one of the provider's ([`OFI_VARS`]), naming it.
pub fn check_names<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Result<(), String> {
    let mut btl = Vec::new();
    for name in names {
        let name = name.as_ref();
        if let Some(rest) = name.strip_prefix("XRCBTL_OFI_") {
            if !OFI_VARS.contains(&name) {
                return Err(format!(
                    "XRCBTL_OFI_{rest} is not a setting of the xrc provider (they are {})",
                    OFI_VARS.join(", ")
                ));
            }
        } else {
            btl.push(name.to_string());
        }
    }
    xrcbtl_btl::BtlConfig::check_names(btl).map_err(|e| e.to_string())
}

/// Finds a peer domain that asks for a connection before its address was
/// inserted: its listener is the IP address its request came from and the
/// port its rank names, its node that address's.
#[derive(Debug, Clone)]
pub struct Resolver {
    nodes: Arc<NodeNumbers>,
}

impl Resolver {
    /// A resolver numbering nodes with `nodes` (the domain's numbers,
    /// shared with its address vector's insertions).
    pub fn new(nodes: Arc<NodeNumbers>) -> Resolver {
        Resolver { nodes }
    }

    /// The peer `rank` whose request came from `from`; `None` when the CM
    /// did not say, or the address is not the one the rank names (a
    /// request that lies about its rank is refused).
    pub fn resolve(&self, rank: u32, from: Option<SocketAddr>) -> Option<Peer> {
        let ip = from?.ip();
        let port = (rank & 0xffff) as u16;
        if rank_of(ip, port)? != rank {
            return None;
        }
        // All it can know of the peer is what an address made from its
        // listener says (how it receives: not known, not checked).
        Some(self.peer(&EpAddr::template(ip, port)))
    }

    /// The BTL's peer for an inserted address.
    pub fn peer(&self, a: &EpAddr) -> Peer {
        a.btl_peer(&self.nodes)
    }
}

#[cfg(feature = "verbs")]
pub use verbs::{open, VerbsRank};

#[cfg(feature = "verbs")]
mod verbs {
    use std::net::{IpAddr, SocketAddr};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;

    use xrcbtl_btl::addr::{job_number, Address, NodeNumbers};
    use xrcbtl_btl::{Btl, BtlConfig};
    use xrcbtl_fabric::verbs::{job_xrcd_key, VerbsContext, VerbsFabric};
    use xrcbtl_fabric::{Error, Fabric, XrcdKey};

    use super::{check_names, ports, rank_of, Resolver, DEFAULT_JOB, JOB_VAR};
    use crate::addr::EpAddr;

    /// A domain's rank on a verbs device.
    pub struct VerbsRank {
        /// Its BTL.
        pub btl: Arc<Btl<VerbsContext>>,
        /// Its address.
        pub address: Address,
        /// Its peers, from inserted addresses and from requests.
        pub resolver: Resolver,
    }

    /// How long a closing domain waits for its work to finish, and again
    /// for its peers to hear it is leaving.
    pub const LINGER: std::time::Duration = std::time::Duration::from_secs(10);

    impl VerbsRank {
        /// Leaves cleanly, as a closing domain does: what was handed to
        /// the BTL goes out (a send that completed once copied still
        /// reaches its peer), then the peers hear the rank is leaving, so
        /// that they see a departure, not a failure. Each wait ends after
        /// `LINGER` (a peer that died cannot answer).
        pub fn leave(&self) {
            let _ = self.btl.flush(LINGER);
            self.btl.shutdown();
            let end = std::time::Instant::now() + LINGER;
            while !self.btl.is_drained() && std::time::Instant::now() < end {
                if self.btl.progress() == 0 {
                    std::thread::yield_now();
                }
            }
        }
    }

    impl std::fmt::Debug for VerbsRank {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(
                f,
                "VerbsRank({} at {})",
                self.address.rank, self.address.listen
            )
        }
    }

    /// Opens a rank on verbs device `device`, listening on `ip`, its
    /// interface's IPv4 address (as [`crate::devices`] found it), at
    /// `port` when one is given and free (the port of the info's
    /// `src_addr`, as `fi_getinfo` placed it from a service), else at the
    /// first free port of [`ports`], with the BTL's settings from the
    /// environment.
    pub fn open(device: &str, ip: IpAddr, port: Option<u16>) -> Result<VerbsRank, String> {
        check_names(std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()))?;
        let job = std::env::var(JOB_VAR).unwrap_or_else(|_| DEFAULT_JOB.into());
        if !matches!(ip, IpAddr::V4(_)) {
            return Err(format!(
                "{device}: the provider needs an IPv4 address on the interface (has {ip})"
            ));
        }
        let fabric = VerbsFabric::new().map_err(|e| e.to_string())?;
        let mut last = String::new();
        // The named port first; where another domain holds it (two opened
        // from one info), the spread as without one.
        static OPENED: AtomicU32 = AtomicU32::new(0);
        let nth = OPENED.fetch_add(1, Ordering::Relaxed);
        let tries: Vec<u16> = port
            .into_iter()
            .chain(ports(std::process::id(), nth))
            .collect();
        let n = tries.len();
        // One configuration; each try changes the rank and listener only.
        let mut base = BtlConfig::new(
            0,
            0,
            job_number(&job),
            XrcdKey::new(""),
            SocketAddr::new(ip, 0),
        )
        .with_vars(|k| std::env::var(k).ok())
        .map_err(|e| e.to_string())?;
        base.xrcd_key =
            job_xrcd_key(&job, device, base.xrcd_dir.as_deref()).map_err(|e| e.to_string())?;
        for port in tries {
            let rank = rank_of(ip, port).expect("IPv4");
            let cfg = BtlConfig {
                rank,
                listen: SocketAddr::new(ip, port),
                ..base.clone()
            };
            let ctx = fabric.open(device).map_err(|e| e.to_string())?;
            match Btl::new(ctx, cfg) {
                Ok(btl) => {
                    let key = EpAddr::node_key(ip);
                    let address = Address {
                        rank,
                        listen: SocketAddr::new(ip, port),
                        node_key: key.clone(),
                        receive: btl.receive(),
                        ib: btl.listen_ib_addr(),
                    };
                    let resolver = Resolver::new(Arc::new(NodeNumbers::new(&key, 0, false)));
                    let btl = Arc::new(btl);
                    let r = resolver.clone();
                    btl.set_peer_resolver_by_source(move |rank, from| r.resolve(rank, from));
                    return Ok(VerbsRank {
                        btl,
                        address,
                        resolver,
                    });
                }
                Err(Error::AddrInUse(e)) => last = e,
                Err(e) => return Err(format!("{device}: {e}")),
            }
        }
        Err(format!(
            "{device}: no free port to listen on at {ip} in {n} tries (last: {last})"
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;
    use std::net::IpAddr;
    use xrcbtl_btl::addr::Address;
    use xrcbtl_btl::Receive;

    #[test]
    fn a_rank_is_the_low_half_of_the_address_and_the_port() {
        let ip: IpAddr = "10.1.2.3".parse().unwrap();
        assert_eq!(rank_of(ip, 0x4e20), Some(0x0203_4e20));
        assert_eq!(rank_of("::1".parse().unwrap(), 1), None);
    }

    #[test]
    fn ports_stay_in_their_span_and_differ_by_process() {
        for pid in [1, 2, 4242, u32::MAX] {
            let p: Vec<u16> = ports(pid, 0).collect();
            assert_eq!(p.len(), usize::from(PORT_TRIES));
            assert!(p
                .iter()
                .all(|&p| (PORT_BASE..PORT_BASE + PORT_SPAN).contains(&p)));
            assert_eq!(
                p.iter().collect::<HashSet<_>>().len(),
                p.len(),
                "no repeats"
            );
        }
        let firsts: HashSet<u16> = (1000..1100)
            .map(|pid| ports(pid, 0).next().unwrap())
            .collect();
        // A process's later domains start elsewhere.
        let later: HashSet<u16> = (0..50).map(|n| ports(4242, n).next().unwrap()).collect();
        assert_eq!(later.len(), 50);
        assert!(
            firsts.len() > 90,
            "neighbouring pids start apart: {}",
            firsts.len()
        );
    }

    #[test]
    fn the_provider_checks_its_names_and_the_btls() {
        assert!(check_names([
            "PATH",
            "XRCBTL_OFI_FABRIC",
            "XRCBTL_OFI_JOB",
            "XRCBTL_CREDITS"
        ])
        .is_ok());
        let e = check_names(["XRCBTL_OFI_FABRIK"]).unwrap_err();
        assert!(e.contains("XRCBTL_OFI_FABRIK is not a setting"), "{e}");
        let e = check_names(["XRCBTL_CREDIT"]).unwrap_err();
        assert!(e.contains("did you mean XRCBTL_CREDITS"), "{e}");
    }

    #[test]
    fn an_unknown_peer_is_found_from_where_it_asked_only_if_that_is_its_rank() {
        let nodes = Arc::new(NodeNumbers::new(
            &EpAddr::node_key("10.0.0.1".parse().unwrap()),
            0,
            false,
        ));
        let r = Resolver::new(nodes);
        let ip: IpAddr = "10.0.7.9".parse().unwrap();
        let rank = rank_of(ip, 23_456).unwrap();
        // The request comes from the CM's port, not the listener's.
        let p = r.resolve(rank, Some(SocketAddr::new(ip, 51_000))).unwrap();
        assert_eq!(p.addr, SocketAddr::new(ip, 23_456));
        assert_eq!(p.node, 1, "a new node");
        assert_eq!((p.ib, p.receive), (None, None));
        // Another domain of that host is on the same node.
        let q = r
            .resolve(rank_of(ip, 23_457).unwrap(), Some(SocketAddr::new(ip, 1)))
            .unwrap();
        assert_eq!(q.node, 1);
        // From another host than the rank names, or unsaid: refused.
        assert!(r
            .resolve(rank, Some(SocketAddr::new("10.0.8.9".parse().unwrap(), 1)))
            .is_none());
        assert!(r.resolve(rank, None).is_none());
        // An inserted address of that host numbers its node the same.
        let a = EpAddr::of(
            &Address {
                rank,
                listen: SocketAddr::new(ip, 23_456),
                node_key: "ignored: the provider's key is the IP".into(),
                receive: Receive::Rc,
                ib: None,
            },
            3,
        );
        let peer = r.peer(&a);
        assert_eq!(
            (peer.rank, peer.node, peer.receive),
            (rank, 1, Some(Receive::Rc))
        );
    }
}
