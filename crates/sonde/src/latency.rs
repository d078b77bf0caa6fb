//! `sonde latency`: round-trip time.

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use sonde_client::{Controls, FromHelpers, LatencyMeasurement, LatencyOptions, Test};
use sonde_engine::sweep::{Sweep, SweepParam};
use sonde_report::LatencyInterval;
use sonde_wire::Protocol;

use crate::output::{OutputOpt, Progress};
use crate::route::{label, Direct, Route, Server};
use crate::runner::client_run;
use crate::save::Saver;

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

sockperf://HOST[:PORT] tests against a real `sockperf server` (port 11111 by default) with the \
same loops and report. UDP is the default there, as in sockperf; --tcp needs `sockperf server \
--tcp`. Messages carry sockperf's 14-byte header, so -m is at least 14 (sockperf's own default \
size); a sockperf server takes up to 65507 bytes unless started with a larger -m. sonde reports \
the full round trip: sockperf's \"latency\" is half of it (`sockperf ping-pong --full-rtt` reports \
the same quantity as sonde), and sonde does not wait 2 s before sending. A sockperf server \
reports no counts, so the result has session 0, and UDP loss is not split into outbound and \
return. A server that never answers is exit code 3. --full-log, --histogram and --timestamps \
work there as against an agent (they measure at this end); --one-way needs a sonde agent (exit \
code 2).

Inside a latency test (each adds to the table, the JSON and the CSV; none changes the RTTs):

--full-log FILE: every message as a CSV line (seq, send and receive times, RTT, the kernel \
figures with --timestamps, warm-up flag, received/late/lost), written by a thread of its own. \
The loop never waits for it; a sample the writer cannot keep up with is dropped and counted \
(full_log.dropped, with a warning). A FILE that cannot be created is exit code 2.

--histogram: the RTT distribution in log-spaced buckets (4 per octave), with counts and a bar; \
rtt_histogram [{le_ns, count}] in the JSON, `histogram` rows in the CSV.

--timestamps: the kernel's software timestamps (SO_TIMESTAMPING). The RTT at the sockets (the \
reply's kernel receive minus the request's kernel transmit) is shown next to the application's, \
with their difference per sample: the time spent in this host. A TCP message's transmit stamp \
is its last byte's. Without transmit stamps the socket RTT is null (with a warning) and the \
application's send to the reply's kernel receive stands in. Where the kernel gives no stamps, \
the figures are null, never 0.

--one-way: the delay each way. The agent stamps its receive and send times into each reply (-m \
24 or more); the client estimates the agent clock's offset and drift NTP-style from exchanges \
over the control channel (8 before the test, then 3 every 100 ms) and the cleanest probe of each \
second. Forward + return + the agent's hold is the RTT; the split rests on the cleanest \
exchanges taking as long one way as the other, and every figure is within the stated ± \
(uncertainty_ns) that follows from it. An open loop's forward delay counts from the scheduled \
send, as its RTT does.

--busy-poll: both ends spin on non-blocking sockets instead of sleeping in recv (plus \
SO_BUSY_POLL, 50 µs, where the kernel offers and permits it), and the agent pins its echo to a \
CPU of its --cpu-list. No wake-up per message: the lowest RTT the hosts allow, at the price of a \
whole core at each end for the test's duration (the result's cpu figures show it; on a host with \
few cores the spinning ends can take the CPU each other needs). Closed loop only, but for many \
flows (-P/--depth), whose open loop spins its readiness loop instead of sleeping to the next \
send. The result says what each end did (tuning); an agent older than this option ignores the \
request, with a warning.

--cpu N: the loop runs on CPU N only (sched_setaffinity), and the agent pins its echo too. \
With --busy-poll on one host, give the client and the agent different CPUs.

