//! The values of settings that are more than a number: which way a
//! rendezvous goes, the eager and split limits with their automatic
//! choices, when an idle progress loop yields, and the clock.

use std::sync::Arc;
use std::time::{Duration, Instant};

/// Which RDMA operation moves a rendezvous's data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RndvProtocol {
    /// Chosen per device: put on iWARP, where a read response waits for
    /// the responder's kernel thread (soft-iWARP) and reads need the sink
    /// registered for remote write anyway; get elsewhere.
    Auto,
    /// The receiver reads from the sender's memory (RTS, reads, ATS).
    Get,
    /// The sender writes into memory the receiver offers (RTS, RTR, writes,
    /// FIN).
    Put,
}

impl RndvProtocol {
    /// Whether rendezvous on a device of `transport` use put.
    pub fn is_put(self, transport: xrcbtl_fabric::Transport) -> bool {
        match self {
            RndvProtocol::Auto => transport == xrcbtl_fabric::Transport::Iwarp,
            RndvProtocol::Get => false,
            RndvProtocol::Put => true,
        }
    }
}

/// Which payloads go eagerly: sent in one message into a receive buffer
/// the peer posted in advance, which is this large (plus the header).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EagerLimit {
    /// 64 KiB where the BTL runs RC + SRQ (iWARP, and devices without XRC
    /// such as Soft-RoCE), 8 KiB under XRC. A rendezvous takes three legs
    /// (RTS, the reads, ATS) or on iWARP four (RTS, RTR, the writes, FIN)
    /// where one send does the work. Measured under TCG, alternating in
    /// one boot per device, osu_latency at 64 KiB: on siw 254-310 us
    /// eagerly against 457-705 by rendezvous (ib_send_lat's typical
    /// 189-207), on rxe 1208-1558 against 1462-2276 (ib_send_lat
    /// 1207-1788); at 16 KiB on siw 53-89 us against 105-145 in two eager
    /// parts, on rxe even. The price is memory: such a rank posts 64 KiB
    /// receive buffers ([`super::BtlConfig::srq_depth`] of them at start, 16 MiB
    /// by default) and has [`super::BtlConfig::send_slots`] bounce buffers of that
    /// size, as Open MPI's openib spent on iWARP (64 KiB buffers, there per
    /// peer). XRC, which exists to keep a rank's footprint small when a
    /// node runs many, keeps the 8 KiB limit: no XRC device was at hand to
    /// measure the trade.
    Auto,
    /// This many bytes (1 to 1 MiB).
    Bytes(usize),
}

impl EagerLimit {
    /// The limit of a BTL running in `mode`.
    pub fn bytes(self, mode: xrcbtl_xrc_conn::Mode) -> usize {
        match (self, mode) {
            (EagerLimit::Auto, xrcbtl_xrc_conn::Mode::Rc { .. }) => 64 * 1024,
            (EagerLimit::Auto, xrcbtl_xrc_conn::Mode::Xrc) => 8 * 1024,
            (EagerLimit::Bytes(n), _) => n,
        }
    }
}

/// Which payloads `send_bytes` splits into eager parts instead of sending
/// them by rendezvous.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SplitLimit {
    /// 16 KiB: two parts of the 8 KiB eager limit, where each part costs
    /// about what one leg of the rendezvous handshake does. Measured on
    /// siw and rxe under TCG, alternating in one boot per device: at 16
    /// KiB splitting took osu_latency from 188-192 to 99-121 us on siw and
    /// from 716-851 to 459-811 us on rxe; at 64 KiB (eight parts) it lost
    /// on both. Where the eager limit is 16 KiB or more
    /// ([`EagerLimit::Auto`] with RC + SRQ), nothing is split. Not measured
    /// on hardware.
    Auto,
    /// Up to this many bytes (0: never).
    Bytes(usize),
}

impl SplitLimit {
    /// The limit (0: never split).
    pub fn bytes(self) -> usize {
        match self {
            SplitLimit::Auto => 16 * 1024,
            SplitLimit::Bytes(n) => n,
        }
    }
}

/// When a progress loop that finds nothing gives its CPU away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IdleYield {
    /// After every empty progress call on a device the host's kernel
    /// emulates (Soft-RoCE, soft-iWARP), whose protocol work runs on the
    /// application's CPUs in kernel threads that spinning ranks keep off
    /// them; never on hardware. Soft-RoCE does all its work in threads;
    /// soft-iWARP sends in the poster's system call, but a request posted
    /// while the QP is still sending waits for its transmit thread, so
    /// fragments, parts and windows of sends did. Measured on siw under
    /// TCG, alternating in one boot: osu_bw at 1 MiB 316-386 MB/s
    /// yielding against 240-276 spinning, at 64 KiB 160-203 against
    /// 91-183, osu_latency at 8 B unchanged within the noise (37-58 us
    /// against 41-63).
    Auto,
    /// Never.
    Off,
    /// After this many empty progress calls in a row (at least 1).
    After(u32),
}

impl IdleYield {
    /// Empty progress calls in a row after which a device with `caps`
    /// yields (0: never).
    pub fn after(self, caps: &xrcbtl_fabric::DeviceCaps) -> u32 {
        match self {
            IdleYield::Auto => u32::from(caps.host_emulated),
            IdleYield::Off => 0,
            IdleYield::After(n) => n,
        }
    }
}

/// The time source of a BTL (virtual time on the simulated fabric).
#[derive(Clone)]
pub struct Clock(Arc<dyn Fn() -> Duration + Send + Sync>);

impl Clock {
    /// Wall-clock time since the clock was made.
    pub fn wall() -> Self {
        let start = Instant::now();
        Clock(Arc::new(move || start.elapsed()))
    }

    /// Any time source.
    pub fn from_fn(f: impl Fn() -> Duration + Send + Sync + 'static) -> Self {
        Clock(Arc::new(f))
    }

    /// The time now.
    pub fn now(&self) -> Duration {
        (self.0)()
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Clock({:?})", self.now())
    }
}
