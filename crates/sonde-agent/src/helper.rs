//! Helper requests (`--from`): an authenticated client asks this agent to run a test against a
//! third host, another sonde agent, itself.
//!
//! This is the only way the agent sends traffic to an address other than the one that opened
//! the control connection, so it is refused unless the agent was started with `--helper` *and*
//! a shared secret, and the request proves that secret (the proof covers the target and the
//! test, on this connection's nonces: a replayed request meets another agent nonce and fails).
//! The agent's limits apply to the test as to one of its own sessions (duration, streams,
//! message size, `--max-bitrate`), and it counts as a session (`--max-sessions`, per source).
//!
//! The test itself is run by a [`HelperRunner`] the binary injects (sonde's client, which this
//! crate must not depend on): it makes the normal client handshake with the target, with this
//! agent's secret, and sends nothing before the target has admitted the session. Then:
//!
//! 1. the agent tells the requester `HelperReady` and answers its `ClockProbe`s on the host
//!    clock (so the requester can estimate this host's clock offset), until `HelperGo` names
//!    the moment to start, on this host's clock;
//! 2. the runner waits for that moment, runs the test, and the agent sends the result document
//!    (`HelperResult`, with when the data started) or why it failed (`HelperFailed`).

use std::net::{SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sonde_net::control::{read_frame, write_frame};
use sonde_net::latency::host_clock_ns;
use sonde_wire::{ControlMsg, HelperTest, HELPER_RESULT_PART};

use crate::{AgentEvent, Shared};

/// How long the requester has, once told `HelperReady`, to name the start (clock probes
/// included): it waits for every other helper to be ready too, each of which makes its own
/// handshake with the target first. (A target that sends, a reverse test, wants the start
/// within its own 10 s of `Ready`, and says so.)
const GO_TIMEOUT: Duration = Duration::from_secs(30);
/// The latest start a requester may name, from when it names it.
const MAX_START_DELAY: Duration = Duration::from_secs(10);
/// How often the agent looks whether the requester is still there while the test runs.
const WATCH_EVERY: Duration = Duration::from_millis(100);
/// Clock probes a requester may make before `HelperGo`.
const MAX_CLOCK_PROBES: u32 = 64;

/// A test a requester asked this agent to run against a third host.
#[derive(Debug, Clone)]
pub struct HelperJob {
    /// The target as the requester wrote it (`HOST`, `HOST:PORT`).
    pub target: String,
    /// The test.
    pub test: HelperTest,
    /// This agent's shared secret: the runner proves it to the target.
    pub secret: sonde_wire::auth::Secret,
}

/// Why a helper's test did not produce a result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelperFailure {
    /// The exit code the runner's client would end with (3 unreachable, 4 refused, 1 failed).
    pub exit_code: u8,
    /// What went wrong, for a person.
    pub message: String,
}

/// What a helper's test produced.
#[derive(Debug, Clone)]
pub struct HelperOutcome {
    /// The result document, JSON.
    pub result: String,
    /// When the data started (the runner's `Go` to the target, and its own first sends).
    pub started: Instant,
}

/// Runs a helper's test against its target (sonde's client, injected by the binary).
pub trait HelperRunner: Send + Sync {
    /// Runs `job`: the client handshake with the target (its admission and data channels, no
    /// data yet), then `ready()`, which returns when to start the data (`None`: give up without
    /// sending any), then the test. `stop` is raised when the agent shuts down.
    ///
    /// # Errors
    /// The target could not be reached, refused, or the test failed.
    fn run(
        &self,
        job: &HelperJob,
        ready: &mut dyn FnMut() -> Option<Instant>,
        stop: &AtomicBool,
    ) -> Result<HelperOutcome, HelperFailure>;
}

/// The runner an agent started with `--helper` uses ([`crate::AgentConfig::helper`]).
#[derive(Clone)]
pub struct Helper(pub Arc<dyn HelperRunner>);

impl std::fmt::Debug for Helper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Helper(..)")
    }
}

