//! `sonde report`: one self-contained HTML file. The styles, the script that draws the charts
//! as SVG (`assets/report.js`, no library) and the data are all inline, so the file opens
//! offline and requests nothing from any network.
//!
//! What it shows: the case tables (one row per case, named by the labels that tell the cases
//! apart, with its mean, p50, p99, p99.99, max and samples; throughput, pps and crr cases in
//! tables of their own; units in the headers; sortable), a bar chart of the mean and p99.99 of
//! each latency case laid out by the labels ([`Axes`]: a category axis, series side by side,
//! panels), the RTT distribution of each case as a percentile plot (from the stored histograms
//! when there are any, else from the documents' percentiles), RTT over time per latency run
//! made with `-i` (each interval's p50 and p99 over its min-to-max band, a gap where the
//! interval cannot support a percentile), throughput over time per run
//! (each stream and the total, from the intervals), each helper's share of a `--from` run (the
//! text table's columns), the compare view when two selections are given, both ends' host
//! configuration, and every warning. Each chart downloads as PNG or SVG and each table as CSV,
//! made in the page; a print stylesheet lays it out for paper.
//!
//! The first inline script records any script error, failed resource or `console.error` in the
//! page's `data-errors` attribute; the drawing script sets `data-ready="1"` when every chart is
//! drawn. The browser test reads both from the DOM.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde_json::{json, Value};
use sonde_engine::rtt::{percentile_supported, RttRecorder};

use super::axes::{Axes, Layout};
use super::compare::fmt_figure;
use super::table::helpers::{self as shares, Shares};
use super::units::{
    fmt_count, fmt_count_f64, fmt_ns, fmt_timestamp, ns_number, TimeUnit, Unit, RATE,
};
use crate::compare::{cases, CaseTable, Cell, Comparison, Figure, Run, ThinReading, Verdict};
use crate::model::{Helpers, Meta, TestResult};

const REPORT_JS: &str = include_str!("../../assets/report.js");
pub(super) const REPORT_CSS: &str = include_str!("../../assets/report.css");

/// Runs first, before anything else can fail: every error, failed resource and console.error
/// goes into `data-errors` (a count) and `data-error-messages` on the document element.
pub(super) const ERROR_TRAP_JS: &str = r#"(function () {
  var root = document.documentElement, messages = [];
  root.setAttribute("data-errors", "0");
  function record(m) {
    messages.push(String(m));
    root.setAttribute("data-errors", String(messages.length));
    root.setAttribute("data-error-messages", messages.join(" | "));
  }
  window.addEventListener("error", function (e) {
    var t = e.target;
    record(e.message || (t && (t.src || t.href)) || "error");
  }, true);
  window.addEventListener("unhandledrejection", function (e) { record("unhandled rejection: " + e.reason); });
  var consoleError = console.error;
  console.error = function () {
    record(Array.prototype.join.call(arguments, " "));
    return consoleError.apply(console, arguments);
  };
})();"#;

/// The most throughput runs drawn over time (each chart holds every stream of its run).
const MAX_THROUGHPUT_CHARTS: usize = 24;

/// What goes into a report.
#[derive(Debug, Clone, Copy)]
pub struct Report<'a> {
    /// The heading and the page title.
    pub title: &'a str,
    /// When the report was made, ms since the Unix epoch (the caller reads the clock).
    pub generated_unix_ms: u64,
    /// The runs.
    pub runs: &'a [Run],
    /// The compare view, when two selections were given.
    pub comparison: Option<&'a Comparison>,
    /// Which label keys the latency chart puts on its category axis and as its series
    /// (automatic where `None`).
    pub layout: Layout<'a>,
}

/// The report as one HTML document.
pub fn html(report: &Report<'_>) -> String {
    let tables = cases(report.runs);
    let mut body = String::new();
    let _ = writeln!(body, "<h1>{}</h1>", esc(report.title));
    let _ = writeln!(
        body,
        "<p class=\"sub\">{} run{}, report made {} by sonde {}</p>",
        report.runs.len(),
        if report.runs.len() == 1 { "" } else { "s" },
        fmt_timestamp(report.generated_unix_ms),
        env!("CARGO_PKG_VERSION")
    );
    if report.runs.is_empty() {
        body.push_str("<p>No runs were selected.</p>\n");
    }

    // The cases, each table in the order of its axes.
    let axes: Vec<Axes> = tables
        .iter()
        .map(|t| Axes::of(&t.rows, report.runs, report.layout))
        .collect();
    for (t, a) in tables.iter().zip(&axes) {
        case_table_html(&mut body, t, a);
    }

    // Charts.
    let latency = tables.iter().zip(&axes).find(|(t, _)| t.test.is_rtt());
    let mut data = serde_json::Map::new();
    if let Some((t, axes)) = latency {
        body.push_str("<h2>Mean and p99.99 RTT per case</h2>\n");
        body.push_str(
            "<p class=\"note\">Each case's mean and p99.99 side by side. Where a run's samples \
             cannot support p99.99 (fewer than 100,000) the light bar shows what the table shows \
             instead: the largest sample, a value resting on fewer than ten samples beyond it, or \
             the p99.99 of the case's runs pooled; never one run's p99.99.</p>\n",
        );
        body.push_str(
            "<div class=\"chart\" data-chart=\"latency-bars\" \
             data-title=\"Mean and p99.99 RTT per case\"></div>\n",
        );
        data.insert("latency_bars".into(), latency_bars(t, axes));
        body.push_str("<h2>RTT distribution</h2>\n");
        body.push_str(
            "<p class=\"note\">The RTT at each percentile, both axes on a log scale, cases \
             overlaid. A curve ends where fewer than ten samples lie beyond the percentile. \
             Cases whose runs were stored with their histograms are drawn from them; the \
             others from the percentiles their documents state (the dots).</p>\n",
        );
        body.push_str(
            "<div class=\"chart\" data-chart=\"rtt-distribution\" \
             data-title=\"RTT distribution\"></div>\n",
        );
        data.insert(
            "distribution".into(),
            distribution(
                report.runs,
                axes.sort(&t.rows)
                    .into_iter()
                    .map(|r| (r.name.as_str(), axes.name(r))),
            ),
        );
        let over_time = rtt_over_time(report.runs);
        rtt_over_time_html(&mut body, &over_time);
        data.insert(
            "rtt_time".into(),
            Value::Array(over_time.charts.into_iter().map(|(_, v, _)| v).collect()),
        );
    }
    let throughput = throughput_series(report.runs);
    if !throughput.is_empty() {
        body.push_str("<h2>Throughput over time</h2>\n");
        body.push_str(
            "<p class=\"note\">Per interval, counted at the receiver: each stream and the \
             total.</p>\n",
        );
        for (i, (title, _)) in throughput.iter().enumerate() {
            let _ = writeln!(
                body,
                "<h3>{t}</h3>\n<div class=\"chart\" data-chart=\"throughput\" data-index=\"{i}\" \
                 data-title=\"Throughput, {t}\"></div>",
                t = esc(title)
            );
        }
    }
    data.insert(
        "throughput".into(),
        Value::Array(throughput.into_iter().map(|(_, v)| v).collect()),
    );

    helpers_html(&mut body, report.runs);
    if let Some(c) = report.comparison {
        compare_html(&mut body, c);
    }
    hosts_html(&mut body, report.runs);
    warnings_html(&mut body, report.runs);

    // `<` only ever occurs inside JSON strings, where \u003c means the same; so the data
    // cannot close its script element.
    let data = Value::Object(data).to_string().replace('<', "\\u003c");
    let mut out = String::with_capacity(body.len() + REPORT_JS.len() + data.len() + 4096);
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    let _ = writeln!(out, "<title>{}</title>", esc(report.title));
    let _ = writeln!(out, "<script>{ERROR_TRAP_JS}</script>");
    let _ = writeln!(out, "<style>{REPORT_CSS}</style>");
    out.push_str("</head>\n<body>\n");
    out.push_str(&body);
    let _ = writeln!(
        out,
        "<script type=\"application/json\" id=\"sonde-data\">{data}</script>"
    );
    let _ = writeln!(out, "<script>{REPORT_JS}</script>");
    out.push_str("</body>\n</html>\n");
    out
}

