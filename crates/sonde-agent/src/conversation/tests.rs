//! The control conversation in memory, on a virtual clock: the agent's [`Conversation`] and the
//! client's [`Handshake`] wired to each other through the real frame codec, time advanced by
//! hand (the shape of quinn-proto's `tests/util.rs` `Pair`). Every fault `src/tests/robustness.rs`
//! and `src/tests/secrets.rs` make over sockets in seconds is made here in microseconds: a lost
//! client, early close, messages out of order or twice, joins that never come, every timeout,
//! every refusal, bad proofs and replays.

use std::net::SocketAddr;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use sonde_client::handshake::{Handshake, Progress, HANDSHAKE_TIMEOUT};
use sonde_client::ClientError;
use sonde_net::control::ControlError;
use sonde_wire::auth::Secret;
use sonde_wire::{Direction, Protocol};

use super::*;
use crate::{Helper, HelperFailure, HelperJob, HelperOutcome, HelperRunner};

/// The agent's port, as the join error names it.
const PORT: u16 = 5201;

fn config(tune: impl FnOnce(&mut AgentConfig)) -> AgentConfig {
    let mut cfg = AgentConfig::new(SocketAddr::from(([127, 0, 0, 1], PORT)));
    cfg.hello_timeout = Duration::from_millis(300);
    tune(&mut cfg);
    cfg
}

fn secret(bytes: &[u8]) -> Secret {
    Secret::new(bytes.to_vec()).expect("a valid secret")
}

fn spec(kind: TestKind, protocol: Protocol, streams: u32, duration_ms: u64) -> TestSpec {
    TestSpec {
        kind,
        protocol,
        direction: Direction::Forward,
        streams,
        msg_size: 64,
        bitrate_per_stream: 0,
        duration_ms,
        interval_ms: 0,
        read_size: 0,
        socket: Default::default(),
        omit_ms: 0,
        skip_rx_copy: false,
        bytes: 0,
        blocks: 0,
        request_response: None,
    }
}

fn latency() -> TestSpec {
    spec(TestKind::Latency, Protocol::Tcp, 1, 1_000)
}

/// The agent around the conversation: fixed nonces, numbered sessions, and room for
/// `room` sessions (then full, for the listener or the source).
struct FakeAgent {
    nonce: u8,
    sessions: u64,
    room: u32,
    full: Full,
    shutting_down: bool,
    link_busy: bool,
    gone: bool,
    /// What its kernel refuses of a test's socket options (`try_socket`), when anything.
    socket_refused: Option<String>,
    /// The specs admitted, with the key their UDP joins are to be signed with.
    admitted: Vec<(TestSpec, Option<SessionKey>)>,
    /// The tokens of its sessions.
    taken: Vec<Token>,
    helpers: u32,
    hosts_described: u32,
}

impl FakeAgent {
    fn new() -> Self {
        Self {
            nonce: 1,
            sessions: 0,
            room: 16,
            full: Full::Listener,
            shutting_down: false,
            link_busy: false,
            gone: false,
            socket_refused: None,
            admitted: Vec::new(),
            taken: Vec::new(),
            helpers: 0,
            hosts_described: 0,
        }
    }
}

impl Agent for FakeAgent {
    fn try_socket(&mut self, spec: &TestSpec) -> Result<(), String> {
        match &self.socket_refused {
            Some(why) if !spec.socket.is_default() => Err(why.clone()),
            _ => Ok(()),
        }
    }

    fn nonce(&mut self) -> Option<Nonce> {
        self.nonce = self.nonce.wrapping_add(1);
        Some(Nonce([self.nonce; sonde_wire::auth::NONCE_LEN]))
    }

    fn next_session(&mut self) -> SessionId {
        self.sessions += 1;
        SessionId(self.sessions)
    }

    fn shutting_down(&self) -> bool {
        self.shutting_down
    }

    fn admit(
        &mut self,
        spec: &TestSpec,
        key: Option<&SessionKey>,
        token: Option<Token>,
    ) -> Result<Token, NotAdmitted> {
        if self.gone {
            return Err(NotAdmitted::Gone);
        }
        if self.room == 0 {
            return Err(NotAdmitted::Full(self.full));
        }
        if self.link_busy && matches!(spec.kind, TestKind::Throughput | TestKind::Pps) {
            return Err(NotAdmitted::LinkBusy);
        }
        if token.is_some_and(|t| self.taken.contains(&t)) {
            return Err(NotAdmitted::TokenTaken);
        }
        self.room -= 1;
        self.admitted.push((spec.clone(), key.cloned()));
        let t = token.unwrap_or(Token(0x5eed_0000 + self.admitted.len() as u64));
        self.taken.push(t);
        Ok(t)
    }

    fn admit_helper(&mut self) -> Result<(), NotAdmitted> {
        if self.room == 0 {
            return Err(NotAdmitted::Full(self.full));
        }
        self.room -= 1;
        self.helpers += 1;
        Ok(())
    }

    fn host(&mut self) -> Option<Box<HostInfo>> {
        self.hosts_described += 1;
        None
    }

    fn tag(&mut self) -> Option<sonde_wire::AgentTag> {
        Some(sonde_wire::AgentTag {
            id: sonde_wire::AgentId(0xa9e7),
            addr: "198.18.0.2:5300".into(),
        })
    }
}

