//! Both ends' context: their configuration, CPU cost, tuning, `TCP_INFO` and `--from` helpers.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sonde_wire::HostInfo;

use super::stats::RttNs;

/// Both ends' configuration. `null` for an end that cannot say: a peer that is not a sonde
/// agent (a real iperf3 or sockperf server), or an older agent.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Hosts {
    /// This host (the client), for the interface toward the server.
    pub client: Option<HostInfo>,
    /// The server (the agent), for the interface toward this client, as it reported itself.
    pub server: Option<HostInfo>,
}

/// What the test cost each end in CPU. `null` for an end that cannot say (a peer that is not
/// a sonde agent, an older agent, a platform without `getrusage`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CpuCosts {
    /// This host (the client).
    pub client: Option<CpuCost>,
    /// The server (the agent).
    pub server: Option<CpuCost>,
}

/// Whose CPU a [`CpuCost`] counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum CpuScope {
    /// The threads that ran this test only (`RUSAGE_THREAD`, summed): other tests running in
    /// the same process (other clients of the agent, `sonde quick`'s agent) are not included.
    #[default]
    TestThreads,
    /// The whole process (`RUSAGE_SELF`).
    Process,
}

/// One end's CPU cost of a test (netperf's "service demand", latte's CPU columns): user and
/// system time, context switches, and the system calls its data path made.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct CpuCost {
    /// Whose CPU is counted.
    pub scope: CpuScope,
    /// Wall-clock time the figures were counted over, ns (this end's part of the test: its
    /// threads' start to the report).
    pub wall_ns: u64,
    /// CPU time in user mode, ns.
    pub user_ns: u64,
    /// CPU time in the kernel (system calls, and the network stack's work done in them), ns.
    pub system_ns: u64,
    /// User plus system time as a percentage of one core over `wall_ns` (100 = one core busy
    /// the whole time; several busy threads pass 100). `null` when no wall time passed.
    pub percent_of_one_core: Option<f64>,
    /// User time as a percentage of one core.
    pub user_percent_of_one_core: Option<f64>,
    /// System time as a percentage of one core.
    pub system_percent_of_one_core: Option<f64>,
    /// Times the counted threads gave up the CPU to wait (a blocking read, a sleep). `null`
    /// where the platform does not count them per thread (Windows), with a warning.
    pub voluntary_context_switches: Option<u64>,
    /// Times they were preempted; `null` as `voluntary_context_switches`.
    pub involuntary_context_switches: Option<u64>,
    /// System calls the data path made to send and receive (failed and timed-out ones
    /// included; not sleeps), latency's ping loops and echoes too. `null` where they are not
    /// counted (an older sonde agent).
    pub syscalls: Option<u64>,
    /// Messages this end's data path moved: datagrams (UDP), messages (latency), or for TCP
    /// bulk the bytes over the write size.
    pub messages: Option<u64>,
    /// Payload bytes this end's data path moved.
    pub bytes: Option<u64>,
    /// `syscalls / messages`: about 1 for one write per TCP message, 1/64 for full UDP GSO or
    /// `recvmmsg` batches. `null` when either is unknown or no message moved.
    pub syscalls_per_message: Option<f64>,
    /// `syscalls / bytes`.
    pub syscalls_per_byte: Option<f64>,
    /// Context switches of the counted threads (voluntary and involuntary) per second of
    /// `wall_ns`; `null` with them. Absent from older documents.
    #[serde(default)]
    pub context_switches_per_second: Option<f64>,
    /// The data path's system calls (`syscalls`) per second of `wall_ns`: this test's sends
    /// and receives, not every call the process made; `null` with `syscalls`.
    #[serde(default)]
    pub syscalls_per_second: Option<f64>,
    /// Interrupts per second of the whole host, every CPU and every process, over `wall_ns`
    /// (latte's column; Linux `/proc/stat` `intr`, Windows `\Processor(_Total)\Interrupts/sec`).
    /// System-wide: other work on the host counts too. `null` where not counted (no `/proc`,
    /// a Windows without the counter, wine).
    #[serde(default)]
    pub system_interrupts_per_second: Option<f64>,
    /// Context switches per second of the whole host over `wall_ns` (Linux `/proc/stat`
    /// `ctxt`, Windows `\System\Context Switches/sec`). System-wide; `null` where not counted.
    #[serde(default)]
    pub system_context_switches_per_second: Option<f64>,
    /// System calls per second of the whole host over `wall_ns` (Windows
    /// `\System\System Calls/sec`). System-wide. Always `null` from Linux, which keeps no
    /// host-wide count of system calls (it would take tracing); `null` too under wine.
    #[serde(default)]
    pub system_syscalls_per_second: Option<f64>,
    /// The whole host's time in software interrupts over `wall_ns`, as a percentage of one
    /// core (Linux `/proc/stat` `softirq`): where the kernel's network receive path runs,
    /// outside any process, so neither end's process CPU shows it. System-wide; `null` where
    /// not counted. Absent from older documents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_softirq_percent: Option<f64>,
}

