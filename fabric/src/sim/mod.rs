//! `SimFabric`: an in-process fabric of many nodes, each with many
//! processes, deterministic from a seed and running in virtual time.
//!
//! It keeps the semantics the BTL depends on: rkeys and lkeys are checked
//! (unknown key, wrong PD, access not granted, range outside the region),
//! RNR NAKs are retried `rnr_retry` times, vanished peers give
//! `RetryExceeded`, a QP in error flushes in order, XRC INI QPs reach any
//! SRQ of the target's domain by number, XRC TGT QPs live exactly as long as
//! some process has them open and their events reach every opener, iWARP
//! has no XRC and tears down a connection whose responder speaks first, and
//! the RDMA CM carries private data with the real size limits. Faults
//! (crashes, CM drops/delays/duplicates, forced QP errors, partitions, port
//! events) are injected deterministically; introspection shows what every
//! process and node holds.
//!
//! Virtual time advances when the simulation is asked to progress: an empty
//! poll of a CQ, an event channel or the async event queue runs the next
//! scheduled event (jumping the clock to it), or lets an idle tick pass.
//! Single-threaded tests are therefore exactly reproducible from the seed.
//!
//! This module touches application memory only through `memory.rs`, and only
//! after the key checks.

mod alloc;
mod arena;
mod cm;
mod faults;
mod handles;
mod memory;
mod rng;
mod transport;
mod world;

use std::sync::Arc;
use std::time::Duration;

pub use alloc::CountingAlloc;
pub use faults::{CmAction, CmFault, CmMsgKind};
pub use handles::{
    device_time, inside, time_device, SimCmChannel, SimCmId, SimContext, SimCq, SimMr, SimPd,
    SimProcess, SimQp, SimRecvs, SimSrq, SimXrcd,
};

use crate::types::*;
use crate::{Error, Result};
use handles::{ProcInner, Shared};
use world::World;

/// A device every node of the simulated fabric has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimDevice {
    /// Name, the same on every node.
    pub name: String,
    /// What the device can do.
    pub caps: DeviceCaps,
    /// Whether a connected QP's send queue can grow. `IBV_QP_CAP` is legal
    /// in no transition of the kernel's `qp_state_table` for RC or XRC QPs,
    /// so mlx5 and rxe refuse; off in every device here.
    pub resizable_send_queue: bool,
    /// Whether an application moving an XRC TGT QP to the error state by
    /// hand raises an event (last WQE reached) at the QP's other openers.
    /// Verbs promise none (`IBV_EVENT_QP_FATAL` is for errors the device
    /// found, and whether mlx5 raises last-WQE for it is undocumented), so
    /// off in every device here: holders must find out by asking.
    pub tgt_error_events: bool,
    /// Whether the context says its connection and async events cost
    /// system calls ([`crate::Context::events_cost_syscalls`]), as a real
    /// device's do: a BTL then looks at them only every so many progress
    /// calls, and spins on its CQs alone in between. Off in every device
    /// here (the simulator's events cost nothing); on for the tests of
    /// that path.
    pub costly_events: bool,
}

impl SimDevice {
    /// An InfiniBand HCA with XRC, shaped like a ConnectX.
    pub fn ib(name: &str) -> Self {
        SimDevice {
            name: name.into(),
            resizable_send_queue: false,
            tgt_error_events: false,
            costly_events: false,
            caps: DeviceCaps {
                transport: Transport::Infiniband,
                xrc: true,
                srq: true,
                imm_data: true,
                max_qp: 1 << 18,
                max_qp_wr: 32_768,
                max_srq: 1 << 16,
                max_srq_wr: 32_767,
                max_sge: 30,
                max_sge_rd: 30,
                max_cqe: (1 << 22) - 1,
                max_inline: 220,
                // mlx5 spends 16 bytes of the WQE on the XRC segment.
                max_inline_xrc: 204,
                max_mr_size: u64::MAX,
                max_qp_rd_atom: 16,
                atomics: true,
                host_emulated: false,
            },
        }
    }

