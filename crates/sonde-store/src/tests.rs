use std::ops::ControlFlow;

use std::fs;

use rusqlite::Connection;
use sqlite::MIGRATIONS;

use super::*;

fn labels(s: &[&str]) -> Vec<Label> {
    s.iter().map(|l| l.parse().expect("label")).collect()
}

fn run<'a>(time: u64, test: &'a str, labels: &'a [Label], doc: &'a str) -> NewRun<'a> {
    NewRun {
        time_unix_ms: time,
        test,
        protocol: Some("tcp"),
        server: Some("127.0.0.1:5300"),
        labels,
        document: doc,
        ..NewRun::default()
    }
}

fn temp_db() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("sub").join("results.db");
    (dir, path)
}

/// A database of one test's own, on either backend.
enum TestDb {
    /// A file in a temporary directory (in a subdirectory that does not exist yet), removed
    /// with the directory.
    Sqlite(#[allow(dead_code)] tempfile::TempDir, PathBuf),
    /// A database on the test server, dropped at the end.
    Postgres(testing::PgTestDb),
}

impl TestDb {
    fn location(&self) -> Location {
        match self {
            Self::Sqlite(_, p) => Location::File(p.clone()),
            Self::Postgres(db) => db.location(),
        }
    }

    fn open(&self) -> Store {
        Store::open(self.location()).expect("open")
    }
}

/// Runs a test of the store against both backends: `NAME::sqlite` and `NAME::postgres` (which
/// skips, saying why, without a PostgreSQL server: see `testing`).
macro_rules! both_backends {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn sqlite() {
                let (dir, path) = super::temp_db();
                super::$name(&super::TestDb::Sqlite(dir, path));
            }

            #[test]
            fn postgres() {
                if let Some(db) = super::testing::PgTestDb::create(stringify!($name)) {
                    super::$name(&super::TestDb::Postgres(db));
                }
            }
        }
    )*};
}

both_backends!(
    a_run_comes_back_as_saved,
    filters_select_and_order_newest_first,
    histograms_round_trip_exactly,
    delete_removes_runs_with_their_labels_histograms_and_empty_groups,
    ten_writers_at_once_all_land,
    new_databases_opened_at_once_are_created_once,
    duplicate_labels_are_refused,
    failures_come_back_by_group_with_their_labels,
    plan_groups_keep_their_plan,
    a_run_saved_twice_under_one_uuid_is_stored_once,
    a_push_interrupted_halfway_and_repeated_stores_each_run_once,
    runs_marked_to_push_are_pushed_with_their_failures_and_unmarked,
    filtering_by_a_label_is_an_index_lookup,
    a_reader_creates_nothing,
);

fn a_run_comes_back_as_saved(db: &TestDb) {
    let mut store = db.open();
    assert_eq!(store.schema_version().expect("version"), SCHEMA_VERSION);
    let l = labels(&["zone=other", "path=private", "Zebra=1"]);
    let doc = "{\"test\":\"latency\",\n  \"x\": 1.50}\n";
    let headline = Headline {
        rtt_mean_ns: Some(41_234.5),
        rtt_p50_ns: Some(40_000),
        rtt_p99_ns: Some(90_000),
        rtt_p9999_ns: None,
        bits_per_second: None,
        packets_per_second: None,
        connections_per_second: None,
        loss_percent: Some(0.0),
    };
    let id = store
        .insert(&NewRun {
            headline,
            interrupted: true,
            ..run(1_000, "latency", &l, doc)
        })
        .expect("insert");
    let got = store.run(id).expect("run").expect("exists");
    assert_eq!(got.document, doc, "the document is kept byte for byte");
    assert_eq!(got.summary.headline, headline);
    assert_eq!(got.summary.test, "latency");
    assert_eq!(got.summary.protocol.as_deref(), Some("tcp"));
    assert_eq!(got.summary.server.as_deref(), Some("127.0.0.1:5300"));
    assert!(got.summary.interrupted);
    assert_eq!(got.summary.group, None);
    // Sorted by key, byte by byte in both databases (not by a PostgreSQL server's locale,
    // which would put "path" before "Zebra").
    assert_eq!(
        got.summary.labels,
        labels(&["Zebra=1", "path=private", "zone=other"])
    );
    assert_eq!(store.run(RunId(id.0 + 1)).expect("query"), None);
}

