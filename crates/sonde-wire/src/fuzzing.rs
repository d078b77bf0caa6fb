//! The bodies of the cargo-fuzz targets in `fuzz/`, one per decoder of bytes from the network,
//! and the seed inputs they start from (real encodings).
//!
//! They live here, not in `fuzz/`, so that a stable `cargo test -p sonde-wire` runs every body
//! over its seeds and thousands of mutated inputs (the tests at the bottom): nightly and
//! libFuzzer are needed only to search further, and an input the fuzzer finds becomes a
//! regression test here. Compiled for this crate's tests and with the `fuzzing` feature (which
//! only `fuzz/` turns on); not part of the API.
//!
//! Each body decodes its input the way a receiver does and panics when a property fails: a
//! decoder that panics, accepts what it should refuse (or the other way round), or a value that
//! does not encode back to the bytes it came from (where encoding is defined). It returns
//! whether anything decoded, so the tests can tell that the properties were reached.
//!
//! To add a decoder: write its body and seeds here, list it in [`TARGETS`], and add
//! `fuzz/fuzz_targets/<name>.rs` with its `[[bin]]` in `fuzz/Cargo.toml` (a test checks that
//! the two lists agree).

use serde_json::Value;

use crate::{
    decode_body, decode_frame, encode_frame, frame_len, iperf3, read_latency_seq, sockperf, stamps,
    widen_seq, write_latency_seq, AgentId, AgentReport, Channel, ControlMsg, CpuReport, CrrJoin,
    CrrReport, DataHeader, DataJoin, Direction, Error, HostInfo, IntervalStats, Iperf3UdpHeader,
    JoinAnswer, JoinOutcome, Limits, MinDefaultMax, NicInfo, NicOffloads, PpsHeader, Preamble,
    Protocol, Refusal, SessionId, SocketBufferLimits, StreamStats, TcpInfoStats, TestKind,
    TestSpec, Token, UdpElsewhere, UdpJoin, CRR_JOIN_LEN, DATA_HEADER_LEN, DATA_JOIN_LEN,
    JOIN_ANSWER_LEN, MAX_FRAME_LEN, PPS_HEADER_LEN, PPS_SEQ_LIMIT, PREAMBLE_LEN, PROTOCOL_VERSION,
    UDP_JOIN_LEN,
};

/// One fuzz target: `fuzz/fuzz_targets/{name}.rs` calls `run`.
#[derive(Clone, Copy)]
pub struct Target {
    /// The cargo-fuzz target's name, and the name of its body here.
    pub name: &'static str,
    /// The body: panics when a property fails; returns whether the input decoded.
    pub run: fn(&[u8]) -> bool,
    /// Real encodings to start from.
    pub seeds: fn() -> Vec<Vec<u8>>,
}

/// Every target.
pub const TARGETS: &[Target] = &[
    Target {
        name: "mesh_probe",
        run: mesh_probe,
        seeds: mesh_probe_seeds,
    },
    Target {
        name: "control_frame",
        run: control_frame,
        seeds: control_frame_seeds,
    },
    Target {
        name: "host_info",
        run: host_info,
        seeds: host_info_seeds,
    },
    Target {
        name: "preamble",
        run: preamble,
        seeds: preamble_seeds,
    },
    Target {
        name: "data_join",
        run: data_join,
        seeds: data_join_seeds,
    },
    Target {
        name: "join_answer",
        run: join_answer,
        seeds: join_answer_seeds,
    },
    Target {
        name: "udp_elsewhere",
        run: udp_elsewhere,
        seeds: udp_elsewhere_seeds,
    },
    Target {
        name: "crr_join",
        run: crr_join,
        seeds: crr_join_seeds,
    },
    Target {
        name: "udp_join",
        run: udp_join,
        seeds: udp_join_seeds,
    },
    Target {
        name: "data_header",
        run: data_header,
        seeds: data_header_seeds,
    },
    Target {
        name: "pps_header",
        run: pps_header,
        seeds: pps_header_seeds,
    },
    Target {
        name: "latency_seq",
        run: latency_seq,
        seeds: latency_seq_seeds,
    },
    Target {
        name: "stamps",
        run: stamps,
        seeds: stamps_seeds,
    },
    Target {
        name: "iperf3_params",
        run: iperf3_params,
        seeds: iperf3_params_seeds,
    },
    Target {
        name: "iperf3_results",
        run: iperf3_results,
        seeds: iperf3_results_seeds,
    },
    Target {
        name: "iperf3_json_len",
        run: iperf3_json_len,
        seeds: iperf3_json_len_seeds,
    },
    Target {
        name: "iperf3_cookie",
        run: iperf3_cookie,
        seeds: iperf3_cookie_seeds,
    },
    Target {
        name: "iperf3_server_error",
        run: iperf3_server_error,
        seeds: iperf3_server_error_seeds,
    },
    Target {
        name: "iperf3_udp_header",
        run: iperf3_udp_header,
        seeds: iperf3_udp_header_seeds,
    },
    Target {
        name: "sockperf_header",
        run: sockperf_header,
        seeds: sockperf_header_seeds,
    },
];

fn be_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_be_bytes(a)
}

fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}

// ---------------------------------------------------------------------------------------------
// sonde's control channel

/// A control channel's byte stream: frames read one after another as the reader does, each
/// decoded message encoding back to a frame that decodes to the same message.
pub fn control_frame(data: &[u8]) -> bool {
    if let Some(h) = data.get(..4) {
        let header = [h[0], h[1], h[2], h[3]];
        match frame_len(header) {
            Ok(len) => assert_eq!(len, be_u32(h) as usize, "frame_len reads the length"),
            Err(e) => {
                assert!(be_u32(h) > MAX_FRAME_LEN);
                assert_eq!(e, Error::FrameTooLarge(be_u32(h)));
            }
        }
    }
    let mut at = 0;
    let mut decoded = false;
    loop {
        let rest = &data[at..];
        match decode_frame(rest) {
            Ok(Some((msg, used))) => {
                assert!(
                    used >= 4 && used <= rest.len(),
                    "used {used} of {}",
                    rest.len()
                );
                assert_eq!(
                    used - 4,
                    be_u32(rest) as usize,
                    "a frame is its length field"
                );
                control_round_trip(&msg);
                decoded = true;
                at += used;
            }
            Ok(None) => {
                // More bytes needed: the header or the body is incomplete, never a whole frame.
                assert!(rest.len() < 4 || rest.len() < 4 + be_u32(rest) as usize);
                break;
            }
            Err(Error::FrameTooLarge(n)) => {
                assert!(n > MAX_FRAME_LEN && n == be_u32(rest));
                break;
            }
            Err(Error::Malformed(_)) => {
                assert!(decode_body(&rest[4..4 + be_u32(rest) as usize]).is_err());
                break;
            }
            Err(e) => panic!("decode_frame: unexpected error {e:?}"),
        }
    }
    decoded
}

