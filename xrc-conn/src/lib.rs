//! The connection manager of xrcbtl, as protocol logic without I/O.
//!
//! [`ConnManager`] decides; a driver acts. The driver feeds it events (a CM
//! event, a QP that failed, a TGT QP that was created, a timer) with
//! [`ConnManager::handle`], asks for work with [`ConnManager::poll_action`]
//! (create a QP, send a CM request, open a TGT QP), for news for the BTL with
//! [`ConnManager::poll_notice`] (an endpoint is ready, lost, failed) and for
//! the next timer with [`ConnManager::poll_timeout`]. Fabric objects are named
//! by references the manager allocates ([`QpRef`], [`CmRef`], [`TgtRef`]) and
//! the driver maps onto real ones. Time is passed in; nothing here blocks,
//! allocates fabric resources or reads a clock, so every race is a fast,
//! deterministic test.
//!
//! # XRC mode
//! One XRC INI QP per remote node carries every endpoint of this process to
//! that node. It is connected through the RDMA CM to the first rank wanted
//! there, the *anchor*, which creates an XRC TGT QP for it and answers with
//! its SRQ numbers. Every other rank of the node is reached with a QP-less
//! `Reuse` request: the rank *registers* the TGT QP (opens it by number)
//! before any data flows, and answers with its SRQ numbers, or `NotReady` if
//! the TGT QP is gone, in which case the INI QP is rebuilt.
//!
//! TGT QPs live exactly as long as some rank holds them, and dead ones do
//! not pile up, without any heartbeat: the anchor's CM connection is the
//! liveness link. If the sender goes (exit or crash), the anchor hears a
//! disconnect and breaks the TGT QP, whose error reaches every holder, and
//! each lets go. If the anchor goes, the sender hears a disconnect, tells one
//! remaining holder to break the TGT QP, and reconnects on next use. A TGT
//! QP error makes every holder let go and every sender's endpoints through it
//! fail over to a fresh connection on their next use. A rank that exits
//! cleanly first tells the processes sending to it to stop (`Leave`), so that
//! no message reaches an SRQ that is gone.
//!
//! # RC mode
//! Without XRC (read from the device caps: iWARP, rxe) each peer gets an RC
//! QP, receiving through the rank's SRQ, with the same API. When both sides
//! connect at once, the lower rank's request wins. On iWARP the initiator
//! sends a zero-length message first and the responder's endpoint becomes
//! ready only once it has heard from the initiator (MPA peer-to-peer mode
//! done by the BTL).
//!
//! This crate may not depend on any other crate of the workspace.

#![warn(missing_docs)]
#![forbid(unsafe_code)]

mod tgts;
pub mod wire;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::net::SocketAddr;
use std::time::Duration;

use tgts::{Tgt, Tgts};
use wire::{Kind, Msg, Reason};

/// A rank of the job.
pub type Rank = u32;
/// A node of the job.
pub type Node = u32;

macro_rules! reference {
    ($(#[$m:meta])* $name:ident) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(pub u64);
    };
}

reference!(
    /// A QP the driver creates on request (XRC INI or RC).
    QpRef
);
reference!(
    /// An RDMA CM id the driver creates on request, or hands over with a
    /// connect request.
    CmRef
);
reference!(
    /// A handle on an XRC TGT QP (created or opened).
    TgtRef
);
reference!(
    /// A cached address resolution of a remote node.
    RouteRef
);

/// CM exchanges a process has in flight at once by default
/// ([`Config::connect_window`]).
pub const DEFAULT_CONNECT_WINDOW: usize = 64;

/// How long a clean exit waits by default for the next of its `Leave`
/// exchanges to end ([`Config::leave_timeout`]).
pub const DEFAULT_LEAVE_TIMEOUT: Duration = Duration::from_millis(500);

/// Which transport the manager builds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// XRC: INI QP per node, TGT QPs, SRQ numbers.
    Xrc,
    /// RC + SRQ: a QP per peer. `p2p` enforces iWARP's initiator-first rule.
    Rc {
        /// The transport is iWARP: the initiator speaks first.
        p2p: bool,
    },
}

/// What the manager is configured with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// This process's rank.
    pub rank: Rank,
    /// This process's node.
    pub node: Node,
    /// Job id, checked in every message.
    pub job: u32,
    /// Transport.
    pub mode: Mode,
    /// This rank's XRC SRQ numbers by size class (XRC mode).
    pub srqns: Vec<u32>,
    /// Send-queue entries an INI QP has per endpoint it may carry: it is
    /// created with this many per rank known on its node (most devices
    /// cannot grow a connected QP's send queue), and asks to grow when more
    /// endpoints join than were known.
    pub sq_per_endpoint: u32,
    /// Fewest send-queue entries a QP is created with: 256, room for a
    /// window of 64 messages in flight to one peer (osu_bw's) with what
    /// they bring along (RTS, rendezvous writes and FINs or reads, credit
    /// messages, unsignalled requests not yet known complete); 64 made
    /// such a window wait for the send queue.
    pub sq_initial: u32,
    /// Largest send queue the device allows.
    pub sq_max: u32,
    /// Connection attempts after the first, before endpoints fail.
    pub max_retries: u32,
    /// First back-off before a retry; doubles on each.
    pub backoff_base: Duration,
    /// Largest back-off.
    pub backoff_max: Duration,
    /// How long a clean exit waits for the next of its `Leave` exchanges
    /// to end (acknowledged, or failed); each one that ends gives it that
    /// long again. A process with a million peers takes longer to tell
    /// them all than any fixed time (its `Leave`s go through the window of
    /// [`Config::connect_window`]); one whose peers are silent gives up
    /// after this long.
    pub leave_timeout: Duration,
    /// CM exchanges this process starts (connect, reuse and leave
    /// requests) that may be in flight at once, from the address query to
    /// the answer; the others wait their turn in order. 0: no limit.
    ///
    /// A process that connects to a million peers at once would otherwise
    /// have a million answers queued at its own node's CM agent, behind
    /// the requests of every other process: past the CM's timeout (4 s for
    /// the RDMA CM) each request is sent again, and CM traffic grows
    /// faster than the job. 64 exchanges in flight keep a CM agent that
    /// takes microseconds per message busy over a round trip of hundreds.
    pub connect_window: usize,
}

impl Config {
    /// A configuration with the usual values.
    pub fn new(rank: Rank, node: Node, job: u32, mode: Mode, srqns: Vec<u32>) -> Self {
        Config {
            rank,
            node,
            job,
            mode,
            srqns,
            sq_per_endpoint: 16,
            sq_initial: 256,
            sq_max: 16_384,
            max_retries: 5,
            backoff_base: Duration::from_millis(2),
            backoff_max: Duration::from_millis(200),
            leave_timeout: DEFAULT_LEAVE_TIMEOUT,
            connect_window: DEFAULT_CONNECT_WINDOW,
        }
    }
}

/// What a QP the driver creates is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpKind {
    /// XRC INI QP (send only).
    Ini,
    /// RC QP receiving through the rank's SRQ.
    Rc,
}

/// Work for the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Create a QP with this send-queue depth; report failure with
    /// [`Event::QpCreateFailed`].
    CreateQp {
        /// Reference to map.
        qp: QpRef,
        /// Kind.
        kind: QpKind,
        /// Send-queue depth.
        sq_depth: u32,
    },
    /// Grow a QP's send queue (endpoints joined). Best effort: a device that
    /// cannot resize keeps the old depth and the BTL's pending queue absorbs
    /// the excess.
    ResizeQp {
        /// The QP.
        qp: QpRef,
        /// New depth.
        sq_depth: u32,
    },
    /// Destroy a QP.
    DestroyQp {
        /// The QP.
        qp: QpRef,
    },
    /// Create an XRC TGT QP in the node's domain; answer with
    /// [`Event::TgtCreated`] or [`Event::TgtCreateFailed`].
    CreateTgt {
        /// Reference to map.
        tgt: TgtRef,
    },
    /// Open (register with) the TGT QP `qpn`; answer with
    /// [`Event::TgtOpened`].
    OpenTgt {
        /// Reference to map.
        tgt: TgtRef,
        /// Its number.
        qpn: u32,
    },
    /// Close this process's handle on a TGT QP (unregister).
    CloseTgt {
        /// The handle.
        tgt: TgtRef,
    },
    /// Move a TGT QP to the error state so every holder hears of it.
    BreakTgt {
        /// The handle.
        tgt: TgtRef,
    },
    /// Create a CM id and resolve `rank`'s address and route (from the
    /// cached route if given); answer with [`Event::Resolved`] or
    /// [`Event::ResolveFailed`].
    Resolve {
        /// Reference to map.
        cm: CmRef,
        /// Whose listener.
        rank: Rank,
        /// A cached resolution of the rank's node.
        route: Option<RouteRef>,
    },
    /// Send a connection request (with a QP, or QP-less).
    Connect {
        /// The resolved id.
        cm: CmRef,
        /// The QP to connect.
        qp: Option<QpRef>,
        /// Private data.
        data: Vec<u8>,
    },
    /// Accept a request.
    Accept {
        /// The request's id.
        cm: CmRef,
        /// An RC QP to connect.
        qp: Option<QpRef>,
        /// A TGT QP to connect.
        tgt: Option<TgtRef>,
        /// Private data.
        data: Vec<u8>,
    },
    /// Reject a request (also the carrier of QP-less replies).
    Reject {
        /// The request's id.
        cm: CmRef,
        /// Private data.
        data: Vec<u8>,
    },
    /// Destroy a CM id (disconnecting it if connected).
    DestroyCm {
        /// The id.
        cm: CmRef,
    },
    /// Post the initiator's first, zero-length send (iWARP).
    SendHello {
        /// The RC QP.
        qp: QpRef,
    },
}

