//! Plain data exchanged with a fabric: device capabilities, access flags, QP
//! attributes, work requests, work completions and asynchronous events.
//!
//! These mirror the verbs structures field for field where the BTL needs the
//! field, so that a verbs provider converts them without loss.

use std::fmt;
use std::ops::{BitOr, BitOrAssign};
use std::path::PathBuf;

/// The wire protocol underneath a device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Transport {
    /// Native InfiniBand.
    Infiniband,
    /// InfiniBand transport over Ethernet (RoCE v1/v2, rdma_rxe).
    Roce,
    /// iWARP (RDMAP/DDP/MPA over TCP: cxgb4, irdma, siw). No XRC, no
    /// immediate data, and the MPA initiator must send first.
    Iwarp,
}

impl Transport {
    /// Whether the transport is one of the InfiniBand family (IB or RoCE),
    /// which share the IB CM and the IB transport semantics.
    pub fn is_ib_family(self) -> bool {
        matches!(self, Transport::Infiniband | Transport::Roce)
    }
}

impl DeviceCaps {
    /// Largest inline payload a send queue of this QP type accepts.
    pub fn max_inline_for(&self, ty: QpType) -> u32 {
        match ty {
            QpType::Rc => self.max_inline,
            QpType::XrcIni => self.max_inline_xrc,
            QpType::XrcTgt => 0,
        }
    }

    /// Refuses a region of `len` bytes beyond `max_mr_size`, as every
    /// provider must before the device sees it (rxe: [`RXE_MR_SIZE_MAX`]).
    pub fn check_mr_len(&self, len: u64) -> crate::Result<()> {
        if len > self.max_mr_size {
            return Err(crate::Error::invalid(format!(
                "region of {len} bytes exceeds max_mr_size ({})",
                self.max_mr_size
            )));
        }
        Ok(())
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Transport::Infiniband => "InfiniBand",
            Transport::Roce => "RoCE",
            Transport::Iwarp => "iWARP",
        })
    }
}

/// What a device can do, as read from the device (`ibv_query_device_ex` on
/// real verbs). Upper layers take every protocol decision from here, never
/// from a device name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceCaps {
    /// Wire protocol.
    pub transport: Transport,
    /// XRC domains, XRC SRQs and XRC INI/TGT QPs are available
    /// (`IBV_DEVICE_XRC`).
    pub xrc: bool,
    /// Shared receive queues are available (`max_srq > 0`).
    pub srq: bool,
    /// Send and RDMA write with immediate data are available.
    pub imm_data: bool,
    /// Most QPs the device can hold.
    pub max_qp: u32,
    /// Deepest send or receive queue of a QP.
    pub max_qp_wr: u32,
    /// Most SRQs the device can hold.
    pub max_srq: u32,
    /// Deepest SRQ.
    pub max_srq_wr: u32,
    /// Most scatter/gather entries in a send or receive work request.
    pub max_sge: u32,
    /// Most scatter/gather entries in an RDMA read.
    pub max_sge_rd: u32,
    /// Deepest completion queue.
    pub max_cqe: u32,
    /// Largest inline payload an RC send queue accepts (on real verbs found
    /// by creating a probe QP, as the device attributes do not carry it).
    pub max_inline: u32,
    /// Largest inline payload an XRC INI send queue accepts (0 without
    /// XRC): less than RC's where the send WQE carries the remote SRQ number
    /// in a segment of its own (16 bytes on mlx5), so probed separately.
    pub max_inline_xrc: u32,
    /// Largest memory region.
    pub max_mr_size: u64,
    /// Most RDMA reads a QP may have outstanding as initiator or responder.
    pub max_qp_rd_atom: u32,
    /// 64-bit fetch-and-add and compare-and-swap are available, atomic with
    /// respect to other atomics through this device (`atomic_cap` of
    /// `IBV_ATOMIC_HCA` or `IBV_ATOMIC_GLOB`; iWARP devices have none).
    pub atomics: bool,
    /// The host's own kernel plays the device (Soft-RoCE `rdma_rxe`,
    /// soft-iWARP `siw`): its protocol work runs in kernel threads and
    /// softirqs on the CPUs the application runs on, so that a process
    /// spinning on a CQ can hold up the very work it waits for. Known from
    /// the vendor ids those drivers report; false on hardware and on the
    /// simulator.
    pub host_emulated: bool,
}

