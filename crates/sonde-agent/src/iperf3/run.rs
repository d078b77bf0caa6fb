//! A running iperf3 test, from TEST_START to the end (docs/protocols/iperf3.md §5, §8, §10, §11): one
//! thread per data stream, and on this thread the [`Conversation`] driven over the control
//! connection until it stops the streams, then through the results exchange (or the wait for
//! the client to hang up after SERVER_TERMINATE).
//!
//! The numbers follow iperf3's definitions, because the client prints them as its own:
//! * Bytes are counted from TEST_RUNNING; the first `omit` seconds are excluded (a counter
//!   snapshot at the end of omit, or for UDP receivers a second receive loop whose fresh
//!   sequence tracker and jitter start there, as iperf3 resets them).
//! * A UDP receiver's `packets` is the highest sequence number seen and `errors` the ones that
//!   never arrived below it; both are cumulative, with the omit-period values in `omitted_*`.
//! * `end_time` runs from the end of omit to the client's TEST_END, or for a receiving stream
//!   to the last byte it read, when the drain after TEST_END (see `drain_receivers`) counted
//!   bytes that were still in flight: those bytes took that long to arrive, and dividing them
//!   by the shorter time would report more than the path carried.

use std::io;
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use sonde_net::bulk::{self, SendOutcome, TcpRecvOutcome, UdpFormat, UdpRecvOutcome};
use sonde_net::cpu::ThreadsMeter;
use sonde_net::socket::{Applied, DataOptionError, DataOptions};
use sonde_net::{Clock, Counters};
use sonde_wire::iperf3::{stream_id, Params, Results, StreamResults};

use super::conversation::{Conversation, Ended, Host, Output, Plan};
use super::text::{self, Sample};
use super::{next_output, read_once};
use crate::Shared;

/// How often the control loop looks at the agent's shutdown flag.
const CONTROL_POLL: Duration = Duration::from_millis(100);
const NS_PER_S: u64 = 1_000_000_000;
/// After TEST_END, receivers keep reading until nothing has arrived for this long...
const DRAIN_QUIET: Duration = Duration::from_millis(50);
/// ...or for at most this long in all.
const DRAIN_LIMIT: Duration = Duration::from_millis(500);
/// Interval samples kept for the server output (one a second; the failsafe ends a test long
/// before this).
const MAX_SAMPLES: usize = 100_000;

/// One attached data stream.
pub(super) struct Stream {
    sock: Sock,
    /// The client's end of the stream.
    pub(super) peer: SocketAddr,
}

enum Sock {
    Tcp(TcpStream),
    Udp(UdpSocket),
}

impl Stream {
    /// A TCP data connection (`None` if it is already gone).
    pub(super) fn tcp(s: TcpStream) -> Option<Self> {
        let peer = s.peer_addr().ok()?;
        Some(Self {
            sock: Sock::Tcp(s),
            peer,
        })
    }

    /// A UDP stream's socket, connected to `peer`.
    pub(super) fn udp(s: UdpSocket, peer: SocketAddr) -> Self {
        Self {
            sock: Sock::Udp(s),
            peer,
        }
    }

    /// Sets the client's socket options on the agent's end of the stream.
    pub(super) fn apply(&self, opts: &DataOptions) -> Result<Applied, DataOptionError> {
        match &self.sock {
            Sock::Tcp(t) => opts.apply_tcp(t),
            Sock::Udp(u) => opts.apply_udp(u),
        }
    }
}

/// What one stream's thread came back with.
enum Outcome {
    Sent(SendOutcome),
    TcpReceived(TcpRecvOutcome),
    /// The receive loop of the omit period (when there is one) and the one after it.
    UdpReceived {
        first: Option<Box<UdpRecvOutcome>>,
        second: Option<Box<UdpRecvOutcome>>,
    },
    Failed(String),
}

/// Counters at the end of the omit period.
#[derive(Debug, Clone, Copy, Default)]
struct Snap {
    bytes: u64,
    packets: u64,
    retransmits: u64,
}

/// CPU use of the test's threads, percent of one core (iperf3's `cpu_util_*`).
#[derive(Debug, Clone, Copy, Default)]
struct Cpu {
    total: f64,
    user: f64,
    system: f64,
}

