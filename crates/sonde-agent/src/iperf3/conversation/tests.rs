//! The agent's iperf3 conversation in memory, on a virtual clock: a scripted client's bytes in
//! (read no further than the machine asks, as the socket code reads them), the agent's bytes
//! and decisions out, time advanced by hand in milliseconds. The socket tests of
//! `tests/peers/iperf3_server.rs` make the same faults against the listener in seconds, and the
//! real `iperf3 -c` runs there against it.

use std::collections::VecDeque;
use std::net::SocketAddr;

use sonde_wire::iperf3::errno;

use super::*;

const RESULTS: &[u8] = br#"{"cpu_util_total":0.5,"cpu_util_user":0.25,"cpu_util_system":0.25,"sender_has_retransmits":0,"streams":[{"id":1,"bytes":1310720,"retransmits":0,"jitter":0,"errors":0,"packets":0}]}"#;

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn config(tune: impl FnOnce(&mut AgentConfig)) -> AgentConfig {
    let mut cfg = AgentConfig::new(SocketAddr::from(([127, 0, 0, 1], 5201)));
    cfg.hello_timeout = ms(300);
    cfg.max_duration = ms(5_000);
    tune(&mut cfg);
    cfg
}

fn json(body: &[u8]) -> Vec<u8> {
    let mut v = json_prefix(body).to_vec();
    v.extend_from_slice(body);
    v
}

fn b(state: State) -> u8 {
    state.byte()
}

/// The agent around the conversation.
#[derive(Default)]
struct FakeHost {
    shutting_down: bool,
    /// What the kernel says to the client's options.
    options: Option<Refusal>,
    tried: u32,
}

impl Host for FakeHost {
    fn shutting_down(&self) -> bool {
        self.shutting_down
    }

    fn try_options(&mut self, _: &Params, _: &DataOptions) -> Result<(), Refusal> {
        self.tried += 1;
        self.options.clone().map_or(Ok(()), Err)
    }
}

/// One conversation, its virtual clock and the control connection's two directions.
struct Talk<'a> {
    start: Instant,
    now: Instant,
    c: Conversation<'a>,
    host: FakeHost,
    /// What the client sent that the agent has not read yet.
    socket: VecDeque<u8>,
    /// The client has closed its side (once `socket` is read).
    client_closed: bool,
    /// What the agent wrote, not yet looked at.
    wire: Vec<u8>,
    did: VecDeque<Output>,
}

impl<'a> Talk<'a> {
    fn new(cfg: &'a AgentConfig) -> Self {
        let now = Instant::now();
        let mut t = Self {
            start: now,
            now,
            c: Conversation::new(now, cfg),
            host: FakeHost::default(),
            socket: VecDeque::new(),
            client_closed: false,
            wire: Vec::new(),
            did: VecDeque::new(),
        };
        t.drain();
        t
    }

    /// Takes what the agent decided: its bytes to `wire`, the rest to `did`.
    fn drain(&mut self) {
        while let Some(out) = self.c.poll() {
            match out {
                Output::Send(bytes) => self.wire.extend_from_slice(&bytes),
                Output::Deny => {
                    self.wire.push(b(State::AccessDenied));
                    self.did.push_back(Output::Deny);
                }
                other => self.did.push_back(other),
            }
        }
    }

    /// The running phase's end at `at_ms` (draining the receivers after TEST_END).
    fn stop(&self, drain: bool, at_ms: u64) -> Option<Output> {
        Some(Output::StopStreams {
            drain,
            at: self.start + ms(at_ms),
        })
    }

    /// The running phase ended at `at_ms` without TEST_END: the data side stops the streams.
    fn stops_at(&mut self, at_ms: u64) {
        assert_eq!(self.next(), self.stop(false, at_ms));
        self.c.streams_stopped(self.now);
        self.drain();
    }

    /// Lets the agent read what it wants of what the client sent, as the socket code does.
    fn deliver(&mut self) {
        loop {
            let want = self.c.wants();
            if want == 0 {
                break;
            }
            if self.socket.is_empty() {
                if self.client_closed {
                    self.c.handle_closed(self.now, &self.host);
                    self.drain();
                }
                break;
            }
            let n = want.min(self.socket.len());
            let bytes: Vec<u8> = self.socket.drain(..n).collect();
            self.c.handle_bytes(self.now, &bytes, &mut self.host);
            self.drain();
        }
    }

    fn client(&mut self, bytes: &[u8]) {
        self.socket.extend(bytes);
        self.deliver();
    }

    fn client_closes(&mut self) {
        self.client_closed = true;
        self.deliver();
    }

    /// The clock moves on by `ms`, the agent looking at it (and at its shutdown) each
    /// millisecond, as its socket loop wakes at least that often when it waits.
    fn advance(&mut self, ms: u64) {
        for _ in 0..ms {
            self.now += Duration::from_millis(1);
            self.c.handle_timeout(self.now, &self.host);
            self.drain();
            self.deliver();
        }
    }

