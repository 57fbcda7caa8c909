//! Ping-pong between two processes on two nodes of the simulated fabric,
//! connected through the RDMA CM, printing one-way latency per message size
//! in the fabric's virtual time (and the wall time the simulator took).
//!
//! It is the smallest complete program over the fabric traits: open a
//! device, register memory, create a CQ and an RC QP, connect with the CM,
//! post and poll. Swap `SimFabric` for the verbs provider and it runs on
//! hardware unchanged.
//!
//! ```text
//! cargo run --release -p xrcbtl-fabric --example sim_pingpong -- [--seed N] [--iters N]
//! ```

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use xrcbtl_fabric::sim::{SimConfig, SimFabric};
use xrcbtl_fabric::*;

const MAX_SIZE: usize = 1 << 20;

/// One side: its QP, CQ, a registered buffer, and its CM id.
struct Peer<C: Context> {
    qp: C::Qp,
    _id: <C::CmChannel as CmChannel>::Id,
    _ch: C::CmChannel,
    buf: DmaBuf<C>,
    cq: C::Cq,
    _pd: C::Pd,
}

/// What `make_qp` builds.
type QpParts<C> = (
    <C as Context>::Pd,
    <C as Context>::Cq,
    <C as Context>::Qp,
    DmaBuf<C>,
);

fn make_qp<C: Context>(ctx: &C) -> Result<QpParts<C>> {
    let pd = ctx.alloc_pd()?;
    let cq = ctx.create_cq(64)?;
    let qp = ctx.create_qp(
        &pd,
        &QpInit {
            qp_type: QpType::Rc,
            send_cq: &cq,
            recv_cq: Some(&cq),
            srq: None,
            caps: QpCaps {
                max_send_wr: 16,
                max_recv_wr: 16,
                ..QpCaps::default()
            },
        },
    )?;
    qp.modify(&QpTransition::Init(InitAttr::default()))?;
    // Two halves: receive into the first, send from the second.
    let buf = DmaBuf::new(ctx, &pd, 2 * MAX_SIZE, Access::LOCAL_WRITE)?;
    Ok((pd, cq, qp, buf))
}

fn next_event<Ch: CmChannel>(ch: &Ch) -> CmEvent<Ch::Id> {
    loop {
        if let Some(e) = ch.poll_event() {
            return e;
        }
    }
}

fn expect(kind: CmEventKind, got: CmEventKind) {
    assert_eq!(got, kind, "unexpected CM event");
}

/// Connects a client on `a` to a server on `b`.
fn connect<C: Context>(a: &C, b: &C, b_ip: std::net::IpAddr) -> Result<(Peer<C>, Peer<C>)> {
    let (pda, cqa, qpa, bufa) = make_qp(a)?;
    let (pdb, cqb, qpb, bufb) = make_qp(b)?;
    let cha = a.create_cm_channel()?;
    let chb = b.create_cm_channel()?;
    let listener = chb.create_id(PortSpace::Tcp)?;
    listener.listen(SocketAddr::new(b_ip, 0), 8)?;
    let addr = listener.local_addr().expect("bound");

    let ida = cha.create_id(PortSpace::Tcp)?;
    ida.resolve_addr(addr, 1000)?;
    expect(CmEventKind::AddrResolved, next_event(&cha).kind);
    ida.resolve_route(1000)?;
    expect(CmEventKind::RouteResolved, next_event(&cha).kind);
    ida.connect(Some(&qpa), &ConnParam::with_data(b"ping?"))?;

    let req = next_event(&chb);
    expect(CmEventKind::ConnectRequest, req.kind);
    let idb = req.new_id.expect("a request carries its id");
    idb.accept(Some(&qpb), &ConnParam::with_data(b"pong!"))?;
    expect(CmEventKind::Established, next_event(&cha).kind);
    expect(CmEventKind::Established, next_event(&chb).kind);

    let pa = Peer {
        qp: qpa,
        _id: ida,
        _ch: cha,
        buf: bufa,
        cq: cqa,
        _pd: pda,
    };
    let pb = Peer {
        qp: qpb,
        _id: idb,
        _ch: chb,
        buf: bufb,
        cq: cqb,
        _pd: pdb,
    };
    Ok((pa, pb))
}

fn post_recv<C: Context>(p: &Peer<C>) -> Result<()> {
    let sge = [p.buf.sge(0, MAX_SIZE as u32)];
    p.qp.post_recv(&RecvWr {
        wr_id: 1,
        sgl: &sge,
    })
}

fn send<C: Context>(p: &Peer<C>, size: usize) -> Result<()> {
    let sge = [p.buf.sge(MAX_SIZE, size as u32)];
    p.qp.post_send(&SendWr::send(2, &sge))
}

/// Waits for the next receive completion, reaping send completions on the
/// way (sends are signaled so that their queue slots come back).
fn wait_recv<C: Context>(p: &Peer<C>, size: usize) -> Result<()> {
    let mut wcs = [WorkCompletion::default(); 4];
    let mut got = false;
    while !got {
        let n = p.cq.poll(&mut wcs)?;
        for wc in &wcs[..n] {
            assert_eq!(wc.status, WcStatus::Success, "{wc:?}");
            if wc.opcode == WcOpcode::Recv {
                assert_eq!(wc.byte_len as usize, size);
                got = true;
            }
        }
    }
    Ok(())
}

fn main() -> Result<()> {
    let mut seed = 1u64;
    let mut iters = 200u32;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| -> u64 {
            args.next()
                .and_then(|v| v.parse().ok())
                .unwrap_or_else(|| panic!("{name} needs a number"))
        };
        match a.as_str() {
            "--seed" => seed = value("--seed"),
            "--iters" => iters = value("--iters") as u32,
            other => panic!("unknown argument {other}; usage: sim_pingpong [--seed N] [--iters N]"),
        }
    }

    let sim = SimFabric::new(SimConfig::new(seed, 2))?;
    let (pa, pb) = (sim.spawn(0)?, sim.spawn(1)?);
    let (a, b) = (pa.open("sim0")?, pb.open("sim0")?);
    let (client, server) = connect(&a, &b, b.ip())?;

    println!("# xrcbtl simulated fabric: RC ping-pong, node 0 <-> node 1, seed {seed}");
    println!("# latency is one-way, in the fabric's virtual time; wall is the simulator's cost");
    println!(
        "{:<10}{:>20}{:>20}",
        "# Size", "Latency(us)", "Wall(us/iter)"
    );
    let mut size = 0usize;
    while size <= MAX_SIZE {
        let (v0, w0) = (sim.now(), Instant::now());
        for _ in 0..iters {
            post_recv(&server)?;
            post_recv(&client)?;
            send(&client, size)?;
            wait_recv(&server, size)?;
            send(&server, size)?;
            wait_recv(&client, size)?;
        }
        let virt: Duration = sim.now() - v0;
        let wall = w0.elapsed();
        let one_way_us = virt.as_secs_f64() * 1e6 / f64::from(iters) / 2.0;
        let wall_us = wall.as_secs_f64() * 1e6 / f64::from(iters);
        println!("{size:<10}{one_way_us:>20.2}{wall_us:>20.2}");
        size = if size == 0 { 1 } else { size * 2 };
    }
    let s = sim.stats();
    println!(
        "# {} messages, {} packets, {} CM messages, {} events",
        s.messages_delivered, s.packets, s.cm_messages, s.events
    );
    sim.check_invariants()?;
    Ok(())
}