/// The largest region rdma_rxe registers, whatever `max_mr_size` it
/// reports (2^64 - 1). Linux 6.12's rxe keeps one 16-byte entry per page of
/// a region in a single `kcalloc`ed array, and the page allocator refuses
/// an array past 4 MiB (262,144 pages) with a kernel WARNING: the
/// registration then fails with ENOMEM after the warning. A region of this
/// many bytes spans at most 262,144 pages at any alignment, so the verbs
/// provider reports it as rxe's `max_mr_size` and refuses larger regions
/// before the kernel sees them (scripts/repro/rxe_big_mr.c shows the
/// kernel's side).
pub const RXE_MR_SIZE_MAX: u64 = (1 << 30) - 4096;

/// A device as listed by [`crate::Fabric::devices`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceInfo {
    /// Device name (`mlx5_0`, `rxe0`, `sim0`).
    pub name: String,
    /// IEEE vendor id the device reports (0 on the simulator); identifies a
    /// provider's known quirks, never its capabilities.
    pub vendor_id: u32,
    /// Capabilities.
    pub caps: DeviceCaps,
}

/// A 128-bit global identifier of a port (IPv6 format; RoCE v2 GIDs carry the
/// interface's IPv4 address as `::ffff:a.b.c.d`).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, pair) in self.0.chunks(2).enumerate() {
            if i > 0 {
                f.write_str(":")?;
            }
            write!(f, "{:02x}{:02x}", pair[0], pair[1])?;
        }
        Ok(())
    }
}

/// State of a physical port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PortState {
    /// Link up, traffic flows.
    Active,
    /// Link down or not yet initialised.
    Down,
}

/// Attributes of a device port, as `ibv_query_port` reports them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortAttr {
    /// Port state.
    pub state: PortState,
    /// Local identifier (InfiniBand only; 0 elsewhere).
    pub lid: u16,
    /// GID at index 0.
    pub gid: Gid,
    /// Active MTU in bytes.
    pub active_mtu: u32,
}

/// Where a QP can be reached: the address half of an RTR transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct PortAddr {
    /// Destination LID (InfiniBand).
    pub lid: u16,
    /// Destination GID (RoCE; also IB across subnets).
    pub gid: Gid,
}

/// Memory access rights of a memory region or of a QP's responder.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    /// No rights beyond local read.
    pub const NONE: Access = Access(0);
    /// The device may write the memory locally (needed for receives and for
    /// the sink of an RDMA read).
    pub const LOCAL_WRITE: Access = Access(1);
    /// Remote peers may RDMA-write the memory.
    pub const REMOTE_WRITE: Access = Access(1 << 1);
    /// Remote peers may RDMA-read the memory.
    pub const REMOTE_READ: Access = Access(1 << 2);
    /// Remote peers may run atomics on the memory.
    pub const REMOTE_ATOMIC: Access = Access(1 << 3);

    /// Raw bits (the `IBV_ACCESS_*` values).
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// From raw bits; bits that name no right above are dropped.
    pub const fn from_bits(bits: u32) -> Access {
        Access(bits & 0xF)
    }

    /// Whether every right in `other` is also in `self`.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl BitOrAssign for Access {
    fn bitor_assign(&mut self, rhs: Access) {
        self.0 |= rhs.0;
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = [
            (Access::LOCAL_WRITE, "LOCAL_WRITE"),
            (Access::REMOTE_WRITE, "REMOTE_WRITE"),
            (Access::REMOTE_READ, "REMOTE_READ"),
            (Access::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
        ];
        let set: Vec<&str> = names
            .iter()
            .filter(|(a, _)| self.contains(*a))
            .map(|(_, n)| *n)
            .collect();
        if set.is_empty() {
            f.write_str("NONE")
        } else {
            f.write_str(&set.join("|"))
        }
    }
}

