//! `sonde pps`: packet rate.

use std::time::Duration;

use clap::Args;
use sonde_client::{Controls, GsoMode, PpsOptions};
use sonde_engine::sweep::{Sweep, SweepParam};

use crate::output::{OutputOpt, Progress};
use crate::route::Route;
use crate::runner::client_run;
use crate::save::Saver;

/// Packet rate: small UDP datagrams as fast as possible, counted by the receiver
///
/// The sender sends as fast as it can; the receiving agent counts every datagram one by one.
#[derive(Debug, Args)]
#[command(after_long_help = concat!("\
Each datagram carries a 16-byte header (64-bit sequence number, send time) and filler up to -m. \
The default 18-byte payload makes a 64-byte Ethernet frame over IPv4 (14 + 20 + 8 + 18 + 4 FCS). \
-m 14 (sockperf's header size, the smallest) and -m 15 use a 14-byte header instead: a 48-bit \
sequence number, which no test can wrap (2.8e14 datagrams per flow, 32 days at 100 M/s), so \
loss, duplicates and reordering are counted exactly as with 64 bits; agents older than this \
header refuse those sizes. \
The agent receives with recvmmsg and UDP GRO, and counts each datagram on its own (a coalesced \
buffer is cut at the kernel's segment size and every sequence number checked). Loss is the \
sender's count minus the distinct sequence numbers received.

GSO and what a packet is: with UDP GSO (`UDP_SEGMENT`) the sender hands the kernel up to 64 \
datagrams as one buffer. A physical NIC still sends each datagram as its own packet (segmented \
in hardware, or by the kernel before the driver), but a virtual device does not: a veth, bridge, \
tun or loopback device passes the whole batch on as one packet, so its packet counters (and \
`sar -n DEV`, and any per-packet limit on that path) see up to 64 times fewer packets than \
datagrams. --gso auto (the default) finds the interface the route to the agent leaves by and uses \
GSO only if it is a physical device; on a virtual one (containers, Kubernetes pods, veth, \
bridges) and on loopback, the sender sends sendmmsg batches of single datagrams, each its own \
packet. Loopback is virtual: `sonde pps 127.0.0.1` sends without GSO unless --gso on, and reads \
lower for it (the GSO figure counts datagrams, not packets). The result says whether GSO was used \
and why (`gso`).

Examples:
  sonde pps 198.18.0.2                  one flow, 18-byte payloads, 10 s
  sonde pps 198.18.0.2 --flows 4        four flows (four source ports: RSS spreads them)
  sonde pps 198.18.0.2 --gso off        one datagram per packet, whatever the route
  sonde pps 198.18.0.2 -t 30 -i 1       received datagrams per second, every second
  sonde pps 198.18.0.2 -O 2 -i 1        the first 2 s sent but not counted (warm-up)
  sonde pps 198.18.0.2 --sweep msg_size=18:1472:*2
                                        where the packet rate turns into a bandwidth limit
  sonde pps B --from A1 --from A2 --from A3 --flows 64 -m 14 --secret-file s
                                        three helper agents send to B at once; the result is
                                        what B received from all of them, and each one's share

", crate::exit::exit_codes!()))]
pub(crate) struct Opt {
    /// Agent to test: HOST, HOST:PORT, or an IPv6 address (with a port: `[IPv6]:PORT`)
    #[arg(value_name = "HOST[:PORT]")]
    host: String,
    /// UDP payload per datagram, bytes (at least 14)
    #[arg(short = 'm', long = "msg-size", default_value = "18", value_name = "SIZE", value_parser = crate::units::size)]
    msg_size: u32,
    /// Parallel flows, each from its own UDP port
    #[arg(long, default_value_t = 1, value_name = "N")]
    flows: u32,
    /// How long to send, seconds
    #[arg(short = 't', long = "time", default_value = "10", value_name = "SECS", value_parser = crate::units::seconds)]
    time: Duration,
    /// Report received datagrams per second every SECS seconds (counted at the receiver, like
    /// `sar -n DEV SECS`)
    #[arg(short = 'i', long = "interval", value_name = "SECS", value_parser = crate::units::seconds)]
    interval: Option<Duration>,
    /// Omit the first SECS seconds (iperf3 -O): sent and received but not counted, so a NIC's
    /// or a cloud's warm-up (ARP, flow setup, a burst allowance being spent) stays out of the
    /// figures; the agent cuts them off by sequence number, so loss stays exact, and their -i
    /// intervals are shown marked (omitted). Sent on top of -t. Default: 0
    #[arg(short = 'O', long = "omit", value_name = "SECS", value_parser = crate::units::seconds)]
    omit: Option<Duration>,
    /// UDP GSO batches: auto (only where the route leaves by a physical device), on, or off
    #[arg(long, value_enum, default_value_t = Gso::Auto, value_name = "WHEN")]
    gso: Gso,
    /// Run once per value: msg_size (-m) or parallel (--flows), e.g. `parallel=1:8:*2`.
    #[arg(long, value_name = "PARAM=VALUES", value_parser = crate::sweep::parse, long_help = crate::sweep::SWEEP_HELP)]
    sweep: Option<Sweep>,
    /// Run this host's flows on these CPUs, flow i on the i-th of the list (round robin),
    /// and ask the agent to pin its flows too (to its --cpu-list): `0-3`, `1,3` (Linux)
    #[arg(long, value_name = "LIST", value_parser = crate::units::cpu_list, conflicts_with = "from")]
    cpu: Option<crate::units::CpuList>,
    #[command(flatten)]
    ip: crate::sockopt::IpOpt,
    #[command(flatten)]
    df: crate::sockopt::DfOpt,
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

/// `--gso`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Gso {
    /// GSO only where the route to the agent leaves by a physical device (Linux; off on
    /// Windows, which cannot tell)
    Auto,
    /// GSO batches wherever the kernel takes them (USO on Windows)
    On,
    /// One datagram per packet
    Off,
}

