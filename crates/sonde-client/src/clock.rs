//! `--one-way`: the agent clock's offset, estimated NTP-style over the control channel while a
//! latency test runs.
//!
//! Before the first probe the client makes [`INITIAL_EXCHANGES`] exchanges back to back
//! (`ClockProbe` with `t1`, the agent's `ClockReply` with `t2` and `t3`, `t4` on receipt), so
//! that the loop has a model to convert with from its first message; then a burst of [`BURST`]
//! every [`EXCHANGE_EVERY`] for the rest of the test, to follow drift (the first of a burst wakes
//! the threads on both ends, which on a busy host takes longer than the path; the others find
//! them awake). The latency loop offers the cleanest probe of each second too (probes are
//! four-timestamp exchanges as well, and on an idle path often cleaner than the control
//! channel's, which crosses a thread in the agent).
//!
//! After every burst the estimate ([`sonde_engine::offset::OffsetEstimator`]: the best
//! exchange per second, a straight line through the clean ones) is refitted and sent to the
//! loop as a [`LinearOffset`].
//!
//! Client times are the test clock plus the host clock's reading at its origin, measured once
//! ([`map_clocks`]); the agent stamps with its host clock ([`sonde_net::latency::host_clock_ns`]).
//! On one host the two are the same clock, so the estimated offset is 0 within its bound.
//!
//! The control channel is otherwise idle during a latency test, so this thread has it to
//! itself until the loop ends; every exchange it starts it finishes (or fails the test), so
//! that no stray reply is left for the report to trip on.

use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{sync_channel, Receiver, SyncSender};
use std::thread;
use std::time::{Duration, Instant};

use sonde_engine::offset::{Exchange, OffsetEstimator};
use sonde_engine::oneway::LinearOffset;
use sonde_net::control::{read_frame, write_frame};
use sonde_net::cpu::ThreadsMeter;
use sonde_net::latency::{host_clock_ns, LatencyOutcome, OneWayLink};
use sonde_net::Clock;
use sonde_wire::ControlMsg;

use crate::ClientError;

/// Exchanges before the loop starts.
pub(crate) const INITIAL_EXCHANGES: u32 = 8;
/// A burst of exchanges this often while the test runs.
pub(crate) const EXCHANGE_EVERY: Duration = Duration::from_millis(100);
/// Exchanges per burst, back to back: the first wakes the threads on both ends (on a busy host
/// that alone can take longer than the path), the ones after it find them awake.
pub(crate) const BURST: u32 = 3;
/// The estimator keeps the cleanest exchange of each window this long.
const WINDOW: Duration = Duration::from_secs(1);
/// How long an exchange may take before the test fails.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// Probes the loop may have offered and not yet been taken (one a second).
const PROBE_QUEUE: usize = 1_024;
/// Models sent and not yet taken by the loop.
const MODEL_QUEUE: usize = 64;

/// The host clock minus the test clock, ns, and how far that can be off (half the time the
/// reading took, rounded up). The tightest of a few readings: one that was preempted between
/// its two host-clock reads would widen every one-way bound by microseconds.
pub(crate) fn map_clocks(clock: &Clock) -> (u64, u64) {
    (0..MAP_READINGS)
        .map(|_| {
            let a = host_clock_ns();
            let t = clock.now_ns();
            let b = host_clock_ns();
            let mid = a + (b.saturating_sub(a)) / 2;
            (mid.saturating_sub(t), b.saturating_sub(a) / 2 + 1)
        })
        .min_by_key(|&(_, error)| error)
        .unwrap_or((0, u64::MAX))
}

/// Readings [`map_clocks`] takes.
const MAP_READINGS: usize = 8;

/// The client's end of the control channel while the loop runs.
struct Sync<'a> {
    ctrl: &'a mut TcpStream,
    body: &'a mut Vec<u8>,
    clock: &'a Clock,
    host_minus_test_ns: u64,
    est: OffsetEstimator,
    exchanges: u64,
}

impl Sync<'_> {
    /// The client's time on the host clock, via the test clock (as the loop computes it).
    fn now(&self) -> u64 {
        self.clock.now_ns().saturating_add(self.host_minus_test_ns)
    }

    /// One exchange over the control channel, into the estimate.
    fn exchange(&mut self) -> Result<(), ClientError> {
        let t1 = self.now();
        write_frame(self.ctrl, &ControlMsg::ClockProbe { client_send_ns: t1 })?;
        let reply = read_frame(self.ctrl, self.body, Instant::now() + REPLY_TIMEOUT)?;
        let t4 = self.now();
        match reply {
            ControlMsg::ClockReply {
                client_send_ns,
                agent_receive_ns,
                agent_send_ns,
            } if client_send_ns == t1 => {
                self.exchanges += 1;
                self.est.add(Exchange {
                    client_send_ns: t1,
                    agent_receive_ns,
                    agent_send_ns,
                    client_receive_ns: t4,
                });
                Ok(())
            }
            ControlMsg::ClockReply { .. } => Err(ClientError::Protocol(
                "the agent answered a clock probe that was not sent".into(),
            )),
            ControlMsg::Error { message } => Err(ClientError::Remote(message)),
            _ => Err(ClientError::Protocol(
                "the agent sent something else where a clock reply was due".into(),
            )),
        }
    }

    /// Takes the probes the loop offered, refits, and sends the loop the new model.
    fn refit(&mut self, probes: &Receiver<Exchange>, models: &SyncSender<LinearOffset>) {
        while let Ok(ex) = probes.try_recv() {
            self.est.add(ex);
        }
        if let Some(fit) = self.est.fit() {
            let _ = models.try_send(LinearOffset::from_fit(&fit, self.now()));
        }
    }
}

