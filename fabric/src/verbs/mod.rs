//! `VerbsFabric`: the fabric traits on real libibverbs and librdmacm.
//!
//! A thin translation: every trait method is one or a few verbs calls. The
//! device contexts are librdmacm's own (`rdma_get_devices`), so RDMA CM ids
//! and the QPs they connect live on the same context. Objects own what they
//! depend on (`Arc`): an MR keeps its PD, a QP its PD, CQs, SRQ and XRC
//! domain; dropping the last handle destroys the verbs object.
//!
//! `unsafe` lives in this module and in `buf.rs`, `usermem.rs`, `reg.rs`,
//! `memmon.rs`, `sim/memory.rs` and `sim/alloc.rs` (and the `reg_mr`
//! contract of the `Context` trait), nowhere else in the workspace; every
//! block says why it is sound.

mod cm;
mod objects;
pub(crate) mod sys;

use std::ffi::CStr;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

pub use cm::{VerbsCmChannel, VerbsCmId};
pub use objects::{
    VerbsCq, VerbsInline, VerbsMr, VerbsPd, VerbsQp, VerbsRecvs, VerbsSrq, VerbsStaged, VerbsXrcd,
};

use crate::types::*;
use crate::{Context, Error, Fabric, QpInit, Result};

/// Maps an errno from a verbs call onto the fabric's error.
pub(crate) fn errno_error(verb: &'static str, errno: i32) -> Error {
    match errno {
        libc::EOPNOTSUPP | libc::ENOSYS | libc::EPROTONOSUPPORT => Error::Unsupported(verb),
        libc::ENOMEM | libc::EAGAIN => Error::NoResource(verb),
        libc::EINVAL => Error::InvalidArgument(format!("{verb}: invalid argument (EINVAL)")),
        libc::ENOENT | libc::ENODEV => Error::NotFound(format!("{verb}: no such object")),
        libc::EADDRINUSE => Error::AddrInUse(verb.to_string()),
        e => Error::Verbs {
            verb,
            source: io::Error::from_raw_os_error(e),
        },
    }
}

/// The error of a call that returned NULL or -1 and set `errno`.
pub(crate) fn last_error(verb: &'static str) -> Error {
    errno_error(
        verb,
        io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EIO),
    )
}

/// The error of an ibv call that returns an errno value (0 on success).
pub(crate) fn check(verb: &'static str, rc: i32) -> Result<()> {
    match rc {
        0 => Ok(()),
        // Some providers return -1 and set errno instead.
        r if r < 0 => Err(last_error(verb)),
        r => Err(errno_error(verb, r)),
    }
}

/// librdmacm's device list: the contexts every id and object uses.
struct DeviceList {
    list: *mut *mut sys::ibv_context,
    contexts: Vec<*mut sys::ibv_context>,
}

// SAFETY: the list is only read after construction; the contexts it points
// to are thread-safe verbs objects owned by librdmacm.
unsafe impl Send for DeviceList {}
// SAFETY: as above.
unsafe impl Sync for DeviceList {}

impl Drop for DeviceList {
    fn drop(&mut self) {
        if !self.list.is_null() {
            // SAFETY: `list` came from rdma_get_devices and is freed once;
            // the contexts themselves stay open inside librdmacm.
            unsafe { sys::rdma_free_devices(self.list) };
        }
    }
}

/// The verbs devices of this process.
#[derive(Clone)]
pub struct VerbsFabric {
    devs: Arc<DeviceList>,
}

impl std::fmt::Debug for VerbsFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerbsFabric({} devices)", self.devs.contexts.len())
    }
}

impl VerbsFabric {
    /// Lists the devices (none is a valid answer: an empty fabric).
    pub fn new() -> Result<Self> {
        let mut n: i32 = 0;
        // SAFETY: rdma_get_devices writes the count and returns a
        // NULL-terminated array (or NULL when there are no devices).
        let list = unsafe { sys::rdma_get_devices(&mut n) };
        let mut contexts = Vec::new();
        if !list.is_null() {
            for i in 0..n.max(0) as usize {
                // SAFETY: `list` holds `n` entries.
                let c = unsafe { *list.add(i) };
                if !c.is_null() {
                    contexts.push(c);
                }
            }
        }
        Ok(VerbsFabric {
            devs: Arc::new(DeviceList { list, contexts }),
        })
    }

