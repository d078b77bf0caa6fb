//! Comparing runs: `sonde compare A B` (every figure the runs have, A against B, with the change
//! and whether it is significant) and the matrix view `sonde compare --by LABEL` (one row per
//! value of a label). Pure: the runs come in, a model comes out, and [`crate::render`] turns it
//! into a table ([`crate::render::compare_table`], [`crate::render::matrix_table`]) or JSON.
//!
//! Compare knows the figures ([`Figure`]: their names, units and which way is better), not the
//! kinds: each kind says how compare reads it, in its own `kinds/<kind>.rs`
//! ([`ResultKind::compared`](crate::ResultKind::compared): its [`Kind`], the figures it offers
//! and its tables' columns; [`ResultKind::figure`](crate::ResultKind::figure): its value of each).
//!
//! A side's figure is the median of its runs' values, and the significance is the Mann-Whitney U
//! test of side A's runs against side B's ([`sonde_engine::compare`]): at least five runs a side
//! (`--repeat 5`), else the change is shown and marked as needing more runs. A percentile a run's
//! sample count cannot support is `n/a`, as in the test output; what can be used instead (the
//! value and the few samples beyond it, or the maximum, from the stored histograms when there
//! are any) and the run length that would support it come beside it as a [`Thin`].
//!
//! ```
//! use sonde_report::compare::{compare, Run};
//! # let latency = |mean: f64| -> sonde_report::TestResult { serde_json::from_str(&format!(r#"{{
//! #   "test": "latency", "sonde_version": "0.1.0", "timestamp_unix_ms": 1714564800000,
//! #   "server": "192.0.2.10:5300", "session": 7, "overlapping_sessions": 0, "warnings": [],
//! #   "protocol": "tcp", "mode": "closed_loop", "rate_per_second": null, "msg_size_bytes": 64,
//! #   "duration_ns": 2000000000, "warmup_ns": 0, "warmup_samples": 0, "sent": 5000, "samples": 5000,
//! #   "rtt_ns": {{ "min": 31000, "mean": {mean}, "stddev": 4310.7, "p50": 38911, "p90": 44031,
//! #               "p99": 57343, "p999": null, "p9999": null, "p99999": null, "max": 120000 }},
//! #   "lost": 0, "lost_outbound": null, "lost_return": null, "duplicated": 0, "reordered": 0,
//! #   "late_sends": null }}"#)).unwrap() };
//! let a: Vec<Run> = [40e3, 41e3, 39e3, 40.5e3, 39.5e3].map(|m| Run::new("a", latency(m))).into();
//! let b: Vec<Run> = [50e3, 51e3, 49e3, 50.5e3, 49.5e3].map(|m| Run::new("b", latency(m))).into();
//! let c = compare(&a, &b, 0.05).unwrap();
//! let mean = c.rows.iter().find(|r| r.figure.name() == "rtt_mean_ns").unwrap();
//! assert_eq!(mean.change_percent.map(f64::round), Some(25.0));
//! assert!(mean.worse && mean.significance.is_significant());
//! ```

use std::collections::BTreeMap;

use serde::Serialize;
use sonde_engine::compare::{
    duration_needed_ns, median, percentile_reading, significance, PercentileReading, Significance,
};
use sonde_engine::rtt::RttRecorder;

use crate::model::{RttRun, TestResult};

/// One run as compare and the report see it.
#[derive(Debug, Clone)]
pub struct Run {
    /// How the user names it: a store id (`17`) or a file path.
    pub id: String,
    /// Its labels (`path=private`).
    pub labels: BTreeMap<String, String>,
    /// The document.
    pub result: TestResult,
    /// For a latency run, its RTT histogram when it was stored (not in the JSON document).
    pub rtt: Option<RttRecorder>,
    /// For a latency run with intervals and `--full-log`, its log's samples binned over time
    /// (`Err`: why the file could not be read), as the caller read them.
    pub full_log: Option<Result<crate::samples::SampleBins, String>>,
}

impl Run {
    /// A run with the labels its document carries (`--label`) and no histogram.
    pub fn new(id: impl Into<String>, result: TestResult) -> Self {
        let labels = result.kind().labels().cloned().unwrap_or_default();
        Self {
            id: id.into(),
            labels,
            result,
            rtt: None,
            full_log: None,
        }
    }

    /// The kind of test it is, as compare groups runs; `None` for a kind compare does not read.
    pub fn kind(&self) -> Option<Kind> {
        self.result.kind().compared()
    }
}

