//! `sonde throughput`: bandwidth.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use clap::Args;
use sonde_client::{Controls, FromHelpers, Iperf3Server, Target, Test, ThroughputOptions};
use sonde_engine::sweep::{Sweep, SweepParam};
use sonde_report::{IntervalResult, ThroughputResult};
use sonde_wire::{Direction, Protocol};

use crate::output::{OutputOpt, Progress};
use crate::route::{label, Direct, Route, Server};
use crate::runner::client_run;
use crate::save::Saver;

/// Bandwidth: TCP or UDP, parallel streams, reverse or both directions
///
/// Bulk transfer, counted at the receiver.
#[derive(Debug, Args)]
#[command(after_long_help = concat!("\
The headline figure is what the receiver counted, over the receiver's own first-to-last-byte \
time. The sender's figure (what it handed to its kernel) is shown beside it, labelled: it reads \
high while socket buffers fill. -i intervals are counted at the receiver too, so no interval can \
read above the link.

TCP receivers read up to 512 KiB per call (--read-size). With small writes (-l 1 to a few \
hundred bytes) that choice sets the figure: a receiver that empties its queue at every read has \
TCP acknowledge at once, and Nagle's algorithm then sends each small write in a segment of its \
own; a receiver that reads one message at a time (--read-size equal to -l, as qperf's and \
iperf3's do) leaves data queued, acknowledgements come later and segments carry many writes. \
On loopback the second read 1.4 to 1.8 times the 1-byte writes per second.

UDP datagrams carry a 16-byte header (64-bit sequence number, send time); loss, duplicates, \
reordering and RFC 3550 jitter are measured at the receiver, and loss includes datagrams lost \
after the last one that arrived. UDP is paced smoothly at -b; -b 0 sends as fast as possible.

Against a real `iperf3 -s`, write the target as iperf3://HOST[:PORT] (port 5201 by default): \
the same flags, sonde's own output (tested with iperf3 3.12 in CI, and by hand with 3.16, \
3.17.1 and 3.19.1). What the iperf3 server received comes from its \
results (bytes, and for UDP its packet, loss and jitter counts); what it does not report \
(duplicates, reordering, its read calls, its intervals) is null or explained in a warning, and \
-i intervals of client-to-server streams are counted at this sender. Exit code 3 also means \
that what answered is not an iperf3 server, 4 that it is busy or refused the test; Ctrl-C tells \
the server (CLIENT_TERMINATE) and exits 130.

Examples:
  sonde throughput 198.18.0.2                    TCP, one stream, 10 s
  sonde throughput 198.18.0.2 -P 4 -R            4 streams, the agent sends
  sonde throughput 198.18.0.2 --bidir -i 1       both directions, 1 s intervals
  sonde throughput 198.18.0.2 -O 2 -i 1         slow start left out: 2 s sent first, not counted
  sonde throughput 198.18.0.2 -n 1G -P 4         1 GiB in all, then the test ends
  sonde throughput 198.18.0.2 -u -b 1G -l 1400   UDP at 1 Gbit/s (all streams together)
  sonde throughput iperf3://198.18.0.2 -P 4      against `iperf3 -s` on port 5201
  sonde throughput iperf3://198.18.0.2:5202 -u -b 100M -R
                                                 UDP, the iperf3 server sends 100 Mbit/s
  sonde throughput 198.18.0.2 --sweep parallel=1:16:*2
                                                 where more streams stop adding bandwidth
  sonde throughput B --from A1 --from A2 -P 4 --secret-file s
                                                 two helper agents, 4 streams each, to B at once
  sonde throughput 198.18.0.2 -u --sweep bitrate=100M:1G:+100M
                                                 where UDP loss starts
  sonde throughput 198.18.0.2 -l 64 --read-size 64
                                                 64-byte messages, read one at a time

