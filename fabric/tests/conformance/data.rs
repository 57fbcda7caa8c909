//! Rules of the data path: transfers, key checks, RNR, vanished peers,
//! flushes, queue limits and SRQ events.

use std::time::Duration;

use xrcbtl_fabric::*;

use super::harness::{Ctx, Deviation, Failure, Harness, Need, Outcome};
use super::util::*;
use super::{rule, two, Rule};
use crate::{ensure, ensure_eq};

pub fn rules<H: Harness>() -> Vec<Rule<H>> {
    vec![
        rule("transfer_send_recv", &[], transfer_send_recv::<H>),
        rule(
            "transfer_send_with_imm",
            &[Need::ImmData],
            transfer_send_with_imm::<H>,
        ),
        rule(
            "transfer_rdma_write_read",
            &[],
            transfer_rdma_write_read::<H>,
        ),
        rule(
            "transfer_manual_connect",
            &[Need::IbFamily],
            transfer_manual_connect::<H>,
        ),
        rule(
            "regions_never_reach_remapped_memory",
            &[],
            regions_never_reach_remapped_memory::<H>,
        ),
        rule(
            "regions_up_to_max_mr_size",
            &[Need::BoundedMr],
            regions_up_to_max_mr_size::<H>,
        ),
        rule("keys_unknown_rkey", &[], keys_unknown_rkey::<H>),
        rule("keys_wrong_pd", &[], keys_wrong_pd::<H>),
        rule("keys_access_not_granted", &[], keys_access_not_granted::<H>),
        rule("keys_out_of_range", &[], keys_out_of_range::<H>),
        rule("keys_local_protection", &[], keys_local_protection::<H>),
        rule(
            "rnr_retry_exceeded_rq",
            &[Need::IbFamily],
            rnr_retry_exceeded_rq::<H>,
        ),
        rule(
            "rnr_retry_exceeded_srq",
            &[Need::IbFamily, Need::Srq],
            rnr_retry_exceeded_srq::<H>,
        ),
        rule(
            "rnr_retries_until_receive_posted",
            &[Need::IbFamily],
            rnr_recovers::<H>,
        ),
        rule(
            "peer_gone_retry_exceeded",
            &[Need::IbFamily],
            peer_gone_retry_exceeded::<H>,
        ),
        rule("error_flushes_in_order", &[], error_flushes_in_order::<H>),
        rule(
            "limits_send_queue_full",
            &[Need::IbFamily],
            limits_send_queue_full::<H>,
        ),
        rule("limits_cq_overrun", &[], limits_cq_overrun::<H>),
        rule("cq_staged_poll", &[], cq_staged_poll::<H>),
        rule("cq_staged_recv", &[], cq_staged_recv::<H>),
        rule(
            "limits_send_queue_resize",
            &[],
            limits_send_queue_resize::<H>,
        ),
        rule("limits_max_inline", &[], limits_max_inline::<H>),
        rule("srq_limit_event", &[Need::Srq], srq_limit_event::<H>),
        rule(
            "srq_prepared_receives",
            &[Need::Srq],
            srq_prepared_receives::<H>,
        ),
        rule(
            "srq_last_wqe_reached",
            &[Need::Srq, Need::LastWqeEvent],
            srq_last_wqe_reached::<H>,
        ),
        rule(
            "introspect_counts",
            &[Need::Introspection],
            introspect_counts::<H>,
        ),
    ]
}

fn transfer_send_recv<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &Opts::default())?;
    let sizes = [0usize, 1, 7, 4096];
    for (i, len) in sizes.iter().enumerate() {
        ea.send(i as u32, &pattern(i as u8, *len))?;
    }
    let sent = wait_cq(h, &ea.cq, sizes.len())?;
    for (i, wc) in sent.iter().enumerate() {
        check_wc(wc, i as u64, WcStatus::Success)?;
        ensure_eq!(wc.opcode, WcOpcode::Send);
    }
    let got = wait_cq(h, &eb.cq, sizes.len())?;
    for (i, wc) in got.iter().enumerate() {
        check_wc(wc, 1000 + i as u64, WcStatus::Success)?;
        ensure_eq!(wc.opcode, WcOpcode::Recv);
        ensure_eq!(wc.byte_len as usize, sizes[i]);
        ensure_eq!(wc.qp_num, eb.qp.qp_num());
        ensure_eq!(eb.rbuf.read(i * 4096, sizes[i]), pattern(i as u8, sizes[i]));
    }
    // Three SGEs gather into one message.
    ea.sbuf.write(0, b"abc");
    ea.sbuf.write(100, b"defgh");
    ea.sbuf.write(4000, b"ij");
    let sgl = [ea.sbuf.sge(0, 3), ea.sbuf.sge(100, 5), ea.sbuf.sge(4000, 2)];
    ea.qp.post_send(&SendWr::send(9, &sgl))?;
    check_wc(&wait_cq(h, &ea.cq, 1)?[0], 9, WcStatus::Success)?;
    let wc = wait_cq(h, &eb.cq, 1)?[0];
    ensure_eq!(wc.byte_len, 10);
    ensure_eq!(eb.rbuf.read(4 * 4096, 10), b"abcdefghij".to_vec());
    Ok(())
}

