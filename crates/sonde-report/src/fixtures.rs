//! Realistic result documents for the snapshot and schema tests, one per shape the renderers
//! must handle. Numbers are consistent with each other (samples = sent - warm-up - lost, rates =
//! bytes * 8 / time) so a reader of the snapshots can check the arithmetic.

use crate::model::*;

const SEC: u64 = 1_000_000_000;
const TS: u64 = 1_714_564_800_000; // 2024-05-01 12:00:00 UTC

fn meta(session: u64) -> Meta {
    Meta {
        peer: Peer::Sonde,
        sonde_version: "0.1.0".to_owned(),
        timestamp_unix_ms: TS,
        server: "192.0.2.10:5300".to_owned(),
        session,
        overlapping_sessions: 0,
        warnings: Vec::new(),
        warning_codes: Vec::new(),
        labels: Labels::new(),
        interrupted: false,
        hosts: Hosts::default(),
        cpu: CpuCosts::default(),
        agent: None,
        sources: Vec::new(),
        interfaces: None,
    }
}

fn side(bytes: u64, packets: u64, duration_ns: u64) -> SideTotals {
    SideTotals {
        bytes,
        bits_per_second: bytes as f64 * 8.0 / (duration_ns as f64 / 1e9),
        packets,
        duration_ns,
    }
}

fn interval(start_s: u64, stream_bytes: Vec<u64>, packets: u64) -> IntervalResult {
    let bytes = stream_bytes.iter().sum::<u64>();
    IntervalResult {
        start_ns: start_s * SEC,
        end_ns: (start_s + 1) * SEC,
        bytes,
        bits_per_second: bytes as f64 * 8.0,
        packets,
        stream_bytes,
        tcp_info: Vec::new(),
        omitted: false,
        interfaces: None,
    }
}

/// TCP, closed loop, 250,000 samples: p99.99 is stated, p99.999 is not.
pub(crate) fn latency_tcp() -> TestResult {
    TestResult::Latency(LatencyResult {
        meta: meta(41),
        protocol: Protocol::Tcp,
        mode: LatencyMode::ClosedLoop,
        rate_per_second: None,
        msg_size_bytes: 64,
        duration_ns: 11 * SEC,
        warmup_ns: SEC,
        warmup_samples: 22_000,
        sent: 272_000,
        samples: 250_000,
        rtt_ns: RttNs {
            min: 31_231,
            mean: 39_870.4,
            stddev: 4_310.7,
            p50: Some(38_911),
            p90: Some(44_031),
            p99: Some(57_343),
            p999: Some(98_303),
            p9999: Some(412_671),
            p99999: None,
            max: 1_204_223,
        },
        lost: 0,
        lost_outbound: None,
        lost_return: None,
        duplicated: 0,
        reordered: 0,
        late_sends: None,
        rtt_histogram: None,
        socket_rtt: None,
        one_way: None,
        full_log: None,
        helpers: None,
        tuning: None,
        socket: None,
        intervals: Vec::new(),
        request_response: None,
    })
}

