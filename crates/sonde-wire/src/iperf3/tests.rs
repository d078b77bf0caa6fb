use super::*;
use proptest::prelude::*;

#[test]
fn cookie_from_random_uses_the_alphabet_and_ends_in_nul() {
    let c = Cookie::from_random(&[255; 36]);
    assert_eq!(c.as_bytes()[36], 0);
    assert!(c.as_bytes()[..36]
        .iter()
        .all(|b| COOKIE_ALPHABET.contains(b)));
    assert_eq!(c.text(), "7".repeat(36));
    let c = Cookie::from_random(&std::array::from_fn(|i| u8::try_from(i).unwrap()));
    assert_eq!(c.text(), "abcdefghijklmnopqrstuvwxyz234567abcd");
}

#[test]
fn cookie_compares_as_a_c_string() {
    // [verified] example cookie from docs/protocols/iperf3.md §4.
    let mut b = [0u8; COOKIE_LEN];
    b[..36].copy_from_slice(b"rdik6lwipp6z4stdqzvz5yrtjgmtn7t6dy55");
    let c = Cookie::from_bytes(b);
    assert_eq!(c.text(), "rdik6lwipp6z4stdqzvz5yrtjgmtn7t6dy55");
    assert!(c.matches(&b));
    let mut trailing = b;
    trailing[36] = 0;
    assert!(c.matches(&trailing));
    let mut wrong = b;
    wrong[0] = b'x';
    assert!(!c.matches(&wrong));
    // Bytes after the NUL do not count; a prefix does not match.
    let mut short = [0u8; COOKIE_LEN];
    short[..10].copy_from_slice(&b[..10]);
    short[11] = b'z';
    assert!(!c.matches(&short));
    assert!(Cookie::from_bytes(short).matches(&b[..10]));
    // No NUL in what arrived: its end is the end of the string.
    let mut full = [b'a'; COOKIE_LEN];
    let c2 = Cookie::from_bytes(full);
    assert!(c2.matches(&full));
    full[36] = 0;
    assert!(!c2.matches(&full));
}

#[test]
fn state_bytes_round_trip() {
    for b in 0..=255u8 {
        if let Some(s) = State::from_byte(b) {
            assert_eq!(s.byte(), b);
        }
    }
    assert_eq!(State::AccessDenied.byte(), 0xff);
    assert_eq!(State::ServerError.byte(), 0xfe);
    assert_eq!(State::from_byte(0x10), Some(State::IperfDone));
    assert_eq!(State::from_byte(0x0d), Some(State::ExchangeResults));
    assert_eq!(State::from_byte(0), None);
    assert_eq!(State::from_byte(17), None);
    assert_eq!(State::from_byte(0xfd), None);
}

#[test]
fn server_error_matches_the_verified_bytes() {
    // [verified] docs/protocols/iperf3.md §2: IESETMSS with EINVAL.
    let b = encode_server_error(errno::IESETMSS, 22);
    assert_eq!(b, [0xfe, 0, 0, 0, 0x7b, 0, 0, 0, 0x16]);
    let payload: [u8; 8] = b[1..].try_into().unwrap();
    assert_eq!(decode_server_error(payload), (123, 22));
    assert_eq!(error_message(123), "unable to set TCP/SCTP MSS");
    assert!(error_has_os_errno(123));
    assert!(!error_has_os_errno(errno::IENUMSTREAMS));
    assert_eq!(
        error_message(errno::IEACCESSDENIED),
        "the server is busy running a test. try again later"
    );
}

#[test]
fn json_len_bounds_the_allocation() {
    assert_eq!(json_len([0, 0, 0, 0x90]), Ok(0x90));
    assert_eq!(json_len([0, 0, 0, 0]), Err(Error::Length(0)));
    assert_eq!(json_len(MAX_JSON_LEN.to_be_bytes()), Ok(1 << 20));
    assert_eq!(
        json_len((MAX_JSON_LEN + 1).to_be_bytes()),
        Err(Error::Length(MAX_JSON_LEN + 1))
    );
    assert!(json_len([0xff; 4]).is_err());
    assert_eq!(json_prefix(&[0; 0x133]), [0, 0, 1, 0x33]);
}

