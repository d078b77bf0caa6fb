//! Latency's inner view on the client: the full sample log, kernel timestamps and one-way delay
//! (`--full-log`, `--timestamps`, `--one-way`) around sonde's own ping loops.
//!
//! [`check`] runs before the session opens, so that a log file that cannot be created or a
//! message too small for one-way stamps is a usage error, not a failed test. [`ping`] runs the
//! loop with the views asked for: it creates the log and its writer thread, runs the clock
//! synchronisation beside the loop for one-way delay ([`crate::clock`]), and puts the log's
//! summary into the outcome. Without any of them it runs the plain loop, exactly as before.
//!
//! The log and the kernel timestamps are the client's own measurements and need nothing from
//! the peer: [`with_view`] sets them up around any loop, so the client of a `sockperf server`
//! ([`crate::sockperf`]) gets them in sockperf framing. Only one-way delay needs the agent.

use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use sonde_net::cpu::ThreadsMeter;

use sonde_net::latency::{self, Framing, InnerView, LatencyOutcome, PingConfig};
use sonde_net::samplelog::SampleLog;
use sonde_net::Clock;
use sonde_wire::stamps::ONE_WAY_MIN_MSG;

use sonde_report::{ClockEstimate, FullLog, HistogramBucket, OneWay, SignedNs, SocketRtt, Warning};

use crate::run::ClientChannel;
use crate::{ClientError, LatencyOptions};

/// Samples that may wait for the log's writer: about two seconds of a fast closed loop
/// (the queue holds 80-byte samples: 10 MiB).
pub(crate) const LOG_QUEUE: usize = 131_072;

/// The options' inner-view part makes sense, and the log file can be created. Runs before
/// anything is sent.
///
/// # Errors
/// [`ClientError::Usage`] (exit code 2) saying what to change.
pub(crate) fn check(opt: &LatencyOptions) -> Result<(), ClientError> {
    if opt.one_way && opt.msg_size < ONE_WAY_MIN_MSG {
        return Err(ClientError::Usage(format!(
            "--one-way needs messages of at least {ONE_WAY_MIN_MSG} bytes: the agent writes its \
             receive and send times (8 bytes each, after 8 of sequence number) into every reply; \
             use -m {ONE_WAY_MIN_MSG} or more (-m is {})",
            opt.msg_size
        )));
    }
    if let Some(path) = &opt.full_log {
        create_log_file(path)?;
    }
    Ok(())
}

fn create_log_file(path: &Path) -> Result<(), ClientError> {
    std::fs::File::create(path).map(drop).map_err(|e| {
        ClientError::Usage(format!("--full-log: cannot create {}: {e}", path.display()))
    })
}

/// Runs sonde's ping loop on the session's data channel with the inner view `opt` asks for.
/// `ctrl` and `body` are the session's control connection, used for the clock exchanges of
/// `--one-way` (idle otherwise while the loop runs). The threads the run starts (the open
/// loop's sender, the clock keeper) count their CPU in `cpu`; the calling thread is the
/// caller's to count.
///
/// # Errors
/// [`ClientError::Data`] for a failed loop; [`ClientError::Usage`] when the log cannot be
/// created; the clock synchronisation's errors ([`crate::clock::with_sync`]).
// The session's parts, the loop's configuration and the run's clock, stop flag and meter: one
// call site, and a struct to carry them would only rename them.
#[allow(clippy::too_many_arguments)]
pub(crate) fn ping(
    ctrl: &mut TcpStream,
    body: &mut Vec<u8>,
    channel: &ClientChannel,
    cfg: &PingConfig,
    opt: &LatencyOptions,
    clock: &Clock,
    stop: &AtomicBool,
    cpu: &Arc<ThreadsMeter>,
    intervals: Option<latency::IntervalView>,
) -> Result<LatencyOutcome, ClientError> {
    with_view(opt, Some(Arc::clone(cpu)), intervals, |view| {
        let run = |view: InnerView| match channel {
            ClientChannel::Tcp(s) => latency::ping(s, cfg, Framing::Sonde, view, clock, stop),
            ClientChannel::Udp(s) => latency::ping(s, cfg, Framing::Sonde, view, clock, stop),
        };
        if opt.one_way {
            crate::clock::with_sync(ctrl, body, clock, stop, Some(cpu), |link| {
                run(InnerView {
                    one_way: Some(link),
                    ..view
                })
            })
        } else {
            run(view).map_err(|e| ClientError::Data(e, 0))
        }
    })
}

