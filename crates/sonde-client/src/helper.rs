//! `--from`: load from many hosts at once. The client asks each helper (a sonde agent started
//! with `--helper` and a shared secret) to run the test against the target itself, starts them
//! together, and adds up what the target counted.
//!
//! Per helper, on its own thread: hello, `Help` with the proof of the helper's secret, the
//! helper's `HelperReady` (its session at the target admitted, its channels open, nothing sent),
//! then [`CLOCK_EXCHANGES`] NTP-style exchanges over the control connection
//! ([`sonde_engine::offset`], the estimator behind `latency --one-way`) for the helper clock's
//! offset. When every helper is ready, the client names one start on its own clock,
//! [`START_MARGIN`] ahead, and sends each helper that moment on the helper's clock (`HelperGo`).
//! Each helper reports when its data actually started; converted back with its offset, the
//! latest minus the earliest is the start spread the result shows.
//!
//! The helper's side ([`run_as_helper`]) is the runner `sonde server --helper` injects into the
//! agent: the ordinary client against the target, held between the target's `Ready` and the
//! first datagram until the common start.

use std::net::TcpStream;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use sonde_engine::offset::{Exchange, OffsetEstimator};
use sonde_net::control::{read_frame, write_frame};
use sonde_net::latency::host_clock_ns;
use sonde_report::{
    HelperShare, Helpers, LatencyResult, Meta, PpsResult, SideTotals, TestResult, ThroughputResult,
    Warning, WarningCode,
};
use sonde_wire::{ControlMsg, HelperTest, TestKind};

use crate::{
    ClientError, Controls, FromHelpers, GsoMode, LatencyOptions, PpsOptions, Target,
    ThroughputOptions,
};

/// Clock exchanges per helper before the start is named.
pub(crate) const CLOCK_EXCHANGES: u32 = 8;
/// How far ahead of the moment every helper is ready the common start is: time for the
/// `HelperGo` messages to arrive, with room for a busy host.
const START_MARGIN: Duration = Duration::from_millis(300);
/// The longest result document a helper may send (its parts together).
const MAX_RESULT_BYTES: usize = 16 << 20;
/// How long a clock reply may take.
const CLOCK_TIMEOUT: Duration = Duration::from_secs(5);
/// How long after its planned end a helper has to send its result (the target's report, the
/// helper's own grace for datagrams in flight).
const RESULT_SLACK: Duration = Duration::from_secs(60);

/// What one helper sent back.
struct HelperRun {
    helper: String,
    /// The result document, JSON.
    result: String,
    /// When its data started, on this host's clock (`host_clock_ns`).
    started_ns: u64,
    uncertainty_ns: u64,
}

/// The helper's view of its clock, and the way to tell it when to start.
struct Ready {
    offset_ns: i64,
    uncertainty_ns: u64,
}

