use super::*;
use std::net::{Ipv4Addr, SocketAddr};
use std::thread::ScopedJoinHandle;
use std::time::Instant;

use sonde_wire::Token;

const MS: u64 = 1_000_000;
const SECOND: Option<Duration> = Some(Duration::from_secs(1));

fn loopback() -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, 0))
}

/// The agent's arrangement: a listener on the shared port, a client that joined through it,
/// and the flow socket for that client. Returns `(listener, flow, client)`.
fn udp_flow_pair() -> (UdpSocket, UdpSocket, UdpSocket) {
    let listener = socket::udp_listen(loopback()).unwrap();
    let local = listener.local_addr().unwrap();
    let client = socket::udp_connect(local).unwrap();
    let flow = socket::udp_flow(local, client.local_addr().unwrap()).unwrap();
    (listener, flow, client)
}

/// Lets a receiver finish: waits (at most 5 s) for it to reach its expected count, or, when
/// `lossy`, only until its counters stop moving for 200 ms; then sets `stop`.
fn finish<T>(rx: &ScopedJoinHandle<'_, T>, counters: &Counters, stop: &AtomicBool, lossy: bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = counters.load();
    while !rx.is_finished() && Instant::now() < deadline {
        thread::sleep(Duration::from_millis(200));
        let now = counters.load();
        if lossy && now == last {
            break;
        }
        last = now;
    }
    stop.store(true, Ordering::Relaxed);
}

/// A connected TCP pair on loopback: (client, accepted server end).
fn tcp_pair() -> (TcpStream, TcpStream) {
    let listener = socket::tcp_listen(loopback()).unwrap();
    let client = socket::tcp_connect(
        listener.local_addr().unwrap(),
        Duration::from_secs(1),
        false,
    )
    .unwrap();
    let (server, _) = listener.accept().unwrap();
    (client, server)
}

/// What one transfer over a loopback TCP pair did: both loops' outcomes and counters.
struct Transfer {
    sent: SendOutcome,
    received: TcpRecvOutcome,
    tx: Counters,
    rx: Counters,
    /// From the start of the transfer until the receiver ended.
    elapsed: Duration,
}

/// A sender loop on the client end of a pair, as [`tcp_transfer`] runs it.
type Sender<'a> =
    Box<dyn FnOnce(&TcpStream, &Clock, &AtomicBool, &Counters) -> io::Result<SendOutcome> + 'a>;

/// [`tcp_send`] with `opts`, for [`tcp_transfer`].
fn sender(opts: TcpSendOptions) -> Sender<'static> {
    Box::new(move |stream, clock, stop, counters| tcp_send(stream, &opts, clock, stop, counters))
}

/// Runs `send` on the client end of a loopback TCP pair and [`tcp_recv`] with `recv` on the
/// accepted end, on one clock, until the receiver sees the end of the stream; `stop` only ends
/// the receiver if it has not in 10 s after the sender returned. Panics if either loop fails.
fn tcp_transfer(recv: &TcpRecvOptions, send: Sender<'_>) -> Transfer {
    let (client, server) = tcp_pair();
    let clock = Clock::start();
    let stop = AtomicBool::new(false);
    let (tx, rx) = (Counters::default(), Counters::default());
    let started = Instant::now();
    let (sent, received, elapsed) = thread::scope(|s| {
        let receiver = s.spawn(|| tcp_recv(&server, recv, &clock, &stop, &rx));
        let sent = send(&client, &clock, &stop, &tx);
        let deadline = Instant::now() + Duration::from_secs(10);
        while !receiver.is_finished() && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(10));
        }
        stop.store(true, Ordering::Relaxed);
        let received = receiver.join().unwrap().unwrap();
        (sent.unwrap(), received, started.elapsed())
    });
    Transfer {
        sent,
        received,
        tx,
        rx,
        elapsed,
    }
}

/// `-O`: what crosses before the omit time is counted apart at both ends, what follows in the
/// totals, and the per-stream counters (the intervals) see every byte.
#[test]
fn an_omit_period_is_counted_apart_at_both_ends() {
    let omit = 100 * MS;
    let Transfer {
        sent,
        received,
        tx,
        rx,
        ..
    } = tcp_transfer(
        &TcpRecvOptions {
            omit_until_ns: omit,
            ..TcpRecvOptions::default()
        },
        sender(TcpSendOptions {
            omit_until_ns: omit,
            ..TcpSendOptions::until(128 << 10, 300 * MS)
        }),
    );
    assert!(sent.omitted_bytes > 0 && sent.bytes > 0, "{sent:?}");
    assert!(
        received.omitted_bytes > 0 && received.bytes > 0,
        "{received:?}"
    );
    // Every byte arrived, on one side of the cut or the other.
    assert_eq!(
        received.bytes + received.omitted_bytes,
        sent.bytes + sent.omitted_bytes
    );
    assert_eq!(tx.load().0, sent.bytes + sent.omitted_bytes);
    assert_eq!(rx.load().0, received.bytes + received.omitted_bytes);
    // The counted window starts at the omit time.
    assert!(received.first_ns >= omit, "{received:?}");
}

