//! Whether a UDP sender may hand the kernel GSO batches (`UDP_SEGMENT`) on the path to a peer.
//!
//! A GSO batch is one socket buffer carrying up to 64 datagrams. A physical NIC puts each
//! datagram on the wire as its own packet: it segments the batch in hardware
//! (`tx-udp-segmentation`), or the kernel segments it in software before the driver sees it. A
//! virtual device does not: a veth hands the whole batch to its peer as one packet, a bridge
//! forwards it as one, a tun device gives it to its reader as one, and loopback delivers it as
//! one; only the receiving socket cuts it up. Every datagram still arrives and is counted, but
//! the interfaces on the way (and `sar -n DEV`, and any per-packet limit of a virtual path)
//! saw one packet per batch. For a packet rate that means packets, [`choose`] turns GSO off
//! where the route to the peer leaves by a virtual device.
//!
//! The interface is the one that holds the source address the kernel picks for the peer
//! ([`hostinfo::interface_for_peer`]). Where that is not the device the route leaves by (a
//! source address on `lo`), or the virtual device is stacked on a NIC (VLAN, bond, macvlan),
//! GSO is turned off though a NIC would segment: the error is toward counting packets, never
//! away from it. A NIC without UDP segmentation offload keeps GSO: the kernel segments the
//! batch in software before the driver.
//!
//! Windows has the same offload under another name, USO (`UDP_SEND_MSG_SIZE`, Windows 10 2004
//! and later): `--gso on` sends USO batches there, and where the stack refuses them (an older
//! Windows, wine) the sender falls back to one datagram per send and says so in its method.
//! `--gso auto` cannot tell a physical device from a virtual one there (no sysfs; sonde does
//! not ask NDIS yet), so it stays off toward any peer, with [`GsoReason::DeviceKindUnknown`].
//!
//! ```
//! use sonde_net::gso::{self, GsoMode};
//!
//! let choice = gso::choose(GsoMode::Auto, "127.0.0.1".parse().unwrap());
//! // Loopback is a virtual device: a batch would cross it as one packet.
//! assert!(!choice.enabled);
//! ```

use std::fmt;
use std::net::IpAddr;
use std::path::Path;

use crate::hostinfo;

/// What the user asked for (`--gso`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum GsoMode {
    /// GSO only where the route to the peer leaves by a device that segments before the wire.
    #[default]
    Auto,
    /// GSO batches wherever the kernel takes them.
    On,
    /// One datagram per packet (`sendmmsg` batches of single datagrams).
    Off,
}

impl GsoMode {
    /// `auto`, `on` or `off`.
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::On => "on",
            Self::Off => "off",
        }
    }
}

/// Why GSO is on or off.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum GsoReason {
    /// `--gso on` or `--gso off`.
    Requested,
    /// The route leaves by the loopback device: virtual, nothing segments a batch.
    Loopback,
    /// The route leaves by a virtual device (no device behind it in sysfs), which passes a batch
    /// on as one packet. `driver` is what ethtool names (`veth`, `bridge`, `tun`...).
    VirtualDevice {
        /// The device's driver, where ethtool says.
        driver: Option<String>,
    },
    /// The route leaves by a physical device (or what the guest sees as one): it segments each
    /// batch into one packet per datagram, in hardware or in the kernel before the driver.
    PhysicalDevice,
    /// The interface toward the peer could not be found: GSO stays off, to count packets.
    UnknownRoute,
    /// This platform has no UDP GSO.
    Unsupported,
    /// This platform has UDP send offload (Windows: USO) but sonde cannot tell here whether
    /// the device toward the peer is physical: off unless `--gso on`.
    DeviceKindUnknown,
}

/// The decision for one test.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GsoChoice {
    /// What was asked.
    pub mode: GsoMode,
    /// Whether the sender may use GSO batches.
    pub enabled: bool,
    /// The interface the route to the peer leaves by, where found.
    pub interface: Option<String>,
    /// Why.
    pub reason: GsoReason,
}