/// Runs `test` from every helper against `target` at once.
fn run_helpers(
    target: &str,
    helpers: &[Target],
    test: &HelperTest,
) -> Result<Vec<HelperRun>, ClientError> {
    if helpers.is_empty() {
        return Err(ClientError::Usage(
            "--from needs at least one helper".into(),
        ));
    }
    let n = helpers.len();
    // A ready helper hands over a clone of its control connection and its clock's offset.
    let (ready_tx, ready_rx) = mpsc::channel::<Option<(TcpStream, i64)>>();
    let mut go_txs = Vec::new();
    let mut go_rxs = Vec::new();
    for _ in 0..n {
        let (tx, rx) = mpsc::channel::<bool>();
        go_txs.push(tx);
        go_rxs.push(Some(rx));
    }
    let wait = Duration::from_millis(test.spec.duration_ms) + RESULT_SLACK;
    thread::scope(|scope| {
        let mut handles = Vec::new();
        for (i, helper) in helpers.iter().enumerate() {
            let ready_tx = ready_tx.clone();
            let go_rx = go_rxs[i].take().unwrap_or_else(|| unreachable!());
            handles.push(scope.spawn(move || {
                let r = one_helper(helper, target, test, wait, |ready| {
                    let _ = ready_tx.send(ready);
                    go_rx.recv().unwrap_or(false)
                });
                r.map_err(|e| ClientError::Helper {
                    helper: helper.label.clone(),
                    error: Box::new(e),
                })
            }));
        }
        drop(ready_tx);
        // Every helper ready, or the first that could not be: then all start, or none.
        let mut ready = Vec::new();
        for _ in 0..n {
            match ready_rx.recv() {
                Ok(Some(r)) => ready.push(r),
                Ok(None) | Err(_) => break,
            }
        }
        let go = ready.len() == n;
        if go {
            // One thread sends every `HelperGo` back to back: waking each helper's thread to
            // send its own would cost a scheduling delay per helper on a busy host.
            let start = host_clock_ns()
                .saturating_add(u64::try_from(START_MARGIN.as_nanos()).unwrap_or(u64::MAX));
            for (ctrl, offset_ns) in &mut ready {
                let start_host_ns = shift(start, *offset_ns);
                // A failed write shows in that helper's thread, whose read then fails.
                let _ = write_frame(ctrl, &ControlMsg::HelperGo { start_host_ns });
            }
        }
        drop(ready);
        for tx in &go_txs {
            let _ = tx.send(go);
        }
        let results: Vec<Result<HelperRun, ClientError>> = handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(ClientError::Protocol("a helper's thread panicked".into()))
                })
            })
            .collect();
        // The first real failure, not the aborts it caused in the others.
        let aborted = |e: &ClientError| {
            matches!(e, ClientError::Helper { error, .. }
                if matches!(**error, ClientError::Interrupted))
        };
        let mut runs = Vec::new();
        let mut errors = Vec::new();
        for r in results {
            match r {
                Ok(run) => runs.push(run),
                Err(e) => errors.push(e),
            }
        }
        errors.sort_by_key(|e| aborted(e));
        match errors.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(runs),
        }
    })
}

/// One helper's part: its readiness goes to `ready` (a clone of its control connection and its
/// clock's offset, or `None` when it could not get ready), which returns whether the start was
/// sent; then its result.
fn one_helper(
    helper: &Target,
    target: &str,
    test: &HelperTest,
    wait: Duration,
    ready: impl FnOnce(Option<(TcpStream, i64)>) -> bool,
) -> Result<HelperRun, ClientError> {
    let (mut ctrl, mut body, clock) = match prepare(helper, target, test) {
        Ok(p) => p,
        Err(e) => {
            ready(None);
            return Err(e);
        }
    };
    let writer = match ctrl.try_clone() {
        Ok(w) => w,
        Err(e) => {
            ready(None);
            return Err(ClientError::Control(e.into()));
        }
    };
    // Another helper failed: closing the connection tells this one to give up unsent.
    if !ready(Some((writer, clock.offset_ns))) {
        return Err(ClientError::Interrupted);
    }
    let deadline = Instant::now() + START_MARGIN + wait;
    let mut json = String::new();
    loop {
        match read_frame(&mut ctrl, &mut body, deadline)? {
            ControlMsg::HelperResultPart { json: part } => {
                if json.len() + part.len() > MAX_RESULT_BYTES {
                    return Err(ClientError::Protocol(format!(
                        "the helper's result passed {MAX_RESULT_BYTES} bytes"
                    )));
                }
                json.push_str(&part);
            }
            ControlMsg::HelperResult { started_host_ns } => {
                return Ok(HelperRun {
                    helper: helper.label.clone(),
                    result: json,
                    started_ns: shift(started_host_ns, -clock.offset_ns),
                    uncertainty_ns: clock.uncertainty_ns,
                })
            }
            ControlMsg::HelperFailed { exit_code, message } => {
                return Err(ClientError::HelperTarget { exit_code, message })
            }
            ControlMsg::Error { message } => return Err(ClientError::Remote(message)),
            _ => {
                return Err(ClientError::Protocol(
                    "the helper sent something else where its result was due".into(),
                ))
            }
        }
    }
}

/// `ns + offset`, saturating at the ends of the clock.
fn shift(ns: u64, offset: i64) -> u64 {
    if offset >= 0 {
        ns.saturating_add(offset.unsigned_abs())
    } else {
        ns.saturating_sub(offset.unsigned_abs())
    }
}

