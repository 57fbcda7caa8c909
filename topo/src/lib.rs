//! Locality: where an RDMA device sits on this machine, read from hwloc.
//!
//! An HCA hangs off one socket's PCI root. Memory it reads and writes is
//! cheapest on that socket's NUMA node, and the thread that polls it is
//! quickest on that socket's cores. This crate answers three questions:
//!
//! - where is a device ([`Topo::locality`]: its CPUs and NUMA nodes, found
//!   by the device's name or, for a software device such as rxe, by the
//!   name of a network interface it runs on);
//! - which of several devices is nearest to the CPUs this process runs on
//!   ([`Topo::rank`]);
//! - where the BTL should put its registered buffers and its progress
//!   thread ([`Topo::placement`], [`Topo::bind_thread`]).
//!
//! A topology is the machine's own ([`Topo::this_system`]; hwloc honours
//! `HWLOC_XMLFILE`) or one loaded from an XML file ([`Topo::from_xml_file`]),
//! which is how tests describe a machine with two sockets and two HCAs.
//! Bindings are applied only on the machine's own topology.
//!
//! It depends on nothing else in the workspace and does no I/O besides
//! hwloc's.

#![forbid(unsafe_code)]

use std::fmt;
use std::path::Path;
use std::str::FromStr;
use std::sync::OnceLock;

use hwlocality::cpu::binding::CpuBindingFlags;
use hwlocality::cpu::cpuset::CpuSet;
use hwlocality::object::attributes::ObjectAttributes;
use hwlocality::object::types::{OSDeviceType, ObjectType};
use hwlocality::object::TopologyObject;
use hwlocality::topology::builder::TypeFilter;
use hwlocality::Topology;

/// What can go wrong.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TopoError {
    /// hwloc could not build the topology.
    #[error("hwloc topology: {0}")]
    Load(String),
    /// A binding was refused.
    #[error("hwloc binding: {0}")]
    Binding(String),
    /// A binding was asked of a topology that is not this machine's.
    #[error("the topology is not this machine's (loaded from XML): nothing to bind")]
    NotThisSystem,
    /// A CPU list did not parse.
    #[error("CPU list {0:?}: expected indexes and ranges such as 0-3,8")]
    BadList(String),
}

/// This crate's results.
pub type Result<T> = std::result::Result<T, TopoError>;

/// A set of CPU or NUMA node indexes (the operating system's numbers),
/// sorted, each once. Printed and parsed as a list such as `0-3,8`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct IndexSet(Vec<u32>);

impl IndexSet {
    /// The set of `indexes` (any order, repeats allowed).
    pub fn new(indexes: impl IntoIterator<Item = u32>) -> IndexSet {
        let mut v: Vec<u32> = indexes.into_iter().collect();
        v.sort_unstable();
        v.dedup();
        IndexSet(v)
    }

    /// Its indexes, ascending.
    pub fn as_slice(&self) -> &[u32] {
        &self.0
    }

    /// How many.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it has none.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether `i` is in it.
    pub fn contains(&self, i: u32) -> bool {
        self.0.binary_search(&i).is_ok()
    }

    /// Whether every index of `other` is in it.
    pub fn includes(&self, other: &IndexSet) -> bool {
        other.0.iter().all(|&i| self.contains(i))
    }

    /// The indexes in both.
    pub fn intersection(&self, other: &IndexSet) -> IndexSet {
        IndexSet(
            self.0
                .iter()
                .copied()
                .filter(|&i| other.contains(i))
                .collect(),
        )
    }

    fn of_bitmap(set: impl IntoIterator<Item = hwlocality::bitmap::BitmapIndex>) -> Self {
        IndexSet::new(set.into_iter().map(|i| usize::from(i) as u32))
    }

    fn to_cpuset(&self) -> CpuSet {
        let mut s = CpuSet::new();
        for &i in &self.0 {
            s.set(i as usize);
        }
        s
    }
}

impl fmt::Display for IndexSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut first = true;
        let mut i = 0;
        while i < self.0.len() {
            let start = self.0[i];
            let mut end = start;
            while i + 1 < self.0.len() && self.0[i + 1] == end + 1 {
                i += 1;
                end += 1;
            }
            if !first {
                f.write_str(",")?;
            }
            first = false;
            if start == end {
                write!(f, "{start}")?;
            } else {
                write!(f, "{start}-{end}")?;
            }
            i += 1;
        }
        Ok(())
    }
}

