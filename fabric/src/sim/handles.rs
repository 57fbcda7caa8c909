//! The user-facing handles of the simulated fabric, implementing the fabric
//! traits. Each handle names its object in the world by id and holds the
//! handles of what the object depends on (a QP holds its PD and CQs), so
//! drop order follows the verbs rules. Dropping a handle destroys the object.
//!
//! Polling an empty queue makes the simulation progress (a software provider
//! progresses when it is called, like libfabric's manual progress), so code
//! that busy-polls runs the same on the simulator as on hardware.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};

use super::arena::Id;
use super::world::{
    CmChannelObj, CmIdObj, CqObj, Ctx, DevIdx, MrObj, PdObj, Proc, QpHandle, SrqObj, World,
    XrcdHandle,
};
use crate::cm::{CmEvent, ConnParam, PortSpace};
use crate::types::*;
use crate::{CmChannel, CmId, Context, Cq, Error, Fabric, Mr, Pd, Qp, QpInit, Result, Srq, Xrcd};

/// The world and its lock.
pub(crate) struct Shared {
    world: Mutex<World>,
}

impl Shared {
    pub(crate) fn new(world: World) -> Self {
        Shared {
            world: Mutex::new(world),
        }
    }

    /// Locks the world. A panic under the lock (a bug, reported where it
    /// happened) does not wedge the other simulated processes.
    pub(crate) fn lock(&self) -> WorldGuard<'_> {
        let depth = DEPTH.with(|d| d.replace(d.get() + 1));
        if depth == 0 && TIMING.with(|t| t.get()) {
            ENTERED.with(|e| e.set(Some(std::time::Instant::now())));
        }
        WorldGuard(self.world.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

thread_local! {
    /// How deep this thread is in the simulated device.
    static DEPTH: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
    /// Whether this thread times its stays in the device.
    static TIMING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
    /// When the current stay began.
    static ENTERED: std::cell::Cell<Option<std::time::Instant>> = const { std::cell::Cell::new(None) };
    /// Wall-clock time of the stays so far.
    static SPENT: std::cell::Cell<std::time::Duration> =
        const { std::cell::Cell::new(std::time::Duration::ZERO) };
}

/// Starts (or stops) timing the calling thread's stays in the simulated
/// device, so that a benchmark can tell the cost of the code above the
/// fabric from the simulator's (two clock reads per stay while on).
pub fn time_device(on: bool) {
    TIMING.with(|t| t.set(on));
}

/// Wall-clock time the calling thread spent in the simulated device while
/// [`time_device`] was on.
pub fn device_time() -> std::time::Duration {
    SPENT.with(|s| s.get())
}

/// Whether the calling thread is running the simulated device right now:
/// what it allocates then is the device's doing, not its caller's. Lets a
/// test count the heap allocations of the code above the fabric (a global
/// allocator may call it: it never allocates).
pub fn inside() -> bool {
    DEPTH.with(|d| d.get() > 0)
}

/// The locked world; while it lives, the thread is inside the device.
pub(crate) struct WorldGuard<'a>(MutexGuard<'a, World>);

impl Drop for WorldGuard<'_> {
    fn drop(&mut self) {
        if DEPTH.with(|d| d.replace(d.get() - 1)) == 1 {
            if let Some(t) = ENTERED.with(|e| e.take()) {
                SPENT.with(|s| s.set(s.get() + t.elapsed()));
            }
        }
    }
}

impl std::ops::Deref for WorldGuard<'_> {
    type Target = World;
    fn deref(&self) -> &World {
        &self.0
    }
}

impl std::ops::DerefMut for WorldGuard<'_> {
    fn deref_mut(&mut self) -> &mut World {
        &mut self.0
    }
}

pub(crate) struct ProcInner {
    pub(crate) shared: Arc<Shared>,
    pub(crate) id: Id<Proc>,
    pub(crate) node: usize,
    pub(crate) pid: u32,
}

impl Drop for ProcInner {
    fn drop(&mut self) {
        self.shared.lock().exit_process(self.id);
    }
}

