//! The results store end to end: every test saves (into a `--db` of the test's own), the stored
//! document is what `--json` printed, and a database that cannot be written loses nothing but
//! the save.

use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Stdio};

use serde_json::Value;
use sonde_store::{Filter, Store};

use super::{run, run_ok, server, u};

pub(crate) fn path_str(p: &Path) -> &str {
    p.to_str().expect("temporary paths are UTF-8")
}

pub(super) fn temp_db() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("results.db");
    (dir, db)
}

/// The runs in `db`, newest first.
fn stored(db: &Path) -> Vec<sonde_store::StoredRun> {
    Store::open_existing(db)
        .expect("the database exists")
        .documents(&Filter::default())
        .expect("runs")
}

/// `sonde quick`'s cases were saved one run each, in one group, in the order run, each with
/// the document of its case; latency cases with their whole RTT histogram.
pub(crate) fn assert_saved_cases(db: &Path, cases: &[Value]) {
    let store = Store::open_existing(db).expect("quick saved its results");
    let mut runs = store.documents(&Filter::default()).expect("runs");
    runs.reverse();
    assert_eq!(runs.len(), cases.len(), "one run per case");
    let group = runs[0].summary.group.expect("the cases are one group");
    assert_eq!(
        store.group(group).expect("group").map(|g| g.kind),
        Some("quick".to_owned())
    );
    for (run, case) in runs.iter().zip(cases) {
        assert_eq!(run.summary.group, Some(group));
        let doc: Value = serde_json::from_str(&run.document).expect("a stored JSON document");
        assert_eq!(
            doc, case["result"],
            "the stored document is the case's result"
        );
        assert_eq!(run.summary.test, super::s(&doc, "/test"));
        // Each case is labelled with its name, in the document and in the database.
        let case_name = super::s(case, "/case");
        assert_eq!(doc["labels"], serde_json::json!({ "case": case_name }));
        assert_eq!(
            run.summary.labels,
            [sonde_store::Label::new("case", case_name).expect("label")]
        );
        let hist = store
            .histogram(run.summary.id, sonde_store::HISTOGRAM_RTT)
            .expect("decodes");
        if run.summary.test == "latency" {
            let hist = hist.expect("a latency run keeps its RTT histogram");
            assert_eq!(hist.len(), u(&doc, "/samples"), "every sample is in it");
            assert_eq!(
                run.summary.headline.rtt_p50_ns,
                doc.pointer("/rtt_ns/p50").and_then(Value::as_u64)
            );
        } else {
            assert!(hist.is_none(), "{}", run.summary.test);
        }
    }
}

#[test]
fn a_latency_run_is_saved_exactly_as_printed_with_its_histogram() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let (_dir, db) = temp_db();
    let stdout = run_ok(&[
        "latency",
        &agent.target(),
        "-t",
        "0.5",
        "--warmup",
        "0",
        "--json",
        "--db",
        path_str(&db),
    ]);
    let runs = stored(&db);
    assert_eq!(runs.len(), 1);
    assert_eq!(
        runs[0].document, stdout,
        "byte for byte what --json printed"
    );
    let doc: Value = serde_json::from_str(&stdout).expect("json");
    let r = &runs[0].summary;
    assert_eq!(
        (r.test.as_str(), r.protocol.as_deref(), r.server.as_deref()),
        ("latency", Some("tcp"), Some(agent.target().as_str()))
    );
    assert_eq!(r.time_unix_ms, u(&doc, "/timestamp_unix_ms"));
    assert_eq!(r.group, None);
    let hist = Store::open_existing(&db)
        .expect("open")
        .histogram(r.id, sonde_store::HISTOGRAM_RTT)
        .expect("decodes")
        .expect("present");
    assert_eq!(hist.len(), u(&doc, "/samples"));
    assert_eq!(hist.min(), u(&doc, "/rtt_ns/min"));
}

#[test]
fn each_test_saves_its_headline() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let (_dir, db) = temp_db();
    let target = agent.target();
    let d = path_str(&db);
    run_ok(&["throughput", &target, "-t", "0.5", "--db", d]);
    run_ok(&["pps", &target, "-t", "0.5", "--db", d]);
    run_ok(&["crr", &target, "-t", "0.5", "--db", d]);
    let runs = stored(&db);
    let tests: Vec<&str> = runs.iter().map(|r| r.summary.test.as_str()).collect();
    assert_eq!(tests, ["crr", "pps", "throughput"], "newest first");
    let doc = |i: usize| -> Value { serde_json::from_str(&runs[i].document).expect("json") };
    let h = |i: usize| runs[i].summary.headline;
    assert_eq!(
        h(0).connections_per_second,
        doc(0)["connections_per_second"].as_f64()
    );
    assert_eq!(h(1).packets_per_second, doc(1)["received_pps"].as_f64());
    assert_eq!(
        h(2).bits_per_second,
        doc(2)
            .pointer("/receiver/bits_per_second")
            .and_then(Value::as_f64)
    );
}