/// The key that lets the processes of one node share an XRC domain. On real
/// verbs it is a file every rank of the job on the node opens; on the
/// simulated fabric it only needs to be equal between the ranks.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct XrcdKey(pub PathBuf);

impl XrcdKey {
    /// Key from anything path-like.
    pub fn new(path: impl Into<PathBuf>) -> Self {
        XrcdKey(path.into())
    }
}

/// Which XRC domain a handle is on: the identity of the key file the
/// kernel found it by (`st_dev`, `st_ino`) on real verbs, of the domain
/// object on the simulated fabric. Ranks of one node exchange it to check
/// that they share one domain: their keys could name different files.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct XrcdId {
    /// The device of the key's file system (the simulated device).
    pub dev: u64,
    /// The key file's inode (the simulated domain's number).
    pub ino: u64,
}

/// Kind of queue pair.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QpType {
    /// Reliable connected: a send queue and a receive queue (or an SRQ).
    Rc,
    /// XRC initiator: send only; every work request names the remote XRC SRQ.
    XrcIni,
    /// XRC target: receive only, lives in an XRC domain, delivers into the
    /// domain's XRC SRQs; opened by number from other processes.
    XrcTgt,
}

/// QP state (the subset of `ibv_qp_state` the BTL drives).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QpState {
    /// Just created; nothing can be posted.
    Reset,
    /// Receives may be posted; nothing flows.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Broken: every outstanding and every newly posted work request
    /// completes with a flush error.
    Error,
}

/// Queue sizes of a QP, requested at creation and reported back as granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpCaps {
    /// Send queue depth.
    pub max_send_wr: u32,
    /// Receive queue depth (0 with an SRQ or for XRC QPs).
    pub max_recv_wr: u32,
    /// SGEs per send work request.
    pub max_send_sge: u32,
    /// SGEs per receive work request.
    pub max_recv_sge: u32,
    /// Largest inline payload.
    pub max_inline: u32,
}

impl Default for QpCaps {
    fn default() -> Self {
        QpCaps {
            max_send_wr: 64,
            max_recv_wr: 64,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline: 0,
        }
    }
}

/// Attributes of the RESET→INIT transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InitAttr {
    /// Port number (1-based).
    pub port: u8,
    /// What remote peers may do through this QP as responder.
    pub access: Access,
}

impl Default for InitAttr {
    fn default() -> Self {
        InitAttr {
            port: 1,
            access: Access::REMOTE_WRITE | Access::REMOTE_READ,
        }
    }
}

/// Attributes of the INIT→RTR transition: where the peer QP is.
///
/// The responder attributes are optional because the kernel allows them
/// per QP type (`qp_state_table`): an RC or XRC TGT QP must set both, an
/// XRC INI QP (which receives nothing) must set neither, or the modify
/// fails with `EINVAL`. [`RtrAttr::new`] is right for RC and TGT QPs,
/// [`RtrAttr::initiator`] for INI QPs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtrAttr {
    /// Peer's port.
    pub dest: PortAddr,
    /// Peer's QP number.
    pub dest_qpn: u32,
    /// First packet sequence number expected from the peer.
    pub rq_psn: u32,
    /// RDMA reads the peer may have outstanding against this QP (responder
    /// attribute).
    pub max_dest_rd_atomic: Option<u8>,
    /// RNR NAK timer this QP advertises, in the IB 5-bit encoding
    /// (responder attribute; 0 means 655.36 ms, 12 means 0.64 ms).
    pub min_rnr_timer: Option<u8>,
}

impl RtrAttr {
    /// RTR attributes of a responder (RC or XRC TGT) for a given peer.
    pub fn new(dest: PortAddr, dest_qpn: u32) -> Self {
        RtrAttr {
            dest,
            dest_qpn,
            rq_psn: 0,
            max_dest_rd_atomic: Some(16),
            min_rnr_timer: Some(DEFAULT_MIN_RNR_TIMER),
        }
    }

    /// RTR attributes of an XRC INI QP: no responder attributes.
    pub fn initiator(dest: PortAddr, dest_qpn: u32) -> Self {
        RtrAttr {
            max_dest_rd_atomic: None,
            min_rnr_timer: None,
            ..RtrAttr::new(dest, dest_qpn)
        }
    }
}

