//! The interface: a rank's resources on one device, owned here and lent
//! to the connection driver and the data path.
//!
//! - the protection domain, the one send CQ and the one receive CQ every
//!   QP of the rank shares, and (with XRC) the node's XRC domain;
//! - the receive size classes: an SRQ each (XRC SRQs in the node's domain,
//!   whose numbers peers address; with RC a QP draws from one SRQ, so only
//!   the largest class exists), their receive buffers in chunks, reposted
//!   in batches, refilled and grown when the SRQ reports its limit, and
//!   provisioned for credit flow control;
//! - the bounce slots eager messages are copied into;
//! - the 8-byte result slots of atomics;
//! - where all that memory lives: on the device's NUMA node when the
//!   topology knows it ([`crate::place`]).
//!
//! The transport (XRC, or RC + SRQ) is decided here from the device caps.

use std::sync::Arc;

use xrcbtl_fabric::{
    Access, Context, Cq as _, DeviceCaps, DmaBuf, Error, Qp, ReadInPlace, RecvSet as _, Result,
    Sge, Srq, SrqAttr, Transport,
};
use xrcbtl_xrc_conn::Mode;

use crate::config::BtlConfig;
use crate::wire::{HEADER, SMALL_BODY};
use crate::wr_id::RecvSlot;

/// Entries of each CQ (bounded by the device).
const CQ_ENTRIES: u32 = 4096;
/// Result slots of atomics (atomics in flight at once, at most).
const ATOMIC_SLOTS: u32 = 256;
/// Bytes of the iWARP fences' sink.
const FENCE_SINK: usize = 64;
/// Bounce slots kept for credit messages (which must always be able to go,
/// or two sides whose slots hold messages waiting for credits would wait
/// for each other forever).
pub(crate) const RESERVED_SLOTS: usize = 1;

/// The transport a rank on a device with `caps` uses: XRC where the
/// device has it (unless RC is forced), RC + SRQ elsewhere, with the
/// initiator speaking first on iWARP.
pub(crate) fn mode_of(caps: &DeviceCaps, cfg: &BtlConfig) -> Mode {
    if caps.xrc && !cfg.force_rc {
        Mode::Xrc
    } else {
        Mode::Rc {
            p2p: caps.transport == Transport::Iwarp,
        }
    }
}

/// [`Iface::small_limit`], with a small class or without, when
/// `max_inline` bytes go inline: nothing goes when not even a header fits.
fn small_limit(small_class: bool, max_inline: u32) -> usize {
    match (max_inline as usize).checked_sub(HEADER) {
        Some(room) if small_class => SMALL_BODY.min(room) + 1,
        _ => 0,
    }
}

/// The buffer size of each receive class, smallest first. The large class
/// holds a full eager message; a small class, if asked for, holds short
/// ones without wasting large buffers. An RC QP draws from one SRQ: RC
/// keeps the large class only.
pub(crate) fn class_sizes(cfg: &BtlConfig, mode: Mode) -> Vec<u32> {
    let large = (cfg.eager_limit.bytes(mode) + HEADER).next_multiple_of(64) as u32;
    let mut sizes = Vec::new();
    if mode == Mode::Xrc && cfg.small_size != 0 && cfg.small_size < large {
        sizes.push(cfg.small_size);
    }
    sizes.push(large);
    sizes
}

/// What [`Iface::read_whole`] reads of a receive buffer: a header and the
/// longest short body.
pub(crate) const SHORT_READ: usize = HEADER + SMALL_BODY;

/// Receive buffers of one class allocated together.
struct Chunk<C: Context> {
    /// The memory: shared with deliveries, which hand a received message
    /// to its consumer in place.
    buf: Arc<DmaBuf<C>>,
    /// The number of its first buffer's receive in [`RecvClass::recvs`]:
    /// kept with it, so that one look-up finds both.
    first: u32,
}

impl<C: Context> Chunk<C> {
    /// `buf`, whose receives are not prepared yet.
    fn new(buf: DmaBuf<C>) -> Self {
        Chunk {
            buf: Arc::new(buf),
            first: 0,
        }
    }
}