#[test]
fn each_step_of_a_sweep_is_saved_in_one_group() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let (_dir, db) = temp_db();
    let stdout = run_ok(&[
        "pps",
        &agent.target(),
        "-t",
        "0.3",
        "--sweep",
        "msg_size=32,64",
        "--label",
        "k=v",
        "--json",
        "--db",
        path_str(&db),
    ]);
    let doc: Value = serde_json::from_str(&stdout).expect("json");
    let mut runs = stored(&db);
    runs.reverse();
    assert_eq!(runs.len(), 2);
    assert!(runs[0].summary.group.is_some());
    assert_eq!(runs[0].summary.group, runs[1].summary.group);
    for (i, run) in runs.iter().enumerate() {
        let stored: Value = serde_json::from_str(&run.document).expect("json");
        assert_eq!(stored, doc["steps"][i]["result"]);
        let size = ["32", "64"][i];
        assert_eq!(
            stored["labels"],
            serde_json::json!({ "msg_size": size, "k": "v" })
        );
    }
    assert_eq!(doc["labels"], serde_json::json!({ "k": "v" }));
}

#[test]
fn no_save_writes_nothing() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let (_dir, db) = temp_db();
    run_ok(&[
        "pps",
        &agent.target(),
        "-t",
        "0.2",
        "--no-save",
        "--db",
        path_str(&db),
    ]);
    assert!(!db.exists());
}

#[test]
fn sonde_db_chooses_the_database() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let (_dir, db) = temp_db();
    let out = super::sonde()
        .env("SONDE_DB", &db)
        .args(["pps", &agent.target(), "-t", "0.2"])
        .output()
        .expect("run");
    assert!(out.status.success(), "{out:?}");
    assert_eq!(stored(&db).len(), 1);
}

#[test]
fn two_processes_saving_at_once_both_land() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let (_dir, db) = temp_db();
    // Three clients started together end together: their saves meet on a database that none
    // of them has created yet.
    let children: Vec<_> = (0..3)
        .map(|_| {
            StdCommand::new(env!("CARGO_BIN_EXE_sonde"))
                .args(["pps", &agent.target(), "-t", "0.5", "--db", path_str(&db)])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .expect("spawn")
        })
        .collect();
    for child in children {
        let out = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(!stderr.contains("not saved"), "{stderr}");
    }
    assert_eq!(stored(&db).len(), 3);
}

/// Runs `sonde pps TARGET -t 0.2 --json --db DB` and checks what a user relies on when the save
/// fails: the result printed, exit 0, and a warning that names the database and says why.
fn assert_printed_but_not_saved(out: &std::process::Output, db: &Path, why: &str) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    let doc: Value = serde_json::from_str(&stdout).expect("the result is printed");
    assert_eq!(super::s(&doc, "/test"), "pps");
    assert!(
        stderr.contains("warning: the result was not saved")
            && stderr.contains(path_str(db))
            && stderr.contains(why),
        "stderr: {stderr}"
    );
}

#[test]
fn a_file_that_is_not_a_database_is_reported_and_not_overwritten() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let (_dir, db) = temp_db();
    let content = "a spreadsheet, not a database\n".repeat(50);
    std::fs::write(&db, &content).expect("write");
    let r = super::sonde()
        .args([
            "pps",
            &agent.target(),
            "-t",
            "0.2",
            "--json",
            "--db",
            path_str(&db),
        ])
        .output()
        .expect("run");
    assert_printed_but_not_saved(&r, &db, "not a sonde results database");
    assert_eq!(std::fs::read_to_string(&db).expect("read"), content);
}

/// Runs `sonde ARGS` with `dir` made read-only (a read-only bind mount in a mount namespace of
/// its own when root, whom file modes do not stop; the modes otherwise).
fn run_with_read_only_dir(dir: &Path, args: &[&str]) -> Option<std::process::Output> {
    let sonde = env!("CARGO_BIN_EXE_sonde");
    if super::common::is_root() {
        if !super::common::require_or_skip(
            "a_read_only_database_still_prints_the_result",
            &[
                super::common::Need::Cmd("unshare"),
                super::common::Need::Cmd("mount"),
            ],
        ) {
            return None;
        }
        let script = r#"d="$1"; shift; mount --bind "$d" "$d" && mount -o remount,bind,ro "$d" "$d" && exec "$@""#;
        let out = StdCommand::new("unshare")
            .args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                script,
                "sh",
            ])
            .arg(dir)
            .arg(sonde)
            .args(args)
            .output()
            .expect("unshare");
        Some(out)
    } else {
        use std::os::unix::fs::PermissionsExt;
        for entry in std::fs::read_dir(dir).expect("dir") {
            let p = entry.expect("entry").path();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o444)).expect("chmod");
        }
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o555)).expect("chmod");
        let out = StdCommand::new(sonde).args(args).output().expect("run");
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        Some(out)
    }
}

#[test]
fn a_read_only_database_still_prints_the_result() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let (dir, db) = temp_db();
    let target = agent.target();
    let d = path_str(&db);
    run_ok(&["pps", &target, "-t", "0.2", "--db", d]);
    let before = std::fs::read(&db).expect("read");
    let Some(out) = run_with_read_only_dir(
        dir.path(),
        &["pps", &target, "-t", "0.2", "--json", "--db", d],
    ) else {
        return;
    };
    assert_printed_but_not_saved(&out, &db, "read-only");
    assert_eq!(std::fs::read(&db).expect("read"), before);
    assert_eq!(stored(&db).len(), 1, "the earlier run is still there");
}

