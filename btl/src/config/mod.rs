//! BTL configuration, with every knob settable through an environment
//! variable of the `XRCBTL_` prefix.
//!
//! | Variable | Default | Meaning |
//! |---|---|---|
//! | `XRCBTL_EAGER_LIMIT` | `auto` | Largest payload sent eagerly (copied through a bounce buffer, or sent from the caller's buffer, into the peer's receive buffer, whose size it sets); larger ones are split or use rendezvous. A number of bytes, or `auto`: 64 KiB with RC + SRQ (iWARP, devices without XRC), where one send beat the rendezvous's three or four legs, 8 KiB under XRC ([`EagerLimit::Auto`]). |
//! | `XRCBTL_ZCOPY_MIN` | 4096 | Smallest eager payload `send_bytes` sends from the caller's own buffer (registered through the cache, no copy) instead of copying it into a bounce buffer. |
//! | `XRCBTL_MAX_INLINE` | 128 | Largest message (header included) posted inline, when the device allows that much. |
//! | `XRCBTL_SPLIT_LIMIT` | `auto` | Largest payload `send_bytes` sends as several eager messages back to back (cut at the eager limit, joined by the receiver: no rendezvous handshake, one copy on arrival); larger ones use rendezvous. A number of bytes (at most 4 MiB; 0: never), or `auto`: 16 KiB, two parts of the 8 KiB eager limit, where splitting beat the handshake; nothing where the eager limit is that or more, as it is by default with RC + SRQ (measured on siw and rxe under TCG; not on hardware). |
//! | `XRCBTL_RNDV_PROTOCOL` | `auto` | Rendezvous: `get` (RTS, the receiver RDMA-reads, ATS), `put` (RTS, RTR, the sender RDMA-writes, FIN), or `auto`: put on iWARP, get elsewhere (measured: scripts/perf-compare). |
//! | `XRCBTL_RNDV_FRAG_SIZE` | 524288 | Bytes per RDMA fragment of a rendezvous. |
//! | `XRCBTL_RNDV_PIPELINE` | 4 | Fragments of one rendezvous in flight at once (reads: at most the device's `max_qp_rd_atom`). |
//! | `XRCBTL_RNDV_MAX` | 17179869184 | Longest rendezvous (bytes) this rank sends or takes: `send_bytes` refuses a longer one at once, and a request for a longer one (or one no sink can be allocated for) is refused, failing the sender's operation. 1 MiB to 1 TiB. |
//! | `XRCBTL_SEND_SLOTS` | 256 | Bounce buffers for eager sends. |
//! | `XRCBTL_SMALL_SIZE` | 256 | Buffer size of the small receive class (0: one class only). |
//! | `XRCBTL_SRQ_DEPTH` | 256 | Receives posted per class at start. |
//! | `XRCBTL_SRQ_MAX_DEPTH` | 1024 | Receives a class may grow to when its SRQ runs low. |
//! | `XRCBTL_SRQ_REFILL` | 16 | Consumed receives reposted together. |
//! | `XRCBTL_CREDITS` | 16 | iWARP (no RNR) only: messages a rank may have outstanding in one peer's SRQ; the receiver keeps peers × (credits + 1) + refill receives posted and returns credits as it reposts. At least 4. |
//! | `XRCBTL_CQ_BATCH` | 32 | Completions taken per CQ poll. |
//! | `XRCBTL_SQ_MAX` | 0 | Deepest send queue of a QP (0: the device's maximum); a shared XRC INI QP grows up to it as endpoints join. |
//! | `XRCBTL_FORCE_RC` | 0 | 1: RC + SRQ even where the device has XRC. |
//! | `XRCBTL_RCACHE_MAX_REGIONS` | 4096 | Registrations the cache keeps. |
//! | `XRCBTL_RCACHE_MAX_BYTES` | 4294967296 | Bytes the cache keeps registered (also bounded by `RLIMIT_MEMLOCK`, unless the process has `CAP_IPC_LOCK`). |
//! | `XRCBTL_RETRIES` | 5 | Connection attempts before a peer is declared unreachable. |
//! | `XRCBTL_CONNECT_WINDOW` | 64 | Connection requests (and the CM exchanges of reuse and leave) this rank has in flight at once; more wait their turn. 0: no limit. A rank that connects to many peers at once would otherwise queue their answers past the CM's timeout at its own node's CM agent, and every request would be sent again. |
//! | `XRCBTL_MIN_RNR_TIMER` | 12 | RNR NAK timer of this rank's responder QPs (RC, XRC TGT), IB encoding 0..=31: how long a sender waits after finding no receive posted; 12 is 0.64 ms (the CM's own 0 means 655 ms). |
//! | `XRCBTL_ACK_TIMEOUT` | 14 | Local ACK timeout of this rank's sending QPs, IB encoding 1..=31 (4.096 us x 2^n; 14 is 67 ms): with 7 retries a dead peer is found in about 8 times this. |
//! | `XRCBTL_AF_IB` | 1 | 1: on InfiniBand, also listen at the port's GID (AF_IB) and reach peers that publish one by GID, with no ARP; 0: IP addresses only. |
//! | `XRCBTL_PLACE` | `auto` | `auto`: registered buffers on the NUMA node of the device and the progress thread on its CPUs (of those the process may use), from this machine's hardware topology (hwloc); `off`: neither. |
//! | `XRCBTL_IDLE_YIELD` | `auto` | After how many progress calls in a row that found nothing the calling thread yields its CPU (`sched_yield`): a number, `off`, or `auto`: after every one on a device the host's kernel emulates in threads of its own (Soft-RoCE, soft-iWARP: their work a spinning rank holds up when the CPUs are all busy), never on hardware ([`IdleYield::Auto`]). |
//! | `XRCBTL_XRCD_DIR` | (empty) | Absolute directory of the XRC domain key file, the same for every rank of a node (empty: `/tmp/xrcbtl-<uid>`). Read by the C ABI and the benchmarks, which make the key. |

