//! Making a rank on a verbs device (`xrcbtl_create`), the settings C passes
//! in, and the table of every setting (`xrcbtl_settings`).

use std::collections::HashMap;
use std::ffi::{c_char, c_int, CStr, CString};
use std::sync::OnceLock;

use xrcbtl_btl::{BtlConfig, SETTINGS};

use crate::handle::xrcbtl_t;
use crate::status::*;
use crate::types::*;

/// A C string argument.
///
/// # Safety
/// `p` is `NULL` or a NUL-terminated string.
pub(crate) unsafe fn c_str<'a>(p: *const c_char, what: &str) -> Outcome<&'a str> {
    if p.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: the caller's promise.
    unsafe { CStr::from_ptr(p) }
        .to_str()
        .map_err(|_| Failure::invalid(format!("{what} is not UTF-8")))
}

/// Settings given as a `NULL`-terminated array of `"XRCBTL_NAME=value"`.
#[derive(Debug, Default, Clone)]
pub(crate) struct Settings(HashMap<String, String>);

impl Settings {
    /// Reads the array; an unknown name or a string without `=` is refused.
    ///
    /// # Safety
    /// `list` is `NULL` or a `NULL`-terminated array of C strings.
    pub unsafe fn read(list: *const *const c_char) -> Outcome<Settings> {
        let mut out = HashMap::new();
        if list.is_null() {
            return Ok(Settings(out));
        }
        for i in 0.. {
            // SAFETY: the array is NULL-terminated; we stop at its end.
            let p = unsafe { *list.add(i) };
            if p.is_null() {
                break;
            }
            // SAFETY: each entry is a C string.
            let s = unsafe { c_str(p, "a setting") }?;
            let (k, v) = s
                .split_once('=')
                .ok_or_else(|| Failure::invalid(format!("setting {s:?} is not NAME=value")))?;
            if !SETTINGS.iter().any(|x| x.name == k) {
                return Err(Failure::invalid(format!(
                    "unknown setting {k} (xrcbtl_settings lists them)"
                )));
            }
            out.insert(k.to_string(), v.to_string());
        }
        Ok(Settings(out))
    }

    /// Applies them over `env` (a lookup of the environment, or nothing).
    pub fn apply(
        &self,
        cfg: BtlConfig,
        env: impl Fn(&str) -> Option<String>,
    ) -> Outcome<BtlConfig> {
        Ok(cfg.with_vars(|k| self.0.get(k).cloned().or_else(|| env(k)))?)
    }
}

/// Makes a rank on a verbs device.
#[cfg(feature = "verbs")]
fn create_verbs(p: &xrcbtl_params_t) -> Outcome<Box<xrcbtl_t>> {
    use std::net::{IpAddr, SocketAddr};
    use std::sync::Arc;

    use xrcbtl_btl::Btl;
    use xrcbtl_fabric::verbs::{device_ip, job_xrcd_key, VerbsFabric};
    use xrcbtl_fabric::Fabric;

    use crate::handle::AnyBtl;
    use xrcbtl_btl::addr::{job_number, Address};

    let has = |bit| p.field_mask & bit != 0;
    if !has(XRCBTL_PARAM_RANK) || !has(XRCBTL_PARAM_JOB) {
        return Err(Failure::invalid("params need a rank and a job"));
    }
    // SAFETY: the caller passes C strings in the fields it marks.
    let job = unsafe { c_str(p.job, "job") }?;
    let fabric = VerbsFabric::new()?;
    let device = if has(XRCBTL_PARAM_DEVICE) {
        // SAFETY: as above.
        unsafe { c_str(p.device, "device") }?.to_string()
    } else {
        xrcbtl_btl::place::verbs_devices_nearest_first(&fabric)?
            .into_iter()
            .map(|c| c.device)
            .next()
            .ok_or_else(|| {
                Failure::new(
                    XRCBTL_ERR_NOT_FOUND,
                    "no verbs device with an IPv4 address on its interface",
                )
            })?
    };
    let ip: IpAddr = if has(XRCBTL_PARAM_LISTEN_IP) {
        // SAFETY: as above.
        let s = unsafe { c_str(p.listen_ip, "listen_ip") }?;
        s.parse()
            .map_err(|_| Failure::invalid(format!("listen_ip {s:?} is not an IP address")))?
    } else {
        device_ip(&device)?
    };
    let settings = if has(XRCBTL_PARAM_SETTINGS) {
        // SAFETY: as above.
        unsafe { Settings::read(p.settings) }?
    } else {
        Settings::default()
    };
    let use_env = !(has(XRCBTL_PARAM_FLAGS) && p.flags & XRCBTL_FLAG_NO_ENV != 0);
    let ctx = fabric.open(&device)?;
    let cfg = BtlConfig::new(
        p.rank,
        0,
        job_number(job),
        xrcbtl_fabric::XrcdKey::new(""),
        SocketAddr::new(ip, 0),
    );
    if use_env {
        BtlConfig::check_env()?;
    }
    let mut cfg = settings.apply(cfg, |k| if use_env { std::env::var(k).ok() } else { None })?;
    // Every rank of the job on this host and device opens this file; the
    // address carries its identity, so that peers can check.
    cfg.xrcd_key = job_xrcd_key(job, &device, cfg.xrcd_dir.as_deref())?;
    let btl = Btl::new(ctx, cfg)?;
    let listen = btl
        .listen_addr()
        .ok_or_else(|| Failure::new(XRCBTL_ERR_STATE, "the rank has no listener"))?;
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "localhost".into());
    // The XRC node: ranks of one host on one device share its domain.
    let me = Address {
        rank: p.rank,
        listen,
        node_key: format!("{host}/{device}"),
        receive: btl.receive(),
        ib: btl.listen_ib_addr(),
    };
    Ok(xrcbtl_t::new(AnyBtl::Verbs(Arc::new(btl)), me, 0, false))
}