    /// A RoCE device without XRC, shaped like rdma_rxe.
    pub fn roce(name: &str) -> Self {
        let mut d = SimDevice::ib(name);
        d.caps.transport = Transport::Roce;
        d.caps.xrc = false;
        d.caps.max_inline_xrc = 0;
        d.caps.max_sge = 32;
        d.caps.max_sge_rd = 32;
        d.caps.max_cqe = 32_767;
        d.caps.max_inline = 256;
        d.caps.max_qp_rd_atom = 128;
        d.caps.max_mr_size = crate::RXE_MR_SIZE_MAX;
        d
    }

    /// An iWARP device, shaped like siw: no XRC, no immediate data, no
    /// atomics, few SGEs, a single SGE for reads.
    pub fn iwarp(name: &str) -> Self {
        SimDevice {
            name: name.into(),
            resizable_send_queue: false,
            tgt_error_events: false,
            costly_events: false,
            caps: DeviceCaps {
                transport: Transport::Iwarp,
                xrc: false,
                srq: true,
                imm_data: false,
                max_qp: 1 << 14,
                max_qp_wr: 4_096,
                max_srq: 1 << 12,
                max_srq_wr: 4_096,
                max_sge: 6,
                max_sge_rd: 1,
                max_cqe: 32_767,
                max_inline: 96,
                max_inline_xrc: 0,
                max_mr_size: u64::MAX,
                max_qp_rd_atom: 32,
                // RDMAP (RFC 5040) has no atomics; siw offers none.
                atomics: false,
                host_emulated: false,
            },
        }
    }
}

/// Timing model of the simulated fabric, in virtual nanoseconds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimTiming {
    /// One-way latency between nodes.
    pub wire_latency_ns: u64,
    /// One-way latency through the device back to the same node.
    pub loopback_latency_ns: u64,
    /// Link bandwidth.
    pub bandwidth_bytes_per_us: u64,
    /// One-way latency of a CM message.
    pub cm_latency_ns: u64,
    /// Time a node's CM agent spends on each incoming message; messages
    /// queue behind each other, so connection storms take time.
    pub cm_processing_ns: u64,
    /// From the CM agent taking a connect request to the listening process
    /// seeing it (the kernel's upcall, and the process noticing); the CM
    /// holds the request meanwhile.
    pub cm_upcall_ns: u64,
    /// How long a CM request, reply or disconnect waits for its answer.
    pub cm_timeout_ns: u64,
    /// How often the CM resends before giving up.
    pub cm_max_retries: u32,
    /// The local ACK timeout (IB encoding) the CM derives from the path and
    /// hands a requester QP unless the application sets its own: 18 (1.07
    /// s per try), what the RDMA CM gives on RoCE
    /// (`CMA_IBOE_PACKET_LIFETIME` 16, plus the ACK delay) and typical of
    /// IB path records.
    pub cm_ack_timeout: u8,
    /// Address resolution of a node not yet in the cache.
    pub arp_ns: u64,
    /// Route resolution on InfiniBand (a path record query).
    pub route_ib_ns: u64,
    /// Route resolution on Ethernet (RoCE, iWARP: a local lookup).
    pub route_eth_ns: u64,
    /// Time that passes when progress finds nothing scheduled.
    pub idle_tick_ns: u64,
}

impl Default for SimTiming {
    fn default() -> Self {
        SimTiming {
            wire_latency_ns: 1_000,
            loopback_latency_ns: 300,
            bandwidth_bytes_per_us: 12_500,
            cm_latency_ns: 10_000,
            cm_processing_ns: 3_000,
            cm_upcall_ns: 20_000,
            // The RDMA CM waits about 4.3 s (timeout 20); 100 ms keeps
            // storms from collapsing under the agents' queues while fault
            // tests stay short.
            cm_timeout_ns: 100_000_000,
            cm_max_retries: 4,
            cm_ack_timeout: 18,
            arp_ns: 100_000,
            route_ib_ns: 50_000,
            route_eth_ns: 1_000,
            idle_tick_ns: 1_000,
        }
    }
}

/// Shape of a simulated fabric.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    /// Seed of every random choice.
    pub seed: u64,
    /// Number of nodes.
    pub nodes: usize,
    /// Devices each node has.
    pub devices: Vec<SimDevice>,
    /// Timing model.
    pub timing: SimTiming,
    /// Ports that TCP sockets outside the RDMA CM hold, by (node, port):
    /// an MPI launcher's connections, say. An iWARP listener is a kernel
    /// TCP socket, and the RDMA CM picks its ephemeral port without
    /// seeing TCP's, so a listen there on an iWARP device fails with
    /// [`crate::Error::AddrInUse`] (as siw's does, in `rdma_listen`).
    pub tcp_ports_held: Vec<(usize, u16)>,
}

