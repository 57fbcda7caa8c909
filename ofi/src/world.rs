//! The simulated fabric behind `XRCBTL_OFI_FABRIC=sim` (and `sim-iwarp`):
//! one simulated job per process, `XRCBTL_OFI_SIM_NODES` nodes (2) of
//! `XRCBTL_OFI_SIM_RANKS_PER_NODE` ranks (2), every rank a peer of every
//! other. Each domain the provider opens takes the next free rank, node by
//! node (domains 0 and 1 on node 0, 2 and 3 on node 1 by default), so that
//! a test in one process has endpoints on several nodes and the XRC
//! sharing between them is real. The job is made when the first domain
//! opens and dropped when the last closes; reading any completion queue
//! steps it (virtual time, as every simulated job here).
#![forbid(unsafe_code)]

use std::sync::{Arc, Mutex, MutexGuard};

use xrcbtl_btl::addr::Address;
use xrcbtl_btl::sim::{SimJob, Step};
use xrcbtl_btl::Btl;
use xrcbtl_fabric::sim::{SimContext, SimDevice};

/// Nodes of the job.
pub const NODES_VAR: &str = "XRCBTL_OFI_SIM_NODES";
/// Ranks on each node.
pub const RANKS_VAR: &str = "XRCBTL_OFI_SIM_RANKS_PER_NODE";

struct World {
    job: SimJob,
    taken: Vec<bool>,
}

static WORLD: Mutex<Option<World>> = Mutex::new(None);

fn world() -> MutexGuard<'static, Option<World>> {
    WORLD.lock().unwrap_or_else(|e| e.into_inner())
}

/// The job's shape from the environment, or why a value is refused.
pub fn shape(nodes: Option<&str>, per_node: Option<&str>) -> Result<(usize, usize), String> {
    let read = |v: Option<&str>, name: &str, default: usize| -> Result<usize, String> {
        match v {
            None => Ok(default),
            Some(s) => match s.parse::<usize>() {
                Ok(n) if (1..=64).contains(&n) => Ok(n),
                _ => Err(format!("{name}={s:?}: a number from 1 to 64")),
            },
        }
    };
    Ok((read(nodes, NODES_VAR, 2)?, read(per_node, RANKS_VAR, 2)?))
}

/// A rank of the simulated job, held by one domain; its rank is free again
/// when this drops.
pub struct SimRank {
    /// The rank's number in the job.
    pub rank: u32,
    /// Its node.
    pub node: usize,
    /// Its BTL.
    pub btl: Arc<Btl<SimContext>>,
    /// Its address.
    pub address: Address,
}

impl std::fmt::Debug for SimRank {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimRank({} on node {})", self.rank, self.node)
    }
}

/// Takes the next free rank, making the job on `device` if there is none
/// (with the shape the environment gives). Fails when every rank is taken,
/// or when a job made for another device is still open.
pub fn claim(device: SimDevice, nodes: usize, per_node: usize) -> Result<SimRank, String> {
    let mut guard = world();
    if guard.is_none() {
        let job = SimJob::new(1, nodes, per_node, device.clone())
            .map_err(|e| format!("simulated job: {e}"))?;
        let size = job.size();
        *guard = Some(World {
            job,
            taken: vec![false; size],
        });
    }
    let w = guard.as_mut().expect("made above");
    let have = w.job.peek(0).device().to_string();
    if have != device.name {
        return Err(format!(
            "the simulated job runs on {have}; close its domains before opening one on {}",
            device.name
        ));
    }
    let Some(rank) = w.taken.iter().position(|t| !t) else {
        return Err(format!(
            "all {} simulated ranks have a domain ({NODES_VAR} x {RANKS_VAR})",
            w.taken.len()
        ));
    };
    w.taken[rank] = true;
    let rank = rank as u32;
    let jr = w.job.get(rank);
    let address = Address {
        rank,
        listen: jr
            .btl
            .listen_addr()
            .ok_or("a simulated rank without a listener")?,
        node_key: format!("sim/{}", jr.node),
        receive: jr.btl.receive(),
        ib: jr.btl.listen_ib_addr(),
    };
    Ok(SimRank {
        rank,
        node: jr.node,
        btl: Arc::clone(&jr.btl),
        address,
    })
}

impl Drop for SimRank {
    fn drop(&mut self) {
        let mut guard = world();
        if let Some(w) = guard.as_mut() {
            if let Some(t) = w.taken.get_mut(self.rank as usize) {
                *t = false;
            }
            if w.taken.iter().all(|t| !t) {
                *guard = None;
            }
        }
    }
}

/// One step of the job: the ranks with work progress, or time moves.
/// Returns the work found (0 when time moved or nothing can happen).
pub fn step() -> usize {
    let mut guard = world();
    let Some(w) = guard.as_mut() else { return 0 };
    // The callers may have called into their ranks (posted sends,
    // receives): each taken rank looks for work.
    for (r, taken) in w.taken.iter().enumerate() {
        if *taken {
            w.job.rank(r as u32);
        }
    }
    match w.job.step() {
        Step::Worked(n) => n,
        _ => 0,
    }
}

/// Builds the device the fabric variable names.
pub fn device(iwarp: bool) -> SimDevice {
    if iwarp {
        SimDevice::iwarp("siw0")
    } else {
        SimDevice::ib("sim0")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shape_comes_from_the_environment_within_bounds() {
        assert_eq!(shape(None, None), Ok((2, 2)));
        assert_eq!(shape(Some("3"), Some("1")), Ok((3, 1)));
        assert!(shape(Some("0"), None).unwrap_err().contains(NODES_VAR));
        assert!(shape(None, Some("x")).unwrap_err().contains(RANKS_VAR));
    }

    #[test]
    fn domains_take_ranks_node_by_node_and_give_them_back() {
        let a = claim(device(false), 2, 2).unwrap();
        let b = claim(device(false), 2, 2).unwrap();
        let c = claim(device(false), 2, 2).unwrap();
        assert_eq!((a.rank, a.node), (0, 0));
        assert_eq!((b.rank, b.node), (1, 0));
        assert_eq!((c.rank, c.node), (2, 1));
        assert_eq!(c.address.node_key, "sim/1");
        // A node's ranks listen on its one address (the provider's node
        // key), other nodes on theirs.
        assert_eq!(a.address.listen.ip(), b.address.listen.ip());
        assert_ne!(a.address.listen.ip(), c.address.listen.ip());
        assert!(claim(device(true), 2, 2)
            .unwrap_err()
            .contains("runs on sim0"));
        drop(b);
        let b2 = claim(device(false), 2, 2).unwrap();
        assert_eq!(b2.rank, 1);
        let d = claim(device(false), 2, 2).unwrap();
        assert!(claim(device(false), 2, 2).unwrap_err().contains("all 4"));
        drop((a, b2, c, d));
        // Every rank given back: the next claim makes a fresh job.
        let e = claim(device(true), 2, 2).unwrap();
        assert_eq!(e.rank, 0);
        step();
    }
}
