//! Simulated jobs for C programs: several ranks in one process on the
//! simulated fabric, in virtual time, so that C code runs against xrcbtl
//! with no device. The ranks' handles work like any other; time moves when
//! the program calls `xrcbtl_sim_step`.

use std::cell::Cell;
use std::ffi::c_int;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use xrcbtl_btl::sim::{SimJob, Step};
use xrcbtl_fabric::sim::{SimConfig, SimDevice};

use crate::create::Settings;
use crate::handle::{xrcbtl_t, AnyBtl};
use crate::status::*;
use crate::types::*;
use xrcbtl_btl::addr::Address;

const LIVE: u64 = 0x7872_6362_7369_6d01;
const DEAD: u64 = 0x7872_6362_7369_dead;

/// A simulated job (opaque to C).
#[allow(non_camel_case_types)]
pub struct xrcbtl_sim_t {
    magic: u64,
    job: Mutex<SimJob>,
    // Boxed: C holds their addresses, which stay put whatever the vector does.
    #[allow(clippy::vec_box)]
    ranks: Vec<Box<xrcbtl_t>>,
}

thread_local! {
    /// Set while this thread steps a job (its callbacks run inside).
    static STEPPING: Cell<bool> = const { Cell::new(false) };
}

/// Clears [`STEPPING`] when a step ends, or panics.
struct Stepping;

impl Drop for Stepping {
    fn drop(&mut self) {
        STEPPING.with(|s| s.set(false));
    }
}

/// The job behind a pointer C passed, locked, if it is a live one and
/// this thread is not inside one of its steps.
///
/// # Safety
/// `p` is `NULL` or a live job handle.
unsafe fn job<'a>(p: *mut xrcbtl_sim_t) -> Outcome<(&'a xrcbtl_sim_t, MutexGuard<'a, SimJob>)> {
    // SAFETY: the caller's promise.
    let s = unsafe { p.as_ref() }.ok_or_else(|| Failure::invalid("the job is NULL"))?;
    if s.magic != LIVE {
        return Err(Failure::invalid("not a live simulated job (destroyed?)"));
    }
    if STEPPING.with(|s| s.get()) {
        return Err(Failure::new(
            XRCBTL_ERR_STATE,
            "a simulated job cannot be driven from inside its own callbacks",
        ));
    }
    Ok((s, s.job.lock().unwrap_or_else(|e| e.into_inner())))
}

/// Makes a simulated job: `nodes` x `ranks_per_node` ranks, every one
/// already a peer of every other (`xrcbtl_add_peer` with their addresses
/// is allowed and changes nothing).
///
/// # Safety
/// `params` is readable (with a valid settings array if its mask marks
/// one); `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_sim_create(
    params: *const xrcbtl_sim_params_t,
    out: *mut *mut xrcbtl_sim_t,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let p = unsafe { params.as_ref() }.ok_or_else(|| Failure::invalid("params is NULL"))?;
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let has = |bit| p.field_mask & bit != 0;
        let seed = if has(XRCBTL_SIM_PARAM_SEED) {
            p.seed
        } else {
            1
        };
        let nodes = if has(XRCBTL_SIM_PARAM_NODES) {
            p.nodes
        } else {
            2
        } as usize;
        let per_node = if has(XRCBTL_SIM_PARAM_RANKS_PER_NODE) {
            p.ranks_per_node
        } else {
            1
        } as usize;
        if nodes == 0 || per_node == 0 || nodes * per_node > 4096 {
            return Err(Failure::invalid(format!(
                "{nodes} nodes x {per_node} ranks: need 1..=4096 ranks"
            )));
        }
        let device = match if has(XRCBTL_SIM_PARAM_DEVICE) {
            p.device
        } else {
            XRCBTL_SIM_IB
        } {
            XRCBTL_SIM_IB => SimDevice::ib("sim0"),
            XRCBTL_SIM_ROCE => SimDevice::roce("sim0"),
            XRCBTL_SIM_IWARP => SimDevice::iwarp("sim0"),
            d => return Err(Failure::invalid(format!("unknown simulated device {d}"))),
        };
        let settings = if has(XRCBTL_SIM_PARAM_SETTINGS) {
            // SAFETY: the caller's promise.
            unsafe { Settings::read(p.settings) }?
        } else {
            Settings::default()
        };
        // Checked once here, so that applying them to each rank cannot fail.
        let probe = xrcbtl_btl::BtlConfig::new(
            0,
            0,
            0,
            xrcbtl_fabric::XrcdKey::new("probe"),
            "127.0.0.1:0".parse().expect("an address"),
        );
        settings.apply(probe, |_| None)?;
        let job = SimJob::with(
            SimConfig::new(seed, nodes).with_devices(vec![device]),
            per_node,
            |c| {
                *c = settings
                    .apply(c.clone(), |_| None)
                    .expect("settings checked above");
            },
        )?;
        let ranks = (0..job.size() as u32)
            .map(|r| {
                let jr = job.get(r);
                let node = jr.node as u32;
                let me = Address {
                    rank: r,
                    listen: jr.btl.listen_addr().expect("a simulated rank listens"),
                    node_key: format!("sim/{node}"),
                    receive: jr.btl.receive(),
                    ib: jr.btl.listen_ib_addr(),
                };
                xrcbtl_t::new(AnyBtl::Sim(Arc::clone(&jr.btl)), me, node, true)
            })
            .collect();
        let s = Box::new(xrcbtl_sim_t {
            magic: LIVE,
            job: Mutex::new(job),
            ranks,
        });
        // SAFETY: `out` is writable (checked non-null, the caller's promise).
        unsafe { *out = Box::into_raw(s) };
        Ok(XRCBTL_OK)
    })
}

