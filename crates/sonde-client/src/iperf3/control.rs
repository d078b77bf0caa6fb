//! The client's side of an iperf3 control connection as a state machine without sockets or
//! clocks (sans-IO): it takes the time and the bytes the server sent (or why none came), and
//! says what bytes to send, by when the next must come, and what the server said, in iperf3's
//! order (docs/protocols/iperf3.md): the cookie and `PARAM_EXCHANGE`, the parameters and
//! `CREATE_STREAMS`, `TEST_START` and `TEST_RUNNING`, `TEST_END` and `EXCHANGE_RESULTS`, both
//! results, `DISPLAY_RESULTS` and `IPERF_DONE`, and the server's close; with every way a server
//! can refuse, end or abandon a test worded as sonde prints it. `Control` in the parent module
//! drives it over a `TcpStream` (looking at Ctrl-C every tick); the tests below drive it in
//! memory against a scripted server, time advanced by hand, and the agent's tests against the
//! agent's own iperf3 server conversation (public for them, as [`crate::handshake`] is).

use std::collections::VecDeque;
use std::io;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use sonde_net::control::ControlError;
use sonde_wire::iperf3::{self as wire, Cookie, Params, Results, State};

use crate::ClientError;

#[cfg(test)]
mod tests;

/// A real iperf3 server answers the cookie at once (`PARAM_EXCHANGE`, or `ACCESS_DENIED` when
/// busy): silence this long means something else listens on the port.
pub(super) const GREETING_TIMEOUT: Duration = Duration::from_secs(5);
/// Every later step: `CREATE_STREAMS` after the parameters, `TEST_START` after the last stream,
/// the server's results, `DISPLAY_RESULTS`; and a control write.
pub(super) const STEP_TIMEOUT: Duration = Duration::from_secs(10);
/// After `TEST_END`, the server has this long to ask for results.
pub const RESULTS_TIMEOUT: Duration = Duration::from_secs(10);
/// After `IPERF_DONE`, how long the server may take to close the control connection (it does
/// at once) before this end stops waiting for it.
pub(super) const CLOSE_WAIT: Duration = Duration::from_secs(1);
/// How long the server has to explain a data stream that failed mid-test.
const ACCOUNT_WAIT: Duration = Duration::from_millis(500);
/// How long the text after an unexpected answer to the cookie may take to come.
const ANSWER_TEXT_WAIT: Duration = Duration::from_millis(100);
/// Most bytes of such an answer quoted in a message.
const ANSWER_TEXT_LEN: usize = 48;

/// Why a read of the control connection ended without bytes.
#[derive(Debug)]
pub enum ReadError {
    Timeout,
    Closed,
    Interrupted,
    Io(io::Error),
}

/// Why the conversation failed. Only its opening tells a `Gap` (refused, or closed before any
/// answer: perhaps an iperf3 server between two tests, worth another try) from the rest.
#[derive(Debug)]
pub enum Opening {
    Gap(ClientError),
    Failed(ClientError),
}

impl Opening {
    pub fn error(self) -> ClientError {
        match self {
            Self::Gap(e) | Self::Failed(e) => e,
        }
    }
}

/// What the server said, in the order it may say it.
#[derive(Debug)]
pub enum Heard {
    /// `PARAM_EXCHANGE`: send the parameters ([`Conversation::send_params`]).
    ParamExchange,
    /// `CREATE_STREAMS`: open the streams, then [`Conversation::streams_open`].
    CreateStreams,
    /// `TEST_START` and `TEST_RUNNING`: the test runs; [`Conversation::end_test`] at its end.
    TestRunning,
    /// `EXCHANGE_RESULTS`: send ours ([`Conversation::send_results`]).
    ExchangeResults,
    /// The server's results.
    ServerResults(Box<Results>),
    /// A data stream failed before `TEST_END` and the server gave no account of it within
    /// half a second ([`Conversation::stream_failed`]).
    NoAccount,
    /// The end: `DISPLAY_RESULTS` answered and the server gone (`clean_end`), or the server
    /// closed instead of `DISPLAY_RESULTS` (its results had come: the test is complete).
    Done { clean_end: bool },
}

/// Where a `SERVER_ERROR` came, which words its message.
#[derive(Debug, Clone, Copy)]
enum During {
    Greeting,
    Params,
    Test,
}

