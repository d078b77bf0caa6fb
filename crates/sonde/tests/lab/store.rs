//! A results database a team shares, in network namespaces: three client hosts `h1`, `h2`,
//! `h3`, an agent `t` and a PostgreSQL server `db`, on one bridge (in namespace `sw`), all in
//! 198.18.0.0/24. The server is Debian's `postgresql` binaries, a cluster of the test's own
//! (initdb into /var/lib/postgresql, listening on `db`'s address only, trust authentication for
//! the lab's /24), stopped and removed when the lab drops.
//!
//! - The three hosts measure latency to `t` at once, each saving into the one server
//!   (`--db postgres://...@198.18.0.10/...`); every run lands, and `sonde compare` and
//!   `sonde report` (run on `h1`) draw the three hosts' runs side by side from the server.
//! - The server stopped: `h2` measures again; the result is printed, the exit code is 0, one line
//!   on stderr says it waits in `h2`'s local file, marked to push. The server started again:
//!   `sonde results push` on `h2` sends it, once (a second push copies nothing), and the server
//!   holds h2's two runs.
//!
//! Needs root, `ip` and the PostgreSQL server binaries (`/usr/lib/postgresql/*/bin`); without
//! them the test prints `SKIP ...` and passes, unless `SONDE_TEST_REQUIRE_ALL=1` (CI). About
//! 10 s.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::Value;

use common::netns::{self, link_up, veth, Namespaces, Segments};
use common::{
    check, command_in, require_or_skip, run_with_timeout, sonde_bin, Agent, Need, Output,
};

const T: &str = "198.18.0.2";
const DB: &str = "198.18.0.10";
const HOSTS: [(&str, &str); 3] = [
    ("h1", "198.18.0.11"),
    ("h2", "198.18.0.12"),
    ("h3", "198.18.0.13"),
];
/// No single sonde command of this lab may take longer.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(60);

