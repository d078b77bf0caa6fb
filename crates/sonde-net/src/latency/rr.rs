//! Many flows, many requests in flight: the request/response loops of `sonde latency -P N
//! --depth K --response-size SIZE`, at both ends.
//!
//! Each thread drives its share of the flows with one readiness loop (`sys::Poller`: epoll,
//! level-triggered, the sockets non-blocking). A client flow keeps `depth` requests of
//! `request_size` bytes outstanding (closed loop: a response sent back lets the next request
//! go); the agent answers each request with `response_size` bytes.
//!
//! * TCP: a byte stream in order, so a flow's responses answer its requests first in, first
//!   out; the client counts `response_size` bytes as one response however the reads split
//!   them, and the echo counts `request_size` bytes as one request. Requests and responses are
//!   zeros (sonde's TCP framing), written from one static buffer.
//! * UDP: each request carries its sequence number in its first 8 bytes, and the echo copies
//!   them into its response. A request not answered within `max(10 ms, 10 × median RTT)` (1 s
//!   before the first response) is given up on and the next one goes, so a lost datagram does
//!   not stall its flow; a response that comes later still counts as answered (late). What is
//!   never answered is lost.
//!
//! Open loop (`--rate R`, [`RrOpen`]): `R` requests per second in all, spread evenly over the
//! test's flows, each on its own schedule with the flows' phases staggered
//! ([`sonde_engine::open_flows::FlowPacer`], one per thread). The readiness loop sleeps until
//! the next due send of its flows (to the nanosecond: `epoll_pwait2`), never spinning unless
//! `--busy-poll`. `depth` is then the most requests a flow may have outstanding: a flow at its
//! limit sends its due request when a response (or, UDP, a give-up) frees a place, late, and
//! never skips one. RTT counts from the request's *scheduled* send time, as the one-flow open
//! loop's does (no coordinated omission); a send more than [`super::LATE_SEND`] after its time
//! counts late, and what was due before the end but never left counts unsent.
//!
//! `-i` ([`RrIntervalView`]): each thread cuts its own interval histograms at the same
//! boundaries of the shared test clock and hands each one over when it ends; the caller merges
//! the threads' histograms of each interval. No lock in the loops.
//!
//! The loops do not allocate, lock or format once running: per-flow state is set up before,
//! RTTs go into the thread's HDR histogram, which the caller merges with the other threads'
//! (with `-i`, a copy of the thread's interval histogram is made once per interval).

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{TcpStream, UdpSocket};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::SyncSender;
use std::time::Duration;

use sonde_engine::open_flows::FlowPacer;
use sonde_engine::rtt::RttRecorder;
use sonde_wire::{UdpJoin, UDP_JOIN_LEN};

use super::{duration_ns, peer_closed, TCP_REPLY_TIMEOUT, UDP_FIRST_REPLY_TIMEOUT};
use crate::{fault, sys, Clock, Counters};

/// Whether this platform runs many-flow latency tests (it needs epoll, `sys::Poller`: Linux).
pub const SUPPORTED: bool = sys::POLLER;

/// The smallest UDP request and response of a many-flow test: the 8-byte sequence number.
pub const UDP_MIN_RR_MSG: u32 = 8;

/// The shortest UDP reply timeout of a many-flow test: with hundreds of requests in flight on
/// a loaded host, queueing alone can take milliseconds.
const UDP_RR_MIN_TIMEOUT: Duration = Duration::from_millis(10);
/// How long a wait for readiness lasts before the loop looks at its deadlines and stop flag.
const POLL: Duration = Duration::from_millis(5);
/// The echo's wait, likewise.
const ECHO_POLL: Duration = Duration::from_millis(100);
/// One read's buffer.
const READ_BUF: usize = 64 * 1024;
/// Zeros for every TCP request and response.
static ZEROS: [u8; READ_BUF] = [0; READ_BUF];
/// Sequence slots per UDP flow, per request in flight.
const SLOTS_PER_DEPTH: usize = 4;

/// How a many-flow run goes (one thread's share of the flows).
#[derive(Debug, Clone, Copy)]
pub struct RrConfig {
    /// Request size, bytes.
    pub request_size: u32,
    /// Response size, bytes.
    pub response_size: u32,
    /// Requests in flight per flow (at least 1).
    pub depth: u32,
    /// Send no request at or after this time on the test clock; the loop then waits for the
    /// responses still due.
    pub until_ns: u64,
    /// Transactions whose request left before this time are excluded (warm-up).
    pub warmup_ns: u64,
    /// `--busy-poll`: the readiness loop never sleeps (a zero wait).
    pub spin: bool,
    /// `--rate`: the open loop (`depth` is then the most outstanding per flow); `None` for
    /// the closed loop.
    pub open: Option<RrOpen>,
}

/// What the agent's side of a many-flow test answers, and how it waits.
#[derive(Debug, Clone, Copy)]
pub struct RrEcho {
    /// Request size, bytes: each is answered once whole (TCP) or as one datagram (UDP).
    pub request_size: u32,
    /// Response size, bytes.
    pub response_size: u32,
    /// The most requests the client keeps in flight per flow: the UDP echo reads at most that
    /// many of a flow per wake-up.
    pub depth: u32,
    /// `--busy-poll`: the readiness loop never sleeps (a zero wait).
    pub spin: bool,
}

