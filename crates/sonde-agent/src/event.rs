//! What the agent reports to its user: one typed [`AgentEvent`] for each thing worth a line in
//! a log (a session admitted or ended, a refusal, a connection closed unread), handed to the
//! [`EventSink`] the user gave ([`crate::AgentConfig::events`]). The agent prints nothing; the
//! binary decides what to print (`sonde server` writes each event's `Display`, prefixed with
//! `sonde agent: `, to stderr).
//!
//! Events are made only when there is a sink (the call sites pass a closure), and none is made
//! inside a data loop.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use sonde_wire::SessionId;

/// Something the agent did. Its `Display` is the line `sonde server` prints after
/// `sonde agent: `.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum AgentEvent {
    /// A connection to sonde's port closed or failed before its preamble was read.
    ClosedConnection {
        /// The peer's address (`?` when unknown).
        peer: String,
        /// What went wrong.
        error: String,
    },
    /// A sonde client was refused (version, limits, busy, authentication, shutdown).
    Refused {
        /// The peer's address (`?` when unknown).
        peer: String,
        /// The message the client was sent.
        message: String,
    },
    /// A session was admitted.
    SessionAdmitted {
        /// The agent's number for it.
        session: SessionId,
        /// The peer's address.
        peer: String,
        /// The test, as `tcp throughput, 1 stream(s) Forward, 131072 B, 10.0 s`.
        test: String,
    },
    /// A session ended.
    SessionEnded {
        /// The agent's number for it.
        session: SessionId,
        /// The peer's address.
        peer: String,
        /// How it ended (`ended`, `ended: why`).
        outcome: String,
    },
    /// A helper request (`--from`) was admitted.
    HelperAdmitted {
        /// The requester's address.
        peer: String,
        /// The test, as in [`AgentEvent::SessionAdmitted`].
        test: String,
        /// The third host the test runs against.
        target: String,
    },
    /// A helper's result could not be sent to its requester.
    HelperResultLost {
        /// The requester's address.
        peer: String,
        /// Why.
        error: String,
    },
    /// A helper request ended.
    HelperEnded {
        /// The requester's address.
        peer: String,
        /// The third host the test ran against.
        target: String,
    },
    /// The iperf3 listener could not serve at all.
    Iperf3ListenerFailed {
        /// Why.
        error: String,
    },
    /// An iperf3 connection closed before its cookie.
    Iperf3NoCookie {
        /// The peer's address.
        peer: String,
        /// Why.
        error: String,
    },
    /// An iperf3 client was refused: the agent ran its maximum of sessions.
    Iperf3Busy {
        /// The peer's address.
        peer: String,
        /// `max_sessions`.
        max_sessions: u32,
        /// `max_sessions_per_source`.
        max_sessions_per_source: u32,
    },
    /// An iperf3 data stream was refused.
    Iperf3StreamRefused {
        /// The peer's address (`?` when unknown).
        peer: String,
        /// The test's cookie, as text.
        cookie: String,
        /// Why.
        reason: &'static str,
    },
    /// An iperf3 test ended.
    Iperf3TestEnded {
        /// The listener's number for the test.
        number: u64,
        /// The peer's address.
        peer: String,
        /// What it ran and how it ended.
        line: String,
    },
    /// An iperf3 stream runs unpaced: its `--fq-rate` could not be set.
    Iperf3Unpaced {
        /// The stream's peer.
        peer: String,
        /// Why.
        error: String,
    },
    /// The sockperf UDP side is not served.
    SockperfUdpNotServed {
        /// What could not be done (`cannot start its thread: ...`).
        why: String,
    },
    /// A sockperf TCP connection ended.
    SockperfTcpEnded {
        /// The peer's address.
        peer: String,
        /// Messages received and handled.
        messages: u64,
        /// Replies sent.
        replies: u64,
        /// How long the connection lasted.
        elapsed: Duration,
        /// How it ended.
        end: String,
    },
    /// A sockperf UDP peer passed `--max-duration` and is no longer answered.
    SockperfUdpOverrun {
        /// The peer's address.
        peer: String,
        /// `--max-duration`, whole seconds.
        max_duration_s: u64,
    },
    /// A sockperf UDP peer's session ended.
    SockperfUdpEnded {
        /// The peer's address.
        peer: String,
        /// Messages received and handled.
        messages: u64,
        /// Replies sent.
        replies: u64,
        /// `, N junk datagrams` or nothing.
        junk: String,
        /// From its first datagram to its last.
        elapsed: Duration,
        /// Why it ended.
        why: String,
    },
}