mod values;

pub use values::{Clock, EagerLimit, IdleYield, RndvProtocol, SplitLimit};

use std::net::SocketAddr;
use std::time::Duration;

use xrcbtl_fabric::{Error, Result, XrcdKey};
use xrcbtl_xrc_conn::{Node, Rank};

/// One setting: its variable, default and meaning (the table above, for
/// programs that list them: the C ABI, the Open MPI component's MCA
/// parameters).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setting {
    /// The variable, `XRCBTL_` and the name.
    pub name: &'static str,
    /// Its default, as text.
    pub default: &'static str,
    /// What it means.
    pub help: &'static str,
}

/// Every setting [`BtlConfig::with_vars`] reads, in the order of the table
/// above.
pub const SETTINGS: &[Setting] = &[
    Setting { name: "XRCBTL_EAGER_LIMIT", default: "auto", help: "Largest payload sent eagerly (into the peer's receive buffer, whose size it sets); larger ones are split or use rendezvous. A number of bytes, or auto: 64 KiB with RC + SRQ (iWARP, devices without XRC), 8 KiB under XRC." },
    Setting { name: "XRCBTL_ZCOPY_MIN", default: "4096", help: "Smallest eager payload send_bytes sends from the caller's own buffer (registered through the cache, no copy) instead of copying it into a bounce buffer." },
    Setting { name: "XRCBTL_MAX_INLINE", default: "128", help: "Largest message (header included) posted inline, when the device allows that much." },
    Setting { name: "XRCBTL_SPLIT_LIMIT", default: "auto", help: "Largest payload send_bytes sends as several eager messages back to back (cut at the eager limit, joined by the receiver: no rendezvous handshake, one copy on arrival); larger ones use rendezvous. A number of bytes (at most 4 MiB; 0: never), or auto: 16 KiB (nothing, where the eager limit is that or more, as by default with RC + SRQ)." },
    Setting { name: "XRCBTL_RNDV_PROTOCOL", default: "auto", help: "Rendezvous: get (RTS, the receiver RDMA-reads, ATS), put (RTS, RTR, the sender RDMA-writes, FIN), or auto: put on iWARP, get elsewhere." },
    Setting { name: "XRCBTL_RNDV_FRAG_SIZE", default: "524288", help: "Bytes per RDMA fragment of a rendezvous." },
    Setting { name: "XRCBTL_RNDV_PIPELINE", default: "4", help: "Fragments of one rendezvous in flight at once (reads: at most the device's max_qp_rd_atom)." },
    Setting { name: "XRCBTL_RNDV_MAX", default: "17179869184", help: "Longest rendezvous (bytes) this rank sends or takes: send_bytes refuses a longer one at once, and a request for a longer one (or one no sink can be allocated for) is refused, failing the sender's operation. 1 MiB to 1 TiB." },
    Setting { name: "XRCBTL_SEND_SLOTS", default: "256", help: "Bounce buffers for eager sends." },
    Setting { name: "XRCBTL_SMALL_SIZE", default: "256", help: "Buffer size of the small receive class (0: one class only)." },
    Setting { name: "XRCBTL_SRQ_DEPTH", default: "256", help: "Receives posted per class at start." },
    Setting { name: "XRCBTL_SRQ_MAX_DEPTH", default: "1024", help: "Receives a class may grow to when its SRQ runs low." },
    Setting { name: "XRCBTL_SRQ_REFILL", default: "16", help: "Consumed receives reposted together." },
    Setting { name: "XRCBTL_CREDITS", default: "16", help: "iWARP (no RNR) only: messages a rank may have outstanding in one peer's SRQ; the receiver keeps peers x (credits + 1) + refill receives posted and returns credits as it reposts. At least 4." },
    Setting { name: "XRCBTL_CQ_BATCH", default: "32", help: "Completions taken per CQ poll." },
    Setting { name: "XRCBTL_SQ_MAX", default: "0", help: "Deepest send queue of a QP (0: the device's maximum); a shared XRC INI QP grows up to it as endpoints join." },
    Setting { name: "XRCBTL_FORCE_RC", default: "0", help: "1: RC + SRQ even where the device has XRC." },
    Setting { name: "XRCBTL_RCACHE_MAX_REGIONS", default: "4096", help: "Registrations the cache keeps." },
    Setting { name: "XRCBTL_RCACHE_MAX_BYTES", default: "4294967296", help: "Bytes the cache keeps registered (also bounded by RLIMIT_MEMLOCK, unless the process has CAP_IPC_LOCK)." },
    Setting { name: "XRCBTL_RETRIES", default: "5", help: "Connection attempts before a peer is declared unreachable." },
    Setting { name: "XRCBTL_CONNECT_WINDOW", default: "64", help: "Connection requests (and the CM exchanges of reuse and leave) this rank has in flight at once; more wait their turn. 0: no limit." },
    Setting { name: "XRCBTL_MIN_RNR_TIMER", default: "12", help: "RNR NAK timer of this rank's responder QPs (RC, XRC TGT), IB encoding 0..=31: how long a sender waits after finding no receive posted; 12 is 0.64 ms (the CM's own 0 means 655 ms)." },
    Setting { name: "XRCBTL_ACK_TIMEOUT", default: "14", help: "Local ACK timeout of this rank's sending QPs, IB encoding 1..=31 (4.096 us x 2^n; 14 is 67 ms): with 7 retries a dead peer is found in about 8 times this." },
    Setting { name: "XRCBTL_AF_IB", default: "1", help: "1: on InfiniBand, also listen at the port's GID (AF_IB) and reach peers that publish one by GID, with no ARP; 0: IP addresses only." },
    Setting { name: "XRCBTL_PLACE", default: "auto", help: "auto: registered buffers on the NUMA node of the device and the progress thread on its CPUs (of those the process may use), from this machine's hardware topology (hwloc); off: neither." },
    Setting { name: "XRCBTL_IDLE_YIELD", default: "auto", help: "After how many progress calls in a row that found nothing the calling thread yields its CPU (sched_yield): a number, off, or auto: after every one on a device the host's kernel emulates in threads of its own (Soft-RoCE, soft-iWARP), never on hardware." },
    Setting { name: "XRCBTL_XRCD_DIR", default: "", help: "Absolute directory of the XRC domain key file, the same for every rank of a node (empty: /tmp/xrcbtl-<uid>). Read by the C ABI and the benchmarks, which make the key." },
];

