//! A host's configuration, as each end reports it over the control channel (`sonde conf`, and
//! embedded in every result): what a reader needs to judge whether two runs are comparable.
//!
//! Every figure is an `Option`: `None` (JSON `null`) means the host could not say, never zero or
//! an empty string. Every struct takes `#[serde(default)]`, so a peer that knows fewer fields
//! still decodes (the missing ones are `None`), and unknown fields are ignored.
//!
//! The result documents embed these structs as they are (`hosts.client`, `hosts.server`), so
//! with the `schema` feature they also derive `schemars::JsonSchema` for the result schema.
//!
//! ```
//! use sonde_wire::HostInfo;
//!
//! let info = HostInfo { memory_bytes: Some(16 << 30), ..HostInfo::default() };
//! let json = serde_json::to_string(&info).unwrap();
//! assert!(json.contains(r#""memory_bytes":17179869184"#));
//! assert!(json.contains(r#""cpu_model":null"#));
//! // An older peer that sent only some fields still decodes.
//! let back: HostInfo = serde_json::from_str(r#"{"host_name":"b"}"#).unwrap();
//! assert_eq!(back.host_name.as_deref(), Some("b"));
//! ```

use serde::{Deserialize, Serialize};

/// One host's configuration.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default)]
pub struct HostInfo {
    /// The sonde build that collected this (`0.1.0`).
    pub sonde_version: Option<String>,
    /// The host's name (not necessarily resolvable).
    pub host_name: Option<String>,
    /// The CPU model as the OS names it (`AMD EPYC 7763 64-Core Processor`).
    pub cpu_model: Option<String>,
    /// Logical CPUs online on the host.
    pub cpu_logical_count: Option<u32>,
    /// Logical CPUs this process may run on (affinity and cgroup quota applied): fewer than
    /// `cpu_logical_count` in a container or under `taskset`.
    pub cpu_available_count: Option<u32>,
    /// Physical memory.
    pub memory_bytes: Option<u64>,
    /// The OS distribution (`Debian GNU/Linux 12 (bookworm)`).
    pub os_name: Option<String>,
    /// The distribution's version (`12`).
    pub os_version: Option<String>,
    /// The kernel's name (`Linux`).
    pub kernel_name: Option<String>,
    /// The kernel's release, as `uname -r` (`6.1.0-18-amd64`).
    pub kernel_release: Option<String>,
    /// The architecture this sonde was built for (`x86_64`, `aarch64`).
    pub architecture: Option<String>,
    /// The network interfaces asked about, or all that are up (loopback left out).
    pub interfaces: Vec<NicInfo>,
    /// TCP congestion control for new connections (`cubic`).
    pub tcp_congestion_control: Option<String>,
    /// TCP congestion control algorithms the kernel has loaded.
    pub tcp_congestion_control_available: Option<Vec<String>>,
    /// Socket buffer limits.
    pub socket_buffers: SocketBufferLimits,
}

/// One network interface.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default)]
pub struct NicInfo {
    /// The interface's name (`eth0`).
    pub name: String,
    /// The driver (`ixgbe`, `virtio_net`, `veth`).
    pub driver: Option<String>,
    /// Link speed; `None` where the link does not report one (virtual devices, link down).
    pub speed_mbit_per_second: Option<u64>,
    /// The MTU.
    pub mtu_bytes: Option<u32>,
    /// Whether the interface is administratively up.
    pub up: Option<bool>,
    /// Offloads switched on.
    pub offloads: NicOffloads,
}

/// Whether each offload is on (`Some(true)`), off (`Some(false)`) or could not be read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default)]
pub struct NicOffloads {
    /// Generic segmentation offload.
    pub gso: Option<bool>,
    /// Generic receive offload.
    pub gro: Option<bool>,
    /// TCP segmentation offload.
    pub tso: Option<bool>,
    /// Large receive offload.
    pub lro: Option<bool>,
    /// Receive checksum offload.
    pub rx_checksum: Option<bool>,
    /// Transmit checksum offload.
    pub tx_checksum: Option<bool>,
}