/// Hello, `Help`, the helper's `HelperReady`, and its clock's offset.
fn prepare(
    helper: &Target,
    target: &str,
    test: &HelperTest,
) -> Result<(TcpStream, Vec<u8>, Ready), ClientError> {
    let mut welcomed = crate::session::hello(helper)?;
    // A helper that predates many-flow tests would run its one-flow test instead.
    if test.spec.request_response.is_some() && !welcomed.limits.request_response {
        return Err(ClientError::Refused {
            reason: sonde_wire::Refusal::BadRequest,
            message: format!(
                "helper {} predates many-flow latency tests (-P, --depth, --response-size): \
                 upgrade it",
                helper.label
            ),
        });
    }
    welcomed.help(helper, target, test)?;
    let (mut ctrl, mut body) = (welcomed.ctrl, welcomed.body);
    let mut est = OffsetEstimator::new(Duration::from_secs(1));
    for _ in 0..CLOCK_EXCHANGES {
        let t1 = host_clock_ns();
        write_frame(&mut ctrl, &ControlMsg::ClockProbe { client_send_ns: t1 })?;
        let reply = read_frame(&mut ctrl, &mut body, Instant::now() + CLOCK_TIMEOUT)?;
        let t4 = host_clock_ns();
        match reply {
            ControlMsg::ClockReply {
                client_send_ns,
                agent_receive_ns,
                agent_send_ns,
            } if client_send_ns == t1 => {
                est.add(Exchange {
                    client_send_ns: t1,
                    agent_receive_ns,
                    agent_send_ns,
                    client_receive_ns: t4,
                });
            }
            ControlMsg::HelperFailed { exit_code, message } => {
                return Err(ClientError::HelperTarget { exit_code, message })
            }
            _ => {
                return Err(ClientError::Protocol(
                    "the helper sent something else where a clock reply was due".into(),
                ))
            }
        }
    }
    let fit = est.fit().ok_or_else(|| {
        ClientError::Protocol(
            "no clean clock exchange with the helper: cannot start it on time".into(),
        )
    })?;
    let estimate = fit.offset_at(host_clock_ns());
    Ok((
        ctrl,
        body,
        Ready {
            offset_ns: estimate.offset_ns,
            uncertainty_ns: estimate.uncertainty_ns,
        },
    ))
}

