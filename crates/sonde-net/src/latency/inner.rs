//! Latency's inner view: what a run records beyond its RTTs, when asked.
//!
//! * `--full-log`: every sample to a [`SampleSender`] (`try_send`, never blocking).
//! * `--timestamps`: the kernel's software timestamps, and from them the RTT as the sockets saw
//!   it (reply's kernel RX minus request's kernel TX), the fallback "application send to kernel
//!   RX" where transmit stamps are missing, and this host's share of the application's RTT.
//! * `--one-way`: the agent's receive and send stamps in each reply, converted into one-way
//!   delays with the clock models a clock-sync thread sends in ([`OneWayLink`]); the best probe
//!   exchange of each second goes back to that thread.
//!
//! * `-i`: the RTTs of each interval ([`IntervalView`]), summarised at its end and sent to the
//!   caller.
//!
//! The loops call [`Recorder::reply`] and [`Recorder::lost`] for every message, and
//! [`Recorder::tick`] when they wake without one. Nothing here locks or blocks, and nothing
//! allocates per message: histograms and the model list are allocated up front, channels are
//! bounded and used with `try_send`/`try_recv`; an interval's summary (a few dozen bytes) is
//! allocated once per interval.

use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use sonde_engine::offset::{ClockFit, Exchange};
use sonde_engine::oneway::{LinearOffset, OneWayRecorder};
use sonde_engine::rtt::RttRecorder;

use crate::cpu::ThreadsMeter;
use crate::samplelog::{Outcome, Reply as LogReply, Sample, SampleSender};

/// Probe exchanges are offered to the clock estimate at most once per this much client time
/// (the best of the window): the estimator keeps one per window anyway.
const PROBE_WINDOW_NS: u64 = 1_000_000_000;

/// What a latency run records beyond its RTTs. The default records nothing more.
#[derive(Debug, Default)]
pub struct InnerView {
    /// `--full-log`: every sample goes here.
    pub log: Option<SampleSender>,
    /// `--timestamps`: read the kernel's software timestamps.
    pub timestamps: bool,
    /// `--one-way`: ask the agent's echo for its stamps and convert them.
    pub one_way: Option<OneWayLink>,
    /// The caller's CPU meter: threads the loop starts (the open loop's sender) count their
    /// CPU here. The calling thread, which runs the rest of the loop, is the caller's to count.
    pub cpu: Option<Arc<ThreadsMeter>>,
    /// `-i`: the RTTs of each interval.
    pub intervals: Option<IntervalView>,
}

/// `-i`: the run's RTTs cut into intervals of `every_ns` on the test clock, from the end of the
/// warm-up on; the last runs from the last boundary before the run's planned end to the moment
/// the loop stopped (the replies to the last messages come in after the planned end, and a
/// sliver of an interval holding them would say nothing). A reply belongs to the interval it
/// arrived in; replies to messages sent during
/// the warm-up are left out, as from the run's histogram, so the intervals' samples add up to
/// the run's. Each interval's summary is sent (`try_send`: a caller that does not keep up loses
/// intervals, counted in nothing but their absence) when a reply or a wake-up of the loop finds
/// it over; the last, partial one when the run ends.
#[derive(Debug)]
pub struct IntervalView {
    /// The interval, ns (above 0).
    pub every_ns: u64,
    /// Where the summaries go.
    pub out: SyncSender<RttInterval>,
}

/// One interval's RTTs.
#[derive(Debug, Clone)]
pub struct RttInterval {
    /// Start, ns on the test clock.
    pub start_ns: u64,
    /// End, ns on the test clock (the run's end for the last one).
    pub end_ns: u64,
    /// The replies that arrived in it: their RTT summary.
    pub rtt: sonde_engine::rtt::RttSummary,
}

struct Intervals {
    view: IntervalView,
    start_ns: u64,
    /// The run's planned end: no interval ends at or after it but the last.
    until_ns: u64,
    rtt: RttRecorder,
}

