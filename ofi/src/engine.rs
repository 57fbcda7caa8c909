//! One domain's endpoints over its BTL rank: each endpoint's [`Rdm`] driven
//! against the BTL, and its completions delivered to the queues and
//! counters the caller bound.
//!
//! - Messages between endpoints travel as the BTL's active messages of
//!   [`AM_TAG`], the provider's header ([`crate::wire`]) first; the header
//!   names the endpoint they are for.
//! - A send up to the eager size is copied at the call and sent whole; a
//!   larger one is registered through the BTL's cache and read by the
//!   receiver straight into its posted buffer (the Rdm's rendezvous).
//! - RMA reads and writes go straight to the BTL's get and put on the
//!   caller's memory, registered through the cache for the operation
//!   ([`crate::onesided`]: cut into several where a compound key's chunks
//!   or the local side's regions end); atomics to its add, fetch-and-add
//!   and compare-and-swap ([`crate::atomic`]). A compound key of a peer's
//!   is looked up once (KeyQuery) and its answer kept.
//! - Unexpected messages (arrived before their receive) are held within a
//!   budget per endpoint ([`UNEXPECTED_VAR`]); one past it is dropped and
//!   the receiving side reads an FI_EOVERRUN error completion.
//! - Completions: a send or receive that asked for one (or any that
//!   failed) takes a place in its queue when posted, so that a full queue
//!   refuses the post (FI_EAGAIN) rather than lose a completion.
//!
//! Locking: the engine's state is one mutex, never held across a call
//! into the BTL (the BTL runs callbacks, which take it, from inside its
//! calls): actions are taken under the lock and done outside it.
#![forbid(unsafe_code)]

use rustc_hash::FxHashMap;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use xrcbtl_btl::{Access, Btl, MemReg, Peer, RemoteMem, Tag, UserMem};
use xrcbtl_fabric::Context;

use crate::addr::PeerEp;
use crate::av::{EpAv, NOT_AVAIL};
use crate::cq::{CompletionQueue, Counter, Entry, ErrEntry, ProvErr};
use crate::flags::{
    ATOMIC, MSG, MULTI_RECV, READ, RECV, REMOTE_CQ_DATA, REMOTE_WRITE, RMA, SEND, TAGGED, WRITE,
};
use crate::keys::{self, Chunk, COMPOUND, READABLE};
use crate::matching::{ClaimId, Header, Source, Want};
use crate::onesided::{self, Local, Lookups, Reach, Transfer, Waiter};
use crate::rdm::{Action, Exposed, OpRef, Outcome, Rdm, RdmError, Received, SendReq, Space};
use crate::sys;

/// The BTL tag of the provider's messages.
pub const AM_TAG: Tag = 1;
/// Bytes the provider's header may take in an eager message.
const HEADER_MAX: usize = 64;
/// Unexpected messages each endpoint holds by default, in bytes (per
/// matching space).
pub const UNEXPECTED_MAX: usize = 64 << 20;
/// The setting that changes it.
pub const UNEXPECTED_VAR: &str = "XRCBTL_OFI_UNEXPECTED_MAX";

/// The unexpected-message budget `XRCBTL_OFI_UNEXPECTED_MAX` sets (bytes,
/// at least 4096), or why its value is refused.
pub fn unexpected_max(value: Option<&str>) -> Result<usize, String> {
    match value {
        None => Ok(UNEXPECTED_MAX),
        Some(v) => match v.parse::<usize>() {
            Ok(n) if n >= 4096 => Ok(n),
            _ => Err(format!(
                "{UNEXPECTED_VAR}={v:?}: a number of bytes, at least 4096"
            )),
        },
    }
}

/// The setting that has each domain print, when it closes, what it
/// carried ([`carried`]): MPI jobs show with it that the provider moved
/// their traffic.
pub const VERBOSE_VAR: &str = "XRCBTL_OFI_VERBOSE";

/// Whether `XRCBTL_OFI_VERBOSE` asks for the counters: unset, empty or
/// `0` does not, `1` does; any other value is refused.
pub fn verbose(value: Option<&str>) -> Result<bool, String> {
    match value {
        None | Some("") | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(v) => Err(format!("{VERBOSE_VAR}={v:?}: 0 or 1")),
    }
}

/// The line a domain prints at close under `XRCBTL_OFI_VERBOSE=1`: the
/// process, what its BTL rank carried, and what its registration cache
/// did (`r`: the caller's memory the rank sent from or read into).
pub fn carried(pid: u32, s: &xrcbtl_btl::BtlStats, r: &xrcbtl_fabric::rcache::Stats) -> String {
    format!(
        "xrc: pid {pid} carried: sends {} (inline {}), received {}, rendezvous sent {} received {}, \
         reads and writes {}, atomics {}, retransmits {}, lost {}; \
         registrations {} (cache hits {}, for one use {}, invalidated {})",
        s.eager_sent,
        s.inline_sent,
        s.eager_received,
        s.rndv_sent,
        s.rndv_received,
        s.rdma_frags,
        s.atomics,
        s.retransmits,
        s.lost,
        r.registrations,
        r.hits,
        r.uncached,
        r.invalidations
    )
}

/// A completion queue, shared by the caller's handle and the engine.
pub type SharedCq = Arc<Mutex<CompletionQueue>>;
/// A counter, shared likewise.
pub type SharedCounter = Arc<Mutex<Counter>>;
/// An address vector, shared likewise.
pub type SharedAv = Arc<Mutex<EpAv>>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Where an endpoint's completions go (what `fi_ep_bind` bound).
#[derive(Clone, Default)]
pub struct Targets {
    /// Its address vector.
    pub av: Option<SharedAv>,
    /// Transmit completions.
    pub tx: Option<SharedCq>,
    /// Receive completions.
    pub rx: Option<SharedCq>,
    /// Counters, each with the FI_SEND / FI_RECV flags it counts.
    pub counters: Vec<(SharedCounter, u64)>,
}

/// A send as the caller posts it.
#[derive(Debug, Clone)]
pub struct SendArgs {
    /// The caller's context, returned in the completion.
    pub context: u64,
    /// The destination's address vector number.
    pub to: u64,
    /// Matching space and tag.
    pub space: Space,
    /// Remote CQ data.
    pub data: Option<u64>,
    /// The buffer (`None` for a message of no bytes).
    pub mem: Option<UserMem>,
    /// A successful completion is wanted (an error always comes).
    pub completion: bool,
    /// Complete only once delivered (FI_DELIVERY_COMPLETE).
    pub delivery: bool,
    /// The body the provider gathered from several I/O vector entries:
    /// `mem` points into it, and the send keeps it until it completes.
    pub gathered: Option<Box<[u8]>>,
}