/// A 0/1 setting.
fn flag(name: &str, s: &str) -> Result<bool> {
    match s.trim() {
        "1" | "true" | "yes" => Ok(true),
        "0" | "false" | "no" | "" => Ok(false),
        _ => Err(Error::invalid(format!("{name}={s:?}: expected 0 or 1"))),
    }
}

/// The longest message a receiver joins from parts
/// ([`BtlConfig::split_limit`]): whatever the sender's setting, a train of
/// parts longer than this is refused as malformed.
pub const MAX_SPLIT: usize = 4 << 20;

/// The longest rendezvous a receiver accepts, whatever
/// [`BtlConfig::rndv_max`] says.
pub(crate) const MAX_RNDV: u64 = 1 << 40;

/// How a BTL is set up. See the module documentation for the environment
/// variables.
#[derive(Debug, Clone)]
pub struct BtlConfig {
    /// This process's rank.
    pub rank: Rank,
    /// Its node.
    pub node: Node,
    /// Job id (the same on every rank).
    pub job: u32,
    /// The node's XRC domain key.
    pub xrcd_key: XrcdKey,
    /// Where to listen for connections (port 0: any). The native
    /// InfiniBand listener ([`BtlConfig::af_ib`]) takes the same port
    /// number (or any, with 0).
    pub listen: SocketAddr,
    /// Largest eager payload.
    pub eager_limit: EagerLimit,
    /// Smallest eager payload `send_bytes` sends without a copy.
    pub zcopy_min: usize,
    /// Largest inline message, header included.
    pub max_inline: u32,
    /// Largest payload `send_bytes` sends split into eager parts.
    pub split_limit: SplitLimit,
    /// Rendezvous protocol.
    pub rndv_protocol: RndvProtocol,
    /// Bytes per rendezvous fragment.
    pub rndv_frag_size: usize,
    /// Fragments in flight per rendezvous.
    pub rndv_pipeline: u32,
    /// Longest rendezvous sent or taken (bytes).
    pub rndv_max: u64,
    /// Eager bounce buffers.
    pub send_slots: u32,
    /// Small receive class buffer size (0: none).
    pub small_size: u32,
    /// Receives posted per class at start.
    pub srq_depth: u32,
    /// Receives a class may grow to.
    pub srq_max_depth: u32,
    /// Consumed receives reposted together.
    pub srq_refill: u32,
    /// Credits per peer where the device has no RNR (iWARP).
    pub credits: u32,
    /// Completions per CQ poll.
    pub cq_batch: usize,
    /// Deepest send queue of a QP (`None`: the device's maximum).
    pub sq_max: Option<u32>,
    /// RC + SRQ even with XRC.
    pub force_rc: bool,
    /// Registration cache limits.
    pub rcache: xrcbtl_fabric::rcache::Config,
    /// Connection attempts.
    pub retries: u32,
    /// CM exchanges in flight at once (0: no limit).
    pub connect_window: usize,
    /// How long a clean exit ([`crate::Btl::shutdown`]) waits for the next
    /// of its peers to acknowledge it; each acknowledgement gives it this
    /// long again. Not read from the environment: `xrcbtl_shutdown` bounds
    /// the whole exit with a timeout of its own.
    pub leave_timeout: Duration,
    /// RNR NAK timer of responder QPs (IB encoding).
    pub min_rnr_timer: u8,
    /// Local ACK timeout of sending QPs (IB encoding).
    pub ack_timeout: u8,
    /// On InfiniBand, also listen at the port's GID and reach peers by
    /// theirs (`AF_IB`).
    pub af_ib: bool,
    /// Where whoever makes [`BtlConfig::xrcd_key`] puts it (`None`: the
    /// default directory). The BTL itself opens `xrcd_key` only.
    pub xrcd_dir: Option<std::path::PathBuf>,
    /// Where buffers and the progress thread go.
    pub place: crate::place::Place,
    /// When an idle progress loop yields its CPU.
    pub idle_yield: IdleYield,
    /// Time source.
    pub clock: Clock,
}

