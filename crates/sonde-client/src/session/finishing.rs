//! The end of a latency test at the client, as a state machine without sockets or clocks: once
//! the measured loop is over (at its planned end, or stopped early by Ctrl-C), the client tells
//! the agent `Finish` and waits for its `Report`, passing over the `Interval`s and `SenderDone`
//! still on their way. The report is due within [`REPORT_TIMEOUT`] of the agent's last message.
//! A `Refused` or an `Error` from the agent, any other message, a closed or broken connection,
//! and a report that does not come in time end the test. It says what the session's socket code
//! (`session::run_latency_held`) must do: send `Finish`, and when the report has come, stop. A
//! running bulk test's end is [`super::running`]'s; the agent's side of `Finish` (every stream
//! stops) is `sonde_agent`'s `conversation::running`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use sonde_net::control::ControlError;
use sonde_wire::{AgentReport, ControlMsg};

use crate::handshake::unexpected;
use crate::ClientError;

/// How long the agent has to send its report after the test (after its last message).
pub(crate) const REPORT_TIMEOUT: Duration = Duration::from_secs(15);

/// What the socket code must do, in order.
#[derive(Debug, PartialEq)]
pub(crate) enum Step {
    /// Tell the agent the test is over (`Finish`).
    SendFinish,
    /// The agent's report has come: the test is over.
    Done {
        /// The agent's report.
        report: Box<AgentReport>,
        /// The measured loop was stopped early (Ctrl-C, SIGTERM).
        interrupted: bool,
    },
}

/// The client's end of one latency test (see the module's documentation).
#[derive(Debug)]
pub(crate) struct Finishing {
    /// When the report is due.
    due: Instant,
    interrupted: bool,
    /// The report has come: nothing more is due.
    reported: bool,
    out: VecDeque<Step>,
}

impl Finishing {
    /// The measured loop ended at `now`: `Finish` is to be sent, and the report is due.
    pub(crate) fn new(now: Instant) -> Self {
        Self {
            due: now + REPORT_TIMEOUT,
            interrupted: false,
            reported: false,
            out: VecDeque::from([Step::SendFinish]),
        }
    }

    /// The next thing to do.
    pub(crate) fn poll(&mut self) -> Option<Step> {
        self.out.pop_front()
    }

    /// When the agent's next message (the report at the latest) is due.
    pub(crate) fn poll_timeout(&self) -> Instant {
        self.due
    }

    /// The measured loop was stopped early by the caller's interrupt flag (Ctrl-C, SIGTERM): the
    /// test ends as its planned end would (one `Finish`, the report awaited as long), and the
    /// result says it was interrupted.
    pub(crate) fn interrupt(&mut self) {
        self.interrupted = true;
    }

    /// The time is `now`.
    ///
    /// # Errors
    /// The report did not come in time.
    pub(crate) fn handle_timeout(&mut self, now: Instant) -> Result<(), ClientError> {
        if !self.reported && now >= self.due {
            return Err(ClientError::Control(ControlError::Timeout(REPORT_TIMEOUT)));
        }
        Ok(())
    }

    /// A control message from the agent, at `now`.
    ///
    /// # Errors
    /// The agent refused or reported an error, or sent what has no place at a test's end.
    pub(crate) fn handle(&mut self, now: Instant, msg: ControlMsg) -> Result<(), ClientError> {
        match msg {
            ControlMsg::Report(report) => {
                self.reported = true;
                self.out.push_back(Step::Done {
                    report: Box::new(report),
                    interrupted: self.interrupted,
                });
            }
            // The agent's last intervals and senders' counts, sent before it saw `Finish`.
            ControlMsg::Interval(_) | ControlMsg::SenderDone { .. } => {
                self.due = now + REPORT_TIMEOUT;
            }
            ControlMsg::Refused { reason, message } => {
                return Err(ClientError::Refused { reason, message })
            }
            ControlMsg::Error { message } => return Err(ClientError::Remote(message)),
            other => return Err(unexpected(&other, "the report")),
        }
        Ok(())
    }