/// A TCP connection's state as its sender's kernel saw it (`TCP_INFO`, `tcp(7)`). Each figure
/// is `null` when that kernel did not fill it (older kernels have fewer), never 0 in its place.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct TcpInfo {
    /// Smoothed RTT (`tcpi_rtt`), ns.
    pub srtt_ns: Option<u64>,
    /// RTT mean deviation (`tcpi_rttvar`), ns.
    pub rttvar_ns: Option<u64>,
    /// Smallest RTT seen (`tcpi_min_rtt`), ns.
    pub min_rtt_ns: Option<u64>,
    /// Congestion window (`tcpi_snd_cwnd`), segments.
    pub cwnd_segments: Option<u32>,
    /// Slow-start threshold (`tcpi_snd_ssthresh`), segments; also `null` while the connection
    /// is still in its first slow start.
    pub ssthresh_segments: Option<u32>,
    /// The sender's MSS (`tcpi_snd_mss`), bytes.
    pub mss_bytes: Option<u32>,
    /// Segments retransmitted since the connection opened (`tcpi_total_retrans`).
    pub retransmits: Option<u64>,
    /// Segments sent and not yet acknowledged (`tcpi_unacked`).
    pub unacked_segments: Option<u32>,
    /// Pacing rate (`tcpi_pacing_rate`); `null` too when unlimited.
    pub pacing_rate_bits_per_second: Option<u64>,
    /// Latest delivery rate (`tcpi_delivery_rate`).
    pub delivery_rate_bits_per_second: Option<u64>,
    /// Whether that delivery rate was limited by the application, not the network.
    pub delivery_rate_app_limited: Option<bool>,
    /// Bytes written by the application and not yet sent (`tcpi_notsent_bytes`).
    pub notsent_bytes: Option<u32>,
    /// Time the connection had data to send (`tcpi_busy_time`), ns.
    pub busy_ns: Option<u64>,
    /// Of that, time limited by the receiver's window (`tcpi_rwnd_limited`), ns.
    pub rwnd_limited_ns: Option<u64>,
    /// Of that, time limited by the sender's buffer (`tcpi_sndbuf_limited`), ns.
    pub sndbuf_limited_ns: Option<u64>,
    /// Segments the receiver acknowledged as having arrived CE-marked (`tcpi_delivered_ce`):
    /// congestion routers signalled to the connection (TCP with ECN negotiated,
    /// `net.ipv4.tcp_ecn`). Absent where the sender's kernel did not say (before 4.18).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub delivered_ce_segments: Option<u32>,
}

/// One stream's [`TcpInfo`] at the end of an interval.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct StreamTcpInfo {
    /// Stream index.
    pub stream: u32,
    /// The sender's `TCP_INFO`.
    #[serde(flatten)]
    pub tcp_info: TcpInfo,
}

/// `--busy-poll`, `--cpu`: both ends' way of waiting and the CPUs they ran on, as each reported
/// it (latency; throughput and pps have `--cpu` only).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EndsTuning {
    /// This end: busy-polled, `SO_BUSY_POLL`, the CPUs its loops ran on.
    pub client: sonde_wire::TuningReport,
    /// The agent's end (its echo, or its streams); `null` from an agent older than the option,
    /// which ran unpinned and blocked in `recv` as always (with a warning).
    pub server: Option<sonde_wire::TuningReport>,
}

/// Which figures a `--from` helper's share has: its test's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShareFigures {
    /// A pps test's: datagrams sent and received.
    Pps,
    /// A throughput test's: bytes and rate.
    Throughput,
    /// A latency test's: RTTs.
    Latency,
}

/// `--from`: a test several helper agents ran against one target at once, started together at
/// a common time (each helper's clock offset to this host estimated NTP-style over its control
/// connection).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct Helpers {
    /// The latest helper's start minus the earliest's, ns, on this host's clock (each helper
    /// reports when its data started, converted with its clock's offset).
    pub start_spread_ns: u64,
    /// The largest uncertainty of those offsets, ns: the spread is known within about this.
    pub offset_uncertainty_ns: u64,
    /// From the earliest start to the latest end of the target's receiving (pps, throughput) or
    /// of the helpers' measuring (latency), ns: what the aggregate rates are per.
    pub window_ns: u64,
    /// Each helper's share, in the order of `--from`.
    pub shares: Vec<HelperShare>,
}

/// One helper's part of a `--from` test, from its own result (counted at the target where the
/// test counts there).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
pub struct HelperShare {
    /// The helper as given to `--from`, resolved.
    pub helper: String,
    /// The target's session id for this helper's test.
    pub session: u64,
    /// When its data started, ns after the earliest helper's.
    pub start_offset_ns: u64,
    /// pps: datagrams sent; throughput: sender bytes. `null` for latency.
    pub sent: Option<u64>,
    /// pps: datagrams the target received from it; throughput: bytes. `null` for latency.
    pub received: Option<u64>,
    /// pps, UDP throughput: sent and never received; `null` for TCP and latency.
    pub lost: Option<u64>,
    /// pps: received per second over the target's receiving time for it.
    pub received_pps: Option<f64>,
    /// throughput: received bits per second over the target's receiving time for it.
    pub bits_per_second: Option<f64>,
    /// latency: its round-trip times to the target while the others ran.
    pub rtt_ns: Option<RttNs>,
}

impl CpuCost {
    /// One end's cost from its raw counts (as a sonde agent reports them in its `Report`), with
    /// the percentages and per-message figures worked out; those are `null` where a divisor is
    /// 0 or unknown.
    pub fn from_report(scope: CpuScope, r: &sonde_wire::CpuReport) -> Self {
        let of_wall = |ns: u64| (r.wall_ns > 0).then(|| ns as f64 * 100.0 / r.wall_ns as f64);
        let per = |n: Option<u64>, d: Option<u64>| match (n, d) {
            (Some(n), Some(d)) if d > 0 => Some(n as f64 / d as f64),
            _ => None,
        };
        let per_second =
            |n: Option<u64>| per(n, Some(r.wall_ns)).map(|per_ns| per_ns * 1_000_000_000.0);
        Self {
            scope,
            wall_ns: r.wall_ns,
            user_ns: r.user_ns,
            system_ns: r.system_ns,
            percent_of_one_core: of_wall(r.user_ns.saturating_add(r.system_ns)),
            user_percent_of_one_core: of_wall(r.user_ns),
            system_percent_of_one_core: of_wall(r.system_ns),
            voluntary_context_switches: r.voluntary_switches,
            involuntary_context_switches: r.involuntary_switches,
            syscalls: r.syscalls,
            messages: r.messages,
            bytes: r.bytes,
            syscalls_per_message: per(r.syscalls, r.messages),
            syscalls_per_byte: per(r.syscalls, r.bytes),
            context_switches_per_second: per_second(
                r.voluntary_switches
                    .zip(r.involuntary_switches)
                    .map(|(v, i)| v.saturating_add(i)),
            ),
            syscalls_per_second: per_second(r.syscalls),
            system_interrupts_per_second: per_second(r.system_interrupts),
            system_context_switches_per_second: per_second(r.system_context_switches),
            system_syscalls_per_second: per_second(r.system_syscalls),
            system_softirq_percent: r
                .system_softirq_ns
                .filter(|_| r.wall_ns > 0)
                .map(|ns| ns as f64 * 100.0 / r.wall_ns as f64),
        }
    }
}