/// The RNR NAK timer xrcbtl's responders advertise unless configured: 12,
/// 0.64 ms (the CM's own choice, 0, means 655.36 ms).
pub const DEFAULT_MIN_RNR_TIMER: u8 = 12;

/// Receives [`Srq::post_set`](crate::Srq::post_set) links into one
/// call into the device (`ibv_post_srq_recv`); the simulator counts its
/// calls the same way.
pub(crate) const RECV_CHAIN: usize = 16;

/// The rule of a chain of prepared receives, kept once for every
/// [`crate::RecvSet`]: each number names a receive of the set, and none
/// appears twice (linked in place, it would point the chain into itself).
/// Each receive keeps the number of the last chain it was in.
#[derive(Default)]
pub(crate) struct ChainMarks {
    last: Vec<u32>,
    chain: u32,
}

impl ChainMarks {
    /// Makes room for a set of `len` receives.
    pub(crate) fn grow(&mut self, len: usize) {
        self.last.resize(len, 0);
    }

    /// Receives it has marks for.
    #[cfg(feature = "verbs")]
    pub(crate) fn len(&self) -> usize {
        self.last.len()
    }

    /// Starts a chain.
    pub(crate) fn start(&mut self) {
        self.chain = self.chain.wrapping_add(1);
        if self.chain == 0 {
            // Every mark is from an older chain: clear them, and skip 0,
            // the mark of a receive never chained.
            self.last.fill(0);
            self.chain = 1;
        }
    }

    /// Admits receive `n` into this chain: an error if the set (of the
    /// length given to `grow`) has no receive `n`, or the chain has it
    /// already.
    pub(crate) fn admit(&mut self, n: usize) -> crate::Result<()> {
        let Some(mark) = self.last.get_mut(n) else {
            return Err(crate::Error::invalid(format!(
                "receive {n} is not in the set"
            )));
        };
        if *mark == self.chain {
            return Err(crate::Error::invalid(format!(
                "receive {n} twice in a chain"
            )));
        }
        *mark = self.chain;
        Ok(())
    }
}

/// The local ACK timeout xrcbtl's requesters use unless configured: 14,
/// 4.096 µs × 2^14 = 67 ms per try, so that with 7 retries a dead peer is
/// found in about half a second (the CM's derived value on RoCE, about
/// 18, takes 1 s per try and 8 s in all).
pub const DEFAULT_ACK_TIMEOUT: u8 = 14;

/// Duration of an RNR NAK timer value (IBA table 45).
pub fn rnr_timer_duration(v: u8) -> std::time::Duration {
    // In units of 10 µs; 0 is the longest, 655.36 ms.
    const UNITS: [u64; 32] = [
        65_536, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024,
        1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384, 24576, 32768, 49152,
    ];
    std::time::Duration::from_micros(UNITS[usize::from(v & 31)] * 10)
}

/// Duration of a local ACK timeout value: 4.096 µs × 2^v (0: infinite,
/// returned as `None`).
pub fn ack_timeout_duration(v: u8) -> Option<std::time::Duration> {
    (v != 0).then(|| std::time::Duration::from_nanos(4096u64 << u32::from(v.min(31))))
}

/// How long a requester takes to give up on a peer that answers nothing:
/// the first try and `retry_cnt` retries of `ack_timeout` each (`None`: the
/// timeout is infinite).
pub fn failure_detection_time(ack_timeout: u8, retry_cnt: u8) -> Option<std::time::Duration> {
    ack_timeout_duration(ack_timeout).map(|t| t * (u32::from(retry_cnt.min(7)) + 1))
}

/// Attributes of the RTR→RTS transition: the requester's retry policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RtsAttr {
    /// First packet sequence number sent.
    pub sq_psn: u32,
    /// Local ACK timeout, IB encoding: 4.096 µs × 2^timeout.
    pub timeout: u8,
    /// Transport retries before `RetryExceeded` (0..=7).
    pub retry_cnt: u8,
    /// RNR retries before `RnrRetryExceeded` (0..=6; 7 retries forever).
    pub rnr_retry: u8,
    /// RDMA reads this QP may have outstanding.
    pub max_rd_atomic: u8,
}