/// HTML-escapes text.
pub(super) fn esc(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn short(f: Figure) -> &'static str {
    match f {
        Figure::RttMean => "mean",
        Figure::RttP50 => "p50",
        Figure::RttP99 => "p99",
        Figure::RttP999 => "p99.9",
        Figure::RttP9999 => "p99.99",
        Figure::RttMax => "max",
        other => other.title(),
    }
}

fn rtt_unit(t: &CaseTable) -> TimeUnit {
    let smallest = t
        .rows
        .iter()
        .flat_map(|r| r.cells.iter().zip(&t.columns))
        .filter(|(_, f)| f.is_rtt())
        .filter_map(|(c, _)| c.value)
        .fold(f64::INFINITY, f64::min);
    TimeUnit::for_typical(smallest)
}

/// The unit a column of a case table states its figures in (said in its header, so that the
/// cells are numbers a spreadsheet reads).
#[derive(Debug, Clone, Copy)]
enum ColumnUnit {
    Time(TimeUnit),
    Rate(Unit),
    PerSecond,
    Percent,
}

impl ColumnUnit {
    fn of(t: &CaseTable, i: usize, f: Figure, time: TimeUnit) -> Self {
        match f {
            _ if f.is_rtt() => Self::Time(time),
            Figure::Throughput => {
                let largest = t
                    .rows
                    .iter()
                    .filter_map(|r| r.cells.get(i)?.value)
                    .fold(0.0, f64::max);
                Self::Rate(Unit::for_largest(&RATE, largest))
            }
            Figure::Loss => Self::Percent,
            _ => Self::PerSecond,
        }
    }

    /// The header: `mean (µs)`, `throughput (Mbit/s)`, `loss (%)`, `packets/s`.
    fn header(self, f: Figure) -> String {
        match self {
            Self::Time(u) => format!("{} ({})", short(f), u.suffix()),
            Self::Rate(u) => format!("{} ({})", short(f), u.name()),
            Self::Percent => format!("{} (%)", short(f)),
            Self::PerSecond => short(f).to_owned(),
        }
    }

    fn number(self, f: Figure, v: f64) -> String {
        match self {
            Self::Time(u) => ns_number(v, u),
            Self::Rate(u) => u.number(v),
            Self::Percent => fmt_figure(f, v, TimeUnit::Micros)
                .trim_end_matches('%')
                .to_owned(),
            Self::PerSecond => fmt_count_f64(v),
        }
    }
}