impl From<&sonde_wire::TcpInfoStats> for TcpInfo {
    /// The sender's sample, rates from the kernel's bytes per second to bits per second.
    fn from(t: &sonde_wire::TcpInfoStats) -> Self {
        let bits = |bytes: Option<u64>| bytes.map(|b| b.saturating_mul(8));
        Self {
            srtt_ns: t.srtt_ns,
            rttvar_ns: t.rttvar_ns,
            min_rtt_ns: t.min_rtt_ns,
            cwnd_segments: t.cwnd,
            ssthresh_segments: t.ssthresh,
            mss_bytes: t.mss,
            retransmits: t.retrans,
            unacked_segments: t.unacked,
            pacing_rate_bits_per_second: bits(t.pacing_rate),
            delivery_rate_bits_per_second: bits(t.delivery_rate),
            delivery_rate_app_limited: t.app_limited,
            notsent_bytes: t.notsent_bytes,
            busy_ns: t.busy_ns,
            rwnd_limited_ns: t.rwnd_limited_ns,
            sndbuf_limited_ns: t.sndbuf_limited_ns,
            delivered_ce_segments: t.delivered_ce,
        }
    }
}

#[cfg(test)]
mod context_tests {
    use super::*;

    #[test]
    fn cpu_figures_are_worked_out_and_unknown_where_a_divisor_is() {
        let raw = sonde_wire::CpuReport {
            wall_ns: 2_000_000_000,
            user_ns: 500_000_000,
            system_ns: 1_500_000_000,
            voluntary_switches: Some(7),
            involuntary_switches: Some(3),
            syscalls: Some(1_000),
            messages: Some(4_000),
            bytes: Some(4_000 * 18),
            system_interrupts: Some(9_000),
            system_context_switches: Some(30_000),
            system_syscalls: None,
            system_softirq_ns: None,
        };
        let c = CpuCost::from_report(CpuScope::TestThreads, &raw);
        // Over 2 s of wall time.
        assert_eq!(c.context_switches_per_second, Some(5.0));
        assert_eq!(c.syscalls_per_second, Some(500.0));
        assert_eq!(c.system_interrupts_per_second, Some(4_500.0));
        assert_eq!(c.system_context_switches_per_second, Some(15_000.0));
        assert_eq!(
            c.system_syscalls_per_second, None,
            "not counted: null, not 0"
        );
        assert_eq!(c.percent_of_one_core, Some(100.0));
        assert_eq!(c.user_percent_of_one_core, Some(25.0));
        assert_eq!(c.system_percent_of_one_core, Some(75.0));
        assert_eq!(c.syscalls_per_message, Some(0.25));
        assert_eq!(c.syscalls_per_byte, Some(1_000.0 / 72_000.0));
        assert_eq!(
            (c.voluntary_context_switches, c.involuntary_context_switches),
            (Some(7), Some(3))
        );
        // No wall time, no calls counted, nothing moved: unknown, not 0.
        let none = CpuCost::from_report(
            CpuScope::Process,
            &sonde_wire::CpuReport {
                syscalls: None,
                messages: Some(0),
                bytes: Some(0),
                ..sonde_wire::CpuReport::default()
            },
        );
        assert_eq!(none.percent_of_one_core, None);
        assert_eq!(none.syscalls_per_message, None);
        assert_eq!(none.syscalls_per_byte, None);
        assert_eq!(none.context_switches_per_second, None);
        assert_eq!(none.system_interrupts_per_second, None);
        let idle = CpuCost::from_report(
            CpuScope::Process,
            &sonde_wire::CpuReport {
                syscalls: Some(5),
                messages: Some(0),
                ..raw
            },
        );
        assert_eq!(idle.syscalls_per_message, None);
    }

    #[test]
    fn tcp_info_rates_are_in_bits_and_unknown_stays_null() {
        let t = TcpInfo::from(&sonde_wire::TcpInfoStats {
            stream: 2,
            srtt_ns: Some(40_000),
            cwnd: Some(10),
            pacing_rate: Some(125_000_000),
            delivery_rate: Some(u64::MAX),
            ..sonde_wire::TcpInfoStats::default()
        });
        assert_eq!(t.srtt_ns, Some(40_000));
        assert_eq!(t.cwnd_segments, Some(10));
        assert_eq!(t.pacing_rate_bits_per_second, Some(1_000_000_000));
        assert_eq!(t.delivery_rate_bits_per_second, Some(u64::MAX));
        assert_eq!(t.rttvar_ns, None);
        let v = serde_json::to_value(&t).unwrap();
        assert!(v["ssthresh_segments"].is_null());
        assert_eq!(v["cwnd_segments"], 10);
    }
}

/// What a driver statistic that rose says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SignalKind {
    /// The provider's limit on the instance held packets back (`cloud_limit_exceeded`).
    Allowance,
    /// The virtual NIC or its driver dropped or held back packets that the kernel's interface
    /// counters may not show (`driver_drops`).
    Dropped,
}