/// `-O` over UDP: the sender counts what it sent before its omit time apart, the receiver cuts
/// the omit period off by sequence number, and nothing is lost or counted twice between them.
#[test]
fn a_udp_omit_period_is_cut_by_sequence_number_at_both_ends() {
    const SIZE: u32 = 1000;
    let omit = 100 * MS;
    let (_listener, flow, client) = udp_flow_pair();
    let clock = Clock::start();
    let stop = AtomicBool::new(false);
    let expect = AtomicU64::new(u64::MAX);
    let from = AtomicU64::new(0);
    let (tx, rx) = (Counters::default(), Counters::default());
    let (sent, received) = thread::scope(|s| {
        let r = s.spawn(|| {
            let opts = UdpRecvOptions {
                msg_size: SIZE,
                format: UdpFormat::Sonde,
                ecn: false,
                omit: Some(UdpOmit {
                    from_ns: &from,
                    omit_ns: omit,
                }),
            };
            udp_recv_with(&flow, &opts, &clock, &stop, &expect, &rx)
        });
        // Paced: loopback keeps up, so every datagram arrives.
        let opts = UdpSendOptions {
            msg_size: SIZE,
            bits_per_second: 20_000_000,
            format: UdpFormat::Sonde,
            gso: false,
            until_ns: 300 * MS,
            omit_until_ns: omit,
            max_bytes: u64::MAX,
        };
        let sent = udp_send_with(&client, &opts, &clock, &stop, &tx).unwrap();
        expect.store(sent.packets + sent.omitted_packets, Ordering::Relaxed);
        finish(&r, &rx, &stop, false);
        (sent, r.join().unwrap().unwrap())
    });
    assert!(sent.omitted_packets > 0 && sent.packets > 0, "{sent:?}");
    assert_eq!(sent.omitted_bytes, sent.omitted_packets * u64::from(SIZE));
    let total = sent.packets + sent.omitted_packets;
    let omitted = received.omitted.as_ref().expect("cut");
    // The cut is where the receiver's clock crossed the omit time: close to the sender's.
    assert!(omitted.seqs > 0 && omitted.seqs < total, "{omitted:?}");
    assert_eq!(omitted.seq.received(), omitted.seqs);
    assert_eq!(received.seq.received() + omitted.seqs, total);
    assert_eq!(received.lost(total), 0);
    assert_eq!(received.packets, total - omitted.seqs);
    assert_eq!(received.bytes + omitted.bytes, total * u64::from(SIZE));
    assert!(received.first_ns >= omit, "{received:?}");
    // The intervals see every datagram.
    assert_eq!(rx.load(), (total * u64::from(SIZE), total));
    assert_eq!(tx.load(), (total * u64::from(SIZE), total));
}

/// `-n`/`-k` over UDP: the sender stops after the datagrams that hold the byte count (whole
/// datagrams, the last one past it where it does not divide), whatever the method.
#[test]
fn a_udp_sender_with_a_byte_count_sends_whole_datagrams_up_to_it() {
    for (max_bytes, rate, datagrams) in [(10_000, 0, 10), (10_500, 0, 11), (5_000, 8_000_000, 5)] {
        let (_listener, flow, client) = udp_flow_pair();
        let clock = Clock::start();
        let stop = AtomicBool::new(false);
        let expect = AtomicU64::new(u64::MAX);
        let (tx, rx) = (Counters::default(), Counters::default());
        let (sent, received) = thread::scope(|s| {
            let r =
                s.spawn(|| udp_recv(&flow, 1000, UdpFormat::Sonde, &clock, &stop, &expect, &rx));
            let opts = UdpSendOptions {
                msg_size: 1000,
                bits_per_second: rate,
                format: UdpFormat::Sonde,
                gso: true,
                until_ns: 5_000 * MS,
                omit_until_ns: 0,
                max_bytes,
            };
            let sent = udp_send_with(&client, &opts, &clock, &stop, &tx).unwrap();
            expect.store(sent.packets, Ordering::Relaxed);
            finish(&r, &rx, &stop, false);
            (sent, r.join().unwrap().unwrap())
        });
        assert_eq!(sent.packets, datagrams, "{max_bytes}: {sent:?}");
        assert_eq!(sent.bytes, datagrams * 1000);
        // Ended by the count, long before the deadline.
        assert!(clock.now_ns() < 4_000 * MS);
        assert_eq!(received.seq.received(), datagrams);
    }
}

