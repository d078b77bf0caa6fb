//! `sonde results`: the saved runs, listed, shown again, exported, removed, and pushed to a
//! PostgreSQL database a team shares.

use std::fmt::Write as _;
use std::ops::ControlFlow;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Subcommand};
use serde_json::Value;
use sonde_report::export::Format;
use sonde_report::TestResult;
use sonde_store::{Filter, GroupId, Label, Location, PgUrl, Pushed, RunId, RunSummary, Store};

use crate::output::{print, OutputOpt};

/// Saved runs: list them, show one again, export, remove
///
/// Every test saves its result in the results database (unless --no-save). Without a
/// subcommand this lists the runs, newest first: id, start time, test, server, labels and the
/// headline figure. The filters narrow the list; every filter given must hold.
#[derive(Debug, Args)]
#[command(
    args_conflicts_with_subcommands = true,
    after_long_help = "\
Where the database is: --db PATH|URL, else $SONDE_DB, else $XDG_DATA_HOME/sonde/results.db
(~/.local/share/sonde/results.db). A URL postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE is a
PostgreSQL database a team shares: every command reads and writes it as it does the file.

Examples:
  sonde results                                   every run, newest first
  sonde results --last 10 --test latency          the ten newest latency runs
  sonde results --label path=private --since 7d   a case, over the last week
  sonde results --group 3                         the runs of one --repeat, quick, sweep or
                                                  plan run (`sonde plan run`)
  sonde results show 42                           run 42 as the test printed it
  sonde results show 42 --json                    its JSON document, exactly as printed
  sonde results export --test latency --csv > latency.csv
                                                  every latency run, for a spreadsheet
  sonde results export --label zone=other --json > runs.json
                                                  the documents, as one JSON array
  sonde results rm 41 42                          remove two runs
  sonde results push                              send the runs saved locally while the
                                                  PostgreSQL database in $SONDE_DB was unreachable
  sonde results push --to postgres://sonde@db.example/results --all
                                                  copy every local run to the team's database

Exit codes:
    0  done
    1  no such run, or the database could not be read or written
    2  usage error (bad option or value)"
)]
pub(crate) struct Opt {
    #[command(subcommand)]
    action: Option<Action>,
    #[command(flatten)]
    filter: FilterOpt,
    #[command(flatten)]
    output: OutputOpt,
    #[command(flatten)]
    db: DbOpt,
}

#[derive(Debug, Subcommand)]
enum Action {
    /// Print a saved run again, as the test printed it (table, --json or --csv)
    ///
    /// --json prints the stored document byte for byte; the table and CSV are rendered from it
    /// by this sonde's renderers.
    Show(ShowOpt),
    /// All runs that match, with their whole documents: --json (one array) or --csv
    ///
    /// CSV holds one test's runs (its columns differ from another test's): choose it with
    /// --test when the selection holds several. Each row starts with the run's id (`run_id`).
    Export(ExportOpt),
    /// Remove saved runs by id
    Rm(RmOpt),
    /// Copy local runs to a PostgreSQL database: those marked to push, all, or a selection
    ///
    /// A run saved while its PostgreSQL database could not be reached is in the local file,
    /// marked to push: `sonde results push` sends those (and the failed cases of plan runs
    /// saved with them) to --to, else to $SONDE_DB. --all copies every local run; SELECTIONs
    /// copy the runs they pick, as `sonde compare` takes them. Each run goes with its labels,
    /// histograms and group, in a transaction of its own, under its UUID: a run already there
    /// is not copied again, so a push that was interrupted (or is repeated) stores nothing
    /// twice. On error, run it again.
    #[command(after_long_help = crate::select::SELECTION_HELP)]
    Push(PushOpt),
}

#[derive(Debug, Args)]
struct PushOpt {
    /// The PostgreSQL database to copy to: `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`
    /// [default: $SONDE_DB, when it is such a URL]
    #[arg(long, value_name = "URL")]
    to: Option<PgUrl>,
    /// Copy every local run, not only those marked to push
    #[arg(long, conflicts_with = "selections")]
    all: bool,
    /// Copy the runs these select (as `sonde compare` takes them), not only those marked to push
    #[arg(value_name = "SELECTION", value_parser = parse_selection)]
    selections: Vec<Filter>,
    /// The local file to copy from [default: $SONDE_DB when it is a file, else
    /// $XDG_DATA_HOME/sonde/results.db, where runs wait when the database is unreachable]
    #[arg(long, value_name = "PATH")]
    db: Option<PathBuf>,
}

