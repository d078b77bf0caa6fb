//! sonde's latency test against a real `sockperf server` (`sockperf sr`), reached as
//! `sockperf://HOST[:PORT]` (docs/protocols/sockperf.md).
//!
//! sockperf has no control channel: the client sends messages with sockperf's 14-byte header
//! (seq from 1, flags `CLIENT | PONG_REQUEST`, length = the message size) and the server echoes
//! each with the client flag cleared. The loops are sonde's own ([`sonde_net::latency`] with
//! [`Framing::Sockperf`]): closed loop by default, open loop with a rate, the warm-up's samples
//! left out, RTT into the same histogram, and the same [`LatencyResult`] with
//! `peer: "sockperf"` and session 0.
//!
//! The inner view's client-side part works here as against an agent, through the same code
//! (`inner::with_view` around [`sonde_net::latency::ping`]):
//! `--full-log` (every message as the client saw it) and `--timestamps` (the kernel's stamps on
//! the client's own socket). `--one-way` does not: a sockperf server does not stamp its replies.
//!
//! What a sockperf server cannot tell us is stated in the result's warnings: it reports no
//! counts, so UDP loss is not split into requests and replies lost (`lost_outbound` and
//! `lost_return` are null), and other clients it served meanwhile are not known.
//!
//! Unlike sockperf's client, sonde does not sleep 2 s before sending, and it reports the full
//! round trip: sockperf's "latency" is half of it (`sockperf ping-pong --full-rtt` reports the
//! same quantity as sonde).
//!
//! ```no_run
//! use sonde_client::{run, sockperf, Controls, LatencyOptions};
//! let server = sockperf::parse_target("sockperf://127.0.0.1").unwrap().unwrap();
//! let m = run(&server, &LatencyOptions::default(), Controls::new()).unwrap();
//! println!("median RTT {:?} ns", m.result.rtt_ns.p50);
//! ```

use std::io;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;

use sonde_net::latency::{Framing, LatencyOutcome, NoReply, PingConfig};
use sonde_net::Clock;
use sonde_report::{LatencyResult, Peer};
use sonde_wire::sockperf::{DEFAULT_PORT, MAX_TCP_MSG, MAX_UDP_MSG, MIN_MSG, SERVER_MAX_MSG};
use sonde_wire::{AgentReport, Protocol, SessionId};

use crate::run::{ClientChannel, LatencyRun};
use crate::{ClientError, LatencyOptions, SockperfServer, Target};

/// The scheme that names a sockperf server as the target.
pub const SCHEME: &str = "sockperf://";

/// How long a TCP connection to the server may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// `Some` when `spec` names a sockperf server (`sockperf://HOST[:PORT]`, port 11111 by default;
/// HOST as [`crate::resolve`] takes it), `None` when it does not start with [`SCHEME`] (a sonde
/// agent, for [`crate::resolve`]). The target's label keeps the scheme.
pub fn parse_target(spec: &str) -> Option<Result<SockperfServer, ClientError>> {
    let scheme = spec.get(..SCHEME.len())?;
    if !scheme.eq_ignore_ascii_case(SCHEME) {
        return None;
    }
    let rest = spec[SCHEME.len()..].trim_end_matches('/');
    if rest.is_empty() {
        return Some(Err(ClientError::Usage(format!(
            "`{spec}` names no host: write {SCHEME}HOST or {SCHEME}HOST:PORT"
        ))));
    }
    Some(crate::resolve(rest, DEFAULT_PORT).map(|t| {
        SockperfServer(Target {
            label: format!("{SCHEME}{}", t.addr),
            ..t
        })
    }))
}