fn case_table_html(out: &mut String, t: &CaseTable, axes: &Axes) {
    let unit = rtt_unit(t);
    let _ = writeln!(out, "<h2>{}</h2>", t.test.cases_title());
    if !axes.shared.is_empty() {
        let shared: Vec<String> = axes
            .shared
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let _ = writeln!(
            out,
            "<p class=\"note\">Every case: {}.</p>",
            esc(&shared.join(" "))
        );
    }
    let has_samples = t.rows.iter().any(|r| r.samples.is_some());
    let units: Vec<ColumnUnit> = t
        .columns
        .iter()
        .enumerate()
        .map(|(i, &f)| ColumnUnit::of(t, i, f, unit))
        .collect();
    let _ = write!(
        out,
        "<table data-table=\"cases-{}\" class=\"sortable\">\n<thead><tr><th class=\"l\">case</th><th>runs</th>",
        t.test.name()
    );
    for (f, u) in t.columns.iter().zip(&units) {
        let _ = write!(out, "<th>{}</th>", esc(&u.header(*f)));
    }
    if has_samples {
        out.push_str("<th>samples</th>");
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for r in axes.sort(&t.rows) {
        let labels = r
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        let _ = write!(
            out,
            "<tr data-case=\"{}\"><td class=\"l\" title=\"{}\">{}</td><td title=\"runs {}\">{}</td>",
            esc(&r.name),
            esc(if labels.is_empty() { &r.name } else { &labels }),
            esc(&axes.name(r)),
            esc(&r.runs.join(", ")),
            r.runs.len()
        );
        for ((cell, &f), u) in r.cells.iter().zip(&t.columns).zip(&units) {
            out.push_str(&cell_html(cell, f, *u));
        }
        if has_samples {
            let _ = write!(
                out,
                "<td>{}</td>",
                r.samples.map_or_else(String::new, fmt_count)
            );
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table>\n");
    if t.test.is_rtt() {
        out.push_str(
            "<p class=\"note\">Each figure is the median over the case's runs. A percentile is \
             stated only with at least 10 / (1 - p) samples (p99.99 needs 100,000). Where a case \
             has fewer, the cell says what its samples do show, in red: <b>max</b> is the largest \
             sample (not the percentile), <b>~V (k beyond)</b> a value resting on only k samples \
             above it, <b>(n runs pooled)</b> the percentile of the case's runs' samples taken \
             together; hover for the run length that would support the percentile.</p>\n",
        );
    }
}

fn cell_html(cell: &Cell, f: Figure, column: ColumnUnit) -> String {
    let unit = match column {
        ColumnUnit::Time(u) => u,
        _ => TimeUnit::Micros,
    };
    match (cell.value, cell.thin) {
        (Some(v), _) => format!("<td>{}</td>", esc(&column.number(f, v))),
        (None, Some(t)) => {
            let needed = t.run_needed_ns.map_or_else(String::new, |ns| {
                format!(
                    "; a run of {:.0} s at this sample rate would support it",
                    ns as f64 / 1e9
                )
            });
            let title = format!(
                "{} needs {} samples, the case has {}{needed}",
                f.title(),
                fmt_count(t.samples_needed),
                fmt_count(t.samples)
            );
            let text = match t.reading {
                ThinReading::Max { value_ns } => {
                    format!("max {}", ns_number(value_ns as f64, unit))
                }
                ThinReading::Thin { value_ns, beyond } => {
                    format!("~{} ({beyond} beyond)", ns_number(value_ns as f64, unit))
                }
                ThinReading::Pooled { value_ns, runs } => {
                    format!("{} ({runs} runs pooled)", ns_number(value_ns as f64, unit))
                }
            };
            format!(
                "<td class=\"thin\" title=\"{}\">{}</td>",
                esc(&title),
                esc(&text)
            )
        }
        (None, None) => "<td>n/a</td>".to_owned(),
    }
}

/// µs, for the charts.
fn to_us(ns: f64) -> f64 {
    ns / 1e3
}

/// The bar chart's data, laid out by the axes: panels, each a list of groups (the category
/// axis's values), each with one bar per case (the series' values). RTTs in µs.
fn latency_bars(t: &CaseTable, axes: &Axes) -> Value {
    let col = |f: Figure| t.columns.iter().position(|c| *c == f);
    let (mean, p9999) = (col(Figure::RttMean), col(Figure::RttP9999));
    let cell =
        |r: &crate::compare::CaseRow, i: Option<usize>| i.and_then(|i| r.cells.get(i).copied());
    // (panel, its groups: (category, its bars)).
    type Groups = Vec<(String, Vec<Value>)>;
    let mut panels: Vec<(String, Groups)> = Vec::new();
    for r in axes.sort(&t.rows) {
        let panel: Vec<String> = axes
            .panels
            .iter()
            .map(|k| format!("{k}={}", Axes::value(r, k)))
            .collect();
        let panel = panel.join(" ");
        let group = axes
            .x
            .as_deref()
            .map_or_else(|| axes.name(r), |k| Axes::value(r, k));
        let series = axes.series.as_deref().map(|k| Axes::value(r, k));
        let bar = json!({
            "case": axes.name(r),
            "series": series,
            "mean_us": cell(r, mean).and_then(|c| c.value).map(to_us),
            "p9999_us": cell(r, p9999).and_then(|c| c.value).map(to_us),
            "substitute_us": cell(r, p9999)
                .and_then(|c| c.thin)
                .map(|t| to_us(t.reading.value_ns() as f64)),
            // What the stand-in is, as the table says it.
            "substitute": cell(r, p9999).and_then(|c| c.thin).map(|t| match t.reading {
                ThinReading::Max { .. } => "max".to_owned(),
                ThinReading::Thin { beyond, .. } => format!("{beyond} beyond"),
                ThinReading::Pooled { runs, .. } => format!("{runs} runs pooled"),
            }),
        });
        if panels.last().is_none_or(|(p, _)| *p != panel) {
            panels.push((panel, Vec::new()));
        }
        let groups = &mut panels.last_mut().expect("pushed above").1;
        match groups.last_mut() {
            Some((g, bars)) if *g == group => bars.push(bar),
            _ => groups.push((group, vec![bar])),
        }
    }
    let series_values: Vec<String> = match axes.series.as_deref() {
        Some(k) => {
            let mut v: Vec<String> = Vec::new();
            for r in axes.sort(&t.rows) {
                let value = Axes::value(r, k);
                if !v.contains(&value) {
                    v.push(value);
                }
            }
            v
        }
        None => Vec::new(),
    };
    let panels: Vec<Value> = panels
        .into_iter()
        .map(|(title, groups)| {
            let groups: Vec<Value> = groups
                .into_iter()
                .map(|(label, bars)| json!({ "label": label, "bars": bars }))
                .collect();
            json!({ "title": title, "groups": groups })
        })
        .collect();
    json!({
        "x": axes.x,
        "series": axes.series,
        "series_values": series_values,
        "panels": panels,
    })
}

/// The percentile plot's x values: 1 / (1 - p), a tenth of a decade apart, plus p50 (x = 2).
fn grid(decades: u32) -> Vec<f64> {
    let mut x: Vec<f64> = (0..=decades * 10)
        .map(|k| 10f64.powf(f64::from(k) / 10.0))
        .collect();
    x.push(2.0);
    x.sort_by(f64::total_cmp);
    x
}

fn pct_of(x: f64) -> f64 {
    100.0 - 100.0 / x
}

/// The RTT distribution of each latency case, on one grid.
/// `cases`: each case's name in the case table (its labels joined) and the name it is shown by.
fn distribution<'a>(runs: &[Run], cases: impl Iterator<Item = (&'a str, String)>) -> Value {
    // The same grouping as the case table: by labels, or by id without labels.
    let mut groups: BTreeMap<String, Vec<&Run>> = BTreeMap::new();
    for run in runs {
        if run.result.kind().rtt().is_none() {
            continue;
        }
        let name = if run.labels.is_empty() {
            format!("run {}", run.id)
        } else {
            run.labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(" ")
        };
        groups.entry(name).or_default().push(run);
    }
    // Per case: a pooled histogram when every run has one, else the documents' percentiles.
    let mut curves: Vec<(String, Curve)> = Vec::new();
    for (key, name) in cases {
        let Some(runs) = groups.get(key) else {
            continue;
        };
        if runs.iter().all(|r| r.rtt.is_some()) {
            let mut pooled = RttRecorder::new(0);
            for r in runs {
                if let Some(h) = &r.rtt {
                    pooled.merge(h);
                }
            }
            curves.push((name, Curve::Pooled(pooled)));
        } else {
            // The median over the runs of each percentile every run states.
            let mut points = Vec::new();
            for (x, get) in DOC_PERCENTILES {
                let vals: Option<Vec<f64>> = runs
                    .iter()
                    .map(|r| {
                        let rtt = r.result.kind().rtt()?;
                        get(rtt.rtt_ns).map(|v| v as f64)
                    })
                    .collect();
                if let Some(m) = vals.and_then(|v| sonde_engine::compare::median(&v)) {
                    points.push((x, to_us(m)));
                }
            }
            curves.push((name, Curve::Stated(points)));
        }
    }
    let decades = curves
        .iter()
        .map(|(_, c)| match c {
            Curve::Pooled(h) => {
                // Largest d with 10^d * 10 samples: p = 1 - 10^-d supported.
                let mut d = 0;
                while d < 9 && h.samples() >= 10u64.pow(d + 2) {
                    d += 1;
                }
                d
            }
            Curve::Stated(points) => points
                .iter()
                .map(|(x, _)| x.log10().round() as u32)
                .max()
                .unwrap_or(1),
        })
        .max()
        .unwrap_or(1)
        .max(1);
    let x = grid(decades);
    let series: Vec<Value> = curves
        .iter()
        .map(|(name, c)| {
            let (y, points): (Vec<Option<f64>>, bool) = match c {
                Curve::Pooled(h) => (
                    x.iter()
                        .map(|&x| {
                            let p = pct_of(x);
                            if percentile_supported(p, h.samples()) {
                                h.value_at(p).map(|v| to_us(v as f64))
                            } else {
                                None
                            }
                        })
                        .collect(),
                    false,
                ),
                Curve::Stated(pts) => (
                    x.iter()
                        .map(|&x| {
                            pts.iter()
                                .find(|(px, _)| (px / x - 1.0).abs() < 1e-9)
                                .map(|(_, y)| *y)
                        })
                        .collect(),
                    true,
                ),
            };
            json!({ "name": name, "y_us": y, "points": points })
        })
        .collect();
    json!({ "x": x, "series": series })
}

/// A case's RTT distribution: its runs' histograms pooled, or the percentiles (x, µs) its
/// documents state.
enum Curve {
    Pooled(RttRecorder),
    Stated(Vec<(f64, f64)>),
}

type RttGet = fn(&crate::model::RttNs) -> Option<u64>;

/// The percentiles a document states, at their x = 1 / (1 - p).
const DOC_PERCENTILES: [(f64, RttGet); 6] = [
    (2.0, |r| r.p50),
    (10.0, |r| r.p90),
    (100.0, |r| r.p99),
    (1_000.0, |r| r.p999),
    (10_000.0, |r| r.p9999),
    (100_000.0, |r| r.p99999),
];

/// The most latency runs drawn over time (one chart each).
const MAX_RTT_TIME_CHARTS: usize = 24;

/// The latency runs' intervals (`-i`): one chart's title and data per run that has them, and
/// the names of the runs that have none.
struct RttOverTime {
    /// Title, data, and what the chart draws of the run's full log (if it kept one).
    charts: Vec<(String, Value, Option<String>)>,
    /// Runs (or parts) with intervals beyond [`MAX_RTT_TIME_CHARTS`].
    left_out: usize,
    without: Vec<String>,
}

/// Every latency document a result holds (a quick run's cases, a sweep's steps, load's
/// phases), with the part it belongs to.
fn latency_parts(result: &TestResult) -> Vec<(String, &crate::model::LatencyResult)> {
    let mut all = Vec::new();
    if let TestResult::Latency(l) = result {
        all.push((String::new(), l));
    }
    for (part, r) in result.kind().parts() {
        all.extend(
            latency_parts(r)
                .into_iter()
                .map(|(p, l)| (join_part(&part, &p), l)),
        );
    }
    all
}

fn rtt_over_time(runs: &[Run]) -> RttOverTime {
    let mut out = RttOverTime {
        charts: Vec::new(),
        left_out: 0,
        without: Vec::new(),
    };
    for run in runs {
        for (part, l) in latency_parts(&run.result) {
            let mut name = join_part(&format!("run {}", run.id), &part);
            if !run.labels.is_empty() {
                let labels: Vec<String> =
                    run.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let _ = write!(name, " ({})", labels.join(" "));
            }
            if l.intervals.is_empty() {
                out.without.push(name);
                continue;
            }
            if out.charts.len() >= MAX_RTT_TIME_CHARTS {
                out.left_out += 1;
                continue;
            }
            let first = &l.intervals[0];
            let title = format!(
                "{name}: {} {}, {} B, intervals of {} s",
                protocol(&l.protocol),
                match l.mode {
                    crate::model::LatencyMode::ClosedLoop => "closed loop",
                    crate::model::LatencyMode::OpenLoop => "open loop",
                },
                l.msg_size_bytes,
                // As given to -i: 0.5, 1, 2.
                (first.end_ns.saturating_sub(first.start_ns) as f64 / 1e6).round() / 1e3
            );
            let each = |get: fn(&crate::model::RttNs) -> Option<u64>| -> Vec<Option<f64>> {
                l.intervals
                    .iter()
                    .map(|i| i.rtt_ns.as_ref().and_then(get).map(|v| to_us(v as f64)))
                    .collect()
            };
            let mut data = json!({
                // Each interval at its middle, where its full log's samples lie too.
                "x_s": l.intervals.iter().map(|i| (i.start_ns + i.end_ns) as f64 / 2e9).collect::<Vec<_>>(),
                // Where the last interval ends: the x axis covers the whole run.
                "end_s": l.intervals.last().map_or(0.0, |i| i.end_ns as f64 / 1e9),
                "samples": l.intervals.iter().map(|i| i.samples).collect::<Vec<_>>(),
                "p50_us": each(|r| r.p50),
                "p99_us": each(|r| r.p99),
                "min_us": each(|r| Some(r.min)),
                "max_us": each(|r| Some(r.max)),
            });
            // The full log belongs to the run's own document, not to a part of it.
            let log = l.full_log.as_ref().filter(|_| part.is_empty()).and_then(|f| {
                let note = match run.full_log.as_ref()? {
                    Ok(bins) => {
                        data["log"] = log_data(bins);
                        format!(
                            "Every one of the {} replies in the full log {} (the grey strokes),                              binned by arrival into bins of {}: each stroke spans the smallest                              to the largest RTT that arrived in its bin.{}",
                            fmt_count(bins.samples()),
                            f.path,
                            fmt_ns(bins.bin_ns as f64, TimeUnit::for_typical(bins.bin_ns as f64)),
                            if f.dropped > 0 {
                                format!(
                                    " The log misses {} samples its writer could not keep up                                      with.",
                                    fmt_count(f.dropped)
                                )
                            } else {
                                String::new()
                            }
                        )
                    }
                    Err(e) => format!(
                        "The run kept a full log, {}, but it could not be read ({e}): only                          its intervals are drawn.",
                        f.path
                    ),
                };
                Some(note)
            });
            out.charts.push((title, data, log));
        }
    }
    out
}

/// A full log's bins for the chart: each non-empty bin's middle (s), smallest and largest RTT
/// (µs) and count; `null` where no reply arrived.
fn log_data(bins: &crate::samples::SampleBins) -> Value {
    let mid = |i: usize| (bins.start_ns as f64 + (i as f64 + 0.5) * bins.bin_ns as f64) / 1e9;
    json!({
        "bin_s": bins.bin_ns as f64 / 1e9,
        "x_s": (0..bins.bins.len()).map(mid).collect::<Vec<_>>(),
        "min_us": bins.bins.iter().map(|b| b.map(|b| to_us(b.min_ns as f64))).collect::<Vec<_>>(),
        "max_us": bins.bins.iter().map(|b| b.map(|b| to_us(b.max_ns as f64))).collect::<Vec<_>>(),
        "samples": bins.bins.iter().map(|b| b.map_or(0, |b| b.samples)).collect::<Vec<_>>(),
    })
}

fn rtt_over_time_html(out: &mut String, t: &RttOverTime) {
    if t.charts.is_empty() && t.without.is_empty() {
        return;
    }
    out.push_str("<h2>RTT over time</h2>\n");
    if !t.charts.is_empty() {
        out.push_str(
            "<p class=\"note\">Each run's p50 and p99 per interval (<code>-i</code>), drawn at \
             the interval's middle, over the band from its smallest to its largest RTT. The RTT \
             axis is a log scale, the same for every run here: an interval's p99 or max can be \
             a hundred times its p50, which on a linear scale would flatten the p50 to the \
             floor. A line breaks (it never drops to zero) where an interval had no reply or too \
             few to support the percentile: p50 needs 20 samples, p99 1,000 (a dot is a value \
             with no neighbour).</p>\n",
        );
    }
    for (i, (title, _, log)) in t.charts.iter().enumerate() {
        let _ = writeln!(out, "<h3>{}</h3>", esc(title));
        if let Some(log) = log {
            let _ = writeln!(out, "<p class=\"note\" data-full-log>{}</p>", esc(log));
        }
        let _ = writeln!(
            out,
            "<div class=\"chart\" data-chart=\"rtt-time\" data-index=\"{i}\" \
             data-title=\"RTT over time, {t}\"></div>",
            t = esc(title)
        );
    }
    if t.left_out > 0 {
        let _ = writeln!(
            out,
            "<p class=\"note\">{} more runs have intervals; the first {MAX_RTT_TIME_CHARTS} are \
             drawn (select fewer runs to see the others).</p>",
            t.left_out
        );
    }
    if !t.without.is_empty() {
        let _ = writeln!(
            out,
            "<p class=\"note\" data-no-intervals>No RTT over time for {}: {} recorded no \
             intervals. <code>sonde latency -i 1</code> records the RTTs of each second (any \
             interval in seconds, 0.01 or more).</p>",
            esc(&t.without.join(", ")),
            if t.without.len() == 1 { "it" } else { "they" }
        );
    }
}

/// Each throughput run's intervals: a title and the chart's data.
fn throughput_series(runs: &[Run]) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for run in runs {
        let TestResult::Throughput(t) = &run.result else {
            continue;
        };
        if t.intervals.is_empty() || out.len() >= MAX_THROUGHPUT_CHARTS {
            continue;
        }
        let x: Vec<f64> = t.intervals.iter().map(|i| i.end_ns as f64 / 1e9).collect();
        let streams = t
            .intervals
            .iter()
            .map(|i| i.stream_bytes.len())
            .max()
            .unwrap_or(0);
        let mut series: Vec<Value> = (0..streams)
            .map(|s| {
                let mbps: Vec<Option<f64>> = t
                    .intervals
                    .iter()
                    .map(|i| {
                        let ns = i.end_ns.saturating_sub(i.start_ns);
                        i.stream_bytes
                            .get(s)
                            .filter(|_| ns > 0)
                            .map(|&b| b as f64 * 8.0 * 1e9 / ns as f64 / 1e6)
                    })
                    .collect();
                json!({ "name": format!("stream {s}"), "mbps": mbps })
            })
            .collect();
        let total: Vec<f64> = t
            .intervals
            .iter()
            .map(|i| i.bits_per_second / 1e6)
            .collect();
        series.push(json!({ "name": "total", "mbps": total }));
        let labels = run
            .labels
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(" ");
        let title = format!(
            "run {}{}{}: {} {}, {} stream{}",
            run.id,
            if labels.is_empty() { "" } else { " " },
            labels,
            protocol(&t.protocol),
            t.direction,
            t.parallel,
            if t.parallel == 1 { "" } else { "s" }
        );
        out.push((title, json!({ "x_s": x, "series": series })));
    }
    out
}