/// What the agent did besides sending, in order.
#[derive(Debug, PartialEq)]
enum Did {
    Refused(Refusal, bool),
    Admitted(SessionId),
    AwaitJoins,
    Run(SessionId),
    Help(String),
    ShutdownWrite,
    End { bad_hello: bool },
}

/// A client's handshake and the agent's conversation, wired to each other by two byte pipes
/// through the real frame codec; time moves only when a test says so.
struct Pair<'a> {
    now: Instant,
    agent: Conversation<'a>,
    fake: FakeAgent,
    client: Handshake,
    /// Bytes on their way to the agent, and to the client.
    to_agent: Vec<u8>,
    to_client: Vec<u8>,
    /// What the agent did, and what it sent (decoded), in order.
    did: Vec<Did>,
    sent: Vec<ControlMsg>,
    /// The agent closed the connection (its conversation ended).
    closed: bool,
}

impl<'a> Pair<'a> {
    fn new(cfg: &'a AgentConfig, client_secret: Option<Secret>) -> Self {
        Self::with(cfg, client_secret, FakeAgent::new(), Ok(()))
    }

    fn with(
        cfg: &'a AgentConfig,
        client_secret: Option<Secret>,
        fake: FakeAgent,
        version: Result<(), String>,
    ) -> Self {
        let now = Instant::now();
        let mut pair = Self {
            now,
            agent: Conversation::new(now, cfg, PORT, version),
            fake,
            client: Handshake::new(now, client_secret, Nonce([0xc1; 32])),
            to_agent: Vec::new(),
            to_client: Vec::new(),
            did: Vec::new(),
            sent: Vec::new(),
            closed: false,
        };
        pair.drain_agent();
        pair
    }

    /// Raw bytes from the client, as they come (junk, a cut frame, a huge length).
    fn client_bytes(&mut self, bytes: &[u8]) {
        self.to_agent.extend_from_slice(bytes);
        self.deliver_to_agent();
    }

    /// A message from the client outside its handshake (a replay, a duplicate, nonsense).
    fn client_sends(&mut self, msg: &ControlMsg) {
        let mut frame = Vec::new();
        sonde_wire::encode_frame(msg, &mut frame).expect("a frame");
        self.client_bytes(&frame);
    }

    /// What the client's handshake has to send goes to the agent.
    fn flush_client(&mut self) {
        while let Some(msg) = self.client.poll_transmit() {
            self.client_sends(&msg);
        }
    }

    /// The agent reads every whole frame it has; bytes that are not a frame lose the
    /// connection, as `read_frame` does.
    fn deliver_to_agent(&mut self) {
        while !self.closed {
            match sonde_wire::decode_frame(&self.to_agent) {
                Ok(Some((msg, used))) => {
                    self.to_agent.drain(..used);
                    self.agent.handle(self.now, msg, &mut self.fake);
                }
                Ok(None) => break,
                Err(_) => {
                    self.to_agent.clear();
                    self.agent.handle_lost();
                }
            }
            self.drain_agent();
        }
    }

    fn drain_agent(&mut self) {
        while let Some(output) = self.agent.poll() {
            match output {
                Output::Send(msg) => {
                    sonde_wire::encode_frame(&msg, &mut self.to_client).expect("a frame");
                    self.sent.push(*msg);
                }
                Output::ShutdownWrite => self.did.push(Did::ShutdownWrite),
                Output::Refused {
                    reason,
                    unauthenticated,
                    ..
                } => self.did.push(Did::Refused(reason, unauthenticated)),
                Output::Admitted { session, .. } => self.did.push(Did::Admitted(session)),
                Output::AwaitJoins => self.did.push(Did::AwaitJoins),
                Output::Run { session, .. } => self.did.push(Did::Run(session)),
                Output::Help { target, .. } => self.did.push(Did::Help(target)),
                Output::End { bad_hello } => {
                    self.closed = true;
                    self.did.push(Did::End { bad_hello });
                }
            }
        }
    }

    /// The client reads the agent's next reply: a whole frame, else (the agent closed) the
    /// connection's end, else (nothing yet) the client's own timeout at its deadline.
    fn client_reads(&mut self) -> Result<Progress, ClientError> {
        self.flush_client();
        match sonde_wire::decode_frame(&self.to_client) {
            Ok(Some((msg, used))) => {
                self.to_client.drain(..used);
                self.client.handle(Ok(msg), Ok(()))
            }
            Err(e) => self.client.handle(Err(ControlError::Wire(e)), Ok(())),
            Ok(None) if self.closed => self.client.handle(Err(ControlError::Closed), Ok(())),
            Ok(None) => {
                let by = self.client.poll_timeout().expect("a reply is due");
                self.advance_to(by);
                self.client.handle_timeout(self.now)?;
                self.client_reads()
            }
        }
    }

    fn advance(&mut self, by: Duration) {
        self.advance_to(self.now + by);
    }

    fn advance_to(&mut self, to: Instant) {
        self.now = self.now.max(to);
        self.agent.handle_timeout(self.now);
        self.drain_agent();
    }

    fn welcome(&mut self) -> SessionId {
        match self.client_reads() {
            Ok(Progress::Welcomed { session, .. }) => session,
            other => panic!("no welcome: {other:?}"),
        }
    }

    /// Hello, welcome, `Start`: the client's reading of the agent's answer.
    fn start(&mut self, spec: &TestSpec) -> Result<Progress, ClientError> {
        self.welcome();
        self.client.start(self.now, spec, Tuning::default());
        self.client_reads()
    }