struct Run<'a> {
    p: &'a Params,
    streams: &'a [Stream],
    counters: Vec<Counters>,
    clock: Clock,
    len: u32,
    bits_per_second: u64,
    format: UdpFormat,
    omit_ns: u64,
    failsafe_ns: u64,
    stop_send: AtomicBool,
    stop_recv: AtomicBool,
    /// With `--max-bitrate`: what each TCP stream the agent receives on may read, bytes per
    /// second (its share of the cap).
    read_cap: Option<u64>,
    /// Ends the omit-period receive loop of UDP receivers (at the end of omit, or of the test).
    omit_over: AtomicBool,
    done: AtomicBool,
    /// The CPU of this test's threads only: other sessions of the agent do not count.
    cpu: ThreadsMeter,
}

/// A test whose streams are attached, ready to run.
pub(super) struct Attached {
    pub(super) params: Params,
    pub(super) plan: Plan,
    pub(super) streams: Vec<Stream>,
    /// The congestion control the TCP streams use, for the results.
    pub(super) congestion_used: Option<String>,
}

/// Runs an attached test to its end, driving the conversation on `ctrl`; `Ok` carries a
/// summary for the log line.
pub(super) fn run(
    ctrl: &mut TcpStream,
    c: &mut Conversation<'_>,
    host: &mut dyn Host,
    attached: Attached,
    shared: &Shared,
    peer: SocketAddr,
    local: SocketAddr,
) -> Result<String, String> {
    let Attached {
        params,
        plan,
        streams,
        congestion_used,
    } = attached;
    let p = &params;
    let ns = |d: Duration| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX);
    if p.nodelay {
        for s in &streams {
            if let Sock::Tcp(t) = &s.sock {
                let _ = t.set_nodelay(true);
            }
        }
    }
    let r = Run {
        p,
        streams: &streams,
        counters: streams.iter().map(|_| Counters::default()).collect(),
        clock: Clock::from_origin(plan.start),
        // check() bounded it to 1..=1 MiB.
        len: u32::try_from(p.len).unwrap_or(1),
        bits_per_second: u64::try_from(p.bandwidth).unwrap_or(0),
        format: UdpFormat::Iperf3 {
            seq64: p.udp_counters_64bit,
        },
        omit_ns: ns(plan.omit),
        failsafe_ns: ns(plan.failsafe),
        stop_send: AtomicBool::new(false),
        stop_recv: AtomicBool::new(false),
        read_cap: shared.cfg.max_bitrate.map(|cap| {
            let receivers = (0..streams.len()).filter(|&i| p.client_sends(i)).count();
            (cap / 8 / u64::try_from(receivers.max(1)).unwrap_or(1)).max(1)
        }),
        omit_over: AtomicBool::new(false),
        done: AtomicBool::new(false),
        cpu: ThreadsMeter::start(),
    };
    // TEST_START and TEST_RUNNING go out before any stream runs.
    let mut snaps = None;
    while let Some(out) = next_output(ctrl, c, host) {
        match out {
            Output::EndOmit { from_zero } => snaps = Some(r.end_omit(from_zero)),
            Output::StopStreams { .. } => {
                c.streams_stopped(Instant::now());
                return ended(finish(ctrl, c, host), None, &[]);
            }
            Output::End(e) => return ended(e, None, &[]),
            _ => {}
        }
    }

    let (drain, end_ns, snaps, outcomes, samples) = thread::scope(|s| {
        let workers: Vec<_> = (0..streams.len())
            .map(|i| {
                let r = &r;
                thread::Builder::new()
                    .name("sonde-iperf3-data".into())
                    .spawn_scoped(s, move || r.stream(i))
            })
            .collect();
        let sampler = {
            let r = &r;
            thread::Builder::new()
                .name("sonde-iperf3-int".into())
                .spawn_scoped(s, move || r.sample_intervals())
        };
        if !workers.iter().all(Result::is_ok) {
            let e = io::Error::other("cannot start a stream thread");
            c.handle_read_error(Instant::now(), e, host);
        }
        let (drain, end_ns, snaps) = {
            let _counted = r.cpu.track();
            let ended = r.control(ctrl, c, host, snaps);
            if ended.0 {
                r.drain_receivers();
            }
            ended
        };
        r.stop_all();
        let outcomes: Vec<Outcome> = workers
            .into_iter()
            .map(|w| match w.map(thread::ScopedJoinHandle::join) {
                Ok(Ok(o)) => o,
                _ => Outcome::Failed("the stream thread failed".into()),
            })
            .collect();
        let samples = match sampler.map(thread::ScopedJoinHandle::join) {
            Ok(Ok(v)) => v,
            _ => Vec::new(),
        };
        (drain, end_ns, snaps, outcomes, samples)
    });
    let cpu = r.cpu.cost().map_or_else(Cpu::default, |c| Cpu {
        total: c.percent_of_one_core().unwrap_or(0.0),
        user: c.user_percent_of_one_core().unwrap_or(0.0),
        system: c.system_percent_of_one_core().unwrap_or(0.0),
    });
    let failures: Vec<String> = outcomes
        .iter()
        .enumerate()
        .filter_map(|(i, o)| match o {
            Outcome::Failed(why) => Some(format!("stream {}: {why}", stream_id(i))),
            _ => None,
        })
        .collect();
    if !drain {
        // Any end but TEST_END: no results; SERVER_TERMINATE first when the agent ended it
        // (the data sockets stay open until the client has hung up).
        c.streams_stopped(Instant::now());
        return ended(finish(ctrl, c, host), None, &failures);
    }
    let mut results = r.results(&outcomes, snaps.as_deref(), end_ns, cpu);
    results.congestion_used = congestion_used;
    let summary = r.summary(&results, &outcomes);
    if p.get_server_output {
        let finals: Vec<u64> = r.counters.iter().map(|c| c.load().0).collect();
        let info: Vec<text::StreamInfo> = streams
            .iter()
            .enumerate()
            .map(|(i, s)| text::StreamInfo {
                id: stream_id(i),
                peer: s.peer,
                server_sends: !p.client_sends(i),
            })
            .collect();
        results.server_output_text = Some(text::report(&text::Report {
            peer,
            local,
            udp: p.udp(),
            bidir: p.bidirectional,
            omit_ns: r.omit_ns,
            end_ns,
            streams: &info,
            samples: &samples,
            finals: &finals,
            results: &results,
        }));
    }
    drop(r);
    // iperf3 closes the data sockets before it asks for results.
    drop(streams);
    c.results_ready(Instant::now(), &results);
    ended(finish(ctrl, c, host), Some(summary), &failures)
}