impl Intervals {
    /// Sends every interval that ended by `now_ns`, empty ones included.
    fn tick(&mut self, now_ns: u64) {
        while let Some(end_ns) =
            super::interval_over(self.start_ns, self.view.every_ns, self.until_ns, now_ns)
        {
            self.send(end_ns);
            self.start_ns = end_ns;
        }
    }

    fn send(&mut self, end_ns: u64) {
        let _ = self.view.out.try_send(RttInterval {
            start_ns: self.start_ns,
            end_ns,
            rtt: self.rtt.summary(),
        });
        self.rtt.reset();
    }
}

/// The latency loop's end of the clock synchronisation (`--one-way`).
#[derive(Debug)]
pub struct OneWayLink {
    /// Clock models, newest last; the loop converts with the newest it has taken.
    pub models: Receiver<LinearOffset>,
    /// The best probe exchange of each second goes here (dropped when full).
    pub probes: SyncSender<Exchange>,
    /// This host's clock ([`super::host_clock_ns`]) minus the test clock, ns: the exchanges'
    /// client times are on the host clock, as the clock-sync thread's are.
    pub host_minus_test_ns: u64,
}

/// `--timestamps`: the RTT at the sockets, per sample after the warm-up.
#[derive(Debug, Clone)]
pub struct SocketOutcome {
    /// Receive timestamps were enabled on the socket (`Err` says why not).
    pub rx: Result<(), String>,
    /// Transmit timestamps were enabled (`Err` says why not: TCP's are not read).
    pub tx: Result<(), String>,
    /// Samples whose reply had a kernel receive timestamp.
    pub rx_stamped: u64,
    /// Samples that also had their request's kernel transmit timestamp.
    pub tx_stamped: u64,
    /// Samples where a kernel figure came out longer than the application's RTT (a step of
    /// the wall clock the kernel stamps with); left out of the distributions.
    pub inconsistent: u64,
    /// Reply's kernel RX minus request's kernel TX.
    pub socket_rtt: RttRecorder,
    /// Application RTT minus `socket_rtt`: this host's time, both ends of the round trip.
    pub host: RttRecorder,
    /// Reply's kernel RX minus the application's send.
    pub send_to_rx: RttRecorder,
    /// Application RTT minus `send_to_rx`: from the reply's kernel RX to the application.
    pub rx_host: RttRecorder,
}

/// `--one-way`: what the loop recorded, and (filled in by the caller that ran the clock sync)
/// the final clock fit.
#[derive(Debug, Clone)]
pub struct OneWayOutcome {
    /// The delays, converted with provisional models.
    pub recorder: OneWayRecorder,
    /// Replies after the warm-up that came back without the agent's stamps.
    pub unstamped: u64,
    /// Probe exchanges offered to the clock estimate.
    pub probes_offered: u64,
    /// The final fit of the clock offset; `None` when it could not be made.
    pub fit: Option<ClockFit>,
    /// Clock exchanges over the control channel.
    pub control_exchanges: u64,
    /// Uncertainty the caller adds (mapping its clocks), ns.
    pub extra_uncertainty_ns: u64,
    /// The host clock minus the test clock, ns, as the exchanges' client times used it.
    pub host_minus_test_ns: u64,
}

/// Kernel and agent times of one reply, where known.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Stamps {
    /// The reply's kernel receive time, ns of `CLOCK_REALTIME`.
    pub(crate) rx_ns: Option<u64>,
    /// The request's kernel transmit time, ns of `CLOCK_REALTIME`.
    pub(crate) tx_ns: Option<u64>,
    /// The wall clock just before the application sent the request, ns of `CLOCK_REALTIME`.
    pub(crate) send_real_ns: Option<u64>,
    /// The agent's `(t2, t3)`.
    pub(crate) agent: Option<(u64, u64)>,
}

/// One reply as a loop saw it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct ReplyAt {
    pub(crate) seq: u64,
    /// Where the RTT counts from (the send, or the scheduled send), test clock.
    pub(crate) send_ns: u64,
    /// When the application received it, test clock.
    pub(crate) receive_ns: u64,
    /// The loop had stopped waiting for it.
    pub(crate) late: bool,
    pub(crate) stamps: Stamps,
}