crate::test::impl_test!(
    /// sonde's latency test against the `sockperf server` at the target: TCP or UDP per
    /// `protocol` (the server must run with `--tcp` for TCP), `msg_size` of 14 bytes or more,
    /// with the full log and kernel timestamps when asked for; the result keeps its RTT
    /// histogram. Interrupted (Ctrl-C), the loop ends as its planned end would, and the result
    /// covers what was measured until then, marked `interrupted`.
    ///
    /// Errors: [`ClientError::Usage`] for a message size sockperf cannot carry, `one_way` (it
    /// needs a sonde agent) or a full log that cannot be created; [`ClientError::NoReply`]
    /// (exit code 3) when the server never answered or cannot be connected to;
    /// [`ClientError::Data`] for a failure in the middle of the run.
    LatencyOptions, SockperfServer => crate::LatencyMeasurement,
    interval: sonde_report::LatencyInterval,
    |server, opt, interrupt| latency(&server.0, opt, interrupt),
);

fn latency(
    target: &Target,
    opt: &LatencyOptions,
    interrupt: &AtomicBool,
) -> Result<crate::LatencyMeasurement, ClientError> {
    if opt.many_flows() {
        return Err(ClientError::Usage(
            "-P, --depth and --response-size need a sonde agent: a sockperf server answers one \
             flow's ping-pong (sockperf's own many-flow mode is not emulated)"
                .into(),
        ));
    }
    if opt.interval.is_some() {
        return Err(ClientError::Usage(
            "-i against a sockperf server: not supported yet (the intervals are sonde's own \
             agent's test); leave out -i, or test a sonde agent"
                .into(),
        ));
    }
    let max = match opt.protocol {
        Protocol::Udp => MAX_UDP_MSG,
        Protocol::Tcp => MAX_TCP_MSG,
    };
    if !(MIN_MSG..=max).contains(&opt.msg_size) {
        return Err(ClientError::Usage(format!(
            "sockperf messages carry a {MIN_MSG}-byte header: -m must be {MIN_MSG} to {max} bytes \
             over {} (a sockperf server takes up to {SERVER_MAX_MSG} unless started with a \
             larger -m)",
            proto_name(opt.protocol)
        )));
    }
    if opt.rate.is_some_and(|r| !(r > 0.0 && r.is_finite())) {
        return Err(ClientError::Usage(
            "--rate must be a positive number of messages per second".into(),
        ));
    }
    if opt.count == Some(0) {
        return Err(ClientError::Usage("-n must be at least 1".into()));
    }
    if opt.busy_poll || opt.cpu.is_some() {
        return Err(ClientError::Usage(
            "--busy-poll and --cpu are for tests against a sonde agent (it busy-polls and pins \
             its echo too); a sockperf server runs as it was started"
                .into(),
        ));
    }
    if opt.one_way {
        return Err(ClientError::Usage(
            "--one-way needs a sonde agent's timestamps: a sockperf server does not stamp its \
             replies"
                .into(),
        ));
    }
    // A log file that cannot be created is a usage error before anything is sent.
    crate::inner::check(opt)?;
    let mut opt = opt.clone();
    // Open loop with a count: the schedule puts exactly `count` messages after the warm-up.
    if let (Some(n), Some(rate)) = (opt.count, opt.rate) {
        opt.duration = Duration::from_secs_f64(n as f64 / rate);
        opt.count = None;
    }
    let warmup_ns = nanos(opt.warmup);
    let cfg = PingConfig {
        msg_size: opt.msg_size,
        // A closed loop with a count ends at the count: there is no agent limit to stop at.
        until_ns: if opt.count.is_some() {
            u64::MAX
        } else {
            warmup_ns.saturating_add(nanos(opt.duration))
        },
        warmup_ns,
        rate: opt.rate,
        count: opt.count,
    };
    let started_unix_ms = crate::now_unix_ms();
    let stop = AtomicBool::new(false);
    let channel = match opt.protocol {
        Protocol::Tcp => ClientChannel::Tcp(
            sonde_net::socket::tcp_connect(target.addr, CONNECT_TIMEOUT, true)
                .map_err(|e| no_reply(target, opt.protocol, &format!("(cannot connect: {e})")))?,
        ),
        Protocol::Udp => ClientChannel::Udp(
            sonde_net::socket::udp_connect(target.addr).map_err(|e| ClientError::Data(e, 0))?,
        ),
    };
    let measured = crate::session::stopped_by(interrupt, &stop, || {
        crate::session::metered_latency(cfg.msg_size, |meter| {
            // The loop's length, taken before the full log's writer drains.
            let mut elapsed_ns = 0;
            let outcome = crate::inner::with_view(&opt, Some(Arc::clone(meter)), None, |view| {
                let clock = Clock::start();
                let out = match &channel {
                    ClientChannel::Tcp(s) => {
                        sonde_net::latency::ping(s, &cfg, Framing::Sockperf, view, &clock, &stop)
                    }
                    ClientChannel::Udp(s) => {
                        sonde_net::latency::ping(s, &cfg, Framing::Sockperf, view, &clock, &stop)
                    }
                };
                elapsed_ns = clock.now_ns();
                out.map_err(|e| run_error(target, opt.protocol, e))
            })?;
            Ok((outcome, elapsed_ns))
        })
    });
    let (outcome, elapsed_ns, client_cpu) = measured?;
    let interrupted = interrupt.load(std::sync::atomic::Ordering::Relaxed);
    if outcome.sent > 0 && replies(&outcome) == 0 {
        return Err(no_reply(
            target,
            opt.protocol,
            &format!("within {:.1} s", elapsed_ns as f64 / 1e9),
        ));
    }
    let run = LatencyRun {
        session: SessionId(0),
        started_unix_ms,
        outcome,
        elapsed_ns,
        report: AgentReport::default(),
        context: crate::run::Context {
            client_cpu,
            ..crate::run::Context::this_host(target)
        },
        interrupted,
        tuning: None,
        intervals: Vec::new(),
        many_flows: None,
    };
    let mut result = document(target, &opt, &run);
    if interrupted {
        crate::mark_interrupted(&mut result.meta);
    }
    Ok(crate::LatencyMeasurement {
        result,
        rtt_histogram: run.outcome.rtt.serialized(),
    })
}

