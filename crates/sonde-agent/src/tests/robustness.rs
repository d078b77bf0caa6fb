//! Bad input, data channels, clients that vanish, UDP junk, limits and concurrent clients.

use super::*;

// ---------------------------------------------------------------------------------------------
// Bad input on a new connection
// ---------------------------------------------------------------------------------------------

#[test]
fn http_request_instead_of_a_preamble_is_closed_at_once() {
    // A hello timeout far above "at once", so a close by the timeout cannot pass for it.
    let h = agent(|c| c.hello_timeout = Duration::from_secs(5));
    let mut s = connect(&h);
    s.write_all(b"GET / HTTP/1.1\r\nHost: sonde\r\n\r\n")
        .expect("write");
    let took = closed_within(&mut s, Duration::from_secs(2))
        .expect("a non-sonde peer must be closed, not left waiting for the hello timeout");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_counter(&h, "bad_hello", |r| &r.bad_hello, 1);
    assert_serves(&h);
}

#[test]
fn truncated_frame_then_close_is_counted_and_forgotten() {
    let h = agent(|_| {});
    let mut s = connect(&h);
    s.write_all(&preamble(Channel::Control)).expect("preamble");
    s.write_all(&100u32.to_be_bytes()).expect("length");
    s.write_all(b"{\"type\":\"h").expect("10 bytes of body");
    drop(s);
    assert_counter(&h, "bad_hello", |r| &r.bad_hello, 1);
    assert_eq!(h.sessions(), 0);
    assert_serves(&h);
}

#[test]
fn a_4_gib_length_field_is_refused_without_waiting_for_the_body() {
    let h = agent(|c| c.hello_timeout = Duration::from_secs(5));
    let mut s = connect(&h);
    s.write_all(&preamble(Channel::Control)).expect("preamble");
    s.write_all(&u32::MAX.to_be_bytes()).expect("length");
    s.write_all(b"{\"type\":\"hello\"").expect("a little body");
    // Were the agent allocating or reading 4 GiB it would sit until the hello timeout (5 s).
    let took = closed_within(&mut s, Duration::from_secs(2))
        .expect("a 4 GiB frame must end the connection at once");
    assert!(took < Duration::from_secs(2), "{took:?}");
    assert_counter(&h, "bad_hello", |r| &r.bad_hello, 1);
    // Just above the limit is refused too.
    let mut s = connect(&h);
    s.write_all(&preamble(Channel::Control)).expect("preamble");
    s.write_all(&(sonde_wire::MAX_FRAME_LEN + 1).to_be_bytes())
        .expect("length");
    assert!(closed_within(&mut s, Duration::from_secs(2)).is_some());
    assert_counter(&h, "bad_hello", |r| &r.bad_hello, 2);
    assert_serves(&h);
}

#[test]
fn invalid_json_and_a_wrong_first_message_are_rejected() {
    let h = agent(|c| c.hello_timeout = Duration::from_secs(5));
    let bodies: [&[u8]; 4] = [
        b"{not json at all",
        b"{\"type\":\"no_such_message\"}",
        b"{\"type\":\"hello\",\"protocol\":\"one\"}",
        // A valid message, but not a hello.
        b"{\"type\":\"ready\"}",
    ];
    for (n, body) in bodies.iter().enumerate() {
        let mut s = connect(&h);
        s.write_all(&preamble(Channel::Control)).expect("preamble");
        let len = u32::try_from(body.len()).expect("short");
        s.write_all(&len.to_be_bytes()).expect("length");
        s.write_all(body).expect("body");
        assert!(
            closed_within(&mut s, Duration::from_secs(2)).is_some(),
            "body {:?} left the connection open",
            String::from_utf8_lossy(body)
        );
        assert_counter(&h, "bad_hello", |r| &r.bad_hello, n as u64 + 1);
    }
    assert_eq!(count(&h, |r| &r.refused), 0);
    assert_serves(&h);
}