/// Runs `run` (a ping loop) with the part of the inner view that needs nothing from the peer:
/// the full log `opt.full_log` asks for (created here, with its writer thread) and
/// `opt.timestamps`. `view.one_way` is `None`; a caller that synchronises clocks sets it. The
/// log's summary goes into the outcome once the loop has returned.
///
/// # Errors
/// [`ClientError::Usage`] when the log cannot be created; `run`'s errors.
pub(crate) fn with_view(
    opt: &LatencyOptions,
    cpu: Option<Arc<ThreadsMeter>>,
    intervals: Option<latency::IntervalView>,
    run: impl FnOnce(InnerView) -> Result<LatencyOutcome, ClientError>,
) -> Result<LatencyOutcome, ClientError> {
    let log = match &opt.full_log {
        Some(path) => Some(SampleLog::create(path, LOG_QUEUE).map_err(|e| {
            ClientError::Usage(format!("--full-log: cannot create {}: {e}", path.display()))
        })?),
        None => None,
    };
    let outcome = run(InnerView {
        log: log.as_ref().map(SampleLog::sender),
        timestamps: opt.timestamps,
        one_way: None,
        cpu,
        intervals,
    });
    // The loop has dropped its sender: the writer drains what is queued and stops.
    let summary = log.map(|log| {
        let path = opt.full_log.as_deref().unwrap_or(Path::new(""));
        log.finish().into_summary(path)
    });
    let mut outcome = outcome?;
    outcome.log = summary;
    Ok(outcome)
}

// ---------------------------------------------------------------------------------------------
// Into the result document

fn signed_ns(s: &sonde_engine::oneway::SignedSummary) -> Option<SignedNs> {
    if s.samples == 0 {
        return None;
    }
    let at = |p: f64| {
        s.percentiles
            .iter()
            .find(|x| (x.0 - p).abs() < 1e-9)
            .and_then(|x| x.1)
    };
    Some(SignedNs {
        min: s.min_ns,
        mean: s.mean_ns,
        stddev: s.stddev_ns,
        p50: at(50.0),
        p90: at(90.0),
        p99: at(99.0),
        p999: at(99.9),
        p9999: at(99.99),
        p99999: at(99.999),
        max: s.max_ns,
    })
}

/// The most buckets `--histogram` shows (4 per octave up to 12 octaves).
const HISTOGRAM_BUCKETS: usize = 48;

/// `rtt_histogram`, when asked for.
pub(crate) fn histogram(o: &LatencyOutcome, opt: &LatencyOptions) -> Option<Vec<HistogramBucket>> {
    opt.histogram.then(|| {
        o.rtt
            .log_buckets(HISTOGRAM_BUCKETS)
            .into_iter()
            .map(|b| HistogramBucket {
                le_ns: b.le_ns,
                count: b.count,
            })
            .collect()
    })
}

/// `full_log`, and a warning for a log with holes.
pub(crate) fn full_log(o: &LatencyOutcome, warnings: &mut Vec<Warning>) -> Option<FullLog> {
    let log = o.log.as_ref()?;
    if let Some(e) = &log.error {
        warnings.push(Warning::FullLogFailed {
            path: log.path.clone(),
            error: e.to_string(),
            written: log.written,
        });
    } else if log.dropped > 0 {
        warnings.push(Warning::FullLogDropped {
            path: log.path.clone(),
            dropped: log.dropped,
        });
    }
    Some(FullLog {
        path: log.path.clone(),
        written: log.written,
        dropped: log.dropped,
        error: log.error.clone(),
    })
}

/// `socket_rtt`, and warnings for what the kernel did not give.
pub(crate) fn socket_rtt(o: &LatencyOutcome, warnings: &mut Vec<Warning>) -> Option<SocketRtt> {
    let s = o.socket.as_ref()?;
    let samples = o.rtt.samples();
    match (&s.rx, &s.tx) {
        (Err(why), _) => warnings.push(Warning::NoRxTimestamps {
            why: why.to_string(),
        }),
        (Ok(()), Err(why)) => warnings.push(Warning::NoTxTimestamps {
            why: why.to_string(),
        }),
        (Ok(()), Ok(())) => {
            if s.tx_stamped < s.rx_stamped {
                warnings.push(Warning::TxStampsMissing {
                    missing: s.rx_stamped - s.tx_stamped,
                    of: s.rx_stamped,
                });
            }
        }
    }
    if s.rx.is_ok() && s.rx_stamped < samples {
        warnings.push(Warning::RxStampsMissing {
            missing: samples - s.rx_stamped,
            of: samples,
        });
    }
    if s.inconsistent > 0 {
        warnings.push(Warning::KernelStampsInconsistent {
            samples: s.inconsistent,
        });
    }
    Some(SocketRtt {
        rx_timestamps: s.rx.is_ok(),
        tx_timestamps: s.tx.is_ok(),
        rx_stamped: s.rx_stamped,
        tx_stamped: s.tx_stamped,
        inconsistent: s.inconsistent,
        socket_rtt_ns: crate::rtt::rtt_ns_if_any(&s.socket_rtt),
        host_ns: crate::rtt::rtt_ns_if_any(&s.host),
        send_to_socket_rx_ns: crate::rtt::rtt_ns_if_any(&s.send_to_rx),
        rx_host_ns: crate::rtt::rtt_ns_if_any(&s.rx_host),
    })
}

