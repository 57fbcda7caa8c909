//! Which devices the provider offers in `fi_getinfo`.
//!
//! `XRCBTL_OFI_FABRIC` picks the fabric: `verbs` (the default) offers every
//! verbs device with an IPv4 address on its interface, where the RDMA CM
//! reaches it, as `xrcbtl_create` picks them; `sim` offers the simulated
//! fabric's InfiniBand device `sim0`, whose endpoints live in the calling
//! process (the host tests' fabric), and `sim-iwarp` its iWARP device
//! `siw0` (no atomics, as siw).
#![forbid(unsafe_code)]

use crate::info::Device;

/// The variable that picks the fabric.
pub const FABRIC_VAR: &str = "XRCBTL_OFI_FABRIC";

/// The fabric the provider offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Which {
    /// Real verbs devices.
    Verbs,
    /// The simulated fabric, in the process.
    Sim,
    /// The simulated fabric with an iWARP device.
    SimIwarp,
}

/// The fabric `XRCBTL_OFI_FABRIC` names, or why its value means nothing.
pub fn which(value: Option<&str>) -> Result<Which, String> {
    match value {
        None | Some("verbs") => Ok(Which::Verbs),
        Some("sim") => Ok(Which::Sim),
        Some("sim-iwarp") => Ok(Which::SimIwarp),
        Some(other) => Err(format!(
            "{FABRIC_VAR}={other:?}: not verbs, sim or sim-iwarp"
        )),
    }
}

/// The devices of a fabric, as getinfo offers them. An error says why
/// there are none where there could be (no verbs in this build, the verbs
/// library failing), for the provider's log.
pub fn list(which: Which) -> Result<Vec<Device>, String> {
    match which {
        Which::Sim | Which::SimIwarp => {
            let sim = if which == Which::Sim {
                xrcbtl_fabric::sim::SimDevice::ib("sim0")
            } else {
                xrcbtl_fabric::sim::SimDevice::iwarp("siw0")
            };
            Ok(vec![Device::of(&sim.name, &sim.caps)])
        }
        Which::Verbs => verbs(),
    }
}

/// The verbs devices, looked up once per process (as libfabric's own
/// verbs provider does): an MPI library or a test calls getinfo many
/// times, and each look opens every device and reads the interfaces'
/// addresses. A failed look is not kept.
#[cfg(feature = "verbs")]
fn verbs() -> Result<Vec<Device>, String> {
    static FOUND: std::sync::OnceLock<Vec<Device>> = std::sync::OnceLock::new();
    if let Some(found) = FOUND.get() {
        return Ok(found.clone());
    }
    let found = look()?;
    Ok(FOUND.get_or_init(|| found).clone())
}

#[cfg(feature = "verbs")]
fn look() -> Result<Vec<Device>, String> {
    use xrcbtl_fabric::verbs::{device_ip, VerbsFabric};
    use xrcbtl_fabric::Fabric;
    let fabric = VerbsFabric::new().map_err(|e| e.to_string())?;
    let devices = fabric.devices().map_err(|e| e.to_string())?;
    Ok(devices
        .iter()
        .filter_map(|d| {
            let ip = device_ip(&d.name).ok()?;
            Some(Device {
                ip: Some(ip),
                ..Device::of(&d.name, &d.caps)
            })
        })
        .collect())
}

#[cfg(not(feature = "verbs"))]
fn verbs() -> Result<Vec<Device>, String> {
    Err("this provider was built without verbs (only XRCBTL_OFI_FABRIC=sim)".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_variable_names_a_fabric_or_is_refused() {
        assert_eq!(which(None), Ok(Which::Verbs));
        assert_eq!(which(Some("verbs")), Ok(Which::Verbs));
        assert_eq!(which(Some("sim")), Ok(Which::Sim));
        assert_eq!(which(Some("sim-iwarp")), Ok(Which::SimIwarp));
        assert!(which(Some("simulated"))
            .unwrap_err()
            .contains("not verbs, sim or sim-iwarp"));
    }

    #[test]
    fn the_simulated_fabric_offers_one_device_with_atomics() {
        let devices = list(Which::Sim).unwrap();
        assert_eq!(devices.len(), 1);
        assert_eq!(devices[0].name, "sim0");
        assert!(devices[0].atomics);
        assert!(devices[0].max_msg_size >= 1 << 30);
        let iwarp = list(Which::SimIwarp).unwrap();
        assert_eq!(iwarp[0].name, "siw0");
        assert!(!iwarp[0].atomics);
    }
}