/// A receive as the caller posts it.
#[derive(Debug, Clone, Copy)]
pub struct RecvArgs {
    /// The caller's context.
    pub context: u64,
    /// The source's address vector number, or `None` for any.
    pub from: Option<u64>,
    /// Matching space; tagged receives carry their tag.
    pub space: Space,
    /// Tag bits that do not take part.
    pub ignore: u64,
    /// The buffer (`None` for a receive of no bytes).
    pub mem: Option<UserMem>,
    /// A successful completion is wanted.
    pub completion: bool,
    /// A multi-receive buffer, released once less than this is free.
    pub multi: Option<usize>,
}

/// An RMA read or write, as the caller posts it.
#[derive(Debug, Clone, Copy)]
pub struct RmaArgs {
    /// The caller's context.
    pub context: u64,
    /// The target's address vector number.
    pub to: u64,
    /// The local buffer (`None` for no bytes).
    pub mem: Option<UserMem>,
    /// Where in the target's memory (FI_MR_VIRT_ADDR: its address).
    pub addr: u64,
    /// The target registration's key (fi_mr_key on its side).
    pub key: u64,
    /// A write (else a read).
    pub write: bool,
    /// Remote CQ data a write delivers to the target endpoint once it has
    /// landed (`fi_writedata`).
    pub data: Option<u64>,
    /// Copy the source at the call (FI_INJECT): the buffer is the
    /// caller's again at once.
    pub inject: bool,
    /// A successful completion is wanted.
    pub completion: bool,
}

/// An atomic, as the caller posts it (one 64-bit element).
#[derive(Debug, Clone, Copy)]
pub struct AtomicArgs {
    /// The caller's context.
    pub context: u64,
    /// The target's address vector number.
    pub to: u64,
    /// The target word's address (8-byte aligned).
    pub addr: u64,
    /// The target registration's key.
    pub key: u64,
    /// What to do.
    pub op: crate::atomic::Op,
    /// Where the old value goes (fetching and compare atomics).
    pub result: Option<UserMem>,
    /// A successful completion is wanted (never for an inject).
    pub completion: bool,
}

/// A tagged FI_PEEK, as the caller posts it.
#[derive(Debug, Clone, Copy)]
pub struct PeekArgs {
    /// The caller's context (with `claim`, the message's claim from then
    /// on).
    pub context: u64,
    /// The source's address vector number, or `None` for any.
    pub from: Option<u64>,
    /// The tag.
    pub tag: u64,
    /// Tag bits that do not take part.
    pub ignore: u64,
    /// FI_CLAIM: keep the message for a receive with this context.
    pub claim: bool,
    /// FI_DISCARD: drop the message found.
    pub discard: bool,
}

/// Why a post was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PostError {
    /// No room now (its completion queue is full): try again.
    Again,
    /// The destination is not in the endpoint's address vector.
    NoAddress,
    /// The endpoint is not there, or has no address vector or queue for
    /// this.
    State(&'static str),
    /// An argument the provider cannot take (the reason).
    Invalid(String),
}

/// A send or receive in flight.
struct Op {
    context: u64,
    recv: bool,
    space: Space,
    mem: Option<UserMem>,
    completion: bool,
    /// Holds a place in its queue.
    reserved: bool,
    multi: bool,
    /// The eager payload, copied at the call.
    eager: Option<Vec<u8>>,
    /// The rendezvous registration of a send.
    reg: Option<MemReg>,
    /// A gathered send's body, which `mem` points into: held, never read
    /// (dropped after `reg`).
    _body: Option<Box<[u8]>>,
}

impl Op {
    /// A posted receive (`reserved`: it holds a place in its queue).
    fn receive(a: &RecvArgs, reserved: bool) -> Op {
        Op {
            context: a.context,
            recv: true,
            space: a.space,
            mem: a.mem,
            completion: a.completion,
            reserved,
            multi: a.multi.is_some(),
            eager: None,
            reg: None,
            _body: None,
        }
    }
}

struct EpCore {
    rdm: Rdm,
    targets: Targets,
    ops: FxHashMap<OpRef, Op>,
    /// The registrations of the places offered to writing senders, by
    /// grant.
    grants: FxHashMap<u64, MemReg>,
    next_op: OpRef,
}

#[derive(Default)]
struct State {
    eps: FxHashMap<u16, EpCore>,
}

/// What the provider's C layer asks of a domain's engine, whichever fabric
/// its BTL runs on ([`Engine`] on the simulated fabric or on verbs).
pub trait Ops: Send + Sync {
    /// Largest message sent eagerly.
    fn eager_max(&self) -> usize;
    /// Opens endpoint `ep` with its bindings.
    fn open(&self, ep: u16, targets: Targets);
    /// Closes endpoint `ep`: what it had in flight is dropped without
    /// completions (the caller closed it), rendezvous registrations given
    /// back.
    fn close(&self, ep: u16);
    /// Posts a send from endpoint `ep`.
    fn send(&self, ep: u16, a: SendArgs) -> Result<(), PostError>;
    /// Posts a receive on endpoint `ep`.
    fn recv(&self, ep: u16, a: RecvArgs) -> Result<(), PostError>;
    /// Posts an RMA read or write from endpoint `ep`: the local buffer is
    /// registered through the BTL's cache (or, for an inject, copied into
    /// memory of the BTL's), the target reached at `addr` with `key`; the
    /// device checks the key against what the target registered.
    fn rma(&self, ep: u16, a: RmaArgs) -> Result<(), PostError>;
    /// Posts an atomic from endpoint `ep`: the BTL's add, fetch-and-add or
    /// compare-and-swap on the target's word; the old value (if any) is
    /// written to `result` before the completion.
    fn atomic(&self, ep: u16, a: AtomicArgs) -> Result<(), PostError>;
    /// FI_PEEK in the tagged space: a completion with the length and tag
    /// of the oldest matching message that waits (claimed for `context`
    /// with FI_CLAIM, dropped with FI_DISCARD), or an FI_ENOMSG error
    /// completion when none does.
    fn peek(&self, ep: u16, a: PeekArgs) -> Result<(), PostError>;
    /// FI_CLAIM: receives the message a peek claimed for `a.context`
    /// into `a.mem`; FI_CLAIM | FI_DISCARD (`discard`): drops it. Either
    /// completes as a receive. `Invalid` when nothing is claimed for it.
    fn take_claimed(&self, ep: u16, a: RecvArgs, discard: bool) -> Result<(), PostError>;
    /// Cancels the posted receive of `context` on endpoint `ep`: it
    /// completes with FI_ECANCELED; false if none is posted.
    fn cancel(&self, ep: u16, context: u64) -> bool;
    /// Operations in flight on endpoint `ep` (sends, reads, receives).
    fn in_flight(&self, ep: u16) -> (usize, usize, usize);
    /// Whether the device does atomics.
    fn atomics(&self) -> bool;
    /// What the BTL rank under the engine counted.
    fn stats(&self) -> xrcbtl_btl::BtlStats;
    /// What its registration cache counted.
    fn rcache_stats(&self) -> xrcbtl_fabric::rcache::Stats;
    /// Registers exactly `mem` for peers' RMA and atomics (`fi_mr_reg`),
    /// outside the BTL's cache: one device region under its key, or, past
    /// the device's largest region, several under a compound key
    /// ([`crate::keys`]).
    fn register_region(&self, mem: UserMem, access: Access) -> xrcbtl_fabric::Result<Region>;
    /// Gives a registration back.
    fn deregister_region(&self, region: Region);
    /// One round of the BTL's progress; the work it found.
    fn progress(&self) -> usize;
    /// Makes a peer domain known to the BTL (connected on first use).
    fn add_peer(&self, peer: &Peer) -> xrcbtl_fabric::Result<()>;
}