/// A driver statistic sonde recognises by name in an interface's `driver` statistics, and
/// what it means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CloudLimit {
    /// The statistic as `ethtool -S` names it, the first of `names`; `{q}` stands for a queue
    /// number.
    pub name: &'static str,
    /// Every form the drivers' versions give it: a name without `{q}` is the driver's total,
    /// one with `{q}` a per-queue count (summed over the queues when there is no total).
    pub names: &'static [&'static str],
    /// The kernel drivers that count it, as `ETHTOOL_GDRVINFO` names them.
    pub drivers: &'static [&'static str],
    /// The provider and driver, for people.
    pub driver: &'static str,
    /// Which warning a rise raises.
    pub kind: SignalKind,
    /// What a rise means.
    pub meaning: &'static str,
}

impl CloudLimit {
    const fn new(
        names: &'static [&'static str],
        drivers: &'static [&'static str],
        driver: &'static str,
        kind: SignalKind,
        meaning: &'static str,
    ) -> Self {
        Self {
            name: names[0],
            names,
            drivers,
            driver,
            kind,
            meaning,
        }
    }
}

const ENA: &[&str] = &["ena"];
const AWS: &str = "AWS ENA";
const GVE: &[&str] = &["gve"];
const GOOGLE: &str = "Google gVNIC (gve)";
const MANA: &[&str] = &["mana"];
const AZURE_MANA: &str = "Azure MANA";
const NETVSC: &[&str] = &["hv_netvsc"];
const AZURE_NETVSC: &str = "Azure/Hyper-V netvsc";
const VIRTIO: &[&str] = &["virtio_net"];
const VIRTIO_NET: &str = "virtio-net";

/// The driver statistics sonde recognises, from each driver's source (the `ethtool -S` names
/// its `get_strings` writes):
/// - AWS ENA (`drivers/net/ethernet/amazon/ena/ena_ethtool.c`, AWS's "Monitor network
///   performance for ENA settings on your EC2 instance"): the five allowance counters, the only
///   provider limits a guest can read by name.
/// - Google gVNIC (`drivers/net/ethernet/google/gve/gve_ethtool.c`): the per-queue counts the
///   virtual NIC reports (`rx_queue_drop_cnt[q]`, `rx_no_buffers_posted[q]`,
///   `rx_drops_packet_over_mru[q]`). Google publishes no per-VM allowance counter.
/// - Azure MANA (`drivers/net/ethernet/microsoft/mana/mana_ethtool.c`): the hardware counters
///   of discards (`hc_rx_discards_no_wqe`, `hc_rx_pkt_drop_phy`, `hc_tx_pkt_drop_phy`). Azure
///   publishes no per-VM allowance counter.
/// - Azure/Hyper-V netvsc (`drivers/net/hyperv/netvsc_drv.c`): sends held back because the ring
///   to the host was full (`tx_no_space`), receive buffers it could not allocate
///   (`rx_no_memory`).
/// - virtio-net (`drivers/net/virtio_net.c`): the device's rate-limit drops where the device
///   reports statistics (`VIRTIO_NET_F_DEVICE_STATS`, `rx{q}_hw_ratelimit_packets`, as
///   Alibaba Cloud's does), and the driver's own receive drops (`rx_queue_{q}_drops` before
///   Linux 6.10, `rx{q}_drops` since).
pub const CLOUD_LIMITS: &[CloudLimit] = &[
    CloudLimit::new(
        &["bw_in_allowance_exceeded"],
        ENA,
        AWS,
        SignalKind::Allowance,
        "packets queued or dropped because the inbound bandwidth exceeded the instance's \
         allowance",
    ),
    CloudLimit::new(
        &["bw_out_allowance_exceeded"],
        ENA,
        AWS,
        SignalKind::Allowance,
        "packets queued or dropped because the outbound bandwidth exceeded the instance's \
         allowance",
    ),
    CloudLimit::new(
        &["pps_allowance_exceeded"],
        ENA,
        AWS,
        SignalKind::Allowance,
        "packets queued or dropped because the packets per second, both ways together, \
         exceeded the instance's allowance",
    ),
    CloudLimit::new(
        &["conntrack_allowance_exceeded"],
        ENA,
        AWS,
        SignalKind::Allowance,
        "packets dropped because the instance tracked as many connections as it may: new \
         connections could not be made",
    ),
    CloudLimit::new(
        &["linklocal_allowance_exceeded"],
        ENA,
        AWS,
        SignalKind::Allowance,
        "packets dropped because the traffic to the instance's local services (DNS, the \
         metadata service, time) exceeded their packets-per-second allowance",
    ),
    CloudLimit::new(
        &["rx_queue_drop_cnt[{q}]"],
        GVE,
        GOOGLE,
        SignalKind::Dropped,
        "packets the virtual NIC dropped at a receive queue (its own count): the guest did not \
         take them in time",
    ),
    CloudLimit::new(
        &["rx_no_buffers_posted[{q}]"],
        GVE,
        GOOGLE,
        SignalKind::Dropped,
        "packets the virtual NIC dropped because the driver had no receive buffer posted: the \
         guest's receive path fell behind",
    ),
    CloudLimit::new(
        &["rx_drops_packet_over_mru[{q}]"],
        GVE,
        GOOGLE,
        SignalKind::Dropped,
        "packets the virtual NIC dropped as larger than the interface's MRU",
    ),
    CloudLimit::new(
        &["hc_rx_discards_no_wqe"],
        MANA,
        AZURE_MANA,
        SignalKind::Dropped,
        "packets the NIC discarded because no receive buffer was posted: the guest's receive \
         path fell behind",
    ),
    CloudLimit::new(
        &["hc_rx_pkt_drop_phy"],
        MANA,
        AZURE_MANA,
        SignalKind::Dropped,
        "received packets the NIC dropped at its physical port",
    ),
    CloudLimit::new(
        &["hc_tx_pkt_drop_phy"],
        MANA,
        AZURE_MANA,
        SignalKind::Dropped,
        "outgoing packets the NIC dropped at its physical port",
    ),
    CloudLimit::new(
        &["tx_no_space"],
        NETVSC,
        AZURE_NETVSC,
        SignalKind::Dropped,
        "sends held back because the ring to the Hyper-V host was full: the host did not take \
         packets as fast as the guest sent them",
    ),
    CloudLimit::new(
        &["rx_no_memory"],
        NETVSC,
        AZURE_NETVSC,
        SignalKind::Dropped,
        "received packets dropped because the driver could not allocate a buffer for them",
    ),
    CloudLimit::new(
        &[
            "rx_hw_ratelimit_packets",
            "rx{q}_hw_ratelimit_packets",
            "rx_queue_hw_{q}_ratelimit_packets",
        ],
        VIRTIO,
        VIRTIO_NET,
        SignalKind::Allowance,
        "received packets the virtual device dropped because they exceeded its rate limit (the \
         provider's limit on the instance)",
    ),
    CloudLimit::new(
        &[
            "tx_hw_ratelimit_packets",
            "tx{q}_hw_ratelimit_packets",
            "tx_queue_hw_{q}_ratelimit_packets",
        ],
        VIRTIO,
        VIRTIO_NET,
        SignalKind::Allowance,
        "outgoing packets the virtual device dropped because they exceeded its rate limit (the \
         provider's limit on the instance)",
    ),
    CloudLimit::new(
        &["rx_drops", "rx{q}_drops", "rx_queue_{q}_drops"],
        VIRTIO,
        VIRTIO_NET,
        SignalKind::Dropped,
        "received packets the driver dropped (no buffer, a bad length, an XDP program's verdict)",
    ),
];