    fn refusal(&self) -> (Refusal, &str) {
        match self.sent.last() {
            Some(ControlMsg::Refused { reason, message }) => (*reason, message),
            other => panic!("no refusal sent: {other:?}"),
        }
    }
}

fn refused_for(result: Result<Progress, ClientError>) -> Refusal {
    match result {
        Err(ClientError::Refused { reason, .. }) => reason,
        other => panic!("not refused: {other:?}"),
    }
}

// ---------------------------------------------------------------------------------------------
// The conversation as it should go
// ---------------------------------------------------------------------------------------------

#[test]
fn a_session_is_welcomed_admitted_and_runs_once_its_channels_join() {
    let cfg = config(|_| {});
    let mut pair = Pair::new(&cfg, None);
    let answer = pair.start(&latency());
    assert!(
        matches!(answer, Ok(Progress::Accepted { token, .. }) if token == Token(0x5eed_0001)),
        "{answer:?}"
    );
    assert_eq!(pair.did, [Did::Admitted(SessionId(1)), Did::AwaitJoins]);
    assert_eq!(pair.fake.admitted.len(), 1);
    assert_eq!(pair.fake.admitted[0].0, latency());
    assert!(!pair.agent.is_over());
    pair.agent.joined();
    pair.drain_agent();
    assert_eq!(pair.did[2..], [Did::Run(SessionId(1))]);
    assert!(pair.agent.is_over() && pair.agent.poll_timeout().is_none());
}