/// Memory registered for peers (`fi_mr_reg`): its key and device regions.
#[derive(Debug)]
pub struct Region {
    /// The key peers name it by: a device key, or a compound one.
    pub key: u64,
    regs: Vec<MemReg>,
}

/// One domain's endpoints on its BTL.
pub struct Engine<C: Context> {
    btl: Arc<Btl<C>>,
    state: Arc<Mutex<State>>,
    lookups: Arc<Mutex<Lookups<C>>>,
    eager_max: usize,
    unexpected_max: usize,
    /// Large messages are written into the receives by their senders
    /// ([`Rdm::with_writes`]), as the BTL's own rendezvous does here.
    writes: bool,
}

impl<C: Context> std::fmt::Debug for Engine<C> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Engine(rank {})", self.btl.rank())
    }
}

impl<C: Context> Engine<C> {
    /// The engine of a BTL rank: it takes the BTL's messages of
    /// [`AM_TAG`] and its peer failures. Each endpoint holds at most
    /// `unexpected_max` bytes of unexpected messages per matching space;
    /// a message past that is dropped and reported (FI_EOVERRUN).
    pub fn new(btl: Arc<Btl<C>>, unexpected_max: usize) -> Engine<C> {
        let state = Arc::new(Mutex::new(State::default()));
        let lookups = Arc::new(Mutex::new(Lookups::default()));
        let (weak, weak_keys) = (Arc::downgrade(&state), Arc::downgrade(&lookups));
        btl.register_am(AM_TAG, move |btl, inc| {
            if let (Some(state), Some(lookups)) = (weak.upgrade(), weak_keys.upgrade()) {
                arrive(btl, &state, &lookups, inc.src, inc.data);
            }
        });
        let weak: Weak<Mutex<State>> = Arc::downgrade(&state);
        let weak_keys = Arc::downgrade(&lookups);
        btl.register_error(move |btl, rank, _| {
            if let Some(lookups) = weak_keys.upgrade() {
                let waiting = lock(&lookups).lost(rank);
                for w in waiting {
                    w(btl, Err(format!("rank {rank} is gone")));
                }
            }
            if let Some(state) = weak.upgrade() {
                let eps: Vec<u16> = {
                    let mut st = lock(&state);
                    for core in st.eps.values_mut() {
                        core.rdm.handle_peer_lost(rank);
                    }
                    st.eps.keys().copied().collect()
                };
                for ep in eps {
                    drive(btl, &state, ep);
                }
            }
        });
        let eager_max = btl.max_send_size().saturating_sub(HEADER_MAX);
        let writes = btl.rndv_puts();
        Engine {
            btl,
            state,
            lookups,
            eager_max,
            unexpected_max,
            writes,
        }
    }

    /// The BTL.
    pub fn btl(&self) -> &Arc<Btl<C>> {
        &self.btl
    }

    /// Runs `go` with what reaches key `key` at `to`: at once for a device
    /// key or a compound key the peer already described; otherwise once
    /// the peer answers (the first to wait asks), an answer that fails
    /// reaching `go`'s work as a failed completion.
    fn reach<G>(&self, to: PeerEp, key: u64, go: G) -> Result<(), PostError>
    where
        G: FnOnce(&Btl<C>, &Reach) -> Result<(), (xrcbtl_fabric::Error, onesided::After<C>)>
            + Send
            + 'static,
    {
        // Compound keys are known by their bare value.
        let key = key & !READABLE;
        let now = if key & COMPOUND == 0 {
            Some(Reach::Device(key as u32))
        } else {
            lock(&self.lookups).known(to.domain, key)
        };
        if let Some(reach) = now {
            return go(&self.btl, &reach).map_err(|(e, _)| PostError::Invalid(e.to_string()));
        }
        // Run later: work that cannot start (a refused key too) fails.
        let waiter: Waiter<C> = Box::new(move |btl: &Btl<C>, reach: Result<Reach, String>| {
            let reach = reach.unwrap_or_else(Reach::Refused);
            if let Err((_, after)) = go(btl, &reach) {
                after(btl, false);
            }
        });
        let first = lock(&self.lookups).wait(to.domain, key, waiter);
        if first {
            let mut header = Vec::with_capacity(16);
            crate::wire::Msg::KeyQuery {
                common: crate::wire::Common {
                    flags: 0,
                    dst_ep: to.ep,
                    src_ep: 0,
                },
                key,
            }
            .encode(&mut header);
            if let Err(e) = self.btl.send(to.domain, AM_TAG, &header, &[]) {
                let (waiting, _) = lock(&self.lookups).answer(to.domain, key, Err(e.to_string()));
                for w in waiting {
                    w(&self.btl, Err(e.to_string()));
                }
            }
        }
        Ok(())
    }

    /// What an RMA or atomic from `ep` to `to` needs before it starts:
    /// the peer, the endpoint's targets, and a place in its transmit queue
    /// (whether one was taken).
    fn one_sided(&self, ep: u16, to: u64) -> Result<(PeerEp, Targets, bool), PostError> {
        let mut st = lock(&self.state);
        let core = core_mut(&mut st, ep)?;
        let peer = peer_of(&core.targets, to)?;
        let reserved = reserve(core.targets.tx.as_ref())?;
        Ok((peer, core.targets.clone(), reserved))
    }
}

impl<C: Context> Ops for Engine<C> {
    fn eager_max(&self) -> usize {
        self.eager_max
    }