fn protocol(p: &crate::model::Protocol) -> &'static str {
    match p {
        crate::model::Protocol::Tcp => "TCP",
        crate::model::Protocol::Udp => "UDP",
    }
}

fn compare_html(out: &mut String, c: &Comparison) {
    let _ = writeln!(
        out,
        "<h2>Compare: {} against {}</h2>",
        esc(&c.a.name),
        esc(&c.b.name)
    );
    let _ = writeln!(
        out,
        "<p class=\"note\">{}: A is {} ({} runs: {}), B is {} ({} runs: {}). A and B are the \
         median of each side's runs; significance is the two-sided Mann-Whitney U test at alpha \
         {} (~: not significant), which needs at least 5 runs a side (<code>--repeat 5</code>).</p>",
        c.test.name(),
        esc(&c.a.name),
        c.a.runs.len(),
        esc(&c.a.runs.join(", ")),
        esc(&c.b.name),
        c.b.runs.len(),
        esc(&c.b.runs.join(", ")),
        c.alpha
    );
    let unit = TimeUnit::for_typical(
        c.rows
            .iter()
            .filter(|r| r.figure.is_rtt())
            .filter_map(|r| r.a)
            .fold(f64::INFINITY, f64::min),
    );
    out.push_str(
        "<table data-table=\"compare\">\n<tr><th class=\"l\">figure</th><th>A</th><th>B</th><th>change</th><th class=\"l\">significance</th></tr>\n",
    );
    let mut notes = Vec::new();
    for r in &c.rows {
        let mut side =
            |v: Option<f64>, thin: Option<crate::compare::Thin>, name: &str| match (v, thin) {
                (Some(v), _) => esc(&fmt_figure(r.figure, v, unit)),
                (None, Some(t)) => {
                    let what = match t.reading {
                        ThinReading::Max { value_ns } => format!(
                            "the maximum, {} (the largest sample, not {})",
                            fmt_ns(value_ns as f64, unit),
                            r.figure.title()
                        ),
                        ThinReading::Thin { value_ns, beyond } => format!(
                            "{} resting on only {beyond} samples beyond it",
                            fmt_ns(value_ns as f64, unit)
                        ),
                        ThinReading::Pooled { value_ns, runs } => format!(
                            "{} over the {runs} runs' samples taken together",
                            fmt_ns(value_ns as f64, unit)
                        ),
                    };
                    let run = t.run_needed_ns.map_or_else(String::new, |ns| {
                        format!(
                            "; a {:.0} s run at this sample rate would support it",
                            ns as f64 / 1e9
                        )
                    });
                    notes.push(format!(
                        "{name} {}: n/a with {} samples (needs {}); what can be used: {what}{run}",
                        r.figure.title(),
                        fmt_count(t.samples),
                        fmt_count(t.samples_needed)
                    ));
                    format!("n/a [{}]", notes.len())
                }
                (None, None) => "n/a".to_owned(),
            };
        let a = side(r.a, r.a_thin, "A");
        let b = side(r.b, r.b_thin, "B");
        let change = r
            .change_percent
            .map_or_else(String::new, |p| format!("{p:+.2}%"));
        let sig = match r.significance {
            Verdict::Significant { p_value } => format!(
                "<span class=\"{}\">p={p_value:.3} {}</span>",
                if r.worse { "worse" } else { "better" },
                if r.worse { "worse" } else { "better" }
            ),
            Verdict::NotSignificant { p_value } => format!("~ (p={p_value:.3})"),
            Verdict::NeedsRepeat { runs_a, runs_b } => {
                format!("untested ({runs_a} and {runs_b} runs; needs --repeat 5)")
            }
            Verdict::Untested => String::new(),
        };
        let _ = writeln!(
            out,
            "<tr data-figure=\"{}\"><td class=\"l\">{}</td><td>{a}</td><td>{b}</td><td>{change}</td><td class=\"l\">{sig}</td></tr>",
            r.figure.name(),
            esc(r.figure.title())
        );
    }
    out.push_str("</table>\n");
    if !notes.is_empty() {
        out.push_str("<ol class=\"note\">\n");
        for n in notes {
            let _ = writeln!(out, "<li>{}</li>", esc(&n));
        }
        out.push_str("</ol>\n");
    }
}