/// One receive size class.
pub(crate) struct RecvClass<C: Context> {
    /// Its SRQ.
    pub srq: C::Srq,
    /// Buffer size in bytes.
    pub size: u32,
    /// Its buffers, in chunks.
    chunks: Vec<Chunk<C>>,
    /// Buffers in each chunk after the first.
    per_chunk: u32,
    /// Buffers allocated in all.
    pub total: u32,
    /// The SRQ's capacity.
    pub capacity: u32,
    /// Buffers posted.
    pub posted: u32,
    /// A receive prepared for each buffer, in the order the chunks were
    /// added: buffer `index` of a chunk is number [`Chunk::first`] +
    /// `index`.
    recvs: <C::Srq as Srq>::Recvs,
    /// Numbers in `recvs` of the buffers consumed and not yet posted again.
    repost: Vec<u32>,
    /// The SRQ limit armed.
    pub limit: u32,
    /// Messages read whole in its buffers ([`Iface::read_whole`]), counted
    /// here, in the class the straight line looks up anyway, rather than
    /// in the stats ([`Iface::read_whole_counts`]).
    read_whole: u64,
}

impl<C: Context> RecvClass<C> {
    /// Whether its consumed buffers are due to be posted again: a batch
    /// of `refill` waits, or the SRQ runs low (twice its limit or fewer
    /// posted).
    #[inline(always)]
    fn due(&self, refill: u32) -> bool {
        self.repost.len() as u32 >= refill || self.posted <= self.limit * 2
    }

    /// Prepares the receives of `chunk`, the class's newest, of `n`
    /// buffers, and marks them all to be posted.
    fn prepare(&mut self, class: u16, chunk: u16, n: u32) {
        self.chunks[chunk as usize].first = self.recvs.len() as u32;
        let buf = &self.chunks[chunk as usize].buf;
        for index in 0..n {
            let wr_id = RecvSlot {
                class,
                chunk,
                index,
            }
            .wr_id();
            let sge = buf.sge(index as usize * self.size as usize, self.size);
            let no = self.recvs.add(wr_id, sge);
            self.repost.push(no);
        }
    }
}

/// Fixed-size slots of registered memory, taken and given back.
pub(crate) struct Slots<C: Context> {
    buf: DmaBuf<C>,
    size: usize,
    free: Vec<u32>,
    /// Slots only reserved takers get.
    reserved: usize,
    /// Slots in all.
    count: usize,
}

impl<C: Context> Slots<C> {
    fn new(
        ctx: &C,
        pd: &C::Pd,
        count: u32,
        size: usize,
        reserved: usize,
        numa: Option<u32>,
    ) -> Result<Self> {
        Ok(Slots {
            buf: DmaBuf::new_on(ctx, pd, count as usize * size, Access::LOCAL_WRITE, numa)?,
            size,
            free: (0..count).rev().collect(),
            reserved,
            count: count as usize,
        })
    }

    /// Slots free now.
    pub fn free(&self) -> usize {
        self.free.len()
    }

    /// Slots in all.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Whether more than a quarter of the slots are free: a sender may
    /// then leave a message unsignalled.
    #[inline]
    pub fn plenty(&self) -> bool {
        self.free.len() > self.count / 4
    }

    /// A free slot, unless only the reserved ones are left.
    pub fn take(&mut self) -> Option<u32> {
        self.take_for(false)
    }

    /// A free slot; only `reserved` callers (credit messages) get the last
    /// [`RESERVED_SLOTS`].
    pub fn take_for(&mut self, reserved: bool) -> Option<u32> {
        if !reserved && self.free.len() <= self.reserved {
            return None;
        }
        self.free.pop()
    }

    /// Gives a slot back.
    pub fn give(&mut self, s: u32) {
        debug_assert!(!self.free.contains(&s), "slot {s} given back twice");
        self.free.push(s);
    }

    /// Copies `data` into slot `s` at `off`.
    pub fn write(&self, s: u32, off: usize, data: &[u8]) {
        debug_assert!(off + data.len() <= self.size);
        self.buf.write(s as usize * self.size + off, data);
    }

    /// Copies slot `s` from `off` into `out`.
    pub fn read_to(&self, s: u32, off: usize, out: &mut [u8]) {
        debug_assert!(off + out.len() <= self.size);
        self.buf.read_to(s as usize * self.size + off, out);
    }

    /// An SGE over the first `len` bytes of slot `s`.
    pub fn sge(&self, s: u32, len: u32) -> Sge {
        self.buf.sge(s as usize * self.size, len)
    }
}