    /// Name and caps of a device, queried once per process: librdmacm's
    /// contexts live as long as the process, and the caps query creates a
    /// probe QP.
    fn describe(ctx: *mut sys::ibv_context) -> Result<DeviceInfo> {
        static KNOWN: Mutex<Vec<(usize, DeviceInfo)>> = Mutex::new(Vec::new());
        let mut known = KNOWN.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, info)) = known.iter().find(|(p, _)| *p == ctx as usize) {
            return Ok(info.clone());
        }
        // SAFETY: `ctx` is a live librdmacm context; its device pointer and
        // name are valid for the context's life.
        let name = unsafe { CStr::from_ptr(sys::ibv_get_device_name((*ctx).device)) }
            .to_string_lossy()
            .into_owned();
        let (caps, vendor_id) = objects::query_caps(ctx)?;
        let info = DeviceInfo {
            name,
            vendor_id,
            caps,
        };
        known.push((ctx as usize, info.clone()));
        Ok(info)
    }
}

impl Fabric for VerbsFabric {
    type Context = VerbsContext;

    fn devices(&self) -> Result<Vec<DeviceInfo>> {
        self.devs
            .contexts
            .iter()
            .map(|c| Self::describe(*c))
            .collect()
    }

    fn open(&self, name: &str) -> Result<VerbsContext> {
        for &ctx in &self.devs.contexts {
            let DeviceInfo {
                name: dev, caps, ..
            } = Self::describe(ctx)?;
            if dev != name {
                continue;
            }
            // Async events are read without blocking.
            // SAFETY: async_fd is the context's open event descriptor.
            unsafe {
                let fd = (*ctx).async_fd;
                let flags = libc::fcntl(fd, libc::F_GETFL);
                if flags < 0 || libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) < 0 {
                    return Err(last_error("fcntl(async_fd)"));
                }
            }
            return Ok(VerbsContext(Arc::new(CtxInner {
                ctx,
                name: dev,
                caps,
                overrun: Mutex::new(Vec::new()),
                _devs: self.devs.clone(),
            })));
        }
        Err(Error::not_found(format!("verbs device {name}")))
    }
}

pub(crate) struct CtxInner {
    pub(crate) ctx: *mut sys::ibv_context,
    name: String,
    caps: DeviceCaps,
    /// Overrun flags of this context's CQs, set by the async event reader.
    pub(crate) overrun: Mutex<Vec<(usize, Arc<AtomicBool>)>>,
    _devs: Arc<DeviceList>,
}

// SAFETY: ibv_context is thread-safe for every call this module makes.
unsafe impl Send for CtxInner {}
// SAFETY: as above.
unsafe impl Sync for CtxInner {}

/// An opened verbs device.
#[derive(Clone)]
pub struct VerbsContext(pub(crate) Arc<CtxInner>);

impl std::fmt::Debug for VerbsContext {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "VerbsContext({})", self.0.name)
    }
}

impl VerbsContext {
    pub(crate) fn raw(&self) -> *mut sys::ibv_context {
        self.0.ctx
    }
}