/// The helper's side of `--from` (the runner `sonde server --helper` gives its agent): runs
/// `test` against `target` (`default_port` when it names none) with the helper's `secret`.
/// `ready` is called once the target has admitted the session and every channel is open, before
/// any data; it returns when to start (`None`: give up, sending nothing). `stop` ends the test
/// early. Returns the result document and when the data started.
///
/// # Errors
/// The target could not be reached, refused, or the test failed.
pub fn run_as_helper(
    target: &str,
    default_port: u16,
    test: &HelperTest,
    secret: sonde_wire::auth::Secret,
    ready: &mut dyn FnMut() -> Option<Instant>,
    stop: &AtomicBool,
) -> Result<(String, Instant), ClientError> {
    let t = crate::resolve(target, default_port)?.with_secret(Some(secret));
    let spec = &test.spec;
    let mut started = None;
    let result = {
        let mut hold = || -> Result<(), ClientError> {
            let at = ready().ok_or(ClientError::Interrupted)?;
            loop {
                let now = Instant::now();
                if now >= at {
                    break;
                }
                if stop.load(Ordering::Relaxed) {
                    return Err(ClientError::Interrupted);
                }
                thread::sleep((at - now).min(Duration::from_millis(20)));
            }
            started = Some(Instant::now());
            Ok(())
        };
        let duration = Duration::from_millis(spec.duration_ms);
        let interval = (spec.interval_ms > 0).then(|| Duration::from_millis(spec.interval_ms));
        match spec.kind {
            TestKind::Pps => {
                let opt = PpsOptions {
                    msg_size: spec.msg_size,
                    flows: spec.streams,
                    duration,
                    gso: match test.gso {
                        None => GsoMode::Auto,
                        Some(true) => GsoMode::On,
                        Some(false) => GsoMode::Off,
                    },
                    interval,
                    omit: (spec.omit_ms > 0).then(|| Duration::from_millis(spec.omit_ms)),
                    // A helper's threads run where its own scheduler puts them.
                    cpus: Vec::new(),
                    socket: spec.socket.clone(),
                };
                crate::run(&t, &opt, Controls::new().interrupt(stop).hold(&mut hold))
                    .map(TestResult::Pps)?
            }
            TestKind::Throughput => {
                let opt = ThroughputOptions {
                    protocol: spec.protocol,
                    parallel: spec.streams,
                    direction: spec.direction,
                    msg_size: spec.msg_size,
                    bitrate: spec
                        .bitrate_per_stream
                        .saturating_mul(u64::from(spec.streams)),
                    duration,
                    interval,
                    cpus: Vec::new(),
                    read_size: (spec.read_size != 0).then_some(spec.read_size),
                    // TCP -b is already in it as the pacing rate.
                    socket: spec.socket.clone(),
                    omit: (spec.omit_ms > 0).then(|| Duration::from_millis(spec.omit_ms)),
                    skip_rx_copy: spec.skip_rx_copy,
                    bytes: (spec.bytes > 0).then_some(spec.bytes),
                    blocks: (spec.blocks > 0).then_some(spec.blocks),
                };
                crate::run(&t, &opt, Controls::new().interrupt(stop).hold(&mut hold))
                    .map(TestResult::Throughput)?
            }
            TestKind::Latency => {
                let warmup = Duration::from_millis(test.warmup_ms);
                let opt = LatencyOptions {
                    protocol: spec.protocol,
                    msg_size: spec.msg_size,
                    duration: duration.saturating_sub(warmup),
                    warmup,
                    socket: spec.socket.clone(),
                    // `-P`/`--depth`: the many-flow test, as the requester asked it.
                    parallel: spec.streams,
                    depth: spec.request_response.map_or(1, |rr| rr.depth),
                    response_size: spec.request_response.map(|rr| rr.response_size),
                    threads: spec
                        .request_response
                        .and_then(|rr| (rr.threads > 0).then_some(rr.threads)),
                    ..LatencyOptions::default()
                };
                crate::run(&t, &opt, Controls::new().interrupt(stop).hold(&mut hold))
                    .map(|m| TestResult::Latency(m.result))?
            }
            _ => {
                return Err(ClientError::Usage(
                    "helpers run pps, throughput and latency tests only".into(),
                ))
            }
        }
    };
    let started = started.ok_or(ClientError::Interrupted)?;
    // The requester does not merge intervals (each counts from its own receiver's start): they
    // would only bring a long test's result closer to the control frame's 64 KiB.
    let mut result = result;
    result.kind_mut().clear_intervals();
    let json = serde_json::to_string(&result)
        .map_err(|e| ClientError::Protocol(format!("the result did not serialize: {e}")))?;
    Ok((json, started))
}

/// The helpers' documents of one kind, with each run's timing.
fn documents<T>(
    runs: Vec<HelperRun>,
    pick: impl Fn(TestResult) -> Option<T>,
) -> Result<Vec<(HelperRun, T)>, ClientError> {
    runs.into_iter()
        .map(|run| {
            let doc = serde_json::from_str::<TestResult>(&run.result)
                .ok()
                .and_then(&pick)
                .ok_or_else(|| ClientError::Helper {
                    helper: run.helper.clone(),
                    error: Box::new(ClientError::Protocol(
                        "its result is not a document of the test asked for".into(),
                    )),
                })?;
            Ok((run, doc))
        })
        .collect()
}

/// The common part of every `--from` result: each share's start after the earliest, the
/// spread, the offsets' uncertainty, and the window from the earliest start to the latest end
/// (`active_ns`: how long each helper's part lasted).
fn helpers_section(
    runs: &[(HelperRun, u64)],
    share: impl Fn(usize, &HelperRun, u64) -> HelperShare,
) -> Helpers {
    let earliest = runs.iter().map(|(r, _)| r.started_ns).min().unwrap_or(0);
    let latest = runs.iter().map(|(r, _)| r.started_ns).max().unwrap_or(0);
    let window_ns = runs
        .iter()
        .map(|(r, active)| (r.started_ns - earliest).saturating_add(*active))
        .max()
        .unwrap_or(0);
    Helpers {
        start_spread_ns: latest - earliest,
        offset_uncertainty_ns: runs
            .iter()
            .map(|(r, _)| r.uncertainty_ns)
            .max()
            .unwrap_or(0),
        window_ns,
        shares: runs
            .iter()
            .enumerate()
            .map(|(i, (r, _))| share(i, r, r.started_ns - earliest))
            .collect(),
    }
}

