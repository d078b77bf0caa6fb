//! `sonde compare` for people: A against B per figure, and the matrix view (`--by LABEL`).

use super::units::{fmt_count, fmt_count_f64, fmt_ns, fmt_percent, fmt_rate, TimeUnit};
use crate::compare::{CaseTable, Cell, Comparison, Figure, Thin, ThinReading, Verdict};

/// `sonde compare A B` as a table: one line per figure with A, B, the change and its
/// significance, then what to read for a percentile that is `n/a`.
pub fn compare_table(c: &Comparison) -> String {
    let mut out = String::new();
    let runs = |n: usize| format!("{n} run{}", if n == 1 { "" } else { "s" });
    out.push_str(&format!(
        "sonde compare: {}\n  A  {} ({})\n  B  {} ({})\n",
        c.test.name(),
        c.a.name,
        runs(c.a.runs.len()),
        c.b.name,
        runs(c.b.runs.len())
    ));
    out.push_str(&format!(
        "A and B are the median of each side's runs; significance: Mann-Whitney U, two-sided, \
         alpha {} (~ = not significant)\n\n",
        c.alpha
    ));
    let unit = rtt_unit(
        c.rows
            .iter()
            .filter(|r| r.figure.is_rtt())
            .flat_map(|r| r.a),
    );
    let mut rows = vec![[
        "figure".to_owned(),
        "A".to_owned(),
        "B".to_owned(),
        "change".to_owned(),
        "significance".to_owned(),
    ]];
    let mut notes = Vec::new();
    for r in &c.rows {
        let mut cell = |v: Option<f64>, thin: Option<&Thin>, side: &str| match (v, thin) {
            (Some(v), _) => fmt_figure(r.figure, v, unit),
            (None, Some(t)) => {
                notes.push(thin_note(side, r.figure, t, unit));
                format!("n/a [{}]", notes.len())
            }
            (None, None) => "n/a".to_owned(),
        };
        let a = cell(r.a, r.a_thin.as_ref(), "A");
        let b = cell(r.b, r.b_thin.as_ref(), "B");
        let change = match r.change_percent {
            Some(p) => format!("{p:+.2}%"),
            None if r.a == Some(0.0) && r.b.is_some_and(|b| b > 0.0) => "from 0".to_owned(),
            None => String::new(),
        };
        let sig = match r.significance {
            Verdict::Significant { p_value } => {
                format!(
                    "p={p_value:.3} {}",
                    if r.worse { "worse" } else { "better" }
                )
            }
            Verdict::NotSignificant { p_value } => format!("~ (p={p_value:.3})"),
            Verdict::NeedsRepeat { runs_a, runs_b } => {
                format!("untested ({runs_a} and {runs_b} runs; needs --repeat 5)")
            }
            Verdict::Untested => String::new(),
        };
        rows.push([r.figure.title().to_owned(), a, b, change, sig]);
    }
    push_aligned(&mut out, &rows, &[false, true, true, true, false]);
    if !notes.is_empty() {
        out.push('\n');
        for (i, n) in notes.iter().enumerate() {
            out.push_str(&format!("[{}] {n}\n", i + 1));
        }
    }
    out
}

/// The matrix view: per kind of test, one row per value of the label.
pub fn matrix_table(tables: &[CaseTable]) -> String {
    let mut out = String::new();
    if tables.is_empty() {
        out.push_str("no runs with that label\n");
        return out;
    }
    for (i, t) in tables.iter().enumerate() {
        if i > 0 {
            out.push('\n');
        }
        let by = t.by.as_deref().unwrap_or("case");
        out.push_str(&format!(
            "{} by {by} (each figure the median of the case's runs)\n",
            t.test.name()
        ));
        out.push_str(&case_table(t, by));
    }
    out
}

/// The comparison as pretty JSON with a trailing newline (`sonde compare --json`).
pub fn compare_json(c: &Comparison) -> String {
    to_json(c)
}

