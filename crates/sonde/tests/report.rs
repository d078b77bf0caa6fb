//! `sonde report` in a real browser: Debian's `chromium`, headless, opens a generated report from
//! a file and the test reads the DOM it ends with: every chart drawn (uPlot's canvas in each
//! chart's slot), every case row, no script error or console error, no resource from a network.
//! A screenshot and the page are kept as artifacts (`$SONDE_ARTIFACT_DIR`, else Cargo's target/tmp).

mod common;

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
    let mut public = Run::new("2", fixture("latency_udp_lossy"));
    public.labels.insert("path".into(), "public".into());
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
        &["path=private", "path=public", "run 3", "run 4", "run 5"],
        "report-fixtures.png",
    );
    assert!(dom.contains("<table data-table=\"compare\">"));
    assert!(dom.contains("data-warning"));
}