fn transfer_send_with_imm<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &Opts::default())?;
    ea.sbuf.write(0, b"imm");
    let sge = [ea.sbuf.sge(0, 3)];
    ea.qp.post_send(&SendWr::new(
        1,
        SendOp::SendWithImm(0xdead_beef),
        Payload::Sgl(&sge),
    ))?;
    check_wc(&wait_cq(h, &ea.cq, 1)?[0], 1, WcStatus::Success)?;
    let wc = wait_cq(h, &eb.cq, 1)?[0];
    ensure_eq!(wc.imm, Some(0xdead_beef));
    ensure_eq!(wc.byte_len, 3);
    // A write with immediate lands in memory and consumes a receive.
    ea.sbuf.write(0, b"written");
    let sge = [ea.sbuf.sge(0, 7)];
    let op = SendOp::WriteWithImm(eb.rbuf.remote(8192), 7);
    ea.qp.post_send(&SendWr::new(2, op, Payload::Sgl(&sge)))?;
    check_wc(&wait_cq(h, &ea.cq, 1)?[0], 2, WcStatus::Success)?;
    let wc = wait_cq(h, &eb.cq, 1)?[0];
    ensure_eq!(wc.opcode, WcOpcode::RecvRdmaWithImm);
    ensure_eq!(wc.imm, Some(7));
    ensure_eq!(eb.rbuf.read(8192, 7), b"written".to_vec());
    Ok(())
}

fn transfer_rdma_write_read<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &Opts::default())?;
    let written = pattern(3, 1000);
    ea.sbuf.write(0, &written);
    let sge = [ea.sbuf.sge(0, 1000)];
    ea.qp.post_send(&SendWr::new(
        1,
        SendOp::Write(eb.rbuf.remote(100)),
        Payload::Sgl(&sge),
    ))?;
    let wc = wait_cq(h, &ea.cq, 1)?[0];
    check_wc(&wc, 1, WcStatus::Success)?;
    ensure_eq!(wc.opcode, WcOpcode::RdmaWrite);

    let data = pattern(4, 3000);
    eb.sbuf.write(4096, &data);
    let sge = [ea.rbuf.sge(8192, 3000)];
    ea.qp.post_send(&SendWr::new(
        2,
        SendOp::Read(eb.sbuf.remote(4096)),
        Payload::Sgl(&sge),
    ))?;
    let wc = wait_cq(h, &ea.cq, 1)?[0];
    check_wc(&wc, 2, WcStatus::Success)?;
    ensure_eq!(wc.opcode, WcOpcode::RdmaRead);
    ensure_eq!(ea.rbuf.read(8192, 3000), data);
    // A write's completion does not mean it landed (on iWARP it means it was
    // sent); a read issued after it on the same QP completes only after it.
    ensure_eq!(eb.rbuf.read(100, 1000), written);
    // One-sided operations consume no receive.
    expect_quiet(h, &eb.cq, Duration::from_millis(1))?;
    Ok(())
}

/// A region of `max_mr_size` bytes registers and a page more is refused:
/// the device does what its caps promise (rxe's real limit is below the
/// 2^64 - 1 it reports; the guest's kernel log check catches a provider
/// that lets a larger region reach rxe).
fn regions_up_to_max_mr_size<H: Harness>(h: &H) -> Outcome {
    let p = h.spawn(0).map_err(Failure)?;
    let pd = p.ctx.alloc_pd()?;
    let max = usize::try_from(h.caps().max_mr_size)
        .map_err(|_| Failure("max_mr_size beyond usize".into()))?;
    let mut cache = MemCache::new(p.ctx.clone(), pd, Default::default());
    let over = MappedBuf::new(max + 4096)?;
    ensure!(
        cache
            .register_user(&over.user_mem(), Access::LOCAL_WRITE)
            .is_err(),
        "a region of {} bytes, more than max_mr_size, was registered",
        max + 4096
    );
    drop(over);
    let whole = MappedBuf::new(max)?;
    let reg = cache.register_user(&whole.user_mem(), Access::LOCAL_WRITE)?;
    cache.release(reg);
    drop(cache);
    drop(whole);
    Ok(())
}