/// The open loop of a many-flow test, as one thread sees it.
#[derive(Debug, Clone, Copy)]
pub struct RrOpen {
    /// Requests per second over all the test's flows (every thread's).
    pub rate_per_second: f64,
    /// The test's flows, over every thread.
    pub total_flows: u32,
    /// The test-wide index of this thread's first flow (its flows are the next ones in order).
    pub first_flow: u32,
}

impl RrOpen {
    /// The pacer of a thread's `flows` flows: the schedule's origin is 0 on the test clock, the
    /// same for every thread, so that their flows' phases interleave.
    fn pacer(&self, flows: usize, until_ns: u64) -> FlowPacer {
        FlowPacer::new(
            self.rate_per_second,
            self.total_flows,
            self.first_flow,
            flows,
            0,
            until_ns,
            duration_ns(super::LATE_SEND),
        )
    }
}

/// `-i` with many flows: one thread's RTTs cut into intervals of `every_ns` on the test clock,
/// from the end of the warm-up on, at the same boundaries in every thread; the last runs from
/// the last boundary before the planned end to the moment the thread's loop stopped. A
/// response belongs to the interval it arrived in; responses to requests scheduled in the
/// warm-up are left out, as from the run's histogram, so the intervals' samples add up to the
/// run's. Each interval goes to `out` when it ends (`try_send`: a caller that does not keep up
/// loses intervals).
#[derive(Debug)]
pub struct RrIntervalView {
    /// The interval, ns (above 0).
    pub every_ns: u64,
    /// This thread, as the caller numbers them.
    pub thread: usize,
    /// Where the intervals go.
    pub out: SyncSender<RrInterval>,
}

/// One interval of one thread's flows.
#[derive(Debug, Clone)]
pub struct RrInterval {
    /// The thread ([`RrIntervalView::thread`]).
    pub thread: usize,
    /// The interval's number, from 0 at the end of the warm-up: the same interval in every
    /// thread.
    pub index: u64,
    /// Start, ns on the test clock.
    pub start_ns: u64,
    /// End, ns on the test clock (the thread's stop for its last one).
    pub end_ns: u64,
    /// The RTTs of the responses that arrived in it, to merge with the other threads'.
    pub rtt: RttRecorder,
}

/// A thread's interval cutter.
struct Cutter {
    view: RrIntervalView,
    index: u64,
    start_ns: u64,
    until_ns: u64,
    rtt: RttRecorder,
}

impl Cutter {
    fn new(view: RrIntervalView, cfg: &RrConfig) -> Self {
        Self {
            view,
            index: 0,
            start_ns: cfg.warmup_ns,
            until_ns: cfg.until_ns,
            rtt: RttRecorder::new(cfg.warmup_ns),
        }
    }

    /// Hands on every interval that ended by `now_ns`, empty ones included.
    fn tick(&mut self, now_ns: u64) {
        while let Some(end_ns) =
            super::interval_over(self.start_ns, self.view.every_ns, self.until_ns, now_ns)
        {
            self.send(end_ns);
        }
    }

    fn record(&mut self, now_ns: u64, sent_at: u64) {
        self.tick(now_ns);
        self.rtt.record(sent_at, now_ns.saturating_sub(sent_at));
    }

    fn send(&mut self, end_ns: u64) {
        let _ = self.view.out.try_send(RrInterval {
            thread: self.view.thread,
            index: self.index,
            start_ns: self.start_ns,
            end_ns,
            rtt: self.rtt.clone(),
        });
        self.rtt.reset();
        self.index += 1;
        self.start_ns = end_ns;
    }

    /// The last interval, to `end_ns`.
    fn finish(mut self, end_ns: u64) {
        self.tick(end_ns);
        if end_ns > self.start_ns {
            self.send(end_ns);
        }
    }
}

/// One flow's counts.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RrFlow {
    /// Requests sent (warm-up included).
    pub sent: u64,
    /// Requests answered (warm-up included; UDP: late responses included).
    pub answered: u64,
    /// Transactions measured: requests sent after the warm-up and answered.
    pub measured: u64,
    /// UDP: requests given up on at the reply timeout (the flow sent the next one).
    pub timeouts: u64,
    /// UDP: responses that came after their request was given up on (counted answered).
    pub late: u64,
    /// Requests sent at or after the end of the warm-up (open loop: scheduled then).
    pub sent_measured: u64,
    /// Open loop: sends that left more than [`super::LATE_SEND`] after their scheduled time
    /// (the flow was at its depth limit, or the thread behind).
    pub late_sends: u64,
    /// Open loop: requests due before the end that never left (the flow was at its depth
    /// limit until the end).
    pub unsent: u64,
}

impl RrFlow {
    /// UDP: requests never answered.
    pub fn lost(&self) -> u64 {
        self.sent.saturating_sub(self.answered)
    }
}

