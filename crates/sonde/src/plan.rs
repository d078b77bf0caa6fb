//! `sonde plan`: a file of test cases (endpoints, axes whose cross product is the matrix,
//! per-case overrides, repetitions) checked without a packet, or run one case at a time into the
//! results store, ending with the matrix table.
//!
//! A case's keys are the test subcommand's long flags (`msg_size` is `--msg-size`), turned into
//! an argument vector and parsed by the subcommand's own clap definition (`spec::TestKind`), and
//! the case runs through `spec::run_once`, the code path of the subcommand itself.

mod file;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::{Args, Subcommand, ValueEnum};
use sonde_report::Labels;
use sonde_store::{Failure, Filter, GroupId, GroupPlan, Label, Location, Store};

use crate::output::print;
use crate::save::Saver;
use crate::spec;
use crate::units::BadValue;

use file::{Case, Plan};

/// The label that names a case (its axis values) in the store: `sonde compare --by case`.
pub(crate) const CASE_LABEL: &str = "case";

/// The plan format, in `sonde plan --help` and each of its subcommands' `--help`.
macro_rules! plan_format {
    () => {
        "\
A plan file (TOML):

  name = \"zones\"                  # optional: the plan's name (default: the file's name)

  [endpoints]                     # names for the agents the cases test
  b-private = \"198.18.0.2\"
  b-public  = \"198.18.1.2:5300\"
  c-private = \"198.18.2.7:5301\"

  [defaults]                      # optional: keys every case gets unless it sets them
  time = \"10s\"
  warmup = 1

  [[matrix]]                      # cases: the cross product of the arrays (axes)
  test     = \"latency\"            # latency, throughput, pps, crr, load or mtu
  target   = [\"b-private\", \"b-public\", \"c-private\"]
  protocol = [\"tcp\", \"udp\"]
  msg_size = \"16K\"
  repeat   = 3                    # runs of each case

  [[matrix.case]]                 # optional: overrides for the cases whose axes match
  target = \"c-private\"
  time   = \"20s\"

  [[matrix]]
  test     = \"throughput\"
  target   = \"b-private\"
  parallel = [1, 2, 5]

Keys: a case takes the long flags of its test subcommand with `_` for `-` (msg_size is \
--msg-size), valued as the flag is (\"10s\", \"16K\", 100, true for a switch), and means \
exactly what the flag means (`sonde plan check` prints each case as its command line). \
`target` is the HOST[:PORT] argument and names an endpoint (as does each value of `from`). \
`protocol` \
is \"tcp\" or \"udp\" (latency --tcp or --udp; throughput and load --udp for \"udp\"; pps is \
UDP and crr TCP only). An array makes an axis; a flag that can be given more than once takes \
an array as its list and an array of arrays as an axis. Not in a plan: the output format, --db \
and --no-save (the plan's own), --label (the axes are the labels), --pause, --sweep (an axis \
does that), and --repeat (the `repeat` key).

A [[matrix.case]] names one or more axis values to match and sets keys for those cases."
    };
}

const PLAN_HELP: &str = plan_format!();

/// Test plans: a matrix of cases in a TOML file, checked or run one case at a time
///
/// `sonde plan check PLAN.toml` lists the cases without sending a packet; `sonde plan run
/// PLAN.toml` runs them, saves each run in the results database with its axis values as
/// labels, and ends with the matrix table.
#[derive(Debug, Args)]
#[command(after_long_help = concat!(plan_format!(), "

`plan run` runs one case at a time; with repeat > 1 all cases run once, then all again \
(--order interleaved, the default), so slow drift spreads over every case. Each run is saved \
in the results database in one group, the plan run (its id is the group's: `sonde results \
--group ID`), labelled with its axis values, case (the axis values together), plan (the \
name), plan_run and plan_case. A case that fails (unreachable, refused) is recorded with its \
reason and the plan goes on. The end prints the matrix (as `sonde compare --by case`) and the \
failures; --report writes the HTML report of the plan run. Ctrl-C keeps every finished run; \
`sonde plan run --resume ID` runs only the runs that run is missing (failed and \
interrupted ones included), with the plan it kept; a PLAN.toml given with --resume must be that \
plan unchanged (else exit 2).

Examples:
  sonde plan check zones.toml           the cases, their command lines, the time they take
  sonde plan run zones.toml --report zones.html
  sonde plan run --resume 12            the rest of plan run 12, with its plan
  sonde compare --by case group:12      the matrix of plan run 12 again

Exit codes:
    0  checked; or every case ran
    1  some case failed (the others ran: the summary lists the failures)
    2  usage error, or a bad plan file (the message names its line and column)
  130  interrupted (Ctrl-C; finished runs are kept: --resume runs the rest)
  143  stopped by SIGTERM (as for 130)"))]
pub(crate) struct Opt {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Check a plan: list its cases as command lines and the time they take; no packet sent
    Check(CheckOpt),
    /// Run a plan's cases one at a time, save every run, print the matrix
    Run(RunOpt),
}

#[derive(Debug, Args)]
#[command(after_long_help = PLAN_HELP)]
struct CheckOpt {
    /// The plan file
    #[arg(value_name = "PLAN.toml")]
    plan: PathBuf,
}

#[derive(Debug, Args)]
#[command(after_long_help = PLAN_HELP)]
struct RunOpt {
    /// The plan file (with --resume, optional: the plan run keeps the plan it ran; a file given
    /// must be that plan unchanged)
    #[arg(value_name = "PLAN.toml", required_unless_present = "resume")]
    plan: Option<PathBuf>,
    /// The order of repetitions: all cases once then again (interleaved), or each case's runs
    /// one after another (sequential)
    #[arg(long, value_enum, default_value_t = Order::Interleaved)]
    order: Order,
    /// Run only the runs plan run ID is missing (after Ctrl-C or failures), into that run, with
    /// the plan it ran
    #[arg(long, value_name = "ID")]
    resume: Option<i64>,
    /// Write the HTML report of the plan run's runs to FILE (as `sonde report`)
    #[arg(long, value_name = "FILE")]
    report: Option<PathBuf>,
    /// The matrix and the failures as one JSON document on stdout
    #[arg(short = 'J', long)]
    json: bool,
    /// The results database: a file or a PostgreSQL URL (postgres://...; when it cannot be
    /// reached, a new plan run runs into the default file, marked for `sonde results push`)
    /// [default: $SONDE_DB, else $XDG_DATA_HOME/sonde/results.db]
    #[arg(long, value_name = "PATH|URL")]
    db: Option<PathBuf>,
}

/// `--order`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Order {
    /// Every case once, then every case again
    Interleaved,
    /// All runs of a case, then the next case
    Sequential,
}

pub(crate) fn run(opt: &Opt) -> anyhow::Result<()> {
    match &opt.command {
        Command::Check(o) => check(o),
        Command::Run(o) => run_plan(o),
    }
}

// ---------------------------------------------------------------------------------------------
// plan check
// ---------------------------------------------------------------------------------------------

fn check(opt: &CheckOpt) -> anyhow::Result<()> {
    let plan = Plan::load(&opt.plan)?;
    print(&check_text(&plan, &opt.plan.display().to_string()))
}

/// What `plan check` prints.
pub(crate) fn check_text(plan: &Plan, file: &str) -> String {
    let runs: u32 = plan.cases.iter().map(|c| c.repeat).sum();
    let total: Duration = plan.cases.iter().map(|c| c.expected() * c.repeat).sum();
    let mut out = format!(
        "plan {} ({file}): {} case{}, {runs} run{}, {} of measuring (plus each run's setup)\n\n",
        plan.name,
        plan.cases.len(),
        plural(plan.cases.len()),
        plural(runs as usize),
        duration_text(total),
    );
    let rows: Vec<[String; 5]> = plan
        .cases
        .iter()
        .map(|c| {
            [
                c.index.to_string(),
                c.kind.name().to_owned(),
                c.name(),
                format!("{} x {}", c.repeat, duration_text(c.expected())),
                c.command_line(),
            ]
        })
        .collect();
    let header = ["case", "test", "axes", "runs", "command"].map(str::to_owned);
    let mut widths = [0; 5];
    for row in std::iter::once(&header).chain(&rows) {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let mut line = String::new();
        for (i, (cell, w)) in row.iter().zip(widths).enumerate() {
            if i == 4 {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<w$}  ");
            }
        }
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// `1h 2m 3s`, `2m 5s`, `12.5 s`.
fn duration_text(d: Duration) -> String {
    let secs = d.as_secs_f64();
    if secs < 60.0 {
        return format!("{} s", (secs * 10.0).round() / 10.0);
    }
    let s = d.as_secs();
    let (h, m, s) = (s / 3600, s / 60 % 60, s % 60);
    if h > 0 {
        format!("{h}h {m}m {s}s")
    } else {
        format!("{m}m {s}s")
    }
}

// ---------------------------------------------------------------------------------------------
// plan run
// ---------------------------------------------------------------------------------------------

/// One run to make: a case and which of its repetitions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Slot {
    case: usize,
    /// 1-based.
    rep: u32,
}

/// The runs to make, in order: `missing[i]` runs of case `i` (0-based), each case's missing
/// repetitions after the `repeat - missing` it has.
fn schedule(cases: &[Case], missing: &[u32], order: Order) -> Vec<Slot> {
    let slot = |i: usize, k: u32| Slot {
        case: i,
        rep: cases[i].repeat - missing[i] + k + 1,
    };
    match order {
        Order::Sequential => (0..cases.len())
            .flat_map(|i| (0..missing[i]).map(move |k| slot(i, k)))
            .collect(),
        Order::Interleaved => {
            let rounds = missing.iter().copied().max().unwrap_or(0);
            (0..rounds)
                .flat_map(|k| {
                    (0..cases.len())
                        .filter(move |&i| k < missing[i])
                        .map(move |i| slot(i, k))
                })
                .collect()
        }
    }
}

/// The labels of a case's runs.
fn case_labels(plan: &Plan, case: &Case, group: GroupId) -> Labels {
    let mut labels: Labels = case.axes.iter().cloned().collect();
    labels.insert(CASE_LABEL.into(), case.name());
    labels.insert("plan".into(), plan.name.clone());
    labels.insert("plan_run".into(), group.0.to_string());
    labels.insert("plan_case".into(), case.index.to_string());
    labels
}

fn run_plan(opt: &RunOpt) -> anyhow::Result<()> {
    // A new run's plan is checked before the database is opened.
    let fresh = match (opt.resume, &opt.plan) {
        (None, Some(path)) => {
            let text = Plan::read(path)?;
            let file = path.display().to_string();
            let plan = Plan::parse_file(&file, &text)?;
            Some((plan, GroupPlan { file, text }))
        }
        _ => None,
    };
    let db = crate::save::db_location(opt.db.as_deref())?;
    // A new plan run whose PostgreSQL database cannot be reached runs into the local file, every
    // run and failure marked to push; a resumed one needs the database that holds its runs.
    let (mut store, db, to_push) = match Store::open(&db) {
        Ok(store) => (store, db, false),
        Err(e)
            if matches!(db, Location::Postgres(_))
                && opt.resume.is_none()
                && crate::save::falls_back(&e) =>
        {
            let local = crate::save::open_fallback(&db, &e)
                .with_context(|| format!("opening the results database {db}"))?;
            let at = Location::File(crate::save::local_path()?);
            (local, at, true)
        }
        Err(e) => {
            return Err(anyhow::Error::new(e).context(format!("opening the results database {db}")))
        }
    };
    let (plan, group, missing) = match (opt.resume, fresh) {
        (None, Some((plan, source))) => {
            let g = store.new_plan_group(&source, sonde_client::now_unix_ms())?;
            let missing = plan.cases.iter().map(|c| c.repeat).collect::<Vec<_>>();
            (plan, g, missing)
        }
        (Some(id), _) => {
            let g = GroupId(id);
            let plan = resumed_plan(&store, g, opt.plan.as_deref(), &db)?;
            let missing = missing_runs(&store, g, &plan)?;
            (plan, g, missing)
        }
        (None, None) => unreachable!("clap requires PLAN.toml without --resume"),
    };
    let record = store
        .group(group)?
        .ok_or_else(|| anyhow::anyhow!("plan run {group} is missing from {db}"))?;
    let slots = schedule(&plan.cases, &missing, opt.order);
    let total = plan.cases.iter().map(|c| c.repeat).sum::<u32>();
    eprintln!(
        "sonde plan: {} run {group}: {} of {total} runs to make{}",
        plan.name,
        slots.len(),
        if opt.resume.is_some() {
            " (resumed)"
        } else {
            ""
        }
    );
    let interrupt = crate::interrupt::install();
    let planned: Duration = slots.iter().map(|s| plan.cases[s.case].expected()).sum();
    let started = Instant::now();
    let mut measured_so_far = Duration::ZERO;
    let mut failures: Vec<Failure> = Vec::new();
    let mut interrupted = false;
    for (k, slot) in slots.iter().enumerate() {
        if interrupt.check().is_err() {
            interrupted = true;
            break;
        }
        let case = &plan.cases[slot.case];
        // The estimate scales the planned time by how long the runs so far really took.
        let remaining = planned.saturating_sub(measured_so_far);
        let eta = if measured_so_far.is_zero() {
            remaining
        } else {
            remaining.mul_f64(started.elapsed().as_secs_f64() / measured_so_far.as_secs_f64())
        };
        eprintln!(
            "sonde plan: [{}/{}] case {} {} (run {} of {}): about {} left",
            k + 1,
            slots.len(),
            case.index,
            case.name(),
            slot.rep,
            case.repeat,
            duration_text(eta)
        );
        // On a terminal the test's own progress bar says where the plan is, too.
        crate::output::set_progress_prefix(&format!(
            "[{}/{}, about {} left] ",
            k + 1,
            slots.len(),
            duration_text(eta)
        ));
        let labels = case_labels(&plan, case, group);
        let mut saver = Saver::plan_case(db.clone(), record.clone(), labels.clone(), to_push)?;
        let result = spec::run_once(&case.spec, &mut saver);
        measured_so_far += case.expected();
        match result {
            Ok(()) => {}
            Err(e) if e.is::<crate::interrupt::Interrupted>() => {
                interrupted = true;
                break;
            }
            Err(e) => {
                if interrupt.check().is_err() {
                    interrupted = true;
                    break;
                }
                let reason = format!("{e:#}");
                eprintln!("sonde plan: case {} failed: {reason}", case.index);
                let failure = Failure {
                    group,
                    time_unix_ms: sonde_client::now_unix_ms(),
                    test: case.kind.name().to_owned(),
                    labels: labels
                        .iter()
                        .filter_map(|(k, v)| Label::new(k, v).ok())
                        .collect(),
                    reason,
                    exit_code: crate::exit::exit_code(&e),
                };
                if let Err(e) = store.insert_failure(&failure, to_push) {
                    eprintln!("sonde: warning: the failure was not saved: {e}");
                }
                failures.push(failure);
            }
        }
    }
    summary(opt, &plan, &db, group, &failures, interrupted)?;
    if interrupted {
        eprintln!("sonde plan: interrupted; `sonde plan run --resume {group}` runs the rest");
        return interrupt.check();
    }
    if !failures.is_empty() {
        anyhow::bail!(
            "{} of {} runs failed (see above); the others are saved in plan run {group}",
            failures.len(),
            slots.len()
        );
    }
    Ok(())
}

/// The plan of plan run `id` to resume: the one it kept, which a file given (`given`) must
/// equal; a plan run saved before plans were kept needs the file.
fn resumed_plan(
    store: &Store,
    g: GroupId,
    given: Option<&Path>,
    db: &Location,
) -> anyhow::Result<Plan> {
    let id = g.0;
    let grp = match store.group(g)? {
        Some(grp) if grp.kind == "plan" => grp,
        Some(grp) => {
            return Err(BadValue(format!(
                "--resume {id}: group {id} is a {} group, not a plan run",
                grp.kind
            ))
            .into())
        }
        None => return Err(BadValue(format!("--resume {id}: no plan run {id} in {db}")).into()),
    };
    let plan = match (grp.plan, given) {
        (Some(stored), None) => Plan::parse_file(&stored.file, &stored.text)?,
        (Some(stored), Some(path)) => {
            let text = Plan::read(path)?;
            if text != stored.text {
                return Err(BadValue(format!(
                    "--resume {id}: {} is not the plan that plan run {id} ran ({} as it was \
                     then): the cases would differ. `sonde plan run --resume {id}` without the \
                     file resumes with the plan it kept; `sonde plan run {}` starts a new run",
                    path.display(),
                    stored.file,
                    path.display()
                ))
                .into());
            }
            Plan::parse_file(&path.display().to_string(), &text)?
        }
        (None, None) => {
            return Err(BadValue(format!(
                "--resume {id}: plan run {id} was saved by an older sonde, which did not keep \
                 its plan: give its PLAN.toml"
            ))
            .into())
        }
        (None, Some(path)) => Plan::load(path)?,
    };
    Ok(plan)
}

/// How many runs of each case plan run `g` is missing (failed and interrupted ones count as
/// missing); refused if its runs are of another plan.
fn missing_runs(store: &Store, g: GroupId, plan: &Plan) -> anyhow::Result<Vec<u32>> {
    let id = g.0;
    let done = store.runs(&Filter {
        group: Some(g),
        ..Filter::default()
    })?;
    if let Some(other) = done.iter().find_map(|r| {
        r.labels
            .iter()
            .find(|l| l.key == "plan" && l.value != plan.name)
    }) {
        return Err(BadValue(format!(
            "--resume {id}: that run is of the plan \"{}\", not \"{}\"",
            other.value, plan.name
        ))
        .into());
    }
    Ok(plan
        .cases
        .iter()
        .map(|c| {
            let has = |r: &sonde_store::RunSummary, k: &str, v: &str| {
                r.labels.iter().any(|l| l.key == k && l.value == v)
            };
            let index = c.index.to_string();
            let name = c.name();
            let finished = done
                .iter()
                .filter(|r| {
                    !r.interrupted && has(r, "plan_case", &index) && has(r, CASE_LABEL, &name)
                })
                .count();
            c.repeat
                .saturating_sub(u32::try_from(finished).unwrap_or(u32::MAX))
        })
        .collect())
}

/// The end of a plan run: the matrix of its finished runs, the failures, the report.
fn summary(
    opt: &RunOpt,
    plan: &Plan,
    db: &Location,
    group: GroupId,
    failures: &[Failure],
    interrupted: bool,
) -> anyhow::Result<()> {
    let selection = crate::select::Selection::Store(Filter {
        group: Some(group),
        ..Filter::default()
    });
    let mut store = None;
    let loaded = match crate::select::load(&[selection], &mut store, Some(db)) {
        Ok(loaded) => loaded,
        // The shared database went away during the run: its runs are saved (there or in the
        // local file, to push); only the matrix, which reads them back, cannot be drawn now.
        Err(e) if matches!(db, Location::Postgres(_)) => {
            eprintln!(
                "sonde plan: warning: no matrix: {e:#}; `sonde compare group:{group}` draws it \
                 once the database is back and `sonde results push` has sent what waits locally"
            );
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let runs: Vec<sonde_report::compare::Run> = loaded
        .into_iter()
        .flatten()
        .filter(|r| !is_interrupted(&r.result))
        .collect();
    let tables = sonde_report::compare::matrix(&runs, CASE_LABEL)?;
    if opt.json {
        let matrix: serde_json::Value =
            serde_json::from_str(&sonde_report::render::matrix_json(&tables))?;
        let failures: Vec<serde_json::Value> = failures
            .iter()
            .map(|f| {
                serde_json::json!({
                    "test": f.test,
                    "labels": f.labels.iter().map(|l| (l.key.clone(), l.value.clone())).collect::<BTreeMap<_, _>>(),
                    "reason": f.reason,
                    "exit_code": f.exit_code,
                })
            })
            .collect();
        let doc = serde_json::json!({
            "plan": plan.name,
            "plan_run": group.0,
            "interrupted": interrupted,
            "matrix": matrix,
            "failures": failures,
        });
        print(&format!("{}\n", serde_json::to_string_pretty(&doc)?))?;
    } else {
        let mut text = format!("plan {} run {group}\n\n", plan.name);
        if tables.is_empty() {
            text.push_str("no finished runs\n");
        } else {
            text.push_str(&sonde_report::render::matrix_table(&tables));
        }
        if !failures.is_empty() {
            let _ = writeln!(text, "\nfailed:");
            for f in failures {
                let case = f
                    .labels
                    .iter()
                    .find(|l| l.key == CASE_LABEL)
                    .map_or("", |l| l.value.as_str());
                let _ = writeln!(text, "  {} {case}: {}", f.test, f.reason);
            }
        }
        let _ = writeln!(
            text,
            "\nsaved as plan run {group}: `sonde results --group {group}`, `sonde compare --by \
             case group:{group}`"
        );
        print(&text)?;
    }
    if let Some(path) = &opt.report {
        let title = format!("plan {} run {group}", plan.name);
        // The report names a case by its labels: the axis values, without the bookkeeping
        // every run of the plan shares (and `case`, which repeats the axes, where there are any).
        let report_runs: Vec<sonde_report::compare::Run> = runs
            .iter()
            .cloned()
            .map(|mut r| {
                r.labels
                    .retain(|k, _| !matches!(k.as_str(), "plan" | "plan_run" | "plan_case"));
                if r.labels.len() > 1 {
                    r.labels.remove(CASE_LABEL);
                }
                r
            })
            .collect();
        let page = sonde_report::render::html(&sonde_report::render::Report {
            title: &title,
            generated_unix_ms: sonde_client::now_unix_ms(),
            runs: &report_runs,
            comparison: None,
            layout: sonde_report::render::Layout::default(),
        });
        std::fs::write(path, page).with_context(|| format!("writing {}", path.display()))?;
        eprintln!(
            "sonde plan: report of {} runs written to {}",
            runs.len(),
            path.display()
        );
    }
    Ok(())
}

fn is_interrupted(result: &sonde_report::TestResult) -> bool {
    result.kind().interrupted()
}

#[cfg(test)]
mod tests {
    use super::*;

    const HEAD: &str = "[endpoints]\nb = \"198.18.0.2\"\nc = \"198.18.1.2:5301\"\n";

    fn parse(text: &str) -> Plan {
        Plan::parse("p.toml", "p", text).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn schedules_interleave_or_follow_each_other() {
        let p = parse(&format!(
            "{HEAD}[[matrix]]\ntest = \"crr\"\ntarget = [\"b\", \"c\"]\nrepeat = 2\n"
        ));
        let slots = |missing: &[u32], order| {
            schedule(&p.cases, missing, order)
                .into_iter()
                .map(|s| (s.case, s.rep))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            slots(&[2, 2], Order::Interleaved),
            [(0, 1), (1, 1), (0, 2), (1, 2)]
        );
        assert_eq!(
            slots(&[2, 2], Order::Sequential),
            [(0, 1), (0, 2), (1, 1), (1, 2)]
        );
        // Resumed: case 0 has both runs, case 1 one of two.
        assert_eq!(slots(&[0, 1], Order::Interleaved), [(1, 2)]);
    }
}
