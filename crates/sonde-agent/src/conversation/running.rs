//! The control side of a running test, as a state machine without sockets, threads or clocks:
//! the client's `Go`, `SenderDone`, `Finish`, clock probes and errors; the agent's data streams
//! ending; the deadlines (the client's `Go`, the grace for UDP datagrams in flight, the test's
//! hard end). It says what the session's event loop (`session::Test::drive`) must do: start the
//! senders, expect so many datagrams, stop streams, answer a probe, send `SenderDone`, or end the
//! test with a reason. The data streams themselves run on their own threads, outside it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use sonde_wire::ControlMsg;

use super::JOIN_TIMEOUT;

/// How long UDP receivers keep listening after the sender said it is done, for datagrams still
/// in flight.
pub(crate) const UDP_GRACE: Duration = Duration::from_secs(1);
/// How far past its planned end a session may run before the agent ends it.
pub(crate) const OVERRUN: Duration = Duration::from_secs(60);

/// What the event loop must do, in order.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Action {
    /// The client said `Go`: the senders start now.
    Go,
    /// The client's sender sent `packets` on stream `stream`: its receiver expects no more.
    Expect { stream: usize, packets: u64 },
    /// The grace after the client's `SenderDone` is over: the receiving streams stop (UDP, and
    /// TCP read under a cap, whose unread data would take long).
    StopReceivers,
    /// The client said `Finish` (a latency test's end): every stream stops.
    StopAll,
    /// Answer a clock probe.
    AnswerClock { client_send_ns: u64 },
    /// Every agent sender has finished: tell the client what they sent.
    SendSenderDone,
    /// The test ends early, for this reason (sent to the client as an `Error`).
    Fail(String),
}

/// The control side of one running test (see the module's documentation).
#[derive(Debug)]
pub(crate) struct Running {
    /// Until the client's `Go`, when the agent has senders to start.
    go_deadline: Option<Instant>,
    hard_deadline: Instant,
    /// After the client's `SenderDone`: when the receivers stop.
    grace_until: Option<Instant>,
    /// Per stream: whether the agent sends on it, and whether its loop has ended.
    sends: Vec<bool>,
    done: Vec<bool>,
    sender_done_sent: bool,
    /// Per stream: what the client's sender said it sent.
    client_sent: Vec<Option<u64>>,
    failed: bool,
    out: VecDeque<Action>,
}

impl Running {
    /// A test whose event loop starts at `now`, ended at `hard_deadline` at the latest (its
    /// planned end and [`OVERRUN`]), whose stream `i` the agent sends on when `sends[i]`.
    pub(crate) fn new(now: Instant, hard_deadline: Instant, sends: Vec<bool>) -> Self {
        let n = sends.len();
        Self {
            go_deadline: sends.iter().any(|&s| s).then(|| now + JOIN_TIMEOUT),
            hard_deadline,
            grace_until: None,
            sends,
            done: vec![false; n],
            sender_done_sent: false,
            client_sent: vec![None; n],
            failed: false,
            out: VecDeque::new(),
        }
    }

    /// The next thing to do.
    pub(crate) fn poll(&mut self) -> Option<Action> {
        self.out.pop_front()
    }

    /// Whether there is something to do ([`Running::poll`]).
    pub(crate) fn has_output(&self) -> bool {
        !self.out.is_empty()
    }

    /// When [`Running::handle_timeout`] is due at the latest. (The event loop looks every 50 ms,
    /// as it always has, rather than waking at the deadline.)
    #[cfg(test)]
    pub(crate) fn poll_timeout(&self) -> Option<Instant> {
        if self.failed {
            return None;
        }
        [self.go_deadline, Some(self.hard_deadline), self.grace_until]
            .into_iter()
            .flatten()
            .min()
    }

    /// Whether every stream has ended (the report can be made), or the test has failed.
    pub(crate) fn is_over(&self) -> bool {
        self.failed || self.done.iter().all(|&d| d)
    }

    /// What the client's senders said they sent, per stream.
    pub(crate) fn client_sent(&self) -> &[Option<u64>] {
        &self.client_sent
    }

    /// The time is `now`: the deadlines that passed.
    pub(crate) fn handle_timeout(&mut self, now: Instant) {
        if self.is_over() {
            return;
        }
        if self.go_deadline.is_some_and(|d| now >= d) {
            return self.fail(format!("the client did not start within {JOIN_TIMEOUT:?}"));
        }
        if now >= self.hard_deadline {
            return self.fail("the test overran its planned end by a minute".into());
        }
        if self.grace_until.is_some_and(|g| now >= g) {
            self.grace_until = None;
            self.out.push_back(Action::StopReceivers);
        }
    }