#[test]
fn a_failed_test_saves_nothing_and_keeps_its_exit_code() {
    let _file = crate::common::file_lock(module_path!());
    let (_dir, db) = temp_db();
    let r = run(&[
        "pps",
        &format!("127.0.0.1:{}", super::closed_port()),
        "-t",
        "0.2",
        "--db",
        path_str(&db),
    ]);
    assert_eq!(r.code, Some(3), "{}", r.stderr);
    assert!(!db.exists());
}

#[test]
fn a_full_disk_still_prints_the_result() {
    let _file = crate::common::file_lock(module_path!());
    if !super::common::require_or_skip(
        "a_full_disk_still_prints_the_result",
        &[
            super::common::Need::Root,
            super::common::Need::Cmd("unshare"),
            super::common::Need::Cmd("mount"),
        ],
    ) {
        return;
    }
    let agent = server(&[]);
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("results.db");
    // A 12 KiB tmpfs, in a mount namespace of the command's own: room for SQLite's header
    // pages, not for a run.
    let script = r#"d="$1"; shift; mount -t tmpfs -o size=12k tmpfs "$d" && exec "$@""#;
    let out = StdCommand::new("unshare")
        .args([
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            script,
            "sh",
        ])
        .arg(dir.path())
        .arg(env!("CARGO_BIN_EXE_sonde"))
        .args([
            "pps",
            &agent.target(),
            "-t",
            "0.2",
            "--json",
            "--db",
            path_str(&db),
        ])
        .output()
        .expect("unshare");
    assert_printed_but_not_saved(&out, &db, "full");
}

#[test]
fn labels_name_the_case_in_json_csv_table_and_the_database() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let (_dir, db) = temp_db();
    let target = agent.target();
    let d = path_str(&db);
    let labels = ["--label", "path=private", "--label", "zone=other=b"];
    let mut args = vec!["pps", &target, "-t", "0.2", "--db", d, "--json"];
    args.extend(labels);
    let doc: Value = serde_json::from_str(&run_ok(&args)).expect("json");
    super::assert_valid(&doc);
    assert_eq!(
        doc["labels"],
        serde_json::json!({ "path": "private", "zone": "other=b" })
    );
    let mut args = vec!["pps", &target, "-t", "0.2", "--db", d, "--csv"];
    args.extend(labels);
    let csv = run_ok(&args);
    let rows = super::csv_rows(&csv);
    assert_eq!(rows[0]["labels"], "path=private;zone=other=b");
    let mut args = vec!["pps", &target, "-t", "0.2", "--db", d];
    args.extend(labels);
    let table = run_ok(&args);
    assert!(
        table
            .lines()
            .any(|l| l == "labels: path=private, zone=other=b"),
        "{table}"
    );
    let store = Store::open_existing(&db).expect("open");
    let found = store
        .runs(&Filter {
            labels: vec!["zone=other=b".parse().expect("label")],
            ..Filter::default()
        })
        .expect("runs");
    assert_eq!(found.len(), 3, "every run is found by its label");
    assert_eq!(
        found[0].labels,
        [
            sonde_store::Label::new("path", "private").expect("label"),
            sonde_store::Label::new("zone", "other=b").expect("label"),
        ]
    );
}

#[test]
fn a_bad_or_repeated_label_is_a_usage_error() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let (_dir, db) = temp_db();
    let target = agent.target();
    for labels in [
        &["--label", "nokey"][..],
        &["--label", "a b=c"],
        &["--label", "k=1", "--label", "k=2"],
    ] {
        let mut args = vec!["pps", target.as_str(), "-t", "0.2", "--db", path_str(&db)];
        args.extend(labels);
        let r = run(&args);
        assert_eq!(r.code, Some(2), "{labels:?}: {}", r.stderr);
        assert!(r.stderr.contains("label"), "{}", r.stderr);
    }
    assert!(!db.exists(), "no test ran");
}

/// `sonde results ARGS... --db DB`, which must exit 0; its stdout.
pub(super) fn results(db: &Path, args: &[&str]) -> String {
    let mut all = vec!["results"];
    all.extend_from_slice(args);
    all.extend(["--db", path_str(db)]);
    run_ok(&all)
}

fn listed_ids(db: &Path, args: &[&str]) -> Vec<u64> {
    let mut all = args.to_vec();
    all.push("--json");
    let list: Value = serde_json::from_str(&results(db, &all)).expect("a JSON list");
    list.as_array()
        .expect("an array")
        .iter()
        .map(|r| u(r, "/id"))
        .collect()
}

