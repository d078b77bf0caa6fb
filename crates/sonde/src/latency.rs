//! `sonde latency`: round-trip time.

use std::time::Duration;

use clap::Args;
use sonde_client::LatencyOptions;
use sonde_report::TestResult;
use sonde_wire::Protocol;

use crate::cli::DEFAULT_PORT;
use crate::output::{print, OutputOpt, Progress};

/// Round-trip time: ping-pong (closed loop) or at a fixed rate (open loop)
///
/// RTT is the time from sending a message to receiving the agent's echo of it. It is not one-way
/// latency: sockperf's "latency" is half of this.
#[derive(Debug, Args)]
#[command(after_long_help = concat!("\
By default one message is in flight at a time (closed loop, like sockperf ping-pong). With --rate \
messages leave on a fixed schedule whatever the replies do (open loop), and each RTT counts from \
the message's scheduled send time, so a stall shows in the percentiles instead of hiding \
(no coordinated omission).

Percentiles come from an HDR histogram (3 significant digits). A percentile is stated only when \
at least 10/(1-p) samples were taken (p99: 1,000; p99.99: 100,000); otherwise it reads n/a.

UDP counts lost, duplicated and reordered replies by sequence number; a reply that does not come \
back within max(1 ms, 10 x median RTT) (1 s for the first) is given up on and the next message goes.

Examples:
  sonde latency 198.18.0.2                 TCP, 64-byte messages, 1 s warm-up + 10 s
  sonde latency 198.18.0.2 -u -m 1472      UDP, 1472-byte datagrams
  sonde latency 198.18.0.2 -u --rate 10K   open loop, 10,000 messages per second
  sonde latency 198.18.0.2 -n 100000       100,000 messages after the warm-up

", crate::cli::exit_codes!()))]
pub(crate) struct Opt {
    /// Agent to test: HOST, HOST:PORT, or an IPv6 address (with a port: `[IPv6]:PORT`)
    #[arg(value_name = "HOST[:PORT]")]
    host: String,
    /// UDP instead of TCP
    #[arg(short, long)]
    udp: bool,
    /// Message size each way, bytes (1 to 64K; UDP up to 65507)
    #[arg(short = 'm', long = "msg-size", default_value = "64", value_name = "SIZE", value_parser = crate::units::size)]
    msg_size: u32,
    /// Measured time, seconds, after the warm-up
    #[arg(short = 't', long = "time", default_value = "10", value_name = "SECS", value_parser = crate::units::seconds, conflicts_with = "count")]
    time: Duration,
    /// Send COUNT messages after the warm-up instead of running for -t
    #[arg(short = 'n', long = "count", value_name = "COUNT")]
    count: Option<u64>,
    /// Warm-up before the measured time, seconds; its samples are left out
    #[arg(long, default_value = "1", value_name = "SECS", value_parser = crate::units::seconds)]
    warmup: Duration,
    /// Open loop: send this many messages per second on a fixed schedule (e.g. 1000, 10K)
    #[arg(long, value_name = "MSG_PER_SEC", value_parser = crate::units::per_second)]
    rate: Option<f64>,
    #[command(flatten)]
    output: OutputOpt,
}

pub(crate) fn run(opt: &Opt) -> anyhow::Result<()> {
    let target = sonde_client::resolve(&opt.host, DEFAULT_PORT)?;
    let options = LatencyOptions {
        protocol: if opt.udp {
            Protocol::Udp
        } else {
            Protocol::Tcp
        },
        msg_size: opt.msg_size,
        duration: opt.time,
        warmup: opt.warmup,
        rate: opt.rate,
        count: opt.count,
    };
    let label = format!("latency {}", target.label);
    let expected = match (opt.count, opt.rate) {
        (Some(n), Some(rate)) => Duration::from_secs_f64(n as f64 / rate),
        (Some(_), None) => Duration::ZERO,
        (None, _) => opt.time,
    };
    let progress = Progress::start(&label, opt.warmup + expected);
    let result = sonde_client::latency(&target, &options);
    drop(progress);
    print(&opt.output.render(&TestResult::Latency(result?)))
}