impl Default for RtsAttr {
    fn default() -> Self {
        RtsAttr {
            sq_psn: 0,
            timeout: DEFAULT_ACK_TIMEOUT,
            retry_cnt: 7,
            rnr_retry: 7,
            max_rd_atomic: 16,
        }
    }
}

/// What `ibv_query_qp` reports of a QP.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QpAttr {
    /// Current state.
    pub state: QpState,
    /// RNR NAK timer it advertises as responder (IB encoding).
    pub min_rnr_timer: u8,
    /// Local ACK timeout as requester (IB encoding).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// RNR retries.
    pub rnr_retry: u8,
    /// Granted inline limit.
    pub max_inline: u32,
}

/// A QP state change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QpTransition {
    /// RESET→INIT.
    Init(InitAttr),
    /// INIT→RTR.
    Rtr(RtrAttr),
    /// RTR→RTS.
    Rts(RtsAttr),
    /// Any→ERROR: flush everything outstanding.
    Error,
    /// Any→RESET: drop everything, the QP can be connected again.
    Reset,
}

/// One scatter/gather element: a range of registered memory.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sge {
    /// Start address.
    pub addr: u64,
    /// Length in bytes.
    pub length: u32,
    /// Local key of a memory region covering the range.
    pub lkey: u32,
}

/// The remote half of an RDMA operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RemoteAddr {
    /// Remote virtual address.
    pub addr: u64,
    /// Remote key of a memory region covering the range.
    pub rkey: u32,
}

/// What a send work request does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendOp {
    /// Two-sided send, consumes a receive at the peer.
    Send,
    /// Send carrying 32 bits of immediate data.
    SendWithImm(u32),
    /// RDMA write into the peer's memory; no receive consumed.
    Write(RemoteAddr),
    /// RDMA write that also consumes a receive and delivers the immediate.
    WriteWithImm(RemoteAddr, u32),
    /// RDMA read from the peer's memory into the local SGEs.
    Read(RemoteAddr),
    /// 64-bit fetch-and-add at an 8-byte aligned remote address: the
    /// responder adds `add` and returns the value it found, which lands in
    /// the local SGEs (8 bytes, host order). Needs [`DeviceCaps::atomics`],
    /// and `REMOTE_ATOMIC` on the remote region and the responder QP.
    FetchAdd {
        /// The remote 64-bit word.
        remote: RemoteAddr,
        /// What to add (wrapping).
        add: u64,
    },
    /// 64-bit compare-and-swap at an 8-byte aligned remote address: the
    /// responder stores `swap` if it finds `compare`, and returns the value
    /// it found either way (into the local SGEs, 8 bytes, host order).
    CompareSwap {
        /// The remote 64-bit word.
        remote: RemoteAddr,
        /// The value expected there.
        compare: u64,
        /// The value stored when it matches.
        swap: u64,
    },
}

impl SendOp {
    /// Whether the responder answers with data that lands in the local
    /// SGEs (a read or an atomic), rather than taking data from them.
    pub fn fetches(&self) -> bool {
        matches!(
            self,
            SendOp::Read(_) | SendOp::FetchAdd { .. } | SendOp::CompareSwap { .. }
        )
    }

    /// Whether this is a 64-bit atomic.
    pub fn is_atomic(&self) -> bool {
        matches!(self, SendOp::FetchAdd { .. } | SendOp::CompareSwap { .. })
    }
}

/// Where the bytes of a send come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload<'a> {
    /// Gathered from registered memory when the device processes the request.
    Sgl(&'a [Sge]),
    /// Copied into the work queue at post time; needs no registration. Sends
    /// and writes only, up to the QP's `max_inline`.
    Inline(&'a [u8]),
}

impl Payload<'_> {
    /// Total length in bytes.
    pub fn len(&self) -> u64 {
        match self {
            Payload::Sgl(sgl) => sgl.iter().map(|s| u64::from(s.length)).sum(),
            Payload::Inline(data) => data.len() as u64,
        }
    }

    /// Whether the payload is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A send-queue work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Operation.
    pub op: SendOp,
    /// Local data (the sink for a read).
    pub payload: Payload<'a>,
    /// Generate a completion on success (errors always complete).
    pub signaled: bool,
    /// Wait for earlier RDMA reads to finish before starting.
    pub fence: bool,
    /// XRC INI QPs only: the SRQ number at the target that receives (and
    /// whose protection domain governs RDMA access).
    pub remote_srqn: Option<u32>,
}