    fn open(&self, ep: u16, targets: Targets) {
        lock(&self.state).eps.insert(
            ep,
            EpCore {
                rdm: Rdm::new(ep, self.eager_max, self.unexpected_max).with_writes(self.writes),
                targets,
                ops: FxHashMap::default(),
                grants: FxHashMap::default(),
                next_op: 1,
            },
        );
    }

    fn close(&self, ep: u16) {
        let core = lock(&self.state).eps.remove(&ep);
        if let Some(core) = core {
            for op in core.ops.into_values() {
                if let Some(reg) = op.reg {
                    let _ = self.btl.deregister_mem(reg);
                }
            }
            for reg in core.grants.into_values() {
                let _ = self.btl.deregister_mem(reg);
            }
        }
    }

    fn send(&self, ep: u16, a: SendArgs) -> Result<(), PostError> {
        {
            let mut st = lock(&self.state);
            let core = core_mut(&mut st, ep)?;
            let to = peer_of(&core.targets, a.to)?;
            let len = a.mem.map_or(0, |m| m.len());
            let eager = if len <= self.eager_max {
                match a.mem {
                    Some(m) => Some(
                        m.read(0, len)
                            .map_err(|e| PostError::Invalid(e.to_string()))?,
                    ),
                    None => Some(Vec::new()),
                }
            } else {
                None
            };
            let reserved = reserve(core.targets.tx.as_ref())?;
            let op = core.next_op;
            core.next_op += 1;
            core.ops.insert(
                op,
                Op {
                    context: a.context,
                    recv: false,
                    space: a.space,
                    mem: a.mem,
                    completion: a.completion,
                    reserved,
                    multi: false,
                    eager,
                    reg: None,
                    _body: a.gathered,
                },
            );
            core.rdm.send(
                op,
                SendReq {
                    to,
                    space: a.space,
                    data: a.data,
                    len,
                    delivery: a.delivery,
                },
            );
        }
        drive(&self.btl, &self.state, ep);
        Ok(())
    }

    fn recv(&self, ep: u16, a: RecvArgs) -> Result<(), PostError> {
        {
            let mut st = lock(&self.state);
            let core = core_mut(&mut st, ep)?;
            if let Some(from) = a.from {
                peer_of(&core.targets, from)?;
            }
            let reserved = reserve(core.targets.rx.as_ref())?;
            let (tag, ignore) = match a.space {
                Space::Msg => (0, u64::MAX),
                Space::Tagged(t) => (t, a.ignore),
            };
            let op = core.next_op;
            core.next_op += 1;
            let len = a.mem.map_or(0, |m| m.len());
            if let Err(e) = core.rdm.post_recv(
                op,
                a.space,
                Want {
                    from: a.from,
                    tag,
                    ignore,
                },
                len,
                a.multi,
            ) {
                give_back(core.targets.rx.as_ref(), reserved);
                return Err(PostError::Invalid(format!("{e:?}")));
            }
            core.ops.insert(op, Op::receive(&a, reserved));
        }
        drive(&self.btl, &self.state, ep);
        Ok(())
    }

    fn rma(&self, ep: u16, a: RmaArgs) -> Result<(), PostError> {
        if !keys::well_formed(a.key) {
            return Err(PostError::Invalid("not a key of this provider".into()));
        }
        let (to, targets, reserved) = self.one_sided(ep, a.to)?;
        let tx = targets.tx.clone();
        let flags = RMA | if a.write { WRITE } else { READ };
        let wanted = a.completion;
        let notice = a.data.map(|data| {
            let mut header = Vec::with_capacity(16);
            crate::wire::Msg::WriteData {
                common: crate::wire::Common {
                    flags: 0,
                    dst_ep: to.ep,
                    src_ep: ep,
                },
                data,
            }
            .encode(&mut header);
            header
        });
        let finish =
            move |ok: bool| complete_one_sided(&targets, a.context, flags, reserved, wanted, ok);
        let Some(mem) = a.mem else {
            finish(true);
            return Ok(());
        };
        let len = mem.len();
        let local = if a.inject {
            // Copied at the call: the caller's buffer is free at once.
            let bounce = self.btl.alloc_mem(len).and_then(|b| {
                b.write(0, &mem.read(0, len)?);
                Ok(b)
            });
            match bounce {
                Ok(b) => Local::Bounce(b),
                Err(e) => {
                    give_back(tx.as_ref(), reserved);
                    return Err(PostError::Invalid(e.to_string()));
                }
            }
        } else {
            Local::User(mem)
        };
        let transfer = Transfer {
            to: to.domain,
            write: a.write,
            readable: a.key & READABLE != 0,
            local,
            addr: a.addr,
            len,
            after: Box::new(move |btl: &Btl<C>, ok: bool| {
                let ok = ok && notify(btl, to.domain, notice.as_deref());
                finish(ok);
            }),
        };
        let go = move |btl: &Btl<C>, reach: &Reach| onesided::start(btl, transfer, reach);
        // Never started: its place goes back.
        self.reach(to, a.key, go)
            .inspect_err(|_| give_back(tx.as_ref(), reserved))
    }

    fn atomic(&self, ep: u16, a: AtomicArgs) -> Result<(), PostError> {
        use crate::atomic::Op;
        if !keys::well_formed(a.key) {
            return Err(PostError::Invalid("not a key of this provider".into()));
        }
        if a.addr % 8 != 0 {
            return Err(PostError::Invalid(
                "the target of an atomic is not 8-byte aligned".into(),
            ));
        }
        let fetching = !matches!(a.op, Op::Add(_));
        if fetching && a.result.is_none_or(|m| m.len() < 8) {
            return Err(PostError::Invalid(
                "a fetching atomic needs 8 bytes for its result".into(),
            ));
        }
        let (to, targets, reserved) = self.one_sided(ep, a.to)?;
        let tx = targets.tx.clone();
        let kind = ATOMIC | if fetching { READ } else { WRITE };
        let result = a.result;
        let finish = move |ok: bool| {
            complete_one_sided(&targets, a.context, kind, reserved, a.completion, ok)
        };
        let go = move |btl: &Btl<C>, reach: &Reach| {
            // The word lies in one chunk: chunks end on pages.
            let rkey = match reach.pieces(a.addr, 8) {
                Ok(p) => p[0].rkey,
                Err(why) => {
                    return Err((
                        xrcbtl_fabric::Error::invalid(why),
                        Box::new(move |_: &Btl<C>, ok| finish(ok)) as onesided::After<C>,
                    ))
                }
            };
            let at = RemoteMem {
                addr: a.addr,
                len: 8,
                rkey,
            }
            .at(0);
            let finish = Arc::new(Mutex::new(Some(finish)));
            let f = finish.clone();
            let done = Box::new(move |_: &Btl<C>, _, r: xrcbtl_btl::OpResult| {
                let ok = match (r, result) {
                    (Ok(Some(old)), Some(m)) => m.write(0, &old.to_ne_bytes()).is_ok(),
                    (Ok(_), _) => true,
                    (Err(_), _) => false,
                };
                if let Some(finish) = lock(&f).take() {
                    finish(ok);
                }
            });
            let started = match a.op {
                Op::Add(v) => btl.add(to.domain, at, v, Some(done)),
                Op::FetchAdd(v) => btl.fetch_add(to.domain, at, v, Some(done)),
                Op::CompareSwap { compare, swap } => {
                    btl.compare_swap(to.domain, at, compare, swap, Some(done))
                }
            };
            started.map(|_| ()).map_err(|e| {
                let finish = lock(&finish).take();
                let after: onesided::After<C> = Box::new(move |_: &Btl<C>, ok| {
                    if let Some(finish) = finish {
                        finish(ok);
                    }
                });
                (e, after)
            })
        };
        self.reach(to, a.key, go)
            .inspect_err(|_| give_back(tx.as_ref(), reserved))
    }