/// The matrix view as pretty JSON with a trailing newline (`sonde compare --by LABEL --json`).
pub fn matrix_json(tables: &[CaseTable]) -> String {
    to_json(&tables)
}

fn to_json(v: &impl serde::Serialize) -> String {
    // Cannot fail: string keys only; a non-finite float comes out as null.
    let mut s = serde_json::to_string_pretty(v).expect("the compare model always serializes");
    s.push('\n');
    s
}

/// One case table (the matrix, or the report's table in text): rows of cells, then the legend
/// for the thin percentiles in it.
fn case_table(t: &CaseTable, first: &str) -> String {
    let mut out = String::new();
    let unit = rtt_unit(
        t.rows
            .iter()
            .flat_map(|r| r.cells.iter().zip(&t.columns))
            .filter(|(_, f)| f.is_rtt())
            .filter_map(|(c, _)| c.value),
    );
    let has_samples = t.rows.iter().any(|r| r.samples.is_some());
    let mut header = vec![first.to_owned(), "runs".to_owned()];
    if has_samples {
        header.push("samples".to_owned());
    }
    header.extend(t.columns.iter().map(|f| short_title(*f).to_owned()));
    let mut rows = vec![header];
    let mut notes: Vec<String> = Vec::new();
    for r in &t.rows {
        let mut row = vec![r.name.clone(), r.runs.len().to_string()];
        if has_samples {
            row.push(r.samples.map_or_else(String::new, fmt_count));
        }
        for (cell, &f) in r.cells.iter().zip(&t.columns) {
            row.push(matrix_cell(cell, f, unit, &mut notes));
        }
        rows.push(row);
    }
    let right: Vec<bool> = (0..rows[0].len()).map(|i| i > 0).collect();
    push_aligned(&mut out, &rows, &right);
    for n in notes {
        out.push_str(&n);
        out.push('\n');
    }
    // What would support each unsupported percentile, at each case's own sample rate.
    for r in &t.rows {
        for (cell, &f) in r.cells.iter().zip(&t.columns) {
            if let Some(ns) = cell.thin.and_then(|t| t.run_needed_ns) {
                out.push_str(&format!(
                    "{}: {} needs a {} run at this case's sample rate\n",
                    r.name,
                    f.title(),
                    fmt_run(ns)
                ));
            }
        }
    }
    out
}

fn matrix_cell(cell: &Cell, f: Figure, unit: TimeUnit, notes: &mut Vec<String>) -> String {
    match (cell.value, cell.thin) {
        (Some(v), _) => fmt_figure(f, v, unit),
        (None, Some(t)) => {
            // The legend is shared by the rows, whose sample rates differ: the run length that
            // would support the percentile is for the JSON and the report's cells.
            let needed = "";
            let (text, note) = match t.reading {
                ThinReading::Thin { value_ns, beyond } => (
                    format!("~{} ({beyond})", fmt_ns(value_ns as f64, unit)),
                    format!(
                        "~V (k): {} is not supported (needs {} samples{needed}); V rests on the k \
                         samples beyond it",
                        f.title(),
                        fmt_count(t.samples_needed)
                    ),
                ),
                ThinReading::Max { value_ns } => (
                    format!("max {}", fmt_ns(value_ns as f64, unit)),
                    format!(
                        "max V: {} is not supported (needs {} samples{needed}); V is the largest \
                         sample, not the percentile",
                        f.title(),
                        fmt_count(t.samples_needed)
                    ),
                ),
                ThinReading::Pooled { value_ns, runs } => (
                    format!("{} (pooled)", fmt_ns(value_ns as f64, unit)),
                    format!(
                        "V (pooled): no run has the {} samples {} needs; V is the percentile of \
                         the case's runs' samples taken together ({runs} runs)",
                        fmt_count(t.samples_needed),
                        f.title()
                    ),
                ),
            };
            // One legend line per kind of note.
            let kind = note.split(':').next().unwrap_or_default().to_owned();
            if !notes.iter().any(|n| n.starts_with(&kind)) {
                notes.push(note);
            }
            text
        }
        (None, None) => "n/a".to_owned(),
    }
}

