use super::control::server_error_text;
use super::*;
use sonde_engine::seq::SeqTracker;
use sonde_wire::iperf3::State;

/// The kernel's choice of source address and ports.
static NO_SOURCE: Source = Source {
    bind: sonde_net::socket::Bind {
        ip: None,
        device: None,
    },
    ports: None,
};

fn opt(protocol: Protocol, direction: Direction) -> ThroughputOptions {
    ThroughputOptions {
        protocol,
        parallel: 2,
        direction,
        msg_size: if protocol == Protocol::Udp {
            1400
        } else {
            128 << 10
        },
        bitrate: 20_000_000,
        duration: Duration::from_millis(1500),
        interval: None,
        cpus: Vec::new(),
        read_size: None,
        socket: sonde_wire::SocketOptions::default(),
        omit: None,
        skip_rx_copy: false,
        bytes: None,
        blocks: None,
    }
}

#[test]
fn only_iperf3_urls_are_iperf3_targets() {
    assert!(target("127.0.0.1").is_none());
    assert!(target("127.0.0.1:5300").is_none());
    assert!(target("sockperf://127.0.0.1").is_none());
    let t = target("iperf3://127.0.0.1").unwrap().unwrap().0;
    assert_eq!(t.addr, "127.0.0.1:5201".parse().unwrap());
    assert_eq!(t.label, "iperf3://127.0.0.1:5201");
    let t = target("IPERF3://127.0.0.1:7000/").unwrap().unwrap().0;
    assert_eq!(t.addr.port(), 7000);
    let t = target("iperf3://[::1]:7000").unwrap().unwrap().0;
    assert!(t.addr.is_ipv6() && t.addr.port() == 7000);
    let t = target("iperf3://::1").unwrap().unwrap().0;
    assert_eq!(t.addr.port(), DEFAULT_PORT);
    assert!(matches!(
        target("iperf3://"),
        Some(Err(ClientError::Usage(_)))
    ));
    assert!(matches!(
        target("iperf3://host/path"),
        Some(Err(ClientError::Usage(_)))
    ));
}