fn control_round_trip(msg: &ControlMsg) {
    // What the spec implies must not panic either (the agent calls these on a client's spec).
    if let ControlMsg::Start { spec, .. } = msg {
        let _ = spec.channels();
        let _ = spec.client_sends(0);
        let _ = spec.client_sends(u32::MAX);
    }
    let body = serde_json::to_vec(msg).expect("a decoded message encodes");
    assert_eq!(decode_body(&body).as_ref(), Ok(msg), "body round trip");
    let mut frame = vec![0xaa];
    match encode_frame(msg, &mut frame) {
        Ok(()) => {
            assert_eq!(frame[0], 0xaa, "encode_frame appends");
            assert_eq!(
                decode_frame(&frame[1..]),
                Ok(Some((msg.clone(), frame.len() - 1))),
                "frame round trip"
            );
        }
        // Defaults written out in full (a `host` of `{}` becomes every field as null) can make
        // a message that arrived within the limit too large to send back; it is refused whole.
        Err(Error::FrameTooLarge(n)) => {
            assert!(n > MAX_FRAME_LEN);
            assert_eq!(frame, [0xaa], "a refused frame leaves nothing behind");
        }
        Err(e) => panic!("encode_frame: unexpected error {e:?}"),
    }
}

/// A peer's host configuration (`HostInfo`, as in `Welcome.host`) decodes and encodes back to
/// the same value.
pub fn host_info(data: &[u8]) -> bool {
    let Ok(info) = serde_json::from_slice::<HostInfo>(data) else {
        return false;
    };
    let text = serde_json::to_vec(&info).expect("a decoded HostInfo encodes");
    assert_eq!(
        serde_json::from_slice::<HostInfo>(&text).ok().as_ref(),
        Some(&info),
        "HostInfo round trip"
    );
    true
}

// ---------------------------------------------------------------------------------------------
// sonde's data path (data.rs)

/// The 8-byte preamble: refused exactly when short, not `SNDE` or of an unknown channel kind;
/// else it encodes back to the same bytes (the reserved byte as 0).
pub fn preamble(data: &[u8]) -> bool {
    let decoded = Preamble::decode(data);
    if data.len() < PREAMBLE_LEN {
        assert_eq!(
            decoded,
            Err(Error::Truncated {
                need: PREAMBLE_LEN,
                have: data.len()
            })
        );
        return false;
    }
    let magic = [data[0], data[1], data[2], data[3]];
    if magic != crate::MAGIC {
        assert_eq!(decoded, Err(Error::BadMagic(magic)));
        return false;
    }
    if !(1..=3).contains(&data[6]) {
        assert_eq!(decoded, Err(Error::Channel(data[6])));
        return false;
    }
    let p = decoded.expect("a well-formed preamble decodes");
    let wire = p.encode();
    assert_eq!(wire[..7], data[..7], "preamble encodes back");
    assert_eq!(wire[7], 0, "reserved");
    assert_eq!(Preamble::decode(&wire), Ok(p));
    assert_eq!(p.check_version().is_ok(), p.version == PROTOCOL_VERSION);
    true
}

/// A TCP data channel's 16-byte join: any 16 bytes are a join; token and stream encode back.
pub fn data_join(data: &[u8]) -> bool {
    let Ok(j) = DataJoin::decode(data) else {
        assert!(data.len() < DATA_JOIN_LEN, "only a short join is refused");
        return false;
    };
    let wire = j.encode();
    assert_eq!(wire[..12], data[..12], "token and stream encode back");
    assert_eq!(
        wire[12..],
        [0, 0, 0, data[15] & 1],
        "only the answer flag is kept"
    );
    assert_eq!(DataJoin::decode(&wire), Ok(j));
    true
}

/// An agent's answer to a TCP data join: 16 bytes starting `SNDK`; it encodes back but for
/// the reserved byte and the version, which a reader ignores.
pub fn join_answer(data: &[u8]) -> bool {
    let decoded = JoinAnswer::decode(data);
    let well_formed = data.len() >= JOIN_ANSWER_LEN && data[..4] == crate::JOIN_ANSWER_MAGIC;
    match decoded {
        Ok(a) => {
            assert!(well_formed, "accepted {data:02x?}");
            let wire = a.encode();
            assert_eq!(wire[6], data[6], "the outcome encodes back");
            assert_eq!(wire[8..], data[8..16], "the agent encodes back");
            assert_eq!(JoinAnswer::decode(&wire), Ok(a));
            true
        }
        Err(_) => {
            assert!(!well_formed, "refused {data:02x?}");
            false
        }
    }
}

/// An agent's answer to a UDP join it cannot take: exactly 32 bytes starting `SNDN`; it
/// encodes back but for the version and the zeros, which a reader ignores.
pub fn udp_elsewhere(data: &[u8]) -> bool {
    let decoded = UdpElsewhere::decode(data);
    let well_formed = data.len() == UDP_JOIN_LEN && data[..4] == crate::UDP_ELSEWHERE_MAGIC;
    match decoded {
        Ok(e) => {
            assert!(well_formed, "accepted {data:02x?}");
            let wire = e.encode();
            assert_eq!(
                wire[6..25],
                data[6..25],
                "flow, token, agent and outcome encode back"
            );
            assert_eq!(UdpElsewhere::decode(&wire), Ok(e));
            true
        }
        Err(_) => {
            assert!(!well_formed, "refused {data:02x?}");
            false
        }
    }
}

/// A connection-rate join: any 16 bytes; everything but unknown flag bits encodes back.
pub fn crr_join(data: &[u8]) -> bool {
    let Ok(j) = CrrJoin::decode(data) else {
        assert!(data.len() < CRR_JOIN_LEN, "only a short join is refused");
        return false;
    };
    let wire = j.encode();
    assert_eq!(wire[..10], data[..10], "token and worker encode back");
    assert_eq!(
        wire[10..12],
        [0, data[11] & 3],
        "only the rst and answer flags are kept"
    );
    assert_eq!(wire[12..], data[12..16], "response size encodes back");
    assert_eq!(CrrJoin::decode(&wire), Ok(j));
    true
}

/// A mesh probe or its reply (`crate::probe`), as the agent's port and the prober read them:
/// a probe that parses is as long as its length field says, its answer is never longer, and
/// it encodes back (under any secret) to a probe that decodes to the same fields; nothing
/// panics, with or without the MAC check.
pub fn mesh_probe(data: &[u8]) -> bool {
    use crate::probe::{Probe, ProbeReply, MAX_PROBE_LEN};
    let secret = crate::auth::Secret::new(b"fuzz".to_vec()).unwrap_or_else(|_| unreachable!());
    let _ = Probe::decode(&secret, data);
    let _ = ProbeReply::decode(&secret, "a", data);
    let reply = ProbeReply::parse(data).is_ok();
    let Ok(p) = Probe::parse(data) else {
        return reply;
    };
    assert_eq!(
        data.len(),
        usize::from(u16::from_be_bytes([data[6], data[7]])),
        "accepted {data:02x?}"
    );
    let mut out = [0u8; MAX_PROBE_LEN];
    let n = ProbeReply::answer(&secret, &p, data.len(), &mut out)
        .expect("a parsed probe is answerable");
    assert!(
        n <= data.len(),
        "a reply of {n} bytes to a probe of {}",
        data.len()
    );
    let m = p
        .encode(&secret, data.len(), &mut out)
        .expect("a parsed probe encodes");
    assert_eq!(m, data.len());
    assert_eq!(Probe::decode(&secret, &out[..m]), Ok(p));
    true
}

