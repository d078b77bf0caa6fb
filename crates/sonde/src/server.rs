//! `sonde server`: the agent.

use std::io::Write;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use sonde_agent::{Agent, AgentConfig};
use sonde_client::DEFAULT_PORT;

use crate::units::CpuList;

/// Run the agent that clients test against (TCP and UDP on one port)
///
/// Serves many clients at once, each test its own session with its own token; sessions that
/// overlap are noted in both results. The agent sends test data only to the address that opened
/// the session.
#[derive(Debug, Args)]
#[command(after_long_help = concat!("Open TCP and UDP on the port in the host firewall. Ctrl-C or \
SIGTERM stops the agent cleanly (running sessions are told it is shutting down).

Mesh mode (--mesh): the file format and every metric are in the book's mesh page (docs/mesh.md); p99 RTT \
from every node to every node in PromQL: histogram_quantile(0.99, sum by (source, target, le) \
(rate(sonde_rtt_seconds_bucket[5m]))). A peer that leaves the list has its series removed (they \
go stale, never a zero RTT); one that stops answering reads sonde_peer_up 0.

Examples:
  sonde server                      all addresses, port 5300
  sonde server --bind 198.18.0.2 -p 6000 --max-sessions 4
  sonde server --iperf3 --sockperf  also serve iperf3 (5201) and sockperf (11111) clients
  sonde server --metrics 0.0.0.0:9530
                                    the agent's own metrics for Prometheus
  sonde server --mesh /etc/sonde/mesh.toml --metrics 0.0.0.0:9530 --secret-file /etc/sonde/secret
                                    measure the peers in mesh.toml, export to Prometheus
  sonde server --mesh /etc/sonde/mesh.toml --check
                                    check mesh.toml and show its peers, probes and schedule
  sonde server --helper --secret-file /etc/sonde/secret
                                    also run tests against other agents when a client that
                                    proves the secret asks (`sonde pps B --from THIS-HOST`)
  sonde server --cpu-list 2-3       pin busy-polled latency echoes to CPU 3, then 2, in turn

