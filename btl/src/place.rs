//! Placement near the device: which device a process should use when it
//! has several, the NUMA node of the BTL's registered buffers and the CPUs
//! of its progress thread, all read from this machine's hardware topology
//! (hwloc, through `xrcbtl-topo`).
//!
//! Nothing here touches the device; the interface allocates on the node
//! decided here, and [`crate::Threaded`] binds its thread.

use std::fmt;

pub use xrcbtl_topo::{Candidate, Choice, IndexSet, Locality, Nearness, Placement, Topo};

/// What a BTL does about locality.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Place {
    /// Find the device in this machine's topology: buffers on its NUMA
    /// node, the progress thread on its CPUs (those the process may use).
    #[default]
    Auto,
    /// Place nothing.
    Off,
    /// Exactly this (tests, or a launcher that knows better).
    Given(Placement),
}

/// Where a BTL's device is and what the BTL placed where.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Placed {
    /// The device's locality, when the topology knows the device.
    pub locality: Option<Locality>,
    /// The placement decided.
    pub placement: Placement,
    /// Why nothing is placed, when nothing is.
    pub why_not: Option<String>,
}

impl fmt::Display for Placed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.locality {
            Some(l) => write!(f, "device near {l} (found as {}); ", l.found_as)?,
            None => f.write_str("device locality unknown; ")?,
        }
        write!(f, "{}", self.placement)?;
        if let Some(w) = &self.why_not {
            write!(f, " ({w})")?;
        }
        Ok(())
    }
}

/// Decides the placement of a BTL whose device the topology may know by
/// `names` (its own name, then its interfaces').
pub fn resolve(names: &[String], place: &Place) -> Placed {
    match place {
        Place::Off => Placed {
            why_not: Some("placement off".into()),
            ..Placed::default()
        },
        Place::Given(p) => Placed {
            placement: p.clone(),
            ..Placed::default()
        },
        Place::Auto if names.is_empty() => Placed {
            why_not: Some("a simulated device".into()),
            ..Placed::default()
        },
        Place::Auto => {
            let Some(topo) = Topo::this_system() else {
                return Placed {
                    why_not: Topo::load_error(),
                    ..Placed::default()
                };
            };
            let refs: Vec<&str> = names.iter().map(String::as_str).collect();
            let Some(locality) = topo.locality(&refs) else {
                return Placed {
                    why_not: Some(format!("hwloc does not know {}", names.join(" or "))),
                    ..Placed::default()
                };
            };
            let placement = Topo::placement(&locality, topo.process_cpus().as_ref());
            Placed {
                locality: Some(locality),
                placement,
                why_not: None,
            }
        }
    }
}

/// `candidates` ranked nearest first to where this process runs (its CPU
/// binding, or the CPU it is on when it may run anywhere). Unranked, in the
/// order given, when the topology cannot be read.
pub fn rank_devices(candidates: &[Candidate]) -> Vec<Choice> {
    let unranked = || {
        candidates
            .iter()
            .map(|c| Choice {
                device: c.name.clone(),
                nearness: Nearness::Unknown,
                locality: None,
            })
            .collect()
    };
    let Some(topo) = Topo::this_system() else {
        return unranked();
    };
    let Some(here) = topo.running_on() else {
        return unranked();
    };
    topo.rank(candidates, &here)
}

/// Binds the calling thread to the placement's CPUs; `Ok(false)` when the
/// placement has none.
pub fn bind_this_thread(p: &Placement) -> xrcbtl_topo::Result<bool> {
    let Some(cpus) = &p.cpus else {
        return Ok(false);
    };
    let topo = Topo::this_system()
        .ok_or_else(|| xrcbtl_topo::TopoError::Load(Topo::load_error().unwrap_or_default()))?;
    topo.bind_thread(cpus)?;
    Ok(true)
}

/// The verbs devices that have an IPv4 address on an interface (where the
/// RDMA CM reaches them), nearest first to where this process runs.
#[cfg(feature = "verbs")]
pub fn verbs_devices_nearest_first(
    fabric: &xrcbtl_fabric::verbs::VerbsFabric,
) -> xrcbtl_fabric::Result<Vec<Choice>> {
    use xrcbtl_fabric::verbs::{device_ip, device_netdevs};
    use xrcbtl_fabric::Fabric;
    let candidates: Vec<Candidate> = fabric
        .devices()?
        .into_iter()
        .filter(|d| device_ip(&d.name).is_ok())
        .map(|d| Candidate {
            aliases: device_netdevs(&d.name),
            name: d.name,
        })
        .collect();
    Ok(rank_devices(&candidates))
}

/// One line for a benchmark header or a log: the device chosen, how near
/// it is, and the other candidates.
pub fn describe_choice(chosen: &str, ranked: &[Choice]) -> String {
    let others: Vec<String> = ranked
        .iter()
        .filter(|c| c.device != chosen)
        .map(|c| format!("{} ({:?})", c.device, c.nearness))
        .collect();
    let near = ranked
        .iter()
        .find(|c| c.device == chosen)
        .map_or("named".to_string(), |c| format!("{:?}", c.nearness));
    if others.is_empty() {
        format!("{chosen} ({near}; the only candidate)")
    } else {
        format!("{chosen} ({near}; also: {})", others.join(", "))
    }
}