", crate::exit::exit_codes!()))]
pub(crate) struct Opt {
    /// Agent to test: HOST, HOST:PORT, or an IPv6 address (with a port: `[IPv6]:PORT`); a real
    /// iperf3 server as `iperf3://HOST[:PORT]`
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
    /// Target rate of all streams of one direction together, bits/s (100M, 1G). UDP: paced by
    /// sonde (default 1M; 0 = as fast as possible). TCP: each stream paced by its kernel at its
    /// share, SO_MAX_PACING_RATE = RATE / -P (default: unpaced). iperf3's -b is per stream:
    /// iperf3 -b R -P N is sonde -b R*N, or --fq-rate R
    #[arg(short = 'b', long = "bitrate", value_name = "RATE", value_parser = crate::units::bitrate)]
    bitrate: Option<u64>,
    /// Bytes per write (TCP: 1 to 1M, default 128K) or datagram payload (UDP: 16 to 65507,
    /// default 1400)
    #[arg(short = 'l', long = "length", value_name = "LEN", value_parser = crate::units::size)]
    length: Option<u32>,
    /// TCP: the most each receiver reads per call (1 to 16M; default 512K). With small -l it
    /// sets the segment sizes and so the throughput: `--read-size` equal to -l reads a message
    /// at a time, as qperf and iperf3 do
    #[arg(long = "read-size", value_name = "SIZE", value_parser = crate::units::size)]
    read_size: Option<u32>,
    /// How long to send, seconds
    #[arg(short = 't', long = "time", default_value = "10", value_name = "SECS", value_parser = crate::units::seconds)]
    time: Duration,
    /// Send this many bytes in all (iperf3 -n; one direction), each stream its share, instead
    /// of for -t: the test ends when the receivers have them (UDP: whole -l datagrams, the
    /// last past the count where it does not divide; the receivers end when they have every
    /// datagram or a moment after the last was sent), within the agent's --max-duration.
    /// Against iperf3:// (TCP only), when this host has sent them or, with -R, received them,
    /// as iperf3's client. 10M, 1G. Default: timed by -t
    #[arg(short = 'n', long = "bytes", value_name = "SIZE", value_parser = crate::units::byte_count, conflicts_with_all = ["time", "blockcount"])]
    bytes: Option<u64>,
    /// Send this many -l writes (UDP: datagrams) in all (iperf3 -k; one direction), instead
    /// of for -t. Default: timed by -t
    #[arg(
        short = 'k',
        long = "blockcount",
        value_name = "N",
        conflicts_with = "time"
    )]
    blockcount: Option<u64>,
    /// Omit the first SECS seconds (iperf3 -O; whole seconds and TCP only against iperf3://):
    /// sent and received but not counted, so slow start and filling buffers stay out of the
    /// figures; a UDP receiver cuts them off by sequence number, so loss stays exact. Their -i
    /// intervals are shown marked (omitted). Sent on top of -t. Default: 0
    #[arg(short = 'O', long = "omit", value_name = "SECS", value_parser = crate::units::seconds)]
    omit: Option<Duration>,
    /// TCP: the receivers at both ends discard what they read without copying it to this
    /// process (MSG_TRUNC, Linux; iperf3 --skip-rx-copy), so the CPU cost reported leaves
    /// the copy out. Default: off (the data is copied, as an application would)
    #[arg(long = "skip-rx-copy")]
    skip_rx_copy: bool,
    /// Report every SECS seconds (counted at the receiver)
    #[arg(short = 'i', long = "interval", value_name = "SECS", value_parser = crate::units::seconds)]
    interval: Option<Duration>,
    /// Run once per value: msg_size (-l), parallel (-P) or bitrate (-b, UDP), e.g.
    /// `parallel=1:16:*2`
    #[arg(long, value_name = "PARAM=VALUES", value_parser = crate::sweep::parse, long_help = crate::sweep::SWEEP_HELP)]
    sweep: Option<Sweep>,
    /// Run this host's streams on these CPUs, stream i on the i-th of the list (round robin),
    /// and ask the agent to pin its streams too (to its --cpu-list): `0-3`, `1,3` (Linux)
    #[arg(long, value_name = "LIST", value_parser = crate::units::cpu_list, conflicts_with = "from")]
    cpu: Option<crate::units::CpuList>,
    #[command(flatten)]
    ip: crate::sockopt::IpOpt,
    #[command(flatten)]
    tcp_opt: crate::sockopt::TcpOpt,
    #[command(flatten)]
    no_delay: crate::sockopt::NoDelayOpt,
    #[command(flatten)]
    df: crate::sockopt::DfOpt,
    #[command(flatten)]
    pacing: crate::sockopt::PacingOpt,
    #[command(flatten)]
    zerocopy: crate::sockopt::ZerocopyOpt,
    #[command(flatten)]
    from: crate::helpers::FromOpt,
    #[command(flatten)]
    secret: crate::auth::SecretOpt,
    #[command(flatten)]
    source: crate::source::SourceOpt,
    #[command(flatten)]
    cport: crate::source::CportOpt,
    #[command(flatten)]
    output: OutputOpt,
    #[command(flatten)]
    save: crate::save::SaveOpt,
}

