use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::Duration;

use super::*;

const MS: u64 = 1_000_000;

fn tcp_pairs(n: usize) -> (Vec<TcpStream>, Vec<TcpStream>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let mut clients = Vec::new();
    let mut servers = Vec::new();
    for _ in 0..n {
        let c = TcpStream::connect(addr).unwrap();
        let (s, _) = listener.accept().unwrap();
        c.set_nodelay(true).unwrap();
        s.set_nodelay(true).unwrap();
        clients.push(c);
        servers.push(s);
    }
    (clients, servers)
}

fn udp_pairs(n: usize) -> (Vec<UdpSocket>, Vec<UdpSocket>) {
    (0..n)
        .map(|_| {
            let a = UdpSocket::bind("127.0.0.1:0").unwrap();
            let b = UdpSocket::bind("127.0.0.1:0").unwrap();
            a.connect(b.local_addr().unwrap()).unwrap();
            b.connect(a.local_addr().unwrap()).unwrap();
            (a, b)
        })
        .unzip()
}

fn cfg(request_size: u32, response_size: u32, depth: u32) -> RrConfig {
    RrConfig {
        request_size,
        response_size,
        depth,
        until_ns: 300 * MS,
        warmup_ns: 50 * MS,
        spin: false,
        open: None,
    }
}

/// Runs the client over `clients` against the echo over `servers`; the outcome and each
/// echo flow's (bytes, responses).
fn run<S: RrSocket + Sync>(
    clients: &[S],
    servers: &[S],
    cfg: &RrConfig,
) -> (RrOutcome, Vec<(u64, u64)>) {
    run_with(clients, servers, cfg, None)
}

/// [`run`], with `-i` intervals.
fn run_with<S: RrSocket + Sync>(
    clients: &[S],
    servers: &[S],
    cfg: &RrConfig,
    intervals: Option<RrIntervalView>,
) -> (RrOutcome, Vec<(u64, u64)>) {
    let counters: Vec<Counters> = servers.iter().map(|_| Counters::default()).collect();
    let stop = AtomicBool::new(false);
    let echo_stop = AtomicBool::new(false);
    let clock = Clock::start();
    let out = thread::scope(|s| {
        let echoing = s.spawn(|| {
            let flows: Vec<&S> = servers.iter().collect();
            let counts: Vec<&Counters> = counters.iter().collect();
            let answer = RrEcho {
                request_size: cfg.request_size,
                response_size: cfg.response_size,
                depth: cfg.depth,
                spin: false,
            };
            echo(&flows, &answer, &echo_stop, &counts)
        });
        let flows: Vec<&S> = clients.iter().collect();
        let out = client(&flows, cfg, &clock, &stop, intervals);
        // Every response was read by now; the UDP echo ends on its stop flag.
        thread::sleep(Duration::from_millis(20));
        echo_stop.store(true, Ordering::Relaxed);
        echoing.join().unwrap().unwrap();
        out.unwrap()
    });
    (out, counters.iter().map(Counters::load).collect())
}

#[test]
fn tcp_every_request_is_answered_once_per_flow_with_the_response_size() {
    let (clients, servers) = tcp_pairs(16);
    let (out, echoed) = run(&clients, &servers, &cfg(100, 1000, 4));
    assert_eq!(out.flows.len(), 16);
    let mut total = 0;
    for (f, &(bytes, responses)) in out.flows.iter().zip(&echoed) {
        // TCP loses nothing: every request sent was answered, once, by exactly one response
        // of 1,000 bytes.
        assert!(f.sent > 4, "{f:?}");
        assert_eq!(f.answered, f.sent, "{f:?}");
        assert_eq!(responses, f.sent, "{f:?}");
        assert_eq!(bytes, responses * 1000);
        assert!(f.measured > 0 && f.measured <= f.answered);
        total += f.measured;
    }
    // Every measured transaction is one RTT sample (the warm-up's are excluded from both).
    assert_eq!(out.rtt.samples(), total);
}

