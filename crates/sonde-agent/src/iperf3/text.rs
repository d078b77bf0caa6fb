//! The server output a client asks for with `--get-server-output`: what the agent measured, in
//! the layout of an iperf3 server's report (one line per stream per second, then the totals the
//! agent sent in its results), carried to the client inside the results JSON.

use std::fmt::Write as _;
use std::net::SocketAddr;

use sonde_wire::iperf3::Results;

/// Per-second lines per stream only up to this many streams; above it only the sums, which
/// keeps the text small at iperf3's 128-stream maximum.
const MAX_STREAM_LINES: usize = 8;
const SEPARATOR: &str = "- - - - - - - - - - - - - - - - - - - - - - - - -";

/// Per-stream byte counts at one interval boundary, for the server output. It lives here, with
/// the report that reads it, so that `run` (which takes the samples) depends on `text` and not
/// the other way round.
pub(super) struct Sample {
    pub(super) at_ns: u64,
    pub(super) bytes: Vec<u64>,
}

/// One stream as the report shows it.
pub(super) struct StreamInfo {
    pub(super) id: u32,
    pub(super) peer: SocketAddr,
    pub(super) server_sends: bool,
}

/// Everything the report shows.
pub(super) struct Report<'a> {
    /// The client's control connection.
    pub(super) peer: SocketAddr,
    /// The listener's address.
    pub(super) local: SocketAddr,
    pub(super) udp: bool,
    pub(super) bidir: bool,
    pub(super) omit_ns: u64,
    /// The client's TEST_END, ns on the test clock.
    pub(super) end_ns: u64,
    pub(super) streams: &'a [StreamInfo],
    /// Byte counters at each second.
    pub(super) samples: &'a [Sample],
    /// Byte counters at the end.
    pub(super) finals: &'a [u64],
    /// The totals sent to the client.
    pub(super) results: &'a Results,
}

/// The report text.
pub(super) fn report(r: &Report<'_>) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Accepted connection from {}, port {}",
        r.peer.ip(),
        r.peer.port()
    );
    for s in r.streams {
        let _ = writeln!(
            out,
            "[{:>3}] local {} port {} connected to {} port {}",
            s.id,
            r.local.ip(),
            r.local.port(),
            s.peer.ip(),
            s.peer.port()
        );
    }
    intervals(r, &mut out);
    let _ = writeln!(out, "{SEPARATOR}");
    totals(r, &mut out);
    out
}

fn header(r: &Report<'_>, out: &mut String) {
    let _ = writeln!(
        out,
        "[ ID]{} Interval           Transfer     Bitrate",
        pad(r)
    );
}