/// The cut is by sequence number: a datagram of the omit period that arrives after the cut is
/// the omit period's (a duplicate of it too), and the test's loss counts only the sequence
/// numbers after the cut. Also: a receiver that starts before the test's start is known (the
/// agent's, before `Go`) omits everything until it is.
#[test]
fn late_datagrams_of_the_omit_period_stay_out_of_the_test_counts() {
    let (_listener, flow, client) = udp_flow_pair();
    let clock = Clock::start();
    let stop = AtomicBool::new(false);
    let expect = AtomicU64::new(u64::MAX);
    let from = AtomicU64::new(u64::MAX);
    let rx = Counters::default();
    let send = |seq: u64| {
        let mut buf = [0u8; 100];
        UdpFormat::Sonde.write(seq, clock.now_ns(), &mut buf);
        client.send(&buf).unwrap();
    };
    // Lets the receiver take each datagram in a batch of its own.
    let settle = |n: u64| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while rx.load().1 < n && Instant::now() < deadline {
            thread::sleep(Duration::from_millis(5));
        }
    };
    let received = thread::scope(|s| {
        let r = s.spawn(|| {
            let opts = UdpRecvOptions {
                msg_size: 100,
                format: UdpFormat::Sonde,
                ecn: false,
                omit: Some(UdpOmit {
                    from_ns: &from,
                    omit_ns: 0,
                }),
            };
            udp_recv_with(&flow, &opts, &clock, &stop, &expect, &rx)
        });
        // Before the start is known: the omit period's, seqs 0 to 4.
        for (n, seq) in (0..5).enumerate() {
            send(seq);
            settle(n as u64 + 1);
        }
        from.store(0, Ordering::Relaxed);
        // After it: 7 cuts at 5; 2 is a late duplicate of the omit period, 6, 8, 9 the test's; 5 lost.
        for (n, seq) in [7, 2, 6, 8, 9].into_iter().enumerate() {
            send(seq);
            settle(n as u64 + 6);
        }
        stop.store(true, Ordering::Relaxed);
        r.join().unwrap().unwrap()
    });
    let omitted = received.omitted.as_ref().expect("cut");
    assert_eq!(omitted.seqs, 5);
    assert_eq!((omitted.seq.received(), omitted.seq.duplicated()), (5, 1));
    assert_eq!(omitted.bytes, 600);
    assert_eq!((received.packets, received.seq.received()), (4, 4));
    assert_eq!(received.bytes, 400);
    assert_eq!(received.seq.reordered(), 1);
    assert_eq!(received.lost(10), 1);
    assert_eq!(rx.load(), (1000, 10));
}

/// `--skip-rx-copy`: a receiver that discards in the kernel counts every byte sent, with one
/// system call per read as before.
#[test]
#[cfg(target_os = "linux")]
fn a_receiver_that_discards_counts_every_byte() {
    let Transfer {
        sent, received, rx, ..
    } = tcp_transfer(
        &TcpRecvOptions {
            discard: true,
            ..TcpRecvOptions::default()
        },
        sender(TcpSendOptions::until(128 << 10, 200 * MS)),
    );
    assert!(sent.bytes > 0);
    assert_eq!(received.bytes, sent.bytes);
    // One call per read that returned data, and the one that saw the end.
    let calls = rx.syscalls();
    assert!(
        (received.reads..=received.reads + 5).contains(&calls),
        "{calls} calls for {} reads",
        received.reads
    );
}

/// `-n`/`-k`: the sender stops at its byte count, the last write cut to fit, and the receiver
/// reads exactly that many before the end of the stream.
#[test]
fn a_sender_with_a_byte_count_stops_there() {
    let limit = 1_000_003;
    let Transfer { sent, received, .. } = tcp_transfer(
        &TcpRecvOptions::default(),
        sender(TcpSendOptions {
            max_bytes: limit,
            ..TcpSendOptions::until(64 << 10, 5_000 * MS)
        }),
    );
    assert_eq!(sent.bytes, limit);
    assert_eq!(received.bytes, limit);
}

#[test]
fn tcp_send_to_tcp_recv_delivers_every_byte_sent() {
    let Transfer {
        sent,
        received,
        tx,
        rx,
        ..
    } = tcp_transfer(
        &TcpRecvOptions::default(),
        sender(TcpSendOptions::until(128 << 10, 300 * MS)),
    );
    assert_eq!(sent.method, "write");
    assert!(sent.bytes > 0);
    assert_eq!(received.bytes, sent.bytes);
    assert_eq!(tx.load(), (sent.bytes, sent.packets));
    assert_eq!(rx.load(), (received.bytes, received.reads));
    assert!(received.reads > 0);
    assert!(0 < received.first_ns && received.first_ns <= received.last_ns);
    assert!(sent.active_ns > 0);
    if cfg!(target_os = "linux") {
        assert!(sent.retransmits.is_some());
    }
    // One write call per write counted, plus the few that timed out (100 ms each, within a
    // 300 ms run); the receiver's reads plus the one that saw the end.
    let tx_calls = tx.syscalls();
    assert!(
        (sent.packets..=sent.packets + 5).contains(&tx_calls),
        "{tx_calls} calls for {} writes",
        sent.packets
    );
    assert!(rx.syscalls() > received.reads);
}