/// Whether `stat` is `pattern` with `{q}` as a queue number (one or more digits).
fn matches_queue(pattern: &str, stat: &str) -> bool {
    match pattern.split_once("{q}") {
        None => pattern == stat,
        Some((before, after)) => stat
            .strip_prefix(before)
            .and_then(|rest| rest.strip_suffix(after))
            .is_some_and(|q| !q.is_empty() && q.bytes().all(|b| b.is_ascii_digit())),
    }
}

/// The cloud limit `name` counts, if sonde knows it (AWS ENA's names, which no other driver
/// uses).
pub fn cloud_limit(name: &str) -> Option<&'static CloudLimit> {
    CLOUD_LIMITS
        .iter()
        .find(|l| l.drivers == ENA && l.names.iter().any(|p| matches_queue(p, name)))
}

/// What a recognised statistic did over a test: the sum of its counts (the driver's total
/// where it has one, else over its queues), and over how many statistics (queues) it was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DriverSignal {
    /// The statistic.
    pub limit: &'static CloudLimit,
    /// By how much it rose.
    pub count: u64,
    /// How many of the driver's statistics it summed (1 for a total, the queues otherwise).
    pub queues: usize,
}

/// The recognised statistics of `driver_name`'s `stats` that rose. Without a driver name (an
/// agent older than the field), only AWS ENA's names, which no other driver uses.
pub fn driver_signals(
    driver_name: Option<&str>,
    stats: &std::collections::BTreeMap<String, u64>,
) -> Vec<DriverSignal> {
    let applies = |l: &CloudLimit| match driver_name {
        Some(d) => l.drivers.contains(&d),
        None => l.drivers == ENA,
    };
    let mut out = Vec::new();
    for limit in CLOUD_LIMITS.iter().filter(|l| applies(l)) {
        let (totals, queues): (Vec<&str>, Vec<&str>) =
            limit.names.iter().partition(|p| !p.contains("{q}"));
        let total = stats
            .iter()
            .find(|(name, _)| totals.contains(&name.as_str()))
            .map(|(_, &v)| (v, 1));
        let (count, n) = total.unwrap_or_else(|| {
            stats
                .iter()
                .filter(|(name, _)| queues.iter().any(|p| matches_queue(p, name)))
                .fold((0u64, 0usize), |(sum, n), (_, &v)| {
                    (sum.saturating_add(v), n + 1)
                })
        });
        if count > 0 {
            out.push(DriverSignal {
                limit,
                count,
                queues: n,
            });
        }
    }
    out
}

/// What the interface each end sent and received by counted over the test (the kernel's
/// counters of the whole interface: this test's packets and any other traffic). What an
/// interface dropped never reached a socket, so no receiver count shows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EndsInterfaces {
    /// This host's interface toward the agent; `null` where it cannot be read (not Linux).
    pub client: Option<sonde_wire::InterfaceDelta>,
    /// The agent's interface toward this host; `null` where it cannot read it, from an agent
    /// older than the field, and from peers that are not sonde agents.
    pub server: Option<sonde_wire::InterfaceDelta>,
}

/// `-w`, `-C`, `-M`, `-N`, `-S`/`--dscp`/`--ecn`, `--fq-rate`, `--dont-fragment`: the socket
/// options of the data streams as asked, and as each end's kernel applied them (read back with
/// `getsockopt` from its first stream).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct EndsSocket {
    /// As asked on the command line (`tos` is the whole byte: DSCP and ECN).
    pub asked: sonde_wire::SocketOptions,
    /// As this host's kernel applied them.
    pub client: sonde_wire::AppliedSocketOptions,
    /// As the agent's kernel applied them; `null` from an agent that predates the options (it
    /// ran its end with the kernel's defaults, with a warning), or a peer that does not say (an
    /// iperf3 server).
    pub server: Option<sonde_wire::AppliedSocketOptions>,
}