/// Drives the conversation to its end (the results exchange, or the wait for the client to
/// hang up after SERVER_TERMINATE).
fn finish(ctrl: &mut TcpStream, c: &mut Conversation<'_>, host: &mut dyn Host) -> Ended {
    loop {
        match next_output(ctrl, c, host) {
            Some(Output::End(ended)) => return ended,
            Some(_) => {}
            None => read_once(ctrl, c, host, None),
        }
    }
}

/// The log line's tail for how the conversation ended: `Ok` with the summary of a test that
/// completed, `Err` with why it did not; the streams' failures added.
fn ended(ended: Ended, summary: Option<String>, failures: &[String]) -> Result<String, String> {
    match ended {
        Ended::Completed => Ok(with_failures(summary.unwrap_or_default(), failures)),
        Ended::Test(why) => Err(with_failures(why, failures)),
        Ended::Setup(why) | Ended::Exchange(why) => Err(why),
    }
}
fn with_failures(line: String, failures: &[String]) -> String {
    if failures.is_empty() {
        line
    } else {
        format!("{line} ({})", failures.join("; "))
    }
}

impl Run<'_> {
    /// One stream's thread: send or receive until the control loop says stop.
    fn stream(&self, i: usize) -> Outcome {
        let _counted = self.cpu.track();
        let counters = &self.counters[i];
        let server_sends = !self.p.client_sends(i);
        let clock = &self.clock;
        let result = match (&self.streams[i].sock, server_sends) {
            (Sock::Tcp(t), true) => if self.bits_per_second > 0 {
                bulk::tcp_send_paced(
                    t,
                    self.len,
                    self.bits_per_second,
                    clock,
                    self.failsafe_ns,
                    &self.stop_send,
                    counters,
                )
            } else {
                // iperf3's -O is the server's omit snapshot (its conversation), not the loop's.
                let opts = bulk::TcpSendOptions::until(self.len, self.failsafe_ns);
                bulk::tcp_send(t, &opts, clock, &self.stop_send, counters)
            }
            .map(Outcome::Sent),
            // `-l` bytes per read, as iperf3's server reads its block size: with a small `-l`
            // the read size sets how TCP segments the stream (it acknowledges when a read
            // drains the queue), so the client drives the same workload against either server.
            (Sock::Tcp(t), false) => {
                let opts = bulk::TcpRecvOptions {
                    read_size: self.len,
                    max_bytes_per_second: self.read_cap,
                    ..bulk::TcpRecvOptions::default()
                };
                bulk::tcp_recv(t, &opts, clock, &self.stop_recv, counters).map(Outcome::TcpReceived)
            }
            (Sock::Udp(u), true) => bulk::udp_send(
                u,
                self.len,
                self.bits_per_second,
                self.format,
                clock,
                self.failsafe_ns,
                &self.stop_send,
                counters,
            )
            .map(Outcome::Sent),
            (Sock::Udp(u), false) => self.udp_receive(u, counters),
        };
        result.unwrap_or_else(|e| Outcome::Failed(e.to_string()))
    }

    /// A UDP receiver: one loop for the omit period, a fresh one (new sequence tracker and
    /// jitter, as iperf3 resets them) for the rest.
    fn udp_receive(&self, u: &UdpSocket, counters: &Counters) -> io::Result<Outcome> {
        let expect = AtomicU64::new(u64::MAX);
        let clock = &self.clock;
        let first = if self.omit_ns > 0 {
            let o = bulk::udp_recv(
                u,
                self.len,
                self.format,
                clock,
                &self.omit_over,
                &expect,
                counters,
            )?;
            Some(Box::new(o))
        } else {
            None
        };
        let second = if self.stop_recv.load(Ordering::Relaxed) {
            None
        } else {
            let o = bulk::udp_recv(
                u,
                self.len,
                self.format,
                clock,
                &self.stop_recv,
                &expect,
                counters,
            )?;
            Some(Box::new(o))
        };
        Ok(Outcome::UdpReceived { first, second })
    }

    /// The client's last writes and its TEST_END travel on different connections, so data it
    /// sent before ending the test may still sit in our receive queues (a short `-k` or `-n` test
    /// on a fast path can be entirely there). Stops the senders and lets the receivers read until
    /// their counts have not moved for [`DRAIN_QUIET`], for at most [`DRAIN_LIMIT`].
    fn drain_receivers(&self) {
        self.stop_send.store(true, Ordering::Relaxed);
        let received = || -> u64 {
            (0..self.streams.len())
                .filter(|&i| self.p.client_sends(i))
                .map(|i| self.counters[i].load().0)
                .sum()
        };
        if !(0..self.streams.len()).any(|i| self.p.client_sends(i)) {
            return;
        }
        let started = Instant::now();
        let (mut last, mut quiet_since) = (received(), Instant::now());
        while started.elapsed() < DRAIN_LIMIT && quiet_since.elapsed() < DRAIN_QUIET {
            thread::sleep(Duration::from_millis(5));
            let now = received();
            if now != last {
                (last, quiet_since) = (now, Instant::now());
            }
        }
    }

    fn stop_all(&self) {
        self.stop_send.store(true, Ordering::Relaxed);
        self.stop_recv.store(true, Ordering::Relaxed);
        self.omit_over.store(true, Ordering::Relaxed);
        self.done.store(true, Ordering::Relaxed);
    }

    /// Drives the conversation while the test runs, looking at the agent's shutdown every
    /// [`CONTROL_POLL`], taking the omit snapshot when it says, until it says stop. Returns
    /// whether to drain the receivers (after TEST_END), when the test ended (ns on the test
    /// clock), and the snapshot if omit ended.
    fn control(
        &self,
        ctrl: &mut TcpStream,
        c: &mut Conversation<'_>,
        host: &mut dyn Host,
        mut snaps: Option<Vec<Snap>>,
    ) -> (bool, u64, Option<Vec<Snap>>) {
        loop {
            c.handle_timeout(Instant::now(), host);
            while let Some(out) = next_output(ctrl, c, host) {
                match out {
                    Output::EndOmit { from_zero } => snaps = Some(self.end_omit(from_zero)),
                    Output::StopStreams { drain, at } => {
                        let since = at.saturating_duration_since(self.clock.origin());
                        let end_ns = u64::try_from(since.as_nanos()).unwrap_or(u64::MAX);
                        return (drain, end_ns, snaps);
                    }
                    _ => {}
                }
            }
            read_once(ctrl, c, host, Some(CONTROL_POLL));
        }
    }

    /// The end of the omit period: the counts from here on are the test's (from zero without
    /// an omit period).
    fn end_omit(&self, from_zero: bool) -> Vec<Snap> {
        self.omit_over.store(true, Ordering::Relaxed);
        if from_zero {
            vec![Snap::default(); self.streams.len()]
        } else {
            self.snapshot()
        }
    }

    /// Every stream's counters (and TCP retransmits) at the end of the omit period.
    fn snapshot(&self) -> Vec<Snap> {
        self.streams
            .iter()
            .zip(&self.counters)
            .map(|(s, c)| {
                let (bytes, packets) = c.load();
                let retransmits = match &s.sock {
                    Sock::Tcp(t) => sonde_net::socket::tcp_retransmits(t).unwrap_or(0),
                    Sock::Udp(_) => 0,
                };
                Snap {
                    bytes,
                    packets,
                    retransmits,
                }
            })
            .collect()
    }

    /// Byte counts once a second for the server output, until the test ends.
    fn sample_intervals(&self) -> Vec<Sample> {
        let _counted = self.cpu.track();
        let mut samples = Vec::new();
        let mut next = NS_PER_S;
        while !self.done.load(Ordering::Relaxed) && samples.len() < MAX_SAMPLES {
            let now = self.clock.now_ns();
            if now >= next {
                samples.push(Sample {
                    at_ns: next,
                    bytes: self.counters.iter().map(|c| c.load().0).collect(),
                });
                next += NS_PER_S;
                continue;
            }
            thread::sleep(Duration::from_nanos((next - now).min(50_000_000)));
        }
        samples
    }

    /// This side's results: what its receivers counted and its senders sent, after omit.
    fn results(
        &self,
        outcomes: &[Outcome],
        snaps: Option<&[Snap]>,
        end_ns: u64,
        cpu: Cpu,
    ) -> Results {
        let n = self.streams.len();
        let udp = self.p.udp();
        let any_send = (0..n).any(|i| !self.p.client_sends(i));
        let has_retransmits = !udp
            && outcomes
                .iter()
                .any(|o| matches!(o, Outcome::Sent(s) if s.retransmits.is_some()));
        // iperf3: -1 for a side that only receives, else whether it has TCP retransmits.
        let sender_has_retransmits = match (any_send, has_retransmits) {
            (false, _) => -1,
            (true, true) => 1,
            (true, false) => 0,
        };
        let start_ns = if snaps.is_some() { self.omit_ns } else { 0 };
        let end_time = end_ns.saturating_sub(start_ns) as f64 / 1e9;
        let received_end_time =
            received_end_ns(outcomes, end_ns).saturating_sub(start_ns) as f64 / 1e9;
        let streams = outcomes
            .iter()
            .enumerate()
            .map(|(i, outcome)| {
                let snap = snaps.and_then(|s| s.get(i)).copied().unwrap_or_default();
                let mut s = StreamResults {
                    id: stream_id(i),
                    retransmits: -1,
                    end_time,
                    ..StreamResults::default()
                };
                match outcome {
                    Outcome::Sent(o) => {
                        s.bytes = o.bytes.saturating_sub(snap.bytes);
                        if has_retransmits {
                            let total = o.retransmits.unwrap_or(0);
                            s.retransmits = to_i64(total.saturating_sub(snap.retransmits));
                        }
                        if udp {
                            s.packets = to_i64(o.packets);
                            s.omitted_packets = to_i64(snap.packets);
                        }
                    }
                    Outcome::TcpReceived(o) => {
                        s.bytes = o.bytes.saturating_sub(snap.bytes);
                        s.end_time = received_end_time;
                    }
                    Outcome::UdpReceived { first, second } => {
                        s.end_time = received_end_time;
                        // Omit never ended: the first loop is all there is, and all counts.
                        let (omitted, counted) = if snaps.is_some() {
                            (first.as_deref(), second.as_deref())
                        } else {
                            (None, first.as_deref().or(second.as_deref()))
                        };
                        udp_received(&mut s, omitted, counted);
                    }
                    Outcome::Failed(_) => {}
                }
                s
            })
            .collect();
        Results {
            cpu_util_total: cpu.total,
            cpu_util_user: cpu.user,
            cpu_util_system: cpu.system,
            sender_has_retransmits,
            congestion_used: None,
            streams,
            server_output_text: None,
            server_output_json: None,
        }
    }

    /// One line for the agent's log: what the agent received and sent, each over its own
    /// stream time (the `end_time` the client is told), and its TCP receivers' read calls.
    fn summary(&self, results: &Results, outcomes: &[Outcome]) -> String {
        let reads: u64 = outcomes
            .iter()
            .map(|o| match o {
                Outcome::TcpReceived(r) => r.reads,
                _ => 0,
            })
            .sum();
        let (mut received, mut sent) = (0u64, 0u64);
        let (mut received_secs, mut sent_secs) = (0f64, 0f64);
        for (i, s) in results.streams.iter().enumerate() {
            if self.p.client_sends(i) {
                received += s.bytes;
                received_secs = received_secs.max(s.end_time);
            } else {
                sent += s.bytes;
                sent_secs = sent_secs.max(s.end_time);
            }
        }
        let rate = |b: u64, secs: f64| {
            if secs > 0.0 {
                b as f64 * 8.0 / secs / 1e6
            } else {
                0.0
            }
        };
        // UDP receivers and a reverse test's agent have no TCP reads to count.
        let reads = if reads == 0 {
            String::new()
        } else {
            format!(" in {reads} reads")
        };
        format!(
            "finished: received {received} B{reads} ({:.1} Mbit/s), sent {sent} B ({:.1} Mbit/s) in {:.2} s",
            rate(received, received_secs),
            rate(sent, sent_secs),
            received_secs.max(sent_secs)
        )
    }
}