/// A simulated process on one node: sees the node's devices and opens them.
/// The process exits when [`SimProcess::exit`] is called, when
/// [`super::SimFabric::crash`] kills it, or when its last handle (including
/// those held by its contexts) is dropped.
#[derive(Clone)]
pub struct SimProcess(pub(crate) Arc<ProcInner>);

impl std::fmt::Debug for SimProcess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimProcess(pid {} on node {})", self.0.pid, self.0.node)
    }
}

impl SimProcess {
    /// The node the process runs on.
    pub fn node(&self) -> usize {
        self.0.node
    }

    /// Process id, unique in the fabric.
    pub fn pid(&self) -> u32 {
        self.0.pid
    }

    /// How many times something was queued for this process (completions,
    /// async events, CM events): a harness driving many processes
    /// progresses only those whose count moved.
    pub fn activity(&self) -> u64 {
        self.0
            .shared
            .lock()
            .procs
            .get(self.0.id)
            .map_or(0, |p| p.activity)
    }

    /// The verbs it called so far, counted per call.
    pub fn verbs(&self) -> super::VerbCounts {
        self.0
            .shared
            .lock()
            .procs
            .get(self.0.id)
            .map_or_else(Default::default, |p| p.verbs)
    }

    /// Whether the process is still running.
    pub fn is_alive(&self) -> bool {
        self.0
            .shared
            .lock()
            .procs
            .get(self.0.id)
            .is_some_and(|p| p.alive)
    }

    /// Exits cleanly now: every object the process holds is destroyed, its
    /// connections are disconnected and its TGT QP registrations dropped.
    /// Handles still held elsewhere answer `ProcessGone` from then on.
    pub fn exit(self) {
        self.0.shared.lock().exit_process(self.0.id);
    }
}

impl Fabric for SimProcess {
    type Context = SimContext;

    fn devices(&self) -> Result<Vec<DeviceInfo>> {
        let w = self.0.shared.lock();
        Ok(w.devs
            .iter()
            .filter(|d| d.node == self.0.node)
            .map(|d| DeviceInfo {
                name: d.name.clone(),
                vendor_id: 0,
                caps: d.caps.clone(),
            })
            .collect())
    }

    fn open(&self, name: &str) -> Result<SimContext> {
        let mut w = self.0.shared.lock();
        let id = w.open_ctx(self.0.id, name)?;
        let c = w.ctx(id).expect("just opened");
        let dev = c.dev;
        let caps = w.devs[dev].caps.clone();
        let costly_events = w.devs[dev].costly_events;
        drop(w);
        Ok(SimContext(Arc::new(CtxInner {
            proc: self.0.clone(),
            id,
            dev,
            name: name.to_string(),
            caps,
            costly_events,
        })))
    }
}

pub(crate) struct CtxInner {
    pub(crate) proc: Arc<ProcInner>,
    pub(crate) id: Id<Ctx>,
    pub(crate) dev: DevIdx,
    name: String,
    caps: DeviceCaps,
    /// See [`super::SimDevice::costly_events`].
    costly_events: bool,
}

impl Drop for CtxInner {
    fn drop(&mut self) {
        self.proc.shared.lock().close_ctx(self.id);
    }
}

/// An opened simulated device in one process.
#[derive(Clone)]
pub struct SimContext(pub(crate) Arc<CtxInner>);

impl std::fmt::Debug for SimContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SimContext({} in pid {})", self.0.name, self.0.proc.pid)
    }
}

impl SimContext {
    fn world(&self) -> WorldGuard<'_> {
        self.0.proc.shared.lock()
    }

    /// The process this context belongs to.
    pub fn process(&self) -> SimProcess {
        SimProcess(self.0.proc.clone())
    }

    /// The node this context's device sits on.
    pub fn node(&self) -> usize {
        self.0.proc.node
    }

    /// The IP address of the device's network interface (what RDMA CM
    /// peers connect to).
    pub fn ip(&self) -> std::net::IpAddr {
        self.world().dev_ip(self.0.dev)
    }
}