/// The wall clock, ns since the epoch: what the kernel's software timestamps read.
pub(crate) fn realtime_ns() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
}

struct OneWayState {
    link: OneWayLink,
    out: OneWayOutcome,
    /// The best (smallest delay) probe exchange of the current window.
    best: Option<(u64, Exchange, u64)>,
}

/// Per-loop state for the inner view (one per reading thread).
pub(crate) struct Recorder {
    warmup_ns: u64,
    log: Option<SampleSender>,
    socket: Option<SocketOutcome>,
    one_way: Option<OneWayState>,
    cpu: Option<Arc<ThreadsMeter>>,
    intervals: Option<Intervals>,
}

impl Recorder {
    /// Allocates everything the view needs, for a run planned to end at `until_ns`.
    pub(crate) fn new(view: InnerView, warmup_ns: u64, until_ns: u64) -> Self {
        let socket = view.timestamps.then(|| SocketOutcome {
            rx: Err("not enabled".into()),
            tx: Err("not enabled".into()),
            rx_stamped: 0,
            tx_stamped: 0,
            inconsistent: 0,
            socket_rtt: RttRecorder::new(warmup_ns),
            host: RttRecorder::new(warmup_ns),
            send_to_rx: RttRecorder::new(warmup_ns),
            rx_host: RttRecorder::new(warmup_ns),
        });
        let one_way = view.one_way.map(|link| OneWayState {
            out: OneWayOutcome {
                recorder: OneWayRecorder::new(warmup_ns),
                unstamped: 0,
                probes_offered: 0,
                fit: None,
                control_exchanges: 0,
                extra_uncertainty_ns: 0,
                host_minus_test_ns: link.host_minus_test_ns,
            },
            link,
            best: None,
        });
        let intervals = view.intervals.map(|view| Intervals {
            view,
            start_ns: warmup_ns,
            until_ns,
            rtt: RttRecorder::new(0),
        });
        Self {
            warmup_ns,
            log: view.log,
            socket,
            one_way,
            cpu: view.cpu,
            intervals,
        }
    }

    /// The meter the loop's own threads count their CPU in, if the caller gave one.
    pub(crate) fn cpu(&self) -> Option<Arc<ThreadsMeter>> {
        self.cpu.clone()
    }

    /// Whether kernel timestamps were asked for.
    pub(crate) fn timestamps(&self) -> bool {
        self.socket.is_some()
    }

    /// Whether kernel timestamps are being read (asked for and enabled).
    pub(crate) fn reading_rx(&self) -> bool {
        self.socket.as_ref().is_some_and(|s| s.rx.is_ok())
    }

    /// Whether transmit timestamps are being read.
    pub(crate) fn reading_tx(&self) -> bool {
        self.socket.as_ref().is_some_and(|s| s.tx.is_ok())
    }

    /// Records how enabling the timestamps went.
    pub(crate) fn set_enabled(&mut self, rx: Result<(), String>, tx: Result<(), String>) {
        if let Some(s) = &mut self.socket {
            s.rx = rx;
            s.tx = tx;
        }
    }

    /// Whether the agent is asked for its stamps.
    pub(crate) fn one_way(&self) -> bool {
        self.one_way.is_some()
    }

    /// `-i`: sends the intervals that are over by now on `clock` (which is read only when
    /// intervals are asked for). The loops call it when they wake, reply or not.
    pub(crate) fn tick(&mut self, clock: &crate::Clock) {
        if let Some(iv) = &mut self.intervals {
            iv.tick(clock.now_ns());
        }
    }