fn parse_selection(s: &str) -> Result<Filter, String> {
    match crate::select::parse(s) {
        Ok(crate::select::Selection::Store(f)) => Ok(f),
        Ok(crate::select::Selection::File(p)) => Err(format!(
            "{}: a file is not a stored run; push copies runs of the local database",
            p.display()
        )),
        Err(e) => Err(e.0),
    }
}

#[derive(Debug, Args)]
struct ShowOpt {
    /// The run's id, as `sonde results` lists it
    #[arg(value_name = "ID")]
    id: i64,
    #[command(flatten)]
    output: OutputOpt,
    #[command(flatten)]
    db: DbOpt,
}

#[derive(Debug, Args)]
struct ExportOpt {
    #[command(flatten)]
    filter: FilterOpt,
    #[command(flatten)]
    output: ExportFormat,
    #[command(flatten)]
    db: DbOpt,
}

#[derive(Debug, Args)]
#[group(required = true, multiple = false)]
struct ExportFormat {
    /// The documents as one JSON array, newest first
    #[arg(short = 'J', long)]
    json: bool,
    /// CSV: one header, then each run's rows (as `--csv` prints them), newest first
    #[arg(long)]
    csv: bool,
}

#[derive(Debug, Args)]
struct RmOpt {
    /// The ids of the runs to remove
    #[arg(value_name = "ID", required = true)]
    ids: Vec<i64>,
    #[command(flatten)]
    db: DbOpt,
}

#[derive(Debug, Args)]
struct DbOpt {
    /// The results database: a file, or a PostgreSQL URL (postgres://...)
    /// [default: $SONDE_DB, else $XDG_DATA_HOME/sonde/results.db]
    #[arg(long, value_name = "PATH|URL")]
    db: Option<PathBuf>,
}

/// Which runs: every filter given must hold.
#[derive(Debug, Args)]
struct FilterOpt {
    /// Only runs of this test (latency, throughput, pps, crr, load, mtu)
    #[arg(long, value_name = "TEST")]
    test: Option<String>,
    /// Only runs with this label (repeatable: all must match)
    #[arg(long = "label", value_name = "KEY=VALUE", value_parser = parse_label)]
    labels: Vec<Label>,
    /// Only runs started since: a time ago (30m, 12h, 7d, 2w) or a UTC date or time
    /// (2026-11-25, 2026-11-25T14:00:00)
    #[arg(long, value_name = "WHEN", value_parser = parse_since)]
    since: Option<u64>,
    /// Only the newest N runs (of those that match the other filters)
    #[arg(long, value_name = "N")]
    last: Option<u64>,
    /// Only the runs of one group (a --repeat, a quick, a sweep, a plan run)
    #[arg(long, value_name = "ID")]
    group: Option<i64>,
}

impl FilterOpt {
    fn filter(&self) -> Filter {
        Filter {
            test: self.test.clone(),
            labels: self.labels.clone(),
            since_unix_ms: self.since,
            last: self.last,
            group: self.group.map(GroupId),
            ..Filter::default()
        }
    }
}

fn parse_label(s: &str) -> Result<Label, String> {
    s.parse::<Label>().map_err(|e| e.to_string())
}

pub(crate) fn run(opt: &Opt) -> anyhow::Result<()> {
    match &opt.action {
        None => list(opt),
        Some(Action::Show(o)) => show(o),
        Some(Action::Export(o)) => export(o),
        Some(Action::Rm(o)) => rm(o),
        Some(Action::Push(o)) => push(o),
    }
}

/// Opens the database for reading: `None` (with a note on stderr) when there is none yet.
fn open(db: &DbOpt) -> anyhow::Result<Option<Store>> {
    let at = crate::save::db_location(db.db.as_deref())?;
    match Store::open_existing(&at) {
        Ok(s) => Ok(Some(s)),
        Err(sonde_store::Error::Missing { .. }) => {
            eprintln!("sonde: no results saved yet in {at}");
            Ok(None)
        }
        Err(e @ sonde_store::Error::Unreachable { .. }) => {
            let hint = match crate::save::local_path() {
                Ok(local) => format!(
                    " (runs saved while it is unreachable wait in {0}: `sonde results --db {0}` \
                     lists them)",
                    local.display()
                ),
                Err(_) => String::new(),
            };
            Err(anyhow::anyhow!("{e}{hint}"))
        }
        Err(e) => Err(e.into()),
    }
}

