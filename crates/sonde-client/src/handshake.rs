//! The client's side of the sonde control handshake as a state machine without sockets or
//! clocks (sans-IO, like quinn-proto's `Connection`): it takes the time and the agent's decoded
//! replies, and says what to send and by when the next reply is due. The client's sessions drive
//! it over a `TcpStream` (`session::hello` and the `Welcomed` methods); the agent's tests drive
//! it in memory against the agent's own state machine, on a virtual clock.
//!
//! The handshake: `Hello` (with this end's nonce), the agent's `Welcome` (its nonce, limits and
//! session number); then one request, proving the shared secret when the client has one:
//! `Start` (answered by `Accepted`, and `Ready` once the client's data channels have joined),
//! `Describe` (`Description`) or `Help` (`HelperReady`). A `Refused` or an `Error` from the agent
//! ends it, as does anything else where a reply was due, a closed connection, and a reply that
//! does not come in time.
//!
//! ```
//! use std::time::Instant;
//! use sonde_client::handshake::{Handshake, Progress};
//! use sonde_wire::auth::Nonce;
//! use sonde_wire::ControlMsg;
//!
//! let now = Instant::now();
//! let mut client = Handshake::new(now, None, Nonce([7; 32]));
//! assert!(matches!(client.poll_transmit(), Some(ControlMsg::Hello { .. })));
//! let welcome = ControlMsg::Welcome {
//!     protocol: sonde_wire::PROTOCOL_VERSION,
//!     software: "sonde".into(),
//!     session: sonde_wire::SessionId(1),
//!     limits: sonde_wire::Limits {
//!         max_sessions: 16,
//!         max_duration_ms: 300_000,
//!         max_streams: 128,
//!         max_msg_size: 1 << 20,
//!         request_response: true,
//!     },
//!     nonce: Nonce([9; 32]),
//!     secret_required: false,
//! };
//! let progress = client.handle(Ok(welcome), Ok(())).unwrap();
//! assert!(matches!(progress, Progress::Welcomed { .. }));
//! ```

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use sonde_net::control::ControlError;
use sonde_wire::auth::{Nonce, Request, Secret, SessionKey};
use sonde_wire::{
    ControlMsg, HelperTest, HostInfo, Limits, SessionId, TestSpec, Token, Tuning, PROTOCOL_VERSION,
};

use crate::ClientError;

/// How long each reply of the handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a helper has to get its session at the target ready.
pub const HELPER_READY_TIMEOUT: Duration = Duration::from_secs(40);

const SOFTWARE: &str = concat!("sonde ", env!("CARGO_PKG_VERSION"));

/// What a reply moved the handshake to.
#[derive(Debug)]
#[non_exhaustive]
pub enum Progress {
    /// The agent's `Welcome`: ask for something next ([`Handshake::start`],
    /// [`Handshake::describe`], [`Handshake::help`]).
    Welcomed {
        /// The agent's number for this session.
        session: SessionId,
        /// What the agent allows.
        limits: Limits,
    },
    /// The test is admitted: open its data channels, then [`Handshake::await_ready`].
    Accepted {
        /// The token the data channels join with.
        token: Token,
        /// The agent's configuration (sent to admitted clients only).
        host: Option<HostInfo>,
        /// The agent that admitted the session; `None` from an older agent, which does not
        /// answer data joins.
        agent: Option<sonde_wire::AgentTag>,
    },
    /// The agent is ready: the test may start.
    Ready,
    /// The agent's configuration, for `sonde conf`.
    Described {
        /// The agent's configuration.
        host: Option<HostInfo>,
    },
    /// The helper's session at its target is ready.
    HelperReady,
}

/// The reply the handshake waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    Welcome,
    Acceptance,
    Ready,
    Description,
    HelperReady,
}

impl Due {
    /// What the client was doing, for a message about a closed connection.
    fn doing(self) -> &'static str {
        match self {
            Self::Welcome => "saying hello",
            Self::Acceptance => "asking for the test",
            Self::Ready => "opening data streams",
            Self::Description => "asking for its configuration",
            Self::HelperReady => "asking for help",
        }
    }

    /// The reply, for a message about another one.
    fn wanted(self) -> &'static str {
        match self {
            Self::Welcome => "a welcome",
            Self::Acceptance => "an acceptance",
            Self::Ready => "ready",
            Self::Description => "a description",
            Self::HelperReady => "the helper's ready",
        }
    }
}