#[test]
fn stream_ids_skip_two() {
    let ids: Vec<u32> = (0..5).map(stream_id).collect();
    assert_eq!(ids, [1, 3, 4, 5, 6]);
    for (i, id) in ids.iter().enumerate() {
        assert_eq!(stream_index(*id), Some(i));
    }
    assert_eq!(stream_index(0), None);
    assert_eq!(stream_index(2), None);
}

#[test]
fn udp_connect_bytes() {
    assert_eq!(UDP_CONNECT_MSG, [0x39, 0x38, 0x37, 0x36]);
    assert_eq!(UDP_CONNECT_REPLY, [0x36, 0x37, 0x38, 0x39]);
    assert_eq!(LEGACY_UDP_CONNECT_MSG, 123_456_789u32.to_le_bytes());
    assert_eq!(LEGACY_UDP_CONNECT_REPLY, 987_654_321u32.to_le_bytes());
}

/// [verified] parameters of a 1-second TCP test, docs/protocols/iperf3.md §5.
const TCP_PARAMS: &str = r#"{"tcp":true,"omit":0,"time":1,"num":0,"blockcount":0,"parallel":1,"len":131072,"bandwidth":20000000,"pacing_timer":1000,"client_version":"3.12"}"#;

/// [verified] key order of a real client using most options, docs/protocols/iperf3.md §6.
const MOST_OPTIONS: &str = r#"{"tcp":true,"omit":0,"server_affinity":0,"time":1,"num":0,"blockcount":0,"MSS":1400,"nodelay":true,"parallel":1,"window":65536,"len":131072,"bandwidth":5000000,"fqrate":10000000,"pacing_timer":1000,"burst":3,"TOS":16,"title":"hello","extra_data":"xyz","congestion":"cubic","get_server_output":1,"udp_counters_64bit":1,"repeating_payload":1,"zerocopy":1,"client_version":"3.12"}"#;

#[test]
fn params_read_the_verified_examples_and_write_them_back_byte_for_byte() {
    assert_eq!(TCP_PARAMS.len(), 0x90, "the verified length prefix");
    let p = Params::from_json(TCP_PARAMS.as_bytes()).unwrap();
    assert_eq!(p.protocol, Protocol::Tcp);
    assert_eq!((p.time, p.parallel, p.len), (1, 1, 131_072));
    assert_eq!((p.bandwidth, p.pacing_timer), (20_000_000, 1000));
    assert_eq!(p.client_version.as_deref(), Some("3.12"));
    assert!(!p.reverse && !p.bidirectional && !p.get_server_output);
    assert_eq!(p.to_json(), TCP_PARAMS.as_bytes());

    let p = Params::from_json(MOST_OPTIONS.as_bytes()).unwrap();
    assert_eq!(p.server_affinity, Some(0));
    assert_eq!((p.mss, p.window, p.burst, p.tos), (1400, 65536, 3, 16));
    assert!(p.nodelay && p.get_server_output && p.udp_counters_64bit && p.repeating_payload);
    assert_eq!(p.title.as_deref(), Some("hello"));
    assert_eq!(p.congestion.as_deref(), Some("cubic"));
    assert_eq!(
        String::from_utf8(p.to_json()).unwrap(),
        MOST_OPTIONS,
        "same keys in the same order"
    );
}