/// A kind of test compare reads figures from, as the kind itself says
/// ([`ResultKind::compared`](crate::ResultKind::compared), in its `kinds/<kind>.rs`): its name,
/// the figures it offers and in which order, the columns of its matrix and case tables. Two
/// kinds are the same when their names are; in JSON a kind is its name (`"latency"`).
#[derive(Debug, Clone, Copy)]
pub struct Kind {
    /// Where its tables come among the kinds' in a matrix or a report (latency's first).
    pub(crate) rank: u8,
    /// The test's name: `latency`.
    pub(crate) name: &'static str,
    /// The heading of its case table in the HTML report.
    pub(crate) cases_title: &'static str,
    /// Every figure a run of it can have, in the order of compare's rows.
    pub(crate) figures: &'static [Figure],
    /// The columns of the matrix view (`--by`).
    pub(crate) matrix: &'static [Figure],
    /// The columns of the report's case table.
    pub(crate) cases: &'static [Figure],
}

impl Kind {
    /// The test's name: `latency`.
    pub fn name(self) -> &'static str {
        self.name
    }

    /// The heading of its case table: `Latency cases`.
    pub fn cases_title(self) -> &'static str {
        self.cases_title
    }

    /// Whether its figures are round-trip times (the report charts their distribution).
    pub fn is_rtt(self) -> bool {
        self.figures.iter().any(|f| f.is_rtt())
    }

    fn key(self) -> (u8, &'static str) {
        (self.rank, self.name)
    }
}

impl PartialEq for Kind {
    fn eq(&self, other: &Self) -> bool {
        self.key() == other.key()
    }
}

impl Eq for Kind {}

impl PartialOrd for Kind {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Kind {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key().cmp(&other.key())
    }
}

impl Serialize for Kind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name)
    }
}

/// A figure compare reads from a run. Its JSON name carries the unit (`rtt_p99_ns`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Figure {
    /// Mean RTT, ns.
    RttMean,
    /// Median RTT, ns.
    RttP50,
    /// 99th percentile RTT, ns.
    RttP99,
    /// 99.9th percentile RTT, ns.
    RttP999,
    /// 99.99th percentile RTT, ns.
    RttP9999,
    /// Largest RTT, ns.
    RttMax,
    /// Receiver throughput, bit/s.
    Throughput,
    /// Packets per second received.
    Pps,
    /// Loss, percent of sent.
    Loss,
    /// Connections (transactions) per second.
    ConnectionsPerSecond,
    /// Request/response transactions per second (`sonde latency -P`/`--depth`).
    TransactionsPerSecond,
}

/// Which way a figure gets worse.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    /// RTT, loss: higher is worse.
    Lower,
    /// Throughput, pps, connections/s: lower is worse.
    Higher,
}

impl Figure {
    /// The name in JSON, with its unit.
    pub fn name(self) -> &'static str {
        match self {
            Self::RttMean => "rtt_mean_ns",
            Self::RttP50 => "rtt_p50_ns",
            Self::RttP99 => "rtt_p99_ns",
            Self::RttP999 => "rtt_p999_ns",
            Self::RttP9999 => "rtt_p9999_ns",
            Self::RttMax => "rtt_max_ns",
            Self::Throughput => "bits_per_second",
            Self::Pps => "packets_per_second",
            Self::Loss => "loss_percent",
            Self::ConnectionsPerSecond => "connections_per_second",
            Self::TransactionsPerSecond => "transactions_per_second",
        }
    }

    /// The name in a table: `RTT p99.99`.
    pub fn title(self) -> &'static str {
        match self {
            Self::RttMean => "RTT mean",
            Self::RttP50 => "RTT p50",
            Self::RttP99 => "RTT p99",
            Self::RttP999 => "RTT p99.9",
            Self::RttP9999 => "RTT p99.99",
            Self::RttMax => "RTT max",
            Self::Throughput => "throughput",
            Self::Pps => "packets/s",
            Self::Loss => "loss",
            Self::ConnectionsPerSecond => "connections/s",
            Self::TransactionsPerSecond => "transactions/s",
        }
    }

    /// Which way is better.
    pub fn better(self) -> Better {
        match self {
            Self::Throughput
            | Self::Pps
            | Self::ConnectionsPerSecond
            | Self::TransactionsPerSecond => Better::Higher,
            _ => Better::Lower,
        }
    }

    /// The percentile, for the RTT percentiles.
    pub fn percentile(self) -> Option<f64> {
        match self {
            Self::RttP50 => Some(50.0),
            Self::RttP99 => Some(99.0),
            Self::RttP999 => Some(99.9),
            Self::RttP9999 => Some(99.99),
            _ => None,
        }
    }

    /// Whether the figure is an RTT in ns.
    pub fn is_rtt(self) -> bool {
        matches!(
            self,
            Self::RttMean
                | Self::RttP50
                | Self::RttP99
                | Self::RttP999
                | Self::RttP9999
                | Self::RttMax
        )
    }
}