/// The newest PostgreSQL server's binaries Debian installed, if any.
fn postgres_bin() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|d| d.join("initdb").is_file() && d.join("pg_ctl").is_file())
        .collect();
    dirs.sort_by_key(|d| {
        d.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    dirs.pop()
}

/// A cluster of the lab's own, run by the postgres user inside namespace `db`.
struct Server {
    bin: PathBuf,
    data: PathBuf,
    ns: String,
}

impl Server {
    fn as_postgres(&self, ns: Option<&str>, program: &str) -> Command {
        let mut cmd = command_in(ns, "runuser");
        cmd.args(["-u", "postgres", "--"])
            .arg(self.bin.join(program));
        cmd
    }

    fn init(bin: PathBuf, ns: &str) -> Server {
        let data = PathBuf::from(format!(
            "/var/lib/postgresql/sonde-lab-{}",
            std::process::id()
        ));
        let server = Server {
            bin,
            data,
            ns: ns.to_owned(),
        };
        let _ = std::fs::remove_dir_all(&server.data);
        check(
            server
                .as_postgres(None, "initdb")
                .arg("-D")
                .arg(&server.data)
                .args(["-U", "postgres", "--auth=trust", "--no-instructions"]),
        );
        // The lab's clients connect from their own addresses.
        let hba = server.data.join("pg_hba.conf");
        let mut text = std::fs::read_to_string(&hba).expect("pg_hba.conf");
        text.push_str("host all all 198.18.0.0/24 trust\n");
        std::fs::write(&hba, text).expect("pg_hba.conf");
        server
    }

    fn start(&self) {
        let options = format!(
            "-c listen_addresses={DB} -p 5432 -k {}",
            self.data.display()
        );
        check(
            self.as_postgres(Some(&self.ns), "pg_ctl")
                .arg("-D")
                .arg(&self.data)
                .args(["-w", "-t", "30", "-l"])
                .arg(self.data.join("server.log"))
                .args(["-o", &options, "start"])
                .stdout(Stdio::null()),
        );
    }

    fn stop(&self) {
        let _ = self
            .as_postgres(Some(&self.ns), "pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-w", "-m", "fast", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.data);
    }
}

/// The namespaces and the server; the server stops before the namespaces go.
struct Lab {
    server: Server,
    ns: Namespaces,
}

impl Lab {
    fn new(bin: PathBuf) -> Lab {
        let ns = Namespaces::new("store", &["sw", "db", "t", "h1", "h2", "h3"]);
        let sw = ns.name(0).to_owned();
        netns::ip(&sw, &["link", "add", "br0", "type", "bridge"]);
        netns::ip(&sw, &["link", "set", "br0", "up"]);
        let mut members = vec![(ns.name(1).to_owned(), DB), (ns.name(2).to_owned(), T)];
        for (i, (_, addr)) in HOSTS.iter().enumerate() {
            members.push((ns.name(3 + i).to_owned(), *addr));
        }
        for (i, (member, addr)) in members.iter().enumerate() {
            let port = format!("port{i}");
            veth(member, "eth0", &sw, &port);
            link_up(member, "eth0", addr, 1500, Segments::Whole);
            netns::ip(&sw, &["link", "set", &port, "master", "br0"]);
            netns::ip(&sw, &["link", "set", &port, "up"]);
        }
        let server = Server::init(bin, ns.name(1));
        Lab { server, ns }
    }

    fn host(&self, name: &str) -> &str {
        let i = HOSTS
            .iter()
            .position(|(h, _)| *h == name)
            .expect("a host of the lab");
        self.ns.name(3 + i)
    }
}

/// `sonde ARGS` on `host`, its local file (default database, fallback) under `data`.
fn sonde_on(ns: &str, data: &Path, args: &[&str], sonde_db: Option<&str>) -> Output {
    let mut cmd = command_in(Some(ns), sonde_bin());
    cmd.args(args)
        .env("XDG_DATA_HOME", data)
        .env_remove("SONDE_DB")
        .env("COLUMNS", "100");
    if let Some(db) = sonde_db {
        cmd.env("SONDE_DB", db);
    }
    run_with_timeout(&mut cmd, COMMAND_TIMEOUT).unwrap_or_else(|e| panic!("{e}"))
}

fn ok(out: &Output) -> String {
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    out.stdout.clone()
}

/// The runs the server lists for a label, as `sonde results --json` on `ns` shows them.
fn listed(ns: &str, data: &Path, url: &str, label: &str) -> Vec<Value> {
    let out = sonde_on(
        ns,
        data,
        &["results", "--db", url, "--label", label, "--json"],
        None,
    );
    let v: Value = serde_json::from_str(&ok(&out)).expect("json");
    v.as_array().cloned().unwrap_or_default()
}

#[test]
fn three_hosts_save_into_one_postgres_server_compared_drawn_and_nothing_lost_when_it_stops() {
    let test = "three_hosts_save_into_one_postgres_server";
    if !require_or_skip(
        test,
        &[
            Need::Root,
            Need::Netns,
            Need::Cmd("ip"),
            Need::Cmd("runuser"),
        ],
    ) {
        return;
    }
    let Some(bin) = postgres_bin() else {
        common::skip(
            test,
            "no PostgreSQL server binaries in /usr/lib/postgresql/*/bin (apt-get install postgresql)",
        );
        return;
    };
    let lab = Lab::new(bin);
    lab.server.start();
    let url = format!("postgres://postgres@{DB}:5432/postgres");
    let agent = Agent::start_in(Some(lab.ns.name(2)), T, &["-q"]);
    let data = tempfile::tempdir().expect("tempdir");
    let home = |h: &str| {
        let d = data.path().join(h);
        std::fs::create_dir_all(&d).expect("mkdir");
        d
    };

    // The three hosts at once, each its own process in its own namespace.
    let children: Vec<_> = HOSTS
        .iter()
        .map(|(h, _)| {
            let target = agent.target();
            let (ns, dir, url) = (lab.host(h).to_owned(), home(h), url.clone());
            let label = format!("host={h}");
            std::thread::spawn(move || {
                sonde_on(
                    &ns,
                    &dir,
                    &[
                        "latency", &target, "-t", "0.5", "--warmup", "0", "--label", &label,
                        "--db", &url,
                    ],
                    None,
                )
            })
        })
        .collect();
    for child in children {
        let out = child.join().expect("host");
        ok(&out);
        let stderr = out.stderr.clone();
        assert!(!stderr.contains("warning"), "{stderr}");
    }
    let h1 = lab.host("h1");
    for (h, addr) in HOSTS {
        let runs = listed(h1, &home("h1"), &url, &format!("host={h}"));
        assert_eq!(runs.len(), 1, "{h}'s run on the server");
        // Each run came from its own host: the server it measured is t, its client address is
        // in its document on the server.
        let id = runs[0]["id"].as_i64().expect("id").to_string();
        let out = sonde_on(
            h1,
            &home("h1"),
            &["results", "show", &id, "--json", "--db", &url],
            None,
        );
        let doc = ok(&out);
        assert!(doc.contains(addr), "{h}'s run names its address {addr}");
    }

    // Compared (two hosts: compare takes two sides) and drawn (all three) from the server, on
    // one of the hosts.
    let sides = ["label:host=h1", "label:host=h2", "label:host=h3"];
    let mut args = vec!["compare", "--db", &url];
    args.extend(["label:host=h1", "label:host=h3"]);
    let table = ok(&sonde_on(h1, &home("h1"), &args, None));
    for h in ["host=h1", "host=h3"] {
        assert!(table.contains(h), "{h} in\n{table}");
    }
    let html = data.path().join("three.html");
    let html_arg = html.to_str().expect("utf-8").to_owned();
    let mut args = vec!["report", "--db", &url, "-o", &html_arg];
    args.extend(sides);
    ok(&sonde_on(h1, &home("h1"), &args, None));
    let page = std::fs::read_to_string(&html).expect("the report");
    for h in ["host=h1", "host=h2", "host=h3"] {
        assert!(page.contains(h), "{h} in the report");
    }

    // The server stopped: h2's result is printed, kept locally, marked to push.
    lab.server.stop();
    let h2 = lab.host("h2");
    let out = sonde_on(
        h2,
        &home("h2"),
        &[
            "latency",
            &agent.target(),
            "-t",
            "0.3",
            "--warmup",
            "0",
            "--label",
            "host=h2",
            "--json",
            "--db",
            &url,
        ],
        None,
    );
    let stdout = ok(&out);
    let stderr = out.stderr.clone();
    assert!(
        serde_json::from_str::<Value>(&stdout).is_ok(),
        "printed: {stdout}"
    );
    assert_eq!(
        stderr
            .lines()
            .filter(|l| l.contains("marked to push"))
            .count(),
        1,
        "{stderr}"
    );
    let local = home("h2").join("sonde").join("results.db");
    let out = sonde_on(
        h2,
        &home("h2"),
        &["results", "--db", local.to_str().expect("utf-8"), "--json"],
        None,
    );
    let waiting: Value = serde_json::from_str(&ok(&out)).expect("json");
    assert_eq!(waiting[0]["to_push"], Value::Bool(true), "{waiting:#}");

    // Started again: pushed once.
    lab.server.start();
    let said = ok(&sonde_on(h2, &home("h2"), &["results", "push"], Some(&url)));
    assert!(said.contains("pushed 1 runs"), "{said}");
    let said = ok(&sonde_on(h2, &home("h2"), &["results", "push"], Some(&url)));
    assert!(said.contains("pushed 0 runs"), "{said}");
    let runs = listed(h1, &home("h1"), &url, "host=h2");
    assert_eq!(runs.len(), 2, "h2's two runs on the server, each once");
    assert_eq!(
        runs[0]["uuid"], waiting[0]["uuid"],
        "the pushed run is the newest"
    );
}