/// Longest range a parsed list may hold (a typo such as `0-4000000000`
/// must not allocate gigabytes).
const RANGE_MAX: u32 = 1 << 20;

impl FromStr for IndexSet {
    type Err = TopoError;

    fn from_str(s: &str) -> Result<IndexSet> {
        let bad = || TopoError::BadList(s.to_string());
        let mut v = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (a, b) = match part.split_once('-') {
                Some((a, b)) => (a.trim(), b.trim()),
                None => (part, part),
            };
            let a: u32 = a.parse().map_err(|_| bad())?;
            let b: u32 = b.parse().map_err(|_| bad())?;
            if b < a || b - a >= RANGE_MAX {
                return Err(bad());
            }
            v.extend(a..=b);
        }
        if v.is_empty() {
            return Err(bad());
        }
        Ok(IndexSet::new(v))
    }
}

/// Where a device is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Locality {
    /// The operating-system device the topology knows it by: the RDMA
    /// device itself, or a network interface it runs on.
    pub found_as: String,
    /// The PCI device it hangs off (`domain:bus:dev.fn`), if any.
    pub pci: Option<String>,
    /// The CPUs nearest to it.
    pub cpus: IndexSet,
    /// The NUMA nodes nearest to it.
    pub numa: IndexSet,
    /// Whether those CPUs are the whole machine: the device is near no
    /// socket in particular (one socket, or a device off the PCI tree).
    pub whole_machine: bool,
}

impl Locality {
    /// The NUMA node of the device, when it is one.
    pub fn numa_node(&self) -> Option<u32> {
        match self.numa.as_slice() {
            [n] => Some(*n),
            _ => None,
        }
    }
}

impl fmt::Display for Locality {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "cpus {} numa {}", self.cpus, self.numa)?;
        if let Some(p) = &self.pci {
            write!(f, " pci {p}")?;
        }
        if self.whole_machine {
            f.write_str(" (whole machine)")?;
        }
        Ok(())
    }
}

/// How near a device is to the CPUs a process runs on; the best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Nearness {
    /// Every CPU of the process is near the device.
    Local,
    /// Some CPUs of the process are near it.
    Partial,
    /// None are: every access crosses a socket link.
    Remote,
    /// The topology does not know the device.
    Unknown,
}

/// A device that could be used, and the other names the topology may know
/// it by (its network interfaces).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Candidate {
    /// The RDMA device's name.
    pub name: String,
    /// Its network interfaces' names.
    pub aliases: Vec<String>,
}

/// One candidate, placed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Choice {
    /// The RDMA device's name.
    pub device: String,
    /// How near it is.
    pub nearness: Nearness,
    /// Where it is, when the topology knows.
    pub locality: Option<Locality>,
}

/// Where the BTL puts what it owns, near its device.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Placement {
    /// NUMA node for registered buffers (receive, bounce, results).
    pub numa_node: Option<u32>,
    /// CPUs for the progress thread (`None`: leave it where it is).
    pub cpus: Option<IndexSet>,
}

impl fmt::Display for Placement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.numa_node {
            Some(n) => write!(f, "buffers on NUMA node {n}")?,
            None => f.write_str("buffers anywhere")?,
        }
        match &self.cpus {
            Some(c) => write!(f, ", progress thread on cpus {c}"),
            None => f.write_str(", progress thread unbound"),
        }
    }
}

/// A machine's topology.
pub struct Topo {
    t: Topology,
}

impl fmt::Debug for Topo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Topo")
            .field("this_system", &self.t.is_this_system())
            .field("cpus", &self.cpus().to_string())
            .finish()
    }
}

impl Topo {
    /// This machine's topology, I/O devices included (`HWLOC_XMLFILE`, if
    /// set, replaces it).
    pub fn load() -> Result<Topo> {
        let t = Topology::builder()
            .with_io_type_filter(TypeFilter::KeepImportant)
            .map_err(|e| TopoError::Load(e.to_string()))?
            .build()
            .map_err(|e| TopoError::Load(e.to_string()))?;
        Ok(Topo { t })
    }