#[test]
fn udp_every_response_carries_its_request_and_counts_once_per_flow() {
    let (clients, servers) = udp_pairs(8);
    let (out, echoed) = run(&clients, &servers, &cfg(64, 200, 4));
    let mut total = 0;
    for (f, &(bytes, responses)) in out.flows.iter().zip(&echoed) {
        assert!(f.sent > 4, "{f:?}");
        // Each response the echo sent came back to this flow and was counted once (loopback
        // drops nothing at four in flight), and answered the request it carried.
        assert_eq!(responses, f.answered, "{f:?}");
        assert_eq!(bytes, responses * 200);
        assert_eq!(f.lost(), f.sent - f.answered);
        assert!(f.answered <= f.sent);
        total += f.measured;
    }
    assert_eq!(out.rtt.samples(), total);
}

#[test]
fn tcp_responses_split_across_reads_and_joined_in_one_still_count_one_each() {
    // A scripted peer: reads the requests (7 bytes each) and owes 10 bytes for each, written
    // in 3-byte pieces as a stream, so a piece ends one response and starts the next; what is
    // left under 3 bytes goes when no request comes for a moment.
    let (clients, servers) = tcp_pairs(1);
    let server = servers.into_iter().next().unwrap();
    let answered = thread::spawn(move || {
        let mut server = server;
        server
            .set_read_timeout(Some(Duration::from_millis(5)))
            .unwrap();
        let (mut req, mut got) = ([0u8; 7], 0usize);
        let (mut owed, mut n) = (0usize, 0u64);
        loop {
            match server.read(&mut req[got..]) {
                Ok(0) => return n,
                Ok(k) => {
                    got += k;
                    if got == req.len() {
                        got = 0;
                        owed += 10;
                        n += 1;
                    }
                }
                Err(e) if fault::again(&e) => {
                    // Quiet: the rest of what is owed.
                    if owed > 0 && server.write_all(&[0u8; 64][..owed]).is_err() {
                        return n;
                    }
                    owed = 0;
                    continue;
                }
                Err(_) => return n,
            }
            while owed >= 3 {
                if server.write_all(&[0u8; 3]).is_err() {
                    return n;
                }
                owed -= 3;
                thread::sleep(Duration::from_micros(100));
            }
        }
    });
    let cfg = RrConfig {
        until_ns: 100 * MS,
        warmup_ns: 0,
        ..cfg(7, 10, 2)
    };
    let flows: Vec<&TcpStream> = clients.iter().collect();
    let out = client(&flows, &cfg, &Clock::start(), &AtomicBool::new(false), None).unwrap();
    drop(clients);
    let served = answered.join().unwrap();
    let f = out.flows[0];
    assert!(f.answered >= 4, "{f:?}");
    assert_eq!(f.answered, f.sent);
    assert_eq!(f.answered, served);
    assert_eq!(out.rtt.samples(), f.answered);
}

#[test]
fn the_echo_frames_requests_split_across_writes() {
    // Five 7-byte requests written in 3-byte pieces: five 2-byte responses.
    let (clients, servers) = tcp_pairs(1);
    let counters = [Counters::default()];
    let stop = AtomicBool::new(false);
    thread::scope(|s| {
        let echoing = s.spawn(|| {
            let flows: Vec<&TcpStream> = servers.iter().collect();
            let answer = RrEcho {
                request_size: 7,
                response_size: 2,
                depth: 1,
                spin: false,
            };
            echo(&flows, &answer, &stop, &[&counters[0]])
        });
        let mut c = &clients[0];
        for piece in [1u8; 35].chunks(3) {
            c.write_all(piece).unwrap();
            thread::sleep(Duration::from_millis(1));
        }
        let mut back = [0u8; 10];
        c.read_exact(&mut back).unwrap();
        c.shutdown(std::net::Shutdown::Both).unwrap();
        // The echo ends by itself when its only flow closes.
        echoing.join().unwrap().unwrap();
    });
    assert_eq!(counters[0].load(), (10, 5));
}

/// An open loop of 4,000 requests per second over 8 flows with at most 2 outstanding each,
/// 300 ms of which 50 ms warm-up.
fn open_cfg(request_size: u32, response_size: u32) -> RrConfig {
    RrConfig {
        open: Some(RrOpen {
            rate_per_second: 4_000.0,
            total_flows: 8,
            first_flow: 0,
        }),
        ..cfg(request_size, response_size, 2)
    }
}

