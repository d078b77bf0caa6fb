//! The command line: subcommands, shared options, exit codes.

use clap::{CommandFactory, Parser, Subcommand};

use crate::exit::EXIT_CODES;
use crate::{
    compare, completions, conf, diagnose, man, plan, quick, report, results, runner, server, spec,
};

#[derive(Debug, Parser)]
#[command(
    name = "sonde",
    version,
    about = "Network latency, throughput and packet rate: one binary, one port",
    long_about = "Network latency, throughput and packet rate: one binary, one port.\n\n\
Run `sonde server` on every host, then from any other host:\n  \
sonde latency HOST        round-trip time (RTT) percentiles, TCP or UDP (-u)\n  \
sonde throughput HOST     bulk bandwidth counted at the receiver, -P streams, -R reverse\n  \
sonde pps HOST            small-packet rate counted at the receiver\n  \
sonde crr HOST            TCP connections per second: connect, request, response, close\n  \
sonde load HOST           RTT idle and while TCP streams fill the path (bufferbloat)\n  \
sonde conf HOST           both ends' configuration side by side (CPU, kernel, NIC, TCP)\n  \
sonde mtu HOST            path MTU by DF probes both ways, and each end's TCP MSS\n  \
sonde compare A B         stored runs against each other, with significance (Mann-Whitney U)\n  \
sonde report -o FILE      stored runs as one HTML file with tables and charts\n  \
sonde plan run PLAN.toml  a matrix of cases from a file, one at a time, into one table\n  \
sonde mesh diagnose       where a mesh's fault is, from its series in Prometheus\n  \
sonde mesh publish        a Kubernetes mesh's labelled peer list into a ConfigMap\n\n\
`sonde quick` runs latency, throughput, pps and crr against an agent it starts on loopback: no\n\
second host needed.\n\n\
Every test saves its result in a local database (--no-save to skip, --label KEY=VALUE to name \
the case): `sonde results` lists, shows, exports and removes them.\n\n\
It speaks the tools already deployed: `sonde server --iperf3 --sockperf` answers real iperf3 and \
sockperf clients (several at once), and `sonde throughput iperf3://HOST` and `sonde latency \
sockperf://HOST` test against their servers.\n\n\
Every result also states its context: both ends' configuration (host, CPU, kernel, NIC, TCP \
settings: what `sonde conf` shows), the CPU the test cost each end (user and system time, \
context switches, system calls per message), and for TCP each sender's TCP_INFO (smoothed RTT, \
cwnd, retransmits, pacing rate) per stream and interval.",
    after_help = EXIT_CODES,
    propagate_version = true
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

// The subcommands' help is the doc comment of each `Opt` (first line: the summary).
#[derive(Debug, Subcommand)]
enum Command {
    #[command(after_help = EXIT_CODES)]
    Server(server::Opt),
    // The test subcommands (latency, throughput, pps, crr, load, mtu), as `spec` registers them.
    #[command(flatten)]
    Test(spec::TestCommand),
    #[command(after_help = EXIT_CODES)]
    Quick(quick::Opt),
    #[command(after_help = EXIT_CODES)]
    Conf(conf::Opt),
    // No EXIT_CODES here: these state their own (they start no test).
    Results(results::Opt),
    Compare(compare::Opt),
    Report(report::Opt),
    Completions(completions::Opt),
    Man(man::Opt),
    Plan(plan::Opt),
    Mesh(diagnose::Opt),
}

pub(crate) fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Server(o) => server::run(&o),
        Command::Test(t) => runner::run(t.test()),
        Command::Quick(o) => quick::run(&o),
        Command::Conf(o) => conf::run(&o),
        Command::Results(o) => results::run(&o),
        Command::Compare(o) => compare::run(&o),
        Command::Report(o) => report::run(&o),
        Command::Completions(o) => completions::run(&o, Cli::command()),
        Command::Man(o) => man::run(&o, Cli::command()),
        Command::Plan(o) => plan::run(&o),
        Command::Mesh(o) => diagnose::run(&o),
    }
}