    /// The control connection failed, closed, or the read for the report timed out.
    ///
    /// # Errors
    /// Unless the agent's report has come (the agent closes after it), the test has failed.
    /// Past the handshake, a broken control channel is a failed test, not a wrong peer.
    pub(crate) fn handle_lost(&mut self, e: ControlError) -> Result<(), ClientError> {
        if self.reported {
            return Ok(());
        }
        Err(match e {
            ControlError::Wire(e) => ClientError::Protocol(format!(
                "the peer is not a sonde agent, or a different version ({e})"
            )),
            ControlError::Closed => ClientError::Protocol(
                "the peer closed the connection while finishing: not a sonde agent, or one that \
                 is shutting down"
                    .into(),
            ),
            e => ClientError::Control(e),
        })
    }
}

#[cfg(test)]
mod tests {
    use sonde_wire::{IntervalStats, Refusal, StreamStats};

    use super::*;

    /// `msg` as the agent's socket code sends it and the client's reads it: through the real
    /// frame codec.
    fn wire(msg: &ControlMsg) -> Result<ControlMsg, ControlError> {
        let mut frame = Vec::new();
        sonde_wire::encode_frame(msg, &mut frame).expect("encodes");
        let header: [u8; 4] = frame[..4].try_into().expect("a header");
        let len = sonde_wire::frame_len(header)?;
        Ok(sonde_wire::decode_body(&frame[4..4 + len])?)
    }

    /// Delivers `msg` from the agent at `now`, as the socket code does.
    fn deliver(f: &mut Finishing, now: Instant, msg: &ControlMsg) -> Result<(), ClientError> {
        match wire(msg) {
            Ok(m) => f.handle(now, m),
            Err(e) => f.handle_lost(e),
        }
    }

    fn drain(f: &mut Finishing) -> Vec<Step> {
        std::iter::from_fn(|| f.poll()).collect()
    }

    /// A report that is not the default one, so that the one handed on is seen to be it.
    fn report() -> AgentReport {
        AgentReport {
            overlapping_sessions: 3,
            ..AgentReport::default()
        }
    }

    #[test]
    fn finish_goes_once_and_the_report_after_the_agents_last_intervals_ends_the_test() {
        let t0 = Instant::now();
        let mut f = Finishing::new(t0);
        assert_eq!(drain(&mut f), [Step::SendFinish]);
        assert_eq!(f.poll_timeout(), t0 + REPORT_TIMEOUT);
        // An interval and the senders' counts still on their way: passed over, and the report
        // is due a full timeout after each.
        let t1 = t0 + Duration::from_secs(10);
        deliver(&mut f, t1, &ControlMsg::Interval(IntervalStats::default())).unwrap();
        let t2 = t1 + Duration::from_secs(10);
        f.handle_timeout(t2).expect("due 15 s after the interval");
        deliver(
            &mut f,
            t2,
            &ControlMsg::SenderDone {
                streams: vec![StreamStats::default()],
            },
        )
        .unwrap();
        assert!(drain(&mut f).is_empty());
        assert_eq!(f.poll_timeout(), t2 + REPORT_TIMEOUT);
        deliver(&mut f, t2, &ControlMsg::Report(report())).unwrap();
        assert_eq!(
            drain(&mut f),
            [Step::Done {
                report: Box::new(report()),
                interrupted: false
            }]
        );
    }