/// A rank's resources on its device.
pub(crate) struct Iface<C: Context> {
    /// The device.
    pub ctx: C,
    /// Its capabilities.
    pub caps: DeviceCaps,
    /// XRC, or RC (with the initiator speaking first on iWARP).
    pub mode: Mode,
    /// The protection domain of everything.
    pub pd: C::Pd,
    /// Where every send queue completes.
    pub send_cq: C::Cq,
    /// Signalled work the data path may have outstanding on `send_cq`: its
    /// capacity less what the connection driver's own sends (iWARP hellos)
    /// may need.
    pub send_budget: u32,
    /// Where every receive completes.
    pub recv_cq: C::Cq,
    /// The node's XRC domain (XRC only).
    pub xrcd: Option<C::Xrcd>,
    /// Receive classes, smallest first.
    pub classes: Vec<RecvClass<C>>,
    /// The class of every message whose body is at most
    /// [`SMALL_BODY`] bytes, if they share one (they do unless the small
    /// class is set below their size): the latency path addresses it
    /// without looking.
    pub small_class: Option<usize>,
    /// One more than the longest body the latency path sends: the least of
    /// [`SMALL_BODY`] and what [`crate::BtlConfig::max_inline`] leaves after
    /// the header, plus one; 0 without [`Iface::small_class`]. One compare
    /// then says whether a message may take that path.
    pub small_limit: usize,
    /// The latency path's send request, built once ([`Qp::post_inline`]).
    pub inline_wr: <C::Qp as Qp>::Inline,
    /// Eager bounce slots.
    pub bounce: Slots<C>,
    /// Result slots of atomics.
    pub results: Slots<C>,
    /// The byte iWARP puts' fences read into (iWARP only).
    pub fence_sink: Option<DmaBuf<C>>,
    /// Where the device is and what was placed near it.
    pub placed: crate::place::Placed,
    /// A class has a batch of consumed buffers waiting, or runs low: set
    /// where a receive is taken or given back (nothing else makes a repost
    /// due), cleared by an [`Iface::repost_due`] that posted them all.
    pub repost_wanted: bool,
    /// Consumed buffers of a class that make a batch to post again
    /// ([`BtlConfig::srq_refill`]).
    refill: u32,
}