impl Context for SimContext {
    type Pd = SimPd;
    type Mr = SimMr;
    type Cq = SimCq;
    type Srq = SimSrq;
    type Qp = SimQp;
    type Xrcd = SimXrcd;
    type CmChannel = SimCmChannel;

    fn name(&self) -> &str {
        &self.0.name
    }

    fn events_cost_syscalls(&self) -> bool {
        self.0.costly_events
    }

    fn locality_names(&self) -> Vec<String> {
        Vec::new()
    }

    fn caps(&self) -> &DeviceCaps {
        &self.0.caps
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        if port != 1 {
            return Err(Error::invalid(format!("port {port} does not exist")));
        }
        let w = self.world();
        w.ctx(self.0.id)?;
        let d = &w.devs[self.0.dev];
        Ok(PortAttr {
            state: if d.port_up {
                PortState::Active
            } else {
                PortState::Down
            },
            lid: d.lid,
            gid: d.gid,
            active_mtu: 4096,
        })
    }

    fn alloc_pd(&self) -> Result<SimPd> {
        let id = self.world().alloc_pd(self.0.id)?;
        Ok(SimPd(Arc::new(PdInner {
            ctx: self.clone(),
            id,
        })))
    }

    unsafe fn reg_mr(
        &self,
        pd: &SimPd,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<SimMr> {
        let id = self
            .world()
            .reg_mr(self.0.id, pd.0.id, addr as u64, len as u64, access, false)?;
        let w = self.world();
        let m = w.mrs.get(id).expect("just registered");
        let (lkey, rkey) = (m.lkey, m.rkey);
        drop(w);
        Ok(SimMr {
            pd: pd.clone(),
            id,
            addr: addr as u64,
            len,
            lkey,
            rkey,
            access,
        })
    }

    unsafe fn reg_mr_cached(
        &self,
        pd: &SimPd,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<SimMr> {
        let id = self
            .world()
            .reg_mr(self.0.id, pd.0.id, addr as u64, len as u64, access, true)?;
        let w = self.world();
        let m = w.mrs.get(id).expect("just registered");
        let (lkey, rkey) = (m.lkey, m.rkey);
        drop(w);
        Ok(SimMr {
            pd: pd.clone(),
            id,
            addr: addr as u64,
            len,
            lkey,
            rkey,
            access,
        })
    }

    fn create_cq(&self, cqe: u32) -> Result<SimCq> {
        let id = self.world().create_cq(self.0.id, cqe)?;
        Ok(SimCq(Arc::new(CqInner {
            ctx: self.clone(),
            id,
            cap: cqe,
        })))
    }

    fn create_srq(&self, pd: &SimPd, attr: SrqAttr) -> Result<SimSrq> {
        let id = self.world().create_srq(self.0.id, pd.0.id, None, attr)?;
        Ok(SimSrq(Arc::new(SrqInner {
            ctx: self.clone(),
            _pd: pd.clone(),
            _cq: None,
            _xrcd: None,
            id,
            srqn: None,
        })))
    }

    fn open_xrcd(&self, key: &XrcdKey) -> Result<SimXrcd> {
        let mut w = self.world();
        let id = w.open_xrcd(self.0.id, key)?;
        let x = w.xrcd_handles.get(id).expect("just opened").xrcd;
        let domain = XrcdId {
            dev: w.xrcds.get(x).expect("held").dev as u64,
            ino: x.raw(),
        };
        drop(w);
        Ok(SimXrcd(Arc::new(XrcdInner {
            ctx: self.clone(),
            id,
            domain,
        })))
    }

    fn create_xrc_srq(
        &self,
        pd: &SimPd,
        xrcd: &SimXrcd,
        cq: &SimCq,
        attr: SrqAttr,
    ) -> Result<SimSrq> {
        let mut w = self.world();
        let id = w.create_srq(self.0.id, pd.0.id, Some((xrcd.0.id, cq.0.id)), attr)?;
        let srqn = w.srqs.get(id).and_then(|s| s.xrc.as_ref()).map(|x| x.srqn);
        drop(w);
        Ok(SimSrq(Arc::new(SrqInner {
            ctx: self.clone(),
            _pd: pd.clone(),
            _cq: Some(cq.clone()),
            _xrcd: Some(xrcd.clone()),
            id,
            srqn,
        })))
    }

    fn create_qp(&self, pd: &SimPd, init: &QpInit<'_, Self>) -> Result<SimQp> {
        let mut w = self.world();
        let h = w.create_qp(
            self.0.id,
            pd.0.id,
            init.qp_type,
            init.send_cq.0.id,
            init.recv_cq.map(|c| c.0.id),
            init.srq.map(|s| s.0.id),
            init.caps,
        )?;
        let qp = w.qp_of_handle(h)?;
        let q = w.qps.get(qp).expect("created");
        let (qpn, caps) = (q.qpn, q.caps);
        drop(w);
        Ok(SimQp {
            ctx: self.clone(),
            _deps: QpDeps {
                pd: Some(pd.clone()),
                send_cq: Some(init.send_cq.clone()),
                recv_cq: init.recv_cq.cloned(),
                srq: init.srq.cloned(),
                xrcd: None,
            },
            handle: h,
            qpn,
            ty: init.qp_type,
            caps,
        })
    }

    fn create_tgt_qp(&self, xrcd: &SimXrcd) -> Result<SimQp> {
        let mut w = self.world();
        let h = w.create_tgt_qp(self.0.id, xrcd.0.id)?;
        self.tgt_handle(w, h, xrcd)
    }

    fn open_tgt_qp(&self, xrcd: &SimXrcd, qpn: u32) -> Result<SimQp> {
        let mut w = self.world();
        let h = w.open_tgt_qp(self.0.id, xrcd.0.id, qpn)?;
        self.tgt_handle(w, h, xrcd)
    }

    fn poll_async_event(&self) -> Option<AsyncEvent> {
        let mut w = self.world();
        let pop = |w: &mut World| w.ctxs.get_mut(self.0.id).and_then(|c| c.events.pop_front());
        if let Some(e) = pop(&mut w) {
            w.polled(self.0.id, true);
            return Some(e);
        }
        w.polled(self.0.id, false);
        w.poll_progress();
        pop(&mut w)
    }

    fn create_cm_channel(&self) -> Result<SimCmChannel> {
        let id = self.world().create_cm_channel(self.0.id)?;
        Ok(SimCmChannel(Arc::new(ChannelInner {
            ctx: self.clone(),
            id,
        })))
    }
}

impl SimContext {
    fn tgt_handle(&self, w: WorldGuard<'_>, h: Id<QpHandle>, xrcd: &SimXrcd) -> Result<SimQp> {
        let qp = w.qp_of_handle(h)?;
        let q = w.qps.get(qp).expect("created");
        let (qpn, caps) = (q.qpn, q.caps);
        drop(w);
        Ok(SimQp {
            ctx: self.clone(),
            _deps: QpDeps {
                pd: None,
                send_cq: None,
                recv_cq: None,
                srq: None,
                xrcd: Some(xrcd.clone()),
            },
            handle: h,
            qpn,
            ty: QpType::XrcTgt,
            caps,
        })
    }
}

struct PdInner {
    ctx: SimContext,
    id: Id<PdObj>,
}

impl Drop for PdInner {
    fn drop(&mut self) {
        self.ctx.world().pds.remove(self.id);
    }
}

/// A simulated protection domain.
#[derive(Clone)]
pub struct SimPd(Arc<PdInner>);

impl Pd for SimPd {}

/// A simulated memory region.
pub struct SimMr {
    pd: SimPd,
    id: Id<MrObj>,
    addr: u64,
    len: usize,
    lkey: u32,
    rkey: u32,
    access: Access,
}

impl Drop for SimMr {
    fn drop(&mut self) {
        self.pd.0.ctx.world().dereg_mr(self.id);
    }
}

impl Mr for SimMr {
    fn addr(&self) -> u64 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn lkey(&self) -> u32 {
        self.lkey
    }
    fn rkey(&self) -> u32 {
        self.rkey
    }
    fn access(&self) -> Access {
        self.access
    }
}

struct CqInner {
    ctx: SimContext,
    id: Id<CqObj>,
    cap: u32,
}

impl Drop for CqInner {
    fn drop(&mut self) {
        self.ctx.world().cqs.remove(self.id);
    }
}

/// A simulated completion queue.
#[derive(Clone)]
pub struct SimCq(Arc<CqInner>);

impl SimCq {
    /// How it was polled so far.
    pub fn polls(&self) -> super::CqPolls {
        let w = self.0.ctx.world();
        w.cqs
            .get(self.0.id)
            .map_or_else(Default::default, |c| c.polls)
    }
}

impl Cq for SimCq {
    fn id(&self) -> u64 {
        self.0.id.raw()
    }

    fn capacity(&self) -> u32 {
        self.0.cap
    }

    fn poll(&self, out: &mut [WorkCompletion]) -> Result<usize> {
        let mut w = self.0.ctx.world();
        let ctx = self.0.ctx.0.id;
        let mut n = w.poll_cq(self.0.id, out)?;
        w.polled(ctx, n > 0);
        if n == 0 && !out.is_empty() {
            w.poll_progress();
            n = w.poll_cq(self.0.id, out)?;
            w.polled(ctx, n > 0);
        }
        if let Some(c) = w.cqs.get_mut(self.0.id) {
            c.polls.calls += 1;
            c.polls.hits += u64::from(n > 0);
            c.polls.completions += n as u64;
        }
        Ok(n)
    }

    /// The completions themselves: the simulator has no other form.
    type Staged = Vec<WorkCompletion>;

    fn staging(&self, batch: usize) -> Vec<WorkCompletion> {
        vec![WorkCompletion::default(); batch.max(1)]
    }

    fn poll_staged(&self, st: &mut Vec<WorkCompletion>) -> usize {
        self.poll_quick(st)
    }

    fn take_staged(
        &self,
        st: &mut Vec<WorkCompletion>,
        n: usize,
        out: &mut [WorkCompletion],
    ) -> usize {
        let n = n.min(st.len()).min(out.len());
        out[..n].copy_from_slice(&st[..n]);
        if n < st.len() || n == out.len() {
            return n;
        }
        // A full batch polls on, as a poll of all of `out` would have.
        n + self.poll_quick(&mut out[n..])
    }

    fn staged_recv(&self, st: &Vec<WorkCompletion>) -> Option<RecvDone> {
        st.first()?.recv_done()
    }

    fn arm(&self) -> Result<()> {
        // Sleeping looks at the queue itself: nothing to arm.
        Ok(())
    }

    fn sleep(&self, timeout: std::time::Duration) -> Result<bool> {
        let mut w = self.0.ctx.world();
        // Waiting is being idle.
        w.polled(self.0.ctx.0.id, false);
        let deadline = w.now + timeout.as_nanos() as u64;
        loop {
            let c = w.cqs.get(self.0.id).ok_or(Error::ProcessGone)?;
            if c.overrun {
                return Err(Error::CqOverrun);
            }
            if !c.entries.is_empty() {
                return Ok(true);
            }
            if w.now >= deadline {
                return Ok(false);
            }
            if w.held_back() {
                // Someone else must look at what is queued for it first:
                // return, and let that thread take the lock.
                w.run_due();
                return Ok(false);
            }
            w.progress();
        }
    }
}

struct SrqInner {
    ctx: SimContext,
    _pd: SimPd,
    _cq: Option<SimCq>,
    _xrcd: Option<SimXrcd>,
    id: Id<SrqObj>,
    srqn: Option<u32>,
}

impl Drop for SrqInner {
    fn drop(&mut self) {
        self.ctx.world().destroy_srq(self.id);
    }
}

/// A simulated shared receive queue (plain or XRC).
#[derive(Clone)]
pub struct SimSrq(Arc<SrqInner>);

/// Receives prepared for a [`SimSrq`]: each one's wr_id and SGE.
#[derive(Default)]
pub struct SimRecvs {
    recvs: Vec<(u64, Sge)>,
    marks: crate::types::ChainMarks,
}

impl crate::RecvSet for SimRecvs {
    fn add(&mut self, wr_id: u64, sge: Sge) -> u32 {
        self.recvs.push((wr_id, sge));
        self.marks.grow(self.recvs.len());
        (self.recvs.len() - 1) as u32
    }

    fn len(&self) -> usize {
        self.recvs.len()
    }
}

impl Srq for SimSrq {
    fn id(&self) -> u64 {
        self.0.id.raw()
    }

    fn srq_num(&self) -> Option<u32> {
        self.0.srqn
    }

    fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()> {
        let mut w = self.0.ctx.world();
        if let Some(v) = w.verbs_of(self.0.ctx.0.id) {
            v.post_recv += 1;
            v.recvs_posted += 1;
        }
        w.post_srq_recv(self.0.id, wr)
    }

    type Recvs = SimRecvs;

    /// Counts a call per chain of `RECV_CHAIN` (16) receives, as the
    /// verbs provider makes them, and, as it does, posts nothing of a chain
    /// that names a receive outside the set.
    fn post_set(
        &self,
        set: &mut SimRecvs,
        which: &[u32],
    ) -> std::result::Result<(), (usize, Error)> {
        let mut w = self.0.ctx.world();
        let mut done = 0;
        for chain in which.chunks(crate::types::RECV_CHAIN) {
            // As on verbs, nothing of a chain that breaks the rule is posted.
            set.marks.start();
            for &n in chain {
                set.marks.admit(n as usize).map_err(|e| (done, e))?;
            }
            if let Some(v) = w.verbs_of(self.0.ctx.0.id) {
                v.post_recv += 1;
            }
            for &n in chain {
                let (wr_id, sge) = set.recvs[n as usize];
                if let Some(v) = w.verbs_of(self.0.ctx.0.id) {
                    v.recvs_posted += 1;
                }
                let wr = RecvWr {
                    wr_id,
                    sgl: std::slice::from_ref(&sge),
                };
                w.post_srq_recv(self.0.id, &wr).map_err(|e| (done, e))?;
                done += 1;
            }
        }
        Ok(())
    }

    fn arm_limit(&self, limit: u32) -> Result<()> {
        let mut w = self.0.ctx.world();
        let s = w.srqs.get_mut(self.0.id).ok_or(Error::ProcessGone)?;
        if limit > s.max_wr {
            return Err(Error::invalid(format!(
                "limit {limit} exceeds max_wr {}",
                s.max_wr
            )));
        }
        s.limit = limit;
        Ok(())
    }
}

struct XrcdInner {
    ctx: SimContext,
    id: Id<XrcdHandle>,
    domain: XrcdId,
}

impl Drop for XrcdInner {
    fn drop(&mut self) {
        self.ctx.world().close_xrcd_handle(self.id);
    }
}

/// A handle on a simulated XRC domain.
#[derive(Clone)]
pub struct SimXrcd(Arc<XrcdInner>);

impl Xrcd for SimXrcd {
    fn id(&self) -> XrcdId {
        self.0.domain
    }
}

/// What a QP keeps alive (held, never read).
#[allow(dead_code)]
struct QpDeps {
    pd: Option<SimPd>,
    send_cq: Option<SimCq>,
    recv_cq: Option<SimCq>,
    srq: Option<SimSrq>,
    xrcd: Option<SimXrcd>,
}

/// A simulated QP, or a handle on a shared XRC TGT QP.
pub struct SimQp {
    ctx: SimContext,
    // Dropped after the handle is closed (field order), keeping the PD, CQs,
    // SRQ and domain alive as long as the QP.
    _deps: QpDeps,
    handle: Id<QpHandle>,
    qpn: u32,
    ty: QpType,
    caps: QpCaps,
}

impl Drop for SimQp {
    fn drop(&mut self) {
        self.ctx.world().close_qp_handle(self.handle);
    }
}

impl SimQp {
    pub(crate) fn obj(&self, w: &World) -> Result<Id<super::world::QpObj>> {
        w.qp_of_handle(self.handle)
    }
}

impl Qp for SimQp {
    /// The simulator builds each request anew.
    type Inline = ();

    fn qp_num(&self) -> u32 {
        self.qpn
    }

    fn qp_type(&self) -> QpType {
        self.ty
    }

    fn caps(&self) -> QpCaps {
        let w = self.ctx.world();
        self.obj(&w)
            .ok()
            .and_then(|q| w.qps.get(q))
            .map_or(self.caps, |q| q.caps)
    }

    fn state(&self) -> Result<QpState> {
        let w = self.ctx.world();
        let qp = self.obj(&w)?;
        Ok(w.qps.get(qp).ok_or(Error::ProcessGone)?.state)
    }

    fn modify(&self, t: &QpTransition) -> Result<()> {
        let mut w = self.ctx.world();
        let qp = self.obj(&w)?;
        w.modify_qp(qp, t, false)
    }

    fn post_send(&self, wr: &SendWr<'_>) -> Result<()> {
        let mut w = self.ctx.world();
        if let Some(v) = w.verbs_of(self.ctx.0.id) {
            v.post_send += 1;
            v.signalled += u64::from(wr.signaled);
        }
        let qp = self.obj(&w)?;
        w.post_send(qp, wr)
    }

    fn post_recv(&self, wr: &RecvWr<'_>) -> Result<()> {
        let mut w = self.ctx.world();
        if let Some(v) = w.verbs_of(self.ctx.0.id) {
            v.post_recv += 1;
            v.recvs_posted += 1;
        }
        let qp = self.obj(&w)?;
        w.post_recv(qp, wr)
    }

    fn query(&self) -> Result<QpAttr> {
        let w = self.ctx.world();
        let qp = self.obj(&w)?;
        let q = w.qps.get(qp).ok_or(Error::ProcessGone)?;
        Ok(QpAttr {
            state: q.state,
            min_rnr_timer: q.min_rnr_timer,
            timeout: q.rts.timeout,
            retry_cnt: q.rts.retry_cnt,
            rnr_retry: q.rts.rnr_retry,
            max_inline: q.caps.max_inline,
        })
    }

    fn resize_send_queue(&self, depth: u32) -> Result<u32> {
        let mut w = self.ctx.world();
        let qp = self.obj(&w)?;
        let q = w.qps.get(qp).ok_or(Error::ProcessGone)?;
        let max = w.devs[q.dev].caps.max_qp_wr;
        if q.ty == QpType::XrcTgt {
            return Err(Error::invalid("an XRC TGT QP has no send queue"));
        }
        if !w.devs[q.dev].resizable_sq && depth > q.caps.max_send_wr {
            return Err(Error::Unsupported(
                "the device cannot resize a QP's send queue (IBV_QP_CAP)",
            ));
        }
        if depth > max {
            return Err(Error::invalid(format!(
                "send queue of {depth} exceeds max_qp_wr {max}"
            )));
        }
        let q = w.qps.get_mut(qp).expect("checked");
        q.caps.max_send_wr = q.caps.max_send_wr.max(depth);
        Ok(q.caps.max_send_wr)
    }
}

struct ChannelInner {
    ctx: SimContext,
    id: Id<CmChannelObj>,
}

impl Drop for ChannelInner {
    fn drop(&mut self) {
        self.ctx.world().destroy_cm_channel(self.id);
    }
}

/// A simulated RDMA CM event channel.
pub struct SimCmChannel(Arc<ChannelInner>);

impl CmChannel for SimCmChannel {
    type Context = SimContext;
    type Id = SimCmId;

    fn create_id(&self, ps: PortSpace) -> Result<SimCmId> {
        let id = self.0.ctx.world().create_cm_id(self.0.id, ps)?;
        Ok(SimCmId {
            channel: self.0.clone(),
            id,
        })
    }

    fn poll_event(&self) -> Option<CmEvent<SimCmId>> {
        let mut w = self.0.ctx.world();
        let pop = |w: &mut World| {
            w.channels
                .get_mut(self.0.id)
                .and_then(|c| c.events.pop_front())
        };
        let ctx = self.0.ctx.0.id;
        let ev = match pop(&mut w) {
            Some(e) => e,
            None => {
                w.polled(ctx, false);
                w.poll_progress();
                pop(&mut w)?
            }
        };
        w.polled(ctx, true);
        drop(w);
        // The device made these bytes: it frees them, and the process gets
        // a copy of its own, so that a counting allocator sees what the
        // process keeps (and not a free of what it never allocated).
        let private_data = ev.private_data.clone();
        let inside = self.0.ctx.world();
        drop(ev.private_data);
        drop(inside);
        Some(CmEvent {
            id: ev.id.raw(),
            kind: ev.kind,
            private_data,
            remote_qpn: ev.remote_qpn,
            peer: ev.peer.map(SocketAddr::V4),
            new_id: ev.new_id.map(|id| SimCmId {
                channel: self.0.clone(),
                id,
            }),
        })
    }
}

/// A simulated RDMA CM id.
pub struct SimCmId {
    channel: Arc<ChannelInner>,
    id: Id<CmIdObj>,
}

impl Drop for SimCmId {
    fn drop(&mut self) {
        self.channel.ctx.world().destroy_cm_id(self.id);
    }
}

impl SimCmId {
    fn world(&self) -> WorldGuard<'_> {
        self.channel.ctx.world()
    }
}

impl CmId for SimCmId {
    type Context = SimContext;