/// What one thread's flows measured.
#[derive(Debug, Clone)]
pub struct RrOutcome {
    /// RTT samples of every flow of the thread.
    pub rtt: RttRecorder,
    /// Each flow's counts, in the order the flows were given.
    pub flows: Vec<RrFlow>,
}

/// A socket the many-flow loops run on: a connected `TcpStream` (`TCP_NODELAY` set by the
/// caller) or a connected `UdpSocket`.
pub trait RrSocket: sealed::Sealed {}

impl<T: sealed::Sealed> RrSocket for T {}

mod sealed {
    use std::io;
    use std::sync::atomic::AtomicBool;

    use super::{RrConfig, RrEcho, RrIntervalView, RrOutcome};
    use crate::{Clock, Counters};

    pub trait Sealed: Sized {
        fn client(
            flows: &[&Self],
            cfg: &RrConfig,
            clock: &Clock,
            stop: &AtomicBool,
            intervals: Option<RrIntervalView>,
        ) -> io::Result<RrOutcome>;

        fn echo(
            flows: &[&Self],
            cfg: &RrEcho,
            stop: &AtomicBool,
            counters: &[&Counters],
        ) -> io::Result<()>;

        fn set_nonblocking(&self, on: bool) -> io::Result<()>;
    }

    impl Sealed for std::net::TcpStream {
        fn client(
            flows: &[&Self],
            cfg: &RrConfig,
            clock: &Clock,
            stop: &AtomicBool,
            intervals: Option<RrIntervalView>,
        ) -> io::Result<RrOutcome> {
            super::tcp_client(flows, cfg, clock, stop, intervals)
        }
        fn echo(
            flows: &[&Self],
            cfg: &RrEcho,
            stop: &AtomicBool,
            counters: &[&Counters],
        ) -> io::Result<()> {
            super::tcp_echo(flows, cfg, stop, counters)
        }
        fn set_nonblocking(&self, on: bool) -> io::Result<()> {
            std::net::TcpStream::set_nonblocking(self, on)
        }
    }

    impl Sealed for std::net::UdpSocket {
        fn client(
            flows: &[&Self],
            cfg: &RrConfig,
            clock: &Clock,
            stop: &AtomicBool,
            intervals: Option<RrIntervalView>,
        ) -> io::Result<RrOutcome> {
            super::udp_client(flows, cfg, clock, stop, intervals)
        }
        fn echo(
            flows: &[&Self],
            cfg: &RrEcho,
            stop: &AtomicBool,
            counters: &[&Counters],
        ) -> io::Result<()> {
            super::udp_echo(flows, cfg, stop, counters)
        }
        fn set_nonblocking(&self, on: bool) -> io::Result<()> {
            std::net::UdpSocket::set_nonblocking(self, on)
        }
    }
}

/// Client side: drives `flows` (this thread's share) with one readiness loop until
/// `cfg.until_ns`, then until every response still due is back (TCP) or given up on (UDP).
/// `stop` ends it early, with what was measured so far. `cfg.open`: the open loop. `-i`:
/// `intervals` receives this thread's intervals as they end.
///
/// # Errors
/// `InvalidInput` for sizes out of bounds or a depth of 0; `Unsupported` where the platform
/// has no readiness loop ([`SUPPORTED`]). TCP: `TimedOut` when no flow of the thread has had a
/// response for [`TCP_REPLY_TIMEOUT`] while responses are due, `UnexpectedEof` when the peer
/// closes a flow early. UDP: `ConnectionRefused` when the peer's port is closed. Any other
/// socket error.
pub fn client<S: RrSocket>(
    flows: &[&S],
    cfg: &RrConfig,
    clock: &Clock,
    stop: &AtomicBool,
    intervals: Option<RrIntervalView>,
) -> io::Result<RrOutcome> {
    let _blocking = Nonblocking::set(flows)?;
    S::client(flows, cfg, clock, stop, intervals)
}

/// Agent side: answers every `cfg.request_size` bytes (TCP) or datagram (UDP) on `flows` with
/// `cfg.response_size` bytes, until every flow is closed (TCP) or `stop`. `counters[i]` counts
/// flow `i`'s responses (bytes and messages) and system calls.
///
/// # Errors
/// As [`client`] for the sizes and the platform; a failed read or write other than the peer's
/// reset or close (which ends that flow only).
pub fn echo<S: RrSocket>(
    flows: &[&S],
    cfg: &RrEcho,
    stop: &AtomicBool,
    counters: &[&Counters],
) -> io::Result<()> {
    let _blocking = Nonblocking::set(flows)?;
    S::echo(flows, cfg, stop, counters)
}

/// Checks a many-flow test's sizes and depth for `udp` or TCP.
///
/// # Errors
/// `InvalidInput`, saying what is allowed.
pub fn check(request_size: u32, response_size: u32, depth: u32, udp: bool) -> io::Result<()> {
    let (min, max) = if udp {
        (UDP_MIN_RR_MSG, super::UDP_MAX_MSG)
    } else {
        (1, super::TCP_MAX_MSG)
    };
    let proto = if udp { "UDP" } else { "TCP" };
    for (what, size) in [("request", request_size), ("response", response_size)] {
        if !(min..=max).contains(&size) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{proto} {what}s of a many-flow latency test are {min} to {max} bytes, not \
                     {size}{}",
                    if udp && size < min {
                        " (each carries its 8-byte sequence number)"
                    } else {
                        ""
                    }
                ),
            ));
        }
    }
    if depth == 0 || depth > sonde_wire::MAX_DEPTH {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!(
                "--depth is 1 to {} requests in flight per flow, not {depth}",
                sonde_wire::MAX_DEPTH
            ),
        ));
    }
    Ok(())
}