/// `-Z`: a zero-copy sender delivers every byte, and the kernel completes every send it made;
/// on loopback it says it copied each one (the receiving socket cannot take the sender's
/// pages), which is what the result must then report.
#[test]
#[cfg(target_os = "linux")]
fn a_zero_copy_sender_delivers_every_byte_and_accounts_for_every_send() {
    // Small messages too: the ring is 256 buffers, far fewer than the sends.
    for msg_size in [128 << 10, 1000] {
        let Transfer {
            sent, received, tx, ..
        } = tcp_transfer(
            &TcpRecvOptions::default(),
            sender(TcpSendOptions {
                zerocopy: true,
                ..TcpSendOptions::until(msg_size, 200 * MS)
            }),
        );
        assert_eq!(sent.method, "send+MSG_ZEROCOPY");
        assert!(sent.bytes > 0);
        assert_eq!(received.bytes, sent.bytes);
        assert_eq!(tx.load(), (sent.bytes, sent.packets));
        let zc = sent.zerocopy.expect("zero-copy counts");
        // One numbered send per write call that moved data, each completed once.
        assert_eq!(zc.sends, sent.packets, "{zc:?}");
        assert_eq!(zc.completed, zc.sends, "{zc:?}");
        assert_eq!(
            zc.copied, zc.completed,
            "loopback copies every send: {zc:?}"
        );
        // The reads of the error queue count as system calls too.
        assert!(tx.syscalls() > sent.packets);
    }
}

#[test]
fn paced_tcp_sends_its_blocks_on_schedule_and_never_ahead_of_it() {
    // 1,000-byte blocks at 800 kbit/s: one block every 10 ms, 30 in a 300 ms run.
    let Transfer {
        sent, received, tx, ..
    } = tcp_transfer(
        &TcpRecvOptions::default(),
        Box::new(|stream, clock, stop, counters| {
            tcp_send_paced(stream, 1000, 800_000, clock, 300 * MS, stop, counters)
        }),
    );
    assert_eq!(sent.method, "write (paced)");
    assert_eq!(received.bytes, sent.bytes);
    // Block k is due at k × 10 ms: at most 30 fit before the end, and a sender that is not
    // starved sends nearly all of them.
    assert!(
        sent.bytes <= 30 * 1000,
        "{} bytes: ahead of the schedule",
        sent.bytes
    );
    assert!(
        sent.bytes >= 20 * 1000,
        "{} bytes: far behind the schedule",
        sent.bytes
    );
    assert_eq!(sent.bytes % 1000, 0, "blocks are written whole");
    assert_eq!(tx.load(), (sent.bytes, sent.packets));
}

#[test]
fn tcp_recv_reads_no_more_than_its_read_size_at_a_time() {
    const READ: u32 = 1000;
    // 128 KiB writes: the queue holds far more than one read's worth.
    let Transfer { sent, received, .. } = tcp_transfer(
        &TcpRecvOptions {
            read_size: READ,
            ..TcpRecvOptions::default()
        },
        sender(TcpSendOptions::until(128 << 10, 100 * MS)),
    );
    assert_eq!(received.bytes, sent.bytes);
    // Every read asked for 1,000 bytes at most, so at least bytes / 1,000 reads were made.
    assert!(
        received.reads >= received.bytes.div_ceil(u64::from(READ)),
        "{} reads for {} bytes",
        received.reads,
        received.bytes
    );
}

#[test]
fn capped_tcp_recv_reads_no_faster_than_its_rate_and_still_gets_every_byte() {
    const RATE: u64 = 16_000_000; // bytes per second, far below loopback's speed
                                  // The receiver drains what the sender left queued at its capped rate, then sees the EOF.
    let Transfer {
        sent,
        received,
        rx,
        elapsed,
        ..
    } = tcp_transfer(
        &TcpRecvOptions {
            max_bytes_per_second: Some(RATE),
            ..TcpRecvOptions::default()
        },
        sender(TcpSendOptions::until(128 << 10, 300 * MS)),
    );
    assert!(sent.bytes > 0);
    assert_eq!(received.bytes, sent.bytes);
    assert_eq!(rx.load(), (received.bytes, received.reads));
    // The bucket's promise, upper bounds a slow machine cannot break: one burst (20 ms of
    // the rate) plus the rate times the time the receiver ran, and so times its first to
    // last byte (the receiver's figure).
    let burst = RATE / 50;
    let allowed = burst + (RATE as f64 * elapsed.as_secs_f64()) as u64;
    assert!(
        received.bytes <= allowed,
        "{} bytes read in {elapsed:?}, more than {allowed}",
        received.bytes
    );
    // The first read is owed, and every later one takes only what the rate has earned
    // since the first byte: bytes over first to last byte (the receiver's figure) never
    // exceed the rate.
    let span_ns = u128::from(received.last_ns - received.first_ns);
    let earned = u128::from(RATE) * span_ns / 1_000_000_000;
    assert!(
        u128::from(received.bytes) <= earned + 1,
        "{} bytes read over {span_ns} ns, more than {earned}",
        received.bytes
    );
    // No read was larger than the burst.
    assert!(received.bytes <= received.reads * burst);
}