/// A UDP join datagram: exactly 32 bytes, `SNDJ` or `SNDA`, this version; it then encodes back
/// to the very same datagram.
pub fn udp_join(data: &[u8]) -> bool {
    let decoded = UdpJoin::decode(data);
    let well_formed = data.len() == UDP_JOIN_LEN
        && (data[..4] == crate::UDP_JOIN_MAGIC || data[..4] == crate::UDP_ACK_MAGIC)
        && data[4..6] == PROTOCOL_VERSION.to_be_bytes();
    match decoded {
        Ok(j) => {
            assert!(well_formed, "accepted {data:02x?}");
            assert_eq!(j.encode()[..], data[..], "a join encodes back");
            true
        }
        Err(_) => {
            assert!(!well_formed, "refused {data:02x?}");
            false
        }
    }
}

/// The 16-byte UDP data header at the front of a datagram of any length.
pub fn data_header(data: &[u8]) -> bool {
    let Ok(h) = DataHeader::read(data) else {
        assert!(
            data.len() < DATA_HEADER_LEN,
            "only a short datagram is refused"
        );
        return false;
    };
    let mut wire = [0u8; DATA_HEADER_LEN];
    h.write(&mut wire);
    assert_eq!(wire[..], data[..DATA_HEADER_LEN], "header encodes back");
    true
}

/// The 14-byte pps header at the front of a datagram of any length.
pub fn pps_header(data: &[u8]) -> bool {
    let Ok(h) = PpsHeader::read(data) else {
        assert!(
            data.len() < PPS_HEADER_LEN,
            "only a short datagram is refused"
        );
        return false;
    };
    assert!(h.seq < PPS_SEQ_LIMIT, "48 bits carried: {}", h.seq);
    let mut wire = [0u8; PPS_HEADER_LEN];
    h.write(&mut wire);
    assert_eq!(wire[..], data[..PPS_HEADER_LEN], "header encodes back");
    true
}

/// A latency datagram's sequence number: the first 8 bytes of the input are the receiver's
/// next expected sequence number, the rest is the datagram. The carried bytes encode back, and
/// widening them gives the value with those low bytes nearest the expected one.
pub fn latency_seq(data: &[u8]) -> bool {
    let (expected, msg) = match data.get(..8) {
        Some(e) => (be_u64(e), &data[8..]),
        None => (0, data),
    };
    let (low, n) = read_latency_seq(msg);
    assert_eq!(n, msg.len().min(8));
    let mut wire = [0u8; 8];
    write_latency_seq(low, &mut wire[..n]);
    assert_eq!(wire[..n], msg[..n], "the carried bytes encode back");
    let seq = widen_seq(low, n, expected);
    match n {
        0 => assert_eq!(seq, expected, "nothing carried: the expected one"),
        8 => assert_eq!(seq, low, "all 8 bytes carried: as it is"),
        _ => {
            let span = 1u64 << (8 * n);
            assert_eq!(
                seq & (span - 1),
                low,
                "widened {low:#x} near {expected:#x} to {seq:#x}"
            );
            let distance = seq.abs_diff(expected);
            for other in [seq.checked_sub(span), seq.checked_add(span)]
                .into_iter()
                .flatten()
            {
                assert!(
                    other.abs_diff(expected) >= distance,
                    "{other:#x} is nearer {expected:#x} than {seq:#x}"
                );
            }
        }
    }
    n > 0
}

/// A latency message with or without one-way stamps, as the agent's echo and then the client
/// read it: the readers agree with the layout, and the echo's stamps read back.
pub fn stamps(data: &[u8]) -> bool {
    const T2: u64 = 0x0102_0304_0506_0708;
    const T3: u64 = u64::MAX - 1;
    const T3_LATER: u64 = 0x8000_0000_0000_0001;
    let min = stamps::ONE_WAY_MIN_MSG as usize;
    let long = data.len() >= min;

    let wants = stamps::udp_wants_stamps(data);
    assert_eq!(wants, long && data[0] & stamps::UDP_STAMP_REQUEST != 0);
    let seq = stamps::udp_seq(data);
    if data.len() >= 8 {
        assert_eq!(seq, be_u64(data) & !(0xc0 << 56), "flag bits cleared");
    } else {
        assert_eq!(seq, 0);
    }
    let udp = stamps::udp_reply_stamps(data);
    assert_eq!(udp.is_some(), long && data[0] & stamps::UDP_STAMPED != 0);
    let tcp = stamps::tcp_reply_stamps(data);
    assert_eq!(tcp.is_some(), long && data[..4] == stamps::TCP_STAMPED);
    if let Some(t) = udp.or(tcp) {
        assert_eq!(t, (be_u64(&data[8..]), be_u64(&data[16..])));
    }
    let mut framed = false;
    for max in [u32::MAX, 65_536, stamps::ONE_WAY_MIN_MSG, 0] {
        if let Some(size) = stamps::tcp_request_size(data, max) {
            assert_eq!(data[..4], stamps::TCP_STAMP_REQUEST);
            assert_eq!(size, be_u32(&data[4..]));
            assert!((stamps::ONE_WAY_MIN_MSG..=max).contains(&size));
            framed = true;
        }
    }

    // The echo stamps whatever it is given, then the client reads the stamps back.
    let mut echo = data.to_vec();
    stamps::write_agent_stamps(&mut echo, T2, T3);
    if long {
        assert_eq!(echo[min..], data[min..], "the payload is untouched");
        if data[..4] == stamps::TCP_STAMP_REQUEST {
            assert_eq!(echo[..4], stamps::TCP_STAMPED);
            assert_eq!(echo[4..8], data[4..8], "the size stays");
            assert_eq!(stamps::tcp_reply_stamps(&echo), Some((T2, T3)));
        } else {
            assert_eq!(echo[0], data[0] | stamps::UDP_STAMPED);
            assert_eq!(echo[1..8], data[1..8], "the sequence number stays");
            assert_eq!(stamps::udp_seq(&echo), seq);
            assert_eq!(stamps::udp_reply_stamps(&echo), Some((T2, T3)));
        }
    } else {
        assert_eq!(echo, data, "too short to stamp: left alone");
    }
    stamps::write_agent_send_stamp(&mut echo, T3_LATER);
    if long {
        let read = stamps::tcp_reply_stamps(&echo).or(stamps::udp_reply_stamps(&echo));
        assert_eq!(read, Some((T2, T3_LATER)));
    }
    wants || udp.is_some() || tcp.is_some() || framed
}

// ---------------------------------------------------------------------------------------------
// iperf3

/// An iperf3 client's parameter JSON, read as a server reads it; what was read writes back as
/// JSON that reads to the same parameters (except `len` and `pacing_timer` of 0, which a real
/// client leaves out and a server reads as its defaults).
pub fn iperf3_params(data: &[u8]) -> bool {
    let Ok(p) = iperf3::Params::from_json(data) else {
        return false;
    };
    let _ = (p.udp(), p.streams());
    for i in [0, 1, usize::MAX] {
        let _ = p.client_sends(i);
    }
    let text = p.to_json();
    let back = iperf3::Params::from_json(&text)
        .unwrap_or_else(|e| panic!("to_json writes what from_json reads: {e}"));
    let defaults = iperf3::Params::default();
    let expected = iperf3::Params {
        len: if p.len == 0 { defaults.len } else { p.len },
        pacing_timer: if p.pacing_timer == 0 {
            defaults.pacing_timer
        } else {
            p.pacing_timer
        },
        ..p
    };
    assert_eq!(back, expected, "params round trip through {text:?}");
    true
}