#[test]
fn results_lists_filters_shows_exports_and_removes() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let (_dir, db) = temp_db();
    let target = agent.target();
    let d = path_str(&db);
    let base = |test: &'static str, label: &'static str| {
        vec![
            test,
            target.as_str(),
            "-t",
            "0.2",
            "--db",
            d,
            "--label",
            label,
        ]
    };
    let mut lat = base("latency", "path=a");
    lat.extend(["--warmup", "0", "--json"]);
    let latency_json = run_ok(&lat);
    let mut pps = base("pps", "path=b");
    pps.push("--json");
    let pps_json = run_ok(&pps);
    let mut sweep = base("pps", "path=a");
    sweep.extend(["--sweep", "msg_size=32,64"]);
    run_ok(&sweep);
    // Ids 1 (latency), 2 (pps), 3 and 4 (the sweep's steps, one group).

    assert_eq!(listed_ids(&db, &[]), [4, 3, 2, 1], "newest first");
    assert_eq!(listed_ids(&db, &["--test", "pps"]), [4, 3, 2]);
    assert_eq!(listed_ids(&db, &["--label", "path=a"]), [4, 3, 1]);
    assert_eq!(
        listed_ids(&db, &["--label", "path=a", "--label", "msg_size=32"]),
        [3]
    );
    assert_eq!(listed_ids(&db, &["--last", "2", "--test", "pps"]), [4, 3]);
    assert_eq!(listed_ids(&db, &["--since", "2000-01-01"]), [4, 3, 2, 1]);
    assert!(listed_ids(&db, &["--since", "2999-01-01"]).is_empty());
    assert_eq!(listed_ids(&db, &["--since", "1h"]), [4, 3, 2, 1]);
    let list: Value = serde_json::from_str(&results(&db, &["--json"])).expect("json");
    let group = u(&list[0], "/group");
    assert_eq!(u(&list[1], "/group"), group);
    assert!(list[2]["group"].is_null());
    assert_eq!(listed_ids(&db, &["--group", &group.to_string()]), [4, 3]);
    assert_eq!(list[3]["labels"], serde_json::json!({ "path": "a" }));
    let latency: Value = serde_json::from_str(&latency_json).expect("json");
    assert_eq!(list[3]["rtt_p50_ns"], latency["rtt_ns"]["p50"]);

    // The table: a header, then a row per run with its id, test, server and labels.
    let table = results(&db, &[]);
    let rows: Vec<&str> = table.lines().collect();
    assert!(rows[0].starts_with("id "), "{table}");
    assert_eq!(rows.len(), 5, "{table}");
    assert!(
        rows[4].starts_with("1 ")
            && rows[4].contains("latency tcp")
            && rows[4].contains(&target)
            && rows[4].contains("path=a")
            && rows[4].contains("RTT p50"),
        "{table}"
    );
    let csv = super::csv_rows(&results(&db, &["--csv", "--test", "latency"]));
    assert_eq!(csv.len(), 1);
    assert_eq!(
        (csv[0]["id"].as_str(), csv[0]["labels"].as_str()),
        ("1", "path=a")
    );
    // Its identity in every database, and whether it waits to be pushed.
    let listed: Value =
        serde_json::from_str(&results(&db, &["--json", "--test", "latency"])).expect("json");
    assert_eq!(
        Some(csv[0]["uuid"].as_str()),
        listed[0]["uuid"].as_str(),
        "the same UUID in the CSV and the JSON"
    );
    assert_eq!(csv[0]["uuid"].len(), 36);
    assert_eq!(csv[0]["to_push"], "false");

    // show: the JSON byte for byte, the table and CSV as the renderers make them from it.
    assert_eq!(results(&db, &["show", "1", "--json"]), latency_json);
    assert_eq!(results(&db, &["show", "2", "--json"]), pps_json);
    let doc: sonde_report::TestResult = serde_json::from_str(&pps_json).expect("a result");
    assert_eq!(
        results(&db, &["show", "2"]),
        sonde_report::render::table(&doc)
    );
    assert_eq!(
        results(&db, &["show", "2", "--csv"]),
        sonde_report::render::csv(&doc)
    );

    // export: the documents as one array; CSV of one test, each row with its run id.
    let all: Value = serde_json::from_str(&results(&db, &["export", "--json"])).expect("json");
    assert_eq!(all.as_array().map(Vec::len), Some(4));
    assert_eq!(all[3], latency);
    let csv = results(
        &db,
        &["export", "--csv", "--test", "pps", "--label", "path=b"],
    );
    let rows = super::csv_rows(&csv);
    assert!(!rows.is_empty());
    assert!(
        rows.iter()
            .all(|r| r["run_id"] == "2" && r["test"] == "pps"),
        "{csv}"
    );
    let mixed = run(&["results", "export", "--csv", "--db", d]);
    assert_eq!(mixed.code, Some(2), "{}", mixed.stderr);
    assert!(mixed.stderr.contains("--test"), "{}", mixed.stderr);

    // rm: gone from the list; an id that is not there is exit 1.
    results(&db, &["rm", "2", "3"]);
    assert_eq!(listed_ids(&db, &[]), [4, 1]);
    let missing = run(&["results", "rm", "2", "--db", d]);
    assert_eq!(missing.code, Some(1));
    assert!(missing.stderr.contains("no run 2"), "{}", missing.stderr);
    let missing = run(&["results", "show", "99", "--db", d]);
    assert_eq!(missing.code, Some(1));
}