impl GsoReason {
    /// A stable snake_case name, for documents.
    pub fn code(&self) -> &'static str {
        match self {
            Self::Requested => "requested",
            Self::Loopback => "loopback",
            Self::VirtualDevice { .. } => "virtual_device",
            Self::PhysicalDevice => "physical_device",
            Self::UnknownRoute => "unknown_route",
            Self::Unsupported => "unsupported",
            Self::DeviceKindUnknown => "device_kind_unknown",
        }
    }
}

impl fmt::Display for GsoChoice {
    /// Why, in words, for the reader of a result.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let dev = self.interface.as_deref().unwrap_or("?");
        match &self.reason {
            GsoReason::Requested => write!(f, "--gso {} asked for it", self.mode.name()),
            GsoReason::Loopback => write!(
                f,
                "{dev} is loopback, a virtual device: a GSO batch would cross it as one packet"
            ),
            GsoReason::VirtualDevice { driver } => write!(
                f,
                "{dev} is a virtual device{}: a GSO batch would cross it as one packet",
                driver
                    .as_deref()
                    .map(|d| format!(" ({d})"))
                    .unwrap_or_default()
            ),
            GsoReason::PhysicalDevice => write!(
                f,
                "{dev} is a physical device: it sends each datagram of a GSO batch as its own packet"
            ),
            GsoReason::UnknownRoute => write!(
                f,
                "the interface toward the peer is unknown: one datagram per packet to be sure"
            ),
            GsoReason::Unsupported => write!(f, "this platform has no UDP GSO"),
            GsoReason::DeviceKindUnknown => write!(
                f,
                "sonde cannot tell a physical device from a virtual one on this platform: one \
                 datagram per packet to be sure (--gso on sends {OFFLOAD_NAME} batches)"
            ),
        }
    }
}

/// True where the sender can hand the stack batches to segment: Linux (`UDP_SEGMENT`) and
/// Windows (USO, `UDP_SEND_MSG_SIZE`; refused by Windows before 10 2004, and by wine).
pub const OFFLOAD_PLATFORM: bool = cfg!(any(target_os = "linux", windows));

/// The offload's name on this platform, for the reader.
const OFFLOAD_NAME: &str = if cfg!(windows) { "USO" } else { "GSO" };

/// Decides whether a sender to `peer` may use GSO batches. `On` and `Off` are taken as asked
/// (`On` only where the platform has the offload, [`OFFLOAD_PLATFORM`]); `Auto` looks up the
/// interface the route to `peer` leaves by ([`hostinfo::interface_for_peer`]) and allows GSO
/// only on a physical device, which only Linux can tell.
pub fn choose(mode: GsoMode, peer: IpAddr) -> GsoChoice {
    let interface = hostinfo::interface_for_peer(peer).ok().flatten();
    // A peer that is one of this host's own addresses is reached over loopback, whatever
    // interface holds the address.
    let local = is_local(peer);
    let interface = if local {
        Some(loopback_name())
    } else {
        interface
    };
    let (enabled, reason) = match mode {
        // Off is the user's word on every platform; sending batches needs Linux or Windows.
        GsoMode::Off => (false, GsoReason::Requested),
        _ if !OFFLOAD_PLATFORM => (false, GsoReason::Unsupported),
        GsoMode::On => (true, GsoReason::Requested),
        GsoMode::Auto if local => (false, GsoReason::Loopback),
        // Only Linux has the sysfs that tells a physical device from a virtual one.
        GsoMode::Auto if !cfg!(target_os = "linux") => (false, GsoReason::DeviceKindUnknown),
        GsoMode::Auto => match interface.as_deref() {
            None => (false, GsoReason::UnknownRoute),
            Some(dev) => match hostinfo::device_kind(dev) {
                hostinfo::DeviceKind::Loopback => (false, GsoReason::Loopback),
                hostinfo::DeviceKind::Virtual => (
                    false,
                    GsoReason::VirtualDevice {
                        driver: crate::sys::nic_driver(dev),
                    },
                ),
                hostinfo::DeviceKind::Physical => (true, GsoReason::PhysicalDevice),
                hostinfo::DeviceKind::Unknown => (false, GsoReason::UnknownRoute),
            },
        },
    };
    GsoChoice {
        mode,
        enabled,
        interface,
        reason,
    }
}

