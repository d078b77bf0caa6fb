//! The agent's side of a control conversation, from the control preamble to the test, as a state
//! machine without sockets or clocks (sans-IO, like quinn-proto's `Connection` and
//! [`crate::link`]): it takes the time and the decoded control messages, and says what to send,
//! what to count and report, and when to wake. `session::run` drives it over a `TcpStream`; the
//! tests below drive it in memory, on a virtual clock, against the client's own state machine
//! (`sonde_client::handshake`).
//!
//! The conversation: the preamble's version; `Hello` (by the hello timeout); `Welcome`; then,
//! by [`START_TIMEOUT`], one request: `Start` (the proof of the shared secret when the agent has
//! one, the agent not shutting down, the test within the limits, room for the session, the link
//! free in a mesh: `Accepted`, else `Refused`), `Describe` (`Description` to an authenticated
//! client), or `Help` (a helper request, checked the same way and then served by
//! `helper::serve`). An admitted session's data channels must all join by [`JOIN_TIMEOUT`]
//! (`Error` otherwise); then the test runs (`session::Test`), outside this machine.
//!
//! What the machine needs from the agent around it (nonces, session numbers, admission, the
//! host's configuration) it asks of an [`Agent`]; what it decides comes out of
//! [`Conversation::poll`] in order, so a refusal is counted before it is sent, as the tests
//! over sockets expect.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use sonde_wire::auth::{Nonce, Proof, Request, SessionKey};
use sonde_wire::{
    AgentTag, ControlMsg, HelperTest, HostInfo, Refusal, SessionId, TestKind, TestSpec, Token,
    Tuning, PROTOCOL_VERSION,
};

use crate::admission::Full;
use crate::{validate, AgentConfig};

/// How long a client has after the `Welcome` to say what it wants (`Start`, `Describe`); the
/// connection counts as pending meanwhile.
pub(crate) const START_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a client has to open all its data channels after `Accepted`.
pub(crate) const JOIN_TIMEOUT: Duration = Duration::from_secs(10);

pub(crate) const SOFTWARE: &str = concat!("sonde ", env!("CARGO_PKG_VERSION"));

/// Why the agent could not admit a session it had no reason to refuse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum NotAdmitted {
    /// The connection has no peer address any more: end without a word.
    Gone,
    /// The agent, or the client's address, runs its maximum of sessions.
    Full(Full),
    /// Mesh: this agent runs its own scheduled test to the client's address.
    LinkBusy,
    /// The token the client asked for is a session's of this agent already.
    TokenTaken,
}

/// What a `Start` asks besides its test.
#[derive(Clone, Copy)]
struct Asked {
    /// How the agent's end waits and where it runs.
    tuning: Tuning,
    /// The token to run the session under, when the client asks for one.
    token: Option<Token>,
}

/// What the conversation asks of the agent around it.
pub(crate) trait Agent {
    /// A fresh nonce for this connection; `None` without an entropy source (the connection is
    /// then closed: a predictable nonce would allow replays).
    fn nonce(&mut self) -> Option<Nonce>;
    /// The number of the next session.
    fn next_session(&mut self) -> SessionId;
    /// Whether the agent is shutting down.
    fn shutting_down(&self) -> bool;
    /// Admits a session for `spec` (its UDP joins signed with `key`), noting it wherever the
    /// agent keeps its sessions, under `token` when the client asked for one: its token.
    ///
    /// # Errors
    /// Why it cannot be admitted.
    fn admit(
        &mut self,
        spec: &TestSpec,
        key: Option<&SessionKey>,
        token: Option<Token>,
    ) -> Result<Token, NotAdmitted>;
    /// Admits a helper request as one of the agent's sessions: `Err(Gone)` without a peer
    /// address, `Err(Full(_))` without room.
    ///
    /// # Errors
    /// Why it cannot be admitted.
    fn admit_helper(&mut self) -> Result<(), NotAdmitted>;
    /// The agent's configuration for the interface the client reaches it by.
    fn host(&mut self) -> Option<Box<HostInfo>>;
    /// This agent, as `Accepted` names it: its id and the address the client reached.
    fn tag(&mut self) -> Option<AgentTag>;

    /// Tries the test's socket options ([`TestSpec::socket`]) on a throwaway socket like its
    /// streams': `Err` names the option the kernel refuses and why.
    ///
    /// # Errors
    /// The option and the kernel's reason.
    fn try_socket(&mut self, _spec: &TestSpec) -> Result<(), String> {
        Ok(())
    }
}