/// Puts the sockets back in blocking mode when dropped.
struct Nonblocking<'a, S: RrSocket>(&'a [&'a S]);

impl<'a, S: RrSocket> Nonblocking<'a, S> {
    fn set(flows: &'a [&'a S]) -> io::Result<Self> {
        for f in flows {
            f.set_nonblocking(true)?;
        }
        Ok(Self(flows))
    }
}

impl<S: RrSocket> Drop for Nonblocking<'_, S> {
    fn drop(&mut self) {
        for f in self.0 {
            let _ = f.set_nonblocking(false);
        }
    }
}

fn token(i: usize) -> u64 {
    i as u64
}

fn index(token: u64) -> usize {
    usize::try_from(token).unwrap_or(usize::MAX)
}

fn wait_for(spin: bool, poll: Duration) -> Duration {
    if spin {
        Duration::ZERO
    } else {
        poll
    }
}

// ---------------------------------------------------------------------------------------------
// TCP

/// A TCP flow's state: the send times of its requests in flight (oldest first), the bytes of
/// the response being read, the request bytes not yet written.
struct TcpFlow {
    in_flight: VecDeque<u64>,
    partial: usize,
    owed: u64,
    writing: bool,
    counts: RrFlow,
}

/// Writes what `owed` says from [`ZEROS`] until done or the socket is full; watches for
/// writability while bytes are left.
fn flush(
    sock: &TcpStream,
    owed: &mut u64,
    writing: &mut bool,
    poller: &sys::Poller,
    tok: u64,
    calls: &mut u64,
) -> io::Result<()> {
    while *owed > 0 {
        let n = usize::try_from(*owed).unwrap_or(READ_BUF).min(READ_BUF);
        *calls += 1;
        match (&*sock).write(&ZEROS[..n]) {
            Ok(0) => return Err(peer_closed()),
            Ok(w) => *owed -= w as u64,
            Err(e) if fault::again(&e) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let want = *owed > 0;
    if want != *writing {
        poller.modify(sys::sock_ref(sock), tok, want)?;
        *writing = want;
    }
    Ok(())
}

fn tcp_client(
    flows: &[&TcpStream],
    cfg: &RrConfig,
    clock: &Clock,
    stop: &AtomicBool,
    intervals: Option<RrIntervalView>,
) -> io::Result<RrOutcome> {
    check(cfg.request_size, cfg.response_size, cfg.depth, false)?;
    let mut poller = sys::Poller::new(flows.len())?;
    let req = u64::from(cfg.request_size);
    let resp = cfg.response_size as usize;
    let depth = cfg.depth as usize;
    let mut rtt = RttRecorder::new(cfg.warmup_ns);
    let mut cutter = intervals.map(|v| Cutter::new(v, cfg));
    let mut pacer = cfg.open.map(|o| o.pacer(flows.len(), cfg.until_ns));
    let mut state: Vec<TcpFlow> = flows
        .iter()
        .map(|_| TcpFlow {
            in_flight: VecDeque::with_capacity(depth),
            partial: 0,
            owed: 0,
            writing: false,
            counts: RrFlow::default(),
        })
        .collect();
    let mut buf = vec![0u8; READ_BUF];
    let mut calls = 0u64;
    for (i, sock) in flows.iter().enumerate() {
        poller.add(sys::sock_ref(*sock), token(i), false)?;
    }
    let start = clock.now_ns();
    // Requests outstanding over the thread's flows.
    let mut outstanding = 0u64;
    if pacer.is_none() {
        for (i, (sock, st)) in flows.iter().zip(&mut state).enumerate() {
            for _ in 0..depth {
                st.queue(start, req, cfg.warmup_ns);
            }
            outstanding += depth as u64;
            st.flush(sock, &poller, token(i), &mut calls)?;
        }
    }
    let reply_timeout = duration_ns(TCP_REPLY_TIMEOUT);
    let mut last_progress = start;
    loop {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let ready = poller.wait(wait_for(cfg.spin, until_due(pacer.as_ref(), clock)))?;
        calls += 1;
        let mut now = clock.now_ns();
        for e in 0..ready {
            let (tok, readable, writable) = poller.event(e);
            let i = index(tok);
            let (Some(sock), Some(st)) = (flows.get(i), state.get_mut(i)) else {
                continue;
            };
            if readable {
                calls += 1;
                let n = match (&**sock).read(&mut buf) {
                    Ok(0) => return Err(peer_closed()),
                    Ok(n) => n,
                    Err(e) if fault::again(&e) || e.kind() == io::ErrorKind::Interrupted => 0,
                    Err(e) => return Err(e),
                };
                if n > 0 {
                    now = clock.now_ns();
                    last_progress = now;
                    st.partial += n;
                    while st.partial >= resp {
                        st.partial -= resp;
                        // More bytes than were asked for: the peer is not echoing this test.
                        let Some(sent_at) = st.in_flight.pop_front() else {
                            return Err(io::Error::new(
                                io::ErrorKind::InvalidData,
                                "the peer sent more response bytes than requests were made",
                            ));
                        };
                        outstanding -= 1;
                        rtt.record(sent_at, now.saturating_sub(sent_at));
                        if let Some(c) = &mut cutter {
                            c.record(now, sent_at);
                        }
                        st.counts.answered += 1;
                        if sent_at >= cfg.warmup_ns {
                            st.counts.measured += 1;
                        }
                        match &mut pacer {
                            None if now < cfg.until_ns => {
                                st.queue(now, req, cfg.warmup_ns);
                                outstanding += 1;
                            }
                            None => {}
                            // A place is free: what is due (and waited) goes now.
                            Some(p) => outstanding += st.take(p, i, now, cfg, req),
                        }
                    }
                }
            }
            if writable || st.owed > 0 {
                st.flush(sock, &poller, tok, &mut calls)?;
            }
        }
        if let Some(p) = &mut pacer {
            now = clock.now_ns();
            // Each flow whose time has come sends what is due, up to its depth.
            while let Some(i) = p.due_flow(now) {
                let (Some(sock), Some(st)) = (flows.get(i), state.get_mut(i)) else {
                    continue;
                };
                let sent = st.take(p, i, now, cfg, req);
                if sent > 0 {
                    // Nothing was outstanding anywhere: the reply clock starts now.
                    if outstanding == 0 {
                        last_progress = now;
                    }
                    outstanding += sent;
                    st.flush(sock, &poller, token(i), &mut calls)?;
                }
            }
        }
        if let Some(c) = &mut cutter {
            c.tick(now);
        }
        if now >= cfg.until_ns && outstanding == 0 {
            break;
        }
        if outstanding > 0 && now.saturating_sub(last_progress) > reply_timeout {
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!(
                    "no response on any of this thread's {} TCP flows for {} s: is the agent \
                     alive and answering?",
                    flows.len(),
                    TCP_REPLY_TIMEOUT.as_secs()
                ),
            ));
        }
    }
    let end = clock.now_ns();
    if let Some(c) = cutter {
        c.finish(end);
    }
    super::add_calls(calls);
    let mut counts: Vec<RrFlow> = state.into_iter().map(|s| s.counts).collect();
    if let Some(p) = &pacer {
        open_counts(p, &mut counts, end, cfg.warmup_ns);
    }
    Ok(RrOutcome { rtt, flows: counts })
}