impl BtlConfig {
    /// The defaults for one rank.
    pub fn new(rank: Rank, node: Node, job: u32, xrcd_key: XrcdKey, listen: SocketAddr) -> Self {
        BtlConfig {
            rank,
            node,
            job,
            xrcd_key,
            listen,
            eager_limit: EagerLimit::Auto,
            zcopy_min: 4096,
            max_inline: 128,
            split_limit: SplitLimit::Auto,
            rndv_protocol: RndvProtocol::Auto,
            rndv_frag_size: 512 * 1024,
            rndv_pipeline: 4,
            rndv_max: 16 << 30,
            send_slots: 256,
            small_size: 256,
            srq_depth: 256,
            srq_max_depth: 1024,
            srq_refill: 16,
            credits: 16,
            cq_batch: 32,
            sq_max: None,
            force_rc: false,
            rcache: Default::default(),
            retries: 5,
            connect_window: xrcbtl_xrc_conn::DEFAULT_CONNECT_WINDOW,
            leave_timeout: xrcbtl_xrc_conn::DEFAULT_LEAVE_TIMEOUT,
            min_rnr_timer: xrcbtl_fabric::DEFAULT_MIN_RNR_TIMER,
            ack_timeout: xrcbtl_fabric::DEFAULT_ACK_TIMEOUT,
            af_ib: true,
            xrcd_dir: None,
            place: crate::place::Place::Auto,
            idle_yield: IdleYield::Auto,
            clock: Clock::wall(),
        }
    }