#[test]
fn results_without_a_database_says_so_and_creates_none() {
    let _file = crate::common::file_lock(module_path!());
    let (_dir, db) = temp_db();
    let r = run(&["results", "--db", path_str(&db)]);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(r.stderr.contains("no results saved yet"), "{}", r.stderr);
    assert!(!db.exists());
    let r = run(&["results", "--since", "yesterday", "--db", path_str(&db)]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
}

#[test]
fn repeat_runs_n_sessions_printed_one_by_one_and_saved_as_one_group() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let (_dir, db) = temp_db();
    let target = agent.target();
    let d = path_str(&db);
    let out = super::sonde()
        .args([
            "pps", &target, "-t", "0.2", "--repeat", "3", "--pause", "0.1",
        ])
        .args(["--label", "case=x", "--json", "--db", d])
        .output()
        .expect("run");
    assert!(out.status.success(), "{out:?}");
    // One JSON document per run, one after another.
    let docs: Vec<Value> = serde_json::Deserializer::from_slice(&out.stdout)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .expect("JSON documents");
    assert_eq!(docs.len(), 3);
    let mut sessions: Vec<u64> = docs.iter().map(|d| u(d, "/session")).collect();
    sessions.dedup();
    assert_eq!(sessions.len(), 3, "each run is a session of its own");
    let runs = stored(&db);
    assert_eq!(runs.len(), 3);
    let group = runs[0].summary.group.expect("grouped");
    assert!(runs.iter().all(|r| r.summary.group == Some(group)));
    let store = Store::open_existing(&db).expect("open");
    assert_eq!(
        store.group(group).expect("group").map(|g| g.kind),
        Some("repeat".to_owned())
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!("3 runs saved as group {group}")),
        "{stderr}"
    );
    // Newest first in the store, in order printed on stdout.
    let stored_docs: Vec<Value> = runs
        .iter()
        .rev()
        .map(|r| serde_json::from_str(&r.document).expect("json"))
        .collect();
    assert_eq!(stored_docs, docs);

    // A table run by run, then the group; CSV under one header.
    let table = run_ok(&["pps", &target, "-t", "0.2", "--repeat", "2", "--db", d]);
    assert_eq!(table.matches("sonde 0.1.0 pps:").count(), 2, "{table}");
    assert!(
        table
            .trim_end()
            .lines()
            .last()
            .is_some_and(|l| l.starts_with("2 runs saved as group ")),
        "{table}"
    );
    let csv = run_ok(&[
        "pps", &target, "-t", "0.2", "--repeat", "2", "--csv", "--db", d,
    ]);
    assert_eq!(
        csv.lines().filter(|l| l.starts_with("test,")).count(),
        1,
        "{csv}"
    );
    assert_eq!(
        super::csv_rows(&csv)
            .iter()
            .filter(|r| r["row"] == "summary")
            .count(),
        2
    );
}

#[test]
fn repeat_and_pause_are_checked() {
    let _file = crate::common::file_lock(module_path!());
    for args in [&["--repeat", "0"][..], &["--pause", "1"]] {
        let mut all = vec!["pps", "127.0.0.1:9", "--no-save"];
        all.extend(args);
        let r = run(&all);
        assert_eq!(r.code, Some(2), "{args:?}: {}", r.stderr);
    }
}

/// Starts `sonde ARGS` with stdout on a pipe, reads its first line, and says whether the
/// process was still running when that line arrived; then the rest of stdout.
fn first_line_while_running(args: &[&str]) -> (String, bool, String) {
    use std::io::{BufRead, BufReader, Read};
    let mut child = StdCommand::new(env!("CARGO_BIN_EXE_sonde"))
        .env("SONDE_DB", super::common::test_db())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    let mut first = String::new();
    out.read_line(&mut first).expect("read");
    let running = child.try_wait().expect("try_wait").is_none();
    let mut rest = String::new();
    out.read_to_string(&mut rest).expect("read");
    assert!(child.wait().expect("wait").success());
    (first, running, rest)
}

#[test]
fn interval_lines_reach_a_pipe_as_they_are_counted() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    // The first interval ends after 0.5 s of a 4 s test: its line must not wait for the end.
    let (first, running, rest) =
        first_line_while_running(&["throughput", &agent.target(), "-t", "4", "-i", "0.5"]);
    assert!(first.contains("bit/s"), "an interval line first: {first:?}");
    assert!(
        running,
        "the interval line came only when the test had ended"
    );
    // Then the result, as before.
    assert!(rest.contains("sonde 0.1.0 throughput:"), "{rest}");
}

/// Runs `sonde ARGS` (with `--json-stream`): its first event must come while it runs; the
/// `end` event (its document valid against the schema) and the events before it.
pub(super) fn json_stream(args: &[&str]) -> (Value, Vec<Value>) {
    let (first, running, rest) = first_line_while_running(args);
    assert!(running, "the first event came only when the test had ended");
    let mut events: Vec<Value> = std::iter::once(first.as_str())
        .chain(rest.lines())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l:?}")))
        .collect();
    let end = events.pop().expect("events");
    assert_eq!(end["event"], "end");
    super::assert_valid(&end["data"]);
    (end, events)
}