#[test]
fn another_protocol_version_gets_a_refusal_it_can_decode() {
    let h = agent(|_| {});
    // In the hello.
    let mut s = connect(&h);
    s.write_all(&preamble(Channel::Control)).expect("preamble");
    s.write_all(&frame(&hello(PROTOCOL_VERSION + 1)))
        .expect("hello");
    let mut body = Vec::new();
    match read_frame(&mut s, &mut body, Instant::now() + PATIENCE) {
        Ok(ControlMsg::Refused { reason, message }) => {
            assert_eq!(reason, Refusal::Version);
            assert!(message.contains("version"), "{message}");
        }
        other => panic!("expected Refused{{version}}, got {other:?}"),
    }
    assert!(closed_within(&mut s, Duration::from_secs(2)).is_some());
    assert_counter(&h, "refused", |r| &r.refused, 1);

    // In the preamble: the agent answers before the hello.
    let mut s = connect(&h);
    let mut p = preamble(Channel::Control);
    p[4..6].copy_from_slice(&(PROTOCOL_VERSION + 1).to_be_bytes());
    s.write_all(&p).expect("preamble");
    match read_frame(&mut s, &mut body, Instant::now() + PATIENCE) {
        Ok(ControlMsg::Refused { reason, .. }) => assert_eq!(reason, Refusal::Version),
        other => panic!("expected Refused{{version}}, got {other:?}"),
    }
    assert_counter(&h, "refused", |r| &r.refused, 2);
    assert_eq!(count(&h, |r| &r.bad_hello), 0);
    assert_serves(&h);
}

#[test]
fn a_silent_client_is_closed_after_the_hello_timeout() {
    let h = agent(|_| {});
    let mut s = connect(&h);
    let took = closed_within(&mut s, Duration::from_secs(2))
        .expect("a silent connection must be closed by the hello timeout");
    assert!(
        took >= HELLO_TIMEOUT - Duration::from_millis(50),
        "closed after {took:?}, before the {HELLO_TIMEOUT:?} hello timeout"
    );
    assert_counter(&h, "bad_hello", |r| &r.bad_hello, 1);

    // Silent after the preamble: the hello must still come in time.
    let mut s = connect(&h);
    s.write_all(&preamble(Channel::Control)).expect("preamble");
    assert!(closed_within(&mut s, Duration::from_secs(2)).is_some());
    assert_counter(&h, "bad_hello", |r| &r.bad_hello, 2);
    assert_serves(&h);
}

#[test]
fn silent_connections_beyond_max_pending_are_closed_at_once() {
    const MAX_PENDING: usize = 4;
    const SILENT: usize = 10;
    let hello_timeout = Duration::from_secs(1);
    let h = agent(|c| {
        c.max_pending = MAX_PENDING;
        c.hello_timeout = hello_timeout;
    });
    let mut silent: Vec<TcpStream> = (0..SILENT).map(|_| connect(&h)).collect();
    let opened = Instant::now();
    // The extra ones are closed well before the hello timeout.
    assert_counter(
        &h,
        "pending_full",
        |r| &r.pending_full,
        (SILENT - MAX_PENDING) as u64,
    );
    let mut closed_early = 0;
    let mut still_open = Vec::new();
    for mut s in silent.drain(..) {
        if closed_within(&mut s, Duration::from_millis(100)).is_some() {
            closed_early += 1;
        } else {
            still_open.push(s);
        }
    }
    assert!(
        opened.elapsed() < hello_timeout,
        "the test itself was too slow to tell early from late"
    );
    assert_eq!(closed_early, SILENT - MAX_PENDING);
    // The pending ones are closed by the timeout; then a real client gets in.
    for mut s in still_open {
        assert!(closed_within(&mut s, PATIENCE).is_some());
    }
    assert!(opened.elapsed() >= hello_timeout - Duration::from_millis(100));
    assert_counter(&h, "bad_hello", |r| &r.bad_hello, MAX_PENDING as u64);
    assert_serves(&h);
}

// ---------------------------------------------------------------------------------------------
// Data channels
// ---------------------------------------------------------------------------------------------

#[test]
fn a_data_channel_with_an_unknown_token_is_closed() {
    let h = agent(|c| c.hello_timeout = Duration::from_secs(5));
    let mut s = tcp_join(&h, None, Token(0x0123_4567_89ab_cdef), 0);
    assert!(closed_within(&mut s, Duration::from_secs(2)).is_some());
    assert_counter(&h, "bad_join", |r| &r.bad_join, 1);
    // A truncated join is closed too.
    let mut s = connect(&h);
    s.write_all(&preamble(Channel::Data)).expect("preamble");
    s.write_all(&[1, 2, 3]).expect("3 of 16 bytes");
    s.shutdown(std::net::Shutdown::Write).expect("shutdown");
    assert!(closed_within(&mut s, Duration::from_secs(2)).is_some());
    assert_counter(&h, "bad_join", |r| &r.bad_join, 2);
    assert_serves(&h);
}

