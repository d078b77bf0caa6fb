//! `sonde report` in a real browser: Debian's `chromium`, headless, opens a generated report from
//! a file and the test reads the DOM it ends with: every chart drawn (uPlot's canvas in each
//! chart's slot), every case row, no script error or console error, no resource from a network.
//! A screenshot and the page are kept as artifacts (`$SONDE_ARTIFACT_DIR`, else Cargo's target/tmp).

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{require_or_skip, run_with_timeout, Need};
use sonde_engine::rtt::RttRecorder;
use sonde_report::compare::{compare, Run};
use sonde_report::render::{html, Report};
use sonde_report::TestResult;

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
/// the output (`--dump-dom`, `--screenshot=...`). Returns stdout.
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

/// Checks a report in the browser: `charts` chart slots each with uPlot's canvas, each of
/// `rows` as a table row, no error. Keeps a screenshot under `shot`.
pub(crate) fn check_in_browser(page: &Path, charts: usize, rows: &[&str], shot: &str) -> String {
    let html = std::fs::read_to_string(page).expect("report");
    // Nothing to fetch: no attribute or CSS that loads from anywhere.
    for pat in ["src=", "href=", "url(", "@import", "http://", "fetch("] {
        assert!(!html.contains(pat), "the report contains {pat:?}");
    }
    // https only in uPlot's banner comment, which loads nothing.
    assert!(html.matches("https://").count() <= 1);

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
    // uPlot puts one canvas into each chart's slot.
    assert_eq!(dom.matches("<canvas").count(), charts, "canvases");
    for row in rows {
        assert!(
            dom.contains(&format!("<tr data-case=\"{row}\">")),
            "no row for case {row}"
        );
    }
    // The page too, beside its screenshot.
    let png = artifact_dir().join(shot);
    let _ = std::fs::copy(page, png.with_extension("html"));
    let _ = std::fs::remove_file(&png);
    chromium(
        page,
        &[
            &format!("--screenshot={}", png.display()),
            "--window-size=1400,2000",
        ],
    );
    let size = std::fs::metadata(&png).map(|m| m.len()).unwrap_or(0);
    assert!(
        size > 10_000,
        "screenshot {} is {size} bytes",
        png.display()
    );
    eprintln!("screenshot: {}", png.display());
    dom
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
    });
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("report-from.html");
    std::fs::write(&path, page).unwrap();
    // Bars and distribution of the latency run, the throughput run over time.
    let dom = check_in_browser(&path, 3, &[], "report-from-helpers.png");
    // Each run's share table, one row per helper, as the browser has it.
    for run in ["6", "7", "8"] {
        let start = dom
            .find(&format!(
                "<table data-table=\"helpers\" data-run=\"{run}\">"
            ))
            .unwrap_or_else(|| panic!("no share table of run {run} in the page"));
        let table = &dom[start..start + dom[start..].find("</table>").expect("table end")];
        for helper in ["198.18.2.2:5300", "198.18.3.2:5300"] {
            assert!(
                table.contains(&format!("<tr data-helper=\"{helper}\">")),
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