/// Replies received, warm-up included.
fn replies(o: &LatencyOutcome) -> u64 {
    match &o.seq {
        Some(t) => t.received(),
        None => o.rtt.samples() + o.rtt.warmup_excluded(),
    }
}

/// sonde's latency document, told what a sockperf server leaves unknown.
fn document(target: &Target, opt: &LatencyOptions, run: &LatencyRun) -> LatencyResult {
    let mut doc = crate::results::latency(target, opt, run);
    doc.meta.peer = Peer::Sockperf;
    // Nothing to split the loss with: the server counts nothing it tells us.
    doc.lost_outbound = None;
    doc.lost_return = None;
    if opt.protocol == Protocol::Udp {
        doc.meta.add(&sonde_report::Warning::SockperfLossNotSplit);
    }
    doc.meta.add(&sonde_report::Warning::SockperfOverlapUnknown);
    doc
}

fn run_error(target: &Target, protocol: Protocol, e: io::Error) -> ClientError {
    match NoReply::of(&e) {
        Some(NoReply::TimedOut(d)) => {
            no_reply(target, protocol, &format!("within {} s", d.as_secs_f64()))
        }
        Some(NoReply::Closed) => no_reply(
            target,
            protocol,
            &format!(
                "(it closed the connection: is -m above its maximum, {SERVER_MAX_MSG} bytes \
                 unless started with a larger -m?)"
            ),
        ),
        None if e.kind() == io::ErrorKind::ConnectionRefused => no_reply(
            target,
            protocol,
            "(its UDP port is closed: ICMP port unreachable)",
        ),
        None => ClientError::Data(e, 0),
    }
}

/// The one line for a server that does not answer: where, what happened, what to check.
fn no_reply(target: &Target, protocol: Protocol, what: &str) -> ClientError {
    let hint = match protocol {
        Protocol::Udp => "is `sockperf server` running there (UDP is its default; with --tcp it serves TCP only)?",
        Protocol::Tcp => "is `sockperf server --tcp` running there (without --tcp it serves UDP only)?",
    };
    ClientError::NoReply(format!(
        "no reply from sockperf server at {} over {} {what}: {hint}",
        target.addr,
        proto_name(protocol)
    ))
}