    /// Applies the `XRCBTL_*` environment variables, and refuses an
    /// `XRCBTL_*` variable that names no setting ([`BtlConfig::check_names`]).
    pub fn from_env(self) -> Result<Self> {
        Self::check_env()?;
        self.with_vars(|k| std::env::var(k).ok())
    }

    /// Refuses an `XRCBTL_*` variable of this process's environment that
    /// names no setting ([`BtlConfig::check_names`]).
    pub fn check_env() -> Result<()> {
        Self::check_names(std::env::vars_os().filter_map(|(k, _)| k.into_string().ok()))
    }

    /// Applies variables looked up through `get` (tests pass a map).
    pub fn with_vars(mut self, get: impl Fn(&str) -> Option<String>) -> Result<Self> {
        fn num<T: std::str::FromStr>(
            get: &dyn Fn(&str) -> Option<String>,
            k: &str,
            v: &mut T,
        ) -> Result<()> {
            if let Some(s) = get(k) {
                *v = s
                    .trim()
                    .parse()
                    .map_err(|_| Error::invalid(format!("{k}={s:?} is not a valid number")))?;
            }
            Ok(())
        }
        // `auto`, or a number of bytes (`None` for auto).
        fn auto_bytes(k: &str, s: &str) -> Result<Option<usize>> {
            match s.trim() {
                "auto" => Ok(None),
                n => n.parse().map(Some).map_err(|_| {
                    Error::invalid(format!("{k}={s:?}: expected auto or a number of bytes"))
                }),
            }
        }
        let g: &dyn Fn(&str) -> Option<String> = &get;
        if let Some(s) = g("XRCBTL_EAGER_LIMIT") {
            self.eager_limit =
                auto_bytes("XRCBTL_EAGER_LIMIT", &s)?.map_or(EagerLimit::Auto, EagerLimit::Bytes);
        }
        num(g, "XRCBTL_ZCOPY_MIN", &mut self.zcopy_min)?;
        num(g, "XRCBTL_MAX_INLINE", &mut self.max_inline)?;
        num(g, "XRCBTL_RNDV_FRAG_SIZE", &mut self.rndv_frag_size)?;
        num(g, "XRCBTL_RNDV_PIPELINE", &mut self.rndv_pipeline)?;
        num(g, "XRCBTL_RNDV_MAX", &mut self.rndv_max)?;
        num(g, "XRCBTL_SEND_SLOTS", &mut self.send_slots)?;
        num(g, "XRCBTL_SMALL_SIZE", &mut self.small_size)?;
        num(g, "XRCBTL_SRQ_DEPTH", &mut self.srq_depth)?;
        num(g, "XRCBTL_SRQ_MAX_DEPTH", &mut self.srq_max_depth)?;
        num(g, "XRCBTL_SRQ_REFILL", &mut self.srq_refill)?;
        num(g, "XRCBTL_CREDITS", &mut self.credits)?;
        num(g, "XRCBTL_CQ_BATCH", &mut self.cq_batch)?;
        num(g, "XRCBTL_RCACHE_MAX_REGIONS", &mut self.rcache.max_regions)?;
        num(g, "XRCBTL_RCACHE_MAX_BYTES", &mut self.rcache.max_bytes)?;
        num(g, "XRCBTL_RETRIES", &mut self.retries)?;
        num(g, "XRCBTL_CONNECT_WINDOW", &mut self.connect_window)?;
        num(g, "XRCBTL_MIN_RNR_TIMER", &mut self.min_rnr_timer)?;
        num(g, "XRCBTL_ACK_TIMEOUT", &mut self.ack_timeout)?;
        if let Some(s) = g("XRCBTL_SQ_MAX") {
            let mut v = 0u32;
            num(g, "XRCBTL_SQ_MAX", &mut v)?;
            self.sq_max = (v > 0).then_some(v);
            let _ = s;
        }
        if let Some(s) = g("XRCBTL_AF_IB") {
            self.af_ib = flag("XRCBTL_AF_IB", &s)?;
        }
        if let Some(s) = g("XRCBTL_XRCD_DIR") {
            let s = s.trim();
            if !s.is_empty() && !s.starts_with('/') {
                return Err(Error::invalid(format!(
                    "XRCBTL_XRCD_DIR={s:?}: expected an absolute directory (every rank of a \
                     node must name the same one)"
                )));
            }
            self.xrcd_dir = (!s.is_empty()).then(|| std::path::PathBuf::from(s));
        }
        if let Some(s) = g("XRCBTL_RNDV_PROTOCOL") {
            self.rndv_protocol = match s.trim() {
                "auto" => RndvProtocol::Auto,
                "get" => RndvProtocol::Get,
                "put" => RndvProtocol::Put,
                _ => {
                    return Err(Error::invalid(format!(
                        "XRCBTL_RNDV_PROTOCOL={s:?}: expected auto, get or put"
                    )))
                }
            };
        }
        if let Some(s) = g("XRCBTL_SPLIT_LIMIT") {
            self.split_limit =
                auto_bytes("XRCBTL_SPLIT_LIMIT", &s)?.map_or(SplitLimit::Auto, SplitLimit::Bytes);
        }
        if let Some(s) = g("XRCBTL_PLACE") {
            self.place = match s.trim() {
                "auto" => crate::place::Place::Auto,
                "off" => crate::place::Place::Off,
                _ => {
                    return Err(Error::invalid(format!(
                        "XRCBTL_PLACE={s:?}: expected auto or off"
                    )))
                }
            };
        }
        if let Some(s) = g("XRCBTL_IDLE_YIELD") {
            self.idle_yield = match s.trim() {
                "auto" => IdleYield::Auto,
                "off" | "0" => IdleYield::Off,
                n => IdleYield::After(n.parse().map_err(|_| {
                    Error::invalid(format!(
                        "XRCBTL_IDLE_YIELD={s:?}: expected auto, off or a number of empty \
                         progress calls"
                    ))
                })?),
            };
        }
        if let Some(s) = g("XRCBTL_FORCE_RC") {
            self.force_rc = flag("XRCBTL_FORCE_RC", &s)?;
        }
        self.validate()?;
        Ok(self)
    }