/// A region pins the pages it was made from: when the memory is unmapped and
/// the address mapped again with other contents, a transfer through the old
/// region never delivers the new contents (hardware moves the old pages, the
/// simulator detaches the region); the registration cache notices the unmap
/// and registers the new mapping afresh, through which the new contents
/// arrive.
fn regions_never_reach_remapped_memory<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &Opts::default())?;
    let len = 2 * 4096;
    let mut cache = MemCache::new(eb.ctx.clone(), eb.pd.clone(), Default::default());
    ensure!(
        cache.caches(),
        "userfaultfd is not available: nothing can be cached"
    );
    let mut buf = MappedBuf::new(len)?;
    buf.fill(0x0A);
    let addr = buf.addr();
    let first = cache.register_user(&buf.user_mem(), Access::REMOTE_READ)?;
    let read = |wr_id: u64, r: RemoteAddr| -> std::result::Result<Vec<u8>, Failure> {
        let sge = [ea.rbuf.sge(0, len as u32)];
        ea.qp
            .post_send(&SendWr::new(wr_id, SendOp::Read(r), Payload::Sgl(&sge)))?;
        check_wc(&wait_cq(h, &ea.cq, 1)?[0], wr_id, WcStatus::Success)?;
        Ok(ea.rbuf.read(0, len))
    };
    ensure_eq!(read(1, cache.remote(&first, addr))?, vec![0x0A; len]);
    let stale = cache.remote(&first, addr);
    cache.release(first);
    // New pages at the same address: mapped over the old ones, which is an
    // unmap (waiting for the address to come back after a munmap races
    // with every other thread that maps memory).
    buf.remap()?;
    buf.fill(0x0B);
    let through_stale = read(2, stale)?;
    ensure!(
        through_stale != vec![0x0B; len],
        "a region made before the unmap delivered the new mapping's contents"
    );
    let fresh = cache.register_user(&buf.user_mem(), Access::REMOTE_READ)?;
    ensure!(
        cache.stats().invalidations >= 1 && cache.stats().misses == 2,
        "the cache did not register the new mapping afresh: {:?}",
        cache.stats()
    );
    ensure_eq!(read(3, cache.remote(&fresh, addr))?, vec![0x0B; len]);
    cache.release(fresh);
    drop(cache);
    drop(buf);
    Ok(())
}

fn transfer_manual_connect<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let (ea, eb) = connect_manual::<H>(&a, &b, &Opts::default(), &Opts::default())?;
    ea.send(0, b"by hand")?;
    check_wc(&wait_cq(h, &ea.cq, 1)?[0], 0, WcStatus::Success)?;
    eb.send(1, b"and back")?;
    let wcs = wait_wrs(h, &eb.cq, &[1000, 1])?;
    ensure!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    ensure_eq!(eb.rbuf.read(0, 7), b"by hand".to_vec());
    check_wc(&wait_cq(h, &ea.cq, 1)?[0], 1000, WcStatus::Success)?;
    ensure_eq!(ea.rbuf.read(0, 8), b"and back".to_vec());
    Ok(())
}

/// Posts a one-sided operation followed by a send, and checks the first fails
/// with `status`, the send is flushed, and the requester QP is in error. On
/// iWARP a write completes once sent, so only a read must fail by itself; in
/// every case the connection breaks.
fn expect_remote_failure<C: Context, H: Harness>(
    h: &H,
    ea: &Ep<C>,
    op: SendOp,
    len: u32,
    status: WcStatus,
) -> Outcome {
    let read = matches!(op, SendOp::Read(_));
    let sge = [ea.sbuf.sge(0, len)];
    let local = if read { [ea.rbuf.sge(0, len)] } else { sge };
    ea.qp.post_send(&SendWr::new(1, op, Payload::Sgl(&local)))?;
    ea.send(2, b"after")?;
    if is_iwarp(h) {
        let seen = wait_qp_error(h, &ea.cq, &ea.qp)?;
        let own = seen.iter().find(|w| w.wr_id == 1);
        ensure!(
            !read || own.is_none_or(|w| w.status != WcStatus::Success),
            "a read with a bad key succeeded: {seen:?}"
        );
        return Ok(());
    }
    let wcs = wait_wrs(h, &ea.cq, &[1, 2])?;
    check_wc(&wcs[0], 1, status)?;
    check_wc(&wcs[1], 2, WcStatus::WrFlush)?;
    ensure_eq!(ea.qp.state()?, QpState::Error);
    Ok(())
}

fn keys_unknown_rkey<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &Opts::default())?;
    let good = eb.rbuf.remote(0);
    let bad = RemoteAddr {
        rkey: good.rkey ^ 0x00ff_ff00,
        ..good
    };
    expect_remote_failure(h, &ea, SendOp::Write(bad), 8, WcStatus::RemoteAccess)
}

fn keys_wrong_pd<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &Opts::default())?;
    let other_pd = b.ctx.alloc_pd()?;
    let foreign = DmaBuf::new(
        &b.ctx,
        &other_pd,
        4096,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    )?;
    expect_remote_failure(
        h,
        &ea,
        SendOp::Write(foreign.remote(0)),
        8,
        WcStatus::RemoteAccess,
    )?;
    drop(eb);
    Ok(())
}