// With -n or -k the length is not known in advance: the progress bar shows -t's default.
crate::runner::impl_test!(expected: |o| o.time + o.omit.unwrap_or_default(), run_once: run_once);

/// One run (of --repeat), printed and saved.
fn run_once(opt: &Opt, saver: &mut Saver) -> anyhow::Result<()> {
    let iperf3 = Server::of(&opt.host) == Server::Iperf3;
    if opt.cpu.is_some() && iperf3 {
        return Err(crate::units::BadValue(
            "--cpu pins the streams of a test against a sonde agent, which pins its own too; \
             an iperf3 server cannot be asked to"
                .into(),
        )
        .into());
    }
    if (opt.bytes.is_some() || opt.blockcount.is_some()) && !opt.from.is_empty() {
        return Err(crate::units::BadValue(
            "-n and -k are for a test this host runs (against a sonde agent or an iperf3:// \
             server): with --from each helper would end at its own time, and no common window \
             would hold every helper's count"
                .into(),
        )
        .into());
    }
    if opt.skip_rx_copy && iperf3 {
        return Err(crate::units::BadValue(
            "--skip-rx-copy sets how a sonde agent receives; iperf3's server cannot be asked \
             (run it with its own --skip-rx-copy)"
                .into(),
        )
        .into());
    }
    if opt.read_size.is_some() && iperf3 {
        return Err(crate::units::BadValue(
            "--read-size sets how a sonde agent reads; an iperf3 server reads its block size \
             (-l) per call and cannot be asked otherwise"
                .into(),
        )
        .into());
    }
    let route = Route::resolve(
        "throughput",
        &opt.host,
        &[Server::Iperf3],
        Some(&opt.from),
        &opt.secret,
        &opt.source.source(opt.cport.get())?,
        opt.sweep.is_some(),
    )?;
    let options = options(opt);
    match (&route, &opt.sweep) {
        (Route::Helpers(helpers), _) => run_from(opt, helpers, &options, saver),
        (Route::Agent(target), Some(sweep)) => run_sweep(opt, target, &options, sweep, saver),
        (Route::Iperf3(server), Some(sweep)) => run_sweep(opt, server, &options, sweep, saver),
        (Route::Agent(target), None) => run_agent(opt, target, &options, saver),
        (Route::Iperf3(server), None) => run_iperf3(opt, server, &options, saver),
        (Route::Sockperf(_), _) => unreachable!("throughput accepts no sockperf:// target"),
    }
}

/// The test against a sonde agent.
fn run_agent(
    opt: &Opt,
    target: &Target,
    options: &ThroughputOptions,
    saver: &mut Saver,
) -> anyhow::Result<()> {
    let label = format!("throughput {}", target.label);
    crate::runner::measure(
        saver,
        opt.output,
        &label,
        opt.time,
        |interrupt, progress| {
            // Live interval lines go above the progress bar on a terminal, else to stdout as they
            // come; the final table (or JSON, CSV) holds every interval once more, aligned.
            let mut live = |iv: &sonde_report::IntervalResult| {
                opt.output
                    .live_interval(progress, &sonde_report::render::interval_line(iv), iv);
            };
            let controls = Controls::new().interrupt(interrupt).on_interval(&mut live);
            Ok(client_run(target, options, controls)?)
        },
    )
}

/// Set by Ctrl-C (or SIGTERM) during an iperf3 test, so the client can tell the server.
static INTERRUPTED: AtomicBool = AtomicBool::new(false);