impl<C: Context> Iface<C> {
    /// Opens the rank's resources on `ctx` as `cfg` says, posts the first
    /// receives and arms the SRQ limits.
    pub fn new(ctx: C, cfg: &BtlConfig) -> Result<Self> {
        let caps = ctx.caps().clone();
        let mode = mode_of(&caps, cfg);
        if !caps.srq {
            return Err(Error::Unsupported("the BTL needs shared receive queues"));
        }
        let placed = crate::place::resolve(&ctx.locality_names(), &cfg.place);
        let numa = placed.placement.numa_node;
        let pd = ctx.alloc_pd()?;
        let send_cq = ctx.create_cq(CQ_ENTRIES.min(caps.max_cqe))?;
        let recv_cq = ctx.create_cq(CQ_ENTRIES.min(caps.max_cqe))?;
        let xrcd = match mode {
            Mode::Xrc => Some(ctx.open_xrcd(&cfg.xrcd_key)?),
            Mode::Rc { .. } => None,
        };
        let sizes = class_sizes(cfg, mode);
        let large = *sizes.last().expect("a class");
        let mut classes = Vec::new();
        for size in sizes {
            let capacity = cfg.srq_max_depth.min(caps.max_srq_wr);
            let attr = SrqAttr {
                max_wr: capacity,
                max_sge: 1,
                srq_limit: 0,
            };
            let srq = match &xrcd {
                Some(x) => ctx.create_xrc_srq(&pd, x, &recv_cq, attr)?,
                None => ctx.create_srq(&pd, attr)?,
            };
            let depth = cfg.srq_depth.min(capacity);
            let buf = DmaBuf::new_on(
                &ctx,
                &pd,
                (size * depth) as usize,
                Access::LOCAL_WRITE,
                numa,
            )?;
            let mut class = RecvClass {
                srq,
                size,
                chunks: vec![Chunk::new(buf)],
                per_chunk: depth,
                total: depth,
                capacity,
                posted: 0,
                recvs: Default::default(),
                repost: Vec::new(),
                limit: (depth / 4).max(1),
                read_whole: 0,
            };
            class.prepare(classes.len() as u16, 0, depth);
            classes.push(class);
        }
        let bounce = Slots::new(
            &ctx,
            &pd,
            cfg.send_slots + RESERVED_SLOTS as u32,
            large as usize,
            RESERVED_SLOTS,
            numa,
        )?;
        let results = Slots::new(&ctx, &pd, ATOMIC_SLOTS, 8, 0, numa)?;
        // Where iWARP puts' fences read their byte, all of them: nobody
        // looks at it. The sink of an iWARP read must be remotely writable
        // (the response is a tagged write into it), so it holds nothing
        // else.
        let fence_sink = match caps.transport {
            xrcbtl_fabric::Transport::Iwarp => Some(DmaBuf::new_on(
                &ctx,
                &pd,
                FENCE_SINK,
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
                numa,
            )?),
            _ => None,
        };
        let mut iface = Iface {
            ctx,
            caps,
            mode,
            pd,
            send_budget: send_cq.capacity() - (send_cq.capacity() / 16).min(256),
            send_cq,
            recv_cq,
            xrcd,
            classes,
            small_class: None,
            small_limit: 0,
            inline_wr: Default::default(),
            bounce,
            results,
            fence_sink,
            placed,
            repost_wanted: false,
            refill: cfg.srq_refill,
        };
        let c = iface.class_for(HEADER);
        iface.small_class = (iface.class_for(HEADER + SMALL_BODY) == c).then_some(c);
        iface.small_limit = small_limit(iface.small_class.is_some(), cfg.max_inline);
        // A class holds a small body whenever the limit is not zero, so
        // that whatever takes the small path is short enough for an eager
        // send ([`crate::Btl::send`] checks the eager limit only off it).
        debug_assert!(iface.small_limit <= iface.max_message() - HEADER + 1);
        // Arm the low-watermark once the SRQ holds its receives, so that it
        // fires when they run low, not at once.
        for c in 0..iface.classes.len() {
            iface.repost(c)?;
            let limit = iface.classes[c].limit;
            iface.classes[c].srq.arm_limit(limit)?;
        }
        Ok(iface)
    }

    /// The XRC SRQ numbers peers address, by class (empty with RC).
    pub fn srq_nums(&self) -> Vec<u32> {
        self.classes
            .iter()
            .filter_map(|c| c.srq.srq_num())
            .collect()
    }

    /// The SRQ RC QPs draw from (the largest class).
    pub fn rc_srq(&self) -> &C::Srq {
        &self.classes.last().expect("a class").srq
    }

    /// The smallest class that holds `total` bytes.
    pub fn class_for(&self, total: usize) -> usize {
        self.classes
            .iter()
            .position(|c| c.size as usize >= total)
            .unwrap_or(self.classes.len() - 1)
    }

    /// The NUMA node the kernel prefers for each registered buffer of the
    /// interface (receive chunks, bounce slots, result slots), read back.
    pub fn buffer_nodes(&self) -> Result<Vec<Option<u32>>> {
        self.classes
            .iter()
            .flat_map(|c| c.chunks.iter().map(|c| &*c.buf))
            .chain([&self.bounce.buf, &self.results.buf])
            .map(DmaBuf::preferred_node)
            .collect()
    }

    /// Whether credits flow: the device has no RNR (iWARP's RC in
    /// peer-to-peer mode), so a sender waits for the receiver's word that
    /// a receive is posted.
    pub fn credits(&self) -> bool {
        matches!(self.mode, Mode::Rc { p2p: true })
    }

    /// The largest message a receive buffer holds, header included.
    pub fn max_message(&self) -> usize {
        self.classes.last().expect("a class").size as usize
    }

    /// The class whose SRQ has `srq_id`.
    pub fn class_of_srq(&self, srq_id: u64) -> Option<usize> {
        self.classes.iter().position(|c| c.srq.id() == srq_id)
    }

    /// A receive completed into `slot`: it is no longer posted, and is the
    /// caller's until [`Iface::give_back`]. Returns the buffer's chunk and
    /// where the buffer starts in it, or `None` for a slot that is not
    /// ours.
    pub fn taken(&mut self, slot: RecvSlot) -> Option<(Arc<DmaBuf<C>>, usize)> {
        let (chunk, at) = self.received(slot)?;
        let chunk = chunk.clone();
        self.took(slot);
        Some((chunk, at))
    }