/// The client's side of one control handshake (see the module's documentation).
#[derive(Debug)]
pub struct Handshake {
    secret: Option<Secret>,
    client_nonce: Nonce,
    /// The agent's nonce, once welcomed.
    agent_nonce: Option<Nonce>,
    /// The reply due, and by when; `None` between requests and at the end.
    due: Option<(Due, Instant)>,
    out: VecDeque<ControlMsg>,
}

impl Handshake {
    /// A handshake starting at `now`: proves `secret` (when there is one) with this end's
    /// `nonce`. Its `Hello` is the first message to send (after the control preamble).
    pub fn new(now: Instant, secret: Option<Secret>, nonce: Nonce) -> Self {
        let mut h = Self {
            secret,
            client_nonce: nonce,
            agent_nonce: None,
            due: None,
            out: VecDeque::new(),
        };
        h.ask(
            now,
            ControlMsg::Hello {
                protocol: PROTOCOL_VERSION,
                software: SOFTWARE.into(),
                nonce,
            },
            Due::Welcome,
            HANDSHAKE_TIMEOUT,
        );
        h
    }

    /// The next message to send.
    pub fn poll_transmit(&mut self) -> Option<ControlMsg> {
        self.out.pop_front()
    }

    /// When the reply due must have come: read until then, then [`Handshake::handle_timeout`].
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.due.map(|(_, by)| by)
    }

    /// Asks for `spec`, with the `tuning` the agent is to apply to its end.
    pub fn start(&mut self, now: Instant, spec: &TestSpec, tuning: Tuning) {
        self.start_as(now, spec, tuning, None);
    }

    /// [`Handshake::start`] under `token`, the one another agent behind the same address gave
    /// the test (`None`: the agent's choice).
    pub fn start_as(
        &mut self,
        now: Instant,
        spec: &TestSpec,
        tuning: Tuning,
        token: Option<Token>,
    ) {
        let proof = self.proof(&Request::Test(spec));
        let start = ControlMsg::Start {
            spec: spec.clone(),
            proof,
            tuning,
            token,
        };
        self.ask(now, start, Due::Acceptance, HANDSHAKE_TIMEOUT);
    }

    /// Asks the agent to describe its host (`sonde conf`).
    pub fn describe(&mut self, now: Instant) {
        let proof = self.proof(&Request::Describe);
        self.ask(
            now,
            ControlMsg::Describe { proof },
            Due::Description,
            HANDSHAKE_TIMEOUT,
        );
    }

    /// Asks the agent, a helper, to run `test` against `target` (`--from`). The helper makes
    /// its own handshake with the target first: its reply may take [`HELPER_READY_TIMEOUT`].
    pub fn help(&mut self, now: Instant, target: &str, test: &HelperTest) {
        let proof = self.proof(&Request::Help(target, test));
        let help = ControlMsg::Help {
            target: target.to_owned(),
            test: test.clone(),
            proof,
        };
        self.ask(now, help, Due::HelperReady, HELPER_READY_TIMEOUT);
    }

    /// The data channels are open: waits for the agent's `Ready`.
    pub fn await_ready(&mut self, now: Instant) {
        self.due = Some((Due::Ready, now + HANDSHAKE_TIMEOUT));
    }

    /// The key that signs this session's UDP joins (none without a secret, or before the
    /// agent's `Welcome`).
    pub fn session_key(&self) -> Option<SessionKey> {
        let agent = self.agent_nonce.as_ref()?;
        self.secret
            .as_ref()
            .map(|s| s.session_key(agent, &self.client_nonce))
    }

    /// The agent's reply (`Err` when none could be read by [`Handshake::poll_timeout`]), and whether the request it
    /// answers could be written: an agent that refused and closed may make the write fail with
    /// its refusal waiting, which is then what the client hears.
    ///
    /// # Errors
    /// The agent refused or reported an error, is not a sonde agent, sent another reply than
    /// the one due, or the connection failed.
    pub fn handle(
        &mut self,
        reply: Result<ControlMsg, ControlError>,
        written: Result<(), ControlError>,
    ) -> Result<Progress, ClientError> {
        let Some((due, _)) = self.due.take() else {
            return Err(ClientError::Protocol(
                "the agent sent a message where none was due".into(),
            ));
        };
        let reply = match reply {
            Ok(ControlMsg::Refused { reason, message }) => {
                return Err(ClientError::Refused { reason, message })
            }
            Ok(ControlMsg::Error { message }) => Err(ClientError::Remote(message)),
            Ok(m) => Ok(m),
            Err(ControlError::Wire(e)) => Err(ClientError::NotAnAgent(format!(
                "the peer is not a sonde agent, or a different version ({e})"
            ))),
            Err(ControlError::Closed) => Err(ClientError::NotAnAgent(format!(
                "the peer closed the connection while {}: not a sonde agent, or one that is shutting down",
                due.doing()
            ))),
            Err(e) => Err(ClientError::Control(e)),
        };
        let progress = match (due, reply) {
            // A helper's failure is an answer in its own right, whatever the write did.
            (Due::HelperReady, Ok(ControlMsg::HelperFailed { exit_code, message })) => {
                return Err(ClientError::HelperTarget { exit_code, message })
            }
            (_, reply) => {
                if let Err(e) = written {
                    return Err(e.into());
                }
                reply?
            }
        };
        match (due, progress) {
            (
                Due::Welcome,
                ControlMsg::Welcome {
                    session,
                    limits,
                    nonce,
                    ..
                },
            ) => {
                self.agent_nonce = Some(nonce);
                Ok(Progress::Welcomed { session, limits })
            }
            (Due::Acceptance, ControlMsg::Accepted { token, host, agent }) => {
                Ok(Progress::Accepted {
                    token,
                    host: host.map(|h| *h),
                    agent,
                })
            }
            (Due::Ready, ControlMsg::Ready) => Ok(Progress::Ready),
            (Due::Description, ControlMsg::Description { host }) => Ok(Progress::Described {
                host: host.map(|h| *h),
            }),
            (Due::HelperReady, ControlMsg::HelperReady) => Ok(Progress::HelperReady),
            (due, other) => Err(unexpected(&other, due.wanted())),
        }
    }

    /// The time is `now`: past the due reply's deadline, the handshake has failed.
    ///
    /// # Errors
    /// The reply did not come in time.
    pub fn handle_timeout(&mut self, now: Instant) -> Result<(), ClientError> {
        match self.due {
            Some((due, by)) if now >= by => {
                self.due = None;
                let allowed = match due {
                    Due::HelperReady => HELPER_READY_TIMEOUT,
                    _ => HANDSHAKE_TIMEOUT,
                };
                Err(ClientError::Control(ControlError::Timeout(allowed)))
            }
            _ => Ok(()),
        }
    }

    fn ask(&mut self, now: Instant, msg: ControlMsg, due: Due, within: Duration) {
        self.out.push_back(msg);
        self.due = Some((due, now + within));
    }

    /// The proof of the secret for `request` on this connection (none without a secret).
    fn proof(&self, request: &Request<'_>) -> Option<sonde_wire::auth::Proof> {
        let agent = self.agent_nonce.as_ref()?;
        self.secret
            .as_ref()
            .map(|s| s.proof(agent, &self.client_nonce, request))
    }
}

/// A reply other than the one due, named as the agent spelled its type.
pub(crate) fn unexpected(msg: &ControlMsg, wanted: &str) -> ClientError {
    let kind = serde_kind(msg);
    ClientError::Protocol(format!("the agent sent `{kind}` where {wanted} was due"))
}

fn serde_kind(msg: &ControlMsg) -> String {
    let mut buf = Vec::new();
    let _ = sonde_wire::encode_frame(msg, &mut buf);
    let text = String::from_utf8_lossy(buf.get(4..).unwrap_or_default()).into_owned();
    text.split('"').nth(3).unwrap_or("?").to_owned()
}