crate::runner::impl_test!(expected: |o| o.time + o.omit.unwrap_or_default(), run_once: run_once);

impl Opt {
    /// Where this host's sockets come from (`-B`, `--bind-dev`, `--cport`, `-4`, `-6`): what a
    /// mesh's scheduled test runs with too.
    pub(crate) fn source(&self) -> Result<crate::source::Source, crate::units::BadValue> {
        self.source.source(self.cport.get())
    }

    /// The client's options: what `sonde pps` and a mesh's scheduled test run with.
    pub(crate) fn options(&self) -> PpsOptions {
        PpsOptions {
            msg_size: self.msg_size,
            flows: self.flows,
            duration: self.time,
            gso: match self.gso {
                Gso::Auto => GsoMode::Auto,
                Gso::On => GsoMode::On,
                Gso::Off => GsoMode::Off,
            },
            interval: self.interval.filter(|d| !d.is_zero()),
            omit: self.omit.filter(|d| !d.is_zero()),
            cpus: self.cpu.as_ref().map(|c| c.0.clone()).unwrap_or_default(),
            socket: crate::sockopt::socket_options(
                &self.ip,
                crate::sockopt::Taken {
                    df: Some(&self.df),
                    ..crate::sockopt::Taken::default()
                },
            ),
        }
    }
}

/// One run (of --repeat), printed and saved.
fn run_once(opt: &Opt, saver: &mut Saver) -> anyhow::Result<()> {
    let options = opt.options();
    let route = Route::resolve(
        "pps",
        &opt.host,
        &[],
        Some(&opt.from),
        &opt.secret,
        &opt.source.source(opt.cport.get())?,
        opt.sweep.is_some(),
    )?;
    let target = match route {
        Route::Helpers(helpers) => {
            let progress = Progress::start(
                &format!(
                    "pps {} from {} helpers",
                    helpers.target,
                    helpers.helpers.len()
                ),
                opt.time,
            );
            let result = client_run(&helpers, &options, Controls::new());
            drop(progress);
            return saver.print_and_save(opt.output, &mut result?);
        }
        Route::Agent(target) => target,
        Route::Iperf3(_) | Route::Sockperf(_) => unreachable!("pps accepts a sonde agent only"),
    };
    if let Some(sweep) = &opt.sweep {
        let allowed = [SweepParam::MsgSize, SweepParam::Parallel];
        let doc = crate::sweep::run(
            saver,
            "pps",
            "pps",
            sweep,
            &allowed,
            opt.time,
            |value, stop| {
                let mut o = options.clone();
                match sweep.param() {
                    SweepParam::MsgSize => o.msg_size = crate::sweep::as_u32(sweep.param(), value)?,
                    _ => o.flows = crate::sweep::as_u32(sweep.param(), value)?,
                }
                client_run(&target, &o, Controls::new().interrupt(stop))
            },
        )?;
        saver.print(opt.output, &doc)?;
        return crate::interrupt::install().check();
    }
    let label = format!("pps {}", target.label);
    crate::runner::measure(
        saver,
        opt.output,
        &label,
        opt.time,
        |interrupt, progress| {
            // Live interval lines go to the terminal above the progress bar; the table (or JSON,
            // CSV) on stdout holds every interval once, aligned.
            let mut live = |iv: &sonde_report::PpsInterval| {
                progress.println(&sonde_report::render::pps_interval_line(iv));
            };
            let controls = Controls::new().interrupt(interrupt).on_interval(&mut live);
            Ok(client_run(&target, &options, controls)?)
        },
    )
}
