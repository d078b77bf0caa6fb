//! What crossed a lab link, as the kernel counted it: the reference a throughput reading is
//! checked against in the same run.
//!
//! A shaped link's nominal goodput is a truth only while the sender keeps it busy. On a shared
//! host (a CI machine whose vCPUs are stolen) no tool keeps it busy all the time, and every tool
//! reads low. What the link did carry, and when, is still known: [`RxMeter`] reads the receiving
//! interface's counters from `/proc/<pid>/net/dev` of a process inside its namespace every
//! couple of milliseconds (a file read, no process started, so it takes next to nothing from the
//! tools under test), and [`Flow::from_samples`] finds the data phase in those readings.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use super::{command_in, Daemon};

/// The edge that marks a transfer's data phase in the readings ([`Flow::from_samples`]): above
/// the control messages around the data (a few kilobytes), and carried by a 100 Mbit/s link in
/// about 2.6 ms.
pub(crate) const EDGE_BYTES: u64 = 32 * 1024;

/// The bytes of a TCP segment on an Ethernet link that are not payload: Ethernet 14, IPv4 20,
/// TCP with the timestamp option 32.
pub(crate) const TCP_OVERHEAD_BYTES: f64 = 66.0;

/// How often [`RxMeter`] reads the counters around the data phase's edges.
const FAST: Duration = Duration::from_millis(2);

/// How often it reads them in the middle of the data phase. A reading every 2 ms throughout
/// measurably slows the tools under test on a 2-vCPU VM (the steady link-layer rate through a
/// 100 Mbit/s tbf fell from 99.99 to 98-99.4 Mbit/s): the wake-ups are not free.
const SLOW: Duration = Duration::from_millis(100);

/// How long before the data phase's expected end the readings speed up again.
const END_MARGIN: Duration = Duration::from_millis(700);

/// A reading that took longer than this (the thread lost its CPU inside it) is not dated
/// sharply enough to keep.
const SHARP: Duration = Duration::from_micros(500);

/// One reading of an interface's receive counters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Sample {
    /// When, in seconds from the meter's start (the middle of the read).
    pub(crate) at_s: f64,
    /// Bytes received, link-layer header included (what tbf counts on the other end).
    pub(crate) bytes: u64,
    /// Packets received.
    pub(crate) packets: u64,
}

/// Reads `dev`'s receive counters in a namespace on a thread until finished or dropped: every
/// [`FAST`] until the data phase starts (the count rises past the first reading by more than the
/// edge), every [`SLOW`] in its middle, and every [`FAST`] again from [`END_MARGIN`] before its
/// expected end. The counters are read through a `sleep` started in the namespace, which dies
/// with the meter.
pub(crate) struct RxMeter {
    _anchor: Daemon,
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<Vec<Sample>>>,
}

impl RxMeter {
    /// Starts reading `dev` in namespace `ns` now, for a data phase that is expected to last
    /// about `data` and is found with `edge_bytes` (see [`Flow::from_samples`]). Stops by itself
    /// after `limit`.
    pub(crate) fn start(
        ns: &str,
        dev: &str,
        data: Duration,
        edge_bytes: u64,
        limit: Duration,
    ) -> RxMeter {
        // `ip netns exec` execs its command, so the pid is sleep's, and sleep is in `ns`.
        let anchor = Daemon::spawn(command_in(Some(ns), "sleep").arg("3600"));
        let path = format!("/proc/{}/net/dev", anchor.pid());
        // The anchor is in the namespace once its counters show the interface.
        let ready = Instant::now();
        while read_dev(&path, dev).is_none() {
            assert!(
                ready.elapsed() < Duration::from_secs(5),
                "{path} never listed {dev} (namespace {ns})"
            );
            thread::sleep(Duration::from_millis(5));
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let dev = dev.to_owned();
        let handle = thread::spawn(move || {
            let started = Instant::now();
            let mut samples: Vec<Sample> = Vec::with_capacity(4096);
            // When the data phase started (the first reading past the edge) and when to read
            // fast again.
            let mut fast_again: Option<Instant> = None;
            while !flag.load(Ordering::Relaxed) && started.elapsed() < limit {
                let before = Instant::now();
                let read = read_dev(&path, &dev);
                let took = before.elapsed();
                if let (Some((bytes, packets)), true) = (read, took < SHARP) {
                    let at_s = (before + took / 2 - started).as_secs_f64();
                    samples.push(Sample {
                        at_s,
                        bytes,
                        packets,
                    });
                    let first = samples[0].bytes;
                    if fast_again.is_none() && bytes > first.saturating_add(edge_bytes) {
                        fast_again = Some(before + data.saturating_sub(END_MARGIN));
                    }
                }
                // Fast until the start is seen (the reading before it and the one that saw it
                // bound it), slow in the middle, fast from shortly before the expected end.
                let period = match fast_again {
                    None => FAST,
                    Some(at) => match at.saturating_duration_since(Instant::now()) {
                        left if left.is_zero() => FAST,
                        left => SLOW.min(left),
                    },
                };
                thread::sleep(period);
            }
            samples
        });
        RxMeter {
            _anchor: anchor,
            stop,
            handle: Some(handle),
        }
    }

    /// Stops reading; the readings so far.
    pub(crate) fn finish(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        self.handle
            .take()
            .and_then(|h| h.join().ok())
            .unwrap_or_default()
    }
}

impl Drop for RxMeter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(handle) = self.handle.take() {
            let _ = handle.join();
        }
    }
}