", crate::exit::exit_codes!()))]
pub(crate) struct Opt {
    /// Address to listen on; the default `::` also accepts IPv4 where the host allows it,
    /// else `0.0.0.0`
    #[arg(long, value_name = "ADDR")]
    bind: Option<IpAddr>,
    /// Port for TCP and UDP alike (0: let the OS pick; the line printed at start says which)
    #[arg(short, long, default_value_t = DEFAULT_PORT)]
    port: u16,
    /// Sessions at once; more are refused as busy
    #[arg(long, default_value_t = 16, value_name = "N")]
    max_sessions: u32,
    /// Sessions one client address may run at once (of every kind: sonde, iperf3, sockperf), so
    /// that one address cannot take every session; more from it are refused
    #[arg(long, default_value_t = 8, value_name = "N")]
    max_sessions_per_source: u32,
    /// Connections one client address may hold that are not yet sessions (still saying hello,
    /// or silent), on sonde's port and on the iperf3 port each (64 in all per port), so that
    /// one address cannot lock out the others; more from it are refused with a line its client
    /// prints. The data connections of its admitted sessions come on top
    #[arg(long, default_value_t = 16, value_name = "N")]
    max_pending_per_source: usize,
    /// Caps each sonde session's data rate in each direction, like iperf3's
    /// --server-bitrate-limit (e.g. 100M). The agent's TCP streams (reverse, bidir) are paced
    /// to the cap, shared among them (by the kernel's SO_MAX_PACING_RATE; where the platform has
    /// none, as on Windows, such tests are refused instead); the TCP streams the client sends on are read no faster
    /// than their share of it, so flow control slows the client's sender (the receiver's figure
    /// stays at the cap; the client's sender figure counts what its socket buffers took, which
    /// the agent leaves unread a second after the client's senders end). A UDP test (throughput or pps, either
    /// direction) asking for more, or for no limit, is refused (exit code 4; iperf3 clients get
    /// "total required bandwidth is larger than server limit"). Applies to sonde and iperf3
    /// clients, not to sockperf's
    #[arg(long, value_name = "RATE", value_parser = crate::units::bitrate)]
    max_bitrate: Option<u64>,
    /// Longest test a client may ask for, in seconds
    #[arg(long, default_value = "300", value_name = "SECS", value_parser = crate::units::seconds)]
    max_duration: Duration,
    /// Most parallel streams in one session (per direction)
    #[arg(long, default_value_t = 128, value_name = "N")]
    max_streams: u32,
    /// Most flows in one many-flow latency test (`sonde latency -P N`); they share a few
    /// threads' readiness loops, so they cost descriptors, not threads
    #[arg(long, default_value_t = 1024, value_name = "N")]
    max_latency_flows: u32,
    /// Also answer real iperf3 clients (`iperf3 -c HOST -p PORT`), TCP and UDP, on PORT
    /// (default 5201), several at once, under the same limits. The client's -w, -C, -M, -S,
    /// --fq-rate and -N apply to the agent's end of each stream too; what the kernel refuses
    /// (an unknown -C) fails the test with iperf3's own error
    #[arg(long, value_name = "PORT", num_args = 0..=1, default_missing_value = "5201")]
    iperf3: Option<u16>,
    /// Also answer real sockperf clients (`sockperf pp|ul|tp -i HOST -p PORT [--tcp]`), TCP and
    /// UDP, on PORT (default 11111)
    #[arg(long, value_name = "PORT", num_args = 0..=1, default_missing_value = "11111")]
    sockperf: Option<u16>,
    /// Admit only clients that prove this shared secret (the file's content; one trailing line
    /// end is ignored): each session answers an HMAC-SHA256 challenge on a fresh nonce, so the
    /// secret never crosses the network and a recorded answer cannot be replayed, and its UDP
    /// joins carry a MAC. Clients pass the same with --secret-file or SONDE_SECRET; others are
    /// refused (exit code 4). Without it, the SONDE_SECRET environment variable holds the secret
    /// itself, if set; with neither, any client is admitted. The iperf3 and sockperf listeners
    /// cannot ask for it
    #[arg(long, value_name = "FILE")]
    secret_file: Option<PathBuf>,
    /// Be a helper: at the request of a client that proves the shared secret, run a pps,
    /// throughput or latency test from this host against another sonde agent (the client's
    /// `--from THIS-HOST`), proving the same secret to it. Nothing is sent before that agent
    /// admits the test; this agent's limits (--max-duration, --max-bitrate, --max-streams,
    /// --max-sessions) apply. Without a shared secret (--secret-file, SONDE_SECRET) every such
    /// request is refused, as it is without this option (exit code 4 at the client)
    #[arg(long)]
    helper: bool,
    /// CPUs to pin a session's data threads to when its client asks (`sonde latency
    /// --busy-poll` or `--cpu`: the echo; `sonde throughput --cpu`, `sonde pps --cpu`: each
    /// stream or flow), as `taskset -c` writes them: `2-3`, `1,3`. Each such thread takes the
    /// next CPU of the list, from the last one back; without it, any CPU the agent may run on
    #[arg(long, value_name = "LIST", value_parser = crate::units::cpu_list)]
    cpu_list: Option<CpuList>,
    /// No log line per session on stderr
    #[arg(short, long)]
    quiet: bool,
    /// Mesh mode: besides serving tests, measure the peers this TOML file lists (static hosts,
    /// a file re-read when it changes, every address of a DNS name) with stateless probes over
    /// UDP and TCP (one per peer and protocol every `interval`, default 1 s, answered by the
    /// peers' own port, no session), and, if it asks, short throughput and pps tests now and
    /// then; the results are Prometheus metrics (--metrics). A mesh needs the shared secret
    /// (--secret-file, SONDE_SECRET), the same on every agent: probes carry a MAC under it
    #[arg(long, value_name = "FILE")]
    mesh: Option<PathBuf>,
    /// With --mesh: check the mesh file and print what the agent would do with it (this
    /// agent's name, the peer sources, the probes, each scheduled test as its command line),
    /// then exit without listening: 0 if the file is valid, 2 with the error. Nothing is
    /// resolved or sent
    #[arg(long, requires = "mesh")]
    check: bool,
    /// Serve Prometheus metrics on ADDR:PORT: GET /metrics (the mesh's RTT histograms, probes
    /// sent and lost, peer reachability, last throughput and pps; the agent's own sessions,
    /// refusals and bytes served) and GET /healthz, nothing else
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<SocketAddr>,
}