/// True when `peer` is reached over loopback: a loopback address, or one of this host's own.
fn is_local(peer: IpAddr) -> bool {
    let peer = peer.to_canonical();
    peer.is_loopback()
        || crate::sys::interface_addresses()
            .is_ok_and(|addrs| addrs.iter().any(|(_, a)| a.to_canonical() == peer))
}

/// The loopback device's name (`lo` on Linux).
fn loopback_name() -> String {
    let named_lo = Path::new("/sys/class/net/lo").exists();
    if named_lo || cfg!(target_os = "linux") {
        "lo".to_owned()
    } else {
        "loopback".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn on_and_off_are_taken_as_asked() {
        let lo: IpAddr = "127.0.0.1".parse().unwrap();
        let off = choose(GsoMode::Off, lo);
        assert!(!off.enabled);
        assert_eq!(off.reason, GsoReason::Requested);
        let on = choose(GsoMode::On, lo);
        assert_eq!(on.enabled, cfg!(any(target_os = "linux", windows)));
        assert_eq!(on.enabled, OFFLOAD_PLATFORM);
        if on.enabled {
            assert_eq!(on.reason, GsoReason::Requested);
            assert!(on.to_string().contains("--gso on"), "{on}");
        } else {
            assert_eq!(on.reason, GsoReason::Unsupported);
        }
    }

    /// Windows: auto stays off over loopback (a virtual device there too) and toward any other
    /// peer, saying that it cannot tell the device's kind; `--gso on` is the way to USO.
    #[cfg(windows)]
    #[test]
    fn auto_on_windows_is_off_and_says_why() {
        let lo = choose(GsoMode::Auto, "127.0.0.1".parse().unwrap());
        assert!(!lo.enabled);
        assert_eq!(lo.reason, GsoReason::Loopback);
        // An address of the benchmarking range (RFC 2544): a route lookup only, nothing sent.
        let far = choose(GsoMode::Auto, "198.18.0.1".parse().unwrap());
        assert!(!far.enabled);
        assert_eq!(far.reason, GsoReason::DeviceKindUnknown);
        assert!(far.to_string().contains("--gso on sends USO"), "{far}");
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn auto_sends_without_gso_over_loopback() {
        for peer in ["127.0.0.1", "::1"] {
            let choice = choose(GsoMode::Auto, peer.parse().unwrap());
            assert!(!choice.enabled, "{peer}: {choice}");
            assert_eq!(choice.reason, GsoReason::Loopback, "{peer}");
            assert_eq!(choice.interface.as_deref(), Some("lo"));
            assert!(choice.to_string().contains("lo is loopback"), "{choice}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn auto_treats_this_hosts_own_addresses_as_loopback() {
        let own = crate::sys::interface_addresses()
            .unwrap()
            .into_iter()
            .find(|(name, a)| name != "lo" && a.is_ipv4());
        let Some((name, addr)) = own else {
            eprintln!("no non-loopback IPv4 address on this host: skipped");
            return;
        };
        let choice = choose(GsoMode::Auto, addr);
        assert_eq!(choice.reason, GsoReason::Loopback, "{addr} on {name}");
        assert!(!choice.enabled);
    }

    #[test]
    fn reasons_have_stable_codes_and_say_which_device() {
        let choice = GsoChoice {
            mode: GsoMode::Auto,
            enabled: false,
            interface: Some("veth-a".into()),
            reason: GsoReason::VirtualDevice {
                driver: Some("veth".into()),
            },
        };
        assert_eq!(choice.reason.code(), "virtual_device");
        assert_eq!(
            choice.to_string(),
            "veth-a is a virtual device (veth): a GSO batch would cross it as one packet"
        );
    }
}