impl EndsSocket {
    /// A warning for each option an end's kernel applied otherwise than asked: a buffer below
    /// the request (Linux grants twice the request and caps it at `net.core.wmem_max` /
    /// `rmem_max`: a grant of exactly the request, as other platforms make it, or at least twice
    /// it is as asked), an MSS above the request or well below it (the path's clamped it), another
    /// congestion control, a TOS byte that is not the one asked (TCP keeps its own ECN bits),
    /// `TCP_NODELAY` or DF not set, pacing not in force. `tcp` for a TCP test.
    pub fn warnings(&self, tcp: bool, server_expected: bool) -> Vec<super::Warning> {
        let mut out = Vec::new();
        self.side_warnings("client", &self.client, tcp, &mut out);
        match &self.server {
            Some(server) => self.side_warnings("server", server, tcp, &mut out),
            None if server_expected => out.push(super::Warning::SocketOptionDiffers {
                side: "server",
                option: "socket options",
                asked: "asked of the agent".into(),
                applied: "none of them: the agent predates them and ran with its defaults".into(),
            }),
            None => {}
        }
        out
    }

    fn side_warnings(
        &self,
        side: &'static str,
        got: &sonde_wire::AppliedSocketOptions,
        tcp: bool,
        out: &mut Vec<super::Warning>,
    ) {
        let a = &self.asked;
        let mut differs = |option: &'static str, asked: String, applied: String| {
            out.push(super::Warning::SocketOptionDiffers {
                side,
                option,
                asked,
                applied,
            });
        };
        if let Some(w) = a.window_bytes {
            let w = u64::from(w);
            let short = |g: Option<u64>| g.is_some_and(|g| g != w && g < w.saturating_mul(2));
            if short(got.send_buffer_bytes) || short(got.recv_buffer_bytes) {
                differs(
                    "-w/--window",
                    format!("{w} B"),
                    format!(
                        "SO_SNDBUF {} B, SO_RCVBUF {} B (Linux grants twice the request, capped \
                         by net.core.wmem_max / rmem_max)",
                        opt(got.send_buffer_bytes),
                        opt(got.recv_buffer_bytes)
                    ),
                );
            }
        }
        if tcp {
            if let Some(c) = &a.congestion {
                if got.congestion.as_deref() != Some(c.as_str()) {
                    differs(
                        "-C/--congestion",
                        c.clone(),
                        got.congestion.clone().unwrap_or_else(|| "unknown".into()),
                    );
                }
            }
            if let Some(m) = a.mss_bytes {
                // The read-back MSS leaves out the TCP options every segment carries
                // (timestamps: 12 bytes), so up to 40 bytes below the request is as asked.
                if let Some(g) = got.mss_bytes.filter(|&g| g > m || g.saturating_add(40) < m) {
                    differs(
                        "-M/--set-mss",
                        format!("{m} B"),
                        format!("an MSS of {g} B (the peer's SYN or the path's MTU set it)"),
                    );
                }
            }
            if a.no_delay && got.no_delay == Some(false) {
                differs("-N/--no-delay", "on".into(), "TCP_NODELAY off".into());
            }
        }
        if let Some(t) = a.tos {
            let ecn = t & 0b11;
            match got.tos {
                Some(g) if g == t => {}
                // TCP: the kernel keeps the ECN bits to itself (net.ipv4.tcp_ecn).
                Some(g) if tcp && g & !0b11 == t & !0b11 && ecn != 0 => differs(
                    "--ecn",
                    format!("ECN bits {ecn}"),
                    format!(
                        "TOS {g:#04x}: TCP sets the ECN bits itself (net.ipv4.tcp_ecn = {}; 1 \
                         asks for ECN on outgoing connections, 2 only answers it)",
                        got.tcp_ecn_sysctl
                            .map_or_else(|| "unknown".into(), |e| e.to_string())
                    ),
                ),
                g => differs(
                    "-S/--tos",
                    format!("{t:#04x}"),
                    g.map_or_else(|| "none (not read back)".into(), |g| format!("{g:#04x}")),
                ),
            }
        }
        if a.dont_fragment && !tcp && got.dont_fragment != Some(true) {
            differs(
                "--dont-fragment",
                "on".into(),
                "DF not set on the datagrams".into(),
            );
        }
        if let Some(note) = &got.note {
            differs(
                "--fq-rate",
                a.pacing_bits_per_second
                    .map_or_else(String::new, |r| format!("{r} bit/s")),
                note.clone(),
            );
        }
    }
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "unknown".into(), |v| v.to_string())
}

#[cfg(test)]
mod socket_tests {
    use super::*;
    use sonde_wire::{AppliedSocketOptions, SocketOptions};

    fn asked() -> SocketOptions {
        SocketOptions {
            window_bytes: Some(1 << 20),
            congestion: Some("bbr".into()),
            mss_bytes: Some(1_200),
            no_delay: true,
            tos: Some(0xb8),
            ..SocketOptions::default()
        }
    }

    /// What Linux makes of `asked()` when it grants everything.
    fn linux() -> AppliedSocketOptions {
        AppliedSocketOptions {
            send_buffer_bytes: Some(2 << 20),
            recv_buffer_bytes: Some(2 << 20),
            congestion: Some("bbr".into()),
            mss_bytes: Some(1_188),
            no_delay: Some(true),
            tos: Some(0xb8),
            ..AppliedSocketOptions::default()
        }
    }

    fn codes(e: &EndsSocket, tcp: bool) -> Vec<(&'static str, &'static str)> {
        e.warnings(tcp, true)
            .into_iter()
            .map(|w| match w {
                super::super::Warning::SocketOptionDiffers { side, option, .. } => (side, option),
                other => panic!("{other:?}"),
            })
            .collect()
    }