impl Serialize for Figure {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

/// A run's value of a figure ([`ResultKind::figure`](crate::ResultKind::figure)): `Absent`
/// when the run does not have the figure at all (TCP has no loss), `Unsupported` when it has it
/// but the sample count cannot state it (`n/a`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Value {
    /// The run does not have the figure.
    Absent,
    /// The run has it, but its samples cannot state it (`n/a`).
    Unsupported,
    /// The value, in the figure's unit.
    Known(f64),
}

impl Value {
    /// A count the run states (`Some`) or cannot state (`None`: `n/a`).
    pub fn stated(v: Option<u64>) -> Self {
        v.map_or(Self::Unsupported, |v| Self::Known(v as f64))
    }
}

/// What compare could not do.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A side has no runs.
    #[error("side {0} has no runs")]
    Empty(&'static str),
    /// A run is of a kind compare does not read (quick, load, sweep, conf).
    #[error("run {id} is a {test} result; compare reads latency, throughput, pps and crr runs")]
    Unsupported {
        /// The run.
        id: String,
        /// Its test.
        test: String,
    },
    /// The runs are not all of one kind.
    #[error("run {id} is a {found} run, the others are {expected} runs: compare like with like")]
    Mixed {
        /// The odd run.
        id: String,
        /// Its kind.
        found: &'static str,
        /// The first run's kind.
        expected: &'static str,
    },
}

/// The one kind all `runs` share.
fn common_kind<'a>(runs: impl IntoIterator<Item = &'a Run>) -> Result<Option<Kind>, Error> {
    let mut kind = None;
    for run in runs {
        let k = run.kind().ok_or_else(|| Error::Unsupported {
            id: run.id.clone(),
            test: run.result.test_name().to_owned(),
        })?;
        match kind {
            None => kind = Some(k),
            Some(first) if first != k => {
                return Err(Error::Mixed {
                    id: run.id.clone(),
                    found: k.name(),
                    expected: first.name(),
                })
            }
            Some(_) => {}
        }
    }
    Ok(kind)
}

/// What to read for a percentile that the sample count cannot support.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Thin {
    /// The percentile.
    pub percentile: f64,
    /// Samples the side has (summed over its runs).
    pub samples: u64,
    /// The samples the percentile needs (`10 / (1 - p)`).
    pub samples_needed: u64,
    /// What the samples do show.
    pub reading: ThinReading,
    /// How long one run at the rate these runs took samples would have to be to support the
    /// percentile, ns.
    pub run_needed_ns: Option<u64>,
}

/// The honest substitute for an unsupported percentile.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ThinReading {
    /// The percentile's value, resting on `beyond` samples above it (fewer than ten).
    Thin {
        /// ns.
        value_ns: u64,
        /// Samples above it.
        beyond: u64,
    },
    /// The largest sample (not the percentile).
    Max {
        /// ns.
        value_ns: u64,
    },
    /// The percentile of the case's runs' samples taken together (their stored histograms
    /// merged): enough samples for it, though no single run had them.
    Pooled {
        /// ns.
        value_ns: u64,
        /// Runs pooled.
        runs: usize,
    },
}

impl ThinReading {
    /// The value, ns.
    pub fn value_ns(self) -> u64 {
        match self {
            Self::Thin { value_ns, .. }
            | Self::Max { value_ns }
            | Self::Pooled { value_ns, .. } => value_ns,
        }
    }
}