/// Says `Go`, sends `chunks` of 16 KiB on each of `data`, ends them, tells the agent, and returns
/// its report.
fn finish_forward(raw: &mut Raw, data: &mut [TcpStream], chunks: u32) -> sonde_wire::AgentReport {
    raw.send(&ControlMsg::Go);
    let chunk = [0u8; 16 * 1024];
    let mut streams = Vec::new();
    for (i, s) in data.iter_mut().enumerate() {
        for _ in 0..chunks {
            s.write_all(&chunk).expect("send data");
        }
        s.shutdown(std::net::Shutdown::Write).expect("end of data");
        streams.push(sonde_wire::StreamStats {
            stream: u32::try_from(i).expect("few streams"),
            bytes: u64::from(chunks) * chunk.len() as u64,
            packets: u64::from(chunks),
            ..sonde_wire::StreamStats::default()
        });
    }
    raw.send(&ControlMsg::SenderDone { streams });
    for _ in 0..1_000 {
        match raw.recv() {
            ControlMsg::Report(r) => return r,
            ControlMsg::Interval(_) | ControlMsg::SenderDone { .. } => {}
            other => panic!("expected the report, got {other:?}"),
        }
    }
    panic!("no report among 1,000 control messages");
}

#[test]
fn joins_out_of_range_or_taken_are_refused_and_the_session_goes_on() {
    let h = agent(|_| {});
    let spec = TestSpec {
        streams: 2,
        ..spec(
            TestKind::Throughput,
            Protocol::Tcp,
            Direction::Forward,
            2_000,
        )
    };
    let (mut raw, token) = Raw::accepted(&h, &spec);
    for stream in [2, 7, u32::MAX] {
        let mut s = tcp_join(&h, None, token, stream);
        assert!(
            closed_within(&mut s, Duration::from_secs(2)).is_some(),
            "stream {stream} of a 2-stream session was kept"
        );
    }
    assert_counter(&h, "bad_join", |r| &r.bad_join, 3);
    // Two joins for stream 0: the agent keeps exactly one (whichever it saw first).
    let mut twins = [tcp_join(&h, None, token, 0), tcp_join(&h, None, token, 0)];
    let closed: Vec<bool> = twins
        .iter_mut()
        .map(|s| closed_within(s, Duration::from_millis(500)).is_some())
        .collect();
    assert_eq!(
        closed.iter().filter(|&&c| c).count(),
        1,
        "two joins for one stream: closed {closed:?}"
    );
    assert_counter(&h, "bad_join", |r| &r.bad_join, 4);
    let [a, b] = twins;
    let kept = if closed[0] { b } else { a };
    let second = tcp_join(&h, None, token, 1);
    assert_eq!(raw.recv(), ControlMsg::Ready);
    // The session runs to its report with the channels that were kept.
    let report = finish_forward(&mut raw, &mut [kept, second], 32);
    assert_eq!(report.received.len(), 2, "{report:?}");
    for r in &report.received {
        assert_eq!(r.bytes, 32 * 16 * 1024, "{report:?}");
    }
    assert!(wait_until(PATIENCE, || h.sessions() == 0));
    assert_serves(&h);
}

#[test]
fn a_second_join_for_a_running_stream_is_refused() {
    let h = agent(|_| {});
    let spec = spec(
        TestKind::Throughput,
        Protocol::Tcp,
        Direction::Forward,
        2_000,
    );
    let (mut raw, token) = Raw::accepted(&h, &spec);
    let data = tcp_join(&h, None, token, 0);
    assert_eq!(raw.recv(), ControlMsg::Ready);
    // Stream 0 is joined and running: another connection with the same token and stream is
    // not the client's, and must not be taken in (and held open) by the session.
    let mut late = tcp_join(&h, None, token, 0);
    let closed = closed_within(&mut late, Duration::from_secs(1));
    assert_eq!(h.sessions(), 1, "the session must still be running here");
    assert!(
        closed.is_some(),
        "a second join for stream 0 after Ready was kept open by the agent"
    );
    assert_counter(&h, "bad_join", |r| &r.bad_join, 1);
    let report = finish_forward(&mut raw, &mut [data], 32);
    assert_eq!(report.received.len(), 1, "{report:?}");
    assert_eq!(report.received[0].bytes, 32 * 16 * 1024, "{report:?}");
    assert!(wait_until(PATIENCE, || h.sessions() == 0));
    assert_serves(&h);
}