/// Serves an admitted `Help` request from `peer` on `ctrl` to its end (the conversation has
/// checked it: the agent is a helper with a secret, the request proves it, the test is within
/// the limits, and it holds a place among the agent's sessions).
pub(crate) fn serve(
    mut ctrl: TcpStream,
    shared: &Arc<Shared>,
    peer: SocketAddr,
    target: String,
    test: HelperTest,
) {
    let (Some(runner), Some(secret)) = (shared.cfg.helper.clone(), shared.cfg.secret.clone())
    else {
        return;
    };
    shared.report(|| AgentEvent::HelperAdmitted {
        peer: peer.to_string(),
        test: crate::control::describe(&test.spec),
        target: target.clone(),
    });
    let job = HelperJob {
        target,
        test,
        secret,
    };
    let mut body = Vec::new();
    // Raised when the agent shuts down or the requester goes away (Ctrl-C, a lost connection):
    // the test then ends early, as its planned end would.
    let stop = AtomicBool::new(false);
    let watching = AtomicBool::new(true);
    // Set once the requester has named the start: from then on it sends nothing, and the
    // watcher may peek at the connection (peeking switches the shared socket to non-blocking for
    // a moment, which must not meet this thread's reads and writes).
    let armed = AtomicBool::new(false);
    let outcome = std::thread::scope(|scope| {
        let watcher = ctrl.try_clone().ok();
        let (stop, watching, armed) = (&stop, &watching, &armed);
        scope.spawn(move || {
            while watching.load(Ordering::Relaxed) {
                let gone = armed.load(Ordering::Acquire)
                    && watcher.as_ref().is_none_or(crate::control::peer_gone);
                if gone || shared.shutdown.load(Ordering::Relaxed) {
                    stop.store(true, Ordering::Relaxed);
                    return;
                }
                std::thread::sleep(WATCH_EVERY);
            }
        });
        let mut ready = || {
            let start = wait_for_go(&mut ctrl, &mut body);
            armed.store(true, Ordering::Release);
            start
        };
        let outcome = runner.0.run(&job, &mut ready, stop);
        watching.store(false, Ordering::Relaxed);
        outcome
    });
    // The watcher has ended (the scope joined it): the connection is this thread's again.
    let sent = match outcome {
        Ok(o) => {
            let ago = u64::try_from(o.started.elapsed().as_nanos()).unwrap_or(u64::MAX);
            send_result(&mut ctrl, &o.result, host_clock_ns().saturating_sub(ago))
        }
        Err(f) => write_frame(
            &mut ctrl,
            &ControlMsg::HelperFailed {
                exit_code: f.exit_code,
                message: f.message,
            },
        ),
    };
    if let Err(e) = sent {
        shared.report(|| AgentEvent::HelperResultLost {
            peer: peer.to_string(),
            error: e.to_string(),
        });
    }
    shared.report(|| AgentEvent::HelperEnded {
        peer: peer.to_string(),
        target: job.target.clone(),
    });
}

/// Sends the result document in pieces that each fit a frame, then `HelperResult`.
fn send_result(
    ctrl: &mut TcpStream,
    json: &str,
    started_host_ns: u64,
) -> Result<(), sonde_net::control::ControlError> {
    let mut rest = json;
    while !rest.is_empty() {
        let mut cut = rest.len().min(HELPER_RESULT_PART);
        while !rest.is_char_boundary(cut) {
            cut -= 1;
        }
        let (part, tail) = rest.split_at(cut);
        write_frame(
            ctrl,
            &ControlMsg::HelperResultPart {
                json: part.to_owned(),
            },
        )?;
        rest = tail;
    }
    write_frame(ctrl, &ControlMsg::HelperResult { started_host_ns })
}

/// Tells the requester the target is ready, answers its clock probes, and returns the moment it
/// names to start; `None` when it goes away, says something else, takes too long, or names a
/// moment too far ahead. The socket loop around [`StartWait`].
fn wait_for_go(ctrl: &mut TcpStream, body: &mut Vec<u8>) -> Option<Instant> {
    write_frame(ctrl, &ControlMsg::HelperReady).ok()?;
    let mut wait = StartWait::new(Instant::now());
    loop {
        let msg = read_frame(ctrl, body, wait.deadline()).ok()?;
        match wait.handle(&msg, || (Instant::now(), host_clock_ns())) {
            Heard::Probe { client_send_ns } => {
                let agent_receive_ns = host_clock_ns();
                let reply = ControlMsg::ClockReply {
                    client_send_ns,
                    agent_receive_ns,
                    agent_send_ns: host_clock_ns(),
                };
                write_frame(ctrl, &reply).ok()?;
                if wait.probes_spent() {
                    return None;
                }
            }
            Heard::Start(at) => return at,
        }
    }
}