impl TcpFlow {
    /// One more request, sent (its RTT counting from) `at`: in flight, its bytes owed.
    fn queue(&mut self, at: u64, req: u64, warmup_ns: u64) {
        self.in_flight.push_back(at);
        self.owed += req;
        self.counts.sent += 1;
        self.counts.sent_measured += u64::from(at >= warmup_ns);
    }

    /// Writes what the flow owes ([`flush`]).
    fn flush(
        &mut self,
        sock: &TcpStream,
        poller: &sys::Poller,
        tok: u64,
        calls: &mut u64,
    ) -> io::Result<()> {
        flush(sock, &mut self.owed, &mut self.writing, poller, tok, calls)
    }

    /// Open loop: queues every request of flow `i` due by `now` while it has a place; how many.
    fn take(&mut self, p: &mut FlowPacer, i: usize, now: u64, cfg: &RrConfig, req: u64) -> u64 {
        let mut n = 0;
        while let Some(due) = p.take(i, now, len_u32(self.in_flight.len()), cfg.depth) {
            self.queue(due, req, cfg.warmup_ns);
            n += 1;
        }
        n
    }
}

fn len_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// The readiness loop's longest wait: [`POLL`], or less when the open loop has a send due
/// sooner.
fn until_due(pacer: Option<&FlowPacer>, clock: &Clock) -> Duration {
    match pacer.and_then(FlowPacer::next_due) {
        Some(due) => Duration::from_nanos(due.saturating_sub(clock.now_ns())).min(POLL),
        None => POLL,
    }
}

/// Open loop: each flow's late and unsent sends, from its pacer (the loop ended at `end`).
fn open_counts(p: &FlowPacer, counts: &mut [RrFlow], end: u64, warmup_ns: u64) {
    for (f, c) in counts.iter_mut().enumerate() {
        c.late_sends = p.late(f);
        c.unsent = p.unsent(f, end);
        c.sent_measured = p.sent_from(f, warmup_ns);
    }
}