#[test]
fn json_stream_writes_each_interval_then_the_document() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let (end, intervals) = json_stream(&[
        "throughput",
        &agent.target(),
        "-t",
        "4",
        "-i",
        "0.5",
        "--json-stream",
    ]);
    assert!(intervals.len() >= 4, "{intervals:?}");
    for (i, ev) in intervals.iter().enumerate() {
        assert_eq!(ev["event"], "interval");
        // The receiver's counts as they came; the senders' TCP_INFO samples join the
        // intervals only in the end document.
        let mut live = ev["data"].clone();
        let mut last = end["data"]["intervals"][i].clone();
        for iv in [&mut live, &mut last] {
            iv.as_object_mut().expect("an object").remove("tcp_info");
        }
        assert_eq!(live, last, "interval {i}");
    }
}

/// `sonde latency -i`: each interval's RTTs as it ends, the same in the end document, where
/// they tile the run from the end of the warm-up and hold every sample.
#[test]
fn latency_intervals_stream_live_and_add_up_to_the_run() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let (end, live) = json_stream(&[
        "latency",
        &agent.target(),
        "-t",
        "3",
        "--warmup",
        "0.5",
        "-i",
        "0.5",
        "--json-stream",
    ]);
    let doc = &end["data"];
    // 0.5 to 1, ..., 3 to 3.5 (the planned end, and the last replies just after it).
    let intervals = check_latency_intervals(doc, &live, 6);
    for iv in intervals {
        let rtt = &iv["rtt_ns"];
        assert!(rtt["min"].as_u64().unwrap() >= doc["rtt_ns"]["min"].as_u64().unwrap());
        assert!(rtt["max"].as_u64().unwrap() <= doc["rtt_ns"]["max"].as_u64().unwrap());
    }
}

/// A latency document's `count` intervals, checked against the `--json-stream` events that
/// came live (the same, in order): they tile the run from the end of the warm-up, and their
/// samples add up to the run's.
pub(super) fn check_latency_intervals<'a>(
    doc: &'a Value,
    live: &[Value],
    count: usize,
) -> &'a Vec<Value> {
    let intervals = doc["intervals"].as_array().expect("intervals");
    assert_eq!(intervals.len(), count, "{doc:#}");
    assert_eq!(live.len(), intervals.len(), "{live:#?}");
    for (ev, iv) in live.iter().zip(intervals) {
        assert_eq!(ev["event"], "interval");
        assert_eq!(&ev["data"], iv);
    }
    assert_eq!(intervals[0]["start_ns"], doc["warmup_ns"]);
    for pair in intervals.windows(2) {
        assert_eq!(pair[0]["end_ns"], pair[1]["start_ns"]);
    }
    let samples: u64 = intervals
        .iter()
        .map(|iv| iv["samples"].as_u64().expect("samples"))
        .sum();
    assert_eq!(
        samples,
        doc["samples"].as_u64().expect("samples"),
        "{doc:#}"
    );
    intervals
}

/// Sends `signal` to a child process.
fn signal(child: &std::process::Child, signal: &str) {
    let status = StdCommand::new("kill")
        .args([signal, &child.id().to_string()])
        .status()
        .expect("run kill");
    assert!(status.success());
}

#[test]
fn ctrl_c_during_throughput_prints_and_saves_what_was_measured_and_exits_130() {
    let _file = crate::common::file_lock(module_path!());
    use std::io::{BufRead, BufReader, Read};
    let agent = server(&[]);
    let (_dir, db) = temp_db();
    let mut child = crate::common::sonde_piped()
        .args([
            "throughput",
            &agent.target(),
            "-t",
            "20",
            "-i",
            "0.2",
            "--json-stream",
        ])
        .args(["--db", path_str(&db)])
        .spawn()
        .expect("spawn");
    let mut out = BufReader::new(child.stdout.take().expect("stdout"));
    // The first interval is counted: the test is under way.
    let mut first = String::new();
    out.read_line(&mut first).expect("read");
    assert!(first.contains("\"interval\""), "{first}");
    signal(&child, "-INT");
    let mut rest = String::new();
    out.read_to_string(&mut rest).expect("read");
    let output = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted by Ctrl-C"), "{stderr}");
    let end: Value =
        serde_json::from_str(rest.lines().last().expect("an end event")).expect("json");
    assert_eq!(end["event"], "end");
    let doc = &end["data"];
    super::assert_valid(doc);
    assert_eq!(doc["interrupted"], true);
    assert!(u(doc, "/receiver/bytes") > 0, "what was measured is there");
    assert!(
        u(doc, "/receiver/duration_ns") < u(doc, "/duration_ns"),
        "stopped before its planned end"
    );
    assert!(super::arr(doc, "/warnings")
        .iter()
        .any(|w| w.as_str().is_some_and(|w| w.contains("interrupted"))));
    let runs = stored(&db);
    assert_eq!(runs.len(), 1);
    assert!(runs[0].summary.interrupted);
    let stored: Value = serde_json::from_str(&runs[0].document).expect("json");
    assert_eq!(&stored, doc);
}

