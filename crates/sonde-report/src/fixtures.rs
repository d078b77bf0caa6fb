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
    })
}

/// UDP, open loop at 10,000/s over a WAN path, with losses both ways, duplicates, reordering and
/// late sends; 99,950 samples, so p99.99 is not stated.
pub(crate) fn latency_udp_lossy() -> TestResult {
    TestResult::Latency(LatencyResult {
        meta: meta(42),
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
        target_bits_per_second: None,
        duration_ns: 3 * SEC,
        receiver: side(b0 + b1, (b0 + b1) / 131_072, rx_ns),
        sender: side(
            b0 + b1 + 5_767_168,
            (b0 + b1 + 5_767_168) / 131_072,
            3 * SEC,
        ),
        streams,
        intervals: (0..3)
            .map(|i| interval(i, vec![s0[i as usize], s1[i as usize]], 0))
            .collect(),
        lost: None,
        loss_percent: None,
        jitter_ns: None,
        duplicated: None,
        reordered: None,
        retransmits: Some(59),
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
        }],
        intervals: Vec::new(),
        lost: Some(lost),
        loss_percent: Some(lost as f64 * 100.0 / sent as f64),
        jitter_ns: Some(23_417),
        duplicated: Some(0),
        reordered: Some(12),
        retransmits: None,
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
        target_bits_per_second: None,
        duration_ns: 2 * SEC,
        receiver: side(rx_total, rx_total / 131_072, rx_ns),
        sender: side(tx_total, tx_total / 131_072, 2 * SEC),
        streams,
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
        send_method: "sendmsg+UDP_SEGMENT".to_owned(),
        sent,
        received,
        lost: sent - received,
        loss_percent: (sent - received) as f64 * 100.0 / sent as f64,
        sent_pps: sent as f64 / 10.0,
        received_pps: received as f64 / 10.001_2,
        flows,
    })
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
        ramp_ns: 2 * SEC,
        added_rtt_ns: AddedRttNs::between(&idle, &loaded),
        idle,
        loaded,
        load,
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
        ("quick_all", quick_all()),
        ("latency_with_warnings", latency_with_warnings()),
        ("load_udp_bufferbloat", load_udp_bufferbloat()),
    ]
}