pub(crate) fn run(opt: &Opt) -> anyhow::Result<()> {
    // A mesh file that does not parse is a usage error, found before anything listens.
    let mesh = opt
        .mesh
        .as_deref()
        .map(crate::mesh::MeshConfig::load)
        .transpose()
        .map_err(|e| crate::units::BadValue(format!("{e:#}")))?;
    if let (Some(cfg), Some(path)) = (&mesh, &opt.mesh) {
        if opt.check {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{}: a valid mesh file", path.display());
            let _ = write!(out, "{}", cfg.describe());
            let _ = write!(out, "{}", crate::mesh::describe_peers(cfg));
            return Ok(());
        }
        if opt.metrics.is_none() {
            return Err(crate::units::BadValue(
                "--mesh needs --metrics ADDR:PORT: the mesh's results are Prometheus metrics \
                 (or add --check to only check the file)"
                    .into(),
            )
            .into());
        }
    }
    let secret = crate::auth::load(opt.secret_file.as_deref())?;
    if mesh.is_some() && secret.is_none() {
        return Err(crate::units::BadValue(
            "--mesh needs the mesh's shared secret (--secret-file FILE or SONDE_SECRET, the same \
             on every agent): its probes are authenticated with it, and agents answer no probe \
             without it"
                .into(),
        )
        .into());
    }
    if let Some(CpuList(list)) = &opt.cpu_list {
        check_cpu_list(list)?;
    }
    // Mesh mode: the agent and its scheduler share the tests on each link, so that the two ends
    // of a link never run their scheduled tests on it at once.
    let link_tests = mesh.as_ref().map(|_| sonde_agent::LinkTests::new());
    let config = |ip: IpAddr| {
        let mut c = AgentConfig::new(SocketAddr::new(ip, opt.port));
        c.max_sessions = opt.max_sessions;
        c.max_sessions_per_source = opt.max_sessions_per_source;
        c.max_bitrate = opt.max_bitrate;
        c.max_pending_per_source = opt.max_pending_per_source;
        c.max_duration = opt.max_duration;
        c.max_streams = opt.max_streams;
        c.max_latency_flows = opt.max_latency_flows;
        // The agent reports what it does; unless --quiet, each event is a line on stderr.
        c.events = (!opt.quiet).then(|| {
            sonde_agent::Events(Arc::new(|event: sonde_agent::AgentEvent| {
                eprintln!("sonde agent: {event}");
            }))
        });
        c.iperf3 = opt.iperf3.map(|port| SocketAddr::new(ip, port));
        c.sockperf = opt.sockperf.map(|port| SocketAddr::new(ip, port));
        c.secret.clone_from(&secret);
        c.helper = opt
            .helper
            .then(|| sonde_agent::Helper(Arc::new(ClientRunner)));
        c.cpu_list = opt.cpu_list.as_ref().map(|l| l.0.clone());
        c.link_tests.clone_from(&link_tests);
        // sonde_mesh_incoming_probers: a peer counts while it probed within 3 intervals.
        if let Some(m) = &mesh {
            c.prober_recent = m.interval * 3;
        }
        c
    };
    let agent = match opt.bind {
        Some(ip) => Agent::bind(config(ip))?,
        // Dual-stack first; a host without IPv6 gets IPv4 only.
        None => Agent::bind(config(IpAddr::V6(Ipv6Addr::UNSPECIFIED)))
            .or_else(|_| Agent::bind(config(IpAddr::V4(Ipv4Addr::UNSPECIFIED))))?,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&stop);
    ctrlc::set_handler(move || flag.store(true, Ordering::Relaxed))
        .context("cannot install the SIGINT/SIGTERM handler")?;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(
        out,
        "sonde agent listening on {} (tcp+udp){}",
        agent.local_addr(),
        if secret.is_some() {
            ", clients must prove the shared secret"
        } else {
            ""
        }
    );
    if opt.helper {
        let _ = writeln!(
            out,
            "{}",
            if secret.is_some() {
                "helper: runs tests against other agents for clients that prove the secret"
            } else {
                "helper: no shared secret, so every helper request will be refused \
                 (give --secret-file or SONDE_SECRET)"
            }
        );
    }
    if let Some(addr) = agent.iperf3_addr() {
        let _ = writeln!(out, "iperf3 clients served on {addr} (tcp+udp)");
    }
    if let Some(addr) = agent.sockperf_addr() {
        let _ = writeln!(out, "sockperf clients served on {addr} (tcp+udp)");
    }
    let _ = out.flush();
    drop(out);
    let agent = agent.spawn();
    let agent = Arc::new(agent);
    let mut threads = Vec::new();
    if let Some(addr) = opt.metrics {
        let metrics = Arc::new(crate::mesh::metrics::Metrics::new());
        let (m, a) = (Arc::clone(&metrics), Arc::clone(&agent));
        let (local, serving) = crate::mesh::http::serve(addr, Arc::clone(&stop), move || {
            m.encode(Some((a.stats(), a.sessions())))
        })?;
        threads.push(serving);
        println!("metrics served on http://{local}/metrics");
        if let Some(mut cfg) = mesh {
            cfg.own_port = agent.local_addr().port();
            println!(
                "mesh: this agent is {:?}; probing each peer every {:?} over {}",
                cfg.name,
                cfg.interval,
                cfg.protocols
                    .iter()
                    .map(|&p| crate::mesh::metrics::Proto::from(p).name())
                    .collect::<Vec<_>>()
                    .join(" and ")
            );
            let links = link_tests.unwrap_or_else(sonde_agent::LinkTests::new);
            threads.push(crate::mesh::spawn(
                cfg,
                secret,
                metrics,
                links,
                Arc::clone(&stop),
            )?);
        }
    }
    let _ = std::io::stdout().flush();
    while !stop.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(100));
    }
    // The metrics endpoint and the mesh look at `stop` every 100 to 200 ms; a peer lookup
    // (getaddrinfo) or a scheduled test's close may hold the mesh longer: the agent does not
    // wait more than a second for them, so SIGTERM ends it promptly at any peer count.
    let deadline = std::time::Instant::now() + Duration::from_secs(1);
    for t in threads {
        while !t.is_finished() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        if t.is_finished() {
            let _ = t.join();
        }
    }
    if let Ok(agent) = Arc::try_unwrap(agent) {
        agent.stop();
    }
    if !opt.quiet {
        eprintln!("sonde agent: stopped");
    }
    Ok(())
}