/// Runs `run`, a transfer of about `data` into `dev` in namespace `ns`, while an [`RxMeter`]
/// reads the counters (for at most a minute): what `run` returned, and the data phase the
/// readings show ([`Flow::from_samples`] with [`EDGE_BYTES`]), or, when they show none, what
/// they were.
pub(crate) fn metered<T>(
    ns: &str,
    dev: &str,
    data: Duration,
    run: impl FnOnce() -> T,
) -> (T, Result<Flow, String>) {
    let meter = RxMeter::start(ns, dev, data, EDGE_BYTES, Duration::from_secs(60));
    let out = run();
    let samples = meter.finish();
    let flow = Flow::from_samples(&samples, EDGE_BYTES).ok_or_else(|| {
        format!(
            "no data phase in {dev}'s {} counter readings (first {:?}, last {:?})",
            samples.len(),
            samples.first(),
            samples.last()
        )
    });
    (out, flow)
}

/// `dev`'s received bytes and packets from a `/proc/.../net/dev` file.
fn read_dev(path: &str, dev: &str) -> Option<(u64, u64)> {
    parse_dev(&std::fs::read_to_string(path).ok()?, dev)
}

/// `dev`'s received bytes and packets from the text of `/proc/net/dev`
/// (`  veth-b: 1234 56 0 0 ...`: the first two numbers after the colon).
pub(crate) fn parse_dev(text: &str, dev: &str) -> Option<(u64, u64)> {
    text.lines().find_map(|line| {
        let (name, counters) = line.split_once(':')?;
        if name.trim() != dev {
            return None;
        }
        let mut fields = counters.split_whitespace().map(str::parse::<u64>);
        Some((fields.next()?.ok()?, fields.next()?.ok()?))
    })
}

/// What crossed between two readings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Span {
    /// Seconds between the readings.
    pub(crate) seconds: f64,
    /// Bytes received, link-layer headers included.
    pub(crate) bytes: u64,
    /// Packets received.
    pub(crate) packets: u64,
}

impl Span {
    /// The link-layer rate, bits per second.
    pub(crate) fn l2_bps(&self) -> f64 {
        #[allow(clippy::cast_precision_loss)] // byte counts of a test are far below 2^52
        let bytes = self.bytes as f64;
        bytes * 8.0 / self.seconds
    }

    /// The share of the bytes that is payload, with `overhead` bytes of headers per packet.
    pub(crate) fn payload_share(&self, overhead: f64) -> f64 {
        #[allow(clippy::cast_precision_loss)] // byte counts of a test are far below 2^52
        let (bytes, packets) = (self.bytes as f64, self.packets as f64);
        (bytes - packets * overhead) / bytes
    }
}