fn short_title(f: Figure) -> &'static str {
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

/// The note under a compare table for an `n/a` percentile.
fn thin_note(side: &str, f: Figure, t: &Thin, unit: TimeUnit) -> String {
    let use_instead = match t.reading {
        ThinReading::Thin { value_ns, beyond } => format!(
            "{} resting on only {beyond} sample{} beyond it",
            fmt_ns(value_ns as f64, unit),
            if beyond == 1 { "" } else { "s" }
        ),
        ThinReading::Max { value_ns } => format!(
            "the maximum, {} (the largest sample, not {})",
            fmt_ns(value_ns as f64, unit),
            f.title()
        ),
        ThinReading::Pooled { value_ns, runs } => format!(
            "{} over the {runs} runs' samples taken together",
            fmt_ns(value_ns as f64, unit)
        ),
    };
    let run = t.run_needed_ns.map_or_else(String::new, |ns| {
        format!(
            "; a {} run at this sample rate would support it",
            fmt_run(ns)
        )
    });
    format!(
        "{side} {}: n/a with {} samples (needs {}); what can be used: {use_instead}{run}",
        f.title(),
        fmt_count(t.samples),
        fmt_count(t.samples_needed)
    )
}

/// A run length for people: `143 s`, `2.4 h`.
fn fmt_run(ns: u64) -> String {
    let s = ns as f64 / 1e9;
    if s < 600.0 {
        format!("{} s", s.ceil())
    } else if s < 7_200.0 {
        format!("{} min", (s / 60.0).ceil())
    } else {
        format!("{:.1} h", s / 3_600.0)
    }
}

/// The time unit for RTT cells: from the smallest typical value shown.
fn rtt_unit(values: impl Iterator<Item = f64>) -> TimeUnit {
    TimeUnit::for_typical(values.fold(f64::INFINITY, f64::min))
}

/// A figure's value with its unit.
pub(super) fn fmt_figure(f: Figure, v: f64, unit: TimeUnit) -> String {
    match f {
        _ if f.is_rtt() => fmt_ns(v, unit),
        Figure::Throughput => fmt_rate(v),
        Figure::Pps | Figure::ConnectionsPerSecond | Figure::TransactionsPerSecond => {
            format!("{}/s", fmt_count_f64(v))
        }
        Figure::Loss => fmt_percent(v),
        _ => v.to_string(),
    }
}