/// The kernel's socket buffer limits (Linux `sysctl` names in the docs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(default)]
pub struct SocketBufferLimits {
    /// `net.core.rmem_max`: the largest receive buffer `SO_RCVBUF` may ask for.
    pub rmem_max_bytes: Option<u64>,
    /// `net.core.wmem_max`: the largest send buffer `SO_SNDBUF` may ask for.
    pub wmem_max_bytes: Option<u64>,
    /// `net.core.rmem_default`: a UDP socket's receive buffer unless set.
    pub rmem_default_bytes: Option<u64>,
    /// `net.core.wmem_default`: a UDP socket's send buffer unless set.
    pub wmem_default_bytes: Option<u64>,
    /// `net.ipv4.tcp_rmem`: TCP receive buffer min, default and autotuning max.
    pub tcp_rmem_bytes: Option<MinDefaultMax>,
    /// `net.ipv4.tcp_wmem`: TCP send buffer min, default and autotuning max.
    pub tcp_wmem_bytes: Option<MinDefaultMax>,
    /// `net.ipv4.udp_mem`: UDP memory thresholds for all sockets together, in pages (low,
    /// pressure, high), as the kernel counts them.
    pub udp_mem_pages: Option<MinDefaultMax>,
}

/// A `sysctl` triple such as `net.ipv4.tcp_rmem` (`4096 131072 6291456`); the unit is in the
/// name of the field that holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct MinDefaultMax {
    /// The first value (the minimum; for `udp_mem`, the low threshold).
    pub min: u64,
    /// The second value (the default; for `udp_mem`, the pressure threshold).
    pub default: u64,
    /// The third value (the maximum; for `udp_mem`, the high threshold).
    pub max: u64,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> HostInfo {
        HostInfo {
            sonde_version: Some("0.1.0".into()),
            host_name: Some("a".into()),
            cpu_model: Some("AMD EPYC".into()),
            cpu_logical_count: Some(2),
            cpu_available_count: Some(2),
            memory_bytes: Some(8 << 30),
            os_name: Some("Debian GNU/Linux 12 (bookworm)".into()),
            os_version: Some("12".into()),
            kernel_name: Some("Linux".into()),
            kernel_release: Some("6.1.0".into()),
            architecture: Some("x86_64".into()),
            interfaces: vec![NicInfo {
                name: "eth0".into(),
                driver: Some("virtio_net".into()),
                speed_mbit_per_second: None,
                mtu_bytes: Some(1500),
                up: Some(true),
                offloads: NicOffloads {
                    gso: Some(true),
                    lro: Some(false),
                    ..NicOffloads::default()
                },
            }],
            tcp_congestion_control: Some("cubic".into()),
            tcp_congestion_control_available: Some(vec!["reno".into(), "cubic".into()]),
            socket_buffers: SocketBufferLimits {
                rmem_max_bytes: Some(212_992),
                tcp_rmem_bytes: Some(MinDefaultMax {
                    min: 4096,
                    default: 131_072,
                    max: 6_291_456,
                }),
                ..SocketBufferLimits::default()
            },
        }
    }

    #[test]
    fn round_trips_through_json() {
        let info = sample();
        let json = serde_json::to_string(&info).unwrap();
        assert_eq!(serde_json::from_str::<HostInfo>(&json).unwrap(), info);
    }

    #[test]
    fn field_names_carry_units_and_unknown_is_null() {
        let v = serde_json::to_value(sample()).unwrap();
        assert_eq!(v["memory_bytes"], 8u64 << 30);
        assert_eq!(v["interfaces"][0]["mtu_bytes"], 1500);
        assert!(v["interfaces"][0]["speed_mbit_per_second"].is_null());
        assert_eq!(v["interfaces"][0]["offloads"]["gso"], true);
        assert_eq!(v["interfaces"][0]["offloads"]["lro"], false);
        assert!(v["interfaces"][0]["offloads"]["tso"].is_null());
        assert_eq!(v["socket_buffers"]["tcp_rmem_bytes"]["max"], 6_291_456);
        assert!(v["socket_buffers"]["udp_mem_pages"].is_null());
        // Nothing known is null everywhere, not 0 or "".
        let empty = serde_json::to_value(HostInfo::default()).unwrap();
        for (key, value) in empty.as_object().unwrap() {
            match key.as_str() {
                "interfaces" => assert_eq!(value, &serde_json::json!([])),
                "socket_buffers" => {
                    assert!(value
                        .as_object()
                        .unwrap()
                        .values()
                        .all(serde_json::Value::is_null));
                }
                _ => assert!(value.is_null(), "{key} = {value}"),
            }
        }
    }

    #[test]
    fn missing_and_unknown_fields_decode() {
        let info: HostInfo = serde_json::from_str(
            r#"{"cpu_logical_count":4,"interfaces":[{"name":"eth1","mtu_bytes":9000}],
                "socket_buffers":{"wmem_max_bytes":1},"some_future_field":[1,2]}"#,
        )
        .unwrap();
        assert_eq!(info.cpu_logical_count, Some(4));
        assert_eq!(info.interfaces[0].mtu_bytes, Some(9000));
        assert_eq!(info.interfaces[0].driver, None);
        assert_eq!(info.interfaces[0].offloads, NicOffloads::default());
        assert_eq!(info.socket_buffers.wmem_max_bytes, Some(1));
        assert_eq!(info.host_name, None);
    }

    #[test]
    fn wrong_types_are_errors_not_panics() {
        assert!(serde_json::from_str::<HostInfo>(r#"{"memory_bytes":-1}"#).is_err());
        assert!(serde_json::from_str::<HostInfo>(r#"{"interfaces":{}}"#).is_err());
        assert!(serde_json::from_str::<HostInfo>("7").is_err());
    }
}

/// What one network interface counted while a test ran, at one end: the differences of the
/// kernel's counters (`/sys/class/net/IF/statistics` on Linux) between the test's start and
/// its end. They count the whole interface, the test's packets and any other traffic it
/// carried meanwhile; what the interface dropped never reached a socket, so a receiver's count
/// cannot show it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
pub struct InterfaceDelta {
    /// The interface (`eth0`, `lo`), the one the route to the other end takes.
    pub name: String,
    /// Its kernel driver as ethtool names it (`ena`, `gve`, `mana`, `hv_netvsc`, `virtio_net`,
    /// `veth`): which of the `driver` statistics mean a cloud limit or a drop depends on it.
    /// Absent where there is none (`lo`) and from an agent older than the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub driver_name: Option<String>,
    /// Between the two readings, ns.
    pub duration_ns: u64,
    /// Packets received (`rx_packets`).
    pub rx_packets: u64,
    /// Packets sent (`tx_packets`).
    pub tx_packets: u64,
    /// Bytes received, link-layer headers included (`rx_bytes`).
    pub rx_bytes: u64,
    /// Bytes sent (`tx_bytes`).
    pub tx_bytes: u64,
    /// Received packets the kernel dropped before any socket saw them (`rx_dropped`: no
    /// buffer, a full backlog, ...).
    pub rx_dropped: u64,
    /// Packets dropped on the way out (`tx_dropped`).
    pub tx_dropped: u64,
    /// Receive errors the driver reported (`rx_errors`: CRC, frame, FIFO overruns, missed).
    pub rx_errors: u64,
    /// Transmit errors (`tx_errors`).
    pub tx_errors: u64,
    /// The driver's own statistics (what `ethtool -S` prints), each as its value at the end
    /// less its value at the start, every one the driver has (a gauge among them, such as
    /// veth's `peer_ifindex`, differs by 0). Empty where the driver has none or they cannot be
    /// read (`lo`, not Linux).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub driver: std::collections::BTreeMap<String, u64>,
}