fn filters_select_and_order_newest_first(db: &TestDb) {
    let mut store = db.open();
    let private = labels(&["path=private"]);
    let public = labels(&["path=public", "zone=other"]);
    let g = store.new_group("repeat", 2_000).expect("group");
    let a = store
        .insert(&run(1_000, "latency", &private, "a"))
        .expect("a");
    let b = store
        .insert(&NewRun {
            group: Some(g),
            ..run(2_000, "latency", &public, "b")
        })
        .expect("b");
    let c = store
        .insert(&NewRun {
            group: Some(g),
            ..run(3_000, "throughput", &public, "c")
        })
        .expect("c");
    let ids =
        |f: Filter| -> Vec<RunId> { store.runs(&f).expect("runs").iter().map(|r| r.id).collect() };
    assert_eq!(ids(Filter::default()), vec![c, b, a]);
    assert_eq!(
        ids(Filter {
            test: Some("latency".into()),
            ..Filter::default()
        }),
        vec![b, a]
    );
    assert_eq!(
        ids(Filter {
            labels: labels(&["path=public"]),
            ..Filter::default()
        }),
        vec![c, b]
    );
    // Every label must hold.
    assert_eq!(
        ids(Filter {
            labels: labels(&["path=public", "zone=here"]),
            ..Filter::default()
        }),
        vec![]
    );
    assert_eq!(
        ids(Filter {
            since_unix_ms: Some(2_000),
            ..Filter::default()
        }),
        vec![c, b]
    );
    assert_eq!(
        ids(Filter {
            last: Some(1),
            test: Some("latency".into()),
            ..Filter::default()
        }),
        vec![b]
    );
    assert_eq!(
        ids(Filter {
            group: Some(g),
            ..Filter::default()
        }),
        vec![c, b]
    );
    assert_eq!(
        ids(Filter {
            ids: vec![a, c],
            ..Filter::default()
        }),
        vec![c, a]
    );
    let group = store.group(g).expect("group").expect("exists");
    assert_eq!(
        (group.kind.as_str(), group.created_unix_ms),
        ("repeat", 2_000)
    );
    let docs: Vec<String> = store
        .documents(&Filter::default())
        .expect("documents")
        .into_iter()
        .map(|r| r.document)
        .collect();
    assert_eq!(docs, ["c", "b", "a"]);
}

fn histograms_round_trip_exactly(db: &TestDb) {
    let mut store = db.open();
    let mut h =
        hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("bounds");
    for v in [12_000_u64, 13_000, 13_500, 250_000, 9_000_000] {
        h.record_n(v, v / 1_000).expect("record");
    }
    let hist = Histogram::encode(HISTOGRAM_RTT, &h);
    assert_eq!(hist.encoding, HistogramEncoding::HdrV2Deflate);
    let id = store
        .insert(&NewRun {
            histograms: std::slice::from_ref(&hist),
            ..run(1, "latency", &[], "{}")
        })
        .expect("insert");
    assert_eq!(store.histograms(id).expect("histograms"), vec![hist]);
    let back = store
        .histogram(id, HISTOGRAM_RTT)
        .expect("decode")
        .expect("present");
    assert_eq!(back, h, "every bucket comes back");
    assert!(store.histogram(id, "other").expect("query").is_none());
}

fn delete_removes_runs_with_their_labels_histograms_and_empty_groups(db: &TestDb) {
    let mut store = db.open();
    let l = labels(&["k=v"]);
    let g = store.new_group("repeat", 1).expect("group");
    let hist = Histogram {
        name: HISTOGRAM_RTT.into(),
        encoding: HistogramEncoding::HdrV2,
        data: vec![1, 2, 3],
    };
    let a = store
        .insert(&NewRun {
            group: Some(g),
            histograms: std::slice::from_ref(&hist),
            ..run(1, "latency", &l, "a")
        })
        .expect("a");
    let b = store.insert(&run(2, "latency", &l, "b")).expect("b");
    assert_eq!(
        store.delete(&[a, RunId(999)]).expect("delete"),
        vec![a],
        "only the runs that existed"
    );
    assert_eq!(store.run(a).expect("query"), None);
    assert!(store.labels(a).expect("labels").is_empty());
    assert!(store.histograms(a).expect("histograms").is_empty());
    assert_eq!(store.group(g).expect("group"), None);
    assert!(store.run(b).expect("query").is_some());
}