impl SimConfig {
    /// `nodes` nodes with one InfiniBand device `sim0` each.
    pub fn new(seed: u64, nodes: usize) -> Self {
        SimConfig {
            seed,
            nodes,
            devices: vec![SimDevice::ib("sim0")],
            timing: SimTiming::default(),
            tcp_ports_held: Vec::new(),
        }
    }

    /// Holds `port` on `node` for a TCP socket outside the RDMA CM
    /// ([`SimConfig::tcp_ports_held`]).
    pub fn with_tcp_port_held(mut self, node: usize, port: u16) -> Self {
        self.tcp_ports_held.push((node, port));
        self
    }

    /// Replaces the per-node devices.
    pub fn with_devices(mut self, devices: Vec<SimDevice>) -> Self {
        self.devices = devices;
        self
    }
}

/// The verbs one process called, counted per call as a real provider
/// would see them ([`SimProcess::verbs`]): a test reads what a message
/// costs in posts and polls.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct VerbCounts {
    /// Calls that post send work (`ibv_post_send`).
    pub post_send: u64,
    /// Of which signalled (they ask for a completion on success).
    pub signalled: u64,
    /// Calls that post receives (`ibv_post_srq_recv`, `ibv_post_recv`): a
    /// chain of up to 16 receives, as the verbs provider links them, is
    /// one call.
    pub post_recv: u64,
    /// Receives those calls posted.
    pub recvs_posted: u64,
}

/// How one completion queue was polled ([`SimCq::polls`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CqPolls {
    /// Calls (`ibv_poll_cq`).
    pub calls: u64,
    /// Of which found at least one completion.
    pub hits: u64,
    /// Completions taken.
    pub completions: u64,
}

/// Counters of what happened in the simulation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SimStats {
    /// Events run.
    pub events: u64,
    /// Packets transmitted (including retransmissions).
    pub packets: u64,
    /// Packets lost (no such QP, wrong state, partition, out of sequence).
    pub packets_dropped: u64,
    /// ACK timeouts that led to a retransmission.
    pub retransmits: u64,
    /// RNR NAKs sent by responders.
    pub rnr_naks: u64,
    /// Retransmitted packets a responder had already executed (acknowledged
    /// again, not delivered twice).
    pub duplicates: u64,
    /// Two-sided messages delivered into receive buffers.
    pub messages_delivered: u64,
    /// Responder-side errors (bad rkey, unknown SRQ, too long...).
    pub responder_errors: u64,
    /// CQ overruns.
    pub cq_overruns: u64,
    /// Asynchronous events queued to processes.
    pub async_events: u64,
    /// QPs created (TGT QPs included).
    pub qps_created: u64,
    /// QPs destroyed.
    pub qps_destroyed: u64,
    /// XRC TGT QPs created.
    pub tgt_created: u64,
    /// XRC TGT QP opens (registrations by other processes).
    pub tgt_opened: u64,
    /// XRC TGT QPs destroyed (their last handle closed).
    pub tgt_destroyed: u64,
    /// CM messages sent.
    pub cm_messages: u64,
    /// CM messages lost.
    pub cm_dropped: u64,
    /// CM messages delayed by a fault rule.
    pub cm_delayed: u64,
    /// CM messages duplicated by a fault rule.
    pub cm_duplicated: u64,
    /// CM messages resent after a timeout.
    pub cm_retries: u64,
    /// Of which connect requests (the others: replies waiting for their
    /// RTU).
    pub cm_req_retries: u64,
    /// QPs handed to the CM already in INIT, moved there by the application
    /// with a port and P_Key of its own choosing instead of the route's.
    pub cm_qps_init_by_hand: u64,
    /// Requests the IB CM rejected as stale connections (the same announced
    /// QP number from the same HCA while it held another).
    pub cm_stale_rejects: u64,
    /// Accepted connections established by the application's notice that
    /// the QP heard the peer (`rdma_notify`), before any RTU arrived.
    pub cm_established_by_notice: u64,
    /// RC QPs drawing from an SRQ destroyed after they had received but
    /// before they reported their last receive (LAST_WQE_REACHED): a
    /// receive they were taking may be lost.
    pub srq_qps_destroyed_early: u64,
    /// CM events queued.
    pub cm_events: u64,
    /// Address resolutions that missed the cache.
    pub addr_resolutions: u64,
    /// Route resolutions (path queries on InfiniBand).
    pub route_resolutions: u64,
    /// Resolutions served from a route cached by the application.
    pub cached_routes: u64,
    /// iWARP connections torn down because the responder spoke first.
    pub iwarp_violations: u64,
    /// Times the memory monitor's queue overflowed, so that regions whose
    /// memory changed may have stayed attached.
    pub unmap_reports_lost: u64,
    /// Gathers and scatters of local work through a region whose memory
    /// was unmapped, remapped or emptied since it was registered (a real
    /// device would move the old, pinned pages).
    pub detached_local: u64,
    /// Remote reads and writes through such a region (a peer holding an
    /// old handle).
    pub detached_remote: u64,
}