/// How to reach a ready peer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Path {
    /// The QP to post on (INI QP shared per node, or the peer's RC QP).
    pub qp: QpRef,
    /// The peer's SRQ numbers by size class (XRC; empty in RC mode).
    pub srqns: Vec<u32>,
}

/// Why an endpoint failed for good.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailReason {
    /// The peer refused (wrong job, rank, version...).
    Refused(Reason),
    /// No answer after every retry.
    Unreachable,
    /// Nobody listens at its address any more: its process is gone.
    NoListener,
    /// Resources could not be created.
    NoResource,
}

/// News for the BTL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Notice {
    /// Messages to `rank` may be posted on `path`.
    Ready {
        /// The peer.
        rank: Rank,
        /// How to reach it.
        path: Path,
    },
    /// The path to `rank` broke; it is rebuilt when the BTL next asks (the
    /// BTL asks at once: a peer that died is then found failed).
    Lost {
        /// The peer.
        rank: Rank,
    },
    /// `rank` left cleanly: nothing more may be sent to it.
    Closed {
        /// The peer.
        rank: Rank,
    },
    /// `rank` cannot be reached.
    Failed {
        /// The peer.
        rank: Rank,
        /// Why.
        reason: FailReason,
    },
    /// The clean exit is complete: the driver may tear everything down.
    Drained,
    /// `rank`, which this rank does not know, asks for a connection (an MPI
    /// library adds its peers lazily, when it first sends to them). The
    /// request waits: [`ConnManager::add_peer`] serves it,
    /// [`ConnManager::unknown_peer`] refuses it.
    UnknownPeer {
        /// The peer.
        rank: Rank,
    },
    /// A connection request was turned away (a stranger's, a stale one, a
    /// crossing one, one from a failed or leaving peer...).
    Refused {
        /// The rank it claimed to come from, if it could be read.
        rank: Option<Rank>,
        /// Why.
        reason: Reason,
    },
}

/// Why a CM request got no connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmFailure {
    /// The peer's application rejected, with private data.
    Rejected,
    /// Nobody listens there.
    NoListener,
    /// No answer, or the exchange broke.
    Unreachable,
    /// The peer's CM turned the request away unread because it holds
    /// another with the same (QP number, sending HCA) (IB stale
    /// connection): retried like a lost request.
    Stale,
}

/// Input from the driver.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// A QP could not be created.
    QpCreateFailed {
        /// The QP.
        qp: QpRef,
    },
    /// A TGT QP was created.
    TgtCreated {
        /// The handle.
        tgt: TgtRef,
        /// Its number.
        qpn: u32,
    },
    /// A TGT QP could not be created.
    TgtCreateFailed {
        /// The handle.
        tgt: TgtRef,
    },
    /// A TGT QP was opened (`ok`), or is gone.
    TgtOpened {
        /// The handle.
        tgt: TgtRef,
        /// Whether it exists.
        ok: bool,
    },
    /// Address and route resolved.
    Resolved {
        /// The id.
        cm: CmRef,
        /// The driver's cache entry for the rank's node.
        route: RouteRef,
    },
    /// Resolution failed.
    ResolveFailed {
        /// The id.
        cm: CmRef,
    },
    /// A request reached this rank's listener on a new id.
    Request {
        /// The new id.
        cm: CmRef,
        /// Its private data.
        data: Vec<u8>,
        /// Where it came from, where the CM says (the requesting side's IP
        /// address and CM port; not said for native InfiniBand addresses).
        from: Option<SocketAddr>,
    },
    /// A connection is established.
    Established {
        /// The id.
        cm: CmRef,
        /// The reply's private data (initiator side).
        data: Vec<u8>,
    },
    /// A request failed.
    Failed {
        /// The id.
        cm: CmRef,
        /// How.
        how: CmFailure,
        /// The reject's private data.
        data: Vec<u8>,
    },
    /// A connection was closed by the peer (or its kernel).
    Disconnected {
        /// The id.
        cm: CmRef,
    },
    /// A QP broke (an error completion or a fatal async event).
    QpFailed {
        /// The QP.
        qp: QpRef,
    },
    /// A TGT QP reported an error (fatal, request, access, last WQE).
    TgtFailed {
        /// The handle.
        tgt: TgtRef,
    },
    /// The first message arrived on an RC QP (iWARP responder).
    FirstReceive {
        /// The QP.
        qp: QpRef,
    },
}

/// Counters users and tests can read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Counters {
    /// Endpoints made ready (each time one is: a rebuilt one counts again).
    pub ready: u64,
    /// INI (or RC) QPs created.
    pub qps_created: u64,
    /// INI (or RC) QPs destroyed.
    pub qps_destroyed: u64,
    /// INI QPs rebuilt (TGT gone, anchor gone).
    pub rebuilds: u64,
    /// Anchors replaced by another rank of their node (the anchor's process
    /// gone or never answering).
    pub reanchors: u64,
    /// Requests the peer's CM turned away as stale connections (the same
    /// announced QP number from the same HCA still held there).
    pub stale_rejects: u64,
    /// Send-queue growths asked for.
    pub sq_resizes: u64,
    /// TGT QPs created (as anchor).
    pub tgt_created: u64,
    /// TGT QPs opened (registrations).
    pub tgt_opened: u64,
    /// TGT handles closed (unregistrations).
    pub tgt_closed: u64,
    /// TGT QPs broken on purpose (dead sender or anchor).
    pub tgt_broken: u64,
    /// Connection retries.
    pub retries: u64,
    /// Endpoints lost (to fail over on next use).
    pub lost: u64,
    /// Address resolutions asked for.
    pub resolves: u64,
    /// Resolutions served from the node cache.
    pub route_hits: u64,
    /// Leave messages sent.
    pub leaves_sent: u64,
    /// Leave messages received.
    pub leaves_received: u64,
    /// Leave exchanges a clean exit gave up on ([`Config::leave_timeout`]).
    pub leaves_abandoned: u64,
    /// CM exchanges that waited for room in the window
    /// ([`Config::connect_window`]).
    pub paced: u64,
    /// The most CM exchanges of this process in flight at once.
    pub peak_in_flight: u64,
    /// Refusals sent, by reason.
    pub refused_sent: BTreeMap<Reason, u64>,
    /// Refusals received, by reason.
    pub refused_received: BTreeMap<Reason, u64>,
}

// ---- internal state ----------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum IniState {
    /// Waiting for a back-off timer before trying.
    Backoff,
    /// Resolving the anchor's address.
    Resolving,
    /// Connect request sent.
    Connecting,
    /// Connected to the anchor's TGT QP.
    Connected,
}

/// A sending QP: XRC INI per node, or RC per peer.
#[derive(Debug)]
struct Ini {
    node: Node,
    qp: QpRef,
    state: IniState,
    cm: Option<CmRef>,
    anchor: Rank,
    tgt_qpn: u32,
    tag: u32,
    /// Endpoints carried.
    users: BTreeSet<Rank>,
    sq_depth: u32,
    retries: u32,
    retry_at: Option<Duration>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EpState {
    /// Waiting for the INI QP of its node (or a retry).
    WaitIni,
    /// Resolving for a reuse or a leave.
    Resolving,
    /// Reuse request out.
    Reusing,
    /// RC: connect request out (or accepted, waiting to establish).
    Connecting,
    /// RC responder on iWARP: accepted, waiting for the initiator's first
    /// message.
    WaitHello,
    /// Usable.
    Ready,
    /// Broken; rebuilt when wanted.
    Lost,
    /// The peer left.
    Closed,
    /// Unreachable for good.
    Failed,
}

#[derive(Debug)]
struct Endpoint {
    state: EpState,
    /// XRC: the node's INI; RC: the endpoint's own QP (as an `Ini`).
    ini: Option<u64>,
    srqns: Vec<u32>,
    cm: Option<CmRef>,
    retries: u32,
    retry_at: Option<Duration>,
    /// RC: whether this side initiated (and must speak first on iWARP).
    initiator: bool,
    /// RC responder on iWARP: the initiator's first message arrived (it can
    /// overtake the CM's own confirmation).
    heard: bool,
    /// RC: connections with the peer that came up so far. Each request
    /// carries it, so that a request the peer sent before the connection
    /// now up (crossing ours, then dropped at its side) is told from a
    /// peer that lost that connection and connects again.
    epoch: u32,
}

/// A request being served that waits for a TGT QP.
#[derive(Debug)]
struct Pending {
    cm: CmRef,
    msg: Msg,
    tgt: TgtRef,
}

/// What a CM id of ours is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum CmUse {
    /// The anchor connection of an INI (or an RC endpoint's connection).
    Anchor { ini: u64 },
    /// A reuse request for an endpoint.
    Reuse { rank: Rank },
    /// A leave message to a rank (tgt: the TGT declared dead, or 0); sent
    /// again when the peer's CM turned it away unread (`attempt` counts).
    Leave { rank: Rank, tgt: u32, attempt: u32 },
    /// A request we received and are serving or have accepted.
    Served { peer: Rank },
}

/// Whose retry a timer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// An INI's (by its key).
    Ini(u64),
    /// An endpoint's.
    Ep(Rank),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Running,
    Leaving { deadline: Duration },
    Done,
}

