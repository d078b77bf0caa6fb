//! `sonde load`: latency idle and under load.

use std::time::Duration;

use clap::Args;
use sonde_client::{LatencyOptions, LoadOptions, ThroughputOptions};
use sonde_wire::{Direction, Protocol};

use crate::output::OutputOpt;

/// Latency under load: RTT on the idle path, then while TCP streams fill it (bufferbloat)
///
/// Probes run at a fixed rate (open loop) for -t seconds on the idle path; then -P bulk TCP
/// streams start, and after --ramp seconds the same probes run again while the streams keep the
/// path full. The table shows both RTT distributions side by side and what the load added.
#[derive(Debug, Args)]
#[command(after_long_help = concat!("\
The load is sonde's own throughput test (counted at its receivers) in the direction you choose: \
forward loads the path from this host to the agent, -R the way back, --bidir both. Probes measure \
the round trip, so they see the queue on either side. A queue that fills shows as added RTT at \
every percentile; a path with good queue management (fq_codel, cake, BBR) adds little.

The probes' and the load's sessions overlap on the agent by design; that overlap is not reported \
as other sessions. Each phase's probes are a full latency result in --json (idle, loaded), with the \
load's throughput result and added_rtt_ns (loaded minus idle).

The socket options (-w, -C, -M, -N, -S/--dscp/--ecn, --fq-rate) are the load's: its TCP streams \
at both ends, reported in the load's throughput result. The probes keep the kernel's defaults \
(TCP_NODELAY on), so -C bbr against -C cubic compares what each congestion control does to the \
same probes.

Examples:
  sonde load 198.18.0.2                      TCP probes at 1,000/s, 4 streams forward
  sonde load 198.18.0.2 -u -R -P 8           UDP probes, 8 streams from the agent
  sonde load 198.18.0.2 --bidir -t 20 --ramp 5

", crate::exit::exit_codes!()))]
pub(crate) struct Opt {
    /// Agent to test: HOST, HOST:PORT, or an IPv6 address (with a port: `[IPv6]:PORT`)
    #[arg(value_name = "HOST[:PORT]")]
    host: String,
    /// UDP probes instead of TCP (the load is always TCP)
    #[arg(short, long)]
    udp: bool,
    /// Probe size each way, bytes
    #[arg(short = 'm', long = "msg-size", default_value = "64", value_name = "SIZE", value_parser = crate::units::size)]
    msg_size: u32,
    /// Probes per second, open loop (each RTT counted from its scheduled send time)
    #[arg(long, default_value = "1000", value_name = "MSG_PER_SEC", value_parser = crate::units::per_second)]
    rate: f64,
    /// Measured time of each phase (idle, loaded), seconds, after its warm-up
    #[arg(short = 't', long = "time", default_value = "10", value_name = "SECS", value_parser = crate::units::seconds)]
    time: Duration,
    /// Warm-up before each phase's measured time, seconds
    #[arg(long, default_value = "1", value_name = "SECS", value_parser = crate::units::seconds)]
    warmup: Duration,
    /// How long the load runs before the loaded probes start, seconds (time to fill the queues)
    #[arg(long, default_value = "2", value_name = "SECS", value_parser = crate::units::seconds)]
    ramp: Duration,
    /// Parallel TCP streams of the load (per direction)
    #[arg(short = 'P', long = "parallel", default_value_t = 4, value_name = "N")]
    parallel: u32,
    /// The agent sends the load
    #[arg(short = 'R', long, conflicts_with = "bidir")]
    reverse: bool,
    /// Load both directions at once (-P streams each way)
    #[arg(long)]
    bidir: bool,
    /// Bytes per write of the load
    #[arg(short = 'l', long = "length", default_value = "128K", value_name = "LEN", value_parser = crate::units::size)]
    length: u32,
    #[command(flatten)]
    ip: crate::sockopt::IpOpt,
    #[command(flatten)]
    tcp_opt: crate::sockopt::TcpOpt,
    #[command(flatten)]
    no_delay: crate::sockopt::NoDelayOpt,
    #[command(flatten)]
    pacing: crate::sockopt::PacingOpt,
    #[command(flatten)]
    secret: crate::auth::SecretOpt,
    #[command(flatten)]
    source: crate::source::SourceOpt,
    #[command(flatten)]
    output: OutputOpt,
    #[command(flatten)]
    save: crate::save::SaveOpt,
}

crate::runner::impl_test!(expected: |o| options(o).expected(), run_once: run_once);

/// One run (of --repeat), printed and saved.
fn run_once(opt: &Opt, saver: &mut crate::save::Saver) -> anyhow::Result<()> {
    let target = crate::route::agent("load", &opt.host, &opt.secret, &opt.source.source(None)?)?;
    let options = options(opt);
    let label = format!("load {}", target.label);
    crate::runner::measure(
        saver,
        opt.output,
        &label,
        options.expected(),
        |interrupt, _| {
            let controls = sonde_client::Controls::new().interrupt(interrupt);
            Ok(crate::runner::client_run(&target, &options, controls)?)
        },
    )
}

/// The probes, the load and the ramp the options ask for.
fn options(opt: &Opt) -> LoadOptions {
    LoadOptions {
        probes: LatencyOptions {
            protocol: if opt.udp {
                Protocol::Udp
            } else {
                Protocol::Tcp
            },
            msg_size: opt.msg_size,
            duration: opt.time,
            warmup: opt.warmup,
            rate: Some(opt.rate),
            count: None,
            ..LatencyOptions::default()
        },
        load: ThroughputOptions {
            protocol: Protocol::Tcp,
            parallel: opt.parallel,
            direction: if opt.bidir {
                Direction::Bidir
            } else if opt.reverse {
                Direction::Reverse
            } else {
                Direction::Forward
            },
            msg_size: opt.length,
            interval: Some(Duration::from_secs(1)),
            // The socket options are the load's; the probes keep the kernel's defaults.
            socket: crate::sockopt::socket_options(
                &opt.ip,
                crate::sockopt::Taken {
                    tcp: Some(&opt.tcp_opt),
                    no_delay: Some(&opt.no_delay),
                    df: None,
                    pacing: Some(&opt.pacing),
                    zerocopy: None,
                },
            ),
            ..ThroughputOptions::default()
        },
        ramp: opt.ramp,
    }
}
