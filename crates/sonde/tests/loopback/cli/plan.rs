//! `sonde plan` end to end on loopback: `check` lists the cases (snapshot), a bad plan is a
//! usage error naming its line and column, a case against a closed port is recorded and the
//! rest run (exit 1), and a plan interrupted by Ctrl-C resumes with only the runs it misses,
//! with the plan its run kept; a resume with a changed file, of another kind of group or of no
//! group is refused.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Stdio};
use std::sync::mpsc;
use std::thread;
use std::time::Duration;

use serde_json::Value;
use sonde_store::{Filter, GroupId, RunSummary, Store};

use super::store::path_str;
use super::{server, sonde};

/// A directory with `PLAN` written into `NAME`.
fn plan_dir(name: &str, plan: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join(name);
    std::fs::write(&path, plan).expect("write the plan");
    (dir, path)
}

/// A loopback port nothing listens on (bound, then released).
fn closed_port() -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    l.local_addr().expect("addr").port()
}

/// `sonde ARGS...` in `dir`: exit code, stdout, stderr.
fn run_in(dir: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = sonde()
        .current_dir(dir)
        .args(args)
        .output()
        .expect("run sonde");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn label<'a>(run: &'a RunSummary, key: &str) -> Option<&'a str> {
    run.labels
        .iter()
        .find(|l| l.key == key)
        .map(|l| l.value.as_str())
}

#[test]
fn plan_check_lists_every_case_as_its_command_line() {
    let _file = crate::common::file_lock(module_path!());
    let (dir, _) = plan_dir(
        "zones.toml",
        r#"
name = "zones"

[endpoints]
b-private = "198.18.0.2"
c-private = "198.18.1.7:5301"

[defaults]
time = "10s"

[[matrix]]
test = "latency"
target = ["b-private", "c-private"]
protocol = ["tcp", "udp"]
msg_size = "16K"
repeat = 3

[[matrix.case]]
target = "c-private"
time = "20s"

[[matrix]]
test = "throughput"
target = "b-private"
parallel = [1, 2, 5]
"#,
    );
    // No agent runs at these addresses: check sends nothing.
    let (code, stdout, stderr) = run_in(dir.path(), &["plan", "check", "zones.toml"]);
    assert_eq!(code, Some(0), "{stderr}");
    // With the other snapshots of this binary, in tests/loopback/snapshots.
    insta::with_settings!({ snapshot_path => "../snapshots", prepend_module_to_snapshot => false }, {
        insta::assert_snapshot!("cli__plan_check", stdout);
    });
}

