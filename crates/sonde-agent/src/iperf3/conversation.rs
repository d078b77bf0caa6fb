//! The agent's side of an iperf3 control connection as a state machine without sockets or
//! clocks (sans-IO, like quinn-proto's `Connection` and the agent's own [`crate::conversation`]):
//! it takes the time, the bytes the client sent (or why none came) and what the data side
//! reports, and says what to write, when to wake, what the data side is to do and how the test
//! ended, in iperf3's order (docs/protocols/iperf3.md §5):
//!
//! * `PARAM_EXCHANGE`, then the parameters (a checked length, then the JSON, §2, §6) by the
//!   agent's hello timeout; parameters outside the agent's limits (`check`), values no socket
//!   option takes (`stream_options`), or options the kernel will not set (tried on a socket by
//!   the [`Host`]) are refused with `SERVER_ERROR` (§12, §13).
//! * A UDP test first waits for the listener's UDP attach gate (`ACCESS_DENIED` if another test
//!   holds it too long); then `CREATE_STREAMS` and the streams (§7), which the socket code
//!   attaches and reports ([`Conversation::streams_attached`], [`Conversation::attach_failed`]).
//! * `TEST_START` and `TEST_RUNNING` back to back; the control bytes during the test (§11):
//!   `TEST_END`, or the client's `CLIENT_TERMINATE`, `IPERF_DONE` or close, an unexpected byte,
//!   the agent's shutdown (`SERVER_TERMINATE`) or the failsafe past the planned end; the end of
//!   the omit period on the way.
//! * After `TEST_END` and the data side's results ([`Conversation::results_ready`]):
//!   `EXCHANGE_RESULTS`, the client's results, ours and `DISPLAY_RESULTS`, then `IPERF_DONE` or
//!   the close (§10).
//!
//! `session` in the parent module drives it over the control connection until the test runs,
//! `run::run` from there; the tests below drive it in memory on a virtual clock, against
//! scripted clients and the client's own state machine.

use std::collections::VecDeque;
use std::io;
use std::time::{Duration, Instant};

use sonde_net::control::ControlError;
use sonde_net::socket::DataOptions;
use sonde_wire::iperf3::{
    encode_server_error, errno, json_len, json_prefix, Params, Protocol, Results, State,
};

use super::{Refusal, EINVAL, UDP_GATE_WAIT};
use crate::{AgentConfig, MAX_MSG_SIZE, MAX_UDP_PAYLOAD};

/// How far past `time + omit` a test may run before the agent closes it, like iperf3's
/// failsafe timer (which allows 40 s). A `-n`/`-k` test (time 0) gets no slack: it is cut at
/// the agent's maximum duration (after `omit`), and its client told SERVER_TERMINATE.
pub(super) const FAILSAFE_SLACK: Duration = Duration::from_secs(30);
/// How long the client has for its results, and for IPERF_DONE after DISPLAY_RESULTS.
pub(super) const RESULTS_TIMEOUT: Duration = Duration::from_secs(10);
/// After SERVER_TERMINATE, how long the agent waits for the client to hang up before it
/// closes the data sockets anyway.
pub(super) const TERMINATE_GRACE: Duration = Duration::from_secs(2);
/// iperf3's smallest UDP datagram (`MIN_UDP_BLOCKSIZE`: a header with a 64-bit sequence).
const MIN_UDP_LEN: i64 = 16;
/// Bytes read at a time while the agent waits for the client to hang up (and drops them).
const HANG_UP_READ: usize = 64;

/// What the conversation asks of the agent around it, at once.
pub(super) trait Host {
    /// Whether the agent is shutting down.
    fn shutting_down(&self) -> bool;
    /// Tries the options on a socket like the streams' (as iperf3's server sets them on its
    /// data listener when it reads the parameters).
    ///
    /// # Errors
    /// The refusal for an option the kernel will not set.
    fn try_options(&mut self, p: &Params, opts: &DataOptions) -> Result<(), Refusal>;
}