fn proto_name(p: Protocol) -> &'static str {
    match p {
        Protocol::Tcp => "TCP",
        Protocol::Udp => "UDP",
    }
}

fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_scheme_names_a_sockperf_server() {
        let t = parse_target("sockperf://127.0.0.1").unwrap().unwrap().0;
        assert_eq!(t.addr, "127.0.0.1:11111".parse().unwrap());
        assert_eq!(t.label, "sockperf://127.0.0.1:11111");
        let t = parse_target("SOCKPERF://127.0.0.1:7000/")
            .unwrap()
            .unwrap()
            .0;
        assert_eq!(t.addr.port(), 7000);
        let t = parse_target("sockperf://[::1]:7000").unwrap().unwrap().0;
        assert!(t.addr.is_ipv6());
        assert_eq!(
            parse_target("sockperf://::1")
                .unwrap()
                .unwrap()
                .0
                .addr
                .port(),
            11111
        );
        // Not this scheme: left to the sonde resolver.
        assert!(parse_target("127.0.0.1").is_none());
        assert!(parse_target("iperf3://127.0.0.1").is_none());
        assert!(parse_target("sock").is_none());
        assert!(matches!(
            parse_target("sockperf://"),
            Some(Err(ClientError::Usage(_)))
        ));
        assert!(matches!(
            parse_target("sockperf://no-such-host.invalid"),
            Some(Err(ClientError::Resolve(..)))
        ));
    }

    #[test]
    fn sizes_sockperf_cannot_carry_are_usage_errors() {
        let target = parse_target("sockperf://127.0.0.1:9").unwrap().unwrap();
        for (protocol, size) in [
            (Protocol::Udp, 13),
            (Protocol::Udp, 65_508),
            (Protocol::Tcp, 1),
            (Protocol::Tcp, 1_048_576),
        ] {
            let opt = LatencyOptions {
                protocol,
                msg_size: size,
                ..LatencyOptions::default()
            };
            let err = crate::run(&target, &opt, crate::Controls::new()).unwrap_err();
            assert_eq!(err.exit_code(), 2, "{err}");
            assert!(err.to_string().contains("-m must be 14 to"), "{err}");
        }
    }

    #[test]
    fn one_way_and_an_uncreatable_log_are_usage_errors_before_anything_is_sent() {
        // Nothing listens on port 9: a usage error must come before any attempt to reach it.
        let target = parse_target("sockperf://127.0.0.1:9").unwrap().unwrap();
        let one_way = LatencyOptions {
            protocol: Protocol::Udp,
            one_way: true,
            ..LatencyOptions::default()
        };
        let err = crate::run(&target, &one_way, crate::Controls::new()).unwrap_err();
        assert_eq!(err.exit_code(), 2, "{err}");
        assert!(err.to_string().contains("--one-way"), "{err}");
        let log = LatencyOptions {
            protocol: Protocol::Tcp,
            full_log: Some("/nonexistent-dir-of-sonde/rtt.csv".into()),
            ..LatencyOptions::default()
        };
        let err = crate::run(&target, &log, crate::Controls::new()).unwrap_err();
        assert_eq!(err.exit_code(), 2, "{err}");
        assert!(err.to_string().contains("cannot create"), "{err}");
    }

    #[test]
    fn no_reply_is_exit_3_and_says_what_to_check() {
        let target = parse_target("sockperf://127.0.0.1:9").unwrap().unwrap().0;
        let e = no_reply(&target, Protocol::Tcp, "within 5 s");
        assert_eq!(e.exit_code(), 3);
        assert_eq!(
            e.to_string(),
            "no reply from sockperf server at 127.0.0.1:9 over TCP within 5 s: is `sockperf \
             server --tcp` running there (without --tcp it serves UDP only)?"
        );
        let refused = run_error(
            &target,
            Protocol::Udp,
            io::Error::from(io::ErrorKind::ConnectionRefused),
        );
        assert_eq!(refused.exit_code(), 3);
        let mid_run = run_error(&target, Protocol::Udp, io::Error::other("boom"));
        assert_eq!(mid_run.exit_code(), 1);
    }
}