/// What every open-loop run must say, however loaded the host: each flow's sent and unsent
/// requests are exactly its share of the schedule (150 of the 1,200 due in 300 ms), the sends
/// after the warm-up are at most the 1,000 due then, and no flow ever sent more than was due.
fn check_open(out: &RrOutcome) {
    assert_eq!(out.flows.len(), 8);
    for f in &out.flows {
        assert_eq!(f.sent + f.unsent, 150, "{f:?}");
        assert!(f.sent_measured <= 125 && f.sent_measured <= f.sent, "{f:?}");
        assert!(f.late_sends <= f.sent, "{f:?}");
        assert!(f.measured <= f.sent_measured, "{f:?}");
    }
    let measured: u64 = out.flows.iter().map(|f| f.measured).sum();
    assert_eq!(out.rtt.samples(), measured);
}

#[test]
fn tcp_open_loop_sends_each_flow_its_share_of_the_total_rate() {
    let (clients, servers) = tcp_pairs(8);
    let (out, echoed) = run(&clients, &servers, &open_cfg(100, 300));
    check_open(&out);
    for (f, &(_, responses)) in out.flows.iter().zip(&echoed) {
        // TCP loses nothing: every request sent was answered once.
        assert_eq!(f.answered, f.sent, "{f:?}");
        assert_eq!(responses, f.sent, "{f:?}");
    }
}

#[test]
fn udp_open_loop_sends_each_flow_its_share_of_the_total_rate() {
    let (clients, servers) = udp_pairs(8);
    let (out, echoed) = run(&clients, &servers, &open_cfg(64, 64));
    check_open(&out);
    for (f, &(_, responses)) in out.flows.iter().zip(&echoed) {
        assert_eq!(responses, f.answered, "{f:?}");
        assert!(f.answered <= f.sent, "{f:?}");
    }
}

#[test]
fn intervals_are_cut_at_the_same_boundaries_and_add_up_to_the_run() {
    for udp in [false, true] {
        let (tx, rx) = std::sync::mpsc::sync_channel(1024);
        let view = RrIntervalView {
            every_ns: 50 * MS,
            thread: 3,
            out: tx,
        };
        let cfg = cfg(64, 64, 2);
        let out = if udp {
            let (clients, servers) = udp_pairs(4);
            run_with(&clients, &servers, &cfg, Some(view)).0
        } else {
            let (clients, servers) = tcp_pairs(4);
            run_with(&clients, &servers, &cfg, Some(view)).0
        };
        let ivs: Vec<RrInterval> = rx.try_iter().collect();
        // 250 ms after the 50 ms warm-up: 4 whole intervals and the last to the loop's end.
        assert_eq!(
            ivs.len(),
            5,
            "{:?}",
            ivs.iter().map(|i| i.index).collect::<Vec<_>>()
        );
        for (k, iv) in ivs.iter().enumerate() {
            assert_eq!(iv.thread, 3);
            assert_eq!(iv.index, k as u64);
            assert_eq!(iv.start_ns, 50 * MS + k as u64 * 50 * MS);
            if k < 4 {
                assert_eq!(iv.end_ns, iv.start_ns + 50 * MS);
            } else {
                assert!(iv.end_ns >= 300 * MS);
            }
        }
        let samples: u64 = ivs.iter().map(|iv| iv.rtt.samples()).sum();
        assert_eq!(samples, out.rtt.samples(), "udp {udp}");
    }
}

#[test]
fn sizes_and_depth_are_checked() {
    assert!(
        check(4, 64, 1, true).is_err(),
        "UDP requests carry 8 bytes of seq"
    );
    assert!(check(64, 4, 1, true).is_err());
    assert!(check(1, 1, 1, false).is_ok());
    assert!(check(64, 64, 0, false).is_err());
    assert!(check(64, 64, sonde_wire::MAX_DEPTH + 1, false).is_err());
    assert!(check(64, 65_537, 1, false).is_err());
}