    /// How long this rank's QPs take to find a silent peer dead: the first
    /// try and the CM's 7 retries of [`BtlConfig::ack_timeout`] each
    /// (537 ms with the default of 14). Tests wait a few times this for a
    /// failure to show.
    pub fn dead_peer_after(&self) -> Duration {
        xrcbtl_fabric::failure_detection_time(self.ack_timeout, 7).unwrap_or(Duration::MAX)
    }

    /// Checks every value against its bounds and the values against each
    /// other. An error names the `XRCBTL_*` variable of the value (the same
    /// whether it came from the environment, the C ABI's settings or code),
    /// the value, and the range it must lie in.
    pub fn validate(&self) -> Result<()> {
        let size = |v: usize| v as u64;
        let small_min = crate::wire::HEADER as u64 + 1;
        let mut checks: Vec<(&str, u64, u64, u64, &str)> = vec![
            (
                "XRCBTL_ZCOPY_MIN",
                size(self.zcopy_min),
                0,
                1 << 30,
                "bytes",
            ),
            (
                "XRCBTL_MAX_INLINE",
                self.max_inline.into(),
                0,
                1 << 16,
                "bytes",
            ),
            (
                "XRCBTL_RNDV_FRAG_SIZE",
                size(self.rndv_frag_size),
                4096,
                1 << 30,
                "bytes",
            ),
            (
                "XRCBTL_RNDV_PIPELINE",
                self.rndv_pipeline.into(),
                1,
                128,
                "fragments",
            ),
            ("XRCBTL_RNDV_MAX", self.rndv_max, 1 << 20, MAX_RNDV, "bytes"),
            (
                "XRCBTL_SEND_SLOTS",
                self.send_slots.into(),
                1,
                1 << 16,
                "buffers",
            ),
            (
                "XRCBTL_SRQ_MAX_DEPTH",
                self.srq_max_depth.into(),
                1,
                1 << 20,
                "receives",
            ),
            // At most the max depth: a class starts no deeper than it may grow.
            (
                "XRCBTL_SRQ_DEPTH",
                self.srq_depth.into(),
                1,
                self.srq_max_depth.into(),
                "receives, at most XRCBTL_SRQ_MAX_DEPTH",
            ),
            (
                "XRCBTL_SRQ_REFILL",
                self.srq_refill.into(),
                1,
                4096,
                "receives",
            ),
            (
                "XRCBTL_CREDITS",
                self.credits.into(),
                4,
                u16::MAX.into(),
                "messages",
            ),
            (
                "XRCBTL_CQ_BATCH",
                size(self.cq_batch),
                1,
                1024,
                "completions",
            ),
            (
                "XRCBTL_RCACHE_MAX_REGIONS",
                size(self.rcache.max_regions),
                1,
                1 << 24,
                "registrations",
            ),
            (
                "XRCBTL_RCACHE_MAX_BYTES",
                size(self.rcache.max_bytes),
                1 << 20,
                u64::MAX,
                "bytes",
            ),
            ("XRCBTL_RETRIES", self.retries.into(), 1, 1000, "attempts"),
            (
                "XRCBTL_CONNECT_WINDOW",
                size(self.connect_window),
                0,
                1 << 20,
                "exchanges; 0 for no limit",
            ),
            (
                "XRCBTL_MIN_RNR_TIMER",
                self.min_rnr_timer.into(),
                0,
                31,
                "the IB encoding",
            ),
            // 0 would wait forever, and never find a dead peer.
            (
                "XRCBTL_ACK_TIMEOUT",
                self.ack_timeout.into(),
                1,
                31,
                "the IB encoding; 0, forever, would never find a dead peer",
            ),
        ];
        if let Some(v) = self.sq_max {
            checks.push((
                "XRCBTL_SQ_MAX",
                v.into(),
                1,
                1 << 20,
                "requests, or 0 for the device's maximum",
            ));
        }
        if self.small_size != 0 {
            checks.push((
                "XRCBTL_SMALL_SIZE",
                self.small_size.into(),
                small_min,
                1 << 20,
                "bytes, more than the header, or 0 for one class",
            ));
        }
        if let EagerLimit::Bytes(n) = self.eager_limit {
            checks.push(("XRCBTL_EAGER_LIMIT", size(n), 1, 1 << 20, "bytes, or auto"));
        }
        if let SplitLimit::Bytes(n) = self.split_limit {
            checks.push((
                "XRCBTL_SPLIT_LIMIT",
                size(n),
                0,
                size(MAX_SPLIT),
                "bytes, or auto",
            ));
        }
        if let IdleYield::After(n) = self.idle_yield {
            checks.push((
                "XRCBTL_IDLE_YIELD",
                n.into(),
                1,
                1 << 20,
                "empty progress calls, or auto, or off",
            ));
        }
        for (var, v, lo, hi, unit) in checks {
            if !(lo..=hi).contains(&v) {
                return Err(Error::invalid(format!(
                    "{var}={v} is outside {lo}..={hi} ({unit})"
                )));
            }
        }
        Ok(())
    }

