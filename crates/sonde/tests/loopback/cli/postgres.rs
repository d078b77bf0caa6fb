//! `--db postgres://...` end to end, against a real PostgreSQL server (`SONDE_TEST_POSTGRES`,
//! a database of each test's own; skipped, saying why, without one): many clients saving at
//! once, the saved runs compared and drawn, and nothing lost when the server cannot be reached
//! or stops in the middle of a command (the runs wait in the local file, marked to push, and
//! `sonde results push` sends them).

use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command as StdCommand, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::Value;
use sonde_store::testing::PgTestDb;
use sonde_store::{Filter, Location, Store};

use super::{closed_port, server, u};

/// `sonde ARGS` with its local file (the fallback, the default database) in `data` and no
/// `SONDE_DB` unless given.
fn sonde_in(data: &Path, args: &[&str], sonde_db: Option<&str>) -> std::process::Output {
    let mut cmd = StdCommand::new(env!("CARGO_BIN_EXE_sonde"));
    cmd.args(args)
        .env("XDG_DATA_HOME", data)
        .env_remove("SONDE_DB")
        .env("COLUMNS", "100")
        .stdin(Stdio::null());
    if let Some(db) = sonde_db {
        cmd.env("SONDE_DB", db);
    }
    cmd.output()
        .unwrap_or_else(|e| panic!("`sonde {}`: {e}", args.join(" ")))
}