    /// This machine's topology, loaded once per process (`None` when hwloc
    /// cannot build it; the error is kept in [`Topo::load_error`]).
    pub fn this_system() -> Option<&'static Topo> {
        Self::cached().as_ref().ok()
    }

    /// Why [`Topo::this_system`] has nothing, if it has nothing.
    pub fn load_error() -> Option<String> {
        Self::cached().as_ref().err().cloned()
    }

    fn cached() -> &'static std::result::Result<Topo, String> {
        static TOPO: OnceLock<std::result::Result<Topo, String>> = OnceLock::new();
        TOPO.get_or_init(|| Topo::load().map_err(|e| e.to_string()))
    }

    /// A topology described by an hwloc XML file.
    pub fn from_xml_file(path: impl AsRef<Path>) -> Result<Topo> {
        let path = path.as_ref();
        let t = Topology::builder()
            .from_xml_file(path)
            .map_err(|e| TopoError::Load(format!("{}: {e}", path.display())))?
            .with_io_type_filter(TypeFilter::KeepImportant)
            .map_err(|e| TopoError::Load(e.to_string()))?
            .build()
            .map_err(|e| TopoError::Load(format!("{}: {e}", path.display())))?;
        Ok(Topo { t })
    }

    /// Whether this is the machine the process runs on (bindings apply).
    pub fn is_this_system(&self) -> bool {
        self.t.is_this_system()
    }

    /// Every CPU of the machine.
    pub fn cpus(&self) -> IndexSet {
        IndexSet::of_bitmap(self.t.cpuset().iter_set())
    }

    /// Where the first of `names` that the topology knows as an OpenFabrics
    /// or network device is: its nearest CPUs and NUMA nodes.
    pub fn locality(&self, names: &[&str]) -> Option<Locality> {
        let dev = names.iter().find_map(|n| {
            self.t.os_devices().find(|o| {
                o.name().is_some_and(|x| x.to_bytes() == n.as_bytes())
                    && matches!(
                        o.attributes(),
                        Some(ObjectAttributes::OSDevice(a))
                            if matches!(a.device_type(), OSDeviceType::OpenFabrics | OSDeviceType::Network)
                    )
            })
        })?;
        let near = dev.first_non_io_ancestor()?;
        let cpus = IndexSet::of_bitmap(near.cpuset()?.iter_set());
        let numa = near
            .nodeset()
            .map(|n| IndexSet::of_bitmap(n.iter_set()))
            .unwrap_or_default();
        let whole_machine = cpus == self.cpus();
        Some(Locality {
            found_as: dev.name()?.to_string_lossy().into_owned(),
            pci: pci_of(dev),
            cpus,
            numa,
            whole_machine,
        })
    }

    /// The CPUs this process may run on (its binding; this machine only).
    pub fn process_cpus(&self) -> Option<IndexSet> {
        if !self.is_this_system() {
            return None;
        }
        let set = self.t.cpu_binding(CpuBindingFlags::PROCESS).ok()?;
        Some(IndexSet::of_bitmap(set.iter_set()))
    }

    /// Where this process runs, for choosing a device: its binding, or the
    /// CPU the calling thread is on when the process may run anywhere.
    pub fn running_on(&self) -> Option<IndexSet> {
        let bound = self.process_cpus()?;
        if bound != self.cpus() {
            return Some(bound);
        }
        let here = self.t.last_cpu_location(CpuBindingFlags::THREAD).ok()?;
        Some(IndexSet::of_bitmap(here.iter_set()))
    }

    /// How near a device at `loc` is to CPUs `from`.
    pub fn nearness(loc: Option<&Locality>, from: &IndexSet) -> Nearness {
        let Some(loc) = loc else {
            return Nearness::Unknown;
        };
        let common = loc.cpus.intersection(from).len();
        if !from.is_empty() && common == from.len() {
            Nearness::Local
        } else if common > 0 {
            Nearness::Partial
        } else {
            Nearness::Remote
        }
    }

    /// `candidates` placed and ordered nearest to CPUs `from` first: by
    /// nearness, then by how many of `from` they are near, then by how
    /// few CPUs they are near (the narrower locality is the closer one),
    /// then in the order given.
    pub fn rank(&self, candidates: &[Candidate], from: &IndexSet) -> Vec<Choice> {
        let mut out: Vec<(usize, Choice)> = candidates
            .iter()
            .enumerate()
            .map(|(i, c)| {
                let mut names = vec![c.name.as_str()];
                names.extend(c.aliases.iter().map(String::as_str));
                let locality = self.locality(&names);
                let nearness = Self::nearness(locality.as_ref(), from);
                (
                    i,
                    Choice {
                        device: c.name.clone(),
                        nearness,
                        locality,
                    },
                )
            })
            .collect();
        let key = |(i, c): &(usize, Choice)| {
            let (common, width) = c.locality.as_ref().map_or((0, usize::MAX), |l| {
                (l.cpus.intersection(from).len(), l.cpus.len())
            });
            (c.nearness, usize::MAX - common, width, *i)
        };
        out.sort_by_key(key);
        out.into_iter().map(|(_, c)| c).collect()
    }

    /// Where to put buffers and the progress thread for a device at `loc`,
    /// for a process that may run on `allowed` (`None`: anywhere).
    ///
    /// Buffers go to the device's NUMA node when it has exactly one. The
    /// progress thread goes to the device's CPUs that the process may use,
    /// unless the device is near the whole machine or the process may use
    /// none of them (a binding made by the user is kept).
    pub fn placement(loc: &Locality, allowed: Option<&IndexSet>) -> Placement {
        let cpus = if loc.whole_machine {
            None
        } else {
            let c = match allowed {
                Some(a) => loc.cpus.intersection(a),
                None => loc.cpus.clone(),
            };
            (!c.is_empty()).then_some(c)
        };
        Placement {
            numa_node: loc.numa_node(),
            cpus,
        }
    }

    /// Binds the calling thread to `cpus`.
    pub fn bind_thread(&self, cpus: &IndexSet) -> Result<()> {
        if !self.is_this_system() {
            return Err(TopoError::NotThisSystem);
        }
        self.t
            .bind_cpu(&cpus.to_cpuset(), CpuBindingFlags::THREAD)
            .map_err(|e| TopoError::Binding(format!("cpus {cpus}: {e}")))
    }

    /// The CPUs the calling thread may run on.
    pub fn thread_cpus(&self) -> Result<IndexSet> {
        if !self.is_this_system() {
            return Err(TopoError::NotThisSystem);
        }
        let set = self
            .t
            .cpu_binding(CpuBindingFlags::THREAD)
            .map_err(|e| TopoError::Binding(e.to_string()))?;
        Ok(IndexSet::of_bitmap(set.iter_set()))
    }
}

