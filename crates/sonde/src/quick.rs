//! `sonde quick`: the embedded default. An agent in this process on loopback, and every test
//! against it, so one command shows what sonde does without a second host.

use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::Ordering;
use std::time::Duration;

use clap::Args;
use sonde_agent::{Agent, AgentConfig};
use sonde_client::{Controls, CrrOptions, LatencyOptions, PpsOptions, Target, ThroughputOptions};
use sonde_report::{QuickCase, QuickResult, TestResult};
use sonde_wire::{Direction, Protocol};

use crate::output::{OutputOpt, Progress};
use crate::runner::client_run;
use crate::save::{Measured, Saver};

/// Everything on loopback against an in-process agent (about 25 s)
///
/// Runs TCP and UDP latency, TCP throughput with 1 and 2 streams, UDP packet rate and TCP
/// connection rate against an agent started inside this process on 127.0.0.1. Loopback measures
/// this host's network stack and CPUs, not a network: it shows what sonde measures and how it
/// reports, with no second host.
#[derive(Debug, Args)]
#[command(after_long_help = concat!("Example:
  sonde quick --json > quick.json

", crate::exit::exit_codes!()))]
pub(crate) struct Opt {
    /// Seconds per case (warm-up included for latency)
    #[arg(short = 't', long = "time", default_value = "3.5", value_name = "SECS", value_parser = crate::units::seconds)]
    time: Duration,
    #[command(flatten)]
    output: OutputOpt,
    #[command(flatten)]
    save: crate::save::SaveOpt,
}

/// One case: its name and how to run it.
type Case<'a> = (
    &'static str,
    Box<dyn Fn() -> Result<Measured, sonde_client::ClientError> + 'a>,
);

pub(crate) fn run(opt: &Opt) -> anyhow::Result<()> {
    crate::save::repeat(&opt.save, opt.output, |saver| run_once(opt, saver))
}

/// One run (of --repeat), printed and saved.
fn run_once(opt: &Opt, saver: &mut Saver) -> anyhow::Result<()> {
    let agent = Agent::bind(AgentConfig::new(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))))?;
    let addr = agent.local_addr();
    let handle = agent.spawn();
    let target = Target {
        addr,
        label: addr.to_string(),
        secret: None,
        source: sonde_client::Source::default(),
    };
    let started = sonde_client::now_unix_ms();
    let t = opt.time;
    let warmup = (t / 7).min(Duration::from_secs(1));
    let latency = |protocol| LatencyOptions {
        protocol,
        msg_size: 64,
        duration: t.saturating_sub(warmup),
        warmup,
        rate: None,
        count: None,
        ..LatencyOptions::default()
    };
    let throughput = |parallel| ThroughputOptions {
        protocol: Protocol::Tcp,
        parallel,
        direction: Direction::Forward,
        duration: t,
        ..ThroughputOptions::default()
    };
    // Ctrl-C or SIGTERM stops the case under way as its planned end would: the cases measured
    // so far and that one are printed and saved, and quick exits 130 (143).
    let interrupt = crate::interrupt::install();
    interrupt.check()?;
    let stop = interrupt.flag();
    let cases: [Case<'_>; 6] = [
        (
            "tcp latency",
            Box::new(|| {
                client_run(
                    &target,
                    &latency(Protocol::Tcp),
                    Controls::new().interrupt(stop),
                )
            }),
        ),
        (
            "udp latency",
            Box::new(|| {
                client_run(
                    &target,
                    &latency(Protocol::Udp),
                    Controls::new().interrupt(stop),
                )
            }),
        ),
        (
            "tcp throughput x1",
            Box::new(|| client_run(&target, &throughput(1), Controls::new().interrupt(stop))),
        ),
        (
            "tcp throughput x2",
            Box::new(|| client_run(&target, &throughput(2), Controls::new().interrupt(stop))),
        ),
        (
            "udp pps",
            Box::new(|| {
                let o = PpsOptions {
                    duration: t,
                    ..PpsOptions::default()
                };
                client_run(&target, &o, Controls::new().interrupt(stop))
            }),
        ),
        (
            "tcp crr x2",
            Box::new(|| {
                let o = CrrOptions {
                    workers: 2,
                    duration: t,
                    ..CrrOptions::default()
                };
                client_run(&target, &o, Controls::new().interrupt(stop))
            }),
        ),
    ];
    let mut results = Vec::new();
    // Each case is saved as its own run as soon as it is measured, all in one group.
    saver.grouped("quick");
    let total = cases.len();
    for (n, (case, run)) in cases.iter().enumerate() {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let progress = Progress::start(&format!("[{}/{total}] {case}", n + 1), t);
        let result = run();
        drop(progress);
        let mut m = match result {
            Ok(m) => m,
            // A case that fails because it was stopped leaves the cases measured before it.
            Err(_) if stop.load(Ordering::Relaxed) && !results.is_empty() => break,
            Err(e) => return Err(e.into()),
        };
        saver.label(&mut m.result, Some(("case", (*case).to_owned())));
        saver.save(&m);
        results.push(QuickCase {
            case: (*case).to_owned(),
            result: m.result,
        });
    }
    handle.stop();
    let doc = TestResult::Quick(QuickResult {
        sonde_version: env!("CARGO_PKG_VERSION").into(),
        timestamp_unix_ms: started,
        labels: saver.labels().clone(),
        results,
    });
    saver.print(opt.output, &doc)?;
    interrupt.check()
}