/// Runs `run` (the latency loop, given its end of the clock sync) while this thread keeps the
/// clock estimate, and puts the final estimate into the outcome's `one_way`. The keeper thread
/// counts its CPU in `cpu`.
///
/// # Errors
/// [`ClientError::Remote`] when the agent does not take clock probes (an older agent ends the
/// test), [`ClientError::Control`] or [`ClientError::Protocol`] when an exchange fails; a
/// failure of `run` itself as [`ClientError::Data`].
pub(crate) fn with_sync(
    ctrl: &mut TcpStream,
    body: &mut Vec<u8>,
    clock: &Clock,
    stop: &AtomicBool,
    cpu: Option<&ThreadsMeter>,
    run: impl FnOnce(OneWayLink) -> std::io::Result<LatencyOutcome>,
) -> Result<LatencyOutcome, ClientError> {
    let (host_minus_test_ns, mapping_error_ns) = map_clocks(clock);
    let mut sync = Sync {
        ctrl,
        body,
        clock,
        host_minus_test_ns,
        est: OffsetEstimator::new(WINDOW),
        exchanges: 0,
    };
    for _ in 0..INITIAL_EXCHANGES {
        sync.exchange().map_err(|e| match e {
            ClientError::Remote(m) => ClientError::Remote(format!(
                "{m} (--one-way needs an agent that answers clock probes: sonde 0.1 with one-way \
                 support on the other end)"
            )),
            e => e,
        })?;
    }
    let (model_tx, models) = sync_channel(MODEL_QUEUE);
    let (probes, probe_rx) = sync_channel(PROBE_QUEUE);
    sync.refit(&probe_rx, &model_tx);
    let done = AtomicBool::new(false);
    let (outcome, synced, probe_rx) = thread::scope(|s| {
        let sync = &mut sync;
        let (done, model_tx) = (&done, &model_tx);
        // The receiver goes to the keeper and comes back with it: the last probe is taken
        // after the loop ends.
        let keeper = s.spawn(move || {
            let _counted = cpu.map(ThreadsMeter::track);
            let mut next = Instant::now() + EXCHANGE_EVERY;
            let result = (|| {
                while !done.load(Ordering::Relaxed) && !stop.load(Ordering::Relaxed) {
                    let now = Instant::now();
                    if now < next {
                        thread::sleep((next - now).min(Duration::from_millis(10)));
                        continue;
                    }
                    next = now + EXCHANGE_EVERY;
                    for _ in 0..BURST {
                        sync.exchange()?;
                    }
                    sync.refit(&probe_rx, model_tx);
                }
                Ok(())
            })();
            if result.is_err() {
                // No estimate can follow: end the loop rather than run it out for nothing.
                stop.store(true, Ordering::Relaxed);
            }
            (result, probe_rx)
        });
        let outcome = run(OneWayLink {
            models,
            probes,
            host_minus_test_ns,
        });
        done.store(true, Ordering::Relaxed);
        match keeper.join() {
            Ok((synced, probe_rx)) => (outcome, synced, Some(probe_rx)),
            Err(_) => (
                outcome,
                Err(ClientError::Protocol(
                    "internal: the clock sync panicked".into(),
                )),
                None,
            ),
        }
    });
    // The loop's outcome explains a broken control channel better than the other way round.
    let mut outcome = outcome.map_err(|e| ClientError::Data(e, 0))?;
    synced?;
    // The last window's probe, offered when the loop ended.
    for ex in probe_rx.iter().flat_map(Receiver::try_iter) {
        sync.est.add(ex);
    }
    if let Some(ow) = &mut outcome.one_way {
        ow.fit = sync.est.fit();
        ow.control_exchanges = sync.exchanges;
        ow.host_minus_test_ns = host_minus_test_ns;
        ow.extra_uncertainty_ns = mapping_error_ns;
    }
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_test_clock_maps_onto_the_host_clock() {
        let clock = Clock::start();
        let (host_minus_test, error) = map_clocks(&clock);
        assert!(error >= 1);
        let host = host_clock_ns();
        let mapped = clock.now_ns() + host_minus_test;
        // The mapping holds to within its error, plus the time between the two reads here.
        assert!(
            mapped.abs_diff(host) < error + 1_000_000,
            "{mapped} vs {host}"
        );
    }
}