/// A UDP receiver's iperf3 counts from the receive loops before and after the end of omit.
fn udp_received(
    s: &mut StreamResults,
    omitted: Option<&UdpRecvOutcome>,
    counted: Option<&UdpRecvOutcome>,
) {
    // Tracker seq = iperf3 seq - 1, so the highest + 1 is iperf3's `packets`.
    let packets_of = |o: &UdpRecvOutcome| o.seq.highest().map_or(0, |h| h.saturating_add(1));
    let om_packets = omitted.map_or(0, packets_of);
    let om_received = omitted.map_or(0, |o| o.seq.received());
    let packets = om_packets.max(counted.map_or(0, packets_of));
    let received = om_received.saturating_add(counted.map_or(0, |o| o.seq.received()));
    s.packets = to_i64(packets);
    s.errors = to_i64(packets.saturating_sub(received));
    s.omitted_packets = to_i64(om_packets);
    s.omitted_errors = to_i64(om_packets.saturating_sub(om_received));
    if let Some(o) = counted {
        s.bytes = o.bytes;
        s.jitter = o.jitter.jitter_ns() as f64 / 1e9;
    }
}

/// When the receiving streams read their last byte, or `end_ns` (the client's TEST_END) if that
/// is later: the end of the time over which their bytes were counted.
fn received_end_ns(outcomes: &[Outcome], end_ns: u64) -> u64 {
    outcomes
        .iter()
        .filter_map(|o| match o {
            Outcome::TcpReceived(t) if t.bytes > 0 => Some(t.last_ns),
            Outcome::UdpReceived { first, second } => second
                .as_deref()
                .or(first.as_deref())
                .filter(|u| u.packets > 0)
                .map(|u| u.last_ns),
            _ => None,
        })
        .fold(end_ns, u64::max)
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn udp_counts_follow_iperf3() {
        let mut omitted = UdpRecvOutcome {
            bytes: 0,
            packets: 0,
            first_ns: 0,
            last_ns: 0,
            malformed: 0,
            seq: sonde_engine::seq::SeqTracker::new(),
            jitter: sonde_engine::jitter::Jitter::default(),
            ecn: None,
            omitted: None,
        };
        // iperf3 seqs 1..=10 with 4 and 7 lost during omit (tracker seq = iperf3 seq - 1).
        for s in (0..10).filter(|s| ![3, 6].contains(s)) {
            omitted.seq.on_packet(s);
        }
        let mut counted = omitted.clone();
        counted.seq = sonde_engine::seq::SeqTracker::new();
        counted.bytes = 5 * 100;
        // Then 11..=16 with 13 lost.
        for s in (10..16).filter(|&s| s != 12) {
            counted.seq.on_packet(s);
        }
        let mut s = StreamResults::default();
        udp_received(&mut s, Some(&omitted), Some(&counted));
        assert_eq!((s.packets, s.errors), (16, 3));
        assert_eq!((s.omitted_packets, s.omitted_errors), (10, 2));
        assert_eq!(s.bytes, 500);

        let mut s = StreamResults::default();
        udp_received(&mut s, None, Some(&counted));
        assert_eq!((s.packets, s.errors), (16, 11), "seqs 1..=11 never seen");
        let mut s = StreamResults::default();
        udp_received(&mut s, None, None);
        assert_eq!((s.packets, s.errors, s.bytes), (0, 0, 0));
    }
}