    /// The agent is shutting down.
    pub(crate) fn shutting_down(&mut self) {
        if !self.is_over() {
            self.fail("the agent is shutting down".into());
        }
    }

    /// A control message from the client, at `now`.
    pub(crate) fn handle(&mut self, now: Instant, msg: ControlMsg) {
        if self.is_over() {
            return;
        }
        match msg {
            ControlMsg::SenderDone { streams } => {
                for s in streams {
                    let Some(i) = usize::try_from(s.stream)
                        .ok()
                        .filter(|&i| i < self.client_sent.len())
                    else {
                        continue;
                    };
                    // `-O`: the omit period's datagrams are sent too, before the test's.
                    let sent = s.packets.saturating_add(s.omitted_packets);
                    self.client_sent[i] = Some(sent);
                    self.out.push_back(Action::Expect {
                        stream: i,
                        packets: sent,
                    });
                }
                self.grace_until = Some(now + UDP_GRACE);
            }
            ControlMsg::Go => {
                self.go_deadline = None;
                self.out.push_back(Action::Go);
            }
            ControlMsg::Finish => self.out.push_back(Action::StopAll),
            ControlMsg::ClockProbe { client_send_ns } => {
                self.out.push_back(Action::AnswerClock { client_send_ns });
            }
            ControlMsg::Error { message } => self.fail(format!("the client reported: {message}")),
            _ => self.fail("unexpected control message from the client".into()),
        }
    }

    /// The control connection failed (`why`, as `ControlError` words it).
    pub(crate) fn handle_lost(&mut self, why: &str) {
        if !self.is_over() {
            self.fail(format!("control connection lost: {why}"));
        }
    }

    /// A reply could not be written: the control connection is gone.
    pub(crate) fn handle_write_failed(&mut self, why: Option<&str>) {
        if !self.failed {
            self.fail(why.map_or_else(
                || "control connection lost".into(),
                |w| format!("control connection lost: {w}"),
            ));
        }
    }

    /// Stream `i`'s loop ended; `failure` when it failed, and `stopped` whether it had been told
    /// to stop (a failure then is the end it was told to make).
    pub(crate) fn stream_ended(&mut self, i: usize, failure: Option<&str>, stopped: bool) {
        if self.failed || i >= self.done.len() {
            return;
        }
        if let Some(why) = failure {
            if !stopped {
                return self.fail(format!("stream {i}: {why}"));
            }
        }
        self.done[i] = true;
        let senders_done = (0..self.done.len())
            .filter(|&s| self.sends[s])
            .all(|s| self.done[s]);
        if self.sends.iter().any(|&s| s) && senders_done && !self.sender_done_sent {
            self.sender_done_sent = true;
            self.out.push_back(Action::SendSenderDone);
        }
    }