/// `one_way`, and warnings for what could not be stated. `elapsed_ns` is the loop's length on
/// the test clock (the clock estimate is stated for its middle).
pub(crate) fn one_way(
    o: &LatencyOutcome,
    elapsed_ns: u64,
    warnings: &mut Vec<Warning>,
) -> Option<OneWay> {
    let ow = o.one_way.as_ref()?;
    let samples = ow.recorder.samples();
    if ow.unstamped > 0 {
        warnings.push(Warning::OneWayUnstamped {
            unstamped: ow.unstamped,
            samples,
        });
    }
    if ow.recorder.unconverted() > 0 {
        warnings.push(Warning::OneWayUnconverted {
            replies: ow.recorder.unconverted(),
        });
    }
    let Some(fit) = &ow.fit else {
        warnings.push(Warning::OneWayNoClock);
        return Some(OneWay {
            samples,
            unstamped: ow.unstamped,
            forward_ns: None,
            return_ns: None,
            agent_hold_ns: None,
            uncertainty_ns: None,
            clock: None,
        });
    };
    let mid = ow.host_minus_test_ns.saturating_add(elapsed_ns / 2);
    let offset = fit.offset_at(mid);
    let clock = ClockEstimate {
        offset_ns: offset.offset_ns,
        offset_uncertainty_ns: offset
            .uncertainty_ns
            .saturating_add(ow.extra_uncertainty_ns),
        drift_ppm: fit.drift_ppm(),
        best_round_trip_ns: fit.best_delay_ns(),
        control_exchanges: ow.control_exchanges,
        probe_exchanges: ow.probes_offered,
        exchanges_used: fit.exchanges_used() as u64,
    };
    let Some(summary) = ow.recorder.finish(fit, ow.extra_uncertainty_ns) else {
        warnings.push(Warning::OneWayNoProbe);
        return Some(OneWay {
            samples,
            unstamped: ow.unstamped,
            forward_ns: None,
            return_ns: None,
            agent_hold_ns: None,
            uncertainty_ns: None,
            clock: Some(clock),
        });
    };
    let forward = signed_ns(&summary.forward);
    let backward = signed_ns(&summary.backward);
    let smaller = [&forward, &backward]
        .into_iter()
        .flatten()
        .filter_map(|d| d.p50)
        .min();
    if smaller.is_some_and(|d| d.unsigned_abs() < summary.uncertainty_ns) {
        warnings.push(Warning::OneWayUncertain {
            uncertainty_ns: summary.uncertainty_ns,
        });
    }
    Some(OneWay {
        samples,
        unstamped: ow.unstamped,
        forward_ns: forward,
        return_ns: backward,
        agent_hold_ns: crate::rtt::rtt_ns_if_any(ow.recorder.hold()),
        uncertainty_ns: Some(summary.uncertainty_ns),
        clock: Some(clock),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_way_needs_room_for_the_stamps() {
        let opt = LatencyOptions {
            one_way: true,
            msg_size: 23,
            ..LatencyOptions::default()
        };
        let err = check(&opt).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(err.to_string().contains("at least 24 bytes"), "{err}");
        assert!(check(&LatencyOptions {
            msg_size: 24,
            ..opt
        })
        .is_ok());
    }

    fn outcome() -> LatencyOutcome {
        let mut rtt = sonde_engine::rtt::RttRecorder::new(0);
        for i in 0..100 {
            rtt.record(i, 10_000 + i);
        }
        LatencyOutcome {
            rtt,
            sent: 100,
            seq: None,
            late_sends: 0,
            timeouts: 0,
            socket: None,
            one_way: None,
            log: None,
        }
    }

    #[test]
    fn a_log_with_dropped_samples_says_so() {
        let mut o = outcome();
        let mut warnings = Vec::new();
        assert!(full_log(&o, &mut warnings).is_none(), "not asked for");
        o.log = Some(sonde_net::samplelog::LogSummary {
            path: "rtt.csv".into(),
            written: 90,
            dropped: 10,
            error: None,
        });
        let log = full_log(&o, &mut warnings).unwrap();
        assert_eq!((log.written, log.dropped), (90, 10));
        assert_eq!(warnings.len(), 1);
        assert!(
            warnings[0].to_string().contains("dropped 10 samples"),
            "{warnings:?}"
        );
        // A complete log is no news.
        o.log.as_mut().unwrap().dropped = 0;
        full_log(&o, &mut warnings).unwrap();
        assert_eq!(warnings.len(), 1);
    }

    #[test]
    fn missing_transmit_stamps_are_null_with_a_warning_never_zero() {
        let rec = |n: u64| {
            let mut r = sonde_engine::rtt::RttRecorder::new(0);
            for i in 0..n {
                r.record(i, 5_000 + i);
            }
            r
        };
        let mut o = outcome();
        o.socket = Some(sonde_net::latency::SocketOutcome {
            rx: Ok(()),
            tx: Err("refused".into()),
            rx_stamped: 100,
            tx_stamped: 0,
            inconsistent: 0,
            socket_rtt: rec(0),
            host: rec(0),
            send_to_rx: rec(100),
            rx_host: rec(100),
        });
        let mut warnings = Vec::new();
        let s = socket_rtt(&o, &mut warnings).unwrap();
        assert!(s.rx_timestamps && !s.tx_timestamps);
        assert!(s.socket_rtt_ns.is_none() && s.host_ns.is_none());
        assert!(s.send_to_socket_rx_ns.is_some() && s.rx_host_ns.is_some());
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0]
            .to_string()
            .contains("no kernel transmit timestamps (refused)"));
        // No receive stamps at all: every figure null.
        let sock = o.socket.as_mut().unwrap();
        sock.rx = Err("unsupported".into());
        sock.rx_stamped = 0;
        sock.send_to_rx = rec(0);
        sock.rx_host = rec(0);
        let mut warnings = Vec::new();
        let s = socket_rtt(&o, &mut warnings).unwrap();
        assert!(!s.rx_timestamps && s.send_to_socket_rx_ns.is_none());
        assert!(warnings
            .iter()
            .any(|w| w.to_string().contains("no receive timestamps")));
    }

    #[test]
    fn one_way_without_a_clock_estimate_is_null_with_a_warning() {
        let mut o = outcome();
        o.one_way = Some(sonde_net::latency::OneWayOutcome {
            recorder: sonde_engine::oneway::OneWayRecorder::new(0),
            unstamped: 3,
            probes_offered: 0,
            fit: None,
            control_exchanges: 0,
            extra_uncertainty_ns: 1,
            host_minus_test_ns: 0,
        });
        let mut warnings = Vec::new();
        let ow = one_way(&o, 1_000, &mut warnings).unwrap();
        assert!(ow.forward_ns.is_none() && ow.return_ns.is_none());
        assert!(ow.uncertainty_ns.is_none() && ow.clock.is_none());
        assert_eq!(ow.unstamped, 3);
        assert!(warnings
            .iter()
            .any(|w| w.to_string().contains("without the agent's timestamps")));
        assert!(warnings
            .iter()
            .any(|w| w.to_string().contains("offset is unknown")));
    }

    /// Every one-way figure is converted with the offset, so its stated bound is never
    /// narrower than the offset's, mapping error (host clock to test clock) included.
    #[test]
    fn the_figures_bound_includes_the_offsets_mapping_error() {
        use sonde_engine::offset::{Exchange, OffsetEstimator};
        use sonde_engine::oneway::{LinearOffset, OneWayRecorder};
        let ex = |t: u64| Exchange {
            client_send_ns: t,
            agent_receive_ns: t + 40_000,
            agent_send_ns: t + 45_000,
            client_receive_ns: t + 85_000,
        };
        let mut est = OffsetEstimator::new(std::time::Duration::from_secs(1));
        let mut recorder = OneWayRecorder::new(0);
        for tick in 0..20u64 {
            let t = tick * 100_000_000;
            est.add(ex(t));
            recorder.set_model(LinearOffset::from_fit(&est.fit().unwrap(), t));
            recorder.record(t + 1_000_000, &ex(t + 1_000_000));
        }
        let mut o = outcome();
        o.one_way = Some(sonde_net::latency::OneWayOutcome {
            recorder,
            unstamped: 0,
            probes_offered: 20,
            fit: est.fit(),
            control_exchanges: 20,
            extra_uncertainty_ns: 1_000_000,
            host_minus_test_ns: 0,
        });
        let mut warnings = Vec::new();
        let ow = one_way(&o, 2_000_000_000, &mut warnings).unwrap();
        let clock = ow.clock.expect("a clock estimate");
        assert!(clock.offset_uncertainty_ns >= 1_000_000, "{clock:?}");
        let u = ow.uncertainty_ns.expect("figures");
        assert!(u >= clock.offset_uncertainty_ns, "{u} < {clock:?}");
    }

    #[test]
    fn a_log_that_cannot_be_created_is_a_usage_error() {
        let opt = LatencyOptions {
            full_log: Some("/nonexistent-dir-of-sonde/rtt.csv".into()),
            ..LatencyOptions::default()
        };
        let err = check(&opt).unwrap_err();
        assert_eq!(err.exit_code(), 2);
        assert!(
            err.to_string()
                .contains("/nonexistent-dir-of-sonde/rtt.csv"),
            "{err}"
        );
    }
}