    fn peek(&self, ep: u16, a: PeekArgs) -> Result<(), PostError> {
        {
            let mut st = lock(&self.state);
            let core = core_mut(&mut st, ep)?;
            let reserved = reserve(core.targets.rx.as_ref())?;
            let want = Want {
                from: a.from,
                tag: a.tag,
                ignore: a.ignore,
            };
            // A discard without a claim of the caller's claims under a
            // name of its own, which no caller's context can be (it is
            // odd, and contexts are aligned pointers).
            let claim = ClaimId(if a.discard && !a.claim {
                u64::MAX
            } else {
                a.context
            });
            let found = core
                .rdm
                .peek(&want, (a.claim || a.discard).then_some(claim));
            if a.discard && found.is_some() {
                core.rdm.discard_claimed(claim);
            }
            let op = Op {
                context: a.context,
                recv: true,
                space: Space::Tagged(a.tag),
                mem: None,
                completion: true,
                reserved,
                multi: false,
                eager: None,
                reg: None,
                _body: None,
            };
            match found {
                Some((h, data)) => {
                    complete_recv(&core.targets, &op, Outcome::Done, &peeked(&h, data))
                }
                None => {
                    let entry = Entry {
                        context: a.context,
                        flags: RECV | TAGGED,
                        source: NOT_AVAIL,
                        ..Entry::default()
                    };
                    let e = failed(entry, sys::FI_ENOMSG, ProvErr::None, 0);
                    deliver(core.targets.rx.as_ref(), reserved, true, Err(e));
                }
            }
        }
        drive(&self.btl, &self.state, ep);
        Ok(())
    }

    fn take_claimed(&self, ep: u16, a: RecvArgs, discard: bool) -> Result<(), PostError> {
        {
            let mut st = lock(&self.state);
            let core = core_mut(&mut st, ep)?;
            let reserved = reserve(core.targets.rx.as_ref())?;
            let claim = ClaimId(a.context);
            let op = core.next_op;
            let taken = if discard {
                core.rdm.discard_claimed(claim)
            } else {
                let single = RecvArgs { multi: None, ..a };
                core.ops.insert(op, Op::receive(&single, reserved));
                core.next_op += 1;
                core.rdm
                    .take_claimed(op, claim, a.mem.map_or(0, |m| m.len()))
            };
            if !taken {
                core.ops.remove(&op);
                give_back(core.targets.rx.as_ref(), reserved);
                return Err(PostError::Invalid(
                    "no message is claimed for this context".into(),
                ));
            }
            if discard {
                let entry = Entry {
                    context: a.context,
                    flags: RECV | space_flag(a.space),
                    source: NOT_AVAIL,
                    ..Entry::default()
                };
                deliver(core.targets.rx.as_ref(), reserved, a.completion, Ok(entry));
            }
        }
        drive(&self.btl, &self.state, ep);
        Ok(())
    }

    fn cancel(&self, ep: u16, context: u64) -> bool {
        let found = {
            let mut st = lock(&self.state);
            let Some(core) = st.eps.get_mut(&ep) else {
                return false;
            };
            let mut ours: Vec<OpRef> = core
                .ops
                .iter()
                .filter(|(_, o)| o.recv && o.context == context)
                .map(|(&op, _)| op)
                .collect();
            ours.sort_unstable();
            ours.into_iter().any(|op| core.rdm.cancel_recv(op))
        };
        if found {
            drive(&self.btl, &self.state, ep);
        }
        found
    }

    fn in_flight(&self, ep: u16) -> (usize, usize, usize) {
        lock(&self.state)
            .eps
            .get(&ep)
            .map_or((0, 0, 0), |c| c.rdm.in_flight())
    }
    fn atomics(&self) -> bool {
        self.btl.caps().atomics
    }

    fn stats(&self) -> xrcbtl_btl::BtlStats {
        self.btl.stats()
    }

    fn rcache_stats(&self) -> xrcbtl_fabric::rcache::Stats {
        self.btl.rcache_stats()
    }

    fn register_region(&self, mem: UserMem, access: Access) -> xrcbtl_fabric::Result<Region> {
        let max = self.btl.caps().max_mr_size;
        let (addr, len) = (mem.addr() as u64, mem.len() as u64);
        let readable = if access.contains(Access::REMOTE_READ) {
            READABLE
        } else {
            0
        };
        if keys::fits(addr, len, max) {
            let reg = self.btl.register_exact(mem, access)?;
            return Ok(Region {
                key: u64::from(reg.remote().rkey) | readable,
                regs: vec![reg],
            });
        }
        let ranges = keys::cut(addr, len, max);
        // A peer learns the chunks in one message.
        if HEADER_MAX + ranges.len() * keys::CHUNK_BYTES > self.eager_max + HEADER_MAX {
            return Err(xrcbtl_fabric::Error::invalid(format!(
                "{len} bytes take {} device regions, more than one key can name",
                ranges.len()
            )));
        }
        let mut regs = Vec::with_capacity(ranges.len());
        for (a, l) in ranges {
            let reg = mem
                .slice((a - addr) as usize, l as usize)
                .and_then(|m| self.btl.register_exact(m, access));
            match reg {
                Ok(r) => regs.push(r),
                Err(e) => {
                    for r in regs {
                        let _ = self.btl.deregister_mem(r);
                    }
                    return Err(e);
                }
            }
        }
        let chunks = regs
            .iter()
            .map(|r| Chunk {
                addr: r.addr(),
                len: r.len(),
                rkey: r.remote().rkey,
            })
            .collect();
        let key = lock(&self.lookups).add(chunks) | readable;
        Ok(Region { key, regs })
    }