impl<'a> SendWr<'a> {
    /// A signaled work request of the given operation.
    pub fn new(wr_id: u64, op: SendOp, payload: Payload<'a>) -> Self {
        SendWr {
            wr_id,
            op,
            payload,
            signaled: true,
            fence: false,
            remote_srqn: None,
        }
    }

    /// A two-sided send of `data` inline, to SRQ `remote_srqn` at the
    /// target of an XRC INI QP, signaled or not ([`crate::Qp::post_inline`]).
    pub fn inline(wr_id: u64, data: &'a [u8], remote_srqn: Option<u32>, signaled: bool) -> Self {
        SendWr {
            remote_srqn,
            signaled,
            ..SendWr::new(wr_id, SendOp::Send, Payload::Inline(data))
        }
    }

    /// A signaled two-sided send of `sgl`.
    pub fn send(wr_id: u64, sgl: &'a [Sge]) -> Self {
        SendWr::new(wr_id, SendOp::Send, Payload::Sgl(sgl))
    }

    /// Addressed to an XRC SRQ (required on XRC INI QPs).
    pub fn to_srq(mut self, srqn: u32) -> Self {
        self.remote_srqn = Some(srqn);
        self
    }

    /// Without a completion on success.
    pub fn unsignaled(mut self) -> Self {
        self.signaled = false;
        self
    }
}

/// A receive work request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvWr<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// Where an incoming message is scattered.
    pub sgl: &'a [Sge],
}

/// Status of a completion (`ibv_wc_status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcStatus {
    /// Done.
    Success,
    /// A receive buffer was too small for the message.
    LocalLength,
    /// Internal QP consistency error.
    LocalQpOperation,
    /// An SGE's lkey is unknown, of another PD, or does not cover the range.
    LocalProtection,
    /// The QP was in (or went to) the error state before this request ran.
    WrFlush,
    /// Unexpected transport response.
    BadResponse,
    /// Protection error on the local data of an RDMA read response.
    LocalAccess,
    /// The responder rejected the request (unknown XRC SRQ, message too
    /// long, unsupported operation).
    RemoteInvalidRequest,
    /// The responder refused the rkey: unknown, wrong PD, access not
    /// granted, or range outside the region.
    RemoteAccess,
    /// The responder failed to complete the operation.
    RemoteOperation,
    /// No acknowledgement after the transport retries: peer gone, path down.
    RetryExceeded,
    /// The responder had no receive posted for longer than the RNR retries.
    RnrRetryExceeded,
    /// Fatal device error.
    Fatal,
    /// Anything else.
    General,
}

/// What a completion completes (`ibv_wc_opcode`). Meaningful on success;
/// on error the verbs leave it undefined.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WcOpcode {
    /// A send (with or without immediate).
    Send,
    /// An RDMA write (with or without immediate).
    RdmaWrite,
    /// An RDMA read.
    RdmaRead,
    /// A fetch-and-add.
    FetchAdd,
    /// A compare-and-swap.
    CompareSwap,
    /// A receive of a send.
    Recv,
    /// A receive consumed by an RDMA write with immediate.
    RecvRdmaWithImm,
}

/// One completion (`ibv_wc`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The work request's id.
    pub wr_id: u64,
    /// Outcome.
    pub status: WcStatus,
    /// What completed.
    pub opcode: WcOpcode,
    /// Bytes received (receives) or read (RDMA reads).
    pub byte_len: u32,
    /// Local QP the work request belonged to. For receives on an XRC SRQ,
    /// the XRC TGT QP the message came through.
    pub qp_num: u32,
    /// Sending QP; defined by verbs for UD only, so connected-mode code must
    /// not depend on it.
    pub src_qp: u32,
    /// Immediate data, if the message carried some.
    pub imm: Option<u32>,
}