#[test]
fn a_tcp_data_channel_from_another_address_is_not_accepted() {
    let h = agent(|_| {});
    let spec = spec(TestKind::Throughput, Protocol::Tcp, Direction::Forward, 300);
    let (mut raw, token) = Raw::accepted(&h, &spec);
    // The control connection came from 127.0.0.1; the right token from 127.0.0.2 is someone else.
    let other: SocketAddr = "127.0.0.2:0".parse().expect("an address");
    let mut s = tcp_join(&h, Some(other), token, 0);
    assert!(closed_within(&mut s, Duration::from_secs(2)).is_some());
    assert_counter(&h, "bad_join", |r| &r.bad_join, 1);
    // The stream is still free for the real client.
    let data = tcp_join(&h, None, token, 0);
    assert_eq!(raw.recv(), ControlMsg::Ready);
    drop((raw, data));
    assert!(wait_until(PATIENCE, || h.sessions() == 0));
    assert_serves(&h);
}

#[test]
fn a_udp_flow_from_another_address_is_not_acknowledged() {
    let h = agent(|_| {});
    let spec = spec(TestKind::Throughput, Protocol::Udp, Direction::Forward, 300);
    let (mut raw, token) = Raw::accepted(&h, &spec);
    let stranger = UdpSocket::bind("127.0.0.2:0").expect("bind 127.0.0.2");
    assert!(
        !udp_join(
            &stranger,
            h.local_addr(),
            token,
            0,
            Duration::from_millis(300)
        ),
        "the agent acknowledged a flow from an address that did not open the session"
    );
    assert!(count(&h, |r| &r.udp_junk) >= 1);
    let own = UdpSocket::bind("127.0.0.1:0").expect("bind");
    assert!(udp_join(&own, h.local_addr(), token, 0, PATIENCE));
    assert_eq!(raw.recv(), ControlMsg::Ready);
    drop((raw, own));
    assert!(wait_until(PATIENCE, || h.sessions() == 0));
    assert_serves_over(&h, Protocol::Udp);
}

// ---------------------------------------------------------------------------------------------
// Clients that vanish
// ---------------------------------------------------------------------------------------------

/// Starts a 5 s test by hand, lets it run briefly, drops every socket: the agent must end the
/// session within a couple of seconds, not at the planned end (or a minute after).
fn vanish_mid_test(protocol: Protocol, direction: Direction) {
    let h = agent(|_| {});
    let spec = spec(TestKind::Throughput, protocol, direction, 5_000);
    let (mut raw, token) = Raw::accepted(&h, &spec);
    let data: Box<dyn std::any::Any> = match protocol {
        Protocol::Tcp => {
            let mut s = tcp_join(&h, None, token, 0);
            assert_eq!(raw.recv(), ControlMsg::Ready);
            raw.send(&ControlMsg::Go);
            if direction == Direction::Forward {
                s.write_all(&[0u8; 64 * 1024]).expect("send some data");
            } else {
                // The agent's sender is running: data arrives.
                let mut buf = [0u8; 64 * 1024];
                s.set_read_timeout(Some(PATIENCE))
                    .expect("set a read timeout");
                s.read_exact(&mut buf).expect("the agent sends after Go");
            }
            Box::new(s)
        }
        Protocol::Udp => {
            let sock = UdpSocket::bind("127.0.0.1:0").expect("bind");
            assert!(udp_join(&sock, h.local_addr(), token, 0, PATIENCE));
            assert_eq!(raw.recv(), ControlMsg::Ready);
            raw.send(&ControlMsg::Go);
            Box::new(sock)
        }
    };
    assert_eq!(h.sessions(), 1);
    thread::sleep(Duration::from_millis(200));
    let gone = Instant::now();
    drop((raw, data));
    assert!(
        wait_until(Duration::from_secs(2), || h.sessions() == 0),
        "{protocol:?} {direction:?}: the session outlived its client by 2 s"
    );
    eprintln!(
        "{protocol:?} {direction:?}: session ended {:?} after the client",
        gone.elapsed()
    );
    assert_serves(&h);
}

#[test]
fn a_tcp_sender_killed_mid_test_frees_its_session() {
    vanish_mid_test(Protocol::Tcp, Direction::Forward);
}

#[test]
fn a_tcp_receiver_killed_mid_test_frees_its_session() {
    vanish_mid_test(Protocol::Tcp, Direction::Reverse);
}

#[test]
fn a_udp_client_killed_mid_test_frees_its_session() {
    vanish_mid_test(Protocol::Udp, Direction::Forward);
}

// ---------------------------------------------------------------------------------------------
// UDP junk
// ---------------------------------------------------------------------------------------------