#[test]
fn parameters_are_what_a_real_client_sends() {
    // The key set and order of docs/protocols/iperf3.md §6 "For our client": UDP adds bandwidth (per
    // stream: sonde's -b is for all streams together) and 64-bit counters.
    let json = params(
        &opt(Protocol::Udp, Direction::Reverse),
        &sonde_wire::SocketOptions::default(),
    )
    .to_json();
    assert_eq!(
        String::from_utf8(json).unwrap(),
        r#"{"udp":true,"omit":0,"time":2,"num":0,"blockcount":0,"parallel":2,"reverse":true,"len":1400,"bandwidth":10000000,"pacing_timer":1000,"udp_counters_64bit":1,"client_version":"3.12"}"#
    );
    let json = params(
        &opt(Protocol::Tcp, Direction::Bidir),
        &sonde_wire::SocketOptions::default(),
    )
    .to_json();
    assert_eq!(
        String::from_utf8(json).unwrap(),
        r#"{"tcp":true,"omit":0,"time":2,"num":0,"blockcount":0,"parallel":2,"bidirectional":true,"len":131072,"pacing_timer":1000,"client_version":"3.12"}"#
    );
    // Unlimited UDP: no bandwidth key.
    let mut o = opt(Protocol::Udp, Direction::Forward);
    o.bitrate = 0;
    assert!(
        !String::from_utf8(params(&o, &sonde_wire::SocketOptions::default()).to_json())
            .unwrap()
            .contains("bandwidth")
    );
    // The socket options go in iperf3's own keys (window, MSS, nodelay, TOS, congestion,
    // fqrate; dont_fragment for UDP), as iperf3 -w -M -N -S -C --fq-rate --dont-fragment send
    // them.
    let socket = sonde_wire::SocketOptions {
        window_bytes: Some(1 << 20),
        congestion: Some("reno".into()),
        mss_bytes: Some(1_200),
        no_delay: true,
        pacing_bits_per_second: Some(50_000_000),
        tos: Some(0xb8),
        dont_fragment: false,
        zerocopy: true,
    };
    let json =
        String::from_utf8(params(&opt(Protocol::Tcp, Direction::Forward), &socket).to_json())
            .unwrap();
    for key in [
        r#""MSS":1200"#,
        r#""nodelay":true"#,
        r#""window":1048576"#,
        r#""fqrate":50000000"#,
        r#""TOS":184"#,
        r#""congestion":"reno""#,
        r#""zerocopy":1"#,
    ] {
        assert!(json.contains(key), "{key} in {json}");
    }
    assert!(!json.contains("dont_fragment"), "{json}");
    let df = sonde_wire::SocketOptions {
        dont_fragment: true,
        ..sonde_wire::SocketOptions::default()
    };
    let json =
        String::from_utf8(params(&opt(Protocol::Udp, Direction::Forward), &df).to_json()).unwrap();
    assert!(json.contains(r#""dont_fragment":1"#), "{json}");
}

#[test]
fn options_beyond_iperf3s_limits_are_usage_errors() {
    let mut o = opt(Protocol::Udp, Direction::Forward);
    assert!(check(&o).is_ok());
    o.msg_size = 15;
    assert!(matches!(check(&o), Err(ClientError::Usage(_))));
    o.msg_size = 65_508;
    assert!(matches!(check(&o), Err(ClientError::Usage(_))));
    let mut o = opt(Protocol::Tcp, Direction::Forward);
    o.parallel = 129;
    assert!(matches!(check(&o), Err(ClientError::Usage(_))));
    o.parallel = 1;
    o.duration = Duration::ZERO;
    assert!(matches!(check(&o), Err(ClientError::Usage(_))));
}

#[test]
fn cookies_are_fresh_and_from_iperf3s_alphabet() {
    let (a, b) = (fresh_cookie(), fresh_cookie());
    assert_ne!(a, b);
    let bytes = a.as_bytes();
    assert_eq!(bytes[wire::COOKIE_LEN - 1], 0);
    assert!(bytes[..wire::COOKIE_LEN - 1]
        .iter()
        .all(|c| wire::COOKIE_ALPHABET.contains(c)));
}

/// A listener on loopback for a fake iperf3 server, and its address.
fn fake_listener() -> (std::net::TcpListener, SocketAddr) {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    (l, addr)
}

fn read_cookie(conn: &mut TcpStream) -> [u8; wire::COOKIE_LEN] {
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    let mut cookie = [0u8; wire::COOKIE_LEN];
    conn.read_exact(&mut cookie).unwrap();
    cookie
}

#[test]
fn a_server_between_two_tests_is_tried_again() {
    // An iperf3 server reopening its listener after a test: the first connection is
    // closed unanswered (a sweep's next step lands there), the next one is greeted.
    let (listener, addr) = fake_listener();
    let server = thread::spawn(move || {
        drop(listener.accept().unwrap());
        let (mut conn, _) = listener.accept().unwrap();
        let cookie = read_cookie(&mut conn);
        conn.write_all(&[State::ParamExchange.byte()]).unwrap();
        (cookie, conn)
    });
    let interrupt = AtomicBool::new(false);
    let cookie = fresh_cookie();
    let opened = Control::open(addr, &NO_SOURCE, &interrupt, &cookie);
    assert!(opened.is_ok(), "{:?}", opened.err());
    let (seen, _conn) = server.join().unwrap();
    assert_eq!(
        &seen,
        cookie.as_bytes(),
        "the same cookie on the second try"
    );
}

#[test]
fn a_busy_server_is_not_tried_again() {
    let (listener, addr) = fake_listener();
    let server = thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        conn.write_all(&[State::AccessDenied.byte()]).unwrap();
        listener
    });
    let interrupt = AtomicBool::new(false);
    let r = Control::open(addr, &NO_SOURCE, &interrupt, &fresh_cookie());
    assert!(
        matches!(r, Err(ClientError::Iperf3Refused(_))),
        "{:?}",
        r.err()
    );
    // `open` has returned, so a second attempt would be waiting to be accepted.
    let listener = server.join().unwrap();
    listener.set_nonblocking(true).unwrap();
    assert_eq!(
        listener.accept().map(|_| ()).unwrap_err().kind(),
        io::ErrorKind::WouldBlock,
        "busy is an answer: no second connection"
    );
}

#[test]
fn a_test_ends_once_the_server_has_closed_the_connection() {
    // Until the server closes, it is still in this test and answers the next one "busy".
    let (listener, addr) = fake_listener();
    let closed = std::sync::Arc::new(AtomicBool::new(false));
    let server = thread::spawn({
        let closed = closed.clone();
        move || {
            let (mut conn, _) = listener.accept().unwrap();
            conn.write_all(&[State::DisplayResults.byte()]).unwrap();
            conn.set_read_timeout(Some(Duration::from_secs(10)))
                .unwrap();
            let mut done = [0u8; 1];
            conn.read_exact(&mut done).unwrap();
            // The server's own cleanup, well inside the client's wait for the close.
            thread::sleep(Duration::from_millis(200));
            closed.store(true, Ordering::SeqCst);
            drop(conn);
            done[0]
        }
    });
    let interrupt = AtomicBool::new(false);
    let mut ctl = Control::connect(addr, &NO_SOURCE, &interrupt, &fresh_cookie()).unwrap();
    // Past the results: `DISPLAY_RESULTS` is due (nothing was sent, not even the cookie).
    ctl.talk = Conversation::awaiting_display(Instant::now(), addr);
    assert!(ctl.finish().unwrap(), "DISPLAY_RESULTS came");
    assert!(
        closed.load(Ordering::SeqCst),
        "finish returned before the close"
    );
    assert_eq!(server.join().unwrap(), State::IperfDone.byte());
}