/// The aggregate's meta: the first helper's, as the target saw it, without what belongs to
/// one helper's session alone (its host, both ends' CPU cost) and with the overlap the helpers caused themselves
/// taken out (the target ran each helper's session beside the others, by design).
fn aggregate_meta(metas: &[&Meta]) -> Meta {
    let mut meta = metas[0].clone();
    meta.timestamp_unix_ms = metas.iter().map(|m| m.timestamp_unix_ms).min().unwrap_or(0);
    meta.hosts.client = None;
    // Each helper's session cost the target (and the helper) separately: no one figure is the
    // aggregate's.
    meta.cpu = sonde_report::CpuCosts::default();
    let others = u32::try_from(metas.len() - 1).unwrap_or(u32::MAX);
    let overlap = metas
        .iter()
        .map(|m| m.overlapping_sessions.saturating_sub(others))
        .max()
        .unwrap_or(0);
    meta.overlapping_sessions = overlap;
    meta.remove_warnings(WarningCode::OverlappingSessions);
    meta.remove_warnings(WarningCode::Loss);
    if overlap > 0 {
        meta.add(&Warning::OverlappingSessions { sessions: overlap });
    }
    meta.interrupted = metas.iter().any(|m| m.interrupted);
    meta
}

/// Nanoseconds `count` took at `per_second`.
fn active_ns(count: u64, per_second: f64) -> u64 {
    if per_second > 0.0 {
        (count as f64 / per_second * 1e9).round() as u64
    } else {
        0
    }
}

fn per_window(count: u64, window_ns: u64) -> f64 {
    sonde_engine::per_second(count, window_ns)
}

crate::test::impl_test!(
    /// `sonde pps TARGET --from HELPER...`: every helper sends these options to the target at
    /// once; the result is what the target received from all of them together over the common
    /// window, and each helper's share. Errors: a helper could not be reached, refused, or its
    /// test failed (the error names it).
    PpsOptions, FromHelpers => PpsResult,
    |on, opt, _| pps_from(&on.target, &on.helpers, opt),
);

fn pps_from(target: &str, helpers: &[Target], opt: &PpsOptions) -> Result<PpsResult, ClientError> {
    crate::check_pps(opt)?;
    let test = HelperTest {
        spec: crate::pps_spec(opt)?,
        gso: match opt.gso {
            GsoMode::Auto => None,
            GsoMode::On => Some(true),
            GsoMode::Off => Some(false),
        },
        warmup_ms: 0,
    };
    let docs = documents(run_helpers(target, helpers, &test)?, |d| match d {
        TestResult::Pps(p) => Some(p),
        _ => None,
    })?;
    Ok(aggregate_pps(&docs, opt.flows))
}

