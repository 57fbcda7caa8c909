//! The conformance suite on the simulated fabric, in three shapes: an
//! InfiniBand fabric with XRC, a RoCE fabric without XRC (like rdma_rxe), and
//! an iWARP fabric (like siw). Each rule runs on a fresh fabric from the
//! seed `XRCBTL_SEED` (default 1); a failure names the seed to replay.

mod conformance;

use std::net::IpAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use conformance::harness::{caps_gap, Harness, Need, Proc};
use xrcbtl_fabric::sim::{
    CmFault, NodeView, ProcessView, SimConfig, SimDevice, SimFabric, SimProcess,
};
use xrcbtl_fabric::{DeviceCaps, Fabric, XrcdKey};

struct SimHarness {
    name: &'static str,
    sim: SimFabric,
    device: SimDevice,
}

impl SimHarness {
    fn new(name: &'static str, device: SimDevice, seed: u64) -> Result<Self, String> {
        let cfg = SimConfig::new(seed, 2).with_devices(vec![device.clone()]);
        let sim = SimFabric::new(cfg).map_err(|e| e.to_string())?;
        Ok(SimHarness { name, sim, device })
    }
}

impl Harness for SimHarness {
    type F = SimProcess;

    fn label(&self) -> String {
        format!("{} seed={}", self.name, self.sim.config().seed)
    }

    fn device(&self) -> String {
        self.device.name.clone()
    }

    fn caps(&self) -> DeviceCaps {
        self.device.caps.clone()
    }

    fn nodes(&self) -> usize {
        2
    }

    fn spawn(&self, node: usize) -> Result<Proc<SimProcess>, String> {
        let fabric = self.sim.spawn(node).map_err(|e| e.to_string())?;
        let ctx = fabric.open(&self.device.name).map_err(|e| e.to_string())?;
        Ok(Proc { node, fabric, ctx })
    }

    fn exit(&self, p: Proc<SimProcess>) {
        p.fabric.exit();
    }

    fn now(&self) -> Duration {
        self.sim.now()
    }

    fn settle(&self, d: Duration) {
        self.sim.advance(d);
    }

    fn addr(&self, p: &Proc<SimProcess>) -> IpAddr {
        p.ctx.ip()
    }

    fn xrcd_key(&self, tag: &str) -> XrcdKey {
        XrcdKey::new(format!("sim-xrcd-{tag}"))
    }

    fn gap(&self, need: Need) -> Option<String> {
        caps_gap(&self.device.name, &self.device.caps, need)
    }

    fn crash(&self, p: &Proc<SimProcess>) -> Result<(), String> {
        self.sim.crash(&p.fabric);
        Ok(())
    }

    fn force_qp_error(&self, node: usize, qpn: u32) -> Result<(), String> {
        self.sim
            .force_qp_error(node, qpn)
            .map_err(|e| e.to_string())
    }

    fn partition(&self, a: usize, b: usize, cut: bool) -> Result<(), String> {
        if cut {
            self.sim.partition(a, b);
        } else {
            self.sim.heal(a, b);
        }
        Ok(())
    }

    fn cm_fault(&self, f: CmFault) -> Result<(), String> {
        self.sim.add_cm_fault(f);
        Ok(())
    }

    fn set_port(&self, node: usize, up: bool) -> Result<(), String> {
        self.sim.set_port(node, up);
        Ok(())
    }

    fn process_view(&self, p: &Proc<SimProcess>) -> Result<ProcessView, String> {
        Ok(self.sim.process_view(&p.fabric))
    }

    fn node_view(&self, node: usize) -> Result<NodeView, String> {
        Ok(self.sim.node_view(node))
    }

    fn check(&self) -> Result<(), String> {
        self.sim.check_invariants().map_err(|e| e.to_string())
    }

    fn rnr_naks(&self, node: usize, qpn: u32) -> Result<u64, String> {
        self.sim
            .qp_view(node, qpn)
            .map(|v| v.rnr_naks)
            .ok_or_else(|| format!("no QP {qpn:#x} on node {node}"))
    }
}

fn main() -> ExitCode {
    let seed: u64 = match std::env::var("XRCBTL_SEED") {
        Err(_) => 1,
        Ok(s) => match s.trim().parse() {
            Ok(v) => v,
            Err(_) => {
                eprintln!("XRCBTL_SEED={s:?} is not a seed (an unsigned 64-bit number)");
                return ExitCode::FAILURE;
            }
        },
    };
    let config = |name: &'static str,
                  dev: fn(&str) -> SimDevice|
     -> (String, conformance::Factory<SimHarness>) {
        (
            name.to_string(),
            Arc::new(move || SimHarness::new(name, dev("sim0"), seed)),
        )
    };
    conformance::run_suite(vec![
        config("sim-ib", SimDevice::ib),
        config("sim-roce", SimDevice::roce),
        config("sim-iwarp", SimDevice::iwarp),
    ])
}
