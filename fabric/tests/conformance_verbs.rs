//! The conformance suite on real verbs. The device is named by
//! `XRCBTL_TEST_DEVICE` (scripts/softrdma-vm sets it to rxe0 or siw0 inside
//! its guest). Named but absent, the suite fails; unnamed, it runs nothing and
//! says so.
//!
//! Simulated processes become separate sets of verbs objects in this one OS
//! process on one node; what real verbs cannot show from user space (fault
//! injection, counting the kernel's objects, killing a process under its own
//! handles) is listed as skipped, as are the rules the device's caps rule out.

mod conformance;

use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use conformance::harness::{caps_gap, Deviation, Harness, Need, Proc};
use xrcbtl_fabric::verbs::VerbsFabric;
use xrcbtl_fabric::{DeviceCaps, Fabric, Transport, XrcdKey};

/// rdma_rxe's vendor id (a software device has no IEEE OUI).
const RXE_VENDOR_ID: u32 = 0x00ff_ffff;
/// siw's vendor id ("bmt" in ASCII).
const SIW_VENDOR_ID: u32 = 0x0062_6d74;

struct VerbsHarness {
    device: String,
    vendor_id: u32,
    caps: DeviceCaps,
    addr: IpAddr,
    start: Instant,
    keys: std::path::PathBuf,
}

static HARNESSES: AtomicU64 = AtomicU64::new(0);

impl VerbsHarness {
    fn new(device: &str, addr: IpAddr) -> Result<Self, String> {
        let fabric = VerbsFabric::new().map_err(|e| e.to_string())?;
        let devices = fabric.devices().map_err(|e| e.to_string())?;
        let Some(info) = devices.iter().find(|d| d.name == device) else {
            let names: Vec<_> = devices.iter().map(|d| d.name.as_str()).collect();
            return Err(format!(
                "XRCBTL_TEST_DEVICE={device} but this machine has {names:?}"
            ));
        };
        let n = HARNESSES.fetch_add(1, Ordering::Relaxed);
        let keys = std::env::temp_dir().join(format!("xrcbtl-conf-{}-{n}", std::process::id()));
        Ok(VerbsHarness {
            device: device.to_string(),
            vendor_id: info.vendor_id,
            caps: info.caps.clone(),
            addr,
            start: Instant::now(),
            keys,
        })
    }
}

impl Drop for VerbsHarness {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.keys);
    }
}

impl Harness for VerbsHarness {
    type F = VerbsFabric;

    fn label(&self) -> String {
        format!("verbs {} ({})", self.device, self.caps.transport)
    }

    fn device(&self) -> String {
        self.device.clone()
    }

    fn caps(&self) -> DeviceCaps {
        self.caps.clone()
    }

    fn nodes(&self) -> usize {
        1
    }

    fn spawn(&self, node: usize) -> Result<Proc<VerbsFabric>, String> {
        let fabric = VerbsFabric::new().map_err(|e| e.to_string())?;
        let ctx = fabric.open(&self.device).map_err(|e| e.to_string())?;
        Ok(Proc { node, fabric, ctx })
    }

    fn exit(&self, p: Proc<VerbsFabric>) {
        drop(p);
    }

    fn now(&self) -> Duration {
        self.start.elapsed()
    }

    fn settle(&self, d: Duration) {
        std::thread::sleep(d);
    }

    fn addr(&self, _p: &Proc<VerbsFabric>) -> IpAddr {
        self.addr
    }

    fn xrcd_key(&self, tag: &str) -> XrcdKey {
        let _ = std::fs::create_dir_all(&self.keys);
        XrcdKey::new(self.keys.join(tag))
    }

    fn deviation(&self, d: Deviation) -> Option<String> {
        match d {
            Deviation::LocalProtectionAsFlush if self.vendor_id == RXE_VENDOR_ID => Some(format!(
                "{} (rdma_rxe): the requester's error path breaks the QP and the completer \
                 flushes the failing request with the rest (WR_FLUSH_ERR, not LOC_PROT_ERR)",
                self.device
            )),
            Deviation::LocalProtectionAsQpOperation if self.vendor_id == SIW_VENDOR_ID => {
                Some(format!(
                    "{} (siw): a bad lkey completes as LOC_QP_OP_ERR, not LOC_PROT_ERR",
                    self.device
                ))
            }
            Deviation::LateWorkNotFlushed if self.vendor_id == SIW_VENDOR_ID => Some(format!(
                "{} (siw): work posted to a QP in the error state stays in the user-mapped \
                 queue and is never flushed",
                self.device
            )),
            Deviation::RemoteReadUnchecked if self.vendor_id == SIW_VENDOR_ID => Some(format!(
                "{} (siw): an RDMA read of a region registered without REMOTE_READ succeeds \
                 (the read response is sent without checking the permission)",
                self.device
            )),
            Deviation::LateWorkNotFlushed if self.vendor_id == RXE_VENDOR_ID => Some(format!(
                "{} (rdma_rxe): receives are posted into a user-mapped ring; one posted after \
                 the kernel flushed the QP stays there, never flushed",
                self.device
            )),
            Deviation::LocalErrorKeepsQp if self.vendor_id == SIW_VENDOR_ID => Some(format!(
                "{} (siw): after a bad lkey the QP stays in RTS",
                self.device
            )),
            _ => None,
        }
    }

    fn gap(&self, need: Need) -> Option<String> {
        if let Some(g) = caps_gap(&self.device, &self.caps, need) {
            return Some(g);
        }
        let real = "real verbs";
        match need {
            Need::LastWqeEvent if self.vendor_id == SIW_VENDOR_ID => Some(format!(
                "{} (siw): the driver never raises IB_EVENT_QP_LAST_WQE_REACHED",
                self.device
            )),
            Need::Faults => Some(format!(
                "{real}: no fault injection into the kernel or the wire"
            )),
            Need::Crash => Some(format!(
                "{real}: a process cannot be killed under its own handles from inside it"
            )),
            Need::Introspection => Some(format!(
                "{real}: the kernel's QP, TGT and MR tables are not visible from user space"
            )),
            Need::TwoNodes => Some(format!("{real}: this harness runs one node")),
            Need::P2pEnforced if self.caps.transport == Transport::Iwarp => Some(format!(
                "{}: no device attribute says whether the RNIC enforces MPA peer-to-peer \
                 ordering (siw: compile-time peer_to_peer=false); shown on the simulator",
                self.device
            )),
            _ => None,
        }
    }
}

fn main() -> ExitCode {
    let Ok(device) = std::env::var("XRCBTL_TEST_DEVICE") else {
        // No device promised: the suite shows as ignored (scripts/guest-tests
        // runs it on rxe and siw).
        let args = libtest_mimic::Arguments::from_args();
        let trial = libtest_mimic::Trial::test("verbs::suite", || {
            Err("XRCBTL_TEST_DEVICE names no device".into())
        })
        .with_ignored_flag(true);
        return libtest_mimic::run(&args, vec![trial]).exit_code();
    };
    let addr: IpAddr = std::env::var("XRCBTL_NODE_ADDRS")
        .ok()
        .and_then(|a| a.split_whitespace().next().and_then(|s| s.parse().ok()))
        .unwrap_or(IpAddr::from([10, 0, 2, 15]));
    let name = format!("verbs-{device}");
    let factory: conformance::Factory<VerbsHarness> =
        Arc::new(move || VerbsHarness::new(&device, addr));
    conformance::run_suite(vec![(name, factory)])
}
