//! A shared secret (`AgentConfig::secret`), the per-source limits and `--max-bitrate`.

use super::*;

// ---------------------------------------------------------------------------------------------
// Authentication (`AgentConfig::secret`)
// ---------------------------------------------------------------------------------------------

const SECRET: &[u8] = b"a shared secret for the robustness tests";

fn secret(bytes: &[u8]) -> Secret {
    Secret::new(bytes.to_vec()).expect("not empty")
}

fn agent_with_secret() -> AgentHandle {
    agent(|c| c.secret = Some(secret(SECRET)))
}

/// Hello with `client_nonce`; the welcome's nonce and whether it asks for a secret. The welcome
/// must not describe the host: nothing about it goes to a client not yet admitted.
fn raw_hello(h: &AgentHandle, client_nonce: Nonce) -> (Raw, Nonce, bool) {
    let mut ctrl = connect(h);
    ctrl.write_all(&preamble(Channel::Control))
        .expect("preamble");
    let mut raw = Raw {
        ctrl,
        body: Vec::new(),
    };
    raw.send(&ControlMsg::Hello {
        protocol: PROTOCOL_VERSION,
        software: "robustness test".into(),
        nonce: client_nonce,
    });
    let msg = raw.recv();
    let text = String::from_utf8_lossy(&raw.body).into_owned();
    for field in ["host", "kernel", "cpu", "nic", "sonde_version"] {
        assert!(
            !text.contains(&format!("\"{field}")),
            "the welcome describes the host ({field}): {text}"
        );
    }
    match msg {
        ControlMsg::Welcome {
            nonce,
            secret_required,
            ..
        } => (raw, nonce, secret_required),
        other => panic!("expected a welcome, got {other:?}"),
    }
}

fn assert_unauthenticated(reply: &ControlMsg) {
    assert!(
        matches!(
            reply,
            ControlMsg::Refused {
                reason: Refusal::Unauthenticated,
                ..
            }
        ),
        "expected a refusal for authentication, got {reply:?}"
    );
}

