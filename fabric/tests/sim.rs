//! Properties of the simulated fabric itself, beyond the conformance rules:
//! runs replay exactly from their seed, and the transport delivers every
//! message exactly once and in order through RNR, partitions and
//! retransmissions.

use std::time::Duration;

use xrcbtl_fabric::sim::{SimConfig, SimFabric, SimStats};
use xrcbtl_fabric::*;

struct Side {
    qp: <sim::SimContext as Context>::Qp,
    cq: sim::SimCq,
    buf: DmaBuf<sim::SimContext>,
    _pd: sim::SimPd,
    ctx: sim::SimContext,
}

const SLOT: usize = 16 * 1024;
const RECVS: u32 = 8;

fn side(sim: &SimFabric, node: usize) -> Side {
    side_with(sim, node, false).0
}

/// A side on `node`; with `srq`, its QP draws its receives from an SRQ
/// (returned, to keep alive) in which 16 receives are posted.
fn side_with(sim: &SimFabric, node: usize, srq: bool) -> (Side, Option<sim::SimSrq>) {
    let p = sim.spawn(node).unwrap();
    let dev = sim.config().devices[0].name.clone();
    let ctx = p.open(&dev).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let cq = ctx.create_cq(1024).unwrap();
    let srq = srq.then(|| {
        ctx.create_srq(
            &pd,
            SrqAttr {
                max_wr: 16,
                max_sge: 1,
                srq_limit: 0,
            },
        )
        .unwrap()
    });
    let qp = ctx
        .create_qp(
            &pd,
            &QpInit {
                qp_type: QpType::Rc,
                send_cq: &cq,
                recv_cq: Some(&cq),
                srq: srq.as_ref(),
                caps: QpCaps {
                    max_send_wr: 64,
                    max_recv_wr: if srq.is_some() { 0 } else { 64 },
                    ..QpCaps::default()
                },
            },
        )
        .unwrap();
    let buf = DmaBuf::new(&ctx, &pd, SLOT * 64, Access::LOCAL_WRITE).unwrap();
    if let Some(srq) = &srq {
        for i in 0..16 {
            let sge = [buf.sge(i * SLOT, SLOT as u32)];
            srq.post_recv(&RecvWr {
                wr_id: i as u64,
                sgl: &sge,
            })
            .unwrap();
        }
    }
    let side = Side {
        qp,
        cq,
        buf,
        _pd: pd,
        ctx,
    };
    (side, srq)
}

/// Connects two sides through the CM (iWARP can only be connected so);
/// returns the ids, which must outlive the connection.
fn connect_cm(a: &Side, b: &Side) -> Vec<sim::SimCmId> {
    let next = |ch: &sim::SimCmChannel| loop {
        if let Some(e) = ch.poll_event() {
            return e;
        }
    };
    let cha = a.ctx.create_cm_channel().unwrap();
    let chb = b.ctx.create_cm_channel().unwrap();
    let l = chb.create_id(PortSpace::Tcp).unwrap();
    l.listen(std::net::SocketAddr::new(b.ctx.ip(), 0), 4)
        .unwrap();
    let ia = cha.create_id(PortSpace::Tcp).unwrap();
    ia.resolve_addr(l.local_addr().unwrap(), 100).unwrap();
    assert_eq!(next(&cha).kind, CmEventKind::AddrResolved);
    ia.resolve_route(100).unwrap();
    assert_eq!(next(&cha).kind, CmEventKind::RouteResolved);
    ia.connect(Some(&a.qp), &ConnParam::default()).unwrap();
    let ib = next(&chb).new_id.unwrap();
    ib.accept(Some(&b.qp), &ConnParam::default()).unwrap();
    assert_eq!(next(&cha).kind, CmEventKind::Established);
    assert_eq!(next(&chb).kind, CmEventKind::Established);
    // The initiator speaks first (iWARP's MPA rule); this stream only
    // flows a -> b, and b's acknowledgements are transport-level.
    std::mem::forget((cha, chb));
    vec![l, ia, ib]
}