#[cfg(not(feature = "verbs"))]
fn create_verbs(_: &xrcbtl_params_t) -> Outcome<Box<xrcbtl_t>> {
    Err(Failure::new(
        XRCBTL_ERR_UNSUPPORTED,
        "this library was built without the verbs provider (simulated jobs only)",
    ))
}

/// Opens rank `params->rank` of job `params->job` on a verbs device and
/// stores its handle in `*out`. The rank listens for connections at once;
/// publish its address (`xrcbtl_address`) to the other ranks.
///
/// # Safety
/// `params` is readable, with valid strings in the fields its mask marks;
/// `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_create(
    params: *const xrcbtl_params_t,
    out: *mut *mut xrcbtl_t,
) -> c_int {
    guard(|| {
        // SAFETY: the caller's promise.
        let p = unsafe { params.as_ref() }.ok_or_else(|| Failure::invalid("params is NULL"))?;
        if out.is_null() {
            return Err(Failure::invalid("out is NULL"));
        }
        let h = create_verbs(p)?;
        // SAFETY: `out` is writable (the caller's promise, checked non-null).
        unsafe { *out = Box::into_raw(h) };
        Ok(XRCBTL_OK)
    })
}

/// The settings, as C strings that live as long as the library.
fn table() -> &'static [xrcbtl_setting_t] {
    struct Table(Vec<xrcbtl_setting_t>);
    // SAFETY: the pointers are to CStrings leaked below, never written.
    unsafe impl Send for Table {}
    // SAFETY: as above.
    unsafe impl Sync for Table {}
    static TABLE: OnceLock<Table> = OnceLock::new();
    let leak =
        |s: &str| -> *const c_char { CString::new(s).expect("no NUL in a setting").into_raw() };
    &TABLE
        .get_or_init(|| {
            Table(
                SETTINGS
                    .iter()
                    .map(|s| xrcbtl_setting_t {
                        name: leak(s.name),
                        default_value: leak(s.default),
                        help: leak(s.help),
                    })
                    .collect(),
            )
        })
        .0
}

/// Points `*out` at the table of every `XRCBTL_*` setting (name, default,
/// meaning) and returns its length. The table lives as long as the
/// library.
///
/// # Safety
/// `out` is `NULL` (only the length is returned) or writable.
#[no_mangle]
pub unsafe extern "C" fn xrcbtl_settings(out: *mut *const xrcbtl_setting_t) -> usize {
    let t = table();
    if !out.is_null() {
        // SAFETY: the caller's promise.
        unsafe { *out = t.as_ptr() };
    }
    t.len()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn list(items: &[&str]) -> (Vec<CString>, Vec<*const c_char>) {
        let owned: Vec<CString> = items.iter().map(|s| CString::new(*s).unwrap()).collect();
        let mut ptrs: Vec<*const c_char> = owned.iter().map(|s| s.as_ptr()).collect();
        ptrs.push(std::ptr::null());
        (owned, ptrs)
    }

    #[test]
    fn settings_are_checked_and_win_over_the_environment() {
        let (_o, p) = list(&["XRCBTL_EAGER_LIMIT=4096", "XRCBTL_RNDV_PROTOCOL=put"]);
        // SAFETY: a NULL-terminated array of C strings.
        let s = unsafe { Settings::read(p.as_ptr()) }.unwrap();
        let cfg = BtlConfig::new(
            0,
            0,
            1,
            xrcbtl_fabric::XrcdKey::new("k"),
            "127.0.0.1:0".parse().unwrap(),
        );
        let env =
            |k: &str| (k == "XRCBTL_EAGER_LIMIT" || k == "XRCBTL_CREDITS").then(|| "8".to_string());
        let c = s.apply(cfg, env).unwrap();
        assert_eq!(
            c.eager_limit,
            xrcbtl_btl::EagerLimit::Bytes(4096),
            "the setting wins"
        );
        assert_eq!(c.credits, 8, "the environment fills in");
        assert_eq!(c.rndv_protocol, xrcbtl_btl::RndvProtocol::Put);

        for bad in ["XRCBTL_NOPE=1", "XRCBTL_EAGER_LIMIT", "junk"] {
            let (_o, p) = list(&[bad]);
            // SAFETY: as above.
            assert!(unsafe { Settings::read(p.as_ptr()) }.is_err(), "{bad}");
        }
    }

    #[test]
    fn the_table_lists_every_setting() {
        let mut t = std::ptr::null();
        // SAFETY: a writable out-pointer.
        let n = unsafe { xrcbtl_settings(&mut t) };
        assert_eq!(n, SETTINGS.len());
        // SAFETY: the table has n entries of C strings.
        let first = unsafe { CStr::from_ptr((*t).name) };
        assert_eq!(first.to_str().unwrap(), SETTINGS[0].name);
    }
}