    /// What the agent wrote since the last look.
    fn sent(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.wire)
    }

    fn next(&mut self) -> Option<Output> {
        self.did.pop_front()
    }

    /// How it ended; nothing is left to do.
    fn ended(&mut self) -> Ended {
        match self.next() {
            Some(Output::End(e)) => {
                assert!(self.c.is_over());
                assert_eq!(self.next(), None);
                assert_eq!(self.c.poll_timeout(), None);
                e
            }
            other => panic!("did not end: {other:?} (then {:?})", self.did),
        }
    }

    fn setup_ended(&mut self) -> String {
        match self.ended() {
            Ended::Setup(why) => why,
            other => panic!("{other:?}"),
        }
    }

    fn test_ended(&mut self) -> String {
        match self.ended() {
            Ended::Test(why) => why,
            other => panic!("{other:?}"),
        }
    }

    fn exchange_ended(&mut self) -> String {
        match self.ended() {
            Ended::Exchange(why) => why,
            other => panic!("{other:?}"),
        }
    }

    /// Through PARAM_EXCHANGE and `params` to the wait for the streams (for TCP).
    fn attaching(cfg: &'a AgentConfig, params: &[u8]) -> Self {
        let mut t = Self::new(cfg);
        assert_eq!(t.sent(), [b(State::ParamExchange)]);
        t.client(&json(params));
        assert_eq!(t.next(), Some(Output::OpenStreams));
        assert_eq!(t.next(), Some(Output::AwaitStreams));
        assert_eq!(t.sent(), [b(State::CreateStreams)]);
        t
    }

    /// The streams attach now: the test runs, counted after `omit_ms`, its failsafe
    /// `failsafe_ms` away. Returns when it started.
    fn starts(&mut self, omit_ms: u64, failsafe_ms: u64) -> Instant {
        self.c.streams_attached(self.now);
        self.drain();
        let start = self.now;
        let plan = Plan {
            start,
            omit: ms(omit_ms),
            failsafe: ms(failsafe_ms),
        };
        assert_eq!(self.next(), Some(Output::Run(plan)));
        assert_eq!(self.sent(), [b(State::TestStart), b(State::TestRunning)]);
        start
    }

    /// A TCP test of `params` running from now.
    fn running(cfg: &'a AgentConfig, params: &[u8]) -> Self {
        let mut t = Self::attaching(cfg, params);
        t.c.streams_attached(t.now);
        t.drain();
        assert!(matches!(t.next(), Some(Output::Run(_))));
        assert_eq!(t.sent(), [b(State::TestStart), b(State::TestRunning)]);
        t
    }

    /// After TEST_END at `at_ms`: the data side's results are ready, EXCHANGE_RESULTS out.
    fn exchanging(cfg: &'a AgentConfig) -> Self {
        let mut t = Self::running(cfg, TCP);
        assert_eq!(t.next(), Some(Output::EndOmit { from_zero: true }));
        t.advance(1_000);
        t.client(&[b(State::TestEnd)]);
        assert_eq!(t.next(), t.stop(true, 1_000));
        t.c.results_ready(t.now, &ours());
        t.drain();
        assert_eq!(t.sent(), [b(State::ExchangeResults)]);
        t
    }
}

const TCP: &[u8] = br#"{"tcp":true,"omit":0,"time":1,"parallel":1,"len":131072}"#;

fn ours() -> Results {
    Results::from_json(RESULTS).expect("results")
}

#[test]
fn a_tcp_test_goes_as_iperf3_has_it() {
    let cfg = config(|_| {});
    let mut t = Talk::new(&cfg);
    assert_eq!(t.sent(), [b(State::ParamExchange)]);
    assert_eq!(t.c.poll_timeout(), Some(t.now + ms(300)));
    t.client(&json(TCP));
    assert_eq!(t.host.tried, 1, "the options are tried on a socket first");
    // The test takes its streams before CREATE_STREAMS goes out; no deadline of the machine's
    // while the socket code waits for them.
    assert_eq!(t.next(), Some(Output::OpenStreams));
    assert_eq!(t.next(), Some(Output::AwaitStreams));
    assert_eq!(t.sent(), [b(State::CreateStreams)]);
    assert_eq!((t.c.wants(), t.c.poll_timeout()), (0, None));
    assert_eq!(t.c.params().map(|p| p.parallel), Some(1));
    t.advance(50);
    // The planned second, then FAILSAFE_SLACK.
    let start = t.starts(0, 31_000);
    assert_eq!(t.next(), Some(Output::EndOmit { from_zero: true }));
    assert_eq!(t.c.poll_timeout(), Some(start + ms(31_000)));
    t.advance(1_000);
    // TEST_START again is ignored, as by iperf3.
    t.client(&[b(State::TestStart)]);
    assert_eq!(t.next(), None);
    t.client(&[b(State::TestEnd)]);
    assert_eq!(t.next(), t.stop(true, 1_050));
    assert_eq!(t.c.wants(), 0, "nothing is read while the streams stop");
    t.advance(20);
    t.c.results_ready(t.now, &ours());
    t.drain();
    assert_eq!(t.sent(), [b(State::ExchangeResults)]);
    t.client(&json(RESULTS));
    let mut expect = json(&ours().to_json());
    expect.push(b(State::DisplayResults));
    assert_eq!(t.sent(), expect, "ours and DISPLAY_RESULTS in one write");
    t.client(&[b(State::IperfDone)]);
    assert_eq!(t.ended(), Ended::Completed);
    assert_eq!(t.sent(), [0u8; 0]);
}