/// Ten writers, each with its own connection as ten sonde processes (on as many hosts) would
/// have, saving at once: every run lands.
fn ten_writers_at_once_all_land(db: &TestDb) {
    drop(db.open());
    let location = db.location();
    let writers: Vec<_> = (0..10)
        .map(|w| {
            let location = location.clone();
            std::thread::spawn(move || {
                let mut store = Store::open(location).expect("open");
                let g = store.new_group("repeat", w).expect("group");
                for i in 0..20 {
                    let l = labels(&[&format!("writer={w}")]);
                    store
                        .insert(&NewRun {
                            group: Some(g),
                            ..run(i, "latency", &l, "{}")
                        })
                        .expect("insert while the others write");
                }
            })
        })
        .collect();
    for w in writers {
        w.join().expect("writer");
    }
    let store = db.open();
    for w in 0..10 {
        let runs = store
            .runs(&Filter {
                labels: labels(&[&format!("writer={w}")]),
                ..Filter::default()
            })
            .expect("runs");
        assert_eq!(runs.len(), 20, "writer {w}");
        assert!(
            runs.iter().all(|r| r.group == runs[0].group),
            "one group each"
        );
    }
    let all = store.runs(&Filter::default()).expect("runs");
    let mut uuids: Vec<Uuid> = all.iter().map(|r| r.uuid).collect();
    uuids.sort_unstable();
    uuids.dedup();
    assert_eq!(uuids.len(), 200, "200 runs, each its own UUID");
}

fn new_databases_opened_at_once_are_created_once(db: &TestDb) {
    let location = db.location();
    let openers: Vec<_> = (0..4)
        .map(|_| {
            let location = location.clone();
            std::thread::spawn(move || {
                let mut s = Store::open(location).expect("open");
                s.insert(&run(1, "pps", &[], "{}")).expect("insert");
            })
        })
        .collect();
    for o in openers {
        o.join().expect("opener");
    }
    let store = db.open();
    assert_eq!(store.schema_version().expect("version"), SCHEMA_VERSION);
    assert_eq!(store.runs(&Filter::default()).expect("runs").len(), 4);
}

#[test]
fn a_file_that_is_not_sqlite_is_reported_and_left_alone() {
    let (dir, _) = temp_db();
    let path = dir.path().join("results.db");
    let content = b"my notes, not a database\n".repeat(100);
    fs::write(&path, &content).expect("write");
    let e = Store::open(&path).expect_err("not a database");
    assert!(matches!(e, Error::NotADatabase { .. }), "{e:?}");
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");
    assert_eq!(fs::read(&path).expect("read"), content);
}

#[test]
fn a_corrupt_database_is_reported_and_left_alone() {
    let (dir, _) = temp_db();
    let path = dir.path().join("results.db");
    let mut s = Store::open(&path).expect("open");
    s.insert(&run(1, "pps", &[], "{}")).expect("insert");
    drop(s);
    // Keep SQLite's header, overwrite the rest of the first page (the schema) with garbage.
    let mut bytes = fs::read(&path).expect("read");
    for b in &mut bytes[100..] {
        *b = 0xA5;
    }
    fs::write(&path, &bytes).expect("write");
    let e = Store::open(&path).expect_err("corrupt");
    assert!(
        matches!(e, Error::Corrupt { .. } | Error::NotADatabase { .. }),
        "{e:?}"
    );
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");
    assert_eq!(fs::read(&path).expect("read"), bytes, "left untouched");
}

#[test]
fn another_programs_sqlite_database_is_not_ours() {
    let (dir, _) = temp_db();
    let path = dir.path().join("other.db");
    let c = Connection::open(&path).expect("open");
    c.execute_batch("CREATE TABLE notes (t TEXT); INSERT INTO notes VALUES ('keep me');")
        .expect("create");
    drop(c);
    let before = fs::read(&path).expect("read");
    let e = Store::open(&path).expect_err("foreign");
    assert!(matches!(e, Error::Foreign { .. }), "{e:?}");
    assert_eq!(fs::read(&path).expect("read"), before);
}

#[test]
fn a_newer_schema_is_refused() {
    let (dir, _) = temp_db();
    let path = dir.path().join("results.db");
    drop(Store::open(&path).expect("open"));
    let c = Connection::open(&path).expect("open");
    c.pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .expect("bump");
    drop(c);
    let e = Store::open(&path).expect_err("too new");
    assert!(
        matches!(e, Error::TooNew { found, known, .. } if found == SCHEMA_VERSION + 1 && known == SCHEMA_VERSION),
        "{e:?}"
    );
}