/// What the target received from every helper together (`pps_from`), from each helper's
/// document and when its data started.
fn aggregate_pps(docs: &[(HelperRun, PpsResult)], flows_per_helper: u32) -> PpsResult {
    let timed: Vec<(HelperRun, u64)> = docs
        .iter()
        .map(|(r, d)| (clone_run(r), active_ns(d.received, d.received_pps)))
        .collect();
    let section = helpers_section(&timed, |i, r, start_offset_ns| {
        let d = &docs[i].1;
        HelperShare {
            helper: r.helper.clone(),
            session: d.meta.session,
            start_offset_ns,
            sent: Some(d.sent),
            received: Some(d.received),
            lost: Some(d.lost),
            received_pps: Some(d.received_pps),
            bits_per_second: None,
            rtt_ns: None,
        }
    });
    let metas: Vec<&Meta> = docs.iter().map(|(_, d)| &d.meta).collect();
    let mut agg = docs[0].1.clone();
    agg.meta = aggregate_meta(&metas);
    let sent: u64 = docs.iter().map(|(_, d)| d.sent).sum();
    let received: u64 = docs.iter().map(|(_, d)| d.received).sum();
    let lost: u64 = docs.iter().map(|(_, d)| d.lost).sum();
    let sent_window = docs
        .iter()
        .zip(&section.shares)
        .map(|((_, d), s)| s.start_offset_ns + active_ns(d.sent, d.sent_pps))
        .max()
        .unwrap_or(0);
    agg.sent = sent;
    agg.received = received;
    agg.lost = lost;
    agg.omitted_received = docs.iter().map(|(_, d)| d.omitted_received).sum();
    agg.loss_percent = percent(lost, sent);
    agg.sent_pps = per_window(sent, sent_window);
    agg.received_pps = per_window(received, section.window_ns);
    if lost > 0 {
        agg.meta.add(&Warning::PpsLoss {
            lost,
            sent,
            percent: agg.loss_percent,
        });
    }
    // Flows numbered across helpers: helper k's flow j is k x flows + j.
    agg.flows = docs
        .iter()
        .enumerate()
        .flat_map(|(k, (_, d))| {
            let base = u32::try_from(k)
                .unwrap_or(u32::MAX)
                .saturating_mul(flows_per_helper);
            d.flows.iter().map(move |f| sonde_report::FlowResult {
                flow: base.saturating_add(f.flow),
                ..f.clone()
            })
        })
        .collect();
    // Each helper's intervals count from its own receiver's start: not summed.
    agg.intervals = Vec::new();
    agg.helpers = Some(section);
    agg
}

crate::test::impl_test!(
    /// `sonde throughput TARGET --from HELPER...`: every helper runs these options (its `-P`
    /// streams) against the target at once; the totals are all helpers' together over the
    /// common window. Errors: as for pps.
    ThroughputOptions, FromHelpers => ThroughputResult,
    |on, opt, _| throughput_from(&on.target, &on.helpers, opt),
);

fn throughput_from(
    target: &str,
    helpers: &[Target],
    opt: &ThroughputOptions,
) -> Result<ThroughputResult, ClientError> {
    let test = HelperTest {
        spec: crate::throughput_spec(opt)?,
        gso: None,
        warmup_ms: 0,
    };
    let docs = documents(run_helpers(target, helpers, &test)?, |d| match d {
        TestResult::Throughput(t) => Some(t),
        _ => None,
    })?;
    let timed: Vec<(HelperRun, u64)> = docs
        .iter()
        .map(|(r, d)| (clone_run(r), d.receiver.duration_ns))
        .collect();
    let section = helpers_section(&timed, |i, r, start_offset_ns| {
        let d = &docs[i].1;
        HelperShare {
            helper: r.helper.clone(),
            session: d.meta.session,
            start_offset_ns,
            sent: Some(d.sender.bytes),
            received: Some(d.receiver.bytes),
            lost: d.lost,
            received_pps: None,
            bits_per_second: Some(d.receiver.bits_per_second),
            rtt_ns: None,
        }
    });
    let metas: Vec<&Meta> = docs.iter().map(|(_, d)| &d.meta).collect();
    let mut agg = docs[0].1.clone();
    agg.meta = aggregate_meta(&metas);
    let total = |side: fn(&ThroughputResult) -> &SideTotals, window_ns: u64| {
        let bytes: u64 = docs.iter().map(|(_, d)| side(d).bytes).sum();
        SideTotals {
            bytes,
            bits_per_second: per_window(bytes.saturating_mul(8), window_ns),
            packets: docs.iter().map(|(_, d)| side(d).packets).sum(),
            duration_ns: window_ns,
        }
    };
    let sender_window = docs
        .iter()
        .zip(&section.shares)
        .map(|((_, d), s)| s.start_offset_ns + d.sender.duration_ns)
        .max()
        .unwrap_or(0);
    agg.receiver = total(|d| &d.receiver, section.window_ns);
    agg.sender = total(|d| &d.sender, sender_window);
    let sum = |f: fn(&ThroughputResult) -> Option<u64>| -> Option<u64> {
        docs.iter().map(|(_, d)| f(d)).sum()
    };
    agg.omitted_bytes = sum(|d| d.omitted_bytes);
    agg.lost = sum(|d| d.lost);
    agg.duplicated = sum(|d| d.duplicated);
    agg.reordered = sum(|d| d.reordered);
    agg.retransmits = sum(|d| d.retransmits);
    agg.jitter_ns = docs.iter().filter_map(|(_, d)| d.jitter_ns).max();
    agg.loss_percent = agg.lost.map(|l| percent(l, agg.sender.packets));
    agg.streams = docs
        .iter()
        .enumerate()
        .flat_map(|(k, (_, d))| {
            let base = u32::try_from(k)
                .unwrap_or(u32::MAX)
                .saturating_mul(opt.parallel);
            d.streams.iter().map(move |s| sonde_report::StreamResult {
                stream: base.saturating_add(s.stream),
                ..s.clone()
            })
        })
        .collect();
    agg.intervals = Vec::new();
    agg.helpers = Some(section);
    Ok(agg)
}