/// [verified] parameters of newer clients, captured on the control connection against
/// `sonde server --iperf3`: 3.16 `-k 4 -l 1K`, 3.17.1 `-u -b 1M --udp-counters-64bit
/// --get-server-output`, and 3.19.1 `-R -b 1M -m --skip-rx-copy`, whose `mptcp` and
/// `skip_rx_copy` keys 3.12–3.17 do not have.
const PARAMS_316_BLOCKS: &str = r#"{"tcp":true,"omit":0,"time":0,"num":0,"blockcount":4,"parallel":1,"len":1024,"pacing_timer":1000,"client_version":"3.16"}"#;
const PARAMS_3171_UDP: &str = r#"{"udp":true,"omit":0,"time":1,"num":0,"blockcount":0,"parallel":1,"len":32768,"bandwidth":1000000,"pacing_timer":1000,"get_server_output":1,"udp_counters_64bit":1,"client_version":"3.17.1"}"#;
const PARAMS_3191_NEW_KEYS: &str = r#"{"tcp":true,"omit":0,"time":1,"num":0,"blockcount":0,"parallel":1,"reverse":true,"mptcp":true,"len":131072,"bandwidth":1000000,"pacing_timer":1000,"skip_rx_copy":1,"client_version":"3.19.1"}"#;