    /// Refuses an `XRCBTL_*` name that is neither a setting nor one of the
    /// few variables the tests and scripts read (`XRCBTL_TEST_DEVICE`,
    /// `XRCBTL_NODE_ADDRS`, `XRCBTL_NODE_NETNS`, `XRCBTL_SEED`): a misspelt
    /// setting would otherwise be ignored without a word. The error names
    /// the closest setting.
    pub fn check_names<S: AsRef<str>>(names: impl IntoIterator<Item = S>) -> Result<()> {
        const OTHERS: [&str; 4] = [
            "XRCBTL_TEST_DEVICE",
            "XRCBTL_NODE_ADDRS",
            "XRCBTL_NODE_NETNS",
            "XRCBTL_SEED",
        ];
        for name in names {
            let name = name.as_ref();
            if !name.starts_with("XRCBTL_")
                || OTHERS.contains(&name)
                || SETTINGS.iter().any(|s| s.name == name)
            {
                continue;
            }
            let closest = SETTINGS
                .iter()
                .min_by_key(|s| edit_distance(s.name, name))
                .map_or("", |s| s.name);
            return Err(Error::invalid(format!(
                "{name} is not a setting of xrcbtl (did you mean {closest}?); the settings are \
                 listed in the documentation of xrcbtl_btl::config"
            )));
        }
        Ok(())
    }
}