#[test]
fn tcp_send_fails_when_the_receiver_resets_before_the_deadline() {
    let (client, mut server) = tcp_pair();
    let clock = Clock::start();
    let stop = AtomicBool::new(false);
    let counters = Counters::default();
    let sent = thread::scope(|s| {
        let tx = s.spawn(|| {
            tcp_send(
                &client,
                &TcpSendOptions::until(64 << 10, 5_000 * MS),
                &clock,
                &stop,
                &counters,
            )
        });
        // Closing with unread data makes the kernel answer with a reset.
        server.set_read_timeout(SECOND).unwrap();
        let mut buf = [0u8; 1024];
        server.read_exact(&mut buf).unwrap();
        drop(server);
        tx.join().unwrap()
    });
    let err = sent.unwrap_err();
    assert!(fault::peer_gone(&err), "{err:?}");
    assert!(
        clock.now_ns() < 5_000 * MS,
        "the reset, not the deadline, ended it"
    );
}

#[test]
fn tcp_recv_notices_stop_without_data() {
    let (_client, server) = tcp_pair();
    let clock = Clock::start();
    let stop = AtomicBool::new(false);
    let counters = Counters::default();
    let received = thread::scope(|s| {
        let rx = s.spawn(|| {
            tcp_recv(
                &server,
                &TcpRecvOptions::default(),
                &clock,
                &stop,
                &counters,
            )
        });
        thread::sleep(Duration::from_millis(20));
        stop.store(true, Ordering::Relaxed);
        rx.join().unwrap().unwrap()
    });
    assert_eq!(received, TcpRecvOutcome::default());
}

#[test]
fn paced_udp_never_runs_ahead_of_its_schedule_and_loses_nothing_on_loopback() {
    const SIZE: u32 = 1200;
    const BPS: u64 = 20_000_000;
    const UNTIL: u64 = 500 * MS;
    let (_listener, flow, client) = udp_flow_pair();
    let clock = Clock::start();
    let stop = AtomicBool::new(false);
    let expect = AtomicU64::new(u64::MAX);
    let (tx_counters, rx_counters) = (Counters::default(), Counters::default());

    let (sent, received) = thread::scope(|s| {
        let rx = s.spawn(|| {
            udp_recv(
                &flow,
                SIZE,
                UdpFormat::Sonde,
                &clock,
                &stop,
                &expect,
                &rx_counters,
            )
        });
        let sent = udp_send(
            &client,
            SIZE,
            BPS,
            UdpFormat::Sonde,
            &clock,
            UNTIL,
            &stop,
            &tx_counters,
        )
        .unwrap();
        expect.store(sent.packets, Ordering::Relaxed);
        finish(&rx, &rx_counters, &stop, false);
        (sent, rx.join().unwrap().unwrap())
    });

    // The schedule starts inside udp_send, a little after the clock's origin, so by the
    // deadline at most `due_by(UNTIL)` datagrams can have been due. Scheduling delays can
    // only make it fewer; the lower bound is loose so a loaded machine does not fail it.
    let due = Schedule::bits_per_second(BPS, SIZE).due_by(UNTIL);
    assert!(sent.packets <= due, "{} sent, {due} due", sent.packets);
    assert!(
        sent.packets >= due * 8 / 10,
        "{} sent, {due} due",
        sent.packets
    );
    assert_eq!(sent.method, "send");
    assert_eq!(sent.bytes, u64::from(SIZE) * sent.packets);
    assert_eq!(tx_counters.load(), (sent.bytes, sent.packets));

    assert_eq!(received.seq.received(), sent.packets);
    assert_eq!(received.seq.lost(sent.packets), 0);
    assert_eq!(received.seq.duplicated(), 0);
    assert_eq!(received.seq.reordered(), 0);
    assert_eq!(received.packets, sent.packets);
    assert_eq!(received.bytes, sent.bytes);
    assert_eq!(received.malformed, 0);
    assert_eq!(rx_counters.load(), (received.bytes, received.packets));
    assert!(0 < received.first_ns && received.first_ns <= received.last_ns);
}

/// Sends `size`-byte datagrams as fast as possible for `for_ns` through a shared-port flow
/// pair, the receiver told the sender's count at the end.
fn unlimited_run(size: u32, for_ns: u64) -> (SendOutcome, UdpRecvOutcome, Counters, Counters) {
    unlimited_run_gso(size, for_ns, true, UdpFormat::Sonde)
}

/// [`unlimited_run`], GSO allowed or not, in `format`.
fn unlimited_run_gso(
    size: u32,
    for_ns: u64,
    gso: bool,
    format: UdpFormat,
) -> (SendOutcome, UdpRecvOutcome, Counters, Counters) {
    let (_listener, flow, client) = udp_flow_pair();
    let clock = Clock::start();
    let stop = AtomicBool::new(false);
    let expect = AtomicU64::new(u64::MAX);
    let (tx_counters, rx_counters) = (Counters::default(), Counters::default());
    let (sent, received) = thread::scope(|s| {
        let rx = s.spawn(|| udp_recv(&flow, size, format, &clock, &stop, &expect, &rx_counters));
        let opts = UdpSendOptions {
            msg_size: size,
            bits_per_second: 0,
            format,
            gso,
            until_ns: for_ns,
            omit_until_ns: 0,
            max_bytes: u64::MAX,
        };
        let sent = udp_send_with(&client, &opts, &clock, &stop, &tx_counters).unwrap();
        expect.store(sent.packets, Ordering::Relaxed);
        finish(&rx, &rx_counters, &stop, true);
        (sent, rx.join().unwrap().unwrap())
    });
    (sent, received, tx_counters, rx_counters)
}