/// iperf3 results JSON (either side's): read, written back, read again to the same results
/// (floats to within serde_json's parsing precision); stream IDs map to indexes and back.
pub fn iperf3_results(data: &[u8]) -> bool {
    let Ok(r) = iperf3::Results::from_json(data) else {
        return false;
    };
    for s in &r.streams {
        match iperf3::stream_index(s.id) {
            Some(i) => assert_eq!(iperf3::stream_id(i), s.id),
            None => assert!(s.id == 0 || s.id == 2),
        }
    }
    let text = r.to_json();
    let back = iperf3::Results::from_json(&text)
        .unwrap_or_else(|e| panic!("to_json writes what from_json reads: {e}"));
    assert_results_eq(&back, &r);
    true
}

/// Whether two floats are the same number, allowing the last bit or two that serde_json's
/// parser (without `float_roundtrip`) may get wrong.
fn close(a: f64, b: f64) -> bool {
    a == b || (a - b).abs() <= 1e-15 * a.abs().max(b.abs()) || (a - b).abs() <= f64::MIN_POSITIVE
}

fn values_close(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => {
            if x.is_f64() || y.is_f64() {
                matches!((x.as_f64(), y.as_f64()), (Some(x), Some(y)) if close(x, y))
            } else {
                x == y
            }
        }
        (Value::Array(x), Value::Array(y)) => {
            x.len() == y.len() && x.iter().zip(y).all(|(x, y)| values_close(x, y))
        }
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .zip(y)
                    .all(|((kx, vx), (ky, vy))| kx == ky && values_close(vx, vy))
        }
        _ => a == b,
    }
}

fn assert_results_eq(back: &iperf3::Results, r: &iperf3::Results) {
    let floats = |r: &iperf3::Results| [r.cpu_util_total, r.cpu_util_user, r.cpu_util_system];
    for (a, b) in floats(back).into_iter().zip(floats(r)) {
        assert!(close(a, b), "cpu figure {a} != {b}");
    }
    assert_eq!(back.sender_has_retransmits, r.sender_has_retransmits);
    assert_eq!(back.congestion_used, r.congestion_used);
    assert_eq!(back.server_output_text, r.server_output_text);
    match (&back.server_output_json, &r.server_output_json) {
        (Some(a), Some(b)) => assert!(values_close(a, b), "server_output_json {a} != {b}"),
        (a, b) => assert_eq!(a, b),
    }
    assert_eq!(back.streams.len(), r.streams.len());
    for (a, b) in back.streams.iter().zip(&r.streams) {
        let ints = |s: &iperf3::StreamResults| {
            (
                s.id,
                s.bytes,
                s.retransmits,
                s.errors,
                s.packets,
                s.omitted_errors,
                s.omitted_packets,
            )
        };
        assert_eq!(ints(a), ints(b), "stream round trip");
        for (x, y) in [
            (a.jitter, b.jitter),
            (a.start_time, b.start_time),
            (a.end_time, b.end_time),
        ] {
            assert!(close(x, y), "stream figure {x} != {y}");
        }
    }
}

/// A JSON message as it arrives on an iperf3 control connection: the 4-byte length, checked
/// before anything is allocated, then the body, read as parameters and as results.
pub fn iperf3_json_len(data: &[u8]) -> bool {
    assert_eq!(
        iperf3::json_prefix(data),
        u32::try_from(data.len()).unwrap_or(u32::MAX).to_be_bytes()
    );
    let Some(prefix) = data.get(..4) else {
        return false;
    };
    let n = be_u32(prefix);
    let Ok(len) = iperf3::json_len([prefix[0], prefix[1], prefix[2], prefix[3]]) else {
        assert!(
            n == 0 || n > iperf3::MAX_JSON_LEN,
            "refused a length of {n}"
        );
        return false;
    };
    assert!((1..=iperf3::MAX_JSON_LEN).contains(&n) && len == n as usize);
    if let Some(body) = data.get(4..4 + len) {
        iperf3_params(body);
        iperf3_results(body);
    }
    true
}

/// The 37-byte cookie at the front of a control connection, then the first bytes of a data
/// connection compared with it as C strings; also a fresh cookie made from the same bytes.
pub fn iperf3_cookie(data: &[u8]) -> bool {
    let Some(bytes) = data.get(..iperf3::COOKIE_LEN) else {
        return false;
    };
    let mut b = [0u8; iperf3::COOKIE_LEN];
    b.copy_from_slice(bytes);
    let c = iperf3::Cookie::from_bytes(b);
    assert_eq!(c.as_bytes(), &b);
    let c_str = |s: &[u8]| -> Vec<u8> { s.iter().copied().take_while(|&x| x != 0).collect() };
    assert_eq!(c.text(), String::from_utf8_lossy(&c_str(&b)));
    assert!(c.matches(&b), "a cookie matches itself");
    let other = &data[iperf3::COOKIE_LEN..];
    assert_eq!(c.matches(other), c_str(&b) == c_str(other));
    let _ = format!("{c:?}");

    let mut random = [0u8; iperf3::COOKIE_LEN - 1];
    random.copy_from_slice(&b[..iperf3::COOKIE_LEN - 1]);
    let fresh = iperf3::Cookie::from_random(&random);
    assert_eq!(fresh.as_bytes()[36], 0);
    assert!(fresh.as_bytes()[..36]
        .iter()
        .all(|x| iperf3::COOKIE_ALPHABET.contains(x)));
    assert_eq!(fresh.text().len(), 36);
    assert!(fresh.matches(fresh.as_bytes()));
    true
}

/// State bytes on an iperf3 control connection, and the 8 bytes after a `SERVER_ERROR`: every
/// defined state encodes back to its byte, and an error payload encodes back to itself.
pub fn iperf3_server_error(data: &[u8]) -> bool {
    let mut decoded = false;
    for &b in data {
        if let Some(s) = iperf3::State::from_byte(b) {
            assert_eq!(s.byte(), b, "state byte round trip");
            decoded = true;
        }
    }
    if let Some(payload) = data.get(1..1 + iperf3::SERVER_ERROR_PAYLOAD_LEN) {
        let mut p = [0u8; iperf3::SERVER_ERROR_PAYLOAD_LEN];
        p.copy_from_slice(payload);
        let (code, os) = iperf3::decode_server_error(p);
        let wire = iperf3::encode_server_error(code, os);
        assert_eq!(wire[0], iperf3::State::ServerError.byte());
        assert_eq!(wire[1..], p, "SERVER_ERROR round trip");
        assert!(!iperf3::error_message(code).is_empty());
        let _ = iperf3::error_has_os_errno(code);
        decoded = true;
    }
    decoded
}

/// The header of an iperf3 UDP datagram, read with 32- and 64-bit counters: it encodes back, and
/// a valid clock (microseconds below a second) survives nanoseconds and back.
pub fn iperf3_udp_header(data: &[u8]) -> bool {
    let mut decoded = false;
    for seq64 in [false, true] {
        let len = Iperf3UdpHeader::len(seq64);
        let Ok(h) = Iperf3UdpHeader::read(data, seq64) else {
            assert!(data.len() < len, "only a short datagram is refused");
            continue;
        };
        let mut wire = [0u8; 16];
        h.write(&mut wire, seq64);
        assert_eq!(wire[..len], data[..len], "header encodes back");
        let ns = h.ns();
        if h.usec < 1_000_000 {
            assert_eq!(Iperf3UdpHeader::at(h.seq, ns), h, "clock round trip");
        }
        decoded = true;
    }
    decoded
}