/// What the conversation decided, in the order it decided it.
#[derive(Debug)]
pub(crate) enum Output {
    /// Write this message on the control connection (boxed: a control message is large, and
    /// the other outputs small).
    Send(Box<ControlMsg>),
    /// Shut the write side of the control connection (after a `Description`).
    ShutdownWrite,
    /// The client is refused (the `Refused` message follows): count it, as unauthenticated
    /// too when its proof was missing or wrong, and report it.
    Refused {
        reason: Refusal,
        message: String,
        unauthenticated: bool,
    },
    /// The session is admitted (its `Accepted` follows): it is no longer pending; count it and
    /// report it.
    Admitted { session: SessionId, spec: TestSpec },
    /// Wait for the session's data channels, until [`Conversation::poll_timeout`], and tell the
    /// machine how it went ([`Conversation::joined`], [`Conversation::gave_up_joins`],
    /// [`Conversation::handle_timeout`]).
    AwaitJoins,
    /// Run the admitted test: its data channels have all joined (a crr session has none).
    Run {
        session: SessionId,
        spec: TestSpec,
        tuning: Tuning,
    },
    /// An admitted helper request: it is no longer pending; serve it (`helper::serve`).
    Help { target: String, test: HelperTest },
    /// The conversation is over. `bad_hello`: the peer never said a valid hello.
    End { bad_hello: bool },
}

#[derive(Debug)]
enum State {
    /// Waiting for the `Hello`, by the deadline.
    Hello,
    /// Welcomed; waiting for the request, by the deadline.
    Request {
        session: SessionId,
        nonces: (Nonce, Nonce),
    },
    /// Admitted; waiting for the data channels, by the deadline.
    Joining {
        session: SessionId,
        spec: TestSpec,
        tuning: Tuning,
    },
    /// Over (a test handed on, or no test).
    Over,
}

/// The agent's side of one control conversation (see the module's documentation).
#[derive(Debug)]
pub(crate) struct Conversation<'a> {
    cfg: &'a AgentConfig,
    /// The agent's port, for the message when data channels do not join.
    port: u16,
    state: State,
    deadline: Option<Instant>,
    out: VecDeque<Output>,
}

impl<'a> Conversation<'a> {
    /// A conversation on a control connection whose preamble has been read at `now`:
    /// `version` is its version check, `Err(why)` when it is not this agent's.
    pub(crate) fn new(
        now: Instant,
        cfg: &'a AgentConfig,
        port: u16,
        version: Result<(), String>,
    ) -> Self {
        let mut c = Self {
            cfg,
            port,
            state: State::Hello,
            deadline: Some(now + cfg.hello_timeout),
            out: VecDeque::new(),
        };
        if let Err(e) = version {
            c.refuse(Refusal::Version, format!("{e}; upgrade one side"), false);
        }
        c
    }

    /// The next thing to do; `None` until the machine hears more.
    pub(crate) fn poll(&mut self) -> Option<Output> {
        self.out.pop_front()
    }