#[test]
fn pps_datagrams_of_14_bytes_carry_the_short_header_and_are_each_counted() {
    let spec = |msg_size| TestSpec {
        kind: TestKind::Pps,
        protocol: sonde_wire::Protocol::Udp,
        direction: sonde_wire::Direction::Forward,
        streams: 1,
        msg_size,
        bitrate_per_stream: 0,
        duration_ms: 1000,
        interval_ms: 0,
        read_size: 0,
        socket: Default::default(),
        omit_ms: 0,
        skip_rx_copy: false,
        bytes: 0,
        blocks: 0,
        request_response: None,
    };
    assert_eq!(UdpFormat::sonde(&spec(14)), UdpFormat::Short);
    assert_eq!(UdpFormat::sonde(&spec(15)), UdpFormat::Short);
    assert_eq!(UdpFormat::sonde(&spec(16)), UdpFormat::Sonde);
    assert_eq!(UdpFormat::Short.header_len(), 14);
    for gso in [false, true] {
        let (sent, received, _, _) = unlimited_run_gso(14, 20 * MS, gso, UdpFormat::Short);
        assert!(sent.packets > 0);
        assert!(received.packets > 0, "gso {gso}");
        assert_eq!(received.malformed, 0, "gso {gso}");
        assert_eq!(received.bytes, 14 * received.packets);
        assert_eq!(received.seq.duplicated(), 0);
        assert_eq!(
            received.seq.received() + received.seq.lost(sent.packets),
            sent.packets,
            "gso {gso}"
        );
    }
    // Too short for even the short header.
    let (_listener, _flow, client) = udp_flow_pair();
    let err = udp_send(
        &client,
        13,
        0,
        UdpFormat::Short,
        &Clock::start(),
        MS,
        &AtomicBool::new(false),
        &Counters::default(),
    )
    .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
}

/// `--ecn`: a receiver that counts marks counts every data datagram by the ECN field it arrived
/// with, GRO-coalesced buffers included (loopback keeps the sender's ECT(1)); one that does not
/// count says nothing.
#[cfg(target_os = "linux")]
#[test]
fn an_ecn_receiver_counts_every_datagram_by_its_mark() {
    for (ecn, gso) in [(true, true), (true, false), (false, true)] {
        let (_listener, flow, client) = udp_flow_pair();
        crate::socket::DataOptions {
            tos: Some(0b01),
            ..crate::socket::DataOptions::default()
        }
        .apply_udp(&client)
        .unwrap();
        let clock = Clock::start();
        let stop = AtomicBool::new(false);
        let expect = AtomicU64::new(u64::MAX);
        let (tx, rx) = (Counters::default(), Counters::default());
        let (sent, received) = thread::scope(|s| {
            let r = s.spawn(|| {
                let opts = UdpRecvOptions {
                    msg_size: 100,
                    format: UdpFormat::Sonde,
                    ecn,
                    omit: None,
                };
                udp_recv_with(&flow, &opts, &clock, &stop, &expect, &rx)
            });
            let opts = UdpSendOptions {
                msg_size: 100,
                bits_per_second: 0,
                format: UdpFormat::Sonde,
                gso,
                until_ns: 20 * MS,
                omit_until_ns: 0,
                max_bytes: u64::MAX,
            };
            let sent = udp_send_with(&client, &opts, &clock, &stop, &tx).unwrap();
            expect.store(sent.packets, Ordering::Relaxed);
            finish(&r, &rx, &stop, true);
            (sent, r.join().unwrap().unwrap())
        });
        assert!(sent.packets > 0 && received.packets > 0);
        if ecn {
            let c = received.ecn.expect("counted");
            assert_eq!(
                c,
                sonde_wire::EcnCounts {
                    ect1: received.packets,
                    ..sonde_wire::EcnCounts::default()
                },
                "gso {gso}"
            );
        } else {
            assert_eq!(received.ecn, None);
        }
    }
}

#[test]
fn unlimited_udp_without_gso_sends_single_datagrams_in_batches() {
    const SIZE: u32 = 18;
    let (sent, received, _, _) = unlimited_run_gso(SIZE, 20 * MS, false, UdpFormat::Sonde);
    let expected = if cfg!(target_os = "linux") {
        "sendmmsg"
    } else {
        "send"
    };
    assert_eq!(sent.method, expected);
    assert!(sent.packets > 0);
    assert_eq!(received.malformed, 0);
    assert_eq!(received.bytes, u64::from(SIZE) * received.packets);
    assert_eq!(received.seq.duplicated(), 0);
}