/// The connection manager of one process (see the crate documentation).
#[derive(Debug)]
pub struct ConnManager {
    cfg: Config,
    now: Duration,
    next_ref: u64,
    node_of: BTreeMap<Rank, Node>,
    /// Ranks known on each node (this one included), to size an INI QP for
    /// every endpoint it may carry when it is created.
    ranks_on: BTreeMap<Node, u32>,
    /// Boxed: most processes of a large job send to a few nodes, and a
    /// B-tree leaf holds room for eleven entries however few it has.
    inis: BTreeMap<u64, Box<Ini>>,
    /// XRC: the INI of each node.
    ini_of_node: BTreeMap<Node, u64>,
    /// Boxed, as `inis`: a B-tree of small entries packs better.
    eps: BTreeMap<Rank, Box<Endpoint>>,
    tgts: Tgts,
    pending: Vec<Pending>,
    /// Requests from ranks not known yet, waiting for `add_peer` or
    /// `unknown_peer`: the CM id and the private data.
    parked: Vec<(CmRef, Rank, Vec<u8>)>,
    /// Where the first parked request of each rank came from.
    sources: BTreeMap<Rank, SocketAddr>,
    cms: BTreeMap<CmRef, CmUse>,
    /// RC: which QP a peer's connection uses (for FirstReceive and failures).
    qp_owner: BTreeMap<QpRef, u64>,
    routes: BTreeMap<Node, RouteRef>,
    /// Nodes whose first route is being resolved: the id resolving it, and
    /// the ids (with their ranks) waiting to reuse it instead of asking
    /// the same question at once.
    resolving: BTreeMap<Node, (CmRef, Vec<(CmRef, Rank)>)>,
    /// Processes that send to this rank (they get `Leave` on a clean exit).
    senders: BTreeSet<Rank>,
    /// Failed peers told this rank is gone for them ([`ConnManager::disown`]).
    disowned: BTreeSet<Rank>,
    leaves_outstanding: BTreeSet<CmRef>,
    phase: Phase,
    actions: VecDeque<Action>,
    notices: VecDeque<Notice>,
    counters: Counters,
    /// Retry timers by when they are due: an INI's or an endpoint's
    /// `retry_at` when it was armed. An entry whose owner has since been
    /// disarmed, re-armed or removed is stale and skipped (dropped once its
    /// time has passed), so that neither asking for the next timer nor
    /// running the due ones scans every INI and endpoint: a rank with a
    /// million endpoints asks at every progress.
    timers: BTreeSet<(Duration, Timer)>,
    /// CM exchanges this process started that are in flight: from the
    /// address query to the answer (or until the id is dropped).
    in_flight: BTreeSet<CmRef>,
    /// Exchanges waiting for room in the window (never handed to the
    /// driver), with whom: ids are made in increasing order just before
    /// their exchange starts, so the first is the one waiting longest.
    waiting: BTreeMap<CmRef, Rank>,
}

impl ConnManager {
    /// A manager for one process. `peers` maps every rank of the job to its
    /// node.
    pub fn new(cfg: Config, peers: impl IntoIterator<Item = (Rank, Node)>) -> Self {
        assert!(cfg.srqns.len() <= wire::MAX_SRQS, "too many SRQ classes");
        let node_of: BTreeMap<Rank, Node> = peers.into_iter().collect();
        let mut ranks_on = BTreeMap::new();
        for n in node_of.values() {
            *ranks_on.entry(*n).or_insert(0) += 1;
        }
        ConnManager {
            cfg,
            now: Duration::ZERO,
            next_ref: 1,
            node_of,
            ranks_on,
            inis: BTreeMap::new(),
            ini_of_node: BTreeMap::new(),
            eps: BTreeMap::new(),
            tgts: Tgts::default(),
            pending: Vec::new(),
            parked: Vec::new(),
            sources: BTreeMap::new(),
            cms: BTreeMap::new(),
            qp_owner: BTreeMap::new(),
            routes: BTreeMap::new(),
            resolving: BTreeMap::new(),
            senders: BTreeSet::new(),
            disowned: BTreeSet::new(),
            leaves_outstanding: BTreeSet::new(),
            phase: Phase::Running,
            actions: VecDeque::new(),
            notices: VecDeque::new(),
            counters: Counters::default(),
            timers: BTreeSet::new(),
            in_flight: BTreeSet::new(),
            waiting: BTreeMap::new(),
        }
    }

    /// Makes a rank known (processes may join at any time), and serves
    /// the requests it made while unknown.
    pub fn add_peer(&mut self, rank: Rank, node: Node) {
        if let Some(old) = self.node_of.insert(rank, node) {
            if let Some(c) = self.ranks_on.get_mut(&old) {
                *c -= 1;
            }
        }
        *self.ranks_on.entry(node).or_insert(0) += 1;
        for (cm, _, data) in self.take_parked(Some(rank)) {
            self.on_request(cm, &data, None);
        }
    }

    /// Where the requests of `rank`, waiting while it is unknown
    /// ([`Notice::UnknownPeer`]), came from, where the CM said (the IP
    /// address is the peer's; the port is its CM id's, not its
    /// listener's).
    pub fn unknown_source(&self, rank: Rank) -> Option<SocketAddr> {
        self.sources.get(&rank).copied()
    }

    /// `rank` asked for a connection while unknown
    /// ([`Notice::UnknownPeer`]) and cannot be made known: its requests
    /// are refused (`WrongRank`).
    pub fn unknown_peer(&mut self, now: Duration, rank: Rank) {
        self.now = now;
        self.refuse_parked(Some(rank), Reason::WrongRank);
    }

    /// Takes the parked requests of `rank` (of every rank with `None`), in
    /// the order they came.
    fn take_parked(&mut self, rank: Option<Rank>) -> Vec<(CmRef, Rank, Vec<u8>)> {
        match rank {
            Some(r) => drop(self.sources.remove(&r)),
            None => self.sources.clear(),
        }
        let (taken, kept) = std::mem::take(&mut self.parked)
            .into_iter()
            .partition(|p| rank.is_none_or(|r| p.1 == r));
        self.parked = kept;
        taken
    }

    /// Refuses the parked requests of `rank` (of every rank with `None`).
    fn refuse_parked(&mut self, rank: Option<Rank>, reason: Reason) {
        for (cm, src, data) in self.take_parked(rank) {
            let tag = wire::peek_tag(&data);
            self.refuse(cm, src, tag, reason);
        }
    }

    // ---- getters -----------------------------------------------------------

    /// The configuration.
    pub fn config(&self) -> &Config {
        &self.cfg
    }

    /// Counters so far.
    pub fn counters(&self) -> &Counters {
        &self.counters
    }

    /// Live sending QPs (XRC: INI QPs, one per node at most).
    pub fn live_qps(&self) -> usize {
        self.inis.len()
    }

    /// TGT QP handles held.
    pub fn tgt_handles(&self) -> usize {
        self.tgts.len()
    }