#[test]
fn a_version_1_database_is_migrated_and_keeps_its_runs() {
    let (dir, _) = temp_db();
    let path = dir.path().join("results.db");
    // A database as the first schema left it.
    let c = Connection::open(&path).expect("open");
    c.pragma_update(None, "application_id", APPLICATION_ID)
        .expect("app id");
    c.execute_batch(MIGRATIONS[0]).expect("v1");
    c.pragma_update(None, "user_version", 1).expect("version");
    c.execute(
        "INSERT INTO runs (time_unix_ms, test, protocol, rtt_p50_ns, document)
         VALUES (5, 'latency', 'udp', 123, '{\"old\":true}')",
        [],
    )
    .expect("old run");
    c.execute(
        "INSERT INTO labels (run_id, key, value) VALUES (1, 'path', 'lb')",
        [],
    )
    .expect("old label");
    drop(c);

    let mut store = Store::open(&path).expect("migrate");
    assert_eq!(store.schema_version().expect("version"), SCHEMA_VERSION);
    let old = store.run(RunId(1)).expect("query").expect("kept");
    assert_eq!(old.document, "{\"old\":true}");
    assert_eq!(old.summary.headline.rtt_p50_ns, Some(123));
    assert_eq!(old.summary.labels, labels(&["path=lb"]));
    assert_eq!((old.summary.group, old.summary.interrupted), (None, false));
    // And the new columns work.
    let g = store.new_group("repeat", 6).expect("group");
    let id = store
        .insert(&NewRun {
            group: Some(g),
            ..run(6, "latency", &[], "{}")
        })
        .expect("insert");
    assert_eq!(
        store.run(id).expect("q").expect("new").summary.group,
        Some(g)
    );
}

#[test]
fn a_reader_does_not_create_a_file() {
    let (_dir, path) = temp_db();
    let e = Store::open_existing(&path).expect_err("missing");
    assert!(matches!(e, Error::Missing { .. }), "{e:?}");
    assert!(!path.exists());
}

#[test]
fn labels_parse_and_check() {
    let l: Label = "path=a=b".parse().expect("value may hold =");
    assert_eq!((l.key.as_str(), l.value.as_str()), ("path", "a=b"));
    assert_eq!(l.to_string(), "path=a=b");
    let empty: Label = "note=".parse().expect("empty value");
    assert_eq!(empty.value, "");
    for bad in ["novalue", "=v", "sp ace=v", "k\"=v"] {
        assert!(
            matches!(bad.parse::<Label>(), Err(Error::BadLabel(_))),
            "{bad}"
        );
    }
}

fn duplicate_labels_are_refused(db: &TestDb) {
    let mut store = db.open();
    let twice = labels(&["k=1", "k=2"]);
    assert!(matches!(
        store.insert(&run(1, "pps", &twice, "{}")),
        Err(Error::DuplicateLabel(k)) if k == "k"
    ));
    assert!(store.runs(&Filter::default()).expect("runs").is_empty());
}

#[test]
fn the_default_path_is_in_the_data_directory() {
    if let Some(p) = default_path() {
        assert!(p.ends_with("sonde/results.db"), "{}", p.display());
    }
}

fn failures_come_back_by_group_with_their_labels(db: &TestDb) {
    let mut store = db.open();
    let g = store.new_group("plan", 1).expect("group");
    let other = store.new_group("plan", 2).expect("group");
    let failure = Failure {
        group: g,
        time_unix_ms: 3,
        test: "latency".into(),
        labels: labels(&["target=c", "case=target=c protocol=udp"]),
        reason: "connection refused".into(),
        exit_code: 3,
    };
    store.insert_failure(&failure, false).expect("insert");
    store
        .insert_failure(
            &Failure {
                group: other,
                ..failure.clone()
            },
            false,
        )
        .expect("insert");
    let got = store.failures(g).expect("failures");
    assert_eq!(
        got,
        vec![Failure {
            labels: labels(&["case=target=c protocol=udp", "target=c"]),
            ..failure
        }]
    );
    assert_eq!(store.failures(GroupId(99)).expect("none"), Vec::new());
}

#[test]
fn a_version_2_database_gets_the_failures_table() {
    let (dir, _) = temp_db();
    let path = dir.path().join("results.db");
    let c = Connection::open(&path).expect("open");
    c.pragma_update(None, "application_id", APPLICATION_ID)
        .expect("app id");
    c.execute_batch(MIGRATIONS[0]).expect("v1");
    c.execute_batch(MIGRATIONS[1]).expect("v2");
    c.pragma_update(None, "user_version", 2).expect("version");
    drop(c);
    let mut store = Store::open(&path).expect("migrate");
    assert_eq!(store.schema_version().expect("version"), SCHEMA_VERSION);
    let g = store.new_group("plan", 1).expect("group");
    store
        .insert_failure(
            &Failure {
                group: g,
                time_unix_ms: 1,
                test: "pps".into(),
                labels: Vec::new(),
                reason: "refused".into(),
                exit_code: 4,
            },
            false,
        )
        .expect("insert");
    assert_eq!(store.failures(g).expect("failures").len(), 1);
}