#[test]
fn with_a_secret_only_clients_that_prove_it_are_admitted() {
    let h = agent_with_secret();
    let opts = latency_opts(Protocol::Tcp);
    // No secret, and a wrong one: refused, exit code 4, a line that says what to do.
    for (client_secret, says) in [
        (None, "requires a shared secret"),
        (Some(secret(b"not the secret")), "does not match"),
    ] {
        let t = target(&h).with_secret(client_secret);
        match latency(&t, &opts) {
            Err(e @ ClientError::Refused { .. }) => {
                assert_eq!(e.exit_code(), 4);
                assert!(e.to_string().contains(says), "{e}");
                assert!(e.to_string().contains("--secret-file"), "{e}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    assert_counter(&h, "unauthenticated", |r| &r.unauthenticated, 2);
    // The right one: TCP and UDP tests run (UDP joins carry the session key's MAC).
    let t = target(&h).with_secret(Some(secret(SECRET)));
    for protocol in [Protocol::Tcp, Protocol::Udp] {
        let r = latency(&t, &latency_opts(protocol))
            .unwrap_or_else(|e| panic!("{protocol:?} latency with the secret: {e}"))
            .result;
        assert!(r.samples > 0);
    }
    let r = throughput(
        &t,
        &ThroughputOptions {
            protocol: Protocol::Udp,
            msg_size: 1200,
            parallel: 2,
            duration: Duration::from_millis(300),
            ..ThroughputOptions::default()
        },
    )
    .expect("UDP throughput with the secret");
    assert!(r.receiver.bytes > 0, "{r:?}");
    assert_eq!(count(&h, |r| &r.unauthenticated), 2);
}

#[test]
fn an_agent_without_a_secret_admits_clients_with_or_without_one() {
    let h = agent(|_| {});
    let (_raw, _, required) = raw_hello(&h, Nonce([1; 32]));
    assert!(!required);
    let t = target(&h).with_secret(Some(secret(b"whatever")));
    assert!(latency(&t, &latency_opts(Protocol::Udp)).is_ok());
    assert_serves(&h);
}

#[test]
fn a_replayed_proof_is_refused() {
    let h = agent_with_secret();
    let s = secret(SECRET);
    let spec = spec(TestKind::Latency, Protocol::Tcp, Direction::Forward, 500);
    let client_nonce = Nonce([7; 32]);
    // A genuine client's session, recorded by an eavesdropper.
    let (mut raw, agent_nonce, required) = raw_hello(&h, client_nonce);
    assert!(required);
    let proof = s.proof(&agent_nonce, &client_nonce, &Request::Test(&spec));
    raw.send(&ControlMsg::Start {
        spec: spec.clone(),
        proof: Some(proof),
        tuning: sonde_wire::Tuning::default(),
        token: None,
    });
    assert!(matches!(
        raw.recv(),
        ControlMsg::Accepted { host: Some(_), .. }
    ));
    drop(raw);
    // The eavesdropper replays the hello and the proof on a new connection: the agent's nonce
    // is new, so the proof no longer fits.
    let (mut replay, fresh, _) = raw_hello(&h, client_nonce);
    assert_ne!(
        fresh, agent_nonce,
        "the agent's nonce is fresh per connection"
    );
    replay.send(&ControlMsg::Start {
        spec: spec.clone(),
        proof: Some(proof),
        tuning: sonde_wire::Tuning::default(),
        token: None,
    });
    assert_unauthenticated(&replay.recv());
    // Nor does a proof for one request admit another (a longer test), nor `Describe`.
    let (mut other, an, _) = raw_hello(&h, client_nonce);
    let longer = TestSpec {
        duration_ms: 5_000,
        ..spec.clone()
    };
    other.send(&ControlMsg::Start {
        spec: longer,
        proof: Some(s.proof(&an, &client_nonce, &Request::Test(&spec))),
        tuning: sonde_wire::Tuning::default(),
        token: None,
    });
    assert_unauthenticated(&other.recv());
    let (mut describe, an, _) = raw_hello(&h, client_nonce);
    describe.send(&ControlMsg::Describe {
        proof: Some(s.proof(&an, &client_nonce, &Request::Test(&spec))),
    });
    assert_unauthenticated(&describe.recv());
    assert_counter(&h, "unauthenticated", |r| &r.unauthenticated, 3);
    assert_serves_over_with(&h, &s);
}

fn assert_serves_over_with(h: &AgentHandle, s: &Secret) {
    let t = target(h).with_secret(Some(s.clone()));
    let r = latency(&t, &latency_opts(Protocol::Tcp))
        .expect("serves")
        .result;
    assert!(r.samples > 0);
}

#[test]
fn the_host_is_described_only_to_an_authenticated_client() {
    let h = agent_with_secret();
    let s = secret(SECRET);
    let cn = Nonce([9; 32]);
    let (mut raw, _, _) = raw_hello(&h, cn);
    raw.send(&ControlMsg::Describe { proof: None });
    assert_unauthenticated(&raw.recv());
    let text = String::from_utf8_lossy(&raw.body).into_owned();
    assert!(
        !text.contains("\"host"),
        "a refusal describes the host: {text}"
    );
    let (mut raw, an, _) = raw_hello(&h, cn);
    raw.send(&ControlMsg::Describe {
        proof: Some(s.proof(&an, &cn, &Request::Describe)),
    });
    match raw.recv() {
        ControlMsg::Description { host: Some(host) } => {
            assert!(host.kernel_name.is_some(), "{host:?}");
        }
        other => panic!("expected the agent's description, got {other:?}"),
    }
    // The client's `sonde conf` path does the same.
    let conf = sonde_client::conf(Some(&target(&h).with_secret(Some(s)))).expect("conf");
    assert!(conf.hosts.server.is_some());
    let refused = sonde_client::conf(Some(&target(&h)));
    assert!(
        matches!(refused, Err(ClientError::Refused { .. })),
        "{refused:?}"
    );
}

#[test]
fn a_udp_join_without_the_session_mac_is_not_acknowledged() {
    let h = agent_with_secret();
    let s = secret(SECRET);
    let spec = spec(
        TestKind::Throughput,
        Protocol::Udp,
        Direction::Forward,
        2_000,
    );
    let cn = Nonce([3; 32]);
    let (mut raw, an, _) = raw_hello(&h, cn);
    raw.send(&ControlMsg::Start {
        spec: spec.clone(),
        proof: Some(s.proof(&an, &cn, &Request::Test(&spec))),
        tuning: sonde_wire::Tuning::default(),
        token: None,
    });
    let ControlMsg::Accepted { token, .. } = raw.recv() else {
        panic!("the session was not accepted");
    };
    let sock = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let before = count(&h, |r| &r.udp_junk);
    // A stranger who learnt the token: no MAC, then a MAC under another session's key.
    let stranger = |mac: [u8; sonde_wire::auth::JOIN_MAC_LEN]| {
        let join = UdpJoin {
            ack: false,
            flow: 0,
            token,
            mac,
        };
        sock.send_to(&join.encode(), h.local_addr()).expect("send");
    };
    stranger([0; sonde_wire::auth::JOIN_MAC_LEN]);
    let other_key = s.session_key(&Nonce([1; 32]), &cn);
    let unsigned = UdpJoin {
        ack: false,
        flow: 0,
        token,
        mac: [0; sonde_wire::auth::JOIN_MAC_LEN],
    };
    stranger(other_key.join_mac(&unsigned.signed()));
    assert_counter(&h, "udp_junk", |r| &r.udp_junk, before + 2);
    sock.set_read_timeout(Some(Duration::from_millis(300)))
        .expect("timeout");
    let mut buf = [0u8; 64];
    assert!(
        sock.recv_from(&mut buf).is_err(),
        "a stranger's join was acknowledged"
    );
    // The genuine client's signed join is.
    let key = s.session_key(&an, &cn);
    let signed = UdpJoin {
        mac: key.join_mac(&unsigned.signed()),
        ..unsigned
    };
    sock.set_read_timeout(Some(PATIENCE)).expect("timeout");
    sock.send_to(&signed.encode(), h.local_addr())
        .expect("send");
    let (n, _) = sock
        .recv_from(&mut buf)
        .expect("the signed join is acknowledged");
    assert!(UdpJoin::decode(&buf[..n]).is_ok_and(|a| a.ack && a.token == token));
}

// ---------------------------------------------------------------------------------------------
// Per-source limits
// ---------------------------------------------------------------------------------------------

/// A TCP connection to `to` from `from` (a loopback address, any port).
fn connect_from(from: [u8; 4], to: SocketAddr) -> TcpStream {
    let sock = socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
        .expect("a TCP socket");
    let from = SocketAddr::from((from, 0));
    sock.bind(&from.into())
        .unwrap_or_else(|e| panic!("bind {from} (loopback 127.0.0.0/8): {e}"));
    sock.connect_timeout(&to.into(), PATIENCE)
        .expect("connect to the agent");
    sock.into()
}

/// The refusal the agent wrote on a connection it would not let in.
fn refusal_on(s: &mut TcpStream) -> ControlMsg {
    let mut body = Vec::new();
    read_frame(s, &mut body, Instant::now() + PATIENCE)
        .unwrap_or_else(|e| panic!("no refusal frame: {e}"))
}

#[test]
fn one_address_holding_connections_does_not_lock_out_another() {
    // The attack: one address fills both ports with silent connections.
    const SILENT: usize = 64;
    let h = agent(|c| {
        c.hello_timeout = Duration::from_secs(10);
        c.iperf3 = Some(SocketAddr::from(([127, 0, 0, 1], 0)));
    });
    let iperf3 = h.iperf3_addr().expect("an iperf3 listener");
    let per_source = AgentConfig::new(h.local_addr()).max_pending_per_source;
    let mut held = Vec::new();
    let mut refused = Vec::new();
    for to in [h.local_addr(), iperf3] {
        for i in 0..SILENT {
            let s = connect_from([127, 0, 0, 2], to);
            if i < per_source {
                held.push(s);
            } else {
                refused.push((to, s));
            }
        }
    }
    let over = (2 * (SILENT - per_source)) as u64;
    assert_counter(&h, "pending_source_full", |r| &r.pending_source_full, over);
    assert_eq!(count(&h, |r| &r.pending_full), 0);
    // Each refused connection says so: sonde's a `Refused` frame, iperf3's ACCESS_DENIED.
    for (to, mut s) in refused.into_iter().step_by(12) {
        if to == iperf3 {
            let mut b = [0u8; 1];
            s.set_read_timeout(Some(PATIENCE)).expect("timeout");
            s.read_exact(&mut b).expect("a state byte");
            assert_eq!(b[0], sonde_wire::iperf3::State::AccessDenied.byte());
        } else {
            assert!(matches!(
                refusal_on(&mut s),
                ControlMsg::Refused {
                    reason: Refusal::SourceBusy,
                    ..
                }
            ));
        }
    }
    // Another address is served at once, over TCP and UDP, while the silent ones are held.
    assert_serves(&h);
    assert_serves_over(&h, Protocol::Udp);
    drop(held);
}

#[test]
fn a_client_turned_away_by_a_full_listener_gets_the_refusal_line() {
    let h = agent(|c| {
        c.max_pending = 2;
        c.hello_timeout = Duration::from_secs(10);
    });
    let _held: Vec<TcpStream> = (0..2)
        .map(|_| connect_from([127, 0, 0, 2], h.local_addr()))
        .collect();
    // Both are counted once a third from the same address is turned away.
    assert!(wait_until(PATIENCE, || {
        drop(connect_from([127, 0, 0, 2], h.local_addr()));
        count(&h, |r| &r.pending_full) > 0
    }));
    let before = count(&h, |r| &r.pending_full);
    // Several times: the refusal must win over any race with the close.
    for _ in 0..5 {
        match latency(&target(&h), &latency_opts(Protocol::Tcp)) {
            Err(e @ ClientError::Refused { .. }) => {
                assert_eq!(e.exit_code(), 4);
                assert!(e.to_string().contains("try again"), "{e}");
            }
            other => panic!("expected a refusal (exit 4), got {other:?}"),
        }
    }
    assert!(count(&h, |r| &r.pending_full) >= before + 5);
}

#[test]
fn one_address_cannot_take_every_session() {
    let h = agent(|c| {
        c.max_sessions = 4;
        c.max_sessions_per_source = 1;
    });
    let long = spec(TestKind::Latency, Protocol::Tcp, Direction::Forward, 5_000);
    let raw_from = |from: [u8; 4]| {
        let mut raw = Raw {
            ctrl: connect_from(from, h.local_addr()),
            body: Vec::new(),
        };
        raw.ctrl
            .write_all(&preamble(Channel::Control))
            .expect("preamble");
        raw.send(&hello(PROTOCOL_VERSION));
        assert!(matches!(raw.recv(), ControlMsg::Welcome { .. }));
        raw.send(&ControlMsg::Start {
            spec: long.clone(),
            proof: None,
            tuning: sonde_wire::Tuning::default(),
            token: None,
        });
        let reply = raw.recv();
        (raw, reply)
    };
    let (_first, reply) = raw_from([127, 0, 0, 2]);
    assert!(matches!(reply, ControlMsg::Accepted { .. }), "{reply:?}");
    let (_, reply) = raw_from([127, 0, 0, 2]);
    assert!(
        matches!(
            reply,
            ControlMsg::Refused {
                reason: Refusal::SourceBusy,
                ..
            }
        ),
        "{reply:?}"
    );
    assert_eq!(count(&h, |r| &r.source_sessions_full), 1);
    // Another address still gets a session.
    assert_serves(&h);
}

#[test]
fn a_client_that_never_asks_for_a_test_stays_pending() {
    // Before, a connection stopped counting as pending at the Welcome and then held a thread
    // for 30 s waiting for Start, outside every bound.
    let h = agent(|c| {
        c.max_pending_per_source = 2;
        c.hello_timeout = Duration::from_secs(10);
    });
    let welcomed = |from: [u8; 4]| {
        let mut raw = Raw {
            ctrl: connect_from(from, h.local_addr()),
            body: Vec::new(),
        };
        raw.ctrl
            .write_all(&preamble(Channel::Control))
            .expect("preamble");
        raw.send(&hello(PROTOCOL_VERSION));
        assert!(matches!(raw.recv(), ControlMsg::Welcome { .. }));
        raw
    };
    let _silent_after_hello = [welcomed([127, 0, 0, 2]), welcomed([127, 0, 0, 2])];
    let mut third = connect_from([127, 0, 0, 2], h.local_addr());
    assert!(matches!(
        refusal_on(&mut third),
        ControlMsg::Refused {
            reason: Refusal::SourceBusy,
            ..
        }
    ));
    assert_serves(&h);
}

// ---------------------------------------------------------------------------------------------
// --max-bitrate
// ---------------------------------------------------------------------------------------------

#[test]
fn max_bitrate_paces_what_the_agent_sends_and_refuses_udp_above_it() {
    const CAP: u64 = 20_000_000;
    let h = agent(|c| c.max_bitrate = Some(CAP));
    let udp = |direction, bitrate| ThroughputOptions {
        protocol: Protocol::Udp,
        direction,
        msg_size: 1200,
        bitrate,
        duration: Duration::from_millis(300),
        ..ThroughputOptions::default()
    };
    // The case: a reverse UDP test at no limit; and forward UDP above the cap.
    for opts in [udp(Direction::Reverse, 0), udp(Direction::Forward, 3 * CAP)] {
        match throughput(&target(&h), &opts) {
            Err(
                e @ ClientError::Refused {
                    reason: Refusal::Limits,
                    ..
                },
            ) => {
                assert_eq!(e.exit_code(), 4);
                assert!(e.to_string().contains("--max-bitrate"), "{e}");
            }
            other => panic!("expected a refusal for limits, got {other:?}"),
        }
    }
    // Within the cap, UDP runs both ways.
    for direction in [Direction::Forward, Direction::Reverse] {
        let r = throughput(&target(&h), &udp(direction, CAP / 2))
            .unwrap_or_else(|e| panic!("UDP {direction:?} within the cap: {e}"));
        assert!(r.receiver.bytes > 0);
    }
    // TCP the agent sends is paced to the cap, shared by its streams: on loopback it would
    // otherwise run at gigabits per second.
    let tcp = ThroughputOptions {
        protocol: Protocol::Tcp,
        direction: Direction::Reverse,
        parallel: 2,
        duration: Duration::from_secs(1),
        ..ThroughputOptions::default()
    };
    let outcome = throughput(&target(&h), &tcp);
    if !sonde_net::socket::KERNEL_TCP_PACING {
        // No kernel pacing here (Windows, macOS): refused, never sent above the cap.
        match outcome {
            Err(
                e @ ClientError::Refused {
                    reason: Refusal::Limits,
                    ..
                },
            ) => assert!(e.to_string().contains("SO_MAX_PACING_RATE"), "{e}"),
            other => panic!("expected a refusal where TCP cannot be paced, got {other:?}"),
        }
        return;
    }
    let r = outcome.expect("TCP reverse");
    assert!(r.receiver.bytes > 0);
    assert!(
        r.receiver.bits_per_second < 2.0 * CAP as f64,
        "the agent sent {:.1} Mbit/s with a {} Mbit/s cap",
        r.receiver.bits_per_second / 1e6,
        CAP / 1_000_000
    );
}

/// TCP the client sends is read no faster than the cap (a token bucket on the agent's reads;
/// flow control holds the client's sender to it), shared by the session's streams. The bound
/// is an upper one a busy machine cannot break: from its first byte on, each stream reads only
/// what its share of the cap has earned since, so the receiver figure (bytes over first to last
/// byte) stays at the cap; the stated tolerance, 1 %, is for rounding only. What the client's
/// socket buffers still hold a second after its senders end is left unread, so a test under a
/// low cap ends on time.
#[test]
fn max_bitrate_caps_what_the_agent_receives_over_tcp() {
    const CAP: u64 = 50_000_000;
    let forward = |parallel| ThroughputOptions {
        protocol: Protocol::Tcp,
        direction: Direction::Forward,
        parallel,
        duration: Duration::from_secs(1),
        ..ThroughputOptions::default()
    };
    let capped = agent(|c| c.max_bitrate = Some(CAP));
    for parallel in [1, 4] {
        let r = throughput(&target(&capped), &forward(parallel))
            .unwrap_or_else(|e| panic!("TCP forward -P {parallel} under a cap: {e}"));
        let span_s = r.receiver.duration_ns as f64 / 1e9;
        assert!(r.receiver.bytes > 0 && span_s > 0.0, "{:?}", r.receiver);
        let tolerance_bps = CAP as f64 * 0.01;
        eprintln!(
            "-P {parallel}: read {:.2} Mbit/s over {span_s:.2} s (at most {:.2})",
            r.receiver.bits_per_second / 1e6,
            (CAP as f64 + tolerance_bps) / 1e6
        );
        assert!(
            r.receiver.bits_per_second <= CAP as f64 + tolerance_bps,
            "-P {parallel}: the agent read {:.1} Mbit/s over {span_s:.2} s with a {} Mbit/s cap",
            r.receiver.bits_per_second / 1e6,
            CAP / 1_000_000
        );
    }
    // Many streams under a low cap: the client's socket buffers take megabytes a stream, which
    // read at 10 Mbit/s / 16 would keep the test going for about 50 s; the agent leaves them
    // unread a second after the client's senders end. (A bound ten times the expected 2 s.)
    let low = agent(|c| c.max_bitrate = Some(10_000_000));
    let started = Instant::now();
    let r = throughput(&target(&low), &forward(16)).expect("TCP forward -P 16 under a low cap");
    assert!(r.receiver.bytes > 0 && r.receiver.bytes <= r.sender.bytes);
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "a 1 s test under a cap took {:?}",
        started.elapsed()
    );
    // The same client without a cap: loopback reads at gigabits per second.
    let unlimited = agent(|_| {});
    let r = throughput(&target(&unlimited), &forward(1)).expect("TCP forward without a cap");
    assert!(
        r.receiver.bits_per_second > 4.0 * CAP as f64,
        "without a cap the agent read only {:.1} Mbit/s",
        r.receiver.bits_per_second / 1e6
    );
}