    /// Endpoints by state name.
    pub fn endpoints_by_state(&self) -> BTreeMap<&'static str, usize> {
        let mut m = BTreeMap::new();
        for e in self.eps.values() {
            let name = match e.state {
                EpState::WaitIni => "waiting",
                EpState::Resolving | EpState::Reusing | EpState::Connecting => "connecting",
                EpState::WaitHello => "awaiting-first-message",
                EpState::Ready => "ready",
                EpState::Lost => "lost",
                EpState::Closed => "closed",
                EpState::Failed => "failed",
            };
            *m.entry(name).or_insert(0) += 1;
        }
        m
    }

    /// The path to `rank`, if ready.
    pub fn path(&self, rank: Rank) -> Option<Path> {
        let e = self.eps.get(&rank)?;
        if e.state != EpState::Ready {
            return None;
        }
        let ini = self.inis.get(&e.ini?)?;
        Some(Path {
            qp: ini.qp,
            srqns: e.srqns.clone(),
        })
    }

    /// The rank whose messages arrive on QP `qp`, while the manager holds
    /// it: the peer of an RC connection. (XRC INI QPs receive nothing:
    /// `None`.)
    pub fn peer_of_qp(&self, qp: QpRef) -> Option<Rank> {
        if self.cfg.mode == Mode::Xrc {
            return None;
        }
        let k = self.qp_owner.get(&qp)?;
        self.inis.get(k).map(|i| i.anchor)
    }

    /// The process that sends through TGT QP `tgt`, while this rank holds
    /// it: every message arriving on it comes from that rank.
    pub fn tgt_sender(&self, tgt: TgtRef) -> Option<Rank> {
        self.tgts.get(tgt).map(|t| t.sender)
    }

    /// CM exchanges this process started: in flight, and waiting for room
    /// in the window ([`Config::connect_window`]).
    pub fn exchanges(&self) -> (usize, usize) {
        (self.in_flight.len(), self.waiting.len())
    }

    /// Whether the clean exit has completed.
    pub fn is_drained(&self) -> bool {
        self.phase == Phase::Done
    }

    // ---- output ------------------------------------------------------------

    /// The next thing the driver must do.
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// The next news for the BTL.
    pub fn poll_notice(&mut self) -> Option<Notice> {
        self.notices.pop_front()
    }

    /// When [`ConnManager::handle_timeout`] must next be called.
    pub fn poll_timeout(&self) -> Option<Duration> {
        let retry = self
            .timers
            .iter()
            .find(|(t, k)| self.armed(*t, *k))
            .map(|(t, _)| *t);
        let leave = match self.phase {
            Phase::Leaving { deadline } => Some(deadline),
            _ => None,
        };
        retry.into_iter().chain(leave).min()
    }

    /// Whether the timer entry `(t, k)` is still its owner's.
    fn armed(&self, t: Duration, k: Timer) -> bool {
        let at = match k {
            Timer::Ini(k) => self.inis.get(&k).and_then(|i| i.retry_at),
            Timer::Ep(r) => self.eps.get(&r).and_then(|e| e.retry_at),
        };
        at == Some(t)
    }

    /// Arms the retry of `k` (an INI or an endpoint) at `at`.
    fn arm(&mut self, k: Timer, at: Duration) {
        let slot = match k {
            Timer::Ini(k) => self.inis.get_mut(&k).map(|i| &mut i.retry_at),
            Timer::Ep(r) => self.eps.get_mut(&r).map(|e| &mut e.retry_at),
        };
        if let Some(slot) = slot {
            *slot = Some(at);
            self.timers.insert((at, k));
        }
    }

    // ---- commands ----------------------------------------------------------

    /// The BTL wants to send to `rank`: build (or rebuild) the way there.
    /// [`Notice::Ready`] follows (at once, if it already exists).
    pub fn connect(&mut self, now: Duration, rank: Rank) {
        self.now = now;
        if self.phase != Phase::Running {
            return;
        }
        let node = match self.node_of.get(&rank) {
            Some(&node) if rank != self.cfg.rank => node,
            // Unknown, or itself (a rank reaches itself in process).
            _ => {
                self.notices.push_back(Notice::Failed {
                    rank,
                    reason: FailReason::Refused(Reason::WrongRank),
                });
                return;
            }
        };
        if let Some(e) = self.eps.get(&rank) {
            match e.state {
                EpState::Ready => {
                    let path = self.path(rank).expect("ready endpoints have a path");
                    self.notices.push_back(Notice::Ready { rank, path });
                    return;
                }
                EpState::Lost | EpState::Failed => {}
                // Closed peers left for good; in progress is in progress.
                _ => return,
            }
        }
        self.eps.insert(
            rank,
            Box::new(Endpoint {
                state: EpState::WaitIni,
                ini: None,
                srqns: Vec::new(),
                cm: None,
                retries: 0,
                retry_at: None,
                initiator: true,
                heard: false,
                epoch: 0,
            }),
        );
        match self.cfg.mode {
            Mode::Xrc => self.xrc_attach(rank, node),
            Mode::Rc { .. } => self.rc_start(rank, node),
        }
    }

    /// The BTL has given up on `rank` (it failed for good here) and yet
    /// hears from it: the peer, alive after all (a partition that outlasted
    /// the retries), still counts on this rank. It is told this rank is
    /// gone for it, once, as a leaving rank tells it: it stops sending and
    /// fails what waits on this rank instead of waiting forever.
    pub fn disown(&mut self, now: Duration, rank: Rank) {
        self.now = now;
        let failed = self
            .eps
            .get(&rank)
            .is_some_and(|e| e.state == EpState::Failed);
        if self.phase != Phase::Running || !failed || !self.disowned.insert(rank) {
            return;
        }
        self.send_leave(rank, 0);
    }

    /// Starts a clean exit: peers sending to this rank are told to stop, the
    /// anchor connections close (their TGT QPs get broken by the other side),
    /// and every handle is released. [`Notice::Drained`] follows.
    pub fn shutdown(&mut self, now: Duration) {
        self.now = now;
        if self.phase != Phase::Running {
            return;
        }
        self.phase = Phase::Leaving {
            deadline: now + self.cfg.leave_timeout,
        };
        // Nobody is served any more, known or not.
        self.refuse_parked(None, Reason::Leaving);
        // XRC: the ranks that send to this one (those it sends to hear of
        // it through their TGT QP's anchor). RC: every rank it has a
        // connection with, each way at once: without a word, a peer would
        // take the broken connection for a failure, rebuild it, find no
        // listener and report this rank failed.
        let peers: Vec<Rank> = match self.cfg.mode {
            Mode::Xrc => self.senders.iter().copied().collect(),
            Mode::Rc { .. } => self
                .eps
                .iter()
                .filter(|(_, e)| {
                    e.ini.is_some()
                        && matches!(
                            e.state,
                            EpState::Ready | EpState::WaitHello | EpState::Connecting
                        )
                })
                .map(|(r, _)| *r)
                .collect(),
        };
        for peer in peers {
            self.send_leave(peer, 0);
        }
        self.finish_leave_if_done();
    }

    // ---- input -------------------------------------------------------------

    /// Handles an event from the driver.
    pub fn handle(&mut self, now: Duration, ev: Event) {
        self.now = now;
        match ev {
            Event::QpCreateFailed { qp } => self.on_qp_create_failed(qp),
            Event::TgtCreated { tgt, qpn } => self.on_tgt_ready(tgt, Some(qpn)),
            Event::TgtCreateFailed { tgt } => self.on_tgt_ready(tgt, None),
            Event::TgtOpened { tgt, ok } => self.on_tgt_opened(tgt, ok),
            Event::Resolved { cm, route } => self.on_resolved(cm, route),
            Event::ResolveFailed { cm } => self.on_cm_failed(cm, CmFailure::Unreachable, &[]),
            Event::Request { cm, data, from } => self.on_request(cm, &data, from),
            Event::Established { cm, data } => self.on_established(cm, &data),
            Event::Failed { cm, how, data } => self.on_cm_failed(cm, how, &data),
            Event::Disconnected { cm } => self.on_disconnected(cm),
            Event::QpFailed { qp } => self.on_qp_failed(qp),
            Event::TgtFailed { tgt } => self.on_tgt_failed(tgt),
            Event::FirstReceive { qp } => self.on_first_receive(qp),
        }
    }

    /// Runs the timers due at `now`.
    pub fn handle_timeout(&mut self, now: Duration) {
        self.now = now;
        // INIs first, then endpoints, as they are due: an endpoint's retry
        // may find its node's INI rebuilt by the same timeout.
        let mut due = Vec::new();
        while let Some(&(t, k)) = self.timers.first() {
            if t > now {
                break;
            }
            self.timers.pop_first();
            if self.armed(t, k) {
                due.push(k);
            }
        }
        due.sort_by_key(|k| matches!(k, Timer::Ep(_)));
        for k in due {
            match k {
                Timer::Ini(k) => {
                    if let Some(i) = self.inis.get_mut(&k) {
                        i.retry_at = None;
                        self.start_anchor(k);
                    }
                }
                Timer::Ep(r) => {
                    if let Some(e) = self.eps.get_mut(&r) {
                        e.retry_at = None;
                        self.start_reuse(r);
                    }
                }
            }
        }
        if let Phase::Leaving { deadline } = self.phase {
            if now >= deadline {
                for cm in std::mem::take(&mut self.leaves_outstanding) {
                    self.counters.leaves_abandoned += 1;
                    self.drop_cm(cm);
                }
                self.finish_leave_if_done();
            }
        }
    }

    // ---- helpers -----------------------------------------------------------

    fn fresh(&mut self) -> u64 {
        let r = self.next_ref;
        self.next_ref += 1;
        r
    }

    fn msg(&self, kind: Kind, dst: Rank, tag: u32) -> Msg {
        Msg::new(kind, self.cfg.job, self.cfg.rank, dst, tag)
    }

    fn backoff(&self, retries: u32) -> Duration {
        let factor = 1u32 << retries.min(16);
        (self.cfg.backoff_base * factor).min(self.cfg.backoff_max)
    }

    /// Starts the CM exchange of `cm` with `rank` (an address query, then
    /// a request), or queues it if the window is full.
    fn resolve(&mut self, cm: CmRef, rank: Rank) {
        if self.window_full() {
            self.counters.paced += 1;
            self.waiting.insert(cm, rank);
            return;
        }
        self.launch(cm, rank);
    }

    /// Whether no more exchanges may start now.
    fn window_full(&self) -> bool {
        let w = self.cfg.connect_window;
        w != 0 && self.in_flight.len() >= w
    }

    fn launch(&mut self, cm: CmRef, rank: Rank) {
        self.in_flight.insert(cm);
        self.counters.peak_in_flight = self
            .counters
            .peak_in_flight
            .max(self.in_flight.len() as u64);
        let node = self.node_of[&rank];
        let route = self.routes.get(&node).copied();
        self.counters.resolves += 1;
        if route.is_some() {
            self.counters.route_hits += 1;
        } else if let Some((_, waiting)) = self.resolving.get_mut(&node) {
            // The node's route is being asked for: wait for the answer.
            waiting.push((cm, rank));
            return;
        } else {
            self.resolving.insert(node, (cm, Vec::new()));
        }
        self.actions.push_back(Action::Resolve { cm, rank, route });
    }

    /// The exchange of `cm` is over (answered, failed, or its id dropped):
    /// the next ones waiting start.
    fn exchange_over(&mut self, cm: CmRef) {
        if self.in_flight.remove(&cm) {
            self.admit();
        }
    }

    /// Starts waiting exchanges while the window has room.
    fn admit(&mut self) {
        while !self.window_full() {
            let Some((cm, rank)) = self.waiting.pop_first() else {
                return;
            };
            self.launch(cm, rank);
        }
    }

    /// The resolution `cm` made for its node is over (resolved, failed or
    /// given up): the ids waiting for it resolve now, from the route if
    /// there is one, else each on its own.
    fn resolution_over(&mut self, cm: CmRef) {
        if self.resolving.is_empty() {
            return;
        }
        let Some(node) = self
            .resolving
            .iter()
            .find(|(_, (leader, _))| *leader == cm)
            .map(|(n, _)| *n)
        else {
            return;
        };
        let (_, waiting) = self.resolving.remove(&node).expect("found");
        let route = self.routes.get(&node).copied();
        let mut first = true;
        for (c, rank) in waiting {
            if !self.cms.contains_key(&c) {
                continue;
            }
            if route.is_some() {
                self.counters.route_hits += 1;
            } else if first {
                // No route came: the first waiter asks again, the others
                // wait for it.
                first = false;
                self.resolving.insert(node, (c, Vec::new()));
            } else if let Some((_, w)) = self.resolving.get_mut(&node) {
                w.push((c, rank));
                continue;
            }
            self.actions
                .push_back(Action::Resolve { cm: c, rank, route });
        }
    }

    fn drop_cm(&mut self, cm: CmRef) {
        // An id still waiting for its turn or for its node's route was
        // never handed to the driver: there is nothing to destroy.
        let unborn = self.waiting.remove(&cm).is_some() || self.unwait(cm);
        if self.cms.remove(&cm).is_some() && !unborn {
            self.actions.push_back(Action::DestroyCm { cm });
        }
        self.resolution_over(cm);
        self.exchange_over(cm);
    }

    /// Takes `cm` off the ids waiting for a node's route; whether it was
    /// one of them.
    fn unwait(&mut self, cm: CmRef) -> bool {
        for (_, waiting) in self.resolving.values_mut() {
            if let Some(i) = waiting.iter().position(|(c, _)| *c == cm) {
                waiting.remove(i);
                return true;
            }
        }
        false
    }

    fn refuse(&mut self, cm: CmRef, dst: Rank, tag: u32, reason: Reason) {
        let mut m = self.msg(Kind::Refuse, dst, tag);
        m.reason = Some(reason);
        *self.counters.refused_sent.entry(reason).or_insert(0) += 1;
        self.notices.push_back(Notice::Refused {
            rank: (dst != u32::MAX).then_some(dst),
            reason,
        });
        self.actions.push_back(Action::Reject {
            cm,
            data: m.encode(),
        });
        self.drop_cm(cm);
    }

    fn set_ep(&mut self, rank: Rank, state: EpState) {
        if let Some(e) = self.eps.get_mut(&rank) {
            e.state = state;
        }
    }

    /// An RC connection with `rank` came up.
    fn bump_epoch(&mut self, rank: Rank) {
        if let Some(e) = self.eps.get_mut(&rank) {
            e.epoch = e.epoch.wrapping_add(1);
        }
    }

    /// Makes `rank`'s endpoint ready, if it still rides on a live QP: an
    /// endpoint that left, failed or moved to another QP meanwhile is not
    /// made ready by a connection that came up late.
    fn ready(&mut self, rank: Rank) {
        let attached = self
            .eps
            .get(&rank)
            .and_then(|e| e.ini)
            .is_some_and(|k| self.inis.contains_key(&k));
        if !attached {
            return;
        }
        self.set_ep(rank, EpState::Ready);
        self.counters.ready += 1;
        if let Some(path) = self.path(rank) {
            self.notices.push_back(Notice::Ready { rank, path });
        }
    }

    /// [`ConnManager::ready`] for the anchor of `ini`, if it rides on it.
    fn anchor_ready(&mut self, anchor: Rank, ini: u64) {
        if self.eps.get(&anchor).is_some_and(|e| e.ini == Some(ini)) {
            self.ready(anchor);
        }
    }

    fn fail_ep(&mut self, rank: Rank, reason: FailReason) {
        let Some(e) = self.eps.get_mut(&rank) else {
            return;
        };
        e.state = EpState::Failed;
        e.retry_at = None;
        let (cm, ini) = (e.cm.take(), e.ini.take());
        if let Some(cm) = cm {
            self.drop_cm(cm);
        }
        if let Some(k) = ini {
            self.detach(k, rank);
        }
        self.notices.push_back(Notice::Failed { rank, reason });
    }

    /// Marks an endpoint lost: the BTL stops using its path and a later
    /// `connect` rebuilds it.
    fn lose_ep(&mut self, rank: Rank) {
        let Some(e) = self.eps.get_mut(&rank) else {
            return;
        };
        if matches!(e.state, EpState::Closed | EpState::Failed | EpState::Lost) {
            return;
        }
        e.state = EpState::Lost;
        e.retry_at = None;
        e.ini = None;
        if let Some(cm) = e.cm.take() {
            self.drop_cm(cm);
        }
        self.counters.lost += 1;
        self.notices.push_back(Notice::Lost { rank });
    }

    /// Removes `rank` from an INI's users; an RC endpoint's QP goes with it.
    fn detach(&mut self, k: u64, rank: Rank) {
        let Some(i) = self.inis.get_mut(&k) else {
            return;
        };
        i.users.remove(&rank);
        if matches!(self.cfg.mode, Mode::Rc { .. }) && i.users.is_empty() {
            self.destroy_ini(k);
        }
    }

    fn destroy_ini(&mut self, k: u64) {
        let Some(i) = self.inis.remove(&k) else {
            return;
        };
        if self.ini_of_node.get(&i.node) == Some(&k) {
            self.ini_of_node.remove(&i.node);
        }
        self.qp_owner.remove(&i.qp);
        if let Some(cm) = i.cm {
            self.drop_cm(cm);
        }
        self.actions.push_back(Action::DestroyQp { qp: i.qp });
        self.counters.qps_destroyed += 1;
    }

    fn new_ini(&mut self, node: Node, anchor: Rank) -> u64 {
        let k = self.fresh();
        let qp = QpRef(self.fresh());
        let kind = match self.cfg.mode {
            Mode::Xrc => QpKind::Ini,
            Mode::Rc { .. } => QpKind::Rc,
        };
        // Most devices cannot grow a connected QP's send queue: an INI QP
        // is made deep enough for every rank known on its node.
        let peers = match self.cfg.mode {
            Mode::Xrc => {
                let here = self.ranks_on.get(&node).copied().unwrap_or(0);
                here.saturating_sub(u32::from(node == self.cfg.node)).max(1)
            }
            Mode::Rc { .. } => 1,
        };
        let sq_depth = self
            .cfg
            .sq_per_endpoint
            .saturating_mul(peers)
            .max(self.cfg.sq_initial)
            .min(self.cfg.sq_max);
        self.actions
            .push_back(Action::CreateQp { qp, kind, sq_depth });
        self.counters.qps_created += 1;
        let tag = self.fresh() as u32;
        self.inis.insert(
            k,
            Box::new(Ini {
                node,
                qp,
                state: IniState::Resolving,
                cm: None,
                anchor,
                tgt_qpn: 0,
                tag,
                users: BTreeSet::new(),
                sq_depth,
                retries: 0,
                retry_at: None,
            }),
        );
        self.qp_owner.insert(qp, k);
        if self.cfg.mode == Mode::Xrc {
            self.ini_of_node.insert(node, k);
        }
        k
    }

    /// Sends (or re-sends) an INI's anchor connect request.
    fn start_anchor(&mut self, k: u64) {
        let cm = CmRef(self.fresh());
        let Some(i) = self.inis.get_mut(&k) else {
            return;
        };
        i.state = IniState::Resolving;
        let old = i.cm.replace(cm);
        let anchor = i.anchor;
        if let Some(old) = old {
            self.drop_cm(old);
        }
        self.cms.insert(cm, CmUse::Anchor { ini: k });
        self.resolve(cm, anchor);
    }

    /// Grows an INI's send queue to carry its endpoints.
    fn size_ini(&mut self, k: u64) {
        let (per, max) = (self.cfg.sq_per_endpoint, self.cfg.sq_max);
        let Some(i) = self.inis.get_mut(&k) else {
            return;
        };
        let want = (per.saturating_mul(i.users.len() as u32)).clamp(1, max);
        if want > i.sq_depth {
            // Grow by doubling: a node's endpoints join one by one.
            i.sq_depth = want.max(i.sq_depth.saturating_mul(2)).min(max);
            let want = i.sq_depth;
            self.counters.sq_resizes += 1;
            let qp = i.qp;
            self.actions
                .push_back(Action::ResizeQp { qp, sq_depth: want });
        }
    }

    // ---- XRC initiator -----------------------------------------------------

    fn xrc_attach(&mut self, rank: Rank, node: Node) {
        let k = match self.ini_of_node.get(&node) {
            Some(k) => *k,
            None => {
                let k = self.new_ini(node, rank);
                self.start_anchor(k);
                k
            }
        };
        let e = self.eps.get_mut(&rank).expect("just inserted");
        e.ini = Some(k);
        let i = self.inis.get_mut(&k).expect("present");
        i.users.insert(rank);
        let (state, anchor) = (i.state, i.anchor);
        self.size_ini(k);
        if state == IniState::Connected && anchor != rank {
            self.start_reuse(rank);
        }
    }

    fn start_reuse(&mut self, rank: Rank) {
        let cm = CmRef(self.fresh());
        let Some(e) = self.eps.get_mut(&rank) else {
            return;
        };
        let old = e.cm.replace(cm);
        e.state = EpState::Resolving;
        if let Some(old) = old {
            self.drop_cm(old);
        }
        self.cms.insert(cm, CmUse::Reuse { rank });
        self.resolve(cm, rank);
    }

    fn send_leave(&mut self, rank: Rank, tgt: u32) {
        self.send_leave_attempt(rank, tgt, 0);
    }

    fn send_leave_attempt(&mut self, rank: Rank, tgt: u32, attempt: u32) {
        let cm = CmRef(self.fresh());
        self.cms.insert(cm, CmUse::Leave { rank, tgt, attempt });
        self.leaves_outstanding.insert(cm);
        self.counters.leaves_sent += 1;
        self.resolve(cm, rank);
    }

    /// The INI of a node is abandoned (TGT gone, anchor gone, QP broken):
    /// its endpoints are lost and rebuilt on next use. If the anchor is gone,
    /// one remaining holder is told to break the TGT QP so it does not stay
    /// behind.
    fn abandon_ini(&mut self, k: u64, anchor_alive: bool) {
        let Some(i) = self.inis.get(&k) else { return };
        let (users, anchor, tgt) = (i.users.clone(), i.anchor, i.tgt_qpn);
        if !anchor_alive && tgt != 0 {
            // Any rank we asked to register may hold the TGT QP, even if
            // its answer has not arrived: tell each to break it.
            let holders: Vec<Rank> = users
                .iter()
                .copied()
                .filter(|r| *r != anchor)
                .filter(|r| {
                    self.eps
                        .get(r)
                        .is_some_and(|e| matches!(e.state, EpState::Ready | EpState::Reusing))
                })
                .collect();
            for h in holders {
                self.send_leave(h, tgt);
            }
        }
        for r in users {
            self.lose_ep(r);
        }
        self.destroy_ini(k);
    }

    // ---- RC initiator ------------------------------------------------------

    fn rc_start(&mut self, rank: Rank, node: Node) {
        let k = self.new_ini(node, rank);
        self.inis.get_mut(&k).expect("new").users.insert(rank);
        let e = self.eps.get_mut(&rank).expect("just inserted");
        e.ini = Some(k);
        e.state = EpState::Connecting;
        e.initiator = true;
        self.start_anchor(k);
    }

    // ---- events --------------------------------------------------------------

    fn on_qp_create_failed(&mut self, qp: QpRef) {
        let Some(&k) = self.qp_owner.get(&qp) else {
            return;
        };
        let users: Vec<Rank> = self.inis[&k].users.iter().copied().collect();
        // The QP never existed: do not destroy it.
        if let Some(i) = self.inis.remove(&k) {
            self.ini_of_node.retain(|_, v| *v != k);
            self.qp_owner.remove(&i.qp);
            if let Some(cm) = i.cm {
                self.drop_cm(cm);
            }
        }
        for r in users {
            self.fail_ep(r, FailReason::NoResource);
        }
    }

    fn on_resolved(&mut self, cm: CmRef, route: RouteRef) {
        let Some(&u) = self.cms.get(&cm) else {
            return;
        };
        let rank = match u {
            CmUse::Anchor { ini } => self.inis.get(&ini).map(|i| i.anchor),
            CmUse::Reuse { rank } | CmUse::Leave { rank, .. } => Some(rank),
            CmUse::Served { .. } => None,
        };
        if let Some(node) = rank.and_then(|r| self.node_of.get(&r)) {
            self.routes.insert(*node, route);
        }
        self.resolution_over(cm);
        match u {
            CmUse::Anchor { ini } => {
                let Some(i) = self.inis.get_mut(&ini) else {
                    return;
                };
                i.state = IniState::Connecting;
                let (anchor, tag, qp) = (i.anchor, i.tag, i.qp);
                let mut m = self.msg(Kind::Connect, anchor, tag);
                if matches!(self.cfg.mode, Mode::Rc { .. }) {
                    m.flags |= wire::FLAG_RECIPROCAL;
                    // RC carries no TGT QP: the field says which connection
                    // this is.
                    m.tgt = self.eps.get(&anchor).map_or(0, |e| e.epoch);
                }
                self.actions.push_back(Action::Connect {
                    cm,
                    qp: Some(qp),
                    data: m.encode(),
                });
            }
            CmUse::Reuse { rank } => {
                let Some(e) = self.eps.get_mut(&rank) else {
                    return;
                };
                e.state = EpState::Reusing;
                let Some(k) = e.ini else { return };
                let Some(i) = self.inis.get(&k) else { return };
                let mut m = self.msg(Kind::Reuse, rank, i.tag);
                m.tgt = i.tgt_qpn;
                self.actions.push_back(Action::Connect {
                    cm,
                    qp: None,
                    data: m.encode(),
                });
            }
            CmUse::Leave { rank, tgt, .. } => {
                let mut m = self.msg(Kind::Leave, rank, 0);
                m.tgt = tgt;
                self.actions.push_back(Action::Connect {
                    cm,
                    qp: None,
                    data: m.encode(),
                });
            }
            CmUse::Served { .. } => {}
        }
    }

    fn decode_reply(&mut self, data: &[u8]) -> Option<Msg> {
        let m = Msg::decode(data, self.cfg.job).ok()?;
        if m.dst != self.cfg.rank {
            return None;
        }
        if let Some(r) = m.reason {
            *self.counters.refused_received.entry(r).or_insert(0) += 1;
        }
        Some(m)
    }

    fn on_established(&mut self, cm: CmRef, data: &[u8]) {
        self.exchange_over(cm);
        match self.cms.get(&cm).copied() {
            Some(CmUse::Anchor { ini }) => {
                let reply = self.decode_reply(data);
                let Some(i) = self.inis.get_mut(&ini) else {
                    return;
                };
                let Some(m) =
                    reply.filter(|m| m.kind == Kind::Accept && m.tag == i.tag && m.src == i.anchor)
                else {
                    // A reply we cannot read: this connection is useless.
                    let anchor = i.anchor;
                    self.retry_anchor(ini, Some(anchor));
                    return;
                };
                i.state = IniState::Connected;
                i.tgt_qpn = m.tgt;
                i.retries = 0;
                let (anchor, users) = (i.anchor, i.users.clone());
                if let Some(e) = self.eps.get_mut(&anchor) {
                    e.srqns = m.srqns.clone();
                    e.retries = 0;
                }
                match self.cfg.mode {
                    Mode::Rc { p2p: true } => {
                        let qp = self.inis[&ini].qp;
                        self.actions.push_back(Action::SendHello { qp });
                        self.bump_epoch(anchor);
                        self.anchor_ready(anchor, ini);
                    }
                    Mode::Rc { .. } => {
                        self.bump_epoch(anchor);
                        self.anchor_ready(anchor, ini);
                    }
                    Mode::Xrc => {
                        self.anchor_ready(anchor, ini);
                        for r in users {
                            if r != anchor
                                && self
                                    .eps
                                    .get(&r)
                                    .is_some_and(|e| e.state == EpState::WaitIni)
                            {
                                self.start_reuse(r);
                            }
                        }
                    }
                }
            }
            Some(CmUse::Served { peer }) => {
                // The initiator's RTU: an RC endpoint we accepted is up.
                if let Mode::Rc { p2p } = self.cfg.mode {
                    if let Some(e) = self.eps.get(&peer) {
                        if e.state == EpState::Connecting && !e.initiator {
                            let heard = e.heard;
                            self.bump_epoch(peer);
                            if p2p && !heard {
                                self.set_ep(peer, EpState::WaitHello);
                            } else {
                                self.ready(peer);
                            }
                        }
                    }
                }
            }
            _ => {}
        }
    }

    /// An anchor connect did not work: back off and try again (perhaps with
    /// another anchor), or fail every endpoint waiting on it.
    fn retry_anchor(&mut self, ini: u64, failed_anchor: Option<Rank>) {
        let max = self.cfg.max_retries;
        let Some(i) = self.inis.get_mut(&ini) else {
            return;
        };
        i.retries += 1;
        self.counters.retries += 1;
        if let Some(cm) = i.cm.take() {
            self.drop_cm(cm);
        }
        let Some(i) = self.inis.get(&ini) else {
            return;
        };
        if i.retries > max {
            // The anchor never answered: it is unreachable, not its node.
            let anchor = i.anchor;
            return self.replace_anchor(ini, anchor, FailReason::Unreachable);
        }
        self.rebuild_ini(ini, failed_anchor);
    }

    /// The anchor of `ini` is gone for good (`why`): it fails, and the
    /// others waiting on the node start over with the next of them as the
    /// anchor (with retries of their own), so that one dead or hung rank
    /// does not cut its node off.
    fn replace_anchor(&mut self, ini: u64, anchor: Rank, why: FailReason) {
        self.fail_ep(anchor, why);
        let Some(i) = self.inis.get_mut(&ini) else {
            return;
        };
        i.users.remove(&anchor);
        match i.users.iter().next().copied() {
            Some(next) => {
                i.anchor = next;
                i.retries = 0;
                self.counters.reanchors += 1;
                self.rebuild_ini(ini, Some(next));
            }
            None => self.destroy_ini(ini),
        }
    }

    /// Makes the INI QP of `ini` afresh (the old one may have moved past
    /// INIT), to be connected through `anchor` (or its anchor) after the
    /// back-off its retries call for.
    fn rebuild_ini(&mut self, ini: u64, anchor: Option<Rank>) {
        let Some(i) = self.inis.get(&ini) else {
            return;
        };
        let retries = i.retries;
        let node = i.node;
        let anchor = anchor.unwrap_or(i.anchor);
        let users = i.users.clone();
        self.destroy_ini(ini);
        let k = self.new_ini(node, anchor);
        let delay = self.backoff(retries.saturating_sub(1));
        let i = self.inis.get_mut(&k).expect("new");
        i.users = users.clone();
        i.retries = retries;
        i.state = IniState::Backoff;
        self.arm(Timer::Ini(k), self.now + delay);
        for r in users {
            if let Some(e) = self.eps.get_mut(&r) {
                e.ini = Some(k);
                if matches!(self.cfg.mode, Mode::Xrc) {
                    e.state = EpState::WaitIni;
                }
            }
        }
        self.size_ini(k);
    }

    fn on_cm_failed(&mut self, cm: CmRef, how: CmFailure, data: &[u8]) {
        self.resolution_over(cm);
        self.exchange_over(cm);
        let Some(u) = self.cms.remove(&cm) else {
            return;
        };
        if how == CmFailure::Stale {
            self.counters.stale_rejects += 1;
        }
        self.actions.push_back(Action::DestroyCm { cm });
        let reply = if how == CmFailure::Rejected {
            self.decode_reply(data)
        } else {
            None
        };
        match u {
            CmUse::Anchor { ini } => {
                if let Some(i) = self.inis.get_mut(&ini) {
                    i.cm = None;
                }
                let anchor = self.inis.get(&ini).map(|i| i.anchor);
                match reply.and_then(|m| m.reason) {
                    Some(Reason::Collision) => {
                        // The peer's own request wins: our endpoint is
                        // being built from its side.
                        if let Some(a) = anchor {
                            if let Some(e) = self.eps.get_mut(&a) {
                                e.ini = None;
                                e.state = EpState::Connecting;
                                e.initiator = false;
                            }
                        }
                        self.destroy_ini(ini);
                    }
                    Some(
                        reason @ (Reason::WrongJob
                        | Reason::WrongRank
                        | Reason::BadVersion
                        | Reason::Malformed
                        | Reason::BadKind
                        | Reason::BadLength
                        | Reason::Leaving),
                    ) => {
                        if let Some(a) = anchor {
                            self.fail_ep(a, FailReason::Refused(reason));
                        }
                        // Others waiting on the node try another anchor.
                        let next = self
                            .inis
                            .get(&ini)
                            .and_then(|i| i.users.iter().next().copied());
                        match next {
                            Some(n) => {
                                self.inis.get_mut(&ini).expect("present").anchor = n;
                                self.retry_anchor(ini, Some(n));
                            }
                            None => self.destroy_ini(ini),
                        }
                    }
                    _ if how == CmFailure::NoListener => {
                        // Nobody listens there any more: the anchor's
                        // process is gone.
                        if let Some(a) = anchor {
                            self.replace_anchor(ini, a, FailReason::NoListener);
                        }
                    }
                    _ => self.retry_anchor(ini, None),
                }
            }
            CmUse::Reuse { rank } => {
                if how == CmFailure::NoListener {
                    return self.fail_ep(rank, FailReason::NoListener);
                }
                let Some(m) = reply else {
                    return self.retry_reuse(rank);
                };
                match (m.kind, m.reason) {
                    (Kind::ReuseOk, _) => {
                        if let Some(e) = self.eps.get_mut(&rank) {
                            e.srqns = m.srqns;
                            e.cm = None;
                            e.retries = 0;
                        }
                        self.ready(rank);
                    }
                    (Kind::Refuse, Some(Reason::NotReady)) => {
                        // The TGT QP is gone: rebuild the node's INI with
                        // this rank as the new anchor.
                        let Some(k) = self.eps.get(&rank).and_then(|e| e.ini) else {
                            return;
                        };
                        self.counters.rebuilds += 1;
                        let node = self.node_of[&rank];
                        let users: Vec<Rank> = self
                            .inis
                            .get(&k)
                            .map(|i| i.users.iter().copied().collect())
                            .unwrap_or_default();
                        self.destroy_ini(k);
                        let nk = self.new_ini(node, rank);
                        for r in users {
                            if let Some(e) = self.eps.get_mut(&r) {
                                if e.state != EpState::Ready || r == rank {
                                    e.ini = Some(nk);
                                    e.state = EpState::WaitIni;
                                    self.inis.get_mut(&nk).expect("new").users.insert(r);
                                } else {
                                    // Ready endpoints used the dead TGT QP.
                                    self.lose_ep(r);
                                }
                            }
                        }
                        self.size_ini(nk);
                        self.start_anchor(nk);
                    }
                    (Kind::Refuse, Some(reason)) => self.fail_ep(rank, FailReason::Refused(reason)),
                    _ => self.retry_reuse(rank),
                }
            }
            CmUse::Leave { rank, tgt, attempt } => {
                self.leaves_outstanding.remove(&cm);
                if let Phase::Leaving { deadline } = &mut self.phase {
                    *deadline = self.now + self.cfg.leave_timeout;
                }
                if how == CmFailure::Stale && attempt < self.cfg.max_retries {
                    // Turned away by the peer's CM before its application
                    // saw it: say it again.
                    self.counters.retries += 1;
                    return self.send_leave_attempt(rank, tgt, attempt + 1);
                }
                self.finish_leave_if_done();
            }
            // A connection we accepted never came up (the initiator went
            // away): whatever we made for it goes too.
            CmUse::Served { peer } => self.served_gone(cm, peer),
        }
    }

    fn retry_reuse(&mut self, rank: Rank) {
        let max = self.cfg.max_retries;
        let Some(e) = self.eps.get_mut(&rank) else {
            return;
        };
        e.cm = None;
        e.retries += 1;
        self.counters.retries += 1;
        if e.retries > max {
            return self.fail_ep(rank, FailReason::Unreachable);
        }
        let retries = e.retries;
        let delay = self.backoff(retries - 1);
        let at = self.now + delay;
        let e = self.eps.get_mut(&rank).expect("present");
        e.state = EpState::WaitIni;
        self.arm(Timer::Ep(rank), at);
    }

    fn on_request(&mut self, cm: CmRef, data: &[u8], from: Option<SocketAddr>) {
        let msg = match Msg::decode(data, self.cfg.job) {
            Ok(m) => m,
            Err(reason) => {
                self.cms.insert(cm, CmUse::Served { peer: u32::MAX });
                let tag = wire::peek_tag(data);
                return self.refuse(cm, u32::MAX, tag, reason);
            }
        };
        self.cms.insert(cm, CmUse::Served { peer: msg.src });
        if !msg.is_request() {
            return self.refuse(cm, msg.src, msg.tag, Reason::BadKind);
        }
        // Nobody connects to itself through the CM (a rank reaches itself
        // in process): a request claiming to come from this rank is forged.
        if msg.dst != self.cfg.rank || msg.src == self.cfg.rank {
            return self.refuse(cm, msg.src, msg.tag, Reason::WrongRank);
        }
        if !self.node_of.contains_key(&msg.src) {
            if msg.kind == Kind::Leave || self.phase != Phase::Running {
                return self.refuse(cm, msg.src, msg.tag, Reason::WrongRank);
            }
            // Ask once per rank; the request waits for the answer.
            if !self.parked.iter().any(|p| p.1 == msg.src) {
                self.notices
                    .push_back(Notice::UnknownPeer { rank: msg.src });
                if let Some(from) = from {
                    self.sources.insert(msg.src, from);
                }
            }
            self.parked.push((cm, msg.src, data.to_vec()));
            return;
        }
        if msg.kind == Kind::Leave {
            return self.on_leave(cm, msg);
        }
        // A peer this rank failed stays failed (the BTL drops whatever it
        // sends): as for a leaving rank, its request is refused, and it
        // fails this rank in turn instead of sending into the void.
        let failed = self
            .eps
            .get(&msg.src)
            .is_some_and(|e| e.state == EpState::Failed);
        if self.phase != Phase::Running || failed {
            return self.refuse(cm, msg.src, msg.tag, Reason::Leaving);
        }
        match (self.cfg.mode, msg.kind) {
            (Mode::Xrc, Kind::Connect) => {
                let tgt = TgtRef(self.fresh());
                self.actions.push_back(Action::CreateTgt { tgt });
                self.pending.push(Pending { cm, msg, tgt });
            }
            (Mode::Xrc, Kind::Reuse) => {
                if self.tgts.holds_qpn(msg.tgt) {
                    self.senders.insert(msg.src);
                    self.reply_reuse_ok(cm, &msg);
                } else {
                    let tgt = TgtRef(self.fresh());
                    self.actions
                        .push_back(Action::OpenTgt { tgt, qpn: msg.tgt });
                    self.pending.push(Pending { cm, msg, tgt });
                }
            }
            (Mode::Rc { .. }, Kind::Connect) => self.rc_accept(cm, msg),
            _ => self.refuse(cm, msg.src, msg.tag, Reason::BadKind),
        }
    }

    fn reply_reuse_ok(&mut self, cm: CmRef, req: &Msg) {
        let mut m = self.msg(Kind::ReuseOk, req.src, req.tag);
        m.srqns = self.cfg.srqns.clone();
        self.actions.push_back(Action::Reject {
            cm,
            data: m.encode(),
        });
        self.drop_cm(cm);
    }

    fn on_leave(&mut self, cm: CmRef, msg: Msg) {
        self.counters.leaves_received += 1;
        if msg.tgt != 0 {
            // "The TGT QP is dead": break it so every holder lets go.
            for t in self.tgts.with_qpn(msg.tgt) {
                self.counters.tgt_broken += 1;
                self.actions.push_back(Action::BreakTgt { tgt: t });
                self.release_tgt(t);
            }
        } else {
            // "I am leaving": never send to it again.
            self.senders.remove(&msg.src);
            if let Some(e) = self.eps.get_mut(&msg.src) {
                if e.state != EpState::Closed {
                    e.state = EpState::Closed;
                    e.retry_at = None;
                    let (cm_old, ini) = (e.cm.take(), e.ini.take());
                    if let Some(c) = cm_old {
                        self.drop_cm(c);
                    }
                    if let Some(k) = ini {
                        self.detach(k, msg.src);
                    }
                    self.notices.push_back(Notice::Closed { rank: msg.src });
                }
            }
        }
        let ack = self.msg(Kind::LeaveAck, msg.src, msg.tag);
        self.actions.push_back(Action::Reject {
            cm,
            data: ack.encode(),
        });
        self.drop_cm(cm);
    }

    fn on_tgt_ready(&mut self, tgt: TgtRef, qpn: Option<u32>) {
        let Some(pos) = self.pending.iter().position(|p| p.tgt == tgt) else {
            return;
        };
        let p = self.pending.swap_remove(pos);
        let alive = self.cms.contains_key(&p.cm);
        let Some(qpn) = qpn else {
            if alive {
                self.refuse(p.cm, p.msg.src, p.msg.tag, Reason::NoResource);
            }
            return;
        };
        if !alive {
            // The request went away meanwhile.
            self.actions.push_back(Action::CloseTgt { tgt });
            return;
        }
        self.counters.tgt_created += 1;
        self.tgts.insert(
            tgt,
            Tgt {
                qpn,
                sender: p.msg.src,
                anchor_cm: Some(p.cm),
            },
        );
        self.senders.insert(p.msg.src);
        let mut m = self.msg(Kind::Accept, p.msg.src, p.msg.tag);
        m.tgt = qpn;
        m.srqns = self.cfg.srqns.clone();
        self.actions.push_back(Action::Accept {
            cm: p.cm,
            qp: None,
            tgt: Some(tgt),
            data: m.encode(),
        });
    }

    fn on_tgt_opened(&mut self, tgt: TgtRef, ok: bool) {
        let Some(pos) = self.pending.iter().position(|p| p.tgt == tgt) else {
            if ok {
                self.actions.push_back(Action::CloseTgt { tgt });
            }
            return;
        };
        let p = self.pending.swap_remove(pos);
        let alive = self.cms.contains_key(&p.cm);
        match (ok, alive) {
            (false, true) => return self.refuse(p.cm, p.msg.src, p.msg.tag, Reason::NotReady),
            (false, false) => return,
            // The request went away meanwhile.
            (true, false) => return self.actions.push_back(Action::CloseTgt { tgt }),
            (true, true) => {}
        }
        self.counters.tgt_opened += 1;
        self.tgts.insert(
            tgt,
            Tgt {
                qpn: p.msg.tgt,
                sender: p.msg.src,
                anchor_cm: None,
            },
        );
        self.senders.insert(p.msg.src);
        self.reply_reuse_ok(p.cm, &p.msg);
    }

    /// Lets go of a TGT handle (and the anchor connection that came with it).
    fn release_tgt(&mut self, tgt: TgtRef) {
        let Some(t) = self.tgts.remove(tgt) else {
            return;
        };
        self.counters.tgt_closed += 1;
        self.actions.push_back(Action::CloseTgt { tgt });
        if let Some(cm) = t.anchor_cm {
            self.drop_cm(cm);
        }
        if !self.tgts.has_sender(t.sender) {
            self.senders.remove(&t.sender);
        }
    }

    fn on_tgt_failed(&mut self, tgt: TgtRef) {
        if self.tgts.contains(tgt) {
            self.release_tgt(tgt);
        }
    }

    fn on_disconnected(&mut self, cm: CmRef) {
        let Some(u) = self.cms.get(&cm).copied() else {
            return;
        };
        match u {
            CmUse::Anchor { ini } => {
                self.cms.remove(&cm);
                self.actions.push_back(Action::DestroyCm { cm });
                if let Some(i) = self.inis.get_mut(&ini) {
                    i.cm = None;
                }
                match self.cfg.mode {
                    // The anchor is gone: the INI QP has no keeper.
                    Mode::Xrc => {
                        self.counters.rebuilds += 1;
                        self.abandon_ini(ini, false);
                    }
                    Mode::Rc { .. } => self.abandon_ini(ini, true),
                }
            }
            CmUse::Served { peer } => {
                self.cms.remove(&cm);
                self.actions.push_back(Action::DestroyCm { cm });
                self.served_gone(cm, peer);
            }
            _ => {}
        }
    }

    /// The connection behind a request we served is gone (disconnected, or
    /// it never came up): break the TGT QP we anchored for it, so every
    /// holder lets go; in RC mode, the peer's endpoint goes with it.
    fn served_gone(&mut self, cm: CmRef, peer: Rank) {
        self.parked.retain(|p| p.0 != cm);
        let parked = &self.parked;
        self.sources.retain(|r, _| parked.iter().any(|p| p.1 == *r));
        if let Some(t) = self.tgts.unanchor(cm) {
            self.counters.tgt_broken += 1;
            self.actions.push_back(Action::BreakTgt { tgt: t });
            self.release_tgt(t);
        }
        // A request still waiting for its TGT QP stays until the driver
        // answers: the handle is closed then, once it exists (closing it
        // now would close nothing, and leak the QP made afterwards).
        if matches!(self.cfg.mode, Mode::Rc { .. }) {
            let owned = self.eps.get(&peer).and_then(|e| e.ini);
            if let Some(k) = owned {
                if self
                    .inis
                    .get(&k)
                    .is_some_and(|i| i.cm.is_none() || i.cm == Some(cm))
                {
                    self.abandon_ini(k, true);
                }
            }
        }
    }

    fn on_qp_failed(&mut self, qp: QpRef) {
        let Some(&k) = self.qp_owner.get(&qp) else {
            return;
        };
        self.counters.rebuilds += u64::from(self.cfg.mode == Mode::Xrc);
        self.abandon_ini(k, true);
    }

    fn on_first_receive(&mut self, qp: QpRef) {
        let Some(&k) = self.qp_owner.get(&qp) else {
            return;
        };
        let Some(&rank) = self.inis.get(&k).and_then(|i| i.users.iter().next()) else {
            return;
        };
        let Some(e) = self.eps.get_mut(&rank) else {
            return;
        };
        match e.state {
            EpState::WaitHello => self.ready(rank),
            // The data path overtook the CM's confirmation.
            EpState::Connecting if !e.initiator => e.heard = true,
            _ => {}
        }
    }

    // ---- RC responder --------------------------------------------------------

    fn rc_accept(&mut self, cm: CmRef, msg: Msg) {
        let peer = msg.src;
        if let Some(e) = self.eps.get(&peer) {
            match e.state {
                // Both sides connect at once: the lower rank's request wins,
                // unless ours still waits for its turn in the window: then
                // it has not left, and theirs is taken in its place.
                EpState::Connecting | EpState::Resolving if e.initiator => {
                    let ours_waits = e
                        .ini
                        .and_then(|k| self.inis.get(&k))
                        .and_then(|i| i.cm)
                        .is_some_and(|c| self.waiting.contains_key(&c));
                    if self.cfg.rank < peer && !ours_waits {
                        return self.refuse(cm, peer, msg.tag, Reason::Collision);
                    }
                    // Theirs wins: drop our attempt.
                    if let Some(k) = e.ini {
                        self.destroy_ini(k);
                    }
                }
                // A request sent before the connection now up (it crossed
                // ours and the peer dropped it when it took ours): refuse
                // it, keep the connection.
                EpState::Ready | EpState::WaitHello if msg.tgt < e.epoch => {
                    return self.refuse(cm, peer, msg.tag, Reason::Collision);
                }
                EpState::Ready | EpState::WaitHello => {
                    // A fresh request from a peer we think is connected: it
                    // rebuilt, so ours is stale.
                    if let Some(k) = e.ini {
                        self.destroy_ini(k);
                    }
                }
                // Any other connection the endpoint has (one this rank
                // accepted from an earlier request of the peer, which has
                // since given up on it and asked again) is superseded:
                // every request would otherwise leave a QP behind.
                _ => {
                    if let Some(k) = e.ini {
                        self.destroy_ini(k);
                    }
                }
            }
        }
        let Some(&node) = self.node_of.get(&peer) else {
            return self.refuse(cm, peer, msg.tag, Reason::WrongRank);
        };
        let k = self.new_ini(node, peer);
        let i = self.inis.get_mut(&k).expect("new");
        i.users.insert(peer);
        i.state = IniState::Connected;
        i.cm = Some(cm);
        let qp = i.qp;
        self.cms.insert(cm, CmUse::Served { peer });
        self.eps.insert(
            peer,
            Box::new(Endpoint {
                state: EpState::Connecting,
                ini: Some(k),
                srqns: Vec::new(),
                cm: None,
                retries: 0,
                retry_at: None,
                initiator: false,
                heard: false,
                epoch: 0,
            }),
        );
        let m = self.msg(Kind::Accept, peer, msg.tag);
        self.actions.push_back(Action::Accept {
            cm,
            qp: Some(qp),
            tgt: None,
            data: m.encode(),
        });
    }

    // ---- clean exit ------------------------------------------------------------

    fn finish_leave_if_done(&mut self) {
        if !matches!(self.phase, Phase::Leaving { .. }) || !self.leaves_outstanding.is_empty() {
            return;
        }
        // Nobody sends to us any more: release everything.
        for t in self.tgts.refs() {
            self.release_tgt(t);
        }
        let inis: Vec<u64> = self.inis.keys().copied().collect();
        for k in inis {
            self.destroy_ini(k);
        }
        let cms: Vec<CmRef> = self.cms.keys().copied().collect();
        for cm in cms {
            self.drop_cm(cm);
        }
        for e in self.eps.values_mut() {
            e.state = EpState::Closed;
            e.retry_at = None;
        }
        self.phase = Phase::Done;
        self.notices.push_back(Notice::Drained);
    }
}