/// The `--from` helpers of a result, with the part they belong to (a sweep's step, a quick
/// case) and the figures their shares have.
fn helper_parts(result: &TestResult) -> Vec<(String, &Helpers, Shares)> {
    let kind = result.kind();
    let mut all: Vec<(String, &Helpers, Shares)> = kind
        .helpers()
        .map(|(h, k)| (String::new(), h, k))
        .into_iter()
        .collect();
    for (part, r) in kind.parts() {
        all.extend(
            helper_parts(r)
                .into_iter()
                .map(|(p, h, k)| (join_part(&part, &p), h, k)),
        );
    }
    all
}

/// Each `--from` run's helpers: how closely they started, and one row per helper's share (the
/// text table's columns). Nothing when no run was made from helpers.
fn helpers_html(out: &mut String, runs: &[Run]) {
    let parts: Vec<(String, &Run, &Helpers, Shares)> = runs
        .iter()
        .flat_map(|run| {
            helper_parts(&run.result)
                .into_iter()
                .map(move |(p, h, k)| (p, run, h, k))
        })
        .collect();
    if parts.is_empty() {
        return;
    }
    out.push_str("<h2>Shares of the helpers (--from)</h2>\n");
    out.push_str(
        "<p class=\"note\">Runs made from several helper agents at once against one target: \
         each helper's own share, counted at the target where the test counts there. The \
         case tables above show the helpers' figures together.</p>\n",
    );
    for (part, run, h, kind) in parts {
        let mut name = join_part(&format!("run {}", run.id), &part);
        if !run.labels.is_empty() {
            let labels: Vec<String> = run.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
            let _ = write!(name, " ({})", labels.join(" "));
        }
        let _ = writeln!(out, "<h3>{}</h3>", esc(&name));
        let _ = writeln!(out, "<p class=\"note\">{}</p>", esc(&shares::summary(h)));
        let _ = write!(
            out,
            "<table data-table=\"helpers\" data-run=\"{}\" class=\"sortable\">\n<thead><tr>",
            esc(&run.id)
        );
        for (i, title) in shares::header(kind).iter().enumerate() {
            let class = if i == 0 { " class=\"l\"" } else { "" };
            let _ = write!(out, "<th{class}>{}</th>", esc(title));
        }
        out.push_str("</tr></thead>\n<tbody>\n");
        for s in &h.shares {
            let _ = write!(out, "<tr data-helper=\"{}\">", esc(&s.helper));
            for (i, cell) in shares::share_row(s, kind).iter().enumerate() {
                let class = if i == 0 { " class=\"l\"" } else { "" };
                let _ = write!(out, "<td{class}>{}</td>", esc(cell));
            }
            out.push_str("</tr>\n");
        }
        out.push_str("</tbody>\n</table>\n");
        if kind == Shares::Latency {
            let _ = writeln!(out, "<p class=\"note\">{}</p>", esc(shares::LATENCY_NOTE));
        }
    }
}