fn keys_access_not_granted<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    // Writing where only reads are allowed.
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &Opts::default())?;
    let ro = DmaBuf::new(
        &b.ctx,
        &eb.pd,
        4096,
        Access::LOCAL_WRITE | Access::REMOTE_READ,
    )?;
    expect_remote_failure(
        h,
        &ea,
        SendOp::Write(ro.remote(0)),
        8,
        WcStatus::RemoteAccess,
    )?;
    // Reading where only writes are allowed.
    if h.deviation(Deviation::RemoteReadUnchecked).is_some() {
        return Ok(());
    }
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &Opts::default())?;
    let wo = DmaBuf::new(
        &b.ctx,
        &eb.pd,
        4096,
        Access::LOCAL_WRITE | Access::REMOTE_WRITE,
    )?;
    expect_remote_failure(
        h,
        &ea,
        SendOp::Read(wo.remote(0)),
        8,
        WcStatus::RemoteAccess,
    )
}

fn keys_out_of_range<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &Opts::default())?;
    let end = eb.rbuf.len();
    // The last 8 bytes are inside; 16 bytes from there are not.
    let sge = [ea.sbuf.sge(0, 8)];
    ea.qp.post_send(&SendWr::new(
        0,
        SendOp::Write(eb.rbuf.remote(end - 8)),
        Payload::Sgl(&sge),
    ))?;
    check_wc(&wait_cq(h, &ea.cq, 1)?[0], 0, WcStatus::Success)?;
    expect_remote_failure(
        h,
        &ea,
        SendOp::Write(eb.rbuf.remote(end - 8)),
        16,
        WcStatus::RemoteAccess,
    )
}

fn keys_local_protection<H: Harness>(h: &H) -> Outcome {
    let flush_ok = h.deviation(Deviation::LocalProtectionAsFlush).is_some();
    let qp_op_ok = h
        .deviation(Deviation::LocalProtectionAsQpOperation)
        .is_some();
    let keeps_qp = h.deviation(Deviation::LocalErrorKeepsQp).is_some();
    let check = |wc: &WorkCompletion, wr_id: u64| -> Outcome {
        let declared = (flush_ok && wc.status == WcStatus::WrFlush)
            || (qp_op_ok && wc.status == WcStatus::LocalQpOperation);
        if !declared {
            check_wc(wc, wr_id, WcStatus::LocalProtection)?;
        }
        ensure_eq!(wc.wr_id, wr_id);
        Ok(())
    };
    let (a, b) = two(h)?;
    let (ea, _eb) = connect_rc(h, &a, &b, &Opts::default(), &Opts::default())?;
    let mut sge = ea.sbuf.sge(0, 8);
    sge.lkey ^= 0x00ff_ff00;
    ea.qp.post_send(&SendWr::send(1, &[sge]))?;
    check(&wait_cq(h, &ea.cq, 1)?[0], 1)?;
    if !keeps_qp {
        wait_qp_error(h, &ea.cq, &ea.qp)?;
    }
    // Past the end of a region with its own lkey.
    let (ea, _eb) = connect_rc(h, &a, &b, &Opts::default(), &Opts::default())?;
    let base = ea.sbuf.sge(0, 8);
    let sge = Sge {
        addr: base.addr + ea.sbuf.len() as u64 - 4,
        ..base
    };
    ea.qp.post_send(&SendWr::send(2, &[sge]))?;
    check(&wait_cq(h, &ea.cq, 1)?[0], 2)?;
    if !keeps_qp {
        wait_qp_error(h, &ea.cq, &ea.qp)?;
    }
    Ok(())
}

fn rnr_case<H: Harness>(h: &H, srq: bool) -> Outcome {
    let (a, b) = two(h)?;
    // b has no receives and tells a to retry RNR twice.
    let oa = Opts::default();
    let ob = Opts {
        recvs: 0,
        srq,
        rnr_retry: 2,
        ..Opts::default()
    };
    let (ea, _eb) = connect_rc(h, &a, &b, &oa, &ob)?;
    ea.send(0, b"nobody listens")?;
    check_wc(&wait_cq(h, &ea.cq, 1)?[0], 0, WcStatus::RnrRetryExceeded)?;
    ensure_eq!(ea.qp.state()?, QpState::Error);
    if h.gap(Need::Introspection).is_none() {
        // The first attempt and two retries were refused.
        ensure_eq!(h.rnr_naks(a.node, ea.qp.qp_num()).map_err(Failure)?, 3);
    }
    Ok(())
}

fn rnr_retry_exceeded_rq<H: Harness>(h: &H) -> Outcome {
    rnr_case(h, false)
}

fn rnr_retry_exceeded_srq<H: Harness>(h: &H) -> Outcome {
    rnr_case(h, true)
}

fn rnr_recovers<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let ob = Opts {
        recvs: 0,
        ..Opts::default()
    };
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &ob)?;
    ea.send(0, b"patience")?;
    expect_quiet(h, &ea.cq, Duration::from_millis(5))?;
    eb.post_recv(0)?;
    check_wc(&wait_cq(h, &ea.cq, 1)?[0], 0, WcStatus::Success)?;
    check_wc(&wait_cq(h, &eb.cq, 1)?[0], 1000, WcStatus::Success)?;
    ensure_eq!(eb.rbuf.read(0, 8), b"patience".to_vec());
    Ok(())
}