#[test]
fn params_of_316_to_3191_clients_read_and_write_back() {
    // The length prefixes seen on the wire.
    assert_eq!(
        [
            PARAMS_316_BLOCKS.len(),
            PARAMS_3171_UDP.len(),
            PARAMS_3191_NEW_KEYS.len()
        ],
        [0x79, 0xbd, 0xbe]
    );

    let p = Params::from_json(PARAMS_316_BLOCKS.as_bytes()).unwrap();
    assert_eq!((p.time, p.blockcount, p.len), (0, 4, 1024));
    assert_eq!(p.client_version.as_deref(), Some("3.16"));
    assert_eq!(
        p.to_json(),
        PARAMS_316_BLOCKS.as_bytes(),
        "3.12's key order"
    );

    let p = Params::from_json(PARAMS_3171_UDP.as_bytes()).unwrap();
    assert!(p.udp() && p.get_server_output && p.udp_counters_64bit);
    assert_eq!((p.len, p.bandwidth), (32_768, 1_000_000));
    assert_eq!(p.to_json(), PARAMS_3171_UDP.as_bytes());

    // Keys sonde does not act on are read past, and not written back.
    let p = Params::from_json(PARAMS_3191_NEW_KEYS.as_bytes()).unwrap();
    assert!(p.reverse && !p.bidirectional && !p.udp());
    assert_eq!((p.time, p.parallel, p.len), (1, 1, 131_072));
    assert_eq!((p.bandwidth, p.pacing_timer), (1_000_000, 1000));
    assert_eq!(p.client_version.as_deref(), Some("3.19.1"));
    let without_new_keys = PARAMS_3191_NEW_KEYS
        .replace(r#""mptcp":true,"#, "")
        .replace(r#""skip_rx_copy":1,"#, "");
    assert_eq!(String::from_utf8(p.to_json()).unwrap(), without_new_keys);
}

#[test]
fn params_have_the_json_types_a_318_server_requires() {
    // 3.18+ servers look each key up with its type (iperf_cJSON_GetObjectItemType) and
    // silently ignore one of another type: a flag written as 1 would not be a flag there,
    // a count written as `true` would not be a count.
    let all = Params {
        omit: 1,
        server_affinity: Some(1),
        num: 1,
        blockcount: 1,
        mss: 1,
        nodelay: true,
        reverse: true,
        bidirectional: true,
        window: 1,
        bandwidth: 1,
        fqrate: 1,
        burst: 1,
        tos: 1,
        flowlabel: 1,
        title: Some("t".into()),
        extra_data: Some("x".into()),
        congestion: Some("cubic".into()),
        congestion_used: Some("cubic".into()),
        get_server_output: true,
        udp_counters_64bit: true,
        repeating_payload: true,
        zerocopy: 1,
        dont_fragment: 1,
        authtoken: Some("a".into()),
        client_version: Some("3.12".into()),
        ..Params::default()
    };
    let flags = ["tcp", "udp", "sctp", "nodelay", "reverse", "bidirectional"];
    let strings = [
        "title",
        "extra_data",
        "congestion",
        "congestion_used",
        "authtoken",
        "client_version",
    ];
    for protocol in [Protocol::Tcp, Protocol::Udp, Protocol::Sctp] {
        let p = Params {
            protocol,
            ..all.clone()
        };
        let v: Value = serde_json::from_slice(&p.to_json()).unwrap();
        let m = v.as_object().unwrap();
        assert_eq!(m.len(), 30, "every field written once: {v}");
        for (k, val) in m {
            if flags.contains(&k.as_str()) {
                assert_eq!(val, &Value::Bool(true), "{k}: {v}");
            } else if strings.contains(&k.as_str()) {
                assert!(val.is_string(), "{k}: {v}");
            } else {
                assert!(val.is_i64(), "{k} must be an integer: {v}");
            }
        }
        assert_eq!(Params::from_json(&p.to_json()).unwrap(), p);
    }
}

#[test]
fn params_follow_iperf3_reading_rules() {
    // Booleans by presence, even when false.
    let p = Params::from_json(br#"{"reverse":false,"bidirectional":0,"udp_counters_64bit":0}"#)
        .unwrap();
    assert!(p.reverse && p.bidirectional && p.udp_counters_64bit);
    // Absent keys keep the server defaults.
    let p = Params::from_json(b"{}").unwrap();
    assert_eq!(p, Params::default());
    assert_eq!((p.time, p.len, p.parallel), (10, 131_072, 1));
    // Numbers as cJSON: floats truncate, huge values saturate, non-numbers are 0, true is 1.
    let p = Params::from_json(
            br#"{"time":5.9,"len":1e300,"parallel":-2.5,"omit":"3","num":true,"blockcount":18446744073709551615}"#,
        )
        .unwrap();
    assert_eq!(p.time, 5);
    assert_eq!(p.len, i64::MAX);
    assert_eq!(p.parallel, -2);
    assert_eq!(p.omit, 0);
    assert_eq!(p.num, 1);
    assert_eq!(p.blockcount, i64::MAX);
    assert_eq!(p.streams(), 0, "a negative stream count is no streams");
    // The last protocol key present wins, in iperf3's order.
    let p = Params::from_json(br#"{"udp":true,"tcp":true}"#).unwrap();
    assert_eq!(p.protocol, Protocol::Udp);
    // Strings that are not strings are absent.
    let p = Params::from_json(br#"{"title":5,"unknown":{"x":[1,2]}}"#).unwrap();
    assert_eq!(p.title, None);
}

#[test]
fn params_reject_what_iperf3_cannot_parse() {
    assert!(matches!(
        Params::from_json(b"{\"tcp\":tr"),
        Err(Error::Json(_))
    ));
    assert!(matches!(Params::from_json(b""), Err(Error::Json(_))));
    assert_eq!(
        Params::from_json(b"[1,2]"),
        Err(Error::NotObject("parameter message"))
    );
}

#[test]
fn params_stream_directions() {
    let mut p = Params {
        parallel: 2,
        ..Params::default()
    };
    assert_eq!(p.streams(), 2);
    assert!(p.client_sends(0) && p.client_sends(1));
    p.reverse = true;
    assert!(!p.client_sends(0));
    p.reverse = false;
    p.bidirectional = true;
    assert_eq!(p.streams(), 4);
    let dirs: Vec<bool> = (0..4).map(|i| p.client_sends(i)).collect();
    assert_eq!(dirs, [true, true, false, false]);
}

/// [verified] a 3.12 server's UDP receiver results, docs/protocols/iperf3.md §10 (the text shortened).
const SERVER_312: &str = r#"{"cpu_util_total":0.0152,"cpu_util_user":0.0151,"cpu_util_system":0,"sender_has_retransmits":18446744073709551615,"server_output_text":"Accepted connection from 127.0.0.1, port 56772\n","streams":[{"id":1,"bytes":131072,"retransmits":18446744073709551615,"jitter":3.672119140625e-06,"errors":0,"packets":4,"start_time":0,"end_time":1.000149}]}"#;

/// [verified] a 3.17.1 client's UDP sender results.
const CLIENT_3171: &str = r#"{"cpu_util_total":100.84,"cpu_util_user":100.44,"cpu_util_system":0.40,"sender_has_retransmits":0,"streams":[{"id":1,"bytes":125000,"retransmits":-1,"jitter":0,"errors":0,"omitted_errors":0,"packets":125,"omitted_packets":0,"start_time":0,"end_time":1.00034}]}"#;

/// [verified] the smallest server results the 3.12 and 3.17.1 clients accepted.
const SMALLEST: &str = r#"{"cpu_util_total":0.5,"cpu_util_user":0.25,"cpu_util_system":0.25,"sender_has_retransmits":-1,"streams":[{"id":1,"bytes":1310720,"retransmits":-1,"jitter":0,"errors":0,"packets":0}]}"#;

#[test]
fn results_read_the_verified_examples() {
    let r = Results::from_json(SERVER_312.as_bytes()).unwrap();
    assert_eq!(r.sender_has_retransmits, -1, "2^64-1 is -1");
    assert!((r.cpu_util_total - 0.0152).abs() < 1e-12);
    assert_eq!(
        r.server_output_text.as_deref(),
        Some("Accepted connection from 127.0.0.1, port 56772\n")
    );
    let s = &r.streams[0];
    assert_eq!(
        (s.id, s.bytes, s.retransmits, s.packets),
        (1, 131_072, -1, 4)
    );
    assert!((s.jitter - 3.672_119_140_625e-6).abs() < 1e-18);
    assert!((s.end_time - 1.000_149).abs() < 1e-12);

    let r = Results::from_json(CLIENT_3171.as_bytes()).unwrap();
    assert_eq!(r.sender_has_retransmits, 0);
    assert_eq!((r.streams[0].packets, r.streams[0].retransmits), (125, -1));

    let r = Results::from_json(SMALLEST.as_bytes()).unwrap();
    assert_eq!(r.streams[0].end_time, 0.0, "optional keys default");
    assert_eq!(r.streams[0].omitted_packets, 0);
}

/// [verified] results of the multi-threaded releases, captured on the control connection:
/// a 3.16 client's (`--bidir -P 2 -b 1M`: its paced sender threads spin, so the CPU figure
/// is above 100%), a 3.19.1 client's (`-u -R -O 1`: 4 of its 12 packets in the omit
/// period), a 3.19.1 server's (`--bidir -P 2` from `sonde throughput`), and a 3.16 server's
/// UDP sender results, whose `jitter` is the peer's figure read back from the client's
/// results (iperf3 stores it on the stream before it writes its own).
const CLIENT_316_BIDIR: &str = r#"{"cpu_util_total":192.14441633765969,"cpu_util_user":191.58145976658233,"cpu_util_system":0.56207002529610628,"sender_has_retransmits":1,"congestion_used":"bbr","streams":[{"id":1,"bytes":131072,"retransmits":0,"jitter":0,"errors":0,"omitted_errors":0,"packets":0,"omitted_packets":0,"start_time":0,"end_time":1.001019},{"id":3,"bytes":131072,"retransmits":0,"jitter":0,"errors":0,"omitted_errors":0,"packets":0,"omitted_packets":0,"start_time":0,"end_time":1.001047},{"id":4,"bytes":131072,"retransmits":-1,"jitter":0,"errors":0,"omitted_errors":0,"packets":0,"omitted_packets":0,"start_time":0,"end_time":1.001069},{"id":5,"bytes":131072,"retransmits":-1,"jitter":0,"errors":0,"omitted_errors":0,"packets":0,"omitted_packets":0,"start_time":0,"end_time":1.001091}]}"#;
const CLIENT_3191_UDP_OMIT: &str = r#"{"cpu_util_total":0.052179970616715969,"cpu_util_user":0,"cpu_util_system":0.05214667133744557,"sender_has_retransmits":-1,"streams":[{"id":1,"bytes":262144,"retransmits":-1,"jitter":0.0001260473113096456,"errors":0,"omitted_errors":0,"packets":12,"omitted_packets":4,"start_time":0,"end_time":2.000023}]}"#;
const SERVER_3191_BIDIR: &str = r#"{"cpu_util_total":12.613250324762863,"cpu_util_user":0.96649427682051026,"cpu_util_system":11.656952376283733,"sender_has_retransmits":1,"congestion_used":"bbr","streams":[{"id":1,"bytes":66322432,"retransmits":-1,"jitter":0,"errors":0,"omitted_errors":0,"packets":0,"omitted_packets":0,"start_time":0,"end_time":1.02117},{"id":3,"bytes":69730304,"retransmits":-1,"jitter":0,"errors":0,"omitted_errors":0,"packets":0,"omitted_packets":0,"start_time":0,"end_time":1.021242},{"id":4,"bytes":81264640,"retransmits":0,"jitter":0,"errors":0,"omitted_errors":0,"packets":0,"omitted_packets":0,"start_time":0,"end_time":1.022328},{"id":5,"bytes":91750400,"retransmits":0,"jitter":0,"errors":0,"omitted_errors":0,"packets":0,"omitted_packets":0,"start_time":0,"end_time":1.02295}]}"#;
const SERVER_316_UDP_SENDER: &str = r#"{"cpu_util_total":101.66698932666918,"cpu_util_user":98.608565591209768,"cpu_util_system":3.0582271912954524,"sender_has_retransmits":0,"streams":[{"id":1,"bytes":127400,"retransmits":-1,"jitter":2.5181e-05,"errors":0,"omitted_errors":0,"packets":91,"omitted_packets":0,"start_time":0,"end_time":1.017518}]}"#;

#[test]
fn results_read_what_the_316_to_3191_releases_send() {
    let lens = [
        CLIENT_316_BIDIR.len(),
        CLIENT_3191_UDP_OMIT.len(),
        SERVER_3191_BIDIR.len(),
        SERVER_316_UDP_SENDER.len(),
    ];
    assert_eq!(
        lens,
        [0x2ff, 0x131, 0x305, 0x133],
        "the verified length prefixes"
    );

    let r = Results::from_json(CLIENT_316_BIDIR.as_bytes()).unwrap();
    // Above one core is what the peer measured; it is read as sent, not capped or refused.
    assert!((r.cpu_util_total - 192.144_416_34).abs() < 1e-6);
    assert_eq!(r.congestion_used.as_deref(), Some("bbr"));
    let ids: Vec<u32> = r.streams.iter().map(|s| s.id).collect();
    let retransmits: Vec<i64> = r.streams.iter().map(|s| s.retransmits).collect();
    assert_eq!((ids, retransmits), (vec![1, 3, 4, 5], vec![0, 0, -1, -1]));

    let r = Results::from_json(CLIENT_3191_UDP_OMIT.as_bytes()).unwrap();
    assert_eq!(r.sender_has_retransmits, -1);
    let s = &r.streams[0];
    assert_eq!((s.bytes, s.packets, s.errors), (262_144, 12, 0));
    assert_eq!((s.omitted_packets, s.omitted_errors), (4, 0));
    assert!((s.jitter - 1.260_473_113_096_456e-4).abs() < 1e-18);

    let r = Results::from_json(SERVER_3191_BIDIR.as_bytes()).unwrap();
    assert_eq!(r.sender_has_retransmits, 1);
    let bytes: Vec<u64> = r.streams.iter().map(|s| s.bytes).collect();
    assert_eq!(bytes, [66_322_432, 69_730_304, 81_264_640, 91_750_400]);
    let retransmits: Vec<i64> = r.streams.iter().map(|s| s.retransmits).collect();
    assert_eq!(retransmits, [-1, -1, 0, 0], "-1 on the streams it received");
    assert!((r.streams[3].end_time - 1.022_95).abs() < 1e-12);

    let r = Results::from_json(SERVER_316_UDP_SENDER.as_bytes()).unwrap();
    let s = &r.streams[0];
    assert_eq!(
        (r.sender_has_retransmits, s.packets, s.bytes),
        (0, 91, 127_400)
    );
    assert!((s.jitter - 2.5181e-5).abs() < 1e-18);

    // What sonde writes back from any of them reads the same (floats to within the last
    // digit: serde_json's default parser may round cJSON's 17-digit output one ulp off).
    let close = |a: f64, b: f64| (a - b).abs() <= a.abs().max(b.abs()) * 1e-15;
    for json in [
        CLIENT_316_BIDIR,
        CLIENT_3191_UDP_OMIT,
        SERVER_3191_BIDIR,
        SERVER_316_UDP_SENDER,
    ] {
        let r = Results::from_json(json.as_bytes()).unwrap();
        let back = Results::from_json(&r.to_json()).unwrap();
        assert!(close(back.cpu_util_total, r.cpu_util_total), "{json}");
        assert!(close(back.cpu_util_user, r.cpu_util_user), "{json}");
        assert!(close(back.cpu_util_system, r.cpu_util_system), "{json}");
        assert_eq!(back.sender_has_retransmits, r.sender_has_retransmits);
        assert_eq!(back.congestion_used, r.congestion_used);
        assert_eq!(back.streams.len(), r.streams.len());
        for (b, s) in back.streams.iter().zip(&r.streams) {
            assert!(close(b.jitter, s.jitter) && close(b.end_time, s.end_time));
            let ints = |s: &StreamResults| {
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
            assert_eq!(ints(b), ints(s), "{json}");
        }
    }
}

#[test]
fn error_codes_of_later_releases_have_their_messages() {
    // 3.19's control-connection keepalive (--cntl-ka), with strerror appended.
    assert_eq!(
        error_message(155),
        "unable to set socket keepalive (SO_KEEPALIVE) option"
    );
    assert!(error_has_os_errno(155) && error_has_os_errno(36));
    // 3.16's threads.
    assert_eq!(error_message(150), "unable to create thread");
    assert!(error_has_os_errno(150));
    assert!(!error_has_os_errno(159) && !error_has_os_errno(34));
    assert_eq!(error_message(160), "unknown iperf3 error");
}

#[test]
fn results_require_the_keys_iperf3_requires() {
    let full: Value = serde_json::from_str(SMALLEST).unwrap();
    for key in [
        "cpu_util_total",
        "cpu_util_user",
        "cpu_util_system",
        "sender_has_retransmits",
        "streams",
    ] {
        let mut v = full.clone();
        v.as_object_mut().unwrap().remove(key);
        assert_eq!(
            Results::from_json(v.to_string().as_bytes()),
            Err(Error::MissingKey { what: RESULTS, key }),
        );
    }
    for key in ["id", "bytes", "retransmits", "jitter", "errors", "packets"] {
        let mut v = full.clone();
        v["streams"][0].as_object_mut().unwrap().remove(key);
        assert_eq!(
            Results::from_json(v.to_string().as_bytes()),
            Err(Error::MissingKey { what: STREAM, key }),
        );
    }
    assert!(Results::from_json(br#"{"cpu_util_total":1,"cpu_util_user":1,"cpu_util_system":1,"sender_has_retransmits":1,"streams":[{"id":-5,"bytes":0,"retransmits":0,"jitter":0,"errors":0,"packets":0}]}"#).is_err());
}

#[test]
fn results_write_signed_minus_one_and_omitted_keys_and_no_nan() {
    let r = Results {
        cpu_util_total: f64::NAN,
        cpu_util_user: 0.25,
        cpu_util_system: f64::INFINITY,
        sender_has_retransmits: -1,
        streams: vec![StreamResults {
            id: 3,
            bytes: 1_310_720,
            retransmits: -1,
            jitter: 0.5,
            errors: 2,
            packets: 10,
            end_time: 1.25,
            ..StreamResults::default()
        }],
        server_output_text: Some("line\n".into()),
        ..Results::default()
    };
    let text = String::from_utf8(r.to_json()).unwrap();
    assert_eq!(
        text,
        r#"{"cpu_util_total":0.0,"cpu_util_user":0.25,"cpu_util_system":0.0,"sender_has_retransmits":-1,"server_output_text":"line\n","streams":[{"id":3,"bytes":1310720,"retransmits":-1,"jitter":0.5,"errors":2,"omitted_errors":0,"packets":10,"omitted_packets":0,"start_time":0.0,"end_time":1.25}]}"#
    );
    let back = Results::from_json(text.as_bytes()).unwrap();
    assert_eq!(back.streams, r.streams);
    assert_eq!(back.cpu_util_total, 0.0);
    assert_eq!(back.server_output_text, r.server_output_text);
}

#[test]
fn results_round_trip_server_output_json() {
    let r = Results {
        sender_has_retransmits: 1,
        server_output_json: Some(serde_json::json!({"start": {"version": "sonde"}})),
        congestion_used: Some("cubic".into()),
        ..Results::default()
    };
    let back = Results::from_json(&r.to_json()).unwrap();
    assert_eq!(back, r);
}

proptest! {
    #[test]
    fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let _ = Params::from_json(&bytes);
        let _ = Results::from_json(&bytes);
        if let Ok(prefix) = <[u8; 4]>::try_from(bytes.get(..4).unwrap_or(&[0; 4])) {
            let _ = json_len(prefix);
        }
        for b in &bytes {
            let _ = State::from_byte(*b);
        }
        let c = Cookie::from_bytes(std::array::from_fn(|i| bytes.get(i).copied().unwrap_or(0)));
        let _ = c.matches(&bytes);
        let _ = c.text();
    }

    #[test]
    fn json_shaped_input_never_panics(
        keys in proptest::collection::vec(
            prop_oneof![
                Just("time"), Just("len"), Just("parallel"), Just("streams"), Just("id"),
                Just("bytes"), Just("jitter"), Just("reverse"), Just("udp"), Just("title")
            ],
            0..8,
        ),
        vals in proptest::collection::vec(
            prop_oneof![
                Just("1"), Just("-1"), Just("1e308"), Just("-1e308"), Just("18446744073709551615"),
                Just("\"x\""), Just("[]"), Just("[{}]"), Just("{}"), Just("null"), Just("true"),
                Just("2.5"), Just("[{\"id\":1}]")
            ],
            8,
        ),
    ) {
        let body: Vec<String> = keys.iter().zip(&vals).map(|(k, v)| format!("\"{k}\":{v}")).collect();
        let json = format!("{{{}}}", body.join(","));
        let _ = Params::from_json(json.as_bytes());
        let _ = Results::from_json(json.as_bytes());
        let streams = format!(
            "{{\"cpu_util_total\":{},\"cpu_util_user\":0,\"cpu_util_system\":0,\"sender_has_retransmits\":{},\"streams\":[{{\"id\":{},\"bytes\":{},\"retransmits\":0,\"jitter\":{},\"errors\":0,\"packets\":0}}]}}",
            vals[0], vals[1], vals[2], vals[3], vals[4]
        );
        if let Ok(r) = Results::from_json(streams.as_bytes()) {
            // Whatever was read writes back as JSON that reads again.
            prop_assert!(Results::from_json(&r.to_json()).is_ok());
        }
    }
}