/// The thin reading of `pct` over `runs` (latency runs): from their histograms pooled when every
/// run has one (the percentile of them all when together they support it, else the value with
/// the few samples beyond it), else the largest of their maxima.
fn thin(runs: &[&Run], pct: f64) -> Option<Thin> {
    let latencies: Vec<RttRun<'_>> = runs.iter().filter_map(|r| r.result.kind().rtt()).collect();
    if latencies.is_empty() {
        return None;
    }
    let samples: u64 = latencies.iter().map(|l| l.samples).sum();
    // The rate of one run: samples over measured time, per run.
    let duration_ns: u64 = latencies.iter().map(|l| l.measured_ns).sum();
    let samples_needed = sonde_engine::rtt::min_samples(pct)?;
    let max_ns = latencies.iter().map(|l| l.rtt_ns.max).max().unwrap_or(0);
    let reading = if runs.iter().all(|r| r.rtt.is_some()) {
        let mut pooled = RttRecorder::new(0);
        for r in runs {
            if let Some(h) = &r.rtt {
                pooled.merge(h);
            }
        }
        match percentile_reading(&pooled, pct) {
            PercentileReading::Thin { value_ns, beyond } => ThinReading::Thin { value_ns, beyond },
            // Runs pooled can support what no single run did.
            PercentileReading::Supported { value_ns } if runs.len() > 1 => ThinReading::Pooled {
                value_ns,
                runs: runs.len(),
            },
            // The documents' maximum is the largest sample as measured (the histogram's is
            // the top of its bucket).
            PercentileReading::Max { .. }
            | PercentileReading::Supported { .. }
            | PercentileReading::Empty => ThinReading::Max { value_ns: max_ns },
        }
    } else {
        ThinReading::Max { value_ns: max_ns }
    };
    Some(Thin {
        percentile: pct,
        samples,
        samples_needed,
        reading,
        run_needed_ns: duration_needed_ns(pct, samples, duration_ns),
    })
}

/// How sure compare is about a change.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Verdict {
    /// The U test says the sides differ (p < alpha).
    Significant {
        /// p-value.
        p_value: f64,
    },
    /// The U test cannot tell them apart (`~`).
    NotSignificant {
        /// p-value.
        p_value: f64,
    },
    /// Fewer than five runs on a side: significance needs `--repeat`.
    NeedsRepeat {
        /// Runs on side A.
        runs_a: usize,
        /// Runs on side B.
        runs_b: usize,
    },
    /// A side has no value (`n/a`): nothing to test.
    Untested,
}

impl Verdict {
    /// Whether the change is significant.
    pub fn is_significant(self) -> bool {
        matches!(self, Self::Significant { .. })
    }
}

/// One figure, A against B.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Row {
    /// The figure (its JSON name carries the unit).
    pub figure: Figure,
    /// Which way is better.
    pub better: Better,
    /// Side A: the median of its runs' values; `None` when a run cannot state it (`n/a`).
    pub a: Option<f64>,
    /// Side B, likewise.
    pub b: Option<f64>,
    /// Each run's value on side A (in the order given), for the test and for the reader.
    pub a_runs: Vec<Option<f64>>,
    /// Side B's runs.
    pub b_runs: Vec<Option<f64>>,
    /// (B - A) / A in percent; `None` when a side is `n/a` or A is 0.
    pub change_percent: Option<f64>,
    /// B is worse than A (higher RTT or loss, lower throughput, pps or connections/s).
    pub worse: bool,
    /// Whether the change is significant.
    pub significance: Verdict,
    /// For an `n/a` percentile, what side A's samples do show.
    pub a_thin: Option<Thin>,
    /// Side B's.
    pub b_thin: Option<Thin>,
}

/// One side of a comparison.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Side {
    /// What the user named (`label:path=private`, a run id, a file).
    pub name: String,
    /// The runs' ids.
    pub runs: Vec<String>,
}

/// `sonde compare A B`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Comparison {
    /// The test both sides ran.
    pub test: Kind,
    /// The significance level of the U test.
    pub alpha: f64,
    /// Side A.
    pub a: Side,
    /// Side B.
    pub b: Side,
    /// Every figure the runs have.
    pub rows: Vec<Row>,
}

impl Comparison {
    /// Names the sides (`A`, `B` by default).
    #[must_use]
    pub fn named(mut self, a: impl Into<String>, b: impl Into<String>) -> Self {
        self.a.name = a.into();
        self.b.name = b.into();
        self
    }

    /// The figures by which B is worse than A by more than `pct` percent, and not shown to be
    /// noise: a change the U test calls not significant (`~`) does not count; one with too few
    /// runs to test does, since nothing says it is noise. A loss from 0 to anything counts as
    /// infinitely worse. `n/a` figures do not count.
    pub fn worse_than(&self, pct: f64) -> Vec<&Row> {
        self.rows
            .iter()
            .filter(|r| r.worse && !matches!(r.significance, Verdict::NotSignificant { .. }))
            .filter(|r| match r.change_percent {
                Some(c) => c.abs() > pct,
                None => r.a == Some(0.0) && r.b.is_some_and(|b| b > 0.0),
            })
            .collect()
    }
}

/// The values of `figure` over `runs`, in order.
fn values(runs: &[&Run], figure: Figure) -> Vec<Value> {
    runs.iter()
        .map(|r| r.result.kind().figure(figure))
        .collect()
}