#[test]
fn a_udp_junk_flood_is_counted_and_udp_tests_still_run() {
    const FLOOD: u64 = 20_000;
    let h = agent(|_| {});
    let to = h.local_addr();
    let sock = UdpSocket::bind("127.0.0.1:0").expect("bind");
    let mut junk = Junk(0x5eed_0f5a_5a5a_1234);
    let mut buf = [0u8; 1500];
    for n in 0..FLOOD {
        let len = match n % 10 {
            // Well-formed joins and acknowledgements for sessions that do not exist.
            0 | 1 => {
                let join = UdpJoin {
                    ack: n % 10 == 1,
                    flow: u16::try_from(junk.below(4)).expect("small"),
                    token: Token(junk.next()),
                    ..UdpJoin::default()
                };
                buf[..UDP_JOIN_LEN].copy_from_slice(&join.encode());
                UDP_JOIN_LEN
            }
            // Joins of another protocol version, and truncated ones.
            2 => {
                buf[..4].copy_from_slice(b"SNDJ");
                buf[4..6].copy_from_slice(&(PROTOCOL_VERSION + 1).to_be_bytes());
                if junk.below(2) == 0 {
                    UDP_JOIN_LEN
                } else {
                    usize::try_from(junk.below(UDP_JOIN_LEN as u64)).expect("small")
                }
            }
            _ => {
                let len = usize::try_from(junk.below(1500)).expect("small");
                for b in &mut buf[..len] {
                    *b = junk.next() as u8;
                }
                len
            }
        };
        // A full socket buffer may refuse a send; the flood is best effort.
        let _ = sock.send_to(&buf[..len], to);
        if n % 500 == 499 {
            thread::sleep(Duration::from_millis(1));
        }
    }
    // Wait for the dispatcher to drain what the kernel kept.
    let mut last = u64::MAX;
    wait_until(PATIENCE, || {
        let now = count(&h, |r| &r.udp_junk);
        let settled = now == last;
        last = now;
        thread::sleep(Duration::from_millis(100));
        settled
    });
    let flooded = count(&h, |r| &r.udp_junk);
    assert!(
        (1..=FLOOD).contains(&flooded),
        "{flooded} of {FLOOD} junk datagrams counted"
    );
    // Each datagram is counted once: ten more, slowly enough that none is dropped.
    for _ in 0..10 {
        sock.send_to(b"junk", to).expect("send");
        thread::sleep(Duration::from_millis(5));
    }
    assert_counter(&h, "udp_junk", |r| &r.udp_junk, flooded + 10);
    assert_eq!(h.sessions(), 0);
    assert_serves_over(&h, Protocol::Udp);
    assert_serves(&h);
}

// ---------------------------------------------------------------------------------------------
// Limits
// ---------------------------------------------------------------------------------------------

#[test]
fn max_sessions_refuses_the_next_client_as_busy() {
    let h = agent(|c| c.max_sessions = 1);
    let spec = spec(
        TestKind::Throughput,
        Protocol::Tcp,
        Direction::Forward,
        5_000,
    );
    let (mut raw, token) = Raw::accepted(&h, &spec);
    assert_eq!(h.sessions(), 1);
    let err = latency(&target(&h), &latency_opts(Protocol::Tcp))
        .expect_err("a second session while the only one is held");
    match &err {
        ClientError::Refused { reason, message } => {
            assert_eq!(*reason, Refusal::Busy);
            assert!(message.contains("--max-sessions"), "{message}");
        }
        other => panic!("expected Refused{{busy}}, got {other:?}"),
    }
    assert_eq!(err.exit_code(), 4);
    assert_counter(&h, "refused", |r| &r.refused, 1);
    // Once the held session's client goes, the slot is free again.
    let data = tcp_join(&h, None, token, 0);
    assert_eq!(raw.recv(), ControlMsg::Ready);
    drop((raw, data));
    assert!(wait_until(PATIENCE, || h.sessions() == 0));
    assert_serves(&h);
}

#[test]
fn a_test_longer_than_max_duration_is_refused_for_limits() {
    let h = agent(|c| c.max_duration = Duration::from_secs(1));
    let opts = LatencyOptions {
        duration: Duration::from_secs(2),
        ..latency_opts(Protocol::Tcp)
    };
    match latency(&target(&h), &opts) {
        Err(e @ ClientError::Refused { reason, .. }) => {
            assert_eq!(reason, Refusal::Limits);
            assert_eq!(e.exit_code(), 4);
            assert!(e.to_string().contains("--max-duration"), "{e}");
        }
        other => panic!("expected Refused{{limits}}, got {other:?}"),
    }
    assert_counter(&h, "refused", |r| &r.refused, 1);
    assert_eq!(h.sessions(), 0);
    // Within the limit (0.4 s including warm-up) is fine.
    assert_serves(&h);
}