/// Resolution queries one node sent towards another: the traffic behind IP
/// addressing that grows with the job (seed 003).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PairQueries {
    /// Address resolutions that went to the wire (ARP on Ethernet, the
    /// IPoIB neighbour query on InfiniBand).
    pub arp: u64,
    /// Route resolutions that went to the wire (SA path-record queries on
    /// InfiniBand; on Ethernet the kernel answers them locally, but they
    /// are counted the same way).
    pub path: u64,
}

/// What a process holds, for tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcessView {
    /// Process id.
    pub pid: u32,
    /// Node it runs on.
    pub node: usize,
    /// Whether it is running.
    pub alive: bool,
    /// RC and XRC INI QPs.
    pub qps: usize,
    /// Handles on XRC TGT QPs (created or opened).
    pub tgt_handles: usize,
    /// Memory regions.
    pub mrs: usize,
    /// Of which peers may read (`REMOTE_READ`).
    pub mrs_remote_read: usize,
    /// Of which peers may write (`REMOTE_WRITE`).
    pub mrs_remote_write: usize,
    /// SRQs (plain and XRC).
    pub srqs: usize,
    /// CQs.
    pub cqs: usize,
    /// Protection domains.
    pub pds: usize,
    /// XRC domain handles.
    pub xrcds: usize,
    /// RDMA CM ids.
    pub cm_ids: usize,
    /// CM messages its ids sent (resends included).
    pub cm_sent: u64,
    /// CM messages that reached its ids and listeners.
    pub cm_received: u64,
}

/// An XRC TGT QP and who holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TgtQpView {
    /// QP number.
    pub qpn: u32,
    /// Open handles (creator included).
    pub open_count: usize,
    /// Pids of the holders, one entry per handle.
    pub openers: Vec<u32>,
    /// State.
    pub state: QpState,
}

/// What lives on a node, for tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeView {
    /// Node index.
    pub node: usize,
    /// Live QPs of every kind (a shared TGT QP counts once).
    pub qps: usize,
    /// XRC TGT QPs.
    pub tgt_qps: Vec<TgtQpView>,
    /// Numbers of the RC and XRC INI QPs ready to send (RTS), ascending.
    pub senders: Vec<u32>,
    /// Memory regions.
    pub mrs: usize,
    /// SRQs.
    pub srqs: usize,
    /// XRC domains.
    pub xrcds: usize,
}

/// A QP's transport counters, for tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QpView {
    /// State.
    pub state: QpState,
    /// RNR NAKs received for its requests.
    pub rnr_naks: u64,
    /// ACK timeouts.
    pub timeouts: u64,
    /// Open handles.
    pub handles: usize,
}

/// Rewrites an arriving send's bytes ([`SimFabric::tamper`]): called with
/// the sending node, the receiving node and the message.
pub type Tamper = Box<dyn FnMut(usize, usize, &mut Vec<u8>) + Send>;

/// The simulated fabric. Cloning gives another handle on the same world.
#[derive(Clone)]
pub struct SimFabric {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for SimFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let w = self.shared.lock();
        write!(
            f,
            "SimFabric(seed {}, {} nodes, t={}ns)",
            w.cfg.seed, w.cfg.nodes, w.now
        )
    }
}