impl Default for WorkCompletion {
    fn default() -> Self {
        WorkCompletion {
            wr_id: 0,
            status: WcStatus::General,
            opcode: WcOpcode::Send,
            byte_len: 0,
            qp_num: 0,
            src_qp: 0,
            imm: None,
        }
    }
}

/// A receive that succeeded and carried no immediate data: the completion
/// a receive CQ holds most, with only what reading it takes. A staged poll
/// hands it over read in place ([`crate::Cq::staged_recv`]), so the
/// usual completion is not built as a whole [`WorkCompletion`] first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecvDone {
    /// The receive's id.
    pub wr_id: u64,
    /// Bytes received.
    pub byte_len: u32,
    /// As [`WorkCompletion::qp_num`]: for a receive on an XRC SRQ, the TGT
    /// QP the message came through.
    pub qp_num: u32,
}

impl RecvDone {
    /// The whole completion this was read from. Its `src_qp`, which
    /// verbs define for UD only, is 0.
    pub fn completion(self) -> WorkCompletion {
        WorkCompletion {
            wr_id: self.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: self.byte_len,
            qp_num: self.qp_num,
            src_qp: 0,
            imm: None,
        }
    }
}

impl WorkCompletion {
    /// This completion as a [`RecvDone`], if it is one: a receive
    /// ([`WcOpcode::Recv`]) that succeeded without immediate data.
    #[inline(always)]
    pub fn recv_done(&self) -> Option<RecvDone> {
        (self.status == WcStatus::Success && self.opcode == WcOpcode::Recv && self.imm.is_none())
            .then_some(RecvDone {
                wr_id: self.wr_id,
                byte_len: self.byte_len,
                qp_num: self.qp_num,
            })
    }
}

/// Attributes of a shared receive queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SrqAttr {
    /// Receive work requests it can hold.
    pub max_wr: u32,
    /// SGEs per receive.
    pub max_sge: u32,
    /// Arm the limit event: fire once when fewer than this many receives
    /// remain (0 = not armed).
    pub srq_limit: u32,
}

impl Default for SrqAttr {
    fn default() -> Self {
        SrqAttr {
            max_wr: 256,
            max_sge: 1,
            srq_limit: 0,
        }
    }
}

/// An asynchronous event (`ibv_get_async_event`). Events affiliated with a
/// shared XRC TGT QP are delivered to every process that has it open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AsyncEvent {
    /// A QP went to the error state for a reason not tied to a work request
    /// (a fault, a CQ overrun, a torn-down iWARP connection).
    QpFatal {
        /// The QP's number.
        qpn: u32,
    },
    /// The QP, as responder, received a request it could not accept (unknown
    /// XRC SRQ, message too long) and went to the error state.
    QpRequestError {
        /// The QP's number.
        qpn: u32,
    },
    /// The QP, as responder, refused an rkey and went to the error state.
    QpAccessError {
        /// The QP's number.
        qpn: u32,
    },
    /// A QP attached to an SRQ went to the error state and will consume no
    /// more of the SRQ's receives.
    QpLastWqeReached {
        /// The QP's number.
        qpn: u32,
    },
    /// A QP in RTR received its first packet: the peer considers the
    /// connection established even if the CM's RTU has not arrived (hand it
    /// to [`CmId::notify_established`](crate::CmId::notify_established)).
    /// For a shared TGT QP every opener hears it.
    CommEstablished {
        /// The QP's number.
        qpn: u32,
    },
    /// An SRQ dropped below its armed limit (the limit is disarmed).
    SrqLimitReached {
        /// The SRQ's [`crate::Srq::id`].
        srq: u64,
    },
    /// A completion queue overran.
    CqError {
        /// The CQ's [`crate::Cq::id`].
        cq: u64,
    },
    /// A port came up.
    PortActive {
        /// Port number.
        port: u8,
    },
    /// A port went down.
    PortError {
        /// Port number.
        port: u8,
    },
}
