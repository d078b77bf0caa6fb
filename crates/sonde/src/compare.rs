//! `sonde compare`: runs against runs, per figure, with honest statistics; or the matrix view.

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Args;
use sonde_report::compare::{compare, matrix};
use sonde_report::export::{exporter, Format};

use crate::output::print;
use crate::select::{self, SELECTION_HELP};
use crate::units::BadValue;

/// Compare runs: A against B per figure with the change and its significance, or a matrix by label
///
/// For every figure the runs have (RTT mean, p50, p99, p99.9, p99.99, max, loss, and
/// transactions/s of many-flow latency runs; throughput, packets/s, loss; connections/s) it
/// prints A, B, the change in percent and whether the change is significant. With `--by LABEL`, one row per value of the label instead (the spreadsheet).
#[derive(Debug, Args)]
#[command(after_long_help = concat!("\
A side's figure is the median of its runs. Significance is the two-sided Mann-Whitney U test \
of A's runs against B's (normal approximation with tie and continuity correction), as \
benchstat does: with at least 5 runs a side (`--repeat 5`) a change is significant when p < \
--alpha, and `~` when not; with fewer runs the change is printed and marked as untested.

A percentile the sample count cannot support (sonde states p only with at least 10 / (1 - p) \
samples: p99.99 needs 100,000) is n/a, as in the test's output; a note says what can be used \
instead (the value with the few samples beyond it when the histogram was stored, else the \
maximum, called the maximum) and how long a run at the same sample rate would support it.

--fail-if-worse PCT exits 1 when B is worse than A by more than PCT percent in any figure the \
runs state: higher RTT or loss, lower throughput, packets/s or connections/s. A change the U \
test calls not significant does not count; one with too few runs to test does (nothing says it \
is noise). A loss that rises from 0 counts at any PCT.

", "SELECTION (A, B, or the runs of --by):
  17                   run 17 (as `sonde results` lists it)
  group:4              the runs of group 4 (a --repeat, a quick run, a sweep)
  label:path=private   runs with that label
  test:latency         runs of that test
  last, last:5         the newest run, the newest 5 (of those the other terms select)
  terms joined with commas must all hold: label:path=private,last:5
  or a file holding one result document as `sonde ... --json` printed it

Examples:
  sonde compare label:path=private label:path=public
  sonde compare before.json after.json --fail-if-worse 10
  sonde compare group:3 group:4 --json
  sonde compare --by path test:latency

Exit codes:
    0  compared (and nothing worse than --fail-if-worse)
    1  B is worse than --fail-if-worse allows, or the runs could not be read or compared
    2  usage error (bad option or selection)"))]
pub(crate) struct Opt {
    /// Side A and side B (two selections); with --by, at most one selection (default: every
    /// stored run)
    #[arg(value_name = "SELECTION", num_args = 0..=2)]
    sides: Vec<String>,
    /// The matrix view: one row per value of this label (mean, p50, p99, p99.99, samples; or
    /// throughput, packets/s, loss), runs without the label left out
    #[arg(long, value_name = "LABEL")]
    by: Option<String>,
    /// Significance level of the U test
    #[arg(long, value_name = "P", default_value_t = sonde_engine::compare::DEFAULT_ALPHA)]
    alpha: f64,
    /// Exit 1 when B is worse than A by more than PCT percent in any figure (for CI)
    #[arg(long, value_name = "PCT", conflicts_with = "by")]
    fail_if_worse: Option<f64>,
    /// One JSON document on stdout
    #[arg(short = 'J', long)]
    json: bool,
    /// The results database: a file, or a PostgreSQL URL (postgres://...)
    /// [default: $SONDE_DB, else $XDG_DATA_HOME/sonde/results.db]
    #[arg(long, value_name = "PATH|URL")]
    db: Option<PathBuf>,
}

pub(crate) fn run(opt: &Opt) -> anyhow::Result<()> {
    if !(opt.alpha > 0.0 && opt.alpha < 1.0) {
        return Err(BadValue(format!("--alpha {} is not between 0 and 1", opt.alpha)).into());
    }
    if opt
        .fail_if_worse
        .is_some_and(|p| !(p >= 0.0 && p.is_finite()))
    {
        return Err(BadValue("--fail-if-worse takes a percentage, 0 or more".into()).into());
    }
    let exporter = exporter(if opt.json {
        Format::Json
    } else {
        Format::Table
    });
    let mut db = None;
    let db_flag = opt.db.as_deref().map(sonde_store::Location::from);
    if let Some(label) = &opt.by {
        if opt.sides.len() > 1 {
            return Err(BadValue(format!(
                "--by takes at most one selection, not {}\n\n{SELECTION_HELP}",
                opt.sides.len()
            ))
            .into());
        }
        let selection = match opt.sides.first() {
            Some(s) => select::parse(s)?,
            None => select::Selection::Store(sonde_store::Filter::default()),
        };
        let runs = select::load(&[selection], &mut db, db_flag.as_ref())?
            .into_iter()
            .flatten()
            .collect::<Vec<_>>();
        let tables = matrix(&runs, label)?;
        if tables.is_empty() && exporter.is_for_people() {
            anyhow::bail!(
                "no selected run has the label {label:?} ({} runs selected)",
                runs.len()
            );
        }
        return print(&exporter.matrix(&tables));
    }
    let [a, b] = opt.sides.as_slice() else {
        return Err(BadValue(format!(
            "compare takes two selections, A and B (or --by LABEL)\n\n{SELECTION_HELP}"
        ))
        .into());
    };
    let selections = [select::parse(a)?, select::parse(b)?];
    let sides = select::load(&selections, &mut db, db_flag.as_ref())?;
    for (name, runs) in [a, b].iter().zip(&sides) {
        if runs.is_empty() {
            anyhow::bail!("selection {name:?} matches no run");
        }
    }
    let c = compare(&sides[0], &sides[1], opt.alpha)?.named(a.as_str(), b.as_str());
    print(&exporter.comparison(&c))?;
    if let Some(pct) = opt.fail_if_worse {
        let worse = c.worse_than(pct);
        if !worse.is_empty() {
            let mut list = String::new();
            for r in worse {
                let _ = write!(
                    list,
                    "{}{} ({})",
                    if list.is_empty() { "" } else { ", " },
                    r.figure.title(),
                    r.change_percent
                        .map_or_else(|| "from 0".to_owned(), |p| format!("{p:+.2}%"))
                );
            }
            anyhow::bail!("B is worse than A by more than {pct}% in: {list}");
        }
    }
    Ok(())
}