    #[test]
    fn options_applied_as_asked_warn_of_nothing() {
        let e = EndsSocket {
            asked: asked(),
            client: linux(),
            server: Some(linux()),
        };
        assert!(codes(&e, true).is_empty());
        // A platform that grants exactly the request (Windows) is as asked too.
        let exact = AppliedSocketOptions {
            send_buffer_bytes: Some(1 << 20),
            recv_buffer_bytes: Some(1 << 20),
            ..linux()
        };
        let e = EndsSocket {
            server: Some(exact),
            ..e
        };
        assert!(codes(&e, true).is_empty());
    }

    #[test]
    fn each_end_that_differs_is_named_with_the_option() {
        let capped = AppliedSocketOptions {
            // rmem_max = 425,984: granted 851,968 for 1 MiB asked.
            recv_buffer_bytes: Some(851_968),
            congestion: Some("cubic".into()),
            // The path's MTU (1,280) clamped the MSS.
            mss_bytes: Some(1_028),
            no_delay: Some(false),
            tos: Some(0),
            ..linux()
        };
        let e = EndsSocket {
            asked: asked(),
            client: linux(),
            server: Some(capped),
        };
        assert_eq!(
            codes(&e, true),
            [
                ("server", "-w/--window"),
                ("server", "-C/--congestion"),
                ("server", "-M/--set-mss"),
                ("server", "-N/--no-delay"),
                ("server", "-S/--tos"),
            ]
        );
        // An agent that predates the options applied none of them.
        let old = EndsSocket { server: None, ..e };
        assert_eq!(codes(&old, true)[..], [("server", "socket options")][..]);
    }

    #[test]
    fn tcp_keeps_its_own_ecn_bits_and_says_which_sysctl() {
        let e = EndsSocket {
            asked: SocketOptions {
                tos: Some(0xb8 | 0b10),
                ..SocketOptions::default()
            },
            client: AppliedSocketOptions {
                tos: Some(0xb8),
                tcp_ecn_sysctl: Some(2),
                ..AppliedSocketOptions::default()
            },
            server: None,
        };
        let w = e.warnings(true, false);
        assert_eq!(w.len(), 1);
        let text = w[0].to_string();
        assert!(
            text.starts_with("--ecn ECN bits 2: the client's kernel"),
            "{text}"
        );
        assert!(text.contains("net.ipv4.tcp_ecn = 2"), "{text}");
    }
}

/// The recognition of each driver's statistics, against the names its `get_strings` writes
/// (what `ethtool -S` prints), taken from the driver's source in Linux as named on each case.
#[cfg(test)]
mod driver_signal_tests {
    use super::*;
    use std::collections::BTreeMap;

    /// `names` with a value each (0 unless given in `rose`).
    fn stats(names: &[&str], rose: &[(&str, u64)]) -> BTreeMap<String, u64> {
        let mut out: BTreeMap<String, u64> = names.iter().map(|n| ((*n).to_owned(), 0)).collect();
        for &(n, v) in rose {
            assert!(out.contains_key(n), "{n} is not among the driver's names");
            out.insert(n.to_owned(), v);
        }
        out
    }

    /// (statistic, count, queues) of what was recognised.
    fn seen(driver: Option<&str>, s: &BTreeMap<String, u64>) -> Vec<(&'static str, u64, usize)> {
        driver_signals(driver, s)
            .into_iter()
            .map(|d| (d.limit.name, d.count, d.queues))
            .collect()
    }

    /// `gve_gstrings_main_stats`, `gve_gstrings_rx_stats` and `gve_gstrings_tx_stats` for
    /// `queues` queues, as `gve_get_strings` formats them.
    fn gve_names(queues: u32) -> Vec<String> {
        let mut names: Vec<String> = [
            "rx_packets",
            "tx_packets",
            "rx_bytes",
            "tx_bytes",
            "rx_dropped",
            "tx_dropped",
            "tx_timeouts",
            "rx_skb_alloc_fail",
            "rx_buf_alloc_fail",
            "rx_desc_err_dropped_pkt",
        ]
        .map(str::to_owned)
        .to_vec();
        for q in 0..queues {
            for s in [
                "rx_posted_desc",
                "rx_dropped_pkt",
                "rx_queue_drop_cnt",
                "rx_no_buffers_posted",
                "rx_drops_packet_over_mru",
                "rx_drops_invalid_checksum",
            ] {
                names.push(format!("{s}[{q}]"));
            }
            for s in [
                "tx_posted_desc",
                "tx_wake",
                "tx_stop",
                "tx_dma_mapping_error",
            ] {
                names.push(format!("{s}[{q}]"));
            }
        }
        names
    }

    /// Google gVNIC: drivers/net/ethernet/google/gve/gve_ethtool.c. The NIC's per-queue drops
    /// are summed over the queues; the driver's own `rx_dropped` and `rx_dropped_pkt[q]` are
    /// not signals (the interface counters carry them).
    #[test]
    fn gve_queue_drops_are_summed_over_queues() {
        let names = gve_names(2);
        let names: Vec<&str> = names.iter().map(String::as_str).collect();
        let s = stats(
            &names,
            &[
                ("rx_queue_drop_cnt[0]", 5),
                ("rx_queue_drop_cnt[1]", 7),
                ("rx_no_buffers_posted[1]", 3),
                ("rx_dropped", 100),
                ("rx_dropped_pkt[0]", 100),
                ("tx_stop[1]", 4),
            ],
        );
        assert_eq!(
            seen(Some("gve"), &s),
            [
                ("rx_queue_drop_cnt[{q}]", 12, 2),
                ("rx_no_buffers_posted[{q}]", 3, 2)
            ]
        );
        // The same names from another driver, or from an agent that did not say which, are
        // not gVNIC's.
        assert_eq!(seen(Some("veth"), &s), []);
        assert_eq!(seen(None, &s), []);
    }