fn connect(a: &Side, b: &Side) {
    for (x, y) in [(a, b), (b, a)] {
        let port = y.ctx.query_port(1).unwrap();
        x.qp.modify(&QpTransition::Init(InitAttr::default()))
            .unwrap();
        let dest = PortAddr {
            lid: port.lid,
            gid: port.gid,
        };
        x.qp.modify(&QpTransition::Rtr(RtrAttr::new(dest, y.qp.qp_num())))
            .unwrap();
        let rts = RtsAttr {
            timeout: 12,
            retry_cnt: 7,
            rnr_retry: 7,
            ..RtsAttr::default()
        };
        x.qp.modify(&QpTransition::Rts(rts)).unwrap();
    }
}

fn message(seq: u32) -> Vec<u8> {
    let len = (seq as usize * 977) % 9000;
    let mut m = seq.to_le_bytes().to_vec();
    m.extend((0..len).map(|i| (i as u32 ^ seq) as u8));
    m
}

/// Streams `count` messages from node 0 to node 1 while the path between
/// them is cut and healed on a seeded schedule, and the receiver keeps only
/// a few receives posted. Returns the fabric's counters, the virtual time it
/// took, and the trace hash.
fn stream(seed: u64, count: u32) -> (SimStats, Duration, u64) {
    stream_on(SimConfig::new(seed, 2), count)
}

fn stream_on(cfg: SimConfig, count: u32) -> (SimStats, Duration, u64) {
    let seed = cfg.seed;
    let iwarp = cfg.devices[0].caps.transport == Transport::Iwarp;
    let sim = SimFabric::new(cfg).unwrap();
    let a = side(&sim, 0);
    let b = side(&sim, 1);
    let _ids = if iwarp {
        connect_cm(&a, &b)
    } else {
        connect(&a, &b);
        Vec::new()
    };
    let post_recv = |slot: u32| {
        let sge = [b.buf.sge(slot as usize * SLOT, SLOT as u32)];
        b.qp.post_recv(&RecvWr {
            wr_id: u64::from(slot),
            sgl: &sge,
        })
        .unwrap();
    };
    // On InfiniBand a few receives make RNR happen; iWARP has no RNR (a
    // missing receive terminates the stream), so there the sender holds
    // one credit per posted receive, as an iWARP protocol must.
    let recvs = if iwarp { 64 } else { RECVS };
    for slot in 0..recvs {
        post_recv(slot);
    }
    let mut rng = seed;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let (mut posted, mut acked, mut received) = (0u32, 0u32, 0u32);
    let mut in_flight = 0u32;
    let mut cut_until: Option<Duration> = None;
    // What had been acknowledged at the last heal: the next cut waits for
    // an acknowledgement after it. Cuts back to back would add up (the
    // sender's retry count only resets when something is acknowledged)
    // and could outlast the retry budget, which no single cut does.
    let mut acked_at_heal: Option<u32> = None;
    let mut wcs = [WorkCompletion::default(); 16];
    let deadline = sim.now() + Duration::from_secs(60);
    while received < count || acked < count {
        assert!(
            sim.now() < deadline,
            "stalled: posted {posted} acked {acked} received {received}"
        );
        // Cut the path now and then, each time for less than the retry
        // budget (8 tries of 16.8 ms), and never again before the sender
        // has heard an acknowledgement since the last heal.
        match cut_until {
            Some(t) if sim.now() >= t => {
                sim.heal(0, 1);
                cut_until = None;
                acked_at_heal = Some(acked);
            }
            None if acked_at_heal.is_none_or(|a| acked > a) && next() % 64 == 0 => {
                sim.partition(0, 1);
                cut_until = Some(sim.now() + Duration::from_micros(500 + next() % 20_000));
            }
            _ => {}
        }
        let credit = |posted: u32, received: u32| !iwarp || posted - received < recvs;
        while posted < count && in_flight < 32 && credit(posted, received) {
            let m = message(posted);
            let slot = (posted % 64) as usize;
            a.buf.write(slot * SLOT, &m);
            let sge = [a.buf.sge(slot * SLOT, m.len() as u32)];
            a.qp.post_send(&SendWr::send(u64::from(posted), &sge))
                .unwrap();
            posted += 1;
            in_flight += 1;
        }
        let n = a.cq.poll(&mut wcs).unwrap();
        for wc in &wcs[..n] {
            assert_eq!(wc.status, WcStatus::Success, "send {wc:?}");
            assert_eq!(wc.wr_id, u64::from(acked), "send completions out of order");
            acked += 1;
            in_flight -= 1;
        }
        // The receiver is slow: now and then it drains one completion.
        let n = if next() % 8 == 0 {
            b.cq.poll(&mut wcs[..1]).unwrap()
        } else {
            0
        };
        for wc in &wcs[..n] {
            assert_eq!(wc.status, WcStatus::Success, "receive {wc:?}");
            let m = message(received);
            assert_eq!(
                wc.byte_len as usize,
                m.len(),
                "message {received} has the wrong length"
            );
            let got = b.buf.read(wc.wr_id as usize * SLOT, m.len());
            assert!(
                got == m,
                "message {received} corrupted, reordered or duplicated"
            );
            received += 1;
            post_recv(wc.wr_id as u32);
        }
    }
    sim.check_invariants().unwrap();
    (sim.stats(), sim.now(), sim.trace_hash())
}

