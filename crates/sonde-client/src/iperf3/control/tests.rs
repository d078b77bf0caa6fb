//! The iperf3 control conversation in memory: a scripted server's bytes in, the client's bytes
//! out, time advanced by hand. The socket tests in `iperf3/tests.rs` and the real `iperf3 -s` of
//! `tests/peers/iperf3_client.rs` cover the same steps over the network, in seconds.

use super::*;

const PEER: &str = "192.0.2.1:5201";

fn peer() -> SocketAddr {
    PEER.parse().expect("an address")
}

fn cookie() -> Cookie {
    Cookie::from_bytes(*b"abcdefghijklmnopqrstuvwxyz234567abcd\0")
}

fn params() -> Params {
    Params::from_json(br#"{"tcp":true,"omit":0,"time":1,"parallel":1,"len":131072}"#)
        .expect("parameters")
}

const RESULTS: &[u8] = br#"{"cpu_util_total":0.5,"cpu_util_user":0.25,"cpu_util_system":0.25,"sender_has_retransmits":-1,"streams":[{"id":1,"bytes":1310720,"retransmits":-1,"jitter":0,"errors":0,"packets":0}]}"#;

fn json(body: &[u8]) -> Vec<u8> {
    let mut v = wire::json_prefix(body).to_vec();
    v.extend_from_slice(body);
    v
}

fn b(state: State) -> u8 {
    state.byte()
}

/// A conversation and its clock.
struct Talk {
    now: Instant,
    c: Conversation,
}

impl Talk {
    fn new() -> Self {
        let now = Instant::now();
        Self {
            now,
            c: Conversation::new(now, peer(), &cookie()),
        }
    }

    fn server(&mut self, bytes: &[u8]) {
        self.c.handle_bytes(self.now, bytes);
    }

    fn closed(&mut self) {
        self.c.handle_read_error(self.now, ReadError::Closed);
    }

    fn advance(&mut self, by: Duration) {
        self.now += by;
        self.c.handle_timeout(self.now);
    }

    fn heard(&mut self) -> Heard {
        match self.c.poll() {
            Some(Ok(h)) => h,
            other => panic!("heard nothing good: {other:?}"),
        }
    }

    fn failed(&mut self) -> Opening {
        match self.c.poll() {
            Some(Err(e)) => e,
            other => panic!("did not fail: {other:?}"),
        }
    }

    /// The failure's message, without the words the client's `Display` puts around it.
    fn error(&mut self) -> String {
        match self.failed().error() {
            ClientError::Remote(m)
            | ClientError::Iperf3Refused(m)
            | ClientError::NotIperf3(m)
            | ClientError::Protocol(m) => m,
            other => other.to_string(),
        }
    }

    /// Through the greeting, the parameters and the start: the test runs.
    fn running() -> Self {
        let mut t = Self::new();
        let _ = t.c.poll_transmit();
        t.server(&[b(State::ParamExchange)]);
        assert!(matches!(t.heard(), Heard::ParamExchange));
        t.c.send_params(t.now, &params());
        let _ = t.c.poll_transmit();
        t.server(&[b(State::CreateStreams)]);
        assert!(matches!(t.heard(), Heard::CreateStreams));
        t.c.streams_open(t.now);
        t.server(&[b(State::TestStart), b(State::TestRunning)]);
        assert!(matches!(t.heard(), Heard::TestRunning));
        t
    }
}

#[test]
fn a_whole_test_goes_as_iperf3_3_12_has_it() {
    let mut t = Talk::new();
    assert_eq!(t.c.poll_transmit(), cookie().as_bytes().to_vec());
    assert_eq!(t.c.poll_timeout(), Some(t.now + GREETING_TIMEOUT));
    t.server(&[b(State::ParamExchange)]);
    assert!(matches!(t.heard(), Heard::ParamExchange));
    assert!(!t.c.reading() && !t.c.params_sent());
    t.c.send_params(t.now, &params());
    assert_eq!(t.c.poll_transmit(), json(&params().to_json()));
    assert!(t.c.params_sent());
    t.server(&[b(State::CreateStreams)]);
    assert!(matches!(t.heard(), Heard::CreateStreams));
    t.c.streams_open(t.now);
    // TEST_START and TEST_RUNNING, often in one segment; here one at a time.
    t.server(&[b(State::TestStart)]);
    assert!(t.c.poll().is_none());
    t.server(&[b(State::TestRunning)]);
    assert!(matches!(t.heard(), Heard::TestRunning));
    // No deadline while the test runs: its length is the caller's.
    assert_eq!(t.c.poll_timeout(), None);
    t.advance(Duration::from_secs(3_600));
    assert!(t.c.poll().is_none());
    t.c.end_test(t.now);
    assert_eq!(t.c.poll_transmit(), [b(State::TestEnd)]);
    t.server(&[b(State::ExchangeResults)]);
    assert!(matches!(t.heard(), Heard::ExchangeResults));
    let ours = Results::from_json(RESULTS).expect("results");
    t.c.send_results(t.now, &ours);
    assert_eq!(t.c.poll_transmit(), json(&ours.to_json()));
    // The server's results, cut anywhere.
    let theirs = json(RESULTS);
    let (a, rest) = theirs.split_at(2);
    let (bb, c) = rest.split_at(40);
    t.server(a);
    t.server(bb);
    assert!(t.c.poll().is_none());
    t.server(c);
    match t.heard() {
        Heard::ServerResults(r) => assert_eq!(r.streams[0].bytes, 1_310_720),
        other => panic!("{other:?}"),
    }
    t.server(&[b(State::DisplayResults)]);
    assert_eq!(t.c.poll_transmit(), [b(State::IperfDone)]);
    assert_eq!(t.c.poll_timeout(), Some(t.now + CLOSE_WAIT));
    t.closed();
    assert!(matches!(t.heard(), Heard::Done { clean_end: true }));
    assert!(!t.c.reading());
}

#[test]
fn everything_the_server_sends_at_once_is_heard_in_order() {
    let mut t = after_params();
    t.server(&[b(State::CreateStreams), b(State::TestStart)]);
    assert!(matches!(t.heard(), Heard::CreateStreams));
    // TEST_START waits for the caller to say the streams are open.
    assert!(t.c.poll().is_none());
    t.c.streams_open(t.now);
    t.server(&[b(State::TestRunning), b(State::ExchangeResults)]);
    assert!(matches!(t.heard(), Heard::TestRunning));
    assert!(matches!(t.heard(), Heard::ExchangeResults));
    t.c.send_results(t.now, &Results::from_json(RESULTS).expect("results"));
    let _ = t.c.poll_transmit();
    let mut rest = json(RESULTS);
    rest.push(b(State::DisplayResults));
    t.server(&rest);
    assert!(matches!(t.heard(), Heard::ServerResults(_)));
    assert_eq!(t.c.poll_transmit(), [b(State::IperfDone)]);
    t.advance(CLOSE_WAIT);
    assert!(matches!(t.heard(), Heard::Done { clean_end: true }));
}

// ---------------------------------------------------------------------------------------------
// The greeting: busy servers, other services, silence, gaps
// ---------------------------------------------------------------------------------------------

#[test]
fn a_busy_server_is_refused_and_not_a_gap() {
    let mut t = Talk::new();
    t.server(&[b(State::AccessDenied)]);
    match t.failed() {
        Opening::Failed(ClientError::Iperf3Refused(m)) => assert_eq!(
            m,
            format!("the iperf3 server at {PEER} is busy running a test; try again later")
        ),
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_close_before_any_answer_is_a_gap_worth_another_try() {
    let mut t = Talk::new();
    t.closed();
    match t.failed() {
        Opening::Gap(ClientError::NotIperf3(m)) => {
            assert!(
                m.contains("closed the connection without answering the cookie"),
                "{m}"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_silent_server_is_not_iperf3_at_the_greeting_timeout_and_not_before() {
    let mut t = Talk::new();
    t.advance(GREETING_TIMEOUT - Duration::from_millis(1));
    assert!(t.c.poll().is_none());
    t.advance(Duration::from_millis(1));
    assert_eq!(
        t.error(),
        format!(
            "{PEER} is not an iperf3 server: it said nothing for 5 s after the cookie (an iperf3 server answers at once)"
        )
    );
}

#[test]
fn another_service_is_named_by_what_it_answered() {
    // The whole answer in one segment.
    let mut t = Talk::new();
    t.server(b"HTTP/1.1 400 Bad Request\r\n\r\n");
    let m = t.error();
    assert!(
        m.contains(r#"it answered 0x48 ("HTTP/1.1 400 Bad Request") where iperf3 asks"#),
        "{m}"
    );
    // The first byte alone, its text a moment later.
    let mut t = Talk::new();
    t.server(b"S");
    assert!(t.c.poll().is_none());
    t.server(b"SH-2.0-OpenSSH_9.6\r\n");
    assert!(t.error().contains(r#"0x53 ("SSH-2.0-OpenSSH_9.6")"#));
    // A byte and nothing more: the byte alone, after a short wait.
    let mut t = Talk::new();
    t.server(&[0x7f]);
    t.advance(Duration::from_millis(100));
    assert!(t.error().contains("it answered 0x7f where"));
}

#[test]
fn a_server_error_at_the_greeting_reads_as_iperf3_prints_it() {
    let mut t = Talk::new();
    t.server(&[b(State::ServerError), 0, 0]);
    t.server(&[0, 123, 0, 0]);
    assert!(t.c.poll().is_none());
    t.server(&[0, 22]);
    assert_eq!(t.error(), "unable to set TCP/SCTP MSS: Invalid argument");
    // The code, then the close (as after an authentication failure).
    let mut t = Talk::new();
    t.server(&[b(State::ServerError), 0, 0, 0, 142]);
    t.closed();
    assert_eq!(t.error(), "test authorization failed");
    // Not even the code.
    let mut t = Talk::new();
    t.server(&[b(State::ServerError)]);
    t.advance(STEP_TIMEOUT);
    assert_eq!(
        t.error(),
        "the iperf3 server reported an error but not which"
    );
}

#[test]
fn an_answer_waiting_behind_a_failed_cookie_write_is_what_counts() {
    let reset = || io::Error::new(io::ErrorKind::ConnectionReset, "reset");
    let mut t = Talk::new();
    t.c.handle_write_failed(&reset());
    t.server(&[b(State::AccessDenied)]);
    assert!(t.error().contains("is busy running a test"));
    // Asked for parameters it never had the cookie for: the write's failure.
    let mut t = Talk::new();
    t.c.handle_write_failed(&reset());
    t.server(&[b(State::ParamExchange)]);
    assert!(matches!(
        t.failed(),
        Opening::Failed(ClientError::Control(ControlError::Io(_)))
    ));
}

// ---------------------------------------------------------------------------------------------
// The parameters and the start
// ---------------------------------------------------------------------------------------------

fn after_params() -> Talk {
    let mut t = Talk::new();
    t.server(&[b(State::ParamExchange)]);
    let _ = t.heard();
    t.c.send_params(t.now, &params());
    let _ = t.c.poll_transmit();
    t
}

#[test]
fn parameters_an_iperf3_server_will_not_run_are_refused_in_its_words() {
    let mut t = after_params();
    t.closed();
    assert!(t
        .error()
        .contains("closed the connection after reading the test parameters"));
    let mut t = after_params();
    t.server(&[b(State::ServerError), 0, 0, 0, 27, 0, 0, 0, 0]);
    assert_eq!(
        t.error(),
        format!(
            "the iperf3 server at {PEER} refused the test: total required bandwidth is larger than server limit"
        )
    );
    let mut t = after_params();
    t.server(&[b(State::AccessDenied)]);
    assert_eq!(
        t.error(),
        format!("the iperf3 server at {PEER} denied access to the test")
    );
    let mut t = after_params();
    t.server(&[b(State::TestStart)]);
    assert_eq!(
        t.error(),
        "the iperf3 server sent TestStart (0x01) where CREATE_STREAMS was due"
    );
    let mut t = after_params();
    t.advance(STEP_TIMEOUT);
    assert_eq!(
        t.error(),
        format!("the iperf3 server at {PEER} sent no CREATE_STREAMS in time")
    );
}

#[test]
fn a_server_that_ends_the_test_before_it_starts_says_why() {
    let mut t = after_params();
    t.server(&[b(State::CreateStreams)]);
    let _ = t.heard();
    t.c.streams_open(t.now);
    t.server(&[b(State::TestStart), b(State::ServerTerminate)]);
    assert_eq!(
        t.error(),
        "the iperf3 server was stopped during the test (SERVER_TERMINATE)"
    );
    // Told, as iperf3 3.12 tells it.
    assert_eq!(t.c.poll_transmit(), [b(State::IperfDone)]);
}

// ---------------------------------------------------------------------------------------------
// The test and its end
// ---------------------------------------------------------------------------------------------

#[test]
fn a_server_that_never_asks_for_results_times_out_after_test_end() {
    let mut t = Talk::running();
    t.c.end_test(t.now);
    t.c.end_test(t.now);
    assert_eq!(t.c.poll_transmit(), [b(State::TestEnd)], "TEST_END once");
    t.advance(RESULTS_TIMEOUT - Duration::from_millis(1));
    assert!(t.c.poll().is_none());
    t.advance(Duration::from_millis(1));
    assert_eq!(
        t.error(),
        "the iperf3 server did not ask for results within 10 s of the test's end"
    );
}

#[test]
fn the_server_closing_or_erring_mid_test_ends_it_with_its_reason() {
    let mut t = Talk::running();
    t.closed();
    assert_eq!(
        t.error(),
        format!("the iperf3 server at {PEER} closed the control connection during the test")
    );
    let mut t = Talk::running();
    t.server(&[b(State::ServerError), 0, 0, 0, 7, 0, 0, 0, 0]);
    assert!(t.error().starts_with("the iperf3 server ended the test: "));
    let mut t = Talk::running();
    t.server(&[b(State::AccessDenied)]);
    assert_eq!(t.error(), "the iperf3 server denied access during the test");
    let mut t = Talk::running();
    t.server(&[0xee]);
    assert_eq!(
        t.error(),
        "the iperf3 server sent an undefined state (0xee) where EXCHANGE_RESULTS was due"
    );
}

#[test]
fn a_failed_stream_takes_the_servers_account_if_it_comes_within_half_a_second() {
    let mut t = Talk::running();
    t.c.stream_failed(t.now);
    t.advance(Duration::from_millis(499));
    assert!(t.c.poll().is_none());
    t.server(&[b(State::ServerTerminate)]);
    assert!(t.error().contains("SERVER_TERMINATE"));
    let mut t = Talk::running();
    t.c.stream_failed(t.now);
    t.advance(Duration::from_millis(500));
    assert!(matches!(t.heard(), Heard::NoAccount));
    // Any byte, even the one due later, is the server's account.
    let mut t = Talk::running();
    t.c.stream_failed(t.now);
    t.server(&[b(State::ExchangeResults)]);
    assert_eq!(
        t.error(),
        "the iperf3 server sent ExchangeResults (0x0d) where nothing was due"
    );
}

#[test]
fn results_with_a_bad_length_are_refused_before_anything_is_allocated() {
    for prefix in [[0u8; 4], [0xff; 4], (wire::MAX_JSON_LEN + 1).to_be_bytes()] {
        let mut t = Talk::running();
        t.c.end_test(t.now);
        t.server(&[b(State::ExchangeResults)]);
        let _ = t.heard();
        t.c.send_results(t.now, &Results::from_json(RESULTS).expect("results"));
        t.server(&prefix);
        assert!(
            t.error().starts_with("the iperf3 server's results: "),
            "{prefix:?}"
        );
    }
}

#[test]
fn a_server_that_closes_instead_of_display_results_has_still_completed_the_test() {
    let mut t = Talk::running();
    t.c.end_test(t.now);
    t.server(&[b(State::ExchangeResults)]);
    let _ = t.heard();
    t.c.send_results(t.now, &Results::from_json(RESULTS).expect("results"));
    t.server(&json(RESULTS));
    let _ = t.heard();
    t.closed();
    assert!(matches!(t.heard(), Heard::Done { clean_end: false }));
}

// ---------------------------------------------------------------------------------------------
// Ctrl-C
// ---------------------------------------------------------------------------------------------

#[test]
fn ctrl_c_tells_a_server_that_has_the_parameters_and_no_other() {
    let mut t = Talk::running();
    t.c.handle_read_error(t.now, ReadError::Interrupted);
    assert!(matches!(t.failed().error(), ClientError::Interrupted));
    t.c.terminate();
    assert_eq!(t.c.poll_transmit(), [b(State::ClientTerminate)]);
    let mut t = Talk::new();
    let _ = t.c.poll_transmit();
    t.c.handle_read_error(t.now, ReadError::Interrupted);
    assert!(matches!(t.failed().error(), ClientError::Interrupted));
    t.c.terminate();
    assert!(t.c.poll_transmit().is_empty());
}