fn peer_gone_retry_exceeded<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let oa = Opts {
        retry: 3,
        ..Opts::default()
    };
    let (ea, eb) = connect_rc(h, &a, &b, &oa, &Opts::default())?;
    ea.send(0, b"are you there")?;
    check_wc(&wait_cq(h, &ea.cq, 1)?[0], 0, WcStatus::Success)?;
    drop(eb);
    h.exit(b);
    ea.send(1, b"hello?")?;
    check_wc(&wait_cq(h, &ea.cq, 1)?[0], 1, WcStatus::RetryExceeded)?;
    ensure_eq!(ea.qp.state()?, QpState::Error);
    Ok(())
}

fn error_flushes_in_order<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    // On InfiniBand the peer has no receives, so the sends stay outstanding
    // (RNR); on iWARP that would tear the connection down, so the peer
    // receives and only the ordering is checked.
    let stall = h.gap(Need::IbFamily).is_none();
    let oa = Opts {
        recvs: 4,
        ..Opts::default()
    };
    let ob = Opts {
        recvs: if stall { 0 } else { 16 },
        ..Opts::default()
    };
    let (ea, _eb) = connect_rc(h, &a, &b, &oa, &ob)?;
    for i in 0..3 {
        ea.send(i, b"stuck")?;
    }
    ea.qp.modify(&QpTransition::Error)?;
    let wcs = wait_cq(h, &ea.cq, 7)?;
    let sends: Vec<_> = wcs.iter().filter(|w| w.wr_id < 1000).collect();
    let recvs: Vec<_> = wcs.iter().filter(|w| w.wr_id >= 1000).collect();
    ensure_eq!(
        sends.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        vec![0, 1, 2]
    );
    ensure_eq!(
        recvs.iter().map(|w| w.wr_id).collect::<Vec<_>>(),
        vec![1000, 1001, 1002, 1003]
    );
    ensure!(
        recvs.iter().all(|w| w.status == WcStatus::WrFlush),
        "receives not flushed: {recvs:?}"
    );
    if stall {
        ensure!(
            sends.iter().all(|w| w.status == WcStatus::WrFlush),
            "sends not flushed: {sends:?}"
        );
    } else {
        let first_flush = sends
            .iter()
            .position(|w| w.status == WcStatus::WrFlush)
            .unwrap_or(3);
        ensure!(
            sends[first_flush..]
                .iter()
                .all(|w| w.status == WcStatus::WrFlush),
            "a success after a flush: {sends:?}"
        );
    }
    // Work posted to a QP in error is flushed too.
    if h.deviation(Deviation::LateWorkNotFlushed).is_some() {
        return Ok(());
    }
    ea.send(3, b"late")?;
    ea.post_recv(3)?;
    let wcs = wait_cq(h, &ea.cq, 2)?;
    ensure!(
        wcs.iter().all(|w| w.status == WcStatus::WrFlush),
        "late work not flushed: {wcs:?}"
    );
    Ok(())
}

fn limits_send_queue_full<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let oa = Opts {
        max_send_wr: 4,
        ..Opts::default()
    };
    let ob = Opts {
        recvs: 0,
        ..Opts::default()
    };
    let (ea, eb) = connect_rc(h, &a, &b, &oa, &ob)?;
    let depth = ea.qp.caps().max_send_wr;
    ensure!(depth >= 4, "granted depth {depth} below the request");
    for i in 0..depth {
        ea.send(i % 4, b"x")?;
    }
    let sge = [ea.sbuf.sge(0, 1)];
    match ea.qp.post_send(&SendWr::send(99, &sge)) {
        Err(Error::NoResource(_)) => {}
        other => return Err(Failure(format!("post beyond the send queue: {other:?}"))),
    }
    for i in 0..depth.min(16) {
        eb.post_recv(i)?;
    }
    let done = wait_cq(h, &ea.cq, depth.min(16) as usize)?;
    ensure!(
        done.iter().all(|w| w.status == WcStatus::Success),
        "{done:?}"
    );
    ea.qp.post_send(&SendWr::send(100, &sge))?;
    Ok(())
}