fn list(opt: &Opt) -> anyhow::Result<()> {
    let mut failures = Vec::new();
    let runs = match open(&opt.db)? {
        Some(store) => {
            // A plan run's cases that ran no test are part of what the group holds.
            if let Some(g) = opt.filter.group {
                failures = store.failures(GroupId(g))?;
            }
            store.runs(&opt.filter.filter())?
        }
        None => Vec::new(),
    };
    let text = match opt.output.format() {
        Format::Json => {
            let rows: Vec<Value> = runs.iter().map(summary_json).collect();
            let mut s = serde_json::to_string_pretty(&rows)?;
            s.push('\n');
            s
        }
        Format::Csv => list_csv(&runs),
        // A list is not a stream: --json-stream lists as a table.
        Format::Table | Format::JsonStream => {
            let mut t = list_table(&runs);
            if !failures.is_empty() {
                t.push_str("\nfailed (ran no test):\n");
                for f in &failures {
                    let _ = writeln!(
                        t,
                        "  {}  {}  {}: {} (exit code {})",
                        utc(f.time_unix_ms),
                        f.test,
                        labels_text(&f.labels, " "),
                        f.reason,
                        f.exit_code
                    );
                }
            }
            t
        }
    };
    print(&text)
}

fn labels_text(labels: &[Label], sep: &str) -> String {
    labels
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(sep)
}

/// One run as `sonde results --json` lists it (fields in this order).
#[derive(serde::Serialize)]
struct Listed<'a> {
    id: i64,
    uuid: String,
    time_unix_ms: u64,
    test: &'a str,
    protocol: Option<&'a str>,
    server: Option<&'a str>,
    labels: sonde_report::Labels,
    group: Option<i64>,
    interrupted: bool,
    to_push: bool,
    rtt_mean_ns: Option<f64>,
    rtt_p50_ns: Option<u64>,
    rtt_p99_ns: Option<u64>,
    rtt_p9999_ns: Option<u64>,
    bits_per_second: Option<f64>,
    packets_per_second: Option<f64>,
    connections_per_second: Option<f64>,
    loss_percent: Option<f64>,
}

fn summary_json(r: &RunSummary) -> Value {
    let h = &r.headline;
    serde_json::to_value(Listed {
        id: r.id.0,
        uuid: r.uuid.to_string(),
        time_unix_ms: r.time_unix_ms,
        test: &r.test,
        protocol: r.protocol.as_deref(),
        server: r.server.as_deref(),
        labels: r
            .labels
            .iter()
            .map(|l| (l.key.clone(), l.value.clone()))
            .collect(),
        group: r.group.map(|g| g.0),
        interrupted: r.interrupted,
        to_push: r.to_push,
        rtt_mean_ns: h.rtt_mean_ns,
        rtt_p50_ns: h.rtt_p50_ns,
        rtt_p99_ns: h.rtt_p99_ns,
        rtt_p9999_ns: h.rtt_p9999_ns,
        bits_per_second: h.bits_per_second,
        packets_per_second: h.packets_per_second,
        connections_per_second: h.connections_per_second,
        loss_percent: h.loss_percent,
    })
    .unwrap_or(Value::Null)
}

const LIST_CSV_COLUMNS: [&str; 18] = [
    "id",
    "time_unix_ms",
    "test",
    "protocol",
    "server",
    "labels",
    "group",
    "interrupted",
    "rtt_mean_ns",
    "rtt_p50_ns",
    "rtt_p99_ns",
    "rtt_p9999_ns",
    "bits_per_second",
    "packets_per_second",
    "connections_per_second",
    "loss_percent",
    "uuid",
    "to_push",
];

