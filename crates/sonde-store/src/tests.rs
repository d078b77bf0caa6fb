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

#[test]
fn a_run_comes_back_as_saved() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
    assert_eq!(store.schema_version().expect("version"), SCHEMA_VERSION);
    let l = labels(&["zone=other", "path=private"]);
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
    // Sorted by key.
    assert_eq!(got.summary.labels, labels(&["path=private", "zone=other"]));
    assert_eq!(store.run(RunId(id.0 + 1)).expect("query"), None);
}

#[test]
fn filters_select_and_order_newest_first() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
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

#[test]
fn histograms_round_trip_exactly() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
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

#[test]
fn delete_removes_runs_with_their_labels_histograms_and_empty_groups() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
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

#[test]
fn two_writers_at_once_both_land() {
    let (_dir, path) = temp_db();
    drop(Store::open(&path).expect("create"));
    let writers: Vec<_> = (0..2)
        .map(|w| {
            let path = path.clone();
            std::thread::spawn(move || {
                // Each writer has its own connection, as two sonde processes would.
                let mut store = Store::open(&path).expect("open");
                for i in 0..50 {
                    let l = labels(&[&format!("writer={w}")]);
                    store
                        .insert(&run(i, "latency", &l, "{}"))
                        .expect("insert while the other writes");
                }
            })
        })
        .collect();
    for w in writers {
        w.join().expect("writer");
    }
    let store = Store::open(&path).expect("open");
    for w in 0..2 {
        let n = store
            .runs(&Filter {
                labels: labels(&[&format!("writer={w}")]),
                ..Filter::default()
            })
            .expect("runs")
            .len();
        assert_eq!(n, 50, "writer {w}");
    }
}

#[test]
fn two_new_databases_opened_at_once_are_created_once() {
    let (_dir, path) = temp_db();
    let openers: Vec<_> = (0..4)
        .map(|_| {
            let path = path.clone();
            std::thread::spawn(move || {
                let mut s = Store::open(&path).expect("open");
                s.insert(&run(1, "pps", &[], "{}")).expect("insert");
            })
        })
        .collect();
    for o in openers {
        o.join().expect("opener");
    }
    let store = Store::open(&path).expect("open");
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
fn a_reader_does_not_create_a_database() {
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
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
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

#[test]
fn failures_come_back_by_group_with_their_labels() {
    let (_dir, path) = temp_db();
    let mut store = Store::open(&path).expect("open");
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
    store.insert_failure(&failure).expect("insert");
    store
        .insert_failure(&Failure {
            group: other,
            ..failure.clone()
        })
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
        .insert_failure(&Failure {
            group: g,
            time_unix_ms: 1,
            test: "pps".into(),
            labels: Vec::new(),
            reason: "refused".into(),
            exit_code: 4,
        })
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