#[test]
fn a_plan_run_keeps_its_plan_and_a_version_3_one_has_none() {
    let (dir, _) = temp_db();
    let path = dir.path().join("results.db");
    let c = Connection::open(&path).expect("open");
    c.pragma_update(None, "application_id", APPLICATION_ID)
        .expect("app id");
    for m in &MIGRATIONS[..3] {
        c.execute_batch(m).expect("v1..v3");
    }
    c.pragma_update(None, "user_version", 3).expect("version");
    c.execute(
        "INSERT INTO groups (created_unix_ms, kind) VALUES (1, 'plan')",
        [],
    )
    .expect("a version 3 plan run");
    drop(c);
    let mut store = Store::open(&path).expect("migrate");
    assert_eq!(store.schema_version().expect("version"), SCHEMA_VERSION);
    let old = store.group(GroupId(1)).expect("group").expect("kept");
    assert_eq!((old.kind.as_str(), old.plan), ("plan", None));
    let plan = GroupPlan {
        file: "zones.toml".into(),
        text: "[endpoints]\nb = \"198.18.0.2\"\n".into(),
    };
    let g = store.new_plan_group(&plan, 2).expect("plan run");
    let stored = store.group(g).expect("group").expect("exists");
    assert_eq!((stored.kind.as_str(), stored.plan), ("plan", Some(plan)));
    let other = store.new_group("repeat", 3).expect("group");
    assert_eq!(
        store.group(other).expect("group").expect("exists").plan,
        None
    );
}

fn plan_groups_keep_their_plan(db: &TestDb) {
    let mut store = db.open();
    let plan = GroupPlan {
        file: "zones.toml".into(),
        text: "[endpoints]\nb = \"198.18.0.2\"\n".into(),
    };
    let g = store.new_plan_group(&plan, 2).expect("plan run");
    let stored = store.group(g).expect("group").expect("exists");
    assert_eq!((stored.kind.as_str(), stored.plan), ("plan", Some(plan)));
    let other = store.new_group("repeat", 3).expect("group");
    let other = store.group(other).expect("group").expect("exists");
    assert_eq!(other.plan, None);
    assert_ne!(other.uuid, stored.uuid);
    // A group stored again under its UUID is the same group.
    assert_eq!(store.insert_group(&other).expect("again"), other.id);
}

fn a_run_saved_twice_under_one_uuid_is_stored_once(db: &TestDb) {
    let mut store = db.open();
    let l = labels(&["k=v"]);
    let uuid = Uuid::new_v4();
    let first = store
        .insert_run(&NewRun {
            uuid: Some(uuid),
            ..run(1, "latency", &l, "first")
        })
        .expect("first");
    let Inserted::New(id) = first else {
        panic!("{first:?}")
    };
    let second = store
        .insert_run(&NewRun {
            uuid: Some(uuid),
            ..run(2, "latency", &l, "second")
        })
        .expect("second");
    assert_eq!(second, Inserted::AlreadyThere(id));
    let runs = store.documents(&Filter::default()).expect("runs");
    assert_eq!(runs.len(), 1);
    assert_eq!(
        (runs[0].document.as_str(), runs[0].summary.uuid),
        ("first", uuid)
    );
    assert_eq!(runs[0].summary.labels, l, "the labels once");
    // Runs saved without one get a UUID of their own.
    let a = store.insert(&run(3, "pps", &[], "{}")).expect("a");
    let b = store.insert(&run(4, "pps", &[], "{}")).expect("b");
    let uuid_of = |id| store.run(id).expect("run").expect("exists").summary.uuid;
    let (ua, ub) = (uuid_of(a), uuid_of(b));
    assert_ne!(ua, ub);
    assert_eq!(ua.get_version_num(), 4);
}