    #[test]
    fn a_report_that_never_comes_fails_at_its_deadline_and_not_before() {
        let t0 = Instant::now();
        let mut f = Finishing::new(t0);
        drain(&mut f);
        let due = f.poll_timeout();
        f.handle_timeout(due - Duration::from_millis(1)).unwrap();
        match f.handle_timeout(due) {
            Err(e @ ClientError::Control(ControlError::Timeout(_))) => assert_eq!(
                e.to_string(),
                "control connection to the agent: no message from the peer within 15s"
            ),
            other => panic!("{other:?}"),
        }
        // The socket code's own read timeout says the same, with the time its read waited.
        match f.handle_lost(ControlError::Timeout(Duration::from_secs(3))) {
            Err(e @ ClientError::Control(ControlError::Timeout(_))) => {
                assert_eq!(
                    e.to_string(),
                    "control connection to the agent: no message from the peer within 3s"
                );
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_agent_that_closes_before_its_report_fails_the_test() {
        let mut f = Finishing::new(Instant::now());
        drain(&mut f);
        match f.handle_lost(ControlError::Closed) {
            Err(ClientError::Protocol(m)) => assert_eq!(
                m,
                "the peer closed the connection while finishing: not a sonde agent, or one that \
                 is shutting down"
            ),
            other => panic!("{other:?}"),
        }
        // Bytes that are not a control frame: the same kind of failure, with the codec's reason.
        let garbage = sonde_wire::decode_body(b"{\"type\":").unwrap_err();
        match f.handle_lost(ControlError::Wire(garbage)) {
            Err(ClientError::Protocol(m)) => {
                assert!(m.starts_with("the peer is not a sonde agent, or a different version ("));
            }
            other => panic!("{other:?}"),
        }
        assert!(drain(&mut f).is_empty(), "nothing more to send");
        // After the report, the agent closing (or any deadline) is the test's ordinary end.
        let now = Instant::now();
        let mut f = Finishing::new(now);
        drain(&mut f);
        deliver(&mut f, now, &ControlMsg::Report(report())).unwrap();
        assert!(f.handle_lost(ControlError::Closed).is_ok());
        assert!(f.handle_timeout(now + REPORT_TIMEOUT * 2).is_ok());
        assert!(matches!(drain(&mut f)[..], [Step::Done { .. }]));
    }

    #[test]
    fn the_agents_error_or_refusal_ends_the_test_with_its_words() {
        let now = Instant::now();
        let mut f = Finishing::new(now);
        drain(&mut f);
        let error = ControlMsg::Error {
            message: "the agent is shutting down".into(),
        };
        match deliver(&mut f, now, &error) {
            Err(ClientError::Remote(m)) => assert_eq!(m, "the agent is shutting down"),
            other => panic!("{other:?}"),
        }
        let refused = ControlMsg::Refused {
            reason: Refusal::ShuttingDown,
            message: "bye".into(),
        };
        match deliver(&mut f, now, &refused) {
            Err(ClientError::Refused { reason, message }) => {
                assert_eq!((reason, message.as_str()), (Refusal::ShuttingDown, "bye"));
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_stray_message_ends_the_test() {
        let now = Instant::now();
        for stray in [ControlMsg::Ready, ControlMsg::Go, ControlMsg::Finish] {
            let mut f = Finishing::new(now);
            drain(&mut f);
            match deliver(&mut f, now, &stray) {
                Err(ClientError::Protocol(m)) => {
                    assert!(m.ends_with("where the report was due"), "{m}");
                }
                other => panic!("{stray:?}: {other:?}"),
            }
        }
        let mut f = Finishing::new(now);
        match deliver(&mut f, now, &ControlMsg::Ready) {
            Err(ClientError::Protocol(m)) => {
                assert_eq!(m, "the agent sent `ready` where the report was due");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_interrupted_run_ends_as_a_planned_one_and_says_so() {
        let t0 = Instant::now();
        let mut f = Finishing::new(t0);
        f.interrupt();
        f.interrupt();
        assert_eq!(
            drain(&mut f),
            [Step::SendFinish],
            "one Finish, as at the planned end"
        );
        assert_eq!(
            f.poll_timeout(),
            t0 + REPORT_TIMEOUT,
            "the report is awaited as long"
        );
        deliver(&mut f, t0, &ControlMsg::Report(report())).unwrap();
        assert_eq!(
            drain(&mut f),
            [Step::Done {
                report: Box::new(report()),
                interrupted: true
            }]
        );
    }
}
