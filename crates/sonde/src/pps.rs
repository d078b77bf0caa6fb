//! `sonde pps`: packet rate.

use std::time::Duration;

use clap::Args;
use sonde_client::PpsOptions;
use sonde_engine::sweep::{Sweep, SweepParam};
use sonde_report::TestResult;

use crate::output::{OutputOpt, Progress};
use crate::save::{Measured, Saver};

/// Packet rate: small UDP datagrams as fast as possible, counted by the receiver
///
/// The sender sends as fast as it can; the receiving agent counts every datagram one by one.
#[derive(Debug, Args)]
#[command(after_long_help = concat!("\
Each datagram carries a 16-byte header (64-bit sequence number, send time) and filler up to -m. \
The default 18-byte payload makes a 64-byte Ethernet frame over IPv4 (14 + 20 + 8 + 18 + 4 FCS). \
On Linux the sender hands the kernel batches of datagrams in one call (UDP GSO, `UDP_SEGMENT`); \
the kernel still sends every datagram separately, and the agent receives and counts each one \
(recvmmsg, no GRO). Loss is the sender's count minus the distinct sequence numbers received.

Examples:
  sonde pps 198.18.0.2                  one flow, 18-byte payloads, 10 s
  sonde pps 198.18.0.2 --flows 4        four flows (four source ports: RSS spreads them)
  sonde pps 198.18.0.2 --sweep msg_size=18:1472:*2
                                        where the packet rate turns into a bandwidth limit

", crate::cli::exit_codes!()))]
pub(crate) struct Opt {
    /// Agent to test: HOST, HOST:PORT, or an IPv6 address (with a port: `[IPv6]:PORT`)
    #[arg(value_name = "HOST[:PORT]")]
    host: String,
    /// UDP payload per datagram, bytes (at least 16)
    #[arg(short = 'm', long = "msg-size", default_value = "18", value_name = "SIZE", value_parser = crate::units::size)]
    msg_size: u32,
    /// Parallel flows, each from its own UDP port
    #[arg(long, default_value_t = 1, value_name = "N")]
    flows: u32,
    /// How long to send, seconds
    #[arg(short = 't', long = "time", default_value = "10", value_name = "SECS", value_parser = crate::units::seconds)]
    time: Duration,
    /// Run once per value: msg_size (-m) or parallel (--flows), e.g. `parallel=1:8:*2`.
    #[arg(long, value_name = "PARAM=VALUES", value_parser = crate::sweep::parse, long_help = crate::sweep::SWEEP_HELP)]
    sweep: Option<Sweep>,
    #[command(flatten)]
    secret: crate::auth::SecretOpt,
    #[command(flatten)]
    output: OutputOpt,
    #[command(flatten)]
    save: crate::save::SaveOpt,
}

pub(crate) fn run(opt: &Opt) -> anyhow::Result<()> {
    crate::save::repeat(&opt.save, opt.output, |saver| run_once(opt, saver))
}

/// One run (of --repeat), printed and saved.
fn run_once(opt: &Opt, saver: &mut Saver) -> anyhow::Result<()> {
    let target = opt.secret.resolve(&opt.host)?;
    let options = PpsOptions {
        msg_size: opt.msg_size,
        flows: opt.flows,
        duration: opt.time,
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
                sonde_client::pps_interruptible(&target, &o, stop)
                    .map(|r| Measured::from(TestResult::Pps(r)))
            },
        )?;
        saver.print(opt.output, &doc)?;
        return crate::interrupt::install().check();
    }
    let interrupt = crate::interrupt::install();
    interrupt.check()?;
    let progress = Progress::start(&format!("pps {}", target.label), opt.time);
    let result = sonde_client::pps_interruptible(&target, &options, interrupt.flag());
    drop(progress);
    let mut m = Measured::from(TestResult::Pps(result?));
    saver.print_and_save(opt.output, &mut m)?;
    interrupt.check()
}