#[test]
fn sigterm_during_latency_prints_the_table_saves_it_and_exits_143() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let (_dir, db) = temp_db();
    let child = crate::common::sonde_piped()
        .args(["latency", &agent.target(), "-t", "20", "--warmup", "0"])
        .args(["--db", path_str(&db)])
        .spawn()
        .expect("spawn");
    // Latency prints nothing while it runs; the handlers are in place long before this.
    std::thread::sleep(std::time::Duration::from_millis(1500));
    signal(&child, "-TERM");
    let output = child.wait_with_output().expect("wait");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(143), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("sonde 0.1.0 latency:"), "{stdout}");
    assert!(
        stdout.contains("interrupted before its planned end"),
        "{stdout}"
    );
    assert!(stderr.contains("interrupted by SIGTERM"), "{stderr}");
    let runs = stored(&db);
    assert_eq!(runs.len(), 1);
    assert!(runs[0].summary.interrupted);
    let doc: Value = serde_json::from_str(&runs[0].document).expect("json");
    assert_eq!(doc["interrupted"], true);
    assert!(u(&doc, "/samples") > 0, "{doc:#}");
    assert!(u(&doc, "/duration_ns") < 20_000_000_000, "{doc:#}");
}

#[test]
fn ctrl_c_during_pps_crr_and_load_prints_and_saves_what_was_measured() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let target = agent.target();
    for test in ["pps", "crr", "load"] {
        let (_dir, db) = temp_db();
        let child = crate::common::sonde_piped()
            .args([test, &target, "-t", "20", "--json", "--db", path_str(&db)])
            .spawn()
            .expect("spawn");
        // These print nothing while they run; the handlers are in place long before this.
        std::thread::sleep(std::time::Duration::from_millis(1500));
        signal(&child, "-INT");
        let output = child.wait_with_output().expect("wait");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(130), "{test}: {stderr}");
        let doc: Value = serde_json::from_slice(&output.stdout).expect("the result is printed");
        super::assert_valid(&doc);
        let runs = stored(&db);
        assert_eq!(runs.len(), 1, "{test}");
        assert!(runs[0].summary.interrupted, "{test}");
        let marked = if test == "load" { &doc["idle"] } else { &doc };
        assert_eq!(marked["interrupted"], true, "{test}: {doc:#}");
    }
}

/// Waits until `db` holds a run: the first case of a quick run or step of a sweep was measured
/// and saved, and the next one is under way.
fn wait_for_a_saved_run(db: &Path, child: &mut std::process::Child) {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let saved = Store::open_existing(db)
            .and_then(|s| s.documents(&Filter::default()))
            .is_ok_and(|runs| !runs.is_empty());
        if saved {
            return;
        }
        assert!(
            child.try_wait().expect("wait").is_none(),
            "sonde ended before it saved a run"
        );
        assert!(
            std::time::Instant::now() < until,
            "no run saved within 60 s"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

#[test]
fn ctrl_c_during_quick_prints_and_saves_the_cases_so_far_and_exits_130() {
    let _file = crate::common::file_lock(module_path!());
    let (_dir, db) = temp_db();
    let mut child = crate::common::sonde_piped()
        .args(["quick", "-t", "4", "--json", "--db", path_str(&db)])
        .spawn()
        .expect("spawn");
    // The first case is saved: the second (UDP latency, 4 s) is under way; past its warm-up
    // (0.57 s) in a moment.
    wait_for_a_saved_run(&db, &mut child);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    signal(&child, "-INT");
    let output = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(130), "{stderr}");
    assert!(stderr.contains("interrupted by Ctrl-C"), "{stderr}");
    let doc: Value = serde_json::from_slice(&output.stdout).expect("the result is printed");
    super::assert_valid(&doc);
    assert_eq!(doc["test"], "quick");
    let cases = super::arr(&doc, "/results");
    // The case measured before the signal, and the one it stopped; none after it.
    assert_eq!(cases.len(), 2, "{doc:#}");
    assert_eq!(cases[0]["case"], "tcp latency");
    assert!(cases[0]["result"].get("interrupted").is_none(), "{doc:#}");
    let stopped = &cases[1]["result"];
    assert_eq!(cases[1]["case"], "udp latency");
    assert_eq!(stopped["interrupted"], true, "{doc:#}");
    assert!(
        u(stopped, "/samples") > 0,
        "what was measured is there: {doc:#}"
    );
    assert!(super::arr(stopped, "/warning_codes")
        .iter()
        .any(|c| c == "interrupted"));
    // Saved as printed, one run per case in the quick group, the stopped one marked.
    assert_saved_cases(&db, cases);
    let runs = stored(&db);
    assert!(runs[0].summary.interrupted);
    assert!(!runs[1].summary.interrupted);
}

#[test]
fn sigterm_during_a_sweep_prints_and_saves_the_steps_so_far_and_exits_143() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let (_dir, db) = temp_db();
    let mut child = crate::common::sonde_piped()
        .args(["latency", &agent.target(), "-u", "-t", "4", "--warmup", "0"])
        .args(["--sweep", "msg_size=64,128,256", "--db", path_str(&db)])
        .env("TERM", "dumb")
        .spawn()
        .expect("spawn");
    // The first step is saved: the second (4 s) is under way, and has measured something in a
    // moment.
    wait_for_a_saved_run(&db, &mut child);
    std::thread::sleep(std::time::Duration::from_millis(1500));
    signal(&child, "-TERM");
    let output = child.wait_with_output().expect("wait");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(143), "{stdout}\n{stderr}");
    assert!(stderr.contains("interrupted by SIGTERM"), "{stderr}");
    // The table has the two steps measured, the second marked as stopped early.
    assert!(
        stdout.starts_with("sonde 0.1.0 latency sweep of msg_size (bytes): 2 steps"),
        "{stdout}"
    );
    assert!(
        stdout.contains("interrupted before its planned end"),
        "{stdout}"
    );
    let mut runs = stored(&db);
    runs.reverse();
    assert_eq!(runs.len(), 2, "one run per step measured");
    let group = runs[0].summary.group.expect("the steps are one group");
    let store = Store::open_existing(&db).expect("database");
    assert_eq!(
        store.group(group).expect("group").map(|g| g.kind),
        Some("sweep".to_owned())
    );
    for (run, (size, interrupted)) in runs.iter().zip([("64", false), ("128", true)]) {
        assert_eq!(run.summary.group, Some(group));
        assert_eq!(run.summary.interrupted, interrupted, "{size}");
        assert_eq!(
            run.summary.labels,
            [sonde_store::Label::new("msg_size", size).expect("label")]
        );
        let doc: Value = serde_json::from_str(&run.document).expect("json");
        // Absent when the step ran its course.
        let marked = doc.get("interrupted");
        assert_eq!(marked, interrupted.then_some(&Value::Bool(true)), "{doc:#}");
        assert!(u(&doc, "/samples") > 0, "{doc:#}");
    }
}