/// What the conversation decided, in the order it decided it.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Output {
    /// Write these bytes on the control connection.
    Send(Vec<u8>),
    /// Answer `ACCESS_DENIED`, as a busy iperf3 server does (the test is over).
    Deny,
    /// The parameters never came whole and valid: count a bad hello.
    BadHello,
    /// A refusal (its `SERVER_ERROR` follows): count it.
    Refused,
    /// A UDP test: wait for the listener's UDP attach gate, then
    /// [`Conversation::gate_entered`] or [`Conversation::gate_busy`].
    EnterGate,
    /// A TCP test: take the data connections that carry its cookie (before `CREATE_STREAMS`
    /// goes out, so that none is refused).
    OpenStreams,
    /// Wait for the data streams, set the client's options on them, and say how it went
    /// ([`Conversation::streams_attached`], [`Conversation::attach_failed`],
    /// [`Conversation::refuse`]).
    AwaitStreams,
    /// The test runs from `start` (its `TEST_START` and `TEST_RUNNING` follow): start the data
    /// streams.
    Run(Plan),
    /// The omit period is over: the counts start here (a snapshot of the counters), or, for a
    /// test without one (`from_zero`), at zero.
    EndOmit { from_zero: bool },
    /// The running phase ended at `at`: stop the data streams (first letting the receivers
    /// drain what is in flight, after `TEST_END`), then [`Conversation::results_ready`] after
    /// `TEST_END` or [`Conversation::streams_stopped`].
    StopStreams { drain: bool, at: Instant },
    /// The conversation is over.
    End(Ended),
}

/// The test's clock as the data side needs it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Plan {
    /// When the test started (the origin of its clock).
    pub(super) start: Instant,
    /// The omit period, from `start`.
    pub(super) omit: Duration,
    /// When the agent gives up on the test, from `start` (senders stop themselves there).
    pub(super) failsafe: Duration,
}

/// How the conversation ended, for the log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Ended {
    /// Before the test ran: `ended: {why}`.
    Setup(String),
    /// The test ended before its results: `{what}: ended: {why}`, with the data streams'
    /// failures.
    Test(String),
    /// The results exchange failed: `{what}: ended: {why}`.
    Exchange(String),
    /// The results were exchanged: `{what}: {summary}`, with the data streams' failures.
    Completed,
}

/// How the running phase ended (docs/protocols/iperf3.md §11).
#[derive(Debug)]
enum Finish {
    TestEnd,
    ClientTerminate,
    IperfDone,
    Closed,
    Failsafe,
    Shutdown,
    Unexpected(u8),
    Failed(io::Error),
}

#[derive(Debug)]
enum Step {
    /// `PARAM_EXCHANGE` is out: the parameters are due by the deadline.
    Params,
    /// Waiting for the UDP attach gate (the socket code's wait).
    Gate,
    /// `CREATE_STREAMS` is out: the socket code attaches the streams.
    Attaching,
    /// The test runs: control bytes, one at a time, until it ends.
    Running {
        omit_end: Option<Instant>,
        failsafe: Instant,
    },
    /// The data streams stop.
    Stopping(Finish),
    /// `EXCHANGE_RESULTS` is out: the client's results are due by the deadline.
    ClientResults,
    /// Ours and `DISPLAY_RESULTS` are out: `IPERF_DONE` (or the close) is due.
    Done,
    /// `SERVER_TERMINATE` is out: what the client sends is dropped until it hangs up, or the
    /// deadline; then the test ends with `why`.
    HangUp(String),
    Over,
}

/// The agent's side of one iperf3 control connection (see the module's documentation).
#[derive(Debug)]
pub(super) struct Conversation<'a> {
    cfg: &'a AgentConfig,
    step: Step,
    deadline: Option<Instant>,
    /// When the current wait for bytes began (the step's start, or the last bytes): a read
    /// that times out waited from here.
    since: Instant,
    /// Bytes from the client not yet used.
    inbox: Vec<u8>,
    out: VecDeque<Output>,
    params: Option<Params>,
    options: DataOptions,
    /// Our results, once the data side has them.
    ours: Vec<u8>,
}