/// UDP, open loop at 10,000/s over a WAN path, with losses both ways, duplicates, reordering and
/// late sends; 99,950 samples, so p99.99 is not stated.
pub(crate) fn latency_udp_lossy() -> TestResult {
    TestResult::Latency(LatencyResult {
        meta: Meta {
            labels: [("path", "public"), ("zone", "other")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            ..meta(42)
        },
        protocol: Protocol::Udp,
        mode: LatencyMode::OpenLoop,
        rate_per_second: Some(10_000.0),
        msg_size_bytes: 256,
        duration_ns: 11 * SEC,
        warmup_ns: SEC,
        warmup_samples: 10_000,
        sent: 110_000,
        samples: 99_950,
        rtt_ns: RttNs {
            min: 11_902_133,
            mean: 12_480_512.25,
            stddev: 301_220.9,
            p50: Some(12_410_879),
            p90: Some(12_845_055),
            p99: Some(13_615_103),
            p999: Some(15_597_567),
            p9999: None,
            p99999: None,
            max: 21_430_271,
        },
        lost: 50,
        lost_outbound: Some(31),
        lost_return: Some(19),
        duplicated: 2,
        reordered: 7,
        late_sends: Some(3),
        rtt_histogram: None,
        socket_rtt: None,
        one_way: None,
        full_log: None,
        helpers: None,
        tuning: None,
        socket: None,
        intervals: Vec::new(),
        request_response: None,
    })
}

/// TCP forward, `-P 2 -t 3 -i 1`, with retransmits.
pub(crate) fn throughput_tcp_2_streams() -> TestResult {
    let s0 = [587_202_560, 591_396_864, 589_299_712];
    let s1 = [583_008_256, 589_299_712, 593_494_016];
    let (b0, b1) = (s0.iter().sum::<u64>(), s1.iter().sum::<u64>());
    let rx_ns = 3 * SEC + 1_200_000;
    let stream = |i: u32, rx: u64, tx: u64, retr: u64| StreamResult {
        stream: i,
        direction: StreamDirection::ClientToServer,
        receiver: side(rx, rx / 131_072, rx_ns),
        sender: side(tx, tx / 131_072, 3 * SEC),
        lost: None,
        loss_percent: None,
        duplicated: None,
        reordered: None,
        jitter_ns: None,
        retransmits: Some(retr),
        tcp_info: None,
    };
    let streams = vec![
        stream(0, b0, b0 + 2_621_440, 17),
        stream(1, b1, b1 + 3_145_728, 42),
    ];
    TestResult::Throughput(ThroughputResult {
        meta: meta(43),
        protocol: Protocol::Tcp,
        direction: "forward".to_owned(),
        parallel: 2,
        msg_size_bytes: 131_072,
        read_size_bytes: Some(524_288),
        target_bits_per_second: None,
        duration_ns: 3 * SEC,
        receiver: side(b0 + b1, (b0 + b1) / 131_072, rx_ns),
        sender: side(
            b0 + b1 + 5_767_168,
            (b0 + b1 + 5_767_168) / 131_072,
            3 * SEC,
        ),
        streams,
        intervals_counted_at: CountedAt::Receiver,
        intervals: (0..3)
            .map(|i| interval(i, vec![s0[i as usize], s1[i as usize]], 0))
            .collect(),
        lost: None,
        loss_percent: None,
        jitter_ns: None,
        duplicated: None,
        reordered: None,
        retransmits: Some(59),
        helpers: None,
        tuning: None,
        socket: None,
        omit_ns: None,
        omitted_bytes: None,
        skip_rx_copy: false,
        zerocopy: None,
        ecn: None,
        bytes_to_send: None,
        blocks_to_send: None,
    })
}

/// UDP reverse at a 1 Gbit/s target, one stream, loss and jitter, no intervals.
pub(crate) fn throughput_udp_reverse() -> TestResult {
    let size = 1_448_u64;
    let sent = 863_259_u64;
    let lost = 1_043_u64;
    let received = sent - lost;
    let tx = side(sent * size, sent, 10 * SEC);
    let rx = side(received * size, received, 10 * SEC + 350_000);
    TestResult::Throughput(ThroughputResult {
        meta: meta(44),
        protocol: Protocol::Udp,
        direction: "reverse".to_owned(),
        parallel: 1,
        msg_size_bytes: 1_448,
        read_size_bytes: None,
        target_bits_per_second: Some(1_000_000_000),
        duration_ns: 10 * SEC,
        receiver: rx.clone(),
        sender: tx.clone(),
        streams: vec![StreamResult {
            stream: 0,
            direction: StreamDirection::ServerToClient,
            receiver: rx,
            sender: tx,
            lost: Some(lost),
            loss_percent: Some(lost as f64 * 100.0 / sent as f64),
            duplicated: Some(0),
            reordered: Some(12),
            jitter_ns: Some(23_417),
            retransmits: None,
            tcp_info: None,
        }],
        intervals_counted_at: CountedAt::Receiver,
        intervals: Vec::new(),
        lost: Some(lost),
        loss_percent: Some(lost as f64 * 100.0 / sent as f64),
        jitter_ns: Some(23_417),
        duplicated: Some(0),
        reordered: Some(12),
        retransmits: None,
        helpers: None,
        tuning: None,
        socket: None,
        omit_ns: None,
        omitted_bytes: None,
        skip_rx_copy: false,
        zerocopy: None,
        ecn: None,
        bytes_to_send: None,
        blocks_to_send: None,
    })
}

/// TCP bidir, `-P 2 -t 2 -i 1`: four streams, two each way, uneven.
pub(crate) fn throughput_bidir() -> TestResult {
    let up = [[115_343_360, 117_440_512], [113_246_208, 116_391_936]];
    let down = [[230_686_720, 232_783_872], [228_589_568, 231_735_296]];
    let rx_ns = 2 * SEC + 900_000;
    let mk = |i: u32, dir: StreamDirection, rx: u64, retr: u64| StreamResult {
        stream: i,
        direction: dir,
        receiver: side(rx, rx / 131_072, rx_ns),
        sender: side(rx + 1_048_576, (rx + 1_048_576) / 131_072, 2 * SEC),
        lost: None,
        loss_percent: None,
        duplicated: None,
        reordered: None,
        jitter_ns: None,
        retransmits: Some(retr),
        tcp_info: None,
    };
    let sum = |a: [u64; 2]| a[0] + a[1];
    let streams = vec![
        mk(0, StreamDirection::ClientToServer, sum(up[0]), 3),
        mk(1, StreamDirection::ClientToServer, sum(up[1]), 5),
        mk(2, StreamDirection::ServerToClient, sum(down[0]), 0),
        mk(3, StreamDirection::ServerToClient, sum(down[1]), 1),
    ];
    let rx_total: u64 = streams.iter().map(|s| s.receiver.bytes).sum();
    let tx_total: u64 = streams.iter().map(|s| s.sender.bytes).sum();
    TestResult::Throughput(ThroughputResult {
        meta: meta(45),
        protocol: Protocol::Tcp,
        direction: "bidir".to_owned(),
        parallel: 2,
        msg_size_bytes: 131_072,
        read_size_bytes: Some(524_288),
        target_bits_per_second: None,
        duration_ns: 2 * SEC,
        receiver: side(rx_total, rx_total / 131_072, rx_ns),
        sender: side(tx_total, tx_total / 131_072, 2 * SEC),
        streams,
        intervals_counted_at: CountedAt::Receiver,
        intervals: (0..2)
            .map(|i| {
                let i_us = usize::try_from(i).unwrap_or(0);
                interval(
                    i,
                    vec![up[0][i_us], up[1][i_us], down[0][i_us], down[1][i_us]],
                    0,
                )
            })
            .collect(),
        lost: None,
        loss_percent: None,
        jitter_ns: None,
        duplicated: None,
        reordered: None,
        retransmits: Some(9),
        helpers: None,
        tuning: None,
        socket: None,
        omit_ns: None,
        omitted_bytes: None,
        skip_rx_copy: false,
        zerocopy: None,
        ecn: None,
        bytes_to_send: None,
        blocks_to_send: None,
    })
}

/// 18-byte datagrams, two flows, 10 s.
pub(crate) fn pps_2_flows() -> TestResult {
    let flows = vec![
        FlowResult {
            flow: 0,
            sent: 6_120_448,
            received: 6_018_311,
            lost: 102_137,
        },
        FlowResult {
            flow: 1,
            sent: 6_097_920,
            received: 5_990_012,
            lost: 107_908,
        },
    ];
    let sent: u64 = flows.iter().map(|f| f.sent).sum();
    let received: u64 = flows.iter().map(|f| f.received).sum();
    TestResult::Pps(PpsResult {
        meta: meta(46),
        protocol: Protocol::Udp,
        msg_size_bytes: 18,
        duration_ns: 10 * SEC,
        omit_ns: None,
        omitted_received: None,
        send_method: "sendmsg+UDP_SEGMENT".to_owned(),
        gso: PpsGso {
            mode: GsoMode::Auto,
            used: true,
            interface: Some("eth0".to_owned()),
            reason: GsoReason::PhysicalDevice,
            explanation:
                "eth0 is a physical device: it sends each datagram of a GSO batch as its own packet"
                    .to_owned(),
        },
        sent,
        received,
        lost: sent - received,
        loss_percent: (sent - received) as f64 * 100.0 / sent as f64,
        sent_pps: sent as f64 / 10.0,
        received_pps: received as f64 / 10.001_2,
        flows,
        intervals: Vec::new(),
        helpers: None,
        tuning: None,
        socket: None,
        ecn: None,
    })
}

/// `sonde pps --flows 2 -t 3 -i 1 --gso off` over a veth: three receiver intervals, the last
/// one running a little past 3 s.
pub(crate) fn pps_intervals() -> TestResult {
    let TestResult::Pps(mut r) = pps_2_flows() else {
        unreachable!("pps_2_flows is a pps result")
    };
    r.meta.session = 47;
    r.duration_ns = 3 * SEC;
    r.send_method = "sendmmsg".to_owned();
    r.gso = PpsGso {
        mode: GsoMode::Off,
        used: false,
        interface: Some("veth-a".to_owned()),
        reason: GsoReason::Requested,
        explanation: "--gso off asked for it".to_owned(),
    };
    let per_flow = [[301_120, 298_880], [305_664, 294_336], [300_544, 299_456]];
    let ends = [SEC, 2 * SEC, 3 * SEC + 4_000_000];
    r.intervals = per_flow
        .iter()
        .zip(ends)
        .enumerate()
        .map(|(i, (flows, end_ns))| {
            let start_ns = i as u64 * SEC;
            let received: u64 = flows.iter().sum();
            PpsInterval {
                start_ns,
                end_ns,
                received,
                received_pps: received as f64 * 1e9 / (end_ns - start_ns) as f64,
                flow_received: flows.to_vec(),
                omitted: false,
                interface: None,
            }
        })
        .collect();
    for (i, f) in r.flows.iter_mut().enumerate() {
        f.received = per_flow.iter().map(|p| p[i]).sum();
        f.sent = f.received;
        f.lost = 0;
    }
    r.sent = r.flows.iter().map(|f| f.sent).sum();
    r.received = r.sent;
    r.lost = 0;
    r.loss_percent = 0.0;
    r.sent_pps = r.sent as f64 / 3.0;
    r.received_pps = r.received as f64 / 3.004;
    TestResult::Pps(r)
}

/// `sonde quick`: every kind of case once.
pub(crate) fn quick_all() -> TestResult {
    let case = |name: &str, result: TestResult| QuickCase {
        case: name.to_owned(),
        result,
    };
    TestResult::Quick(QuickResult {
        sonde_version: "0.1.0".to_owned(),
        timestamp_unix_ms: TS,
        labels: Labels::new(),
        results: vec![
            case("tcp latency", latency_tcp()),
            case("udp latency", latency_udp_lossy()),
            case("tcp throughput x2", throughput_tcp_2_streams()),
            case("udp throughput reverse", throughput_udp_reverse()),
            case("udp pps", pps_2_flows()),
        ],
    })
}

/// A short latency run on a busy agent: too few samples for p99, overlap, warnings (one with a
/// comma and a quote, for the CSV quoting).
pub(crate) fn latency_with_warnings() -> TestResult {
    let TestResult::Latency(mut r) = latency_tcp() else {
        unreachable!("latency_tcp is a latency result")
    };
    r.meta.session = 47;
    r.meta.overlapping_sessions = 2;
    r.meta.warnings = vec![
        "the agent ran 2 other session(s) during this test: they shared its CPU and network, so \
         these numbers are not those of an idle path"
            .to_owned(),
        "only 850 samples: p99 and above are not stated (\"-t\" longer?)".to_owned(),
    ];
    r.meta.warning_codes = vec![WarningCode::OverlappingSessions, WarningCode::TooFewSamples];
    r.duration_ns = 1_034_000_000;
    r.warmup_ns = 0;
    r.warmup_samples = 0;
    r.sent = 850;
    r.samples = 850;
    r.rtt_ns = RttNs {
        min: 35_327,
        mean: 61_004.9,
        stddev: 80_112.3,
        p50: Some(41_471),
        p90: Some(72_191),
        p99: None,
        p999: None,
        p9999: None,
        p99999: None,
        max: 1_687_551,
    };
    TestResult::Latency(r)
}

/// UDP closed loop with the whole inner view: `--histogram --timestamps --one-way --full-log`,
/// 64-byte messages on loopback, where the sockets see about two thirds of the RTT.
pub(crate) fn latency_inner_view() -> TestResult {
    let TestResult::Latency(mut r) = latency_tcp() else {
        unreachable!("latency_tcp is a latency result")
    };
    r.meta.session = 48;
    r.protocol = Protocol::Udp;
    r.sent = 332_860;
    r.samples = 310_851;
    r.warmup_samples = 22_009;
    r.lost = 0;
    r.lost_outbound = Some(0);
    r.lost_return = Some(0);
    r.rtt_ns = RttNs {
        min: 10_983,
        mean: 14_912.6,
        stddev: 4_324.1,
        p50: Some(14_263),
        p90: Some(15_927),
        p99: Some(49_599),
        p999: Some(90_559),
        p9999: Some(274_227),
        p99999: None,
        max: 5_369_855,
    };
    let stat = |min: u64, mean: f64, p50: u64, p90: u64, p99: u64, p999: u64, max: u64| RttNs {
        min,
        mean,
        stddev: mean / 4.0,
        p50: Some(p50),
        p90: Some(p90),
        p99: Some(p99),
        p999: Some(p999),
        p9999: Some(max / 2),
        p99999: None,
        max,
    };
    let signed =
        |min: i64, mean: f64, p50: i64, p90: i64, p99: i64, p999: i64, max: i64| SignedNs {
            min,
            mean,
            stddev: mean / 4.0,
            p50: Some(p50),
            p90: Some(p90),
            p99: Some(p99),
            p999: Some(p999),
            p9999: Some(max / 2),
            p99999: None,
            max,
        };
    r.rtt_histogram = Some(
        [
            (11_586, 1_204),
            (13_778, 98_112),
            (16_384, 199_530),
            (19_484, 7_100),
            (23_171, 1_630),
            (27_555, 810),
            (32_768, 0),
            (38_968, 1_203),
            (46_341, 801),
            (55_109, 410),
            (65_536, 51),
        ]
        .into_iter()
        .map(|(le_ns, count)| HistogramBucket { le_ns, count })
        .collect(),
    );
    r.socket_rtt = Some(SocketRtt {
        rx_timestamps: true,
        tx_timestamps: true,
        rx_stamped: 310_851,
        tx_stamped: 310_851,
        inconsistent: 0,
        socket_rtt_ns: Some(stat(
            6_911, 9_870.2, 9_535, 10_623, 31_231, 60_415, 5_226_495,
        )),
        host_ns: Some(stat(3_607, 5_042.4, 4_651, 5_315, 18_431, 30_207, 143_359)),
        send_to_socket_rx_ns: Some(stat(
            8_703, 11_781.9, 11_391, 12_671, 38_655, 71_679, 5_271_551,
        )),
        rx_host_ns: Some(stat(1_903, 3_130.7, 2_871, 3_255, 10_943, 18_879, 98_303)),
    });
    r.one_way = Some(OneWay {
        samples: 310_851,
        unstamped: 0,
        forward_ns: Some(signed(
            5_127, 7_210.5, 6_987, 7_811, 24_063, 44_799, 2_604_031,
        )),
        return_ns: Some(signed(
            4_903, 7_301.8, 6_911, 7_771, 24_575, 45_311, 2_765_823,
        )),
        agent_hold_ns: Some(stat(251, 400.3, 383, 431, 1_103, 2_047, 27_007)),
        uncertainty_ns: Some(3_113),
        clock: Some(ClockEstimate {
            offset_ns: -412,
            offset_uncertainty_ns: 2_904,
            drift_ppm: 0.0,
            best_round_trip_ns: 5_808,
            control_exchanges: 115,
            probe_exchanges: 11,
            exchanges_used: 11,
        }),
    });
    r.full_log = Some(FullLog {
        path: "rtt.csv".into(),
        written: 332_860,
        dropped: 0,
        error: None,
    });
    TestResult::Latency(r)
}

/// `sonde load`: UDP probes at 1,000/s, idle then under 4 TCP streams through a 100 Mbit/s
/// bottleneck with a deep queue: the median grows by tens of ms.
pub(crate) fn load_udp_bufferbloat() -> TestResult {
    let probes = |session: u64, p50: u64, lost: u64| {
        let TestResult::Latency(mut r) = latency_tcp() else {
            unreachable!("latency_tcp is a latency result")
        };
        r.meta = meta(session);
        r.protocol = Protocol::Udp;
        r.mode = LatencyMode::OpenLoop;
        r.rate_per_second = Some(1_000.0);
        r.duration_ns = 6 * SEC;
        r.warmup_ns = SEC;
        r.warmup_samples = 1_000;
        r.sent = 5_000;
        r.samples = 5_000 - lost;
        r.lost = lost;
        r.lost_outbound = Some(lost);
        r.lost_return = Some(0);
        r.late_sends = Some(0);
        r.rtt_ns = RttNs {
            min: p50 * 9 / 10,
            mean: p50 as f64 * 1.05,
            stddev: p50 as f64 * 0.1,
            p50: Some(p50),
            p90: Some(p50 * 11 / 10),
            p99: Some(p50 * 13 / 10),
            p999: Some(p50 * 2),
            p9999: None,
            p99999: None,
            max: p50 * 3,
        };
        r
    };
    let idle = probes(51, 212_991, 0);
    let loaded = probes(53, 48_758_783, 17);
    let TestResult::Throughput(mut load) = throughput_tcp_2_streams() else {
        unreachable!("throughput_tcp_2_streams is a throughput result")
    };
    load.meta = meta(52);
    TestResult::Load(LoadResult {
        sonde_version: "0.1.0".to_owned(),
        timestamp_unix_ms: TS,
        labels: Labels::new(),
        ramp_ns: 2 * SEC,
        added_rtt_ns: AddedRttNs::between(&idle, &loaded),
        idle,
        loaded,
        load,
    })
}

/// `sonde latency --sweep msg_size=64,1400,9000`: the RTT grows with the message.
pub(crate) fn sweep_latency_msg_size() -> TestResult {
    let step = |session: u64, size: u32, p50: u64| {
        let TestResult::Latency(mut r) = latency_tcp() else {
            unreachable!("latency_tcp is a latency result")
        };
        r.meta = meta(session);
        r.msg_size_bytes = size;
        r.rtt_ns.p50 = Some(p50);
        r.rtt_ns.p90 = Some(p50 + p50 / 8);
        SweepStep {
            value: u64::from(size),
            result: TestResult::Latency(r),
        }
    };
    TestResult::Sweep(SweepResult {
        sonde_version: "0.1.0".to_owned(),
        timestamp_unix_ms: TS,
        labels: Labels::new(),
        sweep_test: "latency".to_owned(),
        parameter: "msg_size".to_owned(),
        unit: "bytes".to_owned(),
        steps: vec![
            step(61, 64, 38_911),
            step(62, 1400, 41_215),
            step(63, 9000, 52_991),
        ],
    })
}

/// Two hosts as `sonde conf` and every result see them: a client on a 10 Gbit/s virtio NIC, an
/// agent on a 25 Gbit/s mlx5 with jumbo frames, BBR and larger buffers.
fn host(name: &str, agent: bool) -> HostInfo {
    HostInfo {
        sonde_version: Some("0.1.0".to_owned()),
        host_name: Some(name.to_owned()),
        cpu_model: Some(if agent {
            "AMD EPYC 7763 64-Core Processor".to_owned()
        } else {
            "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz".to_owned()
        }),
        cpu_logical_count: Some(if agent { 128 } else { 8 }),
        cpu_available_count: Some(if agent { 128 } else { 4 }),
        memory_bytes: Some(if agent { 512 << 30 } else { 16 << 30 }),
        os_name: Some("Debian GNU/Linux 12 (bookworm)".to_owned()),
        os_version: Some("12".to_owned()),
        kernel_name: Some("Linux".to_owned()),
        kernel_release: Some(if agent {
            "6.1.0-18-amd64".to_owned()
        } else {
            "6.1.0-17-cloud-amd64".to_owned()
        }),
        architecture: Some("x86_64".to_owned()),
        interfaces: vec![NicInfo {
            name: if agent { "enp65s0f0" } else { "ens5" }.to_owned(),
            driver: Some(if agent { "mlx5_core" } else { "virtio_net" }.to_owned()),
            speed_mbit_per_second: if agent { Some(25_000) } else { None },
            mtu_bytes: Some(if agent { 9000 } else { 1500 }),
            up: Some(true),
            offloads: NicOffloads {
                gso: Some(true),
                gro: Some(true),
                tso: Some(true),
                lro: Some(false),
                rx_checksum: Some(true),
                tx_checksum: if agent { Some(true) } else { None },
            },
        }],
        tcp_congestion_control: Some(if agent { "bbr" } else { "cubic" }.to_owned()),
        tcp_congestion_control_available: Some(if agent {
            vec!["reno".to_owned(), "cubic".to_owned(), "bbr".to_owned()]
        } else {
            vec!["reno".to_owned(), "cubic".to_owned()]
        }),
        socket_buffers: SocketBufferLimits {
            rmem_max_bytes: Some(if agent { 67_108_864 } else { 212_992 }),
            wmem_max_bytes: Some(if agent { 67_108_864 } else { 212_992 }),
            rmem_default_bytes: Some(212_992),
            wmem_default_bytes: Some(212_992),
            tcp_rmem_bytes: Some(MinDefaultMax {
                min: 4_096,
                default: 131_072,
                max: if agent { 67_108_864 } else { 6_291_456 },
            }),
            tcp_wmem_bytes: Some(MinDefaultMax {
                min: 4_096,
                default: 16_384,
                max: 4_194_304,
            }),
            udp_mem_pages: Some(MinDefaultMax {
                min: 188_049,
                default: 250_735,
                max: 376_098,
            }),
        },
    }
}

fn tcp_info(srtt_us: u64, cwnd: u32, retr: u64) -> TcpInfo {
    TcpInfo {
        srtt_ns: Some(srtt_us * 1_000),
        rttvar_ns: Some(srtt_us * 250),
        min_rtt_ns: Some(180_000),
        cwnd_segments: Some(cwnd),
        ssthresh_segments: (retr > 0).then_some(cwnd * 7 / 10),
        mss_bytes: Some(8_948),
        retransmits: Some(retr),
        unacked_segments: Some(cwnd / 2),
        pacing_rate_bits_per_second: Some(u64::from(cwnd) * 8_948 * 8 * 1_000_000 / srtt_us),
        delivery_rate_bits_per_second: Some(9_412_000_000),
        delivery_rate_app_limited: Some(false),
        notsent_bytes: Some(1_048_576),
        busy_ns: Some(2_990_000_000),
        rwnd_limited_ns: Some(0),
        sndbuf_limited_ns: Some(1_250_000_000),
        delivered_ce_segments: None,
    }
}

/// TCP reverse, `-P 2 -t 3 -i 1`, with everything a result says about its context: both ends'
/// configuration, their CPU cost, and the agent's senders' TCP_INFO per interval and at the end
/// (stream 1's kernel is an old one: no delivery rate, busy time or unsent bytes).
pub(crate) fn throughput_tcp_context() -> TestResult {
    let TestResult::Throughput(mut r) = throughput_tcp_2_streams() else {
        unreachable!("throughput_tcp_2_streams is a throughput result")
    };
    r.meta.session = 48;
    r.direction = "reverse".to_owned();
    let old_kernel = |mut t: TcpInfo| {
        t.delivery_rate_bits_per_second = None;
        t.delivery_rate_app_limited = None;
        t.notsent_bytes = None;
        t.busy_ns = None;
        t.rwnd_limited_ns = None;
        t.sndbuf_limited_ns = None;
        t
    };
    for s in &mut r.streams {
        s.direction = StreamDirection::ServerToClient;
        let retr = s.retransmits.unwrap_or(0);
        let t = tcp_info(412 + u64::from(s.stream) * 9, 310 + s.stream * 17, retr);
        s.tcp_info = Some(if s.stream == 1 { old_kernel(t) } else { t });
    }
    for (i, iv) in r.intervals.iter_mut().enumerate() {
        let i = i as u64;
        iv.tcp_info = vec![
            StreamTcpInfo {
                stream: 0,
                tcp_info: tcp_info(380 + 10 * i, 280 + 10 * i as u32, 5 * i),
            },
            StreamTcpInfo {
                stream: 1,
                tcp_info: old_kernel(tcp_info(395 + 10 * i, 300 + 9 * i as u32, 14 * i)),
            },
        ];
    }
    r.meta.hosts = Hosts {
        client: Some(host("client-a", false)),
        server: Some(host("agent-b", true)),
    };
    let cpu = |wall_ns, user_ns, system_ns, vol, invol, syscalls, bytes: u64| {
        CpuCost::from_report(
            CpuScope::TestThreads,
            &sonde_wire::CpuReport {
                wall_ns,
                user_ns,
                system_ns,
                voluntary_switches: Some(vol),
                involuntary_switches: Some(invol),
                syscalls: Some(syscalls),
                messages: Some(bytes / 131_072),
                bytes: Some(bytes),
                // The host's own: about 2,000 interrupts and 10,000 switches a second.
                system_interrupts: Some(wall_ns / 500_000),
                system_context_switches: Some(wall_ns / 100_000),
                system_syscalls: None,
                system_softirq_ns: None,
            },
        )
    };
    r.meta.cpu = CpuCosts {
        // The client reads 512 KiB at a time: a quarter of a call per 128 KiB message.
        client: Some(cpu(
            3_021_000_000,
            61_000_000,
            1_730_000_000,
            4_120,
            311,
            6_729,
            r.receiver.bytes,
        )),
        server: Some(cpu(
            3_004_000_000,
            48_000_000,
            2_390_000_000,
            902,
            1_470,
            26_957,
            r.sender.bytes,
        )),
    };
    TestResult::Throughput(r)
}

/// `sonde conf agent-b`: both ends side by side.
pub(crate) fn conf_two_hosts() -> TestResult {
    TestResult::Conf(ConfResult {
        sonde_version: "0.1.0".to_owned(),
        timestamp_unix_ms: TS,
        server: Some("192.0.2.10:5300".to_owned()),
        hosts: Hosts {
            client: Some(host("client-a", false)),
            server: Some(host("agent-b", true)),
        },
        warnings: Vec::new(),
        warning_codes: Vec::new(),
    })
}

/// `sonde conf` without a host: this host alone, every interface that is up (here two, one of
/// them down to what a container shows: no driver, no offloads).
pub(crate) fn conf_this_host() -> TestResult {
    let mut me = host("client-a", false);
    me.interfaces.push(NicInfo {
        name: "docker0".to_owned(),
        driver: None,
        speed_mbit_per_second: None,
        mtu_bytes: Some(1500),
        up: Some(true),
        offloads: NicOffloads::default(),
    });
    me.tcp_congestion_control_available = None;
    TestResult::Conf(ConfResult {
        sonde_version: "0.1.0".to_owned(),
        timestamp_unix_ms: TS,
        server: None,
        hosts: Hosts {
            client: Some(me),
            server: None,
        },
        warnings: Vec::new(),
        warning_codes: Vec::new(),
    })
}

/// `sonde crr -P 4 -t 10`: 1-byte request and response on a LAN, FIN closes; one SYN was lost
/// (the 1 s retransmission timeout shows in the connect maximum).
pub(crate) fn crr_4_workers() -> TestResult {
    let transactions = 143_208;
    let agent_ns = 9_998_120_000;
    let client_ns = 9_999_310_000;
    TestResult::Crr(CrrResult {
        meta: meta(48),
        protocol: Protocol::Tcp,
        workers: 4,
        request_bytes: 1,
        response_bytes: 1,
        close: CrrClose::Fin,
        duration_ns: 10 * SEC,
        connections_per_second: Some(transactions as f64 * 1e9 / agent_ns as f64),
        agent_transactions: Some(transactions),
        agent_duration_ns: Some(agent_ns),
        agent_failed: Some(0),
        transactions,
        client_connections_per_second: Some(transactions as f64 * 1e9 / client_ns as f64),
        client_duration_ns: client_ns,
        connects: transactions,
        connect_ns: Some(RttNs {
            min: 19_711,
            mean: 41_230.5,
            stddev: 12_118.2,
            p50: Some(38_143),
            p90: Some(55_807),
            p99: Some(96_255),
            p999: Some(412_671),
            p9999: Some(689_151),
            p99999: None,
            max: 1_031_167,
        }),
        // Four workers at 14,300/s: about 280 µs each, most of it waiting for a core.
        transaction_ns: Some(RttNs {
            min: 48_127,
            mean: 278_911.4,
            stddev: 61_027.9,
            p50: Some(268_031),
            p90: Some(331_775),
            p99: Some(471_039),
            p999: Some(902_143),
            p9999: Some(1_712_127),
            p99999: None,
            max: 2_015_231,
        }),
        errors: CrrErrors::default(),
        intervals: Vec::new(),
        agents: Vec::new(),
        socket: None,
    })
}

/// `sonde crr -P 8 -t 10 -i 1` from a host with the default 28,232 ephemeral ports and no
/// `TIME_WAIT` reuse: the ports ran out after 2.09 s, which ended the test (the intervals end
/// there too); one response timed out (the agent counts it as failed).
pub(crate) fn crr_ports_exhausted() -> TestResult {
    let transactions = 28_230;
    let ns = 2_093_004_112;
    let mut m = meta(49);
    m.warnings = vec![
        "the client ran out of local ports (EADDRNOTAVAIL) after 28,231 connections: each \
         connection it closes holds its port in TIME_WAIT (60 s on Linux), so the test stopped \
         after 2.093 s of the 10.000 s asked and the rates are for that time only; --rst (no \
         TIME_WAIT), a wider net.ipv4.ip_local_port_range or net.ipv4.tcp_tw_reuse=1 lift the \
         limit"
            .to_owned(),
    ];
    m.warning_codes = vec![WarningCode::PortsExhausted];
    TestResult::Crr(CrrResult {
        meta: m,
        protocol: Protocol::Tcp,
        workers: 8,
        request_bytes: 64,
        response_bytes: 1_024,
        close: CrrClose::Fin,
        duration_ns: 10 * SEC,
        connections_per_second: Some(transactions as f64 * 1e9 / ns as f64),
        agent_transactions: Some(transactions),
        agent_duration_ns: Some(ns),
        agent_failed: Some(1),
        transactions,
        client_connections_per_second: Some(transactions as f64 * 1e9 / (ns + 90_000) as f64),
        client_duration_ns: ns + 90_000,
        connects: transactions + 1,
        connect_ns: Some(RttNs {
            min: 52_223,
            mean: 88_412.7,
            stddev: 20_553.1,
            p50: Some(84_991),
            p90: Some(109_567),
            p99: Some(160_767),
            p999: Some(301_055),
            p9999: None,
            p99999: None,
            max: 398_335,
        }),
        transaction_ns: Some(RttNs {
            min: 170_111,
            mean: 592_340.8,
            stddev: 98_700.2,
            p50: Some(581_631),
            p90: Some(702_463),
            p99: Some(911_359),
            p999: Some(1_380_351),
            p9999: None,
            p99999: None,
            max: 1_996_799,
        }),
        errors: CrrErrors {
            timeout: 1,
            addr_not_available: 3,
            ..CrrErrors::default()
        },
        intervals: {
            let end = ns + 346_000;
            let iv = |start_ns: u64, end_ns: u64, tx: u64, connects: u64, errors, p50, p99| {
                CrrInterval {
                    start_ns,
                    end_ns,
                    transactions: tx,
                    transactions_per_second: tx as f64 * 1e9 / (end_ns - start_ns) as f64,
                    connects,
                    errors,
                    connect_p50_ns: Some(p50),
                    connect_p99_ns: Some(p99),
                }
            };
            vec![
                iv(
                    0,
                    SEC,
                    13_519,
                    13_519,
                    CrrErrors::default(),
                    84_479,
                    159_743,
                ),
                iv(
                    SEC,
                    2 * SEC,
                    13_466,
                    13_467,
                    CrrErrors {
                        timeout: 1,
                        ..CrrErrors::default()
                    },
                    84_991,
                    161_791,
                ),
                iv(
                    2 * SEC,
                    end,
                    1_245,
                    1_245,
                    CrrErrors {
                        addr_not_available: 3,
                        ..CrrErrors::default()
                    },
                    86_015,
                    171_007,
                ),
            ]
        },
        agents: Vec::new(),
        socket: None,
    })
}

/// Every fixture, named.
pub(crate) fn all() -> Vec<(&'static str, TestResult)> {
    vec![
        ("latency_tcp", latency_tcp()),
        ("latency_udp_lossy", latency_udp_lossy()),
        ("throughput_tcp_2_streams", throughput_tcp_2_streams()),
        ("throughput_udp_reverse", throughput_udp_reverse()),
        ("throughput_bidir", throughput_bidir()),
        ("pps_2_flows", pps_2_flows()),
        ("pps_intervals", pps_intervals()),
        ("crr_4_workers", crr_4_workers()),
        ("crr_ports_exhausted", crr_ports_exhausted()),
        ("quick_all", quick_all()),
        ("latency_with_warnings", latency_with_warnings()),
        ("latency_inner_view", latency_inner_view()),
        ("load_udp_bufferbloat", load_udp_bufferbloat()),
        ("sweep_latency_msg_size", sweep_latency_msg_size()),
        ("throughput_tcp_context", throughput_tcp_context()),
        ("conf_two_hosts", conf_two_hosts()),
        ("conf_this_host", conf_this_host()),
        ("pps_from_helpers", pps_from_helpers()),
        ("throughput_from_helpers", throughput_from_helpers()),
        ("latency_from_helpers", latency_from_helpers()),
        ("mtu_router_said", mtu_router_said()),
        ("latency_many_flows", latency_many_flows()),
        ("latency_many_flows_open", latency_many_flows_open()),
    ]
}

/// `sonde latency -P 16 --depth 4 --response-size 1K`: TCP, 16 flows of 4 requests in flight,
/// 64-byte requests and 1 KiB responses, over two client threads.
pub(crate) fn latency_many_flows() -> TestResult {
    let TestResult::Latency(mut r) = latency_tcp() else {
        unreachable!("latency_tcp is a latency result")
    };
    let flow_transactions: Vec<u64> = (0..16).map(|i| 62_000 + i * 250).collect();
    let transactions: u64 = flow_transactions.iter().sum();
    r.sent = transactions + 16 * 4 + 110_000;
    r.samples = transactions;
    r.request_response = Some(crate::model::RequestResponse {
        flows: 16,
        depth: 4,
        response_size_bytes: 1024,
        client_threads: 2,
        transactions,
        transactions_per_second: transactions as f64 / 10.0,
        flow_min_per_second: 6_200.0,
        flow_max_per_second: 6_575.0,
        fairness: crate::model::RequestResponse::jain(&flow_transactions),
        flow_transactions,
        timeouts: None,
        client_cpu_ns_per_transaction: Some(9_512.0),
        server_cpu_ns_per_transaction: Some(7_204.0),
        rate_achieved_per_second: None,
        unsent: None,
    });
    TestResult::Latency(r)
}

/// `sonde latency -u -P 16 --depth 2 --rate 100K -i 5`: the open loop over 16 UDP flows, 10 s
/// after a 1 s warm-up, the flows held at their depth for a while (late and unsent sends), two
/// intervals with their transactions per second.
pub(crate) fn latency_many_flows_open() -> TestResult {
    let TestResult::Latency(mut r) = latency_many_flows() else {
        unreachable!("latency_many_flows is a latency result")
    };
    r.protocol = crate::model::Protocol::Udp;
    r.mode = crate::model::LatencyMode::OpenLoop;
    r.rate_per_second = Some(100_000.0);
    let flow_transactions: Vec<u64> = (0..16).map(|i| 62_400 - i * 10).collect();
    let transactions: u64 = flow_transactions.iter().sum();
    r.samples = transactions;
    r.sent = 1_099_000;
    r.lost = 12;
    r.lost_outbound = Some(5);
    r.lost_return = Some(7);
    r.late_sends = Some(3_210);
    let rtt = r.rtt_ns.clone();
    r.intervals = vec![
        crate::model::LatencyInterval {
            start_ns: 1_000_000_000,
            end_ns: 6_000_000_000,
            samples: 500_000,
            rtt_ns: Some(rtt.clone()),
            transactions_per_second: Some(100_000.0),
        },
        crate::model::LatencyInterval {
            start_ns: 6_000_000_000,
            end_ns: 11_000_400_000,
            samples: transactions - 500_000,
            rtt_ns: Some(rtt),
            transactions_per_second: Some((transactions - 500_000) as f64 / 5.0004),
        },
    ];
    r.meta
        .add(&crate::model::Warning::LateSends { late: 3_210 });
    r.meta.add(&crate::model::Warning::UnsentRequests {
        unsent: 1_000,
        due: 1_100_000,
        depth: 2,
    });
    if let Some(rr) = &mut r.request_response {
        rr.depth = 2;
        rr.transactions = transactions;
        rr.transactions_per_second = transactions as f64 / 10.0;
        rr.flow_min_per_second = 6_225.0;
        rr.flow_max_per_second = 6_240.0;
        rr.fairness = crate::model::RequestResponse::jain(&flow_transactions);
        rr.flow_transactions = flow_transactions;
        rr.timeouts = Some(12);
        rr.rate_achieved_per_second = Some(99_910.0);
        rr.unsent = Some(1_000);
    }
    TestResult::Latency(r)
}

/// `sonde mtu 198.18.1.2` through a router whose link toward the agent has an MTU of 1,400: it
/// names that MTU in its ICMP, and TCP's MSS shrinks to match once data crosses.
pub(crate) fn mtu_router_said() -> TestResult {
    let mut m = meta(52);
    m.server = "198.18.1.2:5300".to_owned();
    m.add(&crate::model::Warning::PathMtuBelowInterface {
        path: 1_400,
        interface: 1_500,
        how: "198.18.0.2 said so".to_owned(),
        mss: 1_360,
    });
    let probe = |ip_bytes, fate, rtt_ns, reported: Option<(u32, &str)>| crate::model::MtuProbe {
        ip_bytes,
        fate,
        rtt_ns,
        reported_mtu_bytes: reported.map(|r| r.0),
        reported_by: reported.map(|r| r.1.to_owned()),
    };
    use crate::model::MtuProbeFate as F;
    TestResult::Mtu(crate::model::MtuResult {
        meta: m,
        ip_version: 4,
        path_mtu_bytes: Some(1_400),
        udp_payload_bytes: Some(1_372),
        ip_header_bytes: 20,
        udp_header_bytes: 8,
        interface_mtu_bytes: Some(1_500),
        ceiling_bytes: 1_500,
        upper_bound: crate::model::MtuBound::Reported,
        smallest_refused_bytes: Some(1_401),
        tries: 3,
        probe_timeout_ns: 1_000_000_000,
        search_ns: 1_532_117,
        probes_sent: 3,
        probes: vec![
            probe(68, F::Echoed, Some(112_305), None),
            probe(1_500, F::RouterTooBig, None, Some((1_400, "198.18.0.2"))),
            probe(1_400, F::Echoed, Some(98_771), None),
        ],
        kernel_path_mtu_bytes: Some(1_400),
        agent_dont_fragment: Some(true),
        complete: true,
        tcp: Some(crate::model::MtuTcp {
            client_mss_at_connect_bytes: Some(1_448),
            client_mss_bytes: Some(1_348),
            agent_mss_at_connect_bytes: Some(1_348),
            agent_mss_bytes: Some(1_348),
            exchanged_bytes: 65_536,
            completed: true,
        }),
    })
}

/// `sonde pps B --from A1 --from A2 -m 14 --flows 1 --gso off -t 2`: two helpers' shares,
/// started 0.61 ms apart.
pub(crate) fn pps_from_helpers() -> TestResult {
    let TestResult::Pps(mut r) = pps_2_flows() else {
        unreachable!("pps_2_flows is a pps result")
    };
    r.meta.session = 48;
    r.msg_size_bytes = 14;
    r.duration_ns = 2 * SEC;
    let shares = [
        ("198.18.2.2:5300", 48, 0, 1_201_664, 1_190_115, 580_412.7),
        (
            "198.18.3.2:5300",
            49,
            613_440,
            1_186_368,
            1_186_368,
            591_809.3,
        ),
    ];
    r.flows = shares
        .iter()
        .zip(0..)
        .map(|(s, flow)| FlowResult {
            flow,
            sent: s.3,
            received: s.4,
            lost: s.3 - s.4,
        })
        .collect();
    r.sent = shares.iter().map(|s| s.3).sum();
    r.received = shares.iter().map(|s| s.4).sum();
    r.lost = r.sent - r.received;
    r.loss_percent = r.lost as f64 * 100.0 / r.sent as f64;
    let window_ns = 2_004_518_221;
    r.sent_pps = r.sent as f64 / 2.003_9;
    r.received_pps = r.received as f64 / (window_ns as f64 / 1e9);
    r.helpers = Some(Helpers {
        start_spread_ns: 613_440,
        offset_uncertainty_ns: 11_470,
        window_ns,
        shares: shares
            .iter()
            .map(|s| HelperShare {
                helper: s.0.to_owned(),
                session: s.1,
                start_offset_ns: s.2,
                sent: Some(s.3),
                received: Some(s.4),
                lost: Some(s.3 - s.4),
                received_pps: Some(s.5),
                bits_per_second: None,
                rtt_ns: None,
            })
            .collect(),
    });
    TestResult::Pps(r)
}

/// `sonde throughput B --from A1 --from A2 -P 2`: the shares' bytes and rates.
pub(crate) fn throughput_from_helpers() -> TestResult {
    let TestResult::Throughput(mut r) = throughput_tcp_2_streams() else {
        unreachable!("throughput_tcp_2_streams is a throughput result")
    };
    r.meta.session = 50;
    r.helpers = Some(Helpers {
        start_spread_ns: 7_420_102,
        offset_uncertainty_ns: 23_030,
        window_ns: r.receiver.duration_ns,
        shares: [
            ("198.18.2.2:5300", 50, 7_420_102),
            ("198.18.3.2:5300", 51, 0),
        ]
        .iter()
        .map(|&(helper, session, start)| HelperShare {
            helper: helper.to_owned(),
            session,
            start_offset_ns: start,
            sent: Some(r.sender.bytes / 2),
            received: Some(r.receiver.bytes / 2),
            lost: None,
            received_pps: None,
            bits_per_second: Some(r.receiver.bits_per_second / 2.0),
            rtt_ns: None,
        })
        .collect(),
    });
    TestResult::Throughput(r)
}

/// `sonde latency B --from A1 --from A2 -u`: each helper's RTTs while the other ran.
pub(crate) fn latency_from_helpers() -> TestResult {
    let TestResult::Latency(mut r) = latency_udp_lossy() else {
        unreachable!("latency_udp_lossy is a latency result")
    };
    r.meta.session = 52;
    let mut other = r.rtt_ns.clone();
    other.min += 1_000;
    other.p50 = other.p50.map(|v| v + 2_000);
    r.helpers = Some(Helpers {
        start_spread_ns: 2_752_000,
        offset_uncertainty_ns: 12_780,
        window_ns: r.duration_ns + 2_752_000,
        shares: [
            ("198.18.2.2:5300", 52, 0, r.rtt_ns.clone()),
            ("198.18.3.2:5300", 53, 2_752_000, other),
        ]
        .into_iter()
        .map(|(helper, session, start, rtt)| HelperShare {
            helper: helper.to_owned(),
            session,
            start_offset_ns: start,
            sent: None,
            received: None,
            lost: None,
            received_pps: None,
            bits_per_second: None,
            rtt_ns: Some(rtt),
        })
        .collect(),
    });
    TestResult::Latency(r)
}
