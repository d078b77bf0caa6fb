//! `sonde crr`: connection rate.

use std::time::Duration;

use clap::Args;
use sonde_client::CrrOptions;

use crate::output::OutputOpt;

/// Connection rate: TCP connect, request, response, close, as fast as possible
///
/// Each transaction is a new TCP connection; each of the -P workers makes one after another.
#[derive(Debug, Args)]
#[command(after_long_help = concat!("\
Each worker connects to the agent's port, sends its request, reads the whole response, and closes \
first (netperf's TCP_CRR, 1-byte request and response by default). The headline is the agent's \
count: exchanges it completed (request read, response written, then the client's close) per \
second over its own first-to-last window; the client's count and rate are shown beside it. \
Connect time runs from the connect call to the connection established (one round trip, plus 1 s \
or more when a SYN is lost and retransmitted); transaction time from the connect call to the last \
byte of the response. Their percentiles follow the latency rule: p99 needs 1,000 samples.

-i cuts the run into intervals counted at the client, each with its transactions and their \
rate, its failures, and the connect p50 and p99 of the connects made in it (to 2 significant \
digits; n/a with fewer than 20 or 1,000 connects): where the rate collapses as ports run out or \
a SYN-flood protection kicks in. The last interval ends where the workers did.

Ephemeral ports: the side that closes first keeps each connection in TIME_WAIT for 60 s (Linux), \
holding its local port, so a client that makes more than about 470 connections/s (the 28,232 ports \
of the default net.ipv4.ip_local_port_range over 60 s) runs out of ports within a minute. Linux \
reuses a port in TIME_WAIT sooner only on loopback (net.ipv4.tcp_tw_reuse=2, the default) or with \
net.ipv4.tcp_tw_reuse=1. When a connect finds no free port (EADDRNOTAVAIL) the test stops there, \
reports what it measured until then, and says so. --rst closes with a reset \
instead (SO_LINGER 0): no TIME_WAIT, so no port runs out, but no closing handshake either, \
which makes each transaction cheaper than a normal close.

Examples:
  sonde crr 198.18.0.2                    one worker, 1-byte request and response, 10 s
  sonde crr 198.18.0.2 -P 8 -t 30         eight connections at a time
  sonde crr 198.18.0.2 -P 8 -t 60 -i 1    the rate second by second
  sonde crr 198.18.0.2 -m 200 --response-size 16K
                                          an HTTP-like exchange
  sonde crr 198.18.0.2 -P 16 --rst        close with resets: no TIME_WAIT on this host

", crate::exit::exit_codes!()))]
pub(crate) struct Opt {
    /// Agent to test: HOST, HOST:PORT, or an IPv6 address (with a port: `[IPv6]:PORT`)
    #[arg(value_name = "HOST[:PORT]")]
    host: String,
    /// Workers: connections at a time, each making one transaction after another
    #[arg(
        short = 'P',
        long = "workers",
        visible_alias = "parallel",
        default_value_t = 1,
        value_name = "N"
    )]
    workers: u32,
    /// Request size, bytes (1 to 64K)
    #[arg(short = 'm', long = "msg-size", default_value = "1", value_name = "SIZE", value_parser = crate::units::size)]
    msg_size: u32,
    /// Response size, bytes (1 to 64K)
    #[arg(long = "response-size", default_value = "1", value_name = "SIZE", value_parser = crate::units::size)]
    response_size: u32,
    /// How long workers start new transactions, seconds
    #[arg(short = 't', long = "time", default_value = "10", value_name = "SECS", value_parser = crate::units::seconds)]
    time: Duration,
    /// Close each connection with a reset (SO_LINGER 0) instead of a FIN: no TIME_WAIT on this
    /// host, so its ports never run out, and no closing handshake
    #[arg(long)]
    rst: bool,
    /// Give up on a connect, or on a response, after this many seconds (counted as a timeout)
    #[arg(long, default_value = "5", value_name = "SECS", value_parser = crate::units::seconds)]
    timeout: Duration,
    /// Report every SECS seconds (counted at the client; 0 for none)
    #[arg(short = 'i', long = "interval", value_name = "SECS", value_parser = crate::units::seconds)]
    interval: Option<Duration>,
    #[command(flatten)]
    ip: crate::sockopt::IpOpt,
    #[command(flatten)]
    tcp_opt: crate::sockopt::TcpOpt,
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
    let target = crate::route::agent("crr", &opt.host, &opt.secret, &opt.source.source(None)?)?;
    let options = CrrOptions {
        workers: opt.workers,
        request_bytes: opt.msg_size,
        response_bytes: opt.response_size,
        duration: opt.time,
        rst: opt.rst,
        timeout: opt.timeout,
        interval: opt.interval.filter(|d| !d.is_zero()),
        // On every connection at both ends; TCP_NODELAY is always on (a response larger than
        // a segment must not wait for an acknowledgement).
        socket: crate::sockopt::socket_options(
            &opt.ip,
            crate::sockopt::Taken {
                tcp: Some(&opt.tcp_opt),
                ..crate::sockopt::Taken::default()
            },
        ),
    };
    let label = format!("crr {}", target.label);
    crate::runner::measure(saver, opt.output, &label, opt.time, |interrupt, _| {
        let controls = sonde_client::Controls::new().interrupt(interrupt);
        Ok(crate::runner::client_run(&target, &options, controls)?)
    })
}