#[test]
fn the_welcome_says_nothing_about_the_host_and_numbers_sessions_in_turn() {
    let cfg = config(|c| c.max_streams = 7);
    let mut fake = FakeAgent::new();
    fake.sessions = 41;
    let mut pair = Pair::with(&cfg, None, fake, Ok(()));
    match pair.client_reads() {
        Ok(Progress::Welcomed { session, limits }) => {
            assert_eq!(session, SessionId(42));
            assert_eq!(limits.max_streams, 7);
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(pair.fake.hosts_described, 0);
    assert!(matches!(
        pair.sent[0],
        ControlMsg::Welcome {
            secret_required: false,
            ..
        }
    ));
}

#[test]
fn a_crr_session_runs_at_once_without_waiting_for_joins() {
    let cfg = config(|_| {});
    let mut pair = Pair::new(&cfg, None);
    let crr = spec(TestKind::Crr, Protocol::Tcp, 2, 1_000);
    assert!(matches!(pair.start(&crr), Ok(Progress::Accepted { .. })));
    assert_eq!(
        pair.did,
        [Did::Admitted(SessionId(1)), Did::Run(SessionId(1))]
    );
    assert!(pair.agent.is_over());
}

#[test]
fn the_host_is_described_and_the_connection_half_closed() {
    let cfg = config(|_| {});
    let mut pair = Pair::new(&cfg, None);
    pair.welcome();
    pair.client.describe(pair.now);
    assert!(matches!(
        pair.client_reads(),
        Ok(Progress::Described { host: None })
    ));
    assert_eq!(pair.fake.hosts_described, 1);
    assert_eq!(
        pair.did,
        [Did::ShutdownWrite, Did::End { bad_hello: false }]
    );
}

// ---------------------------------------------------------------------------------------------
// Hello: bad input, versions, silence
// ---------------------------------------------------------------------------------------------

#[test]
fn another_preamble_version_is_refused_before_any_hello() {
    let cfg = config(|_| {});
    let pair = Pair::with(
        &cfg,
        None,
        FakeAgent::new(),
        Err("protocol version 9".into()),
    );
    assert_eq!(
        pair.did,
        [
            Did::Refused(Refusal::Version, false),
            Did::End { bad_hello: false }
        ]
    );
    assert_eq!(
        pair.refusal(),
        (Refusal::Version, "protocol version 9; upgrade one side")
    );
}

#[test]
fn another_hello_version_gets_a_refusal_the_client_can_decode() {
    let cfg = config(|_| {});
    let mut pair = Pair::new(&cfg, None);
    pair.client_sends(&ControlMsg::Hello {
        protocol: PROTOCOL_VERSION + 1,
        software: "sonde 99".into(),
        nonce: Nonce([0; 32]),
    });
    let (reason, message) = pair.refusal();
    assert_eq!(reason, Refusal::Version);
    assert!(message.contains("upgrade one side"), "{message}");
    assert_eq!(pair.did.last(), Some(&Did::End { bad_hello: false }));
    // The client hears the refusal as such.
    pair.client = Handshake::new(pair.now, None, Nonce([1; 32]));
    assert_eq!(refused_for(pair.client_reads()), Refusal::Version);
}

#[test]
fn junk_a_cut_frame_and_a_4_gib_length_are_bad_hellos() {
    let cfg = config(|_| {});
    // Not JSON.
    let mut pair = Pair::new(&cfg, None);
    pair.client_bytes(&[0, 0, 0, 4, b'{', b'x', b'}', b'!']);
    assert_eq!(pair.did, [Did::End { bad_hello: true }]);
    assert!(pair.sent.is_empty());
    // A length far over the frame limit: refused from the header alone.
    let mut pair = Pair::new(&cfg, None);
    pair.client_bytes(&[0xff, 0xff, 0xff, 0xff]);
    assert_eq!(pair.did, [Did::End { bad_hello: true }]);
    // A frame cut short, then the close.
    let mut pair = Pair::new(&cfg, None);
    pair.client_bytes(&[0, 0, 0, 100, b'{']);
    assert!(pair.did.is_empty(), "waits for the rest: {:?}", pair.did);
    pair.agent.handle_lost();
    pair.drain_agent();
    assert_eq!(pair.did, [Did::End { bad_hello: true }]);
}

#[test]
fn a_first_message_other_than_hello_is_a_bad_hello() {
    let cfg = config(|_| {});
    for first in [
        ControlMsg::Start {
            spec: latency(),
            proof: None,
            tuning: Tuning::default(),
            token: None,
        },
        ControlMsg::Ready,
        ControlMsg::Describe { proof: None },
    ] {
        let mut pair = Pair::new(&cfg, None);
        pair.client_sends(&first);
        assert_eq!(pair.did, [Did::End { bad_hello: true }], "{first:?}");
        assert!(pair.sent.is_empty());
        assert_eq!(pair.fake.sessions, 0, "no session number spent");
    }
}

#[test]
fn a_silent_client_is_closed_at_the_hello_timeout_and_not_before() {
    let cfg = config(|_| {});
    let mut pair = Pair::new(&cfg, None);
    assert_eq!(
        pair.agent.poll_timeout(),
        Some(pair.now + cfg.hello_timeout)
    );
    pair.advance(cfg.hello_timeout - Duration::from_millis(1));
    assert!(pair.did.is_empty());
    pair.advance(Duration::from_millis(1));
    assert_eq!(pair.did, [Did::End { bad_hello: true }]);
    assert!(pair.sent.is_empty());
}

#[test]
fn no_entropy_closes_the_connection_without_a_welcome() {
    struct NoEntropy(FakeAgent);
    impl Agent for NoEntropy {
        fn nonce(&mut self) -> Option<Nonce> {
            None
        }
        fn next_session(&mut self) -> SessionId {
            self.0.next_session()
        }
        fn shutting_down(&self) -> bool {
            false
        }
        fn admit(
            &mut self,
            s: &TestSpec,
            k: Option<&SessionKey>,
            t: Option<Token>,
        ) -> Result<Token, NotAdmitted> {
            self.0.admit(s, k, t)
        }
        fn admit_helper(&mut self) -> Result<(), NotAdmitted> {
            self.0.admit_helper()
        }
        fn host(&mut self) -> Option<Box<HostInfo>> {
            self.0.host()
        }
        fn tag(&mut self) -> Option<sonde_wire::AgentTag> {
            self.0.tag()
        }
    }
    let cfg = config(|_| {});
    let now = Instant::now();
    let mut talk = Conversation::new(now, &cfg, PORT, Ok(()));
    let mut client = Handshake::new(now, None, Nonce([3; 32]));
    let hello = client.poll_transmit().expect("a hello");
    talk.handle(now, hello, &mut NoEntropy(FakeAgent::new()));
    assert!(matches!(
        talk.poll(),
        Some(Output::End { bad_hello: false })
    ));
    assert!(talk.poll().is_none());
}

// ---------------------------------------------------------------------------------------------
// After the welcome: silence, early close, messages out of order or twice
// ---------------------------------------------------------------------------------------------

#[test]
fn a_client_that_never_asks_for_a_test_is_closed_at_the_start_timeout() {
    let cfg = config(|_| {});
    let mut pair = Pair::new(&cfg, None);
    pair.welcome();
    // The hello timeout no longer applies: the start timeout does.
    pair.advance(cfg.hello_timeout * 2);
    assert!(pair.did.is_empty());
    pair.advance(START_TIMEOUT - cfg.hello_timeout * 2 - Duration::from_millis(1));
    assert!(pair.did.is_empty());
    pair.advance(Duration::from_millis(1));
    assert_eq!(pair.did, [Did::End { bad_hello: false }]);
    assert_eq!(pair.fake.admitted.len(), 0);
}

#[test]
fn a_client_lost_after_the_welcome_ends_the_conversation_quietly() {
    let cfg = config(|_| {});
    let mut pair = Pair::new(&cfg, None);
    pair.welcome();
    pair.agent.handle_lost();
    pair.drain_agent();
    assert_eq!(pair.did, [Did::End { bad_hello: false }]);
    assert_eq!(pair.sent.len(), 1, "the welcome only: {:?}", pair.sent);
}

#[test]
fn a_second_hello_or_an_unasked_message_after_the_welcome_ends_it() {
    let cfg = config(|_| {});
    for second in [
        ControlMsg::Hello {
            protocol: PROTOCOL_VERSION,
            software: "again".into(),
            nonce: Nonce([4; 32]),
        },
        ControlMsg::Go,
        ControlMsg::Finish,
    ] {
        let mut pair = Pair::new(&cfg, None);
        pair.welcome();
        pair.client_sends(&second);
        assert_eq!(pair.did, [Did::End { bad_hello: false }], "{second:?}");
        assert_eq!(pair.fake.sessions, 1, "one welcome only");
        assert!(pair.fake.admitted.is_empty());
    }
}

#[test]
fn a_duplicate_start_is_left_to_the_test_and_admits_nothing_more() {
    let cfg = config(|_| {});
    let mut pair = Pair::new(&cfg, None);
    assert!(matches!(
        pair.start(&latency()),
        Ok(Progress::Accepted { .. })
    ));
    let sent = pair.sent.len();
    pair.client_sends(&ControlMsg::Start {
        spec: latency(),
        proof: None,
        tuning: Tuning::default(),
        token: None,
    });
    assert_eq!(pair.fake.admitted.len(), 1);
    assert_eq!(pair.sent.len(), sent);
    assert_eq!(pair.did, [Did::Admitted(SessionId(1)), Did::AwaitJoins]);
}

#[test]
fn a_write_that_fails_ends_the_conversation_and_runs_nothing() {
    let cfg = config(|_| {});
    let now = Instant::now();
    let mut talk = Conversation::new(now, &cfg, PORT, Ok(()));
    let mut fake = FakeAgent::new();
    let mut client = Handshake::new(now, None, Nonce([5; 32]));
    talk.handle(now, client.poll_transmit().expect("hello"), &mut fake);
    let Some(Output::Send(welcome)) = talk.poll() else {
        panic!("no welcome")
    };
    assert!(client.handle(Ok(*welcome), Ok(())).is_ok());
    client.start(
        now,
        &spec(TestKind::Crr, Protocol::Tcp, 1, 1_000),
        Tuning::default(),
    );
    talk.handle(now, client.poll_transmit().expect("start"), &mut fake);
    assert!(matches!(talk.poll(), Some(Output::Admitted { .. })));
    // The `Accepted` could not be written: the crr session does not run.
    assert!(
        matches!(talk.poll(), Some(Output::Send(m)) if matches!(*m, ControlMsg::Accepted { .. }))
    );
    talk.handle_write_failed();
    assert!(matches!(
        talk.poll(),
        Some(Output::End { bad_hello: false })
    ));
    assert!(talk.poll().is_none());
}

// ---------------------------------------------------------------------------------------------
// Data channels that never join
// ---------------------------------------------------------------------------------------------

#[test]
fn joins_that_never_come_get_an_error_at_the_join_timeout() {
    let cfg = config(|_| {});
    let mut pair = Pair::new(&cfg, None);
    let udp = spec(TestKind::Throughput, Protocol::Udp, 2, 1_000);
    assert!(matches!(pair.start(&udp), Ok(Progress::Accepted { .. })));
    pair.client.await_ready(pair.now);
    pair.advance(JOIN_TIMEOUT - Duration::from_millis(1));
    assert_eq!(pair.did.last(), Some(&Did::AwaitJoins));
    pair.advance(Duration::from_millis(1));
    assert_eq!(pair.did.last(), Some(&Did::End { bad_hello: false }));
    // The client reads the agent's reason where it waited for `Ready`.
    match pair.client_reads() {
        Err(ClientError::Remote(m)) => {
            assert_eq!(
                m,
                "not every data channel joined within 10s (a firewall on TCP/UDP port 5201?)"
            );
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn a_client_gone_or_a_shutdown_while_joining_gets_the_same_error() {
    let cfg = config(|_| {});
    let mut pair = Pair::new(&cfg, None);
    assert!(matches!(
        pair.start(&latency()),
        Ok(Progress::Accepted { .. })
    ));
    pair.agent.gave_up_joins();
    pair.drain_agent();
    assert!(matches!(
        pair.sent.last(),
        Some(ControlMsg::Error { message }) if message.starts_with("not every data channel")
    ));
    assert_eq!(pair.did.last(), Some(&Did::End { bad_hello: false }));
    // Joins after the end change nothing.
    pair.agent.joined();
    pair.drain_agent();
    assert!(!pair.did.contains(&Did::Run(SessionId(1))));
}

// ---------------------------------------------------------------------------------------------
// Refusals: limits, room, shutdown, mesh links
// ---------------------------------------------------------------------------------------------

#[test]
fn requests_outside_the_limits_are_refused_and_counted_before_the_refusal_is_sent() {
    let cfg = config(|c| {
        c.max_duration = Duration::from_secs(5);
        c.max_streams = 4;
    });
    let cases = [
        (
            spec(TestKind::Latency, Protocol::Tcp, 1, 6_000),
            Refusal::Limits,
        ),
        (
            spec(TestKind::Throughput, Protocol::Tcp, 5, 1_000),
            Refusal::Limits,
        ),
        (
            spec(TestKind::Throughput, Protocol::Tcp, 0, 1_000),
            Refusal::BadRequest,
        ),
        (
            spec(TestKind::Latency, Protocol::Tcp, 2, 1_000),
            Refusal::BadRequest,
        ),
        (
            spec(TestKind::Pps, Protocol::Tcp, 1, 1_000),
            Refusal::BadRequest,
        ),
        (
            spec(TestKind::Latency, Protocol::Tcp, 1, 0),
            Refusal::BadRequest,
        ),
    ];
    for (asked, want) in cases {
        let mut pair = Pair::new(&cfg, None);
        assert_eq!(refused_for(pair.start(&asked)), want, "{asked:?}");
        assert_eq!(
            pair.did,
            [Did::Refused(want, false), Did::End { bad_hello: false }]
        );
        assert!(pair.fake.admitted.is_empty());
    }
}

/// A many-flow latency test is held to `--max-latency-flows`, not `--max-streams`, and its
/// sizes and depth to what its loops carry.
#[test]
#[cfg(target_os = "linux")]
fn many_flow_latency_tests_have_limits_of_their_own() {
    let cfg = config(|c| {
        c.max_streams = 4;
        c.max_latency_flows = 300;
    });
    let rr = |proto, flows, msg, depth, response| {
        let mut s = spec(TestKind::Latency, proto, flows, 1_000);
        s.msg_size = msg;
        s.request_response = Some(sonde_wire::RequestResponse {
            depth,
            response_size: response,
            threads: 0,
        });
        s
    };
    let cases = [
        (rr(Protocol::Tcp, 301, 64, 4, 64), Some(Refusal::Limits)),
        (rr(Protocol::Udp, 2, 4, 1, 64), Some(Refusal::BadRequest)),
        (rr(Protocol::Udp, 2, 64, 1, 4), Some(Refusal::BadRequest)),
        (rr(Protocol::Tcp, 2, 64, 0, 64), Some(Refusal::BadRequest)),
        (
            rr(Protocol::Tcp, 2, 64, sonde_wire::MAX_DEPTH + 1, 64),
            Some(Refusal::BadRequest),
        ),
        (rr(Protocol::Tcp, 300, 64, 4, 1024), None),
    ];
    for (asked, want) in cases {
        let mut pair = Pair::new(&cfg, None);
        match want {
            Some(want) => assert_eq!(refused_for(pair.start(&asked)), want, "{asked:?}"),
            None => {
                let _ = pair.start(&asked);
                assert_eq!(pair.fake.admitted.len(), 1, "{asked:?}: {:?}", pair.did);
            }
        }
    }
    // Throughput keeps its own limit.
    let mut pair = Pair::new(&cfg, None);
    let asked = spec(TestKind::Throughput, Protocol::Tcp, 5, 1_000);
    assert_eq!(refused_for(pair.start(&asked)), Refusal::Limits);
}

#[test]
fn socket_options_the_agents_kernel_refuses_are_refused_naming_the_option() {
    let cfg = config(|_| {});
    let mut fake = FakeAgent::new();
    fake.socket_refused = Some("-C/--congestion: the kernel has no congestion control 'x'".into());
    let mut pair = Pair::with(&cfg, None, fake, Ok(()));
    let mut asked = spec(TestKind::Throughput, Protocol::Tcp, 1, 1_000);
    asked.socket.congestion = Some("x".into());
    assert_eq!(refused_for(pair.start(&asked)), Refusal::BadRequest);
    assert_eq!(
        pair.refusal().1,
        "the agent's kernel refuses -C/--congestion: the kernel has no congestion control 'x'"
    );
    assert!(pair.fake.admitted.is_empty(), "refused before admission");
    // Nothing asked: nothing to refuse.
    let mut fake = FakeAgent::new();
    fake.socket_refused = Some("anything".into());
    let mut pair = Pair::with(&cfg, None, fake, Ok(()));
    let plain = spec(TestKind::Throughput, Protocol::Tcp, 1, 1_000);
    assert!(matches!(pair.start(&plain), Ok(Progress::Accepted { .. })));
}

#[test]
fn a_full_agent_refuses_as_busy_and_a_full_source_as_source_busy() {
    let cfg = config(|c| {
        c.max_sessions = 3;
        c.max_sessions_per_source = 2;
    });
    let mut fake = FakeAgent::new();
    fake.room = 0;
    let mut pair = Pair::with(&cfg, None, fake, Ok(()));
    assert_eq!(refused_for(pair.start(&latency())), Refusal::Busy);
    assert!(pair.refusal().1.contains("maximum of 3 sessions"));
    let mut fake = FakeAgent::new();
    fake.room = 0;
    fake.full = Full::Source;
    let mut pair = Pair::with(&cfg, None, fake, Ok(()));
    assert_eq!(refused_for(pair.start(&latency())), Refusal::SourceBusy);
    assert!(pair.refusal().1.contains("maximum of 2 sessions"));
}

#[test]
fn a_shutting_down_agent_refuses_and_a_busy_link_refuses_throughput_only() {
    let cfg = config(|_| {});
    let mut fake = FakeAgent::new();
    fake.shutting_down = true;
    let mut pair = Pair::with(&cfg, None, fake, Ok(()));
    assert_eq!(refused_for(pair.start(&latency())), Refusal::ShuttingDown);
    let mut fake = FakeAgent::new();
    fake.link_busy = true;
    let mut pair = Pair::with(&cfg, None, fake, Ok(()));
    let tcp = spec(TestKind::Throughput, Protocol::Tcp, 1, 1_000);
    assert_eq!(refused_for(pair.start(&tcp)), Refusal::Busy);
    assert!(pair.refusal().1.contains("one test at a time"));
    let mut fake = FakeAgent::new();
    fake.link_busy = true;
    let mut pair = Pair::with(&cfg, None, fake, Ok(()));
    assert!(matches!(
        pair.start(&latency()),
        Ok(Progress::Accepted { .. })
    ));
}

#[test]
fn a_client_gone_before_admission_ends_without_a_word() {
    let cfg = config(|_| {});
    let mut fake = FakeAgent::new();
    fake.gone = true;
    let mut pair = Pair::with(&cfg, None, fake, Ok(()));
    pair.welcome();
    pair.client.start(pair.now, &latency(), Tuning::default());
    pair.flush_client();
    assert_eq!(pair.did, [Did::End { bad_hello: false }]);
    assert_eq!(pair.sent.len(), 1);
}

// ---------------------------------------------------------------------------------------------
// The shared secret: proofs, replays, descriptions
// ---------------------------------------------------------------------------------------------

#[test]
fn with_a_secret_only_clients_that_prove_it_are_admitted() {
    let cfg = config(|c| c.secret = Some(secret(b"the agent's secret")));
    // No proof.
    let mut pair = Pair::new(&cfg, None);
    assert_eq!(
        refused_for(pair.start(&latency())),
        Refusal::Unauthenticated
    );
    assert_eq!(pair.did[0], Did::Refused(Refusal::Unauthenticated, true));
    assert!(pair.refusal().1.contains("requires a shared secret"));
    // A wrong one.
    let mut pair = Pair::new(&cfg, Some(secret(b"another secret")));
    assert_eq!(
        refused_for(pair.start(&latency())),
        Refusal::Unauthenticated
    );
    assert!(pair.refusal().1.contains("does not match"));
    // The right one: admitted, and both ends hold the same session key.
    let mut pair = Pair::new(&cfg, Some(secret(b"the agent's secret")));
    assert!(matches!(
        pair.start(&latency()),
        Ok(Progress::Accepted { .. })
    ));
    assert!(matches!(
        pair.sent[0],
        ControlMsg::Welcome {
            secret_required: true,
            ..
        }
    ));
    let agent_key = pair.fake.admitted[0].1.clone().expect("a session key");
    let client_key = pair.client.session_key().expect("a session key");
    let join = [7u8; 12];
    assert_eq!(agent_key.join_mac(&join), client_key.join_mac(&join));
}

#[test]
fn an_agent_without_a_secret_admits_clients_with_or_without_one() {
    let cfg = config(|_| {});
    for client_secret in [None, Some(secret(b"a secret the agent does not have"))] {
        let mut pair = Pair::new(&cfg, client_secret);
        assert!(matches!(
            pair.start(&latency()),
            Ok(Progress::Accepted { .. })
        ));
        assert!(pair.fake.admitted[0].1.is_none());
    }
}

#[test]
fn a_replayed_proof_is_refused() {
    let cfg = config(|c| c.secret = Some(secret(b"the agent's secret")));
    // An eavesdropper records a good client's `Start`.
    let mut good = Pair::new(&cfg, Some(secret(b"the agent's secret")));
    good.welcome();
    good.client.start(good.now, &latency(), Tuning::default());
    let recorded = good.client.poll_transmit().expect("a start");
    good.client_sends(&recorded);
    assert_eq!(good.fake.admitted.len(), 1);
    // Replayed on a connection of its own, with the client's nonce copied too: the agent's
    // nonce differs, so the proof does not hold.
    let mut fake = FakeAgent::new();
    fake.nonce = 50;
    let mut replay = Pair::with(&cfg, None, fake, Ok(()));
    replay.welcome();
    replay.client_sends(&recorded);
    assert_eq!(replay.refusal().0, Refusal::Unauthenticated);
    assert_eq!(replay.did[0], Did::Refused(Refusal::Unauthenticated, true));
    assert!(replay.fake.admitted.is_empty());
    // A proof for another request (a description) does not prove a test either.
    let mut other = Pair::new(&cfg, Some(secret(b"the agent's secret")));
    other.welcome();
    other.client.describe(other.now);
    let Some(ControlMsg::Describe { proof }) = other.client.poll_transmit() else {
        panic!("no describe")
    };
    other.client_sends(&ControlMsg::Start {
        spec: latency(),
        proof,
        tuning: Tuning::default(),
        token: None,
    });
    assert_eq!(other.refusal().0, Refusal::Unauthenticated);
}

#[test]
fn the_host_is_described_only_to_an_authenticated_client() {
    let cfg = config(|c| c.secret = Some(secret(b"the agent's secret")));
    let mut pair = Pair::new(&cfg, None);
    pair.welcome();
    pair.client.describe(pair.now);
    assert!(matches!(
        pair.client_reads(),
        Err(ClientError::Refused {
            reason: Refusal::Unauthenticated,
            ..
        })
    ));
    assert_eq!(pair.fake.hosts_described, 0);
    let mut pair = Pair::new(&cfg, Some(secret(b"the agent's secret")));
    pair.welcome();
    pair.client.describe(pair.now);
    assert!(matches!(
        pair.client_reads(),
        Ok(Progress::Described { .. })
    ));
    assert_eq!(pair.fake.hosts_described, 1);
}

// ---------------------------------------------------------------------------------------------
// Helper requests
// ---------------------------------------------------------------------------------------------

struct NoRunner;

impl HelperRunner for NoRunner {
    fn run(
        &self,
        _: &HelperJob,
        _: &mut dyn FnMut() -> Option<Instant>,
        _: &AtomicBool,
    ) -> Result<HelperOutcome, HelperFailure> {
        Err(HelperFailure {
            exit_code: 1,
            message: "not in these tests".into(),
        })
    }
}

fn help(pair: &mut Pair<'_>) -> Result<Progress, ClientError> {
    pair.welcome();
    let test = HelperTest {
        spec: latency(),
        gso: None,
        warmup_ms: 0,
    };
    pair.client.help(pair.now, "198.18.0.9", &test);
    pair.client_reads()
}

#[test]
fn helper_requests_are_refused_unless_the_agent_helps_with_a_secret_the_client_proves() {
    // Not a helper.
    let cfg = config(|c| c.secret = Some(secret(b"s3cret")));
    let mut pair = Pair::new(&cfg, Some(secret(b"s3cret")));
    assert_eq!(refused_for(help(&mut pair)), Refusal::NotHelper);
    // A helper without a secret.
    let cfg = config(|c| c.helper = Some(Helper(Arc::new(NoRunner))));
    let mut pair = Pair::new(&cfg, None);
    assert_eq!(refused_for(help(&mut pair)), Refusal::NotHelper);
    assert!(pair.refusal().1.contains("no shared secret"));
    // A helper with a secret, and a client without it.
    let cfg = config(|c| {
        c.helper = Some(Helper(Arc::new(NoRunner)));
        c.secret = Some(secret(b"s3cret"));
    });
    let mut pair = Pair::new(&cfg, Some(secret(b"not it")));
    assert_eq!(refused_for(help(&mut pair)), Refusal::Unauthenticated);
    assert_eq!(pair.fake.helpers, 0);
    // No room.
    let mut fake = FakeAgent::new();
    fake.room = 0;
    let mut pair = Pair::with(&cfg, Some(secret(b"s3cret")), fake, Ok(()));
    assert_eq!(refused_for(help(&mut pair)), Refusal::Busy);
    // Proved, with room: handed to the helper, which answers later.
    let mut pair = Pair::new(&cfg, Some(secret(b"s3cret")));
    pair.welcome();
    let test = HelperTest {
        spec: latency(),
        gso: None,
        warmup_ms: 0,
    };
    pair.client.help(pair.now, "198.18.0.9", &test);
    pair.flush_client();
    assert_eq!(pair.did, [Did::Help("198.18.0.9".into())]);
    assert_eq!(pair.fake.helpers, 1);
    assert!(pair.agent.is_over());
}

// ---------------------------------------------------------------------------------------------
// The client's side alone
// ---------------------------------------------------------------------------------------------

#[test]
fn a_refusal_waiting_behind_a_failed_write_is_what_the_client_hears() {
    let now = Instant::now();
    let mut client = Handshake::new(now, None, Nonce([6; 32]));
    let _ = client.poll_transmit();
    let refused = ControlMsg::Refused {
        reason: Refusal::Busy,
        message: "full".into(),
    };
    let broken = ControlError::Io(std::io::Error::other("reset"));
    assert!(matches!(
        client.handle(Ok(refused), Err(broken)),
        Err(ClientError::Refused {
            reason: Refusal::Busy,
            ..
        })
    ));
    // Any other reply behind a failed write: the write's error.
    let mut client = Handshake::new(now, None, Nonce([6; 32]));
    let broken = ControlError::Io(std::io::Error::other("reset"));
    assert!(matches!(
        client.handle(Ok(ControlMsg::Ready), Err(broken)),
        Err(ClientError::Control(ControlError::Io(_)))
    ));
}

#[test]
fn the_client_names_what_it_got_where_another_reply_was_due_and_times_out_on_silence() {
    let now = Instant::now();
    let mut client = Handshake::new(now, None, Nonce([6; 32]));
    match client.handle(Ok(ControlMsg::Ready), Ok(())) {
        Err(ClientError::Protocol(m)) => {
            assert_eq!(m, "the agent sent `ready` where a welcome was due");
        }
        other => panic!("{other:?}"),
    }
    let mut client = Handshake::new(now, None, Nonce([6; 32]));
    assert!(client.handle_timeout(now + HANDSHAKE_TIMEOUT / 2).is_ok());
    assert!(matches!(
        client.handle_timeout(now + HANDSHAKE_TIMEOUT),
        Err(ClientError::Control(ControlError::Timeout(_)))
    ));
    let mut client = Handshake::new(now, None, Nonce([6; 32]));
    match client.handle(Err(ControlError::Closed), Ok(())) {
        Err(ClientError::NotAnAgent(m)) => assert!(m.contains("while saying hello"), "{m}"),
        other => panic!("{other:?}"),
    }
}

#[test]
fn an_agent_that_goes_silent_after_the_welcome_times_the_client_out() {
    let cfg = config(|_| {});
    let mut pair = Pair::new(&cfg, None);
    pair.welcome();
    pair.client.describe(pair.now);
    pair.flush_client();
    // Drop what the agent sent: the reply never arrives.
    pair.to_client.clear();
    pair.closed = false;
    assert!(matches!(
        pair.client_reads(),
        Err(ClientError::Control(ControlError::Timeout(_)))
    ));
}

#[test]
fn a_rate_cap_refuses_udp_above_it_or_unlimited_and_admits_below_it() {
    let cfg = config(|c| c.max_bitrate = Some(10_000_000));
    let udp = |bitrate_per_stream| TestSpec {
        bitrate_per_stream,
        ..spec(TestKind::Throughput, Protocol::Udp, 2, 1_000)
    };
    for (asked, refused) in [(0, true), (6_000_000, true), (5_000_000, false)] {
        let mut pair = Pair::new(&cfg, None);
        let answer = pair.start(&udp(asked));
        if refused {
            assert_eq!(refused_for(answer), Refusal::Limits, "{asked} b/s a stream");
            assert!(pair.refusal().1.contains("sonde server --max-bitrate"));
        } else {
            assert!(
                matches!(answer, Ok(Progress::Accepted { .. })),
                "{answer:?}"
            );
        }
    }
}

/// Where the agent has no readiness loop (not Linux), a many-flow latency test is refused as a
/// bad request saying so, whatever its size.
#[test]
#[cfg(not(target_os = "linux"))]
fn many_flow_latency_tests_are_refused_where_there_is_no_readiness_loop() {
    let cfg = config(|_| {});
    let mut s = spec(TestKind::Latency, Protocol::Tcp, 2, 1_000);
    s.request_response = Some(sonde_wire::RequestResponse {
        depth: 2,
        response_size: 64,
        threads: 0,
    });
    let mut pair = Pair::new(&cfg, None);
    assert_eq!(refused_for(pair.start(&s)), Refusal::BadRequest);
}