fn list_csv(runs: &[RunSummary]) -> String {
    let mut out = LIST_CSV_COLUMNS.join(",");
    out.push('\n');
    for r in runs {
        let v = summary_json(r);
        let cells: Vec<String> = LIST_CSV_COLUMNS
            .iter()
            .map(|c| match (*c, &v[*c]) {
                ("labels", _) => csv_quote(&labels_text(&r.labels, ";")),
                (_, Value::Null) => String::new(),
                (_, Value::String(s)) => csv_quote(s),
                (_, other) => other.to_string(),
            })
            .collect();
        out.push_str(&cells.join(","));
        out.push('\n');
    }
    out
}

/// RFC 4180: quoted when it holds a comma, a quote or a line break.
fn csv_quote(s: &str) -> String {
    if s.contains([',', '"', '\n', '\r']) {
        format!("\"{}\"", s.replace('"', "\"\""))
    } else {
        s.to_owned()
    }
}

fn list_table(runs: &[RunSummary]) -> String {
    let header = ["id", "time (UTC)", "test", "server", "labels", "headline"];
    let rows: Vec<[String; 6]> = runs
        .iter()
        .map(|r| {
            let proto = r
                .protocol
                .as_deref()
                .map_or(String::new(), |p| format!(" {p}"));
            let group = r.group.map_or(String::new(), |g| format!(" (group {g})"));
            [
                r.id.to_string(),
                utc(r.time_unix_ms),
                format!("{}{proto}{group}", r.test),
                r.server.clone().unwrap_or_default(),
                labels_text(&r.labels, " "),
                headline(r),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[&str]| {
        let mut s = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                s.push_str(cell);
            } else {
                let pad = w - cell.chars().count();
                s.push_str(cell);
                s.push_str(&" ".repeat(pad + 2));
            }
        }
        s.trim_end().to_owned() + "\n"
    };
    let mut out = line(&header);
    for row in &rows {
        let cells: Vec<&str> = row.iter().map(String::as_str).collect();
        out.push_str(&line(&cells));
    }
    if rows.is_empty() {
        out.push_str("(no runs)\n");
    }
    out
}

/// The run's headline figure, for people.
fn headline(r: &RunSummary) -> String {
    let h = &r.headline;
    let us = |ns: u64| format!("{:.2} µs", ns as f64 / 1e3);
    let mut parts = Vec::new();
    match (h.rtt_p50_ns, h.rtt_p99_ns, h.rtt_mean_ns) {
        (Some(p50), Some(p99), _) => parts.push(format!("RTT p50 {}, p99 {}", us(p50), us(p99))),
        (Some(p50), None, _) => parts.push(format!("RTT p50 {}", us(p50))),
        (None, _, Some(mean)) => parts.push(format!("RTT mean {:.2} µs", mean / 1e3)),
        _ => {}
    }
    if let Some(bps) = h.bits_per_second {
        parts.push(if bps >= 1e9 {
            format!("{:.3} Gbit/s", bps / 1e9)
        } else {
            format!("{:.3} Mbit/s", bps / 1e6)
        });
    }
    if let Some(pps) = h.packets_per_second {
        parts.push(format!("{pps:.0} pps"));
    }
    if let Some(cps) = h.connections_per_second {
        parts.push(format!("{cps:.0} connections/s"));
    }
    if let Some(loss) = h.loss_percent.filter(|l| *l > 0.0) {
        parts.push(format!("lost {loss:.2}%"));
    }
    if r.interrupted {
        parts.push("interrupted".into());
    }
    if r.to_push {
        parts.push("to push".into());
    }
    parts.join(", ")
}

fn show(o: &ShowOpt) -> anyhow::Result<()> {
    let Some(store) = open(&o.db)? else {
        return Err(no_such_run(o.id));
    };
    let run = store.run(RunId(o.id))?.ok_or_else(|| no_such_run(o.id))?;
    if o.output.format() == Format::Json {
        // Exactly as the test printed it.
        return print(&run.document);
    }
    let result: TestResult = serde_json::from_str(&run.document).map_err(|e| {
        anyhow::anyhow!(
            "run {}: its document does not read as a result of this sonde ({e}); --json prints it as stored",
            o.id
        )
    })?;
    print(&o.output.render(&result))
}

/// A run id that is not in the database (exit code 1).
fn no_such_run(id: i64) -> anyhow::Error {
    anyhow::anyhow!("no run {id} in the results database (`sonde results` lists them)")
}

fn export(o: &ExportOpt) -> anyhow::Result<()> {
    let runs = match open(&o.db)? {
        Some(store) => store.documents(&o.filter.filter())?,
        None => Vec::new(),
    };
    if o.output.json {
        let docs: Vec<&str> = runs.iter().map(|r| r.document.trim_end()).collect();
        let text = if docs.is_empty() {
            "[]\n".to_owned()
        } else {
            format!("[\n{}\n]\n", docs.join(",\n"))
        };
        return print(&text);
    }
    let mut tests: Vec<&str> = runs.iter().map(|r| r.summary.test.as_str()).collect();
    tests.sort_unstable();
    tests.dedup();
    if tests.len() > 1 {
        return Err(crate::units::BadValue(format!(
            "the runs are of several tests ({}), whose CSV columns differ: choose one with --test",
            tests.join(", ")
        ))
        .into());
    }
    let mut out = String::new();
    for (i, run) in runs.iter().enumerate() {
        let result: TestResult = serde_json::from_str(&run.document).map_err(|e| {
            anyhow::anyhow!(
                "run {}: its document does not read as a result of this sonde ({e})",
                run.summary.id
            )
        })?;
        if i == 0 {
            out.push_str("run_id,");
            out.push_str(&sonde_report::render::csv_header(&result));
        }
        for line in sonde_report::render::csv_rows(&result).lines() {
            out.push_str(&format!("{},{line}\n", run.summary.id));
        }
    }
    print(&out)
}

fn rm(o: &RmOpt) -> anyhow::Result<()> {
    let Some(mut store) = open(&o.db)? else {
        return Err(no_such_run(o.ids[0]));
    };
    let ids: Vec<RunId> = o.ids.iter().copied().map(RunId).collect();
    let removed = store.delete(&ids)?;
    for id in &removed {
        eprintln!("removed run {id}");
    }
    match ids.iter().find(|id| !removed.contains(id)) {
        Some(missing) => Err(no_such_run(missing.0)),
        None => Ok(()),
    }
}

/// `sonde results push`: copies local runs to a PostgreSQL database, one transaction each,
/// idempotent by UUID.
fn push(o: &PushOpt) -> anyhow::Result<()> {
    let env = std::env::var_os(crate::save::DB_ENV)
        .filter(|v| !v.is_empty())
        .map(Location::new);
    let remote = match (&o.to, &env) {
        (Some(url), _) => Location::Postgres(url.clone()),
        (None, Some(at @ Location::Postgres(_))) => at.clone(),
        (None, _) => {
            return Err(crate::units::BadValue(format!(
                "where to? give --to postgres://USER@HOST/DATABASE, or set {} to such a URL",
                crate::save::DB_ENV
            ))
            .into())
        }
    };
    let local = match (&o.db, &env) {
        (Some(p), _) => match Location::from(p) {
            Location::File(p) => p,
            Location::Postgres(_) => {
                return Err(crate::units::BadValue(
                    "--db: push copies from a local file, not from a PostgreSQL database".into(),
                )
                .into())
            }
        },
        (None, Some(Location::File(p))) => p.clone(),
        (None, _) => crate::save::local_path()?,
    };
    let mut from = match Store::open_existing(&local) {
        Ok(s) => s,
        Err(sonde_store::Error::Missing { .. }) => {
            eprintln!(
                "sonde: nothing to push: no results saved in {}",
                local.display()
            );
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    let filters = if o.all {
        vec![Filter::default()]
    } else if o.selections.is_empty() {
        vec![Filter {
            to_push: true,
            ..Filter::default()
        }]
    } else {
        o.selections.clone()
    };
    let mut to = Store::open(&remote)?;
    let (mut copied, mut there, mut failures) = (0, 0, 0);
    for filter in &filters {
        let result = from.push(&mut to, filter, |p| {
            if let Pushed::Run { run, inserted } = p {
                let what = match inserted {
                    sonde_store::Inserted::New(_) => "copied",
                    sonde_store::Inserted::AlreadyThere(_) => "already there",
                };
                eprintln!(
                    "sonde: run {} ({}): {what} as run {}",
                    run.id,
                    run.test,
                    inserted.id()
                );
            }
            ControlFlow::Continue(())
        });
        match result {
            Ok(count) => {
                copied += count.copied;
                there += count.already_there;
                failures += count.failures_copied;
            }
            Err(e) => {
                return Err(anyhow::Error::new(e).context(format!(
                    "pushing to {remote} ({copied} runs copied before this): run `sonde results \
                     push` again, runs already there are not copied twice"
                )))
            }
        }
    }
    let failures = if failures > 0 {
        format!(", {failures} failed cases of plan runs")
    } else {
        String::new()
    };
    print(&format!(
        "pushed {copied} runs to {remote} ({there} already there{failures})\n"
    ))
}

/// `--since`: a time ago (`30m`, `12h`, `7d`, `2w`, `90s`) or a UTC date (`2026-11-25`) or time
/// (`2026-11-25T14:00:00`, `2026-11-25 14:00`), as ms since the Unix epoch.
fn parse_since(s: &str) -> Result<u64, String> {
    let bad = || {
        format!(
            "{s:?}: expected a time ago (30m, 12h, 7d, 2w) or a UTC date or time (2026-11-25, \
             2026-11-25T14:00:00)"
        )
    };
    let s = s.trim();
    if let Some(unit) = s
        .chars()
        .last()
        .filter(|c| c.is_ascii_alphabetic() && !s.contains('-'))
    {
        let n: u64 = s[..s.len() - 1].parse().map_err(|_| bad())?;
        let secs = match unit {
            's' => 1,
            'm' => 60,
            'h' => 3_600,
            'd' => 86_400,
            'w' => 7 * 86_400,
            _ => return Err(bad()),
        };
        let ago = Duration::from_secs(n.saturating_mul(secs));
        let now = Duration::from_millis(sonde_client::now_unix_ms());
        return Ok(u64::try_from(now.saturating_sub(ago).as_millis()).unwrap_or(u64::MAX));
    }
    let (date, time) = match s.split_once(['T', ' ']) {
        Some((d, t)) => (d, Some(t.trim_end_matches('Z'))),
        None => (s, None),
    };
    let mut d = date.splitn(3, '-').map(str::parse::<i64>);
    let (Some(Ok(y)), Some(Ok(m)), Some(Ok(day))) = (d.next(), d.next(), d.next()) else {
        return Err(bad());
    };
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) {
        return Err(bad());
    }
    let mut secs = days_from_civil(y, m, day) * 86_400;
    if let Some(t) = time {
        let mut parts = t.split(':').map(str::parse::<i64>);
        let h = parts.next().and_then(Result::ok).ok_or_else(bad)?;
        let min = parts.next().and_then(Result::ok).ok_or_else(bad)?;
        let sec = parts.next().map_or(Ok(0), |p| p.map_err(|_| bad()))?;
        if parts.next().is_some() || h > 23 || min > 59 || sec > 60 {
            return Err(bad());
        }
        secs += h * 3_600 + min * 60 + sec;
    }
    u64::try_from(secs * 1_000).map_err(|_| bad())
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// `YYYY-MM-DD HH:MM:SS` in UTC (Howard Hinnant's `civil_from_days`).
fn utc(unix_ms: u64) -> String {
    let secs = i64::try_from(unix_ms / 1_000).unwrap_or(i64::MAX);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        rem / 3_600,
        rem % 3_600 / 60,
        rem % 60
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_times_ago_parse() {
        assert_eq!(parse_since("1970-01-01"), Ok(0));
        assert_eq!(parse_since("2024-05-01T12:00:00"), Ok(1_714_564_800_000));
        assert_eq!(parse_since("2024-05-01 12:00"), Ok(1_714_564_800_000));
        assert_eq!(parse_since("2024-05-01T12:00:00Z"), Ok(1_714_564_800_000));
        assert_eq!(utc(1_714_564_800_000), "2024-05-01 12:00:00");
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        let now = sonde_client::now_unix_ms();
        let day_ago = parse_since("1d").expect("1d");
        assert!(day_ago <= now - 86_400_000 && day_ago > now - 86_400_000 - 60_000);
        for bad in ["yesterday", "7x", "2024-13-01", "2024-05-01T25:00", "d"] {
            assert!(parse_since(bad).is_err(), "{bad}");
        }
    }
}