fn ok(out: &std::process::Output) -> String {
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The local file under `data`, as the binary finds it (`$XDG_DATA_HOME/sonde/results.db`).
fn local_file(data: &Path) -> PathBuf {
    data.join("sonde").join("results.db")
}

fn runs(at: impl Into<Location>, filter: &Filter) -> Vec<sonde_store::StoredRun> {
    Store::open_existing(at)
        .expect("the database exists")
        .documents(filter)
        .expect("runs")
}

#[test]
fn ten_clients_saving_into_one_postgres_database_all_land_and_are_compared_and_drawn() {
    let _file = crate::common::file_lock(module_path!());
    let Some(db) = PgTestDb::create("ten_clients") else {
        return;
    };
    let agent = server(&["--max-sessions-per-source", "16"]);
    let data = tempfile::tempdir().expect("tempdir");
    // Ten clients, as ten hosts would be, started together: their saves meet on a database
    // none of them has made sonde's tables in yet.
    let children: Vec<_> = (0..10)
        .map(|i| {
            StdCommand::new(env!("CARGO_BIN_EXE_sonde"))
                .args([
                    "latency",
                    &agent.target(),
                    "-t",
                    "0.3",
                    "--warmup",
                    "0",
                    "--label",
                    &format!("host=h{}", i % 2),
                    "--db",
                    db.url(),
                ])
                .env("XDG_DATA_HOME", data.path())
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
        assert!(!stderr.contains("warning"), "{stderr}");
    }
    let all = runs(db.location(), &Filter::default());
    assert_eq!(all.len(), 10, "every run landed");
    assert!(!local_file(data.path()).exists(), "nothing fell back");
    let store = Store::open_existing(db.location()).expect("open");
    for r in &all {
        let doc: Value = serde_json::from_str(&r.document).expect("json");
        let hist = store
            .histogram(r.summary.id, sonde_store::HISTOGRAM_RTT)
            .expect("decodes")
            .expect("the RTT histogram");
        assert_eq!(hist.len(), u(&doc, "/samples"), "every sample");
    }
    // The two "hosts" compared, and drawn in one report, straight from the server.
    let out = sonde_in(
        data.path(),
        &[
            "compare",
            "--db",
            db.url(),
            "label:host=h0",
            "label:host=h1",
        ],
        None,
    );
    let table = ok(&out);
    assert!(table.contains("5 runs"), "{table}");
    let html = data.path().join("report.html");
    let out = sonde_in(
        data.path(),
        &[
            "report",
            "--db",
            db.url(),
            "label:host=h0",
            "label:host=h1",
            "-o",
            html.to_str().expect("utf-8"),
        ],
        None,
    );
    ok(&out);
    let page = std::fs::read_to_string(&html).expect("the report");
    assert!(page.contains("host=h0") && page.contains("host=h1"));
    // And listed by label, from the server.
    let out = sonde_in(
        data.path(),
        &["results", "--db", db.url(), "--label", "host=h1", "--json"],
        None,
    );
    let listed: Value = serde_json::from_str(&ok(&out)).expect("json");
    assert_eq!(listed.as_array().map(Vec::len), Some(5));
}

#[test]
fn an_unreachable_database_loses_nothing() {
    let _file = crate::common::file_lock(module_path!());
    let Some(db) = PgTestDb::create("unreachable") else {
        return;
    };
    let agent = server(&[]);
    let data = tempfile::tempdir().expect("tempdir");
    let nowhere = format!(
        "postgres://sonde:secret@127.0.0.1:{}/results",
        closed_port()
    );
    let out = sonde_in(
        data.path(),
        &[
            "pps",
            &agent.target(),
            "-t",
            "0.2",
            "--json",
            "--db",
            &nowhere,
        ],
        None,
    );
    // Printed, exit 0, one line on stderr that says where the result went and how it gets on.
    let stdout = ok(&out);
    let doc: Value = serde_json::from_str(&stdout).expect("the result is printed");
    let stderr = String::from_utf8_lossy(&out.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| l.contains("warning")).collect();
    assert_eq!(lines.len(), 1, "{stderr}");
    let local = local_file(data.path());
    for part in [
        "cannot be reached",
        "marked to push",
        "sonde results push",
        &local.display().to_string(),
    ] {
        assert!(lines[0].contains(part), "{part:?} in {stderr}");
    }
    assert!(
        !stderr.contains("secret"),
        "the password is not printed: {stderr}"
    );
    let waiting = runs(&local, &Filter::default());
    assert_eq!(waiting.len(), 1);
    assert!(waiting[0].summary.to_push);
    assert_eq!(waiting[0].document, stdout, "the document as printed");
    assert_eq!(
        waiting[0].summary.time_unix_ms,
        u(&doc, "/timestamp_unix_ms")
    );

    // Pushed to the default remote ($SONDE_DB), then found there; the mark is gone.
    let out = sonde_in(data.path(), &["results", "push"], Some(db.url()));
    let said = ok(&out);
    assert!(said.contains("pushed 1 runs"), "{said}");
    let there = runs(db.location(), &Filter::default());
    assert_eq!(there.len(), 1);
    assert_eq!(
        (there[0].summary.uuid, &there[0].document),
        (waiting[0].summary.uuid, &waiting[0].document)
    );
    assert!(!runs(&local, &Filter::default())[0].summary.to_push);
    let out = sonde_in(data.path(), &["results", "push"], Some(db.url()));
    assert!(ok(&out).contains("pushed 0 runs"));
    // --all copies what is there again: nothing twice.
    let out = sonde_in(
        data.path(),
        &["results", "push", "--all", "--to", db.url()],
        None,
    );
    assert!(ok(&out).contains("pushed 0 runs"), "(1 already there)");
    assert_eq!(runs(db.location(), &Filter::default()).len(), 1);
}

/// A TCP relay to the PostgreSQL server that can be cut: the server, as the client sees it,
/// stops (its connections reset, new ones refused).
struct Relay {
    port: u16,
    stop: Arc<AtomicBool>,
    streams: Arc<Mutex<Vec<TcpStream>>>,
    accept: Option<thread::JoinHandle<()>>,
}

impl Relay {
    fn to(server: std::net::SocketAddr) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.set_nonblocking(true).expect("nonblocking");
        let port = listener.local_addr().expect("address").port();
        let stop = Arc::new(AtomicBool::new(false));
        let streams: Arc<Mutex<Vec<TcpStream>>> = Arc::default();
        let accept = {
            let (stop, streams) = (stop.clone(), streams.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let Ok((client, _)) = listener.accept() else {
                        thread::sleep(Duration::from_millis(10));
                        continue;
                    };
                    client.set_nonblocking(false).expect("blocking");
                    let Ok(upstream) = TcpStream::connect(server) else {
                        continue;
                    };
                    let mut held = streams.lock().expect("streams");
                    for (from, to) in [(&client, &upstream), (&upstream, &client)] {
                        let (mut from, mut to) = (
                            from.try_clone().expect("clone"),
                            to.try_clone().expect("clone"),
                        );
                        thread::spawn(move || {
                            let mut buf = [0_u8; 16 * 1024];
                            while let Ok(n @ 1..) = from.read(&mut buf) {
                                if to.write_all(&buf[..n]).is_err() {
                                    break;
                                }
                            }
                            let _ = to.shutdown(Shutdown::Both);
                        });
                    }
                    held.extend([client, upstream]);
                }
                // The listener goes with this thread: new connections are refused.
            })
        };
        Self {
            port,
            stop,
            streams,
            accept: Some(accept),
        }
    }

    /// Refuses new connections and resets the open ones.
    fn cut(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.accept.take() {
            t.join().expect("accept thread");
        }
        for s in self.streams.lock().expect("streams").drain(..) {
            let _ = s.shutdown(Shutdown::Both);
        }
    }
}