#[test]
fn server_errors_read_as_iperf3_prints_them() {
    // docs/protocols/iperf3.md §12: IESETMSS with EINVAL.
    assert_eq!(
        server_error_text(123, 22),
        "unable to set TCP/SCTP MSS: Invalid argument"
    );
    // No OS error for this code (and none sent, as after an authentication failure).
    assert_eq!(server_error_text(142, 0), "test authorization failed");
    assert_eq!(
        server_error_text(27, 22),
        "total required bandwidth is larger than server limit"
    );
}

fn udp_received(seqs: &[u64], bytes_each: u64) -> UdpRecvOutcome {
    let mut seq = SeqTracker::new();
    for &s in seqs {
        seq.on_packet(s);
    }
    UdpRecvOutcome {
        bytes: bytes_each * seqs.len() as u64,
        packets: seqs.len() as u64,
        first_ns: 1_000,
        last_ns: 1_000_000_000,
        malformed: 0,
        seq,
        jitter: sonde_engine::jitter::Jitter::default(),
        ecn: None,
        omitted: None,
    }
}

fn sent(bytes: u64, packets: u64) -> SendOutcome {
    SendOutcome {
        bytes,
        packets,
        active_ns: 1_000_000_000,
        retransmits: Some(3),
        method: "write",
        omitted_bytes: 0,
        omitted_packets: 0,
        zerocopy: None,
    }
}

#[test]
fn our_results_describe_each_stream_as_iperf3_does() {
    let data = DataRun {
        outcomes: vec![
            Outcome::Sent(sent(14_000, 10)),
            // Tracker seqs 0, 1, 3, 5: iperf3 packets 6 (highest seq 6), errors 2.
            Outcome::UdpReceived(Box::new(udp_received(&[0, 1, 3, 5], 1400))),
        ],
        intervals: Vec::new(),
        elapsed_ns: 1_500_000_000,
    };
    let r = our_results(&data, true, None);
    // Bidir UDP: a sender without retransmit counts.
    assert_eq!(r.sender_has_retransmits, 0);
    let (s, rx) = (&r.streams[0], &r.streams[1]);
    assert_eq!(
        (s.id, s.bytes, s.packets, s.errors, s.retransmits),
        (1, 14_000, 10, 0, -1)
    );
    assert_eq!((rx.id, rx.bytes, rx.packets, rx.errors), (3, 5_600, 6, 2));
    assert!((rx.end_time - 1.5).abs() < 1e-9);
    // It parses back as the server will read it.
    let back = Results::from_json(&r.to_json()).unwrap();
    assert_eq!(back.streams.len(), 2);

    // TCP: a pure receiver says -1; a sender with TCP_INFO reports its retransmits.
    let rx_only = DataRun {
        outcomes: vec![Outcome::TcpReceived(TcpRecvOutcome {
            bytes: 5,
            reads: 1,
            first_ns: 1,
            last_ns: 2,
            omitted_bytes: 0,
        })],
        intervals: Vec::new(),
        elapsed_ns: 1,
    };
    assert_eq!(
        our_results(&rx_only, false, None).sender_has_retransmits,
        -1
    );
    let tx = DataRun {
        outcomes: vec![Outcome::Sent(sent(5, 1))],
        intervals: Vec::new(),
        elapsed_ns: 1,
    };
    let r = our_results(&tx, false, None);
    assert_eq!((r.sender_has_retransmits, r.streams[0].retransmits), (1, 3));
}

fn theirs(id: u32, bytes: u64, packets: i64, errors: i64) -> StreamResults {
    StreamResults {
        id,
        bytes,
        retransmits: -1,
        jitter: 0.000_012,
        errors,
        packets,
        start_time: 0.0,
        end_time: 1.0,
        ..StreamResults::default()
    }
}

fn target_label() -> Target {
    Target {
        addr: "127.0.0.1:5201".parse().unwrap(),
        label: "127.0.0.1:5201".into(),
        secret: None,
        source: crate::Source::default(),
    }
}

