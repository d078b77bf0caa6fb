//! `sonde throughput`: bandwidth.

use std::time::Duration;

use clap::Args;
use sonde_client::ThroughputOptions;
use sonde_report::TestResult;
use sonde_wire::{Direction, Protocol};

use crate::cli::DEFAULT_PORT;
use crate::output::{print, OutputOpt, Progress};

/// Bandwidth: TCP or UDP, parallel streams, reverse or both directions
///
/// Bulk transfer, counted at the receiver.
#[derive(Debug, Args)]
#[command(after_long_help = concat!("\
The headline figure is what the receiver counted, over the receiver's own first-to-last-byte \
time. The sender's figure (what it handed to its kernel) is shown beside it, labelled: it reads \
high while socket buffers fill. -i intervals are counted at the receiver too, so no interval can \
read above the link.

UDP datagrams carry a 16-byte header (64-bit sequence number, send time); loss, duplicates, \
reordering and RFC 3550 jitter are measured at the receiver, and loss includes datagrams lost \
after the last one that arrived. UDP is paced smoothly at -b; -b 0 sends as fast as possible.

Examples:
  sonde throughput 198.18.0.2                    TCP, one stream, 10 s
  sonde throughput 198.18.0.2 -P 4 -R            4 streams, the agent sends
  sonde throughput 198.18.0.2 --bidir -i 1       both directions, 1 s intervals
  sonde throughput 198.18.0.2 -u -b 1G -l 1400   UDP at 1 Gbit/s (all streams together)

", crate::cli::exit_codes!()))]
pub(crate) struct Opt {
    /// Agent to test: HOST, HOST:PORT, or an IPv6 address (with a port: `[IPv6]:PORT`)
    #[arg(value_name = "HOST[:PORT]")]
    host: String,
    /// UDP instead of TCP
    #[arg(short, long)]
    udp: bool,
    /// Parallel streams (per direction)
    #[arg(short = 'P', long = "parallel", default_value_t = 1, value_name = "N")]
    parallel: u32,
    /// Reverse: the agent sends, this host receives
    #[arg(short = 'R', long, conflicts_with = "bidir")]
    reverse: bool,
    /// Both directions at once (-P streams each way)
    #[arg(long)]
    bidir: bool,
    /// UDP target rate for all streams of one direction together, bits/s (100M, 1G; 0 = as fast as possible)
    #[arg(short = 'b', long = "bitrate", default_value = "1M", value_name = "RATE", value_parser = crate::units::bitrate)]
    bitrate: u64,
    /// Bytes per write (TCP: 1 to 1M, default 128K) or datagram payload (UDP: 16 to 65507,
    /// default 1400)
    #[arg(short = 'l', long = "length", value_name = "LEN", value_parser = crate::units::size)]
    length: Option<u32>,
    /// How long to send, seconds
    #[arg(short = 't', long = "time", default_value = "10", value_name = "SECS", value_parser = crate::units::seconds)]
    time: Duration,
    /// Report every SECS seconds (counted at the receiver)
    #[arg(short = 'i', long = "interval", value_name = "SECS", value_parser = crate::units::seconds)]
    interval: Option<Duration>,
    #[command(flatten)]
    output: OutputOpt,
}

pub(crate) fn run(opt: &Opt) -> anyhow::Result<()> {
    let target = sonde_client::resolve(&opt.host, DEFAULT_PORT)?;
    let protocol = if opt.udp {
        Protocol::Udp
    } else {
        Protocol::Tcp
    };
    let options = ThroughputOptions {
        protocol,
        parallel: opt.parallel,
        direction: if opt.bidir {
            Direction::Bidir
        } else if opt.reverse {
            Direction::Reverse
        } else {
            Direction::Forward
        },
        msg_size: opt.length.unwrap_or(match protocol {
            Protocol::Tcp => 128 * 1024,
            Protocol::Udp => 1400,
        }),
        bitrate: opt.bitrate,
        duration: opt.time,
        interval: opt.interval.filter(|d| !d.is_zero()),
    };
    let progress = Progress::start(&format!("throughput {}", target.label), opt.time);
    // Live interval lines go to the terminal above the progress bar; the table (or JSON, CSV)
    // on stdout holds every interval once, aligned.
    let mut live = |iv: &sonde_report::IntervalResult| {
        progress.println(&sonde_report::render::interval_line(iv));
    };
    let result = sonde_client::throughput(&target, &options, &mut live);
    drop(progress);
    print(&opt.output.render(&TestResult::Throughput(result?)))
}