fn pad(r: &Report<'_>) -> &'static str {
    if r.bidir {
        "      "
    } else {
        ""
    }
}

/// `[TX-S]`/`[RX-S]` for bidirectional tests, as iperf3's server marks its streams.
fn role(r: &Report<'_>, server_sends: bool) -> &'static str {
    match (r.bidir, server_sends) {
        (false, _) => "",
        (true, true) => "[TX-S]",
        (true, false) => "[RX-S]",
    }
}

/// One line a second per stream (or only sums with many streams), the last one partial.
fn intervals(r: &Report<'_>, out: &mut String) {
    header(r, out);
    let n = r.streams.len();
    let mut prev_ns = 0u64;
    let mut prev = vec![0u64; n];
    let end = Sample {
        at_ns: r.end_ns,
        bytes: r.finals.to_vec(),
    };
    // The last second's partial interval, when it is long enough to say anything.
    let last = r
        .samples
        .last()
        .map_or(0, |s| s.at_ns)
        .saturating_add(10_000_000);
    let tail = (r.end_ns > last).then_some(&end);
    for sample in r.samples.iter().chain(tail) {
        if sample.bytes.len() != n || sample.at_ns <= prev_ns {
            continue;
        }
        let (a, b) = (secs(prev_ns), secs(sample.at_ns));
        let omitted = if sample.at_ns <= r.omit_ns {
            "  (omitted)"
        } else {
            ""
        };
        let delta = |i: usize| sample.bytes[i].saturating_sub(prev[i]);
        if n <= MAX_STREAM_LINES {
            for (i, s) in r.streams.iter().enumerate() {
                let id = format!("[{:>3}]", s.id);
                line(out, &id, role(r, s.server_sends), a, b, delta(i), omitted);
            }
        }
        if n > 1 {
            for sends in directions(r) {
                let sum = (0..n)
                    .filter(|&i| !r.bidir || r.streams[i].server_sends == sends)
                    .map(delta)
                    .sum();
                line(out, "[SUM]", role(r, sends), a, b, sum, omitted);
            }
        }
        prev_ns = sample.at_ns;
        prev.clone_from(&sample.bytes);
    }
}

/// The directions a sum line is printed for: both for bidir, else one.
fn directions(r: &Report<'_>) -> Vec<bool> {
    if r.bidir {
        vec![false, true]
    } else {
        vec![r.streams.first().is_some_and(|s| s.server_sends)]
    }
}

fn line(out: &mut String, id: &str, role: &str, a: f64, b: f64, bytes: u64, suffix: &str) {
    let _ = writeln!(
        out,
        "{id}{role} {a:>6.2}-{b:<6.2} sec  {}  {}{suffix}",
        bytes_unit(bytes),
        rate_unit(bytes, b - a)
    );
}

/// The totals the agent reported, per stream and summed, labelled sender or receiver.
fn totals(r: &Report<'_>, out: &mut String) {
    if r.udp {
        let _ = writeln!(
            out,
            "[ ID]{} Interval           Transfer     Bitrate         Jitter    Lost/Total Datagrams",
            pad(r)
        );
    } else {
        header(r, out);
    }
    let n = r.streams.len();
    for (s, res) in r.streams.iter().zip(&r.results.streams) {
        let id = format!("[{:>3}]", s.id);
        let (jitter, errors, packets) = (res.jitter, res.errors, res.packets);
        total_line(
            r,
            out,
            &id,
            s.server_sends,
            res.bytes,
            res.end_time,
            (jitter, errors, packets),
        );
    }
    if n > 1 {
        for sends in directions(r) {
            let picked = r
                .streams
                .iter()
                .zip(&r.results.streams)
                .filter(|(s, _)| !r.bidir || s.server_sends == sends);
            let (mut bytes, mut errors, mut packets, mut jitter, mut count) = (0, 0, 0, 0.0, 0);
            let mut time = 0.0f64;
            for (_, res) in picked {
                bytes += res.bytes;
                errors += res.errors;
                packets += res.packets;
                jitter += res.jitter;
                count += 1;
                time = time.max(res.end_time);
            }
            let jitter = if count > 0 {
                jitter / f64::from(count)
            } else {
                0.0
            };
            total_line(
                r,
                out,
                "[SUM]",
                sends,
                bytes,
                time,
                (jitter, errors, packets),
            );
        }
    }
}

fn total_line(
    r: &Report<'_>,
    out: &mut String,
    id: &str,
    server_sends: bool,
    bytes: u64,
    seconds: f64,
    (jitter, errors, packets): (f64, i64, i64),
) {
    let label = if server_sends { "sender" } else { "receiver" };
    let _ = write!(
        out,
        "{id}{} {:>6.2}-{seconds:<6.2} sec  {}  {}",
        role(r, server_sends),
        0.0,
        bytes_unit(bytes),
        rate_unit(bytes, seconds)
    );
    if r.udp && !server_sends {
        let lost = if packets > 0 {
            errors as f64 * 100.0 / packets as f64
        } else {
            0.0
        };
        let _ = write!(
            out,
            "  {:.3} ms  {errors}/{packets} ({})",
            jitter * 1e3,
            percent(lost)
        );
    } else if r.udp {
        let _ = write!(out, "  {:.3} ms  0/{packets} (0%)", 0.0);
    }
    let _ = writeln!(out, "  {label}");
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn percent(p: f64) -> String {
    if p == 0.0 {
        "0%".into()
    } else if p < 10.0 {
        format!("{p:.2}%")
    } else {
        format!("{p:.1}%")
    }
}

/// iperf3's adaptive units: 1024-based for bytes ("112 MBytes").
fn bytes_unit(bytes: u64) -> String {
    unit(bytes as f64, 1024.0, "Bytes")
}

/// 1000-based for bit rates ("941 Mbits/sec").
fn rate_unit(bytes: u64, seconds: f64) -> String {
    let bps = if seconds > 0.0 {
        bytes as f64 * 8.0 / seconds
    } else {
        0.0
    };
    unit(bps, 1000.0, "bits/sec")
}

/// Three significant figures, as iperf3's `unit_snprintf` prints them.
fn unit(mut v: f64, base: f64, suffix: &str) -> String {
    const PREFIX: [&str; 5] = ["", "K", "M", "G", "T"];
    let mut i = 0;
    while v >= base && i + 1 < PREFIX.len() {
        v /= base;
        i += 1;
    }
    let num = if v < 9.995 {
        format!("{v:4.2}")
    } else if v < 99.95 {
        format!("{v:4.1}")
    } else {
        format!("{v:4.0}")
    };
    format!("{num} {}{suffix}", PREFIX[i])
}

#[cfg(test)]
mod tests {
    use super::*;
    use sonde_wire::iperf3::StreamResults;

    #[test]
    fn units_are_iperf3s() {
        assert_eq!(bytes_unit(117_440_512), " 112 MBytes");
        assert_eq!(rate_unit(117_625_000, 1.0), " 941 Mbits/sec");
        assert_eq!(bytes_unit(1_310_720), "1.25 MBytes");
        assert_eq!(rate_unit(1_250_000, 1.0), "10.0 Mbits/sec");
        assert_eq!(bytes_unit(0), "0.00 Bytes");
        assert_eq!(rate_unit(5, 0.0), "0.00 bits/sec");
    }

    #[test]
    fn report_shows_every_stream_and_the_totals() {
        let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:5201".parse().unwrap();
        let streams = [
            StreamInfo {
                id: 1,
                peer: "127.0.0.1:40001".parse().unwrap(),
                server_sends: false,
            },
            StreamInfo {
                id: 3,
                peer: "127.0.0.1:40002".parse().unwrap(),
                server_sends: true,
            },
        ];
        let results = Results {
            streams: vec![
                StreamResults {
                    id: 1,
                    bytes: 1_250_000,
                    packets: 1000,
                    errors: 10,
                    jitter: 0.000_5,
                    end_time: 1.5,
                    ..StreamResults::default()
                },
                StreamResults {
                    id: 3,
                    bytes: 2_500_000,
                    packets: 2000,
                    end_time: 1.5,
                    ..StreamResults::default()
                },
            ],
            ..Results::default()
        };
        let samples = [Sample {
            at_ns: 1_000_000_000,
            bytes: vec![800_000, 1_600_000],
        }];
        let text = report(&Report {
            peer,
            local,
            udp: true,
            bidir: true,
            omit_ns: 0,
            end_ns: 1_500_000_000,
            streams: &streams,
            samples: &samples,
            finals: &[1_250_000, 2_500_000],
            results: &results,
        });
        assert!(text.starts_with("Accepted connection from 127.0.0.1, port 40000\n"));
        assert!(text.contains("[  3] local 127.0.0.1 port 5201 connected to 127.0.0.1 port 40002"));
        assert!(text.contains("[  1][RX-S]   0.00-1.00   sec"), "{text}");
        assert!(text.contains("[  1][RX-S]   1.00-1.50   sec"), "{text}");
        assert!(text.contains("[SUM][TX-S]   0.00-1.00   sec"), "{text}");
        assert!(
            text.contains("[  1][RX-S]   0.00-1.50   sec  1.19 MBytes  6.67 Mbits/sec  0.500 ms  10/1000 (1.00%)  receiver"),
            "{text}"
        );
        assert!(text.contains("[  3][TX-S]   0.00-1.50   sec"), "{text}");
        assert!(text.contains("sender\n"), "{text}");
    }
}