impl<'a> Conversation<'a> {
    /// A conversation on an admitted control connection at `now`: `PARAM_EXCHANGE` first.
    pub(super) fn new(now: Instant, cfg: &'a AgentConfig) -> Self {
        let mut c = Self {
            cfg,
            step: Step::Params,
            deadline: Some(now + cfg.hello_timeout),
            since: now,
            inbox: Vec::new(),
            out: VecDeque::new(),
            params: None,
            options: DataOptions::default(),
            ours: Vec::new(),
        };
        c.send(vec![State::ParamExchange.byte()]);
        c
    }

    /// The next thing to do; `None` until the machine hears more.
    pub(super) fn poll(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// When the machine wants [`Conversation::handle_timeout`] at the latest, if it waits.
    pub(super) fn poll_timeout(&self) -> Option<Instant> {
        match self.step {
            Step::Running { omit_end, failsafe } => {
                Some(omit_end.map_or(failsafe, |o| o.min(failsafe)))
            }
            _ => self.deadline,
        }
    }

    /// How many bytes to read from the control connection now (0: none). A read takes no
    /// more than the step needs, so what the client sent for a later step stays in the socket
    /// as it did when the agent read each message whole.
    pub(super) fn wants(&self) -> usize {
        match self.step {
            Step::Params | Step::ClientResults => match self.json_len() {
                None => 4 - self.inbox.len().min(4),
                Some(Ok(len)) => (4 + len).saturating_sub(self.inbox.len()),
                Some(Err(_)) => 0,
            },
            Step::Running { .. } | Step::Done => 1,
            Step::HangUp(_) => HANG_UP_READ,
            Step::Gate | Step::Attaching | Step::Stopping(_) | Step::Over => 0,
        }
    }

    /// The parameters, once read.
    pub(super) fn params(&self) -> Option<&Params> {
        self.params.as_ref()
    }

    /// The socket options the client asked for (once the parameters are read).
    pub(super) fn options(&self) -> &DataOptions {
        &self.options
    }

    /// Whether the conversation is over (drain [`Conversation::poll`]).
    #[cfg(test)]
    pub(super) fn is_over(&self) -> bool {
        matches!(self.step, Step::Over)
    }

    /// The time is `now`: the agent's shutdown, the failsafe and the end of omit while the
    /// test runs; past the deadline, what was due did not come.
    pub(super) fn handle_timeout(&mut self, now: Instant, host: &dyn Host) {
        if let Step::Running { omit_end, failsafe } = self.step {
            if host.shutting_down() {
                return self.finish(Finish::Shutdown, now);
            }
            if now >= failsafe {
                return self.finish(Finish::Failsafe, now);
            }
            if omit_end.is_some_and(|o| now >= o) {
                self.step = Step::Running {
                    omit_end: None,
                    failsafe,
                };
                self.out.push_back(Output::EndOmit { from_zero: false });
            }
            return;
        }
        if self.deadline.is_some_and(|d| now >= d) {
            let waited = self.deadline.map_or(Duration::ZERO, |d| d - self.since);
            self.lost(&ControlError::Timeout(waited), host);
        }
    }

    /// Bytes from the client, at `now`.
    pub(super) fn handle_bytes(&mut self, now: Instant, bytes: &[u8], host: &mut dyn Host) {
        self.inbox.extend_from_slice(bytes);
        self.since = now;
        loop {
            let before = self.inbox.len();
            self.step_once(now, host);
            if self.inbox.len() == before || self.wants() == 0 {
                return;
            }
        }
    }

    /// The client closed the control connection.
    pub(super) fn handle_closed(&mut self, now: Instant, host: &dyn Host) {
        if matches!(self.step, Step::Running { .. }) {
            return self.finish(Finish::Closed, now);
        }
        self.lost(&ControlError::Closed, host);
    }

    /// A read failed (not a timeout: the time goes to [`Conversation::handle_timeout`]).
    pub(super) fn handle_read_error(&mut self, now: Instant, e: io::Error, host: &dyn Host) {
        if matches!(self.step, Step::Running { .. }) {
            return self.finish(Finish::Failed(e), now);
        }
        self.lost(&ControlError::Io(e), host);
    }

    /// A write failed: the conversation ends (unless the bytes were its last words).
    pub(super) fn handle_write_failed(&mut self, now: Instant, e: &io::Error, host: &dyn Host) {
        let why = format!("control connection lost: {e}");
        if !matches!(self.step, Step::Over) {
            // What followed those bytes depended on them.
            self.out.clear();
        }
        match std::mem::replace(&mut self.step, Step::Over) {
            Step::Params | Step::Gate | Step::Attaching => self.setup_failed(why, host),
            // Only TEST_START and TEST_RUNNING are written here, before any stream runs.
            Step::Running { .. } => {
                self.finish(Finish::Failed(io::Error::new(e.kind(), e.to_string())), now);
            }
            Step::Stopping(_) => self.end(Ended::Test(why)),
            Step::ClientResults | Step::Done => self.end(Ended::Exchange(why)),
            // SERVER_TERMINATE did not go out: no hang-up to wait for.
            Step::HangUp(why) => self.end(Ended::Test(why)),
            Step::Over => {}
        }
    }

    /// The UDP attach gate is this test's: `CREATE_STREAMS`, and the streams.
    pub(super) fn gate_entered(&mut self) {
        if matches!(self.step, Step::Gate) {
            self.step = Step::Attaching;
            self.send(vec![State::CreateStreams.byte()]);
            self.out.push_back(Output::AwaitStreams);
        }
    }

    /// Another test kept the UDP attach gate (or the client went away meanwhile).
    pub(super) fn gate_busy(&mut self, host: &dyn Host) {
        if matches!(self.step, Step::Gate) {
            self.step = Step::Over;
            self.out.push_back(Output::Deny);
            self.setup_failed(
                format!("another test kept the UDP stream attach busy for {UDP_GATE_WAIT:?}"),
                host,
            );
        }
    }

    /// The streams did not all attach: `why`.
    pub(super) fn attach_failed(&mut self, why: String, host: &dyn Host) {
        if matches!(self.step, Step::Attaching) {
            self.step = Step::Over;
            self.setup_failed(why, host);
        }
    }

    /// Refuses the test with `SERVER_ERROR` (parameters, or options the kernel would not set
    /// on the attached streams).
    pub(super) fn refuse(&mut self, (code, os_errno, why): Refusal, host: &dyn Host) {
        if matches!(self.step, Step::Over) {
            return;
        }
        self.step = Step::Over;
        self.out.push_back(Output::Refused);
        self.send(encode_server_error(code, os_errno).to_vec());
        self.setup_failed(format!("refused: {why}"), host);
    }

    /// Every stream attached at `now`, with the client's options: the test runs.
    pub(super) fn streams_attached(&mut self, now: Instant) {
        let Some(p) = self
            .params
            .as_ref()
            .filter(|_| matches!(self.step, Step::Attaching))
        else {
            return;
        };
        let secs = |s: i64| Duration::from_secs(u64::try_from(s).unwrap_or(0));
        let omit = secs(p.omit);
        let planned = if p.time > 0 {
            secs(p.time)
        } else {
            self.cfg.max_duration
        };
        let slack = if p.time > 0 {
            FAILSAFE_SLACK
        } else {
            Duration::ZERO
        };
        let failsafe = planned.saturating_add(omit).saturating_add(slack);
        self.out.push_back(Output::Run(Plan {
            start: now,
            omit,
            failsafe,
        }));
        // Back to back, as iperf3 sends them; data may flow from here on.
        self.send(vec![State::TestStart.byte(), State::TestRunning.byte()]);
        let omit_end = if omit.is_zero() {
            self.out.push_back(Output::EndOmit { from_zero: true });
            None
        } else {
            Some(later(now, omit))
        };
        self.step = Step::Running {
            omit_end,
            failsafe: later(now, failsafe),
        };
        self.deadline = None;
        self.since = now;
    }

    /// The data streams stopped after `TEST_END`, with `ours`: `EXCHANGE_RESULTS`, and the
    /// client's results are due.
    pub(super) fn results_ready(&mut self, now: Instant, ours: &Results) {
        if matches!(self.step, Step::Stopping(Finish::TestEnd)) {
            self.ours = ours.to_json();
            self.send(vec![State::ExchangeResults.byte()]);
            self.expect(now, Step::ClientResults, RESULTS_TIMEOUT);
        }
    }

    /// The data streams stopped after any other end: the test ends, the client first told
    /// `SERVER_TERMINATE` when the agent ended it (shutdown, or a `-n`/`-k` test at the
    /// maximum duration).
    pub(super) fn streams_stopped(&mut self, now: Instant) {
        let Step::Stopping(finish) = std::mem::replace(&mut self.step, Step::Over) else {
            return;
        };
        let budget_test = self.params.as_ref().is_none_or(|p| p.time <= 0);
        let (why, terminate) = match finish {
            Finish::TestEnd => {
                // Results are what follows TEST_END: without them, nothing to exchange.
                ("the test ended without results".to_owned(), false)
            }
            Finish::ClientTerminate => ("the client terminated the test".to_owned(), false),
            Finish::IperfDone => (
                "the client ended the test before its results".to_owned(),
                false,
            ),
            Finish::Closed => (
                "the client closed the control connection".to_owned(),
                false,
            ),
            Finish::Failsafe if budget_test => (
                format!(
                    "a -n/-k test cut at the agent's maximum duration, {:.0} s (sonde server --max-duration)",
                    self.cfg.max_duration.as_secs_f64()
                ),
                // What the client prints: "the server has terminated".
                true,
            ),
            Finish::Failsafe => (
                format!("no TEST_END {FAILSAFE_SLACK:?} after the planned end (failsafe)"),
                false,
            ),
            // The data sockets stay open until the client has read SERVER_TERMINATE and hung
            // up: closed with its unread data they would reset, and a client that hits the
            // reset on a stream first reports that instead of the agent's shutdown.
            Finish::Shutdown => ("the agent is shutting down".to_owned(), true),
            Finish::Unexpected(b) => (format!("unexpected control byte {b:#04x}"), false),
            Finish::Failed(e) => (format!("control connection lost: {e}"), false),
        };
        if terminate {
            self.send(vec![State::ServerTerminate.byte()]);
            self.expect(now, Step::HangUp(why), TERMINATE_GRACE);
        } else {
            self.end(Ended::Test(why));
        }
    }

    /// Uses what the inbox holds for the current step.
    fn step_once(&mut self, now: Instant, host: &mut dyn Host) {
        match self.step {
            Step::Params => match self.take_json() {
                None => {}
                Some(Err(e)) => self.bad_params(format!("bad parameters: {e}"), host),
                Some(Ok(body)) => match Params::from_json(&body) {
                    Ok(p) => self.on_params(p, host),
                    Err(e) => self.bad_params(format!("bad parameters: {e}"), host),
                },
            },
            Step::Running { .. } => {
                let Some(b) = self.take_byte() else { return };
                match State::from_byte(b) {
                    Some(State::TestEnd) => self.finish(Finish::TestEnd, now),
                    // The real server ignores it too.
                    Some(State::TestStart) => {}
                    Some(State::ClientTerminate) => self.finish(Finish::ClientTerminate, now),
                    Some(State::IperfDone) => self.finish(Finish::IperfDone, now),
                    _ => self.finish(Finish::Unexpected(b), now),
                }
            }
            Step::ClientResults => match self.take_json() {
                None => {}
                Some(Err(e)) => self.exchange_failed(format!("bad results from the client: {e}")),
                Some(Ok(body)) => match Results::from_json(&body) {
                    Err(e) => self.exchange_failed(format!("bad results from the client: {e}")),
                    Ok(_) => {
                        let ours = std::mem::take(&mut self.ours);
                        let mut msg = Vec::with_capacity(ours.len() + 5);
                        msg.extend_from_slice(&json_prefix(&ours));
                        msg.extend_from_slice(&ours);
                        msg.push(State::DisplayResults.byte());
                        self.send(msg);
                        self.expect(now, Step::Done, RESULTS_TIMEOUT);
                    }
                },
            },
            Step::Done => {
                let Some(b) = self.take_byte() else { return };
                if b == State::IperfDone.byte() {
                    self.end(Ended::Completed);
                } else {
                    self.exchange_failed(format!(
                        "unexpected control byte {b:#04x} after the results"
                    ));
                }
            }
            // Whatever the client says after SERVER_TERMINATE is dropped.
            Step::HangUp(_) => self.inbox.clear(),
            Step::Gate | Step::Attaching | Step::Stopping(_) | Step::Over => {}
        }
    }

    /// Checks the parameters against the agent's limits and the kernel; then the streams.
    fn on_params(&mut self, p: Params, host: &mut dyn Host) {
        // Like iperf3's server, which sets the client's socket options up when it reads the
        // parameters, refuse what the kernel will not do before any stream opens.
        let opts = check(&p, self.cfg)
            .and_then(|()| stream_options(&p))
            .and_then(|opts| host.try_options(&p, &opts).map(|()| opts));
        let udp = p.udp();
        self.params = Some(p);
        self.deadline = None;
        match opts {
            Err(refusal) => self.refuse(refusal, host),
            Ok(opts) => {
                self.options = opts;
                if udp {
                    // UDP streams carry no cookie: one test at a time attaches them (§7.2).
                    self.step = Step::Gate;
                    self.out.push_back(Output::EnterGate);
                } else {
                    self.step = Step::Attaching;
                    self.out.push_back(Output::OpenStreams);
                    self.send(vec![State::CreateStreams.byte()]);
                    self.out.push_back(Output::AwaitStreams);
                }
            }
        }
    }

    fn bad_params(&mut self, why: String, host: &dyn Host) {
        self.step = Step::Over;
        self.out.push_back(Output::BadHello);
        self.setup_failed(why, host);
    }

    /// A read ended without what was due: `e` (closed, timed out, failed).
    fn lost(&mut self, e: &ControlError, host: &dyn Host) {
        let announced = self.json_len().and_then(Result::ok);
        match std::mem::replace(&mut self.step, Step::Over) {
            Step::Params => {
                let why = match announced {
                    None => format!("no parameters from the client: {e}"),
                    Some(len) => format!("truncated parameters ({len} bytes announced): {e}"),
                };
                self.bad_params(why, host);
            }
            Step::ClientResults => self.exchange_failed(match announced {
                None => format!("no results from the client: {e}"),
                Some(_) => format!("truncated results from the client: {e}"),
            }),
            // The client closed (or the wait ended) after our results: the test is complete.
            Step::Done => self.end(Ended::Completed),
            Step::HangUp(why) => self.end(Ended::Test(why)),
            // Nothing is read while the socket code waits; the running phase ends through
            // `finish`.
            step @ (Step::Running { .. }
            | Step::Gate
            | Step::Attaching
            | Step::Stopping(_)
            | Step::Over) => self.step = step,
        }
    }

    /// The running phase ended at `now`.
    fn finish(&mut self, finish: Finish, now: Instant) {
        let drain = matches!(finish, Finish::TestEnd);
        self.step = Step::Stopping(finish);
        self.deadline = None;
        self.out.push_back(Output::StopStreams { drain, at: now });
    }

    /// The setup ended without a test. Stopped while the client was still setting up: it is
    /// waiting on the control connection, and SERVER_TERMINATE is what it prints as the
    /// agent's shutdown.
    fn setup_failed(&mut self, why: String, host: &dyn Host) {
        if host.shutting_down() {
            self.send(vec![State::ServerTerminate.byte()]);
            self.end(Ended::Setup("the agent is shutting down".to_owned()));
        } else {
            self.end(Ended::Setup(why));
        }
    }

    fn exchange_failed(&mut self, why: String) {
        self.end(Ended::Exchange(why));
    }

    /// The parameters' or results' length, once its prefix is in (`Err` if it is no length).
    fn json_len(&self) -> Option<Result<usize, sonde_wire::iperf3::Error>> {
        let prefix: [u8; 4] = self.inbox.get(..4)?.try_into().ok()?;
        Some(json_len(prefix))
    }

    /// A length-prefixed JSON body, once whole (`Err` if its length is no length).
    fn take_json(&mut self) -> Option<Result<Vec<u8>, sonde_wire::iperf3::Error>> {
        match self.json_len()? {
            Err(e) => Some(Err(e)),
            Ok(len) if self.inbox.len() >= 4 + len => {
                Some(Ok(self.inbox.drain(..4 + len).skip(4).collect()))
            }
            Ok(_) => None,
        }
    }

    fn take_byte(&mut self) -> Option<u8> {
        if self.inbox.is_empty() {
            return None;
        }
        Some(self.inbox.remove(0))
    }

    fn send(&mut self, bytes: Vec<u8>) {
        self.out.push_back(Output::Send(bytes));
    }

    fn expect(&mut self, now: Instant, step: Step, within: Duration) {
        self.step = step;
        self.deadline = Some(now + within);
        self.since = now;
    }

    fn end(&mut self, ended: Ended) {
        self.step = Step::Over;
        self.deadline = None;
        self.out.push_back(Output::End(ended));
    }
}

/// Checks parameters against the agent's limits: `Err((i_errno, errno, why))` to refuse with
/// SERVER_ERROR. The codes are the ones whose message the iperf3 client prints sensibly (the
/// maxima it prints are its own, so the log line says the agent's).
fn check(p: &Params, cfg: &AgentConfig) -> Result<(), Refusal> {
    if p.protocol == Protocol::Sctp {
        return Err((errno::IENOSCTP, 0, "SCTP is not served".into()));
    }
    if p.reverse && p.bidirectional {
        return Err((
            errno::IEREVERSEBIDIR,
            0,
            "reverse and bidirectional together".into(),
        ));
    }
    if p.parallel < 1 || p.omit < 0 || p.time < 0 || p.bandwidth < 0 || p.len < 1 {
        return Err((
            errno::IEINITTEST,
            EINVAL,
            format!(
                "nonsense parameters (parallel {}, omit {}, time {}, bandwidth {}, len {})",
                p.parallel, p.omit, p.time, p.bandwidth, p.len
            ),
        ));
    }
    if p.parallel > i64::from(cfg.max_streams) {
        return Err((
            errno::IENUMSTREAMS,
            0,
            format!(
                "{} streams asked, this agent allows {} (sonde server --max-streams)",
                p.parallel, cfg.max_streams
            ),
        ));
    }
    let max_s = cfg.max_duration.as_secs();
    let asked = u64::try_from(p.time.saturating_add(p.omit)).unwrap_or(u64::MAX);
    if asked > max_s {
        return Err((
            errno::IEDURATION,
            0,
            format!("{asked} s asked (time + omit), this agent allows {max_s} s (sonde server --max-duration)"),
        ));
    }
    let server_sends = p.bidirectional || p.reverse;
    if cfg.max_bitrate.is_some()
        && !p.udp()
        && server_sends
        && !sonde_net::socket::KERNEL_TCP_PACING
    {
        // The kernel paces the agent's TCP senders to the cap; without that they would run
        // above it.
        return Err((
            errno::IETOTALRATE,
            0,
            "this agent caps its rate (sonde server --max-bitrate) but its platform cannot \
             pace the TCP it would send (no SO_MAX_PACING_RATE)"
                .to_owned(),
        ));
    }
    if let Some(cap) = cfg.max_bitrate.filter(|_| p.udp()) {
        // iperf3's -b is per stream; 0 is unlimited, above any cap.
        let asked = u64::try_from(p.bandwidth.saturating_mul(p.parallel)).unwrap_or(u64::MAX);
        if p.bandwidth == 0 || asked > cap {
            return Err((
                errno::IETOTALRATE,
                0,
                format!(
                    "UDP at {} bit/s asked, this agent allows {cap} bit/s (sonde server --max-bitrate)",
                    if p.bandwidth == 0 { "unlimited".to_owned() } else { asked.to_string() }
                ),
            ));
        }
    }
    if p.udp() {
        if !(MIN_UDP_LEN..=i64::from(MAX_UDP_PAYLOAD)).contains(&p.len) {
            return Err((
                errno::IEUDPBLOCKSIZE,
                0,
                format!(
                    "UDP datagram size {} is outside {MIN_UDP_LEN}..={MAX_UDP_PAYLOAD}",
                    p.len
                ),
            ));
        }
    } else if p.len > i64::from(MAX_MSG_SIZE) {
        return Err((
            errno::IEBLOCKSIZE,
            0,
            format!("block size {} is above {MAX_MSG_SIZE}", p.len),
        ));
    }
    Ok(())
}

/// The socket options the client asked its server to use on the data streams (`-w`, `-M`,
/// `-C`, `-N`, `-S`, `--fq-rate`, `--dont-fragment`), which the agent honours on its end of every stream rather than
/// measure with defaults the client did not ask for. The pacing rate is for the streams the
/// agent sends on (see [`super::apply_options`]). Values no real client sends are refused with the
/// code iperf3's server would get from the kernel for them.
fn stream_options(p: &Params) -> Result<DataOptions, Refusal> {
    let buffer_bytes = match p.window {
        0 => None,
        w => Some(
            u32::try_from(w)
                .ok()
                .filter(|&w| i32::try_from(w).is_ok())
                .ok_or_else(|| {
                    (
                        errno::IESETBUF,
                        EINVAL,
                        format!("window {w} B is no socket buffer size"),
                    )
                })?,
        ),
    };
    let mss = match p.mss {
        0 => None,
        m => Some(
            u32::try_from(m)
                .map_err(|_| (errno::IESETMSS, EINVAL, format!("MSS {m} is negative")))?,
        ),
    };
    let tos = match p.tos {
        0 => None,
        t => Some(
            u8::try_from(t)
                .map_err(|_| (errno::IEBADTOS, 0, format!("TOS {t} is outside 0..=255")))?,
        ),
    };
    // bits to bytes per second, truncated as iperf3 does (a rate below 8 bit/s is no rate).
    let max_pacing_rate_bytes_per_second = match p.fqrate {
        r if r < 0 => {
            return Err((
                errno::IEINITTEST,
                EINVAL,
                format!("--fq-rate {r} is negative"),
            ))
        }
        r => u64::try_from(r / 8).ok().filter(|&r| r > 0),
    };
    Ok(DataOptions {
        buffer_bytes,
        mss,
        congestion: p.congestion.clone(),
        tos,
        max_pacing_rate_bytes_per_second,
        // `-N` on the agent's end too (it sends with `-R` and `--bidir`), and `--dont-fragment`
        // on the agent's UDP sends.
        nodelay: p.nodelay,
        dont_fragment: p.dont_fragment != 0,
        // iperf3's `zerocopy` (-Z) asks its own sender for sendfile; this server's senders
        // write as they do without it.
        zerocopy: false,
    })
}

/// `now + d`, or as far as the clock goes.
fn later(now: Instant, d: Duration) -> Instant {
    now.checked_add(d)
        .or_else(|| now.checked_add(Duration::from_secs(u64::from(u32::MAX))))
        .unwrap_or(now)
}

#[cfg(test)]
mod tests;