#[test]
fn a_udp_test_takes_the_gate_and_counts_after_omit() {
    let cfg = config(|_| {});
    let params = br#"{"udp":true,"omit":2,"time":1,"parallel":2,"len":1200,"bandwidth":1000000}"#;
    let mut t = Talk::new(&cfg);
    let _ = t.sent();
    t.client(&json(params));
    // UDP streams carry no cookie: the gate first, CREATE_STREAMS only once it is ours.
    assert_eq!(t.next(), Some(Output::EnterGate));
    assert_eq!(t.sent(), [0u8; 0]);
    t.advance(100);
    t.c.gate_entered();
    t.drain();
    assert_eq!(t.next(), Some(Output::AwaitStreams));
    assert_eq!(t.sent(), [b(State::CreateStreams)]);
    let start = t.starts(2_000, 33_000);
    assert_eq!(t.c.poll_timeout(), Some(start + ms(2_000)));
    t.advance(1_999);
    assert_eq!(t.next(), None);
    t.advance(1);
    assert_eq!(t.next(), Some(Output::EndOmit { from_zero: false }));
    assert_eq!(t.c.poll_timeout(), Some(start + ms(33_000)));
    t.advance(1_000);
    t.client(&[b(State::TestEnd)]);
    assert_eq!(t.next(), t.stop(true, 3_100));
    t.c.results_ready(t.now, &ours());
    t.drain();
    t.client(&json(RESULTS));
    let _ = t.sent();
    // A client that closes instead of IPERF_DONE has still completed the test (§5).
    t.client_closes();
    assert_eq!(t.ended(), Ended::Completed);
}

