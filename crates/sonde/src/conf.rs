//! `sonde conf`: both ends' configuration, side by side.

use clap::Args;
use sonde_report::TestResult;

use crate::output::{print, OutputOpt};

/// Configuration: this host and an agent side by side (CPU, memory, kernel, NIC, TCP, buffers)
///
/// What a test between the two would run on: host name, CPU model and count, memory, OS and
/// kernel, the network interface that faces the other end (driver, speed, MTU, offloads), TCP
/// congestion control, socket buffer limits, and sonde's version.
#[derive(Debug, Args)]
#[command(after_long_help = concat!("\
With HOST, the agent there says how it is configured for the interface this host's traffic \
reaches it by (one hello, no test), and this host is described for the interface toward it. \
Without HOST, this host alone, with every interface that is up (loopback left out).

A figure a host cannot read (a link speed on a virtual NIC, an offload a driver does not \
report, a file a container hides) is n/a in the table and null in JSON, never 0. An agent too \
old to report its configuration is n/a with a warning.

Every test's result embeds the same configuration of both ends (`hosts.client`, \
`hosts.server` in --json), and its table names both ends' host, kernel and interface.

Examples:
  sonde conf                         this host
  sonde conf 198.18.0.2              this host and the agent there, side by side
  sonde conf 198.18.0.2 --json       the same as a JSON document (`test`: `conf`)

", crate::exit::exit_codes!()))]
pub(crate) struct Opt {
    /// Agent to ask: HOST, HOST:PORT, or an IPv6 address (with a port: `[IPv6]:PORT`); without
    /// it, this host only
    #[arg(value_name = "HOST[:PORT]")]
    host: Option<String>,
    #[command(flatten)]
    secret: crate::auth::SecretOpt,
    #[command(flatten)]
    output: OutputOpt,
}

pub(crate) fn run(opt: &Opt) -> anyhow::Result<()> {
    let target = opt
        .host
        .as_deref()
        .map(|h| crate::route::agent("conf", h, &opt.secret, &crate::source::Source::default()))
        .transpose()?;
    let result = sonde_client::conf(target.as_ref())?;
    print(&opt.output.render(&TestResult::Conf(result)))
}