/// The PCI address of the device `o` hangs off, if it does.
fn pci_of(o: &TopologyObject) -> Option<String> {
    let pci = std::iter::once(o)
        .chain(o.ancestors())
        .find(|a| a.object_type() == ObjectType::PCIDevice)?;
    match pci.attributes()? {
        ObjectAttributes::PCIDevice(p) => Some(format!(
            "{:04x}:{:02x}:{:02x}.{:x}",
            p.domain(),
            p.bus_id(),
            p.bus_device(),
            p.function()
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_sets_print_and_parse_as_lists() {
        let s = IndexSet::new([8, 0, 1, 2, 3, 3, 10, 11]);
        assert_eq!(s.to_string(), "0-3,8,10-11");
        assert_eq!("0-3, 8,10-11".parse::<IndexSet>().unwrap(), s);
        assert_eq!("5".parse::<IndexSet>().unwrap().as_slice(), &[5]);
        for bad in ["", "a", "3-1", "1-", "0-4000000000", "-1"] {
            assert!(bad.parse::<IndexSet>().is_err(), "{bad:?} parsed");
        }
        assert!(s.includes(&IndexSet::new([1, 8])));
        assert!(!s.includes(&IndexSet::new([1, 9])));
        assert_eq!(
            s.intersection(&IndexSet::new([2, 9, 10])).as_slice(),
            &[2, 10]
        );
    }

    #[test]
    fn placement_keeps_to_the_device_and_the_binding() {
        let loc = Locality {
            found_as: "mlx5_1".into(),
            pci: None,
            cpus: IndexSet::new([2, 3]),
            numa: IndexSet::new([1]),
            whole_machine: false,
        };
        let p = Topo::placement(&loc, None);
        assert_eq!(p.numa_node, Some(1));
        assert_eq!(p.cpus, Some(IndexSet::new([2, 3])));
        // Bound by the user to CPU 3: the thread goes there.
        let p = Topo::placement(&loc, Some(&IndexSet::new([3])));
        assert_eq!(p.cpus, Some(IndexSet::new([3])));
        // Bound elsewhere: the user's binding stands.
        let p = Topo::placement(&loc, Some(&IndexSet::new([0, 1])));
        assert_eq!(p.cpus, None);
        assert_eq!(p.numa_node, Some(1));
        // Near the whole machine: nothing to gain by binding.
        let whole = Locality {
            whole_machine: true,
            cpus: IndexSet::new(0..4),
            numa: IndexSet::new([0, 1]),
            ..loc
        };
        assert_eq!(Topo::placement(&whole, None), Placement::default());
    }
}