    fn key(&self) -> u64 {
        self.id.raw()
    }

    fn listen(&self, addr: SocketAddr, backlog: u32) -> Result<()> {
        self.world().cm_listen(self.id, addr, backlog)
    }

    fn resolve_addr(&self, dst: SocketAddr, timeout_ms: u32) -> Result<()> {
        self.world().cm_resolve_addr(self.id, dst, timeout_ms)
    }

    fn listen_ib(&self, addr: crate::cm::IbAddr, backlog: u32) -> Result<()> {
        self.world().cm_listen_ib(self.id, addr, backlog)
    }

    fn resolve_ib(
        &self,
        dst: crate::cm::IbAddr,
        route: Option<&crate::cm::CmRoute>,
        timeout_ms: u32,
    ) -> Result<()> {
        self.world().cm_resolve_ib(self.id, dst, route, timeout_ms)
    }

    fn local_ib_addr(&self) -> Option<crate::cm::IbAddr> {
        self.world().cm_local_ib_addr(self.id)
    }

    fn resolve_route(&self, timeout_ms: u32) -> Result<()> {
        self.world().cm_resolve_route(self.id, timeout_ms)
    }

    fn connect(&self, qp: Option<&SimQp>, param: &ConnParam<'_>) -> Result<()> {
        let mut w = self.world();
        let qp = qp.map(|q| q.obj(&w)).transpose()?;
        w.cm_connect(self.id, qp, param)
    }

    fn accept(&self, qp: Option<&SimQp>, param: &ConnParam<'_>) -> Result<()> {
        let mut w = self.world();
        let qp = qp.map(|q| q.obj(&w)).transpose()?;
        w.cm_accept(self.id, qp, param)
    }

    fn reject(&self, private_data: &[u8]) -> Result<()> {
        self.world().cm_reject(self.id, private_data)
    }

    fn disconnect(&self) -> Result<()> {
        self.world().cm_disconnect(self.id)
    }

    fn notify_established(&self) -> Result<()> {
        self.world().cm_notify_established(self.id)
    }

    fn route(&self) -> Option<crate::cm::CmRoute> {
        self.world().cm_route(self.id)
    }

    fn resolve_cached(
        &self,
        dst: SocketAddr,
        route: &crate::cm::CmRoute,
        _timeout_ms: u32,
    ) -> Result<()> {
        self.world().cm_resolve_cached(self.id, dst, route)
    }

    fn local_addr(&self) -> Option<SocketAddr> {
        self.world().cm_local_addr(self.id)
    }

    fn peer_addr(&self) -> Option<SocketAddr> {
        self.world().cm_peer_addr(self.id)
    }
}
