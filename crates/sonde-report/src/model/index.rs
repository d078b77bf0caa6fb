//! What a results store finds and lists a run by: [`RunIndex`], from
//! [`ResultKind::index`](super::ResultKind::index).

use super::meta::{Labels, Meta, Protocol};

/// A run as a results store indexes it.
#[derive(Debug, Clone, PartialEq)]
pub struct RunIndex<'a> {
    /// When it started, ms since the Unix epoch.
    pub time_unix_ms: u64,
    /// The document's `test` tag.
    pub test: &'static str,
    /// Its transport.
    pub protocol: Protocol,
    /// The server as the client reached it.
    pub server: &'a str,
    /// Its `--label`s.
    pub labels: &'a Labels,
    /// Stopped before its time (Ctrl-C, SIGTERM).
    pub interrupted: bool,
    /// Its headline figures.
    pub headline: HeadlineFigures,
}

impl<'a> RunIndex<'a> {
    /// The index of the single run `meta` describes: a `test` over `protocol` with `headline`.
    pub fn of(
        meta: &'a Meta,
        test: &'static str,
        protocol: Protocol,
        headline: HeadlineFigures,
    ) -> Self {
        Self {
            time_unix_ms: meta.timestamp_unix_ms,
            test,
            protocol,
            server: &meta.server,
            labels: &meta.labels,
            interrupted: meta.interrupted,
            headline,
        }
    }
}

/// A run's headline figures, `None` where its kind has no such figure.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct HeadlineFigures {
    /// Mean round-trip time, ns (`None` without samples).
    pub rtt_mean_ns: Option<f64>,
    /// Median round-trip time, ns.
    pub rtt_p50_ns: Option<u64>,
    /// 99th percentile round-trip time, ns.
    pub rtt_p99_ns: Option<u64>,
    /// 99.99th percentile round-trip time, ns.
    pub rtt_p9999_ns: Option<u64>,
    /// Throughput counted at the receiver, bits per second.
    pub bits_per_second: Option<f64>,
    /// Packets per second received.
    pub packets_per_second: Option<f64>,
    /// Connections (transactions) per second.
    pub connections_per_second: Option<f64>,
    /// Loss, percent of sent.
    pub loss_percent: Option<f64>,
}
