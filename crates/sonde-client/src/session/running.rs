//! The control side of a running throughput or pps test at the client, as a state machine
//! without sockets, threads or clocks: the agent's `Interval`s, `SenderDone`, `Report` and
//! `Error`; this host's streams ending; Ctrl-C; the UDP grace and the test's hard end. It says
//! what the session's event loop (`Loop::drive`) must do: stop streams, expect so many
//! datagrams, show an interval, tell the agent `Finish` or `SenderDone`. The agent's side is
//! `sonde_agent`'s `conversation::running`.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use sonde_net::control::ControlError;
use sonde_wire::{AgentReport, ControlMsg, IntervalStats, StreamStats};

use crate::handshake::unexpected;
use crate::ClientError;

/// UDP receivers keep listening this long after the sender said it is done.
pub(crate) const UDP_GRACE: Duration = Duration::from_secs(1);

/// What the event loop must do, in order.
#[derive(Debug, PartialEq)]
pub(crate) enum Step {
    /// The UDP grace after the agent's `SenderDone` is over: this host's UDP receivers stop.
    StopReceivers,
    /// Ctrl-C: this host's senders stop as at the planned end...
    StopSenders,
    /// ...and the agent is told to stop its own streams and report.
    SendFinish,
    /// The agent's sender sent `packets` on stream `stream`: its receiver here expects no more.
    Expect { stream: usize, packets: u64 },
    /// The agent's interval, to complete and show.
    Interval(Box<IntervalStats>),
    /// Every sender of this host has ended: tell the agent what they sent.
    SendSenderDone,
}

/// The client's control side of one running test (see the module's documentation).
#[derive(Debug)]
pub(crate) struct Running {
    /// Per stream: whether this host sends on it, and whether its loop has ended.
    sends: Vec<bool>,
    done: Vec<bool>,
    sender_done_sent: bool,
    interrupted: bool,
    grace_until: Option<Instant>,
    /// The agent's senders' counts, from its `SenderDone`.
    agent_sent: Vec<StreamStats>,
    report: Option<AgentReport>,
    out: VecDeque<Step>,
}

impl Running {
    /// A test whose stream `i` this host sends on when `sends[i]`.
    pub(crate) fn new(sends: Vec<bool>) -> Self {
        let n = sends.len();
        Self {
            sends,
            done: vec![false; n],
            sender_done_sent: false,
            interrupted: false,
            grace_until: None,
            agent_sent: Vec::new(),
            report: None,
            out: VecDeque::new(),
        }
    }

    /// The next thing to do.
    pub(crate) fn poll(&mut self) -> Option<Step> {
        self.out.pop_front()
    }

    /// Whether the agent's report has come.
    pub(crate) fn has_report(&self) -> bool {
        self.report.is_some()
    }

    /// The agent's report and its senders' counts, once the test is over.
    pub(crate) fn finish(self) -> (Option<AgentReport>, Vec<StreamStats>) {
        (self.report, self.agent_sent)
    }

    /// The time is `now`; the test must be over by `hard_deadline`.
    ///
    /// # Errors
    /// The test overran its planned end.
    pub(crate) fn handle_timeout(
        &mut self,
        now: Instant,
        hard_deadline: Instant,
    ) -> Result<(), ClientError> {
        if now >= hard_deadline {
            return Err(ClientError::Remote(
                "the test overran its planned end".into(),
            ));
        }
        if self.grace_until.is_some_and(|g| now >= g) {
            self.grace_until = None;
            self.out.push_back(Step::StopReceivers);
        }
        Ok(())
    }

    /// The caller's interrupt flag is up (Ctrl-C, SIGTERM): the test stops early, as its
    /// planned end would.
    pub(crate) fn interrupt(&mut self) {
        if !self.interrupted {
            self.interrupted = true;
            self.out.push_back(Step::StopSenders);
            self.out.push_back(Step::SendFinish);
        }
    }

    /// A control message from the agent, at `now`.
    ///
    /// # Errors
    /// The agent reported an error, or sent what has no place in a running test.
    pub(crate) fn handle(&mut self, now: Instant, msg: ControlMsg) -> Result<(), ClientError> {
        match msg {
            ControlMsg::Interval(iv) => self.out.push_back(Step::Interval(Box::new(iv))),
            ControlMsg::SenderDone { streams } => {
                for s in &streams {
                    if let Some(stream) = usize::try_from(s.stream)
                        .ok()
                        .filter(|&i| i < self.sends.len())
                    {
                        // `-O`: the omit period's datagrams were sent too, before the test's.
                        self.out.push_back(Step::Expect {
                            stream,
                            packets: s.packets.saturating_add(s.omitted_packets),
                        });
                    }
                }
                self.agent_sent = streams;
                self.grace_until = Some(now + UDP_GRACE);
            }
            ControlMsg::Report(r) => self.report = Some(r),
            ControlMsg::Error { message } => return Err(ClientError::Remote(message)),
            other => return Err(unexpected(&other, "test progress")),
        }
        Ok(())
    }