#[test]
fn exactly_once_in_order_through_rnr_and_partitions() {
    // Seed 53 once chained cuts past the retry budget.
    for seed in [42, 53] {
        let (stats, took, _) = stream(seed, 2_000);
        check_stream(&stats, took);
    }
}

fn check_stream(stats: &SimStats, took: Duration) {
    assert_eq!(stats.messages_delivered, 2_000);
    // The schedule must actually have exercised the recovery paths.
    assert!(stats.rnr_naks > 0, "no RNR: {stats:?}");
    assert!(stats.retransmits > 0, "no retransmission: {stats:?}");
    assert!(
        stats.duplicates > 0,
        "no duplicate reached a responder: {stats:?}"
    );
    assert!(stats.packets_dropped > 0, "no packet lost: {stats:?}");
    eprintln!("2000 messages in {took:?} of virtual time: {stats:?}");
}

#[test]
fn iwarp_exactly_once_in_order_through_partitions() {
    // iWARP completes sends when they leave; the stream still delivers
    // each message once, in order, across retransmissions. The receiver
    // keeps receives posted (iWARP has no RNR: a missing one terminates).
    let cfg = SimConfig::new(9, 2).with_devices(vec![sim::SimDevice::iwarp("siw0")]);
    let (stats, _, _) = stream_on(cfg, 1_000);
    assert_eq!(stats.messages_delivered, 1_000);
    assert!(stats.retransmits > 0, "no retransmission: {stats:?}");
    assert_eq!(stats.iwarp_violations, 0);
}

#[test]
fn same_seed_same_run() {
    let first = stream(7, 300);
    let again = stream(7, 300);
    assert_eq!(first, again, "a seed must replay exactly");
    let other = stream(8, 300);
    assert_ne!(
        first.2, other.2,
        "different seeds should make different runs"
    );
}

/// An RC QP drawing from an SRQ may be taking a receive when it is
/// destroyed, and its completions leave the CQ with it: the verbs say to
/// move it to the error state and wait for LAST_WQE_REACHED first. The
/// simulator counts every QP a live process destroys sooner.
#[test]
fn srq_qps_destroyed_before_their_last_receive_are_counted() {
    for stop_first in [false, true] {
        let sim = SimFabric::new(SimConfig::new(5, 2)).unwrap();
        let a = side(&sim, 0);
        let (b, _srq) = side_with(&sim, 1, true);
        connect(&a, &b);
        let sge = [a.buf.sge(0, 64)];
        a.qp.post_send(&SendWr::send(1, &sge)).unwrap();
        sim.run_until_idle(10_000);
        let mut wc = [WorkCompletion::default(); 4];
        assert_eq!(b.cq.poll(&mut wc).unwrap(), 1, "the message arrived");
        if stop_first {
            b.qp.modify(&QpTransition::Error).unwrap();
            let ev = b.ctx.poll_async_event();
            let qpn = b.qp.qp_num();
            assert_eq!(ev, Some(AsyncEvent::QpLastWqeReached { qpn }));
        }
        drop(b);
        let early = sim.stats().srq_qps_destroyed_early;
        assert_eq!(early, u64::from(!stop_first), "stopped first: {stop_first}");
    }
}