crate::test::impl_test!(
    /// `sonde latency TARGET --from HELPER...`: every helper measures its round-trip times to
    /// the target at once, each while the others run. Percentiles of different paths do not
    /// add up: the top-level figures are the first helper's, and every helper's are in
    /// `helpers`. Errors: as for pps.
    LatencyOptions, FromHelpers => LatencyResult,
    |on, opt, _| latency_from(&on.target, &on.helpers, opt),
);

fn latency_from(
    target: &str,
    helpers: &[Target],
    opt: &LatencyOptions,
) -> Result<LatencyResult, ClientError> {
    if opt.rate.is_some() || opt.count.is_some() || opt.one_way || opt.timestamps {
        return Err(ClientError::Usage(
            "with --from, latency runs closed loop for -t: --rate, -n, --one-way and \
             --timestamps are for a test this host runs itself"
                .into(),
        ));
    }
    if opt.full_log.is_some() || opt.histogram {
        return Err(ClientError::Usage(
            "with --from, --full-log and --histogram are not available".into(),
        ));
    }
    let test = HelperTest {
        spec: if opt.many_flows() {
            crate::many_flows_spec(opt)?
        } else {
            crate::latency_spec(opt)?
        },
        gso: None,
        warmup_ms: crate::millis(opt.warmup),
    };
    let docs = documents(run_helpers(target, helpers, &test)?, |d| match d {
        TestResult::Latency(l) => Some(l),
        _ => None,
    })?;
    let timed: Vec<(HelperRun, u64)> = docs
        .iter()
        .map(|(r, d)| (clone_run(r), d.duration_ns))
        .collect();
    let section = helpers_section(&timed, |i, r, start_offset_ns| {
        let d = &docs[i].1;
        HelperShare {
            helper: r.helper.clone(),
            session: d.meta.session,
            start_offset_ns,
            sent: None,
            received: None,
            lost: None,
            received_pps: None,
            bits_per_second: None,
            rtt_ns: Some(d.rtt_ns.clone()),
        }
    });
    let metas: Vec<&Meta> = docs.iter().map(|(_, d)| &d.meta).collect();
    let mut agg = docs[0].1.clone();
    let first_meta = agg.meta.clone();
    agg.meta = aggregate_meta(&metas);
    // The top-level figures are the first helper's: its loss warnings stand.
    for (w, c) in first_meta.warnings.iter().zip(&first_meta.warning_codes) {
        if *c == WarningCode::Loss {
            agg.meta.warnings.push(w.clone());
            agg.meta.warning_codes.push(*c);
        }
    }
    agg.helpers = Some(section);
    Ok(agg)
}

fn clone_run(r: &HelperRun) -> HelperRun {
    HelperRun {
        helper: r.helper.clone(),
        result: String::new(),
        started_ns: r.started_ns,
        uncertainty_ns: r.uncertainty_ns,
    }
}