#[derive(Debug)]
enum Step {
    /// The cookie is out; one state byte is due.
    Greeting,
    /// An unexpected answer to the cookie; the text that follows it, for the message.
    Describing {
        first: u8,
    },
    /// After `SERVER_ERROR`: its code and errno (the errno may not come).
    ServerError {
        during: During,
        code: Option<i32>,
    },
    /// Waiting for the caller (nothing is read).
    Caller,
    /// The parameters are out; `CREATE_STREAMS` is due.
    Params,
    /// The streams are open; `TEST_START` (then `TEST_RUNNING`) is due.
    Starting {
        started: bool,
    },
    /// The test runs; `EXCHANGE_RESULTS` is due (by a deadline once `TEST_END` is out).
    Running,
    /// A data stream failed mid-test: the server's account (any state byte) may follow.
    Accounting,
    /// Our results are out; the server's are due.
    ServerResults,
    /// `DISPLAY_RESULTS` is due.
    Display,
    /// `IPERF_DONE` is out; the server's close (or anything) ends the wait.
    Closing,
    Over,
}

/// The client's side of one iperf3 control connection (see the module's documentation).
#[derive(Debug)]
pub struct Conversation {
    peer: SocketAddr,
    step: Step,
    deadline: Option<Instant>,
    /// Bytes from the server not yet used.
    inbox: Vec<u8>,
    /// Bytes to send.
    outbox: Vec<u8>,
    /// What the server said (or how the conversation failed), in order.
    heard: VecDeque<Result<Heard, Opening>>,
    /// The server has our parameters: from here on it reads state bytes.
    params_sent: bool,
    /// The cookie could not be written: said only when the server answers as if it had been
    /// (a busy server answers and closes without reading, its answer waiting for us).
    cookie_unwritten: Option<io::Error>,
}

impl Conversation {
    /// A conversation with the iperf3 server at `peer`, connected at `now`: the cookie first.
    pub fn new(now: Instant, peer: SocketAddr, cookie: &Cookie) -> Self {
        Self {
            peer,
            step: Step::Greeting,
            deadline: Some(now + GREETING_TIMEOUT),
            inbox: Vec::new(),
            outbox: cookie.as_bytes().to_vec(),
            heard: VecDeque::new(),
            params_sent: false,
            cookie_unwritten: None,
        }
    }

    /// A conversation past the results, `DISPLAY_RESULTS` due (for tests of what follows).
    #[cfg(test)]
    pub(super) fn awaiting_display(now: Instant, peer: SocketAddr) -> Self {
        Self {
            peer,
            step: Step::Display,
            deadline: Some(now + STEP_TIMEOUT),
            inbox: Vec::new(),
            outbox: Vec::new(),
            heard: VecDeque::new(),
            params_sent: true,
            cookie_unwritten: None,
        }
    }