/// The side's value: the median when every run states it.
fn side_value(values: &[Value]) -> (Option<f64>, Vec<Option<f64>>, bool) {
    let per_run: Vec<Option<f64>> = values
        .iter()
        .map(|v| match v {
            Value::Known(x) => Some(*x),
            _ => None,
        })
        .collect();
    let all: Option<Vec<f64>> = per_run.iter().copied().collect();
    let unsupported = values.contains(&Value::Unsupported);
    (all.and_then(|v| median(&v)), per_run, unsupported)
}

/// `sonde compare A B`: every figure the runs have, A against B, at significance level `alpha`.
pub fn compare(a: &[Run], b: &[Run], alpha: f64) -> Result<Comparison, Error> {
    if a.is_empty() {
        return Err(Error::Empty("A"));
    }
    if b.is_empty() {
        return Err(Error::Empty("B"));
    }
    let kind = common_kind(a.iter().chain(b))?.ok_or(Error::Empty("A"))?;
    let (ra, rb): (Vec<&Run>, Vec<&Run>) = (a.iter().collect(), b.iter().collect());
    // The figures in the order the first run has them; one that no run has is left out.
    let mut rows = Vec::new();
    for &figure in kind.figures {
        let (va, vb) = (values(&ra, figure), values(&rb, figure));
        if va.iter().chain(&vb).all(|v| *v == Value::Absent) {
            continue;
        }
        let (a_value, a_runs, a_unsupported) = side_value(&va);
        let (b_value, b_runs, b_unsupported) = side_value(&vb);
        let change_percent = match (a_value, b_value) {
            (Some(x), Some(y)) if x != 0.0 => Some((y - x) / x * 100.0),
            _ => None,
        };
        let worse = match (a_value, b_value) {
            (Some(x), Some(y)) => match figure.better() {
                Better::Lower => y > x,
                Better::Higher => y < x,
            },
            _ => false,
        };
        let significance = match (&a_runs, &b_runs) {
            _ if a_value.is_none() || b_value.is_none() => Verdict::Untested,
            _ => {
                let xs: Vec<f64> = a_runs.iter().flatten().copied().collect();
                let ys: Vec<f64> = b_runs.iter().flatten().copied().collect();
                match significance(&xs, &ys, alpha) {
                    Significance::Significant { p_value } => Verdict::Significant { p_value },
                    Significance::NotSignificant { p_value } => Verdict::NotSignificant { p_value },
                    Significance::TooFewRuns { runs_a, runs_b } => {
                        Verdict::NeedsRepeat { runs_a, runs_b }
                    }
                }
            }
        };
        let thin_of = |runs: &[&Run], unsupported: bool| {
            figure
                .percentile()
                .filter(|_| unsupported)
                .and_then(|p| thin(runs, p))
        };
        rows.push(Row {
            figure,
            better: figure.better(),
            a: a_value,
            b: b_value,
            a_runs,
            b_runs,
            change_percent,
            worse,
            significance,
            a_thin: thin_of(&ra, a_unsupported),
            b_thin: thin_of(&rb, b_unsupported),
        });
    }
    let side = |name: &str, runs: &[Run]| Side {
        name: name.to_owned(),
        runs: runs.iter().map(|r| r.id.clone()).collect(),
    };
    Ok(Comparison {
        test: kind,
        alpha,
        a: side("A", a),
        b: side("B", b),
        rows,
    })
}

/// One cell of a matrix or case table: the median over the case's runs, or for an unsupported
/// percentile what its samples do show.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Cell {
    /// The value; `None` when a run cannot state it (`n/a`) or does not have it.
    pub value: Option<f64>,
    /// For an `n/a` percentile, what to read instead.
    pub thin: Option<Thin>,
}

/// The runs of one case (one value of a label, or one set of labels) summarized.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CaseRow {
    /// The label value (matrix) or the labels joined (`path=private zone=other`).
    pub name: String,
    /// The case's labels.
    pub labels: BTreeMap<String, String>,
    /// The runs' ids.
    pub runs: Vec<String>,
    /// RTT samples over all its runs (latency).
    pub samples: Option<u64>,
    /// One cell per column of the table.
    pub cells: Vec<Cell>,
}

/// A table of cases of one kind of test: the matrix view, or the report's case table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CaseTable {
    /// The test.
    pub test: Kind,
    /// The label whose values make the rows (`--by`), if any.
    pub by: Option<String>,
    /// The columns.
    pub columns: Vec<Figure>,
    /// One row per case.
    pub rows: Vec<CaseRow>,
}