/// Rows of cells, padded to their column's width (right-aligned where `right`), two spaces
/// between columns, no trailing spaces.
fn push_aligned<R: AsRef<[String]>>(out: &mut String, rows: &[R], right: &[bool]) {
    let cols = rows.iter().map(|r| r.as_ref().len()).max().unwrap_or(0);
    let width: Vec<usize> = (0..cols)
        .map(|i| {
            rows.iter()
                .filter_map(|r| r.as_ref().get(i))
                .map(|c| c.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    for r in rows {
        let mut line = String::new();
        for (i, c) in r.as_ref().iter().enumerate() {
            if i > 0 {
                line.push_str("  ");
            }
            let pad = width[i] - c.chars().count();
            if right.get(i).copied().unwrap_or(false) {
                line.push_str(&" ".repeat(pad));
                line.push_str(c);
            } else {
                line.push_str(c);
                line.push_str(&" ".repeat(pad));
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::compare::{compare, matrix, Run};
    use crate::fixtures;
    use crate::model::{LatencyResult, TestResult};

    fn latency(mean: f64, samples: u64, f: impl Fn(&mut LatencyResult)) -> TestResult {
        let TestResult::Latency(mut l) = fixtures::latency_tcp() else {
            unreachable!()
        };
        l.rtt_ns.mean = mean;
        l.samples = samples;
        f(&mut l);
        TestResult::Latency(l)
    }

    fn side(id: &str, means: &[f64], f: impl Fn(&mut LatencyResult) + Copy) -> Vec<Run> {
        means
            .iter()
            .enumerate()
            .map(|(i, &m)| Run::new(format!("{id}{i}"), latency(m, 250_000, f)))
            .collect()
    }

    fn snap(name: &str, text: &str) {
        insta::with_settings!({ snapshot_path => "../snapshots" }, {
            insta::assert_snapshot!(name, text);
        });
    }

    #[test]
    fn compare_five_runs_a_side() {
        let a = side(
            "",
            &[39_870.0, 40_120.0, 39_950.0, 40_310.0, 39_700.0],
            |_| {},
        );
        let b = side(
            "",
            &[47_870.0, 48_120.0, 47_950.0, 48_310.0, 47_700.0],
            |l| {
                l.rtt_ns.p99 = Some(61_000);
            },
        );
        let mut a = a;
        for (i, r) in a.iter_mut().enumerate() {
            r.id = (11 + i).to_string();
        }
        let c = compare(&a, &b, 0.05)
            .unwrap()
            .named("label:path=private", "label:path=public");
        let text = compare_table(&c);
        snap("compare_five_runs_a_side_table", &text);
        let json = serde_json::to_string_pretty(&c).unwrap();
        snap("compare_five_runs_a_side_json", &json);
    }

    #[test]
    fn compare_one_run_a_side_with_thin_percentiles() {
        let thin = |mean: f64, max: u64| {
            latency(mean, 7_000, |l| {
                l.rtt_ns.p999 = None;
                l.rtt_ns.p9999 = None;
                l.rtt_ns.max = max;
                l.duration_ns = 11_000_000_000;
                l.warmup_ns = 1_000_000_000;
            })
        };
        // A's histogram: 7,000 samples evenly from 1.3 ms to 2.0 ms, as its document says.
        let mut a = Run::new("run 7", thin(1_649_950.0, 1_999_900));
        let mut h = sonde_engine::rtt::RttRecorder::new(0);
        for i in 0..7_000u64 {
            h.record(0, 1_300_000 + i * 100);
        }
        a.rtt = Some(h);
        let b = Run::new("b.json", thin(1_720_000.0, 6_100_000));
        let c = compare(&[a], &[b], 0.05).unwrap().named("7", "b.json");
        snap("compare_one_run_a_side_table", &compare_table(&c));
    }

    #[test]
    fn compare_udp_throughput() {
        let a = Run::new("1", fixtures::throughput_udp_reverse());
        let TestResult::Throughput(mut t) = fixtures::throughput_udp_reverse() else {
            unreachable!()
        };
        t.receiver.bits_per_second *= 0.9;
        t.receiver.packets = t.receiver.packets * 9 / 10;
        t.loss_percent = t.loss_percent.map(|l| l * 3.0 + 0.5);
        let b = Run::new("2", TestResult::Throughput(t));
        let c = compare(&[a], &[b], 0.05).unwrap().named("1", "2");
        snap("compare_udp_throughput_table", &compare_table(&c));
    }

    #[test]
    fn matrix_by_path() {
        let mut runs = Vec::new();
        for (path, mean, samples) in [
            ("private", 38_000.0, 250_000),
            ("public", 52_000.0, 250_000),
            ("lb", 1_402_000.0, 7_000),
        ] {
            for i in 0..2u32 {
                let mut r = Run::new(
                    format!("{path}{i}"),
                    latency(mean + f64::from(i) * 500.0, samples, |l| {
                        if samples < 100_000 {
                            l.rtt_ns.p9999 = None;
                            l.rtt_ns.max = 5_369_850;
                        }
                    }),
                );
                r.labels.insert("path".into(), path.into());
                runs.push(r);
            }
        }
        runs.push(Run::new("9", fixtures::throughput_tcp_2_streams()));
        runs[6].labels.insert("path".into(), "private".into());
        let tables = matrix(&runs, "path").unwrap();
        snap("matrix_by_path_table", &matrix_table(&tables));
        snap(
            "matrix_by_path_json",
            &serde_json::to_string_pretty(&tables).unwrap(),
        );
    }
}