#[test]
fn unlimited_udp_counts_every_small_datagram_individually() {
    const SIZE: u32 = 18;
    let (sent, received, tx_counters, rx_counters) = unlimited_run(SIZE, 200 * MS);

    if cfg!(target_os = "linux") {
        assert!(
            ["sendmsg+UDP_SEGMENT", "sendmmsg"].contains(&sent.method),
            "{}",
            sent.method
        );
    } else if cfg!(windows) {
        // USO where Windows takes it, one datagram per send where it refuses (wine).
        assert!(
            ["send+UDP_SEND_MSG_SIZE", "send"].contains(&sent.method),
            "{}",
            sent.method
        );
    } else {
        assert_eq!(sent.method, "send");
    }
    assert!(sent.packets > 0);
    assert_eq!(sent.bytes, u64::from(SIZE) * sent.packets);
    assert_eq!(tx_counters.load(), (sent.bytes, sent.packets));

    // Loopback may drop under overload, but whatever arrived is a whole 18-byte datagram
    // with its own sequence number (cut out of a coalesced GRO buffer or not, no shared
    // numbers within a batch).
    let seq = &received.seq;
    assert!(seq.received() > 0);
    assert_eq!(seq.duplicated(), 0);
    assert_eq!(received.packets, seq.received());
    assert_eq!(received.bytes, u64::from(SIZE) * received.packets);
    assert!(seq.highest().unwrap() < sent.packets);
    assert_eq!(seq.lost(sent.packets), sent.packets - seq.received());
    assert_eq!(received.malformed, 0);
    assert_eq!(rx_counters.load(), (received.bytes, received.packets));
    // A batch is one system call of at most 64 datagrams sent; a receive takes at most 64
    // buffers, and with GRO (16 buffers of 64 KiB) each may hold a 64-datagram GSO batch.
    assert!(sent.packets <= 64 * tx_counters.syscalls());
    assert!(received.packets <= 64 * 64 * rx_counters.syscalls());
    if cfg!(target_os = "linux") {
        assert!(tx_counters.syscalls() < sent.packets, "batched");
    }
}

/// UDP GRO: GSO batches arrive coalesced (far fewer receive calls than datagrams), and the
/// receiver still counts every datagram by its own sequence number: a gap is one lost, a
/// repeated number one duplicate, the rest each received once.
#[cfg(target_os = "linux")]
#[test]
fn gro_buffers_are_cut_into_datagrams_and_each_is_counted() {
    const SIZE: usize = 18;
    let (_listener, flow, client) = udp_flow_pair();
    // Before anything is sent: a GSO batch is kept whole only for a socket that asked.
    sys::enable_udp_gro(&flow).unwrap();
    // 0..640 with 100 missing and 200 twice: 640 datagrams, 639 numbers.
    let mut seqs: Vec<u64> = (0..640).filter(|&s| s != 100).collect();
    seqs.insert(201, 200);
    let mut buf = vec![0u8; seqs.len() * SIZE];
    for (d, &seq) in buf.chunks_exact_mut(SIZE).zip(&seqs) {
        UdpFormat::Sonde.write(seq, 1, d);
    }
    for batch in buf.chunks(64 * SIZE) {
        let sent = sys::send_segments(&client, batch, SIZE as u16).unwrap();
        assert_eq!(sent, batch.len());
    }
    let counters = Counters::default();
    let out = udp_recv(
        &flow,
        SIZE as u32,
        UdpFormat::Sonde,
        &Clock::start(),
        &AtomicBool::new(false),
        &AtomicU64::new(639),
        &counters,
    )
    .unwrap();
    assert_eq!(out.packets, 640);
    assert_eq!(out.bytes, 640 * SIZE as u64);
    assert_eq!(out.malformed, 0);
    assert_eq!(out.seq.received(), 639);
    assert_eq!(out.seq.duplicated(), 1);
    assert_eq!(out.seq.lost(640), 1);
    assert!(
        counters.syscalls() * 64 < out.packets,
        "{} receive calls for {} datagrams: the batches were not coalesced",
        counters.syscalls(),
        out.packets
    );
}

#[test]
fn udp_recv_answers_joins_ignores_acks_and_counts_junk_as_malformed() {
    const SIZE: u32 = 16;
    let (listener, flow, client) = udp_flow_pair();
    let clock = Clock::start();
    let stop = AtomicBool::new(false);
    let expect = AtomicU64::new(2);
    let counters = Counters::default();
    let join = UdpJoin {
        ack: false,
        flow: 1,
        token: Token(0x5eed),
        ..UdpJoin::default()
    };

    let received = thread::scope(|s| {
        let rx = s.spawn(|| {
            udp_recv(
                &flow,
                SIZE,
                UdpFormat::Sonde,
                &clock,
                &stop,
                &expect,
                &counters,
            )
        });
        client.send(&join.encode()).unwrap();
        client.set_read_timeout(SECOND).unwrap();
        let mut buf = [0u8; 64];
        let n = client.recv(&mut buf).unwrap();
        assert_eq!(
            UdpJoin::decode(&buf[..n]),
            Ok(UdpJoin { ack: true, ..join })
        );

        client
            .send(&UdpJoin { ack: true, ..join }.encode())
            .unwrap();
        client.send(b"abc").unwrap();
        for seq in 0..2 {
            let mut datagram = [0u8; SIZE as usize];
            DataHeader { seq, send_ns: 1 }.write(&mut datagram);
            client.send(&datagram).unwrap();
        }
        finish(&rx, &counters, &stop, false);
        rx.join().unwrap().unwrap()
    });

    assert_eq!(received.malformed, 1);
    assert_eq!(received.packets, 2);
    assert_eq!(received.bytes, 2 * u64::from(SIZE));
    assert_eq!(received.seq.received(), 2);
    assert_eq!(counters.load(), (2 * u64::from(SIZE), 2));
    // Everything went to the flow socket, nothing to the listener.
    listener.set_nonblocking(true).unwrap();
    let err = listener.recv_from(&mut [0u8; 64]).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::WouldBlock);
}