/// The data phase of a run, from its counter readings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) struct Flow {
    /// Bytes received from the first reading to the last (all of the run's traffic on the
    /// interface: the data and the few control messages around it).
    pub(crate) bytes: u64,
    /// Packets received over the same span.
    pub(crate) packets: u64,
    /// Between these two readings (seconds) the count first passed the first reading's by more
    /// than the edge: the data phase began there.
    pub(crate) start_s: (f64, f64),
    /// Between these two readings the count came within the edge of the last reading's: the data
    /// phase ended there.
    pub(crate) end_s: (f64, f64),
    /// How many readings it was found in.
    pub(crate) readings: usize,
    /// The steady middle (from 1 s after the data phase started to 1 s before it ended); `None`
    /// when the phase was too short (under 4 s) to have one.
    pub(crate) steady: Option<Span>,
}

impl Flow {
    /// Finds the data phase: where the count rose past the first reading by more than
    /// `edge_bytes`, to where it came within `edge_bytes` of the last. With an edge above the
    /// control messages on either side of the data (a few kilobytes) and a few dozen frames at
    /// most, either end of the phase is found within the time the link takes to carry the edge
    /// (about a millisecond at 100 Mbit/s), on top of the readings' spacing that the bounds
    /// state. `None` when the readings show no data phase.
    pub(crate) fn from_samples(samples: &[Sample], edge_bytes: u64) -> Option<Flow> {
        let (first, last) = (samples.first()?, samples.last()?);
        let rose = first.bytes.checked_add(edge_bytes)?;
        let done = last.bytes.checked_sub(edge_bytes)?;
        if rose >= done {
            return None;
        }
        // Both positions are past the first reading, which is below `rose`.
        let began = samples.iter().position(|s| s.bytes > rose)?;
        let ended = samples.iter().position(|s| s.bytes >= done)?;
        let start_s = (samples[began - 1].at_s, samples[began].at_s);
        let end_s = (samples[ended - 1].at_s, samples[ended].at_s);
        let steady = {
            let from = samples.iter().find(|s| s.at_s >= start_s.1 + 1.0);
            let to = samples.iter().rev().find(|s| s.at_s <= end_s.0 - 1.0);
            from.zip(to).and_then(|(from, to)| {
                let seconds = to.at_s - from.at_s;
                (seconds >= 2.0).then(|| Span {
                    seconds,
                    bytes: to.bytes - from.bytes,
                    packets: to.packets - from.packets,
                })
            })
        };
        Some(Flow {
            bytes: last.bytes - first.bytes,
            packets: last.packets - first.packets,
            start_s,
            end_s,
            readings: samples.len(),
            steady,
        })
    }

    /// The payload that crossed, bits: every byte less `overhead` per packet (the link-layer,
    /// network and transport headers). Includes the control messages' payload, a few kilobytes.
    pub(crate) fn payload_bits(&self, overhead: f64) -> f64 {
        #[allow(clippy::cast_precision_loss)] // byte counts of a test are far below 2^52
        let payload = self.bytes as f64 - self.packets as f64 * overhead;
        payload * 8.0
    }

    /// The data phase's length, seconds: the least and the most the readings allow.
    pub(crate) fn seconds(&self) -> (f64, f64) {
        (self.end_s.0 - self.start_s.1, self.end_s.1 - self.start_s.0)
    }

    /// The goodput of the data phase, bits per second: the least and the most the readings
    /// allow (the payload over the longest and over the shortest phase).
    pub(crate) fn goodput_bps(&self, overhead: f64) -> (f64, f64) {
        let (shortest, longest) = self.seconds();
        let bits = self.payload_bits(overhead);
        (bits / longest, bits / shortest)
    }

    /// Whether a goodput reading of `bps` agrees with this flow: within `tolerance` (a fraction)
    /// of [`Flow::goodput_bps`]'s bounds. The error says by how much it does not.
    pub(crate) fn check_goodput(
        &self,
        bps: f64,
        overhead: f64,
        tolerance: f64,
    ) -> Result<(), String> {
        let (low, high) = self.goodput_bps(overhead);
        if bps >= low * (1.0 - tolerance) && bps <= high * (1.0 + tolerance) {
            return Ok(());
        }
        let off = if bps < low {
            bps / low - 1.0
        } else {
            bps / high - 1.0
        };
        Err(format!(
            "{:.3} Mbit/s, but the receiving interface took in {:.3} to {:.3} Mbit/s of payload \
             over the data phase ({:+.3}%, tolerance {}%)",
            bps / 1e6,
            low / 1e6,
            high / 1e6,
            off * 100.0,
            tolerance * 100.0
        ))
    }
}