    /// One reply (the first arrival of its message).
    pub(crate) fn reply(&mut self, r: &ReplyAt) {
        let warmup = r.send_ns < self.warmup_ns;
        let rtt = r.receive_ns.saturating_sub(r.send_ns);
        if let Some(iv) = &mut self.intervals {
            iv.tick(r.receive_ns);
            if !warmup {
                iv.rtt.record(r.send_ns, rtt);
            }
        }
        let socket_rtt = match (r.stamps.rx_ns, r.stamps.tx_ns) {
            (Some(rx), Some(tx)) => rx.checked_sub(tx),
            _ => None,
        };
        let send_to_rx = match (r.stamps.rx_ns, r.stamps.send_real_ns) {
            (Some(rx), Some(sent)) => rx.checked_sub(sent),
            _ => None,
        };
        if let Some(s) = &mut self.socket {
            if !warmup {
                s.rx_stamped += u64::from(r.stamps.rx_ns.is_some());
                s.tx_stamped += u64::from(socket_rtt.is_some());
            }
            let mut consistent = true;
            if let Some(k) = socket_rtt {
                consistent &= k <= rtt;
                s.socket_rtt.record(r.send_ns, k);
                s.host.record(r.send_ns, rtt.saturating_sub(k));
            }
            if let Some(k) = send_to_rx {
                consistent &= k <= rtt;
                s.send_to_rx.record(r.send_ns, k);
                s.rx_host.record(r.send_ns, rtt.saturating_sub(k));
            }
            if !consistent && !warmup {
                s.inconsistent += 1;
            }
        }
        if let Some(ow) = &mut self.one_way {
            ow.reply(r, warmup);
        }
        if let Some(log) = &mut self.log {
            let reply = LogReply {
                receive_ns: r.receive_ns,
                rtt_ns: Some(rtt),
                socket_rtt_ns: socket_rtt,
                send_to_socket_rx_ns: send_to_rx,
            };
            log.record(Sample {
                seq: r.seq,
                send_ns: r.send_ns,
                warmup,
                outcome: if r.late {
                    Outcome::Late(reply)
                } else {
                    Outcome::Received(reply)
                },
            });
        }
    }

    /// A message whose reply never came.
    pub(crate) fn lost(&mut self, seq: u64, send_ns: u64) {
        if let Some(log) = &mut self.log {
            log.record(Sample {
                seq,
                send_ns,
                warmup: send_ns < self.warmup_ns,
                outcome: Outcome::Lost,
            });
        }
    }

    /// Whether lost messages need telling apart (only the log lists them).
    pub(crate) fn wants_lost(&self) -> bool {
        self.log.is_some()
    }

    /// Ends the run at `end_ns` on the test clock: the last interval goes (`-i`), the log's
    /// sender goes (so the writer can finish), the best probe of the last window goes to the
    /// clock sync.
    pub(crate) fn finish(self, end_ns: u64) -> (Option<SocketOutcome>, Option<OneWayOutcome>) {
        if let Some(mut iv) = self.intervals {
            iv.tick(end_ns);
            if end_ns > iv.start_ns {
                iv.send(end_ns);
            }
        }
        drop(self.log);
        let one_way = self.one_way.map(|mut ow| {
            ow.offer_best();
            ow.out
        });
        (self.socket, one_way)
    }
}

impl OneWayState {
    fn reply(&mut self, r: &ReplyAt, warmup: bool) {
        // The newest model first, so this reply converts with it.
        let mut newest = None;
        while let Ok(m) = self.link.models.try_recv() {
            newest = Some(m);
        }
        if let Some(m) = newest {
            self.out.recorder.set_model(m);
        }
        let Some((t2, t3)) = r.stamps.agent else {
            self.out.unstamped += u64::from(!warmup);
            return;
        };
        let host = self.link.host_minus_test_ns;
        let ex = Exchange {
            client_send_ns: r.send_ns.saturating_add(host),
            agent_receive_ns: t2,
            agent_send_ns: t3,
            client_receive_ns: r.receive_ns.saturating_add(host),
        };
        if let Some(delay) = ex.delay_ns() {
            let window = ex.client_send_ns / PROBE_WINDOW_NS;
            match self.best {
                Some((w, _, _)) if w != window => {
                    self.offer_best();
                    self.best = Some((window, ex, delay));
                }
                Some((_, _, best)) if best <= delay => {}
                _ => self.best = Some((window, ex, delay)),
            }
        }
        self.out.recorder.record(r.send_ns, &ex);
    }

    fn offer_best(&mut self) {
        if let Some((_, ex, _)) = self.best.take() {
            if self.link.probes.try_send(ex).is_ok() {
                self.out.probes_offered += 1;
            }
        }
    }
}