impl Drop for Relay {
    fn drop(&mut self) {
        self.cut();
    }
}

/// The server's address in a `postgres://user@host:port/...` URL.
fn server_address(url: &str) -> std::net::SocketAddr {
    let authority = url
        .split("://")
        .nth(1)
        .and_then(|r| r.split(['/', '?']).next())
        .expect("a URL");
    let host_port = authority.rsplit('@').next().expect("host");
    let host_port = if host_port.contains(':') {
        host_port.to_owned()
    } else {
        format!("{host_port}:5432")
    };
    std::net::ToSocketAddrs::to_socket_addrs(&host_port)
        .expect("resolves")
        .next()
        .expect("an address")
}

#[test]
fn the_server_stopped_mid_command_loses_nothing_and_a_push_completes_the_group() {
    let _file = crate::common::file_lock(module_path!());
    let Some(db) = PgTestDb::create("stopped_mid_run") else {
        return;
    };
    let agent = server(&[]);
    let data = tempfile::tempdir().expect("tempdir");
    let mut relay = Relay::to(server_address(db.url()));
    let through_relay = format!("postgres://postgres@127.0.0.1:{}/{}", relay.port, db.name());
    // Three repetitions a second apart, saving through the relay; it is cut once the first
    // run has landed, so the others meet a server that went away.
    let child = StdCommand::new(env!("CARGO_BIN_EXE_sonde"))
        .args([
            "latency",
            &agent.target(),
            "-t",
            "0.3",
            "--warmup",
            "0",
            "--repeat",
            "3",
            "--pause",
            "1",
            "--json",
            "--db",
            &through_relay,
        ])
        .env("XDG_DATA_HOME", data.path())
        .env_remove("SONDE_DB")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let landed = Store::open_existing(db.location())
            .and_then(|s| s.runs(&Filter::default()))
            .map_or(0, |r| r.len());
        if landed > 0 {
            break;
        }
        assert!(Instant::now() < deadline, "the first run never landed");
        thread::sleep(Duration::from_millis(20));
    }
    relay.cut();
    let out = child.wait_with_output().expect("wait");
    let stdout = ok(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        stderr.matches("marked to push").count(),
        1,
        "one line says so: {stderr}"
    );
    let printed: Vec<Value> = serde_json::Deserializer::from_str(&stdout)
        .into_iter::<Value>()
        .collect::<Result<_, _>>()
        .expect("three documents");
    assert_eq!(printed.len(), 3, "every run printed");

    let on_server = runs(db.location(), &Filter::default());
    let local = local_file(data.path());
    let waiting = runs(&local, &Filter::default());
    assert!(!on_server.is_empty() && !waiting.is_empty());
    let seen = |runs: &[sonde_store::StoredRun]| -> Vec<(u64, sonde_store::Uuid)> {
        runs.iter()
            .map(|r| (r.summary.time_unix_ms, r.summary.uuid))
            .collect()
    };
    // Three runs, each on the server or waiting here; one can be both, under one UUID, when
    // the server committed it but the relay was cut before the answer came back (the push
    // below then finds it there).
    let mut uuids: Vec<sonde_store::Uuid> = on_server
        .iter()
        .chain(&waiting)
        .map(|r| r.summary.uuid)
        .collect();
    uuids.sort_unstable();
    uuids.dedup();
    assert_eq!(
        uuids.len(),
        3,
        "on the server {:?}, waiting {:?}; {stderr}",
        seen(&on_server),
        seen(&waiting)
    );
    assert!(waiting.iter().all(|r| r.summary.to_push));
    // The runs in the local file are in the same group (by UUID) as those on the server.
    let group_uuid = |at: Location, g| {
        Store::open_existing(at)
            .expect("open")
            .group(g)
            .expect("group")
            .expect("exists")
            .uuid
    };
    assert_eq!(
        group_uuid(db.location(), on_server[0].summary.group.expect("grouped")),
        group_uuid(
            Location::File(local.clone()),
            waiting[0].summary.group.expect("grouped")
        )
    );

    // A later push completes the group on the server.
    let out = sonde_in(data.path(), &["results", "push", "--to", db.url()], None);
    ok(&out);
    let all = runs(db.location(), &Filter::default());
    assert_eq!(all.len(), 3);
    assert!(all.iter().all(|r| r.summary.group == all[0].summary.group));
    let mut saved: Vec<u64> = all.iter().map(|r| r.summary.time_unix_ms).collect();
    let mut want: Vec<u64> = printed.iter().map(|d| u(d, "/timestamp_unix_ms")).collect();
    saved.sort_unstable();
    want.sort_unstable();
    assert_eq!(saved, want, "the three runs printed, on the server");
    let store = Store::open_existing(db.location()).expect("open");
    for r in &all {
        assert!(
            store
                .histogram(r.summary.id, sonde_store::HISTOGRAM_RTT)
                .expect("decodes")
                .is_some(),
            "each run's histogram, pushed or not"
        );
    }
}