// ---------------------------------------------------------------------------------------------
// sockperf

/// A sockperf byte stream (TCP) or datagram (UDP), framed with several receivers' maxima: every
/// message framed fits the buffer and the limits, a length that can never frame is refused, a
/// header encodes back, and the reply differs from the request in the client bit only.
pub fn sockperf_header(data: &[u8]) -> bool {
    use sockperf::{make_reply, parse, write_request, Flags, Header, Parsed, HEADER_LEN, MIN_MSG};

    let Ok(h) = Header::decode(data) else {
        assert!(data.len() < HEADER_LEN);
        let mut copy = data.to_vec();
        assert!(
            !make_reply(&mut copy) && copy == data,
            "too short to answer"
        );
        return false;
    };
    assert_eq!(h.encode()[..], data[..HEADER_LEN], "header encodes back");
    let mut reply = data.to_vec();
    assert!(make_reply(&mut reply));
    let r = Header::decode(&reply).expect("a reply has a header");
    assert_eq!(
        r,
        Header {
            flags: h.flags.without(Flags::CLIENT),
            ..h
        }
    );
    assert!(
        !r.counted_by_server() && !r.wants_reply(),
        "a server ignores replies"
    );
    assert_eq!(reply[..9], data[..9]);
    assert_eq!(reply[10..], data[10..], "only the client bit changes");
    assert!(!h.wants_reply() || h.counted_by_server());

    for max in [
        sockperf::MAX_UDP_MSG,
        sockperf::MAX_TCP_MSG,
        MIN_MSG,
        0,
        u32::MAX,
    ] {
        let mut at = 0;
        loop {
            let rest = &data[at..];
            match parse(rest, max) {
                Parsed::Message(m) => {
                    let len = m.length as usize;
                    assert!(m.length >= MIN_MSG && m.length <= max && len <= rest.len());
                    assert_eq!(Header::decode(rest), Ok(m));
                    let mut msg = rest[..len].to_vec();
                    write_request(m.seq, m.flags, &mut msg).expect("a message holds a header");
                    assert_eq!(msg, rest[..len], "a request encodes back");
                    at += len;
                }
                Parsed::Incomplete { need } => {
                    assert!(need > rest.len() && need >= HEADER_LEN);
                    if let Ok(m) = Header::decode(rest) {
                        assert!((MIN_MSG..=max).contains(&m.length));
                        assert_eq!(need, m.length as usize);
                    }
                    break;
                }
                Parsed::TooShort(m) => {
                    assert!(m.length < MIN_MSG && Header::decode(rest) == Ok(m));
                    break;
                }
                Parsed::TooLong(m) => {
                    assert!(m.length > max && m.length >= MIN_MSG && Header::decode(rest) == Ok(m));
                    break;
                }
            }
        }
    }
    true
}

// ---------------------------------------------------------------------------------------------
// Seeds: real encodings, from this crate's encoders and the captures in docs/protocols/iperf3.md and sockperf.md.

