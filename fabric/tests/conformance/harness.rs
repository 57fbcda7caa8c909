//! What a provider offers the conformance suite: processes on nodes, a clock,
//! and (optionally) faults and introspection. Each provider's test binary
//! implements [`Harness`] and hands it to [`super::run_suite`].

use std::fmt;
use std::net::IpAddr;
use std::time::Duration;

use xrcbtl_fabric::sim::{CmFault, NodeView, ProcessView, TgtQpView};
use xrcbtl_fabric::{Context, DeviceCaps, Fabric, Transport, XrcdKey};

/// A process of the harness with its device opened.
pub struct Proc<F: Fabric> {
    /// Node it runs on.
    pub node: usize,
    /// The process's view of the fabric.
    pub fabric: F,
    /// The opened device.
    pub ctx: F::Context,
}

/// Something a rule needs that a provider may lack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// XRC (device caps).
    Xrc,
    /// A device without XRC (device caps).
    NoXrc,
    /// Shared receive queues (device caps).
    Srq,
    /// Immediate data (device caps).
    ImmData,
    /// 64-bit atomics (device caps).
    Atomics,
    /// A device without atomics (device caps).
    NoAtomics,
    /// InfiniBand transport semantics: RNR, QPs connected by hand.
    IbFamily,
    /// An iWARP device.
    Iwarp,
    /// The device enforces MPA peer-to-peer ordering (tears down a
    /// connection whose responder sends first).
    P2pEnforced,
    /// Two nodes that can be partitioned.
    TwoNodes,
    /// Injected faults: forced QP errors, partitions, CM message faults,
    /// port events.
    Faults,
    /// Killing a process without its own teardown.
    Crash,
    /// The last-WQE-reached event of a QP that drew from an SRQ.
    LastWqeEvent,
    /// Counting what processes and nodes hold.
    Introspection,
    /// A `max_mr_size` small enough to register a region of that size here
    /// (at most 4 GiB).
    BoundedMr,
}

/// Behaviour a provider is known to show differently from a rule. A rule
/// accepts the deviation only where the provider declares it, with a reason,
/// and the report lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Deviation {
    /// The request that hit a local protection error completes as a flush
    /// (the QP still goes to the error state).
    LocalProtectionAsFlush,
    /// The request that hit a local protection error completes as a local
    /// QP operation error (the QP still goes to the error state).
    LocalProtectionAsQpOperation,
    /// Work posted to a QP already in the error state never completes.
    LateWorkNotFlushed,
    /// An RDMA read of a region registered without remote read succeeds.
    RemoteReadUnchecked,
    /// A local protection error fails the request but leaves the QP
    /// usable.
    LocalErrorKeepsQp,
}

impl Deviation {
    /// Every deviation, for the report.
    pub const ALL: &'static [Deviation] = &[
        Deviation::LocalProtectionAsFlush,
        Deviation::LocalProtectionAsQpOperation,
        Deviation::LateWorkNotFlushed,
        Deviation::RemoteReadUnchecked,
        Deviation::LocalErrorKeepsQp,
    ];
}

/// The reason a provider cannot show something, when it is one of the
/// device's capabilities: read from the caps, never from a device name.
pub fn caps_gap(device: &str, caps: &DeviceCaps, need: Need) -> Option<String> {
    let t = caps.transport;
    match need {
        Need::Xrc if !caps.xrc => Some(format!("{device} ({t}): device caps report no XRC")),
        Need::NoXrc if caps.xrc => Some(format!("{device} ({t}): device caps report XRC")),
        Need::Srq if !caps.srq => Some(format!("{device} ({t}): device caps report no SRQ")),
        Need::ImmData if !caps.imm_data => Some(format!(
            "{device} ({t}): no immediate data on this transport"
        )),
        Need::Atomics if !caps.atomics => {
            Some(format!("{device} ({t}): device caps report no atomics"))
        }
        Need::NoAtomics if caps.atomics => {
            Some(format!("{device} ({t}): device caps report atomics"))
        }
        Need::IbFamily if t == Transport::Iwarp => Some(format!(
            "{device} ({t}): iWARP has no RNR and its QPs are connected only by the CM"
        )),
        Need::Iwarp if t != Transport::Iwarp => {
            Some(format!("{device} ({t}): not an iWARP device"))
        }
        Need::BoundedMr if caps.max_mr_size > 1 << 32 => Some(format!(
            "{device} ({t}): max_mr_size {} is more than this test maps",
            caps.max_mr_size
        )),
        _ => None,
    }
}