#[test]
fn iperf3_format_numbers_from_one_and_reads_back_as_iperf3_counts() {
    // The agent's iperf3 listener and the `iperf3://` client send and count with this; the
    // real iperf3's receiver reports `packets` = highest seq and `errors` = gaps.
    for seq64 in [false, true] {
        let format = UdpFormat::Iperf3 { seq64 };
        let (_listener, flow, client) = udp_flow_pair();
        let clock = Clock::start();
        let stop = AtomicBool::new(false);
        let expect = AtomicU64::new(u64::MAX);
        let (tx, rx_counters) = (Counters::default(), Counters::default());
        let (sent, received) = thread::scope(|s| {
            let rx = s.spawn(|| udp_recv(&flow, 64, format, &clock, &stop, &expect, &rx_counters));
            let sent =
                udp_send(&client, 64, 2_000_000, format, &clock, 200 * MS, &stop, &tx).unwrap();
            expect.store(sent.packets, Ordering::Relaxed);
            finish(&rx, &rx_counters, &stop, false);
            (sent, rx.join().unwrap().unwrap())
        });
        assert!(sent.packets > 10, "{sent:?}");
        assert_eq!(received.packets, sent.packets);
        assert_eq!(received.malformed, 0);
        // Tracker seq = iperf3 seq - 1, so highest + 1 is iperf3's `packets`.
        assert_eq!(received.seq.highest(), Some(sent.packets - 1));
        assert_eq!(received.seq.lost(sent.packets), 0);
    }
    // What goes on the wire: seq 1 first, the clock in sec/usec.
    let mut buf = [0u8; 16];
    UdpFormat::Iperf3 { seq64: false }.write(0, 1_500_000_000, &mut buf);
    assert_eq!(buf[..12], [0, 0, 0, 1, 0, 7, 0xa1, 0x20, 0, 0, 0, 1]);
    assert_eq!(UdpFormat::Iperf3 { seq64: true }.read(&[0u8; 16]), None);
    assert_eq!(
        UdpFormat::Iperf3 { seq64: false }.read(&buf[..12]),
        Some((0, 1_500_000_000))
    );
}

#[test]
fn udp_send_rejects_datagrams_too_small_for_the_header() {
    let (_listener, _flow, client) = udp_flow_pair();
    let err = udp_send(
        &client,
        15,
        0,
        UdpFormat::Sonde,
        &Clock::start(),
        MS,
        &AtomicBool::new(false),
        &Counters::default(),
    )
    .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
}

#[test]
fn udp_send_gives_up_on_a_peer_that_refuses() {
    // Nothing listens on the port a flow socket was bound to and then closed, so every
    // datagram comes back as ICMP port unreachable (loopback does not rate-limit ICMP).
    let addr = socket::udp_listen(loopback())
        .unwrap()
        .local_addr()
        .unwrap();
    let client = socket::udp_connect(addr).unwrap();
    let clock = Clock::start();
    let err = udp_send(
        &client,
        64,
        1_000_000,
        UdpFormat::Sonde,
        &clock,
        5_000 * MS,
        &AtomicBool::new(false),
        &Counters::default(),
    )
    .unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::ConnectionRefused);
    assert!(clock.now_ns() < 5_000 * MS);
}

#[test]
fn recv_slots_fit_data_joins_and_junk() {
    assert_eq!(recv_slot(16), 64);
    assert_eq!(recv_slot(1200), 1216);
    assert_eq!(recv_slot(65_507), 65_536);
    assert_eq!(recv_slot(u32::MAX), 65_536);
}

/// Not a test: the packet rate of the unlimited path on loopback, 18-byte datagrams for
/// 2 s. `cargo test --release -p sonde-net pps_on_loopback -- --ignored --nocapture`
#[test]
#[ignore = "a measurement, not a test"]
fn pps_on_loopback() {
    const SIZE: u32 = 18;
    let (sent, received, _, _) = unlimited_run(SIZE, 2_000 * MS);
    let span = received.last_ns - received.first_ns;
    println!(
        "method {}: sent {} ({:.3} Mpps), received {} ({:.3} Mpps over {:.3} s), lost {}",
        sent.method,
        sent.packets,
        sonde_engine::per_second(sent.packets, sent.active_ns) / 1e6,
        received.seq.received(),
        sonde_engine::per_second(received.packets, span) / 1e6,
        span as f64 / 1e9,
        received.seq.lost(sent.packets),
    );
}