/// Every meta a result holds, with the part it belongs to.
fn metas(result: &TestResult) -> Vec<(String, &Meta)> {
    let kind = result.kind();
    let mut all = kind.metas();
    for (part, r) in kind.parts() {
        all.extend(metas(r).into_iter().map(|(p, m)| (join_part(&part, &p), m)));
    }
    all
}

fn join_part(a: &str, b: &str) -> String {
    if b.is_empty() {
        a.to_owned()
    } else {
        format!("{a} {b}")
    }
}

/// `value` flattened to dotted keys: `interfaces.0.mtu_bytes`.
fn flatten(prefix: &str, value: &Value, out: &mut BTreeMap<String, String>) {
    match value {
        Value::Object(m) => {
            for (k, v) in m {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten(&key, v, out);
            }
        }
        Value::Array(a) if a.iter().all(|v| !v.is_object() && !v.is_array()) => {
            let items: Vec<String> = a.iter().map(scalar).collect();
            out.insert(prefix.to_owned(), items.join(", "));
        }
        Value::Array(a) => {
            for (i, v) in a.iter().enumerate() {
                flatten(&format!("{prefix}.{i}"), v, out);
            }
        }
        Value::Null => {}
        v => {
            out.insert(prefix.to_owned(), scalar(v));
        }
    }
}

fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