/// Rank `rank` of the job (owned by the job: valid until
/// `xrcbtl_sim_destroy`), or `NULL` if there is no such rank or it
/// crashed.
///
/// # Safety
/// `sim` is a live job.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_sim_rank(sim: *mut xrcbtl_sim_t, rank: u32) -> *mut xrcbtl_t {
    let mut out = std::ptr::null_mut();
    guard(|| {
        // SAFETY: the caller's promise.
        let (s, j) = unsafe { job(sim) }?;
        if j.is_live(rank) {
            let h: &xrcbtl_t = &s.ranks[rank as usize];
            out = h as *const xrcbtl_t as *mut xrcbtl_t;
        }
        Ok(XRCBTL_OK)
    });
    out
}

/// Progresses every live rank once (their callbacks run inside); when no
/// rank had anything to do, moves virtual time to the next event. Returns
/// how much work the ranks found (0: time moved), or `XRCBTL_ERR_STATE`
/// when nothing can happen any more (nothing is scheduled anywhere).
///
/// # Safety
/// `sim` is a live job.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_sim_step(sim: *mut xrcbtl_sim_t) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let (_, mut j) = unsafe { job(sim) }?;
        for r in j.live() {
            // Marks the rank: the caller may have called into it.
            j.rank(r);
        }
        STEPPING.with(|s| s.set(true));
        let _clear = Stepping;
        match j.step() {
            Step::Worked(n) => Ok(n.min(c_int::MAX as usize) as c_int),
            Step::Advanced => Ok(0),
            Step::Stuck => Err(Failure::new(
                XRCBTL_ERR_STATE,
                "nothing is scheduled anywhere: the job cannot move",
            )),
        }
    })
}

/// Virtual time of the job, in nanoseconds.
///
/// # Safety
/// `sim` is a live job.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_sim_now_ns(sim: *mut xrcbtl_sim_t) -> u64 {
    let mut t = 0;
    guard(|| {
        // SAFETY: the caller's promise.
        let (_, j) = unsafe { job(sim) }?;
        t = j.now().as_nanos().min(u64::MAX as u128) as u64;
        Ok(XRCBTL_OK)
    });
    t
}

/// Kills rank `rank` as a crash would: the fabric releases what it held,
/// and its peers find out as they would on real hardware. Its handle
/// stays valid memory but fails every call.
///
/// # Safety
/// `sim` is a live job.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_sim_crash(sim: *mut xrcbtl_sim_t, rank: u32) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let (_, mut j) = unsafe { job(sim) }?;
        if !j.is_live(rank) {
            return Err(Failure::invalid(format!("rank {rank} is not a live rank")));
        }
        j.crash(rank);
        Ok(XRCBTL_OK)
    })
}

/// Steps until every live rank is idle, then has them all leave cleanly,
/// and checks the simulated fabric's invariants (no QP, TGT QP or
/// registration left behind). `XRCBTL_ERR_TIMEOUT` if that takes more
/// than `limit_us` of virtual time; the message says where each rank is.
///
/// # Safety
/// `sim` is a live job.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_sim_shutdown(sim: *mut xrcbtl_sim_t, limit_us: u64) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let (_, mut j) = unsafe { job(sim) }?;
        STEPPING.with(|s| s.set(true));
        let _clear = Stepping;
        j.shutdown(Duration::from_micros(limit_us))
            .map_err(|e| Failure::new(XRCBTL_ERR_TIMEOUT, e))?;
        Ok(XRCBTL_OK)
    })
}

/// Frees the job and its ranks' handles.
///
/// # Safety
/// `sim` is `NULL` or a live job no other thread is using.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_sim_destroy(sim: *mut xrcbtl_sim_t) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        drop(unsafe { job(sim) }?);
        // SAFETY: a live job made by Box::into_raw, given back once.
        let mut s = unsafe { Box::from_raw(sim) };
        s.magic = DEAD;
        for r in &mut s.ranks {
            r.kill();
        }
        drop(s);
        Ok(XRCBTL_OK)
    })
}