    fn fail(&mut self, why: String) {
        self.failed = true;
        self.out.push_back(Action::Fail(why));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sonde_wire::StreamStats;

    fn running(sends: &[bool]) -> (Instant, Running) {
        let now = Instant::now();
        let hard = now + Duration::from_secs(2) + OVERRUN;
        (now, Running::new(now, hard, sends.to_vec()))
    }

    fn drain(r: &mut Running) -> Vec<Action> {
        std::iter::from_fn(|| r.poll()).collect()
    }

    #[test]
    fn a_client_that_never_says_go_is_dropped_at_the_join_timeout() {
        let (now, mut r) = running(&[true]);
        assert_eq!(r.poll_timeout(), Some(now + JOIN_TIMEOUT));
        r.handle_timeout(now + JOIN_TIMEOUT - Duration::from_millis(1));
        assert!(drain(&mut r).is_empty());
        r.handle_timeout(now + JOIN_TIMEOUT);
        assert_eq!(
            drain(&mut r),
            [Action::Fail("the client did not start within 10s".into())]
        );
        assert!(r.is_over() && r.poll_timeout().is_none());
    }

    #[test]
    fn go_starts_the_senders_and_lifts_its_deadline() {
        let (now, mut r) = running(&[true, false]);
        r.handle(now, ControlMsg::Go);
        assert_eq!(drain(&mut r), [Action::Go]);
        r.handle_timeout(now + JOIN_TIMEOUT);
        assert!(drain(&mut r).is_empty());
        // A duplicate Go is only another Go (the senders took the first).
        r.handle(now, ControlMsg::Go);
        assert_eq!(drain(&mut r), [Action::Go]);
        // Nothing for the agent to send: no Go deadline at all.
        let (now, r) = running(&[false]);
        assert_eq!(
            r.poll_timeout(),
            Some(now + Duration::from_secs(2) + OVERRUN)
        );
    }

    #[test]
    fn a_test_past_its_end_by_a_minute_is_ended() {
        let (now, mut r) = running(&[false]);
        r.handle_timeout(now + Duration::from_secs(2) + OVERRUN);
        assert_eq!(
            drain(&mut r),
            [Action::Fail(
                "the test overran its planned end by a minute".into()
            )]
        );
    }

    #[test]
    fn sender_done_sets_each_receivers_expectation_and_the_grace() {
        let (now, mut r) = running(&[false, false]);
        let stats = |stream, packets| StreamStats {
            stream,
            packets,
            ..StreamStats::default()
        };
        r.handle(
            now,
            ControlMsg::SenderDone {
                // Stream 9 does not exist: ignored.
                streams: vec![stats(1, 70), stats(9, 5), stats(0, 50)],
            },
        );
        assert_eq!(
            drain(&mut r),
            [
                Action::Expect {
                    stream: 1,
                    packets: 70
                },
                Action::Expect {
                    stream: 0,
                    packets: 50
                }
            ]
        );
        assert_eq!(r.client_sent(), [Some(50), Some(70)]);
        assert_eq!(r.poll_timeout(), Some(now + UDP_GRACE));
        r.handle_timeout(now + UDP_GRACE);
        assert_eq!(drain(&mut r), [Action::StopReceivers]);
        r.handle_timeout(now + UDP_GRACE * 2);
        assert!(drain(&mut r).is_empty(), "stopped once");
    }

    #[test]
    fn finish_stops_everything_and_probes_are_answered() {
        let (now, mut r) = running(&[false]);
        r.handle(now, ControlMsg::ClockProbe { client_send_ns: 7 });
        r.handle(now, ControlMsg::Finish);
        assert_eq!(
            drain(&mut r),
            [Action::AnswerClock { client_send_ns: 7 }, Action::StopAll]
        );
    }

    #[test]
    fn an_error_an_unexpected_message_a_lost_connection_or_a_shutdown_end_the_test() {
        type Event = fn(&mut Running, Instant);
        let cases: [(Event, &str); 5] = [
            (
                |r, now| {
                    r.handle(
                        now,
                        ControlMsg::Error {
                            message: "disk full".into(),
                        },
                    );
                },
                "the client reported: disk full",
            ),
            (
                |r, now| r.handle(now, ControlMsg::Ready),
                "unexpected control message from the client",
            ),
            (
                |r, _| r.handle_lost("the peer closed the control connection"),
                "control connection lost: the peer closed the control connection",
            ),
            (
                |r, _| r.handle_write_failed(None),
                "control connection lost",
            ),
            (|r, _| r.shutting_down(), "the agent is shutting down"),
        ];
        for (event, why) in cases {
            let (now, mut r) = running(&[false]);
            event(&mut r, now);
            assert_eq!(drain(&mut r), [Action::Fail(why.into())]);
            // Nothing more is heard after the end.
            r.handle(now, ControlMsg::Go);
            r.stream_ended(0, None, false);
            assert!(drain(&mut r).is_empty());
        }
    }

    #[test]
    fn a_stream_that_fails_unasked_ends_the_test_and_one_told_to_stop_does_not() {
        let (_, mut r) = running(&[false, false]);
        r.stream_ended(0, Some("reset"), true);
        assert!(drain(&mut r).is_empty());
        assert!(!r.is_over());
        r.stream_ended(1, Some("reset"), false);
        assert_eq!(drain(&mut r), [Action::Fail("stream 1: reset".into())]);
    }

    #[test]
    fn sender_done_goes_once_when_the_last_agent_sender_ends() {
        let (_, mut r) = running(&[true, false, true]);
        r.stream_ended(0, None, false);
        r.stream_ended(1, None, false);
        assert!(drain(&mut r).is_empty());
        r.stream_ended(2, None, false);
        assert_eq!(drain(&mut r), [Action::SendSenderDone]);
        assert!(r.is_over());
        // A test where the agent sends nothing never says SenderDone.
        let (_, mut r) = running(&[false]);
        r.stream_ended(0, None, false);
        assert!(drain(&mut r).is_empty() && r.is_over());
    }
}