impl SimFabric {
    /// Builds a fabric.
    pub fn new(cfg: SimConfig) -> Result<Self> {
        if cfg.nodes == 0 || cfg.nodes > 65_536 {
            return Err(Error::invalid("a fabric has 1..=65536 nodes"));
        }
        if cfg.devices.is_empty() || cfg.devices.len() > 254 {
            return Err(Error::invalid("a node has 1..=254 devices"));
        }
        for d in &cfg.devices {
            if d.caps.transport == Transport::Iwarp && d.caps.xrc {
                return Err(Error::invalid(format!("{}: iWARP has no XRC", d.name)));
            }
        }
        Ok(SimFabric {
            shared: Arc::new(Shared::new(World::new(cfg))),
        })
    }

    /// The configuration it was built with.
    pub fn config(&self) -> SimConfig {
        self.shared.lock().cfg.clone()
    }

    /// The IP address and GID of device `dev` (its index in the
    /// configuration) of node `node`: where its listeners are reached, so
    /// that a harness can tell ranks the address of a process it has not
    /// started yet.
    pub fn device_addr(&self, node: usize, dev: usize) -> Option<(std::net::Ipv4Addr, Gid)> {
        let w = self.shared.lock();
        let per_node = w.cfg.devices.len();
        if dev >= per_node {
            return None;
        }
        let d = w.devs.get(node.checked_mul(per_node)? + dev)?;
        Some((d.ip, d.gid))
    }

    /// Starts a process on `node`.
    pub fn spawn(&self, node: usize) -> Result<SimProcess> {
        let mut w = self.shared.lock();
        let id = w.spawn(node)?;
        let pid = w.procs.get(id).expect("spawned").pid;
        drop(w);
        Ok(SimProcess(Arc::new(ProcInner {
            shared: self.shared.clone(),
            id,
            node,
            pid,
        })))
    }

    /// Chooses the clock. Automatic (the default): an empty poll runs the
    /// next scheduled event, moving time to it, which suits one agent
    /// busy-polling. Manual: polls run only what is due now, and time moves
    /// only through [`SimFabric::step`], [`SimFabric::advance`] or a blocking
    /// [`crate::Cq::sleep`]; a harness driving many processes steps the clock
    /// when a whole round of them found nothing to do, so that no process's
    /// polling runs out another's timers before it could react.
    pub fn set_auto_advance(&self, auto: bool) {
        self.shared.lock().auto_advance = auto;
    }

    /// Makes the automatic clock causal, for processes progressed by
    /// threads of their own: an empty poll moves time on only while no
    /// process has completions, CM events or async events queued that it
    /// has not polled yet, and none is still reacting to what it took (a
    /// process reacts from a poll that found something until it polls an
    /// empty queue or waits), so that a thread that is slow to run (or
    /// descheduled) sees and answers everything at the virtual instant it
    /// happened instead of after its peers' timers ran out. Every process
    /// must keep polling its queues.
    pub fn set_causal(&self, causal: bool) {
        self.shared.lock().causal = causal;
    }

    /// Virtual time since the fabric was built.
    pub fn now(&self) -> Duration {
        Duration::from_nanos(self.shared.lock().now)
    }

    /// Runs the next due events (or moves the clock to them); see the module
    /// documentation. Returns whether any event ran.
    pub fn step(&self) -> bool {
        self.shared.lock().progress()
    }

    /// The pids of the processes something was queued for (a completion, an
    /// async event, a CM event) since the last call: what a harness driving
    /// many processes must progress next.
    pub fn take_touched(&self) -> Vec<u32> {
        std::mem::take(&mut self.shared.lock().touched)
            .into_iter()
            .collect()
    }

    /// Whether the causal clock ([`SimFabric::set_causal`]) holds time
    /// back now: some process has completions or events it has not polled
    /// yet, or is still reacting to what it took. Always `false` without
    /// the causal clock. An executor that moves time itself when its ranks
    /// are idle waits while this holds.
    pub fn held_back(&self) -> bool {
        self.shared.lock().held_back()
    }

    /// When the next scheduled event is due, if any.
    pub fn next_event_at(&self) -> Option<Duration> {
        self.shared.lock().next_event_at().map(Duration::from_nanos)
    }