    /// A receive completed into `slot`: one fewer is posted in its class.
    #[inline(always)]
    fn took(&mut self, slot: RecvSlot) {
        if let Some(c) = self.classes.get_mut(slot.class as usize) {
            c.posted = c.posted.saturating_sub(1);
            self.repost_wanted |= c.due(self.refill);
        }
    }

    /// The buffer a receive completed into, `slot`: its chunk and where it
    /// starts in it, or `None` for a slot that is not ours.
    #[inline]
    fn received(&self, slot: RecvSlot) -> Option<(&Arc<DmaBuf<C>>, usize)> {
        let c = self.classes.get(slot.class as usize)?;
        let chunk = c.chunks.get(slot.chunk as usize)?;
        Some((&chunk.buf, slot.index as usize * c.size as usize))
    }

    /// The messages each class's buffers held that were read whole
    /// ([`Iface::read_whole`]), by class.
    pub fn read_whole_counts(&self) -> impl Iterator<Item = u64> + '_ {
        self.classes.iter().map(|c| c.read_whole)
    }

    /// Reads the buffer a receive of a short message completed into,
    /// `slot`, in place with `rd`: its first [`SHORT_READ`] bytes, a
    /// header and the longest short body, whatever the message's length
    /// (the bytes past it are the buffer's own, left by earlier messages),
    /// so that the body is taken at a fixed length. A reading that takes
    /// the message (`Some`) is done with the buffer at once: the
    /// accounting of [`Iface::taken`], then [`Iface::give_back`], with no
    /// chunk handed out and the slot looked up once. Returns `None`,
    /// having changed nothing, for a slot that is not ours, of a class
    /// whose buffers are shorter than that, or a reading that declined.
    #[inline(always)]
    pub fn read_whole<T, Rd: ReadInPlace<Out = Option<T>>>(
        &mut self,
        slot: RecvSlot,
        rd: Rd,
    ) -> Option<T> {
        let c = self.classes.get_mut(slot.class as usize)?;
        if (c.size as usize) < SHORT_READ {
            return None;
        }
        let chunk = c.chunks.get(slot.chunk as usize)?;
        let first = chunk.first;
        let out = chunk
            .buf
            .read_in_place(slot.index as usize * c.size as usize, SHORT_READ, rd)?;
        c.read_whole += 1;
        c.posted = c.posted.saturating_sub(1);
        c.repost.push(first + slot.index);
        self.repost_wanted |= c.due(self.refill);
        Some(out)
    }

    /// A taken buffer is done with: it goes on its class's list, to be
    /// posted again with the next batch.
    #[inline]
    pub fn give_back(&mut self, slot: RecvSlot) {
        if let Some(c) = self.classes.get_mut(slot.class as usize) {
            if let Some(chunk) = c.chunks.get(slot.chunk as usize) {
                c.repost.push(chunk.first + slot.index);
                self.repost_wanted |= c.due(self.refill);
            }
        }
    }

    /// Reposts consumed buffers of every class that has a batch of them
    /// waiting or runs low. Most calls find no class due, and test one
    /// flag ([`Iface::repost_wanted`]); after a failed post the flag stays
    /// up, and the next call tries again.
    #[inline(always)]
    pub fn repost_due(&mut self) -> Result<()> {
        if !self.repost_wanted {
            return Ok(());
        }
        self.repost_classes()
    }

    /// [`Iface::repost_due`] when a class is due: out of line, one call in
    /// a batch's worth of receives.
    #[inline(never)]
    fn repost_classes(&mut self) -> Result<()> {
        for class in 0..self.classes.len() {
            if self.classes[class].due(self.refill) {
                self.repost(class)?;
            }
        }
        self.repost_wanted = false;
        Ok(())
    }

    /// Posts every consumed buffer of `class` again from its prepared
    /// receive, in as few calls into the device as the SRQ allows.
    pub fn repost(&mut self, class: usize) -> Result<()> {
        let c = &mut self.classes[class];
        if c.repost.is_empty() {
            return Ok(());
        }
        match c.srq.post_set(&mut c.recvs, &c.repost) {
            Ok(()) => {
                c.posted += c.repost.len() as u32;
                c.repost.clear();
                Ok(())
            }
            Err((posted, e)) => {
                c.repost.drain(..posted);
                c.posted += posted as u32;
                Err(e)
            }
        }
    }

    /// The SRQ of `class` ran low: post everything consumed, grow the class
    /// by a chunk (up to its SRQ's capacity: the burst that emptied it may
    /// come again), and arm the limit again. Returns the buffers added.
    pub fn refill(&mut self, class: usize) -> Result<u32> {
        self.repost(class)?;
        let c = &self.classes[class];
        let n = c.per_chunk.min(c.capacity - c.total);
        self.grow(class, n)?;
        let limit = self.classes[class].limit;
        self.classes[class].srq.arm_limit(limit)?;
        Ok(n)
    }

    /// Adds `n` receive buffers to `class` (one new chunk) and posts them.
    pub fn grow(&mut self, class: usize, n: u32) -> Result<()> {
        if n == 0 {
            return Ok(());
        }
        let c = &mut self.classes[class];
        if c.chunks.len() > usize::from(u16::MAX) {
            return Err(Error::NoResource("receive chunks"));
        }
        let buf = DmaBuf::new_on(
            &self.ctx,
            &self.pd,
            (c.size * n) as usize,
            Access::LOCAL_WRITE,
            self.placed.placement.numa_node,
        )?;
        let chunk = c.chunks.len() as u16;
        c.chunks.push(Chunk::new(buf));
        c.prepare(class as u16, chunk, n);
        c.total += n;
        self.repost(class)
    }

    /// With credit flow control, every peer may fill its credits at once
    /// (plus the zero-length first message of a connection), while up to a
    /// refill batch of consumed receives waits to be reposted: keeps that
    /// many buffers in the (one, RC) class, as far as its SRQ allows.
    /// Returns (buffers added, buffers short of the need).
    pub fn provision(&mut self, peers: u32, credits: u32, refill: u32) -> Result<(u32, u32)> {
        let need = peers.saturating_mul(credits + 1).saturating_add(refill);
        let c = &self.classes[0];
        let n = need.min(c.capacity).saturating_sub(c.total);
        let short = need.saturating_sub(c.capacity);
        self.grow(0, n)?;
        Ok((n, short))
    }
}