fn percent(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(helper: &str, started_ns: u64) -> HelperRun {
        HelperRun {
            helper: helper.to_owned(),
            result: String::new(),
            started_ns,
            uncertainty_ns: 10_000,
        }
    }

    /// A helper's pps document: `sent` datagrams on one flow, `received` of them over
    /// `active_ns` at the target, which ran `overlap` other sessions meanwhile.
    fn pps(session: u64, sent: u64, received: u64, active_ns: u64, overlap: u32) -> PpsResult {
        let lost = sent - received;
        let doc = serde_json::json!({
            "test": "pps", "sonde_version": "0", "timestamp_unix_ms": 1_000 + session,
            "server": "198.18.0.2:5300", "session": session, "overlapping_sessions": overlap,
            "warnings": [], "protocol": "udp", "msg_size_bytes": 14, "duration_ns": 2_000_000_000u64,
            "send_method": "sendmmsg",
            "gso": {"mode": "off", "used": false, "interface": null, "reason": "requested",
                    "explanation": "asked"},
            "sent": sent, "received": received, "lost": lost,
            "loss_percent": percent(lost, sent),
            "sent_pps": sent as f64 / (active_ns as f64 / 1e9),
            "received_pps": received as f64 / (active_ns as f64 / 1e9),
            "flows": [{"flow": 0, "sent": sent, "received": received, "lost": lost}],
        });
        let TestResult::Pps(mut p) = serde_json::from_value(doc).expect("a pps document") else {
            unreachable!()
        };
        if overlap > 0 {
            p.meta
                .add(&Warning::OverlappingSessions { sessions: overlap });
        }
        if lost > 0 {
            p.meta.add(&Warning::PpsLoss {
                lost,
                sent,
                percent: percent(lost, sent),
            });
        }
        p
    }

    #[test]
    fn pps_shares_add_up_over_the_common_window() {
        // Helper b started 2 ms after a; a's target session received for 2.000 s, b's for
        // 1.999 s: the window runs from a's start to b's end, 2.001 s.
        let docs = vec![
            (run("a", 5_000_000), pps(7, 1_000, 990, 2_000_000_000, 1)),
            (run("b", 7_000_000), pps(8, 2_000, 2_000, 1_999_000_000, 1)),
        ];
        let agg = aggregate_pps(&docs, 1);
        assert_eq!((agg.sent, agg.received, agg.lost), (3_000, 2_990, 10));
        let h = agg.helpers.as_ref().expect("helpers");
        assert_eq!(h.start_spread_ns, 2_000_000);
        assert_eq!(h.window_ns, 2_001_000_000);
        let expected = 2_990.0 / 2.001;
        assert!(
            (agg.received_pps - expected).abs() < 1e-6,
            "{}",
            agg.received_pps
        );
        let offsets: Vec<u64> = h.shares.iter().map(|s| s.start_offset_ns).collect();
        assert_eq!(offsets, [0, 2_000_000]);
        assert_eq!(h.shares[1].received, Some(2_000));
        assert_eq!(h.shares[0].session, 7);
        // Flows are numbered across helpers.
        let flows: Vec<u32> = agg.flows.iter().map(|f| f.flow).collect();
        assert_eq!(flows, [0, 1]);
        // Each target session overlapped only the other helper's: no overlap warning; the loss
        // warning is the total's, once.
        assert_eq!(agg.meta.overlapping_sessions, 0);
        assert_eq!(agg.meta.warning_codes, [WarningCode::Loss]);
        assert!(
            agg.meta.warnings[0].contains("10"),
            "{:?}",
            agg.meta.warnings
        );
        assert_eq!(agg.meta.timestamp_unix_ms, 1_007);
    }

    #[test]
    fn overlap_from_others_than_the_helpers_stays() {
        let docs = vec![
            (run("a", 0), pps(1, 10, 10, 1_000_000_000, 2)),
            (run("b", 0), pps(2, 10, 10, 1_000_000_000, 1)),
        ];
        let agg = aggregate_pps(&docs, 1);
        assert_eq!(
            agg.meta.overlapping_sessions, 1,
            "a saw one session besides b's"
        );
        assert_eq!(agg.meta.warning_codes, [WarningCode::OverlappingSessions]);
    }

    #[test]
    fn shift_saturates_both_ways() {
        assert_eq!(shift(10, -3), 7);
        assert_eq!(shift(10, 3), 13);
        assert_eq!(shift(1, -3), 0);
        assert_eq!(shift(u64::MAX, 1), u64::MAX);
    }
}
