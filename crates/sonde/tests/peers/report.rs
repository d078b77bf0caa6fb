//! `sonde report` in a real browser: Debian's `chromium`, headless, opens a generated report from
//! a file and the test reads the DOM it ends with: every chart drawn (an SVG in each chart's
//! slot), every case row, no script error or console error, no resource from a network. Scripts
//! the tests append to their copy of a page measure the chart labels' boxes and run the exports,
//! and write what they found into the DOM. A screenshot and the page are kept as artifacts
//! (`$SONDE_ARTIFACT_DIR`, else Cargo's target/tmp).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{require_or_skip, run_with_timeout, Need};
use sonde_engine::rtt::RttRecorder;
use sonde_report::compare::{compare, Run};
use sonde_report::render::{html, Layout, Report};
use sonde_report::{Protocol, TestResult};

/// One of sonde-report's fixture documents, from its JSON snapshot (kept equal to the model by
/// sonde-report's snapshot tests).
fn fixture(name: &str) -> TestResult {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../sonde-report/src/snapshots")
        .join(format!("sonde_report__render__tests__{name}_json.snap"));
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    // An insta snapshot: a `---` header block, then the document.
    let body = text
        .splitn(3, "---\n")
        .nth(2)
        .unwrap_or_else(|| panic!("{}: no snapshot header", path.display()));
    serde_json::from_str(body).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Where artifacts go: `$SONDE_ARTIFACT_DIR` or Cargo's scratch directory for integration tests.
fn artifact_dir() -> PathBuf {
    let dir = std::env::var_os("SONDE_ARTIFACT_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_TARGET_TMPDIR")), PathBuf::from);
    std::fs::create_dir_all(&dir).expect("artifact directory");
    dir
}

/// Headless chromium on `page` with a fresh profile and nothing that phones home; `extra` picks
/// the output (`--dump-dom`, `--screenshot=...`, `--print-to-pdf=...`). Returns stdout.
fn chromium(page: &Path, extra: &[&str]) -> String {
    let profile = tempfile::tempdir().expect("profile dir");
    let mut cmd = Command::new("chromium");
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--virtual-time-budget=10000",
    ])
    .arg(format!("--user-data-dir={}", profile.path().display()))
    .args(extra)
    .arg(format!("file://{}", page.display()));
    let out =
        run_with_timeout(&mut cmd, Duration::from_secs(120)).unwrap_or_else(|e| panic!("{e}"));
    assert!(
        out.status.success(),
        "chromium failed ({})\n{}",
        out.status,
        out.stderr
    );
    out.stdout
}

/// The value of attribute `name` on the dumped document's `<html>` element.
fn root_attr<'a>(dom: &'a str, name: &str) -> Option<&'a str> {
    let start = dom.find("<html")?;
    let tag = &dom[start..start + dom[start..].find('>')?];
    let key = format!(" {name}=\"");
    let from = tag.find(&key)? + key.len();
    Some(&tag[from..from + tag[from..].find('"')?])
}

/// Checks a report in the browser: `charts` chart slots each with its SVG drawing, each of
/// `rows` as a table row, no error. Keeps a screenshot under `shot`.
pub(crate) fn check_in_browser(page: &Path, charts: usize, rows: &[&str], shot: &str) -> String {
    let html = std::fs::read_to_string(page).expect("report");
    // Nothing to fetch: no attribute or CSS that loads from anywhere.
    for pat in ["src=", "href=", "url(", "@import", "http://", "fetch("] {
        assert!(!html.contains(pat), "the report contains {pat:?}");
    }
    assert!(!html.contains("https://"), "the report contains https://");

    // The page beside its screenshot, kept before anything can fail.
    let png = artifact_dir().join(shot);
    let _ = std::fs::copy(page, png.with_extension("html"));
    let dom = chromium(page, &["--dump-dom"]);
    assert_eq!(
        root_attr(&dom, "data-errors"),
        Some("0"),
        "errors in the page: {:?}",
        root_attr(&dom, "data-error-messages")
    );
    assert_eq!(root_attr(&dom, "data-ready"), Some("1"), "charts not drawn");
    assert_eq!(
        root_attr(&dom, "data-charts"),
        Some(charts.to_string().as_str())
    );
    assert_eq!(dom.matches("data-chart=\"").count(), charts);
    // One SVG drawing in each chart's slot, with its export buttons after it; and after each
    // table (the page before its data and scripts, which spell the same tags).
    let body = &dom[..dom.find("id=\"sonde-data\"").expect("the page's data")];
    assert_eq!(body.matches("<svg ").count(), charts, "drawings");
    assert_eq!(
        body.matches("<div class=\"tools\">").count(),
        charts + body.matches("<table data-table=").count(),
        "export buttons"
    );
    for row in rows {
        assert!(
            dom.contains(&format!("<tr data-case=\"{row}\"")),
            "no row for case {row}"
        );
    }
    screenshot(page, &png, "1400,2000");
    dom
}

/// A screenshot of `page` at `window` ("W,H") into `png`, kept as an artifact; it must be more
/// than a blank page's few bytes.
fn screenshot(page: &Path, png: &Path, window: &str) {
    let _ = std::fs::remove_file(png);
    chromium(
        page,
        &[
            &format!("--screenshot={}", png.display()),
            &format!("--window-size={window}"),
        ],
    );
    let size = std::fs::metadata(png).map(|m| m.len()).unwrap_or(0);
    assert!(
        size > 10_000,
        "screenshot {} is {size} bytes",
        png.display()
    );
    eprintln!("screenshot: {}", png.display());
}