/// The GID index to route by on `port`: the first RoCE v2 entry with an
/// IPv4-mapped address, else the first RoCE v2 entry, else 0 (InfiniBand,
/// RoCE v1 only). Index 0 is the link-local RoCE v1 GID on mlx5. The port's
/// advertised GID ([`Context::query_port`]) is the one at this index, so
/// that both ends of a hand-made connection use GIDs of the same type.
pub(crate) fn source_gid_index(ctx: *mut sys::ibv_context, port: u8) -> u8 {
    let mut attr = sys::ibv_port_attr::default();
    // SAFETY: the context is live; `attr` is writable.
    if unsafe { sys::___ibv_query_port(ctx, port, &mut attr) } != 0 {
        return 0;
    }
    let mut any_v2 = None;
    for i in 0..attr.gid_tbl_len.clamp(0, 256) as u32 {
        let mut e = sys::ibv_gid_entry::default();
        // SAFETY: the context is live; `e` is writable; an index past the
        // populated entries fails and is skipped.
        if unsafe { sys::ibv_query_gid_ex(ctx, u32::from(port), i, &mut e, 0) } != 0 {
            continue;
        }
        if e.gid_type != sys::IBV_GID_TYPE_ROCE_V2 {
            continue;
        }
        // SAFETY: `raw` is the plain-bytes view of the union.
        let raw = unsafe { e.gid.raw };
        let v4_mapped = raw[..10].iter().all(|&b| b == 0) && raw[10] == 0xff && raw[11] == 0xff;
        if v4_mapped {
            return i as u8;
        }
        any_v2.get_or_insert(i as u8);
    }
    any_v2.unwrap_or(0)
}

/// The XRC domain key for a job on a device: the file `xrcd-<job>-<device>`
/// in `dir`, or by default in `/tmp/xrcbtl-<uid>`. Nothing is made here:
/// the directory and the file are made, and checked, when a domain is
/// opened ([`open_key_file`]), so that a device without XRC never touches
/// them.
///
/// Every rank of the job on the node must arrive at the same file, whatever
/// its environment: that is why the default does not follow
/// `$XDG_RUNTIME_DIR`, which a launcher may set for some ranks and not
/// others, or forward from a submit host where it names a directory the
/// node lacks. Where `/tmp` is private to each rank (some containers), give
/// a shared `dir`. Ranks still check that they agree (they exchange
/// [`Xrcd::id`](crate::Xrcd::id)).
pub fn job_xrcd_key(job: &str, device: &str, dir: Option<&Path>) -> Result<XrcdKey> {
    let ok = |c: char| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.';
    if job.is_empty() || !job.chars().all(ok) || device.is_empty() || !device.chars().all(ok) {
        return Err(Error::invalid(format!(
            "job id {job:?} or device {device:?} is not a plain name"
        )));
    }
    let dir = match dir {
        Some(d) if d.is_absolute() => d.to_path_buf(),
        Some(d) => {
            return Err(Error::invalid(format!(
                "the XRC domain directory {} must be an absolute path (every rank must find it)",
                d.display()
            )))
        }
        None => {
            // SAFETY: getuid cannot fail.
            let uid = unsafe { libc::getuid() };
            PathBuf::from(format!("/tmp/xrcbtl-{uid}"))
        }
    };
    Ok(XrcdKey(dir.join(format!("xrcd-{job}-{device}"))))
}