fn case_row(
    name: String,
    labels: BTreeMap<String, String>,
    runs: &[&Run],
    columns: &[Figure],
) -> CaseRow {
    let cells = columns
        .iter()
        .map(|&figure| {
            let vals = values(runs, figure);
            let (value, _, unsupported) = side_value(&vals);
            Cell {
                value,
                thin: figure
                    .percentile()
                    .filter(|_| unsupported)
                    .and_then(|p| thin(runs, p)),
            }
        })
        .collect();
    let samples = runs
        .iter()
        .map(|r| r.result.kind().rtt().map(|rtt| rtt.samples))
        .sum::<Option<u64>>();
    CaseRow {
        name,
        labels,
        runs: runs.iter().map(|r| r.id.clone()).collect(),
        samples,
        cells,
    }
}

/// `sonde compare --by LABEL`: one table per kind of test among `runs`, one row per value of
/// `label` (in order of the value), runs without the label left out.
pub fn matrix(runs: &[Run], label: &str) -> Result<Vec<CaseTable>, Error> {
    let mut groups: BTreeMap<(Kind, String), Vec<&Run>> = BTreeMap::new();
    for run in runs {
        let Some(value) = run.labels.get(label) else {
            continue;
        };
        let kind = run.kind().ok_or_else(|| Error::Unsupported {
            id: run.id.clone(),
            test: run.result.test_name().to_owned(),
        })?;
        groups.entry((kind, value.clone())).or_default().push(run);
    }
    Ok(tables(groups, Some(label)))
}