    fn deregister_region(&self, region: Region) {
        if region.key & COMPOUND != 0 {
            lock(&self.lookups).remove(region.key & !READABLE);
        }
        for reg in region.regs {
            let _ = self.btl.deregister_mem(reg);
        }
    }

    fn progress(&self) -> usize {
        self.btl.progress()
    }

    fn add_peer(&self, peer: &Peer) -> xrcbtl_fabric::Result<()> {
        self.btl.add_procs(std::slice::from_ref(peer))
    }
}

impl<C: Context> Drop for Engine<C> {
    fn drop(&mut self) {
        self.btl.deregister_am(AM_TAG);
    }
}

/// The endpoint an address vector number names.
fn peer_of(targets: &Targets, number: u64) -> Result<PeerEp, PostError> {
    let av = targets
        .av
        .as_ref()
        .ok_or(PostError::State("no address vector bound"))?;
    let (peer, _) = lock(av).lookup(number).map_err(|_| PostError::NoAddress)?;
    Ok(peer)
}

/// Endpoint `ep`'s state.
fn core_mut(st: &mut State, ep: u16) -> Result<&mut EpCore, PostError> {
    st.eps
        .get_mut(&ep)
        .ok_or(PostError::State("no such endpoint"))
}

/// Gives back the place a post took in `cq` (if it took one) when the
/// operation did not start.
fn give_back(cq: Option<&SharedCq>, reserved: bool) {
    if let (true, Some(cq)) = (reserved, cq) {
        lock(cq).unreserve();
    }
}

/// Takes a place in `cq`, if there is one: Again when it is full.
fn reserve(cq: Option<&SharedCq>) -> Result<bool, PostError> {
    match cq {
        None => Ok(false),
        Some(cq) => {
            if lock(cq).reserve() {
                Ok(true)
            } else {
                Err(PostError::Again)
            }
        }
    }
}

/// Sends a write's notice (its remote CQ data) to the target, if it has
/// one; false if the target cannot be told.
fn notify<C: Context>(btl: &Btl<C>, to: u32, notice: Option<&[u8]>) -> bool {
    notice.is_none_or(|h| btl.send(to, AM_TAG, h, &[]).is_ok())
}

/// A message of the provider's from rank `src`.
fn arrive<C: Context>(
    btl: &Btl<C>,
    state: &Arc<Mutex<State>>,
    lookups: &Mutex<Lookups<C>>,
    src: u32,
    bytes: &[u8],
) {
    let Ok((msg, payload)) = crate::wire::Msg::decode(bytes) else {
        // A malformed header names no endpoint to tell: dropped.
        return;
    };
    match msg {
        crate::wire::Msg::KeyQuery { common, key } => {
            return answer_key(btl, lookups, src, common, key)
        }
        crate::wire::Msg::KeyReply { key, status, .. } => {
            let chunks = match status {
                0 => keys::decode(payload),
                s => Err(format!("rank {src} has no key {key:#x} (status {s})")),
            };
            let (waiting, reach) = lock(lookups).answer(src, key, chunks);
            for w in waiting {
                w(btl, reach.clone());
            }
            return;
        }
        _ => {}
    }
    let ep = msg.common().dst_ep;
    {
        let mut st = lock(state);
        let Some(core) = st.eps.get_mut(&ep) else {
            return;
        };
        if let crate::wire::Msg::WriteData { data, common } = msg {
            remote_write(core, src, common.src_ep, data);
            return;
        }
        let peer = PeerEp {
            domain: src,
            ep: msg.common().src_ep,
        };
        let source = match &core.targets.av {
            Some(av) => match lock(av).source(&peer) {
                NOT_AVAIL => Source::Unknown,
                n => Source::Known(n),
            },
            None => Source::Unknown,
        };
        // A malformed message is dropped. One over the budget is dropped
        // too (the Rdm has answered its sender where one waits), and the
        // endpoint's owner hears of it.
        if let Err(RdmError::OverBudget) = core.rdm.handle_message(src, source, bytes) {
            let tagged = msg.common().flags & crate::wire::flags::TAGGED != 0;
            let entry = Entry {
                flags: RECV | if tagged { TAGGED } else { MSG },
                source: match source {
                    Source::Known(n) => n,
                    Source::Unknown => NOT_AVAIL,
                },
                ..Entry::default()
            };
            let e = failed(entry, sys::FI_EOVERRUN, ProvErr::Overrun, 0);
            deliver(core.targets.rx.as_ref(), false, true, Err(e));
            count(&core.targets, RECV, false);
        }
    }
    drive(btl, state, ep);
}

/// Answers rank `src`'s question about this domain's compound key `key`.
fn answer_key<C: Context>(
    btl: &Btl<C>,
    lookups: &Mutex<Lookups<C>>,
    src: u32,
    asked: crate::wire::Common,
    key: u64,
) {
    let chunks = lock(lookups).mine(key);
    let mut header = Vec::with_capacity(24);
    crate::wire::Msg::KeyReply {
        common: crate::wire::Common {
            flags: 0,
            dst_ep: asked.src_ep,
            src_ep: asked.dst_ep,
        },
        key,
        status: u32::from(chunks.is_none()),
    }
    .encode(&mut header);
    let mut payload = Vec::new();
    if let Some(c) = chunks {
        keys::encode(&c, &mut payload);
    }
    // A peer that cannot be answered is failing: its error fails its work.
    let _ = btl.send(src, AM_TAG, &header, &payload);
}

/// A peer's write with remote CQ data landed in this endpoint's memory:
/// a receive completion with the data, taking no posted receive (the
/// provider asks no FI_RX_CQ_DATA of the caller), and the remote-write
/// counters.
fn remote_write(core: &EpCore, src: u32, src_ep: u16, data: u64) {
    let peer = PeerEp {
        domain: src,
        ep: src_ep,
    };
    let source = core
        .targets
        .av
        .as_ref()
        .map_or(NOT_AVAIL, |av| lock(av).source(&peer));
    let entry = Entry {
        context: 0,
        flags: RMA | REMOTE_WRITE | REMOTE_CQ_DATA,
        data,
        source,
        ..Entry::default()
    };
    deliver(core.targets.rx.as_ref(), false, true, Ok(entry));
    count(&core.targets, REMOTE_WRITE, true);
}