    /// The control connection failed or closed.
    ///
    /// # Errors
    /// Unless the agent's report has come (the agent closes after it), the test has failed.
    pub(crate) fn handle_lost(&mut self, e: ControlError) -> Result<(), ClientError> {
        if self.report.is_some() {
            return Ok(());
        }
        Err(match e {
            ControlError::Closed => {
                ClientError::Remote("the agent closed the control connection mid-test".into())
            }
            e => ClientError::Control(e),
        })
    }

    /// This host's stream `i` ended.
    pub(crate) fn stream_ended(&mut self, i: usize) {
        let Some(done) = self.done.get_mut(i) else {
            return;
        };
        *done = true;
        let senders_done = (0..self.done.len())
            .filter(|&s| self.sends[s])
            .all(|s| self.done[s]);
        if self.sends.iter().any(|&s| s) && senders_done && !self.sender_done_sent {
            self.sender_done_sent = true;
            self.out.push_back(Step::SendSenderDone);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn drain(r: &mut Running) -> Vec<Step> {
        std::iter::from_fn(|| r.poll()).collect()
    }

    #[test]
    fn the_test_fails_at_its_hard_end_and_not_before() {
        let now = Instant::now();
        let mut r = Running::new(vec![true]);
        let end = now + Duration::from_secs(5);
        assert!(r
            .handle_timeout(end - Duration::from_millis(1), end)
            .is_ok());
        match r.handle_timeout(end, end) {
            Err(ClientError::Remote(m)) => assert_eq!(m, "the test overran its planned end"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn the_agents_sender_done_sets_expectations_and_stops_udp_receivers_after_the_grace() {
        let now = Instant::now();
        let far = now + Duration::from_secs(60);
        let mut r = Running::new(vec![false, false]);
        let stats = |stream, packets| StreamStats {
            stream,
            packets,
            ..StreamStats::default()
        };
        r.handle(
            now,
            ControlMsg::SenderDone {
                streams: vec![stats(0, 10), stats(5, 1), stats(1, 20)],
            },
        )
        .unwrap();
        assert_eq!(
            drain(&mut r),
            [
                Step::Expect {
                    stream: 0,
                    packets: 10
                },
                Step::Expect {
                    stream: 1,
                    packets: 20
                }
            ]
        );
        r.handle_timeout(now + UDP_GRACE - Duration::from_millis(1), far)
            .unwrap();
        assert!(drain(&mut r).is_empty());
        r.handle_timeout(now + UDP_GRACE, far).unwrap();
        assert_eq!(drain(&mut r), [Step::StopReceivers]);
        r.handle_timeout(now + UDP_GRACE * 2, far).unwrap();
        assert!(drain(&mut r).is_empty());
        assert_eq!(r.finish().1.len(), 3, "the agent's counts as it sent them");
    }

    #[test]
    fn ctrl_c_stops_this_hosts_senders_and_asks_the_agent_to_finish_once() {
        let mut r = Running::new(vec![true]);
        r.interrupt();
        r.interrupt();
        assert_eq!(drain(&mut r), [Step::StopSenders, Step::SendFinish]);
    }

    #[test]
    fn intervals_pass_on_and_errors_or_strays_end_the_test() {
        let now = Instant::now();
        let mut r = Running::new(vec![false]);
        r.handle(now, ControlMsg::Interval(IntervalStats::default()))
            .unwrap();
        assert!(matches!(drain(&mut r)[..], [Step::Interval(_)]));
        match r.handle(
            now,
            ControlMsg::Error {
                message: "the agent is shutting down".into(),
            },
        ) {
            Err(ClientError::Remote(m)) => assert_eq!(m, "the agent is shutting down"),
            other => panic!("{other:?}"),
        }
        match r.handle(now, ControlMsg::Ready) {
            Err(ClientError::Protocol(m)) => {
                assert_eq!(m, "the agent sent `ready` where test progress was due");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_close_after_the_report_is_expected_and_before_it_is_a_failure() {
        let now = Instant::now();
        let mut r = Running::new(vec![false]);
        match r.handle_lost(ControlError::Closed) {
            Err(ClientError::Remote(m)) => {
                assert_eq!(m, "the agent closed the control connection mid-test");
            }
            other => panic!("{other:?}"),
        }
        r.handle(now, ControlMsg::Report(AgentReport::default()))
            .unwrap();
        assert!(r.has_report());
        assert!(r.handle_lost(ControlError::Closed).is_ok());
    }

    #[test]
    fn sender_done_goes_once_when_this_hosts_last_sender_ends() {
        let mut r = Running::new(vec![true, false, true]);
        r.stream_ended(2);
        r.stream_ended(1);
        assert!(drain(&mut r).is_empty());
        r.stream_ended(0);
        assert_eq!(drain(&mut r), [Step::SendSenderDone]);
        r.stream_ended(0);
        assert!(drain(&mut r).is_empty());
        // Nothing sent from here: no SenderDone.
        let mut r = Running::new(vec![false]);
        r.stream_ended(0);
        assert!(drain(&mut r).is_empty());
    }
}