fn sample_host() -> HostInfo {
    HostInfo {
        sonde_version: Some("0.1.0".into()),
        host_name: Some("b".into()),
        cpu_model: Some("AMD EPYC 7763 64-Core Processor".into()),
        cpu_logical_count: Some(2),
        cpu_available_count: Some(2),
        memory_bytes: Some(24 << 30),
        os_name: Some("Debian GNU/Linux 12 (bookworm)".into()),
        os_version: Some("12".into()),
        kernel_name: Some("Linux".into()),
        kernel_release: Some("6.1.0-18-amd64".into()),
        architecture: Some("x86_64".into()),
        interfaces: vec![NicInfo {
            name: "eth0".into(),
            driver: Some("virtio_net".into()),
            speed_mbit_per_second: None,
            mtu_bytes: Some(1500),
            up: Some(true),
            offloads: NicOffloads {
                gso: Some(true),
                gro: Some(true),
                tso: Some(false),
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

fn control_messages() -> Vec<ControlMsg> {
    let spec = TestSpec {
        kind: TestKind::Throughput,
        protocol: Protocol::Udp,
        direction: Direction::Bidir,
        streams: 2,
        msg_size: 1200,
        bitrate_per_stream: 50_000_000,
        duration_ms: 10_000,
        interval_ms: 1_000,
        read_size: 65_536,
        socket: Default::default(),
        omit_ms: 0,
        skip_rx_copy: false,
        bytes: 0,
        blocks: 0,
        request_response: None,
    };
    let info = TcpInfoStats {
        stream: 1,
        srtt_ns: Some(50_000),
        cwnd: Some(10),
        app_limited: Some(false),
        ..TcpInfoStats::default()
    };
    let stats = StreamStats {
        stream: 1,
        bytes: 1_000_000,
        packets: 800,
        active_ns: 10_000_000_000,
        lost: Some(2),
        jitter_ns: Some(1_500),
        tcp_info: Some(info),
        ..StreamStats::default()
    };
    let interval = IntervalStats {
        start_ns: 0,
        end_ns: 1_000_000_000,
        streams: vec![0, 1],
        bytes: vec![10, 20],
        packets: vec![1, 2],
        tcp_info: vec![info],
        interface: None,
    };
    vec![
        ControlMsg::Hello {
            protocol: PROTOCOL_VERSION,
            software: "sonde 0.1.0".into(),
            nonce: crate::auth::Nonce([0x5a; 32]),
        },
        ControlMsg::Welcome {
            protocol: PROTOCOL_VERSION,
            software: "sonde 0.1.0".into(),
            session: SessionId(3),
            limits: Limits {
                max_sessions: 16,
                max_duration_ms: 300_000,
                max_streams: 128,
                max_msg_size: 65_536,
                request_response: false,
            },
            nonce: crate::auth::Nonce([0xa5; 32]),
            secret_required: true,
        },
        ControlMsg::Refused {
            reason: Refusal::Busy,
            message: "16 sessions running".into(),
        },
        ControlMsg::Start {
            spec: spec.clone(),
            proof: None,
            tuning: crate::Tuning::default(),
            token: None,
        },
        ControlMsg::Start {
            spec,
            proof: Some(crate::auth::Proof([0x11; 32])),
            tuning: crate::Tuning {
                busy_poll: true,
                pin: false,
            },
            token: None,
        },
        ControlMsg::Accepted {
            token: Token(u64::MAX),
            host: Some(Box::new(sample_host())),
            agent: Some(crate::AgentTag {
                id: AgentId(0x0102_0304_0506_0708),
                addr: "198.18.11.2:5300".into(),
            }),
        },
        ControlMsg::Describe { proof: None },
        ControlMsg::Description {
            host: Some(Box::new(sample_host())),
        },
        ControlMsg::Ready,
        ControlMsg::Go,
        ControlMsg::Interval(interval.clone()),
        ControlMsg::SenderDone {
            streams: vec![stats.clone()],
        },
        ControlMsg::Finish,
        ControlMsg::Report(AgentReport {
            received: vec![stats.clone()],
            sent: vec![stats.clone()],
            echoed: vec![stats],
            intervals: vec![interval],
            overlapping_sessions: 1,
            crr: Some(CrrReport {
                transactions: 12_345,
                active_ns: 2_000_000_000,
                failed: 2,
            }),
            cpu: Some(CpuReport {
                wall_ns: 1,
                user_ns: 2,
                system_ns: 3,
                voluntary_switches: Some(4),
                involuntary_switches: Some(5),
                syscalls: Some(6),
                messages: None,
                bytes: Some(7),
                system_interrupts: Some(8),
                system_context_switches: Some(9),
                system_syscalls: None,
                system_softirq_ns: Some(11),
            }),
            tuning: Some(Box::new(crate::TuningReport {
                busy_poll: true,
                so_busy_poll_us: None,
                cpus: vec![1],
                note: None,
            })),
            read_size: Some(1),
            socket: Default::default(),
            skip_rx_copy: Some(true),
            interface: Some(Box::new(crate::InterfaceDelta {
                name: "eth0".into(),
                driver_name: Some("ena".into()),
                duration_ns: 1,
                rx_packets: 2,
                tx_packets: 3,
                rx_bytes: 4,
                tx_bytes: 5,
                rx_dropped: 6,
                tx_dropped: 7,
                rx_errors: 8,
                tx_errors: 9,
                driver: [("pps_allowance_exceeded".to_owned(), 10)].into(),
            })),
        }),
        ControlMsg::Error {
            message: "receiver failed".into(),
        },
        ControlMsg::ClockProbe { client_send_ns: 7 },
        ControlMsg::ClockReply {
            client_send_ns: 7,
            agent_receive_ns: 8,
            agent_send_ns: 9,
        },
    ]
}

fn mesh_probe_seeds() -> Vec<Vec<u8>> {
    use crate::probe::{Probe, ProbeReply, MAX_PROBE_LEN};
    let secret = crate::auth::Secret::new(b"fuzz".to_vec()).unwrap_or_else(|_| unreachable!());
    let mut out = Vec::new();
    for (sender, len) in [
        ("a", 0),
        ("198.18.0.2", 64),
        ("node-with-a-longer-name", 1_400),
    ] {
        let p = Probe {
            seq: 9,
            sent_unix_ns: 1_800_000_000_000_000_000,
            nonce: 0x0123_4567_89ab_cdef,
            sender,
        };
        let mut b = [0u8; MAX_PROBE_LEN];
        let n = p
            .encode(&secret, len, &mut b)
            .unwrap_or_else(|_| unreachable!());
        out.push(b[..n].to_vec());
        let mut r = [0u8; MAX_PROBE_LEN];
        let m = ProbeReply::answer(&secret, &p, n, &mut r).unwrap_or_else(|_| unreachable!());
        out.push(r[..m].to_vec());
    }
    out
}

fn control_frame_seeds() -> Vec<Vec<u8>> {
    let msgs = control_messages();
    let mut seeds: Vec<Vec<u8>> = msgs
        .iter()
        .map(|m| {
            let mut b = Vec::new();
            encode_frame(m, &mut b).expect("a seed encodes");
            b
        })
        .collect();
    // A client's first frames back to back, as the agent reads them from one stream.
    seeds.push(
        seeds[0]
            .iter()
            .chain(&seeds[3])
            .chain(&seeds[6])
            .copied()
            .collect(),
    );
    seeds
}

fn host_info_seeds() -> Vec<Vec<u8>> {
    vec![
        serde_json::to_vec(&sample_host()).expect("a seed encodes"),
        serde_json::to_vec(&HostInfo::default()).expect("a seed encodes"),
        br#"{"host_name":"b","interfaces":[{"name":"eth1","mtu_bytes":9000}]}"#.to_vec(),
    ]
}

fn preamble_seeds() -> Vec<Vec<u8>> {
    [Channel::Control, Channel::Data, Channel::Crr]
        .into_iter()
        .map(|channel| {
            Preamble {
                version: PROTOCOL_VERSION,
                channel,
            }
            .encode()
            .to_vec()
        })
        .collect()
}

fn data_join_seeds() -> Vec<Vec<u8>> {
    [false, true]
        .map(|answer| {
            DataJoin {
                token: Token(0x0102_0304_0506_0708),
                stream: 3,
                answer,
            }
            .encode()
            .to_vec()
        })
        .to_vec()
}

fn join_answer_seeds() -> Vec<Vec<u8>> {
    [
        JoinOutcome::Joined,
        JoinOutcome::NoSuchSession,
        JoinOutcome::OtherAddress,
    ]
    .into_iter()
    .map(|outcome| {
        JoinAnswer {
            outcome,
            agent: AgentId(0x0102_0304_0506_0708),
        }
        .encode()
        .to_vec()
    })
    .collect()
}

fn udp_elsewhere_seeds() -> Vec<Vec<u8>> {
    vec![UdpElsewhere {
        flow: 3,
        token: Token(0x0102_0304_0506_0708),
        agent: AgentId(0x1112_1314_1516_1718),
        outcome: JoinOutcome::NoSuchSession,
    }
    .encode()
    .to_vec()]
}

fn crr_join_seeds() -> Vec<Vec<u8>> {
    [true, false]
        .into_iter()
        .map(|rst| {
            CrrJoin {
                token: Token(0x0102_0304_0506_0708),
                worker: 7,
                rst,
                response_size: 64,
                answer: false,
            }
            .encode()
            .to_vec()
        })
        .collect()
}

fn udp_join_seeds() -> Vec<Vec<u8>> {
    [false, true]
        .into_iter()
        .map(|ack| {
            UdpJoin {
                ack,
                flow: 3,
                token: Token(0x0102_0304_0506_0708),
                mac: [0x33; crate::auth::JOIN_MAC_LEN],
            }
            .encode()
            .to_vec()
        })
        .collect()
}

fn data_header_seeds() -> Vec<Vec<u8>> {
    // A pps datagram (18 bytes) and a bare header.
    let mut pps = vec![0u8; 18];
    DataHeader {
        seq: 41,
        send_ns: 123_456_789,
    }
    .write(&mut pps);
    vec![pps[..DATA_HEADER_LEN].to_vec(), pps]
}

fn pps_header_seeds() -> Vec<Vec<u8>> {
    // A `-m 14` datagram, and a 15-byte one.
    let mut pps = vec![0u8; 15];
    PpsHeader {
        seq: 41,
        send_ns: 123_456_789,
    }
    .write(&mut pps);
    vec![pps[..PPS_HEADER_LEN].to_vec(), pps]
}

fn latency_seq_seeds() -> Vec<Vec<u8>> {
    // The expected sequence number, then a latency datagram of 1, 2 and 64 bytes.
    [(0x1_0300u64, 1usize), (0x2ff, 2), (41, 64)]
        .into_iter()
        .map(|(expected, size)| {
            let mut b = expected.to_be_bytes().to_vec();
            let mut msg = vec![0u8; size];
            write_latency_seq(expected.saturating_sub(1), &mut msg);
            b.extend(msg);
            b
        })
        .collect()
}

fn stamps_seeds() -> Vec<Vec<u8>> {
    let mut udp = vec![0u8; 64];
    stamps::write_udp_request(41, &mut udp);
    let mut udp_reply = udp.clone();
    stamps::write_agent_stamps(&mut udp_reply, 1_000, 1_250);
    let mut tcp = vec![0u8; 64];
    stamps::write_tcp_request(64, &mut tcp);
    let mut tcp_reply = tcp.clone();
    stamps::write_agent_stamps(&mut tcp_reply, 1_000, 1_250);
    vec![udp, udp_reply, tcp, tcp_reply]
}

/// [verified] parameters of a 1-second TCP test, and a real client using most options
/// (docs/protocols/iperf3.md §5, §6).
const IPERF3_PARAMS: [&str; 2] = [
    r#"{"tcp":true,"omit":0,"time":1,"num":0,"blockcount":0,"parallel":1,"len":131072,"bandwidth":20000000,"pacing_timer":1000,"client_version":"3.12"}"#,
    r#"{"tcp":true,"omit":0,"server_affinity":0,"time":1,"num":0,"blockcount":0,"MSS":1400,"nodelay":true,"parallel":1,"window":65536,"len":131072,"bandwidth":5000000,"fqrate":10000000,"pacing_timer":1000,"burst":3,"TOS":16,"title":"hello","extra_data":"xyz","congestion":"cubic","get_server_output":1,"udp_counters_64bit":1,"repeating_payload":1,"zerocopy":1,"client_version":"3.12"}"#,
];

/// [verified] a 3.12 server's UDP receiver results (docs/protocols/iperf3.md §10), a 3.17.1 client's UDP
/// sender results, and the smallest server results real clients accepted.
const IPERF3_RESULTS: [&str; 3] = [
    r#"{"cpu_util_total":0.0152,"cpu_util_user":0.0151,"cpu_util_system":0,"sender_has_retransmits":18446744073709551615,"server_output_text":"Accepted connection from 127.0.0.1, port 56772\n","streams":[{"id":1,"bytes":131072,"retransmits":18446744073709551615,"jitter":3.672119140625e-06,"errors":0,"packets":4,"start_time":0,"end_time":1.000149}]}"#,
    r#"{"cpu_util_total":100.84,"cpu_util_user":100.44,"cpu_util_system":0.40,"sender_has_retransmits":0,"streams":[{"id":1,"bytes":125000,"retransmits":-1,"jitter":0,"errors":0,"omitted_errors":0,"packets":125,"omitted_packets":0,"start_time":0,"end_time":1.00034}]}"#,
    r#"{"cpu_util_total":0.5,"cpu_util_user":0.25,"cpu_util_system":0.25,"sender_has_retransmits":-1,"streams":[{"id":1,"bytes":1310720,"retransmits":-1,"jitter":0,"errors":0,"packets":0}]}"#,
];

fn iperf3_params_seeds() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = IPERF3_PARAMS
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
    let udp = iperf3::Params {
        protocol: iperf3::Protocol::Udp,
        parallel: 4,
        bidirectional: true,
        len: 1448,
        bandwidth: 1_000_000,
        ..iperf3::Params::default()
    };
    seeds.push(udp.to_json());
    seeds
}

fn iperf3_results_seeds() -> Vec<Vec<u8>> {
    let mut seeds: Vec<Vec<u8>> = IPERF3_RESULTS
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
    let with_output = iperf3::Results {
        sender_has_retransmits: 1,
        congestion_used: Some("cubic".into()),
        server_output_json: Some(serde_json::json!({
            "start": {"version": "sonde"},
            "intervals": [{"sum": {"bits_per_second": 9.5e8, "omitted": false}}],
        })),
        streams: vec![iperf3::StreamResults {
            id: 3,
            bytes: 1 << 30,
            retransmits: 12,
            end_time: 10.000_25,
            ..iperf3::StreamResults::default()
        }],
        ..iperf3::Results::default()
    };
    seeds.push(with_output.to_json());
    seeds
}

fn iperf3_json_len_seeds() -> Vec<Vec<u8>> {
    IPERF3_PARAMS
        .iter()
        .chain(IPERF3_RESULTS.iter().take(1))
        .map(|s| {
            let mut b = iperf3::json_prefix(s.as_bytes()).to_vec();
            b.extend_from_slice(s.as_bytes());
            b
        })
        .collect()
}

fn iperf3_cookie_seeds() -> Vec<Vec<u8>> {
    // [verified] docs/protocols/iperf3.md §4: the control cookie, then a data connection's.
    let mut cookie = b"rdik6lwipp6z4stdqzvz5yrtjgmtn7t6dy55".to_vec();
    cookie.push(0);
    let twice = [cookie.clone(), cookie.clone()].concat();
    let fresh = iperf3::Cookie::from_random(&[7; iperf3::COOKIE_LEN - 1]);
    vec![twice, cookie, fresh.as_bytes().to_vec()]
}

fn iperf3_server_error_seeds() -> Vec<Vec<u8>> {
    // [verified] docs/protocols/iperf3.md §2: IESETMSS with EINVAL; and a state sequence a client reads.
    let states = [
        iperf3::State::ParamExchange,
        iperf3::State::CreateStreams,
        iperf3::State::TestStart,
        iperf3::State::TestRunning,
        iperf3::State::ExchangeResults,
        iperf3::State::DisplayResults,
        iperf3::State::AccessDenied,
    ];
    vec![
        iperf3::encode_server_error(iperf3::errno::IESETMSS, 22).to_vec(),
        states.iter().map(|s| s.byte()).collect(),
    ]
}

fn iperf3_udp_header_seeds() -> Vec<Vec<u8>> {
    // [verified] docs/protocols/iperf3.md §8: 32-bit and 64-bit counters, as the front of a datagram.
    vec![
        vec![0, 0, 0x01, 0x43, 0, 0x09, 0xc9, 0x8b, 0, 0, 0, 1],
        vec![
            0, 0, 0x01, 0x7a, 0, 0x0d, 0x0e, 0x25, 0, 0, 0, 0, 0, 0, 0, 1, 0x30, 0x31,
        ],
    ]
}

fn sockperf_header_seeds() -> Vec<Vec<u8>> {
    use sockperf::{write_request, Flags};
    // [verified] docs/protocols/sockperf.md §2: a header-only ping-pong request; then a 64-byte one followed
    // by a throughput message on the same stream, as a TCP server reads them.
    let mut pp = vec![0u8; 14];
    write_request(1, Flags::CLIENT | Flags::PONG_REQUEST, &mut pp).expect("14 bytes");
    let mut stream = vec![0x5au8; 64];
    write_request(2, Flags::CLIENT | Flags::PONG_REQUEST, &mut stream).expect("64 bytes");
    let mut tp = vec![0u8; 100];
    write_request(3, Flags::CLIENT, &mut tp).expect("100 bytes");
    stream.extend(tp);
    vec![pp, stream]
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use proptest::test_runner::{Config, TestRunner};

    /// Inputs the fuzzer (or these tests) found that once broke a property: they must keep
    /// passing.
    const FINDINGS: &[(&str, &[u8])] = &[
        // widen_seq of 6 carried bytes (0xff) near 0xffff_ff00_0000_ffff: the nearer value
        // 2^48 up is past u64::MAX, and a saturating add gave u64::MAX instead of
        // 0xffff_0000_0000_00ff.
        (
            "latency_seq",
            &[255, 255, 255, 0, 0, 0, 255, 255, 0, 0, 0, 0, 0, 255],
        ),
    ];

    fn target(name: &str) -> Target {
        *TARGETS
            .iter()
            .find(|t| t.name == name)
            .unwrap_or_else(|| panic!("no target {name}"))
    }

    #[test]
    fn every_seed_decodes_in_its_target() {
        for t in TARGETS {
            let seeds = (t.seeds)();
            assert!(!seeds.is_empty(), "{} has seeds", t.name);
            for (i, seed) in seeds.iter().enumerate() {
                assert!((t.run)(seed), "{} seed {i} decodes", t.name);
            }
        }
    }

    #[test]
    fn fuzzer_findings_stay_fixed() {
        for (name, input) in FINDINGS {
            (target(name).run)(input);
        }
    }

    /// One edit of an input, in the spirit of libFuzzer's mutators.
    #[derive(Debug, Clone)]
    enum Edit {
        /// Flip one bit.
        Flip(usize, u8),
        /// Set one byte.
        Set(usize, u8),
        /// Insert one byte.
        Insert(usize, u8),
        /// Remove one byte.
        Remove(usize),
        /// Cut the input short.
        Truncate(usize),
        /// Insert a token that decoders treat specially.
        Token(usize, usize),
        /// Repeat a stretch of the input.
        Repeat(usize, usize),
    }

    /// JSON syntax and the numbers cJSON and serde read differently, and the bytes that frame
    /// binary headers.
    const TOKENS: &[&[u8]] = &[
        b"\"",
        b"{",
        b"}",
        b"[",
        b"]",
        b",",
        b":",
        b"null",
        b"true",
        b"-1",
        b"1e999",
        b"-0",
        b"1.5",
        b"18446744073709551615",
        b"9223372036854775808",
        b"\\u0000",
        b"\\ud800",
        b"{}",
        b"[{}]",
        b"\xff\xff\xff\xff",
        b"\x00\x00\x00\x00",
        b"\x80\x00\x00\x00\x00\x00\x00\x00",
        b"SNDE",
        b"SNDQ",
        b"SNDR",
    ];

    fn edit() -> impl Strategy<Value = Edit> {
        prop_oneof![
            (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Edit::Flip(at, bit)),
            (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Edit::Set(at, b)),
            (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Edit::Insert(at, b)),
            any::<usize>().prop_map(Edit::Remove),
            any::<usize>().prop_map(Edit::Truncate),
            (any::<usize>(), 0..TOKENS.len()).prop_map(|(at, t)| Edit::Token(at, t)),
            (any::<usize>(), 1usize..64).prop_map(|(at, n)| Edit::Repeat(at, n)),
        ]
    }

    fn apply(mut b: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
        for e in edits {
            let n = b.len();
            // Positions are taken modulo the input's length (plus one where appending is
            // possible), so every edit applies to any input.
            match *e {
                Edit::Flip(at, bit) if n > 0 => b[at % n] ^= 1 << bit,
                Edit::Set(at, v) if n > 0 => b[at % n] = v,
                Edit::Insert(at, v) => b.insert(at % (n + 1), v),
                Edit::Remove(at) if n > 0 => {
                    b.remove(at % n);
                }
                Edit::Truncate(at) => b.truncate(at % (n + 1)),
                Edit::Token(at, t) => {
                    let at = at % (n + 1);
                    b.splice(at..at, TOKENS[t].iter().copied());
                }
                Edit::Repeat(at, len) if n > 0 => {
                    let at = at % n;
                    let piece: Vec<u8> = b[at..(at + len).min(n)].to_vec();
                    b.splice(at..at, piece);
                }
                _ => {}
            }
        }
        b
    }

    /// Every target over thousands of inputs on stable: its seeds with a few edits each, and
    /// random bytes. A failure prints the (shrunk) input; add it to `FINDINGS` once fixed.
    #[test]
    fn every_target_keeps_its_properties_over_mutated_seeds() {
        for t in TARGETS {
            let seeds = (t.seeds)();
            let input = prop_oneof![
                4 => (0..seeds.len(), proptest::collection::vec(edit(), 0..6))
                    .prop_map(|(i, edits)| apply(seeds[i].clone(), &edits)),
                1 => proptest::collection::vec(any::<u8>(), 0..128),
            ];
            let mut runner = TestRunner::new(Config {
                cases: 3000,
                failure_persistence: None,
                ..Config::default()
            });
            // The runner takes a `Fn`: the count goes through a `Cell`.
            let decoded = std::cell::Cell::new(0u32);
            let result = runner.run(&input, |bytes| {
                if (t.run)(&bytes) {
                    decoded.set(decoded.get() + 1);
                }
                Ok(())
            });
            if let Err(e) = result {
                panic!("fuzz target {}: {e}", t.name);
            }
            // Unless some inputs decode, the round-trip properties were never checked.
            assert!(decoded.get() > 0, "{}: nothing decoded", t.name);
        }
    }

    /// Each cargo-fuzz target calls its body here, and each body here has a target: a decoder
    /// cannot be fuzzed on nightly without the stable test above running it too.
    #[test]
    fn the_fuzz_crate_has_one_target_per_body() {
        let fuzz = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz");
        let manifest = std::fs::read_to_string(fuzz.join("Cargo.toml")).expect("fuzz/Cargo.toml");
        let mut files: Vec<String> = std::fs::read_dir(fuzz.join("fuzz_targets"))
            .expect("fuzz/fuzz_targets")
            .map(|e| {
                e.expect("a directory entry")
                    .file_name()
                    .to_string_lossy()
                    .into_owned()
            })
            .collect();
        files.sort();
        let mut names: Vec<String> = TARGETS.iter().map(|t| format!("{}.rs", t.name)).collect();
        names.sort();
        assert_eq!(files, names, "fuzz/fuzz_targets/ against TARGETS");
        for t in TARGETS {
            let source =
                std::fs::read_to_string(fuzz.join("fuzz_targets").join(format!("{}.rs", t.name)))
                    .expect("a target's source");
            assert!(
                source.contains(&format!("sonde_wire::fuzzing::{}(", t.name)),
                "fuzz_targets/{}.rs calls its body",
                t.name
            );
            assert!(
                manifest.contains(&format!("name = \"{}\"", t.name)),
                "fuzz/Cargo.toml has a [[bin]] {}",
                t.name
            );
        }
    }

    /// Writes every target's seeds to `$SONDE_FUZZ_SEEDS/<target>/` for `fuzz/run`.
    #[test]
    #[ignore = "a tool for fuzz/run: SONDE_FUZZ_SEEDS=DIR cargo test -p sonde-wire --lib write_fuzz_seeds -- --ignored"]
    fn write_fuzz_seeds() {
        let dir = std::env::var_os("SONDE_FUZZ_SEEDS").expect("SONDE_FUZZ_SEEDS=DIR");
        let dir = std::path::Path::new(&dir);
        for t in TARGETS {
            let sub = dir.join(t.name);
            std::fs::create_dir_all(&sub).expect("create the seed directory");
            for (i, seed) in (t.seeds)().iter().enumerate() {
                std::fs::write(sub.join(format!("seed-{i}")), seed).expect("write a seed");
            }
        }
    }
}
