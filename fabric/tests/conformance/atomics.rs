//! Rules of 64-bit atomics: fetch-and-add and compare-and-swap return the
//! value they found and change remote memory once, even when retransmitted;
//! they need remote-atomic access on the region and on the responder QP and
//! an aligned address; a device without atomics refuses them at post time.

use std::time::Duration;

use xrcbtl_fabric::*;

use super::harness::{Failure, Harness, Need, Outcome};
use super::util::*;
use super::{rule, two, Rule};
use crate::{ensure, ensure_eq};

pub fn rules<H: Harness>() -> Vec<Rule<H>> {
    vec![
        rule(
            "atomics_fetch_add_and_compare_swap",
            &[Need::Atomics],
            atomics_fetch_add_and_compare_swap::<H>,
        ),
        rule(
            "atomics_need_remote_atomic_access",
            &[Need::Atomics],
            atomics_need_access::<H>,
        ),
        rule(
            "atomics_misaligned_is_refused",
            &[Need::Atomics],
            atomics_misaligned::<H>,
        ),
        rule(
            "atomics_retransmitted_run_once",
            &[Need::Atomics, Need::TwoNodes, Need::Faults],
            atomics_retransmitted_run_once::<H>,
        ),
        rule(
            "atomics_unsupported_without_caps",
            &[Need::NoAtomics],
            atomics_unsupported::<H>,
        ),
    ]
}

/// Options of a responder that accepts atomics.
fn atomic_opts() -> Opts {
    Opts {
        access: Access::REMOTE_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
        ..Opts::default()
    }
}

/// A remote word for atomics: 4 KiB registered with `access`, holding
/// `value` at offset 8.
fn word<C: Context>(
    ep: &Ep<C>,
    access: Access,
    value: u64,
) -> std::result::Result<DmaBuf<C>, Failure> {
    let buf = DmaBuf::new(&ep.ctx, &ep.pd, 4096, Access::LOCAL_WRITE | access)?;
    buf.write(8, &value.to_le_bytes());
    Ok(buf)
}

fn read_u64<C: Context>(buf: &DmaBuf<C>, off: usize) -> u64 {
    u64::from_le_bytes(buf.read(off, 8).try_into().expect("8 bytes"))
}

/// Posts `op` from `ea` with its result landing at `off` of `ea.rbuf`.
fn post<C: Context>(ea: &Ep<C>, wr_id: u64, op: SendOp, off: usize) -> Outcome {
    let sge = [ea.rbuf.sge(off, 8)];
    ea.qp
        .post_send(&SendWr::new(wr_id, op, Payload::Sgl(&sge)))?;
    Ok(())
}

fn atomics_fetch_add_and_compare_swap<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &atomic_opts())?;
    let w = word(&eb, Access::REMOTE_ATOMIC, 40)?;
    let remote = w.remote(8);
    post(&ea, 1, SendOp::FetchAdd { remote, add: 2 }, 0)?;
    let wc = wait_cq(h, &ea.cq, 1)?[0];
    check_wc(&wc, 1, WcStatus::Success)?;
    ensure_eq!(wc.opcode, WcOpcode::FetchAdd);
    ensure_eq!(read_u64(&ea.rbuf, 0), 40, "fetch-add returns the old value");
    ensure_eq!(read_u64(&w, 8), 42, "and adds");
    // Wrapping, as the hardware does.
    post(
        &ea,
        2,
        SendOp::FetchAdd {
            remote,
            add: u64::MAX,
        },
        16,
    )?;
    check_wc(&wait_cq(h, &ea.cq, 1)?[0], 2, WcStatus::Success)?;
    ensure_eq!(read_u64(&w, 8), 41);
    // A matching compare swaps, a failing one leaves memory alone; both
    // return what they found.
    let cas = |compare, swap| SendOp::CompareSwap {
        remote,
        compare,
        swap,
    };
    post(&ea, 3, cas(41, 7), 24)?;
    let wc = wait_cq(h, &ea.cq, 1)?[0];
    check_wc(&wc, 3, WcStatus::Success)?;
    ensure_eq!(wc.opcode, WcOpcode::CompareSwap);
    ensure_eq!(read_u64(&ea.rbuf, 24), 41);
    ensure_eq!(read_u64(&w, 8), 7);
    post(&ea, 4, cas(41, 9), 32)?;
    check_wc(&wait_cq(h, &ea.cq, 1)?[0], 4, WcStatus::Success)?;
    ensure_eq!(read_u64(&ea.rbuf, 32), 7);
    ensure_eq!(read_u64(&w, 8), 7, "a failed compare swaps nothing");
    // The neighbours of the word are untouched.
    ensure_eq!(read_u64(&w, 0), 0);
    ensure_eq!(read_u64(&w, 16), 0);
    // Many in flight at once, each applied once.
    for i in 0..20u64 {
        post(
            &ea,
            100 + i,
            SendOp::FetchAdd { remote, add: 1 },
            64 + 8 * i as usize,
        )?;
    }
    let wcs = wait_cq(h, &ea.cq, 20)?;
    ensure!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    ensure_eq!(read_u64(&w, 8), 27);
    let mut seen: Vec<u64> = (0..20).map(|i| read_u64(&ea.rbuf, 64 + 8 * i)).collect();
    seen.sort_unstable();
    ensure_eq!(
        seen,
        (7..27).collect::<Vec<u64>>(),
        "each saw a distinct value"
    );
    Ok(())
}