/// A buffer placed on a NUMA node carries that node in the kernel's memory
/// policy (read back with get_mempolicy), still works as a buffer, and a
/// node the kernel does not have leaves it unplaced rather than failing.
#[test]
fn dma_buffers_are_placed_on_their_numa_node() {
    let sim = SimFabric::new(SimConfig::new(5, 1)).unwrap();
    let p = sim.spawn(0).unwrap();
    let ctx = p.open(&sim.config().devices[0].name).unwrap();
    let pd = ctx.alloc_pd().unwrap();
    let placed = DmaBuf::new_on(&ctx, &pd, 3 * 4096 + 5, Access::LOCAL_WRITE, Some(0)).unwrap();
    assert_eq!(placed.node(), Some(0));
    assert_eq!(placed.preferred_node().unwrap(), Some(0));
    placed.write(3 * 4096, b"hello");
    assert_eq!(placed.read(3 * 4096, 5), b"hello");
    let plain = DmaBuf::new(&ctx, &pd, 4096, Access::LOCAL_WRITE).unwrap();
    assert_eq!(
        (plain.node(), plain.preferred_node().unwrap()),
        (None, None)
    );
    // No machine here has node 1000: the kernel refuses, the buffer stays.
    let nowhere = DmaBuf::new_on(&ctx, &pd, 4096, Access::LOCAL_WRITE, Some(1000)).unwrap();
    assert_eq!(
        (nowhere.node(), nowhere.preferred_node().unwrap()),
        (None, None)
    );
    assert!(DmaBuf::new_on(
        &ctx,
        &pd,
        4096,
        Access::LOCAL_WRITE,
        Some(NUMA_NODE_MAX + 1)
    )
    .is_err());
}

/// A listener asking for any port never gets one bound on its address
/// already, however many listeners the job has made since (the port
/// counter, shared by every address, wraps after 45,536 ports).
#[test]
fn an_ephemeral_port_is_never_one_already_bound() {
    let sim = SimFabric::new(SimConfig::new(1, 2)).unwrap();
    let dev = sim.config().devices[0].name.clone();
    let open = |node: usize| {
        let ctx = sim.spawn(node).unwrap().open(&dev).unwrap();
        let ch = ctx.create_cm_channel().unwrap();
        (ctx, ch)
    };
    let listen = |ctx: &sim::SimContext, ch: &sim::SimCmChannel| {
        let l = ch.create_id(PortSpace::Tcp).unwrap();
        l.listen(std::net::SocketAddr::new(ctx.ip(), 0), 4).unwrap();
        l
    };
    let (a, cha) = open(0);
    let first = listen(&a, &cha);
    let port = first.local_addr().unwrap().port();
    // Every other ephemeral port goes to another node's listeners, so
    // that the counter comes round to `port` again.
    let (b, chb) = open(1);
    let others: Vec<_> = (0..45_535).map(|_| listen(&b, &chb)).collect();
    assert!(others
        .iter()
        .any(|l| l.local_addr().unwrap().port() == port - 1));
    let again = listen(&a, &cha);
    let next = again.local_addr().unwrap().port();
    assert_ne!(next, port, "a port bound on this address was handed out");
}

/// On iWARP a listener is a kernel TCP socket, and the RDMA CM picks an
/// ephemeral port without seeing the ports other TCP sockets hold: a
/// listen on such a port fails with `AddrInUse` (siw's `rdma_listen`,
/// `EADDRINUSE`), and a new id gets the next port. On InfiniBand the
/// same port is the CM's own and listens.
#[test]
fn iwarp_listen_fails_on_a_port_tcp_holds() {
    use xrcbtl_fabric::sim::SimDevice;
    for (dev, refused) in [
        (SimDevice::iwarp("iw0"), true),
        (SimDevice::ib("ib0"), false),
    ] {
        // The CM hands out ephemeral ports from 20001, in order.
        let cfg = SimConfig::new(3, 1)
            .with_devices(vec![dev])
            .with_tcp_port_held(0, 20001);
        let sim = SimFabric::new(cfg).unwrap();
        let p = sim.spawn(0).unwrap();
        let ctx = p.open(&sim.config().devices[0].name).unwrap();
        let ch = ctx.create_cm_channel().unwrap();
        let any = std::net::SocketAddr::new(ctx.ip(), 0);
        let first = ch.create_id(PortSpace::Tcp).unwrap();
        let r = first.listen(any, 4);
        if refused {
            assert!(matches!(r, Err(Error::AddrInUse(_))), "{r:?}");
            let second = ch.create_id(PortSpace::Tcp).unwrap();
            second.listen(any, 4).unwrap();
            assert_eq!(second.local_addr().unwrap().port(), 20002);
        } else {
            r.unwrap();
            assert_eq!(first.local_addr().unwrap().port(), 20001);
        }
    }
}