    /// Azure MANA: drivers/net/ethernet/microsoft/mana/mana_ethtool.c (`mana_eth_stats`,
    /// `mana_hc_stats`, `mana_phy_stats`, the per-queue `rx_%d_packets`...).
    #[test]
    fn mana_hardware_discards() {
        let s = stats(
            &[
                "stop_queue",
                "wake_queue",
                "tx_cq_err",
                "hc_rx_discards_no_wqe",
                "hc_rx_err_vport_disabled",
                "hc_rx_bytes",
                "hc_rx_ucast_pkts",
                "hc_rx_pkt_drop_phy",
                "hc_tx_pkt_drop_phy",
                "rx_0_packets",
                "rx_0_xdp_drop",
                "tx_0_packets",
            ],
            &[
                ("hc_rx_discards_no_wqe", 9),
                ("stop_queue", 2),
                ("rx_0_xdp_drop", 1),
            ],
        );
        assert_eq!(seen(Some("mana"), &s), [("hc_rx_discards_no_wqe", 9, 1)]);
    }

    /// Azure/Hyper-V netvsc: drivers/net/hyperv/netvsc_drv.c (`netvsc_stats`, `pcpu_stats`).
    #[test]
    fn netvsc_ring_full() {
        let s = stats(
            &[
                "tx_scattered",
                "tx_no_memory",
                "tx_no_space",
                "tx_too_big",
                "tx_busy",
                "tx_send_full",
                "rx_comp_busy",
                "rx_no_memory",
                "stop_queue",
                "wake_queue",
                "cpu0_rx_packets",
            ],
            &[
                ("tx_no_space", 4),
                ("tx_send_full", 8),
                ("cpu0_rx_packets", 70),
            ],
        );
        assert_eq!(seen(Some("hv_netvsc"), &s), [("tx_no_space", 4, 1)]);
    }

    /// virtio-net: drivers/net/virtio_net.c. Before Linux 6.10 `virtnet_get_strings` wrote
    /// `rx_queue_%u_%s`; since, `rx%u_%s` with totals `rx_%s`, and the device's statistics
    /// `rx%u_hw_%s` where it reports them (`VIRTIO_NET_F_DEVICE_STATS`).
    #[test]
    fn virtio_old_and_new_names() {
        let old = stats(
            &[
                "rx_queue_0_packets",
                "rx_queue_0_drops",
                "rx_queue_0_xdp_drops",
                "rx_queue_1_drops",
                "tx_queue_0_kicks",
                "tx_queue_0_tx_timeouts",
            ],
            &[
                ("rx_queue_0_drops", 2),
                ("rx_queue_1_drops", 1),
                ("rx_queue_0_xdp_drops", 50),
            ],
        );
        assert_eq!(seen(Some("virtio_net"), &old), [("rx_drops", 3, 2)]);
        // The totals, where the driver writes them, are taken over the queues (no double
        // count); the device's rate-limit drops are the provider's limit.
        let new = stats(
            &[
                "rx_drops",
                "rx0_drops",
                "rx1_drops",
                "rx0_hw_drops",
                "rx0_hw_ratelimit_packets",
                "rx1_hw_ratelimit_packets",
                "tx0_hw_ratelimit_packets",
                "tx0_timeouts",
            ],
            &[
                ("rx_drops", 3),
                ("rx0_drops", 1),
                ("rx1_drops", 2),
                ("rx0_hw_drops", 40),
                ("rx0_hw_ratelimit_packets", 10),
                ("rx1_hw_ratelimit_packets", 5),
            ],
        );
        let got = driver_signals(Some("virtio_net"), &new);
        let kinds: Vec<_> = got
            .iter()
            .map(|d| (d.limit.name, d.count, d.limit.kind))
            .collect();
        assert_eq!(
            kinds,
            [
                ("rx_hw_ratelimit_packets", 15, SignalKind::Allowance),
                ("rx_drops", 3, SignalKind::Dropped)
            ]
        );
        assert_eq!(got[1].queues, 1, "the total, not the queues");
    }

    /// AWS ENA: drivers/net/ethernet/amazon/ena/ena_ethtool.c (`ena_stats_eni_strings`), and
    /// an agent that did not send the driver's name still has them recognised.
    #[test]
    fn ena_allowances_with_or_without_the_driver_name() {
        let s = stats(
            &[
                "tx_timeout",
                "bw_in_allowance_exceeded",
                "bw_out_allowance_exceeded",
                "pps_allowance_exceeded",
                "conntrack_allowance_exceeded",
                "linklocal_allowance_exceeded",
                "queue_0_tx_cnt",
                "queue_0_rx_drops",
            ],
            &[
                ("pps_allowance_exceeded", 1_200_000),
                ("queue_0_rx_drops", 3),
            ],
        );
        let want = [("pps_allowance_exceeded", 1_200_000, 1)];
        assert_eq!(seen(Some("ena"), &s), want);
        assert_eq!(seen(None, &s), want);
        assert!(cloud_limit("bw_in_allowance_exceeded").is_some());
        assert!(cloud_limit("tx_no_space").is_none());
    }

    #[test]
    fn a_queue_number_is_digits_only() {
        assert!(matches_queue("rx{q}_drops", "rx12_drops"));
        assert!(!matches_queue("rx{q}_drops", "rx_drops"));
        assert!(!matches_queue("rx{q}_drops", "rx0_hw_drops"));
        assert!(matches_queue(
            "rx_queue_drop_cnt[{q}]",
            "rx_queue_drop_cnt[3]"
        ));
        assert!(!matches_queue(
            "rx_queue_drop_cnt[{q}]",
            "rx_queue_drop_cnt[]"
        ));
    }
}