fn tcp_echo(
    flows: &[&TcpStream],
    cfg: &RrEcho,
    stop: &AtomicBool,
    counters: &[&Counters],
) -> io::Result<()> {
    let &RrEcho {
        request_size,
        response_size,
        spin,
        ..
    } = cfg;
    check(request_size, response_size, 1, false)?;
    let mut poller = sys::Poller::new(flows.len())?;
    let req = request_size as usize;
    let resp = u64::from(response_size);
    // Per flow: bytes of the request being read, response bytes owed, watching for writes,
    // still open.
    let mut partial = vec![0usize; flows.len()];
    let mut owed = vec![0u64; flows.len()];
    let mut writing = vec![false; flows.len()];
    let mut open = vec![true; flows.len()];
    let mut open_count = flows.len();
    let mut buf = vec![0u8; READ_BUF];
    for (i, sock) in flows.iter().enumerate() {
        poller.add(sys::sock_ref(*sock), token(i), false)?;
    }
    while open_count > 0 && !stop.load(Ordering::Relaxed) {
        let ready = poller.wait(wait_for(spin, ECHO_POLL))?;
        for e in 0..ready {
            let (tok, readable, writable) = poller.event(e);
            let i = index(tok);
            let (Some(sock), Some(count)) = (flows.get(i), counters.get(i)) else {
                continue;
            };
            if !open[i] {
                continue;
            }
            if readable {
                count.syscall();
                match (&**sock).read(&mut buf) {
                    Ok(0) => {
                        close(&poller, sock, &mut open[i], &mut open_count);
                        continue;
                    }
                    Ok(n) => {
                        partial[i] += n;
                        let requests = partial[i] / req;
                        partial[i] %= req;
                        owed[i] += requests as u64 * resp;
                        count.add(requests as u64 * resp, requests as u64);
                    }
                    Err(e) if fault::again(&e) || e.kind() == io::ErrorKind::Interrupted => {}
                    Err(e) if fault::peer_gone(&e) => {
                        close(&poller, sock, &mut open[i], &mut open_count);
                        continue;
                    }
                    Err(e) => return Err(e),
                }
            }
            if writable || owed[i] > 0 {
                let mut calls = 0;
                let r = flush(
                    sock,
                    &mut owed[i],
                    &mut writing[i],
                    &poller,
                    tok,
                    &mut calls,
                );
                count.add_syscalls(calls);
                match r {
                    Ok(()) => {}
                    Err(e) if fault::peer_gone(&e) || e.kind() == io::ErrorKind::UnexpectedEof => {
                        close(&poller, sock, &mut open[i], &mut open_count);
                    }
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(())
}

/// Stops watching a flow the peer closed (a level-triggered epoll would report its EOF at
/// every wait).
fn close(poller: &sys::Poller, sock: &TcpStream, open: &mut bool, open_count: &mut usize) {
    let _ = poller.remove(sys::sock_ref(sock));
    *open = false;
    *open_count -= 1;
}

// ---------------------------------------------------------------------------------------------
// UDP

/// A UDP request in flight (or given up on): its sequence number, the time its RTT counts
/// from and the time it left.
#[derive(Clone, Copy, Default)]
struct Slot {
    seq: u64,
    /// The RTT counts from here: the send (closed loop) or the scheduled send (open loop).
    sent_ns: u64,
    /// When it left: the reply timeout counts from here.
    left_ns: u64,
    /// Sent and not yet answered nor given up on.
    live: bool,
    /// Given up on at the reply timeout; a response may still come (late).
    gave_up: bool,
}

struct UdpFlow {
    slots: Vec<Slot>,
    next_seq: u64,
    in_flight: u32,
    counts: RrFlow,
}

/// `max(10 ms, 10 × median RTT so far)`, or 1 s before the first RTT is known.
fn udp_rr_timeout_ns(rtt: &RttRecorder) -> u64 {
    let floor = duration_ns(UDP_RR_MIN_TIMEOUT);
    rtt.value_at(50.0)
        .map_or(duration_ns(UDP_FIRST_REPLY_TIMEOUT), |median| {
            median.saturating_mul(10).max(floor)
        })
}

/// Sends flow `f`'s next request (sequence number in its first 8 bytes) at `now`, its RTT
/// counting from `at`; a datagram the kernel could not queue is lost like any other.
fn udp_send(
    sock: &UdpSocket,
    f: &mut UdpFlow,
    msg: &mut [u8],
    at: u64,
    now: u64,
    warmup_ns: u64,
    calls: &mut u64,
) -> io::Result<()> {
    let seq = f.next_seq;
    f.next_seq += 1;
    let ring = f.slots.len() as u64;
    let slot = &mut f.slots[(seq % ring) as usize];
    // A request this old still in flight is given up on to free its slot.
    if slot.live {
        f.in_flight -= 1;
        f.counts.timeouts += 1;
    }
    *slot = Slot {
        seq,
        sent_ns: at,
        left_ns: now,
        live: true,
        gave_up: false,
    };
    f.in_flight += 1;
    f.counts.sent += 1;
    f.counts.sent_measured += u64::from(at >= warmup_ns);
    msg[..8].copy_from_slice(&seq.to_be_bytes());
    *calls += 1;
    match sock.send(msg) {
        Ok(_) => Ok(()),
        Err(e) if fault::datagram_dropped(&e) || fault::again(&e) => Ok(()),
        Err(e) => Err(super::udp::udp_error(e)),
    }
}

/// After a place freed on flow `i` at `now`: the closed loop sends the next request (before
/// the end), the open loop every request due while the flow has a place.
#[expect(
    clippy::too_many_arguments,
    reason = "the loop's state, passed by reference"
)]
fn udp_next(
    sock: &UdpSocket,
    f: &mut UdpFlow,
    pacer: Option<&mut FlowPacer>,
    i: usize,
    msg: &mut [u8],
    now: u64,
    cfg: &RrConfig,
    calls: &mut u64,
) -> io::Result<()> {
    match pacer {
        None if now < cfg.until_ns => udp_send(sock, f, msg, now, now, cfg.warmup_ns, calls),
        None => Ok(()),
        Some(p) => {
            while let Some(due) = p.take(i, now, f.in_flight, cfg.depth) {
                udp_send(sock, f, msg, due, now, cfg.warmup_ns, calls)?;
            }
            Ok(())
        }
    }
}

fn udp_client(
    flows: &[&UdpSocket],
    cfg: &RrConfig,
    clock: &Clock,
    stop: &AtomicBool,
    intervals: Option<RrIntervalView>,
) -> io::Result<RrOutcome> {
    check(cfg.request_size, cfg.response_size, cfg.depth, true)?;
    let mut poller = sys::Poller::new(flows.len())?;
    let ring = cfg.depth as usize * SLOTS_PER_DEPTH;
    let mut rtt = RttRecorder::new(cfg.warmup_ns);
    let mut cutter = intervals.map(|v| Cutter::new(v, cfg));
    let mut pacer = cfg.open.map(|o| o.pacer(flows.len(), cfg.until_ns));
    let mut state: Vec<UdpFlow> = flows
        .iter()
        .map(|_| UdpFlow {
            slots: vec![Slot::default(); ring],
            next_seq: 0,
            in_flight: 0,
            counts: RrFlow::default(),
        })
        .collect();
    let mut msg = vec![0u8; cfg.request_size as usize];
    let mut buf = vec![0u8; super::UDP_RECV_BUF];
    let mut calls = 0u64;
    for (i, sock) in flows.iter().enumerate() {
        poller.add(sys::sock_ref(*sock), token(i), false)?;
    }
    let start = clock.now_ns();
    if pacer.is_none() {
        for (sock, f) in flows.iter().zip(&mut state) {
            for _ in 0..cfg.depth {
                udp_send(sock, f, &mut msg, start, start, cfg.warmup_ns, &mut calls)?;
            }
        }
    }
    let mut timeout_ns = duration_ns(UDP_FIRST_REPLY_TIMEOUT);
    let mut next_refresh = 1u64;
    let mut next_sweep = start;
    loop {
        if stop.load(Ordering::Relaxed) {
            break;
        }
        let ready = poller.wait(wait_for(cfg.spin, until_due(pacer.as_ref(), clock)))?;
        calls += 1;
        for e in 0..ready {
            let (tok, readable, _) = poller.event(e);
            let i = index(tok);
            let (Some(sock), Some(f)) = (flows.get(i), state.get_mut(i)) else {
                continue;
            };
            if !readable {
                continue;
            }
            // The datagrams queued on this flow, at most its depth (it has no more requests
            // out; a late reply or a stray beyond that waits for the next wake-up, which level
            // triggering reports): at depth 1 one recv, not a second that finds nothing (one
            // more system call per transaction: 3 instead of 2 at 256 flows).
            for _ in 0..cfg.depth.max(1) {
                calls += 1;
                let n = match sock.recv(&mut buf) {
                    Ok(n) => n,
                    Err(e) if fault::again(&e) || e.kind() == io::ErrorKind::Interrupted => break,
                    Err(e) => return Err(super::udp::udp_error(e)),
                };
                let now = clock.now_ns();
                let datagram = &buf[..n];
                // A stray join acknowledgement, or a datagram too short to be a response.
                if n < 8 || (n == UDP_JOIN_LEN && UdpJoin::decode(datagram).is_ok()) {
                    continue;
                }
                let mut seq_bytes = [0u8; 8];
                seq_bytes.copy_from_slice(&datagram[..8]);
                let seq = u64::from_be_bytes(seq_bytes);
                let slot = &mut f.slots[(seq % ring as u64) as usize];
                if slot.seq != seq || !(slot.live || slot.gave_up) {
                    // A duplicate, or a response to a request whose slot was reused.
                    continue;
                }
                let sent_at = slot.sent_ns;
                if slot.live {
                    slot.live = false;
                    f.in_flight -= 1;
                    rtt.record(sent_at, now.saturating_sub(sent_at));
                    if let Some(c) = &mut cutter {
                        c.record(now, sent_at);
                    }
                    if sent_at >= cfg.warmup_ns {
                        f.counts.measured += 1;
                    }
                    udp_next(sock, f, pacer.as_mut(), i, &mut msg, now, cfg, &mut calls)?;
                } else {
                    slot.gave_up = false;
                    f.counts.late += 1;
                }
                f.counts.answered += 1;
            }
        }
        let now = clock.now_ns();
        if rtt.samples() >= next_refresh {
            timeout_ns = udp_rr_timeout_ns(&rtt);
            next_refresh = next_refresh.saturating_mul(2).min(rtt.samples() + 1024);
        }
        // Requests past the reply timeout (from when they left) are given up on, a quarter of
        // it at a time.
        if now >= next_sweep {
            next_sweep = now + timeout_ns / 4;
            for (i, (sock, f)) in flows.iter().zip(&mut state).enumerate() {
                let mut freed = 0;
                for slot in &mut f.slots {
                    if slot.live && now.saturating_sub(slot.left_ns) > timeout_ns {
                        slot.live = false;
                        slot.gave_up = true;
                        f.in_flight -= 1;
                        f.counts.timeouts += 1;
                        freed += 1;
                    }
                }
                // The closed loop sends one request per place freed; the open loop's one call
                // sends all that is due.
                let sends = if pacer.is_some() { freed.min(1) } else { freed };
                for _ in 0..sends {
                    udp_next(sock, f, pacer.as_mut(), i, &mut msg, now, cfg, &mut calls)?;
                }
            }
        }
        if let Some(p) = &mut pacer {
            // Each flow whose time has come sends what is due, up to its depth.
            while let Some(i) = p.due_flow(now) {
                let (Some(sock), Some(f)) = (flows.get(i), state.get_mut(i)) else {
                    continue;
                };
                udp_next(sock, f, Some(&mut *p), i, &mut msg, now, cfg, &mut calls)?;
            }
        }
        if let Some(c) = &mut cutter {
            c.tick(now);
        }
        if now >= cfg.until_ns && state.iter().all(|f| f.in_flight == 0) {
            break;
        }
    }
    let end = clock.now_ns();
    if let Some(c) = cutter {
        c.finish(end);
    }
    super::add_calls(calls);
    let mut counts: Vec<RrFlow> = state.into_iter().map(|f| f.counts).collect();
    if let Some(p) = &pacer {
        open_counts(p, &mut counts, end, cfg.warmup_ns);
    }
    Ok(RrOutcome { rtt, flows: counts })
}

fn udp_echo(
    flows: &[&UdpSocket],
    cfg: &RrEcho,
    stop: &AtomicBool,
    counters: &[&Counters],
) -> io::Result<()> {
    let &RrEcho {
        request_size,
        response_size,
        depth,
        spin,
    } = cfg;
    check(request_size, response_size, 1, true)?;
    let mut poller = sys::Poller::new(flows.len())?;
    let mut buf = vec![0u8; super::UDP_RECV_BUF];
    let mut response = vec![0u8; response_size as usize];
    for (i, sock) in flows.iter().enumerate() {
        poller.add(sys::sock_ref(*sock), token(i), false)?;
    }
    while !stop.load(Ordering::Relaxed) {
        let ready = poller.wait(wait_for(spin, ECHO_POLL))?;
        for e in 0..ready {
            let (tok, readable, _) = poller.event(e);
            let i = index(tok);
            let (Some(sock), Some(count)) = (flows.get(i), counters.get(i)) else {
                continue;
            };
            if !readable {
                continue;
            }
            // At most the flow's depth of requests per wake-up, as the client reads replies:
            // at depth 1 no second recv that finds nothing; what is left (a repeated join, a
            // request sent after one its client gave up on) is reported again by the
            // level-triggered poller.
            for _ in 0..depth.max(1) {
                count.syscall();
                let n = match sock.recv(&mut buf) {
                    Ok(n) => n,
                    Err(e) if fault::again(&e) || e.kind() == io::ErrorKind::Interrupted => break,
                    // An ICMP error about an earlier response: the client may be gone; the
                    // session decides, through `stop`.
                    Err(e) if fault::port_unreachable(&e) || sys::message_too_long(&e) => break,
                    Err(e) => return Err(e),
                };
                let datagram = &buf[..n];
                if n == UDP_JOIN_LEN {
                    if let Ok(join) = UdpJoin::decode(datagram) {
                        // A repeated join: the client has not seen our first ack yet.
                        if !join.ack {
                            super::udp::send_transient_ok(
                                sock,
                                &UdpJoin { ack: true, ..join }.encode(),
                            )?;
                            count.syscall();
                        }
                        continue;
                    }
                }
                let k = n.min(8);
                response[..k].copy_from_slice(&datagram[..k]);
                count.syscall();
                match super::udp::send_transient_ok(sock, &response) {
                    Ok(()) => count.add(u64::from(response_size), 1),
                    Err(e) if sys::message_too_long(&e) || fault::port_unreachable(&e) => {}
                    Err(e) => return Err(e),
                }
            }
        }
    }
    Ok(())
}

// The loops need the readiness loop (epoll): elsewhere they only say so, which the test below
// checks.
#[cfg(all(test, target_os = "linux"))]
mod tests;

#[cfg(all(test, not(target_os = "linux")))]
mod unsupported_tests {
    #[test]
    fn many_flows_say_this_platform_cannot() {
        const { assert!(!super::SUPPORTED) };
        let e = crate::sys::Poller::new(1).err().expect("no poller here");
        assert_eq!(e.kind(), std::io::ErrorKind::Unsupported);
        assert!(
            e.to_string().contains("not supported on this platform"),
            "{e}"
        );
    }
}