/// Opens the key file of an XRC domain, made if need be, and refuses
/// anything another local user could have put in its way: whoever can
/// open the file joins the domain, and whoever can replace it or its
/// directory can make a job join theirs.
///
/// - The directory is made (with its parents) mode 0700, and must be a
///   directory, not a symbolic link, of this user that nobody else may
///   enter.
/// - The file is opened without following a symbolic link (`O_NOFOLLOW`),
///   made mode 0600, and must be a regular file of this user that nobody
///   else may read or write.
///
/// A squatter's directory or file is refused with an error that names it
/// and says what is wrong, never used.
pub fn open_key_file(key: &XrcdKey) -> Result<std::fs::File> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
    // SAFETY: getuid cannot fail.
    let uid = unsafe { libc::getuid() };
    let dir = key.0.parent().filter(|d| d.is_absolute()).ok_or_else(|| {
        Error::invalid(format!(
            "the XRC domain key {} must be an absolute path",
            key.0.display()
        ))
    })?;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|e| Error::Verbs {
            verb: "mkdir(xrcd key directory)",
            source: e,
        })?;
    let private = |what: &str, path: &Path, meta: &std::fs::Metadata, kind_ok: bool, kind: &str| {
        if !kind_ok {
            Err(Error::invalid(format!(
                "the XRC domain {what} {} is not a {kind} (refused: another user may have put it there)",
                path.display()
            )))
        } else if meta.uid() != uid {
            Err(Error::invalid(format!(
                "the XRC domain {what} {} belongs to uid {}, not to this user (uid {uid}): refused",
                path.display(),
                meta.uid()
            )))
        } else if meta.mode() & 0o077 != 0 {
            Err(Error::invalid(format!(
                "the XRC domain {what} {} has mode {:o}: others may use it, refused (it must be \
                 private to uid {uid})",
                path.display(),
                meta.mode() & 0o7777
            )))
        } else {
            Ok(())
        }
    };
    let meta = std::fs::symlink_metadata(dir).map_err(|e| Error::Verbs {
        verb: "stat(xrcd key directory)",
        source: e,
    })?;
    private(
        "directory",
        dir,
        &meta,
        meta.file_type().is_dir(),
        "directory",
    )?;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&key.0)
        .map_err(|e| {
            if e.raw_os_error() == Some(libc::ELOOP) {
                Error::invalid(format!(
                    "the XRC domain key {} is a symbolic link: refused",
                    key.0.display()
                ))
            } else {
                Error::Verbs {
                    verb: "open(xrcd key)",
                    source: e,
                }
            }
        })?;
    let meta = file.metadata().map_err(|e| Error::Verbs {
        verb: "fstat(xrcd key)",
        source: e,
    })?;
    private(
        "key",
        &key.0,
        &meta,
        meta.file_type().is_file(),
        "regular file",
    )?;
    Ok(file)
}

/// The network interfaces of a verbs device: for RoCE and iWARP the netdev
/// its GIDs are bound to (`ports/1/gid_attrs/ndevs/*`), for InfiniBand the
/// IPoIB interfaces of its PCI device (`device/net/*`).
pub fn device_netdevs(device: &str) -> Vec<String> {
    let base = PathBuf::from("/sys/class/infiniband").join(device);
    let mut out: Vec<String> = Vec::new();
    if let Ok(dir) = std::fs::read_dir(base.join("ports/1/gid_attrs/ndevs")) {
        for e in dir.flatten() {
            if let Ok(name) = std::fs::read_to_string(e.path()) {
                let name = name.trim().to_string();
                if !name.is_empty() && !out.contains(&name) {
                    out.push(name);
                }
            }
        }
    }
    if let Ok(dir) = std::fs::read_dir(base.join("device/net")) {
        for e in dir.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            if !out.contains(&name) {
                out.push(name);
            }
        }
    }
    out
}

/// The IPv4 address of a verbs device's network interface: where its RDMA
/// CM listener is reached. `NotFound` when the device has no interface
/// with an IPv4 address.
pub fn device_ip(device: &str) -> Result<std::net::IpAddr> {
    let netdevs = device_netdevs(device);
    let mut found = None;
    let mut ifap: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills a list we free below.
    if unsafe { libc::getifaddrs(&mut ifap) } != 0 {
        return Err(last_error("getifaddrs"));
    }
    let mut cur = ifap;
    while !cur.is_null() && found.is_none() {
        // SAFETY: `cur` is an entry of the list getifaddrs returned.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
            continue;
        }
        // SAFETY: a non-null address of the entry; its family says its type.
        if i32::from(unsafe { (*ifa.ifa_addr).sa_family }) != libc::AF_INET {
            continue;
        }
        // SAFETY: the entry's name is a NUL-terminated string.
        let name = unsafe { CStr::from_ptr(ifa.ifa_name) }.to_string_lossy();
        if netdevs.iter().any(|n| *n == name) {
            // SAFETY: an AF_INET address is a sockaddr_in.
            let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
            found = Some(std::net::IpAddr::V4(std::net::Ipv4Addr::from(
                u32::from_be(sin.sin_addr.s_addr),
            )));
        }
    }
    // SAFETY: the list getifaddrs returned, freed once.
    unsafe { libc::freeifaddrs(ifap) };
    found.ok_or_else(|| {
        Error::not_found(format!(
            "an IPv4 address on the interfaces of verbs device {device} ({})",
            if netdevs.is_empty() {
                "none found".to_string()
            } else {
                netdevs.join(", ")
            }
        ))
    })
}