impl fmt::Display for AgentEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ClosedConnection { peer, error } => {
                write!(f, "closed connection from {peer}: {error}")
            }
            Self::Refused { peer, message } => write!(f, "refused {peer}: {message}"),
            Self::SessionAdmitted {
                session,
                peer,
                test,
            } => write!(f, "session {} from {peer}: {test}", session.0),
            Self::SessionEnded {
                session,
                peer,
                outcome,
            } => write!(f, "session {} from {peer} {outcome}", session.0),
            Self::HelperAdmitted { peer, test, target } => {
                write!(f, "helper session for {peer}: {test} against {target}")
            }
            Self::HelperResultLost { peer, error } => write!(
                f,
                "helper session for {peer}: the result could not be sent: {error}"
            ),
            Self::HelperEnded { peer, target } => {
                write!(f, "helper session for {peer} against {target} ended")
            }
            Self::Iperf3ListenerFailed { error } => write!(f, "iperf3 listener failed: {error}"),
            Self::Iperf3NoCookie { peer, error } => {
                write!(
                    f,
                    "iperf3: closed connection from {peer}: no cookie ({error})"
                )
            }
            Self::Iperf3Busy {
                peer,
                max_sessions,
                max_sessions_per_source,
            } => write!(
                f,
                "iperf3: refused {peer}: busy ({max_sessions} sessions running, at most \
                 {max_sessions_per_source} per address)"
            ),
            Self::Iperf3StreamRefused {
                peer,
                cookie,
                reason,
            } => write!(
                f,
                "iperf3: refused a data stream from {peer} for test {cookie:?}: {reason}"
            ),
            Self::Iperf3TestEnded { number, peer, line } => {
                write!(f, "iperf3 test {number} from {peer}: {line}")
            }
            Self::Iperf3Unpaced { peer, error } => write!(
                f,
                "iperf3: stream to {peer} runs unpaced: cannot set --fq-rate ({error})"
            ),
            Self::SockperfUdpNotServed { why } => write!(f, "sockperf UDP not served: {why}"),
            Self::SockperfTcpEnded {
                peer,
                messages,
                replies,
                elapsed,
                end,
            } => write!(
                f,
                "sockperf tcp {peer}: {messages} messages received and handled, {replies} \
                 replies, {:.1} s, {end}",
                elapsed.as_secs_f64()
            ),
            Self::SockperfUdpOverrun {
                peer,
                max_duration_s,
            } => write!(
                f,
                "sockperf udp {peer}: over --max-duration ({max_duration_s} s), no longer answered"
            ),
            Self::SockperfUdpEnded {
                peer,
                messages,
                replies,
                junk,
                elapsed,
                why,
            } => write!(
                f,
                "sockperf udp {peer}: {messages} messages received and handled, {replies} \
                 replies{junk}, {:.1} s, {why}",
                elapsed.as_secs_f64()
            ),
        }
    }
}

/// Where the agent's events go: given by the agent's user, called from the agent's threads.
pub trait EventSink: Send + Sync {
    /// One event; called on the thread that saw it, so it should not block for long.
    fn event(&self, event: AgentEvent);
}

/// The sink an agent reports to ([`crate::AgentConfig::events`]).
#[derive(Clone)]
pub struct Events(pub Arc<dyn EventSink>);

impl fmt::Debug for Events {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Events(..)")
    }
}

impl<F: Fn(AgentEvent) + Send + Sync> EventSink for F {
    fn event(&self, event: AgentEvent) {
        self(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The lines `sonde server` printed before the agent reported events, word for word (tests
    /// and operators grep them).
    #[test]
    fn each_event_reads_as_the_line_the_agent_printed() {
        let cases: Vec<(AgentEvent, &str)> = vec![
            (
                AgentEvent::SessionAdmitted {
                    session: SessionId(7),
                    peer: "127.0.0.1:5000".into(),
                    test: "tcp latency, 1 stream(s) Forward, 64 B, 1.0 s".into(),
                },
                "session 7 from 127.0.0.1:5000: tcp latency, 1 stream(s) Forward, 64 B, 1.0 s",
            ),
            (
                AgentEvent::SessionEnded {
                    session: SessionId(7),
                    peer: "127.0.0.1:5000".into(),
                    outcome: "ended".into(),
                },
                "session 7 from 127.0.0.1:5000 ended",
            ),
            (
                AgentEvent::Refused {
                    peer: "?".into(),
                    message: "the agent is shutting down".into(),
                },
                "refused ?: the agent is shutting down",
            ),
            (
                AgentEvent::Iperf3StreamRefused {
                    peer: "10.0.0.1:1".into(),
                    cookie: "abc".into(),
                    reason: "the test is not waiting for streams",
                },
                "iperf3: refused a data stream from 10.0.0.1:1 for test \"abc\": the test is not \
                 waiting for streams",
            ),
            (
                AgentEvent::SockperfTcpEnded {
                    peer: "10.0.0.1:1".into(),
                    messages: 3,
                    replies: 2,
                    elapsed: Duration::from_millis(1300),
                    end: "closed by the peer".into(),
                },
                "sockperf tcp 10.0.0.1:1: 3 messages received and handled, 2 replies, 1.3 s, \
                 closed by the peer",
            ),
            (
                AgentEvent::SockperfUdpEnded {
                    peer: "10.0.0.1".into(),
                    messages: 3,
                    replies: 2,
                    junk: String::new(),
                    elapsed: Duration::from_millis(500),
                    why: "idle".into(),
                },
                "sockperf udp 10.0.0.1: 3 messages received and handled, 2 replies, 0.5 s, idle",
            ),
        ];
        for (event, line) in cases {
            assert_eq!(event.to_string(), line);
        }
    }
}