fn limits_cq_overrun<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let oa = Opts {
        cqe: 8,
        recvs: 0,
        max_send_wr: 64,
        ..Opts::default()
    };
    let ob = Opts {
        recvs: 48,
        ..Opts::default()
    };
    let (ea, _eb) = connect_rc(h, &a, &b, &oa, &ob)?;
    let cap = ea.cq.capacity();
    ensure!(
        cap < 48,
        "CQ granted {cap} entries; cannot overrun it with 48 sends"
    );
    for i in 0..=cap {
        ea.send(i % 4, b"overrun")?;
    }
    let cq_id = ea.cq.id();
    wait_async(h, &a.ctx, |e| *e == AsyncEvent::CqError { cq: cq_id })?;
    let mut buf = [WorkCompletion::default(); 4];
    match ea.cq.poll(&mut buf) {
        Err(Error::CqOverrun) => {}
        other => return Err(Failure(format!("poll of an overrun CQ: {other:?}"))),
    }
    // A staged poll finds nothing there either, whatever the device
    // still hands out.
    let mut st = ea.cq.staging(4);
    let n = ea.cq.poll_staged(&mut st);
    let k = if n == 0 {
        0
    } else {
        ea.cq.take_staged(&mut st, n, &mut buf)
    };
    ensure_eq!(k, 0);
    Ok(())
}

/// Takes `n` receive completions from `cq` by staged polls ([`Cq::poll_staged`], [`Cq::take_staged`]) of `batch`
/// into `room` entries; checks each poll's count and returns them all.
fn staged_receives<H: Harness, Q: Cq>(
    h: &H,
    cq: &Q,
    batch: usize,
    room: usize,
    n: usize,
) -> std::result::Result<Vec<WorkCompletion>, Failure> {
    let deadline = h.now() + patience();
    let mut st = cq.staging(batch);
    let mut out = vec![WorkCompletion::default(); room];
    let mut got = Vec::new();
    while got.len() < n {
        let k = cq.poll_staged(&mut st);
        ensure!(k <= batch, "a staged poll of {batch} took {k}");
        if k == 0 {
            wait_more(h, deadline, n, &got)?;
            continue;
        }
        let all = cq.take_staged(&mut st, k, &mut out);
        ensure!(
            (k..=room).contains(&all),
            "{k} staged completions came out as {all} in room for {room}"
        );
        got.extend_from_slice(&out[..all]);
    }
    ensure_eq!(got.len(), n);
    Ok(got)
}

/// A staged poll takes what a plain poll would, whole and in order: ten
/// receives in batches of 4 into room for 4, then four more in batches of
/// 2 into room for 4 (a poll that fills its batch polls on into the room
/// left, as a plain poll of the whole room would).
fn cq_staged_poll<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &Opts::default())?;
    let mut next = 0usize;
    for (batch, room, n) in [(4, 4, 10), (2, 4, 4)] {
        for i in next..next + n {
            ea.send(i as u32, &pattern(i as u8, i + 1))?;
        }
        wait_cq(h, &ea.cq, n)?;
        let got = staged_receives(h, &eb.cq, batch, room, n)?;
        for (j, wc) in got.iter().enumerate() {
            let i = next + j;
            check_wc(wc, 1000 + i as u64, WcStatus::Success)?;
            ensure_eq!(wc.opcode, WcOpcode::Recv);
            ensure_eq!(wc.byte_len as usize, i + 1);
            ensure_eq!(wc.qp_num, eb.qp.qp_num());
            ensure_eq!(eb.rbuf.read(i * 4096, i + 1), pattern(i as u8, i + 1));
        }
        next += n;
    }
    Ok(())
}

/// Polls `cq` staged, one entry at a time, until it finds one; returns
/// the staging holding it.
fn staged_one<H: Harness, Q: Cq>(h: &H, cq: &Q) -> std::result::Result<Q::Staged, Failure> {
    let deadline = h.now() + patience();
    let mut st = cq.staging(1);
    loop {
        match cq.poll_staged(&mut st) {
            0 => wait_more(h, deadline, 1, &[])?,
            1 => return Ok(st),
            k => return Err(Failure(format!("a staged poll of 1 took {k}"))),
        }
    }
}

/// A receive that succeeded without immediate data is read in place by
/// [`Cq::staged_recv`] as the whole conversion reads it, and stays staged
/// for [`Cq::take_staged`]; a send's completion, and a receive with
/// immediate data (where the device has it), are not such a receive.
fn cq_staged_recv<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &Opts::default())?;
    ea.send(3, &pattern(3, 24))?;
    let mut st = staged_one(h, &ea.cq)?;
    ensure_eq!(ea.cq.staged_recv(&st), None);
    let mut out = [WorkCompletion::default(); 2];
    ensure_eq!(ea.cq.take_staged(&mut st, 1, &mut out), 1);
    ensure_eq!(out[0].opcode, WcOpcode::Send);
    let mut st = staged_one(h, &eb.cq)?;
    let done = eb.cq.staged_recv(&st);
    ensure_eq!(eb.cq.take_staged(&mut st, 1, &mut out), 1);
    let wc = out[0];
    check_wc(&wc, 1000, WcStatus::Success)?;
    ensure_eq!(wc.byte_len, 24);
    ensure_eq!(done, wc.recv_done());
    ensure_eq!(
        done,
        Some(RecvDone {
            wr_id: 1000,
            byte_len: 24,
            qp_num: eb.qp.qp_num(),
        })
    );
    ensure_eq!(
        done.map(RecvDone::completion),
        Some(WorkCompletion { src_qp: 0, ..wc })
    );
    if h.caps().imm_data {
        let sge = [ea.sbuf.sge(0, 3)];
        ea.qp
            .post_send(&SendWr::new(5, SendOp::SendWithImm(9), Payload::Sgl(&sge)))?;
        check_wc(&wait_cq(h, &ea.cq, 1)?[0], 5, WcStatus::Success)?;
        let st = staged_one(h, &eb.cq)?;
        ensure_eq!(eb.cq.staged_recv(&st), None);
    }
    Ok(())
}