/// What an action needs done outside the lock.
enum Work {
    Send {
        op: Option<OpRef>,
        to: u32,
        header: Vec<u8>,
        payload: Vec<u8>,
    },
    Expose {
        op: OpRef,
        mem: Option<UserMem>,
    },
    Read {
        read: u64,
        from: u32,
        remote: Exposed,
        mem: Option<UserMem>,
        len: usize,
    },
    ExposeRecv {
        grant: u64,
        mem: Option<UserMem>,
    },
    Write {
        msg_id: u64,
        to: u32,
        local: Option<MemReg>,
        remote: Exposed,
        len: usize,
    },
    Unexpose(MemReg),
}

/// Runs endpoint `ep`'s actions until it has none.
fn drive<C: Context>(btl: &Btl<C>, state: &Arc<Mutex<State>>, ep: u16) {
    loop {
        let work = {
            let mut st = lock(state);
            let Some(core) = st.eps.get_mut(&ep) else {
                return;
            };
            take_work(core)
        };
        if work.is_empty() {
            return;
        }
        for w in work {
            run(btl, state, ep, w);
        }
    }
}

/// Takes the endpoint's actions: what needs no BTL is done here (copies,
/// completions), the rest returned.
fn take_work(core: &mut EpCore) -> Vec<Work> {
    let mut work = Vec::new();
    while let Some(a) = core.rdm.poll_action() {
        match a {
            Action::Send {
                to,
                header,
                op,
                payload_len,
            } => {
                let payload = op
                    .and_then(|op| core.ops.get_mut(&op))
                    .and_then(|o| o.eager.take())
                    .map(|mut p| {
                        p.truncate(payload_len);
                        p
                    })
                    .unwrap_or_default();
                work.push(Work::Send {
                    op,
                    to: to.domain,
                    header,
                    payload,
                });
            }
            Action::Expose { op } => {
                let mem = core.ops.get(&op).and_then(|o| o.mem);
                work.push(Work::Expose { op, mem });
            }
            Action::CopyIn {
                recv,
                offset,
                bytes,
            } => {
                if let Some(m) = core.ops.get(&recv).and_then(|o| o.mem) {
                    // Within the receive (the Rdm cut it to fit).
                    let _ = m.write(offset, &bytes);
                }
            }
            Action::Read {
                read,
                from,
                remote,
                recv,
                offset,
                len,
            } => {
                let mem = place_of(core, recv, offset, len);
                work.push(Work::Read {
                    read,
                    from: from.domain,
                    remote,
                    mem,
                    len,
                });
            }
            Action::SendDone { op, outcome } => {
                if let Some(o) = core.ops.remove(&op) {
                    if let Some(reg) = o.reg {
                        work.push(Work::Unexpose(reg));
                    }
                    complete_send(&core.targets, &o, outcome);
                }
            }
            Action::RecvDone { recv, outcome, got } => {
                let done = match core.ops.get(&recv) {
                    Some(o) => {
                        complete_recv(&core.targets, o, outcome, &got);
                        got.released || !o.multi
                    }
                    None => false,
                };
                if done {
                    core.ops.remove(&recv);
                }
            }
            Action::Unexpose { op } => {
                if let Some(reg) = core.ops.get_mut(&op).and_then(|o| o.reg.take()) {
                    work.push(Work::Unexpose(reg));
                }
            }
            Action::ExposeRecv {
                grant,
                recv,
                offset,
                len,
            } => {
                let mem = place_of(core, recv, offset, len);
                work.push(Work::ExposeRecv { grant, mem });
            }
            Action::UnexposeRecv { grant } => {
                if let Some(reg) = core.grants.remove(&grant) {
                    work.push(Work::Unexpose(reg));
                }
            }
            Action::Write {
                msg_id,
                op,
                to,
                remote,
                len,
            } => {
                let local = core.ops.get(&op).and_then(|o| o.reg);
                work.push(Work::Write {
                    msg_id,
                    to: to.domain,
                    local,
                    remote,
                    len,
                });
            }
        }
    }
    work
}

/// `len` bytes at `offset` of receive `recv`'s buffer, where a large
/// message goes.
fn place_of(core: &EpCore, recv: OpRef, offset: usize, len: usize) -> Option<UserMem> {
    core.ops
        .get(&recv)
        .and_then(|o| o.mem)
        .and_then(|m| m.slice(offset, len).ok())
}

/// What a peek reports of the message it found: its header and remote
/// CQ data.
fn peeked(h: &Header, data: Option<u64>) -> Received {
    Received {
        from: h.from,
        tag: h.tag,
        len: h.len,
        offset: 0,
        data,
        released: true,
    }
}

fn space_flag(space: Space) -> u64 {
    match space {
        Space::Msg => MSG,
        Space::Tagged(_) => TAGGED,
    }
}

/// The error entry of an outcome other than Done.
fn error_of(entry: Entry, outcome: Outcome) -> ErrEntry {
    let (err, prov, olen) = match outcome {
        Outcome::Truncated(n) => (sys::FI_ETRUNC, ProvErr::Truncated, n),
        Outcome::Cancelled => (sys::FI_ECANCELED, ProvErr::Cancelled, 0),
        Outcome::PeerLost => (sys::FI_EIO, ProvErr::PeerLost, 0),
        Outcome::RemoteFailed(_) => (sys::FI_EIO, ProvErr::RemoteAccess, 0),
        Outcome::Done => (0, ProvErr::None, 0),
    };
    failed(entry, err, prov, olen)
}

/// An error completion: `err` (a positive FI_E* value), the provider's
/// detail, and the bytes that did not fit.
fn failed(entry: Entry, err: u32, prov: ProvErr, olen: usize) -> ErrEntry {
    ErrEntry {
        entry,
        olen,
        err: err as i32,
        prov_errno: prov as i32,
    }
}

fn count(targets: &Targets, flag: u64, ok: bool) {
    for (c, flags) in &targets.counters {
        if flags & flag != 0 {
            let mut c = lock(c);
            if ok {
                c.ok += 1;
            } else {
                c.err += 1;
            }
        }
    }
}

/// Delivers a completion to `cq`: into the place the post reserved, or
/// (a multi-receive buffer's later messages) a free one.
fn deliver(cq: Option<&SharedCq>, reserved: bool, wanted: bool, c: Result<Entry, ErrEntry>) {
    let Some(cq) = cq else { return };
    let mut q = lock(cq);
    match (reserved, wanted) {
        (true, true) => q.push(c),
        (true, false) => q.unreserve(),
        (false, true) => {
            // No place was promised: a full queue loses it (the caller
            // sized the queue below what it keeps in flight).
            let _ = q.try_push(c);
        }
        (false, false) => {}
    }
}