#[test]
fn parameters_that_are_not_whole_and_valid_are_a_bad_hello_and_closed() {
    let cfg = config(|_| {});
    let cases: [(&[u8], &str); 4] = [
        (&[0xff, 0xff, 0xff, 0xff], "bad parameters: "),
        (&[0, 0, 0, 0], "bad parameters: "),
        (&json(br#"{"tcp":true,"#), "bad parameters: "),
        (&json(b"[1,2,3]"), "bad parameters: "),
    ];
    for (bytes, why) in cases {
        let mut t = Talk::new(&cfg);
        let _ = t.sent();
        t.client(bytes);
        assert_eq!(t.next(), Some(Output::BadHello));
        let line = t.setup_ended();
        assert!(line.starts_with(why), "{line}");
        assert_eq!(t.sent(), [0u8; 0], "closed without a word, like iperf3");
    }
    // Nothing is read for a length that is no length: not a byte of the body.
    let mut t = Talk::new(&cfg);
    t.client(&[0xff, 0xff, 0xff, 0xff, b'{']);
    assert_eq!(t.socket.len(), 1);
}

#[test]
fn parameters_must_come_within_the_hello_timeout() {
    let cfg = config(|_| {});
    let mut t = Talk::new(&cfg);
    t.advance(299);
    assert_eq!(t.next(), None);
    t.advance(1);
    assert_eq!(t.next(), Some(Output::BadHello));
    assert_eq!(
        t.setup_ended(),
        "no parameters from the client: no message from the peer within 300ms"
    );

    // Truncated: 100 bytes announced, 10 sent at 100 ms, then silence or a close.
    for close in [false, true] {
        let mut t = Talk::new(&cfg);
        t.advance(100);
        t.client(&[0, 0, 0, 100]);
        t.client(b"{\"tcp\":tru");
        if close {
            t.client_closes();
        } else {
            t.advance(200);
        }
        assert_eq!(t.next(), Some(Output::BadHello));
        let why = if close {
            "the peer closed the control connection"
        } else {
            "no message from the peer within 200ms"
        };
        assert_eq!(
            t.setup_ended(),
            format!("truncated parameters (100 bytes announced): {why}")
        );
    }

    // A client that closes before its parameters.
    let mut t = Talk::new(&cfg);
    t.client_closes();
    assert_eq!(t.next(), Some(Output::BadHello));
    assert_eq!(
        t.setup_ended(),
        "no parameters from the client: the peer closed the control connection"
    );
}

#[test]
fn a_read_takes_no_more_than_the_step_needs() {
    // The parameters and an early CLIENT_TERMINATE in one segment: the byte stays in the
    // socket while the streams attach (where the socket code's close check sees it), and ends
    // the test as it starts.
    let cfg = config(|_| {});
    let mut bytes = json(TCP);
    bytes.push(b(State::ClientTerminate));
    let mut t = Talk::new(&cfg);
    t.client(&bytes);
    assert_eq!(t.next(), Some(Output::OpenStreams));
    assert_eq!(t.next(), Some(Output::AwaitStreams));
    assert_eq!(t.socket.len(), 1);
    t.c.streams_attached(t.now);
    t.drain();
    t.deliver();
    assert!(matches!(t.next(), Some(Output::Run(_))));
    assert_eq!(t.next(), Some(Output::EndOmit { from_zero: true }));
    assert_eq!(t.next(), t.stop(false, 0));
}

#[test]
fn limits_are_refused_with_server_error_and_the_codes_iperf3_prints() {
    let cfg = config(|c| c.max_streams = 4);
    let cases: [(&[u8], i32, i32, &str); 4] = [
        (
            br#"{"tcp":true,"time":1,"parallel":5}"#,
            errno::IENUMSTREAMS,
            0,
            "refused: 5 streams asked, this agent allows 4 (sonde server --max-streams)",
        ),
        (
            br#"{"tcp":true,"time":6,"parallel":1}"#,
            errno::IEDURATION,
            0,
            "refused: 6 s asked (time + omit), this agent allows 5 s (sonde server --max-duration)",
        ),
        (
            br#"{"tcp":true,"time":1,"parallel":0}"#,
            errno::IEINITTEST,
            22, // EINVAL, printed with strerror
            "refused: nonsense parameters (parallel 0, omit 0, time 1, bandwidth 0, len 131072)",
        ),
        (
            br#"{"udp":true,"time":1,"parallel":1,"len":8}"#,
            errno::IEUDPBLOCKSIZE,
            0,
            "refused: UDP datagram size 8 is outside 16..=65507",
        ),
    ];
    for (params, code, os_errno, why) in cases {
        let mut t = Talk::new(&cfg);
        let _ = t.sent();
        t.client(&json(params));
        assert_eq!(t.next(), Some(Output::Refused));
        assert_eq!(t.setup_ended(), why);
        assert_eq!(t.sent(), encode_server_error(code, os_errno));
        assert_eq!(
            t.host.tried, 0,
            "no socket is tried for what the limits refuse"
        );
    }

    // What the kernel refuses on a trial socket, before any stream.
    let mut t = Talk::new(&cfg);
    let _ = t.sent();
    t.host.options = Some((errno::IESETCONGESTION, 2, "no such algorithm".into()));
    t.client(&json(
        br#"{"tcp":true,"time":1,"parallel":1,"congestion":"nosuchcc"}"#,
    ));
    assert_eq!(t.next(), Some(Output::Refused));
    assert_eq!(t.setup_ended(), "refused: no such algorithm");
    assert_eq!(t.sent(), encode_server_error(errno::IESETCONGESTION, 2));

    // ...and on the attached streams.
    let mut t = Talk::attaching(&cfg, TCP);
    t.c.refuse((errno::IESETBUF2, 0, "short buffer".into()), &t.host);
    t.drain();
    assert_eq!(t.next(), Some(Output::Refused));
    assert_eq!(t.setup_ended(), "refused: short buffer");
    assert_eq!(t.sent(), encode_server_error(errno::IESETBUF2, 0));
}

#[test]
fn a_setup_that_fails_while_the_agent_stops_tells_the_client_server_terminate() {
    let cfg = config(|c| c.max_streams = 4);
    // A refusal, then SERVER_TERMINATE: the client prints the agent's shutdown.
    let mut t = Talk::new(&cfg);
    let _ = t.sent();
    t.host.shutting_down = true;
    t.client(&json(br#"{"tcp":true,"time":1,"parallel":5}"#));
    assert_eq!(t.next(), Some(Output::Refused));
    assert_eq!(t.setup_ended(), "the agent is shutting down");
    let mut expect = encode_server_error(errno::IENUMSTREAMS, 0).to_vec();
    expect.push(b(State::ServerTerminate));
    assert_eq!(t.sent(), expect);

    // Streams that never attach (the socket code gives up on the agent's shutdown).
    let mut t = Talk::attaching(&cfg, TCP);
    t.host.shutting_down = true;
    t.c.attach_failed(
        "the client went away while opening its streams".into(),
        &t.host,
    );
    t.drain();
    assert_eq!(t.setup_ended(), "the agent is shutting down");
    assert_eq!(t.sent(), [b(State::ServerTerminate)]);
}

#[test]
fn streams_that_do_not_attach_and_a_busy_gate_end_the_setup() {
    let cfg = config(|_| {});
    let mut t = Talk::attaching(&cfg, TCP);
    t.c.attach_failed("0 of 1 TCP streams attached within 10s".into(), &t.host);
    t.drain();
    assert_eq!(t.setup_ended(), "0 of 1 TCP streams attached within 10s");
    assert_eq!(t.sent(), [0u8; 0]);

    let mut t = Talk::new(&cfg);
    let _ = t.sent();
    t.client(&json(
        br#"{"udp":true,"time":1,"parallel":1,"len":1200,"bandwidth":1000000}"#,
    ));
    assert_eq!(t.next(), Some(Output::EnterGate));
    t.c.gate_busy(&t.host);
    t.drain();
    // ACCESS_DENIED: "the server is busy running a test. try again later".
    assert_eq!(t.next(), Some(Output::Deny));
    assert_eq!(
        t.setup_ended(),
        "another test kept the UDP stream attach busy for 15s"
    );
    assert_eq!(t.sent(), [b(State::AccessDenied)]);
}

#[test]
fn the_client_ending_the_test_early_ends_it_with_its_reason() {
    let cfg = config(|_| {});
    let cases: [(Option<u8>, &str); 4] = [
        (
            Some(b(State::ClientTerminate)),
            "the client terminated the test",
        ),
        (
            Some(b(State::IperfDone)),
            "the client ended the test before its results",
        ),
        (Some(0x42), "unexpected control byte 0x42"),
        (None, "the client closed the control connection"),
    ];
    for (byte, why) in cases {
        let mut t = Talk::running(&cfg, TCP);
        assert_eq!(t.next(), Some(Output::EndOmit { from_zero: true }));
        t.advance(400);
        match byte {
            Some(byte) => t.client(&[byte]),
            None => t.client_closes(),
        }
        t.stops_at(400);
        assert_eq!(t.test_ended(), why);
        assert_eq!(t.sent(), [0u8; 0], "nothing more is said to the client");
    }
}

#[test]
fn a_test_without_test_end_is_closed_by_the_failsafe() {
    // -t 1: the planned end, then 30 s of slack.
    let cfg = config(|_| {});
    let mut t = Talk::running(&cfg, TCP);
    t.advance(30_999);
    assert_eq!(t.next(), Some(Output::EndOmit { from_zero: true }));
    assert_eq!(t.next(), None);
    t.advance(1);
    t.stops_at(31_000);
    assert_eq!(
        t.test_ended(),
        "no TEST_END 30s after the planned end (failsafe)"
    );
    assert_eq!(t.sent(), [0u8; 0]);
}

#[test]
fn a_byte_budget_test_is_cut_at_the_maximum_duration_and_told_server_terminate() {
    // -n 10G with omit 1: no slack past the agent's maximum (5 s here), after omit.
    let cfg = config(|_| {});
    let params = br#"{"tcp":true,"omit":1,"time":0,"num":10000000000,"parallel":1}"#;
    let mut t = Talk::running(&cfg, params);
    assert!(t.c.poll_timeout().is_some());
    t.advance(1_000);
    assert_eq!(t.next(), Some(Output::EndOmit { from_zero: false }));
    t.advance(4_999);
    assert_eq!(t.next(), None);
    t.advance(1);
    t.stops_at(6_000);
    // What the client prints as "the server has terminated"; the agent then waits for it to
    // hang up (dropping what it says) before the data sockets close.
    assert_eq!(t.sent(), [b(State::ServerTerminate)]);
    t.client(&[b(State::IperfDone), 0x42]);
    assert_eq!(t.next(), None);
    t.advance(1_000);
    t.client_closes();
    assert_eq!(
        t.test_ended(),
        "a -n/-k test cut at the agent's maximum duration, 5 s (sonde server --max-duration)"
    );
}

#[test]
fn the_agents_shutdown_ends_a_running_test_with_server_terminate() {
    let cfg = config(|_| {});
    let mut t = Talk::running(&cfg, TCP);
    t.advance(300);
    t.host.shutting_down = true;
    t.advance(1);
    assert_eq!(t.next(), Some(Output::EndOmit { from_zero: true }));
    t.stops_at(301);
    assert_eq!(t.sent(), [b(State::ServerTerminate)]);
    // A client that never hangs up is given TERMINATE_GRACE.
    t.advance(1_999);
    assert_eq!(t.next(), None);
    t.advance(1);
    assert_eq!(t.test_ended(), "the agent is shutting down");
}

#[test]
fn results_that_never_come_or_are_bad_end_the_exchange() {
    let cfg = config(|_| {});
    let mut t = Talk::exchanging(&cfg);
    t.advance(9_999);
    assert_eq!(t.next(), None);
    t.advance(1);
    assert_eq!(
        t.exchange_ended(),
        "no results from the client: no message from the peer within 10s"
    );
    assert_eq!(t.sent(), [0u8; 0], "ours are not sent");

    let mut t = Talk::exchanging(&cfg);
    t.client(&[0, 0, 0, 50]);
    t.client_closes();
    assert_eq!(
        t.exchange_ended(),
        "truncated results from the client: the peer closed the control connection"
    );

    let mut t = Talk::exchanging(&cfg);
    t.client(&[0x7f, 0xff, 0xff, 0xff]);
    let why = t.exchange_ended();
    assert!(why.starts_with("bad results from the client: "), "{why}");

    // Results missing required keys: the agent gives up, as iperf3 would.
    let mut t = Talk::exchanging(&cfg);
    t.client(&json(br#"{"cpu_util_total":0}"#));
    let why = t.exchange_ended();
    assert!(why.starts_with("bad results from the client: "), "{why}");
    assert_eq!(t.sent(), [0u8; 0]);
}

#[test]
fn after_the_results_iperf_done_a_close_or_silence_complete_the_test() {
    let cfg = config(|_| {});
    for end in ["done", "close", "silence", "other"] {
        let mut t = Talk::exchanging(&cfg);
        t.client(&json(RESULTS));
        assert!(t.sent().ends_with(&[b(State::DisplayResults)]));
        match end {
            "done" => t.client(&[b(State::IperfDone)]),
            "close" => t.client_closes(),
            "silence" => {
                t.advance(9_999);
                assert_eq!(t.next(), None);
                t.advance(1);
            }
            _ => t.client(&[b(State::TestEnd)]),
        }
        if end == "other" {
            assert_eq!(
                t.exchange_ended(),
                "unexpected control byte 0x04 after the results"
            );
        } else {
            assert_eq!(t.ended(), Ended::Completed, "{end}");
        }
    }
}

#[test]
fn a_failed_write_ends_the_conversation_where_it_failed() {
    let cfg = config(|_| {});
    let broken = || io::Error::from(io::ErrorKind::BrokenPipe);
    let lost = format!("control connection lost: {}", broken());

    // PARAM_EXCHANGE.
    let mut t = Talk::new(&cfg);
    t.c.handle_write_failed(t.now, &broken(), &t.host);
    t.drain();
    assert_eq!(t.setup_ended(), lost);

    // CREATE_STREAMS: the wait for the streams, queued after it, is dropped.
    let mut t = Talk::new(&cfg);
    t.client(&json(TCP));
    assert_eq!(t.next(), Some(Output::OpenStreams));
    t.did.clear();
    t.c.handle_write_failed(t.now, &broken(), &t.host);
    t.drain();
    assert_eq!(t.setup_ended(), lost);

    // TEST_START: the streams never run; the end goes the way of any other.
    let mut t = Talk::attaching(&cfg, TCP);
    t.c.streams_attached(t.now);
    t.c.handle_write_failed(t.now, &broken(), &t.host);
    t.drain();
    t.stops_at(0);
    assert_eq!(t.test_ended(), lost);

    // EXCHANGE_RESULTS.
    let mut t = Talk::exchanging(&cfg);
    t.c.handle_write_failed(t.now, &broken(), &t.host);
    t.drain();
    assert_eq!(t.exchange_ended(), lost);

    // SERVER_TERMINATE: no hang-up to wait for.
    let mut t = Talk::running(&cfg, TCP);
    t.host.shutting_down = true;
    t.advance(1);
    t.c.streams_stopped(t.now);
    t.drain();
    t.did.clear();
    t.c.handle_write_failed(t.now, &broken(), &t.host);
    t.drain();
    assert_eq!(t.test_ended(), "the agent is shutting down");

    // A refusal's SERVER_ERROR is the last word: its failure changes nothing.
    let mut t = Talk::attaching(&cfg, TCP);
    t.c.refuse((errno::IESETBUF2, 0, "short buffer".into()), &t.host);
    t.c.handle_write_failed(t.now, &broken(), &t.host);
    t.drain();
    assert_eq!(t.next(), Some(Output::Refused));
    assert_eq!(t.setup_ended(), "refused: short buffer");
}

#[test]
fn client_options_become_socket_options() {
    let p = Params {
        window: 256 << 10,
        mss: 1000,
        tos: 0x10,
        fqrate: 10_000_000,
        congestion: Some("reno".into()),
        nodelay: true,
        dont_fragment: 1,
        ..Params::default()
    };
    assert_eq!(
        stream_options(&p).unwrap(),
        DataOptions {
            buffer_bytes: Some(256 << 10),
            mss: Some(1000),
            congestion: Some("reno".into()),
            tos: Some(0x10),
            // --fq-rate is in bits per second, SO_MAX_PACING_RATE in bytes.
            max_pacing_rate_bytes_per_second: Some(1_250_000),
            nodelay: true,
            dont_fragment: true,
            zerocopy: false,
        }
    );
    // Nothing asked, nothing set; a rate below one byte per second is none, as in iperf3.
    assert_eq!(
        stream_options(&Params::default()).unwrap(),
        DataOptions::default()
    );
    let slow = Params {
        fqrate: 7,
        ..Params::default()
    };
    assert_eq!(stream_options(&slow).unwrap(), DataOptions::default());
}

#[test]
fn impossible_option_values_are_refused_with_iperf3_codes() {
    let code = |p: Params| stream_options(&p).map(drop).unwrap_err().0;
    let p = Params::default;
    for window in [-1, i64::from(i32::MAX) + 1] {
        assert_eq!(code(Params { window, ..p() }), errno::IESETBUF);
    }
    assert_eq!(code(Params { mss: -1, ..p() }), errno::IESETMSS);
    assert_eq!(code(Params { tos: 256, ..p() }), errno::IEBADTOS);
    assert_eq!(code(Params { tos: -1, ..p() }), errno::IEBADTOS);
    assert_eq!(code(Params { fqrate: -8, ..p() }), errno::IEINITTEST);
}

// ---------------------------------------------------------------------------------------------
// Against the client's own iperf3 conversation (`sonde_client::iperf3::control`)
// ---------------------------------------------------------------------------------------------

mod pair {
    use sonde_client::iperf3::control::{self as client, Heard, Opening, ReadError};
    use sonde_client::ClientError;
    use sonde_wire::iperf3::Cookie;

    use super::*;

    fn cookie() -> Cookie {
        Cookie::from_bytes(*b"abcdefghijklmnopqrstuvwxyz234567abcd\0")
    }

    /// The client's parameters as sonde's `throughput iperf3://` sends them.
    fn params(json: &[u8]) -> Params {
        Params::from_json(json).expect("parameters")
    }

    /// The client's side of a pair: its conversation, what the server said, and its socket.
    struct Client {
        c: client::Conversation,
        heard: Vec<Result<Heard, Opening>>,
        /// What the agent wrote that the client has not read.
        socket: Vec<u8>,
        closed: bool,
    }

    /// The two machines joined by an in-memory control connection (the shape of quinn-proto's
    /// `tests/util.rs` `Pair`), one virtual clock, and a fake data side that attaches streams
    /// at once and has its results when asked.
    struct Pair<'a> {
        agent: Talk<'a>,
        client: Client,
        params: Params,
        /// The agent ended and closed its side.
        agent_closed: bool,
    }

    impl<'a> Pair<'a> {
        fn new(cfg: &'a AgentConfig, params_json: &[u8]) -> Self {
            let agent = Talk::new(cfg);
            let mut c =
                client::Conversation::new(agent.now, "127.0.0.1:5201".parse().unwrap(), &cookie());
            // The listener reads the cookie before the test's conversation starts.
            assert_eq!(c.poll_transmit(), cookie().as_bytes());
            Self {
                agent,
                client: Client {
                    c,
                    heard: Vec::new(),
                    socket: Vec::new(),
                    closed: false,
                },
                params: params(params_json),
                agent_closed: false,
            }
        }

        /// Moves bytes both ways, and lets each side act on what it heard, until nothing moves.
        fn settle(&mut self) {
            loop {
                let mut moved = false;
                // Agent → client.
                let bytes = self.agent.sent();
                if !bytes.is_empty() {
                    self.client.socket.extend_from_slice(&bytes);
                }
                if !self.client.socket.is_empty() && self.client.c.reading() {
                    let bytes = std::mem::take(&mut self.client.socket);
                    self.client.c.handle_bytes(self.agent.now, &bytes);
                    moved = true;
                } else if self.agent_closed && !self.client.closed && self.client.c.reading() {
                    self.client.closed = true;
                    self.client
                        .c
                        .handle_read_error(self.agent.now, ReadError::Closed);
                    moved = true;
                }
                // The client acts on what it heard.
                while let Some(h) = self.client.c.poll() {
                    moved = true;
                    let now = self.agent.now;
                    match &h {
                        Ok(Heard::ParamExchange) => self.client.c.send_params(now, &self.params),
                        Ok(Heard::CreateStreams) => self.client.c.streams_open(now),
                        Ok(Heard::ExchangeResults) => {
                            self.client.c.send_results(now, &ours());
                        }
                        _ => {}
                    }
                    self.client.heard.push(h);
                }
                // Client → agent.
                let bytes = self.client.c.poll_transmit();
                if !bytes.is_empty() {
                    moved = true;
                    self.agent.client(&bytes);
                }
                if !self.client.c.reading() && !self.agent.client_closed && self.client_done() {
                    // A client done with the conversation closes the connection.
                    moved = true;
                    self.agent.client_closes();
                }
                // The fake data side.
                while let Some(did) = self.agent.next() {
                    let now = self.agent.now;
                    match did {
                        Output::EnterGate => self.agent.c.gate_entered(),
                        Output::AwaitStreams => self.agent.c.streams_attached(now),
                        Output::StopStreams { drain: true, .. } => {
                            self.agent.c.results_ready(now, &ours());
                        }
                        Output::StopStreams { drain: false, .. } => {
                            self.agent.c.streams_stopped(now);
                        }
                        Output::End(e) => {
                            // Left for the test to look at; the agent closes its side.
                            self.agent.did.push_front(Output::End(e));
                            moved |= !self.agent_closed;
                            self.agent_closed = true;
                            break;
                        }
                        _ => {}
                    }
                    moved = true;
                    self.agent.drain();
                }
                if !moved {
                    return;
                }
            }
        }

        /// Whether the client's conversation is over (its last word heard).
        fn client_done(&self) -> bool {
            self.client
                .heard
                .last()
                .is_some_and(|h| matches!(h, Err(_) | Ok(Heard::Done { .. })))
        }

        /// The clock moves on by `ms`, both sides looking at it each millisecond.
        fn advance(&mut self, ms: u64) {
            for _ in 0..ms {
                self.agent.advance(1);
                self.client.c.handle_timeout(self.agent.now);
                self.settle();
            }
        }

        fn agent_ended(&mut self) -> Ended {
            self.agent.ended()
        }

        fn client_error(&mut self) -> String {
            match self.client.heard.pop() {
                Some(Err(e)) => match e.error() {
                    ClientError::Remote(m)
                    | ClientError::Iperf3Refused(m)
                    | ClientError::Protocol(m) => m,
                    other => other.to_string(),
                },
                other => panic!("the client did not fail: {other:?}"),
            }
        }
    }

    /// What the client heard, in short.
    fn names(heard: &[Result<Heard, Opening>]) -> Vec<&'static str> {
        heard
            .iter()
            .map(|h| match h {
                Ok(Heard::ParamExchange) => "PARAM_EXCHANGE",
                Ok(Heard::CreateStreams) => "CREATE_STREAMS",
                Ok(Heard::TestRunning) => "TEST_RUNNING",
                Ok(Heard::ExchangeResults) => "EXCHANGE_RESULTS",
                Ok(Heard::ServerResults(_)) => "results",
                Ok(Heard::NoAccount) => "no account",
                Ok(Heard::Done { clean_end: true }) => "done",
                Ok(Heard::Done { clean_end: false }) => "done, unclean",
                Err(_) => "error",
            })
            .collect()
    }

    #[test]
    fn a_whole_test_with_sondes_own_client() {
        let cfg = config(|_| {});
        for json in [
            TCP,
            br#"{"udp":true,"omit":1,"time":1,"parallel":2,"reverse":true,"len":1400,"bandwidth":10000000,"udp_counters_64bit":1}"#,
        ] {
            let mut p = Pair::new(&cfg, json);
            p.settle();
            assert_eq!(
                names(&p.client.heard),
                ["PARAM_EXCHANGE", "CREATE_STREAMS", "TEST_RUNNING"]
            );
            p.advance(2_000);
            p.client.c.end_test(p.agent.now);
            p.settle();
            assert_eq!(p.agent_ended(), Ended::Completed);
            let heard = names(&p.client.heard);
            assert_eq!(
                heard[3..],
                ["EXCHANGE_RESULTS", "results", "done"],
                "a clean end: the agent closed after IPERF_DONE"
            );
            let theirs = p.client.heard.iter().find_map(|h| match h {
                Ok(Heard::ServerResults(r)) => Some(r.clone()),
                _ => None,
            });
            assert_eq!(theirs.as_deref(), Some(&ours()));
        }
    }

    #[test]
    fn a_refusal_reads_at_the_client_as_iperf3_words_it() {
        let cfg = config(|c| c.max_streams = 4);
        let mut p = Pair::new(&cfg, br#"{"tcp":true,"time":1,"parallel":5,"len":131072}"#);
        p.settle();
        assert_eq!(
            p.agent_ended(),
            Ended::Setup(
                "refused: 5 streams asked, this agent allows 4 (sonde server --max-streams)".into()
            )
        );
        assert_eq!(
            p.client_error(),
            format!(
                "the iperf3 server at 127.0.0.1:5201 refused the test: {}",
                sonde_wire::iperf3::error_message(errno::IENUMSTREAMS)
            )
        );
    }

    #[test]
    fn ctrl_c_at_the_client_ends_the_agents_test() {
        let cfg = config(|_| {});
        let mut p = Pair::new(&cfg, TCP);
        p.settle();
        p.advance(500);
        p.client.c.terminate();
        p.settle();
        assert_eq!(
            p.agent_ended(),
            Ended::Test("the client terminated the test".into())
        );
    }

    #[test]
    fn the_agents_end_of_a_test_reads_at_the_client_as_server_terminate() {
        // The agent shutting down, and a -n test cut at the agent's maximum duration.
        for budget in [false, true] {
            let cfg = config(|_| {});
            let json: &[u8] = if budget {
                br#"{"tcp":true,"time":0,"num":10000000000,"parallel":1}"#
            } else {
                TCP
            };
            let mut p = Pair::new(&cfg, json);
            p.settle();
            if budget {
                p.advance(5_000);
            } else {
                p.advance(500);
                p.agent.host.shutting_down = true;
                p.advance(1);
            }
            // The client answers IPERF_DONE, as iperf3 3.12 does, and hangs up: the agent
            // does not wait out its grace.
            assert_eq!(
                p.client_error(),
                "the iperf3 server was stopped during the test (SERVER_TERMINATE)"
            );
            let why = match p.agent_ended() {
                Ended::Test(why) => why,
                other => panic!("{other:?}"),
            };
            if budget {
                assert!(why.starts_with("a -n/-k test cut at the agent's maximum duration, 5 s"));
            } else {
                assert_eq!(why, "the agent is shutting down");
            }
        }
    }
}