Many flows, many requests in flight (-P N, --depth K, --response-size SIZE): N TCP connections \
or UDP flows, each keeping K requests of -m bytes outstanding (closed loop), answered with \
--response-size bytes (neper tcp_rr/udp_rr -F N -T THREADS; netperf TCP_RR -b K-1 -r REQ,RESP). \
Each end spreads the flows over --threads threads (one per core by default), each driving its \
share with one epoll loop. The result adds transactions per second in total and per flow (min, \
max, Jain's fairness index), CPU time per transaction at each end and, for UDP, requests given \
up on after max(10 ms, 10 x median RTT); the RTT percentiles are merged over every flow. -P 1 \
--depth 1 with responses the size of -m is the one-flow test above. Not with -n, --full-log, \
--timestamps, --one-way or sockperf:// (and, as with one flow, --from takes neither --rate nor \
-i). Linux (epoll); the agent must \
be as recent (an older one is refused before the test). The agent takes up to 1,024 flows (sonde server \
--max-latency-flows); each end needs one open file per flow, and the client raises its soft \
limit to the hard one when it must.

Open loop over many flows (-P N --rate R [--depth K]): R is the TOTAL request rate, spread evenly \
over the N flows: each flow sends at R/N on its own schedule, the flows' phases staggered so that \
together they make one evenly spaced stream of R (never bursts of N at once). --depth K is then \
the most requests a flow may have outstanding (default 1). A flow at its limit does not skip a \
request: it sends it when a response (UDP: a give-up) frees a place, late, and its RTT still \
counts from its SCHEDULED send time, as the one-flow open loop's does (no coordinated \
omission). The result says the rate asked (rate_per_second) and achieved \
(request_response.rate_achieved_per_second: requests scheduled after the warm-up that left, per \
second), the sends that left more than 1 ms after their time (late_sends) and the requests due \
that never left before the end (request_response.unsent), with a warning for each. Each client \
thread sleeps in epoll until its flows' next due send (to the nanosecond where the kernel has \
epoll_pwait2, 5.11; else rounded up to the millisecond); it spins only with --busy-poll. An RTT \
counted from the schedule includes this host's wake-up from that sleep (tens of µs on a busy \
VM): the closed loop's percentiles are the path's floor. neper \
has no open loop; sockperf --mps is the one-flow equivalent; wrk2 -R is the HTTP one.

-i SECS with many flows: each client thread cuts its own interval histograms at the same \
boundaries of the test clock, and this process merges every thread's part of each interval as \
it comes (no lock between the threads): a line per interval with its transactions per second \
over all flows and the merged RTT percentiles, interval events with --json-stream, and \
`intervals` (with transactions_per_second) in the result and the store. The intervals' samples \
add up to the run's.

Examples:
  sonde latency 198.18.0.2                 TCP, 64-byte messages, 1 s warm-up + 10 s
  sonde latency 198.18.0.2 -u -m 1472      UDP, 1472-byte datagrams
  sonde latency 198.18.0.2 -u --rate 10K   open loop, 10,000 messages per second
  sonde latency 198.18.0.2 -n 100000       100,000 messages after the warm-up
  sonde latency 198.18.0.2 -t 60 -i 1      RTT percentiles every second: when it got worse
  sonde latency sockperf://198.18.0.2      UDP against `sockperf server` on port 11111
  sonde latency sockperf://198.18.0.2:11112 --tcp -m 14
                                           TCP against `sockperf server --tcp -p 11112`
  sonde latency B --from A1 --from A2 --secret-file s
                                           each helper's RTT to B while the other runs
  sonde latency 198.18.0.2 -u --sweep msg_size=64:8K:*2
                                           RTT by message size, one row per size
  sonde latency 198.18.0.2 -u --timestamps --histogram
                                           socket RTT, host time and the distribution
  sonde latency 198.18.0.2 -u --one-way --full-log rtt.csv
                                           delay each way, every sample to rtt.csv
  sonde latency 198.18.0.2 -u --busy-poll --cpu 2
                                           the lowest RTT: both ends spin, this one on CPU 2
  sonde latency 198.18.0.2 -P 256 --depth 4
                                           256 connections, 4 requests in flight each
  sonde latency 198.18.0.2 -u -P 16 -m 64 --response-size 1K
                                           16 UDP flows, 64-byte requests, 1 KiB responses
  sonde latency 198.18.0.2 -P 64 --depth 4 --rate 100K -i 1
                                           open loop: 100,000 requests/s over 64 connections
                                           (1,562.5/s each), at most 4 outstanding per flow,
                                           a line per second
  sonde latency 198.18.0.2 -u -P 16 --sweep rate=10K:80K:*2
                                           RTT by total request rate over 16 UDP flows

", crate::exit::exit_codes!()))]
pub(crate) struct Opt {
    /// Agent to test: HOST, HOST:PORT, or an IPv6 address (with a port: `[IPv6]:PORT`); or
    /// `sockperf://HOST[:PORT]` for a real `sockperf server` (default port 11111)
    #[arg(value_name = "HOST[:PORT]")]
    host: String,
    /// UDP instead of TCP
    #[arg(short, long)]
    udp: bool,
    /// TCP: the default for a sonde agent; for sockperf:// (UDP by default, as in sockperf) the
    /// server must run with --tcp too
    #[arg(long, conflicts_with = "udp")]
    tcp: bool,
    /// Message size each way, bytes (1 to 64K; UDP up to 65507; sockperf:// 14 or more)
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
    /// Report the RTTs of every SECS seconds after the warm-up (replies counted in the interval
    /// they arrived in): a line each as it ends (count, min, p50, p99, max; a percentile the
    /// interval's replies cannot support is n/a; with -P/--depth the transactions per second
    /// over all flows, and percentiles merged over every thread), `interval` events with
    /// --json-stream, and `intervals` in the result. At least 0.01. Default: none (iperf3 -i,
    /// sockperf has none)
    #[arg(short = 'i', long = "interval", value_name = "SECS", value_parser = crate::units::seconds, conflicts_with = "from")]
    interval: Option<Duration>,
    /// Open loop: send this many messages per second on a fixed schedule (e.g. 1000, 10K);
    /// RTT counts from each message's scheduled send time. With -P: the TOTAL request rate,
    /// spread evenly over the flows (each at RATE/N, phases staggered), --depth the most a
    /// flow may have outstanding (a flow at it sends late, never skips). sockperf --mps, wrk2
    /// -R; neper has none. Default: closed loop
    #[arg(long, value_name = "MSG_PER_SEC", value_parser = crate::units::per_second)]
    rate: Option<f64>,
    /// Run once per value: msg_size (-m), rate (--rate, open loop), parallel (-P) or depth
    /// (--depth), e.g. `msg_size=64:64K:*4`, `parallel=1:256:*4`
    #[arg(long, value_name = "PARAM=VALUES", value_parser = crate::sweep::parse, long_help = crate::sweep::SWEEP_HELP)]
    sweep: Option<Sweep>,
    /// Write every sample to FILE as CSV (seq, send/receive time, RTT, outcome), from a thread
    /// outside the measurement loop
    #[arg(long, value_name = "FILE", conflicts_with = "sweep")]
    full_log: Option<PathBuf>,
    /// Print the RTT distribution (log-spaced buckets) and put its buckets in the JSON and CSV
    #[arg(long)]
    histogram: bool,
    /// Read the kernel's software timestamps: the RTT at the sockets next to the application's,
    /// and the time spent in this host
    #[arg(long)]
    timestamps: bool,
    /// One-way delay each way, from the agent's timestamps and an estimate of its clock's
    /// offset (needs -m 24 or more; not with sockperf://)
    #[arg(long = "one-way")]
    one_way: bool,
    /// Spin on non-blocking sockets at both ends instead of sleeping in recv: the lowest RTT,
    /// a whole core at each end (closed loop, or --rate with -P/--depth; not with sockperf://)
    #[arg(long = "busy-poll")]
    busy_poll: bool,
    /// Run the loop on CPU N only, and ask the agent to pin its echo too (Linux). With -P or
    /// --depth: every client thread on CPU N, and the agent pins its threads to its --cpu-list
    #[arg(long, value_name = "N")]
    cpu: Option<u32>,
    /// Flows: N TCP connections or UDP flows at once, each with --depth requests in flight;
    /// their RTTs merged into one distribution and their transactions per second in the result
    /// (total, per-flow min and max, fairness). neper tcp_rr/udp_rr -F, N netperf TCP_RR
    /// processes. Default 1 (the one-flow test)
    #[arg(short = 'P', long = "parallel", default_value_t = 1, value_name = "N")]
    parallel: u32,
    /// Requests in flight per flow, closed loop (each response lets the flow's next request
    /// go): netperf TCP_RR -b K-1 (its burst adds to the one in flight), k8s-netperf's queue
    /// depth. With --rate (open loop): the most requests a flow may have outstanding. 1 to
    /// 1024; default 1
    #[arg(long, default_value_t = 1, value_name = "K")]
    depth: u32,
    /// Response size, bytes (request: -m): netperf -r REQ,RESP, neper --response-size. UDP:
    /// at least 8 with -P/--depth (each carries its sequence number). Default: -m (an echo)
    #[arg(long = "response-size", value_name = "SIZE", value_parser = crate::units::size)]
    response_size: Option<u32>,
    /// With -P/--depth: threads at each end, each driving its share of the flows with one
    /// epoll loop (neper -T). Default: one per available core, at most one per flow. The
    /// one-flow test (-P 1 --depth 1) runs one thread at each end and leaves it unused (so a
    /// sweep over parallel=1,16 takes it)
    #[arg(long, value_name = "N")]
    threads: Option<u32>,
    #[command(flatten)]
    ip: crate::sockopt::IpOpt,
    #[command(flatten)]
    tcp_opt: crate::sockopt::TcpOpt,
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

impl Opt {
    /// The protocol asked for, or `default` when neither -u nor --tcp was given.
    fn protocol(&self, default: Protocol) -> Protocol {
        if self.udp {
            Protocol::Udp
        } else if self.tcp {
            Protocol::Tcp
        } else {
            default
        }
    }

    fn options(&self, protocol: Protocol) -> LatencyOptions {
        LatencyOptions {
            protocol,
            msg_size: self.msg_size,
            duration: self.time,
            warmup: self.warmup,
            rate: self.rate,
            count: self.count,
            full_log: self.full_log.clone(),
            histogram: self.histogram,
            timestamps: self.timestamps,
            one_way: self.one_way,
            busy_poll: self.busy_poll,
            cpu: self.cpu,
            interval: self.interval.filter(|d| !d.is_zero()),
            parallel: self.parallel,
            depth: self.depth,
            response_size: self.response_size,
            threads: self.threads,
            socket: crate::sockopt::socket_options(
                &self.ip,
                crate::sockopt::Taken {
                    tcp: Some(&self.tcp_opt),
                    df: Some(&self.df),
                    ..crate::sockopt::Taken::default()
                },
            ),
        }
    }

    /// The inner-view option a sockperf server cannot serve: a usage error rather than a
    /// silently missing figure. The full log, the histogram and kernel timestamps are the
    /// client's own measurements and work there; one-way delay needs the agent's stamps.
    fn check_sockperf(&self) -> anyhow::Result<()> {
        if self.one_way {
            return Err(crate::units::BadValue(
                "--one-way is for tests against a sonde agent (one-way delay needs a sonde \
                 agent's timestamps); --full-log, --histogram and --timestamps work with \
                 sockperf://"
                    .into(),
            )
            .into());
        }
        Ok(())
    }

    /// How long the run should take, for the progress bar.
    fn expected(&self) -> Duration {
        let measured = match (self.count, self.rate) {
            (Some(n), Some(rate)) => Duration::from_secs_f64(n as f64 / rate),
            (Some(_), None) => Duration::ZERO,
            (None, _) => self.time,
        };
        self.warmup + measured
    }
}

crate::runner::impl_test!(expected: Opt::expected, run_once: run_once);

/// One run (of --repeat), printed and saved.
fn run_once(opt: &Opt, saver: &mut Saver) -> anyhow::Result<()> {
    let route = Route::resolve(
        "latency",
        &opt.host,
        &[Server::Sockperf],
        Some(&opt.from),
        &opt.secret,
        &opt.source.source(opt.cport.get())?,
        opt.sweep.is_some(),
    )?;
    // sockperf's default is UDP.
    let options = if let Route::Sockperf(_) = route {
        opt.check_sockperf()?;
        opt.options(opt.protocol(Protocol::Udp))
    } else {
        opt.options(opt.protocol(Protocol::Tcp))
    };
    match &route {
        Route::Helpers(helpers) => run_from(opt, helpers, &options, saver),
        Route::Agent(target) => run_direct(opt, target, &options, saver),
        Route::Sockperf(server) => run_direct(opt, server, &options, saver),
        Route::Iperf3(_) => unreachable!("latency accepts no iperf3:// target"),
    }
}

/// The test against a sonde agent or a sockperf server; with `--sweep`, one test per value.
fn run_direct<On>(
    opt: &Opt,
    target: &On,
    options: &LatencyOptions,
    saver: &mut Saver,
) -> anyhow::Result<()>
where
    On: Direct,
    LatencyOptions: Test<On, Interval = LatencyInterval, Output = LatencyMeasurement>,
{
    let label = format!("latency {}", label(target));
    let Some(sweep) = &opt.sweep else {
        return crate::runner::measure(
            saver,
            opt.output,
            &label,
            opt.expected(),
            |interrupt, progress| {
                // `-i`: a line per interval as it ends (above the progress bar, or on stdout
                // for a pipe), an `interval` event with --json-stream; the document holds them
                // all.
                let mut live = |iv: &LatencyInterval| {
                    let line = sonde_report::render::latency_interval_line(iv);
                    opt.output.live_interval(progress, &line, iv);
                };
                let controls = Controls::new().interrupt(interrupt).on_interval(&mut live);
                Ok(client_run(target, options, controls)?)
            },
        );
    };
    let allowed = [
        SweepParam::MsgSize,
        SweepParam::Rate,
        SweepParam::Parallel,
        SweepParam::Depth,
    ];
    let doc = crate::sweep::run(
        saver,
        "latency",
        &label,
        sweep,
        &allowed,
        opt.expected(),
        |value, interrupt| {
            let mut o = options.clone();
            match sweep.param() {
                SweepParam::MsgSize => o.msg_size = crate::sweep::as_u32(sweep.param(), value)?,
                SweepParam::Parallel => o.parallel = crate::sweep::as_u32(sweep.param(), value)?,
                SweepParam::Depth => o.depth = crate::sweep::as_u32(sweep.param(), value)?,
                _ => o.rate = Some(value as f64),
            }
            client_run(target, &o, Controls::new().interrupt(interrupt))
        },
    )?;
    saver.print(opt.output, &doc)?;
    crate::interrupt::install().check()
}

/// `--from`: the helpers measure their RTT to the target at once.
fn run_from(
    opt: &Opt,
    helpers: &FromHelpers,
    options: &LatencyOptions,
    saver: &mut Saver,
) -> anyhow::Result<()> {
    let label = format!(
        "latency {} from {} helpers",
        helpers.target,
        helpers.helpers.len()
    );
    let progress = Progress::start(&label, opt.expected());
    let result = client_run(helpers, options, Controls::new());
    drop(progress);
    saver.print_and_save(opt.output, &mut result?)
}