    /// Runs everything scheduled in the next `d` of virtual time.
    pub fn advance(&self, d: Duration) {
        let mut w = self.shared.lock();
        let deadline = w.now + d.as_nanos() as u64;
        w.run_until(deadline);
    }

    /// Runs events until nothing is scheduled or `max_events` ran. Returns
    /// whether the fabric went idle.
    pub fn run_until_idle(&self, max_events: u64) -> bool {
        let mut w = self.shared.lock();
        let start = w.stats.events;
        while w.has_events() {
            if w.stats.events - start >= max_events {
                return false;
            }
            w.progress();
        }
        true
    }

    /// Kills a process abruptly: the kernel reclaims everything it held (its
    /// QPs vanish, its TGT QP handles close, its CM ids are destroyed),
    /// without any of its own teardown running.
    pub fn crash(&self, p: &SimProcess) {
        self.shared.lock().exit_process(p.0.id);
    }

    /// Adds a CM fault rule.
    pub fn add_cm_fault(&self, f: CmFault) {
        self.shared.lock().faults.add_cm(f);
    }

    /// Removes every CM fault rule.
    pub fn clear_cm_faults(&self) {
        self.shared.lock().faults.clear_cm();
    }

    /// Cuts all traffic (data and CM) between two nodes.
    pub fn partition(&self, a: usize, b: usize) {
        self.shared.lock().faults.partition(a, b);
    }

    /// Restores traffic between two nodes.
    pub fn heal(&self, a: usize, b: usize) {
        self.shared.lock().faults.heal(a, b);
    }

    /// Rewrites messages on the wire, as a peer that lies about what it
    /// sends would: `f` sees the sending and the receiving node of every
    /// send (not RDMA) as it arrives, and may change its bytes and length.
    /// `None` stops rewriting.
    pub fn tamper(&self, f: Option<Tamper>) {
        self.shared.lock().tamper = f;
    }

    /// Forces the QP `qpn` on `node` into the error state with a fatal
    /// event to every process holding it (every opener, for a TGT QP).
    pub fn force_qp_error(&self, node: usize, qpn: u32) -> Result<()> {
        let mut w = self.shared.lock();
        let qp = w
            .devs
            .iter()
            .filter(|d| d.node == node)
            .find_map(|d| d.qps.get(&qpn).copied())
            .ok_or_else(|| Error::not_found(format!("QP {qpn:#x} on node {node}")))?;
        w.qp_to_error(qp, Some(world::QpErrorEvent::Fatal));
        Ok(())
    }

    /// Takes the ports of `node`'s devices down (or up): every context on
    /// them hears a port event, and no traffic passes while down.
    pub fn set_port(&self, node: usize, up: bool) {
        let mut w = self.shared.lock();
        let devs: Vec<usize> = (0..w.devs.len())
            .filter(|d| w.devs[*d].node == node)
            .collect();
        for d in devs {
            if w.devs[d].port_up == up {
                continue;
            }
            w.devs[d].port_up = up;
            let ctxs = w.ctxs.ids_where(|c| c.dev == d);
            let ev = if up {
                AsyncEvent::PortActive { port: 1 }
            } else {
                AsyncEvent::PortError { port: 1 }
            };
            for c in ctxs {
                w.push_async(c, ev);
            }
        }
    }

    /// Checks the world's invariants (see the module documentation of the
    /// simulator): nothing outlives its process, every index is consistent,
    /// every XRC domain and TGT QP is referenced exactly by its holders.
    pub fn check_invariants(&self) -> Result<()> {
        self.shared
            .lock()
            .check_invariants()
            .map_err(Error::InvalidState)
    }

    /// Counters so far.
    pub fn stats(&self) -> SimStats {
        self.shared.lock().stats.clone()
    }

    /// A hash of every event run so far: two runs from the same seed doing
    /// the same things have the same hash.
    pub fn trace_hash(&self) -> u64 {
        self.shared.lock().trace
    }