fn limits_max_inline<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let max = h.caps().max_inline.min(512);
    let oa = Opts {
        max_inline: max,
        ..Opts::default()
    };
    let (ea, eb) = connect_rc(h, &a, &b, &oa, &Opts::default())?;
    let granted = ea.qp.caps().max_inline as usize;
    ensure!(
        granted >= max as usize,
        "asked for {max} inline bytes, granted {granted}"
    );
    let data = pattern(9, granted);
    ea.qp
        .post_send(&SendWr::new(1, SendOp::Send, Payload::Inline(&data)))?;
    check_wc(&wait_cq(h, &ea.cq, 1)?[0], 1, WcStatus::Success)?;
    let wc = wait_cq(h, &eb.cq, 1)?[0];
    ensure_eq!(wc.byte_len as usize, granted);
    ensure_eq!(eb.rbuf.read(0, granted), data);
    // The latency path's post, through one request built once: unsignalled,
    // signalled, and again, with lengths that shrink and grow (the
    // request keeps nothing of the post before). The signalled ones are
    // the only ones the send CQ reports.
    let data = pattern(10, granted);
    let mut wr = Default::default();
    let lens = [8, granted, 1, granted.min(16)];
    for (i, len) in lens.iter().enumerate() {
        ea.qp
            .post_inline(&mut wr, 3 + i as u64, &data[..*len], None, i % 2 == 1)?;
    }
    let sent = wait_cq(h, &ea.cq, 2)?;
    check_wc(&sent[0], 4, WcStatus::Success)?;
    check_wc(&sent[1], 6, WcStatus::Success)?;
    let wcs = wait_cq(h, &eb.cq, lens.len())?;
    for (wc, len) in wcs.iter().zip(lens) {
        ensure_eq!(wc.status, WcStatus::Success);
        ensure_eq!(wc.byte_len as usize, len);
        // Receive wr_ids are 1000 + the slot.
        let at = (wc.wr_id - 1000) as usize * eb.slot as usize;
        ensure_eq!(eb.rbuf.read(at, len), data[..len].to_vec());
    }
    let too_long = pattern(9, granted + 1);
    match ea
        .qp
        .post_send(&SendWr::new(2, SendOp::Send, Payload::Inline(&too_long)))
    {
        Err(Error::InvalidArgument(_)) => {}
        other => return Err(Failure(format!("inline beyond max_inline: {other:?}"))),
    }
    match ea.qp.post_inline(&mut wr, 9, &too_long, None, true) {
        Err(Error::InvalidArgument(_)) => Ok(()),
        other => Err(Failure(format!("post_inline beyond max_inline: {other:?}"))),
    }
}

fn srq_limit_event<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let ob = Opts {
        srq: true,
        recvs: 8,
        ..Opts::default()
    };
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &ob)?;
    let srq = eb.srq.as_ref().expect("SRQ endpoint");
    srq.arm_limit(4)?;
    for i in 0..5 {
        ea.send(i, b"drain")?;
    }
    wait_cq(h, &eb.cq, 5)?;
    let id = srq.id();
    wait_async(h, &b.ctx, |e| *e == AsyncEvent::SrqLimitReached { srq: id })?;
    // The limit disarms itself: more receives consumed, no second event.
    ea.send(5, b"more")?;
    wait_cq(h, &eb.cq, 1)?;
    h.settle(Duration::from_millis(1));
    while let Some(e) = b.ctx.poll_async_event() {
        ensure!(
            !matches!(e, AsyncEvent::SrqLimitReached { .. }),
            "limit fired twice"
        );
    }
    Ok(())
}