/// The rank's resources the driver makes its QPs on: the interface's
/// ([`Iface::lend`]), or a bare set that receives nothing
/// ([`crate::sim::Responder`]): the connection driver's
/// (`crate::conn::ConnDriver::new`).
pub(crate) struct Lent<'a, C: Context> {
    pub ctx: &'a C,
    pub mode: Mode,
    pub pd: &'a C::Pd,
    pub send_cq: &'a C::Cq,
    pub recv_cq: &'a C::Cq,
    /// The SRQ RC QPs draw from.
    pub rc_srq: &'a C::Srq,
    /// The node's XRC domain (XRC).
    pub xrcd: Option<&'a C::Xrcd>,
    /// The XRC SRQ numbers peers address, by class (empty with RC).
    pub srqns: Vec<u32>,
}

impl<C: Context> Iface<C> {
    /// What the connection driver makes its QPs on.
    pub(crate) fn lend(&self) -> Lent<'_, C> {
        Lent {
            ctx: &self.ctx,
            mode: self.mode,
            pd: &self.pd,
            send_cq: &self.send_cq,
            recv_cq: &self.recv_cq,
            rc_srq: self.rc_srq(),
            xrcd: self.xrcd.as_ref(),
            srqns: self.srq_nums(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The latency path's bound is the smaller of the short body and the
    /// configured inline room after the header, and is closed without a
    /// small class or when the header alone is over the limit.
    #[test]
    fn the_small_limit_follows_the_inline_limit() {
        let header = HEADER as u32;
        assert_eq!(small_limit(true, 128), SMALL_BODY + 1);
        assert_eq!(small_limit(true, header + 8), 9, "8 bytes of body fit");
        assert_eq!(small_limit(true, header), 1, "only an empty body fits");
        assert_eq!(small_limit(true, header - 1), 0, "not even a header");
        assert_eq!(small_limit(true, 0), 0);
        assert_eq!(small_limit(false, 128), 0, "no small class");
    }
}