/// The report's case tables: one table per kind of test, one row per distinct set of labels
/// (runs without labels are each their own case, named by id). Runs of other kinds are left out.
pub fn cases(runs: &[Run]) -> Vec<CaseTable> {
    let mut groups: BTreeMap<(Kind, String), Vec<&Run>> = BTreeMap::new();
    for run in runs {
        let Some(kind) = run.kind() else { continue };
        let name = if run.labels.is_empty() {
            format!("run {}", run.id)
        } else {
            run.labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        groups.entry((kind, name)).or_default().push(run);
    }
    tables(groups, None)
}

fn tables(groups: BTreeMap<(Kind, String), Vec<&Run>>, by: Option<&str>) -> Vec<CaseTable> {
    let mut out: Vec<CaseTable> = Vec::new();
    for ((kind, name), runs) in groups {
        let columns = if by.is_some() {
            kind.matrix
        } else {
            kind.cases
        }
        .to_vec();
        let labels = if by.is_some() {
            BTreeMap::new()
        } else {
            runs[0].labels.clone()
        };
        let row = case_row(name, labels, &runs, &columns);
        match out.iter_mut().find(|t| t.test == kind) {
            Some(t) => t.rows.push(row),
            None => out.push(CaseTable {
                test: kind,
                by: by.map(str::to_owned),
                columns,
                rows: vec![row],
            }),
        }
    }
    // Leave out the columns no run of the kind has (the loss of TCP throughput).
    for t in &mut out {
        let keep: Vec<bool> = (0..t.columns.len())
            .map(|i| {
                t.rows
                    .iter()
                    .any(|r| r.cells[i].value.is_some() || r.cells[i].thin.is_some())
            })
            .collect();
        let mut i = 0;
        t.columns.retain(|_| {
            i += 1;
            keep[i - 1]
        });
        for r in &mut t.rows {
            let mut i = 0;
            r.cells.retain(|_| {
                i += 1;
                keep[i - 1]
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fixtures;
    use crate::model::{LatencyResult, Protocol};

    fn latency(f: impl Fn(&mut LatencyResult)) -> TestResult {
        let TestResult::Latency(mut l) = fixtures::latency_tcp() else {
            unreachable!()
        };
        f(&mut l);
        TestResult::Latency(l)
    }

    fn runs(id: &str, means: &[f64]) -> Vec<Run> {
        means
            .iter()
            .enumerate()
            .map(|(i, &m)| Run::new(format!("{id}{i}"), latency(|l| l.rtt_ns.mean = m)))
            .collect()
    }

    fn row(c: &Comparison, f: Figure) -> &Row {
        c.rows.iter().find(|r| r.figure == f).unwrap()
    }

    #[test]
    fn repeats_of_the_same_case_are_not_significant_and_do_not_fail() {
        let a = runs("a", &[40_100.0, 39_900.0, 40_300.0, 39_800.0, 40_000.0]);
        let b = runs("b", &[40_050.0, 40_250.0, 39_850.0, 39_950.0, 40_150.0]);
        let c = compare(&a, &b, 0.05).unwrap();
        let mean = row(&c, Figure::RttMean);
        assert!(matches!(mean.significance, Verdict::NotSignificant { .. }));
        assert!(c
            .worse_than(0.0)
            .iter()
            .all(|r| r.figure != Figure::RttMean));
        // Identical percentiles in every run: p = 1, not significant either.
        assert!(matches!(
            row(&c, Figure::RttP50).significance,
            Verdict::NotSignificant { p_value } if p_value == 1.0
        ));
    }

    #[test]
    fn a_slower_side_is_significantly_worse() {
        let a = runs("a", &[40_100.0, 39_900.0, 40_300.0, 39_800.0, 40_000.0]);
        let b = runs("b", &[48_100.0, 47_900.0, 48_300.0, 47_800.0, 48_000.0]);
        let c = compare(&a, &b, 0.05).unwrap();
        let mean = row(&c, Figure::RttMean);
        assert_eq!(mean.a, Some(40_000.0));
        assert_eq!(mean.b, Some(48_000.0));
        assert_eq!(mean.change_percent, Some(20.0));
        assert!(mean.worse && mean.significance.is_significant());
        let worse = c.worse_than(10.0);
        assert_eq!(worse.len(), 1);
        assert_eq!(worse[0].figure, Figure::RttMean);
        assert!(c.worse_than(25.0).is_empty());
        // The other way round it is better, not worse.
        let c = compare(&b, &a, 0.05).unwrap();
        assert!(!row(&c, Figure::RttMean).worse);
        assert!(c.worse_than(0.0).is_empty());
    }

    #[test]
    fn one_run_a_side_shows_the_change_and_asks_for_repeats() {
        let a = runs("a", &[40_000.0]);
        let b = runs("b", &[50_000.0]);
        let c = compare(&a, &b, 0.05).unwrap();
        let mean = row(&c, Figure::RttMean);
        assert_eq!(mean.change_percent, Some(25.0));
        assert_eq!(
            mean.significance,
            Verdict::NeedsRepeat {
                runs_a: 1,
                runs_b: 1
            }
        );
        // Nothing says it is noise, so a CI gate fails on it.
        assert_eq!(c.worse_than(20.0).len(), 1);
    }

    #[test]
    fn throughput_worse_is_lower() {
        let a = vec![Run::new("a", fixtures::throughput_tcp_2_streams())];
        let TestResult::Throughput(mut t) = fixtures::throughput_tcp_2_streams() else {
            unreachable!()
        };
        t.receiver.bits_per_second *= 0.5;
        let b = vec![Run::new("b", TestResult::Throughput(t))];
        let c = compare(&a, &b, 0.05).unwrap();
        let figs: Vec<Figure> = c.rows.iter().map(|r| r.figure).collect();
        assert_eq!(figs, [Figure::Throughput]); // TCP: no pps, no loss
        let r = &c.rows[0];
        assert_eq!(r.change_percent, Some(-50.0));
        assert!(r.worse);
        assert_eq!(c.worse_than(49.0).len(), 1);
    }

    #[test]
    fn loss_from_zero_is_worse_at_any_threshold() {
        let zero = latency(|l| {
            l.protocol = Protocol::Udp;
            l.lost = 0;
        });
        let some = latency(|l| {
            l.protocol = Protocol::Udp;
            l.lost = 3;
        });
        let c = compare(&[Run::new("a", zero)], &[Run::new("b", some)], 0.05).unwrap();
        let loss = row(&c, Figure::Loss);
        assert_eq!(loss.change_percent, None);
        assert!(loss.worse);
        assert_eq!(c.worse_than(1000.0).len(), 1);
    }

    #[test]
    fn unsupported_percentiles_are_na_with_what_can_be_used() {
        // 7,000 samples over 10 s: p99.9 and p99.99 cannot be stated.
        let thin_run = |id: &str, with_histogram: bool| {
            let mut run = Run::new(
                id,
                latency(|l| {
                    l.samples = 7_000;
                    l.duration_ns = 11_000_000_000;
                    l.warmup_ns = 1_000_000_000;
                    l.rtt_ns.p999 = None;
                    l.rtt_ns.p9999 = None;
                    l.rtt_ns.max = 7_000_000;
                }),
            );
            if with_histogram {
                let mut h = RttRecorder::new(0);
                for i in 1..=7_000u64 {
                    h.record(0, i * 1_000);
                }
                run.rtt = Some(h);
            }
            run
        };
        let c = compare(&[thin_run("a", true)], &[thin_run("b", false)], 0.05).unwrap();
        let p999 = row(&c, Figure::RttP999);
        assert_eq!((p999.a, p999.b, p999.change_percent), (None, None, None));
        assert_eq!(p999.significance, Verdict::Untested);
        let a = p999.a_thin.unwrap();
        assert_eq!((a.samples, a.samples_needed), (7_000, 10_000));
        // 10,000 samples at 700/s: 14.29 s.
        assert_eq!(a.run_needed_ns, Some(14_285_714_286));
        match a.reading {
            ThinReading::Thin { value_ns, beyond } => {
                assert_eq!(beyond, 7);
                assert!(value_ns.abs_diff(6_993_000) < 7_000, "{value_ns}");
            }
            other => panic!("{other:?}"),
        }
        // Without the histogram only the maximum is known, and it is called that.
        assert_eq!(
            p999.b_thin.unwrap().reading,
            ThinReading::Max {
                value_ns: 7_000_000
            }
        );
        // p99.99 has no sample beyond it even with the histogram.
        let p9999 = row(&c, Figure::RttP9999).a_thin.unwrap();
        assert!(matches!(p9999.reading, ThinReading::Max { .. }));
        // p99 is stated: no substitute.
        assert!(row(&c, Figure::RttP99).a_thin.is_none());
        // A CI gate ignores what cannot be stated.
        assert!(c.worse_than(0.0).is_empty());
    }

    #[test]
    fn runs_pooled_can_support_what_no_run_did() {
        // Five runs of 7,000 samples: no run supports p99.9 (10,000), the 35,000 together do.
        let five: Vec<Run> = (0..5)
            .map(|i| {
                let mut run = Run::new(
                    format!("r{i}"),
                    latency(|l| {
                        l.samples = 7_000;
                        l.rtt_ns.p999 = None;
                        l.rtt_ns.p9999 = None;
                    }),
                );
                let mut h = RttRecorder::new(0);
                for v in 1..=7_000u64 {
                    h.record(0, v * 1_000);
                }
                run.rtt = Some(h);
                run
            })
            .collect();
        let c = compare(&five, &five, 0.05).unwrap();
        let p999 = row(&c, Figure::RttP999);
        assert_eq!(p999.a, None);
        match p999.a_thin.unwrap().reading {
            ThinReading::Pooled { value_ns, runs } => {
                assert_eq!(runs, 5);
                // Each value 5 times: the 34,965th of 35,000 is 6,993 µs.
                assert!(value_ns.abs_diff(6_993_000) < 7_000, "{value_ns}");
            }
            other => panic!("{other:?}"),
        }
        // p99.99 needs 100,000: pooled, 3 samples lie beyond it.
        assert!(matches!(
            row(&c, Figure::RttP9999).a_thin.unwrap().reading,
            ThinReading::Thin { beyond: 3, .. }
        ));
    }

    #[test]
    fn mixed_and_unsupported_runs_are_refused() {
        let lat = Run::new("1", fixtures::latency_tcp());
        let tp = Run::new("2", fixtures::throughput_tcp_2_streams());
        let quick = Run::new("3", fixtures::quick_all());
        assert!(matches!(
            compare(std::slice::from_ref(&lat), &[tp], 0.05),
            Err(Error::Mixed { .. })
        ));
        assert!(matches!(
            compare(std::slice::from_ref(&lat), &[quick], 0.05),
            Err(Error::Unsupported { .. })
        ));
        assert_eq!(compare(&[], &[lat], 0.05), Err(Error::Empty("A")));
    }

    #[test]
    fn matrix_has_one_row_per_label_value() {
        let mut all = Vec::new();
        for (path, mean) in [
            ("public", 60_000.0),
            ("private", 40_000.0),
            ("lb", 90_000.0),
        ] {
            for (i, r) in runs(path, &[mean, mean + 1_000.0]).into_iter().enumerate() {
                let mut r = r;
                r.labels.insert("path".into(), path.into());
                r.labels.insert("zone".into(), format!("z{i}"));
                all.push(r);
            }
        }
        all.push(Run::new("nolabel", fixtures::latency_tcp()));
        let tables = matrix(&all, "path").unwrap();
        assert_eq!(tables.len(), 1);
        let t = &tables[0];
        let names: Vec<&str> = t.rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["lb", "private", "public"]);
        assert_eq!(t.rows[1].cells[0].value, Some(40_500.0)); // the median of two
        assert_eq!(t.rows[1].samples, Some(500_000));
        assert_eq!(t.rows[1].runs, ["private0", "private1"]);
    }
}