/// Receives prepared once are posted by number in any order, longer than
/// one chain, consumed in the order posted, and posted again once
/// completed, also after the set grew; a number outside the set posts
/// nothing of its chain.
fn srq_prepared_receives<H: Harness>(h: &H) -> Outcome {
    const LEN: u32 = 128;
    let (a, b) = two(h)?;
    let oa = Opts {
        slot: 256,
        recvs: 32,
        ..Opts::default()
    };
    let ob = Opts {
        srq: true,
        recvs: 0,
        ..Opts::default()
    };
    let (ea, eb) = connect_rc(h, &a, &b, &oa, &ob)?;
    let srq = eb.srq.as_ref().expect("SRQ endpoint");
    let mut set = <<Ctx<H> as Context>::Srq as Srq>::Recvs::default();
    for i in 0..20 {
        let no = set.add(5000 + u64::from(i), eb.rbuf.sge((i * LEN) as usize, LEN));
        ensure_eq!(no, i);
    }
    ensure_eq!(set.len(), 20);
    let order = [19, 2, 7, 0, 11, 4, 16, 9, 13, 1, 18, 6, 3, 15, 10, 8, 17, 5];
    srq.post_set(&mut set, &order)
        .map_err(|(n, e)| Failure(format!("post_set: {e} after {n}")))?;
    let receive = |msgs: &[u32]| -> Outcome {
        for (k, &no) in msgs.iter().enumerate() {
            ea.send(k as u32, &pattern(no as u8, 100))?;
        }
        wait_cq(h, &ea.cq, msgs.len())?;
        let got = wait_cq(h, &eb.cq, msgs.len())?;
        for (wc, &no) in got.iter().zip(msgs) {
            check_wc(wc, 5000 + u64::from(no), WcStatus::Success)?;
            ensure_eq!(wc.byte_len, 100);
            ensure_eq!(
                eb.rbuf.read((no * LEN) as usize, 100),
                pattern(no as u8, 100)
            );
        }
        Ok(())
    };
    receive(&order)?;
    match srq.post_set(&mut set, &[0, 20]) {
        Err((0, Error::InvalidArgument(_))) => {}
        other => return Err(Failure(format!("a number outside the set: {other:?}"))),
    }
    // Linked in place, a receive named twice would close the chain on
    // itself: refused, nothing of it posted (the next two messages below
    // must land in 12 and 0, not in 14).
    match srq.post_set(&mut set, &[14, 12, 14]) {
        Err((0, Error::InvalidArgument(_))) => {}
        other => return Err(Failure(format!("a receive twice in a chain: {other:?}"))),
    }
    srq.post_set(&mut set, &[12, 0])
        .map_err(|(n, e)| Failure(format!("post_set again: {e} after {n}")))?;
    receive(&[12, 0])?;
    // The set grows after it was posted from (its entries move in
    // memory): old and new receives alike land in their own buffers.
    for i in 20..100 {
        let no = set.add(5000 + u64::from(i), eb.rbuf.sge((i * LEN) as usize, LEN));
        ensure_eq!(no, i);
    }
    let mixed = [50, 19, 99, 3, 20];
    srq.post_set(&mut set, &mixed)
        .map_err(|(n, e)| Failure(format!("post_set after growing: {e} after {n}")))?;
    receive(&mixed)
}

fn srq_last_wqe_reached<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let ob = Opts {
        srq: true,
        ..Opts::default()
    };
    let (_ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &ob)?;
    eb.qp.modify(&QpTransition::Error)?;
    let qpn = eb.qp.qp_num();
    wait_async(h, &b.ctx, |e| *e == AsyncEvent::QpLastWqeReached { qpn })?;
    Ok(())
}

fn introspect_counts<H: Harness>(h: &H) -> Outcome {
    let p = h.spawn(0).map_err(Failure)?;
    let v = h.process_view(&p).map_err(Failure)?;
    ensure_eq!((v.qps, v.mrs, v.cqs, v.pds, v.srqs), (0, 0, 0, 0, 0));
    let ep = Ep::new(
        &p.ctx,
        &Opts {
            srq: true,
            ..Opts::default()
        },
    )?;
    let v = h.process_view(&p).map_err(Failure)?;
    ensure_eq!((v.qps, v.mrs, v.cqs, v.pds, v.srqs), (1, 2, 1, 1, 1));
    ensure_eq!(h.node_qps(0).map_err(Failure)?, 1);
    drop(ep);
    let v = h.process_view(&p).map_err(Failure)?;
    ensure_eq!((v.qps, v.mrs, v.cqs, v.pds, v.srqs), (0, 0, 0, 0, 0));
    ensure_eq!(h.node_qps(0).map_err(Failure)?, 0);
    Ok(())
}

fn limits_send_queue_resize<H: Harness>(h: &H) -> Outcome {
    let p = h.spawn(0).map_err(Failure)?;
    let ep = Ep::new(
        &p.ctx,
        &Opts {
            max_send_wr: 8,
            ..Opts::default()
        },
    )?;
    let before = ep.qp.caps().max_send_wr;
    // IBV_QP_CAP is legal in no transition of the kernel's qp_state_table
    // for RC or XRC QPs: a device refuses to grow a QP, and says so.
    match ep.qp.resize_send_queue(before * 4) {
        Err(Error::Unsupported(_)) => ensure_eq!(ep.qp.caps().max_send_wr, before),
        other => return Err(Failure(format!("growing a QP: {other:?}"))),
    }
    let too_big = h.caps().max_qp_wr.saturating_add(1);
    ensure!(
        ep.qp.resize_send_queue(too_big).is_err(),
        "resized beyond max_qp_wr"
    );
    Ok(())
}
