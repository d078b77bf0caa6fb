//! `sonde report`: the stored runs as one self-contained HTML file with tables and charts.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::Args;
use sonde_report::compare::{compare, Run};
use sonde_report::render::{html, label_keys, Layout, Report};

use crate::select;
use crate::units::BadValue;

/// Report: runs as one self-contained HTML file with tables and charts
///
/// The case table (one row per case: labels, mean, p50, p99, p99.99, max, samples; throughput,
/// pps and crr cases in tables of their own), the mean and p99.99 of each case as bars side by
/// side, each case's RTT distribution (percentiles on a log scale, cases overlaid), throughput
/// over time per stream and in total, both ends' host configuration and every warning. With two
/// selections, also the compare view of the first against the second (as `sonde compare A B`).
#[derive(Debug, Args)]
#[command(after_long_help = "\
A case is the runs that share their labels (--label when they ran); a run without labels is a \
case of its own. The labels that tell the cases apart are the chart's axes (a plan's axes are \
labels on its runs): by default the one with the fewest values (at most 10) makes the series, \
the bars side by side in one colour each (protocol: TCP beside UDP), the one with the most \
values the category axis (target), and any others one panel per value (zone); --x and \
--series choose instead. The file holds its script (the charts are SVG drawn in the page), styles and data: it opens from a file, \
offline, and requests nothing from any network. Percentiles follow sonde's rule (p99.99 needs \
100,000 samples): where a case has fewer, the table shows what its samples do show, marked \
(the maximum, or a value with the few samples beyond it), never a p99.99.

SELECTION: a run id (17), group:4, label:path=private, test:latency, last or last:5 (terms \
joined with commas must all hold), or a file with one `--json` document. Without a selection, \
every stored run.

Examples:
  sonde report -o report.html
  sonde report label:zone=a label:zone=b -o zones.html --title \"zone a against zone b\"
  sonde report group:7 --db results.db -o run7.html
  sonde report group:7 --x zone --series protocol -o by-zone.html

Exit codes:
    0  the report was written
    1  the runs could not be read or the file not written
    2  usage error (bad option or selection)")]
pub(crate) struct Opt {
    /// The runs to report (default: every stored run); with two, also the compare view
    #[arg(value_name = "SELECTION")]
    selections: Vec<String>,
    /// The HTML file to write
    #[arg(short = 'o', long, value_name = "FILE", default_value = "report.html")]
    output: PathBuf,
    /// The report's heading
    #[arg(long, default_value = "sonde report")]
    title: String,
    /// Significance level of the compare view's U test
    #[arg(long, value_name = "P", default_value_t = sonde_engine::compare::DEFAULT_ALPHA)]
    alpha: f64,
    /// The label key whose values label the bar chart's groups (e.g. target; no iperf3 or
    /// netperf equivalent) [default: the key with the most values]
    #[arg(long = "x", value_name = "KEY")]
    x: Option<String>,
    /// The label key whose values are the bars side by side in each group, one colour each
    /// (e.g. protocol; no iperf3 or netperf equivalent) [default: the key with the fewest
    /// values, at most 10]
    #[arg(long, value_name = "KEY")]
    series: Option<String>,
    /// The results database: a file, or a PostgreSQL URL (postgres://...)
    /// [default: $SONDE_DB, else $XDG_DATA_HOME/sonde/results.db]
    #[arg(long, value_name = "PATH|URL")]
    db: Option<PathBuf>,
}

pub(crate) fn run(opt: &Opt) -> anyhow::Result<()> {
    if !(opt.alpha > 0.0 && opt.alpha < 1.0) {
        return Err(BadValue(format!("--alpha {} is not between 0 and 1", opt.alpha)).into());
    }
    let selections = if opt.selections.is_empty() {
        vec![select::Selection::Store(sonde_store::Filter::default())]
    } else {
        opt.selections
            .iter()
            .map(|s| select::parse(s))
            .collect::<Result<Vec<_>, _>>()?
    };
    let mut db = None;
    let db_flag = opt.db.as_deref().map(sonde_store::Location::from);
    let sides = select::load(&selections, &mut db, db_flag.as_ref())?;
    let comparison = match (opt.selections.as_slice(), sides.as_slice()) {
        ([a, b], [ra, rb]) => {
            if ra.is_empty() || rb.is_empty() {
                anyhow::bail!(
                    "the compare view needs runs on both sides: {a:?} selects {}, {b:?} selects {}",
                    ra.len(),
                    rb.len()
                );
            }
            Some(
                compare(ra, rb, opt.alpha)
                    .with_context(|| format!("comparing {a:?} with {b:?}"))?
                    .named(a.as_str(), b.as_str()),
            )
        }
        _ => None,
    };
    // Each run once, in the order selected.
    let mut runs: Vec<Run> = Vec::new();
    for run in sides.into_iter().flatten() {
        if !runs.iter().any(|r| r.id == run.id) {
            runs.push(run);
        }
    }
    read_full_logs(&mut runs);
    let keys = label_keys(&runs);
    for (flag, key) in [("--x", &opt.x), ("--series", &opt.series)] {
        if let Some(key) = key {
            if !keys.contains(key) {
                return Err(BadValue(format!(
                    "{flag} {key:?}: no selected run has that label; their labels are: {}",
                    if keys.is_empty() {
                        "none".to_owned()
                    } else {
                        keys.join(", ")
                    }
                ))
                .into());
            }
        }
    }
    if opt.x.is_some() && opt.x == opt.series {
        return Err(BadValue("--x and --series name the same label".into()).into());
    }
    let generated_unix_ms = sonde_client::now_unix_ms();
    let page = html(&Report {
        title: &opt.title,
        generated_unix_ms,
        runs: &runs,
        comparison: comparison.as_ref(),
        layout: Layout {
            x: opt.x.as_deref(),
            series: opt.series.as_deref(),
        },
    });
    std::fs::write(&opt.output, page)
        .with_context(|| format!("writing {}", opt.output.display()))?;
    eprintln!(
        "sonde report: {} run{} written to {}",
        runs.len(),
        if runs.len() == 1 { "" } else { "s" },
        opt.output.display()
    );
    Ok(())
}

/// Each latency run that kept a full log (`--full-log`) and has intervals (`-i`): its samples
/// binned over the intervals' span, for the RTT over time chart; or why the file could not be
/// read (moved, deleted, another host's path). A relative path is read from where `sonde report`
/// runs, as the run recorded it.
fn read_full_logs(runs: &mut [Run]) {
    use std::io::BufRead as _;
    for run in runs {
        let sonde_report::TestResult::Latency(l) = &run.result else {
            continue;
        };
        let (Some(log), Some(first), Some(last)) =
            (&l.full_log, l.intervals.first(), l.intervals.last())
        else {
            continue;
        };
        let mut bins = sonde_report::samples::SampleBins::new(first.start_ns, last.end_ns);
        let read = std::fs::File::open(&log.path).and_then(|file| {
            for line in std::io::BufReader::new(file).lines() {
                bins.line(&line?);
            }
            Ok(())
        });
        run.full_log = Some(read.map(|()| bins).map_err(|e| e.to_string()));
    }
}