/// `--helper`: the agent runs a requester's test against its target with sonde's client.
struct ClientRunner;

impl sonde_agent::HelperRunner for ClientRunner {
    fn run(
        &self,
        job: &sonde_agent::HelperJob,
        ready: &mut dyn FnMut() -> Option<std::time::Instant>,
        stop: &AtomicBool,
    ) -> Result<sonde_agent::HelperOutcome, sonde_agent::HelperFailure> {
        sonde_client::run_as_helper(
            &job.target,
            DEFAULT_PORT,
            &job.test,
            job.secret.clone(),
            ready,
            stop,
        )
        .map(|(result, started)| sonde_agent::HelperOutcome { result, started })
        .map_err(|e| sonde_agent::HelperFailure {
            exit_code: e.exit_code(),
            message: e.to_string(),
        })
    }
}

/// Every CPU of `--cpu-list` must be one the agent may run on: a usage error at start, not a
/// note in some later client's result.
fn check_cpu_list(list: &[u32]) -> anyhow::Result<()> {
    let allowed = sonde_agent::tune::allowed_cpus().map_err(|e| {
        crate::units::BadValue(format!(
            "--cpu-list: this platform cannot pin threads ({e})"
        ))
    })?;
    let outside: Vec<u32> = list
        .iter()
        .copied()
        .filter(|c| !allowed.contains(c))
        .collect();
    if !outside.is_empty() {
        return Err(crate::units::BadValue(format!(
            "--cpu-list: CPU {} not among those the agent may run on ({})",
            sonde_agent::tune::cpu_list(&outside),
            sonde_agent::tune::cpu_list(&allowed)
        ))
        .into());
    }
    Ok(())
}