/// `iperf3://`: the test against a real iperf3 server.
fn run_iperf3(
    opt: &Opt,
    server: &Iperf3Server,
    options: &ThroughputOptions,
    saver: &mut Saver,
) -> anyhow::Result<()> {
    // An iperf3 server keeps a dropped test's slot until its own timeouts: the client says
    // CLIENT_TERMINATE on Ctrl-C, as iperf3's own does, and then exits 130. If a handler is
    // already set, the default end (also 130) stands.
    let _ = ctrlc::set_handler(|| INTERRUPTED.store(true, Ordering::Relaxed));
    let progress = Progress::start(&format!("throughput {}", label(server)), opt.time);
    // Only the intervals of server-to-client streams are counted at a receiver (this one).
    let sender_counted = options.direction != Direction::Reverse;
    let mut live = |iv: &sonde_report::IntervalResult| {
        let line = sonde_report::render::interval_line(iv);
        let line = if sender_counted {
            line.replace("(counted at the receiver)", "(counted at this host)")
        } else {
            line
        };
        opt.output.live_interval(&progress, &line, iv);
    };
    let controls = Controls::new()
        .interrupt(&INTERRUPTED)
        .on_interval(&mut live);
    let result = client_run(server, options, controls);
    drop(progress);
    saver.print_and_save(opt.output, &mut result?)
}

/// `--sweep`: one test per value, against a sonde agent or an iperf3 server.
fn run_sweep<On>(
    opt: &Opt,
    target: &On,
    base: &ThroughputOptions,
    sweep: &Sweep,
    saver: &mut Saver,
) -> anyhow::Result<()>
where
    On: Direct,
    ThroughputOptions: Test<On, Interval = IntervalResult, Output = ThroughputResult>,
{
    if sweep.param() == SweepParam::Bitrate && base.protocol == Protocol::Tcp {
        return Err(crate::units::BadValue(
            "a bitrate sweep is for UDP (-u): TCP sends as fast as the path allows".into(),
        )
        .into());
    }
    let allowed = [
        SweepParam::MsgSize,
        SweepParam::Parallel,
        SweepParam::Bitrate,
    ];
    let label = format!("throughput {}", label(target));
    let doc = crate::sweep::run(
        saver,
        "throughput",
        &label,
        sweep,
        &allowed,
        opt.time,
        |value, interrupt| {
            let mut o = base.clone();
            match sweep.param() {
                SweepParam::MsgSize => o.msg_size = crate::sweep::as_u32(sweep.param(), value)?,
                SweepParam::Parallel => o.parallel = crate::sweep::as_u32(sweep.param(), value)?,
                _ => o.bitrate = value,
            }
            client_run(target, &o, Controls::new().interrupt(interrupt))
        },
    )?;
    saver.print(opt.output, &doc)?;
    crate::interrupt::install().check()
}

impl Opt {
    /// Where this host's sockets come from (`-B`, `--bind-dev`, `--cport`, `-4`, `-6`): what a
    /// mesh's scheduled test runs with too.
    pub(crate) fn source(&self) -> Result<crate::source::Source, crate::units::BadValue> {
        self.source.source(self.cport.get())
    }

    /// The client's options: what `sonde throughput` and a mesh's scheduled test run with.
    pub(crate) fn options(&self) -> ThroughputOptions {
        options(self)
    }
}

fn options(opt: &Opt) -> ThroughputOptions {
    let protocol = if opt.udp {
        Protocol::Udp
    } else {
        Protocol::Tcp
    };
    ThroughputOptions {
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
        bitrate: opt.bitrate.unwrap_or(match protocol {
            Protocol::Tcp => 0,
            Protocol::Udp => 1_000_000,
        }),
        duration: opt.time,
        interval: opt.interval.filter(|d| !d.is_zero()),
        cpus: opt.cpu.as_ref().map(|c| c.0.clone()).unwrap_or_default(),
        read_size: opt.read_size,
        socket: crate::sockopt::socket_options(
            &opt.ip,
            crate::sockopt::Taken {
                tcp: Some(&opt.tcp_opt),
                no_delay: Some(&opt.no_delay),
                df: Some(&opt.df),
                pacing: Some(&opt.pacing),
                zerocopy: Some(&opt.zerocopy),
            },
        ),
        omit: opt.omit.filter(|d| !d.is_zero()),
        skip_rx_copy: opt.skip_rx_copy,
        bytes: opt.bytes,
        blocks: opt.blockcount,
    }
}

/// `--from`: the helpers run the test against the target at once.
fn run_from(
    opt: &Opt,
    helpers: &FromHelpers,
    options: &ThroughputOptions,
    saver: &mut Saver,
) -> anyhow::Result<()> {
    let label = format!(
        "throughput {} from {} helpers",
        helpers.target,
        helpers.helpers.len()
    );
    let progress = Progress::start(&label, opt.time);
    let result = client_run(helpers, options, Controls::new());
    drop(progress);
    saver.print_and_save(opt.output, &mut result?)
}