    /// When the machine wants [`Conversation::handle_timeout`] at the latest, if it waits.
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        match self.state {
            State::Over => None,
            _ => self.deadline,
        }
    }

    /// Whether the conversation is over (nothing more to hear; drain [`Conversation::poll`]).
    #[cfg(test)]
    pub(crate) fn is_over(&self) -> bool {
        matches!(self.state, State::Over)
    }

    /// The time is `now`: past the deadline, the conversation ends (the hello or the request
    /// never came; data channels that never joined get an `Error`).
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        if self.deadline.is_some_and(|d| now >= d) {
            match self.state {
                State::Hello => self.end(true),
                State::Request { .. } => self.end(false),
                State::Joining { .. } => self.gave_up_joins(),
                State::Over => {}
            }
        }
    }

    /// The control connection failed or closed, or sent what is not a control message.
    pub(crate) fn handle_lost(&mut self) {
        match self.state {
            State::Hello => self.end(true),
            State::Request { .. } | State::Joining { .. } => self.end(false),
            State::Over => {}
        }
    }

    /// A message could not be written: the conversation ends.
    pub(crate) fn handle_write_failed(&mut self) {
        self.out.clear();
        self.end(false);
    }

    /// A control message from the client, at `now`.
    pub(crate) fn handle(&mut self, now: Instant, msg: ControlMsg, agent: &mut dyn Agent) {
        match std::mem::replace(&mut self.state, State::Over) {
            State::Hello => self.on_hello(now, &msg, agent),
            State::Request { session, nonces } => {
                self.on_request(now, session, &nonces, msg, agent);
            }
            // Nothing is read while the data channels join; the test reads what follows.
            state @ (State::Joining { .. } | State::Over) => self.state = state,
        }
    }

    fn on_hello(&mut self, now: Instant, msg: &ControlMsg, agent: &mut dyn Agent) {
        let client_nonce = match *msg {
            ControlMsg::Hello {
                protocol, nonce, ..
            } if protocol == PROTOCOL_VERSION => nonce,
            ControlMsg::Hello { protocol, .. } => {
                let m = format!(
                    "protocol version {protocol} is not supported (this agent speaks {PROTOCOL_VERSION}); upgrade one side"
                );
                return self.refuse(Refusal::Version, m, false);
            }
            _ => return self.end(true),
        };
        let Some(agent_nonce) = agent.nonce() else {
            return self.end(false);
        };
        let session = agent.next_session();
        // Nothing about the host yet: a stranger learns the agent's version, limits and nonce.
        self.send(ControlMsg::Welcome {
            protocol: PROTOCOL_VERSION,
            software: SOFTWARE.into(),
            session,
            limits: self.cfg.limits(),
            nonce: agent_nonce,
            secret_required: self.cfg.secret.is_some(),
        });
        // Still pending (counted against the listener's and the source's limits) until admitted.
        self.deadline = Some(now + START_TIMEOUT);
        self.state = State::Request {
            session,
            nonces: (agent_nonce, client_nonce),
        };
    }

    fn on_request(
        &mut self,
        now: Instant,
        session: SessionId,
        nonces: &(Nonce, Nonce),
        msg: ControlMsg,
        agent: &mut dyn Agent,
    ) {
        match msg {
            ControlMsg::Start {
                spec,
                proof,
                tuning,
                token,
            } => {
                let Ok(key) = self.authenticate(nonces, &Request::Test(&spec), proof) else {
                    return;
                };
                let asked = Asked { tuning, token };
                self.start(now, session, spec, key.as_ref(), asked, agent);
            }
            ControlMsg::Help {
                target,
                test,
                proof,
            } => self.help(nonces, target, test, proof, agent),
            ControlMsg::Describe { proof } => {
                if self.authenticate(nonces, &Request::Describe, proof).is_ok() {
                    let host = agent.host();
                    self.send(ControlMsg::Description { host });
                    self.out.push_back(Output::ShutdownWrite);
                    self.end(false);
                }
            }
            _ => self.end(false),
        }
    }

    fn start(
        &mut self,
        now: Instant,
        session: SessionId,
        spec: TestSpec,
        key: Option<&SessionKey>,
        asked: Asked,
        agent: &mut dyn Agent,
    ) {
        let Asked { tuning, token } = asked;
        if agent.shutting_down() {
            return self.refuse(
                Refusal::ShuttingDown,
                "the agent is shutting down".into(),
                false,
            );
        }
        if let Err((reason, message)) = validate(&spec, self.cfg) {
            return self.refuse(reason, message, false);
        }
        if let Err(why) = agent.try_socket(&spec) {
            let message = format!("the agent's kernel refuses {why}");
            return self.refuse(Refusal::BadRequest, message, false);
        }
        let token = match agent.admit(&spec, key, token) {
            Ok(token) => token,
            Err(NotAdmitted::TokenTaken) => {
                return self.refuse(
                    Refusal::TokenTaken,
                    "a session of this agent has the token asked for: this test reached this \
                     agent already"
                        .into(),
                    false,
                );
            }
            Err(NotAdmitted::Gone) => return self.end(false),
            Err(NotAdmitted::Full(Full::Listener)) => {
                let m = format!(
                    "the agent is running its maximum of {} sessions; try again shortly (sonde server --max-sessions)",
                    self.cfg.max_sessions
                );
                return self.refuse(Refusal::Busy, m, false);
            }
            Err(NotAdmitted::Full(Full::Source)) => {
                let m = format!(
                    "this address runs its maximum of {} sessions at the agent; try again when one ends (sonde server --max-sessions-per-source)",
                    self.cfg.max_sessions_per_source
                );
                return self.refuse(Refusal::SourceBusy, m, false);
            }
            Err(NotAdmitted::LinkBusy) => {
                return self.refuse(
                    Refusal::Busy,
                    "this agent is running its own scheduled test to your address; the link \
                     takes one test at a time (docs/mesh.md)"
                        .into(),
                    false,
                );
            }
        };
        // From here on the connection is a session, not a pending stranger.
        self.out.push_back(Output::Admitted {
            session,
            spec: spec.clone(),
        });
        let host = agent.host();
        let tag = agent.tag();
        self.send(ControlMsg::Accepted {
            token,
            host,
            agent: tag,
        });
        if spec.kind == TestKind::Crr {
            // Its workers connect per transaction: nothing to wait for.
            self.out.push_back(Output::Run {
                session,
                spec,
                tuning,
            });
            return self.end_quietly();
        }
        self.out.push_back(Output::AwaitJoins);
        self.deadline = Some(now + JOIN_TIMEOUT);
        self.state = State::Joining {
            session,
            spec,
            tuning,
        };
    }

    /// A helper request: refused unless the agent is a helper with a secret and the request
    /// proves it, the agent is not shutting down, the test is within the limits and there is
    /// room; then handed on.
    fn help(
        &mut self,
        nonces: &(Nonce, Nonce),
        target: String,
        test: HelperTest,
        proof: Option<Proof>,
        agent: &mut dyn Agent,
    ) {
        if self.cfg.helper.is_none() {
            let m = "this agent is not a helper: it runs tests against other hosts only when \
                     started with `sonde server --helper` and a shared secret";
            return self.refuse(Refusal::NotHelper, m.into(), false);
        }
        if self.cfg.secret.is_none() {
            let m = "this agent has --helper but no shared secret, and helps only clients that \
                     prove one: start it with --secret-file FILE or SONDE_SECRET";
            return self.refuse(Refusal::NotHelper, m.into(), false);
        }
        let request = Request::Help(&target, &test);
        if self.authenticate(nonces, &request, proof).is_err() {
            return;
        }
        if agent.shutting_down() {
            return self.refuse(
                Refusal::ShuttingDown,
                "the agent is shutting down".into(),
                false,
            );
        }
        if let Err((reason, message)) = validate(&test.spec, self.cfg) {
            return self.refuse(reason, message, false);
        }
        match agent.admit_helper() {
            Ok(()) => {}
            Err(NotAdmitted::Full(_) | NotAdmitted::LinkBusy | NotAdmitted::TokenTaken) => {
                let m = format!(
                    "the agent is running its maximum of sessions ({} in all, {} per source); try again \
                     shortly (sonde server --max-sessions)",
                    self.cfg.max_sessions, self.cfg.max_sessions_per_source
                );
                return self.refuse(Refusal::Busy, m, false);
            }
            Err(NotAdmitted::Gone) => return self.end(false),
        }
        self.out.push_back(Output::Help { target, test });
        self.end_quietly();
    }

    /// Every data channel has joined: the test runs.
    pub(crate) fn joined(&mut self) {
        if let State::Joining {
            session,
            spec,
            tuning,
        } = std::mem::replace(&mut self.state, State::Over)
        {
            self.out.push_back(Output::Run {
                session,
                spec,
                tuning,
            });
            self.end_quietly();
        }
    }

    /// The wait for the data channels ended without them all (the join timeout, the agent
    /// shutting down, the client gone): the client is told, and the session ends.
    pub(crate) fn gave_up_joins(&mut self) {
        if matches!(self.state, State::Joining { .. }) {
            self.send(ControlMsg::Error {
                message: format!(
                    "not every data channel joined within {JOIN_TIMEOUT:?} (a firewall on TCP/UDP port {}?)",
                    self.port
                ),
            });
            self.end(false);
        }
    }

    /// Checks the client's proof of the shared secret when the agent has one, refusing the
    /// client when it is missing or wrong; the session's key (`None` without a secret).
    fn authenticate(
        &mut self,
        (agent, client): &(Nonce, Nonce),
        request: &Request<'_>,
        proof: Option<Proof>,
    ) -> Result<Option<SessionKey>, ()> {
        let Some(secret) = &self.cfg.secret else {
            return Ok(None);
        };
        let message = match proof {
            Some(p) if secret.check_proof(agent, client, request, &p) => {
                return Ok(Some(secret.session_key(agent, client)));
            }
            Some(_) => "the shared secret does not match the agent's (check --secret-file or SONDE_SECRET on both sides)",
            None => "this agent requires a shared secret: give the client the agent's with --secret-file FILE or SONDE_SECRET",
        };
        self.refuse(Refusal::Unauthenticated, message.into(), true);
        Err(())
    }

    fn refuse(&mut self, reason: Refusal, message: String, unauthenticated: bool) {
        self.out.push_back(Output::Refused {
            reason,
            message: message.clone(),
            unauthenticated,
        });
        self.send(ControlMsg::Refused { reason, message });
        self.end(false);
    }

    fn send(&mut self, msg: ControlMsg) {
        self.out.push_back(Output::Send(Box::new(msg)));
    }

    fn end(&mut self, bad_hello: bool) {
        self.out.push_back(Output::End { bad_hello });
        self.end_quietly();
    }

    /// Over, the last output (a test or a helper request to run) already queued.
    fn end_quietly(&mut self) {
        self.state = State::Over;
        self.deadline = None;
    }
}

pub(crate) mod running;
#[cfg(test)]
mod tests;