    /// The bytes to send now (empty when there are none).
    pub fn poll_transmit(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.outbox)
    }

    /// What the server said next, or how the conversation failed.
    pub fn poll(&mut self) -> Option<Result<Heard, Opening>> {
        self.heard.pop_front()
    }

    /// By when the server must say what is due (`None`: nothing is read now, or, while the
    /// test runs before `TEST_END`, no deadline).
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.deadline
    }

    /// Whether the conversation reads the connection now.
    pub fn reading(&self) -> bool {
        !matches!(self.step, Step::Caller | Step::Over)
    }

    /// Whether the server has our parameters (and so understands `CLIENT_TERMINATE`).
    pub fn params_sent(&self) -> bool {
        self.params_sent
    }

    /// Sends the parameters (after [`Heard::ParamExchange`]).
    pub fn send_params(&mut self, now: Instant, params: &Params) {
        self.send_json(&params.to_json());
        self.params_sent = true;
        self.expect(now, Step::Params, STEP_TIMEOUT);
    }

    /// The streams are open (after [`Heard::CreateStreams`]): `TEST_START` is due.
    pub fn streams_open(&mut self, now: Instant) {
        self.expect(now, Step::Starting { started: false }, STEP_TIMEOUT);
    }

    /// The test's duration is over: `TEST_END`, and the server has [`RESULTS_TIMEOUT`] to ask
    /// for the results.
    pub fn end_test(&mut self, now: Instant) {
        if matches!(self.step, Step::Running) && self.deadline.is_none() {
            self.outbox.push(State::TestEnd.byte());
            self.deadline = Some(now + RESULTS_TIMEOUT);
        }
    }

    /// A data stream failed before `TEST_END`: the server's own account of the test, if it
    /// sends one within half a second ([`Heard::NoAccount`] if not).
    pub fn stream_failed(&mut self, now: Instant) {
        self.expect(now, Step::Accounting, ACCOUNT_WAIT);
    }

    /// Sends our results (after [`Heard::ExchangeResults`]): the server's are due.
    pub fn send_results(&mut self, now: Instant, ours: &Results) {
        self.send_json(&ours.to_json());
        self.expect(now, Step::ServerResults, STEP_TIMEOUT);
    }

    /// The caller gives up (Ctrl-C): `CLIENT_TERMINATE` when the server reads state bytes.
    pub fn terminate(&mut self) {
        self.outbox.clear();
        if self.params_sent {
            self.outbox.push(State::ClientTerminate.byte());
        }
        self.over();
    }

    /// Bytes from the server, at `now`.
    pub fn handle_bytes(&mut self, now: Instant, bytes: &[u8]) {
        self.inbox.extend_from_slice(bytes);
        self.advance(now);
    }

    /// A read ended without bytes: the deadline passed, the server closed, Ctrl-C, a socket
    /// error.
    pub fn handle_read_error(&mut self, now: Instant, e: ReadError) {
        match std::mem::replace(&mut self.step, Step::Over) {
            Step::Greeting => {
                let e = match e {
                    ReadError::Timeout => self.not_iperf3(&format!(
                        "it said nothing for {} s after the cookie (an iperf3 server answers at once)",
                        GREETING_TIMEOUT.as_secs()
                    )),
                    ReadError::Closed => {
                        let e = self.not_iperf3(
                            "it closed the connection without answering the cookie (a sonde agent does: for one, leave out iperf3://)",
                        );
                        return self.fail(Opening::Gap(e));
                    }
                    other => read_error(other),
                };
                self.fail(Opening::Failed(e));
            }
            Step::Describing { first } => {
                let answer = describe_answer(first, &[]);
                self.answered(&answer);
            }
            Step::ServerError { during, code } => {
                let text = match code {
                    None => "the iperf3 server reported an error but not which".to_owned(),
                    Some(code) => server_error_text(code, 0),
                };
                self.server_error(during, &text);
            }
            Step::Params => match e {
                // What iperf3 does with parameters it will not run (a rate over its
                // --server-bitrate-limit, JSON it cannot read): close without a word.
                ReadError::Closed => {
                    let e = ClientError::Iperf3Refused(format!(
                        "the iperf3 server at {} closed the connection after reading the test parameters: it refused them without saying why (its own log does; a rate over its --server-bitrate-limit is one cause)",
                        self.peer
                    ));
                    self.fail(Opening::Failed(e));
                }
                e => self.failed_waiting(e, "CREATE_STREAMS"),
            },
            Step::Starting { started } => {
                self.failed_waiting(e, if started { "TestRunning" } else { "TestStart" });
            }
            Step::Running => match e {
                ReadError::Timeout => {
                    self.step = Step::Running;
                    self.handle_timeout(now);
                }
                ReadError::Closed => {
                    let e = ClientError::Remote(format!(
                        "the iperf3 server at {} closed the control connection during the test",
                        self.peer
                    ));
                    self.fail(Opening::Failed(e));
                }
                e => self.failed_waiting(e, "EXCHANGE_RESULTS"),
            },
            Step::Accounting => self.heard.push_back(Ok(Heard::NoAccount)),
            Step::ServerResults => self.failed_waiting(e, "its results"),
            Step::Display => match e {
                ReadError::Closed => self.done(false),
                e => self.failed_waiting(e, "DISPLAY_RESULTS"),
            },
            // Whatever ends the wait for the close ends the conversation well.
            Step::Closing => self.done(true),
            step @ (Step::Caller | Step::Over) => self.step = step,
        }
    }

    /// The time is `now`: past the deadline, what was due did not come.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.deadline.is_none_or(|d| now < d) {
            return;
        }
        if matches!(self.step, Step::Running) {
            self.over();
            let e = ClientError::Remote(format!(
                "the iperf3 server did not ask for results within {} s of the test's end",
                RESULTS_TIMEOUT.as_secs()
            ));
            return self.fail(Opening::Failed(e));
        }
        self.handle_read_error(now, ReadError::Timeout);
    }

    /// A write failed.
    pub fn handle_write_failed(&mut self, e: &io::Error) {
        if matches!(self.step, Step::Greeting) {
            self.cookie_unwritten = Some(io::Error::new(e.kind(), e.to_string()));
            return;
        }
        if !matches!(self.step, Step::Over) {
            self.over();
        }
        self.fail(Opening::Failed(control_io(e)));
    }

    /// Uses what the inbox holds, step by step, until the step needs more.
    fn advance(&mut self, now: Instant) {
        loop {
            let before = self.inbox.len();
            self.step_once(now);
            if self.inbox.len() == before || !self.reading() {
                return;
            }
        }
    }

    fn take_byte(&mut self) -> Option<u8> {
        if self.inbox.is_empty() {
            return None;
        }
        Some(self.inbox.remove(0))
    }

    fn take_bytes<const N: usize>(&mut self) -> Option<[u8; N]> {
        let bytes: [u8; N] = self.inbox.get(..N)?.try_into().ok()?;
        self.inbox.drain(..N);
        Some(bytes)
    }

    fn step_once(&mut self, now: Instant) {
        match self.step {
            Step::Greeting => {
                let Some(b) = self.take_byte() else { return };
                self.over();
                if b == State::ParamExchange.byte() {
                    match self.cookie_unwritten.take() {
                        None => {
                            self.step = Step::Caller;
                            self.heard.push_back(Ok(Heard::ParamExchange));
                        }
                        Some(e) => self.fail(Opening::Failed(control_io(&e))),
                    }
                } else if b == State::AccessDenied.byte() {
                    let e = ClientError::Iperf3Refused(format!(
                        "the iperf3 server at {} is busy running a test; try again later",
                        self.peer
                    ));
                    self.fail(Opening::Failed(e));
                } else if b == State::ServerError.byte() {
                    self.server_error_follows(now, During::Greeting);
                } else if self.inbox.is_empty() {
                    self.expect(now, Step::Describing { first: b }, ANSWER_TEXT_WAIT);
                } else {
                    let text = std::mem::take(&mut self.inbox);
                    let answer = describe_answer(b, &text);
                    self.answered(&answer);
                }
            }
            Step::Describing { first } => {
                if self.inbox.is_empty() {
                    return;
                }
                let text = std::mem::take(&mut self.inbox);
                self.over();
                let answer = describe_answer(first, &text);
                self.answered(&answer);
            }
            Step::ServerError { during, code: None } => {
                let Some(code) = self.take_bytes::<4>() else {
                    return;
                };
                self.step = Step::ServerError {
                    during,
                    code: Some(i32::from_be_bytes(code)),
                };
            }
            Step::ServerError {
                during,
                code: Some(code),
            } => {
                let Some(errno) = self.take_bytes::<4>() else {
                    return;
                };
                self.over();
                self.server_error(during, &server_error_text(code, i32::from_be_bytes(errno)));
            }
            Step::Params => {
                let Some(b) = self.take_byte() else { return };
                self.over();
                let peer = self.peer;
                if b == State::CreateStreams.byte() {
                    self.step = Step::Caller;
                    self.heard.push_back(Ok(Heard::CreateStreams));
                } else if b == State::ServerError.byte() {
                    self.server_error_follows(now, During::Params);
                } else if b == State::AccessDenied.byte() {
                    let e = ClientError::Iperf3Refused(format!(
                        "the iperf3 server at {peer} denied access to the test"
                    ));
                    self.fail(Opening::Failed(e));
                } else {
                    self.fail(Opening::Failed(unexpected(b, "CREATE_STREAMS")));
                }
            }
            Step::Starting { started } => {
                let Some(b) = self.take_byte() else { return };
                let want = if started {
                    State::TestRunning
                } else {
                    State::TestStart
                };
                if b != want.byte() {
                    self.over();
                    return self.mid_test_state(now, b, &format!("{want:?}"));
                }
                if started {
                    // The test runs: no deadline until `TEST_END`.
                    self.step = Step::Running;
                    self.deadline = None;
                    self.heard.push_back(Ok(Heard::TestRunning));
                } else {
                    // One deadline for both bytes (often in one segment).
                    self.step = Step::Starting { started: true };
                }
            }
            Step::Running => {
                let Some(b) = self.take_byte() else { return };
                self.over();
                if b == State::ExchangeResults.byte() {
                    self.step = Step::Caller;
                    self.heard.push_back(Ok(Heard::ExchangeResults));
                } else {
                    self.mid_test_state(now, b, "EXCHANGE_RESULTS");
                }
            }
            Step::ServerResults => {
                let Some(prefix) = self.inbox.get(..4) else {
                    return;
                };
                let prefix = [prefix[0], prefix[1], prefix[2], prefix[3]];
                let len = match wire::json_len(prefix) {
                    Ok(len) => len,
                    Err(e) => {
                        self.over();
                        let e = ClientError::Protocol(format!("the iperf3 server's results: {e}"));
                        return self.fail(Opening::Failed(e));
                    }
                };
                if self.inbox.len() < 4 + len {
                    return;
                }
                let body: Vec<u8> = self.inbox.drain(..4 + len).skip(4).collect();
                self.over();
                match Results::from_json(&body) {
                    Ok(r) => {
                        self.heard.push_back(Ok(Heard::ServerResults(Box::new(r))));
                        self.expect(now, Step::Display, STEP_TIMEOUT);
                    }
                    Err(e) => {
                        let e = ClientError::Protocol(format!("the iperf3 server's results: {e}"));
                        self.fail(Opening::Failed(e));
                    }
                }
            }
            Step::Accounting => {
                let Some(b) = self.take_byte() else { return };
                self.over();
                self.mid_test_state(now, b, "nothing");
            }
            Step::Display => {
                let Some(b) = self.take_byte() else { return };
                self.over();
                if b == State::DisplayResults.byte() {
                    self.outbox.push(State::IperfDone.byte());
                    self.expect(now, Step::Closing, CLOSE_WAIT);
                } else {
                    self.fail(Opening::Failed(unexpected(b, "DISPLAY_RESULTS")));
                }
            }
            Step::Closing => {
                if self.inbox.is_empty() {
                    return;
                }
                self.inbox.clear();
                self.done(true);
            }
            Step::Caller | Step::Over => {}
        }
    }

    /// A state byte other than the one due, mid-test: the server's own end of the test, or
    /// confusion.
    fn mid_test_state(&mut self, now: Instant, b: u8, due: &str) {
        let e = match State::from_byte(b) {
            Some(State::ServerTerminate) => {
                // As iperf3 3.12 does before it closes.
                self.outbox.push(State::IperfDone.byte());
                ClientError::Remote(
                    "the iperf3 server was stopped during the test (SERVER_TERMINATE)".into(),
                )
            }
            Some(State::ServerError) => return self.server_error_follows(now, During::Test),
            Some(State::AccessDenied) => {
                ClientError::Remote("the iperf3 server denied access during the test".into())
            }
            _ => unexpected(b, due),
        };
        self.fail(Opening::Failed(e));
    }

    fn server_error_follows(&mut self, now: Instant, during: During) {
        self.expect(now, Step::ServerError { during, code: None }, STEP_TIMEOUT);
    }

    /// The error a `SERVER_ERROR` ends the conversation with, by where it came.
    fn server_error(&mut self, during: During, text: &str) {
        self.over();
        let e = match during {
            During::Greeting => ClientError::Iperf3Refused(text.to_owned()),
            During::Params => ClientError::Iperf3Refused(format!(
                "the iperf3 server at {} refused the test: {text}",
                self.peer
            )),
            During::Test => {
                ClientError::Remote(format!("the iperf3 server ended the test: {text}"))
            }
        };
        self.fail(Opening::Failed(e));
    }

    fn answered(&mut self, answer: &str) {
        self.over();
        let e = self.not_iperf3(&format!(
            "it answered {answer} where iperf3 asks for the test parameters"
        ));
        self.fail(Opening::Failed(e));
    }

    fn failed_waiting(&mut self, e: ReadError, waiting_for: &str) {
        self.over();
        let e = match e {
            ReadError::Closed => ClientError::Remote(format!(
                "the iperf3 server at {} closed the control connection while sonde waited for {waiting_for}",
                self.peer
            )),
            ReadError::Timeout => ClientError::Remote(format!(
                "the iperf3 server at {} sent no {waiting_for} in time",
                self.peer
            )),
            other => read_error(other),
        };
        self.fail(Opening::Failed(e));
    }

    fn not_iperf3(&self, what: &str) -> ClientError {
        ClientError::NotIperf3(format!("{} is not an iperf3 server: {what}", self.peer))
    }

    fn send_json(&mut self, body: &[u8]) {
        self.outbox.extend_from_slice(&wire::json_prefix(body));
        self.outbox.extend_from_slice(body);
    }

    fn expect(&mut self, now: Instant, step: Step, within: Duration) {
        self.step = step;
        self.deadline = Some(now + within);
        self.advance(now);
    }

    fn done(&mut self, clean_end: bool) {
        self.over();
        self.heard.push_back(Ok(Heard::Done { clean_end }));
    }

    fn fail(&mut self, e: Opening) {
        self.over();
        self.heard.push_back(Err(e));
    }

    fn over(&mut self) {
        self.step = Step::Over;
        self.deadline = None;
    }
}