#[test]
fn a_plan_run_saves_into_postgres_or_into_the_local_file_when_it_is_unreachable() {
    let _file = crate::common::file_lock(module_path!());
    let Some(db) = PgTestDb::create("plan_run") else {
        return;
    };
    let agent = server(&[]);
    let data = tempfile::tempdir().expect("tempdir");
    let plan = data.path().join("two.toml");
    std::fs::write(
        &plan,
        format!(
            "[endpoints]\nup = \"{}\"\nclosed = \"127.0.0.1:{}\"\n\n[[matrix]]\ntest = \"latency\"\n\
             target = [\"closed\", \"up\"]\ntime = 0.3\nwarmup = 0\n",
            agent.target(),
            closed_port()
        ),
    )
    .expect("write the plan");
    let plan = plan.to_str().expect("utf-8");
    let check = |at: Location, want_marked: bool| {
        let store = Store::open_existing(at).expect("open");
        let runs = store.runs(&Filter::default()).expect("runs");
        assert_eq!(runs.len(), 1, "the case that ran");
        assert!(runs.iter().all(|r| r.to_push == want_marked));
        let g = runs[0].group.expect("the plan run");
        let group = store.group(g).expect("group").expect("exists");
        assert_eq!(group.kind, "plan");
        assert!(group.plan.is_some(), "it keeps its plan");
        assert_eq!(
            store.failures(g).expect("failures").len(),
            1,
            "the closed case"
        );
        group.uuid
    };

    // Into the server: one case ran, one failed (exit 1, as into a file).
    let out = sonde_in(data.path(), &["plan", "run", plan, "--db", db.url()], None);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    check(db.location(), false);
    // Resumed from the server: only the failed case again (it fails again: exit 1), with the
    // plan the server kept.
    let g = Store::open_existing(db.location())
        .expect("open")
        .runs(&Filter::default())
        .expect("runs")[0]
        .group
        .expect("the plan run");
    let out = sonde_in(
        data.path(),
        &["plan", "run", "--resume", &g.to_string(), "--db", db.url()],
        None,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(stderr.contains("1 of 2 runs to make (resumed)"), "{stderr}");
    let store = Store::open_existing(db.location()).expect("open");
    assert_eq!(store.runs(&Filter::default()).expect("runs").len(), 1);
    assert_eq!(store.failures(g).expect("failures").len(), 2, "tried twice");
    drop(store);

    // The server unreachable: the same exit code, one line, the plan run in the local file.
    let nowhere = format!("postgres://postgres@127.0.0.1:{}/x", closed_port());
    let out = sonde_in(data.path(), &["plan", "run", plan, "--db", &nowhere], None);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.matches("marked to push").count(), 1, "{stderr}");
    let local = local_file(data.path());
    let uuid = check(Location::File(local.clone()), true);

    // Pushed: the second plan run on the server, with its failure, once.
    for _ in 0..2 {
        let out = sonde_in(data.path(), &["results", "push", "--to", db.url()], None);
        ok(&out);
    }
    let store = Store::open_existing(db.location()).expect("open");
    let runs = store.runs(&Filter::default()).expect("runs");
    assert_eq!(runs.len(), 2, "one run of each plan run");
    let pushed = runs
        .iter()
        .filter_map(|r| r.group)
        .find(|g| store.group(*g).expect("group").expect("exists").uuid == uuid)
        .expect("the pushed plan run");
    assert_eq!(store.failures(pushed).expect("failures").len(), 1);
    assert!(Store::open_existing(&local)
        .expect("open")
        .runs(&Filter {
            to_push: true,
            ..Filter::default()
        })
        .expect("runs")
        .is_empty());
}