impl Context for VerbsContext {
    type Pd = VerbsPd;
    type Mr = VerbsMr;
    type Cq = VerbsCq;
    type Srq = VerbsSrq;
    type Qp = VerbsQp;
    type Xrcd = VerbsXrcd;
    type CmChannel = VerbsCmChannel;

    fn name(&self) -> &str {
        &self.0.name
    }

    fn locality_names(&self) -> Vec<String> {
        let mut names = vec![self.0.name.clone()];
        names.extend(device_netdevs(&self.0.name));
        names
    }

    fn caps(&self) -> &DeviceCaps {
        &self.0.caps
    }

    fn query_port(&self, port: u8) -> Result<PortAttr> {
        objects::query_port(self.raw(), port)
    }

    fn alloc_pd(&self) -> Result<VerbsPd> {
        VerbsPd::new(self)
    }

    unsafe fn reg_mr(
        &self,
        pd: &VerbsPd,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> Result<VerbsMr> {
        // Refused here, as the simulator does, rather than by a kernel that
        // may warn first (rxe: see RXE_MR_SIZE_MAX).
        self.0.caps.check_mr_len(len as u64)?;
        // SAFETY: the caller upholds reg_mr's contract.
        unsafe { VerbsMr::new(pd, addr, len, access) }
    }

    fn create_cq(&self, cqe: u32) -> Result<VerbsCq> {
        VerbsCq::new(self, cqe)
    }

    fn create_srq(&self, pd: &VerbsPd, attr: SrqAttr) -> Result<VerbsSrq> {
        VerbsSrq::new(self, pd, None, attr)
    }

    fn open_xrcd(&self, key: &XrcdKey) -> Result<VerbsXrcd> {
        if !self.0.caps.xrc {
            return Err(Error::Unsupported("the device caps report no XRC"));
        }
        VerbsXrcd::open(self, key)
    }

    fn create_xrc_srq(
        &self,
        pd: &VerbsPd,
        xrcd: &VerbsXrcd,
        cq: &VerbsCq,
        attr: SrqAttr,
    ) -> Result<VerbsSrq> {
        VerbsSrq::new(self, pd, Some((xrcd, cq)), attr)
    }

    fn create_qp(&self, pd: &VerbsPd, init: &QpInit<'_, Self>) -> Result<VerbsQp> {
        if init.qp_type == QpType::XrcIni && !self.0.caps.xrc {
            return Err(Error::Unsupported("the device caps report no XRC"));
        }
        VerbsQp::create(self, pd, init)
    }

    fn create_tgt_qp(&self, xrcd: &VerbsXrcd) -> Result<VerbsQp> {
        VerbsQp::create_tgt(self, xrcd)
    }

    fn open_tgt_qp(&self, xrcd: &VerbsXrcd, qpn: u32) -> Result<VerbsQp> {
        VerbsQp::open_tgt(self, xrcd, qpn)
    }

    fn poll_async_event(&self) -> Option<AsyncEvent> {
        objects::read_async_event(self)
    }

    fn create_cm_channel(&self) -> Result<VerbsCmChannel> {
        VerbsCmChannel::new(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn job_key_lives_in_a_private_directory() {
        let base = std::env::temp_dir().join(format!("xrcbtl-keytest-{}", std::process::id()));
        // Parents are made too, at open only.
        let dir = base.join("session/xrc");
        let key = job_xrcd_key("job-42", "mlx5_0", Some(&dir)).unwrap();
        assert_eq!(key.0.parent().unwrap(), dir);
        assert!(!dir.exists(), "naming the key makes nothing");
        open_key_file(&key).unwrap();
        let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "the key directory must be private");
        let mode = std::fs::metadata(&key.0).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the key file must be private");
        assert!(key.0.ends_with("xrcd-job-42-mlx5_0"));
        // Names that could climb out of the directory are refused, and so
        // is a relative directory (ranks may run in different ones).
        assert!(job_xrcd_key("../etc", "mlx5_0", Some(&dir)).is_err());
        assert!(job_xrcd_key("job", "a/b", Some(&dir)).is_err());
        assert!(job_xrcd_key("", "mlx5_0", Some(&dir)).is_err());
        assert!(job_xrcd_key("job", "", Some(&dir)).is_err());
        assert!(job_xrcd_key("job", "mlx5_0", Some(Path::new("rel/dir"))).is_err());
        // A directory others can enter is refused.
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let err = open_key_file(&key).unwrap_err().to_string();
        assert!(err.contains("has mode 755"), "{err}");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn a_squatted_key_directory_or_file_is_refused() {
        use std::os::unix::fs::symlink;
        let base = std::env::temp_dir().join(format!("xrcbtl-squat-{}", std::process::id()));
        std::fs::create_dir_all(&base).unwrap();
        std::fs::set_permissions(&base, std::fs::Permissions::from_mode(0o700)).unwrap();
        // The directory is a symbolic link to somewhere else.
        let elsewhere = base.join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::set_permissions(&elsewhere, std::fs::Permissions::from_mode(0o700)).unwrap();
        symlink(&elsewhere, base.join("link")).unwrap();
        let key = XrcdKey(base.join("link/xrcd-j-d"));
        let err = open_key_file(&key).unwrap_err().to_string();
        assert!(err.contains("is not a directory"), "{err}");
        // The file is a symbolic link (to a file of this user's, even).
        let dir = base.join("d");
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::fs::write(elsewhere.join("target"), b"").unwrap();
        symlink(elsewhere.join("target"), dir.join("xrcd-j-d")).unwrap();
        let err = open_key_file(&XrcdKey(dir.join("xrcd-j-d")))
            .unwrap_err()
            .to_string();
        assert!(err.contains("symbolic link"), "{err}");
        // A file others may read.
        let open = dir.join("xrcd-open");
        std::fs::write(&open, b"").unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).unwrap();
        let err = open_key_file(&XrcdKey(open)).unwrap_err().to_string();
        assert!(err.contains("has mode 644"), "{err}");
        // Another user's directory and file (root can make them here).
        // SAFETY: getuid cannot fail.
        if unsafe { libc::getuid() } == 0 {
            let theirs = base.join("theirs");
            std::fs::create_dir(&theirs).unwrap();
            std::fs::set_permissions(&theirs, std::fs::Permissions::from_mode(0o700)).unwrap();
            std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
            let err = open_key_file(&XrcdKey(theirs.join("k")))
                .unwrap_err()
                .to_string();
            assert!(err.contains("belongs to uid 65534"), "{err}");
            let file = dir.join("xrcd-theirs");
            std::fs::write(&file, b"").unwrap();
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
            std::os::unix::fs::chown(&file, Some(65534), Some(65534)).unwrap();
            let err = open_key_file(&XrcdKey(file)).unwrap_err().to_string();
            assert!(err.contains("belongs to uid 65534"), "{err}");
        }
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn the_default_key_ignores_the_environment() {
        // SAFETY: getuid cannot fail.
        let uid = unsafe { libc::getuid() };
        // A launcher that forwards the submit host's runtime directory
        // changes nothing. (No other test of this crate reads it.)
        std::env::set_var("XDG_RUNTIME_DIR", "/run/user/nonexistent");
        let key = job_xrcd_key("job-7", "rxe0", None).unwrap();
        assert_eq!(
            key.0,
            PathBuf::from(format!("/tmp/xrcbtl-{uid}/xrcd-job-7-rxe0"))
        );
    }
}