fn atomics_need_access<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    // The region does not grant remote atomics.
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &atomic_opts())?;
    let w = word(&eb, Access::REMOTE_READ | Access::REMOTE_WRITE, 5)?;
    post(
        &ea,
        1,
        SendOp::FetchAdd {
            remote: w.remote(8),
            add: 1,
        },
        0,
    )?;
    check_wc(&wait_cq(h, &ea.cq, 1)?[0], 1, WcStatus::RemoteAccess)?;
    ensure_eq!(read_u64(&w, 8), 5);
    // The responder QP does not enable them: an invalid request.
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &Opts::default())?;
    let w = word(&eb, Access::REMOTE_ATOMIC, 5)?;
    post(
        &ea,
        2,
        SendOp::CompareSwap {
            remote: w.remote(8),
            compare: 5,
            swap: 6,
        },
        0,
    )?;
    check_wc(
        &wait_cq(h, &ea.cq, 1)?[0],
        2,
        WcStatus::RemoteInvalidRequest,
    )?;
    ensure_eq!(read_u64(&w, 8), 5);
    ensure_eq!(ea.qp.state()?, QpState::Error);
    Ok(())
}

fn atomics_misaligned<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &atomic_opts())?;
    let w = word(&eb, Access::REMOTE_ATOMIC, 5)?;
    let sge = [ea.rbuf.sge(0, 8)];
    let misaligned = SendOp::FetchAdd {
        remote: w.remote(12),
        add: 1,
    };
    // Refused at post (rdma_rxe checks there) or by the responder.
    match ea
        .qp
        .post_send(&SendWr::new(1, misaligned, Payload::Sgl(&sge)))
    {
        Err(Error::InvalidArgument(_)) => {}
        Err(e) => return Err(Failure(format!("a misaligned atomic failed with {e:?}"))),
        Ok(()) => check_wc(
            &wait_cq(h, &ea.cq, 1)?[0],
            1,
            WcStatus::RemoteInvalidRequest,
        )?,
    }
    ensure_eq!(read_u64(&w, 8), 5);
    ensure_eq!(read_u64(&w, 16), 0);
    // The result must have room for the 8 bytes, and cannot be inline.
    let sge = [ea.rbuf.sge(0, 4)];
    let op = SendOp::FetchAdd {
        remote: w.remote(8),
        add: 1,
    };
    ensure!(
        ea.qp
            .post_send(&SendWr::new(2, op, Payload::Sgl(&sge)))
            .is_err(),
        "a 4-byte result was accepted"
    );
    ensure!(
        ea.qp
            .post_send(&SendWr::new(3, op, Payload::Inline(&[0; 8])))
            .is_err(),
        "an inline atomic was accepted"
    );
    Ok(())
}

fn atomics_retransmitted_run_once<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &atomic_opts())?;
    let w = word(&eb, Access::REMOTE_ATOMIC, 100)?;
    post(
        &ea,
        1,
        SendOp::FetchAdd {
            remote: w.remote(8),
            add: 5,
        },
        0,
    )?;
    // Let the request land, then cut the path before the answer is back:
    // the requester times out and sends the request again.
    let end = h.now() + Duration::from_millis(5);
    while read_u64(&w, 8) == 100 {
        ensure!(h.now() < end, "the atomic never reached the responder");
        h.settle(Duration::from_nanos(100));
    }
    h.partition(a.node, b.node, true).map_err(Failure)?;
    h.settle(Duration::from_millis(300));
    h.partition(a.node, b.node, false).map_err(Failure)?;
    let wc = wait_cq(h, &ea.cq, 1)?[0];
    check_wc(&wc, 1, WcStatus::Success)?;
    ensure_eq!(read_u64(&w, 8), 105, "the retransmission added again");
    ensure_eq!(
        read_u64(&ea.rbuf, 0),
        100,
        "the answer to the retransmission is the first one's"
    );
    Ok(())
}

fn atomics_unsupported<H: Harness>(h: &H) -> Outcome {
    let (a, b) = two(h)?;
    let (ea, eb) = connect_rc(h, &a, &b, &Opts::default(), &Opts::default())?;
    let w = word(&eb, Access::REMOTE_READ, 5)?;
    let sge = [ea.rbuf.sge(0, 8)];
    let op = SendOp::FetchAdd {
        remote: w.remote(8),
        add: 1,
    };
    match ea.qp.post_send(&SendWr::new(1, op, Payload::Sgl(&sge))) {
        Err(Error::Unsupported(_)) => {}
        other => return Err(Failure(format!("expected Unsupported, got {other:?}"))),
    }
    // The connection is unharmed.
    eb.post_recv(0)?;
    ea.send(2, b"still fine")?;
    check_wc(&wait_cq(h, &ea.cq, 1)?[0], 2, WcStatus::Success)?;
    Ok(())
}