/// iperf3's wording for a `SERVER_ERROR`: the message for its code, and `strerror(errno)` where
/// iperf3 prints it ("unable to set TCP/SCTP MSS: Invalid argument").
pub(super) fn server_error_text(code: i32, errno: i32) -> String {
    let msg = wire::error_message(code);
    if errno != 0 && wire::error_has_os_errno(code) {
        format!("{msg}: {}", strerror(errno))
    } else {
        msg.to_owned()
    }
}

/// `strerror(errno)` for an errno the server sent: this host's text where errno numbers are
/// POSIX's (std adds " (os error N)", which iperf3 does not print).
#[cfg(unix)]
fn strerror(errno: i32) -> String {
    let os = io::Error::from_raw_os_error(errno).to_string();
    os.split(" (os error").next().unwrap_or(&os).to_owned()
}

/// On Windows an OS error number means a Windows error (22 is "Bad command"), but an iperf3
/// server sends its own errno, nearly always Linux's: glibc's text for the errnos iperf3's
/// socket-option and setup errors carry, else the number.
#[cfg(not(unix))]
fn strerror(errno: i32) -> String {
    let text = match errno {
        1 => "Operation not permitted",
        2 => "No such file or directory",
        12 => "Cannot allocate memory",
        13 => "Permission denied",
        22 => "Invalid argument",
        24 => "Too many open files",
        90 => "Message too long",
        92 => "Protocol not available",
        95 => "Operation not supported",
        98 => "Address already in use",
        99 => "Cannot assign requested address",
        104 => "Connection reset by peer",
        105 => "No buffer space available",
        111 => "Connection refused",
        _ => return format!("errno {errno}"),
    };
    text.to_owned()
}