#[test]
fn forward_udp_takes_the_receiver_from_the_servers_results() {
    let run = Run {
        udp: true,
        streams: vec![StreamRun {
            client_sends: true,
            ours: Outcome::Sent(sent(1_400_000, 1_000)),
            // The server saw up to seq 990, 10 of them missing.
            theirs: theirs(1, 1_372_000, 990, 10),
        }],
        server_retransmits: false,
        intervals: Vec::new(),
        elapsed_ns: 1_000_000_000,
        clean_end: true,
        cpu: None,
        socket: None,
        sources: Vec::new(),
    };
    let o = opt(Protocol::Udp, Direction::Forward);
    let doc = document(&target_label(), &o, 1, &run);
    assert_eq!(doc.meta.peer, Peer::Iperf3);
    assert_eq!(doc.meta.session, 0);
    let s = &doc.streams[0];
    assert_eq!(s.direction, StreamDirection::ClientToServer);
    assert_eq!((s.receiver.bytes, s.receiver.packets), (1_372_000, 980));
    assert_eq!(s.receiver.duration_ns, 1_000_000_000);
    assert_eq!((s.sender.bytes, s.sender.packets), (1_400_000, 1_000));
    assert_eq!(s.lost, Some(10));
    assert_eq!(s.jitter_ns, Some(12_000));
    // Not reported by an iperf3 server: null, and the warnings say why.
    assert_eq!(
        (s.duplicated, s.reordered, s.retransmits),
        (None, None, None)
    );
    assert_eq!((doc.duplicated, doc.reordered), (None, None));
    assert_eq!(doc.lost, Some(10));
    assert!((doc.loss_percent.unwrap() - 10.0 * 100.0 / 990.0).abs() < 1e-9);
    let w = doc.meta.warnings.join("\n");
    assert!(w.contains("no duplicates or reordering"), "{w}");
    assert!(w.contains("10 of 990 datagrams were lost"), "{w}");
}

#[test]
fn reverse_udp_counts_loss_against_what_the_server_sent() {
    let run = Run {
        udp: true,
        streams: vec![StreamRun {
            client_sends: false,
            // Received tracker seqs 0..=3 and 5 (one duplicate of 5) of 8 sent.
            ours: Outcome::UdpReceived(Box::new(udp_received(&[0, 1, 2, 3, 5, 5], 1400))),
            theirs: theirs(1, 11_200, 8, 0),
        }],
        server_retransmits: false,
        intervals: Vec::new(),
        elapsed_ns: 1_000_000_000,
        clean_end: true,
        cpu: None,
        socket: None,
        sources: Vec::new(),
    };
    let o = opt(Protocol::Udp, Direction::Reverse);
    let doc = document(&target_label(), &o, 1, &run);
    let s = &doc.streams[0];
    assert_eq!(s.direction, StreamDirection::ServerToClient);
    assert_eq!(s.receiver.packets, 5);
    assert_eq!((s.sender.bytes, s.sender.packets), (11_200, 8));
    // 8 sent, 5 unique received: 3 lost, the tail included.
    assert_eq!((s.lost, s.duplicated), (Some(3), Some(1)));
    assert_eq!(doc.loss_percent, Some(37.5));
}

#[test]
fn tcp_bidir_warns_about_counts_an_iperf3_server_does_not_report() {
    let run = Run {
        udp: false,
        streams: vec![
            StreamRun {
                client_sends: true,
                ours: Outcome::Sent(sent(2_000, 2)),
                theirs: theirs(1, 1_900, 0, 0),
            },
            StreamRun {
                client_sends: false,
                ours: Outcome::TcpReceived(TcpRecvOutcome {
                    bytes: 3_000,
                    reads: 3,
                    first_ns: 10,
                    last_ns: 1_000_000_010,
                    omitted_bytes: 0,
                }),
                theirs: StreamResults {
                    retransmits: 7,
                    ..theirs(3, 3_000, 0, 0)
                },
            },
        ],
        server_retransmits: true,
        intervals: Vec::new(),
        elapsed_ns: 1_000_000_000,
        clean_end: false,
        cpu: None,
        socket: None,
        sources: Vec::new(),
    };
    let mut o = opt(Protocol::Tcp, Direction::Bidir);
    o.parallel = 1;
    o.interval = Some(Duration::from_secs(1));
    let doc = document(&target_label(), &o, 1, &run);
    assert_eq!(doc.receiver.bytes, 4_900);
    assert_eq!(doc.sender.bytes, 5_000);
    assert_eq!(doc.streams[0].retransmits, Some(3));
    assert_eq!(doc.streams[1].retransmits, Some(7));
    assert_eq!(doc.retransmits, Some(10));
    assert_eq!((doc.lost, doc.jitter_ns), (None, None));
    let w = doc.meta.warnings.join("\n");
    assert!(w.contains("read calls") && w.contains("write calls"), "{w}");
    assert!(w.contains("intervals (-i)"), "{w}");
    assert!(w.contains("DISPLAY_RESULTS"), "{w}");
}