/// The first schema (version 1) as the first sonde with a results database wrote it: frozen
/// here, so that a change to the migrations that would strand such a file fails this test.
const SCHEMA_V1: &str = "
    CREATE TABLE runs (
        id INTEGER PRIMARY KEY, time_unix_ms INTEGER NOT NULL, test TEXT NOT NULL,
        protocol TEXT, server TEXT, rtt_mean_ns REAL, rtt_p50_ns INTEGER, rtt_p99_ns INTEGER,
        rtt_p9999_ns INTEGER, bits_per_second REAL, packets_per_second REAL,
        connections_per_second REAL, loss_percent REAL, document TEXT NOT NULL);
    CREATE INDEX runs_time ON runs (time_unix_ms);
    CREATE INDEX runs_test ON runs (test, time_unix_ms);
    CREATE TABLE labels (
        run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE, key TEXT NOT NULL,
        value TEXT NOT NULL, PRIMARY KEY (run_id, key)) WITHOUT ROWID;
    CREATE INDEX labels_key_value ON labels (key, value);
    CREATE TABLE histograms (
        run_id INTEGER NOT NULL REFERENCES runs (id) ON DELETE CASCADE, name TEXT NOT NULL,
        encoding TEXT NOT NULL, data BLOB NOT NULL, PRIMARY KEY (run_id, name)) WITHOUT ROWID;
    PRAGMA application_id = 1397638213;
    PRAGMA user_version = 1;
";

#[test]
fn a_database_of_an_older_schema_is_migrated_and_keeps_its_runs() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let (_dir, db) = temp_db();
    let old = rusqlite::Connection::open(&db).expect("create");
    old.execute_batch(SCHEMA_V1).expect("the version 1 schema");
    old.execute(
        "INSERT INTO runs (time_unix_ms, test, protocol, server, rtt_p50_ns, document)
         VALUES (1000, 'latency', 'tcp', '198.18.0.2:5300', 41000, '{\"old\":true}')",
        [],
    )
    .expect("an old run");
    old.execute("INSERT INTO labels VALUES (1, 'path', 'private')", [])
        .expect("its label");
    drop(old);
    assert_eq!(sonde_store::APPLICATION_ID, 1_397_638_213);

    // A new run lands in the old file, which now has the current schema.
    run_ok(&["pps", &agent.target(), "-t", "0.2", "--db", path_str(&db)]);
    let store = Store::open_existing(&db).expect("open");
    assert_eq!(
        store.schema_version().expect("version"),
        sonde_store::SCHEMA_VERSION
    );
    let list: Value = serde_json::from_str(&results(&db, &["--json"])).expect("json");
    let ids: Vec<u64> = list
        .as_array()
        .expect("array")
        .iter()
        .map(|r| u(r, "/id"))
        .collect();
    assert_eq!(
        ids,
        [2, 1],
        "the old run is still there, the new one after it"
    );
    assert_eq!(list[1]["labels"], serde_json::json!({ "path": "private" }));
    assert_eq!(list[1]["rtt_p50_ns"], 41_000);
    assert!(list[1]["group"].is_null());
    assert_eq!(results(&db, &["show", "1", "--json"]), "{\"old\":true}");
}
