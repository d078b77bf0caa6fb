//! `sonde mtu`: the path MTU to an agent by DF probes, and the TCP MSS at each end.

use std::time::Duration;

use clap::Args;
use sonde_client::MtuOptions;

use crate::output::OutputOpt;

/// Path MTU: the largest IP packet that crosses to the agent and back, by DF probes
///
/// Also the TCP MSS each end settles on over a TCP connection to the agent.
#[derive(Debug, Args)]
#[command(after_long_help = concat!("\
Sends UDP probes with DF (don't fragment) set to the agent, which echoes each one at the same size \
with DF set on its end too, so a size crosses only if it crosses both ways: the answer is the path \
MTU of the smaller direction. What users reach for instead: tracepath HOST, or ping -M do -s SIZE \
HOST by hand; sonde mtu needs only the agent's port (UDP and TCP), no ICMP echo.

Sizes are whole IP packets: 20 B of IPv4 header (40 for IPv6) and 8 B of UDP header, then the \
payload; the result states both the packet size (the MTU to configure) and the UDP payload that \
fits it. The search probes the minimum MTU (68 B for IPv4, 1,280 for IPv6; it must cross), then \
the local interface's MTU (the ceiling, at most 65,535 B: 65,507 B of UDP payload), then halves \
the range. A router's ICMP \"fragmentation needed\" (IPv6 \"packet too big\") names its MTU and \
itself: the search takes it at its word and tries that size next. A probe without an echo is \
tried again (--tries) before its size is read as too big: one lost probe is not an MTU. When sizes \
vanish without any router saying so, the result says so: a PMTU black hole, which stalls TCP \
without MSS clamping.

The probes bypass this host's cached path MTU (IP_PMTUDISC_PROBE), so each run measures the path \
afresh; the kernel's cached value after the search is shown beside the answer (IP_MTU). The agent \
honours its own kernel's cache for its echoes (IP_PMTUDISC_DO). Each probe waits 4 times the \
longest RTT seen (50 ms to 1 s); the whole search is bounded by -t and --max-probes.

Then, unless --no-tcp, a TCP connection to the agent echoes 64 KiB both ways (full-size segments, \
so PMTU discovery runs) and each end's MSS is read at connect and at the end: this host's with \
TCP_MAXSEG and TCP_INFO, the agent's from its accepted socket, in its report. An MSS below the \
path MTU less 40 B (60 for IPv6) is a clamp or TCP options (12 B of timestamps on Linux).

A warning says when the path MTU is below the local interface's (a tunnel, an overlay, a clamp): \
the number to set the MTU to. Linux only (the probe options do not exist on Windows).

Examples:
  sonde mtu 198.18.0.2                 IPv4 path MTU and each end's TCP MSS
  sonde mtu -6 agent.example           over IPv6
  sonde mtu 198.18.0.2 --no-tcp -t 30  probes only, 30 s for a slow or lossy path
  sonde mtu 198.18.0.2 --json          the probes and the answer as JSON

", crate::exit::exit_codes!()))]
pub(crate) struct Opt {
    /// Agent to test: HOST, HOST:PORT, or an IPv6 address (with a port: `[IPv6]:PORT`)
    #[arg(value_name = "HOST[:PORT]")]
    host: String,
    /// Time budget of the whole search, seconds (a bound, as iperf3 -t is for a test): it stops
    /// there and reports the range still open
    #[arg(short = 't', long = "time", default_value = "10", value_name = "SECS", value_parser = crate::units::seconds)]
    time: Duration,
    /// Probes of one size without an echo before the size is read as too big (a lost probe
    /// is tried again; tracepath and ping -M do take one lost probe as the answer)
    #[arg(long, default_value_t = 3, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=10))]
    tries: u32,
    /// At most this many probes in all (1 to 200)
    #[arg(long = "max-probes", default_value_t = sonde_client::MAX_MTU_PROBES, value_name = "N", value_parser = clap::value_parser!(u32).range(1..=200))]
    max_probes: u32,
    /// Skip the TCP connection that reads each end's MSS
    #[arg(long = "no-tcp")]
    no_tcp: bool,
    #[command(flatten)]
    secret: crate::auth::SecretOpt,
    #[command(flatten)]
    source: crate::source::SourceOpt,
    #[command(flatten)]
    output: OutputOpt,
    #[command(flatten)]
    save: crate::save::SaveOpt,
}

crate::runner::impl_test!(expected: |o| o.time, run_once: run_once);

/// One run (of --repeat), printed and saved.
fn run_once(opt: &Opt, saver: &mut crate::save::Saver) -> anyhow::Result<()> {
    let target = crate::route::agent("mtu", &opt.host, &opt.secret, &opt.source.source(None)?)?;
    let options = MtuOptions {
        budget: opt.time,
        tries: opt.tries,
        max_probes: opt.max_probes,
        tcp: !opt.no_tcp,
    };
    let label = format!("mtu {}", target.label);
    crate::runner::measure(saver, opt.output, &label, opt.time, |interrupt, _| {
        let controls = sonde_client::Controls::new().interrupt(interrupt);
        Ok(crate::runner::client_run(&target, &options, controls)?)
    })
}