#[test]
fn more_streams_than_max_streams_are_refused_for_limits() {
    let h = agent(|c| c.max_streams = 2);
    let opts = ThroughputOptions {
        parallel: 3,
        duration: Duration::from_millis(300),
        ..ThroughputOptions::default()
    };
    match throughput(&target(&h), &opts) {
        Err(e @ ClientError::Refused { reason, .. }) => {
            assert_eq!(reason, Refusal::Limits);
            assert_eq!(e.exit_code(), 4);
            assert!(e.to_string().contains("--max-streams"), "{e}");
        }
        other => panic!("expected Refused{{limits}}, got {other:?}"),
    }
    assert_counter(&h, "refused", |r| &r.refused, 1);
    // At the limit is fine.
    let ok = throughput(
        &target(&h),
        &ThroughputOptions {
            parallel: 2,
            ..opts
        },
    )
    .expect("2 streams are within --max-streams 2");
    assert_eq!(ok.streams.len(), 2);
    assert!(ok.receiver.bytes > 0);
}

#[test]
fn nonsense_requests_are_refused_as_bad_requests() {
    let h = agent(|_| {});
    let base = spec(TestKind::Throughput, Protocol::Tcp, Direction::Forward, 300);
    let cases = [
        TestSpec {
            streams: 0,
            ..base.clone()
        },
        TestSpec {
            duration_ms: 0,
            ..base.clone()
        },
        TestSpec {
            msg_size: 0,
            ..base.clone()
        },
        TestSpec {
            interval_ms: 1,
            read_size: 0,
            ..base.clone()
        },
        TestSpec {
            kind: TestKind::Pps,
            ..base.clone()
        },
        TestSpec {
            protocol: Protocol::Udp,
            msg_size: 8,
            ..base.clone()
        },
    ];
    for (n, spec) in cases.iter().enumerate() {
        match Raw::start(&h, spec) {
            (_, ControlMsg::Refused { reason, .. }) => {
                assert_eq!(reason, Refusal::BadRequest, "{spec:?}");
            }
            (_, other) => panic!("{spec:?} was not refused: {other:?}"),
        }
        assert_counter(&h, "refused", |r| &r.refused, n as u64 + 1);
    }
    assert_eq!(h.sessions(), 0);
    assert_serves(&h);
}

// ---------------------------------------------------------------------------------------------
// Concurrency
// ---------------------------------------------------------------------------------------------

#[test]
fn four_clients_at_once_all_run_and_see_each_other() {
    const CLIENTS: usize = 4;
    let h = agent(|_| {});
    let t = target(&h);
    let start = Arc::new(Barrier::new(CLIENTS));
    let overlaps: Vec<u32> = thread::scope(|s| {
        let runs: Vec<_> = (0..CLIENTS)
            .map(|i| {
                let (t, start) = (&t, Arc::clone(&start));
                s.spawn(move || -> Result<u32, ClientError> {
                    start.wait();
                    if i % 2 == 0 {
                        let r = latency(
                            t,
                            &LatencyOptions {
                                duration: Duration::from_millis(700),
                                ..latency_opts(Protocol::Tcp)
                            },
                        )?
                        .result;
                        assert!(r.samples > 0, "client {i}: {r:?}");
                        Ok(r.meta.overlapping_sessions)
                    } else {
                        let r = throughput(
                            t,
                            &ThroughputOptions {
                                duration: Duration::from_millis(800),
                                ..ThroughputOptions::default()
                            },
                        )?;
                        assert!(r.receiver.bytes > 0, "client {i}: {r:?}");
                        Ok(r.meta.overlapping_sessions)
                    }
                })
            })
            .collect();
        runs.into_iter()
            .enumerate()
            .map(|(i, r)| {
                r.join()
                    .expect("client thread")
                    .unwrap_or_else(|e| panic!("client {i} failed while others ran: {e}"))
            })
            .collect()
    });
    for (i, o) in overlaps.iter().enumerate() {
        assert!(
            (1..CLIENTS as u32).contains(o),
            "client {i}: overlapping_sessions {o}, expected 1..={}",
            CLIENTS - 1
        );
    }
    assert_eq!(count(&h, |r| &r.refused), 0);
    assert!(wait_until(PATIENCE, || h.sessions() == 0));
}