fn hosts_html(out: &mut String, runs: &[Run]) {
    out.push_str("<h2>Host configuration</h2>\n");
    // Distinct (client, server) configurations, each with the runs that had it.
    let mut configs: Vec<((Value, Value), Vec<String>)> = Vec::new();
    for run in runs {
        for (part, m) in metas(&run.result) {
            let key = (
                serde_json::to_value(&m.hosts.client).unwrap_or(Value::Null),
                serde_json::to_value(&m.hosts.server).unwrap_or(Value::Null),
            );
            if key.0.is_null() && key.1.is_null() {
                continue;
            }
            let name = join_part(&format!("run {}", run.id), &part);
            match configs.iter_mut().find(|(k, _)| *k == key) {
                Some((_, names)) => names.push(name),
                None => configs.push((key, vec![name])),
            }
        }
    }
    if configs.is_empty() {
        out.push_str("<p>No run carries its hosts' configuration.</p>\n");
        return;
    }
    for (i, ((client, server), names)) in configs.iter().enumerate() {
        let (mut c, mut s) = (BTreeMap::new(), BTreeMap::new());
        flatten("", client, &mut c);
        flatten("", server, &mut s);
        let keys: std::collections::BTreeSet<&String> = c.keys().chain(s.keys()).collect();
        let _ = writeln!(
            out,
            "<details{}><summary>{} (this host and the agent)</summary>",
            if i == 0 { " open" } else { "" },
            esc(&names.join(", "))
        );
        let _ = writeln!(
            out,
            "<table data-table=\"hosts\">\n<tr><th class=\"l\">setting</th><th class=\"l\">client</th><th class=\"l\">server</th></tr>"
        );
        for k in keys {
            let get = |m: &BTreeMap<String, String>| m.get(k).map_or_else(String::new, |v| esc(v));
            let _ = writeln!(
                out,
                "<tr><td class=\"l\">{}</td><td class=\"l\">{}</td><td class=\"l\">{}</td></tr>",
                esc(k),
                get(&c),
                get(&s)
            );
        }
        out.push_str("</table>\n</details>\n");
    }
}