/// A read error other than a timeout or a close, as the client reports it.
fn read_error(e: ReadError) -> ClientError {
    match e {
        ReadError::Interrupted => ClientError::Interrupted,
        ReadError::Io(e) => control_io(&e),
        ReadError::Timeout => ClientError::Control(ControlError::Timeout(Duration::ZERO)),
        ReadError::Closed => ClientError::Control(ControlError::Closed),
    }
}

/// `first` and the text that followed it, for a message: `0x53 ("SSH-2.0-OpenSSH")`.
fn describe_answer(first: u8, rest: &[u8]) -> String {
    let mut text = Vec::with_capacity(ANSWER_TEXT_LEN);
    text.push(first);
    text.extend(rest.iter().take(ANSWER_TEXT_LEN - 1));
    let line: String = String::from_utf8_lossy(&text)
        .lines()
        .next()
        .unwrap_or_default()
        .chars()
        .filter(|c| !c.is_control())
        .collect();
    if line.len() >= 3 {
        format!("{first:#04x} ({line:?})")
    } else {
        format!("{first:#04x}")
    }
}

pub(super) fn control_io(e: &io::Error) -> ClientError {
    ClientError::Control(ControlError::Io(io::Error::new(e.kind(), e.to_string())))
}

pub(super) fn unexpected(b: u8, due: &str) -> ClientError {
    let name =
        State::from_byte(b).map_or_else(|| "an undefined state".to_owned(), |s| format!("{s:?}"));
    ClientError::Protocol(format!(
        "the iperf3 server sent {name} ({b:#04x}) where {due} was due"
    ))
}