/// Ten runs (some in a group, with labels and a histogram) in a local file.
fn local_runs(path: &Path) -> (Store, hdrhistogram::Histogram<u64>) {
    let mut local = Store::open(path).expect("local");
    let mut h =
        hdrhistogram::Histogram::<u64>::new_with_bounds(1, 3_600_000_000_000, 3).expect("bounds");
    for v in [12_000_u64, 13_000, 250_000] {
        h.record_n(v, v / 100).expect("record");
    }
    let hist = Histogram::encode(HISTOGRAM_RTT, &h);
    let g = local.new_group("repeat", 1).expect("group");
    for i in 0..10 {
        let l = labels(&[&format!("i={i}"), "host=a"]);
        local
            .insert(&NewRun {
                group: (i % 2 == 0).then_some(g),
                histograms: std::slice::from_ref(&hist),
                ..run(i, "latency", &l, &format!("{{\"i\":{i}}}"))
            })
            .expect("insert");
    }
    (local, h)
}

fn a_push_interrupted_halfway_and_repeated_stores_each_run_once(db: &TestDb) {
    let (_dir, path) = temp_db();
    let (mut local, h) = local_runs(&path);
    let mut remote = db.open();
    let mut seen = 0;
    let count = local
        .push(&mut remote, &Filter::default(), |_| {
            seen += 1;
            if seen == 4 {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        })
        .expect("push");
    assert_eq!((count.copied, count.stopped), (4, true));
    assert_eq!(remote.runs(&Filter::default()).expect("runs").len(), 4);
    // Repeated: the rest goes, the first four are found there.
    let count = local
        .push(&mut remote, &Filter::default(), |_| {
            ControlFlow::Continue(())
        })
        .expect("push again");
    assert_eq!((count.copied, count.already_there), (6, 4));
    // And once more (as after a push whose answer was lost): nothing new.
    let count = local
        .push(&mut remote, &Filter::default(), |_| {
            ControlFlow::Continue(())
        })
        .expect("push a third time");
    assert_eq!((count.copied, count.already_there), (0, 10));
    let here = local.documents(&Filter::default()).expect("local");
    let there = remote.documents(&Filter::default()).expect("remote");
    assert_eq!(there.len(), 10, "each run once");
    for (a, b) in here.iter().zip(&there) {
        assert_eq!(a.summary.uuid, b.summary.uuid);
        assert_eq!(a.document, b.document);
        assert_eq!(a.summary.labels, b.summary.labels);
        assert_eq!(a.summary.headline, b.summary.headline);
        assert_eq!(
            remote
                .histogram(b.summary.id, HISTOGRAM_RTT)
                .expect("decode"),
            Some(h.clone()),
            "the histogram, every bucket"
        );
        assert_eq!(
            local.histograms(a.summary.id).expect("here"),
            remote.histograms(b.summary.id).expect("there"),
            "the same bytes"
        );
    }
    // The grouped runs are one group there too, the same group by UUID.
    let grouped: Vec<&StoredRun> = there.iter().filter(|r| r.summary.group.is_some()).collect();
    assert_eq!(grouped.len(), 5);
    assert!(grouped
        .iter()
        .all(|r| r.summary.group == grouped[0].summary.group));
    let g_there = remote
        .group(grouped[0].summary.group.expect("grouped"))
        .expect("group")
        .expect("exists");
    let g_here = local
        .group(here.iter().find_map(|r| r.summary.group).expect("grouped"))
        .expect("group")
        .expect("exists");
    assert_eq!((g_there.uuid, g_there.kind), (g_here.uuid, g_here.kind));
}

fn runs_marked_to_push_are_pushed_with_their_failures_and_unmarked(db: &TestDb) {
    let (_dir, path) = temp_db();
    let mut local = Store::open(&path).expect("local");
    let g = local.new_group("plan", 1).expect("group");
    let l = labels(&["k=v"]);
    local
        .insert(&run(1, "pps", &l, "kept here"))
        .expect("unmarked");
    for i in 2..5 {
        local
            .insert(&NewRun {
                to_push: true,
                group: Some(g),
                ..run(i, "pps", &l, "marked")
            })
            .expect("marked");
    }
    let failure = Failure {
        group: g,
        time_unix_ms: 5,
        test: "latency".into(),
        labels: labels(&["target=c"]),
        reason: "connection refused".into(),
        exit_code: 3,
    };
    local.insert_failure(&failure, true).expect("failure");
    let marked = Filter {
        to_push: true,
        ..Filter::default()
    };
    assert_eq!(local.runs(&marked).expect("marked").len(), 3);
    let mut remote = db.open();
    let count = local
        .push(&mut remote, &marked, |_| ControlFlow::Continue(()))
        .expect("push");
    assert_eq!((count.copied, count.failures_copied), (3, 1));
    assert!(local.runs(&marked).expect("marked").is_empty(), "unmarked");
    let there = remote.runs(&Filter::default()).expect("remote");
    assert_eq!(there.len(), 3, "only the marked runs");
    assert!(there.iter().all(|r| !r.to_push));
    let g_there = there[0].group.expect("grouped");
    assert_eq!(
        remote.failures(g_there).expect("failures"),
        vec![Failure {
            group: g_there,
            ..failure
        }]
    );
    let count = local
        .push(&mut remote, &marked, |_| ControlFlow::Continue(()))
        .expect("nothing left");
    assert_eq!(count, PushCount::default());
}

fn filtering_by_a_label_is_an_index_lookup(db: &TestDb) {
    let mut store = db.open();
    for i in 0..50 {
        let l = labels(&[&format!("i={i}")]);
        store.insert(&run(i, "pps", &l, "{}")).expect("insert");
    }
    let filter = Filter {
        labels: labels(&["i=7"]),
        ..Filter::default()
    };
    assert_eq!(store.runs(&filter).expect("runs").len(), 1);
    let plan = match (store.sqlite(), store.postgres()) {
        (Some(s), _) => s.explain(&filter).join("\n"),
        (_, Some(p)) => {
            let w = where_clause(&filter, '$');
            let mut c = p.client();
            // On 50 rows a sequential scan is cheaper; forbid it to see that the index serves.
            c.batch_execute("SET enable_seqscan = off").expect("set");
            let args: Vec<Box<dyn postgres::types::ToSql + Sync>> = w
                .args
                .into_iter()
                .map(|a| -> Box<dyn postgres::types::ToSql + Sync> {
                    match a {
                        Arg::Int(i) => Box::new(i),
                        Arg::Text(s) => Box::new(s),
                    }
                })
                .collect();
            let refs: Vec<&(dyn postgres::types::ToSql + Sync)> =
                args.iter().map(AsRef::as_ref).collect();
            c.query(&format!("EXPLAIN SELECT id FROM runs {}", w.sql), &refs)
                .expect("explain")
                .iter()
                .map(|r| r.get::<_, String>(0))
                .collect::<Vec<_>>()
                .join("\n")
        }
        _ => unreachable!(),
    };
    assert!(plan.contains("labels_key_value"), "{plan}");
}

fn a_reader_creates_nothing(db: &TestDb) {
    let e = Store::open_existing(db.location()).expect_err("missing");
    assert!(matches!(e, Error::Missing { .. }), "{e:?}");
    // Now made by a writer: the reader opens it.
    db.open().insert(&run(1, "pps", &[], "{}")).expect("insert");
    let store = Store::open_existing(db.location()).expect("exists");
    assert_eq!(store.runs(&Filter::default()).expect("runs").len(), 1);
}

#[test]
fn a_version_4_database_gets_uuids_and_marks() {
    let (dir, _) = temp_db();
    let path = dir.path().join("results.db");
    let c = Connection::open(&path).expect("open");
    c.pragma_update(None, "application_id", APPLICATION_ID)
        .expect("app id");
    for m in &MIGRATIONS[..4] {
        c.execute_batch(m).expect("v1..v4");
    }
    c.pragma_update(None, "user_version", 4).expect("version");
    c.execute_batch(
        "INSERT INTO groups (created_unix_ms, kind) VALUES (1, 'repeat');
         INSERT INTO runs (time_unix_ms, test, document, group_id) VALUES (1, 'pps', 'a', 1);
         INSERT INTO runs (time_unix_ms, test, document) VALUES (2, 'pps', 'b');
         INSERT INTO failures (group_id, time_unix_ms, test, reason, exit_code)
            VALUES (1, 3, 'pps', 'refused', 4);",
    )
    .expect("version 4 rows");
    drop(c);
    let store = Store::open(&path).expect("migrate");
    assert_eq!(store.schema_version().expect("version"), SCHEMA_VERSION);
    let runs = store.runs(&Filter::default()).expect("runs");
    assert_eq!(runs.len(), 2);
    assert_ne!(runs[0].uuid, runs[1].uuid);
    for r in &runs {
        assert_eq!(r.uuid.get_version_num(), 4, "{}", r.uuid);
        assert_eq!(r.uuid.get_variant(), uuid::Variant::RFC4122, "{}", r.uuid);
        assert!(!r.to_push);
    }
    let g = store.group(GroupId(1)).expect("group").expect("kept");
    assert_eq!(g.uuid.get_version_num(), 4);
    assert_eq!(store.failures(GroupId(1)).expect("failures").len(), 1);
}

#[test]
fn postgres_a_database_of_another_program_or_a_newer_sonde_is_refused() {
    let Some(other) = testing::PgTestDb::create("foreign") else {
        return;
    };
    let mut c = postgres::Client::connect(other.url(), postgres::NoTls).expect("connect");
    c.batch_execute("CREATE TABLE runs (id INT); INSERT INTO runs VALUES (1);")
        .expect("another program's table");
    let e = Store::open(other.location()).expect_err("foreign");
    assert!(matches!(e, Error::Foreign { .. }), "{e:?}");
    let n: i64 = c
        .query_one("SELECT count(*) FROM runs", &[])
        .expect("count")
        .get(0);
    assert_eq!(n, 1, "left untouched");

    let Some(newer) = testing::PgTestDb::create("newer") else {
        return;
    };
    drop(Store::open(newer.location()).expect("create"));
    let mut c = postgres::Client::connect(newer.url(), postgres::NoTls).expect("connect");
    c.batch_execute(&format!(
        "UPDATE sonde_schema SET version = {}",
        SCHEMA_VERSION + 1
    ))
    .expect("bump");
    let e = Store::open(newer.location()).expect_err("too new");
    assert!(
        matches!(e, Error::TooNew { found, .. } if found == SCHEMA_VERSION + 1),
        "{e:?}"
    );
}

#[test]
fn an_unreachable_server_is_reported_with_the_url_without_its_password() {
    // Port 1 on loopback: nothing listens there, the connection is refused at once.
    let e = Store::open(Location::new("postgres://sonde:secret@127.0.0.1:1/results"))
        .expect_err("unreachable");
    assert!(matches!(e, Error::Unreachable { .. }), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("postgres://sonde:***@127.0.0.1:1/results"),
        "{text}"
    );
    assert!(!text.contains("secret"), "{text}");
}

#[test]
fn locations_are_files_or_postgres_urls() {
    assert_eq!(
        Location::new("results.db"),
        Location::File("results.db".into())
    );
    for url in [
        "postgres://h/db",
        "postgresql://u@h:5433/db?connect_timeout=2",
    ] {
        assert!(matches!(Location::new(url), Location::Postgres(_)), "{url}");
        assert_eq!(
            Location::new(url).to_string(),
            url,
            "no password: shown whole"
        );
    }
    assert_eq!(
        Location::new("postgres://u:pw@h/db?password=x&sslmode=disable").to_string(),
        "postgres://u:***@h/db?password=***&sslmode=disable"
    );
}

#[test]
fn postgres_a_reader_with_select_only_reads_and_its_write_is_refused() {
    let Some(db) = testing::PgTestDb::create("select_only") else {
        return;
    };
    let mut store = Store::open(db.location()).expect("create");
    store.insert(&run(1, "pps", &[], "{}")).expect("insert");
    drop(store);
    let role = format!("sonde_ro_{}", std::process::id());
    let mut admin = postgres::Client::connect(db.url(), postgres::NoTls).expect("connect");
    admin
        .batch_execute(&format!(
            "DROP ROLE IF EXISTS {role}; CREATE ROLE {role} LOGIN;
             GRANT SELECT ON ALL TABLES IN SCHEMA public TO {role};"
        ))
        .expect("a role that may only read");
    let (scheme, rest) = db.url().split_once("://").expect("a URL");
    let host = rest.rsplit_once('@').map_or(rest, |(_, h)| h);
    let reader = Location::new(format!("{scheme}://{role}@{host}"));
    let outcome = std::panic::catch_unwind(|| {
        let mut store = Store::open(reader.clone()).expect("opens: the schema is current");
        assert_eq!(store.runs(&Filter::default()).expect("reads").len(), 1);
        let e = store
            .insert(&run(2, "pps", &[], "{}"))
            .expect_err("may not write");
        assert!(matches!(e, Error::Refused { .. }), "{e:?}");
        assert!(e.to_string().contains("42501"), "the SQLSTATE: {e}");
    });
    drop(admin);
    let admin_url = db.admin_url().to_owned();
    drop(db);
    if let Ok(mut c) = postgres::Client::connect(&admin_url, postgres::NoTls) {
        let _ = c.batch_execute(&format!("DROP ROLE IF EXISTS {role}"));
    }
    if let Err(p) = outcome {
        std::panic::resume_unwind(p);
    }
}