fn warnings_html(out: &mut String, runs: &[Run]) {
    out.push_str("<h2>Warnings</h2>\n");
    let mut items = Vec::new();
    for run in runs {
        let mut texts: Vec<(String, String)> = Vec::new();
        for (part, m) in metas(&run.result) {
            if m.overlapping_sessions > 0 {
                texts.push((
                    part.clone(),
                    format!("overlapping sessions: {}", m.overlapping_sessions),
                ));
            }
            texts.extend(m.warnings.iter().map(|w| (part.clone(), w.clone())));
        }
        let own = run.result.kind().own_warnings();
        texts.extend(own.iter().map(|w| (String::new(), w.clone())));
        for (part, w) in texts {
            items.push(format!(
                "<li data-warning><b>{}</b>: {}</li>",
                esc(&join_part(&format!("run {}", run.id), &part)),
                esc(&w)
            ));
        }
    }
    if items.is_empty() {
        out.push_str("<p>None.</p>\n");
    } else {
        out.push_str("<ul class=\"warnings\">\n");
        for i in items {
            out.push_str(&i);
            out.push('\n');
        }
        out.push_str("</ul>\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::compare;
    use crate::fixtures;

    fn runs() -> Vec<Run> {
        let mut out = Vec::new();
        let mut a = Run::new("1", fixtures::latency_tcp());
        a.labels.insert("path".into(), "private".into());
        let mut h = RttRecorder::new(0);
        for i in 0..20_000u64 {
            h.record(0, 30_000 + (i * 7_919) % 20_000);
        }
        a.rtt = Some(h);
        out.push(a);
        // Labelled in its document: path=public, zone=other.
        out.push(Run::new("2", fixtures::latency_udp_lossy()));
        out.push(Run::new("3", fixtures::throughput_tcp_2_streams()));
        out.push(Run::new("4", fixtures::latency_with_warnings()));
        out.push(Run::new("5", fixtures::throughput_tcp_context()));
        out
    }

    #[test]
    fn the_report_is_self_contained() {
        let runs = runs();
        let c = compare(&runs[..1], &runs[1..2], 0.05).unwrap();
        let page = html(&Report {
            title: "a <b> test",
            generated_unix_ms: 1_714_564_800_000,
            runs: &runs,
            comparison: Some(&c),
            layout: Layout::default(),
        });
        // No resource from anywhere: no src or href attribute, no CSS url(), no @import, no
        // fetch, no address at all.
        for pat in [
            "src=",
            "href=",
            "url(",
            "@import",
            "fetch(",
            "XMLHttpRequest",
            "http://",
            "https://",
        ] {
            assert!(!page.contains(pat), "{pat}");
        }
        assert!(page.contains("<title>a &lt;b&gt; test</title>"));
        // One row per case, the charts' slots, the compare view, the warnings.
        for case in ["path=private", "path=public zone=other", "run 4"] {
            assert!(
                page.contains(&format!("<tr data-case=\"{case}\">")),
                "{case}"
            );
        }
        assert_eq!(page.matches("data-chart=\"throughput\"").count(), 2);
        assert!(page.contains("data-chart=\"latency-bars\""));
        assert!(page.contains("data-chart=\"rtt-distribution\""));
        assert!(page.contains("<table data-table=\"compare\">"));
        let TestResult::Latency(w) = fixtures::latency_with_warnings() else {
            unreachable!()
        };
        for warning in &w.meta.warnings {
            assert!(page.contains(&esc(warning)), "{warning}");
        }
        // The data parse back, and cannot close their script element.
        let start = page.find("id=\"sonde-data\">").unwrap() + "id=\"sonde-data\">".len();
        let end = start + page[start..].find("</script>").unwrap();
        let data: Value = serde_json::from_str(&page[start..end]).unwrap();
        // One bar per latency case: path private and public, and run 4 (no labels).
        let bars: Vec<&Value> = data["latency_bars"]["panels"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|p| p["groups"].as_array().unwrap())
            .flat_map(|g| g["bars"].as_array().unwrap())
            .collect();
        assert_eq!(bars.len(), 3);
        assert_eq!(data["distribution"]["series"].as_array().unwrap().len(), 3);
    }

    #[test]
    fn a_from_run_shows_each_helpers_share() {
        let mut from = vec![
            Run::new("6", fixtures::pps_from_helpers()),
            Run::new("7", fixtures::throughput_from_helpers()),
            Run::new("8", fixtures::latency_from_helpers()),
        ];
        from[0].labels.insert("zone".into(), "b".into());
        let page = html(&Report {
            title: "from helpers",
            generated_unix_ms: 1_714_564_800_000,
            runs: &from,
            comparison: None,
            layout: Layout::default(),
        });
        assert!(page.contains("<h2>Shares of the helpers (--from)</h2>"));
        // The row of a helper in run `run`'s share table.
        let row = |run: &str, helper: &str| -> &str {
            let table = page
                .find(&format!("<table data-table=\"helpers\" data-run=\"{run}\""))
                .unwrap_or_else(|| panic!("no share table of run {run}"));
            let rest = &page[table..];
            let rest = &rest[..rest.find("</table>").expect("the table ends")];
            let start = rest
                .find(&format!("<tr data-helper=\"{helper}\">"))
                .unwrap_or_else(|| panic!("no row of {helper} in run {run}'s share table"));
            let row = &rest[start..];
            &row[..row.find("</tr>").expect("the row ends")]
        };
        // pps: sent, received, lost, received pps, as the text table has them.
        assert!(
            row("6", "198.18.2.2:5300")
                .ends_with("<td>1,201,664</td><td>1,190,115</td><td>11,549</td><td>580,413</td>"),
            "{}",
            row("6", "198.18.2.2:5300")
        );
        assert!(row("6", "198.18.3.2:5300").contains("<td>+613.44 µs</td>"));
        assert!(page.contains("<h3>run 6 (zone=b)</h3>"));
        assert!(page.contains("starts within 613.44 µs of each other"));
        // throughput: bytes and the received rate; TCP has no loss.
        assert!(
            row("7", "198.18.2.2:5300")
                .ends_with("<td>1.648 GiB</td><td>1.646 GiB</td><td>-</td><td>4.710 Gbit/s</td>"),
            "{}",
            row("7", "198.18.2.2:5300")
        );
        // latency: each helper's own RTTs.
        assert!(
            row("8", "198.18.3.2:5300").ends_with(
                "<td>+2.752 ms</td><td>11.903 ms</td><td>12.413 ms</td><td>13.615 ms</td>\
                 <td>21.430 ms</td>"
            ),
            "{}",
            row("8", "198.18.3.2:5300")
        );
        assert_eq!(page.matches("<table data-table=\"helpers\"").count(), 3);
        // Runs without helpers have no such section.
        let plain = html(&Report {
            title: "plain",
            generated_unix_ms: 1_714_564_800_000,
            runs: &runs(),
            comparison: None,
            layout: Layout::default(),
        });
        assert!(!plain.contains("data-table=\"helpers\""));
    }

    #[test]
    fn the_distribution_comes_from_the_histogram_up_to_what_it_supports() {
        let runs = runs();
        let d = distribution(
            &runs,
            ["path=private", "path=public zone=other"]
                .into_iter()
                .map(|n| (n, n.to_owned())),
        );
        let x: Vec<f64> = serde_json::from_value(d["x"].clone()).unwrap();
        let private: Vec<Option<f64>> =
            serde_json::from_value(d["series"][0]["y_us"].clone()).unwrap();
        // 20,000 samples support p99.9 (x = 1000) but not p99.99: the grid ends there (the
        // other case states no more either).
        let at = |v: f64| x.iter().position(|&x| (x / v - 1.0).abs() < 1e-9).unwrap();
        assert!(private[at(1_000.0)].is_some());
        assert!((x.last().unwrap() / 1_000.0 - 1.0).abs() < 1e-9, "{x:?}");
        // The values rise with the percentile, from 30 µs up to below 50 µs.
        let known: Vec<f64> = private.iter().flatten().copied().collect();
        assert!(known.windows(2).all(|w| w[0] <= w[1]));
        assert!(
            known[0] >= 30.0 && *known.last().unwrap() < 50.1,
            "{known:?}"
        );
        // The public case has no histogram: its document's percentiles, at their x.
        let public: Vec<Option<f64>> =
            serde_json::from_value(d["series"][1]["y_us"].clone()).unwrap();
        assert_eq!(public[at(2.0)], Some(12_410.879));
        assert_eq!(public[at(1_000.0)], Some(15_597.567));
        assert_eq!(public.iter().flatten().count(), 4); // p50, p90, p99, p99.9
    }

    /// A run whose intervals are full, short of p99, and empty, beside a run without any.
    fn with_intervals() -> Vec<Run> {
        use crate::model::{LatencyInterval, RttNs};
        let TestResult::Latency(mut l) = fixtures::latency_tcp() else {
            unreachable!("latency_tcp is a latency result")
        };
        let rtt = |p99: Option<u64>| RttNs {
            min: 30_000,
            mean: 40_000.0,
            stddev: 1_000.0,
            p50: Some(40_000),
            p90: Some(45_000),
            p99,
            p999: None,
            p9999: None,
            p99999: None,
            max: 90_000,
        };
        let at = |k: u64, samples: u64, rtt_ns: Option<RttNs>| LatencyInterval {
            start_ns: 500_000_000 * k,
            end_ns: 500_000_000 * (k + 1),
            samples,
            rtt_ns,
            transactions_per_second: None,
        };
        l.intervals = vec![
            at(0, 5_000, Some(rtt(Some(60_000)))),
            at(1, 300, Some(rtt(None))),
            at(2, 0, None),
            at(3, 5_000, Some(rtt(Some(61_000)))),
        ];
        vec![
            Run::new("7", TestResult::Latency(l)),
            Run::new("8", fixtures::latency_tcp()),
        ]
    }

    #[test]
    fn rtt_over_time_has_a_gap_where_an_interval_cannot_say() {
        let runs = with_intervals();
        let t = rtt_over_time(&runs);
        assert_eq!(t.charts.len(), 1);
        assert_eq!(t.without, ["run 8"]);
        let (title, d, log) = &t.charts[0];
        assert_eq!(*log, None);
        assert_eq!(title, "run 7: TCP closed loop, 64 B, intervals of 0.5 s");
        let col = |k: &str| -> Vec<Option<f64>> { serde_json::from_value(d[k].clone()).unwrap() };
        assert_eq!(col("x_s"), [Some(0.25), Some(0.75), Some(1.25), Some(1.75)]);
        // null, never 0, where the interval cannot support p99 or had no reply.
        assert_eq!(col("p99_us"), [Some(60.0), None, None, Some(61.0)]);
        assert_eq!(col("p50_us"), [Some(40.0), Some(40.0), None, Some(40.0)]);
        assert_eq!(col("max_us"), [Some(90.0), Some(90.0), None, Some(90.0)]);
        let page = html(&Report {
            title: "over time",
            generated_unix_ms: 1_714_564_800_000,
            runs: &runs,
            comparison: None,
            layout: Layout::default(),
        });
        assert_eq!(page.matches("data-chart=\"rtt-time\"").count(), 1);
        assert!(page.contains("No RTT over time for run 8: it recorded no intervals."));
        // Without intervals anywhere: the section says how to get the chart, and draws none.
        let plain = html(&Report {
            title: "plain",
            generated_unix_ms: 1_714_564_800_000,
            runs: &runs[1..],
            comparison: None,
            layout: Layout::default(),
        });
        assert!(!plain.contains("data-chart=\"rtt-time\""));
        assert!(plain.contains("<code>sonde latency -i 1</code>"));
    }
}