/// Levenshtein distance between two ASCII names.
fn edit_distance(a: &str, b: &str) -> usize {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != cb))
                .min(prev[j + 1] + 1)
                .min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> BtlConfig {
        let mut c = BtlConfig::new(
            0,
            0,
            1,
            XrcdKey::new("t"),
            "127.0.0.1:0".parse().expect("an address"),
        );
        c.clock = Clock::from_fn(|| Duration::ZERO);
        c
    }

    #[test]
    fn the_settings_table_matches_the_documented_one() {
        let src = include_str!("mod.rs");
        let doc: Vec<(String, String)> = src
            .lines()
            .filter_map(|l| l.strip_prefix("//! | `XRCBTL_"))
            .map(|row| {
                let mut f = row.split('|').map(str::trim);
                let name = format!("XRCBTL_{}", f.next().unwrap_or("").trim_end_matches('`'));
                let default = match f.next().unwrap_or("").trim_matches('`') {
                    "(empty)" => String::new(),
                    d => d.to_string(),
                };
                (name, default)
            })
            .collect();
        let table: Vec<(String, String)> = SETTINGS
            .iter()
            .map(|s| (s.name.to_string(), s.default.to_string()))
            .collect();
        assert_eq!(doc, table);
    }

    #[test]
    fn every_setting_is_read_and_its_default_is_the_default() {
        for s in SETTINGS {
            let bad = cfg().with_vars(|k| (k == s.name).then(|| "not-a-value".to_string()));
            assert!(bad.is_err(), "{} is not read", s.name);
            let same = cfg()
                .with_vars(|k| (k == s.name).then(|| s.default.to_string()))
                .expect("the default is valid");
            assert_eq!(
                format!("{same:?}"),
                format!("{:?}", cfg()),
                "{}'s default differs from BtlConfig::new",
                s.name
            );
        }
    }

    #[test]
    fn out_of_range_values_are_refused_naming_the_variable() {
        for (var, v) in [
            ("XRCBTL_CQ_BATCH", "4294967296"),
            ("XRCBTL_CQ_BATCH", "0"),
            ("XRCBTL_RNDV_PIPELINE", "4294967295"),
            ("XRCBTL_EAGER_LIMIT", "2097152"),
            ("XRCBTL_SEND_SLOTS", "0"),
            ("XRCBTL_SRQ_DEPTH", "2048"),
            ("XRCBTL_SRQ_MAX_DEPTH", "99999999"),
            ("XRCBTL_RETRIES", "0"),
            ("XRCBTL_CONNECT_WINDOW", "2000000"),
            ("XRCBTL_RCACHE_MAX_REGIONS", "0"),
            ("XRCBTL_RCACHE_MAX_BYTES", "4096"),
            ("XRCBTL_SMALL_SIZE", "8"),
            ("XRCBTL_IDLE_YIELD", "4294967295"),
            ("XRCBTL_SQ_MAX", "4294967295"),
            ("XRCBTL_ACK_TIMEOUT", "0"),
        ] {
            let err = cfg()
                .with_vars(|k| (k == var).then(|| v.to_string()))
                .expect_err(var)
                .to_string();
            assert!(
                err.contains(&format!("{var}={v}")) && err.contains("outside"),
                "{var}={v}: {err}"
            );
        }
        // The bounds themselves are accepted.
        for (var, v) in [("XRCBTL_CQ_BATCH", "1024"), ("XRCBTL_RNDV_PIPELINE", "128")] {
            cfg()
                .with_vars(|k| (k == var).then(|| v.to_string()))
                .expect(var);
        }
    }

    #[test]
    fn a_misspelt_variable_is_refused_with_the_closest_setting() {
        let err = BtlConfig::check_names(["PATH", "XRCBTL_EAGER_LIMT"])
            .unwrap_err()
            .to_string();
        assert!(err.contains("XRCBTL_EAGER_LIMT"), "{err}");
        assert!(err.contains("did you mean XRCBTL_EAGER_LIMIT?"), "{err}");
        let names: Vec<&str> = SETTINGS.iter().map(|s| s.name).collect();
        BtlConfig::check_names(names).expect("every setting");
        BtlConfig::check_names(["XRCBTL_TEST_DEVICE", "XRCBTL_SEED", "HOME"]).expect("others");
    }
}