/// Completes an RMA or atomic operation (`flags`: FI_RMA or FI_ATOMIC,
/// with FI_READ or FI_WRITE, which also says the counters it counts in).
fn complete_one_sided(
    targets: &Targets,
    context: u64,
    flags: u64,
    reserved: bool,
    wanted: bool,
    ok: bool,
) {
    let entry = Entry {
        context,
        flags,
        source: NOT_AVAIL,
        ..Entry::default()
    };
    let c = if ok {
        Ok(entry)
    } else {
        Err(error_of(entry, Outcome::RemoteFailed(0)))
    };
    deliver(targets.tx.as_ref(), reserved, wanted || !ok, c);
    count(targets, flags & (READ | WRITE), ok);
}

fn complete_send(targets: &Targets, o: &Op, outcome: Outcome) {
    let entry = Entry {
        context: o.context,
        flags: SEND | space_flag(o.space),
        source: NOT_AVAIL,
        ..Entry::default()
    };
    let ok = outcome == Outcome::Done;
    let c = if ok {
        Ok(entry)
    } else {
        Err(error_of(entry, outcome))
    };
    deliver(targets.tx.as_ref(), o.reserved, o.completion || !ok, c);
    count(targets, SEND, ok);
}

fn complete_recv(targets: &Targets, o: &Op, outcome: Outcome, got: &Received) {
    let mut flags = RECV | space_flag(o.space);
    if got.data.is_some() {
        flags |= REMOTE_CQ_DATA;
    }
    if o.multi && got.released {
        flags |= MULTI_RECV;
    }
    let entry = Entry {
        context: o.context,
        flags,
        len: got.len,
        buf: o.mem.map_or(0, |m| (m.addr() + got.offset) as u64),
        data: got.data.unwrap_or(0),
        tag: got.tag,
        source: match got.from {
            Source::Known(n) => n,
            Source::Unknown => NOT_AVAIL,
        },
    };
    let ok = outcome == Outcome::Done;
    let c = if ok {
        Ok(entry)
    } else {
        Err(error_of(entry, outcome))
    };
    // A multi-receive buffer's place is its last completion's.
    let reserved = o.reserved && (!o.multi || got.released);
    deliver(targets.rx.as_ref(), reserved, o.completion || !ok, c);
    count(targets, RECV, ok);
}

/// Does one piece of work against the BTL and feeds the result back.
fn run<C: Context>(btl: &Btl<C>, state: &Arc<Mutex<State>>, ep: u16, w: Work) {
    match w {
        Work::Send {
            op,
            to,
            header,
            payload,
        } => {
            let ok = btl.send(to, AM_TAG, &header, &payload).is_ok();
            if let Some(op) = op {
                with_core(state, ep, |c| c.rdm.handle_sent(op, ok));
            }
        }
        Work::Expose { op, mem } => {
            let reg = mem.and_then(|m| btl.register_mem(m, Access::REMOTE_READ).ok());
            with_core(state, ep, |c| {
                let exposed = reg.map(|r| Exposed {
                    addr: r.addr(),
                    key: r.remote().rkey,
                });
                match c.ops.get_mut(&op) {
                    Some(o) => o.reg = reg,
                    None => {
                        if let Some(r) = reg {
                            // The endpoint moved on: give it back.
                            let _ = btl.deregister_mem(r);
                        }
                    }
                }
                c.rdm.handle_exposed(op, exposed);
            });
        }
        Work::Read {
            read,
            from,
            remote,
            mem,
            len,
        } => {
            let started = mem.and_then(|m| {
                let reg = btl.register_mem(m, Access::NONE).ok()?;
                let done = feed(state, ep, Some(reg), move |rdm, ok| {
                    rdm.handle_read(read, ok)
                });
                match btl.get(from, remote_at(remote, len), reg.at(0), len, Some(done)) {
                    Ok(_) => Some(()),
                    Err(_) => {
                        let _ = btl.deregister_mem(reg);
                        None
                    }
                }
            });
            if started.is_none() {
                with_core(state, ep, |c| c.rdm.handle_read(read, false));
            }
        }
        Work::ExposeRecv { grant, mem } => {
            let reg = mem.and_then(|m| btl.register_mem(m, Access::REMOTE_WRITE).ok());
            let open = with_core(state, ep, |c| {
                let exposed = reg.map(|r| Exposed {
                    addr: r.addr(),
                    key: r.remote().rkey,
                });
                if let Some(r) = reg {
                    c.grants.insert(grant, r);
                }
                c.rdm.handle_recv_exposed(grant, exposed);
            });
            if let (Some(r), None) = (reg, open) {
                // The endpoint closed meanwhile: give it back.
                let _ = btl.deregister_mem(r);
            }
        }
        Work::Write {
            msg_id,
            to,
            local,
            remote,
            len,
        } => {
            let started = local.and_then(|reg| {
                let done = feed(state, ep, None, move |rdm, ok| {
                    rdm.handle_written(msg_id, ok)
                });
                btl.put(to, reg.at(0), remote_at(remote, len), len, Some(done))
                    .ok()
            });
            if started.is_none() {
                with_core(state, ep, |c| c.rdm.handle_written(msg_id, false));
            }
        }
        Work::Unexpose(reg) => {
            let _ = btl.deregister_mem(reg);
        }
    }
}

/// The start of `len` bytes of a peer's registered memory.
fn remote_at(remote: Exposed, len: usize) -> xrcbtl_btl::RemotePtr {
    RemoteMem {
        addr: remote.addr,
        len: len as u64,
        rkey: remote.key,
    }
    .at(0)
}

/// The completion of a read or write of a rendezvous: gives `release`
/// back, tells endpoint `ep`'s protocol how it went, and runs what follows.
fn feed<C: Context>(
    state: &Arc<Mutex<State>>,
    ep: u16,
    release: Option<MemReg>,
    tell: impl FnOnce(&mut Rdm, bool) + Send + 'static,
) -> xrcbtl_btl::OnDone<C> {
    let weak = Arc::downgrade(state);
    Box::new(move |btl: &Btl<C>, _, r: xrcbtl_btl::OpResult| {
        if let Some(reg) = release {
            let _ = btl.deregister_mem(reg);
        }
        if let Some(state) = weak.upgrade() {
            with_core(&state, ep, |c| tell(&mut c.rdm, r.is_ok()));
            drive(btl, &state, ep);
        }
    })
}

/// Runs `f` on endpoint `ep`'s state; `None` if the endpoint is closed.
fn with_core<R>(state: &Arc<Mutex<State>>, ep: u16, f: impl FnOnce(&mut EpCore) -> R) -> Option<R> {
    lock(state).eps.get_mut(&ep).map(f)
}

#[cfg(test)]
mod tests;