#[test]
fn a_bad_plan_is_a_usage_error_naming_line_and_column() {
    let _file = crate::common::file_lock(module_path!());
    let (dir, _) = plan_dir(
        "bad.toml",
        "[endpoints]\nb = \"198.18.0.2\"\n\n[[matrix]]\ntest = \"latency\"\ntarget = \"b\"\nmsg_sise = 64\n",
    );
    let (code, stdout, stderr) = run_in(dir.path(), &["plan", "check", "bad.toml"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert_eq!(
        stderr.trim_end(),
        "sonde: bad.toml:7:1: unknown key \"msg_sise\" for latency: it has no --msg-sise; did \
         you mean \"msg_size\"?"
    );
    // `plan run` checks the same way before it sends anything.
    let (code, _, stderr) = run_in(dir.path(), &["plan", "run", "bad.toml"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("bad.toml:7:1:"), "{stderr}");
}

#[test]
fn a_failing_case_is_recorded_and_the_others_run() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let closed = closed_port();
    let (dir, _) = plan_dir(
        "two.toml",
        &format!(
            r#"
[endpoints]
up = "{}"
closed = "127.0.0.1:{closed}"

[[matrix]]
test = "latency"
target = ["closed", "up"]
time = 0.3
warmup = 0

# Live intervals stay off stdout, which holds the plan's JSON document.
[[matrix]]
test = "throughput"
target = "up"
time = 0.3
interval = 0.1
"#,
            agent.target()
        ),
    );
    let db = dir.path().join("results.db");
    let (code, stdout, stderr) = run_in(
        dir.path(),
        &[
            "plan",
            "run",
            "two.toml",
            "--db",
            path_str(&db),
            "--json",
            "--report",
            "two.html",
        ],
    );
    assert_eq!(code, Some(1), "some case failed: exit 1\n{stderr}");
    assert!(
        stderr.contains("1 of 3 runs failed"),
        "the end says so: {stderr}"
    );
    let doc: Value = serde_json::from_str(&stdout).expect("one JSON document");
    let failures = doc["failures"].as_array().expect("failures");
    assert_eq!(failures.len(), 1, "{doc:#}");
    assert_eq!(failures[0]["labels"]["target"], "closed");
    assert_eq!(failures[0]["exit_code"], 3, "unreachable: 3");
    assert!(
        failures[0]["reason"]
            .as_str()
            .is_some_and(|r| r.contains(&format!("127.0.0.1:{closed}"))),
        "{doc:#}"
    );
    // The case after the failed one ran: the matrix has it.
    let table = |test: &str| {
        doc["matrix"]
            .as_array()
            .and_then(|t| t.iter().find(|t| t["test"] == test))
            .unwrap_or_else(|| panic!("no {test} table: {doc:#}"))
    };
    let rows = table("latency")["rows"].as_array().expect("matrix rows");
    assert_eq!(rows.len(), 1, "{doc:#}");
    assert_eq!(rows[0]["name"], "target=up");
    assert_eq!(table("throughput")["rows"][0]["name"], "throughput");

    // The store has the run with its labels and the failure, both in the plan run's group.
    let store = Store::open_existing(&db).expect("the plan saved");
    let group = GroupId(doc["plan_run"].as_i64().expect("plan_run"));
    assert_eq!(
        store.group(group).expect("group").map(|g| g.kind),
        Some("plan".to_owned())
    );
    let runs = store
        .runs(&Filter {
            group: Some(group),
            ..Filter::default()
        })
        .expect("runs");
    assert_eq!(
        runs.len(),
        2,
        "the latency case that ran and the throughput case"
    );
    let latency = runs
        .iter()
        .find(|r| r.test == "latency")
        .expect("the latency run");
    assert_eq!(label(latency, "target"), Some("up"));
    assert_eq!(label(latency, "plan"), Some("two"));
    assert_eq!(label(latency, "plan_case"), Some("2"));
    assert_eq!(
        label(latency, "plan_run"),
        Some(group.0.to_string().as_str())
    );
    let failures = store.failures(group).expect("failures");
    assert_eq!(failures.len(), 1);
    assert_eq!(
        (failures[0].test.as_str(), failures[0].exit_code),
        ("latency", 3)
    );
    assert!(failures[0]
        .labels
        .iter()
        .any(|l| l.key == "case" && l.value == "target=closed"));
    // `sonde results --group` lists the plan run's runs with their labels, and its failure.
    let (code, listed, stderr) = run_in(
        dir.path(),
        &[
            "results",
            "--group",
            &group.0.to_string(),
            "--db",
            path_str(&db),
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(listed.contains("plan_case=2 plan_run="), "{listed}");
    let failed = listed
        .split_once("failed (ran no test):\n")
        .map(|(_, f)| f)
        .unwrap_or_else(|| panic!("no failures listed:\n{listed}"));
    assert_eq!(failed.lines().count(), 1, "{listed}");
    assert!(
        failed.contains("target=closed") && failed.contains("(exit code 3)"),
        "{listed}"
    );
    let html = std::fs::read_to_string(dir.path().join("two.html")).expect("the report");
    // The report names the case by its axis values alone.
    assert!(
        html.contains("<tr data-case=\"target=up\">"),
        "the report shows the case"
    );
}

#[test]
fn an_interrupted_plan_resumes_with_only_the_missing_runs() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let (dir, plan) = plan_dir(
        "four.toml",
        &format!(
            r#"
[endpoints]
up = "{}"

[[matrix]]
test = "latency"
target = "up"
msg_size = [64, 128, 256, 512]
time = 1
warmup = 0
"#,
            agent.target()
        ),
    );
    let db = dir.path().join("results.db");
    let mut child = StdCommand::new(env!("CARGO_BIN_EXE_sonde"))
        .args(["plan", "run", path_str(&plan), "--db", path_str(&db)])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn sonde plan run");
    let stderr = child.stderr.take().expect("stderr");
    let (tx, rx) = mpsc::channel();
    let reader = thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line.clone());
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    // Ctrl-C once the second case has started.
    let started = loop {
        match rx.recv_timeout(Duration::from_secs(20)) {
            Ok(line) if line.contains("[2/4]") => break true,
            Ok(_) => {}
            Err(_) => break false,
        }
    };
    assert!(started, "the plan never reached its second case");
    let pid = child.id().to_string();
    let killed = StdCommand::new("kill")
        .args(["-INT", &pid])
        .status()
        .expect("run kill");
    assert!(killed.success());
    let status = child.wait().expect("the plan ends");
    let first = reader.join().expect("stderr");
    assert_eq!(status.code(), Some(130), "{first}");
    assert!(
        first.contains("`sonde plan run --resume 1` runs the rest"),
        "it says how to resume: {first}"
    );

    let finished = |store: &Store| -> Vec<RunSummary> {
        store
            .runs(&Filter {
                group: Some(GroupId(1)),
                ..Filter::default()
            })
            .expect("runs")
            .into_iter()
            .filter(|r| !r.interrupted)
            .collect()
    };
    let before = finished(&Store::open_existing(&db).expect("saved")).len();
    assert!(
        (1..4).contains(&before),
        "the first case finished, the last did not start: {before} runs\n{first}"
    );

    // The plan run kept its plan: it resumes without the file, which is gone.
    let moved = dir.path().join("four.toml.away");
    std::fs::rename(&plan, &moved).expect("move the plan away");
    let (code, stdout, stderr) = run_in(
        dir.path(),
        &["plan", "run", "--resume", "1", "--db", path_str(&db)],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(
        stderr.contains(&format!("{} of 4 runs to make (resumed)", 4 - before)),
        "{stderr}"
    );
    let store = Store::open_existing(&db).expect("saved");
    let mut cases: Vec<String> = finished(&store)
        .iter()
        .map(|r| label(r, "plan_case").unwrap_or_default().to_owned())
        .collect();
    cases.sort();
    assert_eq!(cases, ["1", "2", "3", "4"], "each case once, none twice");
    // The matrix covers the four cases.
    for size in [64, 128, 256, 512] {
        assert!(stdout.contains(&format!("msg_size={size}")), "{stdout}");
    }
    // Resuming a run that has everything makes nothing; the file, given, is the plan unchanged.
    std::fs::rename(&moved, &plan).expect("put the plan back");
    let (code, _, stderr) = run_in(
        dir.path(),
        &[
            "plan",
            "run",
            "--resume",
            "1",
            "four.toml",
            "--db",
            path_str(&db),
        ],
    );
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("0 of 4 runs to make"), "{stderr}");
}

#[test]
fn a_resume_with_a_changed_plan_file_is_refused() {
    let _file = crate::common::file_lock(module_path!());
    let agent = server(&[]);
    let text = format!(
        "[endpoints]\nup = \"{}\"\n\n[[matrix]]\ntest = \"latency\"\ntarget = \"up\"\n\
         msg_size = [64, 128]\ntime = 0.2\nwarmup = 0\n",
        agent.target()
    );
    let (dir, plan) = plan_dir("two.toml", &text);
    let db = dir.path().join("results.db");
    let (code, _, stderr) = run_in(
        dir.path(),
        &["plan", "run", "two.toml", "--db", path_str(&db)],
    );
    assert_eq!(code, Some(0), "{stderr}");
    // One more size: a third case the run never had.
    std::fs::write(&plan, text.replace("[64, 128]", "[64, 128, 256]")).expect("edit the plan");
    let (code, stdout, stderr) = run_in(
        dir.path(),
        &[
            "plan",
            "run",
            "--resume",
            "1",
            "two.toml",
            "--db",
            path_str(&db),
        ],
    );
    assert_eq!(code, Some(2), "a usage error\n{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert_eq!(
        stderr.trim_end(),
        "sonde: --resume 1: two.toml is not the plan that plan run 1 ran (two.toml as it was \
         then): the cases would differ. `sonde plan run --resume 1` without the file resumes \
         with the plan it kept; `sonde plan run two.toml` starts a new run"
    );
    let store = Store::open_existing(&db).expect("saved");
    let runs = store
        .runs(&Filter {
            group: Some(GroupId(1)),
            ..Filter::default()
        })
        .expect("runs");
    assert_eq!(runs.len(), 2, "nothing ran");
}

#[test]
fn a_resume_of_a_missing_or_non_plan_group_is_refused() {
    let _file = crate::common::file_lock(module_path!());
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("results.db");
    let repeat = Store::open(&db)
        .expect("create")
        .new_group("repeat", 1)
        .expect("a --repeat group");
    let id = repeat.0.to_string();
    let (code, _, stderr) = run_in(
        dir.path(),
        &["plan", "run", "--resume", &id, "--db", path_str(&db)],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        format!("sonde: --resume {id}: group {id} is a repeat group, not a plan run")
    );
    let (code, _, stderr) = run_in(
        dir.path(),
        &["plan", "run", "--resume", "99", "--db", path_str(&db)],
    );
    assert_eq!(code, Some(2), "{stderr}");
    assert_eq!(
        stderr.trim_end(),
        format!("sonde: --resume 99: no plan run 99 in {}", db.display())
    );
    // Without --resume the plan file is required.
    let (code, _, stderr) = run_in(dir.path(), &["plan", "run", "--db", path_str(&db)]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("<PLAN.toml>"), "{stderr}");
}