/// A provider under test.
pub trait Harness: Sized + Send + Sync + 'static {
    /// A process's view of the fabric.
    type F: Fabric;

    /// Name of the configuration, for test names and messages.
    fn label(&self) -> String;

    /// Device the processes open.
    fn device(&self) -> String;

    /// The device's capabilities.
    fn caps(&self) -> DeviceCaps;

    /// Nodes available.
    fn nodes(&self) -> usize;

    /// Starts a process on `node` and opens the device.
    fn spawn(&self, node: usize) -> Result<Proc<Self::F>, String>;

    /// Ends a process cleanly. Its handles must have been dropped by the
    /// caller (a real process's objects die with it; a simulated one's are
    /// reclaimed anyway).
    fn exit(&self, p: Proc<Self::F>);

    /// The provider's clock (virtual on the simulator).
    fn now(&self) -> Duration;

    /// Lets `d` pass while the fabric makes progress.
    fn settle(&self, d: Duration);

    /// The address RDMA CM peers use to reach `p`'s device.
    fn addr(&self, p: &Proc<Self::F>) -> IpAddr;

    /// A key for an XRC domain shared by this test's processes of a node
    /// (`tag` tells domains of one test apart).
    fn xrcd_key(&self, tag: &str) -> XrcdKey;

    /// Why this provider cannot show `need`, or `None` if it can.
    fn gap(&self, need: Need) -> Option<String>;

    /// Why this provider deviates from a rule in the way `d` describes, or
    /// `None` if it does not.
    fn deviation(&self, _d: Deviation) -> Option<String> {
        None
    }

    /// Kills `p` without its own teardown; its handles stay with the caller
    /// but are dead.
    fn crash(&self, _p: &Proc<Self::F>) -> Result<(), String> {
        Err(self.gap(Need::Crash).unwrap_or_default())
    }

    /// Forces QP `qpn` on `node` into the error state.
    fn force_qp_error(&self, _node: usize, _qpn: u32) -> Result<(), String> {
        Err(self.gap(Need::Faults).unwrap_or_default())
    }

    /// Cuts (or restores) the path between two nodes.
    fn partition(&self, _a: usize, _b: usize, _cut: bool) -> Result<(), String> {
        Err(self.gap(Need::Faults).unwrap_or_default())
    }

    /// Adds a CM fault rule.
    fn cm_fault(&self, _f: CmFault) -> Result<(), String> {
        Err(self.gap(Need::Faults).unwrap_or_default())
    }

    /// Takes `node`'s ports down or up.
    fn set_port(&self, _node: usize, _up: bool) -> Result<(), String> {
        Err(self.gap(Need::Faults).unwrap_or_default())
    }

    /// What `p` holds.
    fn process_view(&self, _p: &Proc<Self::F>) -> Result<ProcessView, String> {
        Err(self.gap(Need::Introspection).unwrap_or_default())
    }

    /// What lives on `node`.
    fn node_view(&self, _node: usize) -> Result<NodeView, String> {
        Err(self.gap(Need::Introspection).unwrap_or_default())
    }

    /// The XRC TGT QPs living on `node`.
    fn tgt_qps(&self, node: usize) -> Result<Vec<TgtQpView>, String> {
        Ok(self.node_view(node)?.tgt_qps)
    }

    /// Live QPs on `node`.
    fn node_qps(&self, node: usize) -> Result<usize, String> {
        Ok(self.node_view(node)?.qps)
    }

    /// Checks the provider's internal invariants after a rule (nothing
    /// leaked, every table consistent); providers that cannot look inside
    /// answer `Ok`.
    fn check(&self) -> Result<(), String> {
        Ok(())
    }

    /// RNR NAKs QP `qpn` on `node` has received.
    fn rnr_naks(&self, _node: usize, _qpn: u32) -> Result<u64, String> {
        Err(self.gap(Need::Introspection).unwrap_or_default())
    }
}

/// A failed check, with where it failed.
pub struct Failure(pub String);

impl fmt::Debug for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<xrcbtl_fabric::Error> for Failure {
    fn from(e: xrcbtl_fabric::Error) -> Self {
        Failure(format!("{e:?}"))
    }
}

/// Result of a rule.
pub type Outcome = Result<(), Failure>;

/// Fails the rule with a message (like `assert!`, but returning).
#[macro_export]
macro_rules! ensure {
    ($cond:expr, $($msg:tt)+) => {
        if !$cond {
            return Err($crate::conformance::harness::Failure(format!(
                "{}:{}: {}", file!(), line!(), format!($($msg)+)
            )));
        }
    };
}

/// Fails the rule unless two values are equal.
#[macro_export]
macro_rules! ensure_eq {
    ($a:expr, $b:expr $(,)?) => {
        $crate::ensure_eq!($a, $b, "")
    };
    ($a:expr, $b:expr, $why:expr $(,)?) => {{
        let (a, b) = (&$a, &$b);
        if a != b {
            return Err($crate::conformance::harness::Failure(format!(
                "{}:{}: {} = {:?}, expected {} = {:?} {}",
                file!(),
                line!(),
                stringify!($a),
                a,
                stringify!($b),
                b,
                $why
            )));
        }
    }};
}

/// Shorthand used by rules: the context type of a harness.
pub type Ctx<H> = <<H as Harness>::F as Fabric>::Context;

/// Caps of a context (for rules that only hold a context).
pub fn caps_of<C: Context>(c: &C) -> DeviceCaps {
    c.caps().clone()
}