#[test]
fn report_opens_in_chromium_with_every_chart_and_no_error() {
    let _file = crate::common::file_lock(module_path!());
    if !require_or_skip(
        "report_opens_in_chromium_with_every_chart_and_no_error",
        &[Need::Cmd("chromium")],
    ) {
        return;
    }
    // Two latency cases, one with a histogram made here (a tail of 1 in 1,000 at 10x), one from
    // its document alone; a throughput run with 2 streams; a run with warnings.
    let mut private = Run::new("1", fixture("latency_tcp"));
    private.labels.insert("path".into(), "private".into());
    let mut h = RttRecorder::new(0);
    for i in 0..250_000u64 {
        let base = 31_000 + (i * 7_919) % 12_000;
        h.record(0, if i % 1_000 == 0 { base * 10 } else { base });
    }
    private.rtt = Some(h);
    // Labelled in its document: path=public, zone=other.
    let public = Run::new("2", fixture("latency_udp_lossy"));
    let runs = vec![
        private,
        public,
        Run::new("3", fixture("latency_with_warnings")),
        Run::new("4", fixture("throughput_tcp_2_streams")),
        Run::new("5", fixture("throughput_tcp_context")),
    ];
    let c = compare(&runs[..1], &runs[1..2], 0.05)
        .unwrap()
        .named("label:path=private", "label:path=public");
    let page = html(&Report {
        title: "sonde report (browser test)",
        generated_unix_ms: 1_714_564_800_000,
        runs: &runs,
        comparison: Some(&c),
        layout: Layout::default(),
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report.html");
    std::fs::write(&path, page).unwrap();
    // Bars, distribution, two throughput runs.
    let dom = check_in_browser(
        &path,
        4,
        &[
            "path=private",
            "path=public zone=other",
            "run 3",
            "run 4",
            "run 5",
        ],
        "report-fixtures.png",
    );
    assert!(dom.contains("<table data-table=\"compare\">"));
    assert!(dom.contains("data-warning"));
}

#[test]
fn a_report_of_from_runs_shows_each_helpers_share_in_chromium() {
    let _file = crate::common::file_lock(module_path!());
    if !require_or_skip(
        "a_report_of_from_runs_shows_each_helpers_share_in_chromium",
        &[Need::Cmd("chromium")],
    ) {
        return;
    }
    let runs = vec![
        Run::new("6", fixture("pps_from_helpers")),
        Run::new("7", fixture("throughput_from_helpers")),
        Run::new("8", fixture("latency_from_helpers")),
    ];
    let page = html(&Report {
        title: "sonde report of --from runs (browser test)",
        generated_unix_ms: 1_714_564_800_000,
        runs: &runs,
        comparison: None,
        layout: Layout::default(),
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report-from.html");
    std::fs::write(&path, page).unwrap();
    // Bars and distribution of the latency run, the throughput run over time.
    let dom = check_in_browser(&path, 3, &[], "report-from-helpers.png");
    // Each run's share table, one row per helper, as the browser has it.
    for run in ["6", "7", "8"] {
        let start = dom
            .find(&format!("<table data-table=\"helpers\" data-run=\"{run}\""))
            .unwrap_or_else(|| panic!("no share table of run {run} in the page"));
        let table = &dom[start..start + dom[start..].find("</table>").expect("table end")];
        for helper in ["198.18.2.2:5300", "198.18.3.2:5300"] {
            assert!(
                table.contains(&format!("<tr data-helper=\"{helper}\"")),
                "run {run}: no row of {helper}: {table}"
            );
        }
    }
    assert!(dom.contains("<td>580,413</td>"), "pps share: received pps");
    assert!(
        dom.contains("<td>4.710 Gbit/s</td>"),
        "throughput share: bit/s"
    );
}

// ---------------------------------------------------------------------------------------------
// `sonde compare` and `sonde report` end to end: real runs against an agent on loopback, saved
// in a scratch database and as --json files.
// ---------------------------------------------------------------------------------------------

/// No single run in these tests may take longer.
const RUN_LIMIT: Duration = Duration::from_secs(60);

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// `sonde ARGS...` with the database `db` (`SONDE_DB` too, so that nothing reaches the home).
fn sonde(db: &Path, args: &[&str]) -> Out {
    let mut cmd = assert_cmd::Command::cargo_bin("sonde").expect("the sonde binary");
    let out = cmd
        .timeout(RUN_LIMIT)
        .env("SONDE_DB", db)
        .env("COLUMNS", "100")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("`sonde {}`: {e}", args.join(" ")));
    Out {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn sonde_ok(db: &Path, args: &[&str]) -> String {
    let out = sonde(db, args);
    assert_eq!(
        out.code,
        Some(0),
        "`sonde {}` failed\n--- stdout ---\n{}\n--- stderr ---\n{}",
        args.join(" "),
        out.stdout,
        out.stderr
    );
    out.stdout
}

/// One short latency run against `agent`, saved in `db`; its document.
fn latency_run(db: &Path, agent: &common::Agent, extra: &[&str]) -> serde_json::Value {
    let target = agent.target();
    let mut args = vec![
        "latency",
        target.as_str(),
        "-t",
        "1",
        "--warmup",
        "0",
        "--json",
    ];
    args.extend_from_slice(extra);
    serde_json::from_str(&sonde_ok(db, &args)).expect("a JSON document")
}

#[test]
fn compare_saved_documents_and_stored_runs_and_fail_if_worse() {
    let _file = crate::common::file_lock(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("results.db");
    let agent = common::Agent::start("127.0.0.1");
    let a = latency_run(&db, &agent, &[]);
    let b = latency_run(&db, &agent, &[]);
    let (fa, fb) = (dir.path().join("a.json"), dir.path().join("b.json"));
    std::fs::write(&fa, a.to_string()).unwrap();
    std::fs::write(&fb, b.to_string()).unwrap();
    let (fa, fb) = (fa.to_str().unwrap(), fb.to_str().unwrap());

    // Files: every figure, A and B as the documents state them, one run a side: untested.
    let c: serde_json::Value =
        serde_json::from_str(&sonde_ok(&db, &["compare", fa, fb, "--json"])).unwrap();
    assert_eq!(c["test"], "latency");
    let row = |c: &serde_json::Value, figure: &str| {
        c["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["figure"] == figure)
            .unwrap_or_else(|| panic!("no {figure} in {c:#}"))
            .clone()
    };
    let mean = row(&c, "rtt_mean_ns");
    assert_eq!(mean["a"], a["rtt_ns"]["mean"]);
    assert_eq!(mean["b"], b["rtt_ns"]["mean"]);
    assert_eq!(mean["significance"]["kind"], "needs_repeat");
    for figure in [
        "rtt_p50_ns",
        "rtt_p99_ns",
        "rtt_p999_ns",
        "rtt_p9999_ns",
        "rtt_max_ns",
    ] {
        row(&c, figure);
    }
    // A percentile the run cannot support is n/a, with what can be used instead.
    let p9999 = row(&c, "rtt_p9999_ns");
    if a["rtt_ns"]["p9999"].is_null() {
        assert!(p9999["a"].is_null());
        assert_eq!(p9999["a_thin"]["samples"], a["samples"]);
        assert_eq!(p9999["a_thin"]["samples_needed"], 100_000);
        assert!(p9999["a_thin"]["run_needed_ns"].as_u64().unwrap() > 0);
    }

    // The same two runs from the database: by id (the first two runs saved), and as a table.
    let table = sonde_ok(&db, &["compare", "1", "2", "--db", db.to_str().unwrap()]);
    assert!(table.starts_with("sonde compare: latency\n"), "{table}");
    for line in ["RTT mean", "RTT p50", "RTT p99.99", "RTT max"] {
        assert!(table.contains(line), "{line}:\n{table}");
    }
    assert!(table.contains("needs --repeat 5"), "{table}");

    // --fail-if-worse: B with every RTT doubled is worse by 100%; the other way round it is not.
    let mut worse = a.clone();
    for k in ["min", "mean", "p50", "p90", "p99", "p999", "max"] {
        if let Some(v) = worse["rtt_ns"][k].as_f64() {
            worse["rtt_ns"][k] = if k == "mean" {
                serde_json::json!(v * 2.0)
            } else {
                serde_json::json!(v as u64 * 2)
            };
        }
    }
    let fw = dir.path().join("worse.json");
    std::fs::write(&fw, worse.to_string()).unwrap();
    let fw = fw.to_str().unwrap();
    let out = sonde(&db, &["compare", fa, fw, "--fail-if-worse", "10"]);
    assert_eq!(out.code, Some(1), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stderr
            .contains("worse than A by more than 10% in: RTT mean (+100.00%)"),
        "{}",
        out.stderr
    );
    assert!(out.stdout.contains("RTT mean"), "the table is printed too");
    let out = sonde(&db, &["compare", fw, fa, "--fail-if-worse", "10"]);
    assert_eq!(out.code, Some(0), "{}\n{}", out.stdout, out.stderr);

    // Usage errors exit 2.
    for args in [
        vec!["compare", fa],
        vec!["compare", fa, "nonsense-term"],
        vec!["compare", fa, fb, "--alpha", "2"],
    ] {
        let out = sonde(&db, &args);
        assert_eq!(out.code, Some(2), "{args:?}: {}", out.stderr);
    }
    // A selection that matches nothing says so and exits 1.
    let out = sonde(
        &db,
        &[
            "compare",
            "1",
            "label:path=nowhere",
            "--db",
            db.to_str().unwrap(),
        ],
    );
    assert_eq!(out.code, Some(1));
    assert!(out.stderr.contains("matches no run"), "{}", out.stderr);
}

#[test]
fn matrix_and_report_from_the_database() {
    let _file = crate::common::file_lock(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("results.db");
    let dbs = db.to_str().unwrap();
    let agent = common::Agent::start("127.0.0.1");
    // Runs 1-2: 64-byte messages, 3-4: 16 KiB (each pair one --repeat group, labelled by
    // size); 5: TCP throughput with intervals, unlabelled.
    let target = agent.target();
    for (size, label) in [("64", "msg=small"), ("16384", "msg=large")] {
        sonde_ok(
            &db,
            &[
                "latency", &target, "-m", size, "-t", "1", "--warmup", "0", "--repeat", "2",
                "--label", label, "--json",
            ],
        );
    }
    sonde_ok(
        &db,
        &[
            "throughput",
            &target,
            "-t",
            "1",
            "-P",
            "2",
            "-i",
            "0.25",
            "--json",
        ],
    );

    let matrix = sonde_ok(&db, &["compare", "--by", "msg", "--db", dbs]);
    let lines: Vec<&str> = matrix.lines().collect();
    assert_eq!(
        lines[0], "latency by msg (each figure the median of the case's runs)",
        "{matrix}"
    );
    assert!(
        lines[1].starts_with("msg ") && lines[1].contains("p99.99"),
        "{matrix}"
    );
    assert!(
        lines[2].starts_with("large ") && lines[3].starts_with("small "),
        "{matrix}"
    );
    // Two runs each.
    assert_eq!(lines[2].split_whitespace().nth(1), Some("2"), "{matrix}");
    let json: serde_json::Value = serde_json::from_str(&sonde_ok(
        &db,
        &["compare", "--by", "msg", "--db", dbs, "--json"],
    ))
    .unwrap();
    assert_eq!(json[0]["rows"].as_array().unwrap().len(), 2);

    // Every run, and the two cases compared: in a browser when there is one.
    let all = dir.path().join("all.html");
    let err = sonde(&db, &["report", "--db", dbs, "-o", all.to_str().unwrap()]);
    assert_eq!(err.code, Some(0), "{}", err.stderr);
    assert!(err.stderr.contains("5 runs written"), "{}", err.stderr);
    let two = dir.path().join("two.html");
    sonde_ok(
        &db,
        &[
            "report",
            "label:msg=small",
            "label:msg=large",
            "--db",
            dbs,
            "--title",
            "small against large",
            "-o",
            two.to_str().unwrap(),
        ],
    );
    let page = std::fs::read_to_string(&two).unwrap();
    assert!(page.contains("<title>small against large</title>"));
    // --x names a label the runs have; another is a usage error that lists the ones there are.
    let out = sonde(
        &db,
        &[
            "report",
            "--db",
            dbs,
            "--x",
            "zone",
            "-o",
            all.to_str().unwrap(),
        ],
    );
    assert_eq!(out.code, Some(2), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("--x \"zone\": no selected run has that label; their labels are: msg"),
        "{}",
        out.stderr
    );
    let by = dir.path().join("by.html");
    sonde_ok(
        &db,
        &[
            "report",
            "--db",
            dbs,
            "--x",
            "msg",
            "-o",
            by.to_str().unwrap(),
        ],
    );
    let by_page = std::fs::read_to_string(&by).unwrap();
    assert!(
        by_page.contains("\"x\":\"msg\""),
        "the bars' category axis is msg"
    );
    assert!(page.contains("<table data-table=\"compare\">"));
    if !require_or_skip(
        "matrix_and_report_from_the_database (browser part)",
        &[Need::Cmd("chromium")],
    ) {
        return;
    }
    // All runs: bars, distribution, one throughput chart; a row per case.
    check_in_browser(
        &all,
        3,
        &["msg=small", "msg=large", "run 5"],
        "report-all-runs.png",
    );
    check_in_browser(&two, 2, &["msg=small", "msg=large"], "report-compare.png");
}

// ---------------------------------------------------------------------------------------------
// The lab: a path shaped slower is reported as significantly slower.
// ---------------------------------------------------------------------------------------------

/// Client `a` (198.18.0.1) and agent `b` (198.18.0.2) on a veth pair; a closed loop of 1,000-byte
/// UDP messages, `--repeat 5` of 1-second runs on the bare link labelled `path=bare`, then five
/// more labelled `path=shaped` with a's egress shaped by `tc tbf` to 10 Mbit/s with a bucket of little more than one frame: each request then waits for
/// the bucket to refill, about 0.85 ms (1,042 bytes at 10 Mbit/s), against tens of µs for the
/// bare veth. `sonde compare` must call the shaped runs significantly slower (every shaped run
/// slower than every bare one gives p = 0.012 with 5 and 5), and `--fail-if-worse` must fail.
#[test]
fn a_path_shaped_slower_is_significantly_slower() {
    let _file = crate::common::file_lock(module_path!());
    use common::netns::{link_up, tbf, veth, Namespaces, Segments};
    if !require_or_skip(
        "a_path_shaped_slower_is_significantly_slower",
        &[Need::Root, Need::Netns, Need::Cmd("ip"), Need::Cmd("tc")],
    ) {
        return;
    }
    let ns = Namespaces::new("compare", &["a", "b"]);
    let (a, b) = (ns.name(0), ns.name(1));
    veth(a, "veth-a", b, "veth-b");
    link_up(a, "veth-a", "198.18.0.1", 1500, Segments::Whole);
    link_up(b, "veth-b", "198.18.0.2", 1500, Segments::Whole);
    let agent = common::Agent::start_in(Some(b), "198.18.0.2", &["-q"]);
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("results.db");
    let dbs = db.to_str().unwrap();
    let target = agent.target();
    let run = |args: &[&str]| {
        let mut cmd = common::command_in(Some(a), common::sonde_bin());
        cmd.env("SONDE_DB", &db).args(args);
        let out = run_with_timeout(&mut cmd, RUN_LIMIT).unwrap_or_else(|e| panic!("{e}"));
        (out.status.code(), out.stdout, out.stderr)
    };
    // `--repeat 5` of one case, labelled: the way a user measures a case.
    let five = |path: &str| {
        let label = format!("path={path}");
        let (code, stdout, stderr) = run(&[
            "latency", &target, "-u", "-m", "1000", "-t", "1", "--warmup", "0", "--repeat", "5",
            "--label", &label, "--json",
        ]);
        assert_eq!(code, Some(0), "{stdout}\n{stderr}");
        serde_json::Deserializer::from_str(&stdout)
            .into_iter::<serde_json::Value>()
            .map(|d| d.unwrap()["rtt_ns"]["mean"].as_f64().unwrap())
            .collect::<Vec<f64>>()
    };
    let bare = five("bare");
    tbf(a, "veth-a", "10mbit", 1_600, "50ms");
    let shaped = five("shaped");
    assert_eq!((bare.len(), shaped.len()), (5, 5));
    let means = format!("bare means {bare:?} ns, shaped {shaped:?} ns");

    let (code, stdout, stderr) = run(&[
        "compare",
        "label:path=bare",
        "label:path=shaped",
        "--db",
        dbs,
        "--json",
    ]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    let c: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    for figure in ["rtt_mean_ns", "rtt_p50_ns"] {
        let row = c["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["figure"] == figure)
            .unwrap();
        assert_eq!(
            row["significance"]["kind"], "significant",
            "{figure}: {means}\n{row:#}"
        );
        assert!(row["significance"]["p_value"].as_f64().unwrap() < 0.05);
        assert_eq!(row["worse"], true, "{figure}: {means}");
        // The shaper's 0.85 ms per request, at least most of it.
        let added = row["b"].as_f64().unwrap() - row["a"].as_f64().unwrap();
        assert!(added > 500_000.0, "{figure}: {added} ns added; {means}");
    }
    let (code, _, stderr) = run(&[
        "compare",
        "label:path=bare",
        "label:path=shaped",
        "--db",
        dbs,
        "--fail-if-worse",
        "50",
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("RTT mean"), "{stderr}");
}

// ---------------------------------------------------------------------------------------------
// The report people read: a plan's axes on the chart, labels that never overlap, charts and
// tables that leave the page, the print.
// ---------------------------------------------------------------------------------------------

/// Appended to a test's copy of a page, after the report's own script: every text box of every
/// chart, as laid out. Writes into the probe element (see [`probe_attr`]) how many labels there
/// are (`data-labels`), how many pairs of one chart intersect or stick out of their drawing
/// (`data-label-clashes`) and the first few of them (`data-label-clash-examples`).
const MEASURE_LABELS: &str = r#"<script>
(function () {
  var root = document.getElementById("sonde-probe"), boxes = [], bad = [];
  if (!root) { root = document.createElement("div"); root.id = "sonde-probe"; document.body.appendChild(root); }
  ["data-errors", "data-error-messages", "data-ready"].forEach(function (a) {
    root.setAttribute(a, document.documentElement.getAttribute(a) || "");
  });
  document.querySelectorAll(".chart svg").forEach(function (svg, chart) {
    var outer = svg.getBoundingClientRect();
    svg.querySelectorAll("text").forEach(function (t) {
      var b = t.getBoundingClientRect();
      if (b.width === 0 || b.height === 0) return;
      var name = t.lastChild ? t.lastChild.textContent : "";
      if (b.left < outer.left - 0.5 || b.right > outer.right + 0.5 || b.top < outer.top - 0.5 || b.bottom > outer.bottom + 0.5)
        bad.push("'" + name + "' sticks out of chart " + chart);
      boxes.push({ chart: chart, b: b, name: name });
    });
  });
  for (var i = 0; i < boxes.length; i++) {
    for (var j = i + 1; j < boxes.length; j++) {
      var a = boxes[i], c = boxes[j];
      if (a.chart !== c.chart) continue;
      if (a.b.left < c.b.right - 0.5 && c.b.left < a.b.right - 0.5 && a.b.top < c.b.bottom - 0.5 && c.b.top < a.b.bottom - 0.5)
        bad.push("'" + a.name + "' over '" + c.name + "'");
    }
  }
  root.setAttribute("data-labels", String(boxes.length));
  root.setAttribute("data-label-clashes", String(bad.length));
  root.setAttribute("data-label-clash-examples", bad.slice(0, 6).join(" | "));
})();
</script>"#;

/// Appended to a test's copy of a page: runs each chart's SVG and PNG export and each table's
/// CSV export as the buttons do, and writes what came out into the probe element:
/// `data-export-svg` (per chart: `ok` when the text parses as an SVG document), `data-export-png`
/// (per chart: type, bytes, first four bytes in hex), `data-export-csv` (per table: rows, the
/// header line and the first row).
const RUN_EXPORTS: &str = r#"<script>
(function () {
  var root = document.getElementById("sonde-probe"), r = window.sondeReport;
  if (!root) { root = document.createElement("div"); root.id = "sonde-probe"; document.body.appendChild(root); }
  var errors = function () {
    ["data-errors", "data-error-messages"].forEach(function (a) {
      root.setAttribute(a, document.documentElement.getAttribute(a) || "");
    });
  };
  errors();
  var charts = Array.prototype.slice.call(document.querySelectorAll("[data-chart]"));
  root.setAttribute("data-export-svg", charts.map(function (c) {
    var text = r.svg(c);
    var doc = new DOMParser().parseFromString(text, "image/svg+xml");
    var ok = !doc.querySelector("parsererror") && doc.documentElement.localName === "svg" &&
      doc.documentElement.namespaceURI.indexOf("2000/svg") > 0 && doc.querySelectorAll("text").length > 0;
    return ok ? "ok" : "bad";
  }).join(","));
  root.setAttribute("data-export-csv", Array.prototype.map.call(document.querySelectorAll("table[data-table]"), function (t) {
    var lines = r.csv(t).split("\r\n");
    return (lines.length - 2) + " rows: " + lines[0] + " / " + lines[1];
  }).join(" | "));
  Promise.all(charts.map(function (c) {
    return r.png(c).then(function (b) {
      return b.arrayBuffer().then(function (a) {
        var head = Array.prototype.map.call(new Uint8Array(a).slice(0, 4), function (x) { return ("0" + x.toString(16)).slice(-2); }).join("");
        return b.type + " " + a.byteLength + " " + head;
      });
    });
  })).then(function (list) { root.setAttribute("data-export-png", list.join(",")); errors(); },
    function (e) { root.setAttribute("data-export-png", "error: " + e); errors(); });
})();
</script>"#;

/// Appended to a test's copy of a page: clicks the latency table's `mean (µs)` header three
/// times as a user would, and writes the first row's case after each click into the probe
/// element (`data-sorted`, `|`-separated: ascending, descending, as it was).
const SORT_BY_MEAN: &str = r#"<script>
(function () {
  var root = document.getElementById("sonde-probe");
  if (!root) { root = document.createElement("div"); root.id = "sonde-probe"; document.body.appendChild(root); }
  var table = document.querySelector('table[data-table="cases-latency"]');
  var th = Array.prototype.filter.call(table.tHead.rows[0].cells, function (c) { return c.textContent === "mean (µs)"; })[0];
  var first = [];
  for (var i = 0; i < 3; i++) {
    th.click();
    first.push(table.tBodies[0].rows[0].cells[0].textContent + " " + (th.getAttribute("aria-sort") || "none"));
  }
  root.setAttribute("data-sorted", first.join("|"));
})();
</script>"#;

/// `page` with `scripts` appended before `</body>`, written to `dir/name`.
fn with_scripts(dir: &Path, name: &str, page: &str, scripts: &[&str]) -> PathBuf {
    let end = page.rfind("</body>").expect("the page ends its body");
    let mut out = page[..end].to_owned();
    for s in scripts {
        out.push_str(s);
        out.push('\n');
    }
    out.push_str(&page[end..]);
    let path = dir.join(name);
    std::fs::write(&path, out).unwrap();
    path
}

/// A latency run of `samples` RTTs around `base_us` with a tail (1 in 100 up to 3x, 1 in 5,000
/// up to 12x), its histogram kept as the store keeps it, its document's figures from it.
fn synthetic_run(id: &str, labels: &[(&str, &str)], base_us: f64, samples: u64, seed: u64) -> Run {
    let mut h = RttRecorder::new(0);
    let mut x = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
    let mut next = || {
        x = x
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        (x >> 11) as f64 / (1u64 << 53) as f64
    };
    for _ in 0..samples {
        let (u, v, w) = (next(), next(), next());
        let tail = if v < 0.000_2 {
            12.0 * w
        } else if v < 0.01 {
            3.0 * w
        } else {
            0.0
        };
        h.record(0, (base_us * 1e3 * (1.0 + 0.2 * u * u + tail)) as u64);
    }
    let mut result = fixture("latency_tcp");
    let TestResult::Latency(l) = &mut result else {
        unreachable!("latency_tcp is a latency document")
    };
    let s = h.summary();
    let at = |p: f64| {
        sonde_engine::rtt::percentile_supported(p, h.samples())
            .then(|| h.value_at(p))
            .flatten()
    };
    l.samples = s.samples;
    l.sent = s.samples;
    l.rtt_ns.min = s.min_ns;
    l.rtt_ns.max = s.max_ns;
    l.rtt_ns.mean = s.mean_ns;
    l.rtt_ns.stddev = s.stddev_ns;
    l.rtt_ns.p50 = at(50.0);
    l.rtt_ns.p90 = at(90.0);
    l.rtt_ns.p99 = at(99.0);
    l.rtt_ns.p999 = at(99.9);
    l.rtt_ns.p9999 = at(99.99);
    l.rtt_ns.p99999 = at(99.999);
    let labels: std::collections::BTreeMap<String, String> = labels
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect();
    if labels.get("protocol").map(String::as_str) == Some("udp") {
        l.protocol = Protocol::Udp;
    }
    l.meta.labels = labels.clone();
    let mut run = Run::new(id, result);
    run.labels = labels;
    run.rtt = Some(h);
    run
}

/// Seed 000's matrix as a plan runs it: targets in two zones (b, c), each by its private and
/// public address and through a load balancer (elb), TCP and UDP; ten cases ran (c-elb's two
/// failed). Labelled as `sonde plan run` labels its runs: the axes, `case`, `plan`, `plan_run`,
/// `plan_case`. TCP runs hold 120,000 samples (p99.99 supported), UDP runs 40,000 (its stand-in).
pub(crate) fn seed_runs() -> Vec<Run> {
    let targets = [
        ("b-private", 95.0),
        ("b-public", 610.0),
        ("b-elb", 1_240.0),
        ("c-private", 480.0),
        ("c-public", 1_050.0),
    ];
    let mut runs = Vec::new();
    let mut index = 0;
    for (target, base) in targets {
        for (protocol, factor, samples) in [("tcp", 1.0, 120_000), ("udp", 0.86, 40_000)] {
            index += 1;
            let case = format!("target={target} protocol={protocol}");
            let plan_case = index.to_string();
            runs.push(synthetic_run(
                &(index + 30).to_string(),
                &[
                    ("target", target),
                    ("protocol", protocol),
                    ("case", &case),
                    ("plan", "seed-000"),
                    ("plan_run", "7"),
                    ("plan_case", &plan_case),
                ],
                base * factor,
                samples,
                index,
            ));
        }
    }
    runs
}

/// The attribute `name` of the probe element the test scripts add at the end of the page (the
/// end: a dumped DOM is kept from its tail when long), with the page's error count and
/// messages copied into it; or a panic naming it.
fn probe_attr<'a>(dom: &'a str, name: &str) -> &'a str {
    let find = || {
        let start = dom.rfind("<div id=\"sonde-probe\"")?;
        let tag = &dom[start..start + dom[start..].find('>')?];
        let key = format!(" {name}=\"");
        let from = tag.find(&key)? + key.len();
        Some(&tag[from..from + tag[from..].find('"')?])
    };
    find().unwrap_or_else(|| panic!("no {name} on the probe element"))
}

/// Asserts that `dom` (a page with [`MEASURE_LABELS`] run at some width) has at least `least`
/// chart labels and none over another.
fn assert_labels_apart(dom: &str, least: usize) {
    let labels: usize = probe_attr(dom, "data-labels").parse().unwrap();
    assert!(
        labels >= least,
        "{labels} labels in the charts' DOM, expected {least} or more"
    );
    assert_eq!(
        probe_attr(dom, "data-label-clashes"),
        "0",
        "labels over each other: {}",
        probe_attr(dom, "data-label-clash-examples")
    );
}

#[test]
fn the_seed_plan_report_groups_by_the_axes_and_exports_in_chromium() {
    let _file = crate::common::file_lock(module_path!());
    if !require_or_skip(
        "the_seed_plan_report_groups_by_the_axes_and_exports_in_chromium",
        &[Need::Cmd("chromium")],
    ) {
        return;
    }
    let runs = seed_runs();
    let page = html(&Report {
        title: "plan seed-000 run 7",
        generated_unix_ms: 1_714_564_800_000,
        runs: &runs,
        comparison: None,
        layout: Layout::default(),
    });
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("seed.html");
    std::fs::write(&plain, &page).unwrap();
    // Bars and distribution; a row per case. The screenshot is the README's (docs/report.png).
    let dom = check_in_browser(&plain, 2, &["case=target=b-elb protocol=tcp plan=seed-000 plan_case=5 plan_run=7 protocol=tcp target=b-elb"], "report-seed.png");
    // One case column, named by the axes; the rows in the plan's order, TCP beside UDP.
    let rows: Vec<&str> = dom
        .split("<tr data-case=")
        .skip(1)
        .map(|r| {
            let cell = &r[r.find("<td class=\"l\"").unwrap()..];
            &cell[cell.find('>').unwrap() + 1..cell.find("</td>").unwrap()]
        })
        .collect();
    assert_eq!(
        rows[..4],
        [
            "target=b-private protocol=tcp",
            "target=b-private protocol=udp",
            "target=b-public protocol=tcp",
            "target=b-public protocol=udp",
        ],
        "{rows:?}"
    );
    assert_eq!(rows.len(), 10);
    assert!(dom.contains("<p class=\"note\">Every case: plan=seed-000 plan_run=7.</p>"));
    let header = &dom[dom.find("<thead>").unwrap()..dom.find("</thead>").unwrap()];
    for th in [
        "case",
        "runs",
        "mean (µs)",
        "p99.99 (µs)",
        "max (µs)",
        "samples",
    ] {
        assert!(header.contains(&format!(">{th}</th>")), "no {th}: {header}");
    }
    // UDP's 40,000 samples cannot support p99.99: the table shows its stand-in, never a number
    // posing as it.
    assert!(dom.contains("<td class=\"thin\""), "no stand-in");

    // In the browser at 1,200 px: the chart's labels (one per target, one per protocol in each
    // group) apart; every export made in the page.
    let probe = with_scripts(
        dir.path(),
        "seed-probe.html",
        &page,
        &[MEASURE_LABELS, RUN_EXPORTS, SORT_BY_MEAN],
    );
    let dom = chromium(&probe, &["--dump-dom", "--window-size=1200,900"]);
    assert_eq!(
        probe_attr(&dom, "data-errors"),
        "0",
        "{:?}",
        probe_attr(&dom, "data-error-messages")
    );
    assert_labels_apart(&dom, 15);
    // Sorted by the mean: UDP to b-private is the lowest, TCP to b-elb the highest; a third
    // click puts the plan's order back.
    assert_eq!(
        probe_attr(&dom, "data-sorted"),
        "target=b-private protocol=udp ascending|target=b-elb protocol=tcp descending|\
         target=b-private protocol=tcp none"
    );
    assert_eq!(probe_attr(&dom, "data-export-svg"), "ok,ok");
    let pngs: Vec<&str> = probe_attr(&dom, "data-export-png").split(',').collect();
    assert_eq!(pngs.len(), 2, "{pngs:?}");
    for png in pngs {
        let f: Vec<&str> = png.split(' ').collect();
        assert_eq!((f[0], f[2]), ("image/png", "89504e47"), "{png}");
        assert!(f[1].parse::<usize>().unwrap() > 5_000, "{png}");
    }
    assert_eq!(
        probe_attr(&dom, "data-export-csv"),
        "10 rows: case,runs,mean (µs),p50 (µs),p99 (µs),p99.99 (µs),max (µs),samples / \
         target=b-private protocol=tcp,1,102.73,99.84,113.98,389.63,1175.55,120000"
    );
    // The grouping as the chart draws it: the targets as groups, the protocols as series.
    let bars = &dom[dom.find("data-chart=\"latency-bars\"").unwrap()..];
    let bars = &bars[..bars.find("</svg>").unwrap()];
    for label in [
        "protocol=tcp",
        "protocol=udp",
        ">b-private<",
        ">c-public<",
        "Figure 1. Mean and p99.99 RTT per case",
    ] {
        assert!(bars.contains(label), "the bar chart has no {label}");
    }
    assert!(!bars.contains("n/a"), "the chart at rest says n/a");
}

/// 50 cases: 25 targets with long names by TCP and UDP in two zones (a panel each), and 50
/// unlabelled runs (each its own case, its own category). Headless chromium at 1,200 px wide: no two labels of a chart
/// intersect, none sticks out of its drawing.
#[test]
fn fifty_cases_have_no_label_over_another_at_1200_px() {
    let _file = crate::common::file_lock(module_path!());
    if !require_or_skip(
        "fifty_cases_have_no_label_over_another_at_1200_px",
        &[Need::Cmd("chromium")],
    ) {
        return;
    }
    let mut labelled = Vec::new();
    for t in 0..25u64 {
        let zone = ["b", "c"][t as usize % 2];
        let target = format!(
            "zone-{zone}-{}-endpoint-{t:02}",
            ["private", "public", "load-balancer"][t as usize % 3]
        );
        for (p, protocol) in ["tcp", "udp"].iter().enumerate() {
            let id = (t * 2 + p as u64 + 1).to_string();
            labelled.push(synthetic_run(
                &id,
                &[
                    ("target", target.as_str()),
                    ("protocol", protocol),
                    ("zone", zone),
                ],
                40.0 + 37.0 * t as f64,
                2_000,
                t * 2 + p as u64,
            ));
        }
    }
    let unlabelled: Vec<Run> = (0..50u64)
        .map(|i| {
            synthetic_run(
                &(100 + i).to_string(),
                &[],
                30.0 + 11.0 * i as f64,
                2_000,
                i,
            )
        })
        .collect();
    // The pages are kept beside their screenshots.
    let dir = artifact_dir();
    for (name, runs) in [("fifty-labelled", labelled), ("fifty-runs", unlabelled)] {
        let page = html(&Report {
            title: name,
            generated_unix_ms: 1_714_564_800_000,
            runs: &runs,
            comparison: None,
            layout: Layout::default(),
        });
        let probe = with_scripts(
            &dir,
            &format!("report-{name}.html"),
            &page,
            &[MEASURE_LABELS],
        );
        let dom = chromium(&probe, &["--dump-dom", "--window-size=1200,900"]);
        assert_eq!(
            probe_attr(&dom, "data-errors"),
            "0",
            "{name}: {:?}",
            probe_attr(&dom, "data-error-messages")
        );
        assert_eq!(page.matches("<tr data-case=").count(), 50, "{name}");
        // A label per category (25 targets + 50 protocol labels, or 50 run names), the axes'
        // ticks and the legends besides.
        assert_labels_apart(&dom, 50);
        if name == "fifty-labelled" {
            assert!(page.contains("\"title\":\"zone=b\""), "no panel for zone b");
            assert!(page.contains("\"title\":\"zone=c\""), "no panel for zone c");
        }
        let png = artifact_dir().join(format!("report-{name}.png"));
        chromium(
            &probe,
            &[
                &format!("--screenshot={}", png.display()),
                "--window-size=1200,3000",
            ],
        );
    }
}

/// The report printed to PDF by headless chromium holds every chart: `pdftotext` finds each
/// chart's figure title, which is drawn inside the chart (the page's headings say it otherwise).
#[test]
fn the_report_prints_to_pdf_with_every_chart() {
    let _file = crate::common::file_lock(module_path!());
    if !require_or_skip(
        "the_report_prints_to_pdf_with_every_chart",
        &[Need::Cmd("chromium"), Need::Cmd("pdftotext")],
    ) {
        return;
    }
    let mut runs = seed_runs();
    runs.push(Run::new("4", fixture("throughput_tcp_2_streams")));
    runs.push(Run::new("5", fixture("throughput_tcp_context")));
    // A latency run with intervals: RTT over time.
    let mut timed = fixture("latency_tcp");
    let TestResult::Latency(l) = &mut timed else {
        unreachable!("latency_tcp is a latency document")
    };
    l.intervals = (0..4u64)
        .map(|k| sonde_report::LatencyInterval {
            start_ns: 500_000_000 * k,
            end_ns: 500_000_000 * (k + 1),
            samples: 5_000,
            rtt_ns: Some(l.rtt_ns.clone()),
            transactions_per_second: None,
        })
        .collect();
    runs.push(Run::new("6", timed));
    let page = html(&Report {
        title: "sonde report (print test)",
        generated_unix_ms: 1_714_564_800_000,
        runs: &runs,
        comparison: None,
        layout: Layout::default(),
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("print.html");
    std::fs::write(&path, &page).unwrap();
    let pdf = artifact_dir().join("report-print.pdf");
    let _ = std::fs::remove_file(&pdf);
    chromium(
        &path,
        &[
            &format!("--print-to-pdf={}", pdf.display()),
            "--no-pdf-header-footer",
        ],
    );
    let mut cmd = Command::new("pdftotext");
    cmd.args(["-layout"]).arg(&pdf).arg("-");
    let out = run_with_timeout(&mut cmd, Duration::from_secs(60)).unwrap_or_else(|e| panic!("{e}"));
    assert!(out.status.success(), "pdftotext failed: {}", out.stderr);
    let text = out.stdout;
    // Bars, distribution, RTT over time, the two throughput runs.
    let titles = [
        "Figure 1. Mean and p99.99 RTT per case".to_owned(),
        "Figure 2. RTT distribution".to_owned(),
        "Figure 3. RTT over time, run 6".to_owned(),
        "Figure 4. Throughput, run 4".to_owned(),
        "Figure 5. Throughput, run 5".to_owned(),
    ];
    for t in &titles {
        assert!(
            text.contains(t.as_str()),
            "the PDF ({}) has no {t:?}",
            pdf.display()
        );
    }
    assert!(!text.contains("Figure 6."));
    // The charts' own labels, and no buttons.
    for t in [
        "target=b-elb",
        "percentile (log scale of 1 / (1 - p))",
        "time (s, interval end)",
        "time since the test started (s, interval middle)",
    ] {
        assert!(text.contains(t), "the PDF has no {t:?}");
    }
    assert!(!text.contains("copy PNG"), "the buttons are printed");
}

// ---------------------------------------------------------------------------------------------
// RTT over time: the latency runs' intervals (`-i`).
// ---------------------------------------------------------------------------------------------

/// The `d` of series `key`'s line in `svg` (a chart's drawing as the browser left it).
fn series_path<'a>(svg: &'a str, key: &str) -> &'a str {
    let g = svg
        .find(&format!("<g data-series=\"{key}\">"))
        .unwrap_or_else(|| panic!("no {key} line in {svg}"));
    let rest = &svg[g..];
    let d = rest.find(" d=\"").expect("the line's path") + 4;
    &rest[d..d + rest[d..].find('"').expect("the path ends")]
}

/// A path's points (each an `M` or an `L`) and its pieces (each an `M`: a gap before each
/// piece after the first).
fn points_and_pieces(d: &str) -> (usize, usize) {
    let moves = d.matches('M').count();
    (moves + d.matches('L').count(), moves)
}

/// Points and pieces a line through `values` has, breaking at each null.
fn expected_line(values: &[serde_json::Value]) -> (usize, usize) {
    let points = values.iter().filter(|v| !v.is_null()).count();
    let pieces = values
        .iter()
        .enumerate()
        .filter(|(i, v)| !v.is_null() && (*i == 0 || values[i - 1].is_null()))
        .count();
    (points, pieces)
}

/// The drawing of the chart slot `data-chart="rtt-time"` number `n` in a dumped page.
fn rtt_time_svg(dom: &str, n: usize) -> &str {
    let at = dom
        .match_indices("data-chart=\"rtt-time\"")
        .nth(n)
        .unwrap_or_else(|| panic!("no RTT-over-time chart {n}"))
        .0;
    let rest = &dom[at..];
    &rest[..rest.find("</svg>").expect("the chart's drawing")]
}

/// Two closed-loop runs against an agent on loopback, stored: one with `-i 0.25`, one without.
/// `sonde report` draws RTT over time for the first only (and says how to get it for the
/// second); in chromium, its p50 and p99 lines have one point per interval whose document
/// states the percentile and a gap at each null, and the chart exports as SVG. Then a run
/// built here with an interval short of p99 and one with no reply: its lines break there.
#[test]
fn rtt_over_time_draws_each_interval_in_chromium() {
    let _file = crate::common::file_lock(module_path!());
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("results.db");
    let dbs = db.to_str().unwrap();
    let agent = common::Agent::start("127.0.0.1");
    let log = dir.path().join("timed.csv");
    let timed = latency_run(
        &db,
        &agent,
        &[
            "-i",
            "0.25",
            "--label",
            "loop=timed",
            "--full-log",
            log.to_str().unwrap(),
        ],
    );
    latency_run(&db, &agent, &["--label", "loop=plain"]);
    let intervals = timed["intervals"].as_array().expect("intervals").clone();
    assert!(intervals.len() >= 3, "{intervals:?}");
    let column = |p: &str| -> Vec<serde_json::Value> {
        intervals
            .iter()
            .map(|i| {
                i["rtt_ns"]
                    .get(p)
                    .cloned()
                    .unwrap_or(serde_json::Value::Null)
            })
            .collect()
    };
    let (p50, p99) = (column("p50"), column("p99"));
    let all = dir.path().join("over-time.html");
    sonde_ok(&db, &["report", "--db", dbs, "-o", all.to_str().unwrap()]);
    let page = std::fs::read_to_string(&all).unwrap();
    assert_eq!(page.matches("data-chart=\"rtt-time\"").count(), 1);
    assert!(
        page.contains("<h3>run 1 (loop=timed): TCP closed loop, 64 B, intervals of 0.25 s</h3>"),
        "no chart heading for the run with intervals"
    );
    assert!(
        page.contains("No RTT over time for run 2 (loop=plain): it recorded no intervals."),
        "the run without intervals is not named"
    );
    // The full log, binned: every sample the writer kept is in a bin.
    let start = page.find("id=\"sonde-data\">").unwrap() + "id=\"sonde-data\">".len();
    let data: serde_json::Value =
        serde_json::from_str(&page[start..start + page[start..].find("</script>").unwrap()])
            .unwrap();
    let bins = &data["rtt_time"][0]["log"];
    let binned: u64 = bins["samples"]
        .as_array()
        .expect("the full log's bins")
        .iter()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert_eq!(
        binned + timed["full_log"]["dropped"].as_u64().unwrap(),
        timed["samples"].as_u64().unwrap(),
        "binned from {}",
        log.display()
    );
    let filled = bins["min_us"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| !v.is_null())
        .count();
    assert!(page.contains("<p class=\"note\" data-full-log>Every one of the "));
    if !require_or_skip(
        "rtt_over_time_draws_each_interval_in_chromium (browser part)",
        &[Need::Cmd("chromium")],
    ) {
        return;
    }
    // Bars, distribution, RTT over time.
    check_in_browser(
        &all,
        3,
        &["loop=timed", "loop=plain"],
        "report-rtt-time.png",
    );
    let probe = with_scripts(
        dir.path(),
        "over-time-probe.html",
        &page,
        &[MEASURE_LABELS, RUN_EXPORTS],
    );
    let dom = chromium(&probe, &["--dump-dom", "--window-size=1200,900"]);
    assert_eq!(
        probe_attr(&dom, "data-errors"),
        "0",
        "{:?}",
        probe_attr(&dom, "data-error-messages")
    );
    assert_eq!(probe_attr(&dom, "data-export-svg"), "ok,ok,ok");
    // Its labels (title, ticks, axis names, legend) apart, as in every chart.
    assert_labels_apart(&dom, 20);
    let svg = rtt_time_svg(&dom, 0);
    assert!(
        svg.contains("Figure 3. RTT over time, run 1 (loop=timed)"),
        "{svg}"
    );
    assert_eq!(
        points_and_pieces(series_path(svg, "p50")),
        expected_line(&p50),
        "p50 per interval: {p50:?}"
    );
    assert_eq!(
        points_and_pieces(series_path(svg, "p99")),
        expected_line(&p99),
        "p99 per interval: {p99:?}"
    );
    assert!(
        svg.contains("<g data-band=\"interval min to max\">"),
        "no min-max band"
    );
    // A stroke per bin that holds a sample.
    let strokes = &svg[svg
        .find("<g data-strokes=")
        .expect("the full log's strokes")..];
    let d = &strokes[strokes.find(" d=\"").unwrap() + 4..];
    let d = &d[..d.find('"').unwrap()];
    assert_eq!(points_and_pieces(d), (2 * filled, filled));

    // Built: p99 stated in intervals 1 and 4 only (2 has 300 replies, 3 none), p50 in all
    // but 3. Two runs side by side share the RTT axis.
    let mut result = fixture("latency_tcp");
    let TestResult::Latency(l) = &mut result else {
        unreachable!("latency_tcp is a latency document")
    };
    let rtt = |p50: u64, p99: Option<u64>| sonde_report::RttNs {
        min: p50 - 10_000,
        mean: p50 as f64,
        stddev: 1_000.0,
        p50: Some(p50),
        p90: None,
        p99,
        p999: None,
        p9999: None,
        p99999: None,
        max: p50 * 3,
    };
    let at = |k: u64, samples: u64, rtt_ns| sonde_report::LatencyInterval {
        start_ns: 500_000_000 * k,
        end_ns: 500_000_000 * (k + 1),
        samples,
        rtt_ns,
        transactions_per_second: None,
    };
    l.intervals = vec![
        at(0, 5_000, Some(rtt(40_000, Some(60_000)))),
        at(1, 300, Some(rtt(41_000, None))),
        at(2, 0, None),
        at(3, 5_000, Some(rtt(39_000, Some(70_000)))),
    ];
    let mut steady = result.clone();
    let TestResult::Latency(s) = &mut steady else {
        unreachable!("a latency document")
    };
    s.intervals = (0..6)
        .map(|k| at(k, 5_000, Some(rtt(400_000, Some(900_000)))))
        .collect();
    let runs = vec![Run::new("11", result), Run::new("12", steady)];
    let page = html(&Report {
        title: "RTT over time (gaps)",
        generated_unix_ms: 1_714_564_800_000,
        runs: &runs,
        comparison: None,
        layout: Layout::default(),
    });
    let gaps = dir.path().join("gaps.html");
    std::fs::write(&gaps, &page).unwrap();
    let dom = check_in_browser(&gaps, 4, &["run 11", "run 12"], "report-rtt-gaps.png");
    let svg = rtt_time_svg(&dom, 0);
    // p50: two points, a gap, one point; p99: two lone points (each with its dot).
    assert_eq!(points_and_pieces(series_path(svg, "p50")), (3, 2));
    assert_eq!(points_and_pieces(series_path(svg, "p99")), (2, 2));
    let p99 = &svg[svg.find("<g data-series=\"p99\">").unwrap()..];
    let p99 = &p99[..p99.find("</g>").unwrap()];
    assert_eq!(
        p99.matches("r=\"2.5\"").count(),
        2,
        "a dot for each lone p99"
    );
    assert_eq!(
        points_and_pieces(series_path(rtt_time_svg(&dom, 1), "p99")),
        (6, 1)
    );
    // One RTT axis for both: the same tick labels (the slower run's 1.2 ms max on each).
    let ticks = |svg: &str| -> Vec<String> {
        svg.split("text-anchor=\"end\"")
            .skip(1)
            .map(|t| t[t.find('>').unwrap() + 1..t.find("</text>").unwrap()].to_owned())
            .collect()
    };
    assert_eq!(ticks(rtt_time_svg(&dom, 0)), ticks(rtt_time_svg(&dom, 1)));
}

/// A stand-in for Prometheus' query API on loopback, for `sonde mesh diagnose`: twelve hosts in
/// three racks (`rack-a-n1` ...), every pair probed, host `rack-b-n2` answering slowly (p99
/// 20 ms against 0.3 ms). Each query is answered by the metric it names; it serves until the
/// test ends (the thread is left blocked in accept).
fn fake_prometheus() -> std::net::SocketAddr {
    use std::io::{BufRead, BufReader, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().unwrap();
    let hosts: Vec<String> = ["a", "b", "c"]
        .iter()
        .flat_map(|r| (1..=4).map(move |n| format!("rack-{r}-n{n}")))
        .collect();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(64) {
            let Ok(mut stream) = stream else { continue };
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut line = String::new();
            let _ = reader.read_line(&mut line);
            // The rest of the request head.
            let mut h = String::new();
            while reader.read_line(&mut h).is_ok_and(|n| n > 2) {
                h.clear();
            }
            let value = |s: &str, t: &str| -> String {
                if line.contains("histogram_quantile") {
                    if t == "rack-b-n2" { "0.02" } else { "0.0003" }.to_owned()
                } else if line.contains("sonde_probes_sent_total") {
                    "600".to_owned()
                } else if line.contains("sonde_probes_lost_total") {
                    "0".to_owned()
                } else {
                    let _ = s;
                    "1".to_owned()
                }
            };
            let result: Vec<serde_json::Value> = hosts
                .iter()
                .flat_map(|s| hosts.iter().filter(move |t| *t != s).map(move |t| (s, t)))
                .map(|(s, t)| {
                    serde_json::json!({
                        "metric": {"source": s, "target": t},
                        "value": [1_700_000_000.0, value(s, t)],
                    })
                })
                .collect();
            let body = serde_json::json!({
                "status": "success",
                "data": {"resultType": "vector", "result": result},
            })
            .to_string();
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

#[test]
fn the_mesh_diagnosis_page_opens_in_chromium_with_its_heatmaps() {
    let test = "the_mesh_diagnosis_page_opens_in_chromium_with_its_heatmaps";
    let _file = crate::common::file_lock(module_path!());
    if !require_or_skip(test, &[Need::Cmd("chromium")]) {
        return;
    }
    let prom = fake_prometheus();
    let dir = tempfile::tempdir().unwrap();
    let page = dir.path().join("diagnosis.html");
    let out = common::check(
        common::sonde_command()
            .args(["mesh", "diagnose", "--prometheus"])
            .arg(format!("http://{prom}"))
            .args(["--group-regex", "^(rack-[a-z])-", "--json", "--html"])
            .arg(&page),
    );
    let doc: serde_json::Value = serde_json::from_str(&out).expect("--json");
    assert_eq!(doc["suspects"][0]["kind"], "target", "{doc:#}");
    assert_eq!(doc["suspects"][0]["name"], "rack-b-n2");
    assert_eq!(doc["bad_pairs"], 11);
    let _ = std::fs::copy(&page, artifact_dir().join("mesh-diagnosis.html"));

    let dom = chromium(&page, &["--dump-dom"]);
    assert_eq!(
        root_attr(&dom, "data-errors"),
        Some("0"),
        "errors in the page: {:?}",
        root_attr(&dom, "data-error-messages")
    );
    assert_eq!(root_attr(&dom, "data-ready"), Some("1"));
    // The page as the browser parsed it: the first suspect, three heatmaps, the 132 pairs of
    // each host heatmap with rack-b-n2's column outlined in p99 and nothing in loss.
    let first = dom.find("<tr data-kind=").expect("a suspect row");
    assert!(
        dom[first..].starts_with("<tr data-kind=\"target\" data-name=\"rack-b-n2\">"),
        "{}",
        &dom[first..first + 80]
    );
    let svg = |kind: &str| {
        let from = dom
            .find(&format!("data-heatmap=\"{kind}\""))
            .unwrap_or_else(|| panic!("no {kind} heatmap"));
        &dom[from..from + dom[from..].find("</svg>").unwrap()]
    };
    assert_eq!(svg("p99").matches("<rect class=\"c").count(), 132);
    assert_eq!(svg("p99").matches("<rect class=\"c bad\"").count(), 11);
    assert_eq!(svg("loss").matches("<rect class=\"c bad\"").count(), 0);
    // Three racks: the group matrix's 9 cells; rack b's column is a quarter bad (4 of the 16
    // pairs from each other rack, 3 of its own 12), none half bad, so none outlined.
    assert_eq!(svg("groups").matches("<rect class=\"c").count(), 9);
    assert_eq!(svg("groups").matches("<rect class=\"c bad\"").count(), 0);
    assert!(svg("groups").contains("rack-a → rack-b: 4 of 16 pairs bad"));
    screenshot(
        &page,
        &artifact_dir().join("mesh-diagnosis.png"),
        "1200,1800",
    );
}