/// The requester's part between `HelperReady` and `HelperGo`, without sockets or clocks: clock
/// probes (at most [`MAX_CLOCK_PROBES`] and one more), all by [`GO_TIMEOUT`], then the start.
#[derive(Debug)]
struct StartWait {
    deadline: Instant,
    /// Messages read so far.
    heard: u32,
}

/// What a requester's message means while the agent waits for its start.
#[derive(Debug, PartialEq, Eq)]
enum Heard {
    /// Answer this clock probe.
    Probe { client_send_ns: u64 },
    /// The start: when (`None`: too far ahead, or not a start at all: give up).
    Start(Option<Instant>),
}

impl StartWait {
    /// `HelperReady` went out at `now`.
    fn new(now: Instant) -> Self {
        Self {
            deadline: now + GO_TIMEOUT,
            heard: 0,
        }
    }

    /// By when the requester must have named the start.
    fn deadline(&self) -> Instant {
        self.deadline
    }

    /// Whether the requester has used every read it had (the last one a probe, answered).
    fn probes_spent(&self) -> bool {
        self.heard > MAX_CLOCK_PROBES
    }

    /// A message from the requester; `clocks` reads the monotonic and the host clock when a
    /// start has to be placed on them.
    fn handle(&mut self, msg: &ControlMsg, clocks: impl FnOnce() -> (Instant, u64)) -> Heard {
        self.heard += 1;
        match *msg {
            ControlMsg::ClockProbe { client_send_ns } => Heard::Probe { client_send_ns },
            ControlMsg::HelperGo { start_host_ns } => {
                let (now, host_now) = clocks();
                let ahead = Duration::from_nanos(start_host_ns.saturating_sub(host_now));
                Heard::Start((ahead <= MAX_START_DELAY).then_some(now + ahead))
            }
            _ => Heard::Start(None),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probes_are_answered_until_the_requester_names_its_start() {
        let t0 = Instant::now();
        let mut wait = StartWait::new(t0);
        assert_eq!(wait.deadline(), t0 + GO_TIMEOUT);
        let probe = ControlMsg::ClockProbe { client_send_ns: 5 };
        assert_eq!(
            wait.handle(&probe, || unreachable!("no clock read for a probe")),
            Heard::Probe { client_send_ns: 5 }
        );
        assert!(!wait.probes_spent());
        // 2 s ahead on the host clock is 2 s ahead on the monotonic one.
        let go = ControlMsg::HelperGo {
            start_host_ns: 7_000_000_000,
        };
        assert_eq!(
            wait.handle(&go, || (t0, 5_000_000_000)),
            Heard::Start(Some(t0 + Duration::from_secs(2)))
        );
    }

    #[test]
    fn a_start_too_far_ahead_or_in_the_past_or_another_message_is_judged() {
        let t0 = Instant::now();
        let go = |ns| ControlMsg::HelperGo { start_host_ns: ns };
        let limit = u64::try_from(MAX_START_DELAY.as_nanos()).unwrap();
        assert_eq!(
            StartWait::new(t0).handle(&go(limit + 1), || (t0, 0)),
            Heard::Start(None)
        );
        assert_eq!(
            StartWait::new(t0).handle(&go(limit), || (t0, 0)),
            Heard::Start(Some(t0 + MAX_START_DELAY))
        );
        // A moment already past: at once.
        assert_eq!(
            StartWait::new(t0).handle(&go(1), || (t0, 9)),
            Heard::Start(Some(t0))
        );
        assert_eq!(
            StartWait::new(t0).handle(&ControlMsg::Finish, || (t0, 0)),
            Heard::Start(None)
        );
    }

    #[test]
    fn a_requester_gets_at_most_sixty_five_probes_answered() {
        let mut wait = StartWait::new(Instant::now());
        for n in 1..=MAX_CLOCK_PROBES + 1 {
            let probe = ControlMsg::ClockProbe {
                client_send_ns: u64::from(n),
            };
            assert!(matches!(
                wait.handle(&probe, || unreachable!()),
                Heard::Probe { .. }
            ));
            assert_eq!(wait.probes_spent(), n > MAX_CLOCK_PROBES, "after {n}");
        }
    }
}