    /// What a process holds.
    pub fn process_view(&self, p: &SimProcess) -> ProcessView {
        let w = self.shared.lock();
        let proc = w.procs.get(p.0.id);
        let ctxs: Vec<_> = w.ctxs.ids_where(|c| c.proc == p.0.id);
        let mine = |c: &world::Id<world::Ctx>| ctxs.contains(c);
        let (mut qps, mut tgt) = (0, 0);
        for (_, h) in w.qp_handles.iter().filter(|(_, h)| mine(&h.ctx)) {
            match w.qps.get(h.qp).map(|q| q.ty) {
                Some(QpType::XrcTgt) => tgt += 1,
                Some(_) => qps += 1,
                None => {}
            }
        }
        ProcessView {
            pid: p.0.pid,
            node: p.0.node,
            alive: proc.is_some_and(|p| p.alive),
            qps,
            tgt_handles: tgt,
            mrs: w.mrs.iter().filter(|(_, m)| mine(&m.ctx)).count(),
            mrs_remote_read: w
                .mrs
                .iter()
                .filter(|(_, m)| mine(&m.ctx) && m.access.contains(Access::REMOTE_READ))
                .count(),
            mrs_remote_write: w
                .mrs
                .iter()
                .filter(|(_, m)| mine(&m.ctx) && m.access.contains(Access::REMOTE_WRITE))
                .count(),
            srqs: w.srqs.iter().filter(|(_, s)| mine(&s.ctx)).count(),
            cqs: w.cqs.iter().filter(|(_, c)| mine(&c.ctx)).count(),
            pds: w.pds.iter().filter(|(_, x)| mine(&x.ctx)).count(),
            xrcds: w.xrcd_handles.iter().filter(|(_, x)| mine(&x.ctx)).count(),
            cm_ids: w.cm_ids.iter().filter(|(_, c)| mine(&c.ctx)).count(),
            cm_sent: proc.map_or(0, |p| p.cm_sent),
            cm_received: proc.map_or(0, |p| p.cm_received),
        }
    }

    /// What lives on a node.
    pub fn node_view(&self, node: usize) -> NodeView {
        let w = self.shared.lock();
        let on_node = |dev: usize| w.devs[dev].node == node;
        let ctx_on_node = |c: world::Id<world::Ctx>| w.ctxs.get(c).is_some_and(|c| on_node(c.dev));
        let mut tgt_qps: Vec<TgtQpView> = w
            .qps
            .iter()
            .filter(|(_, q)| on_node(q.dev) && q.ty == QpType::XrcTgt)
            .map(|(_, q)| TgtQpView {
                qpn: q.qpn,
                open_count: q.handles.len(),
                openers: q
                    .handles
                    .iter()
                    .filter_map(|h| w.qp_handles.get(*h))
                    .filter_map(|h| w.ctxs.get(h.ctx))
                    .filter_map(|c| w.procs.get(c.proc))
                    .map(|p| p.pid)
                    .collect(),
                state: q.state,
            })
            .collect();
        tgt_qps.sort_by_key(|t| t.qpn);
        let mut senders: Vec<u32> = w
            .qps
            .iter()
            .filter(|(_, q)| {
                on_node(q.dev)
                    && matches!(q.ty, QpType::Rc | QpType::XrcIni)
                    && q.state == QpState::Rts
            })
            .map(|(_, q)| q.qpn)
            .collect();
        senders.sort_unstable();
        NodeView {
            node,
            qps: w.qps.iter().filter(|(_, q)| on_node(q.dev)).count(),
            tgt_qps,
            senders,
            mrs: w.mrs.iter().filter(|(_, m)| ctx_on_node(m.ctx)).count(),
            srqs: w.srqs.iter().filter(|(_, s)| ctx_on_node(s.ctx)).count(),
            xrcds: w.xrcds.iter().filter(|(_, x)| on_node(x.dev)).count(),
        }
    }

    /// The ARP and path queries node `from` sent towards node `to`.
    pub fn queries_between(&self, from: usize, to: usize) -> PairQueries {
        let w = self.shared.lock();
        w.pair_queries.get(&(from, to)).copied().unwrap_or_default()
    }

    /// A QP's counters, by node and number.
    pub fn qp_view(&self, node: usize, qpn: u32) -> Option<QpView> {
        let w = self.shared.lock();
        let qp = w
            .devs
            .iter()
            .filter(|d| d.node == node)
            .find_map(|d| d.qps.get(&qpn).copied())?;
        let q = w.qps.get(qp)?;
        Some(QpView {
            state: q.state,
            rnr_naks: q.rnr_naks,
            timeouts: q.timeouts,
            handles: q.handles.len(),
        })
    }
}
